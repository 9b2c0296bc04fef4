"""export/weights.py on graphs built by hand: each layout it dequantizes against onnxruntime's own op, and each of
its checks (check_weights against a torch model, check_rewrite against a source graph) with a planted fault it must
report. The real exports' weight checks are in test_export, test_archs, test_conv and test_native; these are the
cases no export plants (session 87, from the mutation test of export/weights.py: docs/bench/mutation_s87.md)."""
from __future__ import annotations

import numpy as np
import pytest

H, V, I = 40, 24, 64  # hidden 40: not a whole number of blocks of 32 (the last block cut short, padded tables)
BLOCK = 32


def _ort(model, feeds):
    import onnxruntime as ort

    from conftest import pool_session_options

    s = ort.InferenceSession(model.SerializeToString(), pool_session_options(), providers=["CPUExecutionProvider"])
    return s.run(None, feeds)[0]


def _model_of(nodes, inits, inputs, outputs=("Y",)):
    from onnx import TensorProto, helper

    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT if n == "A" else TensorProto.INT64, None)
           for n in inputs]
    g = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                            for o in outputs], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])


def _save(model, path, external=False):
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    model = onnx.ModelProto.FromString(model.SerializeToString())  # (onnx.save moves the weights out of its argument)
    onnx.save(model, str(path), save_as_external_data=external, location=path.name + ".data", size_threshold=0)
    return path


