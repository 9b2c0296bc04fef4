"""Gaps a second mutation test of ``edgespec/prompt_cache.py`` found (docs/bench/mutation_harness/prompt_cache_mut.py,
PC1-PC84): the edges of save (a sequence kept already, exactly ``min_tokens``, an exact fit, the entry about to be
restored, an unrelated shorter entry, a GPU cache), restore's ``have`` and its counters, before_prefill's boundaries
and its ``keep``, the entries of a model with convolution layers (a hand-made ``ConvStates``), the engine key's CPU,
compat and session options parts, and the file: the LRU order and the budget kept across a merge, a write and a
read, a damaged file replaced at a write, a failed write's temporary, another engine's key with one more field, the
stale temporaries (the members of a file edgespec did not write: test_prompt_cache.py's damaged-file cases).
No model: fake caches, each expected value worked out by hand (a row of the fake cache is 72 bytes with its id)."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import zipfile
from types import SimpleNamespace

import numpy as np
import pytest

from edgespec.errors import StoreError
from edgespec.kv import ConvSnapshot
from edgespec.prompt_cache import PromptCache, engine_key, read_file, remove_stale_temporaries, write_file
from test_prompt_cache import FakeCache  # (shapes=, conv=: its buffers of other shapes, a model's conv states)

KEY = {"buffers": 4, "kv_heads": 2, "head_dim": 4, "dtype": "float16"}
PER = 4 * 2 * 4 * 2 + 8  # a position's bytes in an entry: 4 buffers of [2 heads, 4] float16, and its id


class FakeConv:
    """What the prompt cache reads of ``ConvStates``: one layer of 3 channels and a state of 2; ``snapshot(n)``
    covers positions ``start``..``n`` (None before ``start``), ``restore`` refuses a position outside the snapshot
    as the real one does."""

    def __init__(self, start: int):
        self.start = start
        self.layers = [SimpleNamespace(channels=3, past=np.zeros((1, 3, 2), np.float32))]
        self.restored = None

    def snapshot(self, n):
        if n < self.start:
            return None
        return ConvSnapshot(self.start, [np.full((3, 2), self.start, np.float32)],
                            [np.tile(np.arange(self.start, n, dtype=np.float32), (3, 1))])

    def restore(self, snap, at):
        if not snap.start <= at <= snap.end:
            raise ValueError(f"a snapshot of positions {snap.start}..{snap.end} cannot restore position {at}")
        self.restored = (snap.start, at)


SNAP = 3 * 2 * 4  # a snapshot's states' bytes (its inputs: 12 bytes a position past its start)


def _seq(s, n):
    return [s * 1000 + i for i in range(n)]


def _saved(pc, *seqs, **kw):
    for q in seqs:
        pc.save(FakeCache(**kw).fill(q))
    return pc


# -- save ---------------------------------------------------------------------------------------------------------

def test_a_sequence_kept_already_is_not_kept_again_but_made_recent():
    """PC5, PC24: A kept, B kept, A offered again: not stored twice (its entry holds exactly these ids), but made the
    most recent, so the next eviction takes B."""
    pc = PromptCache(budget=PER * 60, min_tokens=4)
    a, b = _seq(1, 20), _seq(2, 20)
    _saved(pc, a, b)
    assert not pc.save(FakeCache().fill(a))
    assert len(pc) == 2 and pc.saves == 2
    assert pc.save(FakeCache().fill(_seq(3, 30)))  # 20 + 20 + 30 rows > 60: one goes, the least recently used
    assert pc.match(a)[1] == 20 and pc.match(b)[1] == 0 and pc.evictions == 1


def test_min_tokens_edges_and_a_cache_without_host_buffers():
    """PC8, PC15, PC21: exactly ``min_tokens`` positions are kept, one fewer not; ``min_tokens`` 0 is taken as 1 (an
    empty cache is never an entry); a GPU cache (no host buffers) is never kept."""
    pc = PromptCache(budget=1 << 20, min_tokens=16)
    assert not pc.save(FakeCache().fill(_seq(1, 15)))
    assert pc.save(FakeCache().fill(_seq(2, 16)))
    zero = PromptCache(budget=1 << 20, min_tokens=0)
    assert zero.min_tokens == 1 and not zero.save(FakeCache().fill([])) and len(zero) == 0
    gpu = FakeCache().fill(_seq(3, 40))
    gpu.host = []
    assert not pc.save(gpu) and len(pc) == 1


def test_only_a_prefix_is_replaced_and_never_the_entry_about_to_be_restored():
    """PC25, PC27: a longer sequence replaces a kept prefix of it, not an unrelated shorter entry; and not the entry
    ``keep`` names (about to be restored) even where it extends it."""
    pc = PromptCache(budget=1 << 20, min_tokens=4)
    a, b = _seq(1, 20), _seq(2, 40)
    _saved(pc, a, b)
    assert len(pc) == 2 and pc.match(a)[1] == 20
    key, _ = pc.match(a)
    assert pc.save(FakeCache().fill(a + _seq(3, 20)), keep=key)
    assert len(pc) == 3
    c = FakeCache().fill(_seq(4, 30))
    assert pc.restore(key, 20, c) == 20 and c.ids.tolist() == a


def test_an_entry_that_exactly_fits_evicts_nothing_and_stats_count_every_entry():
    """PC9, PC28: a budget of 40 rows holds two entries of 20 exactly; stats count their tokens and bytes."""
    pc = _saved(PromptCache(budget=PER * 40, min_tokens=4), _seq(1, 20), _seq(2, 20))
    s = pc.stats()
    assert len(pc) == 2 and pc.evictions == 0
    assert (s["entries"], s["tokens"], s["bytes"]) == (2, 40, PER * 40)


def test_a_match_of_nothing_is_none():
    """PC13: entries that share nothing with a prompt give (None, 0), not one of their keys."""
    pc = _saved(PromptCache(budget=1 << 20, min_tokens=4), _seq(1, 20), _seq(2, 20))
    assert pc.match(_seq(3, 10)) == (None, 0)


# -- restore --------------------------------------------------------------------------------------------------------

def test_restore_checks_have_against_the_cache_and_counts_only_what_it_added():
    """PC38, PC40, PC35: ``have`` counts only the positions the cache shares with the entry (a cache holding another
    sequence gets all the rows, whatever ``have`` says); restored_tokens counts what was added; a cache shorter than
    the entry gets its first ``max_len`` rows."""
    a = _seq(1, 40)
    pc = _saved(PromptCache(budget=1 << 20, min_tokens=4), a)
    key, _ = pc.match(a)
    want = FakeCache().fill(a).rows(30)
    c = FakeCache().fill(_seq(2, 40))
    assert pc.restore(key, 30, c, have=30) == 30
    assert c.ids.tolist() == a[:30] and pc.restored_tokens == 30
    for got, w in zip(c.rows(30), want):
        np.testing.assert_array_equal(got, w)
    c = FakeCache().fill(a[:10] + _seq(3, 5))
    assert pc.restore(key, 30, c, have=10) == 30
    assert c.ids.tolist() == a[:30] and pc.restored_tokens == 30 + 20
    short = FakeCache(L=32).fill(_seq(4, 8))
    assert pc.restore(key, 40, short) == 32 and short.ids.tolist() == a[:32]


# -- before_prefill -------------------------------------------------------------------------------------------------

def test_before_prefill_restores_and_keeps_at_exactly_min_tokens():
    """PC42, PC43: a kept prefix longer than the live one by exactly ``min_tokens`` is restored; a live cache whose
    prefill would overwrite exactly ``min_tokens`` positions is kept."""
    a = _seq(1, 40)
    pc = _saved(PromptCache(budget=1 << 20, min_tokens=16), a)
    c = FakeCache().fill(a[:24] + [7, 7])
    assert pc.before_prefill(c, a + [5], 24) == 40 and c.ids.tolist() == a and pc.restores == 1
    b = _seq(2, 16)
    c = FakeCache().fill(b)
    assert pc.before_prefill(c, _seq(3, 20), 0) == 0
    assert pc.match(b)[1] == 16 and pc.saves == 2


def test_keeping_the_live_cache_evicts_others_before_the_entry_about_to_be_restored():
    """PC29: A (20 rows, the least recently used) is about to be restored; the live 30 rows need room in 60, so one
    entry goes: O, the next least recent, not A (restored after, whole)."""
    a, o = _seq(1, 20), _seq(2, 20)
    pc = _saved(PromptCache(budget=PER * 60, min_tokens=4), a, o)
    c = FakeCache().fill(_seq(3, 30))
    assert pc.before_prefill(c, a + [5], 0) == 20 and c.ids.tolist() == a
    assert pc.match(o)[1] == 0 and pc.match(_seq(3, 30))[1] == 30 and pc.evictions == 1


def test_a_match_too_short_to_restore_does_not_hold_its_entry_against_the_live_cache():
    """PC44: the live chat's 40 rows are kept whole (the old entry they do not fit beside evicted), not cut to
    the 20 left beside an entry that shares too little with the prompt to be restored."""
    a, b = _seq(1, 40), _seq(2, 40)
    pc = _saved(PromptCache(budget=PER * 60, min_tokens=16), a)
    c = FakeCache().fill(b)
    assert pc.before_prefill(c, a[:10] + _seq(3, 30), 0) == 0 and pc.restores == 0
    assert pc.match(b)[1] == 40 and pc.match(a)[1] == 0 and pc.evictions == 1


# -- a model with convolution layers --------------------------------------------------------------------------------

def test_a_conv_entry_restores_only_from_its_states_start():
    """PC3, PC4, PC14, PC36: an entry whose states start at 30 restores a match of 30 (exactly its start) and more,
    nothing shorter: a match of 20 is (None, 0) and a restore of 20 is refused, the cache left as it was."""
    a = _seq(1, 40)
    pc = _saved(PromptCache(budget=1 << 20, min_tokens=4), a, conv=FakeConv(30))
    assert pc.match(a[:30] + [5])[1] == 30
    assert pc.match(a[:20] + [5]) == (None, 0)
    key = next(iter(pc._entries))
    c = FakeCache(conv=FakeConv(0)).fill(_seq(2, 25))
    assert pc.restore(key, 20, c) == 0 and c.ids.tolist() == _seq(2, 25) and c.conv.restored is None
    assert pc.restore(key, 35, c) == 35 and c.conv.restored == (30, 35)


def test_a_conv_entry_that_cannot_restore_a_sequence_does_not_hold_or_replace_it():
    """PC6, PC26: a prefix of a kept entry, before that entry's states start, is kept as an entry of its own; and a
    longer sequence whose states start past a kept prefix's end does not replace it (it cannot restore it)."""
    a = _seq(1, 40)
    pc = _saved(PromptCache(budget=1 << 20, min_tokens=4), a, conv=FakeConv(30))
    assert pc.save(FakeCache(conv=FakeConv(10)).fill(a[:20]))
    assert len(pc) == 2 and pc.match(a[:20] + [5])[1] == 20
    pc = _saved(PromptCache(budget=1 << 20, min_tokens=4), a[:20], conv=FakeConv(10))
    assert pc.save(FakeCache(conv=FakeConv(30)).fill(a))
    assert len(pc) == 2 and pc.match(a[:20] + [5])[1] == 20


