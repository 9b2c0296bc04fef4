"""OnnxLM against torch, rewind, greedy generation against transformers, torch-free runtime."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import edgespec
from edgespec.manifest import load_manifest
from edgespec.onnx_lm import OnnxLM
from edgespec.providers import choose

FP32_TOL = 1e-4  # max |logit difference| ONNX vs torch for fp32 graphs


def _torch_model(hf_dir):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()


def _ref_logits(model, ids):
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


@pytest.mark.parametrize("which", ["qwen2", "llama"])
def test_logits_match_torch_prefill_decode_verify(which, tiny_dirs, tiny_bundle, tiny_llama_bundle):
    bundle = tiny_bundle if which == "qwen2" else tiny_llama_bundle
    m = load_manifest(bundle)
    lm = OnnxLM(m.target, 128, choose(["cpu"]))
    model = _torch_model(tiny_dirs[which])
    rng = np.random.default_rng(0)
    ids = rng.integers(3, m.target.vocab_size, size=30).tolist()
    ref = _ref_logits(model, ids)
    pre = lm.forward(ids[:20])
    dec = lm.forward(ids[20:21])
    ver = lm.forward(ids[21:26])
    assert np.abs(pre - ref[:20]).max() < FP32_TOL
    assert np.abs(dec - ref[20:21]).max() < FP32_TOL
    assert np.abs(ver - ref[21:26]).max() < FP32_TOL
    assert lm.length == 26


def test_rewind_then_decode_equals_decoding_without_rejected(tiny_bundle):
    m = load_manifest(tiny_bundle)
    a = OnnxLM(m.target, 64, choose(["cpu"]))
    b = OnnxLM(m.target, 64, choose(["cpu"]))
    prefix, rejected, good = [5, 9, 17, 33, 40], [7, 8, 9, 10], [11, 12]
    a.forward(prefix)
    a.forward(rejected)
    a.rewind(len(rejected))
    out_a = a.forward(good)
    b.forward(prefix)
    out_b = b.forward(good)
    np.testing.assert_allclose(out_a, out_b, atol=1e-5)
    assert a.tokens == b.tokens == prefix + good


def test_prefill_reuses_common_prefix(tiny_bundle):
    m = load_manifest(tiny_bundle)
    lm = OnnxLM(m.target, 64, choose(["cpu"]))
    lm.prefill([5, 6, 7, 8])
    calls = lm.calls
    last = lm.prefill([5, 6, 7, 8, 9])
    assert lm.calls == calls + 1 and lm.tokens == [5, 6, 7, 8, 9]
    fresh = OnnxLM(m.target, 64, choose(["cpu"]))
    np.testing.assert_allclose(last, fresh.prefill([5, 6, 7, 8, 9]), atol=1e-5)


def test_short_calls_write_logits_to_own_buffers_without_aliasing(tiny_bundle, monkeypatch):
    """Calls of up to OWN_LOGITS_MAX_WIDTH tokens bind a buffer kept per width: the logits equal
    those onnxruntime allocates itself, and a returned array survives the next call of that width."""
    import edgespec.onnx_lm as onnx_lm

    m = load_manifest(tiny_bundle)
    long = onnx_lm.OWN_LOGITS_MAX_WIDTH + 8
    ids = list(range(5, long + 15))
    lm = OnnxLM(m.target, 128, choose(["cpu"]), min_width=1)  # no width probe: only this test's calls
    assert lm._logits_type is not None
    lm.forward(ids[:long])  # longer than the kept buffer: onnxruntime's own output
    a = lm.forward(ids[long:long + 2])
    kept = a.copy()
    b = lm.forward(ids[long + 2:long + 4])  # same width: the same buffer is written again
    assert np.array_equal(a, kept) and not np.shares_memory(a, b)
    assert set(lm._logits_out) == {2}
    monkeypatch.setattr(onnx_lm, "OWN_LOGITS_MAX_WIDTH", 0)
    ref = OnnxLM(m.target, 128, choose(["cpu"]), min_width=1)
    ref.forward(ids[:long])
    assert np.array_equal(ref.forward(ids[long:long + 2]), a) and np.array_equal(ref.forward(ids[long + 2:long + 4]), b)
    assert not ref._logits_out


def test_forward_past_context_is_typed_error(tiny_bundle):
    m = load_manifest(tiny_bundle)
    lm = OnnxLM(m.target, 16, choose(["cpu"]))
    lm.forward(list(range(3, 15)))
    with pytest.raises(edgespec.ContextOverflowError):
        lm.forward([3, 4, 5, 6, 7])
    # (session 82, a mutation test) a call of no token is refused before it runs, and changes nothing
    for call in (lambda: lm.forward([]), lambda: lm.forward_argmax([]), lambda: lm.prefill([])):
        with pytest.raises(ValueError, match="at least one token"):
            call()
    assert lm.length == 12 and lm.tokens == list(range(3, 15))


def _hf_greedy(model, ids, n, eos):
    import torch

    with torch.no_grad():
        eos = list(eos) if isinstance(eos, (list, tuple)) else eos  # (a bundle's end ids: generation stops at any)
        out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, eos_token_id=eos,
                             pad_token_id=eos[0] if isinstance(eos, list) else eos, attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("which", ["qwen2", "llama"])
def test_greedy_generate_equals_transformers(which, tiny_dirs, tiny_bundle, tiny_llama_bundle):
    bundle = tiny_bundle if which == "qwen2" else tiny_llama_bundle
    eng = edgespec.load(bundle, max_context=256)
    model = _torch_model(tiny_dirs[which])
    rng = np.random.default_rng(1)
    for trial in range(4):
        ids = rng.integers(3, eng.manifest.target.vocab_size, size=int(rng.integers(3, 12))).tolist()
        ref = _hf_greedy(model, ids, 40, eng.manifest.eos_token_ids[0])
        got = []
        for step in eng.decoder.generate(ids, eng.config(max_new_tokens=40, drafter="none")):
            got.extend(step.tokens)
        assert got == ref, f"trial {trial}"


def _why_no_copy(gguf, said: str) -> str:
    """What is known of a GGUF file's kept copy that ``gguf_cached`` did not find (a CI run's failure, session 72's
    submission, not seen here): its folder, what the export that should have kept it said, the disk's free space."""
    import shutil

    from edgespec_export import source

    entry = source.gguf_cache_entry(gguf)
    if entry is None:
        return "no EDGESPEC_GGUF_CACHE set"
    lines = [f"entry {entry}: exists {entry.exists()}, COMPLETE {(entry / 'COMPLETE').is_file()}, "
             f"unreadable to this process {entry in source._UNREADABLE}",
             f"beside it: {sorted(p.name for p in entry.parent.iterdir()) if entry.parent.is_dir() else None}",
             f"free on its disk: {shutil.disk_usage(entry.parent if entry.parent.exists() else '/').free >> 20} MiB"]
    if (entry / "COMPLETE").is_file():
        try:
            lines.append(f"its record: {source._copy_mismatch(entry)}")
        except OSError as e:  # (_Unchecked: the machine's error, itself the finding)
            lines.append(f"its record: not checked ({e})")
    return "\n".join([*lines, "the export said:", said[-3000:]])


