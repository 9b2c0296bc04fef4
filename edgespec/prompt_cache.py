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


# -- on disk (opt-in: load(prompt_cache_file=...), serve --prompt-cache-file) ----------------------------
FORMAT = "edgespec-prompt-cache"
VERSION = 1


def engine_key(manifest, spec, cache) -> dict:
    """What must match for kept rows to be the bytes this engine would compute: the bundle (its
    tokenizer and weights), the KV layout, onnxruntime, the CPU (its kernels' paths depend on its
    instruction sets) and, on edgespec's kernels, their source."""
    import hashlib
    import platform

    import onnxruntime as ort

    from .memory import bundle_fingerprint
    from .native import _cpu_flags

    cpu = hashlib.sha256((platform.machine() + " " + " ".join(sorted(_cpu_flags() or ()))).encode()).hexdigest()[:16]
    kernels = "onnxruntime"
    if getattr(spec, "kernels", None) == "edgespec-q4":
        from .native import source_tag

        kernels = f"edgespec-q4 {source_tag()}"
    a = cache.host[0]
    return {"fingerprint": bundle_fingerprint(manifest), "buffers": len(cache.host), "kv_heads": int(a.shape[1]),
            "head_dim": int(a.shape[3]), "dtype": str(a.dtype), "onnxruntime": ort.__version__, "cpu": cpu,
            "kernels": kernels}


def write_file(pc: PromptCache, path, key: dict) -> int:
    """Write ``pc``'s entries (least recently used first) to ``path`` atomically (a temporary file
    beside it, fsynced, renamed over it); returns the bytes written. ``StoreError`` if it cannot."""
    import io
    import json
    import os
    from pathlib import Path

    from .errors import StoreError

    path = Path(path)
    with pc._lock:
        entries = list(pc._entries.values())
    arrays = {"meta": np.frombuffer(json.dumps({"format": FORMAT, "version": VERSION, "key": key,
                                                "lengths": [int(e.ids.size) for e in entries]}).encode(), np.uint8)}
    for i, e in enumerate(entries):
        arrays[f"ids_{i}"] = e.ids
        arrays[f"rows_{i}"] = np.stack(e.rows)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(buf.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise StoreError(f"cannot write the prompt cache {path}: {e.strerror or e}") from None
    return buf.getbuffer().nbytes


def read_file(pc: PromptCache, path, key: dict) -> tuple[int, str | None]:
    """Entries of ``path`` into ``pc`` (within its budget, the most recent kept); returns (entries read,
    why none were: another engine's file). ``StoreError`` for a file that is not a prompt cache edgespec
    wrote (corrupt, truncated, another format): it is left as it is."""
    import json
    import zipfile
    from pathlib import Path

    from .errors import StoreError

    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise StoreError(f"{path} is not an edgespec prompt cache")
            if meta.get("version") != VERSION:
                return 0, f"written in version {meta.get('version')!r} of the format (this edgespec reads {VERSION})"
            theirs = meta.get("key")
            if theirs != key:
                diff = sorted(k for k in key if not isinstance(theirs, dict) or theirs.get(k) != key[k])
                return 0, f"written by another engine (its {', '.join(diff) or 'key'} differ)"
            lengths = meta["lengths"]
            entries = []
            for i, n in enumerate(lengths):
                ids, rows = z[f"ids_{i}"], z[f"rows_{i}"]
                if (ids.dtype != np.int64 or ids.shape != (n,) or rows.dtype != np.dtype(key["dtype"])
                        or rows.shape != (key["buffers"], key["kv_heads"], n, key["head_dim"])):
                    raise StoreError(f"the prompt cache {path} is corrupt (entry {i}'s arrays disagree with its header)")
                entries.append(_Entry(ids.copy(), list(rows)))
    except FileNotFoundError:
        return 0, None
    except StoreError as e:
        raise StoreError(f"{e}: not a prompt cache edgespec can use; give a new path or one it wrote") from None
    except (ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        raise StoreError(f"the prompt cache {path} is unreadable ({type(e).__name__}: {e})"[:240]
                         + ": not a prompt cache edgespec can use; give a new path or one it wrote") from None
    except OSError as e:  # a directory on the way that is a file, no permission, ...
        raise StoreError(f"cannot read the prompt cache {path}: {e.strerror or e}") from None
    with pc._lock:
        for e in entries:  # least recently used first, as written
            pc._key += 1
            pc._entries[pc._key] = e
        used = pc._bytes()
        while pc._entries and used > pc.budget:
            used -= pc._entries.popitem(last=False)[1].nbytes
    return len(entries), None
