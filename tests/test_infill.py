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
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import edgespec  # noqa: E402
from edgespec.errors import ConfigError  # noqa: E402
from tiny import FIM_LESSONS, make_fim_model  # noqa: E402

DRAFTERS = ("none", "prompt-lookup", "suffix", "auto")


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory):
    return make_fim_model(tmp_path_factory.mktemp("hf") / "fim-model")


@pytest.fixture(scope="module")
def fim_bundle(tmp_path_factory, fim_model):
    from edgespec_export import export_bundle

    return export_bundle(str(fim_model), tmp_path_factory.mktemp("bundles") / "tiny-fim", quality=False,
                         target_precision="fp32")


@pytest.fixture(scope="module")
def fim_engine(fim_bundle):
    return edgespec.load(fim_bundle, memory=False)


@pytest.fixture(scope="module")
def fim_pair(tmp_path_factory, fim_model):
    """The FIM model with a drafter model: itself, perturbed (so it drafts well, not perfectly)."""
    from transformers import AutoTokenizer

    from edgespec_export import export_bundle
    from tiny import make_model

    drafter = make_model(tmp_path_factory.mktemp("hf") / "fim-drafter", "qwen2", seed=7, hidden=128, max_pos=256,
                         perturb_from=fim_model, noise=0.05, tokenizer=AutoTokenizer.from_pretrained(fim_model))
    return export_bundle(str(fim_model), tmp_path_factory.mktemp("bundles") / "tiny-fim-pair", quality=False,
                         drafter=str(drafter), target_precision="fp32", drafter_precision="fp32")


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
    from edgespec.decoder import GenerationConfig

    prefix, suffix, middle = FIM_LESSONS[0]
    ids = fim_engine.encode(prefix, suffix=suffix)
    out = []
    for step in fim_engine.decoder.generate(ids, GenerationConfig(max_new_tokens=24, drafter="none")):
        out += step.tokens
    end = fim_engine.tokenizer.token_to_id("<|endoftext|>")
    assert end in out and out.index(end) < len(out) - 1  # it said <|endoftext|> and went on
    assert fim_engine.tokenizer.decode(out[:out.index(end)]) == middle


def test_a_plain_prompt_laid_out_for_fim_stops_as_a_suffix_does(fim_engine):
    """An editor that lays the FIM prompt out itself (a plain prompt with the model's FIM tokens, as Continue's
    templates do) gets the middle, not what the model says after <|endoftext|>."""
    for prefix, suffix, middle in FIM_LESSONS:
        text = f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"
        assert fim_engine.encode(text) == fim_engine.encode(prefix, suffix=suffix)
        r = fim_engine.generate(text, max_new_tokens=24, temperature=0)
        assert r.text == middle and r.finish_reason == "eos"


def test_a_stop_string_that_is_a_special_token_stops_at_that_token(fim_engine, monkeypatch):
    """A special token's text never appears in the reply's text, so a stop string such as "<|endoftext|>" (which
    editors send) would never match: it stops at the token instead. Shown with FIM detection off."""
    prefix, suffix, middle = FIM_LESSONS[0]
    text = f"<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"
    monkeypatch.setattr(fim_engine.tokenizer, "_fim", None)  # as a model whose FIM tokens edgespec does not know
    runs_on = fim_engine.generate(text, max_new_tokens=24, temperature=0)
    assert runs_on.text.startswith(middle) and runs_on.text != middle  # (the planted bug: no stop)
    for stop in (["<|endoftext|>"], ["<|endoftext|>", "never"]):
        r = fim_engine.generate(text, max_new_tokens=24, temperature=0, stop=stop, drafter="auto")
        # ('stop', the token left out as a stop string's tokens are, since session 45: it said 'eos' and kept it)
        assert r.text == middle and r.finish_reason == "stop"
        assert fim_engine.tokenizer.token_to_id("<|endoftext|>") not in r.token_ids
    assert fim_engine._stop_ids([5, 6], ["<|endoftext|>", "<|im_end|>", "plain text"]) == ({
        fim_engine.tokenizer.token_to_id("<|endoftext|>"), fim_engine.tokenizer.token_to_id("<|im_end|>")}, set())


