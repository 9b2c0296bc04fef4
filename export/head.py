"""A reduced draft vocabulary: the drafter's lm_head cut to N tokens (EAGLE-3, FR-Spec).

The drafter's last matmul computes a logit for every token of the vocabulary (151,936 rows for
Qwen2.5, 87 MiB of the 0.5B drafter's INT4 weights and one of its largest kernels per step). Most
tokens are rarely generated; a head over the N most frequent ones is cheaper per step and loses
only drafts that would have proposed a token outside the kept set. The target is untouched and
verifies every token, so the output stays exact; under sampling the drafter's q is the reduced
head's softmax, zero outside the kept set, which is what the draft was really sampled from (the
rejection rule stays exact with any q that is).

Which tokens (``select_head_ids``): every added/special token of the tokenizer (the chat template's
markers, eos, bos, fill-in-the-middle markers), then the ids a ``ranked`` list gives (e.g. token
frequencies on some corpus), then the rest in id order. For a byte-level BPE such as Qwen's, ids are
in merge order and merge order follows the frequency of the pair in the tokenizer's training
corpus, so the first ids are the most frequent tokens: a frequency proxy with no corpus at hand
(docs/bench/draft-vocab/README.md measures how much of the target's output it covers).

``reduce_head`` rewrites one exported drafter graph: the node computing the logits (MatMulNBits for
int4/int8: the rows of B, scales, zero points and bias of the kept tokens, attribute N; MatMul for
float: the kept columns of the weight; through Cast nodes and a bias Add) gets new initializers (a
table shared with the embedding lookup is never sliced in place) and the graph's logits width
becomes N. The external data file is written anew (tensors the head no longer reads are dropped).
``apply_to_bundle`` does it to an exported bundle (in place or into a new directory, atomically),
writes the kept ids beside the drafter graph as ``head_ids.npy`` and records it in the manifest
(hashed like every bundle file).
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import numpy as np

from edgespec.errors import ExportError
from edgespec.manifest import Manifest, load_manifest, sha256_file, write_manifest
from .output import load_graph

HEAD_IDS_NAME = "head_ids.npy"
_INLINE_LIMIT = 1024  # bytes: smaller new tensors stay inside the graph file


def required_ids(tokenizer_json: dict, eos_ids: Sequence[int] = (), bos_id: int | None = None) -> list[int]:
    """Tokens every reduced head keeps: the tokenizer's added tokens (specials, chat markers), eos, bos."""
    ids = {int(t["id"]) for t in tokenizer_json.get("added_tokens") or []}
    ids.update(int(e) for e in eos_ids)
    if bos_id is not None:
        ids.add(int(bos_id))
    return sorted(ids)


def select_head_ids(tokenizer_json: dict, n: int, *, eos_ids: Sequence[int] = (), bos_id: int | None = None,
                    vocab_size: int | None = None, ranked: Sequence[int] = (), what: str = "--drafter-vocab",
                    keep_full: str = "to keep the full head, export without --drafter-vocab") -> np.ndarray:
    """The ``n`` token ids a reduced head keeps, sorted (int32): the required tokens, then
    ``ranked`` (most wanted first), then the remaining ids in id order (BPE merge order). ``what`` names ``n`` in
    an error, ``keep_full`` says what to do where ``n`` cuts nothing (export's option by default; the
    ``drafter-vocab`` command's own words there)."""
    model = tokenizer_json.get("model") or {}
    vocab = model.get("vocab") or {}
    ids = list(vocab.values()) if isinstance(vocab, dict) else list(range(len(vocab)))
    req = required_ids(tokenizer_json, eos_ids, bos_id)
    if vocab_size is not None:  # (added tokens past the models' rows, never written: Gemma 3 1B's <image_soft_token>)
        past = {int(t["id"]) for t in tokenizer_json.get("added_tokens") or []} - {int(e) for e in eos_ids} - (
            {int(bos_id)} if bos_id is not None else set())
        req = [r for r in req if r < int(vocab_size) or r not in past]
    total = max(ids + req) + 1 if ids or req else 0
    if vocab_size is not None:
        total = min(total, int(vocab_size))
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
        raise ExportError(f"{what.rstrip(' =')} must be a positive number of tokens, got {n!r}")
    if n >= total:
        raise ExportError(f"{what} {n} is not smaller than the vocabulary ({total} tokens): nothing to cut "
                          f"({keep_full})")
    if n < len(req):
        raise ExportError(f"{what} {n} is smaller than the {len(req)} special tokens every head keeps "
                          "(added tokens, eos, bos)")
    if any(not 0 <= r < total for r in req):
        raise ExportError(f"a special token id is outside the vocabulary of {total}")
    keep: dict[int, None] = dict.fromkeys(req)
    for t in ranked:
        if len(keep) >= n:
            break
        t = int(t)
        if 0 <= t < total:
            keep.setdefault(t)
    for t in sorted(set(ids)):
        if len(keep) >= n:
            break
        if t < total:
            keep.setdefault(t)
    if len(keep) < n:
        raise ExportError(f"the tokenizer has only {len(keep)} tokens to keep, fewer than --drafter-vocab {n}")
    return np.array(sorted(keep), dtype=np.int32)


