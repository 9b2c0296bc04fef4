"""The speculative loop on scripted fake models: exactness under greedy, distribution under sampling."""
from __future__ import annotations

import collections
import itertools
import math

import numpy as np
import pytest

from edgespec import verify as verify_mod
from edgespec.decoder import Decoder, GenerationConfig, Stats
from edgespec.drafters import ModelDrafter, Offer, PromptLookupDrafter
from edgespec.errors import ConfigError
from edgespec.memory import MemoryStore
from edgespec.suffix import SuffixDrafter
from edgespec.policy import NO_DRAFT, CostModel, RoundPolicy
from edgespec.sampling import SamplingParams, distribution, probs
from tiny import AltFakeLM, FakeLM, SimClock, numpy_exp_is_libms, split_runs


def run(decoder, prompt, stats=None, **kw):
    out, reasons = [], []
    for step in decoder.generate(prompt, GenerationConfig(**kw), stats):
        out.extend(step.tokens)
        reasons.append(step.finish_reason)
    return out, reasons[-1]


def make(vocab=8, seed=0, drafter_noise=0.5, max_context=512, eos=(), min_width=1):
    target = FakeLM(vocab, max_context, seed=seed, min_width=min_width)
    rng = np.random.default_rng(seed + 100)
    dtable = target.table + drafter_noise * rng.normal(size=target.table.shape)
    draft_lm = FakeLM(vocab, max_context, table=dtable)
    return Decoder(target, eos, drafters=[ModelDrafter(draft_lm, vocab), PromptLookupDrafter(),
                                          suffix_drafter(vocab, seed)])


def suffix_drafter(vocab, seed, cls=SuffixDrafter):
    """A suffix drafter whose memory and documents hold random sequences (they match often in a
    small vocabulary, so drafts come from every source)."""
    rng = np.random.default_rng(seed + 200)
    d = cls(MemoryStore(None, "test", vocab, cap_tokens=200))
    for _ in range(4):
        d.memory.add(rng.integers(0, vocab, size=60))
    d.add_documents([rng.integers(0, vocab, size=80)])
    return d


@pytest.mark.parametrize("min_width", [1, 2])
@pytest.mark.parametrize("drafter", ["model", "prompt-lookup", "suffix", "auto"])
@pytest.mark.parametrize("k", [None, 1, 3, 6])
def test_greedy_speculative_equals_autoregressive(drafter, k, min_width):
    for seed in range(12):
        rng = np.random.default_rng(seed)
        prompt = rng.integers(0, 8, size=int(rng.integers(1, 20))).tolist()
        max_new = int(rng.integers(1, 60))
        eos = (int(rng.integers(0, 8)),) if seed % 3 == 0 else ()
        ref, ref_reason = run(make(seed=seed, eos=eos, min_width=min_width), prompt, max_new_tokens=max_new,
                              drafter="none")
        got, reason = run(make(seed=seed, eos=eos, min_width=min_width), prompt, max_new_tokens=max_new,
                          drafter=drafter, draft_tokens=k)
        assert got == ref and reason == ref_reason, (seed, drafter, k)
        assert len(got) <= max_new


def _pair_kernel_decoder(seed, policy):
    target = FakeLM(8, seed=seed, min_width=policy[0], width_multiple=policy[1], odd_row_noise=3.0)
    dtable = target.table + 0.5 * np.random.default_rng(seed + 100).normal(size=target.table.shape)
    return Decoder(target, (), drafters=[ModelDrafter(FakeLM(8, table=dtable), 8), PromptLookupDrafter(),
                                         suffix_drafter(8, seed)])


def test_a_kernel_computing_rows_in_pairs_needs_even_widths():
    """The odd last row of a call takes another path (MatMulNBits at block 128 on AVX-512): under
    "at least two tokens" speculative output drifts from autoregressive output; under "an even
    number of tokens" (width_multiple 2) it equals it, every drafter, fixed and adaptive k."""
    drift = 0
    for seed in range(8):
        rng = np.random.default_rng(seed)
        prompt = rng.integers(0, 8, size=int(rng.integers(1, 20))).tolist()
        for drafter, k in (("model", 2), ("prompt-lookup", 3), ("auto", None), ("model", None)):
            ref, _ = run(_pair_kernel_decoder(seed, (2, 2)), prompt, max_new_tokens=40, drafter="none")
            got, _ = run(_pair_kernel_decoder(seed, (2, 2)), prompt, max_new_tokens=40, drafter=drafter,
                         draft_tokens=k)
            assert got == ref, (seed, drafter, k)
            ref1, _ = run(_pair_kernel_decoder(seed, (2, 1)), prompt, max_new_tokens=40, drafter="none")
            got1, _ = run(_pair_kernel_decoder(seed, (2, 1)), prompt, max_new_tokens=40, drafter=drafter,
                          draft_tokens=k)
            drift += got1 != ref1
    assert drift >= 4  # the fake kernel's odd rows do matter: the wrong policy is caught


def test_the_decoder_verifies_no_wider_than_the_probe_checked():
    """A target whose calls of more than 5 tokens compute every row otherwise (a GPU kernel that
    changes with the rows): bounded at the width the probe verified, speculative output equals
    autoregressive output with long drafts asked for; unbounded, long prompt-lookup drafts drift."""
    drift, widest = 0, 0
    for seed in range(20):
        prompt = (np.random.default_rng(seed).integers(0, 8, size=12).tolist()) * 3  # long lookups
        for verified in (5, None):
            def dec():
                d = make(seed=seed)
                d.target.wide_above, d.target.verified_width = 5, verified
                return d
            ref, _ = run(dec(), prompt, max_new_tokens=40, drafter="none")
            d = dec()
            widths = []
            orig = d.target._run
            d.target._run = lambda ids, past, **kw: widths.append(len(ids)) or orig(ids, past, **kw)
            got, _ = run(d, prompt, max_new_tokens=40, drafter="prompt-lookup", draft_tokens=12)  # (no timing)
            if verified:
                assert got == ref, seed
                assert max(widths[1:]) <= 5  # (the prompt's prefill excepted)
            else:
                drift += got != ref
                widest = max(widest, max(widths[1:]))
    assert drift >= 10 and widest > 5  # the planted kernel matters where nothing bounds the calls
    # the bound caps each draft (adaptive and fixed), not the generation's budget, which the round
    # policy's horizon reads (a costly drafter's catch-up is amortized over the tokens still to come)
    # (session 96, a mutation test: DC74) calls padded to an even width are bounded by their padded width: 5 tokens
    # pad to 6, so 3 drafts at most
    for multiple, most in ((1, 4), (2, 3)):
        d = make(seed=1)
        d.target.verified_width, d.target.width_multiple = 5, multiple
        seen, choose = [], d.policy.choose
        d.policy.choose = lambda ctx, kcap, fixed, max_draft, seen=seen, choose=choose: seen.append(
            (kcap, fixed, max_draft)) or choose(ctx, kcap, fixed, max_draft)
        run(d, [1, 2, 3], max_new_tokens=40, drafter="auto", max_draft_tokens=12)
        run(d, [1, 2, 3], max_new_tokens=40, drafter="prompt-lookup", draft_tokens=9)
        assert max(k for k, _, _ in seen) > 20 and all(m <= most and (f is None or f <= most) for _, f, m in seen)
        assert any(m == most for _, _, m in seen)
    # a bound below the policy's narrowest call (two tokens): no drafts at all, the output greedy's
    d = make(seed=2, min_width=2)
    d.target.verified_width = 1
    st = Stats()
    got, _ = run(d, [1, 2, 3] * 4, st, max_new_tokens=20, drafter="prompt-lookup", draft_tokens=5)
    assert st.drafted == 0 and got == run(make(seed=2, min_width=2), [1, 2, 3] * 4, max_new_tokens=20,
                                          drafter="none")[0]


def test_stats_count_the_model_drafters_calls():
    """Stats.model_*: the model drafter's calls while drafting (its catch-up read of the prompt, its
    steps), the tokens they computed and their time, what scripts/gpu/predict.py prices at a GPU's
    costs; none for a memory drafter."""
    d = make(seed=3)
    st = Stats()
    lm = d.drafters["model"].lm
    before = (lm.calls, lm.tokens_run)
    run(d, list(range(1, 8)) * 3, st, max_new_tokens=30, drafter="model", draft_tokens=3)
    assert st.model_calls == lm.calls - before[0] and st.model_tokens == lm.tokens_run - before[1]
    assert st.model_calls >= st.rounds and st.model_tokens >= 21 + st.rounds  # the prompt read, the steps
    assert 0.0 < st.model_call_s <= st.draft_s
    st2 = Stats()
    run(make(seed=3), list(range(1, 8)) * 3, st2, max_new_tokens=30, drafter="prompt-lookup")
    assert (st2.model_calls, st2.model_tokens, st2.model_call_s) == (0, 0, 0.0)


def test_eos_and_max_tokens_inside_a_draft():
    # the target repeats a cycle; prompt lookup drafts long spans that run past eos and max tokens
    hits = {"eos": 0, "length": 0}
    for seed in range(30):
        d = make(seed=seed, eos=(3,))
        ref, rr = run(make(seed=seed, eos=(3,)), [1, 2], max_new_tokens=25, drafter="none")
        st = Stats()
        got, r = run(d, [1, 2], st, max_new_tokens=25, drafter="prompt-lookup", draft_tokens=8)
        assert (got, r) == (ref, rr)
        # and both are an argmax loop's, written out here (the two above share the round loop: an eos dropped
        # from a round's tokens, a mutation test of session 67, dropped it from both)
        want, ctx = [], [1, 2]
        while len(want) < 25 and (not want or want[-1] != 3):
            want.append(int(np.argmax(d.target.logits_for(ctx + want))))
        assert ref == want and rr == ("eos" if want[-1] == 3 else "length")
        hits[r] += 1
        assert st.new_tokens == len(got)
    assert hits["eos"] and hits["length"]


def test_context_limit_inside_a_draft():
    for seed in range(10):
        prompt = [1, 2, 3, 4, 5]
        ref, rr = run(make(seed=seed, max_context=40), prompt, max_new_tokens=100, drafter="none")
        got, r = run(make(seed=seed, max_context=40), prompt, max_new_tokens=100, drafter="model", draft_tokens=7)
        assert (got, r) == (ref, rr)
        if rr == "context":
            assert len(prompt) + len(got) == 40


def test_both_caches_end_at_accepted_length():
    d = make(seed=5)
    out, _ = run(d, [1, 2, 3], max_new_tokens=30, drafter="model", draft_tokens=4)
    context = [1, 2, 3] + out
    assert d.target.tokens == context[:-1]
    drafter_tokens = d.drafters["model"].lm.tokens
    common = next((i for i, (a, b) in enumerate(zip(drafter_tokens, context)) if a != b), len(drafter_tokens))
    assert common >= len(context) - 6  # at most one draft's worth of stale positions, rolled back on next sync


def test_stats_are_consistent():
    d = make(seed=2)
    st = Stats()
    out, _ = run(d, [1, 2, 3], st, max_new_tokens=50, drafter="model", draft_tokens=3)
    assert st.new_tokens == len(out)
    assert st.accepted == sum(st.accepted_by_position) and st.drafted == sum(st.drafted_by_position)
    assert 0 <= st.acceptance_rate <= 1 and st.tokens_per_target_call >= 1
    assert st.target_calls == 1 + (st.new_tokens - 1 - st.accepted)  # prefill + one call per emitted-token round
    assert st.to_dict()["acceptance_by_position"][0] is not None


# -- verification rules ---------------------------------------------------------------------

def test_greedy_accept_rule():
    logits = np.eye(5)[[1, 2, 3, 4]]  # argmaxes 1,2,3,4
    assert verify_mod.greedy_accept([1, 2, 0], logits) == (2, 3)
    assert verify_mod.greedy_accept([1, 2, 3], logits) == (3, 4)
    assert verify_mod.greedy_accept([], logits[:1]) == (0, 1)


def _exact_sequence_probs(target: FakeLM, prompt, n, sp):
    v = target.vocab
    out = {}
    for seq in itertools.product(range(v), repeat=n):
        p, ctx = 1.0, list(prompt)
        for t in seq:
            p *= probs(target.logits_for(ctx)[None], sp)[0][t]
            ctx.append(t)
        out[seq] = p
    return out


def _chi2(counts: dict, exact: dict, n: int) -> tuple[float, int]:
    impossible = {seq: c for seq, c in counts.items() if exact.get(seq, 0.0) == 0.0}
    if impossible:  # outputs the target's distribution never gives: no test of sizes needed
        return float("inf"), 1
    stat, cells, other_o, other_e = 0.0, 0, 0, 0.0
    for seq, p in exact.items():
        e = p * n
        if e < 5:  # pool rare cells
            other_o += counts.get(seq, 0)
            other_e += e
            continue
        stat += (counts.get(seq, 0) - e) ** 2 / e
        cells += 1
    if other_e >= 5:
        stat += (other_o - other_e) ** 2 / other_e
        cells += 1
    return stat, cells - 1


# 99.99th percentile of chi-square with df degrees of freedom (Wilson-Hilferty), no scipy needed.
def _chi2_crit(df: int, z: float = 3.719) -> float:
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


def _sample_runs(decoder_factory, prompt, n_tokens, sp, runs, drafter, k, reach: list | None = None,
                 split: bool = True):
    """Counts of the outputs of ``runs`` seeded generations; ``reach``: each run's deepest draft position verified
    appended (a test of a block's later positions must reach them: at 3 new tokens no round verifies a second draft
    token, the prefill making the first and a round keeping one more for its bonus). ``split``: half the runs in a
    forked child (``tiny.split_runs``: a factory whose decoder records into the test's own objects sees only its
    half)."""
    def work(seeds):
        counts: dict = {}
        deepest: list = []
        dec = decoder_factory()
        for i in seeds:
            st = Stats()
            out, _ = run(dec, prompt, st, max_new_tokens=n_tokens, temperature=sp.temperature, top_k=sp.top_k,
                         top_p=sp.top_p, min_p=sp.min_p, seed=i, drafter=drafter, draft_tokens=k)
            counts[tuple(out)] = counts.get(tuple(out), 0) + 1
            deepest.append(sum(1 for n in st.drafted_by_position if n))
        return counts, deepest

    counts, deepest = split_runs(work, runs) if split else work(range(runs))
    if reach is not None:
        reach.extend(deepest)
    return counts


@pytest.mark.parametrize("drafter, sp, k", [
    ("model", SamplingParams(1.0), 2),
    ("model", SamplingParams(0.7, top_k=3), 2),
    ("model", SamplingParams(1.3, top_p=0.8), 2),
    ("model", SamplingParams(1.0), None),  # adaptive: the draft ends on the drafter's confidence
    ("prompt-lookup", SamplingParams(1.0), 2),
    ("suffix", SamplingParams(1.0), 2),
    ("suffix", SamplingParams(0.7, top_k=3), 2),
    ("auto", SamplingParams(1.3, top_p=0.8), 2),
    ("auto", SamplingParams(0.7), None),
    ("model", SamplingParams(1.0, min_p=0.3), 2),
    ("auto", SamplingParams(1.3, top_p=0.95, min_p=0.2), 2),
])
def test_sampled_speculative_follows_target_distribution(drafter, sp, k):
    # 4 new tokens: a round verifies two draft tokens (at 3 only one, and a bug at a block's second position went
    # unseen: session 55, a review)
    vocab, n_tokens, runs = 4, 4, 4000
    prompt = [1, 2, 1, 2, 1]  # prompt lookup finds drafts here
    exact = _exact_sequence_probs(FakeLM(vocab, seed=7, sharpness=1.0), prompt, n_tokens, sp)

    def factory():  # both models hand out views of one buffer, as OnnxLM does (forward(copy=False))
        target = FakeLM(vocab, seed=7, sharpness=1.0, reuse_buffer=True)
        dl = FakeLM(vocab, table=target.table + np.random.default_rng(3).normal(0, 1.0, target.table.shape),
                    reuse_buffer=True)
        return Decoder(target, (), drafters=[ModelDrafter(dl, vocab), PromptLookupDrafter(),
                                             suffix_drafter(vocab, 7, RememberingSuffix)])

    reach: list = []
    counts = _sample_runs(factory, prompt, n_tokens, sp, runs, drafter, k, reach)
    assert sum(r >= 2 for r in reach) >= runs // 20, collections.Counter(reach)  # blocks of two draft tokens verified
    stat, df = _chi2(counts, exact, runs)
    assert stat < _chi2_crit(df), f"chi2 {stat:.1f} with {df} dof"


def test_statistical_test_catches_a_later_positions_q_taken_from_the_first(monkeypatch):
    """Plant a bug that matters only from a block's second draft token on (each position judged with the draft's
    first q): at 4 new tokens the test above catches it (session 55: at 3 it reached no second position, chi2 71
    against 112)."""
    n_tokens, runs = 4, 4000
    sp = SamplingParams(1.0)
    prompt = [1, 2, 1, 2, 1]
    real = verify_mod.rejection_sample

    def buggy(draft, dists, target_logits, sp_, rng):
        return real(draft, None if dists is None else [dists[0]] * len(dists), target_logits, sp_, rng)

    monkeypatch.setattr("edgespec.decoder.rejection_sample", buggy)

    _assert_caught(prompt, n_tokens, sp, runs)


def test_statistical_test_catches_a_verify_that_drops_min_p(monkeypatch):
    """Plant a verify whose target distribution leaves min-p out (the drafter's and the first token's keep it):
    the output no longer follows the min-p distribution, and the test above with min-p fails."""
    real = verify_mod.distribution
    monkeypatch.setattr(verify_mod, "distribution",
                        lambda row, sp_: real(row, SamplingParams(sp_.temperature, sp_.top_k, sp_.top_p)))

    _assert_caught([1, 2, 1, 2, 1], 4, SamplingParams(1.0, min_p=0.3), 4000)


def _assert_caught(prompt, n_tokens, sp, runs, vocab=4):
    """The chi-square test of seeded model-drafted generations (the target and a noisy drafter of
    ``vocab`` tokens) against the target's exact distribution fails: a planted bug is caught."""
    exact = _exact_sequence_probs(FakeLM(vocab, seed=7, sharpness=1.0), prompt, n_tokens, sp)

    def factory():
        target = FakeLM(vocab, seed=7, sharpness=1.0)
        dl = FakeLM(vocab, table=target.table + np.random.default_rng(3).normal(0, 1.0, target.table.shape))
        return Decoder(target, (), drafters=[ModelDrafter(dl, vocab)])

    counts = _sample_runs(factory, prompt, n_tokens, sp, runs, "model", 2)
    stat, df = _chi2(counts, exact, runs)
    assert stat > _chi2_crit(df), f"the planted bug went unnoticed (chi2 {stat:.1f}, {df} dof)"


class RememberingSuffix(SuffixDrafter):
    """Drafts from its memory in seeded runs too (the engine turns memory off there, for
    reproducibility): the memory grows with every run, and the distribution must hold whatever it
    holds."""

    history = property(lambda self: True, lambda self, value: None)


def test_statistical_test_catches_missing_residual(monkeypatch):
    """Plant the classic bug (resample from p instead of max(p - q, 0)): the same test must fail."""
    n_tokens, runs = 3, 4000
    sp = SamplingParams(1.0)
    prompt = [1, 2, 1, 2, 1]
    real = verify_mod.rejection_sample

    def buggy(draft, draft_probs, target_logits, sp_, rng):
        n, tok = real(draft, draft_probs, target_logits, sp_, rng)
        if n < len(draft):
            tok = int(rng.choice(len(target_logits[n]), p=probs(target_logits[n][None], sp_)[0]))
        return n, tok

    monkeypatch.setattr("edgespec.decoder.rejection_sample", buggy)

    _assert_caught(prompt, n_tokens, sp, runs)


def test_sampling_transform_top_k_top_p():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    p = probs(logits, SamplingParams(1.0, top_k=2))[0]
    np.testing.assert_allclose(p, [0.625, 0.375, 0, 0])
    p = probs(logits, SamplingParams(1.0, top_p=0.7))[0]
    np.testing.assert_allclose(p, [0.625, 0.375, 0, 0])
    p = probs(logits, SamplingParams(1.0, top_p=0.81))[0]
    np.testing.assert_allclose(p, np.array([0.5, 0.3, 0.15, 0]) / 0.95)
    # top-k, then top-p over the k tokens' own mass: of 0.95, 0.8 is 0.842 before the third token, past 0.83 (top-p
    # over the whole mass, 0.8 before it, would keep it; a mutation test, session 67, found the total unchecked)
    p = probs(logits, SamplingParams(1.0, top_k=3, top_p=0.83))[0]
    np.testing.assert_allclose(p, [0.625, 0.375, 0, 0])
    p = probs(logits, SamplingParams(1.0, top_k=3, top_p=0.85))[0]
    np.testing.assert_allclose(p, np.array([0.5, 0.3, 0.15, 0]) / 0.95)
    rng = np.random.default_rng(0)  # and the cut against the full sort's on many small rows
    for _ in range(400):
        row = rng.normal(0.0, 2.0, 12).astype(np.float32)
        sp = SamplingParams(float(rng.uniform(0.3, 2.0)), top_k=int(rng.integers(2, 12)),
                            top_p=float(rng.uniform(0.05, 0.99)))
        np.testing.assert_allclose(probs(row, sp), _reference_probs(row, sp), rtol=1e-6, atol=1e-12, err_msg=str(sp))


def test_sampling_transform_min_p():
    """Min-p keeps the tokens at least min_p times as likely as the likeliest, after temperature, top-k and
    top-p (transformers' order)."""
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    np.testing.assert_allclose(probs(logits, SamplingParams(1.0, min_p=0.5))[0], [0.625, 0.375, 0, 0])
    np.testing.assert_allclose(probs(logits, SamplingParams(1.0, min_p=0.2))[0], np.array([0.5, 0.3, 0.15, 0]) / 0.95)
    np.testing.assert_allclose(probs(logits, SamplingParams(1.0, min_p=1.0))[0], [1, 0, 0, 0])
    # after temperature: at T = 2 the weights are the square roots, 0.05's sqrt(0.1) = 0.32 of the maximum's
    w = np.sqrt([0.5, 0.3, 0.15, 0.05])
    np.testing.assert_allclose(probs(logits, SamplingParams(2.0, min_p=0.3))[0], w / w.sum())
    np.testing.assert_allclose(probs(logits, SamplingParams(2.0, min_p=0.5))[0], np.append(w[:3], 0) / w[:3].sum())
    # after top-p: top-p 0.75 keeps three tokens (0.4 + 0.3 < 0.75 of the whole mass), then min-p 0.3 (0.12) keeps
    # them; min-p first (0.4, 0.3, 0.2 of 0.9) would have left top-p two (0.4 / 0.9 + 0.3 / 0.9 > 0.75)
    lg = np.log(np.array([[0.4, 0.3, 0.2, 0.1]]))
    np.testing.assert_allclose(probs(lg, SamplingParams(1.0, top_p=0.75, min_p=0.3))[0],
                               np.array([0.4, 0.3, 0.2, 0]) / 0.9)
    np.testing.assert_allclose(probs(logits, SamplingParams(1.0, top_p=0.81, min_p=0.4))[0], [0.625, 0.375, 0, 0])
    np.testing.assert_allclose(probs(logits, SamplingParams(1.0, top_k=3, min_p=0.2))[0],
                               np.array([0.5, 0.3, 0.15, 0]) / 0.95)
    # at the cut: a token whose float64 weight is min_p or above is kept, below it dropped, also where the cut's
    # logit lies between float32 numbers (the threshold's rounding: float64 rows) and at extreme temperatures
    for mp in (0.5, 0.05, 0.1, 0.2, 0.3, 0.01, 1.0):
        for t in (1e-6, 0.7, 1.0, 1.3, 1e6):
            cut = -math.log(1 / mp) * t
            r = float(np.float32(cut))
            for x1 in (cut, np.nextafter(cut, -1), np.nextafter(cut, 1), (cut + r) / 2, r, -4e-11, -1e-300):
                for row in (np.array([0.0, x1]), np.array([5e3, 5e3 + x1])):
                    w = math.exp((float(row[1]) - float(row[0])) * (1.0 / t))
                    kept = 1 in distribution(row, SamplingParams(t, min_p=mp)).idx.tolist()
                    assert kept == (w >= mp), (mp, t, x1, w)
    with pytest.raises(ConfigError, match="min_p"):
        SamplingParams(1.0, min_p=1.5)
    with pytest.raises(ConfigError, match="min_p"):
        SamplingParams(1.0, min_p=float("nan"))
    with pytest.raises(ConfigError, match="min_p"):
        GenerationConfig(temperature=1.0, min_p=-0.1)
    with pytest.raises(ConfigError, match="min_p must be a number"):
        GenerationConfig(temperature=1.0, min_p="0.1")


