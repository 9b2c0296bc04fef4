#!/usr/bin/env python3
"""Where speculative decoding's time goes, by call width: the repeated-traffic workload of
bench_traffic.py (64 tokens, greedy), each request decoded with ``none`` and then ``--drafter``, with
every target and drafter call of the ``--drafter`` runs timed by its width (the prompt's prefill
included: the calls wider than 32).

    python scripts/profile_widths.py bundles/qwen-coder-b128-v64k-xk [--drafter auto] [--limit N]

The buckets follow the INT4 kernel's paths on an AMX CPU: 1 row, the VNNI path's 2-8 rows, AMX's
one chunk (9-15), two chunks (16-30), and prefill chunks. Run it alone on the machine.
"""
from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from one_line_errors import one_line_errors  # noqa: E402

BUCKETS = ((1, 1), (2, 8), (9, 15), (16, 16), (17, 30), (31, 32), (33, 1 << 30))


@one_line_errors
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--drafter", default="auto")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=None)
    args = ap.parse_args(argv)
    import bench_traffic as bt
    import edgespec

    secs: dict[str, dict[int, float]] = {"target": collections.defaultdict(float),
                                         "drafter": collections.defaultdict(float)}
    calls: dict[str, collections.Counter] = {"target": collections.Counter(), "drafter": collections.Counter()}
    timing = {"on": False}
    with tempfile.TemporaryDirectory() as tmp:
        eng = edgespec.load(args.bundle, model_sampling=False, threads=None, memory=Path(tmp) / "store.npz", documents=[bt.MANUAL])
        models = {"target": eng.decoder.target}
        if "model" in eng.decoder.drafters:
            models["drafter"] = eng.decoder.drafters["model"].lm
        for role, lm in models.items():
            run = lm._run

            def timed(ids, past, *a, run=run, role=role, **kw):
                t = time.perf_counter()
                out = run(ids, past, *a, **kw)
                if timing["on"]:
                    secs[role][len(ids)] += time.perf_counter() - t
                    calls[role][len(ids)] += 1
                return out
            lm._run = timed
        stream = eng.stream_ids

        def watched(ids, **kw):
            timing["on"] = kw.get("drafter") == args.drafter
            try:
                yield from stream(ids, **kw)
            finally:
                timing["on"] = False
        eng.stream_ids = watched
        eng.reset()
        list(stream(eng.tokenizer.encode("Hello"), max_new_tokens=8, drafter="none"))  # warm-up
        runs, _ = bt.run_traffic(eng, [args.drafter], args.max_new_tokens, args.limit, lambda s: None)
    spec = [r for r in runs if r["drafter"] == args.drafter]
    base = [r for r in runs if r["drafter"] == "none"]
    t_spec, t_base = sum(r["decode_s"] for r in spec), sum(r["decode_s"] for r in base)
    print(f"{Path(args.bundle).name}: {args.drafter} {t_spec:.1f} s decoding against none {t_base:.1f} s "
          f"({t_base / t_spec:.2f}x); exact: {all(r['exact'] for r in spec)}")
    print("| model | widths | seconds | share | calls | ms a call |")
    print("|---|---|---:|---:|---:|---:|")
    for role in models:
        total = sum(secs[role].values()) or 1.0
        for lo, hi in BUCKETS:
            s = sum(v for w, v in secs[role].items() if lo <= w <= hi)
            n = sum(v for w, v in calls[role].items() if lo <= w <= hi)
            if n:
                label = f"{lo}" if lo == hi else (f"{lo}+ (prefill)" if hi > 1000 else f"{lo}-{hi}")
                print(f"| {role} | {label} | {s:.2f} | {100 * s / total:.0f}% | {n} | {1e3 * s / n:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
