"""Where a model runs: its graph's layout against the provider, and nothing silently on the CPU.

A bundle's graphs have a device layout (``ModelSpec.layout``, chosen at export with ``--device``):
``cpu`` graphs compute in float32, ``cuda`` graphs in float16 (the model builder's CUDA layout).
onnxruntime's CUDA ``GroupQueryAttention`` kernel is registered for float16 and bfloat16 only, so a
cpu-layout graph on a GPU provider would run its attention on the CPU. GPU sessions are opened with
``session.disable_cpu_ep_fallback``: a node onnxruntime would hand to the CPU refuses the session,
and ``CpuFallbackError`` names its op types. The only CPU nodes accepted are those of the builder's
attention-mask subgraph (``/model/attn_mask_reformat/``: int64 scalars that onnxruntime's CUDA EP
places on the CPU by design, GetCpuPreferredNodes), unless a profile sets ``allow_cpu_fallback``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Sequence

from .errors import CpuFallbackError, ProviderError
from .integrity import cache_root, read_json_cache, stat_stamp, write_json_cache
from .providers import CPU, GPU_PROVIDERS, available_providers, canonical, choose, log, short_name

NO_CPU_FALLBACK = "session.disable_cpu_ep_fallback"
# nodes of the builder's attention-mask subgraph (total and past lengths from the mask: int64
# scalars); onnxruntime's CUDA EP keeps small shape computations on the CPU on purpose
SHAPE_SUBGRAPH = "/model/attn_mask_reformat/"
_REFUSED = "fallback to CPU EP has been explicitly disabled"


def serve_layout(spec, requested: Sequence[str], explicit: bool) -> list[str]:
    """The providers ``spec`` may run on, of ``requested`` (short or full names, in order).

    A cpu-layout graph cannot run on CUDA or TensorRT (its float32 attention has no CUDA kernel):
    refused with ``ProviderError`` when the provider was named explicitly, else those providers are
    dropped with a warning and the CPU runs it. A cuda-layout graph on the CPU is served with a
    warning (``OnnxLM`` warns once the session runs there)."""
    names = [canonical(r) for r in requested] or [CPU]
    gpu = [n for n in names if n in GPU_PROVIDERS]
    if spec.layout != "cpu" or not gpu:
        return list(requested) or ["cpu"]
    why = (f"the {spec.role} graph has the cpu layout (float32 activations; onnxruntime's CUDA "
           f"GroupQueryAttention takes float16/bfloat16 only, so its attention would run on the CPU)")
    fix = "re-export the bundle with --device cuda" + (" (or --drafter-device cuda)" if spec.role == "drafter" else "")
    if explicit:
        run_cpu = "--drafter-provider cpu" if spec.role == "drafter" else "--provider cpu"
        raise ProviderError(f"{why}: {fix}, or run it with {run_cpu}")
    log.warning(f"{why}; it runs on the CPU instead ({fix} for the GPU)")
    return ["cpu"]


def warn_if_slow(spec, device: str) -> str | None:
    """The warning for a cuda-layout (float16) graph on the CPU EP, or None."""
    if spec.layout == "cuda" and device == "cpu":
        msg = (f"the {spec.role} graph has the cuda layout (float16 activations and KV cache) and runs on the CPU "
               f"EP, which runs float16 graphs slower than float32 ones (docs/gpu.md); export with --device cpu "
               f"for the CPU")
        log.warning(msg)
        return msg
    return None


def warn_if_no_skip(spec, device: str) -> str | None:
    """The warning for a graph on a GPU that computes every row's logits in a prefill (a bundle exported
    before session 29 has no ``logits_skip`` input): on an H200 a 512-token chunk of a 1.5B-shaped
    target took 239 ms that way against 6.7 ms with the skip, and a full context held 300-570 MiB more.
    None where the graph has it, or runs on the CPU (there it costs ~13% of a prefill: no warning)."""
    if device != "cpu" and not spec.io.logits_skip:
        msg = (f"the {spec.role} graph computes every position's logits in a prefill (exported before "
               f"session 29): on a GPU that is most of a prefill's time and memory; re-export the bundle "
               f"for the logits skip (docs/gpu.md)")
        log.warning(msg)
        return msg
    return None


def open_on_gpu(path, make_options, providers: list[tuple[str, dict]], role: str, allow_fallback: bool = False):
    """An ``InferenceSession`` on ``providers`` (a GPU provider first) with no silent CPU fallback.

    ``make_options()`` returns fresh ``SessionOptions``. The CPU EP is left out of the list (onnxruntime
    refuses the no-fallback option next to an explicit CPU EP) and the session is opened with
    ``session.disable_cpu_ep_fallback``. When onnxruntime refuses it, the graph is opened once more
    with the fallback allowed and onnxruntime's node placements logged, to name the nodes: the
    builder's mask subgraph alone is accepted, anything else raises ``CpuFallbackError``. An accepted
    graph is opened a third time, with the fallback allowed and the log at its default level: the
    session that logged its placements would log verbosely at every call for good (seen on the first
    GPU run: ~12,800 lines of memory-pattern notes on stderr in one benchmark)."""
    import onnxruntime as ort

    def plain(provs):
        return ort.InferenceSession(str(path), make_options(), providers=[n for n, _ in provs],
                                    provider_options=[o for _, o in provs])

    gpu = [(n, o) for n, o in providers if n != CPU]
    if allow_fallback:
        return plain(providers)
    key = _verdict_key(path, gpu)
    if key is not None and _verdicts().get(key) == MASK_ONLY:
        # this graph file, unchanged, was checked on these providers by this onnxruntime before: one
        # session instead of three (on the GPU run a model's load took 2.6-4.9 s with all three)
        log.info(f"{role}: placement known (the int64 mask nodes on the CPU, the rest on {gpu[0][0]})")
        return plain(gpu + [(CPU, {})])
    so = make_options()
    silenced = not os.environ.get("EDGESPEC_ORT_LOG", "").strip()
    if silenced:
        # (onnxruntime's refusal of this strict attempt, expected for every builder graph, is handled below; at the
        # GPU's log level it printed an ERROR line on loads that succeeded: the GPU runs' logs; session 56, a review)
        so.log_severity_level = 4
    so.add_session_config_entry(NO_CPU_FALLBACK, "1")
    try:
        strict = ort.InferenceSession(str(path), so, providers=[n for n, _ in gpu],
                                      provider_options=[o for _, o in gpu])
    except Exception as e:  # noqa: BLE001 - onnxruntime's own untyped errors
        if _REFUSED not in str(e):
            raise
    else:  # every node on the GPU: kept, unless its log was silenced above (opened again at the session's level)
        if not silenced:
            return strict
        del strict
        return plain(gpu)
    session, placements = _placements(path, make_options, gpu + [(CPU, {})])
    started = not gpu or gpu[0][0] in session.get_providers()
    on_cpu = placements.get(CPU, [])
    heavy = None if on_cpu is None else [(op, name) for op, name in on_cpu if not name.startswith(SHAPE_SUBGRAPH)]
    del session  # its weights leave the device before the session that is kept loads them
    if not started:
        return plain(gpu + [(CPU, {})])  # the provider could not start at all: OnnxLM says so (or refuses)
    if on_cpu and not heavy:
        log.info(f"{role}: {len(on_cpu)} int64 mask nodes run on the CPU, as onnxruntime places them by design")
        if key is not None:
            _remember(key, MASK_ONLY)
        return plain(gpu + [(CPU, {})])
    raise CpuFallbackError(fallback_message(role, heavy, gpu[0][0] if gpu else "no GPU provider", CPU in placements))


MASK_ONLY = "mask-only"  # a verdict: only the builder's mask subgraph falls to the CPU


def _verdicts_path() -> Path:
    return cache_root() / "placements.json"


def _verdict_key(path, gpu: list[tuple[str, dict]]) -> str | None:
    """The graph file (by its stat stamp), the GPU providers and onnxruntime's version: what a
    placement depends on; None when the file cannot be stat'ed."""
    import onnxruntime as ort

    try:
        st = os.stat(path)
    except OSError:
        return None
    ident = [os.path.realpath(path), ort.__version__, [n for n, _ in gpu], *stat_stamp(st)]
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:32]


