"""(session 60) Gemma 4's multi-token-prediction assistant as the ``mtp`` drafter: export/mtp.py builds its graph
(checked against transformers' ``Gemma4AssistantForCausalLM`` on the target's own keys, values and hidden states),
the target graph gives each logits row's hidden state, and edgespec/mtp.py drafts from the target's KV buffers and
the row that produced the last token. Tiny random models: the drafts are checked against transformers' assistant
step by step, the output against plain decoding."""
from __future__ import annotations

import numpy as np
import pytest

PROMPT = "def hello(world):\n    return world + 1\nThe quick brown fox"
REPEAT = "one two three four five six seven eight nine ten " * 3 + "one two three"


def _assistant_config(vocab: int, *, ordered: bool = False, backbone: int = 64, **extra):
    """The config of a tiny assistant for the tiny E2B-like target (test_archs._gemma4's "e2b": heads of 16 lanes,
    global ones of 32, one KV head, a window of 8): a sliding and a full layer of width 32."""
    import transformers

    kw = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=1, head_dim=16, global_head_dim=32, max_position_embeddings=512, sliding_window=8,
              layer_types=["sliding_attention", "full_attention"], hidden_size_per_layer_input=0,
              vocab_size_per_layer_input=0, num_kv_shared_layers=2)
    kw.update(extra)
    return transformers.Gemma4AssistantConfig(text_config=transformers.Gemma4TextConfig(**kw),
                                              backbone_hidden_size=backbone, use_ordered_embeddings=ordered,
                                              num_centroids=4, centroid_intermediate_top_k=2)


