#!/usr/bin/env python3
"""Weight by weight: round-to-nearest against onnxruntime's HQQ on a GGUF's tensors (dequantized, as the export
reads them), the relative RMS error of each at each block size. A measurement, not a test.

    .venv/bin/python scripts/hqq_weight_error.py $M/qwen2.5-coder-0.5b-instruct.gguf \\
        blk.3.attn_q.weight blk.3.ffn_down.weight --blocks 32,128 [--rows 2048]

RTN here is the export's asymmetric RTN (a block's range, a 4-bit zero point); HQQ is
``HQQWeightOnlyQuantizer.quantize_internal``, the function ``--quant-algo hqq`` runs (export/hqq_builder.py).
Only the first ``--rows`` rows (output channels) of each tensor are quantized, to keep it quick.
"""
from __future__ import annotations

import argparse

import numpy as np


def rtn(w: np.ndarray, block: int) -> np.ndarray:
    b = w.reshape(w.shape[0], -1, block)
    lo, hi = np.minimum(b.min(-1, keepdims=True), 0), np.maximum(b.max(-1, keepdims=True), 0)
    s = (hi - lo) / 15
    s[s == 0] = 1
    z = np.clip(np.round(-lo / s), 0, 15)
    return ((np.clip(np.round(b / s + z), 0, 15) - z) * s).reshape(w.shape)


def hqq(w: np.ndarray, block: int) -> np.ndarray:
    import torch
    from onnxruntime.quantization import matmul_nbits_quantizer as mnq

    cfg = mnq.HQQWeightOnlyQuantConfig(block_size=block)
    q, s, z = mnq.HQQWeightOnlyQuantizer(cfg).quantize_internal(torch.from_numpy(w), group_size=block)
    return ((q.float() - z.repeat_interleave(block, 1)) * s.repeat_interleave(block, 1)).numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf")
    ap.add_argument("tensors", nargs="+")
    ap.add_argument("--blocks", default="32,128")
    ap.add_argument("--rows", type=int, default=2048)
    a = ap.parse_args()
    from gguf import GGUFReader
    from gguf.quants import dequantize

    tensors = {t.name: t for t in GGUFReader(a.gguf).tensors}
    print("| tensor | stored as | block | RTN rel. RMS | HQQ rel. RMS | HQQ / RTN |\n|---|---|---|---|---|---|")
    for name in a.tensors:
        t = tensors[name]
        K, N = int(t.shape[0]), int(t.shape[1])
        w = dequantize(np.asarray(t.data), t.tensor_type).reshape(N, K).astype(np.float32)[:a.rows]
        norm = float(np.sqrt((w ** 2).mean()))
        for block in (int(b) for b in a.blocks.split(",")):
            e_r, e_h = (float(np.sqrt(((f(w, block) - w) ** 2).mean())) / norm for f in (rtn, hqq))
            print(f"| {name} | {t.tensor_type.name} | {block} | {e_r:.4f} | {e_h:.4f} | {e_h / e_r:.3f} |")


if __name__ == "__main__":
    main()
