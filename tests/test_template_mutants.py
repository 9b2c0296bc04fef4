"""Tests for the gaps a second mutation test of edgespec/template.py found (session 95, docs/bench/mutation_s95.md;
mutants in docs/bench/mutation_harness/template_mut.py). Each fails with its mutant planted (TPn) and passes on the
code. No model: the templates are rendered alone. The limit cases and the templates that must render are cases of
tests/test_hardening.py's ``test_template_limits`` and ``test_template_formats_within_the_limits_render``."""
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
