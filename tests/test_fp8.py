"""export/fp8.py's rewrite on graphs built by hand, checked against what onnxruntime computes from the rewritten
graph: the weights its DequantizeLinear nodes give, E4M3's range used to 448, a zero column, a weight two MatMuls
share, a tied table read through a Transpose, the head left float on request, the recorded error and bytes, and the
refusals (session 87, from the mutation test of fp8.py: docs/bench/mutation_s87.md). The exports through fp8.py
are in test_export (tiny_fp8_bundle) and test_layout."""
from __future__ import annotations

import numpy as np
import pytest

K, N, V = 48, 20, 24  # K: one block of 32 and a partial one (block 32)


def _write(d, dtype=np.float32, opset=21):
    """A graph of the builder's shapes: a down projection ``W2 [K, K]`` two MatMuls share (a zero column in it), the
    head ``/lm_head/MatMul`` ``W [K, V]`` and a tied table, the head's weight transposed and gathered."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(1)
    w2 = (rng.standard_normal((K, K)) * np.logspace(-3, 0, K)).astype(np.float32)
    w2[:, 7] = 0
    w = rng.standard_normal((K, V)).astype(np.float32) * 0.05
    t = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    nodes = [helper.make_node("MatMul", ["x", "W2"], ["h1"], name="/model/layers.0/mlp/down_proj/MatMul"),
             helper.make_node("MatMul", ["x", "W2"], ["h2"], name="/model/layers.1/mlp/down_proj/MatMul"),
             helper.make_node("MatMul", ["x", "W"], ["logits"], name="/lm_head/MatMul"),
             helper.make_node("Transpose", ["W"], ["table"], perm=[1, 0]),
             helper.make_node("Gather", ["table", "ids"], ["emb"], name="/model/embed_tokens/Gather")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", t, ["M", K]),
                                       helper.make_tensor_value_info("ids", TensorProto.INT64, ["M"])],
                          [helper.make_tensor_value_info(o, t, None) for o in ("h1", "h2", "logits", "emb")],
                          [numpy_helper.from_array(w2.astype(dtype), "W2"), numpy_helper.from_array(w.astype(dtype), "W")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 10
    d.mkdir(parents=True)
    onnx.save(m, str(d / "model.onnx"), save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    return w2.astype(dtype).astype(np.float32), w.astype(dtype).astype(np.float32)


def _run(d, dtype=np.float32):
    """onnxruntime's outputs of the rewritten graph for x = the identity and every table row: the weights its
    DequantizeLinear nodes give (W2 twice, W, W's transpose)."""
    import onnxruntime as ort

    from conftest import pool_session_options

    s = ort.InferenceSession(str(d / "model.onnx"), pool_session_options(), providers=["CPUExecutionProvider"])
    out = s.run(None, {"x": np.eye(K, dtype=dtype), "ids": np.arange(V, dtype=np.int64)})
    return [o.astype(np.float32) for o in out]


def _stored(d):
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(d / "model.onnx"))
    return {t.name: t for t in m.graph.initializer}, {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}, m


@pytest.mark.parametrize("scheme,dtype", [("channel", np.float32), ("block", np.float32), ("channel", np.float16),
                                          ("block", np.float16)])
