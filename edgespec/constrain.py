"""Structured outputs: a reply held to a JSON schema (OpenAI's ``response_format``), with llguidance.

``grammar_for(response_format)`` turns ``{"type": "json_object"}`` or ``{"type": "json_schema",
"json_schema": {"name", "schema", ...}}`` into an llguidance grammar (a string, kept in the
``GenerationConfig``). For a generation, ``Constraint`` holds llguidance's matcher over the target's
vocabulary: at each position the tokens the grammar allows. The decoder masks the target's logits with it
(the others get -inf) before the acceptance rule, at the first token and at every row of a verify call:
row i with the grammar advanced through the draft's first i tokens. So:

- greedy, the reply is the argmax of the masked logits, token for token the same under every drafter;
- sampled, it follows the masked distribution (the target's, renormalized over what the grammar allows);
  a drafter's own q needs no mask: the rule is exact for any q, and a draft token the grammar forbids has
  p = 0 and is rejected.

Whitespace between JSON tokens is bounded (``WHITESPACE``). A draft is cut at its first token the grammar forbids where that cannot change the outcome (greedy, or a
drafter without probabilities), so the verify call does not compute rows that cannot be kept. The end of
the grammar allows only the end of sequence. llguidance is an optional dependency (``pip install
llguidance``; the ``serve`` extra has it), imported when a request asks for a format.
"""
from __future__ import annotations

import json
import re
import threading

import numpy as np

from .errors import ConfigError, EdgespecError, big_integer
from .lm import native_work
from .tools import NAME

_MAX_SCHEMA = 1 << 20  # characters of a schema's JSON
# llguidance compiles a schema's $refs recursively: a flat 88 KB schema, a chain of 2,500 (500-1,000 where each
# level wraps the next in properties), overflowed a thread's 8 MiB C stack (a segfault: one request took the server
# down). Its compiles run on a thread with this stack (address space: only what the recursion touches is memory);
# chains of every kind up to the size bound compile in it (a 1.2 MB chain of 38,000 $refs, 0.45 s) or are llguidance's
# "schema too large", on session 53's Zen 3
_COMPILE_STACK = 256 << 20
_stack_lock = threading.Lock()
# whitespace between JSON tokens: a space or a tab, or one or two line breaks and an indent of up to 20
# (as llama.cpp's JSON schema grammars): compact and pretty-printed JSON pass, and a model cannot fill
# its reply with whitespace (unbounded, a small model does: every token a space is allowed)
WHITESPACE = r"[ \t]?|\n{1,2}[ \t]{0,20}"


def _llguidance():
    try:
        import llguidance
    except ImportError:
        raise ConfigError("structured outputs (response_format) need llguidance: pip install llguidance "
                          "(or the serve extra)") from None
    return llguidance


JSON_SAFE_INT = 2 ** 53 - 1  # RFC 8259's interoperable integers (a double holds them exactly)


def check_schema_numbers(schema, where: str) -> None:
    """Refuse an integer in a JSON schema past +-(2**53 - 1) (``ConfigError``): llguidance crashed the process
    (SIGSEGV) on integer bounds near -2**63, clamped bounds past 64 bits (a reply of 9223372036854775807 that
    finished 'stop' against a minimum of 10**20), and rounded a large ``const`` as a double (session 55, a
    review). No schema keyword needs more: JSON's parsers in other languages round them too."""
    found = big_integer(schema, JSON_SAFE_INT, where)
    if found is not None:
        at, v = found
        raise ConfigError(f"{at[:200]}: the integer {str(v)[:40]}{'...' if len(str(v)) > 40 else ''} is past "
                          f"+-(2**53 - 1), the integers JSON's parsers hold exactly")