CORPUS_SUFFIXES = (".py", ".md", ".rst", ".txt")


def corpus_files(paths: Sequence[str | os.PathLike]) -> list[Path]:
    """Text files of ``paths`` (a directory: its .py/.md/.rst/.txt files and READMEs, recursively), sorted."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(f for f in p.rglob("*") if f.is_file() and (f.suffix in CORPUS_SUFFIXES
                                                                    or f.name.startswith("README")))
        elif p.is_file():
            out.append(p)
        elif p.exists():
            raise ExportError(f"corpus: {p} is not a regular file or a directory")
        else:
            raise ExportError(f"corpus: no such file or directory: {p}")
    return sorted(set(out))


def _utf8_prefix(data: bytes) -> str:
    """``data`` cut at the byte budget: UTF-8 text but for a character the cut split (up to 3 bytes dropped);
    a ``UnicodeDecodeError`` where the bytes before are not UTF-8 either."""
    for drop in range(4):
        try:
            return data[: len(data) - drop].decode("utf-8")
        except UnicodeDecodeError:
            if drop == 3:
                raise
    raise AssertionError("unreachable")


def corpus_ranking(tokenizer_json: str | os.PathLike, paths: Sequence[str | os.PathLike],
                   max_bytes: int = 256 << 20) -> list[int]:
    """Token ids by their frequency in the text of ``paths`` (most frequent first; ids never seen
    are left out), tokenized by ``tokenizer_json``; files that are not UTF-8 text (or hold NUL bytes:
    binary) are skipped, reading stops after ``max_bytes``."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    counts = np.zeros(tok.get_vocab_size(with_added_tokens=True) + 1024, dtype=np.int64)
    texts, read, skipped = [], 0, []
    for f in corpus_files(paths):
        try:
            with open(f, "rb") as fh:
                data = fh.read(max_bytes - read + 1)
            if b"\x00" in data:
                raise ValueError("binary")
            t = _utf8_prefix(data[: max_bytes - read]) if len(data) > max_bytes - read else data.decode("utf-8")
        except (ValueError, OSError):  # (UnicodeDecodeError is a ValueError)
            skipped.append(f)
            continue
        texts.append(t)
        read += min(len(data), max_bytes - read)  # bytes, as the budget counts them
        if len(texts) >= 256 or read >= max_bytes:
            for e in tok.encode_batch(texts, add_special_tokens=False):
                ids = np.asarray(e.ids, dtype=np.int64)
                counts += np.bincount(ids, minlength=counts.shape[0])[: counts.shape[0]]
            texts = []
        if read >= max_bytes:
            break
    for e in tok.encode_batch(texts, add_special_tokens=False):
        counts += np.bincount(np.asarray(e.ids, dtype=np.int64), minlength=counts.shape[0])[: counts.shape[0]]
    if not counts.any():
        why = f" ({len(skipped)} file(s) skipped, binary or not UTF-8: {skipped[0]}{', ...' if len(skipped) > 1 else ''})" \
            if skipped else ""
        raise ExportError(f"corpus: no text to count tokens in{why}")
    seen = np.flatnonzero(counts)
    return seen[np.argsort(-counts[seen], kind="stable")].tolist()