def test_a_conv_entry_is_cut_within_the_budget_with_its_states():
    """PC2, PC18, PC22: the snapshot's bytes are set aside before the rows are cut (39 rows and 9 positions of inputs,
    not 40 past the budget) and counted in the entry's bytes; a cut before the states' start keeps nothing."""
    pc = PromptCache(budget=PER * 40 + 100, min_tokens=4)
    assert pc.save(FakeCache(conv=FakeConv(30)).fill(_seq(1, 40)))
    assert pc.match(_seq(1, 40))[1] == 39 and pc.nbytes == PER * 39 + SNAP + 12 * 9 <= pc.budget
    pc = PromptCache(budget=PER * 25, min_tokens=4)
    assert not pc.save(FakeCache(conv=FakeConv(30)).fill(_seq(1, 40))) and len(pc) == 0


def test_a_conv_prompt_cache_file_is_read_within_the_budget_with_its_states(tmp_path):
    """PC76, PC79, PC78, PC74: B (older) and A, both of 40 positions with states from 30, read into a budget of A's
    bytes and 2603 more: A whole, B cut to 34 (35 rows and inputs take 2604 with the states), its inputs cut to match.
    Non-finite inputs, and a start past its entry, are refused."""
    key = {**KEY, "conv": [[3, 2]]}
    a, b = _seq(1, 40), _seq(2, 40)
    pc = _saved(PromptCache(budget=1 << 20, min_tokens=4), b, a, conv=FakeConv(30))
    f = tmp_path / "c.npz"
    write_file(pc, f, key)
    whole = PER * 40 + SNAP + 12 * 10
    got = PromptCache(budget=whole + 2603, min_tokens=4)
    assert read_file(got, f, key) == (2, None)
    assert got.match(a)[1] == 40 and got.match(b)[1] == 34 and got.nbytes <= got.budget
    assert all(e.conv.end == e.ids.size for e in got._entries.values())
    _replace(f, "meta.npy", _npy_meta({**_meta(f), "conv_starts": [30, 50]}))
    with pytest.raises(StoreError, match="convolution starts"):
        read_file(PromptCache(1 << 20, 4), f, key)
    next(iter(pc._entries.values())).conv.inputs[0][1, 2] = np.nan
    write_file(pc, f, key)
    with pytest.raises(StoreError, match="convolution states are not finite"):
        read_file(PromptCache(1 << 20, 4), f, key)


