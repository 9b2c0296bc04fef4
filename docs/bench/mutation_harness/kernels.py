# session 88: export/kernels.py (K), written by a helper session
# export/kernels.py (K): the exact-kernels rewrite: pack_q4's tiled layout and Q4_K's scale bytes (kquant_scales),
# which MatMulNBits nodes are taken (_q4_attrs) and fused (swiglu_patterns, bias_patterns), edgespec's attention
# (_own_attention, _half_caches, _why_not_half/_q8, kernel_features), the graph surgery shared with the export
# (_fold_rotary, _nope_rotary, _pack_qkv, the logits skip, the hidden output, windows, settle_graph's trims, LongRoPE's
# per-position tables), rewrite_graph's packing, padding and kv-dtype choice, and _rewrite_bundle's refusals and checks.
# Run from the clone root: python docs/bench/mutation_harness/run.py docs/bench/mutation_harness/kernels.py TESTS...
# Likely tests: test_native.py (pack_q4, rewrite_graph, apply_to_bundle), test_weights.py (pack_q4 against
# check_rewrite), test_gguf_blocks.py / test_hqq.py / test_qwen.py (float zero points, Q4_K scale bytes),
# test_kv_q8.py (int8 caches), test_archs.py (rotary folding, windows, LongRoPE, features), test_export.py (settle_graph,
# rotary trims, logits skip), test_mtp.py (hidden output, assistant caches), test_draft_vocab.py / test_errors.py
# (apply_to_bundle's refusals), test_min_deps.py (trim_empty_inputs).
K = "export/kernels.py"
MUTANTS = [
# ---- pack_q4 ----
# K1 pack_q4: nibble order of B swapped (high nibble read as the even element) (test_native.py, test_weights.py)
("K1", K, "    el[..., 0::2] = q & 15\n    el[..., 1::2] = q >> 4",
          "    el[..., 0::2] = q >> 4\n    el[..., 1::2] = q & 15"),
# K2 pack_q4: tile transposition puts columns before groups (wrong layout, same shape) (test_native.py, test_weights.py)
("K2", K, "packed.transpose(0, 2, 3, 1, 4)", "packed.transpose(0, 2, 1, 3, 4)"),
# K3 pack_q4: tiles rounded down (N not a multiple of 16: last tile lost / negative pad) (test_native.py)
("K3", K, "    tiles = -(-N // TILE)", "    tiles = N // TILE"),
# K4 pack_q4: scales reshaped without the [tile, block, column] transpose (test_native.py, test_weights.py)
("K4", K, "    s = np.ascontiguousarray(s.reshape(tiles, TILE, nb).transpose(0, 2, 1))",
          "    s = np.ascontiguousarray(s.reshape(tiles, nb, TILE))"),
# K5 pack_q4: float zero points taken as minimums without the scale (minimum = zp, not zp * scale) (test_hqq.py, test_qwen.py, test_native.py)
("K5", K, "        mn = (np.asarray(zero_points, dtype=np.float32).reshape(N, nb) * np.asarray(scales, np.float32).reshape(N, nb))",
          "        mn = np.asarray(zero_points, dtype=np.float32).reshape(N, nb)"),
# K6 pack_q4: float minimums with the wrong sign (scale * w + minimum) (test_hqq.py, test_weights.py, test_native.py)
("K6", K, "        return [packed, s, None, mn]  #", "        return [packed, s, None, -mn]  #"),
# K7 pack_q4: packed uint8 zero points' nibble order swapped (test_native.py, test_weights.py)
("K7", K, "        zz[:, 0::2] = zr & 15\n        zz[:, 1::2] = zr >> 4",
           "        zz[:, 0::2] = zr >> 4\n        zz[:, 1::2] = zr & 15"),
# ---- kquant_scales ----
# K8 kquant_scales: scales need only be close, not exact, to d * sc (HQQ's taken as Q4_K's) (test_hqq.py, test_gguf_blocks.py)
("K8", K, "if exact and not np.array_equal(back, v):", "if exact and not np.allclose(back, v):"),
# K9 kquant_scales: the minimums' tolerance check never applied (test_hqq.py, test_gguf_blocks.py)
("K9", K, "if not exact and (np.abs(back - v) >", "if exact and (np.abs(back - v) >"),
# K10 kquant_scales: per-block scale byte and minimum byte swapped (test_native.py, test_gguf_blocks.py, test_qwen.py)
("K10", K, "np.stack([sc.reshape(N, nb), m.reshape(N, nb)], axis=-1)", "np.stack([m.reshape(N, nb), sc.reshape(N, nb)], axis=-1)"),
# ---- _float_zero_points, _q4_attrs ----
# K11 _float_zero_points: reads the scales input (every MatMulNBits "has float zero points") (test_native.py, test_hqq.py, test_qwen.py)
("K11", K, '    zp = node.input[3] if len(node.input) > 3 else ""', '    zp = node.input[2] if len(node.input) > 2 else ""'),
# K12 _q4_attrs: 8-bit MatMulNBits packed as 4-bit (test_native.py, test_export.py: int8-head bundles)
("K12", K, 'if (attrs.get("bits", 4) != 4 or', 'if (attrs.get("bits", 4) not in (4, 8) or'),
# K13 _q4_attrs: a g_idx input (index 4) taken and dropped (act-order weights packed in plain order) (test_weights.py, test_native.py)
("K13", K, "or len(inputs) > 4 or len(inputs) < 3", "or len(inputs) > 5 or len(inputs) < 3"),
# ---- input_uses, _consumers ----
# K14 input_uses: every value read once (tied weights shared with a GatherBlockQuantized dropped) (test_native.py, test_archs.py)
("K14", K, "            uses[i] = uses.get(i, 0) + 1\n    return uses", "            uses[i] = 1\n    return uses"),
# K15 _consumers: graph outputs not counted as readers (float16 caches refused; a gate that is also an output fused) (test_native.py, test_kv_q8.py)
("K15", K, "    for o in g.output:  # a graph output counts as one more reader\n        out.setdefault(o.name, []).append(None)",
           "    pass"),
# ---- swiglu_patterns ----
# K16 swiglu_patterns: gate and up of different inputs fused (test_native.py test_rewrite_fuses_a_bias_bitwise...)
("K16", K, "if (ua is None or up.input[0] != gate.input[0] or readers.get(other[0]) != [m2]",
           "if (ua is None or readers.get(other[0]) != [m2]"),
# K17 swiglu_patterns: an up projection whose output another node reads fused away (test_native.py ...leaves_a_shared_one_alone)
("K17", K, "if (ua is None or up.input[0] != gate.input[0] or readers.get(other[0]) != [m2]",
           "if (ua is None or up.input[0] != gate.input[0]"),
# ---- bias_patterns ----
# K18 bias_patterns: a matmul output another node reads loses its un-biased value (test_native.py)
("K18", K, "readers.get(add.input[mine]) != [add] or ", ""),
# ---- _check_kv_dtype ----
# K19 _check_kv_dtype: int8 caches taken with onnxruntime's attention (test_kv_q8.py, test_draft_vocab.py)
("K19", K, 'if kv_dtype in ("float16", "int8") and not own_attention:', 'if kv_dtype == "float16" and not own_attention:'),
# ---- _why_not_half, _why_not_q8 ----
# K20 _why_not_half: onnxruntime attention left in the graph does not stop float16 caches (test_native.py ...cannot_be_float16...)
("K20", K, "    if gqa or not attention:\n        return (", "    if not attention:\n        return ("),
# K21 _why_not_half: a past cache another node reads made float16 (test_native.py ...cannot_be_float16...)
("K21", K, "if (any(p not in ins or len(readers.get(p, [])) != 1 for p in past)", "if (any(p not in ins for p in past)"),
# K22 _why_not_q8: head sizes not a multiple of 32 made int8 (test_kv_q8.py test_int8_caches_are_refused...)
("K22", K, "        if not w or w % Q8_GROUP:", "        if not w:"),
# ---- _half_caches ----
# K23 _half_caches: int8 caches' rows keep width D, not D + D/8 (test_kv_q8.py)
("K23", K, '                dims[3].dim_value = kv_row_width("int8", dims[3].dim_value)', "                pass"),
# K24 _half_caches: int8 caches' nodes become DecodeAttentionF16 (test_kv_q8.py)
("K24", K, "        n.op_type = ATTENTION_OP_Q8 if q8 else ATTENTION_OP_F16", "        n.op_type = ATTENTION_OP_F16"),
# ---- _own_attention ----
# K25 _own_attention: past key and past value swapped (test_native.py, test_archs.py)
("K25", K, "n.input.extend([ins[0], ins[3], ins[4], ins[5], ins[7], ins[8]])", "n.input.extend([ins[0], ins[4], ins[3], ins[5], ins[7], ins[8]])"),
# K26 _own_attention: kv_num_heads from num_heads (GQA models' key heads miscounted) (test_native.py, test_archs.py)
("K26", K, 'helper.make_attribute("kv_num_heads", int(a["kv_num_heads"]))', 'helper.make_attribute("kv_num_heads", int(a["num_heads"]))'),
# K27 _own_attention: the sliding window dropped (Gemma 2/3 local layers attend everything) (test_archs.py, test_native.py)
("K27", K, '    if int(a.get("local_window_size", -1)) > 0:\n        n.attribute.append(', "    if False:\n        n.attribute.append("),
# K28 _own_attention: the softcap dropped (test_archs.py, test_native.py)
("K28", K, '    if float(a.get("softcap", 0.0)) > 0:\n        n.attribute.append(', "    if False:\n        n.attribute.append("),
# K29 _own_attention: a rotary table wider than the head taken (test_archs.py gemma4, test_native.py)
("K29", K, "or (head_dim is not None and (head_dim % 8 or 2 * inits[ins[7]].dims[1] > head_dim))):",
           "or (head_dim is not None and head_dim % 8)):"),
# ---- kernel_features ----
# K30 kernel_features: a whole-head rotary recorded as partial (test_archs.py, test_manifest.py)
("K30", K, "2 * cos.dims[-1] < head:", "2 * cos.dims[-1] <= head:"),
# K31 kernel_features: an int8 cache's row width (D + D/8) taken as its head size (test_kv_q8.py)
("K31", K, '            head = kv_row_head("int8", head)', "            pass"),
# K32 kernel_features: DecodeAttentionF16/Q8 nodes skipped (features of float16-cache bundles lost) (test_archs.py, test_kv_q8.py, test_native.py)
("K32", K, "if n.domain != DOMAIN or n.op_type not in ATTENTION_OPS:", "if n.domain != DOMAIN or n.op_type != ATTENTION_OP:"),
# ---- _fold_rotary, _nope_rotary, _pack_qkv, _row_positions ----
# K33 _fold_rotary: a table narrower than the head folded (test_archs.py test_rotary_nodes_fold...only_where_the_table_covers)
("K33", K, "2 * cos.dims[-1] != widths.get(ins[3], head_dim or -1):", "2 * cos.dims[-1] > widths.get(ins[3], head_dim or -1):"),
# K34 _fold_rotary: cos and sin swapped when folded (test_archs.py gemma4)
("K34", K, "rq.input[0], rk.input[0], rq.input[2], rq.input[3]", "rq.input[0], rk.input[0], rq.input[3], rq.input[2]"),
# K35 _nope_rotary: the identity rotary's cos 0, not 1 (NoPE layers' queries and keys zeroed) (test_archs.py exaone4, smollm3)
("K35", K, "[rows, 8], [1.0] * (8 * rows))", "[rows, 8], [0.0] * (8 * rows))"),
# K36 _pack_qkv: key and value swapped in the packed Concat (test_archs.py qwen3/olmo2)
("K36", K, "[n.input[0], n.input[1], n.input[2]], [qkv], axis=-1", "[n.input[0], n.input[2], n.input[1]], [qkv], axis=-1"),
# K37 _row_positions: no attention node takes the positions (alternates unverifiable) (test_native.py, test_archs.py)
("K37", K, "n.op_type in ATTENTION_OPS and len(n.input) == 6]", "n.op_type in ATTENTION_OPS and len(n.input) == 7]"),
# ---- _lm_head, _skip_logits, strip/add_logits_skip, add_hidden_output ----
# K38 _lm_head: a logit cap's Tanh/Div/Mul not walked through (Gemma's prefills compute every row) (test_archs.py)
("K38", K, 'while node is not None and node.op_type in ("Cast", "Identity", "Tanh", "Div", "Mul"):',
           'while node is not None and node.op_type in ("Cast", "Identity"):'),
# K39 _skip_logits: the slice cuts axis 0 (the batch), not the positions (test_native.py, test_qwen.py, test_export.py)
("K39", K, "helper.make_tensor(SKIP_AXIS, TensorProto.INT64, [1], [1])", "helper.make_tensor(SKIP_AXIS, TensorProto.INT64, [1], [0])"),
# K40 _skip_logits: a graph that has the input gets a second one (exact-kernels of a bundle exported with it) (test_native.py)
("K40", K, "    if any(i.name == SKIP_INPUT for i in g.input):\n        return False", "    if False:\n        return False"),
# K41 _skip_logits: the lm_head keeps reading every row (the Slice computed but unused) (test_native.py a_prefill_computes_only..., test_qwen.py)
("K41", K, "    node.input[0] = kept\n    order = []", "    order = []"),
# K42 strip_logits_skip: readers of the cut rows not pointed back at the hidden states (test_export.py genai baseline)
("K42", K, "            if name == kept:\n                n.input[i] = hidden", "            if name == kept:\n                pass"),
# K43 add_logits_skip: only edgespec's op taken as lm_head (builder graphs get no skip) (test_qwen.py, test_export.py)
("K43", K, "if not _skip_logits(m.graph, logits, LM_HEAD_OPS):", "if not _skip_logits(m.graph, logits):"),
# K44 add_hidden_output: the output is the logits, not the lm_head's input (test_mtp.py)
("K44", K, 'g.node.append(helper.make_node("Cast", [node.input[0]], [HIDDEN_OUTPUT]', 'g.node.append(helper.make_node("Cast", [node.output[0]], [HIDDEN_OUTPUT]'),
# ---- apply_window, _whole_caches, settle_graph, trims ----
# K45 apply_window: the window one token short (test_archs.py test_a_window_the_builder_leaves_out...)
("K45", K, 'n.attribute.append(helper.make_attribute("local_window_size", int(window)))', 'n.attribute.append(helper.make_attribute("local_window_size", int(window) - 1))'),
# K46 _whole_caches: windows shorter than the context taken off, the longer ones kept (test_archs.py gemma2 window tests)
("K46", K, "helper.get_attribute_value(w) >= capacity:", "helper.get_attribute_value(w) < capacity:"),
# K47 _whole_caches: sliding_window_cache left on the node (test_archs.py test_a_kept_window_runs_over_caches_of_any_length)
("K47", K, '            n.attribute.remove(attrs["sliding_window_cache"])\n', "            pass\n"),
# K48 settle_graph: rotary tables cut 64 rows short of the context (test_export.py test_rotary_tables_are_cut...)
("K48", K, "trim_rotary_tables(m.graph, capacity + ROTARY_SPARE_ROWS)", "trim_rotary_tables(m.graph, capacity - ROTARY_SPARE_ROWS)"),
# K49 settle_graph: a graph changed only by the trims not saved (test_export.py, test_min_deps.py)
("K49", K, "    if layouts or unbound or rope or trimmed:", "    if layouts or unbound or rope:"),
# K50 trim_rotary_tables: an external table's length set in rows, not bytes (test_export.py test_rotary_tables_are_cut...)
("K50", K, '                ext["length"].value = str(rows * row)', '                ext["length"].value = str(rows)'),
# K51 trim_empty_inputs: only one trailing empty input dropped (GQA's three left two) (test_min_deps.py, test_export.py)
("K51", K, '        while n and node.input[n - 1] == "":', '        if n and node.input[n - 1] == "":'),
# ---- _per_position_rope ----
# K52 _per_position_rope: short and long tables taken the wrong way round (refused, or long rows first) (test_archs.py longrope)
("K52", K, "if a[0].shape[0] < b[0].shape[0] else (b, a)", "if a[0].shape[0] > b[0].shape[0] else (b, a)"),
# K53 _per_position_rope: the long factors' rows below the original context too (test_archs.py test_longrope_exports_and_decodes_exactly...)
("K53", K, "np.concatenate([x, y[s:]])", "np.concatenate([y[:s], y[s:]])"),
# K54 _per_position_rope: a branch that is not constants not refused (TypeError, not ExportError) (test_archs.py test_a_rotary_choice_that_is_not_two_tables_is_refused)
("K54", K, "if len(branches) != 2 or any(b is None or len(b) != len(n.output) for b in branches.values()):",
           "if len(branches) != 2:"),
# ---- rewrite_graph ----
# K55 rewrite_graph: minimums and k-quant scales put in the bias and minimum slots (4, 5) (test_hqq.py, test_qwen.py, test_native.py)
("K55", K, "for slot, name in zip((1, 2, 3, 5, 6), packed):", "for slot, name in zip((1, 2, 3, 4, 5), packed):"),
# K56 rewrite_graph: SwiGLU tiles interleaved up, gate (silu of the up projection) (test_native.py ...fuses_swiglu...)
("K56", K, "np.stack([a, b], axis=1)", "np.stack([b, a], axis=1)"),
# K57 rewrite_graph: the fused node lacks swiglu=1 (gate and up interleaved output, no activation) (test_native.py)
("K57", K, '            extra = [helper.make_attribute("swiglu", 1)]', "            extra = []"),
# K58 rewrite_graph: the fused bias dropped (its Add removed, the kernel given none) (test_native.py, test_archs.py qwen biases)
("K58", K, "            new_inputs[4] = b\n", '            new_inputs[4] = ""\n'),
# K59 rewrite_graph: int8 asked where the graph cannot hold it silently keeps float32 (test_kv_q8.py test_int8_caches_are_refused...)
("K59", K, '        elif kv_dtype in ("float16", "int8"):\n            raise ExportError(', '        elif kv_dtype == "float16":\n            raise ExportError('),
# K60 rewrite_graph: _why_not_q8 never asked (int8 caches over heads not a multiple of 32) (test_kv_q8.py)
("K60", K, 'why_not = why_not_half or (_why_not_q8(g, ours, head_dim) if kv_dtype == "int8" else None)', "why_not = why_not_half"),
# K61 rewrite_graph: the padded query row put first, not last (test_native.py ...onnxruntime_attention_pads_it..., test_archs.py)
("K61", K, 'helper.make_node("Concat", [q, tail], [qp], axis=1)', 'helper.make_node("Concat", [tail, q], [qp], axis=1)'),
# K62 rewrite_graph: the padded row's output kept (Slice to the end, not to -1) (test_native.py)
("K62", K, 'helper.make_node("Slice", [wide, zero.name, last.name, axis.name], [out])', 'helper.make_node("Slice", [wide, zero.name, end.name, axis.name], [out])'),
# ---- compare_with_source ----
# K63 compare_with_source: the probe runs on the source, not the rewrite (the one-token check never fires) (test_native.py ...one_token_calls_compute_otherwise)
("K63", K, "min_width=None if spec is rewritten else 1)", "min_width=None if spec is source else 1)"),
# K64 compare_with_source: top-1 agreement as any position's (max), not the share (mean) (test_native.py ...disagrees_with_its_source)
("K64", K, '"top1_agreement": float((a.argmax(-1) == b.argmax(-1)).mean())', '"top1_agreement": float((a.argmax(-1) == b.argmax(-1)).max())'),
# ---- _rewrite_bundle ----
# K65 _rewrite_bundle: default KV dtype float32 with edgespec's attention (no float16 caches by default) (test_native.py, test_kv_q8.py)
("K65", K, '        kv_dtype = "auto" if own_attention else "float32"', '        kv_dtype = "float32"'),
# K66 _rewrite_bundle: a bundle already of edgespec's kernels rewritten again (test_native.py test_exact_kernels_refuses_what_it_cannot_rewrite)
("K66", K, '    if manifest.target.kernels == "edgespec-q4":\n        raise', "    if False:\n        raise"),
# K67 _rewrite_bundle: accuracy levels below 4 taken (test_native.py test_exact_kernels_refuses_another_accuracy_level_or_layout)
("K67", K, "    if acc is not None and acc != 4:", "    if acc is not None and acc > 4:"),
# K68 _rewrite_bundle: int8 caches taken with an MTP assistant (test_kv_q8.py, test_mtp.py)
("K68", K, '    if kv_dtype == "int8" and manifest.assistant is not None:\n        raise', "    if False:\n        raise"),
# K69 _rewrite_bundle: a cuda-layout drafter rewritten (test_native.py test_exact_kernels_leaves_a_cuda_layout_drafter_as_it_is)
("K69", K, 'if role == "drafter" and spec.layout != "cpu":', "if False:"),
# K70 _rewrite_bundle: a drafter whose heads cannot be int8 asked for int8 (refused, so left unrewritten) (test_kv_q8.py test_a_drafter_whose_heads_cannot_be_int8...)
("K70", K, 'if dtype == "int8" and role == "drafter" and not spec.heads_take_int8:', "if False:"),
# K71 _rewrite_bundle: the target's rewrite failure swallowed (target left as it is) (test_native.py, test_kv_q8.py)
("K71", K, '                if role == "target":\n                    raise', "                if False:\n                    raise"),
# K72 _rewrite_bundle: the drafter, not the target, takes the rows' positions (test_native.py alternates, test_archs.py)
("K72", K, 'row_positions=role == "target",', 'row_positions=role == "drafter",'),
# K73 _rewrite_bundle: MatMulNBits kept beside the kernel not recorded in operators (width-invariance wrongly claimed) (test_native.py)
("K73", K, '            if counts["kept"]:\n                ops["MatMulNBits"] = counts["kept"]', '            if False:\n                ops["MatMulNBits"] = counts["kept"]'),
# K74 _rewrite_bundle: genai_config.json left beside a graph genai cannot run (test_archs.py, test_draft_vocab.py)
("K74", K, "            if gcfg.exists():  # onnxruntime-genai cannot run edgespec's operator\n                gcfg.unlink()",
           "            if gcfg.exists():  # onnxruntime-genai cannot run edgespec's operator\n                pass"),
# K75 _rewrite_bundle: int8 caches recorded as float16 in the manifest (test_kv_q8.py)
("K75", K, 'kv_dtype="int8" if counts["q8_caches"] else "float16" if counts["half_caches"]',
            'kv_dtype="float16" if counts["q8_caches"] or counts["half_caches"]'),
# K76 _rewrite_bundle: the manifest does not say edgespec-q4 (the runtime loads MatMulQ4 without the library) (test_native.py, test_manifest.py)
("K76", K, 'kernels="edgespec-q4",', "kernels=spec.kernels,"),
# K77 _rewrite_bundle: tiles that differ from the source's blocks written (test_native.py ...layers_hold_each_others_weights)
("K77", K, "            if not weights.passed:\n", "            if False:\n"),
# K78 _rewrite_bundle: the top-1 agreement bound dropped (only non-finite logits refused) (test_native.py ...disagrees_with_its_source)
("K78", K, 'if check["top1_agreement"] < 0.75 or not np.isfinite(', "if not np.isfinite("),
# K79 _rewrite_bundle: the one-token width check applied to the drafter, not the target (test_native.py ...one_token_calls_compute_otherwise)
("K79", K, 'if (mw, mult) != (1, 1) and role == "target" and width_invariant_spec(spec):',
            'if (mw, mult) != (1, 1) and role == "drafter" and width_invariant_spec(spec):'),
# K80 _rewrite_bundle: the assistant retyped to the target's old KV dtype (test_mtp.py test_mtp_decodes_exactly_on_quantized_bundles)
("K80", K, "retype_kv(m.assistant.path, m.target.kv_dtype)", "retype_kv(m.assistant.path, manifest.target.kv_dtype)"),
]
