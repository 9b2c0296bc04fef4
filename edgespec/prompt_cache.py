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

from .kv import ConvSnapshot, common_prefix

# Fewer cached tokens than this are not worth a copy (a prefill of them is a few target calls).
MIN_TOKENS = 16


@dataclass
class _Entry:
    ids: np.ndarray  # int64 [n]
    rows: list[np.ndarray]  # per KV buffer (layer x key/value): [kv_heads, n, head_dim], a copy
    conv: ConvSnapshot | None = None  # a model with convolution layers: their states at the last positions

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.rows) + self.ids.nbytes + (self.conv.nbytes if self.conv else 0)

    def usable(self, m: int) -> int:
        """How much of a match of ``m`` positions can be restored: all, or for a model with convolution layers none
        where their states at ``m`` were not kept (before ``conv.start``)."""
        return m if self.conv is None or m >= self.conv.start else 0

    def restores(self, ids: np.ndarray) -> bool:
        """Whether this entry holds ``ids`` (they are its first ids) and can restore them."""
        n = ids.size
        return self.ids.size >= n and self.usable(n) == n and np.array_equal(self.ids[:n], ids)


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
        self.version = 0  # bumped when the entries change (a save, a clear): a file is rewritten only then
        self.written = 0  # the version a file holds (write_file, read_file)

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
            self.version += 1

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
                if min(e.ids.size, ids.size) <= best_n:
                    continue
                m = e.usable(common_prefix(e.ids, ids))
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
        conv = getattr(cache, "conv", None)
        snap = conv.snapshot(n) if conv is not None else None  # (the convolution layers' states at the end)
        if conv is not None and snap is None:
            return False
        with self._lock:
            kept = self._entries.get(keep)
            left = self.budget - (kept.nbytes if kept is not None else 0) - (snap.nbytes if snap else 0)
            n = min(n, left // per)  # its first rows at most
            if snap is not None and n < snap.end:  # (cut: the states at its end, where they were kept)
                snap = snap.cut(n)
            if n < self.min_tokens or (conv is not None and snap is None):
                return False
            ids = ids[:n]
            for key, e in list(self._entries.items()):
                if e.restores(ids):  # already kept (or a longer one that restores it)
                    self._entries.move_to_end(key)
                    return False
                if (e.ids.size < n and key != keep and (snap is None or e.ids.size >= snap.start)
                        and np.array_equal(ids[: e.ids.size], e.ids)):  # this extends it (and restores it)
                    del self._entries[key]
            need, used = n * per + (snap.nbytes if snap is not None else 0), self._bytes()
            for key in [k for k in self._entries if k != keep]:  # least recently used first
                if used + need <= self.budget:
                    break
                used -= self._entries.pop(key).nbytes
                self.evictions += 1
            rows = [a[0, :, :n].copy() for a in cache.host]  # (a copy: a slice may be contiguous, and a view)
            self._key += 1
            self._entries[self._key] = _Entry(ids.copy(), rows, snap)
            self.saves += 1
            self.version += 1
        return True

    def restore(self, key: int, n: int, cache, have: int = 0) -> int:
        """Copy the first ``n`` rows of entry ``key`` into ``cache`` (which then holds exactly those
        ids); returns the positions restored (0 if the entry is gone). ``have``: positions the cache
        held already (the counters count the rest)."""
        with self._lock:
            e = self._entries.get(key)
            conv = getattr(cache, "conv", None)
            if e is None or (conv is not None) != (e.conv is not None):
                return 0
            n = min(n, e.ids.size, cache.max_len)
            if e.usable(n) != n:
                return 0
            self._entries.move_to_end(key)
            # the ids first cut to the rows both hold, then the rest copied, then their ids: an interrupt
            # (Ctrl-C) in the copy leaves a cache whose ids name its rows (the ids were set after the copy, and a
            # cut copy left another conversation's ids over some layers' restored rows: wrong replies after)
            have = min(have, n, cache.ids.common_prefix(e.ids[:n]))
            cache.ids.truncate(have)
            for a, r in zip(cache.host, e.rows):
                a[0, :, have:n] = r[:, have:n]
            if conv is not None:  # (the states at n: after the rows, before their ids, as the rows)
                conv.restore(e.conv, n)
            cache.ids.extend(e.ids[have:n])
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
# The file is a zip of .npy members (numpy's .npz): "meta" (JSON: format, version, the engine's key, each
# entry's length), then per entry "ids_i" (int64 [n]) and "rows_i" ([buffers, kv_heads, n, head_dim]), least
# recently used first; a model with convolution layers (the key's "conv") adds each entry's "conv_states_i_j"
# ([1, channels, k]: layer j's state at the entry's conv start, meta "conv_starts") and "conv_inputs_i_j" ([1,
# channels, n - start]). It is trusted input, like the bundle's weights: rows written by someone else steer the
# replies (nothing checks them but their shapes, type and finiteness). Created 0600.
FORMAT = "edgespec-prompt-cache"
VERSION = 1
# Bumped when the code that feeds the graphs (positions, masks, padding) changes what a row holds: a file from
# before is then another engine's.
KV_COMPAT = 1
_ISA = ("avx", "avx2", "avx512", "amx", "fma", "f16c", "vnni", "bf16", "fp16", "sse4", "asimd", "sve", "i8mm",
        "dotprod", "sme")  # instruction-set flags (the kernels' paths depend on these, not on the rest)


def _cpu_isa() -> str:
    import platform

    from .native import _cpu_flags

    flags = {f for f in _cpu_flags() or () if any(x in f for x in _ISA)}
    return platform.machine() + " " + " ".join(sorted(flags))


def engine_key(manifest, spec, cache, session_options: dict | None = None, widths: tuple[int, int] = (1, 1)) -> dict:
    """What must match for kept rows to be the bytes this engine would compute: the bundle (its
    tokenizer, weights and graphs), the KV layout, onnxruntime (version and build), the CPU's
    instruction sets (its kernels' paths depend on them), the session options, on edgespec's kernels
    their source, the width policy's (``widths``: the target's ``min_width`` and ``width_multiple``: a row
    decoded one token a call is not the bits of one in a padded call on onnxruntime's kernels), and
    ``KV_COMPAT``."""
    import hashlib
    import json

    import onnxruntime as ort

    from .memory import bundle_fingerprint

    def h(x: str) -> str:
        return hashlib.sha256(x.encode()).hexdigest()[:16]

    kernels = "onnxruntime"
    if getattr(spec, "kernels", None) == "edgespec-q4":
        from .native import isa, source_tag

        # (the path too: EDGESPEC_Q4_ISA=avx2 on an AVX-512 CPU takes other attention lanes, other bits)
        kernels = f"edgespec-q4 {source_tag()} {isa()}"
    build = ort.get_build_info() if hasattr(ort, "get_build_info") else ""
    a = cache.host[0]
    shapes = [[int(b.shape[1]), int(b.shape[3])] for b in cache.host]
    return {"fingerprint": bundle_fingerprint(manifest), "buffers": len(cache.host), "kv_heads": int(a.shape[1]),
            "head_dim": int(a.shape[3]), "dtype": str(a.dtype), "onnxruntime": f"{ort.__version__} {h(build)}",
            "cpu": h(_cpu_isa()), "kernels": kernels, "compat": KV_COMPAT,
            "session_options": h(json.dumps(session_options or {}, sort_keys=True, default=str)),
            "widths": [int(w) for w in widths],
            # (session 59) each buffer's [kv heads, head size] where they differ (Gemma 4's wider global layers):
            # such a file keeps one rows member per buffer (rows_<entry>_<buffer>)
            **({"kv_shapes": shapes} if any(x != shapes[0] for x in shapes) else {}),
            # (session 62) a model with convolution layers: each one's [channels, state length]; each entry then has
            # conv_states_<entry> ([layer][channels, k] at its start) and conv_inputs_<entry> (one member a layer)
            **({"conv": [[int(cl.channels), int(cl.past.shape[2])] for cl in cache.conv.layers]}
               if getattr(cache, "conv", None) is not None else {})}


def write_file(pc: PromptCache, path, key: dict) -> int:
    """Write ``pc``'s entries (least recently used first) to ``path`` atomically: a temporary file beside it
    (0600, a fresh name), each entry streamed into it (no copy of the whole cache in memory), fsynced and
    renamed over ``path``. Under a lock file beside it (as the memory store's saves), the entries another engine
    wrote there since (same key) are kept too, older than this one's, the newest within the budget: two engines
    on one file each wrote their own view, and the last to close lost the other's (session 55, a review).
    Returns the bytes written; ``StoreError`` if it cannot be written."""
    from pathlib import Path

    from .errors import StoreError
    from .memory import _lock_path, _locked

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(f"cannot write the prompt cache {path}: {e.strerror or e}") from None
    with _locked(_lock_path(path)):
        return _write_file(pc, path, key)


def _merged(ours: list, path, key: dict, pc: PromptCache) -> list:
    """The entries to write: those of the file at ``path`` (written by another engine of the same key since this one
    read it) that none of ``ours`` holds, then ``ours``; the most recent kept within ``pc.budget``."""
    from .errors import StoreError

    other = PromptCache(pc.budget, pc.min_tokens)
    try:
        _, why = read_file(other, path, key)
    except StoreError:  # (a file this one cannot use: replaced, as before; a newer edgespec's is never reached)
        return ours
    if why is not None:  # (another engine's: replaced, as before)
        return ours

    theirs = [e for e in other._entries.values() if not any(o.restores(e.ids) for o in ours)]
    out, room = [], pc.budget
    for e in reversed(theirs + ours):  # the most recent first
        if e.nbytes <= room:
            out.append(e)
            room -= e.nbytes
    return out[::-1]


def _write_file(pc: PromptCache, path, key: dict) -> int:
    import json
    import os
    import tempfile
    import zipfile

    from .errors import StoreError

    with pc._lock:
        entries = list(pc._entries.values())
        version = pc.version
    entries = _merged(entries, path, key, pc)
    meta = json.dumps({"format": FORMAT, "version": VERSION, "key": key,
                       "lengths": [int(e.ids.size) for e in entries],
                       **({"conv_starts": [int(e.conv.start) for e in entries]} if "conv" in key else {})}).encode()
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:  # (the mode of the file it replaces: one shared with a service's user became 0600; session 92, a review)
            os.chmod(tmp, path.stat().st_mode & 0o777)
        except FileNotFoundError:  # (a new file: mkstemp's 0600)
            pass
        with os.fdopen(fd, "wb") as f:
            with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
                _member(z, "meta", np.frombuffer(meta, np.uint8))
                for i, e in enumerate(entries):
                    _member(z, f"ids_{i}", e.ids)
                    if "kv_shapes" in key:  # (buffers of other shapes: one member each)
                        for j, r in enumerate(e.rows):
                            _member(z, f"rows_{i}_{j}", [r])
                    else:
                        _member(z, f"rows_{i}", e.rows)
                    if "conv" in key:
                        for j, (st, x) in enumerate(zip(e.conv.states, e.conv.inputs)):
                            _member(z, f"conv_states_{i}_{j}", [st])  # ([1, channels, k])
                            _member(z, f"conv_inputs_{i}_{j}", [x])  # ([1, channels, positions])
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
        try:  # the rename itself on disk (a cache: best effort)
            d = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(d)
            finally:
                os.close(d)
        except OSError:
            pass
        pc.written = version
        return path.stat().st_size
    except (OSError, ValueError, MemoryError) as e:
        raise StoreError(f"cannot write the prompt cache {path}: {getattr(e, 'strerror', None) or e}") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _member(z, name: str, a) -> None:
    """One .npy member: an array, or a list of equal arrays written as one stacked along a new first axis
    (their bytes one after another: no stacked copy)."""
    parts = a if isinstance(a, list) else [a]
    first = parts[0]
    shape = (len(parts), *first.shape) if isinstance(a, list) else first.shape
    with z.open(f"{name}.npy", "w", force_zip64=True) as f:
        np.lib.format.write_array_header_2_0(f, {"descr": np.lib.format.dtype_to_descr(first.dtype),
                                                 "fortran_order": False, "shape": shape})
        for p in parts:
            f.write(np.ascontiguousarray(p).data)


def _read_member(z, name: str, dtype, shape: tuple, keep: int | None = None) -> list[np.ndarray]:
    """A member written by ``_member`` checked against ``dtype`` and ``shape``, read one part (the first axis)
    at a time; with ``keep``, each part cut to its first ``keep`` rows along its second axis (entries
    larger than the budget keep their first rows, as ``save`` does)."""
    from .errors import StoreError

    with z.open(f"{name}.npy") as f:
        major, _ = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_2_0 if major == 2 else np.lib.format.read_array_header_1_0
        got_shape, fortran, got_dtype = read_header(f, max_header_size=10000)
        if fortran or got_dtype != np.dtype(dtype) or tuple(got_shape) != tuple(shape):
            raise StoreError(f"member {name} is {got_dtype} {tuple(got_shape)}, its header says {np.dtype(dtype)} "
                             f"{tuple(shape)}")
        if len(shape) == 1:  # (ids) one part
            raw = f.read(shape[0] * np.dtype(dtype).itemsize)
            if len(raw) != shape[0] * np.dtype(dtype).itemsize:
                raise StoreError(f"member {name} is truncated")
            return [np.frombuffer(raw, dtype).copy()]
        per = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dtype).itemsize
        out = []
        for _ in range(shape[0]):
            raw = f.read(per)
            if len(raw) != per:
                raise StoreError(f"member {name} is truncated")
            part = np.frombuffer(raw, dtype).reshape(shape[1:])
            out.append(part[:, :keep].copy() if keep is not None else part.copy())
        return out


