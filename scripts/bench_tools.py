#!/usr/bin/env python3
"""Tool calls: what speculative decoding buys on replies that are calls (short JSON whose arguments often
repeat the request), per drafter, greedy, every reply checked against plain decoding's.

    python scripts/bench_tools.py bundles/qwen-coder-b128-v64k-xk --reps 2

Workload: scripts/data/tool_tasks.jsonl (a request each, with the tools of scripts/data/tool_defs.json it
may call). Each request runs from an empty engine (``reset``), so the tools' system prompt is prefilled
every time; the figures are decode tokens/s after the first token (as bench_spec.py), target calls, and
the calls the reply made. Runs alternate drafters within a rep, so drift hits them alike.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DATA = Path(__file__).resolve().parent / "data"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--drafters", default="none,prompt-lookup,model,auto")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="write every run's figures here")
    args = ap.parse_args(argv)
    import edgespec
    from edgespec.errors import EdgespecError

    defs = json.loads((DATA / "tool_defs.json").read_text())
    tasks = [json.loads(line) for line in (DATA / "tool_tasks.jsonl").read_text().splitlines() if line.strip()]
    drafters = [d for d in args.drafters.split(",") if d]
    try:
        eng = edgespec.load(args.bundle, model_sampling=False, threads=args.threads, memory=False)
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    runs, ref = [], {}
    for rep in range(args.reps):
        for t in tasks:
            tools = [{"type": "function", "function": {"name": n, **defs[n]}} for n in t["tools"]]
            for d in drafters:
                eng.reset()
                r = eng.generate(t["messages"], tools=tools, max_new_tokens=args.max_new_tokens, temperature=0,
                                 drafter=d)
                s = r.stats
                same = ref.setdefault(t["id"], r.token_ids) == r.token_ids
                runs.append({"rep": rep, "task": t["id"], "drafter": d, "new_tokens": s["new_tokens"],
                             "decode_s": max(s["total_s"] - s["prefill_ms"] / 1000.0, 1e-9), "target_calls": s["target_calls"], "same": same,
                             "calls": [(c["function"]["name"], c["function"]["arguments"]) for c in r.tool_calls],
                             "content": r.text})
                if not same:
                    print(f"MISMATCH: {t['id']} {d} differs from plain decoding", file=sys.stderr)
    print(f"{Path(args.bundle).name}, greedy, {args.reps} rep(s), {len(tasks)} requests\n")
    print("| drafter | tokens/s (decode) | x plain | tokens per target call | replies equal to plain |")
    print("|---|---|---|---|---|")

    def rate(d):
        rs = [r for r in runs if r["drafter"] == d]
        toks = sum(r["new_tokens"] - 1 for r in rs)
        return toks / max(1e-9, sum(r["decode_s"] for r in rs)), rs
    base = rate(drafters[0])[0]
    for d in drafters:
        tps, rs = rate(d)
        per_call = sum(r["new_tokens"] for r in rs) / max(1, sum(r["target_calls"] for r in rs))
        print(f"| {d} | {tps:.1f} | {tps / base:.2f}x | {per_call:.2f} | {sum(r['same'] for r in rs)}/{len(rs)} |")
    print("\n| request | tokens | the reply's calls (plain decoding) |\n|---|---|---|")
    for t in tasks:
        r = next(r for r in runs if r["task"] == t["id"] and r["drafter"] == drafters[0])
        calls = "; ".join(f"{n}({a})" for n, a in r["calls"]) or f"no call: {r['content'][:60]!r}"
        calls = calls.replace("|", "\\|")
        print(f"| {t['id']} | {r['new_tokens']} | {calls} |")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 0 if all(r["same"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
