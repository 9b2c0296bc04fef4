"""Token ids and the KV cache they index: the one record of what a model has computed.

``TokenCache`` holds the ids whose keys/values sit in a model's cache in an int64 array with a
length: appending is amortized O(1), rolling back is O(1) (a shorter length; the stale entries are
overwritten by later writes), and the common prefix with a new prompt is one vectorized compare.
``KVCache`` adds onnxruntime's buffers: one static ``[1, kv_heads, max_len, head_dim]`` buffer per
layer and key/value, bound as both ``past_key_values.N.*`` and ``present.N.*`` so that the graph
(GroupQueryAttention) updates it in place; the attention mask's length says how much is valid.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

_NP_DTYPES = {"float32": np.float32, "float16": np.float16}


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

            raise BundleError(f"{spec.role}: KV dtype {spec.kv_dtype} is not supported by this runtime (float32 or "
                              "float16: export the bundle again)")
        io = spec.io
        self.buffers = []  # (past input name, present output name, OrtValue)
        self.host: list[np.ndarray] = []  # on the CPU: the buffers' memory as numpy arrays (the same bytes)
        own: dict[tuple[int, int], object] = {}  # (layer, key 0 or value 1) -> its buffer
        for layer in range(spec.num_layers):
            heads, width = spec.kv_shape(layer)
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
