"""Tests for the gaps a second mutation test of edgespec/tokenizer.py and edgespec/tools.py found (session 94,
docs/bench/mutation_s94.md): each fails with its mutant (docs/bench/mutation_harness/tokenizer_tools.py) and checks
what a user gets: an error's words, the conversation the template is given, a call read or not, text and bytes."""
from __future__ import annotations

import json

import pytest

from edgespec.errors import ConfigError
from edgespec.tools import check_tool_choice, check_tool_messages, check_tools, parse_tool_calls, tool_request
from tiny import CORPUS, STRICT, TOOLS_TEMPLATE, WEATHER

NAMES = ["get_weather"]


def fn(name="f", **more):
    return {"type": "function", "function": {"name": name, **more}}


def refused(match, call, *args, **kw):
    with pytest.raises(ConfigError) as e:
        call(*args, **kw)
    assert match in str(e.value), str(e.value)
    return str(e.value)


# -- tools: check_tools --------------------------------------------------------------------------------------------
def test_tools_may_be_a_tuple_and_exactly_128():
    """(TL1, TL2) The Python API takes a tuple of tools; 128 is the bound itself, allowed."""
    assert check_tools((fn("a"), fn("b"))) == [fn("a"), fn("b")]
    assert len(check_tools([fn(f"f{i}") for i in range(128)])) == 128


def test_an_error_names_the_tool_it_is_about():
    """(TL3) The second tool's fault is tools[1]'s, not tools[0]'s."""
    refused("tools[1] must be", check_tools, [fn("a"), {"type": "function"}])
    refused("tools[2].function.name 'a' is given twice", check_tools, [fn("a"), fn("b"), fn("a")])


def test_a_function_names_bounds():
    """(TL4, TL5, TL6) A missing name is said to be missing; an empty one is refused; letters, digits, _ and - up to
    64 are a name."""
    assert refused("tools[0].function.name is missing", check_tools, [{"type": "function", "function": {}}]) == \
        "tools[0].function.name is missing (1-64 letters, digits, _ or -)"
    refused('tools[0].function.name must be 1-64 letters, digits, _ or -, got ""', check_tools, [fn("")])
    name = "get-weather_2" + "x" * 51
    assert len(name) == 64 and check_tools([fn(name)]) == [fn(name)]


def test_a_tools_schema_with_an_integer_past_what_json_holds_is_refused():
    """(TL8) Checked for every tool, strict or not (llguidance crashed on such bounds)."""
    refused("past +-(2**53 - 1)", check_tools,
            [fn("f", parameters={"type": "object", "properties": {"n": {"type": "integer", "maximum": 2 ** 63}}})])


def test_parameters_without_a_type_are_an_object_schema():
    """(TL9) OpenAI's default: a schema without "type" is taken (an object's), and given to the template."""
    params = {"properties": {"city": {"type": "string"}}}
    assert check_tools([fn("f", parameters=params)]) == [fn("f", parameters=params)]


def test_strict_false_is_not_strict():
    """(TL11) ``strict: false`` is dropped, and the function's bare call is read as a call (a strict one's is not)."""
    assert check_tools([fn("get_weather", strict=False)]) == [fn("get_weather")]
    req = tool_request([fn("get_weather", strict=False)], template=TOOLS_TEMPLATE)
    content, calls = req.parse('{"name": "get_weather", "arguments": {"city": "Oslo"}}')
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]


# -- tools: check_tool_choice --------------------------------------------------------------------------------------
def test_a_named_tool_choice_needs_its_type_and_says_what_is_wrong_with_its_name():
    """(TL13, TL14)"""
    refused("tool_choice must be 'auto', 'none', 'required'", check_tool_choice,
            {"function": {"name": "get_weather"}}, NAMES)
    assert refused("tool_choice names no function", check_tool_choice, {"type": "function", "function": {}},
                   NAMES) == "tool_choice names no function: its name is missing"
    assert refused("tool_choice's function name must be a string", check_tool_choice,
                   {"type": "function", "function": {"name": 5}}, NAMES) == \
        "tool_choice's function name must be a string, got 5"


