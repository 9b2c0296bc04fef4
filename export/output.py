"""Where an export may write: what ``--force`` may replace, stale partial bundles, SIGTERM and SIGHUP."""
from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

from edgespec.errors import ExportError, NoSpaceError
from edgespec.errors import resolved as resolved_path
from edgespec.manifest import MANIFEST_NAME


def check_output(out: str | os.PathLike, force: bool, inputs: list[str | None]) -> Path:
    """The bundle directory to write, resolved. An existing path is replaced only with ``force``
    and only if it is a bundle (a directory with an edgespec manifest) that is not a symlink, not
    the current directory or one above it, and holds none of the export's inputs."""
    given = Path(out).expanduser()
    resolved = resolved_path(given, ExportError)
    restore_stale_old(resolved)
    if not (given.exists() or given.is_symlink()):
        _probe(resolved)
        return resolved
    if given.is_symlink() and not resolved.exists():  # (a link to nothing: "<its target> exists" was false)
        raise ExportError(f"{given} is a symlink to {resolved}, which does not exist; give the bundle directory "
                          "to write itself")
    if not force:
        raise ExportError(f"{resolved} exists; pass --force to replace it (an existing bundle only)")
    if given.is_symlink():
        raise ExportError(f"{given} is a symlink; --force does not replace what a link points to "
                          "(give the bundle directory itself)")
    if not resolved.is_dir() or not (resolved / MANIFEST_NAME).is_file():
        what = "a directory" if resolved.is_dir() else "a file"
        raise ExportError(f"{resolved} is {what} but not an edgespec bundle; --force replaces only a bundle")
    check_not_mount(resolved)
    cwd = Path.cwd().resolve()
    if cwd == resolved or resolved in cwd.parents:
        raise ExportError(f"{resolved} is the current directory or contains it; --force will not replace it")
    for src in inputs:
        if src and Path(src).expanduser().exists():
            p = Path(src).expanduser().resolve()
            if p == resolved or resolved in p.parents:
                raise ExportError(f"{resolved} holds the export's input {src}; --force will not replace it")
    return resolved


def restore_stale_old(out: Path) -> Path | None:
    """Where ``out`` is missing and ``.<name>.old-<pid>`` of a process no longer running is a bundle beside it (one
    killed between publish's two renames: the old bundle's only copy), put it back as ``out``; returns it."""
    if out.exists() or out.is_symlink() or not out.parent.is_dir():
        return None
    pattern = re.compile(rf"\.{re.escape(out.name)}\.old-(\d+)")
    for p in _newest_first(out.parent):
        m = pattern.fullmatch(p.name)
        if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))) and _whole_bundle(p):
            try:
                p.rename(out)
            except OSError:
                return None
            return out
    return None


def rewrites_in_place(bundle: str | os.PathLike, out: str | os.PathLike | None) -> bool:
    """Whether a rewrite of ``bundle`` into ``out`` is one in place: no ``out``, or ``out`` naming the bundle."""
    return out is None or Path(out).expanduser().resolve() == Path(bundle).expanduser().resolve()


@contextmanager
def rewriting(bundle: str | os.PathLike, out: str | os.PathLike | None = None):
    """Held while ``bundle`` is rewritten (drafter-vocab, exact-kernels) in place (``out`` None or the bundle
    itself) or into the new bundle ``out``: a bundle that a rewrite stopped between publish's two renames left
    aside is put back first, and a lock on the bundle's folder refuses at once what would clash. In place the lock
    is exclusive: a second rewrite of the bundle is refused (two ran together, both exited 0, and one's result was
    lost, or the later one wrote its old manifest over the other's files: a bundle that no longer loaded; session
    55, a review), and so is one while another rewrite copies the bundle elsewhere. Into a new bundle it is shared:
    the source is only read, so several such rewrites of one bundle run at once (each was refused, session 71),
    and an in-place rewrite of it waits for none of them but is refused. Where the system has no ``flock``, no
    lock."""
    path = Path(bundle).expanduser()
    exclusive = rewrites_in_place(path, out)
    restore_stale_old(path.resolve())
    try:
        import fcntl
    except ImportError:  # (not POSIX)
        yield
        return
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # (no such folder, not one: load_manifest says so, as everywhere)
        yield
        return
    try:
        try:
            fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except OSError as e:
            import errno

            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                doing = "rewritten or copied by another edgespec rewrite" if exclusive else "rewritten in place by "\
                    "another edgespec process"
                raise ExportError(f"{path} is being {doing}; run this again once it is done") from None
            # (a file system without flock on folders, NFS's EBADF or ENOLCK: no lock, as where there is no fcntl)
        yield
    finally:
        os.close(fd)


