"""Mutants of edgespec/profiles.py (session 94): loading, checking, listing and resolving memory-budget profiles.
Run from the copy:  python run.py profiles_mut.py tests/test_planner.py [more]"""
F = "edgespec/profiles.py"
MUTANTS = [
    ("PR1", F, "        return int(_physical_memory() * 0.75)", "        return int(_physical_memory() * 0.5)"),  # budget 0: half the RAM, not 3/4
    ("PR2", F, "        if self.memory_budget_mb:\n            return self.memory_budget_mb * MiB",
     "        if self.memory_budget_mb:\n            return self.memory_budget_mb * 1000 * 1000"),  # MB, not MiB
    ("PR3", F, "        return 8 << 30\n", "        return 0\n"),  # no sysconf: a budget of 0 bytes
    ("PR4", F, 'raise ProfileError(f"{where}: unknown key(s) {\', \'.join(unknown)}")', "pass"),  # a mistyped key silently ignored... (then Profile(**) TypeError)
    ("PR5", F, '    if "memory_budget_mb" not in data:\n        raise', '    if False:\n        raise'),  # memory_budget_mb not required
    ("PR6", F, "is_int(v) and 0 <= v <= MAX_MIB, f\"an integer in 0..{MAX_MIB} (MiB)\"", "is_int(v) and 0 <= v, f\"an integer in 0..{MAX_MIB} (MiB)\""),  # a huge budget taken
    ("PR7", F, "is_int = lambda v: isinstance(v, int) and not isinstance(v, bool)", "is_int = lambda v: isinstance(v, int)"),  # true taken as 1
    ("PR8", F, "need(k, lambda v: is_int(v) and 2 <= v <= MAX_TOKENS", "need(k, lambda v: is_int(v) and 1 <= v <= MAX_TOKENS"),  # a context of 1
    ("PR9", F, "need(k, lambda v: is_int(v) and 2 <= v <= MAX_TOKENS", "need(k, lambda v: is_int(v) and 2 <= v"),  # a context past 16M
    ("PR10", F, 'need("prefill_chunk", lambda v: is_int(v) and 0 < v <= MAX_TOKENS', 'need("prefill_chunk", lambda v: is_int(v) and 0 <= v <= MAX_TOKENS'),  # chunk 0
    ("PR11", F, 'need("max_draft_tokens", lambda v: is_int(v) and 1 <= v <= MAX_DRAFT', 'need("max_draft_tokens", lambda v: is_int(v) and 0 <= v <= MAX_DRAFT'),  # max draft 0
    ("PR12", F, 'need("max_draft_tokens", lambda v: is_int(v) and 1 <= v <= MAX_DRAFT', 'need("max_draft_tokens", lambda v: is_int(v) and 1 <= v <= MAX_DRAFT + 1'),  # 65 taken
    ("PR13", F, 'need("threads", lambda v: is_int(v) and v >= 0', 'need("threads", lambda v: is_int(v)'),  # negative threads
    ("PR14", F, 'need("prompt_cache_mb", lambda v: is_int(v) and 0 <= v <= MAX_MIB', 'need("prompt_cache_mb", lambda v: is_int(v) and 0 < v <= MAX_MIB'),  # prompt_cache_mb 0 refused
    ("PR15", F, 'need("draft_tokens", lambda v: is_int(v) and 0 <= v <= MAX_DRAFT', 'need("draft_tokens", lambda v: is_int(v) and 0 <= v'),  # draft_tokens 1000 taken
    ("PR16", F, 'need("kv_dtype", lambda v: v in ("auto", "float16", "float32", "int8")', 'need("kv_dtype", lambda v: v in ("auto", "float16", "float32", "int8", "bfloat16")'),  # bfloat16 taken
    ("PR17", F, 'need("drafter", lambda v: v in PROFILE_DRAFTERS', 'need("drafter", lambda v: isinstance(v, str)'),  # any drafter name
    ("PR18", F, 'need("providers", lambda v: isinstance(v, list) and v and all(', 'need("providers", lambda v: isinstance(v, list) and all('),  # providers = []
    ("PR19", F, "all(p in PROVIDER_NAMES for p in v),", "all(isinstance(p, str) for p in v),"),  # an unknown provider
    ("PR20", F, "isinstance(v, dict) and all(isinstance(x, dict) for x in v.values()),\n         \"a table of tables\")", "isinstance(v, dict),\n         \"a table of tables\")"),  # provider_options.cuda = 1
    ("PR21", F, "        if prov not in PROVIDER_NAMES:\n            raise", "        if False:\n            raise"),  # provider_options for a made-up provider
    ("PR22", F, '        if prov == "cpu" and opts:', '        if prov == "cpu" and False:'),  # cpu options silently ignored
    ("PR23", F, "            if not isinstance(v, (str, int, float, bool)):\n                raise", "            if False:\n                raise"),  # an option that is a list
    ("PR24", F, "if k in _BYTE_OPTIONS and not (is_int(v) and v > 0):", "if k in _BYTE_OPTIONS and not is_int(v):"),  # gpu_mem_limit 0
    ("PR25", F, '_BYTE_OPTIONS = ("gpu_mem_limit", "trt_max_workspace_size")', '_BYTE_OPTIONS = ("gpu_mem_limit",)'),  # trt workspace "1GB" taken
    ("PR26", F, "isinstance(k, str) and 0 < len(k) <= 1024 and isinstance(x, (str, int, float, bool))", "isinstance(k, str) and isinstance(x, (str, int, float, bool))"),  # an empty or huge key
    ("PR27", F, "isinstance(k, str) and 0 < len(k) <= 1024 and isinstance(x, (str, int, float, bool))", "isinstance(k, str) and 0 < len(k) <= 1024"),  # a table value
    ("PR28", F, '        need(k, lambda v: isinstance(v, str), "a string")', '        pass'),  # description = 3
    ("PR29", F, 'need("drafter_provider", lambda v: v in PROVIDER_NAMES', 'need("drafter_provider", lambda v: isinstance(v, str)'),  # drafter_provider "gpu"
    ("PR30", F, 'need("allow_cpu_fallback", lambda v: isinstance(v, bool)', 'need("allow_cpu_fallback", lambda v: True'),  # "yes" taken (truthy)
    ("PR31", F, '        vals["providers"] = tuple(vals["providers"])', '        pass'),  # providers kept a list (Profile not hashable / compares)
    ("PR32", F, '        vals["min_context"] = min(MIN_CONTEXT, vals["max_context"])', '        vals["min_context"] = MIN_CONTEXT'),  # max_context 256 without min_context: refused
    ("PR33", F, 'if vals.get("min_context", MIN_CONTEXT) > vals.get("max_context", 4096):', 'if vals.get("min_context", MIN_CONTEXT) > vals.get("max_context", 4096) + 1:'),  # min one past max taken
    ("PR34", F, "            raw = f.read(_PROFILE_LIMIT + 1)\n        if len(raw) > _PROFILE_LIMIT:", "            raw = f.read()\n        if len(raw) > _PROFILE_LIMIT:"),  # unbounded read (/dev/zero hangs)
    ("PR35", F, '        if len(raw) > _PROFILE_LIMIT:\n            raise', '        if False:\n            raise'),  # a huge file read as TOML
    ("PR36", F, '    except RecursionError:\n        raise ProfileError(f"{p}: not valid TOML (nested too deeply)") from None\n', ''),  # deep nesting: RecursionError out
    ("PR37", F, '    except UnicodeDecodeError:\n        raise ProfileError(f"{p}: not a text (UTF-8) file") from None\n', ''),  # binary: ValueError's branch (message differs)
    ("PR38", F, '    except OSError as e:  # a directory, no permission, ...\n        raise ProfileError(f"cannot read profile {p}: {e.strerror or e}") from None\n', ''),  # a directory: IsADirectoryError out
    ("PR39", F, "    return _check(p.stem, data, str(p))", "    return _check(p.name, data, str(p))"),  # name "x.toml" not "x"
    ("PR40", F, "            if f.stem not in seen:", "            if True:"),  # the packaged copy overrides the first of a name
    ("PR41", F, "                    seen[f.stem] = None\n", "                    pass\n"),  # a broken profile: the packaged one of its name shown instead
    ("PR42", F, "    return [p for p in seen.values() if p is not None]", "    return [p for p in seen.values()]"),  # None in the list
    ("PR43", F, "    except (ProviderError, AttributeError):  # (not a provider: _check names it)\n        return name", "    except (AttributeError,):  # (not a provider: _check names it)\n        return name"),  # a made-up provider in a Python Profile: ProviderError not ProfileError
    ("PR44", F, '        values = {k: v for k, v in asdict(profile).items() if k != "name" and v is not None}', '        values = {k: v for k, v in asdict(profile).items() if k != "name"}'),  # draft_tokens None refused
    ("PR45", F, '            values["providers"] = [_short_name(p) for p in values["providers"]]', '            values["providers"] = list(values["providers"])'),  # CUDAExecutionProvider refused in Python
    ("PR46", F, '            values["drafter_provider"] = _short_name(values["drafter_provider"])', '            pass'),  # drafter_provider long name refused
    ("PR47", F, '        if values.get("min_context") == MIN_CONTEXT:', '        if False:'),  # Profile(max_context=256) in Python refused
    ("PR48", F, '        _check(profile.name, values, f"profile {profile.name!r}")\n        return profile', '        return profile'),  # a Python Profile unchecked
    ("PR49", F, '    if s.endswith(".toml") or os.sep in s:', '    if s.endswith(".toml"):'),  # a path without .toml looked up as a name
    ("PR50", F, "        return load_profile(os.path.expanduser(s))", "        return load_profile(s)"),  # ~ not expanded
    ("PR51", F, "    if s == DEFAULT_PROFILE.name:", "    if False:"),  # --profile default refused
    ("PR52", F, '    raise ProfileError(f"unknown profile {s!r}; known: {names or \'none\'} (or give a .toml path)")', '    return DEFAULT_PROFILE'),  # a mistyped name silently the default
    ("PR53", F, "    for d in profile_dirs():\n        f = d / f\"{s}.toml\"\n        if f.is_file():", "    for d in profile_dirs()[::-1]:\n        f = d / f\"{s}.toml\"\n        if f.is_file():"),  # packaged before the repo's
    ("PR54", F, "        if prov == \"cpu\" and opts:  # onnxruntime's CPU provider would ignore them silently\n            raise ProfileError(f\"{where}: provider_options.cpu.{sorted(opts)[0]}", "        if prov == \"cpu\" and opts:  # onnxruntime's CPU provider would ignore them silently\n            raise ProviderError(f\"{where}: provider_options.cpu.{sorted(opts)[0]}"),  # wrong error type
]
