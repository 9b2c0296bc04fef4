"""``edgespec chat`` used the way a person uses it: in a pseudo-terminal, typing, pressing Ctrl-C and
Ctrl-D; and with piped input. Every wait is bounded."""
from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[=>]")
PROMPT = "you> "
START_S = 180  # generous: CI machines are slow and may be busy
REPLY_S = 120

# Make the pty the child's controlling terminal, so that typing Ctrl-C sends it SIGINT, then run the CLI.
_CTTY = ("import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
         "os.execv(sys.executable, [sys.executable, '-m', 'edgespec.cli'] + sys.argv[1:])")


def _env() -> dict:
    env = dict(os.environ, TERM="dumb", PYTHONIOENCODING="utf-8", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


class Terminal:
    """A child process on a pseudo-terminal; ``expect`` reads its screen output until a pattern."""

    def __init__(self, args: list[str]):
        master, slave = pty.openpty()
        self.proc = subprocess.Popen([sys.executable, "-c", _CTTY, *args], stdin=slave, stdout=slave,
                                     stderr=slave, start_new_session=True, env=_env(), cwd=ROOT)
        os.close(slave)
        self.fd = master
        self.screen = ""  # everything the child wrote, escapes and carriage returns removed
        self.pos = 0  # how far expect() has consumed

    def _pump(self, timeout: float) -> bool:
        """Read what is available within ``timeout``; False once the child has closed the terminal."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return True
        try:
            data = os.read(self.fd, 65536)
        except OSError:  # EIO: the child exited and the slave side is closed
            return False
        if not data:
            return False
        self.screen += ANSI.sub("", data.decode("utf-8", "replace")).replace("\r", "")
        return True

    def expect(self, pattern: str, timeout: float) -> re.Match:
        """Wait for ``pattern`` (regex) after what was consumed; consume through the match."""
        rx = re.compile(pattern, re.S)
        deadline = time.monotonic() + timeout
        while True:
            m = rx.search(self.screen, self.pos)
            if m:
                self.pos = m.end()
                return m
            left = deadline - time.monotonic()
            if left <= 0 or not self._pump(min(left, 0.5)) and not rx.search(self.screen, self.pos):
                tail = self.screen[self.pos:][-2000:]
                raise AssertionError(f"no {pattern!r} within {timeout}s (exit {self.proc.poll()}); output:\n{tail}")

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())

    def blocked_reading(self, timeout: float = 30) -> None:
        """Wait until the program's main thread sleeps in select/poll (readline waiting for a key), read from
        /proc/PID/wchan; where the kernel does not say (an empty or "0" wchan), wait 0.3 s instead."""
        deadline, seen = time.monotonic() + timeout, ""
        while time.monotonic() < deadline:
            try:
                state = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
                seen = Path(f"/proc/{self.proc.pid}/wchan").read_text()
            except (OSError, IndexError):
                state, seen = "S", ""
            if state == "S":  # asleep (a running task's wchan is "0" too)
                if seen in ("", "0"):
                    time.sleep(0.3)
                    return
                if "poll" in seen or "select" in seen:
                    return
            time.sleep(0.02)
        raise AssertionError(f"the program never waited for a key within {timeout}s (wchan {seen!r})")

    def say(self, line: str, timeout: float = REPLY_S) -> str:
        """Type a line at the prompt and return what the program printed before the next prompt."""
        self.type(line + "\r")
        self.expect(re.escape(line) + r"\n", 30)  # the terminal echoes the typed line
        return self.expect(r"(.*?)" + re.escape(PROMPT), timeout).group(1)

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            self._pump(0.2)
        return self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        os.close(self.fd)


@pytest.fixture
def terminal():
    made: list[Terminal] = []

    def start(*args: str) -> Terminal:
        t = Terminal(list(args))
        made.append(t)
        return t

    yield start
    for t in made:
        t.close()


@pytest.mark.real
@pytest.mark.slow
def test_chat_in_a_terminal(smol_int4, terminal):
    t = terminal("chat", str(smol_int4), "--max-new-tokens", "300")
    t.expect(re.escape(PROMPT), START_S)

    # a long reply, streamed: text shows up while it is still being written, and Ctrl-C stops it
    question = "Count from 1 to 200, separated by commas."
    t.type(question + "\r")
    t.expect(re.escape(question) + r"\n", 30)
    t.expect(r"\S.{15}", REPLY_S)  # the first words of the reply, before it is finished
    t.type("\x03")
    before_stop = t.expect(r"(.*?)\[stopped\]", 60).group(1)
    assert PROMPT not in before_stop, "the reply had finished before Ctrl-C"
    t.expect(re.escape(PROMPT), 30)

    # the conversation goes on, and reuses the cached conversation
    reply = t.say("What is the capital of France?")
    assert reply.strip(), "no reply after Ctrl-C"
    stats = t.say("/stats")
    for word in ("tok/s", "acceptance", "draft", "target", "other"):
        assert word in stats, stats
    m = re.search(r"prompt: (\d+) tokens, (\d+) reused", stats)
    assert m, stats
    prompt_tokens, reused = int(m.group(1)), int(m.group(2))
    assert 0 < reused < prompt_tokens, stats  # only the new turn was prefilled

    assert "temperature = 0.5" in t.say("/set temperature 0.5")
    assert "max_new_tokens = 30" in t.say("/set max_new_tokens 30")
    err = t.say("/set temperature abc")
    assert re.search(r"error: temperature: 'abc' is not a number", err), err
    assert "temperature=0.5" in t.say("/set")  # the bad value changed nothing
    assert t.say("Say hello.").strip()  # the session is still alive

    t.type("/exit\r")
    assert t.wait(60) == 0


def test_ctrl_c_at_prompt_and_ctrl_d(tiny_bundle, terminal):
    t = terminal("chat", str(tiny_bundle), "--max-new-tokens", "8")
    t.expect(re.escape(PROMPT), START_S)
    # Ctrl-C at the prompt drops the line, the program stays. Type the line first and wait for its
    # echo: a SIGINT that lands between readline printing the prompt and it blocking on the terminal
    # is only seen at the next key press (CPython's readline loop), which no person is quick enough
    # to hit, but a test writing straight after the prompt is; then wait until it blocks again.
    t.type("half a line")
    t.expect("half a line", 30)
    t.blocked_reading()
    t.type("\x03")
    t.expect(re.escape(PROMPT), 30)
    t.say("hello")  # a reply (a tiny random model's may be blank), then the prompt again
    t.type("\x04")  # Ctrl-D leaves
    assert t.wait(60) == 0


def _piped(bundle, text: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgespec.cli", "chat", str(bundle), *args], input=text,
                          capture_output=True, text=True, timeout=START_S, env=_env(), cwd=ROOT)


def test_piped_save_and_reset(tiny_bundle, tmp_path):
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    script = f"hello there\n/save {before}\n/reset\n/save {after}\nthe quick brown fox\n/stats\n"
    r = _piped(tiny_bundle, script, "--system", "You are terse.", "--max-new-tokens", "12", "--stats")
    assert r.returncode == 0, r.stderr
    saved = json.loads(before.read_text())
    assert [m["role"] for m in saved] == ["system", "user", "assistant"]
    assert saved[0]["content"] == "You are terse." and saved[1]["content"] == "hello there"
    assert json.loads(after.read_text()) == [{"role": "system", "content": "You are terse."}]
    assert "[new conversation]" in r.stdout
    assert PROMPT not in r.stdout  # no prompts without a terminal
    # statistics: one line per reply on stderr (--stats), the full report on stdout only for /stats
    assert r.stderr.count("tok/s") == 2
    assert r.stdout.count("tok/s") == 1 and "prompt:" in r.stdout


def test_piped_errors_keep_the_session(tiny_bundle, tmp_path):
    script = ("/set top_p 2\n/set drafter sometimes\n/set draft_tokens auto\n/set nonsense 1\n/bogus\n"
              f"/save {tmp_path}/no/such/dir/x.json\nhello\n")
    r = _piped(tiny_bundle, script, "--max-new-tokens", "5")
    assert r.returncode == 1, r.stderr  # the session went on, but piped input that met errors says so
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith(("error", "unknown"))]
    assert len(lines) == 5, r.stderr
    assert "top_p" in lines[0] and "drafter" in lines[1] and "nonsense" in lines[2]
    assert "/bogus" in lines[3] and "cannot write" in lines[4]
    assert "draft_tokens = auto" in r.stdout


def test_save_never_clobbers_another_file(tiny_bundle, tmp_path):
    other, conv = tmp_path / "notes.txt", tmp_path / "conv.json"
    other.write_text("my notes\n")
    r = _piped(tiny_bundle, f"hello\n/save {other}\n/save {conv}\nagain\n/save {conv}\n", "--max-new-tokens", "4")
    assert r.returncode == 1 and "exists and is not a conversation" in r.stderr, r.stderr
    assert other.read_text() == "my notes\n"  # untouched
    assert [m["role"] for m in json.loads(conv.read_text())] == ["user", "assistant"] * 2  # a save replaces a save
    assert not list(tmp_path.glob("*.tmp-*"))


def test_what_would_fail_every_turn_is_refused_at_start(tiny_bundle, tiny_llama_bundle):
    r = _piped(tiny_llama_bundle, "hello\n", "--drafter", "model")  # a bundle without a drafter model
    assert r.returncode == 2 and "no drafter model" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = _piped(tiny_bundle, "hello\n", "--system", "word " * 400, "--max-context", "64")
    assert r.returncode == 3 and "system prompt" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = _piped(tiny_bundle, "/set drafter model\nhello\n", "--max-new-tokens", "3")
    assert r.returncode == 0, r.stderr  # this one has a drafter model


def test_bad_option_is_a_one_line_error(tiny_bundle):
    r = _piped(tiny_bundle, "hello\n", "--temperature", "-1")
    assert r.returncode == 2 and "temperature" in r.stderr and "Traceback" not in r.stderr


def test_chat_never_imports_torch(tiny_bundle):
    code = ("import sys; from edgespec.cli import main; "
            "rc = main(['chat', sys.argv[1], '--max-new-tokens', '4'], standalone_mode=False); "
            "bad = [m for m in ('torch', 'transformers', 'edgespec_export') if m in sys.modules]; "
            "sys.exit(f'imported {bad}' if bad else rc)")
    r = subprocess.run([sys.executable, "-c", code, str(tiny_bundle)], input="hello\n", capture_output=True,
                       text=True, timeout=START_S, env=_env(), cwd=ROOT)
    assert r.returncode == 0, r.stderr
