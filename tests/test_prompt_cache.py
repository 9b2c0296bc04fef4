"""The prompt cache (edgespec/prompt_cache.py): kept KV rows of set-aside conversations, restored exactly."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import edgespec
from edgespec.errors import ConfigError, ProfileError
from edgespec.kv import TokenBuffer
from edgespec.prompt_cache import PromptCache


class FakeCache:
    """What the prompt cache reads of a KVCache: ``host`` buffers [1, kv_heads, L, D] (``shapes``: each buffer's
    (kv_heads, D), where they differ), ``ids``, ``length``, ``max_len`` and ``conv`` (a model's convolution states)."""

    def __init__(self, layers=2, kvh=2, L=64, D=4, shapes=None, conv=None):
        shapes = shapes or ((kvh, D),) * (2 * layers)
        self.host = [np.zeros((1, h, L, d), np.float16) for h, d in shapes]
        self.ids = TokenBuffer(capacity=L)
        self.max_len = L
        self.conv = conv

    @property
    def length(self):
        return len(self.ids)

    def fill(self, ids):
        """Hold ``ids``, each row's values a function of its position and id (so copies are checkable)."""
        self.ids.truncate(0)
        self.ids.extend(ids)
        for j, a in enumerate(self.host):
            for p, t in enumerate(ids):
                a[0, :, p] = (t * 7 + p + j) % 251
        return self

    def rows(self, n):
        return [a[0, :, :n].copy() for a in self.host]


def test_save_then_restore_copies_rows_and_ids_exactly():
    c = FakeCache()
    pc = PromptCache(budget=1 << 20, min_tokens=4)
    a = list(range(100, 140))
    c.fill(a)
    want = c.rows(40)
    assert pc.save(c)
    c.fill(list(range(200, 230)))  # another sequence overwrites the live cache
    key, m = pc.match(a[:30] + [999, 998])
    assert m == 30
    assert pc.restore(key, m, c) == 30
    assert c.ids.tolist() == a[:30]
    for got, w in zip(c.rows(30), want):
        np.testing.assert_array_equal(got, w[:, :30])
    s = pc.stats()
    assert (s["entries"], s["saves"], s["restores"], s["restored_tokens"]) == (1, 1, 1, 30)
    assert s["bytes"] == pc.nbytes > 0


def test_an_extension_replaces_its_prefix_and_a_prefix_is_not_stored_twice():
    c = FakeCache()
    pc = PromptCache(budget=1 << 20, min_tokens=4)
    c.fill(list(range(20)))
    assert pc.save(c)
    c.fill(list(range(30)))  # the same conversation, longer: replaces the entry
    assert pc.save(c)
    assert len(pc) == 1 and pc.match(list(range(30)))[1] == 30
    c.fill(list(range(25)))  # a prefix of what is kept: nothing new
    assert not pc.save(c)
    assert len(pc) == 1 and pc.saves == 2


def test_least_recently_used_goes_first_and_a_long_sequence_keeps_its_first_rows():
    c = FakeCache(L=64)
    per = PromptCache.row_bytes(c) + 8
    pc = PromptCache(budget=per * 50, min_tokens=4)
    seqs = [[s * 1000 + i for i in range(20)] for s in range(3)]
    c.fill(seqs[0])
    pc.save(c)
    c.fill(seqs[1])
    pc.save(c)
    key, _ = pc.match(seqs[0])
    pc.restore(key, 10, c)  # seqs[0] is used again: seqs[1] is now the oldest
    c.fill(seqs[2])
    pc.save(c)  # 60 rows do not fit 50: the oldest goes
    assert pc.match(seqs[1])[1] == 0 and pc.match(seqs[0])[1] == 20 and pc.match(seqs[2])[1] == 20
    assert pc.evictions == 1 and pc.nbytes <= pc.budget
    c.fill(list(range(5000, 5064)))  # larger than the whole budget: its first 50 rows
    pc.save(c)
    assert pc.match(list(range(5000, 5064)))[1] == 50 and len(pc) == 1


@pytest.mark.parametrize("kvh,n", [(1, 40), (2, 64)])
def test_a_kept_copy_never_shares_memory_with_the_live_cache(kvh, n):
    """One KV head (a [1, n, D] slice is contiguous) or a full cache: still a copy, restored exactly."""
    c = FakeCache(kvh=kvh, L=64)
    pc = PromptCache(budget=1 << 20, min_tokens=4)
    a = list(range(300, 300 + n))
    c.fill(a)
    want = c.rows(n)
    pc.save(c)
    assert not any(np.shares_memory(r, h) for e in pc._entries.values() for r, h in zip(e.rows, c.host))
    c.fill(list(range(700, 700 + n)))
    key, m = pc.match(a)
    pc.restore(key, m, c)
    for got, w in zip(c.rows(n), want):
        np.testing.assert_array_equal(got, w)


def test_two_chats_taking_turns_in_a_small_cache_swap_instead_of_evicting_each_other():
    """Room for about one set-aside chat: keeping the live chat must not evict the one being restored."""
    c = FakeCache(L=64)
    per = PromptCache.row_bytes(c) + 8
    pc = PromptCache(budget=per * 60, min_tokens=4)
    a, b = list(range(100, 140)), list(range(500, 540))
    c.fill(a)
    assert pc.before_prefill(c, b + [1], 0) == 0  # A kept, B prefilled
    c.fill(b)
    got = pc.before_prefill(c, a + [2], 0)  # B kept (its first 20 rows: A's 40 stay), A restored
    assert got == 40 and c.ids.tolist() == a and pc.restores == 1 and pc.restored_tokens == 40
    assert pc.match(b)[1] == 20 and pc.nbytes <= pc.budget


def test_short_sequences_and_small_gains_are_left_alone():
    c = FakeCache()
    pc = PromptCache(budget=1 << 20, min_tokens=16)
    c.fill(list(range(10)))
    assert not pc.save(c)  # fewer than min_tokens
    c.fill(list(range(40)))
    assert pc.before_prefill(c, list(range(40)), 39) == 39 and len(pc) == 0  # a prompt again: one row, no copy
    pc.save(c)
    # the live cache holds 30 of the prompt's positions; the kept 40 gain only 10 < 16: no restore
    c.fill(list(range(30)) + [77, 78])
    prompt = list(range(41)) + [5]
    assert pc.before_prefill(c, prompt, 30) == 30 and pc.restores == 0
    # the live content the prefill would overwrite (fewer than min_tokens rows: 2) was not copied
    assert pc.match(list(range(30)) + [77, 78])[1] == 30 and pc.saves == 1
    with pytest.raises(ValueError):
        PromptCache(budget=-1)


def _chat(turns):
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


DOC_A = "alpha beta gamma delta " * 4
DOC_B = "one two three four five " * 4


@pytest.mark.parametrize("drafter,bundle", [("none", "tiny_bundle"), ("auto", "tiny_bundle"),
                                            ("none", "tiny_llama_bundle")])
def test_a_conversation_set_aside_continues_as_if_nothing_came_between(request, drafter, bundle):
    """A, B, A' through one engine with a prompt cache gives A' the tokens A, A' gives (the rows are
    restored, not recomputed); on a model with one KV head too (the llama)."""
    tiny_bundle = request.getfixturevalue(bundle)
    kw = dict(max_new_tokens=12, temperature=0.0, drafter=drafter)
    ref = edgespec.load(tiny_bundle, prompt_cache_mb=0, memory=False)
    assert ref.prompt_cache_stats() is None
    a1 = ref.generate(_chat([DOC_A]), **kw)
    a2_ref = ref.generate(_chat([DOC_A, a1.text, "and then?"]), **kw)
    assert a2_ref.stats["reused_prompt_tokens"] > 0 and a2_ref.stats["restored_prompt_tokens"] == 0

    eng = edgespec.load(tiny_bundle, prompt_cache_mb=64, memory=False)
    assert eng.generate(_chat([DOC_A]), **kw).token_ids == a1.token_ids
    eng.generate(_chat([DOC_B]), **kw)
    a2 = eng.generate(_chat([DOC_A, a1.text, "and then?"]), **kw)
    assert a2.stats["restored_prompt_tokens"] > 20
    assert a2.stats["reused_prompt_tokens"] == a2_ref.stats["reused_prompt_tokens"]
    assert a2.token_ids == a2_ref.token_ids
    s = eng.prompt_cache_stats()
    assert s["restores"] == 1 and s["entries"] >= 2 and s["budget"] == 64 << 20
    assert s["restored_tokens"] == a2.stats["restored_prompt_tokens"]
    eng.reset()
    assert eng.prompt_cache_stats()["entries"] == 0


def test_a_planted_restore_bug_changes_the_reply(tiny_bundle, monkeypatch):
    kw = dict(max_new_tokens=12, temperature=0.0, drafter="none")
    eng = edgespec.load(tiny_bundle, prompt_cache_mb=64, memory=False)
    a1 = eng.generate(_chat([DOC_A]), **kw)
    follow = _chat([DOC_A, a1.text, "and then?"])
    good = eng.generate(follow, **kw)
    eng.generate(_chat([DOC_B]), **kw)
    def ids_only(self, key, n, cache, have=0):  # the ids put back, the rows left as the other chat wrote them
        e = self._entries[key]
        cache.ids.truncate(0)
        cache.ids.extend(e.ids[:n])
        return n

    monkeypatch.setattr(PromptCache, "restore", ids_only)
    bad = eng.generate(follow, **kw)
    assert bad.stats["restored_prompt_tokens"] > 0 and bad.token_ids != good.token_ids


def test_a_restore_cut_short_leaves_ids_that_name_the_rows(tiny_bundle, monkeypatch):
    """Ctrl-C in the middle of a restore's copy (after two of the tiny model's four buffers): the live cache's
    ids still name its rows. The ids were set after the copy, so a cut copy left the other conversation's ids
    over some layers' restored rows, and continuing that conversation gave another reply (a review's finding)."""
    import builtins

    import edgespec.prompt_cache as pc

    kw = dict(max_new_tokens=12, temperature=0.0, drafter="none")
    eng = edgespec.load(tiny_bundle, prompt_cache_mb=64, memory=False)
    eng.generate(_chat([DOC_A]), **kw)
    eng.generate(_chat([DOC_B]), **kw)  # DOC_A's rows kept
    old = list(eng.decoder.target.tokens)

    def cut_zip(*its):
        for i, pair in enumerate(builtins.zip(*its)):
            if i == 2:
                raise KeyboardInterrupt
            yield pair

    monkeypatch.setattr(pc, "zip", cut_zip, raising=False)
    with pytest.raises(KeyboardInterrupt):
        eng.generate(_chat([DOC_A, "x", "and then?"]), **kw)  # restores DOC_A's rows ... Ctrl-C
    monkeypatch.undo()
    prompt = old + [0]  # the conversation the live cache was holding, continued
    same = eng._collect(eng.stream_ids(prompt, **kw)).token_ids
    fresh = edgespec.load(tiny_bundle, prompt_cache_mb=0, memory=False)
    assert same == fresh._collect(fresh.stream_ids(prompt, **kw)).token_ids


@pytest.fixture(scope="module")
def tiny_xk_pc(tiny_int4_bundle, tmp_path_factory):
    from edgespec_export.kernels import apply_to_bundle

    return apply_to_bundle(tiny_int4_bundle, tmp_path_factory.mktemp("xk-pc") / "tiny-int4-xk")


def test_on_width_invariant_kernels_a_restore_equals_a_fresh_prefill(tiny_xk_pc):
    """With edgespec's kernels a row is computed alike in any call, so rows kept from decoding, restored,
    give what a fresh engine's prefill of the same history gives, token for token."""
    kw = dict(max_new_tokens=16, temperature=0.0, drafter="auto")
    eng = edgespec.load(tiny_xk_pc, prompt_cache_mb=64, memory=False)
    a1 = eng.generate(_chat([DOC_A]), **kw)
    eng.generate(_chat([DOC_B]), **kw)
    follow = _chat([DOC_A, a1.text, "and then?"])
    restored = eng.generate(follow, **kw)
    assert restored.stats["restored_prompt_tokens"] > 0
    fresh = edgespec.load(tiny_xk_pc, prompt_cache_mb=0, memory=False).generate(follow, **kw)
    assert fresh.stats["reused_prompt_tokens"] == 0
    assert restored.token_ids == fresh.token_ids


def test_a_prompt_cache_file_is_keyed_by_the_kernels_path(tiny_xk_pc, tmp_path, monkeypatch):
    """(session 48, a review) EDGESPEC_Q4_ISA picks other attention lanes (other bits) on the same CPU and source:
    a file written on one path was restored on another."""
    from edgespec.native import isa

    if isa() == "portable":
        pytest.skip("this CPU takes the portable path already")
    f = tmp_path / "cache.npz"
    with edgespec.load(tiny_xk_pc, prompt_cache_mb=16, prompt_cache_file=f, memory=False) as eng:
        eng.generate(_chat([DOC_A]), max_new_tokens=4, drafter="none")
    monkeypatch.setenv("EDGESPEC_Q4_ISA", "portable")
    with pytest.warns(UserWarning, match="another engine .*kernels"):
        eng = edgespec.load(tiny_xk_pc, prompt_cache_mb=16, prompt_cache_file=f, memory=False)
    assert eng.prompt_cache_stats()["entries"] == 0
    eng.close()


def test_smollm2_conversations_taking_turns_restore_exactly(smol_int4):
    kw = dict(max_new_tokens=24, temperature=0.0, drafter="auto")
    q1 = "Explain in three sentences why the sky is blue and sunsets are red."
    q2 = "Write a haiku about a lighthouse in winter."
    ref = edgespec.load(smol_int4, prompt_cache_mb=0, memory=False)
    r1 = ref.generate(_chat([q1]), **kw)
    want = ref.generate(_chat([q1, r1.text, "Shorter, please."]), **kw)
    eng = edgespec.load(smol_int4, prompt_cache_mb=32, memory=False)
    assert eng.generate(_chat([q1]), **kw).token_ids == r1.token_ids
    eng.generate(_chat([q2]), **kw)
    got = eng.generate(_chat([q1, r1.text, "Shorter, please."]), **kw)
    assert got.stats["restored_prompt_tokens"] >= 30
    assert got.token_ids == want.token_ids


def test_the_plan_sizes_the_prompt_cache_from_what_is_left(tiny_bundle):
    from dataclasses import replace

    from edgespec.manifest import load_manifest
    from edgespec.planner import PROMPT_CACHE_CONTEXTS, PROMPT_CACHE_MARGIN, plan
    from edgespec.profiles import DEFAULT_PROFILE, MiB

    m = load_manifest(tiny_bundle)
    p = plan(m, DEFAULT_PROFILE)
    assert p.prompt_cache == PROMPT_CACHE_CONTEXTS * p.kv["target"] and p.total + p.prompt_cache <= p.budget
    assert "prompt_cache" in p.to_dict()
    tight = replace(DEFAULT_PROFILE, memory_budget_mb=int(p.total * (1 + PROMPT_CACHE_MARGIN)) // MiB)
    q = plan(m, tight)  # what is left is within the margin: none, and the context and drafter untouched
    assert q.prompt_cache == 0 and q.context == p.context and q.drafter == p.drafter
    asked = plan(m, replace(tight, prompt_cache_mb=10_000))  # asked for: what is left, and the plan says so
    assert asked.prompt_cache == asked.budget - asked.total > 0 and any("prompt cache" in c for c in asked.cuts)
    assert any("asked for a prompt cache of 10000 MiB" in w for w in asked.warnings)
    assert plan(m, replace(DEFAULT_PROFILE, prompt_cache_mb=0)).prompt_cache == 0
    assert plan(m, replace(DEFAULT_PROFILE, prompt_cache_mb=3)).prompt_cache == 3 * MiB
    gpu = plan(m, replace(DEFAULT_PROFILE, prompt_cache_mb=100), providers=["cuda"])
    assert gpu.prompt_cache == 0 and any("CPU caches only" in w for w in gpu.warnings)
    assert plan(m, DEFAULT_PROFILE, providers=["cuda"]).warnings == ()


def test_bad_prompt_cache_sizes_are_refused(tiny_bundle, tmp_path):
    from edgespec.profiles import load_profile

    for bad in (-1, "64", True, 1.5):
        with pytest.raises(ConfigError, match="prompt_cache_mb"):
            edgespec.load(tiny_bundle, prompt_cache_mb=bad, memory=False)
    for bad in ("-1", "\"big\"", "true"):
        f = tmp_path / "p.toml"
        f.write_text(f"memory_budget_mb = 4096\nprompt_cache_mb = {bad}\n")
        with pytest.raises(ProfileError, match="prompt_cache_mb"):
            load_profile(f)
    f.write_text("memory_budget_mb = 4096\nprompt_cache_mb = 0\n")
    assert load_profile(f).prompt_cache_mb == 0
    assert edgespec.load(tiny_bundle, prompt_cache_mb=np.int64(5), memory=False).prompt_cache_stats()["budget"] == 5 << 20


def test_cli_plan_and_serve_options(tiny_bundle):
    from edgespec.cli import main

    out = CliRunner().invoke(main, ["plan", str(tiny_bundle), "--json"])
    assert out.exit_code == 0 and json.loads(out.output)["plan"]["prompt_cache"] > 0
    out = CliRunner().invoke(main, ["plan", str(tiny_bundle)])
    assert out.exit_code == 0 and "prompt cache" in out.output
    bad = CliRunner().invoke(main, ["serve", str(tiny_bundle), "--prompt-cache-mb", "-5", "--port", "0"])
    assert bad.exit_code != 0 and "prompt-cache-mb" in bad.output and len(bad.output.strip().splitlines()) == 1


def test_a_prompt_cache_file_carries_conversations_across_engines(tiny_bundle, tmp_path):
    """Written at close (and when an engine is dropped), read by the next engine of the same bundle:
    its first request restores what the last one kept, with the replies of an uninterrupted chat."""
    import gc

    f = tmp_path / "pc" / "cache.npz"
    kw = dict(max_new_tokens=10, temperature=0.0, drafter="none")
    ref = edgespec.load(tiny_bundle, prompt_cache_mb=0, memory=False)
    a1 = ref.generate(_chat([DOC_A]), **kw)
    follow = _chat([DOC_A, a1.text, "and then?"])
    want = ref.generate(follow, **kw)
    with edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=f, memory=False) as eng:
        assert eng.prompt_cache_stats()["entries"] == 0  # no file yet
        eng.generate(_chat([DOC_A]), **kw)  # the only chat: kept at close from the live cache
    assert f.is_file() and f.stat().st_mode & 0o777 == 0o600
    inode = f.stat().st_ino
    edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=f, memory=False).close()
    assert f.stat().st_ino == inode  # nothing changed: not rewritten
    eng = edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=f, memory=False)
    assert eng.prompt_cache_stats()["entries"] == 1
    got = eng.generate(follow, **kw)
    assert got.stats["restored_prompt_tokens"] > 0 and got.token_ids == want.token_ids
    del eng  # dropped without close: written by its finalizer (the longer chat replaces the kept one)
    gc.collect()
    assert f.stat().st_ino != inode
    stale = f.with_name(f".{f.name}.abc123.tmp")
    stale.write_bytes(b"left by a killed write")
    os.utime(stale, (1, 1))
    with edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=f, memory=False) as eng:
        assert not stale.exists() and eng.prompt_cache_stats()["entries"] == 1
        eng.reset()  # forgets on disk too
        assert not f.exists()
    assert not f.exists()  # and nothing followed: not written again at close


