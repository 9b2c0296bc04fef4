"""Predicted outputs (prediction.py): the drafter's alignment, exactness greedy and sampled (with a
planted bug the statistical test catches), the options' checks, the API and the CLI."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from edgespec import verify as verify_mod
from edgespec.cli import main
from edgespec.decoder import Decoder, GenerationConfig, Stats
from edgespec.drafters import ModelDrafter, PromptLookupDrafter
from edgespec.errors import ConfigError
from edgespec.kv import TokenBuffer
from edgespec.prediction import PredictionDrafter, prediction_usage
from edgespec.sampling import SamplingParams, probs
from test_decoder import _chi2, _chi2_crit, _exact_sequence_probs, make, run, suffix_drafter
from tiny import FakeLM, SimClock, split_runs


def _drafter(pred, prompt):
    d = PredictionDrafter()
    d.set_prediction(pred)
    d.begin(prompt)
    return d


def test_the_reply_is_followed_through_the_prediction_by_position():
    prompt = [90, 91, 92]
    d = _drafter([1, 2, 3, 4, 5, 6, 7], prompt)
    ctx = TokenBuffer(prompt + [1], capacity=64)
    assert d.peek(ctx, 3) == ([2, 3, 4], "prediction/start")  # the reply so far is the prediction's head
    ctx.extend([2, 3])
    assert d.peek(ctx, 8) == ([4, 5, 6, 7], "prediction/sync")  # on from where it was
    ctx.extend([9, 9])  # an edit: the reply leaves the prediction (at 3: the 4 it replaced)
    assert d.peek(ctx, 4) == ([5, 6, 7], "prediction/skip")  # a guess: the reply goes on after the 4
    ctx.extend([5, 6])
    assert d.peek(ctx, 4) == ([7], "prediction/sync")  # it did
    ctx.extend([7])
    assert d.align(ctx) == (7, "prediction/sync") and d.offer(ctx, 4) is None  # at its end: nothing to draft
    d = _drafter([1, 2, 3, 4, 5, 6, 7], prompt)  # without the guess, two tokens rejoin it
    d.skip_span = 0
    assert d.align(TokenBuffer(prompt + [1, 2, 3], capacity=64)) == (3, "prediction/start")
    ctx = TokenBuffer(prompt + [1, 2, 3, 9, 9], capacity=64)
    assert d.peek(ctx, 4) == ([], "") and d.offer(ctx, 4) is None
    ctx.extend([5, 6])
    assert d.peek(ctx, 4) == ([7], "prediction/2")  # rejoined after the edit


def test_a_guess_after_a_replaced_token_lasts_a_few_tokens_and_gives_way_to_a_rejoin():
    prompt = [90]
    pred = list(range(10, 30))
    d = _drafter(pred, prompt)
    ctx = TokenBuffer(prompt + pred[:4], capacity=64)  # 10..13 in step
    assert d.align(ctx) == (4, "prediction/start")
    ctx.extend([99])  # 14 replaced by 99, 98, 97
    assert d.align(ctx) == (5, "prediction/skip")
    ctx.extend([98])
    assert d.align(ctx) == (5, "prediction/skip")  # still after the 14 it left at
    ctx.extend([97, 15])
    assert d.align(ctx) == (6, "prediction/sync")  # the reply went on after it
    ctx.extend([50, 51, 52, 53, 54, 55, 56])  # a long insertion: the guess gives up after SKIP_SPAN tokens
    assert d.align(ctx) == (None, "")
    ctx.extend([20, 21])
    assert d.align(ctx) == (12, "prediction/2")  # and a rejoin takes over


def test_a_rejoin_takes_the_longest_match_then_the_nearest_after_the_place_left():
    #            0  1  2  3  4  5  6  7  8  9 10 11 12 13
    pred = [1, 2, 7, 5, 6, 1, 2, 8, 5, 6, 1, 2, 9, 4]
    prompt = [90]
    d = _drafter(pred, prompt)
    d.skip_span = 0  # (no guesses: the rejoin alone)
    ctx = TokenBuffer(prompt + pred[:5], capacity=64)  # in step up to position 5
    assert d.align(ctx) == (5, "prediction/start")
    ctx.extend([3])  # leaves it at 5
    assert d.align(ctx)[0] is None
    ctx.extend([1, 2])  # [1, 2] is at 0, 5 and 10: the nearest at or after 5 wins (the next is 7)
    assert d.peek(ctx, 2) == ([8, 5], "prediction/2")
    d2 = _drafter(pred, prompt)
    ctx2 = TokenBuffer(prompt + [3, 8, 5, 6, 1, 2], capacity=64)  # 5 tokens match before 12, 4 before 7
    assert d2.align(ctx2) == (12, "prediction/5")
    d3 = _drafter(pred, prompt)
    ctx3 = TokenBuffer(prompt + [3, 3] + [7, 5], capacity=64)  # nothing after the anchor 0 matched farther
    assert d3.align(ctx3) == (4, "prediction/2")


def test_offers_price_each_way_of_finding_the_place_and_are_never_carried():
    """(session 73, a mutation test of prediction.py) Each offer's key says how the place was found, with its prior:
    the reply in step (start, sync) 3:1, a guess after a replaced token (skip) 1:1, a rejoin on an n-token match
    (0.5 + 0.5 n):1; none is carried to the next request (a prediction's worth is the request's). At most the
    drafter's max_draft tokens, however many the round asks for, asked for less first and more then at one length."""
    prompt = [90]
    pred = list(range(10, 30))
    d = _drafter(pred, prompt)
    ctx = TokenBuffer(prompt + pred[:3], capacity=64)
    seen = []

    def offer(k=4):
        o = d.offer(ctx, k)
        seen.append((o.key, o.prior, o.carry))
        return o

    offer()
    ctx.extend([13])
    offer()
    ctx.extend([99])  # 14 replaced
    offer()
    d.skip_span = 0
    ctx.extend([42, 16, 17, 18])  # rejoined on three tokens
    offer()
    assert seen == [("prediction/start", (3.0, 1.0), False), ("prediction/sync", (3.0, 1.0), False),
                    ("prediction/skip", (1.0, 1.0), False), ("prediction/3", (2.0, 1.0), False)]
    assert d.peek(ctx, 2) == ([19, 20], "prediction/3")  # (less first, then more, at one length)
    assert d.peek(ctx, 5) == ([19, 20, 21, 22, 23], "prediction/3")
    short = PredictionDrafter(max_draft=3)
    short.set_prediction(pred)
    short.begin(prompt)
    assert short.peek(TokenBuffer(prompt + pred[:2], capacity=64), 8) == ([12, 13, 14], "prediction/start")