# -- the graph -------------------------------------------------------------------------------
def _np_dtype(t):
    import onnx

    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type))


def _ext(t) -> dict | None:
    import onnx

    if t.data_location != onnx.TensorProto.EXTERNAL:
        return None
    return {e.key: e.value for e in t.external_data}


def _read(t, base: Path) -> np.ndarray:
    from onnx import numpy_helper

    info = _ext(t)
    if info is None:
        return numpy_helper.to_array(t)
    dt = _np_dtype(t)
    count = int(np.prod(t.dims)) if len(t.dims) else 1
    arr = np.fromfile(base / info["location"], dtype=dt, count=count, offset=int(info.get("offset", 0)))
    if arr.size != count:
        raise ExportError(f"{t.name}: its external data is shorter than its shape says")
    return arr.reshape(tuple(t.dims))


def _head_chain(g, logits: str):
    """(the matmul computing ``logits``, the bias Add after it or None, names between them)."""
    inits = {t.name for t in g.initializer}
    producers = {o: n for n in g.node for o in n.output}
    node, between = producers.get(logits), [logits]
    while node is not None and node.op_type == "Cast":
        between.append(node.input[0])
        node = producers.get(node.input[0])
    bias = None
    if node is not None and node.op_type == "Add":
        consts = [i for i in node.input if i in inits]
        other = [i for i in node.input if i not in inits]
        if len(consts) == 1 and len(other) == 1:
            bias = node
            between.append(other[0])
            node = producers.get(other[0])
    if node is None or node.op_type not in ("MatMulNBits", "MatMul"):
        what = node.op_type if node is not None else "a graph input"
        hint = (": this drafter was rewritten by exact-kernels; apply drafter-vocab to the bundle before exact-kernels "
                "(or export with --drafter-vocab N --exact-kernels)") if what == "MatMulQ4" else ""
        raise ExportError(f"the drafter's logits come from {what}, not a MatMulNBits/MatMul lm_head: "
                          f"cannot reduce its vocabulary{hint}")
    return node, bias, between


def reduce_head(model_path: str | os.PathLike, ids: np.ndarray, logits: str = "logits") -> int:
    """Rewrite the graph at ``model_path`` (and its external data file, same name + '.data') so
    its ``logits`` have one column per id of ``ids`` (sorted, unique), in that order. Writes new
    files and renames them over the old names (a hard-linked bundle copy keeps its original).
    Returns the full vocabulary the head had."""
    from onnx import helper

    model_path = Path(model_path)
    base = model_path.parent
    m = load_graph(model_path)
    g = m.graph
    inits = {t.name: t for t in g.initializer}
    head, bias_add, between = _head_chain(g, logits)
    ids = np.asarray(ids, dtype=np.int64)
    n = int(ids.shape[0])
    attrs = {a.name: a for a in head.attribute}

    def sliced(name: str, axis_rows: bool, full: int):
        if name not in inits:
            raise ExportError(f"the drafter's lm_head input {name!r} is not a constant: cannot reduce it")
        t = inits[name]
        a = _read(t, base)
        if axis_rows:  # the output channel is the leading axis (possibly flattened with the rest)
            out = a.reshape(full, -1)[ids]
            out = out.reshape((n, *a.shape[1:])) if a.ndim > 1 else out.reshape(-1)
        else:  # MatMul weight [K, V]: the columns
            out = a[..., ids]
        return np.ascontiguousarray(out)

    if head.op_type == "MatMulNBits":
        full = int(helper.get_attribute_value(attrs["N"]))
    else:
        w = inits.get(head.input[1])
        if w is None or len(w.dims) != 2:
            raise ExportError("the drafter's lm_head MatMul has no constant [hidden, vocab] weight: cannot reduce it")
        full = int(w.dims[1])
    if ids.ndim != 1 or n == 0 or (np.diff(ids) <= 0).any() or ids[0] < 0 or ids[-1] >= full:
        raise ExportError(f"the kept ids must be sorted, unique and inside the head's {full} tokens")
    if head.op_type == "MatMulNBits":
        slots = [1, 2, 3, 5]  # B, scales, zero_points, bias (g_idx, 4, is per input channel)
        new = {k: sliced(head.input[k], True, full) for k in slots if k < len(head.input) and head.input[k]}
        attrs["N"].i = n
    else:
        new = {1: sliced(head.input[1], False, full)}
    bias_new = None
    if bias_add is not None:
        bname = next(i for i in bias_add.input if i in inits)
        if int(np.prod(inits[bname].dims)) == full:
            bias_new = (bname, sliced(bname, True, full))
    # new initializers, named after the old ones; an old one no other node reads is dropped
    renames = {}
    for k, arr in new.items():
        old = head.input[k]
        renames[old] = f"{old}.head{n}"
        head.input[k] = renames[old]
        g.initializer.append(_tensor(renames[old], arr, inits[old].data_type))
    if bias_new is not None:
        old, arr = bias_new
        renames[old] = f"{old}.head{n}"
        for j, i in enumerate(bias_add.input):
            if i == old:
                bias_add.input[j] = renames[old]
        g.initializer.append(_tensor(renames[old], arr, inits[old].data_type))
    used = {i for nd in g.node for i in nd.input} | {o.name for o in g.output}
    for sub in _subgraph_inputs(g):
        used |= sub
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)
    # shapes: the logits output says N; value_info of what changed is dropped (onnxruntime infers it)
    stale = set(between) | set(renames) | set(renames.values())
    vi = [v for v in g.value_info if v.name not in stale]
    del g.value_info[:]
    g.value_info.extend(vi)
    for o in g.output:
        if o.name == logits:
            dims = o.type.tensor_type.shape.dim
            if dims:
                dims[-1].Clear()
                dims[-1].dim_value = n
    _write(m, model_path, base)
    return full


