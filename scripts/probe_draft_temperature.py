#!/usr/bin/env python3
"""At which temperature should a model drafter sample its drafts when the target samples at T? A
teacher-forced probe of the rejection rule's acceptance, sum(min(p, q)), with q the drafter's softmax at
T x f for several factors f (session 32; docs/how-it-works.md: sampled drafts).

    python scripts/probe_draft_temperature.py bundles/qwen-coder-b128-v64k-xk --temperatures 0.7,1.0

Any q keeps the output exact (the rule divides by the q the draft was sampled from), so a drafter less sure
than its target might gain by sampling sharper (f < 1), and one surer by sampling flatter. For each prompt
(first turns of the shipped set, ``--per-category`` each) the target samples ``--tokens`` tokens at T
(seeded); target and drafter then read prompt + output in one pass each, and every output position gives
the acceptance at each factor, averaged per category. On the Qwen pair (session 32) the optimum was flat at
f = 0.8-0.9 and within 0.004 of f = 1 (0.801 against 0.798 at T = 0.7, 0.761 against 0.757 at T = 1), so the
drafter samples at the target's temperature.
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # (probe_draft_stop's teacher-forced pass)


def collect(eng, temperature: float, factors: list[float], tokens: int, per_category: int | None = None) -> dict:
    """category (and "all") -> [sum of the acceptance at each factor..., positions]."""
    from edgespec.bench import read_prompts
    from probe_draft_stop import _softmax, teacher_forced

    md = eng.decoder.drafters.get("model")
    head, vocab = (md.head_ids if md is not None else None), eng.decoder.vocab
    res = collections.defaultdict(lambda: np.zeros(len(factors) + 1))
    for _, p, a, b in teacher_forced(eng, read_prompts(per_category=per_category), temperature, tokens):
        p_t = _softmax(a[:vocab], temperature)
        d = b if head is not None else b[:vocab]  # the drafter's logits, over its kept ids or the vocabulary
        idx = head if head is not None else np.arange(d.shape[0])
        row = np.zeros(len(factors) + 1)
        row[-1] = 1
        for j, f in enumerate(factors):
            q = np.zeros(vocab)
            q[idx] = _softmax(d, temperature * f)
            row[j] = np.minimum(p_t, q).sum()
        for c in (p["category"], "all"):
            res[c] += row
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--temperatures", default="0.7,1.0")
    ap.add_argument("--factors", default="0.5,0.7,0.8,0.9,1.0,1.1,1.3")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--per-category", type=int, default=2)
    args = ap.parse_args(argv)
    try:
        temps = [float(x) for x in args.temperatures.split(",")]
        factors = [float(x) for x in args.factors.split(",")]
    except ValueError:
        ap.error("--temperatures and --factors take numbers separated by commas")
    if not all(t > 0 for t in temps) or not all(f > 0 for f in factors):
        ap.error("temperatures and factors must be above 0")
    import edgespec
    from edgespec.errors import EdgespecError

    try:
        eng = edgespec.load(args.bundle, model_sampling=False, memory=False)
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if "model" not in eng.decoder.drafters:
        print(f"error: {args.bundle} has no drafter model", file=sys.stderr)
        return 2
    print("| T | category | " + " | ".join(f"f = {f:g}" for f in factors) + " | positions |")
    print("|---" * (len(factors) + 3) + "|")
    for t in temps:
        res = collect(eng, t, factors, args.tokens, args.per_category)
        for c in sorted(res, key=lambda c: (c == "all", c)):
            r = res[c]
            print(f"| {t:g} | {c} | " + " | ".join(f"{x / r[-1]:.3f}" for x in r[:-1]) + f" | {int(r[-1])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