def _assistant_model(cfg, seed: int):
    """A tiny assistant of config ``cfg`` with random weights (in memory)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    m = transformers.Gemma4AssistantForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in m.named_parameters():  # (a norm in the wrong place fails the checks)
            if "norm" in name:
                p.copy_(1.0 + 0.5 * torch.randn_like(p))
        m.lm_head.weight.mul_(8.0)  # (confident drafts: the confidence stop then lets drafts run)
        if cfg.use_ordered_embeddings:
            m.masked_embedding.token_ordering.copy_(torch.randperm(int(cfg.text_config.vocab_size)))
    return m


def _assistant(d, tok, *, ordered: bool = False, backbone: int = 64, seed: int = 1, **extra):
    """A tiny assistant (``_assistant_config``'s) with random weights, saved at ``d``."""
    _assistant_model(_assistant_config(len(tok), ordered=ordered, backbone=backbone, **extra), seed).save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from test_archs import _gemma4
    from tiny import make_tokenizer

    root = tmp_path_factory.mktemp("mtp")
    tok = make_tokenizer()
    return {"target": _gemma4(root / "target", "e2b", plain=False), "int4": _gemma4(root / "int4", "e2b", plain=True),
            "assistant": _assistant(root / "assistant", tok), "tok": tok, "root": root}


def _export(pair, name, target="target", **kw):
    from edgespec_export import export_bundle

    out = pair["root"] / name
    if not out.exists():
        export_bundle(str(pair[target]), out, drafter=str(pair["assistant"]), **{"max_context": 256, **kw})
    return out


@pytest.fixture(scope="module")
def fp32_bundle(pair):
    return _export(pair, "fp32", target_precision="fp32")


def _torch(path, cls):
    import torch
    import transformers

    return getattr(transformers, cls).from_pretrained(str(path), dtype=torch.float32).eval()


def _reference_draft(target, assistant, ctx, k, sp=None, rng=None):
    """transformers' assistant drafting ``k`` tokens after ``ctx`` (the target holding ``ctx[:-1]``), as edgespec's
    drafter does: greedy argmax, or each token drawn from q (the assistant's logits under ``sp``) with ``rng``."""
    import torch

    from edgespec.sampling import distribution
    from edgespec_export.mtp import reference_step

    p = len(ctx) - 1
    with torch.no_grad():
        out = target(torch.tensor([list(ctx[:-1])]), output_hidden_states=True, return_shared_kv_states=True)
    emb = target.get_input_embeddings()
    h, tok, toks, qs = out.hidden_states[-1][0, -1].numpy(), int(ctx[-1]), [], []
    for _ in range(k):
        logits, h = reference_step(assistant, emb.weight, emb.scalar_embed_scale, tok, h, p, out.shared_kv_states, p)
        if sp is None:
            tok = int(np.argmax(logits))
        else:
            q = distribution(logits.astype(np.float32), sp)
            qs.append(q)
            tok = int(q.sample(rng))
        toks.append(tok)
    return toks, qs


@pytest.mark.parametrize("ordered", [False, True], ids=["lm-head", "centroid-head"])
def test_assistant_graph_is_transformers_assistant_step(pair, fp32_bundle, tmp_path, ordered):
    """The graph, fed as the runtime feeds it (the exported target's cache buffers of the layers it attends, its
    hidden-state output), against transformers' assistant on torch's own state, at positions before, at and past
    the sliding window (a sliding layer attends the last window + 1 rows: transformers' flipped bidirectional mask);
    the centroid head (``use_ordered_embeddings``) too. The planted bug, another sliding layer of the same shape
    attended in place of the store layer, is caught by the export's check."""
    from edgespec.errors import ExportError
    from edgespec.manifest import load_manifest
    from edgespec_export import mtp

    tspec = load_manifest(fp32_bundle).target
    target = _torch(pair["target"], "Gemma4ForCausalLM")
    asst = _torch(_assistant(tmp_path / "a", pair["tok"], ordered=ordered), "Gemma4AssistantForCausalLM")
    text = target.config
    kv = {i: tspec.kv_shape(i) for i in range(tspec.num_layers)}
    ids = list(np.random.default_rng(0).integers(0, len(pair["tok"]), 40))
    emb = target.get_input_embeddings().weight
    g = mtp.build_assistant(asst, text, kv, tspec.kv_dtype, tmp_path / "g", target_embed=emb)
    assert g.sources == {"sliding_attention": 3, "full_attention": 2} and g.ordered == ordered
    assert mtp.validate_assistant(g, asst, target, tspec, ids) < 1e-3
    real = mtp.store_layers
    try:  # the planted bug: the sliding layers' rows of layer 1 (a sliding layer of the same shape) in place of 3's
        mtp.store_layers = lambda cfg: {**real(cfg), "sliding_attention": 1}
        g = mtp.build_assistant(asst, text, kv, tspec.kv_dtype, tmp_path / "wrong", target_embed=emb)
    finally:
        mtp.store_layers = real
    with pytest.raises(ExportError, match="layer 1 cache is not the sliding_attention keys"):
        mtp.validate_assistant(g, asst, target, tspec, ids)


def test_mtp_drafts_are_transformers_assistant_s(pair, fp32_bundle):
    """Every draft of the mtp drafter in a generation equals transformers' assistant drafting from the target's own
    state at that context, also after a round that kept draft tokens (rounds forced to alternate with the request's
    prediction, the reply itself: each kept whole, so the next mtp draft starts from the hidden state of a row past
    the call's first); the output equals plain decoding, under ``mtp`` and ``auto`` too."""
    import edgespec
    from edgespec.mtp import MtpDrafter
    from edgespec.policy import NO_DRAFT, Choice

    eng = edgespec.load(fp32_bundle, memory=False)
    assert "mtp" in eng.decoder.drafters
    seen, rows = [], []
    real_draft, real_observe = MtpDrafter.draft, MtpDrafter.observe_hidden

    def draft(self, ctx, k, sp, rng, **kw):
        d = real_draft(self, ctx, k, sp, rng, **kw)
        seen.append((ctx.tolist(), d.tokens, rows[-1]))
        return d

    def observe(self, row):
        rows.append(row)
        return real_observe(self, row)

    ar = eng.generate(REPEAT, max_new_tokens=40, drafter="none", ignore_eos=True)
    policy, turn = eng.decoder.policy, [0]
    real_choose = policy.choose

    def alternate(ctx, kcap, fixed, cap):  # the prediction's rounds (kept whole), then the assistant's
        turn[0] += 1
        d = eng.decoder.drafters["prediction" if turn[0] % 2 else "mtp"]
        k = min(3, kcap)
        # (a threshold of 0: the assistant's whole draft of 3, however unsure the random model is)
        stop = 0.0 if d.name == "mtp" else None
        return Choice(d, k, key=d.name, stop=stop) if k > 0 and d.offer(ctx, k) is not None else NO_DRAFT

    MtpDrafter.draft, MtpDrafter.observe_hidden = draft, observe
    try:
        for drafter in ("mtp", "auto"):
            got = eng.generate(REPEAT, max_new_tokens=40, drafter=drafter, ignore_eos=True, draft_tokens=3)
            assert got.token_ids == ar.token_ids, drafter
        policy.choose = alternate
        got = eng.generate(REPEAT, max_new_tokens=40, drafter="auto", ignore_eos=True, prediction=ar.token_ids)
        assert got.token_ids == ar.token_ids
    finally:
        MtpDrafter.draft, MtpDrafter.observe_hidden = real_draft, real_observe
        policy.choose = real_choose
    assert any(len(t) >= 2 for _, t, _ in seen) and any(r > 0 for _, _, r in seen), seen
    target = _torch(pair["target"], "Gemma4ForCausalLM")
    asst = _torch(pair["assistant"], "Gemma4AssistantForCausalLM")
    for ctx, tokens, _ in seen:
        assert tokens == _reference_draft(target, asst, ctx, len(tokens))[0], (len(ctx), tokens)


def test_sampled_mtp_drafts_are_drawn_from_their_q(pair, fp32_bundle):
    """A sampled draft's tokens are drawn from the q it hands the rejection rule: transformers' assistant's
    distribution under the request's settings, drawn with the same generator (each step's q its own: the planted
    bug, every position given the first step's q, is caught)."""
    import edgespec
    from edgespec.kv import TokenBuffer
    from edgespec.sampling import SamplingParams

    eng = edgespec.load(fp32_bundle, memory=False)
    d = eng.decoder.drafters["mtp"]
    target = _torch(pair["target"], "Gemma4ForCausalLM")
    asst = _torch(pair["assistant"], "Gemma4AssistantForCausalLM")
    from edgespec.decoder import GenerationConfig

    ids = eng.tokenizer.encode(PROMPT)
    first = [t for s in eng.decoder.generate(ids, GenerationConfig(max_new_tokens=1, drafter="none")) for t in s.tokens]
    ctx = list(ids) + first
    eng.decoder.target.prefill(ids)
    d.observe_hidden(-1)
    for sp in (SamplingParams(1.0), SamplingParams(0.7, top_k=5)):
        got = d.draft(TokenBuffer(ctx), 4, sp, np.random.default_rng(5), stop=0.0)  # (all 4, however unsure)
        want, qs = _reference_draft(target, asst, ctx, 4, sp, np.random.default_rng(5))
        assert got.tokens == want and len(got.probs) == 4
        for a, b in zip(got.probs, qs):
            pa, pb = a.exact(), b.exact()
            assert all(abs(pa.prob(t) - pb.prob(t)) < 1e-5 for t in range(pa.n))
        planted = [got.probs[0]] * 4
        assert any(abs(a.prob(t) - b.prob(t)) > 1e-3 for a, b in zip(planted, qs) for t in range(a.n))


@pytest.mark.parametrize("kind", ["int4", "int4-exact-kernels"])
def test_mtp_decodes_exactly_on_quantized_bundles(pair, kind, tmp_path_factory):
    """INT4 (the target's hidden output after the logits skip's cut; the assistant's weight matrices INT4 too,
    ``--drafter-precision int4``) and exact-kernels (its float16 caches: the assistant graph's cache inputs retyped
    by the rewrite) decode as plain decoding, greedy, under mtp and auto; sampled, a seed repeats its reply."""
    import onnx

    import edgespec
    from edgespec.manifest import load_manifest

    b = _export(pair, "b-int4", target="int4", target_precision="int4", drafter_precision="int4")
    if kind == "int4-exact-kernels":
        from edgespec_export.kernels import apply_to_bundle

        out = pair["root"] / "b-int4-xk"
        if not out.exists():
            apply_to_bundle(b, out)
        from edgespec.errors import ExportError

        with pytest.raises(ExportError, match="multi-token-prediction assistant, which reads the target's caches"):
            apply_to_bundle(b, pair["root"] / "b-int4-xk8", kv_dtype="int8")  # (refused before anything is copied)
        assert not (pair["root"] / "b-int4-xk8").exists()
        b = out
        m = load_manifest(b)
        assert m.target.kv_dtype == "float16" and m.assistant is not None
        g = onnx.load(str(m.assistant.path), load_external_data=False).graph
        assert {i.type.tensor_type.elem_type for i in g.input if i.name.startswith(("key_", "value_"))} == {
            onnx.TensorProto.FLOAT16}
    a = load_manifest(b).assistant
    ops = [n.op_type for n in onnx.load(str(a.path), load_external_data=False).graph.node]
    assert a.precision == "int4" and ops.count("MatMulNBits") == 13 and a.validated < 1e-3, (a, ops)
    eng = edgespec.load(b, memory=False)
    assert "mtp" in eng.decoder.drafters
    for text in (PROMPT, REPEAT):
        ar = eng.generate(text, max_new_tokens=32, drafter="none", ignore_eos=True)
        for d in ("mtp", "auto"):
            got = eng.generate(text, max_new_tokens=32, drafter=d, ignore_eos=True)
            assert got.token_ids == ar.token_ids, (kind, d)
        got = eng.generate(text, max_new_tokens=32, drafter="mtp", ignore_eos=True, temperature=0.8, seed=3)
        again = eng.generate(text, max_new_tokens=32, drafter="mtp", ignore_eos=True, temperature=0.8, seed=3)
        assert got.token_ids == again.token_ids and len(got.token_ids) == 32


def test_an_assistant_bundle_says_what_it_holds(fp32_bundle, tmp_path):
    """``info`` lists the assistant (the layers it attends, its validation), ``plan`` counts its weights, and the
    manifest round-trips it."""
    from click.testing import CliRunner

    from edgespec.cli import main
    from edgespec.manifest import Manifest, load_manifest

    m = load_manifest(fp32_bundle)
    a = m.assistant
    assert a.sources == {"sliding_attention": 3, "full_attention": 2} and a.validated < 1e-3
    assert m.target.io.hidden == "hidden_states" and a.embedding_bytes > 0
    assert Manifest.from_dict(m.to_dict(), fp32_bundle).assistant == a
    r = CliRunner().invoke(main, ["info", str(fp32_bundle)])
    assert r.exit_code == 0, r.output
    assert "assistant: Gemma4AssistantForCausalLM fp32, drafter 'mtp'" in r.output and "layer 3 (sliding)" in r.output
    assert "'hidden_states'" in r.output
    # (session 99, CL130-CL132) its sliding layers' rows (the window and the row itself), an ordered (centroid)
    # head, and a validation of exactly 0 still said
    b = _edit_manifest(fp32_bundle, tmp_path, lambda raw: raw["models"]["assistant"].update(
        sliding_window=7, ordered=True, validated=0.0))
    r = CliRunner().invoke(main, ["info", str(b)])
    assert r.exit_code == 0 and ", sliding layers the last 8 rows; the centroid head\n" in r.stdout, r.output
    assert "on the target's own state: ✓ relative difference 0\n" in r.stdout, r.output
    r = CliRunner().invoke(main, ["plan", str(fp32_bundle)])
    assert r.exit_code == 0 and "weights assistant" in r.output and "assistant (mtp): loaded" in r.output, r.output


def _edit_manifest(bundle, tmp_path, edit):
    import json
    import shutil

    b = tmp_path / "edited"
    shutil.copytree(bundle, b)
    path = b / "edgespec.json"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))
    return b


