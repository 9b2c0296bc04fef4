"""Gaps a mutation test of edgespec/drafters.py found (docs/bench/mutation_harness/drafters_mut.py): each test fails
with the mutant its docstring names (DRn) and passes on the code. No model: FakeLM (tests/tiny.py) and hand-written
logits, so every expected value is worked out from the rows written here."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.drafters import (CALIB_DECAY, CALIB_MAX, CALIB_MIN, ModelDrafter, PromptLookupDrafter,
                               calibrated, learn_calibration)
from edgespec.kv import TokenBuffer
from edgespec.sampling import SamplingParams
from edgespec.tokenizer import Fim
from tiny import FakeLM

GREEDY = SamplingParams()


def _softmax(row) -> np.ndarray:
    e = np.exp(np.asarray(row, dtype=np.float64) - max(row))
    return e / e.sum()


def test_prompt_lookup_begins_each_generation_without_the_last_ones_match():
    """(DR4: ``begin`` keeps ``_match``; DR13 fails here too) the lookup's cache is keyed by the context's length: a
    new generation whose prompt has the last one's length is looked up in its own tokens, not served the last one's
    draft."""
    pl = PromptLookupDrafter()
    a = TokenBuffer([1, 2, 3, 1, 2], capacity=16)
    pl.begin(a.tolist())
    assert pl.offer(a, 4).max_tokens == 3  # "1 2" at 0 is followed by 3 1 2
    assert pl.draft(a, 4, GREEDY, np.random.default_rng(0)).tokens == [3, 1, 2]
    b = TokenBuffer([4, 5, 6, 7, 4], capacity=16)  # the same length: only "4" matches, followed by 5 6 7 4
    pl.begin(b.tolist())
    o = pl.offer(b, 4)
    assert (o.key, o.max_tokens) == ("prompt-lookup/1", 4)
    assert pl.draft(b, 4, GREEDY, np.random.default_rng(0)).tokens == [5, 6, 7, 4]
    assert pl.peek(b, 2) == ([5, 6], "prompt-lookup/1")


def test_a_fim_head_is_read_for_its_own_generation_only():
    """(DR24: ``begin`` keeps ``_head``) after a fill-in-the-middle prompt read as its head, the next generation's
    short plain prompt (within the read window: no head is worked out for it) is read whole from position 0, not as
    the old head from the old head's base: its draft is the one a fresh drafter makes."""
    f = Fim(prefix=5, suffix=6, middle=7, ends=(0,))
    before, after = [0, 1, 2, 3, 4, 0, 1, 2, 3, 4], [4, 3, 2, 1, 0, 4, 3, 2]
    fim_prompt = [5, *before, 6, *after, 7]  # 21 tokens
    md = ModelDrafter(FakeLM(8, seed=2), 8, read_window=6)
    md.fim = f
    md.begin(fim_prompt)
    ctx = TokenBuffer(fim_prompt, capacity=64)
    # a budget of 6: 3 tokens of room, 1 to the code after the gap (int(1.5)), 2 to the code before it
    assert md.behind(ctx) == 6
    md.draft(ctx, 3, GREEDY, np.random.default_rng(0))
    assert md.lm.cache.ids[:6] == [5, 3, 4, 6, 4, 7]
    md.accept(0, 1)

    plain = [3, 0, 4, 1, 2]
    md.begin(plain)
    ctx = TokenBuffer(plain, capacity=64)
    assert md.behind(ctx) == 5
    d = md.draft(ctx, 3, GREEDY, np.random.default_rng(0))
    assert md.lm.cache.ids[:5] == plain
    fresh = ModelDrafter(FakeLM(8, seed=2), 8, read_window=6)
    fresh.begin(plain)
    assert d.tokens == fresh.draft(TokenBuffer(plain, capacity=64), 3, GREEDY, np.random.default_rng(0)).tokens


