#!/usr/bin/env python3
"""scripts/gpu/smoke_cuda.py (session 54): a few seconds' check, first thing after onnxruntime-gpu is unpacked on the GPU machine: do onnxruntime's own
CUDA kernels (its fatbin, not cuBLAS's) load and compute? One small graph (MatMulNBits, the contrib op every INT4
bundle uses, then Add, Sigmoid, Softmax and ArgMax) on the CUDA EP with the CPU fallback refused, against the
CPU EP. Exit 0 and one 'ok' line, or 1 and why. --provider cpu runs both sides on the CPU (a dry run)."""
import sys

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

prov = sys.argv[sys.argv.index("--provider") + 1] if "--provider" in sys.argv else "cuda"
K, N, BLOCK = 64, 32, 32
rng = np.random.default_rng(0)
q = rng.integers(0, 256, size=(N, K // BLOCK, BLOCK // 2), dtype=np.uint8)
scales = (rng.random(N * K // BLOCK, dtype=np.float32) * 0.02).astype(np.float16)
bias = rng.standard_normal(N).astype(np.float16)
nodes = [
    helper.make_node("MatMulNBits", ["x", "w", "s"], ["y"], domain="com.microsoft", K=K, N=N, bits=4, block_size=BLOCK),
    helper.make_node("Add", ["y", "b"], ["z"]),
    helper.make_node("Sigmoid", ["z"], ["g"]),
    helper.make_node("Softmax", ["g"], ["p"], axis=-1),
    helper.make_node("ArgMax", ["p"], ["i"], axis=-1, keepdims=0),
]
graph = helper.make_graph(nodes, "smoke", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [3, K])],
                          [helper.make_tensor_value_info("p", TensorProto.FLOAT16, [3, N]),
                           helper.make_tensor_value_info("i", TensorProto.INT64, [3])],
                          [numpy_helper.from_array(q, "w"), numpy_helper.from_array(scales, "s"),
                           numpy_helper.from_array(bias, "b")])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
model.ir_version = 9
onnx.checker.check_model(model)
x = rng.standard_normal((3, K)).astype(np.float16)
ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
try:
    so = ort.SessionOptions()
    if prov == "cuda":
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    eps = ["CUDAExecutionProvider"] if prov == "cuda" else ["CPUExecutionProvider"]
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=eps)
    got = sess.run(None, {"x": x})
except Exception as e:  # noqa: BLE001
    print(f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    sys.exit(1)
diff = float(np.abs(got[0].astype(np.float32) - ref[0].astype(np.float32)).max())
# the argmax compared where the CPU's top two are apart by more than the float16 noise of the two devices' sums
top2 = np.sort(ref[0].astype(np.float32), axis=-1)[:, -2:]
clear = (top2[:, 1] - top2[:, 0]) > 1e-2
ok = diff < 1e-2 and (got[1][clear] == ref[1][clear]).all()
print(f"{'ok' if ok else 'FAILED'}: {sess.get_providers()[0]} max |diff| {diff:.2e}, argmax {got[1].tolist()} "
      f"(cpu {ref[1].tolist()}); onnxruntime {ort.__version__}")
sys.exit(0 if ok else 1)
