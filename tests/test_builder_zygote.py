"""The model builder's zygote (export/builder_zygote.py): builds forked from one process that imported the builder
once, each as a fresh ``python -m`` would run, with the exporting process's environment and directory of now."""
from __future__ import annotations

import json
import os
import time

import pytest

from edgespec_export import build

PROBE = '''
import json, os, sys, time
if sys.argv[1:2] == ["sleep"]:
    print("sleeping", flush=True)
    time.sleep(60)
if sys.argv[1:2] == ["nap"]:
    time.sleep(2)
if sys.argv[1:2] == ["fail"]:
    raise SystemExit("the probe failed on purpose")
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
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", str(mods))
        while build._ZYGOTE:
            build._ZYGOTE.pop().close()
        yield mods
        while build._ZYGOTE:
            build._ZYGOTE.pop().close()


@pytest.fixture
def own_zygote(probe_path):
    build.prestart_builder()
    return build._ZYGOTE[0]


def _run(proc) -> tuple[int, str]:
    out = b""
    while chunk := proc.read():
        out += chunk
    return proc.wait(), out.decode()


def test_builds_fork_from_one_zygote_with_this_processs_environment_now(own_zygote, tmp_path, monkeypatch):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setenv("PROBE_VAR", "set after the zygote started")
    proc = build.start_builder("zygote_probe", ["a", "b c"], {})
    rc, out = _run(proc)
    assert isinstance(proc, build._Forked) and rc == 0, out
    got = json.loads(out)
    assert got == {"argv": ["a", "b c"], "cwd": str(here), "env": "set after the zygote started",
                   "ppid": own_zygote.proc.pid, "builder": True}
    rc, out = _run(build.start_builder("zygote_probe", ["x"], {"PROBE_VAR": "given"}))
    assert rc == 0 and json.loads(out)["env"] == "given" and json.loads(out)["ppid"] == own_zygote.proc.pid
    assert build._ZYGOTE == [own_zygote]  # the same zygote served both


def test_a_build_that_fails_says_why_and_the_zygote_serves_the_next(own_zygote):
    rc, out = _run(build.start_builder("zygote_probe", ["fail"], {}))
    assert rc == 1 and "the probe failed on purpose" in out
    rc, out = _run(build.start_builder("zygote_probe", ["raise"], {}))
    assert rc == 1 and "Traceback (most recent call last)" in out and "ValueError: a bug in the probe" in out
    rc, out = _run(build.start_builder("zygote_probe", [], {}))
    assert rc == 0 and json.loads(out)["ppid"] == own_zygote.proc.pid


def test_a_killed_build_ends_and_a_second_build_meanwhile_runs_alone(own_zygote):
    proc = build.start_builder("zygote_probe", ["sleep"], {})
    assert isinstance(proc, build._Forked)
    assert proc.read().startswith(b"sleeping")
    other = build.start_builder("zygote_probe", ["y"], {})  # (the zygote is busy: a process of its own)
    rc, out = _run(other)
    assert isinstance(other, build._Alone) and rc == 0 and json.loads(out)["ppid"] == os.getpid()
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
    assert isinstance(proc, build._Forked) and json.loads(out)["ppid"] == build._ZYGOTE[0].proc.pid


def test_a_zygote_killed_during_a_build_fails_that_build(own_zygote):
    proc = build.start_builder("zygote_probe", ["nap"], {})
    assert isinstance(proc, build._Forked)
    own_zygote.proc.kill()
    own_zygote.proc.wait()
    rc, out = _run(proc)  # (the build ran to its end, unseen: the zygote that would have said so is gone)
    assert rc == 1 and json.loads(out)["argv"] == ["nap"]
