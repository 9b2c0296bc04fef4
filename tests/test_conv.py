"""(session 61) Models with convolution layers beside attention (LFM2): each conv layer's state (its kernel's last
inputs) is rolled back after a rejected draft from the state before the call and the call's conv inputs, which the
export makes graph outputs (export/conv.py, edgespec/kv.py ``ConvStates``). Tiny random LFM2 models: the export
validates against torch through the runtime, and greedy speculative output equals plain decoding under every drafter,
a drafter model with convolution layers included."""
from __future__ import annotations

import numpy as np
import pytest

PROMPT = "one two three four five six seven eight nine ten one two three four five six seven eight"
LAYERS = ["conv", "full_attention", "conv", "full_attention"]


@pytest.fixture(scope="module")
def lfm2(tmp_path_factory):
    """An INT4 LFM2 target with a perturbed copy as its drafter model, and an fp32 target alone."""
    from edgespec_export import export_bundle
    from tiny import make_model

    root = tmp_path_factory.mktemp("lfm2")
    target = make_model(root / "target", "lfm2", seed=5, layers=4, layer_types=LAYERS, conv_L_cache=3,
                        block_auto_adjust_ff_dim=False)
    drafter = make_model(root / "drafter", "lfm2", seed=5, layers=4, layer_types=LAYERS, conv_L_cache=3,
                         block_auto_adjust_ff_dim=False, perturb_from=target, noise=0.02)
    pair = export_bundle(str(target), root / "pair", drafter=str(drafter), max_context=256, target_precision="int4",
                         drafter_precision="int4", quality=False)
    fp32 = export_bundle(str(target), root / "fp32", max_context=256, target_precision="fp32", quality=False)
    return {"pair": pair, "fp32": fp32, "target": target, "root": root}


def _states(conv) -> list[np.ndarray]:
    """Each conv layer's state buffer (a copy)."""
    return [cl.past.copy() for cl in conv.layers]


