"""Run onnxruntime-genai's model builder on a Hugging Face directory, with live progress."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from edgespec.errors import ExportError
from edgespec.manifest import LAYOUTS, Quantization

from .builder_zygote import prestart_builder, start_builder  # noqa: F401  (prestart_builder: bundle.py's)

RUNNING: set = set()  # the model builder's processes now running


ALGORITHMS = ("rtn", "k_quant", "gguf", "hqq", "q4_k")
# the algorithms whose blocks have float zero points (a minimum per block): asymmetric, 4-bit, fast only on
# edgespec's exact kernels (onnxruntime's CPU kernel computes them in float), the cpu layout
FLOAT_ZERO_POINTS = ("gguf", "hqq", "q4_k")
# the algorithms the builder runs through export/hqq_builder.py's node quantizers
SWAPPED = ("hqq", "q4_k")


@dataclass(frozen=True)
class QuantOptions:
    """INT4/INT8 weight-only quantization (MatMulNBits) options."""

    block_size: int = 32
    # asymmetric (zero points) by default: measured with scripts/compare_int4.py at the same decode
    # speed, Qwen2.5-Coder-1.5B INT4 perplexity +0.25 instead of +0.34, top-1 0.929 instead of 0.895
    symmetric: bool | None = None  # None: not asked for, the default (asymmetric)
    accuracy_level: int = 4
    quantize_lm_head: bool = True
    # None: the layout's default, int4 tables in the cuda layout (measured on SmolLM2 within the
    # quality report's noise of float16 tables at a quarter of their size: docs/gpu.md), the
    # builder's own choice in the cpu layout (float32, or a tied model's shared int4 table)
    quantize_embeddings: bool | None = None
    # rtn | k_quant | gguf (a GGUF's own 4-bit blocks: export/gguf_blocks.py) | hqq (onnxruntime's HQQ: float
    # zero points fitted per block) | q4_k (llama.cpp's Q4_K blocks fitted to the float weights; both
    # export/hqq_builder.py)
    algorithm: str = "rtn"
    fp8_scheme: str = "channel"  # channel | block (FP8 scales; block uses block_size)

    def __post_init__(self):
        if self.block_size not in (16, 32, 64, 128, 256):
            raise ExportError(f"--block-size must be 16, 32, 64, 128 or 256, got {self.block_size}")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise ExportError(f"--accuracy-level must be 0..4, got {self.accuracy_level}")
        if self.algorithm not in ALGORITHMS:
            raise ExportError(f"--quant-algo must be rtn, k_quant, gguf, hqq or q4_k, got {self.algorithm!r}")
        if self.algorithm in ("gguf", "q4_k") and self.block_size != 32:
            what = "keeps the GGUF's" if self.algorithm == "gguf" else "writes Q4_K's"
            raise ExportError(f"--quant-algo {self.algorithm} {what} blocks of 32 weights: --block-size 32, not "
                              f"{self.block_size}")
        if self.fp8_scheme not in ("channel", "block"):
            raise ExportError(f"--fp8-scheme must be channel or block, got {self.fp8_scheme!r}")

    @property
    def is_symmetric(self) -> bool:
        return bool(self.symmetric)

    def record(self) -> Quantization:
        """The manifest's record of an int4/int8 quantization with these options."""
        return Quantization(block_size=self.block_size, symmetric=self.is_symmetric,
                            accuracy_level=self.accuracy_level, quantize_lm_head=self.quantize_lm_head,
                            quantize_embeddings=bool(self.quantize_embeddings), algorithm=self.algorithm)

    def for_layout(self, precision: str, device: str) -> "QuantOptions":
        """These options with the layout's default for what was not asked for."""
        if self.quantize_embeddings is not None:
            return self
        return replace(self, quantize_embeddings=True) if precision == "int4" and device == "cuda" else self


@dataclass
class BuildResult:
    model_dir: Path
    genai_config: dict
    extra_options: dict = field(default_factory=dict)
    layout: str = "cpu"  # the builder's execution-provider layout: cpu or cuda


