"""Tests for the gaps a second mutation test of edgespec/template.py found (session 95, docs/bench/mutation_s95.md;
mutants in docs/bench/mutation_harness/template_mut.py). Each fails with its mutant planted (TPn) and passes on the
code. No model: the templates are rendered alone."""
from __future__ import annotations

import sys
import time
from datetime import datetime, timedelta, timezone

import pytest

from edgespec.errors import ChatTemplateError, ConfigError
from edgespec.template import ChatTemplate, check_template_kwargs

MSGS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]


def render(source, **kw):
    return ChatTemplate(source).render(messages=MSGS, **kw)


@pytest.mark.parametrize("source, match", [
    # TP8: a list's size counts: two million items refused before they are built, not only 2 MB of text
    ("{{ ([0] * 2000000) | length }}", "a repeated string or list"),
    # TP19: the count on the left of `*`, as `n * 'x'` is written too
    ("{{ (2000000 * 'x') | length }}", "a repeated string or list"),
    # TP11: the width methods beyond center and ljust
    ("{{ 'x'.zfill(2097152) | length }}", "str.zfill width"),
    ("{{ '\\t'.expandtabs(2097152) | length }}", "str.expandtabs width"),
    # TP24: two strings within the limit whose concatenation is not (the sum, not the larger)
    ("{{ (('x' * 600000) + ('y' * 600000)) | length }}", "a concatenation"),
    # TP36: the indent filter's width
    ("{{ 'a\\nb' | indent(2097152) | length }}", "the indent filter's width"),
    # TP39: tojson's indent given as a string
    ("{{ [[1]] | tojson(indent=' ' * 65) }}", "tojson indent"),
])
def test_template_limits_the_first_pass_left_unchecked(source, match):
    """Each of these built its result past the size limit with its mutant planted (and `| length` kept the output's
    own limit from refusing it afterwards)."""
    t0 = time.perf_counter()
    with pytest.raises(ChatTemplateError, match=match):
        render(source)
    assert time.perf_counter() - t0 < 10


@pytest.mark.parametrize("source, out", [
    # TP13: a replacement that shrinks or keeps the text's size is within the limit (800,000 characters stay so)
    ("{{ ('ab' * 400000).replace('ab', 'c') | length }}", "400000"),
    ("{{ ('ab' * 400000).replace('ab', 'cd') | length }}", "800000"),
    # TP14: str.join of a generator (map's) reads it once, for its size, and joins what it read
    ("{{ ' / '.join(messages | map(attribute='content')) }}", "hi / yo"),
    # TP20: a product of two integers is bounded by the sum of their bits (2**4096 squared: 8,193 bits)
    ("{% set a = (2 ** 64) ** 64 %}{{ (a * a).bit_length() }}", "8193"),
    # TP31: {% break %} and {% continue %} (jinja2's loopcontrols; tool-calling templates use them)
    ("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}", "hi"),
    ("{% for m in messages %}{% if m.role == 'user' %}{% continue %}{% endif %}{{ m.content }}{% endfor %}", "yo"),
    # TP29, TP30: transformers renders with trim_blocks and lstrip_blocks: a block tag's own line leaves no newline
    # or indentation in the prompt
    ("{% for m in messages %}\n{{ m.content }}\n{% endfor %}", "hi\nyo\n"),
    ("{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}",
     "[hi]\n"),
    # TP37: transformers' tojson keeps non-ASCII text as it is
    ("{{ {'city': 'Zürich', 'greeting': '你好'} | tojson }}", '{"city": "Zürich", "greeting": "你好"}'),
    # TP38: and takes its arguments in its order: ensure_ascii first
    ("{{ ['é'] | tojson(True) }}", '["\\u00e9"]'),
    # TP54: only the template's own calls count toward the nesting limit (30 nested macros, each a few of
    # jinja2's frames deep)
    ("{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{% endif %}{{ n % 10 }}{% endmacro %}{{ f(30) }}",
     "0123456789" * 3 + "0"),
])
def test_templates_within_the_limits_render_as_transformers_renders_them(source, out):
    assert render(source) == out


