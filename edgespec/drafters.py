"""Drafters: something cheap that proposes the next tokens for the target to verify.

Every drafter follows one protocol, and the decoding loop calls it without knowing its type:

- ``begin(prompt)``: a generation starts from ``prompt`` (a model drafter reads it here, as part of
  the time to first token; a chat turn keeps the prefix it shares with the last one).
- ``offer(ctx, kmax) -> Offer | None``: what it could draft now, cheaply: up to how many tokens and
  under which acceptance estimate (``key``). The round policy prices every offer and picks one.
- ``draft(ctx, k, sp, rng) -> Draft``: the tokens (and, when sampled, their probabilities ``q``; a
  drafter without them is a point mass for the rejection rule, see verify.py). A drafter whose
  offers are ``dynamic`` also takes ``stop=theta``: end the draft (at most ``k``) once its own
  confidence that the whole draft survives verification falls below theta.
- ``accept(n, bonus)``: the target kept the first ``n`` tokens of the last draft and emitted
  ``bonus`` after them; the drafter brings its own position up to date.
- ``reset()``: forget everything cached (the engine's ``reset``).

``ctx`` is the generation's ``TokenBuffer`` (prompt and output so far), read-only to drafters.
To add a drafter, write one class with these methods, a ``name``, ``has_cost`` (its drafting costs
model calls) and a ``build(env)`` classmethod, and decorate it with ``@register``: ``--drafter NAME``,
``auto`` and the round policy pick it up.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

from .errors import BundleError
from .kv import TokenBuffer
# the most draft tokens a round may ask for; drafters are built with this cap (the request's bound applies)
from .profiles import MAX_DRAFT  # noqa: F401  (re-exported: decoder, suffix)
from .sampling import Dist, SamplingParams, distribution
from .tokenizer import fim_split


@dataclass(frozen=True)
class Offer:
    key: str  # the acceptance estimate that judges this draft ("model", "prompt-lookup/3")
    max_tokens: int  # at most this many tokens now
    prior: tuple[float, float] = (1.2, 0.8)  # (accepted, rejected) pseudo-counts for a new estimate
    upfront: int = 0  # context tokens it must read before drafting (a model drafter catching up), 0: none
    # the drafter can end a draft on its own confidence: ``draft(..., stop=theta)`` stops once the
    # product of its top probabilities over the draft so far falls below theta (the policy prices theta)
    dynamic: bool = False
    # a new generation's estimate starts from what earlier generations learned (False: from the prior: a
    # draft whose worth depends on the request, not on the drafter, as a request's prediction)
    carry: bool = True

    @property
    def prior_alpha(self) -> float:
        """The acceptance rate the prior stands for."""
        return self.prior[0] / (self.prior[0] + self.prior[1])


@dataclass
class Draft:
    tokens: list[int]
    probs: list[Dist] | None = None  # q of each position (processed with the sampling settings), or None (deterministic)
    key: str = ""
    step_s: float | None = None  # seconds per drafter step measured while drafting (costly drafters)
    catchup: tuple[int, float] | None = None  # (tokens, seconds) of a long catch-up read before drafting
    # drafts asked for alternates: per draft token i, (i, the drafter's second choice there (sampled: None,
    # drawn once picked), its calibrated top probability, the chance an alternate there is kept: greedy, the
    # second choice's probability; sampled, _rescue); the round policy picks which the target verifies
    # beside the draft (RoundPolicy.alternates)
    alts: tuple = ()


EMPTY = Draft([])

# A model draft of a fixed length (a request's draft_tokens) stops once the drafter's top probability
# drops below this. Measured on the Qwen pair, k=4: chat 18.2 -> 24.4 tok/s, summarization 16.2 ->
# 18.7, code unchanged (README). An adaptive draft stops on the product of them instead, at a
# threshold the round policy derives from the measured costs (policy.RoundPolicy.stop_threshold).
DRAFT_MIN_CONFIDENCE = 0.5

# The confidence stop's calibration (ModelDrafter.calibration): decayed sums that start at lam = 1
# with the weight of this many judged positions, forget by this factor a position, and keep lam in
# these bounds. Session 13: with a draft bound of 30 instead of 8, uncalibrated dynamic drafts on math
# ran to 17 tokens and were kept no more often (drafted 186, kept 97 against 158 and 96 at 8).
CALIB_PRIOR = 4.0
CALIB_DECAY = 0.98
CALIB_MIN, CALIB_MAX = 0.5, 1.5

# A hinted draft (ModelDrafter.draft) feeds at most this many rows in its first call: the model's
# own logits buffer holds 32 (onnx_lm.OWN_LOGITS_MAX_WIDTH)
HINT_MAX_ROWS = 32

# A model drafter's first read of a generation: at most this many tokens of the context, its end
# (ModelDrafter). Measured on the Qwen pair: see ModelDrafter.
DRAFT_READ_WINDOW = 128


class Drafter(Protocol):
    name: str
    has_cost: bool

    def begin(self, prompt: Sequence[int]) -> None: ...

    def offer(self, ctx: TokenBuffer, kmax: int) -> Offer | None: ...

    def draft(self, ctx: TokenBuffer, k: int, sp: SamplingParams, rng: np.random.Generator) -> Draft: ...

    def accept(self, n: int, bonus: int) -> None: ...

    def reset(self) -> None: ...


@dataclass
class LoadEnv:
    """What ``edgespec.load`` hands a drafter's ``build``: the manifest, the memory plan, the
    profile, ``open_model(role, min_width)`` that opens a bundle model as the plan allows, and the
    drafters' load options (``memory``: True, False or a store path, see suffix.py)."""

    manifest: object
    plan: object
    profile: object
    open_model: Callable
    options: dict = field(default_factory=dict)
    target: object = None  # the target model (an assistant drafts from its KV buffers and hidden states: mtp.py)


