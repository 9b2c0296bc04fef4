"""``edgespec chat``: a multi-turn conversation in the terminal over ``api.ChatSession``.

Typed lines go to the model through its chat template; lines that start with ``/`` are commands
(``/help`` lists them). Replies are streamed to stdout as they are decoded. The conversation's KV
cache is reused between turns, so a turn only prefills its new tokens; the oldest turns are
dropped (with a notice) when the history outgrows the context.

Ctrl-C stops the reply being written and keeps the conversation (the partial reply stays in the
history); Ctrl-D or ``/exit`` leaves. Notices go to stderr; statistics go to stderr after each
reply with ``--stats``, or to stdout on ``/stats``. Piped (non-tty) input works too: each line is
one message or command, until end of input or ``/exit``; piped input that met an error exits 1 either
way. A line over ``LINE_LIMIT`` bytes is refused (and, piped, skipped up to the next newline) and the
conversation goes on.
"""
from __future__ import annotations

import json
import math
import os
import secrets
import stat
import sys
from typing import Callable, TextIO

from .decoder import Stats
from .drafters import drafter_choices
from .errors import ConfigError, ContextOverflowError, EdgespecError

PROMPT = "you> "
MORE = "...> "  # a message's later lines, between two lines of three double quotes
BLOCK = '"""'
LINE_LIMIT = 64 << 20  # bytes of one line; the CLI passes its STDIN_LIMIT (what `generate -p -` reads), the same

HELP = """\
commands:
  /help              this list
  /reset             start a new conversation (the system prompt is kept)
  /stats             statistics of the last reply: speed, acceptance, time split
  /set               show the generation settings
  /set NAME VALUE    change one: temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens,
                     seed (a number or none), draft_tokens (a number, or auto), drafter ({drafters})
  /save FILE         write the whole conversation's messages to FILE as JSON
  /load FILE         continue a conversation /save wrote (its messages replace this one's)
  /exit              leave (so does Ctrl-D)
A message of several lines (code pasted) goes between two lines of three double quotes (\"\"\"; the closing one
from its first column); a message that begins with / is sent as //message. Ctrl-C stops the reply being written; the conversation goes on."""


# -- a reply on a terminal ----------------------------------------------------------------------
# the control characters a model may write that a terminal would act on (an escape sequence retitles it, moves the
# cursor, clears the screen, or on some terminals writes the clipboard): shown as ^[ and the like where the reply
# goes to a terminal; tab, newline and carriage return stay (piped or saved replies are as the model wrote them)
_SHOWN = {c: f"^{chr(c + 64)}" for c in range(32) if c not in (9, 10, 13)} | {127: "^?"} | \
    {c: f"\\x{c:02x}" for c in range(0x80, 0xa0)}


def terminal_safe(text: str) -> str:
    """``text`` with the control characters a terminal acts on shown instead (``^[`` for ESC, ``\\x9b`` for a C1)."""
    return text.translate(_SHOWN)


