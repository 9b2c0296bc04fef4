"""``edgespec chat`` used the way a person uses it: in a pseudo-terminal, typing, pressing Ctrl-C and
Ctrl-D; and with piped input. Every wait is bounded."""
from __future__ import annotations

import io
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


def _piped(bundle, text: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgespec.cli", "chat", str(bundle), *args], input=text,
                          capture_output=True, text=True, timeout=START_S, env={**_env(), **(env or {})}, cwd=ROOT)


def _errors(stderr: str) -> list[str]:
    """stderr's error lines; every line of it is one (no traceback, no continuation lines)."""
    assert "Traceback" not in stderr, stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert all(ln.startswith("error: ") for ln in lines), stderr
    return lines


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


def test_commands_that_take_nothing_refuse_what_follows_them(tiny_bundle, tmp_path):
    """(session 64, a review) "/reset now" reset the conversation and "/help extra" printed the list without a word
    about what followed them: refused now, the conversation kept (piped input then exits 1)."""
    saved = tmp_path / "s.json"
    r = _piped(tiny_bundle, f"hello there\n/reset now\n/help extra\n/stats please\n/save {saved}\n",
               "--max-new-tokens", "6", "--no-memory")
    assert r.returncode == 1
    assert _errors(r.stderr) == ["error: /reset takes nothing after it (got 'now')",
                                      "error: /help takes nothing after it (got 'extra')",
                                      "error: /stats takes nothing after it (got 'please')"]
    assert [m["content"] for m in json.loads(saved.read_text())][:1] == ["hello there"]  # (not reset)
    assert "[new conversation]" not in r.stdout and "commands:" not in r.stdout


def test_save_after_dropped_exchanges_writes_the_whole_conversation(tiny_bundle, tmp_path):
    """(session 55) A chat that outgrew its context dropped its oldest exchanges, and /save wrote only what the
    model still saw: the conversation's beginning was lost. /save writes them all; /load of that file continues
    it (the next turn drops again, with the notice) and /save after it still writes every exchange."""
    saved, again = tmp_path / "all.json", tmp_path / "again.json"
    questions = [f"question {i} about the quick brown fox" for i in range(10)]
    r = _piped(tiny_bundle, "\n".join(questions) + f"\n/save {saved}\n", "--system", "Be terse.",
               "--max-context", "128", "--max-new-tokens", "8", "--no-memory")
    assert r.returncode == 0, r.stderr
    assert "oldest exchange(s)" in r.stdout + r.stderr  # the context did overflow
    whole = json.loads(saved.read_text())
    assert whole[0] == {"role": "system", "content": "Be terse."}
    assert [m["content"] for m in whole[1::2]] == questions
    assert [m["role"] for m in whole[1:]] == ["user", "assistant"] * len(questions)
    r = _piped(tiny_bundle, f"/load {saved}\none more\n/save {again}\n", "--max-context", "128",
               "--max-new-tokens", "8", "--no-memory")
    assert r.returncode == 0, r.stderr
    assert [m["content"] for m in json.loads(again.read_text())[1::2]] == questions + ["one more"]


@pytest.mark.parametrize("sig", ["SIGHUP", "SIGTERM"])
def test_a_closed_terminal_or_sigterm_writes_the_prompt_cache_file(tiny_bundle, tmp_path, sig):
    """(session 48, a review) SIGHUP (the terminal closed) or SIGTERM ended the chat at once: its prompt cache file,
    written when the engine closes, was lost. They end it as the end of input does now, with 128 + the signal."""
    import signal

    f = tmp_path / "pc.bin"
    proc = subprocess.Popen([sys.executable, "-m", "edgespec.cli", "chat", str(tiny_bundle), "--max-new-tokens", "8",
                             "--no-memory", "--stats", "--prompt-cache-file", str(f)], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=_env(), cwd=ROOT,
                            # (the signal back to its default in the child: a suite run under nohup inherits SIGHUP
                            # ignored, which the chat leaves as it is, so it never ended)
                            preexec_fn=lambda: signal.signal(getattr(signal, sig), signal.SIG_DFL))
    try:
        proc.stdin.write("tell me about cats and dogs and their long history together\n")
        proc.stdin.flush()
        line = proc.stderr.readline()  # the reply's statistics: the turn is over
        assert "tok/s" in line, line
        proc.send_signal(getattr(signal, sig))
        assert proc.wait(timeout=REPLY_S) == 128 + getattr(signal, sig)
    finally:
        proc.kill()
        proc.wait()
    assert f.is_file() and f.stat().st_size > 0


def test_piped_errors_keep_the_session(tiny_bundle, tmp_path):
    script = ("/set top_p 2\n/set drafter sometimes\n/set draft_tokens auto\n/set nonsense 1\n/bogus\n"
              f"/save {tmp_path}/no/such/dir/x.json\n/set min_p 3\n/set min_p 0.2\nhello\n")
    r = _piped(tiny_bundle, script, "--max-new-tokens", "5")
    assert r.returncode == 1, r.stderr  # the session went on, but piped input that met errors says so
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith(("error", "unknown"))]
    assert len(lines) == 6, r.stderr
    assert "top_p" in lines[0] and "drafter" in lines[1] and "nonsense" in lines[2]
    assert "/bogus" in lines[3] and "cannot write" in lines[4] and "min_p must be in [0, 1]" in lines[5]
    assert "draft_tokens = auto" in r.stdout and "min_p = 0.2" in r.stdout


