"""Models with convolution layers (LFM2's ``conv`` layers, session 61): what the runtime needs to roll their state back.

onnxruntime-genai's model builder gives each conv layer a state input and output (``past.N.conv`` /
``present.N.conv``, ``[batch, channels, kernel - 1]``: the kernel's last inputs), written by onnxruntime's
``CausalConvWithState`` after the whole call. A rejected draft needs the state after the accepted tokens only, which
the op does not give on the CPU (its ``state_window``, every position's state, is CUDA's only: onnxruntime 1.32). But
that state is the last ``kernel - 1`` columns of the state before the call followed by the convolution's input at the
call's positions up to there: its inputs, not any arithmetic (``scripts/probe_conv_state.py`` checks it bitwise). So
each conv layer's input becomes a graph output, ``conv_input.N`` (``[batch, channels, positions]``), from which the
runtime (``edgespec.kv.ConvStates``) sets the state of any accepted prefix.
"""
from __future__ import annotations

import re
from pathlib import Path

from edgespec.errors import ExportError

# model types whose layers may be convolutions (transformers' ``layer_types`` "conv") beside attention; their conv
# layers are the builder's ``CausalConvWithState``
CONV_MODEL_TYPES = frozenset({"lfm2"})
CONV_LAYER = "conv"
INPUT_NAME = "conv_input.%d"
OP = "CausalConvWithState"


def expose_conv_inputs(graph_file: Path, past_names: str) -> tuple[tuple[int, int, int], ...]:
    """Make each ``CausalConvWithState`` node's input a graph output ``conv_input.N`` (in place; the graph's data
    file untouched). Returns ``(layer, channels, state length)`` per conv layer, from the state inputs named
    ``past_names`` (with %d for the layer)."""
    import onnx
    from onnx import helper

    model = onnx.load(str(graph_file), load_external_data=False)
    g = model.graph
    head, _, tail = past_names.partition("%d")
    pattern = re.compile(re.escape(head) + r"(\d+)" + re.escape(tail))
    layer_of = {i.name: (int(m.group(1)), i) for i in g.input if (m := pattern.fullmatch(i.name))}
    out = []
    have = {o.name for o in g.output}
    for n in list(g.node):
        if n.op_type != OP:
            continue
        if len(n.input) < 4 or n.input[3] not in layer_of:
            raise ExportError(f"a {OP} node ({n.name}) reads no conv state input of the graph's: not the builder's "
                              "conv layer")
        for a in n.attribute:
            if a.name == "state_window" and helper.get_attribute_value(a):
                raise ExportError(f"{n.name} keeps a state window (a build option edgespec does not use)")
        layer, state = layer_of[n.input[3]]
        dims = [d.dim_value if d.HasField("dim_value") else None for d in state.type.tensor_type.shape.dim]
        if len(dims) != 3 or not dims[1] or not dims[2]:
            raise ExportError(f"the conv state {state.name} has no static [batch, channels, length] shape: {dims}")
        name = INPUT_NAME % layer
        if name not in have:
            g.node.append(helper.make_node("Identity", [n.input[0]], [name], name=f"/model/layers.{layer}/conv/input"))
            g.output.append(helper.make_tensor_value_info(name, state.type.tensor_type.elem_type,
                                                          ["batch_size", dims[1], "sequence_length"]))
        out.append((layer, int(dims[1]), int(dims[2])))
    if len(out) != len(layer_of):
        raise ExportError(f"the graph has {len(layer_of)} conv state inputs and {len(out)} {OP} nodes reading them")
    onnx.save(model, str(graph_file))
    return tuple(sorted(out))
