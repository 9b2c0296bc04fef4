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
BOUND = {"4bit": 0.5, "8bit": 0.05, "fp8": 0.12, "float16": 0.01, "float32": 1e-4}

_ATTN = {"q_proj": (("q_proj",), ("query",)), "k_proj": (("k_proj",), ("key",)), "v_proj": (("v_proj",), ("value",)),
         # (Gemma 4's global layers with attention_k_eq_v: no v_proj, the key's projection gives the values too)
         "qkv_proj": (("qkv_proj",), ("q_proj", "k_proj", "v_proj"), ("query_key_value",), ("Wqkv",),
                      ("q_proj", "k_proj", "k_proj")),
         "o_proj": (("o_proj",), ("dense",), ("out_proj",))}
_MLP = {"gate_proj": (("gate_proj",), ("gate_up_proj", 0), ("input_linear", 0), ("w1",)),
        "up_proj": (("up_proj",), ("gate_up_proj", 1), ("input_linear", 1), ("w3",)),
        "gate_up_proj": (("gate_up_proj",), ("gate_proj", "up_proj"), ("input_linear",)),
        # (Granite 4's shared MLP: input_linear, output_linear; LFM2's feed_forward: w1, w3, w2)
        "down_proj": (("down_proj",), ("output_linear",), ("w2",)),
        "fc1": (("fc1",),), "fc2": (("fc2",),)}
_CONV = {"in_proj": (("in_proj",),), "out_proj": (("out_proj",),)}  # (LFM2's convolution layers: export/conv.py)
_NODE = re.compile(r"/model/layers\.(\d+)/(attn|mlp|conv)/(\w+)/(?:MatMul|DequantizeLinear)")
_PER_LAYER = re.compile(r"/model/(?:layers\.(\d+)/per_layer|per_layer_inputs)/(gate|projection|model_projection)/"
                        r"(?:MatMul|DequantizeLinear)")
_PER_LAYER_NAMES = {"gate": "per_layer_input_gate", "projection": "per_layer_projection",
                    "model_projection": "per_layer_model_projection"}
REWRITE_BOUND = 1e-5  # exact-kernels' tiles against the graph they were packed from (``check_rewrite``)
_ROWS = 2048  # rows dequantized at a time (Qwen's 151,936 x 1,536 head in float32 would be 0.9 GB at once)


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
        keys = {"attn": ("attn", "attention"), "conv": ("conv",)}.get(part, ("mlp", "feed_forward", "ffn"))
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
    def one_module(name):  # (the model's one module of that name: Gemma 4's text model's)
        hits = [(p, mod) for p, mod in model.named_modules() if p.rsplit(".", 1)[-1] == name]
        return (hits[0][0], hits[0][1].weight.detach().float().numpy()) if len(hits) == 1 else None

    if node_name.startswith("/model/per_layer_inputs/embed/"):  # (Gemma 4's per-layer table)
        return one_module("embed_tokens_per_layer")
    m = _PER_LAYER.match(node_name)  # (Gemma 4's per-layer embeddings: export/builder_gemma4.py)
    if m:
        name = _PER_LAYER_NAMES[m.group(2)]
        if m.group(1) is None:
            return one_module(name)
        i = int(m.group(1))
        mod = getattr(layers[i], name, None) if layers is not None and i < len(layers) else None
        return (f"layers.{i}.{name}", mod.weight.detach().float().numpy()) if mod is not None else None
    m = _NODE.match(node_name)
    if not m or layers is None or int(m.group(1)) >= len(layers):
        return None
    i, part, proj = int(m.group(1)), m.group(2), m.group(3)
    layer = layers[i]
    for names in {"attn": _ATTN, "conv": _CONV}.get(part, _MLP).get(proj, ()):
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
    """Packed 4-bit values (the low nibble first) along the last axis, unpacked."""
    return np.stack([b & 15, b >> 4], axis=-1).reshape(b.shape[:-1] + (b.shape[-1] * 2,))


def _block_rows(q_rows, s: np.ndarray, z, bits: int, nb: int, block: int, K: int):
    """A function of a row slice giving those rows of a block-quantized ``[N, K]`` matrix, unpacked only then (a
    Qwen head's 151,936 x 1,536 weights as floats are 0.9 GB): ``q_rows(r)`` the rows' integers ``[n, nb, block]``,
    ``s`` the scales ``[N, nb]``, ``z`` zero points: packed uint8 ``[N, ...]``, float ``[N, nb]``, one value an element
    (int16 ``[N, nb]``) or None (the middle of the range); ``(q - z) * s``, the columns past K dropped."""
    def rows(r):
        qs = q_rows(r).astype(np.float32)
        if z is None:
            zp = np.float32(1 << (bits - 1))
        elif z.dtype.kind == "f" or z.dtype == np.int16:
            zp = z[r].astype(np.float32)[..., None]
        else:
            zz = _nibbles(z[r]) if bits == 4 else z[r]
            zp = zz[:, :nb].astype(np.float32)[..., None]
        return ((qs - zp) * s[r].astype(np.float32)[..., None]).reshape(qs.shape[0], nb * block)[:, :K]

    return rows


