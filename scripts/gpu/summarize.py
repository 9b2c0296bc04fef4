#!/usr/bin/env python3
"""docs/gpu-run.json: the GPU runs' raw figures in one file (bundle, GPU, onnxruntime, tokens/s per
runner, width curves, exactness, memory, tests, predictions), from the files the runs brought back.

    python scripts/gpu/summarize.py docs/gpu/run1-gpu-run.json docs/gpu/run2-gpu-run.json \
        docs/gpu/run3-gpu-run.json --pytest docs/gpu/run1-pytest.log docs/gpu/run3-pytest.log \
        --predicted pred1.json pred3.json -o docs/gpu-run.json
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


def runners(shaped: dict) -> dict:
    return {k: {"tokens_per_s": v["tokens_per_s"], "x_ar": v.get("x_ar"), "tokens_per_target_call":
                v["tokens_per_target_call"], "exact": v["exact"]} for k, v in shaped.get("speed", {}).items()}


def run_summary(path: Path) -> dict:
    d = json.loads(path.read_text())
    out: dict = {"file": path.name, "started": d.get("started")}
    env = d.get("env", {})
    out["gpu"] = env.get("nvidia_smi")
    out["onnxruntime"] = env.get("onnxruntime")
    s = d.get("shaped", {})
    if "width_ms" in s:
        out["shaped"] = {"bundle": "qwen-shaped-cuda (Qwen2.5-Coder-1.5B/0.5B shapes, random weights, INT4 block 128, "
                                   "cuda layout, drafter head 65536)",
                         "width_policy": s["width_policy"], "width_ms_raw": s["width_ms"]["raw"],
                         "width_ms_policy": s["width_ms"]["policy"], "drafter_step_ms": s["drafter_step_ms"],
                         "one_token_ms_by_context": s["one_token_ms_by_context"], "runners": runners(s),
                         "memory_after_load_mib": s["memory_after_load"]}
        if "policy_argmax" in s["width_ms"]:  # session 17: greedy calls read the graph's argmax
            out["shaped"]["width_ms_policy_argmax"] = s["width_ms"]["policy_argmax"]
        if "cuda_graphs" in s:  # session 18: which calls replayed captured CUDA graphs
            out["shaped"]["cuda_graphs"] = s["cuda_graphs"]
        # session 27's probe bound, the drafter's long reads; session 29's reads and prefill chunks that
        # compute their last row's logits only
        for k in ("verified_width", "drafter_read_ms", "drafter_read_skip_ms", "target_chunk_ms"):
            if k in s:
                out["shaped"][k] = s[k]
    n = d.get("shaped_nographs", {})
    if "width_ms" in n:  # session 18: the same with CUDA graphs off
        out["shaped_nographs"] = {"width_ms_policy_argmax": n["width_ms"].get("policy_argmax"),
                                  "width_ms_raw": n["width_ms"]["raw"], "drafter_step_ms": n["drafter_step_ms"],
                                  "runners": runners(n)}
    if "probe_graphs" in d:  # plain onnxruntime with and without replays (probe_graphs.py)
        out["probe_graphs"] = {role: {w: {k: v for k, v in rec.items() if k != "trace"}
                                      for w, rec in res.get("widths", {}).items()}
                               for role, res in d["probe_graphs"].items() if isinstance(res, dict)}
    if "load_times" in d:
        out["load_seconds"] = d["load_times"]
    if "drafter_logits" in d:  # the 0.5B-shaped model alone: logits copied against only the argmax
        out["drafter_logits"] = d["drafter_logits"]
    p = d.get("placement", {})
    if "speed" in p:
        out["placement_drafter_on_cpu"] = {"runners": runners(p), "drafter_step_ms_cuda_layout_on_cpu":
                                           p.get("drafter_cuda_layout_on_cpu_step_ms"),
                                           "drafter_cpu_layout_on_cpu": p.get("drafter_cpu_layout_on_cpu")}
    if "overlap" in d:  # session 29: the verify call and the drafter's steps from two threads at once
        out["overlap"] = d["overlap"]
    if "threads" in d:  # session 75: generations on the loading thread, on fresh threads, on one device thread
        out["threads"] = d["threads"]
    if "probe_overlap" in d:  # the same with plain onnxruntime (probe_overlap.py)
        out["probe_overlap"] = {k: v for k, v in d["probe_overlap"].items() if k != "tail"}
    ex = d.get("exactness", {})
    if "result" in ex:  # check_exact.py on SmolLM2 on the provider
        out["exactness"] = {k: ex.get(k) for k in ("command", "policy", "result", "differs")}
    if "smol" in d:
        out["smollm2_gpu_vs_cpu_greedy"] = d["smol"]
    sb = d.get("smol_bench", {})
    if "summary" in sb:
        out["smollm2_bench"] = {"command": sb["command"], "per_category": sb["summary"]}
    sbn = d.get("smol_bench_nographs", {})
    if "summary" in sbn:
        out["smollm2_bench_nographs"] = {"command": sbn["command"], "per_category": sbn["summary"]}
    mem = d.get("memory")
    if isinstance(mem, list):
        out["memory"] = [{"profile": m["profile"], "plan_total": m["report"]["plan"]["total"],
                          "measured_gpu": {x["stage"]: x["gpu"] for x in m["report"]["measured"]}}
                         for m in mem if "report" in m]
    if "memory_ab" in d:
        ab = d["memory_ab"]
        out["memory_ab"] = {"bare_cuda_bytes": ab.get("bare_cuda_bytes"), **{
            arm: {x["stage"]: x["gpu"] for x in ab[arm]["report"]["measured"]}
            for arm in ("weights_in_arena", "device_allocator_for_weights") if "report" in ab.get(arm, {})}}
    return out


def pytest_summary(path: Path) -> dict:
    text = path.read_text(errors="replace")
    last = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed)", ln)]
    return {"file": path.name, "result": last[-1].strip("= ") if last else None,
            "failed": re.findall(r"^_+ (test_\w+(?:\[[^\]]*\])?) _+$", text, flags=re.M),
            "skipped": re.findall(r"^SKIPPED \[\d+\] (.*)$", text, flags=re.M)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--pytest", type=Path, nargs="*", default=[])
    ap.add_argument("--predicted", type=Path, nargs="*", default=[])
    ap.add_argument("-o", "--output", type=Path, required=True)
    args = ap.parse_args(argv)
    try:
        doc = {"what": "edgespec on a real NVIDIA GPU (issue #13): measured figures per run, then predictions",
               "runs": [run_summary(p) for p in args.runs],
               "tests": [pytest_summary(p) for p in args.pytest],
               "predicted_qwen_pair": [{"file": p.name, **json.loads(p.read_text())} for p in args.predicted]}
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.output.write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.output} ({args.output.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
