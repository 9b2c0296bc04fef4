"""CUDA graphs for a model's short calls: the decode step and verify calls replay a captured graph.

On a GPU a small model's call is bound by kernel launches, not by memory (session 16, H200: a
one-token call of the 1.5B-shaped INT4 target took 2.9 ms where reading its weights takes 0.2 ms).
onnxruntime's CUDA EP can capture a session run as a CUDA graph and replay it (provider option
``enable_cuda_graph``, run option ``gpu_graph_id``). A replay copies nothing, runs no CPU kernel and
checks no shape: every input and output must sit at the address and have the shape it had when the
graph was captured. So a model in graph mode binds, per call width ``w`` (up to
``GRAPH_MAX_WIDTH``):

- the ids: a view of one device ``[1, GRAPH_MAX_WIDTH]`` int64 buffer, written in place;
- the attention mask: one *static* device ``[1, max_context]`` buffer, ones on the valid positions
  and zeros after (the graph derives the valid length from its sum, and the total length from its
  shape: the shape never changes, so the builder's CPU shape nodes may be left out of the replay,
  as onnxruntime-genai does);
- the logits: its own device ``[1, w, vocab]`` buffer (made at the width's first call; its rows
  are copied to the host only when asked for), and the argmax (where the graph has one): a view of
  one device ``[1, ARGMAX_ROWS]`` buffer;
- the KV cache: the model's buffers, bound in place as always.

Every call of the model uses the static mask, graph or not, so all of its calls compute with the
same total length (exactness does not depend on which calls are replays). A width's first call is
an ordinary run with these bindings (onnxruntime's arena grows for it there, never during a
capture), the next captures the graph and every later one replays it. Calls wider than
``GRAPH_MAX_WIDTH`` (prefill chunks) are ordinary runs with the static mask.
"""
from __future__ import annotations

import threading
from typing import Sequence

import numpy as np

from .providers import log

# widths that get a graph (each keeps a [1, w, vocab] logits buffer: for Qwen's 152k float16
# vocabulary the 16 widths hold 40 MiB in all); wider calls run as usual
GRAPH_MAX_WIDTH = 16
GRAPH_OPTION = "enable_cuda_graph"
_other_thread_warned = False  # the warning of a call on another thread than the capture's: given once a process


def graph_logits_bytes(vocab: int, dtype_bytes: int = 2) -> int:
    """Device memory the per-width logits buffers take at most (the planner's term)."""
    return sum(range(1, GRAPH_MAX_WIDTH + 1)) * int(vocab) * int(dtype_bytes)


def plain_run_options():
    """Run options of an ordinary run on a session with graph capture on (no capture, no replay:
    without them onnxruntime captures graph id 0)."""
    import onnxruntime as ort

    ro = ort.RunOptions()
    ro.add_run_config_entry("gpu_graph_id", "-1")
    return ro


def session_has_graphs(session) -> bool:
    """Whether ``session`` was opened with the CUDA EP's graph capture on."""
    try:
        opts = session.get_provider_options().get("CUDAExecutionProvider", {})
    except Exception:  # noqa: BLE001 - a session without provider options (a test double)
        return False
    return str(opts.get(GRAPH_OPTION, "0")).lower() in ("1", "true")


