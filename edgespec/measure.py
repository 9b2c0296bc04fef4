"""Measured memory of a loaded engine, to hold against the plan (``edgespec plan --measure``).

Host memory is this process's peak resident set: ``getrusage(RUSAGE_SELF).ru_maxrss`` and, on
Linux, ``VmHWM`` from ``/proc/self/status``. Both are high-water marks, so each stage's figure
includes every earlier stage. GPU memory is read through NVML (``nvidia-ml-py``) when it is
installed and finds a GPU; on Jetson, where CPU and GPU share memory, NVML is absent and CUDA
allocations do not all show in the resident set either: compare with ``tegrastats`` there.
"""
from __future__ import annotations

import os
import resource
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

_FILLER = ("The harbour was quiet in the early morning. Fishing boats rocked at their moorings while gulls "
           "circled above the market, where traders laid out nets, baskets and crates of ice. ")


@dataclass(frozen=True)
class MemorySample:
    stage: str
    peak_rss: int  # bytes, from ru_maxrss
    vm_hwm: int | None  # bytes, VmHWM (Linux only)
    rss: int | None  # bytes, VmRSS now (Linux only)
    gpu: int | None  # bytes of GPU memory (NVML), None when unavailable
    gpu_scope: str | None = None  # 'process' or 'device' (all processes, when NVML cannot see ours)

    def to_dict(self) -> dict:
        return asdict(self)


# -- this process's resident memory: edgespec's one reader of it (bench samples it too) --------
def peak_rss() -> int:
    """Peak resident set of this process in bytes (ru_maxrss is KiB on Linux, bytes on macOS)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) if sys.platform == "darwin" else int(r) * 1024


def rss_now() -> int:
    """Resident set of this process now, in bytes: ``/proc/self/statm`` (cheap enough to sample
    every few milliseconds), or the peak (``peak_rss``) where there is no /proc."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return peak_rss()


def file_rss() -> int | None:
    """Resident bytes mapped from files now (``RssFile``), or None where there is no /proc."""
    return proc_status().get("RssFile")


def high_water_rss() -> int:
    """Peak resident set in bytes: ``VmHWM`` from /proc, or ``peak_rss`` where there is no /proc."""
    return proc_status().get("VmHWM") or peak_rss()


def proc_status(path: Path = Path("/proc/self/status")) -> dict[str, int]:
    """``VmHWM``, ``VmRSS`` and ``RssFile`` in bytes, from /proc (empty where there is no /proc).
    ``RssFile``: the resident pages mapped from files (a bundle's weights as onnxruntime maps them).
    They are clean, so the kernel can take them back under memory pressure, yet the high-water marks
    count them. How many a bundle's embedding table adds depends on the page cache: a file just
    written or hashed with ``read()`` is cached whole, and each row read maps far more than the row
    (the kernel's fault-around of cached pages, or its large folios: not told apart yet;
    docs/bench/sessions.md, sessions 21 and 22)."""
    out: dict[str, int] = {}
    try:
        text = path.read_text()
    except OSError:
        return out
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssFile"):
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[key] = int(parts[0]) * 1024  # the kernel reports kB
    return out


def gpu_used() -> tuple[int | None, str | None]:
    """GPU memory held by this process (or, failing that, by the whole device 0), via NVML."""
    try:
        import pynvml
    except ImportError:
        return None, None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None, None
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory), "process"
        # in a container NVML reports host pids: fall back to what the whole device uses
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used), "device"
    except pynvml.NVMLError:
        return None, None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass


def sample(stage: str, gpu: bool = False) -> MemorySample:
    st = proc_status()
    used, scope = gpu_used() if gpu else (None, None)
    return MemorySample(stage, peak_rss(), st.get("VmHWM"), st.get("VmRSS"), used, scope)


def prompt_length(context: int, prompt_tokens: int | None = None, new_tokens: int = 32) -> int:
    """The prompt ``measure`` prefills in a context of ``context`` tokens: ``prompt_tokens`` (default: all the
    context holds beside ``new_tokens`` decoded ones), at most that, at least 1."""
    room = context - new_tokens - 1
    return max(1, min(prompt_tokens, room) if prompt_tokens else room)


