#!/usr/bin/env python3
"""What one call costs in two bundles (e.g. one exported before and one after a graph rewrite), in one
process, their calls alternating so that machine drift falls on both: a target call of each of
``--widths`` tokens and a drafter step taken right after a target call, as in every round of speculative
decoding. Medians of ``--reps`` rounds, after a ``--context``-token context (less where a model holds less).

    python scripts/ab_calls.py OLD_BUNDLE bundles/qwen-coder-b128-v64k-xk --widths 1,4

Unlike ``ab_bundles.py`` the two targets need not compute the same numbers (a fused activation rounds
otherwise), so nothing is generated and no output is compared: only costs.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def measure(bundles: list[str], widths: list[int], reps: int = 30, context: int = 256) -> list[dict[str, float]]:
    """Per bundle, milliseconds: ``target N`` for each width N, and ``drafter step`` where it has one."""
    import edgespec

    engines = [edgespec.load(b, model_sampling=False, memory=False, max_context=max(512, context + max(widths) + 8)) for b in bundles]
    runs = []
    for eng in engines:
        target = eng.decoder.target
        target.min_width, target.width_multiple = 1, 1  # the width asked, unpadded
        model = eng.decoder.drafters.get("model")
        drafter = model.lm if model is not None else None
        vocab = min(30000, target.spec.vocab_size, drafter.spec.vocab_size if drafter else 30000)
        n = min(context, target.max_context - max(widths) - 1,
                drafter.max_context - 2 if drafter else context)
        ids = [(7919 * i + 13) % vocab for i in range(n + max(widths))]
        target.reset()
        target.forward(ids[:n])
        if drafter is not None:
            drafter.reset()
            drafter.forward(ids[:n])
        runs.append((target, drafter, ids, n))

    def timed(lm, tokens) -> float:
        t = time.perf_counter()
        lm.forward(tokens)
        took = time.perf_counter() - t
        lm.rewind(len(tokens))
        return took

    samples: list[dict[str, list[float]]] = [{} for _ in bundles]
    for rep in range(reps + 2):  # the first two rounds warm up (first calls of a width allocate)
        for (target, drafter, ids, n), got in zip(runs, samples):
            for w in widths:
                took = timed(target, ids[n:n + w])
                if rep >= 2:
                    got.setdefault(f"target {w}", []).append(took)
            if drafter is not None:
                timed(target, ids[n:n + 1])
                took = timed(drafter, ids[n:n + 1])
                if rep >= 2:
                    got.setdefault("drafter step", []).append(took)
    for eng in engines:
        eng.close()
    return [{k: statistics.median(v) * 1e3 for k, v in got.items()} for got in samples]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--widths", default="1,4", help="target call widths, comma-separated (default 1,4)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--context", type=int, default=256)
    args = ap.parse_args(argv)
    try:
        widths = sorted({int(w) for w in args.widths.split(",")})
    except ValueError:
        ap.error(f"--widths: comma-separated positive integers, not {args.widths!r}")
    if not widths or widths[0] < 1 or args.reps < 1 or args.context < 1:
        ap.error("--widths, --reps and --context must be positive")
    from edgespec.errors import EdgespecError

    try:
        res = measure([args.a, args.b], widths, args.reps, args.context)
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"median of {args.reps}, ms (B/A)")
    for key in res[0]:
        if key in res[1]:
            print(f"{key:>14s}: A {res[0][key]:7.2f}  B {res[1][key]:7.2f}  ({res[1][key] / res[0][key]:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