def _pack4(q):
    """4-bit values along the last axis, two to a byte, the low nibble first."""
    q = np.asarray(q, np.uint8)
    if q.shape[-1] % 2:
        q = np.concatenate([q, np.zeros(q.shape[:-1] + (1,), np.uint8)], axis=-1)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def _blocks(w, bits=4, zero_points=None):
    """``w [N, K]`` block-quantized as MatMulNBits stores it: (B ``[N, nb, block * bits / 8]`` uint8, scales
    ``[N * nb]``, zero points as asked: None (the middle of the range), "packed" (uint8) or "float")."""
    N, K = w.shape
    nb = -(-K // BLOCK)
    wp = np.pad(w, ((0, 0), (0, nb * BLOCK - K))).reshape(N, nb, BLOCK)
    top = (1 << bits) - 1
    if zero_points is None:
        s = np.abs(wp).max(-1) / (top // 2) + 1e-8
        zp = np.full((N, nb), 1 << (bits - 1))
    else:
        lo, hi = wp.min(-1), wp.max(-1)
        s = (hi - lo) / top + 1e-8
        zp = np.clip(np.round(-lo / s), 0, top)
    q = np.clip(np.round(wp / s[..., None]) + zp[..., None], 0, top).astype(np.uint8)
    b = _pack4(q) if bits == 4 else q
    s = s.astype(np.float32).reshape(-1)
    if zero_points is None:
        return b, s, None
    if zero_points == "float":
        return b, s, zp.astype(np.float32).reshape(-1)
    return b, s, (_pack4(zp) if bits == 4 else zp.astype(np.uint8)).reshape(-1)


def _mnb(name, w, bits=4, zero_points=None, prefix="W"):
    """A MatMulNBits node holding ``w [N, K]`` and its initializers."""
    from onnx import helper, numpy_helper

    N, K = w.shape
    b, s, z = _blocks(w, bits, zero_points)
    inits = [numpy_helper.from_array(b, prefix + "_B"), numpy_helper.from_array(s, prefix + "_S")]
    ins = ["A", prefix + "_B", prefix + "_S"]
    if z is not None:
        inits.append(numpy_helper.from_array(z, prefix + "_Z"))
        ins.append(prefix + "_Z")
    node = helper.make_node("MatMulNBits", ins, [prefix + "_Y"], name=name, domain="com.microsoft", K=K, N=N,
                            bits=bits, block_size=BLOCK)
    return node, inits


def _rng(seed=0):
    return np.random.default_rng(seed)


# --- each layout against onnxruntime -----------------------------------------------------------------------------

def _layout(kind, tmp_path):
    """(graph file, the node, onnxruntime's ``[N, K]`` matrix of it) for one layout the builders write."""
    import ml_dtypes
    from onnx import TensorProto, helper, numpy_helper

    rng = _rng(3)
    N, K = 12, H
    w = rng.normal(size=(N, K)).astype(np.float32)
    external = kind.endswith("-external")
    kind = kind.removesuffix("-external")
    if kind.startswith("mnb"):  # mnb{bits}-{zero points}
        bits, zp = int(kind[3]), kind.split("-")[1]
        node, inits = _mnb("n", w, bits, None if zp == "none" else zp)
        model = _model_of([node], inits, ["A"], [node.output[0]])
        feeds, transpose = {"A": np.eye(K, dtype=np.float32)}, True
    elif kind.startswith("gbq"):  # GatherBlockQuantized: uint8 packed ("gbq{bits}") or one element a value
        table_type = kind.split("-")[1]
        with_zp = kind.endswith("-zp")
        if table_type == "u8":
            bits = int(kind[3])
            b, s, z = _blocks(w, bits, "packed" if with_zp else None)
            data = b.reshape(N, -1)[:, :(K * bits + 7) // 8]  # (the last block cut short: K, not whole blocks)
            table = numpy_helper.from_array(data, "T")
            zinit = numpy_helper.from_array(z.reshape(N, -1), "Z") if with_zp else None
        else:  # INT4 / UINT4: no zero points means 0 for both
            bits, signed = 4, table_type == "int4"
            lo = -8 if signed else 0
            nb = -(-K // BLOCK)
            zp = rng.integers(lo, lo + 16, size=(N, nb)) if with_zp else np.zeros((N, nb), np.int64)
            s0 = (np.abs(w).reshape(N, -1).max(-1, keepdims=True) / 7).astype(np.float32)
            s = np.repeat(s0, nb, axis=1)
            q = np.clip(np.round(w / np.repeat(s, BLOCK, 1)[:, :K]) + np.repeat(zp, BLOCK, 1)[:, :K], lo, lo + 15)
            dt = TensorProto.INT4 if signed else TensorProto.UINT4
            # (raw bytes, two values to a byte, the low nibble first: a data file holds only raw tensors)
            table = helper.make_tensor("T", dt, [N, K], _pack4(q.astype(np.int64).reshape(-1) & 15).tobytes(),
                                       raw=True)
            zinit = (helper.make_tensor("Z", dt, [N, nb], _pack4(zp.reshape(-1) & 15).tobytes(), raw=True)
                     if with_zp else None)
        inits = [table, numpy_helper.from_array(np.ascontiguousarray(s.reshape(N, -1)), "S")] + \
            ([zinit] if zinit is not None else [])
        node = helper.make_node("GatherBlockQuantized", ["T", "I", "S"] + (["Z"] if zinit is not None else []), ["Y"],
                                name="/model/embed_tokens/GatherBlockQuantized", domain="com.microsoft",
                                gather_axis=0, quantize_axis=1, block_size=BLOCK, bits=bits)
        model = _model_of([node], inits, ["I"])
        feeds, transpose = {"I": np.arange(N, dtype=np.int64)}, False
    elif kind.startswith("fp8"):  # FP8's DequantizeLinear -> MatMul: one scale, per output channel, blocked along K
        from edgespec_export.fp8 import quantize_weight

        wk = w.T  # [K, N]
        if kind == "fp8-one":
            scale = np.float32(0.01)
            q = (wk / scale).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        else:  # (the export's own quantizer: per channel, or blocks of 32 along K)
            q, scale = quantize_weight(wk, kind.removeprefix("fp8-"), BLOCK)
        t = helper.make_tensor("Q", TensorProto.FLOAT8E4M3FN, [K, N], q.tobytes(), raw=True)
        attrs = {"axis": 0, "block_size": BLOCK} if np.ndim(scale) == 2 else ({"axis": 1} if np.ndim(scale) else {})
        dq = helper.make_node("DequantizeLinear", ["Q", "QS"], ["Wt"], name="dq", **attrs)
        node = helper.make_node("MatMul", ["A", "Wt"], ["Y"], name="mm")
        model = _model_of([dq, node], [t, numpy_helper.from_array(np.asarray(scale, np.float32), "QS")], ["A"])
        feeds, transpose = {"A": np.eye(K, dtype=np.float32)}, True
    else:  # a float table or matrix
        dtype = {"gather16": np.float16, "matmul32": np.float32}[kind]
        if kind == "gather16":
            node = helper.make_node("Gather", ["T", "I"], ["Y"], name="/model/embed_tokens/Gather")
            model = _model_of([node, helper.make_node("Cast", ["Y"], ["Y32"], to=TensorProto.FLOAT)],
                              [numpy_helper.from_array(w.astype(dtype), "T")], ["I"], ["Y32"])
            feeds, transpose = {"I": np.arange(N, dtype=np.int64)}, False
        else:
            node = helper.make_node("MatMul", ["A", "T"], ["Y"], name="mm")
            model = _model_of([node], [numpy_helper.from_array(w.T.copy(), "T")], ["A"])
            feeds, transpose = {"A": np.eye(K, dtype=np.float32)}, True
    got = _ort(model, feeds).astype(np.float32)
    path = _save(model, tmp_path / "g" / "model.onnx", external)
    return path, node.name, (got.T if transpose else got)


LAYOUTS = ["mnb4-none", "mnb4-packed", "mnb4-float", "mnb8-none", "mnb8-packed-external",
           "gbq4-u8", "gbq4-u8-zp", "gbq8-u8-zp", "gbq-int4", "gbq-int4-external", "gbq-int4-zp-external",
           "gbq-uint4-zp", "gbq-uint4-external", "fp8-one", "fp8-channel", "fp8-block", "gather16", "matmul32"]


@pytest.mark.parametrize("kind", LAYOUTS)
def test_each_layout_is_read_as_onnxruntime_computes_it(kind, tmp_path):
    """graph_weights' dequantization of every layout the builders write (MatMulNBits at 4 and 8 bits with no,
    packed or float zero points; GatherBlockQuantized tables packed in bytes or one INT4/UINT4 value an element,
    inline or in a data file, with and without zero points; FP8's DequantizeLinear with one scale, one per output
    channel or blocks along K; float tables and matrices) is onnxruntime's own: the matrix its op computes from the
    same initializers, fed the identity (or every row's index). The hidden size, 40, is no whole number of blocks:
    the columns past it are dropped and a table's last block, cut short, is read."""
    from edgespec_export.weights import _Graph, graph_weights

    path, name, want = _layout(kind, tmp_path)
    gr = _Graph(path)
    node = next(n for n in gr.g.node if n.name == name)
    kind_, n_rows, get, block = graph_weights(gr, node)
    assert n_rows == want.shape[0] and block == (0 if kind in ("gather16", "matmul32", "fp8-one", "fp8-channel") else BLOCK)
    assert kind_ == ("8bit" if kind.startswith(("mnb8", "gbq8")) else "fp8" if kind.startswith("fp8") else
                     {"gather16": "float16", "matmul32": "float32"}.get(kind, "4bit"))
    got = get(slice(0, n_rows))
    assert got.shape == want.shape and np.allclose(got, want, rtol=1e-6, atol=1e-6), np.abs(got - want).max()
    assert np.array_equal(get(slice(5, 9)), got[5:9])  # (a slice of rows, as check_weights reads a head)


def test_an_act_order_matrix_and_other_bits_are_left_unread(tmp_path):
    """MatMulNBits with a g_idx (act-order: its blocks are not runs of K) or at 2 bits is not read (None: the
    weight check counts it as not checked), where reading it as plain blocks would compare the wrong numbers."""
    from onnx import numpy_helper

    from edgespec_export.weights import _Graph, graph_weights

    w = _rng(1).normal(size=(8, 64)).astype(np.float32)
    node, inits = _mnb("n", w)
    inits.append(numpy_helper.from_array(np.arange(64, dtype=np.int32) // BLOCK, "G"))  # (the trivial order)
    node.input.extend(["", "G"])
    path = _save(_model_of([node], inits, ["A"], [node.output[0]]), tmp_path / "a" / "model.onnx")
    gr = _Graph(path)
    assert graph_weights(gr, gr.g.node[0]) is None
    node.input[4] = ""  # (an empty g_idx slot: read)
    gr = _Graph(_save(_model_of([node], inits, ["A"], [node.output[0]]), tmp_path / "b" / "model.onnx"))
    assert graph_weights(gr, gr.g.node[0])[0] == "4bit"
    del node.input[3:]
    node.attribute[[a.name for a in node.attribute].index("bits")].i = 2
    gr = _Graph(_save(_model_of([node], inits, ["A"], [node.output[0]]), tmp_path / "c" / "model.onnx"))
    assert graph_weights(gr, gr.g.node[0]) is None


# --- check_weights against a torch model -------------------------------------------------------------------------

def _torch_model(where="layers", n_layers=2, seed=0):
    """A tiny decoder's parameters under the names the builders' families use: ``embed_tokens``, ``<where>``
    (``layers``, ``h``, ``blocks``...) of ``self_attn.{q,k,v,o}_proj`` and ``mlp.{gate,up,down}_proj``, ``lm_head``
    (tied to the table)."""
    import torch

    torch.manual_seed(seed)
    lin = lambda i, o: torch.nn.Linear(i, o, bias=False)  # noqa: E731

    class Attn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = lin(H, H), lin(H, 16), lin(H, 16), lin(H, H)

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = lin(H, I), lin(H, I), lin(I, H)

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.self_attn, self.mlp = Attn(), MLP()

    class LM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = torch.nn.Embedding(V, H)
            setattr(self, where, torch.nn.ModuleList([Layer() for _ in range(n_layers)]))
            self.lm_head = lin(H, V)
            self.lm_head.weight = self.embed_tokens.weight  # (tied, as the builder's table read from the head says)

        def get_input_embeddings(self):
            return self.embed_tokens

        def get_output_embeddings(self):
            return self.lm_head

    return LM().eval()


def _w(param):
    return param.detach().float().numpy()


def _graph_of(model, tmp_path, change=None, name="model.onnx"):
    """The builder's graph of ``model`` in several layouts at once: the q, k, v projections as MatMulNBits at 4 bits
    (packed zero points on k), o_proj at 8 bits, gate and up float32 MatMuls, down_proj FP8 blocks; the head at 4
    bits and the embedding table gathered from the head's blocks (a tied table: a Reshape, padded to whole blocks);
    a rotary cache Gather and a MatMul of no parameter. ``change(name, w) -> w`` plants a fault in a matrix."""
    from onnx import TensorProto, helper, numpy_helper

    from edgespec_export.fp8 import quantize_weight

    change = change or (lambda name, w: w)
    nodes, inits = [], []

    def add(name, w, how, prefix):
        w = change(name, w)
        if how in ("4bit", "4bit-zp", "8bit"):
            node, more = _mnb(name, w, 8 if how == "8bit" else 4, "packed" if how == "4bit-zp" else None, prefix)
        elif how == "float32":
            more = [numpy_helper.from_array(np.ascontiguousarray(w.T), prefix + "_W")]
            node = helper.make_node("MatMul", ["A", prefix + "_W"], [prefix + "_Y"], name=name)
        else:  # fp8, blocks of 32 along K (the export's own quantizer)
            wk = np.ascontiguousarray(w.T)
            q, s = quantize_weight(wk, "block", BLOCK)
            more = [helper.make_tensor(prefix + "_Q", TensorProto.FLOAT8E4M3FN, list(wk.shape), q.tobytes(), raw=True),
                    numpy_helper.from_array(s, prefix + "_QS")]
            nodes.append(helper.make_node("DequantizeLinear", [prefix + "_Q", prefix + "_QS"], [prefix + "_Wt"],
                                          axis=0, block_size=BLOCK))
            node = helper.make_node("MatMul", ["A", prefix + "_Wt"], [prefix + "_Y"], name=name)
        nodes.append(node)
        inits.extend(more)

    for i, layer in enumerate(model.layers):
        at, mlp = layer.self_attn, layer.mlp
        for proj, how in (("q_proj", "4bit"), ("k_proj", "4bit-zp"), ("v_proj", "4bit"), ("o_proj", "8bit")):
            add(f"/model/layers.{i}/attn/{proj}/MatMul_Q4", _w(getattr(at, proj).weight), how, f"L{i}{proj}")
        for proj, how in (("gate_proj", "float32"), ("up_proj", "float32"), ("down_proj", "fp8")):
            add(f"/model/layers.{i}/mlp/{proj}/MatMul", _w(getattr(mlp, proj).weight), how, f"L{i}{proj}")
    add("/lm_head/MatMul_Q4", _w(model.lm_head.weight), "4bit", "head")
    # the tied table (the builder's): the head's B [V, nb, 16] reshaped to [V, nb * 16] bytes (64 columns, padded),
    # its scales [V, nb] as they are
    scales = next(t for t in inits if t.name == "head_S")
    scales.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scales).reshape(V, -1), "head_S"))
    nodes.append(helper.make_node("Reshape", ["head_B", "shape"], ["table"]))
    inits.append(numpy_helper.from_array(np.array([V, -1], np.int64), "shape"))
    nodes.append(helper.make_node("GatherBlockQuantized", ["table", "ids", "head_S"], ["emb"],
                                  name="/model/embed_tokens/GatherBlockQuantized", domain="com.microsoft",
                                  gather_axis=0, quantize_axis=1, block_size=BLOCK, bits=4))
    inits.append(numpy_helper.from_array(_rng(9).normal(size=(64, 8)).astype(np.float32), "cos_cache"))
    nodes.append(helper.make_node("Gather", ["cos_cache", "pos"], ["cos"], name="/model/rotemb/Gather"))
    nodes.append(helper.make_node("Shape", ["A"], ["A_shape"]))
    nodes.append(helper.make_node("Gather", ["A_shape", "zero"], ["A_rows"], name="/model/embed_tokens/Shape/Gather"))
    inits.append(numpy_helper.from_array(np.array(0, np.int64), "zero"))
    inits.append(numpy_helper.from_array(_rng(9).normal(size=(H, 8)).astype(np.float32), "extra_W"))
    nodes.append(helper.make_node("MatMul", ["A", "extra_W"], ["extra"], name="/model/other/MatMul"))
    return _save(_model_of(nodes, inits, ["A"], [n.output[0] for n in nodes if n.op_type not in ("DequantizeLinear",
                                                                                                  "Shape")]),
                 tmp_path / name)


MATRICES = 2 * 7 + 2  # 2 layers of q, k, v, o, gate, up, down; the head; the table


def test_a_graph_of_every_layout_holds_torchs_weights(tmp_path):
    """The hand-built graph of a torch model: every matrix and the tied table (its rows padded to whole blocks,
    read through the Reshape and cut to the hidden size) is compared and within its bound; the MatMul of no
    parameter is counted as not checked, the rotary cache's Gather (a table of no parameter) and a Gather of no
    initializer (of a shape) not counted at all."""
    from edgespec_export.weights import BOUND, check_weights

    model = _torch_model()
    out = check_weights(model, _graph_of(model, tmp_path), 2)
    assert out.passed and out.checked == MATRICES and out.unmapped == ["/model/other/MatMul"], out
    assert 0.02 < out.worst < BOUND["4bit"] / 2 and out.worst_name.endswith("MatMul_Q4"), out


@pytest.mark.parametrize("where", ["h", "blocks", "block"])
def test_the_layers_are_found_under_the_other_families_names(where, tmp_path):
    """A model whose decoder layers are ``h`` (GPT-2's), ``blocks`` or ``block`` is mapped like ``layers``, and a
    module list named ``layers`` wins over another of the same length."""
    import torch

    from edgespec_export.weights import _layers, check_weights

    model = _torch_model(where)
    model.layers = model.get_submodule(where)  # (for _graph_of)
    graph = _graph_of(model, tmp_path)
    del model.layers
    assert _layers(model, 2) is model.get_submodule(where)
    out = check_weights(model, graph, 2)
    assert out.passed and out.checked == MATRICES, out
    model.extra = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(2)])
    assert _layers(model, 2) is model.get_submodule(where)  # (the first of the family names, not any list)
    model.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2) for _ in range(2)])
    assert _layers(model, 2) is model.layers and _layers(model, 3) is None