def test_a_prompt_cache_file_is_read_within_the_budget_and_checked():
    """The most recent entries that fit, an oversized one cut to its first rows; non-finite rows refused."""
    from edgespec.errors import StoreError
    from edgespec.prompt_cache import read_file, write_file

    c = FakeCache(L=64)
    per = PromptCache.row_bytes(c) + 8
    big = PromptCache(budget=1 << 20, min_tokens=4)
    seqs = [[s * 1000 + i for i in range(40)] for s in range(3)]
    for q in seqs:
        c.fill(q)
        big.save(c)
    key = {"buffers": len(c.host), "kv_heads": 2, "head_dim": 4, "dtype": "float16"}
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "c.npz"
        write_file(big, f, key)
        small = PromptCache(budget=per * 60, min_tokens=4)
        assert read_file(small, f, key) == (2, None)  # the newest (40 rows) and the next one's first 20
        assert small.match(seqs[2])[1] == 40 and small.match(seqs[1])[1] == 20 and small.match(seqs[0])[1] == 0
        assert small.nbytes <= small.budget
        c.fill(seqs[1])
        k, m = small.match(seqs[1])
        small.restore(k, m, c)
        want = FakeCache(L=64)
        want.fill(seqs[1])
        for got, w in zip(c.rows(20), want.rows(20)):
            np.testing.assert_array_equal(got, w)
        poisoned = PromptCache(budget=1 << 20, min_tokens=4)
        c.fill(seqs[0])
        c.host[3][0, 1, 5, 2] = np.inf
        poisoned.save(c)
        write_file(poisoned, f, key)
        with pytest.raises(StoreError, match="not finite"):
            read_file(PromptCache(1 << 20), f, key)