def test_a_context_cut_back_is_aligned_afresh():
    """(session 73) A context shorter than at the last alignment (cut back and grown by other tokens) is no sync
    from the old place: the old place's arithmetic claimed the new tokens matched."""
    prompt = [90]
    d = _drafter([1, 2, 3, 4, 5, 6, 7], prompt)
    ctx = TokenBuffer(prompt + [1, 2, 3, 4], capacity=64)
    assert d.align(ctx) == (4, "prediction/start")
    ctx.truncate(3)
    ctx.extend([9])  # [90, 1, 2, 9]: left the prediction at its 3
    assert d.align(ctx) == (None, "")
    ctx.truncate(3)
    assert d.align(ctx) == (2, "prediction/start")


def test_leaving_after_drafted_tokens_were_kept_guesses_and_rejoins_from_the_token_left():
    """(session 73) A round that kept some drafted tokens and then a token of its own leaves the prediction at that
    token, not where the round began: the guess resumes after the token it replaced, and a rejoin prefers a match
    at or after it (both were tested only for a reply leaving at a round's first token)."""
    #       0  1  2  3  4  5  6  7  8  9
    pred = [1, 2, 3, 4, 5, 6, 3, 4, 7, 8]
    prompt = [90]
    d = _drafter(pred, prompt)
    ctx = TokenBuffer(prompt + [1], capacity=64)
    assert d.align(ctx) == (1, "prediction/start")
    ctx.extend([2, 3, 4, 5, 6, 50])  # five drafted tokens kept, then 50 for the prediction's 3 (position 6)
    assert d.align(ctx) == (7, "prediction/skip")  # a guess: on after the 3 it replaced
    d = _drafter(pred, prompt)
    d.skip_span = 0
    assert d.align(TokenBuffer(prompt + [1], capacity=64)) == (1, "prediction/start")
    ctx = TokenBuffer(prompt + [1, 2, 3, 4, 5, 6, 50], capacity=64)
    assert d.align(ctx) == (None, "")
    ctx.extend([3, 4])  # [3, 4] ends at 4 and at 8: the one at or after the place left (6)
    assert d.peek(ctx, 2) == ([7, 8], "prediction/2")
    #        0  1  2  3  4  5  6  7  8  9 10
    pred2 = [1, 2, 3, 4, 5, 6, 7, 8, 3, 4, 9]
    d = _drafter(pred2, prompt)
    d.skip_span = 0
    assert d.align(TokenBuffer(prompt + [1], capacity=64)) == (1, "prediction/start")
    ctx = TokenBuffer(prompt + [1, 2, 3, 4, 50], capacity=64)  # 50 for the 5 at 4
    assert d.align(ctx) == (None, "")
    ctx.extend([3, 4])  # ends at 4 (the place left itself: the 5 drafted again) and at 10
    assert d.peek(ctx, 2) == ([5, 6], "prediction/2")
    #        0  1  2  3  4  5  6  7  8  9 10
    pred3 = [3, 4, 7, 3, 4, 8, 1, 2, 5, 6, 9]
    d = _drafter(pred3, prompt)
    d.skip_span = 0
    ctx = TokenBuffer(prompt + pred3[:8], capacity=64)
    assert d.align(ctx) == (8, "prediction/start")
    ctx.extend([50])  # left at 8
    assert d.align(ctx) == (None, "")
    ctx.extend([3, 4])  # ends at 2 and 5, both before the place left: the nearest before it
    assert d.peek(ctx, 2) == ([8, 1], "prediction/2")
    d.begin(prompt)  # a new generation: no place left yet, the first match after the prediction's start
    assert d.peek(TokenBuffer(prompt + [50, 3, 4], capacity=64), 2) == ([7, 3], "prediction/2")


