# session 88: export/source.py (S), written by a helper session
# export/source.py (S): a model source's resolution (resolve, the hub's checks and errors), the GGUF file's kept
# Hugging Face copy (gguf_cache_entry, gguf_cached, _copy_mismatch, keep_gguf_copy, _remove_stale_copies,
# drop_gguf_copy, _unreadable_copy), the manifest's source_files, one GGUF reader a scope (gguf_reads_once,
# _plain_reader), the tokenizer's read and vocabulary checks, the GGUF config's mends (_gguf_config, _family_mends),
# Llama 3's rotary divisors (llama3_factors, llama3_rope) and load_model.
# Run from the copy's root (see README.md: the edgespec_export and .venv links):
#   python /work/main/docs/bench/mutation_harness/run.py /work/main/docs/bench/mutation_harness/source.py TESTS...
# Most mutants are exercised by tests/test_export.py and tests/test_archs.py (the GGUF config's); the cache's by
# test_export.py's EDGESPEC_GGUF_CACHE tests (and test_runtime.py's real SmolLM2 one, marked real).
S = "export/source.py"
MUTANTS = [
# --- Source.from_pretrained_args, hub_offline -------------------------------------------------------------------
# S1 from_pretrained_args: a kept copy never read (the GGUF file re-read each export) (test_export.py)
("S1", S, "            if cached is not None:\n                return str(cached), {}",
          "            if False:\n                return str(cached), {}"),
# S2 from_pretrained_args: the GGUF read from its own folder, not a private one (tokenizer files beside it win)
#    (test_export.py: tokenizer_files_beside_a_gguf_file, copy_is_kept_by_its_content)
("S2", S, 'return str(gguf_alone(self.path)), {"gguf_file": self.path.name}',
          'return str(self.path.parent), {"gguf_file": self.path.name}'),
# S3 hub_offline: only "true" counts (HF_HUB_OFFLINE=1 is not offline) (test_export.py: hub tests; test_mtp.py)
("S3", S, 'in ("1", "true", "yes", "on")', '== "true"'),
# --- gguf_cache_entry, gguf_cached --------------------------------------------------------------------------------
# S4 gguf_cache_entry: the entry keyed by the file's path, not its bytes (the same bytes elsewhere miss the copy;
#    a file rewritten in place finds the old copy) (test_export.py: copy_is_kept_by_its_content)
("S4", S, 'digest = _DIGESTS[key] = hashlib.file_digest(f, "sha256").hexdigest()',
          'digest = _DIGESTS[key] = hashlib.sha256(str(path.resolve()).encode()).hexdigest()'),
# S5 gguf_cached: an entry found unreadable is read again (not deleted: the load fails anew each time)
#    (test_export.py: damaged_kept_copy "not read again")
("S5", S, "if entry is None or entry in _UNREADABLE or not (entry / \"COMPLETE\").is_file():",
          "if entry is None or not (entry / \"COMPLETE\").is_file():"),
# S6 gguf_cached: a copy that cannot be checked now (EMFILE) deleted, not left for the next export
#    (test_export.py: kept_copy_that_cannot_be_checked_now)
("S6", S, '        _say_copy(path, entry, f"cannot be checked now ({e})")',
          '        _drop_copy(path, entry, f"cannot be checked now ({e})")'),
# S7 gguf_cached: a copy that is not what its record says is used anyway (test_export.py: checked_against_its_record)
("S7", S, "    if why is not None:\n        _drop_copy(path, entry, why)", "    if False:\n        _drop_copy(path, entry, why)"),
# --- _copy_mismatch --------------------------------------------------------------------------------------------------
# S8 _copy_mismatch: a copy checked once is trusted by name, its files' sizes and times not compared (altered
#     after the check: used) (test_export.py: checked_against_its_record)
("S8", S, "        if _VERIFIED.get(entry) == stats:", "        if entry in _VERIFIED:"),
# S9 _copy_mismatch: the versions that wrote the copy not compared (test_export.py: "written by gguf")
("S9", S, "        if versions != now:", "        if False:"),
# S10 _copy_mismatch: a recorded file gone is no mismatch (test_export.py: "config.json is missing")
("S10", S, '            if name not in have:\n                return f"{name} is missing"',
           '            if name not in have:\n                continue'),
# S11 _copy_mismatch: only the files both recorded and present compared (one added or gone: no mismatch)
#     (test_export.py: "extra.json was added", "config.json is missing")
("S11", S, "        for name in sorted(set(files) | set(have)):", "        for name in sorted(set(files) & set(have)):"),
# S12 _copy_mismatch: the files' sha256 not compared with the record (a zeroed layer used)
#     (test_export.py: "changed after it was kept")
("S12", S, '                if hashlib.file_digest(h, "sha256").hexdigest() != files[name]:',
           '                if len(files[name]) != 64:'),
# S13 _copy_mismatch: a machine's error (EMFILE) taken as damage: the copy deleted
#     (test_export.py: kept_copy_that_cannot_be_checked_now)
("S13", S, '        raise _Unchecked(f"{e.strerror or e}") from None', '        return f"{e.strerror or e}"'),
# --- _drop_copy, keep_gguf_copy, _remove_stale_copies, drop_gguf_copy ---------------------------------------------
# S14 _drop_copy: the entry not marked unreadable (one that cannot be deleted is read, and fails, again)
#     (test_export.py: damaged_kept_copy "not read again")
("S14", S, "    _UNREADABLE.add(entry)\n    _VERIFIED.pop(entry, None)", "    _VERIFIED.pop(entry, None)"),
# S15 keep_gguf_copy: the temporary folder left behind when stopped or superseded (test_export.py:
#     stopped_gguf_copy, copy_kept_meanwhile)
("S15", S, "        if tmp is not None:\n            shutil.rmtree(tmp, ignore_errors=True)",
           "        if False:\n            shutil.rmtree(tmp, ignore_errors=True)"),
# S16 keep_gguf_copy: a copy kept meanwhile by another export replaced by this one (test_export.py:
#     copy_kept_meanwhile_by_another_export_stays)
("S16", S, "        if gguf_cached(path) is not None:  # another export", "        if False:  # another export"),
# S17 _remove_stale_copies: a running export's temporary folder removed (only this process's kept)
#     (test_export.py: stopped_gguf_copy)
("S17", S, "if m and (int(m.group(1)) == os.getpid() or _alive(int(m.group(1)))):",
           "if m and int(m.group(1)) == os.getpid():"),
# S18 drop_gguf_copy: only the COMPLETE marker removed, the copy's files left (test_export.py: damaged_kept_copy,
#     checked_against_its_record "not entry.exists()")
("S18", S, '    (entry / "COMPLETE").unlink(missing_ok=True)\n    shutil.rmtree(entry)',
           '    (entry / "COMPLETE").unlink(missing_ok=True)'),
# --- _unreadable_copy ---------------------------------------------------------------------------------------------
# S19 _unreadable_copy: a MemoryError (the machine's) taken as a damaged copy: deleted (test_export.py:
#     damaged_kept_copy "no_memory")
("S19", S, "_NOT_DAMAGE = (MemoryError, ImportError, RecursionError)", "_NOT_DAMAGE = (ImportError, RecursionError)"),
# --- resolve ------------------------------------------------------------------------------------------------------
# S20 resolve: a .gguf file without GGUF's magic taken (test_export.py; likely survives: no test writes one)
("S20", S, '            if f.read(4) != b"GGUF":', '            if f.read(4) == b"":'),
# S21 resolve: a directory without config.json not refused (FileNotFoundError traceback) (test_export.py:
#     directory_without_config)
("S21", S, "        if not cfg.is_file():\n            ggufs", "        if False:\n            ggufs"),
# S22 resolve: _HUB_ID takes any slash-free name as a hub id ("not-a-hub-id-nor-path" asks the hub)
#     (test_export.py: test_bad_sources)
("S22", S, '_HUB_ID = re.compile(r"^[A-Za-z0-9][\\w.-]*/[\\w.-]+$")', '_HUB_ID = re.compile(r"^[A-Za-z0-9][\\w./-]*$")'),
# --- source_files, _read_by_export --------------------------------------------------------------------------------
# S23 source_files: a .gguf source records every .gguf beside it (test_export.py: source_files_are_the_gguf_file_alone)
("S23", S, "        files = [src.path]", '        files = sorted(src.path.parent.glob("*.gguf"))'),
# S24 _read_by_export: hidden files (.gitattributes) recorded (test_export.py: source_files_...)
("S24", S, '    if name.startswith(".") or not f.is_file():', "    if not f.is_file():"),
# S25 _read_by_export: pytorch_model*.bin recorded beside .safetensors (test_export.py: source_files_...)
("S25", S, 'name.endswith(".bin") and not any(folder.glob("*.safetensors"))', 'name.endswith(".bin")'),
# --- _first_line, _hub_error, _check_hub --------------------------------------------------------------------------
# S26 _first_line: every multi-line message joins its second line (test_export.py: error_whose_first_line)
("S26", S, 'return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]',
           'return f"{lines[0]} {lines[1]}" if len(lines) > 1 else lines[0]'),
# S27 _hub_error: a 404 from the hub taken as "no network" (test_export.py: hub_drafter_without_network "no such
#     model on the hub")
("S27", S, "status in (401, 403, 404)", "status in (401, 403)"),
# S28 _check_hub: the hub asked although HF_HUB_OFFLINE is set (test_export.py: hub_id_without_network_fails_at_once
#     asked == [])
("S28", S, "    if hub_offline():\n        return\n    from huggingface_hub", "    from huggingface_hub"),
# --- gguf_reads_once, _plain_reader -------------------------------------------------------------------------------
# S29 gguf_reads_once: an inner scope patches again (the patched reader saved as the original: gguf never restored)
#     (test_export.py: reads_share_one_reader)
("S29", S, "        if _SCOPES[0] == 1:", "        if _SCOPES[0] >= 1:"),
# S30 gguf_reads_once: a file replaced by another of the same size and times read from the old reader
#     (test_export.py: reads_share_one_reader "os.replace")
("S30", S, "key = (os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)",
           "key = (os.path.realpath(path), st.st_dev, st.st_size, st.st_mtime_ns)"),
# S31 _plain_reader: the reader's data left an np.memmap (the 6 s vocabulary read back) (test_export.py:
#     type(r.data) is np.ndarray)
("S31", S, '                    self.__dict__["data"] = v.view(np.ndarray) if isinstance(v, np.memmap) else v',
           '                    self.__dict__["data"] = v'),
# --- load_tokenizer, _used_past, check_vocabulary -----------------------------------------------------------------
# S32 load_tokenizer: a model directory's vocabulary not checked at the tokenizer's read (a one-token tokenizer
#     found after the model's read) (test_export.py: directory_without_tokenizer_files "[2/" not in output)
("S32", S, "        check_vocabulary(tok, vocab, src)\n", ""),
# S33 _used_past: the tokenizer's eos past the vocabulary not a use (test_export.py: more_ids_than_the_targets
#     vocabulary[eos])
("S33", S, 'for r in ("bos", "eos", "pad", "unk")}', 'for r in ("bos", "pad", "unk")}'),
# S34 check_vocabulary: special ids past the vocabulary refused even where nothing uses them (Gemma 3 1B's
#     <image_soft_token>) (test_archs.py: special_ids_past_the_vocabulary_exports)
("S34", S, "        if used:\n            raise ExportError", "        if True:\n            raise ExportError"),
# S35 check_vocabulary: an ordinary token past a target's vocabulary taken (test_export.py: more_ids_...[ordinary];
#     test_archs.py: special_ids_past "plainextra")
("S35", S, "    elif target and len(tok) > vocab_size:", "    elif False:"),
# S36 check_vocabulary: a vocabulary padded past its tokenizer's refused (tokenizer under the whole vocabulary)
#     (test_archs.py: drafter_with_fewer_ids [target_pad]; test_export.py)
("S36", S, "    if len(tok) >= vocab_size / 2:", "    if len(tok) >= vocab_size:"),
# --- _gguf_config -------------------------------------------------------------------------------------------------
# S37 _gguf_config: the file's heads' size (attention.key_length) not read (a Qwen3 with heads not 128 wide: size
#     mismatch) (test_archs.py: qwen3_gguf_whose_heads_are_not_128_wide)
("S37", S, '        head = None if "attention.key_length" in mapped else value("attention.key_length")',
           "        head = None"),
# S38 _gguf_config: the file's rope.scaling.type ignored (a linear/YaRN GGUF exported unscaled; longrope not
#     refused) (test_archs.py: gguf_s_rotary_scaling_is_kept, gemma3_gguf_s_scaling_is_its_global_layers)
("S38", S, '        scaling = None if arch == "gpt_oss" or "rope.scaling.type" in mapped else value("rope.scaling.type")',
           "        scaling = None"),
# S39 _gguf_config: the original context read from context_length, not rope.scaling.original_context_length
#     (test_archs.py: gguf_s_rotary_scaling_is_kept[yarn], longrope_gguf_exports_as_its_folder_does)
("S39", S, '"original_max_position_embeddings": value("rope.scaling.original_context_length"),',
           '"original_max_position_embeddings": value("context_length"),'),
# S40 _gguf_config: YaRN's beta_fast and beta_slow swapped (test_archs.py; likely survives: the tests write no betas)
("S40", S, '"beta_fast": value("rope.scaling.yarn_beta_fast"), "beta_slow": value("rope.scaling.yarn_beta_slow")}',
           '"beta_fast": value("rope.scaling.yarn_beta_slow"), "beta_slow": value("rope.scaling.yarn_beta_fast")}'),
# S41 _gguf_config: Phi-3's rope.dimension_count not read (a partial rotary built whole) (test_archs.py:
#     phi3_gguf_s_partial_rotary_is_kept, longrope_gguf_exports)
("S41", S, '        rotary = None if mapped.get("rope.dimension_count") else value("rope.dimension_count")',
           "        rotary = None"),
# S42 _gguf_config: the rope_freqs.weight tensor (Llama 3's scaling) ignored: unscaled (test_archs.py:
#     llama3_gguf_s_rope_freqs_tensor_is_its_scaling, longrope "twice")
("S42", S, '        freqs = tensors.get("rope_freqs.weight")', "        freqs = None"),
# S43 _gguf_config: unknown rope_* tensors not refused (test_archs.py: longrope_gguf_exports "does not know")
("S43", S, "    if other:\n        raise ExportError", "    if False:\n        raise ExportError"),
# S44 _gguf_config: a rope.scaling.type longrope without tables taken as none (not refused) (test_archs.py:
#     gguf_s_rotary_scaling_is_kept[linear] "scales its rotary by 'longrope'")
("S44", S, '    if scaling in ("longrope", "su") and longrope:', '    if scaling in ("longrope", "su"):'),
# S45 _gguf_config: two scalings at once not refused (test_archs.py: longrope_gguf_exports "twice")
("S45", S, "    if len(ways) > 1:", "    if len(ways) > 2:"),
# S46 _gguf_config: Phi-3's original context not carried (Phi3Config's 4,096 kept) (test_archs.py:
#     longrope_gguf_exports "plain.gguf" == 256)
("S46", S, "        config.original_max_position_embeddings = original\n        changed = True",
           "        config.original_max_position_embeddings = original"),
# S47 _gguf_config: Gemma 3's local rotary base written into the global layers' parameters (test_archs.py:
#     gemma_gguf_s_scale_caps[gemma3])
("S47", S, '                params["sliding_attention"] = {**local, "rope_theta": want}',
           '                params["full_attention"] = {**local, "rope_theta": want}'),
# S48 _gguf_config: a rope_freqs.weight that no Llama 3 parameters give taken as no scaling (test_archs.py:
#     llama3 "not Llama 3's scaling")
("S48", S, "        if got is None:\n            raise ExportError(f\"{path.name} scales its rotary by a rope_freqs",
           "        if False:\n            raise ExportError(f\"{path.name} scales its rotary by a rope_freqs"),
# S49 _gguf_config: one LongRoPE factor a lane, not a pair of lanes (every right file refused) (test_archs.py:
#     longrope_gguf_exports)
("S49", S, '        if 2 * len(longrope["long"]) != dim:', '        if len(longrope["long"]) != dim:'),
# S50 _gguf_config: LongRoPE's long and short factors swapped (test_archs.py: longrope_gguf_exports logits)
("S50", S, 'long_factor=longrope["long"], short_factor=longrope["short"]',
           'long_factor=longrope["short"], short_factor=longrope["long"]'),
# S51 _gguf_config: transformers' default attention factor taken as 1.0 (the file's default recorded as the
#     file's own) (test_archs.py: longrope_gguf_exports "attention_factor" not in rp)
("S51", S, "        default = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1 else 1.0",
           "        default = 1.0"),
# S52 _gguf_config: a per-layer-type model's scaling put on its sliding layers, not its global ones
#     (test_archs.py: gemma3_gguf_s_scaling_is_its_global_layers)
("S52", S, '            params["full_attention"] = {**params["full_attention"], **got, "rope_type": scaling}',
           '            params["sliding_attention"] = {**params["full_attention"], **got, "rope_type": scaling}'),
# S53 _gguf_config: the zero-bias suffixes not returned (a llamafied Qwen2's o_proj bias missing: refused)
#     (test_archs.py: llama_gguf_s_biases_are_kept)
("S53", S, " | ({ZERO_BIASES: tuple(zero)} if zero else {})", ""),
# --- _family_mends ------------------------------------------------------------------------------------------------
# S54 _family_mends: the 27B layer counts of Gemma 2 and 3 swapped (test_archs.py: gemma_27b_s_attention_scale)
("S54", S, "            big = layers == (46 if arch == \"gemma2\" else 62)", "            big = layers == (62 if arch == \"gemma2\" else 46)"),
# S55 _family_mends: Gemma 2's default caps swapped (attn 30, final 50) (test_archs.py: gemma_27b "50.0")
("S55", S, '(("attn_logit_softcapping", 50.0), ("final_logit_softcapping", 30.0))',
           '(("attn_logit_softcapping", 30.0), ("final_logit_softcapping", 50.0))'),
# S56 _family_mends: Gemma 3's local rotary base read from rope.freq_base (the global one), not freq_base_swa
#     (test_archs.py: gemma_gguf_s_scale_caps[gemma3])
("S56", S, '        v = value("rope.freq_base_swa")', '        v = value("rope.freq_base")'),
# S57 _family_mends: a Llama file's biases looked for as weights (every Llama GGUF taken as biased: refused)
#     (test_archs.py: llama_gguf_s_biases_are_kept, llama3 rope_freqs; test_export.py reads_share_one_reader)
("S57", S, '            have = [p for p in parts if f"blk.0.{p}.bias" in names]',
           '            have = [p for p in parts if f"blk.0.{p}.weight" in names]'),
# S58 _family_mends: the absent biases not zeroed (the present ones listed instead) (test_archs.py: llama biases)
("S58", S, "                zero += [hf[p] for p in parts if p not in have]", "                zero += [hf[p] for p in have]"),
# S59 _family_mends: the MLP's down projection not among mlp_bias's parts (test_archs.py: llama biases no-down)
("S59", S, '("mlp_bias", ("ffn_gate", "ffn_up", "ffn_down"))', '("mlp_bias", ("ffn_gate", "ffn_up"))'),
# --- llama3_factors, llama3_rope ----------------------------------------------------------------------------------
# S60 llama3_factors: the high-frequency bound from low_freq_factor (low and high mixed) (test_archs.py: llama3)
("S60", S, "        if wavelen < original / high:", "        if wavelen < original / low:"),
# S61 llama3_factors: the smoothing measured from high_freq_factor, not low (test_archs.py: llama3 "mine")
("S61", S, "            smooth = (original / wavelen - low) / (high - low)",
           "            smooth = (original / wavelen - high) / (high - low)"),
# S62 llama3_factors: short wavelengths scaled by factor and long ones left (the regions swapped)
#     (test_archs.py: llama3)
("S62", S, "            out.append(1.0)\n        elif wavelen > original / low:\n            out.append(factor)",
           "            out.append(factor)\n        elif wavelen > original / low:\n            out.append(1.0)"),
# S63 llama3_rope: a tensor one divisor a lane expected (every real tensor refused) (test_archs.py: llama3)
("S63", S, "len(freqs) != dim // 2", "len(freqs) != dim"),
# S64 llama3_rope: the low and high frequency factors reported swapped (test_archs.py: llama3 "== want")
("S64", S, '"low_freq_factor": low, "high_freq_factor": high,', '"low_freq_factor": high, "high_freq_factor": low,'),
# --- _from_pretrained, load_model ---------------------------------------------------------------------------------
# S65 _from_pretrained: Mistral 3's image-text checkpoint not loaded as its text decoder (test_archs.py: mistral3)
("S65", S, 'IMAGE_TEXT_DECODERS = frozenset({"mistral3"})', "IMAGE_TEXT_DECODERS = frozenset()"),
# S66 load_model: the GGUF's config mends not applied (test_archs.py: every GGUF config test)
("S66", S, "                kw = {**kw, **_gguf_config(src.path, name, kw)}", "                kw = dict(kw)"),
# S67 load_model: the zero-bias record left among from_pretrained's arguments (test_archs.py: llama biases)
("S67", S, "                zero = kw.pop(ZERO_BIASES, ())", "                zero = kw.get(ZERO_BIASES, ())"),
# S68 load_model: a damaged kept copy's model not retried from the file (test_export.py: damaged_kept_copy)
("S68", S, "        if _unreadable_copy(src, name, e):\n            return load_model(src, dtype, log)",
            "        if False:\n            return load_model(src, dtype, log)"),
# S69 load_model: weights missing from the checkpoint not refused (random values) (test_export.py:
#      weight_missing_from_the_checkpoint)
("S69", S, "    if missing:\n        names =", "    if False:\n        names ="),
# S70 load_model: weights the config does not use never said (test_export.py: config_with_fewer_layers)
("S70", S, "    if unused and log is not None:", "    if unused and log is None:"),
]
