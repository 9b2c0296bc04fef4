"""A process that has imported onnxruntime-genai's model builder (torch, transformers, onnx_ir: ~7 s on a 2-core
CPU, most of a small model's build) once, and forks a child of itself for each build (export/build.py's
``run_builder`` through ``start_builder``).

The zygote runs as ``python -m edgespec_export.builder_zygote FD [MODULE...]`` (the modules it imports; by default
``PRELOAD``, the builder's), FD one end of a Unix socket pair whose other end
is the exporting process's. The protocol, one build at a time:

- request: 8 bytes (the payload's length, big-endian) sent with one file descriptor (``socket.send_fds``), the
  write end of the pipe the child's stdout and stderr go to; then the payload, JSON: ``module`` (run as
  ``__main__``, as ``python -m`` does), ``argv``, ``env`` (the child's whole environment: the exporting process's
  now, not the zygote's at its start), ``cwd``.
- replies, JSON lines: ``{"pid": N}`` once forked, ``{"exit": code}`` once the child ended (``code`` as
  ``subprocess``'s ``returncode``: negative for a signal).

Before its first request the zygote says ``{"ready": true}``, or ``{"ready": false, "why": ...}`` where it could not
import the builder or where an import initialised CUDA (a forked child could not use it): the exporting process then
starts every build as a process of its own, as before. The zygote never builds anything itself, so every child
starts as a fresh ``python -m`` would, less the imports: what differs is said where ``_child`` mends it. The
zygote ignores SIGINT (Ctrl-C in a terminal reaches the whole process group: the child stops, the zygote stays for
the next build) and ends at its socket's end (the exporting process gone: at once where idle, after the build where
one runs, as a builder started alone went on); on Linux a child ends with its zygote (``PR_SET_PDEATHSIG``).

The exporting process's side (``start_builder``): a zygote whose replies can no longer be trusted (an interrupt
between a request and its end, a reply that is not the one expected) is killed, its build with it, and the next
build starts a fresh one; so does an environment changed since the zygote started in a variable read at import
(``_IMPORT_TIME``)."""
from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import threading

PRELOAD = ("onnxruntime_genai.models.builder", "edgespec_export.builder_shim", "edgespec_export.hqq_builder")
# variables a process reads as it starts or imports (Python's own, the thread pools', torch's, onnxruntime's, the
# Hugging Face libraries', the loader's): a zygote imported under other values than the build's would differ
_IMPORT_TIME = ("PYTHON", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOTO", "NUMEXPR", "TORCH", "ORT_", "HF_",
                "TRANSFORMERS_", "LD_", "CUDA", "NVIDIA_")


def _die_with_parent(parent: int) -> None:
    """Linux: SIGKILL this process when the one that started it (``parent``, its pid) ends (best effort; elsewhere
    nothing). A parent that ended before the signal was asked for (between the fork and here) sent none: this
    process ends now, as it would have."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)


# -- the zygote ------------------------------------------------------------------------------------------------------
def _preload(names) -> str | None:
    """The builder's modules (``names``) imported; the reason this process cannot fork builds, or None."""
    import importlib

    for name in names:
        importlib.import_module(name)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "importing the builder initialised CUDA"
    return None


def _exact(sock: socket.socket, n: int, first: bytes = b"") -> bytes | None:
    buf = first
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _receive(sock: socket.socket):
    """The next request (its payload and the pipe's write end), or None once the exporting process is gone."""
    head, fds, _, _ = socket.recv_fds(sock, 8, 1)
    head = _exact(sock, 8, head) if head else None
    if head is None or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        return None
    payload = _exact(sock, int.from_bytes(head, "big"))
    if payload is None:
        os.close(fds[0])
        return None
    return json.loads(payload), fds[0]


def _child(req: dict, out_fd: int, sock: socket.socket, parent: int) -> None:
    """In the forked child of zygote ``parent`` (its pid): the module run as ``python -m`` runs it, output to
    ``out_fd``. Never returns."""
    code = 1
    interrupted = False
    try:
        sock.close()
        _die_with_parent(parent)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.path[0] = req["cwd"]  # (``python -m``'s first entry: the directory it starts in)
        sys.argv = [req["module"], *req["argv"]]
        import runpy
        import warnings

        # (the preloaded modules run again as __main__: runpy's warning says so, as it would not in a fresh process)
        warnings.filterwarnings("ignore", message=r"'.*' found in sys\.modules after import of package",
                                category=RuntimeWarning)
        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:  # as the interpreter reads it: None 0, an int itself, anything else printed, 1
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except KeyboardInterrupt:  # (a fresh process ends by SIGINT: its status says so)
        import traceback

        interrupted = True  # (first: the traceback's write may fail, its reader gone)
        traceback.print_exc()
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            try:
                atexit._run_exitfuncs()  # (what the interpreter's exit runs; os._exit below does not)
                sys.stdout.flush()
                sys.stderr.flush()
            finally:  # (a flush that failed, its reader gone: the build still ends by its SIGINT)
                if interrupted:
                    signal.signal(signal.SIGINT, signal.SIG_DFL)
                    os.kill(os.getpid(), signal.SIGINT)
        finally:
            os._exit(code)