@pytest.mark.real
def test_smollm2_greedy_equals_transformers(smol_fp32, tmp_path, monkeypatch):
    """The fp32 export (of the GGUF's copy a suite's earlier export kept, EDGESPEC_GGUF_CACHE) decodes
    what transformers decodes with the model read out of the GGUF file itself."""
    from conftest import SMOL_GGUF
    from edgespec_export.source import load_model, resolve

    from conftest import BUNDLES, export_log
    from edgespec_export.source import gguf_cached

    eng = edgespec.load(smol_fp32, max_context=512)
    if BUNDLES not in smol_fp32.parents:  # exported by the suite: the copy is kept for the next export
        said = export_log(smol_fp32).read_text()
        if "cannot keep the GGUF's Hugging Face copy" not in said:  # (a cache it could not write: said, not kept)
            assert gguf_cached(SMOL_GGUF) is not None, _why_no_copy(SMOL_GGUF, said)
    monkeypatch.delenv("EDGESPEC_GGUF_CACHE")  # (the reference from the file, not from the kept copy)
    model = load_model(resolve(str(SMOL_GGUF)))
    for prompt in ("The capital of France is", "def add(a, b):"):
        ids = eng.tokenizer.encode(prompt)
        ref = _hf_greedy(model, ids, 32, eng.manifest.eos_token_ids)
        r = eng.generate(prompt, max_new_tokens=32, drafter="none")
        assert r.token_ids == ref[: len(r.token_ids)] and len(r.token_ids) == len(ref)
    # (session 49, a review) a GGUF's end ids: its EOS and the special tokens llama.cpp also ends at (<|endoftext|>
    # beside SmolLM2's <|im_end|>); a raw prompt's reply ran past the <|endoftext|> its model wrote
    if BUNDLES not in smol_fp32.parents:  # (exported by this code, not a bundle kept from before)
        assert list(eng.manifest.eos_token_ids) == [0, 2]
    assert eng.tokenizer._template_eos() == "<|im_end|>"  # (the template's eos_token: the tokenizer's own)


