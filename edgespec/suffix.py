"""Suffix drafting: the most frequent continuation of the longest match, from four sources.

- ``recall``: the earlier outputs whose prompts this prompt repeats, word for word or nearly
  (``MemoryStore.recall`` scores every stored prompt's signature against this one's when a
  generation begins; at most two, the best preferred): a kiosk asked its frequent questions again
  drafts its own earlier answer from the first token on, instead of whatever most often followed
  the chat template's last tokens over all earlier outputs. Keys say ``repeat`` where the best
  recalled prompt is this very prompt and ``recall`` where it is a near one: learned apart;
- ``ctx``: the generation's own prompt and output (what prompt lookup reads), indexed as it grows;
- ``doc``: the user's documents (``--documents``, ``engine.add_documents``), tokenized once;
- ``mem``: earlier outputs of this bundle (memory.py), kept across requests and processes.

Each drafted token looks up the last 1..8 tokens (ngram.py) in every source and follows the most
frequent continuation of the longest context found (ties: recall, then ctx, doc, mem); a draft stops
where no context of at least ``min(first order, 2)`` tokens matches. The draft's acceptance
estimate is keyed by the first token's source and match length (``suffix/mem/5``), so the cost
model learns what a 5-token match in memory is worth on this traffic and picks the draft length
from it. Drafting is free (no model call) and deterministic: the draft is a point mass.
"""
from __future__ import annotations

import atexit
import os
import warnings
import weakref
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from .drafters import MAX_DRAFT, LoadEnv, LookupDrafter, Offer, register
from .errors import ConfigError, DocumentError
from .kv import TokenBuffer
from .memory import DEFAULT_CAP_TOKENS, MemoryStore, SaveBusy, bundle_fingerprint, open_store, store_path
from .ngram import MAX_TOKEN, ORDERS, LiveIndex, NgramTable, context_keys, prompt_signature

_SEPARATOR = -1  # between two recalled outputs in one index: never a token, never drafted
REPEAT_SCORE = 0.999  # a recalled prompt scoring this: the same request (its key says suffix/repeat/n)
MAX_DOCUMENT_BYTES = 16 << 20  # one documents file
MAX_DOCUMENT_TOKENS = 1 << 20  # all documents of an engine (12 bytes a token and order in the table)


