"""Validate an exported graph against the torch model through edgespec's own runtime path."""
from __future__ import annotations

import numpy as np

from edgespec.drafters import fed_ids
from edgespec.errors import ExportError
from edgespec.manifest import ModelSpec, Validation
from edgespec.onnx_lm import OnnxLM
from edgespec.providers import choose

from .weights import check_weights

VALIDATION_TEXTS = (
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n        return n\n",
    "The quick brown fox jumps over the lazy dog. Then it runs back into the forest, where",
    "Question: What is the capital of France?\nAnswer: The capital of France is Paris, which",
)

# Max |logit difference| allowed per precision (None: quantized, judged by top-1 agreement).
TOLERANCE = {"fp32": 1e-2, "fp16": 0.5}
MIN_TOP1 = 0.6
# The rows of the phases (a prefill, a one-token decode, a verify, a rewind and its decode) against the same graph's
# one-call prefill of the whole text, under the runtime's width policy: the same numbers (0.0 measured on SmolLM2's
# and the Qwen pair's INT4, HQQ and fp32 graphs, session 50), at any precision. The bound against torch at the
# quantized precisions is loose (top-1 >= 0.6, pooled: a graph whose decode ignored its cache passed it); this one
# is not. (Two layers swapped keep a graph consistent with itself: neither check sees that; ``check_weights`` does.)
SELF_TOLERANCE = 1e-3


def torch_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def validate(model, tokenizer, spec: ModelSpec, precision: str, log) -> Validation:
    """Prefill, one-token decode, a 5-token verify with a past, and rewind-then-decode, each
    against torch's logits for the same positions. Returns the figures; ``passed`` says if they
    are within the tolerance of the precision."""
    lm = OnnxLM(spec, min(spec.max_context, 512), choose(["cpu"]))
    diffs = {"prefill": 0.0, "decode": 0.0, "verify": 0.0, "rewind": 0.0}
    agree = total = 0
    own = 0.0  # the phases' rows against the same graph's one-call prefill of the text (``SELF_TOLERANCE``)
    for text in VALIDATION_TEXTS:
        # (a drafter's vocabulary may stop short of the tokenizer's, Gemma 3 1B's: fed as the runtime feeds them)
        ids = fed_ids(tokenizer(text, add_special_tokens=False)["input_ids"][: min(48, lm.max_context)], spec.vocab_size)
        if not ids:  # (a tokenizer without a vocabulary: torch.tensor([[]]) was a traceback)
            raise ExportError(f"the tokenizer makes no token of the validation text {text[:30]!r}...: a tokenizer "
                              "without a vocabulary?")
        if len(ids) < 10:
            ids = (ids * 10)[:12]
        n = len(ids)
        ref = torch_logits(model, ids)[:, : spec.vocab_size]
        lm.reset()
        got = {
            "prefill": (lm.forward(ids[: n - 6]), ref[: n - 6]),
            "decode": (lm.forward(ids[n - 6: n - 5]), ref[n - 6: n - 5]),
            "verify": (lm.forward(ids[n - 5:]), ref[n - 5:]),
        }
        lm.rewind(3)
        got["rewind"] = (lm.forward(ids[n - 3:]), ref[n - 3:])
        lm.reset()
        whole = np.asarray(lm.forward(ids))
        rows = np.concatenate([np.asarray(got[k][0]) for k in ("prefill", "decode", "verify", "rewind")])
        d = float(np.abs(rows - np.concatenate([whole, whole[n - 3:]])).max())
        own = max(own, d if np.isfinite(d) else float("inf"))
        for phase, (a, b) in got.items():
            d = float(np.abs(a[:, : b.shape[1]] - b).max())
            # (a NaN is no difference Python's max keeps: one NaN row passed with the other rows' figure; session 49)
            diffs[phase] = max(diffs[phase], d if np.isfinite(d) else float("inf"))
            agree += int((a[:, : b.shape[1]].argmax(-1) == b.argmax(-1)).sum())
            total += a.shape[0]
    top1 = agree / total
    tol = TOLERANCE.get(precision)
    max_diff = max(diffs.values())
    top1_ok = top1 >= (0.99 if tol is not None else MIN_TOP1)
    passed = top1_ok and (max_diff <= tol if tol is not None else True)
    finite = all(np.isfinite(d) for d in diffs.values())
    passed = passed and finite  # (a logit that is no number fails every precision)
    argmax_ok = _argmax_output_agrees(lm, ids) if spec.io.argmax else None
    passed = passed and argmax_ok is not False
    consistent = own <= SELF_TOLERANCE
    passed = passed and consistent
    weights = check_weights(model, spec.path, spec.num_layers)
    passed = passed and weights.passed
    for phase, d in diffs.items():
        ok = np.isfinite(d) and (tol is None or d <= tol)
        log(f"    {'✓' if ok else '✗'} {phase:8s} max |Δlogit| = {d:.3g}")
    log(f"    {'✓' if consistent else '✗'} decode, verify and rewind rows against the graph's own one-call prefill: "
        f"max |Δlogit| = {own:.3g} (tolerance {SELF_TOLERANCE})")
    if argmax_ok is not None:
        log(f"    {'✓' if argmax_ok else '✗'} the graph's argmax output equals its logits' argmax")
    log(f"    {'✓' if weights.passed else '✗'} weights against torch's: {weights.checked} matrices, the worst relative "
        f"difference {weights.worst:.3g} ({weights.worst_name or 'none'})"
        + (f"; {len(weights.unmapped)} not mapped to a torch parameter ({', '.join(weights.unmapped[:2])}"
           f"{', ...' if len(weights.unmapped) > 2 else ''})" if weights.unmapped else ""))
    for node, tname, err, bound in weights.failed[:3]:
        log(f"      ✗ {node} against {tname}: {err:.3g} (bound {bound:g})")
    if len(weights.failed) > 3:
        log(f"      ✗ and {len(weights.failed) - 3} more")
    # (its own mark: the overall verdict's marked a graph failing only another check "✗ top-1 ... = 1.000")
    log(f"    {'✓' if top1_ok else '✗'} top-1 agreement with torch = {top1:.3f} over {total} positions"
        + (f" (needs >= 0.99; |Δlogit| tolerance {tol})" if tol is not None else f" (needs >= {MIN_TOP1})"))
    return Validation(max_abs_logit_diff={k: round(v, 6) for k, v in diffs.items()}, top1_agreement=round(top1, 4),
                      positions=total, tolerance=tol, passed=passed, weights_checked=weights.checked,
                      weights_unmapped=len(weights.unmapped),
                      weight_error=round(weights.worst, 6) if np.isfinite(weights.worst) else None)


def _argmax_output_agrees(lm: OnnxLM, ids: list[int]) -> bool:
    """A graph with an ``argmax`` output (the cuda layout's, which greedy rounds read on a GPU): that output of a call
    equals the argmax of the same call's logits (session 49, a review: nothing compared them at export)."""
    rows = ids[: min(len(ids), 8)]
    lm.reset()
    want = np.asarray(lm.forward(rows)).argmax(-1)
    lm.reset()
    got = np.asarray(lm._call(rows, True)).reshape(-1)
    lm.reset()
    return bool(np.array_equal(want, got))