def test_runtime_never_imports_torch(tiny_bundle):
    code = (f"import sys, edgespec; e = edgespec.load({str(tiny_bundle)!r}); "
            "e.generate('hello', max_new_tokens=5); "
            "bad = [m for m in ('torch', 'transformers', 'edgespec_export') if m in sys.modules]; "
            "sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-c", "import edgespec, sys; sys.exit('onnxruntime' in sys.modules)"])
    assert r.returncode == 0, "import edgespec should stay light (onnxruntime loads lazily)"


def test_stream_decoder_holds_split_multibyte(tiny_bundle):
    eng = edgespec.load(tiny_bundle)
    tok = eng.tokenizer
    text = "naïve café → ok"
    ids = tok.encode(text)
    dec = tok.stream_decoder()
    parts = [dec.push([i]) for i in ids] + [dec.flush()]
    assert "".join(parts) == tok.decode(ids)
    assert all("\ufffd" not in p for p in parts)
    # a reply cut inside a character (its token limit) ends with the characters completed, no U+FFFD
    cuts = [k for k in range(1, len(ids)) if tok.decode(ids[:k]).endswith("\ufffd")]
    assert cuts, "the test needs a character split across tokens"
    for k in cuts:
        dec = tok.stream_decoder()
        out = "".join([dec.push([i]) for i in ids[:k]] + [dec.flush()])
        assert out == tok.decode(ids[:k])[:-1] and "\ufffd" not in out and tok.ends_mid_character(ids[:k])
    # a U+FFFD the model writes whole (its three bytes) is text like any other, at the end too
    whole = tok.encode("ok \ufffd")
    dec = tok.stream_decoder()
    assert "".join([dec.push([i]) for i in whole] + [dec.flush()]) == tok.decode(whole) == "ok \ufffd"
    assert tok.ends_mid_character(whole) is False


def _sentencepiece(directory, pieces, merges=(), split=False):
    """A Llama-2-style tokenizer of ``pieces`` (SentencePiece's layout as tokenizers writes it: "▁" pieces, byte
    fallback to <0xNN> tokens, a decoder that strips a text's first space), saved in ``directory``."""
    from tokenizers import AddedToken, Tokenizer as HF, decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"<0x{b:02X}>": 3 + b for b in range(256)}}
    for piece in pieces:
        vocab.setdefault(piece, len(vocab))
    tok = HF(models.BPE(vocab=vocab, merges=list(merges), unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=split)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1, right=0)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")])
    directory.mkdir()
    tok.save(str(directory / "tokenizer.json"))
    from edgespec.tokenizer import Tokenizer

    return Tokenizer(directory)


def _sentencepiece_style(directory):
    """Its few pieces: a character outside them is spelled in byte tokens (whose ByteFallback decoder writes a
    U+FFFD a byte of a run that is no whole UTF-8)."""
    return _sentencepiece(directory, ("\u2581", "a", "b", "x", "y"))


def _sentencepiece_words(directory):
    """Whole words: "▁Paris" is one token."""
    pieces, merges = [], []
    for w in ("\u2581The", "\u2581capital", "\u2581is", "\u2581Paris", "."):
        pieces += list(w)
        for i in range(2, len(w) + 1):
            if w[:i] not in pieces:
                pieces.append(w[:i])
                merges.append((w[:i - 1], w[i - 1]))
    return _sentencepiece(directory, pieces, merges, split=True)


def test_a_reply_keeps_its_first_words_space_on_sentencepiece_tokenizers(tiny_bundle, tmp_path):
    """(session 55, a review) A reply was decoded alone, and a SentencePiece-style decoder (Llama 2, Mistral, Phi-3)
    strips a text's first space: "The capital is" + "Paris." (a completion glued to its prompt; echo the same). The
    reply is decoded after the prompt's last ids: its text is what prompt and reply spell together less the prompt's,
    streamed or not, with a stop string's ids cut where its text is. The engine's own text handling over that
    tokenizer; the model's reply scripted."""
    from edgespec.decoder import Step

    tok = _sentencepiece_words(tmp_path / "sp")
    eng = edgespec.load(tiny_bundle, memory=False)
    from edgespec.api import _LazyHealer

    eng.tokenizer = tok
    eng._healer = eng.decoder.healer = _LazyHealer(tok, eng.decoder.vocab)
    real = eng.decoder
    reply = tok.encode(" Paris.", add_special=False)
    assert [tok.id_to_token(i) for i in reply] == ["\u2581Paris", "."]

    class Scripted:
        def __getattr__(self, name):
            return getattr(real, name)

        def run(self, prepared, stats):
            stats.prompt_tokens, stats.new_tokens, stats.finish_reason = len(prepared[0]), len(reply), "length"
            yield Step(list(reply), "length")

    eng.decoder = Scripted()
    prompt = "The capital is"
    whole = tok.decode(tok.encode(prompt, add_special=False) + reply)
    assert whole == "The capital is Paris."
    r = eng.generate(prompt, max_new_tokens=8)
    assert prompt + r.text == whole and r.token_ids == reply
    assert "".join(eng.stream(prompt, max_new_tokens=8)) == " Paris."
    r = eng.generate(prompt, max_new_tokens=8, stop=["."])
    assert r.text == " Paris" and r.token_ids == reply[:1] and r.finish_reason == "stop"
    assert tok.stream_decoder().push(reply) == "Paris."  # (alone, as before: the space stripped)
    # token healing there: the last token's leading space is the reply's text now, so "▁is" heals (it did not)
    ids = tok.encode(prompt, add_special=False)
    assert eng.heal(ids) == (ids[:-1], b" is")
    reply = tok.encode(" is Paris.", add_special=False)  # (what a healed reply spells: " is" again, then on)
    r = eng.generate(prompt, max_new_tokens=8, token_healing=True)
    assert r.text == " Paris." and r.stats["healed"] == " is"