def test_the_rewrite_computes_the_fp8_weights_it_records(scheme, dtype, tmp_path):
    """The rewritten graph, run by onnxruntime, computes each weight from its FP8 values: W2 (two MatMuls share it)
    converted once and read by both, the tied table read through the Transpose of the head's dequantized weight,
    the zero column exactly 0 (no NaN), the relative error the record says (that of onnxruntime's weights), the
    bytes it says (the FP8 values and the scales as stored), and each column's (each block's) largest weight at
    E4M3's largest value, 448: its whole range (float16 scales: where amax / 448 is no float16 normal, the
    smallest normal, 2**-14, as fp8.py documents)."""
    import ml_dtypes
    from onnx import TensorProto

    from edgespec_export.fp8 import convert_model_dir

    d = tmp_path / "m"
    w2, w = _write(d, dtype)
    info = convert_model_dir(d, scheme=scheme, block_size=32)
    h1, h2, logits, emb = _run(d, dtype)
    assert info.matmuls == 2 and info.lm_head and info.scheme == scheme, info
    assert np.array_equal(h1, h2) and np.array_equal(emb, logits.T) and np.isfinite(h1).all()
    assert not h1[:, 7].any()
    err = np.sqrt((np.square(h1 - w2).sum() + np.square(logits - w).sum()) / (np.square(w2).sum() + np.square(w).sum()))
    assert 0.01 < err < 0.06 and info.relative_weight_error == pytest.approx(err, rel=1e-3, abs=1e-6), (err, info)
    protos, arrays, m = _stored(d)
    assert sorted(protos) == ["W2_fp8", "W2_fp8_scale", "W_fp8", "W_fp8_scale"]  # (the float weights dropped)
    assert all(protos[n].data_type == TensorProto.FLOAT8E4M3FN for n in ("W_fp8", "W2_fp8"))
    assert info.weight_bytes == sum(a.nbytes for a in arrays.values())
    assert [n.op_type for n in m.graph.node].count("DequantizeLinear") == 2
    # the data file holds the new weights only: the float ones it held before are gone, not left ahead of them
    import onnx

    lengths = [int({e.key: e.value for e in t.external_data}["length"])
               for t in onnx.load(str(d / "model.onnx"), load_external_data=False).graph.initializer
               if t.data_location == onnx.TensorProto.EXTERNAL]
    assert len(lengths) == 2 and (d / "model.onnx.data").stat().st_size == sum(lengths) == K * K + K * V
    assert sorted(p.name for p in d.iterdir()) == ["model.onnx", "model.onnx.data"]
    e4m3 = ml_dtypes.float8_e4m3fn
    for name, ref in (("W2", w2), ("W", w)):
        def per(a):  # (the largest of each column, or of each block of 32 rows in a column)
            a = np.abs(a)
            return a.max(0) if scheme == "channel" else np.pad(a, ((0, 16), (0, 0))).reshape(2, 32, -1).max(1)

        top, amax = per(arrays[name + "_fp8"].astype(np.float32)), per(ref)
        # (float16 scales are at least float16's smallest normal: a column smaller than 448 x 2**-14 reaches less)
        floored = (amax / 448 < 2.0 ** -14) if dtype == np.float16 else np.zeros(amax.shape, bool)
        assert np.all(top[(amax > 0) & ~floored] == np.float32(ml_dtypes.finfo(e4m3).max)), (name, top)
        assert np.array_equal(top[floored], (amax[floored] * 2 ** 14).astype(e4m3).astype(np.float32)), (name, top)
        assert floored.any() == (dtype == np.float16 and name == "W2")


def test_float16_scales_are_rounded_up_never_down():
    """In the cuda layout the scales are float16: each is rounded up from amax / 448 (at least float16's smallest
    normal), so no weight divided by it passes 448 and is clipped; columns whose float32 scale float16 rounds down
    half the time are all within range."""
    from edgespec_export.fp8 import quantize_weight

    rng = np.random.default_rng(3)
    w = (rng.standard_normal((64, 4000)) * rng.uniform(1e-3, 1, 4000)).astype(np.float16).astype(np.float32)
    amax = np.abs(w).max(0)
    for scheme in ("channel", "block"):
        q, scale = quantize_weight(w, scheme, 32, np.float16)
        assert np.array_equal(scale, scale.astype(np.float16).astype(np.float32))
        full = scale[None, :] if scheme == "channel" else np.repeat(scale, 32, axis=0)
        assert np.all(np.abs(w) <= 448 * full), scheme  # (never clipped)
        if scheme == "channel":
            assert np.all(scale >= amax / 448) and (scale.astype(np.float64) > amax / 448 * (1 + 2 ** -12)).any()


def test_the_head_stays_float_when_asked(tmp_path):
    """``lm_head=False``: the builder's ``/lm_head/MatMul`` keeps its float weight (and the tied table with it); the
    down projection is converted; the record says so."""
    from edgespec_export.fp8 import convert_model_dir

    d = tmp_path / "m"
    w2, w = _write(d)
    info = convert_model_dir(d, lm_head=False)
    _, arrays, _ = _stored(d)
    assert info.matmuls == 1 and not info.lm_head and sorted(arrays) == ["W", "W2_fp8", "W2_fp8_scale"], info
    h1, _, logits, emb = _run(d)
    assert np.array_equal(logits, w) and np.array_equal(emb, w.T) and not np.array_equal(h1, w2)


@pytest.mark.parametrize("opset,block,why", [(19, 32, "opset >= 21, the graph has 19"),
                                             (20, 32, "opset >= 21, the graph has 20"),
                                             (21, 48, "power of two >= 16, got 48"),
                                             (21, 8, "power of two >= 16, got 8")])
def test_the_rewrite_refuses_an_opset_before_21_and_a_block_that_is_no_power_of_two(opset, block, why, tmp_path):
    """DequantizeLinear takes FP8 and a block_size from opset 21 on: 19 and 20 are refused like 17; a block size
    must be a power of two of at least 16. Refused before anything is written: the graph as it was."""
    from edgespec.errors import ExportError
    from edgespec_export.fp8 import convert_model_dir

    d = tmp_path / "m"
    _write(d, opset=opset)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    with pytest.raises(ExportError, match=why):
        convert_model_dir(d, scheme="block", block_size=block)
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
