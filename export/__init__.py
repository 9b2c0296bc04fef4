"""edgespec's build-time export stage (installed as ``edgespec_export`` with ``pip install -e .[export]``).

Hugging Face directory / GGUF file / hub id -> torch -> onnxruntime-genai's model builder
(GroupQueryAttention graphs with a shared past/present KV buffer, MatMulNBits INT4) -> validation
through edgespec's own runtime against torch -> a self-describing bundle, written atomically.
"""
from .bundle import export_bundle

__all__ = ["export_bundle"]