def _reference_probs(row, sp):
    """The transform as a full float64 sort would compute it (the runtime's before it went sparse)."""
    x = np.asarray(row, dtype=np.float64) / sp.temperature
    if sp.top_k and sp.top_k < x.shape[-1]:
        kth = np.partition(x, -sp.top_k)[-sp.top_k]
        x = np.where(x < kth, -np.inf, x)
    p = np.exp(x - x.max())
    p /= p.sum()
    if sp.top_p < 1.0:
        order = np.argsort(-p, kind="stable")
        sp_ = p[order]
        drop = np.zeros_like(p, dtype=bool)
        drop[order] = (np.cumsum(sp_) - sp_) >= sp.top_p
        p = np.where(drop, 0.0, p)
        p /= p.sum()
    if sp.min_p > 0:
        p = np.where(p < sp.min_p * p.max(), 0.0, p)
        p /= p.sum()
    return p


@pytest.mark.parametrize("sp", [SamplingParams(0.7), SamplingParams(0.7, top_p=0.8), SamplingParams(1.0, top_k=40),
                                SamplingParams(0.5, top_k=7, top_p=0.5), SamplingParams(1.3, top_p=0.99),
                                SamplingParams(2.0, top_p=0.3), SamplingParams(0.7, min_p=0.05),
                                SamplingParams(1.0, top_p=0.9, min_p=0.1), SamplingParams(1.5, top_k=50, min_p=0.02),
                                SamplingParams(1.0, min_p=1e-9)])
def test_sparse_distribution_equals_the_full_sort(sp, top_p_path):
    """distribution() never sorts the vocabulary; it must keep the same tokens with the same
    probabilities as the full float64 sort, on flat and peaked rows of a Qwen-sized vocabulary
    (top-p alone: on the native path and on numpy's)."""
    from edgespec.sampling import distribution

    rng = np.random.default_rng(5)
    for scale, peak in ((0.5, 0.0), (2.5, 12.0), (4.0, 30.0), (0.01, 0.0)):
        row = (rng.standard_normal(151936) * scale).astype(np.float32)
        row[rng.integers(0, 151936, size=5)] += peak
        ref = _reference_probs(row, sp)
        d = distribution(row, sp)
        got = d.dense()
        assert np.array_equal(got > 0, ref > 0), (scale, peak)
        np.testing.assert_allclose(got, ref, rtol=2e-5, atol=1e-12)
        if sp.top_k or sp.top_p < 1 or sp.min_p > 0:
            assert d.idx is not None and d.idx.shape[0] == np.count_nonzero(ref)


@pytest.fixture(params=["native", "numpy"])
def top_p_path(request, monkeypatch):
    """Top-p alone runs in edgespec/native/topp.cpp where it builds, else in numpy: both."""
    from edgespec import native

    if request.param == "numpy":
        monkeypatch.setattr(native, "top_p_kernel", lambda: None)
    elif native.top_p_kernel() is None:
        pytest.skip("the native top-p could not be built here (no C++ compiler)")
    return request.param


def _top_p_rows(rng, n):
    """Rows that stress the top-p cut: flat, peaked, a few near-ties, a long band near the max."""
    for scale, peak in ((0.5, 0.0), (2.5, 12.0), (4.0, 30.0), (0.01, 0.0), (3.0, 5.0)):
        row = (rng.standard_normal(n) * scale).astype(np.float32)
        row[rng.integers(0, n, size=5)] += peak
        yield row
    row = np.full(n, -20.0, dtype=np.float32)
    row[rng.integers(0, n, size=50)] = np.float32(1.5)  # ties at the top, kept in vocabulary order
    row[rng.integers(0, n, size=3000)] = rng.uniform(-6, 1, 3000).astype(np.float32)
    yield row


@pytest.mark.parametrize("n", [5, 1000, 49152, 151936])
def test_native_top_p_equals_numpys_bitwise(n, monkeypatch):
    """The native top-p is a speed-up only: the same kept tokens and the same float64 weights as
    numpy's path, bit for bit, on these rows, where numpy's float64 exp is the C library's (within
    1e-14 where numpy has its own AVX-512 exp, as on session 11's Xeon). (Their sums run in other orders and their float32
    exps differ, so a cut within rounding of a boundary can come out otherwise: both are then
    within rounding of the exact cut.)"""
    from edgespec import native, sampling

    if native.top_p_kernel() is None:
        pytest.skip("the native top-p could not be built here (no C++ compiler)")
    rng = np.random.default_rng(n)
    for row in _top_p_rows(rng, n):
        for sp in (SamplingParams(0.7, top_p=0.8), SamplingParams(1.0, top_p=0.95), SamplingParams(0.3, top_p=0.5),
                   SamplingParams(1.5, top_p=0.99), SamplingParams(0.7, top_p=0.05)):
            fast = sampling.distribution(row, sp)
            with monkeypatch.context() as mp:
                mp.setattr(native, "top_p_kernel", lambda: None)
                slow = sampling.distribution(row, sp)
            assert np.array_equal(fast.idx, slow.idx), (n, sp)
            if numpy_exp_is_libms():
                assert np.array_equal(fast.w, slow.w) and fast.total == slow.total, (n, sp)
            else:  # numpy's own AVX-512 float64 exp: an ulp or two from the C library's
                np.testing.assert_allclose(fast.w, slow.w, rtol=1e-14, atol=0, err_msg=str((n, sp)))
                assert fast.total == pytest.approx(slow.total, rel=1e-13)


