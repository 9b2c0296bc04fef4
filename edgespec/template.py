"""The chat template: jinja2's immutable sandbox with limits on time, size and nesting.

A bundle's chat template is code from whoever made the bundle. It runs in jinja2's
``ImmutableSandboxedEnvironment`` (no attribute access to internals, no mutation of the values it
gets) and, on top of that, within limits: ``TIME_LIMIT_S`` seconds per rendering (checked on every
line the template executes), strings and lists of at most ``SIZE_LIMIT`` characters/items built by
``*``, ``+``, ``%`` or the width/replace/join filters and methods, ``SIZE_LIMIT`` characters of
output, ``range()`` of at most ``SIZE_LIMIT`` items, and ``DEPTH_LIMIT`` nested macro calls.
Every failure is a ``ChatTemplateError`` (a parse failure, a ``BundleError``).
"""
from __future__ import annotations

import json
import re
import sys
import time

from .errors import BundleError, ChatTemplateError

TIME_LIMIT_S = 2.0
SIZE_LIMIT = 1 << 20  # characters of output, of a string built, items of a range or list
DEPTH_LIMIT = 64  # nested template calls (macros, recursion)
_WIDTH_METHODS = {"center", "ljust", "rjust", "zfill", "expandtabs"}
# a format width of 7 digits or more, or one given as an argument (`%*s`, `{:{w}}`): refused before formatting
_PERCENT_WIDTH = re.compile(r"%[-+ #0]*(?:\*|\d{7,})")  # %-formatting (`%`, the format filter)
_WIDE = re.compile(r"\d{7,}")
_MAX_INDENT = 64  # tojson's indent


def _percent_too_wide(fmt: str) -> bool:
    return bool(_PERCENT_WIDTH.search(fmt))


def _format_too_wide(fmt: str) -> bool:
    """str.format's: a field's spec with a width of 7+ digits or a nested field (``{:{w}}``); JSON's braces
    escaped as ``{{`` are literal text, not fields."""
    import string

    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:  # (malformed: format itself refuses it)
        return False
    return any(spec and ("{" in spec or _WIDE.search(spec)) for _, _, spec, _ in fields)


class _Limits:
    def __init__(self):
        self.deadline = time.perf_counter() + TIME_LIMIT_S
        self.depth = 0

    def tick(self):
        if time.perf_counter() > self.deadline:
            raise ChatTemplateError(f"chat template: rendering took longer than {TIME_LIMIT_S:g} s")


def _size(v) -> int:
    return len(v) if isinstance(v, (str, bytes, list, tuple)) else 0


def _check_size(n: int, what: str) -> None:
    if n > SIZE_LIMIT:
        raise ChatTemplateError(f"chat template: {what} of {n} exceeds the limit of {SIZE_LIMIT}")


def _bounded_range(*args):
    r = range(*args)
    _check_size(len(r), "range()")
    return r


def _checked_call(f, args, kwargs):
    """Refuse calls whose result would be huge before making them."""
    name = getattr(f, "__name__", "")
    owner = getattr(f, "__self__", None)
    if isinstance(owner, str):
        if name in _WIDTH_METHODS:
            for a in list(args) + list(kwargs.values()):
                if isinstance(a, int):
                    _check_size(a, f"str.{name} width")
        elif name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
            count = owner.count(args[0]) if args[0] else len(owner) + 1
            _check_size(len(owner) + count * max(0, len(args[1]) - len(args[0])), "str.replace result")
        elif name == "join":
            items = list(args[0]) if args else []
            _check_size(sum(_size(x) for x in items) + len(owner) * len(items), "str.join result")
            args = (items,) + tuple(args[1:])
        elif name in ("format", "format_map") and _format_too_wide(owner):
            raise ChatTemplateError("chat template: a format width over the size limit")
    return args