def test_a_guess_lasts_skip_span_tokens_and_takes_the_longest_resumption():
    """(session 73) The guess after a replaced token holds while the reply has written at most SKIP_SPAN tokens
    since it left, and where the reply's new tokens end with the prediction's after the token replaced, it resumes
    after the longest such run (a repeated token: the shortest put it one back)."""
    from edgespec.prediction import SKIP_SPAN

    prompt = [90]
    pred = list(range(10, 30))
    d = _drafter(pred, prompt)
    ctx = TokenBuffer(prompt + pred[:4], capacity=64)
    assert d.align(ctx) == (4, "prediction/start")
    ctx.extend([99])  # 14 replaced: the reply's token at context position 5
    for written in range(1, SKIP_SPAN + 1):
        assert d.align(ctx) == (5, "prediction/skip"), written
        ctx.extend([60 + written])
    assert len(ctx) - 5 == SKIP_SPAN + 1 and d.align(ctx) == (None, "")
    #       0   1   2   3  4  5   6   7
    pred = [10, 11, 12, 20, 5, 5, 13, 14]
    d = _drafter(pred, prompt)
    ctx = TokenBuffer(prompt + [10, 11, 12], capacity=64)
    assert d.align(ctx) == (3, "prediction/start")
    ctx.extend([99])  # 20 replaced
    assert d.align(ctx) == (4, "prediction/skip")
    ctx.extend([98, 5, 5])
    assert d.peek(ctx, 2) == ([13, 14], "prediction/sync")


