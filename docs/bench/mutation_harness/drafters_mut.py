"""Mutants of edgespec/drafters.py (a second pass after session 68's): Offer, LookupDrafter, prompt lookup (its search
and its incremental index), fed_ids, the model drafter (build, its read plan, the first read and catch-up, hints, the
confidence stop, alternates, grammars, the rollback after a partial accept, its calibration), fim_head, calibrated,
learn_calibration, _second, _rescue, _top_prob. Written by a helper session.
Run from the copy:  python run.py drafters_mut.py tests/test_decoder.py [more]
First run: tests/test_decoder.py without its six tiny_bundle tests, test_draft_vocab.py's four model-free drafting tests
and test_infill.py's fim_head test (~62 s a survivor): 28 caught, 42 not. Rerun wider (test_suffix, test_prediction,
test_api's missing-drafter test, test_draft_vocab, test_infill, test_decoder's tiny_bundle tests, test_structured):
DR19, DR24, DR25, DR26, DR27, DR41, DR51 caught there. Gap tests: tests/test_drafters_mutants.py (DR4, DR11, DR13,
DR21, DR24, DR29, DR36, DR38, DR39, DR41, DR42, DR46, DR59, DR60, DR64, DR65, DR66). Equivalent: DR2, DR3, DR15,
DR16, DR20, DR32, DR55, DR57. Speed only: DR14, DR28, DR30, DR31, DR33, DR35, DR43, DR45, DR54, DR67, DR68, DR69."""
F = "edgespec/drafters.py"
MUTANTS = [
    # -- Offer, registry, LookupDrafter
    ("DR1", F, "return self.prior[0] / (self.prior[0] + self.prior[1])", "return self.prior[0] / self.prior[1]"),  # prior_alpha above 1 (the policy's first estimate of a new key)
    ("DR2", F, "        return Draft(tokens[:k], key=key)", "        return Draft(tokens, key=key)"),  # a lookup drafter's draft past k
    ("DR3", F, "        tokens, key = self._lookup(ctx, k)\n        return tokens[:k], key", "        tokens, key = self._lookup(ctx, k)\n        return tokens, key"),  # a lookup drafter's peek past k
    # -- PromptLookupDrafter
    ("DR4", F, "    def begin(self, prompt: Sequence[int]) -> None:\n        self._match = None\n        self._ctx = None\n\n    def reset",
     "    def begin(self, prompt: Sequence[int]) -> None:\n        self._ctx = None\n\n    def reset"),  # a new generation of the same length reads the last one's cached match
    ("DR5", F, "        if ctx is not self._ctx or n < self._indexed:", "        if ctx is not self._ctx:"),  # a context shorter than indexed not indexed afresh
    ("DR6", F, "                for j in range(max(0, self._indexed - size + 1), n - size):", "                for j in range(max(0, self._indexed - size + 1), n - size - 1):"),  # the latest n-gram (ending at n-2) not indexed
    ("DR7", F, "                    table[tuple(toks[j - base: j - base + size])] = j", "                    table.setdefault(tuple(toks[j - base: j - base + size]), j)"),  # the earliest occurrence, not the latest
    ("DR8", F, "            self._indexed = n - 1\n", "            self._indexed = n\n"),  # the n-grams ending at the last token never indexed
    ("DR9", F, "            j = self._index[size].get(tuple(tail[len(tail) - size:]))", "            j = self._index[size].get(tuple(tail[:size]))"),  # the pattern is the tail's first tokens, not its last
    ("DR10", F, "                start = int(hits[-1]) + size", "                start = int(hits[0]) + size"),  # the search takes the earliest match
    ("DR11", F, "        if m is None or m[0] != len(ctx) or m[1] < k:", "        if m is None or m[0] != len(ctx):"),  # a cached shorter match served to a longer ask (speed only?)
    ("DR12", F, "        if m is None or m[0] != len(ctx) or m[1] < k:", "        if m is None or m[1] < k:"),  # a stale match after the context grew
    ("DR13", F, "        return m[2][:k], m[3]", "        return m[2], m[3]"),  # a cached match longer than k
    ("DR14", F, 'return Offer(f"{self.name}/{size}", len(tokens), prior=(0.5 + 0.5 * size, 1.0))', 'return Offer(self.name, len(tokens), prior=(0.5 + 0.5 * size, 1.0))'),  # one estimate for every match length, and not the draft's key
    ("DR15", F, "        tokens, size = self._lookup_cached(ctx, kmax)\n        if not tokens:\n            return None\n", "        tokens, size = self._lookup_cached(ctx, kmax)\n"),  # an offer of 0 tokens
    ("DR16", F, '        return Draft(tokens, key=f"{self.name}/{size}")', '        return Draft(tokens, key=self.name)'),  # the draft's key is not its offer's (acceptance learned under another key)
    # -- fed_ids
    # -- ModelDrafter: construction and build
    ("DR17", F, "self.in_vocab = in_vocab if in_vocab is not None and in_vocab < target_vocab else None", "self.in_vocab = None"),  # ids past a smaller drafter embedding fed as they are
    ("DR18", F, "self._calib = {True: [CALIB_PRIOR, CALIB_PRIOR], False:", "self._calib = {True: [CALIB_PRIOR, 2 * CALIB_PRIOR], False:"),  # greedy calibration starts at lam 0.5
    ("DR19", F, '        if env.plan.drafter != "model" or env.manifest.drafter is None:', '        if env.manifest.drafter is None:'),  # a plan without the drafter still opens it
    ("DR20", F, "        if head is None and spec.vocab_size < vocab:  # a smaller", "        if False:  # a smaller"),  # a drafter with a smaller vocabulary: no head ids
    ("DR21", F, "                   in_vocab=spec.vocab_size)", "                   in_vocab=None)"),  # a loaded drafter with fewer embedding rows fed ids past them
    ("DR22", F, "        return calibrated(self._calib[greedy], self.history)", "        return calibrated(self._calib[True], self.history)"),  # sampled drafts use the greedy calibration
    # -- begin / reset / read plan / behind / offer
    ("DR23", F, "        self._judge = None\n        self._stale = True\n        self._plan = None", "        self._judge = None\n        self._plan = None"),  # a new generation does not read its context
    ("DR24", F, "        self._plan = None\n        self._head = None\n        if self.fim", "        self._plan = None\n        if self.fim"),  # a FIM head kept into the next generation
    ("DR25", F, "            self._head = None if head is None else (len(prompt) - len(head), head)", "            self._head = None if head is None else (len(prompt) - len(head) - 1, head)"),  # the FIM head's base one early
    ("DR26", F, "            if len(ctx) - base <= 2 * self.read_window:", "            if len(ctx) - base <= self.read_window:"),  # a FIM head given up after one window of reply
    ("DR27", F, "            if base < n and self.history:", "            if base < n:"),  # a seeded generation keeps what the cache held (its catch-up priced on earlier generations)
    ("DR28", F, "                held = min(self.lm.cache.ids.common_prefix(self._fit(ctx.view()[base:])), n - base - 1)", "                held = self.lm.cache.ids.common_prefix(self._fit(ctx.view()[base:]))"),  # a cache holding all of the context: a read of 0 tokens planned
    ("DR29", F, "                if held > 0 and base + held >= fresh and n - base + 16 < self.lm.max_context:", "                if held > 0 and n - base + 16 < self.lm.max_context:"),  # a chat turn's read past the window
    ("DR30", F, "                if held > 0 and base + held >= fresh and n - base + 16 < self.lm.max_context:", "                if held > 0 and base + held >= fresh:"),  # a kept base leaves no room for drafts (speed only)
    ("DR31", F, "        base = self._read_plan(ctx)[0] if self._stale else self._base\n        k = min(kmax,", "        base = self._base\n        k = min(kmax,"),  # a stale drafter's offer reckoned from the old base
    ("DR32", F, "        if k <= 0:\n            return None\n        behind", "        if k < 0:\n            return None\n        behind"),  # an offer of 0 tokens
    # -- draft
    ("DR33", F, "        hint = list(hint[: max(0, k - 1)])", "        hint = list(hint[:k])"),  # one hint token too many (speed only: its row is never read)
    ("DR34", F, "                logits = lm.prefill(self._fit(ctx.view()[base:]))", "                logits = lm.prefill(ctx.view()[base:])"),  # the first read not fitted to the embedding
    ("DR35", F, "            hint = self._fit_hint(hint, 0)\n", "            hint = hint\n"),  # a first read's hint not cut to HINT_MAX_ROWS / the cache
    ("DR36", F, "                rows = lm.forward_from(self._fit(list(missing) + hint), len(missing) - 1, copy=not sp.greedy)", "                rows = lm.forward_from(self._fit(list(missing) + hint), len(missing) - 1, copy=False)"),  # sampled q keeps a row the next call overwrites
    ("DR37", F, "        lam = self.calibration(sp.greedy) if stop is not None or alternates else 1.0", "        lam = 1.0"),  # the confidence stop uncalibrated
    ("DR38", F, "            row = logits[: self.target_vocab] if head is None else logits", "            row = logits"),  # a drafter with padded logits drafts ids past the target's vocabulary
    ("DR39", F, "                if not allowed.any():\n                    break\n", ""),  # a grammar that allows nothing: a forbidden token drafted
    ("DR40", F, "                tok = best if head is None else int(head[best])", "                tok = best"),  # a reduced head's greedy draft not mapped back
    ("DR41", F, "head if q.idx is None else head[q.idx], q.w, q.total)", "head if q.idx is None else q.idx, q.w, q.total)"),  # a reduced head's sparse q not mapped back
    ("DR42", F, "alts.append((i, second if head is None else int(head[second]), min(1.0, lam * confs[-1]), q2))", "alts.append((i, second, min(1.0, lam * confs[-1]), q2))"),  # a reduced head's greedy alternate not mapped back
    ("DR43", F, "alts.append((i, second if head is None else int(head[second]), min(1.0, lam * confs[-1]), q2))", "alts.append((i, second if head is None else int(head[second]), lam * confs[-1], q2))"),  # a greedy alternate's calibrated top probability above 1
    ("DR44", F, "                lm.rewind(fed - i)\n                fed = i\n", "                lm.rewind(fed - i - 1)\n                fed = i\n"),  # a wrong hint's first token left in the cache
    ("DR45", F, "            if grammar is not None and i < k - 1 and not grammar.push(tok):\n                break", "            if grammar is not None and i < k - 1 and not grammar.push(tok):\n                pass"),  # drafting on past the grammar's end
    ("DR46", F, "                    sure *= min(1.0, lam * confs[-1])", "                    sure *= lam * confs[-1]"),  # a calibrated factor above 1 lengthens the draft
    ("DR47", F, "                    if sure < (hint_stop if fed > i and hint_stop is not None else stop):", "                    if sure < stop:"),  # hint_stop ignored
    ("DR48", F, "                elif self.min_confidence > 0 and _top_prob(row) < self.min_confidence:", "                elif False:"),  # a fixed-length draft never stops on confidence
    ("DR49", F, "                if late and i == 0 and hint[0] == tok and len(hint) > 1:", "                if late and i == 0 and len(hint) > 1:"),  # a first read's hint fed though its first token was not drafted
    ("DR50", F, "                logits = lm.forward([tok], copy=not sp.greedy)[-1]", "                logits = lm.forward([tok], copy=False)[-1]"),  # (sampled) a step's row not copied
    ("DR51", F, "        if grammar is not None:\n            grammar.pop()\n", ""),  # the draft's grammar pushes left on the matcher
    ("DR52", F, "            lm.rewind(fed - len(tokens))\n            fed = len(tokens)", "            fed = len(tokens)"),  # hint tokens past the draft's end left in the cache
    ("DR53", F, "        self._judge = (sp.greedy, confs) if stop is not None and self.history else None", "        self._judge = (sp.greedy, confs) if stop is not None else None"),  # a seeded generation teaches the calibration
    # -- _fit_hint / accept
    ("DR54", F, "        hint = hint[: max(0, HINT_MAX_ROWS - rows)]", "        hint = hint[:HINT_MAX_ROWS]"),  # a catch-up plus hint over the logits buffer's 32 rows
    ("DR55", F, "        return hint if self.lm.length + rows + len(hint) <= self.lm.max_context else []", "        return hint"),  # a hint past the cache's end
    ("DR56", F, "            learn_calibration(self._calib[greedy], confs, n)", "            learn_calibration(self._calib[True], confs, n)"),  # sampled drafts teach the greedy calibration
    ("DR57", F, "            learn_calibration(self._calib[greedy], confs, n)\n            self._judge = None", "            learn_calibration(self._calib[greedy], confs, n)"),  # one draft learned twice if accept is called again
    # -- fim_head
    # -- calibrated / learn_calibration
    ("DR58", F, "    if not history:\n        return 1.0\n    kept, conf", "    kept, conf"),  # a seeded generation's lam from earlier ones
    ("DR59", F, "    return min(CALIB_MAX, max(CALIB_MIN, kept / conf))", "    return max(CALIB_MIN, kept / conf)"),  # lam unbounded above
    ("DR60", F, "    return min(CALIB_MAX, max(CALIB_MIN, kept / conf))", "    return min(CALIB_MAX, kept / conf)"),  # lam unbounded below
    ("DR61", F, "    for i, c in enumerate(confs[: n + 1]):", "    for i, c in enumerate(confs[:n]):"),  # the first rejected position not judged
    ("DR62", F, "        sums[0] = CALIB_DECAY * sums[0] + (1.0 if i < n else 0.0)", "        sums[0] = CALIB_DECAY * sums[0] + (1.0 if i <= n else 0.0)"),  # the first rejected counted kept
    ("DR63", F, "        sums[1] = CALIB_DECAY * sums[1] + c\n", "        sums[1] = CALIB_DECAY * sums[1] + 1.0\n"),  # confidence sum counts positions
    # -- _second / _rescue / _top_prob
    ("DR64", F, "    if not row.flags.writeable:\n        row = row.copy()\n", ""),  # a read-only row written
    ("DR65", F, "    finally:\n        row[j] = best\n", "    finally:\n        pass\n"),  # the row left with -inf at its best
    ("DR66", F, "    return j2, top * float(np.exp(np.float32(row[j2]) - np.float32(best)))", "    return j2, float(np.exp(np.float32(row[j2]) - np.float32(best)))"),  # the second's probability relative to the top, not absolute
    ("DR67", F, "    if w.shape[0] == 0:", "    if w.shape[0] < 2:"),  # (rewritten after session 95's fix of _rescue, which DR67 first
    # removed: speed only then) a TailDist's tail token's alternate priced at 0, not its one near token's share
    ("DR68", F, "    if j != at or (q.idx is not None and (at >= q.idx.shape[0] or q.idx[at] != tok)):", "    if j != at:"),  # a tail token taken for the top kept one
    ("DR69", F, "    return max(float(w[:j].max(initial=0.0)), float(w[j + 1:].max(initial=0.0))) / q.total", "    return float(w[j + 1:].max(initial=0.0)) / q.total"),  # the second largest looked for after the top only
    ("DR70", F, "    return 1.0 / float(np.exp(logits - m, dtype=np.float32).sum())", "    return 1.0 / float(np.exp(2 * (logits - m), dtype=np.float32).sum())"),  # the top probability at temperature 0.5
]