def test_a_reduced_heads_greedy_alternates_are_token_ids():
    """(DR42: the alternate not mapped through ``head_ids``) a reduced draft vocabulary's logits are for its kept ids:
    the second choice, like the draft token, is the kept id at its column, with its softmax probability."""
    head = np.array([0, 2, 5, 7])
    table = np.zeros((4, 4), dtype=np.float32)
    table[0] = [0.0, 3.0, 1.0, 2.0]  # fed 0 (the context's last token): column 1 (id 2), then column 3 (id 7)
    table[2] = [2.0, 0.0, 0.0, 5.0]  # fed 2 (the draft's first token; 2 % 4 = row 2): column 3 (id 7), then 0 (id 0)
    md = ModelDrafter(FakeLM(4, order=1, table=table), 8, head_ids=head)
    ctx = TokenBuffer([3, 0], capacity=16)
    md.begin(ctx.tolist())
    d = md.draft(ctx, 2, GREEDY, np.random.default_rng(0), alternates=True)
    assert d.tokens == [2, 7]
    p0, p1 = _softmax(table[0]), _softmax(table[2])
    assert [(i, alt) for i, alt, _, _ in d.alts] == [(0, 7), (1, 0)]
    assert [c for _, _, c, _ in d.alts] == pytest.approx([p0[1], p1[3]], rel=1e-5)  # lam 1: a new drafter
    assert [q2 for _, _, _, q2 in d.alts] == pytest.approx([p0[3], p1[0]], rel=1e-5)


def test_learn_calibration_judges_the_kept_positions_and_the_first_rejected():
    """(DR61-DR63: ``confs[: n + 1]``, ``1.0 if i < n``, ``+ c``) the decayed sums [kept, confidence] over the
    positions the target judged, worked out by hand."""
    s = [4.0, 4.0]  # (a new drafter's sums: CALIB_PRIOR each)
    learn_calibration(s, [0.9, 0.8, 0.7], 1)  # judged: position 0 (kept) and 1 (the first rejected)
    d = CALIB_DECAY
    assert s == pytest.approx([d * (d * 4.0 + 1.0), d * (d * 4.0 + 0.9) + 0.8], rel=1e-12)
    s = [1.0, 2.0]
    learn_calibration(s, [0.5, 0.25], 2)  # all kept: no rejected position to judge
    assert s == pytest.approx([d * (d * 1.0 + 1.0) + 1.0, d * (d * 2.0 + 0.5) + 0.25], rel=1e-12)
    s = [1.0, 2.0]
    learn_calibration(s, [0.5, 0.25], 0)  # the first token rejected
    assert s == pytest.approx([d * 1.0, d * 2.0 + 0.5], rel=1e-12)


def test_lam_is_kept_within_its_bounds():
    """(DR59, DR60: ``min(CALIB_MAX, ...)``, ``max(CALIB_MIN, ...)``) lam = kept / confidence, clipped to
    CALIB_MIN..CALIB_MAX; 1 without history."""
    assert (CALIB_MIN, CALIB_MAX) == (0.5, 1.5)
    assert calibrated([3.0, 4.0]) == 0.75
    assert calibrated([8.0, 2.0]) == 1.5  # a drafter that understates by 4x: lam 1.5, not 4
    assert calibrated([0.5, 5.0]) == 0.5  # overstates by 10x: lam 0.5, not 0.1
    assert calibrated([8.0, 2.0], history=False) == 1.0


def test_a_drafter_with_more_logit_columns_than_the_target_has_ids_drafts_only_target_ids():
    """(DR38: ``row = logits`` for ``logits[: target_vocab]``) a drafter whose logits are padded past the target's
    vocabulary (its own vocabulary larger) drafts its best among the target's ids, never a padding column."""
    table = np.zeros((10, 10), dtype=np.float32)
    table[:, 9] = 8.0  # a padding column the drafter likes best
    for t in range(10):
        table[t, (t + 1) % 8] = 5.0  # then t + 1 (within the target's 8 ids)
    md = ModelDrafter(FakeLM(10, order=1, table=table), 8)
    ctx = TokenBuffer([0, 2], capacity=16)
    md.begin(ctx.tolist())
    assert md.draft(ctx, 3, GREEDY, np.random.default_rng(0)).tokens == [3, 4, 5]
    md2 = ModelDrafter(FakeLM(10, order=1, table=table), 8)
    md2.begin(ctx.tolist())
    d = md2.draft(ctx, 3, SamplingParams(1.0), np.random.default_rng(0))
    assert all(t < 8 for t in d.tokens) and all(q.n == 8 for q in d.probs)


def test_a_prompt_lookup_draft_holds_the_tokens_asked_for_whatever_was_offered_before():
    """(DR13: the cached match not cut to ``k``; DR11: a shorter cached match served to a longer ask) the round policy
    asks for the ``k`` it priced after an offer of up to ``kmax``: the draft holds ``k`` tokens, not the offer's
    (a verify call wider than the policy chose), and a longer ask than the last is looked up again."""
    rng = np.random.default_rng(0)
    ctx = TokenBuffer([1, 2, 3, 4, 5, 6, 1, 2], capacity=16)  # "1 2" at 0 is followed by 3 4 5 6 1 2
    pl = PromptLookupDrafter()
    pl.begin(ctx.tolist())
    o = pl.offer(ctx, 8)
    assert (o.key, o.max_tokens) == ("prompt-lookup/2", 6)
    assert pl.draft(ctx, 2, GREEDY, rng).tokens == [3, 4]
    assert pl.peek(ctx, 3) == ([3, 4, 5], "prompt-lookup/2")
    pl = PromptLookupDrafter()
    pl.begin(ctx.tolist())
    assert pl.offer(ctx, 2).max_tokens == 2
    assert pl.draft(ctx, 5, GREEDY, rng).tokens == [3, 4, 5, 6, 1]