def test_a_node_of_a_layer_torch_has_not_is_not_checked(tmp_path):
    """A graph of three layers against a torch model of two: the third layer's matrices are counted as not checked
    (a model with fewer layers than its graph says is the validation's other checks' to refuse), never an error."""
    from edgespec_export.weights import _Graph, check_weights, torch_weight

    model = _torch_model(n_layers=3)
    graph = _graph_of(model, tmp_path)
    del model.layers[2]
    out = check_weights(model, graph, 2)
    third = {n.name for n in _Graph(graph).g.node if n.name.startswith("/model/layers.2/")}
    assert out.passed and out.checked == MATRICES and set(out.unmapped) == third | {"/model/other/MatMul"}, out
    assert len(third) == 7 and len(out.unmapped) == 8
    assert torch_weight(model, model.layers, "/model/layers.7/attn/q_proj/MatMul") is None


def _scaled(which, by):
    return lambda name, w: w * np.float32(by) if name == which else w


@pytest.mark.parametrize("which,by,kind", [
    ("/model/layers.1/attn/o_proj/MatMul_Q4", 1.1, "8bit"),  # (8-bit rounding ~0.005; bound 0.05)
    ("/model/layers.0/mlp/up_proj/MatMul", 1.01, "float32"),  # (float32: the weights themselves; bound 1e-4)
    ("/model/layers.0/mlp/down_proj/MatMul", 1.25, "fp8"),  # (FP8 ~0.03; bound 0.12)
    ("/model/layers.1/attn/v_proj/MatMul_Q4", 1.8, "4bit"),  # (4 bits ~0.1; bound 0.5)
])
def test_a_matrix_a_scale_off_fails_at_its_precisions_bound(which, by, kind, tmp_path):
    """One matrix scaled (a scale off by 10% at 8 bits, 1% in float32, 25% in FP8, 80% at 4 bits) fails the
    check, named, with its difference past its precision's bound; the same graph unscaled passes."""
    from edgespec_export.weights import BOUND, check_weights

    model = _torch_model()
    out = check_weights(model, _graph_of(model, tmp_path, _scaled(which, by)), 2)
    assert [f[0] for f in out.failed] == [which] and out.checked == MATRICES, out
    name, tname, err, bound = out.failed[0]
    assert bound == BOUND[kind] and bound < err < 1.0 and tname.startswith("layers."), out.failed


