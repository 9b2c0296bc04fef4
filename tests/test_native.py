"""edgespec's width-invariant CPU kernels (edgespec/native/q4gemm.cpp: ``edgespec.MatMulQ4`` and
``edgespec.DecodeAttention``) and the ``exact-kernels`` rewrite that puts them into a bundle (or,
with ``--onnxruntime-attention``, pads onnxruntime's attention to two query rows instead).

The premise of the rewrite, tested here: a row of the kernel's output is bitwise the same whatever
the call's width, so the width probe picks one-token calls and greedy speculative output still equals
autoregressive output, with every drafter, on tiny random models and on SmolLM2.
"""
from __future__ import annotations

import contextlib
import json
import re

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import q4_node_model, q4k_like

import edgespec
from edgespec.errors import ProviderError
from edgespec.native import cpu_supported

pytestmark = pytest.mark.skipif(cpu_supported() is not None, reason=f"{cpu_supported()}")


def _zero_points(rng, N, nb, kind):
    """MatMulNBits zero points: packed 4-bit (True), none (False) or "float", one float per block (a GGUF
    Q4_1/Q4_K block's minimum over its scale: MatMulQ4 takes them as minimums, its input 5)."""
    if kind == "float":
        return (rng.random(N * nb) * 16).astype(np.float32)
    return rng.integers(0, 256, size=(N * ((nb + 1) // 2),), dtype=np.uint8) if kind else None


def _graph(K, N, block, op, zero_points=True, seed=0, batch=False):
    from onnx import TensorProto, helper, numpy_helper

    from edgespec_export.kernels import pack_q4

    nb = K // block
    rng = np.random.default_rng(seed)
    arrs = [rng.integers(0, 256, size=(N, nb, block // 2), dtype=np.uint8),
            (rng.random(N * nb) * 0.02 + 0.001).astype(np.float32), _zero_points(rng, N, nb, zero_points)]
    if op == "MatMulQ4":  # the kernel reads MatMulNBits' numbers in its own tiled layout
        arrs = list(pack_q4(*arrs, K, N, block))
    names = ["B", "S", "Z", "M"]  # (minimums: MatMulQ4's input 5, after the bias)
    inits = [numpy_helper.from_array(a, n) for a, n in zip(arrs, names) if a is not None]
    ins = ["A"] + [n if a is not None else "" for a, n in zip(arrs, names)]
    if len(ins) == 5:  # minimums (no zero points beside them): input 5, after the bias's slot
        ins.insert(4, "")
    while not ins[-1]:
        ins.pop()
    dom = "com.microsoft" if op == "MatMulNBits" else "edgespec"
    kw = {"accuracy_level": 4} if op == "MatMulNBits" else {}
    node = helper.make_node(op, ins, ["Y"], domain=dom, K=K, N=N, bits=4, block_size=block, **kw)
    shape_in, shape_out = (["b", "M", K], ["b", "M", N]) if batch else (["M", K], ["M", N])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, shape_in)],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, shape_out)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(dom, 1)])


def _session(model):
    import onnxruntime as ort

    from conftest import pool_session_options
    from edgespec.native import library_path

    so = pool_session_options()
    so.register_custom_ops_library(library_path())
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _dequant_reference(model, x):
    """float64 product with the dequantized weights (what both kernels approximate)."""
    from onnx import helper, numpy_helper

    n = model.graph.node[0]
    a = {x.name: helper.get_attribute_value(x) for x in n.attribute}
    K, N, blk = a["K"], a["N"], a["block_size"]
    nb = K // blk
    t = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    b = t["B"].reshape(N, nb, blk // 2)
    q = np.stack([b & 15, b >> 4], axis=-1).reshape(N, nb, blk).astype(np.float64)
    if "Z" in t and t["Z"].dtype == np.float32:
        z = t["Z"].reshape(N, nb).astype(np.float64)
    elif "Z" in t:
        z = np.stack([t["Z"] & 15, t["Z"] >> 4], axis=-1).reshape(N, -1)[:, :nb].astype(np.float64)
    else:
        z = np.full((N, nb), 8.0)
    w = ((q - z[:, :, None]) * t["S"].reshape(N, nb)[:, :, None]).reshape(N, K)
    return x.astype(np.float64) @ w.T


# the matrix kernel's paths a test runs: the CPU's own, and each narrower one. "avx512" (VNNI without AMX, what a Zen 4
# or 5 takes) runs where it is not the CPU's own path, on an AMX CPU: there "this-cpu" takes AMX from 4 rows, and
# the VNNI path's wider passes had only one bitwise comparison with AVX2's (session 91)
Q4_PATHS = ["this-cpu", "avx512", "avx2", "portable"]


def _take_path(isa, monkeypatch):
    """EDGESPEC_Q4_ISA set to ``isa`` (left unset for "this-cpu"); "avx512" skipped where the CPU's own path is it
    (no AMX, or no permission for its tiles: "this-cpu" ran it) or where the CPU has no AVX-512 VNNI."""
    if isa == "this-cpu":
        return
    if isa == "avx512":
        own = _isa_of_cpu()
        if own != "avx512-vnni+amx":
            pytest.skip(f"the AVX-512 VNNI path alone: this CPU's own path is {own}, which 'this-cpu' ran")
    monkeypatch.setenv("EDGESPEC_Q4_ISA", isa)


@pytest.mark.parametrize("isa", Q4_PATHS)
@pytest.mark.parametrize("K,N,block,zp", [(256, 48, 128, True), (96, 37, 32, True), (128, 70, 64, False),
                                          (1536, 300, 128, True), (256, 37, 32, "float"), (1536, 300, 32, "float"),
                                          (1536, 300, 128, "float"), (256, 37, 64, "float")])  # (HQQ's blocks)
def test_kernel_matches_matmulnbits_and_rows_do_not_depend_on_the_width(K, N, block, zp, isa, monkeypatch):
    """Against the float64 reference and MatMulNBits, and each row the same bits at widths 1 to 17 (the
    AVX2 path takes rows in passes of up to 8, the AVX-512 one of up to 8, AMX in chunks of 16) and
    wherever it sits in the call; on the path this CPU takes and on each narrower one (Q4_PATHS)."""
    _take_path(isa, monkeypatch)
    x = np.random.default_rng(1).normal(size=(17, K)).astype(np.float32)
    ours = _session(_graph(K, N, block, "MatMulQ4", zp))
    ref_model = _graph(K, N, block, "MatMulNBits", zp)
    y = ours.run(None, {"A": x})[0]
    exact = _dequant_reference(ref_model, x)
    scale = np.abs(exact).max()
    # int8 activations per block: the error MatMulNBits at accuracy level 4 has too
    assert np.abs(y - exact).max() / scale < 0.02
    theirs = _session(ref_model).run(None, {"A": x})[0]
    assert np.abs(y - theirs).max() / scale < 0.01
    for m in range(1, 17):  # the premise of one-token decoding: each row bitwise the same at every width
        assert np.array_equal(ours.run(None, {"A": x[:m]})[0], y[:m]), m
    for start in range(1, 5):  # and wherever the row sits in the call
        assert np.array_equal(ours.run(None, {"A": x[start:start + 3]})[0], y[start:start + 3])
        assert np.array_equal(ours.run(None, {"A": x[start:start + 9]})[0], y[start:start + 9])


@pytest.mark.parametrize("isa", Q4_PATHS)
def test_a_block_too_small_to_scale_counts_as_zeros(isa, monkeypatch):
    """(session 54; a review in session 53) A block whose largest magnitude is below ~3.7e-37 has no finite 127 /
    amax: its values were multiplied by inf and quantized to -127 (a 0 to NaN, then -127), so a row of such values
    came out as the weights' sum with the sign flipped. Such a block quantizes to zeros now, on every path: the
    row gives the bits of the same row with that block zeroed."""
    _take_path(isa, monkeypatch)
    x = np.random.default_rng(4).normal(size=(4, 96)).astype(np.float32)
    s = _session(_graph(96, 37, 32, "MatMulQ4"))
    x[1, :] = 1e-38
    x[2, :32] = np.float32(2e-38) * np.sign(x[2, :32])
    x[2, 5] = 0.0
    zeroed = x.copy()
    zeroed[1, :] = 0.0
    zeroed[2, :32] = 0.0
    y = s.run(None, {"A": x})[0]
    assert np.array_equal(y, s.run(None, {"A": zeroed})[0])
    assert (y[1] == 0).all() and np.isfinite(y).all()


@pytest.mark.parametrize("isa", Q4_PATHS)
def test_a_nan_in_a_row_makes_that_row_nan(isa, monkeypatch):
    """(session 48, a review) The int8 quantization's block maximum skipped a NaN: a row of NaN (an overflow, then
    RMSNorm) came out as zeros, and decoding went on past the logits' NaN check. A block holding a NaN makes its row
    NaN now, on every path, and the other rows keep their bits."""
    _take_path(isa, monkeypatch)
    x = np.random.default_rng(3).normal(size=(5, 96)).astype(np.float32)
    s = _session(_graph(96, 37, 32, "MatMulQ4"))
    clean = s.run(None, {"A": x})[0]
    x[1, :] = np.nan
    x[3, 40] = np.nan
    y = s.run(None, {"A": x})[0]
    assert np.isnan(y[1]).all() and np.isnan(y[3]).all()
    assert np.array_equal(y[[0, 2, 4]], clean[[0, 2, 4]])


def test_kernel_takes_batched_inputs_and_an_empty_call():
    x = np.random.default_rng(2).normal(size=(1, 5, 64)).astype(np.float32)
    s = _session(_graph(64, 20, 32, "MatMulQ4", batch=True))
    y = s.run(None, {"A": x})[0]
    assert y.shape == (1, 5, 20)
    assert np.array_equal(s.run(None, {"A": x[:, 2:3]})[0], y[:, 2:3])
    assert s.run(None, {"A": x[:, :0]})[0].shape == (1, 0, 20)


def test_kernel_refuses_bad_attributes_and_shapes_with_an_error():
    import onnxruntime as ort  # noqa: F401

    for block in (36, 64):  # no multiple of 8; a multiple of 8 that K (96) is no multiple of (session 90: only the
        bad = _graph(96, 16, 32, "MatMulQ4")  # first was tried, and a kernel taking the second was refused later, by
        for a in bad.graph.node[0].attribute:  # its weights' size)
            if a.name == "block_size":
                a.i = block
        with pytest.raises(Exception, match="MatMulQ4: needs bits=4, a block_size that is a multiple of 8 and K a "
                                            "multiple of it"):
            _session(bad).run(None, {"A": np.zeros((1, 96), np.float32)})
    s = _session(_graph(96, 16, 32, "MatMulQ4"))
    with pytest.raises(Exception, match="MatMulQ4|dimension|shape|Invalid"):
        s.run(None, {"A": np.zeros((1, 64), np.float32)})
    # (session 90) zero points one short of the tiled layout's (no test gave any: they were read past their end)
    from onnx import numpy_helper

    bad = _graph(96, 16, 32, "MatMulQ4")
    z = next(i for i in bad.graph.initializer if i.name == "Z")
    z.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(z)[:-1].copy(), "Z"))
    with pytest.raises(Exception, match="MatMulQ4: zero points do not have the size K, N and block_size say"):
        _session(bad).run(None, {"A": np.zeros((1, 96), np.float32)})