# -- tools: check_tool_messages (the conversation the template is given) --------------------------------------------
def test_a_tool_message_keeps_its_id_and_name_and_nothing_else():
    """(TL16, TL17, TL18) A tool's result reaches the template as role, content, tool_call_id and name; an id or
    name that is not a string is refused."""
    got = check_tool_messages([{"role": "tool", "content": "22 C", "tool_call_id": "call_1", "name": "get_weather",
                                "extra": {"x": 1}}])
    assert got == [{"role": "tool", "content": "22 C", "tool_call_id": "call_1", "name": "get_weather"}]
    for key in ("tool_call_id", "name"):
        assert refused(f"message 1's {key} must be a string", check_tool_messages,
                       [{"role": "user", "content": "x"}, {"role": "tool", "content": "y", key: 7}]) == \
            f"message 1's {key} must be a string"


def _assistant(calls, content=None):
    return [{"role": "assistant", "content": content, "tool_calls": calls}]


def test_an_assistants_calls_as_the_template_gets_them():
    """(TL20, TL21, TL24, TL25, TL26) Arguments given as JSON text become the object they hold (none or "" : {}), the
    call keeps its id, and content null is ""."""
    got = check_tool_messages(_assistant([
        {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
        {"id": "call_b", "type": "function", "function": {"name": "g"}},
        {"type": "function", "function": {"name": "h", "arguments": "  "}}]))
    assert got == [{"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"x": 1}}, "id": "call_a"},
        {"type": "function", "function": {"name": "g", "arguments": {}}, "id": "call_b"},
        {"type": "function", "function": {"name": "h", "arguments": {}}}]}]


def test_malformed_calls_in_a_conversation_are_refused_with_their_place():
    """(TL19, TL22, TL23)"""
    assert refused("tool_calls must be a list", check_tool_messages,
                   _assistant({"function": {"name": "f"}})) == "message 0's tool_calls must be a list"
    assert refused("must be a JSON string", check_tool_messages,
                   _assistant([{"function": {"name": "f", "arguments": [1, 2]}}])) == \
        "message 0's tool_calls[0].function.arguments must be a JSON string"
    deep = "[" * 100_000 + "]" * 100_000
    assert refused("nested too deeply", check_tool_messages,
                   _assistant([{"function": {"name": "f", "arguments": deep}}])) == \
        "message 0's tool_calls[0].function.arguments is nested too deeply"


# -- tools: reading calls ------------------------------------------------------------------------------------------
def calls_of(calls):
    return [(c.name, json.loads(c.arguments)) for c in calls]


def test_a_block_call_without_arguments_is_a_call_with_none():
    """(TL29) ``{"name": ...}`` alone in a <tool_call> block is a call whose arguments are {}."""
    content, calls = parse_tool_calls('<tool_call>\n{"name": "get_weather"}\n</tool_call>', NAMES)
    assert content == "" and calls_of(calls) == [("get_weather", {})] and calls[0].arguments == "{}"


@pytest.mark.parametrize("args", ["[1, 2]", "null", "3", "true"])
def test_arguments_that_are_no_object_nor_text_are_no_call(args):
    """(TL30) The block stays in the content, as written."""
    reply = '<tool_call>\n{"name": "get_weather", "arguments": ' + args + '}\n</tool_call>'
    assert parse_tool_calls(reply, NAMES) == (reply, [])


def test_a_call_whose_name_is_a_lone_surrogate_is_no_call():
    """(TL31) No UTF-8 response can hold its name: the block stays content (the server failed writing it)."""
    reply = '<tool_call>{"name": "\\ud83d", "arguments": {}}</tool_call>'
    assert parse_tool_calls(reply, NAMES) == (reply, [])


def test_a_closed_block_with_text_after_its_json_is_no_call():
    """(TL33) Only an unclosed block (the reply cut at its end) may have text after its call."""
    reply = '<tool_call>\n{"name": "get_weather", "arguments": {}} and more\n</tool_call>'
    assert parse_tool_calls(reply, NAMES) == (reply, [])