DRAFTERS: dict[str, type] = {}  # name -> class, in the order ``auto`` considers them


def register(cls):
    DRAFTERS[cls.name] = cls
    return cls


def drafter_choices() -> tuple[str, ...]:
    """Every value ``drafter=`` takes: the registered drafters, ``auto`` (all of them, chosen per
    round) and ``none`` (autoregressive)."""
    return (*DRAFTERS, "auto", "none")


class LookupDrafter:
    """A free drafter whose draft is what ``_lookup(ctx, k) -> (tokens, key)`` finds (a point mass, no
    model call): ``draft`` and ``peek`` return it, ``accept`` has nothing to do (the next lookup reads the
    context as it is). The suffix and prediction drafters are these."""

    has_cost = False

    def _lookup(self, ctx: TokenBuffer, k: int) -> tuple[list[int], str]:
        raise NotImplementedError

    def draft(self, ctx: TokenBuffer, k: int, sp: SamplingParams, rng: np.random.Generator) -> Draft:
        tokens, key = self._lookup(ctx, k)
        return Draft(tokens[:k], key=key)

    def peek(self, ctx: TokenBuffer, k: int) -> tuple[list[int], str]:
        """What ``draft`` would propose (a free drafter's guess, scored by the policy unasked)."""
        tokens, key = self._lookup(ctx, k)
        return tokens[:k], key

    def accept(self, n: int, bonus: int) -> None:
        pass


