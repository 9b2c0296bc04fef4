#!/usr/bin/env python3
"""Logprobs on a real pair: what asking for them costs, and how far the speculative values are from
target-only decoding's.

    python scripts/bench_logprobs.py bundles/qwen-coder-b128-v64k-xk --limit 8 --out docs/bench/logprobs.md

For each prompt (scripts/data/more_prompts.jsonl, chat template, greedy, from an empty engine) and drafter,
the reply is generated without and with ``logprobs=TOP``; the reference is plain decoding (drafter
``none``) with logprobs. Reported per drafter: decode tokens/s without and with logprobs (the ratio from
the same run, the runs alternating), whether every reply equals plain decoding's token for token, the
largest |logprob difference| of the chosen tokens and of the top TOP against the reference, and how often
the top TOP ids are the reference's in order. Non-zero differences are the width policy's (a verify row
computed in a wider call than a plain decode's): 0 on bundles whose kernels compute every width alike.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROMPTS = Path(__file__).resolve().parent / "data" / "more_prompts.jsonl"


def compare(ref: list[dict], got: list[dict]) -> tuple[float, float, int, int]:
    """(largest |Δ| of the chosen tokens' logprobs, of the top lists', positions whose top ids agree, positions)."""
    d_tok = d_top = 0.0
    same = 0
    for a, b in zip(ref, got):
        d_tok = max(d_tok, abs(a["logprob"] - b["logprob"]))
        ia = [t["token_id"] for t in a["top_logprobs"]]
        ib = [t["token_id"] for t in b["top_logprobs"]]
        same += ia == ib
        d_top = max([d_top] + [abs(x["logprob"] - y["logprob"]) for x, y in zip(a["top_logprobs"], b["top_logprobs"])
                               if x["token_id"] == y["token_id"]])
    return d_tok, d_top, same, min(len(ref), len(got))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--drafters", default="none,auto")
    ap.add_argument("--limit", type=int, default=8, help="prompts, the first of the file (default 8)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--top", type=int, default=5, help="most likely tokens listed per position (default 5)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-context", type=int, default=None)
    ap.add_argument("--out", default=None, help="write the report (markdown) here too")
    args = ap.parse_args(argv)
    if args.limit < 1 or args.max_new_tokens < 1:
        ap.error("--limit and --max-new-tokens must be >= 1")
    from edgespec.bench import open_for_bench
    from edgespec.decoder import MAX_LOGPROBS
    from edgespec.errors import EdgespecError

    if not 0 <= args.top <= MAX_LOGPROBS:
        ap.error(f"--top must be in 0..{MAX_LOGPROBS}")
    drafters = [d for d in args.drafters.split(",") if d]
    try:
        eng, prompts = open_for_bench(args.bundle, drafters, PROMPTS, args.limit, threads=args.threads,
                                      max_context=args.max_context)
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    rows = {d: {"tps": [], "tps_lp": [], "exact": True, "d_tok": 0.0, "d_top": 0.0, "same": 0, "n": 0} for d in drafters}
    t0, ran = time.time(), 0
    for p in prompts:
        msgs = [{"role": "user", "content": p["turns"][0]}]
        if len(eng.encode(msgs)) + args.max_new_tokens > eng.max_context:
            print(f"{p['question_id']}: skipped (longer than the context)", file=sys.stderr)
            continue

        def run(d, lp):
            eng.reset()
            return eng.generate(msgs, max_new_tokens=args.max_new_tokens, drafter=d, logprobs=lp)

        ran += 1
        ref = run("none", args.top)
        for d in drafters:
            plain, with_lp = run(d, None), run(d, args.top)
            r = rows[d]
            r["tps"].append(plain.stats["tokens_per_second"])
            r["tps_lp"].append(with_lp.stats["tokens_per_second"])
            r["exact"] &= plain.token_ids == ref.token_ids == with_lp.token_ids
            dt, dp, same, n = compare(ref.logprobs, with_lp.logprobs)
            r["d_tok"], r["d_top"] = max(r["d_tok"], dt), max(r["d_top"], dp)
            r["same"] += same
            r["n"] += n
        print(f"{p['question_id']}: {len(ref.token_ids)} tokens", file=sys.stderr)

    def mean(xs):
        return sum(xs) / len(xs)

    lines = [f"# Logprobs: cost and distance from plain decoding ({Path(args.bundle).name})", "",
             f"`python scripts/bench_logprobs.py {args.bundle} --limit {args.limit} --max-new-tokens "
             f"{args.max_new_tokens} --top {args.top} --drafters {args.drafters}`", "",
             f"{ran} prompts of scripts/data/more_prompts.jsonl, chat template, greedy, {time.time() - t0:.0f} s; "
             "tokens/s: the mean of the requests' decode speeds; differences against drafter `none` with logprobs.",
             "", f"| drafter | tokens/s | with logprobs={args.top} | ratio | replies = plain | max abs diff, chosen | "
             f"max abs diff, top {args.top} | top ids agree |", "|---|---|---|---|---|---|---|---|"]
    for d, r in rows.items():
        if not r["tps"]:
            print("error: no prompt fits the context", file=sys.stderr)
            return 2
        a, b = mean(r["tps"]), mean(r["tps_lp"])
        lines.append(f"| {d} | {a:.1f} | {b:.1f} | {b / a:.3f} | {'yes' if r['exact'] else 'NO'} | {r['d_tok']:.2e} | "
                     f"{r['d_top']:.2e} | {r['same']}/{r['n']} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        Path(args.out).write_text(report)
    return 0 if all(r["exact"] for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
