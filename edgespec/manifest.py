"""The bundle manifest (``edgespec.json``): the only contract between export and runtime."""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import BundleError, ManifestError, TokenizerMismatchError

SCHEMA_VERSION = 1
MANIFEST_NAME = "edgespec.json"
# Files at most this big are hashed on every load; bigger ones (weights) on verify only.
_HASH_ON_LOAD_LIMIT = 16 << 20
KV_DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2}
PAGE = 4096  # bytes of a memory page (x86-64 and aarch64 Linux defaults)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _req(d: dict, key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if key not in d:
        raise ManifestError(f"manifest: {where} lacks '{key}'")
    v = d[key]
    if not isinstance(v, typ) or (typ is int and isinstance(v, bool)):
        raise ManifestError(f"manifest: {where}.{key} has the wrong type ({type(v).__name__})")
    return v


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

    @classmethod
    def from_dict(cls, d: dict, where: str) -> "ModelIO":
        names = {k: _req(d, k, str, where) for k in
                 ("input_ids", "attention_mask", "past_key", "past_value", "present_key", "present_value", "logits")}
        for k in ("past_key", "past_value", "present_key", "present_value"):
            if "%d" not in names[k]:
                raise ManifestError(f"manifest: {where}.{k} must contain %d for the layer index")
        pos = d.get("position_ids")
        return cls(position_ids=pos if isinstance(pos, str) else None, **names)


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
    files: dict[str, dict]
    bytes_on_disk: int
    resident_bytes: int
    quant: dict = field(default_factory=dict)
    validation: dict = field(default_factory=dict)
    quality: dict = field(default_factory=dict)
    params: int = 0
    # resident bytes once opened on the CPU EP, measured at export in a fresh process (None in
    # bundles exported before it was recorded); float tables read only by Gather (embeddings),
    # which the CPU EP leaves mapped from the file: a row becomes resident when a token reads it
    cpu_resident_bytes: int | None = None
    embedding_bytes: int = 0
    embedding_row_bytes: int = 0

    def weight_bytes(self, gpu: bool, context: int) -> int:
        """Memory the weights take at ``context`` tokens: on a GPU provider every initializer is
        copied to the device (the bytes on disk, ``resident_bytes``); on the CPU EP the footprint
        measured at export plus the embedding rows ``context`` distinct tokens can read (a row
        plus one page, as a row rarely starts on a page boundary)."""
        if gpu or self.cpu_resident_bytes is None:
            return self.resident_bytes
        rows = min(context, self.vocab_size) * (self.embedding_row_bytes + PAGE) if self.embedding_row_bytes else 0
        return self.cpu_resident_bytes + min(rows, self.embedding_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * KV_DTYPES[self.kv_dtype]

    def kv_bytes(self, context: int) -> int:
        return self.kv_bytes_per_token * context


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
    tool_versions: dict
    raw: dict

    @property
    def max_context(self) -> int:
        return self.target.max_context


def _opt_count(d: dict, key: str, where: str) -> int | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise ManifestError(f"manifest: {where}.{key} must be a non-negative integer, got {v!r}")
    return v


def _opt_obj(d: dict, key: str, where: str) -> dict:
    v = d.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ManifestError(f"manifest: {where}.{key} must be an object, got {v!r}")
    return dict(v)


def _inside(root: Path, rel: str, where: str) -> Path:
    p = (root / rel).resolve()
    if os.path.commonpath([str(p), str(root.resolve())]) != str(root.resolve()):
        raise BundleError(f"{where}: {rel!r} points outside the bundle directory")
    return p


def _model_spec(root: Path, role: str, d: Any) -> ModelSpec:
    where = f"models.{role}"
    if not isinstance(d, dict):
        raise ManifestError(f"manifest: {where} must be an object")
    rel = _req(d, "path", str, where)
    path = _inside(root, rel, f"manifest {where}.path")
    files = _req(d, "files", dict, where)
    for frel, meta in files.items():
        _inside(root, frel, f"manifest {where}.files")
        if not isinstance(meta, dict) or not isinstance(meta.get("bytes"), int):
            raise ManifestError(f"manifest: {where}.files[{frel!r}] needs 'bytes'")
    kv_dtype = _req(d, "kv_dtype", str, where)
    if kv_dtype not in KV_DTYPES:
        raise ManifestError(f"manifest: {where}.kv_dtype {kv_dtype!r} is not one of {sorted(KV_DTYPES)}")
    ints = {k: _req(d, k, int, where) for k in
            ("num_layers", "num_kv_heads", "head_dim", "hidden_size", "vocab_size", "max_context")}
    for k, v in ints.items():
        if v <= 0:
            raise ManifestError(f"manifest: {where}.{k} must be positive, got {v}")
    return ModelSpec(
        role=role,
        path=path,
        architecture=_req(d, "architecture", str, where),
        precision=_req(d, "precision", str, where),
        kv_dtype=kv_dtype,
        io=ModelIO.from_dict(_req(d, "io", dict, where), f"{where}.io"),
        tokenizer_sha256=_req(d, "tokenizer_sha256", str, where),
        files=files,
        bytes_on_disk=sum(m["bytes"] for m in files.values()),
        resident_bytes=_opt_count(d, "resident_bytes", where) or sum(m["bytes"] for m in files.values()),
        quant=_opt_obj(d, "quant", where),
        validation=_opt_obj(d, "validation", where),
        quality=_opt_obj(d, "quality", where),
        params=_opt_count(d, "params", where) or 0,
        cpu_resident_bytes=_opt_count(d, "cpu_resident_bytes", where),
        embedding_bytes=_opt_count(d, "embedding_bytes", where) or 0,
        embedding_row_bytes=_opt_count(d, "embedding_row_bytes", where) or 0,
        **ints,
    )


def check_files(m: Manifest, deep: bool = False) -> None:
    """Check every file the manifest lists: present, right size, and sha256 (small files always, all when deep)."""
    for spec in (m.target, m.drafter):
        if spec is None:
            continue
        for rel, meta in spec.files.items():
            p = m.root / rel
            if not p.is_file():
                raise BundleError(f"bundle {m.root}: missing file {rel}")
            size = p.stat().st_size
            if size != meta["bytes"]:
                raise BundleError(f"bundle {m.root}: {rel} has {size} bytes, manifest says {meta['bytes']}")
            if "sha256" in meta and (deep or size <= _HASH_ON_LOAD_LIMIT):
                if sha256_file(p) != meta["sha256"]:
                    raise BundleError(f"bundle {m.root}: {rel} does not match its sha256 in the manifest")
    if not (m.tokenizer_dir / "tokenizer.json").is_file():
        raise BundleError(f"bundle {m.root}: missing tokenizer/tokenizer.json")


def load_manifest(bundle: str | os.PathLike, check: bool = True, deep: bool = False) -> Manifest:
    root = Path(bundle)
    if not root.exists():
        raise BundleError(f"no such bundle: {root}")
    if not root.is_dir():
        raise BundleError(f"{root} is not a bundle directory")
    mpath = root / MANIFEST_NAME
    if not mpath.is_file():
        raise BundleError(f"{root} is not an edgespec bundle (no {MANIFEST_NAME}); make one with 'edgespec export'")
    try:
        raw = json.loads(mpath.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ManifestError(f"{mpath} is corrupt: {e}") from None
    if not isinstance(raw, dict):
        raise ManifestError(f"{mpath}: top level must be an object")
    version = _req(raw, "schema_version", int, "manifest")
    if version != SCHEMA_VERSION:
        raise ManifestError(f"{mpath}: schema_version {version} is not supported (this edgespec reads {SCHEMA_VERSION})")
    models = _req(raw, "models", dict, "manifest")
    if "target" not in models:
        raise ManifestError(f"{mpath}: no target model")
    target = _model_spec(root, "target", models["target"])
    drafter = _model_spec(root, "drafter", models["drafter"]) if models.get("drafter") else None
    eos = raw.get("eos_token_ids") or []
    if not isinstance(eos, list) or not all(isinstance(x, int) for x in eos):
        raise ManifestError(f"{mpath}: eos_token_ids must be a list of integers")
    tok = _req(raw, "tokenizer", dict, "manifest")
    m = Manifest(
        root=root,
        name=str(raw.get("name", root.name)),
        target=target,
        drafter=drafter,
        eos_token_ids=tuple(eos),
        bos_token_id=raw.get("bos_token_id"),
        add_bos=bool(raw.get("add_bos", False)),
        chat_template=raw.get("chat_template"),
        tokenizer_dir=_inside(root, _req(tok, "dir", str, "manifest.tokenizer"), "manifest tokenizer.dir"),
        tool_versions=dict(raw.get("tool_versions") or {}),
        raw=raw,
    )
    if drafter is not None:
        check_pair(target, drafter)
    if check:
        check_files(m, deep=deep)
    return m


def check_pair(target: ModelSpec, drafter: ModelSpec) -> None:
    if target.tokenizer_sha256 != drafter.tokenizer_sha256:
        raise TokenizerMismatchError(
            f"target and drafter tokenizers differ (sha256 {target.tokenizer_sha256[:12]} vs "
            f"{drafter.tokenizer_sha256[:12]}); a drafter must share the target's tokenizer"
        )