@pytest.mark.parametrize("edit, message", [
    (lambda r: r["models"]["assistant"]["sources"].update(full_attention=9), "attends target layer 9"),
    (lambda r: r["models"]["target"]["io"].pop("hidden"), "no hidden-state output"),
    (lambda r: r["models"]["assistant"].update(target_hidden_size=65), "hidden size 65"),
    (lambda r: r["models"]["assistant"].pop("sources"), "lacks 'sources'"),
    (lambda r: r["models"]["assistant"]["sources"].update(sliding_attention=4), "keeps no cache of its own"),
    # (session 77, a mutation test of manifest.py: each loaded with its check taken out)
    (lambda r: r["models"]["assistant"]["sources"].update(full_attention=r["models"]["target"]["num_layers"]),
     "attends target layer \\d+ \\(full_attention\\), the target has"),
    (lambda r: r["models"]["assistant"]["sources"].update(full_attention=-1), "sources must map a layer kind"),
    (lambda r: r["models"]["assistant"].update(sliding_window=-1), "assistant's sizes must be positive"),
    (lambda r: r["models"]["assistant"].update(vocab_size=7), "hidden size \\d+ and 7 tokens"),
    # (session 100, a second mutation test of manifest.py: MF52, MF53, MF57)
    (lambda r: r["models"]["assistant"].update(hidden_size=0), "assistant's sizes must be positive"),
    (lambda r: r["models"]["assistant"].update(sources={}), "sources must map a layer kind to a target layer"),
    (lambda r: r["models"]["assistant"].update(ordered="no"), r"models\.assistant\.ordered has the wrong type"),
], ids=["layer-out-of-range", "no-hidden-output", "other-hidden-size", "no-sources", "a-shared-layer",
        "the-layer-count", "a-negative-layer", "a-negative-window", "other-vocabulary", "a-zero-hidden-size",
        "an-empty-sources", "an-ordered-string"])
def test_a_broken_assistant_entry_is_one_line(fp32_bundle, tmp_path, edit, message):
    from edgespec.errors import EdgespecError
    from edgespec.manifest import load_manifest

    b = _edit_manifest(fp32_bundle, tmp_path, edit)
    with pytest.raises(EdgespecError, match=message) as e:
        load_manifest(b)
    assert "\n" not in str(e.value)


def test_the_assistants_weights_on_the_cpu_leave_out_its_mapped_embedding_copy(fp32_bundle):
    """(session 100, a second mutation test of manifest.py: MF54, MF55) The planner's figure for the assistant's
    weights: all of its files on a GPU; on the CPU its copy of the target's embedding table stays mapped from the
    file (a row read a step), so it is left out, and a manifest whose table is larger than the files reads 0."""
    import dataclasses

    from edgespec.manifest import load_manifest

    a = load_manifest(fp32_bundle).assistant
    assert 0 < a.embedding_bytes < a.bytes_on_disk
    assert a.weight_bytes(True) == a.bytes_on_disk
    assert a.weight_bytes(False) == a.bytes_on_disk - a.embedding_bytes
    assert dataclasses.replace(a, embedding_bytes=a.bytes_on_disk + 1).weight_bytes(False) == 0


def test_a_changed_assistant_file_is_refused(fp32_bundle, tmp_path):
    import shutil

    from edgespec.errors import BundleError
    from edgespec.manifest import load_manifest

    b = tmp_path / "changed"
    shutil.copytree(fp32_bundle, b)
    data = b / "assistant" / "assistant.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(BundleError, match="assistant"):
        load_manifest(b, deep=True)


def test_mtp_without_an_assistant_is_refused_in_one_line(tiny_bundle):
    """``drafter="mtp"`` on a bundle without an assistant: a ConfigError that says so, before any prefill."""
    import edgespec
    from edgespec.errors import ConfigError

    eng = edgespec.load(tiny_bundle, memory=False)
    with pytest.raises(ConfigError, match="this bundle has no assistant"):
        eng.generate("hello", max_new_tokens=4, drafter="mtp")


def test_an_assistant_export_it_cannot_make_is_refused_in_one_line(pair, tiny_dirs, tmp_path, capsys):
    """Exit 6 in one line, nothing written, before any model is built: an assistant trained with a target of another
    hidden size, a target that is no Gemma 4, ``--drafter-vocab`` (a model drafter's), a precision or layout it has
    no build for."""
    from edgespec.cli import main

    other = _assistant(tmp_path / "other", pair["tok"], backbone=48)
    fewer = _assistant(tmp_path / "fewer", pair["tok"], vocab_size=len(pair["tok"]) - 10)  # (session 87: smaller too)
    a = str(pair["assistant"])
    for target, drafter, extra, message in (
            (pair["target"], str(other), [], "trained with a target of hidden size 48"),
            (pair["target"], str(fewer), [], f"the assistant's vocabulary ({len(pair['tok']) - 10}) is not the "
                                              f"target's ({len(pair['tok'])})"),
            (tiny_dirs["qwen2"], a, [], "drafts for Gemma 4 targets"),
            (pair["target"], a, ["--drafter-vocab", "64"], "--drafter-vocab applies to a model drafter"),
            (pair["target"], a, ["--drafter-precision", "fp16"], "exports at --drafter-precision fp32, int8, int4"),
            (pair["target"], a, ["--drafter-precision", "int4", "--drafter-quant-algo", "hqq"],
             "--drafter-quant-algo hqq does not apply"),
            (pair["target"], a, ["--drafter-precision", "int4", "--drafter-quant-algo", "k_quant"],
             "--drafter-quant-algo k_quant does not apply"),  # (session 89: only hqq was refused by a test)
            (pair["target"], a, ["--drafter-device", "cuda", "--drafter-precision", "int4"],
             "export it with --device cpu"),  # (session 89: the drafter's layout too)
            (pair["target"], a, ["--device", "cuda", "--target-precision", "int4"], "export it with --device cpu"),
            (pair["target"], a, ["--target-precision", "int4", "--exact-kernels", "--kv-dtype", "int8"],
             "--kv-dtype int8 does not apply with it")):
        with pytest.raises(SystemExit) as e:
            main(["export", str(target), "--drafter", drafter, "-o", str(tmp_path / "b"), "--target-precision",
                  "fp32", "--no-quality", *extra])
        assert e.value.code == 6
        err = capsys.readouterr().err.strip().splitlines()
        assert message in err[-1] and "Traceback" not in "".join(err), err[-1]
        assert not any("builder:" in line for line in err), err  # (refused before the build)
        assert not (tmp_path / "b").exists()


def test_an_assistant_reading_another_shape_of_cache_is_refused_at_load(fp32_bundle, tmp_path):
    """(a review) A hand-edited manifest whose assistant attends a layer of another cache shape (a sliding layer's 16
    lanes where its full layers read 32) loaded, and every mtp or auto generation failed mid-reply: refused at load."""
    import edgespec
    from edgespec.errors import BundleError

    b = _edit_manifest(fp32_bundle, tmp_path, lambda r: r["models"]["assistant"]["sources"].update(full_attention=3))
    with pytest.raises(BundleError, match="full_attention layers read caches of 1 x 32, the target's layer 3 has 1 x 16"):
        edgespec.load(b, memory=False)


def test_the_assistant_loads_where_a_drafter_model_would(fp32_bundle):
    """(a review) ``use_drafter=False`` (``--drafter none``/``prompt-lookup``) leaves the assistant out, as the
    drafter model: not in the memory plan, not drafting under ``auto``, ``mtp`` refused saying why."""
    import edgespec
    from edgespec.errors import ConfigError

    eng = edgespec.load(fp32_bundle, memory=False, use_drafter=False)
    assert "mtp" not in eng.decoder.drafters and "assistant" not in eng.plan.weights
    # (a review) nor its working memory (Gemma 4 E2B at 32k: ~768 MiB of sliced caches charged for nothing)
    with_it = edgespec.load(fp32_bundle, memory=False)
    assert eng.plan.working < with_it.plan.working
    assert not eng.decoder.target._keep_hidden  # (no hidden states bound: the calls as before)
    with pytest.raises(ConfigError, match="assistant is not loaded: the engine was opened without a drafter model"):
        eng.generate(PROMPT, max_new_tokens=4, drafter="mtp")


