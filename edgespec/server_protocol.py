"""The OpenAI wire format for ``edgespec serve``: request validation, response and chunk shapes, errors.

Pure functions over dicts: no HTTP stack, no engine (its ``Stats`` and errors are read by name and
type). ``server.py`` does the serving.

Bad input raises ``APIError`` (an OpenAI-shaped ``{"error": {message, type, param, code}}`` body
with its HTTP status). Parameters that edgespec cannot honour (``best_of`` > 1, audio, ...) are
refused, not silently ignored; fields that change nothing (``user``, ``metadata``, ``store``, ...) are
accepted and ignored; a field OpenAI's API does not have (and that is not one of edgespec's extensions,
``top_k``, ``min_p``, ``repetition_penalty`` and ``edgespec``, named as vLLM's and llama.cpp's servers
name them) is refused as OpenAI refuses it, so that a sampling option of another server (``typical_p``, ...)
never passes unnoticed.

``temperature``: absent means the server's default: ``edgespec serve --temperature``, else the model's
recommended (its bundle's ``sampling_defaults``), else OpenAI's (1); the response's ``edgespec.temperature`` is
the value used. ``top_p``, ``top_k``, ``min_p`` and ``repetition_penalty`` absent are the model's recommended
(off where it names none; ``serve --no-model-sampling``: off), reported likewise.

``max_tokens`` (or ``max_completion_tokens``): an integer >= 1; absent means "until the context
is full". A value larger than the room the prompt leaves in the context is clamped to that room
(the reply then ends with ``finish_reason: "length"`` at the latest when the context is full);
the response's ``edgespec.max_tokens`` is the value used and ``edgespec.max_tokens_clamped`` says
whether it was cut. A prompt that leaves no room at all is a 400 ``context_length_exceeded``.

``logprobs`` (chat: ``logprobs: true`` and ``top_logprobs`` 0..20; completions: ``logprobs`` 0..20): each
returned token's log-probability under the target model (the softmax of its logits, before temperature,
top-k/top-p or a response format's mask, as OpenAI and vLLM report them) with the most likely tokens at its
position; a completion's ``text_offset`` counts from the start of the text returned (vLLM's). A completion's
``echo`` returns the prompt (as its tokens decode) before the reply, with logprobs its tokens' own (the
first one's null: ``Engine.score``); ``max_tokens: 0`` with ``echo`` scores the prompt and generates
nothing (a text's log-likelihood, as evaluation harnesses ask). A completion's ``prompt`` may be token ids.
Streamed, each chunk carries the entries of the tokens whose text it begins. Not with tools the reply may
call (a 400): its calls are taken out of the text.
"""
from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import dataclass, field

from .decoder import MAX_LOGPROBS, MIN_REPETITION_PENALTY
from .drafters import drafter_choices
from .errors import BusyError, ConfigError, ContextOverflowError, EdgespecError, parse_reason

DRAFTERS = drafter_choices()
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_STOP = 16
MAX_N = 16  # choices a request may ask for (``n``, times the prompts of a completion)
MAX_PROMPTS = 16  # prompts a completion request may hold
MAX_BODY = 8 << 20  # bytes; a prompt can never be longer than the context anyway


class APIError(Exception):
    """An error answered to the client as OpenAI does: status plus ``{"error": {...}}``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    # (bounded: a message that quotes what the client sent, a model name or an unknown field's name of megabytes,
    # was sent back whole)
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS - 1] + "…"
    if param is not None and len(param) > MAX_PARAM_CHARS:
        param = param[:MAX_PARAM_CHARS - 1] + "…"
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


MAX_ERROR_CHARS, MAX_PARAM_CHARS = 1000, 200


def bad(message: str, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


# -- request parsing ----------------------------------------------------------------------------
@dataclass
class GenRequest:
    """A validated chat or completion request."""

    kind: str  # "chat" | "completion"
    model: str
    messages: list[dict] | None = None
    prompt: str | None = None
    prompt_ids: list[int] | None = None  # a completion's prompt sent as token ids (the server checks the vocabulary)
    prompts: list = field(default_factory=list)  # a completion's prompts (text or ids), answered in turn
    suffix: str | None = None  # a completion's text after the gap: fill in the middle (None or "": a plain completion)
    echo: bool = False  # a completion's reply begins with its prompt (with logprobs: the prompt's own, scored)
    token_healing: bool = False  # edgespec.token_healing: the prompt's last token backed off (healing.py)
    n: int = 1  # choices a prompt: generated one after the other, its j-th sampled with seed + j where a seed is given
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    options: dict = field(default_factory=dict)  # engine keywords: temperature, top_p, top_k, seed, drafter, ...
    tools: dict | None = None  # tools, tool_choice, parallel_tool_calls as sent (the engine checks them: tools.py)
    response_format: dict | None = None  # json_object or json_schema as sent (structured outputs: constrain.py)
    responses: dict | None = None  # /v1/responses: the request's own fields its response echoes (else None)
    template_kwargs: dict | None = None  # chat_template_kwargs: more variables for the chat template


def parse_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise bad("the request body is not UTF-8 text", code="invalid_json") from None
    except json.JSONDecodeError as e:
        raise bad(f"the request body is not valid JSON: {e}", code="invalid_json") from None
    except ValueError as e:  # (an integer of more digits than Python converts: "Exceeds the limit ...")
        raise bad(f"the request body has a number too large to read: {parse_reason(e)}",
                  code="invalid_json") from None
    except RecursionError:
        raise bad("the request body is nested too deeply", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad(f"the request body must be a JSON object, got {_kind(body)}", code="invalid_json")
    return body


def _kind(v) -> str:
    if v is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "an array",
            dict: "an object"}.get(type(v), type(v).__name__)


def _is_minus_one(v) -> bool:
    """-1 (or -1.0), not a bool: ``seed`` -1 is llama.cpp's server's "random", ``top_k`` -1 vLLM's "off"."""
    return v == -1 and not isinstance(v, bool)


def _seed(body: dict) -> int | None:
    """``seed``: 0..2**63-1, or -1 for none (llama.cpp's server's "random", which its front-ends send)."""
    if _is_minus_one(body.get("seed")):
        return None
    return _int(body, "seed", 0, 2**63 - 1)


def _int(body: dict, key: str, lo: int | None = None, hi: int | None = None, where: str | None = None) -> int | None:
    """``body[key]`` as an integer in lo..hi, or None; ``where`` names it in errors (default ``key``)."""
    v, where = body.get(key), where or key
    if v is None:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        raise bad(f"'{where}' must be an integer, got {_kind(v)}", where)
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        shown = str(v) if abs(v) < 10 ** 30 else f"{str(v)[:12]}... ({len(str(abs(v)))} digits)"
        raise bad(f"'{where}' must be {rng}, got {shown}", where)
    return v


def _number(body: dict, key: str, lo: float, hi: float) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise bad(f"'{key}' must be a number, got {_kind(v)}", key)
    try:
        v = float(v)
    except OverflowError:  # an integer too large for a float
        raise bad(f"'{key}' must be in [{lo:g}, {hi:g}]", key) from None
    if not math.isfinite(v) or v > hi or v < lo:
        raise bad(f"'{key}' must be in [{lo:g}, {hi:g}], got {v}", key)
    return float(v)