def _same(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def _plain_and(eng, prompt, drafters, tokens=48, **kw):
    plain = {k: v for k, v in kw.items() if k != "draft_tokens"}  # (refused beside drafter none since session 93)
    ar = eng.generate(prompt, max_new_tokens=tokens, drafter="none", ignore_eos=True, **plain)
    for d in drafters:
        got = eng.generate(prompt, max_new_tokens=tokens, drafter=d, ignore_eos=True, **kw)
        assert got.token_ids == ar.token_ids, (d, kw)
        yield d, got


def test_lfm2_exports_with_its_conv_states_in_the_manifest(lfm2):
    from edgespec.manifest import load_manifest

    m = load_manifest(lfm2["pair"], deep=True)
    for spec in (m.target, m.drafter):
        assert spec.conv_layers == ((0, 64, 2), (2, 64, 2))  # (layer, channels, kernel - 1)
        assert spec.io.past_conv == "past.%d.conv" and spec.io.conv_input == "conv_input.%d"
        assert [spec.has_kv(i) for i in range(4)] == [False, True, False, True]
        assert spec.kv_bytes(100) == 100 * spec.kv_bytes_per_token + spec.conv_state_bytes
        assert spec.validation.weights_unmapped == 0  # (the conv projections and LFM2's w1/w3/w2 mapped)
    assert m.target.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4  # two attention layers' keys and values only
    from click.testing import CliRunner

    from edgespec.cli import main

    r = CliRunner().invoke(main, ["info", str(lfm2["pair"])])
    assert r.exit_code == 0 and r.output.count("2 convolution layers (no KV cache") == 2, r.output


def test_lfm2_decodes_exactly_under_every_drafter(lfm2):
    """Greedy: every drafter's output is plain decoding's, a drafter model's (whose own convolution states are rolled
    back after each rejected draft, across its one-token calls) and fixed draft lengths included; the drafts were
    accepted in part (rollbacks to the middle of a call)."""
    import edgespec

    eng = edgespec.load(lfm2["pair"], memory=False)
    accepted = {}
    for prompt in (PROMPT, "the quick brown fox jumps over the lazy dog and the cat"):
        for d, got in _plain_and(eng, prompt, ("model", "prompt-lookup", "suffix", "auto")):
            accepted[d] = accepted.get(d, 0) + got.stats["accepted"]
            assert got.stats["drafted"] > got.stats["accepted"] or d != "model"  # (some rejected)
        for k in (1, 3, 6):
            list(_plain_and(eng, prompt, ("model",), draft_tokens=k))
    assert accepted["model"] > 10 and accepted["auto"] > 10, accepted
    assert not eng.decoder.target.verifies_alternates  # (rows beside the causal ones: not through a convolution)


def test_lfm2_fp32_matches_plain_decoding_and_seeded_sampling_repeats(lfm2):
    import edgespec

    eng = edgespec.load(lfm2["fp32"], memory=False)
    list(_plain_and(eng, PROMPT, ("prompt-lookup", "suffix", "auto"), tokens=64))
    a = eng.generate(PROMPT, max_new_tokens=40, temperature=0.9, seed=7, drafter="auto", ignore_eos=True)
    eng.generate("something else entirely", max_new_tokens=10, drafter="auto", ignore_eos=True)
    b = eng.generate(PROMPT, max_new_tokens=40, temperature=0.9, seed=7, drafter="auto", ignore_eos=True)
    assert a.token_ids == b.token_ids


def test_a_turn_that_extends_the_last_one_reads_only_its_new_tokens(lfm2):
    """A prompt that extends what the cache holds keeps the held positions (the states are at its end, or reached
    from the recent calls' inputs); its reply is a fresh engine's."""
    import edgespec

    eng = edgespec.load(lfm2["pair"], memory=False)
    first = eng.generate(PROMPT, max_new_tokens=20, drafter="auto", ignore_eos=True)
    follow = PROMPT + eng.tokenizer.decode(first.token_ids) + " nine ten"
    again = eng.generate(follow, max_new_tokens=20, drafter="auto", ignore_eos=True)
    assert again.stats["reused_prompt_tokens"] > len(eng.tokenizer.encode(PROMPT))
    fresh = edgespec.load(lfm2["pair"], memory=False)
    assert fresh.generate(follow, max_new_tokens=20, drafter="auto", ignore_eos=True).token_ids == again.token_ids


def test_a_prefix_out_of_the_states_reach_is_read_again(lfm2, monkeypatch):
    """The conv inputs of the last CONV_KEEP positions are kept: a prompt whose shared prefix ends further back is
    read from its start (the KV cache alone could have kept it), and its reply is a fresh engine's."""
    import edgespec
    import edgespec.manifest as manifest

    monkeypatch.setattr(manifest, "CONV_KEEP", 4)
    eng = edgespec.load(lfm2["fp32"], memory=False)
    eng.generate(PROMPT, max_new_tokens=30, drafter="none", ignore_eos=True)
    target = eng.decoder.target
    shorter = PROMPT + " nine"
    n = len(eng.tokenizer.encode(PROMPT))
    assert not target.cache.reachable(n - 2) and target.cache.reachable(target.length)
    # ... and every one of the last CONV_KEEP positions is (session 72, a mutation test: calls dropped a call early)
    conv = target.cache.conv
    assert all(conv.reachable(conv.pos - j) for j in range(5)), (conv.pos, [seg[0] for seg in conv._segments])
    # ... and no further (session 81, a mutation test: a call more was kept), which a seek there names in one line
    assert conv.reachable_from() == conv.pos - 4 and not conv.reachable(conv.pos - 5)
    from edgespec.errors import BundleError

    with pytest.raises(BundleError, match=f"reach back to position {conv.pos - 4}, not {conv.pos - 5}:"):
        conv.seek(conv.pos - 5)
    got = eng.generate(shorter, max_new_tokens=20, drafter="prompt-lookup", ignore_eos=True)
    assert got.stats["reused_prompt_tokens"] == 0
    fresh = edgespec.load(lfm2["fp32"], memory=False)
    assert fresh.generate(shorter, max_new_tokens=20, drafter="prompt-lookup", ignore_eos=True).token_ids == \
        got.token_ids


def _chat(*turns):
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(turns)]


