"""The wire format's gaps a second mutation test of edgespec/server_protocol.py found (session 98,
docs/bench/mutation_s98.md): each test fails with its planted bug (the mutant ids of
docs/bench/mutation_harness/server_protocol_mut2.py in its comment) and passes on the code as it is. The parser is
pure functions over dicts: no server, no model. Five gaps are cases of their twins instead: SP45 in test_server.py's
top_k test, SP88 and SP89 in its refusal-part test, SP77, SP79 and SP80 in test_tools.py's reasoning-item test."""
from __future__ import annotations

import re

import pytest

from edgespec import server_protocol as P

MSGS = [{"role": "user", "content": "hi"}]


def refused(parse, body: dict, param=None, code: str | None = None, match: str | None = None):
    """``parse(body)`` is a 400 naming ``param`` (``...``: any), and ``code`` and a message matching ``match`` where
    given."""
    with pytest.raises(P.APIError) as e:
        parse(body, "m")
    err = e.value  # (its message, not str(err): a Responses request's errors are reworded in err.message)
    assert match is None or re.search(match, err.message), (match, err.message)
    assert err.status == 400 and "\n" not in err.message, err.message
    assert param is ... or err.param == param, (err.param, err.message)
    if code is not None:
        assert err.code == code, (err.code, err.message)
    return err


def test_a_responses_request_s_sampling_fields_reach_the_engine():  # SP81, SP82
    """The Responses API's seed, top_k, min_p, repetition_penalty and edgespec options are the chat's: a seeded
    Responses request was sampled unseeded, its drafter ignored."""
    req = P.parse_responses({"input": "hi", "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05,
                             "seed": 5, "repetition_penalty": 1.1,
                             "edgespec": {"drafter": "none", "draft_tokens": 0}}, "m")
    assert req.options == {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "seed": 5,
                           "repetition_penalty": 1.1, "drafter": "none", "draft_tokens": 0}


def test_a_body_that_is_no_json_is_told_so_and_a_huge_number_likewise():  # SP5
    """Broken JSON is "not valid JSON" with the parser's reason; an integer past Python's digit limit is "a number
    too large to read" (both ``invalid_json``): a mutant read every broken body as the second."""
    for raw, words in ((b'{"messages": [', "is not valid JSON: Expecting value"),
                       (b'{bad', "is not valid JSON: Expecting property name"),
                       (b'{"max_tokens": ' + b"9" * 5000 + b"}", "has a number too large to read: Exceeds the limit")):
        with pytest.raises(P.APIError) as e:
            P.parse_body(raw)
        assert (e.value.status, e.value.code) == (400, "invalid_json") and words in e.value.message, e.value.message


def test_a_boolean_where_a_number_goes_is_called_a_boolean():  # SP8
    err = refused(P.parse_chat, {"messages": MSGS, "max_tokens": True}, "max_tokens")
    assert err.message == "'max_tokens' must be an integer, got a boolean", err.message
    err = refused(P.parse_chat, {"messages": MSGS, "temperature": False}, "temperature")
    assert err.message == "'temperature' must be a number, got a boolean", err.message


def test_integer_fields_at_both_ends_of_their_range():  # SP10, SP11, SP12, SP15
    """seed 0..2**63-1 (or -1, none): 2**63 and -2 are refused; an integer sent as 4.0 is 4; each upper bound itself
    is taken (n 16, top_logprobs 20, a completion's logprobs 20, edgespec.draft_tokens 64)."""
    assert P.parse_chat({"messages": MSGS, "seed": 2**63 - 1}, "m").options["seed"] == 2**63 - 1
    refused(P.parse_chat, {"messages": MSGS, "seed": 2**63}, "seed", match=r"in 0\.\.9223372036854775807, got")
    refused(P.parse_chat, {"messages": MSGS, "seed": -2}, "seed", match="got -2")
    req = P.parse_chat({"messages": MSGS, "max_tokens": 4.0, "n": 2.0}, "m")
    assert (req.max_tokens, req.n) == (4, 2) and type(req.max_tokens) is int
    req = P.parse_chat({"messages": MSGS, "n": P.MAX_N, "logprobs": True, "top_logprobs": 20,
                        "edgespec": {"draft_tokens": 64}}, "m")
    assert (req.n, req.options["logprobs"], req.options["draft_tokens"]) == (P.MAX_N, 20, 64)
    assert P.parse_completion({"prompt": "a", "logprobs": 20}, "m").options["logprobs"] == 20


def test_a_responses_request_s_echoed_tool_choice_is_checked():  # SP84
    """A Responses request's tool_choice is echoed in its response as sent: a lone surrogate in it is refused before
    the generation (it failed the reply's JSON after it: a 500)."""
    refused(P.parse_responses, {"input": "hi", "tool_choice": "\ud800"}, "tool_choice", match="unpaired UTF-16")


