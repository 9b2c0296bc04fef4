"""``--drafter-provider``: where the drafter model runs, for the commands that load or plan a bundle."""
from __future__ import annotations

import functools

import click

from .providers import PROVIDER_NAMES


def drafter_provider_opt(f):
    """Adds --drafter-provider to a command; ``placement_options()`` reads it back for ``load``."""

    @functools.wraps(f)
    def wrapper(*args, **kw):
        kw.pop("drafter_provider", None)
        return f(*args, **kw)

    return click.option("--drafter-provider", type=click.Choice(PROVIDER_NAMES), default=None,
                        help="Run the drafter model on this provider (e.g. cpu while the target runs on cuda; "
                             "default: the profile's drafter_provider, else the target's). Only token ids cross; "
                             "an error if the placement does not fit the budget.")(wrapper)


def placement_options() -> dict:
    """``load`` keywords from the running command's --drafter-provider."""
    ctx = click.get_current_context(silent=True)
    value = ctx.params.get("drafter_provider") if ctx is not None else None
    return {"drafter_provider": value} if value else {}
