"""Mutants of edgespec/sampling.py and edgespec/verify.py (session 95): a second pass after session 67's, over the
code written since (min-p, TailDist, the numpy top-p near the maximum, greedy_choice's NaN rows, the alternates'
rule, the sampling parameters' checks). Run from the copy:
  python run.py sampling_mut.py tests/test_decoder.py [more]"""
S = "edgespec/sampling.py"
V = "edgespec/verify.py"
MUTANTS = [
    # SamplingParams
    ("SA1", S, "        if not (finite and self.temperature >= 0):", "        if not (finite and self.temperature >= -1):"),  # T = -0.5 taken
    ("SA2", S, "        if 0 < self.temperature < MIN_TEMPERATURE:", "        if 0 < self.temperature < MIN_TEMPERATURE / 10:"),  # T 5e-7 sampled (1/T overflow)
    ("SA3", S, "        if not 0 <= self.top_k < 2**31:", "        if not 0 <= self.top_k:"),  # top_k 2**40 taken
    ("SA4", S, "        if not 0 <= self.top_p <= 1:  # also refuses nan", "        if self.top_p > 1:"),  # nan / negative top_p taken
    ("SA5", S, "        if not 0 <= self.min_p <= 1:  # also refuses nan", "        if not 0 <= self.min_p < 1:"),  # min_p 1 refused
    ("SA6", S, "        return self.temperature == 0 or self.top_p == 0", "        return self.temperature == 0"),  # top_p 0 not greedy (sampled)
    # Dist
    ("SA7", S, "            return float(self.w[token]) / self.total if 0 <= token < self.n else 0.0", "            return float(self.w[token]) / self.total if 0 <= token <= self.n else 0.0"),  # token n: IndexError
    ("SA8", S, "        return float(self.w[j]) / self.total if j < self.idx.shape[0] and self.idx[j] == token else 0.0", "        return float(self.w[j]) / self.total if j < self.idx.shape[0] else 0.0"),  # a token not kept: its neighbour's p
    ("SA9", S, "            if self.w.shape[0] <= _SMALL:", "            if self.w.shape[0] < 0:"),  # the small path never (numpy's: the same distribution)
    ("SA10", S, "                return int(self.idx[min(bisect.bisect_right(c, rng.random() * cum), len(w) - 1)])", "                return int(self.idx[min(bisect.bisect_left(c, rng.random() * cum), len(w) - 1)])"),  # measure zero
    ("SA11", S, "                return int(self.idx[min(bisect.bisect_right(c, rng.random() * cum), len(w) - 1)])", "                return int(self.idx[min(bisect.bisect_right(c, rng.random() * c[0]), len(w) - 1)])"),  # always the first token
    ("SA12", S, "        full = w.shape[0] - w.shape[0] % _BLOCK", "        full = w.shape[0] - w.shape[0] % _BLOCK - _BLOCK if w.shape[0] > _BLOCK else 0"),  # a block lost? (the last sum covers it: equivalent)
    ("SA13", S, "            sums = np.append(sums, w[full:].sum(dtype=np.float64))", "            pass"),  # the last partial block never drawn
    ("SA14", S, "        return b * _BLOCK + _inverse_cdf(w[b * _BLOCK: (b + 1) * _BLOCK], rng)", "        return b * _BLOCK + _inverse_cdf(w[b * _BLOCK: (b + 1) * _BLOCK - 1], rng)"),  # a block's last token never drawn
    ("SA15", S, "            p[:] = self.w\n", "            p[:] = self.w[::-1]\n"),  # dense reversed
    ("SA16", S, "        return p / self.total\n", "        return p / max(self.total, 1.0)\n"),  # dense not normalized (total < 1)
    ("SA17", S, "            if 0 <= token < self.n:\n                w[token] = 0", "            if 0 <= token < self.n - 1:\n                w[token] = 0"),  # the last token not removed
    ("SA18", S, "            return Dist(self.n, None, w) if w.any() else None", "            return Dist(self.n, None, w)"),  # an empty rest: total 0, nan
    ("SA19", S, "        return Dist(self.n, self.idx[keep], self.w[keep]) if self.w[keep].any() else None", "        return Dist(self.n, self.idx[keep], self.w[keep]) if keep.any() else None"),  # weights underflowed to 0 kept
    ("SA20", S, "            qv[ip] = q.w[iq] / q.total", "            qv[ip] = q.w[iq]"),  # q unnormalized in the residual
    ("SA21", S, "            r = np.maximum(p - qv, 0.0)\n            return Dist(self.n, idx, r) if r.sum() > 0 else None", "            r = np.abs(p - qv)\n            return Dist(self.n, idx, r) if r.sum() > 0 else None"),  # |p - q|
    ("SA22", S, "        r = np.maximum(self.dense() - _fit(q.dense(), self.n), 0.0)", "        r = self.dense()"),  # dense residual = p (the classic bug)
    ("SA23", S, "        return Dist(self.n, None, r) if r.sum() > 0 else None\n\n\nclass TailDist", "        return Dist(self.n, None, r) if r.sum() > 1e-3 else None\n\n\nclass TailDist"),  # a small residual called p == q
    # TailDist
    ("SA24", S, "            full[self.idx] = self.w\n", ""),  # near weights recomputed (the same values: equivalent or near)
    ("SA25", S, "            if self.excluded:\n                full[list(self.excluded)] = 0", "            if False:\n                full[list(self.excluded)] = 0"),  # a removed token back in the exact dist
    ("SA26", S, "        if not 0 <= token < self.n or token in self.excluded:\n            return 0.0, 0.0", "        if not 0 <= token < self.n:\n            return 0.0, 0.0"),  # an excluded token's p > 0
    ("SA27", S, "        return v * (1 - 1e-6), v * (1 + 1e-6)", "        return v, v"),  # no slack on a tail weight (rounding only)
    ("SA28", S, "        total = (self.total + self.bound) * (1 + 1e-12)", "        total = self.total * (1 + 1e-12)"),  # lower bound ignores the tail
    ("SA29", S, "        return lo / total, (hi / (self.total * (1 - 1e-12)) if self.total > 0 else math.inf)", "        return lo / total, hi / total"),  # upper bound too low
    ("SA30", S, "        u = rng.random() * (self.total + self.bound)", "        u = rng.random() * self.total"),  # the tail never drawn
    ("SA31", S, "        tail[self.idx] = 0\n", ""),  # near tokens counted twice
    ("SA32", S, "        if u - self.total < c[-1]:\n            return _locate(c, u - self.total)", "        if True:\n            return _locate(c, u - self.total)"),  # past the tail's mass: the last token
    ("SA33", S, "        if not keep.any():  # nothing near is left", "        if False:  # nothing near is left"),  # an empty near set kept as a TailDist
    ("SA34", S, "        return TailDist(self.n, self.idx[keep], self.w[keep], self.row, self.m, self.inv_t, self.bound,\n                        self.excluded + (int(token),))", "        return TailDist(self.n, self.idx[keep], self.w[keep], self.row, self.m, self.inv_t, self.bound,\n                        self.excluded)"),  # removed token not excluded from the tail
    ("SA35", S, "        if not 0 <= token < self.n:  # not a token of this distribution: nothing to remove\n            return self", "        if False:\n            return self"),  # token -1 (prompt lookup's none?) removes idx... 
    # distribution()
    ("SA36", S, "    if sp.top_p < 1.0 and not (sp.top_k and sp.top_k < n):", "    if sp.top_p < 1.0:"),  # top-k then top-p: top-p alone
    ("SA37", S, "        w = np.exp((x[idx].astype(np.float64) - float(m)) * (1.0 / sp.temperature))\n        if sp.top_p < 1.0:", "        w = np.exp((x[idx].astype(np.float64) - float(m)))\n        if sp.top_p < 1.0:"),  # top-k ignores temperature
    ("SA38", S, "            idx, w = _cut(idx, w, sp.top_p, w.sum())", "            idx, w = _cut(idx, w, sp.top_p, w.sum() * 1.01)"),  # top-p over k of a wrong total
    ("SA39", S, "    if n >= _LAZY_MIN and x.dtype == np.float32:", "    if n >= _LAZY_MIN:"),  # float64 rows lazily (equivalent?)
    ("SA40", S, "        thr = np.float32(float(m) - math.log(n / _DENSE_EPS) * sp.temperature)", "        thr = np.float32(float(m) - math.log(n / _DENSE_EPS))"),  # threshold without T: bound wrong at T != 1
    ("SA41", S, "        if near.shape[0] <= n // 4:", "        if near.shape[0] <= n:"),  # a TailDist always (speed)
    ("SA42", S, "            bound = (n - near.shape[0]) * max(math.exp((float(thr) - float(m)) * inv_t), at_thr) * (1 + 1e-5)", "            bound = (n - near.shape[0]) * math.exp((float(thr) - float(m)) * inv_t) * 0.5"),  # a bound below the tail
    ("SA43", S, "    w = np.exp((x.astype(np.float32, copy=False) - np.float32(m)) * np.float32(inv_t))\n    return Dist(n, None, w)", "    w = np.exp((x.astype(np.float32, copy=False) - np.float32(m)))\n    return Dist(n, None, w)"),  # dense path ignores T
    # greedy_choice / chosen / _finite_max
    ("SA44", S, "    if bad.any():\n        top = np.where(bad, -1, top)", "    if False:\n        top = np.where(bad, -1, top)"),  # a NaN row decoded
    ("SA45", S, "    if t < 0:\n        raise BundleError", "    if t < -1:\n        raise BundleError"),  # -1 emitted as a token
    ("SA46", S, "    if not np.isfinite(m):\n        raise BundleError", "    if np.isnan(m):\n        raise BundleError"),  # +inf row sampled
    # _min_p
    ("SA47", S, "        keep = d.w >= sp.min_p * float(d.w.max())", "        keep = d.w >= sp.min_p"),  # relative to 1, not the kept maximum (top-k's max is 1: equivalent there?)
    ("SA48", S, "        return d if keep.all() else Dist(n, d.idx[keep], d.w[keep])", "        return d"),  # min-p ignored after top-k/top-p
    ("SA49", S, "    gap = math.log(1.0 / sp.min_p) * sp.temperature", "    gap = math.log(1.0 / sp.min_p)"),  # gap without T: tokens cut at T > 1
    ("SA50", S, "    keep = w >= sp.min_p\n    return Dist(n, near[keep], w[keep])", "    keep = w > sp.min_p\n    return Dist(n, near[keep], w[keep])"),  # min_p 1: ties of the max dropped too? (max's w 1 > 1 false: empty)
    ("SA51", S, "    w = np.exp((x[near].astype(np.float64) - float(m)) * (1.0 / sp.temperature))\n    keep", "    w = np.exp((x[near].astype(np.float64) - float(m)) * (1.0 / sp.temperature))\n    return Dist(n, near, w)\n    keep"),  # min-p cut not applied (near widened)
    # _top_k
    ("SA52", S, "    return np.flatnonzero(x >= kth) if near is None else near[vals >= kth]", "    return np.flatnonzero(x >= kth) if near is None else near[vals > kth]"),  # the k-th's ties dropped
    ("SA53", S, "    for gap in (4.0, 16.0, 64.0):", "    for gap in (4.0,):"),  # a flat row: full selection (equivalent: near None)
    ("SA54", S, "        if cand.shape[0] >= k:\n            near = cand", "        if cand.shape[0] >= 1:\n            near = cand"),  # fewer than k near: fewer than k kept
    # _cut / _first / _keep
    ("SA55", S, "    kept[np.flatnonzero(w == last)[: keep - int(np.count_nonzero(kept))]] = True", "    kept[np.flatnonzero(w == last)] = True"),  # every tie of the last kept value
    ("SA56", S, "    kept[np.flatnonzero(w == last)[: keep - int(np.count_nonzero(kept))]] = True", "    kept[np.flatnonzero(w == last)[::-1][: keep - int(np.count_nonzero(kept))]] = True"),  # the last of the ties, not the first
    ("SA57", S, "    return max(int(np.count_nonzero(np.cumsum(sw) - sw < top_p * total)), 1)", "    return max(int(np.count_nonzero(np.cumsum(sw) < top_p * total)), 1)"),  # the crossing token dropped
    ("SA58", S, "    return max(int(np.count_nonzero(np.cumsum(sw) - sw < top_p * total)), 1)", "    return int(np.count_nonzero(np.cumsum(sw) - sw < top_p * total))"),  # no floor of 1 (top_p tiny)
    ("SA59", S, "    return max(int(np.count_nonzero(np.cumsum(sw) - sw < top_p * total)), 1)", "    return max(int(np.count_nonzero(np.cumsum(sw) - sw <= top_p * total)), 1)"),  # a tie at the cut kept
    # _top_p (native) / _top_p_near / _top_p_full
    ("SA60", S, "        if k > 0:\n            return Dist(n, idx[:k].copy(), w[:k].copy())", "        if k > 0:\n            return Dist(n, idx[:k], w[:k])"),  # the thread's buffers aliased by the next call
    ("SA61", S, "        if k == 0:\n            return _top_p_full(x, x.max(), sp)", "        if k == 0:\n            return _top_p_near(x, x.max(), sp)"),  # native undecided: numpy near, maybe None
    ("SA62", S, "        if near.shape[0] > _NEAR_MAX:\n            return None", "        if near.shape[0] > _NEAR_MAX * 100:\n            return None"),  # speed only
    ("SA63", S, "        tail = (n - near.shape[0]) * math.exp((float(thr) - float(m)) * inv_t) * (1 + 1e-9)", "        tail = 0.0"),  # the tail's mass ignored: cut decided wrongly
    ("SA64", S, "            rest = max(z - float(e[sub].sum(dtype=np.float64)), 0.0)  # float32 weights: within 1e-4", "            rest = 0.0"),  # the near rest ignored
    ("SA65", S, "            if ws < sp.top_p * hi:\n                continue", "            if ws < sp.top_p * lo:\n                continue"),  # the likeliest may not hold the cut
    ("SA66", S, "            if _keep(sw, sp.top_p, hi) == keep:", "            if True:"),  # the cut decided on one bound
    ("SA67", S, "        if float(e[idx].sum(dtype=np.float64)) >= sp.top_p * z or gap == math.inf:", "        if True:"),  # candidates within 7 only
    ("SA68", S, "    total = w.sum() + max(z - float(e[idx].sum(dtype=np.float64)), 0.0)", "    total = w.sum()"),  # full pass: total of the candidates only
    ("SA69", S, "    return min(int(np.searchsorted(c, u, side=\"right\")), len(c) - 1)", "    return int(np.searchsorted(c, u, side=\"right\"))"),  # rounding: index past the end
    ("SA70", S, "    return np.concatenate([q, np.zeros(n - q.shape[0], dtype=q.dtype)])", "    return np.concatenate([np.zeros(n - q.shape[0], dtype=q.dtype), q])"),  # a smaller drafter vocabulary padded in front
    # verify.py
    ("VE1", V, "    while n < len(draft) and int(choice[n]) == int(draft[n]):", "    while n < len(draft) - 1 and int(choice[n]) == int(draft[n]):"),  # the last draft token never accepted
    ("VE2", V, "    return n, chosen(choice[n])", "    return n, int(choice[n])"),  # a NaN row's -1 emitted
    ("VE3", V, "        residual = p.without(x) if draft_dists is None else p.minus(draft_dists[i])", "        residual = p.minus(draft_dists[i]) if draft_dists is not None else p"),  # point mass: resample p
    ("VE4", V, "        if residual is None:  # p == q up to rounding: any sample of p is exact\n            return i, p.sample(rng)\n        return i, residual.sample(rng)", "        if residual is None:  # p == q up to rounding: any sample of p is exact\n            return i, x\n        return i, residual.sample(rng)"),  # p == q: the draft token again (p without x: only when nothing else)
    ("VE5", V, "    return len(draft), distribution(target_logits[len(draft)], sp).sample(rng)\n\n\ndef rejection_sample_alternates", "    return len(draft), distribution(target_logits[len(draft) - 1], sp).sample(rng)\n\n\ndef rejection_sample_alternates"),  # the bonus from the wrong row
    ("VE6", V, "        if residual is None:  # p == q up to rounding: any sample of p is exact\n            return i, p.sample(rng), None", "        if residual is None:  # p == q up to rounding: any sample of p is exact\n            return i, x, None"),  # p == q under alternates
    ("VE7", V, "        if _accepts(residual, q1, y, rng):\n            return i, y, i", "        if _accepts(p, q1, y, rng):\n            return i, y, i"),  # alternate judged against p, not the residual
    ("VE8", V, "        if _accepts(residual, q1, y, rng):\n            return i, y, i", "        if _accepts(residual, q, y, rng):\n            return i, y, i"),  # alternate's q is q, not q without x
    ("VE9", V, "        rest = residual.minus(q1)", "        rest = residual.minus(q)"),  # second residual against q
    ("VE10", V, "        return i, (residual if rest is None else rest).sample(rng), None  # (None: p1 == q1 up to rounding)", "        return i, residual.sample(rng), None"),  # after the alternate's rejection: p1 again
    ("VE11", V, "        if _accepts(residual, q1, y, rng):\n            return i, y, i", "        if _accepts(residual, q1, y, rng):\n            return i, y, None"),  # the alternate's position not reported
    ("VE12", V, "    return len(draft), distribution(target_logits[len(draft)], sp).sample(rng), None", "    return len(draft), distribution(target_logits[len(draft)], sp).sample(rng), len(draft)"),  # bonus called an alternate
    ("VE13", V, "    if q_lo <= 0 < q_hi:\n        q = q.exact()", "    if False:\n        q = q.exact()"),  # q(x) undecided at 0: bounds used
    ("VE14", V, "    if q_hi <= 0:\n        return False", "    if q_hi < 0:\n        return False"),  # q(x) = 0: u * 0 < p: accepted
    ("VE15", V, "    if u * q_hi < p_lo:\n        return True", "    if u * q_lo < p_lo:\n        return True"),  # accept on the wrong bound
    ("VE16", V, "    if u * q_lo >= p_hi:\n        return False", "    if u * q_hi >= p_hi:\n        return False"),  # reject on the wrong bound
    ("VE17", V, "    return u * (1.0 if q is None else q.exact().prob(x)) < p.exact().prob(x)", "    return u * (1.0 if q is None else q.exact().prob(x)) < p.prob_bounds(x)[0]"),  # undecided: the lower bound
    ("VE18", V, "    return q.without(x)", "    return q"),  # alternate drawn from q with x
]
