"""Logit processing shared by the target and the drafter: temperature, top-k, top-p, min-p.

``distribution(row, sp)`` is what decoding runs: a ``Dist`` over the vocabulary in as few passes
over the row as the settings allow. Top-k and top-p keep few tokens, so their probabilities are
computed on those tokens only (float64: cheap on a handful): the kept set comes from one partial
selection (top-k) or from the tokens near the maximum, the cut decided at both ends of the range
the rest's mass can take (top-p; natively in one call where edgespec/native/topp.cpp builds);
nothing sorts the whole vocabulary. Min-p comes last (transformers' order: temperature, top-k,
top-p, min-p): it keeps the tokens at least ``min_p`` times as likely as the likeliest, a cut
relative to the maximum alone, so the tokens within a logit gap of T ln(1 / min_p) of it.
Temperature alone over a large vocabulary is a ``TailDist``: the tokens near the maximum and a
bound on the rest, sampled exactly by rejection from an envelope; over a small one, one float32
exp pass, sampled through block sums. ``probs`` is the same transform as dense rows (tests and
reports).
"""
from __future__ import annotations

import bisect
import math
import threading
from dataclasses import dataclass, replace

import numpy as np

from . import native
from .errors import BundleError, ConfigError, shown

MIN_TEMPERATURE = 1e-6  # a positive temperature below this is greedy decoding (1/T would overflow float32's range)
_BLOCK = 1024  # tokens per block when sampling from a dense distribution
_TAIL_EPS = (1e-3, 1e-7)  # top-p: the most the tokens left out may weigh together (the maximum weighs 1)
_NATIVE_CAP = 8192  # kept tokens the native top-p returns at most (more: numpy's path)
_LAZY_MIN = 4096  # temperature alone over at least this many tokens: a TailDist (fewer: one pass)
_DENSE_EPS = 1e-3  # a TailDist's tokens left out weigh at most this together (the maximum weighs 1)
_SMALL = 64  # kept tokens up to which a sample is drawn in plain Python (cold numpy calls cost more)
_out = threading.local()  # the native top-p's output buffers
_NEAR_MAX = 16384  # more tokens near the maximum than this (a flat row): the exact pass over every token


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means off
    top_p: float = 1.0
    min_p: float = 0.0  # 0 means off: else the tokens at least min_p times as likely as the likeliest

    def __post_init__(self):
        try:
            finite = math.isfinite(self.temperature)
        except (OverflowError, TypeError):  # (an integer too large for a float; not a number)
            finite = False
        if not (finite and self.temperature >= 0):
            raise ConfigError(f"temperature must be a finite number >= 0, got {shown(self.temperature, 40)}")
        if 0 < self.temperature < MIN_TEMPERATURE:  # (1/T would overflow float32's range: refused until session 92,
            # and evaluation tools send 1e-7 for "greedy", as OpenAI's API takes any value in 0..2 and vLLM decodes
            # greedily below 1e-5)
            object.__setattr__(self, "temperature", 0.0)
        if not 0 <= self.top_k < 2**31:
            raise ConfigError(f"top_k must be in 0..2**31-1 (0 is off), got {shown(self.top_k)}")
        # (top_p 0: a nucleus of no mass keeps the most likely token alone, greedy decoding: OpenAI's API and
        # llama.cpp take 0 so, vLLM refuses it; refused here until session 72, and OpenAI clients send it)
        if not 0 <= self.top_p <= 1:  # also refuses nan
            raise ConfigError(f"top_p must be in [0, 1] (0: the most likely token alone), got {shown(self.top_p)}")
        if not 0 <= self.min_p <= 1:  # also refuses nan
            raise ConfigError(f"min_p must be in [0, 1] (0 is off), got {shown(self.min_p)}")

    @property
    def greedy(self) -> bool:
        """Temperature 0, or top_p 0 (the most likely token alone at any temperature): the target's argmax."""
        return self.temperature == 0 or self.top_p == 0