def _subgraph_inputs(g) -> list[set]:
    out = []
    for nd in g.node:
        for a in nd.attribute:
            for sg in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                out.append({i for x in sg.node for i in x.input})
                out.extend(_subgraph_inputs(sg))
    return out


def _tensor(name: str, arr: np.ndarray, data_type: int):
    import onnx

    t = onnx.TensorProto()
    t.name = name
    t.data_type = data_type
    t.dims.extend(arr.shape)
    t.raw_data = arr.tobytes()
    return t


def _write(m, model_path: Path, base: Path) -> None:
    """Write the graph and one external data file (``<graph>.data``): every external tensor copied
    from where it was, new tensors of more than ``_INLINE_LIMIT`` bytes appended; both under
    temporary names first, then renamed over the old ones."""
    import onnx

    data_name = model_path.name + ".data"
    tmp_data = base / f".{data_name}.tmp-{os.getpid()}"
    tmp_model = base / f".{model_path.name}.tmp-{os.getpid()}"
    sources: dict[str, object] = {}
    locations = {(_ext(t) or {}).get("location") for t in m.graph.initializer} - {None}
    try:
        with open(tmp_data, "wb") as out:
            pos = 0
            tensors = sorted(m.graph.initializer, key=lambda t: (_ext(t) is None, int((_ext(t) or {}).get("offset", 0))))
            for t in tensors:
                info = _ext(t)
                if info is not None:
                    src = sources.get(info["location"])
                    if src is None:
                        src = sources[info["location"]] = open(base / info["location"], "rb")
                    src.seek(int(info.get("offset", 0)))
                    length = int(info["length"]) if "length" in info else int(np.prod(t.dims)) * _np_dtype(t).itemsize
                    left = length
                    while left:
                        block = src.read(min(left, 1 << 24))
                        if not block:
                            raise ExportError(f"{t.name}: its external data ends early")
                        out.write(block)
                        left -= len(block)
                elif t.HasField("raw_data") and len(t.raw_data) > _INLINE_LIMIT:
                    length = len(t.raw_data)
                    out.write(t.raw_data)
                    t.ClearField("raw_data")
                else:
                    continue
                del t.external_data[:]
                for k, v in (("location", data_name), ("offset", str(pos)), ("length", str(length))):
                    e = t.external_data.add()
                    e.key, e.value = k, v
                t.data_location = onnx.TensorProto.EXTERNAL
                pos += length
        for f in sources.values():
            f.close()
        sources.clear()
        with open(tmp_model, "wb") as f:
            f.write(m.SerializeToString())
        os.replace(tmp_data, base / data_name)
        os.replace(tmp_model, model_path)
        for other in set(locations) - {data_name}:  # every tensor of theirs now lives in data_name
            if (base / other).is_file():
                (base / other).unlink()
    finally:
        for f in sources.values():
            f.close()
        for p in (tmp_data, tmp_model):
            if p.exists():
                p.unlink()