def test_a_prompt_cache_file_is_keyed_by_the_width_policy_and_needs_hashes(tiny_bundle, tmp_path, copy_bundle):
    """(a review's findings, session 44) A file written by an engine decoding one token a call is not read by one
    whose width policy pads (its rows are other bits on onnxruntime's kernels), and a bundle whose manifest records
    no sha256 for its files cannot have a file (the key names the weights by their hashes: two such bundles of one
    size, one with other weights, shared it, and the other restored rows it would not compute: other replies)."""
    import json

    f = tmp_path / "cache.npz"
    with edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=f, memory=False, min_width=1) as eng:
        assert eng.decoder.target.min_width == 1
        eng.generate(_chat([DOC_A]), max_new_tokens=4, drafter="none")
        eng.generate(_chat([DOC_B]), max_new_tokens=4, drafter="none")
    with pytest.warns(UserWarning, match="another engine .*widths"):
        eng = edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=f, memory=False)
    assert eng.decoder.target.min_width != 1 and eng.prompt_cache_stats()["entries"] == 0
    eng.close()
    b = copy_bundle(Path(tiny_bundle))
    manifest = json.loads((b / "edgespec.json").read_text())
    for meta in manifest["models"]["target"]["files"].values():
        del meta["sha256"]
    (b / "edgespec.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="records its files' sha256.*export the bundle again"):
        edgespec.load(b, prompt_cache_mb=16, prompt_cache_file=tmp_path / "other.npz", memory=False)
    edgespec.load(b, prompt_cache_mb=16, memory=False).close()  # (without a file it loads)


def test_a_prompt_cache_file_of_another_engine_is_ignored_and_a_foreign_file_refused(tiny_bundle, tmp_path):
    from edgespec.errors import StoreError
    from edgespec.prompt_cache import read_file, write_file

    f = tmp_path / "cache.npz"
    with edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=f, memory=False) as eng:
        eng.generate(_chat([DOC_A]), max_new_tokens=4, drafter="none")
        eng.generate(_chat([DOC_B]), max_new_tokens=4, drafter="none")
        key = eng._write_prompt_cache.peek()[2][3]  # (pc, cache, path, key)
    pc = PromptCache(1 << 24)
    assert read_file(pc, f, key)[0] >= 1
    write_file(pc, f, {**key, "onnxruntime": "0.0.1"})  # as another onnxruntime would have
    with pytest.warns(UserWarning, match="another engine .*onnxruntime"):
        eng = edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=f, memory=False)
    assert eng.prompt_cache_stats()["entries"] == 0
    eng.close()  # nothing to keep: the other engine's file stays
    assert "another engine" in read_file(PromptCache(1 << 24), f, key)[1]
    with pytest.warns(UserWarning, match="another engine"):
        eng = edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=f, memory=False)
    eng.reset()  # (the cleared cache was written over the other engine's file at close)
    eng.close()
    assert "another engine" in read_file(PromptCache(1 << 24), f, key)[1]
    with pytest.warns(UserWarning, match="another engine"):
        eng = edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=f, memory=False)
    eng.generate(_chat([DOC_A]), max_new_tokens=4, drafter="none")
    eng.close()
    assert read_file(PromptCache(1 << 24), f, key)[1] is None  # replaced by this engine's
    for junk in (b"not a cache", b"PK\x03\x04 truncated"):
        f.write_bytes(junk)
        with pytest.raises(StoreError, match="give a new path"):
            edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=f, memory=False)
        assert f.read_bytes() == junk  # left as it is
    with pytest.raises(ConfigError, match="needs a prompt cache"):
        edgespec.load(tiny_bundle, prompt_cache_mb=0, prompt_cache_file=tmp_path / "x.npz", memory=False)
    with pytest.raises(ConfigError, match="directory"):
        edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=tmp_path, memory=False)
    for bad in (3, ""):  # ("": the working directory)
        with pytest.raises(ConfigError, match="prompt_cache_file"):
            edgespec.load(tiny_bundle, prompt_cache_file=bad, memory=False)
    if Path("/proc").is_dir():  # a place no file can be made (as root too): said at load, not at close (session 43)
        with pytest.raises(ConfigError, match="cannot be written: /proc takes no new files"):
            edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file="/proc/edgespec-pc.bin", memory=False)
        # (session 46) folders to be made on the way: the nearest one there is was not checked
        with pytest.raises(ConfigError, match="cannot be written: /proc takes no new files"):
            edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file="/proc/edgespec-x/y/pc.bin", memory=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError, match="cannot read the prompt cache .*Not a directory"):
        edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=tmp_path / "file" / "c.npz", memory=False)
    (tmp_path / "gone").mkdir()
    eng = edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=tmp_path / "gone" / "c.npz", memory=False)
    eng.generate(_chat([DOC_B]), max_new_tokens=4, drafter="none")  # something to keep
    (tmp_path / "gone").rmdir()
    (tmp_path / "gone").write_text("now a file")
    with pytest.warns(UserWarning, match="cannot write the prompt cache"):
        eng.close()  # a place it cannot be written: said at close, not raised


