"""FP8 (E4M3) weight-only quantization of a builder's float graph.

The model builder has no FP8 mode, so edgespec builds the float32 graph (float16 for the cuda
layout) and rewrites it: every ``MatMul`` whose weight is a 2-D float initializer gets an
``float8e4m3fn`` weight and a scale of the graph's float type, dequantized by a
``DequantizeLinear`` (opset 21 or later) in front of the MatMul:

* ``channel`` (default): one scale per output channel (``axis=1`` of the ``[in, out]`` weight).
  This is the layout TensorRT's explicit-quantization path expects for weights on SM89+ GPUs and
  Jetson Thor (per-tensor or per-output-channel weight scales).
* ``block``: one scale per ``block_size`` input rows and output channel (``axis=0`` with the
  ``block_size`` attribute of opset 21), closer to the original weights; onnxruntime's CPU EP runs
  it, TensorRT does not take blocked FP8 scales.

Activations stay float32 (weight-only, W8A32; TensorRT with FP16 enabled computes in FP16). On
onnxruntime's CPU EP the graph is correct but slow: there is no FP8 GEMM, so every weight is
dequantized to float32 on every call. The embedding table (a ``Gather``) stays float unless it is
the lm_head's own weight (tied embeddings), in which case it shares the dequantized lm_head.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from edgespec.errors import ExportError
from edgespec.manifest import Quantization

E4M3_MAX = 448.0
SCHEMES = ("channel", "block")


def _as_stored(scale: np.ndarray, dtype) -> np.ndarray:
    """``scale`` as the graph stores it (DequantizeLinear's output type): in float16, at least its smallest normal
    (2**-14) and rounded up, never down (a weight divided by it stays within E4M3's range), as float32 values.
    (Rounded after the weights were divided by the float32 scale, a small column's subnormal float16 scale no longer
    matched its FP8 values: 73% off at amax 1.5e-5; session 56, a review.)"""
    if dtype != np.float16:
        return scale
    s16 = np.maximum(scale, np.float32(2.0 ** -14)).astype(np.float16)
    low = s16.astype(np.float32) < scale
    s16[low] = np.nextafter(s16[low], np.float16(np.inf))
    return s16.astype(np.float32)


def quantize_weight(w: np.ndarray, scheme: str = "channel", block_size: int = 128,
                    scale_dtype=np.float32) -> tuple[np.ndarray, np.ndarray]:
    """``w`` [in, out] float -> (uint8 bit patterns of float8e4m3fn [in, out], float32 scales).
    Scales are [out] for ``channel`` and [ceil(in / block_size), out] for ``block``; with ``scale_dtype`` float16
    (the cuda layout's), values float16 holds (``_as_stored``), the weights divided by them."""
    import ml_dtypes

    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ExportError(f"FP8 weight must be 2-D, got shape {w.shape}")
    k, n = w.shape
    if scheme == "channel":
        amax = np.abs(w).max(axis=0)
        scale = _as_stored(np.where(amax > 0, amax / E4M3_MAX, 1.0).astype(np.float32), scale_dtype)
        full = scale[None, :]
    elif scheme == "block":
        nb = -(-k // block_size)
        pad = np.zeros((nb * block_size - k, n), np.float32)
        amax = np.abs(np.concatenate([w, pad])).reshape(nb, block_size, n).max(axis=1)
        scale = _as_stored(np.where(amax > 0, amax / E4M3_MAX, 1.0).astype(np.float32), scale_dtype)
        full = np.repeat(scale, block_size, axis=0)[:k]
    else:
        raise ExportError(f"FP8 scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    q = np.clip(w / full, -E4M3_MAX, E4M3_MAX).astype(ml_dtypes.float8_e4m3fn)
    return q.view(np.uint8), scale


def dequantize_weight(q: np.ndarray, scale: np.ndarray, scheme: str = "channel", block_size: int = 128) -> np.ndarray:
    """The inverse of :func:`quantize_weight` (what DequantizeLinear computes), for tests and error figures."""
    import ml_dtypes

    f = q.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    if scheme == "channel":
        return f * scale[None, :]
    return f * np.repeat(scale, block_size, axis=0)[: f.shape[0]]


def convert_model_dir(model_dir: Path, scheme: str = "channel", block_size: int = 128, lm_head: bool = True,
                      log=lambda s: None) -> Quantization:
    """Rewrite ``model_dir/model.onnx`` (float32, external data) in place to FP8 weights. Returns
    the manifest's record of it: how many MatMuls were converted and the weights' relative error."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    if scheme not in SCHEMES:
        raise ExportError(f"FP8 scheme must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    if scheme == "block" and (block_size < 16 or block_size & (block_size - 1)):
        raise ExportError(f"FP8 block size must be a power of two >= 16, got {block_size}")
    path = Path(model_dir) / "model.onnx"
    model = onnx.load(str(path), load_external_data=True)
    g = model.graph
    opset = next((o for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None or opset.version < 21:
        raise ExportError(f"{path}: FP8 DequantizeLinear needs opset >= 21, the graph has "
                          f"{opset.version if opset else 'none'}")
    inits = {t.name: t for t in g.initializer}
    dq_nodes, renamed, converted, err_num, err_den, n_bytes = [], {}, 0, 0.0, 0.0, 0
    for node in g.node:
        wname = node.input[1] if node.op_type == "MatMul" and len(node.input) == 2 else None
        t = inits.get(wname) if wname else None
        if (t is None or wname in renamed or t.data_type not in (TensorProto.FLOAT, TensorProto.FLOAT16)
                or len(t.dims) != 2):
            continue
        if not lm_head and node.name.startswith("/lm_head/"):
            continue
        w = numpy_helper.to_array(t)
        q, scale = quantize_weight(w, scheme, block_size, np.float16 if w.dtype == np.float16 else np.float32)
        w = w.astype(np.float32)
        deq = dequantize_weight(q, scale, scheme, block_size)
        err_num += float(np.square(deq - w).sum())
        err_den += float(np.square(w).sum())
        qt = helper.make_tensor(wname + "_fp8", TensorProto.FLOAT8E4M3FN, list(w.shape), q.tobytes(), raw=True)
        st = numpy_helper.from_array(scale.astype(np.float16 if t.data_type == TensorProto.FLOAT16 else np.float32),
                                     wname + "_fp8_scale")
        g.initializer.extend([qt, st])
        attrs = {"axis": 1} if scheme == "channel" else {"axis": 0, "block_size": block_size}
        renamed[wname] = wname + "_fp8_dq"
        dq_nodes.append(helper.make_node("DequantizeLinear", [qt.name, st.name], [renamed[wname]],
                                         name=(node.name or wname) + "_fp8_DequantizeLinear", **attrs))
        converted += 1
        n_bytes += q.nbytes + len(st.raw_data)  # (as stored: float16 scales in the cuda layout)
        del w, q, deq
    if not converted:
        raise ExportError(f"{path}: no float MatMul weights to convert to FP8")
    # every consumer of a float weight (its MatMul, or the Transpose of tied embeddings) reads the
    # DequantizeLinear output; the DQ nodes depend only on initializers, so they go first
    for node in g.node:
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]
    nodes = dq_nodes + list(g.node)
    keep = [t for t in g.initializer if t.name not in renamed]
    del g.initializer[:]
    g.initializer.extend(keep)
    del g.node[:]
    g.node.extend(nodes)
    for f in Path(model_dir).glob("model.onnx*"):
        f.unlink()
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=1024)
    rel = (err_num / err_den) ** 0.5 if err_den else 0.0
    log(f"    FP8 E4M3 ({scheme}{f', block {block_size}' if scheme == 'block' else ''}): {converted} MatMul "
        f"weights, relative weight error {rel:.4f}")
    return Quantization(format="float8e4m3fn", scheme=scheme, block_size=block_size if scheme == "block" else None,
                        matmuls=converted, lm_head=lm_head, weight_bytes=n_bytes, relative_weight_error=round(rel, 6))