def test_a_rejoins_match_is_the_run_of_tokens_that_end_the_context():
    """(session 73) A rejoin's match length counts the tokens matching back from the context's end up to the first
    that does not: a token matching farther back does not make a match longer (the nearer one wins)."""
    #       0   1   2   3   4   5   6   7   8   9
    pred = [30, 31, 40, 41, 32, 50, 33, 40, 41, 34]
    prompt = [90]
    d = _drafter(pred, prompt)
    d.skip_span = 0
    ctx = TokenBuffer(prompt + [50, 60, 40, 41], capacity=64)  # [40, 41] ends at 4 and 9; 50 matches at 5, 60 not
    assert d.align(ctx) == (4, "prediction/2")


def test_the_places_at_the_predictions_end_and_past_it():
    """(session 100, a second mutation test of prediction.py) A reply that is the whole prediction is at its end
    (nothing to draft), not rejoined at an earlier copy of its last tokens (PD15); a reply that ran past the end left
    it there, so a rejoin prefers the match nearest before the end, not the nearest after where it last was (PD13);
    a rejoin's match is counted up to MAX_MATCH tokens (PD21, PD22); a place left before the reply came back to the
    prediction's head is forgotten (PD16); a new prediction forgets the old one's place (PD31)."""
    from edgespec.prediction import MAX_MATCH

    prompt = [90]
    d = _drafter([1, 2, 3, 1, 2], prompt)
    ctx = TokenBuffer(prompt + [1, 2, 3, 1, 2], capacity=64)
    assert d.align(ctx) == (5, "prediction/start") and d.offer(ctx, 4) is None
    #       0  1  2  3  4  5  6  7  8  9
    pred = [1, 2, 3, 7, 8, 4, 5, 7, 8, 6]
    d = _drafter(pred, prompt)
    d.skip_span = 0
    ctx = TokenBuffer(prompt + [1], capacity=64)
    assert d.align(ctx) == (1, "prediction/start")
    ctx.extend(pred[1:] + [7, 8])  # the whole prediction, then [7, 8]: at 3 and at 7, both before its end
    assert d.align(ctx) == (9, "prediction/2")
    pred = list(range(10, 30))
    d = _drafter(pred, prompt)
    ctx = TokenBuffer(prompt + [99] + pred[3:3 + MAX_MATCH + 2], capacity=64)
    assert d.align(ctx) == (3 + MAX_MATCH + 2, f"prediction/{MAX_MATCH}")
    d = _drafter([1, 2, 3, 4, 5, 6, 7], prompt)
    ctx = TokenBuffer(prompt + [1, 2, 3], capacity=64)
    assert d.align(ctx) == (3, "prediction/start")
    ctx.extend([9])
    assert d.align(ctx) == (4, "prediction/skip")  # (left at its 4)
    ctx.truncate(2)
    assert d.align(ctx) == (1, "prediction/start")
    ctx.truncate(1)  # (the prompt alone: no place, and no guess from the place left before)
    assert d.align(ctx) == (None, "")
    ctx = TokenBuffer(prompt + [1], capacity=64)
    assert d.peek(ctx, 3) == ([2, 3, 4], "prediction/start")
    d.set_prediction([5, 1, 8, 8])  # (at the same context length: the new prediction's place, which it has not)
    assert d.peek(ctx, 3) == ([], "")


def test_no_prediction_offers_nothing_and_a_new_generation_forgets_the_last_one():
    d = _drafter([], [1])
    ctx = TokenBuffer([1, 2, 3], capacity=16)
    assert d.offer(ctx, 4) is None
    d.set_prediction([2, 3, 4])
    d.begin([1])
    assert d.peek(ctx, 4) == ([4], "prediction/start")
    d.reset()
    assert d.offer(ctx, 4) is None