def grammar_for(response_format) -> str | None:
    """OpenAI's ``response_format`` as an llguidance grammar; None for ``{"type": "text"}`` (or None).
    ``ConfigError`` for a malformed format or a schema llguidance cannot compile."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict) or not isinstance(response_format.get("type"), str):
        raise ConfigError("response_format must be {\"type\": \"text\" | \"json_object\" | \"json_schema\", ...}")
    kind = response_format["type"]
    extra = sorted(set(response_format) - {"type", "json_schema"})
    if extra or (kind != "json_schema" and "json_schema" in response_format):
        raise ConfigError(f"response_format has an unknown field {(extra or ['json_schema'])[0]!r}")
    if kind == "text":
        return None
    if kind == "json_object":
        schema = {"type": "object"}
    elif kind == "json_schema":
        js = response_format.get("json_schema")
        if not isinstance(js, dict):
            raise ConfigError("response_format.json_schema must be an object {\"name\", \"schema\", ...}")
        extra = sorted(set(js) - {"name", "schema", "strict", "description"})
        if extra:
            raise ConfigError(f"response_format.json_schema has an unknown field {extra[0]!r}")
        name = js.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):  # (OpenAI's rule, as for a tool's name)
            raise ConfigError("response_format.json_schema.name must be 1-64 letters, digits, _ or -"
                              + (" (it is missing)" if name is None else f", got {json.dumps(name)[:80]}"))
        if js.get("strict") is not None and not isinstance(js["strict"], bool):
            raise ConfigError("response_format.json_schema.strict must be true or false")
        schema = js.get("schema", {})
        if not isinstance(schema, dict):
            raise ConfigError("response_format.json_schema.schema must be a JSON Schema object")
    else:
        raise ConfigError(f"response_format.type must be text, json_object or json_schema, got {kind!r}"[:200])
    try:
        text = json.dumps(schema, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        raise ConfigError("response_format's schema is not JSON (or nested too deeply)") from None
    check_schema_numbers(schema, "response_format's schema")
    if len(text) > _MAX_SCHEMA:
        raise ConfigError(f"response_format's schema has {len(text)} characters; at most {_MAX_SCHEMA}")
    llg = _llguidance()
    try:
        grammar, err = _deep(lambda: _compiled(llg.LLMatcher.grammar_from_json_schema(
            text, defaults={"whitespace_pattern": WHITESPACE}), llg))
    except ValueError as e:
        raise ConfigError(f"response_format's schema: {str(e).splitlines()[0][:300]}") from None
    if err and not err.startswith("WARNING"):
        raise ConfigError(f"response_format's schema cannot be used: {_first_lines(err)}")
    return grammar


def _compiled(grammar: str, llg) -> tuple[str, str]:
    return grammar, llg.LLMatcher.validate_grammar(grammar)


def _deep(fn):
    """``fn()`` on a thread with a ``_COMPILE_STACK`` stack (llguidance's recursive compile of a schema), its
    exception raised here; on this thread where no such thread can be started. The compile releases the GIL: it is
    native work the exit waits for (lm.native_work), listed by this thread while it waits for the compile's; the
    compile's thread, wanting the GIL back once the interpreter's finalization had begun, was ended by CPython with
    pthread_exit, whose unwinding through llguidance's Rust frames crashed the process (SIGSEGV, session 82: an
    app's daemon thread starting a structured reply as the app exited; CI met it 1 run in ~25)."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - raised again on the caller's thread
            out["error"] = e

    with native_work(run):
        try:
            with _stack_lock:  # (the size is the process's for the threads started next: set and put back at once)
                old = threading.stack_size(_COMPILE_STACK)
                try:
                    t = threading.Thread(target=run, name="edgespec-grammar", daemon=True)
                    t.start()
                finally:
                    threading.stack_size(old)
        except (ValueError, RuntimeError):  # (a platform without the setting, or no thread to be had)
            return fn()
        t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


LAZY = "edgespec-lazy:"  # a grammar applied only inside the blocks a trigger token opens: LAZY + "<id>:" + grammar



def _first_lines(err: str) -> str:
    """llguidance's error in one line: a regex's spans lines ("regex parse error:", the pattern, a caret, why); a
    schema's is followed by the grammar's listing ("2 | call: ..."), which is edgespec's, not the request's."""
    lines = []
    for ln in err.splitlines()[:4]:
        if re.match(r"\s*\d+ \| ", ln):
            break
        lines.append(ln.strip())
    return " ".join(ln for ln in lines if ln)[:300]

def tool_call_grammar(tools: list[dict], choice, parallel: bool, open_id: int, close_id: int) -> str:
    """The llguidance grammar of tool calls in the ``<tool_call>`` format (tools.py): a call is
    ``\n{"name": N, "arguments": A}\n</tool_call>`` after its opening token, A held to N's parameters
    where N is strict (any JSON object otherwise). A forced call (``required``, or a named function: its
    calls only) holds the whole reply: one call, or with ``parallel`` one or more; otherwise (``auto``)
    the grammar holds each block the model opens, lazily (``LAZY``, ``LazyConstraint``)."""
    rules, alts = [], []
    for t in tools:
        f = t["function"]
        if isinstance(choice, dict) and f["name"] != choice["name"]:
            continue
        i = len(alts)
        # a strict function without parameters takes none (OpenAI: "omitting parameters defines a function with an
        # empty parameter list"): its arguments are {} (they were any object: {"cccc": "}}"} from a tiny model)
        schema = (f.get("parameters") or {"type": "object", "properties": {}, "additionalProperties": False}) \
            if f.get("strict") else {"type": "object"}
        check_schema_numbers(schema, f"tools[{i}].function.parameters")  # (tools.check_tools does too)
        alts.append(f"call_{i}")
        opening = json.dumps('{"name": ' + json.dumps(f["name"]) + ', "arguments": ')  # a Lark string
        rules.append(f"call_{i}: {opening} args_{i} " + json.dumps("}"))
        # (the whitespace bounded as in response_format's: unbounded, a small model filled a forced call's
        # arguments with spaces and line breaks until its token budget ran out)
        own = schema.get("x-guidance") if isinstance(schema.get("x-guidance"), dict) else {}
        bounded = {**schema, "x-guidance": {**own, "whitespace_pattern": WHITESPACE}}
        rules.append(f"args_{i}: %json {json.dumps(bounded, allow_nan=False)}")
    body = f'"\\n" call "\\n" <[{close_id}]>'
    if choice == "auto":
        head = f"start: {body}"
    else:
        block = f"<[{open_id}]> {body}"
        # (a newline after a call may end the reply too: as the only way out, a model that writes one after
        # every call, as chat templates do between calls, was made to open another: Qwen2.5-Coder-1.5B called
        # get_weather for Paris, then London and Berlin, until its token budget ran out)
        head = "start: block" + (' ("\\n" block)* "\\n"?' if parallel else "") + f"\nblock: {block}"
    grammar = "\n".join([head, "call: " + " | ".join(alts)] + rules) + "\n"
    g = _deep(lambda: _llguidance().LLMatcher.grammar_from_lark(grammar))
    return LAZY + f"{open_id}:" + g if choice == "auto" else g


def _allowed(m, vocab: int, table: int | None = None) -> np.ndarray:
    """The tokens matcher ``m`` allows next, as booleans over the vocabulary (``table``: llguidance's token count,
    where the tokenizer has ids past the model's vocabulary: its mask is that long, cut to ``vocab``)."""
    bits = np.empty((max(vocab, table or 0) + 31) // 32, dtype=np.int32)
    m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes)
    return np.unpackbits(bits.view(np.uint8), bitorder="little")[:vocab].astype(bool)


class Grammars:
    """Matchers for one tokenizer: llguidance's tokenizer is built once (~1 s for a 150k vocabulary), on
    the first request that asks for a format."""

    def __init__(self, tokenizer_json: str, vocab: int, eos_ids, think: tuple[int, int] | None = None,
                 text_encode=None, tokens: int | None = None):
        self._json, self.vocab, self.eos = tokenizer_json, vocab, [int(e) for e in eos_ids]
        # llguidance's token count: the tokenizer's where it has ids past the model's vocabulary (special tokens the
        # model never writes: Gemma 3 1B's <image_soft_token>; llguidance refuses a count under the tokenizer's); its
        # masks are that long and cut to the vocabulary
        self.table = max(vocab, tokens or 0)
        # (text -> ids reading every added token's text as text: what spells a grammar's fixed text)
        self._text_encode = text_encode
        self.think = think  # a thinking model's <think> and </think> ids (reasoning.think_tags): no calls inside
        self._blank: frozenset[int] | None = None  # the ids whose text is white space only (blank_ids)
        self._tok = None
        self._lock = threading.Lock()

    def constraint(self, grammar: str) -> "Constraint":
        """The constraint of one generation (its grammar compiled, checked, and its first mask computed: llguidance's
        native work, the GIL released, which the exit waits for as for a model call, see ``_deep``)."""
        with native_work(self):
            return self._constraint(grammar)

    def _constraint(self, grammar: str) -> "Constraint":
        llg = _llguidance()
        with self._lock:
            if self._tok is None:
                self._tok = self._llg_tokenizer(llg)
        if grammar.startswith(LAZY):
            trigger, _, grammar = grammar[len(LAZY):].partition(":")
            if not trigger.isdigit() or not 0 <= int(trigger) < self.vocab:  # (a grammar given as an option)
                raise ConfigError(f"a lazy grammar's trigger must be a token id, got {trigger[:40]!r}")
            self._matcher(llg, grammar)  # refused now if it does not compile (or cannot start)
            # (each block the trigger opens: checked above once, not again per block)
            return LazyConstraint(lambda: self._matcher(llg, grammar, check=False), int(trigger), self.vocab,
                                  self.eos, think=self.think,
                                  blank=self.blank_ids() if self.think is not None else frozenset(), table=self.table)
        return Constraint(self._matcher(llg, grammar), self.vocab, self.eos, table=self.table)

    def _llg_tokenizer(self, llg):
        """llguidance's tokenizer: its token table as its own reading of the tokenizer JSON makes it (the added
        tokens special), and, where ``text_encode`` is given, the text a grammar forces (a const, an enum's one
        value, a property's name) spelled as text. llguidance's own encoding matched added tokens' texts in it:
        a schema's "<filename>" or "a</tool_call>b" came out as the added token, which no grammar's bytes
        match (the generation failed), and a const "<|im_end|>" ended the reply inside its string."""
        tok = llg.LLTokenizer(self._json, n_vocab=self.table, eos_token=self.eos or None)
        if self._text_encode is None:
            return tok
        n = tok.vocab_size
        encode = self._text_encode

        class Table:  # (llguidance.TokenizerWrapper's fields)
            eos_token_id = tok.eos_token
            bos_token_id = None
            tokens = [tok.decode_bytes([i]) for i in range(n)]
            special_token_ids = [i for i in range(n) if tok.is_special_token(i)]
            is_tokenizer_wrapper = True

            def __call__(self, text):
                return encode(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)

        return llg.LLTokenizer(Table(), n_vocab=self.table, eos_token=self.eos or None)

    def blank_ids(self) -> frozenset[int]:
        """The ids whose text is white space only (a reply's blank start before its <think>: reasoning.answer_start
        strips it); decoded once (~0.5 s for a 150k vocabulary), for the first lazy grammar of a thinking model."""
        with self._lock:
            if self._blank is None:
                from tokenizers import Tokenizer

                tok = Tokenizer.from_str(self._json)
                texts = tok.decode_batch([[i] for i in range(tok.get_vocab_size(with_added_tokens=True))],
                                         skip_special_tokens=False)
                self._blank = frozenset(i for i, t in enumerate(texts) if t and not t.strip())
        return self._blank

    def _matcher(self, llg, grammar: str, check: bool = True):
        m = _deep(lambda: llg.LLMatcher(self._tok, grammar, log_level=0))
        if check and not m.is_error():  # (a grammar that compiles may still fail at its first token: {"$ref": "#"})
            first = _allowed(m, self.vocab, self.table)
            if not m.is_error() and not first.any():
                raise ConfigError("the reply's grammar (response_format or strict tools) allows no first token")
        if m.is_error():
            err = m.get_error()
            first = _first_lines(err)
            if "NoExtensionBias" in err:
                raise ConfigError(f"the reply's grammar (response_format or strict tools) cannot be used: {first} "
                                  "(a schema that refers to itself with no way to end?)")
            raise ConfigError(f"the reply's grammar (response_format or strict tools): {first}")
        return m


class Constraint:
    """The grammar's state over one generation: masks for a verify call's rows, and the tokens kept."""

    def __init__(self, matcher, vocab: int, eos=(), table: int | None = None):
        self.m, self.vocab, self.table = matcher, vocab, max(vocab, table or 0)
        self.words = (self.table + 31) // 32
        # llguidance keeps no end-of-sequence token in the history it rolls back: never pushed, never
        # counted in a rollback
        self.eos = frozenset(int(e) for e in eos)
        self._pushed = 0

    def masks(self, draft) -> tuple[np.ndarray, int]:
        """(allowed, n): ``allowed[i]`` the tokens allowed after the draft's first i tokens, for i = 0..n,
        where the draft's first n tokens are allowed (its token n, if any, is not). After an allowed end
        of sequence (the generation's end if kept) the rows allow every token: they are never read."""
        draft = [int(t) for t in draft]
        n = self.m.validate_tokens(draft) if draft else 0
        bits = np.empty((n + 1, self.words), dtype=np.int32)
        fed = 0
        for i in range(n + 1):
            if i and draft[i - 1] in self.eos:
                bits[i:] = -1
                break
            self.m.unsafe_compute_mask_ptr(bits[i].ctypes.data, self.words * 4)
            if i < n and draft[i] not in self.eos:
                if not self.m.consume_token(draft[i]):
                    self._failed()
                fed += 1
        if fed:
            self.m.rollback(fed)
        self._failed() if self.m.is_error() else None
        allowed = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, : self.vocab].astype(bool)
        if not allowed[0].any():
            raise EdgespecError("the structured output's grammar allows no token here (llguidance)")
        return allowed, n

    # drafting with the grammar (a model drafter: drafters.ModelDrafter.draft): the mask after the tokens
    # pushed so far, then all of them rolled back
    def mask(self) -> np.ndarray:
        return _allowed(self.m, self.vocab, self.table)

    def push(self, token: int) -> bool:
        """Advance through a drafted token; False for an end of sequence (not pushed: a draft ends there)."""
        if int(token) in self.eos:
            return False
        if not self.m.consume_token(int(token)):
            self._failed()
        self._pushed += 1
        return True

    def pop(self) -> None:
        n, self._pushed = self._pushed, 0
        if n:
            self.m.rollback(n)

    def consume(self, tokens) -> None:
        if tokens and not self.m.consume_tokens([int(t) for t in tokens]):
            self._failed()

    def _failed(self):
        raise _failure(self.m.get_error(), "the structured output's grammar")