def _newest_first(parent: Path) -> list[Path]:
    """``parent``'s entries, the most recently changed first (one gone meanwhile, another export's, left out)."""
    def mtime(q: Path) -> int:
        try:
            return q.lstat().st_mtime_ns
        except OSError:
            return -1

    try:
        return sorted(parent.iterdir(), key=lambda q: -mtime(q))
    except OSError:
        return []


def _whole_bundle(p: Path) -> bool:
    """``p`` is a bundle folder whose manifest reads and whose files have their recorded sizes (not a copy whose
    removal was cut short: its manifest may outlive its weights)."""
    if not p.is_dir() or p.is_symlink() or not (p / MANIFEST_NAME).is_file():
        return False
    from edgespec.errors import EdgespecError
    from edgespec.manifest import load_manifest

    try:
        load_manifest(p)
    except (EdgespecError, OSError, ValueError):
        return False
    return True


def check_not_mount(bundle: Path) -> None:
    """A bundle is replaced by renaming its folder, which a mount point refuses (a container's volume): refused
    before the build (after it, EBUSY came as a traceback; session 54, a review)."""
    if os.path.ismount(bundle) or _in_mountinfo(bundle):
        raise ExportError(f"{bundle} is a mount point, which cannot be replaced (a bundle is put in place by renaming "
                          f"its folder): write the bundle to a folder inside it")


def _in_mountinfo(path: Path) -> bool:
    """Whether ``path`` is a mount point as /proc/self/mountinfo lists them (a bind mount of a folder of the same
    file system, which os.path.ismount does not see: it compares devices)."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            points = {line.split(" ")[4] for line in f if line.count(" ") >= 5}
    except OSError:
        return False
    unescape = lambda x: re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), x)  # noqa: E731
    return str(path) in {unescape(x) for x in points}


def _probe(out: Path) -> None:
    """Refuse a place where the bundle cannot be written before anything is read: a folder made in the nearest
    folder above ``out`` that exists (its missing parents are made by ``prepare_stage``, and removed again by an
    export that fails: ``missing_parents``; made here, a failed export left them)."""
    up = out.parent
    while not up.exists() and up != up.parent:
        up = up.parent
    if up.exists() and not up.is_dir():
        raise ExportError(f"cannot write the bundle at {out}: {up} is a file, not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f".{out.name}.probe-", dir=up))
    except OSError as e:
        raise ExportError(f"cannot write the bundle at {out}: {e.strerror or e}") from None


def missing_parents(out: Path) -> list[Path]:
    """The folders above ``out`` that do not exist yet, the deepest first: what a failed export removes again
    (``remove_parents``)."""
    return [p for p in out.parents if not p.exists()]


def remove_parents(parents: list[Path]) -> None:
    """Remove the folders ``missing_parents`` listed, the deepest first, those still empty only."""
    for p in parents:
        try:
            p.rmdir()
        except OSError:  # (not empty: something else was put there meanwhile; or gone)
            break


def remove_tree(path: Path) -> None:
    """``shutil.rmtree`` that also removes folders their owner cannot write (a copy of a read-only bundle, which
    ``rmtree(ignore_errors=True)`` left whole and silent: ~1 GB a failed rewrite of a 1.5B); errors ignored."""
    import stat

    def writable_parent(func, p, _exc):
        try:
            parent = os.path.dirname(p)
            os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)
            if func is os.rmdir or os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | stat.S_IWUSR | stat.S_IXUSR | stat.S_IRUSR)
                shutil.rmtree(p, ignore_errors=True)
            else:
                func(p)
        except OSError:
            pass

    try:
        shutil.rmtree(path, onerror=writable_parent)
    except OSError:
        pass


def prepare_stage(out: Path) -> Path:
    """Make ``.<name>.partial-<pid>`` beside ``out`` (removing the partial bundles that exports
    killed before they could clean up left there)."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale(out.parent, out.name)
        stage = out.parent / f".{out.name}.partial-{os.getpid()}"
        if stage.exists():
            shutil.rmtree(stage)
        stage.mkdir()
    except OSError as e:
        raise ExportError(f"cannot write the bundle at {out}: {e.strerror or e}") from None
    return stage


