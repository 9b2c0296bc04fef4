"""The bundle manifest (``edgespec.json``): the only contract between export and runtime.

This module is its schema. The export stage builds these records and writes ``Manifest.to_dict()``
(``write_manifest``); the runtime reads ``Manifest.from_dict()`` (``load_manifest``). Fields that
bundles of earlier versions lack are optional, and the key those bundles used for
``gpu_weight_bytes``, ``resident_bytes``, is still read.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import BundleError, ManifestError, TokenizerMismatchError, big_integer, parse_reason, resolved, shown
from .integrity import check_files, sha256_file, write_whole  # noqa: F401  (the file checks, re-exported)

SCHEMA_VERSION = 1
MANIFEST_NAME = "edgespec.json"
_MANIFEST_LIMIT = 16 << 20  # bytes: a manifest is a few KiB
KV_DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2, "int8": 1}  # bytes an element
# int8 KV caches (exact-kernels --kv-dtype int8, edgespec.DecodeAttentionQ8): a row of a head's D lanes is D int8
# numbers and then D / Q8_GROUP float32 scales, one per group of Q8_GROUP lanes (kv.q8_quantize has its numbers)
Q8_GROUP = 32


def kv_row_width(kv_dtype: str, head_dim: int) -> int:
    """A KV cache row's elements (its buffer's last axis) for a head of ``head_dim`` lanes: the head size, or for int8
    caches the numbers and their groups' float32 scales (4 bytes each)."""
    return head_dim + head_dim // Q8_GROUP * 4 if kv_dtype == "int8" else head_dim


def kv_row_head(kv_dtype: str, width: int) -> int:
    """The head size whose rows are ``width`` elements (``kv_row_width``'s inverse)."""
    return width * 8 // 9 if kv_dtype == "int8" else width


# the model's recommended sampling (Manifest.sampling_defaults): the generation options its authors' files name
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def sampling_text(d: dict) -> str:
    """Sampling options as a line shows them: ``temperature 0.7, top_p 0.8``."""
    return ", ".join(f"{k} {v:g}" for k, v in d.items())


def check_sampling_defaults(d: Any, where: str) -> dict:
    """``d`` as sampling defaults: an object of SAMPLING_KEYS' options, each a number in its option's range (top_k
    an integer); ManifestError otherwise."""
    if not isinstance(d, dict):
        raise ManifestError(f"{where} must be an object of sampling options")
    out = {}
    for k, v in d.items():
        if k not in SAMPLING_KEYS:
            raise ManifestError(f"{where}: {shown(k, 60)} is not a sampling option ({', '.join(SAMPLING_KEYS)})")
        if not _is(v, int if k == "top_k" else float):
            raise ManifestError(f"{where}.{k} must be {'an integer' if k == 'top_k' else 'a number'}, got "
                                f"{type(v).__name__}")
        out[k] = int(v) if k == "top_k" else float(v)
    from .decoder import GenerationConfig  # (decoder reads this module: imported when a manifest names defaults)
    from .errors import ConfigError

    try:
        GenerationConfig(**out)
    except ConfigError as e:
        raise ManifestError(f"{where}: {e}") from None
    return out


PAGE = 4096  # bytes of a memory page (x86-64 and aarch64 Linux defaults)
# the weight precisions of a bundle's models, in the order the export CLI offers them
TARGET_PRECISIONS = ("fp32", "fp16", "int4", "int8", "fp8")
DRAFTER_PRECISIONS = ("fp32", "fp16", "int8", "int4")
# a graph's device layout (export --device): cpu, float32 activations and KV cache (float16 KV after
# exact-kernels, session 23: kv_dtype says which); cuda, the model
# builder's CUDA layout, float16 activations and KV cache (what CUDA's GroupQueryAttention takes)
LAYOUTS = ("cpu", "cuda")


def default_drafter_precision(layout: str) -> str:
    """A drafter's precision where none is asked for: fp32, fp16 in the cuda layout (which has no fp32)."""
    return "fp16" if layout == "cuda" else "fp32"


def _is(v: Any, kind: Any) -> bool:
    """``v`` is of ``kind``: a type (bool is no int, an int is a float), 'ints' (a list of
    integers), 'floats' (an object of numbers) or 'counts' (an object of integers)."""
    if kind == "ints":
        return isinstance(v, (list, tuple)) and all(_is(x, int) for x in v)
    if kind in ("floats", "counts"):
        item = float if kind == "floats" else int
        return isinstance(v, dict) and all(isinstance(k, str) and _is(x, item) for k, x in v.items())
    if kind in (int, float) and isinstance(v, bool):
        return False
    return isinstance(v, (int, float) if kind is float else kind)


def _req(d: dict, key: str, kind: Any, where: str) -> Any:
    if key not in d:
        raise ManifestError(f"manifest: {where} lacks '{key}'")
    if not _is(d[key], kind):
        raise ManifestError(f"manifest: {where}.{key} has the wrong type ({type(d[key]).__name__})")
    return d[key]


def _opt_count(d: dict, key: str, where: str) -> int | None:
    v = d.get(key)
    if v is not None and (not _is(v, int) or v < 0):
        raise ManifestError(f"manifest: {where}.{key} must be a non-negative integer, got {v!r}")
    return v


def _opt(kind: Any, where: str, d: dict, key: str) -> Any:
    """``d[key]`` checked against ``kind``; None when absent or null."""
    return None if d.get(key) is None else _req(d, key, kind, where)


def _inside(root: Path, rel: str, where: str) -> Path:
    if "\x00" in rel:  # (Path.resolve raises an untyped ValueError on it)
        raise ManifestError(f"{where}: {rel!r} holds a NUL character: not a path")
    p, top = resolved(root / rel), resolved(root)
    if os.path.commonpath([str(p), str(top)]) != str(top):
        raise BundleError(f"{where}: {rel!r} points outside the bundle directory")
    return p


