"""export/bundle.py's small parts on inputs built by hand: what the manifest records of a graph's KV cache (its
dtype, per-layer shapes, shared buffers) and embedding tables, and of a tokenizer (bos, EOS ids, how two differ), and
the line a GPU plan prints. The real exports' records are in test_export, test_archs and test_layout; these are the
cases those exports do not have (session 87, from the mutation test of bundle.py: docs/bench/mutation_s87.md)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

KEYS = "past_key_values.%d.key"


def _graph(inputs=(), nodes=(), inits=()):
    from onnx import helper

    return helper.make_graph(list(nodes), "g", list(inputs), [], list(inits))


def _cache(i, heads, width, elem=1, kind="key"):
    from onnx import helper

    return helper.make_tensor_value_info(f"past_key_values.{i}.{kind}", elem, ["batch", heads, "past", width])


def test_the_kv_dtype_is_the_caches_element_type(tmp_path):
    """float32, float16, bfloat16 and int8 caches are recorded as such; a graph with no past_key_values input is no
    KV-cache graph: an ExportError naming it."""
    from edgespec.errors import ExportError
    from edgespec_export.bundle import _kv_dtype

    for elem, name in ((1, "float32"), (10, "float16"), (16, "bfloat16"), (3, "int8")):
        assert _kv_dtype(_graph([_cache(0, 2, 8, elem)]), tmp_path / "m.onnx") == name
    with pytest.raises(ExportError, match="m.onnx has no past_key_values inputs"):
        _kv_dtype(_graph(), tmp_path / "m.onnx")


def test_kv_layers_are_recorded_where_some_layer_differs():
    """Per layer (kv heads, head size) from its cache input's dims 1 and 3, recorded only where some layer differs
    from the config's (Gemma 4's global layers): layer 2 of 4 with 1 head of 128 here; a layer without a fixed size
    or without an input takes the config's; all alike, nothing."""
    from onnx import helper

    from edgespec_export.bundle import _kv_layers

    inputs = [_cache(0, 4, 64), _cache(1, 4, 64), _cache(2, 1, 128),
              helper.make_tensor_value_info("past_key_values.3.key", 1, ["batch", "heads", "past", "width"])]
    assert _kv_layers(_graph(inputs), KEYS, 5, 4, 64) == ((4, 64), (4, 64), (1, 128), (4, 64), (4, 64))
    assert _kv_layers(_graph(inputs[:2]), KEYS, 2, 4, 64) == ()
    assert _kv_layers(_graph([_cache(0, 2, 64), _cache(1, 2, 64)]), KEYS, 2, 4, 64) == ((2, 64), (2, 64))


def test_kv_sources_name_the_earlier_layer_whose_keys_a_layer_reads():
    """Gemma 4's shared key-value layers: an attention node whose key and value are an earlier layer's writes the
    rows that layer writes, so its buffer is that layer's (layers 3 and 4 read layer 1's here, by their past key
    inputs); every layer its own: ()."""
    from onnx import helper

    from edgespec_export.bundle import _kv_sources

    def gqa(i, kv):
        return helper.make_node("GroupQueryAttention", [f"q{i}", f"k{kv}", f"v{kv}", KEYS % i,
                                                        f"past_key_values.{i}.value"], [f"o{i}"], domain="com.microsoft")

    nodes = [gqa(0, 0), gqa(1, 1), gqa(2, 2), gqa(3, 1), gqa(4, 1)]
    assert _kv_sources(_graph(nodes=nodes), KEYS, 5) == (0, 1, 2, 1, 1)
    assert _kv_sources(_graph(nodes=nodes[:3]), KEYS, 3) == ()


