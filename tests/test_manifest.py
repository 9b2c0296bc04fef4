"""The manifest schema (edgespec/manifest.py): what the exporter writes (``to_dict``) is what the
runtime reads (``from_dict``), bundles written before the schema was typed still load, and every
bad field is a ``ManifestError`` that names it."""
from __future__ import annotations

import copy
import shutil
from pathlib import Path
import json

import pytest
from click.testing import CliRunner

from edgespec.cli import main
from edgespec.errors import BundleError, ManifestError, TokenizerMismatchError
from edgespec.manifest import (Manifest, ModelIO, ModelSpec, Quality, Quantization, Validation, load_manifest,
                               write_manifest)

_IO = {"input_ids": "input_ids", "attention_mask": "attention_mask", "position_ids": None,
       "past_key": "past_key_values.%d.key", "past_value": "past_key_values.%d.value",
       "present_key": "present.%d.key", "present_value": "present.%d.value", "logits": "logits"}


def _old_entry(role: str, precision: str, quant: dict, validation: dict, quality: dict) -> dict:
    """A model entry exactly as export/bundle.py wrote it before the schema was typed (no CPU
    measurement, the GPU copy size under 'resident_bytes')."""
    return {
        "path": f"{role}/model.onnx", "architecture": "qwen2", "precision": precision, "quant": quant,
        "num_layers": 2, "num_kv_heads": 1, "head_dim": 16, "hidden_size": 32, "num_attention_heads": 2,
        "vocab_size": 300, "max_context": 512, "kv_dtype": "float32", "io": dict(_IO), "tokenizer_sha256": "ab" * 32,
        "files": {f"{role}/model.onnx": {"bytes": 1000, "sha256": "cd" * 32},
                  f"{role}/model.onnx.data": {"bytes": 9000, "sha256": "ef" * 32}},
        "resident_bytes": 11000, "params": 12345,
        "operators": {"GroupQueryAttention": 2, "MatMulNBits": 14} if precision == "int4" else {"MatMul": 15},
        "validation": validation, "quality": quality,
    }


OLD = {
    "schema_version": 1, "name": "old-bundle", "created": "2025-01-02T03:04:05Z",
    "sources": {"target": "some/target", "drafter": "some/drafter"},
    "tool_versions": {"edgespec": "0.1.0", "onnxruntime": "1.31.0"},
    "eos_token_ids": [2, 7], "bos_token_id": 1, "add_bos": False, "chat_template": "{{ messages }}",
    "tokenizer": {"dir": "tokenizer", "sha256": "ab" * 32, "vocab_size": 290},
    "models": {
        "target": _old_entry(
            "target", "int4",
            # QuantOptions.to_dict of that version; 'symmetric' was null for a while
            {"block_size": 32, "symmetric": None, "accuracy_level": 4, "quantize_lm_head": True,
             "quantize_embeddings": False, "algorithm": "rtn"},
            {"max_abs_logit_diff": {"prefill": 0.5, "decode": 0.25, "verify": 0.5, "rewind": 0.125},
             "top1_agreement": 0.95, "positions": 120, "tolerance": None, "passed": True},
            {"perplexity_torch": 3.5, "perplexity": 3.75, "perplexity_delta": 0.25, "top1_agreement": 0.9,
             "mean_kl": 0.01, "greedy_match_tokens": [24, 12], "greedy_match_of": 24, "tokens": 600}),
        "drafter": _old_entry(
            "drafter", "fp32", {},
            {"max_abs_logit_diff": {"prefill": 1e-5}, "top1_agreement": 1.0, "positions": 120, "tolerance": 0.01,
             "passed": True},
            {"perplexity_torch": 5.0, "perplexity": 5.0, "perplexity_delta": 0.0, "top1_agreement": 1.0,
             "mean_kl": 0.0, "greedy_match_tokens": [24, 24], "greedy_match_of": 24, "tokens": 600,
             "greedy_agreement_with_target": 0.75, "agreement_tokens": 192}),
    },
}

# a kernels_check record as exact-kernels writes it
KCHECK = {"max_abs_logit_diff": 0.5, "logit_scale": 20.0, "top1_agreement": 0.98, "positions": 45}