def _files(root: Path, files: dict, where: str) -> dict:
    """A ``files`` table: path relative to the bundle -> {"bytes": int, "sha256": str}."""
    for frel, meta in files.items():
        _inside(root, frel, f"manifest {where}.files")
        if not isinstance(meta, dict) or not _is(meta.get("bytes"), int):
            raise ManifestError(f"manifest: {where}.files[{frel!r}] needs 'bytes'")
        if not isinstance(meta.get("sha256", ""), str):
            raise ManifestError(f"manifest: {where}.files[{frel!r}].sha256 must be a string")
    return files


_MAX_INT = 2 ** 63 - 1  # no count, size or dimension a manifest holds comes near it


def _check_magnitudes(raw: Any, mpath: Path, where: str = "manifest") -> None:
    """Every integer in the parsed manifest within a 64-bit count: JSON's integers are unbounded, and one past a
    float's range (10**400) was an OverflowError traceback where a field is a number (the kernels' check, a
    validation figure) or a size is printed in MiB (session 55, a review)."""
    found = big_integer(raw, _MAX_INT, where)
    if found is not None:
        at, v = found
        raise ManifestError(f"{mpath}: {at[:200]} is out of range (an integer of {len(str(abs(v)))} digits)")


def _source_files(table: dict, mpath: Path) -> dict:
    """The manifest's ``source_files``: role -> {file name -> {"bytes": int, "sha256": 64 hex digits}}."""
    out = {}
    for role, files in table.items():
        if not isinstance(files, dict):
            raise ManifestError(f"{mpath}: source_files[{role!r}] must be an object of files")
        for name, meta in files.items():
            if not (isinstance(meta, dict) and _is(meta.get("bytes"), int) and meta["bytes"] >= 0
                    and isinstance(meta.get("sha256"), str) and re.fullmatch(r"[0-9a-f]{64}", meta["sha256"])):
                raise ManifestError(f"{mpath}: source_files[{role!r}][{name!r}] needs 'bytes' (a count) and "
                                    "'sha256' (64 hex digits)")
        out[str(role)] = {str(n): {"bytes": m["bytes"], "sha256": m["sha256"]} for n, m in files.items()}
    return out


def _rel(root: Path, path: Path) -> str:
    return Path(os.path.relpath(path, Path(root).resolve())).as_posix()


def _report(kind: Any):
    """A field of a report record: None where the manifest does not say."""
    return field(default=None, metadata={"kind": kind})


class _Report:
    """A record of optional fields (older bundles and skipped reports lack some or all): read with
    their kinds checked, written without the absent ones; false when empty."""

    @classmethod
    def from_dict(cls, d: Any, where: str):
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise ManifestError(f"manifest: {where} must be an object, got {d!r}")
        vals = {f.name: _opt(f.metadata["kind"], where, d, f.name) for f in fields(cls)}
        vals = {k: tuple(v) if isinstance(v, list) else dict(v) if isinstance(v, dict) else v
                for k, v in vals.items() if v is not None}
        return cls(**vals)

    def to_dict(self) -> dict:
        vals = {f.name: getattr(self, f.name) for f in fields(self)}
        return {k: list(v) if isinstance(v, tuple) else dict(v) if isinstance(v, dict) else v
                for k, v in vals.items() if v is not None}

    def __bool__(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))


@dataclass(frozen=True)
class Quantization(_Report):
    """How the weights were quantized: MatMulNBits' options (int4, int8) or FP8's format, scales
    and measured error (fp8); empty for float models."""

    block_size: int | None = _report(int)
    symmetric: bool | None = _report(bool)  # int4/int8: without zero points
    accuracy_level: int | None = _report(int)  # MatMulNBits compute type
    quantize_lm_head: bool | None = _report(bool)
    quantize_embeddings: bool | None = _report(bool)
    algorithm: str | None = _report(str)  # rtn | k_quant | gguf | hqq | q4_k
    format: str | None = _report(str)  # fp8: the weights' element type
    scheme: str | None = _report(str)  # fp8: channel | block scales
    matmuls: int | None = _report(int)  # fp8: MatMul weights converted
    lm_head: bool | None = _report(bool)  # fp8: the lm_head converted too
    weight_bytes: int | None = _report(int)  # fp8: bytes of the converted weights and scales
    relative_weight_error: float | None = _report(float)  # fp8: ||dequantized - w|| / ||w||


@dataclass(frozen=True)
class Validation(_Report):
    """The exported graph against torch through edgespec's runtime, at export."""

    max_abs_logit_diff: dict | None = _report("floats")  # phase -> largest |logit difference|
    top1_agreement: float | None = _report(float)
    positions: int | None = _report(int)
    tolerance: float | None = _report(float)  # the precision's |Δlogit| bound; None: judged by top-1
    passed: bool | None = _report(bool)
    # (since session 51) each weight matrix against torch's (export/weights.py): how many were compared, how many the
    # check could not map to a torch parameter, and the worst relative difference ||graph - torch|| / ||torch||
    weights_checked: int | None = _report(int)
    weights_unmapped: int | None = _report(int)
    weight_error: float | None = _report(float)


@dataclass(frozen=True)
class Quality(_Report):
    """The quality report at export (export/quality.py); the drafter's adds its agreement with the target."""

    perplexity_torch: float | None = _report(float)
    perplexity: float | None = _report(float)
    perplexity_delta: float | None = _report(float)
    top1_agreement: float | None = _report(float)
    mean_kl: float | None = _report(float)
    greedy_match_tokens: tuple[int, ...] | None = _report("ints")  # per continuation prompt
    greedy_match_of: int | None = _report(int)
    tokens: int | None = _report(int)  # tokens scored
    greedy_agreement_with_target: float | None = _report(float)
    agreement_tokens: int | None = _report(int)