def _prediction_cases():
    """(seed, prompt, max_new, eos, prediction) with predictions that follow the reply, with edits, or not at all."""
    for seed in range(10):
        rng = np.random.default_rng(seed)
        prompt = rng.integers(0, 8, size=int(rng.integers(1, 12))).tolist()
        max_new = int(rng.integers(8, 60))
        eos = (int(rng.integers(0, 8)),) if seed % 4 == 0 else ()
        yield seed, prompt, max_new, eos, rng


@pytest.mark.parametrize("drafter", ["prediction", "auto", "model", "prompt-lookup"])
@pytest.mark.parametrize("min_width", [1, 2])
def test_greedy_output_does_not_depend_on_the_prediction(drafter, min_width):
    """Whichever drafter is asked for, the prediction drafts beside it (``used``), and the output is plain decoding's."""
    used = 0
    for seed, prompt, max_new, eos, rng in _prediction_cases():
        ref, ref_reason = run(make(seed=seed, eos=eos, min_width=min_width), prompt, max_new_tokens=max_new,
                              drafter="none")
        edited = list(ref)
        for _ in range(3):  # replace, insert, delete
            i = int(rng.integers(0, len(edited) + 1))
            op = seed % 3
            if op == 0 and i < len(edited):
                edited[i] = int(rng.integers(0, 8))
            elif op == 1:
                edited.insert(i, int(rng.integers(0, 8)))
            elif edited:
                del edited[min(i, len(edited) - 1)]
        for pred in (ref, edited, ref[5:], rng.integers(0, 8, size=40).tolist(), []):
            if not pred and drafter == "prediction":
                continue  # refused: tested below
            st = Stats()
            got, reason = run(make(seed=seed, eos=eos, min_width=min_width), prompt, stats=st,
                              max_new_tokens=max_new, drafter=drafter, prediction=pred)
            assert got == ref and reason == ref_reason, (seed, drafter, pred)
            used += st.accepted_by_drafter.get("prediction", 0)
    assert used > 0  # the prediction drafted, beside whichever drafter was asked for


def _simulated(seed, max_context=512):
    """``make``'s decoder (the same models and drafters) on simulated time: a memory-bound target (4 ms a call +
    0.5 ms a token), a drafter step 1.5 ms. For assertions on the draft lengths the round policy picks: on the
    wall clock the fake models' microsecond calls let a stall, or a cold process's first wide call, pick them
    (the first test below failed 5 runs in 6, run alone on a loaded 2-core VM: its first 5-wide call, ~50 us
    against ~10 us for one token, priced every draft but one token out)."""
    clock = SimClock()
    target = FakeLM(8, max_context, seed=seed, delay=(0.004, 0.0005), clock=clock)
    dtable = target.table + 0.5 * np.random.default_rng(seed + 100).normal(size=target.table.shape)
    draft_lm = FakeLM(8, max_context, table=dtable, delay=(0.0015, 0.0), clock=clock)
    return Decoder(target, (), drafters=[ModelDrafter(draft_lm, 8, clock=clock), PromptLookupDrafter(),
                                         suffix_drafter(8, seed)], clock=clock)


def test_a_prediction_is_not_used_by_plain_decoding_and_does_not_outlive_its_request():
    dec = _simulated(seed=1)  # (simulated time: the target calls counted below follow the draft lengths)
    ref, _ = run(dec, [1, 2, 3], max_new_tokens=30, drafter="none")
    st = Stats()
    run(dec, [1, 2, 3], stats=st, max_new_tokens=30, drafter="none", prediction=ref)
    assert st.rounds_by_drafter == {"none": 29}
    st = Stats()
    run(dec, [1, 2, 3], stats=st, max_new_tokens=30, drafter="prediction", prediction=ref)
    assert st.accepted_by_drafter["prediction"] >= 15 and st.target_calls < 15  # plain decoding: 29
    st = Stats()
    run(dec, [1, 2, 3], stats=st, max_new_tokens=30, drafter="auto")
    assert "prediction" not in st.rounds_by_drafter


