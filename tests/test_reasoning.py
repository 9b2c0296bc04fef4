"""Thinking models (Qwen3's <think> blocks): chat_template_kwargs (enable_thinking) through the API, the CLI and the
server, and the block given apart from the answer (reasoning.py) streamed or not, on a tiny model trained to think."""
from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy as np
import pytest

import edgespec
from edgespec.errors import ConfigError
from edgespec.reasoning import ReasoningSplitter, answer_start, split_reasoning, starts_inside
from tiny import ASK, HELLO, WEATHER, WHY, WHY_SHORT

CASES = [  # (reply, starts inside, (reasoning, content))
    ("<think>\nI should say hi.\n</think>\n\nHello!", False, ("I should say hi.", "Hello!")),
    ("Hello!", False, (None, "Hello!")),
    ("  <think>a\n\nb  </think>  x <think> y", False, ("a\n\nb", "x <think> y")),
    ("I think.\n</think>\n\nAnswer", True, ("I think.", "Answer")),
    ("still thinking", True, ("still thinking", "")),
    ("<think>cut", False, ("cut", "")),
    ("<th", False, (None, "<th")),
    ("<div>", False, (None, "<div>")),
    ("<think></think>Hi", False, ("", "Hi")),
    ("", False, (None, "")),
    ("\n\n", False, (None, "\n\n")),
    ("a </thi", True, ("a </thi", "")),
]


@pytest.mark.parametrize("text, inside, want", CASES)
def test_the_splitter_gives_the_block_apart_however_the_text_streams(text, inside, want):
    assert split_reasoning(text, inside) == want
    rng = random.Random(0)
    for _ in range(100):
        sp, parts = ReasoningSplitter(inside), {"reasoning": [], "content": []}
        i = 0
        while i < len(text):
            j = i + rng.randint(1, 4)
            for kind, t in sp.feed(text[i:j]):
                parts[kind].append(t)
            i = j
        for kind, t in sp.finish():
            parts[kind].append(t)
        assert ("".join(parts["reasoning"]) if sp.opened else None, "".join(parts["content"])) == want


def test_reasoning_tokens_count_the_block_and_its_tags():
    from edgespec.reasoning import reasoning_tokens

    tags = (7, 8)
    assert reasoning_tokens([7, 1, 2, 8, 3], tags) == 4 and reasoning_tokens([1, 2, 8, 3], tags, inside=True) == 3
    assert reasoning_tokens([1, 7, 8], tags) == 0 and reasoning_tokens([7, 1, 2], tags) == 3
    assert reasoning_tokens([], tags, inside=True) == 0


def test_a_reply_starts_inside_where_the_prompt_left_a_block_open():
    tags = (7, 8)
    assert starts_inside([1, 7, 2], tags) and not starts_inside([1, 7, 2, 8, 3], tags)
    assert not starts_inside([1, 2], tags) and not starts_inside([1, 7], None)
    assert starts_inside([7, 8, 7], tags)


@pytest.mark.parametrize("kw, match", [("x", "must be an object"), ({"messages": 1}, "renderer's own"),
                                       ({"a b": 1}, "not a variable name"), ({"x": float("nan")}, "JSON values"),
                                       ({"x": "y" * 70000}, "at most"), ({"x": ["\udc80"]}, "unpaired UTF-16 surrogate")])
def test_template_kwargs_are_checked(kw, match):
    from edgespec.template import check_template_kwargs

    with pytest.raises(ConfigError, match=match):
        check_template_kwargs(kw)


@pytest.fixture(scope="module")
def think_bundle(tmp_path_factory):
    from conftest import _export
    from tiny import make_think_model

    return _export(tmp_path_factory, "tiny-think", make_think_model(tmp_path_factory.mktemp("hf") / "think-model"),
                   target_precision="fp32")


@pytest.fixture(scope="module")
def think_engine(think_bundle):
    return edgespec.load(think_bundle, memory=False)


