"""One ONNX causal LM with a KV cache allocated once and updated in place.

The graph (onnxruntime GroupQueryAttention, as onnxruntime-genai's builder emits it) takes
``past_key_values.N.*`` and writes ``present.N.*``. Binding one ``[1, kv_heads, max_len, head_dim]``
buffer as both makes the update in place; the attention mask's length tells the graph how many
positions are valid, so rolling back is a shorter mask: ``rewind`` is O(1) and copies nothing.
"""
from __future__ import annotations

import re
import time
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import BundleError, ConfigError, ContextOverflowError, EdgespecError, ProviderError
from .kv import KVCache
from .lm import CausalLM, native_work
from .manifest import ModelSpec
from .providers import GPU_PROVIDERS, ProviderChoice, log
from .placement import open_on_gpu, warn_if_no_skip, warn_if_slow
from .sampling import greedy_choice
from .width import GPU_MIN_VERIFIED, measure_width, padded_width, width_invariant
from .graphs import GRAPH_MAX_WIDTH, GRAPH_OPTION, GraphCalls, plain_run_options, session_has_graphs

_ORT_FLOATS = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
# calls up to this many tokens (decode, verify) write their logits straight into one buffer kept by
# the model (32 x vocab: 18.5 MiB for Qwen's 152k vocabulary, within the planner's working memory):
# IOBinding.get_outputs() would wrap every present.* output too, ~0.17 ms a call on SmolLM2. 32: a
# CPU profile's draft bound (30) plus the round's last token fits
OWN_LOGITS_MAX_WIDTH = 32
# the positions a cuda-layout target's argmax output covers (export/greedy.py slices the logits to
# them; its output is [1, min(n, ARGMAX_ROWS)]): longer calls read the logits. Bundles are exported
# with it: changing it needs them exported again
ARGMAX_ROWS = 32


