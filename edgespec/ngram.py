"""Token n-gram indexes with counts: what the suffix drafter looks continuations up in.

A context of the last ``n`` tokens (n = 1..``ORDERS``) is hashed, nearest token first:
``h = ((h ^ (t + 1)) * P) mod 2**64`` for t = x[-1], x[-2], ..., so the hashes of every order of one
suffix come out of one pass, and the top 39 bits name the context. Each index maps a context to the
counts of the tokens that followed it; ``best`` returns the most frequent continuation of the
longest context it holds (ties: the most recent, for ``LiveIndex``).

- ``LiveIndex``: the current prompt and output, Python dicts, O(ORDERS) per appended token.
- ``NgramTable``: a store's sequences (earlier outputs, documents) as one sorted int64 array of
  ``context << 24 | next`` keys with int32 counts: 12 bytes per (context, next) pair, a lookup of
  every order in one ``searchsorted``, adding or evicting a sequence of L tokens costs its
  O(L * ORDERS) pairs plus one O(size) merge copy, with no Python object per entry.

Hash collisions only make a draft worse, never an output: the target verifies every token.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

ORDERS = 8  # longest context matched
P = 0x9E3779B97F4A7C15
SEED = 0x243F6A8885A308D3
MASK = (1 << 64) - 1
NEXT_BITS = 24  # token ids below 2**24 (Qwen: 151,936)
MAX_TOKEN = 1 << NEXT_BITS


def context_keys(tail: Sequence[int], orders: int = ORDERS) -> list[int]:
    """The context ids of the last 1..orders tokens of ``tail`` (index n - 1: order n)."""
    out, h = [], SEED
    for i in range(1, min(orders, len(tail)) + 1):
        h = ((h ^ (int(tail[-i]) + 1)) * P) & MASK
        out.append(h >> (64 - 39))
    return out


class LiveIndex:
    """The n-grams of one growing token sequence (a generation's prompt and output)."""

    def __init__(self, orders: int = ORDERS):
        self.orders = orders
        self.tokens: list[int] = []
        # context -> [best token, its count, {token: count}], the counts None while one token followed the context
        # (most contexts of a long prompt, past the shortest orders: the dict of each was ~60% of the index's memory,
        # ~3 KB a token, 94 MiB for a 32k-token prompt, on session 53's measure)
        self._next: dict[int, list] = {}

    def __len__(self) -> int:
        return len(self.tokens)

    def clear(self) -> None:
        self.tokens = []
        self._next = {}

    def extend(self, ids: Sequence[int]) -> None:
        toks, table, orders = self.tokens, self._next, self.orders
        for t in ids:
            t = int(t)
            h = SEED
            for i in range(1, min(orders, len(toks)) + 1):
                h = ((h ^ (toks[-i] + 1)) * P) & MASK
                key = h >> 25
                e = table.get(key)
                if e is None:
                    table[key] = [t, 1, None]
                elif e[2] is None and e[0] == t:
                    e[1] += 1
                else:
                    counts = e[2]
                    if counts is None:
                        counts = e[2] = {e[0]: e[1]}
                    c = counts[t] = counts.get(t, 0) + 1
                    if c >= e[1]:  # ties go to the most recent continuation
                        e[0], e[1] = t, c
            toks.append(t)

    def best(self, keys: Sequence[int], min_order: int = 1) -> tuple[int, int, int] | None:
        """(order, token, count) of the longest context in ``keys`` this index holds (of at least
        ``min_order`` tokens), or None."""
        table = self._next
        for n in range(len(keys), min_order - 1, -1):
            e = table.get(keys[n - 1])
            if e is not None:
                return n, e[0], e[1]
        return None

    @property
    def nbytes(self) -> int:
        return 8 * len(self.tokens) + 150 * len(self._next)  # rough: Python objects (measured with tracemalloc)


def sequence_keys(seqs: Sequence[np.ndarray], orders: int = ORDERS) -> np.ndarray:
    """Every (context, next) key of ``seqs`` (int64, unsorted, with repeats)."""
    seqs = [np.asarray(s, dtype=np.int64) for s in seqs if len(s) > 1]
    if not seqs:
        return np.zeros(0, dtype=np.int64)
    tok = np.concatenate(seqs)
    if tok.min() < 0 or tok.max() >= MAX_TOKEN:
        raise ValueError(f"token ids must be in 0..{MAX_TOKEN - 1}")
    lengths = np.array([len(s) for s in seqs])
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    pos = np.arange(tok.shape[0]) - starts  # position inside its sequence
    t1 = tok.astype(np.uint64) + np.uint64(1)
    h = np.full(tok.shape[0], SEED, dtype=np.uint64)
    out = []
    with np.errstate(over="ignore"):
        for n in range(1, orders + 1):
            if tok.shape[0] <= n:
                break
            h[n:] = (h[n:] ^ t1[:-n]) * np.uint64(P)  # h[p]: the context tok[p-1] ... tok[p-n]
            ok = pos[n:] >= n
            if not ok.any():
                break
            ctx = (h[n:][ok] >> np.uint64(25)).astype(np.int64)
            out.append((ctx << NEXT_BITS) | tok[n:][ok])
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


class NgramTable:
    """Sorted (context, next) keys with counts over a set of token sequences."""

    def __init__(self, orders: int = ORDERS):
        self.orders = orders
        self.keys = np.zeros(0, dtype=np.int64)
        self.counts = np.zeros(0, dtype=np.int32)

    def __len__(self) -> int:
        return self.keys.shape[0]

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.counts.nbytes

    def clear(self) -> None:
        self.keys = np.zeros(0, dtype=np.int64)
        self.counts = np.zeros(0, dtype=np.int32)

    def add(self, seqs: Sequence[np.ndarray], sign: int = 1) -> None:
        """Count the n-grams of ``seqs`` in (``sign`` -1: take them out again)."""
        k, c = np.unique(sequence_keys(seqs, self.orders), return_counts=True)
        if not k.shape[0]:
            return
        idx = np.searchsorted(self.keys, k)
        found = idx < self.keys.shape[0]
        found[found] = self.keys[idx[found]] == k[found]
        if sign > 0:
            np.add.at(self.counts, idx[found], c[found].astype(np.int32))
            if not found.all():
                self.keys = np.insert(self.keys, idx[~found], k[~found])
                self.counts = np.insert(self.counts, idx[~found], c[~found].astype(np.int32))
        else:
            np.subtract.at(self.counts, idx[found], c[found].astype(np.int32))
            keep = self.counts > 0
            if not keep.all():
                self.keys, self.counts = self.keys[keep], self.counts[keep]

    def best(self, keys: Sequence[int], min_order: int = 1) -> tuple[int, int, int] | None:
        """(order, token, count) of the longest context in ``keys`` this table holds (of at least
        ``min_order`` tokens), or None."""
        m = len(keys) - min_order + 1
        if m <= 0 or not self.keys.shape[0]:
            return None
        q = np.array(keys[min_order - 1:], dtype=np.int64) << NEXT_BITS
        b = np.searchsorted(self.keys, np.concatenate([q, q + MAX_TOKEN])).tolist()
        for i in range(m - 1, -1, -1):
            a, z = b[i], b[m + i]
            if z > a:
                j = a + int(self.counts[a:z].argmax()) if z - a > 1 else a
                return i + min_order, int(self.keys[j]) & (MAX_TOKEN - 1), int(self.counts[j])
        return None


SIGNATURE_ORDER = 4  # a prompt's signature: the hashes of its 4-grams ...
SIGNATURE_TOKENS = 256  # ... over its last 256 tokens (a chat prompt ends with the request)


def prompt_signature(prompt: Sequence[int], order: int = SIGNATURE_ORDER,
                     last: int = SIGNATURE_TOKENS) -> np.ndarray:
    """The sorted, unique hashes (int64, 39 bits) of the ``order``-grams of the last ``last`` tokens
    of ``prompt``: what the memory compares to find the earlier requests a prompt repeats."""
    a = np.asarray(prompt, dtype=np.int64)[-last:]
    if a.shape[0] < order:
        return np.zeros(0, dtype=np.int64)
    m = a.shape[0] - order + 1
    t1 = a.astype(np.uint64) + np.uint64(1)
    h = np.full(m, SEED, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(order):
            h = (h ^ t1[j: j + m]) * np.uint64(P)
    return np.unique((h >> np.uint64(25)).astype(np.int64))
