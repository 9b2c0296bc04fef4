"""Tool calls (OpenAI's function calling) for chat templates that write them in the ``<tool_call>``
format: Qwen2.5 (Coder and Instruct), Hermes 2 and 3, and the models trained on their template.

- The chat template gets the tools (its ``tools`` variable) and renders the conversation's earlier
  calls (an assistant message's ``tool_calls``, their arguments as JSON objects) and results (``tool``
  messages).
- The model writes a call as ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``.
  ``ToolCallParser`` takes the calls out of the reply's text, streamed or whole, and leaves the rest
  as its content. A block that is not a call (not JSON, no name) stays in the content, as written:
  nothing is lost.
- ``tool_choice`` ``"required"`` or a named function holds the whole reply to calls (a grammar,
  constrain.tool_call_grammar, with llguidance); without llguidance it starts the reply with the call's
  opening (a prefix forced after the generation prompt) and nothing constrains the rest. A function
  with ``strict: true`` has its arguments held to its parameters: in a forced call, and in ``auto``
  inside every ``<tool_call>`` block the model opens (constrain.LazyConstraint). ``"none"`` renders the
  conversation without the tools (the model is not told of them).
- ``parallel_tool_calls: false`` keeps the first call and ends the generation at its ``</tool_call>`` (a
  thinking model's at its end of sequence: the tag may stand in its thinking).

Speculative decoding does not change any of this: the reply is the target's, token for token
(greedy) or in distribution (sampled), whatever drafted it.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from .errors import ConfigError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
MAX_TOOLS = 128
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's (and a json_schema's) name
_FUNCTION_KEYS = {"name", "description", "parameters", "strict"}


def template_takes_tools(source: str | None) -> bool:
    """Whether a chat template renders tools and writes calls in the ``<tool_call>`` format."""
    return bool(source) and OPEN in source and re.search(r"\btools\b", source) is not None


def check_tools(tools) -> list[dict]:
    """OpenAI's ``tools``: a list of ``{"type": "function", "function": {"name", "description"?,
    "parameters"?, "strict"?}}``, names unique. Returns clean copies; ``ConfigError`` otherwise."""
    if not isinstance(tools, (list, tuple)):
        raise ConfigError(f"tools must be a list of {{type: function, function: {{name, ...}}}} objects, "
                          f"got {type(tools).__name__}")
    if len(tools) > MAX_TOOLS:
        raise ConfigError(f"tools holds at most {MAX_TOOLS} functions, got {len(tools)}")
    out, seen = [], set()
    for i, t in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
            raise ConfigError(f"{where} must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
        extra = sorted(set(t) - {"type", "function"})
        if extra:
            raise ConfigError(f"{where} has an unknown field {extra[0]!r} (it takes type and function)")
        f = t["function"]
        extra = sorted(set(f) - _FUNCTION_KEYS)
        if extra:
            raise ConfigError(f"{where}.function has an unknown field {extra[0]!r} "
                              f"(it takes {', '.join(sorted(_FUNCTION_KEYS))})")
        name = f.get("name")
        if name is None:
            raise ConfigError(f"{where}.function.name is missing (1-64 letters, digits, _ or -)")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ConfigError(f"{where}.function.name must be 1-64 letters, digits, _ or -, got "
                              f"{json.dumps(name)[:100]}")
        if name in seen:
            raise ConfigError(f"{where}.function.name {name!r} is given twice")
        seen.add(name)
        clean = {"name": name}
        if f.get("description") is not None:
            if not isinstance(f["description"], str):
                raise ConfigError(f"{where}.function.description must be a string")
            check_unicode(f["description"], f"{where}.function.description")
            clean["description"] = f["description"]
        if f.get("parameters") is not None:
            if not isinstance(f["parameters"], dict):
                raise ConfigError(f"{where}.function.parameters must be a JSON Schema object")
            try:
                check_unicode(json.dumps(f["parameters"], allow_nan=False, ensure_ascii=False),
                              f"{where}.function.parameters")
            except (TypeError, ValueError, RecursionError):
                raise ConfigError(f"{where}.function.parameters is not JSON (or nested too deeply)") from None
            from .constrain import check_schema_numbers

            check_schema_numbers(f["parameters"], f"{where}.function.parameters")
            if f["parameters"].get("type", "object") != "object":  # (OpenAI's rule: a call's arguments are an object)
                raise ConfigError(f"{where}.function.parameters must be a schema of \"type\": \"object\" (a call's "
                                  f"arguments are a JSON object), got \"type\": "
                                  f"{json.dumps(f['parameters']['type'], ensure_ascii=False)[:80]}")
            clean["parameters"] = f["parameters"]
        if f.get("strict") is not None:
            if not isinstance(f["strict"], bool):
                raise ConfigError(f"{where}.function.strict must be true or false")
            if f["strict"]:  # its arguments held to its parameters (constrain.tool_call_grammar)
                clean["strict"] = True
        out.append({"type": "function", "function": clean})
    return out


def check_unicode(text: str, where: str) -> None:
    """``text`` written into the chat's template (a tool's, a template variable's): valid Unicode, else a
    ``ConfigError`` (a JSON escape can carry a lone surrogate, which the tokenizer cannot read)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{where} holds an unpaired UTF-16 surrogate (a broken \\uD800-\\uDFFF escape)") from None