class OnnxLM(CausalLM):
    """An onnxruntime session over a ``KVCache``: ``forward(ids) -> logits``, ``rewind(n)`` in O(1),
    ``prefill(ids)`` keeping the prefix the cache shares with ``ids`` (chat turns, the drafter's
    catch-up). ``min_width`` None measures the exactness width on the running provider."""

    def __init__(self, spec: ModelSpec, max_context: int, providers: ProviderChoice, *,
                 threads: int = 0, prefill_chunk: int = 256, session_options: dict | None = None,
                 min_width: int | None = None, allow_cpu_fallback: bool = False):
        if max_context > spec.max_context:
            raise ContextOverflowError(
                f"{spec.role}: a context of {max_context} exceeds the exported maximum {spec.max_context}")
        self.spec = spec
        self.threads = int(threads or 0)  # asked for (0: onnxruntime's default); the process-wide pool's first holds
        # a graph that pads attention writes the pad's keys/values one position past the call: the
        # last exported position stays free for it
        self.max_context = min(int(max_context), spec.max_context - spec.attention_pad)
        self.prefill_chunk = max(1, int(prefill_chunk))
        self.session = open_session(spec.path, providers, threads=threads, session_options=session_options,
                                    role=spec.role, allow_cpu_fallback=allow_cpu_fallback, kernels=spec.kernels)
        self.device = _check_running(self.session.get_providers(), providers, spec.role)
        if spec.conv_layers and self.device != "cpu":  # (the states are set on the host: kv.ConvStates)
            raise BundleError(f"the {spec.role} model has convolution layers, which edgespec runs on the CPU only for "
                              f"now ({self.device} was chosen): run it with --provider cpu")
        self.layout_warning = warn_if_slow(spec, self.device) or warn_if_no_skip(spec, self.device)
        self.min_width = 1 if min_width is None else int(min_width)  # None: measured below
        io = spec.io
        inputs = {i.name for i in self.session.get_inputs()}
        _check_graph_names(spec, inputs, {o.name for o in self.session.get_outputs()})
        _check_cache_dims(spec, self.session.get_inputs())
        self._has_pos = bool(io.position_ids) and io.position_ids in inputs
        # the graph's logits_skip input (manifest io.logits_skip): fed at every call, 0 but for a prefill's
        self._skip_name = io.logits_skip if io.logits_skip and io.logits_skip in inputs else None
        self.skips_logits = self._skip_name is not None
        self._skip = np.zeros(1, dtype=np.int64)
        # the graph's row_positions input (manifest io.row_positions): fed at every call, 0..n-1 but for a
        # call that verifies alternates (CPU caches: an accepted one's slot is moved by numpy)
        self._rows_name = io.row_positions if io.row_positions and io.row_positions in inputs else None
        self._rows = np.arange(max(self.max_context, 1), dtype=np.int64)
        self.cache = KVCache(spec, self.max_context, self.device, spare=spec.attention_pad)
        # (alternates are rows beside the causal ones: a convolution would read them as the next positions)
        self.verifies_alternates = self._rows_name is not None and bool(self.cache.host) and self.cache.conv is None
        # whether a verify call's extra rows are cheap: edgespec's kernel on its AVX-512 paths (the decoder then
        # verifies alternates by default): on AMX rows come in tiles of 16 (session 38: +2-8% on the AMX Xeon); on a
        # Zen 4's AVX-512 VNNI a call of 4-5 tokens costs ~4-8% more than one (session 40: greedy +2.7-5.1%, 2-4k-token
        # prompts +4%, sampled at T = 0.7 within the noise). Not on the AVX2 path (+0.8% in one A/B: nothing to show)
        self.cheap_rows = self.verifies_alternates and spec.kernels == "edgespec-q4" and _wide_path()
        self._mask = np.ones((1, self.max_context), dtype=np.int64)
        self._positions = np.arange(self.max_context, dtype=np.int64)[None, :]
        self._binding = self.session.io_binding()
        self.cache.bind(self._binding)
        self._logits_buf: np.ndarray | None = None  # [1, OWN_LOGITS_MAX_WIDTH, vocab], made on first use
        self._logits_out: dict[int, tuple[np.ndarray, object]] = {}  # width -> (view of it, its OrtValue)
        self._logits_type = None  # (dtype, vocab) when the graph's logits have a static vocab axis
        outputs = self.session.get_outputs()
        for o in outputs:
            if o.name == io.logits and o.type in _ORT_FLOATS and isinstance(o.shape[-1], int):
                self._logits_type = (_ORT_FLOATS[o.type], o.shape[-1])
                want = spec.head_size or spec.vocab_size
                if o.shape[-1] != want:  # (else a logit bias or a penalty row of the manifest's size fails mid-reply)
                    raise BundleError(f"the {spec.role} graph's logits have {o.shape[-1]:,} entries, the manifest says "
                                      f"{want:,} ({'head_size' if spec.head_size else 'vocab_size'}); the bundle is "
                                      "inconsistent")
        # each logits row's hidden state (manifest io.hidden: a target with an assistant), bound once asked for
        # (keeps_hidden): a host buffer the call writes, read by hidden_of
        self._hidden_name = io.hidden if io.hidden and any(o.name == io.hidden for o in outputs) else None
        self._keep_hidden = False
        self._hidden_buf: np.ndarray | None = None
        self._hidden_out: dict[int, tuple[np.ndarray, object]] = {}
        self._hidden_rows = (0, 0)  # (the returned rows' first row in the buffer, how many) of the last call
        # greedy on a GPU: the graph's argmax output (export/greedy.py), the logits left on the device
        self._argmax_name = io.argmax if io.argmax and any(o.name == io.argmax for o in outputs) else None
        self.device_argmax = self._argmax_name is not None and self.device == "cuda"
        self._argmax_buf = np.zeros((1, ARGMAX_ROWS), dtype=np.int64)
        self._argmax_out: dict[int, tuple[np.ndarray, object]] = {}  # width -> (view of it, its OrtValue)
        # CUDA graphs (edgespec/graphs.py): calls up to GRAPH_MAX_WIDTH tokens replay captured graphs
        self.graphs: GraphCalls | None = None
        self._plain_run = None  # run options of an ordinary run (set where the session has graph capture on)
        if self.device == "cuda" and session_has_graphs(self.session):
            self._plain_run = plain_run_options()
            lt = self._logits_type
            if lt is None:
                log.warning(f"{spec.role}: the graph's logits have no static vocabulary axis; CUDA graphs are off")
            else:
                self.graphs = GraphCalls(self.session, self._binding, io, max_context=self.max_context,
                                         vocab=lt[1], logits_dtype=lt[0], argmax_name=self._argmax_name,
                                         argmax_rows=ARGMAX_ROWS, has_positions=self._has_pos,
                                         skip_name=self._skip_name)
        self._init_counters()
        if min_width is None:
            # measured on the provider that actually runs (a GPU provider may have fallen back to CPU)
            self.min_width, self.width_multiple = measure_width(self)
        elif not width_invariant(self):
            # a policy given, not probed: verify calls no wider than the old probe's (but edgespec's own kernels), or
            # than the policy's narrowest call (every call up to it runs at its width, alike: min_width 12 left no
            # allowed draft under a bound of 9)
            self.verified_width = max(GPU_MIN_VERIFIED, padded_width(1, self.min_width, self.width_multiple))
        # a target bounded to the widths the probe verified feeds a prefill's last token alone (lm.feed); not a drafter,
        # whose catch-ups go through feed too (an extra call each) and whose arithmetic never reaches the output
        self.split_last = spec.role == "target" and self.verified_width is not None
        if self.min_width != 1 or self.width_multiple != 1:
            # alternates are one-token rows beside a call's causal ones: not where the width policy pads calls (a given
            # min_width, or a context too short for the probe: every model draft was a ValueError)
            self.verifies_alternates = self.cheap_rows = False
        if min_width is not None and self.device == "cpu" and self.max_context >= 2:
            # no width probe (a drafter): one short call now, so that the session's first-call costs
            # (onnxruntime's allocations, the INT4 kernel's copy of its weights onto 2 MiB pages, ~0.5 s
            # for the 0.5B Qwen drafter) are paid at load, not in the first generation's first draft,
            # where the round policy would time them as the drafter's catch-up and then price every
            # later catch-up at ten times its cost (session 19: `auto` stopped drafting code)
            self.forward([0, 0])
            self.reset()
            self._init_counters()

    @property
    def logits_width(self) -> int | None:
        """The graph's logits width when its output shape states it (a reduced head's N)."""
        return self._logits_type[1] if self._logits_type is not None else None

    @property
    def kv_bytes(self) -> int:
        return self.cache.nbytes

    def _run(self, ids: Sequence[int], past: int, argmax: bool = False, skip: int = 0, positions=None) -> np.ndarray:
        n = len(ids)
        if skip and (argmax or self._skip_name is None or not 0 < skip < n):
            raise ValueError(f"{self.spec.role}: cannot skip the logits of {skip} of {n} positions here")
        if argmax and (n > ARGMAX_ROWS or self._argmax_name is None):  # numpy's argmax of the copied logits
            return greedy_choice(self._run(ids, past, positions=positions))
        g = self.graphs
        if g is not None and n <= GRAPH_MAX_WIDTH and not skip:
            t0 = time.perf_counter()
            try:
                out = g.run(ids, past, argmax)
            except Exception as e:  # onnxruntime's own untyped errors, kept in the message
                raise BundleError(f"the {self.spec.role} model failed to run (CUDA graph of {n} tokens): "
                                  f"{str(e).splitlines()[0][:300]} (--no-cuda-graphs runs without them)") from e
            self.run_seconds += time.perf_counter() - t0
            self._returned_view = False
            return out
        b = self._binding
        conv = self.cache.conv
        if conv is not None:  # the states at ``past`` (a rewind, a pad left behind), the call's conv inputs kept
            conv.seek(past)
            conv.bind_call(b, n)
        b.bind_cpu_input(self.spec.io.input_ids, np.asarray(ids, dtype=np.int64).reshape(1, n))
        if g is not None:  # the static mask, as the graphs' calls (the same total length for every call)
            g.bind_mask(past + n)
        else:
            b.bind_cpu_input(self.spec.io.attention_mask, self._mask[:, : past + n])
        if self._has_pos:
            b.bind_cpu_input(self.spec.io.position_ids, self._positions[:, past: past + n])
        if self._rows_name is not None:
            rows_at = self._rows[:n] if positions is None else np.asarray(positions, dtype=np.int64)
            b.bind_cpu_input(self._rows_name, rows_at)
        elif positions is not None:
            raise ValueError(f"{self.spec.role}: this graph takes no rows' positions")
        if self._skip_name is not None:  # the rows that get logits: the last n - skip
            self._skip[0] = skip
            b.bind_cpu_input(self._skip_name, self._skip)
        rows = n - skip
        own = None if argmax else self._own_logits(rows)
        if argmax:  # the logits stay on the device: only the indices are copied
            b.bind_output(self.spec.io.logits, self.device, 0)
        elif own is not None:
            b.bind_ortvalue_output(self.spec.io.logits, own[1])
        else:
            b.bind_output(self.spec.io.logits, "cpu")
        if self._keep_hidden:
            b.bind_ortvalue_output(self._hidden_name, self._hidden_view(rows)[1])
        top = None
        if self._argmax_name is not None:  # bound at every call once the graph has it (any width)
            top = self._own_argmax(rows)  # over the rows that get logits (all but in a skipping call)
            if top is not None:
                b.bind_ortvalue_output(self._argmax_name, top[1])
            else:
                b.bind_output(self._argmax_name, "cpu")
        t0 = time.perf_counter()
        try:
            # an ordinary run; where the session has graph capture on, said so (else: graph id 0)
            self.session.run_with_iobinding(b, self._plain_run)
        except Exception as e:  # onnxruntime's own untyped errors, kept in the message
            raise BundleError(f"the {self.spec.role} model failed to run: {str(e).splitlines()[0][:300]} "
                              f"(a manifest that disagrees with its graph, or the device out of memory)") from e
        self.run_seconds += time.perf_counter() - t0
        if conv is not None:
            conv.after_call(past, n)
        if argmax:
            self._returned_view = False
            return top[0].reshape(n).copy()
        # calls up to OWN_LOGITS_MAX_WIDTH tokens write one kept buffer: their float32 logits are a
        # view of it, which the next call writes again (forward copies unless told not to)
        self._returned_view = own is not None and own[0].dtype == np.float32
        if own is not None:
            return own[0].reshape(rows, -1).astype(np.float32, copy=False)
        out = b.get_outputs()
        # (bound before the logits: the KV caches' and the conv states' outputs, then each call's conv inputs)
        nkv = len(self.cache.buffers) + (2 * len(conv.layers) if conv is not None else 0)
        logits = out[nkv].numpy() if len(out) > nkv else out[0].numpy()
        logits = logits.reshape(rows, -1)
        return logits if logits.dtype == np.float32 else logits.astype(np.float32)

    def keeps_hidden(self) -> bool:
        """Bind the graph's hidden-state output from the next call on (its rows: the logits'); False where the
        graph has none. On the CPU only (the CUDA graphs' calls do not bind it)."""
        if self._hidden_name is None or not self.cache.host or self.graphs is not None:
            return False
        self._keep_hidden = True
        return True

    def _hidden_view(self, n: int):
        """The host float32 buffer rows a call of ``n`` logits rows writes its hidden states to (grown as needed)."""
        if self._hidden_buf is None or self._hidden_buf.shape[1] < n:
            self._hidden_buf = np.zeros((1, max(n, OWN_LOGITS_MAX_WIDTH), self.spec.hidden_size), dtype=np.float32)
            self._hidden_out = {}
        return _bound_view(self._hidden_out, self._hidden_buf, n)

    def hidden_of(self, row: int) -> np.ndarray:
        """The hidden state of row ``row`` of the rows the last call returned (negative: from their end), a copy."""
        first, count = self._hidden_rows
        if not self._keep_hidden or not -count <= row < count:
            raise IndexError(f"no hidden state of row {row} (the last call returned {count} rows)")
        return self._hidden_buf[0, first + (row % count)].copy()

    def _own_argmax(self, n: int):
        """The host int64 buffer (and its OrtValue) a call of ``n`` tokens writes its argmax to, or
        None past ``ARGMAX_ROWS`` (onnxruntime allocates it, ``[1, ARGMAX_ROWS]``)."""
        return None if n > ARGMAX_ROWS else _bound_view(self._argmax_out, self._argmax_buf, n)

    def _own_logits(self, n: int):
        """The host buffer (and its OrtValue) that a call of ``n`` tokens writes its logits to, or
        None where onnxruntime allocates them (long calls, a graph without a static vocab axis)."""
        if self._logits_type is None or n > OWN_LOGITS_MAX_WIDTH:
            return None
        if self._logits_buf is None:  # one buffer; each width binds a view of its first rows
            dtype, vocab = self._logits_type
            self._logits_buf = np.empty((1, OWN_LOGITS_MAX_WIDTH, vocab), dtype=dtype)
        return _bound_view(self._logits_out, self._logits_buf, n)