def test_library_build_without_a_compiler_is_a_typed_error(tmp_path, monkeypatch):
    import edgespec.native as native

    monkeypatch.setattr(native, "_cached", None)
    monkeypatch.setenv("EDGESPEC_NATIVE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(ProviderError, match="building edgespec's INT4 kernel failed|compiler"):
        try:
            native.library_path()
        except FileNotFoundError as e:  # subprocess cannot start it: must not escape untyped
            pytest.fail(f"untyped error: {e}")
    assert not list((tmp_path / "cache").glob("*.so"))
    # (session 65, a review) a compiler that fails without a word: its status, not "failed: ?"
    monkeypatch.setenv("CXX", "false")
    with pytest.raises(ProviderError, match=r"failed: false exited with status 1 and said nothing$"):
        native.library_path()
    assert not list((tmp_path / "cache").glob("*.so")) and not list((tmp_path / "cache").glob(".build-*"))


def test_a_mistyped_kernel_path_is_refused(monkeypatch):
    """(session 65, a review) EDGESPEC_Q4_ISA=AVX2 (the kernel compares the values as written) took the default path
    without a word; now a typed error naming the values."""
    import edgespec.native as native

    monkeypatch.setenv("EDGESPEC_Q4_ISA", "AVX2")
    with pytest.raises(ProviderError, match=r"EDGESPEC_Q4_ISA must be avx2, avx512 or portable \(or unset\), got 'AVX2'"):
        native.library_path()
    for ok in native.Q4_ISA_VALUES:
        monkeypatch.setenv("EDGESPEC_Q4_ISA", ok)
        assert native.library_path()


def test_no_home_directory_and_a_compiler_command_line(tmp_path, monkeypatch):
    """(session 48, a review) Without $HOME and a passwd entry (a container's numeric uid) Path.home() raised an
    untyped RuntimeError from every sampled token (top-p's build never cached its failure); CXX="ccache g++" was
    run as one program's name."""
    import pwd

    import edgespec.integrity as integrity
    import edgespec.native as native
    from edgespec.errors import ConfigError

    def no_entry(uid):
        raise KeyError(uid)

    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("EDGESPEC_NATIVE_DIR", raising=False)
    monkeypatch.delenv("EDGESPEC_CACHE_DIR", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    monkeypatch.setattr(native, "_cached", None)
    monkeypatch.setattr(native, "_top_p", [])
    with pytest.raises(ProviderError, match="no home directory: set EDGESPEC_NATIVE_DIR"):
        native.library_path()
    assert native.top_p_kernel() is None  # sampling stays in numpy
    with pytest.raises(ConfigError, match="no home directory: set EDGESPEC_CACHE_DIR"):
        integrity.cache_root()
    monkeypatch.setenv("EDGESPEC_NATIVE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "_top_p", [])
    import shutil

    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    monkeypatch.setenv("CXX", 'g++ "')  # (an unbalanced quote: a ValueError's traceback from the first top-p)
    assert native.top_p_kernel() is None
    monkeypatch.setattr(native, "_top_p", [])
    monkeypatch.setenv("CXX", f"env {cxx}")  # a command line, as make takes CXX
    assert native.top_p_kernel() is not None


def test_a_damaged_library_in_the_cache_is_built_again(tmp_path, monkeypatch):
    """(session 46, a review) a library the cache held was trusted by its name: emptied (a crash before its bytes
    reached the disk) it failed every later run, cut short it was a bus error at load (the process gone, a server
    on any bundle that samples with top-p). Its bytes are checked against the sha256 its build recorded."""
    import ctypes
    import subprocess
    import sys
    from pathlib import Path

    import edgespec.native as native

    monkeypatch.setenv("EDGESPEC_NATIVE_DIR", str(tmp_path))
    path = Path(native._build(native.TOPP_SOURCE, "libedgespec_topp", "the top-p kernel"))
    good = path.read_bytes()
    for damage in (b"", good[:2000]):
        path.unlink()  # (a new file: this process may have the old one mapped)
        path.write_bytes(damage)
        assert native._build(native.TOPP_SOURCE, "libedgespec_topp", "the top-p kernel") == str(path)
        assert path.read_bytes() == good
        ctypes.CDLL(str(path)).es_top_p  # noqa: B018 (it loads)
    path.unlink()
    path.write_bytes(good[:2000])  # a process of its own loading the damaged file: the planted bug's bus error
    r = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(path)!r})"], capture_output=True)
    assert r.returncode != 0
    # a library built before the digest was recorded: taken where whole (its digest recorded), built again where cut
    digest = path.with_name(path.name + ".sha256")
    digest.unlink()
    path.unlink()
    path.write_bytes(good)
    assert native._intact(path) and digest.is_file()
    digest.unlink()
    path.unlink()
    path.write_bytes(good[:-100])
    assert not native._intact(path)
    assert native._build(native.TOPP_SOURCE, "libedgespec_topp", "the top-p kernel") and path.read_bytes() == good
    (tmp_path / "not-a-library.so").write_text("x")  # (isa() loads what library_path gives: typed where it fails)
    monkeypatch.setattr(native, "library_path", lambda: str(tmp_path / "not-a-library.so"))
    with pytest.raises(ProviderError, match="cannot be loaded .*delete it"):
        native.isa()


def test_the_kernel_builds_without_amx_for_an_older_compiler(tmp_path):
    """(session 46, a review) the AMX path's target attribute and tile intrinsics need GCC 11 (clang 12): with an older
    compiler (Ubuntu 20.04's GCC 9) the whole library failed to build, exact-kernels bundles unusable. It builds
    without the AMX path there (ES_AMX_BUILT 0, which -DES_NO_AMX forces: no tile instruction in it), and that
    library loads and takes the AVX-512 or AVX2 path."""
    import ctypes
    import platform
    import shutil
    import subprocess

    import edgespec.native as native

    cxx = shutil.which("g++") or shutil.which("c++")
    if platform.machine().lower() not in ("x86_64", "amd64") or cxx is None or shutil.which("objdump") is None:
        pytest.skip("the AMX switch is x86-64's; needs g++ and objdump")
    out = tmp_path / "libq4-noamx.so"
    r = subprocess.run([cxx, *native.FLAGS, "-DES_NO_AMX", "-o", str(out), str(native.SOURCE)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    code = subprocess.run(["objdump", "-d", str(out)], capture_output=True, text=True, timeout=120).stdout
    assert "tdpbssd" not in code and "ldtilecfg" not in code
    full = subprocess.run(["objdump", "-d", native.library_path()], capture_output=True, text=True, timeout=120).stdout
    assert "tdpbssd" in full  # (the default build has the AMX path: the check above can fail)
    fn = ctypes.CDLL(str(out)).edgespec_q4_path
    fn.restype = ctypes.c_char_p
    assert fn().decode() in ("avx2", "avx512-vnni", "portable")


def _attention_graph(op, H, KVH, D, L, P, seed=0, scale=0.0, positions=False, window=-1, softcap=0.0, rot=None,
                     interleaved=0):
    """One attention node: onnxruntime's GroupQueryAttention (the builder's CPU attention: packed QKV,
    rotary, KV cache [1, KVH, L, D]) or edgespec.DecodeAttention over the same inputs
    (edgespec.DecodeAttentionF16: the caches float16); ``positions``: with the optional input of the
    rows' positions (int64 ``pos``, edgespec's op only); ``window``, ``softcap``: the ops' sliding window
    (local_window_size) and score cap (Gemma 2 and 3's local layers; edgespec's op without them where
    they are -1 and 0, as before they were there); ``rot``: the rotary's pairs (cos and sin columns), D / 2 unless
    given (fewer: a partial rotary, Phi-4-mini's and Phi-2's)."""
    from onnx import TensorProto, helper, numpy_helper

    R = D // 2 if rot is None else rot
    ang = np.arange(P)[:, None] * (10000.0 ** (-np.arange(R) / R))[None, :]
    inits = [numpy_helper.from_array(np.cos(ang).astype(np.float32), "cos"),
             numpy_helper.from_array(np.sin(ang).astype(np.float32), "sin")]
    f = TensorProto.FLOAT
    kv = TensorProto.FLOAT16 if op.endswith("F16") else TensorProto.INT8 if op.endswith("Q8") else f
    W = D + D // 8 if op.endswith("Q8") else D  # (a Q8 row: D int8 numbers, then a float32 scale per 32)
    ins = [helper.make_tensor_value_info("qkv", f, [1, "n", (H + 2 * KVH) * D]),
           helper.make_tensor_value_info("pk", kv, [1, KVH, L, W]), helper.make_tensor_value_info("pv", kv, [1, KVH, L, W]),
           helper.make_tensor_value_info("seqlens", TensorProto.INT32, [1])]
    outs = [helper.make_tensor_value_info("out", f, [1, "n", H * D]),
            helper.make_tensor_value_info("k", kv, [1, KVH, "t", W]), helper.make_tensor_value_info("v", kv, [1, KVH, "t", W])]
    if op == "GroupQueryAttention":
        ins.append(helper.make_tensor_value_info("total", TensorProto.INT32, []))
        node = helper.make_node(op, ["qkv", "", "", "pk", "pv", "seqlens", "total", "cos", "sin"], ["out", "k", "v"],
                                domain="com.microsoft", num_heads=H, kv_num_heads=KVH, scale=scale, do_rotary=1,
                                rotary_interleaved=interleaved, local_window_size=window, softcap=softcap)
        dom = "com.microsoft"
    else:
        extra = {**({"local_window_size": window} if window != -1 else {}), **({"softcap": softcap} if softcap else {}),
                 **({"rotary_interleaved": 1} if interleaved else {})}
        node = helper.make_node(op, ["qkv", "pk", "pv", "seqlens", "cos", "sin"] + ["pos"] * positions, ["out", "k", "v"],
                                domain="edgespec", num_heads=H, kv_num_heads=KVH, scale=scale, **extra)
        dom = "edgespec"
        if positions:
            ins.append(helper.make_tensor_value_info("pos", TensorProto.INT64, ["n"]))
    g = helper.make_graph([node], "g", ins, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(dom, 1)])


def _cache_for(op, isa, monkeypatch, H, KVH, D, L, past, rows, seed):
    """``_attention_inputs`` with the caches in ``op``'s type (float16 for the F16 op), on kernel path ``isa``
    ("avx2": EDGESPEC_Q4_ISA, read when a session registers the library)."""
    if isa != "this-cpu":
        monkeypatch.setenv("EDGESPEC_Q4_ISA", isa)
    cache_k, cache_v, qkv = _attention_inputs(H, KVH, D, L, past, rows, seed)
    if op.endswith("F16"):
        cache_k, cache_v = cache_k.astype(np.float16), cache_v.astype(np.float16)
    return cache_k, cache_v, qkv


def _follows_onnxruntime(op, full, qkv, cache_k, cache_v, H, KVH, D, L, P, past, **attrs):
    """The call ``full`` (``op``'s outputs for ``qkv`` over the caches at ``past``) against a float64 reference over
    its present caches and (float32 caches) onnxruntime's GroupQueryAttention with the same ``attrs`` (window,
    softcap, rot, interleaved: ``_attention_graph``'s); its new keys too. Returns the reference."""
    from onnx import numpy_helper

    cos, sin = (numpy_helper.to_array(x) for x in _attention_graph(op, H, KVH, D, L, P, rot=attrs.get("rot")).graph.initializer)
    want = _attention_reference(qkv, full[1], full[2], cos, sin, H, KVH, D, past, attrs.get("window", -1),
                                attrs.get("softcap", 0.0), bool(attrs.get("interleaved", 0)))
    assert np.abs(full[0][0] - want).max() < 2e-4 * max(1.0, np.abs(want).max())
    if not op.endswith("F16"):
        n = qkv.shape[1]
        theirs = _session(_attention_graph("GroupQueryAttention", H, KVH, D, L, P, **attrs))
        ref = theirs.run(None, {"qkv": qkv, "pk": cache_k, "pv": cache_v, "total": np.array(past + n, np.int32),
                                "seqlens": np.array([past + n - 1], np.int32)})
        assert np.abs(full[0] - ref[0]).max() < 2e-4 * max(1.0, np.abs(ref[0]).max())
        assert np.abs(full[1][:, :, :past + n] - ref[1][:, :, :past + n]).max() < 1e-5
    return want


def _rows_are_one_row_calls(run, qkv, past, full):
    """Each row of the call ``full`` (``run(qkv, past)``'s outputs) is bitwise a one-row call's at its position
    over the call's own caches (whose task then starts its key blocks at that row's window)."""
    for i in range(qkv.shape[1]):
        assert np.array_equal(run(qkv[:, i:i + 1], past + i, full[1], full[2])[0][:, 0], full[0][:, i]), i


def _attention_inputs(H, KVH, D, L, past, rows, seed):
    """A KV cache of ``L`` positions, the first ``past`` filled, and packed qkv for ``rows`` new tokens."""
    rng = np.random.default_rng(seed)
    cache_k = np.zeros((1, KVH, L, D), np.float32)
    cache_v = np.zeros((1, KVH, L, D), np.float32)
    cache_k[:, :, :past] = rng.normal(size=(1, KVH, past, D))
    cache_v[:, :, :past] = rng.normal(size=(1, KVH, past, D))
    return cache_k, cache_v, rng.normal(size=(1, rows, (H + 2 * KVH) * D)).astype(np.float32)


@pytest.mark.parametrize("isa", ["this-cpu", "avx2", "portable"])
@pytest.mark.parametrize("H,KVH,D", [(12, 2, 128), (14, 2, 64), (4, 4, 32), (6, 2, 48), (3, 1, 16)])
def test_decode_attention_matches_onnxruntime_and_rows_do_not_depend_on_the_width(H, KVH, D, isa, monkeypatch):
    """edgespec.DecodeAttention against onnxruntime's GroupQueryAttention on the same cache (past
    positions filled, then calls of 1..9 new tokens): outputs and the new keys/values within float
    rounding; each query row bitwise the same at every width and whatever the call's first position;
    on the path this CPU takes (16 lanes with AVX-512) and on the 8-lane AVX2 one (EDGESPEC_Q4_ISA,
    read when a session registers the library)."""
    if isa != "this-cpu":
        monkeypatch.setenv("EDGESPEC_Q4_ISA", isa)
    L, P, past = 64, 80, 21
    cache_k, cache_v, qkv = _attention_inputs(H, KVH, D, L, past, 9, seed=3)
    ours = _session(_attention_graph("DecodeAttention", H, KVH, D, L, P))
    theirs = _session(_attention_graph("GroupQueryAttention", H, KVH, D, L, P))

    def run(sess, q, at, gqa=False):
        feeds = {"qkv": q, "pk": cache_k, "pv": cache_v, "seqlens": np.array([at + q.shape[1] - 1], np.int32)}
        if gqa:
            feeds["total"] = np.array(at + q.shape[1], np.int32)
        return sess.run(None, feeds)

    with _attention_takes_its_path(D):
        full = run(ours, qkv, past)
    ref = run(theirs, qkv, past, gqa=True)
    assert np.abs(full[0] - ref[0]).max() < 2e-4 * max(1.0, np.abs(ref[0]).max())
    t = past + 9
    assert np.abs(full[1][:, :, :t] - ref[1][:, :, :t]).max() < 1e-5 and np.array_equal(full[2][:, :, :t], ref[2][:, :, :t])
    for n in range(1, 9):  # a call of the first n tokens computes their rows as the call of 9 did
        assert np.array_equal(run(ours, qkv[:, :n], past)[0], full[0][:, :n]), n
    # and a call that starts later (its earlier tokens already in the cache) computes the same rows
    head = run(ours, qkv[:, :4], past)
    cache_k[:, :, past:past + 4], cache_v[:, :, past:past + 4] = head[1][:, :, past:past + 4], head[2][:, :, past:past + 4]
    assert np.array_equal(run(ours, qkv[:, 4:], past + 4)[0], full[0][:, 4:])


@pytest.mark.parametrize("isa", ["this-cpu", "avx2", "portable"])
def test_decode_attention_takes_its_scale_attribute(isa, monkeypatch):
    """(session 90, a mutation test) A scale other than 0 (Gemma 2-4's 1; Granite's multiplier) scales the scores as
    onnxruntime's op does; every other test passes 0 (1 / sqrt(D)), and an op ignoring its scale passed them."""
    if isa != "this-cpu":
        monkeypatch.setenv("EDGESPEC_Q4_ISA", isa)
    H, KVH, D, L, P, past = 4, 2, 32, 64, 80, 21
    cache_k, cache_v, qkv = _attention_inputs(H, KVH, D, L, past, 3, seed=7)
    feeds = {"qkv": qkv, "pk": cache_k, "pv": cache_v, "seqlens": np.array([past + 2], np.int32)}
    outs = []
    for scale in (1.0, 0.05):
        ours = _session(_attention_graph("DecodeAttention", H, KVH, D, L, P, scale=scale)).run(None, feeds)[0]
        theirs = _session(_attention_graph("GroupQueryAttention", H, KVH, D, L, P, scale=scale)).run(
            None, {**feeds, "total": np.array(past + 3, np.int32)})[0]
        assert np.abs(ours - theirs).max() < 2e-4 * max(1.0, np.abs(theirs).max()), scale
        outs.append(ours)
    assert np.abs(outs[0] - outs[1]).max() > 0.1  # (the two scales' attention differs: the check above can fail)


@pytest.mark.parametrize("H,KVH,D", [(12, 2, 128), (14, 2, 64), (3, 1, 16), (5, 1, 32)])
def test_decode_attention_in_fours_computes_the_bits_of_pairs(H, KVH, D, monkeypatch):
    """On the AVX-512 path queries go four to a key tile (EDGESPEC_ATTN_QUADS=0: in pairs, as before
    session 19): each query's chains and trees are the same, so its output is bitwise the same, at
    every width, a prefill-sized call included (a last group of 1-3 queries too: 5 heads a row)."""
    from edgespec.native import isa

    if not isa().startswith("avx512"):
        pytest.skip("the four-query tile is the AVX-512 path's")
    L, P, past = 320, 400, 37
    cache_k, cache_v, qkv = _attention_inputs(H, KVH, D, L, past, 200, seed=5)

    def run(n):
        feeds = {"qkv": qkv[:, :n], "pk": cache_k, "pv": cache_v, "seqlens": np.array([past + n - 1], np.int32)}
        return sess.run(None, feeds)[0]

    got = {}
    for quads in ("1", "0"):
        monkeypatch.setenv("EDGESPEC_ATTN_QUADS", quads)
        sess = _session(_attention_graph("DecodeAttention", H, KVH, D, L, P))
        got[quads] = [run(n) for n in (1, 3, 9, 200)]
    for a, b in zip(got["1"], got["0"]):
        assert np.array_equal(a, b)


def _attention_reference(qkv, cache_k, cache_v, cos, sin, H, KVH, D, past, window=-1, softcap=0.0, interleaved=False):
    # (the rotary over the first 2 x cos.shape[1] lanes of a head, the rest as they are)
    """float64 GroupQueryAttention over the given caches (the call's own keys and values already in
    them at past..past + n - 1): rotary on the queries, causal softmax, per head its group's cache;
    a query at position p attends its last ``window`` keys, max(0, p - window + 1)..p, where window > 0
    (onnxruntime 1.32's op; an earlier one attended one more), its scaled scores s
    capped as softcap * tanh(s / softcap) where softcap > 0 (onnxruntime's op)."""
    n, half = qkv.shape[1], cos.shape[1]
    if cache_k.dtype == np.int8:  # (Q8 caches: the values their rows stand for)
        from edgespec.kv import q8_dequantize

        cache_k, cache_v = q8_dequantize(cache_k, D), q8_dequantize(cache_v, D)
    out = np.zeros((n, H * D))
    for i in range(n):
        pos = past + i
        c, s = cos[pos].astype(np.float64), sin[pos].astype(np.float64)
        for h in range(H):
            x = qkv[0, i, h * D:(h + 1) * D].astype(np.float64)
            if interleaved:
                q = x.copy()
                q[0:2 * half:2] = x[0:2 * half:2] * c - x[1:2 * half:2] * s
                q[1:2 * half:2] = x[1:2 * half:2] * c + x[0:2 * half:2] * s
            else:
                q = np.concatenate([x[:half] * c - x[half:2 * half] * s, x[half:2 * half] * c + x[:half] * s,
                                    x[2 * half:]])
            g = h // (H // KVH)
            first = max(0, pos - window + 1) if window > 0 else 0
            k = cache_k[0, g, first:pos + 1].astype(np.float64)
            v = cache_v[0, g, first:pos + 1].astype(np.float64)
            w = k @ q / np.sqrt(D)
            if softcap > 0:
                w = softcap * np.tanh(w / softcap)
            w = np.exp(w - w.max())
            out[i, h * D:(h + 1) * D] = (w / w.sum()) @ v
    return out


@pytest.mark.parametrize("isa", ["this-cpu", "avx2", "portable"])
@pytest.mark.parametrize("H,KVH,D", [(12, 2, 128), (14, 2, 64), (6, 2, 48), (3, 1, 16)])
def test_decode_attention_f16_rounds_each_new_key_once_and_rows_do_not_depend_on_the_width(H, KVH, D, isa, monkeypatch):
    """edgespec.DecodeAttentionF16 (float16 caches): the new keys are the float32 op's rotated keys
    rounded to float16 (to nearest, ties to even: numpy's astype), the new values the call's values
    rounded; the outputs are attention over the rounded cache (float64 reference); each query row is
    bitwise the same at every width and whatever the call's first position, on both paths."""
    if isa != "this-cpu":
        monkeypatch.setenv("EDGESPEC_Q4_ISA", isa)
    L, P, past = 64, 80, 21
    cache_k, cache_v, qkv = _attention_inputs(H, KVH, D, L, past, 9, seed=4)
    k16, v16 = cache_k.astype(np.float16), cache_v.astype(np.float16)
    half = _session(_attention_graph("DecodeAttentionF16", H, KVH, D, L, P))
    single = _session(_attention_graph("DecodeAttention", H, KVH, D, L, P))

    def run(sess, q, at, k, v):
        return sess.run(None, {"qkv": q, "pk": k, "pv": v, "seqlens": np.array([at + q.shape[1] - 1], np.int32)})

    with _attention_takes_its_path(D):
        full = run(half, qkv, past, k16.copy(), v16.copy())
        ref32 = run(single, qkv, past, cache_k.copy(), cache_v.copy())
    t = past + 9
    assert full[1].dtype == np.float16 and full[2].dtype == np.float16 and full[0].dtype == np.float32
    assert np.array_equal(full[1][:, :, :past], k16[:, :, :past]) and np.array_equal(full[2][:, :, :past], v16[:, :, :past])
    assert np.array_equal(full[1][:, :, past:t], ref32[1][:, :, past:t].astype(np.float16))
    assert np.array_equal(full[2][:, :, past:t], ref32[2][:, :, past:t].astype(np.float16))
    inits = _attention_graph("DecodeAttention", H, KVH, D, L, P).graph.initializer
    from onnx import numpy_helper

    cos, sin = (numpy_helper.to_array(x) for x in inits)
    want = _attention_reference(qkv, full[1], full[2], cos, sin, H, KVH, D, past)
    assert np.abs(full[0][0] - want).max() < 2e-4 * max(1.0, np.abs(want).max())
    # against the float32 op: only the cache's rounding apart (float16 keeps ~3 decimal digits)
    assert np.abs(full[0] - ref32[0]).max() < 2e-2 * max(1.0, np.abs(ref32[0]).max())
    for n in range(1, 9):
        assert np.array_equal(run(half, qkv[:, :n], past, k16.copy(), v16.copy())[0], full[0][:, :n]), n
    head = run(half, qkv[:, :4], past, k16.copy(), v16.copy())
    k2, v2 = k16.copy(), v16.copy()
    k2[:, :, past:past + 4], v2[:, :, past:past + 4] = head[1][:, :, past:past + 4], head[2][:, :, past:past + 4]
    assert np.array_equal(run(half, qkv[:, 4:], past + 4, k2, v2)[0], full[0][:, 4:])


@pytest.mark.parametrize("isa", ["this-cpu", "avx2", "portable"])
def test_decode_attention_f16_saturates_what_float16_cannot_hold(isa, monkeypatch):
    """A new key or value beyond float16's range is stored as +-65504 (numpy's astype would give an
    infinity, and the scores a NaN): the outputs stay finite; the first position (past 0) and the
    cache's last one work; a NaN the model produced stays NaN."""
    if isa != "this-cpu":
        monkeypatch.setenv("EDGESPEC_Q4_ISA", isa)
    H, KVH, D, L = 4, 2, 32, 16
    sess = _session(_attention_graph("DecodeAttentionF16", H, KVH, D, L, L))
    rng = np.random.default_rng(2)
    qkv = rng.normal(size=(1, 2, (H + 2 * KVH) * D)).astype(np.float32)
    qkv[0, 0, H * D + 3] = 1e6  # a key of group 0 (its rotary pairs lane 3 with lane 3 + D/2)
    qkv[0, 1, (H + KVH) * D + 5] = -3e5  # a value of group 0
    k, v = np.zeros((1, KVH, L, D), np.float16), np.zeros((1, KVH, L, D), np.float16)
    out, pk, pv = sess.run(None, {"qkv": qkv, "pk": k, "pv": v, "seqlens": np.array([1], np.int32)})
    # (not bound in place, the outputs hold the call's rows; the rest is whatever the buffer held)
    assert np.isfinite(out).all() and np.isfinite(pk[:, :, :2]).all() and np.isfinite(pv[:, :, :2]).all()
    assert np.abs(pk[0, 0, 0]).max() == 65504 and pv[0, 0, 1, 5] == -65504
    k[:, :, :2], v[:, :, :2] = pk[:, :, :2], pv[:, :, :2]
    q = rng.normal(size=(1, 1, (H + 2 * KVH) * D)).astype(np.float32)
    out = sess.run(None, {"qkv": q, "pk": k, "pv": v, "seqlens": np.array([L - 1], np.int32)})[0]  # past 15
    assert np.isfinite(out).all()
    q[0, 0, (H + KVH) * D] = np.nan
    pv = sess.run(None, {"qkv": q, "pk": k, "pv": v, "seqlens": np.array([2], np.int32)})[2]
    assert np.isnan(pv[0, 0, 2, 0])


@pytest.mark.parametrize("isa", ["this-cpu", "avx2", "portable"])
@pytest.mark.parametrize("op", ["DecodeAttention", "DecodeAttentionF16"])
@pytest.mark.parametrize("H,KVH,D,past", [(12, 2, 128, 21), (6, 2, 48, 130), (3, 1, 16, 62)])
@pytest.mark.parametrize("window,softcap", [(-1, 0.0), (16, 30.0)], ids=["whole", "window-softcap"])
def test_decode_attention_alternates_compute_the_bits_of_a_one_token_call(H, KVH, D, past, op, isa, window, softcap,
                                                                          monkeypatch):
    """The optional positions input: rows 0, 1, ... (positions equal to their rows) are the usual causal
    rows, bitwise as without the input; a later row at position p (an alternate to the draft token of
    row p) writes its key, rotated at past + p, and its value at its own slot, and its output is bitwise
    a one-token call's at past + p over the rows before p and itself. Moving its slot to past + p then
    leaves the cache a call of those tokens alone leaves; the other slots are as the call found them.
    Positions of the wrong count, or an alternate past the causal rows, are refused. (Contexts whose
    alternates' own keys fall in a block of keys' first, middle or unaligned places.)"""
    L, P = 160, 180
    cache_k, cache_v, qkv = _cache_for(op, isa, monkeypatch, H, KVH, D, L, past, 8, seed=6)
    plain = _session(_attention_graph(op, H, KVH, D, L, P, window=window, softcap=softcap))
    posd = _session(_attention_graph(op, H, KVH, D, L, P, positions=True, window=window, softcap=softcap))

    def run(sess, q, at, pos=None, k=cache_k, v=cache_v):
        feeds = {"qkv": q, "pk": k.copy(), "pv": v.copy(), "seqlens": np.array([at + q.shape[1] - 1], np.int32)}
        if pos is not None:
            feeds["pos"] = np.asarray(pos, np.int64)
        return sess.run(None, feeds)

    chain = run(plain, qkv[:, :5], past)
    same = run(posd, qkv[:, :5], past, range(5))
    t = past + 5  # (not bound in place, the present caches past the call's rows hold whatever their buffer held)
    assert np.array_equal(chain[0], same[0])
    assert np.array_equal(chain[1][:, :, :t], same[1][:, :, :t]) and np.array_equal(chain[2][:, :, :t], same[2][:, :, :t])
    rel = [0, 1, 2, 3, 4, 1, 3, 4]  # rows 5..7: alternates at positions 1, 3 and 4
    with _attention_takes_its_path(D):
        got = run(posd, qkv, past, rel)
    assert np.array_equal(got[0][:, :5], chain[0])
    assert np.array_equal(got[1][:, :, :t], chain[1][:, :, :t]) and np.array_equal(got[2][:, :, :t], chain[2][:, :, :t])
    for i in range(5, 8):
        p = rel[i]
        one = run(plain, qkv[:, i:i + 1], past + p, k=chain[1], v=chain[2])  # after rows 0..p-1 of the chain
        assert np.array_equal(got[0][:, i], one[0][:, 0]), i
        assert np.array_equal(got[1][:, :, past + i], one[1][:, :, past + p]), i
        assert np.array_equal(got[2][:, :, past + i], one[2][:, :, past + p]), i
    # (session 90: [.., 1, 5, 2], an alternate at the first position past the causal rows, 5, was taken)
    for bad in ([0, 1, 2, 3, 4, 5, 6], [0, 1, 2, 3, 4, 5, 1, 9], [0, 1, 2, 3, 4, -1, 1, 2], [0, 1, 2, 3, 4, 1, 5, 2]):
        with pytest.raises(Exception, match="positions"):
            run(posd, qkv[:, :len(bad)] if len(bad) == 8 else qkv, past, bad)


@pytest.mark.parametrize("isa", ["this-cpu", "avx2", "portable"])
@pytest.mark.parametrize("op", ["DecodeAttention", "DecodeAttentionF16"])
@pytest.mark.parametrize("H,KVH,D,window,softcap", [(12, 2, 128, 50, 0.0), (6, 2, 48, 70, 20.0), (3, 1, 16, -1, 5.0),
                                                    (8, 4, 32, 16, 0.0), (4, 2, 64, 1, 30.0)])
@pytest.mark.parametrize("past", [12, 130])
def test_decode_attention_window_and_softcap_follow_onnxruntime_and_rows_do_not_depend_on_the_width(
        H, KVH, D, window, softcap, past, op, isa, monkeypatch):
    """The optional local_window_size and softcap (Gemma 2 and 3's local layers), as onnxruntime's
    GroupQueryAttention computes them: a query at position p attends its last W keys, its scaled
    scores capped as c * tanh(s / c). Calls whose rows cross the window's edge (past 12, windows 1-70) and
    calls far past it (past 130): outputs against onnxruntime's op (float32 caches) and a float64
    reference over the present caches (both); each row bitwise the same at every width and whatever the
    call's first position, on both kernel paths."""
    L, P = 160, 180
    cache_k, cache_v, qkv = _cache_for(op, isa, monkeypatch, H, KVH, D, L, past, 9, seed=7)
    ours = _session(_attention_graph(op, H, KVH, D, L, P, window=window, softcap=softcap))

    def run(q, at, k=cache_k, v=cache_v):
        return ours.run(None, {"qkv": q, "pk": k.copy(), "pv": v.copy(),
                               "seqlens": np.array([at + q.shape[1] - 1], np.int32)})

    full = run(qkv, past)
    want = _follows_onnxruntime(op, full, qkv, cache_k, cache_v, H, KVH, D, L, P, past, window=window, softcap=softcap)
    if softcap or 0 < window < past + 8:  # (where they change it, the test tells them apart)
        from onnx import numpy_helper

        cos, sin = (numpy_helper.to_array(x) for x in _attention_graph(op, H, KVH, D, L, P).graph.initializer)
        assert np.abs(_attention_reference(qkv, full[1], full[2], cos, sin, H, KVH, D, past) - want).max() > 1e-3
    for n in range(1, 9):
        assert np.array_equal(run(qkv[:, :n], past)[0], full[0][:, :n]), n
    head = run(qkv[:, :4], past)
    k2, v2 = cache_k.copy(), cache_v.copy()
    k2[:, :, past:past + 4], v2[:, :, past:past + 4] = head[1][:, :, past:past + 4], head[2][:, :, past:past + 4]
    assert np.array_equal(run(qkv[:, 4:], past + 4, k2, v2)[0], full[0][:, 4:])
    _rows_are_one_row_calls(run, qkv, past, full)


@pytest.mark.parametrize("isa", ["this-cpu", "avx2", "portable"])
@pytest.mark.parametrize("W,past,rows", [(16, 60, 20), (5, 250, 24), (64, 120, 30)])
def test_decode_attention_window_rows_of_several_tasks_are_one_row_calls(W, past, rows, isa, monkeypatch):
    """A call of more rows than a task takes (8): its tasks start their key blocks at their own first rows'
    windows, whose blocks cross 64-key boundaries within the call; every row is bitwise a one-row call's at
    its position (F16 caches, Gemma 3 1B's 4 heads to one KV head)."""
    H, KVH, D, L = 4, 1, 64, 320
    cache_k, cache_v, qkv = _cache_for("DecodeAttentionF16", isa, monkeypatch, H, KVH, D, L, past, rows, seed=8)
    s = _session(_attention_graph("DecodeAttentionF16", H, KVH, D, L, L + 8, window=W))

    def run(q, at, k=cache_k, v=cache_v):
        return s.run(None, {"qkv": q, "pk": k.copy(), "pv": v.copy(), "seqlens": np.array([at + q.shape[1] - 1], np.int32)})

    _rows_are_one_row_calls(run, qkv, past, run(qkv, past))


@pytest.mark.parametrize("isa", ["this-cpu", "avx2", "portable"])
@pytest.mark.parametrize("op", ["DecodeAttention", "DecodeAttentionF16"])
@pytest.mark.parametrize("H,KVH,D,rot,inter", [(8, 2, 128, 48, 0), (4, 1, 80, 16, 0), (6, 2, 64, 8, 0), (4, 2, 64, 32, 1),
                                               (6, 2, 64, 16, 1)])
def test_decode_attention_partial_rotary_follows_onnxruntime_and_rows_do_not_depend_on_the_width(H, KVH, D, rot, inter,
                                                                                               op, isa, monkeypatch):
    """A rotary over a head's first lanes only (cos and sin narrower than D / 2: Phi-4-mini's 0.75 of a head,
    Phi-2's 0.4), the other lanes passed as they are, as onnxruntime's op does: the new keys and outputs against
    its GroupQueryAttention (float32 caches) and a float64 reference, each row bitwise a one-row call's and the
    same at every width. exact-kernels had rewritten such a graph and its first call failed ("head size").
    The interleaved rotary (``inter``: lanes 2j and 2j + 1 paired, ERNIE 4.5's), whole or partial, likewise."""
    L, P, past = 96, 100, 40
    cache_k, cache_v, qkv = _cache_for(op, isa, monkeypatch, H, KVH, D, L, past, 9, seed=9)
    ours = _session(_attention_graph(op, H, KVH, D, L, P, rot=rot, interleaved=inter))

    def run(q, at, k=cache_k, v=cache_v):
        return ours.run(None, {"qkv": q, "pk": k.copy(), "pv": v.copy(), "seqlens": np.array([at + q.shape[1] - 1], np.int32)})

    full = run(qkv, past)
    assert _attention_graph(op, H, KVH, D, L, P, rot=rot).graph.initializer[0].dims[1] == rot
    _follows_onnxruntime(op, full, qkv, cache_k, cache_v, H, KVH, D, L, P, past, rot=rot, interleaved=inter)
    for n in range(1, 9):
        assert np.array_equal(run(qkv[:, :n], past)[0], full[0][:, :n]), n
    _rows_are_one_row_calls(run, qkv, past, full)


def test_decode_attention_refuses_a_bad_window_or_softcap():
    for bad in ({"window": -2}, {"window": 0}, {"softcap": -1.0}, {"softcap": float("inf")}):
        with pytest.raises(Exception, match="local_window_size must be"):
            _session(_attention_graph("DecodeAttention", 4, 2, 32, 16, 20, **bad)).run(None, {
                "qkv": np.zeros((1, 1, 8 * 32), np.float32), "pk": np.zeros((1, 2, 16, 32), np.float32),
                "pv": np.zeros((1, 2, 16, 32), np.float32), "seqlens": np.array([0], np.int32)})


def test_decode_attention_refuses_rotary_tables_of_the_wrong_shape():
    """cos wider than half a head, or sin of another shape than cos: one error naming the op, not a read past them."""
    g = _attention_graph("DecodeAttention", 4, 2, 32, 16, 20, rot=24)  # (cos 24 columns: more than D / 2 = 16)
    feeds = {"qkv": np.zeros((1, 1, 8 * 32), np.float32), "pk": np.zeros((1, 2, 16, 32), np.float32),
             "pv": np.zeros((1, 2, 16, 32), np.float32), "seqlens": np.array([0], np.int32)}
    with pytest.raises(Exception, match="DecodeAttention: .*cos has more than D/2 columns"):
        _session(g).run(None, feeds)
    from onnx import numpy_helper

    g = _attention_graph("DecodeAttention", 4, 2, 32, 16, 20, rot=8)
    sin = g.graph.initializer[1]
    sin.CopyFrom(numpy_helper.from_array(np.zeros((20, 4), np.float32), sin.name))
    with pytest.raises(Exception, match="DecodeAttention: expects .*cos and sin \\[P, R\\]"):
        _session(g).run(None, feeds)


def test_decode_attention_refuses_bad_lengths_with_an_error():
    s = _session(_attention_graph("DecodeAttention", 4, 2, 32, 16, 20))
    feeds = {"qkv": np.zeros((1, 3, 8 * 32), np.float32), "pk": np.zeros((1, 2, 16, 32), np.float32),
             "pv": np.zeros((1, 2, 16, 32), np.float32)}
    for bad in (1, 16):  # valid length below the call's width; past the cache
        with pytest.raises(Exception, match="DecodeAttention"):
            s.run(None, {**feeds, "seqlens": np.array([bad], np.int32)})
    with pytest.raises(Exception, match="DecodeAttention|invalid dimensions"):  # (the graph's shape says so first)
        s.run(None, {**feeds, "qkv": np.zeros((1, 3, 8 * 32 + 4), np.float32), "seqlens": np.array([5], np.int32)})
    s16 = _session(_attention_graph("DecodeAttentionF16", 4, 2, 32, 16, 20))  # (its errors name it)
    half = {**feeds, "pk": feeds["pk"].astype(np.float16), "pv": feeds["pv"].astype(np.float16)}
    with pytest.raises(Exception, match="edgespec.DecodeAttentionF16: seqlens_k"):
        s16.run(None, {**half, "seqlens": np.array([16], np.int32)})
    # (session 54, a review) seqlens_k was read unchecked: a graph that lets it be empty read past it
    from onnx import TensorProto, helper

    g = _attention_graph("DecodeAttention", 4, 2, 32, 16, 20)
    g.graph.input[3].CopyFrom(helper.make_tensor_value_info("seqlens", TensorProto.INT32, ["b"]))
    s = _session(g)
    one = {**feeds, "qkv": feeds["qkv"][:, :1]}
    assert s.run(None, {**one, "seqlens": np.array([4], np.int32)})[0].shape == (1, 1, 4 * 32)
    for bad in (np.zeros(0, np.int32), np.array([4, 4], np.int32)):
        with pytest.raises(Exception, match="DecodeAttention: seqlens_k must hold one value"):
            s.run(None, {**one, "seqlens": bad})


@pytest.fixture(scope="module")
def tiny_xk(tiny_int4_bundle, tmp_path_factory):
    from edgespec_export.kernels import apply_to_bundle

    return apply_to_bundle(tiny_int4_bundle, tmp_path_factory.mktemp("xk") / "tiny-int4-xk")


def test_exact_kernels_bundle_decodes_one_token_a_call_and_stays_exact(tiny_xk, tiny_int4_bundle):
    m = json.loads((tiny_xk / "edgespec.json").read_text())["models"]
    assert m["target"]["kernels"] == "edgespec-q4" and m["target"].get("attention_pad", 0) == 0
    assert "MatMulNBits" not in m["target"]["operators"] and m["target"]["operators"]["MatMulQ4"] > 0
    assert "GroupQueryAttention" not in m["target"]["operators"]
    assert m["target"]["operators"]["DecodeAttentionF16"] == m["target"]["num_layers"]  # (float16 caches: the default)
    assert m["target"]["kv_dtype"] == "float16"
    from edgespec.cli import main

    info = CliRunner().invoke(main, ["info", str(tiny_xk)])
    assert info.exit_code == 0 and "kernels: edgespec-q4" in info.output and "MatMulQ4" in info.output
    assert "a prefill computes its last position's logits only" in info.output
    eng = edgespec.load(tiny_xk, verify=True)
    t = eng.decoder.target
    assert (t.min_width, t.width_multiple) == (1, 1)  # measured at load: one-token calls agree
    assert t.max_context == edgespec.load(tiny_int4_bundle).decoder.target.max_context  # no pad slot
    # (session 97, ON17) unbounded and unsplit, probed or given its width policy: these kernels compute a row alike
    # at every width, so no verify bound is set, a prefill's last token is not fed alone, alternates stay on
    given = edgespec.load(tiny_xk, min_width=1).decoder.target
    for lm in (t, given):
        assert (lm.verified_width, lm.split_last, lm.verifies_alternates) == (None, False, True)
    from test_exactness import PROMPTS, _assert_all_equal, _greedy_all

    for p in PROMPTS:
        r = _greedy_all(eng, p, 24, drafters=("none", "prompt-lookup", "suffix", "auto", "model"))
        _assert_all_equal(r, p)
    before = t.calls
    eng.reset()
    eng.generate(PROMPTS[0], max_new_tokens=6, drafter="none")
    assert t.last_width == 1 and t.calls > before


def test_exact_kernels_target_verifies_alternates_with_the_bits_of_plain_calls(tiny_xk):
    """The rewritten target takes the rows' positions (manifest io.row_positions): a call of three
    tokens and an alternate to the second computes the causal rows as a call without it does, and the
    alternate as a one-token call after the first token does; once moved into place
    (``keep_alternate``) and the rest rolled back, the cache computes what a cache fed the accepted
    tokens computes, bitwise. A model without the input refuses alternates."""
    from edgespec.manifest import load_manifest
    from edgespec.onnx_lm import OnnxLM
    from edgespec.providers import choose

    m = load_manifest(tiny_xk)
    assert m.target.io.row_positions == "edgespec_row_positions" and m.drafter.io.row_positions is None
    lm = OnnxLM(m.target, 64, choose(["cpu"]), min_width=1)
    assert lm.verifies_alternates
    prompt, (a, b, c, x, y) = list(range(20, 37)), (41, 42, 43, 57, 60)
    lm.prefill(prompt)
    top = lm.forward_alternates([a, b, c, x], [0, 1, 2, 1])
    plain = OnnxLM(m.target, 64, choose(["cpu"]), min_width=1)
    plain.prefill(prompt)
    assert np.array_equal(top[:3], plain.forward_argmax([a, b, c]))
    plain.rewind(2)
    want_x = plain.forward([x])
    assert top[3] == int(np.argmax(want_x))
    # sampled rounds read every row's logits: the same bits as the plain calls' too
    rows_lm = OnnxLM(m.target, 64, choose(["cpu"]), min_width=1)
    rows_lm.prefill(prompt)
    rows = rows_lm.forward_alternates([a, b, c, x], [0, 1, 2, 1], logits=True).copy()
    again = OnnxLM(m.target, 64, choose(["cpu"]), min_width=1)
    again.prefill(prompt)
    assert np.array_equal(rows[:3], again.forward([a, b, c]))
    again.rewind(2)
    assert np.array_equal(rows[3], want_x[0])
    lm.keep_alternate(3, 1)
    lm.rewind(2)
    assert lm.tokens == prompt + [a, x]
    assert np.array_equal(lm.forward([y]), plain.forward([y]))
    with pytest.raises(ValueError, match="2 positions for 1 tokens"):
        lm.forward_alternates([a], [0, 1])
    drafter = OnnxLM(m.drafter, 64, choose(["cpu"]), min_width=1)
    assert not drafter.verifies_alternates
    with pytest.raises(ValueError, match="alternates"):
        drafter.forward_alternates([a, x], [0, 0])


class _Planted:
    """A model-drafter stand-in that knows the target's greedy reply: each round it drafts the next
    k reply tokens with one made wrong (the round's index cycling), lists the right one as that
    token's alternate (every third round a wrong alternate instead), and a wrong alternate elsewhere."""

    name, has_cost, takes_hint, gives_alternates = "model", True, False, True

    def __init__(self, prompt_len: int, reply: list[int], vocab: int):
        self.start, self.reply, self.vocab, self.rounds = prompt_len, reply, vocab, 0

    def begin(self, prompt):
        self.rounds = 0

    def reset(self):
        pass

    def offer(self, ctx, kmax):
        from edgespec.drafters import Offer

        return Offer("model", kmax)

    def draft(self, ctx, k, sp, rng, alternates=False, **kw):
        from edgespec.drafters import Draft

        j = len(ctx) - self.start
        right = self.reply[j: j + k]
        bad = self.rounds % max(1, len(right))
        other = lambda t: (t + 1) % self.vocab  # noqa: E731
        tokens = [other(t) if i == bad else t for i, t in enumerate(right)]
        alts = tuple((i, t if i == bad and self.rounds % 3 else other(other(t)), 0.9, 0.5)
                     for i, t in enumerate(right))
        self.rounds += 1
        return Draft(tokens, None, key="model", alts=alts if alternates else ())

    def accept(self, n, bonus):
        pass


def test_decoding_keeps_alternates_exactly_and_a_planted_slot_bug_is_caught(tiny_xk, monkeypatch):
    """Greedy decoding with a drafter whose drafts are wrong at one token and whose alternate there
    is mostly right: the output is plain greedy decoding's token for token, the alternates kept are
    counted, and rounds without alternates (use_alternates off) give the same output. Planted: an
    accepted alternate left in its own slot (``keep_alternate`` a no-op) changes the output."""
    from test_exactness import PROMPTS

    eng = edgespec.load(tiny_xk)
    vocab = eng.decoder.vocab
    real = eng.decoder.drafters["model"]
    for prompt in PROMPTS[:2]:
        eng.reset()
        ref = eng.generate(prompt, max_new_tokens=30, drafter="none").token_ids
        ids = eng.encode(prompt, fit=True)
        planted = _Planted(len(ids), ref + [0] * 16, vocab)
        eng.decoder.drafters["model"] = planted
        monkeypatch.setattr(eng.decoder.policy, "alternates", lambda k, alts, room, s: [(i, t) for i, t, _, _ in alts][:room])
        eng.decoder.policy.use_alternates = True  # (on by default on the AVX-512 paths only)
        try:
            eng.reset()
            r = eng.generate(prompt, max_new_tokens=30, drafter="model", draft_tokens=3)
            assert r.token_ids == ref, prompt
            assert r.stats["alternates_kept"] > 3 and r.stats["alternates"] > r.stats["alternates_kept"]
            # the target's cache records the ids whose keys it holds, each kept alternate's among them (a record
            # left at the rejected draft token would let a later prompt with that token reuse the alternate's
            # keys: session 72, a mutation test of kv.py)
            held = eng.decoder.target.cache.ids.tolist()
            assert held == (ids + r.token_ids)[: len(held)] and len(held) >= len(ids) + len(ref) - 1, prompt
            with monkeypatch.context() as mp:
                mp.setattr(type(eng.decoder.target), "keep_alternate", lambda self, row, pos: None)
                eng.reset()
                assert eng.generate(prompt, max_new_tokens=30, drafter="model", draft_tokens=3).token_ids != ref
            eng.decoder.policy.use_alternates = False
            eng.reset()
            r = eng.generate(prompt, max_new_tokens=30, drafter="model", draft_tokens=3)
            assert r.token_ids == ref and r.stats["alternates"] == 0
        finally:
            eng.decoder.drafters["model"] = real
            monkeypatch.undo()


def test_a_padded_width_policy_verifies_no_alternates(tiny_xk, monkeypatch):
    """(session 46) load(min_width=2) on an exact-kernels bundle (or a context too short for the probe) kept
    alternates on, and every round that offered them was a ValueError ("alternates need one-token calls")."""
    from test_exactness import PROMPTS

    eng = edgespec.load(tiny_xk, min_width=2, memory=False)
    assert eng.decoder.target.min_width == 2 and not eng.decoder.target.verifies_alternates
    ref = eng.generate(PROMPTS[0], max_new_tokens=30, drafter="none").token_ids
    ids = eng.encode(PROMPTS[0], fit=True)
    eng.decoder.drafters["model"] = _Planted(len(ids), ref + [0] * 16, eng.decoder.vocab)
    monkeypatch.setattr(eng.decoder.policy, "alternates", lambda k, alts, room, s: [(i, t) for i, t, _, _ in alts][:room])
    eng.decoder.policy.use_alternates = True
    r = eng.generate(PROMPTS[0], max_new_tokens=30, drafter="model", draft_tokens=3)
    assert r.token_ids == ref and r.stats["alternates"] == 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_round_cut_short_after_its_alternates_leaves_the_cache_true(tiny_xk, monkeypatch, temperature):
    """Ctrl-C landing after a verify call with alternates returns (before the kept one is moved and the rest
    rewound): the decoder rewinds the target to what it held when the round began. The cache listed the
    alternates' ids over rows computed beside the draft's positions, and the next request reaching those slots
    read them as its own: a plain greedy reply on the same engine differed from a fresh engine's (a review's
    finding, session 44)."""
    from edgespec.policy import RoundPolicy

    eng = edgespec.load(tiny_xk, memory=False)
    eng.decoder.policy.use_alternates = True
    monkeypatch.setattr(RoundPolicy, "alternates", lambda self, k, alts, room, s: [(i, t) for i, t, _, _ in alts][:room])
    target = eng.decoder.target
    real, calls = target.forward_alternates, []

    def interrupted(ids, positions, logits=False):
        out = real(ids, positions, logits)
        calls.append(len(ids))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return out

    monkeypatch.setattr(target, "forward_alternates", interrupted)
    ids, emitted = eng.encode("def fibonacci(n):", fit=True), []
    with pytest.raises(KeyboardInterrupt):
        for _, toks, _, _ in eng.stream_ids(ids, max_new_tokens=40, drafter="model", draft_tokens=3,
                                            temperature=temperature, seed=1, ignore_eos=True):
            emitted += toks
    monkeypatch.setattr(target, "forward_alternates", real)
    held = list(target.tokens)
    assert len(calls) == 3 and held == ids + emitted[:-1]  # what the target held when the cut round began
    prompt = held + [0]
    kw = dict(max_new_tokens=8, drafter="none", ignore_eos=True)
    same = eng._collect(eng.stream_ids(prompt, **kw)).token_ids
    fresh = edgespec.load(tiny_xk, memory=False)
    assert same == fresh._collect(fresh.stream_ids(prompt, **kw)).token_ids


def test_sampled_decoding_verifies_alternates_on_the_native_target(tiny_xk, monkeypatch):
    """Sampled rounds of the real drafter with an alternate beside every draft token, on the rewritten
    target (its rows' logits and moved cache slots): alternates are verified and kept, a seeded generation
    gives the same reply again, and the cache then holds what plain calls of the reply compute (a kept
    alternate moved into its slot: the next token's logits are those of a fresh prefill, bitwise). The
    rule's distribution is tested on scripted models (test_decoder); these rows are the plain calls' bits
    (test_exact_kernels_target_verifies_alternates_with_the_bits_of_plain_calls)."""
    from edgespec.policy import RoundPolicy

    eng = edgespec.load(tiny_xk)
    eng.decoder.policy.use_alternates = True  # (on by default on the AVX-512 paths only)
    monkeypatch.setattr(RoundPolicy, "alternates", lambda self, k, alts, room, s: [(i, t) for i, t, _, _ in alts][:room])
    kw = dict(max_new_tokens=40, temperature=1.0, seed=3, drafter="model", draft_tokens=3, ignore_eos=True)
    first = eng.generate("def fibonacci(n):", **kw)
    assert first.stats["alternates"] > 0 and first.stats["alternates_kept"] > 0
    target = eng.decoder.target
    held, nxt = list(target.tokens), first.token_ids[-1]  # (the cache holds all but the last token)
    assert held == eng.encode("def fibonacci(n):", fit=True) + first.token_ids[:-1]
    last = target.forward([nxt]).copy()
    target.reset()
    target.prefill(held)
    assert np.array_equal(target.forward([nxt]), last)
    eng.reset()
    assert eng.generate("def fibonacci(n):", **kw).token_ids == first.token_ids


def test_model_drafter_lists_its_second_choices_without_changing_its_draft(tiny_xk):
    """``draft(..., alternates=True)`` (greedy): the same tokens as without; per token, the second
    largest logit's token and probabilities in (0, 1], the second below the first; sampled, the same
    tokens from the same draws, and per token no alternate yet (drawn once the round picks it) and its
    chance in [0, 1). The real drafter in a greedy ``auto`` generation stays exact with alternates on."""
    from edgespec.kv import TokenBuffer
    from edgespec.sampling import SamplingParams

    eng = edgespec.load(tiny_xk)
    d = eng.decoder.drafters["model"]
    ctx = TokenBuffer(eng.encode("def fibonacci(n):", fit=True))
    rng = np.random.default_rng(0)
    d.reset(); d.begin(ctx.tolist())
    plain = d.draft(ctx, 4, SamplingParams(), rng)
    d.accept(0, 0)
    d.reset(); d.begin(ctx.tolist())
    listed = d.draft(ctx, 4, SamplingParams(), rng, alternates=True)
    assert listed.tokens == plain.tokens and len(listed.alts) == len(plain.tokens) and not plain.alts
    for (i, tok, top, q2), first in zip(listed.alts, listed.tokens):
        assert tok != first and 0 < q2 <= top <= 1.0
    d.accept(0, 0)
    d.reset(); d.begin(ctx.tolist())
    sampled = []
    for alternates in (False, True):
        d.reset(); d.begin(ctx.tolist())
        sampled.append(d.draft(ctx, 4, SamplingParams(temperature=0.8), np.random.default_rng(5), alternates=alternates))
        d.accept(0, 0)
    assert sampled[0].tokens == sampled[1].tokens and sampled[0].alts == ()
    assert [a[:2] for a in sampled[1].alts] == [(i, None) for i in range(len(sampled[1].tokens))]
    assert all(0 < top <= 1.0 and 0.0 <= chance < 1.0 for _, _, top, chance in sampled[1].alts)
    from test_exactness import PROMPTS

    # on by default where the target's verify rows are cheap (edgespec's AVX-512 paths), off elsewhere; on here
    from edgespec.native import isa

    assert eng.decoder.policy.use_alternates == eng.decoder.target.cheap_rows == isa().startswith("avx512")
    # (session 65) the cost priors of that regime reach the policy: a flat verify to a knee, the model drafter's step
    # from the bundle's bytes (the wiring: ModelDrafter.lm, the specs' weight and token-table bytes)
    from edgespec.policy import CHEAP_ROWS_KNEE, PRIOR_STEP, STEP_OVERHEAD

    priors = eng.decoder.policy.priors
    if eng.decoder.target.cheap_rows:
        t, d = eng.manifest.target, eng.manifest.drafter
        ratio = (d.gpu_weight_bytes - d.embedding_bytes) / (t.gpu_weight_bytes - t.embedding_bytes) * STEP_OVERHEAD
        assert priors["prior_knee"] == CHEAP_ROWS_KNEE
        assert priors["prior_step_ratio"] == pytest.approx(min(max(ratio, 0.1), 0.6)) != PRIOR_STEP
    else:
        assert priors["prior_knee"] == 0 and priors["prior_step_ratio"] == PRIOR_STEP
    eng.decoder.policy.use_alternates = True
    for p in PROMPTS:
        eng.reset()
        ref = eng.generate(p, max_new_tokens=24, drafter="none").token_ids
        for drafter in ("model", "auto"):
            eng.reset()
            assert eng.generate(p, max_new_tokens=24, drafter=drafter).token_ids == ref


@pytest.fixture(scope="module")
def tiny_xk_ort(tiny_int4_bundle, tmp_path_factory):
    """exact-kernels --onnxruntime-attention: onnxruntime's attention, padded to two query rows."""
    from edgespec_export.kernels import apply_to_bundle

    return apply_to_bundle(tiny_int4_bundle, tmp_path_factory.mktemp("xk-ort") / "tiny-int4-xk-ort", own_attention=False)


def test_exact_kernels_with_onnxruntime_attention_pads_it_and_stays_exact(tiny_xk_ort):
    m = json.loads((tiny_xk_ort / "edgespec.json").read_text())["models"]
    assert m["target"]["attention_pad"] == 1 and "DecodeAttention" not in m["target"]["operators"]
    assert m["target"]["kv_dtype"] == "float32"  # (onnxruntime's attention keeps the builder's float32 caches)
    assert "DecodeAttentionF16" not in m["target"]["operators"]
    eng = edgespec.load(tiny_xk_ort)
    assert (eng.decoder.target.min_width, eng.decoder.target.width_multiple) == (1, 1)
    from test_exactness import PROMPTS, _assert_all_equal, _greedy_all

    _assert_all_equal(_greedy_all(eng, PROMPTS[0], 24, drafters=("none", "prompt-lookup", "model")), PROMPTS[0])


@pytest.fixture(scope="module")
def tiny_xk32(tiny_int4_bundle, tmp_path_factory):
    """exact-kernels --kv-dtype float32: edgespec's attention over the builder's float32 KV caches."""
    from edgespec_export.kernels import apply_to_bundle

    return apply_to_bundle(tiny_int4_bundle, tmp_path_factory.mktemp("xk32") / "tiny-int4-xk32", kv_dtype="float32")


def test_exact_kernels_with_float16_caches_halves_them_and_stays_exact(tiny_xk, tiny_xk32):
    """By default the INT4 target's caches become float16 (graph inputs and outputs, the manifest, the buffers the
    runtime allocates, the plan), the layout stays cpu, the float32 drafter (not rewritten) keeps its
    float32 caches beside it, every drafter's greedy output equals plain decoding, and the logits stay
    close to the float32 cache's."""
    import onnx

    from edgespec.manifest import load_manifest
    from edgespec.planner import plan
    from edgespec.profiles import resolve_profile

    m16, m32 = load_manifest(tiny_xk), load_manifest(tiny_xk32)
    assert m16.drafter.kv_dtype == "float32" and m16.drafter.kernels != "edgespec-q4"
    spec, spec32 = m16.target, m32.target
    assert spec.kv_dtype == "float16" and spec.layout == "cpu" and spec32.kv_dtype == "float32"
    assert spec.operators["DecodeAttentionF16"] == spec.num_layers and "DecodeAttention" not in spec.operators
    assert spec.kv_bytes(100) * 2 == spec32.kv_bytes(100)
    g = onnx.load(str(spec.path), load_external_data=False).graph
    kv = [v for v in list(g.input) + list(g.output) if "key" in v.name or "value" in v.name]
    assert len(kv) == 4 * spec.num_layers
    assert {v.type.tensor_type.elem_type for v in kv} == {onnx.TensorProto.FLOAT16}
    prof = resolve_profile("cpu-16gb")
    p16, p32 = plan(m16, prof, max_context=256), plan(m32, prof, max_context=256)
    assert p16.context == p32.context and set(p16.kv) == {"target", "drafter"}
    assert 2 * p16.kv["target"] == p32.kv["target"] and p16.kv["drafter"] == p32.kv["drafter"]
    eng = edgespec.load(tiny_xk)
    t = eng.decoder.target
    assert (t.min_width, t.width_multiple) == (1, 1)
    assert {buf.numpy().dtype for _, _, buf in t.cache.buffers} == {np.dtype(np.float16)}
    d = eng.decoder.drafters["model"].lm
    assert {buf.numpy().dtype for _, _, buf in d.cache.buffers} == {np.dtype(np.float32)}
    from test_exactness import PROMPTS, _assert_all_equal, _greedy_all

    for p in PROMPTS:
        _assert_all_equal(_greedy_all(eng, p, 24, drafters=("none", "prompt-lookup", "suffix", "auto", "model")), p)
    ids = [int(i) for i in np.random.default_rng(1).integers(5, 200, size=60)]
    t32 = edgespec.load(tiny_xk32).decoder.target
    t.cache.reset()
    a, b = t.forward(ids), t32.forward(ids)
    assert np.abs(a - b).max() < 0.05 * np.abs(b).max() and (a.argmax(-1) == b.argmax(-1)).mean() > 0.9


def test_a_graph_whose_caches_cannot_be_float16_keeps_float32_by_default_and_refuses_when_asked(tiny_int4_bundle,
                                                                                               copy_bundle, tmp_path):
    """A target with one attention node edgespec's op does not compute (here a smooth softmax) keeps its
    float32 caches by default, that node padded as --onnxruntime-attention pads them, and the log says
    why; --kv-dtype float16 is then a one-line error and nothing is written. A cache another node reads
    (here a Shape of a past key) is refused the same way."""
    import onnx
    from onnx import helper

    from edgespec.cli import main
    from edgespec.manifest import load_manifest
    from edgespec_export.kernels import apply_to_bundle

    def altered(name, change):
        b = copy_bundle(tiny_int4_bundle)
        b = b.rename(tmp_path / name)
        path = load_manifest(b).target.path
        m = onnx.load(str(path), load_external_data=False)
        change(m.graph)
        onnx.save(m, str(path))
        from edgespec_export.head import head_files

        mf = json.loads((b / "edgespec.json").read_text())  # (the manifest's sizes and hashes of the new graph)
        mf["models"]["target"]["files"] = head_files(b, "target")
        (b / "edgespec.json").write_text(json.dumps(mf))
        return b

    def smooth(g):  # (gpt-oss's attention sinks: a softmax edgespec's op does not compute)
        n = next(n for n in g.node if n.op_type == "GroupQueryAttention")
        n.attribute.append(helper.make_attribute("smooth_softmax", 1))

    def second_reader(g):
        past = next(n for n in g.node if n.op_type == "GroupQueryAttention").input[3]
        g.node.append(helper.make_node("Shape", [past], ["edgespec_test_shape"]))
        g.output.append(helper.make_tensor_value_info("edgespec_test_shape", onnx.TensorProto.INT64, [4]))

    for name, change, why in (("smooth", smooth, "not edgespec.DecodeAttention"),
                              ("reader", second_reader, "is not the graph's own input and output")):
        src = altered(name, change)
        said = []
        out = apply_to_bundle(src, tmp_path / f"{name}-xk", log=said.append)
        spec = load_manifest(out).target
        assert spec.kv_dtype == "float32" and "DecodeAttentionF16" not in spec.operators, name
        assert any("KV caches kept float32" in line and why in line for line in said), (name, said)
        eng = edgespec.load(out, memory=False)
        assert {buf.numpy().dtype for _, _, buf in eng.decoder.target.cache.buffers} == {np.dtype(np.float32)}
        from test_exactness import PROMPTS, _assert_all_equal, _greedy_all

        _assert_all_equal(_greedy_all(eng, PROMPTS[0], 12, drafters=("none", "prompt-lookup")), PROMPTS[0])
        r = CliRunner().invoke(main, ["exact-kernels", str(src), "--kv-dtype", "float16", "-o", str(tmp_path / f"{name}-16")])
        assert r.exit_code != 0 and "no float16 KV cache" in r.output and "--kv-dtype float32" in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / f"{name}-16").exists()


@pytest.mark.parametrize("which", ["tiny_xk", "tiny_xk_ort", "tiny_xk32"])
def test_exact_kernels_fills_the_whole_context(which, request):
    """edgespec's attention writes only the call's positions: the whole exported context is usable.
    onnxruntime's padded attention writes the pad's keys and values one position past the call:
    the context is one position shorter than exported. Either way the last position can be
    computed, and computes what a prefill chunk computes there."""
    from edgespec.errors import ContextOverflowError

    eng = edgespec.load(request.getfixturevalue(which))
    lm = eng.decoder.target
    n = lm.max_context
    assert n == lm.spec.max_context - (1 if which == "tiny_xk_ort" else 0)
    ids = [int(i) for i in np.random.default_rng(0).integers(5, 200, size=n)]
    lm.cache.reset()
    lm.feed(ids[:-1])
    last = lm.forward(ids[-1:])
    assert lm.cache.length == n and np.isfinite(last).all()
    with pytest.raises(ContextOverflowError):
        lm.forward([5])
    lm.cache.reset()
    assert np.array_equal(lm.feed(ids), last[-1])  # the same position computed in a prefill chunk


def test_exact_kernels_refuses_what_it_cannot_rewrite(tiny_bundle, tiny_xk, tmp_path):
    from edgespec.cli import main

    r = CliRunner().invoke(main, ["exact-kernels", str(tiny_bundle), "-o", str(tmp_path / "a")])
    assert r.exit_code != 0 and "INT4" in r.output and not (tmp_path / "a").exists()
    r = CliRunner().invoke(main, ["exact-kernels", str(tiny_xk), "-o", str(tmp_path / "b")])
    assert r.exit_code != 0 and "already" in r.output
    r = CliRunner().invoke(main, ["exact-kernels", str(tmp_path / "missing")])
    assert r.exit_code != 0 and len(r.output.strip().splitlines()) == 1
    # a float16 cache needs edgespec's attention; --kv-dtype belongs to --exact-kernels
    r = CliRunner().invoke(main, ["exact-kernels", str(tiny_bundle), "--onnxruntime-attention", "--kv-dtype", "float16",
                                  "-o", str(tmp_path / "c")])
    assert r.exit_code != 0 and "float16 KV cache needs edgespec's attention" in r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "c").exists()
    r = CliRunner().invoke(main, ["exact-kernels", str(tiny_bundle), "--kv-dtype", "bfloat16", "-o", str(tmp_path / "d")])
    assert r.exit_code == 2 and "bfloat16" in r.output and not (tmp_path / "d").exists()
    r = CliRunner().invoke(main, ["export", str(tmp_path / "x"), "-o", str(tmp_path / "e"), "--kv-dtype", "float16"])
    assert r.exit_code == 2 and "--kv-dtype applies with --exact-kernels" in r.output and not (tmp_path / "e").exists()