def check_tool_choice(choice, names: list[str]):
    """``"auto"``, ``"none"``, ``"required"`` or ``{"type": "function", "function": {"name": N}}`` (N one
    of the tools): returns the string or N's dict form; ``ConfigError`` otherwise."""
    if choice is None:
        return "auto"
    if choice in ("auto", "none", "required"):
        if choice == "required" and not names:
            raise ConfigError("tool_choice 'required' needs tools")
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if not isinstance(name, str):
            raise ConfigError("tool_choice names no function: its name is missing" if name is None else
                              f"tool_choice's function name must be a string, got {json.dumps(name)[:100]}")
        if name not in names:
            raise ConfigError(f"tool_choice names the function {name!r}, which is not among the tools"[:200])
        return {"name": name}
    raise ConfigError("tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", "
                      "\"function\": {\"name\": ...}}")


def check_tool_messages(messages) -> list[dict]:
    """The conversation with each assistant message's ``tool_calls`` (OpenAI's shape, arguments as a
    JSON string) in the shape chat templates take (arguments as the JSON object they hold) and its
    content ``""`` when absent; a ``tool`` message keeps ``tool_call_id`` and ``name``. Other
    messages are returned as they are. ``ConfigError`` on a malformed call."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not (m.get("tool_calls") or m.get("role") == "tool"):
            out.append(m)
            continue
        if m.get("role") == "tool":
            keep = {"role": "tool", "content": m.get("content")}
            for key in ("tool_call_id", "name"):
                if m.get(key) is not None:
                    if not isinstance(m[key], str):
                        raise ConfigError(f"message {i}'s {key} must be a string")
                    keep[key] = m[key]
            out.append(keep)
            continue
        if m.get("role") != "assistant":
            raise ConfigError(f"message {i}: only assistant messages carry tool_calls")
        calls = m["tool_calls"]
        if not isinstance(calls, (list, tuple)):
            raise ConfigError(f"message {i}'s tool_calls must be a list")
        conv = []
        for j, c in enumerate(calls):
            where = f"message {i}'s tool_calls[{j}]"
            f = c.get("function") if isinstance(c, dict) else None
            if not isinstance(f, dict) or not isinstance(f.get("name"), str):
                raise ConfigError(f"{where} must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                                  "\"arguments\"}}")
            args = f.get("arguments", "{}")
            if isinstance(args, str):
                try:
                    args = json.loads(args) if args.strip() else {}
                except ValueError:
                    pass  # not JSON: the template gets the string as it is
                except RecursionError:
                    raise ConfigError(f"{where}.function.arguments is nested too deeply") from None
            elif not isinstance(args, dict):
                raise ConfigError(f"{where}.function.arguments must be a JSON string")
            # (a JSON escape in the arguments' text can be a lone surrogate, which the tokenizer cannot read: checked
            # as the template gets them, where it was a TypeError, the server's 500)
            check_unicode(f["name"], f"{where}.function.name")
            try:
                text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            except (TypeError, ValueError, RecursionError):  # (not JSON: the template's error, as before)
                text = ""
            check_unicode(text, f"{where}.function.arguments")
            call = {"type": "function", "function": {"name": f["name"], "arguments": args}}
            if isinstance(c.get("id"), str):
                check_unicode(c["id"], f"{where}.id")
                call["id"] = c["id"]
            conv.append(call)
        content = m.get("content")
        out.append({**m, "content": "" if content is None else content, "tool_calls": conv})
    return out


@dataclass
class ToolCall:
    name: str
    arguments: str  # a JSON text, as OpenAI gives it
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:24])

    def openai(self, index: int | None = None) -> dict:
        d = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return d if index is None else {"index": index, **d}


def _not_json(constant: str):
    raise ValueError(f"{constant} is not JSON")


def _finite(text: str) -> float:
    v = float(text)
    if v in (float("inf"), float("-inf")):  # (1e999: a client's parser makes it infinity, written back as Infinity)
        raise ValueError(f"{text} is past a double's range")
    return v


# JSON as RFC 8259 has it: no NaN, Infinity, -Infinity, nor a number no double holds (in arguments given as text too)
_STRICT = json.JSONDecoder(parse_constant=_not_json, parse_float=_finite)


def _as_calls(body: str, names: frozenset | None, whole: bool = True) -> tuple[list[ToolCall], str] | None:
    """A block's JSON, a call ``{"name": ..., "arguments": {...}}`` or a list of them, as ``ToolCall``s,
    and the text after it (only whitespace if ``whole``); None if it is not that (or, with ``names``,
    names a function not among them)."""
    body = body.lstrip()
    try:  # (JSON's own: NaN and Infinity, which Python's json takes, are no call; JSON.parse refuses them)
        obj, end = _STRICT.raw_decode(body)
    except (ValueError, RecursionError):  # (nested past Python's recursion limit: not a call)
        return None
    rest = body[end:]
    if whole and rest.strip():
        return None
    calls = []
    for c in obj if isinstance(obj, list) and obj else [obj]:
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not c["name"]:
            return None
        if names is not None and c["name"] not in names:
            return None
        args = c.get("arguments", c.get("parameters", {}))
        if isinstance(args, str):
            try:
                _STRICT.decode(args)
            except (ValueError, RecursionError):
                return None
        elif isinstance(args, dict):
            try:  # (1e999 is a float's infinity here: written back as Infinity, no JSON)
                args = json.dumps(args, ensure_ascii=False, allow_nan=False)
            except ValueError:
                return None
            if not _utf8(args):  # (a lone surrogate the model escaped, "\ud83d": no UTF-8 response holds it)
                args = json.dumps(json.loads(args))
        else:
            return None
        if not _utf8(c["name"]):
            return None
        calls.append(ToolCall(c["name"], args))
    return calls, rest


def _utf8(text: str) -> bool:
    """Whether ``text`` has a UTF-8 form (no lone surrogate)."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


