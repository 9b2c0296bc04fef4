"""Mutants of edgespec/server.py, a second pass (session 100, helper) after session 93's SV1-SV70
(server_app.py): the scheduler's bookkeeping, the device thread's summary, the small endpoints, the streams' items,
usage, the body limits, the error handlers and the guards' edges. Run from the copy (mutation_s100_server.md):
  PYTEST_ADDOPTS="-p mutorder" python run.py server_mut2.py tests/test_server.py tests/test_server_mutants.py
"""
F = "edgespec/server.py"
MUTANTS = [
    # -- Scheduler -----------------------------------------------------------------------------------------------------
    ("SR1", F, "        self.closing = True\n        for g in list(self.active):", "        for g in list(self.active):"),  # closing never set
    ("SR2", F, "        for g in list(self.active):\n            g.cancel(shutdown=True)",
     "        for g in list(self.active)[:1]:\n            g.cancel(shutdown=True)"),  # a stop cancels only one generation
    ("SR3", F, "        return not pending\n", "        return True\n"),  # join says done with a generation running
    ("SR4", F, "        if self._own_device:\n            self.device.close", "        if True:\n            self.device.close"),  # a caller's device thread closed
    ("SR5", F, "        sched.running.discard(job)\n", "        pass\n"),  # finished jobs kept in running
    # -- Generation ----------------------------------------------------------------------------------------------------
    ("SR6", F, "        if sched.closing:  # a request's next choice", "        if False:  # a request's next choice"),  # a choice made after the stop began runs
    ("SR7", F, "        self.shutdown = sched.closing\n", "        self.shutdown = False\n"),  # ... and is no 503
    ("SR8", F, "            self.sched.waiting -= 1\n", "            pass\n"),  # waiting never decremented
    ("SR9", F, "        self._cancel.set()\n        self._unqueue()\n", "        self._cancel.set()\n"),  # cancel leaves it counted as waiting
    ("SR10", F, "        if not self._started:\n            self.sched.active.discard(self)\n", ""),  # a cancelled queued generation stays active
    ("SR11", F, "            sched.metrics.generation(None, 0.0, cancelled=True, failed=False)  # (never begun",
     "            pass  # (never begun"),  # a choice cancelled before it began not counted
    ("SR12", F, "                yield \"error\", shutting_down()\n            return\n        try:",
     "                pass\n            return\n        try:"),  # a choice made after the stop: no 503
    ("SR13", F, "        except BaseException:  # (the client gone while it waited: its task cancelled)\n            sched.metrics.generation(None, (time.perf_counter() - t0) * 1000, cancelled=True, failed=False)\n",
     "        except BaseException:  # (the client gone while it waited: its task cancelled)\n"),  # a queued client gone not counted
    ("SR14", F, "        finally:\n            self._unqueue()\n", "        finally:\n            pass\n"),  # a started generation stays counted as waiting
    ("SR15", F, "            sched.lock.release()\n            sched.metrics.generation(None, (time.perf_counter() - t0) * 1000, cancelled=True, failed=False)\n            if self.shutdown:\n                yield",
     "            sched.lock.release()\n            sched.metrics.generation(None, (time.perf_counter() - t0) * 1000, cancelled=True, failed=False)\n            if False:\n                yield"),  # a queued request stopped by shutdown: no 503
    ("SR16", F, "            self._finished(q, None, RuntimeError(\"the worker thread is closed\"), False)\n", "            pass\n"),  # device closed: the turn never freed
    ("SR17", F, "                    parts.append(text)\n", "                    pass\n"),  # piled-up deltas' text dropped
    ("SR18", F, "                        lps = [*(lps or ()), *more]\n", "                        lps = more\n"),  # piled-up deltas' logprobs: the last only
    ("SR19", F, "            if item[0] != \"delta\":\n                return\n", "            if item[0] == \"error\":\n                return\n"),  # done does not end events
    # -- _work ---------------------------------------------------------------------------------------------------------
    ("SR20", F, "        if self._cancel.is_set():  # the client left (or the server began to stop) before this choice began\n            self._stopped = True\n",
     "        if False:  # the client left (or the server began to stop) before this choice began\n            self._stopped = True\n"),  # cancelled before it began: scored/generated all the same
    ("SR21", F, "            for m in lms:\n                m.interrupt = None\n", "            for m in lms:\n                pass\n"),  # the interrupt hook left set
    ("SR22", F, "head, entries = dec.push(self.ids) + dec.flush(), None", "head, entries = dec.push(self.ids), None"),  # echo: the prompt's last partial character lost
    ("SR23", F, "            if self.kw[\"max_new_tokens\"] > 0 and not self._stopped:", "            if self.kw[\"max_new_tokens\"] >= 0 and not self._stopped:"),  # echo max_tokens 0 generates
    ("SR24", F, "                    gen.close()\n                except Exception:", "                    pass\n                except Exception:"),  # the engine's stream never closed
    ("SR25", F, '"prompt_tokens": len(self.ids), "finish_reason": "length"}', '"prompt_tokens": len(self.ids), "finish_reason": "stop"}'),  # score-only finish reason stop
    ("SR26", F, 'summary["target_calls"] = (summary.get("target_calls") or 0) + score_calls', 'summary["target_calls"] = summary.get("target_calls") or 0'),  # scoring calls not counted
    ("SR27", F, '"prompt_tokens": len(self.ids), "finish_reason"', '"prompt_tokens": 0, "finish_reason"'),  # score-only prompt_tokens 0
    ("SR28", F, "                    if \"prediction\" in self.kw:  # OpenAI's counts", "                    if False:  # OpenAI's counts"),  # prediction counts missing
    ("SR29", F, "        self.sched.busy = False\n", "        pass\n"),  # busy never cleared
    ("SR30", F, "        self.sched.active.discard(self)\n        self.sched.metrics.generation(", "        self.sched.metrics.generation("),  # finished generations stay active
    # -- EventStream / _until_disconnect ----------------------------------------------------------------------------------
    ("SR31", F, 'headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})', 'headers={"Cache-Control": "no-cache"})'),  # nginx buffers the stream
    ("SR32", F, "            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)", "            await asyncio.wait(tasks, return_when=asyncio.ALL_COMPLETED)"),  # a stream waits for the disconnect
    ("SR33", F, "        if work.done():\n            return work.result()\n        return None", "        if watch.done():\n            return None\n        return work.result()"),  # (equivalent form?)
    # -- Server: small endpoints ---------------------------------------------------------------------------------------
    ("SR34", F, '        if reasoning_format not in ("auto", "none"):', '        if False:'),  # a bad reasoning_format accepted
    ("SR35", F, 'think_tags(engine.tokenizer) if reasoning_format == "auto" else None', 'think_tags(engine.tokenizer)'),  # reasoning_format none ignored
    ("SR36", F, "        if not name:  # (/v1/models/: the list, as /v1/models)\n            return await self.models(request)\n", ""),  # /v1/models/ a 404
    ("SR37", F, "            raise P.APIError(404, f\"the model '{name}' does not exist", "            raise P.APIError(400, f\"the model '{name}' does not exist"),  # unknown model 400
    ("SR38", F, "        if least > limit:\n            raise too_long(least, \"at least \")", "        if False:\n            raise too_long(least, \"at least \")"),  # /tokenize tokenizes a huge prompt first
    ("SR39", F, '        param = "messages" if req.messages is not None else "prompt"\n', '        param = "prompt"\n'),  # /tokenize's messages error names prompt
    ("SR40", F, "            raise P.bad(str(e).splitlines()[0], param) from None\n        if len(ids) > limit:", "            raise\n        if len(ids) > limit:"),  # /tokenize's engine refusal a 500
    ("SR41", F, "            raise P.bad(str(e), \"tokens\") from None", "            raise P.bad(str(e), \"prompt\") from None"),  # /detokenize's refusal names prompt
    ("SR42", F, "self.engine.tokenizer.decode, toks, False)", "self.engine.tokenizer.decode, toks, True)"),  # /detokenize drops special tokens' text
    # -- _generate -----------------------------------------------------------------------------------------------------
    ("SR43", F, "                param = at.group(0) if at else next(", "                param = \"tools\" if at else next("),  # a tool's error names tools, not tools[0].x
    ("SR44", F, "                if req.responses is not None:\n                    msg, param = P.responses_message(msg), P.responses_param(param)\n",
     "                if False:\n                    msg, param = P.responses_message(msg), P.responses_param(param)\n"),  # Responses tool error in chat words
    ("SR45", F, "held=req.response_format is not None)", "held=False)"),  # tools beside response_format not held
    ("SR46", F, "                    await run_in_threadpool(self.engine.decoder.constraints, treq.grammar)\n", "                    pass\n"),  # a tool grammar not compiled up front
    ("SR47", F, '            kw.pop("draft_tokens", None)\n', "            pass\n"),  # draft_tokens left beside drafter none
    ("SR48", F, '            kw["grammar"] = treq.grammar\n', "            pass\n"),  # tool calls not held to their grammar
    ("SR49", F, '                    raise P.bad(P.responses_message(msg), P.responses_param("response_format")) from None', '                    raise P.bad(msg, "response_format") from None'),  # Responses schema error named in chat words
    ("SR50", F, "            if least > ctx:\n", "            if False:\n"),  # a huge prediction tokenized first
    ("SR51", F, "text, add_special=False,\n                                                       parse_special=False)", "text, add_special=False,\n                                                       parse_special=True)"),  # a prediction's special-token text read as special
    ("SR52", F, "        stops = req.stop + (treq.stops(self.engine.think_tags() is not None) if treq is not None else [])", "        stops = req.stop"),  # tool stops dropped
    ("SR53", F, "treq.stops(self.engine.think_tags() is not None)", "treq.stops(False)"),  # a thinking model's tool stops
    ("SR54", F, '        grammar_param = None if "grammar" not in kw else "response_format" if req.response_format is not None \\\n            else "tools"',
     '        grammar_param = None if "grammar" not in kw else "tools"'),  # a schema's mid-reply error names tools
    ("SR55", F, "        if grammar_param is not None and req.responses is not None:\n", "        if False:\n"),  # Responses grammar error named in chat words
    ("SR56", F, '        ext = {"max_tokens": min(p[3] for p in prepared),', '        ext = {"max_tokens": prepared[0][3],'),  # ext max_tokens the first prompt's
    ("SR57", F, "any(req.max_tokens > p[2] for p in prepared)", "any(req.max_tokens >= p[2] for p in prepared)"),  # max_tokens == room said clamped
    ("SR58", F, "            run.inside = run_inside\n", "            pass\n"),  # streams never split thinking
    ("SR59", F, '            s = {**s, "queue_ms": round(gen.queue_ms, 3)}\n', ""),  # non-streamed queue_ms missing
    ("SR60", F, "            if treq is not None and treq.parses:\n                parser = treq.parser()", "            if treq is not None:\n                parser = treq.parser()"),  # tool_choice none parsed
    ("SR61", F, '            choices.append({**body["choices"][0], "index": i})', '            choices.append(body["choices"][0])'),  # n>1 indexes all 0
    ("SR62", F, 'items = ([P.reasoning_item(P.item_id("rs"), reasoning, "completed" if closed else cut)]', 'items = ([P.reasoning_item(P.item_id("rs"), reasoning, cut)]'),  # a closed reasoning item incomplete
    ("SR63", F, '"completed" if j + 1 < len(out) else cut)', 'cut)'),  # every message item incomplete on a cut
    ("SR64", F, "                        if not v:\n                            continue\n", ""),  # an empty message item after a call
    # -- _prepare ------------------------------------------------------------------------------------------------------
    ("SR65", F, '                self.engine.decoder.check_ids(source, "the prompt")\n', "                pass\n"),  # token prompt ids unchecked
    ("SR66", F, "            raise P.APIError(400, str(e), param=param, code=\"context_length_exceeded\") from None", "            raise P.APIError(400, str(e), param=param) from None"),  # overflow without its code
    ("SR67", F, '            if msg.startswith("chat_template_kwargs"):', "            if False:"),  # kwargs error blamed on messages
    ("SR68", F, "P.responses_message(msg, req.responses[\"where\"])", "msg"),  # Responses template error in chat words
    ("SR69", F, "        if n == 0:  # refused here", "        if n < 0:  # refused here"),  # an empty prompt reaches the engine
    ("SR70", F, "        if score_only and n > ctx:", "        if score_only and n >= ctx:"),  # a scored prompt filling the context refused
    # -- _collect / _sse -----------------------------------------------------------------------------------------------
    ("SR71", F, "                raise P.engine_error(val, gen.grammar_param)", "                raise P.engine_error(val, None)"),  # non-streamed grammar error names nothing
    ("SR72", F, '                        first["choices"][0]["delta"]["content"] = None', "                        pass"),  # tool stream's first content ""
    ("SR73", F, '                            self.metrics.add("tool_calls", len(parser.calls))\n                            if not parser.calls',
     "                            pass\n                            if not parser.calls"),  # streamed tool calls not counted
    ("SR74", F, "                            if not parser.calls and not parser.content:  # no calls", "                            if False:  # no calls"),  # empty tool reply streamed without content ""
    ("SR75", F, "                                            calls=parser is not None and bool(parser.calls), index=i))", "                                            calls=False, index=i))"),  # streamed finish_reason not tool_calls
    ("SR76", F, "                            yield P.sse(P.chunk(k, rid, model, created, reasoning=v, with_usage=wu,\n                                                logprobs=list(held) if held else None, index=i))",
     "                            yield P.sse(P.chunk(k, rid, model, created, reasoning=v, with_usage=wu,\n                                                logprobs=None, index=i))"),  # reasoning chunks' logprobs dropped (and cleared)
    ("SR77", F, "                gen = run.current if i == 0 else run.next()", "                gen = run.next()"),  # choice 0 made twice
    # -- _sse_responses ------------------------------------------------------------------------------------------------
    ("SR78", F, 'return P.sse_event(kind, {**obj, "sequence_number": seq - 1})', 'return P.sse_event(kind, {**obj, "sequence_number": seq})'),  # sequence numbers from 1
    ("SR79", F, "            out = close_reasoning()\n            out += open_message()", "            out = []\n            out += open_message()"),  # a message opened with the reasoning item open
    ("SR80", F, "            out = close_reasoning() + close_message()\n", "            out = close_reasoning()\n"),  # a call with the message open
    ("SR81", F, '                        self.metrics.add("tool_calls", len(parser.calls))\n                    for b in close_reasoning(', '                        pass\n                    for b in close_reasoning('),  # Responses streamed calls not counted
    ("SR82", F, 'close_reasoning("completed" if splitter is not None and splitter.closed else status)', "close_reasoning(status)"),  # a closed reasoning item incomplete (streamed)
    ("SR83", F, '                    for b in close_reasoning("incomplete") + close_message("incomplete"):', '                    for b in close_message("incomplete"):'),  # failed: the reasoning item lost
    # -- _usage --------------------------------------------------------------------------------------------------------
    ("SR84", F, "pred if \"prediction\" in req.options else None", "None"),  # prediction details missing from usage
    ("SR85", F, 'sum(s["reused_prompt_tokens"] for s in firsts)', 'sum(s["reused_prompt_tokens"] for s in summaries)'),  # n>1 cached tokens per choice
    ("SR86", F, "reasoning=sum(thought) if thought else None)", "reasoning=thought[0] if thought else None)"),  # reasoning tokens of the first choice only
    ("SR87", F, "        self.current = None if self.cancelled else self.make(self.made)", "        self.current = self.make(self.made)"),  # a choice made after the client left
    ("SR88", F, '("drafter", "edgespec.drafter"), ', ""),  # drafter refusal names no param
    # -- body, handlers, guards ----------------------------------------------------------------------------------------
    ("SR89", F, "    if declared > P.MAX_BODY:\n", "    if declared >= P.MAX_BODY:\n"),  # a body of exactly MAX_BODY refused (declared)
    ("SR90", F, "            if size > P.MAX_BODY:\n", "            if size >= P.MAX_BODY:\n"),  # ... (read)
    ("SR91", F, '        raise P.APIError(499, "the client disconnected', '        raise P.APIError(400, "the client disconnected'),  # a client gone mid-body counted 400
    ("SR92", F, '    code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)', "    code = None"),  # 404/405 without a code
    ("SR93", F, "return JSONResponse(P.error_body(what, code=code), status_code=e.status_code, headers=e.headers)", "return JSONResponse(P.error_body(what, code=code), status_code=e.status_code)"),  # 405 without Allow
    ("SR94", F, 'code="internal_error"), status_code=500)', 'code="internal_error"), status_code=400)'),  # a crash a 400
    ("SR95", F, "json.dumps(content, ensure_ascii=True, allow_nan=False", "json.dumps(content, ensure_ascii=False, allow_nan=False"),  # errors with lone surrogates unencodable
    ("SR96", F, "        headers = {k: v for k, v in r.headers.items() if k.lower() not in (\"content-length\", \"content-type\")}", "        headers = {}"),  # CORS 400 without its CORS headers
    ("SR97", F, 'self.app, self.any, self.origins = app, "*" in origins, set(origins)', "self.app, self.any, self.origins = app, False, set(origins)"),  # --allow-origin * refuses pages
    ("SR98", F, 'P.error_body(msg, code="origin_not_allowed"), status_code=403)', 'P.error_body(msg, code="origin_not_allowed"), status_code=400)'),  # origin refusal 400
    ("SR99", F, '    OPEN = ("/health",)', "    OPEN = ()"),  # /health needs the key
    ("SR100", F, "(an OpenAI client's api_key)\" if not got", "(an OpenAI client's api_key)\" if got"),  # the two 401 messages swapped
    ("SR101", F, "    if not (8 <= len(key) <= 512 and", "    if not (9 <= len(key) <= 512 and"),  # an 8-character key refused
    ("SR102", F, 'key.isprintable() and " " not in key):', "key.isprintable()):"),  # a key with a space accepted
    ("SR103", F, "    if \":\" in host:\n        host = f\"[{host}]\"\n", ""),  # an IPv6 origin without brackets
    ("SR104", F, '(("http", 80), ("https", 443))', '(("http", 80),)'),  # https :443 kept
    ("SR105", F, "or u.path not in (\"\", \"/\") or u.query", "or u.query"),  # an origin with a path accepted
    ("SR106", F, " or u.username or u.password\n", "\n"),  # an origin with user info accepted
    ("SR107", F, 're.fullmatch(r"[a-z][a-z0-9+.-]*", u.scheme)', 're.fullmatch(r"[a-z0-9+.-]*", u.scheme)'),  # a scheme starting with a digit
    # -- create_app / bind ---------------------------------------------------------------------------------------------
    ("SR108", F, "    elif isinstance(temperature, str):\n", "    elif False:\n"),  # temperature 'hot' accepted
    ("SR109", F, "    if bad:\n        raise ConfigError(f\"sampling takes", "    if False:\n        raise ConfigError(f\"sampling takes"),  # unknown sampling keys accepted
    ("SR110", F, "    engine.config(**sampling)  # (a bad value now", "    pass  # (a bad value now"),  # a bad sampling value at the first request
    ("SR111", F, 'allow_methods=["GET", "POST", "DELETE"]', 'allow_methods=["GET", "POST"]'),  # a DELETE preflight refused
    ("SR112", F, "        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n", ""),  # a restart fails on TIME_WAIT
    ("SR113", F, "    except (socket.gaierror, UnicodeError) as e:", "    except socket.gaierror as e:"),  # a host that is no IDNA: traceback
]