# -- /set values -------------------------------------------------------------------------------
def _number(kind: type) -> Callable[[str], float | int]:
    def parse(text: str):
        shown = repr(text) if len(text) <= 60 else f"{text[:40]!r}... ({len(text):,} characters)"
        if kind is int and len(text.strip().lstrip("+-")) > 4000 and text.strip().lstrip("+-").isdigit():
            raise ConfigError(f"{shown} is too large")  # (Python refuses to read it: not "not an integer")
        try:
            value = kind(text)
        except ValueError:
            raise ConfigError(f"{shown} is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(value):
            raise ConfigError(f"{shown} is not a finite number")
        return value

    return parse


def _optional_int(none_word: str) -> Callable[[str], int | None]:
    def parse(text: str):
        return None if text.lower() == none_word else _number(int)(text)

    return parse


SETTINGS: dict[str, Callable[[str], object]] = {
    "temperature": _number(float),
    "top_p": _number(float),
    "top_k": _number(int),
    "min_p": _number(float),
    "repetition_penalty": _number(float),
    "max_new_tokens": _number(int),
    "seed": _optional_int("none"),
    "draft_tokens": _optional_int("auto"),
    "drafter": str,  # checked against the engine's drafters (ChatRepl._check_drafter)
}


# -- the loop ----------------------------------------------------------------------------------
class ChatRepl:
    """The read-reply loop. ``options`` are generation keywords (temperature, drafter, ...)."""

    def __init__(self, engine, *, system: str | None = None, options: dict | None = None,
                 show_stats: bool = False, stdin: TextIO | None = None, stdout: TextIO | None = None,
                 stderr: TextIO | None = None, line_limit: int = LINE_LIMIT, template_kwargs: dict | None = None,
                 between: Callable[[], None] | None = None):
        self.engine = engine
        self.between = between or (lambda: None)  # called at each token of a reply and before each line is read
        self.line_limit = line_limit
        self._skipping = False  # piped: the rest of a line too long is still to be skipped
        self.options = self._checked({k: v for k, v in (options or {}).items() if v is not None})
        self.session = engine.chat(system=system, template_kwargs=template_kwargs)
        self._check_start(system)
        self.failed = 0  # turns and commands that ended in an error: piped input then exits 1
        self.show_stats = show_stats
        self.stdin = stdin or sys.stdin
        if self.stdin is None:  # (`<&-`)
            raise ConfigError("edgespec chat reads the conversation from stdin, which is closed")
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        # input() gives line editing and a prompt only on the process's own terminal
        self.interactive = self.stdin is sys.stdin and self.stdin.isatty()
        try:  # (a reply's control characters are shown, not acted on, where they reach a terminal)
            self._tty = bool(self.stdout.isatty())
        except (AttributeError, ValueError):
            self._tty = False

    def _check_start(self, system: str | None) -> None:
        """What would fail every turn is refused before the first: a chat template that does not
        render, a system prompt that leaves the context no room for a question and a reply."""
        from .errors import ContextOverflowError

        msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": "hi"}]
        n = len(self.engine.encode(msgs, template_kwargs=self.session.template_kwargs))
        room = self.session.room(self.options.get("max_new_tokens") or self.engine.defaults.max_new_tokens)
        if n + room > self.engine.max_context:  # (each turn keeps that room for its reply: every one failed)
            raise ContextOverflowError(f"the system prompt and a one-word question take {n} tokens and each reply "
                                       f"keeps {room} free; the context holds {self.engine.max_context}")

    # -- output --------------------------------------------------------------------------------
    def _out(self, text: str) -> None:
        self.stdout.write(terminal_safe(text) if self._tty else text)
        self.stdout.flush()

    def _note(self, text: str) -> None:
        self.stderr.write(text + "\n")
        self.stderr.flush()

    def _error(self, text: str) -> None:
        self.failed += 1
        self._note(f"error: {text}")

    # -- input ---------------------------------------------------------------------------------
    def _read_block(self) -> str | None:
        """A message of several lines: those after a line of three double quotes up to the next line that is three
        double quotes from its first column, kept as they were typed (indentation included; an indented line of
        three quotes too), at most ``line_limit`` bytes in all; None where the input ends
        first (the block is dropped). Ctrl-C on a terminal drops the block (``KeyboardInterrupt``)."""
        lines, size, error = [], 0, None
        while True:
            try:
                line = self._read(MORE, in_block=True)
            except ContextOverflowError as e:  # a line too long: the block is read to its end, then dropped
                error = error or e
                continue
            if line is None:
                return None
            line = line.removesuffix("\n").removesuffix("\r")  # (piped CRLF input: the \r was kept in the block)
            # the block ends at a line that begins with the three quotes: an indented one (a docstring's end in
            # pasted code) is the code's (it cut a pasted function into three messages before session 54)
            if line.rstrip() == BLOCK:
                if error is not None:
                    raise error
                return "\n".join(lines)
            size += _utf8_len(line) + 1
            if size > self.line_limit:
                error, lines = error or self._too_long("a message"), []
            elif error is None:
                lines.append(line)

    def _read(self, prompt: str = PROMPT, in_block: bool = False) -> str | None:
        """The next line, or None at end of input (Ctrl-D). A line over ``line_limit`` bytes is a
        ``ContextOverflowError``; piped, the rest of it is skipped up to the next newline, so that
        reading never holds more than one bounded line (a stream without newlines: /dev/zero)."""
        if not self.interactive:
            while self._skipping:  # the rest of a line too long, read and dropped a bounded chunk at a time
                rest = self.stdin.readline(1 << 20)
                self._skipping = bool(rest) and not rest.endswith("\n")
            line = self.stdin.readline(self.line_limit + 1)  # characters: at least as many bytes
            if not line:
                return None
            if len(line) > self.line_limit and not line.endswith("\n"):
                self._skipping = True  # (after the error is shown: a stream without newlines never ends)
                raise self._too_long()
            self._check_length(line.removesuffix("\n"))
            return line
        while True:
            try:
                line = input(prompt)
            except EOFError:
                self._out("\n")
                return None
            except KeyboardInterrupt:  # Ctrl-C at the prompt drops the line, like a shell (in a block: the block)
                self._out("\n")
                if in_block:
                    raise
                continue
            self._check_length(line)
            return line

    def _check_length(self, line: str) -> None:
        if len(line) * 4 > self.line_limit and _utf8_len(line) > self.line_limit:  # (a char is 1-4 bytes)
            raise self._too_long()

    def _too_long(self, what: str = "a line") -> ContextOverflowError:
        limit = f"{self.line_limit >> 20} MiB" if self.line_limit >= 1 << 20 else f"{self.line_limit} bytes"
        if what != "a line":
            return ContextOverflowError(f"{what} is longer than {limit}: dropped")
        return ContextOverflowError(f"a line is longer than {limit}: "
                                    + ("dropped" if self.interactive else "skipped up to the next newline"))

    def _exit_code(self) -> int:
        """Piped input that met an error exits 1 (at its end or at /exit alike); a terminal's session 0."""
        return 1 if self.failed and not self.interactive else 0

    def run(self) -> int:
        restore = _catch_ctrl_c() if self.interactive else None
        try:
            return self._run()
        finally:
            if restore is not None:
                restore()

    def _run(self) -> int:
        if self.interactive:
            _enable_line_editing()
            name = self.engine.manifest.name
            self._note(f"edgespec chat: {name}, {self.engine.max_context} tokens of context. "
                       f"/help lists commands; Ctrl-D leaves.")
        while True:
            self.between()
            try:
                line = self._read()
            except KeyboardInterrupt:  # Ctrl-C while piped input is read: leave quietly
                return 130
            except EdgespecError as e:  # a line too long: refused, the conversation goes on
                self._error(str(e))
                continue
            if line is None:
                return self._exit_code()
            line = line.strip()
            if not line:
                continue
            if line == BLOCK:  # a message of several lines, up to the next line of three double quotes
                try:
                    text = self._read_block()
                except KeyboardInterrupt:
                    self._note("[message dropped]")
                    continue
                except EdgespecError as e:
                    self._error(str(e))
                    continue
                if text is None:  # the input ended inside the block: said, and the exit code says it too
                    self._error('the input ended inside a """ block: its message was not sent')
                    return self._exit_code()
                if text.strip():
                    self.reply(text)
                continue
            if line.startswith("//"):  # a message that begins with a slash
                self.reply(line[1:])
                continue
            if line.startswith("/"):
                try:
                    if not self.command(line):
                        return self._exit_code()
                except KeyboardInterrupt:  # (a /load or /save of a large file: the command is dropped, the
                    self._note("[interrupted]")  # conversation kept as it was; it ended the chat before)
                continue
            self.reply(line)

    # -- a turn --------------------------------------------------------------------------------
    def reply(self, text: str) -> None:
        dropped = self.session.dropped
        try:
            stream = self.session.stream(text, **self.options)
        except EdgespecError as e:  # (refused at the call: a line that is no UTF-8 text, since session 48)
            self._error(str(e))
            return
        parts: list[str] = []
        stopped = False
        try:
            for delta in stream:
                if not parts:
                    self._notice_dropped(dropped)  # before the reply, where it is read
                parts.append(delta)
                self._out(delta)
                self.between()
        except KeyboardInterrupt:
            stopped = True
        except EdgespecError as e:
            if parts:
                self._out("\n")
            self._error(str(e))
            return
        finally:
            stream.close()  # releases the engine; the partial reply stays in the history
        self._out("\n")
        if not parts:
            self._notice_dropped(dropped)
        if stopped:
            self._repair_history(parts)
            self._note("[stopped]")
        elif getattr(self.engine.last_stats, "finish_reason", None) == "context":
            self._note(f"[the reply stopped because the context ({self.engine.max_context} tokens) is full; older "
                       "exchanges are dropped to make room at the next turn]")
        if self.show_stats and self.engine.last_stats is not None:
            self._note(summary(self.engine.last_stats))

    def _notice_dropped(self, before: int) -> None:
        n = self.session.dropped - before
        if n > 0:
            self._note(f"[dropped the {n} oldest exchange(s) to fit the context of {self.engine.max_context} tokens; "
                       "/save still writes them]")

    def _repair_history(self, parts: list[str]) -> None:
        """Ctrl-C can land between recording the question and recording the reply; keep the
        history alternating (user, assistant) so the chat template accepts it."""
        msgs = self.session.messages
        if msgs and msgs[-1]["role"] == "user":
            msgs.append({"role": "assistant", "content": "".join(parts)})

    # -- commands ------------------------------------------------------------------------------
    def command(self, line: str) -> bool:
        """Run a slash command; False means leave."""
        name, _, arg = line[1:].partition(" ")
        arg = arg.strip()
        if name in ("exit", "quit"):
            return False
        if arg and name in ("help", "reset", "stats"):  # ("/reset now" reset without a word about the "now")
            self._error(f"/{name} takes nothing after it (got {arg[:40]!r})")
        elif name == "help":
            self._out(HELP.replace("{drafters}", ", ".join(self._drafter_names())) + "\n")  # (this engine's)
        elif name == "reset":
            self.session.reset()
            self._out("[new conversation]\n")
        elif name == "stats":
            st = self.engine.last_stats
            self._out((report(st) if st is not None else "no reply yet") + "\n")
        elif name == "set":
            self._set(arg)
        elif name == "save":
            self._save(arg)
        elif name == "load":
            self._load(arg)
        else:
            self._error(f"unknown command /{name}; /help lists the commands")
        return True

    def _checked(self, options: dict, key: str | None = None) -> dict:
        """``options`` if the engine takes them, else ``ConfigError``; ``key``: the one /set changed."""
        if options.get("drafter") is not None:
            self._check_drafter(options["drafter"])
        drafter = options.get("drafter") or self.engine.defaults.drafter
        if drafter == "none" and options.get("draft_tokens") is not None:  # (generate's rule; before the engine's own
            # refusal of the pair, which names no /set)
            if key == "drafter":
                raise ConfigError(f"drafter: none drafts nothing, but draft_tokens is {options['draft_tokens']}; "
                                  f"/set draft_tokens auto first")
            if key == "draft_tokens":
                raise ConfigError(f"draft_tokens: the drafter is none{'' if 'drafter' in options else ' (the default)'}"
                                  f", so nothing is drafted; /set drafter first")
            raise ConfigError(f"draft_tokens with drafter none{'' if 'drafter' in options else ' (the default)'}: "
                              f"nothing is drafted; give one of them")
        self.engine.config(**options)  # raises ConfigError on a bad value
        return options

    def _drafter_names(self) -> list[str]:
        """The drafters this chat takes: those the engine has loaded and auto and none, but not
        prediction (it drafts from a request's predicted output, which a chat has none of)."""
        loaded = self.engine.decoder.drafters
        return [d for d in drafter_choices() if d != "prediction" and (d in ("auto", "none") or d in loaded)]

    def _check_drafter(self, name: str) -> None:
        names = self._drafter_names()
        if name in names:
            return
        if name == "prediction":
            why = "prediction drafts from a request's predicted output (generate --prediction), which chat has none of"
        elif name in drafter_choices():  # known but not loaded: the engine says why (no drafter model, ...)
            why = getattr(self.engine.decoder, "unavailable", {}).get(name) or f"no {name} drafter is loaded"
        else:
            raise ConfigError(f"drafter: {name!r} is not one of {', '.join(names)}")
        raise ConfigError(f"drafter: {why}; the drafters available: {', '.join(names)}")

    def _set(self, arg: str) -> None:
        if not arg:
            cfg = self.engine.config(**self.options)
            shown = ", ".join(f"{k}={getattr(cfg, k)}" for k in SETTINGS)
            self._out(shown.replace("draft_tokens=None", "draft_tokens=auto") + "\n")
            return
        key, _, value = arg.partition(" ")
        value = value.strip()
        if key not in SETTINGS:
            self._error(f"/set knows {', '.join(SETTINGS)}; not {key!r}")
            return
        if not value:
            self._error(f"/set {key} needs a value")
            return
        try:
            parsed = SETTINGS[key](value)
            self.options = self._checked({**self.options, key: parsed}, key)
        except ConfigError as e:
            message = str(e)
            self._error(message if message.startswith(key) else f"{key}: {message}")
            return
        self._out(f"{key} = {'auto' if parsed is None and key == 'draft_tokens' else parsed}\n")

    def _load(self, arg: str) -> None:
        """Replace the conversation with the one a /save wrote to ``arg`` (its system prompt too); a file that is
        not one, or a conversation the chat template refuses, is an error that changes nothing."""
        if not arg:
            self._error("/load needs a file name")
            return
        path = os.path.expanduser(arg)
        shown = _shown(path)
        if "\0" in path or not os.path.isfile(path):
            self._error(f"cannot read {shown}: " + ("no such file" if not os.path.lexists(path) and "\0" not in path
                                                    else "not a file /save wrote"))
            return
        messages = _read_conversation(path)
        if messages is None or any(m["role"] not in ("system", "user", "assistant") or not isinstance(m["content"], str)
                                   for m in messages):
            self._error(f"{shown} is not a conversation /save wrote (a JSON list of {{role, content}} messages)")
            return
        turns = [m["role"] for m in messages[1 if messages and messages[0]["role"] == "system" else 0:]]
        if turns != ["user", "assistant"] * (len(turns) // 2):
            # (what /save writes; the history is cut an exchange at a time when it outgrows the context, and a next
            # turn follows an answer: a trailing question made user, user, assistant, which /load then refused)
            self._error(f"{shown}: the messages after the system prompt must alternate user, assistant, ..., ending "
                        "with an answer, as /save writes them")
            return
        system = messages[0]["content"] if messages and messages[0]["role"] == "system" else None
        try:
            if messages:
                # the chat template takes it (its roles in an order it allows)
                self.engine.encode(messages, template_kwargs=self.session.template_kwargs)
            self._check_start(system)  # (a system prompt that leaves no room for a turn: every turn would fail)
        except EdgespecError as e:
            self._error(f"{shown}: {str(e).splitlines()[0]}")
            return
        self.session.messages = messages
        self.session.system = system
        self.session.dropped = 0
        self.session.earlier = []
        self._out(f"[loaded {len(messages)} messages from {shown}]\n")

    def _save(self, arg: str) -> None:
        if not arg:
            self._error("/save needs a file name")
            return
        path = os.path.expanduser(arg)  # ~/chat.json, as a shell would
        shown = _shown(path)
        if "\0" in path:
            self._error(f"cannot write {shown}: a file name cannot hold a NUL byte")
            return
        # (a link to no file yet is written through, as a link to one is: it was refused as "exists"; session 92)
        if os.path.exists(path) and not _is_conversation(path):
            self._error(f"{shown} exists and is not a conversation /save wrote; give another name")
            return
        # whole or not at all (a full disk leaves the file as it was): written beside it under a short
        # hidden name, never longer than a legal one, then renamed over it; through a symbolic link, the file it
        # names is written (the link stays), and the file keeps its mode (a new one is the user's only, as the
        # prompt cache and the memory store are: a conversation is private; the rename left 0644 over a 0600)
        if os.path.islink(path):
            path = os.path.realpath(path)
        # the whole conversation, the exchanges dropped to fit the context too (before session 55, only what the
        # model still saw: a long chat's /save lost its beginning)
        transcript = self.session.transcript
        tmp = os.path.join(os.path.dirname(path), f".edgespec-save-{os.getpid()}-{secrets.token_hex(4)}.tmp")
        made = False
        try:
            try:
                mode = stat.S_IMODE(os.stat(path).st_mode)
            except OSError:
                mode = 0o600
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            made = True
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                os.fchmod(f.fileno(), mode)
                json.dump(transcript, f, indent=2, ensure_ascii=False)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as e:  # Ctrl-C mid-write too: no temporary file left behind
            if made:
                try:
                    os.unlink(tmp)
                except (OSError, ValueError):
                    pass
            if not isinstance(e, (OSError, ValueError)):  # (ValueError: a name or text the system cannot take)
                raise
            why = (e.strerror or str(e)) if isinstance(e, OSError) else str(e)
            self._error(f"cannot write {shown}: {why}")
            return
        self._out(f"[saved {len(transcript)} messages to {shown}]\n")


def _shown(path: str) -> str:
    """A file name for a one-line message: as typed, or quoted with escapes if it holds control characters."""
    return path if path.isprintable() else ascii(path)


def _utf8_len(text: str) -> int:
    """Bytes of ``text`` in UTF-8 (a byte that was not UTF-8, read with surrogateescape, counts as one)."""
    try:
        return len(text.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        return len(text.encode("utf-8", "surrogatepass"))


def _is_conversation(path: str) -> bool:
    """Whether ``path`` holds what /save writes (a JSON list of {role, content}), so that saving
    again may replace it; any other file is left alone."""
    return _read_conversation(path) is not None


def _read_conversation(path: str) -> list[dict] | None:
    """The messages of a file /save wrote (a JSON list of {role, content}, at most 256 MiB), else None."""
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > 256 << 20:
            return None
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, RecursionError):
        return None
    if isinstance(data, list) and all(isinstance(m, dict) and set(m) == {"role", "content"} for m in data):
        return data
    return None


# -- statistics --------------------------------------------------------------------------------
def summary(st: Stats) -> str:
    """One line for stderr after a reply."""
    return (f"[{st.new_tokens} tokens, {st.tokens_per_second:.1f} tok/s, prefill {st.prefill_ms:.0f} ms "
            f"({st.prompt_tokens - st.reused_prompt_tokens} new prompt tokens, {st.reused_prompt_tokens} reused), "
            f"acceptance {st.acceptance_rate:.2f}, {st.tokens_per_target_call:.2f} tokens/target call]")


def report(st: Stats) -> str:
    """The last reply's statistics for ``/stats``."""
    drafters = ", ".join(f"{k} {v}" for k, v in sorted(st.rounds_by_drafter.items())) or "-"
    return "\n".join([
        f"last reply: {st.new_tokens} tokens in {st.total_s:.2f} s, {st.tokens_per_second:.1f} tok/s, "
        f"finish: {st.finish_reason or 'stopped'}",
        f"prompt: {st.prompt_tokens} tokens, {st.reused_prompt_tokens} reused from the cached conversation"
        + (f" ({st.restored_prompt_tokens} of them from the prompt cache)" if st.restored_prompt_tokens else "")
        + f", prefill {st.prefill_ms:.0f} ms",
        f"drafting: acceptance {st.acceptance_rate:.2f} ({st.accepted}/{st.drafted} drafted tokens), "
        f"{st.tokens_per_target_call:.2f} tokens per target call, rounds by drafter: {drafters}",
        f"time: draft {st.draft_s:.3f} s, target {st.target_s:.3f} s, other {st.other_s:.3f} s",
    ])


def _enable_line_editing() -> None:
    """Importing ``readline`` gives ``input()`` line editing and a history of typed lines."""
    try:
        import readline  # noqa: F401
    except ImportError:  # not on every platform (Windows); plain input() still works
        pass


def _catch_ctrl_c():
    """Ctrl-C on the terminal stops a reply or drops a line even where the process was started with
    SIGINT ignored (a non-interactive shell's background job: ``cmd &`` in a script), which Python
    otherwise keeps, so Ctrl-C would do nothing at all. Only in the main thread (signal's rule).
    Returns what puts the ignoring back (the REPL used as a library), or None."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
        return None
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_chat(engine, **kw) -> int:
    return ChatRepl(engine, **kw).run()
