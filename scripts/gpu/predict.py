#!/usr/bin/env python3
"""Predicted speedup per category on a GPU: the rounds of a CPU run of the real Qwen pair, priced
with the GPU's measured costs.

    python scripts/gpu/predict.py --gpu docs/gpu-run.json --cpu reports/spec-s15-final2/report.json \
        --cpu-step-ms 11.38

Every ``auto`` run of the CPU report (``edgespec bench``/``bench_spec.py``, greedy, the real pair)
is replayed as it ran: its verify rounds by draft length (``drafted_by_position``), its plain
target calls, its drafting time and its other (Python) time. On the GPU:
- a verify round of k drafts costs the GPU's target call of width k + 1 under its width policy
  (``shaped.width_ms.policy_argmax`` where measured, the logits left on the device, else
  ``shaped.width_ms.policy``; interpolated between the measured widths);
- a plain call costs the policy's one-token call;
- drafting: the model drafter's calls at the GPU's cost of a call of their length (a report since
  session 27 records them: ``model_drafting``), the rest of the
  drafting time (memory drafters, the round policy: Python) as it ran; an older report's drafting
  time is scaled as a whole by the drafter's step on the GPU over its step on the CPU
  (``--cpu-step-ms``), which overprices the reads;
- the other time is the CPU's (the same Python loop).
The autoregressive baseline is the matching ``none`` run (its calls at the policy's one-token
cost). ``--drafter-step-ms`` prices the drafter elsewhere (e.g. on the GPU machine's CPU).

A CPU report keeps the CPU's choices (k, which drafter), which the GPU's cost model would make
differently. ``--live BUNDLE`` makes the choices the GPU's: it runs the real pair here (per
category, ``auto`` against ``none``, greedy) with edgespec's cost model frozen at the GPU's prices
(target calls by width, the drafter's step and its reads of the context, from the GPU run), so the
rounds are those the runtime would play on that GPU with the acceptance of the real models; then
prices them as above. Every output is checked against greedy decoding as it runs.

    python scripts/gpu/predict.py --gpu docs/gpu-run.json --live bundles/qwen-coder-b128-v64k-xk \
        --cpu-step-ms 11.38 --out reports/gpu-priced
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def greedy_curve(shaped: dict) -> dict:
    """The width curve a greedy round pays: the graph's device argmax where the run measured it
    (``policy_argmax``, the logits left on the GPU), else the logits-copying ``policy`` curve."""
    w = shaped["width_ms"]
    return w.get("policy_argmax") or w["policy"]


def curve(points: dict) -> callable:
    """Linear interpolation over the measured widths (extrapolated past the last two)."""
    xs = sorted(int(w) for w in points)
    ys = [float(points[str(w)] if str(w) in points else points[w]) for w in xs]

    def at(w: float) -> float:
        if w <= xs[0]:
            return ys[0]
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            if w <= x1:
                return y0 + (y1 - y0) * (w - x0) / (x1 - x0)
        (x0, y0), (x1, y1) = (xs[-2], ys[-2]), (xs[-1], ys[-1])
        return y1 + (y1 - y0) * (w - x1) / (x1 - x0)

    return at


def rounds_by_length(drafted_by_position: list[int]) -> dict[int, int]:
    """Rounds with exactly k drafts, from the count of rounds with a draft at each position."""
    d = list(drafted_by_position) + [0]
    return {k: d[k - 1] - d[k] for k in range(1, len(d)) if d[k - 1] - d[k] > 0}


def drafting_seconds(run: dict, scale: float, step_ms: float, token_ms: float) -> float:
    """A run's drafting time on the GPU side. Where the run records its model drafter's calls
    (``model_drafting``: calls, tokens, seconds; since session 27), each call at the GPU's step plus
    ``token_ms`` for each token past its first (a catch-up read of n tokens is one call of n there,
    not n steps), and the rest of the drafting time (the memory drafters, the round policy: the same
    Python on the GPU machine's CPU) as it ran. Older reports: all of it scaled by ``scale`` (the
    GPU's step over the CPU's), which prices a CPU's catch-up reads, ~1 ms a token, at that ratio."""
    m = run.get("model_drafting")
    if not m:
        return run["draft_s"] * scale if "model_drafting" not in run else run["draft_s"]
    host = max(run["draft_s"] - m["call_s"], 0.0)
    return host + (m["calls"] * step_ms + (m["tokens"] - m["calls"]) * token_ms) / 1e3