def _verdicts() -> dict:
    return read_json_cache(_verdicts_path())  # none, or a broken one: the check runs again


def _remember(key: str, verdict: str) -> None:
    data = _verdicts()
    data[key] = verdict
    for old in list(data)[:-256]:  # bounded: the newest 256 graphs
        del data[old]
    write_json_cache(_verdicts_path(), data)


def fallback_message(role: str, nodes: list[tuple[str, str]] | None, provider: str, known: bool = True) -> str:
    """The refusal of a session with ``nodes`` (None: every node) on the CPU."""
    fix = ("export the bundle with --device cuda (float16 graphs), or set allow_cpu_fallback = true in the "
           "profile to run them on the CPU anyway (slow)")
    if not known or nodes == []:
        return (f"the {role} model has nodes that {provider} does not take and onnxruntime would run on the CPU "
                f"(which ones, onnxruntime's log did not say): {fix}")
    if nodes is None:
        return f"{provider} takes none of the {role} model's nodes; onnxruntime would run all of them on the CPU: {fix}"
    counts: dict[str, int] = {}
    for op, _ in nodes:
        counts[op] = counts.get(op, 0) + 1
    ops = ", ".join(f"{op} x{n}" for op, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return (f"the {role} model has {len(nodes)} nodes that {provider} does not take and onnxruntime would run on "
            f"the CPU ({ops}; e.g. {nodes[0][1]!r}): {fix}")


_PLACED = re.compile(r"(Node\(s\)|All nodes) placed on \[(\w+)\]")
_NODE = re.compile(r"(\w+) \(([^()]*)\)")


def parse_placements(text: str) -> dict[str, list[tuple[str, str]] | None]:
    """onnxruntime's verbose 'Node placements' log -> provider -> [(op type, node name)]; None
    for a provider that took every node ('All nodes placed on [X]', which lists none)."""
    out: dict[str, list[tuple[str, str]] | None] = {}
    current = None
    for line in text.splitlines():
        if "VerifyEachNodeIsAssignedToAnEp" not in line:
            continue
        m = _PLACED.search(line)
        if m:
            current = m.group(2)
            out[current] = None if m.group(1) == "All nodes" else []
            current = current if m.group(1) != "All nodes" else None
        elif current and "Some nodes were not assigned" not in line:
            out[current].extend(_NODE.findall(line.split("VerifyEachNodeIsAssignedToAnEp", 1)[1]))
    return out


def _placements(path, make_options, providers: list[tuple[str, dict]]):
    """Open ``path`` with the CPU fallback allowed and onnxruntime's verbose log captured: (the
    session, its node placements)."""
    import onnxruntime as ort

    so = make_options()
    so.log_severity_level = 0  # verbose: onnxruntime logs where each node runs
    fd, name = tempfile.mkstemp(prefix="edgespec-ort-", suffix=".log")
    saved = os.dup(2)
    try:
        os.dup2(fd, 2)  # onnxruntime logs to the process's stderr
        session = ort.InferenceSession(str(path), so, providers=[n for n, _ in providers],
                                       provider_options=[o for _, o in providers])
        with open(name, encoding="utf-8", errors="replace") as f:
            text = f.read()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)
        try:  # (also where the session failed: a GPU out of memory left a log in the temp folder each load)
            os.unlink(name)
        except OSError:
            pass
    return session, parse_placements(text)