@dataclass(frozen=True)
class ModelIO:
    input_ids: str
    attention_mask: str
    past_key: str  # with %d for the layer
    past_value: str
    present_key: str
    present_value: str
    logits: str
    position_ids: str | None = None
    # the graph's per-position argmax of the logits (int64 [batch, min(seq, 32)]; cuda-layout targets,
    # added by export/greedy.py): a GPU decoding greedily reads this instead of copying the logits to the host
    argmax: str | None = None
    # the graph's input of how many leading positions of a call get no logits (int64 [1], default 0
    # where not fed; exact-kernels bundles since session 19): a prefill reads its last position's only,
    # and the lm_head then multiplies one row instead of a chunk's 256
    logits_skip: str | None = None
    # the graph's input of each row's position offset (int64 [n], fed at every call: 0..n-1 but where a
    # call verifies alternates; exact-kernels targets since session 26): DecodeAttention's positions
    row_positions: str | None = None
    # the graph's output of each logits row's final-normed hidden state (the lm_head's input; targets exported with a
    # multi-token-prediction assistant, export/mtp.py): the assistant's first draft step reads the row that produced
    # the last token
    hidden: str | None = None
    # a model with convolution layers (LFM2; ``ModelSpec.conv_layers``), each with %d for the layer: the state each
    # conv layer keeps (its last inputs: input and output of every call, [batch, channels, kernel - 1]) and the
    # convolution's input of each of the call's positions ([batch, channels, positions], export/conv.py), from which
    # the runtime sets the state of any accepted prefix of the call after a rejected draft
    past_conv: str | None = None
    present_conv: str | None = None
    conv_input: str | None = None

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "ModelIO":
        names = {k: _req(d, k, str, where) for k in
                 ("input_ids", "attention_mask", "past_key", "past_value", "present_key", "present_value", "logits")}
        for k in ("past_key", "past_value", "present_key", "present_value"):
            _layer_pattern(names[k], f"{where}.{k}")
        # (the optional names: a string, or null or absent where the graph has no such input or output; session 100,
        # a mutation test: another type was read as absent, where every bad field is named)
        pos, top, skip, rows, hid = (_opt(str, where, d, k) for k in ("position_ids", "argmax", "logits_skip",
                                                                       "row_positions", "hidden"))
        conv = {k: _layer_pattern(d[k], f"{where}.{k}") for k in ("past_conv", "present_conv", "conv_input")
                if d.get(k) is not None}
        if conv and len(conv) != 3:
            raise ManifestError(f"manifest: {where} names {', '.join(sorted(conv))} but not all of past_conv, "
                                "present_conv and conv_input")
        return cls(position_ids=pos, argmax=top, logits_skip=skip, row_positions=rows, hidden=hid, **conv, **names)


def _layer_pattern(v, where: str) -> str:
    """``v``, a name with one %d for the layer index (and no other % format), else a ManifestError."""
    try:
        ok = isinstance(v, str) and "%d" in v and v % 0 != v % 1
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise ManifestError(f"manifest: {where} must contain one %d for the layer index (and no other % format), "
                            f"got {v!r}"[:300])
    return v


_DIMS = ("num_layers", "num_kv_heads", "head_dim", "hidden_size", "vocab_size", "max_context")


