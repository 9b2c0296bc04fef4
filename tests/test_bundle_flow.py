"""(session 89) export/bundle.py's export flow as the Python API reaches it (``export_bundle``), up to the builds:
what it refuses before reading or writing anything (the CLI has its own checks, which stop most of these first),
and what each model's build is asked for. The builds themselves are stood in for (``_export_one`` records its
arguments and stops the export), so these take a second; test_export, test_layout and test_mtp export for real.
Mutation-tested (docs/bench/mutation_s89.md)."""
from __future__ import annotations

import json
import signal
from types import SimpleNamespace

import pytest

from edgespec.errors import ExportError


class _Stop(Exception):
    """The stand-in build's end of the export."""


@pytest.fixture
def builds(monkeypatch):
    """``_export_one`` recording (role, precision, quant, device, its keywords) and stopping the export at the last
    model asked for (``builds.stop_at``: "target" or "drafter"); no builder's zygote started."""
    from edgespec_export import bundle

    calls: list = []

    def export_one(role, src, tok, stage, precision, quant, max_context, fp, progress, quality_fn=None,
                   device="cpu", **kw):
        calls.append((role, precision, quant, device, kw))
        if role == stop_at[0]:
            raise _Stop(role)
        return object()

    stop_at = ["target"]
    monkeypatch.setattr(bundle, "_export_one", export_one)
    monkeypatch.setattr(bundle, "prestart_builder", lambda: None)
    return SimpleNamespace(calls=calls, stop_at=stop_at)


def _export(target, out, **kw):
    from edgespec_export import export_bundle

    return export_bundle(str(target), out, quality=False, **kw)


def test_the_drafters_options_are_its_own(tiny_dirs, tmp_path, builds):
    """The drafter is built at its own precision, layout and quantization: its default precision that of its own
    layout (fp16 in the cuda layout, which has no fp32: the target's cpu layout gave fp32, refused), and its
    default quantization accuracy level 4 whatever the target's options (it was the target's block size)."""
    from edgespec_export.build import QuantOptions

    builds.stop_at[0] = "drafter"
    with pytest.raises(_Stop):
        _export(tiny_dirs["qwen2"], tmp_path / "b", drafter=str(tiny_dirs["drafter"]), drafter_device="cuda",
                target_precision="int4", quant=QuantOptions(block_size=128))
    (trole, tprec, tquant, tdev, _), (drole, dprec, dquant, ddev, _) = builds.calls
    assert (trole, tprec, tquant.block_size, tdev) == ("target", "int4", 128, "cpu")
    assert (drole, dprec, ddev) == ("drafter", "fp16", "cuda") and dquant == QuantOptions(accuracy_level=4)
    builds.calls.clear()
    with pytest.raises(_Stop):
        _export(tiny_dirs["qwen2"], tmp_path / "b", drafter=str(tiny_dirs["drafter"]), drafter_precision="int4",
                drafter_quant=QuantOptions(block_size=64, accuracy_level=4))
    assert builds.calls[1][1] == "int4" and builds.calls[1][2].block_size == 64 and builds.calls[1][3] == "cpu"


@pytest.mark.parametrize("case", ["corpus-alone", "short-context", "kv-dtype", "fp32-block-size", "holds-drafter",
                                  "tokenizers-differ"])