def test_a_character_in_byte_tokens_is_whole_or_left_out(tmp_path):
    """(session 46, a review) on SentencePiece-style tokenizers (Llama 2, Mistral, Gemma) a character spelled in byte
    tokens and cut (a stop string after it, a token limit inside it): the ids kept before a stop string lost the
    character's last bytes (its U+FFFD a byte counted as text: "ab" + two of 中's three tokens), and a reply cut
    inside one ended in U+FFFDs (a U+FFFD a byte, where only byte-level tokenizers' one was dropped)."""
    import types

    from edgespec.api import Engine

    tok = _sentencepiece_style(tmp_path / "sp")
    ids = tok.encode("ab\u4e2dxy", add_special=False)
    pieces = [tok.id_to_token(i) for i in ids]
    assert pieces[-5:] == ["<0xE4>", "<0xB8>", "<0xAD>", "x", "y"], pieces
    at = pieces.index("<0xE4>")
    for k in (at + 1, at + 2):  # cut inside the character
        assert tok.ends_mid_character(ids[:k]) and tok.finished_text(ids[:k]) == "ab"
        dec = tok.stream_decoder()
        assert "".join([dec.push([i]) for i in ids[:k]] + [dec.flush()]) == "ab"
    assert tok.finished_text(ids[:at + 3]) == "ab\u4e2d" and not tok.ends_mid_character(ids[:at + 3])
    fake = types.SimpleNamespace(tokenizer=tok)
    assert Engine._ids_up_to(fake, ids, len("ab\u4e2d")) == ids[:at + 3]  # (a stop string "x": 中 whole)
    euro = tok.encode("a\u20ac\u4e2d", add_special=False)  # a run of byte tokens: one whole character, one cut
    assert tok.finished_text(euro[:-1]) == "a\u20ac"