def test_save_never_clobbers_another_file(tiny_bundle, tmp_path):
    other, conv = tmp_path / "notes.txt", tmp_path / "conv.json"
    other.write_text("my notes\n")
    r = _piped(tiny_bundle, f"hello\n/save {other}\n/save {conv}\nagain\n/save {conv}\n", "--max-new-tokens", "4")
    assert r.returncode == 1 and "exists and is not a conversation" in r.stderr, r.stderr
    assert other.read_text() == "my notes\n"  # untouched
    assert [m["role"] for m in json.loads(conv.read_text())] == ["user", "assistant"] * 2  # a save replaces a save
    assert sorted(os.listdir(tmp_path)) == ["conv.json", "notes.txt"]  # no temporary file left


def test_save_a_name_with_a_nul_byte_is_an_error(tiny_bundle, tmp_path):
    # a NUL byte cannot be in a file name: one error line, and the conversation survives to be saved
    r = _piped(tiny_bundle, f"hello\n/save {tmp_path}/a\0b.json\n/save {tmp_path}/ok.json\n", "--max-new-tokens", "3")
    assert r.returncode == 1, r.stderr
    (line,) = _errors(r.stderr)
    assert line.startswith("error: cannot write ") and "NUL" in line, line
    assert [m["role"] for m in json.loads((tmp_path / "ok.json").read_text())] == ["user", "assistant"]
    assert os.listdir(tmp_path) == ["ok.json"]


def test_save_a_long_name_and_a_home_path(tiny_bundle, tmp_path):
    # a legal 255-byte name (the temporary file's name must not be longer), and ~ as a shell expands it
    home = tmp_path / "home"
    home.mkdir()
    long_name = "a" * 250 + ".json"
    r = _piped(tiny_bundle, f"hello\n/save {tmp_path}/{long_name}\n/save ~/x.json\n", "--max-new-tokens", "3",
               env={"HOME": str(home)})
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr
    for saved in (tmp_path / long_name, home / "x.json"):
        assert [m["content"] for m in json.loads(saved.read_text())][0] == "hello"
    assert f"[saved 2 messages to {home / 'x.json'}]" in r.stdout
    assert sorted(os.listdir(tmp_path)) == sorted([long_name, "home"])  # no temporary file left
    assert not [n for n in os.listdir(home) if n.startswith(".edgespec-save")]  # (home holds edgespec's .cache too)


def test_save_keeps_the_files_mode_and_writes_through_a_link(tiny_bundle, tmp_path):
    """(session 47, a review) /save renamed a new file over the old one: a conversation the user had made private
    (0600) became 0644, and a symbolic link to one became a file of its own, the file it named left as it was. A
    new conversation file is the user's only, as the prompt cache and the memory store are."""
    private, real, link = tmp_path / "p.json", tmp_path / "real.json", tmp_path / "link.json"
    r = _piped(tiny_bundle, f"hello\n/save {private}\n/save {real}\n", "--max-new-tokens", "3")
    assert r.returncode == 0, r.stderr
    assert (private.stat().st_mode & 0o777) == 0o600
    real.chmod(0o640)
    link.symlink_to(real)
    r = _piped(tiny_bundle, f"hello\n/save {private}\nagain\n/save {link}\n", "--max-new-tokens", "3")
    assert r.returncode == 0, r.stderr
    assert link.is_symlink() and len(json.loads(real.read_text())) == 4 and (real.stat().st_mode & 0o777) == 0o640
    assert (private.stat().st_mode & 0o777) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["link.json", "p.json", "real.json"]
    # (session 92, a review) a link to no file yet is written through too: it was refused as a file that "exists"
    dangling = tmp_path / "later.json"
    dangling.symlink_to(tmp_path / "new.json")
    r = _piped(tiny_bundle, f"hello\n/save {dangling}\n", "--max-new-tokens", "3")
    assert r.returncode == 0 and not _errors(r.stderr), r.stderr
    assert dangling.is_symlink() and json.loads((tmp_path / "new.json").read_text())[0]["content"] == "hello"
    assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o600


LINE_LIMIT = 64 << 20  # the CLI's STDIN_LIMIT: bytes of one line


