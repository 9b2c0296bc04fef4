"""The draft -> verify -> accept loop. Knows nothing about text: token ids in, token ids out.

One round: the round policy picks a drafter and k (policy.py), the drafter drafts (drafters.py),
the target verifies the last token and the draft in one call, the acceptance rule keeps the
target's output (verify.py), and the target's cache and the drafter roll back what was rejected.
"""
from __future__ import annotations

import math
import os
import threading
import time
import warnings
import weakref
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from numbers import Integral, Real
from typing import Iterator, Sequence

import numpy as np

from .constrain import masked
from .drafters import DRAFTERS, EMPTY, MAX_DRAFT, Drafter, drafter_choices
from .prediction import MAX_PREDICTION, PredictionDrafter
from .errors import BusyError, ClosedError, ConfigError, ContextOverflowError, EdgespecError, shown
from .kv import TokenBuffer
from .lm import CausalLM, native_work
from .penalties import Penalizer
from .policy import RoundPolicy, cost_priors
from .sampling import SamplingParams, chosen, distribution, greedy_choice
from .verify import (alternate_dist, greedy_accept, greedy_accept_choice, rejection_sample,
                     rejection_sample_alternates)
from .width import padded_width


_TYPES = {"max_new_tokens": Integral, "temperature": Real, "top_k": Integral, "top_p": Real, "min_p": Real,
          "seed": Integral, "drafter": str, "draft_tokens": Integral, "max_draft_tokens": Integral,
          "logprobs": Integral,
          "presence_penalty": Real, "frequency_penalty": Real, "repetition_penalty": Real}
_OPTIONAL = ("seed", "draft_tokens", "logprobs")
MAX_LOGPROBS = 20  # the most likely alternatives a token's logprob can come with (OpenAI's bound)
MIN_REPETITION_PENALTY = 0.01  # (vLLM's and llama.cpp's > 0: below this, float32 logits overflow)
MAX_HEAL = 256  # bytes token healing may hold a reply to (one token's)
SCORE_CHUNK = 64  # prompt tokens a call when every position's logits are read (score): 39 MB of float32 on Qwen
_KIND_NAMES = {Integral: "an integer", Real: "a number", str: "a string"}


