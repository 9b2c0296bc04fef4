#!/usr/bin/env python3
"""A hint priced at a model drafter's first read, or not, timed in one process (session 80; mutation Q52 of
mutation_s78.md): `auto` greedy on one engine with two round-policy states taking turns prompt by prompt
(engine.reset() before each generation; the arms' order swapped every prompt, so the machine's drift falls on both;
every output checked equal between the arms). ``old``: what ships (RoundPolicy.hint_first_reads False: a round where
the model drafter must read the context first is priced without the hint, a rule older than hints at a first read,
c63203e); ``new``: the hint priced there too. Prints decode tok/s per arm and category, and the model drafter's
rounds.

    python scripts/ab_hint_first_read.py [BUNDLE] [--prompts FILE] [--repeat N]
"""
from __future__ import annotations

import collections
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    from _policy_ab import policy_arms, rounds

    args, qs, eng, arms = policy_arms(__doc__, argv)
    arms["new"].hint_first_reads = True
    secs, toks, model = collections.Counter(), collections.Counter(), collections.Counter()
    cat_secs, cat_toks = collections.Counter(), collections.Counter()
    for q, out in rounds(args, qs, eng, arms):
        for arm, r in out.items():
            s = r.stats
            t, n = s["total_s"] - s["ttft_ms"] / 1000, s["new_tokens"] - 1
            secs[arm] += t
            toks[arm] += n
            cat = q.get("category", "?")
            cat_secs[arm, cat] += t
            cat_toks[arm, cat] += n
            model[arm] += (s.get("rounds_by_drafter") or {}).get("model", 0)
        print(f"{q['question_id']:12s} " + "  ".join(
            f"{a} {toks[a] / secs[a]:5.1f} tok/s (model rounds {model[a]})" for a in ("old", "new")), flush=True)
    for cat in sorted({c for _, c in cat_secs}):
        o, n = (cat_toks[a, cat] / cat_secs[a, cat] for a in ("old", "new"))
        print(f"{cat:14s} old {o:5.1f}  new {n:5.1f} tok/s  new/old {n / o:.3f}")
    print(f"\nnew/old decode speed {toks['new'] / secs['new'] / (toks['old'] / secs['old']):.3f} "
          f"({toks['old'] / secs['old']:.1f} -> {toks['new'] / secs['new']:.1f} tok/s); model drafter rounds "
          f"{model['old']} -> {model['new']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
