"""A reduced draft vocabulary (export --drafter-vocab N, ``edgespec drafter-vocab``): the drafter's
lm_head cut to N tokens. The graph's logits are the full head's at the kept ids, greedy and sampled
speculative output stay exact, the kept ids are part of the checked bundle, bad N are refused."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import edgespec
from conftest import BUNDLES, dead_pid, file_bytes, pool_session_options
from edgespec.cli import main as cli
from edgespec.decoder import Decoder
from edgespec.drafters import ModelDrafter
from edgespec.errors import BundleError, ExportError, ManifestError
from edgespec.manifest import MANIFEST_NAME, Manifest, load_manifest, sha256_file
from edgespec.onnx_lm import OnnxLM
from edgespec.providers import choose
from edgespec.sampling import SamplingParams, distribution
from test_decoder import _chi2, _chi2_crit, _exact_sequence_probs, _sample_runs
from test_exactness import PROMPTS, _assert_all_equal, _greedy_all
from tiny import FakeLM

N = 300  # of the tiny tokenizer's 372
# odd ids first: the kept set is not a prefix of the vocabulary, so a head that kept the first N rows
# or a drafter that forgot to map its argmax back would be caught
SCATTERED = list(range(371, 3, -2))


def _reduce(bundle, tmp_path, n=N, name="reduced", ranked=SCATTERED):
    from edgespec_export.head import apply_to_bundle

    return apply_to_bundle(bundle, n, tmp_path / name, ranked=ranked)


def _drafter_logits(bundle, ids):
    m = load_manifest(bundle)
    lm = OnnxLM(m.drafter, 64, choose(["cpu"]), min_width=1)
    return lm, np.concatenate([lm.forward(ids[:20]), lm.forward(ids[20:21]), lm.forward(ids[21:25])])


@pytest.mark.parametrize("bundle", ["tiny_bundle", "tiny_fp8_bundle"])  # fp32 MatMul head; int8 MatMulNBits head
def test_reduced_head_computes_the_full_heads_logits_at_the_kept_ids(bundle, request, tmp_path):
    src = request.getfixturevalue(bundle)
    out = _reduce(src, tmp_path)
    m = load_manifest(out, deep=True)
    ids = m.drafter.load_head_ids(m.target.vocab_size)
    assert m.drafter.head_size == N and ids.shape == (N,) and (np.diff(ids) > 0).all() and ids[-1] == 371
    assert f"drafter/{m.drafter.head_ids.name}" in m.drafter.files
    assert not (out / "drafter" / "genai_config.json").exists()  # genai would read column indices as ids
    seq = [(37 * i + 11) % 360 for i in range(25)]
    lm_full, full = _drafter_logits(src, seq)
    lm_red, red = _drafter_logits(out, seq)
    assert red.shape == (25, N) and lm_red.logits_width == N and lm_full.logits_width == m.drafter.vocab_size
    np.testing.assert_allclose(red, full[:, ids], rtol=1e-4, atol=1e-4)
    # the special tokens are kept, the rest follows id order; the source bundle is untouched
    tj = json.loads((m.tokenizer_dir / "tokenizer.json").read_text())
    assert {t["id"] for t in tj["added_tokens"]} <= set(ids.tolist()) and set(m.eos_token_ids) <= set(ids.tolist())
    load_manifest(src, deep=True)
    assert load_manifest(src).drafter.head_ids is None


@pytest.fixture(scope="module")
def tiny_reduced_int4(tmp_path_factory, tiny_dirs):
    """INT4 target and INT4 drafter exported with ``drafter_vocab=N`` (the export path), ranked by
    a corpus of code only (so the kept set is not the first N ids)."""
    from conftest import _export

    corpus = tmp_path_factory.mktemp("corpus") / "code.py"
    corpus.write_text("def hello(world):\n    return world + 1\nimport numpy as np\nx = np.zeros(3)\n" * 20)
    return _export(tmp_path_factory, "tiny-int4-v300", tiny_dirs["qwen2"], drafter=str(tiny_dirs["drafter"]),
                   target_precision="int4", drafter_precision="int4", drafter_vocab=N,
                   drafter_vocab_corpus=[str(corpus)])


def test_export_with_drafter_vocab_is_exact_and_drafts(tiny_reduced_int4):
    m = load_manifest(tiny_reduced_int4, deep=True)
    assert m.drafter.head_size == N and m.drafter.precision == "int4" and "code.py" in m.drafter.head_source
    assert m.drafter.load_head_ids(m.target.vocab_size)[-1] >= N  # not the first N ids
    assert m.drafter.cpu_resident_bytes  # measured again after the cut
    eng = edgespec.load(tiny_reduced_int4, max_context=256)
    d = eng.decoder.drafters["model"]
    assert d.head_ids is not None and d.head_ids.shape == (N,) and d.lm.logits_width == N
    accepted = 0
    for p in PROMPTS:
        _assert_all_equal(_greedy_all(eng, p, 40), p)
        eng.reset()
        accepted += eng.generate(p, max_new_tokens=40, drafter="model", draft_tokens=3).stats["accepted"]
    assert accepted > 20  # the reduced drafter's mapped tokens are accepted: the ids map back right


def test_the_predicted_acceptance_is_measured_on_the_cut_head(tiny_bundle, tmp_path):
    """(session 49, a review) The manifest's predicted greedy acceptance was the full head's after --drafter-vocab
    (a head cut to 60 tokens said 0.54 where it agreed on 0.20): measured again as the cut head drafts. Checked here
    by the full head's drafter with its logits outside the kept ids masked, which the cut head computes."""
    from edgespec_export.quality import AGREE_TOKENS, TEXTS

    from edgespec.tokenizer import Tokenizer

    src = load_manifest(tiny_bundle)
    cut = load_manifest(_reduce(tiny_bundle, tmp_path, n=40))
    kept = cut.drafter.load_head_ids(cut.target.vocab_size)
    tok = Tokenizer.of(src)
    ctx = min(512, src.target.max_context, src.drafter.max_context)
    t, d = OnnxLM(src.target, ctx, choose(["cpu"])), OnnxLM(src.drafter, ctx, choose(["cpu"]), min_width=1)
    hits = total = 0
    for text in TEXTS[:4]:
        ids = tok.encode(text, add_special=False)[: ctx // 2][:32]
        logits, cont = t.forward(ids)[-1], []
        for _ in range(min(AGREE_TOKENS, ctx - len(ids))):
            cont.append(int(np.argmax(logits)))
            logits = t.forward([cont[-1]])[-1]
        t.reset()
        dl = d.forward(ids + cont[:-1])[len(ids) - 1:][: len(cont)]
        d.reset()
        hits += int((kept[dl[:, kept].argmax(-1)] == np.array(cont)).sum())
        total += len(cont)
    q = cut.drafter.quality
    assert q.agreement_tokens == total and q.greedy_agreement_with_target == round(hits / total, 4)
    assert q.greedy_agreement_with_target != src.drafter.quality.greedy_agreement_with_target


def test_sampled_generation_with_a_reduced_head_runs_and_proposes_kept_tokens(tiny_reduced_int4):
    eng = edgespec.load(tiny_reduced_int4, max_context=256)
    d = eng.decoder.drafters["model"]
    kept = set(d.head_ids.tolist())
    seen = []
    real = d.draft

    def spy(ctx, k, sp, rng, **kw):
        out = real(ctx, k, sp, rng, **kw)
        seen.extend(out.tokens)
        assert out.probs is not None and all(q.idx is not None and set(q.idx.tolist()) <= kept for q in out.probs)
        return out

    d.draft = spy
    r = eng.generate(PROMPTS[0], max_new_tokens=30, drafter="model", temperature=0.8, top_p=0.95, seed=3)
    assert len(r.token_ids) == 30 and seen and set(seen) <= kept


def test_greedy_draft_maps_back_to_token_ids():
    """A reduced head proposes what the full head would with every other token masked out."""
    from edgespec.kv import TokenBuffer

    kept = np.array([1, 4, 5, 9, 11, 12])
    target = FakeLM(16, seed=2)
    full_table = target.table + np.random.default_rng(5).normal(0, 0.5, target.table.shape)
    masked = np.full_like(full_table, -1e9)
    masked[:, kept] = full_table[:, kept]
    red = ModelDrafter(FakeLM(16, table=full_table[:, kept]), 16, head_ids=kept)
    ref = ModelDrafter(FakeLM(16, table=masked), 16)
    rng = np.random.default_rng(0)
    for seed in range(20):
        prompt = np.random.default_rng(seed).integers(0, 16, size=6).tolist()
        for d in (red, ref):
            d.reset()
            d.begin(prompt)
        ctx = TokenBuffer(prompt)
        a, b = red.draft(ctx, 4, SamplingParams(), rng).tokens, ref.draft(ctx, 4, SamplingParams(), rng).tokens
        assert a == b and set(a) <= set(kept.tolist())


class _NoRepeat:
    """A structured output's constraint (constrain.Constraint's protocol) over 16 ids: tokens of ``ALLOWED`` only,
    never the last one again."""

    ALLOWED = (1, 3, 5, 9, 12, 14)

    def __init__(self):
        self.pushed = []

    def mask(self):
        last = self.pushed[-1] if self.pushed else None
        return np.array([t in self.ALLOWED and t != last for t in range(16)])

    def push(self, t):
        assert self.mask()[t], (self.pushed, t)  # a draft never holds a token the grammar forbids
        self.pushed.append(t)
        return True

    def pop(self):
        self.pushed = []


def test_a_reduced_head_drafts_within_the_grammar():
    """(drafters.py ModelDrafter.draft: ``allowed[head]``) under a grammar, the reduced head's logits are masked by
    what the grammar allows of its kept ids (column j is id head[j]): the draft is what the full head drafts under
    the same grammar with every other id masked out; read at the first N ids instead, it drafts forbidden tokens."""
    from edgespec.kv import TokenBuffer

    kept = np.array([0, 1, 4, 5, 9, 11, 12, 14])
    target = FakeLM(16, seed=2)
    full_table = target.table + np.random.default_rng(5).normal(0, 0.5, target.table.shape)
    masked = np.full_like(full_table, -1e9)
    masked[:, kept] = full_table[:, kept]
    red = ModelDrafter(FakeLM(16, table=full_table[:, kept]), 16, head_ids=kept)
    ref = ModelDrafter(FakeLM(16, table=masked), 16)
    lengths = []
    for seed in range(20):
        prompt = np.random.default_rng(seed).integers(0, 16, size=6).tolist()
        ctx = TokenBuffer(prompt)
        for sp in (SamplingParams(), SamplingParams(1.0)):
            for d in (red, ref):
                d.reset()
                d.begin(prompt)
            a = red.draft(ctx, 4, sp, np.random.default_rng(seed), grammar=_NoRepeat()).tokens
            b = ref.draft(ctx, 4, sp, np.random.default_rng(seed), grammar=_NoRepeat()).tokens
            if sp.greedy:
                assert a == b
            assert set(a) <= set(_NoRepeat.ALLOWED) and all(x != y for x, y in zip(a, a[1:])), a
            lengths.append(len(a))
    assert sum(lengths) > 60


# -- sampling stays exact: q is the reduced head's distribution, zero outside the kept set ---------
VOCAB, KEPT = 4, np.array([0, 2, 3])


def _reduced_factory(cls=ModelDrafter):
    def factory():
        target = FakeLM(VOCAB, seed=7, sharpness=1.0)
        table = target.table + np.random.default_rng(3).normal(0, 1.0, target.table.shape)
        full = FakeLM(VOCAB, table=table)
        red = FakeLM(VOCAB, table=table[:, KEPT])  # logits for the kept ids only
        d = cls(red, VOCAB, head_ids=KEPT)
        d.full = full
        return Decoder(target, (), drafters=[d])
    return factory


@pytest.mark.parametrize("sp", [SamplingParams(1.0), SamplingParams(0.7, top_k=2)])
def test_sampled_speculative_with_reduced_head_follows_target_distribution(sp):
    vocab, n_tokens, runs, prompt = VOCAB, 4, 6000, [1, 2, 1, 2, 1]
    exact = _exact_sequence_probs(FakeLM(vocab, seed=7, sharpness=1.0), prompt, n_tokens, sp)
    counts = _sample_runs(_reduced_factory(), prompt, n_tokens, sp, runs, "model", 2)
    assert any(1 in seq for seq in counts)  # the target still emits the token the head cannot propose
    stat, df = _chi2(counts, exact, runs)
    assert stat < _chi2_crit(df), f"chi2 {stat:.1f} with {df} dof"


class _FullQ(ModelDrafter):
    """The planted bug: drafts sampled from the reduced head, but q taken from the full head."""

    def draft(self, ctx, k, sp, rng):
        out = super().draft(ctx, k, sp, rng)
        if out.probs is not None:
            c = list(ctx.view()) if hasattr(ctx, "view") else list(ctx)
            out.probs = [distribution(self.full.logits_for(c + out.tokens[:i]), sp) for i in range(len(out.tokens))]
        return out


def test_statistical_test_catches_q_from_the_full_head():
    vocab, n_tokens, runs, prompt = VOCAB, 4, 6000, [1, 2, 1, 2, 1]
    sp = SamplingParams(1.0)
    exact = _exact_sequence_probs(FakeLM(vocab, seed=7, sharpness=1.0), prompt, n_tokens, sp)
    counts = _sample_runs(_reduced_factory(_FullQ), prompt, n_tokens, sp, runs, "model", 2)
    stat, df = _chi2(counts, exact, runs)
    assert stat > _chi2_crit(df), f"the planted bug went unnoticed (chi2 {stat:.1f}, {df} dof)"


# -- the manifest and the bundle's checks ------------------------------------------------------
def test_manifest_round_trip_and_schema(tiny_bundle, tmp_path):
    out = _reduce(tiny_bundle, tmp_path)
    m = load_manifest(out)
    again = Manifest.from_dict(m.to_dict(), out)
    assert again.drafter.head_ids == m.drafter.head_ids and again.drafter.head_size == N
    assert again.to_dict() == m.to_dict()
    assert "head_ids" not in load_manifest(tiny_bundle).to_dict()["models"]["drafter"]
    raw = m.to_dict()
    for change, msg in ((lambda d: d.pop("head_ids"), "head_size without head_ids"),
                        (lambda d: d.update(head_size=d["vocab_size"]), "head_size must be in"),
                        (lambda d: d.update(head_size=0), "head_size must be in"),
                        (lambda d: d["files"].pop(d["head_ids"]), "is not one of its files"),
                        (lambda d: d.update(head_ids="../x.npy"), "is not one of its files")):
        bad = json.loads(json.dumps(raw))
        change(bad["models"]["drafter"])
        with pytest.raises(ManifestError, match=msg):
            Manifest.from_dict(bad, out)


def test_integrity_check_catches_tampered_head_ids(tiny_bundle, tmp_path):
    out = _reduce(tiny_bundle, tmp_path)
    path = out / "drafter" / "head_ids.npy"
    ids = np.load(path)
    ids[-1] -= 1  # another token, same size
    np.save(path, ids)
    with pytest.raises(BundleError, match="head_ids.npy does not match its sha256"):
        load_manifest(out)
    # rehashed by hand, the ids themselves are still checked at load (sorted, unique, in range)
    ids[-1] = ids[0]
    np.save(path, ids)
    raw = json.loads((out / MANIFEST_NAME).read_text())
    raw["models"]["drafter"]["files"]["drafter/head_ids.npy"]["sha256"] = sha256_file(path)
    (out / MANIFEST_NAME).write_text(json.dumps(raw))
    with pytest.raises(BundleError, match="not 300 sorted, unique token ids"):
        edgespec.load(out, max_context=128)


def test_head_ids_that_disagree_with_the_graph_are_refused(tiny_bundle, tmp_path):
    out = _reduce(tiny_bundle, tmp_path)
    path = out / "drafter" / "head_ids.npy"
    np.save(path, np.load(path)[:-1])
    raw = json.loads((out / MANIFEST_NAME).read_text())
    d = raw["models"]["drafter"]
    d["files"]["drafter/head_ids.npy"] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
    d["head_size"] = N - 1
    (out / MANIFEST_NAME).write_text(json.dumps(raw))
    with pytest.raises(BundleError, match=rf"logits have {N} entries, the manifest says {N - 1} \(head_size\)"):
        edgespec.load(out, max_context=128)


def test_in_place_rewrite(tiny_fp8_bundle, copy_bundle, monkeypatch):
    import os.path as osp

    from edgespec_export.head import apply_to_bundle

    b = copy_bundle(tiny_fp8_bundle)
    before = file_bytes(b)
    real = osp.ismount  # (session 86: a bundle that is a mount point cannot be replaced: refused before the rewrite)
    monkeypatch.setattr(osp, "ismount", lambda p: str(p) == str(b.resolve()) or real(p))
    with pytest.raises(ExportError, match="is a mount point, which cannot be replaced"):
        apply_to_bundle(b, 256)
    assert file_bytes(b) == before
    assert [p.name for p in b.parent.iterdir()] == [b.name]
    monkeypatch.undo()
    assert apply_to_bundle(b, 256) == b.resolve()
    m = load_manifest(b, deep=True)
    assert m.drafter.head_size == 256 and m.name == tiny_fp8_bundle.name
    assert [p.name for p in b.parent.iterdir()] == [b.name]  # (the replaced tree removed, no stage left)
    with pytest.raises(ExportError, match="already reduced to 256 tokens"):
        apply_to_bundle(b, 128)
    eng = edgespec.load(b, max_context=256)
    _assert_all_equal(_greedy_all(eng, PROMPTS[0], 30), PROMPTS[0])


def test_a_rewrite_through_a_link_names_the_new_bundle_and_its_head_source(tiny_bundle, tmp_path):
    """(session 86, mutation tests of head.py) A bundle named through a symbolic link is rewritten into a new bundle
    whose graphs are its own; the new bundle takes its folder's name; the manifest says how the kept tokens were
    chosen (merge order, or a given ranking); a corpus and a ranking together are refused."""
    from edgespec_export.head import apply_to_bundle

    link = tmp_path / "link"
    link.symlink_to(tiny_bundle, target_is_directory=True)
    out = _reduce(link, tmp_path, name="given")
    m = load_manifest(out, deep=True)
    assert m.name == "given" and load_manifest(tiny_bundle).name == tiny_bundle.name
    for spec in (m.target, m.drafter):
        assert spec.path.is_relative_to(out.resolve()), spec.path
    assert m.drafter.head_ids.is_relative_to(out.resolve())
    assert m.drafter.head_source == "special tokens, then a given ranking, then BPE merge order"
    merge = load_manifest(_reduce(tiny_bundle, tmp_path, name="merge", ranked=()))
    assert merge.drafter.head_source == "special tokens, then BPE merge order (token id)"
    (tmp_path / "c.txt").write_text("some text")
    with pytest.raises(ExportError, match="give a corpus or a ranking of token ids, not both"):
        apply_to_bundle(tiny_bundle, 100, tmp_path / "x", corpus=[tmp_path / "c.txt"], ranked=[5, 6])
    assert not (tmp_path / "x").exists()


def test_a_drafter_with_fewer_rows_than_its_target_keeps_n_of_its_own(tmp_path_factory):
    """(session 86, mutation tests of head.py) A drafter with fewer rows than its target, the tokenizer's added token
    past the drafter's rows (Gemma 3 1B drafting for a larger Gemma 3): drafter-vocab keeps N tokens the drafter has
    (choosing among the target's rows, one kept id fell past the drafter's and the head came out one short)."""
    from conftest import _export
    from edgespec_export.head import apply_to_bundle
    from tiny import make_model, make_tokenizer

    root = tmp_path_factory.mktemp("fewer")
    tok = make_tokenizer()
    drafter = make_model(root / "drafter", "qwen2", seed=3, tokenizer=tok)  # (372 rows)
    target = make_model(root / "target", "qwen2", seed=1, tokenizer=tok, vocab_size=380)  # (Qwen's padding rows)
    tok.add_special_tokens({"additional_special_tokens": ["<image_soft_token>"]})  # (id 372: past the drafter's rows)
    for d in (drafter, target):
        tok.save_pretrained(d)
    src = _export(tmp_path_factory, "fewer-rows", target, drafter=str(drafter), target_precision="fp32",
                  drafter_precision="fp32", max_context=128)
    m = load_manifest(src)
    assert (m.target.vocab_size, m.drafter.vocab_size, m.tokenizer_vocab_size) == (380, 372, 373)
    out = apply_to_bundle(src, 100, root / "cut")
    ids = load_manifest(out, deep=True).drafter.load_head_ids(380)
    assert len(ids) == 100 and ids[-1] < 372 and m.eos_token_ids[0] in ids


def test_a_rewrite_of_a_read_only_bundle_and_a_failed_one_leave_nothing(tiny_bundle, tiny_int4_bundle, tmp_path,
                                                                        monkeypatch):
    """(session 46, a review) the rewrite's copy took a read-only bundle's folder modes: the user (not root) could not
    write the rewritten files into it, and the failed copy (~1 GB for a 1.5B) stayed, rmtree(ignore_errors) unable to
    remove its folders; a failed rewrite to -o left the parent folders it made; exact-kernels copied a bundle whose
    target is not INT4 before refusing it; an in-place rewrite of the working folder left it gone unsaid."""
    import os
    import shutil
    import stat

    from edgespec_export import kernels
    from edgespec_export.head import _copy_tree, staged_rewrite
    from edgespec_export.output import remove_tree

    src = tmp_path / "src"
    shutil.copytree(tiny_bundle, src)
    for d in [src, *(p for p in src.rglob("*") if p.is_dir())]:
        os.chmod(d, 0o555)
    _copy_tree(src, tmp_path / "copy", link=False)
    for d in [tmp_path / "copy", *(p for p in (tmp_path / "copy").rglob("*") if p.is_dir())]:
        assert os.stat(d).st_mode & stat.S_IWUSR, d  # (its rewritten files can be written there)
    ro = tmp_path / "ro"
    shutil.copytree(src, ro)  # (folders 0o555 again, as copytree copies them)
    assert not os.stat(ro / "target").st_mode & stat.S_IWUSR
    remove_tree(ro)
    assert not ro.exists()
    for d in [src, *(p for p in src.rglob("*") if p.is_dir())]:
        os.chmod(d, 0o755)

    def fails(stage):
        raise ExportError("the rewrite failed")

    with pytest.raises(ExportError, match="the rewrite failed"):
        staged_rewrite(src, tmp_path / "a" / "b" / "out", False, fails)
    assert not (tmp_path / "a").exists()
    made = []
    monkeypatch.setattr(kernels, "_check_kv_dtype", lambda *a: made.append(1))
    with pytest.raises(ExportError, match="has a fp32 target: exact-kernels applies to INT4 bundles"):
        kernels.apply_to_bundle(src, tmp_path / "c" / "out")
    assert made and not (tmp_path / "c").exists() and not list(tmp_path.glob(".*partial*"))
    monkeypatch.undo()
    inplace = tmp_path / "inplace"
    shutil.copytree(tiny_int4_bundle, inplace)
    monkeypatch.chdir(inplace / "target")
    r = CliRunner().invoke(cli, ["drafter-vocab", str(inplace), "100"])
    assert r.exit_code == 0 and "working folder was the old one" in r.output, r.output


@pytest.mark.parametrize("n, msg", [(0, "must be a positive number"), (-5, "must be a positive number"),
                                    (372, "not smaller than the vocabulary"), (10**6, "not smaller than the vocabulary"),
                                    (2, "smaller than the 3 special tokens")])
def test_bad_sizes_are_typed_errors_and_cli_exit_codes(tiny_bundle, tmp_path, n, msg):
    from edgespec_export.head import apply_to_bundle

    with pytest.raises(ExportError, match=msg) as e:
        apply_to_bundle(tiny_bundle, n, tmp_path / "x")
    if n <= 0:  # (the API's message: "N = must be ..." in session 66, a review found)
        assert str(e.value) == f"N must be a positive number of tokens, got {n}"
    r = CliRunner().invoke(cli, ["drafter-vocab", "-o", str(tmp_path / "y"), str(tiny_bundle), "--", str(n)])
    if n <= 0:  # (session 65, a review: the CLI's N is a usage error, named as typed; it said "--drafter-vocab")
        assert r.exit_code == 2 and f"Invalid value for 'N': {n} is not in the range x>=1" in r.output, r.output
    else:
        assert r.exit_code == ExportError.exit_code, r.output
        assert msg in r.output and f"N = {n} " in r.output
        # (the command's words, not export's option: session 66, a review)
        assert "--drafter-vocab" not in r.output and "export" not in r.output
    assert r.output.count("\n") == 1 and r.output.startswith("error: ")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_bundle_without_drafter_and_export_options_are_refused(tiny_llama_bundle, tiny_dirs, tmp_path):
    from edgespec_export import export_bundle
    from edgespec_export.head import apply_to_bundle

    with pytest.raises(ExportError, match="has no drafter model"):
        apply_to_bundle(tiny_llama_bundle, 100, tmp_path / "x")
    r = CliRunner().invoke(cli, ["drafter-vocab", str(tiny_llama_bundle), "100", "-o", str(tmp_path / "y")])
    assert r.exit_code == ExportError.exit_code and "has no drafter model" in r.output
    with pytest.raises(ExportError, match="applies to a bundle with a --drafter"):
        export_bundle(str(tiny_dirs["qwen2"]), tmp_path / "z", drafter_vocab=100, quality=False)
    with pytest.raises(ExportError, match="number of tokens >= 0"):
        export_bundle(str(tiny_dirs["qwen2"]), tmp_path / "z", drafter=str(tiny_dirs["drafter"]), drafter_vocab=-1,
                      quality=False)
    with pytest.raises(ExportError, match="smaller than the 3 special tokens"):  # before anything is built
        export_bundle(str(tiny_dirs["qwen2"]), tmp_path / "z", drafter=str(tiny_dirs["drafter"]), drafter_vocab=1,
                      quality=False)
    r = CliRunner().invoke(cli, ["export", str(tiny_dirs["qwen2"]), "-o", str(tmp_path / "w"), "--drafter-vocab", "50"])
    assert r.exit_code == ExportError.exit_code and "applies to a bundle with a --drafter" in r.output
    assert not any(tmp_path.iterdir())


def test_select_head_ids_order():
    from edgespec_export.head import select_head_ids

    tj = {"model": {"vocab": {f"t{i}": i for i in range(10)}},
          "added_tokens": [{"id": 10, "content": "<a>"}, {"id": 11, "content": "<b>"}]}
    assert select_head_ids(tj, 5).tolist() == [0, 1, 2, 10, 11]
    assert select_head_ids(tj, 5, ranked=[9, 7, 7, 3]).tolist() == [3, 7, 9, 10, 11]
    assert select_head_ids(tj, 4, eos_ids=[5]).tolist() == [0, 5, 10, 11]
    with pytest.raises(ExportError, match="--drafter-vocab 12 is not smaller than the vocabulary .* export without"):
        select_head_ids(tj, 12)


def test_select_head_ids_keeps_bos_eos_and_cuts_to_the_models_rows():
    """(session 86, mutation tests of head.py) bos is kept; a ranking's ids outside the vocabulary, repeats and its
    tail past N are left out; the rest follows id order on a vocabulary with gaps too; an added token past the model's
    rows (Gemma 3 1B's <image_soft_token>) is left out, an eos there refused; N is checked against the rows."""
    from edgespec_export.head import select_head_ids

    tj = {"model": {"vocab": {f"t{i}": i for i in range(10)}},
          "added_tokens": [{"id": 10, "content": "<a>"}, {"id": 11, "content": "<b>"}]}
    assert select_head_ids(tj, 4, bos_id=5).tolist() == [0, 5, 10, 11]
    assert select_head_ids(tj, 5, ranked=[99, -3, 4]).tolist() == [0, 1, 4, 10, 11]
    assert select_head_ids(tj, 4, ranked=[9, 8, 7, 6, 5]).tolist() == [8, 9, 10, 11]
    assert select_head_ids(tj, 4, vocab_size=11).tolist() == [0, 1, 2, 10]  # (11 is past the rows: left out)
    with pytest.raises(ExportError, match="not smaller than the vocabulary \\(11 tokens\\)"):
        select_head_ids(tj, 11, vocab_size=11)
    with pytest.raises(ExportError, match="not smaller than the vocabulary \\(8 tokens\\)"):  # (8 and 9: past the rows)
        select_head_ids({"model": {"vocab": {f"t{i}": i for i in range(10)}}}, 8, vocab_size=8)
    with pytest.raises(ExportError, match="a special token id is outside the vocabulary of 12"):
        select_head_ids(tj, 4, eos_ids=[12], vocab_size=12)
    with pytest.raises(ExportError, match="a special token id is outside the vocabulary of 12"):
        select_head_ids(tj, 4, eos_ids=[-1])
    with pytest.raises(ExportError, match="must be a positive number of tokens, got True"):
        select_head_ids({"model": {"vocab": {"a": 0, "b": 1}}}, True)
    sparse = {"model": {"vocab": {f"t{i}": i for i in (1, 2, 3, 32)}}}  # (a set of these ints iterates 32 first)
    assert select_head_ids(sparse, 2).tolist() == [1, 2]
    gaps = {"model": {"vocab": {f"t{i}": i for i in (*range(6), 9, 10)}}}
    with pytest.raises(ExportError, match="only 6 tokens to keep, fewer than --drafter-vocab 7"):
        select_head_ids(gaps, 7, vocab_size=8)  # (9 and 10 are past the model's 8 rows)


@pytest.mark.real
@pytest.mark.slow
def test_qwen_reduced_head_exact(tmp_path):
    src = BUNDLES / "qwen-coder-d4a"
    if not (src / MANIFEST_NAME).is_file():
        pytest.skip(f"no Qwen bundle at {src}: export it as the README's 'Real models' section says")
    from edgespec_export.head import apply_to_bundle

    out = apply_to_bundle(src, 32768, tmp_path / "qwen-v32k")
    eng = edgespec.load(out, max_context=1024)
    assert eng.decoder.drafters["model"].lm.logits_width == 32768
    for prompt in ("def quicksort(arr):", "Explain what a hash map is in two sentences."):
        msgs = [{"role": "user", "content": prompt}]
        eng.reset()
        ref = eng.generate(msgs, max_new_tokens=48, drafter="none").token_ids
        for k in (None, 4):
            eng.reset()
            r = eng.generate(msgs, max_new_tokens=48, drafter="model", draft_tokens=k)
            assert r.token_ids == ref and r.stats["accepted"] > 10, (prompt, k)


def test_corpus_ranking_keeps_the_corpus_tokens(tiny_bundle, tmp_path):
    from edgespec_export.head import apply_to_bundle, corpus_ranking

    m = load_manifest(tiny_bundle)
    tj = m.tokenizer_dir / "tokenizer.json"
    text = "The quick brown fox jumps over the lazy dog. " * 50
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_text(text)
    (tmp_path / "corpus" / "b.bin").write_bytes(b"\xff\xfe" * 100)  # not a corpus suffix: ignored
    ranked = corpus_ranking(tj, [tmp_path / "corpus"])
    from tokenizers import Tokenizer

    used = set(Tokenizer.from_file(str(tj)).encode(text, add_special_tokens=False).ids)
    assert set(ranked) == used
    n = 3 + 10  # the special tokens and ten more: the corpus's tokens come before merge order
    out = apply_to_bundle(tiny_bundle, n, tmp_path / "r", corpus=[tmp_path / "corpus"])
    spec = load_manifest(out).drafter
    ids = set(spec.load_head_ids(m.target.vocab_size).tolist())
    assert set(ranked[:10]) <= ids and "token frequency in" in spec.head_source
    merge = load_manifest(_reduce(tiny_bundle, tmp_path, n=n, name="m", ranked=()))
    assert "merge order" in merge.drafter.head_source
    assert merge.drafter.load_head_ids(m.target.vocab_size).tolist() == list(range(n))
    with pytest.raises(ExportError, match="no such file or directory"):
        apply_to_bundle(tiny_bundle, 100, tmp_path / "x", corpus=[tmp_path / "missing"])
    with pytest.raises(ExportError, match="/dev/null is not a regular file"):
        corpus_ranking(tj, ["/dev/null"])
    (tmp_path / "nul.txt").write_bytes(text.encode() + b"\x00")  # binary: skipped, and said when nothing is left
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    for f in ("nul.txt", "latin1.txt"):
        with pytest.raises(ExportError, match=f"1 file.* skipped, binary or not UTF-8: .*{f}"):
            corpus_ranking(tj, [tmp_path / f])
    assert corpus_ranking(tj, [tmp_path / "nul.txt", tmp_path / "corpus"]) == ranked
    from edgespec_export.head import _utf8_prefix

    assert _utf8_prefix("aé€".encode()[:-1]) == "aé" and _utf8_prefix(b"abc") == "abc"  # a split character
    assert _utf8_prefix("a😀".encode()[:-1]) == "a"  # (three bytes of a four-byte character)
    with pytest.raises(UnicodeDecodeError):  # latin-1 inside is not forgiven
        _utf8_prefix("café au lait".encode("latin-1"))
    r = CliRunner().invoke(cli, ["export", str(tiny_bundle), "-o", str(tmp_path / "w"), "--drafter-vocab-corpus", "x"])
    assert r.exit_code == ExportError.exit_code and "applies with --drafter-vocab N" in r.output


def test_corpus_files_takes_text_files_and_readmes_sorted_once(tmp_path):
    """(session 86, mutation tests of head.py) A corpus folder gives its .py/.md/.rst/.txt files and its READMEs (of
    any suffix), recursively, sorted; a file named twice (or also inside a named folder) is read once."""
    from edgespec_export.head import corpus_files

    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    for name in ("z.py", "b.md", "sub/c.rst", "a.txt", "README", "sub/README.en", "e.bin", "notes"):
        (d / name).write_text("x")
    want = sorted(d / n for n in ("z.py", "b.md", "sub/c.rst", "a.txt", "README", "sub/README.en"))
    assert corpus_files([d]) == want
    assert corpus_files([d / "z.py", d / "a.txt", d / "z.py"]) == [d / "a.txt", d / "z.py"]
    assert corpus_files([d / "notes", d]) == sorted([*want, d / "notes"])  # (a file named: taken, any suffix)


def test_corpus_ranking_counts_by_frequency_in_batches_within_the_budget(tmp_path, monkeypatch):
    """(session 86, mutation tests of head.py) The ranking is by count, most frequent first (ties by id), of the tokens
    the text makes without the tokenizer's added bos (a post-processor that adds one: Llama's); texts are tokenized
    256 at a time (a large corpus is never held whole); reading stops at the byte budget, a character it splits left
    out."""
    import collections

    import tokenizers
    from tokenizers.processors import TemplateProcessing

    from edgespec_export.head import corpus_ranking
    from tiny import make_tokenizer

    hf = make_tokenizer()
    bos = hf.convert_tokens_to_ids("<|endoftext|>")
    hf.backend_tokenizer.post_processor = TemplateProcessing(single="<|endoftext|> $A",
                                                             special_tokens=[("<|endoftext|>", bos)])
    tj = tmp_path / "tokenizer.json"
    hf.backend_tokenizer.save(str(tj))
    real = tokenizers.Tokenizer.from_file(str(tj))
    assert real.encode("a b").ids[0] == bos

    def ranking(texts):
        c = collections.Counter(t for x in texts for t in real.encode(x, add_special_tokens=False).ids)
        return sorted(c, key=lambda t: (-c[t], t))

    batches, Real = [], tokenizers.Tokenizer

    class Counting:  # (records the batches the ranking tokenizes)
        @staticmethod
        def from_file(path):
            tok = Real.from_file(path)

            class Batches:
                def get_vocab_size(self, with_added_tokens=True):
                    return tok.get_vocab_size(with_added_tokens=with_added_tokens)

                def encode_batch(self, texts, **kw):
                    batches.append(len(texts))
                    return tok.encode_batch(texts, **kw)
            return Batches()

    monkeypatch.setattr(tokenizers, "Tokenizer", Counting)
    d = tmp_path / "texts"
    d.mkdir()
    texts = [f"def f{i}(x):\n    return x * {i % 7} + {'y' * (i % 5)}\n" for i in range(300)]
    for i, t in enumerate(texts):
        (d / f"f{i:03}.py").write_text(t)
    ranked = corpus_ranking(tj, [d])
    assert ranked == ranking(texts) and bos not in ranked
    assert [b for b in batches if b] == [256, 44]
    (tmp_path / "cut.txt").write_text("zz éq")  # 3 + 2 + 1 bytes: a budget of 4 splits the é
    assert corpus_ranking(tj, [tmp_path / "cut.txt"], max_bytes=4) == ranking(["zz "])
    assert corpus_ranking(tj, [tmp_path / "cut.txt"], max_bytes=5) == ranking(["zz é"])
    assert corpus_ranking(tj, [tmp_path / "cut.txt", d], max_bytes=6) == ranking(["zz éq"])  # (the folder not read)


def _head_graph(folder, *, bias=None, w_dims=None, producer="Cast", nbits=False):
    """A drafter-like graph by hand: logits = Cast(MatMul(x, W) + bias) ([B, 16] @ [16, 64]; with ``nbits``, a 4-bit
    MatMulNBits with zero points and its own bias input), W and a table only an If node's branch reads in external
    data ``weights.bin`` (not the ``model.onnx.data`` a rewrite writes), a small inline constant, a value_info for the
    MatMul's output. (The table is read two subgraphs down: an If in an If's branch.)"""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 64)).astype(np.float32), "side"),
             numpy_helper.from_array(np.array([2.0], np.float32), "small"),
             numpy_helper.from_array(np.array(True), "cond")]
    if nbits:  # (one block of 16 per row: B [64, 1, 8], a scale and a zero point per row)
        inits += [numpy_helper.from_array(a, name) for a, name in (
            (rng.integers(0, 256, (64, 1, 8), dtype=np.uint8), "B"), (rng.random(64).astype(np.float32), "S"),
            (rng.integers(0, 256, 64, dtype=np.uint8), "Z"), (rng.standard_normal(64).astype(np.float32), "nb_bias"))]
        nodes = [helper.make_node("MatMulNBits", ["x", "B", "S", "Z", "", "nb_bias"], ["mm"], domain="com.microsoft",
                                  K=16, N=64, bits=4, block_size=16)]
    else:
        inits.append(numpy_helper.from_array(rng.standard_normal(w_dims or (16, 64)).astype(np.float32), "W"))
        nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"])]
    last = "mm"
    if bias is not None:
        inits.append(numpy_helper.from_array(np.asarray(bias, np.float32), "b"))
        nodes.append(helper.make_node("Add", ["mm", "b"], ["biased"]))
        last = "biased"
    if producer == "Cast":
        nodes.append(helper.make_node("Cast", [last], ["logits"], to=TensorProto.FLOAT))
    else:  # (an op the head cannot be cut through)
        nodes.append(helper.make_node(producer, [last], ["logits"], domain="com.edgespec"))
    inner = helper.make_graph([helper.make_node("Identity", ["side"], ["side_out_i"])], "inner", [],
                              [helper.make_tensor_value_info("side_out_i", TensorProto.FLOAT, [4, 64])])
    branch = helper.make_graph([helper.make_node("If", ["cond"], ["side_out_b"], then_branch=inner, else_branch=inner)],
                               "branch", [], [helper.make_tensor_value_info("side_out_b", TensorProto.FLOAT, [4, 64])])
    nodes += [helper.make_node("If", ["cond"], ["side_out"], then_branch=branch, else_branch=branch),
              helper.make_node("Mul", ["x", "small"], ["doubled"])]
    inits.sort(key=lambda i: i.name == "side")  # (last in the data file)
    g = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 16])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", 64]),
                           helper.make_tensor_value_info("side_out", TensorProto.FLOAT, [4, 64]),
                           helper.make_tensor_value_info("doubled", TensorProto.FLOAT, ["B", 16])], inits,
                          value_info=[helper.make_tensor_value_info("mm", TensorProto.FLOAT, ["B", 64])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
                          ir_version=8)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(m, str(folder / "model.onnx"), save_as_external_data=True, location="weights.bin", size_threshold=512)
    return folder / "model.onnx"