# -- engine_key -----------------------------------------------------------------------------------------------------

def _manifest():
    return SimpleNamespace(target=SimpleNamespace(tokenizer_sha256="t", vocab_size=10,
                                                  files={"model.onnx": {"sha256": "ab"}}))


def test_the_engine_key_names_the_cpus_instruction_sets_the_compat_and_the_options_in_any_order(monkeypatch):
    """PC46, PC48, PC49, PC50: another instruction set (AVX-512 added) is another key, a flag that is no instruction set
    is not; a bumped KV_COMPAT is another key; the same session options in another order are the same."""
    import edgespec.native as native
    import edgespec.prompt_cache as pcm

    m, c = _manifest(), FakeCache()

    def key(flags, opts=None):
        monkeypatch.setattr(native, "_cpu_flags", lambda: set(flags))
        return engine_key(m, m.target, c, opts)

    base = key({"avx2", "fma", "ht"})
    assert key({"avx2", "fma", "ht", "tsc"}) == base
    assert key({"avx2", "fma", "ht", "avx512f"})["cpu"] != base["cpu"]
    monkeypatch.setattr(pcm, "KV_COMPAT", pcm.KV_COMPAT + 1)
    assert key({"avx2", "fma", "ht"}) != base
    assert key(set(), {"a": "1", "b": "2"}) == key(set(), {"b": "2", "a": "1"})


