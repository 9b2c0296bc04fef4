#!/usr/bin/env python3
"""onnxruntime's CPU GroupQueryAttention alone, with the 0.5B drafter's shapes (14 query heads, 2
KV heads, head 64, an in-place 4096-position KV buffer, rotary on): microseconds a call at 1 and 2
threads, 128 and 512 cached positions, 1 and 5 new tokens (docs/bench/profile_ops_s17.md).

    python scripts/bench_gqa.py
"""
import time
import numpy as np, onnxruntime as ort
from onnx import TensorProto, helper
N, NK, H, MAXS = 14, 2, 64, 4096
D = (N + 2 * NK) * H
node = helper.make_node("GroupQueryAttention",
    ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total_sequence_length", "cos", "sin"],
    ["out", "present_key", "present_value"], domain="com.microsoft", num_heads=N, kv_num_heads=NK, do_rotary=1)
f = TensorProto.FLOAT
g = helper.make_graph([node], "g", [
    helper.make_tensor_value_info("qkv", f, [1, "S", D]),
    helper.make_tensor_value_info("past_key", f, [1, NK, MAXS, H]),
    helper.make_tensor_value_info("past_value", f, [1, NK, MAXS, H]),
    helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
    helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
    helper.make_tensor_value_info("cos", f, [MAXS, H // 2]),
    helper.make_tensor_value_info("sin", f, [MAXS, H // 2])],
    [helper.make_tensor_value_info("out", f, [1, "S", N * H]),
     helper.make_tensor_value_info("present_key", f, [1, NK, MAXS, H]),
     helper.make_tensor_value_info("present_value", f, [1, NK, MAXS, H])])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
m.ir_version = 8
rng = np.random.default_rng(0)
pk = np.zeros((1, NK, MAXS, H), np.float32); pv = np.zeros_like(pk)
cos = rng.standard_normal((MAXS, H // 2)).astype(np.float32); sin = rng.standard_normal((MAXS, H // 2)).astype(np.float32)
for threads in (1, 2):
    so = ort.SessionOptions(); so.intra_op_num_threads = threads
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    for ctx in (128, 512):
        for S in (1, 5):
            b = s.io_binding()
            kv = [ort.OrtValue.ortvalue_from_numpy(pk), ort.OrtValue.ortvalue_from_numpy(pv)]
            b.bind_ortvalue_input("past_key", kv[0]); b.bind_ortvalue_output("present_key", kv[0])
            b.bind_ortvalue_input("past_value", kv[1]); b.bind_ortvalue_output("present_value", kv[1])
            b.bind_cpu_input("qkv", rng.standard_normal((1, S, D)).astype(np.float32))
            b.bind_cpu_input("seqlens_k", np.array([ctx + S - 1], np.int32))
            b.bind_cpu_input("total_sequence_length", np.array(ctx + S, np.int32))
            b.bind_cpu_input("cos", cos); b.bind_cpu_input("sin", sin)
            b.bind_output("out", "cpu")
            for _ in range(20): s.run_with_iobinding(b)
            ts = []
            for _ in range(200):
                t0 = time.perf_counter(); s.run_with_iobinding(b); ts.append(time.perf_counter() - t0)
            print(f"threads {threads} ctx {ctx} S {S}: {np.median(ts)*1e6:.1f} us")
