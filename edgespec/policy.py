"""The round policy: which drafter drafts this round, and how many tokens, from measured costs.

Every round, each drafter of the generation makes an ``Offer`` (up to how many tokens, under which
acceptance estimate); the policy prices each with the cost model (expected tokens per second of a
round with k draft tokens) and keeps the best, k = 0 (no speculation) included. Two rules keep it
honest: a costly drafter unused for ``probe_every`` rounds drafts one token (its estimate would
otherwise never recover), and where the target computes at least ``min_width`` positions a call
anyway (the exactness width policy, see lm.py and width.py), a round that would draft nothing takes a free drafter's
one-token guess for the spare position instead of padding it. The cost model learns from the
widths the target really ran. Acceptance is estimated per generation, each estimate starting from
what earlier generations learned with the weight of a few rounds (``carry``): a drafter that copied
the last request's document well is not trusted for twenty rounds of a request it cannot help.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from .drafters import Drafter, Offer
from .kv import TokenBuffer
from .width import padded_width


# Alternates (RoundPolicy.alternates): the kept-to-expected calibration's prior weight (positions),
# its decay a verified set, and its bounds
ALT_PRIOR = 4.0
ALT_DECAY = 0.98
ALT_SCALE = (0.25, 2.0)
ALT_PREMIUM_EMA = 0.2  # RoundPolicy.alt_premium's weight of a new sample
# ... which counts at most this share of a one-token call (an alternate is one row whose attention reads the keys a
# second time: ~0.1-1 ms of a 16-25 ms call on the Qwen 1.5B at 64-1,000 positions, session 66). A process's first
# call with alternates took 2x its width's price on the Zen 5 (11 ms an alternate), and a premium that prices
# alternates out is never measured again: one such sample turned them off for the process (session 66); so is a
# premium the last generation did not renew halved (RoundPolicy._relax_premium)
ALT_PREMIUM_MAX = 0.25
# a drafter step or target call counts at most this many times the estimate it updates: a stall (the OS,
# another process, a VM's host) of one drafter step at ~100x its cost otherwise priced the drafter out, and
# with no step drafted none was measured again (session 32); a real slow-down still moves an estimate up 1.3x
# a call (ema 0.3). (A read's line is fitted to reads of many lengths, and a stalled read's cost goes stale:
# RoundPolicy.catchup_trust.)
STALL_CLIP = 2.0
# the cost model's priors before anything is measured (``cost_priors`` fits them to a target and drafter): a verified
# token at PRIOR_SLOPE of a one-token call, a drafter step at PRIOR_STEP of one
PRIOR_SLOPE, PRIOR_STEP = 0.15, 0.4
LENGTHS_KEPT = 32  # the recent generations' lengths RoundPolicy.horizon reads (older ones weigh < 1e-4 of the newest)


@dataclass
class Acceptance:
    """Online estimate of the per-token acceptance rate (geometric model), with forgetting."""

    prior_accept: float = 1.2
    prior_reject: float = 0.8
    decay: float = 0.95
    accepted: float = 0.0
    rejected: float = 0.0
    samples: int = 0
    generation: int = 0  # a learned estimate: the generation that last updated it (RoundPolicy)

    def update(self, n_accepted: int, k: int) -> None:
        self.accepted = self.decay * self.accepted + n_accepted
        self.rejected = self.decay * self.rejected + (1 if n_accepted < k else 0)
        self.samples += 1

    @property
    def alpha(self) -> float:
        a = self.accepted + self.prior_accept
        return min(0.99, a / (a + self.rejected + self.prior_reject))


@dataclass
class CostModel:
    """Measured costs on this device: target call by width, a drafter's step, and the choice of k.

    Expected tokens from a round with k draft tokens and acceptance rate a is
    (1 - a^(k+1)) / (1 - a); its cost is k drafter steps plus one target call of width k+1 (at
    least ``min_width``). ``best_k`` maximizes tokens per second, k = 0 (no speculation) included.

    ``costs`` prices every width in one pass through ``_priced`` (what ``target_cost`` calls too,
    so ``target_cost`` is not an override point) and keeps ``padded``'s widths per (``min_width``,
    ``width_multiple``), on which an override of ``padded`` must depend alone.
    """

    ema: float = 0.3
    stall_clip: float = STALL_CLIP  # a call counts at most this many times the estimate it updates
    prior_slope: float = PRIOR_SLOPE  # extra cost per extra verified token, as a fraction of a 1-token call
    # the model drafter's step before one is measured, as a fraction of a 1-token call (another drafter's: PRIOR_STEP)
    prior_step_ratio: float = PRIOR_STEP
    # past this width (0: none) each more verified token costs ``prior_steep`` of a call, not ``prior_slope``: a
    # kernel whose extra rows hide under the weights' reads up to a few rows, compute-bound past them
    prior_knee: int = 0
    prior_steep: float = 0.0
    target: dict[int, float] = field(default_factory=dict)
    draft_steps: dict[str, float] = field(default_factory=dict)  # drafter name -> seconds a step
    # drafter name -> (seconds a read, seconds a context token) of reading the context before drafting
    # (a model drafter's catch-up: its prefill at its first draft of a generation, or the tokens
    # emitted while it sat idle), a line fitted to the recent reads: a read of a few tokens costs
    # about a drafter step, a prompt's ~1 ms a token (Qwen 0.5B drafter, session 12); one rate per
    # token, learned from both, priced a 470-token prompt at twice its cost and kept the drafter out
    catchup: dict[str, tuple[float, float]] = field(default_factory=dict)
    catchup_reads: dict[str, list[tuple[int, float]]] = field(default_factory=dict)  # recent (tokens, seconds)
    catchup_window: int = 32
    prior_catchup: float = 0.1  # ... before any is measured, as a fraction of a drafter step
    min_width: int = 1  # a target that always computes >= min_width positions costs that much at k = 0
    width_multiple: int = 1  # ... and a multiple of this many (a kernel computing rows in pairs: 2)

    _fit: tuple | None = field(default=None, repr=False, compare=False)  # (slope, intercept, floor) of target
    # target_cost by width, kept until a measurement or the width policy changes (best_k prices up to
    # kmax + 1 widths for every offer of every round: on a GPU, where a round takes ~1 ms, pricing
    # them afresh each time was a visible share of it)
    _costs: list | None = field(default=None, repr=False, compare=False)
    _costs_policy: tuple = field(default=(), repr=False, compare=False)
    _pads: list | None = field(default=None, repr=False, compare=False)  # [(min_width, multiple), padded(1), ...]

    def observe_target(self, width: int, seconds: float) -> None:
        """A target call of ``width`` tokens (padding included) took ``seconds``."""
        if not self._sample(seconds):
            return
        self.target[width] = self._smoothed(self.target.get(width), seconds)
        self._fit = None
        self._costs = None

    def costs(self, top: int) -> list:
        """``[None, target_cost(1), ..., target_cost(top)]`` (at least), cached. Rebuilt after every
        measured call (each round): the padded widths are kept per width policy and the line is
        fitted once (on a GPU's ~1 ms rounds the rebuild was a visible share of the policy's time)."""
        policy = (self.min_width, self.width_multiple, self.prior_slope, self.prior_knee, self.prior_steep,
                  id(self.target))
        c = self._costs
        if c is None or self._costs_policy != policy:
            c, self._costs_policy = [None], policy
            self._costs = c
        n = len(c)
        if n <= top:
            pads = self._pads
            if pads is None or pads[0] != policy[:2]:
                pads = self._pads = [policy[:2]]
            while len(pads) <= top:
                pads.append(self.padded(len(pads)))
            c.extend(self._priced(p) for p in pads[n: top + 1])
        return c

    def observe_draft(self, step_seconds: float, drafter: str = "model") -> None:
        """One step of ``drafter`` (a one-token call) took ``step_seconds``."""
        if self._sample(step_seconds):
            self.draft_steps[drafter] = self._smoothed(self.draft_steps.get(drafter), step_seconds)

    @staticmethod
    def _sample(seconds: float) -> bool:
        """A measurement the costs can take: finite and above zero (a clock passed to the decoder that
        reads 0 or NaN for a call would otherwise stick, or divide a rate by zero)."""
        return math.isfinite(seconds) and seconds > 0.0

    def _smoothed(self, old: float | None, seconds: float) -> float:
        """``old`` moved toward ``seconds`` by the EMA, a stall clipped at ``stall_clip`` times ``old``."""
        if old is None or not old > 0.0:
            return seconds
        return (1 - self.ema) * old + self.ema * min(seconds, self.stall_clip * old)

    def observe_catchup(self, tokens: int, seconds: float, drafter: str = "model") -> None:
        """``drafter`` read ``tokens`` context tokens in ``seconds`` before drafting."""
        if not (math.isfinite(seconds) and seconds >= 0.0):
            return
        reads = self.catchup_reads.setdefault(drafter, [])
        reads.append((max(1, int(tokens)), float(seconds)))
        del reads[:-self.catchup_window]
        self.catchup[drafter] = _affine(reads)

    def upfront_cost(self, tokens: int, drafter: str = "model", trust: float = 1.0) -> float:
        """Seconds ``drafter`` spends reading ``tokens`` context tokens before it can draft: the line
        fitted to its measured reads, or before any is measured ``prior_upfront``. ``trust`` < 1
        weighs the measured figure that much against the prior (a measurement no recent generation
        has renewed: RoundPolicy.catchup_trust)."""
        if tokens <= 0:
            return 0.0
        fit = self.catchup.get(drafter)
        if fit is None:
            return self.prior_upfront(tokens, drafter)
        measured = fit[0] + fit[1] * tokens
        if trust >= 1.0:
            return measured
        return trust * measured + (1.0 - trust) * self.prior_upfront(tokens, drafter)

    def prior_upfront(self, tokens: int, drafter: str = "model") -> float:
        """What a read of ``tokens`` is expected to cost before one is measured: a drafter step times
        what one more token in a call costs the target, relative to its one-token call (the drafter's
        arithmetic scales as the target's: on a compute-bound CPU a token read costs most of a step,
        not a tenth), at least ``prior_catchup``."""
        return max(tokens, 0) * max(self.prior_catchup, self.marginal()) * self.step_cost(drafter)

    def step_cost(self, drafter: str = "model") -> float:
        """Seconds a step of ``drafter``: as measured, before that ``prior_step``."""
        step = self.draft_steps.get(drafter)
        return self.prior_step(drafter) if step is None else step

    def prior_step(self, drafter: str = "model") -> float:
        """What a step of ``drafter`` is expected to cost before one is measured, as a share of a one-token target
        call: the model drafter's ``prior_step_ratio`` (PRIOR_STEP unless the decoder knows better: ``cost_priors``),
        any other's PRIOR_STEP."""
        return (self.prior_step_ratio if drafter == "model" else PRIOR_STEP) * self.target_cost(1)

    def marginal(self) -> float:
        """One more token in a target call, as a fraction of a one-token call, from the measured
        widths (0 until two widths are measured)."""
        if len(self.target) < 2:
            return 0.0
        slope, _, _ = self._line()
        return slope / max(self.target_cost(1), 1e-9)

    def padded(self, width: int) -> int:
        """The width a call of ``width`` tokens really runs under the target's width policy."""
        return padded_width(width, self.min_width, self.width_multiple)

    def target_cost(self, width: int) -> float:
        return self._priced(self.padded(width))

    def _prior(self, width: int) -> float:
        """A call of ``width`` tokens before any is measured, in one-token calls: ``prior_slope`` a token, past
        ``prior_knee`` (where set) ``prior_steep`` a token."""
        if self.prior_knee and width > self.prior_knee:
            return 1.0 + self.prior_slope * (self.prior_knee - 1) + self.prior_steep * (width - self.prior_knee)
        return 1.0 + self.prior_slope * (width - 1)

    def _priced(self, width: int) -> float:
        """The cost of a call that runs ``width`` tokens (already padded): as measured, else on the
        line fitted to what was (one width measured: the prior's shape, scaled to it), else the prior."""
        v = self.target.get(width)
        if v is not None:
            return v
        if not self.target:
            return self._prior(width)
        if len(self.target) == 1:
            (w0, c0), = self.target.items()
            return c0 * self._prior(width) / self._prior(w0)
        slope, icpt, floor = self._line()
        return max(icpt + slope * width, floor)

    def _line(self) -> tuple[float, float, float]:
        """(slope, intercept, floor) of the target's cost by width, fitted to what was measured (two widths or
        more: with one, ``_priced`` scales the prior's shape to it); refitted only when a measurement changed
        (choose() prices many widths a round)."""
        if self._fit is None:  # (plain floats: numpy's arrays cost more than the fit at these sizes)
            widths = [float(w) for w in sorted(self.target)]
            costs = [float(self.target[int(w)]) for w in widths]
            slope, icpt = _least_squares(widths, costs)
            self._fit = (max(slope, 0.0), icpt, min(costs))
        return self._fit

    @staticmethod
    def expected_tokens(alpha: float, k: int) -> float:
        if alpha >= 1.0:
            return k + 1.0
        return (1 - alpha ** (k + 1)) / (1 - alpha)

    def rate(self, alpha: float, k: int, draft_cost: bool, drafter: str = "model", saved: float = 0.0,
             extra: float = 0.0) -> float:
        """Expected tokens per second of a round with ``k`` draft tokens. A hinted draft
        (``Choice.hint``) is expected to skip ``saved`` of its steps (at most k - 1: its first call
        runs) and pays ``extra`` steps for its first call's added rows."""
        step = self.step_cost(drafter) if draft_cost else 0.0
        steps = k - min(saved, max(k - 1, 0)) + (extra if k else 0.0)
        return self.expected_tokens(alpha, k) / (self.target_cost(k + 1) + steps * step)

    def best_k(self, alpha: float, kmax: int, draft_cost: bool, drafter: str = "model", saved: float = 0.0,
               extra: float = 0.0, first: float | None = None) -> tuple[int, float]:
        """The k in 0..kmax with the best ``rate`` (the same figures, priced in one pass). ``first``: the
        draft's first token is kept at this rate, the later ones at ``alpha`` (a draft that ends on the
        drafter's confidence: RoundPolicy.choose)."""
        step = self.step_cost(drafter) if draft_cost else 0.0
        costs = self.costs(kmax + 1)
        best = (0, self.expected_tokens(alpha, 0) / costs[1])
        for k in range(1, kmax + 1):
            steps = k - min(saved, max(k - 1, 0)) + extra
            y = self.expected_tokens(alpha, k) if first is None else 1.0 + first * self.expected_tokens(alpha, k - 1)
            r = y / (costs[k + 1] + steps * step)
            if r > best[1]:
                best = (k, r)
        return best

    @staticmethod
    def amortized(rate: float, upfront_s: float, horizon: float) -> float:
        """Tokens per second over the next ``horizon`` tokens of a drafter that drafts at ``rate``
        once it has paid ``upfront_s`` seconds (its catch-up) first."""
        if upfront_s <= 0 or rate <= 0:
            return rate
        return horizon / (upfront_s + horizon / rate)