def test_the_engine_keys_cpu_part_is_the_same_in_every_process():
    """PC47: the instruction sets in a set's order (a per-process string hash) made each process's key another: a
    file was never read by the next engine."""
    code = ("import edgespec.native as n; n._cpu_flags = lambda: {'avx', 'avx2', 'fma', 'f16c', 'sse4_1', 'sse4_2', "
            "'avx512f', 'avx512bw', 'avx512vl'}; from edgespec.prompt_cache import _cpu_isa; print(_cpu_isa())")
    got = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed}, check=True,
                          capture_output=True, text=True).stdout for seed in ("1", "2", "3")}
    assert len(got) == 1


def test_buffers_of_other_shapes_are_keyed_and_written_one_member_each(tmp_path):
    """PC52, PC53: a cache whose buffers differ in shape (Gemma 4's wider global layers) has ``kv_shapes`` in its key
    and its rows come back from a file exactly; a cache with convolution layers has each one's [channels, state
    length]."""
    shapes = ((2, 4), (2, 4), (1, 8), (1, 8))
    c = FakeCache(shapes=shapes).fill(_seq(1, 40))
    m = _manifest()
    key = engine_key(m, m.target, c)
    assert key["kv_shapes"] == [list(s) for s in shapes]
    pc = PromptCache(budget=1 << 20, min_tokens=4)
    pc.save(c)
    want = c.rows(40)
    f = tmp_path / "c.npz"
    write_file(pc, f, key)
    got = PromptCache(budget=1 << 20, min_tokens=4)
    assert read_file(got, f, key) == (1, None)
    k, n = got.match(_seq(1, 40))
    out = FakeCache(shapes=shapes).fill(_seq(2, 10))
    assert got.restore(k, n, out) == 40
    for g, w in zip(out.rows(40), want):
        np.testing.assert_array_equal(g, w)
    assert engine_key(m, m.target, FakeCache(conv=FakeConv(0)))["conv"] == [[3, 2]]


# -- the file -------------------------------------------------------------------------------------------------------

def _members(f):
    with zipfile.ZipFile(f) as z:
        return {n: z.read(n) for n in z.namelist()}


def _replace(f, name, data: bytes):
    members = {**_members(f), name: data}
    with zipfile.ZipFile(f, "w") as z:
        for n, b in members.items():
            z.writestr(n, b)


