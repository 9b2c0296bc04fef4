"""(session 99) Gap tests of the second mutation pass of export/head.py (H2_*) and export/output.py (O2_*):
``docs/bench/mutation_s99_export.md``. Small graphs built by hand, tokenizers trained in a second, tmp_path folders;
no model is exported."""
from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np
import pytest

from conftest import MANIFEST_MODEL
from edgespec.errors import ExportError

# -- select_head_ids -------------------------------------------------------------------------------------------


def _tj(n=10, added=(10, 11)):
    return {"model": {"vocab": {f"t{i}": i for i in range(n)}},
            "added_tokens": [{"id": i, "content": f"<{i}>"} for i in added]}


def test_select_head_ids_on_a_list_vocabulary_and_specials_past_the_models_rows():
    """H2_2 (a Unigram tokenizer's list vocabulary read as empty), H2_3, H2_4 (an eos or bos that is an added token
    past the model's rows dropped silently, not refused as every special token outside the vocabulary is), H2_11 (a
    ranking's id 0 skipped: the next ranked id taken in its place)."""
    from edgespec_export.head import select_head_ids

    unigram = {"model": {"type": "Unigram", "vocab": [[f"p{i}", -float(i)] for i in range(10)]}}
    assert select_head_ids(unigram, 3).tolist() == [0, 1, 2]
    assert select_head_ids(unigram, 3, ranked=[7, 5]).tolist() == [0, 5, 7]
    for kw in ({"eos_ids": [11]}, {"bos_id": 11}):
        with pytest.raises(ExportError, match="a special token id is outside the vocabulary of 11"):
            select_head_ids(_tj(), 4, vocab_size=11, **kw)
    assert select_head_ids(_tj(added=()), 2, ranked=[9, 0, 5]).tolist() == [0, 9]


@pytest.mark.parametrize("n, said", [(0, "got 0"), (5.0, "got 5.0"), ("8", "got '8'")])
def test_select_head_ids_takes_only_a_positive_whole_number(n, said):
    """H2_6 (N = 0 let through to the special tokens' check), H2_7 (a float or a string N let through), H2_8 (the
    value said without its repr: a string N read as a number), H2_9 (the API's "N =" left in the message)."""
    from edgespec_export.head import select_head_ids

    with pytest.raises(ExportError, match=f"^N must be a positive number of tokens, {said}$"):
        select_head_ids(_tj(), n, what="N =")


# -- the corpus ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer_json(tmp_path_factory):
    from tiny import make_tokenizer

    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    make_tokenizer().backend_tokenizer.save(str(path))
    return path


def test_corpus_files_leave_out_a_folder_named_as_a_text_file(tmp_path):
    """H2_15: a folder named ``notes.md`` was listed as a file (then read as one: skipped, and counted as skipped)."""
    from edgespec_export.head import corpus_files

    (tmp_path / "notes.md").mkdir()
    (tmp_path / "notes.md" / "a.txt").write_text("x")
    assert corpus_files([tmp_path]) == [tmp_path / "notes.md" / "a.txt"]


def test_a_corpus_file_that_ends_inside_a_character_at_the_budget_is_skipped_and_skipped_files_said(tokenizer_json,
                                                                                                    tmp_path):
    """H2_17: a file exactly as long as what is left of the budget is decoded whole (not cut): one that ends inside a
    character is not UTF-8 and skipped, not forgiven as a character the budget split. H2_18: two files skipped are
    said as the first and ", ..."."""
    from edgespec_export.head import corpus_ranking

    (tmp_path / "broken.txt").write_bytes(b"ab\xc3")
    with pytest.raises(ExportError, match=r"no text to count tokens in \(1 file\(s\) skipped, .*broken\.txt\)$"):
        corpus_ranking(tokenizer_json, [tmp_path / "broken.txt"], max_bytes=3)
    assert corpus_ranking(tokenizer_json, [tmp_path / "broken.txt"], max_bytes=2)  # (cut before the character: text)
    (tmp_path / "nul.txt").write_bytes(b"a\x00b")
    with pytest.raises(ExportError, match=r"\(2 file\(s\) skipped, binary or not UTF-8: .*broken\.txt, \.\.\.\)$"):
        corpus_ranking(tokenizer_json, [tmp_path / "broken.txt", tmp_path / "nul.txt"])


