#!/usr/bin/env python3
"""Time one INT4 matrix multiply per width: edgespec.MatMulQ4 against MatMulNBits (accuracy 4).

The width curve of the whole model (scripts/bench_width.py) is mostly the width curve of its INT4
GEMMs; this isolates them on the shapes of a Qwen2.5-1.5B layer, random weights, the same thread
pool edgespec's sessions use. Prints per shape and width the median milliseconds of a call and the
ratio to one row. A benchmark, not a test.

``--cold`` times each shape as a model's forward pass meets it: one graph of as many copies of the
matrix as fill ``--cold-mb`` (default 300 MB, past what the caches hold), each call reading weights
no earlier call left in a cache, and prints the time per matrix and the bandwidth it streams at
(hot repeated calls of one matrix run from the cache and hide what prefetching does: session 15).

    .venv/bin/python scripts/bench_q4_kernel.py [--threads 2] [--widths 1,2,3,4,5,8,9,16] [--reps 200]
    .venv/bin/python scripts/bench_q4_kernel.py --cold --widths 1,4,9,26 --ops MatMulQ4
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
# the Qwen2.5-Coder 0.5B drafter's (its gate and up are two matrices in the exported graph)
DRAFTER_SHAPES = {"qkv 896x1152": (896, 1152), "o 896x896": (896, 896), "gate 896x4864": (896, 4864),
                  "down 4864x896": (4864, 896)}


def graph(K: int, N: int, block: int, op: str, seed: int = 0, copies: int = 1, zero_points: str = "uint8"):
    """One graph of ``copies`` independent (K, N) INT4 matrix multiplies of the same input (outputs
    Y0, Y1, ...: onnxruntime runs them one after another), and the bytes of one matrix's weights."""
    from onnx import TensorProto, helper, numpy_helper

    from edgespec_export.kernels import pack_q4

    nb = K // block
    rng = np.random.default_rng(seed)
    dom = "com.microsoft" if op == "MatMulNBits" else "edgespec"
    kw = {"accuracy_level": 4} if op == "MatMulNBits" else {}
    inits, nodes, outs, nbytes = [], [], [], 0
    for c in range(copies):
        arrs = [rng.integers(0, 256, size=(N, nb, block // 2), dtype=np.uint8),
                (rng.random(N * nb) * 0.02 + 0.001).astype(np.float32),
                rng.integers(0, 256, size=(N * ((nb + 1) // 2),), dtype=np.uint8) if zero_points == "uint8"
                else (rng.random(N * nb) * 16).astype(np.float32)]  # (float: a minimum a block, HQQ's or a GGUF's)
        if op == "MatMulQ4":
            arrs = list(pack_q4(*arrs, K, N, block))
        names = [f"{x}{c}" if a is not None else "" for x, a in zip("BSZ_M", arrs)]
        inits += [numpy_helper.from_array(a, n) for a, n in zip(arrs, names) if a is not None]
        if len(names) > 3:  # minimums: input 5, after the bias's slot (MatMulQ4 has no zero points beside them)
            names = [*names[:3], "", names[3]]
        nodes.append(helper.make_node(op, ["A", *names], [f"Y{c}"], domain=dom, K=K, N=N, bits=4, block_size=block,
                                      **kw))
        outs.append(helper.make_tensor_value_info(f"Y{c}", TensorProto.FLOAT, ["M", N]))
        nbytes = nbytes or sum(a.nbytes for a in arrs if a is not None)  # every copy has the same size
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])], outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(dom, 1)]), nbytes


def session(model, threads: int, lib: str | None = None):
    import onnxruntime as ort

    from edgespec.native import library_path
    from edgespec.onnx_lm import shared_thread_pool

    shared_thread_pool(threads)
    so = ort.SessionOptions()
    so.use_per_session_threads = False
    so.register_custom_ops_library(lib or library_path())
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def kernel_runs(a) -> list[tuple[str, str | None, str]]:
    """(op, library or None, label) of every kernel a shape is timed with: ``--ops``, then each ``--lib``."""
    return [(op, None, op) for op in a.ops.split(",")] + [("MatMulQ4", lib, Path(lib).stem[-8:]) for lib in a.lib]


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
    ap.add_argument("--zero-points", choices=["uint8", "float"], default="uint8",
                    help="float: a float zero point a block (MatMulQ4's minimums: HQQ's and a GGUF's blocks)")
    ap.add_argument("--ops", default="MatMulQ4,MatMulNBits")
    ap.add_argument("--lib", action="append", default=[],
                    help="also time MatMulQ4 from this built library (A/B of kernel versions); repeatable")
    ap.add_argument("--cold", action="store_true",
                    help="time each matrix as a forward pass meets it: copies past the caches (see above)")
    ap.add_argument("--cold-mb", type=float, default=300.0)
    ap.add_argument("--drafter", action="store_true", help="the 0.5B drafter's shapes instead of the 1.5B target's")
    a = ap.parse_args()
    shapes = DRAFTER_SHAPES if a.drafter else SHAPES
    widths = [int(w) for w in a.widths.split(",")]
    rng = np.random.default_rng(1)
    if a.cold:
        return cold(a, shapes, widths, rng)
    print(f"{'shape':22s} {'op':12s} " + " ".join(f"{'w' + str(w):>12s}" for w in widths))
    for name, (K, N) in shapes.items():
        for op, lib, label in kernel_runs(a):
            sess = session(graph(K, N, a.block, op, zero_points=a.zero_points)[0], a.threads, lib)
            ms = [time_call(sess, rng.standard_normal((w, K)).astype(np.float32), a.reps) for w in widths]
            cells = " ".join(f"{m:7.3f}/{m / ms[0]:4.2f}" for m in ms)
            print(f"{name:22s} {label:12s} {cells}", flush=True)


def cold(a, shapes: dict, widths: list[int], rng) -> None:
    """Per shape and width: microseconds a matrix and GB/s of its weights, median of 7 passes over
    the copies after 5 warm-up passes (each pass reads every copy once; the caches hold none of them)."""
    print(f"{'shape':22s} {'op':12s} {'copies':>6s} " + " ".join(f"{'w' + str(w) + ' us  GB/s':>16s}" for w in widths))
    for name, (K, N) in shapes.items():
        copies = max(4, int(a.cold_mb * 1e6 / (K * N * 0.53)))
        for op, lib, label in kernel_runs(a):
            model, nbytes = graph(K, N, a.block, op, copies=copies, zero_points=a.zero_points)
            sess = session(model, a.threads, lib)
            cells = []
            for w in widths:
                per = time_call(sess, rng.standard_normal((w, K)).astype(np.float32), 7) / 1e3 / copies
                cells.append(f"{per * 1e6:8.1f} {nbytes / per / 1e9:5.1f}")
            print(f"{name:22s} {label:12s} {copies:6d} " + " ".join(f"{c:>16s}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
