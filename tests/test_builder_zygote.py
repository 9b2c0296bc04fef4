"""The model builder's zygote (export/builder_zygote.py): builds forked from one process that imported the builder
once, each as a fresh ``python -m`` would run, with the exporting process's environment and directory of now."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from conftest import dead_pid
from edgespec_export import builder_zygote as build

PROBE = '''
import json, os, sys, time
if sys.argv[1:2] == ["sleep"]:
    print("sleeping", flush=True)
    time.sleep(60)
if sys.argv[1:2] == ["nap"]:
    time.sleep(2)
if sys.argv[1:2] == ["ends"]:
    print("ending", flush=True)
    time.sleep(0.3)
    raise SystemExit(int(sys.argv[2]))
if sys.argv[1:2] == ["fail"]:
    raise SystemExit("the probe failed on purpose")
if sys.argv[1:2] == ["kbd"]:
    raise KeyboardInterrupt
if sys.argv[1:2] == ["kbd-late"]:  # (output left in the buffer, then Ctrl-C once its reader is gone)
    sys.stdout.write("x" * 100)
    time.sleep(1)
    raise KeyboardInterrupt
if sys.argv[1:2] == ["raise"]:
    raise ValueError("a bug in the probe")
if sys.argv[1:2] == ["bare-exit"]:
    print("exiting", flush=True)
    raise SystemExit
if sys.argv[1:2] == ["atexit"]:
    import atexit
    atexit.register(lambda: print("atexit ran"))
if sys.argv[1:2] == ["complain"]:
    print("to stderr", file=sys.stderr, flush=True)


def sockets():
    import stat
    fds = os.listdir("/proc/self/fd") if os.path.isdir("/proc/self/fd") else []
    n = 0
    for fd in fds:
        try:
            n += stat.S_ISSOCK(os.fstat(int(fd)).st_mode)
        except OSError:
            pass
    return n


import signal
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": os.environ.get("PROBE_VAR"),
                  "ppid": os.getppid(), "builder": "builders.base" in sys.modules, "file": sys.argv[0],
                  "path0": sys.path[0], "main": sys.modules["__main__"].__file__, "stale": os.environ.get("STALE_VAR"),
                  "sockets": sockets(), "sigint": signal.getsignal(signal.SIGINT) is signal.default_int_handler}))
'''

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the zygote forks (POSIX)")


@pytest.fixture(scope="module")
def probe_path(tmp_path_factory):
    """Zygotes of this module's own, which can import the probe module; the next export starts a fresh one."""
    mods = tmp_path_factory.mktemp("mods")
    (mods / "zygote_probe.py").write_text(PROBE)
    (mods / "zygote_dies.py").write_text("import os\nos._exit(3)\n")
    (mods / "poison").mkdir()  # (on PYTHONPATH, a zygote's imports fail: test_a_zygote_that_cannot_serve_...)
    (mods / "poison" / "onnxruntime_genai.py").write_text("raise ImportError('poisoned for a test')\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", str(mods))
        mp.delenv("PYTHONUNBUFFERED", raising=False)  # (the builds' output buffered, as a plain run's is: flushed at the end)
        build._stop()
        yield mods
        build._stop()


@pytest.fixture
def own_zygote(probe_path, monkeypatch):
    """A zygote that imports the standard library's json only (~0.1 s to start, where the builder's imports take
    ~7 s): what it does with a build is what the builder's zygote does."""
    monkeypatch.setattr(build, "PRELOAD", ("json",))
    build.prestart_builder()
    return build._ZYGOTE[0]


def _run(proc) -> tuple[int, str]:
    out = b""
    while chunk := proc.read():
        out += chunk
    return proc.wait(), out.decode()