def _npy(a) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def _meta(f) -> dict:
    return json.loads(bytes(np.load(io.BytesIO(_members(f)["meta.npy"]))).decode())


def _npy_meta(meta: dict) -> bytes:
    return _npy(np.frombuffer(json.dumps(meta).encode(), np.uint8))


def test_a_write_and_a_read_keep_the_lru_order_the_written_version_and_the_size(tmp_path):
    """PC10, PC57, PC61, PC63, PC75: A (older) and B written and read back into room for two: a third entry evicts A,
    as it would have before the file. write_file records the version it wrote and returns the file's size; a clear
    is a change to write."""
    a, b = _seq(1, 20), _seq(2, 20)
    pc = _saved(PromptCache(budget=1 << 20, min_tokens=4), a, b)
    f = tmp_path / "c.npz"
    assert write_file(pc, f, KEY) == f.stat().st_size and pc.written == pc.version
    got = PromptCache(budget=PER * 40, min_tokens=4)
    assert read_file(got, f, KEY) == (2, None)
    got.save(FakeCache().fill(_seq(3, 20)))
    assert got.match(a)[1] == 0 and got.match(b)[1] == 20
    pc.clear()
    assert pc.version != pc.written  # (a close then writes the cleared cache)


def test_a_merge_keeps_the_most_recent_that_fit_ours_newest(tmp_path):
    """PC55, PC56, PC57, PC58: another engine's file holds Y (25 rows, older) and X (30); this engine's A (35) is
    written with them in a budget of 60 rows: A first (ours are newer), X does not fit the 25 left and is skipped, Y
    fits them exactly; read back, Y is the least recently used (the next entry evicts it)."""
    f = tmp_path / "c.npz"
    y, x, a = _seq(1, 25), _seq(2, 30), _seq(3, 35)
    write_file(_saved(PromptCache(budget=1 << 20, min_tokens=4), y, x), f, KEY)
    write_file(_saved(PromptCache(budget=PER * 60, min_tokens=4), a), f, KEY)
    got = PromptCache(budget=PER * 60, min_tokens=4)
    assert read_file(got, f, KEY) == (2, None)
    assert got.match(a)[1] == 35 and got.match(y)[1] == 25 and got.match(x)[1] == 0
    got.save(FakeCache().fill(_seq(4, 25)))
    assert got.match(y)[1] == 0 and got.match(a)[1] == 35 and got.evictions == 1


def test_a_damaged_file_is_replaced_by_a_write_and_a_failed_write_leaves_no_temporary(tmp_path, monkeypatch):
    """PC54, PC62: a file this edgespec cannot read at the path is replaced at a write (as the engine's close
    promises), and a write that fails at the rename is a StoreError with its temporary file removed."""
    f = tmp_path / "c.npz"
    f.write_bytes(b"PK\x03\x04 junk")
    pc = _saved(PromptCache(budget=1 << 20, min_tokens=4), _seq(1, 20))
    write_file(pc, f, KEY)
    assert read_file(PromptCache(1 << 20, 4), f, KEY) == (1, None)

    def fail(*a):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(StoreError, match="cannot write the prompt cache"):
        write_file(pc, f, KEY)
    monkeypatch.undo()
    assert not list(tmp_path.glob("*.tmp")) and read_file(PromptCache(1 << 20, 4), f, KEY) == (1, None)


def test_a_file_whose_key_has_one_more_field_is_another_engines(tmp_path):
    """PC72: a key with a field this engine's lacks (a conv model's ``conv``, kv_shapes) is not this engine's."""
    f = tmp_path / "c.npz"
    write_file(_saved(PromptCache(budget=1 << 20, min_tokens=4), _seq(1, 40)), f, {**KEY, "extra": 1})
    got = PromptCache(1 << 20, 4)
    n, why = read_file(got, f, KEY)
    assert n == 0 and "another engine" in why and len(got) == 0


def test_only_stale_temporaries_of_the_file_are_removed(tmp_path):
    """PC83, PC84: an hour-old temporary is removed and counted; a fresh one (a write in progress), the lock file and
    another dot file beside it stay."""
    f = tmp_path / "c.npz"
    names = (".c.npz.old.tmp", ".c.npz.new.tmp", ".c.npz.lock", ".c.npz.bak")
    for n in names:
        (tmp_path / n).write_text("x")
        if n != ".c.npz.new.tmp":
            os.utime(tmp_path / n, (1, 1))
    assert remove_stale_temporaries(f) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[1:])
