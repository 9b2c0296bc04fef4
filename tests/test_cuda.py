"""The CUDA execution provider: device-resident KV cache, exactness on the GPU, agreement with the CPU.

Skipped (with the reason shown by ``pytest -rs``) where onnxruntime has no CUDA provider or no GPU
answers: CI and the development machine have none. ``scripts/gpu_check.sh`` runs this file on a
GPU machine with onnxruntime-gpu installed.
"""
from __future__ import annotations

import numpy as np
import pytest

import edgespec
from edgespec.manifest import load_manifest
from edgespec.onnx_lm import OnnxLM
from edgespec.providers import CUDA, available_providers, choose


def _cuda_runs() -> str | None:
    """None when a CUDA session can run here, else why not."""
    if CUDA not in available_providers():
        return "onnxruntime has no CUDAExecutionProvider here (install onnxruntime-gpu on a GPU machine)"
    try:
        import onnxruntime as ort

        ort.OrtValue.ortvalue_from_shape_and_type((1,), np.float32, "cuda", 0)
    except Exception as e:  # no device, or CUDA/cuDNN libraries missing
        return f"CUDAExecutionProvider is built in but cannot run: {str(e).splitlines()[0][:120]}"
    return None


WHY = _cuda_runs()
pytestmark = pytest.mark.skipif(WHY is not None, reason=WHY or "")

PROMPTS = ["def fibonacci(n):", "The capital of France is", "Summarize: the meeting moved to Tuesday. Tuesday at ten."]


def test_kv_cache_lives_on_the_gpu(tiny_bundle):
    eng = edgespec.load(tiny_bundle, provider="cuda", max_context=128)
    for lm in (eng.decoder.target, eng.decoder.drafters["model"].lm):
        assert lm.device == "cuda" and CUDA in lm.session.get_providers()[0]
        assert {buf.device_name().lower() for _, _, buf in lm.cache.buffers} == {"cuda"}
    r = eng.generate(PROMPTS[0], max_new_tokens=8, drafter="none")
    assert len(r.token_ids) > 0


@pytest.mark.parametrize("bundle", ["tiny_bundle", "tiny_int4_bundle"])
def test_speculative_greedy_is_exact_on_the_gpu(bundle, request):
    """Lossless on CUDA too, INT4 included: whatever width-dependent arithmetic CUDA's MatMulNBits
    kernels have, the width policy (OnnxLM.min_width) must keep every drafter equal to plain greedy."""
    eng = edgespec.load(request.getfixturevalue(bundle), provider="cuda", max_context=256)
    for prompt in PROMPTS:
        ref = None
        for d in ("none", "prompt-lookup", "model", "auto"):
            for k in ((None, 1, 4) if d != "none" else (None,)):
                eng.reset()
                toks = eng.generate(prompt, max_new_tokens=24, drafter=d, draft_tokens=k).token_ids
                ref = toks if ref is None else ref
                assert toks == ref, f"{d} k={k} differs from greedy on CUDA for {prompt!r}"


def test_call_width_policy_holds_on_the_gpu(tiny_int4_bundle):
    """The premise of the width policy, measured on CUDA: with the policy's minimum width, the rows
    of calls of every width are bitwise equal."""
    m = load_manifest(tiny_int4_bundle)
    lm = OnnxLM(m.target, 128, choose(["cuda"], explicit=True))
    ids = list(range(10, 60))
    lm.forward(ids[:30])
    rows = {}
    for w in sorted({lm.min_width, 2, 3, 5, 9}):
        lm.rewind(lm.length - 30)
        rows[w] = lm.forward(ids[30:30 + w])[0]
    first = rows[min(rows)]
    for w, r in rows.items():
        assert np.array_equal(r, first), f"width {w} computes position 30 differently (min_width {lm.min_width})"


def test_gpu_greedy_equals_cpu_greedy_on_smollm2(smol_fp32):
    """The CPU and the GPU agree on SmolLM2's greedy continuation (float32 graph)."""
    out = {}
    for provider in ("cpu", "cuda"):
        eng = edgespec.load(smol_fp32, provider=provider, max_context=512)
        out[provider] = [eng.generate(p, max_new_tokens=32, drafter="none").token_ids for p in PROMPTS]
    assert out["cuda"] == out["cpu"]
