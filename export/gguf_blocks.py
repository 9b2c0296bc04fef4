"""A GGUF file's 4-bit weights as they are stored (``--quant-algo gguf``): the integers with their
scales and minimums, so an export keeps the file's own rounding instead of quantizing its dequantized
weights a second time.

* ``Q4_0``: blocks of 32, ``w = d * (q - 8)``: a float scale ``d`` and the minimum ``8d``;
* ``Q4_1``: blocks of 32, ``w = d * q + m``: the scale ``d`` and the minimum ``-m``;
* ``Q4_K``: super-blocks of 256 weights, 8 blocks of 32, each ``w = d*sc * q - dmin*m`` with ``q`` in
  0..15 and 6-bit ``sc``, ``m``: per block of 32 a float scale ``d*sc`` and a float minimum ``dmin*m``
  (both exact in float32: a float16 times a 6-bit integer);
* ``Q6_K``: super-blocks of 256, 16 blocks of 16, ``w = d*sc * (q - 32)`` with ``q`` in 0..63 and an
  int8 ``sc``: per block of 16 a float scale ``d*sc`` (exact in float32) and the offset 32.

Q6_K is decoded (its 6-bit integers are exact as 8-bit weights with zero point 32, for an 8-bit path
edgespec's kernel does not have yet) but the export rounds it to 4 bits like every type not in ``KEPT``.

Layouts as ggml defines them (``block_q4_K``, ``block_q6_K``) and the ``gguf`` package decodes them.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

QK_K = 256


@dataclass
class KQuant:
    """One weight matrix ``[N, K]`` (N output rows of K inputs, blocks along K) as integers ``q``
    (uint8 ``[N, K]``), a float32 ``scale`` per (row, block) ``[N, K/block]`` and either a float32
    ``minimum`` per (row, block) (Q4_K: ``w = scale*q - minimum``) or an integer ``offset`` (Q6_K:
    ``w = scale*(q - offset)``)."""
    kind: str
    q: np.ndarray
    scale: np.ndarray
    block: int
    bits: int
    minimum: np.ndarray | None = None
    offset: int = 0

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape

    def dequantize(self) -> np.ndarray:
        N, K = self.q.shape
        q = self.q.reshape(N, K // self.block, self.block).astype(np.float32)
        if self.minimum is not None:
            w = self.scale[..., None] * q - self.minimum[..., None]
        else:
            w = self.scale[..., None] * (q - np.float32(self.offset))
        return w.reshape(N, K)


def _q4k_scale_min(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``get_scale_min_k4`` for every block: 12 bytes -> 8 6-bit scales and 8 6-bit minimums."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def q4_k(raw: np.ndarray, N: int, K: int) -> KQuant:
    """``Q4_K`` rows (``raw``: the tensor's bytes, ``N * K/256 * 144``) as ``KQuant`` (block 32)."""
    if K % QK_K:
        raise ValueError(f"Q4_K rows of {K} weights are not whole super-blocks of {QK_K}")
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(N * (K // QK_K), 144)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)            # [nb, 1]
    dmin = b[:, 2:4].copy().view(np.float16).astype(np.float32)
    sc, mn = _q4k_scale_min(b[:, 4:16])                                  # [nb, 8]
    qs = b[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    q = (qs & 0x0F).reshape(N, K)                                       # 64 weights per 32 bytes: lows, then highs
    scale = (d * sc.astype(np.float32)).reshape(N, K // 32)
    minimum = (dmin * mn.astype(np.float32)).reshape(N, K // 32)
    return KQuant("Q4_K", np.ascontiguousarray(q), scale, 32, 4, minimum=minimum)


def q6_k(raw: np.ndarray, N: int, K: int) -> KQuant:
    """``Q6_K`` rows (``raw``: ``N * K/256 * 210`` bytes) as ``KQuant`` (block 16, offset 32)."""
    if K % QK_K:
        raise ValueError(f"Q6_K rows of {K} weights are not whole super-blocks of {QK_K}")
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(N * (K // QK_K), 210)
    ql = b[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    ql = (ql & 0x0F).reshape(-1, 2, 128)
    qh = b[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 4, 1)
    qh = (qh & 0x03).reshape(-1, 2, 128)
    q = (ql | (qh << 4)).reshape(N, K)
    sc = b[:, 192:208].copy().view(np.int8).astype(np.float32)          # [nb, 16]
    d = b[:, 208:210].copy().view(np.float16).astype(np.float32)
    scale = (d * sc).reshape(N, K // 16)
    return KQuant("Q6_K", np.ascontiguousarray(q), scale, 16, 6, offset=32)


def _q4_legacy(raw: np.ndarray, N: int, K: int, with_min: bool) -> KQuant:
    size = 20 if with_min else 18
    if K % 32:
        raise ValueError(f"rows of {K} weights are not whole blocks of 32")
    b = np.ascontiguousarray(raw, dtype=np.uint8).reshape(N * (K // 32), size)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)[:, 0]
    qs = b[:, size - 16:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).reshape(N, K)  # weights j and j + 16 share byte j
    if with_min:
        minimum = -b[:, 2:4].copy().view(np.float16).astype(np.float32)[:, 0]
    else:
        minimum = np.float32(8) * d
    return KQuant("Q4_1" if with_min else "Q4_0", np.ascontiguousarray(q), d.reshape(N, K // 32), 32, 4,
                  minimum=minimum.reshape(N, K // 32).astype(np.float32))


def q4_0(raw: np.ndarray, N: int, K: int) -> KQuant:
    """``Q4_0`` rows (``N * K/32 * 18`` bytes) as ``KQuant`` (block 32)."""
    return _q4_legacy(raw, N, K, False)


def q4_1(raw: np.ndarray, N: int, K: int) -> KQuant:
    """``Q4_1`` rows (``N * K/32 * 20`` bytes) as ``KQuant`` (block 32)."""
    return _q4_legacy(raw, N, K, True)


DECODERS = {"Q4_0": q4_0, "Q4_1": q4_1, "Q4_K": q4_k, "Q6_K": q6_k}
KEPT = ("Q4_0", "Q4_1", "Q4_K")  # 4-bit blocks of 32 with a scale and a minimum: kept as they are


def min_max_4bit(w: np.ndarray, block: int = 32) -> KQuant:
    """Float weights ``[N, K]`` as 4-bit blocks with a float scale and minimum each (round to nearest
    between the block's own minimum and maximum: no zero point to round, as Q4_1 does): how
    ``--quant-algo gguf`` holds a tensor the file stores in another type (Q6_K, Q5_0, Q8_0, F16, F32)."""
    N, K = w.shape
    b = np.asarray(w, np.float32).reshape(N, K // block, block)
    lo, hi = b.min(-1), b.max(-1)
    scale = ((hi - lo) / np.float32(15)).astype(np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))
    q = np.clip(np.rint((b - lo[..., None]) / safe[..., None]), 0, 15).astype(np.uint8)
    return KQuant("min-max", q.reshape(N, K), scale, block, 4, minimum=(-lo).astype(np.float32))


def six_bit_multiples(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's code for a super-block's 8 scales (or minimums), ``v [..., 8]`` >= 0: a float16 ``d`` (as float32,
    ``[...]``), the largest over 63 as llama.cpp's quantizer makes it, and each value's multiple of it
    ``rint(v / d)`` (float, not clipped: 63 for the largest). Quantizing (``k4_blocks``) and recovering the
    bytes from float scales (``export/kernels.py``, ``kquant_scales``) both read them so."""
    d = (v.max(-1) / np.float32(63)).astype(np.float16).astype(np.float32)
    return d, np.rint(v / np.where(d > 0, d, np.float32(1))[..., None])


def fit_scale_min(b: np.ndarray, nstep: int = 20, rmin: float = -1.0, rdelta: float = 0.1):
    """llama.cpp's fit of a 4-bit block's scale and minimum (``make_qkx2_quants`` as ``quantize_row_q4_K_ref``
    calls it), vectorized over blocks ``b [..., 32]``: each weight weighted by ``rms(block) + |x|``; the block's
    range (its minimum no more than 0) gives the first grid; then each of ``nstep + 1`` trials rounds the block
    with the inverse scale ``(15 + rmin + rdelta * i) / (max - min)`` from the best minimum so far (as the C code
    does: its ``min`` is updated by a winning trial), fits the scale and minimum of those integers by weighted
    least squares (a minimum above 0 set to 0, the scale refitted), and keeps them when their weighted squared
    error is lower. A block whose maximum is its (clamped) minimum gets scale 0. Returns (scale, minimum)
    ``[...]``, float32, the minimum as Q4_K stores it (``-min``: w = scale * q - minimum). Tested against a
    scalar transcription of the C function (tests/test_gguf_blocks.py)."""
    b = np.asarray(b, np.float32)
    w = np.sqrt((b * b).mean(-1, keepdims=True)) + np.abs(b)
    lo, hi = np.minimum(b.min(-1), 0), b.max(-1)
    flat = hi <= lo
    sum_w, sum_x = w.sum(-1), (w * b).sum(-1)

    def grid(iscale, mn):  # nearest_int(iscale * (x - min)) clamped to 0..15; 0 where iscale is no number
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            v = iscale[..., None] * (b - mn[..., None])
            return np.where(v > 0, np.rint(np.minimum(v, np.float32(15))), np.float32(0)).astype(np.float32)

    def error(scale, mn, q):
        return (w * (scale[..., None] * q + mn[..., None] - b) ** 2).sum(-1)

    with np.errstate(invalid="ignore", divide="ignore"):
        span = np.where(flat, np.float32(1), hi - lo)
        scale, mn = span / np.float32(15), lo.copy()
        best = error(scale, mn, grid(np.float32(15) / span, lo))
        for i in range(nstep + 1):
            q = grid(np.float32(15 + rmin + rdelta * i) / (hi - mn), mn)
            sum_l, sum_l2, sum_xl = (w * q).sum(-1), (w * q * q).sum(-1), (w * q * b).sum(-1)
            D = sum_w * sum_l2 - sum_l * sum_l
            ok = (D > 0) & ~flat
            Ds = np.where(ok, D, np.float32(1))
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / Ds
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / Ds
            pos = this_min > 0
            this_min = np.where(pos, np.float32(0), this_min)
            this_scale = np.where(pos, sum_xl / np.where(sum_l2 > 0, sum_l2, np.float32(1)), this_scale)
            err = error(this_scale, this_min, q)
            take = ok & (err < best)
            best = np.where(take, err, best)
            scale, mn = np.where(take, this_scale, scale), np.where(take, this_min, mn)
    scale = np.where(flat, np.float32(0), scale)
    return np.maximum(scale, 0).astype(np.float32), np.maximum(-mn, 0).astype(np.float32)


def six_bit_bytes(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``quantize_row_q4_K_ref``'s code for a super-block's 8 fitted scales (or minimums) ``v [..., 8]`` >= 0: the
    float16 ``d = max / 63`` (as float32, ``[...]``) and each value's byte ``nearest_int(63 / max * v)`` (at most
    63), as llama.cpp computes them (not ``v / d``: that differs wherever ``d``'s float16 rounding moves a value
    across a half)."""
    v = np.asarray(v, np.float32)
    top = v.max(-1)
    inv = np.where(top > 0, np.float32(63) / np.where(top > 0, top, np.float32(1)), np.float32(0))
    d = (top / np.float32(63)).astype(np.float16).astype(np.float32)
    return d, np.minimum(np.rint(inv[..., None] * v), 63).astype(np.float32)


_native: list = []  # [kquant.cpp's es_quantize_q4_k, or None where it cannot be built], once per process


def native_q4k():
    """``kquant.cpp`` (llama.cpp's Q4_K quantizer transcribed) through ctypes, built on first use with
    edgespec's kernel build; None where it cannot be built (no compiler): ``k4_blocks`` then fits in numpy."""
    if not _native:
        import ctypes
        from pathlib import Path

        from edgespec.errors import ProviderError
        from edgespec.native import _build

        try:
            fn = ctypes.CDLL(_build(Path(__file__).with_name("kquant.cpp"), "libedgespec_kquant",
                                    "the Q4_K quantizer (export)")).es_quantize_q4_k
            fn.restype = None
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.c_void_p, ctypes.c_int]
        except (ProviderError, OSError, AttributeError):
            fn = None
        _native.append(fn)
    return _native[0]


def k4_blocks(w: np.ndarray, rows: int = 4096, fit: bool = True, native: bool = True) -> KQuant:
    """Float weights ``[N, K]`` (K a multiple of 256) as llama.cpp's Q4_K quantizer (``quantize_row_q4_K_ref``)
    writes them: blocks of 32 with a scale and a minimum each, fitted by ``make_qkx2_quants``, both then 6-bit
    bytes under a float16 per super-block of 256 (``six_bit_bytes``: the largest 63); then each weight rounded to
    its block's grid. The same bytes per weight as the file's Q4_K tensors, in the format edgespec's kernel
    reads in Q4_K's scale bytes (export/kernels.py, kquant_scales). By ``kquant.cpp`` (the C function
    transcribed: llama.cpp's bytes; ~3x numpy's speed on 2 cores) where it builds, else in numpy (``fit_scale_min``,
    ``rows`` at a time: the same fit, its sums in numpy's order); ``fit=False``: each block's own range
    instead of the fit (session 35's rounding, for comparisons)."""
    N, K = w.shape
    if K % 256:
        raise ValueError(f"k4_blocks: K must be a multiple of 256 (Q4_K's super-blocks), got {K}")
    fn = native_q4k() if fit and native else None
    if fn is not None:
        from edgespec.api import _cores

        x = np.ascontiguousarray(w, np.float32)
        scale = np.empty((N, K // 32), np.float32)
        minimum = np.empty((N, K // 32), np.float32)
        q = np.empty((N, K), np.uint8)
        fn(x.ctypes.data, N, K, scale.ctypes.data, minimum.ctypes.data, q.ctypes.data, _cores())
        return KQuant("k4", q, scale, 32, 4, minimum=minimum)
    b = np.asarray(w, np.float32).reshape(N, K // 32, 32)

    def min_max(x):
        lo = np.minimum(x.min(-1), 0)
        return ((x.max(-1) - lo) / np.float32(15)).astype(np.float32), (-lo).astype(np.float32)

    fits = [(fit_scale_min if fit else min_max)(b[i:i + rows]) for i in range(0, N, rows)]
    per = []
    for v in (np.concatenate([f[0] for f in fits]), np.concatenate([f[1] for f in fits])):
        d, byte = six_bit_bytes(v.reshape(N, K // 256, 8))
        per.append((d[..., None] * byte).reshape(N, K // 32))
    scale, minimum = per
    safe = np.where(scale > 0, scale, np.float32(1))
    q = np.clip(np.rint((b + minimum[..., None]) / safe[..., None]), 0, 15).astype(np.uint8)
    q[scale == 0] = 0
    return KQuant("k4", q.reshape(N, K), scale, 32, 4, minimum=minimum)


def four_bit_blocks(w: np.ndarray) -> KQuant:
    """Float weights ``[N, K]`` as 4-bit blocks of 32 with a minimum: Q4_K's (``k4_blocks``) where K is a multiple
    of 256, else ``min_max_4bit``'s (how ``--quant-algo gguf`` rounds a tensor of another type, and ``q4_k``
    every weight)."""
    return k4_blocks(w) if w.shape[1] % 256 == 0 else min_max_4bit(w)


def tensor_quant(t) -> KQuant:
    """A ``gguf`` reader tensor ``[K, N]`` (GGUF lists the inner dimension first) as 4-bit ``KQuant``:
    its own blocks where its type is one of ``KEPT``, else its dequantized weights as ``four_bit_blocks``."""
    from gguf.quants import dequantize

    K, N = (int(x) for x in t.shape[:2])
    kind = t.tensor_type.name
    if kind in KEPT:
        return DECODERS[kind](np.asarray(t.data), N, K)
    w = dequantize(np.asarray(t.data), t.tensor_type).reshape(N, K).astype(np.float32)
    return four_bit_blocks(w)


def permute_rows(kq: KQuant, order: np.ndarray) -> KQuant:
    """``kq`` with its rows (output features) in ``order``: exact, blocks run along K."""
    return KQuant(kq.kind, kq.q[order], kq.scale[order], kq.block, kq.bits,
                  None if kq.minimum is None else kq.minimum[order], kq.offset)


def concat_rows(parts: list[KQuant]) -> KQuant:
    """Row-wise concatenation (a fused q/k/v or gate/up projection); every part 4-bit with minimums."""
    if len(parts) == 1:
        return parts[0]
    return KQuant("+".join(p.kind for p in parts), np.concatenate([p.q for p in parts]),
                  np.concatenate([p.scale for p in parts]), parts[0].block, 4,
                  np.concatenate([p.minimum for p in parts]))


def float_zero_points(kq: KQuant) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``kq`` (4-bit blocks with minimums) as MatMulNBits' numbers before packing: integers ``[N, K]``, scales
    and float zero points ``[N, K/block]`` (``w = (q - zp) * scale``, zp = minimum / scale). A block of scale 0
    holds the constant ``-minimum``: q 0, zero point 1 (0 where the minimum is 0 too), scale the minimum."""
    N, K = kq.shape
    q = kq.q.reshape(N, K // kq.block, kq.block).copy()
    scale = kq.scale.astype(np.float32).copy()
    mn = kq.minimum.astype(np.float32)
    flat = scale == 0
    q[flat] = 0
    zp = np.where(flat, np.float32(1), mn / np.where(flat, np.float32(1), scale)).astype(np.float32)
    scale[flat] = mn[flat]
    zp[flat & (mn == 0)] = 0
    return q.reshape(N, K), scale, zp


def matmulnbits_arrays(kq: KQuant) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """MatMulNBits' 4-bit arrays for ``kq`` (blocks of 32 with minimums): B ``[N, K/32, 16]``, scales
    ``[N * K/32]`` and float zero points ``[N * K/32]`` (``float_zero_points``, packed)."""
    N, K = kq.shape
    q, scale, zp = float_zero_points(kq)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(N, K // 32, 16)
    return np.ascontiguousarray(packed), scale.reshape(-1), zp.reshape(-1)


# the model builder's projection names -> the GGUF tensors they hold, rows in this order
PROJECTIONS = {"q_proj": ("attn_q",), "k_proj": ("attn_k",), "v_proj": ("attn_v",),
               "qkv_proj": ("attn_q", "attn_k", "attn_v"), "o_proj": ("attn_output",),
               "gate_proj": ("ffn_gate",), "up_proj": ("ffn_up",), "gate_up_proj": ("ffn_gate", "ffn_up"),
               "down_proj": ("ffn_down",)}


def gguf_tensors_of(node_name: str, tensors: dict) -> list[str] | None:
    """The GGUF tensor names the builder's MatMulNBits ``node_name`` holds (rows concatenated in this
    order), or None where the node is no projection this mapping knows."""
    import re

    if node_name.startswith("/lm_head/"):
        name = "output.weight" if "output.weight" in tensors else "token_embd.weight"
        return [name] if name in tensors else None
    m = re.match(r"/model/layers\.(\d+)/\w+/(\w+)/MatMul", node_name)
    if not m or m.group(2) not in PROJECTIONS:
        return None
    names = [f"blk.{m.group(1)}.{p}.weight" for p in PROJECTIONS[m.group(2)]]
    return names if all(n in tensors for n in names) else None


def _llama_rows(n: int, heads: int) -> np.ndarray:
    """The row order transformers gives a llama GGUF's attn_q/attn_k (llama.cpp's converter interleaves
    each head's rotary halves; ``reverse_permute_weights`` undoes it): row i of the result is row
    ``order[i]`` of the file."""
    dim = n // heads // 2
    return np.arange(n).reshape(heads, dim, 2).swapaxes(2, 1).reshape(n)


def apply_to_graph(model_path, gguf_path, arch: str, heads: int, kv_heads: int, log=None) -> dict:
    """Replace the 4-bit MatMulNBits weights of the builder's graph ``model_path`` (exported from
    ``gguf_path`` at block 32) by the file's own blocks (``tensor_quant``), in place; each checked
    against the builder's (a wrong mapping is an ExportError, not a model that talks nonsense).
    Weights another node shares (a tied embedding's table) stay as the builder wrote them. Returns
    counts: ``kept`` (tensors whose blocks were kept), ``requantized`` (other types rounded: ``k4_blocks``
    or ``min_max_4bit``), ``nodes`` replaced, ``left`` (nodes left as the builder made them)."""
    from pathlib import Path

    import gguf
    from onnx import TensorProto, helper

    from edgespec.errors import ExportError

    from .head import _read, _tensor, _write
    from .kernels import input_uses
    from .output import load_graph

    model_path = Path(model_path)
    base = model_path.parent
    reader = gguf.GGUFReader(str(gguf_path))
    tensors = {t.name: t for t in reader.tensors}
    m = load_graph(model_path)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    users = input_uses(g)
    counts = {"nodes": 0, "left": 0, "kept": 0, "requantized": 0}
    drop = set()
    for n in g.node:
        if n.op_type != "MatMulNBits" or n.domain != "com.microsoft":
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        names = gguf_tensors_of(n.name, tensors)
        inputs = [i for i in n.input]
        # (an inner size not of whole blocks, from a float tensor: left as the builder rounded it; its blocks'
        # reshape was a traceback; session 56, a review)
        if (names is None or attrs.get("bits", 4) != 4 or attrs["block_size"] != 32 or int(attrs["K"]) % 32
                or len(inputs) < 3
                or any(users.get(i, 0) > 1 or i not in inits for i in inputs[1:] if i)):
            counts["left"] += 1
            continue
        parts = []
        for name in names:
            kq = tensor_quant(tensors[name])
            if arch == "llama" and (".attn_q." in name or ".attn_k." in name):
                kq = permute_rows(kq, _llama_rows(kq.shape[0], heads if ".attn_q." in name else kv_heads))
            counts["kept" if kq.kind in KEPT else "requantized"] += 1
            parts.append(kq)
        kq = concat_rows(parts)
        N, K = int(attrs["N"]), int(attrs["K"])
        if kq.shape != (N, K):
            raise ExportError(f"{n.name}: the GGUF's {'+'.join(names)} is {kq.shape[0]} x {kq.shape[1]}, the graph's "
                              f"weights {N} x {K}")
        mine = kq.dequantize()
        theirs = _dequant_matmulnbits([_read(inits[i], base) if i else None for i in inputs[1:4]], N, K, 32)
        err = float(np.linalg.norm(mine - theirs) / max(np.linalg.norm(mine), 1e-30))
        if not err < 0.3:  # the builder's second rounding is ~0.05-0.1; another tensor or row order is ~1.4
            raise ExportError(f"{n.name}: the GGUF's {'+'.join(names)} does not match the graph's weights (relative "
                              f"difference {err:.2f}): not written")
        b, s, z = matmulnbits_arrays(kq)
        new = []
        for suffix, arr, dt in (("Q4", b, TensorProto.UINT8), ("scales", s, TensorProto.FLOAT),
                                ("zero_points", z, TensorProto.FLOAT)):
            t = _tensor(f"{n.name.strip('/').replace('/', '.')}.gguf_{suffix}", arr, dt)
            g.initializer.append(t)
            new.append(t.name)
        for old in inputs[1:]:
            if old:
                drop.add(old)
        del n.input[:]
        n.input.extend([inputs[0]] + new + inputs[4:])
        counts["nodes"] += 1
    if not counts["nodes"]:
        raise ExportError(f"{model_path.name}: no MatMulNBits the GGUF's tensors map to (--quant-algo gguf)")
    kept = [t for t in g.initializer if t.name not in drop]
    del g.initializer[:]
    g.initializer.extend(kept)
    _write(m, model_path, base)
    if log:
        log(f"    {counts['nodes']} MatMulNBits from the GGUF's blocks: {counts['kept']} tensors as stored, "
            f"{counts['requantized']} of other types rounded to 4-bit blocks with a minimum"
            + (f"; {counts['left']} left as the builder made them" if counts["left"] else ""))
    return counts


def _dequant_matmulnbits(arrs, N: int, K: int, block: int) -> np.ndarray:
    """MatMulNBits' 4-bit weights (B, scales, zero points packed or float, or None) as floats ``[N, K]``
    (``export.weights``' block dequantization, all rows at once)."""
    from .weights import _block_rows, _nibbles, _zero_points

    b, s, z = (list(arrs) + [None] * 3)[:3]
    nb = -(-K // block)
    b = np.asarray(b, np.uint8).reshape(N, nb, block // 2)
    rows = _block_rows(lambda r: _nibbles(b[r]), np.asarray(s).reshape(N, nb),
                       _zero_points(None if z is None else np.asarray(z), N, nb), 4, nb, block, K)
    return rows(slice(None))
