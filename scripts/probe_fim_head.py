#!/usr/bin/env python3
"""How many tokens the model drafter should read of a fill-in-the-middle prompt (its head, drafters.fim_head):
an in-process A/B of head sizes, per drafter, over the gaps of scripts/data/infill_cases.jsonl, greedy.

    python scripts/probe_fim_head.py bundles/qwen-coder-b128-v64k-xk --heads 128,64,96 --drafters auto,model

Each gap runs once per (head, drafter), in an order reversed on every other gap so that drift hits them alike,
each from an empty cache (the prompt prefilled); the figures are decode tokens/s after the first token, target
calls, the model drafter's time and its acceptance. Every reply is checked against the first configuration's.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CASES = Path(__file__).resolve().parent / "data" / "infill_cases.jsonl"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--cases", default=str(CASES))
    ap.add_argument("--heads", default="128,64", help="head sizes in tokens (the drafter's read window for them)")
    ap.add_argument("--drafters", default="auto,model")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    try:
        heads = [int(h) for h in args.heads.split(",") if h]
    except ValueError:
        ap.error(f"--heads must be integers, got {args.heads!r}")
    if not heads or min(heads) < 4:
        ap.error("--heads: at least one size, each >= 4")
    import edgespec
    from edgespec import drafters as D
    from edgespec.errors import EdgespecError

    cases = [json.loads(line) for line in Path(args.cases).read_text(encoding="utf-8").splitlines() if line.strip()]
    cases = cases[:args.limit]
    try:
        eng = edgespec.load(args.bundle, model_sampling=False, memory=False)
        eng.infill_stops()
        for d in args.drafters.split(","):
            eng.config(drafter=d)
    except EdgespecError as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    model = eng.decoder.drafters.get("model")
    if model is None:
        print("error: this bundle has no drafter model", file=sys.stderr)
        return 2
    window, head = model.read_window, D.FIM_HEAD
    eng.generate(cases[0]["prefix"], suffix=cases[0]["suffix"], max_new_tokens=4, temperature=0)  # warm-up
    order = [(h, d) for d in args.drafters.split(",") for h in heads]
    agg, ref, ok = {}, {}, True
    try:
        for i, c in enumerate(cases):
            for h, d in (order if i % 2 == 0 else order[::-1]):
                model.read_window, D.FIM_HEAD = h, h  # a prompt longer than h: a head of h tokens
                eng.reset()
                r = eng.generate(c["prefix"], suffix=c["suffix"], max_new_tokens=args.max_new_tokens, temperature=0,
                                 drafter=d)
                s = r.stats
                ok &= ref.setdefault(c["id"], r.token_ids) == r.token_ids
                a = agg.setdefault((h, d), [0, 0.0, 0, 0.0, 0, 0])
                a[0] += s["new_tokens"] - 1
                a[1] += max(s["total_s"] - s["prefill_ms"] / 1000.0, 1e-9)
                a[2] += s["target_calls"]
                a[3] += s["model_call_s"]
                a[4] += s["drafted_by_drafter"].get("model", 0)
                a[5] += s["accepted_by_drafter"].get("model", 0)
    finally:
        model.read_window, D.FIM_HEAD = window, head
    print(f"{Path(args.bundle).name}, greedy, {len(cases)} gaps, replies equal across configurations: {ok}\n")
    print("| head | drafter | decode tok/s | target calls | model drafter s | model acceptance |")
    print("|---|---|---|---|---|---|")
    for (h, d), a in agg.items():
        print(f"| {h} | {d} | {a[0] / a[1]:.1f} | {a[2]} | {a[3]:.2f} | {a[5] / max(1, a[4]):.3f} |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
