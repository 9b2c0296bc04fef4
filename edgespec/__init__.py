"""edgespec: fast, lossless speculative decoding for quantized LLMs on small machines.

The runtime needs onnxruntime, numpy, tokenizers, click and jinja2 -- never torch. Heavy modules
load lazily: ``import edgespec`` is cheap.
"""
from __future__ import annotations

from .errors import (BudgetError, BundleError, BusyError, ChatTemplateError, ClosedError, ConfigError,
                     ContextOverflowError, CpuFallbackError, DocumentError, EdgespecError, ExportError, Interrupted,
                     ManifestError, NoSpaceError, ProfileError, ProviderError, StoreError, TokenizerMismatchError)

__version__ = "0.1.0"

__all__ = ["load", "Engine", "Result", "GenerationConfig", "EdgespecError", "BundleError", "ManifestError",
           "TokenizerMismatchError", "ContextOverflowError", "BudgetError", "ProfileError", "ProviderError",
           "ConfigError", "BusyError", "ClosedError", "ChatTemplateError", "DocumentError", "StoreError",
           "ExportError", "NoSpaceError", "CpuFallbackError", "Interrupted", "split_reasoning", "__version__"]


def __getattr__(name):
    if name in ("load", "Engine", "Result", "ChatSession"):
        from . import api

        return getattr(api, name)
    if name == "split_reasoning":  # a thinking model's reply: (its <think> block's text, its answer)
        from .reasoning import split_reasoning

        return split_reasoning
    if name == "GenerationConfig":
        from .decoder import GenerationConfig

        return GenerationConfig
    raise AttributeError(f"module 'edgespec' has no attribute {name!r}")