class _Rows6(FakeLM):
    """A drafter model whose embedding has 6 rows: an id past them is an out-of-bounds read (on onnxruntime, an error
    mid-generation)."""

    def __init__(self, **kw):
        super().__init__(6, **kw)

    def _run(self, ids, past):
        assert all(0 <= int(t) < 6 for t in ids), f"an id past the drafter's embedding: {list(ids)}"
        return super()._run(ids, past)


def _env(lm):
    from types import SimpleNamespace

    from edgespec.drafters import LoadEnv

    opened = []
    manifest = SimpleNamespace(target=SimpleNamespace(vocab_size=8),
                               drafter=SimpleNamespace(vocab_size=6, load_head_ids=lambda vocab: None))
    return LoadEnv(manifest, SimpleNamespace(drafter="model"), None,
                   lambda role, min_width=None: (opened.append((role, min_width)), lm)[1]), opened


def test_a_built_drafter_with_fewer_ids_than_its_target_reads_the_ids_past_them_as_0():
    """(DR21: ``build`` without ``in_vocab``) a bundle whose drafter has fewer embedding rows than the target's
    vocabulary (Qwen2.5 7B's padding ids past the 0.5B's): the built drafter reads a context id past its rows as 0,
    and drafts what a drafter given 0 there drafts, from its own ids."""
    env, opened = _env(_Rows6(seed=3))
    md = ModelDrafter.build(env)
    assert opened == [("drafter", 1)]
    ctx = TokenBuffer([1, 7, 2, 6, 3], capacity=32)  # 6 and 7: ids the target has, the drafter not
    md.begin(ctx.tolist())
    d = md.draft(ctx, 4, GREEDY, np.random.default_rng(0))
    ref = ModelDrafter(FakeLM(6, seed=3), 8)
    zeros = TokenBuffer([1, 0, 2, 0, 3], capacity=32)
    ref.begin(zeros.tolist())
    assert d.tokens == ref.draft(zeros, 4, GREEDY, np.random.default_rng(0)).tokens
    assert all(t < 6 for t in d.tokens)


def test_a_chat_turn_that_adds_more_than_the_window_is_read_as_the_window_afresh():
    """(DR29: the read plan without ``base + held >= fresh``) a next turn that extends the last one by more than
    ``read_window`` tokens: the drafter reads the turn's last ``read_window`` tokens afresh, not everything past what
    its cache kept (here 21 tokens for a window of 8)."""
    rng = np.random.default_rng(0)
    prompt = np.random.default_rng(1).integers(0, 8, 30).tolist()
    md = ModelDrafter(FakeLM(8, seed=2), 8, read_window=8)
    md.begin(prompt)
    ctx = TokenBuffer(prompt, capacity=256)
    d = md.draft(ctx, 2, GREEDY, rng)
    md.accept(1, 5)  # the cache: prompt[22:] and the first draft token
    ctx.extend([d.tokens[0], 5])
    turn = ctx.tolist() + np.random.default_rng(4).integers(0, 8, 20).tolist()  # 52 tokens
    md.begin(turn)
    tctx = TokenBuffer(turn, capacity=256)
    assert md.behind(tctx) == 8 and md.offer(tctx, 4).upfront == 8
    md.draft(tctx, 1, GREEDY, rng)
    assert md.lm.tokens == turn[-8:]


def _table(top: float, second: float, vocab: int = 8) -> np.ndarray:
    """A one-token-context table (``FakeLM(order=1)``): fed t, probability ``top`` on t + 1, ``second`` on t + 2, the
    rest spread evenly."""
    t = np.full((vocab, vocab), np.log((1 - top - second) / (vocab - 2)))
    for i in range(vocab):
        t[i, (i + 1) % vocab], t[i, (i + 2) % vocab] = np.log(top), np.log(second)
    return t


