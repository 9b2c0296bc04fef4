#!/usr/bin/env python3
"""The GPU run's measurements, in one process, each section on its own (a section that fails
records its error and the next one runs): written to ``--json`` after every section.

    python scripts/gpu/bench.py --shaped B --smol-cuda S --smol-cpu C [--drafter-cpu D] --json OUT

- ``env``: the GPU (nvidia-smi), onnxruntime's version and providers, whether TensorRT's
  libraries are there.
- ``shaped``: the Qwen2.5-1.5B/0.5B-shaped bundle B (``make_shaped.py``, cuda layout) on CUDA: the
  exactness width measured at load, the verify-width cost curve (1..16, 24, 32 tokens), the
  drafter's step, the one-token call at longer contexts, and autoregressive against speculative
  tokens/s (these models agree on every token: the speculative figures are the all-accepted best
  case), each run's tokens checked equal to greedy's.
- ``shaped_nographs``: ``shaped`` with CUDA graphs off (``cuda_graphs=False``; ``shaped`` runs
  the default, graphs on).
- ``smol_bench_nographs``: ``smol_bench`` with ``--no-cuda-graphs``.
- ``probe_graphs``: ``probe_graphs.py`` on the shaped target and drafter (plain onnxruntime).
- ``placement``: the same bundle with the drafter on the machine's CPU (``drafter_provider=cpu``),
  and, with ``--drafter-cpu D`` (the 0.5B-shaped model exported in the cpu layout), its one-token
  step on the CPU EP, the figure a CPU-placed drafter costs.
- ``smol``: SmolLM2 INT4: greedy 64 tokens on the shipped prompts, CUDA against the CPU EP on the
  same cuda-layout graph and against the cpu-layout bundle on the CPU.
- ``memory``: ``edgespec plan --measure`` on CUDA (NVML) against the plan.
- ``drafter_logits``: the 0.5B-shaped model alone (``--drafter-cuda``): its calls with the logits
  copied against only the argmax copied.
- ``load_times``: loading the shaped bundle in fresh processes, cold, cached, and with only the
  placement verdicts forgotten (what the verdict cache saves).
- ``exactness``: ``scripts/check_exact.py`` on SmolLM2 (``--smol-cuda``) on the provider: each
  shipped prompt's greedy output against ``auto`` and prompt lookup at draft bounds 8 and 15, and
  the width policy the probe chose there (its bound on verify calls included).
- ``overlap``: the shaped pair's target verify call (2-5 tokens, argmax) and the drafter's 1-4
  one-token steps, each alone and both at once from two threads (each session has its own stream):
  whether a drafter can draft the next round while the target verifies this one (pipelined
  drafting), with onnxruntime's copies on the default stream and, with a profile setting
  ``do_copy_in_default_stream = 0``, on each session's own.
- ``threads``: SmolLM2 (``--smol-cuda``), one engine: greedy generations with prompt lookup on the
  thread that loaded it, each on a fresh thread (as ``edgespec serve`` ran them before session 75),
  and, with a second engine, its load and every generation on one thread of their own: seconds per
  generation, the process's GPU memory after each phase, every output equal to greedy decoding.
  onnxruntime's CUDA EP keeps a session's captured graphs in the calling thread's context and
  captures again in every new thread.
- ``serve``: ``edgespec serve --provider P`` on SmolLM2 (``--smol-cuda``) in a process of its own, the same chat
  request sent 8 times one after the other (temperature 0, 64 tokens): seconds a request and the server process's
  GPU memory after each (nvidia-smi, by its pid), every reply the same text. Since session 75 the server loads and
  generates on one thread: the first request pays the graphs' captures at its widths, later ones nothing, and the
  memory stays flat (a thread per request took 0.2-0.5 s more each and 77 MiB each, the ``threads`` section).
- ``probe_overlap``: ``probe_overlap.py`` on the shaped pair: the same question with plain onnxruntime
  (fixed device buffers, no copies; graphs on and off; onnxruntime's streams and torch's).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
WIDTHS = list(range(1, 17)) + [24, 32]
PROVIDER = "cuda"  # --provider: cpu checks the script on a machine without a GPU
PROMPTS = ["Write a Python function `is_prime(n)` that returns True when n is prime.",
           "Summarize: the meeting moved to Tuesday. Tuesday at ten, in room four, with the budget.",
           "def fibonacci(n):"]


def sh(cmd: list[str], timeout: float = 120) -> tuple[int, str]:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return r.returncode, (r.stdout + r.stderr).strip()
    except Exception as e:  # a tool that is not there
        return -1, f"{type(e).__name__}: {e}"


def gpu_used_mib(pid: int | None = None) -> dict:
    """This process's (or ``pid``'s) GPU memory and the device's, from nvidia-smi (MiB)."""
    rc, out = sh(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"])
    mine = None
    for line in out.splitlines() if rc == 0 else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid or os.getpid()):
            mine = int(parts[1])
    rc, out = sh(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"])
    dev = int(out.splitlines()[0]) if rc == 0 and out else None
    return {"process_mib": mine, "device_mib": dev}


def env() -> dict:
    import onnxruntime as ort

    rc, smi = sh(["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem",
                  "--format=csv,noheader"])
    trt = sh(["bash", "-c", "ldconfig -p | grep -c libnvinfer.so || true"])[1]
    return {"nvidia_smi": smi, "onnxruntime": ort.__version__, "onnxruntime_file": ort.__file__,
            "providers": ort.get_available_providers(), "libnvinfer_in_ldconfig": trt,
            "python": sys.version.split()[0], "cpu_count": os.cpu_count()}


def gen(eng, prompt: str, n: int, drafter: str, k=None) -> tuple[list[int], dict]:
    eng.reset()
    r = eng.generate(prompt, max_new_tokens=n, drafter=drafter, draft_tokens=k)
    return r.token_ids, r.stats


def speed_table(eng, drafters, n: int = 128, reps: int = 2) -> dict:
    """Median decode tokens/s per drafter over PROMPTS x reps; exact: tokens equal to greedy's."""
    out = {}
    ref = {p: gen(eng, p, n, "none")[0] for p in PROMPTS}  # also the warm-up
    for d in drafters:
        name, _, k = d.partition(":")
        tps, tpc, exact = [], [], True
        for _ in range(reps):
            for p in PROMPTS:
                toks, st = gen(eng, p, n, name, int(k) if k else None)
                exact &= toks == ref[p]
                tps.append(st["tokens_per_second"])
                tpc.append(st.get("tokens_per_target_call", 0.0))
        out[d] = {"tokens_per_s": round(statistics.median(tps), 2), "tokens_per_target_call":
                  round(statistics.median(tpc), 3), "exact": exact, "samples": [round(x, 2) for x in tps]}
    base = out.get("none", {}).get("tokens_per_s")
    if base:
        for v in out.values():
            v["x_ar"] = round(v["tokens_per_s"] / base, 3)
    return out


def shaped(bundle: str, reps: int, cuda_graphs: bool | None = None) -> dict:
    import edgespec
    from bench_width import time_widths

    res: dict = {"bundle": bundle, "cuda_graphs_asked": cuda_graphs}
    t = time.perf_counter()
    eng = edgespec.load(bundle, model_sampling=False, provider=PROVIDER, memory=False, max_context=4096, cuda_graphs=cuda_graphs)
    res["load_s"] = round(time.perf_counter() - t, 2)
    res["memory_after_load"] = gpu_used_mib()
    target, model = eng.decoder.target, eng.decoder.drafters.get("model")
    res["devices"] = {"target": target.device, "drafter": model.lm.device if model else None}
    res["width_policy"] = {"target": [target.min_width, target.width_multiple],
                           "drafter": [model.lm.min_width, model.lm.width_multiple] if model else None}
    res["verified_width"] = target.verified_width  # the probe's bound on verify calls (session 27)
    vocab = 32000
    pol = time_widths(target, WIDTHS, 256, reps, vocab)
    policy = (target.min_width, target.width_multiple)
    target.min_width, target.width_multiple = 1, 1
    raw = time_widths(target, WIDTHS, 256, reps, vocab)
    target.min_width, target.width_multiple = policy
    res["width_ms"] = {"context": 256, "reps": reps, "raw": {w: round(raw[w] * 1e3, 3) for w in WIDTHS},
                       "policy": {w: round(pol[w] * 1e3, 3) for w in WIDTHS}}
    res["device_argmax"] = target.device_argmax
    if target.device_argmax:  # what a greedy round pays: the graph's argmax, the logits left on the device
        top = time_widths(target, WIDTHS, 256, reps, vocab, argmax=True)
        res["width_ms"]["policy_argmax"] = {w: round(top[w] * 1e3, 3) for w in WIDTHS}
    if model is not None:
        step = time_widths(model.lm, [1, 2, 4, 8], 256, reps * 2, vocab)
        res["drafter_step_ms"] = {w: round(s * 1e3, 3) for w, s in step.items()}
        # its catch-up reads (a prompt, the tokens free drafters emitted): what predict.token_ms prices
        reads = time_widths(model.lm, [16, 64, 128, 256, 512], 256, max(3, reps // 3), vocab)
        res["drafter_read_ms"] = {w: round(s * 1e3, 3) for w, s in reads.items()}
        if model.lm.skips_logits:  # as the runtime reads (session 29): the last row's logits only
            reads = time_widths(model.lm, [16, 64, 128, 256, 512], 256, max(3, reps // 3), vocab, last_only=True)
            res["drafter_read_skip_ms"] = {w: round(s * 1e3, 3) for w, s in reads.items()}
    if target.skips_logits:  # a prefill chunk as the runtime runs it (the last row's logits), and every row's
        res["target_chunk_ms"] = {
            "last_row": {w: round(s * 1e3, 3) for w, s in
                         time_widths(target, [128, 512], 256, max(3, reps // 3), vocab, last_only=True).items()},
            "every_row": {w: round(s * 1e3, 3) for w, s in
                          time_widths(target, [128, 512], 256, max(3, reps // 3), vocab).items()}}
    ctx = {}
    for c in (1024, 4000):
        ctx[c] = round(time_widths(target, [1], c, max(3, reps // 3), vocab)[1] * 1e3, 3)
        if model is not None:
            ctx[f"drafter@{c}"] = round(time_widths(model.lm, [1], c, max(3, reps // 3), vocab)[1] * 1e3, 3)
    res["one_token_ms_by_context"] = ctx
    res["memory_after_width_runs"] = gpu_used_mib()
    res["speed"] = speed_table(eng, ["none", "model", "model:4", "model:8", "prompt-lookup", "auto"])
    res["cuda_graphs"] = {role: (None if lm.graphs is None else
                                 {"captured": sorted(lm.graphs.captured), "replays": lm.graphs.replays,
                                  "excluded": sorted(lm.graphs.excluded), "refused": lm.graphs.refused})
                          for role, lm in (("target", target), ("drafter", model.lm if model else None))
                          if lm is not None}
    res["memory_end"] = gpu_used_mib()
    return res


def _json_script(script: str, args: list[str], js: Path) -> dict:
    """``scripts/gpu/<script>`` in its own process with ``--json js``: what it wrote, its exit status
    and, where it failed, the tail of its output."""
    rc, text = sh([sys.executable, str(ROOT / "scripts/gpu" / script), *args, "--json", str(js)], timeout=240)
    res = json.loads(js.read_text()) if js.is_file() else {}
    res["rc"] = rc
    if rc:
        res["tail"] = text[-1500:]
    return res


def probe_graphs(bundle: str, out_dir: Path) -> dict:
    """scripts/gpu/probe_graphs.py on the shaped target and drafter: plain onnxruntime with and
    without graph replay, outside edgespec's loop (each in its own process)."""
    return {role: _json_script("probe_graphs.py", [bundle, "--role", role, "--widths", "1,2,4,8,16",
                                                   "--provider", PROVIDER], out_dir / f"probe-graphs-{role}.json")
            for role in ("target", "drafter")}


def probe_overlap(bundle: str, out_dir: Path) -> dict:
    """scripts/gpu/probe_overlap.py on the shaped pair: do two sessions' calls overlap with plain
    onnxruntime (graphs on and off, onnxruntime's streams and torch's), in its own process."""
    return _json_script("probe_overlap.py", [bundle, "--provider", PROVIDER], out_dir / "probe-overlap.json")


def placement(bundle: str, drafter_cpu: str | None, reps: int) -> dict:
    import edgespec
    from bench_width import time_widths

    res: dict = {}
    eng = edgespec.load(bundle, model_sampling=False, provider=PROVIDER, drafter_provider="cpu", memory=False, max_context=4096)
    model = eng.decoder.drafters["model"]
    res["devices"] = dict(eng.plan.devices)
    res["drafter_cuda_layout_on_cpu_step_ms"] = {w: round(s * 1e3, 3) for w, s in time_widths(
        model.lm, [1, 2], 256, max(4, reps // 2), 32000).items()}
    res["speed"] = speed_table(eng, ["none", "model", "auto"], reps=1)
    del eng
    if drafter_cpu:
        d = edgespec.load(drafter_cpu, model_sampling=False, provider="cpu", memory=False, use_drafter=False, max_context=1024)
        res["drafter_cpu_layout_on_cpu"] = {"bundle": drafter_cpu, "width_policy": [
            d.decoder.target.min_width, d.decoder.target.width_multiple], "step_ms": {
            w: round(s * 1e3, 3) for w, s in time_widths(d.decoder.target, [1, 2, 4], 256, reps, 32000).items()}}
    return res


def smol(cuda_bundle: str, cpu_bundle: str | None, n: int = 64) -> dict:
    import edgespec

    prompts = [json.loads(line)["turns"][0] for line in
               (ROOT / "edgespec" / "data" / "prompts.jsonl").read_text().splitlines() if line.strip()]
    runs = {}
    for name, bundle, provider in (("cuda-layout on cuda", cuda_bundle, PROVIDER),
                                   ("cuda-layout on cpu", cuda_bundle, "cpu"),
                                   ("cpu-layout on cpu", cpu_bundle, "cpu")):
        if bundle is None:
            continue
        eng = edgespec.load(bundle, model_sampling=False, provider=provider, memory=False, max_context=1024)
        runs[name] = [gen(eng, p, n, "none")[0] for p in prompts]
        del eng
    ref = runs["cuda-layout on cuda"]
    out = {"prompts": len(prompts), "tokens": n}
    for name, toks in runs.items():
        if name == "cuda-layout on cuda":
            continue
        first = []
        for a, b in zip(ref, toks):
            diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            if diff is None and len(a) != len(b):
                diff = min(len(a), len(b))
            first.append(diff)
        out[f"cuda vs {name}"] = {"identical": sum(d is None for d in first), "first_divergence": first}
    return out


def memory(bundle: str, profile: str) -> dict:
    cmd = ["edgespec", "plan", bundle, "--profile", profile, "--provider", PROVIDER, "--measure", "--json"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    except Exception as e:
        return {"profile": profile, "error": f"{type(e).__name__}: {e}"}
    try:
        return {"profile": profile, "rc": r.returncode, "report": json.loads(r.stdout)}
    except ValueError:
        return {"profile": profile, "rc": r.returncode, "output": (r.stdout + r.stderr)[-2000:]}


BARE = r"""
import sys, numpy as np, onnx, onnxruntime as ort
from onnx import TensorProto, helper
from edgespec.measure import gpu_used
n = int(sys.argv[1])
w = helper.make_tensor("w", TensorProto.FLOAT16, [64, 64], np.ones(64 * 64, np.float16).tobytes(), raw=True)
g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 64])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1, 64])], [w])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 8
out = {"before": gpu_used()}
keep = []
for i in range(n):
    s = ort.InferenceSession(m.SerializeToString(), providers=["CUDAExecutionProvider"])
    s.run(None, {"x": np.ones((1, 64), np.float16)})
    keep.append(s)
    out[f"sessions={i + 1}"] = gpu_used()  # (bytes, 'process' or 'device')
print(out)
"""


def bare_cuda() -> dict:
    """GPU memory of a process holding 1 or 2 trivial CUDA sessions (one MatMul each, run once): the
    CUDA context and what each CUDA EP instance adds (cuBLAS handles and workspaces), no weights."""
    r = subprocess.run([sys.executable, "-c", BARE, "2"], capture_output=True, text=True, timeout=120)
    try:
        return {k: v for k, v in eval(r.stdout.strip().splitlines()[-1]).items()}  # noqa: S307 (our own dict)
    except Exception:
        return {"rc": r.returncode, "output": (r.stdout + r.stderr)[-1500:]}


def memory_ab(bundle: str) -> dict:
    """`plan --measure` (rtx4090-24gb) with the weights in the CUDA arena (onnxruntime's default) and
    on their own device allocations (session.use_device_allocator_for_initializers = 1, a profile's
    session_options): the A/B of that option, plus the bare CUDA context's cost."""
    src = (ROOT / "profiles" / "rtx4090-24gb.toml").read_text()
    other = Path(tempfile.mkdtemp()) / "rtx4090-device-allocator.toml"
    other.write_text(src.replace("[provider_options.cuda]", '[session_options]\n'
                                 '"session.use_device_allocator_for_initializers" = "1"\n[provider_options.cuda]', 1))
    return {"bare_cuda_bytes": bare_cuda(), "weights_in_arena": memory(bundle, "rtx4090-24gb"),
            "device_allocator_for_weights": memory(bundle, str(other))}


def smol_bench(bundle: str, keep_report: Path, extra: tuple = ()) -> dict:
    """`edgespec bench` on SmolLM2 (per category, 128 tokens, greedy): prompt lookup and auto
    against autoregressive decoding on the same provider, every output checked against greedy.
    ``extra``: more bench options (``--no-cuda-graphs``)."""
    cmd = ["edgespec", "bench", bundle, "--provider", PROVIDER, "--drafters", "prompt-lookup,auto",
           "--max-new-tokens", "128", "--no-plots", *extra, "--out", tempfile.mkdtemp(prefix="smol-bench-")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return {"rc": r.returncode, "output": (r.stdout + r.stderr)[-2000:]}
    report = Path(cmd[-1]) / "report.json"
    shutil.copy(report, keep_report)
    rep = json.loads(report.read_text())
    keep = ("tokens_per_second", "speedup", "exact", "tokens_per_target_call", "mean_accepted_length")
    return {"command": " ".join(cmd), "device": rep.get("device"),
            "summary": {cat: {d: {k: v.get(k) for k in keep} for d, v in per.items()}
                        for cat, per in rep["summary"].items()}}


def drafter_logits(bundle: str, reps: int) -> dict:
    """The 0.5B-shaped model alone (``SHAPED_DRAFTER_ONLY=1``, a cuda-layout target with the argmax
    output): its calls of 1, 2, 4 and 8 tokens with the logits copied to the host (as the drafter's
    steps are) and with only the argmax copied: what the drafter's step would gain from outputs
    that leave its logits on the device."""
    import edgespec
    from bench_width import time_widths

    eng = edgespec.load(bundle, model_sampling=False, provider=PROVIDER, memory=False, use_drafter=False, max_context=1024)
    lm = eng.decoder.target
    lm.min_width, lm.width_multiple = 1, 1
    out = {"bundle": bundle, "device_argmax": lm.device_argmax, "vocab": lm.spec.vocab_size}
    widths = [1, 2, 4, 8]
    out["logits_copied_ms"] = {w: round(s * 1e3, 3) for w, s in time_widths(lm, widths, 256, reps, 32000).items()}
    if lm.device_argmax:
        out["argmax_only_ms"] = {w: round(s * 1e3, 3) for w, s in
                                 time_widths(lm, widths, 256, reps, 32000, argmax=True).items()}
        out["logits_copied_ms_again"] = {w: round(s * 1e3, 3) for w, s in
                                         time_widths(lm, widths, 256, reps, 32000).items()}
    return out


EXACT_TOKENS = 128  # new tokens a prompt in the exactness section
EXACT_PROMPTS = None  # its prompt file (None: the shipped prompts; a test's dry run takes fewer)


def exactness(bundle: str) -> dict:
    """scripts/check_exact.py on ``bundle`` on the provider (a process of its own): every output of
    auto and prompt lookup (draft bounds 8 and 15) against greedy decoding, the shipped prompts."""
    script = Path(__file__).resolve().parent.parent / "check_exact.py"
    cmd = [sys.executable, str(script), bundle, "--provider", PROVIDER, "--max-draft", "8,15",
           "--max-new-tokens", str(EXACT_TOKENS)] + (["--prompts", str(EXACT_PROMPTS)] if EXACT_PROMPTS else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    lines = r.stdout.strip().splitlines()
    res = {"command": " ".join(cmd[1:]), "rc": r.returncode, "policy": lines[0] if lines else None,
           "result": lines[-1] if lines else None, "differs": [x for x in lines if "differs" in x],
           "stderr": r.stderr.strip()[-600:] or None}
    if r.returncode not in (0, 1) or (r.returncode == 1 and not res["differs"]):  # the script failed itself
        res["error"] = f"check_exact.py exited {r.returncode}: {(res['stderr'] or '')[-300:]}"
    return res


LOAD = r"""
import sys, time, edgespec
t = time.perf_counter()
edgespec.load(sys.argv[1], model_sampling=False, provider=sys.argv[2], memory=False, max_context=4096)
print(round(time.perf_counter() - t, 3))
"""


def overlap(bundle: str, reps: int) -> dict:
    """The target's verify call (on this thread) and the drafter's steps (on a worker thread) alone and concurrently."""
    import edgespec
    from edgespec.device_thread import DeviceThread

    res: dict = {"bundle": bundle}
    variants = [("default", None)]
    if PROVIDER == "cuda":
        prof = Path(tempfile.mkdtemp()) / "own-stream-copies.toml"
        prof.write_text('memory_budget_mb = 100000\nproviders = ["cuda", "cpu"]\nmax_draft_tokens = 8\n'
                        'prefill_chunk = 512\n[provider_options.cuda]\narena_extend_strategy = '
                        '"kSameAsRequested"\ndo_copy_in_default_stream = "0"\n')
        variants.append(("own_stream_copies", str(prof)))
    for name, profile in variants:
        eng = edgespec.load(bundle, model_sampling=False, profile=profile, provider=PROVIDER, memory=False, max_context=1024,
                            prompt_cache_mb=0)
        target, lm = eng.decoder.target, eng.decoder.drafters["model"].lm
        c = min(256, target.max_context - 16, lm.max_context - 16)  # the tiny test bundles hold 256
        ids = [(7919 * i + 13) % 32000 for i in range(c + 8)]
        res["context"] = c
        for m in (target, lm):
            m.reset()
            m.forward(ids[:c])

        def verify(w):
            target.forward_argmax(ids[c:c + w])
            target.rewind(w)

        def draft(n):
            for i in range(n):
                lm.forward(ids[c + i:c + i + 1])
            lm.rewind(n)

        worker = DeviceThread(name="drafter")  # the drafter's steps, alone or beside the target's call

        def draft_there(n):  # the drafter's steps on the worker thread, alone
            worker.call(draft, n)

        def both(w, n):
            drafting = worker.submit(draft, n)
            verify(w)
            drafting.result()

        def med(fn, *a):
            fn(*a)  # warm-up: a width's first calls allocate and capture
            fn(*a)
            xs = []
            for _ in range(reps):
                t = time.perf_counter()
                fn(*a)
                xs.append(time.perf_counter() - t)
            return round(statistics.median(xs) * 1e3, 3)

        table = {}
        for w in (2, 3, 4, 5):
            for n in (1, 2, 3, 4):
                # (session 75) the drafter always on the worker thread, the target always on this one: onnxruntime
                # keeps CUDA graphs per thread, and session 29's run timed the drafter alone here and together
                # there, where its first calls captured its graphs again beside the target's (it found no overlap;
                # probe_overlap.py, each model on a thread of its own, found the drafter's step hidden)
                tv, td, tb = med(verify, w), med(draft_there, n), med(both, w, n)
                table[f"w{w}_n{n}"] = {"verify_ms": tv, "draft_ms": td, "both_ms": tb,
                                       "hidden": round((tv + td - tb) / min(tv, td), 3)}
        worker.close()
        res[name] = table
        eng.close()
    return res


def threads(bundle: str, n: int = 64, fresh: int = 6) -> dict:
    """Generation time by the thread it runs on (the ``threads`` section)."""
    import gc

    import edgespec
    from edgespec.device_thread import DeviceThread

    def on_fresh_thread(fn):
        fresh_thread = DeviceThread(name="fresh")
        try:
            return fresh_thread.call(fn)
        finally:
            fresh_thread.close()

    def timed(eng):
        t = time.perf_counter()
        toks, _ = gen(eng, PROMPTS[0], n, "prompt-lookup")
        return toks, round(time.perf_counter() - t, 4)

    out: dict = {"bundle": bundle, "tokens": n}
    eng = edgespec.load(bundle, provider=PROVIDER)
    ref = gen(eng, PROMPTS[0], n, "none")[0]
    runs = [timed(eng) for _ in range(3)]
    out["loading_thread_s"] = [t for _, t in runs]
    out["memory_after_loading_thread"] = gpu_used_mib()
    fresh_runs = [on_fresh_thread(lambda: timed(eng)) for _ in range(fresh)]
    out["fresh_thread_s"] = [t for _, t in fresh_runs]
    out["memory_after_fresh_threads"] = gpu_used_mib()
    runs += fresh_runs
    del eng
    gc.collect()
    out["memory_after_first_engine_freed"] = gpu_used_mib()
    device = DeviceThread()  # one thread, kept: the load and every generation (as edgespec serve runs them)
    try:
        eng = device.call(edgespec.load, bundle, provider=PROVIDER)
        one = [device.call(timed, eng) for _ in range(fresh)]
        out["one_device_thread_s"] = [t for _, t in one]
        out["memory_after_one_device_thread"] = gpu_used_mib()
        runs += one
        del eng
    finally:
        device.close()
    out["exact"] = all(toks == ref for toks, _ in runs)
    return out


def serve(bundle: str, n: int = 8, tokens: int = 64) -> dict:
    """The ``serve`` section (its server's log in a temporary folder, removed after: its tail is in the result; one
    was left in /tmp at every run, a test's too; session 92)."""
    folder = Path(tempfile.mkdtemp(prefix="edgespec-serve-"))
    try:
        return _serve(bundle, n, tokens, folder / "server.log")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _serve(bundle: str, n: int, tokens: int, log: Path) -> dict:
    import re
    import signal
    import urllib.request

    cmd = [sys.executable, "-m", "edgespec", "serve", bundle, "--provider", PROVIDER, "--port", "0", "--no-memory",
           "--temperature", "0", "--prompt-cache-mb", "0"]
    out: dict = {"command": " ".join(cmd[1:]), "tokens": tokens}
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=str(ROOT))
    try:
        url, deadline = None, time.monotonic() + 180
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            m = re.search(r"serving on (http://\S+/v1)", log.read_text())
            url = m.group(1) if m else None
            time.sleep(0.2)
        if url is None:
            return {**out, "error": f"the server did not start: {log.read_text()[-800:]}"}
        model = Path(bundle).resolve().name
        body = json.dumps({"model": model, "max_tokens": tokens, "temperature": 0,
                           "messages": [{"role": "user", "content": PROMPTS[0]}]}).encode()
        secs, mem, texts = [], [], []
        for _ in range(n):
            req = urllib.request.Request(url + "/chat/completions", body, {"Content-Type": "application/json"})
            t = time.perf_counter()
            with urllib.request.urlopen(req, timeout=120) as r:
                reply = json.loads(r.read())
            secs.append(round(time.perf_counter() - t, 4))
            texts.append(reply["choices"][0]["message"]["content"])
            mem.append(gpu_used_mib(proc.pid)["process_mib"])
        out.update(seconds=secs, process_mib=mem, same_text=len(set(texts)) == 1, text=texts[0][:200])
    finally:
        proc.send_signal(signal.SIGTERM)  # (not SIGINT: a shell's background job starts with SIGINT ignored)
        try:
            out["rc"] = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out["rc"] = "killed"
    out["log_tail"] = log.read_text()[-600:]
    return out


def load_times(bundle: str) -> dict:
    """Seconds to load the bundle in a fresh process, with an empty cache directory (files hashed,
    placements checked: three sessions per GPU model), then all cached, then with only the
    placement verdicts forgotten (placements.json removed: the verdict cache's own worth), then
    cached again."""
    cache = Path(tempfile.mkdtemp(prefix="edgespec-cache-"))
    env = dict(os.environ, EDGESPEC_CACHE_DIR=str(cache))
    out: dict = {"cache_dir": str(cache)}

    def once(name: str) -> None:
        r = subprocess.run([sys.executable, "-c", LOAD, bundle, PROVIDER], env=env, capture_output=True,
                           text=True, timeout=180)
        last = (r.stdout.strip().splitlines() or ["?"])[-1]
        out[name] = float(last) if r.returncode == 0 else {"rc": r.returncode, "output": (r.stdout + r.stderr)[-800:]}

    once("cold")
    once("warm")
    verdicts = cache / "placements.json"
    out["verdicts_file"] = verdicts.is_file()
    verdicts.unlink(missing_ok=True)
    once("no_verdicts")
    once("warm_again")
    shutil.rmtree(cache, ignore_errors=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shaped")
    ap.add_argument("--drafter-cpu")
    ap.add_argument("--drafter-cuda", help="the 0.5B-shaped model alone, cuda layout (SHAPED_DRAFTER_ONLY=1)")
    ap.add_argument("--smol-cuda")
    ap.add_argument("--smol-cpu")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--sections", default="env,shaped,smol,memory,placement,smol_bench")
    ap.add_argument("--provider", default="cuda")
    ap.add_argument("--json", required=True)
    args = ap.parse_args(argv)
    global PROVIDER
    PROVIDER = args.provider
    out = Path(args.json)
    res: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    if out.is_file():  # a later call adds its sections to the same file
        res = json.loads(out.read_text())
    jobs = {
        "env": lambda: env(),
        "shaped": lambda: shaped(args.shaped, args.reps) if args.shaped else {"skipped": "no --shaped bundle"},
        "shaped_nographs": lambda: shaped(args.shaped, args.reps, cuda_graphs=False) if args.shaped
        else {"skipped": "no --shaped bundle"},
        "probe_graphs": lambda: probe_graphs(args.shaped, out.parent) if args.shaped
        else {"skipped": "no --shaped bundle"},
        "placement": lambda: placement(args.shaped, args.drafter_cpu, args.reps) if args.shaped
        else {"skipped": "no --shaped bundle"},
        "smol": lambda: smol(args.smol_cuda, args.smol_cpu) if args.smol_cuda else {"skipped": "no --smol-cuda"},
        "smol_bench": lambda: smol_bench(args.smol_cuda, out.parent / "smol-bench.json") if args.smol_cuda
        else {"skipped": "no --smol-cuda"},
        "smol_bench_nographs": lambda: smol_bench(args.smol_cuda, out.parent / "smol-bench-nographs.json",
                                                  ("--no-cuda-graphs",)) if args.smol_cuda
        else {"skipped": "no --smol-cuda"},
        "memory": lambda: [memory(b, p) for b, p in ((args.shaped, "rtx4090-24gb"),
                                                      (args.shaped, "jetson-orin-nano-8gb")) if b],
        "memory_ab": lambda: memory_ab(args.shaped) if args.shaped else {"skipped": "no --shaped bundle"},
        "load_times": lambda: load_times(args.shaped) if args.shaped else {"skipped": "no --shaped bundle"},
        "drafter_logits": lambda: drafter_logits(args.drafter_cuda, args.reps * 2) if args.drafter_cuda
        else {"skipped": "no --drafter-cuda bundle"},
        "exactness": lambda: exactness(args.smol_cuda) if args.smol_cuda else {"skipped": "no --smol-cuda"},
        "overlap": lambda: overlap(args.shaped, args.reps) if args.shaped else {"skipped": "no --shaped bundle"},
        "threads": lambda: threads(args.smol_cuda) if args.smol_cuda else {"skipped": "no --smol-cuda"},
        "serve": lambda: serve(args.smol_cuda) if args.smol_cuda else {"skipped": "no --smol-cuda"},
        "probe_overlap": lambda: probe_overlap(args.shaped, out.parent) if args.shaped
        else {"skipped": "no --shaped bundle"},
    }
    for name in args.sections.split(","):
        t = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            res[name] = jobs[name]()
        except Exception as e:
            traceback.print_exc()
            res[name] = {"error": f"{type(e).__name__}: {str(e)[:600]}"}
        print(f"   {name}: {time.perf_counter() - t:.1f} s  {json.dumps(res[name])[:1500]}", flush=True)
        out.write_text(json.dumps(res, indent=1, default=str))
    failed = [n for n in args.sections.split(",") if isinstance(res.get(n), dict) and "error" in res[n]]
    if failed:
        print(f"error: sections failed: {', '.join(failed)} (their errors are in {out})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
