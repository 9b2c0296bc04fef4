#!/usr/bin/env python3
"""Can a model with convolution layers (LFM2) be rolled back after a rejected draft? The question behind the
export's refusal of layers whose state is not a KV cache (README, Model families), asked of onnxruntime-genai's
model builder and this onnxruntime on a tiny random LFM2 (session 61):

    python scripts/probe_conv_state.py [--out DIR]

1. Does the builder's float32 graph compute transformers' logits (one call over the whole prompt)?
2. Does the builder's ``state_window`` option (each call's conv states after every position, the widened
   ``CausalConvWithState`` of onnxruntime-genai 0.18) open on this onnxruntime's CPU provider?
3. Without it: is the conv state after every position of a call the last K - 1 columns of the state before the
   call followed by the convolution's input of the call's positions (so that a runtime that reads those inputs,
   made graph outputs, can set the state of any accepted prefix, exactly)?
4. Do calls of 2 and more tokens compute a position's logits bitwise alike, and a one-token call (the width
   policy's premise, as for attention-only graphs)?

Session 61's answers (onnxruntime 1.32.0, onnxruntime-genai 0.18.0, transformers 5.24): 1 yes (2.4e-7); 2 no
("CPU CausalConvWithState does not support state_window > 0 (CUDA EP only)"); 3 yes, bitwise, in every conv
layer (against calls of 2-6 tokens); 4 calls of 2+ tokens yes, one-token calls differ by
~4e-7 (MLAS' GEMV: the width policy pads them, or edgespec's kernels). So a runtime can roll LFM2 back on the CPU
by keeping each recent call's conv inputs, as edgespec does since session 61 (export/conv.py, kv.ConvStates).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def tiny_lfm2(d: Path) -> Path:
    import torch
    import transformers
    from tiny import make_tokenizer

    tok = make_tokenizer()
    cfg = transformers.Lfm2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                  layer_types=["conv", "full_attention", "conv", "full_attention"], conv_L_cache=3,
                                  block_auto_adjust_ff_dim=False)
    torch.manual_seed(0)
    transformers.Lfm2ForCausalLM(cfg).eval().save_pretrained(d)
    tok.save_pretrained(d)
    return d


def build(src: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-m", str(src), "-i", str(src),
                           "-o", str(out), "-p", "fp32", "-e", "cpu", "-c", str(out / "cache"), *extra],
                          capture_output=True, text=True)


def probe(work: Path) -> dict:
    import onnx
    import onnxruntime as ort
    import torch
    import transformers
    from onnx import helper

    src = tiny_lfm2(work / "src")
    found = {}
    windowed = build(src, work / "windowed", "--extra_options", "state_window=4")
    if windowed.returncode == 0:
        try:
            ort.InferenceSession(str(work / "windowed" / "model.onnx"), providers=["CPUExecutionProvider"])
            found["state_window"] = "opens on the CPU provider"
        except Exception as e:  # (onnxruntime's own untyped errors)
            found["state_window"] = "refused: " + str(e).split("was false.")[-1].strip().splitlines()[0]
    else:
        found["state_window"] = "the builder failed: " + windowed.stderr.strip().splitlines()[-1]
    plain = build(src, work / "plain")
    if plain.returncode != 0:
        raise SystemExit("the builder failed: " + plain.stderr.strip().splitlines()[-1])
    m = onnx.load(str(work / "plain" / "model.onnx"))
    convs = [n for n in m.graph.node if n.op_type == "CausalConvWithState"]
    for n in convs:  # each convolution's input a graph output
        m.graph.output.append(helper.make_tensor_value_info(n.input[0], onnx.TensorProto.FLOAT, None))
    path = work / "plain" / "probe.onnx"
    onnx.save(m, str(path), save_as_external_data=True, location="probe.onnx.data")
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in s.get_outputs()]
    past = {i.name: i.shape for i in s.get_inputs() if i.name.startswith(("past_key_values", "past."))}

    import json

    head = json.loads((work / "plain" / "genai_config.json").read_text())["model"]["decoder"]["head_size"]

    def empty():
        out = {}
        for name, shape in past.items():
            dims = [1 if not isinstance(x, int) else x for x in shape]
            if name.startswith("past_key_values"):
                dims[2:] = [0, head]
            out[name] = np.zeros(dims, np.float32)
        return out

    def run(ids, state, at):
        feeds = {"input_ids": np.array([ids], np.int64), "attention_mask": np.ones((1, at + len(ids)), np.int64),
                 **state}
        r = dict(zip(names, s.run(None, feeds)))
        return r, {k: r[k.replace("past_key_values", "present").replace("past.", "present.")] for k in past}

    rng = np.random.default_rng(0)
    ids = rng.integers(3, 300, 40).tolist()
    model = transformers.Lfm2ForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    whole, _ = run(ids, empty(), 0)
    found["float32 vs torch"] = float(np.abs(whole["logits"][0] - ref).max())
    state, rows, states = empty(), [], []
    for i, t in enumerate(ids):
        r, state = run([t], state, i)
        rows.append(r["logits"][0, 0])
        states.append(state)
    found["one-token rows equal the one call's"] = bool(np.array_equal(np.array(rows), whole["logits"][0]))
    found["one-token rows' largest difference"] = float(np.abs(np.array(rows) - whole["logits"][0]).max())
    cut = 30
    r0, state = run(ids[:cut], empty(), 0)
    r6, _ = run(ids[cut: cut + 6], state, cut)
    found["6-token call's rows equal the one call's"] = bool(np.array_equal(r6["logits"][0], whole["logits"][0, cut:cut + 6]))
    ok = True
    for n in convs:  # the state after each position of the 6-token call, from the state before it and its inputs,
        layer = n.input[3]  # against calls of 2-6 tokens (a one-token call's own arithmetic differs: question 4)
        cols = np.concatenate([state[layer], r6[n.input[0]]], axis=2)
        k = state[layer].shape[2]
        for p in range(1, 6):
            sub, _ = run(ids[cut: cut + p + 1], state, cut)
            ok &= bool(np.array_equal(cols[:, :, p + 1: p + 1 + k], sub[n.output[1]]))
    found["states rebuilt from the conv inputs equal the op's"] = ok
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="a folder for the tiny model and its graphs (default: a temporary one)")
    args = ap.parse_args(argv)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        found = probe(Path(args.out))
    else:
        with tempfile.TemporaryDirectory() as d:
            found = probe(Path(d))
    for k, v in found.items():
        print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
