"""(session 88) export/kernels.py's parts on their own, where the exact-kernels rewrites of real and tiny bundles
(test_native, test_kv_q8, test_archs) never send what they refuse or must leave alone. Mutation-tested
(docs/bench/mutation_s88.md)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import q4k_like

from edgespec.native import cpu_supported

# (the tests that run edgespec's kernels: skipped where test_native is, a CPU they do not run on)
native = pytest.mark.skipif(cpu_supported() is not None, reason=f"{cpu_supported()}")


def _mnb(K=64, N=8, bits=4, block=32, inputs=("A", "B", "S", "Z"), name="m"):
    from onnx import helper

    return helper.make_node("MatMulNBits", list(inputs), ["Y"], name=name, domain="com.microsoft", K=K, N=N,
                            bits=bits, block_size=block)


def test_the_kernel_takes_4_bit_matmulnbits_of_whole_blocks_only():
    """``_q4_attrs``: a 4-bit MatMulNBits whose K is whole blocks of a multiple of 8 lanes, reading its weights,
    scales and zero points (or none) from initializers; trailing empty inputs are no inputs. Anything else stays
    onnxruntime's: 8 bits (an int8 head beside int4 layers), an act-order g_idx, a bias, a block that does not
    divide K, a block of 4, weights computed in the graph, no scales, another domain."""
    from edgespec_export.kernels import _q4_attrs

    inits = {"B": 1, "S": 1, "Z": 1, "G": 1, "bias": 1}
    assert _q4_attrs(_mnb(), inits)["block_size"] == 32
    assert _q4_attrs(_mnb(inputs=("A", "B", "S")), inits) is not None
    assert _q4_attrs(_mnb(inputs=("A", "B", "S", "", "", "")), inits) is not None
    assert _q4_attrs(_mnb(K=128, block=128), inits) is not None
    for node in (_mnb(bits=8), _mnb(inputs=("A", "B", "S", "Z", "G")), _mnb(inputs=("A", "B", "S", "", "", "bias")),
                 _mnb(K=80, block=32), _mnb(K=64, block=4), _mnb(inputs=("A", "B")), None):
        assert _q4_attrs(node, inits) is None, node
    assert _q4_attrs(_mnb(), {"S": 1, "Z": 1}) is None  # (the weights an output of another node)
    other = _mnb()
    other.domain = "edgespec"
    assert _q4_attrs(other, inits) is None


def test_kquant_scales_take_minimums_only_within_float_rounding_of_q4ks():
    """Q4_K's minimums are ``dmin x m``, kept by MatMulNBits as a float zero point ``minimum / scale``: recovered
    within 4 float spacings (the zero point's rounding), refused past that (another quantizer's minimums would be
    computed with the wrong bytes); negative minimums or scales are none of Q4_K's."""
    from edgespec_export.kernels import kquant_scales

    N, K = 16, 256
    _, scale, zp, minimum = q4k_like(N, K, seed=3)
    nb = K // 32
    s = scale.reshape(N, nb)
    d, sb = kquant_scales(s, (zp * scale).reshape(N, nb))  # (as the rewrite gives them: zp x scale)
    assert d.shape == (N, nb // 8, 2) and sb.shape == (N, nb, 2) and sb.dtype == np.uint8
    assert np.array_equal(d[..., 1][:, :, None] * sb[..., 1].reshape(N, nb // 8, 8).astype(np.float32),
                          minimum.reshape(N, nb // 8, 8))
    off = minimum.copy()
    off[2, 5] *= 1.001
    assert kquant_scales(s, off) is None
    for neg_s, neg_m in ((True, False), (False, True)):
        ss, mm = s.copy(), minimum.copy()
        (ss if neg_s else mm)[1, 1] *= -1
        assert kquant_scales(ss, mm) is None


def _swiglu(variant=""):
    """The builder's SwiGLU, ``Mul(Mul(gate, Sigmoid(gate)), up)`` over two 4-bit MatMulNBits, or a variant that
    must not be fused; (graph, initializers)."""
    from onnx import TensorProto, helper, numpy_helper

    gate = _mnb(N=16 if variant == "other-shape" else 8, name="gate", inputs=("x", "Bg", "Sg", "Zg"))
    gate.output[:] = ["g"]
    up = _mnb(name="up", inputs=("y" if variant == "other-input" else "x", "Bu", "Su")
              + (() if variant == "zero-points" else ("Zu",)))
    up.output[:] = ["u"]
    nodes = [gate, up, helper.make_node("Sigmoid", ["g"], ["s"]),
             helper.make_node("Mul", ["g", "s"], ["gs"]), helper.make_node("Mul", ["gs", "u"], ["out"])]
    outputs = ["out"]
    if variant == "up-read":
        nodes.append(helper.make_node("Relu", ["u"], ["r"]))
        outputs.append("r")
    if variant == "gate-output":
        outputs.append("g")
    if variant == "sigmoid-of-other":
        nodes[3] = helper.make_node("Mul", ["g", "g"], ["gs"])
        nodes.append(helper.make_node("Identity", ["s"], ["si"]))
        outputs.append("si")
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(v, TensorProto.FLOAT, [1, 64]) for v in "xy"],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs])
    inits = {k: numpy_helper.from_array(np.zeros(4, np.uint8), k) for k in ("Bg", "Sg", "Zg", "Bu", "Su", "Zu")}
    if variant == "float-zero-points":  # (the gate's a minimum per block, the up projection's bytes)
        inits["Zg"] = numpy_helper.from_array(np.zeros(4, np.float32), "Zg")
    return g, inits


@pytest.mark.parametrize("variant", ["", "other-input", "other-shape", "zero-points", "float-zero-points", "up-read",
                                     "gate-output", "sigmoid-of-other"])
def test_swiglu_is_fused_only_where_its_intermediates_are_its_own(variant):
    """``swiglu_patterns`` finds the builder's SwiGLU; not where the gate and up projections read other inputs or
    have other shapes, one has zero points and the other none or of another kind, or a value it would compute away is read elsewhere
    (the up projection's output, the gate's as a graph output, the sigmoid's)."""
    from edgespec_export.kernels import swiglu_patterns

    g, inits = _swiglu(variant)
    found = swiglu_patterns(g, inits)
    if variant:
        assert found == [], variant
    else:
        (gate, up, sig, m1, m2), = found
        assert (gate.name, up.name, sig.op_type, m1.output[0], m2.output[0]) == ("gate", "up", "Sigmoid", "gs", "out")


@pytest.mark.parametrize("variant", ["", "bias-first", "read-elsewhere", "bias-of-other-size", "float16-bias",
                                     "bias-computed", "8-bit"])
def test_a_bias_is_fused_only_into_a_matmul_it_alone_reads(variant):
    """``bias_patterns``: a 4-bit MatMulNBits read only by an Add of a float32 initializer of its N values (either
    side of the Add); not where the product is read elsewhere too (it would be lost, biased), the bias is of another
    size or type or not an initializer, or the MatMulNBits is not the kernel's."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from edgespec_export.kernels import bias_patterns

    mm = _mnb(bits=8 if variant == "8-bit" else 4, inputs=("x", "B", "S"))
    n = 4 if variant == "bias-of-other-size" else 8
    bias = numpy_helper.from_array(np.ones(n, np.float16 if variant == "float16-bias" else np.float32), "bias")
    add = helper.make_node("Add", ["bias", "Y"] if variant == "bias-first" else ["Y", "bias"], ["out"])
    nodes, outputs = [mm, add], ["out"]
    if variant == "read-elsewhere":
        nodes.append(helper.make_node("Relu", ["Y"], ["r"]))
        outputs.append("r")
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs])
    inits = {"B": 1, "S": 1} | ({} if variant == "bias-computed" else {"bias": bias})
    found = bias_patterns(g, inits)
    if variant in ("", "bias-first"):
        assert found == [(mm, add, "bias")]
    else:
        assert found == [], variant


@pytest.mark.parametrize("q8", [False, True])
def test_caches_made_float16_or_int8_change_type_width_and_operator(q8):
    """``_half_caches``: each attention node's past inputs and present outputs become float16, or int8 with rows
    of D + D / 8 (the numbers and a float32 scale per 32 lanes) where the graph gives D as a number (the builder
    names it: kept), the node the operator of that type, and the old type's shape notes dropped."""
    from onnx import TensorProto, helper

    from edgespec_export.kernels import ATTENTION_OP, ATTENTION_OP_F16, ATTENTION_OP_Q8, DOMAIN, _half_caches

    node = helper.make_node(ATTENTION_OP, ["q", "pk", "pv"], ["o", "k", "v"], domain=DOMAIN)
    dims = {"pk": [1, 2, "past", 64], "pv": [1, 2, "past", "head"], "k": [1, 2, "total", 64], "v": [1, 2, "total", 64]}
    g = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims.get(n, [1, 8])) for n in ("q", "pk", "pv")],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, dims.get(n, [1, 8])) for n in ("o", "k", "v")],
        value_info=[helper.make_tensor_value_info("k", TensorProto.FLOAT, [1, 2, "total", 64]),
                    helper.make_tensor_value_info("q_norm", TensorProto.FLOAT, [1, 8])])
    assert _half_caches(g, [node], q8=q8) == 2
    assert node.op_type == (ATTENTION_OP_Q8 if q8 else ATTENTION_OP_F16)
    want = TensorProto.INT8 if q8 else TensorProto.FLOAT16
    shapes = {v.name: (v.type.tensor_type.elem_type, [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim])
              for v in list(g.input) + list(g.output)}
    width = 72 if q8 else 64
    assert shapes == {"q": (TensorProto.FLOAT, [1, 8]), "o": (TensorProto.FLOAT, [1, 8]),
                      "pk": (want, [1, 2, "past", width]), "pv": (want, [1, 2, "past", "head"]),
                      "k": (want, [1, 2, "total", width]), "v": (want, [1, 2, "total", width])}
    assert [v.name for v in g.value_info] == ["q_norm"]


