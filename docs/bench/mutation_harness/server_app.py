"""Mutants of edgespec/server.py (session 93, helper): the OpenAI-compatible HTTP server (its wire format,
server_protocol.py, was mutation-tested before). Run from the copy:
  python run.py server_app.py tests/test_server.py
"""
F = "edgespec/server.py"
MUTANTS = [
    # -- Scheduler ---------------------------------------------------------------------------------------------------
    ("SV1", F, "if self.waiting < self.queue_size or", "if self.waiting <= self.queue_size or"),  # one more waits than queue_size
    ("SV2", F, 'headers={"Retry-After": "1"})', "headers={})"),  # 429 without Retry-After
    ("SV3", F, "        self.metrics.rejected += 1\n", "        pass\n"),  # a 429 not counted in the metrics
    ("SV4", F, 'raise P.APIError(429, f"the server is busy', 'raise P.APIError(503, f"the server is busy'),  # queue full: 503, not 429
    ("SV5", F, "        if self.closing:\n            raise shutting_down()\n", "        if False:\n            raise shutting_down()\n"),  # a request admitted while shutting down
    ("SV6", F, "            g.cancel(shutdown=True)", "            g.cancel()"),  # shutdown cancels as a disconnect: the client gets no 503
    ("SV7", F, "or (not self.busy and self.waiting == 0 and not self.lock.locked())", "or (self.waiting == 0)"),  # queue_size 0: a request admitted while one runs
    # -- Generation --------------------------------------------------------------------------------------------------
    ("SV8", F, "        if self._cancel.is_set():\n            sched.lock.release()\n", "        if False:\n            sched.lock.release()\n"),  # a request cancelled while queued still runs when its turn comes
    ("SV9", F, "        sched.busy = True\n", "        sched.busy = False\n"),  # health busy / generation_running gauge never 1
    ("SV10", F, "        self.queue_ms = (time.perf_counter() - t0) * 1000\n", "        self.queue_ms = 0.0\n"),  # queue_ms always 0
    ("SV11", F, "                m.interrupt = self._cancel.is_set\n", "                m.interrupt = None\n"),  # a prefill does not stop on cancel
    ("SV12", F, "                shift = len(head)\n", "                shift = 0\n"),  # echo: logprob offsets not shifted by the prompt's text
    ("SV13", F, "                    self._stopped = True\n                    break\n", "                    self._stopped = True\n"),  # a cancelled generation runs on to its end
    ("SV14", F, "                if delta or lps:", "                if delta:"),  # logprobs of a token with no text (EOS) dropped
    ("SV15", F, "        except Interrupted:  # (the cancel flag, seen within a prefill: as at a round's end)\n            self._stopped = True\n",
     "        except Interrupted:  # (the cancel flag, seen within a prefill: as at a round's end)\n            pass\n"),  # a prefill interrupted by shutdown: a 'done', not the 503
    ("SV16", F, 'summary["reused_prompt_tokens"] = summary["restored_prompt_tokens"] = 0', "pass"),  # a scored (echo+logprobs) prompt reports cached tokens
    ("SV17", F, 'summary["completion_tokens"] = len(returned)', 'summary["completion_tokens"] = len(out)'),  # usage counts a stop string's tokens
    ("SV18", F, "summary[\"reasoning_tokens\"] = reasoning_tokens(returned, *self.think)", "summary[\"reasoning_tokens\"] = 0"),  # reasoning_tokens always 0
    ("SV19", F, "        if err is None and self.shutdown and self._stopped:", "        if err is None and self.shutdown:"),  # a reply finished whole before the stop gets the 503
    ("SV20", F, "self.queue_ms, cancelled=cancelled, failed=err is not None)", "self.queue_ms, cancelled=False, failed=err is not None)"),  # a cancelled generation not counted as cancelled
    # -- EventStream / disconnects -------------------------------------------------------------------------------------
    ("SV21", F, "            self.on_close()\n", "            pass\n"),  # a stream's disconnect does not cancel the generation
    ("SV22", F, "                return Response(status_code=499)", "                return Response(status_code=200)"),  # a gone client's request counted as 200
    ("SV23", F, "            finally:\n                gen.cancel()\n            if out is None:", "            finally:\n                pass\n            if out is None:"),  # a non-streamed request's disconnect does not stop its generation
    # -- Server's small endpoints -------------------------------------------------------------------------------------
    ("SV24", F, "return {**self.template_kwargs, **(req.template_kwargs or {})} or None", "return {**(req.template_kwargs or {}), **self.template_kwargs} or None"),  # server's chat_template_kwargs override the request's
    ("SV25", F, "if req.response_format is not None or (treq is not None and treq.forced):", "if req.response_format is not None:"),  # a forced tool call's reply read as starting inside <think>
    ("SV26", F, '"queue_depth": self.sched.waiting,', '"queue_depth": 0,'),  # queue_depth gauge always 0
    ("SV27", F, "        if len(ids) > limit:\n", "        if len(ids) > limit + 1:\n"),  # /tokenize one token over the bound accepted
    ("SV28", F, "        if len(toks) > limit:\n", "        if len(toks) >= limit:\n"),  # /detokenize of exactly 4 contexts refused
    ("SV29", F, "            self.engine.decoder.check_ids(toks, \"'tokens'\")\n", "            pass\n"),  # /detokenize of an out-of-vocabulary id: 500, not 400
    # -- _generate ---------------------------------------------------------------------------------------------------
    ("SV30", F, 'if treq is not None and treq.parses and "logprobs" in req.options:', 'if False:'),  # logprobs with parsed tools accepted
    ("SV31", F, "                self.engine.infill_stops()\n", "                pass\n"),  # suffix on a model without FIM tokens not refused up front
    ("SV32", F, 'if kw.get("drafter") == "none" and not {"drafter", "draft_tokens"} <= req.options.keys():', 'if kw.get("drafter") == "none":'),  # a request sending drafter none + draft_tokens not refused
    ("SV33", F, 'if len(kw["prediction"]) > ctx:', 'if len(kw["prediction"]) > ctx + 1:'),  # a prediction one token over the context accepted
    ("SV34", F, "raise P.bad(msg, _param_of(msg)) from None", "raise P.bad(msg, None) from None"),  # an engine refusal names no param
    ("SV35", F, '            self.metrics.add("constrained_generations")\n', "            pass\n"),  # constrained generations not counted
    ("SV36", F, 'kw_i["seed"] = (kw["seed"] + j) % 2**63', 'kw_i["seed"] = kw["seed"]'),  # n>1 choices all with the same seed
    ("SV37", F, 'kw_i["seed"] = (kw["seed"] + j) % 2**63', 'kw_i["seed"] = (kw["seed"] + i) % 2**63'),  # seed + i, not seed + i % n (several prompts)
    ("SV38", F, '"max_new_tokens": 0 if score_only else max(p_max, 1)}', '"max_new_tokens": 0 if score_only else kw["max_new_tokens"]}'),  # every prompt gets the first's max_tokens
    ("SV39", F, '            kw_i.pop("heal", None)\n', ""),  # a later prompt keeps the first prompt's heal bytes
    ("SV40", F, '            self.metrics.add("tool_calls", len(calls))\n', "            pass\n"),  # non-streamed tool calls not counted
    ("SV41", F, 'ext = {**ext, **summaries[0]} if choices_n == 1 else {**ext, "choices": summaries}', 'ext = {**ext, **summaries[0]}'),  # n>1: edgespec.choices missing
    ("SV42", F, "v = v.lstrip() if n else v  # (a message after a call", "v = v  # (a message after a call"),  # Responses: a message after a call keeps its line break
    ("SV43", F, "        if room < 1 and not score_only:", "        if room < 0 and not score_only:"),  # a prompt filling the context exactly accepted (no room for a token)
    ("SV44", F, "max_new = room if req.max_tokens is None else min(req.max_tokens, room)", "max_new = room if req.max_tokens is None else req.max_tokens"),  # max_tokens not clamped to the room
    ("SV45", F, "        if req.token_healing:  # the token before", "        if False:  # the token before"),  # token_healing ignored
    ("SV46", F, 'parts, lps = [], ([] if gen.kw.get("logprobs") is not None else None)', "parts, lps = [], None"),  # logprobs of an empty reply null, not []
    # -- streams -----------------------------------------------------------------------------------------------------
    ("SV47", F, "            if req.include_usage:\n                yield", "            if False:\n                yield"),  # include_usage's usage chunk dropped
    ("SV48", F, "            yield P.SSE_DONE\n        finally:", "            pass\n        finally:"),  # a stream's final [DONE] dropped
    ("SV49", F, "                        yield P.SSE_DONE\n                        return\n", "                        return\n"),  # an error mid-stream without [DONE]
    ("SV50", F, "                            if held:  # (the logprobs of text left out", "                            if False:  # (the logprobs of text left out"),  # held reasoning logprobs lost
    ("SV51", F, '                    if state["msg"] is None and not any(o["type"] in ("message", "function_call") for o in output):',
     "                    if False:"),  # an empty streamed response has no message item
    ("SV52", F, '"invalid_prompt" if err.status == 400 else "server_error"', '"server_error"'),  # response.failed's code always server_error
    ("SV53", F, "                t = t.lstrip()  # a message after a call", "                pass  # a message after a call"),  # streamed Responses: message after a call keeps its line break
    # -- _usage / _param_of ------------------------------------------------------------------------------------------
    ("SV54", F, "    firsts = summaries[::per]\n", "    firsts = summaries\n"),  # n>1: the prompt counted once per choice
    ("SV55", F, '("max_draft_tokens", "edgespec.max_draft_tokens"), ', ""),  # max_draft_tokens refusal named edgespec.draft_tokens
    # -- body reading --------------------------------------------------------------------------------------------------
    ("SV56", F, "    if declared > P.MAX_BODY:\n", "    if False:\n"),  # a declared huge body read before the 413
    ("SV57", F, "            size += len(c)\n", "            size = len(c)\n"),  # a chunked body's size counted per chunk: unbounded
    ("SV58", F, "            if sched is not None and sched.closing:\n", "            if False:\n"),  # a stalled body holds a stop
    ("SV59", F, "            if time.monotonic() > deadline:\n", "            if False:\n"),  # a stalled body never times out (408)
    # -- error handlers, guards ---------------------------------------------------------------------------------------
    ("SV60", F, "return _AsciiJSON(e.body(), status_code=e.status, headers=e.headers)", "return _AsciiJSON(e.body(), status_code=e.status)"),  # APIError's headers (Retry-After) dropped
    ("SV61", F, "            if origin is not None and _origin_key(origin) not in self.origins:", "            if origin is not None and origin not in self.origins:"),  # an allowed origin sent with a default port / case refused
    ("SV62", F, 'if scope["type"] == "http" and scope.get("method") != "OPTIONS" and scope.get("path") not in self.OPEN:',
     'if scope["type"] == "http" and scope.get("path") not in self.OPEN:'),  # a CORS preflight needs the key
    ("SV63", F, 'if not (scheme.lower() == b"bearer" and', 'if not (scheme == b"Bearer" and'),  # 'bearer' in lower case refused
    ("SV64", F, 'headers={"WWW-Authenticate": "Bearer"})', "headers={})"),  # 401 without WWW-Authenticate
    ("SV65", F, "hmac.compare_digest(token.strip(), self.key)", "self.key.startswith(token.strip())"),  # a prefix of the key (or an empty one) accepted
    ("SV66", F, '            o = _origin_key(o.removesuffix("/"))', '            o = o.removesuffix("/")'),  # --allow-origin not normalized (HTTP://X:80)
    # -- create_app / run --------------------------------------------------------------------------------------------
    ("SV67", F, "        middleware.insert(2, Middleware(_JsonCORS", "        middleware.insert(0, Middleware(_JsonCORS"),  # CORS outside the origin guard: a bad origin's preflight is starlette's 400
    ("SV68", F, '            sched.shutdown()  # the generations end first', "            pass  # the generations end first"),  # a stop waits for generations to run to the end
    ("SV69", F, "                    elif now - since > SEND_STALL_S:", "                    elif False:"),  # a client reading nothing holds a stop
    ("SV70", F, "for sig in (signal.SIGINT, signal.SIGTERM)}", "for sig in (signal.SIGINT,)}"),  # SIGTERM: uvicorn's handler, which re-raises (exit not 0)
]
