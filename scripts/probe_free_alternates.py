#!/usr/bin/env python3
"""Would free drafters' alternates pay? (session 58's probe): how often the target's greedy token is the
second most frequent continuation of the suffix drafter's longest matching context where the most frequent one
(what it drafts) is not. For each prompt (first turn, chat template) the target decodes greedily; then, teacher-
forced over prompt + reply, each reply position looks up the generation's own context index (``ngram.LiveIndex``,
the suffix drafter's ``ctx`` source, which is prompt lookup's text) as drafting would, and counts: the first
guess right, and where it is wrong, the second continuation of the same context right (an alternate verified
beside the draft token would keep it), and the best continuation of the next shorter context right.

    python scripts/probe_free_alternates.py bundles/qwen-coder-b128-v64k-xk \\
        --prompts edgespec/data/prompts.jsonl:2 --prompts scripts/data/more_prompts.jsonl:4

Session 58 (the Qwen pair, 42 prompts): the second continuation was the target's token at 7% of the wrong
guesses (summaries 13%, chat and QA 3-4%), the shorter context's at 1%: an alternate beside a free draft
would add ~0.1 token to a rejected round, so free drafters give none (the model drafter's second choice is the
target's token at 36% of its wrong guesses: probe_alternates.py, session 26).
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # (probe_alternates' --prompts reading)


def second(entry) -> int | None:
    """The second most frequent continuation of a context's index entry ([best, count, {token: count} or None])."""
    if entry[2] is None:
        return None
    ranked = sorted(entry[2].items(), key=lambda kv: -kv[1])
    return next((t for t, _ in ranked if t != entry[0]), None)


def count(prompt: list[int], reply: list[int], s: Counter) -> None:
    from edgespec.ngram import ORDERS, LiveIndex, context_keys

    index = LiveIndex(ORDERS)
    index.extend(prompt)
    seq = list(prompt)
    for tok in reply:
        keys = context_keys(seq[-ORDERS:], ORDERS)
        s["positions"] += 1
        n = next((n for n in range(len(keys), 0, -1) if keys[n - 1] in index._next), 0)
        if n:
            e = index._next[keys[n - 1]]
            s["guessed"] += 1
            if e[0] == tok:
                s["right"] += 1
            else:
                s["wrong"] += 1
                alt = second(e)
                s["has_alternate"] += alt is not None
                s["alternate_right"] += alt == tok
                shorter = next((index._next[keys[m - 1]][0] for m in range(n - 1, 0, -1)
                                if keys[m - 1] in index._next and index._next[keys[m - 1]][0] != e[0]), None)
                s["shorter_right"] += shorter == tok
        index.extend([tok])
        seq.append(tok)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--prompts", action="append", default=None, metavar="FILE:N")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    if args.max_new_tokens < 1:
        ap.error("--max-new-tokens must be >= 1")
    import edgespec
    from edgespec.errors import EdgespecError
    from probe_alternates import prompts_of

    try:
        prompts = prompts_of(args.prompts)
        eng = edgespec.load(args.bundle, model_sampling=False, memory=False)
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stats: dict[str, Counter] = defaultdict(Counter)
    skipped = 0
    for q in prompts:
        msgs = [{"role": "user", "content": q["turns"][0]}]
        ids = list(eng.encode(msgs))
        if len(ids) + args.max_new_tokens > eng.max_context:  # (as probe_alternates: left out, said below)
            skipped += 1
            continue
        r = eng.generate(msgs, max_new_tokens=args.max_new_tokens, drafter="none")
        count(ids, list(r.token_ids), stats[q["category"]])
    stats["all"] = sum(stats.values(), Counter())
    print("| category | positions | first guess right | wrong | second continuation right (of wrong) "
          "| shorter context's right (of wrong) |")
    print("|---|---:|---:|---:|---:|---:|")
    for cat, s in stats.items():
        w = max(s["wrong"], 1)
        print(f"| {cat} | {s['positions']} | {s['right'] / max(s['positions'], 1):.2f} | {s['wrong']} | "
              f"{s['alternate_right']} ({s['alternate_right'] / w:.2f}) | "
              f"{s['shorter_right']} ({s['shorter_right'] / w:.2f}) |")
    if skipped:
        print(f"({skipped} prompts longer than the context allows were left out)")
    eng.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