def test_a_perfect_prediction_needs_few_target_calls():
    from tiny import SimClock

    # simulated time (a memory-bound target: 4 ms a call + 0.5 ms a token; a drafter step 1.5 ms): on the wall
    # clock the fake models' microsecond calls let a stall or a slow minute decide the policy (it failed about
    # half the time on session 32's loaded VM, session 31's code too)
    clock = SimClock()
    target = FakeLM(8, 1024, seed=2, delay=(0.004, 0.0005), clock=clock)
    dtable = target.table + 0.5 * np.random.default_rng(102).normal(size=target.table.shape)
    dec = Decoder(target, (), drafters=[ModelDrafter(FakeLM(8, 1024, table=dtable, delay=(0.0015, 0.0), clock=clock),
                                                     8, clock=clock), PromptLookupDrafter()],
                  clock=clock)
    ref, _ = run(dec, [4, 5], max_new_tokens=200, drafter="none")
    st = Stats()
    got, _ = run(dec, [4, 5], stats=st, max_new_tokens=200, drafter="auto", prediction=ref)
    assert got == ref
    assert st.tokens_per_target_call > 4, st.to_dict()


def _sampled_counts(sp, runs, pred, drafter="prediction", k=2):
    vocab, n_tokens, prompt = 4, 3, [1, 2, 1, 2, 1]

    def work(seeds):
        target = FakeLM(vocab, seed=7, sharpness=1.0, reuse_buffer=True)
        dl = FakeLM(vocab, table=target.table + np.random.default_rng(3).normal(0, 1.0, target.table.shape),
                    reuse_buffer=True)
        dec = Decoder(target, (), drafters=[ModelDrafter(dl, vocab), PromptLookupDrafter()])
        counts: dict = {}
        for i in seeds:
            out, _ = run(dec, prompt, max_new_tokens=n_tokens, temperature=sp.temperature, top_k=sp.top_k,
                         top_p=sp.top_p, seed=i, drafter=drafter, draft_tokens=k, prediction=pred)
            counts[tuple(out)] = counts.get(tuple(out), 0) + 1
        return counts

    counts = split_runs(work, runs)
    exact = _exact_sequence_probs(FakeLM(vocab, seed=7, sharpness=1.0), prompt, n_tokens, sp)
    return _chi2(counts, exact, runs)


# the likeliest sequences' tokens, so that the prediction is drafted and often accepted
PRED = [0, 1, 2, 3, 0, 1]


@pytest.mark.parametrize("drafter, sp", [("prediction", SamplingParams(1.0)), ("auto", SamplingParams(0.7, top_k=3)),
                                         ("model", SamplingParams(1.3, top_p=0.8))])
def test_sampled_output_follows_the_target_with_a_prediction(drafter, sp):
    stat, df = _sampled_counts(sp, 6000, PRED, drafter)
    assert stat < _chi2_crit(df), f"chi2 {stat:.1f} with {df} dof"


def test_the_statistical_test_catches_a_prediction_accepted_without_the_rejection_rule(monkeypatch):
    """Plant a bug a point-mass draft invites: keep a predicted token whenever the target gives it a
    fair chance (p >= 0.2) instead of with probability p. The same test must fail."""
    real = verify_mod.rejection_sample

    def buggy(draft, draft_probs, target_logits, sp_, rng):
        if draft_probs is None and draft:
            n = 0
            while n < len(draft) and probs(target_logits[n][None], sp_)[0][draft[n]] >= 0.2:
                n += 1
            if n:
                tail_n, tok = real(draft[n:], None, target_logits[n:], sp_, rng)
                return n + tail_n, tok
        return real(draft, draft_probs, target_logits, sp_, rng)

    monkeypatch.setattr("edgespec.decoder.rejection_sample", buggy)
    stat, df = _sampled_counts(SamplingParams(1.0), 6000, PRED)
    assert stat > _chi2_crit(df), f"the planted bug went unnoticed (chi2 {stat:.1f}, {df} dof)"