def test_a_suffix_is_refused_where_it_cannot_be_honoured(fim_engine, tiny_bundle):
    with pytest.raises(ConfigError, match="plain prompt"):
        fim_engine.encode([{"role": "user", "content": "x"}], suffix="y")
    with pytest.raises(ConfigError, match="tools need chat messages"):
        fim_engine.generate("x", suffix="y", tools=[{"type": "function", "function": {"name": "f"}}])
    for kw in ({"tool_choice": "required"}, {"parallel_tool_calls": False}):  # not silently dropped
        with pytest.raises(ConfigError, match="tools need chat messages"):
            fim_engine.generate("x", suffix="y", **kw)
    with pytest.raises(ConfigError, match="the suffix must be a string"):
        fim_engine.generate("x", suffix=3)
    with pytest.raises(ConfigError, match="stop_token_ids must be a sequence of token ids"):
        fim_engine.generate("x", suffix="y", stop_token_ids="x")
    from edgespec.errors import ContextOverflowError

    # (session 97, a mutation test of api.py, AP52) the suffix counts towards encode's size bound: a short prefix with
    # a suffix far too long for the context was tokenized whole before the decoder refused it
    with pytest.raises(ContextOverflowError, match="the prompt has at least"):
        fim_engine.generate("def f(", suffix="word " * (fim_engine.max_context * 64), max_new_tokens=2)
    eng = edgespec.load(tiny_bundle, memory=False)  # a vocabulary without FIM tokens
    assert eng.tokenizer.fim() is None
    for call in (lambda: eng.generate("def f():", suffix="\n"), lambda: list(eng.stream("def f():", suffix=""))):
        with pytest.raises(ConfigError, match="no fill-in-the-middle tokens"):
            call()
    eng.close()


def test_the_server_fills_in_the_middle_streamed_or_not(fim_engine, fim_bundle):
    import openai

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


def test_bench_infill_on_the_tiny_model(fim_bundle, tiny_bundle, tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import bench_infill

    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join(json.dumps({"id": str(i), "prefix": p, "suffix": s, "middle": m}) + "\n"
                             for i, (p, s, m) in enumerate(FIM_LESSONS)))
    out = tmp_path / "runs.json"
    rc = bench_infill.main([str(fim_bundle), "--cases", str(cases), "--reps", "1", "--max-new-tokens", "24",
                            "--drafters", "none,prompt-lookup,auto", "--json", str(out), "--typing"])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert "100% of replies equal the lines cut out, 100% their first line; 100% end on their own" in text
    runs = json.loads(out.read_text())
    assert len(runs) == 18 and all(r["same"] for r in runs)
    assert all(r["exact"] for r in runs if not r.get("typed"))
    typed = [r for r in runs if r.get("typed")]  # asked again with more typed: the cache holds the prompt's start
    assert len(typed) == 9 and all(0 < r["reused"] < r["prompt_tokens"] for r in typed)
    assert "Typed on" in text
    assert "| auto |" in text
    assert bench_infill.main(["--report", str(out), "--cases", str(cases)]) == 0  # the same report from the runs
    assert capsys.readouterr().out.strip() == text.strip().replace("tiny-fim,", "runs,", 1)
    # a model without FIM tokens: one line, exit 2
    assert bench_infill.main([str(tiny_bundle), "--cases", str(cases)]) == 2
    assert "no fill-in-the-middle tokens" in capsys.readouterr().err
    # gaps cut from files: deterministic for a seed, the middle between prefix and suffix in the source
    src = tmp_path / "code.py"
    src.write_text("".join(f"def f{i}(x):\n    return x + {i}\n\n" for i in range(40)))
    made = bench_infill.make_cases([str(src)], 6, seed=1)
    assert made == bench_infill.make_cases([str(src)], 6, seed=1) and len(made) == 6
    for c in made:
        assert (c["prefix"] + c["middle"] + c["suffix"]).strip("\n") in src.read_text()


