"""``edgespec export``: the build stage's command (its code is the ``edgespec_export`` package)."""
from __future__ import annotations

import click

from .manifest import DRAFTER_PRECISIONS, LAYOUTS, TARGET_PRECISIONS, default_drafter_precision


# --kv-dtype's help, for export --exact-kernels and exact-kernels alike
_KV_HELP = ("the KV cache's type under edgespec's attention: float16 halves its memory and the bytes each decode "
            "call's attention reads (faster at long contexts; a new key or value is rounded to float16 once, as it is "
            "stored, and greedy decoding stays exact against itself); int8 (a float32 scale per 32 lanes, head sizes "
            "a multiple of 32) takes 0.56x of float16's, its rows quantized once as they are stored, exact likewise.")


class NonEmptyPath(click.Path):
    """A path that is not empty: "" is the current folder to the file system, and an unset shell variable
    (`drafter-vocab "$B" 200`) rewrote the bundle the shell stood in (session 55, a review; `generate ""` ran the
    bundle in the current folder, session 65). ``what``: what the message asks for (a folder, a file)."""

    def __init__(self, *a, what: str = "a folder", **kw):
        super().__init__(*a, **kw)
        self.what = what

    def convert(self, value, param, ctx):
        if isinstance(value, str) and not value.strip():
            self.fail(f"is empty (an unset shell variable?); name {self.what}", param, ctx)
        return super().convert(value, param, ctx)


@click.command()
@click.argument("target", type=NonEmptyPath())
@click.option("--drafter", "drafter", default=None, help="Drafter model: HF directory, .gguf file or hub id.")
@click.option("-o", "--output", "output", required=True, type=NonEmptyPath(), help="Bundle directory to write.")
@click.option("--target-precision", type=click.Choice(TARGET_PRECISIONS), default="int4",
              show_default=True)
@click.option("--drafter-precision", type=click.Choice(DRAFTER_PRECISIONS), default=None,
              help="The drafter's precision (default: fp32; fp16 for a drafter in the cuda layout, which has no fp32).")
@click.option("--max-context", type=int, default=None, help="Largest context the bundle allows (default: the model's).")
@click.option("--block-size", type=int, default=32, show_default=True,
              help="INT4/INT8 quantization block size (and FP8's with --fp8-scheme block). 128 decodes 1.35x "
                   "faster on an AVX-512 CPU at some quality cost (docs/bench/history.md, 'INT4 block size').")
@click.option("--drafter-block-size", type=int, default=32, show_default=True,
              help="The drafter's INT4/INT8 block size (its quality moves only the acceptance rate).")
@click.option("--drafter-quant-algo", type=click.Choice(["rtn", "k_quant", "hqq"]), default="rtn", show_default=True,
              help="The drafter's INT4 weights (see --quant-algo; hqq: int4, cpu layout, with --exact-kernels).")
@click.option("--fp8-scheme", type=click.Choice(["channel", "block"]), default="channel", show_default=True,
              help="FP8 weight scales: per output channel (TensorRT's layout) or per block.")
@click.option("--asymmetric/--symmetric", default=None,
              help="INT4/INT8 with zero points (the default: better quality at the same speed) or without.")
@click.option("--accuracy-level", type=int, default=4, show_default=True,
              help="MatMulNBits compute type: 4 int8, 3 bf16, 2 fp16, 1 fp32, 0 unset.")
@click.option("--quant-algo", type=click.Choice(["rtn", "k_quant", "gguf", "hqq", "q4_k"]), default="rtn", show_default=True,
              help="INT4 weights: rounded to nearest (rtn), k_quant, gguf: a .gguf target's own 4-bit blocks "
                   "(Q4_0, Q4_1, Q4_K) kept as they are, other types rounded to 4-bit blocks with a minimum (block 32; "
                   "perplexity near llama.cpp's on the same file: README, 'Perplexity'), or hqq: onnxruntime's HQQ "
                   "quantizer, a float zero point fitted to each block (README, 'Export quality'), or q4_k: llama.cpp's "
                   "Q4_K blocks fitted to the float weights (block 32). gguf, hqq and q4_k: "
                   "int4, cpu layout, with --exact-kernels (onnxruntime computes float zero points in float, slowly).")
