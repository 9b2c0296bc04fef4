#!/usr/bin/env python3
"""An alternate's premium, old and new, timed in one process (session 66): `auto` greedy on one engine with two
round-policy states taking turns prompt by prompt (engine.reset() before each generation; the arms' order swapped
every prompt, so the machine's drift falls on both; every output checked equal between the arms). ``old``: the premium
as before session 66 (a sample unclipped, never relaxed: a slow call with alternates could price them out for the
process); ``new``: what ships (ALT_PREMIUM_MAX, RoundPolicy._relax_premium). Prints decode tok/s per arm, alternates
verified and kept, and each arm's premium as it went.

    python scripts/ab_alt_premium.py [BUNDLE] [--prompts FILE] [--repeat N]
"""
from __future__ import annotations

import collections
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def old_premium(policy) -> None:
    """``policy`` learns its premium as before session 66: no clip on a sample, no halving."""
    import edgespec.policy as pm

    new = policy.observe_alternates

    def observe_alternates(self, kept, count=0, width=0, seconds=0.0):
        clip, pm.ALT_PREMIUM_MAX = pm.ALT_PREMIUM_MAX, float("inf")
        try:
            return new(kept, count, width, seconds)
        finally:
            pm.ALT_PREMIUM_MAX = clip

    policy.observe_alternates = types.MethodType(observe_alternates, policy)
    policy._relax_premium = lambda: None


def main(argv=None) -> int:
    from _policy_ab import policy_arms, rounds

    args, qs, eng, arms = policy_arms(__doc__, argv)
    dec = eng.decoder
    if not dec.policy.use_alternates:
        print("this target verifies no alternates here: nothing to compare", file=sys.stderr)
        return 2
    old_premium(arms["old"])
    secs, toks = collections.Counter(), collections.Counter()
    alts, kept = collections.Counter(), collections.Counter()
    trail = collections.defaultdict(list)
    for q, out in rounds(args, qs, eng, arms):
        for arm, r in out.items():
            s = r.stats
            secs[arm] += s["total_s"] - s["ttft_ms"] / 1000
            toks[arm] += s["new_tokens"] - 1
            alts[arm] += s.get("alternates", 0)
            kept[arm] += s.get("alternates_kept", 0)
            p = arms[arm].alt_premium
            trail[arm].append(None if p is None else round(p * 1e3, 2))
        print(f"{q['question_id']:12s} " + "  ".join(
            f"{a} {toks[a] / secs[a]:5.1f} tok/s, alternates {alts[a]} kept {kept[a]}, premium "
            f"{trail[a][-1]} ms" for a in ("old", "new")), flush=True)
    print(f"\nnew/old decode speed {toks['new'] / secs['new'] / (toks['old'] / secs['old']):.3f} "
          f"({toks['old'] / secs['old']:.1f} -> {toks['new'] / secs['new']:.1f} tok/s); alternates verified "
          f"{alts['old']} -> {alts['new']}, kept {kept['old']} -> {kept['new']}")
    for a in ("old", "new"):
        print(f"{a} premium (ms) after each generation: {trail[a]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