def test_a_prompt_cache_file_through_a_link_and_on_a_read_only_place(tiny_bundle, tmp_path, monkeypatch):
    """(session 64, a review) A --prompt-cache-file that is a symbolic link was replaced by a file of its own at close
    (a temporary file renamed over the link): the cache it pointed to, on a kept volume, stopped being saved. It is
    written where the link points now. And a file in a place that takes no new files (a cache made once, shipped on
    a read-only image) was refused at load: it is read, with a warning that it will not be saved."""
    from edgespec import api

    vol, links = tmp_path / "vol", tmp_path / "links"
    vol.mkdir()
    links.mkdir()
    link = links / "pc.npz"
    link.symlink_to(vol / "real.npz")
    eng = edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=link, memory=False)
    a1 = eng.generate(_chat([DOC_A]), max_new_tokens=6, drafter="none")
    eng.close()
    assert link.is_symlink() and (vol / "real.npz").is_file()
    before = (vol / "real.npz").stat().st_mtime_ns
    monkeypatch.setattr(api, "_writable_dir", lambda d: Path(d).resolve() != vol.resolve())
    with pytest.warns(UserWarning, match=r"real.npz is read and will not be saved: .*vol takes no new files"):
        eng = edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=link, memory=False)
    follow = eng.generate(_chat([DOC_A, a1.text, "and then?"]), max_new_tokens=6, drafter="none")
    assert follow.stats["restored_prompt_tokens"] > 0  # (read)
    eng.close()
    assert (vol / "real.npz").stat().st_mtime_ns == before and link.is_symlink()  # (not written)
    with pytest.raises(ConfigError, match="cannot be written: .*vol takes no new files"):  # (nothing to read)
        edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=vol / "new.npz", memory=False)


