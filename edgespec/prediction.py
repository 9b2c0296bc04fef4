"""Predicted outputs: a request that says what its reply will mostly be drafts from it.

OpenAI's ``prediction`` parameter (``{"type": "content", "content": "..."}``), ``Engine.generate(...,
prediction=...)`` and ``edgespec generate --prediction FILE`` give the text a reply is expected to
repeat: the file a code edit rewrites, the document a correction returns, the last answer a
regeneration revises. The target verifies every drafted token, so the reply is what it would be
without the prediction (token for token when greedy, the same distribution when sampling); a good
prediction only makes it come sooner, a bad one costs a few verified positions.

``PredictionDrafter`` follows the reply through the prediction by position, not by frequency: it keeps
the place in the prediction the reply has reached and drafts what comes next there. Prompt lookup and
the suffix drafter follow the most recent or most frequent continuation of an n-gram, which in code
(``return``, ``self.``, ``):``) is often another line's. Where the reply leaves the prediction (an
edit), the drafter finds where it rejoins: the longest match of the reply's last tokens in the
prediction (at least ``MIN_MATCH``), the nearest one after the place it left, else the nearest
before. Keys: ``prediction/sync`` (drafting on from where the last draft ended) and
``prediction/<n>`` (rejoined on an n-token match, n up to ``MAX_MATCH``), each with its own
acceptance, learned from the request's own rounds (never carried over from earlier requests: a
prediction's worth is the request's), so the round policy drafts long where the reply keeps to it.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .drafters import MAX_DRAFT, LoadEnv, LookupDrafter, Offer, register
from .kv import TokenBuffer

MIN_MATCH = 2  # the fewest tokens of the reply's end that must match to rejoin the prediction
MAX_MATCH = 8  # a longer match counts as this long (its key, and the choice between matches)
MAX_PREDICTION = 1 << 20  # tokens: the most a prediction may have (a reply never gets near it)
SKIP_SPAN = 6  # reply tokens after leaving the prediction during which a draft resumes after the token it left at


@register
class PredictionDrafter(LookupDrafter):
    name = "prediction"

    def __init__(self, max_draft: int = MAX_DRAFT, skip_span: int = SKIP_SPAN):
        self.max_draft = max_draft
        self.skip_span = skip_span  # 0: no prediction/skip guesses
        self.tokens = np.empty(0, dtype=np.int64)  # this generation's prediction (empty: none)
        self._prompt_len = 0
        self._at: tuple[int, int] | None = None  # (context length, prediction position) of the last alignment
        self._anchor = 0  # where the reply left the prediction last (a rejoin prefers the nearest after it)
        self._left: tuple[int, int] | None = None  # (reply position, prediction position) where it left
        self._skipping = False  # the last alignment was a skip (prediction/skip): a guess, not a place reached
        self._cache: tuple[int, int | None, str] | None = None  # (ctx length, its place in the prediction, key)

    @classmethod
    def build(cls, env: LoadEnv) -> "PredictionDrafter":
        return cls(max_draft=MAX_DRAFT)  # a request's max_draft_tokens (kmax) is the bound that applies

    def set_prediction(self, tokens: Sequence[int]) -> None:
        """The next generation's prediction (token ids; empty: none). The decoder sets it before every
        generation, so a prediction never outlives its request."""
        self.tokens = np.asarray(list(tokens), dtype=np.int64).reshape(-1)
        self._restart()

    def _restart(self) -> None:
        """No place reached in the prediction yet."""
        self._at, self._anchor, self._cache, self._left, self._skipping = None, 0, None, None, False

    # -- protocol ------------------------------------------------------------------------------
    def begin(self, prompt: Sequence[int]) -> None:
        self._prompt_len = len(prompt)
        self._restart()

    def reset(self) -> None:
        self.set_prediction(())

    def offer(self, ctx: TokenBuffer, kmax: int) -> Offer | None:
        tokens, key = self._lookup(ctx, kmax)
        if not tokens:
            return None
        # each request's estimates start from the prior (carry=False): an edit's prediction is the reply
        # but for a few lines, a regenerated answer's parts from its first sentences (the acceptance the
        # last request taught would draft 16-30 tokens at a time into a prediction the reply has left)
        if key.endswith(("sync", "start")):
            return Offer(key, len(tokens), prior=(3.0, 1.0), carry=False)
        if key.endswith("skip"):
            return Offer(key, len(tokens), prior=(1.0, 1.0), carry=False)
        n = int(key.rsplit("/", 1)[1])
        return Offer(key, len(tokens), prior=(0.5 + 0.5 * n, 1.0), carry=False)

    # draft, peek, accept: LookupDrafter's (the next lookup checks what the context gained against the prediction)

    # -- alignment -----------------------------------------------------------------------------
    def _lookup(self, ctx: TokenBuffer, k: int) -> tuple[list[int], str]:
        k = min(k, self.max_draft)
        P = self.tokens
        if k <= 0 or not P.size:
            return [], ""
        c = self._cache
        if c is not None and c[0] == len(ctx):  # (the place found at this length, however many tokens asked for: a
            j, key = c[1], c[2]  # second alignment there, for more tokens, called the rejoin's place a sync)
        else:
            j, key = self.align(ctx)
            self._cache = (len(ctx), j, key)
        tokens = P[j: j + k].tolist() if j is not None else []
        return (tokens, key) if tokens else ([], "")

    def align(self, ctx: TokenBuffer) -> tuple[int | None, str]:
        """(the prediction's position of the reply's next token, the key saying how it was found), or
        (None, "") where the reply's end is nowhere in the prediction."""
        P, arr, n = self.tokens, ctx.view(), len(ctx)
        at = self._at
        if at is not None and at[0] <= n:  # on from the last alignment: what the reply gained is what followed there
            j = at[1] + n - at[0]
            if j <= P.size and np.array_equal(arr[at[0]: n], P[at[1]: j]):
                self._at, self._skipping, self._left = (n, j), False, None
                return j, "prediction/sync"
            if self._skipping:  # a guess: the reply may have gone on with more of its own tokens first
                seg = arr[at[0]: n]
                for t in range(min(seg.size - 1, P.size - at[1]), 0, -1):
                    if np.array_equal(seg[seg.size - t:], P[at[1]: at[1] + t]):
                        self._at, self._skipping, self._left = (n, at[1] + t), False, None
                        return at[1] + t, "prediction/sync"
            else:  # the reply left the prediction: where, to the token
                seg, ref = arr[at[0]: n], P[at[1]: j]
                diff = np.flatnonzero(seg[: ref.size] != ref)
                i = int(diff[0]) if diff.size else ref.size
                self._left = (at[0] + i, at[1] + i)  # (the reply's first token not the prediction's, the one it replaced)
                self._anchor = at[1] + i
        self._skipping = False
        out = arr[self._prompt_len:]
        if 0 < out.size <= P.size and np.array_equal(out, P[: out.size]):  # the reply so far is its head
            self._at, self._left = (n, out.size), None
            return out.size, "prediction/start"
        j, m = self._rejoin(arr)
        if j is not None:
            self._at, self._left = (n, j), None
            return j, f"prediction/{m}"
        left = self._left
        if left is not None and n - left[0] <= self.skip_span and left[1] + 1 < P.size:
            # nowhere to rejoin yet: the reply may have replaced the prediction's token with a few of its own
            # (a renamed identifier) and go on with what followed it; a draft from there is kept from the
            # first token that follows the replacement, before two of them would rejoin the prediction
            self._at, self._skipping = (n, left[1] + 1), True
            return left[1] + 1, "prediction/skip"
        self._at = None
        return None, ""

    def _rejoin(self, arr: np.ndarray) -> tuple[int | None, int]:
        """(position after the best match of the context's last tokens in the prediction, match
        length): the longest match (at most MAX_MATCH counted, at least MIN_MATCH), the nearest at or
        after the anchor, else the nearest before it; (None, 0) without one."""
        P = self.tokens
        if arr.shape[0] < MIN_MATCH or P.size <= MIN_MATCH:
            return None, 0
        tail = arr[-MAX_MATCH:]
        # ends: positions e (exclusive) with P[e - MIN_MATCH: e] == the context's last MIN_MATCH tokens,
        # e < P.size so that something follows to draft
        hit = np.ones(P.size - MIN_MATCH, dtype=bool)
        for d in range(MIN_MATCH):
            hit &= P[MIN_MATCH - 1 - d: P.size - 1 - d] == tail[-1 - d]
        ends = np.flatnonzero(hit) + MIN_MATCH
        if not ends.size:
            return None, 0
        length = np.full(ends.size, MIN_MATCH)
        live = np.ones(ends.size, dtype=bool)
        for d in range(MIN_MATCH, min(MAX_MATCH, tail.size)):
            pos = ends - 1 - d
            ok = live & (pos >= 0)
            ok[ok] = P[pos[ok]] == tail[-1 - d]
            length += ok
            live = ok
        best = length.max()
        cand = ends[length == best]
        after = cand[cand >= self._anchor]
        j = int(after.min()) if after.size else int(cand.max())
        return j, int(best)


