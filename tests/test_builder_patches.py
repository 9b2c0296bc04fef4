"""(session 89) export/builder_shim.py's and builder_gemma4.py's patches where the tiny models of test_archs.py
did not reach them: a NoPE layer before others, and Gemma 4 and OLMo 2 in the cuda layout (its own file: test_archs.py
is the suite's longest, and the README's command hands out whole files to its workers). Mutation-tested
(docs/bench/mutation_s89.md)."""
from __future__ import annotations

import pytest

from conftest import _export
from test_archs import _gemma4, _greedy_exact, _random_norms


@pytest.mark.parametrize("arch, extra", [
    ("exaone4", {"layers": 4, "sliding_window": 8, "sliding_window_pattern": 2}),  # (layers 1 and 3 global, NoPE)
    ("smollm3", {"layers": 4, "no_rope_layers": [1, 0, 1, 1]})], ids=["exaone4", "smollm3"])
def test_a_layer_without_rotary_mid_model_leaves_the_next_layers_rotated(tmp_path_factory, arch, extra):
    """(session 89) The layers after a NoPE layer (EXAONE 4's global ones, SmolLM3's every fourth) are rotated again:
    the builder's rotary is taken off for that layer only. test_archs.py's tiny EXAONE 4 and SmolLM3 have their one
    NoPE layer last, where a rotary never put back shows nothing; here it is the second of four, and the float32 graph is
    torch's (random norms)."""
    from tiny import make_model

    from edgespec.manifest import load_manifest

    d = _random_norms(make_model(tmp_path_factory.mktemp("hf") / f"{arch}-mid", arch, seed=3, **extra))
    f = _export(tmp_path_factory, f"{arch}-mid-fp32", d, target_precision="fp32", max_context=256)
    v = load_manifest(f).target.validation
    assert v.passed and max(v.max_abs_logit_diff.values()) < 1e-3, v


def test_gemma4_e2b_in_the_cuda_layout_is_exact_on_the_cpu_ep(tmp_path_factory):
    """(session 89) A tiny E2B exported in the cuda layout (float16 activations, INT4 weights, export/
    builder_gemma4.py's per-layer blocks between the builder's float32 residual terms), validated against torch and,
    run on the CPU EP, greedy speculative output equal to plain decoding. No test built Gemma 4 in this layout
    before. (No GPU ran it: issue #13.)"""
    from edgespec.manifest import load_manifest

    d = _gemma4(tmp_path_factory.mktemp("hf") / "gemma4-e2b-cuda", "e2b", plain=True)
    b = _export(tmp_path_factory, "gemma4-e2b-cuda", d, target_precision="int4", max_context=256, device="cuda")
    t = load_manifest(b).target
    assert t.layout == "cuda" and t.validation.passed, t.validation
    _greedy_exact(b, 32, ("prompt-lookup",))


def test_olmo2_in_the_cuda_layout_keeps_its_whole_projection_norms(tmp_path_factory):
    """(session 89) OLMo 2 in the cuda layout (float16): the builder fuses per-head query and key norms into
    GroupQueryAttention there, which OLMo 2's norms over the whole projection are not; export/builder_shim.py keeps
    them unfused. Validated against torch (random norm weights) and exact on the CPU EP. (No GPU ran it: #13.)"""
    from tiny import make_model

    from edgespec.manifest import load_manifest

    r = _random_norms(make_model(tmp_path_factory.mktemp("hf") / "olmo2-cuda", "olmo2", seed=9))
    b = _export(tmp_path_factory, "olmo2-cuda", r, target_precision="fp16", max_context=256, device="cuda")
    t = load_manifest(b).target
    assert t.layout == "cuda" and t.validation.passed, t.validation
    _greedy_exact(b, 32, ("prompt-lookup",))
