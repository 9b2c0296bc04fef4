"""Run onnxruntime-genai's model builder on a Hugging Face directory, with live progress."""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from edgespec.errors import ExportError
from edgespec.manifest import Quantization

RUNNING: set = set()  # the model builder's processes now running


@dataclass(frozen=True)
class QuantOptions:
    """INT4/INT8 weight-only quantization (MatMulNBits) options."""

    block_size: int = 32
    # asymmetric (zero points) by default: measured with scripts/compare_int4.py at the same decode
    # speed, Qwen2.5-Coder-1.5B INT4 perplexity +0.25 instead of +0.34, top-1 0.929 instead of 0.895
    symmetric: bool | None = None  # None: not asked for, the default (asymmetric)
    accuracy_level: int = 4
    quantize_lm_head: bool = True
    quantize_embeddings: bool = False
    algorithm: str = "rtn"  # rtn | k_quant
    fp8_scheme: str = "channel"  # channel | block (FP8 scales; block uses block_size)

    def __post_init__(self):
        if self.block_size not in (16, 32, 64, 128, 256):
            raise ExportError(f"--block-size must be 16, 32, 64, 128 or 256, got {self.block_size}")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise ExportError(f"--accuracy-level must be 0..4, got {self.accuracy_level}")
        if self.algorithm not in ("rtn", "k_quant"):
            raise ExportError(f"--quant-algo must be rtn or k_quant, got {self.algorithm!r}")
        if self.fp8_scheme not in ("channel", "block"):
            raise ExportError(f"--fp8-scheme must be channel or block, got {self.fp8_scheme!r}")

    @property
    def is_symmetric(self) -> bool:
        return bool(self.symmetric)

    def record(self) -> Quantization:
        """The manifest's record of an int4/int8 quantization with these options."""
        return Quantization(block_size=self.block_size, symmetric=self.is_symmetric,
                            accuracy_level=self.accuracy_level, quantize_lm_head=self.quantize_lm_head,
                            quantize_embeddings=self.quantize_embeddings, algorithm=self.algorithm)


@dataclass
class BuildResult:
    model_dir: Path
    genai_config: dict
    extra_options: dict = field(default_factory=dict)


def builder_args(precision: str, quant: QuantOptions) -> tuple[str, str, dict]:
    """Map an edgespec precision to the builder's (precision, execution provider, extra options)."""
    extra: dict[str, str] = {}
    if precision in ("int4", "int8"):
        extra.update(block_size=str(quant.block_size), is_symmetric=str(quant.is_symmetric).lower(),
                     accuracy_level=str(quant.accuracy_level))
        if quant.algorithm != "rtn":
            extra["algo_config"] = quant.algorithm
        ops = ["MatMul"] + (["Gather"] if quant.quantize_embeddings else [])
        extra["op_types_to_quantize"] = "/".join(ops)
        if not quant.quantize_lm_head:
            extra["nodes_to_exclude"] = "/lm_head/MatMul"
        return precision, "cpu", extra
    if precision in ("fp32", "fp8"):  # fp8: the float32 graph, rewritten by export/fp8.py
        return "fp32", "cpu", extra
    if precision == "fp16":
        # FP16 graphs are built for CUDA (the builder's only FP16 layout); onnxruntime's CPU EP runs them too.
        return "fp16", "cuda", extra
    raise ExportError(f"precision {precision!r} is not built by the model builder")


def run_builder(hf_dir: Path, out_dir: Path, cache_dir: Path, precision: str, quant: QuantOptions,
                log=lambda s: print(s, file=sys.stderr, flush=True)) -> BuildResult:
    prec, ep, extra = builder_args(precision, quant)
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir), "-o", str(out_dir),
           "-p", prec, "-e", ep, "-c", str(cache_dir)]
    if extra:
        cmd += ["--extra_options"] + [f"{k}={v}" for k, v in extra.items()]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    RUNNING.add(proc)  # killed on SIGTERM (export/output.py)
    tail: list[str] = []
    buf = b""
    quantized = 0
    assert proc.stdout is not None
    while True:
        chunk = proc.stdout.read1(4096) if hasattr(proc.stdout, "read1") else proc.stdout.read(4096)
        if not chunk:
            break
        buf += chunk
        *lines, buf = buf.replace(b"\r", b"\n").split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8", "replace").strip()
            if not line:
                continue
            tail = (tail + [line])[-20:]
            if "matmul_nbits_quantizer" in line:  # one INFO line per node: condense to a count
                if "complete quantization" in line:
                    quantized += 1
                    if quantized % 25 == 1:
                        log(f"    builder: quantized {quantized} MatMuls ...")
                continue
            if line.startswith(("Reading layer", "Saving ONNX", "Quantizing", "Reading embedding", "Reading LM head",
                                "Saving GenAI")) or "it/s]" not in line and len(line) < 160:
                log(f"    builder: {line}")
    rc = proc.wait()
    RUNNING.discard(proc)
    if rc != 0:
        raise ExportError(f"onnxruntime-genai's model builder failed (exit {rc}): {tail[-1] if tail else ''}")
    cfg_path = out_dir / "genai_config.json"
    if not cfg_path.is_file() or not (out_dir / "model.onnx").is_file():
        raise ExportError(f"the model builder wrote no model.onnx/genai_config.json in {out_dir}")
    return BuildResult(out_dir, json.loads(cfg_path.read_text()), extra)