@click.option("--no-quantize-lm-head", is_flag=True, help="Keep the lm_head in float.")
@click.option("--quantize-embeddings/--float-embeddings", default=None,
              help="INT4 embedding table (GatherBlockQuantized) or a float one; default: int4 targets and drafters "
                   "in the cuda layout quantize it, the cpu layout keeps the builder's choice.")
@click.option("--device", type=click.Choice(LAYOUTS), default="cpu", show_default=True,
              help="Graph layout: cpu (float32 activations and KV cache) or cuda (float16, for the CUDA and "
                   "TensorRT providers; builds without a GPU).")
@click.option("--drafter-device", type=click.Choice(LAYOUTS), default=None,
              help="The drafter's layout (default: --device), e.g. cpu for a drafter placed on the CPU.")
@click.option("--drafter-vocab", type=int, default=0, show_default=True,
              help="Cut the drafter's lm_head to this many tokens (special tokens, then BPE merge order); "
                   "0 keeps the full head. 'edgespec drafter-vocab' applies it to an exported bundle.")
@click.option("--drafter-vocab-corpus", multiple=True, type=NonEmptyPath(what="a file or folder"),
              help="Rank the kept tokens by their frequency in these text files or directories (repeatable).")
@click.option("--exact-kernels", is_flag=True,
              help="Rewrite the INT4 bundle to edgespec's width-invariant kernel (as 'edgespec exact-kernels') before "
                   "it is written (a failed rewrite leaves nothing, as any failed export): exact one-token decoding; "
                   "the bundle then runs on the CPU EP only (x86-64 and aarch64).")
@click.option("--kv-dtype", type=click.Choice(["float32", "float16", "int8"]), default=None,
              help="With --exact-kernels: " + _KV_HELP + " Default float16.")
