"""Write a bundle: convert, build, validate, describe, and move into place atomically."""
from __future__ import annotations

import gc
import json
import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from edgespec.errors import ExportError
from edgespec.manifest import (DRAFTER_PRECISIONS, LAYOUTS, TARGET_PRECISIONS, Manifest, ModelIO, ModelSpec,
                               Quantization, default_drafter_precision, sha256_file, write_manifest)

from .output import (check_output, missing_parents, prepare_stage, publish, raise_if_full, raise_if_terminated,
                     remove_parents, remove_replaced, terminate_cleanly)
from .build import FLOAT_ZERO_POINTS, SWAPPED, QuantOptions, builder_args, prestart_builder, run_builder
from .conv import INPUT_NAME as CONV_INPUT
from .source import (Source, check_vocabulary, gguf_cached, keep_gguf_copy, load_model, load_tokenizer, resolve,
                     source_files)
from .validate import validate


class Progress:
    def __init__(self, total: int, stream=None):
        # sys.stderr as it is now, not as it was at import (a test runner or a CLI may have replaced it)
        self.total, self.i, self.t0, self.stream = total, 0, time.perf_counter(), stream or sys.stderr

    def step(self, what: str) -> None:
        raise_if_terminated()  # (an export's SIGTERM whose exception a finalizer dropped ends it here)
        self.i += 1
        print(f"[{self.i}/{self.total} {time.perf_counter() - self.t0:6.1f}s] {what}", file=self.stream, flush=True)

    def log(self, line: str) -> None:
        raise_if_terminated()
        print(line, file=self.stream, flush=True)


def _versions() -> dict:
    out = {}
    for mod in ("edgespec", "torch", "transformers", "onnx", "onnxruntime", "onnxruntime_genai", "gguf"):
        try:
            out[mod] = __import__(mod).__version__
        except (ImportError, AttributeError):
            pass
    return out


def _kv_dtype(g, model_path: Path) -> str:
    """The KV cache's dtype: the graph ``g``'s (of ``model_path``) ``past_key_values`` inputs'."""
    for i in g.input:
        if i.name.startswith("past_key_values"):
            return {1: "float32", 10: "float16", 16: "bfloat16", 3: "int8"}[i.type.tensor_type.elem_type]
    raise ExportError(f"{model_path} has no past_key_values inputs: not a KV-cache graph")


def _kv_layers(g, names: str, layers: int, heads: int, width: int) -> tuple[tuple[int, int], ...]:
    """Each layer's KV cache ``(kv heads, head size)`` from graph ``g``'s ``past_key_values`` inputs where some
    layer's differs from ``(heads, width)`` (the config's; Gemma 4's global layers), else ()."""
    dims = {i.name: [d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim]
            for i in g.input}
    out = []
    for layer in range(layers):
        d = dims.get(names % layer) or []
        out.append((d[1] or heads, d[3] or width) if len(d) == 4 else (heads, width))
    return tuple(out) if any(x != (heads, width) for x in out) else ()


def _kv_sources(g, names: str, layers: int) -> tuple[int, ...]:
    """Per layer, the layer whose KV buffer it can use (``ModelSpec.kv_sources``): an attention node of graph ``g`` whose
    key and value inputs are an earlier one's (Gemma 4's shared key-value layers: export/builder_gemma4.py) writes the
    very rows that layer writes, so one buffer holds both; () where every layer computes its own."""
    layer_of = {names % i: i for i in range(layers)}
    sources, first = list(range(layers)), {}
    for n in g.node:
        if n.op_type != "GroupQueryAttention" or len(n.input) < 4 or not n.input[1] or n.input[3] not in layer_of:
            continue
        i = layer_of[n.input[3]]
        src = first.setdefault((n.input[1], n.input[2]), i)
        if src < i:
            sources[i] = src
    return tuple(sources) if sources != list(range(layers)) else ()


def _ops(model_path: Path) -> dict[str, int]:
    import onnx

    m = onnx.load(str(model_path), load_external_data=False)
    counts: dict[str, int] = {}
    for n in m.graph.node:
        counts[n.op_type] = counts.get(n.op_type, 0) + 1
    return counts


def embedding_tables(model_path: Path) -> tuple[int, int]:
    """Float initializers read only as a Gather's data (embedding tables): their total bytes and
    the bytes of one row of each, summed (the bytes one token id reads)."""
    import numpy as np
    import onnx

    m = onnx.load(str(model_path), load_external_data=False)
    uses: dict[str, list[tuple[str, int]]] = {}
    for n in m.graph.node:
        for k, name in enumerate(n.input):
            uses.setdefault(name, []).append((n.op_type, k))
    total = row = 0
    for t in m.graph.initializer:
        if t.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):
            continue
        u = uses.get(t.name, [])
        if len(t.dims) != 2 or not u or any(use != ("Gather", 0) for use in u):
            continue
        item = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize if t.data_type != onnx.TensorProto.BFLOAT16 else 2
        total += int(np.prod(t.dims)) * item
        row += int(t.dims[1]) * item
    return total, row


def measured_sizes(root: Path, role: str, entry: dict, log=None) -> dict:
    """Manifest fields the memory planner reads besides the file sizes, for the model of manifest
    ``entry`` under ``root``: its resident bytes once opened on the CPU EP and run once (measured
    in a fresh process; absent if it cannot be) and its embedding tables, which that EP leaves
    mapped until a token reads a row."""
    from edgespec.measure import load_footprint

    emb, row = embedding_tables(root / entry["path"])
    out = {"embedding_bytes": emb, "embedding_row_bytes": row}
    try:
        out["cpu_resident_bytes"] = load_footprint(root, role, entry)
    except OSError as e:
        if log:
            log(f"    could not measure the {role}'s resident memory on the CPU EP ({e}); "
                "the plan will use file sizes")
    return out


def _record(quant: QuantOptions, ops: dict) -> Quantization:
    """The manifest's quantization record, as the graph has it (session 49, a review: a tied model's shared int4
    table, GatherBlockQuantized, was recorded as embeddings not quantized; a GGUF's blocks with minimums as
    symmetric, the tied table's forced symmetry being taken for the MatMuls')."""
    q = quant.record()
    if ops.get("GatherBlockQuantized") and not q.quantize_embeddings:
        q = replace(q, quantize_embeddings=True)
    if q.algorithm in FLOAT_ZERO_POINTS and q.symmetric:  # (its MatMul blocks have minimums; a shared table has none)
        q = replace(q, symmetric=False)
    return q