def _gqa(window=-1, softcap=0.0, interleaved=0, rotary_lanes=32, **extra):
    """The builder's CPU GroupQueryAttention (packed QKV, its rotary tables as initializers) and its initializers."""
    from onnx import TensorProto, helper

    attrs = dict(num_heads=8, kv_num_heads=2, scale=0.125, do_rotary=1, local_window_size=window, softcap=softcap,
                 rotary_interleaved=interleaved)
    attrs.update(extra)
    n = helper.make_node("GroupQueryAttention", ["qkv", "", "", "pk", "pv", "seqlens", "total", "cos", "sin", "", ""],
                         ["o", "k", "v"], domain="com.microsoft", **attrs)
    inits = {t: helper.make_tensor(t, TensorProto.FLOAT, [16, rotary_lanes], [0.0] * 16 * rotary_lanes)
             for t in ("cos", "sin")}
    return n, inits


def test_edgespec_attention_keeps_the_window_the_cap_and_the_heads_it_replaces():
    """``_own_attention``: the builder's attention becomes ``edgespec.DecodeAttention`` over (packed QKV, past key,
    past value, lengths, cos, sin) with its heads, KV heads, scale, and Gemma 2/3's sliding window and score cap and
    an interleaved rotary where the node has them; where it is not what the op computes (unpacked QKV, no rotary, a
    window of 0, an infinite cap, a smooth softmax, computed tables, a head size not a multiple of 8 or narrower than
    the rotary), it is left as it is."""
    from onnx import helper

    from edgespec_export.kernels import ATTENTION_OP, DOMAIN, _own_attention

    n, inits = _gqa(window=4096, softcap=50.0, interleaved=1)
    assert _own_attention(n, inits, head_dim=64)
    assert (n.op_type, n.domain, list(n.input)) == (ATTENTION_OP, DOMAIN, ["qkv", "pk", "pv", "seqlens", "cos", "sin"])
    assert {a.name: helper.get_attribute_value(a) for a in n.attribute} == {
        "num_heads": 8, "kv_num_heads": 2, "scale": 0.125, "local_window_size": 4096, "softcap": 50.0,
        "rotary_interleaved": 1}
    n, inits = _gqa()
    assert _own_attention(n, inits, head_dim=None)
    assert {a.name for a in n.attribute} == {"num_heads", "kv_num_heads", "scale"}
    assert _own_attention(*_gqa(rotary_lanes=16), head_dim=64)  # (a partial rotary: its first lanes)
    for node, inits, head in ((*_gqa(rotary_lanes=40), 64), (*_gqa(), 60), (*_gqa(window=0), None),
                              (*_gqa(softcap=float("inf")), None), (*_gqa(smooth_softmax=1), None),
                              (*_gqa(do_rotary=0), None), (_gqa()[0], {}, None)):
        before = node.SerializeToString()
        assert not _own_attention(node, inits, head_dim=head)
        assert node.SerializeToString() == before
    unpacked, inits = _gqa()
    unpacked.input[1] = "k_in"
    assert not _own_attention(unpacked, inits)