def test_builds_fork_from_one_zygote_with_this_processs_environment_now(probe_path, tmp_path, monkeypatch):
    """The builder's own zygote (its imports done once): a build sees this process's directory, environment and
    arguments of the moment, the builder imported already."""
    build.prestart_builder()
    own_zygote = build._ZYGOTE[0]
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv("PROBE_VAR", "set after the zygote started")
    proc = build.start_builder("zygote_probe", ["a", "b c"], {})
    rc, out = _run(proc)
    assert isinstance(proc, build.Forked) and rc == 0, out
    got = json.loads(out)
    probe = str(probe_path / "zygote_probe.py")
    assert got == {"argv": ["a", "b c"], "cwd": str(here), "env": "set after the zygote started",
                   "ppid": own_zygote.proc.pid, "builder": True, "file": probe, "path0": str(here), "main": probe,
                   "stale": None, "sockets": 0, "sigint": True}
    rc, out = _run(build.start_builder("zygote_probe", ["x"], {"PROBE_VAR": "given"}))
    assert rc == 0 and json.loads(out)["env"] == "given" and json.loads(out)["ppid"] == own_zygote.proc.pid
    assert build._ZYGOTE == [own_zygote]  # the same zygote served both
    # the builder run as __main__ again, without runpy's warning that it was imported (a fresh process has none)
    rc, out = _run(build.start_builder("edgespec_export.builder_shim", [], {}))
    assert rc == 2 and "usage" in out and "required" in out and "Warning" not in out, out  # (argparse's refusal)


def test_a_build_that_fails_says_why_and_the_zygote_serves_the_next(own_zygote):
    rc, out = _run(build.start_builder("zygote_probe", ["fail"], {}))
    assert rc == 1 and "the probe failed on purpose" in out
    rc, out = _run(build.start_builder("zygote_probe", ["raise"], {}))
    assert rc == 1 and "Traceback (most recent call last)" in out and "ValueError: a bug in the probe" in out
    rc, out = _run(build.start_builder("zygote_probe", ["kbd"], {}))
    assert rc == -signal.SIGINT and "KeyboardInterrupt" in out  # (as a fresh process ends)
    rc, out = _run(build.start_builder("zygote_probe", [], {}))
    assert rc == 0 and json.loads(out)["ppid"] == own_zygote.proc.pid


def test_a_killed_build_ends_and_a_second_build_meanwhile_runs_alone(own_zygote):
    proc = build.start_builder("zygote_probe", ["sleep"], {})
    assert isinstance(proc, build.Forked)
    assert proc.read().startswith(b"sleeping")
    other = build.start_builder("zygote_probe", ["y"], {})  # (the zygote is busy: a process of its own)
    rc, out = _run(other)
    assert isinstance(other, build.Alone) and rc == 0 and json.loads(out)["ppid"] == os.getpid()
    t0 = time.monotonic()
    proc.kill()
    rc, _ = _run(proc)
    assert rc == -9 and time.monotonic() - t0 < 30
    rc, out = _run(build.start_builder("zygote_probe", [], {}))
    assert rc == 0 and json.loads(out)["ppid"] == own_zygote.proc.pid


def test_a_dead_zygote_is_replaced(own_zygote):
    own_zygote.proc.kill()
    own_zygote.proc.wait()
    proc = build.start_builder("zygote_probe", [], {})
    rc, out = _run(proc)
    assert rc == 0 and build._ZYGOTE and build._ZYGOTE[0] is not own_zygote
    assert isinstance(proc, build.Forked) and json.loads(out)["ppid"] == build._ZYGOTE[0].proc.pid


def test_a_zygote_killed_during_a_build_fails_that_build(own_zygote):
    proc = build.start_builder("zygote_probe", ["nap"], {})
    assert isinstance(proc, build.Forked)
    own_zygote.proc.kill()
    own_zygote.proc.wait()
    rc, out = _run(proc)  # (its end unseen: the zygote that would have said it is gone)
    assert rc == 1 and not build._ZYGOTE