@register
class PromptLookupDrafter:
    """Prompt lookup (n-gram) drafting with no model: find the latest earlier occurrence of the
    context's last n tokens (n from ``max_ngram`` down to ``min_ngram``) and propose what followed
    it. A longer match predicts a higher acceptance, so each match length has its own estimate."""

    name = "prompt-lookup"
    has_cost = False

    def __init__(self, min_ngram: int = 1, max_ngram: int = 3, max_draft: int = 16):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.min_ngram = min_ngram
        self.max_ngram = max_ngram
        self.max_draft = max_draft
        self._match: tuple[int, int, list[int], int] | None = None  # (ctx length, k, tokens, n-gram size)
        # the generation's n-grams, indexed as the context grows (a round's lookup is then a few dict
        # reads, where searching the whole context each round cost ~0.1-0.3 ms, a visible share of a
        # ~1 ms round on a GPU): size -> {n-gram: start of its latest occurrence followed by a token}
        self._index: dict[int, dict[tuple, int]] = {}
        self._indexed = 0  # context tokens whose n-grams ending before them are indexed
        self._ctx = None  # the TokenBuffer indexed (a new one, or a shorter one, is indexed afresh)

    @classmethod
    def build(cls, env: LoadEnv) -> "PromptLookupDrafter":
        return cls(max_draft=MAX_DRAFT)  # a request's max_draft_tokens (kmax) is the bound that applies

    def begin(self, prompt: Sequence[int]) -> None:
        self._match = None
        self._ctx = None

    def reset(self) -> None:
        self._match = None
        self._ctx = None

    def _lookup_indexed(self, ctx: TokenBuffer, k: int) -> tuple[list[int], int]:
        """``lookup_match`` over the incremental index of ``ctx`` (the same result: the latest
        earlier occurrence of the longest matching n-gram, followed by at least one token)."""
        n = len(ctx)
        if ctx is not self._ctx or n < self._indexed:
            self._ctx, self._indexed = ctx, 0
            self._index = {size: {} for size in range(self.min_ngram, self.max_ngram + 1)}
        arr = ctx.view()
        if n - 1 > self._indexed:  # index the n-grams that end at positions indexed .. n - 2
            base = max(0, self._indexed - self.max_ngram + 1)  # the new n-grams' first tokens
            toks = arr[base: n - 1].tolist()
            for size, table in self._index.items():
                for j in range(max(0, self._indexed - size + 1), n - size):
                    table[tuple(toks[j - base: j - base + size])] = j
            self._indexed = n - 1
        k = min(k, self.max_draft)
        if k <= 0:
            return [], 0
        tail = arr[max(0, n - self.max_ngram):].tolist()
        for size in range(min(self.max_ngram, n - 1), self.min_ngram - 1, -1):
            j = self._index[size].get(tuple(tail[len(tail) - size:]))
            if j is not None:
                start = j + size
                return arr[start: start + k].tolist(), size
        return [], 0

    def lookup(self, ctx: Sequence[int] | TokenBuffer, k: int) -> list[int]:
        return self.lookup_match(ctx, k)[0]

    def lookup_match(self, ctx: Sequence[int] | TokenBuffer, k: int) -> tuple[list[int], int]:
        """(proposed tokens, length of the n-gram that matched); ([], 0) without a match."""
        k = min(k, self.max_draft)
        if k <= 0:
            return [], 0
        arr = ctx.view() if isinstance(ctx, TokenBuffer) else np.asarray(ctx, dtype=np.int64)
        n = arr.shape[0]
        for size in range(min(self.max_ngram, n - 1), self.min_ngram - 1, -1):
            pattern = arr[n - size:]
            hay = arr[: n - 1]  # a match must be followed by at least one token
            if hay.shape[0] < size:
                continue
            windows = np.lib.stride_tricks.sliding_window_view(hay, size)
            hits = np.flatnonzero((windows == pattern).all(axis=1))
            hits = hits[hits + size < n]  # exclude the suffix itself
            if hits.size:
                start = int(hits[-1]) + size
                return arr[start: start + k].tolist(), size
        return [], 0

    def _lookup_cached(self, ctx: TokenBuffer, k: int) -> tuple[list[int], int]:
        m = self._match
        if m is None or m[0] != len(ctx) or m[1] < k:
            tokens, size = self._lookup_indexed(ctx, k) if isinstance(ctx, TokenBuffer) else self.lookup_match(ctx, k)
            self._match = m = (len(ctx), k, tokens, size)
        return m[2][:k], m[3]

    def offer(self, ctx: TokenBuffer, kmax: int) -> Offer | None:
        tokens, size = self._lookup_cached(ctx, kmax)
        if not tokens:
            return None
        return Offer(f"{self.name}/{size}", len(tokens), prior=(0.5 + 0.5 * size, 1.0))

    def draft(self, ctx: TokenBuffer, k: int, sp: SamplingParams, rng: np.random.Generator) -> Draft:
        tokens, size = self._lookup_cached(ctx, k)
        return Draft(tokens, key=f"{self.name}/{size}")

    def peek(self, ctx: TokenBuffer, k: int) -> tuple[list[int], str]:
        """What ``draft`` would propose (a free drafter's guess, scored by the policy unasked)."""
        tokens, size = self._lookup_cached(ctx, k)
        return tokens, f"{self.name}/{size}"

    def accept(self, n: int, bonus: int) -> None:
        pass  # stateless: the next lookup reads the context as it is


def fed_ids(ids, vocab: int | None):
    """``ids`` as a model with ``vocab`` embedding rows reads them (a drafter with fewer ids than its target's or
    the tokenizer's): ids past its rows as 0, a list for a list; ``ids`` itself where none is past (or ``vocab`` is
    None). The runtime's drafter and the export's checks of a drafter feed it so."""
    if vocab is None:
        return ids
    a = np.asarray(ids, dtype=np.int64)
    if not (a >= vocab).any():
        return ids
    out = np.where(a < vocab, a, 0)
    return out.tolist() if isinstance(ids, list) else out