def test_a_line_too_long_is_skipped_and_the_chat_goes_on(tiny_bundle, tmp_path):
    conv = tmp_path / "conv.json"
    over = "x" * (LINE_LIMIT + 5)  # no newline within the limit
    wide = "\u00e9" * (LINE_LIMIT // 2 + 1)  # fewer characters than the limit, more bytes (2 each)
    script = f"hello\n{over}\nmore\n{wide}\n/save {conv}\n{over}"  # the last one ends the input, no newline
    r = _piped(tiny_bundle, script, "--max-new-tokens", "3")
    assert r.returncode == 1, r.stderr[-2000:]
    errors = _errors(r.stderr)
    assert errors == ["error: a line is longer than 64 MiB: skipped up to the next newline"] * 3, errors
    assert [m["content"] for m in json.loads(conv.read_text()) if m["role"] == "user"] == ["hello", "more"]


def test_a_stream_without_newlines_is_refused_in_bounded_memory(tiny_bundle):
    # /dev/zero never ends a line: the error shows once a line's worth is read, and memory stays bounded
    # (a 3 GiB address-space limit: the unbounded read ran out of memory with a traceback)
    import resource

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))

    with open(os.devnull if not os.path.exists("/dev/zero") else "/dev/zero", "rb") as zero:
        # (two malloc arenas: glibc reserves 64 MiB of address space for each of up to 8 a core, which on a
        # many-core machine alone would pass the limit)
        proc = subprocess.Popen([sys.executable, "-m", "edgespec.cli", "chat", str(tiny_bundle)], stdin=zero,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env={**_env(), "MALLOC_ARENA_MAX": "2"}, cwd=ROOT, preexec_fn=limit_memory)
    try:
        first = proc.stderr.readline().decode()  # (the chat prints nothing else on stderr before it)
        assert first == "error: a line is longer than 64 MiB: skipped up to the next newline\n", first
        time.sleep(1)
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]  # still reading, not dead of memory
    finally:
        proc.kill()
        proc.wait(timeout=30)
        proc.stderr.close()


def test_piped_errors_exit_1_at_exit_as_at_end_of_input(tiny_bundle):
    for script, code in (("/bogus\n/exit\n", 1), ("/bogus\n", 1), ("/help\n/exit\nhello\n", 0)):
        r = _piped(tiny_bundle, script, "--max-new-tokens", "3")
        assert r.returncode == code, (script, r.returncode, r.stderr)
    assert "commands:" in r.stdout and not r.stderr  # /exit left before the last line was read


def test_draft_tokens_with_drafter_none_is_refused(tiny_bundle):
    args = ("--drafter", "none", "--draft-tokens", "3")
    r = _piped(tiny_bundle, "hello\n", *args)
    g = subprocess.run([sys.executable, "-m", "edgespec.cli", "generate", str(tiny_bundle), "-p", "hi", *args],
                       capture_output=True, text=True, timeout=START_S, env=_env(), cwd=ROOT)
    assert r.returncode == g.returncode == 2 and r.stderr == g.stderr, (r.stderr, g.stderr)  # generate's words
    assert _errors(r.stderr) == ["error: --draft-tokens with --drafter none: nothing is drafted; give one of them"]
    assert not r.stdout  # refused at start: no reply
    # /set refuses the pair in either order and changes nothing
    script = ("/set drafter none\n/set draft_tokens 3\n/set\n"
              "/set drafter auto\n/set draft_tokens 3\n/set drafter none\n/set\n")
    r = _piped(tiny_bundle, script)
    assert r.returncode == 1, r.stderr
    first, second = _errors(r.stderr)
    assert first.startswith("error: draft_tokens: ") and "none" in first, first
    assert second.startswith("error: drafter: ") and "draft_tokens" in second, second
    shown = [ln for ln in r.stdout.splitlines() if ln.startswith("temperature=")]
    assert "draft_tokens=auto, drafter=none" in shown[0] and "draft_tokens=3, drafter=auto" in shown[1], shown


def test_drafters_listed_are_the_ones_set_takes(tiny_bundle, tiny_llama_bundle):
    for bundle in (tiny_llama_bundle, tiny_bundle):  # without and with a drafter model
        r = _piped(bundle, "/set drafter model\n/set drafter prediction\n/set drafter nonsense\n")
        listed = [re.search(r"(?:available:|one of) (.*)$", ln).group(1).split(", ") for ln in _errors(r.stderr)]
        if bundle == tiny_llama_bundle:
            assert len(listed) == 3 and "no drafter model" in r.stderr, r.stderr
        else:
            assert len(listed) == 2 and "drafter = model" in r.stdout, r.stderr  # this one has a drafter model
        names = listed[0]
        assert all(x == names for x in listed) and "prediction" not in names and {"auto", "none"} <= set(names)
        assert ("model" in names) == (bundle == tiny_bundle), names
        r = _piped(bundle, "".join(f"/set drafter {n}\n" for n in names))
        assert r.returncode == 0 and r.stdout.count("drafter = ") == len(names), r.stderr
        # /help lists the same (it listed model on a bundle without one, and never mtp)
        r = _piped(bundle, "/help\n")
        assert re.search(r"drafter \(([^)]*)\)", r.stdout).group(1).split(", ") == names, r.stdout


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