def _describe(root: Path, role: str, build, config, precision: str, quant: QuantOptions | None,
              fingerprint: str, max_context: int, argmax: str | None = None,
              logits_skip: str | None = None, conv_layers: tuple = ()) -> ModelSpec:
    """The manifest's record of the graph the builder wrote for ``role`` under ``root``."""
    dec = build.genai_config["model"]["decoder"]
    files = {}
    mdir = build.model_dir
    for f in sorted(mdir.iterdir()):
        if f.name.startswith("model.onnx"):
            rel = f"{role}/{f.name}"
            files[rel] = {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
    if not files:
        raise ExportError(f"no model files in {mdir}")
    ins, outs = dec["inputs"], dec["outputs"]
    model_file = mdir / dec.get("filename", "model.onnx")
    ops = _ops(model_file)
    import onnx

    graph = onnx.load(str(model_file), load_external_data=False).graph  # (once: the KV cache's dtype, shapes, sharing)
    params = sum(int(p.numel()) for p in config["_params"])
    on_disk = sum(v["bytes"] for v in files.values())
    return ModelSpec(
        role=role,
        path=(root / role / model_file.name).resolve(),
        architecture=config["model_type"],
        precision=precision,
        quant=_record(quant, ops) if quant and precision in ("int4", "int8") else Quantization(),
        num_layers=int(dec["num_hidden_layers"]),
        num_kv_heads=int(dec["num_key_value_heads"]),
        head_dim=int(dec["head_size"]),
        hidden_size=int(dec["hidden_size"]),
        num_attention_heads=int(dec["num_attention_heads"]),
        vocab_size=int(build.genai_config["model"]["vocab_size"]),
        max_context=int(max_context),
        kv_dtype=_kv_dtype(graph, model_file),
        kv_layers=_kv_layers(graph, ins["past_key_names"], int(dec["num_hidden_layers"]),
                             int(dec["num_key_value_heads"]), int(dec["head_size"])),
        kv_sources=_kv_sources(graph, ins["past_key_names"], int(dec["num_hidden_layers"])),
        io=ModelIO(
            input_ids=ins["input_ids"], attention_mask=ins["attention_mask"], position_ids=ins.get("position_ids"),
            past_key=ins["past_key_names"], past_value=ins["past_value_names"],
            present_key=outs["present_key_names"], present_value=outs["present_value_names"], logits=outs["logits"],
            argmax=argmax, logits_skip=logits_skip,
            **({"past_conv": ins["past_conv_names"], "present_conv": outs["present_conv_names"],
                "conv_input": CONV_INPUT} if conv_layers else {}),
        ),
        conv_layers=tuple(conv_layers),
        tokenizer_sha256=fingerprint,
        layout=build.layout,
        files=files,
        bytes_on_disk=on_disk,
        gpu_weight_bytes=on_disk,
        params=params,
        operators={k: v for k, v in sorted(ops.items()) if k in (
            "MatMulNBits", "GroupQueryAttention", "MatMul", "DequantizeLinear", "GatherBlockQuantized", "Gather")},
    )


# the kinds of layer (transformers' ``layer_types``) whose only state is a KV cache, which a rejected draft rolls
# back by its length; a recurrence's state (Granite 4's ``mamba``, Qwen3.5's ``linear_attention``) has no such
# rollback, a convolution's (LFM2's ``conv``) is rebuilt from its last inputs (export/conv.py, CONV_MODEL_TYPES)
ATTENTION_LAYERS = frozenset({"full_attention", "sliding_attention", "chunked_attention", "attention"})


def text_config(cfg):
    """A model config's text part: an image-text checkpoint's text config (its decoder's layers, context, vocabulary and
    rotary; the top level has none of them), else the config itself."""
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def _check_attention_only(cfg, role: str) -> None:
    """ExportError for a model with layers other than attention (before the build: see ATTENTION_LAYERS), and for
    Gemma 4's kinds that export/builder_gemma4.py does not build."""
    if str(getattr(cfg, "model_type", "")).startswith("gemma4") and "assistant" in str(cfg.model_type):
        from .mtp import ASSISTANT_TYPE

        how = ("export it as the --drafter of its Gemma 4 target" if cfg.model_type == ASSISTANT_TYPE else
               "not currently supported")
        raise ExportError(f"{role}: {cfg.model_type} (Gemma 4's multi-token-prediction assistant) drafts from its "
                          f"target's hidden states and KV cache: {how}")
    t = text_config(cfg)
    if str(getattr(t, "model_type", "")).startswith("gemma4") and getattr(t, "enable_moe_block", False):
        # (the builder's MoE class stops on transformers 5's per-layer config; built past that, onnxruntime's CPU MoE
        # op refuses its GeGLU experts at load: "Unsupported MoE activation type: geglu")
        raise ExportError(f"{role}: Gemma 4 with experts (enable_moe_block: 26B-A4B) is not currently supported; its "
                          "dense models (E2B, E4B, 31B) are")
    types = getattr(t, "layer_types", None)
    from .conv import CONV_LAYER, CONV_MODEL_TYPES

    conv_ok = {CONV_LAYER} if str(getattr(t, "model_type", "")) in CONV_MODEL_TYPES else set()  # (LFM2: export/conv.py)
    other = sorted({str(t) for t in types or () if str(t) not in ATTENTION_LAYERS | conv_ok})
    if other:
        raise ExportError(f"{role}: {getattr(cfg, 'model_type', 'the model')} has {', '.join(other)} layers, whose "
                          "state (not a KV cache) a rejected draft cannot roll back; edgespec exports models whose "
                          "layers are attention, and LFM2's convolutions")


def _check_state_inputs(dec: dict, role: str) -> None:
    """ExportError where the builder's graph keeps state beside its KV cache (genai_config's ``past_*_names``
    other than the keys' and values': a convolution's, a recurrence's, quantized caches' scales)."""
    other = sorted(k for k in dec.get("inputs", {}) if k.startswith("past_") and k.endswith("_names")
                   and k not in ("past_key_names", "past_value_names", "past_conv_names"))  # (conv: export/conv.py)
    if other:
        names = ", ".join(str(dec["inputs"][k]) for k in other)
        raise ExportError(f"{role}: the built graph keeps state beside its KV cache ({names}), which a rejected draft "
                          "cannot roll back; edgespec exports models whose layers are attention, and LFM2's "
                          "convolutions")


ROTARY_TOLERANCE = 0.02  # |cos, sin| difference the built tables may have from transformers' (float noise at long
# positions and float16 tables stay under it; a scaling the builder skipped is 0.1 to 2)


def reference_rotary(model, ctx: int):
    """(rotary kind, cos, sin): transformers' rotary tables of ``model`` for positions 0..n-1 (float32 ``[n, d/2]``,
    its attention scaling in them, as the builder writes its ``cos_cache``/``sin_cache``), n the context; LongRoPE's
    per position, as ``kernels._per_position_rope`` makes the graph's (the short factors' rows below the original
    context, the long factors' from it on: what transformers computes decoding token by token); None where the model
    has no single position-wise table to compare (Gemma 3's per-layer-type ones; no ``model.rotary_emb``)."""
    import torch

    cfg = text_config(model.config)
    rp = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    inner = getattr(model, "model", None)
    rot = getattr(inner, "rotary_emb", None) or getattr(getattr(inner, "language_model", None), "rotary_emb", None)
    if isinstance(rp, dict) and "full_attention" in rp:  # (a rotary per layer kind: Gemma 3 and 4, OLMo 3)
        return _per_kind_rotary(rot, rp, int(ctx))
    if not isinstance(rp, dict):
        return None
    kind = str(rp.get("rope_type", rp.get("type", "default")))
    if rot is None:
        return None
    n = int(ctx)
    orig = int(rp.get("original_max_position_embeddings") or getattr(cfg, "original_max_position_embeddings", 0) or 0)
    if kind == "dynamic":  # (transformers rescales past the original context, by the whole call's length)
        n = min(n, orig or int(getattr(cfg, "max_position_embeddings", n)))
    x = torch.zeros(1, dtype=torch.float32)
    with torch.no_grad():
        cos, sin = rot(x, torch.arange(n).unsqueeze(0))
        if kind in ("longrope", "su"):
            if not orig:
                return None
            short = rot(x, torch.arange(min(n, orig)).unsqueeze(0))  # (and the rotary's state back to the short)
            cos = torch.cat([short[0], cos[:, orig:]], 1) if n > orig else short[0]
            sin = torch.cat([short[1], sin[:, orig:]], 1) if n > orig else short[1]
    return (kind, *_as_built(cos, sin))


def _as_built(cos, sin):
    """transformers' rotary tables (torch, ``[1, n, d]``) as numpy ``[n, d/2]``, as the builder writes them: most
    give each frequency twice, GPT-OSS's once (kept so)."""
    cos, sin = cos[0].float().numpy(), sin[0].float().numpy()
    half = cos.shape[-1] // 2
    if cos.shape[-1] % 2 == 0 and abs(cos[:, :half] - cos[:, half:]).max() < 1e-6:
        cos, sin = cos[:, :half], sin[:, :half]
    return cos, sin


# a layer kind's rotary tables in the graph (the builder's names for Gemma 3 and 4; builder_shim's OLMo 3 the same)
_KIND_TABLES = {"full_attention": ("cos_cache_global", "sin_cache_global"),
                "sliding_attention": ("cos_cache_local", "sin_cache_local")}


def _per_kind_rotary(rot, rp: dict, n: int):
    """("per-kind", {layer kind: (rotary type, cos, sin)}) from transformers' rotary module that takes a layer kind
    (Gemma 3's, 4's, OLMo 3's), the tables as ``reference_rotary`` gives them; None where it takes none."""
    import torch

    if rot is None:
        return None
    out = {}
    x = torch.zeros(1, dtype=torch.float32)
    for kind in _KIND_TABLES:
        params = rp.get(kind)
        if not isinstance(params, dict):
            continue
        try:
            with torch.no_grad():
                cos, sin = rot(x, torch.arange(n).unsqueeze(0), kind)
        except TypeError:  # (another module's signature: nothing to compare)
            return None
        except (KeyError, AttributeError):  # (no table of that kind: an OLMo 3 whose layers all attend fully)
            continue
        out[kind] = (str(params.get("rope_type", "default")), *_as_built(cos, sin))
    return ("per-kind", out) if out else None


def check_rotary(graph_file: Path, reference, role: str) -> None:
    """ExportError where the graph's rotary tables (``cos_cache``, ``sin_cache``) are not transformers' (within
    ``ROTARY_TOLERANCE``): a kind of rotary scaling the builder skipped builds another model, which a quantized
    export's validation (top-1 agreement) let through. Graphs without those two tables are not checked. A rotary
    per layer kind (Gemma 3's and 4's, OLMo 3's: ``cos_cache_global``/``_local``) is compared kind by kind (since
    session 60, an audit: they went unchecked)."""
    if reference is None:
        return
    import onnx

    g = onnx.load(str(graph_file), load_external_data=False).graph
    if reference[0] == "per-kind":  # (each layer kind's tables, where the graph has them by the builder's names)
        for layer_kind, (kind, cos, sin) in reference[1].items():
            _check_tables(g, graph_file, _KIND_TABLES[layer_kind], kind, cos, sin, role, f" of its {layer_kind} layers")
        return
    kind, cos, sin = reference
    _check_tables(g, graph_file, ("cos_cache", "sin_cache"), kind, cos, sin, role)


def _check_tables(g, graph_file: Path, names: tuple[str, str], kind: str, cos, sin, role: str, which: str = "") -> None:
    from onnx import numpy_helper

    tables = {t.name: t for t in g.initializer if t.name in names}
    if len(tables) != 2:
        return
    worst = 0.0
    for name, want in zip(names, (cos, sin)):
        got = numpy_helper.to_array(tables[name], base_dir=str(graph_file.parent)).astype("float32")
        if got.ndim != 2 or got.shape[1] != want.shape[1]:
            raise ExportError(f"{role}: the builder's rotary table {name} is {list(got.shape)}, transformers' "
                              f"[{want.shape[0]}, {want.shape[1]}] ({kind} rotary): not this model's")
        n = min(len(got), len(want))
        worst = max(worst, float(abs(got[:n] - want[:n]).max()))
    if worst > ROTARY_TOLERANCE:
        raise ExportError(f"{role}: the builder's rotary tables{which} are not transformers' for this model ({kind} "
                          f"rotary scaling; cos/sin differ by up to {worst:.3g}): the graph would compute another model")


def _check_config_early(src: Source, role: str) -> None:
    """What a model's config alone refuses (its layers all attention, a context of at least 16), checked before any
    model is built: a drafter's was checked once the target had been built and validated (minutes for a 1.5B;
    session 54, a review). A local folder's config only: a GGUF's or a hub model's is read with its model."""
    if src.kind != "hf-dir":
        return
    from transformers import AutoConfig

    from .source import _first_line

    try:
        cfg = AutoConfig.from_pretrained(str(src.path))
    except Exception as e:  # (transformers raises many types for a config it cannot read)
        raise ExportError(f"cannot load {src.display}: {type(e).__name__}: {_first_line(e, '')}"[:300]) from None
    _check_config(cfg, src, role)


def _check_int8_heads(cfg, src: Source) -> None:
    """ExportError for int8 KV caches (``--kv-dtype int8``) a target's heads cannot have: a head size that is no
    multiple of edgespec.manifest.Q8_GROUP (the rows keep a scale per 32 lanes)."""
    from edgespec.manifest import Q8_GROUP

    heads = getattr(cfg, "num_attention_heads", None)
    head = getattr(cfg, "head_dim", None) or (cfg.hidden_size // heads if heads else None)
    if isinstance(head, int) and head % Q8_GROUP:
        raise ExportError(f"{src.display}: its heads of {head} lanes cannot keep int8 KV caches (a multiple of "
                          f"{Q8_GROUP} is needed): use --kv-dtype float16")


def _check_config(cfg, src: Source, role: str) -> None:
    """ExportError for a config edgespec cannot export: layers other than attention, or a context under 16 tokens
    (a GGUF whose context_length is 0: the bundle recorded 4,096 and the builder's rotary caches held no position,
    so the whole build ran, then the validation failed blaming the manifest)."""
    _check_attention_only(cfg, role)
    declared = getattr(cfg, "max_position_embeddings", None)
    if isinstance(declared, int) and declared < 16:
        raise ExportError(f"{role}: {src.display} gives its model a context of {declared} tokens (its config's "
                          "max_position_embeddings, a GGUF's context_length); edgespec needs at least 16")


def _export_one(role: str, src: Source, tok, stage: Path, precision: str, quant: QuantOptions,
                max_context: int | None, fingerprint: str, progress: Progress, quality_fn=None,
                device: str = "cpu", assistant: Source | None = None, extra: dict | None = None,
                assistant_opts: dict | None = None, kv_int8: bool = False, counted_copy: bool | None = None) -> ModelSpec:
    """One model of the bundle, built, described and validated. ``assistant`` (the target's): a multi-token-prediction
    assistant to build beside it (the target graph then gives its hidden states), its spec put in ``extra``.
    ``counted_copy``: whether ``progress``'s total counted a float32 copy's step (``_copy_for_builder`` then); a GGUF
    copy kept or dropped since (another export's, or one that cannot be read back) moves the total by that step."""
    import torch  # noqa: F401  (export-time only)

    hf_dir = stage / f"_hf_{role}"
    kept = gguf_cached(src.path) if src.kind == "gguf" else None
    folder = src.kind == "hf-dir" and not _copy_for_builder(src)
    if counted_copy is not None:  # (a copy kept or dropped since the count: its step, before this model's 1st line)
        progress.total += (not folder and kept is None) - counted_copy
    progress.step(f"{role}: loading {src.display} into torch (float32)" + (f" (its copy kept in {kept})" if kept else ""))
    model = load_model(src, log=progress.log)
    if kept is not None and gguf_cached(src.path) is None:  # it could not be read back: dropped, the file read
        kept = None
        if counted_copy is not None:  # (its float32 copy's step, which the total has not counted now)
            progress.total += 1
    cfg = model.config
    _check_config(cfg, src, role)
    if kv_int8:  # (exact-kernels --kv-dtype int8 after the build: refused now, not after minutes of it)
        _check_int8_heads(text_config(cfg), src)
    # an image-text checkpoint's decoder (Ministral 3, Gemma 3 4B+): its vocabulary, context, window and rotary are its
    # text config's (the top level has none of them: every such bundle held 4,096 tokens, the vocabulary unchecked)
    text_cfg = text_config(cfg)
    check_vocabulary(tok, getattr(text_cfg, "vocab_size", None), src, target=role == "target")  # (before the build)
    model_ctx = int(getattr(text_cfg, "max_position_embeddings", 0) or 4096)
    ctx = min(max_context, model_ctx) if max_context else model_ctx
    if max_context and max_context > model_ctx:  # (said, not silently dropped: plan and perplexity say so too)
        progress.log(f"    {role}: a max context of {max_context:,} (--max-context) is past the model's {model_ctx:,} "
                     f"tokens; the bundle holds {model_ctx:,}")
    if folder:
        build_input = src.path
    elif kept is not None:  # read from it just now: the builder reads it too
        build_input = kept
    else:
        progress.step(f"{role}: writing a float32 Hugging Face copy for the builder")
        model.save_pretrained(hf_dir, safe_serialization=True)
        tok.save_pretrained(hf_dir)
        build_input = hf_dir
        if src.kind == "gguf":
            keep_gguf_copy(src.path, hf_dir, log=progress.log)
    # (int8 and --float-embeddings: no shared table, the asked-for zero points kept; session 56, a review)
    if (precision == "int4" and not quant.is_symmetric and quant.quantize_lm_head and quant.quantize_embeddings
            is not False and getattr(cfg, "tie_word_embeddings", False) and quant.algorithm not in SWAPPED):
        # (hqq, q4_k: the builder writes a float table beside the lm_head's own quantized weights: export/build.py)
        # onnxruntime-genai's builder shares one quantized table between a tied embedding and the
        # lm_head; with zero points it writes a graph onnxruntime refuses (a uint8 Reshape where
        # float is expected, seen with SmolLM2 and builder 0.18): such models stay symmetric
        quant = replace(quant, symmetric=True)
        progress.log(f"    {role}: tied embeddings and lm_head: "
                     + ("their shared table quantized symmetric" if quant.algorithm in FLOAT_ZERO_POINTS
                        else "quantized symmetric") + " (the builder's shared table does not take zero points)")
    rotary = reference_rotary(model, ctx)
    params = list(model.parameters())
    config = {"model_type": cfg.model_type, "_params": params}
    progress.step(f"{role}: building the {precision} ONNX graph, {device} layout (onnxruntime-genai model builder)")
    del model
    gc.collect()
    quant = quant.for_layout(precision, device)
    build = run_builder(build_input, stage / role, stage / "_cache", precision, quant, log=progress.log,
                        device=device)
    if build.layout != device:
        progress.log(f"    {role}: {precision} has only the builder's {build.layout} layout (float16 activations "
                     f"and KV cache); recorded as {build.layout}")
    dec = build.genai_config["model"]["decoder"]
    _check_state_inputs(dec, role)
    graph_file, logits = build.model_dir / dec.get("filename", "model.onnx"), dec["outputs"]["logits"]
    conv_layers = ()
    if dec["inputs"].get("past_conv_names"):  # (LFM2's convolution layers: their inputs made outputs, for rollback)
        from .conv import expose_conv_inputs

        if build.layout != "cpu":
            raise ExportError(f"{role}: a model with convolution layers runs on the CPU only for now: export it with "
                              "--device cpu (not fp16)")
        conv_layers = expose_conv_inputs(graph_file, dec["inputs"]["past_conv_names"])
        progress.log(f"    {role}: {len(conv_layers)} convolution layers' inputs made outputs (their states rolled "
                     "back by the runtime)")
    if quant.algorithm == "gguf":
        from .gguf_blocks import apply_to_graph

        progress.log(f"    {role}: putting the GGUF's own 4-bit blocks in place of the builder's")
        apply_to_graph(graph_file, src.path, cfg.model_type, int(cfg.num_attention_heads),
                       int(getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads), log=progress.log)
    fp8 = None
    if precision == "fp8":
        from .fp8 import convert_model_dir

        progress.log(f"    {role}: rewriting MatMul weights to float8e4m3fn + DequantizeLinear")
        fp8 = convert_model_dir(stage / role, quant.fp8_scheme, quant.block_size, quant.quantize_lm_head,
                                log=progress.log)
    from .kernels import SKIP_INPUT, add_logits_skip, apply_window, attention_windows, settle_graph

    window = int(getattr(text_cfg, "sliding_window", None) or 0)
    types = getattr(text_cfg, "layer_types", None)
    if types is not None and "sliding_attention" not in types:
        window = 0  # (a window in a config whose layers all attend fully, OLMo 3's with every layer full: none applies)
    windows = attention_windows(graph_file)
    if 0 < window < ctx and windows and all(w < 0 for w in windows) and types is None:
        # the model attends within a sliding window in every layer (transformers' config says so) that the builder's
        # graph does not apply (Mistral 7B v0.1's 4,096, Phi-3-mini-4k's 2,047): given to every attention (session
        # 60; before, the bundle held the window's length)
        n = apply_window(graph_file, window)
        if n:
            windows = attention_windows(graph_file)
            progress.log(f"    {role}: the model's sliding window of {window:,} tokens, which the builder's graph "
                         f"leaves out, given to its {n} attention layers")
    if 0 < window < ctx and windows and all(w < 0 for w in windows):
        # (a graph whose attention takes no window: it computes the model only up to the window's length)
        progress.log(f"    {role}: the model's sliding window of {window:,} tokens is not in the builder's graph; "
                     f"the bundle holds {window:,} tokens (past them its attention would not be the model's)")
        ctx = window
    rp = getattr(text_cfg, "rope_parameters", None) or {}
    beta, original = rp.get("llama_4_scaling_beta"), rp.get("original_max_position_embeddings")
    if beta and isinstance(original, int) and 0 < original < ctx:
        # Ministral 3 (and Llama 4): past the original context each query is scaled by 1 + beta x log(1 + floor(position
        # / original)), which the builder's graph does not apply: the graph is the model up to that length
        progress.log(f"    {role}: the model scales its queries past {original:,} tokens (llama_4_scaling_beta), which "
                     f"the builder's graph does not; the bundle holds {original:,} tokens")
        ctx = original
    unbound, rope = settle_graph(graph_file, ctx)  # (windows at least ctx: the ones kept are the shorter)
    check_rotary(graph_file, rotary, role)  # (after settle_graph: LongRoPE's tables are one, per position, then)
    if rope:
        progress.log(f"    {role}: LongRoPE's short and long rotary caches made one, per position (the builder chose "
                     "them per call, so a verify call crossing the original context rotated its rows otherwise)")
    if dec.pop("sliding_window", None) is not None:  # (onnxruntime-genai's window-sized caches: the graph has none now)
        (build.model_dir / "genai_config.json").write_text(json.dumps(build.genai_config, indent=4))
        progress.log(f"    {role}: genai_config.json's sliding_window taken off (the graph's caches hold the context)")
    kept_window = max((w for w in windows if 0 < w < ctx), default=0)
    if unbound:
        progress.log(f"    {role}: {unbound} attention layers' sliding windows are as long as the {ctx:,}-token "
                     "context or longer: taken off (the same attention)")
    argmax = None
    if build.layout == "cuda" and role == "target":  # greedy verification reads indices, not logits
        from .greedy import add_argmax_output

        argmax = add_argmax_output(graph_file, logits)
        progress.log(f"    {role}: added the {argmax!r} output (ArgMax of the logits on the device)")
    # prefill chunks and a drafter's catch-up reads compute their last rows' logits only: on a GPU a
    # 512-token chunk's 512 x 151,936 logits were copied to the host and converted there
    skip = SKIP_INPUT if add_logits_skip(graph_file, logits) else None
    if skip is None:
        progress.log(f"    {role}: no lm_head found for the logits skip: prefills compute every row's logits")
    hidden = None
    if assistant is not None:  # the assistant's first draft step reads the row that produced the last token
        from .kernels import add_hidden_output

        hidden = add_hidden_output(graph_file, logits)
        if hidden is None:
            raise ExportError(f"{role}: no lm_head found in the graph, whose input an assistant drafts from")
        progress.log(f"    {role}: added the {hidden!r} output (each logits row's hidden state, for the assistant)")
    spec = _describe(stage, role, build, config, precision, quant, fingerprint, ctx, argmax=argmax,
                     logits_skip=skip, conv_layers=conv_layers)
    if hidden is not None:
        spec = replace(spec, io=replace(spec.io, hidden=hidden))
    if kept_window:
        spec = replace(spec, attention_window=kept_window)
        progress.log(f"    {role}: sliding windows of up to {kept_window:,} tokens kept, over caches of the whole "
                     "context")
    if fp8 is not None:
        spec = replace(spec, quant=fp8)
    del params, config
    gc.collect()
    progress.log(f"    {role}: measuring the graph's resident memory once opened on the CPU EP")
    spec = replace(spec, **measured_sizes(stage, role, spec.to_dict(stage), log=progress.log))
    # keep only the graph, its data and genai_config.json (for side-by-side runs with onnxruntime-genai)
    for f in (stage / role).iterdir():
        if not (f.name.startswith("model.onnx") or f.name == "genai_config.json"):
            f.unlink() if f.is_file() else shutil.rmtree(f)
    progress.step(f"{role}: validating the graph against torch through edgespec's runtime")
    model = load_model(Source(str(build_input), "hf-dir", build_input)) if build_input != src.path else load_model(src)
    spec = replace(spec, validation=validate(model, tok, spec, precision, progress.log))
    if quality_fn is not None:
        spec = replace(spec, quality=quality_fn(role, model, spec, progress))
    if assistant is None:
        del model
        gc.collect()
    if not spec.validation.passed:
        raise ExportError(f"{role}: the ONNX graph does not match torch (see the ✗ lines above)")
    if assistant is not None:
        extra["assistant"] = _export_assistant(assistant, model, spec, stage, tok, precision, progress,
                                               **(assistant_opts or {}))
        del model
        gc.collect()
    if hf_dir.exists():
        shutil.rmtree(hf_dir)
    return spec


def _export_assistant(src: Source, target, tspec: ModelSpec, stage: Path, tok, precision: str, progress: Progress,
                      assistant_precision: str = "fp32", quant: QuantOptions | None = None):
    """Gemma 4's multi-token-prediction assistant at ``src`` built for the target ``target`` (torch, loaded) of spec
    ``tspec``, validated against transformers' assistant step on the target's own state (export/mtp.py); at
    ``assistant_precision`` int8 or int4, its weight matrices quantized after (``quant``'s block size and accuracy
    level), checked against the float graph it was made from."""
    import numpy as np
    import torch
    import transformers

    from edgespec.manifest import AssistantSpec

    from .mtp import (GRAPH_NAME, assistant_files, build_assistant, compare_assistants, quantize_assistant,
                      runtime_state, validate_assistant)

    progress.log(f"    assistant: loading {src.display} into torch (float32)")
    try:
        name, kw = src.from_pretrained_args()
        model = transformers.Gemma4AssistantForCausalLM.from_pretrained(name, dtype=torch.float32, **kw).eval()
    except Exception as e:  # (transformers raises many types for a checkpoint it cannot read)
        from .source import _first_line

        raise ExportError(f"cannot load the assistant {src.display}: {type(e).__name__}: {_first_line(e, '')}"[:300]
                          ) from None
    text = text_config(target.config)
    kv = {layer: tspec.kv_shape(layer) for layer in range(tspec.num_layers)}
    out = stage / "assistant"
    graph = build_assistant(model, text, kv, tspec.kv_dtype, out, table_dtype="float32" if precision == "fp32" else
                            "float16", target_embed=target.get_input_embeddings().weight,
                            embed_scale=getattr(target.get_input_embeddings(), "scalar_embed_scale", None))
    progress.log(f"    assistant: {graph.num_layers} layers of width {graph.hidden_size}, attending the target's "
                 + ", ".join(f"layer {i} ({k.replace('_attention', '')})" for k, i in graph.sources.items())
                 + (", the centroid head" if graph.ordered else ""))
    sample = tok.encode(VALIDATION_SAMPLE, add_special_tokens=False)[:64]
    ids = [int(i) % graph.vocab_size for i in sample] or list(range(1, 40))
    while len(ids) < graph.sliding_window + 8:  # (positions past the window too)
        ids = ids + ids
    kinds = list(text.layer_types)
    for layer in range(tspec.num_layers):  # (the graph's own sharing, found at export, says the same layers)
        source = tspec.kv_source(layer)
        if source != layer and graph.sources.get(kinds[layer], source) != source:
            raise ExportError(f"the target's {kinds[layer]} layers share layer {source}'s cache, the assistant would "
                              f"attend layer {graph.sources[kinds[layer]]}'s: not written")
    # (past the sliding window where the context allows: a context shorter than the window has no position past it)
    ids = ids[: min(max(40, graph.sliding_window + 8), tspec.max_context - tspec.attention_pad - 1)]
    state = runtime_state(tspec, ids, graph.sources)  # (the target read once: both checks' inputs)
    worst = validate_assistant(graph, model, target, tspec, ids, progress.log, state=state)
    if assistant_precision != "fp32":
        floated = stage / "_assistant_float"  # (the float graph moved aside, not copied: its table is the target's)
        out.rename(floated)
        out.mkdir()
        q = quant or QuantOptions(accuracy_level=4)
        n = quantize_assistant(floated / GRAPH_NAME, graph, 4 if assistant_precision == "int4" else 8, q.block_size,
                               q.accuracy_level)
        agree, diff = compare_assistants(floated / GRAPH_NAME, graph, ids, state)
        shutil.rmtree(floated, ignore_errors=True)
        progress.log(f"    assistant: {n} weight matrices {assistant_precision} (MatMulNBits, block "
                     f"{q.block_size}); against the float graph: top-1 agreement {agree:.2f}, max |Δlogit| "
                     f"relative {diff:.3g}")
        if agree < 0.5:
            raise ExportError(f"the {assistant_precision} assistant disagrees with its float graph (top-1 agreement "
                              f"{agree:.2f}): not written; export it at --drafter-precision fp32")
    files = assistant_files(stage)
    table = graph.vocab_size * graph.target_hidden_size * np.dtype(graph.table_dtype).itemsize
    return AssistantSpec(path=graph.path.resolve(), architecture="Gemma4AssistantForCausalLM",
                         precision=assistant_precision,
                         hidden_size=graph.hidden_size, target_hidden_size=graph.target_hidden_size,
                         vocab_size=graph.vocab_size, num_layers=graph.num_layers, sources=dict(graph.sources),
                         sliding_window=graph.sliding_window, files=files,
                         bytes_on_disk=sum(v["bytes"] for v in files.values()), params=graph.params,
                         embedding_bytes=table, ordered=graph.ordered, validated=float(worst))


# the text the assistant's check reads (any text: its tokens are the target's input)
VALIDATION_SAMPLE = ("def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
                     "The quick brown fox jumps over the lazy dog. Speculative decoding drafts tokens cheaply.")


def _check_assistant_early(tsrc: Source, asrc: Source) -> None:
    """The assistant's config against the target's (a local folder's), before the target is built: a Gemma 4
    target, the hidden size the assistant was trained with, the vocabulary. A target read from a GGUF or the hub is
    checked once loaded (export/mtp.py ``check_pair``)."""
    if tsrc.kind == "gguf":
        return
    from transformers import AutoConfig

    from .source import _first_line

    try:
        tname, tkw = tsrc.from_pretrained_args()
        aname, akw = asrc.from_pretrained_args()
        tcfg = text_config(AutoConfig.from_pretrained(tname, **tkw))
        acfg = AutoConfig.from_pretrained(aname, **akw)
    except Exception as e:  # (transformers raises many types for a config it cannot read)
        raise ExportError(f"cannot load a config: {type(e).__name__}: {_first_line(e, '')}"[:300]) from None
    if not str(getattr(tcfg, "model_type", "")).startswith("gemma4"):
        raise ExportError(f"the assistant {asrc.display} drafts for Gemma 4 targets; {tsrc.display} is "
                          f"{getattr(tcfg, 'model_type', 'another model')}")
    if int(acfg.backbone_hidden_size) != int(tcfg.hidden_size):
        raise ExportError(f"the assistant was trained with a target of hidden size {acfg.backbone_hidden_size}, the "
                          f"target's is {tcfg.hidden_size}: not this target's assistant")
    if int(acfg.text_config.vocab_size) != int(tcfg.vocab_size):
        raise ExportError(f"the assistant's vocabulary ({acfg.text_config.vocab_size}) is not the target's "
                          f"({tcfg.vocab_size})")


def _config_vocab(src: Source) -> int | None:
    """The rows of a model's vocabulary as its config says, which bound ``--drafter-vocab``'s head (a tokenizer may
    hold special ids past them: Gemma 3 1B's ``<image_soft_token>``): a folder's or a hub model's (a hub model's was
    not read before session 90: its head could take an id without a row); None for a GGUF file, whose tokenizer is
    its list of tokens, one a row (llama.cpp's converter drops the ids past the rows; reading the file's fields
    here took 5-11 s), and where the config cannot be read (the model's reading says why later)."""
    if src.kind == "gguf":
        return None
    try:
        from transformers import AutoConfig

        name, kw = src.from_pretrained_args()
        v = getattr(text_config(AutoConfig.from_pretrained(name, **kw)), "vocab_size", None)
    except Exception:  # noqa: BLE001 - read later, with its own error
        return None
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _is_assistant(src: Source) -> bool:
    """``src`` is a multi-token-prediction assistant (a local folder or a hub model whose config says
    ``gemma4_assistant``; a GGUF file is none)."""
    from .mtp import ASSISTANT_TYPE

    if src.kind == "hf-dir":
        try:
            raw = json.loads((src.path / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        return isinstance(raw, dict) and raw.get("model_type") == ASSISTANT_TYPE
    if src.kind != "hub":
        return False
    from .source import _check_hub

    try:  # (one quick request where the hub cannot be reached: AutoConfig alone retried it for ~25 s first)
        _check_hub(src)
    except ExportError:
        return False  # the drafter's own path says why, at once
    try:
        from transformers import AutoConfig

        name, kw = src.from_pretrained_args()
        return getattr(AutoConfig.from_pretrained(name, **kw), "model_type", None) == ASSISTANT_TYPE
    except Exception:  # noqa: BLE001 - not readable here: the drafter's own path says why
        return False


def _check_combination(precision: str, quant: QuantOptions, given: frozenset = frozenset()) -> None:
    """Options that do nothing for the chosen target precision are errors, not silently ignored: those that differ
    from their defaults, and those in ``given`` (the fields the command line set, whatever their value: the CLI's
    `--accuracy-level 4` for an fp32 target did nothing and was taken)."""
    default = QuantOptions()

    def set_(field: str) -> bool:
        return field in given or getattr(quant, field) != getattr(default, field)

    if precision not in ("int4", "int8"):
        symmetry = "--symmetric" if quant.symmetric else "--asymmetric"
        for flag, differs in ((symmetry, quant.symmetric is not None), ("--quant-algo", set_("algorithm")),
                              ("--quantize-embeddings" if quant.quantize_embeddings else "--float-embeddings",
                               quant.quantize_embeddings is not None),
                              ("--no-quantize-lm-head", not quant.quantize_lm_head and precision != "fp8"),
                              ("--accuracy-level", set_("accuracy_level"))):
            if differs:
                raise ExportError(f"{flag} applies to int4/int8 targets, not {precision}")
    if precision != "fp8" and set_("fp8_scheme"):
        raise ExportError(f"--fp8-scheme applies to fp8 targets, not {precision}")
    if precision not in ("int4", "int8", "fp8") and set_("block_size"):
        raise ExportError(f"--block-size applies to int4/int8/fp8 targets, not {precision}")
    if precision == "fp8" and set_("block_size") and quant.fp8_scheme != "block":
        raise ExportError("--block-size with fp8 needs --fp8-scheme block (channel scales have no blocks)")


def _check_float_zero_points(quant: QuantOptions, src, precision: str, device: str, flag: str = "--quant-algo",
                             role: str = "target") -> None:
    """gguf, hqq and q4_k write 4-bit blocks with minimums (float zero points) for the cpu layout: what they cannot
    make is refused in one line before anything is read."""
    if quant.algorithm not in FLOAT_ZERO_POINTS:
        return
    why = (f"the {role} is not a .gguf file" if quant.algorithm == "gguf" and src.kind != "gguf"
           else "it is int4 only" if precision != "int4"
           else "its float zero points are for the cpu layout" if device != "cpu"
           else "the blocks have minimums (zero points): not --symmetric" if quant.symmetric
           else "its float zero points are for MatMul weights (the embedding table's GatherBlockQuantized takes "
                "none): not --quantize-embeddings" if quant.quantize_embeddings else None)
    if why:
        what = {"gguf": "keeps a GGUF file's own 4-bit blocks", "hqq": "fits a float zero point to each block",
                "q4_k": "writes llama.cpp's Q4_K blocks"}[quant.algorithm]
        raise ExportError(f"{flag} {quant.algorithm} {what}: {why}")


def _copy_for_builder(src: Source) -> bool:
    """Whether the builder reads a float32 Hugging Face copy of ``src`` (``_export_one``): a GGUF without a kept copy,
    a hub model, a folder holding a GGUF; a folder of safetensors is read as it is."""
    if src.kind == "hf-dir":
        return any(src.path.glob("*.gguf"))
    return not (src.kind == "gguf" and gguf_cached(src.path) is not None)


def export_bundle(target: str, out: str | os.PathLike, **kw) -> Path:
    """Export TARGET (and DRAFTER) into a bundle directory at ``out`` (``_export_bundle``), a GGUF file's reads
    sharing one parse of it (``source.gguf_reads_once``: its tokenizer's and its model's)."""
    from .source import gguf_reads_once

    gguf = any(str(x).lower().endswith(".gguf") for x in (target, kw.get("drafter")) if x)
    with gguf_reads_once(gguf):
        return _export_bundle(target, out, **kw)


def _export_bundle(target: str, out: str | os.PathLike, *, drafter: str | None = None,
                  target_precision: str = "int4", drafter_precision: str | None = None,
                  max_context: int | None = None, quant: QuantOptions | None = None,
                  drafter_quant: QuantOptions | None = None, force: bool = False, quality: bool = True,
                  device: str = "cpu", drafter_device: str | None = None, drafter_vocab: int = 0,
                  drafter_vocab_corpus: Sequence[str] = (), exact_kernels: bool = False, kv_dtype: str | None = None,
                  stream=None) -> Path:
    """Export TARGET (and DRAFTER) into a bundle directory at ``out``. Atomic: on any failure
    nothing is left at ``out`` (an existing bundle there is kept unless the new one succeeds).
    ``drafter_vocab`` N > 0 cuts the drafter's lm_head to N tokens (export/head.py), ranked by
    token frequency in ``drafter_vocab_corpus`` (text files or directories) when given.
    ``exact_kernels``: the bundle rewritten to edgespec's INT4 kernels (export/kernels.py's ``apply_to_bundle``,
    ``kv_dtype`` its KV caches' type, None its default) before it is published, so that a failed or stopped
    rewrite leaves nothing either (it ran on the published bundle: the one without the kernels stayed, and
    ``force``'s old bundle was gone already)."""
    if target_precision not in TARGET_PRECISIONS:
        raise ExportError(f"--target-precision must be one of {', '.join(TARGET_PRECISIONS)}")
    drafter_precision = drafter_precision or default_drafter_precision(drafter_device or device)  # (as the CLI's)
    if drafter_precision not in DRAFTER_PRECISIONS:
        raise ExportError(f"--drafter-precision must be one of {', '.join(DRAFTER_PRECISIONS)}")
    drafter_device = drafter_device or device
    for flag, d in (("--device", device), ("--drafter-device", drafter_device)):
        if d not in LAYOUTS:
            raise ExportError(f"{flag} must be one of {', '.join(LAYOUTS)}, got {d!r}")
    # what the build cannot make is refused before anything is read or written
    builder_args(target_precision, quant or QuantOptions(), device)
    if drafter:
        try:
            builder_args(drafter_precision, drafter_quant or QuantOptions(accuracy_level=4), drafter_device)
        except ExportError as e:  # (its words name the target's flags: the drafter's are these)
            raise ExportError("the drafter: " + str(e).replace("--target-precision", "--drafter-precision")
                              .replace("fp16 or fp8, or int4/int8", "fp16, int8 or int4")  # (no fp8 drafter)
                              .replace("--device", "--drafter-device")) from None
    if isinstance(drafter_vocab, bool) or not isinstance(drafter_vocab, int) or drafter_vocab < 0:
        raise ExportError(f"--drafter-vocab must be a number of tokens >= 0 (0: the full head), got {drafter_vocab!r}")
    if drafter_vocab and not drafter:
        raise ExportError("--drafter-vocab applies to a bundle with a --drafter")
    if drafter_vocab_corpus and not drafter_vocab:
        raise ExportError("--drafter-vocab-corpus applies with --drafter-vocab N")
    if max_context is not None and max_context < 16:
        raise ExportError(f"--max-context must be at least 16, got {max_context}")
    if exact_kernels:
        from .kernels import _check_kv_dtype

        acc = (quant or QuantOptions()).accuracy_level
        if target_precision != "int4" or device != "cpu" or acc != 4:
            raise ExportError("--exact-kernels applies to an int4 target in the cpu layout at accuracy level 4")
        _check_kv_dtype(kv_dtype or "auto", True)
    elif kv_dtype is not None:
        raise ExportError("--kv-dtype applies with --exact-kernels")
    out = check_output(out, force, [target, drafter])
    quant = quant or QuantOptions()
    # the drafter's arithmetic never changes the output (the target verifies), so it takes the fast int8 path
    drafter_quant = drafter_quant or QuantOptions(accuracy_level=4)
    tsrc = resolve(target)
    dsrc = resolve(drafter) if drafter else None
    asrc = None
    if dsrc is not None and _is_assistant(dsrc):  # Gemma 4's MTP assistant: built beside the target (export/mtp.py)
        if drafter_vocab:
            raise ExportError("--drafter-vocab applies to a model drafter, not to an assistant")
        from .mtp import PRECISIONS

        if device != "cpu" or drafter_device != "cpu":
            raise ExportError("an assistant drafts for a target on the CPU for now: export it with --device cpu")
        if drafter_precision not in PRECISIONS:
            raise ExportError(f"an assistant exports at --drafter-precision {', '.join(PRECISIONS)}, not "
                              f"{drafter_precision}")
        if drafter_quant is not None and drafter_quant.algorithm != "rtn":
            raise ExportError("an assistant's weights are quantized by round to nearest (onnxruntime's "
                              f"MatMulNBitsQuantizer): --drafter-quant-algo {drafter_quant.algorithm} does not apply")
        if exact_kernels and kv_dtype == "int8":
            raise ExportError("the assistant reads the target's KV caches as float16 or float32: --kv-dtype int8 "
                              "does not apply with it (use float16)")
        asrc, dsrc = dsrc, None
    _check_combination(target_precision, quant)
    _check_float_zero_points(quant, tsrc, target_precision, device)
    if dsrc:
        _check_float_zero_points(drafter_quant, dsrc, drafter_precision, drafter_device, "--drafter-quant-algo",
                                 "drafter")
    # SIGTERM unwinds through the cleanup below, as Ctrl-C does (from here: during the tokenizers' read, ~9 s for a
    # GGUF's, it ended the process with no line and the builder's helper went on importing; session 54, a review)
    guard = terminate_cleanly()
    guard.__enter__()
    try:
        prestart_builder()  # (its imports run beside the reading of the model below)
        # each model: loading, the builder's float32 copy where it needs one, the build, the validation (the quality
        # report's lines go with the validation's). (A GGUF's kept copy is checked against its record here, once for
        # the export: a few seconds for a 1.5B's.)
        copies = {"target": _copy_for_builder(tsrc), "drafter": dsrc is not None and _copy_for_builder(dsrc)}
        steps = (1 + 3 + copies["target"] + (3 + copies["drafter"] if dsrc else 0) + 2 + (1 if drafter_vocab else 0)
                 + (1 if exact_kernels else 0))
        progress = Progress(steps, stream)
        progress.step(f"reading tokenizers ({tsrc.display}{', ' + dsrc.display if dsrc else ''})")
        ttok, tdata, (tfp, tvocab) = load_tokenizer(tsrc)
        chat_template = _chat_template(ttok, tsrc.display)
        if dsrc:
            dtok, ddata, (dfp, dvocab) = load_tokenizer(dsrc)
            if dfp != tfp:
                raise ExportError(_tokenizer_diff(tdata, ddata, tsrc.display, dsrc.display))
            _check_config_early(dsrc, "drafter")
        if asrc is not None:
            _check_assistant_early(tsrc, asrc)
        head_ids = None
        if drafter_vocab:  # a bad N is refused before the long part
            from .head import corpus_ranking, select_head_ids

            ranked = ()
            if drafter_vocab_corpus:
                import tempfile

                with tempfile.TemporaryDirectory() as tmp:
                    tj = Path(tmp) / "tokenizer.json"
                    tj.write_text(json.dumps(tdata, ensure_ascii=False), encoding="utf-8")
                    ranked = corpus_ranking(tj, drafter_vocab_corpus)
            head_ids = select_head_ids(tdata, drafter_vocab, eos_ids=_eos_ids(ttok, tsrc),
                                       bos_id=ttok.bos_token_id, vocab_size=min(tvocab, _config_vocab(tsrc) or tvocab),
                                       ranked=ranked)
        stage = replaced = None
        made = missing_parents(out)  # (removed again if the export fails)
    except BaseException:
        guard.__exit__(None, None, None)
        raise
    try:
        stage = prepare_stage(out)
        quality_fn = None
        if quality:
            from .quality import QualityRun

            quality_fn = QualityRun(ttok, target_precision)
        extra: dict = {}
        models = {"target": _export_one("target", tsrc, ttok, stage, target_precision, quant, max_context, tfp,
                                        progress, quality_fn, device, assistant=asrc, extra=extra,
                                        assistant_opts={"assistant_precision": drafter_precision,
                                                        "quant": drafter_quant},
                                        kv_int8=exact_kernels and kv_dtype == "int8",
                                        counted_copy=copies["target"])}
        if dsrc:
            models["drafter"] = _export_one("drafter", dsrc, dtok, stage, drafter_precision, drafter_quant,
                                            max_context, dfp, progress, quality_fn, drafter_device,
                                            counted_copy=copies["drafter"])
            if quality_fn is not None:
                models["drafter"] = replace(models["drafter"], quality=quality_fn.drafter_agreement(
                    models["target"], models["drafter"], progress))
        progress.step("hashing the source files (the manifest's source_files)")
        source_record = {role: files for role, src in (("target", tsrc), ("drafter", dsrc), ("assistant", asrc))
                         if src is not None
                         for files in (source_files(src, progress.log),) if files}
        progress.step("writing tokenizer and manifest")
        tdir = stage / "tokenizer"
        tdir.mkdir()
        (tdir / "tokenizer.json").write_text(json.dumps(tdata, ensure_ascii=False), encoding="utf-8")
        eos = _eos_ids(ttok, tsrc)
        (tdir / "tokenizer_config.json").write_text(json.dumps({
            "bos_token": ttok.bos_token, "eos_token": ttok.eos_token, "add_bos_token": _add_bos(ttok),
            "chat_template": chat_template}, indent=1, ensure_ascii=False), encoding="utf-8")
        from edgespec.tokenizer import special_ids_past

        tok_files = {f"tokenizer/{f.name}": {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
                     for f in sorted(tdir.iterdir())}
        manifest = Manifest(
            root=stage,
            name=out.name,
            target=models["target"],
            drafter=models.get("drafter"),
            eos_token_ids=tuple(eos),
            bos_token_id=ttok.bos_token_id,
            add_bos=_add_bos(ttok),
            chat_template=chat_template,
            tokenizer_dir=tdir.resolve(),
            tool_versions=_versions(),
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            sources={"target": tsrc.display, **({"drafter": dsrc.display} if dsrc else {}),
                     **({"assistant": asrc.display} if asrc else {})},
            source_files=source_record,
            tokenizer_vocab_size=tvocab,
            tokenizer_files=tok_files,
            assistant=extra.get("assistant"),
            sampling_defaults=_sampling_defaults(tsrc, progress.log),
            # (special tokens past the target's vocabulary: Gemma 3 1B's <image_soft_token>; source.check_vocabulary)
            tokenizer_special_past=special_ids_past(ttok.backend_tokenizer, models["target"].vocab_size) or 0,
        )
        if head_ids is not None:
            from .head import head_source, reduce_in_stage

            progress.step(f"drafter: cutting the lm_head to {len(head_ids)} tokens (--drafter-vocab)")
            manifest = reduce_in_stage(stage, manifest, head_ids, log=progress.log,
                                       source=head_source(drafter_vocab_corpus))
        # what is written reads back (the schema's checks, and target and drafter share a tokenizer)
        Manifest.from_dict(manifest.to_dict(), stage)
        for junk in stage.glob("_*"):
            shutil.rmtree(junk, ignore_errors=True)
        write_manifest(manifest)
        if exact_kernels:  # in place on the stage (its own stage beside it), then published as any export
            from edgespec.manifest import load_manifest

            from .kernels import apply_to_bundle

            progress.step("rewriting to edgespec's INT4 kernels, edgespec.MatMulQ4 (--exact-kernels)")
            apply_to_bundle(stage, None, log=progress.log, kv_dtype=kv_dtype)
            manifest = load_manifest(stage)
        replaced = publish(stage, out, force, [target, drafter])
    except BaseException as e:
        if stage is not None:
            shutil.rmtree(stage, ignore_errors=True)
            for junk in stage.parent.iterdir():  # (the exact-kernels rewrite's own stage, or its old copy)
                if junk.name.startswith(f".{stage.name}.") and junk.is_dir() and not junk.is_symlink():
                    shutil.rmtree(junk, ignore_errors=True)
        remove_parents(made)
        if stage is not None:  # (onnx's and protobuf's writes name no path)
            raise_if_full(e, f"the bundle {out}", stage.parent,
                          "nothing was written" + (" (the bundle there is as it was)" if out.exists() else ""))
        raise
    finally:
        guard.__exit__(None, None, None)
    remove_replaced(replaced)  # (the export is done once published: a SIGTERM while the old tree was deleted said
    # it failed, exit 143, the new bundle in place; session 54, a review)
    for spec in (manifest.target, manifest.drafter):
        if spec is not None:
            progress.log(device_memory_line(spec))
    progress.log(f"bundle written: {out}")
    return out


def device_memory_line(spec: ModelSpec) -> str:
    """The figure a memory plan on a GPU provider uses for ``spec``: its weights as stored (a GPU
    provider copies every initializer to the device) and its KV cache per token in the graph's type."""
    return (f"{spec.role} ({spec.layout} layout): {spec.gpu_weight_bytes / (1 << 20):.1f} MiB of weights on a GPU "
            f"provider's device + KV {spec.kv_dtype} {spec.kv_bytes_per_token / 1024:.1f} KiB/token "
            f"({spec.kv_bytes(spec.max_context) / (1 << 20):.1f} MiB at its {spec.max_context:,}-token context); "
            f"'edgespec plan' adds the runtime")


def _add_bos(tok) -> bool:
    return bool(getattr(tok, "add_bos_token", False)) and tok.bos_token_id is not None


# the special tokens' texts llama.cpp's vocabulary loader takes as end-of-generation beside a GGUF's EOS id
END_OF_GENERATION = frozenset({"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>",
                               "<EOT>", "_<EOT>", "<|end_of_text|>", "<｜end▁of▁sentence｜>"})


def _chat_template(tok, display: str) -> str | None:
    """The tokenizer's chat template: a string, or where its tokenizer_config.json names several (a list of {name,
    template}, Hermes' and Command-R's; transformers gives a dict) the one named ``default``, what
    ``apply_chat_template`` renders when none is named (session 54, a review: the whole export ran, then its
    manifest refused a dict); several without a default are refused here, before the build."""
    t = getattr(tok, "chat_template", None)
    if isinstance(t, list):
        t = {x.get("name"): x.get("template") for x in t if isinstance(x, dict)}
    if isinstance(t, dict):
        if isinstance(t.get("default"), str):
            return t["default"]
        names = ", ".join(sorted(str(k) for k in t))[:200]
        raise ExportError(f"{display}: its tokenizer has named chat templates ({names}) and none named default: "
                          f"edgespec's bundle holds one")
    if t is not None and not isinstance(t, str):
        raise ExportError(f"{display}: its tokenizer's chat template is a {type(t).__name__}, not text")
    return t


# a GGUF file's copy of the model's recommended sampling (llama.cpp's converter writes it from generation_config.json)
_GGUF_SAMPLING = {"general.sampling.temp": "temperature", "general.sampling.top_p": "top_p",
                  "general.sampling.top_k": "top_k", "general.sampling.min_p": "min_p",
                  "general.sampling.penalty_repeat": "repetition_penalty"}


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def gguf_metadata(path: Path, keys) -> dict:
    """The scalar values of ``keys`` in a GGUF file's metadata, read from its header alone (gguf's GGUFReader maps
    every tensor first: 8.7 s for the Qwen 1.5B's file); ValueError for a file that is not GGUF (version 2 or 3)."""
    import struct

    import numpy as np

    keys, out = set(keys), {}
    with open(path, "rb") as f:
        def take(fmt):
            n = struct.calcsize(fmt)
            b = f.read(n)
            if len(b) != n:
                raise ValueError("the file ends inside its metadata")
            return struct.unpack(fmt, b)[0]

        def skip(kind):
            if kind == 8:
                f.seek(take("<Q"), 1)
            elif kind == 9:
                inner, count = take("<I"), take("<Q")
                if inner in _GGUF_SCALARS:
                    f.seek(count * struct.calcsize(_GGUF_SCALARS[inner]), 1)
                else:
                    for _ in range(count):
                        skip(inner)
            elif kind in _GGUF_SCALARS:
                f.seek(struct.calcsize(_GGUF_SCALARS[kind]), 1)
            else:
                raise ValueError(f"unknown metadata type {kind}")

        if f.read(4) != b"GGUF" or take("<I") not in (2, 3):
            raise ValueError("not a GGUF file of version 2 or 3")
        take("<Q")  # tensors
        for _ in range(take("<Q")):
            key = f.read(take("<Q")).decode("utf-8", "replace")
            kind = take("<I")
            if key in keys and kind in _GGUF_SCALARS:
                out[key] = take(_GGUF_SCALARS[kind])
                if kind == 6:  # a float32: 0.6 is 0.6000000238418579, kept as the shortest text of that float32
                    out[key] = float(str(np.float32(out[key])))
            else:
                skip(kind)
            if len(out) == len(keys):
                break
    return out


def _sampling_defaults(src: Source, log) -> dict:
    """The sampling the model's authors recommend (``Manifest.sampling_defaults``): a Hugging Face model's
    generation_config.json options where it samples (``do_sample`` true: transformers' generate samples then, and
    vLLM and llama.cpp's converter read the same keys), a GGUF file's ``general.sampling.*`` keys. An option out of
    its range is left out, logged; {} where the source names none or its file cannot be read."""
    from edgespec.errors import ManifestError
    from edgespec.manifest import SAMPLING_KEYS, check_sampling_defaults, sampling_text

    try:
        if src.kind == "gguf":
            raw = {_GGUF_SAMPLING[k]: v for k, v in gguf_metadata(src.path, _GGUF_SAMPLING).items()}
        else:
            from transformers.utils import cached_file

            name, kw = src.from_pretrained_args()
            path = cached_file(name, "generation_config.json", _raise_exceptions_for_missing_entries=False,
                               _raise_exceptions_for_connection_errors=False, **kw)
            d = json.loads(Path(path).read_text(encoding="utf-8")) if path else {}
            raw = {}
            if d.get("do_sample") is True:  # (a temperature it does not name: transformers' 1, as Gemma 3's; its
                # default top-k of 50 is not taken, as vLLM takes none: a cut the file does not name)
                raw = {"temperature": 1.0, **{k: d[k] for k in SAMPLING_KEYS if d.get(k) is not None}}
    except Exception:  # noqa: BLE001 - no recommendation read: none recorded (the file's other reads say what is wrong)
        return {}
    out = {}
    for k, v in raw.items():
        try:
            out.update(check_sampling_defaults({k: v}, f"{src.display}'s recommended sampling"))
        except ManifestError as e:
            log(f"  {e}: left out")
    if out:
        log(f"  the model's recommended sampling, the defaults of serve, chat and generate: {sampling_text(out)}")
    return out


def _eos_ids(tok, src: Source) -> list[int]:
    ids = set()
    if tok.eos_token_id is not None:
        ids.add(int(tok.eos_token_id))
    if src.kind == "gguf":
        # the file's own: its one EOS id (tokenizer.ggml.eos_token_id), which its tokenizer has. GenerationConfig's
        # from_pretrained(folder, gguf_file=...) read a generation_config.json beside the file, another model's
        # maybe, which then set the bundle's EOS ids, and only where no cached copy was read; reading the model's
        # config out of the file instead parses all of it again (3 s for SmolLM2, 9 s for the Qwen 1.5B, a kept
        # copy's export included) for the same id. With it, the special tokens llama.cpp also ends a generation at
        # (its end-of-generation set): a Qwen GGUF's one EOS is <|im_end|>, and a raw prompt's reply ran past the
        # <|endoftext|> its model wrote (from the Hugging Face folder, generation_config names both; session 49)
        added = getattr(tok, "added_tokens_decoder", None) or {}
        ids.update(int(i) for i, t in added.items()
                   if getattr(t, "special", False) and str(getattr(t, "content", t)) in END_OF_GENERATION)
        return sorted(ids)
    try:
        from transformers import GenerationConfig

        name, kw = src.from_pretrained_args()
        gc_ = GenerationConfig.from_pretrained(name, **kw)
        e = gc_.eos_token_id
        ids.update([e] if isinstance(e, int) else list(e or []))
    except Exception:  # noqa: BLE001 - a missing generation config is normal
        pass
    return sorted(ids)


def _tokenizer_diff(a: dict, b: dict, an: str, bn: str) -> str:
    va, vb = (a.get("model") or {}).get("vocab") or {}, (b.get("model") or {}).get("vocab") or {}
    if len(va) != len(vb):
        what = f"vocabulary sizes {len(va)} vs {len(vb)}"
    else:
        diff = [t for t in va if vb.get(t) != va[t]]
        if diff:
            what = f"{len(diff)} tokens map to other ids (e.g. {diff[0]!r})"
        elif (a.get("model") or {}).get("merges") != (b.get("model") or {}).get("merges"):
            what = "the BPE merges differ"
        else:
            what = "special tokens or normalization differ"
    return f"the drafter's tokenizer differs from the target's ({an} vs {bn}): {what}"
