"""Fuzzing the parsers of untrusted input (issue 15): a manifest, a profile and a chat template end in
a typed error (an ``EdgespecError``) or a result, never in anything else. Bounded: a fixed number of
examples per parser and the template's time limit cut to 0.2 s."""
from __future__ import annotations

import copy
import json

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import MANIFEST_MODEL  # noqa: E402
from edgespec.errors import EdgespecError  # noqa: E402
from edgespec.manifest import Manifest, load_manifest  # noqa: E402
from edgespec.profiles import _check, load_profile  # noqa: E402

FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
pytestmark = pytest.mark.timeout(300)

MODEL = {**MANIFEST_MODEL, "files": {"target/model.onnx": {"bytes": 10, "sha256": "cd" * 32}},
         "validation": {"passed": True, "max_abs_logit_diff": {"prefill": 0.1}},
         "quality": {"perplexity": 3.0, "greedy_match_tokens": [1, 2]}}
MANIFEST = {"schema_version": 1, "name": "fuzz", "created": "2026-01-01T00:00:00Z", "sources": {"target": "x"},
            "tool_versions": {"edgespec": "0"}, "eos_token_ids": [2], "bos_token_id": 0, "add_bos": False,
            "chat_template": "{{ messages }}",
            "tokenizer": {"dir": "tokenizer", "vocab_size": 400,
                          "files": {"tokenizer/tokenizer.json": {"bytes": 5, "sha256": "ef" * 32}}},
            "models": {"target": MODEL, "drafter": {**MODEL, "path": "drafter/model.onnx",
                                                    "files": {"drafter/model.onnx": {"bytes": 3}}}}}
PROFILE = {"memory_budget_mb": 4096, "description": "fuzz", "providers": ["cuda", "cpu"],
           "provider_options": {"cuda": {"gpu_mem_limit": 1 << 30, "arena_extend_strategy": "kSameAsRequested"}},
           "kv_dtype": "auto", "max_context": 4096, "min_context": 512, "drafter": "auto", "draft_tokens": 4,
           "max_draft_tokens": 8, "threads": 2, "prefill_chunk": 256}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=12)
    | st.sampled_from(["%d", "%s%d", "../x", "/etc/passwd", "target/model.onnx", "int4", "float16", "cuda"]),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=10)


def _paths(d, prefix=()):
    """Every key path of a nested dict/list."""
    items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else []
    for k, v in items:
        yield prefix + (k,)
        yield from _paths(v, prefix + (k,))


def mutated(base):
    paths = list(_paths(base))

    @st.composite
    def strategy(draw):
        d = copy.deepcopy(base)
        for _ in range(draw(st.integers(1, 3))):
            path = draw(st.sampled_from(paths))
            parent = d
            try:
                for k in path[:-1]:
                    parent = parent[k]
                if draw(st.booleans()) and isinstance(parent, dict):
                    parent.pop(path[-1], None)
                else:
                    parent[path[-1]] = draw(json_values)
            except (KeyError, IndexError, TypeError):
                pass
        return d

    return strategy()


def typed(fn, *args, **kw):
    """``fn`` succeeds or raises an EdgespecError; anything else fails the test."""
    try:
        return fn(*args, **kw)
    except EdgespecError:
        return None


def test_the_bases_are_valid(tmp_path):
    assert Manifest.from_dict(copy.deepcopy(MANIFEST), tmp_path).drafter is not None
    assert _check("fuzz", dict(PROFILE), "fuzz").threads == 2


@FUZZ
@given(mutated(MANIFEST))
def test_manifest_schema(tmp_path, raw):
    m = typed(Manifest.from_dict, raw, tmp_path)
    if m is not None:  # what reads also writes and reads back
        Manifest.from_dict(json.loads(json.dumps(m.to_dict())), tmp_path)


@FUZZ
@given(st.one_of(st.binary(max_size=300), mutated(MANIFEST).map(lambda d: json.dumps(d).encode()),
                 st.integers(1, 200_000).map(lambda n: b"[" * n), st.text(max_size=200).map(str.encode)))
def test_manifest_file(tmp_path, data):
    (tmp_path / "edgespec.json").write_bytes(data)
    typed(load_manifest, tmp_path)


@FUZZ
@given(mutated(PROFILE))
def test_profile_schema(raw):
    typed(_check, "fuzz", raw, "fuzz.toml")


