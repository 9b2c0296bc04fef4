"""Mutants of edgespec/policy.py (a helper of session 96): a second pass after sessions 78-79's Q1-Q94, aimed at what
their table names no test for: Acceptance's update and forgetting, the stall clip and the sample check, the catch-up
line (_affine, observe_catchup's window, upfront_cost's trust), prior_upfront, cost_priors' ratio and bounds,
RoundPolicy's argument checks, begin's stores (sampled / mixed / reproducible), the stale estimate's relaxation,
_relax_steps / _relax_premium, hint_length, shadows, uncovered / costly_share, alternates and their premium.
Run from the copy:  python run.py policy_mut.py tests/test_decoder.py --k "not smollm2 and not smol"
"""
P = "edgespec/policy.py"
MUTANTS = [
    ("PO1", P, "        self.rejected = self.decay * self.rejected + (1 if n_accepted < k else 0)", "        self.rejected = self.decay * self.rejected + (1 if n_accepted <= k else 0)"),  # a fully kept draft counted as a rejection
    ("PO2", P, "        self.accepted = self.decay * self.accepted + n_accepted\n", "        self.accepted = self.accepted + n_accepted\n"),  # accepted tokens never forgotten
    ("PO3", P, "        return min(0.99, a / (a + self.rejected + self.prior_reject))", "        return min(0.99, a / (a + self.rejected))"),  # the reject prior dropped
    ("PO4", P, "        return (1 - self.ema) * old + self.ema * min(seconds, self.stall_clip * old)", "        return (1 - self.ema) * old + self.ema * seconds"),  # stalls not clipped
    ("PO5", P, "        if old is None or not old > 0.0:\n            return seconds", "        if old is None:\n            return seconds"),  # a zero estimate never replaced
    ("PO6", P, "        return math.isfinite(seconds) and seconds > 0.0", "        return math.isfinite(seconds) and seconds >= 0.0"),  # a 0 s sample taken
    ("PO7", P, "        if not (math.isfinite(seconds) and seconds >= 0.0):\n            return", "        if not seconds >= 0.0:\n            return"),  # an infinite read taken
    ("PO8", P, "        del reads[:-self.catchup_window]", "        pass"),  # the read window unbounded
    ("PO9", P, "        reads.append((max(1, int(tokens)), float(seconds)))", "        reads.append((int(tokens), float(seconds)))"),  # a read of 0 tokens kept as 0 (divides by zero)
    ("PO10", P, "        if trust >= 1.0:\n            return measured\n        return trust * measured + (1.0 - trust) * self.prior_upfront(tokens, drafter)", "        return measured"),  # stale reads trusted fully
    ("PO11", P, "        return trust * measured + (1.0 - trust) * self.prior_upfront(tokens, drafter)", "        return trust * self.prior_upfront(tokens, drafter) + (1.0 - trust) * measured"),  # trust weights swapped
    ("PO12", P, "        return max(tokens, 0) * max(self.prior_catchup, self.marginal()) * self.step_cost(drafter)", "        return max(tokens, 0) * self.prior_catchup * self.step_cost(drafter)"),  # the marginal ignored in the prior read
    ("PO13", P, "        return (self.prior_step_ratio if drafter == \"model\" else PRIOR_STEP) * self.target_cost(1)", "        return self.prior_step_ratio * self.target_cost(1)"),  # every drafter priced at the model's ratio
    ("PO14", P, "        if per > 0 and fixed >= 0:", "        if per > 0:"),  # a negative intercept kept
    ("PO15", P, "    return 0.0, float(s.sum() / n.sum())", "    return 0.0, float(s.mean() / n.mean() / len(reads))"),  # the per-token fallback divided by the reads' count
    ("PO16", P, "    if np.unique(n).size >= 2:", "    if n.size >= 2:"),  # a fit of reads all of one length
    ("PO17", P, "        out[\"prior_step_ratio\"] = min(max(ratio * STEP_OVERHEAD, STEP_RATIO_RANGE[0]), STEP_RATIO_RANGE[1])", "        out[\"prior_step_ratio\"] = min(ratio * STEP_OVERHEAD, STEP_RATIO_RANGE[1])"),  # no lower bound on the step ratio
    ("PO18", P, "        return float(spec.gpu_weight_bytes - (getattr(spec, \"embedding_bytes\", 0) or 0))", "        return float(spec.gpu_weight_bytes)"),  # token tables counted as streamed
    ("PO19", P, "    if getattr(drafter_lm, \"device\", \"cpu\") != \"cpu\":", "    if False:"),  # a GPU drafter's step ratio from bytes
    ("PO20", P, "            if isinstance(v, bool) or not (isinstance(v, (int, float)) and 0.0 <= v <= 4.0):", "            if not (isinstance(v, (int, float)) and 0.0 <= v <= 4.0):"),  # True accepted as a prior
    ("PO21", P, "        if prior_knee and prior_steep < prior_slope:", "        if prior_steep < prior_slope:"),  # a knee-less policy refused for steep < slope
    ("PO22", P, "        if not (share_prior > 0 and np.isfinite(share_prior)):", "        if not share_prior > 0:"),  # an infinite share_prior accepted
    ("PO23", P, "        if use_alternates not in (True, False) or isinstance(use_alternates, float):", "        if use_alternates not in (True, False):"),  # 1.0 accepted as use_alternates
    ("PO24", P, "            self.cost, self._carried = self.measured, self.learned_sampled if sampled else self.learned", "            self.cost, self._carried = self.measured, self.learned"),  # sampled generations learn into greedy's store
    ("PO25", P, "            mixed = self.learned_mixed_sampled if sampled else self.learned_mixed", "            mixed = self.learned_mixed"),  # sampled mixed estimates shared with greedy
    ("PO26", P, "        self._carried_costly = mixed if self._mixed else self._carried", "        self._carried_costly = self._carried"),  # auto's costly estimates not apart
    ("PO27", P, "            self.cost, self._carried, mixed = CostModel(**self.priors), {}, {}", "            self.cost, self._carried, mixed = self.measured, {}, {}"),  # a reproducible generation prices with measured costs
    ("PO28", P, "                    w = 0.5 ** (idle / self.stale_half_life)", "                    w = 0.5 ** idle"),  # stale_half_life ignored
    ("PO29", P, "                prior = (self.carry * a, self.carry * (1 - a))", "                prior = (a, 1 - a)"),  # carry's weight ignored
    ("PO30", P, "                d.records = d in self._want", "                d.records = True"),  # a filling suffix drafter records
    ("PO31", P, "        if alpha ** h < 0.01:\n            break", "        if alpha ** h < 0.5:\n            break"),  # hint search stops early
    ("PO32", P, "                if a > hint_alpha or (a == hint_alpha and len(tokens) > len(hint)):", "                if a > hint_alpha:"),  # a tie keeps the shorter guess
    ("PO33", P, "                n = next((i for i in range(k) if got[i] != tokens[i]), k)", "                n = next((i for i in range(k) if got[i] != tokens[i]), 0)"),  # a fully matched shadow scored 0
    ("PO34", P, "            if emitted > 0:", "            if emitted >= 0:"),  # a shadow scored before anything was emitted
    ("PO35", P, "        return (self._costly_rounds + self.share_prior) / (self._rounds + self.share_prior)", "        return (self._costly_rounds + 1.0) / (self._rounds + 1.0)"),  # share_prior ignored
    ("PO36", P, "        return 1.0 - self._free_kept / self._produced if self._produced else 1.0", "        return 1.0"),  # free drafters' kept tokens ignored
    ("PO37", P, "            if at < self._generation - 1 and steps.get(name, 0.0) > prior:", "            if at < self._generation - 1:"),  # a step below the prior relaxed up
    ("PO38", P, "                steps[name] = 0.5 * (steps[name] + prior)", "                steps[name] = prior"),  # relaxed all the way at once
    ("PO39", P, "        if self.alt_premium and self._premium_at < self._generation - 1:", "        if self.alt_premium:"),  # a renewed premium halved too
    ("PO40", P, "        return min(ALT_SCALE[1], max(ALT_SCALE[0], kept / max(expected, 1e-9)))", "        return kept / max(expected, 1e-9)"),  # the scale unbounded
    ("PO41", P, "        if not self._timed:\n            draft_s = k * self.cost.prior_step()", "        if False:\n            draft_s = k * self.cost.prior_step()"),  # reproducible alternates priced at measured drafting
    ("PO42", P, "            if len(chosen) >= room or value * per_token <= max(0.0, costs[w + 1] - costs[w]) + premium:", "            if len(chosen) >= room or value * per_token <= max(0.0, costs[w + 1] - costs[w]):"),  # the premium ignored
    ("PO43", P, "                        ALT_PREMIUM_MAX * self.cost.target_cost(1))", "                        ALT_PREMIUM_MAX * self.cost.target_cost(width))"),  # the premium's cap at the call's width
    ("PO44", P, "            if not alternates:\n                self.cost.observe_target(width, seconds)", "            if True:\n                self.cost.observe_target(width, seconds)"),  # a call with alternates teaches the width's cost
    ("PO45", P, "                if self.catchup_trust(name) < 1.0:", "                if False:"),  # stale reads joined, not replaced
    ("PO46", P, "        if tokens and choice.drafter is not None and not choice.drafter.has_cost:", "        if tokens and choice.drafter is not None:"),  # a costly drafter's kept tokens count as covered
    ("PO47", P, "        return 1.0 if idle <= 0 else 0.5 ** (idle / self.stale_half_life)", "        return 1.0 if idle <= 0 else 0.5 ** idle"),  # catch-up trust ignores stale_half_life
    ("PO48", P, "        if self._timed and self._produced:  # the last generation's length", "        if self._produced:  # the last generation's length"),  # a reproducible generation's length learned
]