def test_a_reply_whose_name_key_is_not_followed_by_a_colon_streams_at_once():
    """(TL34) ``{"name"=`` cannot be a bare call: given out as it comes, not held to the reply's end."""
    from edgespec.tools import ToolCallParser

    p = ToolCallParser(NAMES)
    assert p.feed('{"name"="get_weather" is what I would write') == [
        ("content", '{"name"="get_weather" is what I would write')]


def test_a_reply_naming_a_number_streams_at_once():
    """(TL35) ``{"name": 5`` cannot be a bare call (a tool's name is a string): given out as it comes."""
    from edgespec.tools import ToolCallParser

    p = ToolCallParser(NAMES)
    assert p.feed('{"name": 5, "age": 3}') == [("content", '{"name": 5, "age": 3}')]


def test_an_unclosed_call_ended_by_a_fence_leaves_no_fence():
    """(TL40) A call the model closed with ``` (Qwen2.5-Coder's fence habit) inside <tool_call>: the call, no
    stray fence in the content."""
    content, calls = parse_tool_calls('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n```',
                                      NAMES)
    assert content == "" and calls_of(calls) == [("get_weather", {"city": "Oslo"})]


# -- tools: ToolRequest ----------------------------------------------------------------------------------------------
NAMED = {"type": "function", "function": {"name": "get_weather"}}


class CallTokens:
    def token_to_id(self, text):
        return {"<tool_call>": 1000, "</tool_call>": 1001}.get(text)


def test_a_named_tool_choice_forces_the_call():
    """(TL50) A named function is a forced call: held to a grammar (no forced start then), and a thinking model's
    reply with parallel_tool_calls false still ends at the call's </tool_call>."""
    pytest.importorskip("llguidance")
    req = tool_request(WEATHER, NAMED, parallel_tool_calls=False, template=TOOLS_TEMPLATE)
    assert req.stops(thinking=True) == ["</tool_call>"]
    assert req.plan(CallTokens()) is not None and req.prefix == ""
    assert tool_request(WEATHER, "auto", parallel_tool_calls=False, template=TOOLS_TEMPLATE).stops(thinking=True) == []


def test_strict_tools_without_llguidance_are_refused(monkeypatch):
    """(TL51) A strict function's arguments cannot be held to its parameters without llguidance: refused, not
    generated unconstrained; a forced call of a function that is not strict falls back to the forced start."""
    import edgespec.constrain as constrain

    def missing():
        raise ConfigError("llguidance is not installed")

    monkeypatch.setattr(constrain, "_llguidance", missing)
    refused("strict tool calls need llguidance", tool_request(STRICT, template=TOOLS_TEMPLATE).plan, CallTokens())
    req = tool_request(WEATHER, "required", template=TOOLS_TEMPLATE)
    assert req.plan(CallTokens()) is None and req.prefix == '<tool_call>\n{"name": "'


def test_a_template_that_names_tools_but_writes_no_tool_call_blocks_refuses_them():
    """(TL58) Tools are read back from <tool_call> blocks only: a template that takes tools and writes its calls
    otherwise (Llama 3's JSON, Mistral's [TOOL_CALLS]) is refused, not given calls edgespec would never read."""
    refused("does not take tools in the <tool_call> format", tool_request, WEATHER,
            template="{% for t in tools %}{{ t | tojson }}{% endfor %}{% for m in messages %}{{ m.content }}"
                     "{% endfor %}")


# == tokenizer.py ==================================================================================================
CHAT = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}[{{ eos_token }}]")


