"""``--quant-algo gguf``: a GGUF file's own 4-bit blocks kept in the exported graph (export/gguf_blocks.py),
and edgespec's kernel computing them (float minimums, MatMulQ4's input 5)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import SMOL_GGUF, _export, exact_kernels_decode_exactly, need

from edgespec.cli import main


def _blocks(kind: str, n_blocks: int, seed: int = 0) -> np.ndarray:
    """Random but valid raw blocks of ``kind`` (finite float16 scales, every other byte random)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    rng = np.random.default_rng(seed)
    size = GGML_QUANT_SIZES[GGMLQuantizationType[kind]][1]
    b = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)

    def f16(at, lo, hi):
        b[:, at:at + 2] = (rng.random(n_blocks) * (hi - lo) + lo).astype(np.float16).view(np.uint8).reshape(-1, 2)

    if kind in ("Q4_0", "Q4_1", "Q4_K"):
        f16(0, 0.001, 0.05)
    if kind in ("Q4_1", "Q4_K"):
        f16(2, -0.05 if kind == "Q4_1" else 0.001, 0.05)
    if kind == "Q6_K":
        f16(208, 0.001, 0.05)
    return b


@pytest.mark.parametrize("kind,per_block", [("Q4_0", 32), ("Q4_1", 32), ("Q4_K", 256), ("Q6_K", 256)])
def test_decoders_give_the_gguf_packages_weights(kind, per_block):
    """Each decoder's integers, scales and minimums (or offset) rebuild exactly what the gguf package's
    dequantize gives for the same bytes (random blocks: every nibble, scale and minimum pattern)."""
    from gguf.constants import GGMLQuantizationType
    from gguf.quants import dequantize

    from edgespec_export import gguf_blocks as gb

    N, K = 6, 512
    raw = _blocks(kind, N * K // per_block, seed=len(kind))
    kq = gb.DECODERS[kind](raw.reshape(-1), N, K)
    want = dequantize(raw, GGMLQuantizationType[kind]).reshape(N, K)
    assert kq.q.max() <= (63 if kind == "Q6_K" else 15)
    assert np.array_equal(kq.dequantize(), want.astype(np.float32))
    # a planted bug (the two nibbles of each byte swapped) is caught by the same comparison
    bad = gb.KQuant(kq.kind, kq.q.reshape(N, -1, 2)[..., ::-1].reshape(N, K), kq.scale, kq.block, kq.bits,
                    kq.minimum, kq.offset)
    assert not np.array_equal(bad.dequantize(), want)


def test_matmulnbits_arrays_hold_the_blocks_and_onnxruntime_computes_them():
    """Float zero points (minimum / scale) rebuild the weights to float rounding, a block of scale 0 with a
    minimum (the constant -minimum, seen in Qwen's ffn_down) included; onnxruntime's MatMulNBits with them
    computes x @ W.T."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from edgespec_export import gguf_blocks as gb

    N, K = 40, 256
    kq = gb.q4_k(_blocks("Q4_K", N * K // 256, seed=3).reshape(-1), N, K)
    kq.scale[3, 2] = 0.0
    kq.minimum[3, 2] = 0.0125
    kq.scale[5, 1] = kq.minimum[5, 1] = 0.0
    w = kq.dequantize()
    assert np.all(w[3, 64:96] == np.float32(-0.0125))
    b, s, z = gb.matmulnbits_arrays(kq)
    back = gb._dequant_matmulnbits([b, s, z], N, K, 32)
    assert np.allclose(back, w, rtol=0, atol=2e-7 * np.abs(w).max())
    assert np.all(back[3, 64:96] == np.float32(-0.0125)) and np.all(back[5, 32:64] == 0)
    node = helper.make_node("MatMulNBits", ["A", "B", "S", "Z"], ["Y"], domain="com.microsoft", K=K, N=N, bits=4,
                            block_size=32, accuracy_level=4)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", K])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", N])],
                          [numpy_helper.from_array(a, n) for a, n in ((b, "B"), (s, "S"), (z, "Z"))])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    x = np.random.default_rng(4).normal(size=(3, K)).astype(np.float32)
    from conftest import pool_session_options

    y = ort.InferenceSession(model.SerializeToString(), pool_session_options(),
                             providers=["CPUExecutionProvider"]).run(None, {"A": x})[0]
    want = x.astype(np.float64) @ w.T.astype(np.float64)
    assert np.abs(y - want).max() < 1e-4 * np.abs(want).max()


def test_min_max_blocks_round_within_half_a_step():
    from edgespec_export import gguf_blocks as gb

    w = np.random.default_rng(5).normal(size=(8, 128)).astype(np.float32)
    w[2, :32] = 0.7  # a constant block: scale 0, the minimum holds it
    kq = gb.min_max_4bit(w)
    err = np.abs(kq.dequantize() - w).reshape(8, 4, 32).max(-1)
    assert np.all(err <= kq.scale / 2 * (1 + 1e-5) + 1e-7)
    assert kq.scale[2, 0] == 0 and np.all(kq.dequantize()[2, :32] == np.float32(0.7))


def test_llama_rows_are_transformers_own_order():
    """A llama GGUF's attn_q/attn_k rows are in llama.cpp's rotary order; the export puts them in the order
    transformers loads them in (its LlamaTensorProcessor), for query heads and grouped key heads."""
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor

    from edgespec_export.gguf_blocks import _llama_rows

    for heads, kv_heads in ((9, 3), (4, 4), (32, 8)):
        p = LlamaTensorProcessor(config={"num_attention_heads": heads, "num_key_value_heads": kv_heads})
        for name, n in ((".attn_q.", heads * 64), (".attn_k.", kv_heads * 64)):
            rows = np.arange(n)[:, None]
            want = p.process(rows, f"blk.0{name}weight").weights[:, 0]
            assert np.array_equal(_llama_rows(n, heads if name == ".attn_q." else kv_heads), want), (heads, name)


def test_projection_names_map_to_gguf_tensors():
    from edgespec_export.gguf_blocks import gguf_tensors_of

    t = {n: None for n in ("blk.3.attn_q.weight", "blk.3.attn_k.weight", "blk.3.attn_v.weight", "blk.3.ffn_down.weight",
                           "token_embd.weight")}
    assert gguf_tensors_of("/model/layers.3/attn/qkv_proj/MatMul_Q4", t) == [
        "blk.3.attn_q.weight", "blk.3.attn_k.weight", "blk.3.attn_v.weight"]
    assert gguf_tensors_of("/model/layers.3/mlp/down_proj/MatMul_Q4", t) == ["blk.3.ffn_down.weight"]
    assert gguf_tensors_of("/lm_head/MatMul_Q4", t) == ["token_embd.weight"]  # (tied: no output.weight)
    assert gguf_tensors_of("/model/layers.4/mlp/down_proj/MatMul_Q4", t) is None
    assert gguf_tensors_of("/model/layers.3/attn/rotary/MatMul", t) is None
    # (an untied model: the head is output.weight, never the embedding table; session 87, mutation_s87.md)
    assert gguf_tensors_of("/lm_head/MatMul_Q4", {**t, "output.weight": None}) == ["output.weight"]
    assert gguf_tensors_of("/lm_head/MatMul_Q4", {"output.weight": None}) == ["output.weight"]
    assert gguf_tensors_of("/lm_head/MatMul_Q4", {"blk.0.ffn_up.weight": None}) is None
    t["blk.3.ffn_gate.weight"] = t["blk.3.ffn_up.weight"] = None  # (a fused gate_up: gate's rows first)
    assert gguf_tensors_of("/model/layers.3/mlp/gate_up_proj/MatMul_Q4", t) == ["blk.3.ffn_gate.weight",
                                                                                 "blk.3.ffn_up.weight"]


@pytest.mark.parametrize("args,why", [
    (["--block-size", "128"], "blocks of 32"),
    (["--device", "cuda"], "cpu layout"),
    (["--symmetric"], "not --symmetric"),
    (["--target-precision", "int8"], "int4 only"),
])
def test_gguf_algo_refuses_what_it_cannot_keep(args, why, tmp_path):
    """One-line errors before anything is read or written; and for a target that is no .gguf file."""
    fake = tmp_path / "m.gguf"
    fake.write_bytes(b"GGUF" + b"\0" * 64)
    r = CliRunner().invoke(main, ["export", str(fake), "-o", str(tmp_path / "out"), "--quant-algo", "gguf", *args])
    assert r.exit_code != 0 and why in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "out").exists()


def test_gguf_algo_refuses_a_target_that_is_no_gguf_file(tiny_dirs, tmp_path):
    r = CliRunner().invoke(main, ["export", str(tiny_dirs["qwen2"]), "-o", str(tmp_path / "out"), "--quant-algo", "gguf"])
    assert r.exit_code != 0 and "not a .gguf file" in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert not (tmp_path / "out").exists()


def test_gguf_algo_leaves_weights_not_of_whole_blocks_as_the_builder_made_them(tmp_path_factory):
    """(session 56, a review) A float GGUF whose hidden size is no multiple of 32 (48): the weights it feeds had
    no whole blocks to keep, and the export's reshape was a traceback (exit 1). Those nodes stay as the builder
    rounded them (said); the rest take the file's blocks, and the bundle loads and decodes."""
    import io

    import tiny
    from edgespec import load
    from edgespec_export.build import QuantOptions

    root = tmp_path_factory.mktemp("k48")
    hf = tiny.make_model(root / "hf", "qwen2", seed=3, hidden=48, heads=3, kv_heads=1, head_dim=16, layers=1)
    path = tiny.write_gguf(hf, root / "k48.gguf", arch="qwen2")
    log = io.StringIO()
    b = _export(tmp_path_factory, "k48-gguf", path, target_precision="int4", max_context=128,
                quant=QuantOptions(algorithm="gguf"), stream=log)
    said = [line for line in log.getvalue().splitlines() if "MatMulNBits from the GGUF's blocks" in line]
    assert len(said) == 1 and "left as the builder made them" in said[0], log.getvalue()[-2000:]
    assert not said[0].strip().startswith("0 ")  # (the down projection's 128 inputs: whole blocks, taken)
    # (a float file: every tensor taken is of another type, rounded to 4-bit blocks, none kept as stored)
    import re

    nodes, kept, rounded = (int(x) for x in re.search(r"(\d+) MatMulNBits from the GGUF's blocks: (\d+) tensors as "
                                                      r"stored, (\d+) of other types rounded", said[0]).groups())
    assert nodes >= 1 and kept == 0 and rounded == nodes, said[0]
    eng = load(b)
    assert len(eng.generate("hello", max_new_tokens=4, drafter="none", ignore_eos=True).token_ids) == 4


@pytest.fixture(scope="module")
def smol_gguf(tmp_path_factory):
    """SmolLM2 (every projection Q4_1; its tied head Q8_0, left as the builder's shared table) exported
    with --quant-algo gguf, with its quality report."""
    need(SMOL_GGUF, "SmolLM2-135M")
    from edgespec_export.build import QuantOptions

    return _export(tmp_path_factory, "smollm2-gguf", SMOL_GGUF, target_precision="int4", max_context=2048,
                   quant=QuantOptions(algorithm="gguf"), quality=True)


def test_smollm2_keeps_its_gguf_blocks_and_is_closer_to_the_file(smol_gguf, tmp_path):
    """The export's graph holds SmolLM2's Q4_1 blocks (150 projections; llama's attn_q/attn_k rows in
    transformers' order, checked against the builder's weights as it writes them): against the dequantized
    file (torch) top-1 agreement well above the RTN export's (0.71 measured; 0.85 here, the tied head
    still the builder's 4-bit table), recorded as algorithm gguf."""
    m = json.loads((smol_gguf / "edgespec.json").read_text())["models"]["target"]
    assert m["quant"]["algorithm"] == "gguf" and m["quant"]["block_size"] == 32
    # (session 49, a review) as written: blocks with minimums, the tied head's shared int4 table (both said otherwise)
    assert m["quant"]["symmetric"] is False and m["quant"]["quantize_embeddings"] is True
    q = m["quality"]
    assert q["top1_agreement"] >= 0.8, q
    assert m["validation"]["passed"]


def test_gguf_blocks_refuse_a_wrong_mapping(smol_gguf, tmp_path, monkeypatch):
    """A projection mapped to another layer's tensor is caught against the builder's weights: an
    ExportError, the graph not written."""
    import edgespec_export.gguf_blocks as gb
    from edgespec.errors import ExportError

    work = tmp_path / "t"
    shutil.copytree(smol_gguf / "target", work)
    before = (work / "model.onnx").read_bytes()
    real = gb.gguf_tensors_of

    def shifted(name, tensors):
        out = real(name, tensors)
        return [n.replace("blk.1.", "blk.2.") for n in out] if out else out

    monkeypatch.setattr(gb, "gguf_tensors_of", shifted)
    with pytest.raises(ExportError, match="does not match the graph's weights"):
        gb.apply_to_graph(work / "model.onnx", SMOL_GGUF, "llama", 9, 3)
    assert (work / "model.onnx").read_bytes() == before


def test_exact_kernels_take_the_gguf_minimums_and_decoding_stays_exact(smol_gguf, tmp_path):
    """exact-kernels turns the float zero points into MatMulQ4's minimums; greedy speculative output (prompt
    lookup) is the target-only greedy output token for token, and one-token decoding computes what a verify
    computes."""
    exact_kernels_decode_exactly(smol_gguf, tmp_path / "xk", "float minimum per block")


def test_k4_blocks_are_q4k_shaped_and_close():
    """Tensors of other types (Qwen's Q6_K head and projections) become Q4_K-shaped blocks: scales and
    minimums 6-bit multiples of a float16 per super-block (so exact-kernels holds them in Q4_K's scale
    bytes: kquant_scales recovers them), each weight within about a step of its block's grid."""
    from edgespec_export import gguf_blocks as gb
    from edgespec_export.kernels import kquant_scales

    w = np.random.default_rng(9).normal(size=(24, 512)).astype(np.float32) * 0.05
    kq = gb.k4_blocks(w)
    assert kq.q.max() <= 15 and np.all(kq.minimum >= 0)
    err = np.abs(kq.dequantize() - w).reshape(24, 16, 32).max(-1)
    assert np.all(err <= kq.scale * 1.5 + 1e-6), float((err / kq.scale).max())
    rel = np.linalg.norm(kq.dequantize() - w) / np.linalg.norm(w)
    assert rel < 0.12, rel
    b, s, z = gb.matmulnbits_arrays(kq)
    assert kquant_scales(s.reshape(24, 16), z.reshape(24, 16) * s.reshape(24, 16)) is not None


def test_fit_scale_min_is_llamacpps_make_qkx2_quants():
    """fit_scale_min (vectorized: numpy's fallback where kquant.cpp cannot be built) against the statement-by-
    statement transcription of llama.cpp's function on blocks of normal, heavy-tailed, positive-shifted and flat
    weights: the same scale and minimum in all but ~1% of the blocks (numpy sums in its own order, which can tip
    one trial's error past another's; 7 of 608 here), where the first version of the port, gridding its trials
    from the range's minimum instead of the best minimum so far, differed in about a quarter."""
    from edgespec_export.gguf_blocks import fit_scale_min

    rng = np.random.default_rng(11)
    blocks = np.concatenate([rng.normal(size=(200, 32)), rng.standard_t(2, size=(200, 32)),
                             rng.normal(size=(200, 32)) + 1.5, np.full((4, 32), 0.25), np.zeros((4, 32))]
                            ).astype(np.float32) * 0.02
    scale, minimum = fit_scale_min(blocks)
    ref = np.array([_make_qkx2_quants(b, np.sqrt((b * b).mean()) + np.abs(b)) for b in blocks], np.float32)
    same = np.isclose(scale, ref[:, 0], rtol=1e-4, atol=1e-9) & np.isclose(minimum, ref[:, 1], rtol=1e-4, atol=1e-9)
    assert same.mean() >= 0.98, (int((~same).sum()), np.flatnonzero(~same)[:10])


def _make_qkx2_quants(x, weights, nmax=15, rmin=np.float32(-1), rdelta=np.float32(0.1), nstep=20):
    """llama.cpp's make_qkx2_quants (ggml-quants.c, use_mad false), transcribed statement by statement in float32
    scalars, every sum in the C code's order: (scale, the_min)."""
    f = np.float32
    x, weights = [f(v) for v in x], [f(v) for v in weights]
    mn, mx, sum_w, sum_x = x[0], x[0], weights[0], weights[0] * x[0]
    for i in range(1, 32):
        mn, mx = min(mn, x[i]), max(mx, x[i])
        sum_w += weights[i]
        sum_x += weights[i] * x[i]
    if mn > 0:
        mn = f(0)
    if mx == mn:
        return f(0), -mn
    iscale = f(nmax) / (mx - mn)
    scale = f(1) / iscale
    best = f(0)
    for i in range(32):
        L = min(max(int(np.rint(iscale * (x[i] - mn))), 0), nmax)
        diff = scale * f(L) + mn - x[i]
        best += weights[i] * (diff * diff)
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * f(step) + f(nmax)) / (mx - mn)
        La, sum_l, sum_l2, sum_xl = [], f(0), f(0), f(0)
        for i in range(32):
            L = min(max(int(np.rint(iscale * (x[i] - mn))), 0), nmax)
            La.append(L)
            sum_l += weights[i] * f(L)
            sum_l2 += weights[i] * f(L) * f(L)
            sum_xl += weights[i] * f(L) * x[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > 0:
                this_min, this_scale = f(0), sum_xl / sum_l2
            err = f(0)
            for i in range(32):
                diff = this_scale * f(La[i]) + this_min - x[i]
                err += weights[i] * (diff * diff)
            if err < best:
                best, scale, mn = err, this_scale, this_min
    return scale, -mn


def _quantize_row_q4_K_ref(x):
    """llama.cpp's quantize_row_q4_K_ref (ggml-quants.c) with the make_qkx2_quants it calls, transcribed statement
    by statement in float32 scalars, every sum in the C code's order: per block of 32 (scale d x sc, minimum
    dmin x m) and the integers (0 where the block's scale is 0, as k4_blocks writes them)."""
    f = np.float32


    x = np.asarray(x, f)
    scales, mins, qs = [], [], []
    for s in range(0, len(x), 256):
        sc, mi = [], []
        for j in range(8):
            b = x[s + 32 * j:s + 32 * j + 32]
            sum_x2 = f(0)
            for v in b:
                sum_x2 += v * v
            av_x = np.sqrt(sum_x2 / f(32))
            a, m = _make_qkx2_quants(list(b), [av_x + abs(v) for v in b])
            sc.append(a)
            mi.append(m)
        max_scale, max_min = max([f(0)] + sc), max([f(0)] + mi)
        inv_scale = f(63) / max_scale if max_scale > 0 else f(0)
        inv_min = f(63) / max_min if max_min > 0 else f(0)
        d = f(np.float16(max_scale / f(63)))
        dmin = f(np.float16(max_min / f(63)))
        for j in range(8):
            dj = d * f(min(int(np.rint(inv_scale * sc[j])), 63))
            dm = dmin * f(min(int(np.rint(inv_min * mi[j])), 63))
            scales.append(dj)
            mins.append(dm)
            b = x[s + 32 * j:s + 32 * j + 32]
            qs.extend(min(max(int(np.rint((v + dm) / dj)), 0), 15) if dj else 0 for v in b)
    return np.array(scales, f), np.array(mins, f), np.array(qs, np.uint8)


def _k4_rows(seed: int = 5) -> np.ndarray:
    """Rows of 512 weights (two super-blocks) of every kind a quantizer meets: normal, heavy-tailed, all
    positive, mostly zero, a flat block and an all-zero block."""
    rng = np.random.default_rng(seed)
    w = np.concatenate([rng.normal(size=(2, 512)), rng.standard_t(2, size=(2, 512)), rng.normal(size=(1, 512)) + 1.5,
                        rng.normal(size=(1, 512)) * (rng.random((1, 512)) < 0.1)]).astype(np.float32) * 0.02
    w[0, :32], w[1, 256:288] = 0.25, 0
    return w


def test_k4_blocks_are_llamacpps_quantize_row_q4_K_ref():
    """k4_blocks (kquant.cpp) writes the blocks llama.cpp's Q4_K quantizer writes for the same floats: the scales,
    minimums and integers of a statement-by-statement transcription of quantize_row_q4_K_ref, bit for bit. The
    numpy fallback (no compiler) fits in numpy's summation order: most integers the same, the same error
    within 2%."""
    from edgespec_export import gguf_blocks as gb

    if gb.native_q4k() is None:
        pytest.skip("no C++ compiler to build export/kquant.cpp")
    w = _k4_rows()
    kq = gb.k4_blocks(w)
    for r in range(w.shape[0]):
        s, m, q = _quantize_row_q4_K_ref(w[r])
        np.testing.assert_array_equal(kq.scale[r], s)
        np.testing.assert_array_equal(kq.minimum[r], m)
        np.testing.assert_array_equal(kq.q[r], q)
    kn = gb.k4_blocks(w, native=False)
    e_native, e_numpy = (float(np.linalg.norm(k.dequantize() - w)) for k in (kq, kn))
    assert (kn.q == kq.q).mean() > 0.9 and abs(e_numpy / e_native - 1) < 0.02, ((kn.q == kq.q).mean(), e_numpy / e_native)


def test_k4_blocks_weights_are_those_of_llamacpps_build(tmp_path):
    """By hand, where scripts/build_llamacpp.sh's build is present: llama.cpp's own quantize_row_q4_K_ref (its
    ggml-base library) quantizes the same floats to the same weights as k4_blocks (its blocks decoded by the gguf
    package; compared as weights: where a block's scale byte is 0 llama.cpp keeps integers that k4_blocks zeroes,
    the same weights)."""
    import subprocess
    import struct
    from pathlib import Path

    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from edgespec_export import gguf_blocks as gb

    lib = Path(__file__).resolve().parents[1] / ".llamacpp" / "build" / "ggml" / "src" / "libggml-base.a"
    need(lib, "llama.cpp's build (scripts/build_llamacpp.sh)")
    if gb.native_q4k() is None:
        pytest.skip("no C++ compiler to build export/kquant.cpp")
    src = tmp_path / "ref.c"
    src.write_text("#include <stdio.h>\n#include <stdlib.h>\n#include <stdint.h>\n"
                   "void quantize_row_q4_K_ref(const float *x, void *y, int64_t k);\n"
                   "int main(void) { int64_t n; if (fread(&n, 8, 1, stdin) != 1) return 1;\n"
                   "  float *x = malloc(n * 4); if (fread(x, 4, n, stdin) != (size_t)n) return 1;\n"
                   "  unsigned char *y = malloc(n / 256 * 144); quantize_row_q4_K_ref(x, y, n);\n"
                   "  fwrite(y, 1, n / 256 * 144, stdout); return 0; }\n")
    exe = tmp_path / "ref"
    import shutil

    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to link llama.cpp's ggml-base")
    r = subprocess.run([cc, "-O2", str(src), str(lib), "-lm", "-lpthread", "-lstdc++", "-fopenmp", "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-500:]
    w = np.concatenate([_k4_rows(s) for s in range(8)])
    out = subprocess.run([str(exe)], input=struct.pack("<q", w.size) + w.tobytes(), capture_output=True, check=True)
    ref = dequantize(np.frombuffer(out.stdout, np.uint8).reshape(w.shape[0], -1), GGMLQuantizationType.Q4_K)
    np.testing.assert_array_equal(gb.k4_blocks(w).dequantize(), ref.reshape(w.shape))


def test_k4_blocks_fit_in_numpy_without_a_compiler(monkeypatch):
    """Where kquant.cpp cannot be built (no compiler), k4_blocks is numpy's fit (exactly what native=False
    gives), and a K that is no multiple of 256 is refused on either path."""
    from edgespec.errors import ProviderError
    from edgespec_export import gguf_blocks as gb

    def fail(*a, **k):
        raise ProviderError("no compiler")

    monkeypatch.setattr(gb, "_native", [])
    monkeypatch.setattr("edgespec.native._build", fail)
    assert gb.native_q4k() is None
    w = _k4_rows()
    kq = gb.k4_blocks(w)
    monkeypatch.setattr(gb, "_native", [])  # (the next caller builds it again)
    kn = gb.k4_blocks(w, native=False)
    assert kq.kind == "k4" and all(np.array_equal(getattr(kq, f), getattr(kn, f)) for f in ("q", "scale", "minimum"))
    for native in (True, False):
        with pytest.raises(ValueError, match="multiple of 256"):
            gb.k4_blocks(w[:, :288], native=native)


def test_k4_fit_finds_a_q4k_grid_that_min_max_misses():
    """k4_blocks fits each block's scale and minimum as llama.cpp's Q4_K quantizer does (fit_scale_min): on
    weights that are Q4_K blocks whose integers span 0..14 (not the whole 0..15, as many of a real file's do) it
    finds their grid again, to float rounding, where each block's own range (``fit=False``, session 35's
    rounding) puts 15 steps across 14 and misses it; on normal weights its error is below the range's."""
    from edgespec_export import gguf_blocks as gb

    rng = np.random.default_rng(3)
    N, K = 8, 512
    q = rng.integers(0, 15, size=(N, K // 32, 32)).astype(np.float32)
    q[..., 0], q[..., 1] = 0, 14
    sc, mb = (rng.integers(20, 64, size=(N, K // 256, 8)).astype(np.float32) for _ in range(2))
    sc[..., 0] = mb[..., 0] = 63  # (each super-block's largest byte 63, as llama.cpp writes them)
    d, dmin = ((rng.random((N, K // 256, 1)) * 0.009 + 0.001).astype(np.float16).astype(np.float32) for _ in range(2))
    scale, minimum = (d * sc).reshape(N, K // 32), (dmin * mb).reshape(N, K // 32)
    w = (scale[..., None] * q - minimum[..., None]).reshape(N, K)

    def rel(kq):
        return float(np.linalg.norm(kq.dequantize() - w) / np.linalg.norm(w))

    assert rel(gb.k4_blocks(w)) < 1e-5
    assert rel(gb.k4_blocks(w, fit=False)) > 0.01
    g = np.random.default_rng(9).normal(size=(24, 512)).astype(np.float32) * 0.05
    e_fit, e_range = (np.linalg.norm(gb.k4_blocks(g, fit=f).dequantize() - g) for f in (True, False))
    assert e_fit < 0.95 * e_range, (e_fit, e_range)


def test_gguf_blocks_refuse_a_tensor_of_another_shape_and_a_graph_without_projections(smol_gguf, tmp_path,
                                                                                      monkeypatch):
    """A projection mapped to a tensor of another shape, or a graph none of whose nodes map to the file's
    tensors: an ExportError naming it, the graph not written."""
    import edgespec_export.gguf_blocks as gb
    from edgespec.errors import ExportError

    work = tmp_path / "t"
    shutil.copytree(smol_gguf / "target", work)
    before = (work / "model.onnx").read_bytes()
    monkeypatch.setattr(gb, "gguf_tensors_of", lambda name, tensors: ["blk.0.attn_k.weight"])  # 192 x 576
    with pytest.raises(ExportError, match=r"is 192 x 576, the graph's weights"):
        gb.apply_to_graph(work / "model.onnx", SMOL_GGUF, "llama", 9, 3)
    # (the same rows, another inner size: ffn_down, 576 x 1536, for o_proj's 576 x 576; session 87)
    monkeypatch.setattr(gb, "gguf_tensors_of",
                        lambda name, tensors: ["blk.0.ffn_down.weight"] if "/o_proj/" in name else None)
    with pytest.raises(ExportError, match=r"o_proj/MatMul\S*: the GGUF's blk.0.ffn_down.weight is 576 x 1536, the "
                                          r"graph's weights 576 x 576"):
        gb.apply_to_graph(work / "model.onnx", SMOL_GGUF, "llama", 9, 3)
    monkeypatch.setattr(gb, "gguf_tensors_of", lambda name, tensors: None)
    with pytest.raises(ExportError, match="no MatMulNBits the GGUF's tensors map to"):
        gb.apply_to_graph(work / "model.onnx", SMOL_GGUF, "llama", 9, 3)
    assert (work / "model.onnx").read_bytes() == before


@pytest.mark.parametrize("name,args,says", [("m.gguf", [], True), ("M.GGUF", [], True),  # (session 85: any case)
                                            ("m.gguf", ["--quant-algo", "k_quant"], True),
                                            ("m.gguf", ["--quant-algo", "gguf"], False),
                                            ("m.gguf", ["--target-precision", "fp32"], False),
                                            ("m.gguf", ["--device", "cuda"], False)])
def test_a_gguf_rounded_again_says_that_its_blocks_could_be_kept(name, args, says, tmp_path, export_calls):
    """A .gguf target exported int4 by RTN (or k_quant) for the cpu layout: once the bundle is written, a note
    says the file's own blocks could be kept (--quant-algo gguf), on stderr, the bundle's path still the last line
    of stdout; not for gguf itself, other precisions or the cuda layout. (The export is stubbed: the CLI's
    path to it is what is tested.)"""
    fake = tmp_path / name
    fake.write_bytes(b"GGUF")
    r, _ = export_calls(*args, target=fake)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip().splitlines()[-1] == str(tmp_path / "b")
    assert ("--quant-algo gguf --exact-kernels keeps the file's own 4-bit blocks" in r.stderr) is says, r.stderr
    if says:  # (the rounding it names: the one asked for, at the block size asked for)
        algo = args[1] if args else "rtn"
        assert f"note: the GGUF's weights were dequantized and rounded again ({algo}, block 32)" in r.stderr


class _ReaderTensor:
    """A ``gguf.GGUFReader`` tensor as tensor_quant reads it: ``shape`` [K, N] (the inner dimension first),
    ``tensor_type``, the raw ``data``."""

    def __init__(self, kind: str, N: int, K: int, raw: np.ndarray):
        from gguf.constants import GGMLQuantizationType

        self.shape, self.tensor_type, self.data = [K, N], GGMLQuantizationType[kind], raw


@pytest.mark.parametrize("kind,per_block,kept", [("Q4_0", 32, True), ("Q4_1", 32, True), ("Q4_K", 256, True),
                                                  ("Q6_K", 256, False)])
def test_tensor_quant_keeps_the_4bit_types_and_rounds_q6k_to_4bit_blocks_with_minimums(kind, per_block, kept):
    """tensor_quant (session 87, from the mutation test: docs/bench/mutation_s87.md): a Q4_0, Q4_1 or Q4_K tensor
    keeps its own blocks, the file's weights exactly; a Q6_K tensor (6-bit integers, 16 to a block, an offset) is
    rounded to 4-bit blocks of 32 with a minimum (Q4_K's, K a multiple of 256), which the MatMulNBits arrays need:
    never passed on as 6-bit integers."""
    from gguf.quants import dequantize

    from edgespec_export import gguf_blocks as gb

    N, K = 8, 512
    raw = _blocks(kind, N * K // per_block, seed=11)
    want = dequantize(raw, _ReaderTensor(kind, N, K, raw).tensor_type).reshape(N, K).astype(np.float32)
    kq = gb.tensor_quant(_ReaderTensor(kind, N, K, raw.reshape(-1)))
    assert kq.shape == (N, K) and kq.bits == 4 and kq.block == 32 and kq.minimum is not None and kq.q.max() <= 15
    assert (kq.kind in gb.KEPT) == kept and kq.kind == (kind if kept else "k4"), kq.kind
    got = kq.dequantize()
    if kept:
        assert np.array_equal(got, want)
    else:  # (4 bits against 6: within the rounding of 4-bit blocks)
        assert 0 < np.linalg.norm(got - want) / np.linalg.norm(want) < 0.12
    b, s, z = gb.matmulnbits_arrays(kq)
    assert b.shape == (N, K // 32, 16) and s.shape == z.shape == (N * K // 32,)


def test_six_bit_bytes_are_llamacpps_not_the_multiples_of_the_rounded_d():
    """six_bit_bytes gives each of a super-block's 8 scales the byte ``nearest_int(63 / max * v)`` as
    quantize_row_q4_K_ref does (the transcription above), not ``rint(v / d)`` with d's float16 rounding, which
    differs for some values (planted here: thousands of super-blocks, some of which differ)."""
    from edgespec_export import gguf_blocks as gb

    f = np.float32
    v = (np.random.default_rng(4).random((4000, 8)) * 0.01).astype(f)
    d, byte = gb.six_bit_bytes(v)
    for i in range(0, len(v), 37):  # (the C code's statements, a super-block at a time)
        top = max([f(0)] + list(v[i]))
        inv = f(63) / top if top > 0 else f(0)
        assert d[i] == f(np.float16(top / f(63)))
        assert list(byte[i]) == [min(int(np.rint(inv * x)), 63) for x in v[i]], i
    inv = f(63) / v.max(-1)
    assert np.array_equal(byte, np.minimum(np.rint(inv[:, None] * v), 63))
    assert (np.rint(v / d[:, None]) != byte).any()  # (the two codes differ: the test tells them apart)
    d0, b0 = gb.six_bit_bytes(np.zeros((1, 8), f))
    assert d0[0] == 0 and not b0.any()


@pytest.mark.parametrize("fails", ["no library", "no function"])
def test_k4_blocks_fit_in_numpy_when_the_quantizer_does_not_load(fails, monkeypatch, tmp_path):
    """As without a compiler (above): where the built file is no library (ctypes' OSError) or a library without the
    function (AttributeError), native_q4k is None and k4_blocks fits in numpy, never a traceback."""
    import ctypes.util

    from edgespec_export import gguf_blocks as gb

    not_a_library = tmp_path / "libedgespec_kquant.so"
    not_a_library.write_bytes(b"not an ELF file")

    def build(*a, **k):
        return not_a_library if fails == "no library" else ctypes.util.find_library("m") or "libm.so.6"

    monkeypatch.setattr(gb, "_native", [])
    monkeypatch.setattr("edgespec.native._build", build)
    assert gb.native_q4k() is None
    w = _k4_rows()
    kq, kn = gb.k4_blocks(w), gb.k4_blocks(w, native=False)
    assert all(np.array_equal(getattr(kq, f), getattr(kn, f)) for f in ("q", "scale", "minimum"))


def test_k4_blocks_numpy_path_writes_llamacpps_scale_bytes():
    """k4_blocks in numpy (``fit=False``: each block's own range, no native fit) codes each super-block's 8 scales and
    minimums with six_bit_bytes, llama.cpp's ``nearest_int(63 / max * v)`` under a float16 ``d``: the scales and
    minimums it writes are ``d * byte`` of those, on rows where ``rint(v / d)`` would give other bytes."""
    from edgespec_export import gguf_blocks as gb

    f = np.float32
    w = (np.random.default_rng(21).normal(size=(256, 256)) * 0.02).astype(f)
    kq = gb.k4_blocks(w, fit=False)
    b = w.reshape(256, 8, 32)
    lo = np.minimum(b.min(-1), 0)
    differ = 0
    for got, v in ((kq.scale, ((b.max(-1) - lo) / f(15)).astype(f)), (kq.minimum, (-lo).astype(f))):
        top = v.max(-1)
        d = (top / f(63)).astype(np.float16).astype(f)
        byte = np.minimum(np.rint((f(63) / top)[:, None] * v), 63)
        assert np.array_equal(got, d[:, None] * byte)
        differ += int((np.rint(v / d[:, None]) != byte).sum())
    assert differ > 0  # (the other code would have written other scales here)


def test_four_bit_blocks_choose_q4k_by_the_inner_size():
    """four_bit_blocks rounds a matrix as Q4_K (k4_blocks) where its inner size K (the blocks' axis) is a multiple
    of 256, else as min-max blocks of 32, whatever the number of rows N."""
    from edgespec_export import gguf_blocks as gb

    rng = np.random.default_rng(2)
    for (N, K), kind in (((8, 512), "k4"), ((256, 96), "min-max"), ((96, 256), "k4"), ((512, 288), "min-max")):
        kq = gb.four_bit_blocks(rng.normal(size=(N, K)).astype(np.float32))
        assert kq.kind == kind and kq.shape == (N, K) and kq.scale.shape == (N, K // 32), (N, K, kq.kind)