@click.option("--no-quality", is_flag=True, help="Skip the quality report (faster).")
@click.option("--force", is_flag=True, help="Replace an existing bundle.")
def export(target, drafter, output, target_precision, drafter_precision, max_context, block_size,
           drafter_block_size, drafter_quant_algo, fp8_scheme,
           asymmetric, accuracy_level, quant_algo, no_quantize_lm_head, quantize_embeddings, device, drafter_device,
           drafter_vocab, drafter_vocab_corpus, exact_kernels, kv_dtype, no_quality, force):
    """Export TARGET (HF directory, .gguf file or hub id) into a bundle."""
    try:
        from edgespec_export import export_bundle
        from edgespec_export.build import FLOAT_ZERO_POINTS, QuantOptions
        from edgespec_export.bundle import _check_combination
        from .errors import ExportError
    except ImportError as e:
        raise click.ClickException(f"the export stage is not installed ({e.name}); pip install -e '.[export]'")
    q = QuantOptions(block_size=block_size, symmetric=None if asymmetric is None else not asymmetric, accuracy_level=accuracy_level,
                     algorithm=quant_algo, quantize_lm_head=not no_quantize_lm_head,
                     quantize_embeddings=quantize_embeddings, fp8_scheme=fp8_scheme)
    ctx = click.get_current_context()
    # the options the command line set, whatever their value: one given as its default that does nothing for this
    # export is refused as any other value would be (README, export)
    given = {p for p in ("drafter_precision", "drafter_device", "accuracy_level", "fp8_scheme", "block_size",
                         "quant_algo", "drafter_block_size", "drafter_quant_algo", "drafter_vocab")
             if ctx.get_parameter_source(p) is not click.core.ParameterSource.DEFAULT}
    # (the cuda layout has no fp32: `--device cuda` with a drafter was refused unless a precision was named; session
    # 56, a review)
    drafter_precision = drafter_precision or default_drafter_precision(drafter_device or device)
    if drafter is not None and not drafter.strip():  # (an empty variable in a script: exported without a drafter)
        raise click.UsageError("--drafter is empty: give the drafter model (an HF directory, .gguf file or hub id)")
    if drafter is not None and _same_model(target, drafter):  # (session 65, a review: exported without a word)
        click.echo("note: the drafter is the target itself: a draft step would cost what a target call does, so the "
                   "model drafter never pays (without --drafter, prompt lookup and the suffix drafter still draft)",
                   err=True)
    for flag, differs in (("--drafter-block-size", drafter_block_size != 32 or "drafter_block_size" in given),
                          ("--drafter-quant-algo", drafter_quant_algo != "rtn" or "drafter_quant_algo" in given)):
        if differs and not (drafter and drafter_precision in ("int4", "int8")):
            raise click.UsageError(f"{flag} applies to an int4/int8 --drafter")
    if not drafter:  # the drafter's options, given without a drafter, would do nothing (export_bundle
        # refuses a --drafter-vocab and its corpus itself: one given as 0 is refused as it refuses another N)
        flags = [f"--{p.replace('_', '-')}" for p in ("drafter_precision", "drafter_device") if p in given]
        if flags:
            raise click.UsageError(f"{', '.join(flags)} applies to a --drafter; this export has none")
        if "drafter_vocab" in given:
            raise ExportError("--drafter-vocab applies to a bundle with a --drafter")
    _check_combination(target_precision, q, frozenset({"algorithm"} if "quant_algo" in given else set()) |
                       frozenset(given))
    if exact_kernels and (target_precision != "int4" or device != "cpu" or accuracy_level != 4):
        raise click.UsageError("--exact-kernels applies to an int4 target in the cpu layout at accuracy level 4")
    if kv_dtype and not exact_kernels:
        raise click.UsageError("--kv-dtype applies with --exact-kernels (edgespec's attention); the cpu layout's "
                               "KV cache is float32, the cuda layout's float16")
    try:
        dq = QuantOptions(block_size=drafter_block_size, accuracy_level=4, algorithm=drafter_quant_algo)
    except ExportError as e:  # (its message names the target's option: this is the drafter's; the drafter's
        # --quant-algo choices and fixed accuracy level leave --block-size the only one it can name)
        raise ExportError(str(e).replace("--block-size", "--drafter-block-size")) from None
    out = export_bundle(target, output, drafter=drafter, target_precision=target_precision,
                        drafter_precision=drafter_precision, max_context=max_context, quant=q, drafter_quant=dq,
                        force=force, quality=not no_quality, device=device, drafter_device=drafter_device,
                        drafter_vocab=drafter_vocab, drafter_vocab_corpus=drafter_vocab_corpus,
                        exact_kernels=exact_kernels, kv_dtype=kv_dtype)  # (the rewrite before the bundle is published)
    algos = list(dict.fromkeys(a for a in (quant_algo, drafter_quant_algo) if a in FLOAT_ZERO_POINTS))
    if algos and not exact_kernels:
        algo = " and ".join(algos)  # (said once the bundle is written)
        click.echo(f"note: onnxruntime computes the {algo} blocks' float zero points in float, several times slower than "
                   "its int8 path: run 'edgespec exact-kernels' on this bundle (or export with --exact-kernels)", err=True)
    if (str(target).lower().endswith(".gguf") and target_precision == "int4" and quant_algo in ("rtn", "k_quant")
            and device == "cpu"):
        click.echo(f"note: the GGUF's weights were dequantized and rounded again ({quant_algo}, block {block_size}); "
                   "--quant-algo gguf --exact-kernels keeps the file's own 4-bit blocks (held-out perplexity of the "
                   "Qwen 1.5B Q4_K_M: +0.7% over llama.cpp's on the same file, against +5.7% at block 128; README, "
                   "'Perplexity')", err=True)
    click.echo(str(out))


