"""Logit processing shared by the target and the drafter: temperature, top-k, top-p.

``distribution(row, sp)`` is what decoding runs: a ``Dist`` over the vocabulary in as few passes
over the row as the settings allow. Top-k and top-p keep few tokens, so their probabilities are
computed on those tokens only (float64: cheap on a handful): the kept set comes from one partial
selection (top-k) or from the tokens within a logit threshold of the maximum, widened until their
mass reaches top_p (top-p), then sorted; nothing sorts the whole vocabulary. Temperature alone
keeps every token: one float32 exp pass, and sampling finds the token through block sums instead
of a cumulative sum over the vocabulary. ``probs`` is the same transform as dense rows (tests and
reports).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError

_BLOCK = 1024  # tokens per block when sampling from a dense distribution


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means off
    top_p: float = 1.0

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0 <= self.top_k < 2**31:
            raise ConfigError(f"top_k must be in 0..2**31-1 (0 is off), got {self.top_k}")
        if not 0 < self.top_p <= 1:  # also refuses nan
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Dist:
    """A distribution over ``n`` tokens: weights ``w`` of the tokens ``idx`` (sorted; None: of
    every token) and their sum ``total``; p(t) = w[t] / total, zero outside ``idx``."""

    __slots__ = ("n", "idx", "w", "total")

    def __init__(self, n: int, idx: np.ndarray | None, w: np.ndarray, total: float | None = None):
        self.n = n
        self.idx = idx
        self.w = w
        self.total = float(w.sum(dtype=np.float64)) if total is None else float(total)

    def prob(self, token: int) -> float:
        if self.idx is None:
            return float(self.w[token]) / self.total if 0 <= token < self.n else 0.0
        j = int(np.searchsorted(self.idx, token))
        return float(self.w[j]) / self.total if j < self.idx.shape[0] and self.idx[j] == token else 0.0

    def sample(self, rng: np.random.Generator) -> int:
        if self.idx is not None:
            return int(self.idx[_inverse_cdf(self.w, rng)])
        w = self.w
        full = w.shape[0] - w.shape[0] % _BLOCK
        sums = w[:full].reshape(-1, _BLOCK).sum(axis=1, dtype=np.float64)
        if full < w.shape[0]:
            sums = np.append(sums, w[full:].sum(dtype=np.float64))
        b = _inverse_cdf(sums, rng)
        return b * _BLOCK + _inverse_cdf(w[b * _BLOCK: (b + 1) * _BLOCK], rng)

    def dense(self) -> np.ndarray:
        """p as a float64 row of ``n``."""
        p = np.zeros(self.n, dtype=np.float64)
        if self.idx is None:
            p[:] = self.w
        else:
            p[self.idx] = self.w
        return p / self.total

    def without(self, token: int) -> "Dist | None":
        """This distribution with ``token`` removed, renormalized (None: nothing left)."""
        if self.idx is None:
            w = self.w.copy()
            if 0 <= token < self.n:
                w[token] = 0
            return Dist(self.n, None, w) if w.any() else None
        keep = self.idx != token
        return Dist(self.n, self.idx[keep], self.w[keep]) if keep.any() else None

    def minus(self, q: "Dist") -> "Dist | None":
        """normalize(max(self - q, 0)), the rejection rule's residual (None: p == q)."""
        if self.idx is not None and q.idx is not None:
            idx = self.idx
            p = self.w / self.total
            qv = np.zeros_like(p)
            common, ip, iq = np.intersect1d(idx, q.idx, assume_unique=True, return_indices=True)
            qv[ip] = q.w[iq] / q.total
            r = np.maximum(p - qv, 0.0)
            return Dist(self.n, idx, r) if r.sum() > 0 else None
        r = np.maximum(self.dense() - _fit(q.dense(), self.n), 0.0)
        return Dist(self.n, None, r) if r.sum() > 0 else None


def distribution(row: np.ndarray, sp: SamplingParams) -> Dist:
    """One row of logits -> its distribution after temperature, top-k and top-p."""
    x = np.asarray(row)
    n = x.shape[0]
    inv_t = 1.0 / sp.temperature
    m = x.max()
    idx = None
    if sp.top_k and sp.top_k < n:
        kth = np.partition(x, n - sp.top_k)[n - sp.top_k]
        idx = np.flatnonzero(x >= kth)  # ties at the k-th value are all kept
    elif sp.top_p < 1.0:
        # candidates: tokens within a logit threshold of the maximum, widened until they hold top_p
        # of the mass (the tokens a top-p cut keeps are the most likely, so they are all inside)
        e = np.exp((x.astype(np.float32, copy=False) - np.float32(m)) * np.float32(inv_t))
        z = float(e.sum(dtype=np.float64))
        for gap in (7.0, 14.0, 28.0, 56.0, math.inf):  # e >= exp(-gap) in weight
            idx = np.flatnonzero(e >= math.exp(-gap)) if gap < math.inf else np.arange(n)
            if float(e[idx].sum(dtype=np.float64)) >= sp.top_p * z or gap == math.inf:
                break
    if idx is None:
        w = np.exp((x.astype(np.float32, copy=False) - np.float32(m)) * np.float32(inv_t))
        return Dist(n, None, w)
    w = np.exp((x[idx].astype(np.float64) - float(m)) * inv_t)
    if sp.top_p < 1.0:
        # the mass outside the candidates (top-p alone) from the float32 pass; inside, float64
        total = w.sum() if sp.top_k else w.sum() + max(z - float(e[idx].sum(dtype=np.float64)), 0.0)
        order = np.argsort(-w, kind="stable")  # ties keep vocabulary order, as a stable full sort would
        sw = w[order]
        cum = np.cumsum(sw) / total
        keep = int(np.count_nonzero((cum - sw / total) < sp.top_p))  # the token crossing top_p is kept
        sel = np.sort(order[:max(keep, 1)])
        idx, w = idx[sel], w[sel]
    return Dist(n, idx, w)


def probs(logits: np.ndarray, sp: SamplingParams) -> np.ndarray:
    """Rows of logits -> rows of probabilities (float64) after temperature, top-k and top-p."""
    x = np.asarray(logits)
    if x.ndim == 1:
        return distribution(x, sp).dense()
    return np.stack([distribution(r, sp).dense() for r in x])


def _inverse_cdf(w: np.ndarray, rng: np.random.Generator) -> int:
    """One index drawn from weights ``w`` (inverse CDF; robust to rounding)."""
    c = np.cumsum(w, dtype=np.float64)
    u = rng.random() * c[-1]
    return int(min(np.searchsorted(c, u, side="right"), len(w) - 1))


def _fit(q: np.ndarray, n: int) -> np.ndarray:
    if q.shape[0] >= n:
        return q[:n]
    return np.concatenate([q, np.zeros(n - q.shape[0], dtype=q.dtype)])