def prediction_usage(prediction: Sequence[int], reply: Sequence[int]) -> tuple[int, int]:
    """(tokens of the prediction that appeared in the reply, those that did not), OpenAI's
    ``accepted_prediction_tokens`` and ``rejected_prediction_tokens``. The reply is walked through the
    prediction as the drafter follows it: a reply token counts where it is the prediction's token at the
    place reached, and where the walk rejoins the prediction after an edit, the matched tokens that
    found the place count too. Each of the prediction's tokens counts once and each of the reply's, so
    the first figure is at most either's length; the two add up to the prediction's length."""
    d = PredictionDrafter(skip_span=0)  # places reached, not guesses
    d.set_prediction(prediction)
    d.begin(())
    P = d.tokens
    used = np.zeros(P.size, dtype=bool)
    hit = np.zeros(len(reply), dtype=bool)

    def mark(i: int, j: int) -> None:
        if 0 <= i and 0 <= j < P.size and not hit[i] and not used[j] and P[j] == int(reply[i]):
            hit[i] = used[j] = True

    ctx = TokenBuffer((), capacity=len(reply) + 1)
    for i, t in enumerate(reply):
        j, key = (0, "prediction/start") if i == 0 else d.align(ctx)
        if j is not None:
            tail = key.rsplit("/", 1)[1]
            for r in range(1, int(tail) + 1 if tail.isdigit() else 1):  # a rejoin: the tokens that matched
                mark(i - r, j - r)
            mark(i, j)
        ctx.extend([int(t)])
    matched = int(used.sum())
    return matched, int(P.size) - matched