@register
class SuffixDrafter(LookupDrafter):
    name = "suffix"

    def __init__(self, memory: MemoryStore | None = None, max_draft: int = 16, orders: int = ORDERS,
                 max_document_tokens: int = MAX_DOCUMENT_TOKENS):
        self.memory = memory  # None: nothing is read or stored (--no-memory)
        self.max_draft = max_draft
        self.orders = orders
        self.live = LiveIndex(orders)
        self.recalled = LiveIndex(orders)  # this generation's recalled outputs (empty: none)
        self.recall_scores: list[float] = []  # ... and how well their prompts matched, the best last
        self.docs = NgramTable(orders)
        self.document_tokens = 0
        self.max_document_tokens = max_document_tokens
        # False while a generation must not depend on earlier ones (a seeded sampled generation:
        # the round policy sets it); the memory is then not read (nothing recalled either); the
        # generation is still recorded for later ones (tests/test_suffix.py: seeded runs agree
        # although the memory grew between them)
        self.history = True
        # False while the generation's drafter is not suffix or auto (the round policy sets it): it is not recorded
        # (the README: only suffix and auto keep replies; model and prompt-lookup begin this drafter too, for the
        # spare slots of their calls, and it wrote their replies to disk)
        self.records = True
        self._rec = _Recorder(memory, orders)
        self._cache: tuple[int, int, list[int], str] | None = None  # (ctx length, k, tokens, key)
        if memory is not None:  # a generation is recorded at its end (end()); one cut short, when the drafter goes
            weakref.finalize(self, self._rec.flush, False)

    @classmethod
    def build(cls, env: LoadEnv) -> "SuffixDrafter | None":
        vocab = env.manifest.target.vocab_size
        if vocab > MAX_TOKEN:
            return None
        opt = getattr(env, "options", None) or {}
        mem = opt.get("memory", True)
        store = None
        if mem is not False and mem is not None:
            path = store_path(env.manifest) if mem is True else Path(mem).expanduser()
            # a directory the caller named (one to be made where the name ends with a slash): its store file
            if mem is not True and (path.is_dir() or os.fspath(mem).endswith(("/", os.sep))):
                path = path / "store.npz"
            store = open_store(path, bundle_fingerprint(env.manifest), vocab,
                               int(opt.get("memory_cap_tokens") or DEFAULT_CAP_TOKENS), set_aside=mem is True)
        return cls(store, max_draft=MAX_DRAFT)  # a request's max_draft_tokens (kmax) is the bound that applies

    # -- protocol ------------------------------------------------------------------------------
    def begin(self, prompt: Sequence[int]) -> None:
        self._rec.commit()
        live = self.live
        n = len(live)
        if n and (len(prompt) < n or TokenBuffer(live.tokens).common_prefix(prompt) < n):
            live.clear()  # not a continuation of what is indexed (a chat turn usually is)
        live.extend(prompt[len(live):])
        self._rec.prompt_len = len(prompt)
        self._rec.signature = sig = prompt_signature(prompt) if self.memory is not None else None
        self.recalled = LiveIndex(self.orders)
        self.recall_scores = []
        if sig is not None and self.history:
            for score, seq in self.memory.recall(sig):  # the best last: ties go to the most recent
                if len(self.recalled):
                    self.recalled.extend([_SEPARATOR])  # no n-gram spans two recalled outputs
                self.recalled.extend(seq.tolist())
                self.recall_scores.append(round(score, 3))
        self._cache = None

    @property
    def recall_source(self) -> str:
        """The recalled outputs' name in acceptance keys: ``repeat`` where the best is this very
        prompt's answer (a greedy reply comes out the same), ``recall`` where it is a near one's (a
        paraphrase's reply often differs after a few tokens): accepted at very different rates,
        so learned apart."""
        return "repeat" if self.recall_scores and self.recall_scores[-1] >= REPEAT_SCORE else "recall"

    def end(self) -> None:
        """The generation is over: recorded (where wanted) and the store saved."""
        self._rec.commit()

    def reset(self) -> None:
        self._rec.commit()
        self.live.clear()
        self.recalled = LiveIndex(self.orders)
        self.recall_scores = []
        self._cache = None

    def offer(self, ctx: TokenBuffer, kmax: int) -> Offer | None:
        tokens, key = self._lookup(ctx, kmax)
        if not tokens:
            return None
        n = int(key.rsplit("/", 1)[1])
        return Offer(key, len(tokens), prior=(0.5 + 0.5 * n, 1.0))

    # draft, peek, accept: LookupDrafter's (the next lookup indexes the tokens the context gained)

    # -- lookup --------------------------------------------------------------------------------
    def _sync(self, ctx: TokenBuffer) -> None:
        if self.records:
            self._rec.ctx = ctx
        if len(ctx) > len(self.live):
            self.live.extend(ctx.view()[len(self.live):].tolist())

    def _best(self, keys: list[int]):
        """(order, token, source name, source) of the longest match over the sources, or None."""
        best = None
        for src, index in ((self.recall_source, self.recalled), ("ctx", self.live), ("doc", self.docs),
                           ("mem", self.memory if self.history else None)):
            if index is None or not len(index):
                continue
            m = index.best(keys, best[0] + 1 if best else 1)  # only a longer match can win
            if m is not None:
                best = (m[0], m[1], src, index)
                if m[0] == len(keys):
                    break
        return best

    def _lookup(self, ctx: TokenBuffer, k: int) -> tuple[list[int], str]:
        k = min(k, self.max_draft)
        c = self._cache
        if c is not None and c[0] == len(ctx) and c[1] >= k:
            return c[2][:k], c[3]
        self._sync(ctx)
        window = self.live.tokens[-self.orders:]
        tokens: list[int] = []
        key, first = "", 0
        index = None
        for i in range(k):
            keys = context_keys(window, self.orders)
            if index is None:
                m = self._best(keys)
                if m is None:
                    break
                n, tok, src, index = m
                key, first = f"{self.name}/{src}/{n}", n
            else:  # the draft goes on in the source it started from
                m = index.best(keys, min(first, 2))
                if m is None:
                    break
                tok = m[1]
            if tok == _SEPARATOR:  # the end of a recalled output
                break
            tokens.append(tok)
            window = window[1:] + [tok] if len(window) >= self.orders else window + [tok]
        self._cache = (len(ctx), k, tokens, key)
        return tokens, key

    # -- memory and documents ------------------------------------------------------------------
    def flush(self) -> None:
        """Record the last generation and write the store."""
        self._rec.flush()

    @property
    def recording(self) -> bool:
        """Whether finished generations are added to the memory (benchmarks turn it off and add
        one reference output per request with ``remember``, so every drafter sees the same memory)."""
        return self._rec.enabled

    @recording.setter
    def recording(self, on: bool) -> None:
        self._rec.ctx = None
        self._rec.enabled = bool(on)

    def remember(self, ids: Sequence[int], prompt: Sequence[int] | None = None) -> None:
        """Add a token sequence to the memory as a recorded generation would be: with ``prompt``,
        ``ids`` is the output that answered it (stored after the prompt's last tokens, recallable by
        a later prompt that repeats it); without, ``ids`` is stored as it is."""
        if self.memory is not None:
            if prompt is None:
                self.memory.add(ids)
            else:
                self._rec.add(list(prompt) + list(ids), len(prompt), prompt_signature(prompt))
            self._rec.save()

    def clear_memory(self) -> None:
        """Forget every stored output (and the generation that ran last) and delete the store file;
        a later generation writes a new one."""
        self._rec.ctx = None  # the generation that ran last is forgotten too
        self.recalled = LiveIndex(self.orders)  # (and what it recalled: memory_stats' "recalled" said so after)
        self.recall_scores = []
        self._cache = None
        if self.memory is not None:
            self.memory.delete()

    def add_documents(self, docs: Sequence[Sequence[int]]) -> int:
        """Index token sequences as documents; returns the tokens added."""
        seqs = [np.asarray(d, dtype=np.int64) for d in docs]
        n = sum(s.shape[0] for s in seqs)
        if self.document_tokens + n > self.max_document_tokens:
            raise DocumentError(f"the documents come to {self.document_tokens + n} tokens; at most "
                                f"{self.max_document_tokens} are indexed")
        self.docs.add(seqs)
        self.document_tokens += n
        self._cache = None
        return n

    def clear_documents(self) -> None:
        self.docs.clear()
        self.document_tokens = 0
        self._cache = None

    def stats(self) -> dict:
        m = self.memory
        return {"memory": m is not None, "memory_path": str(m.path) if m is not None and m.path else None,
                "memory_sequences": len(m) if m is not None else 0, "memory_tokens": m.tokens if m is not None else 0,
                "memory_cap_tokens": m.cap_tokens if m is not None else 0,
                "memory_evicted": m.evicted if m is not None else 0, "memory_bytes": m.nbytes if m is not None else 0,
                "recalled": list(self.recall_scores),
                "document_tokens": self.document_tokens, "document_bytes": self.docs.nbytes,
                "context_index_bytes": self.live.nbytes}