def _bool(body: dict, key: str, where: str | None = None) -> bool:
    v, where = body.get(key, False), where or key
    if v is None:
        return False
    if not isinstance(v, bool):
        raise bad(f"'{where}' must be a boolean, got {_kind(v)}", where)
    return v


def _text(v: str, where: str, param: str | None = None) -> str:
    """``v`` if it is valid Unicode: JSON's escapes can carry a lone surrogate, which no tokenizer reads (``param``:
    the error's, where it is not ``where`` as the message names it)."""
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(f"{where} holds an unpaired UTF-16 surrogate (a broken \\uD800-\\uDFFF escape)",
                  param or where) from None
    return v


def _echoable(v, where: str, depth: int = 0) -> None:
    """A request's field that a response echoes as it was sent (the Responses API's metadata, user, tools,
    tool_choice, text.format): JSON the reply can be written with, refused before the request is queued (a lone
    surrogate or a NaN failed the reply after the generation, a 500 or a cut stream)."""
    if depth > 64:
        raise bad(f"'{where}' is nested too deeply", where)
    if isinstance(v, str):
        _text(v, f"'{where}'", where)
    elif isinstance(v, float) and not math.isfinite(v):
        raise bad(f"'{where}' holds {v}, which JSON cannot carry", where)
    elif isinstance(v, dict):
        for k, x in v.items():
            _text(k, f"'{where}'", where)
            _echoable(x, f"{where}.{k[:64]}" if k.isidentifier() else where, depth + 1)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            _echoable(x, f"{where}[{i}]", depth + 1)


# parameters edgespec cannot honour, with the values that ask for nothing (those pass)
_HARMLESS = {"functions": ([],),
             "function_call": ("none", "auto"),
             "best_of": (1,), "audio": (),
             "modalities": (["text"],), "reasoning_effort": (), "web_search_options": (), "verbosity": ("medium",),
             "moderation": ()}
# OpenAI's fields that change nothing here: accepted and ignored
_IGNORED = {"user", "metadata", "store", "service_tier", "prompt_cache_key", "prompt_cache_retention",
            "prompt_cache_options", "safety_identifier"}
_COMMON_KEYS = {"model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "stop", "temperature",
                "top_p", "top_k", "min_p", "seed", "n", "presence_penalty", "frequency_penalty", "repetition_penalty",
                "logprobs", "logit_bias", "edgespec"} | _IGNORED
_KEYS = {"chat": _COMMON_KEYS | {"messages", "top_logprobs", "tools", "tool_choice", "functions", "function_call",
                                 "chat_template_kwargs",
                                 "parallel_tool_calls", "prediction", "audio", "modalities", "response_format",
                                 "reasoning_effort", "web_search_options", "verbosity", "moderation"},
         "completion": _COMMON_KEYS | {"prompt", "best_of", "suffix", "echo"}}


def _metadata(v) -> None:
    """OpenAI's ``metadata`` (ignored here; a response object echoes it): null or an object of at most 16 string
    values of at most 512 characters, under keys of at most 64; anything else is refused as OpenAI refuses it (a
    typed client would fail to read the echo)."""
    if v is None:
        return
    if not isinstance(v, dict):
        raise bad(f"'metadata' must be an object of strings, got {_kind(v)}", "metadata", "invalid_type")
    if len(v) > 16:
        raise bad(f"'metadata' holds at most 16 pairs, got {len(v)}", "metadata")
    for k, x in v.items():
        if len(k) > 64:
            raise bad(f"'metadata' keys are at most 64 characters, got one of {len(k)}", "metadata")
        if not isinstance(x, str):
            raise bad(f"'metadata.{k[:64]}' must be a string, got {_kind(x)}", "metadata", "invalid_type")
        if len(x) > 512:
            raise bad(f"'metadata.{k[:64]}' is at most 512 characters, got {len(x)}", "metadata")


def _template_kwargs(body: dict) -> dict | None:
    """A chat's ``chat_template_kwargs`` (vLLM's and llama.cpp's: Qwen3's ``enable_thinking``), checked
    (``template.check_template_kwargs``); None where absent or empty."""
    if body.get("chat_template_kwargs") is None:
        return None
    from .template import check_template_kwargs

    try:
        return check_template_kwargs(body["chat_template_kwargs"]) or None
    except ConfigError as e:
        raise bad(str(e), "chat_template_kwargs") from None


def _known(body: dict, keys: set, where: str) -> None:
    """A field the endpoint ``where`` does not take is refused, as OpenAI refuses it."""
    unknown = sorted(set(body) - keys)
    if unknown:
        raise bad(f"unrecognized request argument supplied: {unknown[0]} ({where} does not take it"
                  + (f"; nor {', '.join(unknown[1:])}" if len(unknown) > 1 else "") + ")", unknown[0],
                  "unknown_parameter")