def test_kernel_features_are_what_each_attention_node_needs():
    """``kernel_features``: a window, a cap, an interleaved rotary, a rotary narrower than the node's head (its
    cache's width where the graph gives it, an int8 cache's rows read as their head size); whole-head rotaries of
    float16 and int8 caches need nothing new."""
    from onnx import TensorProto, helper

    from edgespec_export.kernels import ATTENTION_OP, ATTENTION_OP_F16, ATTENTION_OP_Q8, _own_attention, kernel_features

    def graph(op=ATTENTION_OP, width=64, lanes=32, **kw):
        n, inits = _gqa(rotary_lanes=lanes, **kw)
        assert _own_attention(n, inits)
        n.op_type = op
        return helper.make_graph([n], "g", [helper.make_tensor_value_info("pk", TensorProto.FLOAT, [1, 2, "p", width])],
                                 [], list(inits.values()))

    assert kernel_features(graph(), 64) == []
    assert kernel_features(graph(ATTENTION_OP_F16), 64) == []
    assert kernel_features(graph(ATTENTION_OP_Q8, width=72), 64) == []  # (64 numbers and their scales a row)
    assert kernel_features(graph(ATTENTION_OP_Q8, width=72, lanes=24), 64) == ["attention-partial-rotary"]
    assert kernel_features(graph(width=128), 64) == ["attention-partial-rotary"]  # (Gemma 4's wider global heads)
    assert kernel_features(graph(ATTENTION_OP_F16, window=512, softcap=50.0, interleaved=1), 64) == [
        "attention-interleaved-rotary", "attention-softcap", "attention-window"]
    other = graph()
    other.node[0].domain = "com.microsoft"
    assert kernel_features(other, 64) == []


