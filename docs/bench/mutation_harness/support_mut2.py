"""Mutants of edgespec/integrity.py (IN), edgespec/providers.py (PV) and edgespec/server_metrics.py (SM), session 98:
a second pass after session 76's I1-I38 and session 83's P1-P32 and M1-M33, aimed at what those did not reach:
the cache root and its JSON files (an empty variable, a bound on the read, deep nesting, the temporary file), the
stamps' key and fields, the hashing boundary, the inside check's prefix, external-data names that are not UTF-8 or
absolute, every end token; the providers' options precedence, the warnings' words, the TensorRT cache's folder
(twice, read-only, no XDG), workspaces given as strings; the metrics' label set, types and rounding, stats with
holes (None, no rate).
Run from the copy (the exact -k selections and the results are in mutation_s98_support.md):
  IN: python run.py support_mut2.py tests/test_hardening.py tests/test_errors.py tests/test_manifest.py --k "..."
      (IN3, IN41: tests/test_native.py --k no_home_directory; IN33: tests/test_archs.py --k special_ids_past)
  PV: python run.py support_mut2.py tests/test_planner.py tests/test_layout.py --k "..." (no tiny_cuda_bundle test)
  SM: python run.py support_mut2.py tests/test_server.py --k "metrics_count_each or request_counter"
  then every survivor: python run.py support_mut2.py tests/test_support_mutants.py --only IDS
"""
I, P, M = "edgespec/integrity.py", "edgespec/providers.py", "edgespec/server_metrics.py"
MUTANTS = [
    # ---- integrity.py ----
    ("IN1", I, '    if os.environ.get("EDGESPEC_CACHE_DIR"):', '    if "EDGESPEC_CACHE_DIR" in os.environ:'),  # an empty EDGESPEC_CACHE_DIR taken as the current folder
    ("IN2", I, "        return Path.home() / \".cache\" / \"edgespec\"", "        return Path.home() / \".cache\""),  # the default root one folder up
    ("IN3", I, "    except RuntimeError:  # (no $HOME", "    except KeyError:  # (no $HOME"),  # no home: a traceback, not a ConfigError
    ("IN4", I, "    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]", "    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]"),  # the ctime left out of the stamp
    ("IN5", I, "    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]", "    return [st.st_size, st.st_ctime_ns, st.st_ino, st.st_dev]"),  # the mtime left out (the ctime moves with it)
    ("IN6", I, "    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]", "    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_dev]"),  # the inode left out
    ("IN7", I, "            data = json.loads(f.read(1 << 20))", "            data = json.loads(f.read())"),  # a cache file read whole, whatever its size
    ("IN8", I, "    except (OSError, ValueError, RecursionError):\n        return {}", "    except (OSError, ValueError):\n        return {}"),  # a deeply nested cache file: a traceback
    ("IN9", I, "    except (OSError, ValueError, RecursionError):\n        return {}", "    except (OSError, RecursionError):\n        return {}"),  # a cache file that is no JSON: a traceback
    ("IN10", I, "        path.parent.mkdir(parents=True, exist_ok=True)", "        path.parent.mkdir(exist_ok=True)"),  # a cache root not made yet: the cache never written
    ("IN11", I, "            tmp.unlink(missing_ok=True)  # (a replace refused left it behind)", "            pass"),  # a refused replace leaves its temporary file
    ("IN12", I, "        return e.strerror or str(e)\n    return None", "        return None\n    return None"),  # a failed write said to be written
    ("IN13", I, "    tmp = path.with_suffix(f\".{os.getpid()}.tmp\")", "    tmp = path"),  # written in place, not atomically
    ("IN14", I, "        key = hashlib.sha256(str(root.resolve()).encode", "        key = hashlib.sha256(str(root).encode"),  # a bundle named by a relative path keeps stamps of its own
    ("IN15", I, "        self.changed = False\n", "        self.changed = True\n"),  # every load writes the stamp file
    ("IN16", I, "        if why and self.path not in _UNSAVED:", "        if why:"),  # the unwritable-cache warning at every load
    ("IN17", I, "        if why and self.path not in _UNSAVED:", "        if self.path not in _UNSAVED:"),  # the warning even when written
    ("IN18", I, "            _UNSAVED.add(self.path)\n", "            pass\n"),  # said once a process: not remembered
    ("IN19", I, "    return os.path.commonpath([real, top]) == top", "    return real.startswith(top)"),  # a sibling folder whose name begins with the bundle's taken as inside
    ("IN20", I, "    real, top = os.path.realpath(p), os.path.realpath(root)", "    real, top = os.path.abspath(p), os.path.realpath(root)"),  # a symlink out not followed
    ("IN21", I, "    if not want:\n        return\n    if not deep", "    if want is None:\n        return\n    if not deep"),  # an empty sha256 hashed against
    ("IN22", I, "    if not deep and st.st_size > HASH_ON_LOAD_LIMIT and stamps.valid(rel, want, st):", "    if not deep and st.st_size >= HASH_ON_LOAD_LIMIT and stamps.valid(rel, want, st):"),  # a file of the limit's size trusted by stamp
    ("IN23", I, "    if not deep and st.st_size > HASH_ON_LOAD_LIMIT and stamps.valid(rel, want, st):", "    if st.st_size > HASH_ON_LOAD_LIMIT and stamps.valid(rel, want, st):"),  # verify=True trusts stamps
    ("IN24", I, "    if st.st_size > HASH_ON_LOAD_LIMIT:\n        stamps.record(rel, want, st)", "    if st.st_size >= 0:\n        stamps.record(rel, want, st)"),  # small files stamped too
    ("IN25", I, "    if st.st_size > HASH_ON_LOAD_LIMIT:\n        stamps.record(rel, want, st)", "    if False:\n        stamps.record(rel, want, st)"),  # nothing stamped: GBs hashed at every load
    ("IN26", I, "        if os.fstat(f.fileno()).st_size == 0:\n            return []", "        if False:\n            return []"),  # an empty graph: mmap's ValueError
    ("IN27", I, "                out.add(mm[j: j + min(n, 4096)].decode(\"utf-8\", \"replace\"))", "                out.add(mm[j: j + min(n, 4096)].decode(\"utf-8\"))"),  # a name that is not UTF-8: a traceback
    ("IN28", I, "                out.add(mm[j: j + min(n, 4096)].decode(\"utf-8\", \"replace\"))", "                out.add(mm[j: j + min(n, 255)].decode(\"utf-8\", \"replace\"))"),  # long names cut at 255 bytes
    ("IN29", I, "                i = mm.find(_LOCATION, j)", "                i = mm.find(_LOCATION, j + 1)"),  # a location right after a name missed (one byte on)
    ("IN30", I, "    if not tj.is_file():\n        raise BundleError(f\"bundle {m.root}: missing tokenizer/tokenizer.json\")", "    if not tj.exists():\n        raise BundleError(f\"bundle {m.root}: missing tokenizer/tokenizer.json\")"),  # a folder as tokenizer.json
    ("IN31", I, "            except (ValueError, UnicodeDecodeError, RecursionError, AttributeError, TypeError, KeyError) as e:", "            except (ValueError, UnicodeDecodeError) as e:"),  # a tokenizer.json of another shape: a traceback
    ("IN32", I, "            stamps.record(\"tokenizer.json#fingerprint\", want, st)", "            pass"),  # the fingerprint computed at every load
    ("IN33", I, "        if vocab is not None and vocab - m.tokenizer_special_past > spec.vocab_size and spec.role == \"target\":", "        if vocab is not None and vocab > spec.vocab_size and spec.role == \"target\":"),  # special tokens past the vocabulary refused
    ("IN34", I, "        for name, i in [(\"bos_token_id\", m.bos_token_id)] + [(\"eos_token_ids\", e) for e in m.eos_token_ids]:", "        for name, i in [(\"bos_token_id\", m.bos_token_id)] + [(\"eos_token_ids\", e) for e in m.eos_token_ids[:1]]:"),  # only the first end token checked
    ("IN35", I, "            if i is not None and not 0 <= i < spec.vocab_size:", "            if i is not None and not i < spec.vocab_size:"),  # a negative id taken
    ("IN36", I, "                raise BundleError(f\"bundle {m.root}: {name} {i} is outside the {spec.role}'s vocabulary \"\n                                  f\"(0..{spec.vocab_size - 1})\")", "                raise BundleError(f\"bundle {m.root}: {name} {i} is outside the {spec.role}'s vocabulary \"\n                                  f\"(0..{spec.vocab_size})\")"),  # the range said one too wide
    ("IN37", I, "                    if os.path.isabs(loc) or not _inside(m.root, target):", "                    if not _inside(m.root, target):"),  # an absolute location inside the bundle taken
    ("IN38", I, "            if spec.path.is_file():\n", "            if False:\n"),  # external data never read
    ("IN39", I, "        raise BundleError(f\"bundle {m.root}: cannot read {e.filename or 'a file'}: {e.strerror or e}\") from None", "        raise"),  # an unreadable file: the OSError's traceback
    ("IN40", I, "    finally:\n        stamps.save()", "    else:\n        stamps.save()"),  # stamps learned before a refusal thrown away
    ("IN41", I, "        raise ConfigError(\"edgespec keeps", "        raise OSError(\"edgespec keeps"),  # no home: another type (exit code)
    # ---- providers.py ----
    ("PV1", P, "    full = ALIASES.get(name.lower(), name)\n    if full not in _SHORT:", "    full = ALIASES.get(name.lower(), name)\n    if full not in ALIASES.values() and False:"),  # an unknown name passed through
    ("PV2", P, "choose from {', '.join(PROVIDER_NAMES)}\")", "choose from cpu, cuda\")"),  # the names offered lack tensorrt
    ("PV3", P, "    return ALIASES.get(name.lower(), name) in GPU_PROVIDERS", "    return ALIASES.get(name.lower(), name) != CPU"),  # an unknown name called a GPU
    ("PV4", P, "            if n == canonical(name):\n                return o\n        return None", "            if n == canonical(name):\n                return o\n        return {}"),  # a provider not in the choice has options {}
    ("PV5", P, "            if n == canonical(name):\n                return o", "            if n == ALIASES.get(name, name):\n                return o"),  # options by a name in capitals not found
    ("PV6", P, "    have = available if available is not None else available_providers()", "    have = available or available_providers()"),  # an empty build list replaced by onnxruntime's
    ("PV7", P, "            runs.append((name, dict(options.get(short, options.get(name, {})))))", "            runs.append((name, dict(options.get(name, options.get(short, {})))))"),  # onnxruntime's name wins over the short one
    ("PV8", P, "                f\"execution provider {short!r} was asked for but this onnxruntime build has only \"\n                f\"{', '.join(have)}\"", "                f\"execution provider {short!r} was asked for but this onnxruntime build has only \"\n                f\"{have}\""),  # the build's providers as a list's repr
    ("PV9", P, "    if not any(n == CPU for n, _ in runs):", "    if not runs:"),  # the CPU does not close a list
    ("PV10", P, "            f\"asked for {', '.join(_SHORT[n] for n in names)}; this", "            f\"asked for {', '.join(requested)}; this"),  # the warning quotes the names as typed
    ("PV11", P, "f\"(it has {', '.join(have)}), so {_SHORT[runs[0][0]]} runs\"", "f\"(it has {', '.join(have)}), so {_SHORT[runs[-1][0]]} runs\""),  # the last provider said to run
    ("PV12", P, "            + (\"; install onnxruntime-gpu for cuda/tensorrt\" if any(m != \"cpu\" for m in missing) else \"\"))", "            + (\"; install onnxruntime-gpu for cuda/tensorrt\" if all(m != \"cpu\" for m in missing) else \"\"))"),  # no hint when cpu is missing too
    ("PV13", P, "    return ProviderChoice(runs, requested, warnings, explicit)\n\n\ndef trt_cache_dir", "    return ProviderChoice(runs, names, warnings, explicit)\n\n\ndef trt_cache_dir"),  # requested as onnxruntime's names
    ("PV14", P, "        d.mkdir(exist_ok=True)", "        d.mkdir()"),  # a second load's cache folder refused: the fallback
    ("PV15", P, "        base = Path(os.environ.get(\"XDG_CACHE_HOME\") or Path.home() / \".cache\")", "        base = Path(os.environ.get(\"XDG_CACHE_HOME\"))"),  # no XDG_CACHE_HOME: a TypeError
    ("PV16", P, "        base = Path(os.environ.get(\"XDG_CACHE_HOME\") or Path.home() / \".cache\")", "        base = Path.home() / \".cache\""),  # XDG_CACHE_HOME ignored
    ("PV17", P, "        alt = base / \"edgespec\" / \"trt\" / Path(bundle_root).resolve().name", "        alt = base / \"edgespec\" / \"trt\" / Path(bundle_root).name"),  # a bundle given as "." shares one folder
    ("PV18", P, "        log.warning(f\"cannot create {d} ({e.strerror}); TensorRT engines are cached in {alt}\")\n", ""),  # the fallback silent
    ("PV19", P, "                elif int(asked) > scratch:", "                elif asked > scratch:"),  # a workspace given as a string: a TypeError
    ("PV20", P, "            if scratch is not None:\n                asked", "            if scratch:\n                asked"),  # (equivalent guard: scratch is None or > 0)
    ("PV21", P, "        if name == CUDA and \"gpu_mem_limit\" not in opts and room is not None:", "        if name in GPU_PROVIDERS and \"gpu_mem_limit\" not in opts and room is not None:"),  # TensorRT given CUDA's arena limit
    ("PV22", P, "    room = int(gpu_mem_limit) if gpu_mem_limit and gpu_mem_limit > 0 else None", "    room = gpu_mem_limit if gpu_mem_limit and gpu_mem_limit > 0 else None"),  # a float room passed to onnxruntime
    ("PV23", P, "            if cuda_graphs is not None:", "            if cuda_graphs:"),  # --no-cuda-graphs ignored where a profile turns them on
    ("PV24", P, "                opts.setdefault(\"enable_cuda_graph\", \"1\" if CUDA_GRAPHS_DEFAULT else \"0\")", "                opts[\"enable_cuda_graph\"] = \"1\" if CUDA_GRAPHS_DEFAULT else \"0\""),  # the profile's enable_cuda_graph overridden
    ("PV25", P, "    return ProviderChoice(runs, choice.requested, choice.warnings, choice.explicit)", "    return ProviderChoice(runs, choice.requested, [], choice.explicit)"),  # the choice's warnings dropped
    ("PV26", P, "            opts.setdefault(\"arena_extend_strategy\", \"kSameAsRequested\")", "            opts[\"arena_extend_strategy\"] = \"kSameAsRequested\""),  # the profile's arena strategy overridden
    ("PV27", P, "        log.warning(w)", "        log.info(w)"),  # a fallback logged below the warning level
    # ---- server_metrics.py ----
    # (rewritten after the fix that gave the stored-response routes a label: the same mutant of the new line)
    ("SM1", M, 'if endpoint.startswith(root + "/")),', "if endpoint.startswith(root)),"),  # /v1/modelsX counted as a model's page
    ("SM2", M, "            label = endpoint if endpoint in ENDPOINTS else", "            label = endpoint if endpoint.startswith(ENDPOINTS) else"),  # a client's path under a known prefix becomes a label
    ("SM3", M, "ENDPOINTS = (\"/v1/chat/completions\", \"/v1/completions\", \"/v1/responses\", \"/v1/models\",", "ENDPOINTS = (\"/v1/chat/completions\", \"/v1/completions\", \"/v1/models\","),  # /v1/responses counted as other
    ("SM4", M, "             \"/detokenize\")", "             )"),  # /detokenize counted as other
    ("SM5", M, "\"/health\", \"/metrics\", \"/tokenize\",", "\"/health\", \"/tokenize\","),  # /metrics counted as other
    ("SM6", M, "                    self.tokens[key] += int(s.get(key) or 0)", "                    self.tokens[key] += s.get(key, 0)"),  # a None count: a TypeError
    ("SM7", M, "                self.seconds[\"ttft\"] += (s.get(\"ttft_ms\") or 0) / 1000", "                self.seconds[\"ttft\"] += s.get(\"ttft_ms\", 0) / 1000"),  # a None ttft: a TypeError
    ("SM8", M, "                if s.get(\"tokens_per_second\") and (s.get(\"new_tokens\") or 0) > 1:", "                if (s.get(\"new_tokens\") or 0) > 1:"),  # no rate: a ZeroDivisionError / TypeError
    ("SM9", M, "                if s.get(\"tokens_per_second\") and (s.get(\"new_tokens\") or 0) > 1:", "                if s.get(\"tokens_per_second\") and (s.get(\"new_tokens\") or 0) >= 1:"),  # (equivalent: one token adds 0 s)
    ("SM10", M, "            reason = \"error\" if failed else \"cancelled\" if cancelled else (s or {}).get(\"finish_reason\") or \"unknown\"", "            reason = \"error\" if failed else \"cancelled\" if cancelled else (s or {}).get(\"finish_reason\", \"unknown\")"),  # a None reason rendered as None
    ("SM11", M, "               [({}, round(tok.get(\"accepted_tokens\", 0) / drafted, 6) if drafted else 0)])", "               [({}, round(tok.get(\"accepted_tokens\", 0) / drafted, 2) if drafted else 0)])"),  # the acceptance rate to two places
    ("SM12", M, "               [({}, round(tok.get(\"new_tokens\", 0) / calls, 6) if calls else 0)])", "               [({}, round(tok.get(\"new_tokens\", 0) / calls) if calls else 0)])"),  # tokens per call rounded to a whole number
    ("SM13", M, "        metric(\"queue_depth\", \"gauge\",", "        metric(\"queue_depth\", \"counter\","),  # a gauge typed a counter
    ("SM14", M, "        metric(\"prompt_cache_evictions_total\", \"counter\",", "        metric(\"prompt_cache_evictions_total\", \"gauge\","),  # a counter typed a gauge
    ("SM15", M, "        metric(\"acceptance_rate\", \"gauge\",", "        metric(\"acceptance_rate\", \"counter\","),  # the rate typed a counter
    ("SM16", M, "            metric(f\"{key}_total\", \"counter\", help_, [({}, tok.get(key, 0))])", "            metric(f\"{key}_total\", \"gauge\", help_, [({}, tok.get(key, 0))])"),  # token counters typed gauges
    ("SM17", M, "            lines.append(f\"# HELP edgespec_{name} {help_}\")\n            lines.append(f\"# TYPE edgespec_{name} {kind}\")", "            lines.append(f\"# TYPE edgespec_{name} {kind}\")\n            lines.append(f\"# HELP edgespec_{name} {help_}\")"),  # (equivalent: the format allows either order)
    ("SM18", M, "        if pc:  # (none on a GPU target", "        if pc is not None:  # (none on a GPU target"),  # an empty prompt-cache dict: a KeyError
    ("SM19", M, "        if \"VmHWM\" in mem:", "        if mem:"),  # (equivalent: _memory always sets VmHWM)
    ("SM20", M, "            if message[\"type\"] == \"http.response.start\":\n                status = message[\"status\"]", "            if message[\"type\"] == \"http.response.start\" and status == 500:\n                status = message[\"status\"]"),  # (equivalent: one start per response)
    ("SM21", M, "        if scope[\"type\"] != \"http\":", "        if scope[\"type\"] == \"lifespan\":"),  # a websocket counted as a request
    ("SM22", M, "            self.requests[(label, status)] += 1", "            self.requests[(label, int(status) // 100 * 100)] += 1"),  # statuses counted by class
    ("SM23", M, "            tok, sec, rejected = dict(self.tokens), dict(self.seconds), self.rejected", "            tok, sec, rejected = self.tokens, self.seconds, self.rejected"),  # (equivalent but for a race: render reads live counters)
    ("SM24", M, "            self.seconds[\"queue\"] += queue_ms / 1000", "            self.seconds[\"queue\"] += queue_ms // 1000"),  # queue time in whole seconds
    ("SM25", M, "        return \"\\n\".join(lines) + \"\\n\"", "        return \"\\n\".join(lines)"),  # no final newline (covered by M-33?)
    ("SM26", M, "                lab = \",\".join(f'{k}=\"{val}\"' for k, val in labels.items())", "                lab = \",\".join(f'{k}={val}' for k, val in labels.items())"),  # label values unquoted
]
