"""Token healing: a prompt that ends inside what the model would write as one token (an editor's cursor after
``    ret``, a prompt ending in a space) is encoded with that text as a token of its own, which the model
rarely saw there: replies go wrong (``ret`` then ``urn``, a second space, a mis-indented line). Healing backs
the prompt's last token off and holds the reply's first tokens to spelling it again: the model picks the
token that continues it best (``return``), and the text returned starts after what the prompt already had.

``HealConstraint`` holds the reply to the bytes backed off, in the protocol of a structured output's
grammar (constrain.Constraint: masks for a verify call's rows, the tokens kept, drafting with it), so the
decoder's masking keeps the output that of target-only decoding with the same constraint, under every
drafter. It is done once the bytes are spelled; from there nothing is masked.
"""
from __future__ import annotations

import bisect
import threading
from typing import Sequence

import numpy as np

_TOP = b"\xff" * 512  # after every token's bytes that start with a given prefix (tokens are far shorter)


class Healer:
    """A vocabulary's token bytes, indexed for ``mask(rest)``: the tokens a reply may start with to spell
    ``rest`` (those that are a prefix of it, and those that begin with it). Special tokens never heal."""

    @classmethod
    def of(cls, tokenizer, vocab: int) -> "Healer":
        specials = {tokenizer.token_to_id(t) for t in tokenizer.special_ids_texts()}
        return cls([b"" if i in specials else tokenizer.token_bytes(i) for i in range(vocab)])

    def __init__(self, table: Sequence[bytes]):
        """``table[i]``: token i's bytes (empty: a token that never heals)."""
        vocab = len(table)
        self.vocab = vocab
        self.table = [bytes(b) for b in table]
        order = sorted((i for i in range(vocab) if self.table[i]), key=self.table.__getitem__)
        self._sorted = [self.table[i] for i in order]
        self._ids = np.array(order, dtype=np.int64)
        self._exact: dict[bytes, list[int]] = {}
        for i in order:
            self._exact.setdefault(self.table[i], []).append(i)
        self._cache: dict[bytes, np.ndarray] = {}
        self._lock = threading.Lock()

    def mask(self, rest: bytes) -> np.ndarray:
        """bool[vocab]: the tokens whose bytes are a prefix of ``rest`` or begin with it (``rest`` not empty)."""
        with self._lock:
            m = self._cache.get(rest)
            if m is None:
                m = np.zeros(self.vocab, dtype=bool)
                for k in range(1, len(rest) + 1):
                    m[self._exact.get(rest[:k], [])] = True
                lo, hi = bisect.bisect_left(self._sorted, rest), bisect.bisect_left(self._sorted, rest + _TOP)
                m[self._ids[lo:hi]] = True
                if len(self._cache) < 256:
                    self._cache[rest] = m
            return m


class HealConstraint:
    """The reply held to begin with ``need`` (bytes), as constrain.Constraint holds it to a grammar."""

    def __init__(self, healer: Healer, need: bytes):
        if not need:
            raise ValueError("nothing to heal")
        self.h, self.need = healer, bytes(need)
        self.covered = 0  # bytes of the reply kept so far
        self._pushed = 0  # bytes of the tokens a drafter pushed
        self._all = None

    @property
    def done(self) -> bool:
        return self.covered >= len(self.need)

    def _at(self, covered: int) -> np.ndarray:
        if covered >= len(self.need):
            if self._all is None:
                self._all = np.ones(self.h.vocab, dtype=bool)
            return self._all
        return self.h.mask(self.need[covered:])

    def masks(self, draft) -> tuple[np.ndarray, int]:
        """(allowed, n) as ``Constraint.masks``: row i the tokens allowed after the draft's first i tokens."""
        rows, cov, n = [self._at(self.covered)], self.covered, 0
        for t in draft:
            if not rows[-1][int(t)]:
                break
            cov += len(self.h.table[int(t)])
            n += 1
            rows.append(self._at(cov))
        return np.stack(rows), n

    def mask(self) -> np.ndarray:
        return self._at(self.covered + self._pushed)

    def push(self, token: int) -> bool:
        self._pushed += len(self.h.table[int(token)])
        return True

    def pop(self) -> None:
        self._pushed = 0

    def consume(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.covered += len(self.h.table[int(t)])
