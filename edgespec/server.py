"""``edgespec serve``: an OpenAI-compatible HTTP server over one ``Engine`` (starlette + uvicorn).

One engine, one generation at a time: on one small device a second concurrent generation would only
share the same memory bandwidth and cores (and a second KV cache), so requests wait their turn in a
bounded FIFO queue; past ``queue_size`` waiting requests the answer is 429 with ``Retry-After``.

Every generation runs on one long-lived worker thread (``DeviceThread``; ``edgespec serve`` loads the
engine on it too), which starts ``Engine.stream_ids``, consumes it to the end and closes it (a stream
belongs to the thread that started it); its text deltas reach the event loop through an asyncio queue.
One thread, not one per generation: onnxruntime's CUDA EP keeps a context per calling thread (its
cuBLAS handles and captured CUDA graphs), and on an H200 a generation on a new thread took 3-7x as long, and
each such thread kept 77 MiB of GPU memory while the engine lived (device_thread.py). A client that disconnects (streamed or not)
sets the generation's cancel flag: the worker stops after the round in progress and closes the stream,
which frees the engine for the next request. On SIGINT/SIGTERM the server stops taking requests,
stops every generation after its round in progress (its client gets a 503 ``server_shutdown``
error, streamed or not), waits for the worker thread's generation and exits 0. The engine reuses the KV
cache of the previous prompt when a new prompt extends it (the next turn of the same conversation), so only
new tokens are prefilled; ``usage.prompt_tokens_details.cached_tokens`` counts the reused ones.

Needs the ``serve`` extra (``pip install '.[serve]'`` in the checkout); nothing here is imported by
``import edgespec``.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import sys
import threading
import time
from concurrent.futures import Future, wait

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from . import server_protocol as P
from .device_thread import DeviceThread
from .errors import ConfigError, ContextOverflowError, EdgespecError, Interrupted
from .manifest import SAMPLING_KEYS
from .reasoning import ReasoningSplitter, reasoning_tokens, split_whole, starts_inside, think_tags
from .server_metrics import Metrics, RequestCounter

log = logging.getLogger("edgespec.server")


class Scheduler:
    """One generation at a time, at most ``queue_size`` waiting behind it (FIFO)."""

    def __init__(self, engine, queue_size: int, metrics: Metrics, device: DeviceThread | None = None):
        """``device``: the thread every generation runs on (the one that loaded the engine, best); None: one
        of the scheduler's own, started here."""
        self.engine, self.queue_size, self.metrics = engine, queue_size, metrics
        self._own_device = device is None  # (a thread of its own: closed with the scheduler)
        self.device = device if device is not None else DeviceThread()
        self.lock = asyncio.Lock()
        self.waiting = 0
        self.busy = False
        self.closing = False  # shutting down: no new generation starts
        self.active: set[Generation] = set()  # admitted and not yet finished
        self.running: set[Future] = set()  # generations given to the device thread and not yet done

    def shutdown(self) -> None:
        """Stop every generation, queued or running, after its round in progress."""
        self.closing = True
        for g in list(self.active):
            g.cancel(shutdown=True)

    def join(self, timeout: float) -> bool:
        """Wait for the generations on the device thread (each stops after its round in progress); False if one
        is still running."""
        _, pending = wait(list(self.running), timeout=max(0.0, timeout))
        return not pending

    def close(self) -> None:
        """After ``join``: the device thread ends, where the scheduler started it (a caller's stays)."""
        if self._own_device:
            self.device.close(timeout=0)

    def admit(self) -> None:
        if self.closing:
            raise shutting_down()
        if self.waiting < self.queue_size or (not self.busy and self.waiting == 0 and not self.lock.locked()):
            return
        self.metrics.rejected += 1
        raise P.APIError(429, f"the server is busy: one generation runs and {self.waiting} wait (the queue holds "
                         f"{self.queue_size}); retry later", type="rate_limit_error", code="queue_full",
                         headers={"Retry-After": "1"})


def _job_done(sched: Scheduler):
    """A generation's future, done: no longer running; an exception that left ``_work`` logged (a thread of its own
    printed it through ``threading.excepthook``; a future keeps it unread)."""
    def done(job) -> None:
        sched.running.discard(job)
        e = None if job.cancelled() else job.exception()
        if e is not None:
            log.error("a generation's worker failed", exc_info=e)
    return done


def shutting_down() -> P.APIError:
    return P.APIError(503, "the server is shutting down", type="server_error", code="server_shutdown")