def test_load_continues_a_saved_conversation(tiny_bundle, tmp_path):
    """/load replaces the conversation with one /save wrote (its system prompt too): saving it again gives the
    same messages plus the new exchange; a file that is no conversation, or one the template refuses, is an
    error that changes nothing."""
    saved, again, other = tmp_path / "c.json", tmp_path / "again.json", tmp_path / "notes.txt"
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi there"}]
    saved.write_text(json.dumps(conv))
    other.write_text("not json")
    bad_roles, unordered = tmp_path / "bad.json", tmp_path / "unordered.json"
    bad_roles.write_text(json.dumps([{"role": "wizard", "content": "x"}]))
    unordered.write_text(json.dumps([{"role": "assistant", "content": "x"}, {"role": "user", "content": "y"}]))
    # (session 97, CH42, CH53) a content that is not text; JSON nested past Python's recursion limit (it raised)
    listed, deep = tmp_path / "list.json", tmp_path / "deep.json"
    listed.write_text(json.dumps([{"role": "user", "content": ["a", "list"]}, {"role": "assistant", "content": "x"}]))
    deep.write_text("[" * 100_000 + "]" * 100_000)
    script = (f"/load {other}\n/load {bad_roles}\n/load {tmp_path / 'missing.json'}\n/load {unordered}\n"
              f"/load {listed}\n/load {deep}\n/load {saved}\nhow are you\n/save {again}\n")
    r = _piped(tiny_bundle, script, "--max-new-tokens", "6")
    assert r.returncode == 1  # (piped input that met errors)
    errs = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errs) == 6 and "not a conversation /save wrote" in errs[0] and "bad.json" in errs[1]
    assert "no such file" in errs[2] and "must alternate user, assistant" in errs[3] and "Traceback" not in r.stderr
    assert errs[4:] == [f"error: {f} is not a conversation /save wrote (a JSON list of {{role, content}} messages)"
                        for f in (listed, deep)]
    assert f"[loaded 3 messages from {saved}]" in r.stdout
    got = json.loads(again.read_text())
    assert got[:3] == conv and got[3] == {"role": "user", "content": "how are you"} and got[4]["role"] == "assistant"
    assert other.read_text() == "not json"


def test_load_and_start_keep_room_for_a_turn_and_its_reply(tiny_bundle, tmp_path):
    """(session 45, a review) /load took a conversation ending with a question (the next turn made user, user,
    assistant, which /save wrote and /load then refused; cutting it to fit left an answer first), and a system
    prompt that left a question but not the reply's room passed the start check (and /load): every turn then failed.
    Both are refused in one line now, and the chat goes on as it was."""
    trailing, roomless = tmp_path / "trailing.json", tmp_path / "roomless.json"
    trailing.write_text(json.dumps([{"role": "user", "content": "hi"}]))
    roomless.write_text(json.dumps([{"role": "system", "content": "word " * 100}]))
    r = _piped(tiny_bundle, f"/load {trailing}\n/load {roomless}\nhello\n", "--max-new-tokens", "6",
               "--max-context", "128")
    errs = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errs) == 2 and "ending with an answer" in errs[0] and "system prompt" in errs[1], r.stderr
    assert r.returncode == 1 and "Traceback" not in r.stderr
    # at start: a system prompt that leaves no room for a reply of --max-new-tokens (up to the reserve)
    r = _piped(tiny_bundle, "hello\n", "--system", "word " * 20, "--max-context", "128", "--max-new-tokens", "64")
    assert r.returncode == 3 and "each reply keeps 64 free" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    r = _piped(tiny_bundle, "hello\n", "--system", "word " * 20, "--max-context", "128", "--max-new-tokens", "4")
    assert r.returncode == 0, r.stderr


def test_a_reply_cut_by_a_full_context_says_so(tiny_bundle):
    """(session 45) A reply that stopped because the context filled was cut without a word (`generate` said it)."""
    import io

    import edgespec
    from edgespec.chat import ChatRepl

    eng = edgespec.load(tiny_bundle, memory=False, max_context=64)
    no_end = {t: -100.0 for t in eng.manifest.eos_token_ids}
    out, err = io.StringIO(), io.StringIO()
    repl = ChatRepl(eng, options={"max_new_tokens": 400, "logit_bias": no_end}, stdin=io.StringIO("hello\n"),
                    stdout=out, stderr=err)
    assert repl.run() == 0, err.getvalue()
    assert eng.last_stats.finish_reason == "context"
    assert "the reply stopped because the context (64 tokens) is full" in err.getvalue()


def test_ctrl_c_in_a_command_keeps_the_chat(tiny_bundle, tmp_path):
    """(session 45) Ctrl-C while a command ran (a /load of a large file) ended the chat, the conversation lost."""
    import io

    import edgespec
    from edgespec.chat import ChatRepl

    eng = edgespec.load(tiny_bundle, memory=False)
    out, err = io.StringIO(), io.StringIO()
    repl = ChatRepl(eng, options={"max_new_tokens": 4}, stdin=io.StringIO("hello\n/load big.json\n/save "
                                                                          f"{tmp_path / 'c.json'}\n"),
                    stdout=out, stderr=err)

    def slow_load(arg):
        raise KeyboardInterrupt

    repl._load = slow_load
    assert repl.run() == 0, err.getvalue()
    assert "[interrupted]" in err.getvalue()
    assert [m["role"] for m in json.loads((tmp_path / "c.json").read_text())] == ["user", "assistant"]