def test_a_matrix_torch_holds_as_zeros_fails_unless_the_graph_has_zeros(tmp_path):
    """torch's matrix all zero (a layer pruned, or never loaded) and the graph's not: an infinite relative
    difference, failed; zeros in both: 0, passed."""
    import torch

    from edgespec_export.weights import check_weights, relative_difference

    model = _torch_model()
    graph = _graph_of(model, tmp_path)
    with torch.no_grad():
        model.layers[0].mlp.gate_proj.weight.zero_()
    out = check_weights(model, graph, 2)
    assert [(f[0], f[2]) for f in out.failed] == [("/model/layers.0/mlp/gate_proj/MatMul", float("inf"))], out
    out = check_weights(model, _graph_of(model, tmp_path, name="zeros.onnx"), 2)
    assert out.passed and out.checked == MATRICES, out
    zero = np.zeros((3, 4), np.float32)
    assert relative_difference(lambda r: zero[r], 3, zero) == 0.0
    assert relative_difference(lambda r: zero[r] + 1e-30, 3, zero) == float("inf")


def test_a_nan_in_a_matrix_fails(tmp_path):
    """A NaN in the graph's weights (a scale overflowed, a corrupt file) makes the difference NaN: failed, not
    passed for never being greater than the bound."""
    from edgespec_export.weights import check_weights

    def nan(name, w):
        if name == "/model/layers.1/mlp/gate_proj/MatMul":
            w = w.copy()
            w[3, 5] = np.nan
        return w

    model = _torch_model()
    out = check_weights(model, _graph_of(model, tmp_path, nan), 2)
    assert [f[0] for f in out.failed] == ["/model/layers.1/mlp/gate_proj/MatMul"] and np.isnan(out.failed[0][2]), out


