"""Gaps a second mutation test of ``edgespec/api.py`` found (docs/bench/mutation_harness/api_mut2.py, AP1-AP90; results
in docs/bench/mutation_s97_api.md): the refusals of load's arguments, the prompt cache file's checks and its write at
close, heal's argument, and the options of generate, stream and chat sessions. On the tiny bundle the other API tests
use (``test_api.py``'s ``engine``, or an engine of the test's own where it closes it or needs a prompt cache file).
The gaps of tools, thinking and fill-in-the-middle prompts are tested in test_tools.py, test_reasoning.py and
test_infill.py, on their tiny models; an earlier answer's reasoning and calls in encode's size bound in test_api.py."""
from __future__ import annotations

import warnings

import pytest

import edgespec
from conftest import raising
from edgespec.errors import ConfigError
from test_api import engine  # noqa: F401  (the module's shared engine of the tiny bundle)
from test_prompt_cache import DOC_A, _chat
from tiny import WEATHER


def test_a_prompt_cache_file_that_is_no_regular_file_is_refused_at_load(tiny_bundle, tmp_path):
    """AP12: a path that exists and is no regular file (here a Unix socket) is refused by load as such, before it is
    opened (unchecked, it was opened as a zip file: /dev/zero, this test's first form, was read until the kernel
    killed the process for its memory; a pipe would block the load at its open)."""
    import os
    import socket

    path = tmp_path / "pc.sock"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(os.fspath(path))
        with pytest.raises(ConfigError, match="is not a regular file"):
            edgespec.load(tiny_bundle, prompt_cache_file=path, memory=False)
    finally:
        s.close()


def test_running_out_of_memory_writing_the_prompt_cache_at_close_is_said_not_raised(tiny_bundle, tmp_path, monkeypatch):
    """AP20: a MemoryError writing the prompt cache file at close is a warning (the replies are out already), as a
    StoreError is; the engine is closed all the same."""
    import edgespec.prompt_cache as prompt_cache

    f = tmp_path / "cache.npz"
    eng = edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=f, memory=False)
    eng.generate(_chat([DOC_A]), max_new_tokens=4, drafter="none")
    monkeypatch.setattr(prompt_cache, "write_file", raising(MemoryError()))
    with pytest.warns(UserWarning, match="out of memory writing the prompt cache"):
        eng.close()
    assert not f.exists()
    with pytest.raises(edgespec.errors.ClosedError):
        eng.generate("hi", max_new_tokens=1)


def test_heal_takes_token_ids_not_bytes(engine):  # noqa: F811
    """AP54: heal(b"...") is refused as text is (iterating bytes gives integers: it was healed as ids 104, 105)."""
    for bad in (b"hi there", "hi there"):
        with pytest.raises(ConfigError, match="heal\\(\\) takes the prompt's token ids"):
            engine.heal(bad)


@pytest.mark.parametrize("kw, name", [
    ({"max_context": 2**63}, "max_context"), ({"max_context": 0}, "max_context"), ({"min_width": 0}, "min_width"),
    ({"provider": " "}, "provider"), ({"drafter_provider": " "}, "drafter_provider"),
    ({"model_sampling": "no"}, "model_sampling"), ({"prompt_cache_mb": -1}, "prompt_cache_mb"),
])
def test_load_refuses_each_argument_just_past_its_edge(tiny_bundle, kw, name):
    """AP21-AP24, AP26: a count past 2**62, a context or width of 0, a provider of blanks, model_sampling "no"
    are each a ConfigError naming the argument (2**63 and 0 were taken, " " ran as no provider named)."""
    with pytest.raises(ConfigError, match=f"^{name} must be"):
        edgespec.load(tiny_bundle, **kw)