@pytest.mark.parametrize("drafter,bundle", [("none", "pair"), ("auto", "pair"), ("auto", "xk")])
def test_a_conversation_set_aside_is_restored_with_its_conv_states(request, lfm2, drafter, bundle):
    """(session 62) The prompt cache keeps a conversation's KV rows and its convolution layers' states at its last
    positions (``kv.ConvSnapshot``): A, B, then A's next turn restores A (rows and states) and replies as an engine
    that never saw B; on exact-kernels (a row computed alike in any call) with the same logprobs, bit for bit, as a
    fresh engine's prefill of the whole history. The plan gives a conv model a prompt cache now."""
    import edgespec

    if bundle == "xk":
        lfm2 = {"pair": request.getfixturevalue("lfm2_xk")}
    kw = dict(max_new_tokens=12, temperature=0.0, drafter=drafter, logprobs=1)
    a = "one two three four five six seven eight " * 3
    b = "alpha beta gamma delta epsilon " * 4
    ref = edgespec.load(lfm2["pair"], prompt_cache_mb=0, memory=False)
    a1 = ref.generate(_chat(a), **kw)
    follow = _chat(a, a1.text, "nine ten")
    want = ref.generate(follow, **kw)
    eng = edgespec.load(lfm2["pair"], prompt_cache_mb=16, memory=False)
    assert eng.plan.prompt_cache > 0 and not eng.plan.warnings
    assert eng.generate(_chat(a), **kw).token_ids == a1.token_ids
    eng.generate(_chat(b), **kw)
    got = eng.generate(follow, **kw)
    assert got.stats["restored_prompt_tokens"] > 20, got.stats
    assert got.token_ids == want.token_ids
    fresh = edgespec.load(lfm2["pair"], prompt_cache_mb=0, memory=False).generate(follow, **kw)
    assert fresh.token_ids == want.token_ids
    if bundle == "xk":
        assert [d["logprob"] for d in got.logprobs] == [d["logprob"] for d in fresh.logprobs]