# where a call starts, where it ends, and whether it must name one of the tools: the template's own
# format, and the fenced JSON block that Qwen2.5-Coder writes instead
_BLOCKS = ((OPEN, CLOSE, False), ("```json\n", "```", True), ("```\n", "```", True))


def _call_shaped(text: str, names: frozenset) -> bool | None:
    """Whether a reply's start can be a bare call of one of ``names``, ``{"name": "<one of them>"`` (or ``{{...``,
    the form Qwen2.5-Coder's own template shows in its tool instructions) after whitespace: True, False, or None while
    too little is written to say."""
    t = text.lstrip()
    if not t:
        return None
    if t[0] != "{":
        return False
    t = t[1:]
    if t[:1] == "{":
        t = t[1:]
    t = t.lstrip()
    key = '"name"'
    if len(t) < len(key):
        return None if key.startswith(t) else False
    if not t.startswith(key):
        return False
    t = t[len(key):].lstrip()
    if not t:
        return None
    if t[0] != ":":
        return False
    t = t[1:].lstrip()
    if not t:
        return None
    if t[0] != '"':
        return False
    t = t[1:]
    end = t.find('"')  # (a tool's name has no quote nor escape: NAME)
    if end >= 0:
        return t[:end] in names
    return None if any(n.startswith(t) for n in names) else False


# a bare call's keys: its name and its arguments (not "parameters", which fenced calls may use for them: a tool's
# definition echoed has them, its schema)
_BARE_KEYS = frozenset({"name", "arguments"})


def _bare_calls(text: str, names: frozenset) -> list[ToolCall] | None:
    """A whole reply that is nothing but one call of one of the tools, written without a block: a JSON object of
    its ``name`` and ``arguments`` and nothing else (an object with more keys, a tool's definition the model
    echoed, is no call), or the template's doubled braces around it; None otherwise."""
    t = text.strip()
    for body in (t, t[1:-1] if t.startswith("{{") and t.endswith("}}") else None):
        if not body:
            continue
        try:
            obj = _STRICT.decode(body)
        except (ValueError, RecursionError):
            continue
        if not isinstance(obj, dict) or set(obj) != _BARE_KEYS:
            continue
        found = _as_calls(body, names)
        if found is not None:
            return found[0]
    return None


