"""Logit processing shared by the target and the drafter: temperature, top-k, top-p."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means off
    top_p: float = 1.0

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ConfigError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:  # also refuses nan
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs(logits: np.ndarray, sp: SamplingParams) -> np.ndarray:
    """Rows of logits -> rows of probabilities after temperature, top-k and top-p (float64)."""
    x = np.asarray(logits, dtype=np.float64)
    squeeze = x.ndim == 1
    x = np.atleast_2d(x) / sp.temperature
    if sp.top_k and sp.top_k < x.shape[-1]:
        kth = np.partition(x, -sp.top_k, axis=-1)[:, -sp.top_k][:, None]
        x = np.where(x < kth, -np.inf, x)
    x = x - x.max(axis=-1, keepdims=True)
    p = np.exp(x)
    p /= p.sum(axis=-1, keepdims=True)
    if sp.top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, axis=-1)
        cum = np.cumsum(sorted_p, axis=-1)
        # keep the smallest prefix whose mass reaches top_p (the token crossing it is kept)
        drop_sorted = (cum - sorted_p) >= sp.top_p
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, axis=-1)
        p = np.where(drop, 0.0, p)
        p /= p.sum(axis=-1, keepdims=True)
    return p[0] if squeeze else p


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one index from a probability row (inverse CDF; robust to rounding)."""
    c = np.cumsum(p)
    u = rng.random() * c[-1]
    return int(min(np.searchsorted(c, u, side="right"), len(p) - 1))
