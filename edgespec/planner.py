"""The memory planner: ``plan(manifest, profile)`` spends a profile's budget on a bundle.

Weights of target and drafter, both KV caches at the chosen context, working memory and the
runtime; it cuts the context first, then the model drafter (in favour of prompt lookup), or
refuses with ``BudgetError`` naming the numbers.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

from .errors import BudgetError, ConfigError
from .manifest import Manifest
from .profiles import MiB, Profile
from .providers import is_gpu

# Fixed runtime cost measured on CPU with onnxruntime 1.31: the interpreter, numpy, onnxruntime,
# tokenizers and a session's arena before any model weight (see tests/test_planner.py).
RUNTIME_BASE_BYTES = 150 * MiB
# Added when a model runs on CUDA or TensorRT, as measured on the first GPU run (session 16: an H200,
# CUDA 13, onnxruntime-gpu 1.31.1, NVML's figure for the process; docs/gpu.md; docs/gpu-run.json):
# - the CUDA context and the first CUDA session (a trivial MatMul graph, run once): 666 MiB;
# - each further GPU session (its own cuBLAS handles and workspaces): 150 MiB;
# - the Qwen-shaped pair held 367 MiB more once loaded than weights + KV + those two allowed for
#   (the kernels' code the graphs load, the width probe's activations): GPU_KERNELS_BYTES.
# Under these the measured peaks (tiny bundle 822 MiB; the shaped pair at a full 4096-token
# context 3254 MiB with the rtx4090-24gb profile, 2854 MiB with jetson-orin-nano-8gb) stay within
# the plan. Session 17, with the targets' argmax output (export/greedy.py, greedy calls' logits left
# on the device): 3266 and 2946 MiB (plans 3543 and 2945 before its term in working_bytes, 46 MiB more
# with it). A Jetson's context is smaller (unified memory, no separate VRAM): `plan --measure` there.
GPU_RUNTIME_BYTES = 700 * MiB
GPU_SESSION_BYTES = 160 * MiB
GPU_KERNELS_BYTES = 384 * MiB
# The prompt cache's size when the profile leaves it to the plan: this many full contexts of the target's
# KV cache, within what the budget leaves less PROMPT_CACHE_MARGIN of the plan's total (room for the plan's
# estimates to be short: measured peaks have run up to ~5% over them) (edgespec.prompt_cache)
PROMPT_CACHE_CONTEXTS = 4
PROMPT_CACHE_MARGIN = 0.15
# The suffix drafter's indexes, in the CPU's memory whatever device the models run on (edgespec.suffix): its
# context index holds up to ORDERS contexts a token of the prompt and reply (a generation's whole context at most)
# as Python objects: measured with tracemalloc on random tokens (its worst case: every context new), 1,180-1,410
# bytes a token from 512 to 32k tokens and up to 1,650 at the peak of a dict's resize (tests/test_planner.py);
# the memory store of earlier replies at its default cap (memory.DEFAULT_CAP_TOKENS: 4 bytes a token, ORDERS
# table entries of 12 bytes). Counted since session 54 (inside PROMPT_CACHE_MARGIN before). Documents an engine
# indexes come after the plan (Engine.add_documents: up to suffix.MAX_DOCUMENT_TOKENS tokens, ~96 bytes each), and
# a store given a larger cap is not counted either.
INDEX_CONTEXT_TOKEN_BYTES = 1700
INDEX_STORE_TOKEN_BYTES = 4 + 8 * 12


# the plan's cut where the model drafter does not fit (plan --json's "cuts"; `edgespec plan` prints it)
DRAFTER_DROPPED = "model drafter dropped (prompt lookup instead)"


def index_bytes(manifest: Manifest, context: int) -> int:
    """The suffix drafter's indexes at ``context`` tokens (INDEX_CONTEXT_TOKEN_BYTES): 0 for a vocabulary
    too large for them (the engine then has no suffix drafter)."""
    from .memory import DEFAULT_CAP_TOKENS
    from .ngram import MAX_TOKEN, ORDERS

    assert ORDERS == 8  # (the figures above)
    if manifest.target.vocab_size > MAX_TOKEN:
        return 0
    return context * INDEX_CONTEXT_TOKEN_BYTES + DEFAULT_CAP_TOKENS * INDEX_STORE_TOKEN_BYTES


@dataclass(frozen=True)
class Plan:
    budget: int
    context: int
    drafter: str  # 'model' when the model drafter is loaded, else 'none'
    default_drafter: str  # what generation uses by default
    prefill_chunk: int
    weights: dict[str, int]
    kv: dict[str, int]
    working: int
    runtime: int
    cuts: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    gpu: bool = False  # the runtime row includes the CUDA allowance (GPU_RUNTIME_BYTES)
    weights_basis: str = ""  # where the weight figures come from
    devices: dict[str, str] = field(default_factory=dict)  # role -> 'gpu' or 'cpu': where it is planned to run
    # the most the prompt cache may hold (bytes; 0: none): out of what the rest leaves, not in ``total``
    # (it fills only as conversations are set aside)
    prompt_cache: int = 0
    indexes: int = 0  # the suffix drafter's context index and memory store (index_bytes)

    @property
    def total(self) -> int:
        return sum(self.weights.values()) + sum(self.kv.values()) + self.working + self.runtime + self.indexes

    def rows(self) -> list[tuple[str, int]]:
        r = [(f"weights {k}", v) for k, v in self.weights.items()]
        r += [(f"KV cache {k} ({self.context} tokens)", v) for k, v in self.kv.items()]
        runtime = "runtime (onnxruntime, python, CUDA context)" if self.gpu else "runtime (onnxruntime, python)"
        r += [("working memory (logits, activations)", self.working)]
        if self.indexes:
            r.append(("suffix drafter's indexes (context, memory store)", self.indexes))
        r.append((runtime, self.runtime))
        return r

    def to_dict(self) -> dict:
        return {"budget": self.budget, "context": self.context, "drafter": self.drafter,
                "default_drafter": self.default_drafter, "prefill_chunk": self.prefill_chunk,
                "weights": self.weights, "kv": self.kv, "working": self.working, "indexes": self.indexes, "runtime": self.runtime,
                "gpu": self.gpu, "weights_basis": self.weights_basis, "devices": dict(self.devices), "prompt_cache": self.prompt_cache, "total": self.total, "cuts": list(self.cuts), "warnings": list(self.warnings)}


def working_bytes(manifest: Manifest, chunk: int, with_drafter: bool, context: int | None = None,
                  on_cpu: dict[str, bool] | None = None) -> int:
    """Transient memory of the calls, as onnxruntime keeps it: every session has its own arena,
    which keeps its biggest call's buffers, so the sessions' figures add up. Per session: a prefill
    chunk's logits (its output) and activations (hidden states and MLP intermediates, about
    16 x hidden), and on the CPU the attention scores of GroupQueryAttention (chunk x heads x the
    KV buffer's length x 4 bytes, one layer's at a time; CUDA's fused kernels keep none); plus the
    float32 copy of the biggest logits (freed after each call, so counted once; a model whose prefill
    computes its last position's logits only, ``io.logits_skip``, computes all of a call's at most for
    a verify call or a drafter's step with a hint: ``MAX_DRAFT`` + 1 rows, + 3 for a width policy's padding, and
    ``MAX_DRAFT`` more where the target verifies alternates) and each model's
    logits buffer for short calls (``OWN_LOGITS_MAX_WIDTH`` x vocab float32, kept); on a GPU, a target's
    argmax output's buffers (``ARGMAX_ROWS`` rows of float16 and float32 logits); on a GPU, the CUDA
    graphs' per-width logits buffers (``graphs.graph_logits_bytes``, counted whether or not graphs
    are on: at most 40 MiB for Qwen's vocabulary). ``on_cpu``: role -> whether that model runs on
    the CPU (default: all)."""
    from .graphs import graph_logits_bytes
    from .onnx_lm import ARGMAX_ROWS, OWN_LOGITS_MAX_WIDTH
    from .profiles import MAX_DRAFT

    specs = [manifest.target] + ([manifest.drafter] if with_drafter and manifest.drafter else [])
    arenas = copy = own = 0
    for s in specs:
        columns = s.head_size or s.vocab_size  # a drafter's reduced head has head_size columns
        # (a verify call of MAX_DRAFT + 1 tokens, padded by a width policy of up to 4; a call that verifies
        # alternates, one beside each draft token, MAX_DRAFT more)
        widest = MAX_DRAFT + 4 + (MAX_DRAFT if s.io.row_positions else 0)
        logits = (min(chunk, widest) if s.io.logits_skip else chunk) * columns * 4
        arenas += logits + chunk * s.hidden_size * 4 * 16
        own_attention = {"DecodeAttention", "DecodeAttentionF16", "DecodeAttentionQ8"} & set(s.operators or {})
        if context and (on_cpu or {}).get(s.role, True) and not own_attention:
            # (edgespec.DecodeAttention, exact-kernels since session 18, keeps one row's scores a thread)
            heads = s.num_attention_heads or s.hidden_size // s.head_dim
            arenas += min(chunk, context) * heads * (context + s.attention_pad) * 4
        copy = max(copy, logits)
        own += OWN_LOGITS_MAX_WIDTH * columns * 4
        if s.io.argmax and not (on_cpu or {}).get(s.role, True):
            # a GPU target's argmax (export/greedy.py): its first ARGMAX_ROWS rows of logits cast to float32 and
            # reduced, and a greedy call's float16 logits kept on the device: 10 bytes a column a row
            arenas += ARGMAX_ROWS * columns * 10
        if not (on_cpu or {}).get(s.role, True):
            own += graph_logits_bytes(columns, 2) + (context or 0) * 8  # float16 logits per width, the static mask
    a = manifest.assistant
    if a is not None and (on_cpu or {}).get("assistant", on_cpu is None):  # (where the plan loads it)
        # the assistant's session (mtp.py, on the CPU): its logits (kept, and the full row's intermediates of the
        # centroid head), and per layer kind the attended rows of the target's caches sliced and cast to float32 (its
        # keys transposed too): up to the context's rows of the widest cache
        widest = max((manifest.target.kv_shape(layer) for layer in a.sources.values()), key=lambda hw: hw[0] * hw[1])
        own += a.vocab_size * 4 * 3 + 3 * 2 * len(a.sources) * (context or 0) * widest[0] * widest[1] * 4
        own += a.target_hidden_size * 4 * 4
    return arenas + copy + own


def plan(manifest: Manifest, profile: Profile, *, max_context: int | None = None, use_drafter: bool = True,
         providers: Sequence[str] | None = None, drafter_providers: Sequence[str] | None = None,
         keep_drafter: bool = False) -> Plan:
    """Spend ``profile``'s budget on ``manifest``'s models. ``providers`` (default: the profile's)
    and ``drafter_providers`` (default: the profile's drafter_provider, else ``providers``) decide
    where each model runs, so how its weights are counted and whether the CUDA runtime allowance
    is; each KV cache is counted in its graph's dtype. ``keep_drafter``: a plan without the model
    drafter is a ``BudgetError`` (a placement asked for explicitly must fit). Where the budget cuts the context of
    float16 caches that int8 ones (``exact-kernels --kv-dtype int8``) would hold more of, a warning says how much; where
    it drops the model drafter that int8 caches would keep, a warning says so."""
    kw = dict(max_context=max_context, use_drafter=use_drafter, providers=providers,
              drafter_providers=drafter_providers, keep_drafter=keep_drafter)
    p = _plan(manifest, profile, **kw)
    if p.gpu or not any(c.startswith(("context ", DRAFTER_DROPPED)) for c in p.cuts):
        return p
    q8 = _int8_twin(manifest)
    if q8 is not None:
        try:
            alt = _plan(q8, profile, **kw)
        except BudgetError:
            return p
        how = "(edgespec exact-kernels BUNDLE -o OUT --kv-dtype int8: 0.56x float16's bytes)"
        if alt.drafter == p.drafter and alt.context > p.context:
            p = replace(p, warnings=p.warnings + (
                f"the budget cuts the context to {p.context} tokens; int8 KV caches would hold about {alt.context} "
                f"{how}",))
        elif alt.drafter == "model" and p.drafter == "none":  # (session 73: contexts with and without it not compared)
            p = replace(p, warnings=p.warnings + (
                f"the budget drops the model drafter; int8 KV caches would keep it, at a context of about "
                f"{alt.context} tokens {how}",))
    return p


def _int8_twin(manifest: Manifest) -> Manifest | None:
    """``manifest`` as `exact-kernels --kv-dtype int8` would have written it (each model of edgespec's kernels with
    float16 caches and heads of a multiple of 32 lanes: int8 caches), or None where its target cannot have them."""
    def twin(spec):
        if (spec is None or spec.kernels != "edgespec-q4" or spec.kv_dtype != "float16" or spec.layout != "cpu"
                or not spec.heads_take_int8):
            return None
        return replace(spec, kv_dtype="int8")

    target = twin(manifest.target)
    if target is None or manifest.assistant is not None:
        return None
    return replace(manifest, target=target, drafter=twin(manifest.drafter) or manifest.drafter)


def _plan(manifest: Manifest, profile: Profile, *, max_context: int | None = None, use_drafter: bool = True,
          providers: Sequence[str] | None = None, drafter_providers: Sequence[str] | None = None,
          keep_drafter: bool = False) -> Plan:
    if max_context is not None and max_context < 1:
        raise ConfigError(f"max_context must be a positive number of tokens, got {max_context}")
    budget = profile.budget_bytes
    want_drafter = use_drafter and manifest.drafter is not None and profile.drafter in ("auto", "model")

    def limit(with_drafter: bool) -> int:
        """The bundle's longest context for a build with or without the model drafter (the drafter's
        own limit binds only where it is loaded)."""
        t = manifest.target.max_context
        return min(t, manifest.drafter.max_context) if with_drafter else t

    def wanted(with_drafter: bool) -> tuple[int, int]:
        """(the context asked for, the floor) within ``limit(with_drafter)``."""
        ctx = min(max_context or profile.max_context, limit(with_drafter))
        return ctx, min(max(2, profile.min_context), ctx)  # (a floor of 1 token: a plan that runs nothing)

    want_ctx, floor = wanted(want_drafter)
    if want_ctx < 2:  # (1 held a one-token prompt and no reply: every request, and plan --measure, then failed)
        raise ConfigError(f"a context of {want_ctx} token holds no reply: max_context must be at least 2 (a "
                          f"prompt's token and one of the reply)")
    warnings = []
    target_prov = (list(providers) if providers else list(profile.providers))[0]
    drafter_prov = (list(drafter_providers) if drafter_providers else
                    [profile.drafter_provider] if profile.drafter_provider else [target_prov])[0]
    gpu, drafter_gpu = is_gpu(target_prov), is_gpu(drafter_prov)
    if profile.kv_dtype != "auto" and profile.kv_dtype != manifest.target.kv_dtype:
        warnings.append(f"profile asks for a {profile.kv_dtype} KV cache; this bundle's graphs use "
                        f"{manifest.target.kv_dtype}")
    cuts: list[str] = []
    chunk = profile.prefill_chunk

    def weights_basis(with_drafter: bool) -> str:
        if with_drafter and gpu != drafter_gpu:
            on = lambda g: "as stored (a GPU provider copies every initializer)" if g else "as resident on the CPU"  # noqa: E731
            return f"target on {target_prov}, {on(gpu)}; drafter on {drafter_prov}, {on(drafter_gpu)}"
        if gpu:
            return "bytes on disk (a GPU provider copies every initializer to the device)"
        used = [manifest.target] + ([manifest.drafter] if with_drafter else [])
        measured = [s.role for s in used if s.cpu_resident_bytes is not None]
        if len(measured) == len(used):
            return "resident on the CPU EP as measured at export, plus the embedding rows the context can read"
        if not measured:
            return ("bytes on disk (this bundle records no CPU measurement; scripts/refresh_sizes.py "
                    "measures it)")
        return (f"{', '.join(measured)} as measured on the CPU EP at export; "
                f"{', '.join(s.role for s in used if s.role not in measured)} as bytes on disk")

    # the bundle's assistant (mtp.py): loaded where a drafter model would be (use_drafter, the profile's auto or model
    # policy; or mtp), beside a target on the CPU
    want_assistant = (manifest.assistant is not None and use_drafter and profile.drafter in ("auto", "model", "mtp")
                      and not gpu)

    def build(ctx: int, with_drafter: bool) -> Plan:
        weights = {"target": manifest.target.weight_bytes(gpu, ctx)}
        kv = {"target": manifest.target.kv_bytes(ctx)}
        devices = {"target": "gpu" if gpu else "cpu"}
        if want_assistant:  # (the mtp drafter: no KV cache; on the CPU only for now)
            weights["assistant"] = manifest.assistant.weight_bytes(False)
            devices["assistant"] = "cpu"
        if with_drafter:
            weights["drafter"] = manifest.drafter.weight_bytes(drafter_gpu, ctx)
            kv["drafter"] = manifest.drafter.kv_bytes(ctx)
            devices["drafter"] = "gpu" if drafter_gpu else "cpu"
        gpu_sessions = int(gpu) + int(with_drafter and drafter_gpu)
        any_gpu = gpu_sessions > 0
        runtime = RUNTIME_BASE_BYTES + (GPU_RUNTIME_BYTES + GPU_KERNELS_BYTES + GPU_SESSION_BYTES * (gpu_sessions - 1)
                                        if any_gpu else 0)
        default = profile.drafter
        if not with_drafter and default in ("auto", "model", "mtp"):
            default = "auto" if default == "auto" else "mtp" if want_assistant else "prompt-lookup"
        # (a prefill chunk never holds more than the context: a profile's larger one plans for what it runs)
        chunk_here = max(1, min(chunk, ctx))
        working = working_bytes(manifest, chunk_here, with_drafter, ctx, {r: d == "cpu" for r, d in devices.items()})
        over = ((f"asked for a context of {max_context} tokens; this bundle allows {limit(with_drafter)}"
                 + (" with its drafter model" if with_drafter and limit(True) < limit(False) else ""),)
                if max_context and max_context > limit(with_drafter) else ())
        return Plan(budget, ctx, "model" if with_drafter else "none", default, chunk_here, weights, kv, working, runtime,
                    tuple(cuts), over + tuple(warnings), any_gpu, weights_basis(with_drafter), devices,
                    indexes=index_bytes(manifest, ctx))

    def fit_context(with_drafter: bool) -> int | None:
        """The largest context that fits: the one asked for, else the largest multiple of 64 above
        the floor, else the floor itself; None when not even the floor fits. A plan's total never
        falls as the context grows (KV, and on the CPU the embedding rows read), so a binary search
        finds it."""
        def fits(ctx: int) -> bool:
            return build(ctx, with_drafter).total <= budget

        want, least = wanted(with_drafter)
        if fits(want):
            return want
        if not fits(least):
            return None
        lo, hi = -(-least // 64), (want - 1) // 64  # multiples of 64 in [least, want)
        best = least
        while lo <= hi:
            mid = (lo + hi) // 2
            if fits(mid * 64):
                best, lo = mid * 64, mid + 1
            else:
                hi = mid - 1
        return best

    def finish(p: Plan) -> Plan:
        """``p`` with its prompt cache sized (CPU targets; see prompt_cache_bytes)."""
        size, cut, warn = prompt_cache_bytes(p, profile)
        return replace(p, prompt_cache=size, cuts=p.cuts + ((cut,) if cut else ()),
                       warnings=p.warnings + ((warn,) if warn else ()))

    ctx = fit_context(want_drafter)
    if ctx is not None:
        if ctx < want_ctx:
            cuts.append(f"context {want_ctx} -> {ctx} tokens")
        return finish(build(ctx, want_drafter))
    if want_drafter and keep_drafter:
        least = build(floor, True)
        raise BudgetError(
            f"the drafter placed on {drafter_prov} does not fit the budget of {budget / MiB:.0f} MiB ({profile.name}): "
            f"target and drafter at the minimum context of {floor} tokens need {least.total / MiB:.0f} MiB "
            f"({_breakdown(least)})")
    if want_drafter:
        ctx = fit_context(False)
        if ctx is not None:
            cuts.append(DRAFTER_DROPPED)
            if ctx < wanted(False)[0]:
                cuts.insert(0, f"context {wanted(False)[0]} -> {ctx} tokens")
            return finish(build(ctx, False))
    floor = wanted(False)[1]
    smallest = build(floor, False)
    raise BudgetError(
        f"the budget of {budget / MiB:.0f} MiB ({profile.name}) cannot hold this bundle: at the minimum context "
        f"of {floor} tokens without a drafter it needs {smallest.total / MiB:.0f} MiB ({_breakdown(smallest)})")


def _breakdown(p: Plan) -> str:
    """A refused plan's total in its parts (the drafter's refusal listed weights and KV only, ~1.7 GB of a 3 GB total
    unexplained: session 57, a review)."""
    return (f"weights {sum(p.weights.values()) / MiB:.0f} MiB, KV {sum(p.kv.values()) / MiB:.0f} MiB, "
            f"working {p.working / MiB:.0f} MiB, runtime {p.runtime / MiB:.0f} MiB"
            + (f", suffix indexes {p.indexes / MiB:.0f} MiB" if p.indexes else ""))


def prompt_cache_bytes(p: Plan, profile: Profile) -> tuple[int, str | None, str | None]:
    """(bytes, cut, warning): the prompt cache of plan ``p`` under ``profile``. It takes what the rest of the
    plan leaves of the budget and never cuts the context or the drafter: ``prompt_cache_mb`` unset gives
    ``PROMPT_CACHE_CONTEXTS`` full contexts of the target's KV cache (or what is left less a margin of
    ``PROMPT_CACHE_MARGIN`` of the plan's total), a value larger than what is left is cut to it (``cut`` says so). A target on a GPU keeps none: the prompt cache copies CPU
    caches (``warning`` where the profile asked for one)."""
    want = None if profile.prompt_cache_mb is None else profile.prompt_cache_mb * MiB
    if p.devices.get("target") != "cpu":
        return 0, None, ("the prompt cache keeps CPU caches only: none with the target on a GPU"
                         if want else None)
    left = max(0, p.budget - p.total)
    if want is None:
        room = max(0, left - int(PROMPT_CACHE_MARGIN * p.total))
        return min(room, PROMPT_CACHE_CONTEXTS * p.kv.get("target", 0)), None, None
    if want > left:
        return left, f"prompt cache {want / MiB:.0f} -> {left / MiB:.0f} MiB", (
            f"asked for a prompt cache of {want / MiB:.0f} MiB; the budget leaves {left / MiB:.0f} MiB for it")
    return want, None, None