def test_an_in_place_rewrite_that_fails_leaves_the_assistant_as_it_was(pair, tmp_path, monkeypatch):
    """(a review) An in-place exact-kernels rewrite stages the bundle with hard links; the assistant graph's retype
    wrote through the link, so a rewrite stopped after it (Ctrl-C, an error) left the user's bundle with a file its
    manifest's sha256 refused. Now written as a new file renamed over the staged one."""
    import shutil

    import edgespec_export.mtp as mtp_mod
    from edgespec.integrity import sha256_file
    from edgespec.manifest import load_manifest
    from edgespec_export.kernels import apply_to_bundle

    b = tmp_path / "b"
    shutil.copytree(_export(pair, "b-int4", target="int4", target_precision="int4", drafter_precision="int4"), b)
    graph = b / "assistant" / "assistant.onnx"
    before = sha256_file(graph)

    def stop(root):
        raise KeyboardInterrupt

    monkeypatch.setattr(mtp_mod, "assistant_files", stop)
    with pytest.raises(KeyboardInterrupt):
        apply_to_bundle(b)
    assert sha256_file(graph) == before
    load_manifest(b, deep=True)


def test_a_float16_target_with_a_short_context_exports_its_assistant(pair):
    """(a review) A float16 target (the cuda layout's activations: its hidden states float16, cast to float32 in the
    graph now; before, the export's check failed with "Unexpected output data type") and a context shorter than the
    check's reading (it read window + 8 tokens past a 32-token context) export and decode as plain decoding."""
    import edgespec
    from edgespec.manifest import load_manifest

    b = _export(pair, "b-fp16", target_precision="fp16", max_context=32)
    assert load_manifest(b).target.kv_dtype == "float16"
    eng = edgespec.load(b, memory=False)
    ar = eng.generate(PROMPT, max_new_tokens=8, drafter="none", ignore_eos=True)
    for d in ("mtp", "auto"):
        assert eng.generate(PROMPT, max_new_tokens=8, drafter=d, ignore_eos=True).token_ids == ar.token_ids


def test_the_pair_check_refuses_a_target_that_is_no_gemma4(pair, tiny_dirs, monkeypatch):
    """(a review) A target read from a GGUF or the hub is checked once loaded: a model without Gemma 4's layer kinds
    was an AttributeError traceback; one line now. And an assistant named by a hub id is one (it went down the
    model drafter's path and was refused as an assistant)."""
    import transformers

    from edgespec.errors import ExportError
    from edgespec_export.bundle import _is_assistant
    from edgespec_export.mtp import check_pair
    from edgespec_export.source import Source

    acfg = transformers.AutoConfig.from_pretrained(str(pair["assistant"]))
    llama = transformers.AutoConfig.from_pretrained(str(tiny_dirs["llama"]))
    with pytest.raises(ExportError, match="drafts for Gemma 4 targets; the target is llama"):
        check_pair(acfg, llama, {})
    hub = Source("testorg/gemma-4-tiny-assistant", "hub", None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # (the hub's cache only: no ~25 s of retries where there is no network)
    assert not _is_assistant(hub)  # (not in any cache here)
    real, local = Source.from_pretrained_args, str(pair["assistant"])  # (the hub's copy: a local folder here)
    monkeypatch.setattr(Source, "from_pretrained_args", lambda self: (local, {}) if self.kind == "hub" else real(self))
    assert _is_assistant(hub) and not _is_assistant(Source(str(tiny_dirs["llama"]), "hf-dir", tiny_dirs["llama"]))


def test_the_assistant_attends_the_last_layer_of_each_kind_that_stores_its_cache():
    """``store_layers``: transformers' ``kv_sharing_modes`` "store" layers where the config names them; without
    them, the last layer of each kind before the shared ones (``num_kv_shared_layers``), or of all layers."""
    from types import SimpleNamespace

    from edgespec_export.mtp import store_layers

    s, f = "sliding_attention", "full_attention"
    kinds = [s, s, f, s, s, f]
    assert store_layers(SimpleNamespace(layer_types=kinds, kv_sharing_modes=[None, None, "store", "store", "reuse",
                                                                             "reuse"])) == {f: 2, s: 3}
    assert store_layers(SimpleNamespace(layer_types=kinds, num_kv_shared_layers=2)) == {s: 3, f: 2}
    assert store_layers(SimpleNamespace(layer_types=kinds, num_kv_shared_layers=0)) == {s: 4, f: 5}
    assert store_layers(SimpleNamespace(layer_types=kinds, kv_sharing_modes=[None] * 6)) == {s: 4, f: 5}
    # (transformers' own: the tiny E2B-like target's, its last two layers sharing)
    import transformers

    cfg = transformers.Gemma4TextConfig(layer_types=kinds, num_hidden_layers=6, num_kv_shared_layers=2)
    assert store_layers(cfg) == {s: 3, f: 2}


def test_the_pair_check_refuses_an_assistant_that_does_not_fit_its_target(pair):
    """``check_pair`` on its own (the export checks some of these earlier, from the configs on disk; a target read
    from a GGUF or the hub reaches this check only): the kinds the assistant attends, in its layers' order and only
    those, and one ExportError for each misfit."""
    import copy

    import transformers

    from edgespec.errors import ExportError
    from edgespec_export.mtp import check_pair

    t = transformers.AutoConfig.from_pretrained(str(pair["target"]))
    n = int(t.vocab_size)
    kv = {i: (1, 32 if k == "full_attention" else 16) for i, k in enumerate(t.layer_types)}
    assert list(check_pair(_assistant_config(n), t, kv).items()) == [("sliding_attention", 3), ("full_attention", 2)]
    rev = _assistant_config(n, layer_types=["full_attention", "sliding_attention", "full_attention"], num_hidden_layers=3,
                            num_kv_shared_layers=3)
    assert list(check_pair(rev, t, kv).items()) == [("full_attention", 2), ("sliding_attention", 3)]
    full = _assistant_config(n, layer_types=["full_attention"], num_hidden_layers=1, num_kv_shared_layers=1)
    assert check_pair(full, t, kv) == {"full_attention": 2}

    other = copy.deepcopy(t)
    other.model_type = "qwen3"
    chunked = _assistant_config(n)
    chunked.text_config.layer_types = ["sliding_attention", "chunked_attention"]
    for a, target, cache, message in (
            (_assistant_config(n), other, kv, "drafts for Gemma 4 targets; the target is qwen3"),
            (_assistant_config(n, backbone=48), t, kv, "trained with a target of hidden size 48, the target's is 64"),
            (_assistant_config(n - 10), t, kv, f"the assistant's vocabulary \\({n - 10}\\) is not the target's \\({n}\\)"),
            (_assistant_config(n + 10), t, kv, f"the assistant's vocabulary \\({n + 10}\\) is not the target's"),
            (chunked, t, kv, "layer 1 attends a chunked_attention layer, which the target has none of"),
            (_assistant_config(n), t, {**kv, 3: (1, 8)},
             "layer 0 \\(sliding_attention\\) reads 1 kv heads of 16 lanes, the target's layer 3 caches 1 of 8"),
            (_assistant_config(n), t, {**kv, 2: (2, 32)},
             "layer 1 \\(full_attention\\) reads 1 kv heads of 32 lanes, the target's layer 2 caches 2 of 32"),
            (_assistant_config(n, hidden_activation="silu"), t, kv, "activation 'silu' is not supported"),
            (_assistant_config(n, attn_logit_softcapping=50.0), t, kv, "attn_logit_softcapping is not supported")):
        with pytest.raises(ExportError, match=message):
            check_pair(a, target, cache)
    for act in ("gelu_pytorch_tanh", "gelu_new", "gelu_fast"):
        check_pair(_assistant_config(n, hidden_activation=act), t, kv)


@pytest.mark.parametrize("case", ["two-kv-heads", "rope-scaling", "embed-scale", "layer-scalars", "centroid-head",
                                  "untied-head"])
def test_the_assistant_graph_is_transformers_step_on_any_caches_it_is_given(tmp_path, case):
    """``build_assistant``'s graph alone (no exported target: random caches, hidden rows and an embedding table)
    against transformers' step on the same inputs, at positions before, at and past the window, reading a row of
    several: what the tiny pair's graph test cannot see there (one KV head, rotary scaling 1, layer scalars 1,
    Gemma's default embedding scale, a head tied to the table): two KV heads of three query heads each, a rotary
    scaling (yarn's), a given embedding scale, layer scalars, the centroid head with two KV heads, a head of its
    own."""
    import onnxruntime as ort
    import torch
    import transformers

    from conftest import pool_session_options
    from edgespec.errors import ExportError
    from edgespec_export.mtp import build_assistant, reference_step

    vocab, hb, kinds = 96, 64, ["sliding_attention", "sliding_attention", "full_attention"] * 2
    heads = 1 if case in ("rope-scaling", "embed-scale", "layer-scalars") else 2
    cfg = _assistant_config(vocab, ordered=case == "centroid-head", num_key_value_heads=heads,
                            num_attention_heads=6 if case == "two-kv-heads" else 4,
                            tie_word_embeddings=case != "untied-head")
    cfg.tie_word_embeddings = case != "untied-head"
    m = _assistant_model(cfg, seed=5)
    if case == "layer-scalars":
        with torch.no_grad():
            for i, layer in enumerate(m.model.layers):
                layer.layer_scalar.fill_(0.5 + i)
    if case == "rope-scaling":
        m.model.rotary_emb.full_attention_attention_scaling = 1.3
        m.model.rotary_emb.sliding_attention_attention_scaling = 0.8
    target = transformers.Gemma4TextConfig(hidden_size=hb, vocab_size=vocab, layer_types=kinds, num_hidden_layers=6,
                                           num_kv_shared_layers=2)
    target_kv = {i: (heads, 32 if k == "full_attention" else 16) for i, k in enumerate(kinds)}
    table = torch.randn(vocab, hb)
    scale = 3.0 if case == "embed-scale" else hb ** 0.5
    if case == "untied-head":
        assert m.lm_head.weight.data_ptr() != m.model.embed_tokens.weight.data_ptr()
    g = build_assistant(m, target, target_kv, "float32", tmp_path, table_dtype="float32", target_embed=table,
                        embed_scale=3.0 if case == "embed-scale" else None)
    for kv_dtype, embed, message in (("int8", table, "reads float16 or float32 KV caches, the target's are int8"),
                                     ("float16", None, "needs the target's input embedding")):
        with pytest.raises(ExportError, match=message):
            build_assistant(m, target, target_kv, kv_dtype, tmp_path / "no", target_embed=embed)
    sess = ort.InferenceSession(str(g.path), pool_session_options(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    cache = {k: tuple(rng.standard_normal((1, heads, 24, d)).astype(np.float32) for _ in "kv")
             for k, d in (("sliding_attention", 16), ("full_attention", 32))}
    hidden = rng.standard_normal((1, 3, hb)).astype(np.float32)
    for p, row in ((2, 0), (9, 2), (20, 1)):
        tok = int(rng.integers(vocab))
        feeds = {"token": np.array([tok], np.int64), "hidden": hidden, "row": np.array([row], np.int64),
                 "position": np.array([p], np.int64), "length": np.array([p], np.int64),
                 **{f"{w}_{k}": kv[i] for k, kv in cache.items() for i, w in enumerate(("key", "value"))}}
        got_l, got_h = sess.run(None, feeds)
        want_l, want_h = reference_step(m, table, scale, tok, hidden[0, row], p,
                                        {k: tuple(torch.from_numpy(a) for a in kv) for k, kv in cache.items()}, p)
        np.testing.assert_allclose(got_l[0], want_l, atol=1e-4 * np.abs(want_l).max())
        np.testing.assert_allclose(got_h[0], want_h, atol=1e-4 * np.abs(want_h).max())
        assert int(np.argmax(got_l[0])) == int(np.argmax(want_l))


def _edited_graph(g, out_dir, edit):
    """A copy of the assistant graph ``g`` with ``edit(name, array)`` applied to its initializers (None: kept)."""
    import dataclasses

    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(g.path))
    for i, t in enumerate(m.graph.initializer):
        new = edit(t.name, numpy_helper.to_array(t))
        if new is not None:
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(new), t.name))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / g.path.name
    onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=path.name + ".data")
    return dataclasses.replace(g, path=path)