def test_generate_json_cli(tiny_bundle):
    from click.testing import CliRunner

    from edgespec.cli import main

    r = CliRunner().invoke(main, ["generate", str(tiny_bundle), "-p", "def hello", "--max-new-tokens", "12", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert set(out) >= {"text", "token_ids", "stats"}
    assert {"new_tokens", "tokens_per_second", "prefill_ms", "acceptance_rate"} <= set(out["stats"])
    assert out["stats"]["new_tokens"] == len(out["token_ids"]) <= 12


def test_model_drafter_prefill_waits_for_its_first_draft(tiny_bundle):
    """The drafter reads the context at its first draft, not before the first token: a generation
    that never drafts with it never runs it, and the next one reuses what its cache shares with the
    new context (a chat's earlier turn)."""
    import edgespec

    eng = edgespec.load(tiny_bundle, memory=False)
    lm = eng.decoder.drafters["model"].lm
    eng.reset()
    calls = lm.calls
    eng.generate("The capital of France is", max_new_tokens=1, drafter="model")  # no round: no draft
    assert lm.calls == calls and lm.length == 0
    first = eng.generate("The capital of France is", max_new_tokens=8, drafter="model", draft_tokens=2)
    assert lm.calls > calls and lm.length > 0
    held = lm.length
    ref = eng.generate("The capital of France is", max_new_tokens=8, drafter="none")
    assert first.token_ids == ref.token_ids and lm.length == held  # untouched by a generation without it


def test_an_onnxruntime_without_a_process_wide_pool_gives_each_session_its_own(tiny_bundle):
    """onnxruntime 1.22 (edgespec's oldest; a Jetson's wheels lag behind) has no set_global_thread_pool_sizes nor
    SessionOptions.use_per_session_threads: sessions then open with a pool each, not spinning (before session 43
    every session failed to open there: "no attribute 'use_per_session_threads'"), and decode as ever. (A fresh
    process: onnxruntime's global pool, once made, refuses sessions with their own.) (Session 97, ON44, ON46, ON48:
    no warning that the thread count is not applied, spinning off, every graph optimization.)"""
    import subprocess
    import sys

    code = f"""
import warnings
import onnxruntime as ort
del ort.set_global_thread_pool_sizes
seen, entries, real = [], [], ort.SessionOptions
class Old(real):  # as 1.22's: no such attribute to set
    def __setattr__(self, k, v):
        if k == "use_per_session_threads":
            raise AttributeError(k)
        seen.append((k, v))
        super().__setattr__(k, v)
    def add_session_config_entry(self, k, v):
        entries.append((k, v))
        super().add_session_config_entry(k, v)
ort.SessionOptions = Old
import edgespec, edgespec.onnx_lm as ol
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    eng = edgespec.load({str(tiny_bundle)!r}, threads=2, memory=False)
assert not [w for w in said if "not applied" in str(w.message)], [str(w.message) for w in said]
assert ol.shared_thread_pool(2) == ol.NO_GLOBAL_POOL and ("intra_op_num_threads", 2) in seen, seen
assert ("graph_optimization_level", ort.GraphOptimizationLevel.ORT_ENABLE_ALL) in seen, seen
assert ("session.intra_op.allow_spinning", "0") in entries, entries
r = eng.generate("def add(a, b):", max_new_tokens=12, drafter="model", ignore_eos=True)
assert r.token_ids == eng.generate("def add(a, b):", max_new_tokens=12, drafter="none", ignore_eos=True).token_ids
print("ok", len(r.token_ids))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok 12" in r.stdout, r.stderr[-3000:]


def _reference_without(tok, text: str):
    """``tok``'s tokenizer with the added token ``text`` gone: what encoding a chat whose content holds that text
    as plain characters gives, encoded whole."""
    from tokenizers import Tokenizer as HF

    data = json.loads(tok._tok.to_str())
    data["added_tokens"] = [a for a in data["added_tokens"] if a["content"] != text]
    return HF.from_str(json.dumps(data))


@pytest.mark.parametrize("scheme", ["first", "always", "legacy"])
def test_a_special_tokens_text_in_content_is_text_encoded_as_the_whole_chat_would_be(tmp_path, scheme, smol_int4):
    """A special token's text in a message stays text (a message cannot close its turn); the content was encoded on
    its own and the template's text around it on its own: SentencePiece-style tokenizers began each piece with a
    "▁" (Llama 2, Mistral, Gemma), byte-level ones merged nothing across the pieces' ends, and the content's whole
    text was a placeholder to the template (its trim, split, startswith acted on nothing). The ids now equal a
    whole encode by the same tokenizer without that added token; a thinking model's think tags in an assistant's
    content are the markup its template reads (Qwen3's leaves an earlier turn's thinking out)."""
    from tokenizers import AddedToken, Tokenizer as HF, decoders, models, normalizers, pre_tokenizers

    from edgespec.tokenizer import Tokenizer

    vocab = {"<unk>": 0, **{f"<0x{b:02X}>": 1 + b for b in range(256)}}
    for piece in ("\u2581", "a", "b", "h", "i", "\u2581h", "hi", "\u2581hi", "\u2581a"):
        vocab[piece] = len(vocab)
    hf = HF(models.BPE(vocab=vocab, merges=[("\u2581", "h"), ("h", "i"), ("\u2581h", "i"), ("\u2581", "a")],
                       unk_token="<unk>", byte_fallback=True))
    if scheme == "legacy":  # (Llama 2's: a normalizer, its added tokens normalized: the prefix space before them)
        hf.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    else:
        hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=scheme, split=False)
    hf.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    hf.add_special_tokens([AddedToken(t, special=True, normalized=scheme == "legacy") for t in ("<s>", "</s>", "<x>")])
    (tmp_path / "sp").mkdir()
    hf.save(str(tmp_path / "sp" / "tokenizer.json"))
    template = ("{% for m in messages %}<s>{{ m.role }} {{ m.content | trim }}</s>{% endfor %}"
                "{% if add_generation_prompt %}<s>assistant {% endif %}")
    checked = []
    for directory, template, text in ((tmp_path / "sp", template, "<x>"),
                                      (smol_int4 / "tokenizer", None, "<|endoftext|>")):
        tok = Tokenizer(directory, chat_template=template or json.loads((smol_int4 / "edgespec.json").read_text())[
            "chat_template"])
        ref = _reference_without(tok, text)
        for content in (f"hi {text} hi", f"  hi {text}  ", f"{text}a", f"\n\nab {text}\n\n", "a hi",
                        # (text shaped as the placeholders and stand-ins: a KeyError, another text, an id past the
                        # vocabulary)
                        f"{text} \ue0020\ue003 \ue00299\ue003 \ue004x\ue005"):
            for role in ("user", "assistant"):
                msgs = [{"role": "system", "content": "hi"}, {"role": role, "content": content}]
                got = tok.encode_chat(msgs)
                assert got == ref.encode(tok.render_chat(msgs), add_special_tokens=False).ids, (directory, content)
                if template is None:  # (a byte-level tokenizer decodes to its text exactly)
                    assert tok.decode(got, skip_special=False) == tok.render_chat(msgs)
                checked.append(text in content)
    assert sum(checked) == 20


def test_an_assistants_thinking_given_back_is_left_out_as_its_template_says(tmp_path, smol_int4):
    """A thinking model's template (Qwen3's) leaves an earlier turn's thinking out of the prompt by reading its
    content's </think>; the content was a placeholder to it, and the whole thinking went to the model as text. The
    think tags in an assistant's content are markup (the model wrote them as those tokens); anywhere else, and every
    other added token's text, stay text."""
    from tokenizers import AddedToken, Tokenizer as HF

    from edgespec.tokenizer import Tokenizer

    hf = HF.from_file(str(smol_int4 / "tokenizer" / "tokenizer.json"))
    hf.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")])
    (tmp_path / "q3").mkdir()
    hf.save(str(tmp_path / "q3" / "tokenizer.json"))
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and '</think>' in "
                "m.content %}{{ m.content.split('</think>')[-1].lstrip('\\n') }}{% else %}{{ m.content }}{% endif %}"
                "<|im_end|>\n{% endfor %}<|im_start|>assistant\n")
    tok = Tokenizer(tmp_path / "q3", chat_template=template)
    think = tok.token_to_id("<think>")
    for extra in ("", " <|im_end|>"):
        msgs = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "<think>\nwhy\n</think>\n\na1" + extra},
                {"role": "user", "content": "q2 <think>" + extra}]
        ids = tok.encode_chat(msgs)
        assert "why" not in tok.decode(ids, skip_special=False) and ids.count(think) == 0, tok.decode(ids, False)
        assert tok.decode(ids, skip_special=False) == tok.render_chat(msgs)
        assert ids.count(tok.token_to_id("<|im_end|>")) == 3  # (the template's own: the contents' are text)


