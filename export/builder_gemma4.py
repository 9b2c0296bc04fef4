"""Gemma 4's text decoders for onnxruntime-genai's model builder (0.18), run inside the builder's process
(``builder_shim.patch``).

The builder maps ``Gemma4ForConditionalGeneration`` to its MoE class (Gemma 4 26B-A4B) whatever the checkpoint,
and ``Gemma4ForCausalLM`` (a text-only checkpoint) to nothing; its dense class was written for another checkpoint
(``Gemma4Unified``). Gemma 4's dense decoders (E2B, E4B, 31B) get ``Gemma4Text`` here: the builder's dense class
(query, key and value norms, the global layers' wider heads and proportional rotary, ``layer_scalar``) and what
it does not build:

- **per-layer embeddings** (E2B, E4B: ``hidden_size_per_layer_input``): a second token embedding, one vector per
  layer, mixed with a projection of the input embeddings, normed, ``(projection + embedding) / sqrt(2)``; each layer
  ends with ``h + norm(W_up(gelu(W_gate(h)) * per_layer_input))`` before its ``layer_scalar``;
- **shared key-value layers** (``num_kv_shared_layers``: E2B's last 20 of 35 layers): such a layer computes no key
  or value; it attends the key and value rows of the last earlier layer of its kind (sliding or full). The graph
  gives it those rows as its own key and value input: its cache holds what that layer's holds (a copy: the
  runtime's caches are one per layer), so its attention is transformers' to the last bit;
- **double-wide MLPs** on the shared layers (``use_double_wide_mlp``).

Gemma 4 with experts (``enable_moe_block``: 26B-A4B) stays the builder's own class."""
from __future__ import annotations

GEMMA4_CAUSAL = "Gemma4ForCausalLM"
GEMMA4_IMAGE_TEXT = "Gemma4ForConditionalGeneration"


def _text(config):
    return getattr(config, "text_config", None) or config


def is_gemma4(config) -> bool:
    return str(getattr(_text(config), "model_type", "")).startswith("gemma4")