def test_a_message_of_several_lines_and_one_that_begins_with_a_slash(tiny_bundle, tmp_path):
    """(session 45, a review) Each line was a message (code pasted on a terminal made one turn a line, its
    indentation stripped), and no message could begin with '/'. Lines between two lines of three double quotes are
    one message, kept as typed; '//text' sends '/text'; a block cut by the end of input is not sent, and says so
    (session 47: it was dropped without a word, exit 0)."""
    saved = tmp_path / "c.json"
    # (session 54, a review: a docstring's indented closing quotes ended the block, a pasted function sent as three
    # messages; a piped CRLF block kept its \r)
    code = 'def f(x):\n    """Add one.\n\n    Really.\n    """\n    return x + 1\n'
    script = ('"""\n' + code + '\n"""\n//etc/hosts is a file\n' + '"""\r\nline one\r\nline two\r\n"""\r\n'
              + f"/save {saved}\n" + '"""\nunfinished\n')
    r = _piped(tiny_bundle, script, "--max-new-tokens", "4")
    assert r.returncode == 1 and _errors(r.stderr) == ['error: the input ended inside a """ block: its message was '
                                                        'not sent'], r.stderr
    msgs = json.loads(saved.read_text())
    assert [m["content"] for m in msgs if m["role"] == "user"] == [code, "/etc/hosts is a file",
                                                                   "line one\nline two"]
    assert [m["role"] for m in msgs] == ["user", "assistant"] * 3


def test_control_characters_of_a_reply_are_shown_not_acted_on_in_a_terminal(tiny_bundle):
    """(session 45, a review) A model's reply reached the terminal raw: an escape sequence in it would retitle the
    terminal, move the cursor or clear the screen. On a terminal `generate` and `chat` show them (^[, ^D, \\x9b);
    piped, the reply is as the model wrote it."""
    from edgespec.chat import terminal_safe

    assert terminal_safe("a\x1b[2Jb\tc\nd\re\x07f\x9bg\x7f") == "a^[[2Jb\tc\nd\re^Gf\\x9bg^?"
    assert terminal_safe("\x80\x9f\xa0") == "\\x80\\x9f\xa0"  # (session 97, CH3: the C1 range's two ends, and past it)
    master, slave = pty.openpty()
    args = [sys.executable, "-m", "edgespec.cli", "generate", str(tiny_bundle), "-p", "hello", "--max-new-tokens",
            "96", "--drafter", "none"]
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.DEVNULL, env=_env(),
                            cwd=ROOT)
    os.close(slave)
    raw = b""
    deadline = time.time() + START_S
    while time.time() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:
                break
            if not data:
                break
            raw += data
        elif proc.poll() is not None:
            break
    proc.wait(timeout=60)
    os.close(master)
    piped = subprocess.run(args, capture_output=True, env=_env(), cwd=ROOT, timeout=START_S).stdout
    assert any(b < 32 and b not in b"\t\n\r" for b in piped)  # (the tiny model writes control characters)
    assert not any(b < 32 and b not in b"\t\n\r" for b in raw), raw


class _Keys(io.StringIO):
    """Piped input in which a line ``CTRL-C`` is a Ctrl-C at that read."""

    def readline(self, *a):
        line = super().readline(*a)
        if line == "CTRL-C\n":
            raise KeyboardInterrupt
        return line


def _repl(eng, script: str, **kw):
    """A piped chat run in this process (``script`` its input, a line ``CTRL-C`` a Ctrl-C): (the ChatRepl, its exit
    code, stdout, stderr)."""
    from edgespec.chat import ChatRepl

    out, err = kw.pop("stdout", None) or io.StringIO(), io.StringIO()
    repl = ChatRepl(eng, stdin=_Keys(script), stdout=out, stderr=err, **kw)
    code = repl.run()
    return repl, code, out.getvalue() if isinstance(out, io.StringIO) else "", err.getvalue()


def test_lines_and_blocks_at_the_line_limit(tiny_bundle):
    """(session 81, a mutation test of chat.py's reading) A line of exactly the limit is taken; one far over it (more
    than the 1 MiB a skip reads at a time) is one error, its rest skipped to its newline; a block's size counts its
    newlines, and a block over the limit is an error (its message dropped, not sent empty without a word); a block
    of blank lines sends nothing."""
    import edgespec

    eng = edgespec.load(tiny_bundle, memory=False)
    exact, far = "a" * 63 + "b", "y" * (64 + (3 << 20))
    block = '"""\n' + "0123456789\n" * 6 + '"""\n'  # (60 bytes of text, 66 with its newlines)
    script = f"{exact}\n{far}\nhello\n{block}" + '"""\n\n   \n"""\n' + "bye\n"
    repl, code, _, err = _repl(eng, script, options={"max_new_tokens": 2}, line_limit=64)
    assert code == 1 and _errors(err) == ["error: a line is longer than 64 bytes: skipped up to the next newline",
                                          "error: a message is longer than 64 bytes: dropped"], err
    assert [m["content"] for m in repl.session.messages if m["role"] == "user"] == [exact, "hello", "bye"]


def test_ctrl_c_in_a_reply_keeps_the_history_alternating(tiny_bundle):
    """(session 81, a mutation test) Ctrl-C while a reply is written out: the reply is kept as far as it got, once
    (the stream is closed before the history is looked at; left to the garbage collector, the turn recorded its
    reply after the repair had added one: user, assistant, assistant, which the template refuses)."""
    import edgespec

    class Interrupted(io.StringIO):
        def write(self, s):
            if not getattr(self, "done", False) and s.strip():
                self.done = True
                super().write(s)
                raise KeyboardInterrupt
            return super().write(s)

    eng = edgespec.load(tiny_bundle, memory=False)
    repl, code, _, err = _repl(eng, "hello\nand then?\n", options={"max_new_tokens": 8, "drafter": "none"},
                               stdout=Interrupted())
    assert code == 0 and "[stopped]" in err, err
    assert [m["role"] for m in repl.session.messages] == ["user", "assistant"] * 2, repl.session.messages


