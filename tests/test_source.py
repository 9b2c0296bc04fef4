"""(session 88) export/source.py's parts on their own, where test_export's and test_archs' exports do not reach
them: the kept copies of GGUF files. Mutation-tested (docs/bench/mutation_s88.md)."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("meanwhile", ["removed", "rewritten"])
def test_a_damaged_copy_is_deleted_even_where_its_gguf_file_changed_meanwhile(tmp_path, monkeypatch, capsys, meanwhile):
    """The copy found damaged is the one deleted: it was worked out again from the GGUF file, so a file removed
    meanwhile left the copy "not deleted (No such file or directory)", and a file rewritten meanwhile (another
    digest, no copy) left it while saying "deleted"."""
    from edgespec_export import source

    monkeypatch.setenv(source.GGUF_CACHE_ENV, str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    entry = source.gguf_cache_entry(gguf)
    (entry / "sub").mkdir(parents=True)
    (entry / "COMPLETE").write_text("{}")
    (entry / "sub" / "model.safetensors").write_bytes(bytes(8))
    if meanwhile == "removed":
        gguf.unlink()
    else:
        gguf.write_bytes(b"GGUF" + bytes(80))
    monkeypatch.setattr(source, "_UNREADABLE", set())
    source._drop_copy(gguf, entry, "model.safetensors changed after it was kept")
    assert not entry.exists() and entry in source._UNREADABLE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot be used (model.safetensors changed after it was kept); deleted;" in err


def test_a_source_is_a_gguf_file_a_model_folder_or_a_hub_id(tmp_path):
    """``resolve``: what each spelling of a source is, and one ExportError for each that is none: a file of another
    kind, a .gguf file that is not GGUF (its magic), a folder without config.json (naming a GGUF file it holds)."""
    from edgespec.errors import ExportError
    from edgespec_export.source import resolve

    gguf = tmp_path / "m.GGUF"
    gguf.write_bytes(b"GGUF" + bytes(12))
    s = resolve(str(gguf))
    assert (s.kind, s.path) == ("gguf", gguf.resolve())
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    s = resolve(str(folder))
    assert (s.kind, s.path) == ("hf-dir", folder.resolve())
    s = resolve("Qwen/Qwen2.5-0.5B")
    assert (s.kind, s.path) == ("hub", None)
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"PK\x03\x04" + bytes(12))
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    other = tmp_path / "model.safetensors"
    other.write_bytes(bytes(8))
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "b.gguf").write_bytes(b"GGUF")
    (bare / "a.gguf").write_bytes(b"GGUF")
    (folder / "sub").mkdir()
    for spec, message in ((fake, "fake.gguf is not a GGUF file \\(bad magic\\)"),
                          (empty, "empty.gguf is not a GGUF file \\(bad magic\\)"),
                          (other, "model.safetensors is a file but not a .gguf model"),
                          (bare, "bare is not a Hugging Face model directory: no config.json \\(it holds a.gguf: "
                                 "pass that file\\)"),
                          (folder / "sub", "is not a Hugging Face model directory: no config.json$"),
                          (tmp_path / "missing", "no such model")):
        with pytest.raises(ExportError, match=message):
            resolve(str(spec))


def test_a_folders_hidden_files_are_not_its_source_even_where_named_as_weights(tmp_path):
    """``source_files`` of a model folder leaves hidden files out, those named as the files the export reads too:
    macOS's AppleDouble ``._model.safetensors`` beside the weights copied from a Mac, an editor's ``.config.json``."""
    from edgespec_export.source import Source, source_files

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(bytes(8))
    for hidden in ("._model.safetensors", ".config.json", ".tokenizer.model", "._pytorch_model.bin"):
        (tmp_path / hidden).write_bytes(b"\x00\x05\x16\x07")
    assert sorted(source_files(Source(str(tmp_path), "hf-dir", tmp_path))) == ["config.json", "model.safetensors"]


def test_a_yarn_gguf_s_betas_and_original_context_reach_the_config(tmp_path, monkeypatch):
    """``_gguf_config`` of a YaRN GGUF: the factor, the original context and llama.cpp's ``yarn_beta_fast`` and
    ``yarn_beta_slow`` (transformers' ``beta_fast`` 32 and ``beta_slow`` 1 by default: the exported rotary another
    where a file's differ) in the config's rotary parameters, each under its own name."""
    import gguf

    import tiny
    from edgespec_export.source import Source, _gguf_config

    hf = tiny.make_model(tmp_path / "hf", "qwen2", seed=3, head_dim=16)
    header = gguf.GGUFWriter.write_header_to_file

    def with_yarn(self, *a, **k):
        self.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        self.add_rope_scaling_factor(4.0)
        self.add_rope_scaling_orig_ctx_len(64)
        self.add_rope_scaling_yarn_beta_fast(24.0)
        self.add_rope_scaling_yarn_beta_slow(2.0)
        return header(self, *a, **k)

    monkeypatch.setattr(gguf.GGUFWriter, "write_header_to_file", with_yarn)
    path = tiny.write_gguf(hf, tmp_path / "m.gguf", arch="qwen2")
    name, kw = Source(str(path), "gguf", path).from_pretrained_args()
    rope = _gguf_config(path, name, kw)["config"].rope_parameters
    assert {k: rope[k] for k in ("rope_type", "factor", "original_max_position_embeddings", "beta_fast",
                                 "beta_slow")} == {"rope_type": "yarn", "factor": 4.0,
                                                   "original_max_position_embeddings": 64, "beta_fast": 24.0,
                                                   "beta_slow": 2.0}


def test_a_vocabulary_padded_past_its_tokenizer_is_not_a_missing_tokenizer(tmp_path):
    """``check_vocabulary``: a model's vocabulary padded past its tokenizer's (Qwen2.5's 151,936 rows for 151,665
    tokens) down to twice the tokenizer's is taken; under half of it, the tokenizer is refused (transformers' one-token
    tokenizer of a folder without tokenizer files), naming the missing files where the folder has none."""
    from edgespec.errors import ExportError
    from edgespec_export.source import Source, check_vocabulary

    class Tok:
        def __init__(self, n):
            self.n = n

        def __len__(self):
            return self.n

    (tmp_path / "config.json").write_text("{}")
    src = Source(str(tmp_path), "hf-dir", tmp_path)
    for n in (128, 127, 100, 64):
        check_vocabulary(Tok(n), 128, src)
    with pytest.raises(ExportError, match=r"has 63 tokens for a model of 128 \(its config's vocab_size\): no tokenizer "
                                          r"files \(tokenizer.json, tokenizer.model, vocab.json, tokenizer_config.json\)"):
        check_vocabulary(Tok(63), 128, src)
    (tmp_path / "vocab.json").write_text("{}")
    with pytest.raises(ExportError, match=r"has 1 token for a model of 151,936 \(its config's vocab_size\); give"):
        check_vocabulary(Tok(1), 151936, src)


def test_the_family_mends_are_llamacpps_reading_of_each_familys_gguf():
    """``_family_mends`` on its own (test_archs' GGUF exports reach it at tiny sizes only): Gemma 2's and 3's
    attention scale by the width over the heads at the 27Bs' layer counts (46 and 62, each its own family's), else
    the head's width; Gemma 2's default caps (50 on the scores, 30 on the logits: llama.cpp's) or the file's; Gemma
    3's final cap (none unless the file has one) and local rotary base (10,000 unless the file's); a Llama file's
    biases, the ones it lacks beside them zero."""
    from edgespec_export.source import _family_mends

    def mends(arch, names=(), **meta):
        return _family_mends(arch, lambda k: meta.get(k.replace(".", "_")), set(names))

    big2 = dict(block_count=46, embedding_length=4608, attention_head_count=32, attention_key_length=128)
    assert mends("gemma2", **big2) == {"query_pre_attn_scalar": 144, "attn_logit_softcapping": 50.0,
                                       "final_logit_softcapping": 30.0}
    assert mends("gemma2", **{**big2, "block_count": 62})["query_pre_attn_scalar"] == 128
    assert mends("gemma2", **big2, attn_logit_softcapping=40, final_logit_softcapping=20.0) == {
        "query_pre_attn_scalar": 144, "attn_logit_softcapping": 40.0, "final_logit_softcapping": 20.0}
    big3 = dict(block_count=62, embedding_length=5376, attention_head_count=32, attention_key_length=128)
    assert mends("gemma3", **big3) == {"query_pre_attn_scalar": 168, "final_logit_softcapping": None,
                                       "sliding_rope_theta": 10000.0}
    assert mends("gemma3", **{**big3, "block_count": 46})["query_pre_attn_scalar"] == 128
    got = mends("gemma3", **big3, final_logit_softcapping=30, rope_freq_base_swa=20000.0)
    assert (got["final_logit_softcapping"], got["sliding_rope_theta"]) == (30.0, 20000.0)
    assert "query_pre_attn_scalar" not in mends("gemma3", block_count=26)  # (the sizes unread: transformers' own)
    assert mends("llama", names={"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias"}) == {
        "attention_bias": True, "zero_biases": ("self_attn.o_proj.bias",)}
    assert mends("llama", names={"blk.0.ffn_down.bias"}) == {
        "mlp_bias": True, "zero_biases": ("mlp.gate_proj.bias", "mlp.up_proj.bias")}
    assert mends("llama", names={"blk.1.attn_q.bias", "blk.0.attn_q.weight"}) == {}
    assert mends("qwen2", **big2) == {}