# the cost priors where the target's verify rows are cheap (edgespec's INT4 kernels on an AVX-512 CPU: ``cheap_rows``):
# a verified token at 0.06 of a one-token call (the Qwen 1.5B on session 57's Zen 5: widths 1-6 within 1.16x of a
# one-token call at a 64-token context, 1.39x at 1,500; 8 tokens 1.56x-2.0x), and a drafter step at its weights'
# share of the target's (decoding reads every weight once a token) plus a tenth for the call's own overhead
CHEAP_ROWS_SLOPE = 0.06
CHEAP_ROWS_KNEE, CHEAP_ROWS_STEEP = 6, 0.2  # ... and past 6 tokens 0.2 a token (8: 1.7x, 12: 2.5x; measured 1.56-2.0x
# and 2.36-2.88x at 64 and 1,500 positions)
STEP_OVERHEAD = 1.1
STEP_RATIO_RANGE = (0.1, 0.6)


def cost_priors(target, drafter_lm=None) -> dict:
    """The cost model's priors for ``target`` and the model drafter's LM (RoundPolicy's ``prior_slope``,
    ``prior_knee``, ``prior_steep`` and ``prior_step_ratio``): CostModel's defaults (PRIOR_SLOPE and PRIOR_STEP, a
    guess for any CPU, no knee) unless the target's verify rows are cheap (``cheap_rows``: edgespec's kernels on an
    AVX-512 CPU, which is memory-bound there and a call's cost follows the bytes of weights it reads): then a
    verified token at CHEAP_ROWS_SLOPE up to CHEAP_ROWS_KNEE tokens and CHEAP_ROWS_STEEP past them, and, where the
    model drafter runs on the CPU too, its step at its weights over the target's (without their token tables, read
    a row a token), times STEP_OVERHEAD. What a seeded sampled generation prices every round at (it measures
    nothing: session 65 found the defaults kept the Qwen 0.5B drafter out of most seeded T = 1 generations on this
    Zen 5, where its step is 0.31 of a call and 4 verified tokens cost one)."""
    out = dict(prior_slope=PRIOR_SLOPE, prior_step_ratio=PRIOR_STEP)
    if not getattr(target, "cheap_rows", False):
        return out
    out.update(prior_slope=CHEAP_ROWS_SLOPE, prior_knee=CHEAP_ROWS_KNEE, prior_steep=CHEAP_ROWS_STEEP)
    if getattr(drafter_lm, "device", "cpu") != "cpu":  # (a drafter on a GPU: its step is no share of the bytes)
        return out
    t, d = getattr(target, "spec", None), getattr(drafter_lm, "spec", None)

    def streamed(spec) -> float:
        return float(spec.gpu_weight_bytes - (getattr(spec, "embedding_bytes", 0) or 0))

    try:
        ratio = streamed(d) / streamed(t)
    except (AttributeError, TypeError, ZeroDivisionError):
        return out
    if ratio > 0 and math.isfinite(ratio):
        out["prior_step_ratio"] = min(max(ratio * STEP_OVERHEAD, STEP_RATIO_RANGE[0]), STEP_RATIO_RANGE[1])
    return out