@pytest.fixture
def ctrl_c():
    """SIGINT raises KeyboardInterrupt in this test, whatever the process inherited (a background job of a script
    starts with SIGINT ignored)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _interrupt_after(seconds: float, zygote) -> threading.Timer:
    """SIGINT to this process after ``seconds``, the zygote stopped meanwhile (so that the interrupt lands while
    this process waits for its reply), continued after."""
    os.kill(zygote.proc.pid, signal.SIGSTOP)

    def fire():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.3)
        try:
            os.kill(zygote.proc.pid, signal.SIGCONT)
        except ProcessLookupError:  # (killed meanwhile, as it should be)
            pass

    t = threading.Timer(seconds, fire)
    t.start()
    return t


def test_an_interrupt_while_a_build_starts_or_ends_drops_that_zygote_and_later_builds_keep_their_own_ends(own_zygote,
                                                                                                       ctrl_c):
    """Ctrl-C while the exporting process waits for the zygote's reply (its pid, or its end): the zygote's replies
    would have stayed one build behind (a review: builds asked to end 0, 3, 0 reported 1, 0, 3); now that zygote
    is killed with its build, and the next build starts a fresh one."""
    assert own_zygote.usable()  # (an interrupt while it imports is no harm: its first reply is read at the next build)
    t = _interrupt_after(0.5, own_zygote)
    with pytest.raises(KeyboardInterrupt):
        build.start_builder("zygote_probe", ["ends", "7"], {})
    t.join()
    assert not build._ZYGOTE and own_zygote.proc.wait(10) is not None
    assert not build._LOCK.locked()
    for code in (0, 3, 0):
        proc = build.start_builder("zygote_probe", ["ends", str(code)], {})
        assert isinstance(proc, build.Forked) and _run(proc)[0] == code
    z = build._ZYGOTE[0]
    proc = build.start_builder("zygote_probe", ["ends", "5"], {})
    assert proc.read().startswith(b"ending")
    t = _interrupt_after(1.2, z)  # (the build ends 0.3 s after saying "ending": its end is read while the zygote stops)
    while proc.read():
        pass
    with pytest.raises(KeyboardInterrupt):
        proc.wait()
    t.join()
    assert proc.wait() == -9 and not build._ZYGOTE and not build._LOCK.locked()  # (a second wait: the same end)
    assert _run(build.start_builder("zygote_probe", ["ends", "4"], {}))[0] == 4


@pytest.mark.parametrize("name", ["OMP_NUM_THREADS", "PYTHONPATH"])
def test_a_changed_import_time_variable_gets_a_fresh_zygote(own_zygote, monkeypatch, name):
    if name == "OMP_NUM_THREADS":
        other = str(int(os.environ.get("OMP_NUM_THREADS", "0")) + 1)  # (the suite's workers set one: conftest.py)
    else:
        other = os.environ["PYTHONPATH"] + os.pathsep + os.path.dirname(os.environ["PYTHONPATH"])
    monkeypatch.setenv(name, other)
    rc, out = _run(build.start_builder("zygote_probe", [], {}))
    assert rc == 0 and json.loads(out)["ppid"] != own_zygote.proc.pid and build._ZYGOTE[0] is not own_zygote
    assert build._ZYGOTE[0].env[name] == other


def test_a_zygote_that_cannot_serve_is_asked_once(probe_path, monkeypatch):
    """A zygote that says it cannot fork builds (here: its imports fail) is not started again for every build:
    each would wait for its imports first (a review: 6-7 s a build, slower than before the zygote)."""
    monkeypatch.setenv("PYTHONPATH", str(probe_path) + os.pathsep + str(probe_path / "poison"))
    monkeypatch.setattr(build, "_UNAVAILABLE", [])
    started = []
    monkeypatch.setattr(build, "Zygote", lambda real=build.Zygote: started.append(real()) or started[-1])
    t0 = time.monotonic()
    for _ in range(3):
        proc = build.start_builder("zygote_probe", [], {})
        assert _run(proc)[0] == 0
    assert isinstance(proc, build.Alone) and build._UNAVAILABLE and not build._ZYGOTE and len(started) == 1
    assert time.monotonic() - t0 < 60


def test_a_zygote_started_by_a_thread_that_ended_still_serves(probe_path, monkeypatch):
    """A zygote started by a thread (an export in a worker thread) outlives it: a build another thread runs through
    it is not killed when the first thread ends (the zygote's death signal came with its starting thread's end)."""
    monkeypatch.setattr(build, "PRELOAD", ("json",))

    def start():  # (the thread lives until the zygote has started up, then ends)
        build.prestart_builder()
        assert build._ZYGOTE[0].usable()

    t = threading.Thread(target=start)
    t.start()
    t.join()
    time.sleep(0.5)
    z = build._ZYGOTE[0]
    assert z.proc.poll() is None
    proc = build.start_builder("zygote_probe", ["nap"], {})
    rc, out = _run(proc)
    assert isinstance(proc, build.Forked) and rc == 0 and json.loads(out)["ppid"] == z.proc.pid


def test_a_zygote_killed_before_it_said_ready_is_replaced_not_given_up(probe_path, monkeypatch):
    """Only a zygote that says it cannot serve stops this process's use of zygotes; one that died before saying
    anything (killed) is replaced at the next build."""
    monkeypatch.setattr(build, "PRELOAD", ("zygote_dies",))  # (its import ends the zygote at once, unsaid)
    monkeypatch.setattr(build, "_UNAVAILABLE", [])
    build._stop()
    build.prestart_builder()
    z = build._ZYGOTE[0]
    proc = build.start_builder("zygote_probe", [], {})  # (its zygote gone: this build alone)
    assert isinstance(proc, build.Alone) and _run(proc)[0] == 0 and not build._UNAVAILABLE
    monkeypatch.setattr(build, "PRELOAD", ("json",))
    proc = build.start_builder("zygote_probe", [], {})
    assert isinstance(proc, build.Forked) and _run(proc)[0] == 0 and build._ZYGOTE[0] is not z


def test_a_build_with_no_pipe_runs_alone_and_the_zygote_serves_the_next(own_zygote, monkeypatch):
    """(session 89, a review) No pipe for a forked build's output (out of descriptors): that build runs as a
    process of its own, nothing sent to the zygote, and the zygote's lock is let go, so the next build is forked
    again (the lock was held for good: every later build of the process alone)."""
    real, failed = os.pipe, []

    def pipe():  # (the first pipe asked for fails: Forked's; Alone's Popen gets its own)
        if not failed:
            failed.append(True)
            raise OSError(24, "Too many open files")
        return real()

    monkeypatch.setattr(build.os, "pipe", pipe)
    proc = build.start_builder("zygote_probe", [], {})
    rc, out = _run(proc)
    assert failed and isinstance(proc, build.Alone) and rc == 0 and json.loads(out)["ppid"] == os.getpid()
    assert not build._LOCK.locked() and build._ZYGOTE == [own_zygote]
    proc = build.start_builder("zygote_probe", [], {})
    rc, out = _run(proc)
    assert isinstance(proc, build.Forked) and rc == 0 and json.loads(out)["ppid"] == own_zygote.proc.pid


@pytest.mark.parametrize("parent", ["alive", "gone"])
def test_a_build_forked_after_its_zygote_ended_ends_at_once(probe_path, parent):
    """(session 89, a review) A forked build asks to be killed when its zygote ends (Linux's PR_SET_PDEATHSIG);
    a zygote that ended between the fork and that request sent no signal, so the build checks that its parent is
    still the zygote that forked it and ends (SIGKILL) where it is not, before running anything. Here the test
    process forks the child as a zygote would, naming itself (alive) or a process that ended (gone) as the zygote."""
    import socket
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("the death signal is Linux's")
    r, w = os.pipe()
    ours, theirs = socket.socketpair()
    req = {"module": "zygote_probe", "argv": [], "env": dict(os.environ), "cwd": str(probe_path)}
    me = os.getpid()
    gone = dead_pid()  # (a zygote that ended: not this child's parent, even where the test runs as pid 1)
    pid = os.fork()
    if pid == 0:  # (the child: none of pytest's exit handlers, which would stop this process's zygotes, and the
        import atexit  # interpreter's own streams, on descriptors 1 and 2, not pytest's capture)

        atexit._clear()
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        os.close(r)
        build._child(req, w, theirs, me if parent == "alive" else gone)
    os.close(w)
    ours.close()
    theirs.close()
    out = b""
    while chunk := os.read(r, 4096):
        out += chunk
    os.close(r)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    if parent == "alive":
        assert code == 0 and out and json.loads(out)["ppid"] == me, (code, out)
    else:
        assert code == -signal.SIGKILL and out == b""


def test_a_forked_build_sees_what_a_process_of_its_own_sees(own_zygote, monkeypatch, tmp_path):
    """(session 89) A build forked by the zygote runs as ``python -m`` would run it alone: its module file as
    argv[0] and ``__main__``, its directory first on sys.path, no variable the zygote had and this process no longer
    has, none of the zygote's sockets, Ctrl-C raising KeyboardInterrupt (a zygote ignores it), its at-exit handlers
    run and its buffered output flushed at its end, and ``sys.exit()`` ending 0. Compared with ``Alone``'s run of
    the same probe, which is that fresh process."""
    monkeypatch.setenv("STALE_VAR", "the zygote's")  # (not an import-time variable: the same zygote serves)
    build._stop()
    build.prestart_builder()
    z = build._ZYGOTE[0]
    monkeypatch.delenv("STALE_VAR")
    monkeypatch.chdir(tmp_path)
    forked, alone = build.start_builder("zygote_probe", ["atexit"], {}), build.Alone("zygote_probe", ["atexit"], {})
    (rc, out), (arc, aout) = _run(forked), _run(alone)
    assert isinstance(forked, build.Forked) and rc == 0 and arc == 0, (out, aout)
    got, want = json.loads(out.splitlines()[0]), json.loads(aout.splitlines()[0])
    assert got.pop("ppid") == z.proc.pid and want.pop("ppid") == os.getpid()
    assert got.pop("sigint") is True  # (Alone's depends on what this process ignores)
    want.pop("sigint")
    assert got == want and got["stale"] is None and got["path0"] == str(tmp_path) and got["sockets"] == 0, (got, want)
    assert out.splitlines()[1:] == aout.splitlines()[1:] == ["atexit ran"]
    rc, out = _run(build.start_builder("zygote_probe", ["bare-exit"], {}))
    assert (rc, out) == (0, "exiting\n")


def test_a_process_of_its_own_gets_its_arguments_environment_and_stderr_and_is_killed(probe_path, monkeypatch):
    """(session 89) ``Alone``, where no zygote serves: the builder's arguments, ``env`` over this process's
    environment, stderr with stdout; no end until it ended, ``kill`` ends it, and its pipe closed after ``wait``."""
    monkeypatch.setenv("PROBE_VAR", "this process's")
    proc = build.Alone("zygote_probe", ["a", "b c"], {"PROBE_VAR": "given"})
    rc, out = _run(proc)
    assert rc == 0 and json.loads(out)["argv"] == ["a", "b c"] and json.loads(out)["env"] == "given"
    assert proc._p.stdout.closed
    rc, out = _run(build.Alone("zygote_probe", ["complain"], {}))  # (PYTHONPATH from this process: it imports)
    assert rc == 0 and out.startswith("to stderr\n") and json.loads(out.splitlines()[1])["env"] == "this process's"
    proc = build.Alone("zygote_probe", ["sleep"], {})
    assert proc.read().startswith(b"sleeping") and proc.returncode is None
    proc.kill()
    assert _run(proc)[0] == -signal.SIGKILL and proc.returncode == -signal.SIGKILL


def test_the_zygote_outlives_ctrl_c_and_ends_at_its_sockets_end_or_when_killed(probe_path, monkeypatch, ctrl_c):
    """(session 89) A terminal's Ctrl-C reaches the whole process group: the zygote ignores it and serves the next
    build. Closed, it ends by itself at its socket's end (exit 0); closed with ``kill`` (and at this process's exit,
    ``_stop``) it is killed, its build with it. (The zygote is started while this process handles SIGINT: one
    started by a background job inherits SIGINT ignored, whatever it does itself.)"""
    monkeypatch.setattr(build, "PRELOAD", ("json",))
    build._stop()
    build.prestart_builder()
    own_zygote = build._ZYGOTE[0]
    assert own_zygote.usable()
    os.kill(own_zygote.proc.pid, signal.SIGINT)
    time.sleep(0.3)
    rc, out = _run(build.start_builder("zygote_probe", [], {}))
    assert own_zygote.proc.poll() is None and rc == 0 and json.loads(out)["ppid"] == own_zygote.proc.pid
    own_zygote.close()
    assert own_zygote.proc.returncode == 0 and own_zygote._lines.closed and not build._ZYGOTE
    build.prestart_builder()
    z = build._ZYGOTE[0]
    assert z.usable()
    build._stop()
    assert z.proc.returncode == -signal.SIGKILL and not build._ZYGOTE


def test_a_build_ends_with_its_killed_zygote(own_zygote):
    """(session 89) A zygote killed (SIGKILL: nothing of it runs) takes its running build with it (Linux's death
    signal): the build's pipe, which only the build holds, ends at once, not when the build would have."""
    import select
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("the death signal is Linux's")
    proc = build.start_builder("zygote_probe", ["sleep"], {})
    assert isinstance(proc, build.Forked) and proc.read().startswith(b"sleeping")
    own_zygote.proc.kill()
    ready, _, _ = select.select([proc._r], [], [], 20)
    assert ready and proc.read() == b""  # (the build's end: its only write end closed)
    assert proc.wait() == 1  # (its end unknown: the zygote that would have said it is gone)


