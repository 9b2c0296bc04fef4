"""Mutants of edgespec/decoder.py (session 96): a second pass after session 67's 34 (rounds, acceptance, stops), over
what that pass left: GenerationConfig's checks, token_logprobs, Stats, the GenerationLock and the fork handler, the
Decoder's checks, score(), the verify bound, the alternates' bookkeeping, the drafter model's counts, the rewind of a
round cut short and _count_round.
Run from the copy:  python run.py decoder_mut.py tests/test_decoder.py --timeout 120
then each survivor against a wider selection (tests/test_api.py tests/test_logprobs.py tests/test_hardening.py ...).
"""
D = "edgespec/decoder.py"
MUTANTS = [
    # GenerationConfig
    ("DC1", D, "                object.__setattr__(self, name, v.item())", "                pass"),  # numpy scalars kept
    ("DC2", D, "        if self.max_new_tokens < 1:", "        if self.max_new_tokens < 0:"),  # 0 new tokens taken
    ("DC3", D, "not 0 <= self.seed < 2**63:", "not 0 <= self.seed <= 2**63:"),  # 2**63 taken (numpy's bound)
    ("DC4", D, "if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:", "if self.logprobs is not None and not 0 <= self.logprobs < MAX_LOGPROBS:"),  # 20 refused
    ("DC5", D, "if self.draft_tokens is not None and not 0 <= self.draft_tokens <= MAX_DRAFT:", "if self.draft_tokens is not None and not 1 <= self.draft_tokens <= MAX_DRAFT:"),  # 0 refused
    ("DC6", D, "if not 1 <= self.max_draft_tokens <= MAX_DRAFT:", "if not 1 <= self.max_draft_tokens < MAX_DRAFT:"),  # MAX_DRAFT refused
    ("DC7", D, "        if not isinstance(self.ignore_eos, (bool, np.bool_)):", "        if False:"),  # ignore_eos "no" taken
    ("DC8", D, "            pred = pred.tolist()", "            pass"),  # a numpy prediction refused
    ("DC9", D, "        if len(pred) > MAX_PREDICTION:", "        if len(pred) >= MAX_PREDICTION:"),  # the longest prediction refused
    ("DC10", D, "            ends = ends.tolist()", "            pass"),  # numpy stop ids refused
    ("DC11", D, "isinstance(ends, (list, tuple, set, frozenset))", "isinstance(ends, (list, tuple))"),  # a set of stop ids refused
    ("DC12", D, "            if not _within(v, -2.0, 2.0):", "            if not _within(v, -2.0, 20.0):"),  # penalty 3 taken
    ("DC13", D, "_within(self.repetition_penalty, MIN_REPETITION_PENALTY, 10.0)", "_within(self.repetition_penalty, 0.0, 10.0)"),  # 0.001 taken
    ("DC14", D, "            bias = list(bias.items())", "            pass"),  # a dict bias refused
    ("DC15", D, "                and not isinstance(kv[0], bool) and isinstance(kv[1], Real)", "                and isinstance(kv[1], Real)"),  # True as a token id
    ("DC16", D, "            if not _within(b, -100.0, 100.0):", "            if not _within(b, -1000.0, 1000.0):"),  # bias 500 taken
    ("DC17", D, "            if int(t) in seen:", "            if False:"),  # a token listed twice taken
    ("DC18", D, "for t, b in bias if b != 0)))", "for t, b in bias)))"),  # a zero bias kept: greedy fast path off
    ("DC19", D, "        if len(self.heal) > MAX_HEAL:", "        if len(self.heal) >= MAX_HEAL:"),  # 256 bytes refused
    ("DC20", D, "        if self.heal and self.grammar is not None:", "        if False:"),  # healing with a grammar taken
    ("DC21", D, "        if self.grammar is not None and self.ignore_eos:", "        if False:"),  # ignore_eos with a grammar
    ("DC22", D, '        if self.drafter == "prediction" and not self.prediction:', "        if False:"),  # prediction drafter, none given
    ("DC23", D, "    except (OverflowError, TypeError, ValueError):", "    except (TypeError, ValueError):"),  # 10**400: OverflowError
    ("DC24", D, "            or self.repetition_penalty != 1.0", "            or False"),  # repetition penalty not applied
    # token_logprobs
    ("DC25", D, "        lse = m + math.log(float(e.sum(dtype=np.float64)))", "        lse = m + math.log(float(e.sum()))"),  # float32 total
    ("DC26", D, "        k = min(top, len(x))", "        k = top"),  # top past the vocabulary
    ("DC27", D, "            idx = idx[np.lexsort((idx, -x[idx]))][:k]", "            idx = idx[np.argsort(-x[idx])][:k]"),  # ties not lower id first
    ("DC28", D, "            idx = np.flatnonzero(x >= cut)", "            idx = np.argpartition(x, len(x) - k)[len(x) - k:]"),  # ties at the cut arbitrary
    # Stats
    ("DC29", D, "        return max(self.new_tokens - 1, 0) / self.decode_s if self.new_tokens > 1 else 0.0", "        return self.new_tokens / self.decode_s if self.new_tokens > 1 else 0.0"),  # the first token counted
    ("DC30", D, "        return max(self.total_s - self.prefill_ms / 1000.0, 1e-9)", "        return max(self.total_s, 1e-9)"),  # prefill counted in decode
    ("DC31", D, "            acceptance_by_position=[round(a / d_, 4) if d_ else None for a, d_ in", "            acceptance_by_position=[round(a / d_, 4) if d_ else 0.0 for a, d_ in"),  # 0 for nothing drafted
    ("DC32", D, "        return self.accepted / self.rounds if self.rounds else 0.0", "        return self.accepted / self.target_calls if self.target_calls else 0.0"),  # per call, not per round
    ("DC33", D, '        d.pop("text_context")', "        pass"),  # the ids in to_dict
    # GenerationLock
    ("DC34", D, "        if me in self._owners:\n            raise BusyError", "        if False:\n            raise BusyError"),  # a generate() in its own stream waits forever
    ("DC35", D, "            self._owners = {me}\n", "            self._owners = set()\n"),  # the taker not an owner
    ("DC36", D, "        self._owners.add(me)", "        pass"),  # a stream handed on: reader not an owner
    ("DC37", D, "        if not self.running and (self.reader is me or self.reader_gone()):", "        if not self.running and self.reader is me:"),  # a gone reader's stream not closed
    ("DC38", D, "            self._owners.discard(me)", "            pass"),  # the hander stays an owner
    ("DC39", D, "        return self.reader is None or not self.reader.is_alive()", "        return self.reader is None"),  # an ended reader taken as alive
    ("DC40", D, "        return self._lock.locked() and (me not in self._owners or (self.running and self.reader is not me))", "        return self._lock.locked() and me not in self._owners"),  # a step running in another thread
    ("DC41", D, "        if threading.current_thread() in self._owners:\n            yield True\n            return\n", ""),  # its own holder refused
    ("DC42", D, "                and not any(t.is_alive() for t in list(self._owners)))", "                )"),  # a live owner: orphaned
    ("DC43", D, "    lm._RUNNING.clear()", "    pass"),  # the parent's calls kept in the child
    ("DC44", D, "            d.lock = GenerationLock()\n", ""),  # the child keeps the stranded lock
    # Decoder
    ("DC45", D, "        self.drafters.update(given)", "        pass"),  # a drafter not in the registry dropped
    ("DC46", D, "            self.policy.measured.observe_target(w, seconds)", "            pass"),  # the probe's timings unused
    ("DC47", D, 'use_alternates=bool(getattr(target, "cheap_rows", False))', "use_alternates=True"),  # alternates on everywhere
    ("DC48", D, "            if self.closed is not None:\n                raise ClosedError(self.closed)", "            if False:\n                raise ClosedError(self.closed)"),  # closed engine runs
    ("DC49", D, "            self.target.prompt_cache.clear()", "            pass"),  # reset keeps the prompt cache
    ("DC50", D, "            for d in self.drafters.values():\n                d.begin(prompt)\n", "            pass\n"),  # prefill: drafters not told
    ("DC51", D, "        bad = next((t for t in ids if not 0 <= t < self.vocab), None)", "        bad = next((t for t in ids if not 0 <= t <= self.vocab), None)"),  # vocab size taken as an id
    ("DC52", D, "            if pc is not None and t.length >= pc.min_tokens:", "            if False:"),  # score: the cache's rows lost
    ("DC53", D, "            t.rewind(t.length)\n", ""),  # score after a generation
    ("DC54", D, "                if start:\n                    t.check_interrupt", "                if False:\n                    t.check_interrupt"),  # score not interruptible
    ("DC55", D, "        if len(prompt) > self.target.max_context:\n            raise ContextOverflowError(f\"the prompt has {len(prompt)} tokens; the context holds \"", "        if len(prompt) >= self.target.max_context:\n            raise ContextOverflowError(f\"the prompt has {len(prompt)} tokens; the context holds \""),  # a full window refused
    ("DC56", D, "not isinstance(top, Integral) or not 0 <= top <= MAX_LOGPROBS:", "not isinstance(top, Integral) or not 0 <= top < MAX_LOGPROBS:"),  # score top 20 refused
    ("DC57", D, "        if len(prediction) > self.target.max_context:", "        if False:"),  # a prediction longer than the context
    ("DC58", D, '        self.check_ids([t for t, _ in cfg.logit_bias], "logit_bias")', "        pass"),  # bias of an id past the vocabulary
    ("DC59", D, "        if prompt_len >= self.target.max_context:", "        if prompt_len > self.target.max_context:"),  # a prompt filling the window
    ("DC60", D, "        if cfg.grammar is not None and self.constraints is None:", "        if False:"),  # no tokenizer: a grammar
    ("DC61", D, "            con.start(prompt)", "            pass"),  # a lazy grammar not told the prompt
    ("DC62", D, "                    self.lock.owners_add(threading.current_thread())", "                    pass"),  # reader not an owner
    ("DC63", D, "                gen.close()\n                self._ended()", "                gen.close()"),  # drafters not told the end
    ("DC64", D, "                except (EdgespecError, MemoryError) as e:", "                except EdgespecError as e:"),  # MemoryError escapes
    # _generate
    ("DC65", D, "    stop = (frozenset() if cfg.ignore_eos else self.eos) | frozenset(cfg.stop_token_ids)", "    stop = (frozenset() if cfg.ignore_eos else self.eos)"),  # stop ids ignored
    ("DC66", D, "        d.observe_hidden(-1)", "        pass"),  # an assistant not given the prefill's row
    ("DC67", D, "    st.reused_prompt_tokens, st.restored_prompt_tokens = target.last_reused, target.last_restored", "    st.reused_prompt_tokens = target.last_reused"),  # restored not counted
    ("DC68", D, "            if getattr(con, \"done\", False):  # healed: nothing is held from here\n                con = None", "            pass"),  # a healed reply held on
    ("DC69", D, "    first_lp = token_logprobs(np.asarray(raw_last)[None", "    first_lp = token_logprobs(np.asarray(last)[None"),  # the first logprob penalized
    ("DC70", D, '    self.drafters["prediction"].set_prediction(predicted)', '    if predicted:\n            self.drafters["prediction"].set_prediction(predicted)'),  # a prediction outlives its request
    ("DC71", D, "reproducible=cfg.seed is not None and not sp.greedy,", "reproducible=False,"),  # seeded sampling timing-driven
    ("DC72", D, "    plain_greedy = sp.greedy and not want_lp and pen is None", "    plain_greedy = sp.greedy and pen is None"),  # argmax path with logprobs
    ("DC73", D, "                       default=1) - 1", "                       default=1)"),  # one draft past the verified width
    ("DC74", D, "if padded_width(w, target.min_width, target.width_multiple) <= target.verified_width),", "if w <= target.verified_width),"),  # padding ignored
    ("DC75", D, "                kcap = min(remaining - 1, target.max_context - len(ctx))", "                kcap = min(remaining, target.max_context - len(ctx))"),  # a draft past the budget
    ("DC76", D, "None if cfg.draft_tokens is None else min(cfg.draft_tokens, vcap),", "cfg.draft_tokens,"),  # fixed k past the verified width
    ("DC77", D, '                        if choice.hint_stop is not None:\n                            kw["hint_stop"] = choice.hint_stop', "                        pass"),  # hint's stop dropped
    ("DC78", D, '                        kw["grammar"] = con', "                        pass"),  # drafter not held to the grammar
    ("DC79", D, "                    st.model_calls += dlm.calls - m0[0]", "                    st.model_calls += dlm.calls"),  # calls before counted
    ("DC80", D, "                    st.model_tokens += dlm.tokens_run - m0[1]", "                    st.model_tokens += dlm.tokens_run"),  # tokens before counted
    ("DC81", D, "                                         target.max_context - len(ctx) - len(draft.tokens),", "                                         target.max_context - len(ctx),"),  # alternates past the window
    ("DC82", D, "                    alts = [(i, d.sample(rng)) for i, d in alts if d is not None]", "                    alts = [(i, d.sample(rng)) for i, d in alts]"),  # an alternate q without mass
    ("DC83", D, "                    st.alternates_kept += kept_alt is not None", "                    pass"),  # kept alternates not counted
    ("DC84", D, "                    d.observe_hidden(n if kept_alt is None else kept_alt)", "                    d.observe_hidden(n)"),  # an assistant given the draft's row
    ("DC85", D, "                    choice.drafter.accept(n, nxt)", "                    pass"),  # the drafter not told what was kept
    ("DC86", D, "            if extra_rows > 0:\n                target.rewind(extra_rows)", "            pass"),  # a round cut short leaves its rows
    ("DC87", D, "                st.target_run_s = target.run_seconds - run0", "                st.target_run_s = target.run_seconds"),  # run time before counted
    ("DC88", D, "    if not k:\n        return\n", ""),  # an empty round counted as a round
    ("DC89", D, "        st.accepted_by_position[i] += 1 if i < n else 0", "        st.accepted_by_position[i] += 1 if i <= n else 0"),  # the rejected position counted
    ("DC90", D, '                _count_round(st, choice.drafter.name if k else "none"', '                _count_round(st, choice.drafter.name if choice.drafter else "none"'),  # an empty draft named
    ("DC91", D, "                    st.model_call_s += dlm.call_seconds - m0[2]", "                    st.model_call_s += dlm.call_seconds"),  # time before counted
    ("DC92", D, "                if con is not None and reason is None:\n                    con.consume(new)", "                if con is not None:\n                    con.consume(new)"),  # the grammar fed a final round
]
