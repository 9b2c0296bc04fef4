"""Every bad input gives a typed error in the library and a one-line message + non-zero exit in the CLI."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import edgespec
from conftest import file_bytes, raising
from edgespec.cli import main


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def one_line_error(r, code=None):
    assert r.exit_code != 0
    if code is not None:
        assert r.exit_code == code, r.output
    lines = [l for l in r.output.strip().splitlines() if l]
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert "Traceback" not in r.output
    return lines[0]


def test_missing_bundle(tmp_path):
    with pytest.raises(edgespec.BundleError, match="no such bundle"):
        edgespec.load(tmp_path / "nope")
    msg = one_line_error(run("generate", tmp_path / "nope", "-p", "hi"), 2)
    assert "no such bundle" in msg


def test_directory_that_is_no_bundle(tmp_path):
    with pytest.raises(edgespec.BundleError, match="not an edgespec bundle"):
        edgespec.load(tmp_path)
    one_line_error(run("info", tmp_path), 2)
    (tmp_path / "edgespec.json").mkdir()  # (session 65, a review: said as missing)
    assert "edgespec.json is a folder, not its manifest" in one_line_error(run("info", tmp_path), 2)


def test_corrupt_manifest(tiny_bundle, copy_bundle):
    b = copy_bundle(tiny_bundle)
    (b / "edgespec.json").write_text("{ not json")
    with pytest.raises(edgespec.ManifestError, match="corrupt"):
        edgespec.load(b)
    assert "corrupt" in one_line_error(run("info", b), 2)


def test_a_manifest_number_too_long_to_read_and_a_bos_flag_of_another_type(tiny_bundle, copy_bundle):
    """(session 46) an integer of 5,000 digits was a traceback (json's plain ValueError); add_bos "false" (a string)
    was taken as true, a BOS token put before every prompt."""
    b = copy_bundle(tiny_bundle)
    text = (b / "edgespec.json").read_text()
    m = json.loads(text)
    (b / "edgespec.json").write_text(text.replace('"num_layers": %d' % m["models"]["target"]["num_layers"],
                                                  '"num_layers": 1' + "0" * 5000, 1))
    with pytest.raises(edgespec.ManifestError, match="corrupt: Exceeds the limit"):
        edgespec.load(b)
    assert "corrupt" in one_line_error(run("info", b), 2)
    (b / "edgespec.json").write_text(json.dumps({**m, "add_bos": "false"}))
    with pytest.raises(edgespec.ManifestError, match="add_bos has the wrong type"):
        edgespec.load(b)


@pytest.mark.parametrize("value, match", [({}, "models.drafter lacks 'path'"), (0, "models.drafter must be an object")])
def test_a_drafter_entry_that_is_no_model_is_refused(tiny_bundle, copy_bundle, value, match):
    """(session 46) "drafter": {} or 0 in a manifest was read as no drafter, silently; null (or no entry) is none."""
    b = copy_bundle(tiny_bundle)
    m = json.loads((b / "edgespec.json").read_text())
    m["models"]["drafter"] = value
    (b / "edgespec.json").write_text(json.dumps(m))
    with pytest.raises(edgespec.ManifestError, match=match):
        edgespec.load(b)
    m["models"]["drafter"] = None
    (b / "edgespec.json").write_text(json.dumps(m))
    assert edgespec.load(b, memory=False).manifest.drafter is None


def test_an_unreadable_bundle_file_is_a_bundle_error(tiny_bundle, copy_bundle, monkeypatch):
    """(session 46) a model file this user cannot read raised a bare PermissionError (exit 1, not a BundleError)."""
    from edgespec import integrity

    b = copy_bundle(tiny_bundle)

    def denied(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(integrity, "sha256_file", denied)
    with pytest.raises(edgespec.BundleError, match="cannot read .*Permission denied"):
        edgespec.load(b)
    assert "Permission denied" in one_line_error(run("info", b), 2)


def test_an_output_encoding_without_the_report_s_characters(tiny_bundle):
    """(session 46) a stdout in latin-1 (PYTHONIOENCODING, a Windows redirect's cp1252): `info` (its ✓ and Δ) and
    `generate` (a model's U+FFFD) ended in a UnicodeEncodeError's traceback; the characters are written as '?'."""
    r = CliRunner(charset="latin-1").invoke(main, ["info", str(tiny_bundle)])
    assert r.exit_code == 0 and "validation vs torch: ? max |?logit|" in r.output, (r.output, r.exception)


def test_characters_the_output_encoding_has_are_kept_beside_the_ones_it_lacks(tiny_bundle, tmp_path):
    """(session 84, a mutation test of cli.py) Only the characters the stdout's encoding lacks become '?': a latin-1
    stdout keeps the accents of a bundle's folder name (replacing by ASCII's table made them '?' too)."""
    import shutil

    b = tmp_path / "modèle ✓"
    shutil.copytree(tiny_bundle, b)
    r = CliRunner(charset="latin-1").invoke(main, ["info", str(b)])
    assert r.exit_code == 0 and f"bundle {tmp_path}/modèle ? " in r.output, (r.output, r.exception)


def test_manifest_with_wrong_schema(tiny_bundle, copy_bundle):
    b = copy_bundle(tiny_bundle)
    m = json.loads((b / "edgespec.json").read_text())
    del m["models"]["target"]["num_layers"]
    (b / "edgespec.json").write_text(json.dumps(m))
    with pytest.raises(edgespec.ManifestError, match="num_layers"):
        edgespec.load(b)


@pytest.mark.parametrize("key, value", [("cpu_resident_bytes", -1), ("cpu_resident_bytes", "big"),
                                        ("embedding_bytes", 1.5), ("embedding_row_bytes", True)])
def test_manifest_with_bad_measured_size(tiny_bundle, copy_bundle, key, value):
    b = copy_bundle(tiny_bundle)
    m = json.loads((b / "edgespec.json").read_text())
    m["models"]["drafter"][key] = value
    (b / "edgespec.json").write_text(json.dumps(m))
    with pytest.raises(edgespec.ManifestError, match=rf"models\.drafter\.{key}"):
        edgespec.load(b)


def _edit_manifest(b, role, **changes):
    m = json.loads((b / "edgespec.json").read_text())
    m["models"][role].update(changes)
    (b / "edgespec.json").write_text(json.dumps(m))


@pytest.mark.parametrize("key, value", [("quant", "int4"), ("validation", [1]), ("quality", 3), ("params", "x"),
                                        ("resident_bytes", None), ("resident_bytes", "big")])
def test_manifest_with_bad_optional_fields(tiny_bundle, copy_bundle, key, value):
    b = copy_bundle(tiny_bundle)
    _edit_manifest(b, "target", **{key: value})
    if value is None:  # null means "not recorded": the file sizes stand in
        assert edgespec.load(b).manifest.target.gpu_weight_bytes > 0
        return
    with pytest.raises(edgespec.ManifestError, match=rf"models\.target\.{key}"):
        edgespec.load(b)
    one_line_error(run("info", b), 2)


def test_info_shows_a_thin_validation_report(tiny_bundle, copy_bundle):
    b = copy_bundle(tiny_bundle)
    _edit_manifest(b, "target", validation={"passed": True}, quality={"perplexity": 3.0})
    r = run("info", b)
    assert r.exit_code == 0, r.output
    assert "validation vs torch: ✓ (details missing from the manifest)" in r.output
    assert "quality: (report incomplete in the manifest)" in r.output


@pytest.mark.parametrize("change, match", [
    ({"num_layers": 3}, "graph has no 'past_key_values.2.key'"),
    ({"num_layers": 1}, "cache inputs the manifest does not count"),
    ({"io": {"input_ids": "ids", "attention_mask": "attention_mask", "past_key": "past_key_values.%d.key",
             "past_value": "past_key_values.%d.value", "present_key": "present.%d.key",
             "present_value": "present.%d.value", "logits": "logits"}}, "graph has no 'ids'"),
])
def test_manifest_that_disagrees_with_its_graph(tiny_bundle, copy_bundle, change, match):
    b = copy_bundle(tiny_bundle)
    assert load_layers(b) == 2
    _edit_manifest(b, "drafter", **change)
    with pytest.raises(edgespec.BundleError, match=match):
        edgespec.load(b)
    assert match.split("'")[0] in one_line_error(run("generate", b, "-p", "hi"), 2)
    # (session 57, a review) `info` reads the manifest alone (exit 0, its layer count shown); --verify opens the
    # models as generate does: it passed such a bundle, exit 0
    assert run("info", b).exit_code == 0
    assert match.split("'")[0] in one_line_error(run("info", b, "--verify"), 2)
    assert match.split("'")[0] in one_line_error(run("info", b, "--verify", "--json"), 2)


def test_manifest_with_wrong_cache_shape_fails_at_run_with_one_line(tiny_bundle, copy_bundle):
    b = copy_bundle(tiny_bundle)
    m = json.loads((b / "edgespec.json").read_text())
    _edit_manifest(b, "target", head_dim=m["models"]["target"]["head_dim"] * 2)
    with pytest.raises(edgespec.BundleError, match="target model failed to run: .*disagrees with its graph"):
        edgespec.load(b).generate("hi", max_new_tokens=2)
    assert "failed to run" in one_line_error(run("generate", b, "-p", "hi", "--max-new-tokens", "2"), 2)


def test_a_failed_call_prints_edgespec_s_line_alone(tiny_bundle, copy_bundle, monkeypatch):
    """onnxruntime's own coloured log line of a failed call (written to the process's stderr, past click's
    capture) no longer comes before edgespec's one line; EDGESPEC_ORT_LOG brings it back, and a bad value of it is
    a one-line error."""
    import subprocess
    import sys

    b = copy_bundle(tiny_bundle)
    m = json.loads((b / "edgespec.json").read_text())
    _edit_manifest(b, "target", head_dim=m["models"]["target"]["head_dim"] * 2)
    cmd = [sys.executable, "-m", "edgespec.cli", "generate", str(b), "-p", "hi", "--max-new-tokens", "2", "--no-memory"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: the target model failed to run")
    import os

    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "EDGESPEC_ORT_LOG": "3"})
    assert r.returncode == 2 and "onnxruntime" in r.stderr.splitlines()[0]
    for bad in ("loud", "5"):  # (session 97, ON57: a digit past onnxruntime's 0-4 too)
        monkeypatch.setenv("EDGESPEC_ORT_LOG", bad)
        with pytest.raises(edgespec.ConfigError, match="EDGESPEC_ORT_LOG must be"):
            edgespec.load(b)


@pytest.mark.parametrize("role", ["target", "drafter"])
def test_a_manifest_vocabulary_the_graph_does_not_have(tiny_bundle, copy_bundle, role):
    """A vocab_size past the graph's logits loaded, and a logit bias or penalty row of that size failed mid-reply
    with a traceback; now the load refuses it."""
    b = copy_bundle(tiny_bundle)
    m = json.loads((b / "edgespec.json").read_text())
    _edit_manifest(b, role, vocab_size=m["models"][role]["vocab_size"] * 4)
    with pytest.raises(edgespec.BundleError, match=f"the {role} graph's logits have .* the manifest says"):
        edgespec.load(b)
    assert "logits have" in one_line_error(run("generate", b, "-p", "hi", "--logit-bias", "5=5"), 2)


@pytest.mark.parametrize("role", ["target", "drafter"])
@pytest.mark.parametrize("axis", ["num_kv_heads", "head_dim"])
def test_a_manifest_cache_shape_the_graph_does_not_have(tiny_bundle, copy_bundle, role, axis):
    """A manifest whose KV heads or head size are not the graph's cache inputs' made caches of the wrong shape,
    which failed inside the attention at the first call; the load refuses it, naming the input and the axis. The
    builder's graphs give the heads axis a number and leave the head size symbolic: that one is given a number
    here (the graph's own, listed with its new hash), so that the manifest's is what is wrong."""
    import onnx

    from edgespec_export.head import head_files

    b = copy_bundle(tiny_bundle)
    m = json.loads((b / "edgespec.json").read_text())
    spec = m["models"][role]
    if axis == "head_dim":
        path = b / spec["path"]
        g = onnx.load(str(path), load_external_data=False)
        for i in g.graph.input:
            if i.name.startswith("past_key_values"):
                i.type.tensor_type.shape.dim[3].dim_value = spec["head_dim"]
        onnx.save(g, str(path))
        spec["files"] = head_files(b, role)
        (b / "edgespec.json").write_text(json.dumps(m))
        assert edgespec.load(b, memory=False).generate("hi", max_new_tokens=2).text is not None  # (the graph is sound)
    _edit_manifest(b, role, **{axis: spec[axis] * 2})
    with pytest.raises(edgespec.BundleError, match=f"the {role} graph's 'past_key_values.0.key' has .* on its {axis} "
                                                   f"axis, the manifest says {spec[axis] * 2}"):
        edgespec.load(b, memory=False)
    assert f"{axis} axis" in one_line_error(run("generate", b, "-p", "hi"), 2)


@pytest.mark.parametrize("keep", [(), ("target/model.onnx",)], ids=["no-files", "graph-only"])
def test_a_manifest_that_lists_not_the_graph_s_files(tiny_bundle, copy_bundle, keep):
    """An emptied (or partial) ``files`` table turned the integrity checks off: damaged weights loaded and gave
    another reply. The graph file and its external data must be listed."""
    b = copy_bundle(tiny_bundle)
    m = json.loads((b / "edgespec.json").read_text())
    files = m["models"]["target"]["files"]
    _edit_manifest(b, "target", files={k: v for k, v in files.items() if k in keep})
    what = "graph's external data 'model.onnx.data'" if keep else "graph 'target/model.onnx'"
    with pytest.raises(edgespec.BundleError, match=f"the target {what} is not among the manifest's files"):
        edgespec.load(b)
    one_line_error(run("info", b, "--verify"), 2)


def test_a_bundle_reached_through_a_symbolic_link_loads(tiny_bundle, copy_bundle, tmp_path):
    """Session 41's check that the graph is listed compared the graph's resolved path with the bundle's path as
    given: a bundle behind a symbolic link (to it, or to a folder above it) was refused as "not among the
    manifest's files". It loads, answers as through its real path, and a damaged file is still caught."""
    b = copy_bundle(tiny_bundle)
    (tmp_path / "link").symlink_to(b, target_is_directory=True)
    (tmp_path / "above").symlink_to(b.parent, target_is_directory=True)
    want = edgespec.load(b, memory=False).generate("hi", max_new_tokens=6, drafter="none").token_ids
    for via in (tmp_path / "link", tmp_path / "above" / b.name):
        assert edgespec.load(via, memory=False).generate("hi", max_new_tokens=6, drafter="none").token_ids == want
        assert run("info", via, "--verify").exit_code == 0
    data = b / "target" / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(edgespec.BundleError, match="model.onnx.data"):
        edgespec.load(tmp_path / "link", memory=False, verify=True)


def test_the_rewrites_take_a_bundle_given_through_a_symbolic_link(tiny_int4_bundle, copy_bundle, tmp_path):
    """exact-kernels and drafter-vocab placed the rewritten graph by its path relative to the bundle as given,
    which a symbolic link made climb out of the new bundle; both now write bundles that load."""
    from edgespec_export.head import apply_to_bundle as cut_head
    from edgespec_export.kernels import apply_to_bundle as exact_kernels

    import hashlib

    def digests(d):
        return {p.relative_to(d): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.rglob("*")) if p.is_file()}

    src = copy_bundle(tiny_int4_bundle)
    before = digests(src)
    (tmp_path / "link").symlink_to(src, target_is_directory=True)
    for name, make in (("xk", lambda out: exact_kernels(tmp_path / "link", out)),
                       ("cut", lambda out: cut_head(tmp_path / "link", 300, out))):
        out = make(tmp_path / name)
        m = edgespec.load(out, memory=False, verify=True)
        assert m.generate("hi", max_new_tokens=4).text is not None, name
        # the rewritten graph is in the new bundle, the source bundle untouched (the old paths climbed into it)
        spec = m.manifest.target if name == "xk" else m.manifest.drafter
        assert spec.path.resolve().is_relative_to(out.resolve()), (name, spec.path)
        assert digests(src) == before, name


def load_layers(b):
    return json.loads((b / "edgespec.json").read_text())["models"]["drafter"]["num_layers"]


def test_missing_model_file(tiny_bundle, copy_bundle):
    b = copy_bundle(tiny_bundle)
    (b / "target" / "model.onnx.data").unlink()
    with pytest.raises(edgespec.BundleError, match="missing file target/model.onnx.data"):
        edgespec.load(b)
    one_line_error(run("generate", b, "-p", "hi"), 2)


def test_tampered_model_file(tiny_bundle, copy_bundle):
    b = copy_bundle(tiny_bundle)
    p = b / "target" / "model.onnx"
    data = bytearray(p.read_bytes())
    data[-1] ^= 0xFF
    p.write_bytes(bytes(data))
    with pytest.raises(edgespec.BundleError, match="sha256"):
        edgespec.load(b)


def test_external_data_outside_bundle(tiny_bundle, copy_bundle):
    b = copy_bundle(tiny_bundle)
    m = json.loads((b / "edgespec.json").read_text())
    m["models"]["target"]["path"] = "../elsewhere/model.onnx"
    (b / "edgespec.json").write_text(json.dumps(m))
    with pytest.raises(edgespec.BundleError, match="outside the bundle"):
        edgespec.load(b)


def test_mismatched_tokenizers_in_manifest(tiny_bundle, copy_bundle):
    b = copy_bundle(tiny_bundle)
    m = json.loads((b / "edgespec.json").read_text())
    m["models"]["drafter"]["tokenizer_sha256"] = "0" * 64
    (b / "edgespec.json").write_text(json.dumps(m))
    with pytest.raises(edgespec.TokenizerMismatchError):
        edgespec.load(b)
    assert "tokenizers differ" in one_line_error(run("info", b), 2)


def test_prompt_longer_than_context(tiny_bundle):
    eng = edgespec.load(tiny_bundle, max_context=32)
    with pytest.raises(edgespec.ContextOverflowError, match="context holds 32"):
        eng.generate("hello world " * 40)
    msg = one_line_error(run("generate", tiny_bundle, "-p", "hello world " * 40, "--max-context", "32"), 3)
    assert "context" in msg


def test_bad_generation_options(tiny_bundle):
    eng = edgespec.load(tiny_bundle)
    with pytest.raises(edgespec.ConfigError):
        eng.generate("hi", top_p=-0.5)
    with pytest.raises(edgespec.ConfigError):
        eng.generate("hi", temperature=-1)
    with pytest.raises(edgespec.ConfigError, match="unknown generation option"):
        eng.generate("hi", tempreature=1)
    one_line_error(run("generate", tiny_bundle, "-p", "hi", "--top-p", "1.5"), 2)


@pytest.mark.parametrize("args, match", [
    (("--seed", "-1"), "seed must be in"),
    (("--temperature", "nan"), "temperature must be a finite number"),
    (("--temperature", "inf"), "temperature must be a finite number"),
    (("--max-context", "-5"), "max_context must be a positive"),
])
def test_bad_numbers_on_the_command_line(tiny_bundle, args, match):
    assert match in one_line_error(run("generate", tiny_bundle, "-p", "hi", *args), 2)


def test_a_temperature_too_small_to_sample_at_is_greedy_decoding(tiny_bundle):
    """(session 92, a review) A positive temperature below 1e-6 (1/T overflows float32) was refused; evaluation tools
    send 1e-7 for "greedy" (OpenAI's API takes any value in 0..2, vLLM decodes greedily below 1e-5): it is greedy
    decoding now, seeded or not, the same tokens as temperature 0."""
    from edgespec.sampling import MIN_TEMPERATURE, SamplingParams

    for t in (1e-9, 5e-7, MIN_TEMPERATURE / 2):
        sp = SamplingParams(t, top_p=0.9)
        assert sp.greedy and sp.temperature == 0.0
    assert not SamplingParams(MIN_TEMPERATURE).greedy and SamplingParams(MIN_TEMPERATURE).temperature == MIN_TEMPERATURE
    greedy = run("generate", tiny_bundle, "-p", "hi", "--max-new-tokens", "12", "--no-memory", "--json")
    tiny = run("generate", tiny_bundle, "-p", "hi", "--max-new-tokens", "12", "--no-memory", "--json",
               "--temperature", "1e-9", "--seed", "3")
    assert greedy.exit_code == tiny.exit_code == 0, tiny.output
    assert json.loads(tiny.stdout)["token_ids"] == json.loads(greedy.stdout)["token_ids"]


def test_profile_path_that_is_a_directory(tiny_bundle, tmp_path):
    d = tmp_path / "myprofile.toml"
    d.mkdir()
    assert "cannot read profile" in one_line_error(run("generate", tiny_bundle, "-p", "hi", "--profile", d))


def test_model_drafter_without_drafter(tiny_llama_bundle):
    eng = edgespec.load(tiny_llama_bundle)
    with pytest.raises(edgespec.ConfigError, match="no drafter model"):
        eng.generate("hi", drafter="model", max_new_tokens=4)


# -- what the system refuses, usage errors and Ctrl-C: one line and an exit code in every command ----
def test_usage_errors_are_one_line_in_every_command(tiny_bundle):
    assert "--drafter" in one_line_error(run("generate", tiny_bundle, "-p", "hi", "--drafter", "bogus"), 2)
    assert "--max-new-tokens" in one_line_error(run("generate", tiny_bundle, "-p", "hi", "--max-new-tokens", "x"), 2)
    assert "BUNDLE" in one_line_error(run("memory", "show"), 2)
    assert "no such option" in one_line_error(run("export", "x", "-o", "y", "--bogus"), 2).lower()
    assert "edgespec info --help" in one_line_error(run("info"), 2)
    # (session 47) an option's missing value named the group's help, not the command's
    assert "(see 'edgespec generate --help')" in one_line_error(run("generate", tiny_bundle, "-p", "hi",
                                                                    "--max-new-tokens"), 2)
    assert "(see 'edgespec chat --help')" in one_line_error(run("chat", tiny_bundle, "--system"), 2)
    assert "(see 'edgespec bench --help')" in one_line_error(run("bench", tiny_bundle, "--prompts", "/dev/null",
                                                                 "--out"), 2)
    assert "/dev/zero is not a regular file" in one_line_error(run("bench", tiny_bundle, "--prompts", "/dev/zero"), 2)


def test_python_dash_m_edgespec_runs_the_command(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "edgespec", "info", str(tmp_path / "none")], capture_output=True,
                       text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_full_disk_while_copying_a_bundle(tiny_int4_bundle, tmp_path, monkeypatch):
    import errno
    import shutil

    def full(src, dst, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", src)

    monkeypatch.setattr(shutil, "copy2", full)
    before = sorted(p.name for p in tmp_path.iterdir())
    msg = one_line_error(run("exact-kernels", tiny_int4_bundle, "-o", tmp_path / "xk"), 1)
    assert msg.startswith(f"error: no space left on device while writing the rewrite of {tiny_int4_bundle} in "
                          f"{tmp_path}") and msg.endswith(": nothing was written"), msg
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no partial bundle left behind
    assert edgespec.load(tiny_int4_bundle).generate("hi", max_new_tokens=2).text is not None  # source intact


def test_files_that_cannot_be_copied_are_named_in_one_line(tiny_int4_bundle, tmp_path, monkeypatch):
    """(session 84, a mutation test of cli.py) copytree gathers each file it could not copy into one shutil.Error
    (no errno): the command says the first file, why, and how many more, in one line. Untested before: without the
    check for that error it was a traceback, and the count of the others could go unsaid."""
    import errno
    import shutil

    def refused(src, dst, *a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", src)

    monkeypatch.setattr(shutil, "copy2", refused)
    msg = one_line_error(run("exact-kernels", tiny_int4_bundle, "-o", tmp_path / "xk"), 1)
    n = sum(1 for p in tiny_int4_bundle.rglob("*") if p.is_file())
    m = re.fullmatch(rf"error: cannot copy {re.escape(str(tiny_int4_bundle))}/(\S+) to \S+: Permission denied "
                     rf"\(and {n - 1} more files\)", msg)
    assert m and (tiny_int4_bundle / m.group(1)).is_file(), msg
    assert not (tmp_path / "xk").exists()


@pytest.mark.parametrize("in_place", [True, False])
def test_a_full_disk_during_a_rewrite_names_the_folder(tiny_int4_bundle, copy_bundle, tmp_path, monkeypatch, in_place):
    """A write on a full disk (Python's file write, onnx's) says so and names no path: the error names the rewrite,
    the folder it was written in and what stayed as it was, and no stage is left behind (session 64 noticed the bare
    message)."""
    import errno

    import edgespec_export.head

    bundle = copy_bundle(tiny_int4_bundle)
    before = file_bytes(bundle)
    around = sorted(p.name for p in bundle.parent.iterdir())

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")  # (as a file's write raises it: no filename)

    monkeypatch.setattr(edgespec_export.head, "_write", full)
    args = ("exact-kernels", bundle) if in_place else ("exact-kernels", bundle, "-o", tmp_path / "xk")
    msg = one_line_error(run(*args), 1)
    assert msg.startswith("error: no space left on device while writing the rewrite of ") and str(bundle) in msg, msg
    assert f" in {bundle.parent}" in msg or f" in {tmp_path}" in msg, msg
    assert msg.endswith("the bundle is unchanged" if in_place else "nothing was written"), msg
    assert file_bytes(bundle) == before
    assert sorted(p.name for p in bundle.parent.iterdir()) == around  # no stage left
    assert not (tmp_path / "xk").exists()


def test_a_full_disk_is_found_in_an_error_s_chain_and_a_file_it_names_is_said(tmp_path):
    """(session 65, the diff's review) what counts as a full disk: the errno (ENOSPC, EDQUOT), a library's message, a
    nested rewrite's NoSpaceError, through causes and contexts (a cycle ends), not through a context suppressed with
    ``from None`` (a hub download's full cache, wrapped so, was blamed on the bundle's folder); an error naming a
    file elsewhere (a cache's disk) names that file, not the folder the bundle is written in."""
    import errno

    from edgespec.errors import NoSpaceError
    from edgespec_export.output import _full_disk_error, raise_if_full

    assert _full_disk_error(OSError(errno.EDQUOT, "Disk quota exceeded")) is not None
    assert _full_disk_error(ValueError("IoError: No space left on device")) is not None
    assert _full_disk_error(NoSpaceError("no space left on device while writing x")) is not None
    assert _full_disk_error(OSError(errno.EACCES, "Permission denied")) is None
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("wrapped") from inner
    except RuntimeError as e:
        assert _full_disk_error(e) is not None
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device", "/cache/hub/blob")
        except OSError:
            raise RuntimeError("cannot fetch the model") from None
    except RuntimeError as e:
        assert _full_disk_error(e) is None  # (from None: not this error's cause)
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a  # (a cycle)
    assert _full_disk_error(a) is None
    raise_if_full(KeyboardInterrupt(), "x", tmp_path, "kept")  # (not an Exception: returns)
    raise_if_full(ValueError("other"), "x", tmp_path, "kept")
    with pytest.raises(NoSpaceError, match=r"^no space left on device while writing the bundle b: /cache/hub/blob: "
                                            r"nothing was written$"):
        raise_if_full(OSError(errno.ENOSPC, "No space left on device", "/cache/hub/blob"), "the bundle b", tmp_path,
                      "nothing was written")
    with pytest.raises(NoSpaceError, match=rf"in {tmp_path / 'gone' / 'deeper'}, [\d,]+ [MK]iB free there now: kept$"):
        raise_if_full(OSError(errno.ENOSPC, "No space left on device"), "x", tmp_path / "gone" / "deeper", "kept")


def test_a_library_error_for_a_full_disk(tiny_bundle, monkeypatch):
    import edgespec.api

    class SafetensorError(Exception):
        pass

    def boom(*a, **k):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, message: \"No space left on device\" })")

    monkeypatch.setattr(edgespec.api, "load", boom)
    assert "no space left on device" in one_line_error(run("generate", tiny_bundle, "-p", "hi"), 1)
    # (session 84, a mutation test) a long message of many lines: its first line, cut at 200 characters
    said = "write failed: No space left on device " + "x" * 300
    monkeypatch.setattr(edgespec.api, "load", raising(SafetensorError(said + "\nmore")))
    assert one_line_error(run("generate", tiny_bundle, "-p", "hi"), 1) == \
        f"error: no space left on device (SafetensorError: {said[:200]})"
    # ... a message without the whole "No space left on device" is a bug, its traceback
    monkeypatch.setattr(edgespec.api, "load", raising(SafetensorError("No space left")))
    assert isinstance(run("generate", tiny_bundle, "-p", "hi").exception, SafetensorError)
    # (session 99, CL5, CL6) Path.resolve()'s link loop before Python 3.13, met in a path no check names: one line
    # with the path, not the traceback or "Symlink loop from"
    monkeypatch.setattr(edgespec.api, "load", raising(RuntimeError("Symlink loop from '/x/loop'")))
    assert one_line_error(run("generate", tiny_bundle, "-p", "hi"), 1) == \
        "error: a symbolic link leads back to itself (a loop): '/x/loop'"
    import shutil  # (session 99, CL14) a copy error that lists no file is no copy error: a bug, its traceback

    monkeypatch.setattr(edgespec.api, "load", raising(shutil.Error([])))
    assert type(run("generate", tiny_bundle, "-p", "hi").exception) is shutil.Error
    monkeypatch.setattr(edgespec.api, "load", lambda *a, **k: 1 / 0)  # any other failure is a bug: its traceback
    r = run("generate", tiny_bundle, "-p", "hi")
    assert isinstance(r.exception, ZeroDivisionError)


@pytest.mark.parametrize("code", ["ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "EIO", "ENOENT", "EISDIR", "ENOTDIR",
                                  "EEXIST", "EXDEV", "ENAMETOOLONG", "EMFILE", "ELOOP"])
def test_what_the_system_refuses_that_a_user_can_act_on_is_one_line(tiny_bundle, monkeypatch, code):
    """(session 84, a mutation test of cli.py) An OSError the user can act on (a full disk or quota, a read-only
    disk, permissions, a path too long, too many open files, a loop of links, ...) is its reason and the file it
    names, in one line, exit 1; without a file, the reason alone. Any other OSError is a bug: its traceback. Only a
    few of these errors had a test: dropping a read-only disk or a name too long from them went unseen."""
    import errno
    import os

    import edgespec.api

    n = getattr(errno, code)
    monkeypatch.setattr(edgespec.api, "load", raising(OSError(n, os.strerror(n), "/some/file")))
    assert one_line_error(run("generate", tiny_bundle, "-p", "hi"), 1) == f"error: {os.strerror(n)}: /some/file"
    monkeypatch.setattr(edgespec.api, "load", raising(OSError(n, os.strerror(n))))
    assert one_line_error(run("generate", tiny_bundle, "-p", "hi"), 1) == f"error: {os.strerror(n)}"
    if code == "ENOSPC":  # (one case for the others)
        monkeypatch.setattr(edgespec.api, "load", raising(OSError(errno.ECONNRESET, os.strerror(errno.ECONNRESET))))
        r = run("generate", tiny_bundle, "-p", "hi")
        assert isinstance(r.exception, OSError) and r.exception.errno == errno.ECONNRESET


def test_an_error_or_warning_of_many_lines_is_said_in_its_first(tiny_bundle, monkeypatch):
    """(session 84, a mutation test of cli.py) The CLI says an error in one line, its message's first; a warning
    too (Python's own printed its source line after it); an empty one still says what it is."""
    import warnings

    import edgespec.api

    monkeypatch.setattr(edgespec.api, "load", raising(edgespec.ConfigError("the first line\nthe second")))
    assert one_line_error(run("generate", tiny_bundle, "-p", "hi"), 2) == "error: the first line"
    monkeypatch.setattr(edgespec.api, "load", raising(edgespec.ConfigError("")))
    assert one_line_error(run("generate", tiny_bundle, "-p", "hi"), 2) == "error: failed"

    def warn(*a, **k):
        warnings.warn("a warning\nits detail")
        warnings.warn("", DeprecationWarning)
        raise edgespec.ConfigError("stop")

    monkeypatch.setattr(edgespec.api, "load", warn)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        r = run("generate", tiny_bundle, "-p", "hi")
    lines = r.output.splitlines()  # (a library's own warning may come too)
    assert r.exit_code == 2 and lines[-1] == "error: stop" and "its detail" not in r.output, r.output
    assert lines.index("warning: a warning") < lines.index("warning: DeprecationWarning"), r.output


@pytest.mark.parametrize("args, said", [
    (["--chat", "--token-healing"], "--token-healing backs off a raw prompt's last token: it cannot be used with --chat"),
    (["--chat-template-kwargs", '{"enable_thinking": false}'], "--chat-template-kwargs are variables of the chat "
                                                                "template: they need --chat"),
    (["--token-healing", "--json-object"], "--token-healing cannot be combined with --json-schema or --json-object"),
    (["--token-healing", "--json-schema", "{schema}"], "--token-healing cannot be combined with --json-schema"),
    (["--logprobs", "0"], "--logprobs is printed with --json"),
    (["--drafter", "prediction"], "--drafter prediction drafts from a predicted output: give it with --prediction"),
    (["--json-schema", "{schema}", "--json-object"], "--json-schema and --json-object: give one of them"),
    (["--json-schema", "{object}"], "holds a json_object response_format: use --json-object for it"),
    (["--json-schema", "{bad}"], "response_format's schema cannot be used"),  # (the why: llguidance's words)
])
def test_generate_s_options_that_do_not_go_together_are_refused_before_the_model_loads(tiny_bundle, tmp_path,
                                                                                        monkeypatch, args, said):
    """(session 84, a mutation test of cli.py) Each pairing of generate's options that cannot work is one line, exit
    2, before the model loads (a bad schema too); most had no test (taking --logprobs 0 as no --logprobs, say)."""
    import edgespec.api

    files = {"{schema}": {"type": "object"}, "{object}": {"type": "json_object"}, "{bad}": {"type": "frobnicate"}}
    for name, schema in files.items():
        (tmp_path / f"{name[1:-1]}.json").write_text(json.dumps(schema))
    args = [str(tmp_path / f"{a[1:-1]}.json") if a in files else a for a in args]
    monkeypatch.setattr(edgespec.api, "load", lambda *a, **k: pytest.fail("the model was loaded"))
    assert said in one_line_error(run("generate", tiny_bundle, "-p", "hi", *args), 2)


def test_an_error_mid_reply_starts_its_own_line_and_a_full_context_is_said(tiny_bundle, monkeypatch):
    """(session 84, a mutation test of cli.py) An error while a reply streams ends the partial reply's line, so that
    "error: ..." starts one; before any text, no empty line comes first. A reply that stopped because the context
    is full says so (generate's note had no test)."""
    from edgespec.api import Engine

    def failing(text):
        def stream(self, *a, **k):
            if text:
                yield text
            raise edgespec.ConfigError("boom")
        return stream

    with monkeypatch.context() as m:
        m.setattr(Engine, "stream", failing(""))
        r = run("generate", tiny_bundle, "-p", "hi", "--no-memory")
        assert r.exit_code == 2 and r.output == "error: boom\n", repr(r.output)
        m.setattr(Engine, "stream", failing("partial"))
        r = run("generate", tiny_bundle, "-p", "hi", "--no-memory")
        assert r.exit_code == 2 and r.output == "partial\nerror: boom\n", repr(r.output)
    eos = json.loads((tiny_bundle / "edgespec.json").read_text())["eos_token_ids"]
    bias = [a for e in eos for a in ("--logit-bias", f"{e}=-100")]  # (no end: the reply runs to the context's)
    r = run("generate", tiny_bundle, "-p", "hi", "--max-context", "32", "--max-new-tokens", "100", "--no-memory",
            "--drafter", "none", *bias)
    assert r.exit_code == 0 and "note: the reply stopped because the context (32 tokens) is full" in r.output, \
        r.output


def test_a_full_stdout_and_ctrl_c(tiny_bundle, smol_int4):
    import os
    import signal
    import subprocess
    import sys
    import time

    cmd = [sys.executable, "-m", "edgespec.cli", "generate", str(tiny_bundle), "-p", "hi", "--no-memory"]
    if os.path.exists("/dev/full"):
        with open("/dev/full", "w") as full:
            r = subprocess.run([*cmd, "--max-new-tokens", "4"], stdout=full, stderr=subprocess.PIPE, text=True,
                               timeout=120)
        assert r.returncode == 1 and r.stderr.strip().splitlines() == [
            "error: cannot write the output: No space left on device"], r.stderr
    # SmolLM2 counting, one token a call: seconds of output, stopped by Ctrl-C after its first token
    # (SIGINT back to its default in the child: a suite run as a background job, `cmd &`, inherits it ignored)
    p = subprocess.Popen([sys.executable, "-m", "edgespec.cli", "generate", str(smol_int4), "-p", "1, 2, 3, 4, 5,",
                          "--no-memory", "--max-new-tokens", "2000", "--drafter", "none"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.stdout.read(1)  # it is generating
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130 and err.strip().splitlines()[-1] == "error: interrupted", err
    assert "Traceback" not in err and "Aborted" not in err
    assert out.endswith("\n"), out[-40:]  # (session 49) the partial reply's line ends: "error:" starts a line


@pytest.mark.parametrize("kw, name", [
    ({"bundle": None}, "bundle"), ({"bundle": 123}, "bundle"), ({"bundle": b"x"}, "bundle"),
    ({"provider": 1}, "provider"), ({"max_context": "big"}, "max_context"), ({"max_context": 1.5}, "max_context"),
    ({"max_context": True}, "max_context"), ({"memory": 123}, "memory"), ({"documents": 123}, "documents"),
    ({"documents": [123]}, "documents"), ({"min_width": "x"}, "min_width"), ({"use_drafter": "no"}, "use_drafter"),
    ({"verify": "yes"}, "verify"), ({"cuda_graphs": "x"}, "cuda_graphs"), ({"profile": 3}, "profile"),
])
def test_load_arguments_of_the_wrong_type(tiny_bundle, kw, name):
    args = {"bundle": tiny_bundle, **kw}
    with pytest.raises(edgespec.ConfigError, match=f"^{name} must be"):
        edgespec.load(args.pop("bundle"), **args)


def test_empty_messages_are_refused(tiny_bundle):
    eng = edgespec.load(tiny_bundle, memory=False)
    with pytest.raises(edgespec.ConfigError, match="messages are empty"):
        eng.generate([], max_new_tokens=2)


def test_a_graph_that_is_no_graph_but_matches_its_manifest(tiny_int4_bundle, copy_bundle, tmp_path):
    """A hand-edited or mis-assembled bundle whose manifest hashes a truncated graph: every command
    says so in one line (BundleError, exit 2; ExportError, exit 6, for the rewrites)."""
    import hashlib

    b = copy_bundle(tiny_int4_bundle)
    p = b / "target" / "model.onnx"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 3])
    m = json.loads((b / "edgespec.json").read_text())
    m["models"]["target"]["files"]["target/model.onnx"] = {"bytes": p.stat().st_size,
                                                           "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
    (b / "edgespec.json").write_text(json.dumps(m))
    with pytest.raises(edgespec.BundleError, match="cannot open target model model.onnx"):
        edgespec.load(b)
    assert "cannot open target model" in one_line_error(run("generate", b, "-p", "hi"), 2)
    assert "cannot read the graph" in one_line_error(run("exact-kernels", b, "-o", tmp_path / "xk"), 6)
    assert not (tmp_path / "xk").exists()


def test_sigterm_during_an_in_place_rewrite_leaves_no_partial(tiny_int4_bundle, copy_bundle):
    """exact-kernels and drafter-vocab rewrite through one staged copy; SIGTERM unwinds it as Ctrl-C does."""
    import os
    import signal
    import time

    from edgespec_export.head import staged_rewrite
    from edgespec_export.output import Terminated

    b = copy_bundle(tiny_int4_bundle)
    before = sorted(p.name for p in b.parent.iterdir())
    manifest = (b / "edgespec.json").read_bytes()

    def build(stage):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # the handler raises before this ends

    with pytest.raises(Terminated):
        staged_rewrite(b, None, False, build)
    assert sorted(p.name for p in b.parent.iterdir()) == before and (b / "edgespec.json").read_bytes() == manifest
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # put back


class _DropsASigterm:
    """A SIGTERM to this process while a finalizer runs: Python runs the handler inside it and drops what it raises
    ("Exception ignored in ..."), as it does in a weakref callback or the garbage collector's."""

    def __del__(self):
        import os
        import signal

        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10_000):  # (the handler runs, and raises, at one of these lines)
            pass


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # (the dropped exception)
def test_a_sigterm_dropped_by_a_finalizer_still_ends_a_rewrite(tiny_int4_bundle, copy_bundle, tmp_path, monkeypatch):
    """(session 91) The handler's Terminated, raised inside a finalizer, was dropped: the rewrite went on and
    published. The flag it set is read again before the publish."""
    import signal

    from edgespec.manifest import load_manifest
    from edgespec_export import output as O
    from edgespec_export.head import staged_rewrite

    monkeypatch.setattr(O, "terminated", False)  # (and set back after the test, whatever it ends with)
    b = copy_bundle(tiny_int4_bundle)
    out = tmp_path / "out"

    def build(stage):
        _DropsASigterm()  # (made and dropped at once: its __del__ runs here)
        assert O.terminated  # (the handler ran: only its exception was lost)
        return load_manifest(stage)

    with pytest.raises(O.Terminated) as e:
        staged_rewrite(b, out, False, build)
    assert e.value.code == 143 and not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == [b.name]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert O.terminated  # (the CLI reads it afterwards) and outside an export it stops nothing
    O.raise_if_terminated()


def test_a_context_above_the_bundles_is_said_not_silently_cut(tiny_bundle):
    with pytest.warns(UserWarning, match="asked for a context of 1000000 tokens; this bundle allows"):
        eng = edgespec.load(tiny_bundle, max_context=10**6, memory=False)
    assert eng.max_context < 10**6
    r = run("generate", tiny_bundle, "-p", "hi", "--max-new-tokens", "2", "--max-context", "1000000", "--no-memory")
    assert r.exit_code == 0
    warn = [ln for ln in r.stderr.splitlines() if "warning" in ln.lower() or "Warning" in ln]
    assert warn == [f"warning: asked for a context of 1000000 tokens; this bundle allows {eng.max_context}"], r.stderr
    r = run("generate", tiny_bundle, "-p", "hi", "--max-new-tokens", "100000", "--max-context", "24", "--no-memory")
    assert r.exit_code == 0 and "the context (24 tokens) is full" in r.stderr, r.stderr


def test_info_says_when_the_chat_template_does_not_parse_and_a_stop_that_is_no_text(tiny_bundle, copy_bundle):
    b = copy_bundle(tiny_bundle)
    m = json.loads((b / "edgespec.json").read_text())
    m["chat_template"] = "{% for m in messages %}{{ m.content }"
    (b / "edgespec.json").write_text(json.dumps(m))
    r = run("info", b)
    assert r.exit_code == 0 and "chat template: yes, but does not parse" in r.output, r.output
    assert "chat template: yes\n" in run("info", tiny_bundle).output or "chat template: yes " in run("info", tiny_bundle).output
    with pytest.raises(edgespec.ConfigError, match="not valid UTF-8"):
        edgespec.load(tiny_bundle, memory=False).generate("hi", stop=["\udcff"], max_new_tokens=2)


def test_load_takes_numpy_integers_none_memory_and_iterables_of_documents(tiny_bundle, tmp_path):
    import numpy as np

    doc = tmp_path / "doc.txt"
    doc.write_text("a document about rivers and lakes\n")
    eng = edgespec.load(tiny_bundle, max_context=np.int64(64), memory=None, documents=(p for p in [doc]))
    assert eng.max_context == 64 and type(eng.max_context) is int
    assert eng.memory_stats()["document_tokens"] > 0 and eng.memory_stats()["memory"] is False


def test_every_typed_error_is_reachable_from_the_package(tiny_llama_bundle):
    import edgespec.errors as E

    for name in ("ChatTemplateError", "DocumentError", "StoreError", "ExportError", "NoSpaceError", "CpuFallbackError"):
        assert getattr(edgespec, name) is getattr(E, name) and name in edgespec.__all__
    assert "quality: not measured (exported with --no-quality)" in run("info", tiny_llama_bundle).output


@pytest.mark.parametrize("cmd", ["generate", "chat"])
@pytest.mark.parametrize("opt, value, name", [("--temperature", "-1", "temperature"), ("--top-p", "2", "top_p"),
                                              ("--top-k", "-3", "top_k"), ("--min-p", "1.5", "min_p"),
                                              ("--seed", "-4", "seed"), ("--max-new-tokens", "0", "max_new_tokens"),
                                              ("--draft-tokens", "99", "draft_tokens")])
def test_a_bad_generation_option_is_refused_before_the_model_loads(tmp_path, cmd, opt, value, name):
    """(session 63) generate and chat loaded the model (2-12 s on the Qwen pair) before refusing a bad sampling
    option: now the option's error comes first, even for a bundle that does not exist."""
    args = [cmd, tmp_path / "no-bundle"] + (["-p", "hi"] if cmd == "generate" else []) + [opt, value]
    msg = one_line_error(run(*args), 2)
    assert msg.startswith(f"error: {name} must be"), msg


@pytest.mark.parametrize("args, words", [
    (["serve", "{b}", "--draft-tokens", "99", "--port", "0"], "draft_tokens must be"),
    (["serve", "{b}", "--temperature", "3", "--port", "0"], "is not in the range 0<=x<=2"),
    (["serve", "{b}", "--min-p", "2", "--port", "0"], "min_p must be in"),
    (["serve", "{b}", "--repetition-penalty", "0", "--port", "0"], "repetition_penalty must be in"),
    (["generate", "{b}", "-p", "a\udcff"], "the prompt is not valid UTF-8"),
    (["generate", "{b}", "-p", "a", "--stop", "\udcff"], "is not valid UTF-8 text"),
    (["generate", "{b}", "-p", "a", "--suffix", "\udcff"], "the suffix is not valid UTF-8"),
    (["perplexity", "{b}", "{readme}", "--window", "512", "--max-context", "100"],
     "the window (512 tokens) is larger than the context"),
    (["bench", "{b}", "--out", "{file}"], "cannot write the report"),
])
def test_more_bad_options_are_refused_before_the_model_loads(tiny_bundle, tmp_path, monkeypatch, args, words):
    """(session 63, a review) each of these loaded the model (3-13 s on the Qwen pair) before its error; serve's
    --temperature 5e-7 started the server, which then refused every request that left its temperature out (since
    session 92 such a temperature is greedy decoding)."""
    def no_load(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr("edgespec.api.load", no_load)
    (tmp_path / "afile").write_text("x")
    values = {"b": tiny_bundle, "readme": Path(__file__).parent.parent / "README.md", "file": tmp_path / "afile"}
    msg = one_line_error(run(*[a.format(**values) for a in args]), 2)
    assert words in msg, msg


def test_min_p_one_samples_the_greedy_reply(tiny_bundle):
    """``--min-p 1`` keeps the likeliest token alone: a reply sampled at temperature 1 is the greedy one (the same
    seed's without it is not), with every drafter."""
    base = ["generate", tiny_bundle, "-p", "1, 2, 3, 4,", "--max-new-tokens", "24", "--json"]
    greedy = json.loads(run(*base).output)["token_ids"]
    free = json.loads(run(*base, "--temperature", "1", "--seed", "3").output)["token_ids"]
    assert free != greedy
    for drafter in ("none", "model", "prompt-lookup", "auto"):
        r = run(*base, "--temperature", "1", "--seed", "3", "--min-p", "1", "--drafter", drafter)
        assert r.exit_code == 0, r.output
        assert json.loads(r.output)["token_ids"] == greedy, drafter


def test_a_path_with_a_line_break_is_named_whole_in_the_one_line(tmp_path, tiny_bundle, monkeypatch):
    """(session 92's review, fixed in session 93) an error names a path the user gave with its line breaks escaped:
    the message is its first line, and ``$'a\\nb'`` cut at the break lost the rest of the name. Breaks in an argument,
    in an option's ``--name=value``, and in an ``EDGESPEC_*`` variable."""
    bad = tmp_path / "no\nsuch\u2028bundle"
    msg = one_line_error(run("info", bad), 2)
    assert msg == f"error: no such bundle: {tmp_path}/no\\nsuch\\u2028bundle", msg
    assert msg.endswith("no\\nsuch\\u2028bundle") and "\n" not in msg
    folder = tmp_path / "f"
    folder.write_text("a file where a folder is wanted")
    msg = one_line_error(run("generate", tiny_bundle, "-p", "hi", f"--prompt-cache-file={folder}/c\rd/e"))
    assert "c\\rd/e" in msg, msg
    monkeypatch.setenv("EDGESPEC_PROFILE", str(tmp_path / "p\x0bq.toml"))
    msg = one_line_error(run("generate", tiny_bundle, "-p", "hi"))
    assert "p\\x0bq.toml" in msg and "$EDGESPEC_PROFILE" in msg, msg
    # (session 99, CL20) an option's value without a slash before its break (a relative path): matched as the value,
    # not only as the whole "--name=value"
    monkeypatch.delenv("EDGESPEC_PROFILE")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "g\rh").write_text("a file where a folder is wanted")
    msg = one_line_error(run("generate", tiny_bundle, "-p", "hi", "--prompt-cache-file=g\rh/e"))
    assert "g\\rh/e" in msg, msg
    # (CL21) one name inside another (a variable's "a\nb" in the bundle's "a\nb\nc"): the longer escaped whole
    monkeypatch.setenv("EDGESPEC_NOTE", "a\nb")
    msg = one_line_error(run("info", tmp_path / "a\nb\nc"), 2)
    assert msg == f"error: no such bundle: {tmp_path}/a\\nb\\nc", msg