def _bound_view(views: dict, buf: np.ndarray, n: int):
    """``(buf[:, :n], its OrtValue)``, made once per width and kept in ``views``: a call of ``n``
    tokens binds it as an output (contiguous: the leading axis has one element)."""
    own = views.get(n)
    if own is None:
        import onnxruntime as ort

        view = buf[:, :n]
        own = views[n] = (view, ort.OrtValue.ortvalue_from_numpy(view))
    return own


def _wide_path() -> bool:
    """Whether edgespec's INT4 kernel takes an AVX-512 path on this CPU (VNNI, or VNNI with AMX), where a verify
    call's extra rows are cheap; not its AVX2 path (EDGESPEC_Q4_ISA=avx2 stops it there)."""
    try:
        from .native import cheap_rows, isa

        return cheap_rows(isa())
    except Exception:  # noqa: BLE001 -- no kernel library here: no AVX-512 path either
        return False


def open_session(path, providers: ProviderChoice, *, threads: int = 0, session_options: dict | None = None,
                 role: str = "model", allow_cpu_fallback: bool = False, kernels: str = "onnxruntime"):
    """An onnxruntime session as every edgespec model is opened: the process-wide thread pool,
    all graph optimizations, the profile's session config entries. Also used at export time to
    measure a graph's resident memory once loaded (``edgespec.measure.load_footprint``). On a GPU
    provider nothing falls to the CPU silently (``placement.open_on_gpu``) unless
    ``allow_cpu_fallback``."""
    import onnxruntime as ort

    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:  # (onnxruntime's constructor takes UTF-8 paths only: its message was pybind11's)
        raise BundleError(f"onnxruntime cannot open the {role} model: its path is not UTF-8 text "
                          f"({str(path).encode('utf-8', 'backslashreplace').decode()[:200]}); rename the directory") \
            from None
    pool = shared_thread_pool(threads)
    if threads and pool not in (threads, -1, NO_GLOBAL_POOL):
        warnings.warn(f"onnxruntime's thread pool in this process already has {pool or 'default'} threads; "
                      f"threads={threads} is not applied", stacklevel=3)

    library = None
    if kernels == "edgespec-q4":  # edgespec.MatMulQ4 (edgespec/native): the CPU EP only
        if providers.primary in GPU_PROVIDERS:
            raise ProviderError(f"the {role} graph uses edgespec's INT4 CPU kernel (an exact-kernels bundle): open it "
                                f"on the CPU, or use the bundle it was made from on {providers.primary}")
        from .native import library_path

        library = library_path()

    def options():
        so = ort.SessionOptions()
        if pool == NO_GLOBAL_POOL:  # a pool per session, whose idle workers do not spin (the other model's turn)
            if threads:
                so.intra_op_num_threads = int(threads)
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        else:
            so.use_per_session_threads = False  # every session runs on the process-wide pool
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.log_severity_level = _ort_log_level(providers.primary)
        for k, v in (session_options or {}).items():  # a profile's onnxruntime session config entries
            so.add_session_config_entry(k, str(int(v)) if isinstance(v, bool) else str(v))
        if library:
            so.register_custom_ops_library(library)
        return so

    def attempt(provs):
        # (onnxruntime builds a session with the GIL released: native work the exit waits for, lm.native_work; a
        # daemon thread loading an engine as the app exited was ended inside it, "terminate called without an active
        # exception", SIGABRT: session 82)
        with native_work(attempt):
            if providers.primary in GPU_PROVIDERS:
                return open_on_gpu(path, options, provs, role, allow_fallback=allow_cpu_fallback)
            return ort.InferenceSession(str(path), options(), providers=[p for p, _ in provs],
                                        provider_options=[o for _, o in provs])

    try:
        try:
            return attempt(providers.providers)
        except EdgespecError:
            raise
        except Exception as e:  # noqa: BLE001 - onnxruntime's own; a graph it cannot capture opens without
            if not _graphs_refused(e, providers.providers):
                raise
            log.warning(f"{role}: onnxruntime cannot capture CUDA graphs of this graph ({str(e).splitlines()[0][:200]}); "
                        f"it runs without them")
            return attempt([(n, {k: v for k, v in o.items() if k != GRAPH_OPTION}) for n, o in providers.providers])
    except EdgespecError:
        raise
    except Exception as e:  # onnxruntime raises its own untyped exceptions
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        msg = f"cannot open {role} model {Path(path).name}: {first if len(first) <= 300 else first[:300] + '...'}"
        count = re.search(r"schema\(([\w.]+::\w+):\d+\) has input size (\d+) not in range \[min=\d+, max=(\d+)\]",
                          str(e))
        if count:  # (the message's first 300 characters name the node's inputs, not this)
            op, n, most = count.groups()
            msg = (f"cannot open {role} model {Path(path).name}: its {op} nodes have {n} inputs where onnxruntime "
                   f"{ort.__version__} takes at most {most}: upgrade onnxruntime, or export the bundle again with this "
                   "edgespec (its export drops the builder's trailing empty inputs)")
        # a graph it cannot read or build is the bundle's fault; memory, a provider's library: not
        broken = ("INVALID_PROTOBUF", "INVALID_GRAPH", "NO_SUCHFILE", "Protobuf parsing failed", "NOT_IMPLEMENTED",
                  "Failed to load external data", "External data", "invalid model", "Deserialize tensor",
                  "out of bounds", "No graph was found")
        raise (BundleError if any(b.lower() in str(e).lower() for b in broken) else EdgespecError)(msg) from None


