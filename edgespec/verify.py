"""Exact acceptance rules, pure numpy.

Greedy: accept draft tokens while they equal the target's argmax; then emit the target's argmax.
Sampled (Leviathan et al. / Chen et al.): accept draft token x with probability min(1, p(x)/q(x));
on the first rejection emit a sample of normalize(max(p - q, 0)); if every draft token is accepted,
emit a bonus sample from p. A drafter without probabilities (prompt lookup) proposes
deterministically, so q is a point mass at x: accept with probability p(x), and on rejection
sample from p with x removed (renormalized) -- the same rule with q = onehot(x).
Every round returns at least one token, and the output follows p exactly.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .sampling import SamplingParams, probs, sample


def greedy_accept(draft: Sequence[int], target_logits: np.ndarray) -> tuple[int, int]:
    """Return (accepted count, next token). ``target_logits`` has len(draft)+1 rows."""
    choice = np.argmax(target_logits, axis=-1)
    n = 0
    while n < len(draft) and int(choice[n]) == int(draft[n]):
        n += 1
    return n, int(choice[n])


def rejection_sample(draft: Sequence[int], draft_probs: np.ndarray | None, target_logits: np.ndarray,
                     sp: SamplingParams, rng: np.random.Generator,
                     target_probs: np.ndarray | None = None) -> tuple[int, int]:
    """Return (accepted count, next token) for sampled speculative decoding.

    ``draft_probs`` holds q for each draft position (already processed with ``sp``), or None for a
    deterministic drafter (point-mass q). ``target_logits`` has len(draft)+1 rows.
    """
    p = target_probs if target_probs is not None else probs(target_logits, sp)
    for i, x in enumerate(draft):
        px = p[i, x]
        qx = 1.0 if draft_probs is None else draft_probs[i, x]
        if qx > 0 and rng.random() * qx < px:  # u < p/q without dividing
            continue
        if draft_probs is None:
            residual = p[i].copy()
            residual[x] = 0.0
        else:
            q = draft_probs[i]
            if q.shape[0] != p.shape[1]:
                q = _fit(q, p.shape[1])
            residual = np.maximum(p[i] - q, 0.0)
        total = residual.sum()
        if total <= 0:  # p == q up to rounding: any sample of p is exact
            return i, sample(p[i], rng)
        return i, sample(residual / total, rng)
    return len(draft), sample(p[len(draft)], rng)


def _fit(q: np.ndarray, n: int) -> np.ndarray:
    if q.shape[0] >= n:
        return q[:n]
    return np.concatenate([q, np.zeros(n - q.shape[0], dtype=q.dtype)])
