"""Direct tests of edgespec/policy.py's rules that its second mutation pass (docs/bench/mutation_harness/policy_mut.py,
PO1-PO48) found untested: each fails with its mutant planted. No model: CostModel, Acceptance and RoundPolicy alone,
with scripted drafters (tests/test_decoder.py's policy tests hold the rest)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from edgespec.drafters import Offer
from edgespec.kv import TokenBuffer
from edgespec.policy import (
    HINT_CALL_COST,
    HINT_ROW_COST,
    NO_DRAFT,
    PRIOR_STEP,
    Acceptance,
    Choice,
    CostModel,
    RoundPolicy,
    _affine,
    hint_length,
    hint_saved,
)


class _Named:
    """A drafter as RoundPolicy.observe sees it: a name and whether its steps cost."""

    def __init__(self, name, has_cost):
        self.name, self.has_cost = name, has_cost

    def offer(self, ctx, kmax):
        return Offer(self.name, 1, prior=(1.0, 1.0))


def test_acceptance_counts_a_rejection_only_where_the_draft_was_cut_and_forgets_both_counts():
    """(PO1, PO2, PO3) A draft kept whole is no rejection; a rejection is one per round; both counts decay; the
    estimate keeps both pseudo-counts of its prior."""
    a = Acceptance()
    a.update(3, 3)
    assert (a.accepted, a.rejected) == (3, 0)
    a.update(1, 3)
    assert a.accepted == pytest.approx(0.95 * 3 + 1) and a.rejected == 1
    assert a.alpha == pytest.approx((3.85 + 1.2) / (3.85 + 1.2 + 1 + 0.8))


def test_a_stalled_call_moves_the_estimate_at_most_stall_clip_times_and_a_zero_call_teaches_nothing():
    """(PO4, PO6) A call that took 100x its estimate counts as STALL_CLIP (2x) of it; a call the clock read as 0 s
    (or a drafter step of 0 s) is no sample."""
    cm = CostModel()
    cm.observe_target(1, 1.0)
    cm.observe_target(1, 100.0)
    assert cm.target[1] == pytest.approx(0.7 * 1.0 + 0.3 * 2.0)
    cm.observe_target(2, 0.0)
    cm.observe_draft(0.0, "model")
    assert 2 not in cm.target and "model" not in cm.draft_steps


def test_a_cost_set_to_zero_outside_the_model_is_replaced_by_the_next_sample():
    """(PO5) An estimate of 0 s (set directly, as scripts/replay_policy.py sets the costs it replays) is no
    estimate: the next sample replaces it, not moves it 0.3 of the way from 0 (a stall clip at 2 x 0 would keep
    it at 0 for good)."""
    cm = CostModel()
    cm.draft_steps["model"] = 0.0
    cm.observe_draft(0.3, "model")
    assert cm.draft_steps["model"] == pytest.approx(0.3)


def test_the_catch_up_line_takes_only_finite_reads_a_bounded_window_and_no_read_of_zero_tokens():
    """(PO7, PO8, PO9) An infinite read is no sample; the line is fitted to the last ``catchup_window`` reads; a
    read of 0 tokens counts as one token (a per-token fallback would otherwise divide by zero)."""
    cm = CostModel()
    cm.observe_catchup(10, float("inf"))
    assert "model" not in cm.catchup_reads and "model" not in cm.catchup
    cm.observe_catchup(0, 0.5)
    assert cm.catchup_reads["model"] == [(1, 0.5)] and cm.catchup["model"] == (0.0, 0.5)
    for i in range(40):
        cm.observe_catchup(10 + i, 0.01 * (10 + i))
    assert len(cm.catchup_reads["model"]) == cm.catchup_window == 32
    assert cm.catchup_reads["model"][0] == (18, pytest.approx(0.18))


def test_a_stale_reads_price_mixes_the_measured_line_with_the_prior_by_its_trust():
    """(PO10, PO11) ``trust`` weighs the measured line against the prior: 0.25 of the one, 0.75 of the other."""
    cm = CostModel()
    cm.observe_target(1, 1.0)
    cm.observe_catchup(50, 6.0)
    measured, prior = cm.upfront_cost(50), cm.prior_upfront(50)
    assert measured == pytest.approx(6.0) and prior != pytest.approx(measured)
    assert cm.upfront_cost(50, trust=0.25) == pytest.approx(0.25 * measured + 0.75 * prior)
    assert cm.upfront_cost(50, trust=1.0) == pytest.approx(measured)


def test_a_prior_read_follows_the_marginal_token_and_a_non_model_drafter_steps_at_prior_step():
    """(PO12, PO13) Before a read is measured, a context token costs a step times the target's marginal token (where
    that is above ``prior_catchup``); a drafter other than the model's steps at PRIOR_STEP of a call, whatever
    ``prior_step_ratio`` says."""
    cm = CostModel(prior_step_ratio=0.2)
    cm.observe_target(1, 1.0)
    cm.observe_target(3, 2.0)  # a verified token at 0.5 of a call
    assert cm.marginal() == pytest.approx(0.5)
    assert cm.prior_upfront(10) == pytest.approx(10 * 0.5 * 0.2)
    assert cm.prior_step("suffix") == pytest.approx(PRIOR_STEP * 1.0)
    assert cm.prior_step("model") == pytest.approx(0.2)


def test_the_catch_up_fit_falls_back_to_time_per_token_where_the_line_is_not_physical():
    """(PO14, PO15, PO16) A fit with a negative intercept, or reads all of one length, gives all of the time per
    token: total seconds over total tokens."""
    reads = [(10, 1.0), (20, 3.0), (30, 5.0)]  # the line: -1 + 0.2 a token
    assert _affine(reads) == (0.0, pytest.approx(9.0 / 60))
    assert _affine([(10, 1.0), (10, 1.2)]) == (0.0, pytest.approx(0.11))
    assert _affine([(10, 1.0), (20, 1.5)]) == (pytest.approx(0.5), pytest.approx(0.05))


def test_cost_priors_step_ratio_leaves_a_drafter_on_a_gpu_at_its_default():
    """(PO19) A model drafter on a GPU: its step is no share of the target's bytes, the default ratio stays."""
    from types import SimpleNamespace as NS

    from edgespec.policy import cost_priors

    target = NS(cheap_rows=True, spec=NS(gpu_weight_bytes=1000, embedding_bytes=100))
    gpu = NS(device="cuda", spec=NS(gpu_weight_bytes=300, embedding_bytes=120))
    assert cost_priors(target, gpu)["prior_step_ratio"] == PRIOR_STEP