def _say(sock: socket.socket, **kw) -> None:
    sock.sendall(json.dumps(kw).encode() + b"\n")


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    # (not _die_with_parent: its signal comes when the *thread* that started the zygote ends, which killed a build
    # another thread ran through it; the zygote ends at its socket's end instead)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        why = _preload(sys.argv[2:] or PRELOAD)
    except BaseException as e:  # (an ImportError: the builder started alone says it, as it always did)
        why = f"{type(e).__name__}: {e}"
    _say(sock, ready=why is None, **({"why": why} if why else {}))
    if why:
        return
    while True:
        got = _receive(sock)
        if got is None:
            return
        req, out_fd = got
        me = os.getpid()
        pid = os.fork()
        if pid == 0:
            _child(req, out_fd, sock, me)
        os.close(out_fd)
        try:
            _say(sock, pid=pid)
        finally:
            _, status = os.waitpid(pid, 0)
        _say(sock, exit=os.waitstatus_to_exitcode(status))


# -- the exporting process's side -----------------------------------------------------------------------------------
def _import_env(env) -> dict:
    return {k: v for k, v in env.items() if k.startswith(_IMPORT_TIME)}


class Alone:
    """The builder as a process of its own (``python -m MODULE``), where no zygote serves."""

    def __init__(self, module: str, args: list[str], env: dict):
        self._p = subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, env=dict(os.environ, **env) if env else None)

    def read(self) -> bytes:
        return self._p.stdout.read1(4096)

    @property
    def returncode(self):
        return self._p.returncode

    def kill(self) -> None:
        self._p.kill()

    def wait(self) -> int:
        rc = self._p.wait()
        self._p.stdout.close()
        return rc