# -- reduce_head on graphs by hand ---------------------------------------------------------------------------------


def _graph(folder, *, nbits=False, logits_from="mm"):
    """logits = Cast(x @ W) ([B, 16] @ [16, 64]; with ``nbits`` a 4-bit MatMulNBits with a bias input and no zero
    points), and two more outputs: ``pad``, an initializer that is itself a graph output (stored before W in the
    external data file ``w.bin``), and ``doubled`` ([B, 16]). ``logits_from="add"``: logits = mm + x @ W2, an Add of
    two computed values (no bias)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal(300).astype(np.float32), "pad"),
             numpy_helper.from_array(np.array([2.0], np.float32), "two")]
    if nbits:
        inits += [numpy_helper.from_array(rng.integers(0, 256, (64, 1, 8), dtype=np.uint8), "B"),
                  numpy_helper.from_array(rng.random(64).astype(np.float32), "S"),
                  numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "bias")]
        nodes = [helper.make_node("MatMulNBits", ["x", "B", "S", "", "", "bias"], ["mm"], domain="com.microsoft",
                                  K=16, N=64, bits=4, block_size=16)]
    else:
        inits.append(numpy_helper.from_array(rng.standard_normal((16, 64)).astype(np.float32), "W"))
        nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"])]
    if logits_from == "add":
        inits.append(numpy_helper.from_array(rng.standard_normal((16, 64)).astype(np.float32), "W2"))
        nodes += [helper.make_node("MatMul", ["x", "W2"], ["mm2"]), helper.make_node("Add", ["mm", "mm2"], ["logits"])]
    else:
        nodes.append(helper.make_node("Cast", ["mm"], ["logits"], to=TensorProto.FLOAT))
    nodes.append(helper.make_node("Mul", ["x", "two"], ["doubled"]))
    g = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 16])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", 64]),
                           helper.make_tensor_value_info("pad", TensorProto.FLOAT, [300]),
                           helper.make_tensor_value_info("doubled", TensorProto.FLOAT, ["B", 16])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                          ir_version=8)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(folder / "model.onnx"), save_as_external_data=True, location="w.bin", size_threshold=256)
    return folder / "model.onnx"


def _run(path):
    import onnxruntime as ort

    from conftest import pool_session_options

    x = np.random.default_rng(4).standard_normal((2, 16)).astype(np.float32)
    s = ort.InferenceSession(str(path), pool_session_options(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in s.get_outputs()], s.run(None, {"x": x})))


@pytest.mark.parametrize("nbits", [False, True])
def test_reduce_head_reads_at_offsets_keeps_an_output_initializer_and_moves_large_new_tensors_out(tmp_path, nbits):
    """H2_22 (a tensor's external data read from offset 0: every head's weight was the file's first tensor), H2_28
    (MatMulNBits without zero points but with a bias: its empty input slot taken for a tensor to cut), H2_32 (an
    initializer that is itself a graph output dropped), H2_33 (every output's last axis said to be N), H2_35 (a new
    tensor moved to the data file kept its bytes in the graph too), H2_36 (a new tensor past ``_INLINE_LIMIT`` kept in
    the graph file)."""
    import onnx

    from edgespec_export.head import reduce_head

    path = _graph(tmp_path, nbits=nbits)
    full = _run(path)
    ids = np.arange(0, 64, 3)  # (22 columns: a new W of 16 x 22 float32, 1,408 bytes, past the inline limit)
    assert reduce_head(path, ids) == 64
    cut = _run(path)
    np.testing.assert_allclose(cut["logits"], full["logits"][:, ids], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(cut["pad"], full["pad"])
    np.testing.assert_array_equal(cut["doubled"], full["doubled"])
    m = onnx.load(str(path), load_external_data=False)
    dims = {o.name: [d.dim_value or d.dim_param for d in o.type.tensor_type.shape.dim] for o in m.graph.output}
    assert dims == {"logits": ["B", 22], "pad": [300], "doubled": ["B", 16]}
    inits = {t.name: t for t in m.graph.initializer}
    assert "pad" in inits and inits["pad"].data_location == onnx.TensorProto.EXTERNAL
    if not nbits:
        w = inits["W.head22"]
        assert w.data_location == onnx.TensorProto.EXTERNAL and not w.HasField("raw_data")
        assert {e.key: e.value for e in w.external_data}["length"] == str(16 * 22 * 4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]


def test_reduce_head_refuses_logits_of_a_graph_input_an_add_of_two_values_and_ids_of_two_axes(tmp_path):
    """H2_25 (logits that no node computes: an AttributeError, not the refusal), H2_27 (ids of two axes: numpy's
    ambiguous truth value). (An Add of two computed values, no bias, is refused too: H2_26's case, equivalent.)"""
    from edgespec_export.head import reduce_head

    path = _graph(tmp_path / "a")
    with pytest.raises(ExportError, match="the drafter's logits come from a graph input, not a MatMulNBits/MatMul"):
        reduce_head(path, np.array([1, 2]), logits="x")
    with pytest.raises(ExportError, match="the drafter's logits come from Add, not a MatMulNBits/MatMul"):
        reduce_head(_graph(tmp_path / "b", logits_from="add"), np.array([1, 2]))
    with pytest.raises(ExportError, match="sorted, unique and inside the head's 64 tokens"):
        reduce_head(path, np.array([[1, 2]]))


# -- export/output.py ----------------------------------------------------------------------------------------------


def test_check_output_expands_home_in_the_output_and_the_inputs_and_a_link_to_a_bundle_needs_force(tmp_path,
                                                                                                   monkeypatch):
    """O2_1 (``-o ~/b`` taken as a folder named ``~`` under the working one), O2_4 (an input given as ``~/...`` not
    found inside the bundle --force would replace), O2_2 (a link to an existing bundle, without --force, said to be
    a link to nothing)."""
    from edgespec.manifest import MANIFEST_NAME
    from edgespec_export.output import check_output

    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    assert check_output("~/new", False, []) == (home / "new").resolve()
    b = home / "b"
    (b / "src").mkdir(parents=True)
    (b / MANIFEST_NAME).write_text("{}")
    with pytest.raises(ExportError, match="holds the export's input ~/b/src; --force will not replace it"):
        check_output(b, True, ["~/b/src"])
    (work / "link").symlink_to(b)
    with pytest.raises(ExportError, match="b exists; pass --force to replace it"):
        check_output(work / "link", False, [])
    assert sorted(p.name for p in work.iterdir()) == ["link"]


def test_only_an_old_copy_named_exactly_for_the_bundle_is_put_back(tmp_path, monkeypatch):
    """O2_5 (the bundle's name taken as a pattern: ``a.b``'s dots matched any character), O2_6 (a name that only
    starts as an old copy's, ``.b.old-<pid>-mine``, taken for one)."""
    from conftest import dead_pid
    from edgespec_export import output as O

    monkeypatch.setattr(O, "_whole_bundle", lambda p: True)  # (a bundle's manifest is not what is tested here)
    pid = dead_pid()
    for name, other in (("a.b", f".aXb.old-{pid}"), ("b", f".b.old-{pid}-mine")):
        (tmp_path / other).mkdir()
        assert O.restore_stale_old(tmp_path / name) is None
        assert (tmp_path / other).is_dir() and not (tmp_path / name).exists()
    (tmp_path / f".a.b.old-{pid}").mkdir()
    assert O.restore_stale_old(tmp_path / "a.b") == tmp_path / "a.b" and (tmp_path / "a.b").is_dir()


def test_a_rewrite_onto_the_bundle_itself_locks_it_as_one_in_place_and_a_home_path_is_locked(tmp_path, monkeypatch):
    """O2_7 (``-o`` naming the bundle itself took the shared lock of a rewrite into a new bundle: an in-place rewrite
    and a copy of it ran at once), O2_9 (a bundle named ``~/b`` not opened: no lock at all)."""
    from edgespec_export.output import rewriting

    home = tmp_path / "home"
    (home / "b").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    b = home / "b"
    with rewriting(b, b):
        with pytest.raises(ExportError, match="is being rewritten in place by another edgespec process"):
            with rewriting(b, tmp_path / "copy"):
                pass
    with rewriting(b, tmp_path / "copy"):
        with pytest.raises(ExportError, match="b is being rewritten or copied by another edgespec rewrite"):
            with rewriting("~/b"):
                pass


def test_where_the_bundle_cannot_be_written_is_an_export_error_and_a_kept_parent_stays(tmp_path, monkeypatch):
    """O2_13 (the probe's failure other than a missing folder, a read-only file system's, came as the system's
    error), O2_14 (prepare_stage's, a file on the way, likewise), O2_15 (a parent folder not empty raised where it is
    to be left)."""
    import tempfile

    from conftest import raising
    from edgespec_export.output import check_output, prepare_stage, remove_parents

    (tmp_path / "f").write_text("x")
    with pytest.raises(ExportError, match="cannot write the bundle at .*f/x/b: "):
        prepare_stage(tmp_path / "f" / "x" / "b")
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "other").write_text("x")
    remove_parents([tmp_path / "kept", tmp_path])
    assert (tmp_path / "kept" / "other").is_file()
    monkeypatch.setattr(tempfile, "mkdtemp", raising(PermissionError(1, "Operation not permitted")))
    with pytest.raises(ExportError, match="cannot write the bundle at .*new: Operation not permitted$"):
        check_output(tmp_path / "new", False, [])


@pytest.mark.timeout(30)  # (O2_16: the loop never ends)
def test_a_full_disk_in_a_cycle_a_quota_a_nested_rewrite_and_a_file_in_the_bundles_folder(tmp_path):
    """O2_16 (an error chain that loops: the search never ended), O2_17 (EDQUOT by its errno alone), O2_18 (a nested
    rewrite's NoSpaceError: its words are not the system's), O2_20 (a file the error names inside the folder being
    written: said as the folder and its free space, not as another disk's file), O2_21 (another disk's file, a
    cache's, not said), O2_22 (the free space of a folder gone again: not said, not the nearest one's)."""
    import errno

    from edgespec.errors import NoSpaceError
    from edgespec_export.output import _full_disk_error, raise_if_full

    a, b = RuntimeError("a"), RuntimeError("b")
    a.__context__, b.__context__ = b, a
    assert _full_disk_error(a) is None
    assert _full_disk_error(OSError(errno.EDQUOT, "over")) is not None
    nested = NoSpaceError("no space left on device while writing the inner rewrite")
    assert _full_disk_error(nested) is nested
    inside = OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "x.data"))
    with pytest.raises(NoSpaceError, match=rf"^no space left on device while writing w in {tmp_path}, [\d,]+ [MK]iB "
                                           r"free there now: kept$"):
        raise_if_full(inside, "w", tmp_path, "kept")
    gone = tmp_path / "made" / "for it"  # (folders the failed export made, removed again: the free space is said
    with pytest.raises(NoSpaceError, match=r"made/for it, [\d,]+ [MK]iB free there now: kept$"):  # of the nearest)
        raise_if_full(OSError(errno.ENOSPC, "No space left on device"), "w", gone, "kept")
    cache = OSError(errno.ENOSPC, "No space left on device", "/var/cache/x.bin")  # (another disk's file)
    with pytest.raises(NoSpaceError, match=r"^no space left on device while writing w: /var/cache/x\.bin: kept$"):
        raise_if_full(cache, "w", tmp_path, "kept")