class _Recorder:
    """Adds each finished generation to the memory store and saves it; apart from the drafter, so
    that a finalizer can record the last generation when the engine goes (or at exit)."""

    def __init__(self, memory: MemoryStore | None, orders: int):
        self.memory = memory
        self.orders = orders
        self.ctx: TokenBuffer | None = None  # the running generation's context, recorded at its end
        self.prompt_len = 0
        self.signature: np.ndarray | None = None  # the running generation's prompt signature
        self.save_failed = False
        self.deferred = False  # a finalizer's save left to exit (the lock was held)
        self.enabled = True

    def commit(self, wait: bool = True) -> None:
        """Record the generation that ran (the prompt's last tokens as context, and the output)."""
        ctx, self.ctx = self.ctx, None
        if ctx is None or self.memory is None or not self.enabled or len(ctx) - self.prompt_len < 2:
            return
        self.add(ctx.view(), self.prompt_len, self.signature)
        self.save(wait)

    def add(self, seq: Sequence[int], prompt_len: int, signature: np.ndarray | None) -> None:
        """Store the output of ``seq`` (a prompt of ``prompt_len`` tokens, then its output) with the
        prompt's last ``orders`` tokens before it: a later draft can match from the prompt's end."""
        self.memory.add(seq[max(0, prompt_len - self.orders):], signature)

    def save(self, wait: bool = True) -> None:
        """The store written; ``wait`` false (the drafter's finalizer, run by whatever garbage-collection pass frees
        it, maybe inside this thread's own save of the same file): where another save holds the file's lock,
        written at exit instead of waiting."""
        if self.memory is None or not self.memory.dirty:
            return
        try:
            self.memory.save(wait)
        except SaveBusy:
            if not self.deferred:
                self.deferred = True
                atexit.register(self.save)
        except OSError as e:  # a full disk or a read-only cache: keep drafting from memory in RAM
            if not self.save_failed:
                warnings.warn(f"cannot save the drafting memory to {self.memory.path}: {e.strerror or e}; "
                              f"it is kept in memory only", stacklevel=2)
            self.save_failed = True

    def flush(self, wait: bool = True) -> None:
        self.commit(wait)
        self.save(wait)


