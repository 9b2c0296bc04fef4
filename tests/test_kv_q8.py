"""int8 KV caches (`exact-kernels --kv-dtype int8`, edgespec.DecodeAttentionQ8): a cache row is a head's D lanes as int8
numbers and a float32 scale per 32 lanes (0.5625x float16's bytes). The op against numpy's quantization
(``edgespec.kv.q8_quantize``) and a float64 attention over the rows' values, every row the same at every call width
and on every kernel path; bundles whose greedy speculative decoding equals their plain decoding; the refusals."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_native import (_attention_graph, _attention_inputs, _attention_reference, _on_path,  # noqa: E402
                         _rows_are_one_row_calls, _session)

from edgespec.kv import q8_dequantize, q8_quantize  # noqa: E402


def _tables(H, KVH, D, L, P, **kw):
    from onnx import numpy_helper

    return [numpy_helper.to_array(x) for x in _attention_graph("DecodeAttention", H, KVH, D, L, P, **kw).graph.initializer]


def _feeds(q, at, k, v, pos=None):
    f = {"qkv": q, "pk": k.copy(), "pv": v.copy(), "seqlens": np.array([at + q.shape[1] - 1], np.int32)}
    if pos is not None:
        f["pos"] = np.asarray(pos, np.int64)
    return f


def test_numpys_quantization_rounds_ties_to_even_and_keeps_groups_apart():
    """The reference itself: per 32 lanes max |x| / 127, x / s rounded half to even, a group of zeros scale 0, an
    infinity or NaN making its group's scale NaN and numbers 0, the other groups untouched; dequantized, every
    finite lane within half a step of its value."""
    x = np.zeros((2, 64), np.float32)
    x[0, :32] = np.linspace(-3, 5, 32)
    x[0, 31] = 127  # (the scale 1: x / s exact)
    x[0, 1:6] = [0.5, 1.5, 2.5, -0.5, -3.5]  # ties: to even
    x[1, 3] = np.inf
    x[1, 32:] = np.arange(32) - 16
    r = q8_quantize(x)
    assert r.dtype == np.int8 and r.shape == (2, 72)
    s = r[..., 64:].copy().view("<f4")
    assert s[0, 0] == 1 and s[0, 1] == 0 and np.isnan(s[1, 0])
    assert s[1, 1] == np.float32(16) / np.float32(127)
    assert list(r[0, :6]) == [-3, 0, 2, 2, 0, -4] and r[0, 31] == 127 and r[1, 32] == -127
    assert not r[0, 32:64].any() and not r[1, :32].any()
    back = q8_dequantize(r, 64)
    ok = np.isfinite(s).repeat(32, axis=-1)
    assert np.abs(back[ok] - x[ok]).max() <= (s[np.isfinite(s)].max() / 2) * 1.0001
    assert np.isnan(back[1, :32]).all()


@pytest.mark.parametrize("isa", ["this-cpu", "avx2", "portable"])
@pytest.mark.parametrize("H,KVH,D", [(12, 2, 128), (14, 2, 64), (4, 4, 32), (8, 2, 96)])
def test_q8_stores_numpys_rows_and_attends_their_values_alike_at_every_width(H, KVH, D, isa, monkeypatch):
    """edgespec.DecodeAttentionQ8: each new key (rotated as the float32 op rotates it) and value is stored as
    numpy's quantization of it, bit for bit; the rows before the call are left as they were; the outputs are
    attention over the values the rows stand for (a float64 reference) and near the float32 op's; each query row is
    bitwise the same in calls of 1..9 tokens and whatever the call's first position."""
    L, P, past = 64, 80, 21
    cache_k, cache_v, qkv = _attention_inputs(H, KVH, D, L, past, 9, seed=4)
    k8, v8 = q8_quantize(cache_k), q8_quantize(cache_v)
    q8 = _on_path(isa, monkeypatch, lambda: _session(_attention_graph("DecodeAttentionQ8", H, KVH, D, L, P)))
    f32 = _on_path(isa, monkeypatch, lambda: _session(_attention_graph("DecodeAttention", H, KVH, D, L, P)))
    full = q8.run(None, _feeds(qkv, past, k8, v8))
    ref32 = f32.run(None, _feeds(qkv, past, cache_k, cache_v))
    t = past + 9
    assert full[1].dtype == np.int8 and full[1].shape == (1, KVH, L, D + D // 8) and full[0].dtype == np.float32
    assert np.array_equal(full[1][:, :, :past], k8[:, :, :past]) and np.array_equal(full[2][:, :, :past], v8[:, :, :past])
    assert np.array_equal(full[1][:, :, past:t], q8_quantize(ref32[1][:, :, past:t]))
    assert np.array_equal(full[2][:, :, past:t], q8_quantize(ref32[2][:, :, past:t]))
    cos, sin = _tables(H, KVH, D, L, P)
    want = _attention_reference(qkv, full[1], full[2], cos, sin, H, KVH, D, past)
    assert np.abs(full[0][0] - want).max() < 2e-4 * max(1.0, np.abs(want).max())
    # against float32 caches: the rows' rounding apart (a step of max / 127 a lane)
    assert np.abs(full[0] - ref32[0]).max() < 3e-2 * max(1.0, np.abs(ref32[0]).max())
    for n in range(1, 9):
        assert np.array_equal(q8.run(None, _feeds(qkv[:, :n], past, k8, v8))[0], full[0][:, :n]), n
    head = q8.run(None, _feeds(qkv[:, :4], past, k8, v8))
    k2, v2 = k8.copy(), v8.copy()
    k2[:, :, past:past + 4], v2[:, :, past:past + 4] = head[1][:, :, past:past + 4], head[2][:, :, past:past + 4]
    assert np.array_equal(q8.run(None, _feeds(qkv[:, 4:], past + 4, k2, v2))[0], full[0][:, 4:])


@pytest.mark.parametrize("isa", ["this-cpu", "avx2", "portable"])
@pytest.mark.parametrize("H,KVH,D,past,window,softcap", [(12, 2, 128, 21, -1, 0.0), (6, 2, 64, 130, 16, 30.0),
                                                         (4, 1, 256, 62, -1, 0.0)])
def test_q8_alternates_and_windows_compute_the_bits_of_one_token_calls(H, KVH, D, past, window, softcap, isa,
                                                                      monkeypatch):
    """With the rows' positions (alternates beside the causal rows) and a sliding window with a score cap: each
    alternate's output and stored row are a one-token call's at its position, the causal rows' as without
    alternates, and every row of a call bitwise a one-row call's."""
    L, P = 160, 180
    cache_k, cache_v, qkv = _attention_inputs(H, KVH, D, L, past, 8, seed=6)
    k8, v8 = q8_quantize(cache_k), q8_quantize(cache_v)
    kw = dict(window=window, softcap=softcap)
    plain = _on_path(isa, monkeypatch, lambda: _session(_attention_graph("DecodeAttentionQ8", H, KVH, D, L, P, **kw)))
    posd = _on_path(isa, monkeypatch,
                    lambda: _session(_attention_graph("DecodeAttentionQ8", H, KVH, D, L, P, positions=True, **kw)))
    chain = plain.run(None, _feeds(qkv[:, :5], past, k8, v8))
    rel = [0, 1, 2, 3, 4, 1, 3, 4]
    got = posd.run(None, _feeds(qkv, past, k8, v8, rel))
    t = past + 5
    assert np.array_equal(got[0][:, :5], chain[0])
    assert np.array_equal(got[1][:, :, :t], chain[1][:, :, :t]) and np.array_equal(got[2][:, :, :t], chain[2][:, :, :t])
    for i in range(5, 8):
        p = rel[i]
        one = plain.run(None, _feeds(qkv[:, i:i + 1], past + p, chain[1], chain[2]))
        assert np.array_equal(got[0][:, i], one[0][:, 0]), i
        assert np.array_equal(got[1][:, :, past + i], one[1][:, :, past + p]), i
        assert np.array_equal(got[2][:, :, past + i], one[2][:, :, past + p]), i

    def run(q, at, k=k8, v=v8):
        return plain.run(None, _feeds(q, at, k, v))

    _rows_are_one_row_calls(run, qkv, past, run(qkv, past))


@pytest.mark.parametrize("H,KVH,D,window,softcap,rot,interleaved",
                         [(12, 2, 128, -1, 0.0, None, 0), (6, 2, 64, 16, 30.0, None, 0), (4, 2, 96, 1, 0.0, 16, 0),
                          (8, 4, 32, 50, 5.0, 8, 1)])
def test_the_portable_path_computes_the_avx2_paths_q8_bits(H, KVH, D, window, softcap, rot, interleaved, monkeypatch):
    """The portable path (aarch64's) gives the AVX2 path's outputs and stored rows bit for bit over int8 caches:
    calls of 1-9 rows from several first positions, windows, score caps, partial and interleaved rotaries,
    alternates."""
    L, P = 160, 180
    cache_k, cache_v, qkv = _attention_inputs(H, KVH, D, L, 140, 9, seed=12)
    k8, v8 = q8_quantize(cache_k), q8_quantize(cache_v)
    kw = dict(window=window, softcap=softcap, rot=rot, interleaved=interleaved)
    runs = {}
    for path in ("avx2", "portable"):
        plain = _on_path(path, monkeypatch, lambda: _session(_attention_graph("DecodeAttentionQ8", H, KVH, D, L, P, **kw)))
        posd = _on_path(path, monkeypatch,
                        lambda: _session(_attention_graph("DecodeAttentionQ8", H, KVH, D, L, P, positions=True, **kw)))
        out = []
        for past in (0, 7, 63, 64, 130):
            for n in (1, 2, 5, 9):
                o = plain.run(None, _feeds(qkv[:, :n], past, k8, v8))
                out += [o[0], o[1][:, :, :past + n], o[2][:, :, :past + n]]
        o = posd.run(None, _feeds(qkv[:, :8], 40, k8, v8, [0, 1, 2, 3, 4, 1, 3, 4]))
        out += [o[0], o[1][:, :, :48], o[2][:, :, :48]]
        runs[path] = out
    for i, (a, b) in enumerate(zip(runs["avx2"], runs["portable"])):
        assert a.shape == b.shape and np.array_equal(a, b, equal_nan=True), i


@pytest.mark.parametrize("isa", ["this-cpu", "avx2", "portable"])
def test_q8_stores_extreme_and_non_finite_values_as_numpy_does(isa, monkeypatch):
    """Values of every magnitude (1e-30 .. 1e30, zeros, exact ties) and non-finite ones written through the op are
    numpy's rows bit for bit on every path; a group with an infinity or NaN reads as NaN, its neighbours as they
    were; a call over rows of huge values stays finite."""
    H = KVH = 4
    D, L = 64, 32
    rng = np.random.default_rng(13)
    vals = (np.ldexp(1.0 + rng.random(L * KVH * D), rng.integers(-100, 100, L * KVH * D))
            * rng.choice([-1.0, 1.0], L * KVH * D)).astype(np.float32)
    vals[: 32 * 4] = 0.0  # whole groups of zeros
    vals[200:232] = np.arange(32, dtype=np.float32) * 0.5 - 8  # scale 8/127: x / s of exact halves nearby
    vals[-64:-32] = 1.0
    vals[-60] = np.nan
    vals[-31] = np.inf
    qkv = np.zeros((1, L, (H + 2 * KVH) * D), np.float32)
    qkv[0, :, (H + KVH) * D:] = vals.reshape(L, KVH * D)  # the values (no rotary on them)
    s = _on_path(isa, monkeypatch, lambda: _session(_attention_graph("DecodeAttentionQ8", H, KVH, D, L, L)))
    k = np.zeros((1, KVH, L, D + D // 8), np.int8)
    out, _, pv = s.run(None, _feeds(qkv, 0, k, k))
    stored = pv[0].transpose(1, 0, 2)  # [L, KVH, D + D / 8] as the values were laid out
    assert np.array_equal(stored, q8_quantize(vals.reshape(L, KVH, D)))
    back = q8_dequantize(stored, D).reshape(-1)
    assert np.isnan(back[-64:]).all() and np.isfinite(back[:-64]).all()
    assert np.isfinite(out[0, :L - 1]).all()  # (the last row reads the NaN groups)


@pytest.mark.parametrize("isa", ["this-cpu", "avx2", "portable"])
def test_q8_store_rounds_exact_ties_to_even_and_divides_by_the_scale(isa, monkeypatch):
    """(session 62, a review) Random values almost never land on a tie: groups whose scale is exactly 1 (max |x|
    127) make every x / s an exact tie, rounded half to even as numpy's rint (half away from zero gives other
    numbers), and groups where x / s and x * (1 / s) round apart (found by a seeded search) tell a division from a
    multiplication by the inverse (llama.cpp's form): numpy's rows bit for bit, on every path."""
    H = KVH = 1
    D, L = 64, 4
    ties = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 3.5, 126.5, -125.5] * 4, np.float32)
    ties[-1] = 127.0
    rng, apart = np.random.default_rng(5), []
    while len(apart) < L:
        g = rng.standard_normal((200_000, 32)).astype(np.float32)
        s = (np.abs(g).max(-1) / np.float32(127)).astype(np.float32)
        apart += list(g[(np.rint(g / s[:, None]) != np.rint(g * (np.float32(1) / s)[:, None])).any(-1)])
    vals = np.zeros((L, KVH, D), np.float32)
    vals[:, 0, :32] = ties
    vals[:, 0, 32:] = np.stack(apart[:L])
    qkv = np.zeros((1, L, (H + 2 * KVH) * D), np.float32)
    qkv[0, :, (H + KVH) * D:] = vals.reshape(L, KVH * D)  # the values (no rotary on them)
    sess = _on_path(isa, monkeypatch, lambda: _session(_attention_graph("DecodeAttentionQ8", H, KVH, D, L, L)))
    k = np.zeros((1, KVH, L, D + D // 8), np.int8)
    pv = sess.run(None, _feeds(qkv, 0, k, k))[2]
    want = q8_quantize(vals)
    assert list(want[0, 0, :8]) == [0, 2, 2, 0, -2, 4, 126, -126]
    assert np.array_equal(pv[0].transpose(1, 0, 2), want)


def test_q8_refuses_a_head_size_or_cache_rows_it_cannot_hold():
    """A head size that is no multiple of 32, or caches whose rows are not D + D / 8 bytes: one error naming the
    op, before anything is read or written."""
    H, KVH, L = 4, 2, 16
    for D, width in ((48, 54), (48, 52), (32, 32), (32, 40)):  # ((48, 52): rows of D + D / 32 x 4 bytes, session 90)
        g = _attention_graph("DecodeAttentionQ8", H, KVH, D, L, 20)
        for v in list(g.graph.input[1:3]) + list(g.graph.output[1:3]):
            v.type.tensor_type.shape.dim[3].dim_value = width
        feeds = {"qkv": np.zeros((1, 1, (H + 2 * KVH) * D), np.float32), "pk": np.zeros((1, KVH, L, width), np.int8),
                 "pv": np.zeros((1, KVH, L, width), np.int8), "seqlens": np.array([0], np.int32)}
        with pytest.raises(Exception, match="edgespec.DecodeAttentionQ8: the head size must be a multiple of 32"):
            _session(g).run(None, feeds)


# ---- bundles ----

@pytest.fixture(scope="module")
def head32(tmp_path_factory):
    """A tiny qwen2 target and its perturbed drafter with heads of 32 lanes (int8 rows need a multiple of 32),
    exported INT4, then rewritten by exact-kernels with int8 and with float16 caches."""
    from tiny import make_model, make_tokenizer

    from edgespec_export import export_bundle
    from edgespec_export.kernels import apply_to_bundle

    root = tmp_path_factory.mktemp("q8")
    tok = make_tokenizer()
    t = make_model(root / "t", "qwen2", seed=1, tokenizer=tok, hidden=128, heads=4, kv_heads=2, max_pos=512)
    d = make_model(root / "d", "qwen2", seed=3, tokenizer=tok, hidden=128, heads=4, kv_heads=2, max_pos=512,
                   perturb_from=t, noise=0.25)
    b = export_bundle(str(t), root / "b", quality=False, drafter=str(d), target_precision="int4",
                      drafter_precision="int4")
    logs: list[str] = []
    q8 = apply_to_bundle(b, root / "b-q8", log=logs.append, kv_dtype="int8")
    f16 = apply_to_bundle(b, root / "b-f16", log=lambda _: None)
    return {"source": b, "q8": q8, "f16": f16, "logs": logs, "target": t, "tok": tok}


PROMPT = "def fizzbuzz(n):\n    for i in range(1, n + 1):\n        if i % 15 == 0:\n            print('FizzBuzz')\n"


def test_an_int8_bundle_decodes_speculatively_as_it_decodes_plainly(head32):
    """exact-kernels --kv-dtype int8: both models' attention DecodeAttentionQ8 over int8 buffers of D + D / 8
    bytes a row (the manifest, the log, the buffers the runtime makes); greedy prompt lookup, the model drafter
    and auto give plain decoding's tokens; sampled with a seed, every drafter gives one reply again."""
    import edgespec

    assert any("4 KV caches int8" in line for line in head32["logs"]), head32["logs"]
    m = json.loads((head32["q8"] / "edgespec.json").read_text())["models"]
    f16 = json.loads((head32["f16"] / "edgespec.json").read_text())["models"]
    for role in ("target", "drafter"):
        assert m[role]["kv_dtype"] == "int8" and m[role]["operators"]["DecodeAttentionQ8"] == 2, role
        assert "DecodeAttentionF16" not in m[role]["operators"]
        # (session 77) the kernel features are the float16 rewrite's: the int8 rows' width read back as their head
        # size (export/kernels.py, kv_row_head) must not change what the graph is said to need
        assert m[role].get("kernel_features", []) == f16[role].get("kernel_features", []), role
    eng = edgespec.load(head32["q8"], memory=False)
    spec = eng.manifest.target
    assert spec.kv_bytes_per_token == 2 * 2 * 2 * (32 + 4)  # layers x (key, value) x kv heads x a row's bytes
    f16 = edgespec.load(head32["f16"], memory=False)
    assert f16.manifest.target.kv_bytes_per_token == 2 * 2 * 2 * 32 * 2
    bufs = eng.decoder.target.cache.host
    assert bufs and all(b.dtype == np.int8 and b.shape[-1] == 36 for b in bufs)
    ar = eng.generate(PROMPT, max_new_tokens=64, drafter="none", ignore_eos=True)
    assert len(ar.token_ids) == 64
    for drafter in ("prompt-lookup", "model", "auto"):
        assert eng.generate(PROMPT, max_new_tokens=64, drafter=drafter, ignore_eos=True).token_ids == ar.token_ids
    # against float16 caches: another cache, mostly the same tokens (random tiny weights: no quality claim)
    other = f16.generate(PROMPT, max_new_tokens=64, drafter="none", ignore_eos=True).token_ids
    assert sum(a == b for a, b in zip(other, ar.token_ids)) >= 16
    kw = dict(max_new_tokens=32, temperature=0.8, seed=7, ignore_eos=True)
    first = eng.generate(PROMPT, drafter="model", **kw).token_ids
    assert eng.generate(PROMPT, drafter="model", **kw).token_ids == first


def test_an_int8_bundle_keeps_its_prompt_cache_and_plans_its_rows(head32, tmp_path):
    """Conversations set aside and restored (the prompt cache's copies of int8 rows, in memory and through its
    file) reply as an uninterrupted chat; the plan counts 36 bytes a row where float16 takes 64."""
    import edgespec
    from edgespec.planner import plan

    def chat(*turns):
        return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]

    kw = dict(max_new_tokens=10, temperature=0.0, drafter="auto")
    ref = edgespec.load(head32["q8"], prompt_cache_mb=0, memory=False)
    a1 = ref.generate(chat("alpha beta gamma delta " * 4), **kw)
    follow = chat("alpha beta gamma delta " * 4, a1.text, "and then?")
    want = ref.generate(follow, **kw)
    f = tmp_path / "pc.npz"
    with edgespec.load(head32["q8"], prompt_cache_mb=16, prompt_cache_file=f, memory=False) as eng:
        eng.generate(chat("alpha beta gamma delta " * 4), **kw)
        eng.generate(chat("one two three four five " * 4), **kw)
        got = eng.generate(follow, **kw)
        assert got.stats["restored_prompt_tokens"] > 0 and got.token_ids == want.token_ids
    with edgespec.load(head32["q8"], prompt_cache_mb=16, prompt_cache_file=f, memory=False) as eng:
        again = eng.generate(follow, **kw)
        assert again.stats["restored_prompt_tokens"] > 0 and again.token_ids == want.token_ids
    from edgespec.manifest import load_manifest
    from edgespec.profiles import resolve_profile

    plans = {k: plan(load_manifest(head32[k]), resolve_profile(None), max_context=400) for k in ("q8", "f16")}
    kv = {k: p.kv for k, p in plans.items()}
    assert plans["q8"].context == plans["f16"].context == 400
    assert kv["q8"]["target"] * 64 == kv["f16"]["target"] * 36 > 0, kv


def test_the_plan_says_how_much_more_context_int8_caches_would_hold(head32, tmp_path):
    """Where the budget cuts the context of a bundle with float16 caches, the plan's warning says how many tokens
    int8 caches would hold (the planner's own figure for the bundle with int8 caches); none where the caches are int8
    already, where nothing is cut, or on a GPU provider (edgespec's attention is the CPU's)."""
    import shutil

    from edgespec.manifest import load_manifest
    from edgespec.planner import plan
    from edgespec.profiles import load_profile

    def wide(key):  # (a context of 400,000 tokens: KV caches the size of the budget's margin)
        b = tmp_path / key
        shutil.copytree(head32[key], b)
        doc = json.loads((b / "edgespec.json").read_text())
        for role in ("target", "drafter"):
            doc["models"][role]["max_context"] = 400_000
        (b / "edgespec.json").write_text(json.dumps(doc))
        return load_manifest(b)

    prof = tmp_path / "p.toml"
    prof.write_text("memory_budget_mb = 400\nmax_context = 400000\nprompt_cache_mb = 0\n")
    profile = load_profile(prof)
    f16, q8 = wide("f16"), wide("q8")
    p = plan(f16, profile)
    assert p.context < 400_000 and any(c.startswith("context ") for c in p.cuts)
    hint = [w for w in p.warnings if "int8 KV caches would hold" in w]
    assert len(hint) == 1, p.warnings
    said = int(hint[0].split("would hold about ")[1].split()[0])
    assert said > p.context * 1.1, (said, p.context)  # (0.5625x the KV bytes a token; the suffix indexes stay)
    assert abs(said - plan(q8, profile).context) <= 0.02 * said  # (the int8 bundle's own plan: its measured weights)
    assert not [w for w in plan(q8, profile).warnings if "int8" in w]
    assert not [w for w in plan(f16, profile, max_context=1000).warnings if "int8" in w]
    prof.write_text("memory_budget_mb = 1700\nmax_context = 400000\nprompt_cache_mb = 0\n")
    gpu = plan(f16, load_profile(prof), providers=["cuda"])  # (the CUDA runtime's allowance in the budget)
    assert gpu.gpu and any(c.startswith("context ") for c in gpu.cuts), gpu.cuts
    assert not [w for w in gpu.warnings if "int8" in w]


def test_int8_caches_are_refused_where_they_cannot_be(head32, tiny_int4_bundle, tmp_path):
    """A head size that is no multiple of 32 (the tiny target's 16), onnxruntime's attention, a manifest that says
    int8 on the cuda layout or with such heads: one-line errors; nothing is written."""
    from edgespec.errors import ExportError, ManifestError
    from edgespec.manifest import load_manifest
    from edgespec_export.kernels import apply_to_bundle

    with pytest.raises(ExportError, match="no int8 KV cache: .*not a multiple of 32.*--kv-dtype float16"):
        apply_to_bundle(tiny_int4_bundle, tmp_path / "x", kv_dtype="int8")
    assert not (tmp_path / "x").exists()
    with pytest.raises(ExportError, match="an int8 KV cache needs edgespec's attention"):
        apply_to_bundle(head32["source"], tmp_path / "y", kv_dtype="int8", own_attention=False)
    assert not (tmp_path / "y").exists()
    import shutil

    b = tmp_path / "m"
    shutil.copytree(head32["q8"], b)
    doc = json.loads((b / "edgespec.json").read_text())
    for change, says in (({"layout": "cuda"}, "layout cuda"), ({"head_dim": 16}, "head sizes \\[16\\]")):
        bad = json.loads(json.dumps(doc))
        bad["models"]["target"].update(change)
        (b / "edgespec.json").write_text(json.dumps(bad))
        with pytest.raises(ManifestError, match=f"kv_dtype int8 needs the cpu layout .*{says}"):
            load_manifest(b)


def test_a_drafter_whose_heads_cannot_be_int8_keeps_float16_caches(head32, tmp_path):
    """An int8 target with a drafter of 16-lane heads (the same tokenizer): the drafter's caches stay float16, the
    log says why, and greedy speculative decoding with it equals plain decoding. ``export --exact-kernels --kv-dtype
    int8`` of a target with such heads is refused before the build."""
    from tiny import make_model

    import edgespec
    from edgespec.errors import ExportError
    from edgespec_export import export_bundle
    from edgespec_export.kernels import apply_to_bundle

    small = make_model(tmp_path / "small", "qwen2", seed=3, tokenizer=head32["tok"], hidden=64, heads=4, kv_heads=2,
                       max_pos=512)
    b = export_bundle(str(head32["target"]), tmp_path / "b", quality=False, drafter=str(small),
                      target_precision="int4", drafter_precision="int4")
    logs: list[str] = []
    out = apply_to_bundle(b, tmp_path / "b8", log=logs.append, kv_dtype="int8")
    assert any("head size 16 is not a multiple of 32: its KV caches float16" in line for line in logs), logs
    eng = edgespec.load(out, memory=False)
    assert eng.manifest.target.kv_dtype == "int8" and eng.manifest.drafter.kv_dtype == "float16"
    ar = eng.generate(PROMPT, max_new_tokens=48, drafter="none", ignore_eos=True)
    assert eng.generate(PROMPT, max_new_tokens=48, drafter="model", ignore_eos=True).token_ids == ar.token_ids
    with pytest.raises(ExportError, match="heads of 16 lanes cannot keep int8 KV caches"):
        export_bundle(str(small), tmp_path / "x", quality=False, target_precision="int4", exact_kernels=True,
                      kv_dtype="int8")
    assert not (tmp_path / "x").exists()


def test_the_cli_takes_int8_and_refuses_it_in_one_line(head32, tiny_int4_bundle, tmp_path):
    """`edgespec exact-kernels --kv-dtype int8`: the bundle written; on heads of 16 lanes a non-zero exit and one
    line saying why; a profile asking for int8 is taken."""
    import subprocess

    exe = [sys.executable, "-m", "edgespec"]
    r = subprocess.run(exe + ["exact-kernels", str(head32["source"]), "--output", str(tmp_path / "ok"), "--kv-dtype",
                              "int8"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "ok" / "edgespec.json").read_text())["models"]["target"]["kv_dtype"] == "int8"
    r = subprocess.run(exe + ["exact-kernels", str(tiny_int4_bundle), "--output", str(tmp_path / "no"), "--kv-dtype",
                              "int8"], capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and not (tmp_path / "no").exists()
    err = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("    ")]
    assert len(err) == 1 and "no int8 KV cache" in err[0] and "Traceback" not in r.stderr, r.stderr
    from edgespec.profiles import load_profile

    p = tmp_path / "p.toml"
    p.write_text('memory_budget_mb = 1000\nkv_dtype = "int8"\n')
    assert load_profile(p).kv_dtype == "int8"


# -- kv.py's token records (session 72, a mutation test of edgespec/kv.py) ------------------------------------------

def test_a_token_buffer_grows_by_more_than_its_size_at_once_and_refuses_a_longer_truncate():
    """A TokenBuffer extended by more ids than twice its capacity in one call (a long prompt into a fresh buffer)
    grows to hold them all; truncating past its length is refused (it would have claimed stale ids), and a cache's
    rewind past its length names the rewind."""
    from edgespec.kv import TokenBuffer, TokenCache

    b = TokenBuffer(capacity=4)
    b.extend(range(3))
    b.extend(range(100, 120))  # 23 ids: more than 2 x 4
    assert len(b) == 23 and b.tolist() == [0, 1, 2, *range(100, 120)] and b[-1] == 119
    with pytest.raises(ValueError, match="cannot truncate 23 ids to 24"):
        b.truncate(24)
    b.truncate(2)
    assert b.tolist() == [0, 1] and b.common_prefix([0, 1, 5]) == 2
    c = TokenCache(16)
    c.ids.extend([7, 8, 9])
    with pytest.raises(ValueError, match="cannot rewind 4 of 3 positions"):
        c.rewind(4)
    c.rewind(3)
    assert c.length == 0