def test_publish_says_a_link_to_nothing_that_appeared_at_a_new_bundles_place(tmp_path):
    """O2_25: a link to nothing made at ``-o`` while a new bundle was built was not checked (``check_output``'s words
    for it), only refused by the rename."""
    from edgespec.manifest import MANIFEST_NAME
    from edgespec_export.output import publish

    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / MANIFEST_NAME).write_text("new")
    (tmp_path / "out").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ExportError, match="out is a symlink to .*nowhere, which does not exist.*appeared while"):
        publish(stage, tmp_path / "out", True, [])
    assert (stage / MANIFEST_NAME).read_text() == "new" and (tmp_path / "out").is_symlink()


def test_remove_stale_leaves_files_and_names_that_only_start_as_a_partials(tmp_path):
    """O2_34 (``.b.partial-<pid>-mine`` taken for a dead export's partial and removed), O2_44 (a file so named
    removed: only folders are an export's)."""
    from conftest import dead_pid
    from edgespec_export.output import remove_stale

    pid = dead_pid()
    (tmp_path / f".b.partial-{pid}-mine").mkdir()
    (tmp_path / f".b.old-{pid}").write_text("a file")
    stale = tmp_path / f".b.partial-{pid}"
    stale.mkdir()
    assert remove_stale(tmp_path, "b") == [stale]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".b.old-{pid}", f".b.partial-{pid}-mine"]