TOML_BITS = ["memory_budget_mb = 4096\n", "threads = ", "max_context = ", "[provider_options.cuda]\n",
             "[provider_options.cpu]\n", "providers = [\"cpu\"]\n", "drafter = ", "\"auto\"", "-1", "1e400", "[[x]]\n",
             "[", "]", "{", "}", "= ", "\n", "gpu_mem_limit = ", "inf", "nan", "\"\\u0000\"", "true", "a.b.c = 1\n"]


@FUZZ
@given(st.one_of(st.binary(max_size=200), st.lists(st.sampled_from(TOML_BITS) | st.text(max_size=6), max_size=20)
                 .map(lambda parts: "".join(parts).encode("utf-8", "surrogatepass"))))
def test_profile_file(tmp_path, data):
    p = tmp_path / "fuzz.toml"
    p.write_bytes(data)
    typed(load_profile, p)


JINJA_BITS = ["{{ ", " }}", "{% for m in messages %}", "{% endfor %}", "{% if ", " %}", "{% else %}", "{% endif %}",
              "m['content']", "m.role", "m", "messages", "range(", ")", "(", "*", "+", "%", "**", "'x'", "100000",
              "10**9", "|join", "|length", "|upper", "|tojson", "|center(", "|replace('x', 'yy')", "|indent(",
              "{% macro f(n) %}", "{% endmacro %}", "f(", "loop.index", "raise_exception('e')", "{% set x = ",
              "namespace(a=1)", ".__class__", ".mro()", "x", ",", "[", "]", "{% break %}", "{% continue %}",
              "add_generation_prompt", "bos_token", "eos_token", "'%10000000d'", ".ljust(", ".format(", "{#", "#}"]


@FUZZ
@given(st.lists(st.sampled_from(JINJA_BITS) | st.text(max_size=5), max_size=25).map("".join))
def test_chat_template(monkeypatch, source):
    from edgespec import template

    monkeypatch.setattr(template, "TIME_LIMIT_S", 0.2)
    t = typed(template.ChatTemplate, source)
    if t is not None:
        out = typed(t.render, messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
                    add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
        assert out is None or isinstance(out, str) and len(out) <= template.SIZE_LIMIT


def test_non_string_template():
    from edgespec import template

    for source in (None, 5, b"{{ x }}", ["{{ x }}"], {"a": 1}):
        typed(template.ChatTemplate, source)


# -- the server's request parsers: a request or an OpenAI-shaped 400/404, never a 500 ----------------------
CHAT = {"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [
    {"type": "text", "text": "hi"}]}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "x"}], "max_tokens": 8, "temperature": 0.5, "top_p": 0.9,
    "stop": ["\n"], "stream": True, "stream_options": {"include_usage": True}, "logit_bias": {"5": 1.0},
    "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "object"}}},
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "tool_choice": "auto", "edgespec": {"drafter": "auto", "draft_tokens": 4}, "prediction": {
        "type": "content", "content": "p"}}
RESPONSES = {"model": "m", "instructions": "be brief", "input": [
    {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
     "content": [{"type": "output_text", "text": "ok", "annotations": []}]},
    {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "x"}]},
    {"type": "reasoning", "id": "rs_1", "summary": []}],
    "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}],
    "tool_choice": {"type": "function", "name": "f"}, "text": {"format": {"type": "json_schema", "name": "n",
                                                                          "schema": {"type": "object"}}},
    "max_output_tokens": 16, "temperature": 0.7, "stream": True, "store": False, "include": [],
    "reasoning": {"effort": None}, "truncation": "disabled", "metadata": {"k": "v"}}


def api_typed(fn, *args):
    """``fn`` returns a request or raises the server's APIError (a 4xx answered as OpenAI does)."""
    from edgespec.server_protocol import APIError

    try:
        return fn(*args)
    except APIError as e:
        assert 400 <= e.status < 500 and e.message and "\n" not in e.message
        return None


def test_the_request_bases_are_valid():
    from edgespec.server_protocol import parse_chat, parse_responses

    assert len(parse_chat(copy.deepcopy(CHAT), "m").messages) == 4
    assert len(parse_responses(copy.deepcopy(RESPONSES), "m").messages) == 4  # (the reasoning item left out)


@FUZZ
@given(mutated(CHAT))
def test_chat_request(raw):
    from edgespec.server_protocol import parse_chat

    api_typed(parse_chat, raw, "m")


@FUZZ
@given(mutated(RESPONSES))
def test_responses_request(raw):
    from edgespec.server_protocol import parse_responses

    req = api_typed(parse_responses, raw, "m")
    if req is not None:  # what the response echoes is there and JSON
        json.dumps(req.responses)