def test_the_api_refuses_what_the_cli_refuses_before_any_build(tiny_dirs, tmp_path, builds, case):
    """The Python API refuses in one ExportError, before any build and leaving nothing at ``out``, what the CLI's own
    checks stop first: a corpus without --drafter-vocab (with a drafter too), a context under 16 tokens, a KV dtype
    exact-kernels has not, an option the target's precision does not use, an output holding the drafter, and a
    drafter with another tokenizer (after the export's SIGTERM handler was put in: it is taken out again)."""
    from edgespec_export.build import QuantOptions

    out = tmp_path / "b"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text\n")
    kw = {"drafter": str(tiny_dirs["drafter"])}
    if case == "corpus-alone":
        kw["drafter_vocab_corpus"], message = [str(corpus)], "--drafter-vocab-corpus applies with --drafter-vocab N"
    elif case == "short-context":
        kw["max_context"], message = 15, "--max-context must be at least 16, got 15"
    elif case == "kv-dtype":
        kw.update(exact_kernels=True, kv_dtype="bfloat16", target_precision="int4")
        message = "bfloat16"
    elif case == "fp32-block-size":
        kw.update(target_precision="fp32", quant=QuantOptions(block_size=64))
        message = "--block-size applies to int4/int8/fp8 targets, not fp32"
    elif case == "holds-drafter":
        import shutil

        out.mkdir()
        (out / "edgespec.json").write_text("{}")
        shutil.copytree(tiny_dirs["drafter"], out / "drafter")
        kw.update(drafter=str(out / "drafter"), force=True)
        message = "holds the export's input"
    else:
        kw["drafter"], message = str(tiny_dirs["other"]), "tokenizer"
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(ExportError) as e:
        _export(tiny_dirs["qwen2"], out, **kw)
    assert message in str(e.value) and "\n" not in str(e.value).strip(), str(e.value)
    assert not builds.calls and signal.getsignal(signal.SIGTERM) is before
    assert not out.exists() or case == "holds-drafter" and (out / "drafter" / "config.json").is_file()


def test_the_assistant_checks_read_a_folder_as_it_is(tmp_path):
    """``_is_assistant``: a folder whose config.json is no JSON is no assistant (the drafter's own path then says
    why); ``_config_vocab``: an image-text folder's vocabulary is its text config's; ``_check_config_early``: Gemma 4
    with experts is refused where its text config says so (the image-text 26B-A4B's top level does not)."""
    import transformers

    from edgespec_export.bundle import _check_config_early, _config_vocab, _is_assistant
    from edgespec_export.source import Source, resolve

    bad = tmp_path / "bad"
    bad.mkdir()
    src = Source(str(bad), "hf-dir", bad)  # (resolve refuses such a folder itself; a config changed since, not)
    (bad / "config.json").write_text("{not json")
    assert _is_assistant(src) is False
    (bad / "config.json").write_text(json.dumps(["gemma4_assistant"]))
    assert _is_assistant(src) is False
    (bad / "config.json").write_text(json.dumps({"model_type": "gemma4_assistant"}))
    assert _is_assistant(src) is True

    text = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, global_head_dim=16, layer_types=["sliding_attention",
                                                                                    "full_attention"])
    it = tmp_path / "image-text"
    transformers.Gemma4Config(text_config=transformers.Gemma4TextConfig(**text)).save_pretrained(it)
    (it / "model.safetensors").write_bytes(b"")
    assert _config_vocab(resolve(str(it))) == 300
    _check_config_early(resolve(str(it)), "target")
    moe = tmp_path / "image-text-moe"
    transformers.Gemma4Config(text_config=transformers.Gemma4TextConfig(
        **text, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=16)).save_pretrained(moe)
    (moe / "model.safetensors").write_bytes(b"")
    with pytest.raises(ExportError, match="Gemma 4 with experts"):
        _check_config_early(resolve(str(moe)), "target")


