#!/usr/bin/env python3
"""The round policy's choices priced at fixed costs: a timing-free A/B of the policy on the real models.

On this project's VM a run's speed varies by +-25% between processes and drifts by the hour, and the round policy's
choices follow the timings it measures, so a change to the policy worth a few percent on one category cannot be seen
in a benchmark (docs/bench/sessions.md, sessions 57 and 63). Here the policy's cost model is frozen at given prices
(the target's call by width, the drafter's one-token step, its reads of the context; README "Benchmarks" measured
them on this machine), the real models run greedy (so the rounds depend on the tokens alone: every run of this
script chooses the same), and every call the target and the drafter make while decoding is priced at those costs:
the time is the sum of the prices, the same from run to run and whatever else the machine runs. Every output is
checked against plain greedy decoding.

Sampled decoding (``--temperature T --seeds N``): each prompt is decoded N times a drafter, seeds 0..N-1. A sampled
reply depends on the rounds (the draws a round makes), so the drafters' replies differ, each following the target's
distribution, and so do their lengths: the figures are tokens over priced time summed over the seeds, still the same
every run. No exactness check there (bench_spec.py's and the tests' statistical checks cover the distribution). A
seeded generation is reproducible: its policy prices every round at the cost model's priors (edgespec.policy's
``cost_priors``: this bundle's, on this CPU's kernel path), never at measured or frozen costs, so the price list sets
what the calls cost, not what the policy chooses (an AVX2 machine replays the default priors' choices).
``--unseeded-policy`` replays what an unseeded sampled generation (the server's default) chooses: the draws still
seeded, the policy prices rounds at the frozen prices and carries what it learns to the next generation, as in a
server; a price list of a slower machine (``--target-ms``, ``--step-ms``, ``--read-ms``) shows where its choices
depend on the costs (session 66: at 24 ms a call, 1.3x for a draft's verify and a 7.5 ms step, the model drafter
sat out some generations after a few rejected drafts; probing it through a catch-up did not pay there, in a
replay that still priced alternates' calls twice).

    python scripts/replay_policy.py bundles/qwen-coder-b128-v64k-xk --categories summarization,chat \\
        --drafters none,suffix,prompt-lookup,model,auto

A price list, not a measurement: the Python time of a round (``--round-ms``) is one figure, the free drafters cost
nothing, and the figures are only as right as the prices (defaults: session 57's Zen 5, the Qwen 1.5B/0.5B pair at a
64-token context). Nothing is timed (since session 66): the premium an alternate adds to a call
(``RoundPolicy.alt_premium``, learned from real calls' times beyond the cost model's price of their width) is frozen
at ``--alt-ms`` too; learned, it followed how busy the machine was (`auto` 97.3 to 97.7 priced tok/s over one
afternoon, 86.6 beside a helper's export). Before session 66 each target call with alternates was priced twice (the
target's ``_run`` calls itself for an argmax through the copied logits, and both were counted), which priced
alternates out of the replays' figures. Use it to compare policies; measure the winner with bench_spec.py.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# session 57 (README "Benchmarks", this machine): target call ms by width at a 64-token context, the 0.5B drafter's step
TARGET_MS = {1: 16.6, 2: 15.6, 3: 15.6, 4: 16.7, 5: 17.8, 6: 19.2, 8: 25.9, 12: 39.1, 16: 45.1}
STEP_MS = 5.1
# what an alternate adds to a target call beyond a causal row of that width (its attention is a pass of its own over
# the keys): RoundPolicy.alt_premium as learned on an idle machine (session 66)
ALT_MS = 0.8
READ_MS_PER_TOKEN = 0.45  # the drafter's prefill, a token (a call of n > HINT_ROWS rows: a step + n of these)
HINT_ROWS = 16  # a drafter call of 2..16 rows (a hint checked, a catch-up of a few tokens): a step + 0.08 a row


def target_price(prices: dict[int, float]):
    """ms of a target call of width w: the price list, interpolated (extrapolated past its widest on its last slope)."""
    ws = sorted(prices)

    def at(w: int) -> float:
        if w in prices:
            return prices[w]
        lo = max([x for x in ws if x < w], default=ws[0])
        hi = min([x for x in ws if x > w], default=None)
        if hi is None:
            a, b = ws[-2], ws[-1]
            return prices[b] + (w - b) * (prices[b] - prices[a]) / (b - a)
        return prices[lo] + (w - lo) * (prices[hi] - prices[lo]) / (hi - lo)

    return at


def drafter_price(step_ms: float, read_ms: float):
    def at(rows: int) -> float:
        if rows <= 1:
            return step_ms
        if rows <= HINT_ROWS:
            return step_ms * (1 + 0.08 * (rows - 1))
        return step_ms + read_ms * rows

    return at


def frozen_cost_model(target_ms, step_ms: float, read_ms: float):
    """edgespec's CostModel holding these prices, deaf to this machine's timings (the free drafters' tiny costs too:
    they are priced at nothing here)."""
    from edgespec.policy import CostModel

    class Frozen(CostModel):
        def observe_target(self, width, seconds):
            pass

        def observe_draft(self, step_seconds, drafter="model"):
            pass

        def observe_catchup(self, tokens, seconds, drafter="model"):
            pass

    cost = Frozen()
    cost.target = {w: ms / 1e3 for w, ms in target_ms.items()}
    cost.draft_steps["model"] = step_ms / 1e3
    cost.catchup["model"] = (step_ms / 1e3, read_ms / 1e3)
    return cost


class Meter:
    """Counts an LM's calls while ``on`` (the rounds of a generation, not its prompt's prefill) and prices them: a
    call of n rows at ``price(n)``, and each alternate among them (a row at a position another row has too:
    ``positions``) ``alt_ms`` more."""

    def __init__(self, lm, price, alt_ms: float = 0.0):
        self.price, self.on, self.ms, self.calls, self.alt_ms = price, False, 0.0, 0, alt_ms
        run, depth = lm._run, [0]

        def counted(ids, past, *a, **kw):
            # (a call's own inner call, OnnxLM._run's argmax through the copied logits, is the same call: before
            # session 66 each call with alternates was priced twice so)
            if self.on and not depth[0]:
                self.ms += self.price(len(ids))
                positions = kw.get("positions")
                if positions is not None:
                    self.ms += self.alt_ms * (len(ids) - len({int(x) for x in positions}))
                self.calls += 1
            depth[0] += 1
            try:
                return run(ids, past, *a, **kw)
            finally:
                depth[0] -= 1

        lm._run = counted


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--prompts", default=None, help="a prompt file (default: the shipped set)")
    ap.add_argument("--categories", default=None, help="comma-separated (default: all)")
    ap.add_argument("--per-category", type=int, default=None)
    ap.add_argument("--drafters", default="none,suffix,prompt-lookup,model,auto")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--target-ms", default=None, help='a JSON object of ms by width (default: session 57\'s)')
    ap.add_argument("--step-ms", type=float, default=STEP_MS)
    ap.add_argument("--read-ms", type=float, default=READ_MS_PER_TOKEN, help="the drafter's read, ms a token")
    ap.add_argument("--round-ms", type=float, default=0.3, help="Python time of a round (the loop, the policy)")
    ap.add_argument("--alt-ms", type=float, default=ALT_MS, help="what an alternate adds to a call beyond a causal "
                    "row of that width (the policy's premium, frozen there too)")
    ap.add_argument("--fresh", action="store_true", help="a new engine per drafter (default: one engine, "
                    "the drafters one after another per prompt, learning carried as in a server)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy (checked exact); > 0: sampled, unless --top-p 0 (greedy, checked exact)")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=0)
    ap.add_argument("--min-p", type=float, default=0.0)
    ap.add_argument("--seeds", type=int, default=1, help="sampled: replies a prompt and drafter, seeds 0..N-1")
    ap.add_argument("--unseeded-policy", action="store_true",
                    help="sampled: the policy an unseeded generation runs (it learns from the frozen prices and "
                         "carries what it learns to the next generation, as in a server), the draws still seeded")
    ap.add_argument("--traffic", action="store_true",
                    help="scripts/bench_traffic.py's workload instead of a prompt file: repeated and paraphrased "
                         "requests, a code-editing session, questions over a manual, in order, with its memory (each "
                         "request's plain reply remembered) and documents; greedy, one engine")
    ap.add_argument("--limit", type=int, default=None, help="--traffic: only the first N shipped prompts")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    from edgespec.errors import ConfigError
    from edgespec.sampling import SamplingParams

    if args.seeds < 1:
        ap.error("--seeds must be >= 1")
    try:  # (what a generation refuses, refused so; top_p 0 at any temperature is greedy decoding, as there)
        sampled = not SamplingParams(args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p).greedy
    except ConfigError as e:
        ap.error(str(e))
    if args.temperature == 0 and (args.top_p != 1.0 or args.top_k or args.min_p):
        ap.error("--top-p, --top-k and --min-p are for sampled runs: give --temperature above 0")
    if not sampled and (args.seeds != 1 or args.unseeded_policy):
        ap.error("--seeds and --unseeded-policy are for sampled runs: give --temperature above 0 and --top-p above 0")
    if args.traffic and (sampled or args.fresh or args.prompts or args.categories or args.per_category):
        ap.error("--traffic replays its own workload, greedy, on one engine: no --prompts, --categories, "
                 "--per-category, --fresh or sampling with it")
    if args.limit is not None and (not args.traffic or args.limit < 1):
        ap.error("--limit is --traffic's, at least 1")
    seeds = range(args.seeds if sampled else 1)
    sampling = dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p) \
        if args.temperature > 0 else dict(temperature=0.0)  # (top_p 0: greedy, the engine's to see as such)
    import edgespec
    from edgespec.bench import read_prompts
    from edgespec.drafters import drafter_choices

    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    bad = [d for d in drafters if d not in drafter_choices()]
    if bad:
        ap.error(f"no such drafter: {', '.join(bad)}")
    if args.traffic:  # (plain decoding first: its reply is each request's reference, the one remembered)
        drafters = ["none", *[d for d in drafters if d != "none"]]
    target_ms = ({int(k): float(v) for k, v in json.loads(args.target_ms).items()} if args.target_ms else TARGET_MS)
    if len(target_ms) < 2 or 1 not in target_ms:
        ap.error("--target-ms needs width 1 and at least one more")
    cats = [c.strip() for c in args.categories.split(",")] if args.categories else None
    try:
        prompts = [] if args.traffic else read_prompts(args.prompts, categories=cats, per_category=args.per_category)
    except edgespec.EdgespecError as e:
        ap.error(str(e))
    load_kw = dict(memory=False)
    if args.traffic:
        import tempfile

        import bench_traffic

        tmp = tempfile.TemporaryDirectory()
        load_kw = dict(memory=Path(tmp.name) / "store.npz", documents=[bench_traffic.MANUAL])
    tprice, dprice = target_price(target_ms), drafter_price(args.step_ms, args.read_ms)
    rows, engines = [], {}

    def engine(key):
        if key not in engines:
            eng = edgespec.load(args.bundle, model_sampling=False, prompt_cache_mb=0, **load_kw)
            eng.decoder.policy.measured = eng.decoder.policy.cost = frozen_cost_model(target_ms, args.step_ms,
                                                                                      args.read_ms)
            meters = [Meter(eng.decoder.target, tprice, args.alt_ms)]
            if "model" in eng.decoder.drafters:
                meters.append(Meter(eng.decoder.drafters["model"].lm, dprice))
            policy, choose = eng.decoder.policy, eng.decoder.policy.choose
            rounds = [0]

            def counted(*a, **kw):  # a round begins: the prompt is read, its calls are priced from here
                for m in meters:
                    m.on = True
                rounds[0] += 1
                at_choose[0] = sum(m.ms for m in meters[1:])
                return choose(*a, **kw)

            policy.choose = counted
            # an alternate's premium (RoundPolicy.alt_premium, learned from real calls' times beyond the cost model's
            # price of their width) frozen at the price list's: learned, it followed how busy the machine was
            policy.alt_premium = args.alt_ms / 1e3
            observe_alternates = policy.observe_alternates
            policy.observe_alternates = lambda kept, *a, **kw: observe_alternates(kept)
            # (and never halved: a premium no call renews relaxes at each generation's begin, _relax_premium, which
            # took session 66's frozen one to 0.05 ms by the fifth generation, a review of session 67 found)
            policy._relax_premium = lambda: None
            # which alternates a round verifies weighs the round's drafting time (the decoder's clock from the
            # choice to the verify call): the priced time instead, the drafter's calls since the round began and
            # the round's own
            alternates, at_choose = policy.alternates, [0.0]

            def priced_alternates(k, alts, room, draft_s):
                drafted = sum(m.ms for m in meters[1:]) - at_choose[0] + args.round_ms
                return alternates(k, alts, room, drafted / 1e3)

            policy.alternates = priced_alternates
            if args.unseeded_policy:  # the seed drives the draws alone: the policy learns, as an unseeded one does
                begin = policy.begin
                policy.begin = lambda *a, **kw: begin(*a, **dict(kw, reproducible=False))
            engines[key] = (eng, meters, rounds)
        return engines[key]

    def replay(qid, category, msgs, seed):
        """Every drafter on ``msgs``, each priced; plain decoding's reply (the first drafter's where it is ``none``,
        greedy)."""
        want = None
        for d in drafters:
            eng, meters, rounds = engine(d if args.fresh else "one")
            ids = eng.tokenizer.encode_chat(msgs)
            eng.reset()
            out, st, rounds[0] = [], None, 0
            for m in meters:
                m.ms, m.calls, m.on = 0.0, 0, False
            kw = dict(sampling, seed=seed) if sampled else sampling
            for _, new, st, _ in eng.stream_ids(ids, max_new_tokens=args.max_new_tokens, drafter=d, **kw):
                out.extend(new)
            for m in meters:
                m.on = False
            ms = sum(m.ms for m in meters) + args.round_ms * rounds[0]
            if want is None and not sampled:
                want = out if d == "none" else None
            exact = None if want is None else out == want
            rows.append(dict(qid=qid, category=category, drafter=d, seed=seed,
                             tokens=len(out), ms=ms, rounds_run=rounds[0], target_calls=meters[0].calls,
                             drafter_calls=sum(m.calls for m in meters[1:]),
                             rounds=dict(st.rounds_by_drafter), kept=dict(st.accepted_by_drafter), exact=exact))
            r = rows[-1]
            tag = f" s{seed}" if sampled else ""
            print(f"{r['qid'] + tag:14s} {d:14s} {1e3 * r['tokens'] / ms:6.1f} tok/s (priced)  calls "
                  f"{r['target_calls']:3d} + {r['drafter_calls']:3d}  kept {r['kept']}  "
                  f"{'' if exact is None else 'exact' if exact else 'DIFFERS'}", flush=True)
        return want

    try:
        for p in prompts:
            for seed in seeds:
                replay(p["question_id"], p["category"], [{"role": "user", "content": p["turns"][0]}], seed)
        if args.traffic:  # (bench_traffic.each_request: run_traffic's order and memory; a request's drafters see alike)
            bench_traffic.each_request(engine("one")[0], args.limit,
                                       lambda n, total, cat, qid, msgs, ids: replay(qid, cat, msgs, 0))
    except edgespec.EdgespecError as e:
        print(f"replay_policy.py: error: {e}", file=sys.stderr)
        return 2
    finally:
        for eng, _, _ in engines.values():
            eng.close()
        if args.traffic:
            tmp.cleanup()
    print("\n| category | " + " | ".join(drafters) + " |")
    print("|---|" + "---:|" * len(drafters))
    for cat in dict.fromkeys(r["category"] for r in rows):
        cells = []
        for d in drafters:
            rs = [r for r in rows if r["category"] == cat and r["drafter"] == d]
            cells.append(f"{1e3 * sum(r['tokens'] for r in rs) / sum(r['ms'] for r in rs):.1f}")
        print(f"| {cat} | " + " | ".join(cells) + " |")
    cells = []
    for d in drafters:
        rs = [r for r in rows if r["drafter"] == d]
        cells.append(f"{1e3 * sum(r['tokens'] for r in rs) / sum(r['ms'] for r in rs):.1f}")
    print("| all | " + " | ".join(cells) + " |")
    bad = [f"{r['qid']} {r['drafter']}" for r in rows if r["exact"] is False]
    if bad:
        print(f"outputs differ from greedy decoding: {', '.join(bad)}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