# -- reduce_in_stage on a stage by hand ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Spec:
    """The fields of a ModelSpec that reduce_in_stage and _rerooted read and write."""
    path: Any
    vocab_size: int
    io: Any = None
    operators: dict = dataclasses.field(default_factory=dict)
    head_ids: Any = None
    head_size: Any = None
    head_source: Any = None
    files: dict = dataclasses.field(default_factory=dict)
    bytes_on_disk: int = 0
    gpu_weight_bytes: int = 0
    quality: Any = None
    embedding_bytes: int = 0
    embedding_row_bytes: int = 0
    cpu_resident_bytes: int = 0

    def to_dict(self, root):
        return {}


@dataclasses.dataclass(frozen=True)
class _Manifest:
    root: Any
    drafter: Any
    target: Any
    tokenizer_dir: Any
    assistant: Any = None

    def relative(self, p):
        return os.path.relpath(p, os.path.realpath(self.root))


def _stage(tmp_path):
    """A source bundle's root and a stage holding a drafter graph by hand (a 64-token head), and a manifest of
    dataclasses with the fields reduce_in_stage reads (a target of 80 tokens: the drafter has fewer rows)."""
    import types

    src, stage = tmp_path / "src", tmp_path / "stage"
    _graph(stage / "drafter")
    (stage / "drafter" / "genai_config.json").write_text("{}")
    src.mkdir()
    drafter = _Spec(src / "drafter" / "model.onnx", 64, io=types.SimpleNamespace(logits="logits"),
                   operators={"MatMul": 1}, bytes_on_disk=10**9, gpu_weight_bytes=10**9)
    target = _Spec(src / "target" / "model.onnx", 80)
    return stage, _Manifest(src, drafter, target, src / "tokenizer")


