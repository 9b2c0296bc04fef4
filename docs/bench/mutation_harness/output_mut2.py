# session 99: export/output.py, a second pass (O2_): lines and behaviours session 86's O1-O56 left alone (and the
# SIGHUP/raise_if_terminated code added since)
O = "export/output.py"
MUTANTS = [
# check_output
("O2_1", O, "    given = Path(out).expanduser()\n    resolved = resolved_path(given, ExportError)", "    given = Path(out)\n    resolved = resolved_path(given, ExportError)"),
("O2_2", O, "    if given.is_symlink() and not resolved.exists():  # (a link to nothing", "    if given.is_symlink():  # (a link to nothing"),
("O2_3", O, "        what = \"a directory\" if resolved.is_dir() else \"a file\"", "        what = \"a file\" if resolved.is_dir() else \"a directory\""),
("O2_4", O, "        if src and Path(src).expanduser().exists():\n            p = Path(src).expanduser().resolve()", "        if src and Path(src).expanduser().exists():\n            p = Path(src).resolve()"),
# restore_stale_old
("O2_5", O, "    pattern = re.compile(rf\"\\.{re.escape(out.name)}\\.old-(\\d+)\")", "    pattern = re.compile(rf\"\\.{out.name}\\.old-(\\d+)\")"),
("O2_6", O, "        m = pattern.fullmatch(p.name)\n        if m and int(m.group(1))", "        m = pattern.match(p.name)\n        if m and int(m.group(1))"),
# rewriting
("O2_7", O, "    exclusive = rewrites_in_place(path, out)", "    exclusive = out is None"),
("O2_8", O, "doing = \"rewritten or copied by another edgespec rewrite\" if exclusive else", "doing = \"rewritten or copied by another edgespec rewrite\" if not exclusive else"),
("O2_9", O, "    path = Path(bundle).expanduser()\n    exclusive", "    path = Path(bundle)\n    exclusive"),
# _whole_bundle
("O2_10", O, "    try:\n        load_manifest(p)\n    except (EdgespecError, OSError, ValueError):\n        return False", "    try:\n        pass\n    except (EdgespecError, OSError, ValueError):\n        return False"),
("O2_11", O, "    except (EdgespecError, OSError, ValueError):\n        return False\n    return True", "    except EdgespecError:\n        return False\n    return True"),
# _in_mountinfo
("O2_12", O, "points = {line.split(\" \")[4] for line in f", "points = {line.split(\" \")[3] for line in f"),
# _probe, prepare_stage
("O2_13", O, "    except OSError as e:\n        raise ExportError(f\"cannot write the bundle at {out}: {e.strerror or e}\") from None\n\n\ndef missing", "    except FileNotFoundError as e:\n        raise ExportError(f\"cannot write the bundle at {out}: {e.strerror or e}\") from None\n\n\ndef missing"),
("O2_14", O, "    except OSError as e:\n        raise ExportError(f\"cannot write the bundle at {out}: {e.strerror or e}\") from None\n    return stage", "    except FileNotFoundError as e:\n        raise ExportError(f\"cannot write the bundle at {out}: {e.strerror or e}\") from None\n    return stage"),
("O2_15", O, "        except OSError:  # (not empty: something else was put there meanwhile; or gone)\n            break", "        except OSError:  # (not empty: something else was put there meanwhile; or gone)\n            raise"),
# _full_disk_error, raise_if_full
("O2_16", O, "    while e is not None and id(e) not in seen:", "    while e is not None:"),
("O2_17", O, "e.errno in (errno.ENOSPC, errno.EDQUOT)", "e.errno == errno.ENOSPC"),
("O2_18", O, "        if isinstance(e, NoSpaceError) or (isinstance(e, OSError)", "        if (isinstance(e, OSError)"),
("O2_19", O, "        e = e.__cause__ if e.__cause__ is not None or e.__suppress_context__ else e.__context__", "        e = e.__cause__"),
("O2_20", O, "    if named is not None and not str(named).startswith(str(where)):", "    if named is not None:"),
("O2_21", O, "    if named is not None and not str(named).startswith(str(where)):", "    if False:"),
("O2_22", O, "        left = shutil.disk_usage(near).free", "        left = shutil.disk_usage(where).free"),
("O2_23", O, "raise NoSpaceError(f\"no space left on device while writing {what} in {where}{free}: {kept}\") from e", "raise NoSpaceError(f\"no space left on device while writing {what} in {where}{free}\") from e"),
# publish
("O2_24", O, "    raise_if_terminated()  # (a SIGTERM whose exception was lost: nothing is published)\n", ""),
("O2_25", O, "    if inputs is not None and (out.exists() or out.is_symlink()):", "    if inputs is not None and out.exists():"),
("O2_26", O, "            raise ExportError(f\"{e} (it appeared while the export ran; the new bundle is not written)\") from None", "            raise"),
("O2_27", O, "    old = out.parent / f\".{out.name}.old-{os.getpid()}\" if out.exists() else None", "    old = out.parent / f\".{out.name}.old-{os.getpid()}\" if out.is_dir() else None"),
# remove_replaced
("O2_28", O, "    if path is None:\n        return\n    if threading", "    if threading"),
("O2_29", O, "    before = _take_signals(lambda *a: None)", "    before = {}"),
("O2_30", O, "    try:\n        remove_tree(path)\n    finally:\n        _give_back(before)", "    try:\n        remove_tree(path)\n    finally:\n        pass"),
# _alive, remove_stale
("O2_31", O, "    except PermissionError:  # another user's process\n        return True\n    return True", "    except PermissionError:  # another user's process\n        return True\n    return False"),
("O2_32", O, "pattern = re.compile(rf\"\\.(?:\\.{re.escape(name)}\\.partial-\\d+\\.|{re.escape(name)}\\.)(partial|old)-(\\d+)\")", "pattern = re.compile(rf\"\\.(?:{re.escape(name)}\\.)(partial|old)-(\\d+)\")"),
("O2_33", O, "pattern = re.compile(rf\"\\.(?:\\.{re.escape(name)}\\.partial-\\d+\\.|{re.escape(name)}\\.)(partial|old)-(\\d+)\")", "pattern = re.compile(rf\"\\.(?:\\.{re.escape(name)}\\.partial-\\d+\\.|{re.escape(name)}\\.)(partial)-(\\d+)\")"),
("O2_34", O, "        m = pattern.fullmatch(p.name)\n        if m and int(m.group(2))", "        m = pattern.match(p.name)\n        if m and int(m.group(2))"),
# signals
("O2_35", O, "for n in (\"SIGTERM\", \"SIGHUP\") if hasattr(signal, n))", "for n in (\"SIGTERM\",) if hasattr(signal, n))"),
("O2_36", O, "    if terminated and _guarded:\n", "    if terminated:\n"),
("O2_37", O, "    if terminated and _guarded:\n        raise Terminated(128 + signum)", "    if terminated and _guarded:\n        raise Terminated(128 + signal.SIGTERM)"),
("O2_38", O, "        terminated, signum = True, sig\n", "        terminated = True\n"),
("O2_39", O, "        raise Terminated(128 + sig)\n", "        raise Terminated(128 + signal.SIGTERM)\n"),
("O2_40", O, "    _guarded += 1\n", ""),
("O2_41", O, "        _guarded -= 1\n", ""),
("O2_42", O, "        _guarded -= 1\n        _give_back(old)", "        _guarded -= 1"),
("O2_43", O, "            if sig == signal.SIGTERM or signal.getsignal(sig) != signal.SIG_IGN}", "            }"),
("O2_44", O, "and not _alive(int(m.group(2))) and p.is_dir() \\\n                and not p.is_symlink():", "and not _alive(int(m.group(2))) \\\n                and not p.is_symlink():"),
# load_graph
("O2_45", O, "        return onnx.load(str(model_path), load_external_data=False)", "        return onnx.load(str(model_path))"),
("O2_46", O, "{str(e).splitlines()[0] if str(e) else 'not an ONNX model'}", "{str(e) if str(e) else 'not an ONNX model'}"),
]