def test_set_reads_its_words_in_any_case_and_start_keeps_exactly_the_room_it_needs(tiny_bundle):
    """(session 81, a mutation test) ``/set seed NONE`` and ``/set draft_tokens Auto`` are the words; a system
    prompt that leaves exactly the reply's room and a one-word question is taken, one token more is refused."""
    import edgespec
    from edgespec.errors import ContextOverflowError

    eng = edgespec.load(tiny_bundle, memory=False, max_context=128)
    _, code, out, err = _repl(eng, "/set seed NONE\n/set draft_tokens Auto\n")
    assert code == 0 and "seed = None\ndraft_tokens = auto\n" in out, err

    def start(system):  # (the tokens of the system prompt and a one-word question: what the start checks)
        return len(eng.encode([{"role": "system", "content": system}, {"role": "user", "content": "hi"}]))

    system = "You are terse."
    while start(system) < 80:
        system += " Be kind."
    room = 128 - start(system)
    assert 8 <= room < 64, room  # (within half the context: the room a turn keeps is its max_new_tokens)
    _repl(eng, "", system=system, options={"max_new_tokens": room})
    with pytest.raises(ContextOverflowError, match="each reply keeps"):
        _repl(eng, "", system=system, options={"max_new_tokens": room + 1})


def test_ctrl_c_while_piped_input_is_read_leaves_with_130(tiny_bundle):
    """(session 81, a mutation test) Ctrl-C while a piped chat waits for its next line: it leaves quietly with 130,
    the shell's code for a Ctrl-C, not 0 (success), and reads no further. (The KeyboardInterrupt is raised by the
    input here; the next test sends a real SIGINT.)"""
    import edgespec

    eng = edgespec.load(tiny_bundle, memory=False)
    repl, code, _, err = _repl(eng, "hello\nCTRL-C\nbye\n", options={"max_new_tokens": 2})
    assert code == 130 and err == "", err
    assert [m["content"] for m in repl.session.messages if m["role"] == "user"] == ["hello"]


