"""Token ids and the KV cache they index: the one record of what a model has computed.

``TokenCache`` holds the ids whose keys/values sit in a model's cache in an int64 array with a
length: appending is amortized O(1), rolling back is O(1) (a shorter length; the stale entries are
overwritten by later writes), and the common prefix with a new prompt is one vectorized compare.
``KVCache`` adds onnxruntime's buffers: one static ``[1, kv_heads, max_len, head_dim]`` buffer per
layer and key/value, bound as both ``past_key_values.N.*`` and ``present.N.*`` so that the graph
(GroupQueryAttention) updates it in place; the attention mask's length says how much is valid.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

_NP_DTYPES = {"float32": np.float32, "float16": np.float16, "int8": np.int8}


def q8_quantize(x: np.ndarray) -> np.ndarray:
    """Rows of ``D`` float32 lanes (the last axis, a multiple of 32) as an int8 KV cache's rows (edgespec.
    DecodeAttentionQ8's layout and numbers, bit for bit): per group of 32 lanes the scale s = max |x| / 127 (float32),
    the numbers x / s rounded to nearest, ties to even, within +-127 (a group of zeros: scale 0); then the D numbers
    and the D / 32 scales' float32 bytes, ``D + D / 8`` int8 a row. A group holding an infinity or a NaN: numbers 0,
    scale NaN."""
    from .manifest import Q8_GROUP

    x = np.asarray(x, np.float32)
    D = x.shape[-1]
    g = x.reshape(*x.shape[:-1], D // Q8_GROUP, Q8_GROUP)
    finite = np.isfinite(g).all(-1)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        s = np.where(finite, np.abs(np.where(np.isfinite(g), g, 0)).max(-1) / np.float32(127), np.float32(np.nan))
        s = s.astype(np.float32)
        q = np.where((finite & (s > 0))[..., None], np.rint(g / s[..., None]), 0)
    q = np.clip(q, -127, 127).astype(np.int8).reshape(*x.shape[:-1], D)
    return np.concatenate([q, s.astype("<f4").view(np.int8).reshape(*x.shape[:-1], D // Q8_GROUP * 4)], axis=-1)


def q8_dequantize(rows: np.ndarray, head_dim: int) -> np.ndarray:
    """The float32 lanes an int8 KV cache's rows (``q8_quantize``'s layout) stand for: each number times its group's
    scale, one rounding (what the attention computes as it loads them)."""
    from .manifest import Q8_GROUP

    rows = np.asarray(rows, np.int8)
    lead = rows.shape[:-1]
    q = rows[..., :head_dim].astype(np.float32).reshape(*lead, head_dim // Q8_GROUP, Q8_GROUP)
    s = np.ascontiguousarray(rows[..., head_dim:]).view("<f4").astype(np.float32)
    with np.errstate(over="ignore", invalid="ignore"):  # (a NaN scale's group: NaN, as the attention reads it)
        return (q * s[..., None]).reshape(*lead, head_dim)


def common_prefix(a: np.ndarray, ids: Sequence[int]) -> int:
    """Length of the longest common prefix of int64 ``a`` and ``ids`` (one vectorized compare)."""
    n = min(len(a), len(ids))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != np.asarray(ids[:n], dtype=np.int64))
    return int(diff[0]) if diff.size else n


class TokenBuffer:
    """A growable sequence of token ids over one int64 array (no per-token Python objects)."""

    __slots__ = ("_a", "_n")

    def __init__(self, ids: Sequence[int] = (), capacity: int = 256):
        self._a = np.zeros(max(capacity, len(ids), 1), dtype=np.int64)
        self._n = 0
        if len(ids):
            self.extend(ids)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self._a[: self._n][i].tolist()
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return int(self._a[i])

    def view(self) -> np.ndarray:
        """The ids as a read-only view (valid until the next extend)."""
        v = self._a[: self._n]
        v.flags.writeable = False
        return v

    def tolist(self) -> list[int]:
        return self._a[: self._n].tolist()

    def extend(self, ids: Sequence[int]) -> None:
        n = len(ids)
        if self._n + n > self._a.shape[0]:
            grown = np.zeros(max(self._n + n, 2 * self._a.shape[0]), dtype=np.int64)
            grown[: self._n] = self._a[: self._n]
            self._a = grown
        self._a[self._n: self._n + n] = ids
        self._n += n

    def set(self, i: int, v: int) -> None:
        if not 0 <= i < self._n:
            raise IndexError(i)
        self._a[i] = v

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` ids."""
        if not 0 <= n <= self._n:
            raise ValueError(f"cannot truncate {self._n} ids to {n}")
        self._n = n

    def common_prefix(self, ids: Sequence[int]) -> int:
        """Length of the longest common prefix with ``ids``."""
        return common_prefix(self._a[: self._n], ids)