@pytest.mark.parametrize("kw, ok", [
    (dict(prior_slope=0.3, prior_steep=0.0), True),  # no knee: prior_steep says nothing (PO21)
    (dict(prior_knee=4, prior_slope=0.3, prior_steep=0.1), False),
    (dict(share_prior=float("inf")), False),  # (PO22)
    (dict(use_alternates=1.0), False),  # (PO23)
    (dict(use_alternates=1), True),
    (dict(prior_steep=True), False),  # (PO20)
])
def test_round_policy_arguments(kw, ok):
    if ok:
        RoundPolicy(**kw)
    else:
        with pytest.raises(ValueError):
            RoundPolicy(**kw)


def test_sampled_generations_keep_a_costly_drafters_mixed_estimates_apart_from_greedy_ones():
    """(PO25, PO26) ``auto`` (a costly drafter beside free ones) teaches the costly drafter's estimate into the mixed
    store of its regime: not into ``learned`` and, when sampling, not into greedy's mixed store."""
    model, copy = _Named("model", True), _Named("copy", False)
    pol = RoundPolicy()
    pol.begin("auto", {"model": model, "copy": copy}, 1, sampled=True)
    pol.estimate(model.offer(None, 1), True)
    pol.observe(Choice(model, 1, "model"), [5], 0, None, 2, 0.01)
    assert "model" in pol.learned_mixed_sampled
    assert "model" not in pol.learned_mixed and "model" not in pol.learned_sampled and "model" not in pol.learned
    pol.begin("model", {"model": model, "copy": copy}, 1, sampled=True)  # alone: its own store
    pol.estimate(model.offer(None, 1), True)
    pol.observe(Choice(model, 1, "model"), [5], 1, None, 2, 0.01)
    assert "model" in pol.learned_sampled and "model" not in pol.learned


