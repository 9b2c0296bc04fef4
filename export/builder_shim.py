"""onnxruntime-genai's model builder (0.18) with the config fields its Gemma 3 builder reads, from transformers 5's
config. Run as ``python -m edgespec_export.builder_shim`` with the builder's own arguments (export/build.py does).

transformers 5 keeps Gemma 3's rotary parameters per layer type (``rope_parameters = {"full_attention": {...},
"sliding_attention": {...}}``); the builder's Gemma 3 reads the flat form of transformers 4 (``rope_parameters
["rope_type"]``, ``rope_theta``, ``rope_local_base_freq``) and stopped with ``KeyError: 'rope_type'``. ``patch``
gives the config those fields, read from the nested form (the global layers' parameters flat, the local layers'
theta as ``rope_local_base_freq``), before the builder's Gemma 3 reads it (on the multimodal checkpoints'
``text_config`` too, which the builder lifts up). The builder made the local layers' rotary cache with the global
layers' scaling (Gemma 3 4B and larger scale the global rotary by 8, ``linear``, not the local one): here the local
cache is made at the local layers' own.
"""
from __future__ import annotations

import runpy


# the local layers' rotary scaling of the model being built (flat_rope sets it; 1: none)
_LOCAL = {"factor": 1.0}


def flat_rope(config) -> bool:
    """The transformers 4 fields of a transformers 5 per-layer-type ``rope_parameters`` set on ``config``
    (in place); False where it has none."""
    rp = getattr(config, "rope_parameters", None)
    if not isinstance(rp, dict) or "rope_type" in rp or not isinstance(rp.get("full_attention"), dict):
        return False
    full = dict(rp["full_attention"])
    local = rp.get("sliding_attention") if isinstance(rp.get("sliding_attention"), dict) else full
    full.setdefault("rope_type", "default")
    config.rope_parameters = full
    config.rope_theta = float(full.get("rope_theta", 10000.0))
    config.rope_local_base_freq = float(local.get("rope_theta", config.rope_theta))
    _LOCAL["factor"] = float(local.get("factor", 1.0)) if local.get("rope_type") == "linear" else 1.0
    return True


def rope_type_alias(config) -> bool:
    """``rope_parameters["type"]`` set to its ``rope_type`` where it lacks it (in place): transformers 5 names the
    rotary's kind ``rope_type`` only, and the builder's LongRoPE Phi-3 models (Phi-3.5-mini, Phi-4-mini) read
    ``type`` as their magnitude scaling policy (``KeyError: 'type'``). False where there is nothing to set."""
    rp = getattr(config, "rope_parameters", None)
    if not isinstance(rp, dict) or "type" in rp or "rope_type" not in rp:
        return False
    rp["type"] = rp["rope_type"]
    return True


def _patch_longrope() -> None:
    """The builder's LongRoPE Phi-3 classes read their config through ``rope_type_alias``."""
    from builders import phi

    for name in ("Phi3MiniLongRoPEModel", "Phi3SmallLongRoPEModel", "Phi3MoELongRoPEModel"):
        cls = getattr(phi, name, None)
        if cls is None or getattr(cls, "_edgespec_rope_type", False):
            continue
        rope_init = cls.make_rope_init

        def make_rope_init(self, config, _orig=rope_init):
            rope_type_alias(config)
            # transformers' attention_factor scales both tables; the builder reads short_mscale/long_mscale only, else
            # its default from the contexts (a GGUF's attn_factor, or a config's, built another rotary: session 57)
            rp = getattr(config, "rope_parameters", None)
            factor = rp.get("attention_factor") if isinstance(rp, dict) else None
            if isinstance(factor, (int, float)) and factor > 0:
                rp.setdefault("short_mscale", float(factor))
                rp.setdefault("long_mscale", float(factor))
            return _orig(self, config)

        cls.make_rope_init = make_rope_init
        cls._edgespec_rope_type = True