def _least_squares(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line through the points (at least two distinct xs):
    what ``np.polyfit(xs, ys, 1)`` computes, without its ~0.1 ms of overhead a call."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) * (x - mx) for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    return slope, my - slope * mx


def _affine(reads: list[tuple[int, float]]) -> tuple[float, float]:
    """(seconds a read, seconds a token) fitted to reads of (tokens, seconds): least squares where
    the reads have at least two lengths and the fit is physical (both terms >= 0), else all of the
    time per token."""
    n = np.array([r[0] for r in reads], dtype=float)
    s = np.array([r[1] for r in reads], dtype=float)
    if np.unique(n).size >= 2:
        per, fixed = np.polyfit(n, s, 1)
        if per > 0 and fixed >= 0:
            return float(fixed), float(per)
    return 0.0, float(s.sum() / n.sum())


# A hint (Choice.hint) makes the costly drafter's first call of a round carry more rows: on the 0.5B
# Qwen drafter (this Xeon) each row past the first costs ~0.08 of a one-token step up to 8 rows, ~0.11
# past them (session 15, the L2 prefetch in, which made one row cheaper than several: 1 row 11.35 ms,
# 2 rows 12.2, 3 12.9, 5 14.9, 8 17.7, 16 27.8; session 14: 12.3, 12.8, -, 14.7, 16.8, 26.7, ~0.05 a
# row); a little more per call keeps the hints that would save next to nothing out
HINT_CALL_COST = 0.05
HINT_ROW_COST = 0.08


def hint_length(alpha: float, available: int) -> int:
    """How many tokens of a free drafter's guess (accepted at ``alpha`` a token, as estimated) a
    costly drafter should check in its first call: the h that maximizes the steps it expects to
    save (each hint token it agrees with, through the first it does not: alpha + alpha^2 + ... +
    alpha^h, ``hint_saved``) less what the call's extra rows cost (in steps); 0 where no h gains."""
    best_h, best_gain = 0, 0.0
    for h in range(1, available + 1):
        gain = hint_saved(alpha, h) - (HINT_CALL_COST + HINT_ROW_COST * h)
        if gain > best_gain:
            best_h, best_gain = h, gain
        if alpha ** h < 0.01:
            break
    return best_h


def hint_saved(alpha: float, h: int) -> float:
    """Steps a hint of ``h`` tokens, each agreed with at ``alpha``, is expected to save: alpha +
    alpha^2 + ... + alpha^h (the tokens a round of h drafts yields, less its bonus)."""
    return CostModel.expected_tokens(alpha, h) - 1.0


@dataclass(frozen=True)
class Choice:
    drafter: Drafter | None  # None: no draft this round
    k: int = 0  # draft tokens (a dynamic draft: at most this many)
    key: str = "none"
    stop: float | None = None  # a dynamic draft's threshold (drafters.Offer.dynamic), None: draft k
    hint: tuple[int, ...] = ()  # a free drafter's guess that a costly drafter (takes_hint) checks in its first call
    hint_stop: float | None = None  # a dynamic draft's threshold where the next token's logits are computed already
    probe: bool = False  # a one-token probe of a costly drafter left unused (its token is a first token too)


NO_DRAFT = Choice(None)

# A costly drafter's dynamic draft (one that ends on its confidence) is priced with its first token kept at what its
# rounds' first tokens were (the estimate of key + FIRST_KEY), the later ones at the key's own estimate. That
# estimate (kept tokens against rounds with a rejection) is mostly the tokens past the first, drafted only where
# the drafter is confident and then kept almost always: on the Qwen pair (session 52, an AVX2 Zen 3) it said
# 0.80-0.85 where the first draft token was kept at 0.60-0.70, most rounds ended after that one token, and the
# model drafter, priced at ~48 tok/s where its rounds made ~44, read whole prompts of summaries its reads never
# repaid (`auto` 1.052x / 1.087x plain before, 1.098x / 1.123x after, A/B in one process; summaries 1.49x / 1.57x
# before, 1.72x / 1.87x after)
FIRST_KEY = "@1"


class RoundPolicy:
    """Chooses each round's drafter and draft length; learns costs and acceptance across
    generations (they describe the device and the models, not one prompt)."""

    # whether a hint is priced into a model drafter's round where it must read the context first (its first draft of
    # a generation): the rule predates hints at a first read (c63203e); scripts/ab_hint_first_read.py times both
    hint_first_reads = False

    def __init__(self, probe_every: int = 64, carry: float = 4.0, stale_half_life: float = 2.0,
                 share_prior: float = 1.0, use_alternates: bool = False, prior_slope: float = PRIOR_SLOPE,
                 prior_step_ratio: float = PRIOR_STEP, prior_knee: int = 0, prior_steep: float = 0.0):
        # the cost model's priors (a verified token's and the model drafter's step's share of a one-token call):
        # what a reproducible (seeded sampled) generation prices every round at, and any generation before a
        # measurement; ``cost_priors`` fits them to a target and drafter
        for name, v in (("prior_slope", prior_slope), ("prior_step_ratio", prior_step_ratio),
                        ("prior_steep", prior_steep)):
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and 0.0 <= v <= 4.0):
                raise ValueError(f"{name} must be a number in 0..4, got {v!r}")
        if isinstance(prior_knee, bool) or not isinstance(prior_knee, int) or prior_knee < 0:
            raise ValueError(f"prior_knee must be a width >= 0 (0: none), got {prior_knee!r}")
        if prior_knee and prior_steep < prior_slope:
            raise ValueError(f"prior_steep ({prior_steep}) must be at least prior_slope ({prior_slope}) past a knee")
        self.priors = dict(prior_slope=float(prior_slope), prior_step_ratio=float(prior_step_ratio),
                           prior_knee=prior_knee, prior_steep=float(prior_steep))
        self.measured = CostModel(**self.priors)  # what this device's calls took, across generations
        # acceptance estimates, across generations: greedy ones and sampled ones apart (a point-mass
        # draft token is accepted with the target's probability of it when sampling, only where it is
        # the argmax when greedy: what greedy decoding learned overstates what sampling will accept)
        self.learned: dict[str, Acceptance] = {}
        self.learned_sampled: dict[str, Acceptance] = {}
        # a costly drafter's estimates from the generations that asked for free drafters beside it (``auto``), apart
        # from those that asked for it alone (``--drafter model``, in ``learned``): beside them it drafts only the
        # rounds their copies do not cover, the hard ones, and what it keeps there says little of what it keeps on
        # every round (session 64: after a few ``auto`` summaries whose left-over rounds it lost, ``--drafter
        # model`` priced its first tokens at those rounds' 0.23, never read the prompt and drafted nothing for a
        # generation; a drafter that must read the context first is never probed, so it learned nothing either).
        # The other way, what it keeps alone overstates what it keeps on ``auto``'s left-over rounds.
        self.learned_mixed: dict[str, Acceptance] = {}
        self.learned_mixed_sampled: dict[str, Acceptance] = {}
        self.carry = carry  # how many rounds' weight the learned estimate has in a new generation
        # a learned estimate no generation has updated for a while counts for less, by half every
        # ``stale_half_life`` generations, in favour of the offer's prior: a drafter that must read the
        # context before drafting (the model drafter) is never probed mid-generation, so without this
        # one bad request would keep it out of every later one (it was, in session 11's bench)
        self.stale_half_life = stale_half_life
        self._generation = 0
        self.cost = self.measured  # what the current generation uses
        self.acceptance: dict[str, Acceptance] = {}  # this generation's estimates
        self._carried = self.learned  # where they start from and what they teach (none: reproducible)
        self._carried_costly = self.learned  # ... the costly drafters' (_carried, or the mixed ones: begin)
        self._timed = True
        self.probe_every = probe_every
        self._want: list[Drafter] = []  # the drafters the generation asked for, in order
        self._free: list[Drafter] = []  # free drafters that may fill a wide call's spare position
        self._idle: dict[str, int] = {}  # costly drafter -> rounds since it last drafted
        self._started: set[str] = set()  # costly drafters that drafted in this generation
        self._read_at: dict[str, int] = {}  # costly drafter -> the generation of its last measured catch-up
        self._stepped_at: dict[str, int] = {}  # drafter -> the generation of its last measured step
        self._shadow: list[tuple[str, list[int], int]] = []  # free guesses not drafted: (key, tokens, at)
        # tokens the recent generations' rounds produced, the newest last (horizon reads them)
        self._lengths: deque[int] = deque(maxlen=LENGTHS_KEPT)
        self._produced = 0  # ... in this generation so far
        self._free_kept = 0  # ... of which draft tokens of free drafters the target kept
        self.length_ema = 0.3  # the newest length's weight in horizon (each older one weighs 1 - length_ema times less)
        # a costly drafter's reads are priced against the share of rounds it would win once caught up
        # (costly_share); share_prior: the rounds' weight of the prior share (1) there
        if not (share_prior > 0 and np.isfinite(share_prior)):
            raise ValueError(f"share_prior must be a positive number of rounds, got {share_prior}")
        self.share_prior = share_prior
        # rounds of this generation with both kinds of drafter asked in which a costly drafter offered k > 0
        self._rounds = 0
        self._costly_rounds = 0  # ... in which a caught-up costly drafter's offer beat every free offer
        self._mixed = False  # the generation asked for costly and free drafters both (set by begin)
        # alternates (see alternates()): how the kept ones compare with the drafter's second-choice
        # probabilities, decayed sums (kept, expected) from a prior of ALT_PRIOR positions at 1
        if use_alternates not in (True, False) or isinstance(use_alternates, float):  # (0 and 1 too)
            raise ValueError(f"use_alternates must be True or False, got {use_alternates!r}")
        # rounds verify alternates where they pay (greedy; sampled since session 39, +3-6% at T = 0.7 on AMX): the
        # decoder turns them on where the target's extra verify rows are cheap (edgespec's AVX-512 paths: greedy
        # +2-8% on the AMX Xeon in session 38, +2.7-5.1% on a Zen 4's VNNI in session 40, where session 26's code had
        # measured them within the noise; docs/how-it-works.md, "Alternates")
        self.use_alternates = bool(use_alternates)
        # greedy generations' and sampled ones' apart (their second-choice figures mean different things)
        self._alt_calibs = {False: [ALT_PRIOR, ALT_PRIOR], True: [ALT_PRIOR, ALT_PRIOR]}
        self._alt_calib = self._alt_calibs[False]
        self._alt_pending = 0.0  # the expected kept alternates of the set alternates() chose last
        # seconds an alternate adds to a call beyond what a causal row of that width adds (its attention is a
        # pass of its own over the keys: ~0.8 ms a call at 300 positions on the Qwen 1.5B, growing with the
        # context), an average over this process's calls with alternates (None: none measured yet, 0 assumed)
        self.alt_premium: float | None = None
        self._premium_at = 0  # the generation of its last sample

    def begin(self, drafter: str, drafters: dict[str, Drafter], min_width: int,
              reproducible: bool = False, width_multiple: int = 1, sampled: bool = False,
              also: Sequence[str] = ()) -> list[Drafter]:
        """Start a generation with ``drafter`` (a name, ``auto`` or ``none``); returns the drafters
        it may use, to be begun. ``reproducible``: the choices may depend only on this generation's
        tokens, never on timings or earlier generations (a seeded sampled generation must give the
        same output every time: its random draws follow the rounds), so the generation starts from
        the priors (costs and acceptance) and learns acceptance from its own rounds only. ``sampled``:
        the generation samples (its acceptance is learned apart from greedy generations'). ``also``: drafters
        the generation uses beside the one asked for, unless that is ``none`` (a request's prediction),
        considered before the others."""
        if self._timed and self._produced:  # the last generation's length, for pricing catch-ups
            self._lengths.append(self._produced)
        self._produced = 0
        self._free_kept = 0
        self._rounds = self._costly_rounds = 0
        self._generation += 1
        self._relax_steps()
        self._relax_premium()
        self._timed = not reproducible
        self._alt_calib = self._alt_calibs[bool(sampled)]
        # acceptance is judged per generation: each estimate starts from what earlier generations
        # learned (weighed as ``carry`` rounds) and the generation's own rounds soon outweigh it,
        # so a drafter good on one kind of request is not trusted on the next kind for long
        self.acceptance = {}
        if reproducible:
            self.cost, self._carried, mixed = CostModel(**self.priors), {}, {}
        else:
            self.cost, self._carried = self.measured, self.learned_sampled if sampled else self.learned
            mixed = self.learned_mixed_sampled if sampled else self.learned_mixed
        if drafter == "none":
            self._want = []
        else:
            self._want = list(drafters.values()) if drafter == "auto" else [drafters[drafter]]
            # first: where offers price the same (two copies of one text, both at the estimate's 0.99 cap),
            # the earlier wins, and a request's prediction follows the reply by position, the others by n-gram
            first = [drafters[n] for n in also if n in drafters]
            self._want = first + [d for d in self._want if d not in first]
        self._free = [d for d in drafters.values() if not d.has_cost] if self._want else []
        self._idle = {d.name: 0 for d in self._want if d.has_cost}
        self._mixed = bool(self._idle) and any(not d.has_cost for d in self._want)
        self._carried_costly = mixed if self._mixed else self._carried
        self._started = set()
        self._shadow = []
        self.cost.min_width, self.cost.width_multiple = min_width, width_multiple
        for d in drafters.values():
            if hasattr(d, "history"):  # a drafter with memory of earlier generations (suffix.py, the model's calibration)
                d.history = not reproducible
            if hasattr(d, "records"):  # the suffix drafter keeps a generation only where it was asked for (suffix,
                d.records = d in self._want  # auto): one that fills spare slots under model or prompt-lookup does not
        return self._want + [d for d in self._free if d not in self._want]

    def estimate(self, offer: Offer, costly: bool = False) -> Acceptance:
        """This generation's estimate for ``offer.key``: the offer's prior the first time the key
        is seen, later what earlier generations learned, scaled to ``carry`` rounds of weight
        (``costly``: a costly drafter's offer, learned apart where free drafters were asked beside it)."""
        est = self.acceptance.get(offer.key)
        if est is None:
            prior = offer.prior
            old = (self._carried_costly if costly else self._carried).get(offer.key) if offer.carry else None
            if old is not None:
                a = old.alpha
                idle = self._generation - 1 - old.generation  # earlier generations that did not learn it
                if idle > 0:  # back toward the offer's prior
                    w = 0.5 ** (idle / self.stale_half_life)
                    a = w * a + (1 - w) * offer.prior_alpha
                prior = (self.carry * a, self.carry * (1 - a))
            est = self.acceptance[offer.key] = Acceptance(*prior)
        return est

    def _update(self, key: str, n_accepted: int, k: int, costly: bool = False) -> None:
        """A round's outcome (or a free guess scored): into this generation's estimate and the
        learned one (``costly``: of a costly drafter, see ``estimate``)."""
        est = self.acceptance.get(key)
        if est is not None:
            est.update(n_accepted, k)
        if self._timed:  # not a reproducible generation: teach the generations to come
            store = self._carried_costly if costly else self._carried
            old = store.get(key)
            if old is None:
                old = store[key] = Acceptance(*(est.prior_accept, est.prior_reject) if est else ())
            old.update(n_accepted, k)
            old.generation = self._generation

    def choose(self, ctx: TokenBuffer, kcap: int, fixed: int | None, max_draft: int) -> Choice:
        """The drafter and k for the next round: at most ``kcap`` tokens fit; ``fixed`` is a fixed
        draft length (None: adaptive, up to ``max_draft``)."""
        kmax = min(kcap, fixed if fixed is not None else max_draft)
        self._score_shadows(ctx)
        if kmax <= 0 or not self._want:
            return NO_DRAFT
        best, best_rate = NO_DRAFT, self.cost.rate(0.0, 0, False)
        # every offer with this generation's estimate for it (made here if new: a peek's key is read below)
        offers = [(d, o, self.estimate(o, d.has_cost)) for d in self._want for o in (d.offer(ctx, kmax),)
                  if o is not None]
        # the free drafters' guesses: scored on what the target emits where they are not drafted
        # (shadows), and the likeliest one a hint that a costly drafter checks in its first call
        peeks: dict[int, tuple[list[int], str]] = {}
        hint, hint_alpha = (), -1.0
        for d, offer, _ in offers:
            if not d.has_cost and hasattr(d, "peek"):
                tokens, key = d.peek(ctx, kmax)
                if not tokens:
                    continue
                peeks[id(d)] = (tokens, key)
                a = self.acceptance[key].alpha if key in self.acceptance else 0.0
                if a > hint_alpha or (a == hint_alpha and len(tokens) > len(hint)):
                    hint, hint_alpha = tuple(tokens), a
        h = hint_length(hint_alpha, len(hint)) if hint else 0
        hint = hint[:h]
        saved = hint_saved(hint_alpha, h) if h else 0.0
        free_best, costly_best = 0.0, 0.0  # this round's best free rate and best caught-up costly rate
        for d, offer, est in offers:
            alpha = est.alpha
            if offer.upfront and d.has_cost and d.name not in self._started:
                # a costly drafter that must read the context before its first draft of the generation
                # is judged at no less than its prior: what earlier generations taught mixes other
                # kinds of request (a drafter poor on chat is good on summaries), and a drafter that
                # never drafts in a generation never learns what it is worth there (session 12: at
                # T = 0.7, after a few chat requests, --drafter model stopped drafting summaries at all).
                # Not its first token's estimate (FIRST_KEY): floored too, it read prompts its rounds
                # did not repay (session 52); an estimate no generation renews relaxes to the prior
                alpha = max(alpha, offer.prior_alpha)
            hinted = bool(hint) and d.has_cost and getattr(d, "takes_hint", False) and (
                self.hint_first_reads or not offer.upfront)
            sv, extra = (saved, HINT_CALL_COST + HINT_ROW_COST * h) if hinted else (0.0, 0.0)
            if fixed is not None:
                k, r = offer.max_tokens, self.cost.rate(alpha, offer.max_tokens, d.has_cost, d.name, sv, extra)
            else:
                k, r = self.cost.best_k(alpha, offer.max_tokens, d.has_cost, d.name, sv, extra)
            rate = r  # (a dynamic draft's stop threshold prices a token kept at this rate)
            if d.has_cost and offer.dynamic and fixed is None:
                # a round that ends on the drafter's confidence: its first token kept as its first tokens were
                # (FIRST_KEY), the later ones at alpha; whether it drafts at all is priced so too
                first = self.estimate(replace(offer, key=offer.key + FIRST_KEY), True).alpha
                k1, r = self.cost.best_k(alpha, offer.max_tokens, True, d.name, sv, extra, first=first)
                if k == 0:  # (on the estimate alone no draft pays: its stop prices a token at the draft's own rate)
                    rate = r
                k = k1
            if k > 0 and d.has_cost:
                costly_best = max(costly_best, r)
            elif k > 0:
                free_best = max(free_best, r)
            if offer.upfront:  # a catch-up first: worth it only if the rounds it will draft repay it
                upfront = self.cost.upfront_cost(offer.upfront, d.name, self.catchup_trust(d.name))
                # (the horizon reads the recent lengths: only for a round where an offer must catch up)
                r = self.cost.amortized(r, upfront, self.horizon(kcap) * min(self.uncovered(), self.costly_share()))
            if k > 0 and (r > best_rate or (fixed is not None and best.k == 0)):
                if offer.dynamic and fixed is None:  # the drafter ends the draft on its confidence
                    best = Choice(d, offer.max_tokens, offer.key, self.stop_threshold(alpha, rate, d.name))
                else:
                    best = Choice(d, k, offer.key)
                best_rate = r
        if self._mixed and costly_best > 0.0:  # (a costly drafter with nothing to offer says nothing of its share)
            self._rounds += 1
            self._costly_rounds += costly_best > free_best
        for d, _, _ in offers:  # the free drafters not chosen are scored on what the target emits
            if id(d) in peeks and d is not best.drafter:
                tokens, key = peeks[id(d)]
                if key in self.acceptance:
                    self._shadow.append((key, tokens, len(ctx)))
        if hint and best.drafter is not None and getattr(best.drafter, "takes_hint", False):
            best = replace(best, hint=hint, hint_stop=None if best.stop is None else
                           best.stop * self.hinted_share(best.drafter.name))
        if fixed is None:
            for d in self._want:  # probe a costly drafter left unused too long
                if d is not best.drafter and self._idle.get(d.name, 0) >= self.probe_every:
                    offer = d.offer(ctx, 1)
                    if offer is not None and not offer.upfront:  # a probe is one cheap step, not a prefill
                        self.estimate(offer, d.has_cost)
                        if d.has_cost and offer.dynamic:
                            self.estimate(replace(offer, key=offer.key + FIRST_KEY), True)
                        return Choice(d, 1, offer.key, probe=True)
        if best.k == 0 and self.cost.padded(1) > 1:
            fill, fill_alpha = NO_DRAFT, -1.0
            for d in self._free:  # the target computes a second position anyway: fill it
                offer = d.offer(ctx, 1)
                if offer is not None and self.estimate(offer).alpha > fill_alpha:
                    fill, fill_alpha = Choice(d, 1, offer.key), self.estimate(offer).alpha
            if fill.drafter is not None:
                return fill
        return best

    def _relax_steps(self) -> None:
        """A drafter's measured step cost above the prior (``CostModel.prior_step``) that the last generation did
        not renew moves half the way to it. A drafter priced out by its step cost drafts no more steps, so none
        is measured again: a slow spell of the drafter alone (or stalls past the clip, ``CostModel.stall_clip``)
        would keep it out of the process; relaxed, it drafts again once the prior says it pays, and that step
        re-measures the cost. (An estimate below the prior never keeps a drafter out by its cost: kept.)"""
        steps = self.measured.draft_steps
        for name, at in self._stepped_at.items():
            prior = self.measured.prior_step(name)
            if at < self._generation - 1 and steps.get(name, 0.0) > prior:
                steps[name] = 0.5 * (steps[name] + prior)

    def _relax_premium(self) -> None:
        """An alternate's premium (``alt_premium``) the last generation did not renew is halved: a premium that
        prices alternates out is never measured again (no call has them), so one slow call (the process's first
        with alternates, a stall) would keep them out of the process; halved, they are verified again once they
        pay at it, and those calls re-measure it."""
        if self.alt_premium and self._premium_at < self._generation - 1:
            self.alt_premium *= 0.5

    def catchup_trust(self, drafter: str) -> float:
        """How far this generation trusts ``drafter``'s measured catch-up cost over the prior: fully
        in the generation after the read that measured it, then half as much every
        ``stale_half_life`` generations without a new read. A drafter priced out by its reads is never
        started, so never reads again: one slow read (a first call that paid the session's set-up, a
        stall) would otherwise keep it out of every later generation (session 19: `auto` stopped
        drafting code after the drafter's first read had paid its kernel's weight copy). Relaxing
        toward the prior lets it start again, and that read re-measures the cost."""
        if not self._timed:
            return 1.0
        idle = self._generation - 1 - self._read_at.get(drafter, self._generation - 1)
        return 1.0 if idle <= 0 else 0.5 ** (idle / self.stale_half_life)

    def costly_share(self) -> float:
        """The share of this generation's rounds a costly drafter would draft once it has read the
        context: of the rounds so far in which it offered to draft (k > 0; with free drafters asked too),
        those in which its offer, priced without the read, beat every free drafter's, with
        ``share_prior`` rounds of weight at 1. A read is repaid only by the rounds it
        then wins: on a summary or a question over a document the suffix drafter and prompt lookup
        offer copies that beat the model drafter's rate in most rounds, and a 128-token first read
        (~155 ms on session 25's Zen 4) bought it one or two rounds; ``uncovered`` (the tokens free
        drafters kept) counts their rejected rounds as the model drafter's, which they were not."""
        return (self._costly_rounds + self.share_prior) / (self._rounds + self.share_prior)

    def uncovered(self) -> float:
        """The share of this generation's tokens that free drafters did not draft (1 at its start):
        what is left for a costly drafter that must read the context before it drafts. Where a
        memory or prompt lookup drafts most of a reply (a code edit, an answer quoting its
        document), a catch-up priced against the whole rest of the generation looked repaid, and
        the free drafters then drafted most of the rounds it was meant for (session 12)."""
        return 1.0 - self._free_kept / self._produced if self._produced else 1.0

    def stop_threshold(self, alpha: float, rate: float, drafter: str) -> float:
        """Where a dynamic draft ends: one more draft token costs a drafter step and one more
        verified position (``c + m`` seconds) and is kept with probability ``P * alpha`` (``P``: the
        drafter's confidence that the draft so far survives, the product of its top probabilities;
        ``alpha``: the next token's acceptance, as learned); a token kept is worth ``1 / rate``
        seconds (what it costs at the rate this drafter decodes at). So drafting goes on while
        ``P > (c + m) * rate / alpha``. On the Qwen pair (session 12's teacher-forced probe, README)
        this came to ~0.5 and beat a fixed length with a per-token stop by ~6% greedy and ~7% at
        temperature 0.7; the optimum is flat from 0.45 to 0.7."""
        extra = self.cost.marginal() * self.cost.target_cost(1)
        return min(0.95, max(0.05, (self.cost.step_cost(drafter) + extra) * rate / max(alpha, 0.05)))

    def hinted_share(self, drafter: str) -> float:
        """What one more draft token costs where the drafter agreed with the hint so far (its next
        logits came with the hint: one more verified position, ``m``), as a share of what it costs
        elsewhere (a drafter step too, ``c + m``): the stop threshold scales by it, so a draft runs on
        through a hint the drafter agrees with (a copy the model confirms) while it is likely enough
        to repay one more verified position."""
        extra = self.cost.marginal() * self.cost.target_cost(1)
        return extra / max(self.cost.step_cost(drafter) + extra, 1e-9)

    def horizon(self, kcap: int) -> float:
        """Tokens this generation is expected still to produce: what is left of its budget (``kcap`` +
        1), at most what the recent generations that ran longer than this one has so far went on to
        produce beyond this point (their average, the newest weighing most; never in a reproducible
        generation), and at least 16 more. Past every recent length, as many again as it has produced.

        Only the generations that ran past this point say how far it goes on: an average of all of them
        (before session 32) came out below what a long generation had produced once a few short ones had
        passed (a chat front end asks for a title and tags after each reply), and from there it priced the
        model drafter's read against 16 tokens for the rest of the generation, so a long reply after
        short ones never started it."""
        left = float(kcap + 1)
        if self._timed and self._lengths:
            n, w, total, weight = self._produced, 1.0, 0.0, 0.0
            for length in reversed(self._lengths):
                if length > n:
                    total += w * (length - n)
                    weight += w
                w *= 1.0 - self.length_ema
            left = min(left, max(total / weight if weight else float(n), 16.0))
        return left

    def _score_shadows(self, ctx: TokenBuffer) -> None:
        """Free drafters' guesses that were not drafted, scored now that the context holds what
        the target emitted after them: the matched prefix is what they would have had accepted (a
        point-mass draft token is accepted with the probability the target emits it)."""
        for key, tokens, at in self._shadow:
            emitted = len(ctx) - at
            if emitted > 0:
                k = min(len(tokens), emitted)
                got = ctx[at: at + k]
                n = next((i for i in range(k) if got[i] != tokens[i]), k)
                self._update(key, n, k)
        self._shadow = []

    def alternate_scale(self) -> float:
        """How far the drafter's second-choice probabilities under- (> 1) or overstate (< 1) how
        often the target keeps an alternate, within ALT_SCALE (learned apart for greedy and sampled
        generations; 1 in a reproducible one, which learns nothing from the others)."""
        if not self._timed:
            return 1.0
        kept, expected = self._alt_calib
        return min(ALT_SCALE[1], max(ALT_SCALE[0], kept / max(expected, 1e-9)))

    def alternates(self, k: int, alts: Sequence[tuple], room: int, draft_s: float) -> list[tuple[int, int]]:
        """Which of a draft's alternates (``Draft.alts``: per draft token i, (i, second choice or None,
        calibrated top probability, the chance its alternate is kept where the draft reaches i)) the
        target verifies beside the draft, as (i, token), at most ``room``. An alternate at i is kept
        where the draft's first i tokens are and its token i is not (greedy: the second choice is the
        target's; sampled: the rejection rule takes it, ``rejection_sample_alternates``, and the token is
        drawn then, None here): the target then keeps one token more. Expected, that is reach(i) times
        that chance (scaled by ``alternate_scale``), reach(i) the product of the top probabilities
        before i. Taken from the likeliest down while the token it is expected to add, valued at the
        round's expected seconds a token (``draft_s`` of drafting and the target's call over the
        draft's expected yield), pays for the wider call (the measured costs by width). A reproducible
        generation prices the drafting at the cost model's prior step and no premium: its choices
        depend on its own tokens alone."""
        if room <= 0 or not alts:
            return []
        scale = self.alternate_scale()
        reach, chain = 1.0, 1.0
        cands = []
        for i, tok, top, q2 in alts:
            cands.append((reach * q2 * scale, i, None if tok is None else int(tok)))
            reach *= top
            chain += reach
        costs = self.cost.costs(k + 1 + min(room, len(cands)))
        if not self._timed:
            draft_s = k * self.cost.prior_step()
        per_token = (costs[k + 1] + draft_s) / chain
        premium = (self.alt_premium or 0.0) if self._timed else 0.0
        chosen: list[tuple[int, int]] = []
        expected, w = 0.0, k + 1
        for value, i, tok in sorted(cands, key=lambda c: (c[0], c[1]), reverse=True):
            if len(chosen) >= room or value * per_token <= max(0.0, costs[w + 1] - costs[w]) + premium:
                break
            chosen.append((i, tok))
            expected += value
            w += 1
        self._alt_pending = expected / scale
        return chosen

    def observe_alternates(self, kept: bool, count: int = 0, width: int = 0, seconds: float = 0.0) -> None:
        """The alternates ``alternates`` chose were verified: one was kept or none; ``count`` of them
        in a call of ``width`` rows that took ``seconds`` (what it took beyond a call of causal rows of
        that width, per alternate, is ``alt_premium``'s sample)."""
        if self._timed and count > 0 and width > 0 and math.isfinite(seconds):
            extra = min(max(0.0, seconds - self.cost.target_cost(width)) / count,
                        ALT_PREMIUM_MAX * self.cost.target_cost(1))
            self._premium_at = self._generation
            old = self.alt_premium
            self.alt_premium = extra if old is None else (1 - ALT_PREMIUM_EMA) * old + ALT_PREMIUM_EMA * extra
        expected = self._alt_pending
        self._alt_pending = 0.0
        if kept:
            self._produced += 1
        if expected <= 0.0 or not self._timed:
            return
        c = self._alt_calib
        c[0] = ALT_DECAY * c[0] + (1.0 if kept else 0.0)
        c[1] = ALT_DECAY * c[1] + expected

    def observe(self, choice: Choice, tokens: Sequence[int], n_accepted: int, step_s: float | None,
                width: int, seconds: float, catchup: tuple[int, float] | None = None, alternates: int = 0) -> None:
        """A round ran: the chosen drafter drafted ``tokens`` (a step took ``step_s``, after reading
        ``catchup`` = (tokens, seconds) of context first), the target kept ``n_accepted`` of them in
        a call of ``width`` tokens that took ``seconds`` (``alternates`` of them alternates: such a call
        teaches ``alt_premium``, see observe_alternates, not the costs by width)."""
        self._produced += n_accepted + 1
        if tokens and choice.drafter is not None and not choice.drafter.has_cost:
            self._free_kept += n_accepted
        if self._timed:
            if not alternates:
                self.cost.observe_target(width, seconds)
            if catchup is not None and choice.drafter is not None:
                name = choice.drafter.name
                if self.catchup_trust(name) < 1.0:  # the first read after the measured cost went stale: it
                    self.cost.catchup_reads.pop(name, None)  # replaces the old reads, not joins them (one slow
                    # read left in the fit would price the drafter out again at once)
                self.cost.observe_catchup(catchup[0], catchup[1], name)
                self._read_at[name] = self._generation
        if tokens:
            costly = choice.drafter is not None and choice.drafter.has_cost
            self._update(choice.key, n_accepted, len(tokens), costly)
            if (choice.stop is not None or choice.probe) and costly:
                self._update(choice.key + FIRST_KEY, min(n_accepted, 1), 1, True)  # (its first token: choose)
            if costly:
                self._started.add(choice.drafter.name)
        if self._timed and choice.drafter is not None and step_s is not None:
            self.cost.observe_draft(step_s, choice.drafter.name)
            self._stepped_at[choice.drafter.name] = self._generation
        for name in self._idle:
            self._idle[name] = 0 if choice.drafter is not None and choice.drafter.name == name else self._idle[name] + 1