def test_the_assistants_check_fails_a_graph_off_past_its_window_in_its_head_or_its_hidden_output(pair, fp32_bundle,
                                                                                                    tmp_path):
    """Planted bugs ``validate_assistant`` must refuse: a sliding layer attending one row more than its window (seen
    only at the positions past the window: a short prompt's check reads them too), logits 2% off (under any
    tolerance meant for rounding, over 1e-3), the next hidden state 2% off (the logits unchanged). The graph and
    its record: the parameters counted with the table's copy, the table's type."""
    from edgespec.errors import ExportError
    from edgespec.manifest import load_manifest
    from edgespec_export import mtp

    tspec = load_manifest(fp32_bundle).target
    target = _torch(pair["target"], "Gemma4ForCausalLM")
    asst = _torch(pair["assistant"], "Gemma4AssistantForCausalLM")
    kv = {i: tspec.kv_shape(i) for i in range(tspec.num_layers)}
    emb = target.get_input_embeddings().weight
    g = mtp.build_assistant(asst, target.config, kv, tspec.kv_dtype, tmp_path / "g", target_embed=emb)
    sd = asst.state_dict()
    assert g.table_dtype == "float16" and g.params == sum(v.numel() for v in sd.values()) + emb.numel()
    g32 = mtp.build_assistant(asst, target.config, kv, tspec.kv_dtype, tmp_path / "g32", table_dtype="float32",
                              target_embed=emb)
    assert g32.table_dtype == "float32"
    ids = list(np.random.default_rng(2).integers(0, len(pair["tok"]), 12))  # (the window is 8)
    assert mtp.validate_assistant(g, asst, target, tspec, ids) < 1e-5  # (the table's float16 rounding is the graph's)
    for stem, edit, where in (
            ("win", lambda a: a + 1, "position (9|10|11)"),
            ("lm_head", lambda a: a * 1.02, "position"),
            ("post_projection", lambda a: a * 1.02, "position")):
        bad = _edited_graph(g, tmp_path / stem, lambda name, a: edit(a) if name.startswith(stem + "_") else None)
        with pytest.raises(ExportError, match=f"does not match transformers' assistant at {where}"):
            mtp.validate_assistant(bad, asst, target, tspec, ids)

    # a quantized graph's comparison with its float one: the agreement of every position's argmax, the largest
    # difference relative to the logits' scale
    state = mtp.runtime_state(tspec, ids, g.sources)
    assert mtp.compare_assistants(g.path, g, ids, state) == (1.0, 0.0)
    scaled = _edited_graph(g, tmp_path / "scaled", lambda name, a: a * 1.02 if name.startswith("lm_head_") else None)
    agree, worst = mtp.compare_assistants(g.path, scaled, ids, state)
    assert agree == 1.0 and worst == pytest.approx(0.02, rel=1e-3)
    flipped = _edited_graph(g, tmp_path / "flipped", lambda name, a: -a if name.startswith("lm_head_") else None)
    agree, worst = mtp.compare_assistants(g.path, flipped, ids, state)
    assert agree < 0.5 and worst == pytest.approx(2.0, rel=1e-3)
    with pytest.raises(ExportError, match="the assistant's check reads 300 tokens, the target's context holds 256"):
        mtp.runtime_state(tspec, list(range(300)), g.sources)


