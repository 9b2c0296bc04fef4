"""The prompt cache: copies of a target's KV cache rows in host memory, keyed by the token ids they hold.

A model's KV cache holds one sequence; a prompt that shares a prefix with it keeps that prefix
(``CausalLM.prefill``) and the rest is recomputed. A second conversation, or a side request between
two turns of one (a title, a summary of the chat), replaces the cached sequence, and the next turn
of the first conversation then prefills its whole history again: seconds a thousand tokens on a
laptop CPU. The prompt cache keeps what is about to be overwritten: before a prefill discards cached
rows (the new prompt leaves them), the cache's content is copied here, and a later prompt that
shares a longer prefix with a kept copy than with the live cache gets those rows copied back before
its prefill. Nothing else changes: the rows copied back are the bytes the model computed for those
ids, so a restored conversation continues as it would have had nothing come between.

Entries live in an LRU order within a byte budget. A sequence that extends a kept one replaces it
(the longer holds the shorter's rows); one that a kept sequence extends is not stored again. A
sequence larger than the whole budget keeps its first rows (the system prompt and the document
are the part later prompts share). CPU caches only (``KVCache.host``): a GPU cache's rows stay on
the device.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

# Fewer cached tokens than this are not worth a copy (a prefill of them is a few target calls).
MIN_TOKENS = 16


@dataclass
class _Entry:
    ids: np.ndarray  # int64 [n]
    rows: list[np.ndarray]  # per KV buffer (layer x key/value): [kv_heads, n, head_dim], a copy

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.rows) + self.ids.nbytes


class PromptCache:
    """Kept KV rows of earlier sequences, at most ``budget`` bytes. Thread-safe (one lock)."""

    def __init__(self, budget: int, min_tokens: int = MIN_TOKENS):
        if budget < 0:
            raise ValueError(f"a prompt cache budget must be >= 0 bytes, got {budget}")
        self.budget = int(budget)
        self.min_tokens = max(1, int(min_tokens))
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # key -> entry, least recently used first
        self._key = 0
        self._lock = threading.Lock()
        self.saves = self.restores = self.evictions = 0
        self.restored_tokens = 0

    # -- what is kept ---------------------------------------------------------------------------
    def _bytes(self) -> int:  # (under the lock)
        return sum(e.nbytes for e in self._entries.values())

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def stats(self) -> dict:
        """``restored_tokens``: positions restores added to what the live cache held (Stats.restored_prompt_tokens)."""
        with self._lock:
            return {"entries": len(self._entries), "tokens": int(sum(e.ids.size for e in self._entries.values())),
                    "bytes": self._bytes(), "budget": self.budget, "saves": self.saves, "restores": self.restores,
                    "restored_tokens": self.restored_tokens, "evictions": self.evictions}

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    @staticmethod
    def row_bytes(cache) -> int:
        """Bytes one position takes in a copy of ``cache`` (every layer's key and value)."""
        return sum(a.shape[1] * a.shape[3] * a.itemsize for a in cache.host)

    # -- the two operations ---------------------------------------------------------------------
    def match(self, ids: Sequence[int] | np.ndarray) -> tuple[int | None, int]:
        """(key, length) of the kept sequence sharing the longest prefix with ``ids``; (None, 0) if none."""
        ids = np.asarray(ids, dtype=np.int64)
        best, best_n = None, 0
        with self._lock:
            for key, e in self._entries.items():
                n = min(e.ids.size, ids.size)
                if n <= best_n:
                    continue
                diff = np.flatnonzero(e.ids[:n] != ids[:n])
                m = int(diff[0]) if diff.size else n
                if m > best_n:
                    best, best_n = key, m
        return best, best_n

    def save(self, cache, keep: int | None = None) -> bool:
        """Keep a copy of what ``cache`` holds (its ids and their rows), within the budget, evicting
        the least recently used entries but ``keep`` (an entry about to be restored); True if kept."""
        if not cache.host:
            return False
        n = cache.length
        per = self.row_bytes(cache) + 8  # (+ the id)
        ids = cache.ids.view()
        with self._lock:
            kept = self._entries.get(keep)
            n = min(n, (self.budget - (kept.nbytes if kept is not None else 0)) // per)  # its first rows at most
            if n < self.min_tokens:
                return False
            ids = ids[:n]
            for key, e in list(self._entries.items()):
                if e.ids.size >= n and np.array_equal(e.ids[:n], ids):  # already kept (or a longer one)
                    self._entries.move_to_end(key)
                    return False
                if e.ids.size < n and key != keep and np.array_equal(ids[: e.ids.size], e.ids):  # this extends it
                    del self._entries[key]
            need, used = n * per, self._bytes()
            for key in [k for k in self._entries if k != keep]:  # least recently used first
                if used + need <= self.budget:
                    break
                used -= self._entries.pop(key).nbytes
                self.evictions += 1
            rows = [a[0, :, :n].copy() for a in cache.host]  # (a copy: a slice may be contiguous, and a view)
            self._key += 1
            self._entries[self._key] = _Entry(ids.copy(), rows)
            self.saves += 1
        return True

    def restore(self, key: int, n: int, cache, have: int = 0) -> int:
        """Copy the first ``n`` rows of entry ``key`` into ``cache`` (which then holds exactly those
        ids); returns the positions restored (0 if the entry is gone). ``have``: positions the cache
        held already (the counters count the rest)."""
        with self._lock:
            e = self._entries.get(key)
            if e is None:
                return 0
            n = min(n, e.ids.size, cache.max_len)
            self._entries.move_to_end(key)
            for a, r in zip(cache.host, e.rows):
                a[0, :, :n] = r[:, :n]
            cache.ids.truncate(0)
            cache.ids.extend(e.ids[:n])
            self.restores += 1
            self.restored_tokens += max(0, n - have)
        return n

    def before_prefill(self, cache, ids: Sequence[int], common: int) -> int:
        """Called by a prefill of ``ids`` whose cache shares ``common`` positions with them (at most
        ``len(ids) - 1``): keeps the cache's content if the prefill would overwrite at least
        ``min_tokens`` of it, and restores a kept prefix longer than ``common`` by at least
        ``min_tokens``. Returns the positions the cache now shares with ``ids``."""
        key, m = self.match(ids)
        m = min(m, len(ids) - 1)
        restore = key is not None and m >= common + self.min_tokens
        if cache.length - common >= self.min_tokens:  # the prefill rewinds past cached rows: keep them
            self.save(cache, keep=key if restore else None)
        if restore:
            return self.restore(key, m, cache, have=common) or common
        return common