def test_a_kept_conversation_whose_states_do_not_reach_the_shared_prefix_is_read_again(lfm2, monkeypatch):
    """A kept sequence's states cover its last CONV_KEEP positions: a prompt sharing a shorter prefix with it is not
    restored from it (its states there are gone) but read again, with a fresh engine's reply; one sharing the whole
    of it is restored."""
    import edgespec
    import edgespec.manifest as manifest

    monkeypatch.setattr(manifest, "CONV_KEEP", 4)
    kw = dict(max_new_tokens=10, temperature=0.0, drafter="none")
    a = "one two three four five six seven eight " * 3
    eng = edgespec.load(lfm2["fp32"], prompt_cache_mb=16, memory=False)
    eng.generate(a, **{**kw, "max_new_tokens": 1})  # (A's positions alone in the cache)
    eng.generate("alpha beta gamma delta epsilon " * 4, **kw)  # (A kept, its states at its last 4 positions)
    n = len(eng.tokenizer.encode(a))
    early = eng.generate(a[: len(a) // 2] + " zeta", **kw)  # (shares about half of A: before its states)
    assert early.stats["restored_prompt_tokens"] == 0
    fresh = edgespec.load(lfm2["fp32"], prompt_cache_mb=0, memory=False)
    assert early.token_ids == fresh.generate(a[: len(a) // 2] + " zeta", **kw).token_ids
    whole = a + " nine ten"
    got = eng.generate(whole, **kw)
    assert got.stats["restored_prompt_tokens"] >= n - 1, (got.stats, n)
    assert got.token_ids == fresh.generate(whole, **kw).token_ids


@pytest.mark.parametrize("other", ["you are a helpful bot alpha beta gamma delta epsilon alpha beta gamma delta",
                                   "alpha beta gamma delta epsilon alpha beta gamma delta epsilon"])
def test_a_conversation_set_aside_by_one_sharing_its_first_tokens_is_kept(lfm2, monkeypatch, other):
    """(a review) A, then B sharing A's first tokens (a system prompt, a chat template's first tokens) further back than
    the states reach: the prefill reads B from its start, and A is kept first (the cache was reset before the prompt
    cache saw it: nothing past the states' reach from a shared start was ever kept); A's next turn restores it. B
    sharing nothing: kept as well."""
    import edgespec
    import edgespec.manifest as manifest

    monkeypatch.setattr(manifest, "CONV_KEEP", 4)
    kw = dict(max_new_tokens=10, temperature=0.0, drafter="none")
    a = "you are a helpful bot " + "one two three four five six seven eight " * 3
    eng = edgespec.load(lfm2["fp32"], prompt_cache_mb=16, memory=False)
    eng.generate(a, **kw)
    held = eng.decoder.target.cache.ids.tolist()  # (A and its reply: past the states' reach from its start)
    eng.generate(other, **kw)
    assert eng.prompt_cache_stats()["saves"] == 1
    t = eng.decoder.target
    t.prefill(held + [int(x) for x in eng.tokenizer.encode(" nine ten")][-2:])
    assert t.last_restored > 20


@pytest.mark.parametrize("bundle", ["pair", "xk"])
def test_a_prompt_cache_file_carries_conv_states_across_engines(request, lfm2, bundle, tmp_path):
    """A prompt cache file keeps each conversation's conv states beside its rows (members conv_states_i_j and
    conv_inputs_i_j): the next engine restores A and replies as an uninterrupted chat (exact-kernels: its logprobs
    bit for bit); a file whose conv starts are not positions within its entries is refused in one line."""
    import json
    import zipfile

    import edgespec
    from edgespec.errors import StoreError

    b = request.getfixturevalue("lfm2_xk") if bundle == "xk" else lfm2["pair"]
    kw = dict(max_new_tokens=10, temperature=0.0, drafter="auto", logprobs=1)
    a = "one two three four five six seven eight " * 3
    ref = edgespec.load(b, prompt_cache_mb=0, memory=False)
    a1 = ref.generate(_chat(a), **kw)
    follow = _chat(a, a1.text, "nine ten")
    want = edgespec.load(b, prompt_cache_mb=0, memory=False).generate(follow, **kw)
    f = tmp_path / "pc.npz"
    with edgespec.load(b, prompt_cache_mb=16, prompt_cache_file=f, memory=False) as eng:
        eng.generate(_chat(a), **kw)
    with zipfile.ZipFile(f) as z:
        names = set(z.namelist())
        assert {"conv_states_0_0.npy", "conv_inputs_0_1.npy"} <= names, names
    with edgespec.load(b, prompt_cache_mb=16, prompt_cache_file=f, memory=False) as eng:
        got = eng.generate(follow, **kw)
    assert got.stats["restored_prompt_tokens"] > 20 and got.token_ids == want.token_ids
    if bundle == "xk":
        assert [d["logprob"] for d in got.logprobs] == [d["logprob"] for d in want.logprobs]
    bad = tmp_path / "bad.npz"
    with zipfile.ZipFile(f) as z, zipfile.ZipFile(bad, "w") as out:
        for name in z.namelist():
            data = z.read(name)
            if name == "meta.npy":
                meta = json.loads(bytes(np.load(z.open(name))).decode())
                meta["conv_starts"] = [10 ** 6] * len(meta["lengths"])
                import io

                buf = io.BytesIO()
                np.save(buf, np.frombuffer(json.dumps(meta).encode(), np.uint8))
                data = buf.getvalue()
            out.writestr(name, data)
    with pytest.raises(StoreError, match="convolution starts are not a list of positions") as e:
        edgespec.load(b, prompt_cache_mb=16, prompt_cache_file=bad, memory=False)
    assert "\n" not in str(e.value)


def test_the_prompt_cache_of_a_conv_model_stays_within_its_budget(lfm2):
    """(a review) An entry's conv states count in the budget when room is made for it (they were counted once kept,
    not when the older entries were evicted: a 1 MiB cache held 1,060,832 bytes)."""
    import edgespec

    eng = edgespec.load(lfm2["fp32"], prompt_cache_mb=1, memory=False)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    for i in range(30):
        prompt = " ".join(words[(i + j * 7) % len(words)] for j in range(25)) + f" {i}"
        eng.generate(prompt, max_new_tokens=8, temperature=0.0, drafter="none")
        s = eng.prompt_cache_stats()
        assert s["bytes"] <= s["budget"], (i, s)
    assert s["saves"] > 5 and s["evictions"] > 0, s


@pytest.mark.parametrize("new", [3, 16])  # (3: the prompt's call still kept, older than the snapshot's start)
def test_a_snapshot_restores_every_position_it_covers(lfm2, monkeypatch, new):
    """(a review) A snapshot restores, at every position it covers, the state the same calls left there (read back by
    ``seek`` on a twin engine), over another conversation's states; and seeking back within the restored positions
    gives them again. (Off by one, a state from the wrong call, a restore keeping the other conversation's calls: each
    passed the tests above.)"""
    import edgespec
    import edgespec.manifest as manifest

    monkeypatch.setattr(manifest, "CONV_KEEP", 6)
    eng = edgespec.load(lfm2["fp32"], prompt_cache_mb=0, memory=False)
    t = eng.decoder.target
    eng.generate(PROMPT, max_new_tokens=new, drafter="none", ignore_eos=True)  # (one-token calls: kept ones trimmed)
    conv, ids = t.cache.conv, t.cache.ids.tolist()
    snap = conv.snapshot(len(ids))
    assert 0 < snap.start and snap.end == len(ids)
    twin = edgespec.load(lfm2["fp32"], prompt_cache_mb=0, memory=False)  # (the same calls: the same bits)
    twin.generate(PROMPT, max_new_tokens=new, drafter="none", ignore_eos=True)
    rc = twin.decoder.target.cache.conv
    assert twin.decoder.target.cache.ids.tolist() == ids
    want = {}
    for p in range(snap.end, snap.start - 1, -1):
        rc.seek(p)
        want[p] = _states(rc)
    other = "alpha beta gamma delta epsilon zeta"
    eng.generate(other, max_new_tokens=8, drafter="none", ignore_eos=True)
    for p in range(snap.start, snap.end + 1):
        conv.restore(snap, p)
        assert conv.pos == p and _same(_states(conv), want[p]), p
    eng.generate(other, max_new_tokens=8, drafter="none", ignore_eos=True)
    conv.restore(snap, snap.end)
    for p in range(snap.end, snap.start - 1, -1):
        conv.seek(p)
        assert _same(_states(conv), want[p]), ("seek back", p)
    with pytest.raises(ValueError, match="cannot restore position"):
        conv.restore(snap, snap.start - 1)


def test_a_text_scored_after_a_long_generation_reads_it_from_the_start(lfm2, monkeypatch):
    """(a review) ``score`` reads a text from position 0 without a prefill: after a generation past the states'
    reach it failed with an untyped RuntimeError. Position 0's states are zeros: always reachable."""
    import edgespec
    import edgespec.manifest as manifest

    monkeypatch.setattr(manifest, "CONV_KEEP", 4)
    eng = edgespec.load(lfm2["fp32"], memory=False)
    eng.generate(PROMPT, max_new_tokens=40, drafter="auto", ignore_eos=True)
    assert eng.decoder.target.cache.conv.reachable_from() > 0
    got = eng.score(PROMPT)
    fresh = edgespec.load(lfm2["fp32"], memory=False)
    assert got == fresh.score(PROMPT)


def test_a_call_wider_than_the_conv_buffers_grows_them(lfm2, monkeypatch):
    """A profile's prefill chunk may be longer than the buffer each call's conv inputs are written into: it grows."""
    import edgespec
    import edgespec.manifest as manifest

    monkeypatch.setattr(manifest, "CONV_CALL", 8)
    eng = edgespec.load(lfm2["fp32"], memory=False)
    small = eng.generate(PROMPT, max_new_tokens=12, drafter="suffix", ignore_eos=True)
    assert eng.decoder.target.cache.conv.max_call > 8
    monkeypatch.undo()
    fresh = edgespec.load(lfm2["fp32"], memory=False)
    assert fresh.generate(PROMPT, max_new_tokens=12, drafter="suffix", ignore_eos=True).token_ids == small.token_ids


def test_the_state_after_a_rollback_is_the_one_a_shorter_call_writes(lfm2):
    """The unit under the rest: after a call of 6 tokens rolled back to 2 of them, each conv layer's state is,
    bitwise, what a call of those 2 tokens writes (scripts/probe_conv_state.py's question 3)."""
    import edgespec

    eng = edgespec.load(lfm2["fp32"], memory=False)
    lm = eng.decoder.target
    ids = eng.tokenizer.encode(PROMPT)
    lm.prefill(ids[:10])
    lm.forward(ids[10:16])
    lm.rewind(4)
    lm.cache.conv.seek(12)  # (what the next call does first: every layer's state set to position 12's)
    rolled = _states(lm.cache.conv)
    lm.reset()
    lm.prefill(ids[:10])
    lm.forward(ids[10:12])
    assert len(rolled) == 2 and _same(rolled, _states(lm.cache.conv))
    # (a review: each layer checked here, the last one too, whose error no later layer would show)
    # a rollback across two calls forgets the later call's positions (session 72, a mutation test: kept, a later
    # prompt sharing the new tokens up to one of them would have read the old tokens' states there)
    lm.reset()
    lm.prefill(ids[:10])
    lm.forward(ids[10:12])
    lm.forward(ids[12:16])
    lm.rewind(5)
    lm.cache.conv.seek(11)
    assert lm.cache.conv.reachable(11) and lm.cache.conv.reachable(10)
    assert not any(lm.cache.conv.reachable(p) for p in range(12, 17))


def test_a_snapshot_covers_the_last_kept_positions_and_owns_its_bytes(lfm2, monkeypatch):
    """(session 81, a mutation test of ConvStates) What the prompt cache relies on at a snapshot's edges: it covers
    exactly the last CONV_KEEP positions, and none past the kept calls (nor, with no call kept, any position but the
    current one); a cut or a restore outside it is refused; its byte count, which the budget adds, is its arrays', and
    a cut one's arrays are their own (a view kept its whole base alive, past the budget); and one taken with no call
    kept is a copy, which the next call does not write over."""
    import edgespec
    import edgespec.manifest as manifest

    monkeypatch.setattr(manifest, "CONV_KEEP", 6)
    eng = edgespec.load(lfm2["fp32"], prompt_cache_mb=0, memory=False)
    lm = eng.decoder.target
    conv = lm.cache.conv
    eng.generate(PROMPT, max_new_tokens=16, drafter="none", ignore_eos=True)
    p, n = conv.pos, lm.length  # (the last token's call ran: the cache holds one position less)
    assert conv.snapshot(p + 1) is None
    whole = conv.snapshot(p)
    assert (whole.start, whole.end) == (p - 6, p)
    snap = conv.snapshot(n)
    assert (snap.start, snap.end) == (p - 6, n)
    assert snap.nbytes == sum(4 * cl.channels * (cl.past.shape[2] + n - p + 6) for cl in conv.layers)
    cut = snap.cut(n - 2)
    assert cut.end == n - 2 and all(x.flags.owndata for x in cut.inputs)
    assert snap.cut(snap.start - 1) is None and snap.cut(n + 1) is None
    with pytest.raises(ValueError, match="cannot restore position"):
        conv.restore(snap, n + 1)
    lm.rewind(n - snap.start)
    conv.restore(snap, snap.start)  # (no call kept now: the states at snap.start only)
    assert conv.snapshot(snap.start + 1) is None and conv.snapshot(snap.start - 1) is None
    bare, at_start = conv.snapshot(snap.start), _states(conv)
    assert (bare.start, bare.end) == (snap.start, snap.start)
    lm.forward(eng.tokenizer.encode(" nine ten"))
    assert not _same(_states(conv), at_start)
    conv.restore(bare, bare.start)
    assert _same(_states(conv), at_start)


def test_a_rollback_interrupted_between_layers_claims_no_position(lfm2, monkeypatch):
    """(session 81, a mutation test) Ctrl-C while a rollback writes the layers' states one by one: they claim no
    position until every layer is written, so going on from where the model was sets them all again (claimed, the
    model went on with its first layer's state rolled back and the second's not)."""
    import edgespec

    eng = edgespec.load(lfm2["fp32"], memory=False)
    lm = eng.decoder.target
    conv = lm.cache.conv
    ids = eng.tokenizer.encode(PROMPT)
    lm.prefill(ids[:10])
    lm.forward(ids[10:16])
    at16, real, calls = _states(conv), np.concatenate, []

    def interrupted(*a, **kw):  # (the second layer's state)
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(np, "concatenate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        conv.seek(12)
    monkeypatch.undo()
    assert len(calls) == 2 and not np.array_equal(conv.layers[0].past, at16[0])  # (the first layer was written)
    conv.seek(16)
    assert _same(_states(conv), at16)


def test_a_call_after_the_conv_buffers_grew_is_rolled_back_from_its_own_inputs(lfm2, monkeypatch):
    """(session 81, a mutation test) A call of a width seen before the buffers grew writes its conv inputs where they
    are kept from: into the new buffer, not the old one's view (kept, the rollback into it read the wide call's).
    The same calls with buffers wide enough from the start are the reference."""
    import edgespec
    import edgespec.manifest as manifest

    states = []
    for call, grown in ((8, 20), (64, 64)):
        monkeypatch.setattr(manifest, "CONV_CALL", call)
        eng = edgespec.load(lfm2["fp32"], memory=False)
        lm = eng.decoder.target
        ids = eng.tokenizer.encode(PROMPT + " " + PROMPT)
        lm.forward(ids[:2])  # (a call of 2: its view of the buffers made)
        lm.forward(ids[2:22])  # (of 20: the buffers grow past the 16 of the calls at load)
        lm.forward(ids[22:24])
        lm.forward(ids[24:26])
        lm.rewind(3)
        lm.cache.conv.seek(23)
        assert lm.cache.conv.max_call == grown
        states.append(_states(lm.cache.conv))
    assert _same(*states)


@pytest.fixture(scope="module")
def lfm2_xk(lfm2):
    from edgespec_export.kernels import apply_to_bundle

    return apply_to_bundle(lfm2["pair"], lfm2["root"] / "xk")


def test_exact_kernels_take_lfm2(lfm2_xk):
    """edgespec's INT4 kernel and attention in the attention layers and every matrix (the convolutions stay
    onnxruntime's, which compute a position alike at every call width): one-token calls, float16 KV caches beside
    float32 conv states, greedy output equal to plain decoding under every drafter."""
    import edgespec

    eng = edgespec.load(lfm2_xk, memory=False)
    t = eng.decoder.target
    assert t.spec.kernels == "edgespec-q4" and t.spec.kv_dtype == "float16" and t.spec.conv_layers
    assert (t.min_width, t.width_multiple) == (1, 1) and not t.verifies_alternates
    for prompt in (PROMPT, "the quick brown fox jumps over the lazy dog and the cat"):
        list(_plain_and(eng, prompt, ("model", "prompt-lookup", "suffix", "auto")))


def test_what_a_conv_model_cannot_do_is_one_line(lfm2, tmp_path, capsys):
    """The cuda layout and a GPU provider (the states are set on the host): each refused in one line; a manifest whose conv layers are malformed too,
    or whose io names conv states the graph lacks (at load)."""
    import json
    import shutil

    import edgespec
    from edgespec.cli import main
    from edgespec.errors import BundleError, ManifestError
    from edgespec.manifest import load_manifest

    for argv, message in ((["export", str(lfm2["target"]), "-o", str(tmp_path / "cuda"), "--device", "cuda",
                            "--target-precision", "int4", "--no-quality"],
                           "runs on the CPU only for now"),):
        with pytest.raises(SystemExit) as e:
            main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 6 and message in err[-1] and "Traceback" not in "".join(err), err[-1:]
        assert not (tmp_path / "cuda").exists()
    import edgespec.onnx_lm as onnx_lm

    with pytest.MonkeyPatch.context() as mp:  # (a GPU that runs: the states are set on the host)
        mp.setattr(onnx_lm, "_check_running", lambda *a: "cuda")
        with pytest.raises(BundleError, match="has convolution layers, which edgespec runs on the CPU only") as e:
            edgespec.load(lfm2["fp32"], memory=False)
        assert "\n" not in str(e.value)
    b = tmp_path / "edited"
    shutil.copytree(lfm2["fp32"], b)
    raw = json.loads((b / "edgespec.json").read_text())
    for bad, match in (([[0, 64, 2], [0, 64, 2]], "each layer once"), ([[9, 64, 2]], "below 4"),
                       ([[0, 0, 2]], "triples of integers")):
        raw["models"]["target"]["conv_layers"] = bad
        (b / "edgespec.json").write_text(json.dumps(raw))
        with pytest.raises(ManifestError, match=match) as e:
            load_manifest(b)
        assert "\n" not in str(e.value)
    raw["models"]["target"]["conv_layers"] = [[0, 64, 2], [2, 64, 2]]
    io = raw["models"]["target"]["io"]
    for edit, match in ((lambda io: io.update(conv_input="conv_input"), r"io.conv_input must contain one %d"),
                        (lambda io: io.pop("conv_input"), "names past_conv, present_conv but not all"),
                        (lambda io: [io.pop(k) for k in ("past_conv", "present_conv", "conv_input")],
                         "has conv_layers but its io names no past_conv")):
        raw["models"]["target"]["io"] = dict(io)
        edit(raw["models"]["target"]["io"])
        (b / "edgespec.json").write_text(json.dumps(raw))
        with pytest.raises(ManifestError, match=match) as e:
            load_manifest(b)
        assert "\n" not in str(e.value)
    from dataclasses import replace

    from edgespec.onnx_lm import OnnxLM
    from edgespec.providers import choose

    spec = load_manifest(lfm2["fp32"]).target
    for name in ("past_conv", "conv_input"):  # (session 97, ON66, ON67) conv states' names the graph lacks: at load
        with pytest.raises(BundleError, match=r"^the target graph has no 'no_such\.\d+' \(and \d+ more names\) that"):
            OnnxLM(replace(spec, io=replace(spec.io, **{name: "no_such.%d"})), 64, choose(["cpu"]), min_width=1)


def test_a_graph_whose_convolutions_are_not_the_builder_s_is_refused(tmp_path):
    """export/conv.py reads the builder's conv layers: a CausalConvWithState whose state is no graph input, one with a
    state window, a state without static channels: each an ExportError in one line, the graph left as it was."""
    import onnx
    from onnx import TensorProto, helper

    from edgespec.errors import ExportError
    from edgespec_export.conv import expose_conv_inputs

    def graph(path, state_dims=("batch_size", 64, 2), state_input=True, **attrs):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch_size", 64, "sequence_length"])
        st = helper.make_tensor_value_info("past.0.conv", TensorProto.FLOAT, list(state_dims))
        node = helper.make_node("CausalConvWithState", ["x", "w", "", "past.0.conv" if state_input else "other"],
                                ["y", "present.0.conv"], domain="com.microsoft", **attrs)
        w = helper.make_tensor("w", TensorProto.FLOAT, [64, 1, 3], [0.0] * 192)
        outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "present.0.conv")]
        g = helper.make_graph([node], "g", [x] + ([st] if state_input else []), outs, [w])
        onnx.save(helper.make_model(g), str(path))
        return path

    for kw, match in (({"state_input": False}, "reads no conv state input"),
                      ({"state_window": 4}, "keeps a state window"),
                      ({"state_dims": ("batch_size", "channels", 2)}, "no static")):
        path = graph(tmp_path / "m.onnx", **kw)
        before = path.read_bytes()
        with pytest.raises(ExportError, match=match) as e:
            expose_conv_inputs(path, "past.%d.conv")
        assert "\n" not in str(e.value) and path.read_bytes() == before
    path = graph(tmp_path / "ok.onnx")
    assert expose_conv_inputs(path, "past.%d.conv") == ((0, 64, 2),)
    assert "conv_input.0" in {o.name for o in onnx.load(str(path)).graph.output}


def test_conv_inputs_are_exposed_per_layer_once_with_the_channels_shape(tmp_path):
    """(session 89) ``expose_conv_inputs`` on two conv layers (3, then 1, in node order) beside an input whose name
    only contains the state pattern: each layer's input an output ``conv_input.N`` of [batch, channels, positions]
    (the state's channels, not its length), the records sorted by layer, the decoy not taken for a layer; a second
    pass adds no output twice; a state input no conv node reads is refused."""
    import onnx
    from onnx import TensorProto, helper

    from edgespec.errors import ExportError
    from edgespec_export.conv import expose_conv_inputs

    def graph(path, layers=(3, 1), unread=()):
        ins, nodes, outs, inits = [], [], [], []
        for layer in layers:
            ins.append(helper.make_tensor_value_info(f"x{layer}", TensorProto.FLOAT, ["batch_size", 48, "s"]))
            ins.append(helper.make_tensor_value_info(f"past.{layer}.conv", TensorProto.FLOAT, ["batch_size", 48, 2]))
            inits.append(helper.make_tensor(f"w{layer}", TensorProto.FLOAT, [48, 1, 3], [0.0] * 144))
            nodes.append(helper.make_node("CausalConvWithState", [f"x{layer}", f"w{layer}", "", f"past.{layer}.conv"],
                                          [f"y{layer}", f"present.{layer}.conv"], domain="com.microsoft"))
            outs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in (f"y{layer}",
                                                                                        f"present.{layer}.conv")]
        for name in ("cache.past.2.conv", *unread):  # (the decoy: the pattern inside another name)
            ins.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch_size", 48, 2]))
        onnx.save(helper.make_model(helper.make_graph(nodes, "g", ins, outs, inits)), str(path))
        return path

    path = graph(tmp_path / "m.onnx")
    assert expose_conv_inputs(path, "past.%d.conv") == ((1, 48, 2), (3, 48, 2))
    assert expose_conv_inputs(path, "past.%d.conv") == ((1, 48, 2), (3, 48, 2))  # (a second pass)
    g = onnx.load(str(path)).graph
    exposed = [o for o in g.output if o.name.startswith("conv_input.")]
    assert sorted(o.name for o in exposed) == ["conv_input.1", "conv_input.3"]
    for o in exposed:
        assert [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] == ["batch_size", 48,
                                                                                    "sequence_length"]
    reads = {n.output[0]: n.input[0] for n in g.node if n.op_type == "Identity"}
    assert reads == {"conv_input.1": "x1", "conv_input.3": "x3"}
    with pytest.raises(ExportError, match="3 conv state inputs and 2 CausalConvWithState nodes"):
        expose_conv_inputs(graph(tmp_path / "u.onnx", unread=("past.5.conv",)), "past.%d.conv")


def test_an_lfm2_gguf_exports_as_its_folder_does(lfm2, tmp_path):
    """An LFM2 GGUF (llama.cpp's layout: KV heads per layer, 0 for a convolution; kernels [channels, length]) exports
    as its folder: the same conv layers, the same greedy tokens at fp32, speculative output equal to plain."""
    import edgespec
    from edgespec_export import export_bundle
    from tiny import write_gguf

    gguf = write_gguf(lfm2["target"], tmp_path / "lfm2.gguf", arch="lfm2")
    b = export_bundle(str(gguf), tmp_path / "b", max_context=256, target_precision="fp32", quality=False)
    eng, folder = edgespec.load(b, memory=False), edgespec.load(lfm2["fp32"], memory=False)
    assert eng.manifest.target.conv_layers == folder.manifest.target.conv_layers
    (_, got), = _plain_and(eng, PROMPT, ("auto",), tokens=32)
    assert got.token_ids == folder.generate(PROMPT, max_new_tokens=32, drafter="none", ignore_eos=True).token_ids
