"""One ONNX causal LM with a KV cache allocated once and updated in place.

The graph (onnxruntime GroupQueryAttention, as onnxruntime-genai's builder emits it) takes
``past_key_values.N.*`` and writes ``present.N.*``. Binding one ``[1, kv_heads, max_len, head_dim]``
buffer as both makes the update in place; the attention mask's length tells the graph how many
positions are valid, so rolling back is a shorter mask: ``rewind`` is O(1) and copies nothing.
"""
from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import BundleError, ContextOverflowError, EdgespecError, ProviderError
from .manifest import ModelSpec
from .providers import GPU_PROVIDERS, ProviderChoice, log

_NP_DTYPES = {"float32": np.float32, "float16": np.float16}
_ORT_FLOATS = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
# calls up to this many tokens (decode, verify) write their logits straight into one buffer kept by
# the model (16 x vocab: 9.3 MiB for Qwen's 152k vocabulary, within the planner's working memory):
# IOBinding.get_outputs() would wrap every present.* output too, ~0.17 ms a call on SmolLM2
OWN_LOGITS_MAX_WIDTH = 16
# call widths the exactness probe compares: one token, and verify calls up to 8 draft tokens
PROBE_WIDTHS = (1, 2, 3, 5, 9)


class OnnxLM:
    """``forward(ids) -> logits`` over a static KV buffer; ``rewind(n)`` in O(1).

    The model keeps the token ids whose keys/values sit in its cache (``tokens``); ``sync``
    reuses the longest common prefix with a new sequence, which is how chat turns and the
    drafter's catch-up avoid re-prefilling.
    """

    def __init__(self, spec: ModelSpec, max_context: int, providers: ProviderChoice, *,
                 threads: int = 0, prefill_chunk: int = 256, session_options: dict | None = None,
                 min_width: int | None = None):
        import onnxruntime as ort

        if max_context > spec.max_context:
            raise ContextOverflowError(
                f"{spec.role}: a context of {max_context} exceeds the exported maximum {spec.max_context}")
        self.spec = spec
        self.max_context = int(max_context)
        # Exactness policy (see README, "Exactness"): where a kernel computes a 1-token call with
        # other arithmetic than a wider call (onnxruntime's CPU MatMulNBits at accuracy level 4),
        # every call carries at least ``min_width`` tokens, padding a 1-token call and rolling the
        # pad back. Every position is then computed the same way whatever the draft length.
        self.prefill_chunk = max(1, int(prefill_chunk))
        self.session = open_session(spec.path, providers, threads=threads, session_options=session_options,
                                    role=spec.role)
        self.device = _check_running(self.session.get_providers(), providers, spec.role)
        self.min_width = 1 if min_width is None else int(min_width)  # None: measured below
        inputs = {i.name for i in self.session.get_inputs()}
        io = spec.io
        _check_graph_names(spec, inputs, {o.name for o in self.session.get_outputs()})
        self._has_pos = bool(io.position_ids) and io.position_ids in inputs
        dtype = _NP_DTYPES.get(spec.kv_dtype)
        if dtype is None:
            raise EdgespecError(f"{spec.role}: KV dtype {spec.kv_dtype} is not supported by this runtime")
        shape = (1, spec.num_kv_heads, self.max_context, spec.head_dim)
        self._kv = []
        for layer in range(spec.num_layers):
            for past, present in ((io.past_key, io.present_key), (io.past_value, io.present_value)):
                if self.device == "cuda":
                    buf = ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, "cuda", 0)
                else:
                    buf = ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, dtype))
                self._kv.append((past % layer, present % layer, buf))
        self._mask = np.ones((1, self.max_context), dtype=np.int64)
        self._positions = np.arange(self.max_context, dtype=np.int64)[None, :]
        self._binding = self.session.io_binding()
        for past, present, buf in self._kv:
            self._binding.bind_ortvalue_input(past, buf)
            self._binding.bind_ortvalue_output(present, buf)
        self._logits_buf: np.ndarray | None = None  # [1, OWN_LOGITS_MAX_WIDTH, vocab], made on first use
        self._logits_out: dict[int, tuple[np.ndarray, object]] = {}  # width -> (view of it, its OrtValue)
        self._logits_type = None  # (dtype, vocab) when the graph's logits have a static vocab axis
        for o in self.session.get_outputs():
            if o.name == io.logits and o.type in _ORT_FLOATS and isinstance(o.shape[-1], int):
                self._logits_type = (_ORT_FLOATS[o.type], o.shape[-1])
        self.tokens: list[int] = []
        self.last_fed = 0  # tokens the last sync() fed (the rest of its ids were cached)
        self.calls = 0
        self.run_seconds = 0.0  # time inside session.run
        if min_width is None:
            # measured on the provider that actually runs (a GPU provider may have fallen back to CPU)
            self.min_width = self._measure_min_width()

    # -- state -------------------------------------------------------------------------------
    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def kv_bytes(self) -> int:
        return self.spec.kv_bytes(self.max_context)

    def rewind(self, n: int) -> None:
        """Forget the last ``n`` positions. O(1): the stale entries are overwritten by later writes."""
        if n < 0 or n > len(self.tokens):
            raise ValueError(f"cannot rewind {n} of {len(self.tokens)} positions")
        if n:
            del self.tokens[len(self.tokens) - n:]

    def reset(self) -> None:
        self.tokens.clear()

    # -- compute -----------------------------------------------------------------------------
    def forward(self, ids: Sequence[int]) -> np.ndarray:
        """Append ``ids`` to the cache and return float32 logits ``[len(ids), vocab]``."""
        n = len(ids)
        if n == 0:
            raise ValueError("forward() needs at least one token")
        past = len(self.tokens)
        if past + n > self.max_context:
            raise ContextOverflowError(
                f"{self.spec.role}: {past} + {n} tokens exceed the context of {self.max_context}")
        pad = self.min_width - n if n < self.min_width and past + self.min_width <= self.max_context else 0
        if pad:
            logits = self._run(list(ids) + [int(ids[-1])] * pad, past)[:n]
            self.tokens.extend(int(t) for t in ids)
            return logits
        logits = self._run(ids, past)
        self.tokens.extend(int(t) for t in ids)
        return logits

    def _run(self, ids: Sequence[int], past: int) -> np.ndarray:
        n = len(ids)
        b = self._binding
        b.bind_cpu_input(self.spec.io.input_ids, np.asarray(ids, dtype=np.int64).reshape(1, n))
        b.bind_cpu_input(self.spec.io.attention_mask, self._mask[:, : past + n])
        if self._has_pos:
            b.bind_cpu_input(self.spec.io.position_ids, self._positions[:, past: past + n])
        own = self._own_logits(n)
        if own is not None:
            b.bind_ortvalue_output(self.spec.io.logits, own[1])
        else:
            b.bind_output(self.spec.io.logits, "cpu")
        t0 = time.perf_counter()
        try:
            self.session.run_with_iobinding(b)
        except Exception as e:  # onnxruntime's own untyped errors, kept in the message
            raise BundleError(f"the {self.spec.role} model failed to run: {str(e).splitlines()[0][:300]} "
                              f"(a manifest that disagrees with its graph, or the device out of memory)") from e
        self.run_seconds += time.perf_counter() - t0
        self.calls += 1
        if own is not None:
            # a copy: the buffer is written again by the next call of this width
            return own[0].reshape(n, -1).astype(np.float32, copy=True)
        out = b.get_outputs()
        logits = out[len(self._kv)].numpy() if len(out) > len(self._kv) else out[0].numpy()
        logits = logits.reshape(n, -1)
        return logits if logits.dtype == np.float32 else logits.astype(np.float32)

    def _own_logits(self, n: int):
        """The host buffer (and its OrtValue) that a call of ``n`` tokens writes its logits to, or
        None where onnxruntime allocates them (long calls, a graph without a static vocab axis)."""
        if self._logits_type is None or n > OWN_LOGITS_MAX_WIDTH:
            return None
        own = self._logits_out.get(n)
        if own is None:
            import onnxruntime as ort

            if self._logits_buf is None:  # one buffer; each width binds a view of its first rows
                dtype, vocab = self._logits_type
                self._logits_buf = np.empty((1, OWN_LOGITS_MAX_WIDTH, vocab), dtype=dtype)
            view = self._logits_buf[:, :n]  # contiguous: the leading axis has one element
            own = self._logits_out[n] = (view, ort.OrtValue.ortvalue_from_numpy(view))
        return own

    def _measure_min_width(self, prefix: int = 16, widths: Sequence[int] = PROBE_WIDTHS) -> int:
        """The exactness policy's call width, measured on this session: after the same ``prefix``
        tokens, calls of each width in ``widths`` compute the positions they share; the result is
        the smallest width from which every wider probed call computes them bitwise the same. A
        call of 2 tokens made twice must also agree with itself, or no width can help (warned)."""
        need = prefix + max(widths)
        if self.max_context < need:
            return width_policy(self.spec, self.device)  # too small to probe: the rule measured on CPU
        vocab = min(self.spec.vocab_size, 32000)
        ids = [(7919 * i + 13) % vocab for i in range(need)]  # fixed, spread over the vocabulary
        rows = {}
        saved, self.min_width = self.min_width, 1
        try:
            self.reset()
            self.forward(ids[:prefix])
            for w in widths:
                self.rewind(self.length - prefix)
                rows[w] = self.forward(ids[prefix: prefix + w])
            self.rewind(self.length - prefix)
            again = self.forward(ids[prefix: prefix + 2])
        finally:
            self.reset()
            self.min_width = saved
            self.calls, self.run_seconds = 0, 0.0
        if not np.array_equal(again, rows[2]):
            log.warning(f"{self.spec.role}: the same call computed twice gives different logits on {self.device}; "
                        f"greedy speculative output may differ from autoregressive output here")
            return width_policy(self.spec, self.device)
        ws = sorted(widths)
        for w0 in ws:
            group = [w for w in ws if w >= w0]
            if all(np.array_equal(rows[a], rows[b][:a]) for i, a in enumerate(group) for b in group[i + 1:]):
                return w0
        return ws[-1]

    def sync(self, ids: Sequence[int]) -> np.ndarray:
        """Make the cache hold exactly ``ids``, reusing the common prefix; return the last position's logits.

        Long new spans are fed in chunks of ``prefill_chunk`` tokens, so the transient logits
        buffer stays ``prefill_chunk x vocab`` whatever the prompt's length.
        """
        if not ids:
            raise ValueError("sync() needs at least one token")
        if len(ids) > self.max_context:
            raise ContextOverflowError(
                f"{len(ids)} tokens do not fit the context of {self.max_context}")
        common = _common_prefix(self.tokens, ids)
        common = min(common, len(ids) - 1)  # always feed at least one token to get logits
        self.rewind(len(self.tokens) - common)
        self.last_fed = len(ids) - common
        logits = None
        for start in range(common, len(ids), self.prefill_chunk):
            logits = self.forward(ids[start: start + self.prefill_chunk])
        return logits[-1]


