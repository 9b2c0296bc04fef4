"""Gaps a mutation test of ``edgespec/kv.py`` found (docs/bench/mutation_harness/kv_mut.py, KV1-KV42): the token
records' edges (reads past the length, a set or truncate out of range, a rewind of 0 or of a negative count, the
common prefix's first mismatch) and a ``KVCache``'s buffers built from a hand-made spec (no model: shapes, shared
layers, binding, moving a slot, the reset of its conv states). Each expected value is worked out by hand."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgespec.kv import KVCache, TokenBuffer, TokenCache, common_prefix
from edgespec.manifest import ModelIO, ModelSpec


def _spec(**kw) -> ModelSpec:
    io = ModelIO(input_ids="input_ids", attention_mask="attention_mask", past_key="past_key_values.%d.key",
                 past_value="past_key_values.%d.value", present_key="present.%d.key", present_value="present.%d.value",
                 logits="logits", past_conv=kw.pop("past_conv", None), present_conv=kw.pop("present_conv", None),
                 conv_input=kw.pop("conv_input", None))
    base = dict(role="target", path=Path("model.onnx"), architecture="llama", precision="fp32", num_layers=3,
                num_kv_heads=2, head_dim=4, hidden_size=8, vocab_size=10, max_context=16, kv_dtype="float32", io=io,
                tokenizer_sha256="", files={}, bytes_on_disk=0, gpu_weight_bytes=0)
    base.update(kw)
    return ModelSpec(**base)


# -- TokenBuffer / TokenCache / common_prefix ---------------------------------------------------------------------

def test_a_token_buffers_reads_stop_at_its_length_after_a_truncate():
    """KV13, KV14, KV15, KV16, KV24: a buffer of [5, 6, 7, 8] truncated to 2 still holds 7 and 8 in its array (a rollback
    copies nothing); no read may see them: an index, a negative index, a slice, the view, the common prefix."""
    b = TokenBuffer([5, 6, 7, 8], capacity=8)
    b.truncate(2)
    assert len(b) == 2 and b.tolist() == [5, 6]
    assert b[-1] == 6 and b[-2] == 5 and b[0] == 5
    for i in (2, 3, -3):
        with pytest.raises(IndexError):
            b[i]
    assert b[:] == [5, 6] and b[1:10] == [6] and b[-1:] == [6] and b[2:] == []
    v = b.view()
    assert v.tolist() == [5, 6]
    with pytest.raises(ValueError):  # read-only: a caller cannot rewrite what the cache holds
        v[0] = 9
    assert b.common_prefix([5, 6, 7, 8]) == 2 and b.common_prefix([5, 6]) == 2 and b.common_prefix([5, 9]) == 1


def test_set_writes_only_positions_the_buffer_holds():
    """KV20, KV21: set(len) and set(-1) are refused (the first would write a stale slot past the length, the second
    the array's last slot), and set(1) writes position 1 only."""
    b = TokenBuffer([1, 2, 3], capacity=8)
    for i in (3, -1, 8):
        with pytest.raises(IndexError):
            b.set(i, 9)
    b.set(1, 9)
    assert b.tolist() == [1, 9, 3]
    b.extend([4])
    assert b.tolist() == [1, 9, 3, 4]


def test_a_rewind_forgets_exactly_its_count_and_a_reset_everything():
    """KV22, KV23, KV26, KV27, KV28: rewind(0) keeps all 4 ids (a truncate to the same length), rewind(1) the first 3;
    a negative rewind or truncate is refused by name; a reset leaves nothing (then the buffer takes new ids from 0)."""
    c = TokenCache(8)
    c.ids.extend([1, 2, 3, 4])
    c.rewind(0)
    assert c.length == 4 and c.ids.tolist() == [1, 2, 3, 4]
    c.rewind(1)
    assert c.length == 3 and c.ids.tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="cannot rewind -1 of 3 positions"):
        c.rewind(-1)
    with pytest.raises(ValueError, match="cannot truncate 3 ids to -1"):
        c.ids.truncate(-1)
    assert c.ids.tolist() == [1, 2, 3]
    c.reset()
    assert c.length == 0 and c.ids.tolist() == [] and c.ids.common_prefix([1, 2]) == 0
    c.ids.extend([7])
    assert c.ids.tolist() == [7]


def test_common_prefix_is_the_first_mismatch_or_the_shorter_length():
    """KV10, KV11: [1, 2, 3, 4] against [1, 9, 3, 9] agrees on 1 id (the first mismatch, not the last); against
    itself on 4; against [1, 2] on 2; against nothing on 0."""
    a = np.array([1, 2, 3, 4], np.int64)
    assert common_prefix(a, [1, 9, 3, 9]) == 1
    assert common_prefix(a, [9, 2, 3, 4]) == 0
    assert common_prefix(a, [1, 2, 3, 4]) == 4
    assert common_prefix(a, [1, 2]) == 2 and common_prefix(a[:2], [1, 2, 3]) == 2
    assert common_prefix(a, []) == 0


# -- KVCache from a hand-made spec ----------------------------------------------------------------------------------