def test_a_long_fim_prompt_is_read_by_the_drafter_as_its_head():
    from edgespec.drafters import fim_head
    from edgespec.tokenizer import Fim

    f = Fim(prefix=1, suffix=2, middle=3, ends=(0,))
    before, after = list(range(100, 140)), list(range(200, 230))
    prompt = [1, *before, 2, *after, 3]
    head = fim_head(prompt, f, 24)  # 21 tokens of room: half to the code after the gap
    assert head == [1, *before[-11:], 2, *after[:10], 3] and len(head) == 24
    assert fim_head([9, *prompt], f, 24) == [9, 1, *before[-10:], 2, *after[:10], 3]  # a bos before it
    assert fim_head([1, *before, 2, 201, 3], f, 24) == [1, *before[-20:], 2, 201, 3]  # short after: room to before
    assert fim_head([1, 101, 2, *after, 3], f, 24) == [1, 101, 2, *after[:20], 3]
    assert fim_head(prompt, f, 500) == prompt  # all of it fits
    for other in ([*before, 3], [1, *before, 3], [1, *before, 2, *after], [5, 6, 1, 2, 3]):
        assert fim_head(other, f, 24) is None, other
    assert fim_head(prompt, f, 4) is None  # no room for the code


def test_the_drafter_reads_a_fim_prompt_as_its_head_and_every_reply_stays_exact(fim_pair):
    eng = edgespec.load(fim_pair, memory=False)
    model = eng.decoder.drafters["model"]
    assert model.fim == eng.tokenizer.fim()
    model.read_window = 12  # the lessons' prompts are longer: the head is read, not their end
    prefix, suffix, middle = FIM_LESSONS[0]
    prompt = eng.encode(prefix, suffix=suffix)
    assert len(prompt) > 12
    for prefix, suffix, middle in FIM_LESSONS:
        base = eng.generate(prefix, suffix=suffix, max_new_tokens=24, temperature=0, drafter="none")
        r = eng.generate(prefix, suffix=suffix, max_new_tokens=24, temperature=0, drafter="model", draft_tokens=3)
        assert r.token_ids == base.token_ids and r.text == middle
        assert r.stats["drafted"] > 0 and r.stats["accepted"] > 0
        ids = eng.encode(prefix, suffix=suffix)
        from edgespec.drafters import fim_head

        head = fim_head(ids, eng.tokenizer.fim(), 12)
        held = list(model.lm.cache.ids.view()[: model.lm.length])
        assert held[: len(head)] == head  # the drafter's cache: the head, then the reply
        assert held[len(head):] == r.token_ids[: len(held) - len(head)]
    eng.close()


def test_ignore_eos_decodes_past_the_end_of_a_middle_too(fim_engine):
    prefix, suffix, middle = FIM_LESSONS[0]
    r = fim_engine.generate(prefix, suffix=suffix, max_new_tokens=24, temperature=0, ignore_eos=True)
    assert r.finish_reason == "length" and len(r.token_ids) == 24 and r.text.startswith(middle)


def test_a_first_model_draft_late_in_a_long_middle_reads_the_window_not_the_head(fim_pair):
    from edgespec.kv import TokenBuffer

    eng = edgespec.load(fim_pair, memory=False)
    model = eng.decoder.drafters["model"]
    model.read_window = 12
    prompt = eng.encode(FIM_LESSONS[0][0], suffix=FIM_LESSONS[0][1])
    for late, read in ((0, 12), (10, 22), (12, 24), (13, 12), (200, 12)):
        model.begin(prompt)
        ctx = TokenBuffer(prompt + [7] * late, capacity=eng.max_context)
        assert model.behind(ctx) == read, late  # the head and the reply so far, up to twice the window
    eng.close()