def test_a_manifest_of_the_previous_version_loads(tmp_path):
    m = Manifest.from_dict(copy.deepcopy(OLD), tmp_path)
    t, d = m.target, m.drafter
    assert (m.name, m.eos_token_ids, m.bos_token_id, m.chat_template) == ("old-bundle", (2, 7), 1, "{{ messages }}")
    assert m.tokenizer_dir == (tmp_path / "tokenizer").resolve() and m.tokenizer_vocab_size == 290
    assert m.created == "2025-01-02T03:04:05Z" and m.sources["drafter"] == "some/drafter"
    assert m.tool_versions == {"edgespec": "0.1.0", "onnxruntime": "1.31.0"}
    assert t.path == (tmp_path / "target" / "model.onnx").resolve() and t.io == ModelIO(**_IO)
    assert t.bytes_on_disk == 10000 and t.gpu_weight_bytes == 11000  # read from 'resident_bytes'
    assert t.cpu_resident_bytes is None and t.embedding_bytes == 0 and t.weight_bytes(False, 512) == 11000
    assert t.num_attention_heads == 2 and t.params == 12345 and t.operators["MatMulNBits"] == 14
    assert t.quant == Quantization(block_size=32, accuracy_level=4, quantize_lm_head=True,
                                   quantize_embeddings=False, algorithm="rtn")
    assert t.validation.passed and t.validation.tolerance is None and t.validation.max_abs_logit_diff["verify"] == 0.5
    assert t.quality.greedy_match_tokens == (24, 12) and t.quality.greedy_agreement_with_target is None
    assert not d.quant and d.validation.tolerance == 0.01 and d.quality.agreement_tokens == 192
    # and it reads back unchanged once written in the current shape
    assert Manifest.from_dict(m.to_dict(), tmp_path) == m


def test_gpu_weight_bytes_fall_back_to_the_file_sizes(tmp_path):
    old = copy.deepcopy(OLD)
    del old["models"]["target"]["resident_bytes"]
    assert Manifest.from_dict(old, tmp_path).target.gpu_weight_bytes == 10000
    old["models"]["target"]["gpu_weight_bytes"] = 4000  # the new key wins over the file sizes
    assert Manifest.from_dict(old, tmp_path).target.gpu_weight_bytes == 4000


def test_round_trip_with_every_field(tmp_path):
    spec = ModelSpec(
        role="target", path=(tmp_path / "target" / "model.onnx").resolve(), architecture="llama", precision="fp8",
        num_layers=3, num_kv_heads=1, head_dim=8, hidden_size=16, vocab_size=100, max_context=64,
        kv_dtype="float16", io=ModelIO(**dict(_IO, position_ids="position_ids")), tokenizer_sha256="01" * 32,
        files={"target/model.onnx": {"bytes": 10, "sha256": "23" * 32}}, bytes_on_disk=10, gpu_weight_bytes=12,
        quant=Quantization(format="float8e4m3fn", scheme="block", block_size=16, matmuls=7, lm_head=True,
                           weight_bytes=900, relative_weight_error=0.03),
        validation=Validation(max_abs_logit_diff={"prefill": 0.1}, top1_agreement=0.97, positions=90,
                              tolerance=None, passed=True),
        quality=Quality(perplexity_torch=2.0, perplexity=2.1, perplexity_delta=0.1, top1_agreement=0.95,
                        mean_kl=0.002, greedy_match_tokens=(3, 24), greedy_match_of=24, tokens=300),
        params=777, num_attention_heads=4, operators={"DequantizeLinear": 7, "MatMul": 7},
        cpu_resident_bytes=5000, embedding_bytes=6400, embedding_row_bytes=64, kv_layers=((1, 8), (2, 16), (1, 8)),
        kv_sources=(0, 1, 0),
        # (session 77, a mutation test: each of these was dropped from to_dict unnoticed)
        head_ids=(tmp_path / "target" / "model.onnx").resolve(), head_size=40, head_source="a test",
        kernels="edgespec-q4", kernel_features=("attention-window",), attention_pad=1, attention_window=16,
        kernels_check=dict(KCHECK))
    assert ModelSpec.from_dict(spec.to_dict(tmp_path), tmp_path, "target") == spec
    # (float16 caches; layer 2 uses layer 0's buffer)
    assert spec.kv_shape(1) == (2, 16) and spec.kv_source(2) == 0 and spec.kv_bytes_per_token == 2 * (8 + 32) * 2
    drafter = ModelSpec.from_dict(dict(spec.to_dict(tmp_path), path="drafter/model.onnx"), tmp_path, "drafter")
    m = Manifest(root=tmp_path, name="all", target=spec, drafter=drafter, eos_token_ids=(5,), bos_token_id=None,
                 add_bos=True, chat_template=None, tokenizer_dir=(tmp_path / "tok").resolve(),
                 tool_versions={"onnx": "1.17"}, created="2026-01-01T00:00:00Z", sources={"target": "t"},
                 tokenizer_vocab_size=99, source_files={"target": {"t.gguf": {"bytes": 7, "sha256": "a" * 64}}},
                 tokenizer_special_past=2, sampling_defaults={"temperature": 0.7, "top_k": 20})
    d = m.to_dict()
    assert json.loads(json.dumps(d)) == d  # plain JSON
    assert Manifest.from_dict(d, tmp_path) == m
    write_manifest(m)
    assert Manifest.from_dict(json.loads((tmp_path / "edgespec.json").read_text()), tmp_path) == m