class Dist:
    """A distribution over ``n`` tokens: weights ``w`` of the tokens ``idx`` (sorted; None: of
    every token) and their sum ``total``; p(t) = w[t] / total, zero outside ``idx``."""

    __slots__ = ("n", "idx", "w", "total")

    def __init__(self, n: int, idx: np.ndarray | None, w: np.ndarray, total: float | None = None):
        self.n = n
        self.idx = idx
        self.w = w
        self.total = float(w.sum(dtype=np.float64)) if total is None else float(total)

    def exact(self) -> "Dist":
        """This distribution with every weight computed (itself; a ``TailDist`` computes its tail)."""
        return self

    def prob_bounds(self, token: int) -> tuple[float, float]:
        """Bounds on p(token) (equal here; a ``TailDist`` knows its total only within a range)."""
        v = self.prob(token)
        return v, v

    def prob(self, token: int) -> float:
        if self.idx is None:
            return float(self.w[token]) / self.total if 0 <= token < self.n else 0.0
        j = int(np.searchsorted(self.idx, token))
        return float(self.w[j]) / self.total if j < self.idx.shape[0] and self.idx[j] == token else 0.0

    def sample(self, rng: np.random.Generator) -> int:
        if self.idx is not None:
            if self.w.shape[0] <= _SMALL:  # a few kept tokens: the same sums without numpy's calls
                w = self.w.tolist()
                c, cum = [], 0.0
                for v in w:
                    cum += v
                    c.append(cum)
                return int(self.idx[min(bisect.bisect_right(c, rng.random() * cum), len(w) - 1)])
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
        # (the weights', not the indices': top-k at a temperature near 0 keeps tokens whose weight underflows to
        # 0, and an alternate drawn from an all-zero rest divided by its total, 0)
        return Dist(self.n, self.idx[keep], self.w[keep]) if self.w[keep].any() else None

    def minus(self, q: "Dist") -> "Dist | None":
        """normalize(max(self - q, 0)), the rejection rule's residual (None: p == q)."""
        q = q.exact()
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


class TailDist(Dist):
    """Temperature alone over a large vocabulary without an exp over all of it. ``idx``/``w`` hold
    the tokens near the maximum and their float32 weights (the maximum's is 1); the others (the
    tail, less ``excluded``) weigh under ``bound`` together, ``total`` is the near tokens' mass.
    A sample draws u from [0, total + bound): below ``total`` it is a near token; past it the tail
    is computed and u lands on a tail token or, past the tail's true mass, the draw starts again
    from the exact distribution (rejection from an envelope: exact, and the tail is computed with
    probability under bound / total). ``prob_bounds`` gives p(t) within the total's range;
    ``exact()`` computes every weight (the near ones kept as they are)."""

    __slots__ = ("row", "m", "inv_t", "bound", "excluded", "_exact")

    def __init__(self, n, idx, w, row, m, inv_t, bound, excluded=()):
        super().__init__(n, idx, w)
        self.row, self.m, self.inv_t, self.bound = row, m, inv_t, float(bound)
        self.excluded = tuple(excluded)
        self._exact = None

    def exact(self) -> Dist:
        if self._exact is None:
            full = np.exp((self.row.astype(np.float32, copy=False) - np.float32(self.m)) * np.float32(self.inv_t))
            full[self.idx] = self.w
            if self.excluded:
                full[list(self.excluded)] = 0
            self._exact = Dist(self.n, None, full)
        return self._exact

    def _weight(self, token: int) -> tuple[float, float]:
        """Bounds on the weight of one token (its exp computed alone may round otherwise than the
        row's: 1e-6 either way)."""
        if not 0 <= token < self.n or token in self.excluded:
            return 0.0, 0.0
        j = int(np.searchsorted(self.idx, token))
        if j < self.idx.shape[0] and self.idx[j] == token:
            v = float(self.w[j])
            return v, v
        v = float(np.exp((np.float32(self.row[token]) - np.float32(self.m)) * np.float32(self.inv_t)))
        return v * (1 - 1e-6), v * (1 + 1e-6)

    def prob_bounds(self, token: int) -> tuple[float, float]:
        lo, hi = self._weight(token)
        # the exact total sums in another order: 1e-12 of slack
        total = (self.total + self.bound) * (1 + 1e-12)
        return lo / total, (hi / (self.total * (1 - 1e-12)) if self.total > 0 else math.inf)

    def prob(self, token: int) -> float:
        return self.exact().prob(token)

    def sample(self, rng: np.random.Generator) -> int:
        u = rng.random() * (self.total + self.bound)
        if u < self.total:
            return int(self.idx[_locate(np.cumsum(self.w, dtype=np.float64), u)])
        full = self.exact()
        tail = full.w.astype(np.float64)
        tail[self.idx] = 0
        c = np.cumsum(tail)
        if u - self.total < c[-1]:
            return _locate(c, u - self.total)
        return full.sample(rng)  # past the tail's true mass: a fresh draw from the exact distribution

    def dense(self) -> np.ndarray:
        return self.exact().dense()

    def without(self, token: int) -> "Dist | None":
        if not 0 <= token < self.n:  # not a token of this distribution: nothing to remove
            return self
        keep = self.idx != token
        if not keep.any():  # nothing near is left: the exact distribution says whether anything is
            return self.exact().without(token)
        return TailDist(self.n, self.idx[keep], self.w[keep], self.row, self.m, self.inv_t, self.bound,
                        self.excluded + (int(token),))

    def minus(self, q: Dist) -> "Dist | None":
        return self.exact().minus(q)