def test_reduce_in_stage_leaves_out_ids_past_the_drafters_rows_and_reroots_what_it_records(tmp_path, monkeypatch):
    """H2_42 (the count of ids past the drafter's rows said as 0), H2_44 (not said), H2_49 (an id equal to the
    drafter's row count not left out: the head's cut refused), H2_46 (the GPU weight bytes of the full head kept),
    H2_47, H2_48 (the tokenizer's and the target's paths left in the source bundle, not the stage)."""
    from edgespec_export import bundle as B
    from edgespec_export.head import HEAD_IDS_NAME, reduce_in_stage

    monkeypatch.setattr(B, "measured_sizes", lambda root, role, entry, log=None: {"cpu_resident_bytes": 7})
    stage, m = _stage(tmp_path)
    logs = []
    out = reduce_in_stage(stage, m, np.array([0, 5, 63, 64, 70]), log=logs.append, source="given")
    d = out.drafter
    assert np.load(stage / "drafter" / HEAD_IDS_NAME).tolist() == [0, 5, 63] and d.head_size == 3
    assert any("drafter: 2 kept ids are past its 64-token vocabulary: left out" in line for line in logs), logs
    files = {"drafter/model.onnx", "drafter/model.onnx.data", f"drafter/{HEAD_IDS_NAME}"}
    assert set(d.files) == files and d.bytes_on_disk == d.gpu_weight_bytes == sum(
        (stage / f).stat().st_size for f in files)
    assert d.head_source == "given" and d.cpu_resident_bytes == 7
    assert out.target.path == stage / "target" / "model.onnx" and out.tokenizer_dir == stage / "tokenizer"
    assert out.root == stage and not (stage / "drafter" / "genai_config.json").exists()
    stage, m = _stage(tmp_path / "edge")  # (the last kept id is the drafter's row count itself: left out)
    assert reduce_in_stage(stage, m, np.array([0, 5, 64])).drafter.head_size == 2