class TokenCache:
    """What a model's cache holds: ``ids`` (a ``TokenBuffer``) up to ``max_len`` positions."""

    def __init__(self, max_len: int):
        self.max_len = int(max_len)
        self.ids = TokenBuffer(capacity=self.max_len)

    @property
    def length(self) -> int:
        return len(self.ids)

    def reachable(self, n: int) -> bool:
        """Whether the cache can be made to hold its first ``n`` positions (a rewind to ``n``): always, but where a
        convolution's state reaches back to recent positions only (``KVCache``)."""
        return True

    def rewind(self, n: int) -> None:
        """Forget the last ``n`` positions. O(1): nothing is copied."""
        if n < 0 or n > len(self.ids):
            raise ValueError(f"cannot rewind {n} of {len(self.ids)} positions")
        self.ids.truncate(len(self.ids) - n)

    def reset(self) -> None:
        self.ids.truncate(0)


class KVCache(TokenCache):
    """A ``TokenCache`` with onnxruntime buffers, allocated once, on the CPU or the CUDA device."""

    def __init__(self, spec, max_len: int, device: str, spare: int = 0):
        """``spare`` positions past ``max_len`` are allocated for a graph that writes padding there."""
        import onnxruntime as ort

        super().__init__(max_len)
        dtype = _NP_DTYPES.get(spec.kv_dtype)
        if dtype is None:
            from .errors import BundleError

            raise BundleError(f"{spec.role}: KV dtype {spec.kv_dtype} is not supported by this runtime (float32, "
                              "float16 or int8: export the bundle again)")
        io = spec.io
        self.buffers = []  # (past input name, present output name, OrtValue)
        self.host: list[np.ndarray] = []  # on the CPU: the buffers' memory as numpy arrays (the same bytes)
        own: dict[tuple[int, int], object] = {}  # (layer, key 0 or value 1) -> its buffer
        for layer in range(spec.num_layers):
            if not spec.has_kv(layer):  # (a convolution layer: its state is ``conv``'s)
                continue
            heads, width = spec.kv_row(layer)  # (an int8 cache's rows: the numbers and their scales)
            shape = (1, heads, self.max_len + spare, width)
            source = spec.kv_source(layer)
            for kv, (past, present) in enumerate(((io.past_key, io.present_key), (io.past_value, io.present_value))):
                if source != layer:  # (a shared key-value layer: its source's buffer, which its graph writes again)
                    self.buffers.append((past % layer, present % layer, own[source, kv]))
                    continue
                if device == "cuda":
                    buf = ort.OrtValue.ortvalue_from_shape_and_type(shape, dtype, "cuda", 0)
                else:
                    arr = np.zeros(shape, dtype)
                    buf = ort.OrtValue.ortvalue_from_numpy(arr)  # (an OrtValue over the array's memory)
                    self.host.append(arr)
                own[layer, kv] = buf
                self.buffers.append((past % layer, present % layer, buf))
        self.nbytes = spec.kv_bytes(self.max_len)
        self.conv = ConvStates(spec) if spec.conv_layers else None

    def reachable(self, n: int) -> bool:
        return self.conv is None or self.conv.reachable(n)

    def reset(self) -> None:
        super().reset()
        if self.conv is not None:
            self.conv.reset()

    def move(self, src: int, dst: int) -> None:
        """Slot ``src``'s keys and values (every layer) copied to slot ``dst``, its id with them (an
        accepted alternate into its position; CPU caches)."""
        if not self.host:
            raise NotImplementedError("moving a cache slot needs a CPU cache")
        for arr in self.host:
            arr[:, :, dst] = arr[:, :, src]
        self.ids.set(dst, self.ids[src])

    def bind(self, binding) -> None:
        """Bind every buffer as its layer's past input and present output (the in-place update)."""
        for past, present, buf in self.buffers:
            binding.bind_ortvalue_input(past, buf)
            binding.bind_ortvalue_output(present, buf)
        if self.conv is not None:
            self.conv.bind(binding)