@pytest.mark.real
@pytest.mark.parametrize("kv_dtype", ["float32", "float16"])
def test_smollm2_exact_kernels_one_token_calls_and_exact(smol_int4, tmp_path, kv_dtype):
    from edgespec_export.kernels import apply_to_bundle

    out = apply_to_bundle(smol_int4, tmp_path / "smol-xk", kv_dtype=kv_dtype)
    eng = edgespec.load(out)
    assert eng.decoder.target.spec.kv_dtype == kv_dtype
    assert (eng.decoder.target.min_width, eng.decoder.target.width_multiple) == (1, 1)
    # (float32 caches: the code prompt at the adaptive length only, the float16 ones every prompt and length: 12 s
    # each on session 70's AVX2 VM before, the suite over its 20 minutes there)
    prompts = ("def fibonacci(n):", "Summarize: the meeting moved to Tuesday at ten, floor three.")
    for p in prompts[:1] if kv_dtype == "float32" else prompts:
        msgs = [{"role": "user", "content": p}]
        eng.reset()
        ref = eng.generate(msgs, max_new_tokens=40, drafter="none").token_ids
        for d in ("prompt-lookup", "suffix", "auto"):
            for k in (None,) if kv_dtype == "float32" else (None, 1, 3):
                eng.reset()
                assert eng.generate(msgs, max_new_tokens=40, drafter=d, draft_tokens=k).token_ids == ref, (p, d, k)