def open_session(path, providers: ProviderChoice, *, threads: int = 0, session_options: dict | None = None,
                 role: str = "model"):
    """An onnxruntime session as every edgespec model is opened: the process-wide thread pool,
    all graph optimizations, the profile's session config entries. Also used at export time to
    measure a graph's resident memory once loaded (``edgespec.measure.load_footprint``)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    pool = shared_thread_pool(threads)
    so.use_per_session_threads = False  # every session runs on the process-wide pool
    if threads and pool not in (threads, -1):
        warnings.warn(f"onnxruntime's thread pool in this process already has {pool or 'default'} threads; "
                      f"threads={threads} is not applied", stacklevel=3)
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    for k, v in (session_options or {}).items():
        so.add_session_config_entry(k, str(v))
    prov_names = [p for p, _ in providers.providers]
    prov_opts = [o for _, o in providers.providers]
    try:
        return ort.InferenceSession(str(path), so, providers=prov_names, provider_options=prov_opts)
    except Exception as e:  # onnxruntime raises its own untyped exceptions
        raise EdgespecError(f"cannot open {role} model {Path(path).name}: {str(e).splitlines()[0]}") from None


_shared_pool: int | None = None  # threads of the process-wide intra-op pool, once made


def shared_thread_pool(threads: int | None) -> int:
    """Make (once per process) onnxruntime's global intra-op thread pool, which every edgespec
    session runs on; returns its size (0: onnxruntime's default, one per physical core; -1:
    made outside edgespec, size unknown). A target and its drafter take turns on the same cores:
    with a pool per session, each session's idle workers spin for a while after every call and
    take the cores from the other session's next call. On this 2-core CPU that cost the Qwen pair
    a third of its speed (model drafting at k=4 on code: 17.6 tok/s with a pool per session,
    26.8 with spinning off, 30.1 with one shared pool). onnxruntime allows one global pool per
    process, so the first session's thread count holds for the process."""
    global _shared_pool
    import onnxruntime as ort

    if _shared_pool is None:
        want = max(0, int(threads or 0))
        try:
            ort.set_global_thread_pool_sizes(want, 1)
            _shared_pool = want
        except Exception:  # made before, outside edgespec
            _shared_pool = -1
    return _shared_pool