@pytest.mark.parametrize("bad, match", [
    ("text", "sequence of token ids"), ([1, "2"], "sequence of token ids"), ([1, True], "sequence of token ids"),
    (5, "sequence of token ids"), ([1.0], "sequence of token ids"),
])
def test_a_prediction_of_the_wrong_kind_is_a_config_error(bad, match):
    with pytest.raises(ConfigError, match=match):
        GenerationConfig(prediction=bad)


def test_a_prediction_outside_the_vocabulary_is_refused_before_anything_runs():
    dec = make(vocab=8)
    with pytest.raises(ConfigError, match="token id 8, outside the vocabulary"):
        run(dec, [1, 2], max_new_tokens=4, prediction=[1, 8])
    with pytest.raises(ConfigError, match="token id -1"):
        run(dec, [1, 2], max_new_tokens=4, prediction=np.array([-1, 2]))
    assert run(dec, [1, 2], max_new_tokens=4, prediction=np.array([1, 2], dtype=np.int32))[0]


def test_the_engine_takes_a_prediction_as_text(tiny_bundle):
    import edgespec

    eng = edgespec.load(tiny_bundle, memory=False)  # (with memory the suffix drafter recalls the reply as well)
    ref = eng.generate("def hello(world):", max_new_tokens=24, drafter="none")
    got = eng.generate("def hello(world):", max_new_tokens=24, prediction=ref.text)
    assert got.token_ids == ref.token_ids
    assert got.stats["accepted_by_drafter"].get("prediction", 0) > 0, got.stats
    # special-token text in a prediction is text (never a control token), and changes nothing
    odd = eng.generate("def hello(world):", max_new_tokens=24, prediction="<|im_end|>" + ref.text)
    assert odd.token_ids == ref.token_ids
    with pytest.raises(ConfigError, match="prediction must be a string|the prediction"):
        eng.generate("hi", max_new_tokens=2, prediction="\ud800")
    eng.close()


def test_cli_generate_with_a_prediction_file(tiny_bundle, tmp_path):
    base = ["generate", str(tiny_bundle), "-p", "def hello(world):", "--max-new-tokens", "20", "--json"]
    ref = CliRunner().invoke(main, base + ["--drafter", "none"])
    assert ref.exit_code == 0, ref.output
    ref = json.loads(ref.output)
    f = tmp_path / "pred.txt"
    f.write_text(ref["text"])
    got = CliRunner().invoke(main, base + ["--prediction", str(f), "--drafter", "prediction"])
    assert got.exit_code == 0, got.output
    got = json.loads(got.output)
    assert got["token_ids"] == ref["token_ids"] and got["stats"]["accepted_by_drafter"].get("prediction", 0) > 0
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\x00\x01")
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\xe9".encode("latin-1"))
    for path, msg in ((tmp_path / "none.txt", "no such prediction file"), (binary, "a prediction file must be text"),
                      (latin, "not UTF-8 text")):
        r = CliRunner().invoke(main, base + ["--prediction", str(path)])
        lines = [line for line in r.output.strip().splitlines() if line]
        assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], r.output
    # (session 53, a review) --drafter prediction without a prediction: refused before the model loads; chat and
    # serve have no prediction to draft from, and do not offer it
    r = CliRunner().invoke(main, ["generate", str(tmp_path / "no-bundle"), "-p", "x", "--drafter", "prediction"])
    assert r.exit_code == 2 and "give it with --prediction FILE" in r.output, r.output
    for cmd in ("chat", "serve"):
        r = CliRunner().invoke(main, [cmd, str(tiny_bundle), "--drafter", "prediction"])
        assert r.exit_code != 0 and "'prediction' is not one of" in r.output, r.output


