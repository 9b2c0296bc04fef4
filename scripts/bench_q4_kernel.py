#!/usr/bin/env python3
"""Time one INT4 matrix multiply per width: edgespec.MatMulQ4 against MatMulNBits (accuracy 4).

The width curve of the whole model (scripts/bench_width.py) is mostly the width curve of its INT4
GEMMs; this isolates them on the shapes of a Qwen2.5-1.5B layer, random weights, the same thread
pool edgespec's sessions use. Prints per shape and width the median milliseconds of a call and the
ratio to one row. A benchmark, not a test.

    .venv/bin/python scripts/bench_q4_kernel.py [--threads 2] [--widths 1,2,3,4,5,8,9,16] [--reps 200]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {"qkv 1536x2048": (1536, 2048), "o 1536x1536": (1536, 1536), "gate+up 1536x17920": (1536, 17920),
          "down 8960x1536": (8960, 1536)}


def graph(K: int, N: int, block: int, op: str, seed: int = 0):
    from onnx import TensorProto, helper, numpy_helper

    from edgespec_export.kernels import pack_q4

    nb = K // block
    rng = np.random.default_rng(seed)
    arrs = [rng.integers(0, 256, size=(N, nb, block // 2), dtype=np.uint8),
            (rng.random(N * nb) * 0.02 + 0.001).astype(np.float32),
            rng.integers(0, 256, size=(N * ((nb + 1) // 2),), dtype=np.uint8)]
    if op == "MatMulQ4":
        arrs = list(pack_q4(*arrs, K, N, block))
    inits = [numpy_helper.from_array(a, n) for a, n in zip(arrs, "BSZ")]
    dom = "com.microsoft" if op == "MatMulNBits" else "edgespec"
    kw = {"accuracy_level": 4} if op == "MatMulNBits" else {}
    node = helper.make_node(op, ["A", "B", "S", "Z"], ["Y"], domain=dom, K=K, N=N, bits=4, block_size=block, **kw)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(dom, 1)])


def session(model, threads: int, lib: str | None = None):
    import onnxruntime as ort

    from edgespec.native import library_path
    from edgespec.onnx_lm import shared_thread_pool

    shared_thread_pool(threads)
    so = ort.SessionOptions()
    so.use_per_session_threads = False
    so.register_custom_ops_library(lib or library_path())
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def time_call(sess, x: np.ndarray, reps: int) -> float:
    for _ in range(5):
        sess.run(None, {"A": x})
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        sess.run(None, {"A": x})
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--widths", default="1,2,3,4,5,8,9,16")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--ops", default="MatMulQ4,MatMulNBits")
    ap.add_argument("--lib", action="append", default=[],
                    help="also time MatMulQ4 from this built library (A/B of kernel versions); repeatable")
    a = ap.parse_args()
    widths = [int(w) for w in a.widths.split(",")]
    rng = np.random.default_rng(1)
    print(f"{'shape':22s} {'op':12s} " + " ".join(f"{'w' + str(w):>12s}" for w in widths))
    for name, (K, N) in SHAPES.items():
        runs = [(op, None) for op in a.ops.split(",")] + [("MatMulQ4", lib) for lib in a.lib]
        for op, lib in runs:
            sess = session(graph(K, N, a.block, op), a.threads, lib)
            op = op if lib is None else Path(lib).stem[-8:]
            ms = [time_call(sess, rng.standard_normal((w, K)).astype(np.float32), a.reps) for w in widths]
            cells = " ".join(f"{m:7.3f}/{m / ms[0]:4.2f}" for m in ms)
            print(f"{name:22s} {op:12s} {cells}", flush=True)


if __name__ == "__main__":
    main()
