#!/usr/bin/env python3
"""Penalties and logit bias on a real pair: what speculative decoding still gains when the target's logits
are processed (edgespec/penalties.py) and the drafters draft without them, and whether every reply equals
plain decoding's with the same settings.

    python scripts/bench_penalties.py bundles/qwen-coder-b128-v64k-xk --out docs/bench/penalties_s34.md

For each prompt (scripts/data/more_prompts.jsonl, chat template, greedy, from an empty engine), each setting
and each drafter; the runs alternate within a prompt, so drift hits them alike. Figures: decode tokens/s
(the mean of the requests'), its ratio to plain decoding's with the same setting, tokens per target call.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
PROMPTS = Path(__file__).resolve().parent / "data" / "more_prompts.jsonl"
SETTINGS = {"none": {}, "frequency 0.5": {"frequency_penalty": 0.5}, "presence 0.5": {"presence_penalty": 0.5},
            "repetition 1.1": {"repetition_penalty": 1.1}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--drafters", default="none,auto")
    ap.add_argument("--limit", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-context", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.limit < 1 or args.max_new_tokens < 1:
        ap.error("--limit and --max-new-tokens must be >= 1")
    from edgespec.bench import open_for_bench
    from edgespec.errors import EdgespecError

    drafters = [d for d in args.drafters.split(",") if d]
    if drafters[:1] != ["none"]:
        ap.error("--drafters must start with none (the reference)")
    try:
        eng, prompts = open_for_bench(args.bundle, drafters, PROMPTS, args.limit, threads=args.threads,
                                      max_context=args.max_context)
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cells = {(s, d): {"tps": [], "tokens": 0, "calls": 0} for s in SETTINGS for d in drafters}
    exact, ran = True, 0
    for p in prompts:
        msgs = [{"role": "user", "content": p["turns"][0]}]
        if len(eng.encode(msgs)) + args.max_new_tokens > eng.max_context:
            continue
        ran += 1
        for name, kw in SETTINGS.items():
            ref = None
            for d in drafters:
                eng.reset()
                r = eng.generate(msgs, max_new_tokens=args.max_new_tokens, drafter=d, **kw)
                ref = ref if ref is not None else r.token_ids
                if r.token_ids != ref:
                    exact = False
                    print(f"MISMATCH: {p['question_id']} {name} {d}", file=sys.stderr)
                c = cells[(name, d)]
                c["tps"].append(r.stats["tokens_per_second"])
                c["tokens"] += r.stats["new_tokens"]
                c["calls"] += r.stats["target_calls"]
        print(f"{p['question_id']} done", file=sys.stderr)
    if not ran:
        print("error: no prompt fits the context", file=sys.stderr)
        return 2
    lines = [f"# Penalties: speculative decoding with the target's logits processed ({Path(args.bundle).name})", "",
             f"`python scripts/bench_penalties.py {args.bundle} --limit {args.limit} --max-new-tokens "
             f"{args.max_new_tokens} --drafters {args.drafters}`", "",
             f"{ran} prompts of scripts/data/more_prompts.jsonl, chat template, greedy; every reply "
             f"{'equal to' if exact else 'NOT always equal to'} plain decoding's with the same setting.", "",
             "| setting | drafter | tokens/s | x plain | tokens per target call |", "|---|---|---|---|---|"]
    for name in SETTINGS:
        base = sum(cells[(name, drafters[0])]["tps"]) / ran
        for d in drafters:
            c = cells[(name, d)]
            tps = sum(c["tps"]) / ran
            lines.append(f"| {name} | {d} | {tps:.1f} | {tps / base:.2f}x | {c['tokens'] / c['calls']:.2f} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        Path(args.out).write_text(report)
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
