"""Resolve and load a model source: a local HF directory, a .gguf file, or a hub id."""
from __future__ import annotations

import json
import math
import os
import re
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from edgespec.errors import ExportError, parse_reason
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
            return str(gguf_alone(self.path)), {"gguf_file": self.path.name}
        if self.kind == "hf-dir":
            return str(self.path), {}
        # offline by the environment: the hub's cache alone, even where huggingface_hub was imported before
        # the variable was set (it reads it once; a process that set it later retried the hub for ~50 s)
        return self.spec, ({"local_files_only": True} if hub_offline() else {})


_ALONE: dict = {}  # a GGUF file's resolved path -> its private folder (removed at exit)
_ALONE_LOCK = threading.Lock()


def gguf_alone(path: Path) -> Path:
    """A private folder holding only a link to the GGUF file ``path``, where transformers reads it from: read from
    the file's own folder, its tokenizer came from a ``tokenizer.json`` / ``tokenizer_config.json`` beside it,
    another model's maybe (transformers prefers them to the file's own vocabulary), and the export went on with
    that tokenizer, exit 0 (session 54, a review). One folder a file, for the process."""
    import atexit
    import shutil
    import tempfile

    real = path.resolve()
    with _ALONE_LOCK:
        d = _ALONE.get(real)
        if d is None or not (d / path.name).exists():
            d = _ALONE[real] = Path(tempfile.mkdtemp(prefix="edgespec-gguf-"))
            (d / path.name).symlink_to(real)
            atexit.register(shutil.rmtree, d, True)
        return d


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
    """The complete cached copy of a GGUF file, or None (also for one this process found unreadable). A copy whose
    files are not the ones its COMPLETE marker records (their sha256: altered after it was kept, yet still loadable,
    a layer's weights zeroed), or that other transformers or gguf versions wrote (their reading of the file may
    differ), is an unreadable one: said on one line, deleted, and the GGUF file read instead (``_drop_copy``)."""
    entry = gguf_cache_entry(path)
    if entry is None or entry in _UNREADABLE or not (entry / "COMPLETE").is_file():
        return None
    try:
        why = _copy_mismatch(entry)
    except _Unchecked as e:  # (session 73, a review) an error of the moment deleted a good copy, another export's
        _say_copy(path, entry, f"cannot be checked now ({e})")  # reading it maybe: now the copy stays for the next
        return None
    if why is not None:
        _drop_copy(path, entry, why)
        return None
    return entry


class _Unchecked(OSError):
    """A kept copy that an error of the machine, not of the copy, kept from being checked against its record."""


# cache entries this process could not read back (``_unreadable_copy``): not read again, whether or not they could
# be deleted, until an export keeps a fresh copy there
_UNREADABLE: set = set()
# cache entries this process checked against their records: entry -> its files' (name, size, mtime) when checked,
# so that the export's several looks at its copy hash it once. Hashing costs ~0.6 s of CPU a GB plus reading it (a
# 1.5B's 6 GB copy: some seconds), paid by every export that reuses a copy: the price of not building a bundle from a
# copy altered since it was kept (against minutes to read the GGUF again)
_VERIFIED: dict = {}


