"""Gaps a second mutation test of ``edgespec/decoder.py`` found (docs/bench/mutation_harness/decoder_mut.py, DC1-DC92):
``GenerationConfig``'s bounds taken at their edge (one past each: cases of ``test_penalties.py``'s
``test_bad_penalties_and_options_are_refused``) and the forms of its sequences it converts; ``Stats``' derived figures
and ``target_run_s``; the decoder's drafters, its refusals at their edges, a lazy grammar told the prompt, alternates
near the end of the window, a round cut short, a drafter's MemoryError at a generation's end; a forked child's list
of native work. No model: configs and ``Stats`` on their own, the decoder on ``tiny``'s scripted targets."""
from __future__ import annotations

import numpy as np
import pytest

from edgespec.decoder import MAX_HEAL, MAX_LOGPROBS, MIN_REPETITION_PENALTY, Decoder, GenerationConfig, Stats
from edgespec.drafters import PromptLookupDrafter
from edgespec.errors import ConfigError, ContextOverflowError
from edgespec.prediction import MAX_PREDICTION
from edgespec.profiles import MAX_DRAFT
from test_decoder import _alt_decoder, _everywhere, make, run, suffix_drafter
from tiny import AltFakeLM, FakeLM, SimClock


@pytest.mark.parametrize("kw", [
    dict(seed=2**63 - 1), dict(logprobs=MAX_LOGPROBS), dict(draft_tokens=0), dict(draft_tokens=MAX_DRAFT),
    dict(max_draft_tokens=MAX_DRAFT), dict(prediction=(1,) * MAX_PREDICTION), dict(heal=b"x" * MAX_HEAL),
    dict(repetition_penalty=MIN_REPETITION_PENALTY), dict(repetition_penalty=10.0), dict(presence_penalty=2.0),
    dict(frequency_penalty=-2.0), dict(logit_bias={3: 100.0, 4: -100.0}),
])
def test_generation_config_takes_each_bound_at_its_edge(kw):
    """DC4-DC6, DC9, DC19: each bound's last value is taken (an off-by-one refused it); one past each is refused in
    ``test_penalties.py``'s ``test_bad_penalties_and_options_are_refused``."""
    GenerationConfig(**kw)


def test_generation_config_takes_the_forms_users_pass():
    """DC10, DC11, DC18, DC24: numpy arrays and sets of stop ids, a dict of biases; a zero bias is left out (it
    would turn the greedy fast path off for nothing), a repetition penalty alone makes the config penalized."""
    assert GenerationConfig(stop_token_ids=np.array([5, 2])).stop_token_ids == (5, 2)
    assert GenerationConfig(stop_token_ids={7}).stop_token_ids == (7,)
    assert GenerationConfig(logit_bias={4: -1, 2: 0.5}).logit_bias == ((2, 0.5), (4, -1.0))
    zero = GenerationConfig(logit_bias={3: 0.0, 5: -0.0})
    assert zero.logit_bias == () and not zero.penalized
    assert GenerationConfig(repetition_penalty=1.1).penalized
    assert not GenerationConfig().penalized


def test_stats_figures_are_of_the_decode_after_the_first_token():
    """DC29-DC33: tokens/s counts the tokens after the first over the time after prefill; the accepted length is
    per round (rounds that drafted), not per target call; a position nothing was drafted at has no rate; the
    prompt's ids for the detokenizer are not part of the figures."""
    st = Stats(new_tokens=11, total_s=3.0, prefill_ms=1000.0, rounds=4, target_calls=8, accepted=6, drafted=10,
               accepted_by_position=[3, 0], drafted_by_position=[4, 0], text_context=(1, 2))
    assert st.decode_s == pytest.approx(2.0) and st.tokens_per_second == pytest.approx(5.0)
    assert st.mean_accepted_length == pytest.approx(1.5)
    d = st.to_dict()
    assert d["acceptance_by_position"] == [0.75, None] and "text_context" not in d
    assert d["mean_accepted_length"] == 1.5 and d["tokens_per_second"] == 5.0


