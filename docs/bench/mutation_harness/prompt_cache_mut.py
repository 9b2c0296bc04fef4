"""Mutants of edgespec/prompt_cache.py (a second pass after session 68's 46): _Entry (its bytes, usable, restores),
PromptCache (the budget check, min_tokens, stats, clear, row_bytes, match's ties, save's cut, its dedup and
extension rules, the LRU eviction within the budget and the kept entry, restore's have and counters, before_prefill's
boundaries), engine_key (the CPU's instruction sets, the session options' order, KV_COMPAT, kv_shapes, conv),
write_file (_merged's order and budget, a damaged file replaced, the temporary removed, the version written, the
mode kept), _read_member and read_file's checks (the header's size, format, key, lengths, conv starts, fortran order,
shapes, truncation, finiteness, the budget and the LRU order read back), remove_stale_temporaries. Written by a
helper session.
Run from the copy:  MUT_RESULTS=/tmp/mutw2/results.txt python run.py prompt_cache_mut.py tests/test_prompt_cache.py
  --k "not smollm2"   (PC1-PC27 ran with it: its fixture exports SmolLM2 from the GGUF in a copy without bundles/;
  ~35-110 s a survivor on 2 shared cores). Survivors rerun wider: tests/test_chat.py tests/test_api.py
  tests/test_hardening.py tests/test_logprobs.py --k "(prompt_cache or cache) and not smol" (~30 s; test_server.py
  left out: its fixture exports SmolLM2), the conv ones tests/test_conv.py --k "prompt_cache or kept or snapshot or
  set_aside" (~45 s), PC52 tests/test_archs.py --k gemma4_e2b_int4_decodes_exactly.
Caught by test_prompt_cache.py: PC1, PC5, PC7, PC11, PC16, PC17, PC19, PC23, PC30-PC34, PC37, PC40, PC41, PC45, PC51,
PC57, PC59, PC60, PC64, PC69, PC77, PC80, PC82 (26); wider: PC4, PC53, PC74 (test_conv), PC52 (test_archs).
Equivalent: PC20 (refused again under the lock), PC39 (the common prefix with e.ids[:n] is at most n), PC68 (still a
StoreError: numpy's reshape error, "unreadable"), PC73 (a negative length fails the starts check, 0 <= s <= n), PC81
(written follows version either way). Speed only: PC12. Unreachable through the engine (pinned anyway): PC8
(min_tokens is always 16), PC13 (a (key, 0) is never restored), PC15 (a GPU target has no prompt cache), PC35 (a
prompt never passes max_len), PC36 (match has dropped unusable matches), PC38 (before_prefill's have is the cache's
own prefix), PC10 (reset sets written itself), PC61 (one write per engine), PC63, PC84 (return values no caller
reads). Real gaps (38): PC2, PC3, PC6, PC9, PC14, PC18, PC21, PC22, PC24-PC29, PC42-PC44, PC46-PC50, PC54-PC56, PC58,
PC62, PC65-PC67, PC70-PC72, PC75, PC76, PC78, PC79, PC83. The gap tests (tests/test_prompt_cache_mutants.py; PC65-PC67,
PC70, PC71 as cases of test_prompt_cache.py's damaged-file test) catch every survivor but the equivalent and
speed-only ones, in ~3 s a mutant."""
F = "edgespec/prompt_cache.py"
MUTANTS = [
    # -- _Entry
    ("PC1", F, "sum(r.nbytes for r in self.rows) + self.ids.nbytes + (", "sum(r.nbytes for r in self.rows) + ("),  # an entry's ids not counted in its bytes (stats, budget)
    ("PC2", F, "self.ids.nbytes + (self.conv.nbytes if self.conv else 0)", "self.ids.nbytes"),  # a conv entry's states not counted in its bytes
    ("PC3", F, "return m if self.conv is None or m >= self.conv.start else 0", "return m if self.conv is None or m > self.conv.start else 0"),  # a match exactly at the conv start unusable
    ("PC4", F, "return m if self.conv is None or m >= self.conv.start else 0", "return m"),  # a conv match before the states' start usable
    ("PC5", F, "return self.ids.size >= n and self.usable(n) == n", "return self.ids.size > n and self.usable(n) == n"),  # an entry of exactly these ids does not hold them: stored twice
    ("PC6", F, "return self.ids.size >= n and self.usable(n) == n and", "return self.ids.size >= n and"),  # a conv entry that cannot restore ids counted as holding them
    # -- PromptCache.__init__, stats, clear, row_bytes
    ("PC7", F, "        if budget < 0:\n", "        if budget < -1:\n"),  # a budget of -1 accepted
    ("PC8", F, "self.min_tokens = max(1, int(min_tokens))", "self.min_tokens = int(min_tokens)"),  # min_tokens 0: an empty sequence saved
    ("PC9", F, "\"tokens\": int(sum(e.ids.size for e in self._entries.values()))", "\"tokens\": len(self._entries)"),  # stats' tokens the entries' count
    ("PC10", F, "            self._entries.clear()\n            self.version += 1", "            self._entries.clear()"),  # a clear not a change: its file not rewritten
    ("PC11", F, "return sum(a.shape[1] * a.shape[3] * a.itemsize for a in cache.host)", "return sum(a.shape[1] * a.shape[3] for a in cache.host)"),  # row bytes without the item size
    # -- match
    ("PC12", F, "                if min(e.ids.size, ids.size) <= best_n:\n                    continue\n", ""),  # expected speed only: every entry compared
    ("PC13", F, "                if m > best_n:\n", "                if m >= best_n:\n"),  # a tie (0 too) taken by a later entry: (key, 0), not (None, 0)
    ("PC14", F, "m = e.usable(common_prefix(e.ids, ids))", "m = common_prefix(e.ids, ids)"),  # a conv entry's unusable match taken
    # -- save
    ("PC15", F, "        if not cache.host:\n            return False\n", ""),  # a GPU cache (no host buffers) saved: ids without rows
    ("PC16", F, "per = self.row_bytes(cache) + 8  # (+ the id)", "per = self.row_bytes(cache)  # (+ the id)"),  # the ids' bytes not in the cut: over budget
    ("PC17", F, "left = self.budget - (kept.nbytes if kept is not None else 0) - (snap", "left = self.budget - (snap"),  # the kept entry's bytes not left aside: over budget
    ("PC18", F, "(kept.nbytes if kept is not None else 0) - (snap.nbytes if snap else 0)", "(kept.nbytes if kept is not None else 0)"),  # a conv snapshot's bytes not left aside
    ("PC19", F, "n = min(n, left // per)  # its first rows at most", "n = min(n, left // per + 1)  # its first rows at most"),  # one row past the budget
    ("PC20", F, "        if conv is not None and snap is None:\n            return False\n        with", "        with"),  # expected equivalent: refused below too
    ("PC21", F, "            if n < self.min_tokens or (conv", "            if n <= self.min_tokens or (conv"),  # exactly min_tokens not kept
    ("PC22", F, "            if n < self.min_tokens or (conv is not None and snap is None):", "            if n < self.min_tokens:"),  # a conv cache cut before its states kept without them
    ("PC23", F, "            ids = ids[:n]\n", ""),  # a cut entry's ids longer than its rows
    ("PC24", F, "                    self._entries.move_to_end(key)\n                    return False", "                    return False"),  # a sequence kept again not made recent
    ("PC25", F, "                if (e.ids.size < n and key != keep and", "                if (e.ids.size < n and"),  # an extension deletes the entry about to be restored
    ("PC26", F, "and (snap is None or e.ids.size >= snap.start)", ""),  # a conv entry the new one cannot restore deleted
    ("PC27", F, "                        and np.array_equal(ids[: e.ids.size], e.ids)):", "                        ):"),  # any shorter entry deleted, not only a prefix
    ("PC28", F, "                if used + need <= self.budget:", "                if used + need < self.budget:"),  # an exact fit evicts one more
    ("PC29", F, "for key in [k for k in self._entries if k != keep]:  # least", "for key in list(self._entries):  # least"),  # the entry to be restored evicted
    ("PC30", F, "for key in [k for k in self._entries if k != keep]:  # least", "for key in [k for k in reversed(self._entries) if k != keep]:  # least"),  # most recently used evicted first
    ("PC31", F, "                used -= self._entries.pop(key).nbytes\n                self.evictions += 1", "                used -= self._entries.pop(key).nbytes"),  # evictions not counted
    ("PC32", F, "rows = [a[0, :, :n].copy() for a in cache.host]", "rows = [a[0, :, :n] for a in cache.host]"),  # a kept copy a view of the live cache
    ("PC33", F, "self._entries[self._key] = _Entry(ids.copy(), rows, snap)", "self._entries[self._key] = _Entry(ids, rows, snap)"),  # the entry's ids a view of the live ids
    ("PC34", F, "            self.saves += 1\n            self.version += 1\n", "            self.saves += 1\n"),  # a save not a change: its file not rewritten
    # -- restore
    ("PC35", F, "            n = min(n, e.ids.size, cache.max_len)", "            n = min(n, e.ids.size)"),  # a restore past the cache's length
    ("PC36", F, "            if e.usable(n) != n:\n                return 0\n", ""),  # a conv entry restored before its states' start
    ("PC37", F, "            self._entries.move_to_end(key)\n            # the ids", "            # the ids"),  # a restored entry not made recent
    ("PC38", F, "have = min(have, n, cache.ids.common_prefix(e.ids[:n]))", "have = min(have, n)"),  # rows the cache does not share with the entry kept
    ("PC39", F, "have = min(have, n, cache.ids.common_prefix(e.ids[:n]))", "have = min(have, cache.ids.common_prefix(e.ids[:n]))"),  # have past n: ids past the restore kept
    ("PC40", F, "self.restored_tokens += max(0, n - have)", "self.restored_tokens += n"),  # restored tokens count what the cache held
    ("PC41", F, "                a[0, :, have:n] = r[:, have:n]", "                a[0, :, have + 1:n] = r[:, have + 1:n]"),  # the first restored row not copied
    # -- before_prefill
    ("PC42", F, "restore = key is not None and m >= common + self.min_tokens", "restore = key is not None and m > common + self.min_tokens"),  # a gain of exactly min_tokens not restored
    ("PC43", F, "if cache.length - common >= self.min_tokens:", "if cache.length - common > self.min_tokens:"),  # exactly min_tokens about to be overwritten not kept
    ("PC44", F, "self.save(cache, keep=key if restore else None)", "self.save(cache, keep=key)"),  # a key protected (and its bytes set aside) though not restored
    ("PC45", F, "self.save(cache, keep=key if restore else None)", "self.save(cache, keep=None)"),  # keeping the live chat may evict the one restored
    # -- engine_key, _cpu_isa
    ("PC46", F, "flags = {f for f in _cpu_flags() or () if any(x in f for x in _ISA)}", "flags = {f for f in _cpu_flags() or () if all(x in f for x in _ISA)}"),  # the CPU's instruction sets not in the key
    ("PC47", F, "    return platform.machine() + \" \" + \" \".join(sorted(flags))", "    return platform.machine() + \" \" + \" \".join(flags)"),  # the key's CPU part in a set's order (a per-process hash)
    ("PC48", F, "            \"cpu\": h(_cpu_isa()), ", "            "),  # another CPU's rows read
    ("PC49", F, "\"kernels\": kernels, \"compat\": KV_COMPAT,", "\"kernels\": kernels,"),  # a file from before a KV_COMPAT bump read
    ("PC50", F, "json.dumps(session_options or {}, sort_keys=True, default=str)", "json.dumps(session_options or {}, default=str)"),  # the same options in another order: another engine
    ("PC51", F, "        kernels = f\"edgespec-q4 {source_tag()} {isa()}\"", "        kernels = f\"edgespec-q4 {source_tag()}\""),  # the kernels' ISA path not in the key
    ("PC52", F, "**({\"kv_shapes\": shapes} if any(x != shapes[0] for x in shapes) else {}),", "**({\"kv_shapes\": shapes} if False else {}),"),  # buffers of other shapes written as one member
    ("PC53", F, "[[int(cl.channels), int(cl.past.shape[2])] for cl in cache.conv.layers]", "[[int(cl.channels), int(cl.past.shape[1])] for cl in cache.conv.layers]"),  # the conv key's state length the channels
    # -- write_file, _merged
    ("PC54", F, "    except StoreError:  # (a file this one cannot use: replaced, as before; a newer edgespec's is never reached)\n        return ours\n", "    finally:\n        pass\n"),  # a damaged file at the path: the write fails, not replaces it
    ("PC55", F, "    for e in reversed(theirs + ours):  # the most recent first", "    for e in reversed(ours + theirs):  # the most recent first"),  # another engine's entries taken as newer than ours
    ("PC56", F, "        if e.nbytes <= room:\n            out.append(e)", "        if e.nbytes < room:\n            out.append(e)"),  # an entry that exactly fits left out
    ("PC57", F, "    return out[::-1]\n", "    return out\n"),  # written most recent first: read back in the wrong LRU order
    ("PC58", F, "        if e.nbytes <= room:\n            out.append(e)", "        if e.nbytes > room:\n            break\n        if True:\n            out.append(e)"),  # an entry too large stops the merge (smaller older ones lost)
    ("PC59", F, "if not any(o.restores(e.ids) for o in ours)]", "]"),  # their entries doubled by ours
    ("PC60", F, "            os.chmod(tmp, path.stat().st_mode & 0o777)\n", "            pass\n"),  # the replaced file's mode lost (0600)
    ("PC61", F, "        pc.written = version\n        return path.stat().st_size", "        return path.stat().st_size"),  # a written version not recorded: rewritten at every close
    ("PC62", F, "        if tmp is not None:\n            try:\n                os.unlink(tmp)", "        if False:\n            try:\n                os.unlink(tmp)"),  # a failed write's temporary left behind
    ("PC63", F, "        return path.stat().st_size\n", "        return 0\n"),  # the bytes written not returned
    ("PC64", F, "shape = (len(parts), *first.shape) if isinstance(a, list) else first.shape", "shape = first.shape"),  # a stacked member's header without its first axis
    # -- _read_member
    ("PC65", F, "        if fortran or got_dtype != np.dtype(dtype)", "        if got_dtype != np.dtype(dtype)"),  # a Fortran-order member read as C order
    ("PC66", F, " or tuple(got_shape) != tuple(shape):\n", ":\n"),  # a member of another shape read
    ("PC67", F, "            if len(raw) != shape[0] * np.dtype(dtype).itemsize:\n                raise StoreError", "            if False:\n                raise StoreError"),  # a truncated ids member read short
    ("PC68", F, "            if len(raw) != per:\n                raise StoreError", "            if False:\n                raise StoreError"),  # a truncated rows member: a numpy error
    ("PC69", F, "out.append(part[:, :keep].copy() if keep is not None else part.copy())", "out.append(part.copy())"),  # a cut entry's rows read whole (over budget)
    # -- read_file
    ("PC70", F, "if z.getinfo(\"meta.npy\").file_size > 1 << 20:", "if z.getinfo(\"meta.npy\").file_size > 1 << 30:"),  # a header of megabytes read
    ("PC71", F, "            if not isinstance(meta, dict) or meta.get(\"format\") != FORMAT:", "            if not isinstance(meta, dict):"),  # a file of another format read
    ("PC72", F, "            if theirs != key:\n", "            if any(theirs.get(k) != key[k] for k in key):\n"),  # a key with one more field (conv, kv_shapes) read as ours
    ("PC73", F, "isinstance(n, int) and not isinstance(n, bool) and n >= 0", "isinstance(n, int) and not isinstance(n, bool)"),  # a negative length: silently nothing, not a StoreError
    ("PC74", F, "isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= n for s", "isinstance(s, int) and not isinstance(s, bool) and 0 <= s for s"),  # a conv start past its entry
    ("PC75", F, "            for i, n in reversed(picked):  # back to least recently used first", "            for i, n in picked:  # back to least recently used first"),  # read back most recent first: the LRU order reversed
    ("PC76", F, "                room -= n * row + states + per_input * (n - starts[i])", "                room -= n * row + per_input * (n - starts[i])"),  # the conv states not counted in the read's budget
    ("PC77", F, "                ids = _read_member(z, f\"ids_{i}\", np.int64, (full,))[0][:n].copy()", "                ids = _read_member(z, f\"ids_{i}\", np.int64, (full,))[0].copy()"),  # a cut entry's ids whole
    ("PC78", F, "                    if not all(np.isfinite(a).all() for a in states + inputs):\n", "                    if False:\n"),  # non-finite conv states read
    ("PC79", F, "(1, c, full - s0), keep=n - s0)[0]", "(1, c, full - s0))[0]"),  # a cut conv entry's inputs read whole
    ("PC80", F, "            row = sum(h * d for h, d in shapes) * np.dtype(key[\"dtype\"]).itemsize + 8", "            row = sum(h * d for h, d in shapes) * np.dtype(key[\"dtype\"]).itemsize"),  # the read's budget without the ids
    ("PC81", F, "        pc.version += 1\n        pc.written = pc.version  # what the file holds", "        pc.written = pc.version  # what the file holds"),  # expected equivalent: written follows version
    # -- remove_stale_temporaries
    ("PC82", F, "if time.time() - p.stat().st_mtime > older_than_s:", "if time.time() - p.stat().st_mtime < older_than_s:"),  # a write in progress removed, a stale one kept
    ("PC83", F, "for p in path.parent.glob(f\".{path.name}.*.tmp\"):", "for p in path.parent.glob(f\".{path.name}.*\"):"),  # the lock file (and any dot file beside) removed
    ("PC84", F, "                    gone += 1\n", ""),  # the count removed not returned
]
