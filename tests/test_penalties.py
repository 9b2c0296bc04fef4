"""Logit bias and repetition penalties (edgespec/penalties.py) under speculative decoding: the output is
target-only decoding's with the same settings, computed here by an independent reference (greedy token for
token under every drafter; sampled by a chi-square test over whole sequences, and a planted bug it catches:
verify rows penalized without the draft tokens before them)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import edgespec
from edgespec.decoder import MAX_HEAL, Decoder, GenerationConfig
from edgespec.drafters import ModelDrafter, PromptLookupDrafter
from edgespec.errors import ConfigError
from edgespec.prediction import MAX_PREDICTION
from edgespec.sampling import SamplingParams, probs
from test_decoder import _chi2, _chi2_crit, make, run, suffix_drafter
from tiny import FakeLM, split_runs

PROMPT = [1, 2, 1, 2, 1]
SETTINGS = [dict(frequency_penalty=1.5), dict(presence_penalty=2.0), dict(repetition_penalty=1.8),
            dict(logit_bias=((3, 2.5), (0, -1.0))),
            dict(logit_bias=((2, 1.0),), frequency_penalty=0.7, presence_penalty=-0.5, repetition_penalty=1.3)]


def reference_logits(row, prompt, reply, logit_bias=(), presence_penalty=0.0, frequency_penalty=0.0,
                     repetition_penalty=1.0):
    """vLLM's processing, written out token by token: bias, repetition over prompt and reply, then the
    reply's frequency and presence."""
    x = np.array(row, dtype=np.float64)
    for t, b in logit_bias:
        x[t] += b
    for t in set(prompt) | set(reply):
        x[t] = x[t] / repetition_penalty if x[t] > 0 else x[t] * repetition_penalty
    for t in set(reply):
        x[t] -= frequency_penalty * reply.count(t) + presence_penalty
    return x


def reference_greedy(target: FakeLM, prompt, n, **pen):
    reply = []
    for _ in range(n):
        reply.append(int(np.argmax(reference_logits(target.logits_for(list(prompt) + reply), prompt, reply, **pen))))
    return reply


@pytest.mark.parametrize("pen", SETTINGS)
def test_greedy_output_is_target_only_decodings_with_the_same_penalties(pen):
    dec = make()
    changed = 0
    for prompt in (PROMPT, [3, 3, 0, 1], [0], [2, 2, 5, 7, 1]):
        ref = reference_greedy(dec.target, prompt, 40, **pen)
        changed += run(dec, prompt, max_new_tokens=40, drafter="none")[0] != ref
        for d, k in (("none", None), ("model", 3), ("model", None), ("prompt-lookup", None), ("suffix", None),
                     ("auto", None)):
            got, _ = run(dec, prompt, max_new_tokens=40, drafter=d, draft_tokens=k, **pen)
            assert got == ref, (prompt, d, k, pen)
    assert changed  # the settings changed some replies


def _exact(target: FakeLM, prompt, n, sp, pen):
    out = {}
    for seq in itertools.product(range(target.vocab), repeat=n):
        p, reply = 1.0, []
        for t in seq:
            row = reference_logits(target.logits_for(list(prompt) + reply), prompt, reply, **pen)
            p *= probs(row[None], sp)[0][t]
            reply.append(t)
        out[seq] = p
    return out


def _counts(sp, pen, runs, drafter, k=2, n=4):
    """Chi-square of ``runs`` seeded generations of ``n`` tokens against the penalized distribution. At 4 tokens a
    round verifies two draft tokens (at 3 only one: a block's later rows went untested; session 55, a review)."""
    from edgespec.decoder import Stats

    vocab = 4

    def work(seeds):
        target = FakeLM(vocab, seed=7, sharpness=1.0, reuse_buffer=True)
        dl = FakeLM(vocab, table=target.table + np.random.default_rng(3).normal(0, 1.0, target.table.shape),
                    reuse_buffer=True)
        dec = Decoder(target, (), drafters=[ModelDrafter(dl, vocab), PromptLookupDrafter(), suffix_drafter(vocab, 7)])
        counts: dict = {}
        deep = 0
        for i in seeds:
            st = Stats()
            out, _ = run(dec, PROMPT, st, max_new_tokens=n, temperature=sp.temperature, top_k=sp.top_k,
                         top_p=sp.top_p, seed=i, drafter=drafter, draft_tokens=k, **pen)
            counts[tuple(out)] = counts.get(tuple(out), 0) + 1
            deep += len(st.drafted_by_position) > 1 and st.drafted_by_position[1] > 0
        return counts, deep

    counts, deep = split_runs(work, runs)
    assert deep >= runs // 20, deep  # blocks of two draft tokens verified
    return _chi2(counts, _exact(FakeLM(vocab, seed=7, sharpness=1.0), PROMPT, n, sp, pen), runs)