@register
class ModelDrafter:
    """A small LM with its own KV cache, which holds a stretch of the context from ``base`` on (0: all
    of it). Drafting k tokens feeds the tokens the cache lacks (usually the last round's one or two)
    and k - 1 draft tokens one at a time; ``accept`` rolls back the rejected ones in O(1), and what
    the target emitted is fed with the next draft.

    A generation's first draft reads at most ``read_window`` tokens of a long prompt (its end), not
    all of it: the drafter's guesses depend mostly on the recent context, and the read is paid
    before the drafter can help (on the Qwen pair, session 12: greedy agreement over 25 prompts of
    40-470 tokens 0.825 with the last 128 tokens against 0.837 with all of them, for a read of at
    most 0.13 s instead of up to 0.5 s). A chat turn that extends the last one by at most that many
    tokens keeps what the cache holds and reads only the new part. A fill-in-the-middle prompt longer
    than the window is read as its head instead (``fim_head``: the code just before the gap and just
    after it, which its end alone would leave out). The target verifies every token, so what the
    drafter reads never changes the output.

    A reduced draft vocabulary (``head_ids``: export --drafter-vocab N) gives logits for those N
    token ids only: the argmax maps back through them, and under sampling q is the reduced head's
    distribution over them (zero elsewhere), which is what the draft is sampled from, so the
    rejection rule stays exact. The confidence stop then reads the reduced softmax."""

    takes_grammar = True  # draft(..., grammar=): drafts held to a structured output's grammar

    name = "model"
    has_cost = True
    takes_hint = True  # draft(..., hint=) checks a free drafter's guess in its first call
    gives_alternates = True  # draft(..., alternates=True) lists its second choices

    def __init__(self, lm, target_vocab: int, min_confidence: float = 0.0, clock=time.perf_counter,
                 head_ids: np.ndarray | None = None, read_window: int | None = None, in_vocab: int | None = None):
        self.lm = lm
        self.target_vocab = target_vocab
        # the ids the drafter's embedding holds, where fewer than the target's (None: all of them): Qwen2.5 7B+ pads
        # its vocabulary to 152,064 where the 0.5B drafter has 151,936. A context token past them (a padding id the
        # target produced, another model's extra special token) is fed to the drafter as id 0: only its guesses
        # depend on what it reads, never the output
        self.in_vocab = in_vocab if in_vocab is not None and in_vocab < target_vocab else None
        self.head_ids = None if head_ids is None else np.asarray(head_ids, dtype=np.int64)
        if self.head_ids is not None and self.head_ids.shape[0] and int(self.head_ids[-1]) >= target_vocab:
            raise BundleError(f"the drafter's head ids reach {int(self.head_ids[-1])}, outside the target's "
                              f"vocabulary of {target_vocab}")
        # stop a draft early once the drafter's own top probability falls below this: an unsure
        # drafter is mostly rejected, and every step saved is a drafter call saved (0 = never stop)
        self.min_confidence = min_confidence
        self.clock = clock  # times the drafter's steps for the cost model (tests simulate time)
        self._fed_drafts = 0  # draft tokens of the last draft fed to the cache
        if read_window is not None and read_window < 1:
            raise ValueError(f"read_window must be >= 1 (None: the whole context), got {read_window}")
        self.read_window = read_window
        # calibration of the confidence stop: a dynamic draft multiplies lam * (top probability) per
        # token, lam = (draft tokens the target kept) / (their summed top probabilities) over the
        # positions the target judged, learned apart for greedy and sampled generations (decayed
        # sums, starting at lam = 1). False (a seeded sampled generation, set by the round policy):
        # lam = 1 and nothing learned, so its draft lengths depend on its own tokens only
        self.history = True
        self._calib = {True: [CALIB_PRIOR, CALIB_PRIOR], False: [CALIB_PRIOR, CALIB_PRIOR]}  # greedy -> [kept, conf]
        self._judge: tuple[bool, list[float]] | None = None  # (greedy, top probability of each draft token)
        self._stale = True  # the cache may not hold the context from base on: the next draft reads it
        self._base = 0  # the context position of the cache's first token
        self._plan: tuple[int, int] | None = None  # while stale: (base, tokens to read) for the next draft
        # fill in the middle (tokenizer.Fim, set by ``edgespec.load``): a FIM prompt longer than the read
        # window is read as its own head, the end of the code before the gap and the start of the code
        # after it (``fim_head``), in place of the prompt's last tokens (the end of the code after the gap)
        self.fim = None
        self._head: tuple[int, list[int]] | None = None  # (base, head) this generation: the cache holds head + ctx[prompt:]

    @classmethod
    def build(cls, env: LoadEnv) -> "ModelDrafter | None":
        if env.plan.drafter != "model" or env.manifest.drafter is None:
            return None
        # the exactness policy is the target's: a draft is only a guess the target checks, so the
        # drafter runs its one-token steps on the kernel's one-token path (~12% cheaper for the
        # 0.5B INT4 drafter: 15.0 against 17.1 ms a step)
        spec, vocab = env.manifest.drafter, env.manifest.target.vocab_size
        head = spec.load_head_ids(vocab)
        lm = env.open_model("drafter", min_width=1)
        width = getattr(lm, "logits_width", None)
        if head is not None and width is not None and width != head.shape[0]:
            raise BundleError(f"the drafter graph's logits have {width} columns but its head ids list "
                              f"{head.shape[0]} tokens; the bundle is inconsistent")
        if head is None and spec.vocab_size < vocab:  # a smaller vocabulary: its logits are for ids 0..its size - 1
            head = np.arange(spec.vocab_size, dtype=np.int64)
        return cls(lm, vocab, min_confidence=DRAFT_MIN_CONFIDENCE, head_ids=head, read_window=DRAFT_READ_WINDOW,
                   in_vocab=spec.vocab_size)

    def _fit(self, ids):
        """``ids`` as the drafter's embedding takes them (``fed_ids`` with ``in_vocab``)."""
        return fed_ids(ids, self.in_vocab)

    def calibration(self, greedy: bool) -> float:
        """lam: how far the drafter's top probabilities over- (< 1) or under-state (> 1) what the
        target keeps (1 where ``history`` is off)."""
        return calibrated(self._calib[greedy], self.history)

    def begin(self, prompt: Sequence[int]) -> None:
        """A new generation: the cache is brought to the context by the first draft, not here, so
        the drafter's prefill never delays the first token, and a generation in which ``auto``
        never picks this drafter never pays it (the cache keeps what it holds: the next prefill
        reuses the prefix it shares with the new context, a chat's earlier turns)."""
        self._fed_drafts = 0
        self._judge = None
        self._stale = True
        self._plan = None
        self._head = None
        if self.fim is not None and self.read_window is not None and len(prompt) > self.read_window:
            head = fim_head(prompt, self.fim, min(self.read_window, FIM_HEAD))
            # the cache then holds head + ctx[len(prompt):] from base len(prompt) - len(head) on
            self._head = None if head is None else (len(prompt) - len(head), head)

    def reset(self) -> None:
        self.lm.reset()
        self._fed_drafts = 0
        self._stale = True
        self._base = 0
        self._plan = None
        self._head = None

    def _read_plan(self, ctx: TokenBuffer) -> tuple[int, int]:
        """(base, tokens to read) for the first draft of a generation: keep the cache's base where
        it holds a prefix of the context from there and the rest fits the read window (a chat turn
        extending the last), else start afresh at the window's start. Once per generation: the cache
        does not change while stale."""
        if self._plan is None and self._head is not None:  # a FIM prompt: its head, then what followed it
            base = self._head[0]
            if len(ctx) - base <= 2 * self.read_window:
                self._plan = (base, len(ctx) - base)
            else:  # a first draft late in a long reply: the reply's end says more, and costs the window only
                self._head = None
        if self._plan is None:
            n, base = len(ctx), self._base
            fresh = 0 if self.read_window is None else max(0, n - self.read_window)
            # (not in a reproducible generation, which reads its window afresh: what the cache holds from
            # earlier generations would move the window and the draws)
            if base < n and self.history:
                held = min(self.lm.cache.ids.common_prefix(self._fit(ctx.view()[base:])), n - base - 1)
                # at most the window to read, and room left for drafts (else the window afresh)
                if held > 0 and base + held >= fresh and n - base + 16 < self.lm.max_context:
                    self._plan = (base, n - base - held)
            if self._plan is None:
                self._plan = (fresh, n - fresh)
        return self._plan

    def behind(self, ctx: TokenBuffer) -> int:
        """Context tokens the next draft reads before its first draft token: (stale) the part of
        the read window the cache does not hold, else what the target emitted since."""
        if self._stale:
            return self._read_plan(ctx)[1]
        return len(ctx) - self._base - self.lm.length

    def offer(self, ctx: TokenBuffer, kmax: int) -> Offer | None:
        # the cache must hold the context from base on and k - 1 draft tokens
        base = self._read_plan(ctx)[0] if self._stale else self._base
        k = min(kmax, self.lm.max_context - (len(ctx) - base) + 1)
        if k <= 0:
            return None
        behind = self.behind(ctx)
        # the usual one or two tokens are part of a step; a longer read is priced up front
        return Offer(self.name, k, prior=(1.5, 0.5), upfront=behind if behind > 2 else 0, dynamic=True)

    def draft(self, ctx: TokenBuffer, k: int, sp: SamplingParams, rng: np.random.Generator,
              stop: float | None = None, hint: Sequence[int] = (), hint_stop: float | None = None,
              alternates: bool = False, grammar=None) -> Draft:
        """Up to ``k`` tokens. ``stop`` (theta): end the draft once the product of the drafter's top
        probabilities (its softmax at temperature 1, over the tokens drafted so far) falls below
        theta, the drafter's own estimate that the whole draft survives; None: stop after a token
        whose top probability is below ``min_confidence`` (a fixed-length request).

        ``hint``: a free drafter's guess at the next tokens (the round policy passes the best one).
        It is fed with the tokens the cache lacks, in the same call, so the drafter computes its
        logits after each hint token at once (one call of a few rows costs little more than one
        row). Drafting then goes on as always, one token after another, each picked from the
        drafter's own logits (argmax, or sampled from q); while they equal the hint, the next
        position's logits are already computed and no step is run. The first token that differs
        rolls the rest of the hint back, and the steps go on from there. So the draft is exactly
        what the drafter would have drafted without the hint (the same tokens greedy; sampled, the
        same q at every position, the same random draws), only cheaper where the hint was right.
        ``hint_stop``: the threshold ``stop`` where the next token's logits came with the hint (one
        more token costs no step there; default ``stop``). ``alternates``: the draft also lists each
        position's second choice (``Draft.alts``; greedy, read from the logits drafting computed anyway;
        sampled, the figures the round policy picks positions by, the alternate drawn later from q
        without the draft token), the draft's tokens the same. ``grammar`` (structured outputs, constrain.Constraint): each
        token is picked from the drafter's logits masked by the grammar, advanced through the draft so far
        (and rolled back after); q is then that masked distribution, so the rule stays exact, and a draft
        never holds a token the target's own mask would forbid. The draft ends where the grammar leaves
        the drafter no token."""
        lm = self.lm
        behind = self.behind(ctx)
        t0 = self.clock()
        hint = list(hint[: max(0, k - 1)])  # hint[i] is a guess at the i-th draft token
        rows = None  # logits of the catch-up's last token and of each hint token fed after it
        late = False  # (a first read) the hint goes in with the first step, not with the read
        if self._stale:  # first draft of a generation: read the window (keeping what the cache holds)
            base = self._read_plan(ctx)[0]
            if base != self._base or self._head is not None or not self.history:
                lm.reset()  # (a reproducible generation reuses none of it: rows an earlier call computed)
            if self._head is None:
                logits = lm.prefill(self._fit(ctx.view()[base:]))
            else:  # the head stands for the prompt: the cache's tokens from base on are head + the rest
                start, head = self._head
                logits = lm.prefill(self._fit(np.concatenate([np.asarray(head, dtype=ctx.view().dtype),
                                                              ctx.view()[start + len(head):]])))
            self._stale, self._base, self._plan = False, base, None
            hint = self._fit_hint(hint, 0)
            late = bool(hint)  # the hint is fed with the first step instead, if its first token is drafted
        else:  # >= 1 behind: the cache holds the context from base on, up to a point
            missing = ctx[self._base + lm.length:]
            hint = self._fit_hint(hint, len(missing)) if missing else []
            if hint:
                rows = lm.forward_from(self._fit(list(missing) + hint), len(missing) - 1, copy=not sp.greedy)
                logits = rows[0]
            else:
                logits = lm.feed(self._fit(missing))
        # the step cost the cost model learns: one-token steps, and the catch-up call only when it
        # is the usual one or two tokens without a hint (a long catch-up is a prefill, priced per
        # token apart; a call with a hint is neither)
        read = self.clock() - t0
        step_time, steps = (read, 1) if behind <= 2 and not hint else (0.0, 0)
        catchup = (behind, read) if behind > 2 else None
        fed = 0 if late else len(hint)  # hint tokens in the cache past the context: draft tokens once they agree
        tokens: list[int] = []
        dists = []
        sure = 1.0  # the product of the (calibrated) top probabilities so far
        lam = self.calibration(sp.greedy) if stop is not None or alternates else 1.0
        confs: list[float] = []
        alts = []
        head = self.head_ids
        if head is not None and logits.shape[-1] != head.shape[0]:
            raise BundleError(f"the drafter's logits have {logits.shape[-1]} columns but its head ids list "
                              f"{head.shape[0]} tokens; the bundle is inconsistent")
        for i in range(k):
            row = logits[: self.target_vocab] if head is None else logits
            if grammar is not None:
                allowed = grammar.mask()
                allowed = allowed[: row.shape[-1]] if head is None else allowed[head]
                if not allowed.any():
                    break
                row = np.where(allowed, row, np.float32(-np.inf))
            if sp.greedy:
                best = int(np.argmax(row))
                tok = best if head is None else int(head[best])
            else:
                q = distribution(row, sp)
                if head is not None:  # over the kept token ids, zero elsewhere
                    q = q.exact()
                    q = Dist(self.target_vocab, head if q.idx is None else head[q.idx], q.w, q.total)
                tok = q.sample(rng)
                dists.append(q)
            tokens.append(tok)
            if stop is not None or alternates:
                confs.append(_top_prob(row))
            if alternates and sp.greedy:
                second, q2 = _second(row, best, confs[-1])
                alts.append((i, second if head is None else int(head[second]), min(1.0, lam * confs[-1]), q2))
            elif alternates:  # sampled: the alternate is drawn from q without tok once the round picks it
                alts.append((i, None, min(1.0, lam * confs[-1]), _rescue(q, tok)))
            if fed > i and hint[i] != tok:  # the hint is wrong from here: roll it back
                lm.rewind(fed - i)
                fed = i
            if grammar is not None and i < k - 1 and not grammar.push(tok):
                break  # the end of sequence: nothing follows it
            if i < k - 1:  # the decision uses only the drafter's state: any stopping rule keeps exactness
                if stop is not None:
                    sure *= min(1.0, lam * confs[-1])
                    if sure < (hint_stop if fed > i and hint_stop is not None else stop):
                        break
                elif self.min_confidence > 0 and _top_prob(row) < self.min_confidence:
                    break
                if fed > i:  # the hint had this token: its logits are computed
                    logits = rows[i + 1]
                    continue
                if late and i == 0 and hint[0] == tok and len(hint) > 1:
                    # after a first read: the hint, whose first token is this one, in this step's call
                    rows = [None] + list(lm.forward(self._fit(hint), copy=not sp.greedy))
                    fed = len(hint)
                    logits = rows[1]
                    continue
                t1 = self.clock()
                # read before the next call; sampled, q may keep its row (a TailDist): a copy
                logits = lm.forward([tok], copy=not sp.greedy)[-1]
                step_time += self.clock() - t1
                steps += 1
                fed = i + 1
        if grammar is not None:
            grammar.pop()
        if fed > len(tokens):  # hint tokens past the draft's end (it stopped on its confidence)
            lm.rewind(fed - len(tokens))
            fed = len(tokens)
        self._fed_drafts = fed
        self._judge = (sp.greedy, confs) if stop is not None and self.history else None
        return Draft(tokens, dists or None, key=self.name,
                     step_s=step_time / steps if steps else None, catchup=catchup,
                     alts=tuple(alts))

    def _fit_hint(self, hint: list[int], rows: int) -> list[int]:
        """``hint`` as far as it goes in one call after ``rows`` other tokens: at most HINT_MAX_ROWS
        rows in all, and none where the call would not fit the cache."""
        hint = hint[: max(0, HINT_MAX_ROWS - rows)]
        return hint if self.lm.length + rows + len(hint) <= self.lm.max_context else []

    def accept(self, n: int, bonus: int) -> None:
        # the cache holds the context and the fed draft tokens; keep those the target accepted
        self.lm.rewind(self._fed_drafts - min(n, self._fed_drafts))
        self._fed_drafts = 0
        if self._judge is not None:  # the positions the target judged: the kept ones and the first rejected
            greedy, confs = self._judge
            learn_calibration(self._calib[greedy], confs, n)
            self._judge = None