class Generation:
    """One request's generation: ``events()`` yields ("delta", (text, logprob entries or None))... then
    ("done", stats) or
    ("error", exception). ``cancel()`` is always safe and is called when the client is gone;
    ``cancel(shutdown=True)`` when the server stops (the client then gets a 503 error)."""

    def __init__(self, sched: Scheduler, ids: list[int], stop: list[str], kw: dict, echo: bool = False,
                 think: tuple[tuple[int, int], bool] | None = None):
        """``echo``: the prompt's text (with ``kw['logprobs']``: and its own logprobs, ``Engine.score``) goes
        out first; ``kw['max_new_tokens']`` 0: nothing is generated after it. ``think``: (a thinking model's
        tags, whether the reply starts inside its block): the summary counts the block's tokens."""
        self.sched, self.ids, self.stop, self.kw, self.echo = sched, ids, stop, kw, echo
        self.think = think
        self.grammar_param: str | None = None  # the request's field a grammar error names (response_format, tools)
        self._cancel = threading.Event()
        if sched.closing:  # a request's next choice made after shutdown began: the client gets the 503
            self._cancel.set()
        self._queued = True  # counted in sched.waiting until it has the engine or gives up
        self._started = False  # the device thread runs it
        self._stopped = False  # the worker broke off on the cancel flag (its reply is not whole)
        self.shutdown = sched.closing
        self.queue_ms = 0.0
        sched.waiting += 1
        sched.active.add(self)

    def _unqueue(self) -> None:
        if self._queued:
            self._queued = False
            self.sched.waiting -= 1

    def cancel(self, shutdown: bool = False) -> None:
        self.shutdown = self.shutdown or shutdown
        self._cancel.set()
        self._unqueue()
        if not self._started:
            self.sched.active.discard(self)

    async def events(self):
        sched, t0 = self.sched, time.perf_counter()
        if self._cancel.is_set():
            sched.metrics.generation(None, 0.0, cancelled=True, failed=False)  # (never begun: counted all the same)
            if self.shutdown:
                yield "error", shutting_down()
            return
        try:
            await sched.lock.acquire()
        except BaseException:  # (the client gone while it waited: its task cancelled)
            sched.metrics.generation(None, (time.perf_counter() - t0) * 1000, cancelled=True, failed=False)
            raise
        finally:
            self._unqueue()
        if self._cancel.is_set():
            sched.lock.release()
            sched.metrics.generation(None, (time.perf_counter() - t0) * 1000, cancelled=True, failed=False)
            if self.shutdown:
                yield "error", shutting_down()
            return
        sched.busy = True
        self.queue_ms = (time.perf_counter() - t0) * 1000
        loop, q = asyncio.get_running_loop(), asyncio.Queue()
        self._started = True
        try:
            job = sched.device.submit(self._work, loop, q)
        except BaseException:
            self._finished(q, None, RuntimeError("the worker thread is closed"), False)
            raise
        sched.running.add(job)
        job.add_done_callback(_job_done(sched))
        while True:
            item = await q.get()
            if item[0] == "delta":  # deltas that piled up while the client was slow go out as one
                parts, lps = [item[1][0]], item[1][1]
                while not q.empty() and q._queue[0][0] == "delta":  # noqa: SLF001 (peek)
                    text, more = q.get_nowait()[1]
                    parts.append(text)
                    if more is not None:
                        lps = [*(lps or ()), *more]
                item = ("delta", ("".join(parts), lps))
            yield item
            if item[0] != "delta":
                return

    def _work(self, loop: asyncio.AbstractEventLoop, q: asyncio.Queue) -> None:
        """On the device thread: starts, consumes and closes the engine's stream."""
        last, gen, err = None, None, None
        engine, text, out = self.sched.engine, [], []
        shift, scored, score_calls = 0, False, 0
        if self._cancel.is_set():  # the client left (or the server began to stop) before this choice began
            self._stopped = True
        lms: list = []
        try:
            # a long prefill (or a prompt's scoring) stops between its calls once the client leaves or the server
            # stops (inside the try: an engine that fails here, closed say, is the client's error, and frees the turn)
            lms = [engine.decoder.target, *(getattr(d, "lm", None) for d in engine.decoder.drafters.values())]
            lms = [m for m in lms if m is not None]
            for m in lms:
                m.interrupt = self._cancel.is_set
            if self.echo and not self._stopped:  # the prompt first: with logprobs, scored (under the engine's turn, as a generation)
                top = self.kw.get("logprobs")
                if top is not None:
                    calls0 = engine.decoder.target.calls
                    try:
                        head, entries = engine.score(self.ids, top)
                    finally:  # (the target's calls that read the prompt: counted as the generation's are)
                        score_calls = engine.decoder.target.calls - calls0
                    scored = True
                else:  # the text score gives, without its logprobs
                    dec = engine.tokenizer.stream_decoder()
                    head, entries = dec.push(self.ids) + dec.flush(), None
                shift = len(head)
                loop.call_soon_threadsafe(q.put_nowait, ("delta", (head, entries)))
                if self._cancel.is_set():  # the client left while the prompt was read: nothing more
                    self._stopped = True
            if self.kw["max_new_tokens"] > 0 and not self._stopped:
                gen = engine.stream_ids(self.ids, stop=self.stop, **self.kw)
            for delta, toks, st, lps in gen or ():
                last = st
                text.append(delta)
                out.extend(toks)
                if self._cancel.is_set():
                    self._stopped = True
                    break
                if lps and shift:  # offsets in the text returned, which begins with the prompt
                    lps = [{**e, "offset": e["offset"] + shift} for e in lps]
                if delta or lps:  # (the logprobs of tokens with no text, an end of sequence, go out too)
                    loop.call_soon_threadsafe(q.put_nowait, ("delta", (delta, lps)))
        except Interrupted:  # (the cancel flag, seen within a prefill: as at a round's end)
            self._stopped = True
        except EdgespecError as e:
            err = e
        except Exception as e:  # noqa: BLE001 -- reported to the client as a 500, logged here
            log.exception("generation failed")
            err = e
        finally:
            for m in lms:
                m.interrupt = None
            if gen is not None:
                try:
                    gen.close()
                except Exception:  # noqa: BLE001
                    log.exception("closing the generation failed")
            summary = None
            try:
                summary = P.stats_summary(last) if last is not None else None
                if summary is None and err is None and gen is None and not self._stopped:  # scored, nothing generated
                    summary = {**P.stats_summary(None), "prompt_tokens": len(self.ids), "finish_reason": "length"}
                if summary is not None and scored:  # the prompt was read whole to score it: nothing was reused
                    summary["reused_prompt_tokens"] = summary["restored_prompt_tokens"] = 0
                    summary["target_calls"] = (summary.get("target_calls") or 0) + score_calls
                if summary is not None and gen is not None:
                    # the tokens of the text returned: a stop string's tokens, and what the same round
                    # computed after it, are not (the stats' new_tokens count what was computed)
                    returned = engine.returned_ids(out, "".join(text), last)
                    summary["completion_tokens"] = len(returned)
                    if self.think is not None:  # OpenAI's reasoning_tokens: the block's, its tags included
                        summary["reasoning_tokens"] = reasoning_tokens(returned, *self.think)
                    if "prediction" in self.kw:  # OpenAI's counts: the prediction's tokens in the reply, and not
                        from .prediction import prediction_usage

                        summary["accepted_prediction_tokens"], summary["rejected_prediction_tokens"] = \
                            prediction_usage(self.kw["prediction"], returned)
            except Exception:  # noqa: BLE001 -- never skip _finished: it frees the engine
                log.exception("summarizing the generation failed")
            try:
                loop.call_soon_threadsafe(self._finished, q, summary, err, self._cancel.is_set())
            except RuntimeError:  # the loop is gone: the server is shutting down
                pass

    def _finished(self, q: asyncio.Queue, summary: dict | None, err: BaseException | None, cancelled: bool) -> None:
        """On the event loop, once the worker is done: free the engine, count, tell the consumer."""
        self.sched.busy = False
        self.sched.lock.release()
        self.sched.active.discard(self)
        self.sched.metrics.generation(summary, self.queue_ms, cancelled=cancelled, failed=err is not None)
        if err is None and self.shutdown and self._stopped:  # a reply finished before the stop stays whole
            err = shutting_down()
        q.put_nowait(("error", err) if err is not None else ("done", summary or P.stats_summary(None)))