def _full_disk_error(e: BaseException) -> BaseException | None:
    """The error in ``e``'s chain (``e`` itself, what it was raised from, what it was raised during, unless that was
    suppressed: ``raise ... from None``) that says the disk or quota is full: an OSError's errno, a NoSpaceError (a
    nested rewrite's), or a library's own error in the system's words (onnx's and protobuf's writes, safetensors':
    no path); None where there is none."""
    import errno

    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, NoSpaceError) or (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)):
            return e
        if "No space left on device" in str(e) or "Disk quota exceeded" in str(e):
            return e
        e = e.__cause__ if e.__cause__ is not None or e.__suppress_context__ else e.__context__
    return None


def raise_if_full(e: BaseException, what: str, where: Path, kept: str) -> None:
    """Raise the one-line NoSpaceError for ``e`` where it is a full disk met while writing ``what`` into the folder
    ``where`` (the stage's: the library that failed named none; a file the error names is said too), ``kept`` saying
    what stayed as it was; return where it is not one (or not an Exception: Ctrl-C, SIGTERM)."""
    if not isinstance(e, Exception):
        return
    cause = _full_disk_error(e)
    if cause is None:
        return
    named = getattr(cause, "filename", None)
    if named is not None and not str(named).startswith(str(where)):  # (a cache's disk, not the bundle's)
        raise NoSpaceError(f"no space left on device while writing {what}: {named}: {kept}") from e
    near = Path(where)
    while not near.exists() and near.parent != near:  # (its folders made for it are gone again by now)
        near = near.parent
    free = ""
    try:
        left = shutil.disk_usage(near).free
        free = (f", {left / (1 << 20):,.0f} MiB free there now" if left >= 1 << 20 else
                f", {left / 1024:,.0f} KiB free there now")
    except OSError:
        pass
    raise NoSpaceError(f"no space left on device while writing {what} in {where}{free}: {kept}") from e


def publish(stage: Path, out: Path, force: bool = True, inputs: list[str | None] | None = None) -> Path | None:
    """Rename the finished ``stage`` to ``out``. A bundle already at ``out`` is moved aside first
    and removed once the new one is in place; stopped between the two renames, it is put back.
    ``inputs`` given (a new bundle, not an in-place rewrite): what is at ``out`` now is checked again as at the
    export's start (``check_output``): a directory made there while the export ran (or another export's bundle,
    without ``force``) is not replaced (session 49, a review: it was moved aside and deleted, files and all)."""
    import errno

    raise_if_terminated()  # (a SIGTERM whose exception was lost: nothing is published)
    if inputs is not None and (out.exists() or out.is_symlink()):
        try:
            check_output(out, force, inputs)
        except ExportError as e:
            raise ExportError(f"{e} (it appeared while the export ran; the new bundle is not written)") from None
    old = out.parent / f".{out.name}.old-{os.getpid()}" if out.exists() else None
    if old is not None and (old.exists() or old.is_symlink()):  # (this process's earlier one, not yet removed)
        remove_tree(old)
    try:  # the first rename inside: a SIGTERM right after it still puts the old bundle back
        if old is not None:
            out.rename(old)
        stage.rename(out)  # (onto a directory made since the check above: refused where it holds anything)
    except OSError as e:
        if old is not None and old.exists() and not out.exists():
            old.rename(out)
        if old is None and e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise ExportError(f"{out} appeared while the export ran; the new bundle is not written") from None
        raise ExportError(f"cannot put the bundle in place at {out}: {e.strerror or e}") from None
    except BaseException:
        if old is not None and old.exists() and not out.exists():
            old.rename(out)
        raise
    return old