def distribution(row: np.ndarray, sp: SamplingParams) -> Dist:
    """One row of logits -> its distribution after temperature, top-k, top-p and min-p."""
    x = np.asarray(row)
    n = x.shape[0]
    if sp.min_p > 0:
        return _min_p(x, sp)
    if sp.top_p < 1.0 and not (sp.top_k and sp.top_k < n):
        return _top_p(x, sp)
    m = _finite_max(x)
    if sp.top_k and sp.top_k < n:
        idx = _top_k(x, m, sp.top_k)
        w = np.exp((x[idx].astype(np.float64) - float(m)) * (1.0 / sp.temperature))
        if sp.top_p < 1.0:  # then top-p over the k tokens' own mass
            idx, w = _cut(idx, w, sp.top_p, w.sum())
        return Dist(n, idx, w)
    inv_t = 1.0 / sp.temperature
    if n >= _LAZY_MIN and x.dtype == np.float32:  # temperature alone: the near tokens and a bound on the rest
        thr = np.float32(float(m) - math.log(n / _DENSE_EPS) * sp.temperature)
        near = np.flatnonzero(x >= thr)
        if near.shape[0] <= n // 4:  # more: the full pass costs about as much
            w = np.exp((x[near] - np.float32(m)) * np.float32(inv_t))
            # each token left out is below thr, so weighs under exp((thr - m) / T); its float32
            # weight rounds three times on the way (x - m, 1/T, the product): up to ~4e-6 above it
            # where the exponent is ~20, so 1e-5 of slack, and never below thr's own float32 weight
            at_thr = float(np.exp((thr - np.float32(m)) * np.float32(inv_t)))
            bound = (n - near.shape[0]) * max(math.exp((float(thr) - float(m)) * inv_t), at_thr) * (1 + 1e-5)
            return TailDist(n, near, w, x, m, inv_t, bound)
    w = np.exp((x.astype(np.float32, copy=False) - np.float32(m)) * np.float32(inv_t))
    return Dist(n, None, w)


def greedy_choice(logits: np.ndarray) -> np.ndarray:
    """``np.argmax(logits, axis=-1)`` of a row or of rows, -1 where the chosen logit is NaN or infinite: numpy
    takes the first NaN (and +inf) as the largest, so a model that overflowed decoded that token over and over,
    greedy, where sampling refuses its row (``_finite_max``). -1 equals no draft token: a verify call's rows past
    the first rejection are never read, and a NaN there changes nothing (plain decoding never computes them);
    where the output reads one, ``chosen`` raises."""
    top = np.argmax(logits, axis=-1)
    bad = ~np.isfinite(np.take_along_axis(logits, np.expand_dims(top, -1), -1)[..., 0])
    if bad.any():
        top = np.where(bad, -1, top)
    return top


def chosen(token) -> int:
    """A greedy choice the output takes (``greedy_choice``'s); ``BundleError`` for a row that had none."""
    t = int(token)
    if t < 0:
        raise BundleError("the model's logits hold NaN or an infinity at the largest: no greedy choice (a model that "
                          "overflows in its precision, or a broken graph)")
    return t


def _finite_max(x: np.ndarray):
    """The row's maximum; a row with a NaN or +inf (a model that overflowed) has no distribution."""
    m = x.max()
    if not np.isfinite(m):
        raise BundleError(f"the model's logits hold {'NaN' if np.isnan(m) else m} at "
                          f"token {int(np.argmax(x))}: no distribution to sample (a model that "
                          f"overflows in its precision, or a broken graph)")
    return m