def test_a_decoder_keeps_a_drafter_outside_the_registry_and_turns_alternates_on_where_rows_are_cheap():
    """DC45, DC47: the drafters are put in the registry's order (``auto``'s), and one the registry does not name (a
    user's own class) is kept after them, not dropped; alternates are verified only where the target says its extra
    verify rows are cheap (edgespec's AVX-512 paths), not on every target that can verify them."""
    class Mine(PromptLookupDrafter):
        name = "mine"

    d = Decoder(AltFakeLM(8, 64), drafters=[Mine(), suffix_drafter(8, 0), PromptLookupDrafter()])
    assert list(d.drafters) == ["prompt-lookup", "suffix", "mine", "prediction"]
    assert d.policy.use_alternates
    costly = AltFakeLM(8, 64)
    costly.cheap_rows = False
    assert costly.verifies_alternates and not Decoder(costly).policy.use_alternates


def test_the_decoders_refusals_at_their_edges():
    """DC51, DC57-DC60: what generate() refuses before anything runs, at each edge: the vocabulary's size as an id (of
    a bias, a prediction), a prompt that fills the window (no room for a new token; one short of it is
    taken), a prediction longer than the window, a grammar on an engine with no tokenizer to compile it."""
    dec = make(vocab=8, max_context=16)
    for kw in (dict(logit_bias={8: 1.0}), dict(prediction=(8,))):
        with pytest.raises(ConfigError, match="token id 8, outside the vocabulary"):
            dec.generate([1], GenerationConfig(**kw))
    with pytest.raises(ContextOverflowError, match="the prompt has 16 tokens; the context holds 16"):
        dec.generate([1] * 16)
    with pytest.raises(ConfigError, match="the prediction has 17 tokens"):
        dec.generate([1], GenerationConfig(prediction=(1,) * 17))
    with pytest.raises(ConfigError, match="no tokenizer for structured outputs"):
        dec.generate([1], GenerationConfig(grammar="start: /a/"))
    steps = list(dec.generate([1] * 15, GenerationConfig(logit_bias={7: 1.0}, prediction=(7,) * 16)))
    assert [(len(s.tokens), s.finish_reason) for s in steps] == [(1, "context")]


def test_a_generations_run_time_is_its_own_and_a_drafter_out_of_memory_at_its_end_is_a_warning():
    """DC87, DC64: ``target_run_s`` is the target's time in its runs after the first token, this generation's only
    (plain decoding: all of its decode time on a simulated clock), not the engine's since load; a drafter that runs
    out of memory keeping a generation (the suffix drafter's store) warns, and the reply is kept."""
    class Timed(FakeLM):
        def _run(self, ids, past):
            t = self.clock.t
            out = super()._run(ids, past)
            self.run_seconds += self.clock.t - t
            return out

    class Full(PromptLookupDrafter):
        def end(self):
            raise MemoryError("no room left")

    clock = SimClock()
    dec = Decoder(Timed(8, 64, delay=(0.01, 0.001), clock=clock), drafters=[Full()], clock=clock)
    for _ in range(2):
        st = Stats()
        with pytest.warns(UserWarning, match="the prompt-lookup drafter could not keep this generation: no room left"):
            out = [t for s in dec.generate([1, 2, 3], GenerationConfig(max_new_tokens=6, drafter="none"), st)
                   for t in s.tokens]
        assert len(out) == 6 and st.target_run_s == pytest.approx(st.decode_s) and st.decode_s == pytest.approx(0.055)


def test_alternates_stop_at_the_window(monkeypatch):
    """DC81: a round near the end of the window verifies only the alternates its room holds after the draft (an
    alternate beside every draft token, as many as fit): the output is plain greedy decoding's up to the full window,
    where a room counted without the draft put alternates past it."""
    _everywhere(monkeypatch)
    for seed in range(4):
        dec = _alt_decoder(seed, max_context=24)
        ref = run(dec, [1, 2, 3, 1, 2], max_new_tokens=40, drafter="none")
        st = Stats()
        assert run(dec, [1, 2, 3, 1, 2], st, max_new_tokens=40, drafter="model", draft_tokens=4) == ref
        assert ref[1] == "context" and st.alternates > 0


