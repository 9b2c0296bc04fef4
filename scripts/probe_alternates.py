#!/usr/bin/env python3
"""How often the target's greedy token is the model drafter's second choice (session 26's probe
for alternates): for each prompt (first turn, chat template) the target decodes greedily, then the
drafter reads prompt and reply in one teacher-forced call, and each reply token's rank in the
drafter's logits is counted. Prints per category the share of positions at rank 0 (the draft
token) and rank 1 (its alternate), and rank 1 among the positions where rank 0 failed.

    python scripts/probe_alternates.py bundles/qwen-coder-b128-v64k-xk \\
        --prompts edgespec/data/prompts.jsonl:2 --prompts scripts/data/more_prompts.jsonl:4

Each ``--prompts FILE:N`` takes N prompts a category from FILE (Spec-Bench's format). The drafter
here reads the whole prompt; in decoding it reads a window (ModelDrafter.read_window), so these
shares are an upper bound of what decoding sees. ``--out`` writes the ranks as JSON.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

import numpy as np


def prompts_of(items: list[str] | None) -> list[dict]:
    """The prompts of ``--prompts FILE:N`` items (N prompts a category from FILE, Spec-Bench's format; default: the
    shipped set, 2 a category); EdgespecError for an item that is not FILE:N."""
    from edgespec.bench import DEFAULT_PROMPTS, read_prompts
    from edgespec.errors import EdgespecError

    specs = []
    for item in items or [f"{DEFAULT_PROMPTS}:2"]:
        path, _, n = item.rpartition(":")
        if not path or not n.isdigit() or int(n) < 1:
            raise EdgespecError(f"--prompts takes FILE:N (N >= 1 prompts a category), got {item!r}")
        specs.append((path, int(n)))
    return [q for path, n in specs for q in read_prompts(path, per_category=n)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--prompts", action="append", default=None, metavar="FILE:N")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.max_new_tokens < 1:
        ap.error("--max-new-tokens must be >= 1")
    import edgespec
    from edgespec.errors import EdgespecError

    try:
        prompts = prompts_of(args.prompts)
        eng = edgespec.load(args.bundle, model_sampling=False, memory=False)
        model = eng.decoder.drafters.get("model")
        if model is None:
            raise EdgespecError(f"{args.bundle} has no drafter model to probe")
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    dl, head = model.lm, model.head_ids
    room = min(eng.max_context, dl.max_context) - args.max_new_tokens  # prompt and reply in both models
    out, skipped = [], 0
    for q in prompts:
        msgs = [{"role": "user", "content": q["turns"][0]}]
        ids = eng.tokenizer.encode_chat(msgs)
        if len(ids) > room:
            skipped += 1
            continue
        reply = eng.generate(msgs, max_new_tokens=args.max_new_tokens, drafter="none").token_ids
        dl.reset()
        seq = list(ids) + list(reply)
        logits = dl.forward(seq[:-1])[len(ids) - 1:]
        col = {int(t): j for j, t in enumerate(head)} if head is not None else None
        ranks = []
        for row, t in zip(logits, reply):
            j = t if col is None else col.get(int(t))
            ranks.append(99 if j is None or j >= row.shape[0] else int((row > row[j]).sum()))
        out.append({"question_id": q["question_id"], "category": q["category"], "ranks": ranks})
    if skipped:
        print(f"({skipped} prompts longer than the context allows were left out)")
    if not out:
        print(f"error: no prompt fits the context ({room + args.max_new_tokens} tokens) with "
              f"{args.max_new_tokens} new tokens", file=sys.stderr)
        return 2
    by = defaultdict(list)
    for r in out:
        by[r["category"]] += r["ranks"]
    by["all"] = [x for r in out for x in r["ranks"]]
    print("| category | positions | rank 0 | rank 1 | rank 1 where rank 0 failed |")
    print("|---|---|---|---|---|")
    for cat, rs in by.items():
        a = np.array(rs)
        fail = (a != 0).sum()
        print(f"| {cat} | {len(a)} | {(a == 0).mean():.2f} | {(a == 1).mean():.2f} | "
              f"{((a == 1).sum() / fail if fail else 0):.2f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