def _min_p(x: np.ndarray, sp: SamplingParams) -> Dist:
    """Min-p after the other cuts: of the tokens they keep, those whose weight exp((x - max) / T), in
    float64 (the maximum's is 1), is at least ``min_p``. Top-k and top-p keep the likeliest tokens and
    weigh them so; temperature alone weighs only the tokens within T ln(1 / min_p) of the maximum
    (widened by float32's rounding of the threshold), which are all the cut can keep."""
    n = x.shape[0]
    if (sp.top_k and sp.top_k < n) or sp.top_p < 1.0:
        d = distribution(x, replace(sp, min_p=0.0))
        keep = d.w >= sp.min_p * float(d.w.max())
        return d if keep.all() else Dist(n, d.idx[keep], d.w[keep])
    m = _finite_max(x)
    gap = math.log(1.0 / sp.min_p) * sp.temperature  # (min_p 1: 0, the ties of the maximum)
    # a little below the cut: float32's rounding of it, and exp's of a weight a hair under 1 (a temperature of 1e6)
    thr = float(m) - gap - 1e-6 * (abs(float(m)) + gap) - 1e-12 * sp.temperature - 1e-30
    thr = np.float32(thr) if x.dtype != np.float64 else thr
    near = np.flatnonzero(x >= thr)
    w = np.exp((x[near].astype(np.float64) - float(m)) * (1.0 / sp.temperature))
    keep = w >= sp.min_p
    return Dist(n, near[keep], w[keep])


def _top_k(x: np.ndarray, m, k: int) -> np.ndarray:
    """The tokens at or above the k-th largest logit (ties at it all kept), found by a partial
    selection among the tokens near the maximum: those within a widening logit gap of it, until
    they are at least k (every token at or above the k-th value is then among them)."""
    near = None
    for gap in (4.0, 16.0, 64.0):
        cand = np.flatnonzero(x >= m - gap)
        if cand.shape[0] >= k:
            near = cand
            break
    vals = x if near is None else x[near]
    kth = np.partition(vals, vals.shape[0] - k)[vals.shape[0] - k]
    return np.flatnonzero(x >= kth) if near is None else near[vals >= kth]


def _cut(idx: np.ndarray, w: np.ndarray, top_p: float, total: float) -> tuple[np.ndarray, np.ndarray]:
    """Top-p over candidate tokens ``idx`` (vocabulary order) of weights ``w``, out of ``total``:
    the tokens a stable sort by descending weight puts first. The prefix sums depend only on the
    sorted values, so a plain sort of the values finds the count, and the kept tokens are those
    heavier than the last kept value plus the first of its ties in vocabulary order (a stable
    argsort of a flat row's ~100k candidates takes 15 ms here, sorting the values 1.8)."""
    sw = np.sort(w)[::-1]
    sel = _first(w, sw, _keep(sw, top_p, total))
    return idx[sel], w[sel]


def _first(w: np.ndarray, sw: np.ndarray, keep: int) -> np.ndarray:
    """Where the first ``keep`` of a stable sort of ``w`` by descending weight are, in vocabulary
    order (``sw``: w's values sorted descending): those heavier than the last kept value, then the
    first of its ties."""
    last = sw[keep - 1]
    kept = w > last
    kept[np.flatnonzero(w == last)[: keep - int(np.count_nonzero(kept))]] = True
    return np.flatnonzero(kept)


def _keep(sw: np.ndarray, top_p: float, total: float) -> int:
    """How many of the descending weights ``sw`` a top-p cut keeps: those with less than top_p of
    ``total`` before them (the token crossing top_p is kept)."""
    return max(int(np.count_nonzero(np.cumsum(sw) - sw < top_p * total)), 1)


def _top_p(x: np.ndarray, sp: SamplingParams) -> Dist:
    """Top-p alone: native (``edgespec/native/topp.cpp``, one call) or numpy (``_top_p_near``), the
    same cut and weights; where neither decides it near the cut, the exact pass over every token."""
    n = x.shape[0]
    fn = native.top_p_kernel() if x.dtype == np.float32 and x.flags.c_contiguous else None
    if fn is not None:
        out = getattr(_out, "bufs", None)
        if out is None:  # kept per thread (no fresh pages a token), with their addresses
            idx, w = np.empty(_NATIVE_CAP, dtype=np.int64), np.empty(_NATIVE_CAP, dtype=np.float64)
            out = _out.bufs = (idx, w, idx.ctypes.data, w.ctypes.data)
        idx, w, idx_p, w_p = out
        eps = np.asarray(_TAIL_EPS, dtype=np.float64)
        k = fn(x.ctypes.data, n, sp.temperature, sp.top_p, eps.ctypes.data, eps.shape[0], _NEAR_MAX, idx_p, w_p,
               _NATIVE_CAP)
        if k > 0:
            return Dist(n, idx[:k].copy(), w[:k].copy())
        if k == 0:
            return _top_p_full(x, x.max(), sp)
    m = _finite_max(x)
    d = _top_p_near(x, m, sp)
    return d if d is not None else _top_p_full(x, m, sp)


