"""The oldest runtime dependencies pyproject.toml admits (scripts/min-deps.txt, installed by scripts/install.sh in
.venv/min-deps): the runtime, exact-kernels, the cuda layout on the CPU, structured outputs and the server run on
them (tests/min_deps_check.py, in a subprocess). Session 44 found two bounds nothing had run: onnxruntime 1.22
refused every exported graph (the builder's 12-input GroupQueryAttention) and llguidance before 1.7 refused a list
of end tokens."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "scripts" / "min-deps.txt"
MIN_DEPS = ROOT / ".venv" / "min-deps"
RUNTIME = {"onnxruntime", "numpy", "tokenizers", "click", "jinja2", "starlette", "uvicorn", "llguidance"}


def _pins() -> dict[str, str]:
    out = {}
    for line in PINS.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            out[name.lower()] = version
    return out


def _lower_bounds() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + project["optional-dependencies"]["serve"] + \
        project["optional-dependencies"]["structured"]
    out = {}
    for r in reqs:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", r)
        assert m, f"{r!r}: a runtime dependency without a '>=' lower bound"
        out[m.group(1).lower()] = m.group(2)
    return out


def test_pins_are_pyprojects_lower_bounds():
    pins, bounds = _pins(), _lower_bounds()
    assert set(bounds) == RUNTIME and set(pins) == RUNTIME, (sorted(bounds), sorted(pins))
    for name in RUNTIME:
        assert Version(pins[name]) == Version(bounds[name]), f"{name}: pinned {pins[name]}, pyproject >={bounds[name]}"


def test_export_pins_are_pyprojects_export_bounds():
    """(session 45) scripts/min-deps-export.txt records the oldest export-stage releases that ran (a helper session's
    run, not every CI run's); pyproject's export bounds are those, torch's aside (untested, README)."""
    pins = {}
    for line in (ROOT / "scripts" / "min-deps-export.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower()] = version
    bounds = {}
    for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["export"]:
        m = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", r)
        if m:
            bounds[m.group(1).lower()] = m.group(2)
    assert set(pins) == set(bounds) - {"torch"}, (sorted(pins), sorted(bounds))
    for name, version in pins.items():
        assert Version(version) == Version(bounds[name]), f"{name}: pinned {version}, pyproject >={bounds[name]}"


@pytest.fixture(scope="module")
def tiny_xk_min(tiny_int4_bundle, tmp_path_factory):
    from edgespec_export.kernels import apply_to_bundle

    return apply_to_bundle(tiny_int4_bundle, tmp_path_factory.mktemp("min-deps") / "xk", log=lambda s: None)


def test_the_runtime_runs_on_the_oldest_dependencies(tiny_int4_bundle, tiny_xk_min, tiny_cuda_bundle, tmp_path):
    assert MIN_DEPS.is_dir(), f"{MIN_DEPS} is missing: run scripts/install.sh"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(MIN_DEPS), str(ROOT)]))
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "min_deps_check.py"), str(PINS),
                           str(tmp_path / "serve.log"), str(tiny_int4_bundle), str(tiny_xk_min),
                           str(tiny_cuda_bundle)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "min-deps ok" in proc.stdout


def test_exported_graphs_carry_no_trailing_empty_inputs(tiny_int4_bundle, tiny_cuda_bundle):
    """(onnxruntime 1.22 checks a node's input count, trailing empties included, against its own schema)"""
    import onnx

    for bundle in (tiny_int4_bundle, tiny_cuda_bundle):
        for role in ("target", "drafter"):
            graph = onnx.load(str(Path(bundle) / role / "model.onnx"), load_external_data=False).graph
            ops = {n.op_type for n in graph.node}
            assert "GroupQueryAttention" in ops, (bundle, role)
            assert not [n.name for n in graph.node if n.input and n.input[-1] == ""], (bundle, role)


def test_a_bundle_exported_before_the_trim_is_refused_in_one_line(tiny_int4_bundle, copy_bundle):
    """A bundle exported before session 44 (its GroupQueryAttention nodes with the builder's trailing empty inputs,
    remade here) on onnxruntime 1.22: a BundleError saying what to do, not onnxruntime's 300 characters of inputs."""
    import json

    import onnx

    from edgespec.integrity import sha256_file

    assert MIN_DEPS.is_dir(), f"{MIN_DEPS} is missing: run scripts/install.sh"
    old = copy_bundle(Path(tiny_int4_bundle))
    graph_file = old / "target" / "model.onnx"
    m = onnx.load(str(graph_file), load_external_data=False)
    for n in m.graph.node:
        if n.op_type == "GroupQueryAttention":
            n.input.extend([""] * (12 - len(n.input)))
    onnx.save(m, str(graph_file))
    manifest = json.loads((old / "edgespec.json").read_text())
    manifest["models"]["target"]["files"]["target/model.onnx"] = {"bytes": graph_file.stat().st_size,
                                                                  "sha256": sha256_file(graph_file)}
    (old / "edgespec.json").write_text(json.dumps(manifest))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(MIN_DEPS), str(ROOT)]))
    proc = subprocess.run([sys.executable, "-m", "edgespec.cli", "generate", str(old), "-p", "hi", "--max-new-tokens", "2"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "GroupQueryAttention nodes have 12 inputs where onnxruntime 1.22.0 takes at most 11" \
        in err[0] and "export the bundle again" in err[0], err
    # (the same bundle opens on the newest onnxruntime, which takes 12)
    import edgespec

    assert edgespec.load(old).generate("hi", max_new_tokens=2, drafter="none").token_ids