def test_state_files_named_relative_stay_where_they_were_named_and_read_only_ones_are_kept(tiny_bundle, tmp_path,
                                                                                           monkeypatch):
    """(session 92, a review) A relative prompt cache file or memory store followed the working directory: an app
    that changed it after load() overwrote a file of that name there at close (deleted it at reset, for the prompt
    cache), and saved its memory over a user's file. They stay where they were named. A memory store through a
    symbolic link is saved where it points (the link was replaced by a file). A prompt cache file made read-only
    (chmod a-w: a kiosk's prepared cache) is read and kept as it is, with a warning (it was replaced at close, 0600);
    one rewritten keeps its mode (a shared 0644 file became 0600)."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    for name in ("pc.npz", "notes.npz"):
        (b / name).write_text("the user's own file")
    monkeypatch.chdir(a)
    eng = edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file="pc.npz", memory="notes.npz")
    eng.generate(_chat([DOC_A]), max_new_tokens=4, drafter="suffix")
    monkeypatch.chdir(b)
    eng.generate(_chat([DOC_B]), max_new_tokens=4, drafter="suffix")  # (its reply saved to the memory)
    eng.close()
    assert all((b / n).read_text() == "the user's own file" for n in ("pc.npz", "notes.npz"))
    assert (a / "pc.npz").stat().st_size > 0 and (a / "notes.npz").stat().st_size > 0
    monkeypatch.chdir(a)
    eng = edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file="pc.npz", memory=False)
    monkeypatch.chdir(b)
    eng.reset()  # (the file it read is removed only where it was named)
    eng.close()
    assert (b / "pc.npz").read_text() == "the user's own file"
    # a memory store through a link
    vol = tmp_path / "vol"
    vol.mkdir()
    link = b / "linked.npz"
    link.symlink_to(vol / "real.npz")
    eng = edgespec.load(tiny_bundle, memory=link)
    eng.generate(_chat([DOC_A]), max_new_tokens=4, drafter="suffix")
    eng.close()
    assert link.is_symlink() and (vol / "real.npz").is_file() and (vol / "real.npz").stat().st_size > 0
    # read-only, and a mode kept
    f = a / "pc.npz"
    assert not f.exists()  # (the reset above removed it, there)
    eng = edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=f, memory=False)
    eng.generate(_chat([DOC_A]), max_new_tokens=4, drafter="none")
    eng.close()
    f.chmod(0o444)
    data = f.read_bytes()
    with pytest.warns(UserWarning, match=r"pc.npz is read and will not be saved: the file is read-only"):
        eng = edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=f, memory=False)
    follow = eng.generate(_chat([DOC_A, "and then?"]), max_new_tokens=4, drafter="none")
    eng.generate(_chat(["something else " * 6]), max_new_tokens=4, drafter="none")
    eng.close()
    assert follow.stats["restored_prompt_tokens"] > 0 and f.read_bytes() == data and f.stat().st_mode & 0o777 == 0o444
    f.chmod(0o644)
    eng = edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=f, memory=False)
    eng.generate(_chat(["something else " * 6]), max_new_tokens=4, drafter="none")
    eng.close()
    assert f.read_bytes() != data and f.stat().st_mode & 0o777 == 0o644


def test_a_damaged_prompt_cache_file_is_a_store_error_and_left_as_it_is(tmp_path):
    """(session 46) a broken deflate stream (zlib.error), nested JSON in the header (RecursionError), an encrypted or
    unknown-method member escaped as tracebacks where the README promises a StoreError at start; a count of True
    passed as an entry length."""
    import io
    import tokenize
    import zipfile

    from tiny import damaged_zips

    from edgespec.errors import StoreError
    from edgespec.prompt_cache import FORMAT, VERSION, read_file

    key = {"buffers": 4, "kv_heads": 2, "head_dim": 16, "dtype": "float32"}

    def meta(lengths, **more):
        m = json.dumps({"format": FORMAT, "version": VERSION, "key": key, "lengths": lengths, **more}).encode()
        return np.frombuffer(m, np.uint8)

    members = {"meta": meta([20]), "ids_0": np.arange(20, dtype=np.int64),
               "rows_0": np.zeros((4, 2, 20, 16), np.float32)}
    plain = io.BytesIO()
    np.savez(plain, **{**members, "meta": meta([True])})
    header = io.BytesIO()  # (session 92, a review: numpy's second parse of a broken array header raised tokenize's
    with zipfile.ZipFile(header, "w") as z:  # TokenError, a traceback at start and at close; the zip's CRC fits it)
        for name, a in members.items():
            npy = io.BytesIO()
            np.lib.format.write_array(npy, a)
            z.writestr(f"{name}.npy", npy.getvalue().replace(b"'shape': (20,), }", b"'shape': (20,(, }"))
    broken = header.getvalue()
    truncated = io.BytesIO()  # (prompt_cache_mut.py PC67: ids_0's header says 20 ids and 19 follow; the CRC fits)
    with zipfile.ZipFile(truncated, "w") as z:
        for name, a in members.items():
            npy = io.BytesIO()
            np.lib.format.write_array(npy, a)
            z.writestr(f"{name}.npy", npy.getvalue()[:-8] if name == "ids_0" else npy.getvalue())

    def npz(**changed):
        buf = io.BytesIO()
        np.savez(buf, **{**members, **changed})
        return buf.getvalue()

    # (prompt_cache_mut.py PC65-PC67, PC70, PC71) each of these was read: rows in another order, ids cut
    # short or read from a longer member, a header of megabytes, another format's file
    unread = {"a Fortran-order member": npz(rows_0=np.asfortranarray(members["rows_0"])),
              "a member of another shape": npz(ids_0=np.arange(21, dtype=np.int64)),
              "a truncated member": truncated.getvalue(),
              "a header past 1 MiB": npz(meta=meta([20], pad=" " * (1 << 20))),
              "another format": npz(meta=meta([20], format="numpy"))}
    with zipfile.ZipFile(io.BytesIO(broken)) as z, z.open("ids_0.npy") as m, pytest.raises(tokenize.TokenError):
        np.lib.format.read_magic(m)
        np.lib.format.read_array_header_1_0(m)  # (what the unfixed read let through)
    for how, data in [*damaged_zips(members).items(), ("a length True", plain.getvalue()),
                      ("an array header", broken), *unread.items()]:
        f = tmp_path / "cache.npz"
        f.write_bytes(data)
        with pytest.raises(StoreError, match="prompt cache .*(unreadable|unusable)"):
            read_file(PromptCache(1 << 24), f, key)
        assert f.read_bytes() == data, how


def test_calls_that_waited_for_a_close_are_closed_errors_and_change_nothing(tiny_bundle, tmp_path):
    """(session 46, a review) a reset, score or add_documents that waited for the engine while another thread closed
    it ran on the released models after close() returned, and a queued reset deleted the prompt cache file the close
    had just written."""
    import threading
    import time

    from edgespec.errors import ClosedError

    f = tmp_path / "cache.npz"
    eng = edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=f, memory=False)
    eng.generate(_chat([DOC_A]), max_new_tokens=4, drafter="none")
    eng.generate(_chat([DOC_B]), max_new_tokens=4, drafter="none")  # (DOC_A's rows set aside: something to write)
    stream = eng.stream("hello there", max_new_tokens=8)
    next(stream)  # this thread holds the engine
    got = {}

    def call(name, fn):
        try:
            fn()
            got[name] = "ran"
        except ClosedError:
            got[name] = "closed"

    closer = threading.Thread(target=call, args=("close", eng.close))
    closer.start()
    time.sleep(0.3)  # (close waits first)
    others = [threading.Thread(target=call, args=(n, fn)) for n, fn in (
        ("reset", eng.reset), ("score", lambda: eng.score(eng.encode("hello"))),
        ("add_documents", lambda: eng.add_documents(texts=["a document"])))]
    for t in others:
        t.start()
    time.sleep(0.3)
    list(stream)
    for t in [closer, *others]:
        t.join(60)
    assert got == {"close": "ran", "reset": "closed", "score": "closed", "add_documents": "closed"}, got
    assert f.is_file()  # (what close wrote stays)


def test_generate_runs_share_a_document_through_a_prompt_cache_file(tiny_bundle, tmp_path):
    """`edgespec generate --prompt-cache-file`: each run a new process (here: a new engine); the second
    question about the same document restores the first run's rows."""
    from edgespec.cli import main

    f = tmp_path / "doc.npz"
    runs = []
    for q in ("first question?", "second question?"):
        r = CliRunner().invoke(main, ["generate", str(tiny_bundle), "-p", DOC_A + q, "--max-new-tokens", "4",
                                      "--drafter", "none", "--no-memory", "--prompt-cache-file", str(f), "--json"])
        assert r.exit_code == 0, r.output
        runs.append(json.loads(r.stdout))
    assert f.is_file() and runs[0]["stats"]["restored_prompt_tokens"] == 0
    assert runs[1]["stats"]["restored_prompt_tokens"] >= 16
    bad = CliRunner().invoke(main, ["chat", str(tiny_bundle), "--prompt-cache-mb", "0", "--prompt-cache-file",
                                    str(tmp_path / "x.npz")], input="")
    assert bad.exit_code != 0 and "needs a prompt cache" in bad.output


