#!/usr/bin/env python3
"""Random-weight models with the shapes of the Qwen2.5-Coder pair (1.5B target, 0.5B drafter).

Timing needs the shapes, not the weights: the real pair (1.6 GB) cannot reach a GPU machine with
no network in useful time, so the GPU run builds these there (torch and transformers are on that
machine) and exports them with `edgespec export --device cuda`. The tokenizer is the real Qwen one
(``--tokenizer DIR`` holding tokenizer.json and tokenizer_config.json, e.g. a bundle's
``tokenizer/``), so prompts and the export's validation texts tokenize as they do for the real
models.

Plain random weights give logits so flat that INT4 rounding moves the argmax at most positions
(the export's validation measured top-1 agreement 0.38 with torch on a 2-layer 1.5B-shaped model,
under its 0.6 bar). So the weights get one structure, which costs nothing in time (the same
matrices, the same kernels): the lm_head is the embedding table (tied or copied) and every layer
writes into the residual stream at 1/100 of the default scale (o_proj and down_proj), so the last
hidden state stays close to the last token's embedding and each model predicts its input token
with a wide margin. Both models then agree on every token: a speculative run over them accepts
every draft, the best case, which is what these models measure (the real acceptance comes from the
real pair on a CPU).

    python scripts/gpu/make_shaped.py --tokenizer bundles/qwen-coder-b128/tokenizer -o /tmp/shaped
    python scripts/gpu/make_shaped.py ... --layers 2     # a quick check on a CPU
"""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

# The published configurations (Qwen2.5-1.5B / 0.5B; the Coder models share them).
SHAPES = {
    "qwen1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                     num_key_value_heads=2, tie_word_embeddings=False),
    "qwen0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                     num_key_value_heads=2, tie_word_embeddings=True),
}
COMMON = dict(vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
              bos_token_id=151643, eos_token_id=151645, hidden_act="silu", use_sliding_window=False)
LAYER_OUTPUT_SCALE = 0.01


def make(name: str, out: Path, tokenizer: Path, seed: int, layers: int | None = None) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    shape = dict(SHAPES[name])
    if layers:
        shape["num_hidden_layers"] = layers
    cfg = Qwen2Config(**COMMON, **shape)
    torch.manual_seed(seed)
    t = time.perf_counter()
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.mul_(LAYER_OUTPUT_SCALE)
            layer.mlp.down_proj.weight.mul_(LAYER_OUTPUT_SCALE)
        if not cfg.tie_word_embeddings:
            model.lm_head.weight.copy_(model.model.embed_tokens.weight)
    out.mkdir(parents=True, exist_ok=True)
    model.to(torch.float16).eval().save_pretrained(out, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer / f, out / f)
    n = sum(p.numel() for p in model.parameters())
    print(f"{name}: {n / 1e9:.2f}B parameters, {shape['num_hidden_layers']} layers -> {out} "
          f"({time.perf_counter() - t:.1f} s)", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizer", type=Path, required=True, help="a directory with the Qwen tokenizer files")
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=None, help="fewer layers (a quick check; not for timing)")
    ap.add_argument("--only", choices=sorted(SHAPES), default=None)
    args = ap.parse_args(argv)
    missing = [f for f in ("tokenizer.json", "tokenizer_config.json") if not (args.tokenizer / f).is_file()]
    if missing:
        print(f"error: {args.tokenizer} lacks {', '.join(missing)}", file=sys.stderr)
        return 2
    for i, name in enumerate(sorted(SHAPES)):
        if args.only in (None, name):
            make(name, args.output / name, args.tokenizer, seed=11 + i, layers=args.layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