def test_exact_kernels_refuses_a_rewrite_that_disagrees_with_its_source(smol_int4, tmp_path, monkeypatch):
    """The rewrite runs both graphs on a sample text before it publishes: a packing bug (here the
    weight bytes of each tile reversed) is caught and nothing is written."""
    import edgespec_export.kernels as kernels
    from edgespec.errors import ExportError

    real = kernels.pack_q4

    def broken(*args):
        b, s, z = real(*args)
        return np.ascontiguousarray(b[:, :, ::-1]), s, z

    monkeypatch.setattr(kernels, "pack_q4", broken)
    # (since session 51 the tiles' own check against the source's blocks sees it first; the logits' check behind it)
    with pytest.raises(ExportError, match="weights differ from its source graph's at /model/layers.0/"):
        kernels.apply_to_bundle(smol_int4, tmp_path / "broken")
    assert not (tmp_path / "broken").exists() and not list(tmp_path.glob(".broken*"))
    from edgespec_export.weights import WeightCheck

    monkeypatch.setattr(kernels, "check_rewrite", lambda *a: WeightCheck(checked=1))
    with pytest.raises(ExportError, match="disagrees with its source"):
        kernels.apply_to_bundle(smol_int4, tmp_path / "broken")
    assert not (tmp_path / "broken").exists() and not list(tmp_path.glob(".broken*"))