# -- a bundle --------------------------------------------------------------------------------
def head_files(root: Path, role: str = "drafter") -> dict:
    """A model's files table after a rewrite of its graph: graph, data and (a reduced head's) kept
    ids under ``root / role``, sized and hashed."""
    out = {}
    for f in sorted((root / role).iterdir()):
        if f.name.startswith("model.onnx") or f.name == HEAD_IDS_NAME:
            rel = f"{role}/{f.name}"
            out[rel] = {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
    return out


def head_source(corpus: Sequence[str | os.PathLike] = ()) -> str:
    """The manifest's words for how the kept tokens were chosen."""
    if not corpus:
        return "special tokens, then BPE merge order (token id)"
    return ("special tokens, then token frequency in " + ", ".join(str(p) for p in corpus)
            + ", then BPE merge order")


def reduce_in_stage(stage: Path, manifest: Manifest, ids: np.ndarray, log=None, source: str | None = None) -> Manifest:
    """Reduce the drafter of ``manifest`` (whose root is the writable ``stage``) to ``ids`` and
    return the manifest to write (files, sizes and the head recorded)."""
    from .bundle import _ops, measured_sizes

    d = manifest.drafter
    if d is None:
        raise ExportError(f"{manifest.root} has no drafter model: nothing to reduce")
    if d.head_ids is not None:
        raise ExportError(f"the drafter's head is already reduced to {d.head_size} tokens; apply --drafter-vocab to "
                          "a bundle with the full head")
    if int(ids[-1]) >= manifest.target.vocab_size:
        raise ExportError("a kept id is outside the target's vocabulary")
    ids = np.asarray(ids)
    if int(ids[-1]) >= d.vocab_size:  # a drafter with fewer ids than the tokenizer (Gemma 3 1B): its head has no more
        past = int((ids >= d.vocab_size).sum())
        ids = ids[ids < d.vocab_size]
        if len(ids) >= d.vocab_size:
            raise ExportError(f"{len(ids) + past} tokens to keep: the drafter has only {d.vocab_size:,} ids, all of "
                              "them kept; nothing to cut (export without --drafter-vocab)")
        if log:
            log(f"    drafter: {past} kept ids are past its {d.vocab_size:,}-token vocabulary: left out")
    rel_model = Path(manifest.relative(d.path))
    model_path = stage / rel_model
    full = reduce_head(model_path, ids, d.io.logits)
    if full != d.vocab_size:
        raise ExportError(f"the drafter's lm_head has {full} outputs but the manifest says vocab {d.vocab_size}")
    ids_path = model_path.parent / HEAD_IDS_NAME
    tmp = ids_path.with_name(f".{HEAD_IDS_NAME}.tmp-{os.getpid()}.npy")
    np.save(tmp, np.asarray(ids, dtype=np.int32), allow_pickle=False)
    os.replace(tmp, ids_path)
    # genai would read the reduced head's column indices as token ids: no genai config for it
    gcfg = model_path.parent / "genai_config.json"
    if gcfg.exists():
        gcfg.unlink()
    files = head_files(stage, rel_model.parent.as_posix())
    on_disk = sum(v["bytes"] for v in files.values())
    ops = _ops(model_path)
    spec = replace(d, path=model_path.resolve(), files=files, bytes_on_disk=on_disk, gpu_weight_bytes=on_disk,
                   head_ids=ids_path.resolve(), head_size=int(len(ids)), head_source=source or head_source(),
                   operators={k: v for k, v in sorted(ops.items()) if k in d.operators or k in (
                       "MatMulNBits", "GroupQueryAttention", "MatMul", "DequantizeLinear", "GatherBlockQuantized",
                       "Gather")})
    m = replace(manifest, root=stage, drafter=spec, target=_rerooted(manifest.target, manifest.root, stage),
                assistant=_rerooted(manifest.assistant, manifest.root, stage),
                tokenizer_dir=stage / manifest.relative(manifest.tokenizer_dir))
    if log:
        log(f"    drafter: lm_head cut from {full} to {len(ids)} tokens; measuring its resident memory on the CPU EP")
    sizes = measured_sizes(stage, "drafter", spec.to_dict(stage), log=log)
    spec = replace(spec, **sizes)
    if d.quality is not None and d.quality.greedy_agreement_with_target is not None:
        # the predicted acceptance was the full head's: measured again as the cut head drafts (session 49, a review:
        # a head cut to 60 tokens kept 0.54 where it agreed on 0.20)
        from edgespec.tokenizer import Tokenizer

        from .quality import drafter_agreement

        tok = Tokenizer.of(m)
        spec = replace(spec, quality=drafter_agreement(
            m.target, spec, lambda text, room: tok.encode(text, add_special=False)[:room], log,
            head_ids=np.load(ids_path)))
    return replace(m, drafter=spec)


def _rerooted(spec, old: Path, new: Path):
    """``spec`` with its paths (graph, reduced head ids) under ``new`` instead of ``old``."""
    if spec is None:
        return None
    old = os.path.realpath(old)  # (the spec's paths are resolved: a bundle given through a symbolic link)
    if getattr(spec, "head_ids", None) is None:  # (an assistant has none)
        return replace(spec, path=new / os.path.relpath(spec.path, old))
    return replace(spec, path=new / os.path.relpath(spec.path, old), head_ids=new / os.path.relpath(spec.head_ids, old))


def _copy_tree(src: Path, dst: Path, link: bool) -> None:
    """Copy ``src`` to ``dst``; with ``link``, with hard links where the filesystem allows (files are
    only ever replaced, never written in place, so the links never carry a change back). Only an
    in-place rewrite links: its links are gone once the old tree is removed. A bundle that keeps
    sharing a file with another is one ``onnx.load`` refuses to read ("multiple hard links,
    indicating a potential hardlink attack"), which breaks the export tools on both."""
    def copy(s, d):
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=copy if link else shutil.copy2, symlinks=False)
    import stat

    for d in [dst, *(p for p in dst.rglob("*") if p.is_dir() and not p.is_symlink())]:  # (copytree copies the
        st = os.stat(d).st_mode  # source's modes: a read-only bundle's copy took no rewritten file, nor went away)
        if st & (stat.S_IWUSR | stat.S_IXUSR) != stat.S_IWUSR | stat.S_IXUSR:
            os.chmod(d, st | stat.S_IWUSR | stat.S_IXUSR)


