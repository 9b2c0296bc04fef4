"""The causal LM protocol every model in the decoding loop follows, real (``OnnxLM``) or simulated.

A model owns a cache (``TokenCache``: the ids whose keys/values it holds) and computes logits for
new tokens appended to it. ``forward`` is the only place that applies the exactness width policy
(docs/how-it-works.md, "Exactness"): where a kernel computes a one-token call with other arithmetic than a wider
call (onnxruntime's CPU MatMulNBits at accuracy level 4, MLAS' float GEMV), every call carries at
least ``min_width`` tokens, rounded up to a multiple of ``width_multiple`` (a kernel that computes
rows in pairs): a narrower call is padded and the pad rolled back, so every position is computed
the same way whatever the draft length. ``last_width`` is the width the last call really
ran, which is what the round policy's cost model learns from.
"""
from __future__ import annotations

import atexit
import threading
import time
import weakref
from contextlib import contextmanager
from typing import Sequence

import numpy as np

from .errors import ContextOverflowError, Interrupted
from .kv import TokenCache
from .sampling import greedy_choice
from .width import padded_width


# At exit no thread may be inside a model's call: CPython ends a daemon thread that wants the GIL back during the
# interpreter's shutdown with pthread_exit, which aborts the process through onnxruntime's C++ frames ("terminate
# called without an active exception", SIGABRT, exit 134: an app generating on a daemon thread, stopped by Ctrl-C or
# a plain exit). Each call is listed while it runs, and none starts once the process exits (its thread waits for the
# end); the exit waits for the calls listed (a call's time, ~0.1 s, at most EXIT_WAIT_S). (The server exits with
# os._exit for the same reason.)
_RUNNING: weakref.WeakSet = weakref.WeakSet()  # the owners of native work in progress (models, decoders)
_EXITING = False
EXIT_WAIT_S = 10.0


_MINE = threading.local()  # the owners this thread's native_work lists, outermost first


@contextmanager
def native_work(owner):
    """Native code ``owner`` runs that releases the GIL (a model's call, a generation step's grammar masks in
    llguidance's Rust): listed while it runs, and not begun once the process exits (the thread parked instead,
    every owner it listed let go: a step parked at its prefill's next call no longer held the exit for 10 s)."""
    mine = getattr(_MINE, "owners", None)
    if mine is None:
        mine = _MINE.owners = []
    _RUNNING.add(owner)  # (listed first, then the flag read: the exit sees this work, or this work sees the exit)
    mine.append(owner)
    try:
        # (a daemon thread, at exit: parked, the GIL released, until the process ends; raising here printed its
        # traceback at every such exit. The main thread runs the exit itself, no finalization ends it: an atexit
        # function that generates (one registered before edgespec's import runs after edgespec's) was parked for
        # ever, the process hung)
        if _EXITING and threading.current_thread() is not threading.main_thread():
            for o in mine:
                _RUNNING.discard(o)
            threading.Event().wait()
        yield
    finally:
        mine.pop()
        _RUNNING.discard(owner)


def _calls_done_at_exit() -> None:
    global _EXITING
    _EXITING = True
    deadline = time.monotonic() + EXIT_WAIT_S
    while len(_RUNNING) and time.monotonic() < deadline:
        time.sleep(0.002)


atexit.register(_calls_done_at_exit)