def test_exact_kernels_refuses_a_rewrite_whose_layers_hold_each_others_weights(smol_int4, tmp_path, monkeypatch):
    """(session 49's review, mended in session 51) A rewrite with two layers' packed weights swapped passed the
    comparison of logits with the source graph (top-1 >= 0.75); each MatMulQ4's tiles are now unpacked and compared
    with the source's MatMulNBits of the same name (repacking loses nothing: the rounding's ~1e-7 against ~1.4), on
    SmolLM2 (Q4_1 blocks: float minimums) and the fused SwiGLU's up projection too."""
    import onnx

    import edgespec_export.kernels as kernels
    from edgespec.errors import ExportError

    logs = []
    out = kernels.apply_to_bundle(smol_int4, tmp_path / "fine", log=logs.append)
    line = next(x for x in logs if "target:" in x and "tiles against the source graph's blocks" in x)
    n = int(re.search(r"target: (\d+) matrices", line).group(1))
    assert n == 151 and "not found" not in line, line  # (30 layers x 5 with the SwiGLU's up, and the head)
    assert float(re.search(r"difference (\S+)", line).group(1)) < 1e-6, line
    real = kernels.rewrite_graph

    def swapped(model_path, *a, **kw):  # the rewrite as it is, then layers 14 and 15's gate and up tiles swapped
        counts = real(model_path, *a, **kw)
        g = onnx.load(model_path, load_external_data=False)
        by = {x.name: x for x in g.graph.node}
        a14, a15 = (by[f"/model/layers.{i}/mlp/gate_proj/MatMul_Q4"] for i in (14, 15))
        i14, i15 = list(a14.input), list(a15.input)
        del a14.input[:], a15.input[:]
        a14.input.extend([i14[0]] + i15[1:])
        a15.input.extend([i15[0]] + i14[1:])
        onnx.save(g, model_path)
        return counts

    monkeypatch.setattr(kernels, "rewrite_graph", swapped)
    with pytest.raises(ExportError, match=r"target's weights differ from its source graph's at "
                                          r"/model/layers.14/mlp/gate_proj/MatMul_Q4 .*and 3 more"):
        kernels.apply_to_bundle(smol_int4, tmp_path / "broken")
    assert not (tmp_path / "broken").exists() and out.is_dir()


def test_exact_kernels_refuses_a_rewrite_whose_one_token_calls_compute_otherwise(tiny_int4_bundle, tmp_path,
                                                                                   monkeypatch):
    """(session 49's review, mended in session 51) A rewrite whose one-token calls computed otherwise passed the check
    against the source graph (its calls ~25 rows wide), and the runtime's width probe then kept two tokens a call,
    silently (one-token decoding is what the kernels are for). The rewritten graph is probed as the runtime probes
    it and must compute a row alike at every width: here one-token calls planted off by 1e-3 in a logit."""
    import edgespec_export.kernels as kernels
    from edgespec.errors import ExportError
    from edgespec.onnx_lm import OnnxLM

    real = OnnxLM._run

    def one_token_off(self, ids, *a, **kw):
        out = real(self, ids, *a, **kw)
        if self.spec.kernels == "edgespec-q4" and len(ids) == 1:
            out = np.array(out)
            out[..., 0] += 1e-3
        return out

    monkeypatch.setattr(OnnxLM, "_run", one_token_off)
    with pytest.raises(ExportError, match="computes a row otherwise at some call widths .* keeps 2 tokens a call"):
        kernels.apply_to_bundle(tiny_int4_bundle, tmp_path / "broken")
    assert not (tmp_path / "broken").exists() and not list(tmp_path.glob(".broken*"))
    monkeypatch.setattr(OnnxLM, "_run", real)
    out = kernels.apply_to_bundle(tiny_int4_bundle, tmp_path / "fine")
    assert "width_policy" not in json.loads((out / "edgespec.json").read_text())["models"]["target"]["kernels_check"]


