"""``--drafter-provider``: where the drafter model runs, for the commands that load or plan a bundle."""
from __future__ import annotations

import click

from .cli_memory import load_params
from .providers import PROVIDER_NAMES


def drafter_provider_opt(f):
    """Adds --drafter-provider and --cuda-graphs/--no-cuda-graphs to a command; ``placement_options()``
    reads them back for ``load``."""

    wrapper = load_params(f, "drafter_provider", "cuda_graphs")
    wrapper = click.option("--cuda-graphs/--no-cuda-graphs", default=None,
                           help="On the CUDA EP, replay captured CUDA graphs for calls of up to 16 tokens "
                                "(default: the profile's enable_cuda_graph, else on).")(wrapper)
    return click.option("--drafter-provider", type=click.Choice(PROVIDER_NAMES), default=None,
                        help="Run the drafter model on this provider (e.g. cpu while the target runs on cuda; "
                             "default: the profile's drafter_provider, else the target's). Only token ids cross; "
                             "an error if the placement does not fit the budget.")(wrapper)


def placement_options() -> dict:
    """``load`` keywords from the running command's --drafter-provider and --cuda-graphs."""
    ctx = click.get_current_context(silent=True)
    params = ctx.params if ctx is not None else {}
    out = {"drafter_provider": params["drafter_provider"]} if params.get("drafter_provider") else {}
    if params.get("cuda_graphs") is not None:
        out["cuda_graphs"] = params["cuda_graphs"]
    return out