@pytest.mark.parametrize("tail_logit, second_kept", [(-30.0, False), (-8.0, True)])
def test_top_p_undecided_near_the_cut_takes_the_exact_pass(top_p_path, monkeypatch, tail_logit, second_kept):
    """With the left-out tokens allowed to weigh up to 0.5 (eps widened from 1e-3), the cut at
    top-p 0.8 over weights 1 and 0.2 depends on the tail: both paths must decline and the exact
    pass decide, keeping the second token (and some of the tail) only when the tail is heavy
    enough (998 tokens at e^-8 weigh 0.33)."""
    from edgespec import sampling

    n = 1000
    row = np.full(n, tail_logit, dtype=np.float32)
    row[0], row[1] = 0.0, np.float32(np.log(0.2))
    monkeypatch.setattr(sampling, "_TAIL_EPS", (0.5,))
    full = []
    real = sampling._top_p_full
    monkeypatch.setattr(sampling, "_top_p_full", lambda *a: full.append(1) or real(*a))
    sp = SamplingParams(1.0, top_p=0.8)
    d = sampling.distribution(row, sp)
    assert full == [1]
    assert (d.idx.tolist()[:2] == [0, 1]) == second_kept and (d.idx.shape[0] > 2) == second_kept
    np.testing.assert_allclose(d.dense(), _reference_probs(row, sp), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("tail_logit, second_kept", [(-30.0, False), (-8.0, True)])
def test_top_p_whose_likeliest_tokens_hold_the_cut_between_the_totals_bounds_takes_the_exact_pass(
        top_p_path, monkeypatch, tail_logit, second_kept):
    """Weights 1 and 0.25 hold top-p 0.65 of any total the left-out tokens allow (under 1.75 with eps widened to
    0.5), so the cut is among them; but whether the second is kept (1 < 0.65 x total) depends on the tail: below
    the total's bounds the cut keeps one token, above them two. Neither path may decide on one bound (a mutation
    test, session 67: the numpy path cutting at the lower bound went unnoticed); the exact pass keeps the
    second token only where 998 tokens at e^-8 (0.33) weigh it in."""
    from edgespec import sampling

    n = 1000
    row = np.full(n, tail_logit, dtype=np.float32)
    row[0], row[1] = 0.0, np.float32(np.log(0.25))
    monkeypatch.setattr(sampling, "_TAIL_EPS", (0.5,))
    sp = SamplingParams(1.0, top_p=0.65)
    d = sampling.distribution(row, sp)
    assert d.idx.tolist() == ([0, 1] if second_kept else [0])
    np.testing.assert_allclose(d.dense(), _reference_probs(row, sp), rtol=1e-6, atol=1e-12)


def test_top_p_just_past_the_likeliest_token_keeps_the_next_of_a_flat_tail(top_p_path):
    """One token of weight 1 and 15,999 tied at 0.5 / 15,999: top-p 0.66668 of 1.5 is just past the first, so the
    cut keeps it and the first of the ties (vocabulary order). The likeliest tokens alone hold top-p of the total's
    lower bound but not of its upper one: a path that decides there on the lower bound keeps one token (a mutation
    test, session 67: numpy's path so went unnoticed)."""
    row = np.full(16000, np.log(0.5 / 15999), dtype=np.float32)
    row[0] = 0.0
    sp = SamplingParams(1.0, top_p=0.66668)
    d = distribution(row, sp)
    assert d.idx.tolist() == [0, 1]
    np.testing.assert_allclose(d.dense(), _reference_probs(row, sp), rtol=1e-6, atol=1e-12)


def test_views_of_one_logits_buffer_keep_greedy_speculation_exact():
    """The loop reads each call's logits before the model's next call (forward(copy=False)): with
    models that hand out views of one buffer, speculative output still equals autoregressive."""
    prompt = [1, 2, 1, 2, 1, 3]

    def run(drafter, reuse):
        target = FakeLM(9, seed=4, reuse_buffer=reuse)
        dl = FakeLM(9, table=target.table + np.random.default_rng(2).normal(0, 0.5, target.table.shape),
                    reuse_buffer=reuse)
        dec = Decoder(target, (), drafters=[ModelDrafter(dl, 9), PromptLookupDrafter()])
        cfg = GenerationConfig(max_new_tokens=40, drafter=drafter, draft_tokens=3, ignore_eos=True)
        return [t for step in dec.generate(prompt, cfg) for t in step.tokens]

    ref = run("none", False)
    for drafter in ("none", "model", "prompt-lookup", "auto"):
        assert run(drafter, True) == ref, drafter


@pytest.mark.parametrize("sp", [SamplingParams(0.7, top_p=0.8), SamplingParams(1.0), SamplingParams(1.0, top_k=3)])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_row_with_nan_or_inf_is_a_typed_error(sp, bad, top_p_path):
    from edgespec.errors import BundleError
    from edgespec.sampling import distribution

    row = np.zeros(100, dtype=np.float32)
    row[37] = bad
    with pytest.raises(BundleError, match="token 37"):
        distribution(row, sp)
    row[:] = -np.inf  # every token masked: nothing to sample either
    with pytest.raises(BundleError):
        distribution(row, sp)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_greedy_decoding_refuses_a_row_with_nan_or_inf_as_sampling_does(tiny_bundle, bad):
    """(session 46) greedy decoding took np.argmax of a row holding NaN (numpy's first NaN is its largest) and
    emitted that token over and over, where sampling raised a BundleError: a model that overflowed decoded garbage."""
    import edgespec
    from edgespec.errors import BundleError

    eng = edgespec.load(tiny_bundle, memory=False)
    t = eng.decoder.target
    real = t.forward

    def poisoned(ids, copy=True):
        x = np.array(real(ids, copy=copy), copy=True)
        x[..., 7] = bad
        return x

    t.forward = poisoned
    for kw in ({"drafter": "none"}, {"drafter": "prompt-lookup"}, {"drafter": "model", "logprobs": 2},
               {"temperature": 0.7, "seed": 1}):
        with pytest.raises(BundleError, match="logits hold (NaN|inf)"):
            eng.generate("Hello world, hello world, hello", max_new_tokens=12, ignore_eos=True, **kw)
    t.forward = real
    assert len(eng.generate("Hello world", max_new_tokens=4, ignore_eos=True).token_ids) == 4  # the engine goes on
    # (the diff's review) a NaN in a verify call's rows past its first rejection, which plain decoding never computes,
    # changes nothing: the output is plain decoding's
    p = eng.encode("Hello world, hello world, hello")
    first = eng.generate("Hello world, hello world, hello", max_new_tokens=40, ignore_eos=True).token_ids
    ids = p + first + p + first[:3]  # (the reply repeats: prompt lookup drafts 8 tokens, wrong now and then)
    ref = [x for s in eng.stream_ids(ids, max_new_tokens=24, ignore_eos=True, drafter="none") for x in s[1]]
    hits = []

    def last_row_poisoned(ids, copy=True):
        x = np.array(real(ids, copy=copy), copy=True)
        if len(ids) > 2:
            top = np.argmax(x, -1)
            if any(top[i] != ids[i + 1] for i in range(len(ids) - 2)):  # a rejection before the last row
                x[-1, 7] = bad
                hits.append(len(ids))
        return x

    t.forward = last_row_poisoned
    out = [x for s in eng.stream_ids(ids, max_new_tokens=24, ignore_eos=True, drafter="prompt-lookup",
                                     draft_tokens=8) for x in s[1]]
    t.forward = real
    assert hits and out == ref, hits


def test_a_temperature_too_small_for_float32_is_greedy():
    """(refused until session 92: tests/test_errors.py, test_a_temperature_too_small_to_sample_at_is_greedy_decoding)"""
    assert SamplingParams(1e-39).temperature == 0.0 and SamplingParams(1e-39).greedy
    assert SamplingParams(1e-6).temperature == 1e-6 and SamplingParams(0.0).greedy


def test_native_top_p_declines_a_row_with_nan():
    from edgespec import native, sampling

    fn = native.top_p_kernel()
    if fn is None:
        pytest.skip("the native top-p could not be built here (no C++ compiler)")
    row = np.zeros(100, dtype=np.float32)
    row[37] = np.nan
    idx, w, eps = np.empty(100, dtype=np.int64), np.empty(100), np.array(sampling._TAIL_EPS)
    assert fn(row.ctypes.data, 100, 1.0, 0.9, eps.ctypes.data, eps.shape[0], 16384, idx.ctypes.data,
              w.ctypes.data, 100) == -1
    row[37] = 0
    assert fn(row.ctypes.data, 100, 1.0, 0.9, eps.ctypes.data, eps.shape[0], 16384, idx.ctypes.data,
              w.ctypes.data, 100) == 90  # 100 equal weights: the cut keeps 90


def test_small_kept_sets_draw_the_same_tokens_as_numpys_inverse_cdf():
    """A few kept tokens are drawn in plain Python; the same float64 sums in the same order, so the
    same token for the same random number as numpy's cumsum and searchsorted."""
    from edgespec.sampling import _SMALL, Dist, _inverse_cdf

    rng = np.random.default_rng(0)
    for t in range(3000):
        k = int(rng.integers(1, _SMALL + 1))
        w = rng.random(k) ** 6
        idx = np.sort(rng.choice(10_000, k, replace=False))
        assert Dist(10_000, idx, w).sample(np.random.default_rng(t)) == int(idx[_inverse_cdf(w, np.random.default_rng(t))])


def test_dense_sampler_follows_the_distribution_across_blocks():
    """Sampling a dense distribution goes through block sums (1024 tokens a block): every block
    and the ragged last one must be drawn as often as their mass says."""
    from edgespec.sampling import Dist

    n = 3 * 1024 + 300
    w = np.zeros(n, dtype=np.float32)
    cells = [5, 1023, 1024, 2047, 2500, n - 1]
    w[cells] = [1, 2, 3, 4, 5, 6]
    d = Dist(n, None, w)
    rng = np.random.default_rng(0)
    draws = [d.sample(rng) for _ in range(21000)]
    counts = {c: draws.count(c) for c in cells}
    assert sum(counts.values()) == len(draws)
    expected = {c: len(draws) * w[c] / w.sum() for c in cells}
    chi2 = sum((counts[c] - expected[c]) ** 2 / expected[c] for c in cells)
    assert chi2 < _chi2_crit(len(cells) - 1), counts


def test_residuals_sparse_and_dense_agree():
    from edgespec.sampling import distribution

    rng = np.random.default_rng(1)
    for _ in range(20):
        a, b = (rng.standard_normal(3000) * 3).astype(np.float32), (rng.standard_normal(3000) * 3).astype(np.float32)
        for sp in (SamplingParams(0.8, top_p=0.9), SamplingParams(1.0, top_k=50), SamplingParams(1.0)):
            p, q = distribution(a, sp), distribution(b, sp)
            want = np.maximum(p.dense() - q.dense(), 0)
            r = p.minus(q)
            np.testing.assert_allclose(r.dense(), want / want.sum(), rtol=1e-5, atol=1e-12)
            x = int(np.argmax(p.dense()))
            wo = p.dense()
            wo[x] = 0
            np.testing.assert_allclose(p.without(x).dense(), wo / wo.sum(), rtol=1e-5, atol=1e-12)
            assert p.prob(x) == pytest.approx(p.dense()[x], rel=1e-6)


# -- drafters and cost model ----------------------------------------------------------------

def test_prompt_lookup_finds_latest_match():
    pl = PromptLookupDrafter(min_ngram=1, max_ngram=3)
    ctx = [5, 6, 7, 8, 9, 1, 5, 6, 7, 2, 3, 5, 6, 7]
    assert pl.lookup(ctx, 3) == [2, 3, 5]  # latest earlier "5 6 7" is followed by 2 3 5
    assert pl.lookup([1, 2, 3, 4], 3) == []
    assert pl.lookup([4, 4], 5) == [4]


def test_cost_model_prefers_no_draft_when_acceptance_is_low():
    cm = CostModel()
    for w, t in ((1, 0.055), (2, 0.062), (3, 0.076), (5, 0.1), (9, 0.156)):
        cm.observe_target(w, t)
    cm.observe_draft(0.39 * 0.055)
    assert cm.best_k(0.1, 8, draft_cost=True)[0] == 0
    k, rate = cm.best_k(0.9, 8, draft_cost=True)
    assert k >= 2 and rate > 1.15 / 0.055  # (1-a^3)/(1-a) = 2.71 tokens for 0.076 + 2 x 0.021 s
    assert cm.best_k(0.5, 8, draft_cost=False)[0] >= 1  # free drafting pays earlier


def test_the_cost_line_is_refitted_and_the_priced_widths_renewed_after_each_measurement():
    """(session 78, mutants Q5 and Q6) An unmeasured width is priced on the line fitted to the measured ones, and
    ``best_k`` reads the widths priced once (``costs``): both kept until a measurement or the width policy
    changes. A line not refitted after a new measurement, or prices kept across a change of ``min_width``, would
    price rounds at a target the device no longer has."""
    cm = CostModel()
    cm.observe_target(1, 0.050)
    cm.observe_target(2, 0.052)
    assert cm.target_cost(6) == pytest.approx(0.060)  # on the line through widths 1 and 2
    cm.observe_target(4, 0.110)  # the rows past 2 turn out dear: the line refitted
    slope, icpt = np.polyfit([1, 2, 4], [0.050, 0.052, 0.110], 1)
    assert cm.target_cost(6) == pytest.approx(icpt + 6 * slope)
    for k in range(4):  # best_k's cached prices are rate's (which prices each width afresh)
        assert cm.costs(5)[k + 1] == pytest.approx(cm.target_cost(k + 1))
    cm.min_width = 4  # the width policy changes: every call computes 4 positions at least
    assert cm.costs(5)[1] == pytest.approx(0.110) and cm.costs(5)[2] == pytest.approx(0.110)
    k, r = cm.best_k(0.0, 4, False)
    assert (k, r) == (0, pytest.approx(1 / 0.110))  # no draft, and priced at a 4-wide call
    cm.min_width, cm.width_multiple = 1, 2
    assert cm.costs(5)[1] == pytest.approx(0.052) and cm.costs(5)[3] == pytest.approx(0.110)


def test_an_unmeasured_width_is_priced_no_cheaper_than_the_cheapest_call_and_no_row_below_zero():
    """(session 78, mutants Q17 and Q18) Timings are noisy: a wider call can be measured cheaper than a narrower
    one, and a steep line through two far-apart widths crosses zero before width 1. The fitted line's slope is
    clipped at 0 (one more row never saves time: ``marginal`` and the catch-ups and stop thresholds it prices
    stay >= 0) and a price is never below the cheapest measured call (never negative, which would make a rate
    negative and ``best_k`` pick nonsense)."""
    noisy = CostModel()
    noisy.observe_target(1, 0.050)
    noisy.observe_target(2, 0.040)  # (a stall in the one-token call)
    assert noisy.marginal() == 0.0
    assert noisy.target_cost(8) >= noisy.target_cost(2)
    steep = CostModel()
    steep.observe_target(4, 0.020)
    steep.observe_target(8, 0.100)  # the line: -0.06 + 0.02 a row, below zero at width 1 and 2
    assert steep.target_cost(1) == pytest.approx(0.020) and steep.target_cost(2) == pytest.approx(0.020)
    k, r = steep.best_k(0.5, 2, False)
    assert r > 0 and k == 2  # free rows up to the measured width: the longest draft pays most
    assert steep.rate(0.5, 0, False) == pytest.approx(1 / 0.020)


def test_a_round_without_a_draft_pays_for_no_hint():
    """(session 78, mutant Q21) A hint's extra rows are paid by the costly drafter's first call; a round that
    drafts nothing has no such call: ``rate`` prices k = 0 without them, as ``best_k``'s baseline does."""
    cm = CostModel()
    cm.observe_target(1, 0.050)
    cm.observe_draft(0.020)
    assert cm.rate(0.8, 0, True, extra=0.5) == pytest.approx(1 / 0.050) == cm.rate(0.8, 0, True)
    assert cm.rate(0.8, 2, True, extra=0.5) < cm.rate(0.8, 2, True)  # (with a draft it costs half a step)
    assert cm.best_k(0.01, 4, True, extra=0.5) == (0, pytest.approx(cm.rate(0.01, 0, True, extra=0.5)))


def test_a_read_of_no_tokens_costs_nothing_once_reads_are_measured():
    """(session 78, mutant Q11) The catch-up line's fixed cost is a read's: with nothing to read there is no
    read (a drafter that is caught up drafts at once), measured or not."""
    cm = CostModel()
    cm.observe_draft(0.010)
    for n, s in ((10, 0.012), (100, 0.060), (200, 0.110)):
        cm.observe_catchup(n, s)
    assert cm.catchup["model"][0] > 0.0  # a fixed cost a read
    assert cm.upfront_cost(0) == 0.0 and cm.upfront_cost(0, trust=0.5) == 0.0
    assert cm.upfront_cost(1) == pytest.approx(sum(cm.catchup["model"]))


def test_auto_drops_a_drafter_that_never_agrees():
    # the model drafter always disagrees; the target cycles, so prompt lookup pays: auto picks it
    target = FakeLM(8, seed=1)
    bad = FakeLM(8, table=-target.table)
    d = Decoder(target, (), drafters=[ModelDrafter(bad, 8), PromptLookupDrafter()])
    for w, t in ((1, 1.0), (2, 1.12), (3, 1.39)):
        d.policy.cost.observe_target(w, t)
    st = Stats()
    run(d, [1, 2, 3], st, max_new_tokens=120, drafter="auto")
    assert st.rounds_by_drafter.get("model", 0) <= 3 + st.rounds // 64  # a few tries, then rare probes
    assert st.rounds_by_drafter.get("prompt-lookup", 0) > 0.5 * st.rounds


def test_adaptive_model_drafter_stops_drafting_when_it_does_not_pay():
    # target: 4 ms a call + 0.5 ms a token; drafter step 40% of a target call; acceptance 0
    clock = SimClock()
    target = FakeLM(8, seed=1, order=3, delay=(0.004, 0.0005), clock=clock)
    bad = FakeLM(8, table=-target.table, order=3, delay=(0.0018, 0.0), clock=clock)
    d = Decoder(target, (), drafters=[ModelDrafter(bad, 8, clock=clock), PromptLookupDrafter()], clock=clock)
    st = Stats()
    run(d, [1, 2, 3], st, max_new_tokens=120, drafter="model")
    # k = 0 rounds, with a one-token probe every 64 rounds to keep the estimate alive
    assert st.rounds_by_drafter.get("none", 0) > 0.75 * (st.target_calls - 1)


def _catchup_decoder(drafter_step=0.0004):
    """Simulated time: target 4 ms a call + 0.5 ms a token; a drafter that agrees with the target on
    every token at ``drafter_step`` a call + 0.5 ms a token, so reading a 400-token prompt costs it
    about 0.2 s, forty-five target steps."""
    clock = SimClock()
    target = FakeLM(8, seed=3, order=3, delay=(0.004, 0.0005), clock=clock, max_context=2048)
    good = FakeLM(8, table=target.table, order=3, delay=(drafter_step, 0.0005), clock=clock, max_context=2048)
    return Decoder(target, (), drafters=[ModelDrafter(good, 8, clock=clock)], clock=clock), clock


def test_model_drafter_catch_up_is_priced_against_the_rest_of_the_generation():
    """Issue #14: the model drafter reads the context at its first draft of a generation; on a short
    answer after a long prompt that read costs more than drafting saves, so auto must not start it."""
    rng = np.random.default_rng(5)
    d, clock = _catchup_decoder()
    st = Stats()
    run(d, rng.integers(0, 8, 400).tolist(), st, max_new_tokens=300, drafter="auto")
    assert st.rounds_by_drafter.get("model", 0) > 0.8 * st.rounds_by_drafter.get("none", 0) + 10  # repays it
    cost400 = d.policy.measured.upfront_cost(400)
    assert 0.200 <= cost400 <= 0.2201  # 400 tokens in two chunks of <= 256: 2 x 0.4 ms + 400 x 0.5 ms (+ a step)
    short = rng.integers(0, 8, 400).tolist()
    times = {}
    for drafter in ("auto", "none"):
        st = Stats()
        run(d, short, st, max_new_tokens=6, drafter=drafter)
        times[drafter] = st.total_s - st.ttft_ms / 1000  # decode time (the second run reuses the prompt)
        assert st.rounds_by_drafter.get("model", 0) == 0, (drafter, st.rounds_by_drafter)
    assert times["auto"] == pytest.approx(times["none"])
    # the premise: without pricing the read, auto starts the drafter on the short answer too
    d2, _ = _catchup_decoder()
    d2.policy.measured.prior_catchup = 0.0
    d2.policy.measured.observe_catchup(1, 0.0)
    st = Stats()
    run(d2, short, st, max_new_tokens=6, drafter="auto")
    assert st.rounds_by_drafter.get("model", 0) > 0


class _Stall:
    """Wraps a FakeLM's ``_run``: the ``at``-th call of ``width`` tokens (counted from when it is set) takes
    ``seconds`` more (a stall: the OS, another process, a VM's host; session 32 saw a 0.45 s one price the
    model drafter out of a whole process)."""

    def __init__(self, lm, clock, at: int, width: int = 1, seconds: float = 0.5):
        self.lm, self.clock, self.at, self.width, self.seconds, self.seen = lm, clock, at, width, seconds, 0
        self.run, lm._run = lm._run, self

    def __call__(self, ids, past):
        if len(ids) == self.width:
            self.seen += 1
            if self.seen == self.at:
                self.clock.t += self.seconds
        return self.run(ids, past)


def test_one_stalled_drafter_step_does_not_price_the_drafter_out_for_good():
    """A drafter step that stalls for 0.5 s, ~300x its cost: the cost model counts a sample at most STALL_CLIP
    times the estimate it updates, so drafting goes on. Before session 32 that step raised the drafter's step
    cost (an average with weight 0.3) past a target call, the drafter drafted no more in that generation or
    the next (1 round of 193 here), and with no step measured it never came back."""
    d, clock = _catchup_decoder(drafter_step=0.0015)
    rng = np.random.default_rng(2)
    run(d, rng.integers(0, 8, 40).tolist(), Stats(), max_new_tokens=100, drafter="model")  # costs learned
    _Stall(d.drafters["model"].lm, clock, at=3)
    st = Stats()
    run(d, rng.integers(0, 8, 40).tolist(), st, max_new_tokens=200, drafter="model")
    assert st.rounds_by_drafter.get("model", 0) > 30, st.rounds_by_drafter
    st = Stats()
    run(d, rng.integers(0, 8, 40).tolist(), st, max_new_tokens=100, drafter="model")
    assert st.rounds_by_drafter.get("model", 0) > 15 and st.rounds_by_drafter.get("none", 0) < 5, st.rounds_by_drafter
    assert d.policy.measured.step_cost("model") < 0.003


def test_a_drafter_priced_out_by_its_step_cost_drafts_again_after_a_few_generations():
    """A step estimate far above the drafter's cost (a slow spell of the drafter alone, or a stall past the
    clip): the drafter is priced out and measures no step, but the estimate relaxes toward the prior every
    generation that renewed none, so within a few generations it drafts again, re-measured (before session
    32 it stayed out for good: 0 model rounds in every later generation on the Qwen pair)."""
    d, clock = _catchup_decoder(drafter_step=0.0015)
    rng = np.random.default_rng(4)
    run(d, rng.integers(0, 8, 40).tolist(), Stats(), max_new_tokens=100, drafter="model")
    cm = d.policy.measured
    assert cm.step_cost("model") < 0.003
    cm.draft_steps["model"] = 0.01  # four times what it measured, twice a target call
    rounds = []
    for _ in range(8):
        st = Stats()
        run(d, rng.integers(0, 8, 40).tolist(), st, max_new_tokens=100, drafter="model")
        rounds.append(st.rounds_by_drafter.get("model", 0))
    assert rounds[0] == 0 and rounds[-1] > 15, rounds  # out at first, drafting again later
    assert cm.step_cost("model") < 0.003  # re-measured
    pol = RoundPolicy()
    pol.measured.observe_target(1, 0.01)
    pol.measured.observe_draft(0.008)
    pol._stepped_at["model"] = 0
    pol.begin("none", {}, 1)  # (generation 1: generation 0 measured it)
    assert pol.measured.step_cost() == pytest.approx(0.008)
    pol.begin("none", {}, 1)  # the last generation measured no step: half way to the prior (0.4 x 0.01)
    assert pol.measured.step_cost() == pytest.approx(0.5 * 0.008 + 0.5 * 0.004)
    pol.measured.draft_steps["model"] = 0.001  # below the prior: kept, however stale
    for _ in range(3):
        pol.begin("none", {}, 1)
    assert pol.measured.step_cost() == pytest.approx(0.001)


def test_a_stall_moves_a_cost_estimate_little_and_a_real_slow_down_fully():
    from edgespec.policy import STALL_CLIP

    cm = CostModel()
    for _ in range(5):
        cm.observe_target(3, 0.005)
        cm.observe_draft(0.002)
    cm.observe_target(3, 0.5)
    cm.observe_draft(0.5)
    lift = 1 - cm.ema + cm.ema * STALL_CLIP  # (1.3)
    assert cm.target[3] == pytest.approx(0.005 * lift) and cm.step_cost() == pytest.approx(0.002 * lift)
    for _ in range(8):  # the device is now twice as slow: followed within a few calls
        cm.observe_target(3, 0.010)
        cm.observe_draft(0.004)
    assert cm.target[3] == pytest.approx(0.010, rel=0.05) and cm.step_cost() == pytest.approx(0.004, rel=0.05)
    for _ in range(12):  # and faster again (a fast sample is never clipped)
        cm.observe_draft(0.001)
    assert cm.step_cost() == pytest.approx(0.001, rel=0.1)


def test_the_width_probe_timings_seed_the_round_policy():
    """A CPU where the INT4 products are compute-bound (session 9's Zen 1: a 2-token call costs 1.4x
    a 1-token one): from the probe's timings the policy knows at once that a free drafter right 35
    times in 100 does not pay, where the prior slope (0.15 a token) would have it draft."""
    lm = FakeLM(8, seed=1)
    lm.width_seconds = {1: 0.050, 2: 0.070, 3: 0.103, 4: 0.137}
    d = Decoder(lm, ())
    assert d.policy.measured.target == lm.width_seconds
    assert d.policy.measured.best_k(0.35, 4, False)[0] == 0
    assert CostModel().best_k(0.35, 4, False)[0] >= 1
    assert Decoder(FakeLM(8, seed=1), ()).policy.measured.target == {}  # no probe: the priors


def test_a_catch_up_is_priced_from_the_targets_width_curve_until_measured():
    """Before the drafter's catch-up is measured, a context token costs it what one more token in a
    call costs the target (relative to a one-token call): on session 9's compute-bound CPU about 0.6
    of a step, six times the fixed prior of 0.1, which made a prompt's read look cheap."""
    cm = CostModel()
    cm.observe_draft(0.0167)
    assert cm.upfront_cost(100) == pytest.approx(100 * 0.1 * 0.0167)  # no widths measured: the prior
    for w, t in {1: 0.050, 2: 0.070, 3: 0.103, 4: 0.137}.items():
        cm.observe_target(w, t)
    assert cm.marginal() == pytest.approx(0.0291 / 0.050, rel=0.05)
    assert cm.upfront_cost(100) == pytest.approx(100 * cm.marginal() * 0.0167)
    flat = CostModel()  # a memory-bound target: the prior stays the floor
    flat.observe_draft(0.0167)
    for w, t in {1: 0.050, 2: 0.051, 4: 0.053}.items():
        flat.observe_target(w, t)
    assert flat.upfront_cost(100) == pytest.approx(100 * 0.1 * 0.0167)
    cm.observe_catchup(100, 0.5)  # once measured, the measurement
    assert cm.upfront_cost(100) == pytest.approx(0.5)


def test_model_drafter_offer_counts_the_tokens_it_must_read_first():
    from edgespec.kv import TokenBuffer

    lm = FakeLM(8, seed=1)
    md = ModelDrafter(lm, 8)
    sp = SamplingParams()
    ctx = TokenBuffer([1, 2, 3, 4, 5, 6], capacity=64)
    md.begin(ctx.tolist())
    assert md.offer(ctx, 4).upfront == 6  # stale: the whole context
    dr = md.draft(ctx, 2, sp, np.random.default_rng(0))
    assert dr.catchup[0] == 6 and dr.step_s is not None
    md.accept(0, 7)
    ctx.extend([7])
    assert md.offer(ctx, 4).upfront == 0  # one behind: part of a step
    assert md.draft(ctx, 1, sp, np.random.default_rng(0)).catchup is None
    md.accept(1, 2)
    ctx.extend([3, 2, 1, 0, 5])  # rounds drafted by others: five to read
    assert md.offer(ctx, 4).upfront == 5
    # a new chat turn extending this one: only the new part is read
    turn = ctx.tolist() + [4, 4]
    md.begin(turn)
    md.accept(0, 0)
    assert md.offer(TokenBuffer(turn, capacity=64), 4).upfront == len(turn) - lm.length
    assert md.draft(TokenBuffer(turn, capacity=64), 1, sp, np.random.default_rng(0)).catchup[0] < len(turn)


def _run_lengths(pol, drafters, lengths):
    """Generations of these many tokens each (rounds of one token) through ``pol``."""
    from edgespec.kv import TokenBuffer

    for n in lengths:
        pol.begin("auto", drafters, 1)
        ctx = TokenBuffer([1, 2], capacity=64)
        for _ in range(n):
            pol.observe(pol.choose(ctx, 50, None, 1), [], 0, None, 1, 0.01)


def test_the_horizon_follows_how_long_generations_run():
    from edgespec.kv import TokenBuffer

    pol = RoundPolicy()
    drafters = {"copy": _Oracle("copy", False, lambda i: i % 5)}
    assert pol.horizon(99) == 100  # nothing learned: the budget
    for _ in range(3):
        pol.begin("auto", drafters, 1)
        ctx = TokenBuffer([1, 2], capacity=64)
        for _ in range(10):  # ten rounds of two tokens
            c = pol.choose(ctx, 50, None, 1)
            pol.observe(c, [0], 1, None, 2, 0.01)
    pol.begin("auto", drafters, 1)
    assert pol.horizon(99) == 20 and pol.horizon(5) == 6
    pol.observe(NO_DRAFT, [], 0, None, 1, 0.01)
    assert pol.horizon(99) == 19
    for _ in range(3):
        pol.observe(NO_DRAFT, [], 0, None, 1, 0.01)
    assert pol.horizon(99) == 16
    for _ in range(6):
        pol.observe(NO_DRAFT, [], 0, None, 1, 0.01)
    assert pol.horizon(99) == 16  # 10 tokens left of the recent lengths, but at least 16 more (session 79, Q74)
    for _ in range(10):
        pol.observe(NO_DRAFT, [], 0, None, 1, 0.01)
    # at every recent length (20), none of them ran past this point: as many again as it has produced (a length
    # that ended here is not one that goes on for 0 more tokens: session 79, mutant Q73)
    assert pol.horizon(99) == 20
    for _ in range(4):
        pol.observe(NO_DRAFT, [], 0, None, 1, 0.01)
    assert pol.horizon(99) == 24  # past every recent length: as many again as it has produced
    assert pol.horizon(9) == 10
    pol.begin("auto", drafters, 1, reproducible=True)  # never what earlier generations did
    assert pol.horizon(99) == 100
    for _ in range(5):
        pol.observe(NO_DRAFT, [], 0, None, 1, 0.01)
    pol.begin("auto", drafters, 1)  # nor, for those after it, what it did (session 78, mutant Q37): a reproducible
    # generation teaches nothing (its length no more than its acceptance or costs); the lengths 24, 20, 20, 20
    assert pol.horizon(99) == pytest.approx((24 + 20 * (0.7 + 0.7 ** 2 + 0.7 ** 3)) / (1 + 0.7 + 0.7 ** 2 + 0.7 ** 3))


def test_the_horizon_reads_the_generations_that_ran_longer():
    """A chat front end asks for a title and tags (~10 tokens) after each reply (~100): a reply that has
    run past the short ones is expected to run as the long ones did, not to end within 16 tokens (before
    session 32 the horizon was the average of all of them minus what was produced, floored at 16, and a
    model drafter whose read that did not repay was never started in a long reply)."""
    pol = RoundPolicy()
    drafters = {"copy": _Oracle("copy", False, lambda i: i % 5)}
    _run_lengths(pol, drafters, [100, 10, 10, 100, 10, 10])
    pol.begin("auto", drafters, 1)
    w = [0.7 ** i for i in range(6)]  # newest first: 10, 10, 100, 10, 10, 100
    lengths = [10, 10, 100, 10, 10, 100]
    assert pol.horizon(199) == pytest.approx(sum(a * b for a, b in zip(w, lengths)) / sum(w))
    for _ in range(12):
        pol.observe(NO_DRAFT, [], 0, None, 1, 0.01)
    assert pol.horizon(199) == pytest.approx(88)  # only the long ones ran past 12 tokens
    assert pol.horizon(40) == 41
    from collections import deque

    assert isinstance(pol._lengths, deque) and pol._lengths.maxlen is not None  # a bounded memory


def _next_token(i: int) -> int:
    """The scripted target's token at position ``i`` (the policy tests' stand-in for what the target emits)."""
    return 10 + (i * 7) % 50


class _Oracle:
    """A drafter for RoundPolicy alone: proposes the target's next token (``right``) or another one."""

    def __init__(self, name, has_cost, nxt):
        self.name, self.has_cost, self.nxt, self.right = name, has_cost, nxt, True

    def guess(self, ctx):
        t = self.nxt(len(ctx))
        return t if self.right else t + 1

    def offer(self, ctx, kmax):
        from edgespec.drafters import Offer

        return Offer(self.name, 1, prior=(1.5, 0.5) if self.has_cost else (1.0, 1.0))

    def peek(self, ctx, k):
        return [self.guess(ctx)], self.name


def test_plain_decoding_begins_no_drafter_not_even_to_fill_a_wide_calls_spare_position():
    """(session 78, mutant Q41) ``none`` is plain decoding: no drafter is begun (a suffix drafter's or prompt
    lookup's index of the prompt is work for nothing) even where the target computes two positions a call, which
    a named costly drafter's generation fills with a free drafter's guess (those are begun beside it)."""
    from edgespec.kv import TokenBuffer

    copy, model = _Oracle("copy", False, lambda i: i % 5), _Oracle("model", True, lambda i: i % 5)
    drafters = {"copy": copy, "model": model}
    pol = RoundPolicy()
    assert pol.begin("none", drafters, 2) == []
    assert pol.choose(TokenBuffer([1, 2, 3], capacity=64), 10, None, 4) is NO_DRAFT
    assert pol.begin("model", drafters, 2) == [model, copy]
    assert pol.begin("auto", drafters, 2) == [copy, model]


def _policy_rounds(pol, drafters, rounds, model_right):
    """``rounds`` one-token rounds of ``auto``; the model's draft is right where ``model_right(i)``.
    Returns the names chosen."""
    from edgespec.kv import TokenBuffer

    pol.begin("auto", {d.name: d for d in drafters}, 2)
    ctx = TokenBuffer([1, 2, 3], capacity=4096)
    nxt = drafters[0].nxt
    chosen = []
    for i in range(rounds):
        c = pol.choose(ctx, 1, None, 1)
        d = c.drafter
        chosen.append(d.name if d else "none")
        tokens = [] if d is None else [d.guess(ctx) if d.has_cost is False or model_right(i) else nxt(len(ctx)) + 1]
        n = int(bool(tokens) and tokens[0] == nxt(len(ctx)))
        pol.observe(c, tokens, n, 0.3 if d is not None and d.has_cost else None, 2, 1.12)
        ctx.extend([nxt(len(ctx))] + ([nxt(len(ctx) + 1)] if n else []))
    return chosen


def test_auto_stops_trusting_a_drafter_within_a_generation_where_it_stops_agreeing():
    """Acceptance is judged per generation, starting from what earlier generations learned: a free
    drafter right on every round of one request (a document it copies) and wrong on every round of
    the next is dropped within a few rounds there, not after the ~20 a running average over all
    generations needs to forget (the model drafter, right 4 rounds in 5, takes over)."""
    nxt = _next_token
    free, model = _Oracle("copy", False, nxt), _Oracle("model", True, nxt)
    pol = RoundPolicy()
    pol.measured.observe_target(2, 1.12)
    pol.measured.observe_draft(0.3, "model")
    first = _policy_rounds(pol, [free, model], 60, lambda i: i % 5 != 0)
    assert first.count("copy") > 50  # free and always right: auto drafts with it
    assert pol.learned["copy"].alpha > 0.9
    free.right = False
    second = _policy_rounds(pol, [free, model], 40, lambda i: i % 5 != 0)
    assert second[:30].count("copy") <= 8, second
    assert second[10:].count("model") >= 25
    assert pol.learned["copy"].alpha < 0.5  # and the learned estimate followed


def test_greedy_and_sampled_generations_learn_acceptance_apart():
    """What greedy generations learned of a drafter does not carry into a sampled one (a point-mass draft
    is accepted with the target's probability of it there, not whenever it is the argmax), and the other
    way round; each regime carries its own into its next generation."""
    from edgespec.kv import TokenBuffer

    nxt = _next_token
    free = _Oracle("copy", False, nxt)
    pol = RoundPolicy()
    pol.measured.observe_target(2, 1.12)
    _policy_rounds(pol, [free], 40, lambda i: True)  # greedy: right every round
    assert pol.learned["copy"].alpha > 0.9 and "copy" not in pol.learned_sampled
    pol.begin("auto", {"copy": free}, 2, sampled=True)
    est = pol.estimate(free.offer(TokenBuffer([1, 2, 3], capacity=64), 1))
    assert est.alpha == pytest.approx(0.5)  # the offer's own prior (1, 1), not greedy's 0.9+
    free.right = False
    ctx = TokenBuffer([1, 2, 3], capacity=4096)
    for _ in range(30):  # sampled: wrong every round it drafts
        c = pol.choose(ctx, 1, None, 1)
        tokens = [] if c.drafter is None else [free.guess(ctx)]
        pol.observe(c, tokens, 0, None, 2, 1.12)
        ctx.extend([nxt(len(ctx))])
    assert pol.learned_sampled["copy"].alpha < 0.3
    assert pol.learned["copy"].alpha > 0.9  # greedy's estimate untouched
    pol.begin("auto", {"copy": free}, 2)  # a greedy generation starts from greedy's estimate again
    assert pol.estimate(free.offer(ctx, 1)).alpha > 0.8


class _CatchUp:
    """A costly drafter that must read the context before its first draft of a generation (as the
    model drafter does), right or wrong as told."""

    name, has_cost = "model", True

    def __init__(self):
        self.started = False

    def offer(self, ctx, kmax):
        from edgespec.drafters import Offer

        return Offer(self.name, 1, prior=(1.5, 0.5), upfront=0 if self.started else 50)


def _catch_up_generation(pol, d, right, rounds=40, read=None):
    """One generation of ``auto`` with only ``d`` (right every round, or every other one: ``right``
    0.5): returns the rounds it drafted. ``read``: the (tokens, seconds) its first draft's catch-up
    is observed to take (None: not observed)."""
    from edgespec.kv import TokenBuffer

    nxt = _next_token
    pol.begin("auto", {d.name: d}, 1)
    d.started = False
    ctx, used = TokenBuffer([1, 2, 3], capacity=4096), 0
    for _ in range(rounds):
        c = pol.choose(ctx, 60, None, 1)
        tokens = []
        catchup = None
        if c.drafter is not None:
            ok = right is True or used % 2 == 0
            catchup = read if not d.started else None
            d.started, used = True, used + 1
            tokens = [nxt(len(ctx)) if ok else nxt(len(ctx)) + 1]
        n = int(bool(tokens) and tokens[0] == nxt(len(ctx)))
        pol.observe(c, tokens, n, 0.3 if tokens else None, len(tokens) + 1, 1.0 + 0.12 * len(tokens), catchup=catchup)
        ctx.extend([nxt(len(ctx))] + ([nxt(len(ctx) + 1)] if n else []))
    return used


@pytest.mark.parametrize("half_life", [2.0, float("inf")])
def test_a_drafter_with_a_catch_up_is_tried_again_after_a_bad_request(half_life):
    """A drafter that reads the context before drafting is never probed mid-generation (a probe is a
    step, not a prefill), so once one request taught a low acceptance, nothing would re-measure it.
    Two rules keep it from a lock-out (session 11's bench, then session 12's at T = 0.7): before its
    first draft of a generation it is judged at no less than its prior, and a learned estimate that
    no generation updates relaxes toward the prior (``stale_half_life``; its own test below)."""
    pol = RoundPolicy(stale_half_life=half_life)
    pol.measured.observe_target(1, 1.0)
    pol.measured.observe_target(2, 1.12)
    pol.measured.observe_draft(0.3, "model")
    pol.measured.observe_catchup(50, 6.0, "model")  # a long read: worth it above ~0.58 acceptance
    d = _CatchUp()
    assert _catch_up_generation(pol, d, True) > 30  # from its prior it starts, and keeps drafting
    # a request where it is right half the time: it keeps drafting (that still pays once read), and
    # what is learned falls below what pays for the next request's read
    assert _catch_up_generation(pol, d, 0.5) > 30
    assert pol.learned["model"].alpha < 0.58
    later = [_catch_up_generation(pol, d, True) for _ in range(4)]
    assert all(u > 30 for u in later), later  # judged at its prior (0.75) before its first draft: started
    # a read its prior cannot repay either: not started
    pol.measured.catchup_reads.clear()
    pol.measured.observe_catchup(50, 60.0, "model")
    assert _catch_up_generation(pol, d, True) == 0


class _Copy:
    """A free drafter for RoundPolicy alone: offers ``k`` tokens a round at a prior acceptance of
    ``alpha``, except every ``gap``-th round of a generation (nothing to copy there; 0: never)."""

    has_cost = False

    def __init__(self, k, alpha=0.6, gap=0, name="copy"):
        self.name, self.k, self.alpha, self.gap, self.asked = name, k, alpha, gap, 0

    def offer(self, ctx, kmax):
        from edgespec.drafters import Offer

        self.asked += 1
        if not self.k or (self.gap and self.asked % self.gap == 0):
            return None
        return Offer(self.name, min(self.k, kmax), prior=(10 * self.alpha, 10 * (1 - self.alpha)))


def _read_generation(pol, free, kept, rounds=40):
    """One generation of ``auto`` with ``free`` (whose drafts keep ``kept`` tokens) and a model
    drafter that must read 50 tokens first (a _CatchUp, every draft token right). Returns the
    rounds' drafter names."""
    from edgespec.kv import TokenBuffer

    model = _CatchUp()
    free.asked = 0
    pol.begin("auto", {free.name: free, model.name: model}, 1)
    ctx, chosen = TokenBuffer([1, 2, 3], capacity=4096), []
    for _ in range(rounds):
        c = pol.choose(ctx, 60, None, 8)
        d = c.drafter
        chosen.append(d.name if d is not None else "none")
        tokens = list(range(c.k)) if d is not None else []
        n = len(tokens) if d is model else min(kept, len(tokens))
        if d is model:
            model.started = True
        pol.observe(c, tokens, n, 0.3 if d is model else None, len(tokens) + 1, 1.0 + 0.02 * len(tokens))
        ctx.extend([7] * (n + 1))
    return chosen


def _priced_policy(**kw):
    pol = RoundPolicy(**kw)
    for w in range(1, 10):  # flat to a few tokens, as on session 25's Zen 4
        pol.measured.observe_target(w, 1.0 + 0.02 * (w - 1))
    pol.measured.observe_draft(0.3, "model")
    pol.measured.observe_catchup(50, 2.5, "model")  # a first read of 2.5 one-token target calls
    return pol


def test_a_costly_read_is_priced_by_the_rounds_it_would_win_not_by_the_tokens_free_drafters_left():
    """A summary (session 25): the suffix drafter offers copies in most rounds and keeps half of each,
    so half the tokens are 'uncovered', yet its offers beat the model drafter's rate in every round
    it makes one. The model drafter would win only the rounds with nothing to copy: its read is
    priced against those (costly_share) and not made. The old pricing (the share held at 1,
    ``share_prior`` huge), planted, makes the read in a round with no copy and then drafts little."""
    new = _read_generation(_priced_policy(), _Copy(4, 0.6, gap=8), kept=2)
    assert "model" not in new, new
    old = _read_generation(_priced_policy(share_prior=1e12), _Copy(4, 0.6, gap=8), kept=2)
    assert "model" in old, old


def test_a_costly_read_still_pays_where_the_free_drafters_lose_their_rounds():
    """Where the free drafters offer nothing (new code, an answer in the model's own words), or offer
    but guess badly (their rate below the caught-up model drafter's), the rounds are the model
    drafter's: it reads at the first round, as before, and drafts the rest."""
    for free, kept in ((_Copy(0), 0), (_Copy(2, 0.1), 0)):
        chosen = _read_generation(_priced_policy(), free, kept)
        assert chosen[0] == "model" and chosen.count("model") >= len(chosen) - 3, chosen


def test_choose_counts_the_rounds_a_caught_up_costly_drafter_wins():
    """choose() counts, per round, whether the costly drafter's offer (priced without a read) beat every
    free one: with a copy drafter that offers every other round and wins those, and a caught-up model
    drafter that wins the rest, half the rounds are the model drafter's. A planted bug that never
    counted a win (the share falling to the prior's weight alone) fails here."""
    from edgespec.kv import TokenBuffer

    pol, model, copy = _priced_policy(), _CatchUp(), _Copy(4, 0.6, gap=2)
    model.started = True  # caught up: no read in the way, each round priced as it is
    pol.begin("auto", {copy.name: copy, model.name: model}, 1)
    ctx = TokenBuffer([1, 2, 3], capacity=4096)
    for _ in range(20):
        c = pol.choose(ctx, 60, None, 8)
        n = c.k if c.drafter is model else min(2, c.k)
        pol.observe(c, list(range(c.k)), n, 0.3 if c.drafter is model else None, c.k + 1, 1.0 + 0.02 * c.k)
        ctx.extend([7] * (n + 1))
    assert pol._rounds == 20 and pol._costly_rounds == 10, (pol._rounds, pol._costly_rounds)
    assert pol.costly_share() == pytest.approx(11 / 21)
    with pytest.raises(ValueError):
        RoundPolicy(share_prior=0)
    with pytest.raises(ValueError):  # (mutant PO22)
        RoundPolicy(share_prior=float("inf"))


def test_costly_share_is_the_rounds_won_with_a_prior_and_starts_afresh_each_generation():
    pol = RoundPolicy(share_prior=1.0)
    pol.begin("auto", {}, 1)
    assert pol.costly_share() == 1.0  # no round yet: the prior
    pol._rounds, pol._costly_rounds = 3, 0
    assert pol.costly_share() == pytest.approx(1 / 4)
    pol._rounds, pol._costly_rounds = 3, 3
    assert pol.costly_share() == 1.0
    pol.begin("auto", {}, 1)
    assert pol._rounds == 0 and pol.costly_share() == 1.0  # per generation


@pytest.mark.parametrize("half_life", [2.0, float("inf")])
def test_one_slow_catch_up_does_not_keep_the_drafter_out_for_good(half_life):
    """A drafter priced out by a slow read is never started, so never reads again: its measured
    catch-up cost relaxes toward the prior once no generation renews it (``catchup_trust``), and it
    is started again, which re-measures it (session 19: one first read that paid the kernel's weight
    copy kept `auto` from drafting code). With the relaxing off (an infinite half-life) it stays out."""
    from edgespec.kv import TokenBuffer

    pol = RoundPolicy(stale_half_life=half_life)
    pol.measured.observe_target(1, 1.0)
    pol.measured.observe_target(2, 1.12)
    pol.measured.observe_draft(0.3, "model")
    d = _CatchUp()
    pol.begin("auto", {d.name: d}, 1)
    d.started = False
    c = pol.choose(TokenBuffer([1, 2, 3], capacity=4096), 60, None, 1)
    assert c.drafter is d  # priced at the prior, it starts
    pol.observe(c, [10], 1, 0.3, 2, 1.12, catchup=(50, 60.0))  # ... and its read was pathologically slow
    assert pol.cost.upfront_cost(50, "model") == pytest.approx(60.0)
    drafted = [_catch_up_generation(pol, d, True, read=(50, 0.6)) for _ in range(14)]
    assert drafted[0] == 0  # the next generation trusts the read: not started
    if half_life == float("inf"):
        assert drafted == [0] * 14
    else:
        assert any(drafted), drafted  # relaxed toward the prior within a few generations: started again
        first = next(i for i, n in enumerate(drafted) if n)
        assert 2 <= first <= 8 and drafted[first] > 30, drafted
        # ... and its new, ordinary read replaced the slow one: it keeps drafting
        assert all(n > 30 for n in drafted[first:]), drafted
        assert pol.measured.upfront_cost(50, "model") == pytest.approx(0.6)


def test_a_stale_learned_estimate_relaxes_toward_the_prior():
    pol = RoundPolicy(stale_half_life=2.0)
    d = _CatchUp()
    _catch_up_generation(pol, d, 0.5)  # teaches a low estimate
    low = pol.learned["model"].alpha
    offer = d.offer(None, 1)
    prior = offer.prior[0] / sum(offer.prior)
    seen = []
    for _ in range(4):  # generations that never update it
        pol.begin("none", {d.name: d}, 1)
        pol.acceptance.clear()
        est = pol.estimate(offer)
        seen.append(est.prior_accept / (est.prior_accept + est.prior_reject))
    # the next generation starts from what was learned; each later one that skipped it, closer to the prior
    assert seen[0] == pytest.approx(low) and low < seen[1] < seen[2] < seen[3] < prior
    assert seen[1] - low == pytest.approx((prior - low) * (1 - 0.5 ** (1 / 2.0)), rel=1e-6)


# -- session 79: the rest of policy.py's mutation test (docs/bench/mutation_s78.md) --------------

class _Dynamic:
    """A costly drafter that ends its draft on its confidence (as the model drafter does), checks a free drafter's
    guess in its first call where ``takes_hint``, and must read ``behind`` context tokens first (0: none)."""

    name, has_cost = "model", True

    def __init__(self, takes_hint=False, behind=0, dynamic=True):
        self.takes_hint, self.behind, self.dynamic = takes_hint, behind, dynamic

    def offer(self, ctx, kmax):
        return Offer(self.name, kmax, prior=(1.5, 0.5), upfront=self.behind, dynamic=self.dynamic)


def test_a_free_drafter_that_drafts_a_round_is_not_scored_again_as_a_shadow():
    """(session 79, mutant Q57) A free drafter's guess is scored once a round: by the round's outcome where it
    drafted, on what the target emitted (a shadow) where another drafter did. Scored twice, the free drafter that
    wins the rounds would count each of them double and its estimate would move twice as fast as the others'."""
    from edgespec.kv import TokenBuffer

    nxt = _next_token
    a, b = _Oracle("a", False, nxt), _Oracle("b", False, nxt)
    pol = RoundPolicy()
    pol.begin("auto", {"a": a, "b": b}, 1)
    ctx = TokenBuffer([1, 2, 3], capacity=64)
    for _ in range(5):
        c = pol.choose(ctx, 8, None, 1)
        assert c.drafter is a  # (two equal offers: the earlier)
        pol.observe(c, [a.guess(ctx)], 1, None, 2, 0.01)
        ctx.extend([nxt(len(ctx)), nxt(len(ctx) + 1)])
    pol.choose(ctx, 8, None, 1)  # (scores the last round's shadow)
    assert pol.acceptance["a"].samples == 5 and pol.acceptance["b"].samples == 5


def test_a_costly_drafter_left_unused_is_probed_every_probe_every_rounds_and_its_count_restarts():
    """(session 79, mutants Q59, Q91) A costly drafter that no round chose drafts one token after ``probe_every``
    rounds left unused (its estimate would otherwise never recover), and the count starts again from that round: a
    probe every ``probe_every`` + 1 rounds, not one a round once the first is due, nor one round late."""
    from edgespec.kv import TokenBuffer

    nxt = _next_token
    copy, model = _Oracle("copy", False, nxt), _Oracle("model", True, nxt)
    pol = RoundPolicy(probe_every=4)
    pol.measured.observe_target(2, 1.12)
    pol.measured.observe_draft(0.3, "model")
    pol.begin("auto", {"copy": copy, "model": model}, 1)
    ctx, probes = TokenBuffer([1, 2, 3], capacity=256), []
    for i in range(15):
        c = pol.choose(ctx, 8, None, 1)
        assert c.drafter is (model if c.probe else copy)
        probes += [i] if c.probe else []
        pol.observe(c, [c.drafter.guess(ctx)], 1, 0.3 if c.probe else None, 2, 1.12)
        ctx.extend([nxt(len(ctx)), nxt(len(ctx) + 1)])
    assert probes == [4, 9, 14]


def test_a_wide_calls_spare_position_takes_the_likeliest_free_guess():
    """(session 79, mutant Q62) Where the target computes two positions a call anyway (``min_width`` 2) and the
    drafter asked for (``--drafter model``) drafts nothing this round, the spare position takes a free drafter's
    one-token guess: the one most likely kept, whatever the drafters' order; with one position a call, none."""
    from edgespec.kv import TokenBuffer

    class Silent:
        name, has_cost = "model", True

        def offer(self, ctx, kmax):
            return None

    low, high, model = _Copy(1, 0.3, name="low"), _Copy(1, 0.8, name="high"), Silent()
    ctx = TokenBuffer([1, 2, 3], capacity=64)
    pol = RoundPolicy()
    for order in ((low, high), (high, low)):
        pol.begin("model", {**{d.name: d for d in order}, "model": model}, 2)
        c = pol.choose(ctx, 8, None, 4)
        assert (c.drafter, c.k, c.key) == (high, 1, "high")
    pol.begin("model", {"low": low, "high": high, "model": model}, 1)
    assert pol.choose(ctx, 8, None, 4) is NO_DRAFT


def test_the_stop_threshold_is_bounded_and_a_hints_scaled_by_what_a_verified_position_costs():
    """(session 79, mutants Q58, Q70, Q72) A dynamic draft goes on while its confidence P > (c + m) x rate / alpha
    (``stop_threshold``: c a drafter step, m one more verified position), kept within 0.05..0.95. Through a hint
    the drafter agrees with, one more token costs m alone (its logits came with the hint): the threshold there,
    ``Choice.hint_stop``, is the stop's times m / (c + m) (``hinted_share``)."""
    from edgespec.kv import TokenBuffer

    nxt = _next_token
    pol = RoundPolicy()
    pol.measured.observe_target(1, 1.0)
    pol.measured.observe_target(2, 1.1)  # m = 0.1 s
    pol.measured.observe_draft(0.2, "model")  # c = 0.2 s
    copy, model = _Oracle("copy", False, nxt), _Dynamic(takes_hint=True)
    pol.begin("auto", {"copy": copy, "model": model}, 1)
    assert pol.stop_threshold(0.75, 1.5, "model") == pytest.approx(0.3 * 1.5 / 0.75)
    assert pol.stop_threshold(0.75, 10.0, "model") == 0.95 and pol.stop_threshold(0.75, 0.01, "model") == 0.05
    assert pol.hinted_share("model") == pytest.approx(0.1 / 0.3)
    ctx = TokenBuffer([1, 2, 3], capacity=64)
    c = pol.choose(ctx, 8, None, 4)
    assert c.drafter is model and c.hint == (copy.guess(ctx),)  # the copy's one-token guess, checked in its call
    assert 0.05 < c.stop < 0.95
    assert c.hint_stop == pytest.approx(c.stop / 3)


def test_a_hint_is_not_priced_into_a_round_that_reads_first_unless_asked():
    """(session 80, mutant Q52 of mutation_s78.md) Where the model drafter must read the context before drafting (its
    first round of a generation), the hint still goes in with its first step (c63203e), but the round is priced as
    an unhinted one: its stop threshold is the one with no free drafter at all. ``hint_first_reads`` (the A/B's
    handle, scripts/ab_hint_first_read.py: session 80, `auto` 1.003x over three passes of 28 prompts) prices it as
    a caught-up drafter's hinted round."""
    from edgespec.kv import TokenBuffer

    def choose(behind, free=True, priced=False):
        pol = RoundPolicy()
        pol.hint_first_reads = priced
        pol.measured.observe_target(1, 1.0)
        pol.measured.observe_target(2, 1.1)
        pol.measured.observe_draft(0.2, "model")
        model = _Dynamic(takes_hint=True, behind=behind)
        pol.begin("auto", {"copy": _Oracle("copy", False, _next_token), "model": model} if free else {"model": model}, 1)
        c = pol.choose(TokenBuffer([1, 2, 3], capacity=64), 8, None, 4)
        assert c.drafter is model and c.k == 4
        return c

    reads, caught_up = choose(2), choose(0)
    assert reads.hint == caught_up.hint == (_next_token(3),)
    assert reads.stop == pytest.approx(choose(2, free=False).stop) and reads.stop < caught_up.stop
    assert choose(2, priced=True).stop == pytest.approx(caught_up.stop)


def test_a_dynamic_draft_that_pays_by_its_first_token_alone_stops_at_that_drafts_rate():
    """(session 79, mutant Q53) Where a costly drafter's estimate (its tokens past the first) alone would draft
    nothing but its first tokens' (FIRST_KEY) makes a draft pay, the stop threshold values a kept token at that
    draft's rate, not plain decoding's. (Where the two rates differ the threshold is seldom below its bound: here
    a one-token call much cheaper than the wider ones, whose rows past the second are nearly free.)"""
    from edgespec.kv import TokenBuffer
    from edgespec.policy import Acceptance

    pol = RoundPolicy()
    for w, s in {1: 1.0, 2: 1.3, 3: 1.31, 4: 1.32, 5: 1.33}.items():
        pol.measured.observe_target(w, s)
    pol.measured.observe_draft(0.05, "model")
    model = _Dynamic()
    pol.begin("model", {"model": model}, 1)
    pol.acceptance["model"], pol.acceptance["model@1"] = Acceptance(0.3, 0.7), Acceptance(0.95, 0.05)
    assert pol.cost.best_k(0.3, 4, True, "model")[0] == 0
    k1, r1 = pol.cost.best_k(0.3, 4, True, "model", first=0.95)
    c = pol.choose(TokenBuffer([1, 2, 3], capacity=64), 8, None, 4)
    assert c.drafter is model and k1 > 0
    assert c.stop == pytest.approx(pol.stop_threshold(0.3, r1, "model")) and c.stop < 0.9


def test_a_costly_drafter_that_has_drafted_is_judged_on_its_estimate_when_it_must_read_again():
    """(session 79, mutant Q90) A costly drafter is judged at no less than its prior before its first draft of a
    generation only (one that must read the context first would otherwise never learn what it is worth there):
    once it drafted, a read it needs again (the free drafters drafted the rounds since) is priced at what its
    rounds kept. Wrong every round, it stops within a few (floored at its prior for good, it would draft them all)."""
    from edgespec.kv import TokenBuffer

    pol = RoundPolicy()
    pol.measured.observe_target(1, 1.0)
    pol.measured.observe_target(2, 1.12)
    pol.measured.observe_draft(0.3, "model")
    pol.measured.observe_catchup(5, 0.01, "model")
    model = _Dynamic(behind=5, dynamic=False)
    pol.begin("model", {"model": model}, 1)
    ctx, drafted = TokenBuffer([1, 2, 3], capacity=256), 0
    for _ in range(20):
        c = pol.choose(ctx, 60, None, 1)
        if c.drafter is model:
            drafted += 1
            pol.observe(c, [99], 0, 0.3, 2, 1.12, catchup=(5, 0.01))
        else:
            pol.observe(c, [], 0, None, 1, 1.0)
        ctx.extend([7])
    assert 1 <= drafted <= 3, drafted


def test_a_reproducible_generation_prices_alternates_at_the_prior_step_whatever_its_drafting_took():
    """(session 79, mutant Q81) A seeded sampled generation's choices depend on its own tokens alone: which
    alternates it verifies is priced at the prior's drafter steps, never at the seconds its drafting took (those
    price a timed generation's)."""
    p = RoundPolicy()
    alts = [(0, 11, 0.9, 0.05), (1, 12, 0.5, 0.30)]
    p.begin("none", {}, 1, reproducible=True)
    assert p.alternates(2, alts, room=8, draft_s=0.0) == p.alternates(2, alts, room=8, draft_s=100.0) == [(1, 12)]
    p.begin("none", {}, 1)
    assert p.alternates(2, alts, room=8, draft_s=100.0) == [(1, 12), (0, 11)]


def test_the_alternates_calibration_settles_at_how_much_more_often_they_are_kept():
    """(session 79, mutant Q82) An alternate kept 1.5 times as often as the drafter's second-choice probability
    says: the calibration (``alternate_scale``) settles at 1.5. It compares what was kept with what the raw
    probabilities expected (compared with the scaled expectation instead, it would settle at the square root)."""
    p = RoundPolicy()
    for w in range(1, 9):
        p.measured.observe_target(w, 0.02)
    alts = [(0, 11, 0.9, 0.2)]
    for i in range(600):
        assert p.alternates(1, alts, room=1, draft_s=0.01) == [(0, 11)]
        p.observe_alternates(i % 10 in (0, 3, 6))  # kept 0.3 of the time, said 0.2
    assert p.alternate_scale() == pytest.approx(1.5, rel=0.08)


def test_a_kept_alternate_counts_in_the_generations_length():
    """(session 79, mutant Q84) A round whose alternate the target kept produced one token more: the horizon the
    next generation reads counts it (ten rounds of a drafted token rejected, its alternate kept, and the bonus:
    20 tokens, not 10)."""
    from edgespec.kv import TokenBuffer

    nxt = _next_token
    pol, drafters = RoundPolicy(), {"copy": _Oracle("copy", False, nxt)}
    pol.begin("auto", drafters, 1)
    ctx = TokenBuffer([1, 2, 3], capacity=64)
    for _ in range(10):
        c = pol.choose(ctx, 50, None, 1)
        pol.observe_alternates(True)
        pol.observe(c, [99], 0, None, 3, 0.01, alternates=1)
    pol.begin("auto", drafters, 1)
    assert pol.horizon(99) == 20


# -- a new drafter is one class and a registration ------------------------------------------

class RepeatDrafter:
    """Drafts the last token again k times: free, often wrong, and enough to show the protocol."""

    name = "repeat"
    has_cost = False

    @classmethod
    def build(cls, env):
        return cls()

    def begin(self, prompt):
        self.rounds = 0

    def reset(self):
        pass

    def offer(self, ctx, kmax):
        from edgespec.drafters import Offer

        return Offer(self.name, kmax)

    def draft(self, ctx, k, sp, rng):
        from edgespec.drafters import Draft

        self.rounds += 1
        return Draft([ctx[-1]] * k, key=self.name)

    def accept(self, n, bonus):
        pass


def test_a_registered_drafter_is_used_by_name_and_by_auto(monkeypatch):
    from edgespec.drafters import DRAFTERS, drafter_choices

    monkeypatch.setitem(DRAFTERS, "repeat", RepeatDrafter)
    assert "repeat" in drafter_choices()
    for min_width in (1, 2):
        for drafter, k in (("repeat", None), ("repeat", 3), ("auto", None)):
            for seed in range(6):
                target = FakeLM(8, seed=seed, min_width=min_width)
                rep = RepeatDrafter()
                d = Decoder(target, (), drafters=[rep, PromptLookupDrafter()])
                ref, _ = run(make(seed=seed, min_width=min_width), [1, 2, 3], max_new_tokens=40, drafter="none")
                st = Stats()
                got, _ = run(d, [1, 2, 3], st, max_new_tokens=40, drafter=drafter, draft_tokens=k)
                assert got == ref, (drafter, k, seed)
                if drafter == "repeat" and k:
                    assert st.rounds_by_drafter.get("repeat", 0) == rep.rounds > 0


def test_a_registered_drafter_is_built_by_load(monkeypatch, tiny_bundle):
    import edgespec
    from edgespec.drafters import DRAFTERS

    monkeypatch.setitem(DRAFTERS, "repeat", RepeatDrafter)
    eng = edgespec.load(tiny_bundle, max_context=256)
    assert isinstance(eng.decoder.drafters["repeat"], RepeatDrafter)
    ref = eng.generate("def hello(world):", max_new_tokens=24, drafter="none")
    got = eng.generate("def hello(world):", max_new_tokens=24, drafter="repeat", draft_tokens=2)
    assert got.token_ids == ref.token_ids and got.stats["rounds_by_drafter"].get("repeat")


# -- a seed reproduces a sampled generation ----------------------------------------------------

class JitterClock(SimClock):
    """Simulated time with noise on every reading: measured call times differ run to run."""

    def __init__(self, seed):
        super().__init__()
        self.rng = np.random.default_rng(seed)

    def __call__(self) -> float:
        self.t += float(self.rng.exponential(0.002))
        return self.t


def _jittery_decoder(jitter_seed, min_width=2):
    clock = JitterClock(jitter_seed)
    target = FakeLM(8, seed=4, sharpness=1.5, delay=(0.004, 0.0005), clock=clock, min_width=min_width)
    dl = FakeLM(8, table=target.table + np.random.default_rng(9).normal(0, 0.7, target.table.shape),
                delay=(0.0015, 0.0), clock=clock)
    return Decoder(target, (), drafters=[ModelDrafter(dl, 8, clock=clock), PromptLookupDrafter()], clock=clock)


def test_seeded_sampling_does_not_depend_on_timings_or_earlier_generations():
    """Issue: the policy read the wall clock, so one seed gave several outputs. With a seed, a
    sampled generation's drafting choices depend on its own tokens only."""
    for drafter in ("auto", "model", "prompt-lookup"):
        kw = dict(max_new_tokens=60, temperature=0.9, top_p=0.9, seed=42, drafter=drafter)
        outs = set()
        shared = _jittery_decoder(0)
        for j in range(4):
            outs.add(tuple(run(_jittery_decoder(j + 1), [1, 2, 3, 1, 2], **kw)[0]))  # fresh, other timings
            outs.add(tuple(run(shared, [1, 2, 3, 1, 2], **kw)[0]))  # one decoder, its history growing
        assert len(outs) == 1, (drafter, len(outs))
    # the premise: unseeded timings do steer the choices (else the test above could not fail)
    rounds = set()
    for j in range(4):
        st = Stats()
        run(_jittery_decoder(j + 1), [1, 2, 3, 1, 2], st, max_new_tokens=60, drafter="auto")
        rounds.add(tuple(sorted(st.rounds_by_drafter.items())))
    assert len(rounds) > 1


def test_seed_reproduces_on_a_real_bundle(tiny_bundle):
    import edgespec

    outs = {}
    for attempt in range(2):
        eng = edgespec.load(tiny_bundle, max_context=256)
        for drafter in ("auto", "prompt-lookup", "model", "none"):
            for _ in range(3):
                r = eng.generate("The quick brown fox", max_new_tokens=30, temperature=0.8, seed=42, drafter=drafter)
                outs.setdefault(drafter, set()).add(tuple(r.token_ids))
    assert all(len(v) == 1 for v in outs.values()), {k: len(v) for k, v in outs.items()}


def test_top_p_zero_is_greedy_decoding_at_any_temperature(tiny_bundle):
    """(session 72) top_p 0 keeps the most likely token alone (OpenAI's API and llama.cpp take it so): greedy
    decoding, the exact path (argmax, greedy acceptance) whatever the temperature, seed or drafter; outside [0, 1]
    still refused."""
    import edgespec
    from edgespec.sampling import SamplingParams

    assert SamplingParams(1.0, top_p=0.0).greedy and SamplingParams(0.0).greedy
    assert not SamplingParams(1.0, top_p=1e-6).greedy
    for bad in (-1e-9, 1.01, float("nan")):
        with pytest.raises(ConfigError, match="top_p"):
            SamplingParams(1.0, top_p=bad)
    eng = edgespec.load(tiny_bundle, max_context=256)
    prompt = "The quick brown fox"
    want = eng.generate(prompt, max_new_tokens=30, temperature=0.0, drafter="none", ignore_eos=True).token_ids
    sampled = set()
    for drafter in ("none", "model", "prompt-lookup", "auto"):
        for seed, t in ((1, 0.8), (2, 1.5), (None, 1.0)):
            r = eng.generate(prompt, max_new_tokens=30, temperature=t, top_p=0.0, seed=seed, drafter=drafter,
                             ignore_eos=True)
            assert r.token_ids == want, (drafter, seed, t)
        sampled.add(tuple(eng.generate(prompt, max_new_tokens=30, temperature=1.5, seed=3, drafter=drafter,
                                       ignore_eos=True).token_ids))
    assert sampled - {tuple(want)}, "sampling at T 1.5 gave the greedy reply: the check above says nothing"


# -- temperature alone over a large vocabulary: TailDist ---------------------------------------

def _tail_row(n=5000):
    """Four likely tokens and a tail of n - 4 at logit -9 (together ~0.62 of weight against 1.55)."""
    row = np.full(n, -9.0, dtype=np.float32)
    row[:4] = [0.0, -1.0, -2.0, -3.0]
    return row


def _tail_bins(tokens, n):
    """Counts over bins: each likely token alone, the tail in two halves."""
    t = np.asarray(tokens)
    return np.array([np.count_nonzero(t == i) for i in range(4)]
                    + [np.count_nonzero((t >= 4) & (t < n // 2)), np.count_nonzero(t >= n // 2)])


def _tail_probs(p):
    n = p.shape[0]
    return np.concatenate([p[:4], [p[4: n // 2].sum(), p[n // 2:].sum()]])


@pytest.fixture
def wide_tail(monkeypatch):
    """A bound of ~3 on a tail that weighs 0.62: every branch of TailDist.sample is taken often."""
    from edgespec import sampling

    monkeypatch.setattr(sampling, "_DENSE_EPS", 3.0)


def _chi2_bins(counts, probs):
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum()), len(counts) - 1


def test_tail_dist_samples_the_exact_distribution(wide_tail):
    from edgespec.sampling import TailDist, distribution

    sp = SamplingParams(1.0)
    row = _tail_row()
    d = distribution(row, sp)
    assert isinstance(d, TailDist) and d.idx.tolist() == [0, 1, 2, 3] and d.bound > 2.5
    want = _reference_probs(row, sp)
    np.testing.assert_allclose(d.dense(), want, rtol=1e-6)
    for t in (0, 3, 4, 4999):  # the bounds hold the exact probability that acceptance relies on
        lo, hi = d.prob_bounds(t)
        assert lo <= d.exact().prob(t) <= hi and d.prob(t) == pytest.approx(want[t], rel=1e-6)
    assert d.without(-1) is d and d.without(5000) is d  # not tokens of it: nothing removed
    rest = d.without(4)  # a tail token: excluded from the exact distribution too
    assert rest.prob_bounds(4) == (0.0, 0.0) and rest.exact().prob(4) == 0.0 and rest.exact().prob(5) > 0
    rng = np.random.default_rng(0)
    counts = _tail_bins([d.sample(rng) for _ in range(20000)], row.shape[0])
    stat, df = _chi2_bins(counts, _tail_probs(want))
    assert stat < _chi2_crit(df), (stat, counts)


def test_tail_dist_statistical_test_catches_a_naive_restart(wide_tail, monkeypatch):
    """Plant the tempting bug: past the near tokens, draw afresh from the exact distribution
    (instead of landing u on the tail first): the near tokens are then overdrawn."""
    from edgespec.sampling import TailDist, distribution

    def naive(self, rng):
        u = rng.random() * (self.total + self.bound)
        if u < self.total:
            c = np.cumsum(self.w, dtype=np.float64)
            return int(self.idx[min(int(np.searchsorted(c, u, side="right")), len(c) - 1)])
        return self.exact().sample(rng)

    monkeypatch.setattr(TailDist, "sample", naive)
    sp = SamplingParams(1.0)
    row = _tail_row()
    d = distribution(row, sp)
    rng = np.random.default_rng(0)
    counts = _tail_bins([d.sample(rng) for _ in range(20000)], row.shape[0])
    stat, df = _chi2_bins(counts, _tail_probs(_reference_probs(row, sp)))
    assert stat > _chi2_crit(df), f"the planted bug went unnoticed (chi2 {stat:.1f})"


def _first_tokens(p_row, q_row, sp, runs, seed=0):
    """The first token of a speculative round drafting one token from q (or, q_row None, proposing
    token 1 as prompt lookup would), verified against p."""
    from edgespec.sampling import distribution
    from edgespec.verify import rejection_sample

    rng = np.random.default_rng(seed)
    logits = np.stack([p_row, p_row])
    out = []
    for _ in range(runs):
        if q_row is None:
            n, tok = rejection_sample([1], None, logits, sp, rng)
            out.append(1 if n else tok)
        else:
            q = distribution(q_row, sp)
            x = q.sample(rng)
            n, tok = rejection_sample([x], [q], logits, sp, rng)
            out.append(x if n else tok)
    return out


def test_a_draft_token_its_drafter_could_not_draw_is_never_accepted(wide_tail):
    """u < p(x) / q(x) with q(x) = 0 is no test at all (a ratio past every u): a token outside the proposal's
    support (a drafter's q that does not match its draw, a token removed from q) is rejected, never let through
    on p alone; a mutation test (session 67) found nothing checked it: dense q, a top-k q and a TailDist's
    removed token."""
    from edgespec.sampling import Dist, TailDist, distribution
    from edgespec.verify import _accepts

    rng = np.random.default_rng(0)
    p = distribution(np.array([0.0, 0.5, 1.0, 0.2], dtype=np.float32), SamplingParams(1.0))
    dense_q = Dist(4, None, np.array([1.0, 0.0, 2.0, 1.0]))
    sparse_q = Dist(4, np.array([0, 2]), np.array([1.0, 3.0]))
    assert p.prob(1) > 0.2 and dense_q.prob(1) == 0 and sparse_q.prob(1) == 0
    assert not any(_accepts(p, q, 1, rng) for q in (dense_q, sparse_q) for _ in range(200))
    assert sum(_accepts(p, dense_q, 2, rng) for _ in range(200)) > 50  # (a token q draws: accepted at times)
    row = _tail_row()
    tail_q = distribution(row, SamplingParams(1.0)).without(10)  # a tail token removed
    assert isinstance(tail_q, TailDist) and tail_q.prob_bounds(10) == (0.0, 0.0)
    tail_p = distribution(row, SamplingParams(1.0))
    assert tail_p.exact().prob(10) > 0
    assert not any(_accepts(tail_p, tail_q, 10, rng) for _ in range(200))


@pytest.mark.parametrize("drafter", ["model", "point mass"])
def test_rejection_with_tail_dists_follows_the_target(wide_tail, drafter):
    sp = SamplingParams(1.0)
    p_row = _tail_row()
    q_row = None
    if drafter == "model":
        q_row = _tail_row()
        q_row[:4] = [-1.5, 0.0, -2.5, -1.0]  # another order of the likely tokens
        q_row[4:2500] = -8.0  # and a heavier first half of the tail
    counts = _tail_bins(_first_tokens(p_row, q_row, sp, 12000), p_row.shape[0])
    stat, df = _chi2_bins(counts, _tail_probs(_reference_probs(p_row, sp)))
    assert stat < _chi2_crit(df), (stat, counts)


def test_rejection_with_tail_dists_catches_a_missing_residual(wide_tail, monkeypatch):
    from edgespec.sampling import TailDist

    monkeypatch.setattr(TailDist, "minus", lambda self, q: self)  # resample from p: the classic bug
    sp = SamplingParams(1.0)
    p_row, q_row = _tail_row(), _tail_row()
    q_row[:4] = [-1.5, 0.0, -2.5, -1.0]
    q_row[4:2500] = -8.0
    counts = _tail_bins(_first_tokens(p_row, q_row, sp, 12000), p_row.shape[0])
    stat, df = _chi2_bins(counts, _tail_probs(_reference_probs(p_row, sp)))
    assert stat > _chi2_crit(df), f"the planted bug went unnoticed (chi2 {stat:.1f})"


def test_tail_bound_holds_where_the_tail_sits_just_below_the_threshold():
    """float32 rounding can put a tail token's weight ~4e-6 above exp((thr - m) / T): the bound
    keeps 1e-5 of slack (a row whose whole tail sits one float32 step below the threshold)."""
    from edgespec import sampling

    n, rng = 151936, np.random.default_rng(1)
    for _ in range(40):
        t, m = float(rng.uniform(0.3, 2.0)), np.float32(rng.uniform(-5, 15))
        thr = np.float32(float(m) - np.log(n / sampling._DENSE_EPS) * t)
        row = np.full(n, np.nextafter(thr, np.float32(-np.inf)), dtype=np.float32)
        row[0] = m
        d = sampling.distribution(row, SamplingParams(t))
        assert isinstance(d, sampling.TailDist)
        assert d.exact().total - d.total <= d.bound, (t, m)


def test_sampled_decoding_with_tail_dists_and_reused_logits_buffers(wide_tail):
    """Temperature alone over 5,000 tokens (TailDists, wide tails), both models handing out views of
    one logits buffer (as onnxruntime's sessions do): the round's second token (the generation's
    third) follows the target's distribution."""
    vocab, rows = 5000, 8  # FakeLM's order-2 key of (a, b) is (a * 5000 + b) % 8 = b % 8
    rng = np.random.default_rng(11)
    table = rng.normal(0, 1.0, (rows, vocab))
    table[:, :4] += 7.0  # a few likely tokens, a long tail
    for r in range(rows):  # each row's tail leans to a block of its own: a tail read from the wrong
        table[r, 4 + 600 * r: 4 + 600 * (r + 1)] += 3.0  # row moves mass between blocks
    sp = SamplingParams(1.0)
    prompt = [1, 2, 3]
    row_p = [_reference_probs(table[r].astype(np.float32), sp) for r in range(rows)]
    by_key = lambda p: np.array([p[k::rows].sum() for k in range(rows)])  # noqa: E731
    # the third token: the first from key 3 % 8, the second from the first's key, the third from the second's
    key1 = by_key(row_p[3])
    key2 = sum(key1[a] * by_key(row_p[a]) for a in range(rows))
    p3 = sum(key2[b] * row_p[b] for b in range(rows))
    def work(seeds):
        dec = Decoder(FakeLM(vocab, table=table, reuse_buffer=True), (),
                      drafters=[ModelDrafter(FakeLM(vocab, table=table + np.random.default_rng(3).normal(0, 1.5,
                                                                                                      table.shape),
                                                    reuse_buffer=True), vocab)])
        thirds = []
        for seed in seeds:
            cfg = GenerationConfig(max_new_tokens=5, drafter="model", draft_tokens=3, ignore_eos=True,
                                   temperature=1.0, seed=seed)
            thirds.append([t for step in dec.generate(prompt, cfg) for t in step.tokens][2])
        return thirds

    thirds = split_runs(work, 3000)
    edges = [0, 1, 2, 3, 4] + [4 + 600 * r for r in range(1, rows + 1)] + [vocab]
    got = np.asarray(thirds)
    counts = np.array([np.count_nonzero((got >= a) & (got < b)) for a, b in zip(edges, edges[1:])])
    probs = np.array([p3[a:b].sum() for a, b in zip(edges, edges[1:])])
    stat, df = _chi2_bins(counts, probs)
    assert stat < _chi2_crit(df), (stat, counts, probs * len(thirds))


def test_drafted_distributions_keep_their_own_rows(monkeypatch):
    """A sampled draft's q may keep its row (a TailDist computes its tail from it when a rejection
    needs it), and the drafter's model hands out a view that its next call overwrites: each q must
    still describe the row it was drawn from after the drafter's later calls."""
    from edgespec.kv import TokenBuffer
    from edgespec.sampling import TailDist, distribution

    from edgespec import sampling

    monkeypatch.setattr(sampling, "_DENSE_EPS", 0.01)  # a tail rarely computed while drafting
    vocab = 5000
    table = np.random.default_rng(5).normal(0, 1.0, (8, vocab))
    table[:, :4] += 14.0  # a few likely tokens: a few hundred near ones, the rest a tail
    lm = FakeLM(vocab, table=table, reuse_buffer=True)
    drafter = ModelDrafter(lm, vocab)
    sp = SamplingParams(1.0)
    ctx = TokenBuffer([1, 2, 3], capacity=64)
    drafter.begin(ctx.tolist())
    draft = drafter.draft(ctx, 6, sp, np.random.default_rng(0))
    assert len(draft.tokens) == 6 and all(isinstance(q, TailDist) for q in draft.probs)
    assert any(q._exact is None for q in draft.probs[1:-1])  # tails left to compute from their rows
    seen = ctx.tolist()
    ref = FakeLM(vocab, table=table)
    for q, tok in zip(draft.probs, draft.tokens):
        want = distribution(ref.logits_for(seen), sp).exact()
        assert np.array_equal(q.exact().dense(), want.dense())
        seen.append(tok)


def _peaked_table(vocab: int, tops: list[float]) -> np.ndarray:
    """A one-token-context table (``FakeLM(order=1)``) whose row t puts probability ``tops[t]`` on
    token t + 1 (the rest spread evenly): a drafter fed t is that sure of t + 1."""
    table = np.zeros((vocab, vocab))
    for t, top in enumerate(tops):
        rest = (1 - top) / (vocab - 1)
        table[t] = np.log(rest)
        table[t, (t + 1) % vocab] = np.log(top)
    return table


def test_a_dynamic_model_draft_ends_where_its_confidence_product_falls_below_the_threshold():
    from edgespec.kv import TokenBuffer

    tops = [0.9, 0.9, 0.9, 0.6, 0.95, 0.95, 0.95, 0.95]  # row t: how sure the drafter is of t + 1
    sp, rng = SamplingParams(), np.random.default_rng(0)

    def draft(k, stop=None, floor=0.0):
        md = ModelDrafter(FakeLM(8, order=1, table=_peaked_table(8, tops)), 8, min_confidence=floor)
        ctx = TokenBuffer([5, 0], capacity=64)
        md.begin(ctx.tolist())
        assert md.offer(ctx, 8).dynamic
        return md.draft(ctx, k, sp, rng) if stop is None else md.draft(ctx, k, sp, rng, stop=stop)

    # products after each token: .9 .81 .729 .437 .416 ...: at 0.5 the draft ends with the 4th token
    assert draft(8, stop=0.5).tokens == [1, 2, 3, 4]
    assert draft(8, stop=0.75).tokens == [1, 2, 3]  # .729 < .75
    assert draft(2, stop=0.5).tokens == [1, 2]  # k still bounds it
    assert draft(8).tokens == [1, 2, 3, 4, 5, 6, 7, 0]  # no stop, min_confidence 0: k tokens
    assert draft(8, floor=0.7).tokens == [1, 2, 3, 4]  # a fixed-length request: the per-token floor


def test_the_confidence_stop_is_calibrated_by_what_the_target_kept():
    """An overconfident drafter (top probability 0.9, but the target keeps only every other token
    it is judged on) learns lam < 1 and ends its dynamic drafts sooner; an underconfident one
    drafts on; greedy and sampled generations learn apart; with ``history`` off (a seeded sampled
    generation) lam is 1 and nothing is learned."""
    from edgespec.drafters import CALIB_MAX, CALIB_MIN
    from edgespec.kv import TokenBuffer

    greedy, sampled, rng = SamplingParams(), SamplingParams(0.8), np.random.default_rng(0)

    def drafter():
        md = ModelDrafter(FakeLM(8, order=1, table=_peaked_table(8, [0.9] * 8)), 8)
        md.begin([5, 0])
        return md

    def one(md, sp, kept, stop=0.5):
        ctx = TokenBuffer([5, 0], capacity=64)
        d = md.draft(ctx, 8, sp, rng, stop=stop)
        md.accept(min(kept, len(d.tokens)), 0)
        md.lm.rewind(md.lm.length)  # back to an empty cache: every draft starts from the same context
        md._stale, md._plan = True, None
        return d.tokens

    md = drafter()
    assert md.calibration(True) == 1.0 and len(one(md, greedy, 8)) == 7  # .9 ** 7 = .478 < .5 after the 7th
    for _ in range(40):
        one(md, greedy, 1)  # one kept, the next rejected: half of the judged positions
    lam = md.calibration(True)
    assert CALIB_MIN <= lam < 0.7 and md.calibration(False) == 1.0  # sampled: not learned from greedy
    assert len(one(md, greedy, 1)) < 7
    lam = md.calibration(True)
    md.history = False  # a seeded sampled generation: lam 1, and its rounds teach nothing
    assert md.calibration(True) == 1.0 and len(one(md, greedy, 0)) == 7
    md.history = True
    assert md.calibration(True) == lam
    under = drafter()
    for _ in range(40):
        one(under, sampled, 8)  # every draft token kept: the drafter understates, lam rises (bounded)
    assert 1.0 < under.calibration(False) <= CALIB_MAX and len(one(under, sampled, 8)) == 8
    assert under.calibration(True) == 1.0


def test_the_policy_prices_the_stop_threshold_and_lets_a_dynamic_drafter_draft_up_to_the_bound():
    from edgespec.kv import TokenBuffer

    pol = RoundPolicy()
    md = ModelDrafter(FakeLM(8, order=1, table=_peaked_table(8, [0.9] * 8)), 8)
    for w, s in [(1, 0.040), (2, 0.044), (4, 0.048), (8, 0.056)]:
        pol.measured.observe_target(w, s)
    pol.measured.observe_draft(0.010, "model")
    pol.begin("model", {"model": md}, 1)
    ctx = TokenBuffer([5, 0], capacity=64)
    md.begin(ctx.tolist())
    md.draft(ctx, 1, SamplingParams(), np.random.default_rng(0))  # catch up: no upfront cost now
    md.accept(1, 2)
    ctx.extend([1, 2])
    c = pol.choose(ctx, 40, None, 12)
    assert c.drafter is md and c.k == 12  # the request's bound: the draft ends on its confidence
    alpha = pol.estimate(md.offer(ctx, 12)).alpha
    _, rate = pol.cost.best_k(alpha, 12, True, "model")
    # one more token costs a step (10 ms) and one more verified position (the measured widths' slope)
    slope = np.polyfit([1, 2, 4, 8], [0.040, 0.044, 0.048, 0.056], 1)[0]
    assert c.stop == pytest.approx((0.010 + slope) * rate / alpha, rel=1e-6)
    assert 0.05 <= c.stop <= 0.95
    fixed = pol.choose(ctx, 40, 3, 12)  # a fixed draft length: k tokens, no threshold
    assert fixed.k == 3 and fixed.stop is None
    # a costlier drafter step asks for more confidence before drafting on
    pol.measured.observe_draft(0.030, "model")
    pol.measured.draft_steps["model"] = 0.030
    assert pol.stop_threshold(alpha, rate, "model") > c.stop


@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_dynamic_drafts_keep_the_output_exact(temperature):
    """The dynamic stop changes only how long drafts are: greedy output stays the target's own,
    and a seeded sampled generation with it draws from the target's distribution (the chi-square
    tests in test_exactness cover the rule itself; here the whole loop with the stop applied)."""
    vocab = 8
    target = FakeLM(vocab, seed=11, sharpness=3.0)
    drafter_lm = FakeLM(vocab, seed=11, sharpness=3.0)
    drafter_lm.table = target.table + np.random.default_rng(5).normal(0, 1.0, target.table.shape)
    md = ModelDrafter(drafter_lm, vocab)
    stops = []
    real = md.draft

    def spy(ctx, k, sp, rng, stop=None):
        stops.append(stop)
        return real(ctx, k, sp, rng, stop=stop)

    md.draft = spy
    dec = Decoder(target, (), drafters=[md])
    ref = Decoder(FakeLM(vocab, seed=11, sharpness=3.0), ())
    cfg = dict(max_new_tokens=60, temperature=temperature, max_draft_tokens=10)
    got = [t for s in dec.generate([1, 2, 3], GenerationConfig(drafter="model", **cfg)) for t in s.tokens]
    assert any(s is not None for s in stops)  # the dynamic path ran
    if temperature == 0:
        want = [t for s in ref.generate([1, 2, 3], GenerationConfig(drafter="none", **cfg)) for t in s.tokens]
        assert got == want
    else:
        assert len(got) == 60 and all(0 <= t < vocab for t in got)


def test_a_catch_up_is_priced_as_a_fixed_cost_a_read_plus_a_cost_a_token():
    """Short catch-ups (a few tokens emitted by a free drafter's round) cost about a drafter step;
    a prompt costs ~1 ms a token. One rate a token learned from both priced a long prompt at
    several times its cost (session 12: 2-4 ms a token against 1.0 measured), which kept the model
    drafter out of every long-prompt request."""
    cm = CostModel()
    for n in (3, 5, 8, 4, 200, 6):  # 15 ms a read + 1 ms a token
        cm.observe_catchup(n, 0.015 + 0.001 * n)
    assert cm.upfront_cost(470) == pytest.approx(0.015 + 0.470, rel=1e-6)
    assert cm.upfront_cost(4) == pytest.approx(0.019, rel=1e-6)
    one = CostModel()  # one length only: all of it a token
    one.observe_catchup(100, 0.5)
    one.observe_catchup(100, 0.5)
    assert one.upfront_cost(50) == pytest.approx(0.25)
    odd = CostModel()  # a fit with a negative fixed part is not physical: the time per token
    odd.observe_catchup(10, 0.001)
    odd.observe_catchup(100, 0.5)
    assert odd.upfront_cost(110) == pytest.approx(110 * 0.501 / 110)
    for i in range(40):  # only the recent reads count
        cm.observe_catchup(10 + i, 0.002 * (10 + i))
    assert cm.upfront_cost(100) == pytest.approx(0.2, rel=1e-6)


def test_a_model_drafter_reads_at_most_its_window_of_a_long_prompt_and_keeps_a_chat_turns_prefix():
    from edgespec.kv import TokenBuffer

    sp, rng = SamplingParams(), np.random.default_rng(0)
    prompt = np.random.default_rng(1).integers(0, 8, 30).tolist()
    full = ModelDrafter(FakeLM(8, seed=2), 8)
    windowed = ModelDrafter(FakeLM(8, seed=2), 8, read_window=8)
    ctx = TokenBuffer(prompt, capacity=256)
    for d in (full, windowed):
        d.begin(prompt)
    assert full.offer(ctx, 4).upfront == 30 and windowed.offer(ctx, 4).upfront == 8
    a, b = full.draft(ctx, 4, sp, rng), windowed.draft(ctx, 4, sp, rng)
    assert b.catchup == (8, b.catchup[1]) and windowed.lm.tokens[:8] == prompt[-8:]
    assert a.tokens == b.tokens  # FakeLM's logits depend on the last two tokens: the same guesses
    windowed.accept(2, 5)
    ctx.extend(b.tokens[:2] + [5])
    assert windowed.offer(ctx, 4).upfront == 0  # one behind: the window's base holds
    c = windowed.draft(ctx, 3, sp, rng)
    assert windowed.lm.tokens[:11] == ctx.tolist()[22:33] and c.catchup is None
    windowed.accept(0, 1)
    ctx.extend([1])
    # the next chat turn extends this one by 5 tokens: only those (and the one not yet fed) are read
    turn = ctx.tolist() + [3, 4, 5, 6, 7]
    windowed.begin(turn)
    tctx = TokenBuffer(turn, capacity=256)
    assert windowed.offer(tctx, 4).upfront == 6
    windowed.draft(tctx, 1, sp, rng)
    assert windowed.lm.tokens == turn[22:]
    # a turn that adds more than the window, or a different conversation: the window afresh
    windowed.accept(0, 0)
    other = np.random.default_rng(3).integers(0, 8, 40).tolist()
    windowed.begin(other)
    assert windowed.offer(TokenBuffer(other, capacity=256), 4).upfront == 8
    windowed.draft(TokenBuffer(other, capacity=256), 1, sp, rng)
    assert windowed.lm.tokens == other[-8:]
    with pytest.raises(ValueError):
        ModelDrafter(FakeLM(8), 8, read_window=0)


def test_a_windowed_drafter_keeps_greedy_output_exact():
    vocab = 8
    clock = SimClock()  # the drafter a tenth of the target: the policy starts it (timings, not the test's luck)
    target = FakeLM(vocab, seed=11, sharpness=3.0, order=3, delay=(0.01, 0.0005), clock=clock)
    dl = FakeLM(vocab, seed=11, sharpness=3.0, order=3, delay=(0.001, 0.0001), clock=clock)
    dl.table = target.table + np.random.default_rng(5).normal(0, 0.5, target.table.shape)
    dec = Decoder(target, (), drafters=[ModelDrafter(dl, vocab, read_window=4, clock=clock)], clock=clock)
    ref = Decoder(FakeLM(vocab, seed=11, sharpness=3.0, order=3), ())
    prompt = np.random.default_rng(2).integers(0, vocab, 50).tolist()
    for turn in range(3):  # a chat: each turn extends the last
        st = Stats()
        got = [t for s in dec.generate(prompt, GenerationConfig(drafter="model", max_new_tokens=40), st) for t in s.tokens]
        want = [t for s in ref.generate(prompt, GenerationConfig(drafter="none", max_new_tokens=40)) for t in s.tokens]
        assert got == want and st.rounds_by_drafter.get("model", 0) > 0
        prompt = prompt + got + [1, 2, 3]


def test_a_catch_up_is_amortized_over_the_share_of_the_generation_free_drafters_leave():
    from edgespec.policy import Choice

    pol = RoundPolicy()
    free, model = _Oracle("copy", False, lambda i: i % 5), _Oracle("model", True, lambda i: i % 5)
    pol.begin("auto", {"copy": free, "model": model}, 1)
    assert pol.uncovered() == 1.0  # nothing produced yet: all of it
    for _ in range(4):  # four free rounds, 3 of 4 drafts kept: 16 tokens, 12 drafted by the free drafter
        pol.observe(Choice(free, 4, "copy"), [0, 1, 2, 3], 3, None, 5, 0.01)
    pol.observe(Choice(model, 2, "model"), [0, 1], 2, 0.001, 3, 0.01)  # a costly drafter's round: not free
    pol.observe(NO_DRAFT, [], 0, None, 1, 0.01)
    assert pol.uncovered() == pytest.approx(1 - 12 / 20)
    pol.begin("auto", {"copy": free, "model": model}, 1)
    assert pol.uncovered() == 1.0  # per generation


@pytest.mark.parametrize("sp", [SamplingParams(), SamplingParams(1.0), SamplingParams(0.7, top_k=3)])
@pytest.mark.parametrize("stop", [None, 0.3])
def test_a_hinted_model_draft_is_the_unhinted_draft_with_fewer_steps(sp, stop):
    """A hint (a free drafter's guess) is fed in the drafter's first call: the draft is the same
    tokens with the same q, from the same random draws, as without it (a planted bug that took the
    hint's token instead of the drafter's own fails here); where the hint was right no step runs
    for those tokens; a wrong one is rolled back, and after accept the cache holds the context and
    the kept draft tokens only."""
    from edgespec.kv import TokenBuffer

    vocab = 6
    table = np.random.default_rng(5).normal(0, 2.5, size=(vocab ** 2, vocab))

    def drafted(hint, n_keep=2):
        md = ModelDrafter(FakeLM(vocab, table=table, reuse_buffer=True), vocab)
        ctx = TokenBuffer([1, 2, 3, 4], capacity=64)
        md.begin(ctx.tolist())
        first = md.draft(ctx, 1, sp, np.random.default_rng(99))  # reads the prompt (a hint is not used there)
        md.accept(0, 5)
        ctx.extend([5])
        calls = md.lm.calls
        kw = {} if stop is None else {"stop": stop}
        d = md.draft(ctx, 6, sp, np.random.default_rng(7), hint=hint, **kw)
        steps = md.lm.calls - calls
        keep = min(n_keep, len(d.tokens))
        md.accept(keep, 0)
        held, want = md.lm.tokens, ctx.tolist() + d.tokens[:keep]
        assert len(held) >= len(ctx) and held == want[: len(held)]  # nothing past the kept draft tokens
        assert first.tokens
        return d, steps

    plain, plain_steps = drafted(())
    qs = [q.exact().dense() for q in plain.probs] if plain.probs else None
    for hint in (plain.tokens, plain.tokens[:2], plain.tokens[:1] + [(plain.tokens[1] + 1) % vocab] + plain.tokens[2:],
                 [(plain.tokens[0] + 1) % vocab] * 5, plain.tokens + [0, 0, 0]):
        d, steps = drafted(hint)
        assert d.tokens == plain.tokens, hint
        if qs is not None:
            assert all(np.array_equal(q.exact().dense(), w) for q, w in zip(d.probs, qs))
        right = next((i for i, (a, b) in enumerate(zip(hint, plain.tokens)) if a != b), min(len(hint), len(plain.tokens)))
        # the unhinted draft ran one call per token but the last; the hinted one skips the right ones
        assert steps == plain_steps - min(right, len(plain.tokens) - 1), (hint, steps, plain_steps)


def test_hint_length_weighs_the_steps_saved_against_the_rows_added():
    from edgespec.policy import hint_length

    assert hint_length(0.1, 10) == 0  # a guess rarely right saves less than a call's extra rows cost
    assert 1 <= hint_length(0.5, 10) <= 4
    assert hint_length(0.95, 30) > 10
    assert hint_length(0.95, 3) == 3  # never past what the free drafter has
    assert hint_length(0.9, 0) == 0


def test_a_dynamic_draft_runs_on_through_a_hint_it_agrees_with_at_the_lower_threshold():
    """Where the next token's logits came with the hint, one more draft token costs no drafter step:
    the draft goes on at ``hint_stop`` there and at ``stop`` past the hint."""
    from edgespec.kv import TokenBuffer

    tops = [0.9, 0.9, 0.9, 0.6, 0.95, 0.95, 0.95, 0.95]
    sp, rng = SamplingParams(), np.random.default_rng(0)

    def draft(**kw):
        md = ModelDrafter(FakeLM(8, order=1, table=_peaked_table(8, tops)), 8)
        ctx = TokenBuffer([5, 7], capacity=64)
        md.begin(ctx.tolist())
        md.draft(ctx, 1, sp, rng)  # the first draft reads the prompt
        md.accept(0, 0)
        ctx.extend([0])
        return md.draft(ctx, 8, sp, rng, stop=0.5, **kw).tokens

    assert draft() == [1, 2, 3, 4]  # products .9 .81 .729 .437: ends at 0.5
    assert draft(hint=[1, 2, 3, 4, 5]) == [1, 2, 3, 4]  # a hint alone changes nothing
    # through the hint at 0.1, then .394 < 0.5 past it: the token after the hint ends the draft
    assert draft(hint=[1, 2, 3, 4, 5], hint_stop=0.1) == [1, 2, 3, 4, 5, 6]
    assert draft(hint=[1, 2, 7, 4, 5], hint_stop=0.1) == [1, 2, 3, 4]  # wrong from the 3rd: stop again


def test_a_hint_makes_a_costly_drafters_round_cheaper_in_the_cost_model():
    cm = CostModel()
    cm.observe_target(1, 0.040)
    cm.observe_target(4, 0.050)
    cm.observe_draft(0.012)
    plain = cm.rate(0.8, 4, True)
    assert cm.rate(0.8, 4, True, saved=2.0, extra=0.3) > plain  # two steps saved for 0.3 of one
    assert cm.rate(0.8, 4, True, saved=0.0, extra=0.3) < plain  # a hint that saves nothing costs
    assert cm.rate(0.8, 1, True, saved=5.0) == cm.rate(0.8, 1, True)  # the first call runs anyway
    assert cm.rate(0.8, 4, False, saved=2.0, extra=0.3) == cm.rate(0.8, 4, False)  # a free drafter


class _BadHintDrafter(ModelDrafter):
    """A planted bug: where the hint is given, its tokens are drafted as they are, with the
    drafter's q beside them (q no longer describes how the tokens were drawn)."""

    def draft(self, ctx, k, sp, rng, stop=None, hint=(), hint_stop=None):
        d = super().draft(ctx, k, sp, rng, stop=stop)
        if hint and d.tokens:
            n = min(len(hint), len(d.tokens))
            d.tokens[:n] = list(hint[:n])
            self.accept(0, 0)  # the cache holds the drafter's own tokens: start from the context again
            self._fed_drafts = 0
        return d


@pytest.mark.parametrize("cls, sp, exact_ok", [
    (ModelDrafter, SamplingParams(1.0), True),
    (ModelDrafter, SamplingParams(0.7, top_k=3), True),
    (_BadHintDrafter, SamplingParams(1.0), False),
])
def test_sampled_hinted_model_drafts_follow_the_target_distribution(cls, sp, exact_ok):
    """Every round a hinted model draft (the policy's choice forced: two tokens, a hint that is
    right about half the time): the sampled outputs follow the target's distribution (chi-square
    over all 4-token outputs: blocks of two draft tokens verified); the planted bug that drafts the hint's tokens
    is caught."""
    from edgespec.policy import Choice

    vocab, n_tokens, runs = 4, 4, 4000
    prompt = [1, 2, 1, 2, 1]
    exact = _exact_sequence_probs(FakeLM(vocab, seed=7, sharpness=1.0), prompt, n_tokens, sp)

    def factory():
        target = FakeLM(vocab, seed=7, sharpness=1.0, reuse_buffer=True)
        dl = FakeLM(vocab, table=target.table + np.random.default_rng(3).normal(0, 1.0, target.table.shape),
                    reuse_buffer=True)
        md = cls(dl, vocab)
        dec = Decoder(target, (), drafters=[md])

        def choose(ctx, kcap, fixed, max_draft):
            k = min(2, kcap)
            if k <= 0:
                return Choice(None)
            hint = (int(ctx[-1]) % vocab, (int(ctx[-2]) + 1) % vocab)[:k]  # a fixed function of the context
            return Choice(md, k, "model", hint=hint)

        dec.policy.choose = choose
        return dec

    reach: list = []
    counts = _sample_runs(factory, prompt, n_tokens, sp, runs, "model", None, reach)
    assert min(reach) >= 1  # every generation drafted, each draft with a hint (the policy's only choice)
    stat, df = _chi2(counts, exact, runs)
    if exact_ok:
        assert stat < _chi2_crit(df), f"chi2 {stat:.1f} with {df} dof"
    else:
        assert stat > _chi2_crit(df), f"the planted bug went unseen: chi2 {stat:.1f} with {df} dof"


@pytest.mark.parametrize("sp", [SamplingParams(), SamplingParams(1.0)])
def test_a_hint_at_a_generations_first_read_goes_in_with_the_first_step(sp):
    """The first draft of a generation reads the context first (a prefill that returns only the last
    logits): a hint whose first token the drafter draws is fed whole with the first step, the draft is
    the unhinted one (tokens, q, random draws), and the steps for the hint's other right tokens go."""
    from edgespec.kv import TokenBuffer

    vocab = 6
    table = np.random.default_rng(11).normal(0, 2.5, size=(vocab ** 2, vocab))

    def first(hint):
        md = ModelDrafter(FakeLM(vocab, table=table, reuse_buffer=True), vocab)
        ctx = TokenBuffer([3, 1, 4, 1, 5], capacity=64)
        md.begin(ctx.tolist())
        calls = md.lm.calls
        d = md.draft(ctx, 6, sp, np.random.default_rng(4), hint=hint)
        md.accept(len(d.tokens), 0)
        held = md.lm.tokens
        assert held == (ctx.tolist() + d.tokens)[: len(held)] and len(held) >= len(ctx)
        return d, md.lm.calls - calls

    plain, plain_calls = first(())
    assert plain_calls == len(plain.tokens)  # the read, then a step for every token but the last
    for right in range(len(plain.tokens) + 1):
        hint = plain.tokens[:right] + [(t + 1) % vocab for t in plain.tokens[right:]]
        d, calls = first(hint)
        assert d.tokens == plain.tokens
        if plain.probs:
            assert all(np.array_equal(a.exact().dense(), b.exact().dense()) for a, b in zip(d.probs, plain.probs))
        assert len(plain.tokens) == 6  # k tokens: no stop asked for
        if right >= 1:  # the read, the hint's call (its first 5 tokens: k - 1), a step past what it had right
            assert calls == 2 + (len(plain.tokens) - 1 - min(right, 5)), (right, calls)
        else:  # its first token is not drawn: it is never fed
            assert calls == plain_calls


def test_prompt_lookup_index_equals_the_search():
    """Prompt lookup's incremental n-gram index (what a round's lookup reads) proposes exactly what
    searching the whole context proposes (``lookup_match``), as the context grows by a few tokens a
    round, over random contexts with many repeats; a new context (or one shorter than indexed) is
    indexed afresh."""
    import random

    from edgespec.drafters import PromptLookupDrafter
    from edgespec.kv import TokenBuffer

    rng = random.Random(1)
    for trial in range(300):
        d = PromptLookupDrafter(min_ngram=rng.choice([1, 2]), max_ngram=rng.choice([2, 3, 4]))
        vocab = rng.choice([3, 5, 20])
        ctx = TokenBuffer([rng.randrange(vocab) for _ in range(rng.randrange(1, 30))], capacity=400)
        d.begin(ctx.tolist())
        for step in range(30):
            k = rng.randrange(0, 10)
            assert d._lookup_indexed(ctx, k) == d.lookup_match(ctx, k), (trial, step)
            ctx.extend([rng.randrange(vocab) for _ in range(rng.randrange(1, 4))])
    other = TokenBuffer([1, 2, 3, 1, 2], capacity=16)
    assert d._lookup_indexed(other, 4) == d.lookup_match(other, 4) == ([3, 1, 2], 2)
    shorter = TokenBuffer([7, 7], capacity=16)
    d._ctx = shorter
    d._indexed = 10
    assert d._lookup_indexed(shorter, 3) == ([7], 1)


def test_alternates_are_taken_where_their_expected_token_pays_for_the_wider_call():
    """RoundPolicy.alternates: candidates valued reach(i) x second-choice probability x scale, taken
    from the likeliest down while that value at the round's seconds a token exceeds what one more row
    adds to the target's call (measured costs by width), at most ``room``; the calibration follows
    what was kept; use_alternates takes booleans only."""
    p = RoundPolicy()
    for w, s in {1: 0.020, 2: 0.020, 3: 0.0201, 4: 0.0202, 5: 0.0203, 6: 0.0300, 7: 0.0400}.items():
        p.measured.observe_target(w, s)
    # a 2-token draft (top probabilities 0.9, 0.5): reach 1 and 0.9; expected yield 1 + 0.9 + 0.45
    alts = [(0, 11, 0.9, 0.05), (1, 12, 0.5, 0.30)]
    chosen = p.alternates(2, alts, room=8, draft_s=0.01)
    # values 0.05 and 0.27 tokens x (0.0201 + 0.01) / 2.35 s: both above what rows 4 and 5 add (0.1 ms each)
    assert chosen == [(1, 12), (0, 11)]
    assert p.alternates(2, alts, room=1, draft_s=0.01) == [(1, 12)]
    assert p.alternates(2, alts, room=0, draft_s=0.01) == []
    # a 4-token draft: a sixth and seventh row cost ~10 ms each, more than any alternate brings
    alts4 = [(i, 20 + i, 0.9, 0.3) for i in range(4)]
    assert p.alternates(4, alts4, room=8, draft_s=0.01) == []
    assert p.alternates(3, alts4[:3], room=8, draft_s=0.01) == [(0, 20)]  # the fifth row: the likeliest only
    # kept more often than predicted: the scale rises (bounded), and falls when none is kept
    p.alternates(2, alts, room=8, draft_s=0.01)
    before = p.alternate_scale()
    for _ in range(10):
        p.alternates(2, alts, room=8, draft_s=0.01)
        p.observe_alternates(True)
    assert 2.0 >= p.alternate_scale() > before
    for _ in range(200):
        p.alternates(2, alts, room=8, draft_s=0.01)
        p.observe_alternates(False)
    assert p.alternate_scale() == 0.25
    for bad in (2, 0.5, 1.0, "yes", None):  # (1.0: == True, yet no flag; mutant PO23)
        with pytest.raises(ValueError, match="use_alternates"):
            RoundPolicy(use_alternates=bad)
    assert RoundPolicy(use_alternates=0).use_alternates is False and RoundPolicy(use_alternates=1).use_alternates
    assert RoundPolicy().use_alternates is False  # (off unless the decoder's target has cheap verify rows)


def test_calls_with_alternates_teach_their_premium_not_the_costs_by_width():
    """A call with alternates is not a causal call of its width: it leaves the costs by width alone
    and teaches ``alt_premium`` (seconds an alternate adds beyond a causal row), which then prices
    alternates out where they cost more than they bring (a long context's attention)."""
    p = RoundPolicy()
    for w, s in {1: 0.020, 2: 0.020, 3: 0.0201, 4: 0.0202, 5: 0.0203}.items():
        p.measured.observe_target(w, s)
    alts = [(0, 11, 0.9, 0.05), (1, 12, 0.5, 0.30)]
    assert p.alternates(2, alts, room=8, draft_s=0.01) == [(1, 12), (0, 11)]
    before = dict(p.measured.target)
    for _ in range(20):  # calls of 2 draft tokens and 2 alternates (5 rows) took 8 ms more than 5 causal rows
        p.observe(NO_DRAFT, [], 0, None, 5, 0.0283, alternates=2)
        p.observe_alternates(False, 2, 5, 0.0283)
    assert p.measured.target == before
    assert p.alt_premium == pytest.approx(0.004, rel=0.05)
    # 4 ms an alternate: more than 0.27 tokens x ~13 ms bring
    assert p.alternates(2, alts, room=8, draft_s=0.01) == []


def test_an_alternates_premium_from_one_slow_call_does_not_turn_them_off_for_good():
    """A premium sample counts at most ALT_PREMIUM_MAX of a one-token call, and a premium no call of the last
    generation renewed is halved: on the Zen 5 (session 66) a process's first call with alternates took twice its
    width's price, its 11 ms an alternate priced them out, and with none verified none was measured again (the
    process ran without them)."""
    from edgespec.policy import ALT_PREMIUM_MAX

    p = RoundPolicy()
    for w, s in {1: 0.020, 2: 0.020, 3: 0.0201, 4: 0.0202, 5: 0.0203}.items():
        p.measured.observe_target(w, s)
    alts = [(0, 11, 0.9, 0.05), (1, 12, 0.5, 0.30)]
    p.begin("none", {}, 1)
    assert p.alternates(2, alts, room=8, draft_s=0.01) == [(1, 12), (0, 11)]
    p.observe_alternates(False, 2, 5, 0.0203 + 2 * 0.011)  # the slow first call: 11 ms an alternate
    assert p.alt_premium == pytest.approx(ALT_PREMIUM_MAX * 0.020)  # (clipped: 5 ms)
    p.observe_alternates(False, 2, 5, float("nan"))  # (a clock's NaN teaches nothing)
    assert p.alt_premium == pytest.approx(ALT_PREMIUM_MAX * 0.020)
    assert p.alternates(2, alts, room=8, draft_s=0.01) == []  # priced out: no call measures it again ...
    p.begin("none", {}, 1)  # (the generation that measured it)
    assert p.alt_premium == pytest.approx(0.005) and p.alternates(2, alts, room=8, draft_s=0.01) == []
    p.begin("none", {}, 1)  # ... a generation without a sample: halved, and they pay again
    assert p.alt_premium == pytest.approx(0.0025)
    assert p.alternates(2, alts, room=8, draft_s=0.01) == [(1, 12)]
    p.observe_alternates(False, 1, 4, 0.0202 + 0.0002)  # the next call re-measures it (0.2 ms)
    p.begin("none", {}, 1)
    assert p.alt_premium == pytest.approx(0.8 * 0.0025 + 0.2 * 0.0002)  # (renewed: not halved)


def _everywhere(monkeypatch):
    """The round policy verifies an alternate beside every draft token (as many as fit)."""
    monkeypatch.setattr(RoundPolicy, "alternates", lambda self, k, alts, room, s: [(i, t) for i, t, _, _ in alts][:room])


def _alt_runs(vocab, prompt, n_tokens, sp, runs, k, noise=1.0):
    """Seeded sampled generations of a target that verifies alternates (AltFakeLM) with a noisy model
    drafter: (counts of the outputs, alternates verified, alternates kept)."""
    def work(seeds):
        counts, verified, kept = {}, 0, 0
        target = AltFakeLM(vocab, seed=7, sharpness=1.0, reuse_buffer=True)
        dl = FakeLM(vocab, table=target.table + np.random.default_rng(3).normal(0, noise, target.table.shape),
                    reuse_buffer=True)
        dec = Decoder(target, (), drafters=[ModelDrafter(dl, vocab)])
        assert dec.policy.use_alternates  # (on: the target's verify rows are cheap)
        for i in seeds:
            st = Stats()
            out, _ = run(dec, prompt, st, max_new_tokens=n_tokens, temperature=sp.temperature, top_k=sp.top_k,
                         top_p=sp.top_p, min_p=sp.min_p, seed=i, drafter="model", draft_tokens=k)
            counts[tuple(out)] = counts.get(tuple(out), 0) + 1
            verified += st.alternates
            kept += st.alternates_kept
        return counts, verified, kept

    return split_runs(work, runs)


@pytest.mark.parametrize("vocab, n_tokens, sp, k, noise", [
    (4, 3, SamplingParams(1.0), 2, 1.0),
    (4, 3, SamplingParams(1.0), 2, 2.0),  # (the planted bugs' case below)
    (4, 3, SamplingParams(0.7, top_k=3), 2, 1.0),
    (4, 3, SamplingParams(1.3, top_p=0.8), 2, 1.0),
    (3, 4, SamplingParams(1.0), 3, 1.0),
    (3, 4, SamplingParams(1.0), None, 1.0),  # adaptive: the draft ends on the drafter's confidence
    (4, 3, SamplingParams(1.0, min_p=0.3), 2, 2.0),  # (min-p leaves fewer alternates to keep: ~280 of 6,000 runs)
])
def test_sampled_alternates_follow_the_target_distribution(vocab, n_tokens, sp, k, noise, monkeypatch):
    """Sampled rounds with an alternate drawn from q without the draft token beside each draft token
    (recursive rejection sampling, verify.rejection_sample_alternates): the outputs follow the target's
    distribution (chi-square over every sequence), and the alternates are kept often."""
    _everywhere(monkeypatch)
    prompt, runs = [1, 2, 1, 2, 1], 6000
    exact = _exact_sequence_probs(FakeLM(vocab, seed=7, sharpness=1.0), prompt, n_tokens, sp)
    counts, verified, kept = _alt_runs(vocab, prompt, n_tokens, sp, runs, k, noise)
    assert kept > runs // (40 if sp.min_p else 20) and verified > kept
    stat, df = _chi2(counts, exact, runs)
    assert stat < _chi2_crit(df), f"chi2 {stat:.1f} with {df} dof"


def test_sampled_alternates_beside_some_draft_tokens_follow_the_target_distribution(monkeypatch):
    """An alternate beside the first draft token only: a rejection at a later token has none and takes the
    residual as a round without alternates does (verify.rejection_sample_alternates' other path). A mutation test
    (session 67): that path sampling p itself went unnoticed, every other test putting an alternate everywhere."""
    monkeypatch.setattr(RoundPolicy, "alternates", lambda self, k, alts, room, s: [(i, t) for i, t, _, _ in alts][:1])
    sp, prompt, runs = SamplingParams(1.0), [1, 2, 1, 2, 1], 6000
    exact = _exact_sequence_probs(FakeLM(3, seed=7, sharpness=1.0), prompt, 4, sp)
    counts, verified, kept = _alt_runs(3, prompt, 4, sp, runs, 3, 2.0)
    assert kept > runs // 20 and verified > kept
    stat, df = _chi2(counts, exact, runs)
    assert stat < _chi2_crit(df), f"chi2 {stat:.1f} with {df} dof"


def _alt_decoder(seed: int, max_context: int = 512) -> Decoder:
    """A decoder over a target that verifies alternates (tiny.AltFakeLM, 6 tokens) and a model drafter whose
    table is the target's with noise (1.5): drafts often wrong, alternates often kept."""
    target = AltFakeLM(6, max_context=max_context, seed=seed, sharpness=1.0)
    noise = np.random.default_rng(seed + 50).normal(0, 1.5, target.table.shape)
    return Decoder(target, (), drafters=[ModelDrafter(FakeLM(6, max_context, table=target.table + noise), 6)])


def test_greedy_alternates_keep_plain_decodings_output(monkeypatch):
    """Greedy rounds with an alternate beside every draft token on a target that verifies them (tiny.AltFakeLM),
    a noisy model drafter: every output is plain greedy decoding's token for token, alternates kept often. A
    mutation test (session 67): an alternate kept at the wrong position (its token the target's next, anywhere
    in the draft) changed 2 outputs of 20 and no test on fake models caught it."""
    _everywhere(monkeypatch)
    kept = 0
    for seed in range(20):
        dec = _alt_decoder(seed)
        prompt = [1, 2, 3, 1, 2]
        ref, _ = run(dec, prompt, max_new_tokens=24, drafter="none")
        st = Stats()
        got, _ = run(dec, prompt, st, max_new_tokens=24, drafter="model", draft_tokens=4)
        assert got == ref, seed
        kept += st.alternates_kept
    assert kept > 20


NOISE = 3.0
@pytest.mark.parametrize("bug", ["residual", "proposal"])
def test_sampled_alternates_test_catches_a_planted_bug(bug, monkeypatch):
    """The same test fails where the rule is wrong: ``residual``, a rejected alternate's token drawn from
    the first residual p1 instead of normalize(max(p1 - q1, 0)); ``proposal``, the alternate drawn from
    q itself (the draft token again, sometimes) while the rule takes q without the draft token."""
    import edgespec.decoder as decoder_mod

    _everywhere(monkeypatch)
    if bug == "residual":
        real = verify_mod.rejection_sample_alternates

        def buggy(draft, dists, logits, sp_, rng, alternates):
            n, tok, at = real(draft, dists, logits, sp_, rng, alternates)
            if n < len(draft) and at is None and n in alternates:
                residual = verify_mod.distribution(logits[n], sp_).minus(dists[n])
                if residual is not None:
                    tok = residual.sample(rng)
            return n, tok, at

        monkeypatch.setattr(decoder_mod, "rejection_sample_alternates", buggy)
    else:
        monkeypatch.setattr(decoder_mod, "alternate_dist", lambda q, x: q)
    prompt, runs, sp = [1, 2, 1, 2, 1], 6000, SamplingParams(1.0)
    exact = _exact_sequence_probs(FakeLM(4, seed=7, sharpness=1.0), prompt, 3, sp)
    counts, _, _ = _alt_runs(4, prompt, 3, sp, runs, 2, noise=2.0)  # (the first case above, its drafter worse)
    stat, df = _chi2(counts, exact, runs)
    assert stat > _chi2_crit(df), f"the planted bug went unnoticed (chi2 {stat:.1f}, {df} dof)"


def test_seeded_sampled_generations_with_alternates_are_reproducible():
    """A seeded sampled generation picks its alternates from its own tokens alone (the cost model's
    priors, no premium, no calibration from other generations): the same seed gives the same output
    whatever the policy measured or learned before, with alternates verified and kept."""
    vocab, prompt = 6, [1, 2, 3, 1, 2]
    target = AltFakeLM(vocab, seed=5, sharpness=1.5)
    dl = FakeLM(vocab, table=target.table + np.random.default_rng(4).normal(0, 0.8, target.table.shape))
    dec = Decoder(target, (), drafters=[ModelDrafter(dl, vocab)])
    for seed in range(11, 41):  # (a seed whose generation keeps an alternate: which one depends on the priors)
        kw = dict(max_new_tokens=40, temperature=0.8, seed=seed, drafter="model", draft_tokens=3)
        st = Stats()
        first, _ = run(dec, prompt, st, **kw)
        if st.alternates_kept:
            break
    assert st.alternates > 0 and st.alternates_kept > 0
    dec.policy.alt_premium = 1e9  # what an unseeded generation would price alternates out with
    dec.policy._alt_calibs[True][:] = [0.0, 50.0]
    for w in range(1, 12):
        dec.policy.measured.observe_target(w, 0.01 * w)
    assert run(dec, prompt, **kw)[0] == first
    unseeded = Stats()  # ... and does: no alternate is worth 1e9 seconds
    run(dec, prompt, unseeded, **{**kw, "seed": None})
    assert unseeded.alternates == 0


def _ended(seed, ctx, vocab, eos, min_width=1, noisy_below=0):
    """A decoder on a small context whose replies end there (session 43's review: the finish reasons, the width policy
    at the context's end). ``noisy_below``: the target's calls narrower than this compute other rows (a kernel's
    small-M path: the policy (4, 1) pads them)."""

    class SmallM(FakeLM):
        def _run(self, ids, past):
            rows = np.array(super()._run(ids, past), copy=True)
            if len(ids) < noisy_below:  # each width its own arithmetic
                rows += np.random.default_rng(len(ids) * 1000 + past).normal(0, 2.0, rows.shape).astype(np.float32)
            return rows

    t = SmallM(vocab, ctx, seed=seed, sharpness=1.5, min_width=min_width)
    dt = t.table + 0.3 * np.random.default_rng(seed + 100).normal(size=t.table.shape)
    return Decoder(t, eos, drafters=[ModelDrafter(FakeLM(vocab, ctx, table=dt), vocab), PromptLookupDrafter()])


def test_a_reply_the_context_or_the_length_cuts_ends_as_plain_decoding_says():
    """Speculative rounds name the limit plain decoding names: a round that runs past the context's room keeps what
    fits and says 'context' (before session 43: 'length' where max_new_tokens was one more than the room, and 'eos'
    where the stop token it cut was past the room, which the server reported as OpenAI's 'stop'); a stop token past
    the length limit is not the reason either. Tokens always equal plain decoding's."""
    ref = run(_ended(81, 32, 3, ()), [1], max_new_tokens=32, drafter="none")
    assert len(ref[0]) == 31 and ref[1] == "context"
    assert run(_ended(81, 32, 3, ()), [1], max_new_tokens=32, drafter="prompt-lookup", draft_tokens=4) == ref
    ref = run(_ended(431, 6, 3, (2,)), [1, 1, 1], max_new_tokens=100, drafter="none")
    assert ref == ([0, 0, 1], "context")
    assert run(_ended(431, 6, 3, (2,)), [1, 1, 1], max_new_tokens=100, drafter="model", draft_tokens=1) == ref
    seen = set()
    for seed in range(120):
        rng = np.random.default_rng(seed)
        vocab, ctx = int(rng.integers(3, 6)), int(rng.integers(10, 30))
        eos = (int(rng.integers(0, vocab)),)
        prompt = rng.integers(0, vocab, size=int(rng.integers(1, 5))).tolist()
        max_new = ctx - len(prompt) + int(rng.integers(-1, 3))
        if max_new < 1:
            continue
        ref = run(_ended(seed, ctx, vocab, eos), prompt, max_new_tokens=max_new, drafter="none")
        seen.add(ref[1])
        for k in (2, 5):
            got = run(_ended(seed, ctx, vocab, eos), prompt, max_new_tokens=max_new, drafter="model", draft_tokens=k)
            assert got == ref, (seed, k)
    assert seen == {"eos", "length", "context"}


def test_the_width_policy_pads_the_calls_at_the_context_end_too():
    """A target whose calls of 1-3 rows compute other rows (a small-M path: the policy (4, 1)) keeps its last positions
    in calls of the policy's width: where a pad after them has no room, a call starts earlier and recomputes cached
    positions (alike at every allowed width), so plain and speculative decoding compute every position alike up to
    the end, and the whole context stays usable (before session 43 the last positions ran in narrower calls, of other
    widths in each: 134 of 180 such runs differed there)."""
    t = FakeLM(6, 10, min_width=4)
    t.prefill([1, 2, 3, 4, 5, 0, 1, 2])
    row = t.forward([3])  # positions 8 (and 9 free): a pad of 3 has no room
    assert t.last_width == 4 and t.length == 9 and row.shape[0] == 1
    assert np.array_equal(row[0], t.logits_for([1, 2, 3, 4, 5, 0, 1, 2, 3]))
    assert t.forward([4]).shape[0] == 1 and t.length == 10 and t.last_width == 4
    for seed in range(30):
        ctx = 24 + seed % 5
        ref = run(_ended(seed, ctx, 6, (), min_width=4, noisy_below=4), [1, 2, 3], max_new_tokens=200, drafter="none")
        assert ref[1] == "context"
        for k in (1, 2, 3):
            got = run(_ended(seed, ctx, 6, (), min_width=4, noisy_below=4), [1, 2, 3], max_new_tokens=200,
                      drafter="model", draft_tokens=k)
            assert got == ref, (seed, k)
    # (session 56, a review) a context under twice the policy's width: too few cached positions to start back by the
    # whole pad, too little room after for it: both at once (the call ran unpadded, one token wide)
    t = FakeLM(6, 5, min_width=4)
    t.prefill([1, 2])
    assert t.forward([3]).shape[0] == 1 and t.last_width == 4 and t.length == 3  # (1 back, 2 pad after)
    # (session 82, a mutation test) a context narrower than the policy's width: a call fills the room there is, no
    # more (its pad went past the context's end)
    t = FakeLM(6, 3, min_width=4)
    assert t.forward([1]).shape[0] == 1 and t.last_width == 3 and t.length == 1
    assert t.forward([2, 3]).shape[0] == 2 and t.last_width == 3 and t.length == 3  # (1 back)
    assert t.tokens_run == 6  # (what the calls computed, the pad and the position computed again included)
    for seed in range(40):
        ctx = 5 + seed % 3
        ref = run(_ended(seed, ctx, 6, (), min_width=4, noisy_below=4), [1], max_new_tokens=50, drafter="none")
        for k in (1, 2):
            got = run(_ended(seed, ctx, 6, (), min_width=4, noisy_below=4), [1], max_new_tokens=50,
                      drafter="model", draft_tokens=k)
            assert got == ref, (seed, ctx, k)


def test_a_seeded_sampled_generation_does_not_depend_on_what_the_drafter_read_before(tiny_bundle):
    """A seeded sampled generation reads the model drafter's window afresh: what its cache held from an earlier
    prompt sharing a prefix moved the window (and so its q and the draws) before session 43."""
    import edgespec

    eng = edgespec.load(tiny_bundle, max_context=256)
    P = np.random.default_rng(0).integers(3, 300, size=180).tolist()
    kw = dict(max_new_tokens=40, temperature=1.0, drafter="model", draft_tokens=4, ignore_eos=True)

    def gen(ids, seed):
        return [t for d in eng.stream_ids(ids, seed=seed, **kw) for t in d.ids]

    for seed in range(3):
        eng.reset()
        a = gen(P, seed)
        assert gen(P, seed) == a
        eng.reset()
        gen(P[:150], 99)
        assert gen(P, seed) == a, seed


def test_a_distribution_without_its_only_weighted_token_is_nothing():
    """Top-k at a temperature near 0 keeps a token whose weight underflows to 0: q without the other is no
    distribution (None, so no alternate is drawn from it), where it was one of total 0 and the rule divided by
    it (a review's finding; the shipped policy never offers such an alternate, a forcing test helper did)."""
    from edgespec.sampling import distribution
    from edgespec.verify import alternate_dist, rejection_sample_alternates

    sp = SamplingParams(1e-3, top_k=2)
    q = distribution(np.array([0.0, -1.0, -5.0, -6.0], dtype=np.float32), sp)
    assert list(q.idx) == [0, 1] and q.w[1] == 0
    assert alternate_dist(q, 0) is None and q.without(1) is not None
    rows = np.array([[-3.0, 0.0, -5.0, -6.0], [0.0, 0.0, 0.0, 0.0]], dtype=np.float32)
    n, nxt, kept = rejection_sample_alternates([0], [q], rows, sp, np.random.default_rng(0), {0: 1})
    assert (n, nxt) == (0, 1) and kept is None


class _Confident:
    """A costly drafter whose drafts end on its confidence (a dynamic offer, as the model drafter's)."""

    name, has_cost = "model", True

    def offer(self, ctx, kmax):
        from edgespec.drafters import Offer

        return Offer(self.name, min(kmax, 4), prior=(1.5, 0.5), dynamic=True)


def test_a_confident_drafts_first_token_is_priced_at_what_first_tokens_were():
    """(session 52) A dynamic draft's acceptance estimate (kept tokens against rounds with a rejection) is mostly the
    tokens past the first, drafted only where the drafter is confident and then kept: rounds of one token rejected
    and rounds of four kept, alternately, make it 0.8 where the first token was kept half the time. Priced on 0.8
    alone (1.8 tokens for 1.6 s against plain decoding's 1 a second) the drafter drafted; its first tokens say 1.5
    for 1.6 s (and 1.9 for 2.2 s at two tokens): plain decoding is cheaper, and chosen."""
    from edgespec.kv import TokenBuffer
    from edgespec.policy import FIRST_KEY, Choice

    pol = RoundPolicy()
    for w in range(1, 7):
        pol.measured.observe_target(w, 1.0 + 0.3 * (w - 1))
    pol.measured.observe_draft(0.3, "model")
    d = _Confident()
    ctx = TokenBuffer([1, 2, 3], capacity=4096)
    for gen in range(3):
        pol.begin("auto", {d.name: d}, 1)
        assert pol.choose(ctx, 60, None, 4).drafter is (d if gen == 0 else None), gen  # (the first: the priors)
        for i in range(20):
            c = Choice(d, 4, "model", stop=0.5)
            if i % 2:
                pol.observe(c, [5, 6, 7, 8], 4, 0.3, 5, 2.2)
            else:
                pol.observe(c, [5], 0, 0.3, 2, 1.3)
    assert pol.learned["model"].alpha == pytest.approx(0.8, abs=0.03)
    assert pol.learned["model" + FIRST_KEY].alpha == pytest.approx(0.5, abs=0.05)
    pol.begin("auto", {d.name: d}, 1)
    assert pol.choose(ctx, 60, None, 4) == NO_DRAFT
    assert pol.cost.best_k(0.8, 4, True)[0] > 0  # (what it was priced at before: a draft)
    # a fixed length (a request's draft_tokens) is not a confident draft: priced on its estimate, as before
    assert pol.choose(ctx, 60, 2, 4).drafter is d
    # generations that do not draft it relax both estimates toward the prior: it is tried again (no lock-out)
    back = []
    for _ in range(8):
        pol.begin("auto", {d.name: d}, 1)
        back.append(pol.choose(ctx, 60, None, 4).drafter is d)
    assert not back[0] and any(back), back


def _first_priced(alpha_kept: float, first_kept: float, probe_every: int = 64, mixed: bool = False) -> RoundPolicy:
    """A policy whose earlier generations taught the model drafter ``alpha_kept`` of its tokens and
    ``first_kept`` of its first ones (100 rounds each; ``mixed``: in generations that asked for free drafters
    beside it); target calls 1 s + 0.3 s a token, a step 0.3 s."""
    from edgespec.policy import FIRST_KEY, Acceptance

    pol = RoundPolicy(probe_every=probe_every)
    for w in range(1, 7):
        pol.measured.observe_target(w, 1.0 + 0.3 * (w - 1))
    pol.measured.observe_draft(0.3, "model")
    for key, kept in (("model", alpha_kept), ("model" + FIRST_KEY, first_kept)):
        (pol.learned_mixed if mixed else pol.learned)[key] = Acceptance(
            prior_accept=0, prior_reject=0, accepted=100 * kept, rejected=100 * (1 - kept), generation=1)
    pol._generation = 1
    return pol


class _PoorFree:
    """A free drafter whose guesses are rarely kept: no draft at its estimate."""
    name, has_cost = "lookup", False

    def offer(self, ctx, kmax):
        return Offer("lookup/1", min(kmax, 2), prior=(0.1, 1.0))


def test_a_confident_drafters_first_token_price_decides_whether_it_drafts():
    """(session 53, a review) Whether a confident draft is drafted at all and the rate it is scored at come from
    the same price. First tokens kept 95%, later ones rarely (0.49 pooled): the pooled estimate alone says no draft
    (1.0 token a second), the first-token price 1.22 at one token; it used to be refused on the first. The other
    way (0.8 pooled, first tokens 0.3): no draft, and such rounds are not counted as ones the costly drafter would
    have won (they made a read of the prompt look repaid)."""
    from edgespec.kv import TokenBuffer

    ctx = TokenBuffer([1, 2, 3], capacity=4096)
    pol = _first_priced(0.49, 0.95)
    d = _Confident()
    pol.begin("auto", {d.name: d}, 1)
    assert pol.cost.best_k(pol.learned["model"].alpha, 4, True)[0] == 0
    assert pol.choose(ctx, 60, None, 4).drafter is d
    pol = _first_priced(0.8, 0.3, mixed=True)
    f = _PoorFree()
    pol.begin("auto", {d.name: d, f.name: f}, 1)
    for _ in range(10):
        assert pol.choose(ctx, 60, None, 4) == NO_DRAFT
    assert pol._costly_rounds == 0


class _Reader:
    """A costly drafter whose drafts end on its confidence and that reads the context before its first draft of a
    generation (the model drafter's offer: never probed before it has read)."""

    name, has_cost = "model", True
    read = False

    def offer(self, ctx, kmax):
        return Offer(self.name, min(kmax, 6), prior=(1.5, 0.5), dynamic=True, upfront=0 if self.read else 100)


class _Sometimes:
    """A free drafter with a copy to offer in two rounds of three, always kept; none in the third."""

    name, has_cost = "lookup", False
    on = True

    def offer(self, ctx, kmax):
        return Offer("lookup/1", min(kmax, 4), prior=(1.2, 0.8)) if self.on else None


def _mixed_generations(pol, m, f, n, model_kept, sampled=False):
    """``n`` generations of ``auto`` (40 rounds): the free drafter's copies always kept, the model drafter's first
    token kept where ``model_kept`` says (the rounds the copies leave it). Returns the rounds the model drafted."""
    from edgespec.kv import TokenBuffer

    ctx = TokenBuffer(list(range(1, 10)), capacity=4096)
    used = 0
    for _ in range(n):
        m.read = False
        pol.begin("auto", {m.name: m, f.name: f}, 1, sampled=sampled)
        for i in range(40):
            f.on = i % 3 != 0
            c = pol.choose(ctx, 200, None, 6)
            if c.drafter is m:
                catchup = None if m.read else (100, 30.0)
                m.read, used = True, used + 1
                pol.observe(c, [5], int(model_kept), 0.3, 2, 1.1, catchup=catchup)
            elif c.drafter is f:
                pol.observe(c, [5] * c.k, c.k, None, c.k + 1, 1 + 0.1 * c.k)
            else:
                pol.observe(c, [], 0, None, 1, 1.0)
    f.on = True
    return used


def _reading_policy() -> RoundPolicy:
    pol = RoundPolicy()
    for w in range(1, 9):
        pol.measured.observe_target(w, 1.0 + 0.1 * (w - 1))
    pol.measured.observe_draft(0.3, "model")
    return pol


@pytest.mark.parametrize("sampled", [False, True])
def test_what_a_costly_drafter_keeps_beside_free_ones_does_not_price_it_alone(sampled):
    """(session 64) Beside free drafters (``auto``) a costly drafter drafts only the rounds their copies leave, the
    hard ones: after such generations lost its drafts there, ``--drafter model`` on the same engine priced its first
    tokens at those rounds' rate, never read the prompt (a drafter that must read first is never probed) and drafted
    nothing for a whole generation (seen once in session 63's probe). Learned apart, it starts from what it keeps
    alone (here, its prior) and drafts; and the other way, what it kept alone does not make ``auto`` try it again
    on the left-over rounds at once."""
    from edgespec.kv import TokenBuffer
    from edgespec.policy import FIRST_KEY, Choice

    pol, m, f = _reading_policy(), _Reader(), _Sometimes()
    ctx = TokenBuffer(list(range(1, 10)), capacity=4096)
    assert _mixed_generations(pol, m, f, 6, model_kept=False, sampled=sampled) > 0  # (from its prior, auto tried it)
    m.read = False
    pol.begin("model", {m.name: m, f.name: f}, 1, sampled=sampled)
    c = pol.choose(ctx, 200, None, 6)
    assert c.drafter is m  # (it drafted nothing here before)
    low = (pol.learned_mixed_sampled if sampled else pol.learned_mixed)["model" + FIRST_KEY].alpha
    assert low < 0.3
    # alone, every draft kept: a high estimate of its own, while auto's stays what auto's rounds taught
    for _ in range(10):
        m.read = True
        pol.observe(Choice(m, 6, "model", stop=0.5), [5] * 6, 6, 0.3, 7, 1.6)
    alone = pol.learned_sampled if sampled else pol.learned
    assert alone["model" + FIRST_KEY].alpha > 0.9
    mixed = pol.learned_mixed_sampled if sampled else pol.learned_mixed
    assert mixed["model" + FIRST_KEY].alpha == pytest.approx(low)
    assert "model" not in (pol.learned if sampled else pol.learned_sampled)  # (greedy and sampled apart too)


def test_a_probe_of_a_confident_drafter_teaches_its_first_token_estimate():
    """(session 53, a review) A probe (one token of a costly drafter left unused for probe_every rounds) drafts a
    first token: it teaches the first-token estimate, which prices the drafter, so a drafter priced out by its
    first tokens whose probes are kept drafts again (its probes taught only the pooled estimate before)."""
    from edgespec.kv import TokenBuffer
    from edgespec.policy import FIRST_KEY

    pol = _first_priced(0.8, 0.3, probe_every=8)
    d = _Confident()
    pol.begin("auto", {d.name: d}, 1)
    ctx = TokenBuffer(list(range(1, 10)), capacity=4096)
    before = pol.estimate(Offer("model" + FIRST_KEY, 4, prior=(1.5, 0.5))).alpha
    probes = drafted = 0
    for _ in range(200):
        c = pol.choose(ctx, 60, None, 4)
        if c.drafter is d:  # (a probe: one token, no confidence stop)
            probes += c.stop is None
            drafted += c.stop is not None
            pol.observe(c, [5], 1, 0.3, 2, 1.3)
        else:
            pol.observe(c, [], 0, None, 1, 1.0)
        ctx.extend([7])
    assert probes >= 1 and drafted > 0, (probes, drafted)
    assert pol.acceptance["model" + FIRST_KEY].alpha > before


@pytest.mark.parametrize("bad", [0.0, float("nan"), float("inf"), -1.0])
def test_costs_ignore_a_clock_reading_that_is_not_a_duration(bad):
    """(session 53, a review) A decoder's clock is the caller's (tests pass simulated ones): a call timed at 0 s
    stuck (the stall clip of 0 is 0) and made rates divide by zero; NaN stuck too. Such readings are not taken."""
    from edgespec.kv import TokenBuffer
    from edgespec.policy import CostModel

    c = CostModel()
    c.observe_target(1, bad)
    c.observe_draft(bad, "model")
    c.observe_catchup(10, bad, "model")
    for _ in range(30):
        c.observe_target(1, 0.05)
        c.observe_draft(0.02, "model")
    assert c.target_cost(1) == pytest.approx(0.05) and c.step_cost("model") == pytest.approx(0.02)
    assert c.best_k(0.8, 4, True)[1] > 0
    pol = RoundPolicy()
    pol.measured.observe_target(1, bad)
    d = _Confident()
    pol.begin("auto", {d.name: d}, 1)
    pol.choose(TokenBuffer([1, 2], capacity=64), 10, None, 4)  # no ZeroDivisionError


def test_cost_priors_follow_the_bytes_where_verify_rows_are_cheap():
    """Session 65: a seeded sampled generation prices every round at the cost model's priors (it measures nothing),
    and the defaults (a verified token 0.15 of a call, a drafter step 0.4: a guess for any CPU) kept the
    Qwen 0.5B drafter out of most seeded T = 1 generations on the Zen 5, where its step is 0.31 of a call and four
    verified tokens cost one. Where the target's verify rows are cheap (edgespec's kernels on AVX-512) the priors
    are that regime's: a verified token at 0.06 and a step at the drafter's streamed weights over the target's."""
    from types import SimpleNamespace as NS

    from edgespec.policy import (CHEAP_ROWS_KNEE, CHEAP_ROWS_SLOPE, CHEAP_ROWS_STEEP, STEP_OVERHEAD, CostModel,
                                 cost_priors)

    def lm(cheap, weights, table):
        return NS(cheap_rows=cheap, spec=NS(gpu_weight_bytes=weights, embedding_bytes=table))

    assert cost_priors(lm(False, 1000, 100), lm(False, 300, 100)) == dict(prior_slope=0.15, prior_step_ratio=0.4)
    assert cost_priors(object()) == dict(prior_slope=0.15, prior_step_ratio=0.4)  # (a scripted LM: the defaults)
    got = cost_priors(lm(True, 1000, 100), lm(False, 300, 120))
    assert got == dict(prior_slope=CHEAP_ROWS_SLOPE, prior_step_ratio=pytest.approx(180 / 900 * STEP_OVERHEAD),
                       prior_knee=CHEAP_ROWS_KNEE, prior_steep=CHEAP_ROWS_STEEP)
    # the prior's cost by width: flat to the knee, steep past it (what a seeded generation prices a wide call at)
    cm = CostModel(prior_slope=0.06, prior_knee=6, prior_steep=0.2)
    assert [round(cm.target_cost(w), 2) for w in (1, 4, 6, 8, 12)] == [1.0, 1.18, 1.3, 1.7, 2.5]
    assert CostModel().target_cost(8) == pytest.approx(1 + 0.15 * 7)  # (no knee: the one slope)
    assert cost_priors(lm(True, 1000, 100), None)["prior_step_ratio"] == 0.4  # no model drafter: its default
    assert cost_priors(lm(True, 1000, 100), lm(False, 5000, 0))["prior_step_ratio"] == 0.6  # clipped
    assert cost_priors(lm(True, 1000, 100), lm(False, 101, 100))["prior_step_ratio"] == 0.1

    # a reproducible generation's cost model holds them, and prices a one-token draft kept half the time (a
    # seeded T = 1 round's first token) as worth drafting where the defaults priced it out
    drafters = {"model": _Oracle("model", True, lambda i: i % 5)}
    for priors, drafts in ((dict(prior_slope=0.15, prior_step_ratio=0.4), False),
                           (dict(prior_slope=CHEAP_ROWS_SLOPE, prior_step_ratio=0.3), True)):
        pol = RoundPolicy(**priors)
        pol.begin("model", drafters, 1, reproducible=True, sampled=True)
        assert isinstance(pol.cost, CostModel) and pol.cost is not pol.measured
        assert pol.cost.prior_slope == priors["prior_slope"]
        assert pol.cost.prior_step() == pytest.approx(priors["prior_step_ratio"] * pol.cost.target_cost(1))
        assert pol.measured.prior_step_ratio == priors["prior_step_ratio"]
        assert (pol.cost.best_k(0.6, 4, True, first=0.5)[0] > 0) is drafts
    with pytest.raises(ValueError, match="prior_step_ratio"):
        RoundPolicy(prior_step_ratio=float("nan"))
    with pytest.raises(ValueError, match="prior_slope"):
        RoundPolicy(prior_slope=-1)
    with pytest.raises(ValueError, match="prior_knee"):
        RoundPolicy(prior_knee=2.5)
    with pytest.raises(ValueError, match="prior_slope"):
        RoundPolicy(prior_slope=True)
    with pytest.raises(ValueError, match="prior_steep .* must be at least prior_slope"):
        RoundPolicy(prior_knee=4, prior_steep=0.0)
    # (session 78, mutants Q34 and Q35) a share of a call past 4 is no prior (a typo's 15 for 0.15); a knee past
    # which rows cost what they did before it is a straight line, and allowed
    for name in ("prior_slope", "prior_step_ratio", "prior_steep"):
        with pytest.raises(ValueError, match=f"{name} must be a number in 0..4"):
            RoundPolicy(**{name: 4.5})
    assert RoundPolicy(prior_slope=4.0, prior_knee=4, prior_steep=4.0).measured.target_cost(8) == pytest.approx(29.0)
    straight = RoundPolicy(prior_slope=0.2, prior_knee=4, prior_steep=0.2).measured
    assert straight.target_cost(9) == pytest.approx(1.0 + 0.2 * 8)
    # one width measured (no width probe: a context too small for it): the prior's shape scaled to it, the knee kept
    one = CostModel(prior_slope=0.06, prior_knee=6, prior_steep=0.2)
    one.observe_target(1, 0.02)
    assert one.target_cost(12) == pytest.approx(0.02 * 2.5) and one.target_cost(4) == pytest.approx(0.02 * 1.18)
    # the step prior is the model drafter's; another costly drafter's (mtp) keeps the default
    cm = CostModel(prior_step_ratio=0.25)
    assert cm.prior_step("model") == pytest.approx(0.25) and cm.prior_step("mtp") == pytest.approx(0.4)
    assert cm.step_cost("mtp") == pytest.approx(0.4)
    dev = NS(device="cuda", spec=NS(gpu_weight_bytes=300, embedding_bytes=120))  # a drafter on a GPU: no bytes' share
    assert cost_priors(lm(True, 1000, 100), dev)["prior_step_ratio"] == 0.4


@pytest.mark.parametrize("drafter", ["none", "model"])
def test_a_generation_that_ends_at_its_first_token_is_one_step_and_one_target_call(drafter):
    """max_new_tokens 1, or a prompt one token short of the window: the first token is the reply, its Step says
    why it ended (length, context) and no round follows (a mutation test, session 67: either bound off by one
    gave the same tokens, an empty second Step and a second target call, and no test noticed)."""
    for kw, prompt, reason in ((dict(max_new_tokens=1), [1, 2, 3], "length"),
                               (dict(max_new_tokens=10), list(range(1, 6)) * 6 + [1], "context")):
        dec = make(max_context=32)
        calls = []
        run_ = dec.target._run
        dec.target._run = lambda *a, **k: calls.append(1) or run_(*a, **k)
        steps = list(dec.generate(prompt, GenerationConfig(drafter=drafter, **kw)))
        assert len(prompt) == 31 or reason == "length"
        assert [(len(s.tokens), s.finish_reason) for s in steps] == [(1, reason)], (kw, steps)
        assert len(calls) == 1, (kw, len(calls))


def test_the_model_drafter_keeps_every_token_the_target_accepted():
    """After a round the drafter's cache holds the context it drafted from and the draft tokens it fed that the
    target kept, so the next draft reads only what the target emitted past them; its calibration learned the
    kept count. Telling it one token fewer was kept (a mutation test's survivor, session 67) gave the same
    output, a longer catch-up every round and a calibration learned low."""
    from edgespec.drafters import learn_calibration

    vocab = 8
    clock = SimClock()  # (the choices depend on the simulated costs alone, not on the machine's timings)
    target = FakeLM(vocab, seed=4, sharpness=3.0, delay=(0.016, 0.0005), clock=clock)
    lm = FakeLM(vocab, table=target.table + np.random.default_rng(6).normal(0, 2.0, target.table.shape),
                delay=(0.002, 0.0), clock=clock)
    md = ModelDrafter(lm, vocab, clock=clock)
    rounds = []
    draft, accept = md.draft, md.accept

    def spy_draft(ctx, k, *a, **kw):
        d = draft(ctx, k, *a, **kw)
        rounds.append(dict(ctx=ctx.tolist(), judge=md._judge, fed=md._fed_drafts, tokens=list(d.tokens)))
        return d

    def spy_accept(n, bonus):
        accept(n, bonus)
        r = rounds[-1]
        r["n"], r["held"] = n, list(lm.cache.ids[: lm.length])

    md.draft, md.accept = spy_draft, spy_accept
    want = [list(md._calib[True]), list(md._calib[False])]
    got, _ = run(Decoder(target, (), drafters=[md], clock=clock), [1, 2, 3], max_new_tokens=80, drafter="model")
    ref, _ = run(Decoder(FakeLM(vocab, seed=4, sharpness=3.0), ()), [1, 2, 3], max_new_tokens=80, drafter="none")
    assert got == ref
    assert len(rounds) > 5 and sum(r["n"] for r in rounds) > 20
    assert any(0 < r["n"] <= r["fed"] for r in rounds)  # fed draft tokens kept
    for r in rounds:
        assert r["held"] == (r["ctx"] + r["tokens"][: min(r["n"], r["fed"])])[md._base:]
    judged = [(r["judge"], r["n"]) for r in rounds if r["judge"] is not None]
    assert len(judged) > 5
    for (greedy, confs), n in judged:  # the sums replayed from the kept counts
        learn_calibration(want[0 if greedy else 1], confs, n)
    assert md._calib[True] == pytest.approx(want[0], rel=1e-12) and md._calib[False] == want[1]


# -- edgespec/drafters.py -------------------------------------------------------------------------------------------
def test_ids_past_the_drafters_embedding_are_fed_as_0_from_its_size_on():
    """(drafters.py fed_ids: ``a >= vocab`` / ``a < vocab``) a drafter with ``vocab`` embedding rows reads ids
    0..vocab - 1; the id ``vocab`` itself (Qwen2.5 7B's first padding id past the 0.5B drafter's 151,936) is past
    them too: fed unmapped, the drafter's Gather reads out of bounds (an onnxruntime error mid-generation)."""
    from edgespec.drafters import fed_ids

    assert fed_ids([0, 5, 6, 7], 6) == [0, 5, 0, 0]
    out = fed_ids(np.array([6, 2], dtype=np.int64), 6)
    assert isinstance(out, np.ndarray) and out.tolist() == [0, 2]
    ids = [0, 5]
    assert fed_ids(ids, 6) is ids and fed_ids([9], None) == [9]  # none past: itself


def test_a_seeded_sampled_generation_reads_the_drafters_window_into_an_emptied_cache(tiny_bundle, monkeypatch):
    """(drafters.py ModelDrafter.draft: ``... or not self.history``) a reproducible generation reuses none of the
    drafter cache's rows an earlier call computed, even where its window starts where the last one's did (a prompt
    within the read window: base 0 both times): on onnxruntime's kernels a row's bits depend on the call that
    computed it, so q and the seeded draws would depend on what ran before."""
    import edgespec

    eng = edgespec.load(tiny_bundle, max_context=256, memory=False)
    md = eng.decoder.drafters["model"]
    P = np.random.default_rng(0).integers(3, 300, size=60).tolist()
    kw = dict(max_new_tokens=12, temperature=1.0, drafter="model", draft_tokens=4, ignore_eos=True)
    eng._collect(eng.stream_ids(P[:40], seed=1, **kw))  # the drafter's cache: P[:40] and a reply
    resets = []
    real = md.lm.reset
    monkeypatch.setattr(md.lm, "reset", lambda: (resets.append(1), real())[1])
    eng._collect(eng.stream_ids(P, seed=2, **kw))
    assert resets  # the window read into an emptied cache
    resets.clear()
    eng._collect(eng.stream_ids(P[:40], max_new_tokens=12, temperature=0.0, drafter="model", draft_tokens=4,
                                ignore_eos=True))
    assert not resets  # (greedy: the prefix the cache shares is kept)


def test_a_model_drafters_offer_leaves_its_draft_room_in_its_own_cache():
    """(drafters.py ModelDrafter.offer: ``max_context - (len(ctx) - base) + 1``) the cache holds the context from
    base on and the draft's first k - 1 tokens: near its end the offer is what still fits, and drafting it fits."""
    from edgespec.kv import TokenBuffer
    from edgespec.sampling import SamplingParams

    from tiny import FakeLM

    for n in (28, 30, 31, 32):
        md = ModelDrafter(FakeLM(8, max_context=32, seed=2), 8)
        ctx = TokenBuffer(np.random.default_rng(n).integers(0, 8, size=n).tolist())
        md.begin(ctx.tolist())
        o = md.offer(ctx, 8)
        room = 32 - n + 1
        assert (o.max_tokens if o is not None else 0) == min(8, room), n
        if o is not None:
            d = md.draft(ctx, o.max_tokens, SamplingParams(), np.random.default_rng(0))
            assert len(d.tokens) == o.max_tokens and md.lm.length <= 32


def test_prompt_lookup_refuses_a_zero_length_ngram():
    """(drafters.py PromptLookupDrafter: ``1 <= min_ngram``) an n-gram of no tokens matches everywhere: a draft of
    whatever followed the context's last position, keyed as a match. Refused, as a max below the min is."""
    for lo, hi in ((0, 3), (-1, 2), (3, 2)):
        with pytest.raises(ValueError, match="min_ngram"):
            PromptLookupDrafter(min_ngram=lo, max_ngram=hi)
    assert PromptLookupDrafter(min_ngram=1, max_ngram=1).min_ngram == 1


def test_a_hint_is_fed_within_the_drafters_embedding_on_every_path():
    """(drafters.py ModelDrafter.draft: ``lm.forward(self._fit(hint))``) a free drafter's hint may hold an id past the
    drafter's embedding (a padding id the target wrote, Qwen2.5 7B's 152,064 against the 0.5B's 151,936): fed with the
    first step after a first read, or with a catch-up, it goes in as 0, as context tokens do; fed as it is, the
    drafter's Gather reads out of bounds (an onnxruntime error mid-generation). The draft is the one without a hint."""
    from edgespec.kv import TokenBuffer
    from edgespec.sampling import SamplingParams

    from tiny import FakeLM

    class Bounded(FakeLM):  # the drafter's embedding: 8 rows
        def _run(self, ids, past):
            assert all(0 <= int(t) < self.vocab for t in ids), f"id past the drafter's embedding: {list(ids)}"
            self.fed = getattr(self, "fed", []) + [[int(t) for t in ids]]
            return super()._run(ids, past)

    greedy, rng = SamplingParams(), np.random.default_rng(0)
    ctx = TokenBuffer([1, 9, 2, 8, 3, 4])  # (the target's vocabulary: 10)
    plain = ModelDrafter(Bounded(8, seed=3), 10, in_vocab=8)
    plain.begin(ctx.tolist())
    want = plain.draft(ctx, 4, greedy, rng).tokens
    md = ModelDrafter(Bounded(8, seed=3), 10, in_vocab=8)
    md.begin(ctx.tolist())
    first = md.draft(ctx, 4, greedy, rng, hint=[want[0], 9, 8])  # a first read: the hint goes in with the first step
    assert first.tokens == want and [want[0], 0, 0] in md.lm.fed  # (the hint's call)
    md.accept(1, 9)
    ctx = TokenBuffer(ctx.tolist() + [want[0], 9])
    nxt = ModelDrafter(Bounded(8, seed=3), 10, in_vocab=8)
    nxt.begin(ctx.tolist())
    want = nxt.draft(ctx, 3, greedy, rng).tokens
    md.lm.fed = []
    assert md.draft(ctx, 3, greedy, rng, hint=[want[0], 8]).tokens == want  # the catch-up's call with its hint
    assert md.lm.fed[0][-2:] == [want[0], 0]
