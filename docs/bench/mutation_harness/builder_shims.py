# session 89: export/builder_shim.py (R) and export/builder_gemma4.py (J), written by a helper session
# export/builder_shim.py (R): patches onnxruntime-genai's model builder (0.18, top-level ``builders``) in the build's
# process before runpy runs it: transformers 5's per-kind Gemma 3 / OLMo 3 rotary flattened (flat_rope, _LOCAL's local
# scaling in Gemma 3's multi-cache), LongRoPE's ``type`` alias and attention factor (_patch_longrope), llama3 / YaRN /
# linear rotaries as transformers computes them (_patch_rope_kinds' base_rope_init, rotary_tables, llama_rope_init),
# norms' epsilons and OLMo's LayerNorm / clip_qkv (_patch_norms), OLMo 2 / OLMo 3 / EXAONE 4.0 built as OLMo's class
# (_patch_olmo2: Olmo2Model, Olmo3Model, Exaone4Model, OLMoFamily, read_config), SmolLM3's NoPE layers, Gemma's exact
# embedding scale, patch()'s order and guards, main()'s runpy. export/builder_gemma4.py (J): Gemma 4's dense text
# decoders (Gemma4Text: shared key-value layers, per-layer embeddings, double-wide MLPs, layer scalars; Gemma4Family,
# read_config). Nearly every test is an export through the builder (a forked zygote child; run.py's copy needs the
# edgespec_export link, or the mutants run against /work/main/export): test_archs.py (gemma3, olmo2/3, exaone4, smollm3,
# longrope, the llama scaled rotaries, the norms' float32 exports, gemma4, the embedding scale, real structures),
# test_mtp.py (Gemma 4 E2B targets), test_builder_zygote.py (main()'s usage error), and any export (test_export.py etc.)
# for mutants that break every build. Unit tests: test_archs.py::test_flat_rope_leaves_a_flat_config_alone,
# ::test_rope_type_alias_gives_the_builder_the_field_it_reads. patch() runs once per build process, so the
# `_edgespec_*` guards' removal is equivalent there; their inversion (nothing patched) is what is listed. patch()'s
# order is not mutated: each patch sets class attributes read at call time, so reorderings are equivalent (even
# _patch_longrope before _patch_rope_kinds: the Phi-3 small/MoE LongRoPE wrappers then call the base class's original
# make_rope_init, which only differs from base_rope_init for llama3/YaRN). Suggested run: tests/test_archs.py
# tests/test_mtp.py tests/test_builder_zygote.py (-k to the tests each comment names; the exports are slow).
R = "export/builder_shim.py"
J = "export/builder_gemma4.py"
MUTANTS = [
# ---- flat_rope ----
# R1 flat_rope: the local layers read as the global ones (local theta = global) (test_flat_rope_leaves_a_flat_config_alone, test_gemma3_from_a_transformers_5_config)
("R1", R, "    local = rp.get(\"sliding_attention\") if isinstance(rp.get(\"sliding_attention\"), dict) else full",
          "    local = full"),
# R2 flat_rope: no default rope_type for a full_attention dict without one (builder KeyError 'rope_type') (no test found: transformers 5 writes rope_type per kind)
("R2", R, "    full.setdefault(\"rope_type\", \"default\")\n", ""),
# R3 flat_rope: the config keeps the nested rope_parameters (builder KeyError) (test_flat_rope_..., test_gemma3_from_a_transformers_5_config, test_olmo2_and_3_...[olmo3])
("R3", R, "    config.rope_parameters = full\n", ""),
# R4 flat_rope: rope_local_base_freq from the global layers (test_flat_rope_..., test_gemma3_from_a_transformers_5_config)
("R4", R, "    config.rope_local_base_freq = float(local.get(\"rope_theta\", config.rope_theta))",
          "    config.rope_local_base_freq = float(full.get(\"rope_theta\", config.rope_theta))"),
# R5 flat_rope: the local scaling taken from the global layers (Gemma 3 4B+'s x8 on the local cache) (test_gemma3_from_a_transformers_5_config [gemma3s], test_rotary_tables_per_layer_kind_are_checked_against_transformers, test_gemma_s_embedding_scale_is_transformers_s[gemma3-image-text])
("R5", R, "    _LOCAL[\"factor\"] = float(local.get(\"factor\", 1.0)) if local.get(\"rope_type\") == \"linear\" else 1.0",
          "    _LOCAL[\"factor\"] = float(full.get(\"factor\", 1.0)) if full.get(\"rope_type\") == \"linear\" else 1.0"),
# R6 flat_rope: a linear-scaled local rotary left unscaled (the test of "linear" inverted) (no test found: every test's local rotary is default)
("R6", R, "if local.get(\"rope_type\") == \"linear\" else 1.0", "if local.get(\"rope_type\") != \"linear\" else 1.0"),
# ---- rope_type_alias ----
# R7 rope_type_alias: an existing "type" overwritten, True again on a second call (test_rope_type_alias_gives_the_builder_the_field_it_reads)
("R7", R, "    if not isinstance(rp, dict) or \"type\" in rp or \"rope_type\" not in rp:",
           "    if not isinstance(rp, dict) or \"rope_type\" not in rp:"),
# R8 rope_type_alias: a dict without rope_type raises KeyError instead of False (no test found: the unit test's cases stop at the other checks)
("R8", R, "    if not isinstance(rp, dict) or \"type\" in rp or \"rope_type\" not in rp:",
           "    if not isinstance(rp, dict) or \"type\" in rp:"),
# ---- _patch_longrope ----
# R9 make_rope_init (LongRoPE): the "type" alias not given (test_longrope_exports_..., test_a_longrope_gguf_exports_...)
("R9", R, "            rope_type_alias(config)\n", ""),
# R10 make_rope_init (LongRoPE): reads "factor" for the attention factor (test_a_longrope_gguf_exports_as_its_folder_does)
("R10", R, "            factor = rp.get(\"attention_factor\") if isinstance(rp, dict) else None",
           "            factor = rp.get(\"factor\") if isinstance(rp, dict) else None"),
# R11 make_rope_init (LongRoPE): a float attention factor ignored (int only) (test_a_longrope_gguf_exports_as_its_folder_does [attn 1.3])
("R11", R, "            if isinstance(factor, (int, float)) and factor > 0:",
           "            if isinstance(factor, int) and factor > 0:"),
# R12 make_rope_init (LongRoPE): the long tables keep the builder's magnitude (long_mscale not set) (test_a_longrope_gguf_exports_as_its_folder_does)
("R12", R, "                rp.setdefault(\"long_mscale\", float(factor))\n", ""),
# R13 make_rope_init (LongRoPE): the loop's late-bound rope_init called (Phi-3 mini's reads the base class: "longrope not supported") (test_longrope_exports_..., test_a_longrope_gguf_exports_...)
("R13", R, "            return _orig(self, config)\n\n        cls.make_rope_init = make_rope_init",
           "            return rope_init(self, config)\n\n        cls.make_rope_init = make_rope_init"),
# ---- _patch_rope_kinds ----
# R14 _patch_rope_kinds: guard inverted (llama3 on the base class, YaRN, linear Llama left as the builder had them) (test_a_llamas_scaled_rotary_is_built_as_transformers_computes_it, test_exaone4_exports_...[hybrid], test_olmo2_and_3_...[olmo3])
("R14", R, "    if getattr(base.Model, \"_edgespec_rope_kinds\", False):",
           "    if not getattr(base.Model, \"_edgespec_rope_kinds\", False):"),
# R15 base_rope_init: llama3 handed on to the builder's base class ("not currently supported") (test_exaone4_exports_and_takes_the_exact_kernels[hybrid])
("R15", R, "            self._edgespec_rotary = (inv_freq.float(), float(scaling))\n            return None",
           "            self._edgespec_rotary = (inv_freq.float(), float(scaling))\n            return _orig(self, config)"),
# R16 base_rope_init: llama3's frequencies computed but not kept (unscaled tables) (test_exaone4_exports_and_takes_the_exact_kernels[hybrid])
("R16", R, "            inv_freq, scaling = ROPE_INIT_FUNCTIONS[\"llama3\"](config, \"cpu\")\n            self._edgespec_rotary = (inv_freq.float(), float(scaling))\n",
           "            inv_freq, scaling = ROPE_INIT_FUNCTIONS[\"llama3\"](config, \"cpu\")\n"),
# R17 base_rope_init: YaRN's default beta_fast 16, not transformers' 32 (test_a_llamas_scaled_rotary_...[yarn-no-betas])
("R17", R, "            rp.setdefault(\"beta_fast\", 32.0)", "            rp.setdefault(\"beta_fast\", 16.0)"),
# R18 base_rope_init: transformers' YaRN tables not kept (the builder's own ramp and original context) (test_a_llamas_scaled_rotary_...[yarn-no-betas], test_ministral3_s_text_decoder_...)
("R18", R, "            inv_freq, scaling = ROPE_INIT_FUNCTIONS[\"yarn\"](config, \"cpu\")\n            self._edgespec_rotary = (inv_freq.float(), float(scaling))\n",
           "            inv_freq, scaling = ROPE_INIT_FUNCTIONS[\"yarn\"](config, \"cpu\")\n"),
# R19 rotary_tables: the test of a kept table inverted (every unscaled rotary unpacks None) (any export: test_export.py, test_archs.py)
("R19", R, "        if got is None:\n            return _orig(self)", "        if got is not None:\n            return _orig(self)"),
# R20 rotary_tables: the attention scaling left out of the tables (YaRN's 1.139; OLMo 3's full layers) (test_a_llamas_scaled_rotary_...[yarn-no-betas], test_olmo2_and_3_...[olmo3])
("R20", R, "        return emb.cos() * scaling, emb.sin() * scaling", "        return emb.cos(), emb.sin()"),
# R21 llama_rope_init: a linear Llama left to the builder's Llama class (unscaled) (test_a_llamas_scaled_rotary_...[linear])
("R21", R, "        if isinstance(rp, dict) and rp.get(\"rope_type\") in (\"linear\", \"yarn\"):",
           "        if isinstance(rp, dict) and rp.get(\"rope_type\") in (\"yarn\",):"),
# R22 _patch_rope_kinds: rotary_tables not installed (kept tables ignored: llama3/YaRN/OLMo 3 the builder's) (test_exaone4_...[hybrid], test_olmo2_and_3_...[olmo3], test_a_llamas_scaled_rotary_...[yarn-no-betas])
("R22", R, "    base.Model.make_rotary_embedding_caches_from_scratch = rotary_tables\n", ""),
# ---- _patch_norms ----
# R23 _patch_norms: guard inverted (epsilons 1e-6, OLMo's RMSNorm, no clip) (test_families_whose_norms_the_builder_got_wrong_export_at_float32, test_real_checkpoint_structure_exports_as_torch[phi-2])
("R23", R, "    if getattr(base.Model, \"_edgespec_norms\", False):", "    if not getattr(base.Model, \"_edgespec_norms\", False):"),
# R24 base_init: the epsilon test inverted (Phi-2's 1e-5 read as 1e-6) (test_real_checkpoint_structure_exports_as_torch[phi-2], test_families_whose_norms_...[phi2, nemotron])
("R24", R, "        if getattr(config, \"rms_norm_eps\", None) is None:", "        if getattr(config, \"rms_norm_eps\", None) is not None:"),
# R25 base_init: Nemotron's norm_eps not read (1e-6 for 1e-5) (test_families_whose_norms_...[nemotron]; fp32's 1e-2 tolerance may let it pass)
("R25", R, "            for f in (\"layer_norm_eps\", \"norm_eps\", \"layer_norm_epsilon\"):",
           "            for f in (\"layer_norm_eps\", \"layer_norm_epsilon\"):"),
# R26 olmo_model_init: OLMo's LayerNorm built as an RMSNorm (test_families_whose_norms_...[olmo, olmo-clip-qkv])
("R26", R, "        self.layernorm_attrs[\"simple\"] = False  #", "        self.layernorm_attrs[\"simple\"] = True  #"),
# R27 olmo_model_init: OLMo's LayerNorm at eps 1e-6 (test_families_whose_norms_...[olmo]; fp32's 1e-2 tolerance may let it pass)
("R27", R, "        self.layernorm_attrs[\"epsilon\"] = 1e-5", "        self.layernorm_attrs[\"epsilon\"] = 1e-6"),
# R28 olmo_model_init: clip_qkv read from another field (never clipped) (test_families_whose_norms_...[olmo-clip-qkv])
("R28", R, "        self._edgespec_clip_qkv = getattr(config, \"clip_qkv\", None)",
           "        self._edgespec_clip_qkv = getattr(config, \"clip_qk\", None)"),
# R29 make_attention_input_proj (OLMo): the None test inverted (float(None) without clip; no clip with one) (test_families_whose_norms_...[olmo, olmo-clip-qkv])
("R29", R, "        if c is None:\n            return", "        if c is not None:\n            return"),
# R30 make_attention_input_proj (OLMo): the Clip's lower bound 0, not -clip_qkv (test_families_whose_norms_...[olmo-clip-qkv])
("R30", R, "f\"/model/constants/{t}/{-float(c)}\"", "f\"/model/constants/{t}/{0.0}\""),
# ---- _patch_olmo2: Olmo2Model ----
# R31 _patch_olmo2: guard inverted (OLMo 2/3, EXAONE 4 "not currently supported") (test_olmo2_and_3_..., test_exaone4_..., test_olmo3_with_one_kind_of_layer)
("R31", R, "    if getattr(builders, \"_edgespec_olmo2\", False):", "    if not getattr(builders, \"_edgespec_olmo2\", False):"),
# R32 Olmo2Model.make_attention_init: the key norm left out (test_olmo2_and_3_export_and_take_the_exact_kernels [fp32 < 1e-3, random norms])
("R32", R, "            self.attention_attrs[\"k_norm\"] = True\n", "            self.attention_attrs[\"k_norm\"] = False\n"),
# R33 Olmo2Model: the fused-norm refusal removed (the cuda layout fuses per-head norms where OLMo 2's span the projection) (no test found: no OLMo 2/3 test exports --device cuda; CPU never fuses)
("R33", R, "        def is_fused_qk_norm_gqa_supported(self):\n            return False",
           "        def _unused_fused_qk_norm(self):\n            return False"),
# R34 Olmo2Model._post_norm: a LayerNorm (mean subtracted) for the RMSNorm (test_olmo2_and_3_..., test_exaone4_...)
("R34", R, "            self.make_layernorm(layer_id, norm, skip=False, simple=True, location=location)",
           "            self.make_layernorm(layer_id, norm, skip=False, simple=False, location=location)"),
# R35 Olmo2Model.make_layer: the residual stream not summed (each layer starts from the last MLP's input) (test_olmo2_and_3_..., test_exaone4_...)
("R35", R, "            h = attrs[\"root_input\"] if attrs[\"first_layernorm\"] else self._sum(\n                f\"/model/layers.{layer_id}/residual/Add\", attrs[\"root_input\"], attrs[\"skip_input\"])",
           "            h = attrs[\"root_input\"]"),
# R36 Olmo2Model.make_layer: the attention output normed by the feed-forward norm (test_olmo2_and_3_... [random norms], test_exaone4_...)
("R36", R, "            normed = self._post_norm(layer_id, layer.post_attention_layernorm, attrs[\"skip_input\"], \"post_attention\")",
           "            normed = self._post_norm(layer_id, layer.post_feedforward_layernorm, attrs[\"skip_input\"], \"post_attention\")"),
# ---- _patch_olmo2: Olmo3Model, Exaone4Model ----
# R37 Olmo3Model.__init__: the nested rotary not flattened (builder KeyError 'rope_type') (test_olmo2_and_3_...[olmo3], test_olmo3_with_one_kind_of_layer)
("R37", R, "            flat_rope(config)  #", "            pass  #"),
# R38 Olmo3Model.__init__: one kind of layer only (KeyError, no fallback to the other table) (test_olmo3_with_one_kind_of_layer)
("R38", R, "                self._edgespec_rotary = tables.get(kind) or next(iter(tables.values()))",
           "                self._edgespec_rotary = tables[kind]"),
# R39 Olmo3Model.make_rotary_embedding_caches: full and sliding layers' tables swapped (test_olmo2_and_3_...[olmo3])
("R39", R, "            local = self.window_size != -1", "            local = self.window_size == -1"),
# R40 Exaone4Model: the per-head norm override dropped (OLMo 2's whole-width norm on per-head weights) (test_exaone4_exports_and_takes_the_exact_kernels)
("R40", R, "        def make_qk_norm(self, layer_id, attention):\n            return base.Model.make_qk_norm(self, layer_id, attention)",
           "        def _unused_qk_norm(self, layer_id, attention):\n            return base.Model.make_qk_norm(self, layer_id, attention)"),
# R41 Exaone4Model.make_attention: the sliding layers NoPE, the global ones rotated (test_exaone4_...[hybrid])
("R41", R, "            if self._edgespec_window and not self.is_local(layer_id):",
           "            if self._edgespec_window and self.is_local(layer_id):"),
# R42 Exaone4Model.make_attention: every global layer NoPE without a window too (test_exaone4_...[global])
("R42", R, "            if self._edgespec_window and not self.is_local(layer_id):",
           "            if not self.is_local(layer_id):"),
# R43 Exaone4Model.make_attention: only the attention's rotary off (RotaryEmbedding nodes still made: position_ids / a rotated global layer) (test_exaone4_...[hybrid])
("R43", R, "                attrs[\"rope\"] = attrs[\"use_rope_in_attn\"] = False", "                attrs[\"use_rope_in_attn\"] = False"),
# R44 Exaone4Model.make_attention: the rotary not restored after a NoPE layer (every layer after the first global one NoPE) (no test found: the tiny hybrid's only global layer is its last; EXAONE 4.0 32B's 3:1 would be wrong)
("R44", R, "            finally:\n                attrs[\"rope\"], attrs[\"use_rope_in_attn\"] = saved", "            finally:\n                pass"),
# ---- _patch_olmo2: the family dispatch ----
# R45 OLMO_FAMILIES: EXAONE 4 built as OLMo 2 (whole-width norms, global layers rotated) (test_exaone4_exports_and_takes_the_exact_kernels)
("R45", R, "\"Exaone4ForCausalLM\": EXAONE4", "\"Exaone4ForCausalLM\": OLMO2"),
# R46 read_config: the family not marked (OLMo 1's class builds an OLMo 2) (test_olmo2_and_3_..., test_exaone4_...)
("R46", R, "            config._edgespec_family = family\n", ""),
# R47 _patch_olmo2: OLMoFamily not installed (test_olmo2_and_3_..., test_exaone4_..., test_olmo3_with_one_kind_of_layer)
("R47", R, "    builders.OLMoModel = OLMoFamily\n", ""),
# ---- _patch_smollm3 ----
# R48 make_attention (SmolLM3): the rotary taken off the rotary layers instead of the NoPE ones (test_more_families_...[smollm3])
("R48", R, "        if not self.no_rope_layers[layer_id]:", "        if self.no_rope_layers[layer_id]:"),
# R49 make_attention (SmolLM3): the rotary not restored after a NoPE layer (no test found: the tiny SmolLM3's one NoPE layer is its last)
("R49", R, "        finally:\n            self.attention_attrs[\"rope\"] = saved", "        finally:\n            pass"),
# ---- _patch_gemma_scale ----
# R50 _patch_gemma_scale: sqrt(hidden) rounded to two decimals again (test_gemma_s_embedding_scale_is_transformers_s [< 1e-4 at hidden 96])
("R50", R, "        self.embed_attrs[\"scale\"] = float(self.hidden_size) ** 0.5",
           "        self.embed_attrs[\"scale\"] = round(float(self.hidden_size) ** 0.5, 2)"),
# ---- patch() ----
# R51 patch: _patch_smollm3 not applied (test_more_families_...[smollm3])
("R51", R, "    _patch_smollm3()\n", ""),
# R52 patch: Gemma 4 not patched (test_gemma4_text_decoders_are_torch_s, test_gemma4_e2b_int4_decodes_exactly, test_mtp.py)
("R52", R, "    builder_gemma4.patch()\n", ""),
# R53 patch: the builder's folder not put on sys.path first (a fresh process: ImportError 'builders') (no test found: every test build forks from the zygote, which imported the builder already)
("R53", R, "    import onnxruntime_genai.models  # noqa: F401  (puts the builder's folder on sys.path)\n", ""),
# R54 patch (Gemma 3): guard inverted (Gemma 3 reads the nested rotary: KeyError 'rope_type') (test_gemma3_from_a_transformers_5_config, test_gemma_s_embedding_scale_...[gemma3-image-text])
("R54", R, "    if getattr(cls, \"_edgespec_flat_rope\", False):", "    if not getattr(cls, \"_edgespec_flat_rope\", False):"),
# R55 Gemma3 __init__: Gemma 4 flattened too (its builder reads the nested form: KeyError) (test_gemma4_text_decoders_are_torch_s, test_mtp.py)
("R55", R, "        if builder_gemma4.is_gemma4(config):", "        if False and builder_gemma4.is_gemma4(config):"),
# R56 Gemma3 __init__: an image-text checkpoint's text_config not flattened (test_gemma_s_embedding_scale_...[gemma3-image-text], test_rotary_tables_per_layer_kind_...)
("R56", R, "            flat_rope(config.text_config)\n", "            pass\n"),
# R57 make_rotary_embedding_multi_cache (Gemma 3): the local cache at the global theta (test_gemma3_from_a_transformers_5_config)
("R57", R, "        self.rope_attrs[\"theta\"] = self.rope_local_theta\n", ""),
# R58 make_rotary_embedding_multi_cache (Gemma 3): the local cache at the global scaling (test_gemma3_...[gemma3s], test_rotary_tables_per_layer_kind_..., test_gemma_s_embedding_scale_...[gemma3-image-text])
("R58", R, "        self.rope_attrs[\"rescale_factors\"] = _LOCAL[\"factor\"]\n", ""),
# ---- main ----
# R59 main: the builder run under another name (its __main__ block never runs: nothing built) (test_builder_zygote.py::test_builds_fork_from_one_zygote_..., every export)
("R59", R, "run_name=\"__main__\", alter_sys=True)", "run_name=\"builder\", alter_sys=True)"),
# R60 main: the builder run unpatched (test_gemma3_from_a_transformers_5_config, test_olmo2_and_3_..., test_gemma4_...)
("R60", R, "def main() -> None:\n    patch()\n", "def main() -> None:\n"),

# ==== export/builder_gemma4.py ====
# J1 is_gemma4: only the composite's model_type "gemma4" (text configs, "gemma4_text", flattened as Gemma 3) (test_gemma4_text_decoders_are_torch_s, test_gemma4_e2b_int4_decodes_exactly, test_mtp.py)
("J1", J, "    return str(getattr(_text(config), \"model_type\", \"\")).startswith(\"gemma4\")",
          "    return str(getattr(_text(config), \"model_type\", \"\")) == \"gemma4\""),
# J2 _text: the composite config taken for the text one (no layer_types / per-layer config) (test_gemma4_text_decoders_are_torch_s[e2b-image-text], test_mtp.py image-text)
("J2", J, "    return getattr(config, \"text_config\", None) or config", "    return config"),
# J3 Gemma4Text.__init__: per-layer attribute access allowed on the top config only (the image-text text_config refuses head_dim) (test_gemma4_text_decoders_are_torch_s[e2b-image-text])
("J3", J, "            for c in {id(config): config, id(text): text}.values():", "            for c in (config,):"),
# J4 Gemma4Text.__init__: the global geometry read from the first sliding layer (head 32 for 64) (test_gemma4_text_decoders_are_torch_s, test_gemma4_e2b_int4_decodes_exactly)
("J4", J, "            full = kinds.index(\"full_attention\") if \"full_attention\" in kinds else 0",
          "            full = kinds.index(\"sliding_attention\") if \"sliding_attention\" in kinds else 0"),
# J5 Gemma4Text.__init__: the global layers' KV heads the sliding layers' (dense: 2 for 1) (test_gemma4_text_decoders_are_torch_s[dense])
("J5", J, "            config.num_global_key_value_heads = int(per_layer[full].num_key_value_heads)",
          "            config.num_global_key_value_heads = int(text.num_key_value_heads)"),
# J6 Gemma4Text.__init__: the per-layer width read from the top config (image-text: 0, no per-layer block) (test_gemma4_text_decoders_are_torch_s[e2b-image-text], test_mtp.py image-text)
("J6", J, "            self._ple = int(getattr(text, \"hidden_size_per_layer_input\", 0) or 0)",
          "            self._ple = int(getattr(config, \"hidden_size_per_layer_input\", 0) or 0)"),
# J7 make_embedding: tables told apart by rows (both have the vocabulary's: the per-layer table rebuilt as the embedding after the layers) (test_gemma4_...[e2b], test_gemma4_e2b_int4_decodes_exactly)
("J7", J, "            if embedding.shape[-1] != self.hidden_size:", "            if embedding.shape[0] != self.vocab_size:"),
# J8 _shared: the "store" layers taken as shared too (producers compute no keys: "shares the keys of no earlier") (test_gemma4_...[e2b], test_gemma4_e2b_int4_decodes_exactly, test_mtp.py)
("J8", J, "            return self._kv_modes[layer_id] == \"reuse\"", "            return self._kv_modes[layer_id] in (\"reuse\", \"store\")"),
# J9 make_attention_qk_rope_and_norm: a producer's key and value rows stored swapped (test_gemma4_...[e2b] fp32, test_mtp.py)
("J9", J, "                self._kv_rows[kind] = (self.attention_attrs[\"k_path\"], self.attention_attrs[\"v_path\"])",
           "                self._kv_rows[kind] = (self.attention_attrs[\"v_path\"], self.attention_attrs[\"k_path\"])"),
# J10 make_attention_qk_rope_and_norm: a shared layer's query normed by its key norm's weight (test_gemma4_...[e2b] fp32 [random norms])
("J10", J, "            q = self._head_norm(layer_id, \"q_norm\", self.attention_attrs[\"q_path\"], attention.q_norm.weight,",
           "            q = self._head_norm(layer_id, \"q_norm\", self.attention_attrs[\"q_path\"], attention.k_norm.weight,"),
# J11 make_attention_qk_rope_and_norm: a shared layer's query not rotated (the rotary node left dangling) (test_gemma4_...[e2b], test_gemma4_e2b_int4_decodes_exactly)
("J11", J, "            self.attention_attrs[\"q_path\"] = f\"{name}/output_0\"\n            self.attention_attrs[\"k_path\"], self.attention_attrs[\"v_path\"] = self._kv_rows[kind]",
           "            self.attention_attrs[\"k_path\"], self.attention_attrs[\"v_path\"] = self._kv_rows[kind]"),
# J12 _head_norm: the query's width taken as the key's (KV heads for query heads) (test_gemma4_...[e2b])
("J12", J, "            width = heads * self.head_size", "            width = self.num_kv_heads * self.head_size"),
# J13 make_mlp: the double-wide MLP's width not swapped in (no test found, likely: only the Mul's value_info shape reads it,
#     onnxruntime warns and computes the same; fuse_mlp_gate_up, whose shape check would refuse it, edgespec never passes)
("J13", J, "            self.intermediate_size = int(mlp.gate_proj.out_features)\n", ""),
# J14 _per_layer_inputs: the per-layer table float16 at float32 too (no test found, likely: float16 rounding of ~0.02 values moves the logits ~1e-5, under the 1e-3 check)
("J14", J, "            tdt = dt if self.onnx_dtype == DataType.FLOAT else DataType.FLOAT16", "            tdt = DataType.FLOAT16"),
# J15 _per_layer_inputs: the Cast of float16 rows skipped where the activations are float32 (CPU INT4: a type error) (test_gemma4_e2b_int4_decodes_exactly, test_mtp.py int4)
("J15", J, "            if tdt != dt:\n", "            if tdt == dt:\n"),
# J16 _per_layer_inputs: the rows reshaped [width, layers] for [layers, width] (test_gemma4_...[e2b])
("J16", J, "f\"/model/constants/INT64/[0, 0, {n}, {p}]\"], dtype=dt, shape=None)",
           "f\"/model/constants/INT64/[0, 0, {p}, {n}]\"], dtype=dt, shape=None)"),
# J17 _per_layer_inputs: the sum not scaled by 1/sqrt(2) (test_gemma4_...[e2b], test_mtp.py)
("J17", J, "f\"/model/constants/{t}/{float(tm.per_layer_input_scale)}\"", "f\"/model/constants/{t}/{1.0}\""),
# J18 _per_layer_inputs: the projection added unnormed (test_gemma4_...[e2b] [random norms])
("J18", J, "            self.make_add(f\"{pre}/Add\", [normed, f\"{pre}/embed/Reshape/output_0\"]",
           "            self.make_add(f\"{pre}/Add\", [f\"{pre}/projection/Reshape/output_0\", f\"{pre}/embed/Reshape/output_0\"]"),
# J19 _per_layer_block: the skip term's Cast to the residual's dtype skipped (cuda layout: Add of float32 and float16) (test_gemma4_e2b_int4_decodes_exactly [cuda])
("J19", J, "            if sd != rd:", "            if sd == rd:"),
# J20 _per_layer_block: the block's output not normed (test_gemma4_...[e2b] [random norms])
("J20", J, "            out = self._norm(f\"{pre}/post_norm\", f\"{up}/output_0\", layer.post_per_layer_input_norm.weight, dt)",
           "            out = f\"{up}/output_0\""),
# J21 make_layer: the builder's Gemma 4 layer (layer_scalar before the per-layer block, then again) (test_gemma4_text_decoders_are_torch_s)
("J21", J, "            gemma.Gemma2Model.make_layer(self, layer_id, layer)", "            super().make_layer(layer_id, layer)"),
# J22 make_layer: layer scalars other than 1 skipped (test_gemma4_text_decoders_are_torch_s [random scalars])
("J22", J, "            if scalar == 1.0:\n                return", "            if scalar != 1.0:\n                return"),
# J23 Gemma4Family: the MoE test inverted (dense checkpoints to the builder's MoE class) (test_gemma4_..., test_mtp.py)
("J23", J, "            if not getattr(_text(config), \"enable_moe_block\", False):",
           "            if getattr(_text(config), \"enable_moe_block\", False):"),
# J24 Gemma4Family: enable_moe_block read from the top config (an image-text MoE built dense) (no test found: edgespec refuses Gemma 4 with experts before the build)
("J24", J, "            if not getattr(_text(config), \"enable_moe_block\", False):",
           "            if not getattr(config, \"enable_moe_block\", False):"),
# J25 read_config: Gemma4ForCausalLM not renamed (the builder: "not currently supported") (test_gemma4_...[dense], test_gemma4_e2b_int4_decodes_exactly, test_mtp.py)
("J25", J, "        if list(getattr(config, \"architectures\", None) or [\"\"])[:1] == [GEMMA4_CAUSAL]:",
           "        if list(getattr(config, \"architectures\", None) or [\"\"])[:1] == [GEMMA4_IMAGE_TEXT]:"),
]