@pytest.mark.slow
def test_a_pairs_bundle_holds_what_its_sources_say_and_nothing_of_the_build(tiny_dirs, tmp_path, monkeypatch):
    """(a real export of the tiny fp32 pair from folders, ~20 s) The bundle's recommended sampling is the target's
    (the drafter's generation config says another), its EOS ids are the target's generation config's, a plain
    token among them kept by --drafter-vocab's head; its tokenizer_config.json carries the chat template the manifest
    does; each model's folder holds its graph, data and genai_config.json only, and nothing the build left (its
    float32 copies, the builder's cache) is published. Its progress counts its steps, 1 to N."""
    import io
    import shutil

    from conftest import check_steps
    from edgespec_export import bundle

    from edgespec.manifest import load_manifest

    real = bundle.run_builder

    def run_builder(hf_dir, out_dir, cache_dir, *a, **kw):  # (the builder's cache, kept where it downloaded into it)
        made = real(hf_dir, out_dir, cache_dir, *a, **kw)
        cache_dir.mkdir(exist_ok=True)
        (cache_dir / "downloaded").write_text("a file the builder fetched")
        return made

    monkeypatch.setattr(bundle, "run_builder", run_builder)
    t, d = tmp_path / "t", tmp_path / "d"
    shutil.copytree(tiny_dirs["qwen2"], t)
    shutil.copytree(tiny_dirs["drafter"], d)
    # (the target's folder holds a .gguf too, a download of both: built from a float32 copy of the model as
    # transformers read it, as the builder handed the folder takes the GGUF file for the model; this one is none)
    (t / "model-q4.gguf").write_bytes(b"GGUF" + bytes(64))
    tok = json.loads((t / "tokenizer.json").read_text())
    plain = max(tok["model"]["vocab"].values())  # (a BPE merge, the last: no special token, past the head's first N)
    eos = json.loads((t / "config.json").read_text())["eos_token_id"]
    (t / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, plain], "temperature": 0.6,
                                                          "do_sample": True}))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "temperature": 1.3, "top_p": 0.5,
                                                          "do_sample": True}))
    said = io.StringIO()
    out = _export(t, tmp_path / "b", drafter=str(d), target_precision="fp32", drafter_precision="fp32",
                  drafter_vocab=200, max_context=64, stream=said)
    check_steps(said.getvalue())  # (the drafter's folder has no float32 copy to write, the target's has)
    copies = [line for line in said.getvalue().splitlines() if "writing a float32 Hugging Face copy" in line]
    assert len(copies) == 1 and "] target: writing" in copies[0], copies
    m = load_manifest(out)
    assert m.sampling_defaults == {"temperature": 0.6}, m.sampling_defaults
    assert plain in m.eos_token_ids and eos in m.eos_token_ids
    assert plain in set(m.drafter.load_head_ids(m.tokenizer_vocab_size).tolist())
    cfg = json.loads((out / "tokenizer" / "tokenizer_config.json").read_text())
    assert m.chat_template and cfg["chat_template"] == m.chat_template
    assert sorted(p.name for p in out.iterdir()) == ["drafter", "edgespec.json", "target", "tokenizer"]
    for role, want in (("target", {"model.onnx", "model.onnx.data", "genai_config.json"}),
                       ("drafter", {"model.onnx", "model.onnx.data", "head_ids.npy"})):  # (a cut head: no genai config)
        assert {p.name for p in (out / role).iterdir()} == want, role


@pytest.mark.slow
def test_an_exact_kernels_export_takes_its_kv_dtype_and_an_untied_model_its_zero_points(tmp_path):
    """(a real export of a tiny INT4 target, ~20 s) ``--exact-kernels --kv-dtype int8`` in the export itself: the
    rewrite gets the dtype asked for (its default is float16), and the device lines printed at the end are the
    rewritten bundle's (KV int8, not the builder's float32). The tiny target's embeddings are untied: its zero
    points, asked for, are kept (the symmetric fallback is for a tied table, which the builder shares)."""
    import io

    from edgespec_export.build import QuantOptions

    from edgespec.manifest import load_manifest

    from tiny import make_model

    said = io.StringIO()
    d = make_model(tmp_path / "q", "qwen2", seed=5, heads=2, kv_heads=1)  # (heads of 32 lanes: int8 caches' groups)
    assert json.loads((d / "config.json").read_text())["tie_word_embeddings"] is False
    out = _export(d, tmp_path / "b", target_precision="int4", max_context=64, exact_kernels=True,
                  kv_dtype="int8", quant=QuantOptions(symmetric=False), stream=said)
    m = load_manifest(out)
    assert m.target.kv_dtype == "int8" and m.target.quant.symmetric is False, m.target.quant
    lines = said.getvalue().splitlines()
    assert not any("tied embeddings" in line for line in lines)
    gpu = [line for line in lines if "on a GPU provider's device" in line]
    assert len(gpu) == 1 and "KV int8" in gpu[0], gpu