def test_embedding_tables_count_the_float_tables_only_a_gather_reads(tmp_path):
    """The bytes of the float tables (float32, float16, bfloat16) read only as a Gather's data, and of one row of
    each summed: a table the head's MatMul reads too (tied), an int8 table, a 1-D one and a Gather's indices are
    not counted."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from edgespec_export.bundle import embedding_tables

    inits = [numpy_helper.from_array(np.zeros((10, 6), np.float32), "emb32"),
             numpy_helper.from_array(np.zeros((12, 4), np.float16), "emb16"),
             helper.make_tensor("embbf", TensorProto.BFLOAT16, [5, 8], np.zeros(40, np.uint16).tobytes(), raw=True),
             numpy_helper.from_array(np.zeros((7, 6), np.float32), "tied"),
             numpy_helper.from_array(np.zeros((9, 3), np.int8), "emb8"),
             numpy_helper.from_array(np.zeros(11, np.float32), "flat"),
             numpy_helper.from_array(np.zeros((3, 2), np.float32), "index_table")]
    nodes = [helper.make_node("Gather", [t, "ids"], [t + "_rows"]) for t in ("emb32", "emb16", "embbf", "tied", "emb8",
                                                                            "flat")]
    nodes += [helper.make_node("MatMul", ["h", "tied"], ["logits"]),
              helper.make_node("Gather", ["x", "index_table"], ["picked"])]
    onnx.save(helper.make_model(_graph(nodes=nodes, inits=inits)), str(tmp_path / "model.onnx"))
    assert embedding_tables(tmp_path / "model.onnx") == (10 * 6 * 4 + 12 * 4 * 2 + 5 * 8 * 2, 6 * 4 + 4 * 2 + 8 * 2)


def test_add_bos_needs_the_flag_and_an_id():
    """A tokenizer adds bos only where it says so and has a bos id: the flag without an id (a config naming
    add_bos_token for a vocabulary with no bos) adds none; an id without the flag (Qwen's) adds none."""
    from edgespec_export.bundle import _add_bos

    assert _add_bos(SimpleNamespace(add_bos_token=True, bos_token_id=1))
    assert not _add_bos(SimpleNamespace(add_bos_token=True, bos_token_id=None))
    assert not _add_bos(SimpleNamespace(add_bos_token=False, bos_token_id=1))
    assert not _add_bos(SimpleNamespace(bos_token_id=1))


def test_eos_ids_take_every_id_the_generation_config_names(tmp_path):
    """A Hugging Face folder's generation_config.json with several EOS ids (Llama 3's [128001, 128008, 128009]): the
    bundle stops at each, with the tokenizer's own; a single id is taken as well; none at all, the tokenizer's."""
    import json

    from edgespec_export.bundle import _eos_ids
    from edgespec_export.source import Source

    tok = SimpleNamespace(eos_token_id=2)
    src = Source(str(tmp_path), "hf-dir", tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [9, 7, 2]}))
    assert _eos_ids(tok, src) == [2, 7, 9]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 11}))
    assert _eos_ids(tok, src) == [2, 11]
    (tmp_path / "generation_config.json").unlink()
    assert _eos_ids(tok, src) == [2]


def test_tokenizer_diff_says_how_two_tokenizers_differ():
    """The drafter's tokenizer against the target's: vocabulary sizes, tokens at other ids (the same tokens, two
    swapped), the BPE merges, or else the special tokens or normalization."""
    from edgespec_export.bundle import _tokenizer_diff

    a = {"model": {"vocab": {"a": 0, "b": 1, "c": 2}, "merges": ["a b"]}}
    cases = [({"model": {"vocab": {"a": 0, "b": 1}}}, "vocabulary sizes 3 vs 2"),
             ({"model": {"vocab": {"a": 0, "b": 2, "c": 1}, "merges": ["a b"]}}, "2 tokens map to other ids (e.g. 'b')"),
             ({"model": {"vocab": {"a": 0, "b": 1, "c": 2}, "merges": ["b c"]}}, "the BPE merges differ"),
             ({"model": {"vocab": {"a": 0, "b": 1, "c": 2}, "merges": ["a b"]}, "normalizer": {}},
              "special tokens or normalization differ")]
    for b, what in cases:
        assert _tokenizer_diff(a, b, "t.json", "d.json") == ("the drafter's tokenizer differs from the target's "
                                                             f"(t.json vs d.json): {what}")