def test_two_chat_sessions_on_one_engine_take_turns_without_prefilling_again(tiny_bundle):
    """The Python API's multi-user case: two ChatSessions on one engine, alternating turns; each turn after
    the first restores its own history and replies as a session alone on its engine does."""
    kw = dict(max_new_tokens=8, drafter="none")
    eng = edgespec.load(tiny_bundle, prompt_cache_mb=16, memory=False)
    a, b = eng.chat(system="alpha " * 8), eng.chat(system="beta " * 8)
    got = {"a": [], "b": []}
    for turn in ("one", "two", "three"):
        for name, s in (("a", a), ("b", b)):
            r = s.send(f"{name} says {turn}", **kw)
            got[name].append(r.token_ids)
            if turn != "one":
                assert r.stats["restored_prompt_tokens"] > 0
    for name, system in (("a", "alpha " * 8), ("b", "beta " * 8)):
        alone = edgespec.load(tiny_bundle, prompt_cache_mb=0, memory=False).chat(system=system)
        assert [alone.send(f"{name} says {t}", **kw).token_ids for t in ("one", "two", "three")] == got[name]


def test_the_generation_lock_is_taken_at_exit_only_if_free():
    """What the prompt cache file's writer uses at close (the lock already held), at exit with nothing
    running (taken and given back) and with another thread's generation running (not taken, no wait)."""
    import threading

    from edgespec.decoder import GenerationLock

    lock = GenerationLock()
    with lock.held_if_free() as free:
        assert free
    with lock.hold():
        with lock.held_if_free() as free:
            assert free
    running, done = threading.Event(), threading.Event()

    def generate():
        with lock.hold():
            running.set()
            done.wait(10)

    t = threading.Thread(target=generate)
    t.start()
    running.wait(10)
    with lock.held_if_free() as free:
        assert not free
    assert not lock.orphaned()  # (session 96, DC42: held by a live thread that read no stream: no orphan to warn of)
    done.set()
    t.join(10)
    with lock.held_if_free() as free:
        assert free


