"""The graph's weights against torch's, one matrix at a time (part of an export's validation).

The logits check of a quantized graph is loose (top-1 agreement >= 0.6 with torch): two neighbouring layers
swapped in SmolLM2 INT4 passed it (session 49, a review), as would a projection given another layer's or another
projection's weights by a builder or a rewrite. Here each weight matrix the graph multiplies by (the builder's
``MatMulNBits`` at 4 or 8 bits, FP8's ``DequantizeLinear`` -> ``MatMul``, a float ``MatMul``) and its embedding
table (``Gather``, ``GatherBlockQuantized``) are dequantized and compared with the torch parameter the builder's node
name says it holds: the relative difference ``||graph - torch|| / ||torch||`` is the rounding's (~0.1 at 4 bits) where
the weights are right, and ~1.4 for another matrix of the same shape.

Which torch parameter a node holds follows the builder's names (``/model/layers.{i}/attn/qkv_proj/MatMul``,
``/model/layers.{i}/mlp/down_proj/MatMul``, ``/lm_head/MatMul``, ``/model/embed_tokens/Gather``) and the module names
of the families it builds (``q_proj`` ..., Phi-3's ``qkv_proj`` and ``gate_up_proj``, Phi-2's ``dense``, ``fc1``,
``fc2``). A node this does not map is counted as not checked (a family with other names), never failed.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# The worst relative difference allowed, by how the graph stores the weights. 4-bit blocks round each weight by up to
# half a step (measured: SmolLM2 INT4 from its Q4_1 GGUF at most 0.11, the Qwen 1.5B's block-128 RTN at most 0.17;
# the bound leaves room for models with more outliers); another matrix of the same shape is ~1.4 (two independent
# matrices of equal norm), the same matrix scaled by 2 is 1.0.
BOUND = {"4bit": 0.5, "8bit": 0.05, "fp8": 0.12, "float16": 0.01, "bfloat16": 0.02, "float32": 1e-4}

_ATTN = {"q_proj": (("q_proj",), ("query",)), "k_proj": (("k_proj",), ("key",)), "v_proj": (("v_proj",), ("value",)),
         "qkv_proj": (("qkv_proj",), ("q_proj", "k_proj", "v_proj"), ("query_key_value",), ("Wqkv",)),
         "o_proj": (("o_proj",), ("dense",), ("out_proj",))}
_MLP = {"gate_proj": (("gate_proj",), ("gate_up_proj", 0)), "up_proj": (("up_proj",), ("gate_up_proj", 1)),
        "gate_up_proj": (("gate_up_proj",), ("gate_proj", "up_proj")), "down_proj": (("down_proj",),),
        "fc1": (("fc1",),), "fc2": (("fc2",),)}
_NODE = re.compile(r"/model/layers\.(\d+)/(attn|mlp)/(\w+)/(?:MatMul|DequantizeLinear)")
_ROWS = 8192  # rows dequantized at a time (Qwen's 151,936 x 1,536 head in float32 would be 0.9 GB at once)


@dataclass
class WeightCheck:
    """What ``check_weights`` found: matrices compared, those it could not map, the worst relative difference
    and the ones past their bound (``(node, torch parameter, difference, bound)``)."""

    checked: int = 0
    unmapped: list[str] = field(default_factory=list)
    worst: float = 0.0
    worst_name: str = ""
    failed: list[tuple[str, str, float, float]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failed


def _layers(model, num_layers: int):
    """torch's list of decoder layers: the ModuleList of ``num_layers`` modules whose name ends in ``layers``
    (``model.layers``; else ``h``, ``blocks``), or None."""
    import torch

    best = None
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == num_layers:
            last = name.rsplit(".", 1)[-1]
            if last == "layers":
                return mod
            if last in ("h", "blocks", "block") and best is None:
                best = mod
    return best


def _find(layer, part: str, name: str):
    """The 2-D weight of ``layer``'s submodule named ``name`` under its attention (``part`` attn) or its MLP (mlp), or
    None: one module of that name, preferably under a child whose name says which part it is."""
    hits = []
    for path, mod in layer.named_modules():
        if path.rsplit(".", 1)[-1] == name and getattr(mod, "weight", None) is not None and mod.weight.dim() == 2:
            hits.append((path, mod))
    if len(hits) > 1:
        keys = ("attn", "attention") if part == "attn" else ("mlp", "feed_forward", "ffn")
        hits = [h for h in hits if any(k in h[0].split(".")[0] for k in keys)]
    return (hits[0][0], hits[0][1].weight) if len(hits) == 1 else None


def torch_weight(model, layers, node_name: str):
    """(torch's name for it, its ``[out, in]`` float32 array) for the builder's node ``node_name``, or None."""
    if node_name.startswith("/lm_head/"):
        emb = model.get_output_embeddings()
        return ("lm_head", emb.weight.detach().float().numpy()) if emb is not None else None
    if node_name.startswith("/model/embed_tokens/"):
        emb = model.get_input_embeddings()
        return ("embed_tokens", emb.weight.detach().float().numpy()) if emb is not None else None
    m = _NODE.match(node_name)
    if not m or layers is None or int(m.group(1)) >= len(layers):
        return None
    i, part, proj = int(m.group(1)), m.group(2), m.group(3)
    layer = layers[i]
    for names in (_ATTN if part == "attn" else _MLP).get(proj, ()):
        if len(names) == 2 and isinstance(names[1], int):  # one half of a packed gate_up_proj
            hit = _find(layer, part, names[0])
            if hit is not None and hit[1].shape[0] % 2 == 0:
                half = hit[1].shape[0] // 2
                w = hit[1].detach().float().numpy()
                return (f"layers.{i}.{hit[0]}[{'first' if names[1] == 0 else 'second'} half]",
                        w[names[1] * half:(names[1] + 1) * half])
            continue
        hits = [_find(layer, part, n) for n in names]
        if all(h is not None for h in hits):
            return ("+".join(f"layers.{i}.{h[0]}" for h in hits),
                    np.concatenate([h[1].detach().float().numpy() for h in hits]) if len(hits) > 1
                    else hits[0][1].detach().float().numpy())
    return None


def _nibbles(b: np.ndarray) -> np.ndarray:
    return np.stack([b & 15, b >> 4], axis=-1).reshape(b.shape[:-1] + (b.shape[-1] * 2,))


def _blocks(q: np.ndarray, s: np.ndarray, z, bits: int, n: int, nb: int, block: int, rows: slice) -> np.ndarray:
    """Rows ``rows`` of a block-quantized matrix: integers ``q`` [N, nb, block], scales [N, nb], zero points packed
    (uint8, [N, ...]) or float ([N, nb]) or None (the middle of the range)."""
    qs = q[rows].astype(np.float32)
    if z is None:
        zp = np.float32(1 << (bits - 1))
    elif z.dtype.kind == "f":
        zp = z[rows].astype(np.float32)[..., None]
    else:
        zr = z[rows]
        zz = _nibbles(zr) if bits == 4 else zr
        zp = zz[:, :nb].astype(np.float32)[..., None]
    return ((qs - zp) * s[rows].astype(np.float32)[..., None]).reshape(qs.shape[0], nb * block)


class _Graph:
    def __init__(self, path: Path):
        from .output import load_graph

        self.base = path.parent
        self.g = load_graph(path).graph
        self.inits = {t.name: t for t in self.g.initializer}
        self.producer = {o: n for n in self.g.node for o in n.output}

    def array(self, name: str) -> np.ndarray | None:
        """An initializer as numpy; 4-bit element types (the cuda layout's ``GatherBlockQuantized`` table: UINT4,
        INT4, two to a byte, the low nibble first) as int16 values, the shape their dims say."""
        from onnx import TensorProto, numpy_helper

        from .head import _ext, _read

        t = self.inits.get(name)
        if t is None:
            return None
        if t.data_type not in (TensorProto.UINT4, TensorProto.INT4):
            return _read(t, self.base)
        count = int(np.prod(t.dims)) if len(t.dims) else 1
        info = _ext(t)
        if info is None:
            return numpy_helper.to_array(t).astype(np.int16)
        raw = np.fromfile(self.base / info["location"], dtype=np.uint8, count=(count + 1) // 2,
                          offset=int(info.get("offset", 0)))
        v = np.stack([raw & 15, raw >> 4], axis=-1).reshape(-1)[:count].astype(np.int16)
        if t.data_type == TensorProto.INT4:
            v = np.where(v > 7, v - 16, v)
        return v.reshape(tuple(t.dims))


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def graph_weights(gr: _Graph, node):
    """(kind for ``BOUND``, N, a function of a row slice giving those rows of the node's ``[N, K]`` weights as
    float32) for the node's weight matrix, or None where its weights are no initializer this reads."""
    a = _attrs(node)
    ins = list(node.input) + [""] * 4
    if node.op_type == "MatMulNBits":
        if a.get("bits", 4) not in (4, 8) or (len(node.input) > 4 and node.input[4]):  # (g_idx: act-order)
            return None
        N, K, block, bits = int(a["N"]), int(a["K"]), int(a["block_size"]), int(a.get("bits", 4))
        b, s = gr.array(ins[1]), gr.array(ins[2])
        if b is None or s is None:
            return None
        nb = -(-K // block)
        q = _nibbles(b.reshape(N, nb, -1)) if bits == 4 else b.reshape(N, nb, block)
        s = s.reshape(N, nb)
        z = gr.array(ins[3]) if ins[3] else None
        z = None if z is None else (z.reshape(N, nb) if z.dtype.kind == "f" else z.reshape(N, -1))
        return (f"{bits}bit", N, lambda r: _blocks(q, s, z, bits, N, nb, block, r)[:, :K])
    if node.op_type == "GatherBlockQuantized":
        bits = int(a.get("bits", 4))
        if int(a.get("quantize_axis", 1)) not in (1, -1) or bits not in (4, 8):
            return None
        from onnx import TensorProto

        name = ins[0]
        src = gr.producer.get(name)
        if name not in gr.inits and src is not None and src.op_type == "Reshape":  # (a tied table: the lm_head's)
            name = src.input[0]
        data, s = gr.array(name), gr.array(ins[2])
        if data is None or s is None or s.ndim != 2:
            return None
        N, block = s.shape[0], int(a.get("block_size", 128))
        data = data.reshape(N, -1)
        z = gr.array(ins[3]) if ins[3] else None
        if gr.inits[name].data_type in (TensorProto.UINT4, TensorProto.INT4):  # one value an element
            K = data.shape[1]
            nb = -(-K // block)
            zp = (np.float32(8 if gr.inits[name].data_type == TensorProto.UINT4 else 0) if z is None
                  else z.reshape(N, nb).astype(np.float32)[..., None])
            pad = nb * block - K
            q = np.pad(data, ((0, 0), (0, pad))).reshape(N, nb, block) if pad else data.reshape(N, nb, block)

            def rows(r):
                zr = zp if np.ndim(zp) == 0 else zp[r]
                return ((q[r].astype(np.float32) - zr) * s[r].astype(np.float32)[..., None]).reshape(-1, nb * block)[:, :K]

            return ("4bit", N, rows)
        if data.dtype != np.uint8:
            return None
        K = data.shape[1] * (2 if bits == 4 else 1)
        nb = -(-K // block)
        q = _nibbles(data).reshape(N, nb, block) if bits == 4 else data.reshape(N, nb, block)
        z = None if z is None else (z.reshape(N, nb) if z.dtype.kind == "f" else z.reshape(N, -1))
        return (f"{bits}bit", N, lambda r: _blocks(q, s, z, bits, N, nb, block, r))
    if node.op_type == "Gather":
        t = gr.array(ins[0])
        if t is None or t.ndim != 2 or t.dtype.kind != "f":
            return None
        return (t.dtype.name, t.shape[0], lambda r: t[r].astype(np.float32))
    if node.op_type == "MatMul":
        w = gr.array(ins[1])
        if w is not None and w.ndim == 2 and w.dtype.kind == "f":  # [K, N]
            return (w.dtype.name, w.shape[1], lambda r: w[:, r].T.astype(np.float32))
        dq = gr.producer.get(ins[1])
        if dq is None or dq.op_type != "DequantizeLinear":
            return None
        return _dequantize_linear(gr, dq)
    return None


def _dequantize_linear(gr: _Graph, node):
    """FP8's ``DequantizeLinear`` of a ``[K, N]`` float8 weight: per output channel (axis 1) or blocked (axis 0)."""
    import ml_dtypes

    a = _attrs(node)
    t, s = gr.inits.get(node.input[0]), gr.array(node.input[1])
    if t is None or s is None:
        return None
    from onnx import TensorProto

    if t.data_type != TensorProto.FLOAT8E4M3FN:
        return None
    raw = gr.array(node.input[0])
    if raw is None or raw.ndim != 2:
        return None
    w = raw.view(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)  # [K, N]
    s = s.astype(np.float32)
    if s.ndim == 1:  # per output channel
        w = w * s[None, :]
    else:  # [ceil(K / block), N]
        block = int(a.get("block_size", 0)) or -(-w.shape[0] // s.shape[0])
        w = w * np.repeat(s, block, axis=0)[: w.shape[0]]
    return ("fp8", w.shape[1], lambda r: w[:, r].T)


def _weight_nodes(gr: _Graph):
    """The graph's nodes that hold a weight matrix: (name to map it by, node)."""
    for n in gr.g.node:
        if n.op_type in ("MatMulNBits", "MatMul", "Gather", "GatherBlockQuantized"):
            if n.op_type == "Gather" and not (n.input and n.input[0] in gr.inits):
                continue
            if n.op_type == "GatherBlockQuantized" and not n.name.startswith("/model/embed_tokens/"):
                continue
            if n.op_type == "MatMul" and not (n.input[1] in gr.inits or getattr(gr.producer.get(n.input[1]), "op_type",
                                                                                  "") == "DequantizeLinear"):
                continue
            if n.op_type == "Gather" and len(gr.inits[n.input[0]].dims) != 2:
                continue
            yield n.name, n


def relative_difference(get, n_rows: int, ref: np.ndarray) -> float:
    """``||graph - ref|| / ||ref||`` over all rows, ``_ROWS`` at a time."""
    num = den = 0.0
    for r0 in range(0, n_rows, _ROWS):
        r = slice(r0, min(n_rows, r0 + _ROWS))
        d = get(r) - ref[r]
        num += float(np.einsum("ij,ij->", d, d, dtype=np.float64))
        den += float(np.einsum("ij,ij->", ref[r], ref[r], dtype=np.float64))
    return float(np.sqrt(num / den)) if den > 0 else (0.0 if num == 0 else float("inf"))


def check_weights(model, graph_file, num_layers: int) -> WeightCheck:
    """Each weight matrix of ``graph_file`` against the torch ``model``'s (see the module's text)."""
    gr = _Graph(Path(graph_file))
    layers = _layers(model, num_layers)
    out = WeightCheck()
    for name, node in _weight_nodes(gr):
        got = graph_weights(gr, node)
        ref = torch_weight(model, layers, name)
        if got is None or ref is None:
            if node.op_type != "Gather" or name.startswith("/model/embed_tokens/"):
                out.unmapped.append(name)
            continue
        kind, n_rows, get = got
        tname, w = ref
        if w.shape[0] < n_rows or (n_rows and get(slice(0, 1)).shape[1] != w.shape[1]):
            out.failed.append((name, f"{tname} {tuple(w.shape)}", float("inf"), BOUND.get(kind, 0.3)))
            continue
        # (a graph's vocabulary may stop short of torch's padded one: the rows it has)
        err = relative_difference(get, n_rows, w[:n_rows])
        out.checked += 1
        if not err <= out.worst or not out.worst_name:
            out.worst, out.worst_name = err, name
        bound = BOUND.get(kind, 0.3)
        if not err <= bound:
            out.failed.append((name, tname, err, bound))
    return out