def test_a_responses_object_s_defaults_are_openai_s():  # SP85, SP86, SP87, SP156-SP159
    """Fields a Responses request left out are echoed as OpenAI's API gives them (typed clients read them):
    tool_choice "auto", metadata {}, text.format {"type": "text"}, no tools, parallel tool calls on; an object made
    with no engine reason is completed; the temperature and top_p echoed are the ones used (the response's
    edgespec statistics: the server's default where the request named none); a stream's items are added empty."""
    req = P.parse_responses({"input": "hi"}, "m")
    obj = P.response_object("resp_1", "m", 0, req, output=[])
    assert {k: obj[k] for k in ("tool_choice", "metadata", "text", "tools", "parallel_tool_calls", "instructions",
                                "user", "max_output_tokens", "status", "incomplete_details")} == {
        "tool_choice": "auto", "metadata": {}, "text": {"format": {"type": "text"}}, "tools": [],
        "parallel_tool_calls": True, "instructions": None, "user": None, "max_output_tokens": None,
        "status": "completed", "incomplete_details": None}
    assert (obj["temperature"], obj["top_p"]) == (None, 1.0)
    obj = P.response_object("resp_1", "m", 0, req, output=[], ext={"temperature": 0.7, "top_p": 0.9})
    assert (obj["temperature"], obj["top_p"]) == (0.7, 0.9)
    req = P.parse_responses({"input": "hi", "temperature": 0.3, "top_p": 0.5}, "m")
    obj = P.response_object("r", "m", 0, req, output=[])
    assert (obj["temperature"], obj["top_p"]) == (0.3, 0.5)
    assert P.message_item("msg_1", None, "in_progress")["content"] == []
    assert P.reasoning_item("rs_1", None, "in_progress")["content"] == []
    assert P.message_item("msg_1", "", "completed")["content"][0]["text"] == ""


def test_an_integer_out_of_range_is_quoted_whole_unless_it_is_huge():  # SP17
    err = refused(P.parse_chat, {"messages": MSGS, "n": 1000}, "n")
    assert err.message == f"'n' must be in 1..{P.MAX_N}, got 1000", err.message
    err = refused(P.parse_chat, {"messages": MSGS, "n": 10**39}, "n")
    assert err.message.endswith("got 100000000000... (40 digits)"), err.message
    err = refused(P.parse_chat, {"messages": MSGS, "max_tokens": -(10**39)}, "max_tokens")
    assert err.message.endswith("got -10000000000... (40 digits)"), err.message


def test_a_call_output_s_text_parts_are_joined_by_newlines():  # SP95
    req = P.parse_responses({"input": [
        {"role": "user", "content": "Q"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "a"},
                                                                    {"type": "input_text", "text": "b"}]}]}, "m")
    assert req.messages[-1] == {"role": "tool", "tool_call_id": "c1", "content": "a\nb"}


def test_a_null_boolean_is_false():  # SP21
    """JSON's null for a boolean field is its default, false: ``stream: null`` is no stream (a mutant streamed)."""
    req = P.parse_completion({"prompt": "a", "stream": None, "echo": None}, "m")
    assert (req.stream, req.echo) == (False, False)
    assert P.parse_tokenize({"prompt": "a", "with_pieces": None}, "m").with_pieces is False


def _nested(depth: int, leaf, wrap):
    out = leaf
    for _ in range(depth):
        out = wrap(out)
    return out


def test_what_a_responses_request_echoes_is_nested_64_levels_at_most():  # SP24, SP26
    """Fields the response echoes as sent are checked before the generation: nesting past 64 levels, of objects or of
    arrays, is refused (a mutant counted no level for an array)."""
    def tool(params):
        return {"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": params}]}

    # 62 objects in parameters: the innermost value 64 levels below 'tools', taken; one more level is refused
    P.parse_responses(tool(_nested(62, 1, lambda x: {"x": x})), "m")
    err = refused(P.parse_responses, tool(_nested(63, 1, lambda x: {"x": x})), ..., match="nested too deeply")
    assert err.param.startswith("tools[0].parameters.x.x"), err.param
    P.parse_responses(tool({"enum": _nested(61, 1, lambda x: [x])}), "m")
    refused(P.parse_responses, tool({"enum": _nested(62, 1, lambda x: [x])}), ..., match="nested too deeply")


def test_a_chat_s_verbosity_other_than_medium_is_refused():  # SP28
    refused(P.parse_chat, {"messages": MSGS, "verbosity": "high"}, "verbosity", "unsupported_parameter")
    assert P.parse_chat({"messages": MSGS, "verbosity": "medium"}, "m").messages == MSGS