def test_a_table_with_more_rows_or_other_columns_than_torchs_fails(tmp_path):
    """A float embedding table with two rows more than torch's vocabulary, or four columns fewer, fails with an
    infinite difference and torch's shape named; two rows fewer (a graph's vocabulary stopping short of torch's
    padded one) is compared on the rows it has."""
    from onnx import helper, numpy_helper

    from edgespec_export.weights import check_weights

    model = _torch_model()
    emb = _w(model.embed_tokens.weight)
    for rows, cols, fails in ((V + 2, H, True), (V, H - 4, True), (V - 2, H, False)):
        table = np.zeros((rows, cols), np.float32)
        n, c = min(rows, V), min(cols, H)
        table[:n, :c] = emb[:n, :c]
        node = helper.make_node("Gather", ["T", "I"], ["Y"], name="/model/embed_tokens/Gather")
        path = _save(_model_of([node], [numpy_helper.from_array(table, "T")], ["I"]),
                     tmp_path / f"{rows}x{cols}" / "model.onnx")
        out = check_weights(model, path, 2)
        if fails:
            assert out.failed == [("/model/embed_tokens/Gather", f"embed_tokens {(V, H)}", float("inf"), 1e-4)], out
            assert out.checked == 0
        else:
            assert out.passed and out.checked == 1 and out.worst == 0.0, out


