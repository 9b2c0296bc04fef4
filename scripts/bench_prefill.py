#!/usr/bin/env python3
"""Prefill speed: the target reading a prompt of N tokens (this README's text), best of R, as the
runtime opens it (the profile's prefill chunk, the process-wide pool). Time to first token is about
this for a long prompt. A benchmark, not a test; run it alone on the machine.

    python scripts/bench_prefill.py bundles/qwen-coder-b128-v64k-xk --tokens 512 --reps 3
    EDGESPEC_Q4_ISA=avx512 python scripts/bench_prefill.py ...   # an exact-kernels bundle without AMX
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    import edgespec
    from edgespec.native import cpu_supported, isa

    eng = edgespec.load(args.bundle, model_sampling=False, threads=args.threads, memory=False, max_context=args.tokens + 64,
                        prompt_cache_mb=0)  # the computation, never a restore
    target = eng.decoder.target
    ids = eng.tokenizer.encode((ROOT / "README.md").read_text(encoding="utf-8"))[: args.tokens]
    best = float("inf")
    for _ in range(args.reps):
        target.reset()
        t = time.perf_counter()
        target.prefill(ids)
        best = min(best, time.perf_counter() - t)
    target.reset()
    kernels = eng.manifest.target.kernels
    path = f"; kernel path {cpu_supported() or isa()}" if kernels != "onnxruntime" else ""
    print(f"{Path(args.bundle).name}: prefill of {len(ids)} tokens in chunks of {target.prefill_chunk}: "
          f"{best:.2f} s (best of {args.reps}) = {len(ids) / best:.1f} tokens/s ({kernels} kernels{path})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