@pytest.mark.slow
@pytest.mark.parametrize("case", ["appeared", "unreadable"])
def test_an_export_publishes_only_a_manifest_that_reads_back_over_nothing_made_meanwhile(tiny_dirs, tmp_path,
                                                                                         monkeypatch, case):
    """(a real export of the tiny fp32 target, ~10 s) A folder made at ``-o`` while the export ran (another
    program's, the user's) is not moved aside and deleted: the export fails in one line and it stays as it was. A
    manifest that would not read back (here: a recommended temperature the schema refuses) is not published: the
    runtime could not load the bundle."""
    from edgespec_export import bundle

    out = tmp_path / "b"
    if case == "appeared":
        real = bundle._export_one

        def export_one(*a, **kw):
            spec = real(*a, **kw)
            out.mkdir()
            (out / "precious.txt").write_text("not the export's")
            return spec

        monkeypatch.setattr(bundle, "_export_one", export_one)
        message = "appeared while the export ran"
    else:
        monkeypatch.setattr(bundle, "_sampling_defaults", lambda src, log: {"temperature": -1.0})
        message = "temperature"
    from edgespec.errors import ManifestError

    with pytest.raises((ExportError, ManifestError), match=message):  # (the read-back's own error: the schema's)
        _export(tiny_dirs["qwen2"], out, target_precision="fp32", max_context=64)
    if case == "appeared":
        assert [p.name for p in out.iterdir()] == ["precious.txt"]
    else:
        assert not out.exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".b.")]  # (no stage left beside it)


@pytest.mark.slow
def test_an_image_text_checkpoint_holds_its_decoders_context(tmp_path):
    """(a real export of a tiny image-text Gemma 4, ~20 s) Without --max-context the bundle holds the context its
    text config declares (512 here): the composite's top level declares none, and 4,096 was taken. A target's
    tokenizer is checked against the text config's vocabulary too."""
    from test_archs import _gemma4

    from edgespec.manifest import load_manifest

    d = _gemma4(tmp_path / "g", "e2b", plain=True, image_text=True)
    cfg = json.loads((d / "config.json").read_text())
    assert "max_position_embeddings" not in cfg and cfg["text_config"]["max_position_embeddings"] == 512
    m = load_manifest(_export(d, tmp_path / "b", target_precision="fp32"))
    assert m.target.max_context == 512
    # and a target's tokenizer with ids past its text config's vocabulary (8 plain tokens without a row) is refused
    # before the build (the top level has no vocab_size: the check was skipped)
    from tiny import make_tokenizer

    short = _gemma4(tmp_path / "s", "dense", plain=True, image_text=True, vocab_size=len(make_tokenizer()) - 8)
    assert "vocab_size" not in json.loads((short / "config.json").read_text())
    with pytest.raises(ExportError, match=f"vocabulary of {len(make_tokenizer()) - 8}"):
        _export(short, tmp_path / "bs", target_precision="fp32")
    assert not (tmp_path / "bs").exists()


