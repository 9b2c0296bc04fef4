"""Drafters: something cheap that proposes the next tokens for the target to verify.

Protocol (after llama.cpp's speculative boundary): ``begin(prompt)``, ``propose(context, k)``,
``accept(n_accepted)``, ``stats``. A drafter that returns probabilities (``Draft.probs``) gets the
full rejection-sampling rule; one that returns none is treated as a point mass (see verify.py).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np

from .onnx_lm import OnnxLM
from .sampling import SamplingParams, probs, sample


@dataclass
class Draft:
    tokens: list[int]
    probs: np.ndarray | None = None  # [len(tokens), vocab] processed q, or None (deterministic)


@dataclass
class DrafterStats:
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    seconds: float = 0.0
    calls: int = 0


class Drafter(Protocol):
    name: str
    has_cost: bool  # drafting costs model calls (True) or is nearly free (False)
    stats: DrafterStats

    def begin(self, prompt: Sequence[int]) -> None: ...

    def propose(self, context: Sequence[int], k: int, sp: SamplingParams, rng: np.random.Generator) -> Draft: ...

    def accept(self, n_accepted: int) -> None: ...


class ModelDrafter:
    """A small LM with its own KV cache. It catches up on accepted tokens lazily: ``propose``
    syncs its cache to the context (common prefix kept, the rest fed in one call), so rejected
    draft tokens are rolled back in O(1) and the corrected/bonus token is fed with the next draft."""

    name = "model"
    has_cost = True

    def __init__(self, lm: OnnxLM, target_vocab: int, min_confidence: float = 0.0):
        self.lm = lm
        self.target_vocab = target_vocab
        # stop a draft early once the drafter's own top probability falls below this: an unsure
        # drafter is mostly rejected, and every step saved is a drafter call saved (0 = never stop)
        self.min_confidence = min_confidence
        self.last_step_s: float | None = None  # seconds per drafter step in the last propose()
        self.clock = time.perf_counter  # the decoder sets its own (tests simulate time)
        self.stats = DrafterStats()

    def prefill(self, prompt: Sequence[int]) -> None:
        """Bring the cache to the prompt (all but its last token, which the first draft feeds)."""
        if len(prompt) > 1:
            self.lm.sync(prompt[:-1])

    def begin(self, prompt: Sequence[int]) -> None:
        pass  # the cache is synced on the first propose; a shared prefix from an earlier turn is kept

    def room(self, context_len: int) -> int:
        return self.lm.max_context - context_len

    def propose(self, context, k, sp, rng) -> Draft:
        k = min(k, self.room(len(context)) + 1)
        if k <= 0:
            return Draft([])
        t0 = self.clock()
        calls0 = self.lm.calls
        logits = self.lm.sync(context)
        t_sync = self.clock() - t0
        # the step cost the decoder's cost model learns: one-token steps, and the catch-up call only
        # when it is the usual one or two tokens (a long catch-up is a prefill, not a step)
        step_time, steps = (t_sync, 1) if self.lm.last_fed <= 2 else (0.0, 0)
        tokens: list[int] = []
        rows = []
        for i in range(k):
            row = logits[: self.target_vocab]
            if sp.greedy:
                tok = int(np.argmax(row))
            else:
                q = probs(row, sp)
                tok = sample(q, rng)
                rows.append(q)
            tokens.append(tok)
            if i < k - 1:
                if self.min_confidence > 0 and _top_prob(row) < self.min_confidence:
                    break  # the decision uses only the drafter's state: any stopping rule keeps exactness
                t1 = self.clock()
                logits = self.lm.forward([tok])[-1]
                step_time += self.clock() - t1
                steps += 1
        self.last_step_s = step_time / steps if steps else None
        self.stats.seconds += self.clock() - t0
        self.stats.calls += self.lm.calls - calls0
        self.stats.rounds += 1
        self.stats.drafted += len(tokens)
        return Draft(tokens, np.stack(rows) if rows else None)

    def accept(self, n_accepted: int) -> None:
        self.stats.accepted += n_accepted


def _top_prob(logits: np.ndarray) -> float:
    """The largest softmax probability of a row of logits."""
    m = float(logits.max())
    return 1.0 / float(np.exp(logits - m, dtype=np.float32).sum())


class PromptLookupDrafter:
    """Prompt lookup (n-gram) drafting with no model: find the latest earlier occurrence of the
    context's last n tokens (n from ``max_ngram`` down to ``min_ngram``) and propose what followed it."""

    name = "prompt-lookup"
    has_cost = False

    def __init__(self, min_ngram: int = 1, max_ngram: int = 3, max_draft: int = 16):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.max_draft = max_draft
        self.stats = DrafterStats()
        self._buf = np.zeros(0, dtype=np.int64)
        self._n = 0

    def begin(self, prompt: Sequence[int]) -> None:
        self._n = 0

    def _sync(self, context: Sequence[int]) -> np.ndarray:
        n = len(context)
        if n > self._buf.shape[0]:
            grown = np.zeros(max(n, 2 * self._buf.shape[0], 256), dtype=np.int64)
            grown[: self._n] = self._buf[: self._n]
            self._buf = grown
        # context only grows within a generation; re-copy what may have changed (a short tail)
        start = max(0, min(self._n, n) - 32)
        self._buf[start:n] = np.asarray(context[start:n], dtype=np.int64)
        self._n = n
        return self._buf[:n]

    def lookup(self, context: Sequence[int], k: int) -> list[int]:
        return self.lookup_match(context, k)[0]

    def lookup_match(self, context: Sequence[int], k: int) -> tuple[list[int], int]:
        """(proposed tokens, length of the n-gram that matched); ([], 0) without a match. A longer
        match predicts a higher acceptance, so the decoder keeps one estimate per match length."""
        k = min(k, self.max_draft)
        if k <= 0:
            return [], 0
        arr = self._sync(context)
        n = arr.shape[0]
        for size in range(min(self.max_ngram, n - 1), self.min_ngram - 1, -1):
            pattern = arr[n - size:]
            hay = arr[: n - 1]  # a match must be followed by at least one token
            if hay.shape[0] < size:
                continue
            windows = np.lib.stride_tricks.sliding_window_view(hay, size)
            hits = np.flatnonzero((windows == pattern).all(axis=1))
            hits = hits[hits + size < n]  # exclude the suffix itself
            if hits.size:
                start = int(hits[-1]) + size
                return [int(t) for t in arr[start: start + k]], size
        return [], 0

    def propose(self, context, k, sp, rng) -> Draft:
        t0 = time.perf_counter()
        tokens = self.lookup(context, k)
        self.stats.seconds += time.perf_counter() - t0
        if tokens:
            self.stats.rounds += 1
            self.stats.drafted += len(tokens)
        return Draft(tokens)

    def accept(self, n_accepted: int) -> None:
        self.stats.accepted += n_accepted