def test_the_gpu_plan_line_gives_the_weights_in_mib_and_the_kv_cache_per_token(tiny_bundle):
    """device_memory_line (export's log, ``edgespec info``): a spec's weights as stored in MiB and its KV cache per
    token in KiB and at its context in MiB, in the graph's type."""
    from dataclasses import replace

    from edgespec.manifest import load_manifest
    from edgespec_export.bundle import device_memory_line

    spec = replace(load_manifest(tiny_bundle).target, gpu_weight_bytes=3 << 20)
    line = device_memory_line(spec)
    kib = spec.kv_bytes_per_token / 1024
    assert line.startswith(f"target ({spec.layout} layout): 3.0 MiB of weights on a GPU provider's device + KV "
                           f"{spec.kv_dtype} {kib:.1f} KiB/token"), line
    assert f"({spec.kv_bytes(spec.max_context) / (1 << 20):.1f} MiB at its {spec.max_context:,}-token context)" in line


@pytest.mark.parametrize("precision,accuracy,device", [("int4", 1, "cpu"), ("int4", 0, "cpu"), ("fp32", 4, "cpu"),
                                                         ("int4", 4, "cuda")])
def test_the_python_api_refuses_exact_kernels_it_cannot_build(precision, accuracy, device, tiny_dirs, tmp_path):
    """``export_bundle(..., exact_kernels=True)`` (the Python API: the CLI refuses the same on its own) at an
    accuracy level other than 4, for a target that is not int4, or in the cuda layout: an ExportError before
    anything is built or written."""
    from edgespec.errors import ExportError
    from edgespec_export import export_bundle
    from edgespec_export.build import QuantOptions

    with pytest.raises(ExportError, match="--exact-kernels applies to an int4 target in the cpu layout at accuracy "
                                          "level 4"):
        export_bundle(str(tiny_dirs["qwen2"]), tmp_path / "b", exact_kernels=True, target_precision=precision,
                      quant=QuantOptions(accuracy_level=accuracy), device=device)
    assert list(tmp_path.iterdir()) == []


def test_an_int4_bundles_gpu_weights_are_its_files_as_stored(tiny_int4_bundle):
    """The weights a GPU provider holds are the graph's initializers as stored (int4 blocks, not float32 params):
    the manifest's ``gpu_weight_bytes`` is the model files' bytes, well under 4 bytes a parameter."""
    from edgespec.manifest import load_manifest

    spec = load_manifest(tiny_int4_bundle).target
    assert spec.gpu_weight_bytes == spec.bytes_on_disk == sum(f["bytes"] for f in spec.files.values())
    assert spec.gpu_weight_bytes < spec.params * 4 * 0.6, (spec.gpu_weight_bytes, spec.params)


def test_the_quantization_record_says_what_the_graph_has():
    """_record: the options' record, corrected by the graph (session 49): a shared int4 table (GatherBlockQuantized)
    is quantized embeddings whatever was asked; a float table (a plain Gather) is not; blocks with minimums (gguf,
    hqq, q4_k) are not symmetric even where the tied table's forced symmetry said so."""
    from edgespec_export.build import QuantOptions
    from edgespec_export.bundle import _record

    mm = {"MatMulNBits": 12, "GroupQueryAttention": 2}
    assert not _record(QuantOptions(), {**mm, "Gather": 1}).quantize_embeddings
    assert _record(QuantOptions(), {**mm, "GatherBlockQuantized": 1}).quantize_embeddings
    assert _record(QuantOptions(symmetric=True), mm).symmetric
    for algo in ("gguf", "hqq", "q4_k"):
        r = _record(QuantOptions(algorithm=algo, symmetric=True), mm)
        assert r.symmetric is False and r.algorithm == algo