def test_a_newer_editions_prompt_cache_file_is_neither_read_nor_replaced(tiny_bundle, tmp_path, monkeypatch):
    """(session 55, a review) A file written in a newer version of the format was skipped with a warning, then
    replaced at close by this version's: the newer edgespec's conversations lost (the memory store keeps such a
    file). It is left as it is: the engine keeps its conversations in memory only, and says so."""
    import edgespec.prompt_cache as pcm

    f = tmp_path / "cache.npz"
    monkeypatch.setattr(pcm, "VERSION", pcm.VERSION + 1)  # a newer edgespec writes it
    with edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=f, memory=False) as eng:
        eng.generate(_chat([DOC_A]), max_new_tokens=4, drafter="none")
    written = f.read_bytes()
    monkeypatch.undo()
    with pytest.warns(UserWarning, match=r"newer edgespec .*left as it is.*in memory only"):
        eng = edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=f, memory=False)
    eng.generate(_chat([DOC_B]), max_new_tokens=4, drafter="none")
    eng.generate(_chat([DOC_A]), max_new_tokens=4, drafter="none")
    assert eng.prompt_cache_stats()["entries"] >= 1  # (in memory: the conversation before the last kept)
    eng.close()
    assert f.read_bytes() == written


def test_two_engines_on_one_prompt_cache_file_keep_each_others_conversations(tiny_bundle, tmp_path):
    """(session 55, a review) Each engine wrote its own view of a shared --prompt-cache-file at close (a rename over
    the file): the last to close lost the other's conversations. Under a lock file, a write keeps the entries
    another engine of the same key wrote there, older than its own, within its budget; its own earlier entries
    are not doubled."""
    f = tmp_path / "shared.npz"
    kw = dict(prompt_cache_mb=16, prompt_cache_file=f, memory=False)
    a, b = edgespec.load(tiny_bundle, **kw), edgespec.load(tiny_bundle, **kw)
    a.generate(_chat([DOC_A]), max_new_tokens=4, drafter="none")
    b.generate(_chat([DOC_B]), max_new_tokens=4, drafter="none")
    a.close()
    b.close()
    c = edgespec.load(tiny_bundle, **kw)
    assert c.prompt_cache_stats()["entries"] == 2
    for doc in (DOC_A, DOC_B):  # both restored: only the turn's tail is prefilled
        r = c.generate(_chat([doc]), max_new_tokens=4, drafter="none")
        assert r.stats["restored_prompt_tokens"] > 0 or r.stats["reused_prompt_tokens"] > 0, r.stats
    c.close()
    d = edgespec.load(tiny_bundle, **kw)
    assert d.prompt_cache_stats()["entries"] == 2  # (c's rewrite merged nothing twice)
    d.close()