def test_load_takes_numpy_counts_a_prompt_cache_of_0_and_every_core(tiny_bundle):
    """AP3-AP5, AP30: numpy's integers for min_width and prompt_cache_mb (max_context's are test_hardening's),
    prompt_cache_mb=0 meaning no prompt cache (it was the plan's size), and threads as many as this machine's cores."""
    import numpy as np

    from edgespec.api import _cores

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (this process's pool is made already: "not applied")
        eng = edgespec.load(tiny_bundle, min_width=np.int64(1), prompt_cache_mb=np.int64(0), threads=_cores(),
                            memory=False)
    try:
        assert eng.decoder.target.min_width == 1 and eng.prompt_cache_stats() is None
        assert edgespec.load(tiny_bundle, memory=False).prompt_cache_stats() is not None  # (the plan's, without 0)
    finally:
        eng.close()


def test_a_profile_s_threads_are_bounded_by_this_machine_s_cores(tiny_bundle, tmp_path):
    """AP6: a profile's thread count, written for its device, asks the sessions for this machine's cores at most
    (4096 were asked for: onnxruntime's pool, made by the first engine of a process, would start them all;
    test_hardening's case runs after the pool is made, and checks only that it generates)."""
    from edgespec.api import _cores
    from test_hardening import _profile

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (this process's pool is made already: "not applied")
        eng = edgespec.load(tiny_bundle, profile=_profile(tmp_path, "threads = 4096\n"), memory=False)
    try:
        assert eng.decoder.target.threads == min(4096, _cores())
    finally:
        eng.close()


def test_a_stream_yields_no_empty_deltas(engine):  # noqa: F811
    """AP32: rounds whose text is held back (it may begin a stop string) yield nothing from ``Engine.stream`` or a
    chat's stream (they yielded "" before the text came out)."""
    kw = dict(max_new_tokens=12, drafter="none", temperature=0)
    parts = list(engine.stream("Once upon a time", stop=["never written here"], **kw))
    assert parts and all(parts)
    assert "".join(parts) == engine.generate("Once upon a time", stop=["never written here"], **kw).text
    assert all(engine.chat().stream("hello there", stop=["never written here"], **kw))


def test_draft_tokens_0_with_no_drafter_is_refused(engine):  # noqa: F811
    """AP40: draft_tokens=0 with drafter 'none' is refused as any other count is (0 was taken: the CLI's rule)."""
    for n in (0, 3):
        with pytest.raises(ConfigError, match="draft_tokens with drafter 'none'"):
            engine.config(drafter="none", draft_tokens=n)


def test_a_prediction_s_special_token_text_is_text(engine):  # noqa: F811
    """AP41: a prediction given as text is encoded as text, a special token's text too (as message content is); AP42:
    a prediction that is not UTF-8 is refused as the prediction, not as the prompt."""
    tok = engine.tokenizer
    special = next(iter(tok.special_ids_texts()))
    cfg = engine.config(prediction="say " + special)
    assert list(cfg.prediction) == tok.encode("say " + special, add_special=False, parse_special=False)
    assert tok.token_to_id(special) not in cfg.prediction
    with pytest.raises(ConfigError, match="^the prediction is not valid UTF-8"):  # AP42 (it was "the prompt is ...")
        engine.config(prediction="a lone \udcff surrogate")


def test_tools_and_template_kwargs_with_a_plain_prompt_are_refused(engine):  # noqa: F811
    """AP48: tools with a plain prompt are refused (the tools were dropped); AP49: template kwargs with a plain prompt
    are refused (dropped)."""
    from edgespec.tools import tool_request
    from tiny import TOOLS_TEMPLATE

    with pytest.raises(ConfigError, match="tools need chat messages"):
        engine.encode("hi", tools=tool_request(WEATHER, template=TOOLS_TEMPLATE))
    with pytest.raises(ConfigError, match="chat_template_kwargs need chat messages"):
        engine.encode("hi", template_kwargs={"enable_thinking": False})
    with pytest.raises(ConfigError, match="chat_template_kwargs need chat messages"):
        engine.generate("hi", chat_template_kwargs={"enable_thinking": False}, max_new_tokens=2)


def test_an_empty_stop_string_stops_nothing(engine):  # noqa: F811
    """AP62: "" among the stop strings is no stop (it matched at once: an empty reply said 'stop')."""
    kw = dict(max_new_tokens=6, drafter="none", temperature=0, ignore_eos=True)
    r = engine.generate("Once upon a time", stop=["", "never written here"], **kw)
    assert (r.token_ids, r.finish_reason) == (engine.generate("Once upon a time", **kw).token_ids, "length")


def test_ignore_eos_with_a_stop_string_naming_the_end_of_sequence_stops_there(engine):  # noqa: F811
    """AP61: with ignore_eos the end of sequence is an ordinary token, so a stop string that is its text stops at it
    as at any special token a stop string names: 'stop', its token left out (it was 'eos', its token kept)."""
    eos = sorted(engine.decoder.eos)[0]
    text = engine.tokenizer._tok.id_to_token(eos)
    assert text in engine.tokenizer.special_ids_texts()
    kw = dict(max_new_tokens=6, drafter="none", temperature=0, ignore_eos=True, logit_bias={eos: 100})
    assert engine.generate("hi", **kw).token_ids == [eos] * 6  # (ignore_eos: the end decodes on)
    r = engine.generate("hi", stop=[text], **kw)
    assert (r.token_ids, r.finish_reason) == ([], "stop")


def test_a_turn_keeps_room_for_its_own_max_new_tokens(tiny_bundle):
    """AP85: a chat turn keeps room for the reply it asks for (``max_new_tokens``), not the engine's default: a
    message that fits with 8 tokens to spare was refused as too long alone (or dropped older exchanges)."""
    eng = edgespec.load(tiny_bundle, max_context=128, memory=False)
    try:
        assert eng.defaults.max_new_tokens >= 64
        text = "the quick brown fox"
        while len(eng.encode([{"role": "user", "content": text + " jumps"}])) <= 128 - 8:
            text += " jumps"
        assert len(eng.encode([{"role": "user", "content": text}])) > 128 - 64
        chat = eng.chat()
        chat.reserve = 64
        r = chat.send(text, max_new_tokens=8, drafter="none")
        assert 0 < len(r.token_ids) <= 8 and chat.dropped == 0 and chat.messages[0]["content"] == text
    finally:
        eng.close()


def test_a_drafter_the_memory_plan_left_out_is_said_so(tiny_bundle, monkeypatch):
    """AP36: drafter="model" on an engine whose memory plan dropped the drafter model says so, with the plan's cut (it
    said the engine was opened without one: use_drafter=False or the profile's policy, which the user did not ask)."""
    import dataclasses

    import edgespec.planner as planner

    real = planner.plan

    def dropped(manifest, prof, **kw):  # (the plan a budget too small for the pair makes)
        p = real(manifest, prof, **{**kw, "use_drafter": False})
        return dataclasses.replace(p, cuts=p.cuts + (planner.DRAFTER_DROPPED,))

    monkeypatch.setattr(planner, "plan", dropped)
    eng = edgespec.load(tiny_bundle, memory=False)
    try:
        with pytest.raises(ConfigError, match="the memory plan left it out \\(model drafter dropped"):
            eng.generate("hi", drafter="model", max_new_tokens=2)
    finally:
        eng.close()


def test_a_document_given_to_load_past_the_cap_is_named_by_its_path(tiny_bundle, monkeypatch, tmp_path):
    """AP10: load's documents are read first (so an error of reading names its file) and indexed as texts: past the
    documents' token cap the one that crossed it is named by its path (it was "text 0"). The cap is lowered to 5
    tokens (test_planner's case of ``add_documents`` lowers it to 2,000 the same way)."""
    from edgespec import suffix
    from edgespec.errors import DocumentError

    real = suffix.add_documents

    def capped(engine, paths=(), texts=(), names=None):
        monkeypatch.setattr(suffix.suffix_drafter(engine), "max_document_tokens", 5)
        return real(engine, paths, texts, names)

    monkeypatch.setattr(suffix, "add_documents", capped)
    doc = tmp_path / "notes.txt"
    doc.write_text("a document about rivers and lakes and the sea\n")
    with pytest.raises(DocumentError, match=r"notes\.txt brings the documents to more than 5 tokens"):
        edgespec.load(tiny_bundle, memory=False, documents=[doc])


def test_score_s_parse_special_is_honoured(engine):  # noqa: F811
    """AP68: score(text, parse_special=False) scores a special token's text as the characters it is, as encode and
    generate read it (it was parsed as the token whatever the argument said)."""
    special = next(iter(engine.tokenizer.special_ids_texts()))
    text = "hello " + special
    as_text, as_token = engine.encode(text, parse_special=False), engine.encode(text)
    assert as_text != as_token
    for parse, want in ((False, as_text), (True, as_token)):
        assert [e["token_id"] for e in engine.score(text, parse_special=parse)[1]] == want