def test_a_gguf_targets_eos_ids_are_its_own_and_llamacpps_end_of_generation_tokens(tmp_path):
    """A GGUF target's EOS ids: the file's one EOS id and the special tokens llama.cpp also ends a generation at
    (Qwen's <|im_end|> and <|endoftext|>, Llama 3's <|eot_id|>, Phi-3's <|end|>, Gemma's <end_of_turn>), never
    another special token (<|im_start|>) or a plain token of the same text."""
    from edgespec_export.bundle import _eos_ids
    from edgespec_export.source import Source

    names = ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|im_start|>", "<|eom_id|>"]
    added = {100 + i: SimpleNamespace(content=n, special=True) for i, n in enumerate(names)}
    added[200] = SimpleNamespace(content="<|end|>", special=False)
    tok = SimpleNamespace(eos_token_id=5, added_tokens_decoder=added)
    got = _eos_ids(tok, Source(str(tmp_path / "m.gguf"), "gguf", tmp_path / "m.gguf"))
    assert got == [5, 100, 101, 102, 103, 104, 106], got


def test_a_bundle_whose_layers_share_one_cache_shape_records_no_kv_layers(tiny_int4_bundle):
    """Grouped-query attention (fewer KV heads than query heads), every layer alike: the manifest's ``kv_layers`` is
    empty (the config's KV heads and head size for all), not each layer's shape against the query heads."""
    from edgespec.manifest import load_manifest

    spec = load_manifest(tiny_int4_bundle).target
    assert spec.num_kv_heads < spec.num_attention_heads and spec.kv_layers == () and spec.kv_sources == (), spec


def test_a_quantized_graph_that_fails_its_validation_is_not_written(tiny_dirs, tmp_path, monkeypatch):
    """An INT4 target whose validation fails (here a weight check planted to fail, as a layer holding another's
    weights does: test_export's test_validation_fails_a_graph_whose_layers_hold_each_others_weights) is an
    ExportError after the validation's lines, the bundle not written: a quantized graph is refused like a float one."""
    import dataclasses
    import io

    import edgespec_export.validate as V
    from edgespec.errors import ExportError
    from edgespec_export import export_bundle

    real = V.check_weights
    monkeypatch.setattr(V, "check_weights", lambda *a: dataclasses.replace(
        real(*a), failed=[("/model/layers.0/mlp/down_proj/MatMul_Q4", "layers.1.mlp.down_proj", 1.4, 0.5)]))
    said = io.StringIO()
    with pytest.raises(ExportError, match="target: the ONNX graph does not match torch"):
        export_bundle(str(tiny_dirs["qwen2"]), tmp_path / "b", target_precision="int4", quality=False, stream=said)
    assert "✗" in said.getvalue() and list(tmp_path.iterdir()) == [], said.getvalue()[-1500:]