def test_head_source_names_every_corpus_path():
    """H2_41: a corpus of several paths was recorded as its first one alone."""
    from edgespec_export.head import head_source

    assert head_source(["docs", "src/a.py"]) == ("special tokens, then token frequency in docs, src/a.py, then BPE "
                                                 "merge order")
    assert head_source() == "special tokens, then BPE merge order (token id)"


# -- staged_rewrite on a bundle by hand ----------------------------------------------------------------------------

def _bundle(folder, tokenizer=b"{}", head_ids=None):
    """A bundle by hand: a manifest that loads (its files' sizes and hashes right) over files that are no models;
    returns the manifest's dict (a staged rewrite's ``build`` writes it as the stage's). ``head_ids``: the drafter's
    head is a reduced one, of these ids."""
    import copy
    import hashlib
    import io
    import json

    from edgespec.manifest import MANIFEST_NAME

    def put(rel, data):
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)
        return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    raw = {"schema_version": 1, "name": folder.name, "created": "2026-01-01T00:00:00Z", "sources": {"target": "x"},
           "tool_versions": {"edgespec": "0"}, "eos_token_ids": [2], "bos_token_id": 0, "add_bos": False,
           "chat_template": "{{ messages }}",
           "tokenizer": {"dir": "tokenizer", "vocab_size": 400,
                         "files": {"tokenizer/tokenizer.json": put("tokenizer/tokenizer.json", tokenizer)}},
           "models": {role: {**copy.deepcopy(MANIFEST_MODEL), "path": f"{role}/model.onnx",
                             "files": {f"{role}/model.onnx": put(f"{role}/model.onnx", role.encode() * 3)}}
                      for role in ("target", "drafter")}}
    if head_ids is not None:
        buf = io.BytesIO()
        np.save(buf, np.asarray(head_ids, dtype=np.int32))
        d = raw["models"]["drafter"]
        d["files"]["drafter/head_ids.npy"] = put("drafter/head_ids.npy", buf.getvalue())
        d.update(head_ids="drafter/head_ids.npy", head_size=len(head_ids))
    (folder / MANIFEST_NAME).write_text(json.dumps(raw))
    return raw


def _build(raw, made=None):
    import copy

    from edgespec.manifest import Manifest

    def build(stage):
        if made is not None:
            made(stage)
        return Manifest.from_dict(copy.deepcopy(raw), stage)
    return build