@pytest.mark.parametrize("flag", ["rstrip", "lstrip"])
def test_chat_encoding_with_stripping_tokens_trimmed_offsets_and_whitespace_tokens(tmp_path, smol_int4, flag):
    """(session 47, a review) A byte-level tokenizer whose post-processor trims offsets (GPT-2's, GPT-NeoX's) left
    the spaces a stripping template token (lstrip/rstrip) swallows out of its offsets: they were encoded a second
    time. An added token of whitespace only (Gemma's "\\n\\n") was taken for markup: a placeholder the template's trim
    could not strip (and every paragraph break took the slow path)."""
    from tokenizers import AddedToken, Tokenizer as HF

    from edgespec.tokenizer import Tokenizer

    data = json.loads((smol_int4 / "tokenizer" / "tokenizer.json").read_text())
    data["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    for a in data["added_tokens"]:
        if a["content"] in ("<|im_start|>", "<|im_end|>"):
            a[flag] = True
    hf = HF.from_str(json.dumps(data))
    hf.add_tokens([AddedToken("\n\n", special=False, normalized=False)])
    (tmp_path / "t").mkdir()
    hf.save(str(tmp_path / "t" / "tokenizer.json"))
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}"
                "<|im_start|>assistant\n")
    for template in (template, template.replace(" | trim", "")):
        tok = Tokenizer(tmp_path / "t", chat_template=template)
        assert "\n\n" not in tok.special_texts
        ref = _reference_without(tok, "<|endoftext|>")
        for content in ("hi <|endoftext|>", "  hi <|endoftext|>\n\n", "hi\n\nthere <|endoftext|>  ",
                        "hi <|endoftext|> x\x1f", "hi <|endoftext|> x \x1c"):  # (separators: Rust strips no U+001C..F)
            msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": content}]
            assert tok.encode_chat(msgs) == ref.encode(tok.render_chat(msgs), add_special_tokens=False).ids, content
    plain = [{"role": "user", "content": "hi\n\n"}]  # (no special text: the plain path, trimmed)
    assert tok.encode_chat(plain) == tok._tok.encode(tok.render_chat(plain), add_special_tokens=False).ids


# ---- a mutation test's survivors (session 68): each test fails with the bug its docstring names