def test_bench_ar_runs_an_exact_kernels_bundle_without_genai(tiny_xk, capsys):
    """scripts/bench_ar.py (docs/bench/history.md, session 8) on a bundle onnxruntime-genai cannot run: edgespec's
    columns filled, genai's left out rather than failing."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import bench_ar

    assert bench_ar.main([str(tiny_xk), "--tokens", "6", "--reps", "1"]) == 0
    row = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(f"| {Path(tiny_xk).name} ")]
    assert len(row) == 1 and "| – | – |" in row[0] and row[0].rstrip().endswith("| – |")


def test_bench_prefill_names_the_kernel_path_and_its_speed(tiny_xk, capsys):
    """scripts/bench_prefill.py (docs/bench/sessions.md, session 11): one line with the tokens read, the seconds and the
    kernel path (the AMX one takes prefill chunks where the CPU has it)."""
    import sys
    from pathlib import Path

    from edgespec.native import isa

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import bench_prefill

    assert bench_prefill.main([str(tiny_xk), "--tokens", "40", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    assert "prefill of 40 tokens" in out and "tokens/s" in out and f"kernel path {isa()}" in out, out


def test_the_rewrite_records_its_check_and_a_bad_record_is_refused(tiny_xk, copy_bundle):
    from edgespec.cli import main
    from edgespec.errors import ManifestError
    from edgespec.manifest import load_manifest

    c = load_manifest(tiny_xk).target.kernels_check
    assert c is not None and c["top1_agreement"] >= 0.75 and c["positions"] > 0 and c["logit_scale"] > 0
    r = CliRunner().invoke(main, ["info", str(tiny_xk)])
    assert f"top-1 agreement {c['top1_agreement']:.3f} over {c['positions']} positions" in r.output, r.output
    b = copy_bundle(tiny_xk)
    d = json.loads((b / "edgespec.json").read_text())
    d["models"]["target"]["kernels_check"]["top1_agreement"] = "high"
    (b / "edgespec.json").write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="kernels_check.top1_agreement must be a finite number"):
        load_manifest(b)
    r = CliRunner().invoke(main, ["info", str(b)])
    assert r.exit_code != 0 and len(r.output.strip().splitlines()) == 1, r.output


def test_a_bundle_needing_kernel_features_this_edgespec_lacks_is_refused(tiny_xk, copy_bundle):
    """A bundle whose graphs rely on what this edgespec's kernels do not compute (a future attribute, which the
    library would ignore: onnxruntime passes a custom op's unknown attributes unchecked) is refused at load in one
    line, exit 2; the features this edgespec has load and are written back as they were."""
    from edgespec.cli import main
    from edgespec.errors import BundleError, ManifestError
    from edgespec.manifest import KERNEL_FEATURES, load_manifest, write_manifest

    assert load_manifest(tiny_xk).target.kernel_features == ()  # (a Qwen-shaped graph: none)
    b = copy_bundle(tiny_xk)
    path = b / "edgespec.json"
    d = json.loads(path.read_text())
    d["models"]["target"]["kernel_features"] = ["attention-window", "attention-window"]
    path.write_text(json.dumps(d))
    m = load_manifest(b)
    assert m.target.kernel_features == ("attention-window",) and "attention-window" in KERNEL_FEATURES
    write_manifest(m)
    r = CliRunner().invoke(main, ["info", str(b)])
    assert r.exit_code == 0 and "its attention computes: attention-window" in r.output, r.output
    assert json.loads(path.read_text())["models"]["target"]["kernel_features"] == ["attention-window"]
    assert "kernel_features" not in json.loads(path.read_text())["models"]["drafter"]
    d["models"]["drafter"]["kernel_features"] = ["attention-window", "attention-sinks"]
    path.write_text(json.dumps(d))
    with pytest.raises(BundleError, match=r"drafter needs what this edgespec's kernels do not compute "
                                          r"\(attention-sinks\): update edgespec"):
        load_manifest(b)
    r = CliRunner().invoke(main, ["info", str(b)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and "attention-sinks" in r.output, r.output
    d["models"]["drafter"]["kernel_features"] = "attention-window"
    path.write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="kernel_features has the wrong type"):
        load_manifest(b)
    d["models"]["drafter"]["kernel_features"] = [3]
    path.write_text(json.dumps(d))
    with pytest.raises(ManifestError, match="kernel_features must be a list of strings"):
        load_manifest(b)


def test_info_and_bench_ar_name_the_kernel_path_this_cpu_takes(tiny_xk, capsys, monkeypatch):
    import sys
    from pathlib import Path

    from edgespec.cli import main
    from edgespec.native import isa

    r = CliRunner().invoke(main, ["info", str(tiny_xk)])
    assert r.exit_code == 0 and f"this CPU takes its {isa()} path" in r.output, r.output
    on = "can verify alternates beside a draft's tokens (input 'edgespec_row_positions'); verified by default on this CPU's path"
    assert (on in r.output) is isa().startswith("avx512"), r.output  # (whether alternates are on here)
    monkeypatch.setenv("EDGESPEC_Q4_ISA", "avx2")
    r = CliRunner().invoke(main, ["info", str(tiny_xk)])
    assert "this CPU takes its avx2 path" in r.output and on not in r.output
    assert "; off by default on this CPU's path (on by default on the kernel's AVX-512 paths;" in r.output
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import bench_ar

    assert bench_ar.main([str(tiny_xk), "--tokens", "2", "--reps", "1"]) == 0
    assert "edgespec's INT4 kernel (exact-kernels bundles): avx2 path" in capsys.readouterr().out


def test_info_on_an_exact_kernels_bundle_without_a_compiler_still_describes_it(tiny_xk, tmp_path, monkeypatch):
    """isa() asks the built library; where it cannot be built (no compiler), `edgespec info` still shows
    the bundle, saying why its kernel cannot run here, and exits 0."""
    import edgespec.native as native
    from edgespec.cli import main

    monkeypatch.setattr(native, "_cached", None)
    monkeypatch.setenv("EDGESPEC_NATIVE_DIR", str(tmp_path))  # nothing built here
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    r = CliRunner().invoke(main, ["info", str(tiny_xk)])
    assert r.exit_code == 0, r.output
    assert "kernels: edgespec-q4" in r.output and "not runnable here: building" in r.output, r.output


def test_export_exact_kernels_in_one_command(tiny_dirs, tmp_path):
    from edgespec.cli import main

    out = tmp_path / "b"
    r = CliRunner().invoke(main, ["export", str(tiny_dirs["qwen2"]), "--drafter", str(tiny_dirs["drafter"]),
                                  "--drafter-precision", "int4", "-o", str(out), "--exact-kernels", "--no-quality"])
    assert r.exit_code == 0, r.output
    m = json.loads((out / "edgespec.json").read_text())["models"]
    assert m["target"]["kernels"] == m["drafter"]["kernels"] == "edgespec-q4"
    eng = edgespec.load(out)
    assert (eng.decoder.target.min_width, eng.decoder.target.width_multiple) == (1, 1)
    r = CliRunner().invoke(main, ["export", str(tiny_dirs["qwen2"]), "-o", str(tmp_path / "c"),
                                  "--target-precision", "fp32", "--exact-kernels"])
    assert r.exit_code == 2 and "--exact-kernels applies to an int4 target" in r.output
    assert not (tmp_path / "c").exists()


def test_exact_kernels_graph_is_refused_on_a_gpu_provider(tiny_xk):
    """edgespec.MatMulQ4 is a CPU operator: a GPU session would run it on the CPU behind the user's
    back (and copy every activation across), so opening such a graph on CUDA is a typed error."""
    from edgespec.manifest import load_manifest
    from edgespec.onnx_lm import open_session
    from edgespec.providers import CUDA, ProviderChoice

    spec = load_manifest(tiny_xk).target
    choice = ProviderChoice(providers=[(CUDA, {})], requested=["cuda"], explicit=True)
    with pytest.raises(ProviderError, match="exact-kernels"):
        open_session(spec.path, choice, role="target", kernels=spec.kernels)


def test_library_on_a_cpu_it_is_not_built_for_is_a_typed_error(monkeypatch):
    """x86-64 (with or without AVX2: the portable path then) and aarch64 (a Jetson's CPU: the portable path) run the
    kernels; another CPU is told so in one typed line before anything is built."""
    import edgespec.native as native

    monkeypatch.setattr(native, "_cached", None)
    monkeypatch.setattr(native, "cpu_supported", lambda: "this CPU is riscv64 (the kernels are built for x86-64 and aarch64)")
    with pytest.raises(ProviderError, match="does not run here: this CPU is riscv64"):
        native.library_path()
    monkeypatch.undo()
    for machine in ("aarch64", "arm64", "x86_64", "AMD64"):
        monkeypatch.setattr(native.platform, "machine", lambda: machine)
        assert native.cpu_supported() is None, machine
    monkeypatch.setattr(native.platform, "machine", lambda: "riscv64")
    assert "riscv64" in native.cpu_supported()
    # (session 53, a review) macOS says arm64 and Windows AMD64: the source needs Linux, said in one line
    for system, machine in (("darwin", "arm64"), ("win32", "AMD64")):
        monkeypatch.setattr(native.platform, "machine", lambda: machine)
        monkeypatch.setattr(native.sys, "platform", system)
        assert native.cpu_supported() == f"this system is {system} (the kernels are built for Linux)"


def test_the_library_names_the_path_it_takes(monkeypatch):
    """isa() asks the built library, which names its path with the function that picks it at registration;
    EDGESPEC_Q4_ISA stops at a narrower path (and the name follows)."""
    import edgespec.native as native

    flags = native._cpu_flags() or set()
    want = "avx2"
    if {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags:
        want = "avx512-vnni+amx" if {"amx_tile", "amx_int8"} <= flags else "avx512-vnni"
    assert native.isa() == want  # (a kernel without Linux's AMX permission would say avx512-vnni: not seen here)
    monkeypatch.setenv("EDGESPEC_Q4_ISA", "avx512")
    assert native.isa() == ("avx2" if want == "avx2" else "avx512-vnni")
    monkeypatch.setenv("EDGESPEC_Q4_ISA", "avx2")
    assert native.isa() == "avx2"
    monkeypatch.setenv("EDGESPEC_Q4_ISA", "portable")  # (what aarch64 and an x86-64 CPU without AVX2 take)
    assert native.isa() == "portable" and not native.cheap_rows("portable")


@pytest.mark.parametrize("isa", Q4_PATHS)
def test_kernel_int16_partial_sums_do_not_saturate(isa, monkeypatch):
    """The AVX2 path sums u8 x s8 products in int16 over four 8-byte groups before widening: with
    every weight 15, zero point 0 and every activation at +-127 (the largest partial sums there are),
    the result must still be the exact block dot (an overflow or saturation would be off by far more).
    On each path, in a call of three rows and in one-row calls (AVX2's one-row pass is its own code; session 90:
    this ran on the path of the CPU only, and on the AVX-512 Xeon the AVX2 path's batches were never checked)."""
    from onnx import numpy_helper

    _take_path(isa, monkeypatch)
    K, N, block = 256, 32, 128
    model = _graph(K, N, block, "MatMulQ4", zero_points=True)
    inits = {i.name: i for i in model.graph.initializer}
    for name, fill in (("B", 0xFF), ("Z", 0x00)):
        arr = numpy_helper.to_array(inits[name]).copy()
        arr[...] = fill
        inits[name].CopyFrom(numpy_helper.from_array(arr, name))
    x = np.ones((3, K), np.float32)
    x[1] = -1.0
    x[2, ::2] = -1.0  # alternating signs: the partial sums cancel
    sess = _session(model)
    s = numpy_helper.to_array(inits["S"]).reshape(-1, 2, 16).transpose(0, 2, 1).reshape(-1, 2)[:N]  # [N, nb]
    want = (s.astype(np.float64) * 15 * block).sum(1)
    for y in (sess.run(None, {"A": x})[0], np.concatenate([sess.run(None, {"A": x[i:i + 1]})[0] for i in range(3)])):
        np.testing.assert_allclose(y[0], want, rtol=1e-5)
        np.testing.assert_allclose(y[1], -want, rtol=1e-5)
        np.testing.assert_allclose(y[2], 0.0, atol=1e-6)


@pytest.mark.parametrize("isa", Q4_PATHS)
def test_kernel_block_of_five_groups_matches_the_reference(isa, monkeypatch):
    """A block of 40 (five 8-byte groups: one batch of four and a batch of one on the AVX2 path), on each path
    (session 90: on the AVX-512 Xeon it ran the VNNI and AMX paths only, and AVX2's last batch left out of a
    block's dots passed)."""
    _take_path(isa, monkeypatch)
    K, N, block = 120, 21, 40
    model = _graph(K, N, block, "MatMulQ4", zero_points=True, seed=3)
    x = np.random.default_rng(4).normal(size=(5, K)).astype(np.float32)
    y = _session(model).run(None, {"A": x})[0]
    ref = _graph(K, N, block, "MatMulNBits", zero_points=True, seed=3)
    exact = _dequant_reference(ref, x)
    assert np.abs(y - exact).max() / np.abs(exact).max() < 0.02
    for m in range(1, 5):
        assert np.array_equal(_session(model).run(None, {"A": x[:m]})[0], y[:m])


def test_avx2_and_avx512_paths_compute_the_same_bits(monkeypatch):
    from edgespec.native import isa

    if isa() == "avx2":
        pytest.skip("compares the AVX-512 VNNI path with the AVX2 path: this CPU has only the latter")
    for K, N, block, zp in ((256, 48, 128, True), (96, 37, 32, True), (128, 70, 64, False), (1536, 300, 128, True)):
        x = np.random.default_rng(5).normal(size=(9, K)).astype(np.float32)
        monkeypatch.setenv("EDGESPEC_Q4_ISA", "avx512")
        wide = _session(_graph(K, N, block, "MatMulQ4", zp)).run(None, {"A": x})[0]
        monkeypatch.setenv("EDGESPEC_Q4_ISA", "avx2")
        narrow = _session(_graph(K, N, block, "MatMulQ4", zp)).run(None, {"A": x})[0]
        assert np.array_equal(wide, narrow), (K, N, block)


def test_exact_kernels_refuses_another_accuracy_level_or_layout(tiny_int4_bundle, copy_bundle, tmp_path):
    from edgespec.cli import main

    for key, value, words in (("accuracy_level", 1, "accuracy level 1"), ("layout", "cuda", "cuda layout")):
        b = copy_bundle(tiny_int4_bundle)
        mf = b / "edgespec.json"
        d = json.loads(mf.read_text())
        if key == "layout":
            d["models"]["target"]["layout"] = value
        else:
            d["models"]["target"]["quant"][key] = value
        mf.write_text(json.dumps(d))
        r = CliRunner().invoke(main, ["exact-kernels", str(b), "-o", str(tmp_path / key)])
        assert r.exit_code != 0 and words in r.output and len(r.output.strip().splitlines()) == 1, r.output
        assert not (tmp_path / key).exists()
        import shutil

        shutil.rmtree(b)


def test_top_p_kernel_without_a_compiler_leaves_sampling_in_numpy(monkeypatch, tmp_path):
    """No C++ compiler (or EDGESPEC_NATIVE_SAMPLING=0): the top-p kernel is None, never an error,
    and sampling gives the same distribution from numpy."""
    import numpy as np

    from edgespec import native
    from edgespec.sampling import SamplingParams, distribution

    row = np.random.default_rng(0).standard_normal(5000).astype(np.float32) * 3
    sp = SamplingParams(0.7, top_p=0.8)
    want = distribution(row, sp)
    monkeypatch.setattr(native, "_top_p", [])
    monkeypatch.setenv("EDGESPEC_NATIVE_DIR", str(tmp_path))  # nothing built here yet
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert native.top_p_kernel() is None
    got = distribution(row, sp)
    # the same kept tokens; their weights are float64 exps of the same numbers: bitwise where numpy's exp is
    # the C library's, within an ulp or two where numpy has its own AVX-512 exp (session 11's Xeon)
    from tiny import numpy_exp_is_libms

    assert np.array_equal(got.idx, want.idx)
    if numpy_exp_is_libms():
        assert np.array_equal(got.w, want.w)
    else:
        np.testing.assert_allclose(got.w, want.w, rtol=1e-14, atol=0)
    monkeypatch.setattr(native, "_top_p", [])
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("EDGESPEC_NATIVE_SAMPLING", "0")
    assert native.top_p_kernel() is None and not list(tmp_path.glob("*.so"))


def _amx_calls() -> int:
    """MatMulQ4 calls that took an AMX path in this process (the library onnxruntime loaded: dlopen gives the
    same one)."""
    import ctypes

    from edgespec.native import library_path

    fn = ctypes.CDLL(library_path()).edgespec_q4_amx_calls
    fn.restype = ctypes.c_uint64
    return int(fn())


def _attn_calls() -> list[int]:
    """Attention calls by the path they took in this process: AVX2's 8 lanes, AVX-512's 16, the portable path
    (q4gemm.cpp's edgespec_attn_calls, session 90: a path that was never taken compared equal to itself)."""
    import ctypes

    from edgespec.native import library_path

    fn = ctypes.CDLL(library_path()).edgespec_attn_calls
    fn.restype, fn.argtypes = ctypes.c_uint64, [ctypes.c_int]
    return [int(fn(i)) for i in range(3)]


@contextlib.contextmanager
def _attention_takes_its_path(D: int):
    """Within: every attention call took the path the kernel path named now (EDGESPEC_Q4_ISA as set) gives a head
    of D lanes: the portable one, AVX-512's 16 lanes where D is a multiple of 16, else AVX2's 8."""
    from edgespec.native import isa

    path = isa()
    want = 2 if path.startswith("portable") else 1 if path.startswith("avx512") and D % 16 == 0 else 0
    before = _attn_calls()
    yield
    ran = [a - b for a, b in zip(_attn_calls(), before)]
    assert ran[want] > 0 and sum(ran) == ran[want], (path, D, ran)


def _amx_min_rows(block: int) -> int:
    """The fewest rows a call has for MatMulQ4 to take the AMX path (q4gemm.cpp, amx_min_rows): fewer, the
    VNNI path is cheaper (session 21's measurements: its per-block work weighs more at smaller blocks)."""
    return 4 if block >= 128 else 6 if block >= 64 else 8


def _needs_amx():
    from edgespec.native import isa

    if isa() != "avx512-vnni+amx":
        pytest.skip(f"needs AMX-INT8 and AVX-512 VNNI: this CPU takes its {isa()} path")


@pytest.mark.parametrize("K,N,block,zp", [(256, 48, 128, True), (96, 37, 32, True), (128, 70, 64, False),
                                          (120, 21, 40, True), (512, 33, 256, True), (1536, 500, 128, True),
                                          (256, 37, 32, "float"), (1536, 300, 32, "float"), (1536, 300, 128, "float"),
                                          (256, 37, 64, "float"), (96, 37, 32, "float")])
def test_amx_path_computes_the_avx512_bits_at_every_width(K, N, block, zp, monkeypatch):
    """The AMX path (calls of _amx_min_rows(block) rows or more, signed tile multiplies of the activations by
    w - z over chunks of 16 rows; one chunk in pairs of column tiles where a block is one or two tile steps) against the AVX-512
    VNNI path: the same bits for every row, at widths 1 to 40 (one, two and three chunks, partial ones) and
    wherever the row sits; blocks of 1, 2 and 4 tile steps and one of 40 (steps of 8 bytes); and 1536 x 500
    (32 column tiles, the last partial, in tasks of 5 tiles on both threads: odd splits of the pairs). Each
    width is checked to have taken the AMX path from _amx_min_rows(block) rows on, and the VNNI path below."""
    _needs_amx()
    x = np.random.default_rng(6).normal(size=(40, K)).astype(np.float32)
    x[7] = 0.0  # a row of zeros (scale 0) among them
    x[8, : K // 2] *= 1000.0  # and one with blocks of very different scales
    amx = _session(_graph(K, N, block, "MatMulQ4", zp))
    monkeypatch.setenv("EDGESPEC_Q4_ISA", "avx512")
    vnni = _session(_graph(K, N, block, "MatMulQ4", zp))
    want = np.concatenate([vnni.run(None, {"A": x[i:i + 1]})[0] for i in range(40)])
    for m in (1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 30, 31, 40):
        before = _amx_calls()
        assert np.array_equal(amx.run(None, {"A": x[:m]})[0], want[:m]), m
        assert _amx_calls() - before == (m >= _amx_min_rows(block)), m
    for start in (1, 5, 14, 23):
        assert np.array_equal(amx.run(None, {"A": x[start:start + 17]})[0], want[start:start + 17]), start


@pytest.mark.parametrize("top,amx_runs", [(128, True), (129, False), (255, False)])
def test_amx_path_takes_zero_points_up_to_128_and_leaves_larger_ones_to_vnni(top, amx_runs, monkeypatch):
    """The AMX path multiplies the activations by w - z as signed bytes, which holds zero points up to 128
    (w - z down to -128). MatMulNBits' are 4-bit, but the operator reads a byte per column: zero points up to
    128 (128 itself included) take the AMX path with the VNNI path's bits; a kernel with a larger one computes
    every width on the VNNI path (wrapped bytes would give other numbers)."""
    from onnx import numpy_helper

    _needs_amx()
    model = _graph(256, 48, 128, "MatMulQ4", True)
    z = next(i for i in model.graph.initializer if i.name == "Z")
    big = np.random.default_rng(2).integers(100, 129, size=numpy_helper.to_array(z).shape, dtype=np.uint8)
    big.flat[5] = top
    big.flat[7] = 128
    z.CopyFrom(numpy_helper.from_array(big, "Z"))
    x = np.random.default_rng(7).normal(size=(24, 256)).astype(np.float32)
    amx = _session(model)
    monkeypatch.setenv("EDGESPEC_Q4_ISA", "avx512")
    vnni = _session(model)
    want = np.concatenate([vnni.run(None, {"A": x[i:i + 1]})[0] for i in range(24)])
    for m in (1, 4, 9, 16, 24):
        before = _amx_calls()
        assert np.array_equal(amx.run(None, {"A": x[:m]})[0], want[:m]), m
        assert _amx_calls() - before == (amx_runs and m >= _amx_min_rows(128)), m


def _mapped_rss_kib(path) -> int:
    """Resident KiB of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, mine = 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5 and ":" not in head[0]:
            mine = line.rstrip().endswith(str(path))
        elif mine and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def _session_from_file(model, d, monkeypatch, huge: str | None):
    """The graph saved with its weights in an external file (onnxruntime maps it, as a bundle's), opened
    with EDGESPEC_Q4_HUGEPAGES as given (read when the library is registered)."""
    import onnx
    import onnxruntime as ort

    from conftest import pool_session_options
    from edgespec.native import library_path

    d.mkdir()
    model = onnx.ModelProto.FromString(model.SerializeToString())  # onnx.save moves the weights out of its argument
    onnx.save(model, str(d / "m.onnx"), save_as_external_data=True, location="m.onnx.data", size_threshold=0)
    if huge is None:
        monkeypatch.delenv("EDGESPEC_Q4_HUGEPAGES", raising=False)
    else:
        monkeypatch.setenv("EDGESPEC_Q4_HUGEPAGES", huge)
    so = pool_session_options()
    so.register_custom_ops_library(library_path())
    return ort.InferenceSession(str(d / "m.onnx"), so, providers=["CPUExecutionProvider"]), d / "m.onnx.data"


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/pagemap"), reason="needs Linux's /proc/self/pagemap")
@pytest.mark.parametrize("fmt", ["zero-points", "minimums", "kquant"])
def test_kernel_copies_mapped_weights_and_drops_the_file_pages_with_the_same_results(fmt, tmp_path, monkeypatch):
    """The weights (and their scales, zero points, float minimums or Q4_K scale bytes) copied onto the pool's
    pages at the first call and the file's pages dropped; the same bits as reading them where they are."""
    from pathlib import Path

    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    copies = not (thp.exists() and "[never]" in thp.read_text())
    if fmt == "zero-points":
        model = _graph(1536, 2048, 128, "MatMulQ4", True)
    else:
        from edgespec_export.kernels import pack_q4

        b, scale, zp, _ = q4k_like(2048, 1536, seed=11)
        arrs = pack_q4(b, scale, zp, 1536, 2048, 32, kquant=fmt == "kquant")
        assert len(arrs) == (5 if fmt == "kquant" else 4)
        model = q4_node_model(1536, 2048, arrs)
    weights_kib = 1536 * 2048 // 2 // 1024
    x = np.random.default_rng(3).normal(size=(5, 1536)).astype(np.float32)
    plain, plain_file = _session_from_file(model, tmp_path / "plain", monkeypatch, "0")
    y = plain.run(None, {"A": x})[0]
    if _mapped_rss_kib(plain_file) == 0:
        pytest.skip("onnxruntime read the weights into its own memory instead of mapping the file")
    assert _mapped_rss_kib(plain_file) >= weights_kib  # read where onnxruntime mapped them
    own, own_file = _session_from_file(model, tmp_path / "own", monkeypatch, None)
    assert np.array_equal(own.run(None, {"A": x})[0], y)
    if copies:  # the copy is read; the file's pages are dropped from the process (not doubled)
        assert _mapped_rss_kib(own_file) < weights_kib // 4
        if fmt != "zero-points":  # minimums (384 KiB) and scale bytes (192 KiB) too
            assert _mapped_rss_kib(own_file) < 64, _mapped_rss_kib(own_file)
    for m in (1, 3):  # later calls read the copy: the same bits at every width
        assert np.array_equal(own.run(None, {"A": x[:m]})[0], y[:m])
    again, _ = _session_from_file(model, tmp_path / "again", monkeypatch, None)
    assert np.array_equal(again.run(None, {"A": x})[0], y)


def test_a_drafter_runs_once_at_load_so_its_first_draft_is_not_timed_with_the_first_call_costs(tiny_xk, monkeypatch):
    """A model without a width probe (the drafter) makes one short call when it opens on the CPU: the
    session's first-call costs (the kernel's copy of its weights among them) are paid at load, and the
    round policy's first catch-up timing is a read, not them. Then it is left empty, its counters clear."""
    from edgespec.onnx_lm import OnnxLM

    calls = []
    real = OnnxLM._run

    def spy(self, ids, past, *a, **kw):
        calls.append((self.spec.role, len(ids), past))
        return real(self, ids, past, *a, **kw)

    monkeypatch.setattr(OnnxLM, "_run", spy)
    eng = edgespec.load(tiny_xk)
    d = eng.decoder.drafters["model"].lm
    assert ("drafter", 2, 0) in calls  # the warm-up call, at load
    assert d.length == 0 and d.calls == 0 and d.run_seconds == 0.0
    calls.clear()
    # (session 73: CI) the first round drafts whatever the load's width probe measured on a busy machine: a verify
    # call priced as a one-token one, a cheap step (a probe that saw wide calls as dear drafted nothing, no read)
    cost = eng.decoder.policy.measured
    cost.target = {w: 0.01 for w in cost.target}
    cost._fit = cost._costs = None  # (the line fitted to the probe's times, and the prices cached from it)
    cost.draft_steps["model"] = 0.0005
    out = eng.generate("Hello there", max_new_tokens=12, drafter="model")
    assert out.token_ids == eng.generate("Hello there", max_new_tokens=12, drafter="none").token_ids
    reads = cost.catchup_reads.get("model", [])
    assert reads and all(n >= 1 for n, _ in reads)


def test_a_prefill_computes_only_its_last_positions_logits_with_the_same_numbers(tiny_xk):
    """exact-kernels gives each graph a ``logits_skip`` input (a Slice before the lm_head): a prefill's
    calls compute the logits of their last position only, the same bits as a call that computes them
    all (the kernel's rows do not depend on the call's width), and every position's keys and values."""
    from edgespec.manifest import load_manifest
    from edgespec.onnx_lm import OnnxLM
    from edgespec.providers import choose

    m = load_manifest(tiny_xk)
    assert m.target.io.logits_skip == "logits_skip" and m.target.operators["Slice"] >= 1
    # a float drafter is left to onnxruntime's kernels, with the export's logits skip (session 29)
    assert m.drafter.kernels == "onnxruntime" and m.drafter.io.logits_skip == "logits_skip"
    ids = [(7 * i + 3) % 200 for i in range(21)]
    for spec in (m.target,):
        full = OnnxLM(spec, 64, choose(["cpu"]), min_width=1)
        part = OnnxLM(spec, 64, choose(["cpu"]), min_width=1)
        assert part.skips_logits
        every = full.forward(ids)
        part.prefill_chunk = 8  # three calls: 8, 8, 5 tokens, each asking for its last position's logits
        seen = []
        run = part._run
        part._run = lambda i, p, *a, **kw: seen.append((len(i), kw.get("skip", 0))) or run(i, p, *a, **kw)
        last = part.prefill(ids)
        assert seen == [(8, 7), (8, 7), (5, 4)]
        assert last.shape == every[-1].shape and np.array_equal(last, every[-1])
        assert part.tokens == full.tokens == ids
        nxt = [11, 12, 13]  # the caches hold the same keys and values: the next call computes the same
        assert np.array_equal(part.forward(nxt), full.forward(nxt))
        more = [21, 22, 23, 24, 25, 26]  # a catch-up with a hint: the logits of its last rows only
        seen.clear()
        assert np.array_equal(part.forward_from(more, 4), full.forward(more)[4:])
        assert seen == [(6, 4)]
        with pytest.raises(ValueError, match="cannot skip"):
            run([1, 2], part.length, skip=2)
        with pytest.raises(ValueError, match="first must be"):
            part.forward_from([1, 2], 2)
        # (session 82, a mutation test) under a width policy the lm_head's rows are a width the policy allows: a
        # chunk's last position comes from rows of its narrowest width, whatever the chunk's
        wide = OnnxLM(spec, 64, choose(["cpu"]), min_width=4)
        wide.prefill_chunk = 8
        seen.clear()
        run4 = wide._run
        wide._run = lambda i, p, *a, **kw: seen.append((len(i), kw.get("skip", 0))) or run4(i, p, *a, **kw)
        assert np.array_equal(wide.prefill(ids), every[-1]) and seen == [(8, 4), (8, 4), (5, 1)]

    from dataclasses import replace

    from edgespec.errors import BundleError
    from edgespec.planner import working_bytes

    wrong = replace(m.target, io=replace(m.target.io, logits_skip="no_such_input"))
    with pytest.raises(BundleError, match="no 'no_such_input'.*the bundle is inconsistent"):
        OnnxLM(wrong, 64, choose(["cpu"]), min_width=1)  # a manifest naming an input its graph lacks

    plain = replace(m, target=replace(m.target, io=replace(m.target.io, logits_skip=None)))
    # a prefill chunk's logits are one row: the working memory counts a verify call's at most (MAX_DRAFT + 4
    # rows; MAX_DRAFT more where the target verifies alternates, as this one can)
    assert m.target.io.row_positions
    assert working_bytes(m, 256, False) == working_bytes(plain, 256, False) - (256 - 132) * m.target.vocab_size * 8
    assert working_bytes(m, 32, False) == working_bytes(plain, 32, False)


def test_kernel_leaves_weights_that_are_not_a_files_pages_where_they_are():
    """Weights onnxruntime holds in its own memory (a graph with its initializers inline) could not be
    handed back after a copy: the kernel reads them where they are instead of holding them twice."""
    from edgespec.measure import rss_now

    K, N = 2048, 16384  # 16 MiB of packed weights
    sess = _session(_graph(K, N, 128, "MatMulQ4", True))
    x = np.random.default_rng(4).normal(size=(1, K)).astype(np.float32)
    sess.run(None, {"A": x})  # onnxruntime's own first-run allocations
    sess2 = _session(_graph(K, N, 128, "MatMulQ4", True, seed=1))
    before = rss_now()
    sess2.run(None, {"A": x})
    assert rss_now() - before < K * N // 2 // 2  # no copy of its 16 MiB


def _fused_graph(K, N, block, zero_points=True, seed=0, swiglu=True, bias=False):
    """One edgespec.MatMulQ4 with the kernel's epilogue: ``swiglu`` (gate and up projections of N columns each,
    their tiles interleaved, silu(gate) * up out) or a ``bias`` of N values; and the same computed by plain
    MatMulQ4 nodes (outputs G, U or Y) for the reference."""
    from onnx import TensorProto, helper, numpy_helper

    from edgespec_export.kernels import pack_q4

    nb = K // block
    rng = np.random.default_rng(seed)

    def weights():
        return list(pack_q4(rng.integers(0, 256, size=(N, nb, block // 2), dtype=np.uint8),
                            (rng.random(N * nb) * 0.02 + 0.001).astype(np.float32),
                            _zero_points(rng, N, nb, zero_points), K, N, block))

    inits, nodes, outs = [], [], []

    def add(name, arr):
        if arr is not None:
            inits.append(numpy_helper.from_array(arr, name))
        return name if arr is not None else ""

    kw = dict(domain="edgespec", K=K, N=N, bits=4, block_size=block)
    gate = weights()
    def slots(names):  # minimums (a fourth array) are input 5, after the bias
        return names if len(names) < 4 else names[:3] + [""] + names[3:]

    plain = [slots([add(f"{x}g", a) for x, a in zip("BSZM", gate)])]
    if swiglu:
        up = weights()
        plain.append(slots([add(f"{x}u", a) for x, a in zip("BSZM", up)]))
        both = [None if a is None else np.stack([a, b], axis=1).reshape((2 * a.shape[0],) + a.shape[1:])
                for a, b in zip(gate, up)]
        fused_in = slots([add(f"{x}f", a) for x, a in zip("BSZM", both)])
        nodes.append(helper.make_node("MatMulQ4", ["A", *fused_in], ["F"], swiglu=1, **kw))
        nodes += [helper.make_node("MatMulQ4", ["A", *p], [o], **kw) for p, o in zip(plain, "GU")]
        outs = ["F", "G", "U"]
    else:
        b = add("bias", rng.normal(size=N).astype(np.float32))
        ins = ["A", *plain[0]]
        ins += [""] * (6 - len(ins))
        ins[4] = b  # the bias is input 4 (minimums, where there are, stay 5)
        nodes.append(helper.make_node("MatMulQ4", ins if ins[5] else ins[:5], ["F"], **kw))
        nodes.append(helper.make_node("MatMulQ4", ["A", *plain[0]], ["Y"], **kw))
        outs = ["F", "Y"]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, ["M", N]) for o in outs], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("edgespec", 1)])


def _silu_times(g, u):
    g64 = g.astype(np.float64)
    return g64 / (1.0 + np.exp(-g64)) * u.astype(np.float64)


@pytest.mark.parametrize("K,N,block,zp", [(256, 48, 128, True), (96, 37, 32, True), (128, 70, 64, False),
                                          (1536, 300, 128, True), (256, 37, 32, "float"), (1536, 300, 32, "float"),
                                          (1536, 300, 128, "float")])
def test_swiglu_kernel_computes_silu_of_gate_times_up_and_rows_do_not_depend_on_the_width(K, N, block, zp, monkeypatch):
    """MatMulQ4 with swiglu=1 (the gate's and the up projection's tiles interleaved): silu(gate) * up of the two
    products the plain kernel computes, to float32 rounding; each row bitwise the same at every width (1 to 40:
    the VNNI path, AMX from its first width on, one and several chunks) and wherever it sits; the AVX-512 VNNI
    and AVX2 paths the same bits. N not a multiple of 16 (a partial last pair) and 1536 x 300 (19 pairs, tasks
    of whole pairs on both threads) included."""
    from edgespec.native import isa

    x = np.random.default_rng(3).normal(size=(40, K)).astype(np.float32)
    x[5] = 0.0
    model = _fused_graph(K, N, block, zp)
    f, g, u = _session(model).run(None, {"A": x})
    want = _silu_times(g, u)
    assert np.abs(f - want).max() <= 4e-6 * max(1.0, np.abs(want).max()), np.abs(f - want).max()
    assert np.array_equal(f[5], np.zeros(N, np.float32))
    ones = np.concatenate([_session(model).run(None, {"A": x[i:i + 1]})[0] for i in range(40)])
    assert np.array_equal(ones, f)
    s = _session(model)
    for m in (2, 3, 4, 5, 8, 9, 16, 17, 33):
        assert np.array_equal(s.run(None, {"A": x[:m]})[0], f[:m]), m
    assert np.array_equal(s.run(None, {"A": x[3:10]})[0], f[3:10])
    if isa() != "avx2":
        monkeypatch.setenv("EDGESPEC_Q4_ISA", "avx2")
        assert np.array_equal(_session(model).run(None, {"A": x})[0], f)
        monkeypatch.setenv("EDGESPEC_Q4_ISA", "avx512")
        assert np.array_equal(_session(model).run(None, {"A": x})[0], f)


def test_swiglu_kernel_follows_the_activation_at_its_edges():
    """silu at gates in the hundreds of both signs (the sigmoid from exp(-|g|): no overflow on either side, ~0 and
    ~g), near zero and at zero; against float64."""
    K, N, block = 64, 16, 32
    s = _session(_fused_graph(K, N, block, seed=4))
    x = np.random.default_rng(9).normal(size=(4, K)).astype(np.float32)
    x[1] *= 400.0
    x[2] *= 1e-4
    x[3] = 0.0
    f, g, u = s.run(None, {"A": x})
    assert np.abs(g[1]).max() > 50  # (the case is there)
    assert np.allclose(f, _silu_times(g, u), rtol=4e-6, atol=1e-30)
    assert np.array_equal(f[3], np.zeros(N, np.float32))


def test_bias_kernel_adds_onnxruntimes_bits():
    """MatMulQ4 with a bias (input 4): the plain product plus the bias, bitwise (the same float addition the Add node
    it replaces makes), at every width, with and without zero points."""
    for K, N, block, zp in ((256, 48, 128, True), (96, 37, 32, False), (96, 37, 32, "float")):
        x = np.random.default_rng(8).normal(size=(12, K)).astype(np.float32)
        model = _fused_graph(K, N, block, zp, swiglu=False)
        from onnx import numpy_helper

        bias = next(numpy_helper.to_array(i) for i in model.graph.initializer if i.name == "bias")
        s = _session(model)
        f, y = s.run(None, {"A": x})
        assert np.array_equal(f, y + bias)
        for m in (1, 2, 5, 9):
            assert np.array_equal(s.run(None, {"A": x[:m]})[0], f[:m]), m


def test_kernel_epilogue_refuses_bad_attributes_and_inputs_with_an_error():
    from onnx import numpy_helper

    m = _fused_graph(64, 16, 32)
    for a in m.graph.node[0].attribute:
        if a.name == "swiglu":
            a.i = 2
    with pytest.raises(Exception, match="swiglu is 0 or 1"):
        _session(m).run(None, {"A": np.zeros((1, 64), np.float32)})
    # (session 90) a SwiGLU kernel given a bias (of N values: no test gave one, and it was taken, then left unused)
    m = _fused_graph(64, 16, 32)
    m.graph.initializer.append(numpy_helper.from_array(np.zeros(16, np.float32), "bias"))
    fused = next(n for n in m.graph.node if any(a.name == "swiglu" and a.i == 1 for a in n.attribute))
    ins = list(fused.input) + [""] * (4 - len(fused.input))
    del fused.input[:]
    fused.input.extend(ins[:4] + ["bias"] + ins[5:])
    with pytest.raises(Exception, match="bias has N values, and a SwiGLU kernel takes none"):
        _session(m).run(None, {"A": np.zeros((1, 64), np.float32)})
    m = _fused_graph(64, 16, 32, swiglu=False)
    b = next(i for i in m.graph.initializer if i.name == "bias")
    b.CopyFrom(numpy_helper.from_array(np.zeros(15, np.float32), "bias"))
    with pytest.raises(Exception, match="bias has N values"):
        _session(m).run(None, {"A": np.zeros((1, 64), np.float32)})
    # a bias fed at run time is checked at every call, not once with the weights
    from onnx import TensorProto, helper

    m.graph.initializer.remove(next(i for i in m.graph.initializer if i.name == "bias"))
    m.graph.input.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["n"]))
    s = _session(m)
    a = np.ones((1, 64), np.float32)
    f, y = s.run(None, {"A": a, "bias": np.full(16, 0.5, np.float32)})
    assert np.array_equal(f, y + np.float32(0.5))
    with pytest.raises(Exception, match="bias has N values"):
        s.run(None, {"A": a, "bias": np.zeros(8, np.float32)})