PEN = dict(logit_bias=((1, 0.8),), frequency_penalty=1.2, presence_penalty=0.4, repetition_penalty=1.5)


@pytest.mark.parametrize("drafter, sp", [("model", SamplingParams(1.0)), ("model", SamplingParams(0.7, top_k=3)),
                                         ("prompt-lookup", SamplingParams(1.0)), ("auto", SamplingParams(1.3, top_p=0.8))])
def test_sampled_output_follows_the_penalized_distribution(drafter, sp):
    stat, df = _counts(sp, PEN, 4000, drafter)
    assert stat < _chi2_crit(df), f"chi2 {stat:.1f} with {df} dof"


def test_the_statistical_test_catches_rows_penalized_without_the_draft_before_them(monkeypatch):
    from edgespec.penalties import Penalizer

    real = Penalizer.rows
    monkeypatch.setattr(Penalizer, "rows", lambda self, logits, draft=(): real(self, logits, ()) if len(logits) == 1
                        else np.concatenate([real(self, logits[i:i + 1], ()) for i in range(len(logits))]))
    stat, df = _counts(SamplingParams(1.0), PEN, 4000, "model")
    assert stat > _chi2_crit(df), f"the planted bug went unnoticed (chi2 {stat:.1f}, {df} dof)"


def test_the_statistical_test_catches_later_rows_penalized_with_the_first_draft_token_only(monkeypatch):
    """(session 55, a review) A bug only a block's third row shows: rows after the second penalized as if the draft
    were its first token alone. At 3 new tokens no block had a third row; at 4 it is caught."""
    from edgespec.penalties import Penalizer

    real = Penalizer.rows

    def rows(self, logits, draft=()):
        out = real(self, logits, draft)
        for i in range(2, len(out)):
            out[i] = real(self, np.stack([logits[i]] * 2), list(draft[:1]))[1]
        return out

    monkeypatch.setattr(Penalizer, "rows", rows)
    stat, df = _counts(SamplingParams(1.0), PEN, 4000, "model")
    assert stat > _chi2_crit(df), f"the planted bug went unnoticed (chi2 {stat:.1f}, {df} dof)"


