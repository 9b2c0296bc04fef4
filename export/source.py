"""Resolve and load a model source: a local HF directory, a .gguf file, or a hub id."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from edgespec.errors import ExportError
from edgespec.tokenizer import tokenizer_fingerprint

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class Source:
    spec: str
    kind: str  # 'hf-dir' | 'gguf' | 'hub'
    path: Path | None

    @property
    def display(self) -> str:
        return str(self.path) if self.path else self.spec

    def from_pretrained_args(self) -> tuple[str, dict]:
        if self.kind == "gguf":
            cached = gguf_cached(self.path)  # its Hugging Face copy from an earlier export (EDGESPEC_GGUF_CACHE)
            if cached is not None:
                return str(cached), {}
            return str(self.path.parent), {"gguf_file": self.path.name}
        if self.kind == "hf-dir":
            return str(self.path), {}
        # offline by the environment: the hub's cache alone, even where huggingface_hub was imported before
        # the variable was set (it reads it once; a process that set it later retried the hub for ~50 s)
        return self.spec, ({"local_files_only": True} if hub_offline() else {})


GGUF_CACHE_ENV = "EDGESPEC_GGUF_CACHE"
_DIGESTS: dict = {}


def gguf_cache_entry(path: Path) -> Path | None:
    """Where the float32 Hugging Face copy of a GGUF file (its model and tokenizer, what transformers reads
    out of the file: ~40 s for SmolLM2-135M, minutes for a 1.5B) is kept between exports, under the folder
    ``EDGESPEC_GGUF_CACHE`` names, by the file's sha256 (None: no cache asked for)."""
    root = os.environ.get(GGUF_CACHE_ENV, "").strip()
    if not root:
        return None
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    digest = _DIGESTS.get(key)
    if digest is None:
        import hashlib

        with open(path, "rb") as f:
            digest = _DIGESTS[key] = hashlib.file_digest(f, "sha256").hexdigest()
    return Path(root).expanduser() / f"gguf-{digest[:32]}"


def gguf_cached(path: Path) -> Path | None:
    """The complete cached copy of a GGUF file, or None (also for one this process found unreadable)."""
    entry = gguf_cache_entry(path)
    ok = entry is not None and entry not in _UNREADABLE and (entry / "COMPLETE").is_file()
    return entry if ok else None


# cache entries this process could not read back (``_unreadable_copy``): not read again, whether or not they could
# be deleted, until an export keeps a fresh copy there
_UNREADABLE: set = set()


def keep_gguf_copy(path: Path, hf_dir: Path, log=None) -> None:
    """Keep ``hf_dir`` (the copy an export wrote of ``path``) as its cached copy, if a cache is asked for
    and it has none: copied beside the entry, then renamed into place (a second export at the same time
    finds it complete or absent). A cache that cannot be written is said and skipped."""
    import shutil
    import tempfile

    entry = gguf_cache_entry(path)
    if entry is None or gguf_cached(path) is not None:
        return
    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=entry.name + ".", dir=entry.parent))
        shutil.copytree(hf_dir, tmp, dirs_exist_ok=True)
        (tmp / "COMPLETE").write_text(str(path) + "\n")
        if entry.exists():  # an incomplete entry left by an interrupted copy, or one that could not be read back
            shutil.rmtree(entry)
        tmp.rename(entry)
        _UNREADABLE.discard(entry)
    except OSError as e:
        if log is not None:
            log(f"    warning: cannot keep the GGUF's Hugging Face copy in {entry.parent} ({e.strerror or e})")
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def drop_gguf_copy(path: Path) -> Path | None:
    """Delete the cached copy of the GGUF file ``path`` (one that could not be read back: damaged after it was
    kept); its COMPLETE marker first, so that no export that has not looked yet reads it. Returns the entry, or
    None where there was none; OSError where it cannot be deleted. (An export of the same file already building
    from the copy, in another process, then fails with a missing file: the copy was damaged anyway.)"""
    import shutil

    entry = gguf_cache_entry(path)
    if entry is None or not entry.exists():
        return None
    (entry / "COMPLETE").unlink(missing_ok=True)
    shutil.rmtree(entry)
    return entry


# what a failed load of a kept copy says of the machine, not of the copy: raised as they are
_NOT_DAMAGE = (MemoryError, ImportError, RecursionError)


def _unreadable_copy(src: Source, name: str, e: Exception) -> bool:
    """Whether ``name``, which failed to load with ``e``, was the cached copy of ``src``'s GGUF file: then it is
    said, deleted where it can be, never read again by this process (``_UNREADABLE``), and the caller reads the
    file itself (a damaged cache loses nothing but time). Not for an error of the machine (``_NOT_DAMAGE``)."""
    if src.kind != "gguf" or isinstance(e, _NOT_DAMAGE):
        return False
    cached = gguf_cached(src.path)
    if cached is None or str(cached) != name:
        return False
    import sys

    _UNREADABLE.add(cached)
    try:
        drop_gguf_copy(src.path)
        done = "deleted"
    except OSError as d:
        done = f"not deleted ({d.strerror or d})"
    why = _first_line(e)
    print(f"    warning: the kept Hugging Face copy of {src.path.name} in {cached} cannot be read ({why[:160]}); "
          f"{done}; reading the GGUF file itself", file=sys.stderr, flush=True)
    return True