def token_ms(shaped: dict, step: float) -> float:
    """What one more token in a drafter call costs on the GPU, for its catch-up reads (tens to hundreds
    of tokens): the slope of its measured calls of 1-8 tokens, or, where lower, the slope of the
    target's calls from 8 tokens to its widest measured (ordinary runs past the graphs' widths),
    scaled by the drafter's step over the target's one-token call. The drafter's short calls copy
    every row's logits to the host; a read's tokens beyond them are priced by the long calls' slope.
    Neither curve measured a read of a hundred tokens: an estimate. Where the run timed the
    drafter's reads (``drafter_read_ms``, calls of 16-512 tokens), their slope instead; where it also
    timed them computing their last row's logits only (``drafter_read_skip_ms``, as the runtime reads
    with graphs that take the logits skip: every export since session 29), that slope."""
    steps_ms = {int(w): float(v) for w, v in shaped["drafter_step_ms"].items()}
    reads = {int(w): float(v) for w, v in (shaped.get("drafter_read_skip_ms") or shaped.get("drafter_read_ms")
                                           or {}).items()}
    if len(reads) >= 2:  # measured (bench.py since session 27): the slope of its long calls
        lo, hi = min(reads), max(reads)
        return max(reads[hi] - reads[lo], 0.0) / (hi - lo) * step / steps_ms[min(steps_ms)]
    ws = sorted(steps_ms)
    short = max(steps_ms[ws[-1]] - steps_ms[ws[0]], 0.0) / (ws[-1] - ws[0]) * step / steps_ms[ws[0]] if len(ws) > 1 else step
    t = {int(w): float(v) for w, v in greedy_curve(shaped).items()}
    wide = [w for w in sorted(t) if w >= 8]
    if len(wide) < 2 or 1 not in t:
        return short
    long_ = max((t[wide[-1]] - t[8 if 8 in t else wide[0]]) / (wide[-1] - wide[0]), 0.0) * step / t[1]
    return min(short, long_)


def predict(gpu: dict, cpu: dict, cpu_step_ms: float, drafter_step_ms: float | None = None) -> dict:
    shaped = gpu["shaped"]
    price = curve(greedy_curve(shaped))  # ms per call, the exactness padding included
    steps_ms = {int(w): float(v) for w, v in shaped["drafter_step_ms"].items()}
    step = drafter_step_ms if drafter_step_ms is not None else steps_ms[1]
    scale = step / cpu_step_ms
    read_per_token = token_ms(shaped, step)
    runs = cpu["runs"]
    base = {(r["question_id"], r["turn"]): r for r in runs if r["drafter"] == "none"}
    per: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for r in runs:
        if r["drafter"] != "auto" or (r["question_id"], r["turn"]) not in base:
            continue
        b = base[(r["question_id"], r["turn"])]
        by_k = rounds_by_length(r["drafted_by_position"])
        verify = sum(n * price(k + 1) for k, n in by_k.items()) / 1e3
        plain = (r["target_calls"] - sum(by_k.values())) * price(1) / 1e3
        draft = drafting_seconds(r, scale, step, read_per_token)
        spec = verify + plain + draft + r["other_s"]
        ar = b["target_calls"] * price(1) / 1e3 + b["other_s"]
        for cat in (r["category"], "all"):
            c = per[cat]
            c["ar_s"] += ar
            c["spec_s"] += spec
            c["tokens"] += r["new_tokens"]
            c["cpu_speedup_num"] += b["decode_s"]
            c["cpu_speedup_den"] += r["decode_s"]
            c["verify_s"] += verify
            c["draft_s"] += draft
    out = {}
    for cat, c in sorted(per.items()):
        out[cat] = {"predicted_speedup": round(c["ar_s"] / c["spec_s"], 3),
                    "predicted_ar_tokens_per_s": round(c["tokens"] / c["ar_s"], 1),
                    "predicted_spec_tokens_per_s": round(c["tokens"] / c["spec_s"], 1),
                    "draft_share": round(c["draft_s"] / c["spec_s"], 3),
                    "cpu_measured_speedup": round(c["cpu_speedup_num"] / c["cpu_speedup_den"], 3)}
    return {"drafter_step_ms": step, "cpu_step_ms": cpu_step_ms, "categories": out}