def test_exact_kernels_fuses_swiglu_and_biases_and_logits_follow_the_unfused_rewrite(tiny_int4_bundle, tmp_path):
    """The rewrite makes each SwiGLU (gate and up projections, Sigmoid, two Muls) one MatMulQ4; the manifest counts
    the MatMulQ4 nodes left (the tiny random models' biases are zeros, which the builder leaves out: biases below). Its logits are those of the unfused rewrite (fused=False)
    up to the activation's rounding: the same argmax everywhere."""
    import onnx

    from edgespec.manifest import load_manifest
    from edgespec_export import kernels

    fused = kernels.apply_to_bundle(tiny_int4_bundle, tmp_path / "fused")
    real = kernels.rewrite_graph

    def unfused(*a, **kw):
        return real(*a, **{**kw, "fused": False})

    import unittest.mock as mock

    with mock.patch.object(kernels, "rewrite_graph", unfused):
        plain = kernels.apply_to_bundle(tiny_int4_bundle, tmp_path / "plain")
    rewritten = 0
    for role in ("target", "drafter"):
        spec = getattr(load_manifest(fused), role)
        if spec is None or spec.kernels != "edgespec-q4":  # (a float drafter stays as it is)
            continue
        rewritten += 1
        ops = [n.op_type for n in onnx.load(str(spec.path), load_external_data=False).graph.node]
        layers = ops.count("DecodeAttentionF16")  # (float16 caches: the default)
        assert layers and "Sigmoid" not in ops and "MatMulNBits" not in ops
        assert spec.operators["MatMulQ4"] == ops.count("MatMulQ4")
        pspec = getattr(load_manifest(plain), role)
        pops = [n.op_type for n in onnx.load(str(pspec.path), load_external_data=False).graph.node]
        assert pops.count("MatMulQ4") - ops.count("MatMulQ4") == layers  # gate and up: one node a layer
        assert pops.count("Sigmoid") == layers and pops.count("Mul") - ops.count("Mul") == 2 * layers
    assert rewritten
    ids = list(range(5, 45))
    a = edgespec.load(fused, memory=False).decoder.target.forward(ids)
    b = edgespec.load(plain, memory=False).decoder.target.forward(ids)
    assert np.array_equal(a.argmax(-1), b.argmax(-1))
    assert np.abs(a - b).max() <= 1e-4 * np.abs(b).max()