def _run_graph(path):
    import onnxruntime as ort

    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    session = ort.InferenceSession(str(path), pool_session_options(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


@pytest.mark.parametrize("bias, nbits", [(None, False), (np.linspace(-1, 1, 64), False), ([0.5], False),
                                         (None, True)])  # none, one per token, one for all; MatMulNBits' own
def test_reduce_head_on_a_graph_by_hand(tmp_path, bias, nbits):
    """(session 86, mutation tests of head.py) reduce_head through a bias Add and a Cast: the logits are the full head's
    columns at the kept ids (a bias of one value for all tokens kept whole; MatMulNBits' rows, scales, zero points and
    bias input cut); the logits output and no stale value_info say N; the old weights are dropped, a table only a
    subgraph reads is kept, a small constant stays inline; every tensor moves to ``model.onnx.data`` and the old data
    file goes, no temporary file is left."""
    import onnx

    from edgespec_export.head import reduce_head

    path = _head_graph(tmp_path, bias=bias, nbits=nbits)
    full = _run_graph(path)
    ids = np.array([0, 3, 17, 40, 63])
    assert reduce_head(path, ids) == 64
    cut = _run_graph(path)
    np.testing.assert_allclose(cut[0], full[0][:, ids], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(cut[1], full[1])
    np.testing.assert_array_equal(cut[2], full[2])
    m = onnx.load(str(path), load_external_data=False)
    logits = next(o for o in m.graph.output if o.name == "logits")
    assert logits.type.tensor_type.shape.dim[-1].dim_value == 5
    assert not [v.name for v in m.graph.value_info]
    inits = {t.name: t for t in m.graph.initializer}
    head = {"B.head5", "S.head5", "Z.head5", "nb_bias.head5"} if nbits else {"W.head5"}
    assert set(inits) == head | {"side", "small", "cond"} | ({"b.head5"} if bias is not None and len(bias) > 1
                                                             else {"b"} if bias is not None else set())
    assert inits["small"].data_location != onnx.TensorProto.EXTERNAL and inits["small"].raw_data
    assert {e.value for t in inits.values() for e in t.external_data if e.key == "location"} == {"model.onnx.data"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "model.onnx.data"]


def test_reduce_head_refuses_what_it_cannot_cut_and_leaves_the_graph(tmp_path):
    """(session 86, mutation tests of head.py) ids not sorted, unique and inside the head; a weight that is not
    [hidden, vocab]; logits from an op that is no lm_head (exact-kernels' MatMulQ4: the order to apply them in);
    external data shorter than a tensor's shape: ExportErrors, the graph's files as they were, no temporary file
    left."""
    from edgespec_export.head import reduce_head

    path = _head_graph(tmp_path / "a")
    before = {p.name: p.read_bytes() for p in path.parent.iterdir()}
    for ids in ([1, 1, 2], [3, 2], [-1, 2], [5, 64], []):
        with pytest.raises(ExportError, match="sorted, unique and inside the head's 64 tokens"):
            reduce_head(path, np.array(ids, dtype=np.int64))
    with pytest.raises(ExportError, match="no constant \\[hidden, vocab\\] weight"):
        reduce_head(_head_graph(tmp_path / "b", w_dims=(1, 8, 64)), np.array([1, 2]))
    with pytest.raises(ExportError, match="logits come from MatMulQ4, not a MatMulNBits.*apply drafter-vocab to the "
                                          "bundle before exact-kernels"):
        reduce_head(_head_graph(tmp_path / "c", producer="MatMulQ4"), np.array([1, 2]))
    with pytest.raises(ExportError, match="logits come from Softmax, not a MatMulNBits/MatMul lm_head: cannot reduce "
                                          "its vocabulary$"):
        reduce_head(_head_graph(tmp_path / "d", producer="Softmax"), np.array([1, 2]))
    data = path.parent / "weights.bin"
    short = before["weights.bin"][:-100]  # (W first, then the table only the subgraph reads: that one ends early)
    data.write_bytes(short)
    with pytest.raises(ExportError, match="side: its external data ends early"):
        reduce_head(path, np.array([1, 2]))
    assert {p.name: p.read_bytes() for p in path.parent.iterdir()} == {**before, "weights.bin": short}
    data.write_bytes(before["weights.bin"][:1000])  # (W itself cut short)
    with pytest.raises(ExportError, match="W: its external data is shorter than its shape says"):
        reduce_head(path, np.array([1, 2]))
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.onnx", "weights.bin"]


def test_reduce_in_stage_checks_the_vocabularies_and_records_what_it_measured(tiny_bundle, tmp_path, monkeypatch):
    """(session 86, mutation tests of head.py) On an export's stage: a kept id past the target's vocabulary is refused;
    ids past a drafter with fewer rows than the target (Gemma 3 1B's) are left out, and said, unless that keeps every
    row; a head whose width is not the manifest's drafter vocabulary is refused; the sizes measured after the cut are
    the ones recorded; the head's source is the one given."""
    import shutil
    from dataclasses import replace

    from edgespec_export import bundle as B
    from edgespec_export.head import reduce_in_stage

    stage, other = (shutil.copytree(tiny_bundle, tmp_path / n) for n in ("stage", "other"))
    m = load_manifest(stage)
    assert m.target.vocab_size == m.drafter.vocab_size == 372
    with pytest.raises(ExportError, match="a kept id is outside the target's vocabulary"):
        reduce_in_stage(stage, m, np.array([0, 5, 372]))
    wide = replace(m, target=replace(m.target, vocab_size=400))  # (a target with 28 rows more than its drafter)
    with pytest.raises(ExportError, match="374 tokens to keep: the drafter has only 372 ids, all of them kept"):
        reduce_in_stage(stage, wide, np.array([*range(372), 380, 390]))
    o = load_manifest(other)
    with pytest.raises(ExportError, match="the drafter's lm_head has 372 outputs but the manifest says vocab 371"):
        reduce_in_stage(other, replace(o, drafter=replace(o.drafter, vocab_size=371)), np.array([0, 5, 9]))
    monkeypatch.setattr(B, "measured_sizes", lambda root, role, entry, log=None: {
        "embedding_bytes": 1234, "embedding_row_bytes": 56, "cpu_resident_bytes": 7890})
    logs = []
    ids = np.array([0, 1, 2, 3, 371, 380, 390])
    no_agreement = replace(m.drafter.quality, greedy_agreement_with_target=None)
    wide = replace(wide, drafter=replace(m.drafter, quality=no_agreement))
    # (no agreement to measure again: that loads the target, whose graph has not the 400 rows said here)
    out = reduce_in_stage(stage, wide, ids, log=logs.append, source="a test's ids")
    d = out.drafter
    assert d.head_size == 5 and d.load_head_ids(372).tolist() == [0, 1, 2, 3, 371]
    assert (d.embedding_bytes, d.embedding_row_bytes, d.cpu_resident_bytes) == (1234, 56, 7890)
    assert d.head_source == "a test's ids"
    assert any("2 kept ids are past its 372-token vocabulary: left out" in line for line in logs), logs


def test_tied_drafter_shares_its_table_with_the_embedding_and_keeps_it(tmp_path_factory, tiny_dirs):
    """A tied INT4 drafter: the builder's embedding lookup (GatherBlockQuantized) reads the lm_head's
    own quantized table. The cut head gets new tables; the embedding keeps reading the full ones."""
    import onnx
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conftest import _export
    from edgespec_export.head import apply_to_bundle

    d = tmp_path_factory.mktemp("tied") / "drafter"
    model = AutoModelForCausalLM.from_pretrained(tiny_dirs["drafter"], dtype=torch.float32)
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    model.save_pretrained(d)
    AutoTokenizer.from_pretrained(tiny_dirs["drafter"]).save_pretrained(d)
    src = _export(tmp_path_factory, "tiny-tied", tiny_dirs["qwen2"], drafter=str(d), target_precision="int4",
                  drafter_precision="int4")

    def graph(b):
        g = onnx.load(str(b / "drafter" / "model.onnx"), load_external_data=False).graph
        head = next(n for n in g.node if "logits" in n.output)
        gather = next(n for n in g.node if n.op_type == "GatherBlockQuantized")
        producers = {o: n for n in g.node for o in n.output}
        table = {i for i in gather.input} | {i for i in gather.input if i in producers
                                              for i in producers[i].input}
        return head, table

    head, table = graph(src)
    assert head.op_type == "MatMulNBits" and set(head.input[1:3]) <= table  # shared before
    # (session 49, a review) the manifest records the int4 table the graph has (it said embeddings not quantized)
    rec = load_manifest(src).drafter.quant
    assert rec.quantize_embeddings is True and rec.symmetric is True
    out = tmp_path_factory.mktemp("tied-out") / "reduced"
    apply_to_bundle(src, N, out, ranked=SCATTERED)
    head2, table2 = graph(out)
    assert table2 == table and not set(head2.input[1:3]) & table2  # the lookup reads the full table
    ids = load_manifest(out).drafter.load_head_ids(372)
    seq = [(37 * i + 11) % 360 for i in range(25)]
    _, full = _drafter_logits(src, seq)
    _, red = _drafter_logits(out, seq)
    np.testing.assert_allclose(red, full[:, ids], rtol=1e-4, atol=1e-4)
    eng = edgespec.load(out, max_context=256)
    _assert_all_equal(_greedy_all(eng, PROMPTS[0], 30), PROMPTS[0])


def test_a_new_bundle_shares_no_file_with_its_source(tiny_bundle, tmp_path):
    """onnx refuses external data behind several hard links ("potential hardlink attack"): a
    reduced copy that linked its files would leave both bundles unreadable to the export tools
    (scripts/compare_int4.py, refresh_sizes, another drafter-vocab run)."""
    import onnx

    out = _reduce(tiny_bundle, tmp_path)
    for b in (tiny_bundle, out):
        for f in Path(b).rglob("*"):
            if f.is_file():
                assert f.stat().st_nlink == 1, f
        m = load_manifest(b)
        onnx.load(str(m.target.path))  # external data read, as the export tools read it


def test_one_rewrite_of_a_bundle_at_a_time_and_a_stopped_ones_copy_is_put_back(tiny_int4_bundle, copy_bundle):
    """(session 55, a review) Two rewrites of one bundle at once both exited 0, and one's result was lost (or the later
    one wrote its old manifest over the other's files: a bundle that no longer loaded): a rewrite holds a lock on the
    bundle's folder, and a second is refused at once, the bundle as it was. And a rewrite killed between publish's
    two renames left the bundle only as .NAME.old-PID: load says so, and the next rewrite puts it back first."""
    import fcntl
    import os

    from edgespec.errors import BundleError
    from edgespec_export.head import apply_to_bundle
    from edgespec_export.kernels import apply_to_bundle as exact_kernels

    b = copy_bundle(tiny_int4_bundle)
    before = (b / "edgespec.json").read_text()
    fd = os.open(b, os.O_RDONLY | os.O_DIRECTORY)  # another process's rewrite, as its lock holds the folder
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        for rewrite in (lambda: apply_to_bundle(b, 256), lambda: exact_kernels(b),
                        lambda: exact_kernels(b, b / ".." / b.name)):  # (-o naming the bundle: in place)
            with pytest.raises(ExportError, match="is being rewritten or copied by another edgespec rewrite"):
                rewrite()
        for rewrite in (lambda: apply_to_bundle(b, 256, b.parent / "copy1"), lambda: exact_kernels(b, b.parent / "c")):
            with pytest.raises(ExportError, match="is being rewritten in place by another edgespec process"):
                rewrite()  # (into a new bundle while one rewrites it in place)
        assert (b / "edgespec.json").read_text() == before and not (b.parent / "copy1").exists()
        # (session 71) another rewrite reading the bundle into a new one (a shared lock): rewrites into new bundles
        # run beside it (each was refused); one in place is refused
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        with pytest.raises(ExportError, match="is being rewritten or copied by another edgespec rewrite"):
            apply_to_bundle(b, 256)
        assert load_manifest(apply_to_bundle(b, 256, b.parent / "copy1"), deep=True).drafter.head_size == 256
        assert load_manifest(exact_kernels(b, b.parent / "copy2"), deep=True).target.path.is_file()
        assert (b / "edgespec.json").read_text() == before
    finally:
        os.close(fd)
    dead = dead_pid()
    aside = b.parent / f".{b.name}.old-{dead}"
    b.rename(aside)  # (killed between the two renames: the old bundle's only copy)
    with pytest.raises(BundleError, match=rf"no such bundle: .*\(\.{b.name}\.old-{dead} beside it"):
        load_manifest(b)
    link = b.parent.parent / "link"  # (reached through a link: the hint looks beside what it names)
    link.symlink_to(b)
    with pytest.raises(BundleError, match=rf"\(\.{b.name}\.old-{dead} beside it"):
        load_manifest(link)
    assert apply_to_bundle(b, 256) == b.resolve() and not aside.exists()
    assert load_manifest(b, deep=True).drafter.head_size == 256


def test_a_read_only_bundle_stays_read_only_after_its_rewrite(tiny_int4_bundle, copy_bundle):
    """(session 55, a review) The rewrite's copy makes its folders writable (for the rewritten files), and the
    rewritten bundle came back writable: folders 0755, rewritten files 0644. The source's modes are put on it."""
    import os
    import stat

    from edgespec_export.head import apply_to_bundle

    b = copy_bundle(tiny_int4_bundle)
    for p in [b, *b.rglob("*")]:
        os.chmod(p, 0o555 if p.is_dir() else 0o444)
    try:
        apply_to_bundle(b, 256)
        modes = {p.relative_to(b): stat.S_IMODE(p.stat().st_mode) for p in [b, *b.rglob("*")]}
        assert load_manifest(b, deep=True).drafter.head_size == 256
        new = [r for r in modes if not (tiny_int4_bundle / r).exists()]  # (the kept ids: no source file to follow)
        assert {r: m for r, m in modes.items() if r not in new} == \
            {r: 0o555 if (b / r).is_dir() else 0o444 for r in modes if r not in new}
        assert (b / "edgespec.json").stat().st_mode & 0o777 == 0o444 and modes[Path(".")] == 0o555
    finally:
        for p in [b, *b.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)


def test_a_rewrites_lock_and_modes_where_flock_fails_otherwise_and_files_are_links(tiny_int4_bundle, copy_bundle,
                                                                                   tmp_path, monkeypatch):
    """(session 55, the diff's review) A folder's flock that fails for another reason than a held lock (NFS: EBADF,
    ENOLCK) said "being rewritten by another process" every time: the rewrite goes on without the lock. A file the
    bundle holds through a link is copied as a file, and took the link's own mode (0777): it takes its target's."""
    import errno
    import fcntl
    import os
    import stat

    from edgespec_export.head import apply_to_bundle

    b = copy_bundle(tiny_int4_bundle)
    (tmp_path / "LICENSE.txt").write_text("terms")
    os.chmod(tmp_path / "LICENSE.txt", 0o640)
    (b / "LICENSE.txt").symlink_to(tmp_path / "LICENSE.txt")

    def no_lock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_lock)
    out = apply_to_bundle(b, 256, tmp_path / "out")
    assert load_manifest(out, deep=True).drafter.head_size == 256
    assert stat.S_IMODE((out / "LICENSE.txt").lstat().st_mode) == 0o640 and not (out / "LICENSE.txt").is_symlink()
