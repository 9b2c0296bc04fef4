#!/usr/bin/env python3
"""Where a one-token call's time goes, by onnxruntime operator (its own profiler), for a bundle's
drafter (default) or target: ``--calls`` calls after a ``--context``-token context, the sum of node
kernel times against the session's run and the wall time.

    python scripts/profile_ops.py bundles/qwen-coder-b128-v64k-xk [target] [--context 2048]

Profiling adds its own cost (the wall time per call is ~1-6 ms above an unprofiled call); the
shares between operators are what it is for (docs/bench/profile_ops_s17.md; session 23 ran it at
256 and 2,048 positions: the drafter's attention 1.6 -> 5.8 ms a step).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def profile(bundle: str, role: str = "drafter", context: int = 256, calls: int = 30, top: int = 12) -> dict:
    """Per operator, milliseconds a call (mean) and nodes a call; with the wall time, the session's median
    ``model_run`` and the median over calls of a call's node kernel times (ms). onnxruntime's profiles go to a
    temporary directory, removed at the end (each run left ~0.4 MB in /tmp before session 45)."""
    prof_dir = tempfile.mkdtemp(prefix="edgespec-prof-")
    try:
        return _profile(bundle, role, context, calls, top, prof_dir)
    finally:
        shutil.rmtree(prof_dir, ignore_errors=True)


def _profile(bundle: str, role: str, context: int, calls: int, top: int, prof_dir: str) -> dict:
    import numpy as np
    import onnxruntime as ort

    import edgespec
    from edgespec.errors import ConfigError

    real = ort.SessionOptions

    class Profiled(real):  # every session edgespec opens writes onnxruntime's JSON profile
        def __init__(self):
            super().__init__()
            self.enable_profiling = True
            self.profile_file_prefix = os.path.join(prof_dir, "p")

    ort.SessionOptions = Profiled
    try:
        eng = edgespec.load(bundle, model_sampling=False, memory=False, max_context=context + 8)
    finally:
        ort.SessionOptions = real
    if role == "target":
        lm = eng.decoder.target
    else:
        model = eng.decoder.drafters.get("model")
        if model is None:
            raise ConfigError(f"{bundle} has no drafter model; profile its target ('target')")
        lm = model.lm
    if context + 1 > lm.max_context:
        raise ConfigError(f"a context of {context} tokens does not fit the {role}'s {lm.max_context}")
    vocab = min(30000, lm.spec.vocab_size)
    ids = [(7919 * i + 13) % vocab for i in range(context + 1)]
    lm.reset()
    lm.forward(ids[:context])
    t0 = time.perf_counter()
    for _ in range(calls):
        lm.forward([ids[context]])
        lm.rewind(1)
    wall = (time.perf_counter() - t0) / calls
    with open(lm.session.end_profiling()) as f:
        ev = json.load(f)
    runs = [e for e in ev if e.get("cat") == "Session" and e["name"] == "model_run"][-calls:]
    start = runs[0]["ts"]
    nodes = [e for e in ev if e.get("cat") == "Node" and e["ts"] >= start and e["name"].endswith("_kernel_time")]
    by: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for e in nodes:
        op = e["args"].get("op_name")
        by[op] += e["dur"] / calls / 1000
        count[op] += 1
    ops = {op: (ms, count[op] / calls) for op, ms in sorted(by.items(), key=lambda x: -x[1])[:top]}
    # per call, the kernels inside its model_run: the median of those sums beside the median run (a mean would
    # take in one call the machine stalled, which a median of the runs leaves out)
    per_call = [sum(e["dur"] for e in nodes if r["ts"] <= e["ts"] <= r["ts"] + r["dur"]) for r in runs]
    return {"wall_ms": wall * 1e3, "model_run_ms": float(np.median([e["dur"] for e in runs])) / 1000,
            "kernels_ms": float(np.median(per_call)) / 1000, "calls_with_kernels": sum(x > 0 for x in per_call),
            "nodes": len(nodes) / calls, "ops": ops}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("role", nargs="?", default="drafter", choices=("drafter", "target"))
    ap.add_argument("--context", type=int, default=256, help="tokens in the cache before the timed calls")
    ap.add_argument("--calls", type=int, default=30)
    args = ap.parse_args(argv)
    if args.context < 1 or args.calls < 1:
        ap.error("--context and --calls must be at least 1")
    from edgespec.errors import EdgespecError

    try:
        r = profile(args.bundle, args.role, args.context, args.calls)
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{Path(args.bundle).name} {args.role}, one-token calls after {args.context} tokens: wall/call "
          f"{r['wall_ms']:.2f} ms; model_run {r['model_run_ms']:.2f} ms; sum of node kernel times "
          f"{r['kernels_ms']:.2f} ms; nodes/call {r['nodes']:.0f}")
    for op, (ms, n) in r["ops"].items():
        print(f"  {op:28s} {ms:6.2f} ms  {n:5.0f} nodes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