class GraphCalls:
    """The bindings and run options of one model's calls in graph mode (``OnnxLM`` with a session
    opened with ``enable_cuda_graph``). ``run(ids, past, argmax)`` returns float32 logits
    ``[n, vocab]`` or (``argmax``) int64 indices ``[n]``."""

    def __init__(self, session, binding, io, *, max_context: int, vocab: int, logits_dtype, argmax_name: str | None,
                 argmax_rows: int, device_id: int = 0, has_positions: bool = False, device: str = "cuda",
                 skip_name: str | None = None):
        """``device``: where the buffers live (cuda; cpu runs the same bindings on the CPU EP, for tests).
        ``skip_name``: the graph's logits-skip input, 0 at every graph call (a host value the capture
        keeps: the calls that skip rows, prefill chunks and catch-up reads, are ordinary runs)."""
        import onnxruntime as ort

        self._ort = ort
        self.session, self.binding, self.io = session, binding, io
        self.vocab, self.logits_dtype = int(vocab), logits_dtype
        self.argmax_name, self.argmax_rows = argmax_name, int(argmax_rows)
        self.device, self.device_id = device, device_id
        self.has_positions = has_positions
        self.skip_name = skip_name
        self._no_skip = np.zeros(1, dtype=np.int64)
        self._mask_host = np.zeros((1, int(max_context)), dtype=np.int64)
        self._valid = 0  # ones at the start of the mask
        self.mask = ort.OrtValue.ortvalue_from_numpy(self._mask_host, device, device_id)
        self._ids_host = np.zeros((1, GRAPH_MAX_WIDTH), dtype=np.int64)
        self.ids = ort.OrtValue.ortvalue_from_numpy(self._ids_host, device, device_id)
        self._pos_host = np.zeros((1, GRAPH_MAX_WIDTH), dtype=np.int64)
        self.pos = ort.OrtValue.ortvalue_from_numpy(self._pos_host, device, device_id) if has_positions else None
        self.argmax = (ort.OrtValue.ortvalue_from_shape_and_type((1, self.argmax_rows), np.int64, device, device_id)
                       if argmax_name else None)
        self.logits: dict[int, object] = {}  # width -> its device [1, w, vocab] OrtValue
        self.seen: set[int] = set()  # widths run once (the next call captures)
        self.captured: set[int] = set()  # widths whose graph is captured (replayed from now on)
        self._plain = plain_run_options()
        self._options: dict[int, object] = {}
        self.replays = 0  # calls that replayed a captured graph (a test's and a report's count)
        self.refused: str | None = None  # why a capture failed (then every call is an ordinary run)
        # widths whose replay computed other logits than an ordinary run (check_replays): ordinary runs
        self.excluded: set[int] = set()
        self.plain_only = False  # every call an ordinary run (check_replays' reference)
        # the thread its first graph was captured on (the object: an ended thread's id is given to later ones)
        self.capture_thread: threading.Thread | None = None
        self.other_thread_warned = False

    def _set_mask(self, valid: int) -> None:
        if valid != self._valid:
            if valid > self._valid:
                self._mask_host[0, self._valid: valid] = 1
            else:
                self._mask_host[0, valid: self._valid] = 0
            self._valid = valid
        self.mask.update_inplace(self._mask_host)

    def _run_options(self, w: int):
        ro = self._options.get(w)
        if ro is None:
            ro = self._options[w] = self._ort.RunOptions()
            ro.add_run_config_entry("gpu_graph_id", str(w))
        return ro

    def bind_mask(self, valid: int) -> None:
        """Bind the static mask with ``valid`` leading ones (every call of the model, graph or not)."""
        self._set_mask(valid)
        self.binding.bind_ortvalue_input(self.io.attention_mask, self.mask)

    @property
    def plain(self):
        """Run options of an ordinary run (no capture, no replay)."""
        return self._plain

    def run(self, ids: Sequence[int], past: int, argmax: bool) -> np.ndarray:
        """A call of at most ``GRAPH_MAX_WIDTH`` tokens, replayed once its width is captured."""
        n = len(ids)
        b, io = self.binding, self.io
        if not 0 < n <= GRAPH_MAX_WIDTH:
            raise ValueError(f"a graph call takes 1..{GRAPH_MAX_WIDTH} tokens, got {n}")
        self.bind_mask(past + n)
        self._ids_host[0, :n] = ids
        self.ids.update_inplace(self._ids_host)
        ptr = self.ids.data_ptr()
        b.bind_input(io.input_ids, self.device, self.device_id, np.int64, [1, n], ptr)
        if self.has_positions:
            self._pos_host[0, :n] = np.arange(past, past + n)
            self.pos.update_inplace(self._pos_host)
            b.bind_input(io.position_ids, self.device, self.device_id, np.int64, [1, n], self.pos.data_ptr())
        logits = self.logits.get(n)
        if logits is None:
            logits = self.logits[n] = self._ort.OrtValue.ortvalue_from_shape_and_type(
                (1, n, self.vocab), self.logits_dtype, self.device, self.device_id)
        b.bind_ortvalue_output(io.logits, logits)
        if self.skip_name is not None:  # every row's logits (an ordinary run before may have skipped some)
            b.bind_cpu_input(self.skip_name, self._no_skip)
        if self.argmax_name:
            b.bind_output(self.argmax_name, self.device, self.device_id, np.int64, [1, min(n, self.argmax_rows)],
                          self.argmax.data_ptr())
        b.synchronize_inputs()  # the in-place copies are done before the graph reads them
        if self.plain_only or n in self.excluded:
            self.session.run_with_iobinding(b, self._plain)
        elif n in self.captured:
            if threading.current_thread() is not self.capture_thread and not self.other_thread_warned:
                self._warn_other_thread()
            self.session.run_with_iobinding(b, self._run_options(n))
            self.replays += 1
        elif n in self.seen and not self.refused:
            try:
                self.session.run_with_iobinding(b, self._run_options(n))
                self.captured.add(n)
                if self.capture_thread is None:
                    self.capture_thread = threading.current_thread()
            except Exception as e:  # noqa: BLE001 - onnxruntime's own: a kernel that cannot be captured
                # ordinary runs from now on, with the same static bindings (the same arithmetic)
                self.refused = f"{str(e).splitlines()[0][:200]}"
                log.warning(f"onnxruntime could not capture a CUDA graph of {n} tokens ({self.refused}); "
                            f"this model runs without graphs")
                self.session.run_with_iobinding(b, self._plain)
        else:  # the width's first call: an ordinary run (the arena grows here, not in a capture)
            self.session.run_with_iobinding(b, self._plain)
            self.seen.add(n)
        if argmax:
            return self.argmax.numpy().reshape(-1)[:n].astype(np.int64, copy=False)
        return logits.numpy().reshape(n, -1).astype(np.float32, copy=False)

    def _warn_other_thread(self) -> None:
        global _other_thread_warned
        self.other_thread_warned = True
        if self.device == "cuda" and not _other_thread_warned:  # (once a process: the target's and drafter's alike)
            _other_thread_warned = True
            log.warning("this model's CUDA graphs were captured on another thread, and onnxruntime keeps them per "
                        "thread: it captures them again on this one (on an H200 a generation on a new thread took "
                        "3-7x as long, and each thread kept 77 MiB of GPU memory while the engine lived); call an "
                        "engine from one thread, the one that loaded it (edgespec serve does)")


