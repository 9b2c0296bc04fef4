#!/usr/bin/env python
"""onnxruntime's MatMulNBits (INT4, asymmetric, accuracy level 4) alone, per block size and call
width, on the shapes of Qwen2.5-Coder-1.5B's layers: the kernel-level evidence for the export's
``--block-size`` (README, "INT4 block size"). Also reports, per block size, which call widths
compute a shared row bitwise the same (the width policy's premise, docs/how-it-works.md, "Exactness").

    python scripts/bench_matmulnbits.py --blocks 32 64 128 --widths 1 2 4 --threads 2

Weights are random (the kernel's speed does not depend on their values); the small matrices stay in
cache between repetitions, so their times are a compute bound, not the memory-bound time they take
inside a model. The lm_head (117 MiB of 4-bit weights) does not fit any cache.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

SHAPES = [("qkv_proj", 1536, 2048), ("o_proj", 1536, 1536), ("gate_proj/up_proj", 1536, 8960),
          ("down_proj", 8960, 1536), ("lm_head", 1536, 151936)]


def graph(K: int, N: int, block: int, accuracy: int) -> bytes:
    from onnx import TensorProto, helper, numpy_helper

    nb = (K + block - 1) // block
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(0, 255, size=(N, nb, block // 2), dtype=np.uint8), "B"),
             numpy_helper.from_array((rng.random(N * nb) * 0.01).astype(np.float32), "S"),
             numpy_helper.from_array(rng.integers(0, 255, size=(N * ((nb + 1) // 2),), dtype=np.uint8), "Z")]
    node = helper.make_node("MatMulNBits", ["A", "B", "S", "Z"], ["Y"], domain="com.microsoft", K=K, N=N, bits=4,
                            block_size=block, accuracy_level=accuracy)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                               helper.make_opsetid("com.microsoft", 1)]).SerializeToString()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, nargs="+", default=[32, 64, 128])
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--accuracy-level", type=int, default=4)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    print(f"onnxruntime {ort.__version__}, {args.threads} threads, accuracy level {args.accuracy_level}; ms per call")
    print("| block | " + " | ".join(f"{n} M={w}" for n, _, _ in SHAPES for w in args.widths)
          + " | one 1.5B token, M=1 / M=2 (28 layers + lm_head) | rows agree across widths |")
    print("|---" * (2 + len(SHAPES) * len(args.widths) + 1) + "|")
    for block in args.blocks:
        cells, per = [], {}
        agree = []
        for name, K, N in SHAPES:
            s = ort.InferenceSession(graph(K, N, block, args.accuracy_level), so)
            A = np.random.default_rng(1).standard_normal((9, K)).astype(np.float32)
            for w in sorted(set(args.widths) | {1, 2}):
                x = A[:w]
                for _ in range(3):
                    s.run(None, {"A": x})
                reps = args.reps if N < 100_000 else max(4, args.reps // 4)
                t = time.perf_counter()
                for _ in range(reps):
                    s.run(None, {"A": x})
                per[(name, w)] = (time.perf_counter() - t) / reps * 1e3
                if w in args.widths:
                    cells.append(f"{per[(name, w)]:.3f}")
            if name == "gate_proj/up_proj":  # which widths compute row 2 (the third) as a 4-token call does
                rows = {w: s.run(None, {"A": A[:w]})[0] for w in range(1, 9)}
                agree = [w for w in range(3, 9) if np.array_equal(rows[w][2], rows[8][2])]
        token = {w: 28 * (per[("qkv_proj", w)] + per[("o_proj", w)] + 2 * per[("gate_proj/up_proj", w)]
                          + per[("down_proj", w)]) + per[("lm_head", w)] for w in (1, 2)}
        print(f"| {block} | " + " | ".join(cells) + f" | {token[1]:.1f} / {token[2]:.1f} | "
              f"row 2 as in an 8-token call at widths {agree} |")


if __name__ == "__main__":
    main()
