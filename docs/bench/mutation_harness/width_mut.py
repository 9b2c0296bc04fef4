"""Mutants of edgespec/width.py (session 95): a second pass after session 72's 20, over the probe's choice of policy
(the candidates' order, the groups each allows, the bound on the widest call), padded_width and width_invariant.
Run from the copy:  python run.py width_mut.py tests/test_exactness.py --k "not smollm2 and not wide_calls"
"""
W = "edgespec/width.py"
MUTANTS = [
    ("WD1", W, "    w = max(int(n), int(min_width))\n", "    w = int(n)\n"),  # min_width ignored
    ("WD2", W, "    return -(-w // int(multiple)) * int(multiple)", "    return (w // int(multiple)) * int(multiple)"),  # rounded down
    ("WD3", W, 'WIDTH_DEPENDENT_OPS = ("MatMulNBits", "MatMul")', 'WIDTH_DEPENDENT_OPS = ("MatMulNBits",)'),  # a plain MatMul left beside the kernels
    ("WD4", W, '    return lm.device == "cpu" and width_invariant_spec(lm.spec)', '    return width_invariant_spec(lm.spec)'),  # a GPU taken as invariant
    ("WD5", W, '    return getattr(spec, "kernels", None) == "edgespec-q4" and not any(ops.get(op) for op in WIDTH_DEPENDENT_OPS)', '    return getattr(spec, "kernels", None) == "edgespec-q4"'),  # ops ignored
    ("WD6", W, "    cands = {(w, 1) for w in widths} | {(2, 2), (4, 2), (4, 4)}", "    cands = {(w, 1) for w in widths} | {(2, 2)}"),  # (4, 2) and (4, 4) never tried
    ("WD7", W, "    return sorted(cands, key=lambda c: (padded_width(1, *c), sum(padded_width(n, *c) for n in range(1, top + 1)),\n                                        c))", "    return sorted(cands, key=lambda c: (sum(padded_width(n, *c) for n in range(1, top + 1)), c))"),  # the one-token price not first
    ("WD8", W, "        widths = widths if len(widths) >= 2 else PROBE_WIDTHS", "        pass"),  # a window with room for one width
    ("WD9", W, "    if lm.max_context < need:", "    if lm.max_context < need - 1:"),  # probe one past the window
    ("WD10", W, "            lm.verified_width = GPU_MIN_VERIFIED\n        return width_policy(lm.device)  # too small", "            pass\n        return width_policy(lm.device)  # too small"),  # small window: unbounded
    ("WD11", W, "        took[2] = min(took.get(2, np.inf), time.perf_counter() - t)", "        took[2] = time.perf_counter() - t"),  # speed only (timing)
    ("WD12", W, "    if not np.array_equal(again, rows[2]):", "    if False:"),  # a call that does not reproduce: trusted
    ("WD13", W, "        group = [w for w in ws if w >= min_width and w % multiple == 0]", "        group = [w for w in ws if w >= min_width]"),  # multiple ignored
    ("WD14", W, "        tops = (sorted((w for w in group if w >= min(GPU_MIN_VERIFIED, ws[-2])), reverse=True) if bounded\n                else group[-1:])", "        tops = (sorted((w for w in group if w >= min(GPU_MIN_VERIFIED, ws[-2]))) if bounded\n                else group[-1:])"),  # the narrowest bound first
    ("WD15", W, "            ref = next((w for w in group if w > top), None) if bounded else top", "            ref = top"),  # bounded: compared with its own rows (MLAS' last row)
    ("WD16", W, "            if len(upto) >= 2 and all(", "            if len(upto) >= 1 and all("),  # a group of one width
    ("WD17", W, "                    min_width > 1 or ar_rows is None or np.array_equal(ar_rows[:top], rows[top])):", "                    True):"),  # GPU one-token calls unchecked
    ("WD18", W, "                if not gpu and min_width == 1 and bounded:", "                if not gpu and min_width == 1:"),  # edgespec kernels forced to 2
    ("WD19", W, "                    return 2, multiple", "                    return 1, multiple"),  # ort CPU one-token calls allowed
    ("WD20", W, "        lm.verified_width = ws[-1]\n    return ws[-1], 1", "        lm.verified_width = None\n    return ws[-1], 1"),  # nothing agrees: unbounded
    ("WD21", W, "    return ws[-1], 1\n", "    return 1, 1\n"),  # nothing agrees: one-token calls
    ("WD22", W, '    return (2, 1) if device == "cpu" else (1, 1)', '    return (1, 1)'),  # the CPU fallback without its 2
]