def _patch_rope_kinds() -> None:
    """The builder's rotary for kinds it has and skipped: its Llama class (Llama, Nemotron, SmolLM3, DeepSeek-Coder's
    Llama checkpoints) handles llama3 scaling only and built a ``linear`` (DeepSeek-Coder 1.3B/6.7B: factor 4) or a
    ``yarn`` rotary unscaled, a different model that quantized validation let through; its base class has both, and
    not llama3 (EXAONE 4.0's, built on it here: transformers' frequencies).
    YaRN's tables are transformers' (its betas 32 and 1 by default: the builder's 0 divided by zero, and Qwen2.5's
    documented YaRN snippet gives none). ``export.bundle.check_rotary`` compares the built tables with transformers' either way."""
    from builders import base, llama

    if getattr(base.Model, "_edgespec_rope_kinds", False):
        return
    base_init = base.Model.make_rope_init

    def base_rope_init(self, config, _orig=base_init):
        rp = getattr(config, "rope_parameters", None)
        if isinstance(rp, dict) and rp.get("rope_type") == "llama3":  # (the builder's Llama class has it, its base
            # class raised "not currently supported": EXAONE 4.0, built as OLMo 2 here) transformers' own frequencies
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            inv_freq, scaling = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
            self._edgespec_rotary = (inv_freq.float(), float(scaling))
            return None
        yarn = isinstance(rp, dict) and rp.get("rope_type") == "yarn"
        if yarn:
            rp.setdefault("beta_fast", 32.0)
            rp.setdefault("beta_slow", 1.0)
        out = _orig(self, config)
        if yarn:  # transformers' own YaRN frequencies and scaling (the builder's ramp was not truncated, and it read
            # the original context from the top level of the config, not the rotary's parameters: another table)
            from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

            inv_freq, scaling = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
            self._edgespec_rotary = (inv_freq.float(), float(scaling))
        return out

    base_tables = base.Model.make_rotary_embedding_caches_from_scratch

    def rotary_tables(self, _orig=base_tables):
        got = getattr(self, "_edgespec_rotary", None)
        if got is None:
            return _orig(self)
        import torch

        inv_freq, scaling = got
        freqs = torch.outer(torch.arange(self.rope_attrs["cache_length"], dtype=torch.int64).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * scaling, emb.sin() * scaling

    llama_init = llama.LlamaModel.make_rope_init

    def llama_rope_init(self, config, _orig=llama_init):
        rp = getattr(config, "rope_parameters", None)
        if isinstance(rp, dict) and rp.get("rope_type") in ("linear", "yarn"):
            return base.Model.make_rope_init(self, config)
        return _orig(self, config)

    base.Model.make_rope_init = base_rope_init
    base.Model.make_rotary_embedding_caches_from_scratch = rotary_tables
    llama.LlamaModel.make_rope_init = llama_rope_init
    base.Model._edgespec_rope_kinds = True


def _patch_norms() -> None:
    """Norms the builder gets wrong (0.18), each found by an fp32 export that failed validation against torch, their
    INT4 bundles passing it as other models: the builder reads a norm's epsilon from ``rms_norm_eps`` only, else
    1e-6 (Phi-2's ``layer_norm_eps`` and Nemotron's ``norm_eps`` are 1e-5); its OLMo class computed an RMSNorm where
    OLMo's is a LayerNorm without weight or bias (mean subtracted, eps 1e-5 as transformers writes it), and left out
    ``clip_qkv`` (OLMo 1B/7B: 8.0), a Clip of the query, key and value projections."""
    from builders import base, olmo

    if getattr(base.Model, "_edgespec_norms", False):
        return
    init = base.Model.__init__

    def base_init(self, config, *args, _orig=init, **kw):
        if getattr(config, "rms_norm_eps", None) is None:
            for f in ("layer_norm_eps", "norm_eps", "layer_norm_epsilon"):
                v = getattr(config, f, None)
                if isinstance(v, float):
                    config.rms_norm_eps = v
                    break
        _orig(self, config, *args, **kw)

    olmo_init = olmo.OLMoModel.__init__

    def olmo_model_init(self, config, *args, _orig=olmo_init, **kw):
        _orig(self, config, *args, **kw)
        self.layernorm_attrs["simple"] = False  # transformers' OlmoLayerNorm: F.layer_norm(x, None, None, eps=1e-5)
        self.layernorm_attrs["epsilon"] = 1e-5
        self._edgespec_clip_qkv = getattr(config, "clip_qkv", None)

    def make_attention_input_proj(self, layer_id, attention, root_input, **kw):
        before = {p: self.attention_attrs[p] for p in ("q_path", "k_path", "v_path")}
        base.Model.make_attention_input_proj(self, layer_id, attention, root_input, **kw)
        c = self._edgespec_clip_qkv
        if c is None:
            return
        t = self.to_str_dtype(self.io_dtype)
        for p in ("q_path", "k_path", "v_path"):
            src = self.attention_attrs[p]
            if not src or src == before[p]:
                continue
            name = f"/model/layers.{layer_id}/attn/{p[0]}_clip/Clip"
            self.make_clip(name, [src, f"/model/constants/{t}/{-float(c)}", f"/model/constants/{t}/{float(c)}"],
                           self.io_dtype, shape=None)
            self.attention_attrs[p] = f"{name}/output_0"

    base.Model.__init__ = base_init
    olmo.OLMoModel.__init__ = olmo_model_init
    olmo.OLMoModel.make_attention_input_proj = make_attention_input_proj
    base.Model._edgespec_norms = True


# config._edgespec_family of an OLMo 2 or 3 (or EXAONE 4.0) config the builder is given as OLMo's (_patch_olmo2)
OLMO2, OLMO3, EXAONE4 = "olmo2", "olmo3", "exaone4"
OLMO_FAMILIES = {"Olmo2ForCausalLM": OLMO2, "Olmo3ForCausalLM": OLMO3, "Exaone4ForCausalLM": EXAONE4}


def _patch_olmo2() -> None:
    """OLMo 2 and 3 (``Olmo2ForCausalLM``: OLMo 2 1B-32B; ``Olmo3ForCausalLM``: ``Olmo3Model`` below) and EXAONE 4.0
    (``Exaone4Model`` below), which the builder (0.18) does not build ("not currently supported"). OLMo 2's layer has
    no norm before attention or the MLP; each one's output is normed (RMSNorm) before it joins the residual stream,
    and the query and key projections are normed over their whole width (all heads at once, where Qwen3's norms are
    per head):

        h = h + post_attention_norm(attention(h));  h = h + post_feedforward_norm(mlp(h))

    ``Olmo2Model`` builds that from the builder's parts (its attention, MLP, norms and final skip norm; the
    residual sums as ``Add`` nodes). The builder picks its class by ``config.architectures[0]`` inside its own
    module: an OLMo 2 or 3 (or EXAONE 4.0) config is given to it as OLMo's, marked, and the OLMo class builds a
    marked config as its family (the bundle's ``genai_config.json`` then says type ``olmo``: onnxruntime-genai runs
    the graph as it is, greedy tokens equal to edgespec's on a tiny OLMo 2). The weights still load as the family's class (from the
    folder's config.json)."""
    import builders
    from builders import base
    from transformers import AutoConfig

    if getattr(builders, "_edgespec_olmo2", False):
        return

    class Olmo2Model(base.Model):
        def make_attention_init(self, config):
            self.attention_attrs["q_norm"] = True
            self.attention_attrs["k_norm"] = True
            super().make_attention_init(config)

        def is_fused_qk_norm_gqa_supported(self):
            return False  # (GroupQueryAttention's fused norms are per head)

        def make_qk_norm(self, layer_id, attention):
            """The query's and key's RMSNorm over the whole projection (``q_norm`` of num_heads x head_dim)."""
            for p, norm, width in (("q", attention.q_norm, self.q_size), ("k", attention.k_norm, self.kv_size)):
                name = f"/model/layers.{layer_id}/attn/{p}_norm/SimplifiedLayerNormalization"
                weight = f"model.layers.{layer_id}.attn.{p}_norm.layernorm.weight"
                self.make_initializer(norm.weight + self.layernorm_attrs["add_offset"], weight, to=self.io_dtype)
                out = f"{name}/output_0"
                self.make_node("SimplifiedLayerNormalization", inputs=[self.attention_attrs[f"{p}_path"], weight],
                               outputs=[out], name=name, epsilon=self.layernorm_attrs["epsilon"], axis=-1, stash_type=1)
                self.make_value(out, self.io_dtype, shape=self.make_hidden_state_shape(last_dim=width))
                self.attention_attrs[f"{p}_path"] = out

        def _sum(self, name, a, b):
            self.make_add(name, [a, b], dtype=self.io_dtype, shape=self.make_hidden_state_shape())
            return f"{name}/output_0"

        def _post_norm(self, layer_id, norm, x, location):
            """``norm`` (RMSNorm) of ``x``, as the builder makes a norm without a skip input."""
            attrs = self.layernorm_attrs
            root = attrs["root_input"]
            attrs["root_input"] = x
            self.make_layernorm(layer_id, norm, skip=False, simple=True, location=location)
            attrs["root_input"] = root
            return attrs["output_0"]

        def make_layer(self, layer_id, layer):
            attrs = self.layernorm_attrs
            # the residual stream: the embeddings, else the last layer's two terms (summed by the final skip norm)
            h = attrs["root_input"] if attrs["first_layernorm"] else self._sum(
                f"/model/layers.{layer_id}/residual/Add", attrs["root_input"], attrs["skip_input"])
            self.make_attention(layer_id, layer.self_attn, root_input=h)
            normed = self._post_norm(layer_id, layer.post_attention_layernorm, attrs["skip_input"], "post_attention")
            h = self._sum(f"/model/layers.{layer_id}/post_attention/Add", h, normed)
            self.make_mlp(layer_id, layer.mlp, root_input=h)
            normed = self._post_norm(layer_id, layer.post_feedforward_layernorm, attrs["skip_input"],
                                     "post_feedforward")
            attrs["root_input"], attrs["skip_input"] = h, normed
            attrs["first_layernorm"] = False
            if layer_id == self.num_layers - 1:
                attrs["last_layernorm"] = True

    class Olmo3Model(Olmo2Model):
        """OLMo 3 (``Olmo3ForCausalLM``): OLMo 2's layer, sliding windows on the layers ``layer_types`` marks
        ``sliding_attention`` (three of four; the builder's base class applies a window per layer so), and a rotary
        per layer type (the full layers' may be YaRN-scaled, the sliding layers' not): two tables, as the builder's
        Gemma 3 has, each transformers' own (its rotary module's frequencies and attention scaling per type)."""

        def __init__(self, config, *args, **kw):
            from transformers.models.olmo3.modeling_olmo3 import Olmo3RotaryEmbedding

            rot = Olmo3RotaryEmbedding(config)  # (from the config as transformers reads it: rotary per layer type)
            tables = {t: (getattr(rot, f"{t}_inv_freq").float(), float(getattr(rot, f"{t}_attention_scaling")))
                      for t in ("full_attention", "sliding_attention") if hasattr(rot, f"{t}_inv_freq")}
            flat_rope(config)  # (the builder's base reads a flat rotary: the full layers')
            super().__init__(config, *args, **kw)
            self.cos_cache_global_name, self.sin_cache_global_name = "cos_cache_global", "sin_cache_global"
            self.cos_cache_local_name, self.sin_cache_local_name = "cos_cache_local", "sin_cache_local"
            for kind, cos, sin in (("full_attention", "cos_cache_global", "sin_cache_global"),
                                   ("sliding_attention", "cos_cache_local", "sin_cache_local")):
                self._edgespec_rotary = tables.get(kind) or next(iter(tables.values()))  # (one kind of layer only)
                self.rope_attrs["create_caches"] = True
                base.Model.make_rotary_embedding_caches(self, cos_cache_name=cos, sin_cache_name=sin)

        def make_rotary_embedding_caches(self, **kwargs):
            local = self.window_size != -1  # (base.make_attention sets it per layer: -1 on the full layers)
            return base.Model.make_rotary_embedding_caches(
                self, cos_cache_name=kwargs.get("cos_cache_name", self.cos_cache_local_name if local else
                                                self.cos_cache_global_name),
                sin_cache_name=kwargs.get("sin_cache_name", self.sin_cache_local_name if local else
                                          self.sin_cache_global_name))

    class Exaone4Model(Olmo2Model):
        """EXAONE 4.0 (``Exaone4ForCausalLM``: 1.2B, 32B): OLMo 2's layer (norms after attention and the MLP only)
        with its query and key normed per head (the builder's own per-head norms, as Qwen3's), and where the config
        has a sliding window, windows on the layers ``layer_types`` marks ``sliding_attention`` and no rotary on the
        others (transformers rotates the queries and keys of sliding layers only, then: its global layers are NoPE)."""

        def make_qk_norm(self, layer_id, attention):
            return base.Model.make_qk_norm(self, layer_id, attention)

        def make_attention(self, layer_id, attention, root_input, **kwargs):
            attrs = self.attention_attrs
            saved = attrs["rope"], attrs["use_rope_in_attn"]
            if self._edgespec_window and not self.is_local(layer_id):  # (no rotary: neither in the attention op
                attrs["rope"] = attrs["use_rope_in_attn"] = False  # nor as RotaryEmbedding nodes before it)
            try:
                super().make_attention(layer_id, attention, root_input, **kwargs)
            finally:
                attrs["rope"], attrs["use_rope_in_attn"] = saved

        def __init__(self, config, *args, **kw):
            self._edgespec_window = getattr(config, "sliding_window", None) is not None
            super().__init__(config, *args, **kw)

    olmo = builders.OLMoModel
    families = {OLMO2: Olmo2Model, OLMO3: Olmo3Model, EXAONE4: Exaone4Model}

    class OLMoFamily(olmo):
        def __new__(cls, config, *args, **kw):
            family = families.get(getattr(config, "_edgespec_family", None))
            if family is not None:
                return family(config, *args, **kw)
            return super().__new__(cls)

    from_pretrained = AutoConfig.from_pretrained

    def read_config(*args, _orig=from_pretrained, **kw):
        config = _orig(*args, **kw)
        arch = list(getattr(config, "architectures", None) or [""])[:1][0]
        family = OLMO_FAMILIES.get(arch)
        if family is not None:
            config.architectures = ["OlmoForCausalLM"]
            config._edgespec_family = family
        return config

    AutoConfig.from_pretrained = staticmethod(read_config)
    builders.OLMoModel = OLMoFamily
    builders._edgespec_olmo2 = True


def _patch_smollm3() -> None:
    """SmolLM3's NoPE layers (every fourth: ``no_rope_layers``): the builder's class turned the rotary inside the
    attention off for them and left the rotary on, so its base class built it as ``RotaryEmbedding`` nodes, which
    read a ``position_ids`` input the graph has not (``KeyError: 'position_ids'``: every real SmolLM3 failed to
    build; the tests' two-layer model had no NoPE layer). Such a layer gets no rotary at all, as transformers."""
    from builders import smollm

    cls = smollm.SmolLM3Model
    if getattr(cls, "_edgespec_nope", False):
        return
    make = cls.make_attention

    def make_attention(self, layer_id, attention, root_input, _orig=make, **kwargs):
        saved = self.attention_attrs["rope"]
        if not self.no_rope_layers[layer_id]:
            self.attention_attrs["rope"] = False
        try:
            return _orig(self, layer_id, attention, root_input, **kwargs)
        finally:
            self.attention_attrs["rope"] = saved

    cls.make_attention = make_attention
    cls._edgespec_nope = True


def _patch_gemma_scale() -> None:
    """Gemma's embedding scale (Gemma 1, 2, 3 and their subclasses): the builder multiplies the embeddings by
    sqrt(hidden) rounded to two decimals (33.94 for Gemma 3 1B's 1,152), transformers by sqrt(hidden) itself
    (33.9411...): a float32 export of a Gemma 3 4B-shaped image-text model failed its validation (0.039 off), Gemma 3 1B's
    shape was 6.2e-3 off where other families are ~1e-6 (session 60, an audit; every tiny Gemma test had hidden 64,
    whose square root is 8). The scale is transformers' now, as Gemma 4's (builder_gemma4)."""
    from builders import gemma

    cls = gemma.GemmaModel
    if getattr(cls, "_edgespec_scale", False):
        return
    init = cls.__init__

    def __init__(self, *args, _orig=init, **kw):
        _orig(self, *args, **kw)
        self.embed_attrs["scale"] = float(self.hidden_size) ** 0.5

    cls.__init__ = __init__
    cls._edgespec_scale = True


def patch() -> None:
    """Wrap the builder's Gemma 3 class (imported as the builder imports it: top-level ``builders``, from its
    own folder) so that it reads a flat config, and its LongRoPE Phi-3 classes (``_patch_longrope``)."""
    import onnxruntime_genai.models  # noqa: F401  (puts the builder's folder on sys.path)
    from builders import gemma

    _patch_longrope()
    _patch_rope_kinds()
    _patch_norms()
    _patch_olmo2()
    _patch_smollm3()
    _patch_gemma_scale()
    from edgespec_export import builder_gemma4

    builder_gemma4.patch()

    cls = gemma.Gemma3Model
    if getattr(cls, "_edgespec_flat_rope", False):
        return
    init = cls.__init__

    def __init__(self, config, *args, **kw):
        _LOCAL["factor"] = 1.0
        if builder_gemma4.is_gemma4(config):  # (the builder's Gemma 4 reads the nested form)
            return init(self, config, *args, **kw)
        flat_rope(config)
        if getattr(config, "text_config", None) is not None:  # (Gemma 3 4B+: the builder lifts text_config up)
            flat_rope(config.text_config)
        init(self, config, *args, **kw)

    def make_rotary_embedding_multi_cache(self):
        """The builder's own (the global layers' cos/sin caches, then the local layers' at their theta), with
        the local caches at the local layers' scaling: the builder kept the global layers' (Gemma 3 4B+ scales
        its global rotary by 8, not its local one)."""
        base = super(cls, self)
        self.cos_cache_global_name, self.sin_cache_global_name = "cos_cache_global", "sin_cache_global"
        base.make_rotary_embedding_caches(cos_cache_name=self.cos_cache_global_name,
                                          sin_cache_name=self.sin_cache_global_name)
        self.rope_attrs["create_caches"] = True
        self.rope_attrs["theta"] = self.rope_local_theta
        self.rope_attrs["rescale_factors"] = _LOCAL["factor"]
        self.cos_cache_local_name, self.sin_cache_local_name = "cos_cache_local", "sin_cache_local"
        base.make_rotary_embedding_caches(cos_cache_name=self.cos_cache_local_name,
                                          sin_cache_name=self.sin_cache_local_name)

    cls.__init__ = __init__
    cls.make_rotary_embedding_multi_cache = make_rotary_embedding_multi_cache
    cls._edgespec_flat_rope = True


def main() -> None:
    patch()
    runpy.run_module("onnxruntime_genai.models.builder", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