def test_greedy_alternates_leave_the_draft_and_its_confidence_stop_as_they_were():
    """(DR65: ``_second`` leaves -inf at the row's best; DR66: the second's probability relative to the top) a
    fixed-length draft (its stop: the top probability below ``min_confidence``) asked for alternates drafts the same
    tokens; each alternate is the second choice with its own softmax probability (0.15), beside the top's (0.55)."""
    rng = np.random.default_rng(0)
    ctx = TokenBuffer([3, 0], capacity=16)
    plain = ModelDrafter(FakeLM(8, order=1, table=_table(0.55, 0.15)), 8, min_confidence=0.5)
    plain.begin(ctx.tolist())
    assert plain.draft(ctx, 4, GREEDY, rng).tokens == [1, 2, 3, 4]
    md = ModelDrafter(FakeLM(8, order=1, table=_table(0.55, 0.15)), 8, min_confidence=0.5)
    md.begin(ctx.tolist())
    d = md.draft(ctx, 4, GREEDY, rng, alternates=True)
    assert d.tokens == [1, 2, 3, 4]  # (the rest without the best: 0.15 / 0.45 < 0.5 would stop it)
    assert [(i, alt) for i, alt, _, _ in d.alts] == [(0, 2), (1, 3), (2, 4), (3, 5)]
    assert [c for _, _, c, _ in d.alts] == pytest.approx([0.55] * 4, rel=1e-5)
    assert [q2 for _, _, _, q2 in d.alts] == pytest.approx([0.15] * 4, rel=1e-5)


def test_the_second_choice_of_a_read_only_row_leaves_it_as_it_was():
    """(DR64: no copy of a read-only row) ``_second`` on a row it may not write (a read-only view of a logits
    buffer): the second-largest logit's index and its softmax probability, the row unchanged."""
    from edgespec.drafters import _second

    row = np.array([1.0, 3.0, 2.0, 0.0], dtype=np.float32)
    row.flags.writeable = False
    p = _softmax(row)
    j2, q2 = _second(row, 1, float(p[1]))
    assert j2 == 2 and q2 == pytest.approx(p[2], rel=1e-6)
    assert row.tolist() == [1.0, 3.0, 2.0, 0.0]


def test_a_catch_up_with_a_hint_keeps_each_sampled_q_on_its_own_row(monkeypatch):
    """(DR36: the catch-up-and-hint call's rows not copied under sampling) a sampled q may keep its row (a TailDist
    computes its tail from it later), and the drafter's model hands out views of one buffer that its next call
    overwrites: after a hint that goes wrong at the third token (a step then runs), every q still describes the row
    it was drawn from, as a model without a shared buffer computes it."""
    from edgespec import sampling
    from edgespec.sampling import TailDist, distribution

    monkeypatch.setattr(sampling, "_DENSE_EPS", 0.01)  # a tail rarely computed while drafting
    vocab = 5000
    table = np.random.default_rng(5).normal(0, 1.0, (8, vocab))
    table[:, :4] += 14.0  # a few likely tokens, a long tail
    sp = SamplingParams(1.0)

    def caught_up():
        md = ModelDrafter(FakeLM(vocab, table=table, reuse_buffer=True), vocab)
        ctx = TokenBuffer([1, 2, 3], capacity=64)
        md.begin(ctx.tolist())
        md.draft(ctx, 1, sp, np.random.default_rng(0))  # the first read
        md.accept(0, 2)
        ctx.extend([2])
        return md, ctx

    md, ctx = caught_up()
    plain = md.draft(ctx, 6, sp, np.random.default_rng(1))
    md, ctx = caught_up()
    hint = plain.tokens[:2] + [(plain.tokens[2] + 1) % vocab] + plain.tokens[3:5]
    d = md.draft(ctx, 6, sp, np.random.default_rng(1), hint=hint)
    assert d.tokens == plain.tokens and all(isinstance(q, TailDist) for q in d.probs)
    assert any(q._exact is None for q in d.probs[:2])  # tails left to compute from their rows
    seen, ref = ctx.tolist(), FakeLM(vocab, table=table)
    for q, tok in zip(d.probs, d.tokens):
        assert np.array_equal(q.exact().dense(), distribution(ref.logits_for(seen), sp).exact().dense())
        seen.append(tok)


