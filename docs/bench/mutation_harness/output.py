# session 86: export/output.py (O)
O = "export/output.py"
MUTANTS = [
# check_output
("O1", O, "    if not (given.exists() or given.is_symlink()):\n        _probe(resolved)", "    if not given.exists():\n        _probe(resolved)"),
("O2", O, "    restore_stale_old(resolved)\n    if not (given", "    if not (given"),
("O3", O, "        _probe(resolved)\n        return resolved", "        return resolved"),
("O4", O, "    if not force:\n        raise", "    if False:\n        raise"),
("O5", O, "    if given.is_symlink():\n        raise ExportError(f\"{given} is a symlink; --force", "    if False:\n        raise ExportError(f\"{given} is a symlink; --force"),
("O6", O, "if not resolved.is_dir() or not (resolved / MANIFEST_NAME).is_file():", "if not resolved.is_dir():"),
("O7", O, "    check_not_mount(resolved)\n    cwd", "    cwd"),
("O8", O, "if cwd == resolved or resolved in cwd.parents:", "if cwd == resolved:"),
("O9", O, "if p == resolved or resolved in p.parents:", "if resolved in p.parents:"),
# restore_stale_old
("O10", O, "int(m.group(1)) != os.getpid() and not _alive(int(m.group(1)))", "not _alive(int(m.group(1)))"),
("O11", O, "int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))) and _whole_bundle(p)", "int(m.group(1)) != os.getpid() and _whole_bundle(p)"),
("O12", O, "not _alive(int(m.group(1))) and _whole_bundle(p):", "not _alive(int(m.group(1))):"),
("O13", O, "            return out\n    return None", "            return None\n    return None"),
("O14", O, "return sorted(parent.iterdir(), key=lambda q: -mtime(q))", "return sorted(parent.iterdir(), key=lambda q: mtime(q))"),
# rewrites_in_place, rewriting
("O15", O, "return out is None or Path(out).expanduser().resolve() == Path(bundle).expanduser().resolve()", "return out is None"),
("O16", O, "    restore_stale_old(path.resolve())\n    try:", "    try:"),
("O17", O, "(fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)", "(fcntl.LOCK_SH if exclusive else fcntl.LOCK_EX)"),
("O18", O, "if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):", "if True:"),
("O19", O, "    finally:\n        os.close(fd)", "    finally:\n        pass"),
("O20", O, "    except OSError:  # (no such folder, not one: load_manifest says so, as everywhere)\n        yield\n        return", "    except FileExistsError:\n        yield\n        return"),
# _whole_bundle
("O21", O, "if not p.is_dir() or p.is_symlink() or not (p / MANIFEST_NAME).is_file():", "if not p.is_dir() or not (p / MANIFEST_NAME).is_file():"),
# check_not_mount, _in_mountinfo
("O22", O, "if os.path.ismount(bundle) or _in_mountinfo(bundle):", "if _in_mountinfo(bundle):"),
("O23", O, "return str(path) in {unescape(x) for x in points}", "return str(path) in points"),
("O24", O, "    except OSError:\n        return False\n    unescape", "    except OSError:\n        return True\n    unescape"),
# _probe
("O25", O, "    if up.exists() and not up.is_dir():\n        raise ExportError(f\"cannot write the bundle at {out}: {up} is a file, not a directory\")\n", ""),
("O26", O, "os.rmdir(tempfile.mkdtemp(prefix=f\".{out.name}.probe-\", dir=up))", "tempfile.mkdtemp(prefix=f\".{out.name}.probe-\", dir=up)"),
# missing_parents, remove_parents, remove_tree
("O27", O, "return [p for p in out.parents if not p.exists()]", "return [p for p in out.parents if not p.exists()][:1]"),
("O28", O, "    for p in parents:\n        try:\n            p.rmdir()", "    for p in reversed(parents):\n        try:\n            p.rmdir()"),
("O29", O, "            os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR | stat.S_IXUSR)\n", ""),
# prepare_stage
("O30", O, "        remove_stale(out.parent, out.name)\n", ""),
("O31", O, "        if stage.exists():\n            shutil.rmtree(stage)\n", ""),
("O32", O, "out.parent.mkdir(parents=True, exist_ok=True)", "out.parent.mkdir(exist_ok=True)"),
# _full_disk_error, raise_if_full
("O33", O, ' or "Disk quota exceeded" in str(e):', ":"),
("O34", O, "e = e.__cause__ if e.__cause__ is not None or e.__suppress_context__ else e.__context__", "e = e.__cause__ if e.__cause__ is not None else e.__context__"),
("O35", O, "    if not isinstance(e, Exception):\n        return\n", ""),
("O36", O, "if left >= 1 << 20 else", "if left >= 1 << 30 else"),
("O37", O, "    while not near.exists() and near.parent != near:  # (its folders made for it are gone again by now)\n        near = near.parent\n", ""),
# publish
("O38", O, "            check_output(out, force, inputs)", "            check_output(out, True, inputs)"),
("O39", O, "    if old is not None and (old.exists() or old.is_symlink()):  # (this process's earlier one, not yet removed)\n        remove_tree(old)\n", ""),
("O40", O, "    except OSError as e:\n        if old is not None and old.exists() and not out.exists():\n            old.rename(out)\n", "    except OSError as e:\n"),
("O41", O, "        if old is None and e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):", "        if False:"),
("O42", O, "    except BaseException:\n        if old is not None and old.exists() and not out.exists():\n            old.rename(out)\n", "    except BaseException:\n"),
# remove_replaced
("O43", O, "    before = signal.signal(signal.SIGTERM, lambda *a: None)", "    before = signal.signal(signal.SIGTERM, signal.getsignal(signal.SIGTERM))"),
("O44", O, "    finally:\n        signal.signal(signal.SIGTERM, before)", "    finally:\n        pass"),
("O45", O, "    if threading.current_thread() is not threading.main_thread():\n        remove_tree(path)\n        return\n", ""),
# _alive, remove_stale
("O46", O, "    except PermissionError:  # another user's process\n        return True", "    except PermissionError:  # another user's process\n        return False"),
("O47", O, "    restore_stale_old(parent / name)\n    pattern", "    pattern"),
("O48", O, "int(m.group(2)) != os.getpid() and not _alive(int(m.group(2))) and p.is_dir()", "int(m.group(2)) != os.getpid() and p.is_dir()"),
("O49", O, "and p.is_dir() \\\n                and not p.is_symlink():", "and p.is_dir():"),
# terminate_cleanly, load_graph
("O50", O, "raise Terminated(128 + signal.SIGTERM)", "raise Terminated(1)"),
("O51", O, "    terminated = False  # (this export's", "    pass  # (this export's"),
("O52", O, "        terminated = True  # (raised inside", "        pass  # (raised inside"),
("O53", O, "        for proc in list(RUNNING):  # the model builder, a process of its own, stops too\n            proc.kill()\n", ""),
("O54", O, "    finally:\n        signal.signal(signal.SIGTERM, old)", "    finally:\n        pass"),
("O55", O, "    if threading.current_thread() is not threading.main_thread():\n        yield\n        return\n", ""),
("O56", O, "    except OSError:\n        raise\n    except Exception", "    except Exception"),
]