def hub_offline() -> bool:
    """Whether the environment says the hub is not to be asked (HF_HUB_OFFLINE)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def resolve(spec: str) -> Source:
    p = Path(spec).expanduser()
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise ExportError(f"{p} is a file but not a .gguf model; give a .gguf file or a model directory")
        with open(p, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ExportError(f"{p} is not a GGUF file (bad magic)")
        return Source(spec, "gguf", p.resolve())
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.is_file():
            ggufs = sorted(p.glob("*.gguf"))
            hint = f" (it holds {ggufs[0].name}: pass that file)" if ggufs else ""
            raise ExportError(f"{p} is not a Hugging Face model directory: no config.json{hint}")
        try:
            json.loads(cfg.read_text())
        except json.JSONDecodeError as e:
            raise ExportError(f"{cfg} is not valid JSON: {e}") from None
        return Source(spec, "hf-dir", p.resolve())
    if _HUB_ID.match(spec) and not spec.startswith((".", "/", "~")):
        return Source(spec, "hub", None)
    raise ExportError(f"no such model: {spec} (not a file, a directory, or a hub id like org/name)")


def _first_line(e: BaseException, empty: str | None = None) -> str:
    """An exception's message's first line; where it has none, ``empty`` (None: its type's name)."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__ if empty is None else empty


def _hub_error(src: Source, e: Exception) -> ExportError:
    msg = _first_line(e)
    status = getattr(getattr(e, "response", None), "status_code", None)
    if type(e).__name__ in ("RepositoryNotFoundError", "GatedRepoError") or status in (401, 403, 404):
        why = "no such model on the hub, or it is private or gated (log in with `hf auth login`)"
    else:
        why = "no network here?"
    return ExportError(f"cannot fetch {src.spec} from the Hugging Face hub ({why}): {msg[:200]}")


def _check_hub(src: Source) -> None:
    """A hub id not in the local cache: one quick request says whether the hub can serve it, so that
    a machine without network (or a wrong id) gets one line at once, not a minute of retries."""
    import logging

    if hub_offline():
        return
    from huggingface_hub import HfApi, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(src.spec, "config.json"), str):
        return  # fetched before: from_pretrained reads the cache
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    try:
        HfApi().model_info(src.spec, timeout=10)
    except Exception as e:  # noqa: BLE001 -- connection errors, 401/404 (a private or wrong id), ...
        raise _hub_error(src, e) from None


def load_tokenizer(src: Source):
    """The HF fast tokenizer of a source, and its (sha256, vocab size) fingerprint."""
    from transformers import AutoTokenizer

    if src.kind == "hub":
        _check_hub(src)
    name, kw = src.from_pretrained_args()
    try:
        tok = AutoTokenizer.from_pretrained(name, **kw)
    except Exception as e:  # transformers raises many types for unreadable inputs
        if _unreadable_copy(src, name, e):
            return load_tokenizer(src)
        if isinstance(e, OSError) and src.kind != "hub":
            raise ExportError(f"cannot load the tokenizer of {src.display}: {_first_line(e)}") from None
        if src.kind == "hub":
            raise _hub_error(src, e) from None
        why = _first_line(e, "")
        kind = type(e).__name__
        if kind == "error":  # (struct.error, which a truncated .gguf raises: not a second "error:" after the CLI's)
            kind = f"{type(e).__module__.lstrip('_')}.error"
        raise ExportError(f"cannot load the tokenizer of {src.display}: {kind}: {why}"[:300]) from None
    if not getattr(tok, "is_fast", False):
        raise ExportError(f"{src.display}: only fast (tokenizers) tokenizers are supported")
    data = json.loads(tok.backend_tokenizer.to_str())
    return tok, data, tokenizer_fingerprint(data)


def _gguf_config(path: Path, name: str, kw: dict) -> dict:
    """``{"config": ...}`` where transformers' reading of a GGUF file's config misses what the file says: its
    attention heads' size (``{arch}.attention.key_length``), which transformers leaves at the config class's
    default (Qwen3's 128: a Qwen3 whose heads are not 128 wide then fails to load, "size mismatch"); {} where
    nothing needs mending or the file's fields cannot be read (transformers then says what it says)."""
    from transformers import AutoConfig

    try:
        import gguf
        from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

        fields = gguf.GGUFReader(str(path)).fields
        arch = fields["general.architecture"].contents()
        if "attention.key_length" in GGUF_CONFIG_MAPPING.get(arch, {}):  # transformers reads it (Gemma 4: as the
            return {}                                                      # global layers' global_head_dim)
        key = fields.get(f"{arch}.attention.key_length")
        head = int(key.contents()) if key is not None else None
    except Exception:  # noqa: BLE001 - transformers reads the file next and says what is wrong with it
        return {}
    config = AutoConfig.from_pretrained(name, **kw)
    if head and getattr(config, "head_dim", None) not in (None, head):
        config.head_dim = head
        return {"config": config}
    return {}


def load_model(src: Source, dtype: str = "float32"):
    import torch
    from transformers import AutoModelForCausalLM

    name, kw = src.from_pretrained_args()
    try:
        if "gguf_file" in kw:
            kw = {**kw, **_gguf_config(src.path, name, kw)}
        model = AutoModelForCausalLM.from_pretrained(name, dtype=getattr(torch, dtype), **kw)
    except Exception as e:  # (a damaged safetensors file raises safetensors' own error type)
        if _unreadable_copy(src, name, e):
            return load_model(src, dtype)
        if src.kind == "hub" and isinstance(e, (OSError, ValueError, KeyError, RuntimeError)):
            raise _hub_error(src, e) from None
        if isinstance(e, OSError):
            raise ExportError(f"cannot load {src.display}: {_first_line(e)}") from None
        why = _first_line(e, "")
        raise ExportError(f"cannot load {src.display}: {type(e).__name__}: {why}"[:300]) from None
    model.eval()
    # A GGUF-loaded model is dequantized already; let it be saved as plain safetensors.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        try:
            del model.config.quantization_config
        except AttributeError:
            pass
    model.is_quantized = False if hasattr(model, "is_quantized") else None
    return model