# where check_replays compares replays with ordinary runs: at the prefix and a few positions past
# it (a kernel whose launch depended on the position would part at some positions only)
CHECK_OFFSETS = (0, 3, 9)


def check_replays(lm, ids: Sequence[int], prefix: int) -> set[int]:
    """Widths 1..GRAPH_MAX_WIDTH whose replay computes other logits than an ordinary run, on
    ``lm`` in graph mode (its cache empty; left empty): each width's graph is captured one
    position past the prefix, then replayed at the prefix and at ``CHECK_OFFSETS`` positions past
    it, and each replay's rows compared with an ordinary run's there (``ids``: at least prefix +
    max(CHECK_OFFSETS) + GRAPH_MAX_WIDTH + 1 tokens). A kernel whose launch depends on where it
    runs (the position, a tuning pass) would compute one thing in the run captured and another
    replayed. Those widths run ordinary calls from then on (``GraphCalls.excluded``), so a replay
    never stands in for a call it does not equal: a greedy generation's rows are the same whichever
    calls were replays."""
    g = lm.graphs
    starts = [prefix + o for o in CHECK_OFFSETS]
    widths = range(1, min(GRAPH_MAX_WIDTH, len(ids) - starts[-1] - 1) + 1)
    plain: dict[tuple[int, int], np.ndarray] = {}
    bad: set[int] = set()

    def at(start: int) -> None:
        """The cache holding ids[:start] (the prefix, then one ordinary call of the rest)."""
        lm.rewind(lm.length - prefix)
        if start > prefix:
            lm.forward(ids[prefix: start])

    lm.reset()
    lm.forward(ids[:prefix])
    g.plain_only = True
    try:
        for start in starts:  # the references: ordinary runs
            for w in widths:
                at(start)
                plain[start, w] = lm.forward(ids[start: start + w])
        for w in widths:  # each width's first call (ordinary) and its capture, one position past the prefix
            for _ in range(2):
                at(prefix + 1)
                g.plain_only = False
                try:
                    lm.forward(ids[prefix + 1: prefix + 1 + w])
                finally:
                    g.plain_only = True
        for start in starts:  # the replays
            for w in widths:
                if w in g.captured and w not in bad:
                    at(start)
                    g.plain_only = False
                    try:
                        row = lm.forward(ids[start: start + w])
                    finally:
                        g.plain_only = True
                    if not np.array_equal(row, plain[start, w]):
                        bad.add(w)
    finally:
        g.plain_only = False
    lm.reset()
    g.excluded |= bad
    return bad