def test_a_new_bundle_over_a_folder_holding_the_source_is_refused_and_what_appears_meanwhile_is_not_replaced(
        tmp_path):
    """H2_59 (``-o`` a bundle that holds the source, with --force: replaced, and the source with it), H2_61 (an empty
    folder made at ``-o`` while the rewrite ran: the new bundle renamed over it, not refused)."""
    from edgespec.manifest import load_manifest
    from edgespec_export.head import staged_rewrite

    outer = tmp_path / "outer"
    _bundle(outer)
    src = outer / "models" / "b"
    raw = _bundle(src)
    with pytest.raises(ExportError, match="outer holds the export's input .*b; --force will not replace it$"):
        staged_rewrite(src, outer, True, _build(raw))  # (refused before the build: not "appeared while it ran")
    load_manifest(src)
    out = tmp_path / "new"
    with pytest.raises(ExportError, match="new exists; pass --force .*appeared while the export ran"):
        staged_rewrite(src, out, False, _build(raw, made=lambda stage: out.mkdir()))
    assert out.is_dir() and not any(out.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new", "outer"]


def test_an_in_place_rewrite_links_the_files_it_keeps_and_a_linked_files_mode_is_its_targets(tmp_path, monkeypatch):
    """H2_60 (an in-place rewrite copied every file, a copy of the whole bundle's size, where it hard-links those
    the build does not replace), H2_51 (a file system that refuses a hard link, EXDEV: the rewrite failed, not copied
    the file), H2_67 (a file that is a symbolic link in the source: its copy took the link's own
    mode, 0o777, not the file's)."""
    import stat

    from edgespec_export.head import staged_rewrite

    src = tmp_path / "b"
    raw = _bundle(src)
    before = (src / "target" / "model.onnx").stat().st_ino
    assert staged_rewrite(src, None, False, _build(raw)) == src.resolve()
    assert (src / "target" / "model.onnx").stat().st_ino == before
    outside = tmp_path / "notes.txt"
    outside.write_text("x")
    os.chmod(outside, 0o640)
    (src / "notes.txt").symlink_to(outside)
    out = staged_rewrite(src, tmp_path / "new", False, _build(raw))
    assert not (out / "notes.txt").is_symlink() and stat.S_IMODE((out / "notes.txt").stat().st_mode) == 0o640
    (src / "notes.txt").unlink()
    import errno

    from conftest import raising

    monkeypatch.setattr(os, "link", raising(OSError(errno.EXDEV, "Invalid cross-device link")))
    assert staged_rewrite(src, None, False, _build(raw)) == src.resolve()  # (no hard link: copied)
    assert (src / "target" / "model.onnx").read_bytes() == b"target" * 3


def test_a_failed_rewrite_says_a_full_disk_in_the_bundles_folder_and_runs_under_the_sigterm_guard(tmp_path):
    """H2_62 (the stage left by a failed rewrite), H2_63 (a full disk not said as one), H2_64 (what was kept said
    the other way round), H2_66 (the folder said being the bundle's own, not the one it is written in), H2_65 (the
    build not under the SIGTERM guard: a SIGTERM ended the process and left the stage)."""
    import errno
    import signal

    from edgespec.errors import NoSpaceError
    from edgespec_export.head import staged_rewrite

    src = tmp_path / "b"
    raw = _bundle(src)

    def full(stage):
        raise OSError(errno.ENOSPC, "No space left on device")

    for out, kept in ((None, "the bundle is unchanged"), (tmp_path / "new", "nothing was written")):
        with pytest.raises(NoSpaceError, match=rf"^no space left on device while writing the rewrite of {src} in "
                                               rf"{tmp_path}, .* free there now: {kept}$"):
            staged_rewrite(src, out, False, full)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]
    handlers = []
    staged_rewrite(src, None, False, _build(raw, made=lambda stage: handlers.append(signal.getsignal(signal.SIGTERM))))
    assert handlers and callable(handlers[0]) and handlers[0] is not signal.getsignal(signal.SIGTERM)


def test_inside_cwd_is_false_where_the_working_folder_is_gone(tmp_path, monkeypatch):
    """H2_69: a working folder removed meanwhile (``getcwd`` fails) was taken as inside every bundle: the warning
    that the shell's folder was replaced came for any in-place rewrite."""
    from edgespec_export.head import _inside_cwd

    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert not _inside_cwd(tmp_path / "b")


