"""Gaps a second mutation test of ``edgespec/integrity.py``, ``edgespec/providers.py`` and
``edgespec/server_metrics.py`` found (docs/bench/mutation_harness/support_mut2.py, IN/PV/SM; session 98,
docs/bench/mutation_s98_support.md). No model is exported: the integrity tests build a bundle-shaped folder and a
manifest-shaped object of their own, the provider tests fake the build's providers, the metrics tests render
``Metrics`` from known stats."""
from __future__ import annotations

import pytest

from conftest import exposition


# -- server_metrics.py (SM) ------------------------------------------------------------------------------------------
_GAUGES = {"queue_depth": 0, "queue_capacity": 4, "generation_running": 0, "max_context": 256,
           "prompt_cache": {"bytes": 1, "budget": 2, "entries": 1, "evictions": 0}}


def test_metrics_are_typed_counter_or_gauge_as_prometheus_reads_them():
    """SM13-SM16: each ``*_total`` sample is typed a counter (a rate() over it needs that), every other one a gauge,
    and each sample has its TYPE."""
    from edgespec.server_metrics import Metrics

    m = Metrics(lambda: _GAUGES)
    m.generation({"finish_reason": "stop", "new_tokens": 3, "drafted_tokens": 2, "accepted_tokens": 1,
                  "target_calls": 2, "ttft_ms": 5, "tokens_per_second": 10.0}, 1.0, cancelled=False, failed=False)
    m.request("/health", 200)
    samples, types = exposition(m.render())
    names = {s.split("{")[0] for s in samples}
    assert names <= set(types), names - set(types)
    want = {n: "counter" if n.endswith("_total") else "gauge" for n in names}
    assert {n: types[n] for n in names} == want
    assert {"edgespec_acceptance_rate", "edgespec_queue_depth", "edgespec_prompt_cache_entries",
            "edgespec_prompt_cache_evictions_total", "edgespec_new_tokens_total"} <= names


def test_the_rates_keep_six_places():
    """SM11, SM12: the acceptance rate and the tokens per target call are said to six places, not two or none."""
    from edgespec.server_metrics import Metrics

    m = Metrics(lambda: {**_GAUGES, "prompt_cache": None})
    m.generation({"finish_reason": "stop", "new_tokens": 7, "drafted_tokens": 3, "accepted_tokens": 2,
                  "target_calls": 3}, 0.0, cancelled=False, failed=False)
    samples, _ = exposition(m.render())
    assert samples["edgespec_acceptance_rate"] == 0.666667
    assert samples["edgespec_tokens_per_target_call"] == 2.333333


def test_a_generation_whose_stats_lack_a_reason_or_a_rate_is_counted_without_error():
    """SM8, SM10: the server's stats summary says ``finish_reason: None`` where the engine gave none: counted as
    ``unknown``, not as a ``None`` label; a reply of several tokens without a rate (0: too slow to round) adds no decode
    time and raises nothing (it would be a division by zero inside the server's bookkeeping)."""
    from edgespec.server_metrics import Metrics

    m = Metrics(lambda: {**_GAUGES, "prompt_cache": None})
    m.generation({"finish_reason": None, "new_tokens": 4, "tokens_per_second": 0.0, "ttft_ms": 0.0}, 0.0,
                 cancelled=False, failed=False)
    m.generation({"finish_reason": "eos", "new_tokens": 5}, 0.0, cancelled=False, failed=False)
    samples, _ = exposition(m.render())
    assert samples['edgespec_generations_total{reason="unknown"}'] == 1
    assert samples['edgespec_generations_total{reason="eos"}'] == 1
    assert not any("None" in k for k in samples)
    assert samples["edgespec_decode_seconds_total"] == 0 and samples["edgespec_new_tokens_total"] == 9


# -- integrity.py (IN) -----------------------------------------------------------------------------------------------
_LOC = b"\n\x08location\x12"  # (what an ONNX graph's external-data entry "location" looks like in its bytes)


def _varint(n: int) -> bytes:
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def _graph_bytes(*names: bytes) -> bytes:
    return b"\x08\x07graph" + b"".join(b"\x1a\x04data" + _LOC + _varint(len(n)) + n + b"\x0a\x01x" for n in names)