async def _wait_disconnect(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


SEND_STALL_S = 5.0  # while the server stops, a connection whose reply has not gone out for this long is cut (a
# reading client starved of CPU for a moment is not cut; a supervisor's grace, Docker's 10 s, is not reached)


class EventStream(StreamingResponse):
    """Server-sent events from an async iterator of bytes; a client disconnect (seen on the
    receive channel or as a failed send) cancels the iterator and calls ``on_close``."""

    def __init__(self, chunks, on_close):
        super().__init__(chunks, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.chunks, self.on_close = chunks, on_close

    async def __call__(self, scope, receive, send) -> None:
        async def pump():
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            async for c in self.chunks:
                await send({"type": "http.response.body", "body": c, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        tasks = [asyncio.ensure_future(pump()), asyncio.ensure_future(_wait_disconnect(receive))]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            self.on_close()
            for t in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(t, Exception) and not isinstance(t, OSError):
                    log.error("stream failed: %s", t)


async def _until_disconnect(request: Request, coro):
    """Await ``coro``; cancel it if the client disconnects first (then return None)."""
    work = asyncio.ensure_future(coro)
    watch = asyncio.ensure_future(_wait_disconnect(request.receive))
    try:
        await asyncio.wait([work, watch], return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            return work.result()
        return None
    finally:
        for t in (work, watch):
            t.cancel()
        await asyncio.gather(work, watch, return_exceptions=True)


class Server:
    """The routes' state: the engine, its scheduler and the metrics."""

    def __init__(self, engine, model_id: str, queue_size: int = 16, defaults: dict | None = None,
                 template_kwargs: dict | None = None, reasoning_format: str = "auto",
                 device: DeviceThread | None = None):
        self.engine, self.model_id = engine, model_id
        self.defaults = {k: v for k, v in (defaults or {}).items() if v is not None}
        self.template_kwargs = template_kwargs or {}  # every chat's, under a request's own chat_template_kwargs
        if reasoning_format not in ("auto", "none"):
            raise ConfigError(f"reasoning_format must be auto or none, got {reasoning_format!r}"[:200])
        # a thinking model's <think> block apart from the answer (reasoning.py); None: the text as it comes
        self.think = think_tags(engine.tokenizer) if reasoning_format == "auto" else None
        self.metrics = Metrics(self._gauges)
        self.sched = Scheduler(engine, queue_size, self.metrics, device)
        self.created = P.now()

    def _template_kwargs(self, req) -> dict | None:
        """A chat's template variables: the request's own over the server's (--chat-template-kwargs)."""
        return {**self.template_kwargs, **(req.template_kwargs or {})} or None

    def _splits(self, req: P.GenRequest) -> bool:
        """Whether the request's replies give a thinking model's block apart (chat, the tags in the vocabulary)."""
        return req.kind == "chat" and self.think is not None

    def _inside(self, prompt_ids, req: P.GenRequest, treq) -> bool:
        """Whether a reply to ``prompt_ids`` starts inside its block: the template opened it, and nothing holds the
        reply from its first token (a forced tool call's start or grammar, a response_format's grammar: the model
        cannot think there, and what it writes is the answer)."""
        if req.response_format is not None or (treq is not None and treq.forced):
            return False
        return starts_inside(prompt_ids, self.think)

    def _gauges(self) -> dict:
        pc = self.engine.prompt_cache_stats()
        return {"queue_depth": self.sched.waiting, "queue_capacity": self.sched.queue_size,
                "generation_running": int(self.sched.busy), "max_context": self.engine.max_context,
                "prompt_cache": pc}

    # -- the small endpoints -----------------------------------------------------------------
    def _model(self) -> dict:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "edgespec",
                "max_context": self.engine.max_context}

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model()]})

    async def model(self, request: Request) -> Response:
        name = request.path_params["name"]
        if not name:  # (/v1/models/: the list, as /v1/models)
            return await self.models(request)
        if name != self.model_id:
            raise P.APIError(404, f"the model '{name}' does not exist; this server serves '{self.model_id}'",
                             param="model", code="model_not_found")
        return JSONResponse(self._model())

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self.model_id, "busy": self.sched.busy,
                             "queued": self.sched.waiting, "queue_capacity": self.sched.queue_size,
                             "max_context": self.engine.max_context})

    async def tokenize(self, request: Request) -> Response:
        """vLLM's and llama.cpp's ``/tokenize``: the ids a prompt (or a chat, through the template) is, as a
        generation would read it; ``with_pieces``: each id with its text (llama.cpp's)."""
        req = P.parse_tokenize(P.parse_body(await _read_body(request)), self.model_id)
        eng = self.engine
        # (bounded, as a generation's prompt is: an 8 MB prompt with pieces took 20 s and 1.1 GB, its reply built on
        # the event loop held every other request, and a stop waited for it)
        limit = TOKENIZE_CONTEXTS * eng.max_context
        param = "messages" if req.messages is not None else "prompt"

        def too_long(n: int, at_least: str = "") -> P.APIError:
            return P.bad(f"the {param} is {at_least}{n:,} tokens; /tokenize takes at most {limit:,} "
                         f"({TOKENIZE_CONTEXTS} times the context of {eng.max_context:,})", param,
                         "context_length_exceeded")

        least = eng.tokenizer.min_tokens(req.text) if req.messages is None else 0
        if least > limit:
            raise too_long(least, "at least ")

        def run():
            if req.messages is not None:  # as a generation encodes them (tool calls' arguments as objects, ...)
                ids = eng.encode(req.messages, add_generation_prompt=req.add_generation_prompt,
                                 template_kwargs=self._template_kwargs(req))  # (as a chat request renders them)
            else:
                ids = eng.tokenizer.encode(req.text, add_special=req.add_special)
            return ids, [{"id": t, "piece": eng.tokenizer.token_bytes(t).decode("utf-8", "replace")} for t in ids] \
                if req.with_pieces else ids

        try:
            ids, toks = await run_in_threadpool(run)
        except EdgespecError as e:
            raise P.bad(str(e).splitlines()[0], param) from None
        if len(ids) > limit:
            raise too_long(len(ids))
        # (rendered off the event loop: a reply of 4 contexts' tokens with pieces is megabytes)
        return await run_in_threadpool(JSONResponse, {"count": len(ids), "max_model_len": eng.max_context,
                                                      "tokens": toks})

    async def detokenize(self, request: Request) -> Response:
        """vLLM's and llama.cpp's ``/detokenize``: the text of token ids (``prompt``, vLLM's key, and
        ``content``, llama.cpp's), special tokens' text included."""
        toks = P.parse_detokenize(P.parse_body(await _read_body(request)), self.model_id)
        limit = TOKENIZE_CONTEXTS * self.engine.max_context
        if len(toks) > limit:
            raise P.bad(f"'tokens' holds {len(toks):,} ids; /detokenize takes at most {limit:,} ({TOKENIZE_CONTEXTS} "
                        f"times the context of {self.engine.max_context:,})", "tokens", "context_length_exceeded")
        try:
            self.engine.decoder.check_ids(toks, "'tokens'")
        except EdgespecError as e:
            raise P.bad(str(e), "tokens") from None
        text = await run_in_threadpool(self.engine.tokenizer.decode, toks, False)
        return await run_in_threadpool(JSONResponse, {"prompt": text, "content": text})

    async def metrics_text(self, request: Request) -> Response:
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    # -- generation --------------------------------------------------------------------------
    async def chat(self, request: Request) -> Response:
        return await self._generate(request, P.parse_chat(P.parse_body(await _read_body(request)), self.model_id))

    async def responses(self, request: Request) -> Response:
        """OpenAI's Responses API: the chat request it asks for (server_protocol.parse_responses), answered as a
        response object or its stream of events."""
        return await self._generate(request, P.parse_responses(P.parse_body(await _read_body(request)),
                                                               self.model_id))

    async def stored_response(self, request: Request) -> Response:
        """``GET``/``DELETE /v1/responses/{id}`` (and its cancel, input items): nothing is stored to find."""
        raise P.APIError(404, f"no response '{request.path_params['rid'].split('/')[0]}': edgespec keeps no responses "
                              "(every response says store: false)"[:300], param="response_id", code="not_found")

    async def completions(self, request: Request) -> Response:
        body = P.parse_body(await _read_body(request))
        return await self._generate(request, P.parse_completion(body, self.model_id))

    async def _generate(self, request: Request, req: P.GenRequest) -> Response:
        source = req.messages if req.kind == "chat" else req.prompt
        param = ("messages" if req.responses is None else "input") if req.kind == "chat" else "prompt"
        treq = None
        if req.tools:
            t = req.tools
            try:
                treq = self.engine.tool_request(t.get("tools"), t.get("tool_choice"), t.get("parallel_tool_calls", True),
                                                held=req.response_format is not None)
            except EdgespecError as e:
                msg = str(e).splitlines()[0]
                at = re.match(r"tools\[\d+\](?:\.\w+)*", msg)  # (the field itself: tools[0].function.name)
                param = at.group(0) if at else next((k for k in ("tool_choice", "parallel_tool_calls", "response_format")
                                                     if msg.startswith(k)), "tools")
                if req.responses is not None:
                    msg, param = P.responses_message(msg), P.responses_param(param)
                raise P.bad(msg, param) from None
            if treq is not None and treq.parses and "logprobs" in req.options:
                raise P.bad("logprobs cannot be combined with tools the reply may call (its calls are taken out of "
                            "the text); send tool_choice 'none' or no logprobs", "logprobs", "unsupported_value")
            if treq is not None and treq.grammar is not None:  # calls held to a grammar
                try:  # compiled now (off the event loop), refused before the request is queued
                    await run_in_threadpool(self.engine.decoder.constraints, treq.grammar)
                except EdgespecError as e:
                    raise P.bad(str(e).splitlines()[0], "tools") from None
        if req.suffix is not None:  # fill in the middle: refused here for a model without FIM tokens
            try:
                self.engine.infill_stops()
            except EdgespecError as e:
                raise P.bad(str(e).splitlines()[0], "suffix", "unsupported_parameter") from None
        sources = req.prompts if req.kind == "completion" and req.prompts else [source]
        prepared = [await self._prepare(src, req, param, treq) for src in sources]
        ids, heal, room, max_new = prepared[0]
        score_only = req.max_tokens == 0  # echo with max_tokens 0: the prompt's logprobs, nothing generated
        kw = {**self.defaults, **req.options, "max_new_tokens": max(max_new, 1)}
        if kw.get("drafter") == "none" and not {"drafter", "draft_tokens"} <= req.options.keys():
            # a draft length the request did not ask for beside its drafter 'none' (the server's default), or a
            # request's beside the server's --drafter none: nothing is drafted, as with a prediction; a request
            # that sends both is refused, as the API refuses them
            kw.pop("draft_tokens", None)
        if heal:
            kw["heal"] = heal
        ctx = self.engine.max_context
        if treq is not None and treq.grammar is not None:
            kw["grammar"] = treq.grammar
        if req.response_format is not None:  # compiled off the event loop: a large schema takes a while
            from .constrain import grammar_for

            try:
                kw["grammar"] = await run_in_threadpool(grammar_for, req.response_format)
                # (one that compiles may still fail at its first token: refused now, not as a 500 or mid-stream)
                await run_in_threadpool(self.engine.decoder.constraints, kw["grammar"])
            except EdgespecError as e:
                msg = str(e).splitlines()[0]
                if req.responses is not None:
                    raise P.bad(P.responses_message(msg), P.responses_param("response_format")) from None
                raise P.bad(msg, "response_format") from None
        if isinstance(kw.get("prediction"), str):  # tokenized once, off the event loop (it may be a large file)
            text = kw["prediction"]
            least = self.engine.tokenizer.min_tokens(text)
            if least > ctx:
                raise P.bad(f"the prediction has at least {least} tokens; a reply can have at most {ctx} (the "
                            f"context)", "prediction")
            kw["prediction"] = await run_in_threadpool(self.engine.tokenizer.encode, text, add_special=False,
                                                       parse_special=False)
            if len(kw["prediction"]) > ctx:
                raise P.bad(f"the prediction has {len(kw['prediction'])} tokens; a reply can have at most {ctx} "
                            f"(the context)", "prediction")
        try:
            self.engine.config(**kw)  # refuses before queueing: drafter model missing, draft length, ...
        except EdgespecError as e:
            msg = str(e).splitlines()[0]
            raise P.bad(msg, _param_of(msg)) from None
        self.sched.admit()
        if kw.get("grammar") is not None:
            self.metrics.add("constrained_generations")
        stops = req.stop + (treq.stops(self.engine.think_tags() is not None) if treq is not None else [])

        # a thinking model's replies: whether each prompt's reply starts inside its block (None: not split)
        run_inside = [self._inside(x[0], req, treq) for x in prepared] if self._splits(req) else None

        # what an error of the reply's grammar met mid-generation names (the field it came from)
        grammar_param = None if "grammar" not in kw else "response_format" if req.response_format is not None \
            else "tools"
        if grammar_param is not None and req.responses is not None:
            grammar_param = P.responses_param(grammar_param)

        def generation(i: int) -> Generation:
            """Choice i's generation: prompt i // n (a completion's prompts, in turn), its (i % n)-th choice, which
            samples with seed + i % n where a seed is given."""
            p_ids, p_heal, _, p_max = prepared[i // req.n]
            j = i % req.n
            kw_i = {**kw, "max_new_tokens": 0 if score_only else max(p_max, 1)}
            kw_i.pop("heal", None)
            if p_heal:
                kw_i["heal"] = p_heal
            if j and kw.get("seed") is not None:
                kw_i["seed"] = (kw["seed"] + j) % 2**63
            think = (self.think, run_inside[i // req.n]) if run_inside is not None else None
            gen = Generation(self.sched, p_ids, stops, kw_i, echo=req.echo, think=think)
            gen.grammar_param = grammar_param
            return gen

        choices_n = len(prepared) * req.n

        rid, created = P.new_id(req.kind), P.now()
        # (a completion's prompts each have their room: the least of them, and clamped if any prompt's was)
        ext = {"max_tokens": min(p[3] for p in prepared),
               "max_tokens_clamped": req.max_tokens is not None and any(req.max_tokens > p[2] for p in prepared),
               **{k: kw.get(k, getattr(self.engine.defaults, k)) for k in SAMPLING_KEYS},  # (as used)
               "drafter_policy": kw.get("drafter", "profile default"), "draft_tokens": kw.get("draft_tokens")}
        if req.stream:
            run = _Choices(generation, choices_n, [len(x[0]) for x in prepared])
            # a thinking model's replies: whether each prompt's reply starts inside its block (None: no split)
            run.inside = run_inside
            run.next()  # choice 0 made now: counted in the queue from the request's admission
            if req.responses is not None:
                return EventStream(self._sse_responses(run, req, created, ext, treq), run.cancel)
            return EventStream(self._sse(run, req, rid, created, ext, treq), run.cancel)
        choices, summaries = [], []
        for i in range(choices_n):  # one after the other: one engine, one generation at a time
            gen = generation(i)
            try:
                out = await _until_disconnect(request, self._collect(gen))
            finally:
                gen.cancel()
            if out is None:  # the client is gone: nobody reads this
                return Response(status_code=499)
            text, s, lps = out
            s = {**s, "queue_ms": round(gen.queue_ms, 3)}
            summaries.append(s)
            content, calls, reasoning, closed = text, [], None, False
            if run_inside is not None:  # the thinking apart (tool calls come after it)
                sp = split_whole(text, run_inside[i // req.n])
                reasoning, content, closed = sp.text_reasoning, "".join(sp.content), sp.closed
            if treq is not None and treq.parses:
                parser = treq.parser()  # (its events: a Responses reply's items in the reply's order, as streamed)
                order = parser.feed(content) + parser.finish()
                content, calls = parser.content, parser.calls
                self.metrics.add("tool_calls", len(calls))
                body = P.chat_response(rid, self.model_id, created, content, s["finish_reason"], {}, {},
                                       [c.openai() for c in calls], reasoning=reasoning)
            elif req.kind == "chat":
                body = P.chat_response(rid, self.model_id, created, content, s["finish_reason"], {}, {}, logprobs=lps,
                                       reasoning=reasoning)
            else:
                body = P.completion_response(rid, self.model_id, created, text, s["finish_reason"], {}, {},
                                             logprobs=lps)
            choices.append({**body["choices"][0], "index": i})
        use = _usage(summaries, req, [len(x[0]) for x in prepared])
        # one choice: its statistics as ever; several: each choice's in edgespec.choices
        ext = {**ext, **summaries[0]} if choices_n == 1 else {**ext, "choices": summaries}
        if req.responses is not None:  # (one choice: the Responses API has no n)
            calls = [c.openai() for c in calls]
            cut = P.response_status(summaries[0]["finish_reason"])  # (a message cut short is 'incomplete')
            items = ([P.reasoning_item(P.item_id("rs"), reasoning, "completed" if closed else cut)]
                     if reasoning else [])  # (as streamed)
            if calls:  # messages and calls in the order the model wrote them (as streamed)
                out, n, texts = [], 0, None
                for what, v in order:
                    if what == "call":
                        out.append(P.call_item(calls[n], P.item_id("fc")))
                        n, texts = n + 1, None
                        continue
                    if texts is None:
                        v = v.lstrip() if n else v  # (a message after a call: without the line break between)
                        if not v:
                            continue
                        texts = []
                        out.append(texts)
                    texts.append(v)
                items += [P.message_item(P.item_id("msg"), "".join(x), "completed" if j + 1 < len(out) else cut)
                          if isinstance(x, list) else x for j, x in enumerate(out)]
            else:
                items.append(P.message_item(P.item_id("msg"), content or "", cut))
            return JSONResponse(P.response_object(P.response_id(), self.model_id, created, req, output=items,
                                                  engine_reason=summaries[0]["finish_reason"], use=use, ext=ext))
        body["choices"], body["usage"], body["edgespec"] = choices, use, ext
        return JSONResponse(body)

    async def _prepare(self, source, req: P.GenRequest, param: str, treq) -> tuple[list[int], bytes, int, int]:
        """One prompt's (ids, bytes token healing backed off, room in the context, max new tokens), or the
        request's refusal: token ids checked against the vocabulary, text encoded, the context's room checked."""
        try:
            if not isinstance(source, str) and req.kind == "completion":  # token ids, not tokenized
                self.engine.decoder.check_ids(source, "the prompt")
                ids = list(source)
            else:
                ids = await run_in_threadpool(self.engine.encode, source, fit=True, tools=treq, suffix=req.suffix,
                                              template_kwargs=self._template_kwargs(req) if req.kind == "chat" else None)
        except ContextOverflowError as e:  # too long by its size alone, refused before tokenizing
            raise P.APIError(400, str(e), param=param, code="context_length_exceeded") from None
        except EdgespecError as e:  # e.g. the chat template refuses this sequence of roles
            msg = str(e).splitlines()[0]
            if msg.startswith("chat_template_kwargs"):  # (a special token's text in them: their error, not the input's)
                raise P.bad(msg, "chat_template_kwargs") from None
            raise P.bad(msg if req.responses is None else P.responses_message(msg, req.responses["where"]),
                        param) from None
        heal = b""
        if req.token_healing:  # the token before the cursor backed off, the reply held to spell it first
            ids, heal = await run_in_threadpool(self.engine.heal, ids)
        n, ctx = len(ids), self.engine.max_context
        if n == 0:  # refused here, before a stream's first byte, not by the engine mid-stream
            raise P.bad(f"the {'prompt' if param == 'prompt' else 'conversation'} is empty: it has no tokens", param)
        room = ctx - n
        score_only = req.max_tokens == 0  # echo with max_tokens 0: the prompt's logprobs, nothing generated
        if score_only and n > ctx:
            raise P.APIError(400, f"the prompt has {n} tokens; the context holds {ctx}", param=param,
                             code="context_length_exceeded")
        if room < 1 and not score_only:
            raise P.APIError(400, f"the prompt has {n} tokens; the context holds {ctx} (prompt plus at least one "
                             f"new token), so at most {ctx - 1} prompt tokens", param=param,
                             code="context_length_exceeded")
        max_new = room if req.max_tokens is None else min(req.max_tokens, room)
        return ids, heal, room, max_new

    async def _collect(self, gen: Generation):
        # (logprobs asked for: a list, empty where the reply is, a stop string at its start; it was null)
        parts, lps = [], ([] if gen.kw.get("logprobs") is not None else None)
        async for kind, val in gen.events():
            if kind == "delta":
                parts.append(val[0])
                if val[1] is not None:
                    lps = lps if lps is not None else []
                    lps.extend(val[1])
            elif kind == "done":
                return "".join(parts), val, lps
            else:
                raise P.engine_error(val, gen.grammar_param)
        return None

    async def _sse(self, run: "_Choices", req: P.GenRequest, rid: str, created: int, ext: dict, treq=None):
        """The event stream of a request's choices, one after the other (each chunk says its choice's index);
        the usage chunk, with include_usage, after the last."""
        k, model, wu = req.kind, self.model_id, req.include_usage
        summaries = []
        try:
            for i in range(run.n):
                gen = run.current if i == 0 else run.next()
                if gen is None:  # the client left
                    return
                parser = treq.parser() if treq is not None else None
                splitter = ReasoningSplitter(run.inside[i // req.n]) if run.inside is not None else None
                held: list = []  # logprobs of text the splitter holds back: sent with the next chunk

                def parsed(events, parser=parser, i=i):  # with tools: the content outside calls, each call whole
                    for what, v in events:
                        if what == "content":
                            yield P.sse(P.chunk(k, rid, model, created, text=v, with_usage=wu, index=i))
                        else:
                            yield P.sse(P.chunk(k, rid, model, created, tool_call=v.openai(parser.calls.index(v)),
                                                with_usage=wu, index=i))

                def split(pieces, lps, i=i, parser=parser):  # the thinking apart, then the content as above
                    if lps:
                        held.extend(lps)
                    for what, v in pieces:
                        if what == "reasoning":
                            yield P.sse(P.chunk(k, rid, model, created, reasoning=v, with_usage=wu,
                                                logprobs=list(held) if held else None, index=i))
                            held.clear()
                        elif parser is not None:
                            yield from parsed(parser.feed(v))
                        else:
                            yield P.sse(P.chunk(k, rid, model, created, text=v, with_usage=wu,
                                                logprobs=list(held) if held else None, index=i))
                            held.clear()

                if k == "chat":
                    first = P.chunk(k, rid, model, created, role=True, text="", with_usage=wu, index=i)
                    if parser is not None:  # a reply that may be calls alone: its content null until it has some
                        first["choices"][0]["delta"]["content"] = None  # (as the whole reply's, and OpenAI's)
                    yield P.sse(first)
                async for kind, val in gen.events():
                    if kind == "delta":
                        if splitter is not None:
                            for out in split(splitter.feed(val[0]), val[1]):
                                yield out
                        elif parser is not None:  # (no logprobs with tools that parse)
                            for out in parsed(parser.feed(val[0])):
                                yield out
                        else:
                            yield P.sse(P.chunk(k, rid, model, created, text=val[0], with_usage=wu, logprobs=val[1],
                                                index=i))
                    elif kind == "done":
                        if splitter is not None:
                            for out in split(splitter.finish(), None):
                                yield out
                            if held:  # (the logprobs of text left out: whitespace around the block's tags)
                                yield P.sse(P.chunk(k, rid, model, created, text="", with_usage=wu, logprobs=list(held),
                                                    index=i))
                                held.clear()
                        if parser is not None:
                            for out in parsed(parser.finish()):
                                yield out
                            self.metrics.add("tool_calls", len(parser.calls))
                            if not parser.calls and not parser.content:  # no calls: content "", as the whole reply's
                                yield P.sse(P.chunk(k, rid, model, created, text="", with_usage=wu, index=i))
                        summaries.append({**val, "queue_ms": round(gen.queue_ms, 3)})
                        e = {**ext, **summaries[-1]}
                        yield P.sse(P.chunk(k, rid, model, created, reason=val["finish_reason"], ext=e,
                                            text=None if k == "chat" else "", with_usage=wu,
                                            calls=parser is not None and bool(parser.calls), index=i))
                    else:
                        yield P.sse(P.engine_error(val, gen.grammar_param).body())
                        yield P.SSE_DONE
                        return
            if req.include_usage:
                yield P.sse(P.chunk(k, rid, model, created, use=_usage(summaries, req, run.prompt_tokens), empty=True))
            yield P.SSE_DONE
        finally:
            run.cancel()


    async def _sse_responses(self, run: "_Choices", req: P.GenRequest, created: int, ext: dict, treq=None):
        """A Responses request's stream: response.created, then each output item as it forms (a message's text
        deltas; a tool call whole, once parsed), then response.completed (or .incomplete) with the whole response;
        an engine error mid-stream is response.failed."""
        model, rid, seq, output = self.model_id, P.response_id(), 0, []
        state: dict = {"msg": None, "rs": None}  # the open message (reasoning) item: (id, texts, output index)

        def ev(kind: str, **obj) -> bytes:
            nonlocal seq
            seq += 1
            return P.sse_event(kind, {**obj, "sequence_number": seq - 1})

        def open_message() -> list[bytes]:
            mid, idx = P.item_id("msg"), len(output)
            state["msg"] = (mid, [], idx)
            return [ev("response.output_item.added", output_index=idx, item=P.message_item(mid, None, "in_progress")),
                    ev("response.content_part.added", item_id=mid, output_index=idx, content_index=0,
                       part={"type": "output_text", "text": "", "annotations": [], "logprobs": []})]

        def reasoning_events(t: str) -> list[bytes]:  # a thinking model's block (reasoning.py), as it streams
            out = []
            if state["rs"] is None:
                rsid, idx = P.item_id("rs"), len(output)
                state["rs"] = (rsid, [], idx)
                out += [ev("response.output_item.added", output_index=idx,
                           item=P.reasoning_item(rsid, None, "in_progress")),
                        ev("response.content_part.added", item_id=rsid, output_index=idx, content_index=0,
                           part={"type": "reasoning_text", "text": ""})]
            rsid, texts, idx = state["rs"]
            if t:
                texts.append(t)
                out.append(ev("response.reasoning_text.delta", item_id=rsid, output_index=idx, content_index=0,
                              delta=t))
            return out

        def close_item(key: str, make, done: str, status: str, **extra) -> list[bytes]:
            """The open item ``state[key]`` done: its text's last event ``done``, its part's, the item's."""
            if state[key] is None:
                return []
            iid, texts, idx = state[key]
            state[key] = None
            item = make(iid, "".join(texts), status)
            output.append(item)
            part = item["content"][0]
            return [ev(done, item_id=iid, output_index=idx, content_index=0, text=part["text"], **extra),
                    ev("response.content_part.done", item_id=iid, output_index=idx, content_index=0, part=part),
                    ev("response.output_item.done", output_index=idx, item=item)]

        def close_reasoning(status: str = "completed") -> list[bytes]:
            return close_item("rs", P.reasoning_item, "response.reasoning_text.done", status)

        def text_events(t: str) -> list[bytes]:
            if state["msg"] is None and any(o["type"] == "function_call" for o in output):
                t = t.lstrip()  # a message after a call: without the line break that parted them
            if not t:
                return []
            out = close_reasoning()
            out += open_message() if state["msg"] is None else []
            mid, texts, idx = state["msg"]
            texts.append(t)
            out.append(ev("response.output_text.delta", item_id=mid, output_index=idx, content_index=0, delta=t,
                          logprobs=[]))
            return out

        def close_message(status: str = "completed") -> list[bytes]:
            return close_item("msg", P.message_item, "response.output_text.done", status, logprobs=[])

        def call_events(call: dict) -> list[bytes]:
            out = close_reasoning() + close_message()
            fid, idx = P.item_id("fc"), len(output)
            item = P.call_item(call, fid)
            out.append(ev("response.output_item.added", output_index=idx,
                          item={**item, "arguments": "", "status": "in_progress"}))
            out.append(ev("response.function_call_arguments.delta", item_id=fid, output_index=idx,
                          delta=item["arguments"]))
            out.append(ev("response.function_call_arguments.done", item_id=fid, output_index=idx, name=item["name"],
                          arguments=item["arguments"]))
            out.append(ev("response.output_item.done", output_index=idx, item=item))
            output.append(item)
            return out

        def parsed(events, parser) -> list[bytes]:
            out = []
            for what, v in events:
                out += text_events(v) if what == "content" else call_events(v.openai(parser.calls.index(v)))
            return out

        try:
            gen = run.current
            if gen is None:
                return
            start = P.response_object(rid, model, created, req, output=[], status="in_progress", ext=ext)
            yield ev("response.created", response=start)
            yield ev("response.in_progress", response=start)
            parser = treq.parser() if treq is not None else None
            splitter = ReasoningSplitter(run.inside[0]) if run.inside is not None else None

            def content(t: str) -> list[bytes]:
                return parsed(parser.feed(t), parser) if parser is not None else text_events(t)

            def pieces(ps) -> list[bytes]:
                out = []
                for what, t in ps:
                    out += reasoning_events(t) if what == "reasoning" else content(t)
                return out

            async for kind, val in gen.events():
                if kind == "delta":
                    if splitter is not None:
                        for b in pieces(splitter.feed(val[0])):
                            yield b
                    else:
                        for b in content(val[0]):
                            yield b
                elif kind == "done":
                    status = P.response_status(val["finish_reason"])
                    if splitter is not None:
                        for b in pieces(splitter.finish()):
                            yield b
                    if parser is not None:
                        for b in parsed(parser.finish(), parser):
                            yield b
                        self.metrics.add("tool_calls", len(parser.calls))
                    for b in close_reasoning("completed" if splitter is not None and splitter.closed else status):
                        yield b
                    if state["msg"] is None and not any(o["type"] in ("message", "function_call") for o in output):
                        for b in open_message():  # an empty reply is still a message
                            yield b
                    for b in close_message(status):
                        yield b
                    s = {**val, "queue_ms": round(gen.queue_ms, 3)}
                    final = P.response_object(rid, model, created, req, output=output,
                                              engine_reason=val["finish_reason"],
                                              use=_usage([s], req, run.prompt_tokens), ext={**ext, **s})
                    yield ev(f"response.{final['status']}", response=final)
                    return
                else:
                    err = P.engine_error(val, gen.grammar_param)  # (OpenAI's codes here: edgespec's own in edgespec.error_code)
                    # the items streamed so far closed, incomplete, and kept in the failed response's output
                    for b in close_reasoning("incomplete") + close_message("incomplete"):
                        yield b
                    failed = {**P.response_object(rid, model, created, req, output=output, status="failed",
                                                  ext={**ext, "error_code": err.code}),
                              "error": {"code": "invalid_prompt" if err.status == 400 else "server_error",
                                        "message": err.message}}
                    yield ev("response.failed", response=failed)
                    return
        finally:
            run.cancel()


TOKENIZE_CONTEXTS = 4  # /tokenize and /detokenize take up to this many contexts' tokens


def _usage(summaries: list[dict], req: P.GenRequest, prompt_tokens: list[int]) -> dict:
    """One usage for a request's choices: each prompt counted once (its n choices read it alike), every
    choice's tokens; the cached tokens of each prompt's first choice."""
    per = max(1, req.n)
    firsts = summaries[::per]
    pred = {k: sum(s.get(k, 0) for s in summaries) for k in ("accepted_prediction_tokens", "rejected_prediction_tokens")}
    thought = [s["reasoning_tokens"] for s in summaries if "reasoning_tokens" in s]
    return P.usage(sum((s["prompt_tokens"] or n) for s, n in zip(firsts, prompt_tokens)),
                   sum(s["completion_tokens"] for s in summaries), sum(s["reused_prompt_tokens"] for s in firsts),
                   pred if "prediction" in req.options else None, reasoning=sum(thought) if thought else None)


class _Choices:
    """A streamed request's choices: their generations made one at a time (``next``), the one running cancelled
    when the client leaves (and no other made after)."""

    def __init__(self, make, n: int, prompt_tokens: list[int]):
        self.make, self.n, self.prompt_tokens = make, n, prompt_tokens
        self.made = 0
        self.current: Generation | None = None
        self.cancelled = False
        self.inside: list[bool] | None = None  # per prompt: its reply starts in a thinking block (None: no split)

    def next(self) -> Generation | None:
        if self.current is not None:
            self.current.cancel()
        self.current = None if self.cancelled else self.make(self.made)
        self.made += 1
        return self.current

    def cancel(self) -> None:
        self.cancelled = True
        if self.current is not None:
            self.current.cancel()


def _param_of(msg: str) -> str | None:
    """The request field an engine refusal is about, for the error's ``param``."""
    for key, param in (("max_draft_tokens", "edgespec.max_draft_tokens"), ("draft_tokens", "edgespec.draft_tokens"),
                       ("drafter", "edgespec.drafter"), ("temperature", "temperature"), ("top_p", "top_p"),
                       ("top_k", "top_k"), ("min_p", "min_p"), ("seed", "seed"), ("prediction", "prediction"),
                       ("logit_bias", "logit_bias")):
        if key in msg:
            return param
    return None


async def _read_body(request: Request) -> bytes:
    try:
        declared = int(request.headers.get("content-length") or 0)
    except ValueError:
        declared = 0
    if declared > P.MAX_BODY:
        raise P.APIError(413, f"the request body is {declared} bytes; at most {P.MAX_BODY}", code="body_too_large")
    from starlette.requests import ClientDisconnect

    sched = getattr(getattr(request.app.state, "server", None), "sched", None)
    parts, size = [], 0
    chunks = request.stream().__aiter__()
    try:
        while True:
            c = await _next_chunk(chunks, sched)
            if c is None:
                break
            size += len(c)
            if size > P.MAX_BODY:
                raise P.APIError(413, f"the request body is over {P.MAX_BODY} bytes", code="body_too_large")
            parts.append(c)
    except ClientDisconnect:  # (no one reads the answer: nginx's 499 in the metrics, no traceback in the log)
        raise P.APIError(499, "the client disconnected before its request was read",
                         code="client_disconnected") from None
    return b"".join(parts)


BODY_STALL_S = 30.0  # a request body's next bytes awaited at most this long (a stalled client: 408)


async def _next_chunk(chunks, sched) -> bytes | None:
    """The body's next chunk (None at its end), awaited at most ``BODY_STALL_S`` (408), and only while the server
    is not stopping (503): a client that sent headers and part of its body, then nothing, held a stop for uvicorn's
    60 s grace, then got a 500 and left a traceback in the log (under a supervisor's 10 s grace: killed, the prompt
    cache and the memory never written), and a Content-Length past the body waited forever."""
    task = asyncio.ensure_future(chunks.__anext__())
    deadline = time.monotonic() + BODY_STALL_S
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                try:
                    return task.result()
                except StopAsyncIteration:
                    return None
            if sched is not None and sched.closing:
                raise shutting_down()
            if time.monotonic() > deadline:
                raise P.APIError(408, f"the request body stalled: no bytes for {BODY_STALL_S:.0f} s",
                                 code="request_timeout")
    finally:
        if not task.done():
            task.cancel()


class _AsciiJSON(JSONResponse):
    """JSON with non-ASCII escaped: an error may quote a client's text, lone surrogates included."""

    def render(self, content) -> bytes:
        import json

        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


class _JsonCORS(CORSMiddleware):
    """starlette's ``CORSMiddleware``, its refusal of a preflight (a method the server does not take, a private-network
    request) the JSON 400 every other error is (``cors_not_allowed``), with the CORS headers it had; it was starlette's
    plain text "Disallowed CORS method" (session 93)."""

    def preflight_response(self, request_headers):
        r = super().preflight_response(request_headers)
        if r.status_code != 400:
            return r
        what = bytes(r.body).decode("ascii", "replace").removeprefix("Disallowed CORS ")
        headers = {k: v for k, v in r.headers.items() if k.lower() not in ("content-length", "content-type")}
        return _AsciiJSON(P.error_body(f"this server does not take the preflight's {what} (it takes the methods "
                                       f"{', '.join(self.allow_methods)}, any header)", code="cors_not_allowed"),
                          status_code=400, headers=headers)


async def _on_api_error(request: Request, e: P.APIError) -> Response:
    return _AsciiJSON(e.body(), status_code=e.status, headers=e.headers)


async def _on_http_error(request: Request, e: HTTPException) -> Response:
    what = {404: f"no such endpoint: {request.method} {request.url.path}",
            405: f"method {request.method} is not allowed on {request.url.path}"}.get(e.status_code, str(e.detail))
    code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
    return JSONResponse(P.error_body(what, code=code), status_code=e.status_code, headers=e.headers)


async def _on_crash(request: Request, e: Exception) -> Response:
    log.error("internal error on %s: %s: %s", request.url.path, type(e).__name__, e)
    return JSONResponse(P.error_body(f"internal server error ({type(e).__name__}); see the server log",
                                     type="server_error", code="internal_error"), status_code=500)


class OriginGuard:
    """ASGI middleware: a request a web page sends (it has an ``Origin`` header; curl, SDKs and editors send
    none) is refused with 403 unless its origin is allowed (``--allow-origin``). CORS alone only keeps a page
    from reading the answer: a page of any site could still make a local server generate (a POST with a
    text/plain body needs no preflight), fill its queue and write its memory of replies."""

    def __init__(self, app, origins: list[str]):  # (check_origins' values: already as browsers send them)
        self.app, self.any, self.origins = app, "*" in origins, set(origins)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and not self.any:
            origin = next((v.decode("latin-1") for k, v in scope.get("headers", ()) if k == b"origin"), None)
            if origin is not None and _origin_key(origin) not in self.origins:
                msg = (f"requests from web pages of origin {origin[:200]!r} are not allowed; start the server with "
                       "--allow-origin for it")
                return await _AsciiJSON(P.error_body(msg, code="origin_not_allowed"), status_code=403)(scope, receive,
                                                                                                     send)
        return await self.app(scope, receive, send)


class KeyGuard:
    """ASGI middleware: with an API key (``serve --api-key``), every request but ``/health`` and a CORS
    preflight must carry ``Authorization: Bearer <key>`` (OpenAI's clients send their ``api_key`` so) or it is
    refused with 401 before anything runs; compared in constant time."""

    OPEN = ("/health",)  # (a load balancer's or a supervisor's probe)

    def __init__(self, app, key: str):
        self.app, self.key = app, key.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("method") != "OPTIONS" and scope.get("path") not in self.OPEN:
            import hmac

            got = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
            scheme, _, token = got.strip().partition(b" ")  # (the scheme's case is not significant: RFC 7235)
            if not (scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)):
                msg = ("no API key given: send 'Authorization: Bearer <key>' (an OpenAI client's api_key)" if not got
                       else "incorrect API key provided")
                return await _AsciiJSON(P.error_body(msg, code="invalid_api_key"), status_code=401,
                                        headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
        return await self.app(scope, receive, send)


def check_api_key(key: str | None) -> str | None:
    """An API key as the server takes it: printable ASCII without spaces, 8 to 512 characters (None: no key)."""
    if key is None:
        return None
    if not (8 <= len(key) <= 512 and key.isascii() and key.isprintable() and " " not in key):
        raise ConfigError("an API key must be 8 to 512 printable ASCII characters without spaces")
    return key


def _origin_key(origin: str) -> str:
    """An origin as browsers send it: scheme and host in lower case, no default port (http :80, https :443)."""
    from urllib.parse import urlsplit

    if origin in ("*", "null"):
        return origin
    try:
        u = urlsplit(origin)
        port = u.port
    except ValueError:
        return origin
    host = (u.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    scheme = u.scheme.lower()
    if port is None or (scheme, port) in (("http", 80), ("https", 443)):
        return f"{scheme}://{host}"
    return f"{scheme}://{host}:{port}"


def check_origins(origins) -> list[str]:
    """``--allow-origin`` values: ``*``, ``null`` (sandboxed and file:// pages) or origins
    (``scheme://host[:port]``, no path: a web page's http(s), or a browser extension's or a desktop webview's own
    scheme, ``chrome-extension://ID``, ``tauri://localhost``), a trailing ``/`` dropped, as browsers send them
    (``_origin_key``); ConfigError (one line) otherwise."""
    import re
    from urllib.parse import urlsplit

    if isinstance(origins, str):
        origins = [origins]
    out = []
    for o in origins:
        if not isinstance(o, str):
            raise ConfigError(f"an allowed origin must be a string, got {type(o).__name__}")
        if o not in ("*", "null"):
            try:
                u = urlsplit(o)
                u.port  # noqa: B018  (a bad port raises)
            except ValueError:
                u = None
            if (u is None or not re.fullmatch(r"[a-z][a-z0-9+.-]*", u.scheme) or not u.hostname
                    or u.path not in ("", "/") or u.query or u.fragment or u.username or u.password
                    or o.endswith(("?", "#"))):
                raise ConfigError(f"allowed origin {o!r}: expected '*', 'null' or scheme://host[:port] "
                                  "(no path), e.g. http://localhost:3000")
            o = _origin_key(o.removesuffix("/"))
        out.append(o)
    return out


def create_app(engine, model_id: str, *, queue_size: int = 16, drafter: str | None = None,
               draft_tokens: int | None = None, temperature: float | str | None = "model",
               sampling: dict | None = None,
               allow_origins=(), api_key: str | None = None, chat_template_kwargs: dict | None = None,
               reasoning_format: str = "auto", device: DeviceThread | None = None) -> Starlette:
    """The ASGI app over ``engine`` (an ``edgespec.Engine``). ``drafter``/``draft_tokens``/``temperature``
    are the server's defaults (``temperature`` "model": the model's recommended, ``engine.sampling_defaults``, else 1,
    OpenAI's; None: the engine's, greedy where the model recommends none), and ``sampling`` (top_p, top_k, min_p,
    repetition_penalty: ``serve --top-p`` ...); a request's own fields and ``edgespec`` object override them, and the
    engine's defaults (the model's recommended top_p, top_k, min_p, repetition penalty) stand for what none names.
    ``allow_origins``: web pages of these origins (``*``: any) may call the server from a browser (CORS headers, preflights answered); none by default. ``api_key``:
    every request but /health must carry it as a bearer token (KeyGuard). ``chat_template_kwargs``: variables for
    every chat's template, under a request's own (``{"enable_thinking": False}``); ``reasoning_format``: ``auto``
    gives a thinking model's ``<think>`` block apart (``reasoning_content``, a Responses ``reasoning`` item),
    ``none`` leaves it in the text. ``device``: the thread every generation runs on, best the one that loaded
    ``engine`` (``DeviceThread.call(edgespec.load, ...)``: onnxruntime's CUDA EP keeps its captured graphs and
    handles per thread); None: a thread of the scheduler's own, which ``run`` closes (an app served some other way
    keeps it, idle, until the process ends)."""
    origins = check_origins(allow_origins)
    api_key = check_api_key(api_key)
    from .template import check_template_kwargs

    if temperature == "model":
        temperature = engine.sampling_defaults.get("temperature", 1.0)
    elif isinstance(temperature, str):
        raise ConfigError(f"temperature must be a number, None or 'model', got {temperature!r}")
    sampling, takes = dict(sampling or {}), [k for k in SAMPLING_KEYS if k != "temperature"]
    bad = sorted(str(k) for k in sampling if k not in takes)
    if bad:
        raise ConfigError(f"sampling takes {', '.join(takes)} (the temperature is its own argument), not "
                          f"{', '.join(bad)}")
    engine.config(**sampling)  # (a bad value now, not on every request)
    srv = Server(engine, model_id, queue_size, {"drafter": drafter, "draft_tokens": draft_tokens,
                                                "temperature": temperature, **sampling},
                 template_kwargs=check_template_kwargs(chat_template_kwargs, "--chat-template-kwargs"),
                 reasoning_format=reasoning_format, device=device)
    routes = [Route("/v1/chat/completions", srv.chat, methods=["POST"]),
              Route("/v1/responses", srv.responses, methods=["POST"]),
              Route("/v1/responses/{rid:path}", srv.stored_response, methods=["GET", "POST", "DELETE"]),
              Route("/v1/completions", srv.completions, methods=["POST"]),
              Route("/v1/models", srv.models, methods=["GET"]),
              Route("/v1/models/{name:path}", srv.model, methods=["GET"]),
              Route("/health", srv.health, methods=["GET"]),
              Route("/tokenize", srv.tokenize, methods=["POST"]),
              Route("/detokenize", srv.detokenize, methods=["POST"]),
              Route("/metrics", srv.metrics_text, methods=["GET"])]
    middleware = [Middleware(RequestCounter, metrics=srv.metrics), Middleware(OriginGuard, origins=origins)]
    if api_key is not None:  # (inside the counter: refusals are counted; a preflight passes to CORS)
        middleware.append(Middleware(KeyGuard, key=api_key))
    if origins:  # a preflight (OPTIONS) is answered before the routes, which take GET, POST and DELETE; inside the
        # counter and the origin guard: a disallowed origin's preflight is the guard's JSON 403, counted, as its other
        # requests are (it was starlette's plain-text 400 "Disallowed CORS origin" until session 93)
        # (DELETE: OpenAI's client deletes a stored response so; a page's preflight for it was refused, and its
        # DELETE never reached the route's answer, a 404: nothing is stored)
        middleware.insert(2, Middleware(_JsonCORS, allow_origins=origins, allow_methods=["GET", "POST", "DELETE"],
                                        allow_headers=["*"], max_age=600))
    app = Starlette(routes=routes, middleware=middleware,
                    exception_handlers={P.APIError: _on_api_error, HTTPException: _on_http_error,
                                        Exception: _on_crash})
    app.state.server = srv
    return app


LISTEN_BACKLOG = 2048  # uvicorn's default


def bind(host: str, port: int) -> socket.socket:
    """A socket listening on host:port (port 0 picks a free one); a one-line error otherwise. It listens from here,
    before the model loads: two sockets with SO_REUSEADDR both bind a port neither listens on yet, so two servers
    started at once both passed this check, and the later one's uvicorn failed with a traceback (session 55, a
    review). Connections made while the model loads wait in the backlog."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as e:
        raise ConfigError(f"cannot listen on {host}:{port}: {getattr(e, 'strerror', None) or e}") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(LISTEN_BACKLOG)
    except OSError as e:
        sock.close()
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def run(app: Starlette, sock: socket.socket, *, banner: str = "", log_level: str = "info") -> None:
    """Serve ``app`` on ``sock`` until SIGINT/SIGTERM, then stop cleanly: no new requests, every
    generation stopped after its round in progress (its client told so), the worker thread's generation waited for.
    A second Ctrl-C stops waiting for open connections."""
    import contextlib
    import signal

    import uvicorn

    host, port = sock.getsockname()[:2]
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    sched: Scheduler = app.state.server.sched

    class _Server(uvicorn.Server):
        async def startup(self, sockets=None):
            await super().startup(sockets=sockets)
            if self.started:
                print(f"edgespec: serving on {url}/v1 {banner}".rstrip(), file=sys.stderr, flush=True)

        async def shutdown(self, sockets=None):
            sched.shutdown()  # the generations end first, so that their responses can complete
            watch = asyncio.ensure_future(self._cut_stalled())
            try:
                await super().shutdown(sockets=sockets)
            finally:
                watch.cancel()

        async def _cut_stalled(self):
            """While the server stops: a connection whose reply has not gone out for ``SEND_STALL_S`` (its client
            reads nothing, its TCP window full: uvicorn's send waits for it to drain) is cut. Such a client held the
            stop for uvicorn's whole grace (60 s, kept for a long prefill's reply), then left tracebacks in the log
            (session 50, a review); ``_next_chunk`` does the same for a request's body."""
            seen: dict = {}  # transport -> (its unsent bytes, since when unchanged)
            state = getattr(self, "server_state", None)  # (uvicorn's; one without it: nothing is cut, as before)
            if not hasattr(state, "connections"):
                return
            while True:
                await asyncio.sleep(0.25)
                now = time.monotonic()
                for conn in list(state.connections):
                    t = getattr(conn, "transport", None)
                    try:
                        size = t.get_write_buffer_size() if t is not None else 0
                    except (AttributeError, RuntimeError, OSError):
                        size = 0
                    if not size:
                        seen.pop(t, None)
                        continue
                    last, since = seen.get(t, (None, now))
                    if last != size:
                        seen[t] = (size, now)
                    elif now - since > SEND_STALL_S:
                        log.warning("a client read nothing for %.0f s while the server stopped: its connection "
                                    "is cut", SEND_STALL_S)
                        seen.pop(t, None)
                        t.abort()

        @contextlib.contextmanager
        def capture_signals(self):
            # uvicorn's, less the signal it re-raises afterwards: a clean stop exits 0, SIGTERM included
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            old = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in old.items():
                    signal.signal(sig, handler)

    # the wait for open responses: a generation stops after its round, but a long prefill is one call
    config = uvicorn.Config(app, log_level=log_level, lifespan="off", timeout_graceful_shutdown=60,
                            server_header=False)
    try:
        _Server(config).run(sockets=[sock])
        sched.shutdown()  # uvicorn returned without its shutdown (a failed startup): nothing may still run
        if not sched.join(120):
            print("edgespec: a generation did not stop in 120 s; exiting without it", file=sys.stderr, flush=True)
            sys.stderr.flush()
            os._exit(1)  # not through the interpreter's exit, which would abort under a thread inside onnxruntime
        sched.close()
    except KeyboardInterrupt:  # a Ctrl-C while the workers were joined
        print("edgespec: stopped (interrupted)", file=sys.stderr, flush=True)
        os._exit(130)
    print("edgespec: stopped", file=sys.stderr, flush=True)
