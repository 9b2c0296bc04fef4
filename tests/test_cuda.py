"""The CUDA execution provider on cuda-layout bundles: device-resident KV cache, no node left on the
CPU, exactness on the GPU, agreement with the CPU, heterogeneous placement, memory against the plan.

Skipped (with the reason shown by ``pytest -rs``) where onnxruntime has no CUDA provider or no GPU
answers: CI and the development machine have none. ``scripts/gpu/run.sh`` runs this file on a GPU
machine with onnxruntime-gpu installed (docs/gpu.md).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import edgespec
from edgespec.cli import main
from edgespec.errors import ProviderError
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
# float16 logits of a model of SmolLM2's scale differ between CUDA's and the CPU EP's kernels by a
# few hundredths: a greedy continuation may part only where the top two are closer than this
NEAR_TIE = 0.25


def test_kv_cache_lives_on_the_gpu(tiny_cuda_bundle):
    """Both models open on CUDA with the CPU fallback refused (edgespec's no-fallback check passes:
    every node but the attention-mask shape subgraph is CUDA's), their KV buffers on the device."""
    eng = edgespec.load(tiny_cuda_bundle, provider="cuda", max_context=128)
    for lm in (eng.decoder.target, eng.decoder.drafters["model"].lm):
        assert lm.device == "cuda" and lm.session.get_providers()[0] == CUDA
        assert {buf.device_name().lower() for _, _, buf in lm.cache.buffers} == {"cuda"}
    r = eng.generate(PROMPTS[0], max_new_tokens=8, drafter="none")
    assert len(r.token_ids) > 0


def test_cpu_layout_is_refused_on_cuda(tiny_bundle):
    with pytest.raises(ProviderError, match="re-export the bundle with --device cuda"):
        edgespec.load(tiny_bundle, provider="cuda", max_context=128)


def greedy_is_exact(eng, prompts, drafters, n=24):
    for prompt in prompts:
        ref = None
        for d in ("none", *drafters):
            for k in ((None, 1, 4) if d != "none" else (None,)):
                eng.reset()
                toks = eng.generate(prompt, max_new_tokens=n, drafter=d, draft_tokens=k).token_ids
                ref = toks if ref is None else ref
                assert toks == ref, f"{d} k={k} differs from greedy on CUDA for {prompt!r}"


def test_speculative_greedy_is_exact_on_the_gpu(tiny_cuda_bundle):
    """Lossless on CUDA, INT4 target and drafter: whatever width-dependent arithmetic CUDA's kernels
    have, the width policy (OnnxLM.min_width, measured at load) keeps every drafter equal to greedy."""
    eng = edgespec.load(tiny_cuda_bundle, provider="cuda", max_context=256)
    greedy_is_exact(eng, PROMPTS, ("prompt-lookup", "model", "auto"))


def test_smollm2_speculative_is_exact_on_the_gpu(smol_cuda):
    eng = edgespec.load(smol_cuda, provider="cuda", max_context=512)
    greedy_is_exact(eng, PROMPTS, ("prompt-lookup", "auto"), n=48)


def test_call_width_policy_holds_on_the_gpu(tiny_cuda_bundle):
    """The premise of the width policy, measured on CUDA: with the policy's minimum width, the rows
    of calls of every width it allows (up to the widest the probe verified, which the decoder keeps
    to) are bitwise equal."""
    m = load_manifest(tiny_cuda_bundle)
    lm = OnnxLM(m.target, 128, choose(["cuda"], explicit=True))
    assert lm.verified_width is not None and lm.verified_width >= 9
    ids = list(range(10, 60))
    lm.forward(ids[:30])
    rows = {}
    for w in range(1, lm.verified_width + 1):
        if w < lm.min_width or w % lm.width_multiple:
            continue
        lm.rewind(lm.length - 30)
        rows[w] = lm.forward(ids[30:30 + w])[0]
    first = rows[min(rows)]
    for w, r in rows.items():
        assert np.array_equal(r, first), f"width {w} computes position 30 differently (min_width {lm.min_width})"


def test_device_argmax_on_the_gpu(tiny_cuda_bundle):
    """A greedy CUDA target reads the graph's argmax (the logits stay on the device): equal to
    numpy's argmax of the copied logits at every width, and its greedy output equal to the
    logits path's."""
    eng = edgespec.load(tiny_cuda_bundle, provider="cuda", max_context=256)
    target = eng.decoder.target
    assert target.device_argmax
    ids = [(7919 * i + 13) % 500 for i in range(60)]
    target.reset()
    target.forward(ids[:16])
    for w in (1, 2, 3, 5, 9, 16, 33):
        logits = target.forward(ids[16: 16 + w])
        target.rewind(w)
        top = target.forward_argmax(ids[16: 16 + w])
        target.rewind(w)
        assert np.array_equal(top, np.argmax(logits, axis=-1)), w
    target.reset()
    fast = [eng.generate(p, max_new_tokens=24, drafter="none").token_ids for p in PROMPTS]
    target.device_argmax = False
    assert [eng.generate(p, max_new_tokens=24, drafter="none").token_ids for p in PROMPTS] == fast


def test_cuda_graphs_replay_and_stay_exact(tiny_cuda_bundle):
    """CUDA graphs (edgespec/graphs.py, on by default on CUDA): both models' short calls replay
    captured graphs; a replay computes what the width's ordinary first call computed; greedy
    speculative output equals greedy decoding with every drafter; the logits are within a near
    tie of those without graphs (dynamic mask); sampled generation reads the logits buffers."""
    eng = edgespec.load(tiny_cuda_bundle, provider="cuda", max_context=256)
    target, drafter = eng.decoder.target, eng.decoder.drafters["model"].lm
    assert target.graphs is not None and drafter.graphs is not None
    greedy_is_exact(eng, PROMPTS, ("prompt-lookup", "model", "auto"))
    assert target.graphs.replays > 0 and drafter.graphs.replays > 0
    ids = [(7919 * i + 13) % 500 for i in range(60)]
    target.reset()
    target.forward(ids[:20])
    for w in (1, 3, 7, 12):  # new widths: the first call is ordinary, the next captures, then replays
        runs = []
        for _ in range(3):
            runs.append(target.forward(ids[20: 20 + w]))
            target.rewind(w)
        assert all(np.array_equal(r, runs[0]) for r in runs), w
    with_graphs = target.forward(ids[20:23])
    eng.reset()
    off = edgespec.load(tiny_cuda_bundle, provider="cuda", max_context=256, cuda_graphs=False)
    assert off.decoder.target.graphs is None
    off.decoder.target.forward(ids[:20])
    plain = off.decoder.target.forward(ids[20:23])
    assert np.abs(plain - with_graphs).max() < NEAR_TIE
    r = eng.generate(PROMPTS[0], max_new_tokens=16, drafter="model", temperature=0.8, seed=3)
    assert len(r.token_ids) > 0


def _last_logits(bundle, provider, ids):
    m = load_manifest(bundle)
    lm = OnnxLM(m.target, 1024, choose([provider], explicit=True), min_width=1)
    return lm.feed(ids)


def test_gpu_greedy_agrees_with_the_cpu_on_smollm2(smol_cuda):
    """The same cuda-layout SmolLM2 graph on CUDA and on the CPU EP: the greedy continuations are
    equal, or part only at a near tie (the two tokens' logits within NEAR_TIE on both devices)."""
    out = {}
    engines = {p: edgespec.load(smol_cuda, provider=p, max_context=512) for p in ("cpu", "cuda")}
    for provider, eng in engines.items():
        out[provider] = [(eng.encode(p), eng.generate(p, max_new_tokens=32, drafter="none").token_ids)
                         for p in PROMPTS]
    for (ids, gpu), (_, cpu) in zip(out["cuda"], out["cpu"]):
        if gpu == cpu:
            continue
        i = next((i for i, (a, b) in enumerate(zip(gpu, cpu)) if a != b), min(len(gpu), len(cpu)))
        assert i < min(len(gpu), len(cpu)), f"one device stopped at {i} tokens, the other went on"
        prefix = list(ids) + gpu[:i]
        for provider in ("cpu", "cuda"):
            logits = _last_logits(smol_cuda, provider, prefix)
            gap = abs(float(logits[gpu[i]]) - float(logits[cpu[i]]))
            assert gap < NEAR_TIE, f"{provider}: tokens {gpu[i]} / {cpu[i]} at {i} are {gap:.3f} apart"


def test_heterogeneous_placement_on_the_gpu(tiny_cuda_bundle):
    """Target on CUDA, drafter on the CPU EP: only token ids cross, the output is plain greedy's."""
    eng = edgespec.load(tiny_cuda_bundle, provider="cuda", drafter_provider="cpu", max_context=256)
    assert eng.plan.devices == {"target": "gpu", "drafter": "cpu"}
    assert eng.decoder.drafters["model"].lm.device == "cpu"
    greedy_is_exact(eng, PROMPTS[:2], ("model", "auto"))


def test_plan_measure_on_cuda(tiny_cuda_bundle):
    """`edgespec plan --measure` reads the GPU memory through NVML; the measured peak stays within
    the plan's total for the GPU (weights, KV, working memory and the CUDA context allowance)."""
    r = CliRunner().invoke(main, ["plan", str(tiny_cuda_bundle), "--profile", "rtx4060-laptop-8gb",
                                  "--provider", "cuda", "--measure", "--measure-tokens", "200", "--json"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.stdout)
    gpu = [s["gpu"] for s in rep["measured"] if s["gpu"] is not None]
    assert gpu, f"no GPU memory read (NVML): {rep['measured']}"
    # this process's memory, not the device's (other processes would count against the plan)
    assert {s["gpu_scope"] for s in rep["measured"] if s["gpu"] is not None} == {"process"}
    assert max(gpu) <= rep["plan"]["total"], (max(gpu), rep["plan"])