def test_replies_are_read_whole_and_must_be_the_one_due(own_zygote):
    """(session 89) ``_exact`` reads a message that arrives in pieces whole, and None where the other end closes
    first; ``Zygote.reply`` refuses a reply that is not the one due (ValueError: the zygote is then dropped)."""
    import io
    import socket

    a, b = socket.socketpair()
    t = threading.Timer(0.2, lambda: b.sendall(b"defgh"))
    b.sendall(b"abc")
    t.start()
    assert build._exact(a, 8) == b"abcdefgh"
    b.sendall(b"zw")
    assert build._exact(a, 4, b"xy") == b"xyzw"  # (the bytes read already count)
    b.sendall(b"z")
    b.close()
    assert build._exact(a, 4, b"xy") is None
    a.close()
    z = object.__new__(build.Zygote)
    z._lines = io.BytesIO(b'{"pid": 5}\n{"other": 1}\n[1]\n{"exit": "0"}\n')
    assert z.reply("pid") == 5
    for _ in range(3):
        with pytest.raises(ValueError, match="where 'exit' was due"):
            z.reply("exit")
    with pytest.raises(ConnectionError):
        z.reply("exit")


def test_an_ended_build_is_not_signalled_or_asked_again(own_zygote, monkeypatch):
    """(session 89) Once a forked build's end was read, its pid may be another process's (the zygote reaped it):
    ``kill`` sends nothing; a second ``wait`` says the same end without reading another reply (which would be the
    next build's)."""
    proc = build.start_builder("zygote_probe", ["ends", "3"], {})
    assert _run(proc)[0] == 3
    sent = []
    monkeypatch.setattr(build.os, "kill", lambda *a: sent.append(a))
    proc.kill()
    monkeypatch.setattr(own_zygote, "reply", lambda key: pytest.fail(f"asked the zygote for {key!r} again"))
    assert proc.wait() == 3 and not sent


