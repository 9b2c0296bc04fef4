"""Logprobs: each generated token's log-probability under the target, with the most likely tokens at its
position, as a target-only decoder would compute them, under every drafter.

The reference is independent of the decoder: the target alone (``OnnxLM``, the width policy as in
target-only decoding) reads the prompt and then the reply one token a call, and its rows' log-softmax is
taken here in float64. Speculative rounds compute the same rows inside wider verify calls; on the CPU those
rows equal a one-token call's (the width policy: tests/test_exactness.py), so the values agree to rounding.
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time

import numpy as np
import pytest

import edgespec
from edgespec.decoder import MAX_LOGPROBS, GenerationConfig, token_logprobs
from edgespec.errors import ConfigError
from edgespec.manifest import load_manifest
from edgespec.onnx_lm import OnnxLM
from edgespec.providers import choose

PROMPTS = ["one two three one two three one two", "hello world, the cat sat on the"]
ATOL = 1e-5


def reference(bundle, prompt: list[int], reply: list[int], top: int):
    """(logprob of each reply token, its position's ``top`` most likely ids and their logprobs), teacher-forced."""
    m = load_manifest(bundle)
    lm = OnnxLM(m.target, len(prompt) + len(reply) + 8, choose(["cpu"]))
    vocab = m.target.vocab_size
    rows = [lm.forward(prompt)[-1, :vocab]]
    for t in reply[:-1]:
        rows.append(lm.forward([t])[-1, :vocab])
    out = []
    for row, t in zip(rows, reply):
        x = row.astype(np.float64)
        lp = x - x.max() - np.log(np.exp(x - x.max()).sum())
        best = np.argsort(-lp, kind="stable")[:top]
        out.append((lp[t], [int(i) for i in best], [lp[i] for i in best]))
    return out


def check(bundle, prompt, r, top):
    assert r.logprobs is not None and [e["token_id"] for e in r.logprobs] == r.token_ids
    ref = reference(bundle, prompt, r.token_ids, top)
    for i, (e, (lp, ids, lps)) in enumerate(zip(r.logprobs, ref)):
        assert abs(e["logprob"] - lp) < ATOL, (i, e["logprob"], lp)
        assert [t["token_id"] for t in e["top_logprobs"]] == ids, i
        assert np.allclose([t["logprob"] for t in e["top_logprobs"]], lps, atol=ATOL, rtol=0), i


@pytest.mark.parametrize("drafter, k", [("none", None), ("model", None), ("model", 4), ("prompt-lookup", None),
                                        ("suffix", None), ("auto", None)])
def test_greedy_logprobs_are_the_targets_under_every_drafter(tiny_bundle, drafter, k):
    eng = edgespec.load(tiny_bundle, memory=False)
    for text in PROMPTS:
        prompt = eng.tokenizer.encode(text)
        eng.reset()
        plain = eng.generate(text, max_new_tokens=40, drafter="none")
        eng.reset()
        r = eng.generate(text, max_new_tokens=40, drafter=drafter, draft_tokens=k, logprobs=5)
        assert r.token_ids == plain.token_ids  # (logprobs change nothing of the reply)
        check(tiny_bundle, prompt, r, 5)
        for e in r.logprobs:  # greedy: each token is its position's most likely
            assert e["top_logprobs"][0]["token_id"] == e["token_id"]
        if drafter != "none":
            assert r.stats["drafted"] > 0  # the values came from verify calls of several tokens


@pytest.mark.parametrize("bundle", ["tiny_bundle", "tiny_int4_bundle"])
def test_wide_verify_calls_keep_the_logprobs_of_plain_decoding_bit_for_bit(bundle, request):
    """(session 45, a review) A draft of 32 tokens made a verify call of 33, whose last row onnxruntime's MLAS
    computed on its one-row path (a call's rows split between 2 threads: 32 and 1), so greedy speculative logprobs
    differed from plain decoding's from the 33rd token on (and a near tie's token could flip); the width probe had
    checked calls of 1-9 tokens only. The probe now checks every width to 16 on onnxruntime's CPU kernels and
    verify calls carry no more than it verified: a prediction drafted 32 at a time gives plain decoding's bits."""
    b = request.getfixturevalue(bundle)
    eng = edgespec.load(b, memory=False)
    target = eng.decoder.target
    assert target.verified_width is not None and 9 <= target.verified_width <= 16
    kw = dict(max_new_tokens=80, ignore_eos=True, logprobs=3)
    prompt = "def hello world return + 1 The quick brown fox"
    eng.reset()
    plain = eng.generate(prompt, drafter="none", **kw)
    for k in (32, 64):
        eng.reset()
        r = eng.generate(prompt, drafter="prediction", prediction=plain.token_ids, draft_tokens=k, max_draft_tokens=k,
                         **kw)
        assert r.token_ids == plain.token_ids and r.logprobs == plain.logprobs, k
        assert r.stats["drafted"] > 40  # (long drafts were made; the calls carried what was verified)


def test_a_prompts_first_token_is_computed_alike_fresh_and_repeated(tiny_bundle):
    """(session 45, a review) A fresh prompt of 33 tokens was prefilled in one call, whose last row onnxruntime's MLAS
    computed on its one-row path; the same prompt again (a second choice of one request, n = 2) fed its last token
    alone: the first token's logits differed, and so could two greedy choices. A target bounded to verified widths
    feeds a prefill's last token in a call of its own now."""
    eng = edgespec.load(tiny_bundle, memory=False)
    assert eng.decoder.target.split_last and not eng.decoder.drafters["model"].lm.split_last
    for n in (17, 33, 34, 65):
        ids = [(7 * i + 300) % 370 for i in range(n)]
        eng.reset()
        kw = dict(max_new_tokens=3, drafter="none", logprobs=5, ignore_eos=True)
        fresh = eng._collect(eng.stream_ids(ids, **kw))
        again = eng._collect(eng.stream_ids(ids, **kw))
        assert again.stats["reused_prompt_tokens"] == n - 1
        assert again.logprobs == fresh.logprobs and again.token_ids == fresh.token_ids, n


@pytest.mark.parametrize("drafter", ["none", "model", "auto"])
def test_sampled_logprobs_are_the_targets_untempered(tiny_bundle, drafter):
    """Under sampling the logprobs are the model's (the softmax of its logits), not the tempered, truncated
    distribution the token was drawn from: OpenAI's and vLLM's, and a target-only decoder's."""
    eng = edgespec.load(tiny_bundle, memory=False)
    text = PROMPTS[1]
    r = eng.generate(text, max_new_tokens=40, drafter=drafter, temperature=0.7, top_p=0.9, seed=5, logprobs=3)
    check(tiny_bundle, eng.tokenizer.encode(text), r, 3)
    # the same request without logprobs samples the same reply (logprobs change nothing of it)
    eng.reset()
    assert eng.generate(text, max_new_tokens=40, drafter=drafter, temperature=0.7, top_p=0.9, seed=5).token_ids \
        == r.token_ids


def test_logprobs_under_a_response_format_are_the_models(tiny_bundle):
    pytest.importorskip("llguidance")
    eng = edgespec.load(tiny_bundle, memory=False)
    text = PROMPTS[0]
    r = eng.generate(text, max_new_tokens=30, drafter="auto", logprobs=2, response_format={"type": "json_object"})
    assert r.text.lstrip().startswith("{")
    check(tiny_bundle, eng.tokenizer.encode(text), r, 2)


def test_token_logprobs_ranks_and_normalizes():
    rows = np.array([[0.0, 2.0, 1.0, 2.0], [-np.inf, 0.0, 0.0, 0.0]], dtype=np.float32)
    a, b = token_logprobs(rows, [2, 3], 3)
    assert [i for i, _ in a.top] == [1, 3, 2]  # ties: the lower id first
    assert np.isclose(sum(np.exp(v) for _, v in a.top) + np.exp(rows[0, 0] - np.log(np.exp(rows[0]).sum())), 1)
    assert np.isclose(b.logprob, -np.log(3)) and [i for i, _ in b.top] == [1, 2, 3]
    assert token_logprobs(rows, [0], 0)[0].top == ()
    assert len(token_logprobs(rows[:1], [0], 9)[0].top) == 4  # at most the vocabulary
    # (session 96, DC27, DC28) many ties, and ties across the cut: the lower ids, past numpy's small-array sorts
    # (a plain argsort kept the ids' order on short rows only; argpartition picked any of the tied ones at the cut)
    many = np.random.default_rng(0).integers(0, 2, 300).astype(np.float32)
    many[::37] = 2  # (a few above the ~150 tied at the cut)
    for x in (many, np.repeat(np.float32([0, 1]), [5, 59])):
        want = sorted(range(len(x)), key=lambda j: (-x[j], j))[:MAX_LOGPROBS]
        assert [i for i, _ in token_logprobs(x[None], [0], MAX_LOGPROBS)[0].top] == want


@pytest.mark.parametrize("bad", [-1, MAX_LOGPROBS + 1, "3", True, 2.0])
def test_bad_logprobs_are_refused(tiny_bundle, bad):
    with pytest.raises(ConfigError, match="logprobs"):
        GenerationConfig(logprobs=bad)
    eng = edgespec.load(tiny_bundle, memory=False)
    with pytest.raises(ConfigError, match="logprobs"):
        eng.generate("hello", max_new_tokens=4, logprobs=bad)


def test_logprobs_line_up_with_the_text_streamed_or_whole(smol_int4):
    """On a real byte-level model: one entry per returned token, its bytes spelling the reply, its offset where
    its text starts; streamed, each delta carries the entries whose text it begins, and a stop string's
    tokens are left out as they are of the ids."""
    eng = edgespec.load(smol_int4, memory=False)
    msgs = [{"role": "user", "content": "Name three colours of the rainbow, one per line."}]
    r = eng.generate(msgs, max_new_tokens=48, drafter="auto", logprobs=2)
    assert [e["token_id"] for e in r.logprobs] == r.token_ids and len(r.logprobs) == len(r.token_ids)
    spelled = b"".join(bytes(e["bytes"]) for e in r.logprobs if e["token_id"] not in eng.tokenizer.eos_token_ids)
    assert spelled.decode("utf-8") == r.text
    offsets = [e["offset"] for e in r.logprobs]
    assert offsets == sorted(offsets) and offsets[0] == 0 and offsets[-1] <= len(r.text)
    for e, nxt in zip(r.logprobs, offsets[1:] + [len(r.text)]):
        if e["token_id"] not in eng.tokenizer.eos_token_ids:  # (the end of sequence has no text in the reply)
            assert r.text[e["offset"]:nxt] == bytes(e["bytes"]).decode("utf-8"), e
    # streamed: the deltas' entries put together are the whole reply's, none before its text
    eng.reset()
    text, got = "", []
    for d in eng.stream_ids(eng.encode(msgs), max_new_tokens=48, drafter="auto", logprobs=2):
        text += d.text
        assert all(e["offset"] < len(text) or d.stats.finish_reason for e in d.logprobs)
        got += d.logprobs
    assert text == r.text and got == r.logprobs
    # a stop string in the middle of the reply: the entries stop with the ids
    stop = r.text[len(r.text) // 2:len(r.text) // 2 + 5]
    cut = r.text.index(stop)
    eng.reset()
    s = eng.generate(msgs, max_new_tokens=48, drafter="auto", logprobs=2, stop=[stop])
    assert s.finish_reason == "stop" and s.text == r.text[:cut]
    assert [e["token_id"] for e in s.logprobs] == s.token_ids == r.token_ids[:len(s.token_ids)]
    assert s.logprobs == r.logprobs[:len(s.logprobs)]


def test_the_cli_prints_logprobs_with_json(tiny_bundle):
    cli = [sys.executable, "-m", "edgespec.cli", "generate", str(tiny_bundle), "-p", PROMPTS[0],
           "--max-new-tokens", "6", "--no-memory"]
    p = subprocess.run([*cli, "--json", "--logprobs", "2"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert [e["token_id"] for e in out["logprobs"]] == out["token_ids"]
    assert all(len(e["top_logprobs"]) == 2 for e in out["logprobs"])
    for args, msg in (([], "--logprobs is printed with --json"), (["--json", "--logprobs", "21"], "logprobs must be")):
        p = subprocess.run([*cli, "--logprobs", "2", *args] if not args else [*cli, *args], capture_output=True,
                           text=True, timeout=120)
        assert p.returncode != 0 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_a_scored_prompt_holds_the_replys_logprobs_teacher_forced(tiny_bundle):
    """``Engine.score`` (a text's own logprobs, OpenAI's echo) reads every position: on the prompt and the reply a
    generation gave, it gives the reply's logprobs again, and the prompt's the target alone gives."""
    eng = edgespec.load(tiny_bundle, memory=False)
    text = PROMPTS[0]
    prompt = eng.tokenizer.encode(text)
    r = eng.generate(text, max_new_tokens=100, drafter="auto", logprobs=4)  # > SCORE_CHUNK: several calls
    whole, entries = eng.score(prompt + r.token_ids, logprobs=4)
    assert len(entries) == len(prompt) + len(r.token_ids) and entries[0]["logprob"] is None
    assert entries[0]["top_logprobs"] == [] and [e["token_id"] for e in entries] == prompt + r.token_ids
    for got, e in zip(entries[len(prompt):], r.logprobs):
        assert abs(got["logprob"] - e["logprob"]) < ATOL
        assert [t["token_id"] for t in got["top_logprobs"]] == [t["token_id"] for t in e["top_logprobs"]]
    ref = reference(tiny_bundle, prompt[:1], prompt[1:], 4)
    assert np.allclose([e["logprob"] for e in entries[1:len(prompt)]], [x[0] for x in ref], atol=ATOL, rtol=0)
    assert whole == eng.tokenizer.decode(prompt + r.token_ids)
    assert [e["offset"] for e in entries] == sorted(e["offset"] for e in entries)
    # the target now holds the scored text: a generation after it reads only its last token
    s, _ = eng.score(text, logprobs=0)
    assert s == text
    g = eng.generate(text, max_new_tokens=2, drafter="none")
    assert g.stats["reused_prompt_tokens"] == len(prompt) - 1 and g.token_ids == r.token_ids[:2]


def test_bad_prompts_to_score_are_refused(tiny_bundle):
    from edgespec.errors import ContextOverflowError

    eng = edgespec.load(tiny_bundle, memory=False)
    for bad, err, msg in (([], ConfigError, "empty"), ([1, 10**9], ConfigError, "outside the vocabulary"),
                          ([1] * (eng.max_context + 1), ContextOverflowError, "context"),
                          ({"a": 1}, ConfigError, "text or a list of token ids"), ([1, True], ConfigError, "text or")):
        with pytest.raises(err, match=msg):
            eng.score(bad, logprobs=0)
    for top in (99, -1, None, 2.5, True, "2", MAX_LOGPROBS + 1):
        with pytest.raises(ConfigError, match="logprobs must be"):
            eng.score("hi", logprobs=top)
    assert len(eng.score("hi there", logprobs=MAX_LOGPROBS)[1][-1]["top_logprobs"]) == MAX_LOGPROBS  # (DC56: the bound)


def test_scoring_keeps_the_conversation_it_overwrites_in_the_prompt_cache(tiny_bundle):
    """A score reads from the first position, as a prefill of another prompt overwrites the cache: the rows it
    overwrites go to the prompt cache first, and the conversation's next turn restores them."""
    eng = edgespec.load(tiny_bundle, memory=False, prompt_cache_mb=16)
    long = " ".join(PROMPTS * 6)
    eng.generate(long, max_new_tokens=8)
    eng.score("a different text to score, read from its start", logprobs=0)
    g = eng.generate(long + " more", max_new_tokens=4)
    assert g.stats["restored_prompt_tokens"] > 40, g.stats


def test_perplexity_is_the_scored_halves_of_its_windows(tiny_bundle, tmp_path):
    from edgespec.perplexity import perplexity

    eng = edgespec.load(tiny_bundle, memory=False)
    text = " ".join(PROMPTS * 12)
    ids = eng.tokenizer.encode(text, parse_special=False)
    t0 = time.perf_counter()
    r = perplexity(eng, ids, window=32, max_windows=3)
    assert 0 < r.seconds <= time.perf_counter() - t0  # (session 100, PX26, PX27) the call's own time
    assert (r.windows, r.tokens, r.window) == (3, 45, 32)
    nll = []
    for w in range(3):  # each window read from its start, positions 17..31 scored (llama-perplexity's)
        win = ids[w * 32:(w + 1) * 32]
        nll += [-x[0] for x in reference(tiny_bundle, win[:17], win[17:], 0)]
    assert abs(r.nll - np.mean(nll)) < ATOL and abs(r.perplexity - np.exp(np.mean(nll))) < 1e-3 * r.perplexity
    assert perplexity(eng, ids, window=32).windows == len(ids) // 32
    # (session 83, mutants X1, X2, X9, X14, X15) the text's tokens, the rate of tokens read (each window's every
    # token), more windows asked than the text has, the progress after each window
    assert r.text_tokens == len(ids) and r.to_dict()["tokens_per_second"] == round(3 * 32 / r.seconds, 2)
    done = []
    few = perplexity(eng, ids[:70], window=32, max_windows=5, progress=lambda *a: done.append(a))
    assert few.windows == 2 and few.tokens == 30 and few.text_tokens == 70
    assert [d[:2] for d in done] == [(1, 2), (2, 2)] and done[-1][2] == pytest.approx(few.perplexity)
    # (session 100, PX1, PX2) a run timed at no time reads no rate, not a ZeroDivisionError or a made-up one
    assert dataclasses.replace(few, seconds=0.0).tokens_per_second == 0.0
    for bad, msg in (({"window": 8}, "window must be"), ({"window": True}, "window must be"),
                     ({"window": 32.0}, "window must be"), ({"window": 4096}, "larger than the context"),
                     ({"window": 32, "max_windows": 0}, "windows must be"),
                     ({"window": 32, "max_windows": True}, "windows must be"),  # (session 100, PX6, PX12, PX13)
                     ({"window": 32, "max_windows": 2.5}, "windows must be")):
        with pytest.raises(ConfigError, match=msg):
            perplexity(eng, ids, **bad)
    with pytest.raises(ConfigError, match=r"a window needs 32 \(pass a window of 20 tokens or less\)"):
        perplexity(eng, ids[:20], window=32)
    # (session 46) the advice fits the case: a text under the smallest window; a context the bundle cannot widen
    with pytest.raises(ConfigError, match=r"pass a window of 16 tokens or less"):  # (X10: the smallest is enough)
        perplexity(eng, ids[:16], window=32)
    with pytest.raises(ConfigError, match="the smallest window is 16: a longer text is needed"):
        perplexity(eng, ids[:10], window=16)
    with pytest.raises(ConfigError, match=f"the bundle's context is {eng.manifest.max_context}"):
        perplexity(eng, ids, window=eng.max_context + 1)
    small = edgespec.load(tiny_bundle, memory=False, max_context=64)
    with pytest.raises(ConfigError, match=f"larger --max-context \\(up to the bundle's {eng.manifest.max_context}"):
        perplexity(small, ids, window=128)
    with pytest.raises(ConfigError, match=f"smaller window \\(the bundle's context is {eng.manifest.max_context}\\)"):
        perplexity(small, ids, window=eng.manifest.max_context + 1)  # (no --max-context helps: session 56)
    with pytest.raises(ConfigError, match=f"larger --max-context \\(up to the bundle's {eng.manifest.max_context}"):
        perplexity(small, ids, window=eng.manifest.max_context)  # (session 100, PX9: the whole context helps)
    # a model that adds a BOS token: it stands first in every window, as llama-perplexity puts it
    seen = []
    real = eng.decoder.score
    eng.decoder.score = lambda win, top=0: seen.append(list(win)) or real(win, top)
    eng.tokenizer.add_bos, eng.tokenizer.bos_token_id = True, 7
    perplexity(eng, ids, window=32, max_windows=2)
    assert [w[0] for w in seen] == [7, 7] and [w[1:] for w in seen] == [ids[1:32], ids[33:64]]
    # (session 49, a review) a broken export's mean loss past a float's exp (thousands of nats): inf, where math.exp's
    # OverflowError was the command's traceback; --json writes it as null (json.dumps wrote Infinity)
    from types import SimpleNamespace

    eng.decoder.score = lambda win, top=0: [SimpleNamespace(logprob=-5000.0) for _ in win[1:]]
    hot = perplexity(eng, ids, window=32, max_windows=2, progress=lambda *a: None)
    assert hot.perplexity == float("inf") and hot.nll == 5000.0
    from edgespec.cli import _finite

    assert json.dumps(_finite({"p": hot.perplexity, "q": [float("nan"), 1.5]}), allow_nan=False) == \
        '{"p": null, "q": [null, 1.5]}'
    eng.decoder.score = real
    # the command line
    f = tmp_path / "text.txt"
    f.write_text(text)
    cli = [sys.executable, "-m", "edgespec.cli", "perplexity", str(tiny_bundle), str(f), "--window", "32"]
    p = subprocess.run([*cli, "--max-windows", "3", "--json"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert abs(json.loads(p.stdout)["perplexity"] - r.perplexity) < 1e-6 * r.perplexity
    for args, msg in ((["--window", "8"], "--window must be"), (["--max-windows", "0"], "--max-windows must be"),
                      ([str(tmp_path / "missing.txt")], "no such text file")):
        p = subprocess.run([*cli, *args], capture_output=True, text=True, timeout=120)
        assert p.returncode != 0 and msg in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_the_logprobs_and_perplexity_scripts_run_on_a_tiny_bundle(tiny_bundle, tmp_path):
    """scripts/bench_logprobs.py (README, Logprobs: the cost and the distance from plain decoding) and
    scripts/perplexity_vs_llamacpp.py (without llama.cpp: the tiny bundle has no GGUF) end to end."""
    from pathlib import Path

    scripts = Path(__file__).resolve().parent.parent / "scripts"
    out = tmp_path / "lp.md"
    r = subprocess.run([sys.executable, str(scripts / "bench_logprobs.py"), str(tiny_bundle), "--limit", "28",
                        "--max-new-tokens", "12", "--drafters", "none,model,auto", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rows = [ln.split(" | ") for ln in out.read_text().splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert [x[0] for x in rows] == ["| none", "| model", "| auto"] and all(x[4] == "yes" for x in rows)
    assert all(float(x[5]) < ATOL for x in rows)  # the same logprobs as plain decoding's
    text = tmp_path / "t.txt"
    text.write_text(" ".join(PROMPTS * 12))
    out = tmp_path / "ppl.md"
    r = subprocess.run([sys.executable, str(scripts / "perplexity_vs_llamacpp.py"), str(tiny_bundle), "--text",
                        str(text), "--window", "32", "--max-windows", "2", "--out", str(out)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "| edgespec, tiny-fp32 |" in out.read_text()
    r = subprocess.run([sys.executable, str(scripts / "perplexity_vs_llamacpp.py"), str(tiny_bundle), "--text",
                        str(text), "--window", "32", "--llamacpp"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "needs a bundle exported from a GGUF" in r.stderr


def _scripted(eng, monkeypatch, rounds) -> None:
    """``eng`` on a scripted decoder that yields ``rounds`` (lists of ids, each token's logprob -1; the last round
    ends at 'length'), through the engine's own tokenizer, stream and stop strings."""
    from edgespec.decoder import Step, TokenLogprob

    class Fake:
        eos = frozenset()  # (the model's ends: none here)

        def check_ids(self, ids, what):  # (stream_ids checks the prompt's ids against the vocabulary)
            pass

        def prepare(self, prompt, cfg):  # (Decoder.prepare's checks, then run's steps)
            return prompt, cfg, None

        def run(self, prepared, stats):
            for i, toks in enumerate(rounds):
                yield Step(list(toks), None if i < len(rounds) - 1 else "length", [TokenLogprob(t, -1.0) for t in toks])

    monkeypatch.setattr(eng, "decoder", Fake())
    monkeypatch.setattr(eng, "config", lambda **kw: GenerationConfig(logprobs=kw.get("logprobs")))


def test_entries_stay_with_the_ids_when_a_stop_string_follows_a_byte_that_is_no_utf8(smol_int4, monkeypatch):
    """(session 45, a review) A token that is a byte no UTF-8 character starts with (b"\\xbe", U+FFFD in the text),
    then a stop string: one token a round, the next token's entry took the offset of the held byte's U+FFFD and
    went out with it, so the entries held one more token than the ids, and other than a round of both tokens gave.
    Its entry starts after the U+FFFD now, whatever the rounds."""
    eng = edgespec.load(smol_int4, memory=False)
    enc = lambda s: eng.tokenizer.encode(s, add_special=False)  # noqa: E731
    bad = next(i for i in range(eng.tokenizer.vocab_size) if eng.tokenizer.token_bytes(i) == b"\xbe")

    def script(rounds):
        _scripted(eng, monkeypatch, rounds)
        streamed = list(eng.stream_ids([1], stop=["xy"], logprobs=0))
        return eng._collect(iter(streamed)), [e for d in streamed for e in (d.logprobs or [])]

    x, y = enc("x"), enc("y")
    results = [script(rounds) for rounds in ([enc("a") + [bad], x, y, enc("z")], [enc("a") + [bad] + x + y + enc("z")],
                                             [enc("a"), [bad], x + y])]
    for r, streamed in results:
        assert r.text == "a\ufffd" and r.finish_reason == "stop"
        assert [e["token_id"] for e in r.logprobs] == r.token_ids == enc("a") + [bad]
        assert streamed == r.logprobs  # (no entry streamed that the reply then left out)
    assert all(r.logprobs == results[0][0].logprobs for r, _ in results)


def test_entries_stay_with_the_ids_when_a_stop_string_follows_a_split_character(smol_int4, monkeypatch):
    """A character of several tokens, then a stop string seen a round later (the engine's own tokenizer and
    stream, a scripted decoder): the ids returned keep the whole character, and the entries are theirs."""
    eng = edgespec.load(smol_int4, memory=False)
    enc = lambda s: eng.tokenizer.encode(s, add_special=False)  # noqa: E731
    emoji = enc("\U0001fae0")
    assert len(emoji) >= 2  # split over tokens

    def script(rounds):
        _scripted(eng, monkeypatch, rounds)
        return eng._collect(eng.stream_ids([1], stop=["!!"], logprobs=0))

    for rounds in ([enc("ab") + emoji + enc("!"), enc("!x")], [enc("ab") + emoji + enc("!!x")],
                   [enc("ab") + emoji[:1], emoji[1:] + enc("!"), enc("!")]):
        r = script(rounds)
        assert r.text == "ab\U0001fae0" and r.finish_reason == "stop", rounds
        assert eng.tokenizer.decode(r.token_ids) == r.text and [e["token_id"] for e in r.logprobs] == r.token_ids
        assert r.logprobs[2]["token"].startswith("bytes:\\x")  # a piece of the character, spelled as OpenAI does


def test_perplexity_json_of_a_broken_export_is_json(tiny_bundle, tmp_path, monkeypatch):
    """(session 55, a review) A broken export's perplexity (inf) reached `perplexity --json` as Infinity (the
    command wrote json.dumps' text, where the test above checked only the helper meant for it): null now."""
    from types import SimpleNamespace

    from click.testing import CliRunner

    from edgespec.cli import main
    from edgespec.decoder import Decoder

    monkeypatch.setattr(Decoder, "score", lambda self, win, top=0: [SimpleNamespace(logprob=-5000.0)
                                                                    for _ in win[1:]])
    f = tmp_path / "text.txt"
    f.write_text(" ".join(PROMPTS * 12))
    r = CliRunner().invoke(main, ["perplexity", str(tiny_bundle), str(f), "--window", "32", "--max-windows", "2",
                                  "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"{c} is not JSON"))
    assert out["perplexity"] is None and out["nll"] == 5000.0
    from edgespec.cli import _finite  # (session 99, CL97: a tuple's too, as a list)

    assert _finite({"a": (1.5, float("inf"), [float("nan")])}) == {"a": [1.5, None, [None]]}