def test_find_prefers_the_part_and_leaves_an_ambiguous_name_unmapped():
    """Phi-2 and GPT-NeoX layers have a ``dense`` in the attention and another in the MLP: o_proj's node takes the
    attention's. Two modules of that name under the attention are ambiguous: not mapped (never a guess)."""
    import torch

    from edgespec_export.weights import torch_weight

    class Part(torch.nn.Module):
        def __init__(self, **mods):
            super().__init__()
            for k, v in mods.items():
                setattr(self, k, v)

    layer = Part(attention=Part(dense=torch.nn.Linear(4, 4)), mlp=Part(dense=torch.nn.Linear(4, 6)))
    name, w = torch_weight(None, [layer], "/model/layers.0/attn/o_proj/MatMul")
    assert name == "layers.0.attention.dense" and w.shape == (4, 4)
    layer = Part(attention=Part(dense=torch.nn.Linear(4, 4), inner=Part(dense=torch.nn.Linear(4, 4))),
                 mlp=Part(dense=torch.nn.Linear(4, 6)))
    assert torch_weight(None, [layer], "/model/layers.0/attn/o_proj/MatMul") is None


# --- check_rewrite against the source graph ----------------------------------------------------------------------

def _rewrite_pair(tmp_path, how, change=None, rename=None):
    """A source graph of one MatMulNBits (``how``: "q4k" Q4_K's blocks, "minimum" float minimums that are not,
    "zero-points" packed ones, "none") and its rewrite as exact-kernels packs it; ``change(arrays)`` plants a fault
    in the packed arrays."""
    from onnx import helper, numpy_helper

    from conftest import q4_node_model, q4k_like
    from edgespec_export.kernels import pack_q4

    K, N, name = 256, 40, "/model/layers.0/mlp/down_proj/MatMul_Q4"
    w = _rng(5).normal(size=(N, K)).astype(np.float32)
    if how == "q4k":
        b, s, z, _ = q4k_like(N, K, 6)
    else:
        b, s, z = _blocks(w, 4, {"minimum": "float", "zero-points": "packed", "none": None}[how])
        if how == "minimum":
            z = z + np.float32(0.37)  # (float minimums Q4_K's bytes cannot hold)
    src_inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(s, "S")] + \
        ([numpy_helper.from_array(z, "Z")] if z is not None else [])
    src = helper.make_node("MatMulNBits", ["A", "B", "S"] + (["Z"] if z is not None else []), ["Y"], name=name,
                           domain="com.microsoft", K=K, N=N, bits=4, block_size=32)
    arrays = pack_q4(b, s, z, K, N, 32)
    assert len(arrays) == {"q4k": 5, "minimum": 4}.get(how, 3)
    arrays = change(arrays) if change else arrays
    return (_save(_model_of([src], src_inits, ["A"]), tmp_path / "src" / "model.onnx"),
            _save(q4_node_model(K, N, arrays, rename or name), tmp_path / "new" / "model.onnx", external=True))