def test_the_engine_thinks_unless_told_not_to(think_engine):
    """The trained replies under every drafter (speculation keeps them exact), enable_thinking false through
    chat_template_kwargs (generate, stream and a chat session), and split_reasoning on the text."""
    for d in ("none", "prompt-lookup", "suffix", "auto"):
        r = think_engine.generate([HELLO], max_new_tokens=40, drafter=d)
        assert edgespec.split_reasoning(r.text) == ("The user greets me.", "Hello there!"), (d, r.text)
        off = think_engine.generate([HELLO], max_new_tokens=40, drafter=d, chat_template_kwargs={"enable_thinking": False})
        assert off.text == "Hello there!", d
    assert "".join(think_engine.stream([HELLO], max_new_tokens=40, chat_template_kwargs={"enable_thinking": False})) \
        == "Hello there!"
    assert r.reasoning_open is False
    r = think_engine.generate([WHY_SHORT], max_new_tokens=40, chat_template_kwargs={"opened": True})
    assert r.text == "Light scatters.\n</think>\n\nBlue light scatters most."
    assert edgespec.split_reasoning(r.text, inside=True) == ("Light scatters.", "Blue light scatters most.")
    # (session 64, a review) the Result says the reply began inside the block the template opened
    assert r.reasoning_open is True
    assert edgespec.split_reasoning(r.text, inside=r.reasoning_open) == ("Light scatters.", "Blue light scatters most.")
    s = think_engine.chat(template_kwargs={"opened": True})
    assert s.send(WHY_SHORT["content"], max_new_tokens=40).reasoning_open is True
    s = think_engine.chat(template_kwargs={"enable_thinking": False})
    assert "".join(s.stream("Hello", max_new_tokens=40)) == "Hello there!"
    assert s.send("Hello", max_new_tokens=40).reasoning_open is False
    with pytest.raises(ConfigError, match="need chat messages"):
        think_engine.generate("Hello", chat_template_kwargs={"enable_thinking": False})
    with pytest.raises(ConfigError, match="renderer's own"):
        think_engine.generate([HELLO], chat_template_kwargs={"add_generation_prompt": False})


def test_info_says_a_bundle_thinks(think_bundle, tiny_bundle):
    from click.testing import CliRunner

    from edgespec.cli import main

    r = CliRunner().invoke(main, ["info", str(think_bundle)])
    assert r.exit_code == 0 and "a thinking model: <think> and </think>" in r.output
    assert "thinking model" not in CliRunner().invoke(main, ["info", str(tiny_bundle)]).output