@dataclass(frozen=True)
class ModelSpec:
    role: str
    path: Path  # absolute path of the .onnx file
    architecture: str
    precision: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    max_context: int
    kv_dtype: str
    io: ModelIO
    tokenizer_sha256: str
    files: dict[str, dict]  # path relative to the bundle -> {"bytes": int, "sha256": str}
    bytes_on_disk: int
    # what the weights take on a GPU provider, which copies every initializer to the device: the
    # bytes on disk (written as 'resident_bytes' before this name)
    gpu_weight_bytes: int
    quant: Quantization = field(default_factory=Quantization)
    validation: Validation = field(default_factory=Validation)
    quality: Quality = field(default_factory=Quality)
    params: int = 0
    num_attention_heads: int | None = None
    operators: dict[str, int] = field(default_factory=dict)  # counts of the operators export reports
    # resident bytes once opened on the CPU EP, measured at export in a fresh process (None in
    # bundles exported before it was recorded); float tables read only by Gather (embeddings),
    # which the CPU EP leaves mapped from the file: a row becomes resident when a token reads it
    cpu_resident_bytes: int | None = None
    embedding_bytes: int = 0
    embedding_row_bytes: int = 0
    layout: str = "cpu"  # LAYOUTS; absent in older bundles: cuda where the KV cache is float16, else cpu
    # a reduced draft vocabulary (export --drafter-vocab): the graph's logits are for these
    # ``head_size`` token ids only (an int32 .npy, sorted, listed in ``files``); None: the full head
    head_ids: Path | None = None
    head_size: int | None = None
    head_source: str | None = None  # how the kept tokens were chosen (export/head.py)
    # "edgespec-q4": the graph's INT4 matrix multiplies are edgespec.MatMulQ4 (edgespec/native), which
    # computes a row the same at every call width; "onnxruntime": the graph uses onnxruntime's ops only
    kernels: str = "onnxruntime"
    # what of edgespec's kernels the graph relies on beyond their first version (KERNEL_FEATURES): a runtime that
    # lacks one refuses the bundle at load, where its library would ignore the node's attribute and compute
    # another thing (onnxruntime passes a custom op's unknown attributes unchecked); () in bundles before session 43
    kernel_features: tuple[str, ...] = ()
    # rows the graph appends to attention's query (a copy of the last one, written to the KV cache
    # one position past the call and overwritten later), so that attention never runs one query row
    attention_pad: int = 0
    # the longest sliding window of the graph's attention layers (Gemma 2's and 3's local layers; 0: none), over a
    # KV cache of the whole context as every other layer's (edgespec info says it)
    attention_window: int = 0
    # what ``edgespec exact-kernels`` measured when it rewrote the graph: both graphs on a sample text
    # (``max_abs_logit_diff``, ``logit_scale``, ``top1_agreement``, ``positions``); None: not rewritten,
    # or rewritten before this was recorded. The validation and quality records stay the source graph's.
    kernels_check: dict | None = None
    # each layer's KV cache ``(kv heads, head size)`` where layers differ (Gemma 4's global layers: wider heads,
    # other head counts); () where every layer's is ``(num_kv_heads, head_dim)``
    kv_layers: tuple[tuple[int, int], ...] = ()
    # each layer's KV buffer: the layer whose cache it is (itself, or an earlier layer whose key and value rows it
    # attends: Gemma 4's shared key-value layers, whose graph writes those very rows into it again); () where each
    # layer has its own. The runtime gives such a layer its source's buffer (E2B: 20 of its 35 layers' caches).
    kv_sources: tuple[int, ...] = ()
    # the convolution layers (LFM2's ``conv``): ``(layer, channels, state length)`` each, their state ``[1, channels,
    # state length]`` (the kernel's last inputs) in place of a KV cache; () where every layer is attention
    conv_layers: tuple[tuple[int, int, int], ...] = ()

    def has_kv(self, layer: int) -> bool:
        """Whether layer ``layer`` keeps a KV cache (every layer but a convolution's)."""
        return not self.conv_layers or all(c[0] != layer for c in self.conv_layers)

    @property
    def conv_state_bytes(self) -> int:
        """The convolution layers' states (kv.ConvStates, float32), per layer: the two buffers a call reads and writes
        (``k`` columns each), the conv inputs kept for rollback (of at most ``CONV_KEEP`` positions and a call), a
        state before each kept call (one a position at worst: one-token decoding) and the buffer a call's inputs are
        written into (``CONV_CALL`` columns; a wider call, a profile's longer prefill chunk, grows it)."""
        return sum(4 * c * (2 * k + CONV_KEEP * (1 + k) + 2 * CONV_CALL) for _, c, k in self.conv_layers)

    def kv_shape(self, layer: int) -> tuple[int, int]:
        """Layer ``layer``'s KV cache ``(kv heads, head size)``."""
        return self.kv_layers[layer] if self.kv_layers else (self.num_kv_heads, self.head_dim)

    def kv_source(self, layer: int) -> int:
        """The layer whose KV buffer layer ``layer`` uses (itself unless it shares an earlier layer's)."""
        return self.kv_sources[layer] if self.kv_sources else layer

    def weight_bytes(self, gpu: bool, context: int) -> int:
        """Memory the weights take at ``context`` tokens: on a GPU provider ``gpu_weight_bytes``
        (every initializer copied to the device); on the CPU EP the footprint measured at export
        plus the embedding rows ``context`` distinct tokens can read (a row plus one page, as a row
        rarely starts on a page boundary)."""
        if gpu or self.cpu_resident_bytes is None:
            return self.gpu_weight_bytes
        rows = min(context, self.vocab_size) * (self.embedding_row_bytes + PAGE) if self.embedding_row_bytes else 0
        return self.cpu_resident_bytes + min(rows, self.embedding_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        per_layer = sum(h * d for i, (h, d) in enumerate(map(self.kv_row, range(self.num_layers)))
                        if self.kv_source(i) == i and self.has_kv(i))  # (a shared layer's buffer is its source's)
        return 2 * per_layer * KV_DTYPES[self.kv_dtype]

    @property
    def kv_head_sizes(self) -> tuple[int, ...]:
        """The head sizes of the layers that keep a KV cache (sorted, each once)."""
        return tuple(sorted({self.kv_shape(i)[1] for i in range(self.num_layers) if self.has_kv(i)}))

    @property
    def heads_take_int8(self) -> bool:
        """Whether every KV cache's head size is a multiple of ``Q8_GROUP`` (int8 rows keep a scale per group)."""
        return not any(w % Q8_GROUP for w in self.kv_head_sizes)

    def kv_row(self, layer: int) -> tuple[int, int]:
        """Layer ``layer``'s KV buffer ``(kv heads, elements a row)``: ``kv_shape``'s, an int8 cache's rows with their
        scales (``kv_row_width``)."""
        heads, width = self.kv_shape(layer)
        return heads, kv_row_width(self.kv_dtype, width)

    def kv_bytes(self, context: int) -> int:
        """The caches at ``context`` tokens: the KV caches and the convolution layers' states."""
        return self.kv_bytes_per_token * context + self.conv_state_bytes

    @classmethod
    def from_dict(cls, d: Any, root: str | os.PathLike, role: str) -> "ModelSpec":
        """The model of manifest entry ``models.<role>``, its paths relative to the bundle directory ``root``."""
        root, where = Path(root), f"models.{role}"
        if not isinstance(d, dict):
            raise ManifestError(f"manifest: {where} must be an object")
        path = _inside(root, _req(d, "path", str, where), f"manifest {where}.path")
        files = _files(root, _req(d, "files", dict, where), where)
        kv_dtype = _req(d, "kv_dtype", str, where)
        if kv_dtype not in KV_DTYPES:
            raise ManifestError(f"manifest: {where}.kv_dtype {kv_dtype!r} is not one of {sorted(KV_DTYPES)}")
        layout = _opt(str, where, d, "layout") or ("cuda" if kv_dtype == "float16" else "cpu")
        if layout not in LAYOUTS:
            raise ManifestError(f"manifest: {where}.layout {layout!r} is not one of {', '.join(LAYOUTS)}")
        precision = _req(d, "precision", str, where)
        if precision not in TARGET_PRECISIONS:  # every precision there is
            raise ManifestError(f"manifest: {where}.precision {precision!r} is not one of "
                                f"{', '.join(TARGET_PRECISIONS)}")
        dims = {k: _req(d, k, int, where) for k in _DIMS}
        pad = _opt_count(d, "attention_pad", where) or 0
        if pad and pad > dims["max_context"] - 2:  # (load made a cache of negative length: an untyped traceback)
            raise ManifestError(f"manifest: {where}.attention_pad {pad} leaves no context of its max_context "
                                f"{dims['max_context']}")
        for k, v in dims.items():
            if v <= 0:
                raise ManifestError(f"manifest: {where}.{k} must be positive, got {v}")
        on_disk = sum(m["bytes"] for m in files.values())
        head_ids, head_size = _head(root, d, files, dims, where)
        gpu = _opt_count(d, "gpu_weight_bytes", where)
        old = _opt_count(d, "resident_bytes", where)  # the same figure, as bundles before 'gpu_weight_bytes' name it
        spec = cls(
            role=role, path=path, architecture=_req(d, "architecture", str, where), precision=precision,
            kv_dtype=kv_dtype, io=ModelIO.from_dict(_req(d, "io", dict, where), f"{where}.io"),
            tokenizer_sha256=_req(d, "tokenizer_sha256", str, where), files={k: dict(v) for k, v in files.items()},
            bytes_on_disk=on_disk, gpu_weight_bytes=gpu if gpu is not None else old if old is not None else on_disk,
            quant=Quantization.from_dict(d.get("quant"), f"{where}.quant"),
            validation=Validation.from_dict(d.get("validation"), f"{where}.validation"),
            quality=Quality.from_dict(d.get("quality"), f"{where}.quality"),
            params=_opt_count(d, "params", where) or 0,
            num_attention_heads=_opt_count(d, "num_attention_heads", where),
            operators=dict(_opt("counts", where, d, "operators") or {}),
            cpu_resident_bytes=_opt_count(d, "cpu_resident_bytes", where),
            embedding_bytes=_opt_count(d, "embedding_bytes", where) or 0,
            embedding_row_bytes=_opt_count(d, "embedding_row_bytes", where) or 0, layout=layout,
            head_ids=head_ids, head_size=head_size, head_source=_opt(str, where, d, "head_source"),
            kernels=_kernels(d, where), kernel_features=_kernel_features(d, where),
            attention_pad=_opt_count(d, "attention_pad", where) or 0,
            attention_window=_opt_count(d, "attention_window", where) or 0,
            kernels_check=_kernels_check(d, where), kv_layers=(kvl := _kv_layers(d, where, dims["num_layers"])),
            kv_sources=_kv_sources(d, where, dims["num_layers"], kvl),
            conv_layers=_conv_layers(d, where, dims["num_layers"]), **dims,
        )
        if kv_dtype == "int8":  # (edgespec's CPU attention over rows of 32-lane groups: nothing else reads them)
            if layout != "cpu" or not spec.heads_take_int8:
                raise ManifestError(f"manifest: {where}.kv_dtype int8 needs the cpu layout and head sizes that are "
                                    f"multiples of {Q8_GROUP} (layout {layout}, head sizes "
                                    f"{list(spec.kv_head_sizes)})")
        return spec

    def to_dict(self, root: str | os.PathLike) -> dict:
        """This model's manifest entry, its paths relative to the bundle directory ``root``."""
        return {
            "path": _rel(root, self.path), "architecture": self.architecture, "precision": self.precision,
            "layout": self.layout,
            "quant": self.quant.to_dict(), "num_layers": self.num_layers, "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "hidden_size": self.hidden_size, "num_attention_heads": self.num_attention_heads,
            "vocab_size": self.vocab_size, "max_context": self.max_context, "kv_dtype": self.kv_dtype,
            "io": {k: v for k, v in asdict(self.io).items()
                   if k not in ("argmax", "logits_skip", "row_positions", "hidden", "past_conv", "present_conv",
                                "conv_input") or v},
            "tokenizer_sha256": self.tokenizer_sha256,
            "files": {k: dict(v) for k, v in self.files.items()}, "gpu_weight_bytes": self.gpu_weight_bytes,
            "params": self.params, "operators": dict(self.operators), "cpu_resident_bytes": self.cpu_resident_bytes,
            "embedding_bytes": self.embedding_bytes, "embedding_row_bytes": self.embedding_row_bytes,
            "validation": self.validation.to_dict(), "quality": self.quality.to_dict(),
            **({"head_ids": _rel(root, self.head_ids), "head_size": self.head_size, "head_source": self.head_source}
               if self.head_ids else {}),
            **({"kernels": self.kernels} if self.kernels != "onnxruntime" else {}),
            **({"kernel_features": list(self.kernel_features)} if self.kernel_features else {}),
            **({"attention_pad": self.attention_pad} if self.attention_pad else {}),
            **({"attention_window": self.attention_window} if self.attention_window else {}),
            **({"kernels_check": dict(self.kernels_check)} if self.kernels_check else {}),
            **({"kv_layers": [list(x) for x in self.kv_layers]} if self.kv_layers else {}),
            **({"kv_sources": list(self.kv_sources)} if self.kv_sources else {}),
            **({"conv_layers": [list(x) for x in self.conv_layers]} if self.conv_layers else {}),
        }

    def load_head_ids(self, vocab: int) -> "np.ndarray | None":
        """The token ids of a reduced head's logits (int64, sorted, each below ``vocab``), or None
        for a full head. The file's size and hash are checked with the bundle's other files."""
        if self.head_ids is None:
            return None
        import numpy as np

        try:
            with open(self.head_ids, "rb") as f:
                ids = np.load(f, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise BundleError(f"the {self.role}'s head ids {self.head_ids.name} are unreadable ({e})"[:300]) from None
        if (ids.ndim != 1 or ids.dtype.kind not in "iu" or ids.shape[0] != self.head_size
                or (ids.shape[0] and (int(ids.min()) < 0 or int(ids.max()) >= vocab))
                or (np.diff(ids.astype(np.int64)) <= 0).any()):
            raise BundleError(f"the {self.role}'s head ids {self.head_ids.name} are not {self.head_size} sorted, "
                              f"unique token ids below {vocab}")
        return ids.astype(np.int64)


KERNELS = ("onnxruntime", "edgespec-q4")


def _kv_sources(d: dict, where: str, layers: int, shapes: tuple) -> tuple[int, ...]:
    """``kv_sources``: per layer, the layer whose KV buffer it uses: itself, or an earlier layer that uses its own
    and whose cache has its shape; or absent."""
    v = d.get("kv_sources")
    if v is None:
        return ()
    ok = isinstance(v, list) and len(v) == layers and all(type(s) is int and 0 <= s <= i for i, s in enumerate(v))
    if ok:
        ok = all(v[s] == s and (not shapes or shapes[s] == shapes[i]) for i, s in enumerate(v))
    if not ok:
        raise ManifestError(f"manifest: {where}.kv_sources must be {layers} layer indices, each the layer itself or "
                            "an earlier one with its own KV cache of the same shape")
    return tuple(v)


# the conv inputs kept for rollback: of the last CONV_KEEP positions (a rejected draft, a chat turn's last tokens
# written again), and the buffer a call's are written into (kv.ConvStates; it grows for a wider call)
CONV_KEEP = 256
CONV_CALL = 512


def _conv_layers(d: dict, where: str, layers: int) -> tuple[tuple[int, int, int], ...]:
    """``conv_layers``: ``[layer, channels, state length]`` of positive integers (layers distinct, in range), or
    absent; the io then names the conv states and inputs."""
    v = d.get("conv_layers")
    if v is None:
        return ()
    ok = isinstance(v, list) and v and all(
        isinstance(x, list) and len(x) == 3 and all(type(n) is int and n >= 0 for n in x) and x[1] > 0 and x[2] > 0
        for x in v)
    if not ok or len({x[0] for x in v}) != len(v) or any(x[0] >= layers for x in v):
        raise ManifestError(f"manifest: {where}.conv_layers must be [layer, channels, state length] triples of "
                            f"integers, each layer once and below {layers}")
    io = d.get("io") if isinstance(d.get("io"), dict) else {}
    if not all(io.get(k) for k in ("past_conv", "present_conv", "conv_input")):
        raise ManifestError(f"manifest: {where} has conv_layers but its io names no past_conv, present_conv and "
                            "conv_input")
    return tuple((int(a), int(b), int(c)) for a, b, c in v)


def _kv_layers(d: dict, where: str, layers: int) -> tuple[tuple[int, int], ...]:
    """``kv_layers``: one ``[kv heads, head size]`` pair of positive integers per layer, or absent."""
    v = d.get("kv_layers")
    if v is None:
        return ()
    ok = isinstance(v, list) and len(v) == layers and all(
        isinstance(x, list) and len(x) == 2 and all(type(n) is int and n > 0 for n in x) for x in v)
    if not ok:
        raise ManifestError(f"manifest: {where}.kv_layers must be {layers} pairs [kv heads, head size] of positive "
                            "integers, one per layer")
    return tuple((int(h), int(s)) for h, s in v)


def _kernels(d: dict, where: str) -> str:
    k = _opt(str, where, d, "kernels") or "onnxruntime"
    if k not in KERNELS:
        raise ManifestError(f"manifest: {where}.kernels {k!r} is not one of {', '.join(KERNELS)}")
    return k


# what this edgespec's kernels compute beyond their first version (export/kernels.py kernel_features names what a
# graph uses): DecodeAttention's sliding window (local_window_size), score cap (softcap), a rotary over part of the
# head (cos and sin narrower than half of it) and an interleaved rotary (rotary_interleaved); session 42's
KERNEL_FEATURES = ("attention-window", "attention-softcap", "attention-partial-rotary", "attention-interleaved-rotary")


def _kernel_features(d: dict, where: str) -> tuple[str, ...]:
    f = _opt(list, where, d, "kernel_features") or []
    if not all(isinstance(x, str) for x in f):
        raise ManifestError(f"manifest: {where}.kernel_features must be a list of strings")
    unknown = sorted(set(f) - set(KERNEL_FEATURES))
    if unknown:
        raise BundleError(f"the bundle's {where.rpartition('.')[2]} needs what this edgespec's kernels do not compute "
                          f"({', '.join(unknown)[:200]}): update edgespec, or export the bundle with this one")
    return tuple(sorted(set(f)))


KERNELS_CHECK = ("max_abs_logit_diff", "logit_scale", "top1_agreement", "positions")


def _kernels_check(d: dict, where: str) -> dict | None:
    c = _opt(dict, where, d, "kernels_check")
    if c is None:
        return None
    out = {}
    for k in KERNELS_CHECK:
        v = c.get(k)
        if not _is(v, float) or not math.isfinite(v) or v < 0:
            raise ManifestError(f"manifest: {where}.kernels_check.{k} must be a finite number >= 0, got {v!r}")
        out[k] = int(v) if k == "positions" else float(v)
    return out


def _head(root: Path, d: dict, files: dict, dims: dict, where: str) -> tuple[Path | None, int | None]:
    """A reduced head's (ids file, size), checked: the file is one the manifest hashes."""
    rel = _opt(str, where, d, "head_ids")
    if rel is None:
        if d.get("head_size") is not None:
            raise ManifestError(f"manifest: {where}.head_size without head_ids")
        return None, None
    size = _req(d, "head_size", int, where)
    if not 0 < size < dims["vocab_size"]:
        raise ManifestError(f"manifest: {where}.head_size must be in 1..{dims['vocab_size'] - 1}, got {size}")
    if rel not in files:
        raise ManifestError(f"manifest: {where}.head_ids {rel!r} is not one of its files (unchecked)")
    return _inside(root, rel, f"manifest {where}.head_ids"), size


@dataclass(frozen=True)
class AssistantSpec:
    """A multi-token-prediction assistant (``models.assistant``: Gemma 4's, export/mtp.py): a graph with no KV cache
    of its own that drafts from the target's state: the target's embedding of the last token and the hidden state
    that produced it, at that token's position, attending the target's caches of the layers ``sources`` names (a
    layer kind -> the target layer). Its inputs and outputs are fixed names (edgespec/mtp.py)."""

    path: Path  # absolute path of the .onnx file
    architecture: str
    precision: str
    hidden_size: int
    target_hidden_size: int
    vocab_size: int
    num_layers: int
    sources: dict  # layer kind ("sliding_attention", "full_attention") -> the target layer whose cache it attends
    sliding_window: int
    files: dict[str, dict]
    bytes_on_disk: int
    params: int = 0
    embedding_bytes: int = 0  # the copy of the target's embedding table: read a row a step (mapped on the CPU)
    ordered: bool = False  # the centroid head (use_ordered_embeddings)
    # the largest difference from transformers' assistant step at export, relative to the logits' scale (None: not
    # recorded)
    validated: float | None = None
    role: str = "assistant"

    @classmethod
    def from_dict(cls, d: Any, root: str | os.PathLike) -> "AssistantSpec":
        where = "models.assistant"
        if not isinstance(d, dict):
            raise ManifestError(f"manifest: {where} must be an object")
        root = Path(root)
        ints = {k: _req(d, k, int, where) for k in ("hidden_size", "target_hidden_size", "vocab_size", "num_layers",
                                                     "sliding_window", "bytes_on_disk")}
        if any(v < 0 for v in ints.values()) or min(ints["hidden_size"], ints["vocab_size"], ints["num_layers"],
                                                     ints["target_hidden_size"]) < 1:
            raise ManifestError(f"manifest: {where}'s sizes must be positive")
        sources = _req(d, "sources", "counts", where)
        if not sources or any(v < 0 for v in sources.values()):
            raise ManifestError(f"manifest: {where}.sources must map a layer kind to a target layer")
        return cls(path=_inside(root, _req(d, "path", str, where), f"manifest {where}.path"),
                   architecture=_req(d, "architecture", str, where), precision=_req(d, "precision", str, where),
                   sources={str(k): int(v) for k, v in sources.items()},
                   files=_files(root, _req(d, "files", dict, where), where),
                   params=_opt_count(d, "params", where) or 0, embedding_bytes=_opt_count(d, "embedding_bytes", where)
                   or 0, ordered=bool(_opt(bool, where, d, "ordered")), validated=_opt(float, where, d, "validated"),
                   **ints)

    def to_dict(self, root: str | os.PathLike) -> dict:
        return {"path": _rel(root, self.path), "architecture": self.architecture, "precision": self.precision,
                "hidden_size": self.hidden_size, "target_hidden_size": self.target_hidden_size,
                "vocab_size": self.vocab_size, "num_layers": self.num_layers, "sources": dict(self.sources),
                "sliding_window": self.sliding_window, "files": {k: dict(v) for k, v in self.files.items()},
                "bytes_on_disk": self.bytes_on_disk, "params": self.params, "embedding_bytes": self.embedding_bytes,
                "ordered": self.ordered, **({"validated": self.validated} if self.validated is not None else {})}

    def weight_bytes(self, gpu: bool) -> int:
        """Memory its weights take: all of them on a GPU; on the CPU the embedding table's copy stays mapped."""
        return self.bytes_on_disk if gpu else max(0, self.bytes_on_disk - self.embedding_bytes)


def check_assistant(target: ModelSpec, a: AssistantSpec) -> None:
    """The assistant fits its target: hidden size and vocabulary, and the layers it attends exist and are their own
    caches (a shared layer's buffer is its source's)."""
    if a.target_hidden_size != target.hidden_size or a.vocab_size != target.vocab_size:
        raise ManifestError(f"manifest: the assistant drafts for a target of hidden size {a.target_hidden_size} and "
                            f"{a.vocab_size} tokens, the target has {target.hidden_size} and {target.vocab_size}")
    for kind, layer in a.sources.items():
        if not 0 <= layer < target.num_layers:
            raise ManifestError(f"manifest: the assistant attends target layer {layer} ({kind}), the target has "
                                f"{target.num_layers}")
        if target.kv_source(layer) != layer:
            raise ManifestError(f"manifest: the assistant attends target layer {layer} ({kind}), which keeps no cache "
                                f"of its own (it shares layer {target.kv_source(layer)}'s)")
    if not target.io.hidden:
        raise ManifestError("manifest: the bundle has an assistant but its target graph has no hidden-state output")


@dataclass(frozen=True)
class Manifest:
    root: Path
    name: str
    target: ModelSpec
    drafter: ModelSpec | None
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    add_bos: bool
    chat_template: str | None
    tokenizer_dir: Path
    tool_versions: dict[str, str] = field(default_factory=dict)  # module -> version, at export
    created: str | None = None  # UTC time of the export, ISO 8601
    sources: dict[str, str] = field(default_factory=dict)  # role -> the model exported, as given
    tokenizer_vocab_size: int | None = None  # the tokenizer's own (a model's vocab_size may be padded)
    # the tokenizer's ids past the target's vocabulary, all special tokens (Gemma 3 1B's <image_soft_token>): never
    # written by the model, refused in a prompt; 0 where there are none
    tokenizer_special_past: int = 0
    tokenizer_files: dict[str, dict] = field(default_factory=dict)  # as ModelSpec.files; {} before they were hashed
    # role -> the source's files as read at export: name -> {"bytes": int, "sha256": str} (a Hugging Face model
    # page lists its weight files' sha256); {} before session 55, or where the source's files were not found
    source_files: dict[str, dict[str, dict]] = field(default_factory=dict)
    assistant: AssistantSpec | None = None  # a multi-token-prediction assistant (Gemma 4's), drafting as ``mtp``
    # the sampling the model's authors recommend (its generation_config.json where it samples, a GGUF file's
    # general.sampling.* keys): option -> value, SAMPLING_KEYS' options only; {} where the source names none
    sampling_defaults: dict[str, float | int] = field(default_factory=dict)

    @property
    def max_context(self) -> int:
        return self.target.max_context

    def relative(self, path: str | os.PathLike) -> str:
        """``path`` (one of the manifest's paths, which are resolved) relative to the bundle directory, also where
        ``root`` was given through a symbolic link (the path relative to ``root`` as given then climbed out of it)."""
        return os.path.relpath(path, os.path.realpath(self.root))

    @classmethod
    def from_dict(cls, raw: Any, root: str | os.PathLike) -> "Manifest":
        """The manifest ``raw`` (parsed JSON) of the bundle directory ``root``; checks the schema
        and that target and drafter share a tokenizer, not the files (``check_files``)."""
        root = Path(root)
        mpath = root / MANIFEST_NAME
        if not isinstance(raw, dict):
            raise ManifestError(f"{mpath}: top level must be an object")
        _check_magnitudes(raw, mpath)
        version = _req(raw, "schema_version", int, "manifest")
        if version != SCHEMA_VERSION:
            raise ManifestError(f"{mpath}: schema_version {version} is not supported (this edgespec reads "
                                f"{SCHEMA_VERSION})")
        models = _req(raw, "models", dict, "manifest")
        if "target" not in models:
            raise ManifestError(f"{mpath}: no target model")
        target = ModelSpec.from_dict(models["target"], root, "target")
        # (null or absent: no drafter; anything else is one, checked: {} or 0 meant "no drafter" silently)
        drafter = ModelSpec.from_dict(models["drafter"], root, "drafter") if models.get("drafter") is not None else None
        eos = raw.get("eos_token_ids") or []
        if not _is(eos, "ints"):
            raise ManifestError(f"{mpath}: eos_token_ids must be a list of integers")
        tok = _req(raw, "tokenizer", dict, "manifest")
        for key, kind in (("name", str), ("bos_token_id", int), ("add_bos", bool), ("chat_template", str),
                          ("created", str), ("tool_versions", dict), ("sources", dict)):
            _opt(kind, "manifest", raw, key)
        m = cls(root=root, name=raw.get("name") or root.name, target=target, drafter=drafter,
                eos_token_ids=tuple(eos), bos_token_id=raw.get("bos_token_id"), add_bos=raw.get("add_bos") or False,
                chat_template=raw.get("chat_template"),
                tokenizer_dir=_inside(root, _req(tok, "dir", str, "manifest.tokenizer"), "manifest tokenizer.dir"),
                tool_versions={str(k): str(v) for k, v in (raw.get("tool_versions") or {}).items()},
                created=raw.get("created"), sources={str(k): str(v) for k, v in (raw.get("sources") or {}).items()},
                tokenizer_vocab_size=_opt_count(tok, "vocab_size", "manifest.tokenizer"),
                tokenizer_special_past=_opt_count(tok, "special_past_vocab", "manifest.tokenizer") or 0,
                tokenizer_files={k: dict(v) for k, v in _files(root, _opt(dict, "manifest.tokenizer", tok, "files")
                                                                or {}, "tokenizer").items()},
                source_files=_source_files(_opt(dict, "manifest", raw, "source_files") or {}, mpath),
                assistant=AssistantSpec.from_dict(models["assistant"], root) if models.get("assistant") is not None
                else None,
                sampling_defaults=check_sampling_defaults(raw["sampling_defaults"], f"{mpath}: sampling_defaults")
                if raw.get("sampling_defaults") is not None else {})
        if drafter is not None:
            check_pair(target, drafter)
        if m.assistant is not None:
            check_assistant(target, m.assistant)
        return m

    def models(self) -> tuple:
        """Every model of the bundle: the target, the drafter and the assistant where there are."""
        return tuple(s for s in (self.target, self.drafter, self.assistant) if s is not None)

    def to_dict(self) -> dict:
        """The manifest as written to ``edgespec.json``, paths relative to ``root``."""
        return {"schema_version": SCHEMA_VERSION, "name": self.name, "created": self.created,
                "sources": dict(self.sources),
                **({"source_files": {r: dict(f) for r, f in self.source_files.items()}} if self.source_files else {}),
                "tool_versions": dict(self.tool_versions),
                "eos_token_ids": list(self.eos_token_ids), "bos_token_id": self.bos_token_id, "add_bos": self.add_bos,
                "chat_template": self.chat_template,
                **({"sampling_defaults": dict(self.sampling_defaults)} if self.sampling_defaults else {}),
                "tokenizer": {"dir": _rel(self.root, self.tokenizer_dir), "vocab_size": self.tokenizer_vocab_size,
                              **({"special_past_vocab": self.tokenizer_special_past}
                                 if self.tokenizer_special_past else {}),
                              **({"files": dict(self.tokenizer_files)} if self.tokenizer_files else {})},
                "models": {s.role: s.to_dict(self.root) for s in self.models()}}


def load_manifest(bundle: str | os.PathLike, check: bool = True, deep: bool = False) -> Manifest:
    root = Path(bundle)
    if not root.exists():
        raise BundleError(f"no such bundle: {root}" + _left_aside(resolved(root)))  # (beside what a link names)
    if not root.is_dir():
        raise BundleError(f"{root} is not a bundle directory")
    mpath = root / MANIFEST_NAME
    if not mpath.is_file():
        if mpath.is_dir():  # (said as missing before: session 65, a review)
            raise BundleError(f"{root} is not an edgespec bundle ({mpath} is a folder, not its manifest)")
        raise BundleError(f"{root} is not an edgespec bundle (no {MANIFEST_NAME}); make one with 'edgespec export'")
    try:
        with open(mpath, "rb") as f:
            data = f.read(_MANIFEST_LIMIT + 1)
        if len(data) > _MANIFEST_LIMIT:
            raise ManifestError(f"{mpath} is larger than {_MANIFEST_LIMIT >> 20} MiB: not a manifest")
        raw = json.loads(data.decode("utf-8"))
    except ValueError as e:  # (not JSON, not UTF-8, an integer of more digits than Python converts)
        raise ManifestError(f"{mpath} is corrupt: {parse_reason(e)}") from None
    except RecursionError:
        raise ManifestError(f"{mpath} is corrupt: nested too deeply") from None
    except OSError as e:
        raise ManifestError(f"cannot read {mpath}: {e.strerror or e}") from None
    m = Manifest.from_dict(raw, root)
    if check:
        check_files(m, deep=deep)
    return m


def _left_aside(root: Path) -> str:
    """A hint where the missing bundle ``root`` has a copy beside it that an export or rewrite stopped between its
    two renames left (``.<name>.old-<pid>``; the next export or rewrite of it puts it back)."""
    try:
        aside = sorted(p.name for p in root.parent.iterdir()
                       if re.fullmatch(rf"\.{re.escape(root.name)}\.old-\d+", p.name))
    except OSError:
        return ""
    return (f" ({aside[-1]} beside it is the bundle as a stopped rewrite left it: rename it back, or run the rewrite "
            "again, which does)") if aside else ""


def write_manifest(m: Manifest) -> Path:
    """Write ``m.to_dict()`` to ``m.root/edgespec.json``, replacing it atomically (``write_whole``)."""
    path = m.root / MANIFEST_NAME
    write_whole(path, json.dumps(m.to_dict(), indent=1, ensure_ascii=False))
    return path


def check_pair(target: ModelSpec, drafter: ModelSpec) -> None:
    a, b = target.tokenizer_sha256, drafter.tokenizer_sha256
    if a != b:
        # (12 digits, or up to the first that differs: two shown alike read as the same tokenizer; session 100)
        n = max(12, len(os.path.commonprefix([a, b])) + 1)
        raise TokenizerMismatchError(f"target and drafter tokenizers differ (sha256 {a[:n]} vs {b[:n]}); a drafter "
                                     "must share the target's tokenizer")
