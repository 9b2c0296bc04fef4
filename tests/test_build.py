"""(session 88) export/build.py on its own: the quantization options' refusals and defaults, the model builder's
arguments for each precision and layout, and ``run_builder`` reading a builder process (a fake one: the real
builder's runs are test_export's) for its progress, its failure and its files. Mutation-tested
(docs/bench/mutation_s88.md)."""
from __future__ import annotations

import json

import pytest

from edgespec.errors import ExportError


def _q(**kw):
    from edgespec_export.build import QuantOptions

    return QuantOptions(**kw)


@pytest.mark.parametrize("kw, message", [
    (dict(block_size=48), "--block-size must be 16, 32, 64, 128 or 256, got 48"),
    (dict(block_size=512), "--block-size must be"),
    (dict(accuracy_level=5), "--accuracy-level must be 0..4, got 5"),
    (dict(accuracy_level=-1), "--accuracy-level must be 0..4"),
    (dict(algorithm="awq"), "--quant-algo must be rtn, k_quant, gguf, hqq or q4_k, got 'awq'"),
    (dict(algorithm="gguf", block_size=64), "--quant-algo gguf keeps the GGUF's blocks of 32 weights: --block-size 32, not 64"),
    (dict(algorithm="q4_k", block_size=128), "--quant-algo q4_k writes Q4_K's blocks of 32 weights"),
    (dict(fp8_scheme="tensor"), "--fp8-scheme must be channel or block, got 'tensor'"),
])
def test_quantization_options_refuse_what_no_build_makes(kw, message):
    """The Python API's options (the CLI's choices stop most of these before): one ExportError each."""
    with pytest.raises(ExportError, match="^" + message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        _q(**kw)


@pytest.mark.parametrize("kw", [dict(block_size=b) for b in (16, 32, 64, 128, 256)]
                         + [dict(accuracy_level=a) for a in range(5)]
                         + [dict(algorithm=a) for a in ("rtn", "k_quant", "hqq")]
                         + [dict(algorithm="hqq", block_size=64), dict(algorithm="gguf"), dict(algorithm="q4_k"),
                            dict(fp8_scheme="block")])
def test_quantization_options_take_every_value_a_build_makes(kw):
    q = _q(**kw)
    for k, v in kw.items():
        assert getattr(q, k) == v


def test_options_are_asymmetric_unless_asked_and_record_what_was_built():
    q = _q()
    assert q.symmetric is None and not q.is_symmetric  # (not asked for: asymmetric, the default)
    assert _q(symmetric=True).is_symmetric and not _q(symmetric=False).is_symmetric
    r = _q(block_size=64, symmetric=True, accuracy_level=2, quantize_lm_head=False, algorithm="k_quant").record()
    assert (r.block_size, r.symmetric, r.accuracy_level, r.quantize_lm_head, r.quantize_embeddings, r.algorithm) == \
        (64, True, 2, False, False, "k_quant")
    assert _q(quantize_embeddings=True).record().quantize_embeddings


@pytest.mark.parametrize("precision, device, asked, want", [
    ("int4", "cuda", None, True),  # the cuda layout's default: int4 tables
    ("int4", "cpu", None, None),  # the builder's own choice
    ("int8", "cuda", None, None),  # (GatherBlockQuantized is 4-bit only)
    ("fp16", "cuda", None, None),
    ("int4", "cuda", False, False),  # asked for: kept
    ("int4", "cpu", True, True),
])
def test_the_layouts_default_embeddings_fill_only_what_was_not_asked(precision, device, asked, want):
    q = _q(quantize_embeddings=asked, block_size=64)
    got = q.for_layout(precision, device)
    assert got.quantize_embeddings is want and got.block_size == 64
    if want is asked:
        assert got is q


@pytest.mark.parametrize("precision, device, quant, want", [
    ("int4", "cpu", {}, ("int4", "cpu", {"block_size": "32", "is_symmetric": "false", "accuracy_level": "4",
                                          "op_types_to_quantize": "MatMul"})),
    ("int8", "cuda", dict(block_size=128, symmetric=True, accuracy_level=1),
     ("int8", "cuda", {"block_size": "128", "is_symmetric": "true", "accuracy_level": "1",
                       "op_types_to_quantize": "MatMul"})),
    ("int4", "cpu", dict(algorithm="k_quant", quantize_lm_head=False, quantize_embeddings=True),
     ("int4", "cpu", {"block_size": "32", "is_symmetric": "false", "accuracy_level": "4", "algo_config": "k_quant",
                      "op_types_to_quantize": "MatMul/Gather", "nodes_to_exclude": "/lm_head/MatMul"})),
    # gguf: the builder's RTN (its blocks put in after); hqq and q4_k swap the quantizer and keep a float table
    ("int4", "cpu", dict(algorithm="gguf"), ("int4", "cpu", {"block_size": "32", "is_symmetric": "false",
                                                            "accuracy_level": "4", "op_types_to_quantize": "MatMul"})),
    ("int4", "cpu", dict(algorithm="hqq", block_size=64),
     ("int4", "cpu", {"block_size": "64", "is_symmetric": "false", "accuracy_level": "4",
                      "op_types_to_quantize": "MatMul", "shared_embeddings": "false"})),
    ("int4", "cpu", dict(algorithm="q4_k"), ("int4", "cpu", {"block_size": "32", "is_symmetric": "false",
                                                            "accuracy_level": "4", "op_types_to_quantize": "MatMul",
                                                            "shared_embeddings": "false"})),
    ("int4", "cuda", dict(quantize_embeddings=False),
     ("int4", "cuda", {"block_size": "32", "is_symmetric": "false", "accuracy_level": "4",
                       "op_types_to_quantize": "MatMul", "shared_embeddings": "false"})),
    ("fp32", "cpu", {}, ("fp32", "cpu", {})),
    ("fp8", "cpu", {}, ("fp32", "cpu", {})),
    ("fp8", "cuda", {}, ("fp16", "cuda", {})),
    ("fp16", "cpu", {}, ("fp16", "cuda", {})),  # (the builder's only float16 layout is its CUDA one)
    ("fp16", "cuda", {}, ("fp16", "cuda", {})),
])
def test_builder_arguments_for_each_precision_and_layout(precision, device, quant, want):
    from edgespec_export.build import builder_args

    assert builder_args(precision, _q(**quant), device) == want


@pytest.mark.parametrize("precision, device, quant, message", [
    ("int4", "tpu", {}, "--device must be one of cpu, cuda, got 'tpu'"),
    ("int8", "cpu", dict(quantize_embeddings=True), "--quantize-embeddings needs int4"),
    ("fp32", "cuda", {}, "fp32 has no cuda layout"),
    ("bf16", "cpu", {}, "precision 'bf16' is not built by the model builder"),
])
def test_builder_arguments_refuse_what_the_builder_cannot_make(precision, device, quant, message):
    from edgespec_export.build import builder_args

    with pytest.raises(ExportError, match=message.replace("(", r"\(")):
        builder_args(precision, _q(**quant), device)


class _FakeBuilder:
    """A builder process: its output in the chunks given, then its exit code. Killed where stopped early."""

    def __init__(self, chunks, rc=0, out_dir=None, files=("genai_config.json", "model.onnx")):
        self.chunks, self.rc, self.returncode, self.killed = list(chunks), rc, None, False
        self.out_dir, self.files = out_dir, files

    def read(self):
        return self.chunks.pop(0) if self.chunks else b""

    def wait(self):
        if self.returncode is None:
            self.returncode = self.rc
            for f in self.files if self.rc == 0 else ():
                (self.out_dir / f).write_text(json.dumps({"model": {"type": "qwen2"}}) if f.endswith(".json") else "x")
        return self.returncode

    def kill(self):
        self.killed, self.returncode = True, -9


def _run(monkeypatch, tmp_path, proc_of, precision="int4", quant=None, device="cpu"):
    import edgespec_export.build as build

    calls, lines = [], []

    def start(module, args, env):
        calls.append((module, args, env))
        proc = proc_of(tmp_path)
        return proc

    monkeypatch.setattr(build, "start_builder", start)
    out = build.run_builder(tmp_path / "hf", tmp_path, tmp_path / "cache", precision, quant or _q(), lines.append,
                            device)
    return out, calls, lines


def test_run_builder_gives_the_builder_its_arguments_and_reads_its_files(monkeypatch, tmp_path):
    import edgespec_export.build as build

    out, calls, lines = _run(monkeypatch, tmp_path, lambda d: _FakeBuilder([b"Reading layer 0\n"], out_dir=d),
                             quant=_q(block_size=64), device="cuda")
    (module, args, env), = calls
    assert module == "edgespec_export.builder_shim" and env == {}
    assert args == ["-i", str(tmp_path / "hf"), "-o", str(tmp_path), "-p", "int4", "-e", "cuda", "-c",
                    str(tmp_path / "cache"), "--extra_options", "block_size=64", "is_symmetric=false",
                    "accuracy_level=4", "op_types_to_quantize=MatMul"]
    assert out.model_dir == tmp_path and out.genai_config == {"model": {"type": "qwen2"}} and out.layout == "cuda"
    assert out.extra_options["block_size"] == "64" and not build.RUNNING
    # a float build: no extra options at all
    out, calls, _ = _run(monkeypatch, tmp_path, lambda d: _FakeBuilder([], out_dir=d), precision="fp32")
    assert "--extra_options" not in calls[0][1] and out.layout == "cpu"


@pytest.mark.parametrize("algo, precision, swapped", [("hqq", "int4", True), ("q4_k", "int4", True),
                                                      ("hqq", "fp32", False), ("k_quant", "int4", False)])
def test_the_swapped_quantizers_run_in_their_own_module_on_the_cpu(monkeypatch, tmp_path, algo, precision, swapped):
    """hqq and q4_k: export/hqq_builder.py's builder, told its algorithm, with no CUDA device visible (onnxruntime's
    HQQ would solve on one: a bundle must not depend on the machine that exported it); a float build of the same
    options is the plain builder's."""
    _, calls, _ = _run(monkeypatch, tmp_path, lambda d: _FakeBuilder([], out_dir=d), precision=precision,
                       quant=_q(algorithm=algo))
    (module, _, env), = calls
    if swapped:
        assert module == "edgespec_export.hqq_builder" and env == {"EDGESPEC_QUANT_ALGO": algo,
                                                                    "CUDA_VISIBLE_DEVICES": ""}
    else:
        assert module == "edgespec_export.builder_shim" and env == {}


def test_run_builder_condenses_the_builders_progress(monkeypatch, tmp_path):
    """Lines split across reads and ended by carriage returns (progress bars) are whole lines, the last one without
    its newline too (it was dropped); the quantizer's line per node is a count said every 25; bars and long lines are
    left out."""
    node = b"INFO:onnxruntime.quantization.matmul_nbits_quantizer:complete quantization of /m/MatMul ...\n"
    chunks = [b"Reading emb", b"edding layer\r", b"Reading layer 0\r\n", b"50%|###  | 3/6 [00:01<00:01, 2.0it/s]\r",
              *[node] * 27, b"x" * 200 + b"\n", b"\n\nSaving ONNX model in out\n", b"Saving GenAI config"]
    _, _, lines = _run(monkeypatch, tmp_path, lambda d: _FakeBuilder(chunks, out_dir=d))
    assert lines == ["    builder: Reading embedding layer", "    builder: Reading layer 0",
                     "    builder: quantized 1 MatMuls ...", "    builder: quantized 26 MatMuls ...",
                     "    builder: Saving ONNX model in out", "    builder: Saving GenAI config"]


def test_a_failed_builder_is_one_line_with_its_last_words(monkeypatch, tmp_path):
    """A non-zero exit: an ExportError naming the exit code and the builder's last line; the traceback's lines are
    not logged as progress."""
    chunks = [b"Reading layer 0\n", b"Traceback (most recent call last):\n", b"  File \"builder.py\", line 1\n",
              b"NotImplementedError: Gemma9ForCausalLM is not supported"]  # (its newline never came)
    with pytest.raises(ExportError) as e:
        _run(monkeypatch, tmp_path, lambda d: _FakeBuilder(chunks, rc=1, out_dir=d))
    assert str(e.value) == ("onnxruntime-genai's model builder failed (exit 1): NotImplementedError: Gemma9ForCausalLM "
                            "is not supported")
    long = [f"line {i}\n".encode() for i in range(30)]
    with pytest.raises(ExportError, match=r"failed \(exit -11\): line 29$"):
        _run(monkeypatch, tmp_path, lambda d: _FakeBuilder(long, rc=-11, out_dir=d))


@pytest.mark.parametrize("files", [("genai_config.json",), ("model.onnx",), ()])
def test_a_builder_that_wrote_no_model_is_refused(monkeypatch, tmp_path, files):
    with pytest.raises(ExportError, match="the model builder wrote no model.onnx/genai_config.json in"):
        _run(monkeypatch, tmp_path, lambda d: _FakeBuilder([], out_dir=d, files=files))


def test_a_builder_stopped_while_it_runs_is_killed_and_forgotten(monkeypatch, tmp_path):
    """An error in the log callback (or Ctrl-C) while the builder runs: the process is killed and waited for, and
    no longer in ``RUNNING`` (the exporter's SIGTERM handler kills what is there)."""
    import edgespec_export.build as build

    procs = []

    def proc(d):
        procs.append(_FakeBuilder([b"Reading layer 0\n", b"Reading layer 1\n"], out_dir=d))
        return procs[-1]

    def log(line):
        assert build.RUNNING == {procs[0]}
        raise KeyboardInterrupt

    monkeypatch.setattr(build, "start_builder", lambda module, args, env: proc(tmp_path))
    with pytest.raises(KeyboardInterrupt):
        build.run_builder(tmp_path, tmp_path, tmp_path, "int4", _q(), log)
    assert procs[0].killed and not build.RUNNING