class CausalLM:
    """Subclasses set ``spec`` (role, vocab_size), ``max_context`` and ``cache`` and implement
    ``_run(ids, past) -> float32 logits [len(ids), vocab]`` (computing positions past.. over the
    cache's first ``past`` ids and writing their keys/values after them). A subclass whose last
    ``_run`` returned a view of a buffer its next call writes again sets ``_returned_view``; one
    that sets ``device_argmax`` also takes ``_run(ids, past, argmax=True) -> int64 [len(ids)]``."""

    spec: object
    max_context: int
    cache: TokenCache
    min_width: int = 1
    width_multiple: int = 1
    prefill_chunk: int = 256
    # seconds a call of each width took when the exactness width was measured (width.measure_width);
    # None where it was not: the round policy then starts from its priors
    width_seconds: dict | None = None
    # the widest call the width probe found computing its rows as the narrower ones do (on a GPU,
    # whose kernels may change with the number of rows anywhere): the decoder verifies no more
    # tokens a call; None: no bound (the CPU)
    verified_width: int | None = None
    # a prefill's last token fed in a call of its own (``feed``): a target whose calls are bounded to verified widths
    split_last: bool = False
    # copies of earlier sequences' KV rows (edgespec.prompt_cache; CPU caches): a prefill restores the
    # longest kept prefix of its prompt and keeps what it overwrites. None: none kept
    prompt_cache: object | None = None
    last_reused = last_restored = 0  # the last prefill's: positions it kept (restored ones included), restored
    _returned_view: bool = False

    def _init_counters(self) -> None:
        self.calls = 0
        self.run_seconds = 0.0  # time inside the model's own run (session.run), kept by _run
        self.call_seconds = 0.0  # time in its calls (_run with what surrounds it there)
        self.tokens_run = 0  # tokens its calls computed, padding included
        self.last_width = 0  # tokens the last call computed, padding included

    # -- state -------------------------------------------------------------------------------
    @property
    def length(self) -> int:
        return self.cache.length

    @property
    def tokens(self) -> list[int]:
        """The cached ids as a list (a copy: for tests and reports, not the hot path)."""
        return self.cache.ids.tolist()

    def rewind(self, n: int) -> None:
        self.cache.rewind(n)

    def reset(self) -> None:
        self.cache.reset()

    # -- compute -----------------------------------------------------------------------------
    def _run(self, ids: Sequence[int], past: int, argmax: bool = False) -> np.ndarray:
        raise NotImplementedError

    def forward(self, ids: Sequence[int], *, copy: bool = True) -> np.ndarray:
        """Append ``ids`` to the cache and return float32 logits ``[len(ids), vocab]``. ``copy=False``
        (the decoding loop, read before the next call): they may be a view that this model's next
        call overwrites; a copy of ~0.6 MB a token less on Qwen's vocabulary."""
        logits = self._call(ids, False)
        return logits.copy() if copy and self._returned_view else logits

    def forward_from(self, ids: Sequence[int], first: int, *, copy: bool = True) -> np.ndarray:
        """``forward(ids)[first:]``: the logits of positions ``first`` on only, the others not computed
        where the model skips them (``skips_logits``: a drafter's catch-up with a hint reads a long
        stretch and needs its last rows only)."""
        n = len(ids)
        if not 0 <= first < n:
            raise ValueError(f"forward_from: first must be in 0..{n - 1}, got {first}")
        logits = self._call(ids, False, first=first)
        return logits.copy() if copy and self._returned_view else logits

    def forward_argmax(self, ids: Sequence[int]) -> np.ndarray:
        """``forward`` for greedy decoding: the index of each position's largest logit (int64
        ``[len(ids)]``, the first among equal values), the same positions computed the same way
        (the width policy applies alike). A model that computes it where the logits are (a GPU
        graph's ``argmax`` output, ``device_argmax``) copies only the indices; others take
        numpy's argmax of the logits."""
        if not self.device_argmax:
            return greedy_choice(self.forward(ids, copy=False))
        return self._call(ids, True)

    # checked between a prefill's calls (``feed``) and a prompt's scoring's: True stops it with ``Interrupted`` (the
    # server's, while a request runs: its client left or the server stops; a 2,500-token prompt's prefill, ~13 s on
    # the Qwen pair, went on to its end first, the engine busy and the queue waiting)
    interrupt = None

    def check_interrupt(self, what: str, done: int, total: int) -> None:
        """``Interrupted`` where ``interrupt`` says so, between the calls of ``what`` (``done`` of ``total`` tokens
        fed)."""
        if self.interrupt is not None and self.interrupt():
            role = getattr(getattr(self, "spec", None), "role", "model")
            raise Interrupted(f"{role}: {what} was interrupted after {done} of {total} tokens")
    device_argmax: bool = False  # _run(..., argmax=True) returns the indices
    skips_logits: bool = False  # _run(..., skip=s) computes logits for the last len(ids) - s positions only
    # _run(..., positions=p) computes row i at position past + p[i] (alternates: see forward_alternates)
    verifies_alternates: bool = False

    def forward_alternates(self, ids: Sequence[int], positions: Sequence[int], logits: bool = False) -> np.ndarray:
        """``forward_argmax`` of a call whose rows after the causal ones (``positions`` 0, 1, ..., m - 1)
        are alternates: row i (i >= m) stands at position ``positions[i]`` (< m) beside the causal
        row there, seeing the rows before it and itself, computed as a one-token call of it after
        those rows would be (``verifies_alternates`` models only). Its keys and values sit at its own
        slot: ``keep_alternate`` moves an accepted one into its position. ``logits``: every row's
        logits instead (sampled rounds; as ``forward(copy=False)``, read before the next call)."""
        n = len(ids)
        if not self.verifies_alternates:
            raise ValueError(f"{self.spec.role}: this model does not verify alternates")
        if self.min_width != 1 or self.width_multiple != 1:
            raise ValueError(f"{self.spec.role}: alternates need one-token calls (the width policy pads this model's)")
        if len(positions) != n:
            raise ValueError(f"{self.spec.role}: {len(positions)} positions for {n} tokens")
        return self._call(ids, not logits, positions=positions)

    def keep_alternate(self, row: int, position: int) -> None:
        """After a ``forward_alternates`` call of the cache's last tokens: the alternate at ``row`` of
        that call (counted from the call's first row, which sat at cache slot ``self.last_past``) is
        moved into its ``position``'s slot. The caller then rewinds past it."""
        self.cache.move(self.last_past + row, self.last_past + position)

    last_past = 0  # the cache's length before the last call

    def _call(self, ids: Sequence[int], argmax: bool, first: int = 0, positions=None) -> np.ndarray:
        """``first``: the logits of positions ``first`` on only, computed alone where the model skips
        the others' (``skips_logits``); the keys and values of every position as ever. ``positions``:
        see ``forward_alternates`` (no padding)."""
        n = len(ids)
        if n == 0:
            raise ValueError("forward() needs at least one token")
        past = self.cache.length
        if past + n > self.max_context:
            raise ContextOverflowError(
                f"{self.spec.role}: {past} + {n} tokens exceed the context of {self.max_context}")
        width = padded_width(n, self.min_width, self.width_multiple)
        pad = back = 0
        if width > n and past + width <= self.max_context:
            pad = width - n  # copies of the last token after the call's, rolled back
        elif width > n and positions is None:
            # the context's last positions, where a pad after them has no room: the call starts ``back`` positions
            # earlier, recomputing cached ones (under the policy every allowed width computes a position alike: the
            # same keys, values and logits), so it runs at the policy's width as every other call (before session 43
            # these ran unpadded, at other widths in plain and speculative decoding); with too few cached positions
            # for that, a pad after the call fills the rest (a context under twice the narrowest width ran such a
            # call unpadded: session 56, a review)
            back = min(past, past + width - self.max_context)
            pad = min(width - n - back, self.max_context - past - n)
        if pad or back:
            run = ([int(t) for t in self.cache.ids[past - back: past]] + [int(t) for t in ids]
                   + [int(ids[-1])] * pad)
            first += back
        else:
            run = ids
        skip = 0
        if first and not argmax and self.skips_logits:
            # the lm_head gets a width the policy allows (the rows from ``first`` on, the pad's included,
            # rounded up): a kernel's rows may depend on how many a call has, and a prefill that feeds one
            # token (a repeated prompt, a restored prefix, a chat turn after a cut draft) runs the
            # policy's narrowest call, so every prefill computes its last position's logits alike
            rows = min(len(run), padded_width(len(run) - first, self.min_width, self.width_multiple))
            skip = len(run) - rows
        self.last_past = past
        t0 = time.perf_counter()
        at = past - back
        with native_work(self):
            if positions is not None:
                out = self._run(run, at, argmax=argmax, positions=positions)
            elif argmax:
                out = self._run(run, at, argmax=True)
            else:
                out = self._run(run, at, skip=skip) if skip else self._run(run, at)
        self.calls += 1
        self.call_seconds += time.perf_counter() - t0
        self.tokens_run += len(run)
        self.last_width = len(run)
        self.cache.ids.extend(ids)  # the pad's keys/values sit past the length: overwritten later
        if first:  # row 0 of a skipping call is position ``skip`` (the pad's rows follow the last)
            out = out[first - skip: back + n - skip]
            self._hidden_rows = (first - skip, len(out))  # (the same rows of the hidden states: OnnxLM.hidden_of)
            return out
        out = out[:n] if pad else out
        self._hidden_rows = (0, len(out))
        return out

    def feed(self, ids: Sequence[int]) -> np.ndarray:
        """Append ``ids`` in calls of at most ``prefill_chunk`` tokens (the transient logits stay
        ``prefill_chunk x vocab`` whatever the length); return the last position's logits. Each call
        asks for its last position's logits only: a model that skips the others' (``skips_logits``)
        does not compute them (on the Qwen 1.5B, the lm_head is ~18% of a prefill)."""
        logits = None
        # where calls are bounded to the widths the probe verified (onnxruntime's kernels, a GPU), the last token
        # goes in a call of its own, at the policy's narrowest width: a prompt's first reply token then comes from the
        # logits a repeated prompt computes (it feeds its last token alone), whatever the chunk's width (MLAS computed
        # the last row of a 33-token chunk otherwise: two greedy choices of one request, n = 2, differed)
        last = len(ids) - 1 if self.split_last and len(ids) > 1 else len(ids)
        for start in range(0, last, self.prefill_chunk):
            if start:
                self.check_interrupt("the prefill", start, len(ids))
            chunk = ids[start: min(start + self.prefill_chunk, last)]
            logits = self.forward_from(chunk, len(chunk) - 1, copy=False)
        if last < len(ids):
            if last:
                self.check_interrupt("the prefill", last, len(ids))
            logits = self.forward_from(ids[last:], 0, copy=False)
        out = logits[-1]
        return out.copy() if self._returned_view else out

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Make the cache hold exactly ``ids``, keeping the prefix it shares with them (a chat
        turn extends the last one); return the last position's logits."""
        if not len(ids):
            raise ValueError("prefill() needs at least one token")
        if len(ids) > self.max_context:
            raise ContextOverflowError(f"{len(ids)} tokens do not fit the context of {self.max_context}")
        common = min(self.cache.ids.common_prefix(ids), len(ids) - 1)  # feed >= 1 token to get logits
        if not self.cache.reachable(common):  # (convolution states: the recent positions only)
            common = 0  # (read from the start; the cache's content left for the prompt cache to keep, the states
            # zeros at the first call: ConvStates.seek(0))
        live = common
        if self.prompt_cache is not None:
            common = self.prompt_cache.before_prefill(self.cache, ids, common)
        self.cache.rewind(self.cache.length - common)
        self.last_reused, self.last_restored = common, common - live if common > live else 0
        return self.feed(ids[common:])