@pytest.mark.parametrize("ch", ["\U0001F600", "\u0915"], ids=["emoji-F0", "devanagari-E0"])
def test_a_character_whose_lead_byte_is_f0_or_e0_cut_in_byte_tokens_is_left_out(tmp_path, ch):
    """(mutants T16, T15: ``0xF0 <= b`` as ``0xF0 < b``, ``0xE0 <= b`` as ``0xE0 < b`` in ``_incomplete_utf8``) Every
    emoji's UTF-8 starts with 0xF0 and U+0800..U+0FFF's (Devanagari, Bengali, Thai...) with 0xE0; the tests cut only
    characters led by 0xC3, 0xE2 and 0xE4. Misread, a reply cut inside one ended in U+FFFDs, streamed and whole."""
    from test_runtime import _sentencepiece_style

    tok = _sentencepiece_style(tmp_path / "sp")
    ids = tok.encode("ab" + ch + "x", add_special=False)
    pieces = [tok.id_to_token(i) for i in ids]
    at = next(i for i, p in enumerate(pieces) if p.startswith("<0x"))
    n = len(ch.encode("utf-8"))
    assert pieces[at:at + n] == [f"<0x{b:02X}>" for b in ch.encode("utf-8")], pieces
    for k in range(at + 1, at + n):  # cut inside the character
        assert tok.ends_mid_character(ids[:k]) and tok.finished_text(ids[:k]) == "ab"
        dec = tok.stream_decoder()
        assert "".join([dec.push([i]) for i in ids[:k]] + [dec.flush()]) == "ab"
    assert tok.finished_text(ids[:at + n]) == "ab" + ch and not tok.ends_mid_character(ids[:at + n])


def test_a_stop_after_a_character_in_byte_tokens_keeps_its_ids_after_a_prompts_context(tmp_path):
    """(mutant T09: ``StreamDecoder.text_len`` with a context counting ``decode``'s U+FFFD, not ``finished_text``)
    test_runtime checks ``_ids_up_to`` without a context only; a reply decoded after its prompt's last ids (every
    generation since session 55) kept, before a stop string "x", only 中's first byte token: the reply's token_ids
    ended inside a character."""
    import types

    from edgespec.api import Engine
    from test_runtime import _sentencepiece_style

    tok = _sentencepiece_style(tmp_path / "sp")
    prompt = tok.encode("yx", add_special=False)
    ctx = tok.text_context(prompt)
    assert ctx
    ids = tok.encode("xab\u4e2dxy", add_special=False)[2:]  # the reply "ab中xy", spelled mid-text
    pieces = [tok.id_to_token(i) for i in ids]
    assert pieces == ["a", "b", "<0xE4>", "<0xB8>", "<0xAD>", "x", "y"], pieces
    dec = tok.stream_decoder(prompt)
    assert "".join(dec.push([i]) for i in ids) + dec.flush() == "ab\u4e2dxy"
    fake = types.SimpleNamespace(tokenizer=tok)
    assert Engine._ids_up_to(fake, ids, len("ab\u4e2d"), ctx) == ids[:5]


def test_a_prompt_ending_inside_a_character_gives_no_context(tmp_path):
    """(mutant T11: ``text_context`` keeping a tail whose text ends in U+FFFD) A prompt whose last ids begin a
    character gives its reply no context (Tokenizer.text_context); kept, the reply's first bytes, which finish that
    character, were sliced off as the prompt's: the reply "\\ufffd\\ufffdy" came out as "y"."""
    from test_runtime import _sentencepiece_style

    tok = _sentencepiece_style(tmp_path / "sp")
    whole = tok.encode("xa\u4e2dy", add_special=False)
    at = [tok.id_to_token(i) for i in whole].index("<0xE4>")
    prompt, reply = whole[:at + 1], whole[at + 1:]
    assert tok.text_context(prompt) == ()
    dec = tok.stream_decoder(prompt)
    out = dec.push(reply) + dec.flush()
    assert out == tok.decode(reply) and out.endswith("y") and len(out) == 3


def test_a_character_cut_before_a_special_token_is_still_left_out(tmp_path):
    """(mutant T19: ``continue`` as ``break`` past a special id in ``_unfinished_bytes``) Decoding leaves special
    tokens out, so a reply whose last text token begins a character and that ends at one (its end of sequence) ends
    inside that character: left out, as at a token limit. Every test's cut ends on a byte token."""
    from test_runtime import _sentencepiece_style

    tok = _sentencepiece_style(tmp_path / "sp")
    ids = tok.encode("ab\u4e2d", add_special=False)[:-2] + [tok.token_to_id("</s>")]
    assert [tok.id_to_token(i) for i in ids][-2:] == ["<0xE4>", "</s>"]
    assert tok.ends_mid_character(ids) and tok.finished_text(ids) == "ab"
    dec = tok.stream_decoder()
    assert "".join(dec.push([i]) for i in ids) + dec.flush() == "ab"