@dataclass
class _ConvLayer:
    """One convolution layer's buffers (ConvStates)."""

    past_name: str
    present_name: str
    input_name: str
    past: np.ndarray  # [1, channels, k]: the state the next call reads
    present: np.ndarray  # [1, channels, k]: the state the call writes
    inputs: np.ndarray  # channels x the widest call's conv inputs, flat (a call's are its first channels x n)
    channels: int
    past_value: object = None  # OrtValues over ``past`` and ``present``
    present_value: object = None

    def call_inputs(self, n: int) -> np.ndarray:
        """The conv inputs of a call of ``n`` tokens, ``[channels, n]`` (a view of the buffer)."""
        return self.inputs[: self.channels * n].reshape(self.channels, n)


@dataclass
class ConvSnapshot:
    """The convolution layers' states at positions ``start``..``end`` of a sequence, kept beside its KV rows by the
    prompt cache: each layer's state after the first ``start`` positions and its conv inputs at ``start``..``end - 1``
    (the state at any position between is the last ``k`` columns of the two joined: ``ConvStates.restore``)."""

    start: int
    states: list[np.ndarray]  # per layer [channels, k]
    inputs: list[np.ndarray]  # per layer [channels, end - start]

    @property
    def end(self) -> int:
        return self.start + (self.inputs[0].shape[1] if self.inputs else 0)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.states) + sum(a.nbytes for a in self.inputs)

    def cut(self, n: int) -> "ConvSnapshot | None":
        """The snapshot up to position ``n`` (None where ``n`` is outside it)."""
        if not self.start <= n <= self.end:
            return None
        return ConvSnapshot(self.start, self.states, [x[:, : n - self.start].copy() for x in self.inputs])


