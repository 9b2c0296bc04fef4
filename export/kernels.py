"""``edgespec exact-kernels``: rewrite an exported INT4 bundle to edgespec's width-invariant kernels.

Two graph changes:

* every ``com.microsoft.MatMulNBits`` (4 bits, K a multiple of the block) becomes
  ``edgespec.MatMulQ4`` (``edgespec/native/q4gemm.cpp``) with the same numbers in the kernel's tiled
  layout: the same int8-activation arithmetic, but a row's result no longer depends on how many rows
  the call has (onnxruntime's AVX-512 kernel pairs rows at blocks of 64 and 128; its AVX2 kernel
  computes one row on another path than two, at block 32 too). Weights another op shares (a tied
  lm_head's, read by the embedding's GatherBlockQuantized) stay for that op and the kernel gets a
  packed copy: one MatMulNBits left would bring the width dependence back;
* in the target, each ``GroupQueryAttention`` gets one more query row (a copy of the call's last
  row, one position past it; the real rows cannot see it, and the next call overwrites its keys and
  values), so attention never runs a single query row, which onnxruntime computes on another path
  (an MLAS GEMV) than two or more.

With both, a one-token call computes what a speculative verify computes for the same position, so
the width probe picks one-token calls and plain decoding no longer pays the two-token exactness tax.
The drafter gets the kernel (it is also faster) but no padding: its arithmetic need not match.
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import numpy as np

from edgespec.errors import ExportError
from edgespec.manifest import Q8_GROUP, kv_row_head, kv_row_width, load_manifest
from edgespec.width import width_invariant_spec
from .output import load_graph
from .weights import check_rewrite

DOMAIN = "edgespec"
OP = "MatMulQ4"
TILE = 16  # output columns per tile (one AVX-512 vector of int32/float lanes)


def pack_q4(b: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None, K: int, N: int, block: int,
            kquant: bool = True):
    """MatMulNBits' 4-bit tensors (B ``[N, K/block, block/2]``, scales ``[N * K/block]``, packed 4-bit
    zero points ``[N * ceil(nb/2)]``, float zero points ``[N * K/block]`` or None) in
    ``edgespec.MatMulQ4``'s tiled layout (q4gemm.cpp): returns [B ``[tiles, nb, block * 8]`` uint8,
    scales ``[tiles, nb, 16]`` float32, zero points ``[tiles, nb, 16]`` uint8 or None] and, for float
    zero points (a GGUF's Q4_1 and Q4_K blocks, ``export.gguf_blocks``), minimums ``[tiles, nb, 16]``
    float32 (``scale * zero point``, the kernel's ``scale * w - minimum``) and no zero points. Columns
    past N are zero weights with scale 0."""
    nb = K // block
    tiles = -(-N // TILE)
    pad = tiles * TILE - N
    q = np.asarray(b, dtype=np.uint8).reshape(N, nb, block // 2)
    el = np.empty((N, nb, block), dtype=np.uint8)
    el[..., 0::2] = q & 15
    el[..., 1::2] = q >> 4
    if pad:
        el = np.concatenate([el, np.zeros((pad, nb, block), np.uint8)])
    # [t, i, b, p, h, j]: column 16t+i, block b, group p of 8 elements, half h (k 8p+4h+j)
    el = el.reshape(tiles, TILE, nb, block // 8, 2, 4)
    packed = el[:, :, :, :, 0, :] | (el[:, :, :, :, 1, :] << 4)  # [t, i, b, p, j]
    packed = np.ascontiguousarray(packed.transpose(0, 2, 3, 1, 4)).reshape(tiles, nb, block * 8)
    s = np.asarray(scales, dtype=np.float32).reshape(N, nb)
    if pad:
        s = np.concatenate([s, np.zeros((pad, nb), np.float32)])
    s = np.ascontiguousarray(s.reshape(tiles, TILE, nb).transpose(0, 2, 1))
    z = None
    if zero_points is not None and np.asarray(zero_points).dtype.kind == "f":
        mn = (np.asarray(zero_points, dtype=np.float32).reshape(N, nb) * np.asarray(scales, np.float32).reshape(N, nb))
        ks = (kquant_scales(np.asarray(scales, np.float32).reshape(N, nb), mn)
              if kquant and block == 32 and nb % 8 == 0 else None)
        if ks is not None:  # Q4_K's own scales: two floats per column and super-block, two bytes per block
            d, sc = ks
            if pad:
                d = np.concatenate([d, np.zeros((pad,) + d.shape[1:], np.float32)])
                sc = np.concatenate([sc, np.zeros((pad,) + sc.shape[1:], np.uint8)])
            d = np.ascontiguousarray(d.reshape(tiles, TILE, nb // 8, 2).transpose(0, 2, 3, 1))
            sc = np.ascontiguousarray(sc.reshape(tiles, TILE, nb, 2).transpose(0, 2, 3, 1))
            return [packed, d, None, None, sc]
        if pad:
            mn = np.concatenate([mn, np.zeros((pad, nb), np.float32)])
        mn = np.ascontiguousarray(mn.reshape(tiles, TILE, nb).transpose(0, 2, 1))
        return [packed, s, None, mn]  # (no zero points: the kernel's are 0 where it has minimums)
    if zero_points is not None:
        zr = np.asarray(zero_points, dtype=np.uint8).reshape(N, -1)
        zz = np.empty((N, zr.shape[1] * 2), np.uint8)
        zz[:, 0::2] = zr & 15
        zz[:, 1::2] = zr >> 4
        zz = zz[:, :nb]
        if pad:
            zz = np.concatenate([zz, np.full((pad, nb), 8, np.uint8)])
        z = np.ascontiguousarray(zz.reshape(tiles, TILE, nb).transpose(0, 2, 1))
    return [packed, s, z]


def kquant_scales(scale: np.ndarray, minimum: np.ndarray):
    """Blocks of 32 with float scales and minimums ``[N, nb]`` as Q4_K stores them, where they are Q4_K's:
    per (column, super-block of 8 blocks) a float16 ``d`` and ``dmin`` (returned as float32 ``[N, nb/8, 2]``)
    and per block 6-bit ``sc`` and ``m`` (uint8 ``[N, nb, 2]``) with ``scale == d * sc`` exactly and
    ``minimum`` within float rounding of ``dmin * m`` (a float zero point's ``zp * scale``); None where any
    block is not so (other quantizers, a block of scale 0 held as its constant). llama.cpp's quantizer gives
    each super-block's largest scale and minimum the byte 63, which this takes ``d`` and ``dmin`` from."""
    from .gguf_blocks import six_bit_multiples

    N, nb = scale.shape
    S = scale.reshape(N, nb // 8, 8).astype(np.float32)
    M = minimum.reshape(N, nb // 8, 8).astype(np.float32)
    if (M < 0).any() or (S < 0).any():
        return None
    out = []
    for v, exact in ((S, True), (M, False)):
        d, q = six_bit_multiples(v)
        if (q > 63).any():
            return None
        back = d[..., None] * q.astype(np.float32)
        if exact and not np.array_equal(back, v):
            return None
        if not exact and (np.abs(back - v) > 4 * np.spacing(np.maximum(np.abs(v), np.float32(1e-30)))).any():
            return None
        out.append((d, q.astype(np.uint8)))
    (d, sc), (dmin, m) = out
    return np.stack([d, dmin], axis=-1), np.stack([sc.reshape(N, nb), m.reshape(N, nb)], axis=-1)


def _float_zero_points(node, inits: dict) -> bool:
    """Whether MatMulNBits ``node``'s zero points are floats (a minimum per block: see pack_q4)."""
    from onnx import TensorProto

    zp = node.input[3] if len(node.input) > 3 else ""
    return bool(zp) and zp in inits and inits[zp].data_type != TensorProto.UINT8


def _q4_attrs(node, inits: dict) -> dict | None:
    """MatMulNBits ``node``'s attributes where edgespec's kernel can take it (4 bits, K a multiple of a
    block that is a multiple of 8, weights, scales and zero points initializers, no g_idx or bias); else None."""
    from onnx import helper

    if node is None or node.op_type != "MatMulNBits" or node.domain != "com.microsoft":
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    inputs = list(node.input)
    while inputs and not inputs[-1]:
        inputs.pop()
    if (attrs.get("bits", 4) != 4 or attrs["K"] % attrs["block_size"] or attrs["block_size"] % 8
            or len(inputs) > 4 or len(inputs) < 3 or any(i not in inits for i in inputs[1:])):
        return None
    return attrs


def input_uses(g) -> dict[str, int]:
    """How many node inputs read each value of graph ``g`` (an initializer read twice is shared)."""
    uses: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            uses[i] = uses.get(i, 0) + 1
    return uses


def _consumers(g) -> dict[str, list]:
    out: dict[str, list] = {}
    for n in g.node:
        for i in n.input:
            out.setdefault(i, []).append(n)
    for o in g.output:  # a graph output counts as one more reader
        out.setdefault(o.name, []).append(None)
    return out


def swiglu_patterns(g, inits: dict) -> list[tuple]:
    """(gate, up, sigmoid, mul, mul) node tuples of each SwiGLU the builder writes, ``Mul(Mul(gate,
    Sigmoid(gate)), up)`` with gate and up two 4-bit MatMulNBits of the same input and shape, each
    intermediate read by these nodes only, that ``MatMulQ4`` can compute as one node (``swiglu``)."""
    made = {o: n for n in g.node for o in n.output}
    readers = _consumers(g)
    found = []
    for sig in g.node:
        if sig.op_type != "Sigmoid" or sig.domain not in ("", "ai.onnx"):
            continue
        gate = made.get(sig.input[0])
        ga = _q4_attrs(gate, inits)
        if ga is None:
            continue
        gout = sig.input[0]
        m1 = [n for n in readers.get(gout, []) if n is not sig]
        if (len(m1) != 1 or m1[0] is None or m1[0].op_type != "Mul" or sorted(m1[0].input) != sorted([gout, sig.output[0]])
                or len(readers[gout]) != 2 or readers.get(sig.output[0]) != [m1[0]]):
            continue
        m1 = m1[0]
        m2 = readers.get(m1.output[0], [])
        if len(m2) != 1 or m2[0] is None or m2[0].op_type != "Mul":
            continue
        m2 = m2[0]
        other = [i for i in m2.input if i != m1.output[0]]
        up = made.get(other[0]) if len(other) == 1 else None
        ua = _q4_attrs(up, inits)
        if (ua is None or up.input[0] != gate.input[0] or readers.get(other[0]) != [m2]
                or any(ga[k] != ua[k] for k in ("K", "N", "block_size"))
                or _float_zero_points(gate, inits) != _float_zero_points(up, inits)
                or (len([i for i in gate.input if i]) != len([i for i in up.input if i]))):
            continue
        found.append((gate, up, sig, m1, m2))
    return found


def bias_patterns(g, inits: dict) -> list[tuple]:
    """(matmul, add) node pairs where a 4-bit MatMulNBits' output is read only by an ``Add`` of a float32
    initializer of N values (the qkv projection's bias): ``MatMulQ4`` adds it as it stores (the same
    float addition, so the same bits)."""
    from onnx import TensorProto

    made = {o: n for n in g.node for o in n.output}
    readers = _consumers(g)
    found = []
    for add in g.node:
        if add.op_type != "Add" or add.domain not in ("", "ai.onnx") or len(add.input) != 2:
            continue
        for mine, other in ((0, 1), (1, 0)):
            mm = made.get(add.input[mine])
            attrs = _q4_attrs(mm, inits)
            b = inits.get(add.input[other])
            if (attrs is None or b is None or readers.get(add.input[mine]) != [add] or b.data_type != TensorProto.FLOAT
                    or list(b.dims) != [int(attrs["N"])]):
                continue
            found.append((mm, add, add.input[other]))
            break
    return found


ATTENTION_OP = "DecodeAttention"
ATTENTION_OP_F16 = "DecodeAttentionF16"  # the same over float16 KV caches (--kv-dtype float16)
ATTENTION_OP_Q8 = "DecodeAttentionQ8"  # ... over int8 caches, a float32 scale per 32 lanes (--kv-dtype int8)
ATTENTION_OPS = (ATTENTION_OP, ATTENTION_OP_F16, ATTENTION_OP_Q8)
KV_DTYPES = ("float32", "float16", "int8")


def _check_kv_dtype(kv_dtype: str, own_attention: bool) -> None:
    """ExportError for a KV dtype the rewrite cannot give (``auto``: float16 where a graph allows it)."""
    if kv_dtype not in KV_DTYPES + ("auto",):
        raise ExportError(f"KV dtype {kv_dtype!r} is not one of {', '.join(KV_DTYPES)}")
    if kv_dtype in ("float16", "int8") and not own_attention:
        raise ExportError(f"{'an' if kv_dtype == 'int8' else 'a'} {kv_dtype} KV cache needs edgespec's attention "
                          "(not --onnxruntime-attention)")


def _why_not_half(g, gqa: list, attention: list) -> str | None:
    """Why the KV caches of a graph cannot be float16 (None: they can): every attention node must be
    edgespec's (``attention``, none left in ``gqa``), its past inputs and present outputs the graph's
    own inputs and outputs that nothing else reads."""
    if gqa or not attention:
        return (f"{len(gqa)} of its attention nodes are not edgespec.{ATTENTION_OP} (another attention "
                "variant)" if gqa else "it has no attention edgespec computes")
    ins = {v.name for v in g.input}
    outs = {v.name for v in g.output}
    readers = _consumers(g)
    for n in attention:
        past, present = list(n.input[1:3]), list(n.output[1:3])
        if (any(p not in ins or len(readers.get(p, [])) != 1 for p in past) or any(o not in outs for o in present)
                or any(readers.get(o) != [None] for o in present)):  # (read by nothing but the graph's output)
            return f"the KV cache of {n.name or n.output[0]} is not the graph's own input and output"
    return None


def _why_not_q8(g, attention: list, head_dim: int | None) -> str | None:
    """Why the KV caches of ``DecodeAttention`` nodes ``attention`` cannot be int8 beyond ``_why_not_half``'s
    reasons (None: they can): each cache's head size (its last axis where static, else ``head_dim``, the
    manifest's) a multiple of the scales' groups."""
    widths = _cache_widths(g)
    for n in attention:
        w = widths.get(n.input[1], head_dim)
        if not w or w % Q8_GROUP:
            return (f"the head size of {n.name or n.output[0]} is {w or 'not fixed'}, not a multiple of "
                    f"{Q8_GROUP} (int8 rows keep a scale per {Q8_GROUP} lanes)")
    return None


def _half_caches(g, attention: list, q8: bool = False) -> int:
    """The KV caches of the ``DecodeAttention`` nodes ``attention`` as float16 (``_why_not_half``
    found nothing against it): each node becomes ``DecodeAttentionF16`` and its past inputs and
    present outputs change type. ``q8``: int8 caches instead (``DecodeAttentionQ8``; ``_why_not_q8`` found nothing
    against it either), their rows' last axis D + D / 8 (the numbers and their scales). Returns the caches changed
    (two a layer)."""
    from onnx import TensorProto

    ins = {v.name: v for v in g.input}
    outs = {v.name: v for v in g.output}
    changed = 0
    for n in attention:
        past, present = list(n.input[1:3]), list(n.output[1:3])
        for v in [ins[p] for p in past] + [outs[o] for o in present]:
            v.type.tensor_type.elem_type = TensorProto.INT8 if q8 else TensorProto.FLOAT16
            dims = v.type.tensor_type.shape.dim
            if q8 and len(dims) == 4 and dims[3].HasField("dim_value"):
                dims[3].dim_value = kv_row_width("int8", dims[3].dim_value)
        n.op_type = ATTENTION_OP_Q8 if q8 else ATTENTION_OP_F16
        changed += 2
    names = {x for n in attention for x in list(n.input[1:3]) + list(n.output[1:3])}
    keep = [v for v in g.value_info if v.name not in names]  # (shape notes of the old type)
    del g.value_info[:]
    g.value_info.extend(keep)
    return changed


def _own_attention(n, inits: dict, head_dim: int | None = None) -> bool:
    """Replace the GroupQueryAttention node ``n`` with ``edgespec.DecodeAttention`` where it is
    the builder's CPU attention that op computes (packed QKV, rotary over the whole head or its first
    lanes, interleaved or not, causal, float32 caches; a sliding window and a score cap, Gemma 2 and 3's,
    kept as the op's own attributes); False (left as it is) else."""
    from onnx import TensorProto, helper

    a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
    ins = list(n.input)
    while ins and not ins[-1]:  # optional inputs left empty (position ids, attention bias, ...)
        ins.pop()
    if (len(ins) != 9 or ins[1] or ins[2] or not a.get("do_rotary")
            or int(a.get("local_window_size", -1)) not in (-1,) and int(a.get("local_window_size", -1)) <= 0
            or not 0.0 <= float(a.get("softcap", 0.0)) < float("inf")
            or a.get("smooth_softmax", 0) or ins[7] not in inits or ins[8] not in inits
            or inits[ins[7]].data_type != TensorProto.FLOAT or len(inits[ins[7]].dims) != 2
            or inits[ins[7]].dims[1] <= 0
            # the op's head size (the manifest's): a multiple of 8 (its lanes), the rotary within it
            or (head_dim is not None and (head_dim % 8 or 2 * inits[ins[7]].dims[1] > head_dim))):
        return False
    n.op_type, n.domain = ATTENTION_OP, DOMAIN
    del n.input[:]
    n.input.extend([ins[0], ins[3], ins[4], ins[5], ins[7], ins[8]])
    del n.attribute[:]
    n.attribute.extend([helper.make_attribute("num_heads", int(a["num_heads"])),
                        helper.make_attribute("kv_num_heads", int(a["kv_num_heads"])),
                        helper.make_attribute("scale", float(a.get("scale", 0.0)))])
    if int(a.get("local_window_size", -1)) > 0:
        n.attribute.append(helper.make_attribute("local_window_size", int(a["local_window_size"])))
    if float(a.get("softcap", 0.0)) > 0:
        n.attribute.append(helper.make_attribute("softcap", float(a["softcap"])))
    if a.get("rotary_interleaved", 0):
        n.attribute.append(helper.make_attribute("rotary_interleaved", 1))
    return True


def _cache_widths(g) -> dict[str, int]:
    """Each KV cache input's head size (``[batch, kv heads, positions, head size]``'s last axis, where static): a
    node's own, Gemma 4's global layers' wider than the manifest's ``head_dim``."""
    return {i.name: d[3].dim_value for i in g.input
            if len(d := i.type.tensor_type.shape.dim) == 4 and d[3].HasField("dim_value")}


def kernel_features(g, head_dim: int | None) -> list[str]:
    """What of edgespec's kernels graph ``g`` relies on beyond their first version (the manifest's
    ``kernel_features``; edgespec.manifest.KERNEL_FEATURES): a runtime without one refuses the bundle."""
    from onnx import helper

    inits = {t.name: t for t in g.initializer}
    widths = _cache_widths(g)
    out = set()
    for n in g.node:
        if n.domain != DOMAIN or n.op_type not in ATTENTION_OPS:
            continue
        head = widths.get(n.input[1], head_dim) if len(n.input) > 1 else head_dim  # (the node's own cache's)
        if n.op_type == ATTENTION_OP_Q8 and n.input[1] in widths:  # (its rows: D numbers and D / 32 scales' bytes)
            head = kv_row_head("int8", head)
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        if int(a.get("local_window_size", -1)) > 0:
            out.add("attention-window")
        if float(a.get("softcap", 0.0)) > 0:
            out.add("attention-softcap")
        if a.get("rotary_interleaved", 0):
            out.add("attention-interleaved-rotary")
        cos = inits.get(n.input[4]) if len(n.input) > 4 else None
        if cos is None or head is None or 2 * cos.dims[-1] < head:  # (unknown: as the one that needs more)
            out.add("attention-partial-rotary")
    return sorted(out)


def _fold_rotary(g, head_dim: int | None = None) -> int:
    """Give every ``GroupQueryAttention`` whose query and key come rotated from ``RotaryEmbedding`` nodes (the
    builder's Gemma 4: its global layers' partial rotary is a whole-head one over a table whose last angles are 0)
    the unrotated query and key, with the rotary nodes' tables as its own (``do_rotary``): the same rotation of the
    same rows by their positions, which edgespec's attention then computes. Only where both nodes read the same
    tables and the graph's ``position_ids`` over the whole head; rotary nodes no longer read are removed. Returns how
    many attention nodes it changed."""
    from onnx import helper

    made = {o: n for n in g.node for o in n.output}
    graph_inputs = {i.name for i in g.input}
    inits = {t.name: t for t in g.initializer}
    widths = _cache_widths(g)
    folded = 0
    for n in g.node:
        if n.op_type != "GroupQueryAttention" or len(n.input) < 3 or not n.input[1] or not n.input[2]:
            continue
        a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
        rq, rk = made.get(n.input[0]), made.get(n.input[1])
        if a.get("do_rotary") or not all(r is not None and r.op_type == "RotaryEmbedding" and r.domain == "com.microsoft"
                                         and len(r.input) == 4 for r in (rq, rk)):
            continue
        ra = [{x.name: helper.get_attribute_value(x) for x in r.attribute} for r in (rq, rk)]
        ins = list(n.input) + [""] * (9 - len(n.input))
        cos = inits.get(rq.input[2])
        # (the rotary node rotates each head over its whole width, the attention its first 2 x table-width lanes:
        # the same only where the table covers the head, the node's own cache's width)
        if cos is None or not cos.dims or 2 * cos.dims[-1] != widths.get(ins[3], head_dim or -1):
            continue
        if (list(rq.input[1:]) != list(rk.input[1:]) or rq.input[1] not in graph_inputs or ins[7] or ins[8]
                or any(int(x.get("rotary_embedding_dim", 0)) for x in ra)
                or int(ra[0].get("interleaved", 0)) != int(ra[1].get("interleaved", 0))):
            continue
        ins[0], ins[1], ins[7], ins[8] = rq.input[0], rk.input[0], rq.input[2], rq.input[3]
        del n.input[:]
        n.input.extend(ins)
        for k in ("do_rotary", "rotary_interleaved"):
            old = next((x for x in n.attribute if x.name == k), None)
            if old is not None:
                n.attribute.remove(old)
        n.attribute.extend([helper.make_attribute("do_rotary", 1),
                            helper.make_attribute("rotary_interleaved", int(ra[0].get("interleaved", 0)))])
        folded += 1
    if folded:
        read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
        kept = [n for n in g.node if not (n.op_type == "RotaryEmbedding" and not any(o in read for o in n.output))]
        del g.node[:]
        g.node.extend(kept)
    return folded


NOPE_COS, NOPE_SIN = "edgespec_nope_cos", "edgespec_nope_sin"


def _nope_rotary(g, head_dim: int | None = None) -> int:
    """Give every ``GroupQueryAttention`` without a rotary (a NoPE layer: EXAONE 4.0's global layers, SmolLM3's every
    fourth) an identity one, a partial rotary of 8 pairs with cos 1 and sin 0 (``x * 1 - y * 0`` is ``x``, bit for
    bit; heads of 16 lanes or more), so that edgespec's attention, which always rotates, computes it (float16 caches, alternates) where it kept
    onnxruntime's. Not in a graph that rotates with ``RotaryEmbedding`` nodes outside its attention (Hunyuan's, before
    its norms): those rotate by the call's slots, not an alternate's position, and need onnxruntime's attention's
    padding and no alternates. The tables have the rows of the graph's own rotary tables (none: nothing done).
    Returns how many nodes it changed."""
    from onnx import TensorProto, helper

    graph_inputs = {i.name for i in g.input}
    positions = {i for n in g.node if n.op_type != "GroupQueryAttention" for i in n.input
                 if i in graph_inputs and "position" in i}
    if positions or any(n.op_type == "RotaryEmbedding" for n in g.node):  # (positions read outside the attention)
        return 0
    inits = {t.name: t for t in g.initializer}
    rows = max((int(inits[n.input[7]].dims[0]) for n in g.node if n.op_type == "GroupQueryAttention"
                and len(n.input) > 7 and n.input[7] in inits and inits[n.input[7]].dims), default=0)
    nodes = [n for n in g.node if n.op_type == "GroupQueryAttention" and not (len(n.input) > 7 and n.input[7])
             and not any(x.name == "do_rotary" and helper.get_attribute_value(x) for x in n.attribute)]
    widths = _cache_widths(g)
    nodes = [n for n in nodes if len(n.input) > 3 and widths.get(n.input[3], head_dim or 0) >= 16]
    if not rows or not nodes:
        return 0
    if NOPE_COS not in inits:
        # (8 pairs: onnxruntime's op, should the node stay its, takes tables of a multiple of 8 columns)
        g.initializer.extend([helper.make_tensor(NOPE_COS, TensorProto.FLOAT, [rows, 8], [1.0] * (8 * rows)),
                              helper.make_tensor(NOPE_SIN, TensorProto.FLOAT, [rows, 8], [0.0] * (8 * rows))])
    for n in nodes:
        ins = list(n.input) + [""] * (9 - len(n.input))
        ins[7], ins[8] = NOPE_COS, NOPE_SIN
        del n.input[:]
        n.input.extend(ins)
        for x in [x for x in n.attribute if x.name in ("do_rotary", "rotary_interleaved")]:
            n.attribute.remove(x)
        n.attribute.append(helper.make_attribute("do_rotary", 1))
    return len(nodes)


def _pack_qkv(g) -> int:
    """Give every ``GroupQueryAttention`` that takes its query, key and value as three inputs (the builder's
    graph for models with per-head query/key norms: Qwen3, OLMo2, Gemma3) one packed input instead: a
    ``Concat`` of the three on the last axis, which the op reads as packed QKV (its ``key`` and ``value``
    inputs left empty). A concatenation only copies, so the attention computes the same numbers, and the
    rewrites below (edgespec's attention, the padded row) then apply as to the builder's packed graphs.
    Returns how many nodes it packed."""
    from onnx import helper

    order, packed = [], 0
    for n in g.node:
        if n.op_type == "GroupQueryAttention" and len(n.input) > 2 and n.input[1] and n.input[2]:
            qkv = f"edgespec_qkv/{packed}/{n.name or n.output[0]}"
            order.append(helper.make_node("Concat", [n.input[0], n.input[1], n.input[2]], [qkv], axis=-1,
                                          name=f"{qkv}/Concat"))
            n.input[0], n.input[1], n.input[2] = qkv, "", ""
            packed += 1
        order.append(n)
    if packed:
        del g.node[:]
        g.node.extend(order)
    return packed


SKIP_INPUT = "logits_skip"
# what _skip_logits adds beside the input (strip_logits_skip takes them out again)
SKIP_SLICE = "edgespec_skip/slice"
SKIP_END, SKIP_AXIS = "edgespec_skip_end", "edgespec_skip_axis"
SKIP_ROWS = "edgespec_skip/hidden"
POSITIONS_INPUT = "edgespec_row_positions"


def _row_positions(g) -> int:
    """The graph input ``POSITIONS_INPUT`` (int64 [n], fed at every call: 0, 1, ..., n - 1 but where a
    call carries alternates) as the optional last input of every edgespec attention node (see
    ``DecodeAttention``'s positions in q4gemm.cpp): how many nodes take it (0: none, or it is there)."""
    from onnx import TensorProto, helper

    if any(i.name == POSITIONS_INPUT for i in g.input):
        return 0
    nodes = [n for n in g.node if n.domain == DOMAIN and n.op_type in ATTENTION_OPS and len(n.input) == 6]
    if not nodes:
        return 0
    g.input.append(helper.make_tensor_value_info(POSITIONS_INPUT, TensorProto.INT64, ["edgespec_rows"]))
    for n in nodes:
        n.input.append(POSITIONS_INPUT)
    return len(nodes)


# the ops an lm_head may be (edgespec's kernel, the builder's 4/8-bit and float ones)
LM_HEAD_OPS = (OP, "MatMulNBits", "MatMul")


def _lm_head(g, logits: str, ops: tuple):
    """The lm_head of graph ``g``: the matrix multiply (one of ``ops``) the output ``logits`` comes from (through
    Casts, and a final logit cap's Div, Tanh and Mul by a constant), whose first input is the hidden states; None
    where there is none to find."""

    made = {o: n for n in g.node for o in n.output}
    node = made.get(logits)
    consts = {t.name for t in g.initializer} | {o for n in g.node if n.op_type == "Constant" for o in n.output}
    # (through Casts, and a final logit cap's Div, Tanh and Mul by a constant: Gemma 2, 3 and 4, whose prefills
    # computed every row's logits, 262,144 a row)
    readers: dict[str, int] = {}
    for n in g.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1
    outputs = {o.name for o in g.output}
    while node is not None and node.op_type in ("Cast", "Identity", "Tanh", "Div", "Mul"):
        data = [i for i in node.input if i and i not in consts]
        if len(data) != 1 or (node.op_type in ("Div", "Mul") and len(node.input) != 2):
            return None
        if node.op_type not in ("Cast", "Identity") and (readers.get(data[0], 0) != 1 or data[0] in outputs):
            return None  # (another reader would get the cut rows too; a cap's constants: scalars, the builder's)
        node = made.get(data[0])
    if node is None or node.op_type not in ops or not node.input:
        return None
    hidden_from = made.get(node.input[0])
    if (any(t.name == node.input[0] for t in g.initializer)
            or (hidden_from is not None and hidden_from.op_type == "DequantizeLinear")):
        return None  # not the hidden states (a weight first)
    return node


def _skip_logits(g, logits: str, ops: tuple = (OP,)) -> bool:
    """The graph input ``SKIP_INPUT`` (int64 [1], fed at every call: 0 computes every position's
    logits): a Slice drops that many leading positions from the lm_head's input, so a prefill computes
    its last position's logits only. The lm_head is the matrix multiply (one of ``ops``) ``logits``
    comes from (through Casts), its first input the hidden states. False where there is none to find.
    The runtime skips rows only in prefill chunks and a drafter's catch-up reads, never in a verify
    call, so a kernel whose rows depend on how many a call has changes no exactness: the greedy and
    the speculative runs prefill alike. (A default value, an initializer of the input's name, would
    make it optional, but onnxruntime's IO binding refuses to bind such an input.)"""
    from onnx import TensorProto, helper

    node = _lm_head(g, logits, ops)
    if node is None:
        return False
    if any(i.name == SKIP_INPUT for i in g.input):
        return False
    g.input.append(helper.make_tensor_value_info(SKIP_INPUT, TensorProto.INT64, [1]))
    g.initializer.extend([helper.make_tensor(SKIP_END, TensorProto.INT64, [1], [2 ** 62]),
                          helper.make_tensor(SKIP_AXIS, TensorProto.INT64, [1], [1])])
    hidden, kept = node.input[0], SKIP_ROWS
    cut = helper.make_node("Slice", [hidden, SKIP_INPUT, SKIP_END, SKIP_AXIS], [kept], name=SKIP_SLICE)
    known = next((v for v in list(g.value_info) + list(g.input) if v.name == hidden), None)
    if known is not None and known.type.tensor_type.elem_type:  # the rows' type, for tools that read it
        g.value_info.append(helper.make_tensor_value_info(kept, known.type.tensor_type.elem_type, None))
    node.input[0] = kept
    order = []
    for n in g.node:
        order += [cut, n] if n is node else [n]
    del g.node[:]
    g.node.extend(order)
    return True


def strip_logits_skip(g) -> bool:
    """Undo ``_skip_logits`` on a graph (in memory): the lm_head reads every row again and the graph
    has no ``SKIP_INPUT``, as the model builder wrote it, for runners that feed only the builder's
    inputs (onnxruntime-genai: scripts/genai_baseline.py). False where there was none."""
    cut = next((n for n in g.node if n.op_type == "Slice" and n.name == SKIP_SLICE), None)
    if cut is None:
        return False
    hidden, kept = cut.input[0], cut.output[0]
    for n in g.node:
        for i, name in enumerate(n.input):
            if name == kept:
                n.input[i] = hidden
    g.node.remove(cut)
    for seq, names in ((g.input, {SKIP_INPUT}), (g.initializer, {SKIP_END, SKIP_AXIS}),
                       (g.value_info, {kept})):
        for item in [x for x in seq if x.name in names]:
            seq.remove(item)
    return True


def add_logits_skip(model_file: Path, logits: str) -> bool:
    """``_skip_logits`` on a builder's graph file in place (its external data untouched), whatever its
    lm_head's op (``LM_HEAD_OPS``): every layout's prefill and catch-up reads compute the last rows'
    logits only. False (the file untouched) where the graph has no lm_head to find or the input."""
    m = load_graph(model_file)
    if not _skip_logits(m.graph, logits, LM_HEAD_OPS):
        return False
    import onnx

    onnx.save(m, str(model_file))
    return True


HIDDEN_OUTPUT = "hidden_states"


def add_hidden_output(model_file: Path, logits: str) -> str | None:
    """The graph output ``HIDDEN_OUTPUT``: the lm_head's input (each logits row's final-normed hidden state, after
    the logits skip's cut where there is one, so its rows are the logits'), in place; a multi-token-prediction
    assistant drafts from it (export/mtp.py). Its name, or None where the graph has no lm_head to find."""
    from onnx import TensorProto, helper

    m = load_graph(model_file)
    g = m.graph
    if any(o.name == HIDDEN_OUTPUT for o in g.output):
        return HIDDEN_OUTPUT
    node = _lm_head(g, logits, LM_HEAD_OPS)
    if node is None:
        return None
    # float32 whatever the graph's activations (the cuda layout's are float16): the runtime's buffer is
    g.node.append(helper.make_node("Cast", [node.input[0]], [HIDDEN_OUTPUT], name="hidden_states_out",
                                   to=TensorProto.FLOAT))
    g.output.append(helper.make_tensor_value_info(HIDDEN_OUTPUT, TensorProto.FLOAT, None))
    import onnx

    onnx.save(m, str(model_file))
    return HIDDEN_OUTPUT


def apply_window(model_file: Path, window: int) -> int:
    """Every ``GroupQueryAttention`` of the graph file attends within ``window`` tokens (``local_window_size``), in
    place: a model whose config's sliding window the builder's graph does not apply (Mistral 7B v0.1's 4,096,
    Phi-3-mini-4k's and -medium-4k's 2,047: the builder's classes leave it out, so its bundles held the window's
    length). The attribute means transformers' window, as the builder's Gemma 2 and 3 layers use it (their float32
    exports match torch past it). Returns the nodes given it; 0 (the file untouched) where the graph has another
    attention or none."""
    from onnx import helper

    m = load_graph(model_file)
    nodes = [n for n in m.graph.node if n.op_type in ("GroupQueryAttention", "MultiHeadAttention", "Attention",
                                                       *ATTENTION_OPS)]
    if not nodes or any(n.op_type != "GroupQueryAttention" for n in nodes):
        return 0
    for n in nodes:
        for a in [a for a in n.attribute if a.name == "local_window_size"]:
            n.attribute.remove(a)
        n.attribute.append(helper.make_attribute("local_window_size", int(window)))
    import onnx

    onnx.save(m, str(model_file))
    return len(nodes)


def attention_windows(model_file: Path) -> list[int]:
    """Each attention node's ``local_window_size`` in the graph file (-1: none), in node order (onnxruntime's
    ``GroupQueryAttention`` and edgespec's, which keeps the window where exact-kernels put it)."""
    from onnx import helper

    g = load_graph(model_file).graph
    return [int(next((helper.get_attribute_value(a) for a in n.attribute if a.name == "local_window_size"), -1))
            for n in g.node if n.op_type in ("GroupQueryAttention", *ATTENTION_OPS)]


def _whole_caches(g, capacity: int | None = None) -> tuple[int, int]:
    """Every ``GroupQueryAttention`` of graph ``g`` over the whole context's cache: ``sliding_window_cache`` taken
    off (the builder's window-sized cache layout, which edgespec never allocates: its caches hold the whole context,
    so no key is evicted and positions are the slots; with it onnxruntime refused a cache longer than the window on
    CUDA and one shorter on the CPU, "KV cache capacity must be at least local_window_size"), and the window itself
    taken off where it is at least ``capacity`` (such a window leaves no key out: the same attention). Returns (the
    nodes whose layout attribute went, the windows taken off)."""
    from onnx import helper

    layouts = unbound = 0
    for n in g.node:
        if n.op_type != "GroupQueryAttention":
            continue
        attrs = {a.name: a for a in n.attribute}
        if "sliding_window_cache" in attrs:
            n.attribute.remove(attrs["sliding_window_cache"])
            layouts += 1
        w = attrs.get("local_window_size")
        if capacity is not None and w is not None and helper.get_attribute_value(w) >= capacity:
            w.i = -1
            unbound += 1
    return layouts, unbound


def settle_graph(model_file: Path, capacity: int) -> tuple[int, int]:
    """A builder's graph file made one whose rows do not depend on the call, in place (its external data
    untouched), read and written once: ``_whole_caches`` (Gemma 2's and 3's local layers at 4,096 in a bundle of a
    shorter context lose their window, a shorter window stays over the whole context's cache) and
    ``_per_position_rope`` (LongRoPE's caches), and ``trim_empty_inputs``. Returns (the windows taken off, the
    rotary choices replaced)."""
    m = load_graph(model_file)
    layouts, unbound = _whole_caches(m.graph, capacity)
    rope = _per_position_rope(m.graph, model_file.name)
    trimmed = trim_empty_inputs(m.graph)
    trimmed += trim_rotary_tables(m.graph, capacity + ROTARY_SPARE_ROWS)
    if layouts or unbound or rope or trimmed:
        import onnx

        onnx.save(m, str(model_file))
    return unbound, rope


# Rows a rotary table keeps past the bundle's context (trim_rotary_tables): positions never reach the context's end
# (the KV buffer holds max_context), a margin all the same
ROTARY_SPARE_ROWS = 64
# where a rotary table is read: (domain, op type) -> the input indices of its cos and sin inputs (ONNX's own
# RotaryEmbedding, opset 23, takes them before the positions; onnxruntime's contrib one after)
_ROTARY_INPUTS = {("com.microsoft", "GroupQueryAttention"): (7, 8), ("com.microsoft", "RotaryEmbedding"): (2, 3),
                  ("", "RotaryEmbedding"): (1, 2)}


def trim_rotary_tables(g, rows: int) -> int:
    """The builder's rotary tables (cos and sin of every position of the model's whole context: 32,768 rows for the
    Qwen2.5 pair, 131,072 for Llama 3) cut to ``rows`` rows, in place, where every node reading them takes them as
    GroupQueryAttention's or RotaryEmbedding's cos/sin caches (indexed by position, which never reaches the bundle's
    context): ~21 MiB of the Qwen pair's resident weights at a 4,096-token context never read, and a config declaring
    10^7 positions made a 640 MB data file for a 0.5 MiB model (session 54, a review). An external table keeps its
    place in the data file, read up to its new length; an inline one is sliced. Returns the tables cut."""
    from onnx import TensorProto

    readers: dict[str, set] = {}
    for n in g.node:
        slots = _ROTARY_INPUTS.get(("" if n.domain == "ai.onnx" else n.domain, n.op_type))
        for i, name in enumerate(n.input):
            if name:
                readers.setdefault(name, set()).add(slots is not None and i in slots)
    size = {TensorProto.FLOAT: 4, TensorProto.FLOAT16: 2, TensorProto.BFLOAT16: 2}
    cut = 0
    for t in g.initializer:
        if readers.get(t.name) != {True} or len(t.dims) != 2 or t.dims[0] <= rows or t.data_type not in size:
            continue
        row = int(t.dims[1]) * size[t.data_type]
        if t.data_location == TensorProto.EXTERNAL:
            ext = {e.key: e for e in t.external_data}
            if "length" in ext and int(ext["length"].value) < rows * row:
                continue
            if "length" in ext:
                ext["length"].value = str(rows * row)
            else:
                t.external_data.add(key="length", value=str(rows * row))
        elif t.raw_data:
            t.raw_data = t.raw_data[: rows * row]
        else:
            continue  # (a table in typed fields: left whole)
        t.dims[0] = rows
        cut += 1
    return cut


def trim_empty_inputs(g) -> int:
    """Drop the trailing empty ("" : not given) inputs of every node, subgraphs included, in place; returns the
    nodes changed. The same graph by ONNX's rules (an optional input left off at the end is one not given), but
    an onnxruntime older than the builder checks a node's input count against its own schema: onnxruntime-genai
    0.18's GroupQueryAttention nodes carry 12 inputs, three of them trailing empties, and onnxruntime 1.22 (the
    version edgespec declares, JetPack 6's) refused the whole graph ("input size 12 not in range [min=7,
    max=11]")."""
    changed = 0
    for node in g.node:
        n = len(node.input)
        while n and node.input[n - 1] == "":
            n -= 1
        if n < len(node.input):
            del node.input[n:]
            changed += 1
        for a in node.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                changed += trim_empty_inputs(sub)
    return changed


def _branch_constants(branch) -> list | None:
    """The arrays a graph branch (an ``If``'s) outputs, each a ``Constant`` node's or an initializer; None where
    one is computed."""
    from onnx import helper, numpy_helper

    made = {n.output[0]: n for n in branch.node if n.op_type == "Constant" and len(n.output) == 1}
    inits = {t.name: t for t in branch.initializer}
    out = []
    for o in branch.output:
        if o.name in inits:
            out.append(numpy_helper.to_array(inits[o.name]))
        elif o.name in made and made[o.name].attribute and made[o.name].attribute[0].name == "value":
            out.append(numpy_helper.to_array(helper.get_attribute_value(made[o.name].attribute[0])))
        else:
            return None
    return out


def _per_position_rope(g, name: str) -> int:
    """LongRoPE (Phi-3.5-mini, Phi-4-mini): the builder's graph picks the rotary's cos/sin caches per call, the
    short factors' while the call's total length is at most the original context, the long factors' once it is
    more (an ``If`` on the attention mask's width). A call's rows then depend on the call: a verify call crossing
    the original context rotated its earlier rows by the long factors, where one-token calls had used the short
    ones, so speculative output was not plain decoding's. Here the caches become one, per position: the short
    factors' rows below the original context and the long factors' from it on (what transformers computes when it
    decodes token by token; a one-call prefill of a prompt longer than the original context there rotates all of it
    by the long factors, which the builder's graph did too and this one does not: such prompts get the short factors'
    rotary below the original context, as a reply that grew past it has). On graph ``g`` (in memory, file ``name``);
    returns the ``If`` nodes replaced (0: none)."""
    from onnx import numpy_helper

    rope = {n.input[i] for n in g.node if n.op_type == "GroupQueryAttention" for i in (7, 8) if len(n.input) > i}
    readers = _consumers(g)
    done, drop = 0, set()
    for n in g.node:
        if n.op_type != "If" or not set(n.output) & rope:
            continue
        branches = {a.name: _branch_constants(a.g) for a in n.attribute if a.name in ("then_branch", "else_branch")}
        if len(branches) != 2 or any(b is None or len(b) != len(n.output) for b in branches.values()):
            raise ExportError(f"{name}: the rotary caches' choice {n.name!r} is not two sets of constants; "
                              "the graph cannot be made exact across call widths")
        a, b = branches["then_branch"], branches["else_branch"]
        short, long_ = (a, b) if a[0].shape[0] < b[0].shape[0] else (b, a)
        s = short[0].shape[0]
        if any(x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1] or y.shape[0] <= s for x, y in zip(short, long_)):
            raise ExportError(f"{name}: the rotary caches of {n.name!r} are not short and long tables of "
                              "the same width")
        for out, x, y in zip(n.output, short, long_):  # (not ``name``: a later If's refusal names the file)
            g.initializer.append(numpy_helper.from_array(np.concatenate([x, y[s:]]).astype(y.dtype), out))
        drop.add(id(n))
        cond = n.input[0]
        done += 1
        if len(readers.get(cond, [])) == 1:  # (the comparison that chose, read by nothing else now)
            drop |= {id(p) for p in g.node if cond in p.output}
    if done:
        kept = [n for n in g.node if id(n) not in drop]
        del g.node[:]
        g.node.extend(kept)
    return done


def rewrite_graph(model_path: Path, pad_attention: bool, own_attention: bool = True,
                  logits: str | None = None, fused: bool = True, kv_dtype: str = "float32",
                  row_positions: bool = False, head_dim: int | None = None) -> dict:
    """Rewrite the graph file in place (atomically); returns counts of what changed. ``logits``: the
    graph's logits output, whose lm_head gets the ``SKIP_INPUT`` (``_skip_logits``). ``fused``: each
    SwiGLU (gate and up projections and the activation) one ``MatMulQ4`` node, and each bias ``Add``
    after one the kernel's (``swiglu_patterns``, ``bias_patterns``). ``kv_dtype`` float16: every
    attention ``DecodeAttentionF16`` over float16 caches (``_half_caches``; needs ``own_attention``;
    an ExportError where the graph does not allow it); auto: float16 where the graph allows it, else
    float32 (``why_not_half`` in the counts says why). ``row_positions``: edgespec's attention nodes
    take the rows' positions (``_row_positions``), so that a call can verify alternates."""
    from onnx import TensorProto, helper

    from .head import _read, _tensor, _write

    _check_kv_dtype(kv_dtype, own_attention)
    m = load_graph(model_path)
    g = m.graph
    base = model_path.parent
    inits = {t.name: t for t in g.initializer}
    users = input_uses(g)
    done = {"matmuls": 0, "kept": 0, "copied": 0, "attention": 0, "own_attention": 0, "logits_skip": 0,
            "swiglu": 0, "bias": 0, "half_caches": 0, "q8_caches": 0, "row_positions": 0, "minimums": 0, "kscales": 0,
            "packed_qkv": 0, "rope_per_position": 0}
    drop: set[str] = set()
    packed_as: dict[tuple, list[str]] = {}  # MatMulNBits weights -> their packed initializers
    # SwiGLU: the up projection's weights go into the gate's node (tiles interleaved: gate, up, gate, ...);
    # its node and the activation's three are removed
    # (nodes by position: the graph's nodes by their first output, unique, before any is renamed)
    at = {n.output[0]: i for i, n in enumerate(g.node) if n.output}
    swiglus = swiglu_patterns(g, inits) if fused else []
    fuse = {at[gate.output[0]]: (up, m2) for gate, up, sig, m1, m2 in swiglus}
    gone = {at[n.output[0]] for gate, up, sig, m1, m2 in swiglus for n in (up, sig, m1, m2)}
    bias = {at[mm.output[0]]: (add, b) for mm, add, b in (bias_patterns(g, inits) if fused else [])
            if at[mm.output[0]] not in gone}
    gone |= {at[add.output[0]] for add, _ in bias.values()}

    def weights(inputs, K, N, block, kquant=True):
        """The packed arrays of MatMulNBits weights ``inputs`` (B, scales[, zero points])."""
        arrs = [_read(inits[i], base) for i in inputs]
        return list(pack_q4(arrs[0], arrs[1], arrs[2] if len(arrs) > 2 else None, K, N, block, kquant))

    def add_packed(name, arr) -> str:
        """``arr`` as a new initializer ``name`` (uint8 weights and zero points, float32 scales)."""
        dt = {np.dtype(np.uint8): TensorProto.UINT8, np.dtype(np.float32): TensorProto.FLOAT}[arr.dtype]
        g.initializer.append(_tensor(name, arr, dt))
        return name

    def release(inputs):
        for old in inputs:
            users[old] -= 1
            if users[old] == 0:
                drop.add(old)

    for pos, node in enumerate(g.node):
        if node.op_type != "MatMulNBits" or node.domain != "com.microsoft" or pos in gone:
            continue
        attrs = _q4_attrs(node, inits)
        if attrs is None:
            done["kept"] += 1  # g_idx, bias, another width or computed weights: onnxruntime's op stays
            continue
        inputs = [i for i in node.input if i]
        K, N, block = int(attrs["K"]), int(attrs["N"]), int(attrs["block_size"])
        packed: list[str] = []  # pack_q4's arrays as initializers, in its order ("" for one it leaves out)
        names = inputs[1:] + ([f"{inputs[3]}_min", f"{inputs[3]}_kscales"] if _float_zero_points(node, inits) else [])
        extra = []
        if pos in fuse:
            up, m2 = fuse[pos]
            up_inputs = [i for i in up.input if i]
            pg, pu = weights(inputs[1:], K, N, block), weights(up_inputs[1:], K, N, block)
            if len(pg) != len(pu):  # one in Q4_K's scale bytes, the other not: both as float minimums
                pg, pu = weights(inputs[1:], K, N, block, False), weights(up_inputs[1:], K, N, block, False)
            for old, a, b in zip(names, pg, pu):  # [tiles, ...] each: gate tile t at 2t, up's at 2t + 1
                if a is None:  # (no zero points beside minimums)
                    packed.append("")
                    continue
                arr = np.ascontiguousarray(np.stack([a, b], axis=1).reshape((2 * a.shape[0],) + a.shape[1:]))
                # (the name unique even where two fusions shared gate weights)
                packed.append(add_packed(f"{old}_swiglu{done['swiglu']}_q4t", arr))
            release(up_inputs[1:])
            if any(users[old] for old in up_inputs[1:]):  # (the up projection's weights another op reads)
                done["copied"] += 1
            node.output[0] = m2.output[0]
            extra = [helper.make_attribute("swiglu", 1)]
            done["swiglu"] += 1
        elif tuple(inputs[1:]) in packed_as:  # the same weights as an earlier node: its packed copy
            packed = packed_as[tuple(inputs[1:])]
        else:
            packed = [add_packed(f"{old}_q4t", arr) if arr is not None else ""
                      for old, arr in zip(names, weights(inputs[1:], K, N, block))]
            packed_as[tuple(inputs[1:])] = packed
        # MatMulQ4's inputs: A, B, scales, zero points, bias, minimums, k-quant scales (pack_q4 gives all but A, bias)
        new_inputs = [inputs[0]] + [""] * 6
        for slot, name in zip((1, 2, 3, 5, 6), packed):
            new_inputs[slot] = name
        if pos in bias:  # the Add of the bias: the kernel's fifth input
            add, b = bias[pos]
            new_inputs[4] = b
            node.output[0] = add.output[0]
            done["bias"] += 1
        while not new_inputs[-1]:
            new_inputs.pop()
        done["minimums"] += len(new_inputs) > 5
        done["kscales"] += len(new_inputs) == 7
        release(inputs[1:])
        if any(users[old] for old in inputs[1:]):  # shared with another op (a tied embedding's gather):
            done["copied"] += 1                     # the originals stay for it, the kernel reads a copy
        node.op_type, node.domain = OP, DOMAIN
        del node.input[:]
        node.input.extend(new_inputs)
        del node.attribute[:]
        node.attribute.extend([helper.make_attribute(k, int(attrs[k])) for k in ("K", "N", "bits", "block_size")] + extra)
        done["matmuls"] += 1
    if gone:
        kept_nodes = [n for i, n in enumerate(g.node) if i not in gone]
        del g.node[:]
        g.node.extend(kept_nodes)
    _whole_caches(g)  # (a bundle exported before session 41's fix: no window-sized cache layout)
    done["rope_per_position"] = _per_position_rope(g, model_path.name)  # (a LongRoPE bundle exported before session 42)
    if done["rope_per_position"]:  # (its caches are initializers now, which edgespec's attention must find)
        inits.update({t.name: t for t in g.initializer})
    if own_attention or pad_attention:  # separate query, key and value inputs: one packed input
        done["rotary_folded"] = _fold_rotary(g, head_dim)
        done["packed_qkv"] = _pack_qkv(g)
    if own_attention:  # edgespec's attention, one query row computed alike at every width: no padding
        done["nope"] = _nope_rotary(g, head_dim)
        inits.update({t.name: t for t in g.initializer if t.name in (NOPE_COS, NOPE_SIN)})
        widths = _cache_widths(g)  # (each node's head size: its cache's, Gemma 4's global layers' wider)
        done["own_attention"] = sum(_own_attention(n, inits, widths.get(n.input[3], head_dim)
                                                   if len(n.input) > 3 else head_dim)
                                    for n in g.node if n.op_type == "GroupQueryAttention")
    gqa = [n for n in g.node if n.op_type == "GroupQueryAttention"]
    if kv_dtype != "float32" and own_attention:
        ours = [n for n in g.node if n.op_type == ATTENTION_OP and n.domain == DOMAIN]
        why_not_half = _why_not_half(g, gqa, ours)
        why_not = why_not_half or (_why_not_q8(g, ours, head_dim) if kv_dtype == "int8" else None)
        if why_not is None and kv_dtype == "int8":
            done["q8_caches"] = _half_caches(g, ours, q8=True)
        elif why_not_half is None and kv_dtype != "int8":
            done["half_caches"] = _half_caches(g, ours)
        elif kv_dtype in ("float16", "int8"):
            raise ExportError(f"{model_path.name}: no {kv_dtype} KV cache: {why_not}; use --kv-dtype "
                              + ("float16" if why_not_half is None else "float32"))
        else:
            done["why_not_half"] = why_not_half  # (the only entry that is text, and only where float32 stays)
    if pad_attention and not gqa and not done["own_attention"]:
        raise ExportError(f"{model_path.name}: no GroupQueryAttention to pad")
    if pad_attention and gqa:
        one = helper.make_tensor("edgespec_pad_one", TensorProto.INT32, [], [1])
        last = helper.make_tensor("edgespec_pad_last", TensorProto.INT64, [1], [-1])
        end = helper.make_tensor("edgespec_pad_end", TensorProto.INT64, [1], [2 ** 62])
        zero = helper.make_tensor("edgespec_pad_zero", TensorProto.INT64, [1], [0])
        axis = helper.make_tensor("edgespec_pad_axis", TensorProto.INT64, [1], [1])
        g.initializer.extend([one, last, end, zero, axis])
        before: dict[int, list] = {}  # id(attention node) -> new nodes to run before it
        after: dict[int, list] = {}  # ... and after it
        shifted = {}
        for i, n in enumerate(gqa):
            if n.input[1] or n.input[2]:
                raise ExportError(f"{model_path.name}: attention with separate key/value inputs is not padded")
            q = n.input[0]
            tail, qp = f"edgespec_pad/{i}/tail", f"edgespec_pad/{i}/query"
            pre = before.setdefault(id(n), [])
            pre += [helper.make_node("Slice", [q, last.name, end.name, axis.name], [tail]),
                    helper.make_node("Concat", [q, tail], [qp], axis=1)]
            n.input[0] = qp
            for slot in (5, 6):  # seqlens_k, total_sequence_length: one position more
                src = n.input[slot]
                if src not in shifted:
                    shifted[src] = f"edgespec_pad/{src}+1"
                    pre.append(helper.make_node("Add", [src, one.name], [shifted[src]]))
                n.input[slot] = shifted[src]
            out, wide = n.output[0], f"edgespec_pad/{i}/out"
            n.output[0] = wide
            after[id(n)] = [helper.make_node("Slice", [wide, zero.name, last.name, axis.name], [out])]
            done["attention"] += 1
        order = []
        for n in g.node:
            order += before.get(id(n), []) + [n] + after.get(id(n), [])
        del g.node[:]
        g.node.extend(order)
    if not done["matmuls"]:
        raise ExportError(f"{model_path.name} has no 4-bit MatMulNBits: exact-kernels applies to INT4 bundles")
    if logits:
        done["logits_skip"] = int(_skip_logits(g, logits))
    if row_positions and not gqa:  # (onnxruntime's attention left in a layer would read alternates' rows as causal
        done["row_positions"] = _row_positions(g)  # ones at the next positions: no alternates then)
    if not any(o.domain == DOMAIN for o in m.opset_import):
        m.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    kept = [t for t in g.initializer if t.name not in drop]
    del g.initializer[:]
    g.initializer.extend(kept)
    done["features"] = kernel_features(g, head_dim)  # (a list, as why_not_half's text, not a count)
    _write(m, model_path, base)  # the packed weights in place of the old, one data file, atomically
    return done


SAMPLE = ("def mean(values):\n    \"\"\"Return the arithmetic mean of a non-empty list.\"\"\"\n"
          "    return sum(values) / len(values)\n\nThe meeting moved to Tuesday at ten; bring the "
          "quarterly report and the budget for the new warehouse.")


def compare_with_source(source, rewritten, ids: list[int]) -> dict:
    """Both graphs of a role (``ModelSpec``) run on the same token ``ids`` on the CPU: the largest
    |logit difference|, its scale, and how often the argmax agrees. Both round activations to int8
    per block, so they agree but for near-ties (a layout bug agrees almost nowhere)."""
    from edgespec.onnx_lm import OnnxLM
    from edgespec.providers import choose

    # as many of ``ids`` as both contexts hold (a bundle of --max-context 48 failed its rewrite, "25 + 26 tokens
    # exceed the context of 48", on the 51-token sample; session 49, a review)
    room = min(spec.max_context - spec.attention_pad for spec in (source, rewritten))
    ids = list(ids)[:max(2, room)]
    tokens = len(ids)
    out = []
    policy = None
    for spec in (source, rewritten):
        # the rewritten graph with the runtime's width probe (the path users run): edgespec's kernels compute a row
        # alike at every width, so it finds (1, 1) ("width_policy" below); the source as every call of the comparison
        lm = OnnxLM(spec, min(spec.max_context - spec.attention_pad, 4 * tokens), choose(["cpu"]),
                    min_width=None if spec is rewritten else 1)
        if spec is rewritten and lm.width_seconds:  # (None: a context too short for the probe, nothing measured)
            policy = (lm.min_width, lm.width_multiple)
        out.append(np.concatenate([lm.forward(ids[:tokens // 2]), lm.forward(ids[tokens // 2:])]))
        del lm
    a, b = out
    return {"max_abs_logit_diff": float(np.abs(a - b).max()), "logit_scale": float(np.abs(a).max()),
            "top1_agreement": float((a.argmax(-1) == b.argmax(-1)).mean()), "positions": tokens,
            "width_policy": list(policy) if policy else None}


def apply_to_bundle(bundle: str | os.PathLike, out: str | os.PathLike | None = None, *, force: bool = False,
                    log=None, own_attention: bool = True, kv_dtype: str | None = None) -> Path:
    """Rewrite the INT4 ``bundle`` in place or into the new bundle directory ``out`` (atomically).
    ``own_attention``: edgespec.DecodeAttention in place of onnxruntime's GroupQueryAttention (else
    the target's attention is padded to two or more query rows). ``kv_dtype`` float16 (the default
    with ``own_attention`` since session 23): the KV caches of the rewritten graphs float16
    (edgespec.DecodeAttentionF16): half their memory and of the bytes a decode call's attention
    reads; float32 (the default without) keeps them as the builder made them. Left to its default, a
    graph whose caches cannot be float16 (an attention variant edgespec's op does not compute, a
    cache another node reads) keeps float32 ones and the log says why; asked for, float16 is then an
    ExportError. One rewrite of a bundle at a time (``output.rewriting``)."""
    from .output import rewriting

    with rewriting(bundle, out):
        return _rewrite_bundle(bundle, out, force, log, own_attention, kv_dtype)


def _rewrite_bundle(bundle, out, force, log, own_attention, kv_dtype) -> Path:
    from edgespec.tokenizer import Tokenizer

    from .bundle import measured_sizes
    from .head import _rerooted, head_files, staged_rewrite

    if kv_dtype is None:  # float16 where a graph allows it (else float32, said in the log)
        kv_dtype = "auto" if own_attention else "float32"
    _check_kv_dtype(kv_dtype, own_attention)  # (before the bundle is read)
    src = Path(bundle)
    manifest = load_manifest(src)  # a missing or broken bundle: BundleError (exit 2), as everywhere
    if manifest.target.kernels == "edgespec-q4":
        raise ExportError(f"{src} already uses edgespec's kernels")
    if manifest.target.precision != "int4":  # (said before the bundle is copied: a GB of fp32 copied, then refused)
        raise ExportError(f"{src} has a {manifest.target.precision} target: exact-kernels applies to INT4 bundles")
    acc = manifest.target.quant.accuracy_level
    if acc is not None and acc != 4:
        raise ExportError(f"{src} is quantized for MatMulNBits accuracy level {acc}; edgespec's INT4 kernel computes "
                          "as level 4 does (int8 activations): export with --accuracy-level 4")
    if manifest.target.layout != "cpu":
        raise ExportError(f"{src} is exported in the {manifest.target.layout} layout; edgespec's INT4 kernel is "
                          "for the CPU layout")
    if kv_dtype == "int8" and manifest.assistant is not None:
        raise ExportError(f"{src} has a multi-token-prediction assistant, which reads the target's caches as float16 "
                          "or float32: use --kv-dtype float16")
    sample_ids = Tokenizer.of(manifest).encode(SAMPLE)[:64]

    def build(stage: Path):
        m = replace(manifest, root=stage, tokenizer_dir=stage / manifest.relative(manifest.tokenizer_dir),
                    assistant=_rerooted(manifest.assistant, manifest.root, stage))
        for role in ("target", "drafter"):
            spec = getattr(manifest, role)
            if spec is None:
                continue
            spec = _rerooted(spec, manifest.root, stage)
            if role == "drafter" and spec.layout != "cpu":  # (float16 activations: edgespec's CPU kernels take float32)
                if log:
                    log(f"    drafter: left as it is (exported in the {spec.layout} layout, for onnxruntime's kernels)")
                m = replace(m, drafter=spec)
                continue
            dtype = kv_dtype
            if dtype == "int8" and role == "drafter" and not spec.heads_take_int8:
                dtype = "auto"  # (the target's caches int8, a drafter whose heads cannot be: float16)
                if log:
                    log(f"    drafter: head size {spec.head_dim} is not a multiple of {Q8_GROUP}: its KV caches "
                        "float16, not int8")
            try:
                counts = rewrite_graph(spec.path, pad_attention=role == "target", own_attention=own_attention,
                                       logits=spec.io.logits, kv_dtype=dtype, row_positions=role == "target",
                                       head_dim=spec.head_dim)
                pad = 1 if counts["attention"] else 0
            except ExportError as e:
                if role == "target":
                    raise
                if log:
                    log(f"    drafter: left as it is ({e})")
                m = replace(m, drafter=spec)
                continue
            if log:
                log(f"    {role}: {counts['matmuls'] + counts['swiglu']} MatMulNBits -> {counts['matmuls']} {DOMAIN}.{OP}"
                    + (f" ({counts['swiglu']} SwiGLU gate and up pairs as one)" if counts["swiglu"] else "")
                    + (f", {counts['bias']} biases added in the kernel" if counts["bias"] else "")
                    + (f", {counts['minimums']} with a float minimum per block (a GGUF's or HQQ's; {counts['kscales']} "
                       "in Q4_K's scale bytes)" if counts["minimums"] else "")
                    + (f", {counts['kept']} kept" if counts["kept"] else "")
                    + (f" ({counts['copied']} with a packed copy of weights another op shares)" if counts["copied"] else "")
                    + (f"; {counts['rotary_folded']} attention nodes given their rotary (its RotaryEmbedding "
                       "nodes before them folded in)" if counts.get("rotary_folded") else "")
                    + (f"; {counts['nope']} attention nodes without a rotary given an identity one (edgespec's "
                       "attention always rotates)" if counts.get("nope") else "")
                    + (f"; {counts['packed_qkv']} attention nodes' query, key and value packed into one input"
                       if counts["packed_qkv"] else "")
                    + ("; LongRoPE's short and long rotary caches made one, per position" if counts["rope_per_position"]
                       else "")
                    + (f"; {counts['own_attention']} GroupQueryAttention -> {DOMAIN}.{ATTENTION_OP}"
                       if counts["own_attention"] else "")
                    + (f"; {counts['attention']} attention nodes padded to two or more query rows" if pad else "")
                    + (f"; {counts['half_caches']} KV caches float16" if counts["half_caches"] else "")
                    + (f"; {counts['q8_caches']} KV caches int8 (a float32 scale per 32 lanes)"
                       if counts["q8_caches"] else "")
                    + (f"; KV caches kept float32 ({counts['why_not_half']})" if "why_not_half" in counts else "")
                    + ("; a prefill computes its last position's logits only"
                       if counts["logits_skip"] or spec.io.logits_skip else "")
                    + ("; a call can verify alternates (rows' positions)" if counts["row_positions"] else ""))
            ops = dict(spec.operators)
            ops.pop("MatMulNBits", None)
            if counts["kept"]:
                ops["MatMulNBits"] = counts["kept"]
            ops[OP] = counts["matmuls"]
            if counts["own_attention"]:
                left = ops.pop("GroupQueryAttention", 0) - counts["own_attention"]
                if left > 0:
                    ops["GroupQueryAttention"] = left
                ops[ATTENTION_OP_Q8 if counts["q8_caches"] else ATTENTION_OP_F16 if counts["half_caches"]
                    else ATTENTION_OP] = counts["own_attention"]
            gcfg = spec.path.parent / "genai_config.json"
            if gcfg.exists():  # onnxruntime-genai cannot run edgespec's operator
                gcfg.unlink()
            files = head_files(stage, spec.path.parent.relative_to(stage).as_posix())
            on_disk = sum(v["bytes"] for v in files.values())
            if counts["packed_qkv"]:
                ops["Concat"] = ops.get("Concat", 0) + counts["packed_qkv"]
            if counts["logits_skip"] or spec.io.logits_skip:  # (the export's since session 29)
                ops["Slice"] = ops.get("Slice", 0) + 1
            io = replace(spec.io, logits_skip=SKIP_INPUT) if counts["logits_skip"] else spec.io
            if counts["row_positions"]:
                io = replace(io, row_positions=POSITIONS_INPUT)
            spec = replace(spec, files=files, bytes_on_disk=on_disk, gpu_weight_bytes=on_disk, kernels="edgespec-q4",
                           kernel_features=tuple(counts["features"]), attention_pad=pad, operators=ops, io=io,
                           kv_dtype="int8" if counts["q8_caches"] else "float16" if counts["half_caches"]
                           else spec.kv_dtype)
            # each matrix's tiles against the source's blocks (session 49's review: two layers' weights swapped
            # passed the logits' comparison below; repacking loses nothing, so they agree to float rounding)
            weights = check_rewrite(getattr(manifest, role).path, spec.path)
            if log:
                log(f"    {role}: {weights.checked} matrices' tiles against the source graph's blocks: the worst "
                    f"relative difference {weights.worst:.3g}"
                    + (f"; {len(weights.unmapped)} not found in it" if weights.unmapped else ""))
            if not weights.checked:
                raise ExportError(f"the rewritten {role}'s weights: no {OP} found beside a MatMulNBits of its name in "
                                  "the source graph, nothing to compare: not written")
            if not weights.passed:
                name, _, err, _ = weights.failed[0]
                raise ExportError(f"the rewritten {role}'s weights differ from its source graph's at {name} (relative "
                                  f"difference {err:.3g}" + (f", and {len(weights.failed) - 1} more" if
                                                             len(weights.failed) > 1 else "") + "): not written")
            check = compare_with_source(getattr(manifest, role), spec, sample_ids)
            if log:
                log(f"    {role}: against the source graph on {check['positions']} positions: max |Δlogit| "
                    f"{check['max_abs_logit_diff']:.3g} (logits up to {check['logit_scale']:.3g}), top-1 agreement "
                    f"{check['top1_agreement']:.3f}")
            if check["top1_agreement"] < 0.75 or not np.isfinite(check["max_abs_logit_diff"]):
                raise ExportError(f"the rewritten {role} disagrees with its source graph (top-1 agreement "
                                  f"{check['top1_agreement']:.2f}): not written")
            # (session 49's review: a rewrite whose one-token calls were broken passed the check above, its calls ~25
            # rows wide, and the runtime's probe then kept two tokens a call, silently: a target of edgespec's kernels
            # alone computes a row alike at every width, so anything but one token a call is a broken rewrite; a
            # drafter's width changes no output, and one that keeps onnxruntime's attention unpadded is not alike)
            mw, mult = check.pop("width_policy") or (1, 1)
            if (mw, mult) != (1, 1) and role == "target" and width_invariant_spec(spec):
                raise ExportError(f"the rewritten {role} computes a row otherwise at some call widths (the width probe "
                                  f"keeps {mw} tokens a call{f', multiples of {mult}' if mult != 1 else ''}), where "
                                  "edgespec's kernels compute it alike at every width: not written")
            spec = replace(spec, kernels_check=check)
            if log:
                log(f"    {role}: measuring its resident memory on the CPU EP")
            spec = replace(spec, **measured_sizes(stage, role, spec.to_dict(stage), log=log))
            m = replace(m, **{role: spec})
        if m.assistant is not None and m.target.kv_dtype != manifest.target.kv_dtype:
            from .mtp import assistant_files, retype_kv

            retype_kv(m.assistant.path, m.target.kv_dtype)  # (it reads the target's caches as they are)
            files = assistant_files(stage)
            m = replace(m, assistant=replace(m.assistant, files=files,
                                             bytes_on_disk=sum(v["bytes"] for v in files.values())))
            if log:
                log(f"    assistant: reads the target's {m.target.kv_dtype} KV caches")
        return m

    return staged_rewrite(src, out, force, build)
