"""A per-position argmax output for GPU targets (cuda layout).

Greedy verification needs only the target's top token at each position, yet reading the logits
means copying ``tokens x vocab`` values from the device at every call: for Qwen's 151,936-token
vocabulary, 300 KB of float16 a token (then converted to float32 on the host). On an H200 that copy
and conversion made a call of 8 tokens cost twice a one-token call (README, GPU). The graph gets one
more output, ``argmax`` (int64 ``[batch, seq]``): the float16 logits cast to float32 and reduced with
ArgMax (first index among equal values, like numpy) on the device. The logits stay an output, for
sampling and for the width probe; a greedy GPU run binds them to device memory and reads only the
indices (``OnnxLM.forward_argmax``).
"""
from __future__ import annotations

from pathlib import Path

from edgespec.errors import ExportError

ARGMAX_NAME = "argmax"


def add_argmax_output(model_file: Path, logits: str, name: str = ARGMAX_NAME) -> str:
    """Add ``name`` = ArgMax(Cast<float32>(``logits``), axis=-1, keepdims=0) to the graph file
    ``model_file`` in place (its external data untouched); returns ``name``."""
    import onnx
    from onnx import TensorProto, helper

    m = onnx.load(str(model_file), load_external_data=False)
    g = m.graph
    outs = {o.name: o for o in g.output}
    if logits not in outs:
        raise ExportError(f"{model_file.name} has no output {logits!r} to take the argmax of")
    if name in outs:
        return name
    src = outs[logits]
    dims = src.type.tensor_type.shape.dim
    shape = [d.dim_param or d.dim_value or None for d in dims[:-1]]
    if src.type.tensor_type.elem_type != TensorProto.FLOAT:
        g.node.append(helper.make_node("Cast", [logits], [f"{name}/logits_f32"], to=TensorProto.FLOAT,
                                       name=f"/edgespec/{name}/Cast"))
        reduced = f"{name}/logits_f32"
    else:
        reduced = logits
    g.node.append(helper.make_node("ArgMax", [reduced], [name], axis=-1, keepdims=0,
                                   name=f"/edgespec/{name}/ArgMax"))
    g.output.append(helper.make_tensor_value_info(name, TensorProto.INT64, shape))
    onnx.save(m, str(model_file))
    return name
