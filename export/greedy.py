"""A per-position argmax output for GPU targets (cuda layout).

Greedy verification needs only the target's top token at each position, yet reading the logits
means copying ``tokens x vocab`` values from the device at every call: for Qwen's 151,936-token
vocabulary, 300 KB of float16 a token (then converted to float32 on the host). On an H200 that copy
and conversion made a call of 8 tokens cost twice a one-token call (docs/gpu.md). The graph gets one
more output, ``argmax`` (int64 ``[batch, min(seq, 32)]``): the float16 logits of a call's first 32
positions cast to float32 and reduced with ArgMax (first index among equal values, like numpy) on
the device. The logits stay an output, for
sampling and for the width probe; a greedy GPU run binds them to device memory and reads only the
indices (``OnnxLM.forward_argmax``).
"""
from __future__ import annotations

from pathlib import Path

from edgespec.errors import ExportError
from edgespec.onnx_lm import ARGMAX_ROWS

ARGMAX_NAME = "argmax"
# positions the argmax covers (edgespec.onnx_lm.ARGMAX_ROWS): the first this many of a call, as many
# as the runtime reads it for (greedy verify and decode calls; it reads the logits of longer ones).
# Without the bound a 512-token prefill chunk cast 512 x 151,936 logits to float32 on the device:
# +490 MiB of GPU memory measured on the H200


def add_argmax_output(model_file: Path, logits: str, name: str = ARGMAX_NAME, rows: int = ARGMAX_ROWS) -> str:
    """Add ``name`` = ArgMax(Cast<float32>(``logits``[:, :rows]), axis=-1, keepdims=0) to the graph
    file ``model_file`` in place (its external data untouched); returns ``name``."""
    import onnx
    from onnx import TensorProto, helper

    m = onnx.load(str(model_file), load_external_data=False)
    g = m.graph
    outs = {o.name: o for o in g.output}
    if logits not in outs:
        raise ExportError(f"{model_file.name} has no output {logits!r} to take the argmax of")
    if name in outs:
        raise ExportError(f"{model_file.name} already has an output {name!r}")
    src = outs[logits]
    dims = src.type.tensor_type.shape.dim
    batch = (dims[0].dim_param or dims[0].dim_value or None) if len(dims) == 3 else None
    shape = [batch, f"min(sequence_length, {rows})"]
    consts = {"starts": 0, "ends": rows, "axes": 1}
    for k, v in consts.items():
        g.initializer.append(helper.make_tensor(f"{name}/{k}", TensorProto.INT64, [1], [v]))
    g.node.append(helper.make_node("Slice", [logits] + [f"{name}/{k}" for k in consts], [f"{name}/rows"],
                                   name=f"/edgespec/{name}/Slice"))
    reduced = f"{name}/rows"
    if src.type.tensor_type.elem_type != TensorProto.FLOAT:
        g.node.append(helper.make_node("Cast", [reduced], [f"{name}/rows_f32"], to=TensorProto.FLOAT,
                                       name=f"/edgespec/{name}/Cast"))
        reduced = f"{name}/rows_f32"
    g.node.append(helper.make_node("ArgMax", [reduced], [name], axis=-1, keepdims=0,
                                   name=f"/edgespec/{name}/ArgMax"))
    g.output.append(helper.make_tensor_value_info(name, TensorProto.INT64, shape))
    onnx.save(m, str(model_file))
    return name