def test_a_reasoning_item_s_parts_and_its_broken_text():  # SP97, SP98
    """A reasoning item's reasoning_text parts are its thinking, joined as they are; a lone surrogate in them is
    refused naming that item (a mutant's error named the assistant message after it)."""
    said = [{"type": "reasoning", "content": [{"type": "reasoning_text", "text": "A"},
                                              {"type": "reasoning_text", "text": "B"}]},
            {"role": "assistant", "content": "X"}]
    assert P.parse_responses({"input": said}, "m").messages[0]["reasoning_content"] == "AB"
    said[0]["content"][1]["text"] = "\ud800"
    refused(P.parse_responses, {"input": said}, "input[0].content", match="input\\[0\\].content holds an unpaired")


def test_a_responses_text_field_s_shapes():  # SP99, SP103, SP105
    """A message's {"type": "text"} part is text (as the chat's); ``text`` must be an object (a string is told so, not
    read as its characters' names); verbosity "medium", OpenAI's default, asks for nothing."""
    req = P.parse_responses({"input": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                             "text": {"verbosity": "medium"}}, "m")
    assert req.messages == MSGS and req.response_format is None
    refused(P.parse_responses, {"input": "hi", "text": "plain"}, "text", "invalid_type",
            match="'text' must be an object")


def test_fields_openai_has_that_edgespec_refuses_or_ignores():  # SP29, SP30, SP31, SP35
    """Audio output is refused (text alone passes); OpenAI's safety_identifier changes nothing here, accepted; a
    completion's ``echo`` sent to the chat endpoint is an unknown field there; metadata values are strings."""
    refused(P.parse_chat, {"messages": MSGS, "modalities": ["text", "audio"]}, "modalities", "unsupported_parameter")
    assert P.parse_chat({"messages": MSGS, "modalities": ["text"], "safety_identifier": "u1"}, "m").messages == MSGS
    refused(P.parse_chat, {"messages": MSGS, "echo": True}, "echo", "unknown_parameter")
    refused(P.parse_chat, {"messages": MSGS, "metadata": {"k": 5}}, "metadata", "invalid_type",
            match="'metadata.k' must be a string, got an integer")


def test_unknown_fields_are_all_named():  # SP37
    err = refused(P.parse_chat, {"messages": MSGS, "foo": 1, "bar": 2}, "bar", "unknown_parameter")
    assert err.message == ("unrecognized request argument supplied: bar (/v1/chat/completions does not take it; "
                           "nor foo)"), err.message


def test_stream_options_include_obfuscation_is_a_boolean_that_asks_nothing():  # SP40
    req = P.parse_chat({"messages": MSGS, "stream": True,
                        "stream_options": {"include_usage": True, "include_obfuscation": False}}, "m")
    assert req.stream and req.include_usage
    refused(P.parse_chat, {"messages": MSGS, "stream": True, "stream_options": {"include_obfuscation": "no"}},
            "stream_options.include_obfuscation", match="must be a boolean, got a string")


def test_min_p_at_most_one():  # SP46
    refused(P.parse_chat, {"messages": MSGS, "min_p": 1.01}, "min_p", match=r"must be in \[0, 1\], got 1\.01")


def test_a_prediction_needs_its_type():  # SP115
    refused(P.parse_chat, {"messages": MSGS, "prediction": {"content": "x"}}, "prediction.type",
            match="must be \"content\", got None")


def test_an_assistant_s_reasoning_content_that_is_no_string_is_a_400():  # SP124
    refused(P.parse_chat, {"messages": [*MSGS, {"role": "assistant", "content": "A", "reasoning_content": 5}]},
            "messages[1].reasoning_content", "invalid_type", match="must be a string, got an integer")


def test_a_completion_s_empty_token_prompt_is_refused():  # SP129
    for prompt in ([], [[]], [[1, 2], []]):
        refused(P.parse_completion, {"prompt": prompt}, "prompt", "invalid_type", match="'prompt' must be a string")


def test_repetition_penalty_at_most_ten():  # SP51
    assert P.parse_chat({"messages": MSGS, "repetition_penalty": 10.0}, "m").options["repetition_penalty"] == 10.0
    refused(P.parse_chat, {"messages": MSGS, "repetition_penalty": 10.5}, "repetition_penalty")


def test_top_logprobs_without_logprobs_is_refused():  # SP54
    """``top_logprobs`` with ``logprobs`` false or absent asks for what is off: refused, as OpenAI refuses it."""
    assert "logprobs" not in P.parse_chat({"messages": MSGS, "logprobs": False}, "m").options
    for lp in (False, None):
        refused(P.parse_chat, {"messages": MSGS, "logprobs": lp, "top_logprobs": 3}, "top_logprobs",
                match="needs 'logprobs': true")


def test_token_healing_is_a_boolean():  # SP59
    refused(P.parse_completion, {"prompt": "a", "edgespec": {"token_healing": 1}}, "edgespec.token_healing",
            match="must be a boolean, got an integer")


