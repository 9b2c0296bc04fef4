"""Execution-provider selection: what was asked, what this onnxruntime build has, what runs."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ProviderError

log = logging.getLogger("edgespec")

CPU, CUDA, TENSORRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"
ALIASES = {"cpu": CPU, "cuda": CUDA, "tensorrt": TENSORRT, "trt": TENSORRT}
PROVIDER_NAMES = ("cpu", "cuda", "tensorrt")  # the short names profiles and the CLI use
_SHORT = {CPU: "cpu", CUDA: "cuda", TENSORRT: "tensorrt"}
GPU_PROVIDERS = (CUDA, TENSORRT)
TRT_CACHE_DIR = ".trt_cache"


def canonical(name: str) -> str:
    """onnxruntime's name for a short or full provider name; ``ProviderError`` if unknown."""
    full = ALIASES.get(name.lower(), name)
    if full not in _SHORT:
        raise ProviderError(f"unknown execution provider {name!r}; choose from {', '.join(PROVIDER_NAMES)}")
    return full


def short_name(name: str) -> str:
    """The short name (``cuda``) of a short or full provider name; ``ProviderError`` if unknown."""
    return _SHORT[canonical(name)]


def is_gpu(name: str) -> bool:
    return ALIASES.get(name.lower(), name) in GPU_PROVIDERS


def available_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


@dataclass(frozen=True)
class ProviderChoice:
    providers: list[tuple[str, dict]]  # what runs, in order, with options
    requested: list[str]
    warnings: list[str] = field(default_factory=list)
    explicit: bool = False  # the user named the provider: falling back is an error, not a warning

    @property
    def primary(self) -> str:
        return self.providers[0][0]

    @property
    def device(self) -> str:
        """Where the KV cache lives: 'cuda' for CUDA/TensorRT, else 'cpu'."""
        return "cuda" if self.primary in GPU_PROVIDERS else "cpu"

    def options(self, name: str) -> dict | None:
        for n, o in self.providers:
            if n == canonical(name):
                return o
        return None


def choose(requested: list[str], options: dict[str, dict] | None = None, *, explicit: bool = False,
           available: list[str] | None = None, warn: bool = True) -> ProviderChoice:
    """Pick the execution providers to run with.

    ``requested`` is an ordered preference (short names or onnxruntime names); ``options`` are keyed
    by short name (as in a profile's ``[provider_options.cuda]``). Providers this build lacks are
    skipped with one warning saying what was asked and what runs (logged unless ``warn`` is false; kept in the
    choice's ``warnings`` either way); with ``explicit`` (the user named one on the command line) a missing provider
    is an error. The CPU provider always closes the list.
    """
    options = options or {}
    requested = list(requested) or ["cpu"]
    names = list(dict.fromkeys(canonical(r) for r in requested))  # validated, duplicates dropped
    have = available if available is not None else available_providers()
    runs: list[tuple[str, dict]] = []
    missing: list[str] = []
    for name in names:
        short = _SHORT[name]
        if name in have:
            runs.append((name, dict(options.get(short, options.get(name, {})))))
        elif explicit:
            raise ProviderError(
                f"execution provider {short!r} was asked for but this onnxruntime build has only "
                f"{', '.join(have)}" + ("; install onnxruntime-gpu (see README)" if name != CPU else ""))
        else:
            missing.append(short)
    if not any(n == CPU for n, _ in runs):
        runs.append((CPU, dict(options.get("cpu", {}))))
    warnings: list[str] = []
    if missing:
        warnings.append(
            f"asked for {', '.join(_SHORT[n] for n in names)}; this onnxruntime build lacks {', '.join(missing)} "
            f"(it has {', '.join(have)}), so {_SHORT[runs[0][0]]} runs"
            + ("; install onnxruntime-gpu for cuda/tensorrt" if any(m != "cpu" for m in missing) else ""))
    for w in warnings if warn else ():
        log.warning(w)
    return ProviderChoice(runs, requested, warnings, explicit)


def trt_cache_dir(bundle_root: Path) -> Path:
    """``<bundle>/.trt_cache``, created; a per-user cache directory when the bundle is read-only."""
    d = Path(bundle_root) / TRT_CACHE_DIR
    try:
        d.mkdir(exist_ok=True)
        return d
    except OSError as e:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        alt = base / "edgespec" / "trt" / Path(bundle_root).resolve().name
        log.warning(f"cannot create {d} ({e.strerror}); TensorRT engines are cached in {alt}")
        alt.mkdir(parents=True, exist_ok=True)
        return alt


# CUDA graphs on by default on the CUDA EP (edgespec/graphs.py; docs/gpu.md: measured on the H200)
CUDA_GRAPHS_DEFAULT = True


def with_load_options(choice: ProviderChoice, *, bundle_root: Path, gpu_mem_limit: int | None = None,
                      trt_workspace: int | None = None, cuda_graphs: bool | None = None) -> ProviderChoice:
    """Fill in the options that depend on the bundle and the memory plan, unless the profile set them.

    ``gpu_mem_limit`` (bytes) is what the plan leaves a session's CUDA arena, its weights included;
    ``trt_workspace`` what it leaves TensorRT for scratch beyond the weights. TensorRT's
    ``trt_max_workspace_size`` defaults to it, and a profile's own workspace larger than it is cut
    to it. TensorRT's engines are cached beside the bundle (``<bundle>/.trt_cache``, caching on
    unless the profile turns it off)."""
    room = int(gpu_mem_limit) if gpu_mem_limit and gpu_mem_limit > 0 else None
    scratch = int(trt_workspace) if trt_workspace and trt_workspace > 0 else None
    runs = []
    for name, opts in choice.providers:
        opts = dict(opts)
        if name == TENSORRT:
            opts.setdefault("trt_engine_cache_enable", True)
            if "trt_engine_cache_path" not in opts:
                opts["trt_engine_cache_path"] = str(trt_cache_dir(bundle_root))
            if scratch is not None:
                asked = opts.get("trt_max_workspace_size")
                if asked is None:
                    opts["trt_max_workspace_size"] = scratch
                elif int(asked) > scratch:
                    log.warning(f"TensorRT workspace cut from {int(asked) >> 20} MiB (profile) to {scratch >> 20} MiB, "
                                f"what the memory plan leaves")
                    opts["trt_max_workspace_size"] = scratch
        if name == CUDA and "gpu_mem_limit" not in opts and room is not None:
            opts["gpu_mem_limit"] = room
        if name == CUDA:  # the arena grows by what a call asks, not to the next power of two
            opts.setdefault("arena_extend_strategy", "kSameAsRequested")
            # CUDA graphs for the short calls (edgespec/graphs.py): an explicit choice wins over the
            # profile's enable_cuda_graph, which wins over the default
            if cuda_graphs is not None:
                opts["enable_cuda_graph"] = "1" if cuda_graphs else "0"
            else:
                opts.setdefault("enable_cuda_graph", "1" if CUDA_GRAPHS_DEFAULT else "0")
        runs.append((name, opts))
    return ProviderChoice(runs, choice.requested, choice.warnings, choice.explicit)
