"""What a bundle's files are checked against at load, and when (README "What is checked when").

Every load: each file the manifest lists (model graphs, weights, tokenizer files) is present, inside
the bundle (a symlink out is refused) and of the recorded size; files up to ``HASH_ON_LOAD_LIMIT``
are hashed (sha256) every time; bigger ones (weights) are hashed the first time this machine loads
them and again whenever their stamp changes -- size, mtime, ctime, inode and device, kept in
``$EDGESPEC_CACHE_DIR/verified/`` (default ``~/.cache/edgespec``) after a hash that matched --
and on every ``load(verify=True)`` / ``info --verify``. A graph's external-data locations must name
files inside the bundle. Bundles that predate tokenizer hashes have their tokenizer.json checked
against the models' tokenizer fingerprint instead (stamped the same way), and every bundle's
tokenizer ids (vocabulary, bos, eos) must fit the graph's vocabulary.
"""
from __future__ import annotations

import hashlib
import json
import mmap
import os
from pathlib import Path

from .errors import BundleError

HASH_ON_LOAD_LIMIT = 16 << 20  # files at most this big are hashed on every load
_LOCATION = b"\n\x08location\x12"  # protobuf: StringStringEntryProto key "location", then the value


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def cache_root() -> Path:
    """``$EDGESPEC_CACHE_DIR`` (default ``~/.cache/edgespec``): what edgespec learned on this machine
    (verified files, placement verdicts, drafting memory)."""
    if os.environ.get("EDGESPEC_CACHE_DIR"):
        return Path(os.environ["EDGESPEC_CACHE_DIR"])
    try:
        return Path.home() / ".cache" / "edgespec"
    except RuntimeError:  # (no $HOME and a user without a passwd entry: a container's numeric uid)
        from .errors import ConfigError

        raise ConfigError("edgespec keeps what it learns in ~/.cache/edgespec, and this user has no home directory: "
                          "set EDGESPEC_CACHE_DIR (or HOME)") from None


def stat_stamp(st: os.stat_result) -> list[int]:
    """What says a file is unchanged without reading it: size, mtime, ctime, inode and device."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def read_json_cache(path: Path) -> dict:
    """A cache file's dict; {} when it is missing, unreadable, over 1 MiB or not a JSON object."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(1 << 20))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError, RecursionError):
        return {}