FIM_AFTER_SHARE = 0.5  # of a FIM head's room, what the code after the gap may take (the rest: before it)
# a FIM head's tokens (at most the read window): under ``auto`` a cheaper first read starts the model drafter on
# more requests and costs less where it does not pay; two in-process A/Bs over 24 gaps (session 33): ``auto``
# 54.8 against 52.6 and 56.6 against 52.7 tok/s with 64 rather than 128 (acceptance 0.652 against 0.709;
# ``model`` alone 33.9 against 34.0)
FIM_HEAD = 64


def fim_head(prompt: Sequence[int], fim, budget: int) -> list[int] | None:
    """A fill-in-the-middle prompt (``<prefix> code before <suffix> code after <middle>``, a bos before
    it or not) in at most ``budget`` tokens, for a drafter that reads no more: the control tokens, the
    last tokens before the gap and the first after it (``FIM_AFTER_SHARE`` of the room, or what the code
    before the gap leaves), what the middle continues from and leads to. None for another prompt, or
    where the budget does not hold the control tokens and two more.

    Measured (session 33, the Qwen pair, 8 gaps of scripts/data/infill_cases.jsonl, drafter ``model``,
    k = 4): acceptance 0.459 reading the prompt's last 128 tokens (the end of the code after the gap),
    0.495 / 0.545 / 0.620 / 0.645 with a 128-token head giving the code after the gap 0 / 0.25 / 0.5 /
    0.75 of its room, 0.658 in 256 tokens, 0.706 reading all ~700 (docs/bench/infill_s33.md). The model
    drafter reads ``FIM_HEAD`` tokens."""
    where = fim_split(prompt, fim)
    if where is None:
        return None
    lead, s = where
    before, after = list(prompt[lead + 1:s]), list(prompt[s + 1:-1])
    room = budget - lead - 3
    if room < 2:
        return None
    b = min(len(after), int(room * FIM_AFTER_SHARE))
    a = min(len(before), room - b)
    b = min(len(after), room - a)  # what the code before the gap leaves
    return list(prompt[:lead]) + [fim.prefix] + before[len(before) - a:] + [fim.suffix] + after[:b] + [fim.middle]


