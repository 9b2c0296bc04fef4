#!/usr/bin/env python3
"""Which operator of a bundle's graph makes the width policy necessary: the first node whose
output for the same position differs between a call of one token and a call of more.

    python scripts/probe_width_ops.py bundles/smollm2-int4 [--role target] [--widths 1 2 3 4]

The graph is copied with every node output made a graph output (into a temporary directory), fed
the same 16-token prefix, then the same next tokens in calls of each width; for each node, in
graph order, the positions the calls share are compared bitwise. The report lists the first nodes
where some pair of widths disagrees (and which pairs), and says whether the logits do. On this
project's AVX-512 machine (onnxruntime 1.32): at INT4 block 32 the first node is
GroupQueryAttention (one query row takes MLAS' GEMV path in its probabilities x V product) and
MatMulNBits agrees at every width; at block 64/128 MatMulNBits itself disagrees between odd and
even widths (rows computed in pairs). Diagnostic only: the runtime's probe (``edgespec.width``)
measures the policy on the logits.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def probe(bundle: str, role: str = "target", widths=(1, 2, 3), prefix: int = 16, context: int = 64,
          show: int = 8) -> dict:
    import onnx
    import onnxruntime as ort

    from edgespec.manifest import load_manifest

    m = load_manifest(bundle)
    spec = m.target if role == "target" else m.drafter
    if spec is None:
        raise SystemExit(f"{bundle}: no {role} model")
    model = onnx.load(str(spec.path), load_external_data=True)
    have = {o.name for o in model.graph.output}
    order = []
    for node in model.graph.node:
        for o in node.output:
            if o and o not in have:
                model.graph.output.append(onnx.ValueInfoProto(name=o))
                order.append((node.op_type, node.name, o))
    io = spec.io
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "probe.onnx"
        onnx.save(model, str(path), save_as_external_data=True, location="probe.onnx.data")
        from edgespec.onnx_lm import shared_thread_pool

        shared_thread_pool(None)  # the process-wide pool every edgespec session runs on
        so = ort.SessionOptions()
        so.use_per_session_threads = False
        s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        names = [o.name for o in s.get_outputs()]
        inputs = {i.name for i in s.get_inputs()}
        kv_dtype = np.float16 if spec.kv_dtype == "float16" else np.float32

        def call(ids, past_kv, past):
            feed = {io.input_ids: np.array([ids], np.int64),
                    io.attention_mask: np.ones((1, past + len(ids)), np.int64)}
            if io.position_ids and io.position_ids in inputs:
                feed[io.position_ids] = np.arange(past, past + len(ids), dtype=np.int64)[None, :]
            if io.logits_skip and io.logits_skip in inputs:  # every row's logits (session 29's skip)
                feed[io.logits_skip] = np.zeros(1, np.int64)
            for i in range(spec.num_layers):
                feed[io.past_key % i], feed[io.past_value % i] = (a.copy() for a in past_kv[i])
            return dict(zip(names, s.run(None, feed)))

        vocab = min(spec.vocab_size, 32000)
        ids = [(7919 * i + 13) % vocab for i in range(prefix + max(widths))]
        shapes = [(1, spec.kv_shape(i)[0], context, spec.kv_shape(i)[1]) for i in range(spec.num_layers)]
        empty = [(np.zeros(sh, kv_dtype), np.zeros(sh, kv_dtype)) for sh in shapes]  # (Gemma 4's: per layer)
        first = call(ids[:prefix], empty, 0)
        kv = [(first[io.present_key % i], first[io.present_value % i]) for i in range(spec.num_layers)]
        outs = {w: call(ids[prefix: prefix + w], kv, prefix) for w in widths}
    presents = {io.present_key % i for i in range(spec.num_layers)} | {io.present_value % i for i in range(spec.num_layers)}
    differ = []
    for op, name, out in order:
        if out in presents:
            continue
        pairs = []
        for i, a in enumerate(widths):
            for b in widths[i + 1:]:
                x, y = outs[a][out], outs[b][out]
                if x.ndim < 2 or x.shape[1] != a or y.shape[1] != b:
                    continue  # not a [1, sequence, ...] tensor
                if not np.array_equal(x, y[:, :a]):
                    pairs.append((a, b))
        if pairs:
            differ.append({"op": op, "node": name, "pairs": pairs})
            if len(differ) >= show:
                break
    logits = {w: outs[w][io.logits] for w in widths}
    agree = [(a, b) for i, a in enumerate(widths) for b in widths[i + 1:]
             if np.array_equal(logits[a], logits[b][:, :a])]
    return {"first_differing": differ, "logits_agree": agree}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--role", choices=["target", "drafter"], default="target")
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--show", type=int, default=8)
    args = ap.parse_args(argv)
    r = probe(args.bundle, args.role, tuple(sorted(set(args.widths))), show=args.show)
    if not r["first_differing"]:
        print("every node computes the shared positions the same at every width")
    for d in r["first_differing"]:
        print(f"{d['op']:32s} {d['node']}: widths {', '.join(f'{a}/{b}' for a, b in d['pairs'])} differ")
    print(f"logits agree for widths {', '.join(f'{a}/{b}' for a, b in r['logits_agree']) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
