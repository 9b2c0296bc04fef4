#!/usr/bin/env python3
"""Do two onnxruntime sessions' calls overlap on this GPU? Plain onnxruntime, no edgespec loop.

    python scripts/gpu/probe_overlap.py BUNDLE [--target-width 4] [--calls 60] [--json OUT]

Session 29's ``overlap`` section (bench.py) ran the target's verify call in one thread and the
drafter's steps in another through edgespec and found no overlap at all: both together took the sum
of the two alone. This probe takes edgespec out of it, so a later GPU window can tell why. The
bundle's target (calls of ``--target-width`` tokens) and drafter (one-token calls) each get a
session whose every input and output is a fixed device buffer (ids, the static mask, positions,
logits, argmax, the KV cache; the logits skip at 0), and each call is the same call over and over
(the cache's length does not move): a call is ``run_with_iobinding`` and nothing else, no copy to
or from the host. For each variant it times the target alone, the drafter alone, and both from two
threads at once (each thread its own calls, started together), and reports ``overlap``: the sum of
the two alone over the time together (1: none, 2: perfect):

- ``graphs``: CUDA graphs on (``enable_cuda_graph``; each session's first call ordinary, the next
  ones captured and replayed) or off;
- ``streams``: onnxruntime's own stream per session, or a stream made by torch (where torch is
  installed) given to each session as ``user_compute_stream``.

Where the kernels of these small calls each fill the GPU for their few microseconds, no variant
overlaps; where the serialization is onnxruntime's (a lock, the default stream), some variant does.
``--provider cpu`` runs the bindings on the CPU EP (graphs and streams off): a dry run, not a figure.
"""
from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--target-width", type=int, default=4)
    ap.add_argument("--past", type=int, default=256, help="positions the calls sit after")
    ap.add_argument("--calls", type=int, default=60, help="timed calls of each model per measure")
    ap.add_argument("--provider", default="cuda", choices=["cuda", "cpu"])
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
    if m.drafter is None:
        print(f"error: {a.bundle} has no drafter model", file=sys.stderr)
        return 2
    if a.target_width < 1 or a.calls < 1 or a.past < 1:
        print("error: --target-width, --calls and --past must be at least 1", file=sys.stderr)
        return 2
    dev = a.provider
    out: dict = {"bundle": a.bundle, "ort": ort.__version__, "target_width": a.target_width, "past": a.past,
                 "calls": a.calls, "variants": {}}

    def save():
        if a.json:
            Path(a.json).write_text(json.dumps(out, indent=1))

    from edgespec.onnx_lm import shared_thread_pool

    shared_thread_pool(0)
    torch_streams = None
    if dev == "cuda":
        try:
            import torch

            if torch.cuda.is_available():
                torch_streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        except Exception as e:  # noqa: BLE001 - no torch: that variant is left out
            out["torch"] = f"{type(e).__name__}: {e}"

    class Model:
        """One model's session, cache and fixed device bindings for calls of ``width`` tokens."""

        def __init__(self, spec, width: int, graphs: bool, stream):
            so = ort.SessionOptions()
            so.use_per_session_threads = False  # the process-wide pool, as edgespec's sessions
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            if dev == "cpu":
                self.sess = ort.InferenceSession(str(spec.path), so, providers=["CPUExecutionProvider"])
            else:
                opts = {"enable_cuda_graph": "1" if graphs else "0"}
                if stream is not None:
                    opts.update(has_user_compute_stream="1", user_compute_stream=str(stream.cuda_stream))
                self.sess = ort.InferenceSession(str(spec.path), so,
                                                 providers=["CUDAExecutionProvider", "CPUExecutionProvider"],
                                                 provider_options=[opts, {}])
            io = spec.io
            names = {i.name for i in self.sess.get_inputs()}
            outs = {o.name: o for o in self.sess.get_outputs()}
            L = min(a.past + width + 16, spec.max_context)
            self.cache = KVCache(spec, L, dev, spare=spec.attention_pad)
            b = self.b = self.sess.io_binding()
            self.cache.bind(b)
            ids = np.full((1, width), 7, np.int64)
            mask = np.zeros((1, L), np.int64)
            mask[0, : a.past + width] = 1
            keep = [ort.OrtValue.ortvalue_from_numpy(ids, dev, 0), ort.OrtValue.ortvalue_from_numpy(mask, dev, 0)]
            b.bind_ortvalue_input(io.input_ids, keep[0])
            b.bind_ortvalue_input(io.attention_mask, keep[1])
            if io.position_ids and io.position_ids in names:
                keep.append(ort.OrtValue.ortvalue_from_numpy(np.arange(a.past, a.past + width, dtype=np.int64)[None],
                                                             dev, 0))
                b.bind_ortvalue_input(io.position_ids, keep[-1])
            if io.logits_skip and io.logits_skip in names:
                self.no_skip = np.zeros(1, np.int64)  # kept alive with the binding
                b.bind_cpu_input(io.logits_skip, self.no_skip)
            ldt = np.float16 if outs[io.logits].type == "tensor(float16)" else np.float32
            keep.append(ort.OrtValue.ortvalue_from_shape_and_type((1, width, outs[io.logits].shape[-1]), ldt, dev, 0))
            b.bind_ortvalue_output(io.logits, keep[-1])
            if io.argmax and io.argmax in outs:
                keep.append(ort.OrtValue.ortvalue_from_shape_and_type((1, min(width, 32)), np.int64, dev, 0))
                b.bind_ortvalue_output(io.argmax, keep[-1])
            self.keep = keep
            self.plain = ort.RunOptions()
            self.plain.add_run_config_entry("gpu_graph_id", "-1")
            self.replay = ort.RunOptions()
            if graphs and dev == "cuda":
                self.replay.add_run_config_entry("gpu_graph_id", "1")
            self.sess.run_with_iobinding(b, self.plain)  # the arena grows here, not in a capture
            for _ in range(3):  # capture, then replays
                self.sess.run_with_iobinding(b, self.replay)

        def run(self, n: int) -> None:
            for _ in range(n):
                self.sess.run_with_iobinding(self.b, self.replay)

    def timed(fn, *args) -> float:
        t = time.perf_counter()
        fn(*args)
        return time.perf_counter() - t

    variants = [(("graphs" if g else "no_graphs") + ("+torch_streams" if s else ""), g, s)
                for g in ((True, False) if dev == "cuda" else (False,))
                for s in ((False, True) if torch_streams else (False,))]
    from concurrent.futures import ThreadPoolExecutor

    for name, graphs, streams in variants:
        rec: dict = {}
        out["variants"][name] = rec
        # each model on a thread of its own, for its whole life: onnxruntime's CUDA EP keeps a session's
        # captured graphs in the calling thread's context (a graph captured on one thread is captured
        # again on another), and a capture (global mode) fails any other thread's CUDA call meanwhile,
        # so the two models are built (and captured) one after the other, each on its own thread
        # (run 13 built them on the main thread and ran them on two others: error 900)
        with ThreadPoolExecutor(1) as on_t, ThreadPoolExecutor(1) as on_d:
            try:
                tgt = on_t.submit(Model, m.target, a.target_width, graphs,
                                  torch_streams[0] if streams else None).result()
                drf = on_d.submit(Model, m.drafter, 1, graphs, torch_streams[1] if streams else None).result()
                n = a.calls
                ta = min(on_t.submit(timed, tgt.run, n).result() for _ in range(3))
                td = min(on_d.submit(timed, drf.run, n).result() for _ in range(3))
                both = []
                for _ in range(3):
                    go = threading.Barrier(3)

                    def span(model):
                        go.wait()
                        t0 = time.perf_counter()
                        model.run(n)
                        return t0, time.perf_counter()

                    fs = [on_t.submit(span, tgt), on_d.submit(span, drf)]
                    go.wait()
                    spans = [f.result() for f in fs]
                    both.append(max(e for _, e in spans) - min(s for s, _ in spans))
                tb = min(both)
                rec.update(target_call_ms=round(ta / n * 1e3, 3), drafter_call_ms=round(td / n * 1e3, 3),
                           both_ms_per_pair=round(tb / n * 1e3, 3), overlap=round((ta + td) / tb, 3))
            except Exception as e:  # noqa: BLE001 - one variant's failure is a finding, not the end
                rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:500] if str(e) else ''}"
                rec["trace"] = traceback.format_exc()[-1500:]
        print(name, {k: v for k, v in rec.items() if k != "trace"}, flush=True)
        save()
    save()
    return 1 if any("error" in r for r in out["variants"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