@pytest.mark.parametrize("how", ["q4k", "minimum", "zero-points", "none"])
def test_a_rewrite_agrees_with_its_source_and_a_scale_off_by_a_thousandth_fails(how, tmp_path):
    """exact-kernels' tiles unpacked (Q4_K's scale bytes d x sc and dmin x m, float minimums, packed zero points or
    none) are the source's MatMulNBits to float rounding; one column's scale in one block off by 1e-3 (relative) is
    past the rewrite's bound, 1e-5, and named."""
    from edgespec_export.weights import REWRITE_BOUND, check_rewrite

    out = check_rewrite(*_rewrite_pair(tmp_path / "ok", how))
    assert out.passed and out.checked == 1 and not out.unmapped and out.worst < 1e-6, out

    def off(arrays):
        arrays = [a.copy() if a is not None else None for a in arrays]
        if how == "q4k":
            arrays[4][1, 3, 0, 5] += 1  # (one scale byte: sc of column 21, block 3)
        else:
            arrays[1][1, 3, 5] *= np.float32(1.001)
        return arrays

    out = check_rewrite(*_rewrite_pair(tmp_path / "off", how, off))
    assert [f[0] for f in out.failed] == ["/model/layers.0/mlp/down_proj/MatMul_Q4"], out
    assert REWRITE_BOUND < out.failed[0][2] < 0.1, out.failed