def _common(body: dict, kind: str, model_id: str) -> GenRequest:
    _known(body, _KEYS[kind], "/v1/chat/completions" if kind == "chat" else "/v1/completions")
    if body.get("user") is not None and not isinstance(body["user"], str):  # (ignored, but a string by OpenAI's API)
        raise bad(f"'user' must be a string, got {_kind(body['user'])}", "user", "invalid_type")
    _metadata(body.get("metadata"))
    _model_is(body, model_id)
    req = GenRequest(kind=kind, model=model_id, stream=_bool(body, "stream"))
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise bad(f"'stream_options' must be an object, got {_kind(so)}", "stream_options")
        if not req.stream:
            raise bad("'stream_options' is only allowed with 'stream': true", "stream_options")
        unknown = sorted(set(so) - {"include_usage", "include_obfuscation"})
        if unknown:
            raise bad(f"unrecognized 'stream_options' field: {unknown[0]} (known: include_usage, "
                      "include_obfuscation)", f"stream_options.{unknown[0]}"[:100], "unknown_parameter")
        req.include_usage = _bool(so, "include_usage", "stream_options.include_usage")
        _bool(so, "include_obfuscation", "stream_options.include_obfuscation")  # (a boolean; nothing to pad here)

    # one length limit, under either of OpenAI's names (0 only with a completion's echo: the prompt scored)
    least = 0 if kind == "completion" else 1  # (a chat's 0 is refused as a completion's without echo is, below)
    mt = _int(body, "max_tokens", least)
    mct = _int(body, "max_completion_tokens", least)
    if mt is not None and mct is not None and mt != mct:
        raise bad("'max_tokens' and 'max_completion_tokens' differ; send one of them", "max_tokens")
    req.max_tokens = mct if mct is not None else mt
    if req.max_tokens == 0 and not (kind == "completion" and body.get("echo") is True):
        key = "max_tokens" if mt == 0 else "max_completion_tokens"
        raise bad(f"'{key}' must be >= 1, got 0" + (" (0 only with 'echo': true, the prompt's logprobs and nothing "
                                                   "generated)" if kind == "completion" else ""), key)

    req.stop = _stop(body.get("stop"))
    opts = req.options
    for key, value in (("temperature", _number(body, "temperature", 0.0, 2.0)),
                       ("top_p", _number(body, "top_p", 0.0, 1.0)),  # (0: greedy, as OpenAI takes it)
                       ("top_k", 0 if _is_minus_one(body.get("top_k")) else _int(body, "top_k", 0, 2**31 - 1)),
                       ("min_p", _number(body, "min_p", 0.0, 1.0)),
                       ("seed", _seed(body))):
        if value is not None:
            opts[key] = value

    req.n = _int(body, "n", 1, MAX_N) or 1  # choices, generated one after the other
    # the target's logits processed (penalties.py): exact under speculative decoding as without
    for key in ("presence_penalty", "frequency_penalty"):
        v = _number(body, key, -2.0, 2.0)
        if v:
            opts[key] = v
    v = _number(body, "repetition_penalty", MIN_REPETITION_PENALTY, 10.0)  # vLLM's and llama.cpp's extension
    if v is not None:  # (1, off, sent: over the model's recommended penalty, which serve takes by default)
        opts["repetition_penalty"] = v
    lb = body.get("logit_bias")
    if lb is not None:
        opts_lb = _logit_bias(lb)
        if opts_lb:
            opts["logit_bias"] = opts_lb
    for key, allowed in _HARMLESS.items():
        v = body.get(key)
        if v is not None and not any(type(v) is type(a) and v == a for a in allowed):
            raise bad(f"'{key}' is not supported by edgespec", key, "unsupported_parameter")
    if kind == "chat":  # logprobs: true, top_logprobs N
        lp = body.get("logprobs")
        if lp is not None and not isinstance(lp, bool):
            raise bad(f"'logprobs' must be a boolean, got {_kind(lp)}", "logprobs")
        top = _int(body, "top_logprobs", 0, MAX_LOGPROBS)
        if top and not lp:
            raise bad("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        if lp:
            opts["logprobs"] = top or 0
    else:  # the legacy completions' logprobs N
        lp = _int(body, "logprobs", 0, MAX_LOGPROBS)
        if lp is not None:
            opts["logprobs"] = lp
    rf = body.get("response_format")
    if rf is not None:  # checked and compiled by the server, off the event loop (constrain.grammar_for)
        if not (isinstance(rf, dict) and rf.get("type") in ("text", "json_object", "json_schema")):
            raise bad("'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                      "{\"type\": \"json_schema\", \"json_schema\": {\"name\", \"schema\"}}", "response_format")
        if rf["type"] != "text":
            req.response_format = rf
        elif set(rf) - {"type"}:  # (as json_object's and json_schema's unknown keys are refused)
            raise bad(f"'response_format' of type text takes no other field, got {sorted(set(rf) - {'type'})[0]!r}"[:200],
                      "response_format", "unknown_parameter")

    ext = body.get("edgespec")
    if ext is not None:
        if not isinstance(ext, dict):
            raise bad(f"'edgespec' must be an object, got {_kind(ext)}", "edgespec")
        unknown = set(ext) - {"drafter", "draft_tokens", "max_draft_tokens", "token_healing"}
        if unknown:
            raise bad(f"unknown 'edgespec' option(s): {', '.join(sorted(unknown))} "
                      "(known: drafter, draft_tokens, max_draft_tokens, token_healing)", "edgespec")
        th = ext.get("token_healing")
        if th is not None:
            if not isinstance(th, bool):
                raise bad(f"'edgespec.token_healing' must be a boolean, got {_kind(th)}", "edgespec.token_healing")
            if th and kind == "chat":
                raise bad("'edgespec.token_healing' is for /v1/completions (a plain prompt: the text before the "
                          "cursor)", "edgespec.token_healing")
            req.token_healing = th
        d = ext.get("drafter")
        if d is not None:
            if d not in DRAFTERS:
                raise bad(f"'edgespec.drafter' must be one of {', '.join(DRAFTERS)}, got {d!r}", "edgespec.drafter")
            opts["drafter"] = d
        for key in ("draft_tokens", "max_draft_tokens"):
            v = _int(ext, key, 0 if key == "draft_tokens" else 1, 64, f"edgespec.{key}")
            if v is not None:
                opts[key] = v
    return req


MAX_LOGIT_BIAS = 1024  # tokens a request may bias


def _logit_bias(v) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``logit_bias``: an object from token ids (as JSON strings, or integers) to biases in
    -100..100 (the server checks the ids against the vocabulary)."""
    if not isinstance(v, dict):
        raise bad(f"'logit_bias' must be an object mapping token ids to biases, got {_kind(v)}", "logit_bias")
    if len(v) > MAX_LOGIT_BIAS:
        raise bad(f"'logit_bias' holds at most {MAX_LOGIT_BIAS} tokens, got {len(v)}", "logit_bias")
    out = []
    for k, b in v.items():
        try:
            t = int(k) if isinstance(k, (str, int)) and not isinstance(k, bool) else None
        except ValueError:
            t = None
        if t is None or t < 0 or (isinstance(k, str) and k != str(t)):
            raise bad(f"'logit_bias' keys must be token ids (non-negative integers), got {k!r}"[:200], "logit_bias")
        try:
            ok = not isinstance(b, bool) and isinstance(b, (int, float)) and math.isfinite(float(b)) \
                and -100 <= b <= 100
        except OverflowError:
            ok = False
        if not ok:
            raise bad(f"'logit_bias' of token {t} must be a number in -100..100, got {b!r}"[:200], "logit_bias")
        out.append((t, float(b)))
    return tuple(out)


def _stop(v) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not all(isinstance(s, str) for s in v):
        raise bad("'stop' must be a string or an array of strings", "stop")
    if len(v) > MAX_STOP:
        raise bad(f"'stop' holds at most {MAX_STOP} strings, got {len(v)}", "stop")
    return [_text(s, "stop") for s in v if s]


def parse_chat(body: dict, model_id: str) -> GenRequest:
    req = _common(body, "chat", model_id)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad("'messages' must be a non-empty array of {role, content} objects"
                  + ("" if msgs is not None else " (it is missing)"), "messages",
                  "missing_required_parameter" if msgs is None else "invalid_type")
    req.messages = [_message(m, i) for i, m in enumerate(msgs)]
    req.template_kwargs = _template_kwargs(body)
    tools = {k: body[k] for k in ("tools", "tool_choice", "parallel_tool_calls") if body.get(k) is not None}
    if tools:
        req.tools = tools
    pred = _prediction(body.get("prediction"))
    if pred:
        req.options["prediction"] = pred
    return req


# -- the Responses API: a request read as the chat request it asks for ----------------------------------
_RESPONSES_KEYS = {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "stream",
                   "chat_template_kwargs",
                   "stream_options", "tools", "tool_choice", "parallel_tool_calls", "text", "store", "metadata",
                   "user", "previous_response_id", "conversation", "reasoning", "truncation", "include",
                   "service_tier", "prompt_cache_key", "prompt_cache_retention", "safety_identifier", "background",
                   "top_logprobs", "max_tool_calls", "prompt", "prompt_cache_options", "top_k", "min_p", "seed",
                   "repetition_penalty", "edgespec"}
# fields that ask for what edgespec does not do, with the values that ask for nothing (those pass)
_RESPONSES_REFUSED = {
    "previous_response_id": ((None,), "edgespec keeps no responses: send the whole conversation in 'input'"),
    "conversation": ((None,), "edgespec keeps no conversations: send the whole conversation in 'input'"),
    "prompt": ((None,), "edgespec has no stored prompts: send the text in 'instructions' and 'input'"),
    "background": ((None, False), "edgespec answers in the foreground only"),
    "include": ((None, [], ["reasoning.encrypted_content"]), "edgespec includes nothing more in a response "
                                                           "(no logprobs, no search results)"),
    "reasoning": ((None, {}), "this server's models do not take reasoning options"),
    "truncation": ((None, "disabled"), "edgespec does not drop input items: a conversation too long is a 400"),
    "max_tool_calls": ((None,), "edgespec does not bound tool calls by number (parallel_tool_calls: false "
                                "makes at most one)"),
    "top_logprobs": ((None, 0), "edgespec's Responses endpoint returns no logprobs (use /v1/chat/completions)"),
}
_PART_TYPES = {"input_text", "output_text", "text", "refusal"}


def parse_responses(body: dict, model_id: str) -> GenRequest:
    """A ``/v1/responses`` request as the chat request it asks for: ``instructions`` a system message, ``input``
    (a string, or message, ``function_call`` and ``function_call_output`` items) the messages, its function tools
    and ``text.format`` the chat's tools and response_format; the chat's checks then apply, their errors naming
    the Responses fields. ``req.responses`` keeps what the response echoes."""
    _known(body, _RESPONSES_KEYS, "/v1/responses")
    for key, (allowed, why) in _RESPONSES_REFUSED.items():
        v = body.get(key)
        if isinstance(v, dict) and all(x is None for x in v.values()):
            v = {}  # ({"effort": null}: asks for nothing)
        if not any(type(v) is type(a) and v == a for a in allowed):
            raise bad(f"'{key}' is not supported: {why}", key, "unsupported_parameter")
    where: list[str] = []  # the Responses field each chat message came from
    msgs: list[dict] = []
    instr = body.get("instructions")
    if instr is not None:
        if not isinstance(instr, str):
            raise bad(f"'instructions' must be a string, got {_kind(instr)}", "instructions", "invalid_type")
        if instr:
            msgs.append({"role": "system", "content": instr})
            where.append("instructions")
    inp = body.get("input")
    whole = isinstance(inp, str)  # (a string: its errors name 'input' itself)
    if whole:
        inp = [{"role": "user", "content": inp}]
    if not isinstance(inp, list) or not inp:
        raise bad("'input' must be a string or a non-empty array of items" + (" (it is missing)" if inp is None
                                                                                else ""), "input",
                  "missing_required_parameter" if inp is None else "invalid_type")
    thought = None  # a reasoning item's text: the thinking of the assistant message or call that follows it
    for j, item in enumerate(inp):
        n = len(msgs)
        t = _input_item(item, "input" if whole else f"input[{j}]", msgs, where)
        if t is not None or (isinstance(item, dict) and item.get("type") == "reasoning"):
            thought = t if thought is None else thought if t is None else thought + "\n" + t
            continue
        joined = isinstance(item, dict) and item.get("type") == "function_call"  # (a call joins the turn before it)
        if thought is not None and (len(msgs) > n or joined) and msgs and msgs[-1].get("role") == "assistant":
            msgs[-1].setdefault("reasoning_content", thought)  # (as the chat endpoint's assistant message carries it)
        thought = None
    if not msgs:
        raise bad("'input' holds no message", "input")
    chat = {"messages": msgs}
    for key in ("model", "stream", "temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty", "user",
                "metadata", "store", "service_tier", "prompt_cache_key", "prompt_cache_retention",
                "prompt_cache_options",
                "safety_identifier", "parallel_tool_calls", "stream_options", "edgespec", "chat_template_kwargs"):
        if key in body:
            chat[key] = body[key]
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    if body.get("tools") is not None:
        chat["tools"] = _responses_tools(body["tools"])
    tc = body.get("tool_choice")
    if isinstance(tc, dict) and tc.get("type") == "function" and "function" not in tc:
        tc = {"type": "function", "function": {"name": tc.get("name")}}  # (the chat's shape of a named choice)
    if tc is not None:
        chat["tool_choice"] = tc
    fmt = _responses_text(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    try:
        req = parse_chat(chat, model_id)
    except APIError as e:  # the chat's field names as the Responses request has them
        e.param = responses_param(e.param, where)
        e.message = responses_message(e.message, where)
        raise
    for key in ("metadata", "user", "tool_choice", "tools", "text"):  # (what the response echoes as it was sent)
        _echoable(body.get(key), key)
    req.responses = {"instructions": instr, "max_output_tokens": body.get("max_output_tokens"),
                     "tools": body.get("tools") or [], "tool_choice": body.get("tool_choice") or "auto",
                     "parallel_tool_calls": body.get("parallel_tool_calls") is not False, "where": where,
                     "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
                     "metadata": body.get("metadata") or {}, "user": body.get("user")}
    return req


def _input_item(item, where: str, msgs: list[dict], origin: list[str]) -> str | None:
    """One ``input`` item as chat messages: a message, a function call (joined to the assistant message before it,
    as one turn's calls are) or a call's output (a 'tool' message). A reasoning item adds no message: its
    ``reasoning_text`` parts' text is returned (the thinking of the assistant turn that follows it, as this server
    gives it out); one without them (another model's summary or encrypted content) is left out."""
    if not isinstance(item, dict):
        raise bad(f"{where} must be an object (a message or an item), got {_kind(item)}", where, "invalid_type")
    t = item.get("type", "message")
    if t == "message":
        content = item.get("content")
        if isinstance(content, list):
            texts = []
            for k, part in enumerate(content):
                if not (isinstance(part, dict) and _is_text_part(part)):
                    what = part.get("type") if isinstance(part, dict) else _kind(part)
                    raise bad(f"{where}.content[{k}]: only text parts (input_text, output_text) are supported, got "
                              f"{what!r}", f"{where}.content", "unsupported_value")
                text = part.get("text", part.get("refusal"))
                if not isinstance(text, str):
                    raise bad(f"{where}.content[{k}].text must be a string, got {_kind(text)}", f"{where}.content",
                              "invalid_type")
                texts.append(text)
            content = "\n".join(texts)  # (as the chat endpoint joins text parts)
        if item.get("role") == "tool":  # (a chat role: it was refused for a tool_call_id named as call_id, a field a
            # message item does not have; a call's output is a function_call_output item)
            raise bad(f"{where}.role must be one of {', '.join(ROLES)}, got 'tool' (a call's output is a "
                      "function_call_output item)", f"{where}.role")
        msgs.append({"role": item.get("role"), "content": content})
        origin.append(where)
    elif t == "function_call":
        for key in ("call_id", "name", "arguments"):
            if not isinstance(item.get(key), str):
                raise bad(f"{where}.{key} must be a string, got {_kind(item.get(key))}", f"{where}.{key}",
                          "missing_required_parameter" if item.get(key) is None else "invalid_type")
            _text(item[key], f"{where}.{key}")  # (checked here: joined to a message before, its errors would not
            # name this item)
        call = {"id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]}}
        if msgs and msgs[-1].get("role") == "assistant":
            msgs[-1].setdefault("tool_calls", []).append(call)
        else:
            msgs.append({"role": "assistant", "content": None, "tool_calls": [call]})
            origin.append(where)
    elif t == "function_call_output":
        out = item.get("output")
        if isinstance(out, list):  # (text parts)
            texts = []
            for k, part in enumerate(out):
                if not (isinstance(part, dict) and _is_text_part(part) and isinstance(part.get("text"), str)):
                    raise bad(f"{where}.output[{k}]: only text parts with a string 'text' are supported",
                              f"{where}.output", "unsupported_value")
                texts.append(part["text"])
            out = "\n".join(texts)
        if not isinstance(item.get("call_id"), str):
            raise bad(f"{where}.call_id must be the call_id of the call this output answers", f"{where}.call_id",
                      "missing_required_parameter" if item.get("call_id") is None else "invalid_type")
        if not isinstance(out, str):
            raise bad(f"{where}.output must be a string, got {_kind(out)}", f"{where}.output", "invalid_type")
        _text(out, f"{where}.output")  # (here: as a message's content, its error named a field the item has not)
        msgs.append({"role": "tool", "tool_call_id": item["call_id"], "content": out})
        origin.append(where)
    elif t == "reasoning":
        parts = item.get("content")
        texts = [p["text"] for p in parts if isinstance(p, dict) and p.get("type") == "reasoning_text"
                 and isinstance(p.get("text"), str)] if isinstance(parts, list) else []
        if texts:
            _text("".join(texts), f"{where}.content")
        return "".join(texts) or None
    else:
        raise bad(f"{where}.type {t!r} is not supported by edgespec (messages, function_call and "
                  f"function_call_output items)"[:300], f"{where}.type", "unsupported_value")


def _is_text_part(part: dict) -> bool:
    return isinstance(part.get("type"), str) and part["type"] in _PART_TYPES


def _responses_tools(tools) -> list:
    """The Responses API's function tools (``{type, name, description, parameters, strict}``) in the chat's shape."""
    if not isinstance(tools, list):
        raise bad(f"'tools' must be an array, got {_kind(tools)}", "tools", "invalid_type")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") != "function":
            what = t.get("type") if isinstance(t, dict) else _kind(t)
            raise bad(f"tools[{i}]: only function tools are supported by edgespec, got {what!r}"[:300],
                      f"tools[{i}].type", "unsupported_value")
        if "function" in t:  # (a chat-shaped tool sent here)
            raise bad(f'tools[{i}]: a Responses tool is {{"type": "function", "name", "parameters", ...}} '
                      "(no 'function' object)", f"tools[{i}]", "invalid_value")
        out.append({"type": "function", "function": {k: v for k, v in t.items() if k != "type"}})
    return out


def _responses_text(text) -> dict | None:
    """``text.format`` as the chat's response_format (None: plain text)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise bad(f"'text' must be an object {{\"format\": ...}}, got {_kind(text)}", "text", "invalid_type")
    unknown = sorted(set(text) - {"format", "verbosity"})
    if unknown:
        raise bad(f"'text' takes 'format' (and 'verbosity'), got {unknown[0]!r}"[:200], "text", "unknown_parameter")
    if text.get("verbosity") not in (None, "medium"):  # (OpenAI's default: asks for nothing)
        raise bad("'text.verbosity' is not supported by edgespec", "text.verbosity", "unsupported_parameter")
    f = text.get("format")
    if f is None:
        return None
    if not isinstance(f, dict) or f.get("type") not in ("text", "json_object", "json_schema"):
        raise bad("'text.format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or {\"type\": "
                  "\"json_schema\", \"name\", \"schema\"}", "text.format")
    if f["type"] != "json_schema":
        return {"type": f["type"], **{k: v for k, v in f.items() if k != "type"}}
    return {"type": "json_schema", "json_schema": {k: v for k, v in f.items() if k != "type"}}


def responses_param(param: str | None, where: list[str] = ()) -> str | None:
    """A chat request's field name as a /v1/responses request has it (``where``: each chat message's item)."""
    if param is None:
        return None
    m = re.match(r"messages\[(\d+)\]", param)
    if m and int(m.group(1)) < len(where):
        origin = where[int(m.group(1))]
        if origin in ("instructions", "input"):
            return origin
        param = origin + param[m.end():]
    if param == "messages":
        return "input"
    param = re.sub(r"^(input\[\d+\])\.tool_call_id$", r"\1.call_id", param)  # (a function_call_output's id)
    param = re.sub(r"^tools\[(\d+)\]\.function\b", r"tools[\1]", param)  # (a Responses tool has no 'function')
    return {"max_tokens": "max_output_tokens", "response_format": "text.format"}.get(param, param)


def responses_message(message: str, where: list[str] = ()) -> str:
    """A chat-shaped error message with the Responses request's field names."""
    message = re.sub(r"messages\[(\d+)\]", lambda m: where[int(m.group(1))] if int(m.group(1)) < len(where)
                     else m.group(0), message)
    # a string's message: instructions, or the whole input, is the content itself
    message = re.sub(r"\b(instructions|input)\.content\b(?!\[)", r"\1", message)
    message = re.sub(r"\b(input\[\d+\])\.tool_call_id\b", r"\1.call_id", message)
    message = re.sub(r"\btools\[(\d+)\]\.function\.", r"tools[\1].", message)  # (a Responses tool has no 'function')
    message = re.sub(r"\bresponse_format\.json_schema\.", "text.format.", message)
    message = re.sub(r"\bresponse_format\.json_schema\b", "text.format", message)
    message = re.sub(r"\bresponse_format\b", "text.format", message)
    # (a Responses request names a function as {"type": "function", "name": ...}, and has no 'tool' messages)
    message = message.replace('{"type": "function", "function": {"name": ...}}', '{"type": "function", "name": ...}')
    message = re.sub(r"(\.role must be one of [^,]+(?:, [^,]+)*?), tool, got", r"\1, got", message)
    return message.replace("'max_tokens'", "'max_output_tokens'")


def _prediction(v) -> str | None:
    """OpenAI's predicted output, ``{"type": "content", "content": text or [text parts]}``: the text
    (parts joined as they are); the engine drafts from it (prediction.py), the reply does not depend on it."""
    if v is None:
        return None
    if not isinstance(v, dict):
        raise bad(f"'prediction' must be an object {{\"type\": \"content\", \"content\": ...}}, got {_kind(v)}",
                  "prediction", "invalid_type")
    unknown = sorted(set(v) - {"type", "content"})
    if unknown:
        raise bad(f"'prediction' takes 'type' and 'content' only, got {unknown[0]!r}", "prediction")
    if v.get("type") != "content":
        raise bad(f"'prediction.type' must be \"content\", got {v.get('type')!r}", "prediction.type")
    content = v.get("content")
    if isinstance(content, list):
        content = "".join(_text_parts(content, "prediction.content"))
    if not isinstance(content, str):
        raise bad(f"'prediction.content' must be a string or an array of text parts, got {_kind(content)}",
                  "prediction.content", "missing_required_parameter" if content is None else "invalid_type")
    return _text(content, "prediction.content")


def _text_parts(content: list, where: str, refusal: bool = False) -> list[str]:
    """The texts of an array of content parts, each ``{"type": "text", "text": ...}`` (400 otherwise); with
    ``refusal`` (an assistant's message) ``{"type": "refusal", "refusal": ...}`` too: what it said, as OpenAI's
    replies give it and clients send the history back (it was a 400; session 64, a review)."""
    parts = []
    for j, p in enumerate(content):
        if refusal and isinstance(p, dict) and p.get("type") == "refusal":
            if not isinstance(p.get("refusal"), str):
                raise bad(f"{where}[{j}].refusal must be a string, got {_kind(p.get('refusal'))}", where)
            parts.append(p["refusal"])
            continue
        if isinstance(p, dict) and p.get("type") == "text" and not isinstance(p.get("text"), str):
            raise bad(f"{where}[{j}].text must be a string, got {_kind(p.get('text'))}", where)
        if not (isinstance(p, dict) and p.get("type") == "text"):
            what = p.get("type") if isinstance(p, dict) else _kind(p)
            raise bad(f"{where}[{j}]: only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported, got "
                      f"{what!r}", where)
        parts.append(p["text"])
    return parts


def _message(m, i: int) -> dict:
    """A clean message: ``{role, content}`` with content as plain text, and for tool calling an
    assistant's ``tool_calls`` (``{id, type, function: {name, arguments}}``) and a tool result's
    ``tool_call_id``. Only these keys reach the template, and content is a value to it, never
    template source."""
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad(f"{where} must be an object with 'role' and 'content', got {_kind(m)}", where, "invalid_type")
    role = m.get("role")
    if not isinstance(role, str) or role not in ROLES and role != "tool":
        if role == "function":
            raise bad(f"{where}: role 'function' (OpenAI's deprecated function calling) is not supported by "
                      "edgespec; use tools and 'tool' messages", f"{where}.role", "unsupported_value")
        raise bad(f"{where}.role must be one of {', '.join(ROLES)}, tool, got {role!r}", f"{where}.role")
    calls = m.get("tool_calls")
    if calls is not None and role != "assistant":
        raise bad(f"{where}: only assistant messages carry 'tool_calls'", f"{where}.tool_calls")
    content = m.get("content")
    if isinstance(content, list):
        content = "\n".join(_text_parts(content, f"{where}.content", refusal=role == "assistant"))
    if content is None and calls:
        content = ""  # an assistant's message that is only calls
    if not isinstance(content, str):
        raise bad(f"{where}.content must be a string or an array of text parts, got {_kind(content)}",
                  f"{where}.content", "invalid_type")
    _text(content, f"{where}.content")
    out = {"role": ROLES.get(role, role), "content": content}
    rc = m.get("reasoning_content")
    if rc is not None and role == "assistant":  # a thinking model's block given back (Qwen3's template renders it)
        if not isinstance(rc, str):
            raise bad(f"{where}.reasoning_content must be a string, got {_kind(rc)}", f"{where}.reasoning_content",
                      "invalid_type")
        out["reasoning_content"] = _text(rc, f"{where}.reasoning_content")
    if role == "tool":
        tid = m.get("tool_call_id")
        if not isinstance(tid, str):
            raise bad(f"{where}.tool_call_id must be the id of the call this message answers", f"{where}.tool_call_id",
                      "missing_required_parameter" if tid is None else "invalid_type")
        out["tool_call_id"] = _text(tid, f"{where}.tool_call_id")
    if calls:
        if not isinstance(calls, list):
            raise bad(f"{where}.tool_calls must be an array, got {_kind(calls)}", f"{where}.tool_calls", "invalid_type")
        out["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
    return out


def _tool_call(c, where: str) -> dict:
    f = c.get("function") if isinstance(c, dict) else None
    if not (isinstance(f, dict) and isinstance(f.get("name"), str) and isinstance(f.get("arguments", ""), str)
            and c.get("type", "function") == "function" and isinstance(c.get("id", ""), str)):
        raise bad(f"{where} must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\": ..., \"arguments\": "
                  "a JSON string}}", where, "invalid_type")
    return {"id": _text(c.get("id", ""), f"{where}.id"), "type": "function",
            "function": {"name": _text(f["name"], f"{where}.function.name"),
                         "arguments": _text(f.get("arguments", ""), f"{where}.function.arguments")}}


def parse_completion(body: dict, model_id: str) -> GenRequest:
    req = _common(body, "completion", model_id)
    p = body.get("prompt")

    def ids_(v) -> bool:
        return isinstance(v, list) and bool(v) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)

    if isinstance(p, str) or ids_(p):
        p = [p]
    if not (isinstance(p, list) and p and all(isinstance(x, str) or ids_(x) for x in p)):
        missing = p is None
        raise bad("'prompt' must be a string, an array of token ids, or an array of either (prompts answered in "
                  "turn)" + (" (it is missing)" if missing else ""),
                  "prompt", "missing_required_parameter" if missing else "invalid_type")
    if len(p) > MAX_PROMPTS:
        raise bad(f"'prompt' holds at most {MAX_PROMPTS} prompts, got {len(p)}", "prompt")
    # text, or token ids (OpenAI's legacy form; evaluation harnesses send them); the first kept as ``prompt``
    req.prompts = [_text(x, "prompt") if isinstance(x, str) else list(x) for x in p]
    if isinstance(req.prompts[0], str):
        req.prompt = req.prompts[0]
    else:
        req.prompt_ids = req.prompts[0]
    if len(req.prompts) * req.n > MAX_N:
        raise bad(f"prompts x n is at most {MAX_N} choices a request, got {len(req.prompts)} x {req.n}", "n")
    req.echo = _bool(body, "echo")
    if req.token_healing and req.response_format is not None:
        raise bad("'edgespec.token_healing' cannot be combined with a response_format (its grammar holds the reply)",
                  "edgespec.token_healing")
    if req.echo and req.token_healing:
        raise bad("'echo' cannot be used with 'edgespec.token_healing' (the prompt's last token is backed off)", "echo")
    sfx = body.get("suffix")
    if sfx is not None and not isinstance(sfx, str):
        raise bad(f"'suffix' must be a string, got {_kind(sfx)}", "suffix")
    if sfx:  # fill in the middle: the reply goes between the prompt and the suffix (the server checks the model)
        if req.echo:
            raise bad("'echo' cannot be used with 'suffix' (fill in the middle)", "echo")
        if any(not isinstance(x, str) for x in req.prompts):
            raise bad("'suffix' needs the prompt as text, not token ids", "suffix")
        req.suffix = _text(sfx, "suffix")
    return req


@dataclass
class TokenizeRequest:
    """``/tokenize``: vLLM's ``prompt`` or ``messages`` (through the chat template), or llama.cpp's ``content``."""
    text: str | None = None
    messages: list[dict] | None = None
    add_special: bool = True
    add_generation_prompt: bool = True
    with_pieces: bool = False
    template_kwargs: dict | None = None  # messages: chat_template_kwargs, as a chat request's (vLLM's /tokenize too)


_TOKENIZE_KEYS = {"model", "prompt", "content", "messages", "add_special_tokens", "add_special",
                  "add_generation_prompt", "with_pieces", "chat_template_kwargs"}


def _model_is(body: dict, model_id: str) -> None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad(f"'model' must be a string, got {_kind(model)}", "model")
    if model is not None and model != model_id:
        raise APIError(404, f"the model '{model}' does not exist; this server serves '{model_id}' (GET /v1/models)",
                       param="model", code="model_not_found")


def parse_tokenize(body: dict, model_id: str) -> TokenizeRequest:
    _known(body, _TOKENIZE_KEYS, "/tokenize")
    _model_is(body, model_id)
    given = [k for k in ("prompt", "content", "messages") if body.get(k) is not None]
    if len(given) != 1:
        raise bad("send one of 'prompt' or 'content' (text) or 'messages' (a chat)", "prompt",
                  "missing_required_parameter" if not given else "invalid_value")
    req = TokenizeRequest(with_pieces=_bool(body, "with_pieces"),
                          add_generation_prompt=body.get("add_generation_prompt", True) is not False)
    if body.get("add_generation_prompt") is not None:
        _bool(body, "add_generation_prompt")
    special = [k for k in ("add_special_tokens", "add_special") if body.get(k) is not None]
    if len(special) == 2 and _bool(body, special[0]) != _bool(body, special[1]):
        raise bad("'add_special_tokens' and 'add_special' differ; send one of them", "add_special_tokens")
    req.add_special = _bool(body, special[0]) if special else True
    if given[0] == "messages":
        msgs = body["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise bad("'messages' must be a non-empty array of {role, content} objects", "messages")
        req.messages = [_message(m, i) for i, m in enumerate(msgs)]
        req.template_kwargs = _template_kwargs(body)
    elif body.get("chat_template_kwargs") is not None:
        raise bad("'chat_template_kwargs' go with 'messages' (a chat), not a text", "chat_template_kwargs")
    else:
        v = body[given[0]]
        if not isinstance(v, str):
            raise bad(f"'{given[0]}' must be a string, got {_kind(v)}", given[0])
        req.text = _text(v, given[0])
    return req


def parse_detokenize(body: dict, model_id: str) -> list[int]:
    _known(body, {"model", "tokens"}, "/detokenize")
    _model_is(body, model_id)
    toks = body.get("tokens")
    if not isinstance(toks, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in toks):
        raise bad("'tokens' must be an array of token ids", "tokens",
                  "missing_required_parameter" if toks is None else "invalid_type")
    return toks


# -- responses ----------------------------------------------------------------------------------
def stats_summary(st) -> dict:
    """The per-request speculative statistics, read by name from the engine's live ``Stats``."""
    def g(name, default=0):
        return getattr(st, name, default) if st is not None else default

    return {"prompt_tokens": g("prompt_tokens"), "reused_prompt_tokens": g("reused_prompt_tokens"),
            "restored_prompt_tokens": g("restored_prompt_tokens"), "new_tokens": g("new_tokens"), "drafted_tokens": g("drafted"), "accepted_tokens": g("accepted"),
            "target_calls": g("target_calls"), "acceptance_rate": round(float(g("acceptance_rate", 0.0)), 4),
            "tokens_per_target_call": round(float(g("tokens_per_target_call", 0.0)), 4),
            "rounds_by_drafter": dict(g("rounds_by_drafter", {}) or {}), "ttft_ms": round(float(g("ttft_ms", 0.0)), 3),
            "tokens_per_second": round(float(g("tokens_per_second", 0.0)), 3), "finish_reason": g("finish_reason", None),
            "completion_tokens": g("new_tokens"),  # the server sets the returned text's count
            # token healing's re-spelled text (the Python API's stats["healed"]; session 65, a review): where it healed
            **({"healed": g("healed", "")} if g("healed", "") else {})}


def engine_error(e: BaseException, grammar_param: str | None = None) -> APIError:
    """An engine error met during a generation, as the client sees it (one line, no traceback); ``grammar_param``: the
    field a grammar's error names (the request's response_format or strict tools)."""
    if isinstance(e, APIError):
        return e
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    if isinstance(e, ContextOverflowError):
        return APIError(400, msg, code="context_length_exceeded")
    if isinstance(e, ConfigError):
        grammar = msg.startswith(("the reply's grammar", "the structured output's grammar"))
        return APIError(400, msg, param=grammar_param if grammar else None, code="invalid_value")
    if isinstance(e, BusyError):
        return APIError(503, msg, type="server_error", code="busy")
    if isinstance(e, EdgespecError):
        return APIError(500, msg, type="server_error", code=type(e).__name__)
    return APIError(500, f"the generation failed ({type(e).__name__}: {msg}); see the server log",
                    type="server_error", code="internal_error")


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def finish_reason(engine_reason: str | None, calls: bool = False) -> str | None:
    """OpenAI's finish reasons: 'stop' (end of sequence or a stop string), 'tool_calls' (so, with
    calls in the reply), 'length' (max_tokens or a full context). The engine's own reason is kept in
    ``edgespec.finish_reason``."""
    if engine_reason is None:
        return None
    return ("tool_calls" if calls else "stop") if engine_reason in ("eos", "stop") else "length"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int, prediction: dict | None = None,
          reasoning: int | None = None) -> dict:
    """OpenAI's usage object; ``prediction``: the request had a predicted output, and this summary of its
    generation says how many of the prediction's tokens appeared in the reply returned and how many did
    not (``completion_tokens_details``; the server counts them, prediction.prediction_usage)."""
    out = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens,
           "prompt_tokens_details": {"cached_tokens": cached_tokens}}
    if prediction is not None:
        out["completion_tokens_details"] = {k: prediction.get(k, 0) for k in
                                            ("accepted_prediction_tokens", "rejected_prediction_tokens")}
    if reasoning is not None:  # a thinking model's block (its tokens, tags included), as OpenAI counts reasoning
        out.setdefault("completion_tokens_details", {})["reasoning_tokens"] = reasoning
    return out


def json_logprob(v: float | None) -> float | None:
    """A logprob JSON can carry: -inf (a token the model gave no chance) is OpenAI's -9999.0; None (an echoed
    prompt's first token: nothing comes before it) and NaN (broken logits, not to be hidden) are null."""
    if v is None or math.isnan(v):
        return None
    return v if math.isfinite(v) else -9999.0


def logprobs_body(kind: str, entries: list[dict] | None) -> dict | None:
    """The ``logprobs`` of a choice or chunk from the engine's entries (``Engine.logprob_entry``): chat's
    ``{content: [{token, logprob, bytes, top_logprobs}], refusal}``; the legacy completions' ``{tokens,
    token_logprobs, top_logprobs: [{token: logprob}] (the most likely and the chosen one), text_offset}``."""
    if entries is None:
        return None
    lp = json_logprob
    if kind == "chat":
        return {"content": [{"token": e["token"], "logprob": lp(e["logprob"]), "bytes": e["bytes"],
                             "top_logprobs": [{"token": t["token"], "logprob": lp(t["logprob"]), "bytes": t["bytes"]}
                                              for t in e["top_logprobs"]]} for e in entries], "refusal": None}
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [lp(e["logprob"]) for e in entries],
            "top_logprobs": [None if e["logprob"] is None else
                             {**{t["token"]: lp(t["logprob"]) for t in e["top_logprobs"]}, e["token"]: lp(e["logprob"])}
                             for e in entries],
            "text_offset": [e["offset"] for e in entries]}


def chat_response(rid: str, model: str, created: int, text: str, reason: str | None, use: dict, ext: dict,
                  tool_calls: list[dict] | None = None, logprobs: list[dict] | None = None,
                  reasoning: str | None = None) -> dict:
    """``tool_calls``: the request had tools (OpenAI's shape, each call's id, type and function); with calls
    the message's content is null when the reply had nothing else. ``reasoning``: a thinking model's block
    (reasoning.py), as llama.cpp's and vLLM's servers give it (``reasoning_content``)."""
    message = {"role": "assistant", "content": text, "refusal": None}
    if reasoning:  # (an empty block: no field, as streamed and as llama.cpp's)
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["content"] = text or None
        message["tool_calls"] = tool_calls
    return {"id": rid, "object": "chat.completion", "created": created, "model": model, "system_fingerprint": None,
            "choices": [{"index": 0, "message": message, "logprobs": logprobs_body("chat", logprobs),
                         "finish_reason": finish_reason(reason, bool(tool_calls))}],
            "usage": use, "edgespec": ext}


def completion_response(rid: str, model: str, created: int, text: str, reason: str | None, use: dict,
                        ext: dict, logprobs: list[dict] | None = None) -> dict:
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "system_fingerprint": None,
            "choices": [{"index": 0, "text": text, "logprobs": logprobs_body("completion", logprobs),
                         "finish_reason": finish_reason(reason)}],
            "usage": use, "edgespec": ext}