def _same_model(target: str, drafter: str) -> bool:
    """Whether the two sources name one model: the same file or folder (through links), or the same hub id."""
    import os

    a, b = os.path.expanduser(target), os.path.expanduser(drafter)
    if os.path.exists(a) and os.path.exists(b):
        try:
            return os.path.samefile(a, b)
        except OSError:
            return False
    return a.strip().rstrip("/") == b.strip().rstrip("/")


@click.command("drafter-vocab")
@click.argument("bundle", type=NonEmptyPath())
@click.argument("n", type=click.IntRange(min=1))
@click.option("-o", "--output", "output", default=None, type=NonEmptyPath(),
              help="Write the result as a new bundle here (the unchanged files copied); "
                   "default: rewrite BUNDLE in place.")
@click.option("--corpus", multiple=True, type=NonEmptyPath(what="a file or folder"),
              help="Rank the kept tokens by their frequency in these text files or directories (repeatable); "
                   "default: BPE merge order.")
@click.option("--force", is_flag=True, help="Replace an existing bundle at --output.")
def drafter_vocab(bundle, n, output, corpus, force):
    """Cut the drafter lm_head of an exported BUNDLE to N tokens (as export --drafter-vocab N):
    the graph, its data, the kept ids and the manifest's sizes and hashes are rewritten, atomically."""
    import sys

    try:
        from edgespec_export.head import apply_to_bundle
    except ImportError as e:
        raise click.ClickException(f"the export stage is not installed ({e.name}); pip install -e '.[export]'")
    _force_needs_output(force, output)
    out = apply_to_bundle(bundle, n, output, corpus=corpus, force=force, log=lambda line: print(line, file=sys.stderr, flush=True))
    click.echo(str(out))


def _force_needs_output(force: bool, output) -> None:
    """``--force`` replaces the bundle at ``--output``; alone it would mean nothing (an in-place rewrite needs none)."""
    if force and output is None:
        raise click.UsageError("--force replaces an existing bundle at --output; without --output the bundle is "
                               "rewritten in place (no --force needed)")


@click.command("exact-kernels")
@click.argument("bundle", type=NonEmptyPath())
@click.option("-o", "--output", "output", default=None, type=NonEmptyPath(),
              help="Write the result as a new bundle here (the unchanged files copied); "
                   "default: rewrite BUNDLE in place.")
@click.option("--force", is_flag=True, help="Replace an existing bundle at --output.")
@click.option("--onnxruntime-attention", is_flag=True,
              help="Keep onnxruntime's GroupQueryAttention (padded to two query rows in the target) instead of "
                   "edgespec.DecodeAttention (to compare the two).")
@click.option("--kv-dtype", type=click.Choice(["float32", "float16", "int8"]), default=None,
              help="Default float16 (float32 with --onnxruntime-attention); " + _KV_HELP)
def exact_kernels(bundle, output, force, onnxruntime_attention, kv_dtype):
    """Rewrite an INT4 BUNDLE to edgespec's width-invariant CPU kernels (edgespec.MatMulQ4 and
    edgespec.DecodeAttention), so that one-token calls are exact and plain decoding pays no
    two-token tax. Runs on x86-64 CPUs (AVX2 + FMA + F16C; AVX-512 VNNI and AMX where present, the same results
    bitwise) and on others through the kernels' portable C++ path (aarch64: a Jetson's CPU), and needs g++ (the
    kernels are built on first use)."""
    import sys

    try:
        from edgespec_export.kernels import apply_to_bundle
    except ImportError as e:
        raise click.ClickException(f"the export stage is not installed ({e.name}); pip install -e '.[export]'")
    _force_needs_output(force, output)
    out = apply_to_bundle(bundle, output, force=force, log=lambda line: print(line, file=sys.stderr, flush=True),
                          own_attention=not onnxruntime_attention, kv_dtype=kv_dtype)  # (None: the default)
    click.echo(str(out))