def test_a_context_past_the_exported_one_is_refused_and_position_ids_the_graph_lacks_are_left_out(tiny_bundle):
    """(session 79, mutation test of onnx_lm.py: O1, O5) A model opened for one position more than its graph was
    exported for is refused (ContextOverflowError), not left to fail at its last position. The manifest's position
    ids are fed only where the graph has them: a name the graph lacks is left out (binding it failed inside
    onnxruntime at the first call). (A logits skip the graph lacks is refused at load with the other names.)"""
    from dataclasses import replace

    from edgespec.errors import ContextOverflowError

    spec = load_manifest(tiny_bundle).target
    with pytest.raises(ContextOverflowError, match="exceeds the exported maximum"):
        OnnxLM(spec, spec.max_context + 1, choose(["cpu"]), min_width=1)
    plain = OnnxLM(spec, 64, choose(["cpu"]), min_width=1)
    odd = replace(spec, io=replace(spec.io, position_ids="no_such_positions"))
    lm = OnnxLM(odd, 64, choose(["cpu"]), min_width=1)
    assert np.array_equal(lm.forward([1, 2, 3]), plain.forward([1, 2, 3]))


def test_a_chunk_of_nothing_is_one_token_and_a_drafter_is_warmed_at_load(tiny_bundle, monkeypatch):
    """(session 80, mutation test of onnx_lm.py: O3, O13) A prefill chunk of 0 is read as 1 (a prefill of 0-token
    chunks never ended). A drafter opened with its width policy given (no probe) makes one short call at load, so
    that onnxruntime's first-call costs are not timed as its first catch-up (session 19: `auto` stopped drafting
    code); the model is then empty, its counters at zero."""
    spec = load_manifest(tiny_bundle).drafter
    ids = [5, 9, 13, 17, 21]
    whole = OnnxLM(spec, 64, choose(["cpu"]), min_width=1).prefill(ids)
    one = OnnxLM(spec, 64, choose(["cpu"]), min_width=1, prefill_chunk=0)
    assert one.prefill_chunk == 1 and np.allclose(one.prefill(ids), whole, atol=FP32_TOL)
    assert one.calls == len(ids)
    seen, real = [], OnnxLM.forward

    def forward(self, ids, **kw):
        seen.append(list(ids))
        return real(self, ids, **kw)

    monkeypatch.setattr(OnnxLM, "forward", forward)
    lm = OnnxLM(spec, 64, choose(["cpu"]), min_width=1)
    assert seen == [[0, 0]] and lm.length == 0 and (lm.calls, lm.tokens_run, lm.call_seconds) == (0, 0, 0.0)
    OnnxLM(spec, 1, choose(["cpu"]), min_width=1)  # (no room for two tokens: no warm-up call)
    assert seen == [[0, 0]]


def test_a_drafters_catch_up_is_one_call_where_a_targets_last_token_goes_alone(tiny_bundle):
    """(session 80, O11) A target bounded to the widths its probe verified feeds a prefill's last token in a call
    of its own (lm.feed: the first reply token then comes from the logits a repeated prompt computes); a drafter,
    whose arithmetic never reaches the output, feeds a catch-up in one call."""
    m = load_manifest(tiny_bundle)
    ids = [5, 9, 13, 17, 21]
    for spec, calls in ((m.target, 2), (m.drafter, 1)):
        lm = OnnxLM(spec, 64, choose(["cpu"]), min_width=1)
        assert lm.split_last is (spec.role == "target")
        lm.feed(ids)
        assert lm.calls == calls, spec.role


def test_a_call_the_graph_cannot_make_is_refused_before_it_runs(tiny_bundle):
    """(session 80, O16, O17, O20, O44) ``_run``'s contract (lm.py): the logits of ``skip`` of ``n`` positions
    are skipped only where the graph takes a logits skip, never all of them, never in an argmax call; rows'
    positions only where the graph takes them. Each other call is a ValueError before the graph runs."""
    spec = load_manifest(tiny_bundle).target
    lm = OnnxLM(spec, 64, choose(["cpu"]), min_width=1)
    assert lm.skips_logits and lm._rows_name is None
    lm.forward([3, 4])
    before = lm.forward([5, 6, 7]).copy()
    lm.rewind(3)
    ran = lm.run_seconds
    for kw in ({"skip": 3}, {"skip": 4}, {"skip": 1, "argmax": True}, {"positions": [0, 1, 2]}):
        with pytest.raises(ValueError, match="cannot skip|takes no rows' positions"):
            lm._run([5, 6, 7], 2, **kw)
        assert lm.run_seconds == ran, kw
    assert np.allclose(lm._run([5, 6, 7], 2, skip=2), before[2:], atol=FP32_TOL)