def _copy_versions() -> dict:
    """The versions of what reads a GGUF file into the copy (transformers' reading of it, through gguf)."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for dist in ("transformers", "gguf"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def _copy_files(entry: Path) -> list[Path]:
    """The files of a kept copy (or of one being written), its COMPLETE marker aside."""
    return sorted(f for f in entry.rglob("*") if f.is_file() and f != entry / "COMPLETE")


def _copy_stats(entry: Path) -> tuple:
    return tuple((f.relative_to(entry).as_posix(), f.stat().st_size, f.stat().st_mtime_ns)
                 for f in [entry / "COMPLETE", *_copy_files(entry)])


def _copy_record(path: Path, entry: Path) -> str:
    """The COMPLETE marker of the copy of ``path`` written at ``entry``: the file it is of, the sha256 of each of its
    files, and the versions that wrote it."""
    import hashlib

    files = {}
    for f in _copy_files(entry):
        with open(f, "rb") as h:
            files[f.relative_to(entry).as_posix()] = hashlib.file_digest(h, "sha256").hexdigest()
    return json.dumps({"gguf": str(path), "sha256": files, "versions": _copy_versions()}, indent=1) + "\n"


def _copy_mismatch(entry: Path) -> str | None:
    """Why the copy at ``entry`` is not the one its COMPLETE marker records (None: it is)."""
    import hashlib

    try:
        stats = _copy_stats(entry)
        if _VERIFIED.get(entry) == stats:
            return None
        try:
            record = json.loads((entry / "COMPLETE").read_text())
            files, versions = dict(record["sha256"]), dict(record["versions"])
        except (ValueError, KeyError, TypeError):
            return "its record of its files is unreadable, or an older edgespec kept it without one"
        now = _copy_versions()
        if versions != now:
            was = ", ".join(f"{k} {v}" for k, v in sorted(versions.items()))
            return f"written by {was}, not this {', '.join(f'{k} {v}' for k, v in sorted(now.items()))}"
        have = {f.relative_to(entry).as_posix(): f for f in _copy_files(entry)}
        for name in sorted(set(files) | set(have)):
            if name not in have:
                return f"{name} is missing"
            if name not in files:
                return f"{name} was added after it was kept"
            with open(have[name], "rb") as h:
                if hashlib.file_digest(h, "sha256").hexdigest() != files[name]:
                    return f"{name} changed after it was kept: its sha256 is not the one recorded"
    except FileNotFoundError as e:  # (deleted meanwhile by another export that found it damaged)
        return f"{e.strerror or e}"
    except OSError as e:  # (the machine's: too many open files, an I/O error) unchecked, so not used; not deleted
        raise _Unchecked(f"{e.strerror or e}") from None
    _VERIFIED[entry] = stats
    return None


def _drop_copy(path: Path, entry: Path, why: str) -> None:
    """Say on one line that the kept copy ``entry`` of the GGUF file ``path`` cannot be used (``why``), delete it
    where it can be, and never read it again in this process (``_UNREADABLE``): the caller reads the file itself."""
    _UNREADABLE.add(entry)
    _VERIFIED.pop(entry, None)
    try:
        drop_gguf_copy(entry)
        done = "deleted"
    except OSError as d:
        done = f"not deleted ({d.strerror or d})"
    _say_copy(path, entry, f"cannot be used ({why[:160]}); {done}")


def _say_copy(path: Path, entry: Path, what: str) -> None:
    """The one line that says why the kept copy ``entry`` of ``path`` is not read (``what``): the file is."""
    import sys

    print(f"    warning: the kept Hugging Face copy of {path.name} in {entry} {what}; reading the GGUF file itself",
          file=sys.stderr, flush=True)


def keep_gguf_copy(path: Path, hf_dir: Path, log=None) -> None:
    """Keep ``hf_dir`` (the copy an export wrote of ``path``) as its cached copy, if a cache is asked for
    and it has none: copied beside the entry (``gguf-<digest>.<pid>-<random>``), its files' sha256 recorded in its
    COMPLETE marker, then renamed into place (a second export at the same time finds it complete or absent). A
    cache that cannot be written is said and skipped. Stopped on the way (Ctrl-C, SIGTERM), the temporary folder
    is removed; one that a killed export left (its process gone) is removed once a copy is kept."""
    import shutil
    import tempfile

    entry = gguf_cache_entry(path)
    if entry is None or gguf_cached(path) is not None:
        return
    tmp = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{entry.name}.{os.getpid()}-", dir=entry.parent))
        shutil.copytree(hf_dir, tmp, dirs_exist_ok=True)
        (tmp / "COMPLETE").write_text(_copy_record(path, tmp))
        if gguf_cached(path) is not None:  # another export of the file kept its copy meanwhile: that one stays
            return  # (deleting it would pull it from under an export reading it now)
        if entry.exists():  # an incomplete entry left by an interrupted copy, or one that could not be read back
            shutil.rmtree(entry)
        tmp.rename(entry)
        tmp = None
        _UNREADABLE.discard(entry)
        _VERIFIED[entry] = _copy_stats(entry)
        _remove_stale_copies(entry)
    except OSError as e:
        if log is not None:
            log(f"    warning: cannot keep the GGUF's Hugging Face copy in {entry.parent} ({e.strerror or e})")
    finally:  # (any exception: a KeyboardInterrupt in the copy left the folder before)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _remove_stale_copies(entry: Path) -> None:
    """Remove the temporary folders of ``entry`` (``gguf-<digest>.<pid>-<random>``) whose export is no longer
    running, and those without a process id (an older edgespec named them so)."""
    import shutil

    from .output import _alive

    tagged = re.compile(rf"{re.escape(entry.name)}\.(\d+)-[^/]*")
    for p in entry.parent.glob(f"{entry.name}.*"):
        m = tagged.fullmatch(p.name)
        if m and (int(m.group(1)) == os.getpid() or _alive(int(m.group(1)))):
            continue  # (another export of the same file writing its copy now)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)


def drop_gguf_copy(entry: Path) -> None:
    """Delete the kept copy at ``entry`` (one that could not be read back: damaged after it was kept); its COMPLETE
    marker first, so that no export that has not looked yet reads it; OSError where it cannot be deleted. The entry
    checked, not one worked out again from the GGUF file (session 88: a file removed or rewritten meanwhile left the
    damaged copy, said "not deleted" for the file's sake, or deleted another). (An export of the same file already
    building from the copy, in another process, then fails with a missing file: the copy was damaged anyway.)"""
    import shutil

    if not entry.exists():
        return
    (entry / "COMPLETE").unlink(missing_ok=True)
    shutil.rmtree(entry)


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
    _drop_copy(src.path, cached, _first_line(e))
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
        except (ValueError, RecursionError) as e:  # (not JSON or not UTF-8; an integer too long; nested too deeply)
            raise ExportError(f"{cfg} is not valid JSON: {parse_reason(e)}") from None
        return Source(spec, "hf-dir", p.resolve())
    if _HUB_ID.match(spec) and not spec.startswith((".", "/", "~")):
        return Source(spec, "hub", None)
    raise ExportError(f"no such model: {spec} (not a file, a directory, or a hub id like org/name)")


def source_files(src: Source, log=None) -> dict[str, dict]:
    """The files of ``src`` as the export read them, for the manifest: name -> {"bytes", "sha256"} (a Hugging Face
    model page lists its weight files' sha256, so a bundle says which checkpoint it came from). A .gguf: that file;
    a model directory: the top-level files the export reads (``_read_by_export``; links followed: a hub cache's
    snapshot is links to blobs); a hub id: its snapshot in the local cache, where one is found ({} where not)."""
    from edgespec.integrity import sha256_file

    if src.kind == "gguf":
        files = [src.path]
    else:
        folder = src.path
        if src.kind == "hub":
            try:
                from huggingface_hub import snapshot_download

                folder = Path(snapshot_download(src.spec, local_files_only=True))
            except Exception:  # (not cached as a snapshot, an old huggingface_hub: nothing to record)
                return {}
        files = sorted(f for f in folder.iterdir() if _read_by_export(f, folder))
    out = {}
    for f in files:
        try:
            out[f.name] = {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
        except OSError as e:  # (a file the export did not need, unreadable: left out of the record, said)
            if log is not None:
                log(f"note: {f} is not in the manifest's source_files: cannot read it ({e.strerror or e})")
    return out


def _read_by_export(f: Path, folder: Path) -> bool:
    """Whether the export reads ``f`` of a model folder: its JSON (config, generation config, tokenizer, the
    weights' index), chat templates, tokenizer files, and its weights as transformers picks them: the safetensors files where it
    has any, else pytorch_model*.bin. Not a training run's optimizer.pt or training_args.bin, nor another format's
    copy of the weights (a folder can hold 13.5 GB of .bin beside its .safetensors; session 55, the diff's review)."""
    name = f.name
    if name.startswith(".") or not f.is_file():
        return False
    if name.endswith((".json", ".jinja")) or name in ("tokenizer.model", "merges.txt", "vocab.txt", "spiece.model") \
            or name.endswith(".tiktoken"):
        return True
    if name.endswith(".safetensors"):
        return True
    return name.startswith("pytorch_model") and name.endswith(".bin") and not any(folder.glob("*.safetensors"))


def _first_line(e: BaseException, empty: str | None = None) -> str:
    """An exception's message's first line, and the next one where the first only introduces it (ends in a colon:
    transformers' config validation errors, "Class validation error for validator 'validate_layer_type':", gave
    their reason on the second; session 54, a review); where it has none, ``empty`` (None: its type's name)."""
    text = str(e).strip()
    if not text:
        return type(e).__name__ if empty is None else empty
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]


def _hub_error(src: Source, e: Exception) -> ExportError:
    msg = _first_line(e)
    status = getattr(getattr(e, "response", None), "status_code", None)
    if type(e).__name__ in ("RepositoryNotFoundError", "GatedRepoError") or status in (401, 403, 404):
        why = "no such model on the hub, or it is private or gated (log in with `hf auth login`)"
    elif hub_offline():  # (HF_HUB_OFFLINE=1: nothing is asked of the network; a model not in the cache is missing)
        why = "offline mode is set (HF_HUB_OFFLINE) and the model is not in the local cache"
    else:
        why = "no network here?"
    # (a mistyped local path such as models/typo looks like a hub id: say it is no local path either)
    local = f"; there is no local file or directory {src.spec} either"
    return ExportError(f"cannot fetch {src.spec} from the Hugging Face hub ({why}): {msg[:200]}{local}")


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


# the GGUF readers of the reads in progress (``gguf_reads_once``), by the file's identity; dropped when the last ends
_READERS: dict = {}
_SCOPES = [0]  # gguf_reads_once scopes open in this process
_ORIGINAL: list = []  # gguf's own GGUFReader and get_tensor_name_map while a scope is open
_PATCH = threading.Lock()
_PLAIN_CLASSES: dict = {}  # gguf reader class -> its subclass over a plain view (_plain_reader)


def _plain_reader(real_reader, path, mode: str):
    """``real_reader(path, mode)`` over a plain ndarray view of its memory map: gguf's reader slices its ``np.memmap``
    once or twice for every token and merge of a vocabulary, and each slice of a memmap subclass runs numpy's
    Python-level ``__array_finalize__``; a Qwen GGUF's reader (151,936 tokens, 151,387 merges) took 6.2 s to build,
    ~1.7 s over the view (session 57), with the same fields and tensors. A subclass of the reader class whose
    ``data`` takes the view (nothing global is patched); the view keeps the map alive (its base) and is read-only as
    the map is. Another mode, or a reader that is no gguf reader class, is built as it is."""
    import gguf.gguf_reader as gr
    import numpy as np

    if mode != "r" or not (isinstance(real_reader, type) and issubclass(real_reader, gr.GGUFReader)):
        return real_reader(path, mode)
    with _PATCH:
        cls = _PLAIN_CLASSES.get(real_reader)
        if cls is None:
            class Plain(real_reader):
                @property
                def data(self):
                    return self.__dict__["data"]

                @data.setter
                def data(self, v):
                    self.__dict__["data"] = v.view(np.ndarray) if isinstance(v, np.memmap) else v

            cls = _PLAIN_CLASSES.setdefault(real_reader, Plain)
    return cls(path, mode)


@contextmanager
def gguf_reads_once(gguf_file: bool = True):
    """Within, transformers' reads of a GGUF file share one ``gguf.GGUFReader`` of it and one tensor-name map a
    model: it parses the file's metadata anew for the tokenizer, the config and the weights (~9 s each for
    SmolLM2-135M's 49,152-token vocabulary, on session 53's Zen 3) and builds gguf's name map anew for each of the
    model's ~400 modules (~23 ms each): a SmolLM2 GGUF's model took 39.6 s to read after its tokenizer. An export
    holds one scope over its reads (``load_tokenizer`` and ``load_model`` open their own within it); the readers
    (memory-mapped, read-only) are dropped when the outermost scope ends. A file is known by its device, inode, size
    and times: one replaced or rewritten meanwhile is read anew. Nothing is changed where ``gguf_file`` is false."""
    if not gguf_file:
        yield
        return
    import functools

    import gguf

    with _PATCH:
        _SCOPES[0] += 1
        if _SCOPES[0] == 1:
            real_reader, real_map = gguf.GGUFReader, gguf.get_tensor_name_map

            def shared(path, mode="r"):
                if mode != "r":
                    return real_reader(path, mode)
                st = os.stat(path)
                key = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                with _PATCH:
                    reader = _READERS.get(key)
                if reader is None:
                    reader = _plain_reader(real_reader, path, mode)
                    with _PATCH:
                        reader = _READERS.setdefault(key, reader)
                return reader

            _ORIGINAL[:] = [real_reader, real_map]
            gguf.GGUFReader, gguf.get_tensor_name_map = shared, functools.lru_cache(maxsize=None)(real_map)
    try:
        yield
    finally:
        with _PATCH:
            _SCOPES[0] -= 1
            if _SCOPES[0] == 0:
                gguf.GGUFReader, gguf.get_tensor_name_map = _ORIGINAL
                _ORIGINAL.clear()
                _READERS.clear()


def load_tokenizer(src: Source):
    """The HF fast tokenizer of a source, and its (sha256, vocab size) fingerprint."""
    from transformers import AutoTokenizer

    if src.kind == "hub":
        _check_hub(src)
    name, kw = src.from_pretrained_args()
    try:
        with gguf_reads_once("gguf_file" in kw):
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
    if src.kind == "hf-dir":  # (a GGUF's or a hub model's vocabulary is checked once its model is read: bundle.py)
        try:
            cfg = json.loads((src.path / "config.json").read_text())
            vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
        except (OSError, ValueError, AttributeError):
            vocab = None
        check_vocabulary(tok, vocab, src)
    data = json.loads(tok.backend_tokenizer.to_str())
    return tok, data, tokenizer_fingerprint(data)


def _used_past(tok, vocab_size: int) -> str:
    """A special token at or past ``vocab_size`` that the tokenizer uses (its bos, eos, pad or unk token, or one its
    chat template writes), named; "" where none is: such ids are never written (Gemma 3 1B's <image_soft_token>)."""
    added = tok.backend_tokenizer.get_added_tokens_decoder()
    template = tok.chat_template if isinstance(getattr(tok, "chat_template", None), str) else ""
    roles = {getattr(tok, f"{r}_token_id", None): r for r in ("bos", "eos", "pad", "unk")}
    for i in range(vocab_size, len(tok)):
        text = added[i].content if i in added else ""
        if i in roles:
            return f"its {roles[i]} token {text!r} (id {i})"
        if text and text in template:
            return f"{text!r} (id {i}) in its chat template"
    return ""


# the files a Hugging Face directory's tokenizer is read from (one of them at least)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def check_vocabulary(tok, vocab_size, src: Source, target: bool = False) -> None:
    """ExportError where the tokenizer has far fewer tokens than the model's vocabulary (``vocab_size``: its
    config's; under half of it): transformers 5 makes a one-token tokenizer of a directory without tokenizer files,
    with which the whole build ran, then the validation failed on an empty prompt (a traceback). A model's
    vocabulary padded past its tokenizer's (Qwen2.5's 151,936 rows for 151,665 tokens) is no such case. A target's
    tokenizer with more ids than its model's vocabulary is refused too (``target``): the runtime refuses such a
    bundle (transformers 5.2-5.5 read SmolLM2's GGUF tokenizer with 5 more ids than its 49,152, and the export
    wrote a bundle no edgespec would load); not where every id past it is a special token (Gemma 3 1B's and 270M's
    ``<image_soft_token>``: the model never writes it, a prompt holding it is refused at run time)."""
    from edgespec.tokenizer import special_ids_past

    if not isinstance(vocab_size, int) or isinstance(vocab_size, bool):
        return
    if target and len(tok) > vocab_size and special_ids_past(tok.backend_tokenizer, vocab_size) is not None:
        used = _used_past(tok, vocab_size)
        if used:
            raise ExportError(f"the tokenizer of {src.display} uses {used} past its model's vocabulary of "
                              f"{vocab_size:,}: the model has no row for it; not this model's tokenizer")
    elif target and len(tok) > vocab_size:
        raise ExportError(f"the tokenizer of {src.display} has {len(tok):,} ids, more than its model's vocabulary of "
                          f"{vocab_size:,} (its config's vocab_size): ids past it have no logits (transformers "
                          "5.2-5.5 read some GGUF tokenizers so: upgrade transformers)")
    if len(tok) >= vocab_size / 2:
        return
    none = src.kind == "hf-dir" and not any((src.path / f).is_file() for f in TOKENIZER_FILES)
    why = f": no tokenizer files ({', '.join(TOKENIZER_FILES)})" if none else ""
    raise ExportError(f"the tokenizer of {src.display} has {len(tok):,} token{'s' * (len(tok) != 1)} for a model of "
                      f"{vocab_size:,} (its config's vocab_size){why}; give the model with its own tokenizer")


ZERO_BIASES = "_edgespec_zero_biases"  # (_gguf_config's key for biases the file lacks and its model is zero at)


def _gguf_config(path: Path, name: str, kw: dict) -> dict:
    """``{"config": ...}`` where transformers' reading of a GGUF file's config misses what the file says: its
    attention heads' size (``{arch}.attention.key_length``), which transformers leaves at the config class's
    default (Qwen3's 128: a Qwen3 whose heads are not 128 wide then fails to load, "size mismatch"), and its rotary
    scaling (``{arch}.rope.scaling.*``, which transformers reads for no family but GPT-OSS: a DeepSeek-Coder GGUF's
    linear factor 4 or a Qwen2.5 GGUF's YaRN was exported unscaled, another model, which the rotary check compared
    with transformers' equally unscaled one), Llama 3's scaling (llama.cpp writes it as a ``rope_freqs.weight``
    tensor, which transformers leaves out: Llama 3.1/3.2 GGUFs were exported unscaled; session 56, a review) and a
    partial rotary's width (``{arch}.rope.dimension_count``, which transformers drops for Phi-3: a Phi-4-mini-style
    GGUF was exported rotating whole heads) and LongRoPE's factors (``rope_factors_long/short.weight``, which
    transformers leaves out too: refused until session 57); ExportError for a scaling edgespec cannot keep; {} where
    nothing needs mending or the file's fields cannot be read (transformers then says what it says)."""
    from transformers import AutoConfig

    try:
        import gguf
        from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

        reader = gguf.GGUFReader(str(path))
        fields = reader.fields
        arch = fields["general.architecture"].contents()

        def value(key):
            f = fields.get(f"{arch}.{key}")
            return f.contents() if f is not None else None

        mapped = GGUF_CONFIG_MAPPING.get(arch, {})
        # (transformers reads key_length for Gemma 4: as the global layers' global_head_dim)
        head = None if "attention.key_length" in mapped else value("attention.key_length")
        scaling = None if arch == "gpt_oss" or "rope.scaling.type" in mapped else value("rope.scaling.type")
        rope = {"factor": value("rope.scaling.factor"),
                "original_max_position_embeddings": value("rope.scaling.original_context_length"),
                "beta_fast": value("rope.scaling.yarn_beta_fast"), "beta_slow": value("rope.scaling.yarn_beta_slow")}
        # the rotary's width where transformers drops it (Phi-3's `rope.dimension_count`: Phi-4-mini rotates 0.75
        # of each head), against each head's width
        rotary = None if mapped.get("rope.dimension_count") else value("rope.dimension_count")
        width, heads = value("attention.key_length"), value("attention.head_count")
        if not width and isinstance(heads, int) and heads > 0 and isinstance(value("embedding_length"), int):
            width = value("embedding_length") // heads
        theta = value("rope.freq_base")
        # rotary tensors, which transformers' GGUF reading leaves out (it maps no `rope_*` tensor): Llama 3's scaling
        # (`rope_freqs.weight`, a divisor per frequency), LongRoPE's factors (`rope_factors_long/short.weight`)
        names = {t.name for t in reader.tensors}
        tensors = {t.name: t for t in reader.tensors if t.name.startswith("rope_")}
        freqs = tensors.get("rope_freqs.weight")
        # what llama.cpp's converter writes and transformers' reading of these families drops (session 56, a review;
        # each checked against llama.cpp's own logits on the file): the family's own mends, applied to the config
        mends = _family_mends(arch, value, names, path.name)
        freqs = [float(x) for x in freqs.data.reshape(-1)] if freqs is not None else None
        # LongRoPE's (Phi-3.5-mini, Phi-4-mini): llama.cpp's converter writes the factors as these two tensors, the
        # original context as rope.scaling.original_context_length and the attention factor as
        # rope.scaling.attn_factor (no rope.scaling.type)
        longrope = {k: [float(x) for x in tensors[f"rope_factors_{k}.weight"].data.reshape(-1)]
                    for k in ("long", "short") if f"rope_factors_{k}.weight" in tensors}
        longrope = {k: v for k, v in longrope.items() if v}  # (ollama writes empty tables for a 4k Phi-3)
        attn_factor = value("rope.scaling.attn_factor")
    except ExportError:
        raise
    except Exception:  # noqa: BLE001 - transformers reads the file next and says what is wrong with it
        return {}
    other = sorted(n for n in tensors if n not in ("rope_freqs.weight", "rope_factors_long.weight",
                                                   "rope_factors_short.weight"))
    if other:
        raise ExportError(f"{path.name} holds rotary tensors edgespec does not know ({', '.join(other)}), which "
                          "transformers' GGUF reading leaves out: export the model's Hugging Face folder instead")
    if longrope and (len(longrope) < 2 or len(longrope["long"]) != len(longrope["short"])
                     or not rope["original_max_position_embeddings"]):
        raise ExportError(f"{path.name} holds LongRoPE's rotary factors without both tables of one length and the "
                          f"original context ({arch}.rope.scaling.original_context_length): export the model's Hugging "
                          "Face folder instead")
    scaling = str(scaling or "none").lower()
    if scaling in ("longrope", "su") and longrope:  # (llama.cpp's base converter writes the type; Phi-3's does not)
        scaling = "none"
    if scaling not in ("none", "linear", "yarn"):
        raise ExportError(f"{path.name} scales its rotary by {scaling!r} ({arch}.rope.scaling.type), which transformers' "
                          "GGUF reading does not keep: export the model's Hugging Face folder instead")
    ways = [w for w, on in ((f"{arch}.rope.scaling.type {scaling!r}", scaling != "none"),
                            ("a rope_freqs.weight tensor", freqs is not None),
                            ("LongRoPE factor tensors", bool(longrope))) if on]
    if len(ways) > 1:
        raise ExportError(f"{path.name} scales its rotary twice ({' and '.join(ways)}): export the model's Hugging "
                          "Face folder instead")
    partial = isinstance(rotary, int) and isinstance(width, int) and 0 < rotary <= width  # (the file's width given)
    # Phi-3's original context where the file says it (Phi-4 14B: 16,384) and transformers keeps Phi3Config's 4,096:
    # the builder took a context other than the original's for LongRoPE's class (a review, session 57)
    original = rope["original_max_position_embeddings"] if arch == "phi3" else None
    if (not head and scaling == "none" and freqs is None and not longrope and not partial and not mends
            and not original):
        return {}
    config = AutoConfig.from_pretrained(name, **kw)
    changed = False
    if isinstance(original, int) and original > 0 and getattr(config, "original_max_position_embeddings",
                                                               original) != original:
        config.original_max_position_embeddings = original
        changed = True
    zero = mends.pop("zero_biases", ())
    for field, want in mends.items():
        if field == "sliding_rope_theta":
            params = dict(getattr(config, "rope_parameters", None) or {})
            local = params.get("sliding_attention")
            if isinstance(local, dict) and local.get("rope_theta") != want:
                params["sliding_attention"] = {**local, "rope_theta": want}
                config.rope_parameters = params
                changed = True
        elif getattr(config, field, None) != want:
            setattr(config, field, want)
            changed = True
    if head and getattr(config, "head_dim", None) not in (None, int(head)):
        config.head_dim = int(head)
        changed = True
    if partial:  # (a class default that is not the file's: Phi-3's 1.0 where Phi-4-mini rotates 0.75 of a head)
        params = dict(getattr(config, "rope_parameters", None) or {})
        if _per_layer_type(params):
            if rotary < width:
                raise ExportError(f"{path.name} rotates {rotary} of each head's {width} lanes and its model keeps "
                                  "rotary parameters per layer type: export the model's Hugging Face folder instead")
        elif int(width * float(params.get("partial_rotary_factor", 1.0))) != rotary:
            params["partial_rotary_factor"] = rotary / width
            config.rope_parameters = params
            config.partial_rotary_factor = rotary / width  # (the builder reads the attribute)
            changed = True

    def one_rotary(what: str) -> tuple[dict, int, float]:
        """The config's rotary parameters where one set serves every layer (else ExportError: the scaling ``what``
        cannot say which), the rotary's width in lanes, and its base."""
        params = dict(getattr(config, "rope_parameters", None) or {})
        if _per_layer_type(params):
            raise ExportError(f"{path.name} scales its rotary ({what}) and its model keeps rotary parameters per layer "
                              "type: export the model's Hugging Face folder instead")
        dim = rotary if partial else int(width * float(params.get("partial_rotary_factor", 1.0))) if width else 0
        return params, dim, float(theta or params.get("rope_theta") or 10000.0)

    if freqs is not None:
        params, dim, base = one_rotary("rope_freqs.weight")
        got = llama3_rope(freqs, base, dim)
        if got is None:
            raise ExportError(f"{path.name} scales its rotary by a rope_freqs.weight tensor that is not Llama 3's "
                              "scaling: export the model's Hugging Face folder instead")
        if got:
            params.update(got, rope_type="llama3", rope_theta=base)
            config.rope_parameters = params
            changed = True
    if longrope:
        params, dim, base = one_rotary("LongRoPE")
        if 2 * len(longrope["long"]) != dim:
            raise ExportError(f"{path.name}'s LongRoPE factor tensors hold {len(longrope['long'])} factors for a "
                              f"rotary of {dim} lanes (one a pair of lanes): export the model's Hugging Face folder "
                              "instead")
        orig = int(rope["original_max_position_embeddings"])
        params.update(rope_type="longrope", long_factor=longrope["long"], short_factor=longrope["short"],
                      original_max_position_embeddings=orig, rope_theta=base)
        params.pop("factor", None)  # (transformers' default: the context's length over the original's)
        # the file's attention factor where it is not transformers' default (llama.cpp's converter computes the
        # same formula)
        scale = int(getattr(config, "max_position_embeddings", orig) or orig) / orig
        default = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0
        params.pop("attention_factor", None)
        if isinstance(attn_factor, (int, float)) and attn_factor > 0 and abs(float(attn_factor) - default) > 1e-6:
            params["attention_factor"] = float(attn_factor)
        config.rope_parameters = params
        config.original_max_position_embeddings = orig
        changed = True
    if scaling != "none":
        if not rope["factor"] or float(rope["factor"]) <= 0:
            raise ExportError(f"{path.name} scales its rotary ({scaling}) without a factor ({arch}.rope.scaling.factor)")
        # (llama.cpp's attn_factor multiplies YaRN's own scaling, where transformers' attention_factor replaces it:
        # not carried over)
        keep = {"linear": ("factor",), "yarn": ("factor", "original_max_position_embeddings", "beta_fast",
                                                "beta_slow")}[scaling]
        got = {k: (int(rope[k]) if k == "original_max_position_embeddings" else float(rope[k]))
               for k in keep if rope[k] not in (None, 0)}
        params = dict(getattr(config, "rope_parameters", None) or {})
        if isinstance(params.get("full_attention"), dict):  # (per layer type, Gemma 3's: llama.cpp's scaling is the
            params["full_attention"] = {**params["full_attention"], **got, "rope_type": scaling}  # global layers')
        elif _per_layer_type(params):
            raise ExportError(f"{path.name} scales its rotary ({scaling}) and its model keeps rotary parameters per "
                              f"layer type ({', '.join(params)}): which layers the scaling is for is not known")
        else:
            params.update(got, rope_type=scaling)
        config.rope_parameters = params
        changed = True
    return ({"config": config} if changed or zero else {}) | ({ZERO_BIASES: tuple(zero)} if zero else {})


def _per_layer_type(params: dict) -> bool:
    """Whether transformers keeps these rotary parameters per layer type (Gemma 3's ``full_attention`` and
    ``sliding_attention``), not one set for every layer."""
    return any(isinstance(v, dict) for v in params.values())


def _family_mends(arch: str, value, names: set, file: str = "the file") -> dict:
    """Config fields a GGUF of ``arch`` sets (``value(key)``: its ``{arch}.key`` metadata; ``names``: its tensors)
    that transformers' GGUF reading leaves at the class's defaults: Gemma 2's and 3's attention scale (llama.cpp
    scales by 1/sqrt(embedding_length / head_count) at the 27B's layer count, 46 and 62, else by the head's width;
    transformers by its default 256: the 27Bs' heads are 128 wide), Gemma 2's score caps and Gemma 3's final cap and
    local layers' rotary base, a Llama-architecture file's biases (a "llamafied" Qwen's: the tensors were skipped,
    the model built without them). ``sliding_rope_theta``: the sliding layers' rope_theta; ``zero_biases``: the
    model's parameters (name suffixes) the file lacks and its model adds nothing for (a q/k/v-only bias file's output
    bias, any projection's bias a file with others lacks: zero, as llama.cpp runs it)."""
    out: dict = {}
    if arch in ("gemma2", "gemma3"):
        layers, width, heads, key = (value(k) for k in ("block_count", "embedding_length", "attention.head_count",
                                                         "attention.key_length"))
        if all(isinstance(x, int) and x > 0 for x in (layers, width, heads)):
            big = layers == (46 if arch == "gemma2" else 62)
            scalar = width // heads if big else key
            if isinstance(scalar, int) and scalar > 0:
                out["query_pre_attn_scalar"] = scalar
    if arch == "gemma2":
        for f, default in (("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0)):
            v = value(f)
            out[f] = float(v) if isinstance(v, (int, float)) and v > 0 else default  # (llama.cpp's defaults)
    if arch == "gemma3":
        v = value("final_logit_softcapping")
        out["final_logit_softcapping"] = float(v) if isinstance(v, (int, float)) and v > 0 else None
        v = value("rope.freq_base_swa")
        out["sliding_rope_theta"] = float(v) if isinstance(v, (int, float)) and v > 0 else 10000.0
    if arch == "llama":  # (transformers' Llama takes biases on all of a block's projections or none)
        hf = {"attn_q": "self_attn.q_proj.bias", "attn_k": "self_attn.k_proj.bias", "attn_v": "self_attn.v_proj.bias",
              "attn_output": "self_attn.o_proj.bias", "ffn_gate": "mlp.gate_proj.bias", "ffn_up": "mlp.up_proj.bias",
              "ffn_down": "mlp.down_proj.bias"}
        zero: list = []
        for field, parts in (("attention_bias", ("attn_q", "attn_k", "attn_v", "attn_output")),
                             ("mlp_bias", ("ffn_gate", "ffn_up", "ffn_down"))):
            have = [p for p in parts if f"blk.0.{p}.bias" in names]
            if have:  # (llama.cpp adds each bias the file has: an absent one adds nothing, a zero bias here. A
                # llamafied Qwen2 has q, k and v only; refused in session 56, zero since session 57)
                out[field] = True
                zero += [hf[p] for p in parts if p not in have]
        if zero:
            out["zero_biases"] = tuple(zero)
    return out


def llama3_factors(theta: float, dim: int, factor: float, low: float, high: float, original: int) -> list[float]:
    """The divisor of each rotary frequency under Llama 3's scaling, as llama.cpp's converter writes them into a
    GGUF's ``rope_freqs.weight`` (and transformers' ``llama3`` rotary divides its frequencies)."""
    import math

    out = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * theta ** (i / dim)
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


def llama3_rope(freqs: list[float], theta: float, dim: int) -> dict | None:
    """transformers' ``llama3`` rotary parameters whose divisors are ``freqs`` (a GGUF's ``rope_freqs.weight``, one
    per frequency of a ``dim``-wide rotary); {} where every divisor is 1 (no scaling); None where no parameters give
    them. The divisors fix the model; parameters that give the same divisors give the same rotary: the factor is
    the largest divisor, and the low-frequency factor, high-frequency factor and original context are found among
    the values Llama 3's checkpoints and powers of two take (a tensor they do not reproduce is refused, not guessed)."""
    if dim <= 0 or len(freqs) != dim // 2 or any(not (f > 0) for f in freqs):
        return None
    if all(abs(f - 1.0) < 1e-6 for f in freqs):
        return {}
    factor = max(freqs)

    def close(a, b):
        return all(abs(x - y) <= 1e-4 * max(1.0, abs(y)) for x, y in zip(a, b))

    for low in (1.0, 2.0, 0.5):
        for original in (8192, *(2 ** k for k in range(4, 22) if 2 ** k != 8192)):
            for high in (4.0, 2.0, 8.0, 16.0, 1.5, 3.0):
                if high <= low:
                    continue
                if close(llama3_factors(theta, dim, factor, low, high, original), freqs):
                    return {"factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                            "original_max_position_embeddings": original}
    return None


# image-text checkpoints whose text decoder the builder builds and transformers maps to no causal LM (Gemma 3's it maps)
IMAGE_TEXT_DECODERS = frozenset({"mistral3"})
IMAGE_TEXT_CONFIG_KEYS = ("gguf_file", "revision", "trust_remote_code", "local_files_only", "cache_dir", "token",
                          "subfolder")


def _from_pretrained(auto, name, **kw):
    """``auto.from_pretrained``; a vision-language checkpoint whose config transformers maps to no causal LM
    (Mistral 3's and Ministral 3's ``Mistral3ForConditionalGeneration``) loads as the image-text model it is: given
    token ids alone it is its text decoder, the part the builder exports (its ``...ForConditionalGeneration`` class)."""
    try:
        return auto.from_pretrained(name, **kw)
    except ValueError as e:
        if "Unrecognized configuration class" not in str(e):
            raise
        from transformers import AutoConfig, AutoModelForImageTextToText

        cfg = AutoConfig.from_pretrained(name, **{k: v for k, v in kw.items() if k in IMAGE_TEXT_CONFIG_KEYS})
        if getattr(cfg, "model_type", None) not in IMAGE_TEXT_DECODERS:  # (another image-text model: the builder
            raise  # builds no text decoder of it; refused here, not after a float32 load and a build)
        return AutoModelForImageTextToText.from_pretrained(name, **kw)


def load_model(src: Source, dtype: str = "float32", log=None):
    import torch
    from transformers import AutoModelForCausalLM

    name, kw = src.from_pretrained_args()
    try:
        with gguf_reads_once("gguf_file" in kw):
            zero: tuple = ()
            if "gguf_file" in kw:
                kw = {**kw, **_gguf_config(src.path, name, kw)}
                zero = kw.pop(ZERO_BIASES, ())
            model, info = _from_pretrained(AutoModelForCausalLM, name, dtype=getattr(torch, dtype),
                                           output_loading_info=True, **kw)
    except ExportError:  # (_gguf_config's: said as it is)
        raise
    except Exception as e:  # (a damaged safetensors file raises safetensors' own error type)
        if _unreadable_copy(src, name, e):
            return load_model(src, dtype, log)
        if src.kind == "hub" and isinstance(e, (OSError, ValueError, KeyError, RuntimeError)):
            raise _hub_error(src, e) from None
        if isinstance(e, OSError):
            raise ExportError(f"cannot load {src.display}: {_first_line(e)}") from None
        why = _first_line(e, "")
        raise ExportError(f"cannot load {src.display}: {type(e).__name__}: {why}"[:300]) from None
    # weights the model has and the checkpoint lacks (a GGUF without blk.0.ffn_down.weight, a safetensors file
    # without a key): transformers fills them with random values and says so in a report; an int4 export of such a
    # model passed its validation (top-1 0.63 against 0.6), since torch computed with the same random weights. A
    # tied lm_head (SmolLM2's) is no missing weight: transformers ties it and leaves it out of missing_keys
    missing = sorted(info.get("missing_keys") or ())
    if zero:  # (biases the file lacks where its model adds none: zero, and no missing weight)
        params = dict(model.named_parameters())
        with torch.no_grad():
            for k in [k for k in missing if k.endswith(zero)]:
                params[k].zero_()
                missing.remove(k)
    if missing:
        names = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise ExportError(f"cannot load {src.display}: {len(missing)} of its model's weights are not in it ({names}); "
                          "transformers would fill them with random values")
    # weights the checkpoint has and the model its config describes does not use (a config.json edited to fewer
    # layers than its safetensors hold): transformers leaves them out silently, and the export is of a smaller model
    # that validates against itself. Said, not refused (a model cut to its first layers can be a drafter); old
    # checkpoints' rotary inv_freq buffers are no weights
    unused = sorted(k for k in info.get("unexpected_keys") or () if not k.endswith("rotary_emb.inv_freq"))
    if unused and log is not None:
        names = ", ".join(unused[:3]) + (f" and {len(unused) - 3} more" if len(unused) > 3 else "")
        log(f"note: {len(unused)} weights of {src.display} are not in the model its config describes ({names}): "
            "the export leaves them out")
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
