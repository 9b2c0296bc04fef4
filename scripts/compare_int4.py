#!/usr/bin/env python
"""INT4 weight quantizers side by side: round-to-nearest against what onnxruntime also ships.

    python scripts/compare_int4.py bundles/smollm2-fp32 [--block-size 32] [--out reports/int4-algos.md]

Takes the float32 target graph of an fp32 bundle (the builder's graph, the same one the builder
quantizes for ``--target-precision int4``) and quantizes its MatMul weights with each of
onnxruntime's ``MatMulNBitsQuantizer`` algorithms: RTN (symmetric and asymmetric), k_quant, HQQ and
GPTQ (calibrated on the bench prompts, not on the evaluation text). For each that succeeds it
measures, with onnxruntime on the CPU EP, against the float32 graph on the export quality text:
perplexity, top-1 agreement, mean KL, and the time of a one-token decode step (median of 32) —
which shows whether the result still runs on MatMulNBits' fast int8 kernel. An algorithm that
fails is reported with the first line of its error. Export-time dependencies (onnx) needed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgespec.manifest import Quantization, load_manifest  # noqa: E402
from edgespec.onnx_lm import OnnxLM  # noqa: E402
from edgespec.providers import choose  # noqa: E402
from edgespec.tokenizer import Tokenizer  # noqa: E402
from edgespec_export.quality import MAX_TOKENS, TEXTS, score  # noqa: E402

STEPS = 32


def _calibration(spec, tok, n: int = 8):
    """GPTQ's calibration reader: the first turns of the bench prompts, each a fresh sequence."""
    from onnxruntime.quantization import CalibrationDataReader

    prompts = [json.loads(line)["turns"][0] for line in
               (ROOT / "edgespec" / "data" / "prompts.jsonl").read_text().splitlines() if line.strip()][:n]
    io = spec.io
    feeds = []
    for p in prompts:
        ids = np.array([tok.encode(p)[:128]], dtype=np.int64)
        f = {io.input_ids: ids, io.attention_mask: np.ones_like(ids)}
        if io.position_ids:
            f[io.position_ids] = np.arange(ids.shape[1], dtype=np.int64)[None, :]
        if io.logits_skip:  # the export's logits skip (session 29): every row's logits
            f[io.logits_skip] = np.zeros(1, np.int64)
        for layer in range(spec.num_layers):
            for name in (io.past_key, io.past_value):
                heads, width = spec.kv_shape(layer)  # (Gemma 4's global layers: wider)
                f[name % layer] = np.zeros((1, heads, 0, width), np.float32)
        feeds.append(f)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds)

        def get_next(self):
            return next(self.it, None)

        def __deepcopy__(self, memo):  # the quantizer deep-copies its reader before each pass
            return Reader()

    return Reader()


def _configs(block: int, spec, tok) -> dict:
    from onnxruntime.quantization import matmul_nbits_quantizer as q

    return {
        "RTN sym": dict(algo_config=q.DefaultWeightOnlyQuantConfig(
            block_size=block, is_symmetric=True, accuracy_level=4), is_symmetric=True),
        "RTN asym (zero points)": dict(algo_config=q.DefaultWeightOnlyQuantConfig(
            block_size=block, is_symmetric=False, accuracy_level=4), is_symmetric=False),
        "k_quant": dict(algo_config=q.KQuantWeightOnlyQuantConfig(), is_symmetric=False),
        "HQQ": dict(algo_config=q.HQQWeightOnlyQuantConfig(block_size=block, bits=4), is_symmetric=False),
        "GPTQ": dict(algo_config=q.GPTQWeightOnlyQuantConfig(
            calibration_data_reader=_calibration(spec, tok), block_size=block), is_symmetric=False),
    }


def _quantize_child(bundle: str, name: str, dst: str, block: int) -> None:
    """Quantize in a fresh process: GPTQ runs onnxruntime sessions of its own with per-session
    threads, which a process that already holds edgespec's global thread pool refuses."""
    import logging

    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    logging.getLogger().setLevel(logging.WARNING)
    m = load_manifest(bundle)
    tok = Tokenizer(m.tokenizer_dir, add_bos=m.add_bos, bos_token_id=m.bos_token_id)
    _quantize(m.target.path, Path(dst), block, _configs(block, m.target, tok)[name])


def _quantize(src: Path, dst: Path, block: int, cfg: dict) -> None:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    model = onnx.load(str(src))
    qz = MatMulNBitsQuantizer(model, bits=4, block_size=block, is_symmetric=cfg["is_symmetric"], accuracy_level=4,
                              algo_config=cfg["algo_config"])
    qz.process()
    out = qz.model.model if hasattr(qz.model, "model") else qz.model
    for node in out.graph.node:  # HQQ's quantizer writes no accuracy_level: give every node the same one
        if node.op_type == "MatMulNBits" and not any(a.name == "accuracy_level" for a in node.attribute):
            node.attribute.append(onnx.helper.make_attribute("accuracy_level", 4))
    onnx.save_model(out, str(dst), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=dst.name + ".data", size_threshold=1024)


def _logits(lm: OnnxLM, ids: list[int]) -> np.ndarray:
    lm.reset()
    return lm.forward(ids)[:, : lm.spec.vocab_size]


