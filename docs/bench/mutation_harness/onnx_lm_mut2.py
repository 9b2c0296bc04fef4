"""Mutants of edgespec/onnx_lm.py (session 97): a second pass after sessions 79-80's O1-O44, aimed at the load
checks' details (the logits width, the graph's names and cache axes), what a model is set to do at load (alternates,
cheap rows, the argmax on the device, the verify bound), _run's bindings (skips, hidden states, conv states, the
outputs' order, float16 logits), and how a session is opened (threads, log level, the retry without graphs,
onnxruntime's errors' types) and where it runs.
Run from the copy:  python run.py onnx_lm_mut2.py tests/test_runtime.py tests/test_layout.py ... --k "not smol"
"""
P = "edgespec/onnx_lm.py"
MUTANTS = [
    ("ON1", P, "        if max_context > spec.max_context:", "        if max_context >= spec.max_context:"),  # the exported context itself refused
    ("ON2", P, "        self.max_context = min(int(max_context), spec.max_context - spec.attention_pad)", "        self.max_context = min(int(max_context), spec.max_context)"),  # the pad's position not kept free
    ("ON4", P, "        if spec.conv_layers and self.device != \"cpu\":", "        if False:"),  # a conv model on a GPU
    ("ON5", P, "        self.layout_warning = warn_if_slow(spec, self.device) or warn_if_no_skip(spec, self.device)", "        self.layout_warning = warn_if_slow(spec, self.device)"),  # the no-skip warning lost
    ("ON6", P, "                want = spec.head_size or spec.vocab_size", "                want = spec.vocab_size"),  # a reduced head checked against the vocabulary
    ("ON7", P, "                if o.shape[-1] != want:", "                if False:"),  # the logits width unchecked
    ("ON9", P, "        self.verifies_alternates = self._rows_name is not None and bool(self.cache.host) and self.cache.conv is None", "        self.verifies_alternates = self._rows_name is not None and bool(self.cache.host)"),  # alternates on a conv model
    ("ON10", P, "        self.verifies_alternates = self._rows_name is not None and bool(self.cache.host) and self.cache.conv is None", "        self.verifies_alternates = self._rows_name is not None and self.cache.conv is None"),  # alternates with a device cache
    ("ON11", P, "        self.cheap_rows = self.verifies_alternates and spec.kernels == \"edgespec-q4\" and _wide_path()", "        self.cheap_rows = self.verifies_alternates and _wide_path()"),  # onnxruntime's kernels' rows called cheap
    ("ON12", P, "        self._hidden_name = io.hidden if io.hidden and any(o.name == io.hidden for o in outputs) else None", "        self._hidden_name = io.hidden or None"),  # a hidden output the graph lacks
    ("ON13", P, "        self.device_argmax = self._argmax_name is not None and self.device == \"cuda\"", "        self.device_argmax = self._argmax_name is not None"),  # the device argmax claimed on the CPU
    ("ON15", P, "        if self.min_width != 1 or self.width_multiple != 1:", "        if self.min_width != 1:"),  # a width multiple keeps alternates
    ("ON16", P, "            self.verified_width = max(GPU_MIN_VERIFIED, padded_width(1, self.min_width, self.width_multiple))", "            self.verified_width = padded_width(1, self.min_width, self.width_multiple)"),  # the verify bound below the GPU minimum
    ("ON17", P, "        elif not width_invariant(self):", "        else:"),  # exact kernels bounded too
    ("ON22", P, "        if g is not None and n <= GRAPH_MAX_WIDTH and not skip:", "        if g is not None and n <= GRAPH_MAX_WIDTH:"),  # a skipping call replayed as a graph
    ("ON23", P, "                raise BundleError(f\"the {self.spec.role} model failed to run (CUDA graph of {n} tokens): \"", "                raise EdgespecError(f\"the {self.spec.role} model failed to run (CUDA graph of {n} tokens): \""),  # a replay's failure not the bundle's type
    ("ON24", P, "            self.run_seconds += time.perf_counter() - t0\n            self._returned_view = False\n            return out", "            self._returned_view = False\n            return out"),  # graph calls untimed
    ("ON26", P, "            conv.seek(past)\n", "            pass\n"),  # conv states not moved to past
    ("ON29", P, "            rows_at = self._rows[:n] if positions is None else np.asarray(positions, dtype=np.int64)", "            rows_at = self._rows[:n]"),  # given rows' positions ignored
    ("ON30", P, "            self._skip[0] = skip\n", "            self._skip[0] = 0\n"),  # the skip fed as 0
    ("ON31", P, "        own = None if argmax else self._own_logits(rows)", "        own = None if argmax else self._own_logits(n)"),  # a skipping call's logits buffer of n rows
    ("ON32", P, "            b.bind_ortvalue_output(self._hidden_name, self._hidden_view(rows)[1])", "            b.bind_ortvalue_output(self._hidden_name, self._hidden_view(n)[1])"),  # hidden rows of n in a skipping call
    ("ON33", P, "            top = self._own_argmax(rows)  # over", "            top = self._own_argmax(n)  # over"),  # argmax rows of n in a skipping call
    ("ON34", P, "            conv.after_call(past, n)\n", "            pass\n"),  # conv states not kept after a call
    ("ON35", P, "        self._returned_view = own is not None and own[0].dtype == np.float32", "        self._returned_view = False"),  # a kept buffer's view handed out as a copy
    ("ON36", P, "        nkv = len(self.cache.buffers) + (2 * len(conv.layers) if conv is not None else 0)", "        nkv = len(self.cache.buffers)"),  # conv outputs not counted before the logits
    ("ON37", P, "        logits = out[nkv].numpy() if len(out) > nkv else out[0].numpy()", "        logits = out[0].numpy()"),  # the first output read as the logits
    ("ON38", P, "        return logits if logits.dtype == np.float32 else logits.astype(np.float32)", "        return logits"),  # float16 logits returned as float16
    ("ON42", P, "        return cheap_rows(isa())", "        return True"),  # every ISA's rows cheap
    ("ON43", P, "        str(path).encode(\"utf-8\")\n", "        str(path)\n"),  # a path that is not UTF-8 passed on
    ("ON44", P, "    if threads and pool not in (threads, -1, NO_GLOBAL_POOL):", "    if threads and pool not in (threads, -1):"),  # a warning where each session has its own pool
    ("ON45", P, "        if providers.primary in GPU_PROVIDERS:\n            raise ProviderError", "        if False:\n            raise ProviderError"),  # an exact-kernels bundle on a GPU
    ("ON46", P, "            so.add_session_config_entry(\"session.intra_op.allow_spinning\", \"0\")\n", "            pass\n"),  # per-session pools spin
    ("ON47", P, "            if threads:\n                so.intra_op_num_threads = int(threads)", "            if False:\n                so.intra_op_num_threads = int(threads)"),  # a per-session pool's threads ignored
    ("ON48", P, "        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL", "        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC"),  # fewer graph optimizations
    ("ON49", P, "        so.log_severity_level = _ort_log_level(providers.primary)\n", "        pass\n"),  # the log level not set
    ("ON52", P, "            return attempt([(n, {k: v for k, v in o.items() if k != GRAPH_OPTION}) for n, o in providers.providers])", "            return attempt(providers.providers)"),  # the retry asks for graphs again
    ("ON53", P, "        first = str(e).splitlines()[0] if str(e) else type(e).__name__", "        first = str(e).splitlines()[0]"),  # an empty message: IndexError
    ("ON54", P, "        if count:  # (the message's", "        if False:  # (the message's"),  # the input-count message lost
    ("ON55", P, "        broken = (\"INVALID_PROTOBUF\", \"INVALID_GRAPH\", \"NO_SUCHFILE\",", "        broken = (\"INVALID_PROTOBUF\", \"INVALID_GRAPH\","),  # a missing file not the bundle's
    ("ON56", P, "        raise (BundleError if any(b.lower() in str(e).lower() for b in broken) else EdgespecError)(msg) from None", "        raise (BundleError if any(b in str(e) for b in broken) else EdgespecError)(msg) from None"),  # case-sensitive classification
    ("ON57", P, "        if raw not in (\"0\", \"1\", \"2\", \"3\", \"4\"):", "        if not raw.isdigit():"),  # EDGESPEC_ORT_LOG 5 or 9 accepted
    ("ON58", P, "    return 3 if primary in GPU_PROVIDERS else 4", "    return 3"),  # the CPU logs errors too
    ("ON59", P, "    asked = any(str(o.get(GRAPH_OPTION, \"0\")).lower() in (\"1\", \"true\") for _, o in provs)", "    asked = any(str(o.get(GRAPH_OPTION, \"0\")) == \"1\" for _, o in provs)"),  # \"True\" not read as asked
    ("ON60", P, "    return asked and (\"graph capture\" in msg or \"cuda graph\" in msg)", "    return \"graph capture\" in msg or \"cuda graph\" in msg"),  # retried where graphs were never asked for
    ("ON61", P, "        want = max(0, int(threads or 0))", "        want = int(threads or 0)"),  # a negative pool size passed on
    ("ON62", P, "        except Exception:  # made before, outside edgespec\n            _shared_pool = -1", "        except Exception:  # made before, outside edgespec\n            _shared_pool = want"),  # a pool made elsewhere taken as ours
    ("ON63", P, "        if not (hasattr(ort, \"set_global_thread_pool_sizes\") and hasattr(ort.SessionOptions(), \"use_per_session_threads\")):", "        if not hasattr(ort, \"set_global_thread_pool_sizes\"):"),  # an onnxruntime without per-session switch
    ("ON64", P, "    if io.logits_skip:\n        want_in.append(io.logits_skip)", "    if False:\n        want_in.append(io.logits_skip)"),  # a missing logits_skip input not refused
    ("ON65", P, "    if io.row_positions:\n        want_in.append(io.row_positions)", "    if False:\n        want_in.append(io.row_positions)"),  # a missing row_positions input not refused
    ("ON66", P, "    want_in += [io.past_conv % layer for layer in conv]\n", "    pass\n"),  # conv inputs unchecked
    ("ON67", P, "    want_out += [n % layer for layer in conv for n in (io.present_conv, io.conv_input)]", "    want_out += [io.present_conv % layer for layer in conv]"),  # conv_input outputs unchecked
    ("ON68", P, "                          + (f\" (and {len(missing) - 1} more names)\" if len(missing) > 1 else \"\")", "                          + (f\" (and {len(missing) - 1} more names)\" if len(missing) >= 1 else \"\")"),  # "(and 0 more names)"
    ("ON69", P, "    extra = sorted(n for n in inputs if n.startswith(io.past_key.split(\"%\")[0]) and n not in want_in)", "    extra = []"),  # extra cache inputs unchecked
    ("ON70", P, "    names |= {spec.io.past_value % layer: layer for layer in range(spec.num_layers)}\n", "    pass\n"),  # value caches' axes unchecked
    ("ON71", P, "        for axis, want, what in ((1, heads, \"num_kv_heads\"), (3, width, \"head_dim\")):", "        for axis, want, what in ((1, heads, \"num_kv_heads\"),):"),  # head_dim unchecked
    ("ON72", P, "            if isinstance(shape[axis], int) and shape[axis] != want:", "            if shape[axis] != want:"),  # a symbolic axis refused
    ("ON73", P, "    kv = [layer for layer in range(spec.num_layers) if spec.has_kv(layer)]", "    kv = list(range(spec.num_layers))"),  # conv layers' caches wanted
    ("ON74", P, "    return \"cuda\" if running and running[0] in GPU_PROVIDERS else \"cpu\"", "    return \"cuda\" if choice.primary in GPU_PROVIDERS else \"cpu\""),  # a fallen-back session's cache on the device
    ("ON75", P, "        if choice.explicit:\n            raise ProviderError(msg)", "        if False:\n            raise ProviderError(msg)"),  # a named provider's fallback only warned
    ("ON79", P, "            if o.name == io.logits and o.type in _ORT_FLOATS and isinstance(o.shape[-1], int):", "            if o.name == io.logits and o.type in _ORT_FLOATS:"),  # a symbolic vocab axis taken as a width
]