@native
@pytest.mark.parametrize("kind", ["q4_k", "float-minimums"])
def test_a_rewrite_of_float_zero_points_puts_the_minimums_and_scale_bytes_in_their_slots(tmp_path, kind):
    """``rewrite_graph`` of a MatMulNBits with float zero points (``--quant-algo gguf``, ``hqq``, ``q4_k``): the
    kernel's node takes the exact minimums at input 5, or where the scales are Q4_K's its scale bytes at input 6 (and
    d and dmin at 2), none at 3 or 4 (4 is a bias's), and computes what onnxruntime's MatMulNBits computes of the same
    blocks, to its int8 activations' rounding."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from conftest import pool_session_options
    from edgespec_export.kernels import rewrite_graph
    from test_native import _session

    K, N = 256, 24
    b, scale, zp, _ = q4k_like(N, K, seed=5)
    if kind == "float-minimums":  # (minimums no Q4_K byte gives: hqq's)
        zp = zp * np.random.default_rng(6).uniform(0.5, 1.5, size=zp.shape).astype(np.float32)
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(scale, "S"), numpy_helper.from_array(zp, "Z")]
    node = helper.make_node("MatMulNBits", ["A", "B", "S", "Z"], ["Y"], name="m", domain="com.microsoft", K=K, N=N,
                            bits=4, block_size=32, accuracy_level=4)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    path = tmp_path / "model.onnx"
    onnx.save(m, str(path))
    x = np.random.default_rng(7).normal(size=(5, K)).astype(np.float32)
    so = pool_session_options()
    want = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, {"A": x})[0]
    assert rewrite_graph(path, pad_attention=False)["matmuls"] == 1
    out = onnx.load(str(path))
    (q4,) = out.graph.node
    slots = list(q4.input) + [""] * (7 - len(q4.input))
    assert q4.op_type == "MatMulQ4" and slots[1] and slots[2] and not slots[3] and not slots[4]
    assert (bool(slots[5]), bool(slots[6])) == ((False, True) if kind == "q4_k" else (True, False))
    got = _session(out).run(None, {"A": x})[0]
    # (onnxruntime computes float zero points in float; the kernel, at accuracy level 4, with int8 activations)
    assert np.abs(got - want).max() <= 1e-2 * np.abs(want).max()


def test_the_rewrites_comparison_counts_the_share_of_positions_that_agree(monkeypatch):
    """``compare_with_source``: both graphs read the same tokens (as many as both contexts hold, in two calls), and
    the record is the largest logit difference, the source's scale and the share of positions whose argmax agrees
    (a layout bug agrees almost nowhere; one position that agrees is not agreement)."""
    from types import SimpleNamespace

    import edgespec.onnx_lm
    from edgespec_export.kernels import compare_with_source

    calls = []

    class FakeLM:
        def __init__(self, spec, context, providers, min_width=None):
            self.spec, self.width_seconds = spec, None
            calls.append((spec.name, context, min_width))

        def forward(self, ids):
            calls.append((self.spec.name, list(ids)))
            return self.spec.logits[ids]

    monkeypatch.setattr(edgespec.onnx_lm, "OnnxLM", FakeLM)
    logits = np.eye(8, dtype=np.float32) * 3.0  # (token i's row: argmax i)
    other = logits.copy()
    other[[1, 4, 5], :] = np.roll(other[[1, 4, 5], :], 1, axis=1)  # (three of the tokens' argmax moved)
    other[2, 2] = 2.5
    source = SimpleNamespace(name="source", max_context=16, attention_pad=0, logits=logits)
    rewritten = SimpleNamespace(name="rewritten", max_context=10, attention_pad=4, logits=other)
    got = compare_with_source(source, rewritten, list(range(8)))
    assert got == {"max_abs_logit_diff": 3.0, "logit_scale": 3.0, "top1_agreement": 0.5, "positions": 6,
                   "width_policy": None}
    assert calls == [("source", 16, 1), ("source", [0, 1, 2]), ("source", [3, 4, 5]),
                     ("rewritten", 6, None), ("rewritten", [0, 1, 2]), ("rewritten", [3, 4, 5])]


@native
def test_a_rewritten_bundle_records_the_matmuls_it_kept_and_drops_genais_config(tiny_int4_bundle, tmp_path,
                                                                                   monkeypatch):
    """``apply_to_bundle``: onnxruntime-genai's config goes (genai cannot run edgespec's operators), and the manifest's
    operators count what the graph holds: the kernel's MatMulQ4 nodes and the MatMulNBits it left to onnxruntime
    (here the head, planted: what the kernel does not take, an 8-bit head for one), so the runtime does not take the
    graph for one that computes a row alike at every width."""
    from collections import Counter

    import onnx

    import edgespec_export.kernels as kernels
    from edgespec.manifest import load_manifest
    from edgespec.width import width_invariant_spec

    assert (tiny_int4_bundle / "target" / "genai_config.json").exists()
    real = kernels._q4_attrs
    monkeypatch.setattr(kernels, "_q4_attrs",
                        lambda node, inits: None if node is not None and "lm_head" in node.name else real(node, inits))
    out = kernels.apply_to_bundle(tiny_int4_bundle, tmp_path / "xk")
    spec = load_manifest(out).target
    ops = Counter(n.op_type for n in onnx.load(str(spec.path), load_external_data=False).graph.node)
    assert ops["MatMulNBits"] == 1 and ops["MatMulQ4"] >= 4
    assert (spec.operators["MatMulNBits"], spec.operators["MatMulQ4"]) == (1, ops["MatMulQ4"])
    assert spec.kernels == "edgespec-q4" and not width_invariant_spec(spec)
    assert not (out / "target" / "genai_config.json").exists()


@pytest.mark.parametrize("reader", ["gqa", "contrib", "onnx", "ai.onnx", "other-slot", "also-gathered"])
def test_rotary_tables_are_cut_where_every_reader_takes_them_as_its_cos_and_sin(reader):
    """(session 89) ``trim_rotary_tables`` cuts a table to the rows asked where every node reading it takes it as
    its cos or sin cache: GroupQueryAttention's inputs 7 and 8, onnxruntime's RotaryEmbedding's 2 and 3, ONNX's own
    RotaryEmbedding's (opset 23) 1 and 2 (read at 2 and 3 before, so left whole). A table read at other inputs, or
    by a Gather besides, is left whole."""
    from onnx import TensorProto, helper, numpy_helper

    from edgespec_export.kernels import trim_rotary_tables

    cos, sin = (numpy_helper.from_array(np.full((100, 4), v, np.float32), n) for v, n in ((1.0, "cos"), (0.5, "sin")))
    domain, op, slots = {"gqa": ("com.microsoft", "GroupQueryAttention", (7, 8)),
                         "contrib": ("com.microsoft", "RotaryEmbedding", (2, 3)),
                         "onnx": ("", "RotaryEmbedding", (1, 2)), "ai.onnx": ("ai.onnx", "RotaryEmbedding", (1, 2)),
                         "other-slot": ("", "RotaryEmbedding", (3, 4)),
                         "also-gathered": ("com.microsoft", "RotaryEmbedding", (2, 3))}[reader]
    inputs = ["x"] * (max(slots) + 1)
    inputs[slots[0]], inputs[slots[1]] = "cos", "sin"
    nodes = [helper.make_node(op, inputs, ["y"], domain=domain)]
    if reader == "also-gathered":
        nodes.append(helper.make_node("Gather", ["cos", "x"], ["z"]))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [cos, sin])
    cut = trim_rotary_tables(g, 40)
    whole = {"other-slot": {"cos", "sin"}, "also-gathered": {"cos"}}.get(reader, set())
    assert cut == 2 - len(whole)
    for t in g.initializer:
        rows = 100 if t.name in whole else 40
        assert list(t.dims) == [rows, 4] and numpy_helper.to_array(t).shape == (rows, 4), (t.name, reader)
    assert (numpy_helper.to_array(g.initializer[1]) == 0.5).all()
