"""Exact acceptance rules, pure numpy.

Greedy: accept draft tokens while they equal the target's argmax; then emit the target's argmax.
Sampled (Leviathan et al. / Chen et al.): accept draft token x with probability min(1, p(x)/q(x));
on the first rejection emit a sample of normalize(max(p - q, 0)); if every draft token is accepted,
emit a bonus sample from p (a rejected position with an alternate beside it tries that first:
``rejection_sample_alternates``). A drafter without probabilities (prompt lookup) proposes
deterministically, so q is a point mass at x: accept with probability p(x), and on rejection
sample from p with x removed (renormalized) -- the same rule with q = onehot(x).
Every round returns at least one token, and the output follows p exactly.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .sampling import Dist, SamplingParams, chosen, distribution, greedy_choice


def greedy_accept(draft: Sequence[int], target_logits: np.ndarray) -> tuple[int, int]:
    """Return (accepted count, next token). ``target_logits`` has len(draft)+1 rows."""
    return greedy_accept_choice(draft, greedy_choice(target_logits))


def greedy_accept_choice(draft: Sequence[int], choice: np.ndarray) -> tuple[int, int]:
    """``greedy_accept`` given the target's argmax at each of the len(draft)+1 positions."""
    n = 0
    while n < len(draft) and int(choice[n]) == int(draft[n]):
        n += 1
    return n, chosen(choice[n])  # (-1: a row without a greedy choice, which equals no draft token)


def rejection_sample(draft: Sequence[int], draft_dists: Sequence[Dist] | None, target_logits: np.ndarray,
                     sp: SamplingParams, rng: np.random.Generator) -> tuple[int, int]:
    """Return (accepted count, next token) for sampled speculative decoding.

    ``draft_dists`` holds q for each draft position (processed with ``sp``), or None for a
    deterministic drafter (point-mass q). ``target_logits`` has len(draft)+1 rows; a row is
    turned into p only when the rule reaches it (a rejection at position i leaves the rest alone).
    """
    for i, x in enumerate(draft):
        p = distribution(target_logits[i], sp)
        if _accepts(p, None if draft_dists is None else draft_dists[i], x, rng):
            continue
        residual = p.without(x) if draft_dists is None else p.minus(draft_dists[i])
        if residual is None:  # p == q up to rounding: any sample of p is exact
            return i, p.sample(rng)
        return i, residual.sample(rng)
    return len(draft), distribution(target_logits[len(draft)], sp).sample(rng)


def rejection_sample_alternates(draft: Sequence[int], draft_dists: Sequence[Dist], target_logits: np.ndarray,
                                sp: SamplingParams, rng: np.random.Generator,
                                alternates: dict[int, int]) -> tuple[int, int, int | None]:
    """``rejection_sample`` for a model drafter's draft some of whose positions carry an alternate:
    ``alternates`` maps a position i to a token drawn from q_i without ``draft[i]`` (``alternate_dist``),
    drawn before the target's call. A rejection at such a position tries the alternate as a second
    proposal (recursive rejection sampling without replacement, Jeon et al. 2024): with p1 =
    normalize(max(p - q, 0)), the rejection's residual, and q1 = q without draft[i], the alternate y is
    accepted with probability min(1, p1(y) / q1(y)), and only on its rejection too is the token drawn
    from normalize(max(p1 - q1, 0)). Given the rejection, that is the rule above for target p1 and
    proposal q1, so the token follows p1 and the position follows p, whichever x1 was drafted.
    Returns (accepted count, next token, the position whose alternate that token is, or None)."""
    for i, x in enumerate(draft):
        p = distribution(target_logits[i], sp)
        q = draft_dists[i]
        if _accepts(p, q, x, rng):
            continue
        residual = p.minus(q)
        if residual is None:  # p == q up to rounding: any sample of p is exact
            return i, p.sample(rng), None
        y = alternates.get(i)
        q1 = alternate_dist(q, x) if y is not None else None
        if q1 is None:
            return i, residual.sample(rng), None
        if _accepts(residual, q1, y, rng):
            return i, y, i
        rest = residual.minus(q1)
        return i, (residual if rest is None else rest).sample(rng), None  # (None: p1 == q1 up to rounding)
    return len(draft), distribution(target_logits[len(draft)], sp).sample(rng), None


def alternate_dist(q: Dist, x: int) -> Dist | None:
    """The distribution an alternate beside draft token ``x`` is drawn from: q without x (None: q has
    nothing else)."""
    return q.without(x)


def _accepts(p: Dist, q: Dist | None, x: int, rng: np.random.Generator) -> bool:
    """u < p(x) / q(x) without dividing (q None: a point mass, q(x) = 1), u drawn only when
    q(x) > 0. A ``TailDist`` knows p(x) within bounds: the test is decided on them, and on the
    exact probabilities only when u falls between them."""
    q_lo, q_hi = (1.0, 1.0) if q is None else q.prob_bounds(x)
    if q_lo <= 0 < q_hi:
        q = q.exact()
        q_lo = q_hi = q.prob(x)
    if q_hi <= 0:
        return False
    u = rng.random()
    p_lo, p_hi = p.prob_bounds(x)
    if u * q_hi < p_lo:
        return True
    if u * q_lo >= p_hi:
        return False
    return u * (1.0 if q is None else q.exact().prob(x)) < p.exact().prob(x)
