"""Logit bias and repetition penalties (OpenAI's ``logit_bias``, ``presence_penalty``,
``frequency_penalty``; vLLM's and llama.cpp's ``repetition_penalty``), applied to the target's logits
before greedy choice, temperature and top-k/top-p, as vLLM applies them:

1. ``logit_bias``: ``bias[t]`` added to token t's logit at every position;
2. ``repetition_penalty`` r: every token that appears in the prompt or the reply so far has its logit
   divided by r where it is positive, multiplied by r where it is not;
3. ``frequency_penalty`` f and ``presence_penalty`` p: token t's logit less ``f * count(t) + p * (count(t) > 0)``,
   counts over the reply so far.

A target-only decoder applies them at each position with the reply before it; a verify call's row i
stands after the reply and the draft's first i tokens, so ``Penalizer.rows`` counts those in for that row.
The acceptance rule then compares the drafter's q with this processed target distribution: outputs stay
exactly those of target-only decoding with the same settings (greedy token for token, sampled in
distribution: tests/test_penalties.py). Logprobs stay the model's own (before these, as before temperature).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


class Penalizer:
    """The processing of one generation: ``rows(logits, draft)`` for a call's rows, ``consume(tokens)`` as
    the reply grows."""

    def __init__(self, vocab: int, prompt: Sequence[int], logit_bias: Sequence[tuple[int, float]] = (),
                 presence: float = 0.0, frequency: float = 0.0, repetition: float = 1.0):
        self.vocab = vocab
        self.bias = None
        if logit_bias:
            self.bias = np.zeros(vocab, dtype=np.float32)
            for t, b in logit_bias:
                self.bias[int(t)] += np.float32(b)
        self.presence, self.frequency, self.repetition = float(presence), float(frequency), float(repetition)
        self.counts: dict[int, int] = {}  # the reply's tokens
        self.seen: set[int] = set(int(t) for t in prompt) if self.repetition != 1.0 else set()

    def rows(self, logits: np.ndarray, draft: Sequence[int] = ()) -> np.ndarray:
        """A processed float32 copy of ``logits`` (rows of ``vocab``): row i as after the reply and ``draft[:i]``."""
        out = np.array(logits[:, : self.vocab], dtype=np.float32, copy=True)
        counts, seen = self.counts, self.seen
        for i in range(len(out)):
            if i:  # the draft's tokens before this row, counted in (copies: the reply's own stay as they are)
                if i == 1:
                    counts, seen = dict(counts), set(seen)
                t = int(draft[i - 1])
                counts[t] = counts.get(t, 0) + 1
                if self.repetition != 1.0:
                    seen.add(t)
            self._apply(out[i], counts, seen)
        return out

    def _apply(self, row: np.ndarray, counts: dict[int, int], seen: set[int]) -> None:
        if self.bias is not None:
            row += self.bias
        if self.repetition != 1.0 and seen:
            idx = np.fromiter(seen, dtype=np.int64, count=len(seen))
            v = row[idx]
            row[idx] = np.where(v > 0, v / np.float32(self.repetition), v * np.float32(self.repetition))
        if counts and (self.frequency or self.presence):
            idx = np.fromiter(counts.keys(), dtype=np.int64, count=len(counts))
            c = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
            row[idx] -= np.float32(self.frequency) * c + np.float32(self.presence)

    def consume(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            t = int(t)
            self.counts[t] = self.counts.get(t, 0) + 1
            if self.repetition != 1.0:
                self.seen.add(t)
