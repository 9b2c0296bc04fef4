"""Execution-provider selection: what was asked, what this onnxruntime build has, what runs."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from .errors import ProviderError

log = logging.getLogger("edgespec")

ALIASES = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "trt": "TensorrtExecutionProvider",
}


def available_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


@dataclass(frozen=True)
class ProviderChoice:
    providers: list[tuple[str, dict]]  # what runs, in order, with options
    requested: list[str]
    warnings: list[str] = field(default_factory=list)

    @property
    def primary(self) -> str:
        return self.providers[0][0]

    @property
    def device(self) -> str:
        """Where the KV cache lives: 'cuda' for CUDA/TensorRT, else 'cpu'."""
        return "cuda" if self.primary in ("CUDAExecutionProvider", "TensorrtExecutionProvider") else "cpu"


def choose(requested: list[str], options: dict[str, dict] | None = None, *, explicit: bool = False,
           available: list[str] | None = None) -> ProviderChoice:
    """Pick the execution providers to run with.

    ``requested`` is an ordered preference (short names or onnxruntime names). Providers this
    build lacks are skipped with a warning; with ``explicit`` (the user named one on the command
    line) a missing provider is an error. The CPU provider always closes the list.
    """
    options = options or {}
    have = available if available is not None else available_providers()
    names = [ALIASES.get(r.lower(), r) for r in requested] or ["CPUExecutionProvider"]
    for n, r in zip(names, requested or ["cpu"]):
        if n not in ALIASES.values():
            raise ProviderError(f"unknown execution provider {r!r}; choose from cpu, cuda, tensorrt")
    runs: list[tuple[str, dict]] = []
    warnings: list[str] = []
    for short, name in zip(requested or ["cpu"], names):
        if name in have:
            runs.append((name, dict(options.get(short.lower(), options.get(name, {})))))
        elif explicit:
            raise ProviderError(
                f"execution provider {short!r} was asked for but this onnxruntime build has only "
                f"{', '.join(have)}" + ("; install onnxruntime-gpu (see README)" if name != "CPUExecutionProvider" else ""))
        else:
            warnings.append(f"{short} is not available in this onnxruntime ({', '.join(have)}); skipping it")
    if not any(n == "CPUExecutionProvider" for n, _ in runs):
        runs.append(("CPUExecutionProvider", {}))
    if runs[0][0] != names[0]:
        warnings.append(f"asked for {requested[0] if requested else 'cpu'}, running on {runs[0][0]}")
    for w in warnings:
        log.warning(w)
    return ProviderChoice(runs, list(requested), warnings)