def _runnable(names: list[str], warn: bool = True) -> list[str]:
    """``names`` as choose() runs them: the ones this onnxruntime has (a warning for the others), CPU last."""
    return [short_name(n) for n, _ in choose(names, warn=warn).providers]


def requested_providers(manifest, profile, provider: str | None = None, drafter_provider: str | None = None,
                        use_drafter: bool = True, here: bool = False,
                        warn: bool = True) -> tuple[list[str], list[str], bool]:
    """(the target's providers, the drafter's, whether the drafter's were named) as load() and the
    planner use them: ``provider`` (explicit) or the profile's list for the target; ``drafter_provider``
    (explicit), else the profile's ``drafter_provider``, else the target's list for the drafter;
    each checked against its graph's layout (``serve_layout``). ``here`` (load(): the plan is the one that runs):
    a profile's providers this onnxruntime lacks are left out, with choose()'s warning; without (``edgespec plan``,
    which may plan for another machine) they stay; ``warn`` false: that warning left to a load that follows."""
    for asked in (provider, drafter_provider):
        if asked:  # an unknown name is an error; here, one this onnxruntime lacks too (install onnxruntime-gpu);
            # `edgespec plan` without --measure may plan for another machine's (it says so)
            choose([asked], explicit=True) if here else canonical(asked)
    # (here: a GPU profile on a CPU-only onnxruntime planned a GPU's runtime and no prompt cache, then ran on the
    # CPU under that plan)
    target = [provider] if provider else _runnable(list(profile.providers), warn) if here else list(profile.providers)
    named = drafter_provider or profile.drafter_provider
    if here and named and not drafter_provider and canonical(named) not in available_providers():
        named = None  # (the profile's drafter placement, on a provider this onnxruntime lacks: the target's)
    drafter = [named] if named else list(target)
    target = serve_layout(manifest.target, target, explicit=bool(provider))
    # (the model drafter is loaded only where the profile's drafter may use it: its placement is checked only then)
    if manifest.drafter is not None and use_drafter and profile.drafter in ("auto", "model"):
        drafter = serve_layout(manifest.drafter, drafter, explicit=bool(named) or (bool(provider) and not named))
    return target, drafter, bool(named)