@pytest.mark.parametrize("bits", [4, 8])
def test_a_quantized_assistant_has_the_bits_and_accuracy_level_asked_for(pair, fp32_bundle, tmp_path, bits):
    """``quantize_assistant``: every weight matrix a MatMulNBits of the bits, block and accuracy level asked for
    (the count returned), the tables left as they are, the root logger's level as it was (the quantizer's lines
    silenced while it runs); ``retype_kv`` changes the cache inputs' type only where it differs, keys and values."""
    import dataclasses
    import logging

    import onnx

    from edgespec.manifest import load_manifest
    from edgespec_export import mtp

    tspec = load_manifest(fp32_bundle).target
    target = _torch(pair["target"], "Gemma4ForCausalLM")
    asst = _torch(pair["assistant"], "Gemma4AssistantForCausalLM")
    kv = {i: tspec.kv_shape(i) for i in range(tspec.num_layers)}
    g = mtp.build_assistant(asst, target.config, kv, "float32", tmp_path / "f",
                            target_embed=target.get_input_embeddings().weight)
    before = sum(n.op_type == "MatMul" for n in onnx.load(str(g.path), load_external_data=False).graph.node)
    q = dataclasses.replace(g, path=tmp_path / "q" / mtp.GRAPH_NAME)
    q.path.parent.mkdir()
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.DEBUG)
    try:
        n = mtp.quantize_assistant(g.path, q, bits, block_size=16, accuracy_level=1)
        assert root.level == logging.DEBUG
    finally:
        root.setLevel(level)
    m = onnx.load(str(q.path), load_external_data=False)
    nodes = [x for x in m.graph.node if x.op_type == "MatMulNBits"]
    # (the MatMuls with a constant weight: projections, layer matrices, the head; Q times K and the softmax times V stay)
    assert n == len(nodes) == before - sum(x.op_type == "MatMul" for x in m.graph.node) and n >= 2 + 2 * 5 + 1
    for x in nodes:
        attrs = {a.name: a.i for a in x.attribute}
        assert (attrs["bits"], attrs["block_size"], attrs["accuracy_level"]) == (bits, 16, 1), attrs
    assert {x.op_type for x in m.graph.node if x.input and x.input[0].startswith("target_embed")} == {"Gather"}

    assert not mtp.retype_kv(q.path, "float32")
    assert mtp.retype_kv(q.path, "float16") and not mtp.retype_kv(q.path, "float16")
    types = {i.name: i.type.tensor_type.elem_type for i in onnx.load(str(q.path), load_external_data=False).graph.input}
    assert {k for k, t in types.items() if t == onnx.TensorProto.FLOAT16} == {
        f"{w}_{k}" for w in ("key", "value") for k in ("sliding_attention", "full_attention")}


def test_mtp_drafts_stop_and_calibrate_as_the_model_drafter_s(fp32_bundle):
    """A fixed-length draft (a request's draft_tokens: no threshold) ends after a token the assistant is less than
    DRAFT_MIN_CONFIDENCE sure of; a dynamic one runs to the threshold on its calibrated confidence, and the target's
    verdicts move the calibration (lam) down where the assistant was surer than the target kept, apart for greedy
    and sampled generations, not in a seeded one (history off)."""
    import edgespec
    from edgespec.drafters import DRAFT_MIN_CONFIDENCE, _top_prob
    from edgespec.kv import TokenBuffer
    from edgespec.sampling import SamplingParams

    eng = edgespec.load(fp32_bundle, memory=False)
    d = eng.decoder.drafters["mtp"]
    ids = eng.tokenizer.encode(PROMPT)
    greedy = SamplingParams(0.0)
    eng.decoder.target.prefill(ids[:-1])
    d.observe_hidden(-1)
    ctx = TokenBuffer(ids)
    whole = d.draft(ctx, 4, greedy, np.random.default_rng(0), stop=0.0)
    assert len(whole.tokens) == 4
    logits, _ = d.step(ids[-1], d._hidden, len(ids) - 1)
    fixed = d.draft(ctx, 4, greedy, np.random.default_rng(0))
    assert _top_prob(logits) < DRAFT_MIN_CONFIDENCE and fixed.tokens == whole.tokens[:1]  # (the random assistant)
    before = d.calibration(True)
    d.draft(ctx, 4, greedy, np.random.default_rng(0), stop=0.0)
    d.accept(0, 1)  # the target kept none: the first token's confidence was too high
    assert d.calibration(True) < before and d.calibration(False) == before
    d.history = False
    assert d.calibration(True) == 1.0


def test_mtp_drafts_for_an_image_text_target(pair):
    """Gemma 4 E2B and E4B ship as ``Gemma4ForConditionalGeneration`` (a vision tower beside the text decoder): their
    assistant's drafts equal transformers' drafting with that model, and the output equals plain decoding."""
    import edgespec
    from edgespec.mtp import MtpDrafter
    from test_archs import _gemma4

    d = _gemma4(pair["root"] / "target-it", "e2b", plain=False, image_text=True)
    pair = {**pair, "target-it": d}
    b = _export(pair, "b-image-text", target="target-it", target_precision="fp32")
    eng = edgespec.load(b, memory=False)
    seen, real = [], MtpDrafter.draft

    def draft(self, ctx, k, sp, rng, **kw):
        got = real(self, ctx, k, sp, rng, **kw)
        seen.append((ctx.tolist(), got.tokens))
        return got

    ar = eng.generate(PROMPT, max_new_tokens=24, drafter="none", ignore_eos=True)
    MtpDrafter.draft = draft
    try:
        assert eng.generate(PROMPT, max_new_tokens=24, drafter="mtp", ignore_eos=True).token_ids == ar.token_ids
    finally:
        MtpDrafter.draft = real
    target = _torch(d, "Gemma4ForConditionalGeneration")
    asst = _torch(pair["assistant"], "Gemma4AssistantForCausalLM")
    assert any(t for _, t in seen)
    for ctx, tokens in seen[:6]:
        assert tokens == _reference_draft(target, asst, ctx, len(tokens))[0], (len(ctx), tokens)


@pytest.mark.parametrize("side, old, new", [("input", "length", "total_length"),
                                             ("output", "next_hidden", "hidden_out")])  # (session 79, mutant T1)
def test_an_assistant_graph_with_other_inputs_is_refused_at_load(fp32_bundle, tmp_path, side, old, new):
    """An assistant graph whose inputs or outputs are not the runtime's (a bundle written by another edgespec, its
    files and manifest consistent): refused at load in one line, not a failure at the first draft."""
    import json

    import onnx

    import edgespec
    from edgespec.errors import BundleError
    from edgespec_export.mtp import GRAPH_NAME, assistant_files

    b = _edit_manifest(fp32_bundle, tmp_path, lambda r: None)
    path = b / "assistant" / GRAPH_NAME
    m = onnx.load(str(path), load_external_data=False)
    for i in getattr(m.graph, side):
        if i.name == old:
            i.name = new
    for node in m.graph.node:
        names = getattr(node, side)
        names[:] = [new if n == old else n for n in names]
    onnx.save(m, str(path))
    raw = json.loads((b / "edgespec.json").read_text())
    raw["models"]["assistant"]["files"] = assistant_files(b)
    (b / "edgespec.json").write_text(json.dumps(raw))
    with pytest.raises(BundleError, match="inputs and outputs are not an assistant's") as e:
        edgespec.load(b, memory=False)
    assert new in str(e.value) and "\n" not in str(e.value)
    edgespec.load(b, memory=False, use_drafter=False)  # (the target alone still runs)