class ToolCallParser:
    """Takes calls out of a reply fed in pieces: ``<tool_call>`` blocks, fenced JSON blocks
    (```json) that hold nothing but a call of one of the tools (``names``; Qwen2.5-Coder writes its
    calls so), and a reply that is nothing but such a call, written bare (``_bare_calls``). ``feed(text)``
    and ``finish()`` return events, ``("content", text)`` or ``("call", ToolCall)``, in the reply's order:
    content is given out as soon as it cannot be the start of a call (a fenced block is held until its first
    character shows it is not JSON, or until it closes; a reply's start while it can be a bare call).
    Whitespace around calls is left out (whitespace alone, with calls, is no content). ``limit``: calls
    past it are dropped."""

    def __init__(self, names=None, limit: int | None = None, bare=None):
        self.names = frozenset(names) if names is not None else None
        # the tools a bare call may name (``_bare_calls``; default ``names``; none: no bare call is read)
        self.bare_names = self.names if bare is None else frozenset(bare)
        self.blocks = [b for b in _BLOCKS if not b[2] or self.names]
        self.limit = limit
        self.calls: list[ToolCall] = []
        self._content: list[str] = []
        self._buf = ""
        self._block = None  # the block being read: (opener, closer, must name a tool)
        self._scan, self._in_str, self._esc, self._checked = 0, False, False, False  # (its scan: _closer_at)
        self._space = ""  # whitespace held back: given out only if non-space content follows
        # a reply that may be one bare call of a tool (no block: ``{"name": ...}``, as Qwen2.5-Coder writes some
        # of its calls; 7 of 16 sampled first replies of the README's example, session 58): held from its start
        # while it can be one (``_call_shaped``), read at ``finish``; False once it cannot
        self._bare: str | bool = "" if self.names and self.bare_names else False

    @property
    def content(self) -> str:
        return "".join(self._content)

    def _text(self, s: str, out: list) -> None:
        s = self._space + s
        if not s.strip():
            self._space = s
            return
        self._space = ""
        if not self._content and self.calls:  # content after a call: no leading whitespace
            s = s.lstrip()
        body = s.rstrip()
        self._space = s[len(body):]
        if body:
            self._content.append(body)
            out.append(("content", body))

    def _close(self, body: str, raw: str, out: list, whole: bool = True) -> None:
        opener, closer, named = self._block
        self._block = None
        found = _as_calls(body, self.names if named else None, whole)
        if found is None:
            p = body.rfind(opener)
            if p >= 0:  # an opener in prose, or a broken block, before the call: text up to the last opener
                self._text(opener + body[:p], out)
                self._block = (opener, closer, named)
                rest = body[p + len(opener):]
                self._close(rest, opener + rest + raw[len(opener) + len(body):], out, whole)
                return
            self._text(raw, out)
            return
        calls, rest = found
        self._space = ""
        self._take(calls, out)
        rest = rest.strip()
        for end in (closer, "```", CLOSE):  # an unclosed block's text after its call, less a stray closer
            if rest.startswith(end) or end.startswith(rest):  # (or the start of one, where the reply was cut)
                rest = rest[len(end):]
                break
        if rest.strip():
            self._text(rest, out)

    def _take(self, calls: list[ToolCall], out: list) -> None:
        """``calls`` into the reply's calls and events, those past ``limit`` dropped."""
        for call in calls:
            if self.limit is None or len(self.calls) < self.limit:
                self.calls.append(call)
                out.append(("call", call))

    def _closer_at(self, closer: str) -> int:
        """Where the open block's closer starts in the buffer, -1 if not yet: outside JSON strings (an
        argument may hold ``</tool_call>`` or a fence), scanning only what came since the last look."""
        buf, i = self._buf, self._scan
        while i < len(buf):
            c = buf[i]
            if self._esc:
                self._esc = False
            elif self._in_str:
                if c == "\\":
                    self._esc = True
                elif c == '"' or c == "\n":  # (no JSON string holds a raw line break: a stray quote's ends there)
                    self._in_str = False
            elif c == '"':
                self._in_str = True
            elif buf.startswith(closer, i):
                return i
            elif closer.startswith(buf[i:]):  # the closer may be starting: look again with more text
                break
            i += 1
        self._scan = i
        return -1

    def _open(self, k: int) -> None:
        self._block = self.blocks[k]
        self._scan, self._in_str, self._esc, self._checked = 0, False, False, False

    def feed(self, text: str) -> list:
        if self._bare is not False:
            self._bare += text
            if _call_shaped(self._bare, self.bare_names) is not False:
                return []
            text, self._bare = self._bare, False  # not a call: read as any reply
        out: list = []
        self._buf += text
        while True:
            if self._block is not None:
                opener, closer, named = self._block
                if named and not self._checked:
                    head = self._buf.lstrip()
                    if head and head[0] not in "{[":  # a fenced block that is not JSON: its opener is content
                        self._block = None
                        self._text(opener, out)
                        continue  # (the rest is scanned again: a closing fence and a call may follow)
                    self._checked = bool(head)
                j = self._closer_at(closer)
                if j < 0:
                    return out
                body, self._buf = self._buf[:j], self._buf[j + len(closer):]
                self._close(body, opener + body + closer, out)
                continue
            found = min(((self._buf.find(b[0]), k) for k, b in enumerate(self.blocks) if b[0] in self._buf),
                        default=None)
            if found is not None:
                i, k = found
                self._text(self._buf[:i], out)
                self._buf = self._buf[i + len(self.blocks[k][0]):]
                self._open(k)
                continue
            keep = max((k for b in self.blocks for k in range(min(len(b[0]) - 1, len(self._buf)), 0, -1)
                        if b[0].startswith(self._buf[-k:])), default=0)
            head, self._buf = self._buf[:len(self._buf) - keep], self._buf[len(self._buf) - keep:]
            if head:
                self._text(head, out)
            return out

    def finish(self) -> list:
        """The end of the reply: an unclosed call that is whole JSON is a call (the generation may end
        at its last brace, or at ``</tool_call>`` as a stop string), anything else left is content."""
        if self._bare:  # held to the end: one bare call, or (not one) the reply's text as it was written
            held, self._bare = self._bare, False
            calls = _bare_calls(held, self.bare_names) if _call_shaped(held, self.bare_names) else None
            if calls is None:
                return self.feed(held) + self.finish()
            out = []
            self._take(calls, out)
            return out
        self._bare = False
        out: list = []
        if self._block is not None:  # unclosed: a call followed by text is the call and that text
            self._close(self._buf, self._block[0] + self._buf, out, whole=False)
        elif self._buf:
            self._text(self._buf, out)
        self._buf = ""
        if not self.calls and self._space:  # no calls: trailing whitespace is the reply's own
            self._content.append(self._space)
            out.append(("content", self._space))
        self._space = ""
        return out


