#!/usr/bin/env python3
"""A/B of two bundles of the same target (e.g. a full and a reduced drafter head), in one process,
the runs of each prompt alternating between them, so that machine drift falls on both:

    python scripts/ab_bundles.py bundles/qwen-coder-b128 bundles/qwen-coder-b128-v64k \\
        --drafters model,auto --per-category 2 --max-new-tokens 64

For every prompt of the shipped set (first turns, chat template; ``--prompts`` another file in its
format, e.g. scripts/data/long_prompts.jsonl, 1.7k-3.8k-token documents): ``none`` on A and on B,
then each drafter on A and on B. Greedy runs are checked against their own bundle's ``none`` (the
two need not compute the same numbers, e.g. float32 and float16 KV caches; whether their ``none``
outputs agree is printed); ``--same-target`` checks every run against A's ``none`` (two bundles of one
target, e.g. a full and a reduced drafter head). Prints tokens/s per category and runner and the B/A ratio per runner.

    python scripts/ab_bundles.py bundles/qwen-coder-b128-v64k-xk32 bundles/qwen-coder-b128-v64k-xk \
        --drafters auto --prompts scripts/data/long_prompts.jsonl --max-new-tokens 128

``--policy-a``/``--policy-b`` set the round policy's parameters of one side (RoundPolicy's constructor
arguments, NAME=VALUE,...): an A/B of two policies on one bundle (session 25: the model drafter's reads
priced by the rounds it would win, against the old rule, ``share_prior=1e12``):

    python scripts/ab_bundles.py bundles/qwen-coder-b128-v64k-xk bundles/qwen-coder-b128-v64k-xk --same-target \
        --policy-a share_prior=1e12 --drafters auto --per-category 4 --max-new-tokens 128 \
        --prompts scripts/data/more_prompts.jsonl
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def policy_params(text: str) -> dict:
    """``NAME=VALUE,...`` as RoundPolicy constructor arguments (numbers); ValueError, one line, otherwise."""
    import inspect

    from edgespec.policy import RoundPolicy

    known = set(inspect.signature(RoundPolicy).parameters)
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = (x.strip() for x in part.partition("="))
        if not eq or name not in known:
            raise ValueError(f"policy parameter {part!r}: expected NAME=VALUE with NAME one of {', '.join(sorted(known))}")
        try:
            out[name] = int(value) if value.lstrip("-").isdigit() else float(value)
        except ValueError:
            raise ValueError(f"policy parameter {name}: {value!r} is not a number") from None
    made = RoundPolicy(**out)  # the constructor's own checks (ValueError), before any bundle is loaded
    for name in out:  # set on a made policy as attributes: each must be stored under its own name
        if not hasattr(made, name):
            raise ValueError(f"policy parameter {name}: RoundPolicy keeps it under another name")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--drafters", default="model,auto")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--same-target", action="store_true", help="check every greedy run against A's plain decoding")
    ap.add_argument("--prompts", default=None, help="a prompt file in Spec-Bench's format (default: the shipped set)")
    for x in "ab":
        ap.add_argument(f"--policy-{x}", default="", metavar="NAME=VALUE,...",
                        help=f"round-policy parameters of {x.upper()} (RoundPolicy's arguments, e.g. share_prior=1e12)")
    args = ap.parse_args(argv)
    try:
        policies = [policy_params(args.policy_a), policy_params(args.policy_b)]
    except ValueError as e:
        ap.error(str(e))
    import edgespec
    from edgespec.bench import read_prompts
    from edgespec.errors import EdgespecError

    try:
        ea, eb = (edgespec.load(args.a, model_sampling=False, memory=False, prompt_cache_mb=0),
                  edgespec.load(args.b, model_sampling=False, memory=False, prompt_cache_mb=0))
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    drafters = [d for d in args.drafters.split(",") if d and d != "none"]
    for e, params in zip((ea, eb), policies):
        for k, v in params.items():
            setattr(e.decoder.policy, k, v)
    for e in (ea, eb):
        e.generate("hello", max_new_tokens=8, drafter="auto")
    runs = [(f"{d}-{x}", e, d) for d in ["none"] + drafters for x, e in (("A", ea), ("B", eb))]
    res = collections.defaultdict(lambda: collections.defaultdict(lambda: [0, 0.0]))
    mismatches = skipped = differ = 0
    room = min(ea.max_context, eb.max_context) - args.max_new_tokens
    try:
        prompts = read_prompts(args.prompts, per_category=args.per_category)
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for p in prompts:
        ids = ea.tokenizer.encode_chat([{"role": "user", "content": p["turns"][0]}])
        if len(ids) > room:
            skipped += 1
            continue
        ref = {}
        for name, e, d in runs:
            e.reset()
            out, st = [], None
            for _, toks, st, _ in e.stream_ids(ids, max_new_tokens=args.max_new_tokens, drafter=d,
                                            temperature=args.temperature):
                out.extend(toks)
            x = name[-1]  # A or B
            if d == "none":
                ref[x] = out
                differ += x == "B" and out != ref["A"]
            # (each run against its own bundle's plain decoding; with one target, against A's, none-B too)
            if not args.temperature and out != ref["A" if args.same_target else x]:
                mismatches += 1
                print(f"MISMATCH: {name} on {p['question_id']}", file=sys.stderr)
            for c in (p["category"], "all"):
                r = res[c][name]
                r[0] += st.new_tokens - 1
                r[1] += st.decode_s
    if not res:
        print(f"error: no prompt fits the context ({room + args.max_new_tokens} tokens) with "
              f"{args.max_new_tokens} new tokens", file=sys.stderr)
        return 2
    if skipped:
        print(f"({skipped} prompts longer than the context allows were left out)")
    if not args.temperature:
        print(f"plain decoding: B's output {'differs from' if differ else 'equals'} A's"
              + (f" on {differ} prompt(s)" if differ else " on every prompt")
              + "; every drafter's output equals " + ("A's" if args.same_target else "its own bundle's")
              + " plain decoding" + (" but" if mismatches else "")
              + (f" {mismatches} mismatch(es), listed above" if mismatches else ""))
    names = [n for n, _, _ in runs]
    drafters = ["none"] + drafters
    side = [f" (policy {p})" if p else "" for p in (args.policy_a, args.policy_b)]
    print(f"A = {args.a}{side[0]}, B = {args.b}{side[1]}; tokens/s")
    print("| category | " + " | ".join(names) + " | " + " | ".join(f"{d} B/A" for d in drafters) + " |")
    print("|---" * (1 + len(names) + len(drafters)) + "|")
    for c in sorted(res, key=lambda c: c == "all"):
        r = res[c]
        tps = {k: v[0] / v[1] for k, v in r.items()}
        print(f"| {c} | " + " | ".join(f"{tps[n]:.1f}" for n in names) + " | "
              + " | ".join(f"{tps[f'{d}-B'] / tps[f'{d}-A']:.3f}" for d in drafters) + " |")
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