def test_the_cli_takes_template_kwargs(think_bundle):
    cmd = [sys.executable, "-m", "edgespec.cli", "generate", str(think_bundle), "-p", "Hello", "--no-memory",
           "--max-new-tokens", "40", "--temperature", "0"]
    r = subprocess.run([*cmd, "--chat", "--chat-template-kwargs", '{"enable_thinking": false}'], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "Hello there!", r.stderr
    r = subprocess.run([*cmd, "--chat-template-kwargs", '{"enable_thinking": false}'], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and r.stderr.strip().splitlines() == [
        "error: --chat-template-kwargs are variables of the chat template: they need --chat"]
    r = subprocess.run([*cmd, "--chat", "--chat-template-kwargs", "{nope"], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and r.stderr.strip().startswith("error: --chat-template-kwargs is not JSON")


def test_the_server_gives_the_thinking_apart(think_bundle, tmp_path):
    """reasoning_content beside the content, streamed (deltas that join to the same) or not; enable_thinking false
    per request; a Responses reasoning item before the message, streamed as reasoning_text events; a bad
    chat_template_kwargs a 400; --reasoning-format none leaves the block in the text."""
    from test_server import _start_server, http
    from test_tools import _stop

    proc, url = _start_server(think_bundle, tmp_path / "server.log", "--temperature", "0", "--no-memory")
    try:
        chat = url + "/v1/chat/completions"
        st, r = http(chat, {"messages": [HELLO], "max_tokens": 40})
        msg = r["choices"][0]["message"]
        assert st == 200 and (msg["reasoning_content"], msg["content"]) == ("The user greets me.", "Hello there!"), r
        thought = r["usage"]["completion_tokens_details"]["reasoning_tokens"]  # <think> ... </think>, tags included
        assert 4 <= thought < r["usage"]["completion_tokens"] - 2, r["usage"]
        st, r = http(chat, {"messages": [HELLO], "max_tokens": 40, "chat_template_kwargs": {"enable_thinking": False}})
        assert r["choices"][0]["message"]["content"] == "Hello there!"
        assert "reasoning_content" not in r["choices"][0]["message"]
        st, raw = http(chat, {"messages": [WHY], "max_tokens": 40, "stream": True, "logprobs": True})
        chunks = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
        deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
        assert "".join(d.get("reasoning_content", "") for d in deltas) == "Light scatters.\nShort waves most."
        assert "".join(d.get("content") or "" for d in deltas) == "Blue light scatters most."
        lps = [e for c in chunks if c["choices"] and c["choices"][0]["logprobs"]
               for e in c["choices"][0]["logprobs"]["content"]]
        assert len(lps) == chunks[-1]["edgespec"]["completion_tokens"]  # every token's logprob, once
        st, r = http(chat, {"messages": [WHY_SHORT], "max_tokens": 40, "chat_template_kwargs": {"opened": True}})
        msg = r["choices"][0]["message"]
        assert (msg["reasoning_content"], msg["content"]) == ("Light scatters.", "Blue light scatters most.")
        st, e = http(chat, {"messages": [HELLO], "chat_template_kwargs": {"tools": []}})
        assert st == 400 and e["error"]["param"] == "chat_template_kwargs", e
        # /tokenize renders messages as a chat request does: its count is the prompt's
        off = {"enable_thinking": False}
        st, t = http(url + "/tokenize", {"messages": [HELLO], "chat_template_kwargs": off})
        st2, t2 = http(url + "/tokenize", {"messages": [HELLO]})
        assert st == st2 == 200 and t["count"] > t2["count"], (t, t2)  # the empty block written into the prompt
        st, r = http(chat, {"messages": [HELLO], "max_tokens": 1, "chat_template_kwargs": off})
        assert r["usage"]["prompt_tokens"] == t["count"], (r["usage"], t)
        st, e = http(url + "/tokenize", {"prompt": "hi", "chat_template_kwargs": off})
        assert st == 400 and e["error"]["param"] == "chat_template_kwargs", e
        st, e = http(url + "/v1/completions", {"prompt": "Hi", "chat_template_kwargs": {}})
        assert st == 400 and e["error"]["code"] == "unknown_parameter"
        back = {"role": "assistant", "content": "Hello there!", "reasoning_content": "The user greets me."}
        st, r = http(chat, {"messages": [HELLO, back, HELLO], "max_tokens": 4})  # a client's history, as returned
        assert st == 200, r
        st, e = http(chat, {"messages": [HELLO, {**back, "reasoning_content": 3}, HELLO], "max_tokens": 4})
        assert st == 400 and e["error"]["param"] == "messages[1].reasoning_content", e

        resp = url + "/v1/responses"
        st, r = http(resp, {"input": "Why is the sky blue?", "max_output_tokens": 40})
        assert st == 200 and [o["type"] for o in r["output"]] == ["reasoning", "message"], r
        assert 4 <= r["usage"]["output_tokens_details"]["reasoning_tokens"] < r["usage"]["output_tokens"]
        assert r["output"][0]["content"] == [{"type": "reasoning_text", "text": "Light scatters.\nShort waves most."}]
        assert r["output"][1]["content"][0]["text"] == "Blue light scatters most."
        st, raw = http(resp, {"input": "Why is the sky blue?", "max_output_tokens": 40, "stream": True})
        events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
        kinds = [e["type"] for e in events]
        assert "response.reasoning_text.delta" in kinds and kinds[-1] == "response.completed"
        assert kinds.index("response.reasoning_text.done") < kinds.index("response.output_text.delta")
        assert "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta") \
            == "Light scatters.\nShort waves most."
        assert events[-1]["response"]["output"] == [
            {**r["output"][0], "id": events[-1]["response"]["output"][0]["id"]},
            {**r["output"][1], "id": events[-1]["response"]["output"][1]["id"]}]
    finally:
        _stop(proc, tmp_path / "server.log")
    proc, url = _start_server(think_bundle, tmp_path / "server2.log", "--temperature", "0", "--no-memory",
                              "--reasoning-format", "none", "--chat-template-kwargs", '{"enable_thinking": false}')
    try:
        st, r = http(url + "/v1/chat/completions", {"messages": [HELLO], "max_tokens": 40})
        assert r["choices"][0]["message"]["content"] == "Hello there!"  # the server's template default
        st, r = http(url + "/v1/chat/completions", {"messages": [HELLO], "max_tokens": 40,
                                                    "chat_template_kwargs": {"enable_thinking": True}})
        assert r["choices"][0]["message"]["content"].startswith("<think>")  # left in the text
    finally:
        _stop(proc, tmp_path / "server2.log")


def test_tags_a_decoder_leaves_out_are_no_tags_and_answers_start_after_the_block():
    from edgespec.reasoning import think_tags

    class Tok:
        def __init__(self, special):
            self.special = special

        def token_to_id(self, t):
            return {"<think>": 5, "</think>": 6}.get(t)

        def special_ids(self):
            return self.special

    assert think_tags(Tok(set())) == (5, 6) and think_tags(Tok({6})) is None
    assert answer_start("<think>a</think>\\nB") == len("<think>a</think>")
    assert answer_start("B <think>") == 0 and answer_start("a</think>B", inside=True) == len("a</think>")
    assert answer_start("<think>cut") == len("<think>cut")
    # (session 82, a mutation test: white space before the reply's <think> read as no block, the answer at 0)
    assert answer_start("\n <think>a</think>B") == len("\n <think>a</think>")


def test_a_chat_session_keeps_the_answer_and_kwargs_hold_no_special_text(think_engine):
    """A thinking model's turn goes into the history as its answer (its template leaves earlier thinking out, and
    the tags would be text there); a template variable holding a special token's text is refused."""
    s = think_engine.chat()
    reply = "".join(s.stream("Hello", max_new_tokens=40))
    assert reply.startswith("<think>") and s.messages[-1] == {"role": "assistant", "content": "Hello there!"}
    with pytest.raises(ConfigError, match="special token's text"):
        think_engine.generate([HELLO], chat_template_kwargs={"note": "a <think> b"})


def test_a_reply_held_from_its_start_is_no_thinking(think_engine):
    """Where a grammar or a forced tool call holds the reply from its first token, a block the template opened is
    not the reply's: the server reads what comes as the answer."""
    from types import SimpleNamespace

    from edgespec import server_protocol as P
    from edgespec.server import Server

    srv = Server(think_engine, "m")
    ids = think_engine.encode([WHY_SHORT], template_kwargs={"opened": True})
    req = P.GenRequest(kind="chat", model="m")
    assert srv._inside(ids, req, None)
    req.response_format = {"type": "json_object"}
    assert not srv._inside(ids, req, None)
    assert not srv._inside(ids, P.GenRequest(kind="chat", model="m"), SimpleNamespace(forced=True))
    assert not Server(think_engine, "m", reasoning_format="none")._splits(req)


def test_a_thinking_agent_s_call_is_read_from_its_answer(think_engine, think_bundle, tmp_path):
    """The model thinks (its thinking names <tool_call>) and then calls: one call, read from the answer, by the
    Python API (the thinking kept in the text) and by the server (reasoning_content beside the call, streamed or
    not)."""
    from test_server import _start_server, http
    from test_tools import _stop

    r = think_engine.generate([ASK], tools=WEATHER, max_new_tokens=60)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in r.tool_calls] == [
        ("get_weather", {"city": "Paris"})], r.text
    assert edgespec.split_reasoning(r.text) == ("I need the <tool_call> tool.", "")
    proc, url = _start_server(think_bundle, tmp_path / "server.log", "--temperature", "0", "--no-memory")
    try:
        chat = url + "/v1/chat/completions"
        st, r = http(chat, {"messages": [ASK], "tools": WEATHER, "max_tokens": 60})
        msg = r["choices"][0]["message"]
        assert st == 200 and msg["reasoning_content"] == "I need the <tool_call> tool." and msg["content"] is None, r
        assert [c["function"]["name"] for c in msg["tool_calls"]] == ["get_weather"]
        assert r["choices"][0]["finish_reason"] == "tool_calls"
        st, raw = http(chat, {"messages": [ASK], "tools": WEATHER, "max_tokens": 60, "stream": True})
        deltas = [json.loads(line[6:])["choices"][0]["delta"] for line in raw.splitlines()
                  if line.startswith("data: {") and json.loads(line[6:])["choices"]]
        assert "".join(d.get("reasoning_content", "") for d in deltas) == "I need the <tool_call> tool."
        calls = [c for d in deltas for c in d.get("tool_calls", [])]
        assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Paris"}]
        assert "".join(d.get("content") or "" for d in deltas) == ""
    finally:
        _stop(proc, tmp_path / "server.log")


def _script(eng, monkeypatch, reply: str) -> None:
    """``eng``'s decoder replaced by one that writes ``reply`` a token a round (its target kept: the prompt fitted to
    its context)."""
    from test_logprobs import _scripted

    target = eng.decoder.target
    _scripted(eng, monkeypatch, [[t] for t in eng.tokenizer.encode(reply, add_special=False)])
    eng.decoder.target = target


def test_one_call_asked_for_is_read_from_the_answer_when_the_thinking_names_its_end_tag(think_engine, monkeypatch):
    """(session 46, a review) parallel_tool_calls false ended the reply at the first </tool_call>, which a thinking
    model may write while it thinks: the reply stopped mid-thought, with no call. The thinking keeps the tag now,
    and the answer's first call is the one call; a whole call block in the thinking too (session 97, a mutation test
    of api.py, AP73: its stop string counted in the thinking, the reply ended mid-thought)."""
    reply = ('<think>\nA </tool_call> is how a call ends.\n</think>\n\n<tool_call>\n{"name": "get_weather", '
             '"arguments": {"city": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_weather", "arguments": '
             '{"city": "Rome"}}\n</tool_call>')
    _script(think_engine, monkeypatch, reply)
    both = think_engine.generate([ASK], tools=WEATHER)
    one = think_engine.generate([ASK], tools=WEATHER, parallel_tool_calls=False)
    assert [json.loads(c["function"]["arguments"])["city"] for c in both.tool_calls] == ["Paris", "Rome"]
    assert [json.loads(c["function"]["arguments"])["city"] for c in one.tool_calls] == ["Paris"], one.text
    assert split_reasoning(one.text)[0] == "A </tool_call> is how a call ends."
    _script(think_engine, monkeypatch, reply.replace("A </tool_call> is how a call ends.", 'Maybe <tool_call>\n{"name": '
                                                     '"get_weather", "arguments": {"city": "Oslo"}}\n</tool_call> first.'))
    one = think_engine.generate([ASK], tools=WEATHER, parallel_tool_calls=False)
    assert [json.loads(c["function"]["arguments"])["city"] for c in one.tool_calls] == ["Paris"], one.text
    assert '"city": "Oslo"' in split_reasoning(one.text)[0]


def test_a_call_written_inside_the_thinking_is_thought_not_a_call(think_engine, monkeypatch):
    """(session 81, a mutation test: the calls were read from the whole reply, its thinking too) A whole call block
    the model writes while it thinks stays in the thinking: the reply's calls are its answer's."""
    reply = ('<think>\nMaybe <tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call> '
             'first.\n</think>\n\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
             '</tool_call>')
    _script(think_engine, monkeypatch, reply)
    r = think_engine.generate([ASK], tools=WEATHER)
    assert [json.loads(c["function"]["arguments"])["city"] for c in r.tool_calls] == ["Paris"], r.text
    assert '"city": "Oslo"' in split_reasoning(r.text)[0]


def test_a_strict_call_s_grammar_waits_for_the_answer(think_engine):
    """In tool_choice auto a strict function's grammar opens at the model's <tool_call>; inside the thinking that
    token opens nothing (calls are read from the answer): the model's thinking names <tool_call>, and with the
    trigger live there its thought was held to the call's grammar, the call lost (a review's finding)."""
    from edgespec.constrain import tool_call_grammar
    from edgespec.tools import CLOSE, OPEN

    tok = think_engine.tokenizer
    strict = [{"type": "function", "function": {**WEATHER[0]["function"], "strict": True}}]
    ids = think_engine.encode([ASK], tools=think_engine.tool_request(WEATHER))  # (the non-strict prompt it learnt)
    lazy = tool_call_grammar(strict, "auto", True, tok.token_to_id(OPEN), tok.token_to_id(CLOSE))
    free = "".join(d[0] for d in think_engine.stream_ids(ids, max_new_tokens=80, temperature=0, drafter="none"))
    assert edgespec.split_reasoning(free)[0] == "I need the <tool_call> tool." and '"Paris"' in free, free
    for drafter in ("none", "prompt-lookup", "suffix"):
        held = "".join(d[0] for d in think_engine.stream_ids(ids, max_new_tokens=80, temperature=0, drafter=drafter,
                                                             grammar=lazy))
        assert held == free, drafter
    blank = think_engine.decoder.constraints.__self__.blank_ids()  # (the Grammars' white-space ids)
    assert tok.encode("\n", add_special=False)[0] in blank and tok.encode("x", add_special=False)[0] not in blank


def test_the_lazy_grammar_s_states_around_thinking():
    """LazyConstraint's states: a reply that starts inside a block (the prompt opened it) or whose first token opens
    one thinks until the first </think>; a trigger there opens nothing, after it a block."""
    from edgespec.constrain import LazyConstraint

    opened = []

    def new():
        opened.append(object())
        return opened[-1]

    THINK, END, TRIGGER = 1, 2, 5
    con = LazyConstraint(new, TRIGGER, 10, eos=(9,), think=(THINK, END))
    con.start([3, THINK])  # the template opened the block
    con.consume([4, TRIGGER, 4])
    assert not opened
    con.consume([END, TRIGGER])
    assert len(opened) == 1 and con.m is opened[0]
    con = LazyConstraint(new, TRIGGER, 10, eos=(9,), think=(THINK, END))
    con.start([3])
    con.consume([THINK, TRIGGER, END])  # the reply opens its block with its first token
    assert len(opened) == 1
    con = LazyConstraint(new, TRIGGER, 10, eos=(9,), think=(THINK, END))
    con.start([3])
    con.consume([4, THINK, TRIGGER])  # a <think> after the reply's first token opens no thinking
    assert len(opened) == 2
    con = LazyConstraint(new, TRIGGER, 10, eos=(9,), think=(THINK, END), blank=frozenset({6}))
    con.start([3])
    con.consume([6, 6, THINK, TRIGGER, END])  # white space first: the block still opens the reply (answer_start's)
    assert len(opened) == 2
    con = LazyConstraint(new, TRIGGER, 10, eos=(9,))  # not a thinking model: the tags are any tokens
    con.consume([THINK, TRIGGER])
    assert len(opened) == 3


class _Block:
    """A tool call's fake matcher (llguidance's LLMatcher protocol as LazyConstraint uses it): any token until CLOSE,
    which ends the call."""

    CLOSE = 7

    def __init__(self, seen=()):
        self.seen = list(seen)

    def validate_tokens(self, tokens):
        return 0 if self.is_stopped() else 1

    def consume_token(self, t):
        self.seen.append(t)
        return True

    def is_error(self):
        return False

    def is_stopped(self):
        return bool(self.seen) and self.seen[-1] == self.CLOSE

    def deep_copy(self):
        return _Block(self.seen)


def test_a_lazy_grammar_closes_its_block_and_opens_the_next_one():
    """(constrain.py LazyConstraint._advance: ``None if m.is_stopped()``) a block ends where its call closes: the
    text after it is free and the next trigger opens a new block (parallel calls); a block never closed held the
    rest of the reply to a stopped matcher (the second call and any text refused). And a draft's pushes advance a
    copy: the kept matcher is where the kept tokens left it after ``pop``."""
    from edgespec.constrain import LazyConstraint
    from edgespec.errors import EdgespecError

    opened = []

    def new():
        opened.append(_Block())
        return opened[-1]

    TRIGGER = 5
    con = LazyConstraint(new, TRIGGER, 10, eos=(9,))
    con.consume([4, TRIGGER, 3, 3, _Block.CLOSE])
    assert con.m is None and opened[0].seen == [3, 3, _Block.CLOSE]
    con.consume([4, 2, TRIGGER, 3])  # text after the call, then a second call
    assert len(opened) == 2 and con.m is opened[1] and opened[1].seen == [3]
    kept = con.m
    assert con.push(3) and con.push(_Block.CLOSE) and con.push(4) and con.push(TRIGGER)
    con.pop()
    assert con.m is kept and kept.seen == [3] and len(opened) == 3  # (the draft's trigger opened a block of its own)
    con.consume([_Block.CLOSE])
    assert con.m is None
    bad = LazyConstraint(new, TRIGGER, 10, eos=(9,))
    bad.consume([TRIGGER])
    bad.m.seen.append(_Block.CLOSE)  # (a matcher that stopped, not yet seen so: the next token is refused)
    with pytest.raises(EdgespecError, match="outside the tool call's grammar"):
        bad.consume([4])


class _MaskedBlock(_Block):
    """A ``_Block`` whose mask allows CLOSE alone (llguidance's ``unsafe_compute_mask_ptr``: bits by token id)."""

    def unsafe_compute_mask_ptr(self, ptr, nbytes):
        import ctypes

        words = (ctypes.c_int32 * (nbytes // 4)).from_address(ptr)
        for i in range(nbytes // 4):
            words[i] = 0
        words[self.CLOSE // 32] = 1 << (self.CLOSE % 32)

    def deep_copy(self):
        return _MaskedBlock(self.seen)


def test_a_drafters_mask_follows_its_own_draft_through_a_lazy_grammar():
    """(session 94, a mutation test of constrain.py: LazyConstraint.mask) a model drafter drafting under a lazy grammar
    (strict tool calls in ``auto``) gets the mask after its own pushed tokens: inside the block its draft opened, that
    block's mask; after ``pop``, the kept state's again (it got the kept state's all along: drafts into a call went
    unmasked, to be cut at verify)."""
    from edgespec.constrain import LazyConstraint

    TRIGGER = 5
    con = LazyConstraint(lambda: _MaskedBlock(), TRIGGER, 10, eos=(9,))
    con.consume([4])
    assert con.mask().all()
    assert con.push(4) and con.mask().all() and con.push(TRIGGER)
    assert np.flatnonzero(con.mask()).tolist() == [_Block.CLOSE]
    con.pop()
    assert con.mask().all() and con.m is None


def test_white_space_before_a_thinking_model_s_block_still_opens_it(think_engine):
    """(constrain.py Grammars.constraint: ``blank=self.blank_ids()``) a thinking model's reply that begins with a line
    break and then <think> thinks (reasoning.answer_start strips the white space): a <tool_call> it writes there opens
    no block of the strict call's grammar, as one without the line break; the engine's lazy grammar knows the
    white-space ids."""
    from edgespec.constrain import _THINKING, tool_call_grammar
    from edgespec.tools import CLOSE, OPEN

    tok = think_engine.tokenizer
    strict = [{"type": "function", "function": {**WEATHER[0]["function"], "strict": True}}]
    lazy = tool_call_grammar(strict, "auto", True, tok.token_to_id(OPEN), tok.token_to_id(CLOSE))
    prompt = think_engine.encode([ASK], tools=think_engine.tool_request(WEATHER))
    thought = tok.encode("\n<think>\nI need the <tool_call> tool.", add_special=False)
    assert thought[1] == tok.token_to_id("<think>") and tok.token_to_id(OPEN) in thought
    for ids in (thought, thought[1:]):
        con = think_engine.decoder.constraints(lazy)
        con.start(prompt)
        con.consume(ids)
        assert con.m is _THINKING, tok.decode(ids)
    con = think_engine.decoder.constraints(lazy)
    con.start(prompt)
    con.consume(tok.encode("\nx <tool_call>", add_special=False))  # text first: no thinking, the trigger opens a block
    assert con.m is not None and not isinstance(con.m, str)


def _split_by_definition(text: str, inside: bool) -> tuple[str | None, str]:
    """The split as reasoning.py's docstring defines it, on the whole text: a block opened by the reply (white space,
    then <think>) or by the template (``inside``) runs to the first </think>; its thinking stripped of the white
    space inside the tags, the answer of what follows the block's end; a reply with no block is all answer."""
    if inside:
        body = text
    else:
        s = text.lstrip()
        if not s.startswith("<think>"):
            return None, text
        body = s[len("<think>"):]
    at = body.find("</think>")
    if at < 0:
        return body.strip(), ""
    return body[:at].strip(), body[at + len("</think>"):].lstrip()


def test_the_streamed_split_is_the_whole_texts_for_any_text_and_any_pieces():
    """(session 71) Texts made of the tags, their prefixes, white space and words, cut into pieces one character
    each and at random: what the splitter gives as they stream joins to the split by definition of the whole text
    (the held-back tails of a possible tag or of white space, the tags' ends falling across pieces)."""
    bits = ["<think>", "</think>", "<th", "</thi", "</", "<", ">", " ", "\n", "\t", "a", "bc", "think", "/", "é"]
    rng = random.Random(71)
    for _ in range(1500):
        text = "".join(rng.choice(bits) for _ in range(rng.randint(0, 12)))
        for inside in (False, True):
            want = _split_by_definition(text, inside)
            assert split_reasoning(text, inside) == want, (text, inside)
            # where a tools reply's answer is read from (api.py): past the block's end, or 0 where there is none
            cut = answer_start(text, inside)
            assert (text[cut:].lstrip() if want[0] is not None else text[cut:]) == want[1], (text, inside, cut)
            for step in (lambda: 1, lambda: rng.randint(1, 6)):
                sp, parts, i = ReasoningSplitter(inside), {"reasoning": [], "content": []}, 0
                while i < len(text):
                    n = step()
                    for kind, t in sp.feed(text[i:i + n]):
                        parts[kind].append(t)
                    i += n
                for kind, t in sp.finish():
                    parts[kind].append(t)
                got = ("".join(parts["reasoning"]) if sp.opened else None, "".join(parts["content"]))
                assert got == want and all(parts["reasoning"] + parts["content"]), (text, inside)  # (no empty delta)
                assert sp.closed == (want[0] is not None and "</think>" in (text if inside else text.lstrip()[7:]))