def remove_replaced(path: Path | None) -> None:
    """The bundle a publish replaced (``publish``'s return), removed once the new one is in place and the export's
    SIGTERM guard is gone. A SIGTERM during the removal is taken as coming after the export, which is done: the
    removal finishes and the export ends as it would have (it killed the process there, the new bundle in place,
    the old one half removed, no line; the diff's review, session 54)."""
    if path is None:
        return
    if threading.current_thread() is not threading.main_thread():
        remove_tree(path)
        return
    before = _take_signals(lambda *a: None)
    try:
        remove_tree(path)
    finally:
        _give_back(before)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def remove_stale(parent: Path, name: str) -> list[Path]:
    """Remove ``.<name>.partial-<pid>`` and ``.<name>.old-<pid>`` of processes no longer running, and what an
    ``--exact-kernels`` rewrite of such a stage left beside it (``..<name>.partial-<pid>.partial-<pid>``, its own
    stage, and ``.old-<pid>``: a process killed outright mid-rewrite left ~1 GB for a 1.5B there)."""
    removed = []
    # a process killed between publish's two renames left the old bundle as the only copy (it was deleted here,
    # before the export that found it had built anything; session 54, a review): put back first, the rest is junk
    restore_stale_old(parent / name)
    pattern = re.compile(rf"\.(?:\.{re.escape(name)}\.partial-\d+\.|{re.escape(name)}\.)(partial|old)-(\d+)")
    for p in parent.iterdir():
        m = pattern.fullmatch(p.name)
        if m and int(m.group(2)) != os.getpid() and not _alive(int(m.group(2))) and p.is_dir() \
                and not p.is_symlink():
            remove_tree(p)
            removed.append(p)
    return removed


class Terminated(SystemExit):
    """SIGTERM (or SIGHUP: the terminal closed) during an export: unwinds like Ctrl-C, so the partial bundle is
    removed; exit status 128 + the signal."""


# the signals an export ends on: SIGTERM, and SIGHUP where there is one (a closed terminal or ssh session: its default
# ended the process at once and left the partial bundle, a copy of the bundle's size, until the next export to the
# same place; session 92, a review)
SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))
terminated = False  # one of them came during an export (terminate_cleanly)
signum = signal.SIGTERM  # ... which (the exit status is 128 + it)
_guarded = 0  # terminate_cleanly blocks open in the main thread (raise_if_terminated acts inside one only)


def raise_if_terminated() -> None:
    """``Terminated`` again where the handler's was lost: a handler that Python runs inside a finalizer (a
    ``__del__``, a weakref callback, the garbage collector's) has its exception printed as "Exception ignored in"
    and dropped, and the export went on to its end and published the bundle (a probable cause of CI's failure on
    session 90's submission: a test's export went on into its 60-s manifest write after its SIGTERM). Called at
    an export's every step and line of its log, and before any publish (an export's or a staged rewrite's)."""
    if terminated and _guarded:
        raise Terminated(128 + signum)


@contextmanager
def terminate_cleanly():
    """SIGTERM, and SIGHUP unless it is ignored (``nohup``: the export goes on, as asked), raise ``Terminated``
    (exit status 128 + the signal) in the main thread while the export runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    global terminated
    terminated = False  # (this export's: an earlier one's in a long-lived process is not)

    def handler(sig, frame):
        from .build import RUNNING

        global terminated, signum
        # (raised inside numpy's or onnxruntime's C code, the exception may come out as theirs: "TypeError: expected
        # str, ..." from tofile, "ImportError: initialization failed"; the CLI reads this)
        terminated, signum = True, sig
        for proc in list(RUNNING):  # the model builder, a process of its own, stops too
            proc.kill()
        raise Terminated(128 + sig)

    global _guarded
    old = _take_signals(handler)
    _guarded += 1
    try:
        yield
    finally:
        _guarded -= 1
        _give_back(old)


def _take_signals(handler) -> dict:
    """``handler`` for ``SIGNALS`` (SIGHUP left as it is where it is ignored: ``nohup``); the handlers it replaced."""
    return {sig: signal.signal(sig, handler) for sig in SIGNALS
            if sig == signal.SIGTERM or signal.getsignal(sig) != signal.SIG_IGN}


def _give_back(old: dict) -> None:
    """The handlers ``_take_signals`` replaced, back."""
    for sig, h in old.items():
        signal.signal(sig, h)


def load_graph(model_path):
    """``onnx.load`` of a graph without its external data; a file that is no ONNX graph (truncated,
    overwritten) is an ``ExportError``, not protobuf's ``DecodeError``."""
    import onnx

    from edgespec.errors import ExportError

    try:
        return onnx.load(str(model_path), load_external_data=False)
    except OSError:
        raise
    except Exception as e:  # noqa: BLE001 -- google.protobuf.message.DecodeError and onnx's own
        raise ExportError(f"cannot read the graph {model_path}: {type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else 'not an ONNX model'}") from None