def test_starting_the_zygote_early_never_waits_for_a_running_build(own_zygote):
    """(session 89) ``prestart_builder`` (an export's first step) while a build runs through the zygote does
    nothing at once; it does not wait for that build's end (an export beside a running one would stall)."""
    proc = build.start_builder("zygote_probe", ["sleep"], {})
    assert isinstance(proc, build.Forked) and proc.read().startswith(b"sleeping")
    t = threading.Thread(target=build.prestart_builder, daemon=True)
    t.start()
    t.join(10)
    alive = t.is_alive()
    proc.kill()
    assert _run(proc)[0] == -signal.SIGKILL and not alive


def test_ctrl_c_right_after_a_builds_end_was_read_lets_the_zygote_go(own_zygote, ctrl_c):
    """(session 90, session 89's report) An interrupt landing after the zygote's reply of a build's end was read
    but before the build was wound up left the zygote's lock held for good (every later build of the process
    alone) and its pipe open. The interrupt is raised here by a trace function at the first line ``wait`` runs
    after the reply: the build ends with its own code, the zygote is dropped (its replies are not trusted past an
    interrupt) and the next build is forked by a fresh one."""
    import sys

    proc = build.start_builder("zygote_probe", ["ends", "3"], {})
    while proc.read():
        pass
    replied, fired = [], []
    real = own_zygote.reply
    own_zygote.reply = lambda key: (real(key), replied.append(key))[0]

    def local(frame, event, arg):
        if event == "line" and replied and not fired:
            fired.append(frame.f_lineno)
            raise KeyboardInterrupt
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code is build.Forked.wait.__code__ else None

    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        with pytest.raises(KeyboardInterrupt):
            proc.wait()
    finally:
        sys.settrace(old)
    assert replied == ["exit"] and fired
    assert not build._LOCK.locked() and proc._r is None and proc.returncode == 3 and not build._ZYGOTE
    proc = build.start_builder("zygote_probe", ["ends", "4"], {})
    assert isinstance(proc, build.Forked) and _run(proc)[0] == 4