def test_a_real_sigint_to_a_piped_chat_waiting_for_a_line_leaves_with_130(tiny_bundle):
    """(session 82) The process's SIGINT, its reply printed, while it blocks reading the pipe: exit 130 at once. A
    fresh clone's run saw such a chat hang once (session 81): its suite ran as a background job (`cmd &`), whose
    children start with SIGINT ignored, as a shell's background job should, and Python then installs no Ctrl-C
    handler; the child here starts with SIGINT's default, as a command typed at a terminal."""
    import signal

    p = subprocess.Popen([sys.executable, "-m", "edgespec.cli", "chat", str(tiny_bundle), "--max-new-tokens", "2"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env(), cwd=ROOT,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        p.stdin.write(b"hello\n")
        p.stdin.flush()
        ready, _, _ = select.select([p.stdout], [], [], START_S)
        assert ready and p.stdout.readline().endswith(b"\n")  # the reply, then the next read
        time.sleep(1.0)
        p.send_signal(signal.SIGINT)
        code = p.wait(timeout=30)
        err = p.stderr.read().decode()
    finally:
        p.kill()
        p.wait()
    assert code == 130 and "Traceback" not in err, (code, err[-2000:])


def test_the_stats_lines_count_the_prompt_s_new_and_restored_tokens():
    """(session 81, a mutation test) The line after a reply counts the prompt's tokens prefilled (not the whole
    prompt), and /stats says how many of the reused ones the prompt cache restored."""
    from edgespec.chat import report, summary
    from edgespec.decoder import Stats

    st = Stats(prompt_tokens=40, reused_prompt_tokens=30, restored_prompt_tokens=12, new_tokens=5)
    assert "(10 new prompt tokens, 30 reused)" in summary(st)
    assert "prompt: 40 tokens, 30 reused from the cached conversation (12 of them from the prompt cache)" in report(st)
    assert "prompt cache" not in report(Stats(prompt_tokens=40, reused_prompt_tokens=30))
    # (session 97, CH56, CH57) a reply with no finish reason (stopped by Ctrl-C) and no drafting rounds
    assert "finish: stopped" in report(st) and "rounds by drafter: -" in report(st)
    assert "finish: length" in report(Stats(finish_reason="length", rounds_by_drafter={"model": 2}))


def test_a_failed_save_leaves_no_temporary_file_and_save_load_take_only_what_save_writes(tiny_bundle, tmp_path,
                                                                                         monkeypatch):
    """(session 81, a mutation test) A /save whose last step fails removes the file it was writing beside the
    target; a JSON list of messages with more than a role and a content (an API's export, with names or tool calls)
    is not what /save writes, so /save will not overwrite it and /load refuses it."""
    import edgespec

    eng = edgespec.load(tiny_bundle, memory=False)
    other = tmp_path / "export.json"
    other.write_text(json.dumps([{"role": "user", "content": "hi", "name": "ann"}]))

    def full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    _, code, _, err = _repl(eng, f"/save {tmp_path / 'c.json'}\n/save {other}\n/load {other}\n")
    monkeypatch.undo()
    assert code == 1 and _errors(err) == [
        f"error: cannot write {tmp_path / 'c.json'}: No space left on device",
        f"error: {other} exists and is not a conversation /save wrote; give another name",
        f"error: {other} is not a conversation /save wrote (a JSON list of {{role, content}} messages)"], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export.json"]


def test_a_load_takes_the_files_system_prompt_for_a_reset_too(tiny_bundle, tmp_path):
    """(session 81, a mutation test) /load replaces the system prompt with the file's: a /reset after it starts
    the loaded conversation's system prompt again, not the one the chat began with."""
    import edgespec

    eng = edgespec.load(tiny_bundle, memory=False)
    saved, after = tmp_path / "c.json", tmp_path / "after.json"
    saved.write_text(json.dumps([{"role": "system", "content": "Answer in French."},
                                 {"role": "user", "content": "hi"}, {"role": "assistant", "content": "salut"}]))
    _, code, _, err = _repl(eng, f"/load {saved}\n/reset\n/save {after}\n", system="Answer in English.")
    assert code == 0, err
    assert json.loads(after.read_text()) == [{"role": "system", "content": "Answer in French."}]


def test_ctrl_c_inside_a_block_drops_its_message_and_the_chat_goes_on(tiny_bundle):
    """(session 81, a mutation test) Ctrl-C while a block of lines is typed drops that block, says so, and the chat
    reads on."""
    import edgespec

    eng = edgespec.load(tiny_bundle, memory=False)
    repl, code, _, err = _repl(eng, '"""\nhalf a\nCTRL-C\nhello\n', options={"max_new_tokens": 2})
    assert code == 0 and err == "[message dropped]\n", err
    assert [m["content"] for m in repl.session.messages if m["role"] == "user"] == ["hello"]


def test_a_reply_s_control_characters_are_shown_in_a_terminal_chat(tiny_bundle):
    """(session 81, a mutation test: `generate` in a terminal was tested, the chat's own output was not) Where the
    chat writes to a terminal, a reply's ESC is shown as ^[; piped, it is as the model wrote it."""
    import edgespec

    class Tty(io.StringIO):
        def isatty(self):
            return True

    eng = edgespec.load(tiny_bundle, memory=False)
    esc = eng.tokenizer.encode("\x1b", add_special=False)
    assert len(esc) == 1
    opts = {"max_new_tokens": 2, "logit_bias": {esc[0]: 100.0}, "drafter": "none"}
    _, _, shown, _ = _repl(eng, "hello\n", options=opts, stdout=Tty())
    _, _, raw, _ = _repl(eng, "hello\n", options=opts)
    assert (shown, raw) == ("^[^[\n", "\x1b\x1b\n")


def test_what_a_chat_reads_from_and_writes_to_and_the_words_that_end_it(tiny_bundle, tmp_path):
    """(session 97, a second mutation test of chat.py: CH6, CH8, CH9, CH20, CH21, CH28, CH32, CH35, CH44, CH50)
    - A stream that says it is a terminal but is not the process's stdin is read as piped input, not through
      ``input()`` (which reads the process's own stdin); a stdout whose ``isatty`` fails (closed) is no terminal.
    - ``/quit`` leaves as ``/exit`` does.
    - A loaded conversation has dropped nothing yet; a file name's control characters are shown escaped in /load's
      error. (Its refusals: test_load_continues_a_saved_conversation.)
    - A line's limit of 1 MiB is said in MiB; a terminal's chat that met errors exits 0; a reply that fails after its
      first words ends their line before the error is said.
    - draft_tokens with the profile's default drafter none is refused, naming the default.
    - Options given as None are left to the engine's defaults."""
    import edgespec
    from edgespec.chat import ChatRepl
    from edgespec.errors import EdgespecError
    from test_hardening import _profile

    eng = edgespec.load(tiny_bundle, memory=False)

    class Tty(_Keys):
        def isatty(self):
            return True

    class Closed(io.StringIO):
        def isatty(self):
            raise ValueError("I/O operation on closed file")

    repl, code, _, err = _repl(eng, "hello\n/quit\nnot sent\n", options={"max_new_tokens": 2, "temperature": None},
                               stdout=Closed())
    assert (code, repl.interactive, repl._tty, err) == (0, False, False, "")
    assert repl.options == {"max_new_tokens": 2}
    assert [m["content"] for m in repl.session.messages if m["role"] == "user"] == ["hello"]
    repl = ChatRepl(eng, stdin=Tty("hi\n"), stdout=io.StringIO(), stderr=io.StringIO(), options={"max_new_tokens": 2})
    assert not repl.interactive and repl.run() == 0 and repl.session.messages[0]["content"] == "hi"
    good = tmp_path / "good.json"
    good.write_text(json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]))
    repl = ChatRepl(eng, stdin=_Keys(f"/load {good}\n"), stdout=io.StringIO(), stderr=io.StringIO())
    repl.session.dropped = 3  # (as a long chat's)
    assert repl.run() == 0 and repl.session.messages[1]["content"] == "hello" and repl.session.dropped == 0
    _, _, _, err = _repl(eng, f"/load {tmp_path}/no\x1b[2Jsuch.json\n")  # (CH50: a name's controls shown escaped)
    assert _errors(err) == [f"error: cannot read {ascii(f'{tmp_path}/no' + chr(27) + '[2Jsuch.json')}: no such file"]
    _, _, _, err = _repl(eng, "x" * ((1 << 20) + 1) + "\n", line_limit=1 << 20)  # (CH20: the limit said in MiB)
    assert _errors(err) == ["error: a line is longer than 1 MiB: skipped up to the next newline"], err
    repl.failed, repl.interactive = 1, True  # (CH21: a terminal's chat that met errors exits 0; piped, 1)
    assert repl._exit_code() == 0
    out, err = io.StringIO(), io.StringIO()  # (CH28: a reply that fails after its first words ends their line)
    repl = ChatRepl(eng, stdin=_Keys("hi\n"), stdout=out, stderr=err)

    def failing(text, **kw):
        yield "partial"
        raise EdgespecError("the model failed")

    repl.session.stream = failing
    assert repl.run() == 1 and out.getvalue() == "partial\n" and _errors(err.getvalue()) == ["error: the model failed"]
    none = edgespec.load(tiny_bundle, memory=False, profile=_profile(tmp_path, 'drafter = "none"\n'))
    assert none.defaults.drafter == "none"
    _, code, _, err = _repl(none, "/set draft_tokens 3\n")
    assert code == 1 and _errors(err) == ["error: draft_tokens: the drafter is none (the default), so nothing is "
                                          "drafted; /set drafter first"], err