def apply_to_bundle(bundle: str | os.PathLike, n: int, out: str | os.PathLike | None = None, *,
                    corpus: Sequence[str | os.PathLike] = (), ranked: Sequence[int] = (), force: bool = False,
                    log=None) -> Path:
    """Reduce the drafter head of the exported ``bundle`` to ``n`` tokens (``select_head_ids``,
    ranked by token frequency in the text files of ``corpus`` or by ``ranked`` if given), in place or into the new
    bundle directory ``out``; atomic either way (a stage directory beside the result, renamed
    into place), one rewrite of a bundle at a time (``output.rewriting``)."""
    from .output import rewriting

    with rewriting(bundle, out):
        return _reduce_bundle(bundle, n, out, corpus, ranked, force, log)


def _reduce_bundle(bundle, n, out, corpus, ranked, force, log) -> Path:
    src = Path(bundle)
    manifest = load_manifest(src)  # a missing or broken bundle: BundleError (exit 2), as everywhere
    if manifest.drafter is None:
        raise ExportError(f"{src} has no drafter model: --drafter-vocab needs a bundle exported with --drafter")
    if manifest.drafter.head_ids is not None:
        raise ExportError(f"the drafter's head in {src} is already reduced to {manifest.drafter.head_size} tokens; "
                          "apply --drafter-vocab to a bundle with the full head")
    tj = json.loads((manifest.tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    if corpus and ranked:
        raise ExportError("give a corpus or a ranking of token ids, not both")
    if corpus:
        ranked = corpus_ranking(manifest.tokenizer_dir / "tokenizer.json", corpus)
    ids = select_head_ids(tj, n, eos_ids=manifest.eos_token_ids, bos_id=manifest.bos_token_id,
                          vocab_size=min(manifest.target.vocab_size, manifest.drafter.vocab_size), ranked=ranked,
                          what="N =", keep_full="the drafter's head has no more tokens: the bundle needs no cut; a "
                          "smaller N cuts it")
    source = head_source(corpus) if not ranked or corpus else "special tokens, then a given ranking, then BPE merge order"
    return staged_rewrite(src, out, force, lambda stage: reduce_in_stage(stage, manifest, ids, log=log, source=source))


def staged_rewrite(src: Path, out: str | os.PathLike | None, force: bool, build) -> Path:
    """Rewrite the bundle ``src`` in place (``out`` None) or into the new bundle ``out``, atomically:
    a copy in a stage directory beside the result, ``build(stage)`` changes it and returns its
    manifest, which is checked to read back, written, and the stage renamed into place."""
    from .output import (check_not_mount, check_output, missing_parents, prepare_stage, publish, raise_if_full,
                         remove_parents, remove_replaced, remove_tree, rewrites_in_place, terminate_cleanly)

    in_place = rewrites_in_place(src, out)  # (-o naming the bundle itself: its in-place rewrite, as without -o; it
    # was refused twice, the first refusal advising the --force the second refused)
    if in_place:
        out = None
    if not in_place and src.resolve() in Path(out).expanduser().resolve().parents:  # (before anything is made)
        raise ExportError(f"{Path(out).expanduser().resolve()} is inside the bundle {src}; write the new bundle "
                          "elsewhere")
    dest = src.resolve() if in_place else check_output(out, force, [str(src)])
    if in_place:  # (refused before the rewrite, as an export's --force onto one: after it, a traceback)
        check_not_mount(dest)
    made = [] if in_place else missing_parents(dest)  # (removed again where the rewrite fails)
    inside = in_place and _inside_cwd(dest)  # (before the old tree is gone)
    stage = prepare_stage(dest)
    shutil.rmtree(stage)
    with terminate_cleanly():  # SIGTERM unwinds through the cleanup below, as Ctrl-C does
        try:
            _copy_tree(src.resolve(), stage, link=in_place)
            m = build(stage)
            if not in_place:
                m = replace(m, name=dest.name)
            Manifest.from_dict(m.to_dict(), stage)  # what is written reads back
            write_manifest(m)
            _keep_modes(src.resolve(), stage)
            replaced = publish(stage, dest, force, None if in_place else [str(src)])
        except BaseException as e:
            remove_tree(stage)
            remove_parents(made)
            raise_if_full(e, f"the rewrite of {src}", dest.parent,  # (onnx's and protobuf's writes name no path)
                          "the bundle is unchanged" if in_place else "nothing was written")
            raise
    remove_replaced(replaced)  # (done once published: outside the SIGTERM guard)
    if inside:
        import warnings

        warnings.warn(f"{dest} was replaced by its rewrite: this shell's working folder was the old one, which is "
                      "gone; cd into the bundle again", stacklevel=2)
    return dest


def _keep_modes(src: Path, stage: Path) -> None:
    """The source bundle's permission bits on the stage's folders and files of the same names (its copy made its
    folders writable, for the rewritten files, and a rewritten file is new): a read-only bundle stays read-only
    (it came back writable; session 55, a review). Files the source has not keep the stage's."""
    import stat

    for p in sorted(stage.rglob("*"), key=lambda q: -len(q.parts)) + [stage]:  # (a folder's own bits last)
        rel = p.relative_to(stage)
        try:
            mode = stat.S_IMODE((src / rel).stat().st_mode)  # (through a link: the copy holds what it names)
        except OSError:
            continue
        if not p.is_symlink():
            os.chmod(p, mode)


def _inside_cwd(path: Path) -> bool:
    """Whether the process's working folder is ``path`` or below it (as it was before ``path`` was replaced)."""
    try:
        cwd = Path(os.getcwd()).resolve()
    except OSError:
        return False
    return cwd == path or path in cwd.parents