def test_a_dropped_hangups_exit_status_and_no_publish_after_a_dropped_sigterm(tmp_path, monkeypatch):
    """O2_37 (a SIGHUP whose exception a finalizer dropped raised again as a SIGTERM's, 143, not 129), O2_24 (publish
    not checking the flag: a rewrite whose SIGTERM was dropped published its bundle)."""
    import signal

    from edgespec.manifest import MANIFEST_NAME
    from edgespec_export import output as O

    monkeypatch.setattr(O, "terminated", False)
    monkeypatch.setattr(O, "signum", signal.SIGTERM)
    stage, out = tmp_path / "stage", tmp_path / "out"
    stage.mkdir()
    (stage / MANIFEST_NAME).write_text("new")
    with O.terminate_cleanly():
        O.terminated, O.signum = True, signal.SIGHUP  # (as the handler leaves them when its exception was dropped)
        with pytest.raises(O.Terminated) as e:
            O.raise_if_terminated()
        assert e.value.code == 129
        with pytest.raises(O.Terminated):
            O.publish(stage, out, False, [])
    assert stage.is_dir() and not out.exists()


def test_rerooted_moves_a_reduced_heads_ids_with_its_graph(tmp_path):
    """H2_50: exact-kernels' stage of a bundle whose drafter head is reduced kept the head ids' path in the source
    bundle (the new bundle's manifest named the old one's file)."""
    from edgespec_export.head import _rerooted

    src, stage = tmp_path / "b", tmp_path / ".b.partial-1"
    spec = _Spec(src / "drafter" / "model.onnx", 64, head_ids=src / "drafter" / "head_ids.npy")
    moved = _rerooted(spec, src, stage)
    assert moved.path == stage / "drafter" / "model.onnx" and moved.head_ids == stage / "drafter" / "head_ids.npy"
    assert _rerooted(None, src, stage) is None


def test_drafter_vocab_keeps_the_manifests_eos_and_bos_and_refuses_a_reduced_head_first(tmp_path, monkeypatch):
    """H2_55 (the manifest's eos and bos not given to the choice: a tokenizer whose eos is no added token lost it from
    the head), H2_54 (a head already reduced refused only inside the stage, after the copy, and without the bundle's
    name)."""
    import json

    from edgespec_export import head

    class Stop(Exception):
        pass

    got = {}

    def record(stage, manifest, ids, log=None, source=None):
        got.update(ids=ids.tolist(), source=source)
        raise Stop

    monkeypatch.setattr(head, "reduce_in_stage", record)
    tj = json.dumps({"model": {"type": "BPE", "vocab": {f"t{i}": i for i in range(400)}}, "added_tokens": []})
    b = tmp_path / "b"
    _bundle(b, tokenizer=tj.encode())
    with pytest.raises(Stop):
        head.apply_to_bundle(b, 3, tmp_path / "x", ranked=[5, 6, 7])
    assert got == {"ids": [0, 2, 5], "source": "special tokens, then a given ranking, then BPE merge order"}
    r = tmp_path / "r"
    _bundle(r, tokenizer=tj.encode(), head_ids=[0, 2, 5])
    with pytest.raises(ExportError, match=f"^the drafter's head in {r} is already reduced to 3 tokens; apply"):
        head.apply_to_bundle(r, 3, tmp_path / "y")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b", "r"]


def test_terminate_cleanly_gives_the_handlers_back(monkeypatch):
    """O2_42: the handlers the guard replaced were not put back: every SIGTERM after an export raised Terminated."""
    import signal

    from edgespec_export import output as O

    monkeypatch.setattr(O, "terminated", False)
    mine = lambda *a: None  # noqa: E731
    before = signal.signal(signal.SIGTERM, mine)
    try:
        with O.terminate_cleanly():
            assert signal.getsignal(signal.SIGTERM) is not mine
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)