def _top_p_near(x: np.ndarray, m, sp: SamplingParams) -> Dist | None:
    """Top-p without a pass of exp over the vocabulary. Only the tokens whose weight (the
    maximum's is 1) is at least eps/n get one, so all the others together weigh under eps; a
    float32 exp sizes the near tokens, a float64 one weighs the likeliest, as the full pass does.
    The cut depends on what is not computed exactly only through the total; when the cut is the
    same at both ends of the total's range, it is the exact cut. The range is widened once
    (eps 1e-3, then 1e-7, ``_TAIL_EPS``); None: still undecided (the caller takes the full pass)."""
    n = x.shape[0]
    inv_t = 1.0 / sp.temperature
    for eps in _TAIL_EPS:
        thr = np.float32(float(m) - math.log(n / eps) * sp.temperature)
        near = np.flatnonzero(x >= thr)
        if near.shape[0] > _NEAR_MAX:
            return None
        e = np.exp((x[near].astype(np.float32) - np.float32(m)) * np.float32(inv_t))
        # each left-out token is below thr, so weighs under exp((thr - m) / T)
        tail = (n - near.shape[0]) * math.exp((float(thr) - float(m)) * inv_t) * (1 + 1e-9)
        z = float(e.sum(dtype=np.float64))
        # the likeliest first, widened while a token outside them could be inside the cut or the cut
        # is not the same at both ends of the total's range (the float32 weights outside them)
        for gap in (7.0, 14.0, 28.0, math.inf):
            sub = np.flatnonzero(e >= math.exp(-gap)) if gap < math.inf else np.arange(e.shape[0])
            w = np.exp((x[near[sub]].astype(np.float64) - float(m)) * inv_t)
            ws = w.sum()
            rest = max(z - float(e[sub].sum(dtype=np.float64)), 0.0)  # float32 weights: within 1e-4
            lo, hi = ws + rest * (1 - 1e-4), ws + rest * (1 + 1e-4) + tail
            if ws < sp.top_p * hi:
                continue
            sw = np.sort(w)[::-1]
            keep = _keep(sw, sp.top_p, lo)
            if _keep(sw, sp.top_p, hi) == keep:
                sel = _first(w, sw, keep)
                return Dist(n, near[sub][sel], w[sel])
    return None


def _top_p_full(x: np.ndarray, m, sp: SamplingParams) -> Dist:
    """Top-p with the tail's mass from one float32 exp pass over every token."""
    n = x.shape[0]
    inv_t = 1.0 / sp.temperature
    # candidates: tokens within a logit threshold of the maximum, widened until they hold top_p
    # of the mass (the tokens a top-p cut keeps are the most likely, so they are all inside)
    e = np.exp((x.astype(np.float32, copy=False) - np.float32(m)) * np.float32(inv_t))
    z = float(e.sum(dtype=np.float64))
    for gap in (7.0, 14.0, 28.0, 56.0, math.inf):  # e >= exp(-gap) in weight
        idx = np.flatnonzero(e >= math.exp(-gap)) if gap < math.inf else np.arange(n)
        if float(e[idx].sum(dtype=np.float64)) >= sp.top_p * z or gap == math.inf:
            break
    w = np.exp((x[idx].astype(np.float64) - float(m)) * inv_t)
    # the mass outside the candidates from the float32 pass; inside, float64
    total = w.sum() + max(z - float(e[idx].sum(dtype=np.float64)), 0.0)
    idx, w = _cut(idx, w, sp.top_p, total)
    return Dist(n, idx, w)


def probs(logits: np.ndarray, sp: SamplingParams) -> np.ndarray:
    """Rows of logits -> rows of probabilities (float64) after temperature, top-k, top-p and min-p."""
    x = np.asarray(logits)
    if x.ndim == 1:
        return distribution(x, sp).dense()
    return np.stack([distribution(r, sp).dense() for r in x])


def _inverse_cdf(w: np.ndarray, rng: np.random.Generator) -> int:
    """One index drawn from weights ``w`` (inverse CDF; robust to rounding)."""
    c = np.cumsum(w, dtype=np.float64)
    return _locate(c, rng.random() * c[-1])


def _locate(c: np.ndarray, u: float) -> int:
    """The index whose interval of the cumulative weights ``c`` holds ``u`` (the last one where
    rounding leaves u at or past the end)."""
    return min(int(np.searchsorted(c, u, side="right")), len(c) - 1)


def _fit(q: np.ndarray, n: int) -> np.ndarray:
    if q.shape[0] >= n:
        return q[:n]
    return np.concatenate([q, np.zeros(n - q.shape[0], dtype=q.dtype)])