@dataclass
class Acceptance:
    """Online estimate of the per-token acceptance rate (geometric model), with forgetting."""

    prior_accept: float = 1.2
    prior_reject: float = 0.8
    decay: float = 0.95
    accepted: float = 0.0
    rejected: float = 0.0
    samples: int = 0

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
    """Measured costs on this device: target call by width, drafter step, and the choice of k.

    Expected tokens from a round with k draft tokens and acceptance rate a is
    (1 - a^(k+1)) / (1 - a); its cost is k drafter steps plus one target call of width k+1.
    ``best_k`` maximizes tokens per second, k = 0 (no speculation) included.
    """

    ema: float = 0.3
    prior_slope: float = 0.15  # extra cost per extra verified token, as a fraction of a 1-token call
    target: dict[int, float] = field(default_factory=dict)
    draft_step: float | None = None
    min_width: int = 1  # a target that always computes >= min_width positions costs that much at k = 0

    def observe_target(self, width: int, seconds: float) -> None:
        old = self.target.get(width)
        self.target[width] = seconds if old is None else (1 - self.ema) * old + self.ema * seconds

    def observe_draft(self, step_seconds: float) -> None:
        """One drafter step (a one-token call) took ``step_seconds``."""
        old = self.draft_step
        self.draft_step = step_seconds if old is None else (1 - self.ema) * old + self.ema * step_seconds

    def target_cost(self, width: int) -> float:
        width = max(width, self.min_width)
        if width in self.target:
            return self.target[width]
        if not self.target:
            return 1.0 + self.prior_slope * (width - 1)
        widths = np.array(sorted(self.target), dtype=float)
        costs = np.array([self.target[int(w)] for w in widths])
        if len(widths) >= 2:
            slope, icpt = np.polyfit(widths, costs, 1)
            slope = max(slope, 0.0)
            return max(icpt + slope * width, costs.min())
        w0, c0 = widths[0], costs[0]
        base = c0 / (1 + self.prior_slope * (w0 - 1))
        return base * (1 + self.prior_slope * (width - 1))

    @staticmethod
    def expected_tokens(alpha: float, k: int) -> float:
        if alpha >= 1.0:
            return k + 1.0
        return (1 - alpha ** (k + 1)) / (1 - alpha)

    def rate(self, alpha: float, k: int, draft_cost: bool) -> float:
        step = (self.draft_step if self.draft_step is not None else 0.4 * self.target_cost(1)) if draft_cost else 0.0
        return self.expected_tokens(alpha, k) / (self.target_cost(k + 1) + k * step)

    def best_k(self, alpha: float, kmax: int, draft_cost: bool) -> tuple[int, float]:
        best = (0, self.rate(alpha, 0, draft_cost))
        for k in range(1, kmax + 1):
            r = self.rate(alpha, k, draft_cost)
            if r > best[1]:
                best = (k, r)
        return best