def _step_ms(lm: OnnxLM, ids: list[int]) -> float:
    lm.reset()
    lm.forward(ids[:64])
    times = []
    for t in ids[64: 64 + STEPS]:
        t0 = time.perf_counter()
        lm.forward([t])
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def evaluate(spec, ref: list[np.ndarray], texts: list[list[int]], long_ids: list[int]) -> dict:
    lm = OnnxLM(spec, min(512, spec.max_context), choose(["cpu"]))
    s = score((ids, r, _logits(lm, ids)) for ids, r in zip(texts, ref))
    return {"perplexity": s["perplexity"], "top1": s["top1"], "kl": s["kl"],
            "step_ms": _step_ms(lm, long_ids), "min_width": lm.min_width}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", help="an fp32 bundle (edgespec export --target-precision fp32)")
    ap.add_argument("--block-size", type=int, default=32)
    ap.add_argument("--only", nargs="*", help="run only these algorithms (names as in the table)")
    ap.add_argument("--out", type=Path, help="also write the table (markdown) here")
    ap.add_argument("--quantize-child", nargs=2, metavar=("NAME", "DST"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.quantize_child:
        _quantize_child(a.bundle, a.quantize_child[0], a.quantize_child[1], a.block_size)
        return 0
    m = load_manifest(a.bundle)
    spec = m.target
    if spec.precision != "fp32":
        sys.exit(f"{a.bundle}: the target is {spec.precision}; this needs an fp32 bundle")
    tok = Tokenizer(m.tokenizer_dir, add_bos=m.add_bos, bos_token_id=m.bos_token_id)
    unknown = set(a.only or ()) - set(_configs(a.block_size, spec, tok))
    if unknown:
        sys.exit(f"unknown algorithm {sorted(unknown)}; choose from {list(_configs(a.block_size, spec, tok))}")
    texts = [tok.encode(t, add_special=False)[:MAX_TOKENS] for t in TEXTS]
    long_ids = [i for t in texts for i in t][: 64 + STEPS]
    fp32 = OnnxLM(spec, min(512, spec.max_context), choose(["cpu"]))
    ref = [_logits(fp32, ids) for ids in texts]
    fp32_score = score((ids, r, r) for ids, r in zip(texts, ref))
    rows = [("float32 (reference)", {"perplexity": fp32_score["perplexity"], "top1": 1.0,
                                     "kl": 0.0, "step_ms": _step_ms(fp32, long_ids), "min_width": 1}, "")]
    del fp32
    print(f"float32: perplexity {rows[0][1]['perplexity']:.3f}, step {rows[0][1]['step_ms']:.2f} ms", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name in _configs(a.block_size, spec, tok):
            if a.only and name not in a.only:
                continue
            dst = Path(tmp) / f"{len(rows)}" / "model.onnx"
            dst.parent.mkdir()
            t0 = time.perf_counter()
            child = subprocess.run([sys.executable, __file__, "--quantize-child", name, str(dst), a.bundle,
                                    "--block-size", str(a.block_size)], capture_output=True, text=True)
            took = time.perf_counter() - t0
            if child.returncode != 0:
                # report what onnxruntime's quantizer raised: the last line of the traceback, and where
                tb = [ln for ln in child.stderr.strip().splitlines() if ln.strip()]
                frames = [re.search(r'File "([^"]+)", line (\d+)', ln) for ln in tb]
                last = [f for f in frames if f]
                why = f"failed: {tb[-1] if tb else 'exit ' + str(child.returncode)}"
                if last:
                    why += f" ({Path(last[-1].group(1)).name}:{last[-1].group(2)})"
                print(f"{name}: {why}", flush=True)
                rows.append((name, None, why))
                continue
            size = sum(f.stat().st_size for f in dst.parent.iterdir())
            qspec = replace(spec, path=dst, precision="int4",
                            quant=Quantization(block_size=a.block_size, accuracy_level=4))
            r = evaluate(qspec, ref, texts, long_ids)
            r["mib"] = size / 2**20
            note = f"quantized in {took:.0f} s"
            print(f"{name}: perplexity {r['perplexity']:.3f}, top-1 {r['top1']:.3f}, KL {r['kl']:.4f}, "
                  f"step {r['step_ms']:.2f} ms, {r['mib']:.0f} MiB, {note}", flush=True)
            rows.append((name, r, note))
            for f in dst.parent.iterdir():
                f.unlink()
    base = rows[0][1]
    lines = [f"INT4 quantizers on {m.name} (block {a.block_size}, accuracy level 4, CPU EP; "
             f"`python scripts/compare_int4.py {a.bundle} --block-size {a.block_size}`)", "",
             "| algorithm | perplexity (Δ vs float32) | top-1 vs float32 | mean KL | decode step | size | note |",
             "|---|---|---|---|---|---|---|"]
    for name, r, note in rows:
        if r is None:
            lines.append(f"| {name} | – | – | – | – | – | {note} |")
            continue
        size = f"{r['mib']:.0f} MiB" if "mib" in r else "–"
        lines.append(f"| {name} | {r['perplexity']:.3f} ({r['perplexity'] - base['perplexity']:+.3f}) | "
                     f"{r['top1']:.3f} | {r['kl']:.4f} | {r['step_ms']:.2f} ms "
                     f"({r['step_ms'] / base['step_ms']:.2f}× float32) | {size} | {note} |")
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