def write_whole(path: Path, text: str) -> None:
    """``text`` into ``path`` whole or not at all (a temporary file renamed over it): a full disk or an interrupt
    leaves what was there as it was, and no temporary file beside it; an OSError names ``path``."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):  # (named by the file it was for, not the temporary one)
            raise OSError(e.errno, f"cannot write {path}: {e.strerror or e}") from None
        raise


def write_json_cache(path: Path, data: dict) -> str | None:
    """Atomically, best effort: an unwritable cache only means learning it again next time. Returns why it
    could not be written (None: written)."""
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(data), encoding="utf-8")
        tmp.replace(path)
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)  # (a replace refused left it behind)
        except OSError:
            pass
        return e.strerror or str(e)
    return None


_UNSAVED: set[Path] = set()  # stamp files already said to be unwritable (said once a process)


class Stamps:
    """Files of one bundle verified before on this machine, by stat stamp (best effort: an
    unwritable cache only means hashing again next time)."""

    def __init__(self, root: Path):
        key = hashlib.sha256(str(root.resolve()).encode("utf-8", "surrogateescape")).hexdigest()[:24]
        self.path = cache_root() / "verified" / f"{key}.json"
        self.data = read_json_cache(self.path)
        self.changed = False

    def valid(self, rel: str, what: str, st: os.stat_result) -> bool:
        return self.data.get(rel) == [what] + stat_stamp(st)

    def record(self, rel: str, what: str, st: os.stat_result) -> None:
        self.data[rel] = [what] + stat_stamp(st)
        self.changed = True

    def save(self) -> None:
        if not self.changed:
            return
        why = write_json_cache(self.path, self.data)
        if why and self.path not in _UNSAVED:  # every load would hash the large files again, silently
            _UNSAVED.add(self.path)
            import warnings

            warnings.warn(f"cannot record the verified files in {self.path.parent} ({why}): this bundle's large "
                          "files are hashed again on every load (set EDGESPEC_CACHE_DIR to a writable directory)",
                          stacklevel=2)


def _inside(root: Path, p: Path) -> bool:
    real, top = os.path.realpath(p), os.path.realpath(root)
    return os.path.commonpath([real, top]) == top


def _check_file(root: Path, rel: str, meta: dict, deep: bool, stamps: Stamps) -> None:
    p = root / rel
    if not _inside(root, p):
        raise BundleError(f"bundle {root}: {rel} points outside the bundle directory")
    if not p.is_file():
        raise BundleError(f"bundle {root}: missing file {rel}")
    st = p.stat()
    if st.st_size != meta["bytes"]:
        raise BundleError(f"bundle {root}: {rel} has {st.st_size} bytes, manifest says {meta['bytes']}")
    want = meta.get("sha256")
    if not want:
        return
    if not deep and st.st_size > HASH_ON_LOAD_LIMIT and stamps.valid(rel, want, st):
        return
    if sha256_file(p) != want:
        raise BundleError(f"bundle {root}: {rel} does not match its sha256 in the manifest (the file was "
                          "altered or damaged; export the bundle again)")
    if st.st_size > HASH_ON_LOAD_LIMIT:
        stamps.record(rel, want, st)


def external_locations(model_path: Path) -> list[str]:
    """The external-data file names an ONNX graph refers to (read from the protobuf bytes)."""
    out: set[str] = set()
    with open(model_path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return []
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            i = mm.find(_LOCATION)
            while i != -1:
                j, n, shift = i + len(_LOCATION), 0, 0
                while j < len(mm) and shift < 35:  # the value's length, a varint
                    b = mm[j]
                    n |= (b & 0x7F) << shift
                    j, shift = j + 1, shift + 7
                    if not b & 0x80:
                        break
                out.add(mm[j: j + min(n, 4096)].decode("utf-8", "replace"))
                i = mm.find(_LOCATION, j)
    return sorted(out)


def _check_tokenizer(m, deep: bool, stamps: Stamps) -> None:
    from .tokenizer import tokenizer_fingerprint

    tj = m.tokenizer_dir / "tokenizer.json"
    if not _inside(m.root, tj):
        raise BundleError(f"bundle {m.root}: tokenizer/tokenizer.json points outside the bundle directory")
    if not tj.is_file():
        raise BundleError(f"bundle {m.root}: missing tokenizer/tokenizer.json")
    for rel, meta in m.tokenizer_files.items():
        _check_file(m.root, rel, meta, deep, stamps)
    vocab = m.tokenizer_vocab_size
    listed = {os.path.normpath(k) for k in m.tokenizer_files}
    # a bundle from before tokenizer hashes (or one whose table leaves tokenizer.json out: it went unchecked then):
    # its fingerprint, once per change
    if os.path.normpath(m.relative(tj)) not in listed:
        st, want = tj.stat(), m.target.tokenizer_sha256
        if deep or not stamps.valid("tokenizer.json#fingerprint", want, st):
            try:
                fp, vocab = tokenizer_fingerprint(tj)
            except (ValueError, UnicodeDecodeError, RecursionError, AttributeError, TypeError, KeyError) as e:
                raise BundleError(f"bundle {m.root}: tokenizer/tokenizer.json is unreadable ({e})"[:300]) from None
            if fp != want:
                raise BundleError(f"bundle {m.root}: tokenizer/tokenizer.json is not the tokenizer the models were "
                                  f"exported with (fingerprint {fp[:12]}, manifest {want[:12]})")
            stamps.record("tokenizer.json#fingerprint", want, st)
    for spec in (m.target, m.drafter):
        if spec is None:
            continue
        # (the target's only: a drafter reads ids past its own vocabulary as 0, drafters.ModelDrafter)
        # (special tokens past the vocabulary, the export found: Gemma 3 1B's <image_soft_token>)
        if vocab is not None and vocab - m.tokenizer_special_past > spec.vocab_size and spec.role == "target":
            raise BundleError(f"bundle {m.root}: the tokenizer has {vocab} ids but the {spec.role} graph's "
                              f"vocabulary has {spec.vocab_size}")
        for name, i in [("bos_token_id", m.bos_token_id)] + [("eos_token_ids", e) for e in m.eos_token_ids]:
            if i is not None and not 0 <= i < spec.vocab_size:
                raise BundleError(f"bundle {m.root}: {name} {i} is outside the {spec.role}'s vocabulary "
                                  f"(0..{spec.vocab_size - 1})")


def check_files(m, deep: bool = False) -> None:
    """Check the bundle's files against manifest ``m`` (module docstring: what, and when)."""
    stamps = Stamps(m.root)
    try:
        for spec in m.models():
            for rel, meta in spec.files.items():
                _check_file(m.root, rel, meta, deep, stamps)
            listed = {os.path.normpath(rel) for rel in spec.files}
            graph = m.relative(spec.path)
            if os.path.normpath(graph) not in listed:  # (an edited manifest: its size and hash would go unchecked)
                raise BundleError(f"bundle {m.root}: the {spec.role} graph {graph!r} is not among the manifest's "
                                  "files, so it cannot be checked; re-export the bundle")
            if spec.path.is_file():
                for loc in external_locations(spec.path):
                    target = spec.path.parent / loc
                    if os.path.isabs(loc) or not _inside(m.root, target):
                        raise BundleError(f"bundle {m.root}: the {spec.role} graph's external data {loc!r} "
                                          "points outside the bundle directory")
                    if os.path.normpath(m.relative(target)) not in listed:
                        raise BundleError(f"bundle {m.root}: the {spec.role} graph's external data {loc!r} is not "
                                          "among the manifest's files, so it cannot be checked; re-export the bundle")
        _check_tokenizer(m, deep, stamps)
    except OSError as e:  # (a file this user cannot read, an I/O error: a BundleError as an unreadable manifest is one)
        raise BundleError(f"bundle {m.root}: cannot read {e.filename or 'a file'}: {e.strerror or e}") from None
    finally:
        stamps.save()