def test_a_predictions_acceptance_is_learned_per_request_and_it_is_considered_first():
    """What an edit's near-perfect prediction taught must not draft 16-30 tokens at a time into the next
    request's prediction (a regenerated answer the reply soon leaves); and where offers price the same,
    the prediction (by position) wins over the n-gram drafters."""
    from edgespec.drafters import Offer

    # simulated time: the learned estimate checked last needs drafts of two tokens or more (from one-token rounds
    # it stays below what relaxes to 0.9), and on the wall clock a stall could cut them to one
    dec = _simulated(seed=2, max_context=1024)
    ref, _ = run(dec, [4, 5], max_new_tokens=120, drafter="none")
    run(dec, [4, 5], max_new_tokens=120, drafter="auto", prediction=ref)
    pol = dec.policy
    assert pol.learned["prediction/sync"].alpha > 0.9  # it was learned ...
    pol.begin("auto", dec.drafters, 1, also=("prediction",))
    assert pol._want[0].name == "prediction"
    fresh = pol.estimate(Offer("prediction/sync", 8, prior=(3.0, 1.0), carry=False))
    assert fresh.alpha == pytest.approx(0.75)  # ... and not carried into the next request
    pol.begin("auto", dec.drafters, 1)
    assert pol.estimate(Offer("prediction/sync", 8, prior=(3.0, 1.0))).alpha > 0.9  # (a carried key would be)
    assert [d.name for d in pol._want][-1] == "prediction"  # no prediction: in the registry's order


def test_the_usage_counts_walk_the_reply_through_the_prediction():
    pred = list(range(10, 30))
    assert prediction_usage(pred, pred) == (20, 0)
    assert prediction_usage(pred, pred[:8]) == (8, 12)  # a reply cut short
    assert prediction_usage(pred, pred[:5] + [99, 98] + pred[7:]) == (18, 2)  # two tokens replaced
    assert prediction_usage(pred, pred[:5] + [99] + pred[5:]) == (20, 0)  # one inserted
    assert prediction_usage(pred, pred[:5] + pred[9:]) == (16, 4)  # four deleted
    assert prediction_usage(pred, [1, 2, 3]) == (0, 20)
    assert prediction_usage([], [1, 2]) == (0, 0)
    # (session 73, a mutation test) a prediction token the walk used is not matched again: the reply token offered it
    # stays free for the rejoin after (a deleted token: six of seven used, not five)
    assert prediction_usage([3, 0, 3, 1, 0, 1, 0], [3, 0, 3, 0, 1, 0, 1, 2]) == (6, 1)
    got = prediction_usage(pred * 2, pred)  # never more than the reply's tokens
    assert got == (20, 20)


def test_a_prediction_drafter_needs_a_prediction_and_a_prediction_must_fit_the_context():
    with pytest.raises(ConfigError, match="needs a prediction"):
        GenerationConfig(drafter="prediction")
    dec = make(vocab=8, max_context=64)
    with pytest.raises(ConfigError, match="the prediction has 65 tokens; a reply can have at most 64"):
        run(dec, [1, 2], max_new_tokens=4, prediction=[1] * 65)


def test_the_bench_and_the_repl_refuse_the_prediction_drafter_they_have_no_prediction_for(tiny_bundle):
    import io

    import edgespec
    from edgespec.bench import parse_drafters
    from edgespec.chat import ChatRepl

    with pytest.raises(ConfigError, match="bench_prediction.py"):
        parse_drafters(["auto", "prediction"])
    repl = ChatRepl(edgespec.load(tiny_bundle, memory=False), stdin=io.StringIO(), stdout=io.StringIO(),
                    stderr=io.StringIO())
    with pytest.raises(ConfigError, match="prediction drafts from a request's predicted output"):
        repl._check_drafter("prediction")
    repl._check_drafter("suffix")  # (taken)
    assert "prediction" not in repl._drafter_names()