def chunk(kind: str, rid: str, model: str, created: int, *, text: str | None = None, role: bool = False,
          reason: str | None = None, use: dict | None = None, ext: dict | None = None, empty: bool = False,
          with_usage: bool = False, tool_call: dict | None = None, calls: bool = False,
          logprobs: list[dict] | None = None, index: int = 0, reasoning: str | None = None) -> dict:
    """One streamed chunk. ``empty``: the usage-only chunk (no choices) sent last with include_usage;
    ``with_usage``: include_usage was asked for, so every other chunk says ``"usage": null`` (as OpenAI's);
    ``tool_call``: a whole call, with its index (``ToolCall.openai(i)``); ``calls``: the reply made calls
    (its finish reason is 'tool_calls'); ``logprobs``: the engine's entries of the chunk's tokens."""
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    out = {"id": rid, "object": obj, "created": created, "model": model, "system_fingerprint": None}
    if empty:
        out["choices"] = []
    elif kind == "chat":
        delta = {}
        if role:
            delta["role"] = "assistant"
        if reasoning is not None:  # (a thinking model's block: reasoning.py)
            delta["reasoning_content"] = reasoning
        if text is not None:
            delta["content"] = text
        if tool_call is not None:
            delta["tool_calls"] = [tool_call]
        out["choices"] = [{"index": index, "delta": delta, "logprobs": logprobs_body(kind, logprobs),
                           "finish_reason": finish_reason(reason, calls)}]
    else:
        out["choices"] = [{"index": index, "text": text or "", "logprobs": logprobs_body(kind, logprobs),
                           "finish_reason": finish_reason(reason)}]
    if use is not None or with_usage:
        out["usage"] = use
    if ext is not None:
        out["edgespec"] = ext
    return out


