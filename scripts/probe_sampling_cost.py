#!/usr/bin/env python3
"""Where sampling's time goes inside the decoding loop: ``distribution`` (temperature, top-k,
top-p over one row of logits) timed in place during plain sampled decoding, then again in a tight
loop over copies of the very rows it saw, plus minor page faults per token. docs/bench/history.md, "Autoregressive
decoding" (session 7): the same work costs ~2.5x more in the loop than in the tight loop.

    python scripts/probe_sampling_cost.py bundles/smollm2-int4 --tokens 64 --temperature 0.7 --top-p 0.8
"""
from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROMPT = "Write a Python function that parses a CSV line into a list of fields, handling quoted fields."


def probe(bundle: str, tokens: int = 64, temperature: float = 0.7, top_p: float = 0.8, sleep_s: float = 0.0,
          threads: int | None = None) -> dict:
    """Decode ``tokens`` sampled tokens with ``drafter="none"``; returns the per-token figures (µs)."""
    import numpy as np

    import edgespec
    from edgespec import sampling, verify

    eng = edgespec.load(bundle, model_sampling=False, use_drafter=False, threads=threads, memory=False)
    ids = eng.encode([{"role": "user", "content": PROMPT}]) if eng.manifest.chat_template else eng.encode(PROMPT)
    sp = sampling.SamplingParams(temperature=temperature, top_p=top_p)
    real = sampling.distribution
    times, rows = [], []

    def timed(row, p):
        if sleep_s:
            time.sleep(sleep_s)
        t = time.perf_counter()
        d = real(row, p)
        times.append(time.perf_counter() - t)
        rows.append(np.array(row, copy=True))
        return d

    def run():
        eng.reset()
        st = None
        for _, _, st, _ in eng.stream_ids(ids, max_new_tokens=tokens, drafter="none", ignore_eos=True,
                                       temperature=temperature, top_p=top_p, seed=0):
            pass
        return st

    run()  # warm-up
    verify.distribution = timed
    try:
        times.clear(), rows.clear()
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        st = run()
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / st.new_tokens
    finally:
        verify.distribution = real
    tight = []
    for _ in range(3):
        for r in rows:
            t = time.perf_counter()
            real(r, sp)
            tight.append(time.perf_counter() - t)
    n = st.new_tokens - 1
    return {"in_loop_us": statistics.median(times) * 1e6, "tight_loop_us": statistics.median(tight) * 1e6,
            "outside_run_us": (st.decode_s - st.target_run_s) / n * 1e6, "token_us": st.decode_s / n * 1e6,
            "minor_faults_per_token": faults, "rows": len(rows)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.8)
    ap.add_argument("--sleep-ms", type=float, default=0.0, help="sleep this long before each timed call")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.temperature <= 0:
        ap.error("--temperature must be > 0 (greedy does not sample)")
    from edgespec.errors import EdgespecError

    try:
        r = probe(args.bundle, args.tokens, args.temperature, args.top_p, args.sleep_ms / 1e3, args.threads)
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.bundle}: T={args.temperature} top-p={args.top_p}, {r['rows']} rows; median µs per call")
    print(f"distribution in the loop {r['in_loop_us']:.0f}; the same rows in a tight loop {r['tight_loop_us']:.0f}; "
          f"outside session.run {r['outside_run_us']:.0f} of a {r['token_us']:.0f} token; "
          f"minor page faults a token {r['minor_faults_per_token']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