def test_the_templates_own_error_message_is_shown_as_it_wrote_it_on_one_line():
    """TP27: raise_exception's message is the template author's words to the user, shown as written, not as a
    foreign failure ('chat template failed: ValueError: ...'); TP67: on one line (the first)."""
    with pytest.raises(ChatTemplateError) as e:
        render("{{ raise_exception('System role not supported') }}")
    assert str(e.value) == "chat template: System role not supported"
    with pytest.raises(ChatTemplateError) as e:
        render("{{ raise_exception('Conversation roles must alternate\\nuser/assistant/user/assistant') }}")
    assert str(e.value) == "chat template: Conversation roles must alternate"


def test_a_malformed_format_string_is_refused_in_its_own_words():
    """TP4: a format string str.format cannot parse is format's own error, not 'a format width over the size
    limit'."""
    with pytest.raises(ChatTemplateError) as e:
        render("{{ 'a { b'.format(1) }}")
    assert "format width" not in str(e.value) and "ValueError" in str(e.value)


def test_strftime_now_refuses_a_format_that_is_no_string_in_its_own_words():
    """TP41: strftime_now(5) names what it takes, not Python's TypeError of len()."""
    with pytest.raises(ChatTemplateError, match="strftime_now takes a format string"):
        render("{{ strftime_now(5) }}")


def test_strftime_now_is_the_local_time_as_transformers_gives_it(monkeypatch):
    """TP42: transformers' strftime_now formats datetime.now(), the machine's local time, not UTC (a template's
    "Today Date" line): under a time zone nine hours east of UTC the hour is UTC's plus nine."""
    if not hasattr(time, "tzset"):
        pytest.skip("no time.tzset here")
    monkeypatch.setenv("TZ", "Etc/GMT-9")  # (POSIX's sign: nine hours east)
    time.tzset()
    try:
        for _ in range(3):  # (an hour may turn between the two readings: read again)
            before = datetime.now(timezone.utc) + timedelta(hours=9)
            got = render("{{ strftime_now('%H') }}")
            if before.strftime("%H") == (datetime.now(timezone.utc) + timedelta(hours=9)).strftime("%H"):
                break
        assert got == before.strftime("%H")
    finally:
        monkeypatch.undo()
        time.tzset()


def test_rendering_puts_back_the_callers_tracer():
    """TP57: rendering traces the template's lines (its time and nesting limits) and then puts back whatever tracer
    was set before it (a debugger's, coverage's), not none."""
    def mine(frame, event, arg):
        return None

    previous = sys.gettrace()
    sys.settrace(mine)
    try:
        assert render("{{ messages | length }}") == "2"
        assert sys.gettrace() is mine
    finally:
        sys.settrace(previous)


@pytest.mark.parametrize("kw, match", [
    ([], "must be an object"), ("", "must be an object"), (0, "must be an object"),  # TP61: not None, not {}
    ({"range": 3}, "renderer's own"),  # TP60: range is the renderer's bounded one
])
def test_template_kwargs_that_are_no_object_or_replace_the_renderers_own_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        check_template_kwargs(kw)


def test_template_kwargs_are_given_to_the_template_as_plain_json_values():
    """TP66: the template gets a copy made of JSON's own types: a tuple is a list, a str subclass (whose methods
    its author may have overridden) a plain str, and the caller's objects are not shared with it."""
    class Loud(str):
        def upper(self):
            return "overridden"

    inner = {"b": 1}
    kw = {"t": (1, 2), "s": Loud("x"), "d": inner}
    out = check_template_kwargs(kw)
    assert out == {"t": [1, 2], "s": "x", "d": {"b": 1}}
    assert type(out["t"]) is list and type(out["s"]) is str and out["d"] is not inner
    assert render("{{ s.upper() }}", **out) == "X"
