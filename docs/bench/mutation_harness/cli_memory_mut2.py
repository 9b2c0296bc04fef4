"""Session 98: a second pass over edgespec/cli_memory.py (session 83's first pass: C1-C21, mutation_s83.md).
CM1-CM16, run against the memory tests of tests/test_suffix.py, test_hardening.py and test_errors.py."""
P = "edgespec/cli_memory.py"
MUTANTS = [
    ("CM1", P, "            kw.pop(name, None)", "            pass"),  # load-only options passed to the command
    ("CM2", P, 'flag = "--memory/--no-memory"', 'flag = "--no-memory/--memory"'),  # the flag's sense inverted
    ("CM3", P, 'out["memory"] = bool(params["use_memory"])', 'out["memory"] = True'),  # --no-memory ignored
    ("CM4", P, 'if params.get("documents"):', "if False:"),  # --documents never passed
    ("CM5", P, '"file_bytes": 0, "error": None, "other_stores": len(others)}',
     '"file_bytes": 0, "error": None, "other_stores": 0}'),  # other stores never counted
    ("CM6", P, 'info["file_bytes"] = path.stat().st_size', 'info["file_bytes"] = 0'),
    ("CM7", P, "recallable=sum(1 for g in sigs if g.shape[0]))", "recallable=len(sigs))"),
    ("CM8", P, "kept = isinstance(e, KeptStoreError)", "kept = False"),  # a kept store said to be set aside
    ("CM9", P, 'click.echo("  empty (no store file)")', 'click.echo("  0 outputs")'),
    ("CM10", P, "f\"{info['file_bytes'] / 1024:.1f} KiB on disk;", "f\"{info['file_bytes']} KiB on disk;"),
    ("CM11", P, "    _others(others)\n\n\n@memory.command", "\n\n@memory.command"),  # show names no other store
    ("CM12", P, 'raise ConfigError("memory clear takes a bundle or --all, not both")', "pass"),
    ("CM13", P, "        if failed:  # (the others", "        if False:  # (the others"),  # a failed delete exits 0
    ("CM14", P, 'more = f" (and {len(failed) - 1} more store(s) not deleted)" if len(failed) > 1 else ""',
     'more = ""'),
    ("CM15", P, 'raise ConfigError("memory clear needs a bundle (or --all for every bundle\'s memory)")', "return"),
    ("CM16", P, "    _others(other_stores(m))\n", "\n"),  # clear names no other store
]
