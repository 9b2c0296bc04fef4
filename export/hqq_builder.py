"""onnxruntime-genai's model builder with onnxruntime's HQQ quantizer (``--quant-algo hqq``).

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

import runpy

from onnx import helper
from onnxruntime.quantization import matmul_nbits_quantizer as mnq


class HQQMatMulNBitsQuantizer(mnq.MatMulNBitsQuantizer):
    """``MatMulNBitsQuantizer`` whose algorithm is HQQ at the caller's bits and block size."""

    def __init__(self, model, bits=4, block_size=128, *args, algo_config=None, op_types_to_quantize=None,
                 accuracy_level=None, **kw):
        # (the builder passes its rtn config, or none for its default: both are replaced)
        if algo_config is None or algo_config.algorithm != "HQQ":
            if tuple(op_types_to_quantize or ("MatMul",)) != ("MatMul",):
                raise SystemExit("HQQ quantizes MatMul weights only (onnxruntime's GatherBlockQuantized takes no "
                                 "float zero points): no --quantize-embeddings with --quant-algo hqq")
            algo_config = mnq.HQQWeightOnlyQuantConfig(block_size=block_size, bits=bits,
                                                       op_types_to_quantize=("MatMul",))
        super().__init__(model, bits, block_size, *args, algo_config=algo_config,
                         op_types_to_quantize=op_types_to_quantize, accuracy_level=accuracy_level, **kw)
        self._accuracy_level = accuracy_level

    def process(self):
        super().process()
        if self._accuracy_level is None:
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
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