def test_a_kept_gguf_copy_that_cannot_be_read_adds_its_float32_copys_step(tiny_dirs, tmp_path, monkeypatch):
    """(session 89) A GGUF with a kept copy (EDGESPEC_GGUF_CACHE) is counted three steps (no float32 copy to write); a copy that
    cannot be read back is dropped and the file read, and the float32 copy's step then written is added to the
    total from there on, so the steps still end at [N/N]; a copy kept since the count (another export's) takes the
    step off. (A stand-in file: transformers hands the tiny model for ``gguf_file``,
    as in test_export's test of damaged copies; the build itself is stood in for.)"""
    import io
    import shutil

    from conftest import progress_steps
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from edgespec_export import bundle
    from edgespec_export.build import QuantOptions
    from edgespec_export.source import Source, _copy_record, gguf_cache_entry, gguf_cached, keep_gguf_copy

    tiny = tiny_dirs["qwen2"]
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(100))
    monkeypatch.setenv("EDGESPEC_GGUF_CACHE", str(tmp_path / "cache"))
    src = Source(str(gguf), "gguf", gguf)
    real = AutoModelForCausalLM.from_pretrained

    def load(name, *args, gguf_file=None, **kw):
        return real(str(tiny) if gguf_file is not None else name, *args, **kw)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", load)
    assert bundle._copy_for_builder(src)  # (no copy kept yet: one is written for the builder)
    entry = gguf_cache_entry(gguf)
    keep_gguf_copy(gguf, tiny)
    weights = next(entry.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])  # (damaged after it was kept, its record as it is now)
    (entry / "COMPLETE").write_text(_copy_record(gguf, entry))
    assert gguf_cached(gguf) == entry and not bundle._copy_for_builder(src)

    def run_builder(*a, **kw):
        raise _Stop("the build")

    monkeypatch.setattr(bundle, "run_builder", run_builder)
    said = io.StringIO()
    progress = bundle.Progress(3, said)  # (loading, the build, the validation: the kept copy's)
    stage = tmp_path / "stage"
    stage.mkdir()
    tok = AutoTokenizer.from_pretrained(str(tiny))
    with pytest.raises(_Stop):
        bundle._export_one("target", src, tok, stage, "fp32", QuantOptions(), 64, "fp", progress, counted_copy=False)
    # (counted three at the start, four once the copy is found unreadable: the steps after say so)
    assert progress_steps(said.getvalue()) == [(1, 3), (2, 4), (3, 4)], said.getvalue()
    assert "writing a float32 Hugging Face copy" in said.getvalue()
    # the other way: counted with a copy to write (none kept then), and one kept since (here: the one just written)
    shutil.rmtree(stage)
    stage.mkdir()
    assert gguf_cached(gguf) is not None
    said = io.StringIO()
    progress = bundle.Progress(4, said)
    with pytest.raises(_Stop):
        bundle._export_one("target", src, tok, stage, "fp32", QuantOptions(), 64, "fp", progress, counted_copy=True)
    assert progress_steps(said.getvalue()) == [(1, 3), (2, 3)], said.getvalue()  # (taken off before its first line)


def test_a_hub_targets_head_is_bounded_by_its_models_rows(tiny_dirs, tmp_path, builds, monkeypatch):
    """(session 90, session 89's report) ``--drafter-vocab``'s head keeps ids the target has rows for: a hub
    target's rows are its config's (read from the hub's cache), not its tokenizer's length, which may hold a special
    id past them (Gemma 3 1B's ``<image_soft_token>``). A hub target's config was not read: the head was bounded by
    the tokenizer, and could take an id the model has no row for."""
    import shutil

    import huggingface_hub.constants
    from transformers import AutoTokenizer

    from edgespec_export import head

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--edgespec-test--tiny"
    snap = repo / "snapshots" / commit
    shutil.copytree(tiny_dirs["qwen2"], snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    rows = json.loads((snap / "config.json").read_text())["vocab_size"]
    tok = AutoTokenizer.from_pretrained(snap)
    assert len(tok) == rows
    tok.add_special_tokens({"additional_special_tokens": ["<image_soft_token>"]})  # (its id: rows, past them)
    tok.save_pretrained(snap)
    drafter = shutil.copytree(tiny_dirs["drafter"], tmp_path / "drafter")
    tok.save_pretrained(drafter)  # (the same tokenizer as the target's)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    seen = []
    real = head.select_head_ids

    def select(*a, vocab_size=None, **kw):
        seen.append(vocab_size)
        return real(*a, vocab_size=vocab_size, **kw)

    monkeypatch.setattr(head, "select_head_ids", select)
    with pytest.raises(_Stop):
        _export("edgespec-test/tiny", tmp_path / "b", drafter=str(drafter), drafter_vocab=100,
                target_precision="fp32")
    assert seen == [rows] and builds.calls[0][0] == "target"
    assert rows not in real(json.loads(tok.backend_tokenizer.to_str()), 100, vocab_size=seen[0]).tolist()