def _within(v, lo: float, hi: float) -> bool:
    """``lo <= v <= hi`` for a finite number (an integer too large for a float is not)."""
    try:
        f = float(v)
    except (OverflowError, TypeError, ValueError):
        return False
    return math.isfinite(f) and lo <= f <= hi


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0  # after temperature, top-k and top-p: the tokens at least min_p times as likely as the likeliest
    seed: int | None = None
    drafter: str = "auto"
    draft_tokens: int | None = None  # fixed k; None = adaptive
    max_draft_tokens: int = 8  # bound for the adaptive choice
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False  # decode max_new_tokens whatever the model says (benchmarks, memory measures)
    # token ids the reply is expected mostly to repeat (predicted outputs, prediction.py): drafted from by
    # position; the target verifies them as any draft, so the output does not depend on them
    prediction: tuple[int, ...] = ()
    # an llguidance grammar the reply is held to (structured outputs, constrain.py: response_format)
    grammar: str | None = None
    # each new token's log-probability under the target (``TokenLogprob``), with this many of the most
    # likely tokens at its position (0..MAX_LOGPROBS); None: not computed
    logprobs: int | None = None
    # the target's logits processed before the choice (penalties.py, vLLM's order): token id -> bias added
    # (-100..100), then the repetition penalty over prompt and reply (> 0; 1 = off), then the frequency and
    # presence penalties over the reply (-2..2)
    logit_bias: tuple[tuple[int, float], ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # token healing (healing.py): the bytes the reply must begin with, the prompt's last token backed off
    # (the engine sets it: generate(..., token_healing=True)); empty: none
    heal: bytes = b""

    def __post_init__(self):
        for name, kinds in _TYPES.items():  # an option of the wrong type is a ConfigError, not a TypeError
            v = getattr(self, name)
            if not (isinstance(v, kinds) and not isinstance(v, bool) or v is None and name in _OPTIONAL):
                raise ConfigError(f"{name} must be {_KIND_NAMES[kinds]}, got {shown(v)}")
            if isinstance(v, (np.integer, np.floating)):  # (numpy's int8 logprobs overflowed in the arithmetic after)
                object.__setattr__(self, name, v.item())
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {shown(self.max_new_tokens)}")
        if self.seed is not None and not 0 <= self.seed < 2**63:
            raise ConfigError(f"seed must be in 0..2**63-1, got {shown(self.seed)}")
        if self.drafter not in drafter_choices():
            raise ConfigError(f"drafter must be one of {', '.join(drafter_choices())}, got {self.drafter!r}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ConfigError(f"logprobs must be in 0..{MAX_LOGPROBS} (the most likely tokens listed beside each "
                              f"token), got {shown(self.logprobs)}")
        if self.draft_tokens is not None and not 0 <= self.draft_tokens <= MAX_DRAFT:
            raise ConfigError(f"draft_tokens must be in 0..{MAX_DRAFT}, got {shown(self.draft_tokens)}")
        if not 1 <= self.max_draft_tokens <= MAX_DRAFT:
            raise ConfigError(f"max_draft_tokens must be in 1..{MAX_DRAFT}, got {shown(self.max_draft_tokens)}")
        SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p)  # validates
        if not isinstance(self.ignore_eos, (bool, np.bool_)):  # ("no" would be true)
            raise ConfigError(f"ignore_eos must be true or false, got {shown(self.ignore_eos)}")
        pred = self.prediction
        if isinstance(pred, np.ndarray) and pred.ndim == 1 and pred.dtype.kind in "iu":
            pred = pred.tolist()
        if not isinstance(pred, (list, tuple)) or not all(isinstance(t, Integral) and not isinstance(t, bool)
                                                          for t in pred):
            raise ConfigError(f"prediction must be a sequence of token ids, got {type(pred).__name__}")
        if len(pred) > MAX_PREDICTION:
            raise ConfigError(f"the prediction has {len(pred)} tokens; at most {MAX_PREDICTION} are taken")
        object.__setattr__(self, "prediction", tuple(int(t) for t in pred))
        ends = self.stop_token_ids
        if isinstance(ends, np.ndarray) and ends.ndim == 1 and ends.dtype.kind in "iu":
            ends = ends.tolist()
        if not isinstance(ends, (list, tuple, set, frozenset)) or not all(
                isinstance(t, Integral) and not isinstance(t, bool) for t in ends):
            raise ConfigError(f"stop_token_ids must be a sequence of token ids, got {type(ends).__name__}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in ends))
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if not _within(v, -2.0, 2.0):
                raise ConfigError(f"{name} must be in -2..2, got {shown(v)}")
        if not _within(self.repetition_penalty, MIN_REPETITION_PENALTY, 10.0):  # (a smaller one overflowed float32
            # logits to inf: a BundleError blaming the model)
            raise ConfigError(f"repetition_penalty must be in [{MIN_REPETITION_PENALTY:g}, 10] (1 is off), got "
                              f"{shown(self.repetition_penalty)}")
        bias = self.logit_bias
        if isinstance(bias, dict):
            bias = list(bias.items())
        if not isinstance(bias, (list, tuple)) or not all(
                isinstance(kv, (list, tuple)) and len(kv) == 2 and isinstance(kv[0], Integral)
                and not isinstance(kv[0], bool) and isinstance(kv[1], Real) and not isinstance(kv[1], bool)
                for kv in bias):
            raise ConfigError("logit_bias must map token ids (integers) to biases (numbers)")
        seen = set()
        for t, b in bias:
            if not _within(b, -100.0, 100.0):
                raise ConfigError(f"logit_bias of token {shown(t)} must be in -100..100, got {shown(b)}")
            if int(t) in seen:
                raise ConfigError(f"logit_bias lists token {t} twice")
            seen.add(int(t))
        # (a zero bias changes nothing: left out, so that it does not turn the greedy fast path off)
        object.__setattr__(self, "logit_bias", tuple(sorted((int(t), float(b)) for t, b in bias if b != 0)))
        if self.grammar is not None and not isinstance(self.grammar, str):
            raise ConfigError(f"grammar must be an llguidance grammar (a string), got {type(self.grammar).__name__}")
        if not isinstance(self.heal, bytes):
            raise ConfigError(f"heal must be bytes, got {type(self.heal).__name__}")
        if len(self.heal) > MAX_HEAL:
            raise ConfigError(f"heal holds {len(self.heal)} bytes; a token's are at most {MAX_HEAL}")
        if self.heal and self.grammar is not None:
            raise ConfigError("token healing cannot be combined with a response format (its grammar holds the reply)")
        if self.grammar is not None and self.ignore_eos:
            raise ConfigError("ignore_eos cannot be used with a response format: the format ends the reply")
        if self.drafter == "prediction" and not self.prediction:
            raise ConfigError("drafter 'prediction' needs a prediction (the text the reply is expected to repeat)")

    @property
    def penalized(self) -> bool:
        """Whether the target's logits are processed (logit bias or a penalty)."""
        return bool(self.logit_bias) or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 \
            or self.repetition_penalty != 1.0

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p)


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the target's distribution at its position: the softmax
    of the target's logits as computed, before temperature, top-k/top-p or a response format's mask (what
    OpenAI and vLLM report), and ``top``: the most likely tokens there, (id, logprob), most likely first."""
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(rows: np.ndarray, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """``TokenLogprob`` of ``tokens[i]`` under the logits ``rows[i]`` (log-softmax: float32 exponentials summed
    in float64), each with the row's ``top`` most likely tokens (ties: the lower id first)."""
    out = []
    for i, t in enumerate(tokens):  # a row at a time: float32 exponentials summed in float64
        x = np.asarray(rows[i], dtype=np.float32)
        m = float(x.max())
        e = x - np.float32(m)
        np.exp(e, out=e)
        lse = m + math.log(float(e.sum(dtype=np.float64)))
        best = ()
        k = min(top, len(x))
        if k:
            cut = x[np.argpartition(x, len(x) - k)[len(x) - k:]].min()
            idx = np.flatnonzero(x >= cut)  # (every value tied at the cut: the lower ids win below)
            idx = idx[np.lexsort((idx, -x[idx]))][:k]
            best = tuple((int(j), float(x[j]) - lse) for j in idx)
        out.append(TokenLogprob(int(t), float(x[int(t)]) - lse, best))
    return out


@dataclass
class Step:
    tokens: list[int]
    finish_reason: str | None = None  # 'eos' | 'length' | 'context' | None
    logprobs: list[TokenLogprob] | None = None  # one per token, where the config asks for them


@dataclass
class Stats:
    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0  # prompt tokens not prefilled: the cache held them (restored ones included)
    restored_prompt_tokens: int = 0  # ... of which the prompt cache copied back (edgespec.prompt_cache)
    new_tokens: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    target_calls: int = 0
    alternates: int = 0  # alternates verified beside a draft token (a draft's second choices; sampled, drawn from q)
    alternates_kept: int = 0  # ... that the target kept (one token more than the draft's)
    accepted_by_position: list[int] = field(default_factory=list)
    drafted_by_position: list[int] = field(default_factory=list)
    rounds_by_drafter: dict[str, int] = field(default_factory=dict)
    drafted_by_drafter: dict[str, int] = field(default_factory=dict)
    accepted_by_drafter: dict[str, int] = field(default_factory=dict)
    prefill_ms: float = 0.0
    ttft_ms: float = 0.0
    draft_s: float = 0.0
    # the costly drafters' (the model's) calls in this generation: how many, the tokens they computed,
    # their time (scripts/gpu/predict.py prices them at another device's costs)
    model_calls: int = 0
    model_tokens: int = 0
    model_call_s: float = 0.0
    target_s: float = 0.0
    target_run_s: float = 0.0  # of target_s after prefill: inside the target's session.run
    total_s: float = 0.0
    finish_reason: str | None = None
    healed: str = ""  # token healing: the prompt's text the reply spelled again first, left out of the text returned
    # the prompt's last ids the reply's text is decoded after (Tokenizer.text_context; not in to_dict)
    text_context: tuple = field(default=(), repr=False)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_target_call(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Accepted draft tokens per verify round (plus one emitted token makes the round's yield)."""
        return self.accepted / self.rounds if self.rounds else 0.0

    @property
    def decode_s(self) -> float:
        return max(self.total_s - self.prefill_ms / 1000.0, 1e-9)

    @property
    def tokens_per_second(self) -> float:
        """Decode speed: tokens after the first over the time after prefill."""
        return max(self.new_tokens - 1, 0) / self.decode_s if self.new_tokens > 1 else 0.0

    @property
    def other_s(self) -> float:
        return max(self.total_s - self.draft_s - self.target_s, 0.0)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("text_context")
        d.update(
            acceptance_rate=round(self.acceptance_rate, 4),
            tokens_per_target_call=round(self.tokens_per_target_call, 4),
            mean_accepted_length=round(self.mean_accepted_length, 4),
            tokens_per_second=round(self.tokens_per_second, 3),
            other_s=round(self.other_s, 6),
            acceptance_by_position=[round(a / d_, 4) if d_ else None for a, d_ in
                                    zip(self.accepted_by_position, self.drafted_by_position)],
        )
        for k in ("prefill_ms", "ttft_ms"):
            d[k] = round(d[k], 3)
        for k in ("draft_s", "target_s", "target_run_s", "total_s"):
            d[k] = round(d[k], 6)
        return d


ORPHAN_WARN_S = 5.0  # GenerationLock.hold: how long a generation waits for an orphaned stream before it says so


class GenerationLock:
    """One generation at a time. Callers from other threads wait their turn; a call from the thread
    that holds it (a generate() inside a loop over a stream) would wait for itself forever, so it
    is refused with ``BusyError`` instead."""

    def __init__(self):
        self._lock = threading.Lock()
        # the threads whose stream holds it: the one that took it, and each that has read its stream since (a stream
        # handed on: a generate() in either is refused, not left waiting for itself). Thread objects, not idents: a
        # thread's ident is reused by a later thread once it ends, which then was refused as this stream's (session
        # 54, a review: a ThreadPoolExecutor task that raised mid-stream, its Future keeping the stream)
        self._owners: set[threading.Thread] = set()
        # the thread that last resumed the generation holding it, and whether that step is running now (a with-block's
        # exit closes a stream only its own thread, or a gone one, was reading; a forked child closes a decoder whose
        # step ran in another thread)
        self.reader: threading.Thread | None = None
        self.running = False

    @contextmanager
    def hold(self, what: str = "generate"):
        me = threading.current_thread()
        if me in self._owners:
            raise BusyError(f"cannot {what} while a generation is running in this thread: finish or close "
                            f"its stream first")
        said = False
        while not self._lock.acquire(timeout=ORPHAN_WARN_S):
            if not said and self.orphaned():  # (said, not refused: a stream handed on may be read yet)
                said = True
                import warnings

                warnings.warn(f"{what} waits for a stream that holds the engine and whose threads have all ended (one "
                              f"a thread made or read and left unfinished, kept alive by a reference such as a "
                              f"Future's exception): it waits until that stream is closed or let go",
                              RuntimeWarning, stacklevel=3)
        try:
            self._owners = {me}
            yield
        finally:
            self._owners, self.reader, self.running = set(), None, False
            self._lock.release()

    def orphaned(self) -> bool:
        """The lock is held by a suspended stream no live thread made or has read (whose reader has ended)."""
        return (self._lock.locked() and not self.running and self.reader_gone()
                and not any(t.is_alive() for t in list(self._owners)))

    def stepping(self, me: threading.Thread) -> None:
        """Thread ``me`` resumes the generation holding the lock (``running`` until ``running = False``)."""
        self.reader, self.running = me, True

    def owners_add(self, me: threading.Thread) -> None:
        """Thread ``me`` has read the stream holding the lock: a generate() in it is refused, not left waiting."""
        self._owners.add(me)

    def streams_left_by(self, me: threading.Thread) -> bool:
        """At the end of thread ``me``'s with-block: True where a stream holding the lock is ``me``'s to close (``me``
        made it or read it last, or its reader has ended, and no other live thread is reading it); where another
        thread reads it on, ``me`` stops being one of its owners (its close() waits for that reader) and False."""
        if not self._lock.locked():
            return False
        if not self.running and (self.reader is me or self.reader_gone()):
            return True
        if self.reader is not me:  # (this thread read it before handing it on)
            self._owners.discard(me)
        return False

    def reader_gone(self) -> bool:
        """The stream holding the lock was never read, or the thread that read it last has ended."""
        return self.reader is None or not self.reader.is_alive()

    def owned_by(self, me: threading.Thread) -> bool:
        """Whether thread ``me`` holds the lock: it took it, or has read the stream holding it."""
        return me in self._owners

    def stranded_in_child(self, me: threading.Thread) -> bool:
        """In a forked child (thread ``me``): the lock is held by a generation of a thread the child does not have."""
        return self._lock.locked() and (me not in self._owners or (self.running and self.reader is not me))

    @contextmanager
    def held_if_free(self):
        """True while this thread holds the lock: it did already, or took it without waiting; False
        where another thread's generation holds it (at exit, a daemon thread's)."""
        if threading.current_thread() in self._owners:
            yield True
            return
        got = self._lock.acquire(blocking=False)
        try:
            yield got
        finally:
            if got:
                self._lock.release()


_DECODERS: "weakref.WeakSet[Decoder]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A child forked while another thread of the parent held a decoder's lock (a generation running) inherits the
    lock held by a thread it does not have: its first generation waited forever. Such a decoder is closed in the
    child (its caches stopped mid-round), with a lock of its own."""
    from . import lm

    lm._RUNNING.clear()  # (the parent's calls in progress, in threads the child does not have)
    me = threading.current_thread()
    for d in list(_DECODERS):
        if d.lock.stranded_in_child(me):
            d.lock = GenerationLock()
            d.closed = ("this process was forked while another thread of its parent was generating: load the bundle "
                        "again in this process")


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Decoder:
    """Speculative generation over a target LM (``lm.CausalLM``) and drafters (``drafters.Drafter``).

    ``generate`` is a generator of ``Step``s; one generation runs at a time (a lock serializes
    callers from several threads). The target's cache is kept between generations, so a prompt
    that extends the previous one (a chat turn) only prefills the new tokens.
    """

    def __init__(self, target: CausalLM, eos_token_ids: Sequence[int] = (), *,
                 drafters: Sequence[Drafter] = (), clock=time.perf_counter):
        self.target = target
        self.clock = clock  # the cost model's time source (tests pass a simulated clock)
        self.eos = frozenset(int(e) for e in eos_token_ids)
        # in the registry's order, the order ``auto`` considers them in
        given = {d.name: d for d in drafters}
        self.drafters: dict[str, Drafter] = {n: given.pop(n) for n in list(DRAFTERS) if n in given}
        self.drafters.update(given)
        if "prediction" not in self.drafters:  # free, and idle without a prediction: always there
            self.drafters["prediction"] = PredictionDrafter()
        # alternates on where the target's extra verify rows are cheap (edgespec's AVX-512 paths), off elsewhere
        model = self.drafters.get("model")
        self.policy = RoundPolicy(use_alternates=bool(getattr(target, "cheap_rows", False)),
                                  **cost_priors(target, getattr(model, "lm", None)))
        for w, seconds in sorted((target.width_seconds or {}).items()):  # the width probe's calls, timed
            self.policy.measured.observe_target(w, seconds)
        self.lock = GenerationLock()
        # grammar -> constrain.Constraint for structured outputs (set by the engine, which has the tokenizer)
        self.constraints = None
        # () -> healing.Healer for token healing (set by the engine, which has the tokenizer)
        self.healer = None
        self.unavailable: dict[str, str] = {}  # drafter name -> why it is not loaded (for the refusal)
        _DECODERS.add(self)

    @property
    def vocab(self) -> int:
        return self.target.spec.vocab_size

    @contextmanager
    def held(self, what: str = "generate"):
        """The generation lock (``GenerationLock.hold``), then ``ClosedError`` where the engine was closed meanwhile: a
        call that waited for another thread's ``close()`` ran on the released models (a reset queued behind a close
        deleted the prompt cache file the close had just written)."""
        with self.lock.hold(what):
            if self.closed is not None:
                raise ClosedError(self.closed)
            yield

    def reset(self) -> None:
        """Forget every cached token (target, its prompt cache, and drafters). Waits for a generation
        in another thread; refused (``BusyError``) inside one's own unfinished stream."""
        with self.held("reset the engine"):
            self.reset_held()

    def reset_held(self) -> None:
        """``reset``'s work, the lock held by the caller."""
        self.target.reset()
        if self.target.prompt_cache is not None:
            self.target.prompt_cache.clear()
        for d in self.drafters.values():
            d.reset()

    def prefill(self, prompt: Sequence[int]) -> None:
        """Read ``prompt`` into the target and every drafter, as a generation would."""
        with self.held("prefill"):
            self.target.prefill(prompt)
            for d in self.drafters.values():
                d.begin(prompt)

    def check_ids(self, ids: Sequence[int], what: str) -> None:
        """``ConfigError`` for a token id of ``ids`` outside the target's vocabulary; ``what`` names them."""
        bad = next((t for t in ids if not 0 <= t < self.vocab), None)
        if bad is not None:
            raise ConfigError(f"{what} holds token id {shown(bad)}, outside the vocabulary (0..{self.vocab - 1})")

    def score(self, prompt: Sequence[int], top: int = 0) -> list[TokenLogprob]:
        """The target's logprob of each token of ``prompt`` after the first (``token_logprobs``: ``top``
        most likely tokens beside each), read from the first position in calls of ``SCORE_CHUNK`` tokens
        (the logits of every position are needed: a cached prefix cannot give them). The target's cache then
        holds ``prompt``: a generation after it prefills nothing more than its last token."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ConfigError("the prompt is empty")
        if isinstance(top, bool) or not isinstance(top, Integral) or not 0 <= top <= MAX_LOGPROBS:
            raise ConfigError(f"logprobs must be an integer in 0..{MAX_LOGPROBS}, got {shown(top)}")
        if len(prompt) > self.target.max_context:
            raise ContextOverflowError(f"the prompt has {len(prompt)} tokens; the context holds "
                                       f"{self.target.max_context}")
        self.check_ids(prompt, "the prompt")
        with self.held("score"):
            t = self.target
            pc = t.prompt_cache
            if pc is not None and t.length >= pc.min_tokens:  # the rows it overwrites are kept, as a prefill keeps them
                pc.save(t.cache)
            t.rewind(t.length)
            out: list[TokenLogprob] = []
            for start in range(0, len(prompt), SCORE_CHUNK):
                if start:
                    t.check_interrupt("the prompt's scoring", start, len(prompt))
                chunk = prompt[start:start + SCORE_CHUNK]
                logits = t.forward(chunk, copy=False)  # row i: the distribution of token start + i + 1
                out += token_logprobs(logits[:, : self.vocab], prompt[start + 1:start + 1 + len(chunk)], top)
            return out

    def check_drafter(self, name: str) -> None:
        """``ConfigError`` if the drafter ``name`` is not loaded (and why, e.g. no drafter model)."""
        if name not in ("auto", "none") and name not in self.drafters:
            why = self.unavailable.get(name, f"no {name} drafter is loaded")
            raise ConfigError(f"{why}; the drafters available: {', '.join([*self.drafters, 'auto', 'none'])}")

    def check_prediction(self, prediction: Sequence[int]) -> None:
        """``ConfigError`` for a prediction's ids out of the vocabulary, or more of them than the context holds."""
        self.check_ids(prediction, "the prediction")
        if len(prediction) > self.target.max_context:  # (a reply never gets near it; bounds a rejoin's scan)
            raise ConfigError(f"the prediction has {len(prediction)} tokens; a reply can have at most "
                              f"{self.target.max_context} (the context)")

    def _check(self, prompt_len: int, cfg: GenerationConfig) -> None:
        """What generate() refuses before anything runs."""
        if prompt_len == 0:
            raise ConfigError("the prompt is empty")
        self.check_drafter(cfg.drafter)
        self.check_prediction(cfg.prediction)
        self.check_ids([t for t, _ in cfg.logit_bias], "logit_bias")
        if cfg.grammar is not None and self.constraints is None:
            raise ConfigError("this engine has no tokenizer for structured outputs (response_format)")
        if prompt_len >= self.target.max_context:
            raise ContextOverflowError(
                f"the prompt has {prompt_len} tokens; the context holds {self.target.max_context} "
                f"(prompt plus at least one new token)")

    def generate(self, prompt_ids: Sequence[int], cfg: GenerationConfig | None = None,
                 stats: Stats | None = None) -> Iterator[Step]:
        """The generation's steps; what it refuses (``_check``, a grammar that does not compile, token healing without
        a tokenizer) is refused by the call itself, not at the first ``next()`` (since session 45: a stream's prompt
        too long for the context was refused only when read); the model runs from the first ``next()``, under the
        lock."""
        return self.run(self.prepare(prompt_ids, cfg), stats)

    def prepare(self, prompt_ids: Sequence[int], cfg: GenerationConfig | None = None) -> tuple:
        """``generate``'s checks, made now: what ``run`` takes (the prompt, the config, the reply's constraint)."""
        cfg = cfg or GenerationConfig()
        prompt = [int(t) for t in prompt_ids]
        self._check(len(prompt), cfg)
        con = self.constraints(cfg.grammar) if cfg.grammar is not None else None  # a bad grammar: refused now
        if getattr(con, "start", None) is not None:  # (a lazy one: whether the reply starts inside a <think>)
            con.start(prompt)
        if cfg.heal:  # the reply held to spell the bytes backed off first (as a grammar holds it)
            from .healing import HealConstraint

            if self.healer is None:
                raise ConfigError("this engine has no tokenizer for token healing")
            con = HealConstraint(self.healer(), cfg.heal)
        return prompt, cfg, con

    # set by Engine.close under the lock: a generation made before and read after is a ClosedError, not a run of the
    # released models
    closed: str | None = None

    def run(self, prepared: tuple, stats: Stats | None = None) -> Iterator[Step]:
        """The steps of a generation ``prepare`` checked; the model runs from the first ``next()``, under the lock."""
        prompt, cfg, con = prepared
        return self._held(prompt, cfg, stats if stats is not None else Stats(), con)

    def _held(self, prompt: list[int], cfg: GenerationConfig, st: Stats, con) -> Iterator[Step]:
        with self.held():
            gen = self._generate(prompt, cfg, st, con)
            try:
                while True:
                    self.lock.stepping(threading.current_thread())
                    with native_work(self):  # (a step's grammar masks run in llguidance's Rust, the GIL released: an
                        try:  # exit waits for the step as for a model call, see lm.native_work)
                            step = next(gen)
                        except StopIteration:
                            return
                        finally:
                            self.lock.running = False
                    yield step
                    # the lock is the thread's that reads the stream now too: a stream handed to another thread,
                    # whose generate() inside its loop waited on the lock its own stream held (a deadlock), is refused
                    self.lock.owners_add(threading.current_thread())
            finally:
                gen.close()
                self._ended()

    def _ended(self) -> None:
        """A generation is over (finished, stopped, or its stream closed): drafters that keep something of it
        (the suffix drafter's memory) keep it now, so that a memory cleared after the reply does not get it back
        at the next request (session 48: it was recorded at the next generation's start)."""
        for d in self.drafters.values():
            end = getattr(d, "end", None)
            if end is not None:
                try:
                    end()
                except (EdgespecError, MemoryError) as e:  # (the reply is out: what it could not keep is said)
                    warnings.warn(f"the {getattr(d, 'name', 'drafter')} drafter could not keep this generation: "
                                  f"{e}"[:300], stacklevel=2)

    def _generate(self, prompt: list[int], cfg: GenerationConfig, st: Stats, con=None) -> Iterator[Step]:
        sp, target, clock, policy = cfg.sampling, self.target, self.clock, self.policy
        rng = np.random.default_rng(cfg.seed)
        stop = (frozenset() if cfg.ignore_eos else self.eos) | frozenset(cfg.stop_token_ids)
        t_start = clock()
        st.prompt_tokens = len(prompt)
        calls0 = target.calls
        last = target.prefill(prompt)
        # drafters that draft from the target's hidden state (an assistant: mtp.py) get the row of each token's call
        readers = [d for d in self.drafters.values() if getattr(d, "reads_hidden", False)]
        for d in readers:
            d.observe_hidden(-1)
        st.reused_prompt_tokens, st.restored_prompt_tokens = target.last_reused, target.last_restored
        st.target_s += clock() - t_start
        st.target_calls += target.calls - calls0
        raw_last = last
        pen = Penalizer(self.vocab, prompt, cfg.logit_bias, cfg.presence_penalty, cfg.frequency_penalty,
                        cfg.repetition_penalty) if cfg.penalized else None
        if pen is not None:  # logit bias, penalties: on every row the choice is made from
            last = pen.rows(np.asarray(last)[None, : self.vocab])[0]
        if con is not None:  # structured outputs: the first token too is one the grammar allows
            last = masked(np.asarray(last)[None, : self.vocab], con.masks(())[0])[0]
        first = chosen(greedy_choice(last)) if sp.greedy else distribution(last[: self.vocab], sp).sample(rng)
        if con is not None:
            con.consume([first])
            if getattr(con, "done", False):  # healed: nothing is held from here
                con = None
        if pen is not None:
            pen.consume([first])
        want_lp = cfg.logprobs is not None
        first_lp = token_logprobs(np.asarray(raw_last)[None, : self.vocab], [first], cfg.logprobs) if want_lp else None
        t_d = clock()
        predicted = cfg.prediction if cfg.drafter != "none" else ()
        # set (or cleared) every generation: a prediction never outlives its request
        self.drafters["prediction"].set_prediction(predicted)
        for d in policy.begin(cfg.drafter, self.drafters, target.min_width,
                              reproducible=cfg.seed is not None and not sp.greedy,
                              width_multiple=target.width_multiple, sampled=not sp.greedy,
                              also=("prediction",) if predicted else ()):
            d.begin(prompt)  # a model drafter reads the prompt now: part of the time to first token
        st.draft_s += clock() - t_d
        st.prefill_ms = st.ttft_ms = (clock() - t_start) * 1000
        # greedy on the target's argmax alone: no logprobs to read, no penalties to apply to its logits
        plain_greedy = sp.greedy and not want_lp and pen is None
        # rounds of a drafter that lists its second choices: the target verifies those worth it too, greedy
        # or sampled (not with logprobs: an alternate's next token has no row of logits here; not with
        # penalties; and not while a constraint holds the reply: a grammar's, or token healing's until it is spelled)
        may_alternate = not want_lp and pen is None and policy.use_alternates and target.verifies_alternates
        ctx = TokenBuffer(prompt + [first], capacity=target.max_context)
        st.new_tokens = 1
        reason = "eos" if first in stop else ("length" if cfg.max_new_tokens <= 1 else None)
        if reason is None and len(ctx) >= target.max_context:
            reason = "context"
        st.total_s = clock() - t_start
        yield Step([first], reason, first_lp)
        run0 = target.run_seconds
        # the widest verify call the width probe checked (a GPU): k drafts make a call of k + 1,
        # padded under the width policy
        vcap = MAX_DRAFT
        if target.verified_width is not None:
            vcap = max((w for w in range(1, target.verified_width + 1)
                        if padded_width(w, target.min_width, target.width_multiple) <= target.verified_width),
                       default=1) - 1  # (a bound below the policy's narrowest call: no drafts)
        try:
            while reason is None:
                remaining = cfg.max_new_tokens - st.new_tokens
                # the target holds ctx[:-1]; feeding ctx[-1] and k drafts must fit the window
                kcap = min(remaining - 1, target.max_context - len(ctx))
                t0, m0 = clock(), None
                # (the verify bound caps the draft, not the generation's budget: the policy's horizon)
                choice = policy.choose(ctx, kcap, None if cfg.draft_tokens is None else min(cfg.draft_tokens, vcap),
                                       min(cfg.max_draft_tokens, vcap))
                if choice.drafter is None:
                    draft = EMPTY
                else:
                    kw = {}
                    # a dynamic draft (drafters.Offer.dynamic): ends on the drafter's confidence
                    if choice.stop is not None:
                        kw["stop"] = choice.stop
                    if choice.hint:  # a free drafter's guess the costly drafter checks in its first call
                        kw["hint"] = choice.hint
                        if choice.hint_stop is not None:
                            kw["hint_stop"] = choice.hint_stop
                    if may_alternate and con is None and getattr(choice.drafter, "gives_alternates", False):
                        kw["alternates"] = True
                    if con is not None and getattr(choice.drafter, "takes_grammar", False):
                        kw["grammar"] = con
                    dlm = getattr(choice.drafter, "lm", None) if choice.drafter.has_cost else None
                    m0 = (dlm.calls, dlm.tokens_run, dlm.call_seconds) if dlm is not None else None
                    draft = choice.drafter.draft(ctx, choice.k, sp, rng, **kw)
                allowed = None
                if con is not None:  # the grammar's masks for the call's rows (constrain.py)
                    allowed, valid = con.masks(draft.tokens)
                    if valid < len(draft.tokens) and (sp.greedy or draft.probs is None):
                        # a forbidden token ends what can be kept: the call need not compute past it
                        draft = replace(draft, tokens=draft.tokens[:valid], alts=(),
                                        probs=None if draft.probs is None else draft.probs[:valid])
                t1 = clock()
                if m0 is not None:
                    st.model_calls += dlm.calls - m0[0]
                    st.model_tokens += dlm.tokens_run - m0[1]
                    st.model_call_s += dlm.call_seconds - m0[2]
                alts = policy.alternates(len(draft.tokens), draft.alts,
                                         target.max_context - len(ctx) - len(draft.tokens),
                                         t1 - t0) if draft.alts and may_alternate and con is None else []
                if alts and not sp.greedy:  # sampled: each drawn now from q without the draft token beside it
                    alts = [(i, alternate_dist(draft.probs[i], draft.tokens[i])) for i, _ in alts]
                    alts = [(i, d.sample(rng)) for i, d in alts if d is not None]
                kept_alt, extra = None, []  # the row of the alternate the target kept; its next token
                if alts:  # the draft and its alternates, each alternate beside the draft token it stands for
                    k = len(draft.tokens)
                    ids = [ctx[-1]] + draft.tokens + [t for _, t in alts]
                    at = list(range(k + 1)) + [i + 1 for i, _ in alts]
                    if sp.greedy:
                        top = target.forward_alternates(ids, at)
                        dt = clock() - t1
                        n, nxt = greedy_accept_choice(draft.tokens, top[: k + 1])
                        # kept where the draft's token n is not the target's and its alternate is
                        j = next((j for j, (i, t) in enumerate(alts) if i == n and t == nxt), None)
                    else:  # the rejection rule with the alternates (read before the next call)
                        rows = target.forward_alternates(ids, at, logits=True)[:, : self.vocab]
                        dt = clock() - t1
                        n, nxt, i = rejection_sample_alternates(draft.tokens, draft.probs, rows[: k + 1], sp, rng,
                                                                dict(alts))
                        j = None if i is None else next(j for j, (a, _) in enumerate(alts) if a == i)
                    if j is not None:
                        kept_alt = k + 1 + j
                        # the target's token after the alternate
                        extra = [chosen(top[kept_alt]) if sp.greedy else distribution(rows[kept_alt], sp).sample(rng)]
                        # into the slot after the kept draft tokens (the rewind below then leaves one row more:
                        # the alternate's)
                        target.keep_alternate(kept_alt, n + 1)
                    target.rewind(len(alts) - (kept_alt is not None))
                    policy.observe_alternates(kept_alt is not None, len(alts), target.last_width, dt)
                    st.alternates += len(alts)
                    st.alternates_kept += kept_alt is not None
                elif plain_greedy and con is None:
                    # the target's top tokens (on a GPU: computed there, the logits never copied)
                    top = target.forward_argmax([ctx[-1]] + draft.tokens)
                    dt = clock() - t1
                    n, nxt = greedy_accept_choice(draft.tokens, top)
                else:
                    logits = target.forward([ctx[-1]] + draft.tokens, copy=False)  # read before the next call
                    raw = logits[:, : self.vocab]
                    rows = raw if pen is None else pen.rows(raw, draft.tokens)
                    rows = rows if con is None else masked(rows, allowed)
                    dt = clock() - t1
                    if sp.greedy:  # (held to a grammar)
                        n, nxt = greedy_accept(draft.tokens, rows)
                    else:
                        n, nxt = rejection_sample(draft.tokens, draft.probs, rows, sp, rng)
                k = len(draft.tokens)
                for d in readers:  # (the row that produced the round's last token: the kept alternate's, else n)
                    d.observe_hidden(n if kept_alt is None else kept_alt)
                target.rewind(k - n)
                policy.observe(choice, draft.tokens, n, draft.step_s, target.last_width, dt, catchup=draft.catchup,
                               alternates=len(alts))
                if choice.drafter is not None:
                    choice.drafter.accept(n, nxt)
                _count_round(st, choice.drafter.name if k else "none", k, n, t1 - t0, dt)
                # what plain decoding would emit of these, token by token: up to the length and the context's room (the
                # context never grows past the window), then up to a stop token among those kept; the reason is the
                # limit that ended it (a stop token first, then the length, then the context, as one token at a time)
                room = target.max_context - len(ctx)
                new = (draft.tokens[:n] + [nxt] + extra)[:min(remaining, room)]
                for j, t in enumerate(new):
                    if t in stop:
                        new = new[: j + 1]
                        reason = "eos"
                        break
                if reason is None and len(new) >= remaining:
                    reason = "length"
                elif reason is None and len(new) >= room:
                    reason = "context"
                if con is not None and reason is None:
                    con.consume(new)
                    if getattr(con, "done", False):
                        con = None
                if pen is not None:
                    pen.consume(new)
                lps = token_logprobs(raw, new, cfg.logprobs) if want_lp else None  # (raw: read before the next call)
                ctx.extend(new)
                st.new_tokens += len(new)
                st.target_run_s = target.run_seconds - run0
                st.total_s = clock() - t_start
                yield Step(new, reason, lps)
        except BaseException:
            # a round cut short (Ctrl-C, an error, a consumer's exception thrown in at a yield): the target back to
            # what it held when the round began, ctx[:-1] (no round writes below it). After a verify call with
            # alternates it listed their ids over rows computed beside the draft's positions, and a later prompt
            # reaching those slots read them as its own (wrong output, plain decoding's included)
            extra_rows = target.length - (len(ctx) - 1)
            if extra_rows > 0:
                target.rewind(extra_rows)
            raise
        st.finish_reason = reason
        st.total_s = clock() - t_start


def _count_round(st: Stats, name: str, k: int, n: int, draft_s: float, target_s: float) -> None:
    st.draft_s += draft_s
    st.target_s += target_s
    st.target_calls += 1
    st.rounds_by_drafter[name] = st.rounds_by_drafter.get(name, 0) + 1
    if not k:
        return
    st.rounds += 1
    st.drafted += k
    st.accepted += n
    st.drafted_by_drafter[name] = st.drafted_by_drafter.get(name, 0) + k
    st.accepted_by_drafter[name] = st.accepted_by_drafter.get(name, 0) + n
    while len(st.drafted_by_position) < k:
        st.drafted_by_position.append(0)
        st.accepted_by_position.append(0)
    for i in range(k):
        st.drafted_by_position[i] += 1
        st.accepted_by_position[i] += 1 if i < n else 0