class ConvStates:
    """The convolution layers' states (LFM2's ``conv`` layers), kept so that a rejected draft rolls them back.

    A conv layer's state is its kernel's last ``k`` inputs. onnxruntime's ``CausalConvWithState`` reads it (past) and
    writes the state after the call (present); the graph also gives the convolution's input at each of the call's
    positions (``conv_input``, export/conv.py). The state after any position of a call is then the last ``k`` columns
    of the state before the call followed by the call's inputs up to that position: exactly what the op would have
    written had the call ended there (scripts/probe_conv_state.py). So each call's state before it and its inputs are
    kept (of the last ``CONV_KEEP`` positions), and ``seek`` sets the state of any position they reach before the
    next call: a rejected draft, a padded call's pad, a chat turn that writes the last tokens again. A position
    further back is not reachable: the model then reads its context again (``CausalLM.prefill``)."""

    def __init__(self, spec):
        import onnxruntime as ort

        from .manifest import CONV_CALL, CONV_KEEP

        io = spec.io
        self.keep, self.max_call = CONV_KEEP, CONV_CALL
        self.layers: list[_ConvLayer] = []
        for layer, c, k in spec.conv_layers:
            cl = _ConvLayer(io.past_conv % layer, io.present_conv % layer, io.conv_input % layer,
                            np.zeros((1, c, k), np.float32), np.zeros((1, c, k), np.float32),
                            np.zeros(c * self.max_call, np.float32), c)
            cl.past_value = ort.OrtValue.ortvalue_from_numpy(cl.past)
            cl.present_value = ort.OrtValue.ortvalue_from_numpy(cl.present)
            self.layers.append(cl)
        self._inputs: dict[int, list] = {}  # a call's width -> each layer's OrtValue over its inputs' buffer
        self.pos = 0  # the position the past buffers' states are at (how many tokens went through the layers)
        self._segments: list[tuple[int, list[np.ndarray], list[np.ndarray]]] = []  # (start, states before, inputs)

    def bind(self, binding) -> None:
        for cl in self.layers:
            binding.bind_ortvalue_input(cl.past_name, cl.past_value)
            binding.bind_ortvalue_output(cl.present_name, cl.present_value)

    def bind_call(self, binding, n: int) -> None:
        """Bind each layer's conv input output for a call of ``n`` tokens (a view of its buffer)."""
        import onnxruntime as ort

        if n > self.max_call:  # (a profile's longer prefill chunk: the buffers grow, the views made again)
            self.max_call = n
            for cl in self.layers:
                cl.inputs = np.zeros(cl.channels * n, np.float32)
            self._inputs.clear()
        vals = self._inputs.get(n)
        if vals is None:
            vals = self._inputs[n] = [ort.OrtValue.ortvalue_from_numpy(cl.call_inputs(n)[None]) for cl in self.layers]
        for cl, v in zip(self.layers, vals):
            binding.bind_ortvalue_output(cl.input_name, v)

    def _segment(self, at: int) -> int | None:
        """The index of the latest kept call whose positions (its start to its end, inclusive) hold ``at``."""
        for j in range(len(self._segments) - 1, -1, -1):
            start, _, inputs = self._segments[j]
            if start <= at <= start + inputs[0].shape[1]:
                return j
        return None

    def reachable(self, at: int) -> bool:
        """Whether ``seek(at)`` can set the states: position 0 (zeros), the current one, or one a kept call reaches."""
        return at in (0, self.pos) or self._segment(at) is not None

    def seek(self, at: int) -> None:
        """Make the past buffers hold the state after the first ``at`` positions (before a call starting there)."""
        if at == self.pos:
            return
        if at == 0:  # (the states before any token: zeros; Decoder.score reads a text from its start)
            self.reset()
            return
        j = self._segment(at)
        if j is None:  # (every caller asks ``reachable`` first or rewinds within the last calls: a bug if it comes here)
            from .errors import BundleError

            raise BundleError(f"the convolution layers' states reach back to position {self.reachable_from()}, not "
                              f"{at}: the model cannot continue from there (reset it)")
        start, before, inputs = self._segments[j]
        used = at - start
        self.pos = -1  # (until every layer is written: an interrupt between layers leaves no position claimed)
        for cl, b, x in zip(self.layers, before, inputs):
            k = cl.past.shape[2]
            cl.past[0] = np.concatenate([b, x[:, :used]], axis=1)[:, -k:] if used else b
        del self._segments[j + 1:]
        if used < inputs[0].shape[1]:
            self._segments[j] = (start, before, [x[:, :used] for x in inputs])
        self.pos = at

    def reachable_from(self) -> int:
        return self._segments[0][0] if self._segments else self.pos

    def snapshot(self, n: int) -> ConvSnapshot | None:
        """The states of the kept calls' positions up to ``n`` (at most the last ``keep`` of them), for the prompt
        cache to restore later (``restore``); None where ``n`` is not reachable (or 0: nothing to keep)."""
        if n <= 0 or not self.layers:
            return None
        if not self._segments:
            if n != self.pos:
                return None
            return ConvSnapshot(n, [cl.past[0].copy() for cl in self.layers],
                                [np.zeros((cl.channels, 0), np.float32) for cl in self.layers])
        s0, before = self._segments[0][0], self._segments[0][1]
        xs = [np.concatenate([seg[2][i] for seg in self._segments], axis=1) for i in range(len(self.layers))]
        if not s0 <= n <= s0 + xs[0].shape[1]:  # (the calls are contiguous: each starts where the last ended)
            return None
        start = max(s0, n - self.keep)
        states = [np.concatenate([b, x[:, : start - s0]], axis=1)[:, -cl.past.shape[2]:] if start > s0 else b.copy()
                  for cl, b, x in zip(self.layers, before, xs)]
        return ConvSnapshot(start, states, [x[:, start - s0: n - s0].copy() for x in xs])

    def restore(self, snap: ConvSnapshot, at: int) -> None:
        """Set the states after the first ``at`` positions from ``snap`` (``snap.start <= at <= snap.end``): the past
        buffers, and the positions back to ``snap.start`` reachable again."""
        used = at - snap.start
        if not 0 <= used <= snap.end - snap.start:
            raise ValueError(f"a snapshot of positions {snap.start}..{snap.end} cannot restore position {at}")
        self.pos, self._segments = -1, []  # (until every layer is written: see seek)
        for cl, b, x in zip(self.layers, snap.states, snap.inputs):
            k = cl.past.shape[2]
            cl.past[0] = np.concatenate([b, x[:, :used]], axis=1)[:, -k:] if used else b
        self._segments = [(snap.start, [b.copy() for b in snap.states], [x[:, :used].copy() for x in snap.inputs])
                          ] if used else []
        self.pos = at

    def after_call(self, at: int, n: int) -> None:
        """A call of ``n`` tokens from position ``at`` ran: keep its states before and inputs, the past buffers take
        the states after it."""
        self._segments.append((at, [cl.past[0].copy() for cl in self.layers],
                               [cl.call_inputs(n).copy() for cl in self.layers]))
        for cl in self.layers:
            cl.past[...] = cl.present
        self.pos = at + n
        while len(self._segments) > 1 and self.pos - self._segments[1][0] >= self.keep:
            del self._segments[0]  # (the later ones reach back far enough)

    def reset(self) -> None:
        for cl in self.layers:
            cl.past[...] = 0
        self.pos = 0
        self._segments.clear()