def test_a_lazy_grammar_is_told_the_prompt():
    """DC61: a lazy grammar (a tool call's, on a thinking model) learns from the prompt whether the reply starts inside
    a thinking block the template opened. (DC42, the lock's orphan test, is a line of ``test_prompt_cache.py``'s
    ``test_the_generation_lock_is_taken_at_exit_only_if_free``.)"""
    from edgespec.constrain import _THINKING, LazyConstraint

    THINK, END = 1, 2
    dec = make(vocab=12)
    dec.constraints = lambda grammar: LazyConstraint(object, 5, 12, eos=(9,), think=(THINK, END))
    assert dec.prepare([3, THINK], GenerationConfig(grammar="lazy"))[2].m is _THINKING
    assert dec.prepare([3], GenerationConfig(grammar="lazy"))[2].m is not _THINKING


def test_a_forked_child_forgets_the_parents_native_work_in_progress():
    """DC43: a child forked while a thread of the parent ran a model's call (listed in ``lm._RUNNING``) starts with
    none listed: its exit waited for that call, which never ends in the child, for ``EXIT_WAIT_S`` (10 s)."""
    import os

    from edgespec import lm

    if not hasattr(os, "fork"):
        pytest.skip("no fork here")

    class Owner:
        pass

    owner = Owner()
    lm._RUNNING.add(owner)
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0 if len(lm._RUNNING) == 0 else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        lm._RUNNING.discard(owner)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_round_cut_short_after_its_verify_call_leaves_the_target_as_the_round_found_it(monkeypatch):
    """DC86: an interrupt (Ctrl-C) between a round's verify call and its rewinds: the target is put back to what it
    held when the round began (the prompt and the reply but its last token), not left holding the draft's rows and
    its alternates' (computed beside the draft's positions and listed after them: a later prompt reaching those slots
    read them as its own)."""
    import edgespec.decoder as decoder_mod

    _everywhere(monkeypatch)
    dec = _alt_decoder(3)
    target = dec.target
    real, calls, held = decoder_mod.greedy_accept_choice, [], []

    def cut(draft, top):
        calls.append(len(draft))
        if len(calls) == 3:
            held.append(target.length)
            raise KeyboardInterrupt
        return real(draft, top)

    monkeypatch.setattr(decoder_mod, "greedy_accept_choice", cut)
    prompt, out = [1, 2, 3, 1, 2], []
    with pytest.raises(KeyboardInterrupt):
        for s in dec.generate(prompt, GenerationConfig(max_new_tokens=40, drafter="model", draft_tokens=4)):
            out += s.tokens
    assert calls[-1] == 4 and held[0] > len(prompt) + len(out) + 4  # (the draft and its alternates were written)
    assert target.tokens == prompt + out[:-1]


def test_rounds_that_drafted_nothing_are_the_none_drafters():
    """DC88, DC90: a round whose draft is empty (plain decoding, or a draft a grammar forbade from its first token)
    counts in ``rounds_by_drafter`` as "none" and in no drafter's figures: ``rounds`` are the rounds that drafted."""
    class NothingDrafted:  # (a grammar that allows every token but no draft token: each draft is cut to nothing)
        def masks(self, tokens):
            return np.ones((len(tokens) + 1, 8), dtype=bool), 0

        def consume(self, tokens):
            pass

    for kw in (dict(drafter="none"), dict(drafter="prompt-lookup", draft_tokens=3, grammar="nothing drafted")):
        dec = make(seed=5)
        dec.constraints = lambda grammar: NothingDrafted()
        st = Stats()
        out, _ = run(dec, [1, 2, 3, 4, 5, 6, 7, 1, 2, 3], st, max_new_tokens=30, **kw)
        assert len(out) == 30 and st.rounds_by_drafter == {"none": 29} and st.target_calls == 30, (kw, st)
        assert st.rounds == st.drafted == 0 and st.drafted_by_drafter == {} and st.mean_accepted_length == 0