def byte_level(directory, added=(), special=("<|endoftext|>", "<|im_start|>", "<|im_end|>"), config=None, **kw):
    """A small byte-level BPE tokenizer (GPT-2's alphabet: Qwen, Llama 3, SmolLM2), ``added`` tokens not special,
    saved in ``directory`` (with ``config`` as its tokenizer_config.json: a dict, or text as it is)."""
    from tokenizers import AddedToken, Tokenizer as HF, decoders, models, pre_tokenizers, trainers

    from edgespec.tokenizer import Tokenizer

    tok = HF(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=list(special),
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    if added:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in added])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    if config is not None:
        (directory / "tokenizer_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return Tokenizer(directory, **kw)


def sentencepiece(directory, pieces=("\u2581", "a", "b", "x", "y"), words=()):
    """A Llama-2-style tokenizer of ``pieces`` (test_runtime's): "▁" pieces, byte fallback to <0xNN> tokens, a
    decoder that strips a text's first space; pieces are given ids from 259 on, then ``words`` (each one token,
    merged from its characters)."""
    from tokenizers import AddedToken, Tokenizer as HF, decoders, models, pre_tokenizers

    from edgespec.tokenizer import Tokenizer

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in pieces:
        vocab.setdefault(piece, len(vocab))
    merges = []
    for w in words:
        for c in w:
            vocab.setdefault(c, len(vocab))
        for i in range(2, len(w) + 1):
            if w[:i] not in vocab:
                vocab[w[:i]] = len(vocab)
                merges.append((w[:i - 1], w[i - 1]))
    tok = HF(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1, right=0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    return Tokenizer(directory)


def test_a_broken_tokenizer_json_is_a_bundle_error(tmp_path):
    """(TK14) A typed error naming the file, not tokenizers' bare Exception."""
    from edgespec.errors import BundleError
    from edgespec.tokenizer import Tokenizer

    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(BundleError, match="cannot read .*tokenizer.json"):
        Tokenizer(tmp_path)


def test_token_bytes_of_specials_padding_byte_tokens_and_pieces(tmp_path):
    """(TK15-TK19, TK64) What logprobs' ``bytes`` and token healing read: a special token's own text (DeepSeek's
    "<｜end▁of▁sentence｜>" too, whose ▁ is no space), b"" for an id no token has, <0xE4> its byte, SentencePiece's
    ▁ a space; a GGUF's [PAD<i>] filler and an id past the vocabulary are padding, a real token is not."""
    eos = "<\uff5cend\u2581of\u2581sentence\uff5c>"
    tok = byte_level(tmp_path / "bl", special=("<|endoftext|>", eos))
    assert tok.token_bytes(tok.token_to_id(eos)) == eos.encode("utf-8")
    assert tok.token_bytes(tok.vocab_size + 3) == b""
    sp = sentencepiece(tmp_path / "sp", ("\u2581", "a", "b", "\u2581ab", "[PAD263]", "<0xZZ>"))
    assert [sp.id_to_token(i) for i in (259, 260, 261, 262, 263, 264)] == [
        "\u2581", "a", "b", "\u2581ab", "[PAD263]", "<0xZZ>"]
    assert sp.token_bytes(3 + 0xE4) == b"\xe4" and sp.token_bytes(262) == b" ab" and sp.token_bytes(260) == b"a"
    assert sp.token_bytes(264) == b"<0xZZ>" and sp.decode([260, 264]) == "a<0xZZ>"
    assert sp.is_padding(263) and sp.is_padding(sp.vocab_size + 1) and not sp.is_padding(262)
    assert not sp.is_padding(3 + 0xE4)


def test_byte_tokens_before_text_are_not_the_replys_end(tmp_path):
    """(TK21) A byte that is no UTF-8 the model wrote, then text: the text is kept (only a character the last
    tokens begin is left out)."""
    sp = sentencepiece(tmp_path / "sp")
    ids = [3 + 0xE4, sp.token_to_id("x")]
    assert sp.finished_text(ids) == sp.decode(ids) == "\ufffdx"
    dec = sp.stream_decoder()
    assert "".join([dec.push([i]) for i in ids] + [dec.flush()]) == "\ufffdx"
    assert sp.finished_text(ids[:1]) == ""  # (the same byte last: a character begun)


def test_encode_checks_its_text_and_adds_bos_once(tmp_path):
    """(TK25-TK29) A prompt that is not a string is refused with its type; bos is added once (an empty prompt gets
    it, a prompt that starts with it does not get a second), not with add_special=False; parse_special=False reads
    a special token's text as text."""
    tok = byte_level(tmp_path / "bl", add_bos=True, bos_token_id=0)
    assert tok.token_to_id("<|endoftext|>") == 0
    refused("the prompt must be a string, got int", tok.encode, 5)
    assert tok.encode("") == [0]
    hi = tok.encode("hi", add_special=False)
    assert 0 not in hi and tok.encode("hi") == [0] + hi and tok.encode("<|endoftext|>hi") == [0] + hi
    end = tok.token_to_id("<|im_end|>")
    assert tok.encode("<|im_end|>", add_special=False) == [end]
    as_text = tok.encode("<|im_end|>", add_special=False, parse_special=False)
    assert end not in as_text and tok.decode(as_text) == "<|im_end|>"


def test_decode_refuses_ids_naming_the_bad_one(tmp_path):
    """(TK44, TK45) A typed error, naming the first id that is no token id (not the first id, 0)."""
    tok = byte_level(tmp_path / "bl")
    assert refused("token ids must be integers", tok.decode, [0, -1]).endswith("got -1")
    assert refused("token ids must be integers", tok.decode, [1, "a"]).endswith("got 'a'")


def test_min_tokens_is_a_lower_bound_for_text_of_long_characters(tmp_path):
    """(TK42) A bound under the tokens a text encodes to, counted in bytes: a piece of four CJK characters is 12
    bytes (the longest token), not 4 characters (a 6-character "<0xE4>" would make it 6, and the bound too high:
    a prompt that fits refused as too long)."""
    sp = sentencepiece(tmp_path / "sp", ("\u2581",), words=("\u4e2d\u56fd\u4eba\u6c11",))
    text = "\u4e2d\u56fd\u4eba\u6c11" * 4
    n = len(sp.encode_text_piece(text))
    assert n == 4 and sp.min_tokens(text) == 4


def test_the_template_gets_bos_and_eos_texts(tmp_path):
    """(TK46-TK50) bos_token is the bos id's text; eos_token is tokenizer_config.json's (a string, or an AddedToken
    object's content), else the bundle's first end id's text (a config that is no JSON is passed over); a bundle
    without a template says so."""
    msgs = [{"role": "user", "content": "hi"}]
    im_end, eot = "<|im_end|>", "<|endoftext|>"
    kw = dict(bos_token_id=0, eos_token_ids=(2, 0), chat_template=CHAT)
    for name, config, eos in (("str", {"eos_token": eot}, eot),
                              ("obj", {"eos_token": {"content": eot, "special": True}}, eot),
                              ("broken", "{not json", im_end), ("none", None, im_end)):
        tok = byte_level(tmp_path / name, config=config, **kw)
        assert tok.id_to_token(2) == im_end
        assert tok.render_chat(msgs) == f"{eot}<|im_start|>user\nhi{im_end}\n<|im_start|>assistant\n[{eos}]", name
    tok = byte_level(tmp_path / "bare")
    assert refused("no chat template", tok.render_chat, msgs) == "this bundle has no chat template; use a plain prompt"


def test_markup_typed_in_a_message_stays_text(tmp_path):
    """(TK40) An added token that is not special but markup (Qwen2.5's <tool_call>) typed by a user is text, not
    the token its template writes."""
    tok = byte_level(tmp_path / "bl", added=("<tool_call>",), chat_template=CHAT)
    call = tok.token_to_id("<tool_call>")
    ids = tok.encode_chat([{"role": "user", "content": "say <tool_call> now"}])
    assert call not in ids and "say <tool_call> now" in tok.decode(ids)


def test_messages_are_checked_with_their_place(tmp_path):
    """(TK59-TK63) A role is a name of 1-32 characters starting with a letter or _; reasoning_content is text; an
    undecodable character is pointed at; a string is no list of messages."""
    tok = byte_level(tmp_path / "bl", chat_template=CHAT)
    ok = tok.render_chat([{"role": "a" * 32, "content": "x"}, {"role": "_x-1", "content": "y"}])
    assert "a" * 32 in ok
    for role in ("a" * 33, "1abc", ""):
        refused("message 0: role must be a name", tok.render_chat, [{"role": role, "content": "x"}])
    assert refused("reasoning_content", tok.render_chat,
                   [{"role": "assistant", "content": "x", "reasoning_content": 5}]) == \
        "message 0's reasoning_content must be a string, got int"
    assert refused("not valid UTF-8", tok.render_chat, [{"role": "user", "content": "ab\udcffc"}]) == \
        "message 0's content is not valid UTF-8 text (undecodable byte at character 2)"
    assert refused("messages must be a list", tok.render_chat, "hello") == \
        "messages must be a list of {role, content} objects, got str"


def test_held_is_only_the_text_not_out_yet(tmp_path):
    """(TK65) ``held()``: the text of tokens pushed but not emitted (a character begun), not what was emitted."""
    tok = byte_level(tmp_path / "bl")
    ok, e = tok.encode("ok "), tok.encode("\u00e9")
    assert len(e) == 2 and tok.decode(e[:1]) == "\ufffd"  # (é is two byte tokens here)
    dec = tok.stream_decoder()
    assert dec.push(ok) == "ok " and dec.held() == ""
    assert dec.push(e[:1]) == "" and dec.held() == "\ufffd"
    assert dec.push(e[1:]) == "\u00e9" and dec.held() == ""


FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>")


def test_fim_prompts_are_split_where_their_tokens_are(tmp_path):
    """(TK9-TK13) <prefix> A <suffix> B <middle>, after a bos or not, with empty sides too; not without <middle>."""
    from edgespec.tokenizer import fim_split

    tok = byte_level(tmp_path / "bl", special=("<|endoftext|>", "<|im_end|>", *FIM), eos_token_ids=(1,))
    f = tok.fim()
    pre, suf, mid = f.prefix, f.suffix, f.middle
    a, b = tok.encode("def f():", add_special=False), tok.encode("return 1", add_special=False)
    assert fim_split([pre, *a, suf, *b, mid], f) == (0, 1 + len(a))
    assert fim_split([0, pre, *a, suf, *b, mid], f) == (1, 2 + len(a))
    assert fim_split([pre, suf, mid], f) == (0, 1) and fim_split([0, pre, suf, mid], f) == (1, 2)
    assert fim_split([pre, *a, suf, *b], f) is None and fim_split([pre, *a, mid], f) is None


def test_a_middle_ends_at_the_fim_tokens_the_ends_of_text_and_the_models_eos(tmp_path):
    """(TK30-TK32)"""
    tok = byte_level(tmp_path / "bl", special=("<|endoftext|>", "<|im_end|>", *FIM, "<|file_sep|>"),
                     eos_token_ids=(1,))
    f = tok.fim()
    ids = {t: tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_end|>", *FIM, "<|file_sep|>")}
    assert (f.prefix, f.suffix, f.middle) == (ids["<|fim_prefix|>"], ids["<|fim_suffix|>"], ids["<|fim_middle|>"])
    assert f.ends == tuple(sorted(ids.values())) and ids["<|im_end|>"] == 1


def test_an_infill_prompt_has_bos_and_reads_its_suffix_as_asked(tmp_path):
    """(TK33-TK36) bos first where the model takes one; a special token's text in the suffix is text with
    parse_special=False; a bad suffix is named; a model without FIM tokens says so."""
    tok = byte_level(tmp_path / "bl", special=("<|endoftext|>", "<|im_end|>", *FIM), add_bos=True, bos_token_id=0)
    f, pad = tok.fim(), tok.token_to_id("<|fim_pad|>")
    ids = tok.encode_infill("a", "b<|fim_pad|>", parse_special=False)
    assert ids[:2] == [0, f.prefix] and ids[-1] == f.middle and pad not in ids
    assert tok.decode(ids[ids.index(f.suffix) + 1:-1]) == "b<|fim_pad|>"
    assert pad in tok.encode_infill("a", "b<|fim_pad|>")
    assert refused("the suffix", tok.encode_infill, "a", 5) == "the suffix must be a string, got int"
    plain = byte_level(tmp_path / "plain")
    assert plain.fim() is None
    refused("this model has no fill-in-the-middle tokens", plain.encode_infill, "a", "b")


def test_special_ids_past_the_models_rows(tmp_path):
    """(TK2, TK3) Ids past the model's rows are taken (never written) only where every one is a special token."""
    from tokenizers import AddedToken

    tok = byte_level(tmp_path / "bl", special=("<|endoftext|>",))
    n = tok.vocab_size
    tok._tok.add_special_tokens([AddedToken("<image_soft_token>", special=True, normalized=False)])
    assert tok.special_past(n) == 1 and tok.special_past(n + 1) == 0
    tok._tok.add_tokens([AddedToken("<tool_call>", special=False, normalized=False)])
    assert tok.special_past(n) is None


def _tj(vocab, merges=(), added=(), normalizer=None):
    return {"model": {"type": "BPE", "vocab": vocab, "merges": list(merges)}, "normalizer": normalizer,
            "pre_tokenizer": None, "added_tokens": [{"id": i, "content": c} for i, c in added]}


def test_the_tokenizer_fingerprint_tells_ids_apart_and_nothing_else():
    """(TK4-TK8) Two tokenizers that give other ids (other merges, another normalizer) hash differently; the same
    one written in another key or entry order hashes alike; the size is the largest id + 1."""
    from edgespec.tokenizer import tokenizer_fingerprint as fp

    vocab = {"a": 0, "b": 1, "ab": 2, "c": 5}
    base = fp(_tj(vocab, ["a b"], [(6, "<s>"), (7, "</s>")]))
    assert base[1] == 8
    assert fp(_tj(dict(reversed(list(vocab.items()))), ["a b"], [(7, "</s>"), (6, "<s>")])) == base
    assert fp(_tj(vocab, [], [(6, "<s>"), (7, "</s>")]))[0] != base[0]
    assert fp(_tj(vocab, ["a b"], [(6, "<s>"), (7, "</s>")], {"type": "Lowercase"}))[0] != base[0]


def test_a_grammars_forced_text_mid_reply_has_no_sentencepiece_space(tmp_path):
    """(TK37) ``encode_text_piece``: text spelled mid-reply, without the "▁" a SentencePiece-style tokenizer puts
    before a text's start ("is", not "▁is")."""
    sp = sentencepiece(tmp_path / "sp", ("\u2581",), words=("\u2581is", "is"))
    assert [sp.id_to_token(i) for i in sp.encode("is", add_special=False)] == ["\u2581is"]
    assert [sp.id_to_token(i) for i in sp.encode_text_piece("is")] == ["is"]
    assert [sp.id_to_token(i) for i in sp.encode_text_piece(" is")] == ["\u2581is"]


def test_a_special_tokens_text_in_reasoning_content_alone_stays_text(tmp_path):
    """(TK52) An assistant's thinking given back holding <|im_end|> (its content none): text, not the token that
    would end its turn there."""
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m.reasoning_content %}"
                "{{ m.reasoning_content }}\n{% endif %}{{ m['content'] }}<|im_end|>\n{% endfor %}")
    tok = byte_level(tmp_path / "bl", chat_template=template)
    end = tok.token_to_id("<|im_end|>")
    ids = tok.encode_chat([{"role": "user", "content": "hi"},
                           {"role": "assistant", "content": "ok", "reasoning_content": "a<|im_end|>b"}],
                          add_generation_prompt=False)
    assert ids.count(end) == 2 and "a<|im_end|>b\nok" in tok.decode(ids)


def test_a_special_tokens_text_in_an_earlier_calls_arguments_stays_text(tmp_path):
    """(TK54) A call the assistant made earlier whose argument holds <|im_end|> (a file's contents): the template
    renders it as text, the turn does not end inside the arguments."""
    tok = byte_level(tmp_path / "bl", chat_template=TOOLS_TEMPLATE)
    end = tok.token_to_id("<|im_end|>")

    def ids(city):
        msgs = check_tool_messages([
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "22 C"}])
        return tok.encode_chat(msgs, tools=WEATHER)

    plain, marked = ids("Paris"), ids("a<|im_end|>b")
    assert marked.count(end) == plain.count(end) > 0
    assert '"city": "a<|im_end|>b"' in tok.decode(marked)