def test_a_completion_s_prompts_of_token_ids_and_their_count():  # SP130, SP131
    """Token ids are integers, not booleans (``true`` is no token); a request holds up to 16 prompts."""
    refused(P.parse_completion, {"prompt": [True, 5]}, "prompt", "invalid_type")
    req = P.parse_completion({"prompt": ["a"] * P.MAX_PROMPTS}, "m")
    assert len(req.prompts) == P.MAX_PROMPTS
    refused(P.parse_completion, {"prompt": ["a"] * (P.MAX_PROMPTS + 1)}, "prompt", match="at most 16 prompts")


def test_tokenize_s_missing_text_and_its_generation_prompt():  # SP138, SP139
    """/tokenize with nothing to tokenize is a 400 missing_required_parameter saying what to send; a chat's
    generation prompt is added unless add_generation_prompt is false (null is its default)."""
    refused(P.parse_tokenize, {}, "prompt", "missing_required_parameter", match="send one of 'prompt'")
    refused(P.parse_tokenize, {"prompt": "a", "content": "b"}, "prompt", "invalid_value")
    assert P.parse_tokenize({"messages": MSGS}, "m").add_generation_prompt is True
    assert P.parse_tokenize({"messages": MSGS, "add_generation_prompt": None}, "m").add_generation_prompt is True
    assert P.parse_tokenize({"messages": MSGS, "add_generation_prompt": False}, "m").add_generation_prompt is False


def test_logit_bias_and_stop_at_their_bounds():  # SP61, SP63, SP65, SP66
    """A bias of exactly -100 or 100 and 1,024 biased tokens are taken, as are 16 stop strings; a negative token id
    is no token id."""
    lb = P.parse_chat({"messages": MSGS, "logit_bias": {"5": -100, "6": 100}}, "m").options["logit_bias"]
    assert lb == ((5, -100.0), (6, 100.0))
    many = {str(i): 1 for i in range(P.MAX_LOGIT_BIAS)}
    assert len(P.parse_chat({"messages": MSGS, "logit_bias": many}, "m").options["logit_bias"]) == P.MAX_LOGIT_BIAS
    refused(P.parse_chat, {"messages": MSGS, "logit_bias": {"-5": 1}}, "logit_bias", match="got '-5'")
    stops = [f"s{i}" for i in range(P.MAX_STOP)]
    assert P.parse_chat({"messages": MSGS, "stop": stops}, "m").stop == stops


def test_responses_fields_that_ask_for_nothing_pass():  # SP70, SP72, SP73, SP74
    """The values of fields edgespec does not do that ask for nothing (what OpenAI's SDKs send by default) pass:
    include of the encrypted reasoning, background false, top_logprobs 0; instructions that are no string are told
    so by their own name."""
    req = P.parse_responses({"input": "hi", "include": ["reasoning.encrypted_content"], "background": False,
                             "top_logprobs": 0, "truncation": "disabled", "reasoning": {"effort": None}}, "m")
    assert req.messages == MSGS
    refused(P.parse_responses, {"input": "hi", "instructions": 5}, "instructions", "invalid_type",
            match="^'instructions' must be a string, got an integer$")


def test_tokenize_and_detokenize_refuse_what_is_no_boolean_or_no_token():  # SP140, SP144, SP145
    refused(P.parse_tokenize, {"messages": MSGS, "add_generation_prompt": "no"}, "add_generation_prompt",
            match="must be a boolean")
    refused(P.parse_detokenize, {"tokens": [True, 5]}, "tokens", "invalid_type")
    refused(P.parse_detokenize, {}, "tokens", "missing_required_parameter")
    assert P.parse_detokenize({"tokens": [1, 2]}, "m") == [1, 2]


def test_stats_and_usage_shapes():  # SP148, SP152, SP154, SP155
    """The statistics' "healed" appears only where the prompt was healed; a thinking reply's reasoning tokens are
    counted even when 0, and carried into the Responses usage; a reply that is only calls has content null."""
    from types import SimpleNamespace

    assert "healed" not in P.stats_summary(SimpleNamespace(reused_prompt_tokens=5))
    assert P.stats_summary(SimpleNamespace(healed="ab"))["healed"] == "ab"
    assert P.usage(3, 4, 0, reasoning=0)["completion_tokens_details"] == {"reasoning_tokens": 0}
    assert "completion_tokens_details" not in P.usage(3, 4, 0)
    assert P.response_usage(P.usage(3, 4, 1, reasoning=2))["output_tokens_details"] == {"reasoning_tokens": 2}
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    msg = P.chat_response("r", "m", 0, "", "eos", {}, {}, tool_calls=[call])["choices"][0]
    assert msg["message"]["content"] is None and msg["finish_reason"] == "tool_calls"