def test_an_assistant_it_cannot_read_is_one_line(pair, tmp_path, capsys):
    """An assistant folder whose config is an assistant's but whose weights cannot be read (a truncated download):
    exit 6 in one line that names it, no traceback, nothing written."""
    import shutil

    from edgespec.cli import main

    broken = tmp_path / "broken"
    shutil.copytree(pair["assistant"], broken)
    weights = next(broken.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(SystemExit) as e:
        main(["export", str(pair["target"]), "--drafter", str(broken), "-o", str(tmp_path / "b"),
              "--target-precision", "fp32", "--no-quality", "--max-context", "64"])
    assert e.value.code == 6
    err = capsys.readouterr().err.strip().splitlines()
    assert f"cannot load the assistant {broken}" in err[-1] and "Traceback" not in "".join(err), err[-1]
    assert not (tmp_path / "b").exists()


def test_a_quantized_assistant_that_disagrees_with_its_float_graph_is_not_written(pair, tmp_path, monkeypatch):
    """The int8/int4 assistant is compared with the float graph it was made from; under half its top-1 choices the
    same, the export stops saying so (and what to do), and no bundle is written."""
    import edgespec_export.mtp as mtp_mod
    from edgespec.errors import ExportError

    seen = []
    real = mtp_mod.compare_assistants

    def worse(*a, **kw):
        agree, diff = real(*a, **kw)
        seen.append(agree)
        return 0.4, diff

    monkeypatch.setattr(mtp_mod, "compare_assistants", worse)
    out = tmp_path / "b"
    from edgespec_export import export_bundle

    with pytest.raises(ExportError, match=r"the int8 assistant disagrees with its float graph \(top-1 agreement "
                                          r"0\.40\): not written; export it at --drafter-precision fp32"):
        export_bundle(str(pair["target"]), out, drafter=str(pair["assistant"]), max_context=64,
                      target_precision="fp32", drafter_precision="int8", quality=False)
    assert seen and seen[0] >= 0.5  # (the real comparison ran, and passed)
    assert not out.exists()


def test_a_profile_may_name_mtp(fp32_bundle, tiny_bundle, tmp_path):
    """(an audit) ``--drafter mtp`` and ``drafter="mtp"`` were taken, a profile's ``drafter = "mtp"`` was refused:
    it loads the assistant and drafts with it by default (outputs plain decoding's); on a bundle without one, as a
    profile's ``model`` there, prompt lookup; a drafter no profile can default to is one line."""
    import edgespec
    from edgespec.errors import ProfileError

    def profile(drafter):
        p = tmp_path / f"{drafter}.toml"
        p.write_text(f'memory_budget_mb = 4096\nproviders = ["cpu"]\ndrafter = "{drafter}"\n')
        return str(p)

    eng = edgespec.load(fp32_bundle, memory=False, profile=profile("mtp"))
    assert eng.plan.default_drafter == "mtp" and "assistant" in eng.plan.weights
    ar = eng.generate(PROMPT, max_new_tokens=12, drafter="none", ignore_eos=True)
    got = eng.generate(PROMPT, max_new_tokens=12, ignore_eos=True)
    assert got.token_ids == ar.token_ids and got.stats["drafted_by_drafter"].get("mtp", 0) > 0
    assert edgespec.load(tiny_bundle, memory=False, profile=profile("mtp")).plan.default_drafter == "prompt-lookup"
    with pytest.raises(ProfileError, match="drafter = 'prediction' is not auto, model, mtp, prompt-lookup, suffix or none"):
        edgespec.load(tiny_bundle, memory=False, profile=profile("prediction"))


def test_the_assistant_offers_only_from_the_targets_newest_state_and_counts_its_steps(fp32_bundle, monkeypatch):
    """(session 79, mutants T14-T17, T22-T24) The assistant offers a draft, one that ends on its confidence (the
    round policy then sets its stop), only where the hidden state it holds is the target's newest (no target call
    since it was handed over) and the target holds the context before its last token; a draft of nothing is no offer.
    Each step counts in its ``lm`` counters, as a model drafter's calls do in the decoder's stats."""
    import itertools

    import edgespec
    from edgespec import mtp
    from edgespec.kv import TokenBuffer
    from edgespec.sampling import SamplingParams

    eng = edgespec.load(fp32_bundle, memory=False)
    d, target = eng.decoder.drafters["mtp"], eng.decoder.target
    ids = eng.tokenizer.encode(PROMPT)
    target.prefill(ids[:-1])
    d.observe_hidden(-1)
    ctx = TokenBuffer(ids)
    offer = d.offer(ctx, 3)
    assert offer is not None and offer.max_tokens == 3 and offer.dynamic
    assert d.offer(ctx, 0) is None
    assert d.offer(TokenBuffer(ids + [ids[-1]]), 3) is None  # the target does not hold the context before its last
    clock = itertools.count()
    monkeypatch.setattr(mtp.time, "perf_counter", lambda: float(next(clock)))  # (each step: 1 s)
    calls, run, secs = d.lm.calls, d.lm.tokens_run, d.lm.call_seconds
    draft = d.draft(ctx, 3, SamplingParams(0.0), np.random.default_rng(0), stop=0.0)
    assert len(draft.tokens) == 3
    assert (d.lm.calls - calls, d.lm.tokens_run - run, d.lm.call_seconds - secs) == (3, 3, 3.0)
    monkeypatch.undo()
    target.forward([ids[-1]])  # a target call whose hidden state was not handed over
    assert d.offer(TokenBuffer(ids + [7]), 3) is None  # (the target holds the context before the last token again)


def test_an_assistant_run_that_fails_is_a_one_line_bundle_error(fp32_bundle, monkeypatch):
    """(session 79, mutant T21) onnxruntime's own error in an assistant step is a BundleError whose one line keeps
    onnxruntime's first line, not an untyped traceback."""
    import edgespec
    from edgespec.errors import BundleError

    eng = edgespec.load(fp32_bundle, memory=False)
    d = eng.decoder.drafters["mtp"]

    def fail(binding):
        raise RuntimeError("[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : Non-zero status code\nmore detail")

    monkeypatch.setattr(d.session, "run_with_iobinding", fail)
    with pytest.raises(BundleError, match="the assistant failed to run: .*RUNTIME_EXCEPTION") as e:
        d.step(1, d._hidden, 0)
    assert "\n" not in str(e.value) and "more detail" not in str(e.value)


def test_an_assistant_beside_a_target_on_a_gpu_is_left_out_with_a_warning(fp32_bundle):
    """(session 79, mutant T9) The assistant reads the target's hidden state on the host: where the target's cache
    lives on a GPU it is not loaded (a warning says why) rather than drafting from buffers it cannot read."""
    from types import SimpleNamespace

    from edgespec.manifest import load_manifest
    from edgespec.mtp import MtpDrafter

    m = load_manifest(fp32_bundle)
    gpu_target = SimpleNamespace(cache=SimpleNamespace(host=False), device="cuda", keeps_hidden=lambda: True)
    env = SimpleNamespace(manifest=m, target=gpu_target, plan=SimpleNamespace(weights={"assistant": 1}))
    with pytest.warns(UserWarning, match="drafts on the CPU only for now: not loaded \\(the target runs on cuda\\)"):
        assert MtpDrafter.build(env) is None


def _scripted(eng, monkeypatch, tops, vocab=5000, tail=-30.0):
    """The engine's mtp drafter, ready to draft at the prompt (the target prefilled, its hidden state handed over),
    its steps scripted: step i returns a row of ``vocab`` logits whose top token (i + 1) has softmax probability
    ``tops[i]``, written into one buffer each step overwrites (as the graph's bound output is). Returns (drafter,
    context, the rows as they were returned)."""
    from edgespec.kv import TokenBuffer

    d = eng.decoder.drafters["mtp"]
    ids = eng.tokenizer.encode(PROMPT)
    eng.decoder.target.prefill(ids[:-1])
    d.observe_hidden(-1)
    rows = []
    for i, p in enumerate(tops):
        row = np.full(vocab, tail, dtype=np.float32) + np.float32(0.01 * i) * np.arange(vocab, dtype=np.float32) / vocab
        row[:8] = 0.0  # (a few near tokens beside the top one)
        row[i + 1] = 0.0
        rest = float(np.exp(row.astype(np.float64)).sum() - 1.0)
        row[i + 1] = np.float32(np.log(p * rest / (1.0 - p)))
        rows.append(row)
    buf, nxt, it = np.empty(vocab, dtype=np.float32), np.zeros((1, d.spec.target_hidden_size), np.float32), iter(rows)

    def step(token, hidden, position):
        buf[:] = next(it)
        return buf, nxt

    monkeypatch.setattr(d, "step", step)
    return d, TokenBuffer(ids), rows


def test_an_mtp_draft_stops_on_its_calibrated_confidence_and_keeps_each_steps_q(fp32_bundle, monkeypatch):
    """(session 79, mutants T28, T29, T31, T35-T37) With scripted steps: a dynamic draft ends where the product of
    its calibrated top probabilities, each clipped at 1, falls below the stop (lam 0.5: after one token sure at 0.9;
    lam 1.5: a 0.8 token counts as sure, not as 1.2 that would carry the draft past a 0.3 one). A sampled draft's q
    of each step stays that step's, over a vocabulary large enough for a lazy tail (the graph's buffer is the next
    step's). Only a dynamic draft in a generation with history teaches the calibration; a step's time is the draft's
    over its tokens."""
    import edgespec
    from edgespec.sampling import SamplingParams, distribution

    eng = edgespec.load(fp32_bundle, memory=False)
    greedy, rng = SamplingParams(0.0), np.random.default_rng(0)
    for lam, tops, want in ((0.5, [0.9] * 4, 1), (1.5, [0.8, 0.3, 0.9, 0.9], 2), (1.0, [0.9] * 4, 4)):
        d, ctx, _ = _scripted(eng, monkeypatch, tops)
        monkeypatch.setattr(d, "calibration", lambda g, lam=lam: lam)
        assert d.draft(ctx, 4, greedy, rng, stop=0.5).tokens == list(range(1, want + 1)), lam
        monkeypatch.undo()
    sp = SamplingParams(1.0)
    d, ctx, rows = _scripted(eng, monkeypatch, [0.5] * 4)
    draft = d.draft(ctx, 4, sp, rng, stop=0.0)
    assert len(draft.probs) == 4
    for q, row in zip(draft.probs, rows):
        ref = distribution(row.copy(), sp).exact()
        got = q.exact()
        for t in (0, 9, 4999):  # a near token and two of the tail
            assert got.prob(t) == pytest.approx(ref.prob(t), rel=1e-4, abs=0)  # (the tail weighs ~1e-14)
    monkeypatch.undo()
    for stop, history, teaches in ((None, True, False), (0.0, False, False), (0.0, True, True)):
        d, ctx, _ = _scripted(eng, monkeypatch, [0.9] * 4)
        d.history = history
        ticks = iter([10.0, 16.0])
        monkeypatch.setattr(d, "clock", lambda: next(ticks))
        before = [list(c) for c in d._calib.values()]
        draft = d.draft(ctx, 3, greedy, rng, stop=stop)
        d.accept(0, 1)
        assert ([list(c) for c in d._calib.values()] != before) == teaches, (stop, history)
        assert draft.step_s == pytest.approx(6.0 / len(draft.tokens))
        d.history = True
        monkeypatch.undo()


def test_the_targets_hidden_states_are_its_rows_and_kept_as_copies(fp32_bundle, monkeypatch):
    """(session 80, mutation test of onnx_lm.py: O24-O27) A target with a hidden-state output binds it once asked
    (``keeps_hidden``), on the CPU only: not where its cache is on a device or its calls replay CUDA graphs (neither
    binds it). ``hidden_of`` gives a row of the last call's returned rows, counted from either end, as a copy the
    next call leaves alone; a row past them is an IndexError, not another row's state. A call wider than the kept
    buffer grows it: row 39 of a 40-token call is the state a one-token call at position 39 computes."""
    from edgespec.manifest import load_manifest
    from edgespec.onnx_lm import OWN_LOGITS_MAX_WIDTH, OnnxLM
    from edgespec.providers import choose

    spec = load_manifest(fp32_bundle).target
    lm = OnnxLM(spec, 128, choose(["cpu"]), min_width=1)
    with pytest.raises(IndexError, match="no hidden state of row 0"):
        lm.hidden_of(0)
    with monkeypatch.context() as mp:
        mp.setattr(lm, "graphs", object())
        assert not lm.keeps_hidden()
        mp.setattr(lm.cache, "host", [])
        mp.setattr(lm, "graphs", None)
        assert not lm.keeps_hidden()
    assert not lm._keep_hidden and lm.keeps_hidden()
    ids = [(7 * i + 3) % (spec.vocab_size - 3) + 3 for i in range(OWN_LOGITS_MAX_WIDTH + 8)]
    n = len(ids)
    lm.forward(ids[:2])  # (the buffer made for the first call's rows, then grown)
    lm.reset()
    lm.forward(ids)
    last = lm.hidden_of(-1)
    assert last.shape == (spec.hidden_size,) and np.array_equal(lm.hidden_of(n - 1), last)
    for row in (n, -n - 1):
        with pytest.raises(IndexError, match=f"no hidden state of row {row} \\(the last call returned {n} rows\\)"):
            lm.hidden_of(row)
    lm.reset()
    assert lm.skips_logits
    lm.forward_from(ids, n - 1)  # (session 97, ON32) a call skipping all but its last row's logits: that row's state
    assert np.allclose(lm.hidden_of(0), last, atol=1e-4) and np.array_equal(lm.hidden_of(-1), lm.hidden_of(0))
    lm.rewind(1)
    lm.forward(ids[-1:])
    assert np.allclose(lm.hidden_of(0), last, atol=1e-4)  # (position 39 alone, as in the wide call)
    one = lm.hidden_of(0)
    kept = one.copy()
    lm.forward([5])
    assert np.array_equal(one, kept) and not np.allclose(lm.hidden_of(-1), kept)
    with pytest.raises(IndexError):
        lm.hidden_of(1)


def test_an_int8_assistant_beside_an_int4_target_records_what_it_was_built_as(pair, tmp_path):
    """(session 89) The assistant is built as its own options say, not the target's, and recorded so: int8 weight
    matrices (not 4-bit) at the drafter's block size, "int8" in the manifest beside an int4 target, its copy of the
    target's table float16 (an int4 target's; fp32's is float32) counted at the target's width, its centroid head
    and its check's figure; the manifest names it the assistant, in sources and source_files."""
    import onnx

    from edgespec.manifest import load_manifest
    from edgespec_export import export_bundle
    from edgespec_export.build import QuantOptions

    ordered = _assistant(tmp_path / "ordered", pair["tok"], ordered=True, seed=2)
    out = export_bundle(str(pair["int4"]), tmp_path / "b", drafter=str(ordered), target_precision="int4",
                        drafter_precision="int8", drafter_quant=QuantOptions(block_size=16, accuracy_level=4),
                        max_context=256, quality=False)
    m = load_manifest(out)
    a = m.assistant
    assert a.precision == "int8" and m.target.precision == "int4" and a.ordered and 0 < a.validated < 1e-3, a
    assert a.embedding_bytes == a.vocab_size * a.target_hidden_size * 2 and a.target_hidden_size != a.hidden_size
    g = onnx.load(str(a.path), load_external_data=False).graph
    tables = [t for t in g.initializer if t.name.startswith("target_embed")]
    assert tables and {t.data_type for t in tables} == {onnx.TensorProto.FLOAT16}
    nodes = [n for n in g.node if n.op_type == "MatMulNBits"]
    attrs = [{x.name: x.i for x in n.attribute} for n in nodes]
    assert attrs and all(a["bits"] == 8 and a["block_size"] == 16 for a in attrs), attrs
    assert m.sources == {"target": str(pair["int4"]), "assistant": str(ordered)}
    assert set(m.source_files) == {"target", "assistant"} and m.source_files["assistant"]


def test_an_assistant_attending_other_layers_than_the_targets_shared_caches_is_not_written(pair, tmp_path,
                                                                                            monkeypatch):
    """(session 89) The target's shared layers (E2B's last two read layers 3 and 2's caches) and the assistant's
    sources, found separately, must name the same layers; planted: the assistant's graph attending another sliding
    layer (1), refused before its check runs, nothing written."""
    import dataclasses

    from edgespec.errors import ExportError
    from edgespec_export import export_bundle, mtp

    real = mtp.build_assistant

    def build_assistant(*a, **kw):
        g = real(*a, **kw)
        assert g.sources["sliding_attention"] == 3
        return dataclasses.replace(g, sources={**g.sources, "sliding_attention": 1})

    monkeypatch.setattr(mtp, "build_assistant", build_assistant)
    with pytest.raises(ExportError, match="sliding_attention layers share layer 3's cache, the assistant would attend "
                                          "layer 1's: not written"):
        export_bundle(str(pair["target"]), tmp_path / "b", drafter=str(pair["assistant"]), target_precision="fp32",
                      max_context=256, quality=False)
    assert not (tmp_path / "b").exists()