def _amount(n: int) -> str:
    """A file size for a message: bytes under a KiB, KiB under a MiB (an API key file's bound is 4,096 bytes: "0
    MiB" said nothing), else MiB."""
    if n < 1024:
        return f"{n:,} bytes"
    if n < 1 << 20:
        return f"{n / 1024:.1f} KiB".replace(".0 KiB", " KiB")
    return f"{n / 2**20:.1f} MiB".replace(".0 MiB", " MiB")


def _a(what: str) -> str:
    return ("an " if what[:1] in "aeiouAEIOU" else "a ") + what


def read_document(path: str | os.PathLike, max_bytes: int = MAX_DOCUMENT_BYTES, what: str = "documents file",
                  error: type[Exception] = DocumentError) -> str:
    """A documents file's text; ``error`` (DocumentError) if it is missing, a directory, too large,
    binary or not UTF-8. ``what`` names the file in the messages (``edgespec generate --prediction``
    reads its file here too)."""
    if not isinstance(path, (str, os.PathLike)):
        raise error(f"a {what} is named by a path (a string), got {type(path).__name__}")
    p = Path(path)
    if "\x00" in str(p):
        raise error(f"no such {what}: {str(p)!r} (a path cannot hold a NUL byte)"[:300])
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise error(f"no such {what}: {p}") from None
    except OSError as e:
        raise error(f"cannot read the {what} {p}: {e.strerror or e}") from None
    if p.is_dir():
        raise error(f"{p} is a directory; pass the {what}s" if what == "documents file" else f"{p} is a directory")
    if size > max_bytes:
        has = _amount(size) if _amount(size) != _amount(max_bytes) else f"{size:,} bytes"  # (just past it: exact)
        raise error(f"{p} has {has}; {_a(what)} may have at most {_amount(max_bytes)}"
                    + (f" ({max_bytes:,} bytes)" if has.endswith(" bytes") and max_bytes >= 1024 else ""))
    try:  # read bounded: a pipe or a device (/dev/zero) says size 0 and may never end
        with open(p, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise error(f"cannot read the {what} {p}: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise error(f"{p} has more than {_amount(max_bytes)}; {_a(what)} may have at most {_amount(max_bytes)}")
    if b"\x00" in data:
        raise error(f"{p} is binary (it holds NUL bytes); " + ("documents must be text" if what == "documents file"
                                                               else f"{_a(what)} must be text"))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{p} is not UTF-8 text (byte {e.start})") from None


def suffix_drafter(engine) -> SuffixDrafter:
    d = engine.decoder.drafters.get("suffix")
    if d is None:
        raise ConfigError("this engine has no suffix drafter (its vocabulary is too large for the n-gram index)")
    return d


def add_documents(engine, paths: Sequence[str | os.PathLike] = (), texts: Sequence[str] = (),
                  names: Sequence[str] | None = None) -> int:
    """Read, tokenize and index documents for the engine's suffix drafter (all or none: every file
    is checked before any is indexed). Returns the tokens added. ``names``: the texts' names in errors (the files
    load() read them from; default "text N")."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    # (bytes were read as a list of ints, a number or None was a TypeError)
    if isinstance(paths, (bytes, bytearray)) or not isinstance(paths, Iterable):
        raise DocumentError(f"documents are named by a path or a list of paths, got {type(paths).__name__}")
    if isinstance(texts, str):
        texts = [texts]  # (one text is one document, not one a character)
    if isinstance(texts, (bytes, bytearray)) or not isinstance(texts, Iterable):
        raise DocumentError(f"texts must be a string or a list of strings, got {type(texts).__name__}")
    paths, texts = list(paths), list(texts)  # (a glob's generator, read once)
    for t in texts:
        if not isinstance(t, str):
            raise DocumentError(f"texts must be strings, got {type(t).__name__}")
        try:
            t.encode("utf-8")
        except UnicodeEncodeError:  # (a lone surrogate: the tokenizer's message spoke of "the prompt")
            raise DocumentError("a documents text is not valid UTF-8 (it holds a lone surrogate)") from None
    d = suffix_drafter(engine)
    names = list(names) if names is not None else [f"text {i}" for i in range(len(texts))]
    named = [(str(p), read_document(p)) for p in paths] + list(zip(names, texts))
    room = d.max_document_tokens - d.document_tokens
    seqs, total = [], 0
    for name, t in named:
        ids: list[int] = []
        for piece in _pieces(t, DOCUMENT_PIECE):
            # (in pieces, counted as they go: a 15 MiB file, under the byte limit, came to 4.9M tokens of Qwen's
            # and a 2.8 GiB peak before the token limit refused it)
            ids += engine.tokenizer.encode(piece, add_special=False)
            if total + len(ids) > room:
                already = f"; {d.document_tokens:,} indexed already" if d.document_tokens else ""
                raise DocumentError(f"{name} brings the documents to more than {d.max_document_tokens:,} tokens (at "
                                    f"most {d.max_document_tokens:,} are indexed{already})")
        total += len(ids)
        seqs.append(ids)
    with engine.decoder.held("add documents"):
        return d.add_documents(seqs)


DOCUMENT_PIECE = 1 << 18  # characters a documents file is tokenized in at a time


def _pieces(text: str, size: int):
    """``text`` in pieces of about ``size`` characters, each ending at a line break followed by a character that is
    no white space where there is one (where a tokenizer's words and white-space runs split anyway), else cut."""
    i, n = 0, len(text)
    while n - i > size:
        k = text.rfind("\n", i, i + size)
        while k > i and text[k + 1].isspace():
            k = text.rfind("\n", i, k)
        end = k + 1 if k > i else i + size
        yield text[i:end]
        i = end
    if i < n or not text:
        yield text[i:]