def _environment():
    from jinja2.compiler import CodeGenerator
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class SizedConcat(CodeGenerator):
        """``a ~ b`` (jinja2 compiles it to a join, past ``call_binop``): its result's size checked, so that a
        loop doubling a string (``{% set ns.s = ns.s ~ ns.s %}``) stops at the limit, not at the memory's."""

        def visit_Concat(self, node, frame):
            self.write("environment.sized(")
            super().visit_Concat(node, frame)
            self.write(")")

    class LimitedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**", "+", "%"])
        code_generator_class = SizedConcat

        def wrap_str_format(self, value):  # (jinja2 3.1.5 on: str.format wrapped at access, its string hidden)
            wrapped = super().wrap_str_format(value)
            if wrapped is not None and _format_too_wide(value.__self__):
                def refused(*args, **kwargs):
                    raise ChatTemplateError("chat template: a format width over the size limit")

                return refused
            return wrapped

        @staticmethod
        def sized(text):
            _check_size(_size(text), "a concatenation (~)")
            return text

        def call_binop(self, context, operator, left, right):
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if _size(seq) and isinstance(n, int):
                        _check_size(len(seq) * n, "a repeated string or list")
                if isinstance(left, int) and isinstance(right, int) and \
                        left.bit_length() + right.bit_length() > 8 * SIZE_LIMIT:  # (one C call: past the time limit)
                    raise ChatTemplateError("chat template: a product of more than the size limit's bits")
            elif operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:
                raise ChatTemplateError("chat template: an exponent over 64")
            elif (operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0
                  and left.bit_length() * right > 8 * SIZE_LIMIT):  # ((9**64)**64)**64: ~13 s, a 2-MiB integer
                raise ChatTemplateError("chat template: a power of more than the size limit's bits")
            elif operator == "+":
                _check_size(_size(left) + _size(right), "a concatenation")
            elif operator == "%" and isinstance(left, str) and _percent_too_wide(left):
                raise ChatTemplateError("chat template: a format width over the size limit")
            return super().call_binop(context, operator, left, right)

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's signature)
            args = _checked_call(__obj, args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

    def raise_exception(msg):
        raise TemplateError(msg)

    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        """transformers' ``{% generation %}...{% endgeneration %}`` (its AssistantTracker: it marks the assistant's
        tokens for training masks), rendered as its body: SmolLM3's template has it, and did not parse."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    env = LimitedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", Generation])
    env.globals["raise_exception"] = raise_exception
    env.globals["range"] = _bounded_range
    env.globals["strftime_now"] = _strftime_now  # (as transformers gives it: SmolLM3's, Granite's templates call it)
    env.globals.pop("lipsum", None)  # (jinja2's lorem ipsum: lipsum(30000) ran 7 s in C, past the time limit)
    # the time limit is checked on the template's own lines, so one filter call runs to its end: these two ran 16 s and
    # 6 s on a text within the size limit (session 49, a review), and no chat template has a use for them
    for name in ("urlize", "pprint"):
        env.filters.pop(name, None)
    env.filters["tojson"] = _tojson
    for name in ("center", "indent", "replace", "join", "format", "wordwrap", "truncate"):
        env.filters[name] = _guarded_filter(env.filters[name], name)
    return env


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """transformers' tojson filter (its arguments, in its order), within the limits."""
    if indent is not None and (_size(indent) if isinstance(indent, str) else abs(int(indent))) > _MAX_INDENT:
        raise ChatTemplateError(f"chat template: a tojson indent over {_MAX_INDENT}")
    if separators is not None and sum(_size(s) for s in separators) > _MAX_INDENT:
        raise ChatTemplateError(f"chat template: tojson separators of over {_MAX_INDENT} characters")
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    """transformers' strftime_now: the time now, formatted (a template's date line)."""
    from datetime import datetime

    if not isinstance(fmt, str) or len(fmt) > _MAX_INDENT:
        raise ChatTemplateError(f"chat template: strftime_now takes a format string of at most {_MAX_INDENT} "
                                "characters")
    return datetime.now().strftime(fmt)


def _guarded_filter(f, name):
    passes = hasattr(f, "jinja_pass_arg")  # its first argument is jinja2's context or environment

    def guarded(*args, **kwargs):
        vals = list(args[1:] if passes else args) + list(kwargs.values())
        if name in ("center", "indent", "wordwrap", "truncate"):
            for a in vals[1:]:
                if isinstance(a, int):
                    _check_size(a, f"the {name} filter's width")
        elif name == "replace" and len(vals) >= 3 and all(isinstance(v, str) for v in vals[:3]):
            s, old, new = vals[:3]
            count = s.count(old) if old else len(s) + 1
            _check_size(len(s) + count * max(0, len(new) - len(old)), "the replace filter's result")
        elif name == "join" and vals and not isinstance(vals[0], str):
            items = list(vals[0])  # (a generator, map's or select's, is read here: the filter gets the list)
            sep = vals[1] if len(vals) > 1 and isinstance(vals[1], str) else ""
            _check_size(sum(_size(x) for x in items) + len(sep) * len(items), "the join filter's result")
            at = 1 if passes else 0
            args = (*args[:at], items, *args[at + 1:])
        elif name == "format" and vals and isinstance(vals[0], str) and _percent_too_wide(vals[0]):
            raise ChatTemplateError("chat template: a format width over the size limit")
        return f(*args, **kwargs)

    for attr in ("jinja_pass_arg",):
        if hasattr(f, attr):
            setattr(guarded, attr, getattr(f, attr))
    return guarded


class ChatTemplate:
    """A compiled chat template; ``render(**values)`` within the limits above."""

    def __init__(self, source):
        from jinja2.exceptions import TemplateError

        if not isinstance(source, str):
            raise BundleError(f"the bundle's chat template is not a string ({type(source).__name__})")
        env = _environment()
        try:
            self._template = env.from_string(source)
        except (TemplateError, RecursionError, MemoryError, ValueError, SyntaxError) as e:
            # SyntaxError: jinja2 compiles some invalid templates ({% break %} outside a loop) to invalid Python
            raise BundleError(f"the bundle's chat template does not parse: {_first_line(e)}") from None

    def render(self, **values) -> str:
        from jinja2.exceptions import TemplateError

        limits = _Limits()
        code = self._template.root_render_func.__code__.co_filename

        def local(frame, event, arg):
            if event == "line":
                limits.tick()
            elif event == "return":
                limits.depth -= 1
            return local

        def tracer(frame, event, arg):
            if frame.f_code.co_filename != code:
                return None
            limits.depth += 1
            if limits.depth > DEPTH_LIMIT:
                raise ChatTemplateError(f"chat template: more than {DEPTH_LIMIT} nested calls")
            limits.tick()
            return local

        previous = sys.gettrace()
        parts, size = [], 0
        sys.settrace(tracer)
        try:
            for chunk in self._template.generate(**values):
                size += len(chunk)
                _check_size(size, "output")
                parts.append(chunk)
        except ChatTemplateError:
            raise
        except TemplateError as e:
            raise ChatTemplateError(f"chat template: {_first_line(e)}") from None
        except RecursionError:
            raise ChatTemplateError("chat template: recursion too deep") from None
        except MemoryError:
            raise ChatTemplateError("chat template: out of memory") from None
        except Exception as e:  # noqa: BLE001 - the template is foreign code: any failure is its own
            raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {_first_line(e)}") from None
        finally:
            sys.settrace(previous)
        return "".join(parts)


# what the renderer passes itself: a request's template kwargs may not replace it
RESERVED = frozenset({"messages", "add_generation_prompt", "bos_token", "eos_token", "tools", "raise_exception",
                      "range", "documents"})
KWARGS_LIMIT = 1 << 16  # characters of a request's template kwargs as JSON


def check_template_kwargs(kw, where: str = "chat_template_kwargs") -> dict:
    """Extra variables for the chat template (``{"enable_thinking": false}`` for Qwen3's, llama.cpp's and vLLM's
    ``chat_template_kwargs``): an object of JSON values under names that are identifiers and not the renderer's
    own (``RESERVED``), at most ``KWARGS_LIMIT`` characters; ``ConfigError`` otherwise. None gives {}."""
    from .errors import ConfigError, shown

    if kw is None:
        return {}
    if not isinstance(kw, dict):
        raise ConfigError(f"{where} must be an object of template variables, got {type(kw).__name__}")
    for k in kw:
        if not isinstance(k, str) or not k.isidentifier():
            raise ConfigError(f"{where}: {json.dumps(k)[:80] if isinstance(k, str) else shown(k, 80)} is not a "
                              f"variable name")
        if k in RESERVED:
            raise ConfigError(f"{where}: {k!r} is the renderer's own variable, not one to set")
    try:
        text = json.dumps(kw, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        raise ConfigError(f"{where} must hold JSON values (or is nested too deeply)") from None
    if len(text) > KWARGS_LIMIT:
        raise ConfigError(f"{where} has {len(text)} characters as JSON; at most {KWARGS_LIMIT}")
    from .tools import check_unicode

    out = json.loads(text)  # (a copy: the template gets plain values)
    check_unicode(json.dumps(out, ensure_ascii=False), where)  # (the tokenizer reads what the template writes)
    return out


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else type(e).__name__)[:300]