# -- edgespec/prompt_cache.py ---------------------------------------------------------------------------------------
def test_a_prompt_a_kept_sequence_holds_whole_is_restored_but_its_last_position():
    """(prompt_cache.py before_prefill: ``m = min(m, len(ids) - 1)``) a prefill must feed at least one token to get
    logits: a prompt that a kept sequence holds whole (the same question asked again after another chat) gets all but
    its last position back. Restoring all of it left the prefill nothing to feed (a crash: no logits)."""
    c = FakeCache()
    pc = PromptCache(budget=1 << 20, min_tokens=4)
    a = list(range(100, 140))
    c.fill(a)
    want = c.rows(29)
    assert pc.save(c)
    c.fill(list(range(200, 230)))  # another conversation
    assert pc.before_prefill(c, a[:30], 0) == 29
    assert c.ids.tolist() == a[:29]
    for got, w in zip(c.rows(29), want):
        np.testing.assert_array_equal(got, w)


def test_the_same_chat_asked_again_after_another_is_restored_and_replies_the_same(tiny_bundle):
    kw = dict(max_new_tokens=12, temperature=0.0, drafter="none")
    eng = edgespec.load(tiny_bundle, prompt_cache_mb=64, memory=False)
    first = eng.generate(_chat([DOC_A]), **kw)
    eng.generate(_chat([DOC_B]), **kw)  # DOC_A's prompt and reply kept
    again = eng.generate(_chat([DOC_A]), **kw)  # a prompt the kept sequence holds whole
    assert again.stats["restored_prompt_tokens"] > 0
    assert again.token_ids == first.token_ids


def test_a_prompt_cache_file_is_keyed_by_the_session_options(tiny_bundle, tmp_path):
    """(prompt_cache.py engine_key: ``"session_options"``) onnxruntime's session options (a profile's
    ``[session_options]``) may change the kernels a row is computed by: a file written under other options is
    another engine's, ignored, as one of another width policy or kernels path is."""
    from edgespec.prompt_cache import engine_key

    eng = edgespec.load(tiny_bundle, prompt_cache_mb=16, memory=False)
    m, cache = eng.manifest, eng.decoder.target.cache
    opts = {"session.intra_op.allow_spinning": "0"}
    assert engine_key(m, m.target, cache, opts) == engine_key(m, m.target, cache, dict(opts))
    assert engine_key(m, m.target, cache, opts) != engine_key(m, m.target, cache, {})
    eng.close()
    f = tmp_path / "cache.npz"
    with edgespec.load(tiny_bundle, prompt_cache_mb=16, prompt_cache_file=f, memory=False) as eng:
        eng.generate(_chat([DOC_A]), max_new_tokens=4, drafter="none")
        eng.generate(_chat([DOC_B]), max_new_tokens=4, drafter="none")
    prof = tmp_path / "p.toml"
    prof.write_text('memory_budget_mb = 1024\n[session_options]\n"session.intra_op.allow_spinning" = "0"\n')
    with pytest.warns(UserWarning, match="another engine .*session_options"):
        eng = edgespec.load(tiny_bundle, profile=prof, prompt_cache_mb=16, prompt_cache_file=f, memory=False)
    assert eng.prompt_cache_stats()["entries"] == 0
    eng.close()


@pytest.mark.parametrize("version", [0, None, "1"])
def test_a_prompt_cache_file_of_another_format_version_is_not_read(tmp_path, version):
    """(prompt_cache.py read_file: ``if v != VERSION``) a file of an older version of the format (or one whose
    version is no count) is not read: (0, why), its rows never restored."""
    import io
    import json
    import zipfile

    from edgespec.prompt_cache import read_file, write_file

    c = FakeCache(L=64)
    pc = PromptCache(budget=1 << 20, min_tokens=4)
    c.fill(list(range(100, 140)))
    pc.save(c)
    key = {"buffers": len(c.host), "kv_heads": 2, "head_dim": 4, "dtype": "float16"}
    f = tmp_path / "c.npz"
    write_file(pc, f, key)
    assert read_file(PromptCache(1 << 20, 4), f, key) == (1, None)
    with zipfile.ZipFile(f) as z:
        members = {n: z.read(n) for n in z.namelist()}
    meta = json.loads(bytes(np.load(io.BytesIO(members["meta.npy"]))).decode())
    meta["version"] = version
    buf = io.BytesIO()
    np.save(buf, np.frombuffer(json.dumps(meta).encode(), np.uint8))
    members["meta.npy"] = buf.getvalue()
    with zipfile.ZipFile(f, "w") as z:
        for n, b in members.items():
            z.writestr(n, b)
    other = PromptCache(1 << 20, 4)
    n, why = read_file(other, f, key)
    assert n == 0 and "version" in why and len(other) == 0
