"""Tests for the gaps a second mutation test of edgespec/sampling.py and edgespec/verify.py found (session 95,
docs/bench/mutation_s95.md; mutants in docs/bench/mutation_harness/sampling_mut.py). Each fails with its mutant
planted and passes on the code; no model is loaded, the distributions are worked out by hand."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.sampling import Dist, SamplingParams, TailDist, distribution
from edgespec.verify import alternate_dist, rejection_sample
from test_decoder import _tail_row


def test_a_token_past_the_vocabulary_has_probability_zero():
    """SA7: a drafter whose vocabulary is wider than the target's rows (a padded embedding) may propose a token the
    target has no logit for: p(x) is 0 and the token is rejected, not an IndexError."""
    p = distribution(np.array([0.0, 0.0, 0.0, 0.0], dtype=np.float32), SamplingParams(1.0))
    assert p.idx is None and p.prob(4) == 0.0 and p.prob(3) == pytest.approx(0.25)
    rows = np.array([[5.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    for seed in range(20):  # a point-mass draft (prompt lookup's) of token 4: always rejected, the token drawn from p
        n, nxt = rejection_sample([4], None, rows, SamplingParams(1.0), np.random.default_rng(seed))
        assert n == 0 and 0 <= nxt < 4


def test_a_dense_distribution_without_its_only_weighted_token_is_nothing():
    """SA18: dense q (temperature alone over a small vocabulary) whose other weights underflow to 0 at a low
    temperature: q without its one token is None, so no alternate is drawn from it, where a distribution of total 0
    drew token n - 1 and the rule then divided by 0."""
    q = distribution(np.array([0.0, -1.0, -5.0, -6.0], dtype=np.float32), SamplingParams(1e-3))
    assert q.idx is None and q.w.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert q.without(0) is None and alternate_dist(q, 0) is None
    rest = q.without(1)  # (removing a token of weight 0 leaves the distribution as it was)
    assert rest is not None and rest.dense().tolist() == [1.0, 0.0, 0.0, 0.0]


def test_a_small_residual_is_still_the_residual():
    """SA23: p and q 0.1% apart: the residual max(p - q, 0) is a point mass on the token p gives more, not "p == q"
    (None, which samples p itself after a rejection: the rejections of a close drafter would follow p, not the
    residual). Dense and sparse alike."""
    p = Dist(2, None, np.array([0.5005, 0.4995]))
    q = Dist(2, None, np.array([0.5, 0.5]))
    r = p.minus(q)
    assert r is not None and r.dense() == pytest.approx([1.0, 0.0])
    assert q.minus(p).dense() == pytest.approx([0.0, 1.0])
    assert q.minus(Dist(2, None, np.array([0.5, 0.5]))) is None  # equal: None
    idx = np.array([3, 7])
    r = Dist(9, idx, np.array([0.5005, 0.4995])).minus(Dist(9, idx, np.array([0.5, 0.5])))
    assert r is not None and r.prob(3) == pytest.approx(1.0) and r.prob(7) == 0.0


def test_a_tail_dist_without_its_only_token_is_nothing():
    """SA33: temperature alone over 4,096 tokens, one near the maximum and every other's weight 0 in float32: the
    lazy distribution without that token is None (nothing is left), not a TailDist of no near tokens."""
    row = np.full(4096, -1e4, dtype=np.float32)
    row[7] = 0.0
    d = distribution(row, SamplingParams(1.0))
    assert isinstance(d, TailDist) and d.idx.tolist() == [7]
    assert d.without(7) is None and alternate_dist(d, 7) is None
    row[9] = -20.0  # (a tail token of weight e**-20: without the near one, it is all that is left)
    d = distribution(row, SamplingParams(1.0))
    assert isinstance(d, TailDist) and d.idx.tolist() == [7]
    rest = d.without(7)
    assert rest is not None and rest.prob(9) == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    assert {rest.sample(rng) for _ in range(50)} == {9}


@pytest.mark.parametrize("path", ["native", "numpy", "float64", "top-k"])
def test_top_p_on_tied_tokens_stops_where_the_mass_before_reaches_it(path, monkeypatch):
    """SA59: equal logits are exact ties of probability, so a top-p cut can land exactly on a prefix sum. Four equal
    tokens at top_p 0.5: the first two hold 0.5, and the third has 0.5 before it, not less, so two are kept
    (transformers' rule: it drops the tokens whose ascending cumulative probability is at most 1 - top_p); `<=`
    kept three. Every path: the native kernel, numpy's (float32 with the kernel off, float64 rows) and top-k's."""
    from edgespec import native

    if path == "native" and native.top_p_kernel() is None:
        pytest.skip("no native top-p kernel here")
    if path == "numpy":
        monkeypatch.setattr(native, "top_p_kernel", lambda: None)
    dtype = np.float64 if path == "float64" else np.float32
    kw = {"top_k": 7} if path == "top-k" else {}
    for n, top_p, kept in ((4, 0.5, 2), (4, 0.75, 3), (8, 0.5, 4), (8, 0.25, 2), (4, 0.51, 3), (4, 0.49, 2)):
        row = np.zeros(n, dtype=dtype)
        if path == "top-k":
            row = np.concatenate([row, np.full(3, -50.0, dtype=dtype)])  # (top-k keeps the n tied tokens and 3 more)
            kw = {"top_k": n + 1}
        d = distribution(row, SamplingParams(1.0, top_p=top_p, **kw))
        assert d.idx.tolist() == list(range(kept)), (n, top_p)
        assert d.dense()[:kept] == pytest.approx([1 / kept] * kept)


def test_a_draw_at_the_end_of_the_cumulative_weights_takes_the_last_index():
    """SA69: a draw scaled by a total summed in another order (a TailDist's near mass: a pairwise sum against the
    cumulative one) can land at or past the last cumulative weight: the last index, not one past the end."""
    from edgespec.sampling import _locate

    c = np.cumsum([0.1, 0.2, 0.3])
    assert [_locate(c, u) for u in (0.0, 0.05, 0.1, 0.35, c[-1], c[-1] * (1 + 1e-15), 1.0)] == [0, 0, 1, 2, 2, 2, 2]


def test_acceptance_decided_on_bounds_equals_the_exact_rule_draw_for_draw(monkeypatch):
    """VE15 (and VE16, VE17): a TailDist knows p(x) or q(x) only within bounds, and the acceptance test u < p(x) /
    q(x) is decided on them where it can be. With the same draw u, the decision must be the exact rule's every time:
    accepting where u * q_lo < p_lo (the wrong bound) accepted a fifth of the draws the exact rule rejects here, and
    the statistical tests, whose q's bounds are narrow, passed. Wide tails (a bound of ~3 against a near mass of
    ~1.5) on either side, or both, and a point-mass q."""
    from edgespec import sampling
    from edgespec.verify import _accepts

    monkeypatch.setattr(sampling, "_DENSE_EPS", 3.0)  # (test_decoder's wide_tail)
    sp = SamplingParams(1.0)
    row_q = _tail_row()
    row_p = row_q.copy()
    row_p[:4] = [-1.5, 0.0, 0.0, -0.5]
    q_tail, p_tail = distribution(row_q, sp), distribution(row_p, sp)
    assert isinstance(q_tail, TailDist) and isinstance(p_tail, TailDist) and q_tail.bound > 2 and p_tail.bound > 2
    q_exact, p_exact = q_tail.exact(), p_tail.exact()
    cases = [(p_exact, q_tail), (p_tail, q_exact), (p_tail, q_tail), (q_exact, p_tail), (p_tail, None)]
    for p, q in cases:
        differ = 0
        for x in (0, 2, 3, 4, 4999):
            px, qx = p.exact().prob(x), (1.0 if q is None else q.exact().prob(x))
            for seed in range(400):
                u = np.random.default_rng(seed).random()
                want = u * qx < px
                assert _accepts(p, q, x, np.random.default_rng(seed)) == want, (x, seed, u, px, qx)
                lo, hi = p.prob_bounds(x)
                q_lo, q_hi = (1.0, 1.0) if q is None else q.prob_bounds(x)
                differ += (u * q_lo < lo) != want or (u * q_hi >= hi) == want
        if q is q_tail:  # (the bounds alone, taken the wrong way round, would have decided many draws wrongly)
            assert differ > 100, differ


def test_the_residual_against_a_drafter_of_fewer_tokens_lines_its_tokens_up():
    """SA70: a drafter whose rows are narrower than the target's (a head without the target's padded tokens) gives
    a q of fewer tokens: token t of q is token t of p, and the tokens past q's end have q 0. Padding q in front
    shifted every token by the difference."""
    p = Dist(5, None, np.array([0.1, 0.2, 0.3, 0.2, 0.2]))
    q = Dist(3, None, np.array([0.5, 0.3, 0.2]))
    r = p.minus(q)
    want = np.maximum(p.dense() - [0.5, 0.3, 0.2, 0.0, 0.0], 0)
    assert r.dense() == pytest.approx(want / want.sum())  # (tokens 2, 3 and 4: 0.1, 0.2, 0.2 of 0.5)
