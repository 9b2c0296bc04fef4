"""The export stage: round trips, validation figures, refusal of bad inputs, atomic writes."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from edgespec.cli import main
from edgespec.errors import ExportError
from edgespec.manifest import load_manifest


def test_round_trip_manifest(tiny_bundle):
    m = load_manifest(tiny_bundle, deep=True)
    assert m.target.architecture == "qwen2" and m.drafter is not None
    assert m.target.validation["passed"] and m.target.validation["top1_agreement"] == 1.0
    assert max(m.target.validation["max_abs_logit_diff"].values()) < 1e-3
    assert m.target.tokenizer_sha256 == m.drafter.tokenizer_sha256
    assert m.eos_token_ids and m.chat_template
    raw = m.raw["models"]["target"]
    assert raw["operators"]["GroupQueryAttention"] == m.target.num_layers
    q = m.target.quality
    assert q["perplexity_delta"] == pytest.approx(0, abs=1e-2) and q["top1_agreement"] > 0.99
    assert 0 < m.drafter.quality["greedy_agreement_with_target"] <= 1


def test_llama_round_trip(tiny_llama_bundle):
    m = load_manifest(tiny_llama_bundle)
    assert m.target.architecture == "llama" and m.target.num_layers == 3 and m.target.num_kv_heads == 1


def test_int4_has_matmulnbits(tiny_int4_bundle):
    m = load_manifest(tiny_int4_bundle)
    ops = m.raw["models"]["target"]["operators"]
    assert ops.get("MatMulNBits", 0) >= 4 * m.target.num_layers
    assert m.target.quant["block_size"] == 32 and m.target.quant["accuracy_level"] == 4
    assert m.target.validation["top1_agreement"] >= 0.6
    assert m.drafter.precision == "fp32"  # the drafter stays at higher precision


def test_mismatched_tokenizers_refused(tiny_dirs, tmp_path):
    from edgespec_export import export_bundle

    with pytest.raises(ExportError, match="tokenizer differs"):
        export_bundle(str(tiny_dirs["qwen2"]), tmp_path / "b", drafter=str(tiny_dirs["other"]),
                      target_precision="fp32", quality=False)
    assert not (tmp_path / "b").exists() and not list(tmp_path.glob(".b.partial*"))


@pytest.mark.parametrize("source, message", [
    ("/no/such/model", "no such model"),
    ("not-a-hub-id-nor-path", "no such model"),
])
def test_bad_sources(source, message, tmp_path):
    r = CliRunner().invoke(main, ["export", source, "-o", str(tmp_path / "b")])
    assert r.exit_code == 6 and message in r.output and "Traceback" not in r.output


def test_directory_without_config(tmp_path):
    (tmp_path / "m").mkdir()
    r = CliRunner().invoke(main, ["export", str(tmp_path / "m"), "-o", str(tmp_path / "b")])
    assert r.exit_code == 6 and "no config.json" in r.output


def test_hub_id_without_network_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = CliRunner().invoke(main, ["export", "someorg/somemodel", "-o", str(tmp_path / "b")])
    assert r.exit_code == 6 and "hub" in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_existing_output_needs_force(tiny_dirs, tiny_llama_bundle):
    r = CliRunner().invoke(main, ["export", str(tiny_dirs["llama"]), "-o", str(tiny_llama_bundle),
                                  "--target-precision", "fp32"])
    assert r.exit_code == 6 and "--force" in r.output
    load_manifest(tiny_llama_bundle)  # untouched


def test_bad_option_combination(tiny_dirs, tmp_path):
    r = CliRunner().invoke(main, ["export", str(tiny_dirs["qwen2"]), "-o", str(tmp_path / "b"), "--block-size", "48"])
    assert r.exit_code == 6 and "block-size" in r.output


def test_failed_export_leaves_nothing(tiny_dirs, tmp_path, monkeypatch):
    from edgespec_export import bundle as bundle_mod

    def boom(*a, **k):
        raise ExportError("simulated builder failure")

    monkeypatch.setattr(bundle_mod, "run_builder", boom)
    with pytest.raises(ExportError, match="simulated"):
        bundle_mod.export_bundle(str(tiny_dirs["qwen2"]), tmp_path / "b", target_precision="fp32", quality=False)
    assert list(tmp_path.iterdir()) == []


def test_info_cli(tiny_bundle):
    r = CliRunner().invoke(main, ["info", str(tiny_bundle), "--verify"])
    assert r.exit_code == 0 and "validation vs torch: ✓" in r.output and "sha256 verified" in r.output
    r = CliRunner().invoke(main, ["info", str(tiny_bundle), "--json"])
    assert json.loads(r.output)["schema_version"] == 1


def test_fp8_is_refused_clearly(tiny_dirs, tmp_path):
    r = CliRunner().invoke(main, ["export", str(tiny_dirs["qwen2"]), "-o", str(tmp_path / "b"),
                                  "--target-precision", "fp8"])
    assert r.exit_code == 6 and "fp8 is not implemented" in r.output
    assert not (tmp_path / "b").exists()
