# export/bundle.py (B): an export's orchestration: what the manifest records of a graph (_describe and its helpers),
# the config checks and option refusals, the tokenizer's records (bos, eos, chat template), the sampling defaults.
# Run from the clone root: python docs/bench/mutation_harness/run.py docs/bench/mutation_harness/bundle.py TESTS...
#
# B1: _kv_dtype maps elem type 10 (float16) to "float32": a float16 KV cache recorded (and planned) as float32
# B2: _kv_layers reads a layer's kv heads from the cache input's dim 2 (the sequence, symbolic), not dim 1
# B3: _kv_layers reads layer i's shape from layer i+1's input (off by one; the last layer falls back to the config's)
# B4: _kv_layers records the per-layer shapes only where every layer differs from the config's (any -> all)
# B5: _kv_sources matches an attention node's past_value input (input 4) against the past_key names: no sharing found
# B6: _kv_sources records the sharing the wrong way round (sources[src] = i: the earlier layer reads the later's)
# B7: embedding_tables counts a table read by a Gather and anything else too (any -> all: a tied table counted)
# B8: embedding_tables' row bytes from dims[0] (the vocabulary) instead of dims[1] (the width)
# B9: embedding_tables skips float16 tables (the cuda layout's embedding recorded as 0 bytes)
# B10: measured_sizes measures the target's resident memory whatever the role (a drafter given the target's)
# B11: measured_sizes records the table's total bytes as its row bytes
# B12: _record takes any Gather (a float table) as a quantized embedding: quantize_embeddings recorded true
# B13: _record's symmetry fix inverted (not in FLOAT_ZERO_POINTS): every symmetric rtn/k_quant record made asymmetric
# B14: _describe keeps the quantization record for int4 only: an int8 target's record empty (Quantization())
# B15: _describe's num_kv_heads from num_attention_heads (a GQA model's cache recorded at the query's head count)
# B16: _describe's gpu_weight_bytes as float32 parameters (params * 4), not the files as stored
# B17: _describe passes _kv_layers the query heads, not the kv heads: every GQA layer recorded as differing
# B18: _describe swaps the present key and value output names in the manifest's io
# B19: _describe's operators leave out GatherBlockQuantized (a quantized table unrecorded)
# B20: _describe drops the convolution layers (conv_layers=()) while its io names their inputs
# B21: ATTENTION_LAYERS takes linear_attention (Qwen3.5's, a recurrence's) as attention: its refusal removed
# B22: _check_state_inputs refuses only two or more extra state inputs (len(other) > 1): one passes
# B23: ROTARY_TOLERANCE 2.0 instead of 0.02: a skipped rotary scaling (0.1 to 2) passes the check
# B24: _as_built always halves the table (GPT-OSS's once-listed frequencies halved: the check refuses a right graph)
# B25: _KIND_TABLES maps full_attention to the local tables and sliding_attention to the global ones
# B26: _check_int8_heads ignores the config's head_dim (hidden_size // heads only: Gemma's wider heads misjudged)
# B27: _check_config refuses a context under 16 only above 0 (a GGUF's context_length 0 passes to the build)
# B28: _check_assistant_early compares backbone_hidden_size with the assistant's own width, not the target's
# B29: _check_assistant_early refuses only an assistant vocabulary larger than the target's (a smaller one passes)
# B30: _check_combination's --symmetric/--asymmetric check reads bool(symmetric): --asymmetric for fp32/fp16 taken
# B31: _check_combination's set_ ignores `given` (an option given at its default value for fp32 taken)
# B32: _check_combination: --block-size for an fp16 target taken
# B33: _check_float_zero_points accepts int8 (hqq/q4_k/gguf blocks are int4 only)
# B34: _export_bundle checks the drafter's float-zero-point options against the target's source (a .gguf target)
# B35: device_memory_line's weights in KiB (1 << 10) labelled MiB
# B36: _add_bos: `or` for `and`: add_bos true for any tokenizer with a bos id (bos flag set where it should not be)
# B37: END_OF_GENERATION without <|im_end|>: a Qwen GGUF's end-of-turn not an EOS id
# B38: _chat_template: named templates without a default take the first (the refusal removed)
# B39: gguf_metadata rounds float64 (type 12) to float32's text, not float32 (type 6): 0.6 read as 0.6000000238
# B40: _GGUF_SAMPLING maps penalty_repeat to presence_penalty (the wrong key: left out)
# B41: _sampling_defaults reads generation_config's options unless do_sample is false (a greedy model's recorded)
# B42: _sampling_defaults puts the default temperature 1.0 over the file's own
# B43: _eos_ids keeps only the first of generation_config's EOS ids (an eos id dropped)
# B44: _tokenizer_diff counts only tokens missing from the other vocabulary, not those with other ids
# B45: _export_one takes --max-context past the model's own context (no min)
# B46: _export_one's tied-embedding symmetry applied to int8 too (int8 has no shared 4-bit table)
# B47: _export_one sets the assistant's hidden output to None (the field dropped)
# B48: _export_one drops FP8's quantization record (precision set instead of quant)
# B49: _export_one refuses a failed validation only for fp32 (a quantized graph that does not match torch written)
# B50: the manifest's add_bos inverted
# B51: tokenizer_special_past counted against the tokenizer's vocabulary, not the target's (always 0)
# B52: a drafter's tokenizer that differs is refused only where its vocabulary size differs too
# B53: --exact-kernels taken at an accuracy level other than 4
# B54: --drafter-vocab's head ids ranked up to the tokenizer's vocabulary, not the config's (ids past the model's)
B = "export/bundle.py"
MUTANTS = [
# _kv_dtype, _kv_layers, _kv_sources
("B1", B, '{1: "float32", 10: "float16", 16: "bfloat16", 3: "int8"}',
          '{1: "float32", 10: "float32", 16: "bfloat16", 3: "int8"}'),
("B2", B, "out.append((d[1] or heads, d[3] or width)", "out.append((d[2] or heads, d[3] or width)"),
("B3", B, "        d = dims.get(names % layer) or []", "        d = dims.get(names % (layer + 1)) or []"),
("B4", B, "    return tuple(out) if any(x != (heads, width) for x in out) else ()",
          "    return tuple(out) if all(x != (heads, width) for x in out) else ()"),
("B5", B, "or n.input[3] not in layer_of:", "or n.input[4] not in layer_of:"),
("B6", B, "        if src < i:\n            sources[i] = src", "        if src < i:\n            sources[src] = i"),
# embedding_tables, measured_sizes
("B7", B, 'any(use != ("Gather", 0) for use in u)', 'all(use != ("Gather", 0) for use in u)'),
("B8", B, "        row += int(t.dims[1]) * item", "        row += int(t.dims[0]) * item"),
("B9", B, "if t.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):",
          "if t.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.BFLOAT16):"),
("B10", B, "load_footprint(root, role, entry)", 'load_footprint(root, "target", entry)'),
("B11", B, '"embedding_row_bytes": row}', '"embedding_row_bytes": emb}'),
# _record
("B12", B, 'if ops.get("GatherBlockQuantized") and not q.quantize_embeddings:',
           'if ops.get("Gather") and not q.quantize_embeddings:'),
("B13", B, "if q.algorithm in FLOAT_ZERO_POINTS and q.symmetric:", "if q.algorithm not in FLOAT_ZERO_POINTS and q.symmetric:"),
# _describe
("B14", B, 'if quant and precision in ("int4", "int8") else Quantization(),',
           'if quant and precision == "int4" else Quantization(),'),
("B15", B, '        num_kv_heads=int(dec["num_key_value_heads"]),', '        num_kv_heads=int(dec["num_attention_heads"]),'),
("B16", B, "        gpu_weight_bytes=on_disk,", "        gpu_weight_bytes=params * 4,"),
("B17", B, '                             int(dec["num_key_value_heads"]), int(dec["head_size"])),',
           '                             int(dec["num_attention_heads"]), int(dec["head_size"])),'),
("B18", B, 'present_key=outs["present_key_names"], present_value=outs["present_value_names"]',
           'present_key=outs["present_value_names"], present_value=outs["present_key_names"]'),
("B19", B, '"MatMulNBits", "GroupQueryAttention", "MatMul", "DequantizeLinear", "GatherBlockQuantized", "Gather")}',
           '"MatMulNBits", "GroupQueryAttention", "MatMul", "DequantizeLinear", "Gather")}'),
("B20", B, "        conv_layers=tuple(conv_layers),", "        conv_layers=(),"),
# _check_attention_only, _check_state_inputs
("B21", B, 'ATTENTION_LAYERS = frozenset({"full_attention", "sliding_attention", "chunked_attention", "attention"})',
           'ATTENTION_LAYERS = frozenset({"full_attention", "sliding_attention", "chunked_attention", "attention",\n'
           '                              "linear_attention"})'),
("B22", B, '    if other:\n        names = ", ".join(', '    if len(other) > 1:\n        names = ", ".join('),
# rotary
("B23", B, "ROTARY_TOLERANCE = 0.02", "ROTARY_TOLERANCE = 2.0"),
("B24", B, "    if cos.shape[-1] % 2 == 0 and abs(cos[:, :half] - cos[:, half:]).max() < 1e-6:",
           "    if cos.shape[-1] % 2 == 0:"),
("B25", B, '_KIND_TABLES = {"full_attention": ("cos_cache_global", "sin_cache_global"),\n'
           '                "sliding_attention": ("cos_cache_local", "sin_cache_local")}',
           '_KIND_TABLES = {"full_attention": ("cos_cache_local", "sin_cache_local"),\n'
           '                "sliding_attention": ("cos_cache_global", "sin_cache_global")}'),
# _check_int8_heads, _check_config
("B26", B, '    head = getattr(cfg, "head_dim", None) or (cfg.hidden_size // heads if heads else None)',
           "    head = cfg.hidden_size // heads if heads else None"),
("B27", B, "if isinstance(declared, int) and declared < 16:", "if isinstance(declared, int) and 0 < declared < 16:"),
# _check_assistant_early
("B28", B, "if int(acfg.backbone_hidden_size) != int(tcfg.hidden_size):",
           "if int(acfg.backbone_hidden_size) != int(acfg.text_config.hidden_size):"),
("B29", B, "if int(acfg.text_config.vocab_size) != int(tcfg.vocab_size):",
           "if int(acfg.text_config.vocab_size) > int(tcfg.vocab_size):"),
# _check_combination
("B30", B, "(symmetry, quant.symmetric is not None)", "(symmetry, bool(quant.symmetric))"),
("B31", B, "        return field in given or getattr(quant, field) != getattr(default, field)",
           "        return getattr(quant, field) != getattr(default, field)"),
("B32", B, 'if precision not in ("int4", "int8", "fp8") and set_("block_size"):',
           'if precision not in ("int4", "int8", "fp8", "fp16") and set_("block_size"):'),
# _check_float_zero_points
("B33", B, 'else "it is int4 only" if precision != "int4"', 'else "it is int4 only" if precision not in ("int4", "int8")'),
("B34", B, "_check_float_zero_points(drafter_quant, dsrc, drafter_precision",
           "_check_float_zero_points(drafter_quant, tsrc, drafter_precision"),
# device_memory_line
("B35", B, "{spec.gpu_weight_bytes / (1 << 20):.1f} MiB of weights", "{spec.gpu_weight_bytes / (1 << 10):.1f} MiB of weights"),
# _add_bos, END_OF_GENERATION, _chat_template
("B36", B, 'return bool(getattr(tok, "add_bos_token", False)) and tok.bos_token_id is not None',
           'return bool(getattr(tok, "add_bos_token", False)) or tok.bos_token_id is not None'),
("B37", B, '"<|eot_id|>", "<|im_end|>", "<|end|>"', '"<|eot_id|>", "<|end|>"'),
("B38", B, '        if isinstance(t.get("default"), str):\n            return t["default"]',
           '        if t:\n            return t.get("default") or next(iter(t.values()))'),
# gguf_metadata, _sampling_defaults
("B39", B, "                if kind == 6:", "                if kind == 12:"),
("B40", B, '"general.sampling.penalty_repeat": "repetition_penalty"}', '"general.sampling.penalty_repeat": "presence_penalty"}'),
("B41", B, 'if d.get("do_sample") is True:', 'if d.get("do_sample") is not False:'),
("B42", B, 'raw = {"temperature": 1.0, **{k: d[k] for k in SAMPLING_KEYS if d.get(k) is not None}}',
           'raw = {**{k: d[k] for k in SAMPLING_KEYS if d.get(k) is not None}, "temperature": 1.0}'),
# _eos_ids, _tokenizer_diff
("B43", B, "ids.update([e] if isinstance(e, int) else list(e or []))",
           "ids.update([e] if isinstance(e, int) else list(e or [])[:1])"),
("B44", B, "diff = [t for t in va if vb.get(t) != va[t]]", "diff = [t for t in va if t not in vb]"),
# _export_one
("B45", B, "    ctx = min(max_context, model_ctx) if max_context else model_ctx", "    ctx = max_context or model_ctx"),
("B46", B, '    if (precision == "int4" and not quant.is_symmetric',
           '    if (precision in ("int4", "int8") and not quant.is_symmetric'),
("B47", B, "        spec = replace(spec, io=replace(spec.io, hidden=hidden))",
           "        spec = replace(spec, io=replace(spec.io, hidden=None))"),
("B48", B, "        spec = replace(spec, quant=fp8)", '        spec = replace(spec, precision="fp8")'),
("B49", B, "    if not spec.validation.passed:", '    if not spec.validation.passed and precision == "fp32":'),
# _export_bundle
("B50", B, "            add_bos=_add_bos(ttok),", "            add_bos=not _add_bos(ttok),"),
("B51", B, 'special_ids_past(ttok.backend_tokenizer, models["target"].vocab_size)',
           "special_ids_past(ttok.backend_tokenizer, tvocab)"),
("B52", B, "            if dfp != tfp:", "            if dfp != tfp and dvocab != tvocab:"),
("B53", B, 'if target_precision != "int4" or device != "cpu" or acc != 4:',
           'if target_precision != "int4" or device != "cpu":'),
("B54", B, "vocab_size=min(tvocab, _config_vocab(tsrc) or tvocab),", "vocab_size=tvocab,"),
]