def builder_args(precision: str, quant: QuantOptions, device: str = "cpu") -> tuple[str, str, dict]:
    """Map an edgespec precision and device layout to the builder's (precision, execution provider,
    extra options). The builder only writes graphs: ``-e cuda`` needs no GPU. Its CUDA layout has
    float16 activations, logits and KV cache (CUDA's GroupQueryAttention takes float16/bfloat16 only)
    and stores every float initializer, embedding table included, in float16."""
    if device not in LAYOUTS:
        raise ExportError(f"--device must be one of {', '.join(LAYOUTS)}, got {device!r}")
    extra: dict[str, str] = {}
    if precision in ("int4", "int8"):
        if quant.quantize_embeddings and precision == "int8":
            raise ExportError("--quantize-embeddings needs int4 (the builder's GatherBlockQuantized is 4-bit only)")
        extra.update(block_size=str(quant.block_size), is_symmetric=str(quant.is_symmetric).lower(),
                     accuracy_level=str(quant.accuracy_level))
        # (gguf: the builder's RTN, then the file's blocks put in; hqq, q4_k: the quantizer swapped, export/hqq_builder.py)
        if quant.algorithm not in ("rtn", "gguf", *SWAPPED):
            extra["algo_config"] = quant.algorithm
        ops = ["MatMul"] + (["Gather"] if quant.quantize_embeddings else [])
        extra["op_types_to_quantize"] = "/".join(ops)
        if not quant.quantize_lm_head:
            extra["nodes_to_exclude"] = "/lm_head/MatMul"
        # asked for: a float table even where the model ties it to the lm_head; with hqq and q4_k always (the builder's
        # shared table would be a GatherBlockQuantized, which takes no float zero points)
        if quant.quantize_embeddings is False or quant.algorithm in SWAPPED:
            extra["shared_embeddings"] = "false"
        return precision, device, extra
    if precision == "fp32":
        if device == "cuda":
            raise ExportError("fp32 has no cuda layout (the builder's CUDA layout is float16): use "
                              "--target-precision fp16 or fp8, or int4/int8, with --device cuda")
        return "fp32", "cpu", extra
    if precision == "fp8":  # the float graph of the layout, rewritten by export/fp8.py
        return ("fp16", "cuda", extra) if device == "cuda" else ("fp32", "cpu", extra)
    if precision == "fp16":
        # the builder's only FP16 layout is its CUDA one (recorded as such even with --device cpu);
        # onnxruntime's CPU EP runs it, slowly
        return "fp16", "cuda", extra
    raise ExportError(f"precision {precision!r} is not built by the model builder")


def run_builder(hf_dir: Path, out_dir: Path, cache_dir: Path, precision: str, quant: QuantOptions,
                log=lambda s: print(s, file=sys.stderr, flush=True), device: str = "cpu") -> BuildResult:
    prec, ep, extra = builder_args(precision, quant, device)
    swapped = quant.algorithm in SWAPPED and precision in ("int4", "int8")
    module = "edgespec_export.hqq_builder" if swapped else "edgespec_export.builder_shim"
    args = ["-i", str(hf_dir), "-o", str(out_dir), "-p", prec, "-e", ep, "-c", str(cache_dir)]
    if extra:
        args += ["--extra_options"] + [f"{k}={v}" for k, v in extra.items()]
    # (onnxruntime's HQQ moves weights to a visible CUDA device and solves in float16 there: the export stays on
    # the CPU so that a bundle does not depend on the machine it was exported on)
    env = dict(EDGESPEC_QUANT_ALGO=quant.algorithm, CUDA_VISIBLE_DEVICES="") if swapped else {}
    proc = start_builder(module, args, env)
    RUNNING.add(proc)  # killed on SIGTERM (export/output.py)
    tail: list[str] = []
    buf = b""
    quantized = 0
    failing = False  # past a traceback's first line: the rest is the builder's failure, said in one line at the end
    try:
        done = False
        while not done:
            chunk = proc.read()
            done = not chunk  # (at the end, a last line without its newline is a line too)
            buf += chunk if chunk else b"\n"
            *lines, buf = buf.replace(b"\r", b"\n").split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "replace").strip()
                if not line:
                    continue
                tail = (tail + [line])[-20:]
                failing = failing or line.startswith("Traceback (most recent call last)")
                if failing:
                    continue
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
    finally:  # (stopped while it ran: Ctrl-C in the exporting process alone, an error in the log callback)
        if proc in RUNNING:
            RUNNING.discard(proc)
            if proc.returncode is None:
                proc.kill()
                proc.wait()
    if rc != 0:
        raise ExportError(f"onnxruntime-genai's model builder failed (exit {rc}): {tail[-1] if tail else ''}")
    cfg_path = out_dir / "genai_config.json"
    if not cfg_path.is_file() or not (out_dir / "model.onnx").is_file():
        raise ExportError(f"the model builder wrote no model.onnx/genai_config.json in {out_dir}")
    return BuildResult(out_dir, json.loads(cfg_path.read_text()), extra, ep)