def gpu_priced_cost_model(gpu: dict, drafter_step_ms: float | None = None):
    """edgespec's CostModel holding the GPU's measured prices, deaf to this machine's timings (the
    memory drafters' own, tiny, costs are still learned here)."""
    from edgespec.policy import CostModel
    from edgespec.width import padded_width

    shaped = gpu["shaped"]
    gpu_min, gpu_mul = (int(x) for x in shaped.get("width_policy", {}).get("target", (1, 1)))

    class GpuPrices(CostModel):
        def padded(self, width):
            # the GPU target's width policy, not this machine's (which each generation's begin()
            # writes into min_width): the pad of a one-token call is filled with a free draft there
            return padded_width(width, gpu_min, gpu_mul)

        def observe_target(self, width, seconds):
            pass

        def observe_draft(self, step_seconds, drafter="model"):
            if drafter != "model":
                super().observe_draft(step_seconds, drafter)

        def observe_catchup(self, tokens, seconds, drafter="model"):
            if drafter != "model":
                super().observe_catchup(tokens, seconds, drafter)

    cost = GpuPrices()
    cost.target = {int(w): float(ms) / 1e3 for w, ms in greedy_curve(shaped).items()}
    steps = {int(w): float(ms) / 1e3 for w, ms in shaped["drafter_step_ms"].items()}
    step = drafter_step_ms / 1e3 if drafter_step_ms is not None else steps[1]
    cost.draft_steps["model"] = step
    cost.catchup["model"] = (step, token_ms(shaped, step * 1e3) / 1e3)  # a read of n tokens: one call of n
    return cost


def live(bundle: str, gpu: dict, drafter_step_ms: float | None, out_dir: Path, max_new_tokens: int,
         verified_width: int | None = None, prompts: str | None = None, use_drafter: bool = True) -> dict:
    import edgespec
    from edgespec.bench import read_prompts, run_bench, write_report

    eng = edgespec.load(bundle, model_sampling=False, memory=False, use_drafter=use_drafter)
    if verified_width:  # the GPU's bound on verify calls (its width probe), in place of this CPU's own
        eng.decoder.target.verified_width = verified_width
    cost = gpu_priced_cost_model(gpu, drafter_step_ms)
    eng.decoder.policy.measured = eng.decoder.policy.cost = cost
    rep = run_bench(eng, read_prompts(prompts), ["auto"], max_new_tokens=max_new_tokens)
    write_report(rep, out_dir, plots=False)
    report = json.loads((out_dir / "report.json").read_text())
    bad = [r["question_id"] for r in report["runs"] if r["exact"] is False]
    if bad:
        raise ValueError(f"outputs differ from greedy decoding: {', '.join(bad)}")
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", type=Path, required=True, help="a gpu-run.json with the 'shaped' section")
    ap.add_argument("--cpu", type=Path, default=None, help="a CPU report.json with none and auto runs")
    ap.add_argument("--live", default=None, help="run this bundle here with the GPU's prices (instead of --cpu)")
    ap.add_argument("--out", type=Path, default=Path("reports/gpu-priced"), help="--live: where its report goes")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--verified-width", type=int, default=15,
                    help="--live: the widest verify call on the GPU (its width probe's bound since session 27: 16 in "
                         "session 29's run, 15 under session 45's rule, the widest probed call a reference only; "
                         "0: none)")
    ap.add_argument("--no-drafter-model", action="store_true",
                    help="--live: leave the bundle's drafter model out (auto drafts from memory only)")
    ap.add_argument("--cpu-step-ms", type=float, required=True, help="the drafter's step on that CPU")
    ap.add_argument("--drafter-step-ms", type=float, default=None,
                    help="price the drafter's step at this (default: the GPU's measured step)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    try:
        gpu = json.loads(args.gpu.read_text())
        if "shaped" not in gpu or "width_ms" not in gpu.get("shaped", {}):
            raise ValueError(f"{args.gpu} has no measured width curve ('shaped' section)")
        if (args.cpu is None) == (args.live is None):
            raise ValueError("give one of --cpu REPORT or --live BUNDLE")
        if args.verified_width < 0 or args.verified_width == 1:
            raise ValueError(f"--verified-width must be 0 (no bound) or at least 2, got {args.verified_width}")
        cpu = (live(args.live, gpu, args.drafter_step_ms, args.out, args.max_new_tokens, args.verified_width,
                    use_drafter=not args.no_drafter_model)
               if args.live
               else json.loads(args.cpu.read_text()))
        res = predict(gpu, cpu, args.cpu_step_ms, args.drafter_step_ms)
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"drafter step {res['drafter_step_ms']:.2f} ms on the GPU side, {args.cpu_step_ms:.2f} ms on the CPU"
          + ("; rounds chosen at the GPU's prices (--live), so 'CPU measured' is not the CPU's own" if args.live else ""))
    print("| category | CPU measured | GPU predicted | predicted tok/s (AR -> auto) | drafting share |")
    print("|---|---:|---:|---:|---:|")
    for cat, c in res["categories"].items():
        print(f"| {cat} | {c['cpu_measured_speedup']:.2f}x | {c['predicted_speedup']:.2f}x | "
              f"{c['predicted_ar_tokens_per_s']:.0f} -> {c['predicted_spec_tokens_per_s']:.0f} | {c['draft_share']:.0%} |")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
