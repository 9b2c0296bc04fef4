#!/usr/bin/env python3
"""A chat front end's traffic: after each reply, the short requests a front end such as Open WebUI sends
about the conversation (a title, tags, follow-up questions), one engine serving them all in order, greedy.

    python scripts/bench_chatui.py bundles/qwen-coder-b128-v64k-xk --per-category 2 --max-new-tokens 128

What it measures: how ``auto`` does on the replies when short requests come between them. The round policy
prices the model drafter's first read of a prompt against the tokens the generation is expected still to
produce, learned from the recent generations' lengths (``RoundPolicy.horizon``). Two engines on the bundle
run every request in the same minutes, alternating: A prices the read with the rule before session 32
(``averaged_horizon`` below: the average of all recent lengths, less what the generation produced, at
least 16) and B with the shipped one; ``none`` runs on both (each engine's policy sees every request, as a
server's does). Every ``auto`` output is checked against ``none``'s. Figures: decode tokens/s after the
first token per kind of request, ``auto`` against ``none`` per side, and B/A.

Prompts: the first turns of ``--prompts`` (Spec-Bench's format; default: the shipped set). Each engine is
reset before each run (no cache carried between requests), so a model drafter reads each prompt whole.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# what a front end asks after a reply, about the conversation so far (written for this bench, in the manner of
# Open WebUI's default task prompts), with the budget it gives each
TASKS = {
    "title": ("Create a concise title of 3 to 5 words, starting with an emoji, that sums up the chat below. "
              'Reply with JSON only: {"title": "..."}', 48),
    "tags": ("Give 1 to 3 broad tags for the main themes of the chat below, then 1 to 3 more specific "
             'subtopic tags. Reply with JSON only: {"tags": ["...", "..."]}', 64),
    "follow_ups": ("Suggest 3 short follow-up questions the user might ask next about the chat below, from the "
                   'user\'s point of view. Reply with JSON only: {"follow_ups": ["...", "...", "..."]}', 96),
}


def task_messages(task: str, question: str, reply: str) -> list[dict]:
    text = TASKS[task][0]
    return [{"role": "user", "content": f"### Task:\n{text}\n\n### Chat:\n<chat_history>\nUSER: {question}\n"
             f"ASSISTANT: {reply}\n</chat_history>"}]


def averaged_horizon(self, kcap: int) -> float:
    """RoundPolicy.horizon before session 32: the recent lengths' average (the newest weighing most), less
    what this generation produced, at least 16 (A's rule)."""
    left = float(kcap + 1)
    if self._timed and self._lengths:
        ws = [(1.0 - self.length_ema) ** i for i in range(len(self._lengths))]
        typical = sum(w * n for w, n in zip(ws, reversed(self._lengths))) / sum(ws)
        left = min(left, max(typical - self._produced, 16.0))
    return left


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--prompts", default=None, help="a prompt file in Spec-Bench's format (default: the shipped set)")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128, help="the replies' budget")
    ap.add_argument("--tasks", default=",".join(TASKS), help=f"the requests after each reply, of {', '.join(TASKS)}")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="write every run's figures here")
    args = ap.parse_args(argv)
    tasks = [t for t in args.tasks.split(",") if t]
    if not tasks or any(t not in TASKS for t in tasks):
        ap.error(f"--tasks: a list of {', '.join(TASKS)}, got {args.tasks!r}")
    import edgespec
    from edgespec.bench import read_prompts
    from edgespec.errors import EdgespecError

    try:
        prompts = read_prompts(args.prompts, per_category=args.per_category)
        engines = {x: edgespec.load(args.bundle, model_sampling=False, threads=args.threads, memory=False, prompt_cache_mb=0) for x in "AB"}
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    pol = engines["A"].decoder.policy
    pol.horizon = types.MethodType(averaged_horizon, pol)
    runs, ok = [], True

    def run(msgs, budget, kind, qid):
        nonlocal ok
        ref = None
        for d in ("none", "auto"):
            for x, eng in engines.items():
                eng.reset()
                r = eng.generate(msgs, max_new_tokens=budget, drafter=d)
                s = r.stats
                ref = r.token_ids if ref is None else ref
                same = r.token_ids == ref
                if not same:
                    ok = False
                    print(f"MISMATCH: {d}-{x} on {qid} {kind}", file=sys.stderr)
                runs.append({"prompt": qid, "kind": kind, "runner": f"{d}-{x}", "new_tokens": s["new_tokens"],
                             "target_calls": s["target_calls"], "same": same,
                             "decode_s": max(s["total_s"] - s["prefill_ms"] / 1000.0, 1e-9)})
        return r.text

    for p in prompts:
        q = p["turns"][0]
        msgs = [{"role": "user", "content": q}]
        room = min(e.max_context for e in engines.values())
        if len(engines["A"].encode(msgs)) + args.max_new_tokens > room:
            print(f"{p['question_id']}: skipped, it does not fit the context ({room})", file=sys.stderr)
            continue
        reply = run(msgs, args.max_new_tokens, "reply", p["question_id"])
        for t in tasks:
            tm = task_messages(t, q, reply)
            if len(engines["A"].encode(tm)) + TASKS[t][1] <= room:
                run(tm, TASKS[t][1], t, p["question_id"])
    if not runs:
        print("error: no prompt fits the context", file=sys.stderr)
        return 2
    kinds = ["reply"] + tasks + ["all"]
    agg = collections.defaultdict(lambda: [0, 0.0, 0, 0])
    for r in runs:
        for k in (r["kind"], "all"):
            a = agg[k, r["runner"]]
            a[0] += r["new_tokens"] - 1
            a[1] += r["decode_s"]
            a[2] += r["new_tokens"]
            a[3] += r["target_calls"]
    names = [f"{d}-{x}" for d in ("none", "auto") for x in "AB"]
    print(f"{Path(args.bundle).name}, greedy, {len(prompts)} prompts x (reply + {', '.join(tasks)}); "
          f"A: the read priced by the average length (before session 32), B: by the generations that ran "
          f"longer (shipped); every output equal to plain decoding: {'yes' if ok else 'NO'}\n")
    print("| request | tokens (mean) | " + " | ".join(f"{n} tok/s" for n in names)
          + " | auto/none A | auto/none B | auto B/A | tokens a call, auto A / B |")
    print("|---" * (6 + len(names)) + "|")
    for k in kinds:
        if (k, "none-A") not in agg:
            continue
        tps = {n: agg[k, n][0] / agg[k, n][1] for n in names}
        cnt = sum(1 for r in runs if r["runner"] == "none-A" and (k == "all" or r["kind"] == k))
        per = [agg[k, f"auto-{x}"][2] / max(1, agg[k, f"auto-{x}"][3]) for x in "AB"]
        print(f"| {k} | {agg[k, 'none-A'][2] / cnt:.0f} | " + " | ".join(f"{tps[n]:.1f}" for n in names)
              + f" | {tps['auto-A'] / tps['none-A']:.2f}x | {tps['auto-B'] / tps['none-B']:.2f}x"
              f" | {(tps['auto-B'] / tps['none-B']) / (tps['auto-A'] / tps['none-A']):.3f} | {per[0]:.2f} / {per[1]:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
