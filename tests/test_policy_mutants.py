"""Gaps a second mutation test of ``edgespec/policy.py`` found (docs/bench/mutation_harness/policy_mut.py, PO1-PO48):
the catch-up line's reads (an infinite one, one of no tokens), a cost set to 0 outside the model, the hint's length
search and the longer of two guesses, a shadow guess's score. Each fails with its mutant planted; PO22 and PO23 are
cases of ``test_decoder.py``'s policy tests, which catch the other 39. No model: CostModel, Acceptance and
RoundPolicy alone, with scripted drafters."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.drafters import Offer
from edgespec.kv import TokenBuffer
from edgespec.policy import (
    HINT_CALL_COST,
    HINT_ROW_COST,
    Acceptance,
    CostModel,
    RoundPolicy,
    hint_length,
    hint_saved,
)
from test_decoder import _Dynamic


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
        return Offer(self.name, 1, prior=(0.1, 10.0))  # too unlikely to draft a round itself

    def peek(self, ctx, k):
        return list(self.tokens[:k]), self.name


def test_of_two_equally_likely_guesses_the_longer_is_the_hint():
    """(PO32) Where two free drafters' guesses are estimated alike, the longer one is the hint."""
    short, long_, model = _Peeker("a", [5]), _Peeker("b", [5, 6, 7, 8]), _Dynamic(takes_hint=True)
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
