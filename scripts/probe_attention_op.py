#!/usr/bin/env python3
"""edgespec's attention op alone: one node of each cache type (DecodeAttention float32, DecodeAttentionF16,
DecodeAttentionQ8 int8) over a cache filled to each context, its caches bound in place, a call of each width timed
in a loop (the 10th percentile of ``--reps`` calls, microseconds). The graphs are tests/test_native.py's.

    python scripts/probe_attention_op.py --contexts 3800 --widths 1,4          # the 1.5B's heads: 12, 2 KV, 128
    EDGESPEC_ATTN_PARALLEL=1e30 python scripts/probe_attention_op.py ...       # one thread (less noise)

Session 62 (docs/bench/attn_tail_pairs_s62.md): the tail-pair change, and int8 against float16 caches.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", default="12,2,128", help="query heads, KV heads, head size")
    ap.add_argument("--contexts", default="256,2048,3800")
    ap.add_argument("--widths", default="1,4")
    ap.add_argument("--reps", type=int, default=400)
    args = ap.parse_args(argv)
    import onnxruntime as ort
    from test_native import _attention_graph, _attention_inputs, _session

    from edgespec.kv import q8_quantize

    H, KVH, D = (int(x) for x in args.heads.split(","))
    L = max(int(c) for c in args.contexts.split(",")) + 64
    for past in (int(c) for c in args.contexts.split(",")):
        ck, cv, qkv = _attention_inputs(H, KVH, D, L, past, 16, seed=1)
        caches = {"DecodeAttention": (ck, cv), "DecodeAttentionF16": (ck.astype(np.float16), cv.astype(np.float16)),
                  "DecodeAttentionQ8": (q8_quantize(ck), q8_quantize(cv))}
        for n in (int(w) for w in args.widths.split(",")):
            res = []
            for op, (k, v) in caches.items():
                s = _session(_attention_graph(op, H, KVH, D, L, L + 16))
                b = s.io_binding()
                kb, vb = ort.OrtValue.ortvalue_from_numpy(k.copy()), ort.OrtValue.ortvalue_from_numpy(v.copy())
                b.bind_cpu_input("qkv", qkv[:, :n].copy())
                b.bind_ortvalue_input("pk", kb)
                b.bind_ortvalue_input("pv", vb)
                b.bind_cpu_input("seqlens", np.array([past + n - 1], np.int32))
                b.bind_output("out")
                b.bind_ortvalue_output("k", kb)
                b.bind_ortvalue_output("v", vb)
                for _ in range(20):
                    s.run_with_iobinding(b)
                ts = []
                for _ in range(args.reps):
                    t = time.perf_counter()
                    s.run_with_iobinding(b)
                    ts.append(time.perf_counter() - t)
                res.append(f"{op.replace('DecodeAttention', '') or 'F32'} {np.percentile(ts, 10) * 1e6:7.1f} us")
            print(f"context {past:5d}, {n} rows: " + " | ".join(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