def measure(bundle, *, prompt_tokens: int | None = None, new_tokens: int = 32, between=None, **load_kw):
    """Load ``bundle`` with ``edgespec.load(**load_kw)``, prefill a prompt of ``prompt_tokens``
    tokens (default: enough to fill the context with the decoded tokens, the case the plan budgets
    for: KV pages become resident only when written) and decode ``new_tokens`` greedily
    (end-of-sequence ignored, so all of them are decoded; with the model drafter, when loaded, so
    that it reads the whole context too), sampling memory after each stage.
    ``between()``: called before the prefill and after each decoded token (the CLI's check for a signal whose
    exception a finalizer dropped); what it raises, as any failure here, closes the engine and propagates.
    Returns ``(engine, samples)``."""
    from .api import load

    samples = [sample("before load")]
    # (no prompt cache unless asked for: the plan's total leaves it out, as it fills only when conversations
    # are set aside; and this prefills the same prompt twice)
    load_kw.setdefault("prompt_cache_mb", 0)
    load_kw.setdefault("memory", False)  # (its filler prompt and reply are no output of the user's to remember)
    engine = load(bundle, **{"model_sampling": False, **load_kw})  # (greedy: what a plan measures, not the model's)
    try:
        gpu = engine.providers.device == "cuda"
        samples.append(sample("after load", gpu))
        n = prompt_length(engine.max_context, prompt_tokens, new_tokens)
        reps = 1
        ids = engine.encode(_FILLER)
        while len(ids) < n and reps < 1024:  # grow the text until it is long enough
            reps *= 2
            ids = engine.encode(_FILLER * reps)
        ids = ids[:n]
        if between is not None:
            between()
        engine.decoder.prefill(ids)  # (a full context's, minutes on a CPU: what its load dropped ends before it)
        samples.append(sample(f"after prefill ({len(ids)} tokens)", gpu))
        decoded = 0
        # the drafter at full context too, as the plan budgets it: a model drafter reads the context at
        # its first draft, and in a few tokens `auto` may never start it (its KV pages never written);
        # it reads the whole context here, not its read window (a long chat can fill its cache as much)
        model = engine.decoder.drafters.get("model")
        drafting = {"drafter": "model", "draft_tokens": 2} if model is not None else {}
        window = getattr(model, "read_window", None)
        if model is not None:
            model.read_window = None
        try:
            for _, toks, _, _ in engine.stream_ids(ids, max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True,
                                                **drafting):
                decoded += len(toks)
                if between is not None:
                    between()
        finally:
            if model is not None:
                model.read_window = window
        samples.append(sample(f"after decoding {decoded} tokens", gpu))
    except BaseException:
        engine.close()
        raise
    return engine, samples


def _footprint_here(root: str, role: str) -> int:
    """In this (fresh) process: resident bytes that opening the model of the manifest entry read
    from standard input (a JSON object, paths relative to ``root``) on the CPU EP adds, as
    ``edgespec.load`` opens it, and running it once on two tokens (which reads every weight the
    graph uses in place, such as FP8 weights behind DequantizeLinear). Counts the copies
    onnxruntime makes (prepacked MatMulNBits weights, constant-folded tensors) and the pages of the
    external-data file it has read; rows of a mapped embedding table that no token has read are
    not resident and are not counted."""
    import json

    import numpy  # noqa: F401  (imported by the runtime before any session opens)
    import onnxruntime  # noqa: F401

    from .manifest import ModelSpec
    from .onnx_lm import OnnxLM
    from .providers import choose

    spec = ModelSpec.from_dict(json.loads(sys.stdin.read()), root, role)
    before = proc_status().get("VmRSS")
    if before is None:
        raise OSError("no /proc/self/status here: cannot read the resident set")
    # no width probe: it would touch more of the short-call logits buffer, which the planner counts
    # in working memory (two tokens touch two of its rows)
    lm = OnnxLM(spec, min(64, spec.max_context), choose(["cpu"]), min_width=2)
    lm.forward([1, 2])
    after = proc_status()["VmRSS"]
    del lm
    return max(0, after - before)


def load_footprint(root, role: str, entry: dict, timeout: float = 900) -> int:
    """Resident bytes of the model described by manifest ``entry`` once opened on the CPU EP and
    run once, measured in a fresh Python process (so nothing this process holds is counted). The
    export stage stores it in the manifest for the planner. Raises OSError saying why where it
    cannot be measured (no /proc, or the child failed)."""
    import json
    import subprocess

    package_root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "edgespec.measure", "footprint", str(root), role]
    try:
        r = subprocess.run(cmd, input=json.dumps(entry), capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise OSError(f"measuring the {role} took over {timeout:.0f} s") from None
    if r.returncode != 0:
        last = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        raise OSError(last[-1] if last else f"the measuring process exited with {r.returncode}")
    try:
        return int(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise OSError(f"the measuring process printed no byte count: {r.stdout[-200:]!r}") from None


if __name__ == "__main__":  # python -m edgespec.measure footprint ROOT ROLE < ENTRY.json
    if len(sys.argv) != 4 or sys.argv[1] != "footprint":
        sys.exit("usage: python -m edgespec.measure footprint ROOT ROLE < ENTRY.json")
    print(_footprint_here(sys.argv[2], sys.argv[3]))