def test_a_drafter_tokenizer_of_the_same_size_with_other_ids_is_refused(tiny_dirs, tmp_path):
    """The drafter's tokenizer with the target's vocabulary size but two tokens' ids swapped drafts other tokens
    than it means: refused before the build, saying how they differ, nothing written (sizes that differ:
    test_export's test_mismatched_tokenizers_refused)."""
    import json
    import shutil

    from edgespec.errors import ExportError
    from edgespec_export import export_bundle

    d = tmp_path / "drafter"
    shutil.copytree(tiny_dirs["drafter"], d)
    tj = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tj["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[40:42]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (d / "tokenizer.json").write_text(json.dumps(tj), encoding="utf-8")
    with pytest.raises(ExportError, match=r"the drafter's tokenizer differs from the target's .*: 2 tokens map to "
                                          r"other ids"):
        export_bundle(str(tiny_dirs["qwen2"]), tmp_path / "b", drafter=str(d), target_precision="fp32", quality=False)
    assert not (tmp_path / "b").exists() and not list(tmp_path.glob(".b.partial*"))


def test_int8_kv_caches_check_the_heads_own_size():
    """``--kv-dtype int8`` keeps a scale per 32 lanes: a config's own ``head_dim`` decides (Gemma's and Qwen3's differ
    from hidden / heads), else hidden / heads; a head of 48 lanes is refused, naming it; 64 and 128 pass."""
    from edgespec.errors import ExportError
    from edgespec_export.bundle import _check_int8_heads

    src = SimpleNamespace(display="m")
    _check_int8_heads(SimpleNamespace(num_attention_heads=8, hidden_size=512, head_dim=None), src)  # (64)
    _check_int8_heads(SimpleNamespace(num_attention_heads=8, hidden_size=384, head_dim=128), src)  # (not 48)
    for cfg, lanes in ((SimpleNamespace(num_attention_heads=8, hidden_size=512, head_dim=48), 48),
                       (SimpleNamespace(num_attention_heads=8, hidden_size=384), 48)):
        with pytest.raises(ExportError, match=f"m: its heads of {lanes} lanes cannot keep int8 KV caches"):
            _check_int8_heads(cfg, src)


def test_layers_other_than_attention_and_state_beside_the_kv_cache_are_refused():
    """A config with linear-attention layers (Qwen3.5's) or Mamba layers (Granite 4's) has state a rejected draft
    cannot roll back: refused, naming the kinds; attention of every kind passes. A built graph keeping one other
    state input beside its KV cache (a quantized cache's scales, say) is refused too, naming it."""
    from edgespec.errors import ExportError
    from edgespec_export.bundle import _check_attention_only, _check_state_inputs

    ok = ["full_attention", "sliding_attention", "chunked_attention", "attention"]
    _check_attention_only(SimpleNamespace(model_type="llama4_text", layer_types=ok), "target")
    for kinds, named in ((["full_attention", "linear_attention"], "linear_attention"),
                         (["attention", "mamba", "linear_attention"], "linear_attention, mamba")):
        with pytest.raises(ExportError, match=f"target: qwen3_next has {named} layers"):
            _check_attention_only(SimpleNamespace(model_type="qwen3_next", layer_types=kinds), "target")
    kv = {"past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"}
    _check_state_inputs({"inputs": dict(kv)}, "drafter")
    _check_state_inputs({"inputs": {**kv, "past_conv_names": "past_conv.%d"}}, "drafter")  # (LFM2's: export/conv.py)
    with pytest.raises(ExportError, match=r"drafter: the built graph keeps state beside its KV cache \(past_scales.%d\)"):
        _check_state_inputs({"inputs": {**kv, "past_scale_names": "past_scales.%d"}}, "drafter")


def test_a_drafters_gguf_algorithm_is_checked_against_the_drafters_own_file(tiny_dirs, tmp_path):
    """``--drafter-quant-algo gguf`` keeps the drafter's GGUF blocks: a drafter that is a Hugging Face folder is
    refused (the target being a .gguf file does not make the drafter one), before anything is built or written."""
    from tiny import make_model, write_gguf

    from edgespec.errors import ExportError
    from edgespec_export import export_bundle
    from edgespec_export.build import QuantOptions

    target = write_gguf(make_model(tmp_path / "q3", "qwen3", seed=5), tmp_path / "t.gguf")
    with pytest.raises(ExportError, match="--drafter-quant-algo gguf keeps a GGUF file's own 4-bit blocks: the drafter "
                                          "is not a .gguf file"):
        export_bundle(str(target), tmp_path / "b", drafter=str(tiny_dirs["drafter"]), drafter_precision="int4",
                      drafter_quant=QuantOptions(algorithm="gguf"), quality=False)
    assert not (tmp_path / "b").exists()


def test_the_manifests_operators_are_the_graphs_counts(tiny_cuda_bundle):
    """The manifest's ``operators`` (``edgespec info``; the planner and the width policy read them) are the graph's
    counts of the ops it lists, the cuda layout's quantized embedding table (GatherBlockQuantized) among them."""
    import collections

    import onnx

    from edgespec.manifest import load_manifest

    spec = load_manifest(tiny_cuda_bundle).target
    ops = collections.Counter(n.op_type for n in onnx.load(str(spec.path), load_external_data=False).graph.node)
    listed = ("MatMulNBits", "GroupQueryAttention", "MatMul", "DequantizeLinear", "GatherBlockQuantized", "Gather")
    assert ops["GatherBlockQuantized"] and spec.operators == {k: ops[k] for k in sorted(listed) if ops[k]}, spec.operators
