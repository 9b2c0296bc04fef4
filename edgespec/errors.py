"""Typed errors. The library raises these; only the CLI turns them into messages and exit codes."""
from __future__ import annotations


class EdgespecError(Exception):
    """Base class of every error edgespec raises on purpose."""

    exit_code = 1


class BundleError(EdgespecError):
    """A bundle directory is missing, incomplete, corrupt or inconsistent."""

    exit_code = 2


class ManifestError(BundleError):
    """edgespec.json is unreadable or does not follow the schema."""


class TokenizerMismatchError(BundleError):
    """Target and drafter do not share a tokenizer."""


class ContextOverflowError(EdgespecError):
    """The prompt (plus what must be generated) does not fit the context window."""

    exit_code = 3


class BudgetError(EdgespecError):
    """The memory budget cannot hold what was asked for."""

    exit_code = 4


class ProfileError(EdgespecError):
    """A memory profile is unknown, unreadable or has bad values."""

    exit_code = 2


class ProviderError(EdgespecError):
    """An execution provider that was explicitly asked for cannot run."""

    exit_code = 5


class CpuFallbackError(ProviderError):
    """A GPU provider does not take some of a graph's nodes, which onnxruntime would run on the CPU."""


class ConfigError(EdgespecError):
    """Bad generation or engine options."""

    exit_code = 2


class BusyError(EdgespecError):
    """The engine is already generating (one generation at a time per engine)."""


class ExportError(EdgespecError):
    """The export stage could not convert, quantize or validate a model."""

    exit_code = 6


class NoSpaceError(ExportError):
    """An export or a bundle's rewrite met a full disk (or quota): exit 1, as the system's other refusals a user can
    act on; nothing was written and a bundle rewritten in place is unchanged."""

    exit_code = 1


class ChatTemplateError(ConfigError):
    """The chat template failed to render or went over its limits (time, size, nesting)."""


class StoreError(EdgespecError):
    """A drafting memory store file is corrupt, foreign (made for another bundle) or unwritable."""


class DocumentError(ConfigError):
    """A documents file for retrieval drafting is missing, binary, not UTF-8 text or too large."""


class ClosedError(EdgespecError):
    """The engine was closed (``Engine.close``): it no longer holds its models."""


def parse_reason(e: BaseException) -> str:
    """A parser's error (json's, tomllib's, Python's) as a message's reason: its first clause (Python's limit on an
    integer's digits goes on "; use sys.set_int_max_str_digits() to increase the limit", advice for programmers),
    its type where it says nothing."""
    return str(e).split(";")[0] or type(e).__name__


def big_integer(obj, limit: int, where: str) -> tuple[str, int] | None:
    """The first integer (not a bool) in parsed JSON ``obj`` whose magnitude is past ``limit``, as (its path from
    ``where``, its value); None where there is none. Iterative: a deeply nested value does not recurse."""
    stack = [(obj, where)]
    while stack:
        v, at = stack.pop()
        if isinstance(v, dict):
            stack.extend((x, f"{at}.{k}") for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((x, f"{at}[{i}]") for i, x in enumerate(v))
        elif isinstance(v, int) and not isinstance(v, bool) and abs(v) > limit:
            return at, v
    return None


def shown(v, limit: int = 200) -> str:
    """``repr(v)`` for a message, at most ``limit`` characters; an integer too long for Python to write (past 4,300
    digits: a ValueError, where a typed error was meant) by its size."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 256:
        return f"an integer of {v.bit_length():,} bits"
    try:
        return repr(v)[:limit]
    except ValueError:  # (a container holding such an integer)
        return f"a {type(v).__name__} holding an integer too long to write"


def resolved(path, error: type = None):
    """``Path(path).resolve()``, a symbolic link that leads back to itself an ``error`` (default ``BundleError``)
    naming the path: Python up to 3.12 raises a RuntimeError for one (a traceback where a command ends on a one-line
    error; session 64, a review: ``ln -s b b; edgespec info b``), 3.13 on returns the path as it is, which then
    fails where it is opened: the loop is asked of the system (ELOOP) either way."""
    import errno
    import os
    from pathlib import Path

    try:
        out = Path(path).resolve()
    except RuntimeError as e:  # (before 3.13)
        if "loop" not in str(e).lower():
            raise
        out = None
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        out = None
    if out is not None:
        try:
            os.stat(path)  # (3.13 on: resolve() gives a loop back as it is; only ELOOP counts here)
        except OSError as e:
            if e.errno == errno.ELOOP:
                out = None
    if out is None:
        raise (error or BundleError)(f"{path} is a symbolic link that leads back to itself (a loop)") from None
    return out


def state_path(path, error: type = None):
    """Where a state file named ``path`` (a prompt cache file, a memory store: read now, written later) is read and
    written: an absolute path (a relative one followed the process's working directory to the write, and an app that
    changed it overwrote or deleted a file of that name elsewhere; session 92, a review), through a symbolic link the
    file it names (a temporary file and a rename replaced the link itself: a state file linked onto a kept volume
    stopped being saved there; session 64), a loop an ``error`` (``resolved``)."""
    from pathlib import Path

    p = Path(path).expanduser().absolute()
    return resolved(p, error) if p.is_symlink() else p


class Interrupted(EdgespecError):
    """A prefill or a prompt's scoring stopped between its calls because its ``interrupt`` said so (the server's
    client left, or the server is stopping); what the cache holds stays valid."""

    exit_code = 130
