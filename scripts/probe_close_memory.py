#!/usr/bin/env python3
"""Resident memory across load / generate / drop cycles of one bundle: an engine let go with ``del``
against one closed with ``Engine.close()`` (which hands the allocator's free memory back).

    python scripts/probe_close_memory.py bundles/qwen-coder-b128-v64k-xk --cycles 3

Prints, per cycle and way, the process's resident memory with the engine loaded (after 8 generated tokens) and
after it is gone. Each way runs in a fresh process (the two would share one allocator otherwise).
"""
from __future__ import annotations

import argparse
import gc
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def cycles(bundle: str, n: int, close: bool) -> None:
    import edgespec
    from edgespec.measure import rss_now

    def rss_mib() -> int:
        return rss_now() >> 20

    for i in range(n):
        eng = edgespec.load(bundle, model_sampling=False, memory=False)
        list(eng.stream_ids(eng.tokenizer.encode("Hello there, how are you?"), max_new_tokens=8))
        loaded = rss_mib()
        if close:
            eng.close()
        del eng
        gc.collect()
        print(f"{'close' if close else 'del':5s} cycle {i}: loaded {loaded} MiB, after {rss_mib()} MiB", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--way", choices=["del", "close"], default=None, help="one way in this process (internal)")
    args = ap.parse_args(argv)
    if args.way:
        from edgespec.errors import EdgespecError

        try:
            cycles(args.bundle, args.cycles, args.way == "close")
        except EdgespecError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    for way in ("del", "close"):
        r = subprocess.run([sys.executable, __file__, args.bundle, "--cycles", str(args.cycles), "--way", way])
        if r.returncode:
            return r.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
