"""The model builder's zygote (export/builder_zygote.py): builds forked from one process that imported the builder
once, each as a fresh ``python -m`` would run, with the exporting process's environment and directory of now."""
from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

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
if sys.argv[1:2] == ["raise"]:
    raise ValueError("a bug in the probe")
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "env": os.environ.get("PROBE_VAR"),
                  "ppid": os.getppid(), "builder": "builders.base" in sys.modules}))
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
    assert got == {"argv": ["a", "b c"], "cwd": str(here), "env": "set after the zygote started",
                   "ppid": own_zygote.proc.pid, "builder": True}
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


def test_a_changed_import_time_variable_gets_a_fresh_zygote(own_zygote, monkeypatch):
    other = str(int(os.environ.get("OMP_NUM_THREADS", "0")) + 1)  # (the suite's workers set one: conftest.py)
    monkeypatch.setenv("OMP_NUM_THREADS", other)
    rc, out = _run(build.start_builder("zygote_probe", [], {}))
    assert rc == 0 and json.loads(out)["ppid"] != own_zygote.proc.pid and build._ZYGOTE[0] is not own_zygote
    assert build._ZYGOTE[0].env["OMP_NUM_THREADS"] == other


def test_a_zygote_that_cannot_serve_is_asked_once(probe_path, monkeypatch):
    """A zygote that says it cannot fork builds (here: its imports fail) is not started again for every build:
    each would wait for its imports first (a review: 6-7 s a build, slower than before the zygote)."""
    monkeypatch.setenv("PYTHONPATH", str(probe_path) + os.pathsep + str(probe_path / "poison"))
    monkeypatch.setattr(build, "_UNAVAILABLE", [])
    t0 = time.monotonic()
    for _ in range(3):
        proc = build.start_builder("zygote_probe", [], {})
        assert _run(proc)[0] == 0
    assert isinstance(proc, build.Alone) and build._UNAVAILABLE and not build._ZYGOTE
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
    process forks the child as a zygote would, naming itself (alive) or another process (gone) as the zygote."""
    import socket
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("the death signal is Linux's")
    r, w = os.pipe()
    ours, theirs = socket.socketpair()
    req = {"module": "zygote_probe", "argv": [], "env": dict(os.environ), "cwd": str(probe_path)}
    me = os.getpid()
    pid = os.fork()
    if pid == 0:  # (the child: none of pytest's exit handlers, which would stop this process's zygotes, and the
        import atexit  # interpreter's own streams, on descriptors 1 and 2, not pytest's capture)

        atexit._clear()
        sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
        os.close(r)
        build._child(req, w, theirs, me if parent == "alive" else 1)
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