def test_a_build_interrupted_after_its_reader_left_still_ends_by_sigint(own_zygote):
    """(session 90, session 89's report) A forked build that ends by Ctrl-C ends by SIGINT, as a fresh process
    would, even where writing its traceback and flushing its output fail because the exporting process stopped
    reading (they raised BrokenPipeError and the build ended 1)."""
    proc = build.start_builder("zygote_probe", ["kbd-late"], {})
    os.close(proc._r)  # (no reader left: the build's writes fail)
    proc._r = os.open(os.devnull, os.O_RDONLY)  # (what the build's end closes)
    assert proc.wait() == -signal.SIGINT


def _reply_arrived(zygote, timeout: float = 10) -> bool:
    import select

    return bool(select.select([zygote.sock], [], [], timeout)[0])


def test_a_build_reaped_before_its_end_was_read_is_not_signalled(own_zygote, monkeypatch):
    """(session 90, session 89's report) Between a build's end (the zygote reaps it and replies) and this process
    reading that reply, ``kill`` signalled the build's pid, which Linux may have given to another process by then.
    It now signals through the build's pidfd, which reaches that process or none; where a build was reaped before
    its pidfd could be opened, nothing is sent."""
    if not hasattr(os, "pidfd_open"):
        pytest.skip("pidfds are Linux's (5.3 on)")
    sent = []
    real_kill = os.kill
    monkeypatch.setattr(build.os, "kill", lambda pid, sig: (sent.append(pid), real_kill(pid, sig)))
    proc = build.start_builder("zygote_probe", ["ends", "3"], {})
    while proc.read():
        pass
    assert _reply_arrived(own_zygote)  # (the build ended and was reaped; its end not read yet)
    proc.kill()
    assert proc.wait() == 3 and not sent

    def reaped(pid):
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(build.os, "pidfd_open", reaped)
    proc = build.start_builder("zygote_probe", ["ends", "5"], {})
    proc.kill()
    assert _run(proc)[0] == 5 and not sent


@pytest.mark.parametrize("pidfd", ["pidfd", "pid"])
def test_a_running_build_is_killed_through_its_pidfd_or_its_pid(own_zygote, monkeypatch, pidfd):
    """(session 90) ``kill`` of a running build ends it by SIGKILL, through its pidfd, or by its pid where the
    system gives no pidfd (not Linux, an old kernel)."""
    if pidfd == "pid":
        monkeypatch.delattr(build.os, "pidfd_open", raising=False)
    elif not hasattr(os, "pidfd_open"):
        pytest.skip("pidfds are Linux's (5.3 on)")
    proc = build.start_builder("zygote_probe", ["sleep"], {})
    assert isinstance(proc, build.Forked) and proc.read().startswith(b"sleeping")
    assert (proc._pidfd is not None) == (pidfd == "pidfd")
    proc.kill()
    assert _run(proc)[0] == -signal.SIGKILL and proc._pidfd is None and build._ZYGOTE == [own_zygote]