def _check_graph_names(spec: ModelSpec, inputs: set[str], outputs: set[str]) -> None:
    """The manifest's IO names and layer count must be the graph's: binding a name the graph lacks
    fails deep inside onnxruntime."""
    io = spec.io
    want_in = [io.input_ids, io.attention_mask] + [n % layer for layer in range(spec.num_layers)
                                                   for n in (io.past_key, io.past_value)]
    want_out = [io.logits] + [n % layer for layer in range(spec.num_layers) for n in (io.present_key, io.present_value)]
    missing = [n for n in want_in if n not in inputs] + [n for n in want_out if n not in outputs]
    if missing:
        raise BundleError(f"the {spec.role} graph has no {missing[0]!r}"
                          + (f" (and {len(missing) - 1} more names)" if len(missing) > 1 else "")
                          + f" that the manifest names ({spec.num_layers} layers); the bundle is inconsistent")
    extra = sorted(n for n in inputs if n.startswith(io.past_key.split("%")[0]) and n not in want_in)
    if extra:
        raise BundleError(f"the {spec.role} graph has {len(extra)} cache inputs the manifest does not count "
                          f"(e.g. {extra[0]!r}; manifest: {spec.num_layers} layers); the bundle is inconsistent")


def width_policy(spec: ModelSpec, device: str) -> int:
    """The exactness policy's call width where it cannot be measured (a context too small for the
    probe, or arithmetic that does not reproduce): what ``OnnxLM._measure_min_width`` found on the
    CPU EP for every graph measured (fp32, fp8, int4 and int8 at accuracy level 4): a one-token call
    takes another path than wider calls (MatMulNBits' int8-activation GEMV, MLAS' SGEMV; up to
    ~0.7 and ~2e-5 apart in logits), and calls of 2 to 9 tokens compute their rows bitwise the
    same. GPU kernels are not measured here: 1, and the probe decides at load.
    """
    return 2 if device == "cpu" else 1


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


def _check_running(running: list[str], choice: ProviderChoice, role: str) -> str:
    """onnxruntime falls back to the CPU by itself when a GPU provider cannot start (missing CUDA or
    cuDNN libraries): say so, or refuse when the provider was named explicitly. Returns where the
    KV cache must live."""
    if choice.primary not in running:
        msg = (f"{role}: {choice.primary} is in this onnxruntime build but could not start "
               f"(see onnxruntime's log above); {running[0] if running else 'nothing'} runs")
        if choice.explicit:
            raise ProviderError(msg)
        log.warning(msg)
    return "cuda" if running and running[0] in GPU_PROVIDERS else "cpu"