def test_a_learned_estimate_weighs_carry_rounds_in_a_new_generation():
    """(PO29) A new generation starts from what was learned with ``carry`` rounds of weight."""
    copy = _Named("copy", False)
    pol = RoundPolicy(carry=6.0)
    pol.begin("auto", {"copy": copy}, 1)
    for _ in range(30):
        pol.estimate(copy.offer(None, 1))
        pol.observe(Choice(copy, 1, "copy"), [5], 1, None, 2, 0.01)
    a = pol.learned["copy"].alpha
    pol.begin("auto", {"copy": copy}, 1)
    est = pol.estimate(copy.offer(None, 1))
    assert (est.prior_accept, est.prior_reject) == (pytest.approx(6.0 * a), pytest.approx(6.0 * (1 - a)))


def test_hint_length_is_the_length_that_saves_most_steps():
    """(PO31) The search runs until alpha^h < 0.01, so a likely guess is checked as far as it pays."""
    for alpha in (0.3, 0.7, 0.9):
        gains = [hint_saved(alpha, h) - (HINT_CALL_COST + HINT_ROW_COST * h) for h in range(1, 40)]
        want = int(np.argmax(gains)) + 1 if max(gains) > 0 else 0
        assert hint_length(alpha, 39) == want
    assert hint_length(0.7, 10) == 7
    assert hint_length(0.9, 3) == 3 and hint_length(0.0, 5) == 0


class _Peeker:
    """A free drafter whose guess (``tokens``) a costly drafter may check as a hint."""

    has_cost = False

    def __init__(self, name, tokens):
        self.name, self.tokens = name, tokens

    def offer(self, ctx, kmax):
        return Offer(self.name, 0 if False else 1, prior=(0.1, 10.0))  # too unlikely to draft a round itself

    def peek(self, ctx, k):
        return list(self.tokens[:k]), self.name


class _Hinted:
    name, has_cost, takes_hint = "model", True, True

    def offer(self, ctx, kmax):
        return Offer(self.name, kmax, prior=(9.0, 1.0))


def test_of_two_equally_likely_guesses_the_longer_is_the_hint():
    """(PO32) Where two free drafters' guesses are estimated alike, the longer one is the hint."""
    short, long_, model = _Peeker("a", [5]), _Peeker("b", [5, 6, 7, 8]), _Hinted()
    pol = RoundPolicy()
    pol.measured.observe_target(1, 1.0)
    pol.measured.observe_target(2, 1.05)
    pol.measured.observe_draft(0.3, "model")
    pol.begin("auto", {"a": short, "b": long_, "model": model}, 1)
    for key in ("a", "b"):  # both estimated alike, likely enough to hint
        pol.acceptance[key] = Acceptance(9.0, 1.0)
    c = pol.choose(TokenBuffer([1, 2, 3], capacity=64), 50, None, 8)
    assert c.drafter is model and len(c.hint) > 1 and c.hint == tuple([5, 6, 7, 8][:len(c.hint)])


def test_a_shadow_is_scored_on_the_tokens_emitted_after_it_all_matched_counts_whole():
    """(PO33, PO34) A free guess not drafted is scored once the target emitted after it: a guess it matched whole
    counts as kept whole, and nothing is scored before anything was emitted."""
    pol = RoundPolicy()
    pol.begin("auto", {}, 1)
    pol.acceptance["g"] = Acceptance()
    ctx = TokenBuffer([1, 2, 3], capacity=64)
    pol._shadow = [("g", [4, 5], 3)]
    pol._score_shadows(ctx)  # nothing emitted yet
    assert pol.acceptance["g"].samples == 0
    pol._shadow = [("g", [4, 5], 3)]
    ctx.extend([4, 5, 6])
    pol._score_shadows(ctx)
    est = pol.acceptance["g"]
    assert est.samples == 1 and est.accepted == 2 and est.rejected == 0


