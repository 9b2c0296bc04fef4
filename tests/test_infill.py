"""Fill in the middle (code infilling): a prompt and a suffix, the reply the text between them.

A tiny model with Qwen2.5-Coder's FIM tokens, trained to fill three gaps and then say <|endoftext|> (not its
end-of-sequence token: the FIM stops end it), run through the Python API, the CLI and the server; SmolLM2 and
the tiny models without FIM tokens are refused. The real Qwen2.5-Coder pair: tests/test_qwen.py.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")

import edgespec  # noqa: E402
from edgespec.errors import ConfigError  # noqa: E402
from tiny import FIM_LESSONS, make_fim_model  # noqa: E402

DRAFTERS = ("none", "prompt-lookup", "suffix", "auto")


@pytest.fixture(scope="module")
def fim_bundle(tmp_path_factory):
    from edgespec_export import export_bundle

    src = make_fim_model(tmp_path_factory.mktemp("hf") / "fim-model")
    return export_bundle(str(src), tmp_path_factory.mktemp("bundles") / "tiny-fim", quality=False,
                         target_precision="fp32")


@pytest.fixture(scope="module")
def fim_engine(fim_bundle):
    return edgespec.load(fim_bundle, memory=False)


def test_the_fim_tokens_are_found_and_the_prompt_laid_out_prefix_suffix_middle(fim_engine):
    tok = fim_engine.tokenizer
    f = tok.fim()
    assert f is not None
    assert (f.prefix, f.suffix, f.middle) == tuple(tok.token_to_id(t) for t in
                                                   ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))
    # the FIM tokens, padding, end of text and the model's end of sequence end a middle
    assert {tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|fim_pad|>"), *tok.eos_token_ids} <= set(f.ends)
    assert tok.token_to_id("<|endoftext|>") not in tok.eos_token_ids  # (so the FIM stops are what ends it below)
    ids = fim_engine.encode("a = <|fim_pad|>", suffix="b = 2")
    assert ids == [f.prefix, *tok.encode("a = <|fim_pad|>", add_special=False), f.suffix,
                   *tok.encode("b = 2", add_special=False), f.middle]
    assert tok.token_to_id("<|fim_pad|>") in ids  # special-token text is the token, as in a plain prompt ...
    text = fim_engine.encode("a = <|fim_pad|>", parse_special=False, suffix="")
    assert tok.token_to_id("<|fim_pad|>") not in text and text[-2:] == [f.suffix, f.middle]  # ... unless asked


def test_the_trained_model_fills_each_gap_under_every_drafter(fim_engine):
    for prefix, suffix, middle in FIM_LESSONS:
        base = None
        for d in DRAFTERS:
            r = fim_engine.generate(prefix, suffix=suffix, max_new_tokens=24, temperature=0, drafter=d)
            assert r.text == middle, (d, r.text)
            assert r.finish_reason == "eos"
            if base is None:
                base = r.token_ids
            assert r.token_ids == base, d  # lossless: every drafter's tokens are plain decoding's
        assert "".join(fim_engine.stream(prefix, suffix=suffix, max_new_tokens=24, temperature=0)) == middle


def test_without_the_fim_stops_the_middle_would_run_on(fim_engine):
    """The planted bug: the same prompt with the model's end-of-sequence tokens only runs past <|endoftext|>."""
    prefix, suffix, middle = FIM_LESSONS[0]
    ids = fim_engine.encode(prefix, suffix=suffix)
    out = []
    for _, toks, _ in fim_engine.stream_ids(ids, max_new_tokens=24, temperature=0, drafter="none"):
        out += toks
    end = fim_engine.tokenizer.token_to_id("<|endoftext|>")
    assert end in out and out.index(end) < len(out) - 1  # it said <|endoftext|> and went on
    assert fim_engine.tokenizer.decode(out[:out.index(end)]) == middle


def test_a_suffix_is_refused_where_it_cannot_be_honoured(fim_engine, tiny_bundle):
    with pytest.raises(ConfigError, match="plain prompt"):
        fim_engine.encode([{"role": "user", "content": "x"}], suffix="y")
    with pytest.raises(ConfigError, match="tools need chat messages"):
        fim_engine.generate("x", suffix="y", tools=[{"type": "function", "function": {"name": "f"}}])
    with pytest.raises(ConfigError, match="the suffix must be a string"):
        fim_engine.generate("x", suffix=3)
    eng = edgespec.load(tiny_bundle, memory=False)  # a vocabulary without FIM tokens
    assert eng.tokenizer.fim() is None
    for call in (lambda: eng.generate("def f():", suffix="\n"), lambda: list(eng.stream("def f():", suffix=""))):
        with pytest.raises(ConfigError, match="no fill-in-the-middle tokens"):
            call()
    eng.close()


def test_the_server_fills_in_the_middle_streamed_or_not(fim_engine, fim_bundle):
    import openai
    from pathlib import Path

    from test_server import _InProcess, http

    model_id = Path(fim_bundle).name
    with _InProcess(fim_engine, model_id, temperature=0) as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        for prefix, suffix, middle in FIM_LESSONS:
            r = c.completions.create(model=model_id, prompt=prefix, suffix=suffix, max_tokens=24)
            assert r.choices[0].text == middle and r.choices[0].finish_reason == "stop"
            api = fim_engine.generate(prefix, suffix=suffix, max_new_tokens=24, temperature=0)
            assert r.usage.completion_tokens == len(api.token_ids)
            streamed = c.completions.create(model=model_id, prompt=prefix, suffix=suffix, max_tokens=24, stream=True)
            chunks = list(streamed)
            assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == middle
            assert chunks[-1].choices[0].finish_reason == "stop"
        # an empty suffix is no suffix (OpenAI's default): a plain completion of the prompt
        plain = c.completions.create(model=model_id, prompt=FIM_LESSONS[0][0], suffix="", max_tokens=4)
        assert plain.choices[0].text == fim_engine.generate(FIM_LESSONS[0][0], max_new_tokens=4, temperature=0).text
        status, err = http(s.url + "/v1/completions", {"prompt": "x", "suffix": ["y"]})
        assert status == 400 and err["error"]["param"] == "suffix"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "edgespec.cli", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


def test_the_cli_fills_in_the_middle(fim_bundle, tiny_bundle):
    prefix, suffix, middle = FIM_LESSONS[1]
    p = _cli("generate", str(fim_bundle), "-p", prefix, "--suffix", suffix, "--temperature", "0", "--json",
             "--no-memory")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["text"] == middle and out["finish_reason"] == "eos"
    for args, why in (((str(fim_bundle), "-p", prefix, "--suffix", suffix, "--chat"), "cannot be used with --chat"),
                      ((str(tiny_bundle), "-p", prefix, "--suffix", suffix), "no fill-in-the-middle tokens")):
        p = _cli("generate", *args, "--no-memory")
        assert p.returncode != 0 and "Traceback" not in p.stderr
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and why in lines[0], p.stderr
