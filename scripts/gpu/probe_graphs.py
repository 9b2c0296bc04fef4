#!/usr/bin/env python3
"""What CUDA graphs would buy a bundle's graph on this GPU, with plain onnxruntime (no edgespec
decoding loop): the decode step and small verify calls timed with and without graph replay.

    python scripts/gpu/probe_graphs.py BUNDLE [--role target] [--widths 1,2,4,8,16] [--json OUT]

A captured CUDA graph needs every input and output at a fixed device address with a fixed shape.
The builder's graphs read the valid length from the attention mask (seqlens_k = sum - 1, the total
length = its shape), so the probe binds a *static* mask of the cache's full length on the device,
ones up to the valid length, zeros after, and the ids, logits (and argmax) as device OrtValues per
width, updated in place. For each width it times, over the same advancing positions:

- ``dynamic_ms``: the runtime's call today (mask of past + n, ids and mask copied from the host,
  logits written to host memory);
- ``static_ms``: the static-mask binding on a session without graphs (what the binding costs);
- ``graph_ms``: the same on a session with ``enable_cuda_graph``, run option ``gpu_graph_id`` = the
  width (captured on its first runs, replayed after);

and checks the graph's logits equal the static session's on every step (bitwise where the
kernels are deterministic), and the argmax against the dynamic call's. Device memory (nvidia-smi)
before and after the captures. Each width section records its own error and the next one runs.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))


def used_mib() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
        return int(out.split()[0])
    except Exception:  # noqa: BLE001 - no nvidia-smi: no figure
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--role", default="target", choices=["target", "drafter"])
    ap.add_argument("--widths", default="1,2,4,8,16")
    ap.add_argument("--context", type=int, default=1024, help="the cache's length (the static mask's)")
    ap.add_argument("--past", type=int, default=128, help="positions filled before the timed calls")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--provider", default="cuda", choices=["cuda", "cpu"],
                    help="cpu: a dry run of the bindings on the CPU EP (no graphs)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)

    import onnxruntime as ort
    from edgespec.errors import EdgespecError
    from edgespec.kv import KVCache
    from edgespec.manifest import load_manifest

    try:
        m = load_manifest(a.bundle)
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    spec = m.target if a.role == "target" else m.drafter
    if spec is None:
        print(f"error: {a.bundle} has no drafter model", file=sys.stderr)
        return 2
    io = spec.io
    dev = "cuda" if a.provider == "cuda" else "cpu"
    L = min(a.context, spec.max_context - spec.attention_pad)
    out: dict = {"bundle": a.bundle, "role": a.role, "ort": ort.__version__, "context": L, "past": a.past,
                 "steps": a.steps, "widths": {}}

    def save():
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=1))

    def session(graphs: bool):
        so = ort.SessionOptions()
        so.use_per_session_threads = False  # the process-wide pool, as edgespec's sessions
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if dev == "cpu":
            return ort.InferenceSession(str(spec.path), so, providers=["CPUExecutionProvider"])
        opts = {"enable_cuda_graph": "1"} if graphs else {}
        return ort.InferenceSession(str(spec.path), so, providers=["CUDAExecutionProvider", "CPUExecutionProvider"],
                                    provider_options=[opts, {}])

    from edgespec.onnx_lm import shared_thread_pool

    shared_thread_pool(0)
    mem0 = used_mib()
    t = time.perf_counter()
    plain = session(False)
    out["open_plain_s"] = round(time.perf_counter() - t, 2)
    try:
        t = time.perf_counter()
        graphed = session(dev == "cuda")
        out["open_graph_s"] = round(time.perf_counter() - t, 2)
    except Exception as e:  # noqa: BLE001 - the session refuses graphs: say why
        out["open_graph_error"] = str(e).splitlines()[0][:500]
        graphed = None
    out["mem_after_open_mib"] = None if mem0 is None else (used_mib() or 0) - mem0
    save()
    outs = {o.name: o for o in plain.get_outputs()}
    vocab = outs[io.logits].shape[-1]
    ldtype = np.float16 if outs[io.logits].type == "tensor(float16)" else np.float32
    has_argmax = bool(io.argmax) and io.argmax in outs
    names_in = {i.name for i in plain.get_inputs()}
    has_pos = bool(io.position_ids) and io.position_ids in names_in
    no_skip = np.zeros(1, np.int64)  # the export's logits skip (session 29): every row's logits
    skip_name = io.logits_skip if io.logits_skip and io.logits_skip in names_in else None

    cache = KVCache(spec, L, dev, spare=spec.attention_pad)
    rng = np.random.default_rng(0)
    fill = rng.integers(0, spec.vocab_size, size=a.past).astype(np.int64)

    def dyn_binding():
        b = plain.io_binding()
        cache.bind(b)
        return b

    def dynamic_call(b, ids, past):
        n = len(ids)
        b.bind_cpu_input(io.input_ids, ids.reshape(1, n))
        b.bind_cpu_input(io.attention_mask, np.ones((1, past + n), np.int64))
        if has_pos:
            b.bind_cpu_input(io.position_ids, np.arange(past, past + n, dtype=np.int64)[None])
        if skip_name:
            b.bind_cpu_input(skip_name, no_skip)
        b.bind_output(io.logits, "cpu")
        if has_argmax:
            b.bind_output(io.argmax, "cpu")
        plain.run_with_iobinding(b)
        res = b.get_outputs()  # in binding order: the cache's present.* first, then the logits
        return res[len(cache.buffers)].numpy().reshape(n, -1)

    # the prefix, once, the dynamic way (the same in every session: it is the shared cache)
    b0 = dyn_binding()
    dynamic_call(b0, fill, 0)

    class Static:
        """Device OrtValues for one width: ids, the static mask, positions, logits, argmax."""

        def __init__(self, sess, w):
            self.sess, self.w = sess, w
            self.ids = ort.OrtValue.ortvalue_from_shape_and_type((1, w), np.int64, dev, 0)
            self.mask_host = np.zeros((1, L), np.int64)
            self.mask = ort.OrtValue.ortvalue_from_numpy(self.mask_host, dev, 0)
            self.pos = ort.OrtValue.ortvalue_from_shape_and_type((1, w), np.int64, dev, 0) if has_pos else None
            self.logits = ort.OrtValue.ortvalue_from_shape_and_type((1, w, vocab), ldtype, dev, 0)
            self.argmax = (ort.OrtValue.ortvalue_from_shape_and_type((1, min(w, 32)), np.int64, dev, 0)
                           if has_argmax else None)
            self.b = sess.io_binding()
            cache.bind(self.b)
            self.b.bind_ortvalue_input(io.input_ids, self.ids)
            self.b.bind_ortvalue_input(io.attention_mask, self.mask)
            if has_pos:
                self.b.bind_ortvalue_input(io.position_ids, self.pos)
            if skip_name:
                self.b.bind_cpu_input(skip_name, no_skip)
            self.b.bind_ortvalue_output(io.logits, self.logits)
            if has_argmax:
                self.b.bind_ortvalue_output(io.argmax, self.argmax)
            self.ro = ort.RunOptions()
            self.plain = ort.RunOptions()
            self.plain.add_run_config_entry("gpu_graph_id", "-1")
            self.calls = 0  # the first call is an ordinary run (the arena grows there, not in a capture)
            if sess is graphed and dev == "cuda":
                self.ro.add_run_config_entry("gpu_graph_id", str(w))

        def call(self, ids, past, read_logits=True):
            n = self.w
            self.ids.update_inplace(ids.reshape(1, n))
            self.mask_host[:, : past + n] = 1
            self.mask_host[:, past + n:] = 0
            self.mask.update_inplace(self.mask_host)
            if has_pos:
                self.pos.update_inplace(np.arange(past, past + n, dtype=np.int64)[None])
            self.b.synchronize_inputs()
            self.sess.run_with_iobinding(self.b, self.ro if self.calls else self.plain)
            self.calls += 1
            top = self.argmax.numpy().reshape(-1) if has_argmax else None
            return (self.logits.numpy().reshape(n, -1) if read_logits else None), top

    for w in [int(x) for x in a.widths.split(",")]:
        rec: dict = {}
        out["widths"][w] = rec
        try:
            steps = [rng.integers(0, spec.vocab_size, size=w).astype(np.int64) for _ in range(a.steps)]
            pasts = [a.past + (i % max(1, (L - a.past - w) // w)) * w for i in range(a.steps)]
            # dynamic (today's call)
            ref = []
            t = time.perf_counter()
            for ids, p in zip(steps, pasts):
                ref.append(dynamic_call(b0, ids, p))
            rec["dynamic_ms"] = round((time.perf_counter() - t) / a.steps * 1e3, 3)
            st = Static(plain, w)
            got_static = []
            t = time.perf_counter()
            for ids, p in zip(steps, pasts):
                got_static.append(st.call(ids, p)[0])
            rec["static_ms"] = round((time.perf_counter() - t) / a.steps * 1e3, 3)
            rec["static_vs_dynamic_maxdiff"] = float(max(np.abs(x.astype(np.float32) - y.astype(np.float32)).max()
                                                         for x, y in zip(got_static, ref)))
            rec["static_argmax_agrees"] = float(np.mean([np.array_equal(x.argmax(-1), y.argmax(-1))
                                                         for x, y in zip(got_static, ref)]))
            if graphed is not None:
                mem = used_mib()
                gs = Static(graphed, w)
                got = []
                t_first = time.perf_counter()
                for ids, p in zip(steps[:3], pasts[:3]):  # warm-up and capture
                    got.append(gs.call(ids, p)[0])
                rec["graph_first3_ms"] = round((time.perf_counter() - t_first) / 3 * 1e3, 3)
                t = time.perf_counter()
                for ids, p in zip(steps[3:], pasts[3:]):
                    got.append(gs.call(ids, p)[0])
                rec["graph_ms"] = round((time.perf_counter() - t) / max(1, a.steps - 3) * 1e3, 3)
                t = time.perf_counter()
                tops = [gs.call(ids, p, read_logits=False)[1] for ids, p in zip(steps[3:], pasts[3:])]
                rec["graph_argmax_only_ms"] = round((time.perf_counter() - t) / max(1, a.steps - 3) * 1e3, 3)
                rec["graph_vs_static_maxdiff"] = float(max(np.abs(x.astype(np.float32) - y.astype(np.float32)).max()
                                                           for x, y in zip(got, got_static)))
                rec["graph_bitwise_equal_steps"] = int(sum(np.array_equal(x, y) for x, y in zip(got, got_static)))
                if has_argmax and tops[0] is not None:
                    rec["graph_argmax_agrees"] = float(np.mean([
                        np.array_equal(t_[: min(w, 32)], r.astype(np.float32).argmax(-1)[: min(w, 32)])
                        for t_, r in zip(tops, got_static[3:])]))
                rec["graph_mem_mib"] = None if mem is None else (used_mib() or 0) - mem
        except Exception as e:  # noqa: BLE001 - one width's failure is a finding, not the end
            rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:500] if str(e) else ''}"
            rec["trace"] = traceback.format_exc()[-1500:]
        print(w, {k: v for k, v in rec.items() if k != "trace"}, flush=True)
        save()
    out["mem_end_mib"] = None if mem0 is None else (used_mib() or 0) - mem0
    save()
    print(json.dumps({k: v for k, v in out.items() if k != "widths"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