def test_costly_share_weighs_share_prior_rounds():
    """(PO35) The share's prior counts ``share_prior`` rounds at 1."""
    pol = RoundPolicy(share_prior=3.0)
    pol.begin("auto", {}, 1)
    pol._rounds, pol._costly_rounds = 2, 0
    assert pol.costly_share() == pytest.approx(3 / 5)


def test_uncovered_counts_only_free_drafters_kept_tokens():
    """(PO36, PO46) What is left for a costly drafter that must read first: the tokens free drafters did not
    draft; a costly drafter's kept tokens are not covered by them."""
    copy, model = _Named("copy", False), _Named("model", True)
    pol = RoundPolicy()
    pol.begin("auto", {"copy": copy, "model": model}, 1)
    assert pol.uncovered() == 1.0
    pol.observe(Choice(copy, 3, "copy"), [4, 5, 6], 3, None, 4, 0.01)  # 4 tokens, 3 of them the copy's
    assert pol.uncovered() == pytest.approx(0.25)
    pol.observe(Choice(model, 3, "model"), [4, 5, 6], 3, 0.003, 4, 0.01)  # 4 more, none the free drafters'
    assert pol.uncovered() == pytest.approx(1 - 3 / 8)


def test_a_drafters_step_cost_relaxes_halfway_to_the_prior_only_from_above_and_only_when_stale():
    """(PO37, PO38) A step cost the last generation did not renew moves half the way to the prior, from above
    only (a cheaper step than the prior never keeps a drafter out)."""
    model, copy = _Named("model", True), _Named("copy", False)
    pol = RoundPolicy()
    pol.measured.observe_target(1, 1.0)
    prior = pol.measured.prior_step("model")  # 0.4
    pol.begin("model", {"model": model}, 1)
    pol.observe(Choice(model, 1, "model"), [5], 1, 2.0, 2, 1.0)
    pol.observe(Choice(copy, 1, "copy"), [5], 1, 0.1, 2, 1.0)
    pol.begin("model", {"model": model}, 1)  # the generation after the measurement: kept
    assert pol.measured.draft_steps["model"] == pytest.approx(2.0)
    pol.begin("model", {"model": model}, 1)
    assert pol.measured.draft_steps["model"] == pytest.approx(0.5 * (2.0 + prior))
    assert pol.measured.draft_steps["copy"] == pytest.approx(0.1)  # below its prior: kept


def test_the_alternates_scale_is_bounded():
    """(PO40) The kept-to-expected calibration counts within ALT_SCALE."""
    from edgespec.policy import ALT_SCALE

    pol = RoundPolicy()
    pol._alt_calib[:] = [100.0, 1.0]
    assert pol.alternate_scale() == ALT_SCALE[1]
    pol._alt_calib[:] = [0.0, 100.0]
    assert pol.alternate_scale() == ALT_SCALE[0]


def test_a_catch_up_trust_halves_every_stale_half_life_generations():
    """(PO47) The measured read's trust halves every ``stale_half_life`` generations without a new read."""
    model = _Named("model", True)
    pol = RoundPolicy(stale_half_life=4.0)
    pol.begin("model", {"model": model}, 1)
    pol.observe(Choice(model, 1, "model"), [5], 1, 0.3, 2, 1.0, catchup=(50, 6.0))
    pol.begin("model", {"model": model}, 1)
    assert pol.catchup_trust("model") == 1.0
    pol.begin("model", {"model": model}, 1)
    pol.begin("model", {"model": model}, 1)
    assert pol.catchup_trust("model") == pytest.approx(0.5 ** (2 / 4.0))


def test_a_stale_read_replaces_the_old_reads_not_joins_them():
    """(PO45) The first read after the measured cost went stale starts the line afresh."""
    model = _Named("model", True)
    pol = RoundPolicy()
    pol.begin("model", {"model": model}, 1)
    pol.observe(Choice(model, 1, "model"), [5], 1, 0.3, 2, 1.0, catchup=(50, 60.0))
    for _ in range(3):
        pol.begin("model", {"model": model}, 1)
    assert pol.catchup_trust("model") < 1.0
    pol.observe(Choice(model, 1, "model"), [5], 1, 0.3, 2, 1.0, catchup=(40, 0.4))
    assert pol.measured.catchup_reads["model"] == [(40, 0.4)]