def test_what_export_writes_is_to_dict(tiny_bundle):
    """The exporter writes the schema's to_dict: the file on disk is the typed manifest, key for key."""
    m = load_manifest(tiny_bundle)
    on_disk = json.loads((tiny_bundle / "edgespec.json").read_text())
    assert on_disk == m.to_dict()
    assert Manifest.from_dict(on_disk, tiny_bundle) == m
    assert "resident_bytes" not in on_disk["models"]["target"]
    assert on_disk["models"]["target"]["gpu_weight_bytes"] == m.target.bytes_on_disk


def test_export_records_the_source_files_sha256(tiny_bundle, tiny_dirs):
    """(session 55) The manifest said which path a bundle came from, not which weights: a path is one machine's, and
    the files there change. ``source_files`` has each source file's size and sha256 (what a Hugging Face model page
    lists for its weight files), as the export read them; info shows the weights' digests."""
    import hashlib

    m = load_manifest(tiny_bundle)
    assert set(m.source_files) == {"target", "drafter"}
    for role, folder in (("target", tiny_dirs["qwen2"]), ("drafter", tiny_dirs["drafter"])):
        files = sorted(f for f in Path(folder).iterdir() if f.is_file() and not f.name.startswith("."))
        assert sorted(m.source_files[role]) == [f.name for f in files] and "config.json" in m.source_files[role]
        for f in files:
            assert m.source_files[role][f.name] == {"bytes": f.stat().st_size,
                                                    "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
    r = CliRunner().invoke(main, ["info", str(tiny_bundle)])
    assert r.exit_code == 0, r.output
    weights = max(m.source_files["target"].items(), key=lambda kv: kv[1]["bytes"])
    shown = f"target source file {weights[0]} ({weights[1]['bytes']:,} bytes) sha256 {weights[1]['sha256']}"
    assert (shown in r.output) == (weights[1]["bytes"] >= 1 << 20), r.output
    assert "target source:" in r.output and "info --json lists them" in r.output


def test_info_s_report_lines_say_every_field_and_what_is_missing():
    """(session 84, a mutation test of cli_info.py) `info`'s validation and quality lines, field by field: a failed
    validation's ✗, the worst phase's |Δlogit|, the tolerance, the weights not mapped, a perplexity change's sign
    (+0.0 too), a drafter agreement of 0 (shown, not taken for missing), and each report that lacks a field said
    as incomplete rather than printed as None. The tiny bundles' reports had no such values: 11 of 15 mutants
    lived."""
    from edgespec.cli_info import report_lines
    from edgespec.manifest import Quality, Validation

    v = Validation(max_abs_logit_diff={"prefill": 0.0123, "decode": 0.5}, top1_agreement=0.93, positions=71,
                   tolerance=0.001, passed=False, weights_checked=142, weights_unmapped=2, weight_error=0.172)
    q = Quality(perplexity_torch=10.4, perplexity=11.2, perplexity_delta=0.8, top1_agreement=0.81, mean_kl=0.12,
                greedy_match_tokens=(24, 0), greedy_match_of=24, tokens=795, greedy_agreement_with_target=0.0,
                agreement_tokens=192)
    assert report_lines(v, q) == [
        "validation vs torch: ✗ max |Δlogit| 0.5 (tolerance 0.001), top-1 0.930 over 71 positions",
        "weights vs torch: 142 matrices, worst relative difference 0.172; 2 not mapped",
        "quality: perplexity 10.4 -> 11.2 (Δ +0.8), top-1 0.81, KL 0.12, greedy match [24, 0]/24 (795 tokens scored)",
        "predicted greedy acceptance (agreement with target): 0.0 over 192 tokens"]
    # a report short of fields: its differences without a top-1, no weight error (NaN in the export), 0 weights
    # compared, a quality report without its KL
    v = Validation(max_abs_logit_diff={"prefill": 0.1}, passed=True, weights_checked=0)
    q = Quality(perplexity_torch=10.4, perplexity=10.1, perplexity_delta=-0.3, top1_agreement=0.9,
                greedy_match_tokens=(8,), greedy_match_of=8)
    assert report_lines(v, q) == ["validation vs torch: ✓ (details missing from the manifest)",
                                  "weights vs torch: 0 matrices, worst relative difference not a number",
                                  "quality: (report incomplete in the manifest)"]
    q = Quality(perplexity_torch=10.4, perplexity=10.4, perplexity_delta=0.0, top1_agreement=0.9, mean_kl=0.01,
                greedy_match_tokens=(8,), greedy_match_of=8)
    assert report_lines(Validation(), q) == ["quality: perplexity 10.4 -> 10.4 (Δ +0.0), top-1 0.9, KL 0.01, "
                                             "greedy match [8]/8"]


def test_info_reads_what_export_records(tiny_bundle):
    r = CliRunner().invoke(main, ["info", str(tiny_bundle)])
    assert r.exit_code == 0, r.output
    m = load_manifest(tiny_bundle)
    assert f"from target {m.sources['target']}, drafter {m.sources['drafter']}" in r.output
    assert f"onnxruntime {m.tool_versions['onnxruntime']}" in r.output
    assert f"{m.target.num_attention_heads} attention heads" in r.output
    assert f"GroupQueryAttention {m.target.num_layers}" in r.output
    assert f"over {m.target.validation.positions} positions" in r.output
    assert f"over {m.drafter.quality.agreement_tokens} tokens" in r.output
    assert json.loads(CliRunner().invoke(main, ["info", str(tiny_bundle), "--json"]).output) == m.to_dict()


@pytest.mark.parametrize("path, value, match", [
    (("models", "target", "quant", "block_size"), "32", r"models\.target\.quant\.block_size"),
    (("models", "target", "quant", "symmetric"), 1, r"models\.target\.quant\.symmetric"),
    (("models", "target", "validation", "passed"), "yes", r"models\.target\.validation\.passed"),
    (("models", "target", "validation", "max_abs_logit_diff"), [0.5], r"models\.target\.validation\.max_abs_logit"),
    (("models", "drafter", "quality", "greedy_match_tokens"), [1, "2"], r"models\.drafter\.quality\.greedy_match"),
    (("models", "drafter", "quality", "mean_kl"), True, r"models\.drafter\.quality\.mean_kl"),
    (("models", "target", "operators"), {"MatMul": 1.5}, r"models\.target\.operators"),
    (("models", "target", "gpu_weight_bytes"), -1, r"models\.target\.gpu_weight_bytes"),
    (("models", "target", "num_attention_heads"), "2", r"models\.target\.num_attention_heads"),
    (("models", "target", "precision"), "int3", r"models\.target\.precision 'int3'"),
    (("models", "target", "files", "target/model.onnx", "sha256"), 5, r"models\.target\.files"),
    (("tokenizer", "vocab_size"), "many", r"manifest\.tokenizer\.vocab_size"),
    (("sources",), ["t"], r"manifest\.sources"),
    (("source_files",), ["t"], r"manifest\.source_files"),
    # (session 55, a review) integers past a float's range were OverflowError tracebacks (the kernels' check, plan)
    (("models", "target", "num_layers"), 10 ** 400, r"manifest\.models\.target\.num_layers is out of range"),
    (("models", "target", "validation", "top1_agreement"), -10 ** 400, r"validation\.top1_agreement is out of range"),
    (("tool_versions",), {"x": [2 ** 63]}, r"manifest\.tool_versions\.x\[0\] is out of range"),
    (("source_files",), {"target": ["a"]}, r"source_files\['target'\] must be an object"),
    (("source_files",), {"target": {"m.gguf": {"bytes": 5, "sha256": "abc"}}}, r"source_files\['target'\]\['m\.gguf'\]"),
    (("source_files",), {"target": {"m.gguf": {"bytes": True, "sha256": "0" * 64}}}, r"needs 'bytes'"),
    (("bos_token_id",), "1", r"manifest\.bos_token_id"),
    (("name",), 3, r"manifest\.name"),
    # (session 48) a pad that leaves no context: load made a cache of negative length (a traceback)
    (("models", "target", "attention_pad"), 511, r"models\.target\.attention_pad 511 leaves no context"),
    # (session 59) each layer's cache shape (Gemma 4): one positive pair per layer
    (("models", "target", "kv_layers"), [[2, 64]], r"models\.target\.kv_layers must be \d+ pairs"),
    (("models", "target", "kv_layers"), "wide", r"models\.target\.kv_layers must be"),
    (("models", "target", "kv_sources"), [0, 0, 1], r"models\.target\.kv_sources must be \d+ layer indices"),
    (("models", "target", "kv_sources"), [1, 1], r"models\.target\.kv_sources must be"),
    # (session 77, a mutation test of manifest.py: each row below loaded with its check taken out)
    (("models", "target", "quant"), [1], r"models\.target\.quant must be an object"),
    (("models", "target", "conv_layers"), [[0, 4, 3], [0, 4, 3]], r"conv_layers must be .*each layer once"),
    (("models", "target", "conv_layers"), [[2, 4, 3]], r"conv_layers must be .*below 2"),
    (("models", "target", "conv_layers"), [[0, 4, 3]], r"has conv_layers but its io names no past_conv"),
    (("models", "target", "kernels"), "cuda-q4", r"models\.target\.kernels 'cuda-q4' is not one of"),
    (("models", "target", "kernels_check"), dict(KCHECK, max_abs_logit_diff=float("inf")),
     r"kernels_check\.max_abs_logit_diff must be a finite number >= 0, got inf"),
    (("models", "target", "kernels_check"), dict(KCHECK, top1_agreement=-0.5),
     r"kernels_check\.top1_agreement must be a finite number >= 0, got -0\.5"),
    (("models",), {}, r"no target model"),
    (("schema_version",), 2, r"schema_version 2 is not supported"),
    (("eos_token_ids",), [2, "7"], r"eos_token_ids must be a list of integers"),
    (("eos_token_ids",), [2, True], r"eos_token_ids must be a list of integers"),
    (("models", "drafter"), {}, r"models\.drafter lacks 'path'"),  # ({} or 0 is not "no drafter")
    (("models", "drafter"), 0, r"models\.drafter must be an object"),
    (("models", "target", "path"), "target/model\x00.onnx", r"holds a NUL character: not a path"),
    (("models", "target", "files", "target/model.onnx", "bytes"), "1000", r"files\['target/model\.onnx'\] needs 'bytes'"),
    (("source_files",), {"target": {"m.gguf": {"bytes": -1, "sha256": "0" * 64}}}, r"needs 'bytes' \(a count\)"),
    (("models", "target", "head_dim"), 0, r"models\.target\.head_dim must be positive, got 0"),
    (("models", "target", "kv_layers"), [[1, 16], [0, 16]], r"models\.target\.kv_layers must be 2 pairs"),
    (("models", "target", "head_size"), 5, r"models\.target\.head_size without head_ids"),
    (("models", "target", "io", "past_key"), "past.%d.%s", r"io\.past_key must contain one %d"),
    (("models", "target", "io", "present_value"), "present_%%d", r"io\.present_value must contain one %d"),
    # (session 100, a second mutation test of manifest.py: each row below loaded, or raised an untyped error, with its
    # check taken out)
    (("source_files",), {"target": {"m.gguf": {"bytes": 5, "sha256": "0" * 65}}}, r"source_files\['target'\]"),
    (("models", "target", "quant"), "", r"models\.target\.quant must be an object"),
    (("models", "target", "io", "position_ids"), 5, r"models\.target\.io\.position_ids has the wrong type \(int\)"),
    (("models", "target", "io", "row_positions"), ["r"], r"models\.target\.io\.row_positions has the wrong type"),
    (("models", "target", "conv_layers"), [[0, 4, 0]], r"conv_layers must be \[layer, channels, state length\]"),
    (("models", "target", "conv_layers"), [], r"conv_layers must be \[layer, channels, state length\]"),
    (("models", "target", "kv_layers"), [[1, 16, 2], [1, 16, 2]], r"models\.target\.kv_layers must be 2 pairs"),
    (("models", "target", "kv_layers"), [[True, 16], [1, 16]], r"models\.target\.kv_layers must be 2 pairs"),
    (("models", "target", "kv_sources"), [0, True], r"models\.target\.kv_sources must be 2 layer indices"),
    (("models", "target", "kernel_features"), [1], r"kernel_features must be a list of strings"),
    (("chat_template",), 5, r"manifest\.chat_template has the wrong type"),
])
def test_bad_fields_are_named(tmp_path, path, value, match):
    raw = copy.deepcopy(OLD)
    d = raw
    for k in path[:-1]:
        d = d[k]
    d[path[-1]] = value
    with pytest.raises(ManifestError, match=match):
        Manifest.from_dict(raw, tmp_path)


@pytest.mark.parametrize("edits, match", [
    # (session 77, a mutation test of manifest.py) what one field alone cannot say
    ({"num_layers": 3, "kv_sources": [0, 0, 1]}, r"kv_sources must be 3 layer indices, each the layer itself or an "
                                                 r"earlier one with its own KV cache"),  # (layer 1 has none of its own)
    ({"kv_layers": [[1, 16], [2, 16]], "kv_sources": [0, 0]}, r"kv_sources must be .*of the same shape"),
    ({"head_ids": "target/model.onnx", "head_size": 300}, r"models\.target\.head_size must be in 1\.\.299, got 300"),
    ({"head_ids": "target/head_ids.npy", "head_size": 10}, r"head_ids 'target/head_ids\.npy' is not one of its files"),
    ({"kv_dtype": "int8", "layout": "cuda", "head_dim": 32}, r"kv_dtype int8 needs the cpu layout"),
    # (session 100, a second mutation test) an int8 cache of 16-lane heads (a scale per 32 lanes), a head of no ids
    ({"kv_dtype": "int8", "head_dim": 16}, r"int8 needs the cpu layout and head sizes that are multiples of 32 "
                                           r"\(layout cpu, head sizes \[16\]\)"),
    ({"head_ids": "target/model.onnx", "head_size": 0}, r"models\.target\.head_size must be in 1\.\.299, got 0"),
])
def test_bad_field_combinations_are_named(tmp_path, edits, match):
    raw = copy.deepcopy(OLD)
    raw["models"]["target"].update(edits)
    with pytest.raises(ManifestError, match=match):
        Manifest.from_dict(raw, tmp_path)


def test_what_a_manifest_leaves_out_reads_as_before(tmp_path):
    """(session 77, a mutation test) Fields older bundles lack: a float16 KV cache without a layout was the CUDA
    layout's; a model or tokenizer path out of the bundle, and a bundle path that is a file, not a directory, are
    refused by name."""
    raw = copy.deepcopy(OLD)
    raw["models"]["target"]["kv_dtype"] = "float16"
    m = Manifest.from_dict(raw, tmp_path)
    assert (m.target.layout, m.drafter.layout) == ("cuda", "cpu")
    # (a path out of the bundle: refused where the manifest is read)
    for edit in (lambda r: r["models"]["target"].update(path="../elsewhere/model.onnx"),
                 lambda r: r["tokenizer"].update(dir="../../tokenizer")):
        bad = copy.deepcopy(raw)
        edit(bad)
        with pytest.raises(BundleError, match=r"'\.\./.*' points outside the bundle directory"):
            Manifest.from_dict(bad, tmp_path)
    f = tmp_path / "a-file"
    f.write_text("{}")
    with pytest.raises(BundleError, match="a-file is not a bundle directory"):
        load_manifest(f)


def test_missing_report_fields_are_none(tmp_path):
    raw = copy.deepcopy(OLD)
    raw["models"]["target"].update(validation={"passed": False}, quality=None)
    del raw["models"]["target"]["quant"]
    t = Manifest.from_dict(raw, tmp_path).target
    assert t.validation == Validation(passed=False) and t.validation and not t.quality and not t.quant
    assert t.validation.to_dict() == {"passed": False} and t.quality.to_dict() == {}


def test_a_pair_with_two_tokenizers_is_refused(tmp_path):
    raw = copy.deepcopy(OLD)
    raw["models"]["drafter"]["tokenizer_sha256"] = "99" * 32
    with pytest.raises(TokenizerMismatchError):
        Manifest.from_dict(raw, tmp_path)
    # (session 100, MF69) hashes that differ past the 12 digits the message shows: refused, and shown up to the
    # first digit that differs
    raw["models"]["drafter"]["tokenizer_sha256"] = "ab" * 31 + "ac"
    with pytest.raises(TokenizerMismatchError, match=r"sha256 " + "ab" * 31 + "ab vs " + "ab" * 31 + r"ac\)"):
        Manifest.from_dict(raw, tmp_path)


def test_a_bundle_whose_tables_leave_files_unhashed_is_checked_or_says_so(tiny_bundle, copy_bundle):
    """(session 48, a review) A tokenizer.json left out of the manifest's tokenizer files was never checked (the
    fingerprint ran only where the table was empty): an edited one loaded as another tokenizer. `info --verify` said
    "every file's sha256 verified" of files with no sha256; a KV dtype this runtime lacks was an untyped error."""
    import json

    from click.testing import CliRunner

    import edgespec
    from edgespec.cli import main
    from edgespec.errors import BundleError

    b = copy_bundle(Path(tiny_bundle))
    raw = json.loads((b / "edgespec.json").read_text())
    del raw["tokenizer"]["files"]["tokenizer/tokenizer.json"]
    (b / "edgespec.json").write_text(json.dumps(raw))
    tj = b / "tokenizer" / "tokenizer.json"
    tok = json.loads(tj.read_text())
    tok["normalizer"] = {"type": "Lowercase"}
    tj.write_text(json.dumps(tok))
    with pytest.raises(BundleError, match="tokenizer.json is not the tokenizer the models were exported with"):
        edgespec.load(b, memory=False)
    b2 = b.parent / "nosha"
    shutil.copytree(tiny_bundle, b2)
    raw = json.loads((b2 / "edgespec.json").read_text())
    for meta in raw["models"]["target"]["files"].values():
        del meta["sha256"]
    (b2 / "edgespec.json").write_text(json.dumps(raw))
    r = CliRunner().invoke(main, ["info", str(b2), "--verify"])
    assert r.exit_code == 0 and "with no sha256 in the manifest: sizes only" in r.output, r.output
    raw["models"]["target"]["kv_dtype"] = "bfloat16"
    (b2 / "edgespec.json").write_text(json.dumps(raw))
    with pytest.raises(BundleError, match="KV dtype bfloat16 is not supported"):
        edgespec.load(b2, memory=False)


def test_head_ids_are_checked_at_their_edges(tmp_path):
    """(session 77, a mutation test) A reduced head's ids file: the vocabulary's last id is taken, the vocabulary's
    size refused, and so are a repeated id and a count other than ``head_size`` (the tamper test's ids were out of
    order, which none of these three changes let through)."""
    import numpy as np

    raw = copy.deepcopy(OLD)
    t = raw["models"]["target"]
    t["files"]["target/head_ids.npy"] = {"bytes": 1}
    t.update(head_ids="target/head_ids.npy", head_size=3)
    spec = Manifest.from_dict(raw, tmp_path).target
    (tmp_path / "target").mkdir()
    for ids, ok in (([0, 5, 299], True), ([0, 5, 300], False), ([0, 5, 5], False), ([0, 5], False),
                    ([0, 5, 9, 11], False), ([-1, 5, 9], False),
                    # (session 100, MF38, MF39) a column of ids, ids as floats
                    (np.array([[0], [5], [9]], dtype=np.int32), False), (np.array([0, 5, 9], np.float32), False)):
        np.save(tmp_path / "target" / "head_ids.npy", ids if isinstance(ids, np.ndarray) else
                np.array(ids, dtype=np.int32))
        if ok:
            assert spec.load_head_ids(300).tolist() == ids
        else:
            with pytest.raises(BundleError, match="target's head ids head_ids.npy are not 3 sorted, unique token ids "
                                                  "below 300"):
                spec.load_head_ids(300)
    (tmp_path / "target" / "head_ids.npy").write_bytes(b"")  # (MF40: numpy's EOFError, an untyped traceback)
    with pytest.raises(BundleError, match=r"target's head ids head_ids\.npy are unreadable"):
        spec.load_head_ids(300)


def test_the_weights_memory_on_the_cpu_counts_the_embedding_rows_a_context_can_read(tmp_path):
    """(session 77, a mutation test) On the CPU EP the weights take what was measured at export plus a row and a page
    of the mapped embedding table per distinct token, at most one row per vocabulary entry and never more than the
    table: neither bound was tested."""
    raw = copy.deepcopy(OLD)
    raw["models"]["target"].update(vocab_size=3, cpu_resident_bytes=5000, embedding_row_bytes=64,
                                   embedding_bytes=10 ** 9)
    t = Manifest.from_dict(raw, tmp_path).target
    assert t.weight_bytes(False, 2) == 5000 + 2 * (64 + 4096)
    assert t.weight_bytes(False, 10) == 5000 + 3 * (64 + 4096)  # (3 tokens in the vocabulary)
    assert t.weight_bytes(True, 10) == 11000  # (a GPU: every initializer, resident_bytes)
    raw["models"]["target"].update(embedding_bytes=1000)
    assert Manifest.from_dict(raw, tmp_path).target.weight_bytes(False, 2) == 5000 + 1000
    raw["models"]["target"].update(embedding_row_bytes=0)  # (session 100, MF25: no row size recorded, no rows)
    assert Manifest.from_dict(raw, tmp_path).target.weight_bytes(False, 2) == 5000


def test_an_int8_rows_width_and_its_head_size_are_each_others_inverse():
    """(session 77, a mutation test) export/kernels.py reads an int8 cache's head size back from its rows' width (D
    numbers and D / 32 float32 scales): ``kv_row_head`` must undo ``kv_row_width`` (9/8 for 8/9 went unseen)."""
    from edgespec.manifest import KV_DTYPES, kv_row_head, kv_row_width

    for dtype in KV_DTYPES:
        for head in (32, 64, 96, 128, 256):
            width = kv_row_width(dtype, head)
            assert width == (head + head // 32 * 4 if dtype == "int8" else head)
            assert kv_row_head(dtype, width) == head, (dtype, head)


def test_a_manifest_past_its_size_limit_is_refused_unread(tmp_path):
    """(session 77, a mutation test) A manifest is a few KiB: one of 16 MiB is still read, one byte more is refused
    by its size (the limit was untested; ``> limit + 1`` let the first byte past it through to the JSON parser)."""
    from edgespec.manifest import _MANIFEST_LIMIT, MANIFEST_NAME

    p = tmp_path / MANIFEST_NAME
    p.write_bytes(b"{}" + b" " * (_MANIFEST_LIMIT - 2))
    with pytest.raises(ManifestError, match="manifest lacks 'schema_version'"):
        load_manifest(tmp_path)
    p.write_bytes(b"{}" + b" " * (_MANIFEST_LIMIT - 1))
    with pytest.raises(ManifestError, match=r"edgespec\.json is larger than 16 MiB: not a manifest"):
        load_manifest(tmp_path)


def test_what_a_manifest_says_is_read_as_it_says(tmp_path, monkeypatch):
    """(session 100, a second mutation test of manifest.py) Values at the edge of what a field allows are read as they
    are written: an empty source file, a GPU figure of 0 beside an older bundle's key, the kernel features once each
    and sorted, the kernels' check's positions as an integer; sampling options shown as compactly as ``:g`` shows
    them; a manifest whose write fails midway leaves the old one whole and no temporary file."""
    from edgespec.manifest import sampling_text

    raw = copy.deepcopy(OLD)
    raw["source_files"] = {"target": {"empty.txt": {"bytes": 0, "sha256": "0" * 64}}}  # (MF11)
    raw["models"]["target"].update(gpu_weight_bytes=0, kernels="edgespec-q4", kernels_check=dict(KCHECK),
                                   kernel_features=["attention-window", "attention-softcap", "attention-window"])
    m = Manifest.from_dict(raw, tmp_path)
    t = m.target
    assert m.source_files["target"]["empty.txt"]["bytes"] == 0
    assert t.gpu_weight_bytes == 0  # (MF34: not resident_bytes' 11000)
    assert t.kernel_features == ("attention-softcap", "attention-window")  # (MF49)
    assert type(t.kernels_check["positions"]) is int and type(t.kernels_check["logit_scale"]) is float  # (MF50)
    assert sampling_text({"temperature": 0.1 + 0.2, "top_k": 20, "min_p": 1.0}) == \
        "temperature 0.3, top_k 20, min_p 1"  # (MF2)
    write_manifest(m)
    before = (tmp_path / "edgespec.json").read_bytes()

    def torn(self, text, *a, **kw):  # a write that ends midway (a full disk)
        with open(self, "w") as f:
            f.write(text[:10])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", torn)
    with pytest.raises(OSError, match="No space left"):
        write_manifest(m)  # (MF68: written in place, the manifest was left torn)
    assert (tmp_path / "edgespec.json").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edgespec.json"]  # (the torn temporary file removed)


def test_the_conv_states_figure_bounds_what_the_states_hold_at_their_worst(tmp_path):
    """(session 100, a second mutation test of manifest.py) ``conv_state_bytes``, the planner's figure for LFM2's
    convolution states, against what ``kv.ConvStates`` holds after calls of several widths (a state and the inputs
    kept of each): never more than the figure, and at its worst within 1% of it. The head sizes that decide an int8
    cache are those of the layers that keep one."""
    from edgespec.kv import ConvStates
    from edgespec.manifest import CONV_CALL

    raw = copy.deepcopy(OLD)
    raw["models"]["target"].update(num_layers=3, conv_layers=[[0, 8, 3], [2, 16, 5]],
                                   kv_layers=[[1, 8], [1, 32], [1, 8]],
                                   io=dict(_IO, past_conv="conv.%d", present_conv="conv_out.%d", conv_input="cin.%d"))
    spec = Manifest.from_dict(raw, tmp_path).target
    assert spec.kv_head_sizes == (32,) and spec.heads_take_int8  # (MF29: layer 1 alone keeps a cache)
    assert [spec.has_kv(i) for i in range(3)] == [False, True, False]

    def held(cs):
        return (sum(cl.past.nbytes + cl.present.nbytes + cl.inputs.nbytes for cl in cs.layers)
                + sum(a.nbytes for _, before, inputs in cs._segments for a in (*before, *inputs)))

    # one-token calls, drafts of 3, prefills of the widest call, and the worst: a prefill, then one-token calls (the
    # prefill's inputs kept until 256 positions follow it)
    for widths in ([1] * 600, [3] * 300, [CONV_CALL] * 4, [CONV_CALL] + [1] * 300):
        cs, pos, most = ConvStates(spec), 0, 0
        for n in widths:
            cs.after_call(pos, n)
            pos += n
            most = max(most, held(cs))
        assert most <= spec.conv_state_bytes, widths[:2]
    assert most > 0.99 * spec.conv_state_bytes  # (MF23: the second call's worth was that prefill's)
