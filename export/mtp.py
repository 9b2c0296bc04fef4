"""Gemma 4's multi-token-prediction assistant (``gemma4_assistant``: Google's drafter for E2B and E4B) as an ONNX
graph that drafts from the target's own state.

transformers' ``Gemma4AssistantForCausalLM`` with its ``SinglePositionMultiTokenCandidateGenerator`` is the
reference. Each draft step feeds the assistant ``[the target's (scaled) embedding of the last token, a hidden
state]``: the target's final-normed hidden state at the row that produced that token for the first step, the
assistant's own projected one after it. Every step sits at one constant position (the last token's), its layers
have no keys or values of their own: each attends the target's cache of the last layer of its kind that computes
one (a sliding and a full layer: the target's ``kv_sharing_modes`` "store" layers), so the assistant reads no
prompt: a draft costs its steps only.

The graph (one row, batch 1):

- inputs ``token`` (int64 [1]: the last token), ``hidden`` (float32 [1, rows, target hidden]) and ``row`` (int64
  [1]: the row of ``hidden`` to read: a target call's hidden states can be bound as they are), ``position`` (int64
  [1]: the last token's position, p) and ``length`` (int64 [1]: the target cache rows it attends, 0..length - 1, p
  itself), and per layer kind ``key_<kind>`` / ``value_<kind>`` (the target cache buffers of that kind's store layer,
  [1, kv heads, capacity, head size], the target's KV dtype), which the runtime binds from the target's cache;
- outputs ``logits`` (float32 [1, vocab]) and ``next_hidden`` (float32 [1, target hidden]).

A full layer attends rows 0..length - 1, a sliding one the last ``sliding_window + 1`` of them (transformers' mask
for the assistant: a bidirectional window of ``|q - kv| <= window`` flipped onto the past). transformers hands the
assistant the target's rows up to the new token's position inclusive, which after a rejected draft is that draft's
row; the graph attends the accepted rows only (the rows before p), transformers' inputs exactly where no draft was
rejected (a generation's first draft, a round that kept the whole draft).

The embedding table is the target's, a copy in the assistant's data (float16 unless the export is float32; on the
CPU a Gather-only table stays mapped from the file: the rows read become resident). ``use_ordered_embeddings``
(the centroid head: the top ``centroid_intermediate_top_k`` of ``num_centroids`` clusters' tokens get logits, the
rest the least of those minus 1) as transformers computes it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgespec.errors import ExportError

ASSISTANT_TYPE = "gemma4_assistant"
GRAPH_NAME = "assistant.onnx"
KINDS = ("sliding_attention", "full_attention")
OPSET = 21


@dataclass(frozen=True)
class AssistantGraph:
    """What the runtime needs of an exported assistant (the manifest's ``models.assistant``)."""

    path: Path
    hidden_size: int  # the assistant's own
    target_hidden_size: int
    vocab_size: int
    num_layers: int
    sources: dict  # layer kind -> the target layer whose cache it attends
    sliding_window: int
    params: int
    ordered: bool
    table_dtype: str = "float32"  # the copy of the target's embedding table


def store_layers(target_text_config) -> dict[str, int]:
    """Layer kind -> the target layer whose keys and values an assistant attends: the last layer of that kind
    that computes its own (transformers' ``kv_sharing_modes`` "store"), or without shared layers the last of
    its kind."""
    modes = list(getattr(target_text_config, "kv_sharing_modes", None) or [])
    kinds = list(target_text_config.layer_types)
    out = {}
    for i, (kind, mode) in enumerate(zip(kinds, modes or [None] * len(kinds))):
        if mode == "store":
            out[kind] = i
    if not out:
        first_shared = len(kinds) - int(getattr(target_text_config, "num_kv_shared_layers", 0) or 0)
        for i, kind in enumerate(kinds[:first_shared]):
            out[kind] = i
    return out


def check_pair(assistant_config, target_text_config, target_kv: dict[int, tuple[int, int]]) -> dict[str, int]:
    """The target layers the assistant attends, checked against the assistant's own layers (kinds, kv heads, head
    sizes: ``target_kv`` maps a target layer to its cache's (kv heads, head size)) and the hidden sizes. An
    ``ExportError`` in one line where they do not fit."""
    text = assistant_config.text_config
    if not str(getattr(target_text_config, "model_type", "")).startswith("gemma4") \
            or not getattr(target_text_config, "layer_types", None):
        raise ExportError(f"the assistant drafts for Gemma 4 targets; the target is "
                          f"{getattr(target_text_config, 'model_type', 'another model')}")
    if int(assistant_config.backbone_hidden_size) != int(target_text_config.hidden_size):
        raise ExportError(f"the assistant was trained with a target of hidden size {assistant_config.backbone_hidden_size}"
                          f", the target's is {target_text_config.hidden_size}: not this target's assistant")
    if int(text.vocab_size) != int(target_text_config.vocab_size):
        raise ExportError(f"the assistant's vocabulary ({text.vocab_size}) is not the target's "
                          f"({target_text_config.vocab_size})")
    sources = store_layers(target_text_config)
    text.allow_global_per_layer_attribute_access = True
    for i, kind in enumerate(text.layer_types):
        if kind not in sources:
            raise ExportError(f"the assistant's layer {i} attends a {kind} layer, which the target has none of")
        lc = text.per_layer_config[i]
        want = target_kv[sources[kind]]
        got = (int(lc.num_key_value_heads), int(lc.head_dim))
        if got != tuple(want):
            raise ExportError(f"the assistant's layer {i} ({kind}) reads {got[0]} kv heads of {got[1]} lanes, the "
                              f"target's layer {sources[kind]} caches {want[0]} of {want[1]}")
    if str(text.hidden_activation) not in ("gelu_pytorch_tanh", "gelu_new", "gelu_fast"):
        raise ExportError(f"the assistant's activation {text.hidden_activation!r} is not supported (gelu tanh only)")
    for name in ("attn_logit_softcapping",):
        if getattr(text, name, None):
            raise ExportError(f"the assistant's {name} is not supported")
    return {k: sources[k] for k in dict.fromkeys(text.layer_types)}


class _G:
    """A small graph writer: nodes, initializers, unique names."""

    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0

    def name(self, stem: str) -> str:
        self.n += 1
        return f"{stem}_{self.n}"

    def const(self, stem: str, arr) -> str:
        from onnx import numpy_helper

        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def op(self, op: str, inputs: list, stem: str | None = None, n_out: int = 1, **attrs):
        from onnx import helper

        outs = [self.name(stem or op.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op, inputs, outs, name=self.name("n_" + op), **attrs))
        return outs[0] if n_out == 1 else outs


def _w(t) -> np.ndarray:
    return t.detach().float().cpu().numpy()


def build_assistant(model, target_text_config, target_kv: dict[int, tuple[int, int]], kv_dtype: str,
                    out_dir: Path, *, table_dtype: str = "float16", target_embed=None, embed_scale: float | None = None
                    ) -> AssistantGraph:
    """Write ``out_dir/assistant.onnx`` (and its data) for ``model`` (a ``Gemma4AssistantForCausalLM``) drafting
    for a target whose text config is ``target_text_config``, whose caches are ``kv_dtype`` ("float16" or
    "float32") of the shapes ``target_kv`` (a target layer -> (kv heads, head size)). ``target_embed``: the
    target's input embedding weight (a tensor, [vocab, target hidden]); ``embed_scale`` its scale (default
    sqrt(target hidden), Gemma's)."""
    import onnx
    from onnx import TensorProto, helper

    cfg = model.config
    sources = check_pair(cfg, target_text_config, target_kv)
    text = cfg.text_config
    hb, ha = int(cfg.backbone_hidden_size), int(text.hidden_size)
    vocab = int(text.vocab_size)
    eps = float(text.rms_norm_eps)
    window = int(text.sliding_window or 0)
    kv_type = {"float16": TensorProto.FLOAT16, "float32": TensorProto.FLOAT}.get(kv_dtype)
    if kv_type is None:
        raise ExportError(f"an assistant reads float16 or float32 KV caches, the target's are {kv_dtype}")
    if target_embed is None:
        raise ExportError("the assistant needs the target's input embedding")
    scale = float(hb) ** 0.5 if embed_scale is None else float(embed_scale)
    sd = model.state_dict()
    g = _G()

    # the target's embedding of the last token (its table copied: float16, or float32 for a float32 export)
    table = _w(target_embed).astype(np.float16 if table_dtype == "float16" else np.float32)
    emb = g.op("Gather", [g.const("target_embed", table), "token"], axis=0)  # [1, hb]
    if table.dtype != np.float32:
        emb = g.op("Cast", [emb], to=TensorProto.FLOAT)
    emb = g.op("Mul", [emb, g.const("embed_scale", np.array(scale, dtype=np.float32))])
    # the hidden state: row ``row`` of ``hidden`` [1, rows, hb] (a target call's rows as they are, where a device
    # keeps them; the runtime on the CPU feeds one row and row 0)
    hid = g.op("Reshape", [g.op("Gather", ["hidden", "row"], axis=1), g.const("shape", np.array([1, hb], np.int64))])
    x = g.op("Concat", [emb, hid], axis=-1)  # [1, 2 hb]
    h = g.op("MatMul", [x, g.const("pre_projection", _w(sd["pre_projection.weight"]).T)])  # [1, ha]

    def rms(v, weight=None):
        sq = g.op("Mul", [v, v])
        mean = g.op("ReduceMean", [sq, g.const("axes", np.array([-1], dtype=np.int64))], keepdims=1)
        inv = g.op("Pow", [g.op("Add", [mean, g.const("eps", np.array(eps, dtype=np.float32))]),
                           g.const("m_half", np.array(-0.5, dtype=np.float32))])
        out = g.op("Mul", [v, inv])
        return out if weight is None else g.op("Mul", [out, g.const("norm_w", _w(weight))])

    def linear(v, name):
        return g.op("MatMul", [v, g.const(name.replace(".", "_"), _w(sd[name + ".weight"]).T)])

    # rotary per layer kind: cos/sin of position x inv_freq (transformers' own rotary module's), at the one position
    rot = model.model.rotary_emb
    pos_f = g.op("Cast", ["position"], to=TensorProto.FLOAT)  # [1]
    cos_sin = {}
    for kind in dict.fromkeys(text.layer_types):
        inv = getattr(rot, f"{kind}_inv_freq").detach().float().cpu().numpy()
        scaling = float(getattr(rot, f"{kind}_attention_scaling"))
        full = np.concatenate([inv, inv]).astype(np.float32)
        ang = g.op("Mul", [pos_f, g.const("inv_freq", full)])  # [d]
        c, s = g.op("Cos", [ang]), g.op("Sin", [ang])
        if scaling != 1.0:
            sc = g.const("rope_scaling", np.array(scaling, dtype=np.float32))
            c, s = g.op("Mul", [c, sc]), g.op("Mul", [s, sc])
        cos_sin[kind] = (c, s)

    # the rows each kind attends: [start, length)
    zero = g.const("zero", np.array([0], dtype=np.int64))
    starts = {}
    for kind in cos_sin:
        if kind == "sliding_attention" and window:
            starts[kind] = g.op("Max", [g.op("Sub", ["length", g.const("win", np.array([window + 1], np.int64))]),
                                        zero])
        else:
            starts[kind] = zero
    axis2 = g.const("axis2", np.array([2], dtype=np.int64))
    kv_rows = {}
    for kind in cos_sin:
        pair = []
        for which in ("key", "value"):
            rows = g.op("Slice", [f"{which}_{kind}", starts[kind], "length", axis2])  # [1, hk, L, d]
            # (a Cast whatever the caches' type: retype_kv then changes the inputs only)
            rows = g.op("Cast", [rows], to=TensorProto.FLOAT)
            pair.append(g.op("Squeeze", [rows, g.const("axis0", np.array([0], dtype=np.int64))]))  # [hk, L, d]
        kv_rows[kind] = (g.op("Transpose", [pair[0]], perm=[0, 2, 1]), pair[1])  # K^T [hk, d, L], V [hk, L, d]

    text.allow_global_per_layer_attribute_access = True
    heads = int(text.num_attention_heads)
    for i, kind in enumerate(text.layer_types):
        p = f"model.layers.{i}."
        lc = text.per_layer_config[i]
        hk, d = int(lc.num_key_value_heads), int(lc.head_dim)
        residual = h
        a = rms(h, sd[p + "input_layernorm.weight"])
        q = g.op("Reshape", [linear(a, p + "self_attn.q_proj"), g.const("shape", np.array([heads, d], np.int64))])
        q = rms(q, sd[p + "self_attn.q_norm.weight"])  # [H, d]
        c, s = cos_sin[kind]
        q1, q2 = g.op("Split", [q, g.const("halves", np.array([d // 2, d // 2], np.int64))], n_out=2, axis=-1)
        q = g.op("Add", [g.op("Mul", [q, c]), g.op("Mul", [g.op("Concat", [g.op("Neg", [q2]), q1], axis=-1), s])])
        q = g.op("Reshape", [q, g.const("shape", np.array([hk, heads // hk, d], np.int64))])  # [hk, G, d]
        kt, v = kv_rows[kind]
        scores = g.op("MatMul", [q, kt])  # [hk, G, L] (scale 1: the queries and keys are normed)
        o = g.op("MatMul", [g.op("Softmax", [scores], axis=-1), v])  # [hk, G, d]
        o = g.op("Reshape", [o, g.const("shape", np.array([1, heads * d], np.int64))])
        o = linear(o, p + "self_attn.o_proj")
        h = g.op("Add", [residual, rms(o, sd[p + "post_attention_layernorm.weight"])])
        residual = h
        m = rms(h, sd[p + "pre_feedforward_layernorm.weight"])
        gate = g.op("Gelu", [linear(m, p + "mlp.gate_proj")], approximate="tanh")
        m = linear(g.op("Mul", [gate, linear(m, p + "mlp.up_proj")]), p + "mlp.down_proj")
        h = g.op("Add", [residual, rms(m, sd[p + "post_feedforward_layernorm.weight"])])
        scalar = sd.get(p + "layer_scalar")
        if scalar is not None and not np.all(_w(scalar) == 1.0):
            h = g.op("Mul", [h, g.const("layer_scalar", _w(scalar).reshape(-1)[:1].astype(np.float32))])
    hn = rms(h, sd["model.norm.weight"])  # [1, ha]
    g.nodes.append(helper.make_node("MatMul", [hn, g.const("post_projection", _w(sd["post_projection.weight"]).T)],
                                    ["next_hidden"], name="post_projection"))
    head = sd.get("lm_head.weight", sd.get("model.embed_tokens.weight"))
    ordered = bool(cfg.use_ordered_embeddings)
    if not ordered:
        g.nodes.append(helper.make_node("MatMul", [hn, g.const("lm_head", _w(head).T)], ["logits"], name="lm_head"))
    else:  # the centroid head: the top clusters' tokens, their logits scattered over the least of them minus 1
        me = model.masked_embedding
        top_k, n_c = int(me.centroid_intermediate_top_k), int(me.num_centroids)
        per = vocab // n_c
        cl = g.op("MatMul", [hn, g.const("centroids", _w(sd["masked_embedding.centroids.weight"]).T)])  # [1, C]
        _, idx = g.op("TopK", [cl, g.const("k", np.array([top_k], np.int64))], n_out=2, axis=-1)  # [1, top_k]
        order = me.token_ordering.detach().cpu().numpy().astype(np.int64).reshape(n_c, per)
        ids = g.op("Reshape", [g.op("Gather", [g.const("token_ordering", order), idx], axis=0),
                               g.const("shape", np.array([1, top_k * per], np.int64))])  # [1, top_k * per]
        rows = g.op("Gather", [g.const("lm_head_rows", _w(head)), g.op("Squeeze", [ids, zero])], axis=0)  # [N, ha]
        sel = g.op("MatMul", [hn, g.op("Transpose", [rows], perm=[1, 0])])  # [1, N]
        low = g.op("Sub", [g.op("ReduceMin", [sel], keepdims=0), g.const("one", np.array(1.0, np.float32))])
        base = g.op("Expand", [low, g.const("shape", np.array([1, vocab], np.int64))])
        g.nodes.append(helper.make_node("ScatterElements", [base, ids, sel], ["logits"], axis=1, name="scatter"))

    f = TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("token", TensorProto.INT64, [1]),
              helper.make_tensor_value_info("hidden", f, [1, "rows", hb]),
              helper.make_tensor_value_info("row", TensorProto.INT64, [1]),
              helper.make_tensor_value_info("position", TensorProto.INT64, [1]),
              helper.make_tensor_value_info("length", TensorProto.INT64, [1])]
    for kind in cos_sin:
        hk, d = target_kv[sources[kind]]
        for which in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"{which}_{kind}", kv_type, [1, hk, "capacity", d]))
    outputs = [helper.make_tensor_value_info("logits", f, [1, vocab]),
               helper.make_tensor_value_info("next_hidden", f, [1, hb])]
    graph = helper.make_graph(g.nodes, "gemma4_assistant", inputs, outputs, g.inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="edgespec")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / GRAPH_NAME
    onnx.save(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=GRAPH_NAME + ".data", size_threshold=1024)
    params = int(sum(v.numel() for k, v in sd.items() if "token_ordering" not in k)) + int(table.size)
    return AssistantGraph(path=path, hidden_size=ha, target_hidden_size=hb, vocab_size=vocab,
                          num_layers=len(text.layer_types), sources=sources,
                          sliding_window=window, params=params, ordered=ordered, table_dtype=str(table.dtype))


def reference_step(model, target_embed, embed_scale, token: int, hidden, position: int, kv: dict, length: int):
    """transformers' assistant step (tests, validation): ``kv`` maps a layer kind to the target's (key, value)
    tensors [1, kv heads, rows, head size]; rows 0..length - 1 are attended. (logits [vocab], next hidden [hb])."""
    import torch

    with torch.no_grad():
        e = target_embed[token].float() * embed_scale
        x = torch.cat([e.view(1, 1, -1), torch.as_tensor(np.asarray(hidden), dtype=torch.float32).view(1, 1, -1)], -1)
        shared = {k: (a[:, :, :length].float(), b[:, :, :length].float()) for k, (a, b) in kv.items()}
        out = model(inputs_embeds=x, position_ids=torch.tensor([[position]]), attention_mask=None,
                    shared_kv_states=shared)
    return out.logits[0, -1].float().numpy(), out.last_hidden_state[0, -1].float().numpy()



def assistant_files(root: Path) -> dict:
    """The assistant's files table under ``root / "assistant"``, sized and hashed."""
    from edgespec.manifest import sha256_file

    return {f"assistant/{f.name}": {"bytes": f.stat().st_size, "sha256": sha256_file(f)}
            for f in sorted((Path(root) / "assistant").iterdir()) if f.name.startswith(GRAPH_NAME)}


def retype_kv(path: Path, kv_dtype: str) -> bool:
    """The assistant graph at ``path`` made to take KV caches of ``kv_dtype`` (its target's, after ``exact-kernels``
    made them float16), in place: its cache inputs' element type (each is Cast to float32 where it is read). False
    where they already are."""
    import onnx
    from onnx import TensorProto

    want = {"float16": TensorProto.FLOAT16, "float32": TensorProto.FLOAT}[kv_dtype]
    m = onnx.load(str(path), load_external_data=False)
    changed = False
    for i in m.graph.input:
        if i.name.startswith(("key_", "value_")) and i.type.tensor_type.elem_type != want:
            i.type.tensor_type.elem_type = want
            changed = True
    if changed:  # (a new file renamed over it: an in-place rewrite's stage shares the old one by a hard link)
        tmp = path.with_name(path.name + ".tmp")
        onnx.save(m, str(tmp))
        os.replace(tmp, path)
    return changed


def validate_assistant(graph: AssistantGraph, assistant, target, tspec, ids, log=None, state=None) -> float:
    """The assistant graph run as the runtime runs it (the exported target ``tspec`` read ``ids`` on edgespec's
    runtime: its cache buffers of the layers ``graph.sources`` names and its hidden-state output) against
    transformers' assistant step on the torch target's own state (``target``), at positions through the sliding
    window and past it. A float32 target: the largest logit difference relative to the logits' scale must be under
    1e-3 and every argmax the same. A quantized target's state differs from torch's: the graph is held to
    transformers' step on the runtime's state instead, and the attended cache rows to torch's (relative error under
    0.5: another layer's are ~1.4 off). Returns that difference; an ``ExportError`` where it fails. ``state``:
    ``runtime_state(tspec, ids, graph.sources)`` where the caller has it."""
    import torch

    from edgespec.onnx_lm import open_session
    from edgespec.providers import choose

    ids = [int(i) for i in ids]
    with torch.no_grad():
        out = target(torch.tensor([ids]), output_hidden_states=True, return_shared_kv_states=True)
    embed = target.get_input_embeddings()
    scale = float(getattr(embed, "scalar_embed_scale", graph.target_hidden_size ** 0.5))
    # (the graph's copy of the table, rounded as it is stored: the check is of the graph, not of that rounding)
    table = embed.weight.detach().to(getattr(torch, graph.table_dtype)).float()
    rows, feeds = state or runtime_state(tspec, ids, graph.sources)
    runtime_kv = {}
    for kind, layer in graph.sources.items():
        pair = feeds[f"key_{kind}"], feeds[f"value_{kind}"]
        runtime_kv[kind] = tuple(torch.from_numpy(a.astype(np.float32)) for a in pair)
        truth = out.shared_kv_states[kind][0][0, :, :len(ids)].float().numpy()
        err = float(np.linalg.norm(pair[0][0, :, :len(ids)].astype(np.float32) - truth) / max(np.linalg.norm(truth), 1e-9))
        if err > (1e-3 if tspec.precision == "fp32" else 0.5):
            raise ExportError(f"the target's layer {layer} cache is not the {kind} keys transformers' assistant reads "
                              f"(relative difference {err:.3g}): not written")
    sess = open_session(graph.path, choose(["cpu"]), role="assistant")
    exact = tspec.precision == "fp32"
    positions = sorted({p for p in (1, 2, graph.sliding_window, graph.sliding_window + 2, len(ids) // 2, len(ids) - 1)
                        if 0 < p < len(ids)})
    worst = 0.0
    for p in positions:
        if exact:  # transformers on torch's own state
            want_l, want_h = reference_step(assistant, table, scale, ids[p], out.hidden_states[-1][0, p - 1]
                                            .float().numpy(), p, out.shared_kv_states, p)
        else:  # transformers on the runtime's state
            want_l, want_h = reference_step(assistant, table, scale, ids[p], rows[p - 1], p, runtime_kv, p)
        got_l, got_h = sess.run(None, _step_feeds(ids, rows, p, feeds))
        span = max(float(np.abs(want_l).max()), 1e-6)
        diff = max(float(np.abs(got_l[0] - want_l).max()) / span,
                   float(np.abs(got_h[0] - want_h).max()) / max(float(np.abs(want_h).max()), 1e-6))
        worst = max(worst, diff)
        if diff > 1e-3 or int(np.argmax(got_l[0])) != int(np.argmax(want_l)):
            raise ExportError(f"the assistant graph does not match transformers' assistant at position {p} (relative "
                              f"difference {diff:.3g}): not written")
    if log:
        log(f"    assistant: against transformers' assistant step on the {'target' if exact else 'runtime'}'s state at "
            f"positions {positions}: relative difference {worst:.3g}")
    return worst


PRECISIONS = ("fp32", "int8", "int4")


def quantize_assistant(source: Path, graph: AssistantGraph, bits: int, block_size: int = 32,
                       accuracy_level: int = 4) -> int:
    """The float assistant graph at ``source`` with its weight matrices (every MatMul with a constant weight:
    projections, layers, the head) quantized to ``bits`` (4 or 8) in blocks of ``block_size`` by onnxruntime's
    ``MatMulNBitsQuantizer``, written as ``graph`` (its path and data file); the embedding tables stay as they are
    (read a row a step). Returns the MatMuls quantized."""
    import logging

    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    m = onnx.load(str(source))
    before = sum(n.op_type == "MatMul" for n in m.graph.node)
    quiet = logging.getLogger().level
    logging.getLogger().setLevel(logging.WARNING)  # (the quantizer logs a line per node)
    try:
        q = MatMulNBitsQuantizer(m, bits=bits, block_size=block_size, is_symmetric=True, accuracy_level=accuracy_level)
        q.process()
    finally:
        logging.getLogger().setLevel(quiet)
    out = q.model.model
    after = sum(n.op_type == "MatMul" for n in out.graph.node)
    onnx.save(out, str(graph.path), save_as_external_data=True, all_tensors_to_one_file=True,
              location=GRAPH_NAME + ".data", size_threshold=1024)
    return before - after


def runtime_state(tspec, ids, sources: dict) -> tuple[np.ndarray, dict]:
    """The exported target ``tspec`` read ``ids`` on edgespec's runtime (one call): each row's hidden state
    ``[rows, hidden]``, and the cache buffers of the layers ``sources`` names as the assistant's
    ``key_<kind>``/``value_<kind>`` feeds."""
    from edgespec.onnx_lm import OnnxLM
    from edgespec.providers import choose

    ids = [int(i) for i in ids]
    lm = OnnxLM(tspec, min(tspec.max_context, max(64, len(ids) + 8)), choose(["cpu"]))
    if len(ids) > lm.max_context:
        raise ExportError(f"the assistant's check reads {len(ids)} tokens, the target's context holds {lm.max_context}")
    if not lm.keeps_hidden():
        raise ExportError("the target graph gives no hidden states for the assistant")
    lm.forward(ids)  # (one call: every row's hidden state)
    rows = np.stack([lm.hidden_of(r) for r in range(len(ids))])
    feeds = {}
    for kind, layer in sources.items():
        # (copies: the OrtValues' numpy arrays are views of the cache, freed with the model)
        feeds[f"key_{kind}"], feeds[f"value_{kind}"] = (lm.cache.buffers[2 * layer + w][2].numpy().copy()
                                                        for w in (0, 1))
    return rows, feeds


def _step_feeds(ids, rows: np.ndarray, p: int, feeds: dict) -> dict:
    """One assistant step's inputs at position ``p`` (the token there, the target's row before it)."""
    return {"token": np.array([ids[p]], np.int64), "hidden": rows[None],
            "row": np.array([p - 1], np.int64), "position": np.array([p], np.int64),
            "length": np.array([p], np.int64), **feeds}


def compare_assistants(float_path: Path, graph: AssistantGraph, ids, state) -> tuple[float, float]:
    """A quantized assistant graph against the float one it was made from, both fed the runtime's state of the
    target over ``ids`` (``state``: ``runtime_state``) at every position: (top-1 agreement, the largest logit
    difference relative to the logits' scale)."""
    from edgespec.onnx_lm import open_session
    from edgespec.providers import choose

    ids = [int(i) for i in ids]
    rows, feeds = state
    a = open_session(float_path, choose(["cpu"]), role="assistant")
    b = open_session(graph.path, choose(["cpu"]), role="assistant")
    same, worst = 0, 0.0
    for p in range(1, len(ids)):
        x = a.run(None, _step_feeds(ids, rows, p, feeds))[0][0]
        y = b.run(None, _step_feeds(ids, rows, p, feeds))[0][0]
        same += int(np.argmax(x)) == int(np.argmax(y))
        worst = max(worst, float(np.abs(x - y).max()) / max(float(np.abs(x).max()), 1e-6))
    return same / max(1, len(ids) - 1), worst