def test_a_reduced_heads_top_k_draft_is_drawn_over_its_kept_ids():
    """(DR41: a sparse q's columns taken for token ids) under top-k the reduced head's q keeps a few of its columns;
    each column j is the token id head[j]: the draft's tokens are kept ids, and q gives each of the top-2 kept ids its
    softmax weight among the two, worked out from the row written here."""
    head = np.array([1, 4, 6, 7])
    table = np.zeros((8, 4), dtype=np.float32)
    table[:] = [0.0, 2.0, 1.0, 3.0]  # whatever was fed: columns 3 (id 7) and 1 (id 4) are the top 2
    md = ModelDrafter(FakeLM(4, order=1, table=table), 8, head_ids=head)
    ctx = TokenBuffer([2, 5], capacity=16)
    md.begin(ctx.tolist())
    d = md.draft(ctx, 3, SamplingParams(1.0, top_k=2), np.random.default_rng(0))
    assert len(d.tokens) == 3 and set(d.tokens) <= {4, 7}
    e = 1.0 / (1.0 + np.exp(-1.0))  # exp(3) / (exp(3) + exp(2))
    for q in d.probs:
        assert q.n == 8
        assert [q.prob(t) for t in range(8)] == pytest.approx([0, 0, 0, 0, 1 - e, 0, 0, e], rel=1e-6)


class _Only(set):
    """A structured output's constraint (constrain.Constraint's protocol) over 8 ids allowing these ids only."""

    def mask(self):
        return np.array([t in self for t in range(8)])

    def push(self, t):
        assert t in self, f"a drafted token the grammar forbids: {t}"
        return True

    def pop(self):
        pass


@pytest.mark.parametrize("sp", [SamplingParams(), SamplingParams(1.0)])
def test_a_grammar_that_allows_none_of_a_reduced_heads_ids_ends_the_draft(sp):
    """(DR39: no ``if not allowed.any(): break``) a reduced head (drafter-vocab N) under a grammar whose next token
    must be an id the head does not keep: the draft ends there, empty, rather than drafting a forbidden id (greedy:
    the argmax of a row of -inf) or failing on a distribution with no token (sampled)."""
    head = np.array([0, 1, 2, 3])
    md = ModelDrafter(FakeLM(4, seed=1), 8, head_ids=head)
    ctx = TokenBuffer([1, 2, 3], capacity=16)
    md.begin(ctx.tolist())
    assert md.draft(ctx, 3, sp, np.random.default_rng(0), grammar=_Only({5, 6})).tokens == []
    md.reset()
    md.begin(ctx.tolist())
    d = md.draft(ctx, 3, sp, np.random.default_rng(0), grammar=_Only({2, 3}))  # (the premise: kept ids drafted)
    assert len(d.tokens) == 3 and set(d.tokens) <= {2, 3}


def test_a_confidence_stop_counts_no_token_surer_than_certain():
    """(DR46: ``sure *= lam * conf`` unbounded) the dynamic stop multiplies each token's calibrated top probability,
    at most 1: with lam 1.5, two tokens at 0.9 count 1 each and a third at 0.3 leaves 0.45, below a threshold of 0.5,
    so the draft ends there; uncapped (1.35 * 1.35 * 0.45 = 0.82) it would run to k."""
    tops = [0.9, 0.9, 0.3, 0.9, 0.9, 0.9, 0.9, 0.9]  # fed t: this sure of t + 1
    table = np.zeros((8, 8))
    for t, top in enumerate(tops):
        table[t] = np.log((1 - top) / 7)
        table[t, (t + 1) % 8] = np.log(top)
    md = ModelDrafter(FakeLM(8, order=1, table=table), 8)
    md._calib[True] = [6.0, 4.0]  # kept 1.5x as often as its confidence said
    assert md.calibration(True) == 1.5
    ctx = TokenBuffer([5, 0], capacity=64)
    md.begin(ctx.tolist())
    assert md.draft(ctx, 8, GREEDY, np.random.default_rng(0), stop=0.5).tokens == [1, 2, 3]


def test_a_tail_tokens_alternate_is_priced_at_the_one_near_tokens_share():
    """(session 95's review of DR-survivors) ``_rescue`` on a TailDist with one near token and a draft token from its
    tail: the largest probability q gives another token is that near token's, not 0 (a one-token distribution whose
    token is the draft's own still prices its alternate at 0)."""
    from edgespec.drafters import _rescue
    from edgespec.sampling import Dist, TailDist, distribution

    row = np.full(5000, -20.0, dtype=np.float32)
    row[3] = 0.0
    q = distribution(row, SamplingParams(1.0))
    assert isinstance(q, TailDist) and q.idx.tolist() == [3]
    assert _rescue(q, 4000) == pytest.approx(1.0 / q.total) and q.total == 1.0
    assert _rescue(q, 3) == 0.0
    one = Dist(8, np.array([5]), np.array([2.0]))
    assert _rescue(one, 5) == 0.0 and _rescue(one, 6) == 1.0