def _mlp_graph(tmp_path, share: str = ""):
    """A hand-made graph the builder's way: a qkv-like MatMulNBits plus a bias Add, then a SwiGLU (gate, up,
    Sigmoid, Mul, Mul) into a down projection. ``share`` names a tensor that is also a graph output (``g``,
    ``sg``, ``act``, ``u``: then no SwiGLU fusion may happen, those values would be gone), or is ``up-no-zp``
    (the up projection without zero points, the gate with: not one kernel's weights)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(11)
    K, N, I, block = 64, 64, 96, 32
    inits, nodes = [], []

    def matmul(name, inp, k, n, out, zp=True):
        nbk = k // block
        inits.extend([numpy_helper.from_array(rng.integers(0, 256, size=(n, nbk, block // 2), dtype=np.uint8), f"{name}.B"),
                      numpy_helper.from_array((rng.random(n * nbk) * 0.05 + 0.01).astype(np.float32), f"{name}.S"),
                      numpy_helper.from_array(rng.integers(0, 256, size=(n * ((nbk + 1) // 2),), dtype=np.uint8),
                                              f"{name}.Z")])
        if not zp:
            inits.pop()
        nodes.append(helper.make_node("MatMulNBits", [inp, f"{name}.B", f"{name}.S"] + ([f"{name}.Z"] if zp else []),
                                      [out], name=name, domain="com.microsoft", K=k, N=n, bits=4, block_size=block,
                                      accuracy_level=4))

    matmul("qkv", "A", K, N, "qkv_out")
    inits.append(numpy_helper.from_array(rng.normal(size=N).astype(np.float32), "qkv.bias"))
    nodes.append(helper.make_node("Add", ["qkv_out", "qkv.bias"], ["h"], name="bias_add"))
    matmul("gate", "h", N, I, "g")
    matmul("up", "h", N, I, "u", zp=share != "up-no-zp")
    nodes += [helper.make_node("Sigmoid", ["g"], ["sg"]), helper.make_node("Mul", ["g", "sg"], ["act"]),
              helper.make_node("Mul", ["act", "u"], ["m"])]
    matmul("down", "m", I, K, "Y")
    outs = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", K])]
    if share in ("g", "sg", "act", "u"):
        outs.append(helper.make_tensor_value_info(share, TensorProto.FLOAT, ["M", I]))
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])], outs, inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    path = tmp_path / f"mlp-{share or 'plain'}" / "model.onnx"
    path.parent.mkdir(parents=True)
    onnx.save(m, str(path))
    return path


def test_rewrite_fuses_a_bias_bitwise_and_a_swiglu_and_leaves_a_shared_one_alone(tmp_path):
    """On a hand-made graph: the bias Add goes into the kernel with the same bits as the unfused rewrite's Add
    (onnxruntime's), the SwiGLU into one node whose output follows the unfused one's to float rounding; a SwiGLU
    whose gate, sigmoid, product or up values something else reads, or whose gate and up differ in zero points,
    keeps its nodes (the bias still fuses) and computes what the unfused rewrite does, bitwise."""
    import shutil

    import onnx

    from edgespec_export.kernels import rewrite_graph

    path = _mlp_graph(tmp_path)
    plain = tmp_path / "plain" / "model.onnx"
    shutil.copytree(path.parent, plain.parent)
    assert rewrite_graph(path, pad_attention=False)["swiglu"] == 1
    counts = rewrite_graph(plain, pad_attention=False, fused=False)
    assert counts["swiglu"] == counts["bias"] == 0 and counts["matmuls"] == 4
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert ops == ["MatMulQ4", "MatMulQ4", "MatMulQ4"]
    x = np.random.default_rng(12).normal(size=(6, 64)).astype(np.float32)
    fused, unfused = (_session(onnx.load(str(p))).run(None, {"A": x})[0] for p in (path, plain))
    assert np.abs(fused - unfused).max() <= 1e-5 * np.abs(unfused).max()
    # the bias alone: bitwise (cut both graphs after the bias)
    for p in (path, plain):
        m = onnx.load(str(p))
        del m.graph.output[:]
        m.graph.output.append(onnx.helper.make_tensor_value_info("h", onnx.TensorProto.FLOAT, ["M", 64]))
        onnx.save(m, str(p.parent / "cut.onnx"))
    a, b = (_session(onnx.load(str(p.parent / "cut.onnx"))).run(None, {"A": x})[0] for p in (path, plain))
    assert np.array_equal(a, b)
    for share in ("g", "sg", "act", "u", "up-no-zp"):
        shared = _mlp_graph(tmp_path, share)
        plain = tmp_path / f"plain-{share}" / "model.onnx"
        shutil.copytree(shared.parent, plain.parent)
        counts = rewrite_graph(shared, pad_attention=False)
        assert counts["swiglu"] == 0 and counts["bias"] == 1 and counts["matmuls"] == 4, share
        assert [n.op_type for n in onnx.load(str(shared)).graph.node].count("Sigmoid") == 1, share
        rewrite_graph(plain, pad_attention=False, fused=False)
        a, b = (_session(onnx.load(str(p))).run(None, {"A": x}) for p in (shared, plain))
        assert all(np.array_equal(u, v) for u, v in zip(a, b)), share


def test_alternates_come_back_once_token_healing_has_spelled_its_text(tiny_xk, monkeypatch):
    """Token healing holds the reply's first tokens as a grammar does, and alternates wait for the hold's release:
    after it, they are verified and kept as in any greedy generation, and the output stays plain decoding's with
    the same healing (the drafter of the test above, its alternates mostly right)."""
    from test_exactness import PROMPTS

    eng = edgespec.load(tiny_xk)
    real = eng.decoder.drafters["model"]
    prompt = PROMPTS[0] + " ret"
    healed, need = eng.heal(eng.encode(prompt, fit=True))
    assert need
    ref = eng.generate(prompt, max_new_tokens=30, drafter="none", token_healing=True).token_ids
    eng.decoder.drafters["model"] = _Planted(len(healed), ref + [0] * 16, eng.decoder.vocab)
    monkeypatch.setattr(eng.decoder.policy, "alternates", lambda k, alts, room, s: [(i, t) for i, t, _, _ in alts][:room])
    eng.decoder.policy.use_alternates = True
    try:
        eng.reset()
        r = eng.generate(prompt, max_new_tokens=30, drafter="model", draft_tokens=3, token_healing=True)
        assert r.token_ids == ref and r.stats["alternates_kept"] > 0
    finally:
        eng.decoder.drafters["model"] = real
        eng.decoder.policy.use_alternates = False


@pytest.mark.parametrize("isa", ["this-cpu", "avx512", "avx2", "portable"])
def test_kquant_scales_compute_the_float_formats_bits_at_every_width(isa, monkeypatch):
    """Q4_K's scale bytes (input 6: per block 6-bit scale and minimum, per super-block float d and dmin) give
    the bits of the same blocks with float scales and the exact minimums (input 5): the kernel's products d x
    byte are exact; each row the same at widths 1 to 20 (AMX from 8 rows on this CPU's path); and
    kquant_scales recovers the bytes from MatMulNBits' float zero points, refusing scales that are not Q4_K's."""
    from edgespec_export.kernels import TILE, kquant_scales, pack_q4

    if isa != "this-cpu":
        if isa == "avx512" and _isa_of_cpu() == "avx2":
            pytest.skip("no AVX-512 VNNI on this CPU")
        monkeypatch.setenv("EDGESPEC_Q4_ISA", isa)
    K, N = 512, 70
    b, scale, zp, minimum = q4k_like(N, K, seed=7)
    arrs = pack_q4(b, scale, zp, K, N, 32)
    assert len(arrs) == 5 and arrs[3] is None and arrs[4].dtype == np.uint8  # B, d/dmin, -, -, bytes
    flt = pack_q4(b, scale, zp, K, N, 32, kquant=False)
    tiles, nb = -(-N // TILE), K // 32
    exact = np.concatenate([minimum, np.zeros((tiles * TILE - N, nb), np.float32)])
    exact = np.ascontiguousarray(exact.reshape(tiles, TILE, nb).transpose(0, 2, 1))
    ks = _session(q4_node_model(K, N, arrs))
    fl = _session(q4_node_model(K, N, [flt[0], flt[1], None, exact, None]))
    x = np.random.default_rng(8).normal(size=(20, K)).astype(np.float32)
    want = fl.run(None, {"A": x})[0]
    assert np.array_equal(ks.run(None, {"A": x})[0], want)
    for m in (1, 2, 3, 7, 8, 9, 16, 17):
        assert np.array_equal(ks.run(None, {"A": x[:m]})[0], want[:m]), m
    assert np.array_equal(ks.run(None, {"A": x[5:6]})[0], want[5:6])
    # the recovery: the bytes and d/dmin back, and None for a scale that is not d x a byte
    d, sb = kquant_scales(scale.reshape(N, nb), minimum)
    assert np.array_equal(d[..., 0][:, :, None] * sb[..., 0].reshape(N, nb // 8, 8).astype(np.float32),
                          scale.reshape(N, nb // 8, 8))
    bad = scale.reshape(N, nb).copy()
    bad[3, 4] = np.nextafter(bad[3, 4], np.float32(1))
    assert kquant_scales(bad, minimum) is None


def _isa_of_cpu():
    from edgespec.native import isa

    return isa()


def test_kernel_refuses_minimums_and_kquant_scales_of_the_wrong_size():
    """Minimums (input 5) and Q4_K scale bytes (input 6) are checked against K, N and the block size like the
    weights; scale bytes take super-blocks of 8 blocks and no float minimums beside them: an error, no numbers."""
    from edgespec_export.kernels import pack_q4

    K, N = 512, 40
    b, scale, zp, _ = q4k_like(N, K, seed=12)
    x = np.zeros((2, K), np.float32)
    flt = pack_q4(b, scale, zp, K, N, 32, kquant=False)
    ks = pack_q4(b, scale, zp, K, N, 32)
    for arrays, why in (([flt[0], flt[1], None, flt[3][:, :-1], None], "minimums do not have the size"),
                        ([ks[0], ks[1], None, None, ks[4][:, :-1]], "k-quant scales do not have the size"),
                        ([ks[0], ks[1], None, flt[3], ks[4]], "no float minimums"),
                        ([ks[0], ks[1][:, :-1], None, None, ks[4]], "B or scales do not have the size")):
        with pytest.raises(Exception, match=why):
            _session(q4_node_model(K, N, arrays)).run(None, {"A": x})
    nb8 = pack_q4(b[:, :12], scale.reshape(N, 16)[:, :12].ravel(), zp.reshape(N, 16)[:, :12].ravel(), 384, N, 32,
                  kquant=False)  # 12 blocks: no whole super-blocks
    fake = np.zeros((nb8[0].shape[0], 12, 2, 16), np.uint8)
    with pytest.raises(Exception, match="super-blocks of 8 blocks"):
        _session(q4_node_model(384, N, [nb8[0], nb8[1], None, None, fake])).run(None, {"A": np.zeros((1, 384), np.float32)})


def test_alternates_are_on_by_default_where_verify_rows_are_cheap(tiny_xk, tiny_int4_bundle, monkeypatch):
    """The decoder verifies alternates by default on edgespec's AVX-512 paths (session 38 measured +2-8% on the
    AMX Xeon, session 40 +3-5% on a Zen 4's VNNI) and not elsewhere: not with onnxruntime's kernels, not on the
    kernel's AVX2 path."""
    import edgespec.onnx_lm as onnx_lm
    from edgespec.native import isa

    wide = isa().startswith("avx512")
    assert edgespec.load(tiny_xk).decoder.policy.use_alternates is wide
    assert edgespec.load(tiny_int4_bundle).decoder.policy.use_alternates is False  # (onnxruntime's kernels)
    monkeypatch.setattr(onnx_lm, "_wide_path", lambda: False)  # (an AVX2 CPU, or EDGESPEC_Q4_ISA=avx2)
    eng = edgespec.load(tiny_xk)
    assert eng.decoder.target.cheap_rows is False and eng.decoder.policy.use_alternates is False
    monkeypatch.setattr(onnx_lm, "_wide_path", lambda: True)
    assert edgespec.load(tiny_xk).decoder.policy.use_alternates is True


@pytest.mark.parametrize("path, wide", [("avx2", False), ("avx512-vnni", True), ("avx512-vnni+amx", True)])
def test_the_kernel_paths_with_cheap_rows_are_the_avx512_ones(path, wide, monkeypatch):
    """_wide_path reads the kernel's path: AVX-512 (VNNI, with AMX or not) has cheap verify rows, AVX2 not
    (alternates measured +0.8% there, session 40); a CPU where the library cannot be built (ProviderError) has none."""
    import edgespec.native as native
    import edgespec.onnx_lm as onnx_lm
    from edgespec.errors import ProviderError

    monkeypatch.setattr(native, "isa", lambda: path)
    assert onnx_lm._wide_path() is wide

    def fails():
        raise ProviderError("no kernel here")

    monkeypatch.setattr(native, "isa", fails)
    assert onnx_lm._wide_path() is False


def _on_path(isa, monkeypatch, make):
    """``make()`` (a session) with the library registered on kernel path ``isa`` ("this-cpu": the path this CPU
    takes)."""
    if isa == "this-cpu":
        monkeypatch.delenv("EDGESPEC_Q4_ISA", raising=False)
    else:
        monkeypatch.setenv("EDGESPEC_Q4_ISA", isa)
    return make()


def test_the_portable_path_computes_the_x86_paths_matmul_bits(monkeypatch):
    """The portable path (plain C++: aarch64's, and an x86-64 CPU's without AVX2) gives MatMulQ4 the bits of the x86
    paths, every one of which gives the same: zero points or none, float minimums (GGUF's, HQQ's), Q4_K's scale
    bytes, a bias, SwiGLU; rows of zeros, of large and of tiny values; widths 1 to 20 (the AMX path from 4 rows on an
    AMX CPU)."""
    from edgespec_export.kernels import pack_q4

    from edgespec.native import isa

    assert _on_path("portable", monkeypatch, isa) == "portable"
    rng = np.random.default_rng(11)
    models = [_graph(K, N, block, "MatMulQ4", zp, seed=K + N) for K, N, block, zp in
              ((256, 48, 128, True), (96, 37, 32, False), (1536, 300, 128, True), (256, 37, 32, "float"),
               (1536, 300, 32, "float"))]
    models += [_fused_graph(256, 48, 128, seed=2), _fused_graph(96, 37, 32, "float", seed=3),
               _fused_graph(96, 37, 32, False, seed=4, swiglu=False)]
    b, scale, zp, _ = q4k_like(70, 512, seed=7)
    models.append(q4_node_model(512, 70, pack_q4(b, scale, zp, 512, 70, 32)))
    for model in models:
        K = model.graph.input[0].type.tensor_type.shape.dim[-1].dim_value
        x = rng.normal(size=(20, K)).astype(np.float32)
        x[3], x[4], x[5] = 0.0, x[4] * 1e4, x[5] * 1e-30
        x[6, ::3] = 0.0
        want = None
        for path in ("this-cpu", "avx2", "portable"):
            s = _on_path(path, monkeypatch, lambda: _session(model))
            got = s.run(None, {"A": x})
            if want is None:
                want = got
                continue
            for a, w in zip(got, want):
                assert np.array_equal(a, w), (path, model.graph.node[0].input)
            if path == "portable":
                for m in (1, 2, 5, 9):
                    assert all(np.array_equal(a, w[:m]) for a, w in zip(s.run(None, {"A": x[:m]}), want))


@pytest.mark.parametrize("op", ["DecodeAttention", "DecodeAttentionF16"])
@pytest.mark.parametrize("H,KVH,D,window,softcap,rot,interleaved",
                         [(12, 2, 128, -1, 0.0, None, 0), (6, 2, 48, 16, 30.0, None, 0), (4, 2, 64, 1, 0.0, 16, 0),
                          (3, 1, 16, 50, 5.0, None, 1), (8, 4, 32, -1, 0.0, 8, 1)])
def test_the_portable_path_computes_the_avx2_paths_attention_bits(H, KVH, D, window, softcap, rot, interleaved, op,
                                                                   monkeypatch):
    """The portable path's DecodeAttention gives the AVX2 path's bits (its 8-lane chains and trees): outputs and
    the present caches (a float16 cache's new keys and values rounded alike), whole and partial rotaries,
    interleaved ones, windows and score caps, calls of 1 to 9 rows from several first positions, alternates
    beside the causal rows."""
    L, P = 160, 180
    cache_k, cache_v, qkv = _attention_inputs(H, KVH, D, L, 140, 9, seed=12)
    if op.endswith("F16"):
        cache_k, cache_v = cache_k.astype(np.float16), cache_v.astype(np.float16)
    kw = dict(window=window, softcap=softcap, rot=rot, interleaved=interleaved)
    runs = {}
    for path in ("avx2", "portable"):
        plain = _on_path(path, monkeypatch, lambda: _session(_attention_graph(op, H, KVH, D, L, P, **kw)))
        posd = _on_path(path, monkeypatch, lambda: _session(_attention_graph(op, H, KVH, D, L, P, positions=True, **kw)))
        out = []
        def keep(o, t):  # (a present cache not bound in place holds what its buffer held past the call's rows)
            return [o[0], o[1][:, :, :t], o[2][:, :, :t]]

        for past in (0, 7, 63, 64, 130):
            for n in (1, 2, 5, 9):
                out += keep(plain.run(None, {"qkv": qkv[:, :n], "pk": cache_k.copy(), "pv": cache_v.copy(),
                                             "seqlens": np.array([past + n - 1], np.int32)}), past + n)
        out += keep(posd.run(None, {"qkv": qkv[:, :8], "pk": cache_k.copy(), "pv": cache_v.copy(),
                                    "seqlens": np.array([40 + 8 - 1], np.int32),
                                    "pos": np.array([0, 1, 2, 3, 4, 1, 3, 4])}), 48)
        runs[path] = out
    for i, (a, b) in enumerate(zip(runs["avx2"], runs["portable"])):
        assert a.shape == b.shape and np.array_equal(a, b, equal_nan=True), i


def test_the_portable_path_rounds_new_keys_and_values_to_float16_as_f16c(monkeypatch):
    """A float16 cache's new values through the portable path's rounding (its own on x86-64; aarch64's hardware
    conversion there) against the AVX2 path's F16C: values of every magnitude from float16's subnormals past its
    largest, ties to even exactly halfway, both signs, infinities and NaNs; and numpy's astype below 65504."""
    H = KVH = 4
    D, L = 128, 64
    rng = np.random.default_rng(13)
    mags = np.ldexp(1.0 + rng.random(L * KVH * D), rng.integers(-30, 18, L * KVH * D)).astype(np.float32)
    vals = (mags * rng.choice([-1.0, 1.0], mags.size)).astype(np.float32)
    halves = np.arange(1, 0x7bff, 7, dtype=np.uint16).view(np.float16).astype(np.float32)  # ties: halfway to the next
    nxt = np.nextafter(halves.astype(np.float16), np.float16(np.inf)).astype(np.float32)
    vals[:halves.size] = (halves + (nxt - halves) / 2).astype(np.float32)
    vals[-8:] = [np.inf, -np.inf, np.nan, 65504.0, 65519.0, 65520.0, -1e30, 2.0 ** -25]
    qkv = np.zeros((1, L, (H + 2 * KVH) * D), np.float32)
    qkv[0, :, (H + KVH) * D:] = vals.reshape(L, KVH * D)  # the values (no rotary on them)
    k = np.zeros((1, KVH, L, D), np.float16)
    got = {}
    for path in ("avx2", "portable"):
        s = _on_path(path, monkeypatch, lambda: _session(_attention_graph("DecodeAttentionF16", H, KVH, D, L, L)))
        got[path] = s.run(None, {"qkv": qkv, "pk": k.copy(), "pv": k.copy(), "seqlens": np.array([L - 1], np.int32)})[2]
    stored = got["portable"][0].transpose(1, 0, 2).reshape(-1)  # [L, KVH, D] as the values were laid out
    assert np.array_equal(got["portable"].view(np.uint16), got["avx2"].view(np.uint16))
    ok = np.abs(vals) <= 65504
    assert np.array_equal(stored[ok], vals[ok].astype(np.float16))
    assert (np.abs(stored[~ok & ~np.isnan(vals)]) == 65504).all() and np.isnan(stored[np.isnan(vals)]).all()


def test_the_portable_path_decodes_a_bundle_exactly_with_the_x86_paths_logits(tiny_xk, monkeypatch):
    """A whole exact-kernels bundle (fused SwiGLU and biases, float16 caches, alternates' positions) on the portable
    path: its target's logits over a prefill and one-token calls are the AVX2 path's bit for bit, and greedy
    speculative decoding (the model drafter with its second choices verified beside its drafts, prompt lookup)
    equals plain decoding."""
    import edgespec

    ids = list(range(5, 45))
    rows = {}
    for path in ("avx2", "portable"):
        eng = _on_path(path, monkeypatch, lambda: edgespec.load(tiny_xk, memory=False))
        t = eng.decoder.target
        t.reset()
        rows[path] = np.concatenate([np.array(t.forward(ids[:30]))] + [np.array(t.forward([i])) for i in ids[30:]])
    assert np.array_equal(rows["avx2"], rows["portable"])
    eng.decoder.policy.use_alternates = True  # (the portable path's default is off, as AVX2's)
    prompt = "def fizzbuzz(n):\n    for i in range(1, n + 1):\n        if i % 15 == 0:\n"
    plain = eng.generate(prompt, max_new_tokens=40, drafter="none", ignore_eos=True)
    for drafter in ("model", "prompt-lookup"):
        r = eng.generate(prompt, max_new_tokens=40, drafter=drafter, ignore_eos=True)
        assert r.token_ids == plain.token_ids, drafter


def test_the_built_library_is_named_for_the_machine_it_runs_on(monkeypatch):
    """A kernel cache shared by an x86-64 and an aarch64 machine (a home directory on both) keeps a library for each:
    the name follows the machine, not only the source and flags."""
    import edgespec.native as native

    here = native.source_tag()
    monkeypatch.setattr(native.platform, "machine", lambda: "aarch64")
    assert native.source_tag() != here and len(native.source_tag()) == 16
    # (session 53, a review) and the C library it links against: one built on a newer system does not load on an older
    arm = native.source_tag()
    monkeypatch.setattr(native.platform, "libc_ver", lambda: ("glibc", "2.17"))
    assert native.source_tag() != arm


def test_the_portable_path_takes_the_softmax_max_as_the_avx2_path_over_a_nan_score(monkeypatch):
    """A NaN key (a model already computing NaN) gives a NaN score: the AVX2 path's 8 lane maxima let it take its lane
    (max_ps keeps its second operand), then std::max passes over it; the portable path takes the max the same way, so
    the rows' bits stay the AVX2 path's (session 43's review: a plain running max picked another maximum there)."""
    H = KVH = 1
    D, L = 8, 32
    k = np.random.default_rng(3).normal(size=(1, KVH, L, D)).astype(np.float32)
    v = np.random.default_rng(4).normal(size=(1, KVH, L, D)).astype(np.float32)
    k[0, 0, 0] = 3.0  # a high score in lane 0
    k[0, 0, 8, 2] = np.nan  # a NaN score in lane 0, after it
    qkv = np.zeros((1, 1, (H + 2 * KVH) * D), np.float32)
    qkv[0, 0, :D] = 1.0
    outs = {}
    for path in ("avx2", "portable"):
        s = _on_path(path, monkeypatch, lambda: _session(_attention_graph("DecodeAttention", H, KVH, D, L, L)))
        outs[path] = s.run(None, {"qkv": qkv, "pk": k.copy(), "pv": v.copy(), "seqlens": np.array([15], np.int32)})[0]
    assert np.isfinite(outs["avx2"]).all() and np.array_equal(outs["avx2"], outs["portable"])


def test_exact_kernels_leaves_a_cuda_layout_drafter_as_it_is(tiny_dirs, tmp_path_factory):
    """An INT4 target in the cpu layout with an INT4 drafter in the cuda layout (float16 activations, which edgespec's
    CPU kernels do not take): the target is rewritten, the drafter left as it is, and the bundle decodes exactly
    (session 43: the drafter was rewritten and the run failed at its check, "Type 'tensor(float16)' ... MatMulQ4")."""
    import edgespec
    from conftest import _export
    from edgespec.manifest import load_manifest
    from edgespec_export.kernels import apply_to_bundle

    b = _export(tmp_path_factory, "tiny-mixed", tiny_dirs["qwen2"], drafter=str(tiny_dirs["drafter"]),
                target_precision="int4", drafter_precision="int4", drafter_device="cuda")
    logs = []
    out = apply_to_bundle(b, tmp_path_factory.mktemp("xk") / "mixed-xk", log=logs.append)
    assert any("drafter: left as it is (exported in the cuda layout" in line for line in logs), logs
    m = load_manifest(out)
    assert m.target.kernels == "edgespec-q4" and m.drafter.kernels == "onnxruntime" and m.drafter.layout == "cuda"
    eng = edgespec.load(out, memory=False)
    plain = eng.generate("def add(a, b):", max_new_tokens=16, drafter="none", ignore_eos=True).token_ids
    assert eng.generate("def add(a, b):", max_new_tokens=16, drafter="model", ignore_eos=True).token_ids == plain


def test_the_replay_is_timing_free_on_a_target_that_verifies_alternates(tiny_xk, monkeypatch, tmp_path):
    """scripts/replay_policy.py where the target verifies alternates (session 67, a review of session 66's
    replay): the premium frozen at --alt-ms stays there (a premium no call renews was halved at each generation's
    begin, 0.8 -> 0.05 ms by the fifth), and which alternates a round verifies weighs the priced drafting time,
    not the decoder's clock: a clock a thousand times slower changes nothing."""
    import sys
    from pathlib import Path

    from edgespec import decoder as decoder_mod
    from edgespec.policy import RoundPolicy

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import replay_policy

    init, alternates = RoundPolicy.__init__, RoundPolicy.alternates
    monkeypatch.setattr(RoundPolicy, "__init__", lambda self, *a, **kw: init(self, *a, **dict(kw, use_alternates=True)))
    seen: list[tuple[float, float]] = []

    def spy(self, k, alts, room, draft_s):
        seen.append((round(draft_s, 9), self.alt_premium))
        return alternates(self, k, alts, room, draft_s)

    monkeypatch.setattr(RoundPolicy, "alternates", spy)
    dinit = decoder_mod.Decoder.__init__
    runs, calls = [], []
    for tick in (1e-4, 0.1):  # seconds a clock reading advances
        t = [0.0]

        def clock(tick=tick):
            t[0] += tick
            return t[0]

        monkeypatch.setattr(decoder_mod.Decoder, "__init__", lambda self, *a, **kw: dinit(self, *a, **dict(kw, clock=clock)))
        seen.clear()
        out = tmp_path / f"r{tick}.json"
        assert replay_policy.main([str(tiny_xk), "--categories", "code,chat", "--per-category", "1",
                                   "--max-new-tokens", "30", "--drafters", "model,auto", "--alt-ms", "0.8",
                                   "--json", str(out)]) == 0
        runs.append(json.loads(out.read_text()))
        calls.append(list(seen))
    assert len(calls[0]) > 4 and calls[0] == calls[1]
    assert {premium for _, premium in calls[0]} == {0.8e-3}
    assert runs[0] == runs[1] and all(r["exact"] for r in runs[0] if r["exact"] is not None)