def test_a_kv_cache_allocates_its_spare_rows_and_counts_its_bytes():
    """KV31, KV40: 2 layers of 2 kv heads x 4 lanes, float32, max_len 16 and 1 spare position: four host arrays
    [1, 2, 17, 4]; the bytes reported are the 16 positions' (2 layers x 2 x 2 x 4 x 4 bytes = 128 a position: 2048).
    int8 rows of 32 lanes carry 32 + 4 int8 (the scale's float32 bytes)."""
    cache = KVCache(_spec(num_layers=2), 16, "cpu", spare=1)
    assert [a.shape for a in cache.host] == [(1, 2, 17, 4)] * 4
    assert all(a.dtype == np.float32 for a in cache.host)
    assert cache.nbytes == 2048 and cache.max_len == 16 and cache.length == 0
    q8 = KVCache(_spec(num_layers=1, head_dim=32, kv_dtype="int8"), 8, "cpu")
    assert [(a.shape, a.dtype) for a in q8.host] == [((1, 2, 8, 36), np.int8)] * 2 and q8.nbytes == 2 * 2 * 36 * 8


def test_a_kv_cache_refuses_a_dtype_it_cannot_hold_as_a_bundle_error():
    """KV29, KV30: a bfloat16 cache (a manifest may name it) is a BundleError naming the dtype, not float64 buffers."""
    from edgespec.errors import BundleError

    with pytest.raises(BundleError, match="KV dtype bfloat16 is not supported"):
        KVCache(_spec(kv_dtype="bfloat16"), 8, "cpu")


def test_a_shared_layer_binds_its_sources_key_and_value_buffers():
    """KV32, KV33, KV39: layers 0 and 1 own their buffers and layer 2 shares layer 0's (kv_sources (0, 1, 0)): 4 host
    arrays, 6 bindings; layer 2's key is layer 0's key buffer and its value layer 0's value buffer; each buffer bound
    as its layer's past input and present output (the in-place update)."""
    cache = KVCache(_spec(kv_sources=(0, 1, 0)), 8, "cpu")
    assert len(cache.host) == 4 and len(cache.buffers) == 6
    names = [(p, q) for p, q, _ in cache.buffers]
    assert names == [(f"past_key_values.{i}.{kv}", f"present.{i}.{kv}") for i in range(3) for kv in ("key", "value")]
    bufs = [b for _, _, b in cache.buffers]
    assert bufs[4] is bufs[0] and bufs[5] is bufs[1] and bufs[0] is not bufs[1] and bufs[2] is not bufs[0]
    assert cache.nbytes == 2 * 2 * (2 * 4) * 4 * 8  # (two own layers: the shared one takes no bytes)

    class Binding:
        def __init__(self):
            self.inputs, self.outputs = {}, {}

        def bind_ortvalue_input(self, name, v):
            self.inputs[name] = v

        def bind_ortvalue_output(self, name, v):
            self.outputs[name] = v

    b = Binding()
    cache.bind(b)
    assert len(b.inputs) == 6 and len(b.outputs) == 6
    for past, present, buf in cache.buffers:
        assert b.inputs[past] is buf and b.outputs[present] is buf
    assert b.inputs["past_key_values.2.value"] is bufs[1]


def test_move_copies_one_slot_of_every_buffer_and_its_id():
    """KV36, KV37, KV38: slot 3 moved to slot 1 in each of the 4 buffers (and its id, 13); every other slot as it was;
    a cache without host arrays (a GPU's) refuses, rather than recording the id over keys it did not move."""
    cache = KVCache(_spec(num_layers=2), 8, "cpu")
    for j, a in enumerate(cache.host):
        a[...] = np.arange(a.size, dtype=np.float32).reshape(a.shape) + 1000 * j
    before = [a.copy() for a in cache.host]
    cache.ids.extend([10, 11, 12, 13])
    cache.move(3, 1)
    assert cache.ids.tolist() == [10, 13, 12, 13]
    for a, old in zip(cache.host, before):
        want = old.copy()
        want[:, :, 1] = old[:, :, 3]
        assert np.array_equal(a, want)
    cache.host = []
    with pytest.raises(NotImplementedError):
        cache.move(2, 0)
    assert cache.ids.tolist() == [10, 13, 12, 13]


def test_an_attention_cache_reaches_every_position_and_a_reset_zeroes_its_conv_states():
    """KV34, KV35: without conv layers every rewind target is reachable; with one (layer 1: 4 channels, 3 columns), a
    reset puts its states back to zeros at position 0 as well as forgetting the ids (KV35 is equivalent in decoding,
    where the next call's seek(0) zeroes them, but left ``reachable`` true of the old positions)."""
    cache = KVCache(_spec(num_layers=2), 8, "cpu")
    assert cache.conv is None and all(cache.reachable(n) for n in (0, 1, 5, 8))
    conv = KVCache(_spec(num_layers=2, conv_layers=((1, 4, 3),), past_conv="past_conv.%d", present_conv="present_conv.%d",
                         conv_input="conv_input.%d"), 8, "cpu")
    assert len(conv.host) == 2 and conv.conv is not None  # (layer 0's key and value only)
    conv.ids.extend([1, 2, 3])
    cl = conv.conv.layers[0]
    cl.inputs[: 4 * 3] = 1.0
    conv.conv.after_call(0, 3)  # (present is zeros: the states after the call)
    cl.past[...] = 5.0
    assert conv.conv.pos == 3 and conv.reachable(3) and conv.reachable(1)
    conv.reset()
    assert conv.length == 0 and conv.conv.pos == 0 and not cl.past.any() and not conv.reachable(2)
