#!/usr/bin/env python3
"""Where a one-token call's time goes, by onnxruntime operator (its own profiler), for a bundle's
drafter (default) or target: 30 calls after a 256-token context, the sum of node kernel times
against the session's run and the wall time.

    python scripts/profile_ops.py bundles/qwen-coder-b128-v64k-xk [target]

Profiling adds its own cost (the wall time per call is ~1-6 ms above an unprofiled call); the
shares between operators are what it is for (docs/bench/profile_ops_s17.md).
"""
import json, sys, time, glob, os
import numpy as np
import onnxruntime as ort
_SO = ort.SessionOptions
class SO(_SO):
    def __init__(self):
        super().__init__(); self.enable_profiling = True; self.profile_file_prefix = "/tmp/ortprof/p"
ort.SessionOptions = SO
os.makedirs("/tmp/ortprof", exist_ok=True)  # onnxruntime writes its JSON profile here
import edgespec
eng = edgespec.load(sys.argv[1], memory=False, max_context=1024)
d = eng.decoder.drafters["model"].lm if len(sys.argv) < 3 else eng.decoder.target
ids = [(7919 * i + 13) % 30000 for i in range(300)]
d.reset(); d.forward(ids[:256])
t0 = time.perf_counter()
N = 30
for i in range(N):
    d.forward([ids[256]]); d.rewind(1)
wall = (time.perf_counter() - t0) / N
f = d.session.end_profiling()
ev = json.load(open(f))
runs = [e for e in ev if e.get("cat") == "Session" and e["name"] == "model_run"]
last = runs[-N:]
start = last[0]["ts"]
nodes = [e for e in ev if e.get("cat") == "Node" and e["ts"] >= start and e["name"].endswith("_kernel_time")]
tot = sum(e["dur"] for e in nodes) / N / 1000
run = np.median([e["dur"] for e in last]) / 1000
from collections import defaultdict
by = defaultdict(float); cnt = defaultdict(int)
for e in nodes:
    op = e["args"].get("op_name"); by[op] += e["dur"] / N / 1000; cnt[op] += 1
print(f"wall/call {wall*1e3:.2f} ms; model_run {run:.2f} ms; sum of node kernel times {tot:.2f} ms; nodes/call {len(nodes)/N:.0f}")
for op, v in sorted(by.items(), key=lambda x: -x[1])[:12]:
    print(f"  {op:28s} {v:6.2f} ms  {cnt[op]/N:5.0f} nodes")