def parse_tool_calls(text: str, names=None, limit: int | None = None) -> tuple[str, list[ToolCall]]:
    """A whole reply's content and calls."""
    p = ToolCallParser(names, limit)
    p.feed(text)
    p.finish()
    return p.content, p.calls


@dataclass
class ToolRequest:
    """Validated tools for one generation: what the template renders, the reply's forced start, the
    stop strings and the parser."""

    tools: list[dict]
    choice: str | dict = "auto"
    parallel: bool = True
    # the llguidance grammar the reply's calls are held to (``plan``): the whole reply for a forced call,
    # the blocks <tool_call> opens where a function is strict; None: no grammar (then a forced call is a
    # forced start of the reply, ``prefix``)
    grammar: str | None = None

    @property
    def forced(self) -> bool:
        return self.choice == "required" or isinstance(self.choice, dict)

    def plan(self, tokenizer) -> str | None:
        """Hold the calls to a grammar where one is asked for or a call is forced: a forced call's reply
        is then a call (its arguments any JSON object, or the function's parameters if it is strict), and
        in ``auto`` a strict function's arguments follow its parameters. Needs llguidance and the
        template's call tokens (``<tool_call>``, ``</tool_call>`` as single tokens); a forced call without
        them falls back to the forced start. ``ConfigError`` where a strict function cannot be honoured."""
        strict = any(t["function"].get("strict") for t in self.tools)
        if not self.parses or not (strict or self.forced):
            return None
        ids = tokenizer.token_to_id(OPEN), tokenizer.token_to_id(CLOSE)
        try:
            from .constrain import _llguidance, tool_call_grammar

            _llguidance()
        except ConfigError:
            if strict:
                raise ConfigError("strict tool calls need llguidance: pip install llguidance (or the serve "
                                  "extra)") from None
            return None
        if None in ids:
            if strict:
                raise ConfigError(f"strict tool calls need {OPEN} and {CLOSE} as tokens of the model's vocabulary; "
                                  "this tokenizer has none")
            return None
        self.grammar = tool_call_grammar(self.tools, self.choice, self.parallel, ids[0], ids[1])
        return self.grammar

    @property
    def template_tools(self) -> list[dict] | None:
        return self.tools if self.tools and self.choice != "none" else None

    @property
    def parses(self) -> bool:
        return self.template_tools is not None

    @property
    def prefix(self) -> str:
        """The reply's forced start: the opening of a call for "required", of the named call for a function
        (none where a grammar holds the calls)."""
        if self.grammar is not None:
            return ""
        if self.choice == "required":
            return OPEN + '\n{"name": "'
        if isinstance(self.choice, dict):
            # no space after the colon: the model writes ' {' as the token it learned (a BPE pre-token
            # takes the space before its punctuation), not '{' after a lone space
            return OPEN + '\n{"name": ' + json.dumps(self.choice["name"]) + ', "arguments":'
        return ""

    def stops(self, thinking: bool = False) -> list[str]:
        """The stop strings of a reply that may call (``parallel_tool_calls`` false: the first call's
        ``</tool_call>``), but not where the model may think first (``thinking``: a thinking model's reply
        not forced to open with a call): a stop string counts in the thinking too, where the model may
        write the tag (its reply ended there, mid-thought, with no call); the first call is kept all the
        same (``parser``)."""
        return [CallEnd(self)] if self.parses and not self.parallel and not (thinking and not self.forced) else []

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """A whole reply's content and calls (the forced start read first, as the reply began with it)."""
        p = self.parser()
        p.feed(text)
        p.finish()
        return p.content, p.calls

    def parser(self, bare: bool = True) -> ToolCallParser | None:
        """The reply's parser. ``bare``: a reply that is nothing but a call written without a block is read as one,
        of a function that is not ``strict`` (a strict function's arguments are held to its parameters inside
        ``<tool_call>`` blocks only)."""
        if not self.parses:
            return None
        p = ToolCallParser([t["function"]["name"] for t in self.tools], None if self.parallel else 1,
                           bare=[t["function"]["name"] for t in self.tools if bare and not t["function"].get("strict")])
        if self.prefix:
            p.feed(self.prefix)
        return p