def calibrated(sums: list[float], history: bool = True) -> float:
    """lam from a costly drafter's calibration sums ``[kept, confidence]`` (``learn_calibration``), within
    ``CALIB_MIN``..``CALIB_MAX``; 1 where ``history`` is off (a seeded sampled generation)."""
    if not history:
        return 1.0
    kept, conf = sums
    return min(CALIB_MAX, max(CALIB_MIN, kept / conf))


def learn_calibration(sums: list[float], confs: Sequence[float], n: int) -> None:
    """A costly drafter's confidence calibration (``ModelDrafter.calibration``) learns from a draft whose tokens had
    top probabilities ``confs`` and of which the target kept ``n``: the positions it judged (the kept ones and the
    first rejected) go into the decayed sums ``[kept, confidence]``, in place."""
    for i, c in enumerate(confs[: n + 1]):
        sums[0] = CALIB_DECAY * sums[0] + (1.0 if i < n else 0.0)
        sums[1] = CALIB_DECAY * sums[1] + c


def _second(row: np.ndarray, j: int, top: float) -> tuple[int, float]:
    """The index of the row's second-largest logit, given the largest one's index ``j`` and softmax
    probability ``top``, and its own softmax probability. The row is left as it was."""
    best = row[j]
    if not row.flags.writeable:
        row = row.copy()
    row[j] = -np.inf
    try:
        j2 = int(np.argmax(row))
    finally:
        row[j] = best
    return j2, top * float(np.exp(np.float32(row[j2]) - np.float32(best)))