def _ort_log_level(primary: str) -> int:
    """onnxruntime's log severity for a session: ``EDGESPEC_ORT_LOG`` (0 verbose ... 4 fatal) where set, else 4 on
    the CPU (an error there reaches the user as edgespec's one line, which carries onnxruntime's message: its own
    coloured log line before it said the same again) and 3 on a GPU provider, whose log says why it could not
    start (``_check_running`` points there)."""
    import os

    raw = os.environ.get("EDGESPEC_ORT_LOG", "").strip()
    if raw:
        if raw not in ("0", "1", "2", "3", "4"):
            raise ConfigError(f"EDGESPEC_ORT_LOG must be 0 (verbose) to 4 (fatal), got {raw[:40]!r}")
        return int(raw)
    return 3 if primary in GPU_PROVIDERS else 4


def _graphs_refused(e: Exception, provs) -> bool:
    """Whether ``e`` is onnxruntime refusing graph capture for a session that asked for it (a node
    it cannot place on the GPU, a memcpy node, control flow)."""
    asked = any(str(o.get(GRAPH_OPTION, "0")).lower() in ("1", "true") for _, o in provs)
    msg = str(e).lower()
    return asked and ("graph capture" in msg or "cuda graph" in msg)


_shared_pool: int | None = None  # threads of the process-wide intra-op pool, once made
# an onnxruntime whose Python API has no process-wide pool (1.22's: no set_global_thread_pool_sizes, nor
# SessionOptions.use_per_session_threads; a Jetson's wheels lag behind): each session its own, not spinning
NO_GLOBAL_POOL = -2