def _bundle(tmp_path, name="b", *, locations=(b"model.onnx.data",), data_rel="target/model.onnx.data",
            tok_hashed=True, vocab=8, bos=0, eos=(1,)):
    """A bundle-shaped folder and a manifest-shaped object, as ``integrity.check_files`` reads them: a target graph
    whose bytes name its external data, the data file, a tokenizer.json (hashed in the manifest's table, or not: a
    bundle from before tokenizer hashes, checked by its fingerprint)."""
    import hashlib
    import json
    import os
    from types import SimpleNamespace

    from edgespec.tokenizer import tokenizer_fingerprint

    root = tmp_path / name
    tok_json = json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2}}}).encode()
    files = {"target/model.onnx": _graph_bytes(*locations), data_rel: os.urandom(4096),
             "tokenizer/tokenizer.json": tok_json}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    table = {rel: {"bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()} for rel, d in files.items()}
    tok = {"tokenizer/tokenizer.json": table.pop("tokenizer/tokenizer.json")}
    fingerprint = tokenizer_fingerprint(root / "tokenizer" / "tokenizer.json")[0]
    target = SimpleNamespace(role="target", path=(root / "target" / "model.onnx").resolve(), files=table,
                             vocab_size=vocab, tokenizer_sha256=fingerprint)
    m = SimpleNamespace(root=root, target=target, drafter=None, tokenizer_dir=root / "tokenizer",
                        tokenizer_files=tok if tok_hashed else {}, tokenizer_vocab_size=3 if tok_hashed else None,
                        tokenizer_special_past=0, bos_token_id=bos, eos_token_ids=tuple(eos),
                        models=lambda: (target,), relative=lambda p: os.path.relpath(p, os.path.realpath(root)))
    return m


@pytest.fixture
def hashed(tmp_path, monkeypatch):
    """Every file counts as a big one (hashed once, then trusted by its stamp, as a real model's weights are); the
    names of the files hashed, in order; a cache folder of the test's own."""
    from pathlib import Path

    from edgespec import integrity

    monkeypatch.setenv("EDGESPEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(integrity, "HASH_ON_LOAD_LIMIT", 0)
    monkeypatch.setattr(integrity, "_UNSAVED", set())
    seen, real = [], integrity.sha256_file
    monkeypatch.setattr(integrity, "sha256_file", lambda p: seen.append(Path(p).name) or real(p))
    return seen


def test_the_fake_bundle_passes_and_its_big_files_are_hashed_once_without_a_word(tmp_path, hashed):
    """IN17: the first load of a bundle with large files hashes them and records their stamps in a writable cache
    without a warning (the warning that they are hashed again at every load is for a cache that cannot be written);
    the next load hashes nothing. (The helper above is a bundle the checks take: each test below changes one thing of
    it.)"""
    import warnings

    from edgespec.integrity import check_files

    m = _bundle(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_files(m)
    assert sorted(hashed) == ["model.onnx", "model.onnx.data", "tokenizer.json"]
    hashed.clear()
    check_files(m)
    assert hashed == []


def test_an_empty_cache_dir_variable_is_the_default_cache(tmp_path, monkeypatch):
    """IN1, IN2: ``EDGESPEC_CACHE_DIR=`` (set, empty: an unset variable in a unit file or a compose file) means the
    default ``~/.cache/edgespec``, not the current folder."""
    from edgespec.integrity import cache_root

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("EDGESPEC_CACHE_DIR", "")
    assert cache_root() == tmp_path / "home" / ".cache" / "edgespec"
    monkeypatch.delenv("EDGESPEC_CACHE_DIR")
    assert cache_root() == tmp_path / "home" / ".cache" / "edgespec"


def test_a_cache_file_too_big_or_too_deep_is_learned_again(tmp_path):
    """IN7, IN8: a cache file over 1 MiB is not read whole (it is taken as empty, as a truncated one is); one nested
    deeper than Python's parser goes (RecursionError) is taken as empty too, not a traceback at every load."""
    import json

    from edgespec.integrity import read_json_cache

    big = tmp_path / "big.json"
    big.write_text(json.dumps({"k": "x" * (1 << 20)}))
    assert read_json_cache(big) == {}
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 200_000 + "]" * 200_000)
    assert read_json_cache(deep) == {}
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({"k": [1, 2]}))
    assert read_json_cache(ok) == {"k": [1, 2]}


def test_a_cache_write_that_fails_midway_leaves_the_old_cache_whole(tmp_path, monkeypatch):
    """IN13: a cache is written to a temporary file and renamed over the old one: a write that fails part way (a full
    disk) leaves the old cache as it was and no temporary file, and says why."""
    import json
    import pathlib

    from edgespec.integrity import read_json_cache, write_json_cache

    p = tmp_path / "c.json"
    assert write_json_cache(p, {"old": 1}) is None and read_json_cache(p) == {"old": 1}
    real = pathlib.Path.write_text

    def full(self, text, *a, **k):
        real(self, text[:3], *a, **k)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pathlib.Path, "write_text", full)
    assert write_json_cache(p, {"new": 2}) == "No space left on device"
    monkeypatch.undo()
    assert json.loads(p.read_text()) == {"old": 1} and [q.name for q in tmp_path.iterdir()] == ["c.json"]


def test_a_bundle_named_by_another_path_keeps_its_stamps(tmp_path, hashed, monkeypatch):
    """IN14: the stamps are kept by the bundle's real folder: the same bundle named by a relative path or through a
    symbolic link is not hashed again (a model's GBs)."""
    import os
    from types import SimpleNamespace

    from edgespec.integrity import check_files

    m = _bundle(tmp_path)
    check_files(m)
    assert "model.onnx.data" in hashed
    (tmp_path / "link").symlink_to(m.root)
    monkeypatch.chdir(tmp_path)
    for root in (m.root.relative_to(tmp_path), tmp_path / "link"):
        hashed.clear()
        check_files(SimpleNamespace(**{**vars(m), "root": root,
                                       "relative": lambda p: os.path.relpath(p, os.path.realpath(m.root))}))
        assert hashed == [], root


def test_a_bundle_of_small_files_warns_of_no_unwritable_stamps(tmp_path, monkeypatch):
    """IN15: where the stamp cache cannot be written, a load that has nothing to stamp (every file small enough to
    hash at each load) says nothing: the warning that large files are hashed again at every load is for bundles that
    have some."""
    import warnings

    from edgespec import integrity

    (tmp_path / "afile").write_text("")
    monkeypatch.setenv("EDGESPEC_CACHE_DIR", str(tmp_path / "afile"))
    monkeypatch.setattr(integrity, "_UNSAVED", set())
    m = _bundle(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        integrity.check_files(m)
    monkeypatch.setattr(integrity, "HASH_ON_LOAD_LIMIT", 0)
    with pytest.warns(UserWarning, match="cannot record the verified files"):
        integrity.check_files(m)


def test_a_link_to_a_sibling_folder_that_begins_with_the_bundles_name_is_outside(tmp_path, hashed):
    """IN19: "inside the bundle" is by path components: a tokenizer.json linked into ``<bundle>-other/`` (a folder
    beside the bundle whose name begins with the bundle's) is outside it, though the path begins the same."""
    import shutil

    from edgespec.errors import BundleError
    from edgespec.integrity import check_files

    m = _bundle(tmp_path)
    tj = m.root / "tokenizer" / "tokenizer.json"
    other = tmp_path / (m.root.name + "-other")
    other.mkdir()
    shutil.move(tj, other / "tokenizer.json")
    tj.symlink_to(other / "tokenizer.json")
    with pytest.raises(BundleError, match="tokenizer/tokenizer.json points outside the bundle directory"):
        check_files(m)


@pytest.mark.parametrize("how", ["not utf-8", "absolute", "long"])
def test_external_data_names_of_any_bytes_absolute_or_long(tmp_path, hashed, how):
    """IN27, IN28, IN37: an external-data name that is not UTF-8 is a one-line BundleError (it is no file of the
    manifest's), not a UnicodeDecodeError; an absolute name is refused even where it leads into the bundle (the
    bundle would load only where it was made); a long relative name (300 bytes of folders) inside the bundle is read
    whole and taken."""
    from edgespec.errors import BundleError
    from edgespec.integrity import check_files

    if how == "not utf-8":
        m = _bundle(tmp_path, locations=(b"model.onnx.data", b"w\xff\xfe.data"))
        with pytest.raises(BundleError, match="external data 'w\ufffd\ufffd.data' is not among the manifest's files"):
            check_files(m)
    elif how == "absolute":
        absolute = str((tmp_path / "b" / "target" / "model.onnx.data").resolve()).encode()
        m = _bundle(tmp_path, locations=(absolute,))
        with pytest.raises(BundleError, match="external data '/.*model.onnx.data' points outside the bundle"):
            check_files(m)
    else:
        rel = "/".join(["d" * 20] * 14) + "/w.data"
        assert len(rel) > 256
        m = _bundle(tmp_path, locations=(rel.encode(),), data_rel="target/" + rel)
        check_files(m)


def test_an_empty_graph_file_names_no_external_data(tmp_path):
    """IN26: a graph file of no bytes (a copy cut short) is read as naming no external data (mmap refuses an empty
    file with a ValueError)."""
    from edgespec.integrity import external_locations

    (tmp_path / "model.onnx").write_bytes(b"")
    assert external_locations(tmp_path / "model.onnx") == []


@pytest.mark.parametrize("text", ["[1, 2]", '{"model": [1]}', '"just a string"'])
def test_an_old_bundles_tokenizer_json_of_another_shape_is_one_line(tmp_path, hashed, text):
    """IN31: a bundle from before tokenizer hashes whose tokenizer.json is JSON of another shape (a list, a model that
    is a list, a string) is a one-line BundleError naming the file, not a traceback from the fingerprint."""
    from edgespec.errors import BundleError
    from edgespec.integrity import check_files

    m = _bundle(tmp_path, tok_hashed=False)
    (m.root / "tokenizer" / "tokenizer.json").write_text(text)
    with pytest.raises(BundleError, match="tokenizer/tokenizer.json is unreadable"):
        check_files(m)


def test_an_old_bundles_tokenizer_fingerprint_is_taken_once_until_the_file_changes(tmp_path, hashed, monkeypatch):
    """IN32: a bundle from before tokenizer hashes has its tokenizer.json fingerprinted (parsed whole: tens of MB for
    a large vocabulary) at its first load only, then trusted by its stamp; changed, it is read again and refused."""
    import json

    from edgespec import tokenizer
    from edgespec.errors import BundleError
    from edgespec.integrity import check_files

    m = _bundle(tmp_path, tok_hashed=False)
    calls, real = [], tokenizer.tokenizer_fingerprint
    monkeypatch.setattr(tokenizer, "tokenizer_fingerprint", lambda p: calls.append(p) or real(p))
    check_files(m)
    check_files(m)
    assert len(calls) == 1
    (m.root / "tokenizer" / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": {"z": 0}}}))
    with pytest.raises(BundleError, match="not the tokenizer the models were exported with"):
        check_files(m)
    assert len(calls) == 2


def test_every_end_token_is_checked_against_the_vocabulary(tmp_path, hashed):
    """IN34: each of a bundle's end tokens must be an id of the graph's vocabulary, not the first alone."""
    from edgespec.errors import BundleError
    from edgespec.integrity import check_files

    check_files(_bundle(tmp_path, "ok", eos=(1, 7)))
    with pytest.raises(BundleError, match=r"eos_token_ids 8 is outside the target's vocabulary \(0\.\.7\)"):
        check_files(_bundle(tmp_path, "bad", eos=(1, 8)))


def test_files_verified_before_a_refusal_are_not_hashed_again(tmp_path, hashed):
    """IN40: a load refused for a later reason (an end token past the vocabulary) keeps the stamps of the large
    files it had hashed: loaded again once the manifest is mended, they are not hashed again."""
    from edgespec.errors import BundleError
    from edgespec.integrity import check_files

    m = _bundle(tmp_path, eos=(99,))
    with pytest.raises(BundleError, match="eos_token_ids 99"):
        check_files(m)
    assert "model.onnx.data" in hashed
    hashed.clear()
    m.eos_token_ids = (1,)
    check_files(m)
    assert hashed == []


def test_a_file_whose_sha256_is_empty_is_checked_by_its_size_alone(tmp_path, hashed):
    """IN21: a manifest's ``"sha256": ""`` (a file listed without a hash, as an absent sha256) is checked by its size,
    not hashed and refused as not matching an empty hash."""
    from edgespec.errors import BundleError
    from edgespec.integrity import check_files

    m = _bundle(tmp_path)
    m.target.files["target/model.onnx.data"]["sha256"] = ""
    check_files(m)
    assert "model.onnx.data" not in hashed
    m.target.files["target/model.onnx.data"]["bytes"] += 1
    with pytest.raises(BundleError, match="target/model.onnx.data has 4096 bytes, manifest says 4097"):
        check_files(m)


# -- providers.py (PV) -----------------------------------------------------------------------------------------------
def test_an_unknown_provider_is_refused_with_every_name_to_choose_from():
    """PV2: the refusal of an unknown provider lists every short name a user may give, tensorrt included."""
    from edgespec.errors import ProviderError
    from edgespec.providers import canonical

    with pytest.raises(ProviderError) as e:
        canonical("rocm")
    assert str(e.value) == "unknown execution provider 'rocm'; choose from cpu, cuda, tensorrt"


def test_a_missing_providers_words_name_the_build_and_what_runs():
    """PV8: a provider this build lacks, named on the command line, is refused with the build's providers as a list
    of names (not a Python list's repr); asked by a profile, the warning says what was asked, what is missing, what
    the build has and what runs."""
    from edgespec.errors import ProviderError
    from edgespec.providers import CPU, CUDA, choose

    with pytest.raises(ProviderError) as e:
        choose(["cuda"], explicit=True, available=["AzureExecutionProvider", CPU])
    assert str(e.value) == ("execution provider 'cuda' was asked for but this onnxruntime build has only "
                            "AzureExecutionProvider, CPUExecutionProvider; install onnxruntime-gpu (see README)")
    c = choose(["tensorrt", "cuda"], available=[CUDA, CPU], warn=False)
    assert c.warnings == ["asked for tensorrt, cuda; this onnxruntime build lacks tensorrt (it has "
                          "CUDAExecutionProvider, CPUExecutionProvider), so cuda runs; install onnxruntime-gpu for "
                          "cuda/tensorrt"]


def test_the_tensorrt_cache_folder_is_reused_and_its_fallback_is_said(tmp_path, monkeypatch, caplog):
    """PV14-PV18: a bundle's ``.trt_cache`` is made once and reused (a second load does not fall back); where it cannot
    be made the engines go to ``$XDG_CACHE_HOME/edgespec/trt/<bundle>`` (``~/.cache`` without XDG_CACHE_HOME), named by
    the bundle's real folder even when given as ``.``, and the warning says where."""
    from pathlib import Path

    from edgespec.providers import trt_cache_dir

    b = tmp_path / "qwen-b"
    b.mkdir()
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with caplog.at_level("WARNING", logger="edgespec"):
        assert trt_cache_dir(b) == b / ".trt_cache" == trt_cache_dir(b)
    assert caplog.text == "" and (b / ".trt_cache").is_dir()
    ro = tmp_path / "ro-bundle"
    ro.mkdir()
    (ro / ".trt_cache").write_text("")  # (a file where the folder would be: it cannot be made)
    monkeypatch.chdir(ro)
    with caplog.at_level("WARNING", logger="edgespec"):
        d = trt_cache_dir(Path("."))
    assert d == tmp_path / "home" / ".cache" / "edgespec" / "trt" / "ro-bundle" and d.is_dir()
    assert f"TensorRT engines are cached in {d}" in caplog.text
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert trt_cache_dir(ro) == tmp_path / "xdg" / "edgespec" / "trt" / "ro-bundle"


