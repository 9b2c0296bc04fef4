"""Mutants of edgespec/api.py (session 97): a second pass after session 81's A1-A44 (the stream's stops, held-back
text, healing's cuts, encode's size bound, tools in generate, _collect, score, ChatSession's fitting, load's memory
path), over what that pass left: load's conversions and its argument checks, the prompt cache file's checks and its
write at close, _threads, _texts, _rendered_strings, Engine's init, reset, config's own checks, encode's refusals,
heal's argument, tool_request, stream_ids' conversions, the logprob entries' offsets, generate/stream's option checks,
chat(), close, ChatSession's system prompt, reset and turn, _stops.
Run from the copy, each group against the files that test it (see mutation_s97_api.md), e.g.
  python run.py api_mut2.py tests/test_api.py --k "not smollm2 and not smol"
"""
A = "edgespec/api.py"
MUTANTS = [
    # load: conversions
    ("AP1", A, "            documents = list(documents)", "            pass"),  # a generator or set of document paths refused
    ("AP2", A, "        max_context = int(max_context)", "        pass"),  # numpy's integer max_context refused
    ("AP3", A, "        min_width = int(min_width)", "        pass"),  # numpy's integer min_width refused
    ("AP4", A, "        prompt_cache_mb = int(prompt_cache_mb)", "        pass"),  # numpy's integer prompt_cache_mb refused
    ("AP5", A, "    if prompt_cache_mb is not None:\n        prof = dataclasses.replace(", "    if prompt_cache_mb:\n        prof = dataclasses.replace("),  # prompt_cache_mb=0 ignored: the plan's cache kept
    ("AP6", A, "        n_threads = min(prof.threads, _cores())", "        n_threads = prof.threads"),  # a profile's threads past this machine's cores
    ("AP7", A, "    for w in the_plan.warnings:  # a context cut to the bundle's, a KV type the graphs do not have\n        warnings.warn(w, stacklevel=2)", "    pass"),  # the plan's warnings not said
    ("AP8", A, "        decoder.drafters[\"model\"].fim = tok.fim()", "        pass"),  # the model drafter not told the FIM tokens
    ("AP9", A, "        engine._prompt_cache_file = path if owned else None", "        engine._prompt_cache_file = path"),  # reset deletes another engine's file
    ("AP10", A, "names=[os.fspath(p) for p in doc_paths])", "names=None)"),  # a document's error does not name it
    # _open_prompt_cache_file
    ("AP11", A, "    if path.is_dir() or str(named).endswith((\"/\", os.sep)):", "    if path.is_dir():"),  # "newdir/" taken as a file
    ("AP12", A, "    if path.exists() and not path.is_file():  # a device", "    if False:  # a device"),  # /dev/zero taken
    ("AP13", A, "    kept = path.is_file() and not (path.stat().st_mode & 0o222 and os.access(path, os.W_OK))", "    kept = False"),  # a read-only file replaced at close
    ("AP14", A, "    if read_only and not path.is_file():", "    if False:"),  # a file in a read-only folder: said at close, not at load
    ("AP15", A, "    if unhashed:  # (the key", "    if False:  # (the key"),  # a bundle without hashes given a file
    ("AP16", A, "        remove_stale_temporaries(path)  # (what a write killed midway left)", "        pass"),  # stale temporaries left
    ("AP17", A, "    return path, key, why is None", "    return path, key, True"),  # another engine's file taken as this one's (reset deletes it)
    ("AP18", A, "    if why:\n        warnings.warn(f\"the prompt cache {path} was not read", "    if False:\n        warnings.warn(f\"the prompt cache {path} was not read"),  # a file not read said nothing
    # _write_prompt_cache
    ("AP19", A, "            if free:\n                pc.save(cache)", "            if False:\n                pc.save(cache)"),  # the live conversation not kept at close
    ("AP20", A, "        except (EdgespecError, MemoryError) as e:", "        except EdgespecError as e:"),  # a MemoryError at close raised
    # _check_load_args
    ("AP21", A, "and v.bit_length() <= 62", "and v.bit_length() <= 64"),  # max_context=2**63 taken
    ("AP22", A, "(isinstance(v, str) and v.strip() != \"\")", "(isinstance(v, str) and v != \"\")"),  # provider " " taken
    ("AP23", A, "(is_int(kw[\"max_context\"]) and kw[\"max_context\"] > 0)", "(is_int(kw[\"max_context\"]) and kw[\"max_context\"] >= 0)"),  # max_context=0 taken
    ("AP24", A, "(is_int(kw[\"min_width\"]) and kw[\"min_width\"] > 0)", "(is_int(kw[\"min_width\"]) and kw[\"min_width\"] >= 0)"),  # min_width=0 taken
    ("AP25", A, "kw[\"prompt_cache_mb\"] >= 0)", "kw[\"prompt_cache_mb\"] > 0)"),  # prompt_cache_mb=0 refused
    ("AP26", A, "        \"model_sampling\": (isinstance(kw[\"model_sampling\"], bool), \"True or False\"),\n", ""),  # model_sampling="no" taken
    ("AP27", A, "        \"cuda_graphs\": (kw[\"cuda_graphs\"] is None or isinstance(kw[\"cuda_graphs\"], bool), \"None, True or False\"),\n", ""),  # cuda_graphs="no" taken
    ("AP28", A, "isinstance(kw[\"documents\"], (list, tuple)) and all(\n            _a_path(d) for d in kw[\"documents\"])", "isinstance(kw[\"documents\"], (list, tuple))"),  # documents=[5] taken
    ("AP29", A, "    for name in (\"bundle\", \"profile\", \"prompt_cache_file\", \"memory\", \"documents\"):", "    for name in (\"bundle\", \"profile\", \"prompt_cache_file\", \"memory\"):"),  # a document path with NUL: ValueError
    # _threads
    ("AP30", A, "not 0 <= threads <= _cores():", "not 0 <= threads < _cores():"),  # all the cores refused
    ("AP31", A, "isinstance(threads, Integral) or isinstance(threads, bool) or", "isinstance(threads, Integral) or"),  # threads=True taken as 1
    # _texts, _rendered_strings
    ("AP32", A, "            if d.text:\n                yield d.text", "            yield d.text"),  # empty deltas yielded
    ("AP33", A, "    for key in (\"content\", \"reasoning_content\"):", "    for key in (\"content\",):"),  # reasoning not counted in the size bound
    ("AP34", A, "        for key in (\"name\", \"arguments\"):", "        for key in (\"name\",):"),  # calls' arguments not counted
    # Engine.__init__, reset
    ("AP35", A, "dict(manifest.sampling_defaults) if model_sampling else {}", "dict(manifest.sampling_defaults)"),  # model_sampling=False ignored
    ("AP36", A, "            elif any(\"drafter\" in c for c in plan.cuts):", "            elif False:"),  # why no drafter: the plan's cut not named
    ("AP37", A, "                    path.unlink(missing_ok=True)", "                    pass"),  # reset keeps the prompt cache file
    ("AP38", A, "                pc.written = pc.version", "                pass"),  # a reset cache written back at close
    ("AP39", A, "        return add_documents(self, paths, texts)", "        return add_documents(self, paths, ())"),  # texts ignored
    # config
    ("AP40", A, "if kw.get(\"drafter\") == \"none\" and kw.get(\"draft_tokens\") is not None:", "if kw.get(\"drafter\") == \"none\" and kw.get(\"draft_tokens\"):"),  # draft_tokens=0 with drafter none taken
    ("AP41", A, "kw[\"prediction\"] = self.tokenizer.encode(kw[\"prediction\"], add_special=False, parse_special=False)", "kw[\"prediction\"] = self.tokenizer.encode(kw[\"prediction\"], add_special=False)"),  # a prediction's special-token text as the token
    ("AP42", A, "            _check_text(kw[\"prediction\"], \"the prediction\")", "            pass"),  # a prediction not UTF-8: untyped error
    ("AP43", A, "        vals.update({k: v for k, v in kw.items() if v is not None})", "        vals.update(kw)"),  # an option given as None not the default
    ("AP44", A, "        self.decoder.check_prediction(cfg.prediction)", "        pass"),  # a prediction of bad ids taken
    ("AP45", A, "        self.decoder.check_ids(cfg.stop_token_ids, \"stop_token_ids\")", "        pass"),  # a stop id past the vocabulary taken
    # encode
    ("AP46", A, "        if isinstance(prompt_or_messages, (list, tuple)) and not prompt_or_messages:", "        if False:"),  # empty messages: the template's error
    ("AP47", A, "(\"fit\", fit), (\"add_generation_prompt\", add_generation_prompt)):", "(\"fit\", fit),):"),  # add_generation_prompt="no" taken
    ("AP48", A, "        if isinstance(prompt_or_messages, str) and tools is not None:", "        if False:"),  # tools with a plain prompt
    ("AP49", A, "        if template_kwargs and not isinstance(prompt_or_messages, (list, tuple)):", "        if False:"),  # template kwargs with a plain prompt ignored
    ("AP50", A, "            if not isinstance(prompt_or_messages, str):\n                raise ConfigError(\"a suffix", "            if False:\n                raise ConfigError(\"a suffix"),  # suffix with messages
    ("AP51", A, "            texts.append(json.dumps(tools.template_tools, ensure_ascii=False))", "            pass"),  # tools not counted in the size bound
    ("AP52", A, "        if isinstance(suffix, str):\n            texts.append(suffix)", "        if False:\n            texts.append(suffix)"),  # suffix not counted in the size bound
    ("AP53", A, "            if not template_takes_tools(self.manifest.chat_template):", "            if False:"),  # tool messages on a template without tools
    # heal, tool_request
    ("AP54", A, "            if isinstance(ids, (str, bytes)):\n                raise TypeError", "            if isinstance(ids, str):\n                raise TypeError"),  # heal(b"...") taken as ids
    ("AP55", A, "        self.decoder.check_ids(ids, \"the prompt\")\n        f = self.tokenizer.fim()", "        f = self.tokenizer.fim()"),  # heal of an id past the vocabulary: IndexError
    ("AP56", A, "        if OPEN in self.tokenizer.special_ids_texts():", "        if False:"),  # <tool_call> a special token: calls unreadable
    ("AP57", A, "        if held:\n            raise ConfigError(\"response_format cannot", "        if False:\n            raise ConfigError(\"response_format cannot"),  # response_format with callable tools
    # stream_ids, _deltas
    ("AP58", A, "            ids = list(ids)  # (an iterator read once)", "            pass"),  # a generator of ids read twice: empty
    ("AP59", A, "        self.decoder.check_ids(ids, \"the prompt\")  # (a negative id", "        pass  # (a negative id"),  # a negative id taken
    ("AP60", A, "        ends = named | (frozenset() if cfg.ignore_eos else fim_ends)", "        ends = named | fim_ends"),  # ignore_eos stops at a FIM end
    ("AP61", A, "        named -= frozenset() if cfg.ignore_eos else self.decoder.eos", "        named -= self.decoder.eos"),  # ignore_eos, a stop string naming eos: 'eos' not 'stop'
    ("AP62", A, "        stops = [s for s in stop if s]", "        stops = list(stop)"),  # an empty stop string stops at once
    ("AP63", A, "                        if held and new.startswith(held):", "                        if False:"),  # offsets after U+FFFD held bytes
    ("AP64", A, "                    upto = len(entries) if step.finish_reason else sent", "                    upto = sent"),  # entries of empty text at the end dropped
    ("AP65", A, "entries[upto][\"offset\"] < len(text):", "entries[upto][\"offset\"] <= len(text):"),  # an entry out before its text
    ("AP66", A, "                    stats.healed = skip_text[:len(skip_text) - skip]", "                    stats.healed = skip_text"),  # healed counted whole for a reply cut short
    # score
    ("AP67", A, "        if isinstance(prompt, np.ndarray) and prompt.ndim == 1 and prompt.dtype.kind in \"iu\":", "        if False:"),  # score(np.array) refused
    ("AP68", A, "            ids = self.encode(prompt, parse_special, fit=True)", "            ids = self.encode(prompt, True, fit=True)"),  # score's parse_special ignored
    # generate, stream
    ("AP69", A, "        template_kwargs = kw.pop(\"chat_template_kwargs\", None)\n        token_healing = bool(token_healing) if isinstance(token_healing, np.bool_) else token_healing", "        template_kwargs = kw.pop(\"chat_template_kwargs\", None)"),  # np.True_ token_healing refused
    ("AP70", A, "            if tools is not None or tool_choice is not None or parallel_tool_calls is not True:", "            if tools is not None:"),  # tool_choice with a suffix dropped silently
    ("AP71", A, "        held = kw.get(\"grammar\") is not None or kw.get(\"response_format\") not in (None, {\"type\": \"text\"})", "        held = kw.get(\"grammar\") is not None or kw.get(\"response_format\") is not None"),  # response_format text with tools refused
    ("AP72", A, "        if kw.get(\"logprobs\") is not None:\n            raise ConfigError(\"logprobs cannot", "        if kw.get(\"logprobs\"):\n            raise ConfigError(\"logprobs cannot"),  # logprobs=0 with tools taken
    ("AP73", A, "stop=_stops(stop) + treq.stops(tags is not None)", "stop=_stops(stop) + treq.stops(False)"),  # a thinking model's call stops
    ("AP74", A, "        if token_healing and not isinstance(prompt, str):", "        if False:"),  # token healing of messages
    ("AP75", A, "        for k in (\"tools\", \"tool_choice\", \"parallel_tool_calls\"):\n            kw.pop(k, None)", "        pass"),  # stream(tools=None) refused
    # chat(), close
    ("AP76", A, "        if isinstance(self.decoder, _Closed):  # (a session of a closed engine could never answer)", "        if False:"),  # a chat of a closed engine
    ("AP77", A, "template_kwargs=check_template_kwargs(template_kwargs) or None)", "template_kwargs=template_kwargs)"),  # chat's template kwargs unchecked
    ("AP78", A, "        if isinstance(self.decoder, _Closed):\n            return\n        self._release()", "        self._release()"),  # closing twice: ClosedError
    ("AP79", A, "                write()", "                pass"),  # the prompt cache file not written at close
    ("AP80", A, "            dec.closed = _CLOSED  # (a stream made", "            pass  # (a stream made"),  # a stream made before the close runs after it
    # ChatSession
    ("AP81", A, "            _check_text(self.system, \"the system prompt\")", "            pass"),  # system=5 taken
    ("AP82", A, "            elif head.get(\"content\") != self.system:", "            elif False:"),  # two differing system prompts
    ("AP83", A, "            super().__setattr__(\"earlier\", [])", "            pass"),  # another conversation keeps the old one's dropped exchanges
    ("AP84", A, "        self.dropped = 0\n        self.earlier = []", "        self.dropped = 0"),  # reset keeps the dropped exchanges
    ("AP85", A, "self._fit(kw.get(\"max_new_tokens\") or self.engine.defaults.max_new_tokens)", "self._fit(self.engine.defaults.max_new_tokens)"),  # the turn's max_new_tokens not its room
    ("AP86", A, "                    text = split_reasoning(text, starts_inside(ids, tags))[1]", "                    pass"),  # a thinking reply's block kept in the history
    ("AP87", A, "        self.engine.config(stop=stop, **kw)\n        return _texts(self._turn(text, stop, kw))", "        return _texts(self._turn(text, stop, kw))"),  # chat stream: a bad option at next()
    ("AP88", A, "        except EdgespecError:\n            failed = True", "        except ConfigError:\n            failed = True"),  # a failed turn's trace kept (a context overflow)
    # _stops
    ("AP89", A, "            s.encode(\"utf-8\")", "            pass"),  # a lone surrogate stop taken
    ("AP90", A, "    return list(stop)", "    return stop"),  # a tuple of stops: list + tuple in generate(tools)
]