def response_id() -> str:
    return "resp_" + uuid.uuid4().hex


def item_id(kind: str) -> str:
    return f"{kind}_" + uuid.uuid4().hex[:24]


def response_usage(use: dict) -> dict:
    """The chat usage object as the Responses API counts: input and output tokens."""
    return {"input_tokens": use["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": use["prompt_tokens_details"]["cached_tokens"]},
            "output_tokens": use["completion_tokens"], "output_tokens_details": {
                "reasoning_tokens": (use.get("completion_tokens_details") or {}).get("reasoning_tokens", 0)},
            "total_tokens": use["total_tokens"]}


def message_item(mid: str, text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": mid, "status": status, "role": "assistant",
            "content": [] if text is None else [{"type": "output_text", "text": text, "annotations": [],
                                                 "logprobs": []}]}


def reasoning_item(rid: str, text: str | None, status: str = "completed") -> dict:
    """A thinking model's block (reasoning.py) as a Responses ``reasoning`` item, its text as OpenAI's open-weight
    models give it (``content``: one ``reasoning_text`` part; no summary)."""
    return {"type": "reasoning", "id": rid, "summary": [], "status": status,
            "content": [] if text is None else [{"type": "reasoning_text", "text": text}]}


def call_item(call: dict, fid: str, status: str = "completed") -> dict:
    """A chat tool call (``ToolCall.openai()``) as a Responses ``function_call`` item."""
    return {"type": "function_call", "id": fid, "call_id": call["id"], "name": call["function"]["name"],
            "arguments": call["function"]["arguments"], "status": status}


