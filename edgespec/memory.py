"""The suffix drafter's memory: earlier outputs of one bundle, bounded, on disk between processes.

Where: ``<root>/<fingerprint>/store.npz``, root ``$EDGESPEC_MEMORY_DIR`` or ``$EDGESPEC_CACHE_DIR/memory``
(default ``~/.cache/edgespec/memory``),
never inside the bundle: a bundle may be read-only or shared by several users, and what a user
generated is theirs. The fingerprint hashes the target's tokenizer and weight files, so a store is
only ever read by the model whose token ids it holds.

The store keeps whole sequences (the last prompt tokens and an output) oldest first, up to
``cap_tokens`` tokens, each with its prompt's signature (``ngram.prompt_signature``): ``recall`` finds
the earlier requests a new prompt repeats, word for word or nearly, so the suffix drafter can draft
their answers first; adding past the cap evicts the oldest (FIFO), and the n-gram table loses their
counts. Saving writes a temporary file beside the store, fsyncs it and renames it over the old one,
so a crash leaves the old store or the new one, never half of one. A file that does not read back
(corrupt, truncated, another format, another bundle's) raises ``StoreError``; ``open_store`` sets
it aside as ``store.npz.bad-<time>`` and starts empty.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
import tempfile
import threading
import time
import tokenize  # (numpy has it loaded already: DAMAGED's TokenError)
import warnings
import weakref
import zipfile
import zlib
from collections import deque
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import StoreError, state_path
from .integrity import cache_root
from .ngram import MAX_TOKEN, NgramTable

FORMAT = "edgespec-memory"
VERSION = 2  # 2: prompt signatures beside the sequences; a version-1 store reads with none
READS = (1, 2)
# recall: an earlier request counts as repeated when its prompt scores at least this (1: the same
# prompt; see MemoryStore.recall), and at most this many are recalled
RECALL_MIN_SCORE = 0.5
RECALL_TOP = 2
DEFAULT_CAP_TOKENS = 65536
STORE_FILE = "store.npz"
MAX_STORE_BYTES = 1 << 30  # what a store file may have (one of the default cap is well under 10 MiB)


def memory_root() -> Path:
    """``$EDGESPEC_MEMORY_DIR``, else ``$EDGESPEC_CACHE_DIR/memory`` (default ``~/.cache/edgespec``)."""
    env = os.environ.get("EDGESPEC_MEMORY_DIR")
    if env:  # (absolute: a store opened now is saved at exit, whatever the working directory is then)
        return Path(env).expanduser().absolute()
    return cache_root() / "memory"


def bundle_fingerprint(manifest) -> str:
    """Names a bundle's token ids and outputs: the target's tokenizer and weight hashes."""
    t = manifest.target
    h = hashlib.sha256(t.tokenizer_sha256.encode())
    h.update(str(t.vocab_size).encode())
    for rel in sorted(t.files):
        h.update(rel.encode())
        h.update(str(t.files[rel].get("sha256") or t.files[rel].get("bytes")).encode())
    return h.hexdigest()[:20]


def store_path(manifest) -> Path:
    return memory_root() / bundle_fingerprint(manifest) / STORE_FILE


class MemoryStore:
    """Earlier outputs as token sequences and their n-gram table, at most ``cap_tokens`` tokens."""

    def __init__(self, path: str | os.PathLike | None, fingerprint: str, vocab_size: int,
                 cap_tokens: int = DEFAULT_CAP_TOKENS):
        if cap_tokens < 1:
            raise StoreError(f"memory cap must be >= 1 token, got {cap_tokens}")
        # (absolute, through a link: saved at each generation's end and at exit; session 92, a review)
        self.path = state_path(path, StoreError) if path is not None else None
        self.fingerprint = fingerprint
        self.vocab_size = vocab_size
        self.cap_tokens = cap_tokens
        self.seqs: deque[np.ndarray] = deque()
        self.sigs: deque[np.ndarray] = deque()  # each sequence's prompt signature (may be empty)
        # what changes or reads the sequences as a whole (add, clear, save, stats) one thread at a time: at exit the
        # drafter's finalizer saves while a daemon thread's generation ends (arrays of a file that disagreed), and
        # memory_stats() ran beside a generation's add ("deque mutated during iteration")
        self._lock = threading.RLock()
        _STORES.add(self)
        # the prompt signatures' hashes sorted, for recall: (hashes, owner ids, first id, end id) of the sequences with
        # ids first..end-1 when it was built; a sequence's id is its place counted from the first ever held
        # (``_base``: the id of seqs[0]); sequences added since are looked up apart until they are many
        self._sig_index: tuple[np.ndarray, np.ndarray, int, int] | None = None
        self._base = 0
        self.tokens = 0
        self.table = NgramTable()
        self.evicted = 0
        self.dirty = False
        # the file as this store last read or wrote it (_stamp: None where there was none) and the sequences
        # added since: a save merges what another process wrote meanwhile, and one after the file was deleted
        # (`edgespec memory clear` while a server runs) writes only what came after
        self._stamp: tuple | None = None
        self._added = 0

    def __len__(self) -> int:
        return len(self.seqs)

    @property
    def nbytes(self) -> int:
        """What the store holds in memory: its sequences, its n-gram table and the prompt signatures."""
        with self._lock:
            return 4 * self.tokens + self.table.nbytes + sum(g.nbytes for g in self.sigs)

    def add(self, seq: Sequence[int], signature: np.ndarray | None = None) -> None:
        """Store ``seq`` (the prompt's last tokens and an output), with the prompt's ``signature``
        (``ngram.prompt_signature``; None: not recallable)."""
        with self._lock:
            self._add(seq, signature)

    def _add(self, seq: Sequence[int], signature: np.ndarray | None) -> None:
        a = np.asarray(seq, dtype=np.int64)
        if a.shape[0] < 2:
            return
        a = a[-self.cap_tokens:].astype(np.int32)
        evict = []
        while self.seqs and self.tokens + a.shape[0] > self.cap_tokens:
            old = self.seqs.popleft()
            self.sigs.popleft()
            self._base += 1
            self.tokens -= old.shape[0]
            evict.append(old)
        if evict:
            self.table.add(evict, sign=-1)
            self.evicted += len(evict)
        self.seqs.append(a)
        self.sigs.append(np.zeros(0, np.int64) if signature is None else np.unique(np.asarray(signature, np.int64)))
        self.tokens += a.shape[0]
        self.table.add([a])
        self.dirty = True
        self._added += 1

    def clear(self) -> None:
        with self._lock:
            self.seqs.clear()
            self.sigs.clear()
            self._sig_index, self._base = None, 0
            self.tokens = 0
            self.table.clear()
            self.dirty = True
            self._added = 0

    def delete(self) -> None:
        """Forget every sequence and delete the file (a later save writes a new one), with what ``clear_store``
        deletes beside it: its set-aside copies (``*.bad-<time>``, earlier replies) and a killed save's temporary
        files. Under the saves' lock, as ``clear_store``: another engine's save in progress (it read the file for
        its merge) finishes first, so it cannot write the cleared sequences back after."""
        with self._lock:
            self.clear()
            self.dirty = False  # nothing to save: the file goes
            if self.path is None:
                return
            _delete_files(self.path)
            self._stamp = None  # (the file is gone, as this store knows)

    def _replace(self, pairs) -> None:
        """Hold ``pairs`` (sequence, signature), oldest first, as if added in that order (the cap applies: the
        newest that fit), the n-gram table built once, as ``load`` builds it (added one by one, each insert into the
        sorted table, a merge of a full store took ~1.1 s, and a server's reply waited for it)."""
        with self._lock:
            self.clear()
            keep, total = [], 0
            for seq, sig in reversed(list(pairs)):
                a = np.asarray(seq, dtype=np.int64)
                if a.shape[0] < 2:
                    continue
                a = a[-self.cap_tokens:].astype(np.int32)
                if total + a.shape[0] > self.cap_tokens:
                    break
                keep.append((a, np.unique(np.asarray(sig, dtype=np.int64))))
                total += a.shape[0]
            keep.reverse()
            self.seqs = deque(a for a, _ in keep)
            self.sigs = deque(g for _, g in keep)
            self.tokens = total
            self.table.add(list(self.seqs))
            self.dirty = True

    def recall(self, signature: np.ndarray, top: int = RECALL_TOP,
               min_score: float = RECALL_MIN_SCORE) -> list[tuple[float, np.ndarray]]:
        """The stored sequences whose prompts ``signature`` repeats: (score, sequence), at most ``top``
        with a score of at least ``min_score``, the best last (ties: the newer later).

        The score of an earlier prompt is the smaller of two shares: of this prompt's n-grams that it
        holds, each weighed by its rarity over the store (log((N + 1) / (df + 0.5)): the chat
        template's n-grams, in every prompt, weigh almost nothing), and of its own n-grams that this
        prompt holds. The same prompt scores 1; "Please ..." added to a question about 0.8; another
        question with the same template near 0."""
        with self._lock:  # (a save at exit may replace the sequences meanwhile)
            return self._recall(signature, top, min_score)

    def _recall(self, signature, top: int, min_score: float) -> list[tuple[float, np.ndarray]]:
        sig = np.unique(np.asarray(signature, dtype=np.int64))
        if not sig.shape[0] or not self.seqs:
            return []
        sizes = np.fromiter((g.shape[0] for g in self.sigs), dtype=np.int64, count=len(self.sigs))
        hashes, owner = self._hits(sig, sizes)  # (each stored hash this prompt holds, and its sequence's place)
        if not hashes.shape[0]:
            return []
        n = float(np.count_nonzero(sizes))
        held, df = np.unique(hashes, return_counts=True)
        w_held = np.log((n + 1) / (df + 0.5))
        w_total = w_held.sum() + (sig.shape[0] - held.shape[0]) * np.log((n + 1) / 0.5)
        w_hit = w_held[np.searchsorted(held, hashes)]
        contained = np.bincount(owner, weights=w_hit, minlength=sizes.shape[0]) / max(w_total, 1e-12)
        covered = np.bincount(owner, minlength=sizes.shape[0]) / np.maximum(sizes, 1)
        score = np.minimum(contained, covered)
        order = np.lexsort((np.arange(score.shape[0]), score))  # ascending score, the newer later
        best = [int(i) for i in order[-top:] if score[i] >= min_score]
        return [(float(score[i]), self.seqs[i]) for i in best]

    def _hits(self, sig: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The stored signatures' hashes that are in ``sig`` (sorted, unique) and the places of their sequences, in
        the order of the sequences and each one's hashes (a sum over them is the same, to the bit, whatever the
        index's state). Looked up in the sorted index (a binary search a hash of ``sig``: a scan of every stored
        hash took ~0.2 s a generation in a store at its cap of 6,500 short replies) and, for the sequences added
        since it was built, in theirs; rebuilt when those are more than a quarter of the store or when half of what
        it holds has been evicted."""
        m, base = len(self.sigs), self._base
        idx = self._sig_index
        if idx is None or m + base - idx[3] > max(64, m // 4) or 2 * (base - idx[2]) > idx[3] - idx[2]:
            own = np.repeat(np.arange(base, base + m, dtype=np.int64), sizes)
            h = np.concatenate(list(self.sigs)) if m and sizes.sum() else np.zeros(0, np.int64)
            order = np.argsort(h, kind="stable")
            idx = self._sig_index = (h[order], own[order], base, base + m)
        h, own, _, end = idx
        lo, hi = np.searchsorted(h, sig, "left"), np.searchsorted(h, sig, "right")
        counts = hi - lo
        pos = np.repeat(lo - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
        hashes, owner = h[pos], own[pos]
        live = owner >= base  # (evicted since the index was built: left out)
        hashes, owner = hashes[live], owner[live] - base
        if end < base + m:  # added since
            first = max(end - base, 0)
            tail = [self.sigs[i] for i in range(first, m)]
            th = np.concatenate(tail) if tail else np.zeros(0, np.int64)
            to = np.repeat(np.arange(first, m, dtype=np.int64), sizes[first:])
            hit = np.isin(th, sig)
            hashes, owner = np.concatenate([hashes, th[hit]]), np.concatenate([owner, to[hit]])
        order = np.lexsort((hashes, owner))
        return hashes[order], owner[order]

    def best(self, keys, min_order: int = 1):
        return self.table.best(keys, min_order)

    # -- disk ----------------------------------------------------------------------------------
    def save(self, wait: bool = True) -> None:
        """Write the store atomically (temporary file, fsync, rename), merged with what another process wrote
        since this store last read or wrote the file (theirs, then this one's new sequences; the cap keeps the
        newest), or, where the file was deleted since (`edgespec memory clear`), this one's new sequences only:
        a clear is not undone. Under a lock file where the system has ``fcntl``. OSError on failure;
        ``SaveBusy`` where ``wait`` is false and another save holds the lock (a garbage-collection finalizer's
        save: its pass may have come inside this thread's own save of the same file, whose lock it would wait
        for forever)."""
        if self.path is None:
            return
        _private_dirs(self.path.parent)  # what a user generated is theirs
        with self._lock, _locked(_lock_path(self.path), wait):
            now = _file_stamp(self.path)
            if now != self._stamp:
                new = list(zip(self.seqs, self.sigs))[len(self.seqs) - min(self._added, len(self.seqs)):]
                base = []
                if now is not None:
                    try:
                        base = list(zip(*read_store_signed(self.path, self.fingerprint, self.vocab_size)))
                    except KeptStoreError as e:  # (a newer edgespec's, one this user cannot read: never replaced)
                        raise OSError(str(e)) from None
                    except StoreError:  # (not a store this one can read: replaced by this one's view, as before)
                        base = list(zip(self.seqs, self.sigs))[: len(self.seqs) - len(new)]
                evicted = self.evicted
                self._replace(base + new)
                self.evicted = evicted
                # (the file read is now this store's base: a write that fails leaves only `new` to merge next time,
                # not the other process's sequences again)
                self._stamp, self._added = now, len(new)
            self._write()
            self._stamp, self._added = _file_stamp(self.path), 0

    def _write(self) -> None:
        meta = json.dumps({"format": FORMAT, "version": VERSION, "fingerprint": self.fingerprint,
                           "vocab_size": self.vocab_size, "saved": time.time()}).encode()
        with self._lock:  # (one snapshot: the four arrays agree)
            seqs, sigs = list(self.seqs), list(self.sigs)
        toks = np.concatenate(seqs) if seqs else np.zeros(0, np.int32)
        lengths = np.array([s.shape[0] for s in seqs], dtype=np.int64)
        sig_lengths = np.array([s.shape[0] for s in sigs], dtype=np.int64)
        sigs = np.concatenate(sigs) if sigs else np.zeros(0, np.int64)
        # a fresh name (0600): two engines of one bundle in one process saved through one pid-named file
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        tmp = Path(tmp)
        try:
            with open(fd, "wb") as f:
                np.savez(f, meta=np.frombuffer(meta, dtype=np.uint8), tokens=toks, lengths=lengths,
                         signatures=sigs, signature_lengths=sig_lengths)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        finally:
            if tmp.exists():
                tmp.unlink()
        self.dirty = False

    def load(self) -> None:
        """Read the store from ``path`` (a missing file is an empty store). ``StoreError`` when the
        file is corrupt or foreign; the store is then left empty."""
        if self.path is None or not self.path.exists():
            return
        stamp = _file_stamp(self.path)
        seqs, sigs = read_store_signed(self.path, self.fingerprint, self.vocab_size)
        self.clear()
        keep: list[int] = []
        total = 0
        for i in range(len(seqs) - 1, -1, -1):  # the newest that fit the cap
            if total + seqs[i].shape[0] > self.cap_tokens:
                break
            keep.append(i)
            total += seqs[i].shape[0]
        self.seqs = deque(seqs[i] for i in reversed(keep))
        self.sigs = deque(sigs[i] for i in reversed(keep))
        self.tokens = total
        self.table.add(list(self.seqs))
        self.dirty = False
        self._stamp, self._added = stamp, 0


def _lock_path(path: Path) -> Path:
    """The lock file of the store at ``path``, beside it (saves and ``clear_store`` take it)."""
    return path.with_name(f".{path.name}.lock")


def _file_stamp(path: Path) -> tuple | None:
    """What tells one version of a file from another (None: there is none)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


class SaveBusy(Exception):
    """A save that was not to wait found the store's lock held (``MemoryStore.save(wait=False)``)."""


# the lock files this thread holds (``_locked``): a save that would wait for one of them waits for itself
_HELD = threading.local()


class _locked:
    """An exclusive ``flock`` on ``path`` (made 0600) for a save's read, merge and write; nothing where the system
    has no ``fcntl`` (Windows) or the lock file cannot be made (the save then says why, or goes on unlocked).
    ``wait`` false: ``SaveBusy`` where this thread holds the lock already (a garbage-collection finalizer's save run
    inside this thread's own save of the same file, which would wait for it forever); another process's or thread's
    lock is waited for (at exit too: a save deferred from an exit handler never ran)."""

    def __init__(self, path: Path, wait: bool = True):
        self.path, self.fd, self.wait = path, None, wait

    def __enter__(self):
        held = getattr(_HELD, "paths", None)
        if held is None:
            held = _HELD.paths = set()
        key = os.path.abspath(self.path)
        if not self.wait and key in held:
            raise SaveBusy(f"the memory store {self.path.name} is being saved by this thread")
        try:
            import fcntl

            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            _OPEN[self.fd] = self
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except (ImportError, OSError):
            if self.fd is not None:
                _OPEN.pop(self.fd, None)
                os.close(self.fd)
            self.fd = None
        held.add(key)
        self.key = key
        return self

    def __exit__(self, *exc):
        _HELD.paths.discard(self.key)
        fd, self.fd = self.fd, None
        if fd is not None and _OPEN.pop(fd, None) is self:
            os.close(fd)  # (closing releases the lock)


# the lock files held now (fd -> its _locked): a child forked during a save closes its copies (an flock belongs to the
# open file both share: the child's copy held the parent's next save, and its own close() waited for itself)
_OPEN: dict[int, _locked] = {}


_STORES: "weakref.WeakSet[MemoryStore]" = weakref.WeakSet()


def _close_inherited_locks() -> None:
    for store in list(_STORES):  # (held by a parent's thread the child does not have: memory_stats() waited forever)
        store._lock = threading.RLock()
    for fd, lk in list(_OPEN.items()):
        lk.fd = None
        try:
            os.close(fd)
        except OSError:
            pass
    _OPEN.clear()
    _HELD.__dict__.clear()  # (the forking thread's own set: its save is not running in the child)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited_locks)


try:
    from lzma import LZMAError
except ImportError:  # (a Python built without lzma: zipfile cannot read such members either)
    LZMAError = ValueError

# what reading a damaged or foreign zip file of arrays raises besides OSError (which says the file could not be
# read): zipfile's errors, a broken deflate (or lzma) stream's, an unsupported compression method's or an encrypted
# member's (NotImplementedError and RuntimeError; RecursionError, nested JSON, is one too), a short member's
# (IndexError); the memory store and the prompt cache say such a file is corrupt, never a traceback
# (and numpy's reading of a damaged array header: SyntaxError, then tokenize's TokenError from its second parse, a
# traceback until session 92)
DAMAGED = (ValueError, KeyError, TypeError, IndexError, EOFError, zipfile.BadZipFile, zlib.error, LZMAError,
           RuntimeError, MemoryError, SyntaxError, tokenize.TokenError)


class KeptStoreError(StoreError):
    """A store file this edgespec cannot use that may still be good: no permission to read it, a newer version's.
    ``open_store`` leaves it where it is (and saves nothing over it), where a corrupt or
    foreign one is set aside."""


# a .npy header as numpy writes a 1-D array of numbers (np.savez; the store's checks then want integers)
_NPY_HEADER = re.compile(r"\{'descr': '([<>|=]?[iuf][1248])', 'fortran_order': False, 'shape': \((\d+),\), \}")


def _npz_arrays(data: bytes) -> dict[str, np.ndarray]:
    """The 1-D arrays of numbers of an .npz file as np.savez writes a store, read without ``np.load``: numpy's reader
    evaluates each header with ``ast.literal_eval``, and a store saved from a garbage-collection finalizer (the
    engine's last generation, recorded when it goes) merges with the file first: run inside another ``ast.parse``
    of the process (pytest's, importing a module), CPython 3.11.7 failed that parse with "SystemError: AST
    constructor recursion depth mismatch". ValueError (or zipfile's) for anything else."""
    out = {}
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for info in z.infolist():
            if not info.filename.endswith(".npy") or info.file_size > MAX_STORE_BYTES:
                raise ValueError(f"{info.filename!r} is not a member of a store")
            raw = z.read(info)
            if len(raw) < 10 or raw[:6] != b"\x93NUMPY" or raw[6] not in (1, 2, 3):
                raise ValueError(f"{info.filename!r} is not a .npy array")
            width = 2 if raw[6] == 1 else 4
            start = 8 + width
            end = start + int.from_bytes(raw[8:start], "little")
            m = _NPY_HEADER.match(raw[start:end].decode("latin-1").strip())
            if m is None:
                raise ValueError(f"{info.filename!r} is not a 1-D array of numbers")
            out[info.filename[:-4]] = np.frombuffer(raw, np.dtype(m.group(1)), count=int(m.group(2)), offset=end)
    return out


def read_store(path: Path, fingerprint: str | None, vocab_size: int | None) -> list[np.ndarray]:
    """The sequences of a store file; ``StoreError`` naming what is wrong with it."""
    return read_store_signed(path, fingerprint, vocab_size)[0]


def read_store_signed(path: Path, fingerprint: str | None,
                      vocab_size: int | None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The sequences of a store file and their prompt signatures (empty in a version-1 store);
    ``StoreError`` naming what is wrong with it."""
    try:  # bounded: a store symlinked to a device (/dev/zero) would never end; a pipe is not opened (no writer: a hang)
        if not stat.S_ISREG(os.stat(path).st_mode):  # (set aside: a rename leaves what a link points to as it is)
            raise StoreError(f"the memory store {path} is not a regular file")
        with open(path, "rb") as f:
            data = f.read(MAX_STORE_BYTES + 1)
    except OSError as e:
        raise KeptStoreError(f"cannot read the memory store {path}: {e.strerror or e}") from None
    except ValueError:  # a NUL byte in the path
        raise StoreError(f"cannot read the memory store {str(path)!r}: a path cannot hold a NUL byte") from None
    if len(data) > MAX_STORE_BYTES:
        raise StoreError(f"the memory store {path} has more than {MAX_STORE_BYTES >> 20} MiB: not a store edgespec "
                         "wrote")
    try:
        z = _npz_arrays(data)
        meta = json.loads(bytes(z["meta"]).decode())
        toks, lengths = z["tokens"], z["lengths"]
        signed = "signatures" in z
        sigs = z["signatures"] if signed else None
        sig_lengths = z["signature_lengths"] if signed else None
    except (*DAMAGED, OSError) as e:  # (an array header claiming 2**40 entries: a ValueError)
        raise StoreError(f"the memory store {path} is corrupt ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise StoreError(f"{path} is not an edgespec memory store")
    if meta.get("version") not in READS:
        newer = isinstance(meta.get("version"), int) and meta["version"] > max(READS)
        raise (KeptStoreError if newer else StoreError)(
            f"the memory store {path} has version {meta.get('version')!r}; this edgespec reads "
            f"{' and '.join(map(str, READS))}")
    if fingerprint is not None and meta.get("fingerprint") != fingerprint:
        raise StoreError(f"the memory store {path} belongs to another bundle (fingerprint "
                         f"{meta.get('fingerprint')!r}, this bundle {fingerprint!r})")
    if (toks.ndim != 1 or lengths.ndim != 1 or toks.dtype.kind not in "iu" or lengths.dtype.kind not in "iu"
            or (lengths < 0).any() or int(lengths.sum()) != toks.shape[0]):
        raise StoreError(f"the memory store {path} is corrupt (token and length arrays disagree)")
    limit = min(vocab_size or MAX_TOKEN, MAX_TOKEN)
    if toks.shape[0] and (toks.min() < 0 or toks.max() >= limit):
        raise StoreError(f"the memory store {path} holds token ids outside this vocabulary (0..{limit - 1})")
    toks = toks.astype(np.int32)
    ends = np.cumsum(lengths)
    seqs = [toks[e - n: e] for n, e in zip(lengths.tolist(), ends.tolist())]
    if sigs is None:
        return seqs, [np.zeros(0, np.int64) for _ in seqs]
    if (sigs.ndim != 1 or sig_lengths.ndim != 1 or sigs.dtype.kind not in "iu" or sig_lengths.dtype.kind not in "iu"
            or sig_lengths.shape[0] != lengths.shape[0] or (sig_lengths < 0).any()
            or int(sig_lengths.sum()) != sigs.shape[0]):
        raise StoreError(f"the memory store {path} is corrupt (signature arrays disagree with the sequences)")
    sigs = sigs.astype(np.int64)
    ends = np.cumsum(sig_lengths)
    return seqs, [np.unique(sigs[e - n: e]) for n, e in zip(sig_lengths.tolist(), ends.tolist())]


def open_store(path: Path, fingerprint: str, vocab_size: int, cap_tokens: int = DEFAULT_CAP_TOKENS,
               set_aside: bool = True) -> MemoryStore:
    """A store read from ``path``; a corrupt or foreign file is set aside (renamed ``*.bad-<time>``,
    with a warning) and the store starts empty, so a bad file never stops a generation. Without
    ``set_aside`` (a path the caller named) such a file is a ``StoreError`` and stays as it is:
    it may be anything of the user's."""
    from .prompt_cache import remove_stale_temporaries

    store = MemoryStore(path, fingerprint, vocab_size, cap_tokens)
    # what a save killed midway left (they stayed until `memory clear`; session 92, a review), as the prompt cache does
    remove_stale_temporaries(store.path)
    try:
        store.load()
    except KeptStoreError as e:  # (it may be good: another user's, a newer edgespec's; never renamed or overwritten)
        if not set_aside:
            raise
        store.path = None
        warnings.warn(f"{e}; left as it is, running with a memory that is not saved", stacklevel=2)
    except StoreError as e:
        if not set_aside:
            raise StoreError(f"{e}: not a memory store edgespec can use; give a new path or a store it wrote") \
                from None
        stem = f"{path.name}.bad-{time.strftime('%Y%m%d-%H%M%S')}"
        aside, n = path.with_name(stem), 1
        while aside.exists() or aside.is_symlink():  # (two in one second: the first is not replaced)
            n += 1
            aside = path.with_name(f"{stem}-{n}")
        try:
            os.replace(path, aside)
            where = f"set aside as {aside.name}"
        except OSError as e2:
            where = f"could not be set aside ({e2.strerror or e2})"
            store.path = None  # never overwrite what could not be moved
        warnings.warn(f"{e}; {where}, starting with an empty memory", stacklevel=2)
    return store


def _private_dirs(d: Path) -> None:
    """``d`` and every folder missing on the way made 0700 (``mkdir(parents=True)`` makes the ones above the last
    with the umask's mode: ``memory/`` listed every bundle's fingerprint to other users; session 64, a review)."""
    missing = []
    while not d.exists() and d != d.parent:
        missing.append(d)
        d = d.parent
    for m in reversed(missing):
        m.mkdir(mode=0o700, exist_ok=True)


def clear_store(manifest) -> list[Path]:
    """Delete the bundle's memory store (and set-aside files); returns what was deleted."""
    return _delete_files(store_path(manifest), warn=True)


def other_stores(manifest=None) -> list[Path]:
    """The store files under ``memory_root()`` other than ``manifest``'s (all of them with None): other bundles', or
    this bundle's from before it was rewritten (``exact-kernels``, ``drafter-vocab``, ``export --force``: the store
    is named by the target's files' hashes), which no bundle's ``memory clear`` reaches (session 64, a review)."""
    import re

    root = memory_root()
    mine = store_path(manifest) if manifest is not None else None
    try:  # (only the folders edgespec names: a memory folder set to a shared one holds others' store.npz too)
        folders = sorted(p for p in root.iterdir() if re.fullmatch(r"[0-9a-f]{20}", p.name))
    except OSError:
        return []
    out = []
    for d in folders:
        p = d / STORE_FILE
        try:
            if d.is_symlink() or not d.is_dir() or p == mine:
                continue
            if p.is_file() or any(q.name.startswith(f"{STORE_FILE}.bad-") for q in d.iterdir()):
                out.append(p)
        except OSError:  # (a folder this user cannot read: none of theirs to list)
            continue
    return out


def clear_all_stores() -> tuple[list[Path], list[OSError]]:
    """Delete every bundle's memory store under ``memory_root()`` (and their set-aside files); returns what was
    deleted and the errors of the stores that could not be (no permission: another user's), the others deleted all
    the same (it stopped at the first, the rest kept and what it had deleted unsaid; session 92, a review)."""
    gone: list[Path] = []
    failed: list[OSError] = []
    for p in other_stores():
        try:
            gone += _delete_files(p, warn=True)
        except OSError as e:
            failed.append(e)
    return gone, failed


def _delete_files(path: Path, warn: bool = False) -> list[Path]:
    """Delete the store file at ``path`` and what edgespec writes beside it for it: its set-aside copies
    (``<name>.bad-<time>``) and a killed save's temporary files (``.<name>.*.tmp``); returns what was deleted.
    Under the saves' lock (a save in progress finishes first, and one after sees the file gone), which stays:
    unlinked, a save waiting on it and a later one locked two different files, and one overwrote the other. A
    directory of such a name is not a file edgespec wrote: never deleted with its contents (``warn``: said). A store
    that is a symbolic link (a store kept on another volume) is the file it names, as the saves read it: that file
    goes, under the saves' lock beside it, and the link stays for the next save (the link went and the file stayed,
    and the next save wrote a new file in the link's place; session 93)."""
    path = state_path(path, StoreError)
    d, name = path.parent, path.name
    gone: list[Path] = []
    if not d.is_dir():
        return gone
    with _locked(_lock_path(path)):
        for p in sorted(d.iterdir()):
            if not (p == path or p.name.startswith(f"{name}.bad-")
                    or (p.name.startswith(f".{name}.") and p.name.endswith(".tmp"))):
                continue
            if p.is_dir() and not p.is_symlink():
                if warn:
                    warnings.warn(f"{p} is a directory, not a memory store: left as it is", stacklevel=3)
                continue
            try:
                p.unlink()
            except FileNotFoundError:  # (another process deleted it first)
                continue
            gone.append(p)
    return gone