def _failure(err: str, what: str) -> EdgespecError:
    """A matcher's failure mid-generation. llguidance compiles a schema whose required parts refer to themselves
    with no way to end (``{"properties": {"a": {"$ref": "#/properties/a"}}, "required": ["a"]}``), and fails
    only when the reply reaches that part ("NoExtensionBias"): the request's fault, a ``ConfigError`` (400), not
    the server's (500)."""
    first = err.splitlines()[0][:300] if err else "unknown error"
    if "NoExtensionBias" in err:
        return ConfigError(f"{what} cannot be used: {first} (a schema that refers to itself with no way to end?)")
    if "lexer error" in err or "too many" in err:  # (llguidance's limits: a pattern of ^a{300000}$ passed the compile
        # and its first mask, and failed at the second; session 55, a review: the request's, a 400, not a 500)
        return ConfigError(f"{what} is past llguidance's limits: {first}")
    return EdgespecError(f"{what} failed: {first}")


def masked(rows: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """``rows`` of logits with what ``allowed`` forbids at -inf; rows past ``allowed``'s last take its
    last row's mask (a draft kept past a forbidden token: the rule never reaches those rows)."""
    if len(allowed) < len(rows):
        allowed = np.concatenate([allowed, np.repeat(allowed[-1:], len(rows) - len(allowed), axis=0)])
    return np.where(allowed[: len(rows)], rows, np.float32(-np.inf))


_THINKING, _FIRST = "thinking", "first"  # LazyConstraint's states besides a block's matcher and None (free text)


class LazyConstraint:
    """A grammar held only inside the blocks a trigger token opens (strict tool calls in ``auto``: the
    text outside calls is free, each call's body follows the grammar until it closes). The same protocol
    as ``Constraint``; the matcher of an open block is copied for a verify call's masks and a draft.

    With a thinking model's tags (``think``), a trigger inside the reply's thinking opens nothing: calls are read
    from the answer after it (reasoning.answer_start), and a ``<tool_call>`` the model wrote while thinking was
    held to the grammar, its thought turned into a call's arguments. The reply thinks where it starts inside a
    block (``start``: the template opened it) or its first token after white space (``blank``: the ids whose text
    is white space only) opens one, until the first ``</think>``."""

    def __init__(self, new_matcher, trigger: int, vocab: int, eos=(), think: tuple[int, int] | None = None,
                 blank: frozenset[int] = frozenset(), table: int | None = None):
        self.new, self.trigger, self.vocab, self.table = new_matcher, trigger, vocab, table
        self.eos = frozenset(int(e) for e in eos)
        self.think, self.blank = think, blank
        # the open block's matcher; None in free text; _THINKING inside the thinking; _FIRST before the first token
        self.m = _FIRST if think is not None else None
        self._work, self._pushed = None, False

    def start(self, prompt_ids) -> None:
        """Before the generation: whether the reply starts inside a thinking block (reasoning.starts_inside)."""
        if self.think is not None:
            from .reasoning import starts_inside

            self.m = _THINKING if starts_inside(prompt_ids, self.think) else _FIRST

    @staticmethod
    def _copy(m):
        return m.deep_copy() if m is not None and not isinstance(m, str) else m

    def _mask(self, m) -> np.ndarray:
        if m is None or isinstance(m, str):
            return np.ones(self.vocab, dtype=bool)
        allowed = _allowed(m, self.vocab, self.table)
        if m.is_error():  # (a failed matcher allows the end of sequence only: the call would end cut, as "stop")
            raise _failure(m.get_error(), "the tool call's grammar")
        return allowed

    def _advance(self, m, t: int):
        """(allowed, the state after t); the matcher is advanced in place."""
        if m is _THINKING:
            return True, (None if t == self.think[1] else _THINKING)
        if m is None or m is _FIRST:
            if m is _FIRST and t == self.think[0]:
                return True, _THINKING
            if m is _FIRST and t in self.blank:
                return True, _FIRST
            return True, (self.new() if t == self.trigger else None)
        if t in self.eos or m.validate_tokens([t]) != 1:
            return False, m
        if not m.consume_token(t) or m.is_error():
            raise _failure(m.get_error(), "the tool call's grammar")
        return True, (None if m.is_stopped() else m)

    def masks(self, draft) -> tuple[np.ndarray, int]:
        m = self._copy(self.m)
        rows, n = [self._mask(m)], 0
        for t in (int(t) for t in draft):
            if not rows[-1][t]:
                break
            ok, m = self._advance(m, t)
            if not ok:
                break
            n += 1
            rows.append(np.ones(self.vocab, dtype=bool) if t in self.eos else self._mask(m))
            if t in self.eos:
                break
        return np.array(rows), n

    def consume(self, tokens) -> None:
        for t in tokens:
            ok, self.m = self._advance(self.m, int(t))
            if not ok and int(t) not in self.eos:
                raise EdgespecError("a token outside the tool call's grammar was kept")

    def mask(self) -> np.ndarray:
        return self._mask(self._work if self._pushed else self.m)

    def push(self, token: int) -> bool:
        if int(token) in self.eos:
            return False
        if not self._pushed:
            self._work, self._pushed = self._copy(self.m), True
        ok, self._work = self._advance(self._work, int(token))
        return ok

    def pop(self) -> None:
        self._work, self._pushed = None, False