def response_status(engine_reason: str | None) -> str:
    """'incomplete' where the reply was cut (max_output_tokens or a full context), else 'completed'."""
    return "incomplete" if engine_reason not in (None, "eos", "stop") else "completed"


def response_object(rid: str, model: str, created: int, req: GenRequest, *, output: list[dict],
                    engine_reason: str | None = None, use: dict | None = None, ext: dict | None = None,
                    status: str | None = None) -> dict:
    """The Responses API's response object; ``status`` from the engine's reason unless given: 'incomplete'
    (max_output_tokens or a full context) or 'completed'."""
    r = req.responses or {}
    if status is None:
        status = response_status(engine_reason)
    out = {"id": rid, "object": "response", "created_at": created, "status": status, "error": None,
           "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
           "instructions": r.get("instructions"), "max_output_tokens": r.get("max_output_tokens"), "model": model,
           "output": output, "parallel_tool_calls": r.get("parallel_tool_calls", True),
           "previous_response_id": None, "reasoning": {"effort": None, "summary": None}, "store": False,
           "temperature": (ext or {}).get("temperature", req.options.get("temperature")),
           "text": r.get("text", {"format": {"type": "text"}}), "tool_choice": r.get("tool_choice", "auto"),
           "tools": r.get("tools", []), "top_p": (ext or {}).get("top_p", req.options.get("top_p", 1.0)),
           "truncation": "disabled",
           "usage": response_usage(use) if use is not None else None, "user": r.get("user"),
           "metadata": r.get("metadata", {})}
    if ext is not None:
        out["edgespec"] = ext
    return out


def sse_event(kind: str, obj: dict) -> bytes:
    """One Responses stream event: ``event: <type>`` then its data (the object, its ``type`` included)."""
    return (f"event: {kind}\n".encode() + b"data: " + json.dumps({"type": kind, **obj}, ensure_ascii=False,
                                                                  separators=(",", ":")).encode() + b"\n\n")


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def now() -> int:
    return int(time.time())