def read_file(pc: PromptCache, path, key: dict) -> tuple[int, str | None]:
    """The most recently used entries of ``path`` that fit ``pc``'s budget, into ``pc``, read one part at a
    time (a file's declared sizes are checked before anything is read); returns (entries kept, why none
    were read: another engine's file, another version). ``StoreError`` for a file edgespec did not write
    (corrupt, truncated, another format, non-finite rows): it is left as it is."""
    import json
    import zipfile
    from pathlib import Path

    from .errors import StoreError
    from .memory import DAMAGED

    path = Path(path)
    bad = ": not a prompt cache edgespec can use; give a new path or one it wrote"
    try:
        with zipfile.ZipFile(path) as z:
            if z.getinfo("meta.npy").file_size > 1 << 20:
                raise StoreError("its header is larger than 1 MiB")
            meta = json.loads(bytes(np.load(z.open("meta.npy"), allow_pickle=False)).decode())
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise StoreError(f"{path} is not an edgespec prompt cache")
            v = meta.get("version")
            if isinstance(v, int) and not isinstance(v, bool) and v > VERSION:  # (a newer edgespec's: kept as it is)
                from .memory import KeptStoreError

                raise KeptStoreError(f"the prompt cache {path} was written by a newer edgespec (version {v} of the "
                                     f"format; this one reads {VERSION})")
            if v != VERSION:
                return 0, f"written in version {v!r} of the format (this edgespec reads {VERSION})"
            theirs = meta.get("key")
            if theirs != key:
                diff = sorted(k for k in key if not isinstance(theirs, dict) or theirs.get(k) != key[k])
                return 0, f"written by another engine (its {', '.join(diff) or 'key'} " + \
                    ("differs)" if len(diff) <= 1 else "differ)")
            lengths = meta.get("lengths")
            if not isinstance(lengths, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                        for n in lengths):
                raise StoreError("its entry lengths are not a list of counts")
            shapes = key.get("kv_shapes") or [[key["kv_heads"], key["head_dim"]]] * key["buffers"]
            row = sum(h * d for h, d in shapes) * np.dtype(key["dtype"]).itemsize + 8
            conv = key.get("conv")  # [[channels, k]] a conv layer, and each entry's first position they reach
            starts = meta.get("conv_starts") if conv else [0] * len(lengths)
            if not isinstance(starts, list) or len(starts) != len(lengths) or not all(
                    isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= n for s, n in zip(starts, lengths)):
                raise StoreError("its entries' convolution starts are not a list of positions within them")
            # (an entry's bytes as _Entry.nbytes counts them: its rows, and a conv entry's states at its start and
            # its conv inputs from there)
            states = sum(c * k for c, k in conv) * 4 if conv else 0
            per_input = sum(c for c, _ in conv) * 4 if conv else 0
            room, picked = pc.budget, []
            for i in reversed(range(len(lengths))):  # the most recently used first, while they fit
                n = min(lengths[i], (room - states + per_input * starts[i]) // (row + per_input))
                if n < pc.min_tokens or n < starts[i]:  # (a conv entry cut before its states: not restorable)
                    break
                picked.append((i, n))
                room -= n * row + states + per_input * (n - starts[i])
            entries = []
            for i, n in reversed(picked):  # back to least recently used first
                full = lengths[i]
                ids = _read_member(z, f"ids_{i}", np.int64, (full,))[0][:n].copy()
                if "kv_shapes" in key:
                    rows = [_read_member(z, f"rows_{i}_{j}", key["dtype"], (1, h, full, d), keep=n)[0]
                            for j, (h, d) in enumerate(shapes)]
                else:
                    rows = _read_member(z, f"rows_{i}", key["dtype"], (key["buffers"], key["kv_heads"], full,
                                                                         key["head_dim"]), keep=n)
                if not all(np.isfinite(r).all() for r in rows):
                    raise StoreError(f"entry {i} holds values that are not finite")
                snap = None
                if conv:
                    s0 = starts[i]
                    states = [_read_member(z, f"conv_states_{i}_{j}", np.float32, (1, c, k))[0]
                              for j, (c, k) in enumerate(conv)]
                    inputs = [_read_member(z, f"conv_inputs_{i}_{j}", np.float32, (1, c, full - s0), keep=n - s0)[0]
                              for j, (c, _) in enumerate(conv)]
                    if not all(np.isfinite(a).all() for a in states + inputs):
                        raise StoreError(f"entry {i}'s convolution states are not finite")
                    snap = ConvSnapshot(s0, states, inputs)
                entries.append(_Entry(ids, rows, snap))
    except FileNotFoundError:
        return 0, None
    except StoreError as e:
        from .memory import KeptStoreError

        if isinstance(e, KeptStoreError):
            raise
        raise StoreError(f"the prompt cache {path} is unusable ({e}){bad}") from None
    except DAMAGED as e:  # (a broken deflate stream, nested JSON in the header, an encrypted member, ...)
        raise StoreError(f"the prompt cache {path} is unreadable ({type(e).__name__}: {e})"[:240] + bad) from None
    except OSError as e:  # a directory on the way that is a file, no permission, ...
        raise StoreError(f"cannot read the prompt cache {path}: {e.strerror or e}") from None
    with pc._lock:
        for e in entries:
            pc._key += 1
            pc._entries[pc._key] = e
        pc.version += 1
        pc.written = pc.version  # what the file holds
    return len(entries), None


def remove_stale_temporaries(path, older_than_s: float = 3600.0) -> int:
    """Delete temporary files an interrupted write left beside ``path`` (``.<name>.*.tmp``, older than an
    hour: a write in progress in another process is left alone); returns how many."""
    import time
    from pathlib import Path

    path = Path(path)
    gone = 0
    try:
        for p in path.parent.glob(f".{path.name}.*.tmp"):
            try:
                if time.time() - p.stat().st_mtime > older_than_s:
                    p.unlink()
                    gone += 1
            except OSError:
                pass
    except OSError:
        pass
    return gone
