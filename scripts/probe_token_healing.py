#!/usr/bin/env python3
"""Token healing in an editor's use: the user has typed part of a line and the editor asks for the rest (fill in
the middle, the cursor inside a word or its indentation). For each gap of scripts/data/infill_cases.jsonl and
each cut of the gap's first line (a third, a half, two thirds of it typed), the same request without and
with token healing (greedy, one drafter): how often the completion's first line is the rest of the line cut
out, how often the whole gap comes back, and the latency.

    python scripts/probe_token_healing.py bundles/qwen-coder-b128-v64k-xk --out docs/bench/token_healing_s34.md
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
CASES = Path(__file__).resolve().parent / "data" / "infill_cases.jsonl"
CUTS = (1 / 3, 1 / 2, 2 / 3)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--cases", default=str(CASES))
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--drafter", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    import edgespec
    from edgespec.errors import EdgespecError

    try:
        cases = [json.loads(line) for line in Path(args.cases).read_text(encoding="utf-8").splitlines() if line.strip()]
        eng = edgespec.load(args.bundle, model_sampling=False, threads=args.threads, memory=False)
        eng.infill_stops()
        eng.config(drafter=args.drafter)
    except (OSError, ValueError, EdgespecError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    cases = cases[: args.limit]
    rows = {False: [], True: []}
    examples = []
    eng.generate(cases[0]["prefix"], suffix=cases[0]["suffix"], max_new_tokens=4, token_healing=True)  # warm-up
    for c in cases:
        line = c["middle"].split("\n", 1)[0]
        for f in CUTS:
            cut = max(1, int(len(line) * f))
            if cut >= len(line):
                continue
            typed, rest = line[:cut], line[cut:]
            got = {}
            for heal in (False, True):
                eng.reset()
                t0 = time.perf_counter()
                r = eng.generate(c["prefix"] + typed, suffix=c["suffix"], max_new_tokens=args.max_new_tokens,
                                 temperature=0, drafter=args.drafter, token_healing=heal)
                secs = time.perf_counter() - t0
                first = r.text.split("\n", 1)[0]
                rows[heal].append({"line": first.rstrip() == rest.rstrip(),
                                   "gap": (typed + r.text).strip() == c["middle"].strip(), "s": secs,
                                   "tokens": r.stats["new_tokens"], "per_call": r.stats["tokens_per_target_call"]})
                got[heal] = first
            if got[False] != got[True] and len(examples) < 8:
                examples.append((typed, rest, got[False], got[True]))
    n = len(rows[False])
    lines = [f"# Token healing at the cursor ({Path(args.bundle).name}, drafter {args.drafter}, greedy)", "",
             f"`python scripts/probe_token_healing.py {args.bundle}`" + (f" (--limit {args.limit})" if args.limit else ""),
             "", f"{n} requests: {len(cases)} gaps x the first line cut after a third, a half and two thirds of it.",
             "", "| token healing | first line right | whole gap right | latency, mean | tokens per target call |",
             "|---|---|---|---|---|"]
    for heal in (False, True):
        rs = rows[heal]
        lines.append(f"| {'on' if heal else 'off'} | {sum(r['line'] for r in rs)}/{n} | {sum(r['gap'] for r in rs)}/{n} | "
                     f"{statistics.mean(r['s'] for r in rs) * 1000:.0f} ms | "
                     f"{sum(r['tokens'] for r in rs) / sum(r['tokens'] / r['per_call'] for r in rs):.2f} |")
    if examples:
        lines += ["", "Where the first lines differ (typed | the rest cut out | off | on):", ""]
        lines += [f"- `{t!r}` | `{r!r}` | `{a!r}` | `{b!r}`" for t, r, a, b in examples]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
