"""onnxruntime-genai's model builder (0.18) with the config fields its Gemma 3 builder reads, from transformers 5's
config. Run as ``python -m edgespec_export.builder_shim`` with the builder's own arguments (export/build.py does).

transformers 5 keeps Gemma 3's rotary parameters per layer type (``rope_parameters = {"full_attention": {...},
"sliding_attention": {...}}``); the builder's Gemma 3 reads the flat form of transformers 4 (``rope_parameters
["rope_type"]``, ``rope_theta``, ``rope_local_base_freq``) and stopped with ``KeyError: 'rope_type'``. ``patch``
gives the config those fields, read from the nested form (the global layers' parameters flat, the local layers'
theta as ``rope_local_base_freq``), before the builder's Gemma 3 reads it; nothing else changes. A scaled global
rotary (Gemma 3 4B and larger: ``linear``, factor 8) would scale the local layers' cache too in the builder, so
the export's validation against torch stands guard: such a graph fails it and is not written.
"""
from __future__ import annotations

import runpy


def flat_rope(config) -> bool:
    """The transformers 4 fields of a transformers 5 per-layer-type ``rope_parameters`` set on ``config``
    (in place); False where it has none."""
    rp = getattr(config, "rope_parameters", None)
    if not isinstance(rp, dict) or "rope_type" in rp or not isinstance(rp.get("full_attention"), dict):
        return False
    full = dict(rp["full_attention"])
    local = rp.get("sliding_attention") if isinstance(rp.get("sliding_attention"), dict) else full
    full.setdefault("rope_type", "default")
    config.rope_parameters = full
    config.rope_theta = float(full.get("rope_theta", 10000.0))
    config.rope_local_base_freq = float(local.get("rope_theta", config.rope_theta))
    return True


def patch() -> None:
    """Wrap the builder's Gemma 3 class (imported as the builder imports it: top-level ``builders``, from its
    own folder) so that it reads a flat config."""
    import onnxruntime_genai.models  # noqa: F401  (puts the builder's folder on sys.path)
    from builders import gemma

    cls = gemma.Gemma3Model
    if getattr(cls, "_edgespec_flat_rope", False):
        return
    init = cls.__init__

    def __init__(self, config, *args, **kw):
        flat_rope(config)
        init(self, config, *args, **kw)

    cls.__init__ = __init__
    cls._edgespec_flat_rope = True


def main() -> None:
    patch()
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
