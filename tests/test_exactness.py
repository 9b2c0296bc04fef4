"""Greedy speculative output equals target-only greedy output, token for token, on real graphs.

INT4 policy under test: onnxruntime's CPU MatMulNBits at accuracy level 4 computes a 1-token call
on another path than a wider one, so edgespec runs every target call with >= 2 tokens
(OnnxLM.min_width). The premise (rows of calls of any width >= 2 are bitwise equal) is tested
here too, so an onnxruntime upgrade that breaks it fails loudly.
"""
from __future__ import annotations

import numpy as np
import pytest

import edgespec
from edgespec.manifest import load_manifest
from edgespec.onnx_lm import OnnxLM
from edgespec.providers import choose

PROMPTS = [
    "def fibonacci(n):",
    "Write a list of five fruits and their colours:\n1. Apple - red\n2.",
    "Summarize: The meeting moved to Tuesday. The meeting room is on floor three. Tuesday at ten.",
    "The capital of France is",
]


def _greedy_all(eng, prompt, n, drafters=("none", "prompt-lookup", "auto", "model")):
    out = {}
    for d in drafters:
        if d == "model" and "model" not in eng.decoder.drafters:
            continue
        for k in ((None, 1, 4) if d != "none" else (None,)):
            eng.reset()
            r = eng.generate(prompt, max_new_tokens=n, drafter=d, draft_tokens=k)
            out[(d, k)] = r.token_ids
    return out


def _assert_all_equal(results, prompt):
    ref = results[("none", None)]
    for key, toks in results.items():
        assert toks == ref, f"{key} differs from autoregressive on {prompt!r}"


def test_rows_of_wide_calls_are_bitwise_equal(tiny_int4_bundle):
    m = load_manifest(tiny_int4_bundle)
    lm = OnnxLM(m.target, 128, choose(["cpu"]), min_width=1)
    ids = list(range(10, 60))
    lm.forward(ids[:30])
    first = {}
    for w in (2, 3, 5, 9):
        lm.rewind(lm.length - 30)
        first[w] = lm.forward(ids[30:30 + w])
    for w in (3, 5, 9):
        assert np.array_equal(first[w][:2], first[2][:2]), w
    assert lm.min_width == 1 and OnnxLM(m.target, 64, choose(["cpu"])).min_width == 2


@pytest.mark.parametrize("bundle", ["tiny_bundle", "tiny_int4_bundle"])
def test_tiny_models_all_drafters_exact(bundle, request):
    eng = edgespec.load(request.getfixturevalue(bundle), max_context=256)
    for p in PROMPTS:
        _assert_all_equal(_greedy_all(eng, p, 40), p)


def test_drafter_runs_one_token_steps_and_stays_exact(tiny_fp8_bundle):
    """The width policy is the target's alone: an INT8 drafter at accuracy level 4 (whose graph the
    policy would pad) runs one-token steps, and every drafter still equals autoregressive output."""
    from edgespec.onnx_lm import width_policy

    eng = edgespec.load(tiny_fp8_bundle, max_context=256)
    dlm = eng.decoder.drafters["model"].lm
    assert width_policy(dlm.spec, "cpu") == 2 and dlm.min_width == 1
    for p in PROMPTS:
        _assert_all_equal(_greedy_all(eng, p, 40), p)


@pytest.mark.real
@pytest.mark.parametrize("precision", ["fp32", "int4"])
def test_smollm2_prompt_lookup_exact(precision, request):
    eng = edgespec.load(request.getfixturevalue(f"smol_{precision}"), max_context=1024)
    for p in PROMPTS:
        _assert_all_equal(_greedy_all(eng, p, 48, ("none", "prompt-lookup", "auto")), p)


@pytest.mark.real
def test_smollm2_int4_single_token_path_differs_and_policy_restores_exactness(smol_int4):
    """Documents why the policy exists: without it, 1-token decoding and verification disagree."""
    m = load_manifest(smol_int4)
    raw = OnnxLM(m.target, 512, choose(["cpu"]), min_width=1)
    rng = np.random.default_rng(0)
    ids = rng.integers(100, 10000, size=60).tolist()
    raw.forward(ids[:50])
    one = raw.forward(ids[50:51])
    raw.rewind(1)
    wide = raw.forward(ids[50:53])[:1]
    assert not np.array_equal(one, wide)  # the kernel's M = 1 path is different arithmetic
    pol = OnnxLM(m.target, 512, choose(["cpu"]))
    pol.forward(ids[:50])
    assert np.array_equal(pol.forward(ids[50:51]), wide)
