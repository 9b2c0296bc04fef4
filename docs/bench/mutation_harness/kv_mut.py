"""Mutants of edgespec/kv.py (a third pass after sessions 67 and 72; session 81 took ConvStates with 32): the int8 rows'
quantization and its inverse, common_prefix, TokenBuffer (indexing, slices, the read-only view, growth, set, truncate,
its common prefix), TokenCache (rewind, reset, reachable), KVCache (the dtype check, its buffers' shapes and shared
layers, reachable, reset, move, bind). Written by a helper session.
Run from the copy:  python run.py kv_mut.py tests/test_kv_q8.py [more]
First run: tests/test_kv_q8.py (~27 s a survivor): 16 caught, 26 not. Rerun wider (test_conv.py; test_prompt_cache.py,
test_drafters_mutants.py, test_manifest.py and test_native.py with --k "test_prompt_cache or test_drafters_mutants or
unhashed or attention_pads_it or planted_slot", ~50 s a survivor; test_archs.py --k gemma4_text_decoders for KV32/KV33):
KV10, KV24, KV34 (test_prompt_cache), KV29, KV30 (test_manifest), KV33 (test_archs), KV36, KV38 (test_native's planted
slot), KV41, KV42 (test_conv) caught there. Gap tests: tests/test_kv_mutants.py (KV14, KV16, KV20, KV21, KV23, KV26, KV31, KV32, KV37, KV40; it
also catches KV10, KV24, KV29, KV30, KV33-KV36, KV38, KV42). Equivalent: KV3, KV12, KV35 (the next call's seek(0) zeroes
the states). Speed only: KV18, KV19, KV25."""
F = "edgespec/kv.py"
MUTANTS = [
    # -- q8_quantize / q8_dequantize
    ("KV1", F, "g, 0)).max(-1) / np.float32(127)", "g, 0)).max(-1) / np.float32(128)"),  # scale max/128: rows not the kernel's
    ("KV2", F, "np.rint(g / s[..., None])", "np.floor(g / s[..., None] + 0.5)"),  # ties rounded up, not to even
    ("KV3", F, "q = np.clip(q, -127, 127)", "q = np.clip(q, -128, 127)"),  # expected equivalent: |x|/s <= 127 always
    ("KV4", F, "finite = np.isfinite(g).all(-1)", "finite = np.isfinite(g).any(-1)"),  # a group with one inf: finite scale
    ("KV5", F, "np.float32(127), np.float32(np.nan))", "np.float32(127), np.float32(0))"),  # a non-finite group's scale 0, not NaN
    ("KV6", F, "np.abs(np.where(np.isfinite(g), g, 0)).max(-1)", "np.where(np.isfinite(g), g, 0).max(-1)"),  # scale from the max, not max |x|
    ("KV7", F, "return np.concatenate([q, s.astype(\"<f4\")", "return np.concatenate([q, s.astype(\">f4\")"),  # scales big-endian
    ("KV8", F, "s = np.ascontiguousarray(rows[..., head_dim:]).view(\"<f4\")", "s = np.ascontiguousarray(rows[..., head_dim:]).view(\">f4\")"),  # dequantize reads scales big-endian
    ("KV9", F, "return (q * s[..., None]).reshape(*lead, head_dim)", "return (q * s[..., None] / 127).reshape(*lead, head_dim)"),  # dequantize off by the 127
    # -- common_prefix
    ("KV10", F, "    return int(diff[0]) if diff.size else n\n", "    return int(diff[-1]) if diff.size else n\n"),  # the last mismatch, not the first
    ("KV11", F, "    return int(diff[0]) if diff.size else n\n", "    return int(diff[0]) if diff.size else n - 1\n"),  # a full match one short
    ("KV12", F, "    n = min(len(a), len(ids))\n    if n == 0:\n        return 0\n", "    n = min(len(a), len(ids))\n"),  # expected equivalent: flatnonzero of nothing
    # -- TokenBuffer
    ("KV13", F, "        if i < 0:\n            i += self._n\n", "        if i < 0:\n            i += self._a.shape[0]\n"),  # buf[-1] from the capacity, not the length
    ("KV14", F, "        if not 0 <= i < self._n:\n            raise IndexError(i)\n        return int(self._a[i])", "        if not 0 <= i <= self._n:\n            raise IndexError(i)\n        return int(self._a[i])"),  # buf[len] reads a stale id
    ("KV15", F, "            return self._a[: self._n][i].tolist()", "            return self._a[i].tolist()"),  # a slice past the length: stale ids
    ("KV16", F, "        v.flags.writeable = False\n", ""),  # the view writable: a caller's write changes the record
    ("KV17", F, "            grown[: self._n] = self._a[: self._n]", "            grown[: self._n - 1] = self._a[: self._n - 1]"),  # growth loses the last id
    ("KV18", F, "max(self._n + n, 2 * self._a.shape[0])", "max(self._n + n, self._a.shape[0] + 1)"),  # expected speed only: grows by what it needs
    ("KV19", F, "        if self._n + n > self._a.shape[0]:", "        if self._n + n >= self._a.shape[0]:"),  # expected speed only: grows one early
    ("KV20", F, "    def set(self, i: int, v: int) -> None:\n        if not 0 <= i < self._n:", "    def set(self, i: int, v: int) -> None:\n        if not 0 <= i <= self._n:"),  # set at the length accepted (a stale slot written)
    ("KV21", F, "    def set(self, i: int, v: int) -> None:\n        if not 0 <= i < self._n:", "    def set(self, i: int, v: int) -> None:\n        if not i < self._n:"),  # set(-1) writes the capacity's last slot
    ("KV22", F, "        if not 0 <= n <= self._n:", "        if not 0 <= n < self._n:"),  # truncate to the same length refused (rewind 0)
    ("KV23", F, "        if not 0 <= n <= self._n:", "        if not n <= self._n:"),  # a negative truncate accepted: a negative length
    ("KV24", F, "        return common_prefix(self._a[: self._n], ids)", "        return common_prefix(self._a, ids)"),  # the prefix reaches stale ids past the length
    ("KV25", F, "        self._a = np.zeros(max(capacity, len(ids), 1), dtype=np.int64)", "        self._a = np.zeros(max(capacity, 1), dtype=np.int64)"),  # expected speed only: extend grows it
    # -- TokenCache
    ("KV26", F, "        if n < 0 or n > len(self.ids):", "        if n > len(self.ids):"),  # a negative rewind: refused by truncate, with its message
    ("KV27", F, "        self.ids.truncate(len(self.ids) - n)", "        self.ids.truncate(max(0, len(self.ids) - n - 1) if n else len(self.ids))"),  # a rollback forgets one more
    ("KV28", F, "    def reset(self) -> None:\n        self.ids.truncate(0)", "    def reset(self) -> None:\n        self.ids.truncate(min(1, len(self.ids)))"),  # a reset keeps the first id
    # -- KVCache
    ("KV29", F, "        if dtype is None:\n            from .errors import BundleError", "        if dtype is None:\n            from builtins import ValueError as BundleError"),  # an unsupported dtype: not a BundleError
    ("KV30", F, "        if dtype is None:\n            from .errors import BundleError", "        if False:\n            from .errors import BundleError"),  # bfloat16 buffers made as float64
    ("KV31", F, "shape = (1, heads, self.max_len + spare, width)", "shape = (1, heads, self.max_len, width)"),  # the pad positions not allocated
    ("KV32", F, "                if source != layer:  # (a shared", "                if False:  # (a shared"),  # a shared layer gets buffers of its own (its graph writes the source's rows there again: memory, not output)
    ("KV33", F, "self.buffers.append((past % layer, present % layer, own[source, kv]))", "self.buffers.append((past % layer, present % layer, own[source, 0]))"),  # a shared layer's values read from its source's keys
    ("KV34", F, "        return self.conv is None or self.conv.reachable(n)", "        return self.conv is not None and self.conv.reachable(n)"),  # no attention-only prefix reachable: read again (speed only?)
    ("KV35", F, "        super().reset()\n        if self.conv is not None:\n            self.conv.reset()", "        super().reset()"),  # a reset keeps the conv states
    ("KV36", F, "            arr[:, :, dst] = arr[:, :, src]", "            arr[:, :, src] = arr[:, :, dst]"),  # the move backwards
    ("KV37", F, "        if not self.host:\n            raise NotImplementedError", "        if False:\n            raise NotImplementedError"),  # a GPU cache's move records the id and moves nothing
    ("KV38", F, "        for arr in self.host:\n            arr[:, :, dst] = arr[:, :, src]", "        for arr in self.host[:1]:\n            arr[:, :, dst] = arr[:, :, src]"),  # only the first buffer moved
    ("KV39", F, "            binding.bind_ortvalue_output(present, buf)\n", ""),  # present not bound: the cache never written
    ("KV40", F, "        self.nbytes = spec.kv_bytes(self.max_len)", "        self.nbytes = spec.kv_bytes(self.max_len + 1)"),  # the cache's bytes misreported
    # -- ConvStates (a few beyond session 81's)
    ("KV41", F, "        if n > self.max_call:  # (a profile's", "        if n >= self.max_call + 1 and False:  # (a profile's"),  # a call wider than the buffers: never grown
    ("KV42", F, "        self.pos = at + n\n        while", "        self.pos = at + n - 1\n        while"),  # a call's end one short
]
