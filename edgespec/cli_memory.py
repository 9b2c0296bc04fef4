"""The CLI's suffix-drafter options (--documents, --no-memory) and the ``edgespec memory`` commands."""
from __future__ import annotations

import functools

import click

from .cli_export import NonEmptyPath

MiB = 1 << 20


def load_params(f, *names):
    """``f`` without its parameters ``names``: options a command only passes on to ``load``, which
    stay in its click context where a reader (``engine_options``, ``placement_options``, ...) takes
    them back."""
    @functools.wraps(f)
    def wrapper(*args, **kw):
        for name in names:
            kw.pop(name, None)
        return f(*args, **kw)

    return wrapper


def memory_opts(default_memory: bool = True):
    """Adds --documents FILE (repeatable) and --no-memory (or --memory, where the default is off)
    to a command; ``engine_options()`` reads them back for ``load``."""

    def deco(f):
        wrapper = load_params(f, "documents", "use_memory")
        wrapper = click.option("--documents", multiple=True, type=NonEmptyPath(what="a file or folder"),
                               help="A text file the suffix drafter drafts quotes from (repeatable).")(wrapper)
        flag = "--memory/--no-memory"
        help_ = ("Keep earlier outputs of this bundle to draft from (--no-memory: nothing is read or stored)."
                 if default_memory else "Draft from (and add to) this bundle's memory of earlier outputs "
                                        "(off by default here: results would depend on earlier runs).")
        return click.option(flag, "use_memory", default=default_memory, show_default=True, help=help_)(wrapper)

    return deco


def model_wanted(drafter: str | None) -> bool:
    """Whether ``--drafter`` may use the bundle's drafter model or assistant (model, mtp and auto, the default)."""
    return drafter not in ("none", "prompt-lookup", "suffix")


def engine_options() -> dict:
    """``load`` keywords from the running command's --documents / --memory options."""
    ctx = click.get_current_context(silent=True)
    params = ctx.params if ctx is not None else {}
    out = {}
    if "use_memory" in params:
        out["memory"] = bool(params["use_memory"])
    if params.get("documents"):
        out["documents"] = list(params["documents"])
    return out


@click.group("memory")
def memory():
    """The suffix drafter's memory of earlier outputs, per bundle."""


@memory.command("show")
@click.argument("bundle", envvar="EDGESPEC_BUNDLE", type=NonEmptyPath())
@click.option("--json", "as_json", is_flag=True)
def show(bundle, as_json):
    """Where BUNDLE's memory is kept and what it holds."""
    from .errors import StoreError
    from .manifest import load_manifest
    from .memory import KeptStoreError, bundle_fingerprint, other_stores, read_store_signed, store_path

    m = load_manifest(bundle, check=False)
    path = store_path(m)
    others = other_stores(m)
    info = {"path": str(path), "exists": path.exists(), "sequences": 0, "tokens": 0, "recallable": 0,
            "file_bytes": 0, "error": None, "other_stores": len(others)}
    kept = False
    if path.exists():
        info["file_bytes"] = path.stat().st_size
        try:
            seqs, sigs = read_store_signed(path, bundle_fingerprint(m), m.target.vocab_size)
            info.update(sequences=len(seqs), tokens=int(sum(len(s) for s in seqs)),
                        recallable=sum(1 for g in sigs if g.shape[0]))
        except StoreError as e:
            info["error"] = str(e)
            kept = isinstance(e, KeptStoreError)  # (a newer edgespec's, or one this user cannot read)
    if as_json:
        from .cli import _echo_json

        _echo_json(info, indent=1)
        return
    click.echo(f"memory of {m.root}: {path}")
    if not info["exists"]:
        click.echo("  empty (no store file)")
    elif info["error"]:
        click.echo(f"  unreadable: {info['error']} " + ("(left as it is: an engine runs without saving to it)" if kept
                                                       else "(the next load sets it aside)"))
    else:
        click.echo(f"  {info['sequences']} outputs, {info['tokens']} tokens, "
                   f"{info['file_bytes'] / 1024:.1f} KiB on disk; {info['recallable']} recallable by a prompt "
                   f"that repeats theirs")
    _others(others)


@memory.command("clear")
@click.argument("bundle", envvar="EDGESPEC_BUNDLE", type=NonEmptyPath(), required=False)
@click.option("--all", "everything", is_flag=True,
              help="Every bundle's memory under the memory folder (and this bundle's from before a rewrite).")
def clear(bundle, everything):
    """Delete BUNDLE's memory of earlier outputs (and any store set aside as corrupt); --all: every bundle's."""
    from .errors import ConfigError
    from .manifest import load_manifest
    from .memory import clear_all_stores, clear_store, memory_root, other_stores

    if everything:
        given = click.get_current_context().get_parameter_source("bundle") == click.core.ParameterSource.COMMANDLINE
        if bundle is not None and given:  # ($EDGESPEC_BUNDLE set is no bundle given: --all is every one)
            raise ConfigError("memory clear takes a bundle or --all, not both")
        gone, failed = clear_all_stores()
        click.echo(f"deleted {len(gone)} file(s) under {memory_root()}" + "".join(f"\n  {p}" for p in gone))
        if failed:  # (the others deleted all the same, and said above): the first one's error, exit 1
            e = failed[0]
            more = f" (and {len(failed) - 1} more store(s) not deleted)" if len(failed) > 1 else ""
            raise OSError(e.errno, f"{e.strerror or e}{more}", e.filename)
        return
    if bundle is None:
        raise ConfigError("memory clear needs a bundle (or --all for every bundle's memory)")
    m = load_manifest(bundle, check=False)
    gone = clear_store(m)
    click.echo(f"deleted {len(gone)} file(s)" + "".join(f"\n  {p}" for p in gone))
    _others(other_stores(m))


def _others(others: list) -> None:
    """A line naming the other stores there are (``memory.other_stores``: other bundles', or this one's from before
    a rewrite)."""
    from .memory import memory_root

    if others:
        click.echo(f"  {len(others)} other store(s) under {memory_root()} (other bundles', or this bundle's from "
                   "before it was rewritten): 'edgespec memory clear --all' deletes them")