def _rescue(q: Dist, tok: int) -> float:
    """What the round policy prices a sampled draft token's alternate by (scaled by its calibration): the
    largest probability q gives another token. Teacher-forced on the Qwen pair at T = 0.7 it predicted the
    chance of a rejection rescued by the alternate best of the figures tried (correlation 0.50, against
    0.43 for 1 - q(tok) and for q's second largest; scripts/probe_sampled_alternates.py, session 39)."""
    w = q.w
    if w.shape[0] == 0:  # (one token: 0 where it is tok; a TailDist's tail token: that one near token's share)
        return 0.0
    at = tok if q.idx is None else int(np.searchsorted(q.idx, tok))  # (a tail token of a TailDist: none of w's)
    j = int(np.argmax(w))
    if j != at or (q.idx is not None and (at >= q.idx.shape[0] or q.idx[at] != tok)):
        return float(w[j]) / q.total
    return max(float(w[:j].max(initial=0.0)), float(w[j + 1:].max(initial=0.0))) / q.total


def _top_prob(logits: np.ndarray) -> float:
    """The largest softmax probability of a row of logits."""
    m = float(logits.max())
    return 1.0 / float(np.exp(logits - m, dtype=np.float32).sum())


from . import mtp as _mtp  # noqa: E402,F401  (registers the assistant's drafter after the model drafter)
from . import suffix as _suffix  # noqa: E402,F401  (registers the suffix drafter after these)
from . import prediction as _prediction  # noqa: E402,F401  (registers the prediction drafter last)