def _zero_points(z, N: int, nb: int):
    """MatMulNBits' or GatherBlockQuantized's zero points as ``_block_rows`` takes them: float ``[N, nb]``, packed
    uint8 ``[N, ...]``, or None."""
    return None if z is None else (z.reshape(N, nb) if z.dtype.kind == "f" else z.reshape(N, -1))


class _Graph:
    def __init__(self, path: Path):
        from .output import load_graph

        self.base = path.parent
        self.g = load_graph(path).graph
        self.inits = {t.name: t for t in self.g.initializer}
        self.producer = {o: n for n in self.g.node for o in n.output}

    def array(self, name: str) -> np.ndarray | None:
        """An initializer as numpy (a 4-bit element type: ``four_bit`` reads it)."""
        from .head import _read

        t = self.inits.get(name)
        return None if t is None else _read(t, self.base)

    def four_bit(self, name: str):
        """A UINT4 or INT4 initializer (the cuda layout's ``GatherBlockQuantized`` table and zero points: two values
        to a byte, the low nibble first) as (its packed bytes, a function of a row slice giving those rows' values
        as int16), or None for another type."""
        from onnx import TensorProto, numpy_helper

        from .head import _ext

        t = self.inits.get(name)
        if t is None or t.data_type not in (TensorProto.UINT4, TensorProto.INT4) or len(t.dims) != 2:
            return None
        rows_n, width = int(t.dims[0]), int(t.dims[1])
        info = _ext(t)
        if info is None:
            v = numpy_helper.to_array(t).astype(np.int16).reshape(-1)
            raw = None
        else:
            raw = np.memmap(self.base / info["location"], dtype=np.uint8, mode="r", offset=int(info.get("offset", 0)),
                            shape=((rows_n * width + 1) // 2,))
        signed = t.data_type == TensorProto.INT4

        def rows(r):
            lo, hi = r.indices(rows_n)[:2]
            e0, e1 = lo * width, hi * width
            if raw is None:
                out = v[e0:e1]
            else:
                out = _nibbles(np.asarray(raw[e0 // 2:(e1 + 1) // 2]))[e0 % 2:e0 % 2 + e1 - e0].astype(np.int16)
                if signed:
                    out = np.where(out > 7, out - 16, out)
            return out.reshape(hi - lo, width)

        return rows


def _attrs(node) -> dict:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def graph_weights(gr: _Graph, node):
    """(kind for ``BOUND``, N, a function of a row slice giving those rows of the node's ``[N, K]`` weights as
    float32, the block size or 0) for the node's weight matrix, or None where its weights are no initializer this
    reads."""
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
        b = b.reshape(N, nb, -1)
        z = _zero_points(gr.array(ins[3]) if ins[3] else None, N, nb)
        q_rows = (lambda r: _nibbles(b[r])) if bits == 4 else (lambda r: b[r])
        return (f"{bits}bit", N, _block_rows(q_rows, s.reshape(N, nb), z, bits, nb, block, K), block)
    if node.op_type == "GatherBlockQuantized":
        bits = int(a.get("bits", 4))
        if int(a.get("quantize_axis", 1)) not in (1, -1) or bits not in (4, 8):
            return None
        name = ins[0]
        src = gr.producer.get(name)
        if name not in gr.inits and src is not None and src.op_type == "Reshape":  # (a tied table: the lm_head's)
            name = src.input[0]
        s = gr.array(ins[2])
        if name not in gr.inits or s is None or s.ndim != 2:
            return None
        N, block = s.shape[0], int(a.get("block_size", 128))
        nb = s.shape[1]
        elements = gr.four_bit(name)
        if elements is not None:  # one value an element; no zero points: 0 (onnxruntime's default for both types)
            z = gr.four_bit(ins[3]) if ins[3] else None
            z = None if z is None else z(slice(None))
            K = int(gr.inits[name].dims[1])
            pad = nb * block - K

            def q_rows(r):
                v = elements(r)
                return (np.pad(v, ((0, 0), (0, pad))) if pad else v).reshape(-1, nb, block)

            zp = np.zeros((N, nb), np.int16) if z is None else z.reshape(N, nb)
            return ("4bit", N, _block_rows(q_rows, s, zp, bits, nb, block, K), block)
        data = gr.array(name)
        if data is None or data.dtype != np.uint8:
            return None
        data = data.reshape(N, -1)
        per = block // 2 if bits == 4 else block
        K = data.shape[1] * (2 if bits == 4 else 1)  # (a tied table's padded to whole blocks: see check_weights)
        if data.shape[1] < nb * per:  # (a last block cut short)
            data = np.pad(data, ((0, 0), (0, nb * per - data.shape[1])))
        data = data.reshape(N, nb, per)
        z = _zero_points(gr.array(ins[3]) if ins[3] else None, N, nb)
        q_rows = (lambda r: _nibbles(data[r])) if bits == 4 else (lambda r: data[r])
        return (f"{bits}bit", N, _block_rows(q_rows, s, z, bits, nb, block, K), block)
    if node.op_type == "Gather":
        t = gr.array(ins[0])
        if t is None or t.ndim != 2 or t.dtype.kind != "f":
            return None
        return (t.dtype.name, t.shape[0], lambda r: t[r].astype(np.float32), 0)
    if node.op_type == "MatMul":
        w = gr.array(ins[1])
        if w is not None and w.ndim == 2 and w.dtype.kind == "f":  # [K, N]
            return (w.dtype.name, w.shape[1], lambda r: w[:, r].T.astype(np.float32), 0)
        dq = gr.producer.get(ins[1])
        if dq is None or dq.op_type != "DequantizeLinear":
            return None
        return _dequantize_linear(gr, dq)
    return None


def _dequantize_linear(gr: _Graph, node):
    """FP8's ``DequantizeLinear`` of a ``[K, N]`` float8 weight: one scale (a scalar), per output channel (axis 1) or
    blocked along K (axis 0, ``block_size``); the rows of ``[N, K]`` dequantized a slice at a time."""
    import ml_dtypes
    from onnx import TensorProto

    a = _attrs(node)
    t, s = gr.inits.get(node.input[0]), gr.array(node.input[1])
    if t is None or s is None or t.data_type != TensorProto.FLOAT8E4M3FN:
        return None
    raw = gr.array(node.input[0])
    if raw is None or raw.ndim != 2:
        return None
    K = raw.shape[0]
    s = s.astype(np.float32)
    block = (int(a.get("block_size", 0)) or -(-K // s.shape[0])) if s.ndim == 2 else 0

    def rows(r):
        w = raw[:, r].view(np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)  # [K, n]
        if s.ndim == 0:
            w = w * s
        elif s.ndim == 1:  # per output channel
            w = w * s[r][None, :]
        else:  # [ceil(K / block), N]
            w = w * np.repeat(s[:, r], block, axis=0)[:K]
        return np.ascontiguousarray(w.T)

    return ("fp8", raw.shape[1], rows, block)


def _weight_nodes(gr: _Graph):
    """The graph's nodes that hold a weight matrix: (name to map it by, node)."""
    for n in gr.g.node:
        if n.op_type in ("MatMulNBits", "MatMul", "Gather", "GatherBlockQuantized"):
            if n.op_type == "Gather" and not (n.input and n.input[0] in gr.inits):
                continue
            if n.op_type == "GatherBlockQuantized" and not n.name.startswith(("/model/embed_tokens/",
                                                                             "/model/per_layer_inputs/embed/")):
                continue
            if n.op_type == "MatMul" and not (n.input[1] in gr.inits or getattr(gr.producer.get(n.input[1]), "op_type",
                                                                                  "") == "DequantizeLinear"):
                continue
            if n.op_type == "Gather" and len(gr.inits[n.input[0]].dims) != 2:
                continue
            yield n.name, n


def relative_difference(get, n_rows: int, ref) -> float:
    """``||graph - ref|| / ||ref||`` over all rows, ``_ROWS`` at a time (``ref`` an array or, as ``get``, a function
    of a row slice)."""
    num = den = 0.0
    for r0 in range(0, n_rows, _ROWS):
        r = slice(r0, min(n_rows, r0 + _ROWS))
        want = ref(r) if callable(ref) else ref[r]
        d = get(r) - want
        num += float(np.einsum("ij,ij->", d, d, dtype=np.float64))
        den += float(np.einsum("ij,ij->", want, want, dtype=np.float64))
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
        kind, n_rows, get, block = got
        tname, w = ref
        width = get(slice(0, 1)).shape[1] if n_rows else w.shape[1]
        if block and width > w.shape[1] and width == -(-w.shape[1] // block) * block:
            # (a tied table the builder gathers from the lm_head's blocks, padded to whole blocks, then slices)
            get = (lambda g, k: lambda r: g(r)[:, :k])(get, w.shape[1])
        elif w.shape[0] < n_rows or width != w.shape[1]:
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


def _q4_tiles(gr: _Graph, node):
    """``edgespec.MatMulQ4``'s tiled weights (``export/kernels.py``'s ``pack_q4``, undone) as a list of one row
    function per matrix: one, or a fused SwiGLU's two (gate, up: its tiles interleaved). Each function gives rows of
    the ``[N, K]`` float32 weights: ``scale * (q - zero point)``, or ``scale * q - minimum`` where the node has
    minimums (a GGUF's or HQQ's blocks), with Q4_K's scale bytes (``d * sc``, ``dmin * m``) where it has those."""
    from .kernels import TILE  # (pack_q4's; imported here: kernels imports this module)

    a = _attrs(node)
    N, K, block = int(a["N"]), int(a["K"]), int(a["block_size"])
    ins = list(node.input) + [""] * 7
    b = gr.array(ins[1])
    if b is None or int(a.get("bits", 4)) != 4:
        return None
    T, nb = b.shape[0], K // block

    def unpack(tiles):  # the integers of those tiles' columns [len(tiles) * TILE, nb, block]
        q = np.stack([b[tiles] & 15, b[tiles] >> 4], axis=-2)  # [t, nb, block * 8] -> [t, nb, 2, block * 8]
        # byte (p, i, j) of a block: column i of the tile, elements 8p + j (low nibble) and 8p + 4 + j (high)
        return q.reshape(len(tiles), nb, 2, block // 8, TILE, 4).transpose(0, 4, 1, 3, 2, 5).reshape(-1, nb, block)

    def columns(x):  # [T, nb, (2,) TILE] -> [T * TILE, nb(, 2)]
        return np.moveaxis(x, -1, 1).reshape((T * TILE,) + x.shape[1:-1])

    s = gr.array(ins[2])
    if ins[6]:  # Q4_K's scale bytes: d, dmin per super-block of 8 blocks [T, nb/8, 2, TILE], sc, m per block
        d, sc = columns(gr.array(ins[2])), columns(gr.array(ins[6])).astype(np.float32)
        d = np.repeat(d, 8, axis=1)
        scale, minimum = d[..., 0] * sc[..., 0], d[..., 1] * sc[..., 1]
    else:
        scale = columns(s)
        minimum = columns(gr.array(ins[5])) if ins[5] else None
    zp = columns(gr.array(ins[3])).astype(np.float32) if ins[3] else np.float32(8)

    def rows_of(tiles: np.ndarray):
        cols = (tiles[:, None] * TILE + np.arange(TILE)).reshape(-1)[:N]

        def rows(r):
            c = cols[r]
            need = np.unique(c // TILE)  # (only the tiles these rows are in, unpacked)
            qc = unpack(need)[np.searchsorted(need, c // TILE) * TILE + c % TILE].astype(np.float32)
            if minimum is not None:
                w = scale[c][..., None] * qc - minimum[c][..., None]
            else:
                z = zp if np.ndim(zp) == 0 else zp[c][..., None]
                w = scale[c][..., None] * (qc - z)
            return w.reshape(len(c), nb * block)

        return rows

    if any(x.name == "swiglu" and x.i for x in node.attribute):
        return [rows_of(np.arange(0, T, 2)), rows_of(np.arange(1, T, 2))]
    return [rows_of(np.arange(T))]


def check_rewrite(source_file, rewritten_file) -> WeightCheck:
    """exact-kernels' rewrite against its source graph, matrix by matrix: each ``MatMulQ4``'s weights, unpacked from
    its tiles, against the builder's ``MatMulNBits`` of the same name (a fused SwiGLU's up projection: the name with
    ``up_proj`` for ``gate_proj``), dequantized. Repacking loses nothing, so they agree to float rounding (a
    minimum is ``scale * zero point`` in float32): bound 1e-5; another layer's matrix is ~1.4."""
    from .kernels import OP  # (imported here: kernels imports this module)

    src, new = _Graph(Path(source_file)), _Graph(Path(rewritten_file))
    by_name = {n.name: n for n in src.g.node if n.op_type == "MatMulNBits"}
    out = WeightCheck()
    for node in new.g.node:
        if node.op_type != OP:
            continue
        mats = _q4_tiles(new, node)
        names = [node.name] + ([node.name.replace("gate_proj", "up_proj")] if mats and len(mats) == 2 else [])
        for name, get in zip(names, mats or [None] * len(names)):
            ref = by_name.get(name)
            got = graph_weights(src, ref) if ref is not None else None
            if get is None or got is None:
                out.unmapped.append(name)
                continue
            _, n_rows, ref_rows, _ = got
            err = relative_difference(get, n_rows, ref_rows)
            out.checked += 1
            if not err <= out.worst or not out.worst_name:
                out.worst, out.worst_name = err, name
            if not err <= REWRITE_BOUND:
                out.failed.append((name, f"the source's {name}", err, REWRITE_BOUND))
    return out
