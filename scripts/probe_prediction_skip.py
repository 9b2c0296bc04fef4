#!/usr/bin/env python3
"""Does the prediction drafter's guess after a replaced token (``prediction/skip``) pay? One process, the
edit requests of scripts/data/prediction_tasks.jsonl, greedy, the prediction drafter alone and ``auto``
with the prediction, each with the guess on (``skip_span`` 6) and off (0), the order alternating by
request; every output checked against the first. Prints tokens/s and target calls per setting.

    python scripts/probe_prediction_skip.py bundles/qwen-coder-b128-v64k-xk
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_prediction import TASKS, request  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--span", type=int, default=6, help="the guess's span when on")
    args = ap.parse_args(argv)
    import edgespec

    e = edgespec.load(args.bundle, model_sampling=False, memory=False, prompt_cache_mb=0)
    tasks = [json.loads(line) for line in TASKS.read_text().splitlines() if line.strip()]
    pd = e.decoder.drafters["prediction"]
    e.generate("Hello", max_new_tokens=8)
    agg = collections.defaultdict(lambda: [0, 0.0, 0])
    for t in (t for t in tasks if t["kind"] == "edit"):
        ids = e.encode([{"role": "user", "content": request(t)}])
        pred = f"```{t['lang']}\n{t['text']}```"
        ref = None
        for d in ("prediction", "auto"):
            for span in ((args.span, 0) if len(t["id"]) % 2 else (0, args.span)):
                pd.skip_span = span
                e.reset()
                out, st = [], None
                for _, toks, st, _ in e.stream_ids(ids, max_new_tokens=args.max_new_tokens, drafter=d, prediction=pred):
                    out.extend(toks)
                ref = ref or out
                if out != ref:
                    print(f"MISMATCH: {t['id']} {d} span {span}", file=sys.stderr)
                    return 1
                a = agg[(d, span)]
                a[0] += st.new_tokens - 1
                a[1] += st.decode_s
                a[2] += st.target_calls
                print(f"{t['id']:12s} {d:10s} span {span}: {st.tokens_per_second:6.1f} tok/s, {st.target_calls} target "
                      f"calls", file=sys.stderr, flush=True)
    for (d, span), (n, secs, calls) in sorted(agg.items()):
        print(f"{d:10s} span {span}: {n / secs:6.1f} tok/s, {calls} target calls")
    return 0


if __name__ == "__main__":
    sys.exit(main())