def test_probe_fim_head_on_the_tiny_pair(fim_pair, tmp_path, capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import probe_fim_head
    from edgespec import drafters as D

    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join(json.dumps({"id": str(i), "prefix": p, "suffix": s, "middle": m}) + "\n"
                             for i, (p, s, m) in enumerate(FIM_LESSONS)))
    before = D.FIM_HEAD
    rc = probe_fim_head.main([str(fim_pair), "--cases", str(cases), "--heads", "8,12", "--drafters", "model,auto",
                              "--max-new-tokens", "24"])
    out = capsys.readouterr().out
    assert rc == 0 and "replies equal across configurations: True" in out, out
    rows = [line.split(" | ")[:2] for line in out.splitlines() if line.startswith("| ") and "head" not in line
            and "---" not in line]
    assert sorted(rows) == [["| 12", "auto"], ["| 12", "model"], ["| 8", "auto"], ["| 8", "model"]], out
    assert D.FIM_HEAD == before  # put back
    with pytest.raises(SystemExit):
        probe_fim_head.main([str(fim_pair), "--heads", "x"])


def test_token_healing_backs_off_the_last_token_before_the_gap(fim_engine, fim_bundle, tmp_path):
    """In a FIM prompt the cursor is the end of the code before the gap, not the prompt's end: that token is
    backed off, the middle spells it first, and the text returned starts after it (healing.py); the same
    under every drafter. scripts/probe_token_healing.py runs on the tiny model."""
    import subprocess
    import sys
    from pathlib import Path

    from tiny import FIM_LESSONS

    prefix, suffix, middle = FIM_LESSONS[0]
    typed = middle[: max(2, len(middle) // 2)]
    ids = fim_engine.encode(prefix + typed, suffix=suffix)
    healed, need = fim_engine.heal(ids)
    f = fim_engine.tokenizer.fim()
    cut = ids.index(f.suffix) - 1
    assert healed == ids[:cut] + ids[cut + 1:] and need == fim_engine.tokenizer.token_bytes(ids[cut])
    r = fim_engine.generate(prefix + typed, suffix=suffix, max_new_tokens=30, token_healing=True, temperature=0)
    assert fim_engine.tokenizer.decode(r.token_ids).startswith(need.decode()) and r.stats["healed"] == need.decode()
    for d in ("none", "prompt-lookup", "suffix"):
        assert fim_engine.generate(prefix + typed, suffix=suffix, max_new_tokens=30, token_healing=True,
                                   drafter=d).token_ids == r.token_ids, d
    # nothing before the gap: the token before the cursor is the FIM prefix marker, which stays (session 81; its
    # special flag alone keeps it here, as in Qwen2.5-Coder's vocabulary: heal()'s own guard for a vocabulary whose FIM
    # tokens are not special is mutant A19 of docs/bench/mutation_s81.md, which no vocabulary in the tests can show)
    empty = fim_engine.encode("", suffix=suffix)
    assert empty.index(f.suffix) == empty.index(f.prefix) + 1 and fim_engine.heal(empty) == (empty, b"")
    script = Path(__file__).resolve().parent.parent / "scripts" / "probe_token_healing.py"
    cases = tmp_path / "cases.jsonl"
    cases.write_text("".join(json.dumps({"id": i, "prefix": p, "suffix": s, "middle": m}) + "\n"
                             for i, (p, s, m) in enumerate(FIM_LESSONS)))
    out = tmp_path / "heal.md"
    p = subprocess.run([sys.executable, str(script), str(fim_bundle), "--cases", str(cases), "--drafter", "none",
                        "--max-new-tokens", "30", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "| on |" in out.read_text() and "| off |" in out.read_text()
