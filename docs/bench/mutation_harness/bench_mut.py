"""Mutants of edgespec/bench.py (session 94): `edgespec bench`'s prompts, runs, summary, report and its files.
Run from the copy:  python run.py bench_mut.py tests/test_bench.py"""
F = "edgespec/bench.py"
MUTANTS = [
    # -- read_prompts ---------------------------------------------------------------------------------------------------
    ("BE1", F, "        if v is not None and v < 1:", "        if v is not None and v < 0:"),  # --limit 0 taken
    ("BE2", F, "        if not line.strip():\n            continue", "        if not line:\n            continue"),  # a blank line of spaces: not JSON
    ("BE3", F, "                or not all(isinstance(t, str) for t in q[\"turns\"]):", "                :"),  # turns [1, 2] taken
    ("BE4", F, "        empty = next((i for i, t in enumerate(q[\"turns\"]) if not t.strip()), None)", "        empty = next((i for i, t in enumerate(q[\"turns\"]) if not t), None)"),  # a turn of spaces
    ("BE5", F, "            raise ConfigError(f\"{p}:{n}: turn {empty + 1} is empty\")", "            raise ConfigError(f\"{p}:{n}: turn {empty} is empty\")"),  # off by one in the message
    ("BE6", F, "        q.setdefault(\"question_id\", str(n))", "        q.setdefault(\"question_id\", str(len(out)))"),  # default ids not line numbers
    ("BE7", F, "        if isinstance(q[\"question_id\"], bool) or not isinstance(q[\"question_id\"], (str, int)):", "        if not isinstance(q[\"question_id\"], (str, int)):"),  # true as an id
    ("BE8", F, "        q[\"question_id\"] = str(q[\"question_id\"])  # (Spec-Bench's", "        pass  # (Spec-Bench's"),  # integer ids kept ints
    ("BE9", F, "        if not isinstance(q[\"category\"], str):\n            raise", "        if False:\n            raise"),  # a category that is a list
    ("BE10", F, "        seen.add(q[\"category\"])\n        if categories", "        if categories"),  # every --categories unknown
    ("BE11", F, "        if per_category and sum(1 for o in out if o[\"category\"] == q[\"category\"]) >= per_category:", "        if per_category and sum(1 for o in out if o[\"category\"] == q[\"category\"]) > per_category:"),  # one more a category
    ("BE12", F, "    unknown = sorted(set(categories or ()) - seen)\n    if unknown:", "    unknown = sorted(set(categories or ()) - seen)\n    if False:"),  # a mistyped category: "no prompts"
    ("BE13", F, "    if limit:\n        out = out[:limit]", "    if limit:\n        out = out[:limit + 1]"),
    ("BE14", F, "    if not out:\n        raise ConfigError(f\"{p}: no prompts\")", "    if False:\n        raise ConfigError(f\"{p}: no prompts\")"),  # an empty file: a bench of nothing
    ("BE15", F, "            except UnicodeEncodeError:\n                raise ConfigError", "            except ValueError:\n                raise ConfigError"),  # (a subclass: equivalent?)
    ("BE16", F, "                        *((k, q[k]) for k in (\"category\", \"question_id\") if isinstance(q.get(k), str))]:", "                        ]:"),  # a surrogate in an id: the report fails after the run
    # -- Report.summary / markdown --------------------------------------------------------------------------------------
    ("BE17", F, "                toks = sum(max(r.new_tokens - 1, 0) for r in rs)", "                toks = sum(r.new_tokens for r in rs)"),  # the first token counted in decode speed
    ("BE18", F, "\"acceptance_rate\": round(acc / drafted, 4) if drafted else None,", "\"acceptance_rate\": round(acc / drafted, 4) if drafted else 0.0,"),  # no draft: 0 not –
    ("BE19", F, "\"mean_accepted_length\": round(acc / rounds, 3) if rounds else None,", "\"mean_accepted_length\": round(acc / max(1, drafted), 3) if rounds else None,"),
    ("BE20", F, "round(sum(r.new_tokens for r in rs) / max(1, sum(r.target_calls for r in rs)), 3)", "round(sum(r.new_tokens for r in rs) / max(1, len(rs)), 3)"),
    ("BE21", F, "\"ttft_ms\": round(sum(r.ttft_ms for r in rs) / len(rs), 2),", "\"ttft_ms\": round(max(r.ttft_ms for r in rs), 2),"),
    ("BE22", F, "\"tpot_ms\": round(1000 * secs / toks, 2) if toks else None,", "\"tpot_ms\": round(1000 * secs / max(1, toks + 1), 2) if toks else None,"),
    ("BE23", F, "                    \"exact\": (True if d == \"none\" and not _sampled(self.settings)", "                    \"exact\": (True if d == \"none\""),  # none's tick under sampling
    ("BE24", F, "else None if all(r.exact is None for r in rs) else all(r.exact is not False for r in rs)),", "else all(r.exact is not False for r in rs)),"),  # an unjudged runner ticked
    ("BE25", F, "else None if all(r.exact is None for r in rs) else all(r.exact is not False for r in rs)),", "else None if all(r.exact is None for r in rs) else any(r.exact for r in rs)),"),  # one exact run enough
    ("BE26", F, "            base = out[c].get(\"none\", {}).get(\"tokens_per_second\")", "            base = out[\"all\"].get(\"none\", {}).get(\"tokens_per_second\") if \"all\" in out else None"),  # speedup against the wrong base
    ("BE27", F, "                v[\"speedup\"] = round(v[\"tokens_per_second\"] / base, 3) if base else None", "                v[\"speedup\"] = round(v[\"tokens_per_second\"] / base, 3) if base else 1.0"),
    ("BE28", F, "        unjudged = {d for d in drafters if d != \"none\" and all(r.exact is None for r in self.runs if r.drafter == d)}", "        unjudged = set()"),
    ("BE29", F, "{'–' if _sampled(self.settings) or d in unjudged or v['exact'] is None else '✓' if v['exact'] else '✗'} |\")", "{'✓' if v['exact'] else '✗'} |\")"),
    ("BE30", F, "        if self.left_out:\n            lines += [\"\", f\"Left out", "        if False:\n            lines += [\"\", f\"Left out"),
    ("BE31", F, "        if self.stopped:\n            lines += [\"\", f\"**Stopped early**", "        if False:\n            lines += [\"\", f\"**Stopped early**"),
    ("BE32", F, "    return f\"{n} threads · \" if n else \"threads: onnxruntime's default (one per core) · \"", "    return f\"{n} threads · \""),  # 0 threads shown as "0 threads"
    ("BE33", F, "    return not SamplingParams(settings.get(\"temperature\") or 0.0, top_p=1.0 if top_p is None else top_p).greedy", "    return bool(settings.get(\"temperature\"))"),  # top_p 0 at T>0 called sampled
    ("BE34", F, "    penalty = [f\"repetition penalty {rp}\"] if rp != 1.0 else []", "    penalty = []"),
    # -- parse_drafters -------------------------------------------------------------------------------------------------
    ("BE35", F, "    twice = sorted({d for d in drafters if d != \"none\" and list(drafters).count(d) > 1})", "    twice = []"),
    ("BE36", F, "            if not b.isdecimal() or not b.isascii() or not 1 <= int(b) <= MAX_DRAFT or name == \"none\":", "            if not b.isdecimal() or not 1 <= int(b) <= MAX_DRAFT or name == \"none\":"),  # auto@٣ (Arabic digit)
    ("BE37", F, "            if not b.isdecimal() or not b.isascii() or not 1 <= int(b) <= MAX_DRAFT or name == \"none\":", "            if not b.isdecimal() or not b.isascii() or not 0 <= int(b) <= MAX_DRAFT or name == \"none\":"),  # auto@0
    ("BE38", F, "            if not b.isdecimal() or not b.isascii() or not 1 <= int(b) <= MAX_DRAFT or name == \"none\":", "            if not b.isdecimal() or not b.isascii() or not 1 <= int(b) <= MAX_DRAFT:"),  # none@4 taken
    ("BE39", F, "                                                  or not 1 <= int(k) <= MAX_DRAFT)):", "                                                  or not 1 <= int(k))):"),  # model:1000
    ("BE40", F, "    if name == \"prediction\":\n        raise ConfigError", "    if False:\n        raise ConfigError"),
    ("BE41", F, "    return name, int(k) if k else (None if bound or name == \"none\" else draft_tokens), bound", "    return name, int(k) if k else draft_tokens, bound"),  # auto@8 with --draft-tokens: fixed k
    # -- run_bench / _bench_prompts -------------------------------------------------------------------------------------
    ("BE42", F, "        if n >= room:\n            log(f\"  left out {q['question_id']}", "        if n > room:\n            log(f\"  left out {q['question_id']}"),  # a prompt of exactly the context: no room for a reply
    ("BE43", F, "    if not fits:  # (a report of no runs", "    if False:  # (a report of no runs"),
    ("BE44", F, "    if sfx is not None:\n        sfx.recording = False\n    mem", "    mem"),  # a runner's reply recalled by the next as a repeat
    ("BE45", F, "        states.restore()\n", "        pass\n"),  # the engine's policy left as the last runner's
    ("BE46", F, "            sfx.recording = recording\n", "            pass\n"),  # recording left off after a bench
    ("BE47", F, "                states.enter(d)\n", ""),  # runners share what they learn
    ("BE48", F, "                exact = None if d == \"none\" or _sampled(sampling) else out == ref", "                exact = None if d == \"none\" else out == ref"),  # sampled runs judged
    ("BE49", F, "            if len(ids) >= room:\n                log(f\"  {q['question_id']} turn {ti + 1} left out", "            if len(ids) > room:\n                log(f\"  {q['question_id']} turn {ti + 1} left out"),
    ("BE50", F, "                exact = None if x.get(\"reference\") == name else out == outputs.get(x.get(\"reference\", \"none\"), ref)", "                exact = out == ref"),  # genai's draft runs judged against edgespec's, not genai-ar
    ("BE51", F, "            if sfx is not None and ref is not None:\n                sfx.remember(ref, prompt=ids)", "            if False:\n                sfx.remember(ref, prompt=ids)"),  # --memory: nothing remembered
    ("BE52", F, "            history.append({\"role\": \"assistant\", \"content\": tok.decode(reply_ids)})", "            history.append({\"role\": \"assistant\", \"content\": \"\"})"),  # a second turn without the first reply
    ("BE53", F, "                       \"terminated\" if type(e).__name__ == \"Terminated\" else", ""),  # SIGTERM's stop named by its class
    ("BE54", F, "        e.report = rep  # (the caller writes", "        pass  # (the caller writes"),  # an interrupted run's report lost
    ("BE55", F, "                                    1000 * st.decode_s / max(1, st.new_tokens - 1), st.drafted, st.accepted,", "                                    1000 * st.decode_s / max(1, st.new_tokens), st.drafted, st.accepted,"),
    # -- report files ---------------------------------------------------------------------------------------------------
    ("BE56", F, "        if os.path.lexists(path) and not path.is_file():", "        if os.path.exists(path) and not path.is_file():"),  # a dangling link named report.md
    ("BE57", F, "    foreign = js if js.is_file() and not _bench_report(js) else md if md.is_file() and not _bench_markdown(md) \\", "    foreign = js if js.is_file() and not _bench_report(js) else None if True \\"),  # a user's report.md replaced
    ("BE58", F, "    if plots:\n        raise ConfigError(f\"{Path(out_dir) / plots[0]} is no plot", "    if False:\n        raise ConfigError(f\"{Path(out_dir) / plots[0]} is no plot"),
    ("BE59", F, "            return f.read(17) == b\"# edgespec bench:\"", "            return f.read(2) == b\"# \""),  # any markdown heading is a bench's
    ("BE60", F, "    return d if isinstance(d, dict) and isinstance(d.get(\"runs\"), list) else None", "    return d if isinstance(d, dict) else None"),  # any JSON object is a report
    ("BE61", F, "    return not d.get(\"stopped\") or (more_than is not None and len(d[\"runs\"]) > more_than)", "    return not d.get(\"stopped\")"),  # a stopped run of more runs overwritten by a shorter one
    ("BE62", F, "    if rep is None or not rep.runs:\n        return", "    if rep is None:\n        return"),  # a report of no runs written
    ("BE63", F, "stem=\"report.partial\" if partial else \"report\")", "stem=\"report\")"),  # an interrupted rerun replaces a whole report
    ("BE64", F, "        tmp.unlink(missing_ok=True)\n        if isinstance(e, OSError):", "        if isinstance(e, OSError):"),  # a temp file left on a full disk
    ("BE65", F, "            if name.endswith(\".png\") and name not in made and name not in theirs:", "            if name.endswith(\".png\") and name not in made:"),  # a user's plot deleted
    ("BE66", F, "        if not rep.stopped and _bench_report(out / \"report.partial.json\") is not None:", "        if _bench_report(out / \"report.partial.json\") is not None:"),  # a stopped run deletes another's partial report
    ("BE67", F, "    if stem == \"report\":  # (an earlier run's plots", "    if False:  # (an earlier run's plots"),  # stale plots kept beside a new report
]