def patch() -> None:
    import builders
    from builders import base, gemma

    if getattr(builders, "_edgespec_gemma4", False) or not hasattr(builders, "Gemma4MoEModel") \
            or not hasattr(gemma, "Gemma4Model"):
        return  # (a builder without Gemma 4, older than 0.18: nothing to patch)
    import torch
    from onnx_ir import DataType
    from transformers import AutoConfig

    class Gemma4Text(gemma.Gemma4Model):
        def __init__(self, config, io_dtype, onnx_dtype, ep, cache_dir, extra_options):
            text = _text(config)
            for c in {id(config): config, id(text): text}.values():  # (transformers 5 refuses config.head_dim
                c.allow_global_per_layer_attribute_access = True  # else: the sliding layers', as the builder reads it)
            kinds = list(text.layer_types)
            full = kinds.index("full_attention") if "full_attention" in kinds else 0
            per_layer = text.per_layer_config
            config.global_head_dim = int(per_layer[full].head_dim)
            config.num_global_key_value_heads = int(per_layer[full].num_key_value_heads)
            self._kv_modes = list(text.kv_sharing_modes)
            self._ple = int(getattr(text, "hidden_size_per_layer_input", 0) or 0)
            self._kv_rows = {}  # a layer kind -> (key, value) of its last layer that computes them
            self._ple_rows = None  # [batch, positions, layers, per-layer width], made at layer 0
            super().__init__(config, io_dtype, onnx_dtype, ep, cache_dir, extra_options)
            self.embed_attrs["scale"] = float(self.hidden_size) ** 0.5  # (the builder rounds it to 2 decimals)

        def load_weights(self, input_path):
            # (the builder's dense class reads another checkpoint's layout; transformers loads both of Gemma 4's)
            return base.Model.load_weights(self, input_path)

        def make_embedding(self, embedding):
            if embedding.shape[-1] != self.hidden_size:  # (the per-layer table: Gemma4Text._per_layer_inputs)
                return
            super().make_embedding(embedding)

        # -- shared key-value layers --------------------------------------------------------------------------

        def _shared(self, layer_id):
            return self._kv_modes[layer_id] == "reuse"

        def make_attention_input_proj(self, layer_id, attention, root_input, **kwargs):
            if not self._shared(layer_id):
                return super().make_attention_input_proj(layer_id, attention, root_input, **kwargs)
            if attention.q_proj.bias is not None:
                raise NotImplementedError("a Gemma 4 shared key-value layer with a query bias is not supported")
            name = self.make_matmul(attention.q_proj, f"/model/layers.{layer_id}/attn/q_proj/MatMul", root_input)
            self.attention_attrs["q_path"] = f"{name}/output_0"

        def make_attention_qk_rope_and_norm(self, layer_id, attention, **kwargs):
            kind = self.layer_types[layer_id]
            if not self._shared(layer_id):
                caches = super().make_attention_qk_rope_and_norm(layer_id, attention, **kwargs)
                self._kv_rows[kind] = (self.attention_attrs["k_path"], self.attention_attrs["v_path"])
                return caches
            if kind not in self._kv_rows:
                raise NotImplementedError(f"Gemma 4 layer {layer_id} shares the keys of no earlier {kind} layer")
            q = self._head_norm(layer_id, "q_norm", self.attention_attrs["q_path"], attention.q_norm.weight,
                                self.num_attn_heads)
            name = f"/model/layers.{layer_id}/attn/q_rotary/{self.rope_attrs['op_type']}"
            self.make_rotary_embedding_op(name, root_input=q,
                                          position_ids=kwargs.get("position_ids", self.input_names["position_ids"]))
            self.attention_attrs["q_path"] = f"{name}/output_0"
            self.attention_attrs["k_path"], self.attention_attrs["v_path"] = self._kv_rows[kind]
            return "", ""

        def _head_norm(self, layer_id, tag, path, weight, heads):
            """RMSNorm of each head of ``path`` ([batch, positions, heads x head size]) by ``weight``."""
            width = heads * self.head_size
            prefix = f"/model/layers.{layer_id}/attn/{tag}"
            self.make_reshape(f"{prefix}/Reshape_1", [path, f"/model/constants/INT64/[0, -1, {self.head_size}]"],
                              dtype=self.io_dtype, shape=["batch_size", f"sequence_length * {heads}", self.head_size])
            normed = self._norm(prefix, f"{prefix}/Reshape_1/output_0", weight, self.io_dtype)
            self.make_reshape(f"{prefix}/Reshape_2", [normed, f"/model/constants/INT64/[0, -1, {width}]"],
                              dtype=self.io_dtype, shape=["batch_size", "sequence_length", width])
            return f"{prefix}/Reshape_2/output_0"

        # -- double-wide MLPs ------------------------------------------------------------------------------------

        def make_mlp(self, layer_id, mlp, root_input):
            saved = self.intermediate_size
            self.intermediate_size = int(mlp.gate_proj.out_features)
            try:
                super().make_mlp(layer_id, mlp, root_input)
            finally:
                self.intermediate_size = saved

        # -- per-layer embeddings ----------------------------------------------------------------------------

        def _text_model(self):
            for m in self.weights.modules():
                if hasattr(m, "embed_tokens_per_layer") and hasattr(m, "per_layer_model_projection"):
                    return m
            raise NotImplementedError("a Gemma 4 config with per-layer inputs and no per-layer embedding")

        def _norm(self, name, x, weight, dtype):
            """RMSNorm of ``x`` over its last axis by ``weight`` (the node ``name``/SimplifiedLayerNormalization)."""
            w = f"{name[1:].replace('/', '.')}.weight"
            self.make_initializer(weight + self.layernorm_attrs["add_offset"], w, to=dtype)
            node = f"{name}/SimplifiedLayerNormalization"
            self.make_node("SimplifiedLayerNormalization", inputs=[x, w], outputs=[f"{node}/output_0"], name=node,
                           epsilon=self.layernorm_attrs["epsilon"], axis=-1, stash_type=1)
            self.make_value(f"{node}/output_0", dtype, shape=None)
            return f"{node}/output_0"

        def _per_layer_inputs(self, embeds):
            """``(norm(W embeds / sqrt(hidden)) + E_layers[ids] * sqrt(width)) / sqrt(2)``, [B, S, layers, width]
            (transformers' ``get_per_layer_inputs`` and ``project_per_layer_inputs``)."""
            tm = self._text_model()
            n, p, dt = self.num_layers, self._ple, self.io_dtype
            t = self.to_str_dtype(dt)
            table = tm.embed_tokens_per_layer
            scale = float(getattr(table, "scalar_embed_scale", p ** 0.5))
            ids = self.input_names["input_ids"]
            w = "model.embed_tokens_per_layer.weight"
            # float16 but at float32 (E2B's table is 262,144 x 8,960: 9.4 GB in float32, 4.7 GB in float16, its
            # bfloat16 values kept; a Gather reads a token's row, the rest stays on disk)
            tdt = dt if self.onnx_dtype == DataType.FLOAT else DataType.FLOAT16
            self.make_initializer(table.weight[:, : n * p], w, to=tdt)  # (the parameter: the weight check's)
            pre = "/model/per_layer_inputs"
            self.make_gather(f"{pre}/embed/Gather", [w, ids], dtype=tdt, shape=None, axis=0)
            rows = f"{pre}/embed/Gather/output_0"
            if tdt != dt:
                self.make_cast(f"{pre}/embed/Cast", rows, dt, shape=None)
                rows = f"{pre}/embed/Cast/output_0"
            # (transformers: the rows times the scale in the weights' dtype)
            self.make_mul(f"{pre}/embed/Mul", [rows, f"/model/constants/{t}/{float(torch.tensor(scale, dtype=table.weight.dtype))}"],
                          dtype=dt, shape=None)
            rows = f"{pre}/embed/Mul/output_0"
            self.make_reshape(f"{pre}/embed/Reshape", [rows,
                                                       f"/model/constants/INT64/[0, 0, {n}, {p}]"], dtype=dt, shape=None)
            if self.values[embeds].dtype != dt:  # (the cuda layout's embeddings: float32 into the first norm)
                self.make_cast(f"{pre}/projection/Cast", embeds, dt, shape=None)
                embeds = f"{pre}/projection/Cast/output_0"
            proj = self.make_matmul(tm.per_layer_model_projection, f"{pre}/model_projection/MatMul", embeds)
            self.make_mul(f"{pre}/projection/Mul", [f"{proj}/output_0",
                                                    f"/model/constants/{t}/{float(tm.per_layer_model_projection_scale)}"],
                          dtype=dt, shape=None)
            self.make_reshape(f"{pre}/projection/Reshape", [f"{pre}/projection/Mul/output_0",
                                                            f"/model/constants/INT64/[0, 0, {n}, {p}]"],
                              dtype=dt, shape=None)
            normed = self._norm(f"{pre}/projection_norm", f"{pre}/projection/Reshape/output_0",
                                tm.per_layer_projection_norm.weight, dt)
            self.make_add(f"{pre}/Add", [normed, f"{pre}/embed/Reshape/output_0"], dtype=dt, shape=None)
            self.make_mul(f"{pre}/Mul", [f"{pre}/Add/output_0", f"/model/constants/{t}/{float(tm.per_layer_input_scale)}"],
                          dtype=dt, shape=None)
            return f"{pre}/Mul/output_0"

        def _per_layer_block(self, layer_id, layer):
            """``h + norm(W_up(gelu(W_gate(h)) * per_layer_input))`` with h the layer's residual stream so far."""
            a = self.layernorm_attrs
            pre = f"/model/layers.{layer_id}/per_layer"
            root, skip = a["root_input"], a["skip_input"]
            rd, sd = self.values[root].dtype, self.values[skip].dtype
            if sd != rd:
                self.make_cast(f"{pre}/skip/Cast", skip, rd, shape=None)
                skip = f"{pre}/skip/Cast/output_0"
            self.make_add(f"{pre}/residual/Add", [root, skip], dtype=rd, shape=self.make_hidden_state_shape())
            h = f"{pre}/residual/Add/output_0"
            x = h
            if rd != self.io_dtype:
                self.make_cast(f"{pre}/Cast", h, self.io_dtype, shape=None)
                x = f"{pre}/Cast/output_0"
            dt = self.io_dtype
            gate = self.make_matmul(layer.per_layer_input_gate, f"{pre}/gate/MatMul", x)
            act = f"{pre}/act_fn/FastGelu"
            self.make_node("FastGelu", inputs=[f"{gate}/output_0"], outputs=[f"{act}/output_0"], name=act,
                           domain="com.microsoft")
            self.make_value(f"{act}/output_0", dt, shape=None)
            self.make_gather(f"{pre}/input/Gather", [self._ple_rows, f"/model/constants/INT64/{layer_id}"], dtype=dt,
                             shape=None, axis=2)
            self.make_mul(f"{pre}/Mul", [f"{act}/output_0", f"{pre}/input/Gather/output_0"], dtype=dt, shape=None)
            up = self.make_matmul(layer.per_layer_projection, f"{pre}/projection/MatMul", f"{pre}/Mul/output_0")
            out = self._norm(f"{pre}/post_norm", f"{up}/output_0", layer.post_per_layer_input_norm.weight, dt)
            if rd != dt:  # (the cuda layout: the builder's Gemma layers hand float32 terms on to the next one)
                self.make_cast(f"{pre}/post_norm/Cast", out, rd, shape=None)
                out = f"{pre}/post_norm/Cast/output_0"
            a["root_input"], a["skip_input"] = h, out

        def make_layer(self, layer_id, layer):
            a = self.layernorm_attrs
            if self._ple and layer_id == 0:
                self._ple_rows = self._per_layer_inputs(a["root_input"])
            gemma.Gemma2Model.make_layer(self, layer_id, layer)
            if self._ple:
                self._per_layer_block(layer_id, layer)
            scalar = float(layer.layer_scalar.item())  # (the builder's Gemma 4 layer_scalar, after the block)
            if scalar == 1.0:
                return
            for suffix, attr in (("skip", "skip_input"), ("root", "root_input")):
                operand = a[attr]
                dtype = self.values[operand].dtype
                name = f"/model/layers.{layer_id}/layer_scalar/Mul_{suffix}"
                self.make_mul(name, [operand, f"/model/constants/{self.to_str_dtype(dtype)}/{scalar}"], dtype=dtype,
                              shape=["batch_size", "sequence_length", self.hidden_size])
                a[attr] = f"{name}/output_0"

    moe = builders.Gemma4MoEModel

    class Gemma4Family(moe):
        def __new__(cls, config, *args, **kw):
            if not getattr(_text(config), "enable_moe_block", False):
                return Gemma4Text(config, *args, **kw)
            return super().__new__(cls)

    from_pretrained = AutoConfig.from_pretrained

    def read_config(*args, _orig=from_pretrained, **kw):
        config = _orig(*args, **kw)
        if list(getattr(config, "architectures", None) or [""])[:1] == [GEMMA4_CAUSAL]:
            config.architectures = [GEMMA4_IMAGE_TEXT]  # (the builder's name for Gemma 4: the class above)
        return config

    AutoConfig.from_pretrained = staticmethod(read_config)
    builders.Gemma4MoEModel = Gemma4Family
    builders._edgespec_gemma4 = True
