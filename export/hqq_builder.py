"""onnxruntime-genai's model builder with onnxruntime's HQQ quantizer (``--quant-algo hqq``), or with llama.cpp's
Q4_K blocks fitted to each weight (``--quant-algo q4_k``, written through the same node quantizer).

Run as ``python -m edgespec_export.hqq_builder`` with the builder's own arguments. The builder writes its
float graph and quantizes its MatMuls through onnxruntime's ``MatMulNBitsQuantizer``; its ``algo_config``
takes rtn and k_quant only, so this module hands that quantizer onnxruntime's ``HQQWeightOnlyQuantConfig``
(Half-Quadratic Quantization: each block's zero point fitted to the weights under an l_0.7 error, kept as a
float) with the builder's bits and block size, then runs the builder unchanged. onnxruntime's HQQ quantizer
stamps no ``accuracy_level`` on its nodes: the builder's is added, so the graph asks for the int8 path as
the other algorithms' do (edgespec's exact kernels read the float zero points as minimums at that speed;
onnxruntime's own CPU kernel computes them in float, slowly).
"""
from __future__ import annotations

import os
import runpy
import sys

from onnx import helper
from onnxruntime.quantization import matmul_nbits_quantizer as mnq


# weights HQQ fits at once, in rows of whole blocks: its solver keeps ~8 float copies of what it is given, which for
# Qwen2.5-1.5B's lm_head (151,936 x 1,536) beside the builder's float model ran a 23 GiB machine out of memory
CHUNK_ELEMENTS = 1 << 22


class ChunkedHQQ(mnq.HQQWeightOnlyQuantizer):
    """onnxruntime's HQQ on a weight's rows (output channels) a chunk at a time. Its solver updates each block's
    zero point on its own; what chunks change is how many iterations each gets: it stops once the mean error
    over what it was given grows, now judged per chunk (keeping the zero points of the step after)."""

    def quantize_internal(self, tensor, bits=4, channel_wise=True, group_size=64, optimize=True, round_zero=True,
                          axis=1):
        import torch

        rows = max(1, CHUNK_ELEMENTS // max(1, int(tensor.shape[1])))
        if axis != 1 or tensor.shape[0] <= rows:
            return super().quantize_internal(tensor, bits, channel_wise, group_size, optimize, round_zero, axis)
        parts = [super(ChunkedHQQ, self).quantize_internal(tensor[i:i + rows], bits, channel_wise, group_size,
                                                           optimize, round_zero, axis)
                 for i in range(0, int(tensor.shape[0]), rows)]
        return tuple(torch.cat([p[j] for p in parts]) for j in range(3))


class Q4KQuantizer(mnq.HQQWeightOnlyQuantizer):
    """``--quant-algo q4_k``: each weight quantized as llama.cpp's Q4_K quantizer quantizes it (export/gguf_blocks.py,
    ``k4_blocks``: blocks of 32 with a fitted scale and minimum, both 6-bit multiples of a float16 per 256
    weights; where K is no multiple of 256, ``min_max_4bit``'s blocks), written through HQQ's MatMulNBits node
    with the gguf path's float zero points (``float_zero_points``)."""

    def quantize_internal(self, tensor, bits=4, channel_wise=True, group_size=64, optimize=True, round_zero=True,
                          axis=1):
        import numpy as np
        import torch

        from .gguf_blocks import float_zero_points, four_bit_blocks

        w = tensor.detach().float().cpu().numpy()
        N, K = w.shape
        if bits != 4 or group_size != 32 or axis != 1 or K % 32:
            raise SystemExit(f"--quant-algo q4_k writes 4-bit blocks of 32 along K: got bits {bits}, block "
                             f"{group_size}, K {K}")
        q, scale, zero = float_zero_points(four_bit_blocks(w))
        return (torch.from_numpy(q.astype(np.int32)), torch.from_numpy(scale).to(tensor.dtype),
                torch.from_numpy(zero).to(tensor.dtype))


# the node quantizer per --quant-algo (run_builder sets EDGESPEC_QUANT_ALGO for the builder's process)
NODE_QUANTIZERS = {"hqq": ChunkedHQQ, "q4_k": Q4KQuantizer}


class HQQMatMulNBitsQuantizer(mnq.MatMulNBitsQuantizer):
    """``MatMulNBitsQuantizer`` whose algorithm is HQQ at the caller's bits and block size (its node quantizer
    ``NODE_QUANTIZERS``' for --quant-algo: HQQ's, chunked, or q4_k's)."""

    def __init__(self, model, bits=4, block_size=128, *args, algo_config=None, op_types_to_quantize=None,
                 accuracy_level=None, **kw):
        # (the builder passes its rtn config, or none for its default: both are replaced)
        if algo_config is None or algo_config.algorithm != "HQQ":
            if tuple(op_types_to_quantize or ("MatMul",)) != ("MatMul",):
                raise SystemExit("HQQ and q4_k quantize MatMul weights only (onnxruntime's GatherBlockQuantized takes "
                                 "no float zero points): no --quantize-embeddings with them")
            algo_config = mnq.HQQWeightOnlyQuantConfig(block_size=block_size, bits=bits,
                                                       op_types_to_quantize=("MatMul",))
        super().__init__(model, bits, block_size, *args, algo_config=algo_config,
                         op_types_to_quantize=op_types_to_quantize, accuracy_level=accuracy_level, **kw)
        self._accuracy_level = accuracy_level
        if self.algo_config.algorithm == "HQQ":
            self.node_quantizer = NODE_QUANTIZERS[os.environ.get("EDGESPEC_QUANT_ALGO", "hqq")](self.algo_config)

    def process(self):
        super().process()
        if not self._accuracy_level:  # (None or 0: the attribute left out, as onnxruntime's own quantizer does)
            return
        for g in _graphs(self.model.model.graph):
            for n in g.node:
                if n.op_type == "MatMulNBits" and not any(a.name == "accuracy_level" for a in n.attribute):
                    n.attribute.append(helper.make_attribute("accuracy_level", int(self._accuracy_level)))


def _graphs(g):
    yield g
    for n in g.node:
        for a in n.attribute:
            if a.g is not None and a.HasField("g"):
                yield from _graphs(a.g)
            for sub in a.graphs:
                yield from _graphs(sub)


def main() -> None:
    # before the builder imports it (its modules are imported as top-level ``builders.*``, from its own folder)
    mnq.MatMulNBitsQuantizer = HQQMatMulNBitsQuantizer
    base = sys.modules.get("builders.base")
    if base is not None:  # imported already (export/builder_zygote.py's fork of a process that imported it)
        base.MatMulNBitsQuantizer = HQQMatMulNBitsQuantizer
    from .builder_shim import patch

    patch()  # (Gemma 3's config as the builder reads it)
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
