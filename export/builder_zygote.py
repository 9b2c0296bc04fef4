"""A process that has imported onnxruntime-genai's model builder (torch, transformers, onnx_ir: ~7 s on a 2-core
CPU, most of a small model's build) once, and forks a child of itself for each build (export/build.py's
``run_builder``).

Run as ``python -m edgespec_export.builder_zygote FD``, FD one end of a Unix socket pair whose other end is the
exporting process's. The protocol, one build at a time:

- request: 8 bytes (the payload's length, big-endian) sent with one file descriptor (``socket.send_fds``), the
  write end of the pipe the child's stdout and stderr go to; then the payload, JSON: ``module`` (run as
  ``__main__``, as ``python -m`` does), ``argv``, ``env`` (the child's whole environment: the exporting process's
  now, not this one's at its start), ``cwd``.
- replies, JSON lines: ``{"pid": N}`` once forked, ``{"exit": code}`` once the child ended (``code`` as
  ``subprocess``'s ``returncode``: negative for a signal).

Before its first request the zygote says ``{"ready": true}``, or ``{"ready": false, "why": ...}`` where it could
not import the builder or where an import initialised CUDA (a forked child could not use it): the exporting
process then starts the builder as a process of its own, as before. The zygote never builds anything itself, so
every child starts as a fresh ``python -m`` would, less the imports. It ignores SIGINT (Ctrl-C in a terminal
reaches the whole process group: the child stops, the zygote stays for the next export) and ends when the
exporting process closes its end."""
from __future__ import annotations

import json
import os
import signal
import socket
import sys

PRELOAD = ("onnxruntime_genai.models.builder", "edgespec_export.builder_shim", "edgespec_export.hqq_builder")


def _preload() -> str | None:
    """The builder's modules imported; the reason this process cannot fork builds, or None."""
    import importlib

    for name in PRELOAD:
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


def _child(req: dict, out_fd: int, sock: socket.socket) -> None:
    """In the forked child: the module run as ``python -m`` runs it, output to ``out_fd``. Never returns."""
    code = 1
    try:
        sock.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.argv = [req["module"], *req["argv"]]
        import runpy

        runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:  # as the interpreter reads it: None 0, an int itself, anything else printed, 1
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _say(sock: socket.socket, **kw) -> None:
    sock.sendall(json.dumps(kw).encode() + b"\n")


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        why = _preload()
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
        pid = os.fork()
        if pid == 0:
            _child(req, out_fd, sock)
        os.close(out_fd)
        try:
            _say(sock, pid=pid)
        finally:
            _, status = os.waitpid(pid, 0)
        _say(sock, exit=os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