@pytest.mark.parametrize("kw, msg", [
    (dict(presence_penalty=2.5), "presence_penalty must be in -2..2"),
    (dict(frequency_penalty=float("nan")), "frequency_penalty must be"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be in"),
    # (session 48) one so small that positive logits overflowed float32 to inf: a BundleError blaming the model
    (dict(repetition_penalty=1e-40), r"repetition_penalty must be in \[0.01, 10\]"),
    (dict(repetition_penalty="1.1"), "repetition_penalty must be a number"),
    (dict(logit_bias={1: 101}), "logit_bias of token 1 must be in -100..100"),
    (dict(logit_bias={"1": 5}), "logit_bias must map token ids"),
    (dict(logit_bias=[(1, True)]), "logit_bias must map token ids"),
    (dict(logit_bias=5), "logit_bias must map token ids"),
    (dict(logit_bias=[(5, 100), (5, 100)]), "logit_bias lists token 5 twice"),
    (dict(logit_bias={5: 10**400}), "logit_bias of token 5 must be in -100..100"),
    (dict(presence_penalty=10**400), "presence_penalty must be in -2..2"),
    (dict(temperature=10**400), "temperature must be a finite number >= 0, got an integer of 1,329 bits"),  # (untyped before 43)
    # (session 96, decoder_mut.py) one past the other bounds, and the options that do not go together
    (dict(logit_bias=[(True, 1.0)]), "logit_bias must map token ids"),
    (dict(seed=2**63), "seed must be in"),
    (dict(heal=b"x" * (MAX_HEAL + 1)), "heal holds"),
    (dict(prediction=(1,) * (MAX_PREDICTION + 1)), "at most"),
    (dict(heal=b"x", grammar="start: /a/"), "token healing cannot be combined"),
    (dict(grammar="start: /a/", ignore_eos=True), "ignore_eos cannot be used with a response format"),
    (dict(drafter="prediction"), "drafter 'prediction' needs a prediction")])
def test_bad_penalties_and_options_are_refused(kw, msg):
    with pytest.raises(ConfigError, match=msg):
        GenerationConfig(**kw)


def test_numpy_scalars_are_taken_as_the_numbers_they_are():
    """(session 48, a review) An int8 logprobs or top_k passed the type check and overflowed in the arithmetic with
    the vocabulary's size after it (an untyped OverflowError)."""
    c = GenerationConfig(logprobs=np.int8(3), top_k=np.uint8(5), temperature=np.float32(0.5), seed=np.int16(4))
    assert (c.logprobs, c.top_k, c.seed) == (3, 5, 4) and type(c.logprobs) is int and type(c.temperature) is float
    assert type(c.top_k) is int


def test_a_zero_bias_is_no_processing():
    assert not GenerationConfig(logit_bias={5: 0.0}).penalized and GenerationConfig(logit_bias={5: 0.0}).logit_bias == ()
    assert not GenerationConfig().penalized and GenerationConfig(repetition_penalty=1.1).penalized


def test_on_an_exported_model_a_bias_forces_a_token_and_ids_are_checked(tiny_bundle):
    eng = edgespec.load(tiny_bundle, memory=False)
    t = eng.tokenizer.encode(" cat")[-1]
    r = eng.generate("hello world", max_new_tokens=8, drafter="auto", logit_bias={t: 100})
    assert r.token_ids == [t] * 8
    # a frequency penalty against the same bias: the token cannot win forever
    r = eng.generate("hello world", max_new_tokens=30, drafter="auto", logit_bias={t: 30}, frequency_penalty=2.0)
    assert r.token_ids[0] == t and r.token_ids.count(t) < 30
    assert r.token_ids == eng.generate("hello world", max_new_tokens=30, drafter="none", logit_bias={t: 30},
                                       frequency_penalty=2.0).token_ids
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        eng.generate("hello", max_new_tokens=2, logit_bias={10**6: 1.0})
    # (session 64, a review) a row of the model no token of the tokenizer has (a padding row: Qwen2.5 has 271 past
    # its tokens; tests/test_qwen.py on the real one) is refused: a positive bias made the reply that row's name
    last = eng.decoder.vocab - 1
    from types import SimpleNamespace

    from edgespec.tokenizer import Tokenizer

    real = eng.tokenizer._tok
    for pad in (None, f"[PAD{last}]"):  # (none there, or llama.cpp's converter's filler in a GGUF's vocabulary)
        padded = SimpleNamespace(_tok=SimpleNamespace(id_to_token=lambda i, pad=pad: pad if i == last
                                                      else real.id_to_token(i)))
        assert Tokenizer.is_padding(padded, last) and not Tokenizer.is_padding(padded, t)
    assert not eng.tokenizer.is_padding(last)
    eng.tokenizer.is_padding = lambda i: i == last
    with pytest.raises(ConfigError, match=f"logit_bias holds token id {last}, which no token of this model's"):
        eng.generate("hello", max_new_tokens=2, logit_bias={last: 100.0})
    # a ban is harmless, and clients ban every id past the tokenizer's so: taken
    assert last not in eng.generate("hello", max_new_tokens=4, logit_bias={last: -100.0}).token_ids
    del eng.tokenizer.is_padding
    assert eng.generate("hello", max_new_tokens=2, logit_bias={last: 100.0}).token_ids == [last, last]


def test_the_cli_takes_penalties_and_refuses_bad_ones_before_loading(tiny_bundle):
    import json
    import subprocess
    import sys

    cli = [sys.executable, "-m", "edgespec.cli", "generate", str(tiny_bundle), "-p", "hello world",
           "--max-new-tokens", "6", "--no-memory"]
    p = subprocess.run([*cli, "--logit-bias", "300=100", "--frequency-penalty", "0.5", "--json"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    eng = edgespec.load(tiny_bundle, memory=False)
    assert json.loads(p.stdout)["token_ids"] == eng.generate("hello world", max_new_tokens=6, logit_bias={300: 100},
                                                             frequency_penalty=0.5).token_ids
    for args, msg in ((["--logit-bias", "x=1"], "--logit-bias takes ID=BIAS"), (["--logit-bias", "5"], "ID=BIAS"),
                      (["--presence-penalty", "3"], "presence_penalty must be in -2..2"),
                      (["--repetition-penalty", "0"], "repetition_penalty must be in"),
                      (["--logit-bias", "99999=1"], "outside the vocabulary")):
        p = subprocess.run([*cli, *args], capture_output=True, text=True, timeout=120)
        assert p.returncode != 0 and msg in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_bench_penalties_runs_on_a_tiny_bundle(tiny_bundle, tmp_path):
    """scripts/bench_penalties.py (README, Penalties and logit bias) end to end: every reply equal to plain
    decoding's with the same setting, one row per setting and drafter."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parent.parent / "scripts" / "bench_penalties.py"
    out = tmp_path / "pen.md"
    r = subprocess.run([sys.executable, str(script), str(tiny_bundle), "--limit", "28", "--max-new-tokens", "10",
                        "--drafters", "none,model", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert "equal to plain decoding's" in text and text.count("| model |") == 4
    r = subprocess.run([sys.executable, str(script), str(tiny_bundle), "--drafters", "model"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 2 and "must start with none" in r.stderr


@pytest.mark.parametrize("pen", SETTINGS)
def test_logprobs_stay_the_models_own_under_penalties(pen):
    """A reply's logprobs are the target's log-softmax before the penalties and the bias (as vLLM's and OpenAI's
    ``logprobs``): the penalties change which tokens come, not what the model said of them. A mutation test
    (session 67) found nothing checked it: the processing written into the logits' own buffer gave penalized
    logprobs and every test passed."""
    dec = make()
    for d in ("none", "model", "auto"):
        out, lps = [], []
        for step in dec.generate(PROMPT, GenerationConfig(max_new_tokens=12, logprobs=1, drafter=d, **pen)):
            out += step.tokens
            lps += step.logprobs
        assert [t.token for t in lps] == out and len(out) == 12
        for j, t in enumerate(lps):
            x = np.asarray(dec.target.logits_for(PROMPT + out[:j]), dtype=np.float64)
            want = x[t.token] - x.max() - np.log(np.exp(x - x.max()).sum())
            assert t.logprob == pytest.approx(want, abs=1e-4), (d, j, pen)


@pytest.mark.parametrize("pen", SETTINGS)
def test_greedy_output_with_penalties_on_a_target_that_verifies_alternates(pen):
    """Rounds verify no alternates under penalties (an alternate's row has no penalized logits of its own): on a
    target that verifies alternates (tiny.AltFakeLM, alternates on), greedy output with penalties is still the
    reference's. A mutation test (session 67): the decoder's ``pen is None`` left out of its alternates condition
    changed 28 of 30 replies, and no test used such a target with penalties."""
    from tiny import AltFakeLM

    target = AltFakeLM(8, 512, seed=0)
    dl = FakeLM(8, 512, table=target.table + 0.5 * np.random.default_rng(100).normal(size=target.table.shape))
    dec = Decoder(target, (), drafters=[ModelDrafter(dl, 8), PromptLookupDrafter()])
    assert dec.policy.use_alternates
    for prompt in (PROMPT, [3, 3, 0, 1], [2, 2, 5, 7, 1]):
        ref = reference_greedy(target, prompt, 30, **pen)
        for d in ("model", "auto"):
            st = edgespec.decoder.Stats()
            got, _ = run(dec, prompt, st, max_new_tokens=30, drafter=d, draft_tokens=3, **pen)
            assert got == ref and st.alternates == 0, (prompt, d, pen)