def shared_thread_pool(threads: int | None) -> int:
    """Make (once per process) onnxruntime's global intra-op thread pool, which every edgespec
    session runs on; returns its size (0: onnxruntime's default, one per physical core; -1:
    made outside edgespec, size unknown). A target and its drafter take turns on the same cores:
    with a pool per session, each session's idle workers spin for a while after every call and
    take the cores from the other session's next call. On this 2-core CPU that cost the Qwen pair
    a third of its speed (model drafting at k=4 on code: 17.6 tok/s with a pool per session,
    26.8 with spinning off, 30.1 with one shared pool). onnxruntime allows one global pool per
    process, so the first session's thread count holds for the process. ``NO_GLOBAL_POOL`` where this
    onnxruntime has none to make (each session then has its own, which does not spin)."""
    global _shared_pool
    import onnxruntime as ort

    if _shared_pool is None:
        want = max(0, int(threads or 0))
        if not (hasattr(ort, "set_global_thread_pool_sizes") and hasattr(ort.SessionOptions(), "use_per_session_threads")):
            _shared_pool = NO_GLOBAL_POOL
            return _shared_pool
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
    kv = [layer for layer in range(spec.num_layers) if spec.has_kv(layer)]
    want_in = [io.input_ids, io.attention_mask] + [n % layer for layer in kv for n in (io.past_key, io.past_value)]
    if io.logits_skip:
        want_in.append(io.logits_skip)
    if io.row_positions:
        want_in.append(io.row_positions)
    want_out = [io.logits] + [n % layer for layer in kv for n in (io.present_key, io.present_value)]
    conv = [c[0] for c in spec.conv_layers]
    want_in += [io.past_conv % layer for layer in conv]
    want_out += [n % layer for layer in conv for n in (io.present_conv, io.conv_input)]
    missing = [n for n in want_in if n not in inputs] + [n for n in want_out if n not in outputs]
    if missing:
        raise BundleError(f"the {spec.role} graph has no {missing[0]!r}"
                          + (f" (and {len(missing) - 1} more names)" if len(missing) > 1 else "")
                          + f" that the manifest names ({spec.num_layers} layers); the bundle is inconsistent")
    extra = sorted(n for n in inputs if n.startswith(io.past_key.split("%")[0]) and n not in want_in)
    if extra:
        raise BundleError(f"the {spec.role} graph has {len(extra)} cache inputs the manifest does not count "
                          f"(e.g. {extra[0]!r}; manifest: {spec.num_layers} layers); the bundle is inconsistent")


def _check_cache_dims(spec: ModelSpec, inputs) -> None:
    """The KV cache inputs' static axes (``[batch, kv heads, positions, head size]``) must be the manifest's:
    a cache made to the manifest's shape fails inside the attention at the first call otherwise."""
    names = {spec.io.past_key % layer: layer for layer in range(spec.num_layers)}
    names |= {spec.io.past_value % layer: layer for layer in range(spec.num_layers)}
    for i in inputs:
        shape = list(getattr(i, "shape", None) or [])
        if i.name not in names or len(shape) != 4:
            continue
        heads, width = spec.kv_row(names[i.name])  # (int8: a row with its scales)
        for axis, want, what in ((1, heads, "num_kv_heads"), (3, width, "head_dim")):
            if isinstance(shape[axis], int) and shape[axis] != want:
                raise BundleError(f"the {spec.role} graph's {i.name!r} has {shape[axis]} on its {what} axis, the "
                                  f"manifest says {want}; the bundle is inconsistent")


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