class CallEnd(str):
    """``</tool_call>`` as the stop string of a reply held to one call (``parallel_tool_calls`` false), counted only
    where it closes the reply's first call (``ends``): not inside an argument's text (a file's contents may hold the
    tag), not at the end of a broken block the parser keeps as text (a call may follow it)."""

    request: ToolRequest

    def __new__(cls, request: ToolRequest):
        s = super().__new__(cls, CLOSE)
        s.request = request
        return s

    def ends(self, text: str, at: int) -> bool:
        """Whether the closer at ``at`` of the reply's ``text`` ends the reply's first call: the reply has a call
        through it and none before it (not a tag in prose after a fenced call)."""
        p = self.request.parser(bare=False)  # (a reply held as a possible bare call would show no call here)
        p.feed(text[:at])  # (the parser reads a reply fed in pieces as it reads it whole)
        if p.calls:
            return False
        p.feed(CLOSE)
        return bool(p.calls)


def tool_request(tools, tool_choice=None, parallel_tool_calls=True, *, template: str | None) -> ToolRequest | None:
    """Check ``tools``, ``tool_choice`` and ``parallel_tool_calls`` against a bundle's chat template;
    None when there are no tools (and the choice asks for none)."""
    tools = check_tools(tools) if tools is not None else []
    if not isinstance(parallel_tool_calls, bool):
        raise ConfigError("parallel_tool_calls must be true or false")
    choice = check_tool_choice(tool_choice, [t["function"]["name"] for t in tools])
    if not tools:
        return None
    if not template_takes_tools(template):
        raise ConfigError("this bundle's chat template does not take tools in the <tool_call> format (Qwen2.5, "
                          "Hermes), the one edgespec reads calls in")
    return ToolRequest(tools, choice, parallel_tool_calls)