class Zygote:
    """The zygote process and this end of its socket."""

    def __init__(self):
        self.env = _import_env(os.environ)
        self.sock, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "edgespec_export.builder_zygote", str(theirs.fileno()),
                                          *PRELOAD],
                                         pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except BaseException:
            self.sock.close()
            raise
        finally:
            theirs.close()
        self._lines = self.sock.makefile("rb")
        self.ready: bool | None = None  # None until the zygote said

    def reply(self, key: str) -> int:
        """The next reply's ``key``; ConnectionError where the zygote ended, ValueError where it said another
        thing."""
        line = self._lines.readline()
        if not line:
            raise ConnectionError("the builder's zygote ended")
        got = json.loads(line)
        if not isinstance(got, dict) or not isinstance(got.get(key), (int, bool)):
            raise ValueError(f"the builder's zygote said {line[:80]!r} where {key!r} was due")
        return got[key]

    def usable(self) -> bool:
        if self.ready is None:
            try:
                self.ready = bool(self.reply("ready"))
            except (OSError, ValueError):  # it ended before it said (killed): replaced at the next build
                self.ready = False
            else:
                if not self.ready:  # it said it cannot serve: no zygote again in this process
                    _UNAVAILABLE.append(True)
            if not self.ready:
                self.close(kill=True)
        return self.ready and self.proc.poll() is None

    def close(self, kill: bool = False) -> None:
        """Its socket closed (it ends at its next read), or killed (``kill``: with its child, on Linux)."""
        if self in _ZYGOTE:
            _ZYGOTE.remove(self)
        self._lines.close()
        self.sock.close()
        if kill:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Forked:
    """A build forked by the zygote: its output read from a pipe, its end from the zygote's reply."""

    def __init__(self, zygote: Zygote, module: str, args: list[str], env: dict, release):
        self._z = zygote
        self._release = release  # the zygote's lock, let go once the build's end is read
        self.returncode = None
        self.pid = None
        self._pidfd = None  # the build's process as a descriptor, where Linux gives one (``kill``)
        self._reaped = False  # it ended and the zygote reaped it before this process could ask for its descriptor
        try:
            r, w = os.pipe()
        except BaseException:  # (no pipe, out of descriptors: nothing was sent, the zygote serves the next build)
            release()
            raise
        self._r = r
        try:
            payload = json.dumps({"module": module, "argv": args, "env": dict(os.environ, **env),
                                  "cwd": os.getcwd()}).encode()
            socket.send_fds(zygote.sock, [len(payload).to_bytes(8, "big")], [w])
            zygote.sock.sendall(payload)
            os.close(w)
            w = None
            self.pid = zygote.reply("pid")
            self._open_pidfd()
        except BaseException:  # (sent or not: this zygote's replies cannot be trusted now)
            if w is not None:
                os.close(w)
            self._end(None)
            raise

    def read(self) -> bytes:
        return os.read(self._r, 4096)

    def _open_pidfd(self) -> None:
        """The build's pidfd (Linux 5.3 on): a signal sent through it reaches that process or none, never another
        that was given its pid after the zygote reaped it (between the build's end and this process reading the
        zygote's reply of it, a ``kill`` by pid could). Without one, ``kill`` signals the pid."""
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:  # (ended and reaped already: there is nothing to signal)
            self._reaped = True
        except (AttributeError, OSError):  # (not Linux, an old kernel, no descriptor left)
            pass

    def kill(self) -> None:
        if self.returncode is not None or self.pid is None or self._reaped:
            return
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            else:
                os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def wait(self) -> int:
        if self.returncode is None:
            code, keep = -signal.SIGKILL, False  # (interrupted while waiting: the zygote and the build are killed)
            try:
                code = self._z.reply("exit")
                keep = True
            except (OSError, ValueError):  # the zygote was killed: its child's end is unknown, a failure
                code = 1
            finally:  # (an interrupt right after the reply ends the build too: the lock is let go either way)
                self._end(code, keep=keep)
        return self.returncode

    def _end(self, code, keep: bool = False) -> None:
        """Once: the pipe closed, the zygote's lock let go; the zygote killed unless ``keep``."""
        if self._r is None:
            return
        self.returncode = code  # (first: a ``kill`` from a signal handler from now on sends nothing)
        os.close(self._r)
        self._r = None
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        try:
            if not keep:
                self._z.close(kill=True)
        finally:
            self._release()


_ZYGOTE: list = []  # the process's zygote, once started
_UNAVAILABLE: list = []  # a zygote said it cannot serve: every build of this process runs alone
_LOCK = threading.Lock()  # one build at a time through the zygote


def _forks() -> bool:
    return hasattr(os, "fork") and hasattr(socket, "send_fds") and not _UNAVAILABLE


def _zygote() -> Zygote | None:
    """The running zygote (started if none is; a dead one, or one started under another environment, replaced), or
    None where none can start."""
    if _ZYGOTE and (_ZYGOTE[0].proc.poll() is not None or _ZYGOTE[0].env != _import_env(os.environ)):
        _ZYGOTE[0].close(kill=True)
    if not _ZYGOTE:
        try:
            _ZYGOTE.append(Zygote())
        except OSError:
            return None
    return _ZYGOTE[0]


def prestart_builder() -> None:
    """The builder's zygote started now (export_bundle's first step), so that its imports run beside the export's
    own reading of the model; a no-op where one runs, where a build runs through it, or where none can serve."""
    if _forks() and _LOCK.acquire(blocking=False):
        try:
            _zygote()
        finally:
            _LOCK.release()


def start_builder(module: str, args: list[str], env: dict):
    """``python -m MODULE ARGS`` with ``env`` over this process's environment, its stdout and stderr together:
    forked by the zygote where one serves (the builder's imports done once a process), else a process of its own
    (``Alone``). One build at a time goes through the zygote; a second one at the same time runs alone."""
    if _forks() and _LOCK.acquire(blocking=False):
        held = True
        try:
            z = _zygote()
            if z is not None and z.usable():
                held = False  # (the build lets the lock go, at its end or as it fails)
                return Forked(z, module, args, env, _LOCK.release)
        except (OSError, ValueError):  # the zygote died under us: the build runs alone, the next starts a zygote
            pass
        finally:
            if held:
                _LOCK.release()
    return Alone(module, args, env)


@atexit.register
def _stop() -> None:
    """Every zygote of this process killed (at its exit; the tests' own zygotes at their end)."""
    while _ZYGOTE:
        _ZYGOTE[0].close(kill=True)


if __name__ == "__main__":
    main()