def test_a_rewritten_matrix_the_source_has_not_is_counted_not_found(tmp_path):
    """A MatMulQ4 whose name is no MatMulNBits of the source graph is counted as not found (exact-kernels refuses
    a rewrite with any), not skipped."""
    from edgespec_export.weights import check_rewrite

    out = check_rewrite(*_rewrite_pair(tmp_path, "none", rename="/model/layers.0/mlp/up_proj/MatMul_Q4"))
    assert out.checked == 0 and out.unmapped == ["/model/layers.0/mlp/up_proj/MatMul_Q4"] and out.passed, out


def test_a_packed_gate_up_projection_gives_each_half_and_a_model_without_a_head_maps_none():
    """Phi-3's ``gate_up_proj`` (one matrix, gate rows first): the builder's gate_proj node holds its first half,
    up_proj its second, and gate_up_proj all of it. A model with no output embeddings (``get_output_embeddings``
    None) maps no head: the lm_head node is not checked, never compared with the input table."""
    import torch

    from edgespec_export.weights import torch_weight

    class Part(torch.nn.Module):
        pass

    layer, mlp = Part(), Part()
    mlp.gate_up_proj, mlp.down_proj = torch.nn.Linear(4, 12, bias=False), torch.nn.Linear(6, 4, bias=False)
    layer.mlp = mlp
    w = _w(mlp.gate_up_proj.weight)
    for proj, rows, half in (("gate_proj", slice(0, 6), "first"), ("up_proj", slice(6, 12), "second")):
        name, got = torch_weight(None, [layer], f"/model/layers.0/mlp/{proj}/MatMul")
        assert name == f"layers.0.mlp.gate_up_proj[{half} half]" and np.array_equal(got, w[rows]), proj
    name, got = torch_weight(None, [layer], "/model/layers.0/mlp/gate_up_proj/MatMul")
    assert name == "layers.0.mlp.gate_up_proj" and np.array_equal(got, w)
    model = _torch_model()
    assert torch_weight(model, model.layers, "/lm_head/MatMul_Q4")[0] == "lm_head"
    model.get_output_embeddings = lambda: None
    assert torch_weight(model, model.layers, "/lm_head/MatMul_Q4") is None
    assert torch_weight(model, model.layers, "/model/embed_tokens/Gather")[0] == "embed_tokens"