def test_ctrl_c_s_handler_is_set_where_sigint_was_ignored_and_put_back(monkeypatch):
    """(session 97, CH58, CH59) A chat started with SIGINT ignored (a script's background job) takes Ctrl-C again
    while it runs, and the ignoring is put back after (the REPL used as a library); from another thread than the main
    one nothing is set (signal's rule: it raised ValueError there)."""
    import signal
    import threading

    from edgespec.chat import _catch_ctrl_c

    monkeypatch.setattr(signal, "getsignal", lambda n: signal.SIG_IGN)  # (the handler itself is left as it is)
    set_to = []
    monkeypatch.setattr(signal, "signal", lambda n, h: set_to.append(h))
    restore = _catch_ctrl_c()
    assert set_to == [signal.default_int_handler]
    restore()
    assert set_to == [signal.default_int_handler, signal.SIG_IGN]
    got = []
    t = threading.Thread(target=lambda: got.append(_catch_ctrl_c()))
    t.start()
    t.join()
    assert got == [None] and len(set_to) == 2



def test_chat_command_hands_the_repl_its_options(tmp_path, monkeypatch):
    """(session 99, a second mutation pass of cli.py: CL50, CL65-CL72) What `edgespec chat` sets up around the REPL,
    with an engine and a REPL stand-in: --draft-tokens checked before the model loads; --documents beside a drafter
    that does not read them noted (not beside the suffix drafter, which does); a reply's characters the terminal
    cannot show made '?', a piped line that is not UTF-8 kept to be refused; the line limit and the template's
    variables handed on; the REPL's exit code the command's; the engine closed after it (its prompt cache file
    written then)."""
    from click.testing import CliRunner

    import edgespec.chat
    import edgespec.cli as C

    class Engine:
        closed = False

        def close(self):
            self.closed = True

    eng, seen = Engine(), {}

    def repl(engine, **kw):
        seen.update(kw, stdout_errors=sys.stdout.errors, stdin_errors=sys.stdin.errors)
        return 3

    monkeypatch.setattr(C, "_engine", lambda *a, **k: eng)
    monkeypatch.setattr(edgespec.chat, "run_chat", repl)
    r = CliRunner().invoke(C.main, ["chat", "b", "--draft-tokens", "65"])
    assert r.exit_code == 2 and "draft_tokens" in r.stderr and not seen, r.output
    (tmp_path / "doc.txt").write_text("a document")
    r = CliRunner().invoke(C.main, ["chat", "b", "--documents", str(tmp_path / "doc.txt"), "--drafter", "prompt-lookup",
                                    "--chat-template-kwargs", '{"enable_thinking": false}'])
    assert r.exit_code == 3 and eng.closed, r.output
    assert r.stderr == "note: --documents are drafted from by the suffix drafter only; --drafter prompt-lookup does " \
        "not read them (/set drafter suffix or auto does)\n", r.stderr
    assert seen["line_limit"] == C.STDIN_LIMIT and seen["template_kwargs"] == {"enable_thinking": False}, seen
    r = CliRunner().invoke(C.main, ["chat", "b", "--documents", str(tmp_path / "doc.txt"), "--drafter", "suffix"])
    assert r.exit_code == 3 and r.stderr == "", r.stderr  # (CL50: the suffix drafter reads them: no note)
    assert (seen["stdout_errors"], seen["stdin_errors"]) == ("replace", "surrogateescape"), seen
