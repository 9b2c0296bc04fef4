"""The server's gaps a mutation test of edgespec/server.py found (session 93, docs/bench/mutation_s93.md): each test
fails with its planted bug (the mutant ids of docs/bench/mutation_harness/server_app.py in its comment) and passes
on the code as it is."""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection

import pytest

openai = pytest.importorskip("openai")

import edgespec  # noqa: E402
from test_reasoning import HELLO, think_bundle, think_engine  # noqa: E402,F401
from test_server import (CONTEXT, SYSTEM, _held, _InProcess, _raw, _rewrite_stream, engine, http,  # noqa: E402,F401
                         metric, model_id, wait_until)


def _client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_queue_of_none_and_the_gauges(engine, model_id, monkeypatch):  # SV7, SV9, SV26
    _held(engine, monkeypatch)
    with _InProcess(engine, model_id, queue_size=1, temperature=0) as s:
        c = _client(s.url)
        running = c.completions.create(model=model_id, prompt="1, 2, 3, 4,", max_tokens=400, stream=True)
        next(iter(running))
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(c.completions.create, model=model_id, prompt="a, b, c,", max_tokens=4)
            wait_until(lambda: http(s.url + "/health")[1]["queued"] == 1, 20, "the second request to queue")
            assert http(s.url + "/health")[1]["busy"] is True
            assert metric(s.url, "queue_depth") == 1 and metric(s.url, "generation_running") == 1
            assert metric(s.url, "queue_capacity") == 1
            running.close()
            assert waiting.result(timeout=60).choices[0].text
        assert metric(s.url, "queue_depth") == 0 and metric(s.url, "generation_running") == 0
    with _InProcess(engine, model_id, queue_size=0, temperature=0) as s:
        c = _client(s.url)
        running = c.completions.create(model=model_id, prompt="1, 2, 3, 4,", max_tokens=400, stream=True)
        next(iter(running))
        st, err = http(s.url + "/v1/completions", {"prompt": "x", "max_tokens": 2}, timeout=15)
        assert st == 429 and err["error"]["code"] == "queue_full", err
        running.close()
        wait_until(lambda: http(s.url + "/health")[1]["busy"] is False, 20, "the engine to be free")
        assert http(s.url + "/v1/completions", {"prompt": "x", "max_tokens": 2})[0] == 200


def test_logprobs_of_the_end_of_sequence(engine, model_id):  # SV14
    msgs = [SYSTEM, {"role": "user", "content": "What is 2+2?"}]
    with _InProcess(engine, model_id, temperature=0) as s:
        c = _client(s.url)
        r = c.chat.completions.create(model=model_id, messages=msgs, max_tokens=100, logprobs=True, top_logprobs=1)
        assert r.choices[0].finish_reason == "stop"
        assert len(r.choices[0].logprobs.content) == r.usage.completion_tokens
        chunks = list(c.chat.completions.create(model=model_id, messages=msgs, max_tokens=100, logprobs=True,
                                                top_logprobs=1, stream=True, stream_options={"include_usage": True}))
        n = sum(len(ch.choices[0].logprobs.content) for ch in chunks if ch.choices and ch.choices[0].logprobs
                and ch.choices[0].logprobs.content)
        assert n == chunks[-1].usage.completion_tokens == r.usage.completion_tokens


def test_usage_after_a_stop_spanning_rounds(engine, model_id):  # SV17
    prompt = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2,"
    ref = engine.generate(prompt, max_new_tokens=40, stop=[" 5,"], drafter="none", temperature=0)
    with _InProcess(engine, model_id, temperature=0) as s:
        c = _client(s.url)
        r = c.completions.create(model=model_id, prompt=prompt, max_tokens=40, stop=[" 5,"],
                                 extra_body={"edgespec": {"drafter": "none"}})
        assert r.choices[0].text == ref.text and r.usage.completion_tokens == len(ref.token_ids)


def test_a_gone_client_counted_499(engine, model_id, monkeypatch):  # SV22
    cancelled = _held(engine, monkeypatch)
    with _InProcess(engine, model_id, temperature=0) as s:
        labels = dict(endpoint="/v1/completions", status="499")
        before = metric(s.url, "requests_total", **labels)
        conn = HTTPConnection(s.url.split("//")[1], timeout=30)
        conn.request("POST", "/v1/completions", json.dumps({"model": model_id, "prompt": "1, 2, 3, 4,",
                                                            "max_tokens": 400}), {"Content-Type": "application/json"})
        wait_until(lambda: http(s.url + "/health")[1]["busy"], 20, "the request to run")
        conn.close()
        wait_until(lambda: metric(s.url, "requests_total", **labels) == before + 1, 30, "the 499 to be counted")
        assert cancelled.is_set()


def test_tokenize_bounds_exactly(engine, model_id):  # SV27, SV28, SR38
    with _InProcess(engine, model_id, temperature=0) as s:
        def count(k):
            st, r = http(s.url + "/tokenize", {"prompt": " hello" * k})
            return st, r

        c1, c2 = count(100)[1]["count"], count(101)[1]["count"]
        b = c2 - c1
        a = c1 - 100 * b
        assert b == 1
        k = 4 * CONTEXT - a
        st, r = count(k)
        assert st == 200 and r["count"] == 4 * CONTEXT
        st, r = count(k + 1)
        assert st == 400 and r["error"]["code"] == "context_length_exceeded"
        assert http(s.url + "/detokenize", {"tokens": [1] * (4 * CONTEXT)})[0] == 200
        big = "x" * 400_000  # (refused by its size before it is tokenized: "at least")
        assert engine.tokenizer.min_tokens(big) > 4 * CONTEXT
        st, r = http(s.url + "/tokenize", {"prompt": big})
        assert st == 400 and "is at least " in r["error"]["message"], r  # SR38
        assert http(s.url + "/detokenize", {"tokens": [1] * (4 * CONTEXT + 1)})[0] == 400


def test_seeds_of_several_prompts(engine, model_id):  # SV37
    prompts = ["1, 2, 3,", "Name a colour:"]
    refs = [[engine.generate(p, max_new_tokens=8, temperature=1.0, seed=11 + j).text for j in range(4)]
            for p in prompts]
    assert refs[1][0] != refs[1][2] or refs[1][1] != refs[1][3]  # (seeds 11/13, 12/14 differ)
    with _InProcess(engine, model_id, temperature=0) as s:
        r = _client(s.url).completions.create(model=model_id, prompt=prompts, max_tokens=8, n=2, temperature=1.0,
                                              seed=11)
        assert [x.text for x in r.choices] == [refs[0][0], refs[0][1], refs[1][0], refs[1][1]]


def test_each_prompt_its_own_max_tokens(engine, model_id):  # SV38
    ref = engine.generate("1, 2, 3, 4,", max_new_tokens=20, temperature=0)
    assert len(ref.token_ids) == 20
    with _InProcess(engine, model_id, temperature=0) as s:
        r = _client(s.url).completions.create(model=model_id, prompt=[[1] * (CONTEXT - 8), "1, 2, 3, 4,"],
                                              max_tokens=20, temperature=0)
        assert r.choices[1].text == ref.text


def test_a_prompt_filling_the_context(engine, model_id):  # SV43, SR57, SR70
    with _InProcess(engine, model_id, temperature=0) as s:
        for stream in (False, True):
            st, err = http(s.url + "/v1/completions", {"prompt": [1] * CONTEXT, "max_tokens": 4, "stream": stream})
            assert st == 400 and err["error"]["code"] == "context_length_exceeded", (stream, st, err)
            assert err["error"]["param"] == "prompt"
        assert http(s.url + "/v1/completions", {"prompt": [1] * (CONTEXT - 1), "max_tokens": 4})[0] == 200
        for n, want in ((CONTEXT, 200), (CONTEXT + 1, 400)):  # SR70: a scored prompt may fill the context
            st, r = http(s.url + "/v1/completions", {"prompt": [1] * n, "max_tokens": 0, "echo": True, "logprobs": 0})
            assert st == want, (n, st, r)
        for asked, clamped in ((8, False), (9, True)):  # SR57: max_tokens of the room exactly is not clamped
            st, r = http(s.url + "/v1/completions", {"prompt": [1] * (CONTEXT - 8), "max_tokens": asked})
            assert st == 200 and r["edgespec"]["max_tokens_clamped"] is clamped and r["edgespec"]["max_tokens"] == 8


def test_a_chunked_body_over_the_limit(engine, model_id):  # SV57
    with _InProcess(engine, model_id, temperature=0) as s:
        host, port = s.url.removeprefix("http://").split(":")
        conn = HTTPConnection(host, int(port), timeout=60)
        try:
            conn.putrequest("POST", "/v1/chat/completions")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            piece = b"x" * (1 << 20)
            try:
                for _ in range(9):
                    conn.send(b"%x\r\n" % len(piece) + piece + b"\r\n")
                conn.send(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
            r = conn.getresponse()
            assert r.status == 413 and json.loads(r.read())["error"]["code"] == "body_too_large"
        finally:
            conn.close()


def test_a_stream_after_shutdown_began_is_a_503(engine, model_id):  # SV5
    with _InProcess(engine, model_id, temperature=0) as s:
        before = _gens(s.url)
        s.app.state.server.sched.shutdown()
        st, err = http(s.url + "/v1/completions", {"prompt": "1, 2,", "max_tokens": 4, "stream": True})
        assert st == 503 and err["error"]["code"] == "server_shutdown", (st, err)
        assert _gens(s.url) == before


def _gens(url):
    import re
    return sum(float(v) for v in re.findall(r"^edgespec_generations_total\{.*\} (\S+)$", http(url + "/metrics")[1],
                                            re.M))


def test_a_prediction_of_the_context_plus_one(engine, model_id):  # SV33 (equivalent: the engine refuses it too)
    word = " hello"
    enc = lambda t: engine.tokenizer.encode(t, add_special=False, parse_special=False)  # noqa: E731
    b = len(enc(word * 101)) - len(enc(word * 100))
    a = len(enc(word * 100)) - 100 * b
    assert b == 1
    over = word * (CONTEXT + 1 - a)
    assert len(enc(over)) == CONTEXT + 1 and engine.tokenizer.min_tokens(over) <= CONTEXT
    with _InProcess(engine, model_id, temperature=0) as s:
        st, err = http(s.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                        "max_tokens": 2, "prediction": {"type": "content",
                                                                                        "content": over}})
        assert st == 400 and err["error"]["param"] == "prediction", err


def test_a_cancelled_generation_stops_after_its_round(engine, model_id, monkeypatch):  # SV13
    cancelled = _held(engine, monkeypatch)
    held_stream = engine.stream_ids
    after = []

    def counting(*a, **kw):
        inner = held_stream(*a, **kw)

        def gen():
            try:
                for item in inner:
                    if cancelled.is_set():
                        after.append(1)
                    yield item
            finally:
                inner.close()
        return gen()

    monkeypatch.setattr(engine, "stream_ids", counting)
    with _InProcess(engine, model_id, temperature=0) as s:
        stream = _client(s.url).completions.create(model=model_id, prompt="1, 2, 3, 4,", max_tokens=400, stream=True,
                                                   extra_body={"edgespec": {"drafter": "none"}})
        next(iter(stream))
        stream.close()
        wait_until(lambda: cancelled.is_set() and http(s.url + "/health")[1]["busy"] is False, 30, "the cancel")
        assert len(after) <= 1, len(after)


def test_shutdown_within_a_prefill_is_a_503(engine, model_id, monkeypatch):  # SV11, SV15
    def stream_ids(*a, **kw):
        def gen():
            t = engine.decoder.target
            deadline = time.monotonic() + 15
            while not (t.interrupt is not None and t.interrupt()):
                if time.monotonic() > deadline:
                    raise RuntimeError("the prefill was never interrupted")
                time.sleep(0.01)
            raise edgespec.Interrupted("planted: a prefill interrupted")
            yield  # noqa
        return gen()

    monkeypatch.setattr(engine, "stream_ids", stream_ids)
    with _InProcess(engine, model_id, temperature=0) as s:
        with ThreadPoolExecutor(1) as pool:
            f = pool.submit(http, s.url + "/v1/completions", {"prompt": "1, 2,", "max_tokens": 4}, None, 40)
            wait_until(lambda: http(s.url + "/health")[1]["busy"], 20, "the request to run")
            s.app.state.server.sched.shutdown()
            st, err = f.result(timeout=40)
        assert st == 503 and err["error"]["code"] == "server_shutdown", (st, err)


def test_an_origin_with_its_default_port(engine, model_id):  # SV61
    with _InProcess(engine, model_id, allow_origins=["http://localhost"]) as s:
        assert _raw(s.url + "/v1/models", headers={"Origin": "http://localhost:80"})[0] == 200
        assert _raw(s.url + "/v1/models", headers={"Origin": "HTTP://LOCALHOST"})[0] == 200


def test_a_reply_finished_before_the_stop_stays_whole(engine, model_id, monkeypatch):  # SV19
    at_end, go = threading.Event(), threading.Event()

    def whole_then_wait(inner):
        yield from inner
        at_end.set()  # the reply is whole; the worker waits for the stream's end
        go.wait(20)

    ref = engine.generate("1, 2, 3,", max_new_tokens=4, temperature=0)
    _rewrite_stream(engine, monkeypatch, whole_then_wait)
    with _InProcess(engine, model_id, temperature=0) as s:
        with ThreadPoolExecutor(1) as pool:
            f = pool.submit(http, s.url + "/v1/completions", {"prompt": "1, 2, 3,", "max_tokens": 4}, None, 40)
            assert at_end.wait(20)
            s.app.state.server.sched.shutdown()  # the stop begins after the reply was whole
            go.set()
            st, r = f.result(timeout=40)
        assert st == 200 and r["choices"][0]["text"] == ref.text, (st, r)


def test_the_heal_of_one_prompt_is_not_the_next_s(engine, model_id):  # SV39
    p1 = "The three primary colours are red, yel"
    cands = ["Hi", "A", "1", "The", "Hello"]
    p2 = next(c for c in cands if engine.heal(engine.encode(c))[1] == b"")
    assert engine.heal(engine.encode(p1))[1] != b""
    refs = [engine.generate(p, max_new_tokens=10, token_healing=True, temperature=0).text for p in (p1, p2)]
    with _InProcess(engine, model_id, temperature=0) as s:
        r = _client(s.url).completions.create(model=model_id, prompt=[p1, p2], max_tokens=10, temperature=0,
                                              extra_body={"edgespec": {"token_healing": True}})
        assert [c.text for c in r.choices] == refs, (p2, refs)


def test_streamed_logprobs_of_a_thinking_reply_cut_anywhere(think_engine):  # SV50
    full = think_engine.generate([HELLO], max_new_tokens=40, temperature=0)
    with _InProcess(think_engine, "m", temperature=0) as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        for k in range(1, len(full.token_ids) + 1):
            r = c.chat.completions.create(model="m", messages=[HELLO], max_tokens=k, logprobs=True, temperature=0)
            whole = len(r.choices[0].logprobs.content or [])
            chunks = list(c.chat.completions.create(model="m", messages=[HELLO], max_tokens=k, logprobs=True,
                                                    temperature=0, stream=True))
            n = sum(len(ch.choices[0].logprobs.content or []) for ch in chunks
                    if ch.choices and ch.choices[0].logprobs is not None)
            assert n == whole == r.usage.completion_tokens, (k, n, whole, r.usage.completion_tokens)


def test_an_options_request_that_is_no_preflight_is_not_asked_for_a_key(engine, model_id):  # SV62
    """The key guard lets OPTIONS through (a browser's preflight carries no credentials): without --allow-origin an
    OPTIONS request is the route's 405, not a 401."""
    with _InProcess(engine, model_id, api_key="k" * 16) as s:
        assert _raw(s.url + "/v1/models", "OPTIONS")[0] == 405
        assert _raw(s.url + "/v1/models")[0] == 401


def test_an_engine_refusal_names_its_field():  # SV55, SR88 (server_protocol refuses such values first over HTTP)
    from edgespec.server import _param_of

    assert _param_of("max_draft_tokens must be in 1..64, got 0") == "edgespec.max_draft_tokens"
    assert _param_of("draft_tokens must be in 0..64, got 99") == "edgespec.draft_tokens"
    assert _param_of("logit_bias holds token id 7") == "logit_bias" and _param_of("what else") is None
    assert _param_of("drafter 'eagle' is not in this bundle") == "edgespec.drafter"  # (SR88, session 100)


# -- session 100: a second pass (docs/bench/mutation_s100_server.md, mutants SR1-SR113 of
# docs/bench/mutation_harness/server_mut2.py); the scheduler's bookkeeping with a stand-in engine (no model)
class _Stand:
    """A stand-in engine for the scheduler's and the device thread's bookkeeping: its stream yields ``rounds``
    ((text, token ids) each, the last with a stop), waits for ``gate`` after the first where one is given, and
    calls ``on_close`` as it closes."""

    def __init__(self, rounds, gate=None, on_close=None):
        from types import SimpleNamespace

        self.rounds, self.gate, self.on_close, self.started = rounds, gate, on_close, 0
        self.decoder = SimpleNamespace(target=SimpleNamespace(interrupt=None, calls=0), drafters={})

    def stream_ids(self, ids, stop=None, **kw):
        from types import SimpleNamespace

        self.started += 1

        def gen():
            try:
                for j, (text, toks) in enumerate(self.rounds):
                    last = j + 1 == len(self.rounds)
                    st = SimpleNamespace(finish_reason="stop" if last else None, new_tokens=j + 1)
                    lps = ([{"token": t, "offset": 0, "logprob": -1.0} for t in toks] if kw.get("logprobs") is not None
                           else None)
                    yield text, toks, st, lps
                    if j == 0 and self.gate is not None:
                        assert self.gate.wait(20)
            finally:
                if self.on_close is not None:
                    self.on_close()
        return gen()

    def returned_ids(self, out, text, last):
        return list(out)


def _sched(engine=None, queue_size=4, device=None):
    from edgespec.server import Scheduler
    from edgespec.server_metrics import Metrics

    return Scheduler(engine, queue_size, Metrics(dict), device)


def _gen(sched, **kw):
    from edgespec.server import Generation

    return Generation(sched, [1, 2], [], {"max_new_tokens": 4, **kw})


def test_a_stop_cancels_every_generation_and_a_cancel_frees_its_place():  # SR9, SR10, SR11
    import asyncio

    sched = _sched()
    gens = [_gen(sched) for _ in range(3)]
    assert sched.waiting == 3 and sched.active == set(gens)
    gens[0].cancel()  # (a client gone before its generation began)
    assert sched.waiting == 2 and sched.active == set(gens[1:])
    sched.shutdown()
    assert all(g._cancel.is_set() and g.shutdown for g in gens[1:])
    assert sched.waiting == 0 and not sched.active

    async def events():
        return [e async for e in _gen(sched).events()]

    out = asyncio.run(asyncio.wait_for(events(), 30))  # a choice made after the stop: the 503, counted as cancelled
    assert [e[0] for e in out] == ["error"] and sched.metrics.finished["cancelled"] == 1
    sched.close()


def test_join_and_close_of_the_scheduler():  # SR3, SR4
    from concurrent.futures import Future

    from edgespec.device_thread import DeviceThread

    sched = _sched()
    job = Future()
    sched.running.add(job)
    assert sched.join(0.05) is False  # a generation still running
    job.set_result(None)
    assert sched.join(0.05) is True
    sched.close()
    assert sched.device.close(timeout=5)  # (its own thread: ended)
    dev = DeviceThread()
    try:
        sched = _sched(device=dev)
        sched.close()  # a caller's thread stays
        assert dev.submit(lambda: 7).result(timeout=5) == 7
    finally:
        dev.close(timeout=5)


def test_a_generation_s_bookkeeping_on_the_device_thread():  # SR16, SR17, SR20, SR21, SR24, SR30
    import asyncio

    rounds = [("a", [1]), ("b", [2]), ("c", [3]), ("d", [4])]
    stand = _Stand(rounds)
    sched = _sched(stand)

    async def slow_reader(g):  # the deltas after the first pile up while it sleeps: they go out as one
        out = []
        async for e in g.events():
            out.append(e)
            if len(out) == 1:
                await asyncio.sleep(0.3)
        return out

    out = asyncio.run(asyncio.wait_for(slow_reader(_gen(sched, logprobs=0)), 30))
    assert [e[0] for e in out[:-1]] == ["delta"] * (len(out) - 1) and len(out) < 5 and out[-1][0] == "done", out
    assert "".join(e[1][0] for e in out[:-1]) == "abcd" and sum(len(e[1][1]) for e in out[:-1]) == 4, out
    assert stand.decoder.target.interrupt is None  # (the hook of the generation's cancel flag taken off)
    assert not sched.busy and not sched.lock.locked() and not sched.active and sched.waiting == 0
    # a client gone after the first delta: the stream is closed while the generation still holds the turn
    gate, seen = threading.Event(), []

    def on_close():
        time.sleep(0.2)
        seen.append(sched.busy)

    stand.gate, stand.on_close = gate, on_close

    async def leave(g):
        out = []
        async for e in g.events():
            out.append(e)
            if len(out) == 1:
                assert sched.busy and sched.waiting == 0  # (running: no longer counted as waiting)
                g.cancel()
                gate.set()
        return out

    out = asyncio.run(asyncio.wait_for(leave(_gen(sched)), 30))
    assert [e[0] for e in out] == ["delta", "done"] and seen == [True], (out, seen)
    # a choice whose cancel came before the device thread began it: nothing of it runs
    started = stand.started
    g = _gen(sched)

    async def direct():
        loop, q = asyncio.get_running_loop(), asyncio.Queue()
        await sched.lock.acquire()
        sched.busy, g._started = True, True
        g.cancel()
        await loop.run_in_executor(None, g._work, loop, q)
        return await q.get()

    assert asyncio.run(asyncio.wait_for(direct(), 30))[0] == "done" and stand.started == started
    # the device thread closed: the request's error, and the turn freed
    sched.device.close(timeout=5)

    async def events():
        return [e async for e in _gen(sched).events()]

    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(asyncio.wait_for(events(), 30))
    assert not sched.busy and not sched.lock.locked() and not sched.active


def test_an_echoed_prompt_cut_inside_a_character(engine, model_id):  # SR22, SR27
    """echo without logprobs: the prompt's text as the stream decoder gives it, its held-back tail flushed (a prompt
    of ids that ends inside a character: its whole characters, as the scored echo's)."""
    ids = engine.tokenizer.encode("Hi \N{GRINNING FACE}", add_special=False)[:-1]
    head = engine.score(ids, 0)[0]
    assert head.startswith("Hi")
    with _InProcess(engine, model_id, temperature=0) as s:
        for extra in ({}, {"logprobs": 0}):
            st, r = http(s.url + "/v1/completions", {"prompt": ids, "max_tokens": 0, "echo": True, **extra})
            assert st == 200 and r["choices"][0]["text"] == head, (extra, st, r)
            assert r["edgespec"]["prompt_tokens"] == r["usage"]["prompt_tokens"] == len(ids), r  # (SR27)


def test_create_app_refuses_bad_options_up_front(engine, model_id):  # SR34, SR101, SR108, SR109, SR110
    from edgespec.errors import ConfigError
    from edgespec.server import check_api_key, create_app

    for kw, said in (({"temperature": "hot"}, "temperature must be a number"), ({"sampling": {"foo": 1}},
                                                                                 "sampling takes top_p"),
                     ({"sampling": {"top_p": 5.0}}, "top_p"), ({"reasoning_format": "maybe"}, "reasoning_format")):
        with pytest.raises(ConfigError, match=said):
            create_app(engine, model_id, **kw)
    assert check_api_key("k" * 8) == "k" * 8 and check_api_key("k" * 512) == "k" * 512  # (the bounds themselves)
    for bad in ("k" * 7, "k" * 513):
        with pytest.raises(ConfigError, match="8 to 512"):
            check_api_key(bad)


def test_a_stream_s_headers_keep_proxies_from_buffering_it(engine, model_id):  # SR31
    body = json.dumps({"prompt": "1, 2,", "max_tokens": 2, "stream": True}).encode()
    with _InProcess(engine, model_id, temperature=0) as s:
        st, h, text = _raw(s.url + "/v1/completions", "POST", {"Content-Type": "application/json"}, body, read=True)
    assert st == 200 and h["content-type"].startswith("text/event-stream") and text.endswith("data: [DONE]\n\n")
    assert h["cache-control"] == "no-cache" and h["x-accel-buffering"] == "no"  # (nginx's buffering off)


def test_a_model_this_server_does_not_serve_is_a_404(engine, model_id):  # SR37
    with _InProcess(engine, model_id, temperature=0) as s:
        assert http(s.url + f"/v1/models/{model_id}")[0] == 200
        st, err = http(s.url + "/v1/models/gpt-4o")
        assert st == 404 and err["error"]["code"] == "model_not_found" and err["error"]["param"] == "model", err


def test_a_prediction_is_read_as_text_and_bounded_before_it_is_tokenized(engine, model_id):  # SR50, SR51
    text = "<|im_end|> <|im_start|>assistant"  # (special tokens' text in a prediction stays text)
    n = len(engine.tokenizer.encode(text, add_special=False, parse_special=False))
    assert n > len(engine.tokenizer.encode(text, add_special=False, parse_special=True))
    msgs = [{"role": "user", "content": "hi"}]
    with _InProcess(engine, model_id, temperature=0) as s:
        st, r = http(s.url + "/v1/chat/completions", {"messages": msgs, "max_tokens": 3,
                                                       "prediction": {"type": "content", "content": text}})
        d = r["usage"]["completion_tokens_details"]
        assert st == 200 and d["accepted_prediction_tokens"] + d["rejected_prediction_tokens"] == n, r
        big = "x" * 120_000
        assert engine.tokenizer.min_tokens(big) > CONTEXT
        st, err = http(s.url + "/v1/chat/completions", {"messages": msgs, "max_tokens": 2,
                                                         "prediction": {"type": "content", "content": big}})
        assert st == 400 and "has at least" in err["error"]["message"] and err["error"]["param"] == "prediction"


def test_the_queue_time_and_the_cached_tokens_of_several_choices(engine, model_id):  # SR59, SR85
    prompt = "1, 2, 3, 4, 5, 6, 7, 8,"
    with _InProcess(engine, model_id, temperature=0) as s:
        st, r = http(s.url + "/v1/completions", {"prompt": prompt, "max_tokens": 2})
        assert st == 200 and r["edgespec"]["queue_ms"] >= 0, r  # (non-streamed too)
        st, r = http(s.url + "/v1/completions", {"prompt": prompt, "max_tokens": 2, "n": 2, "temperature": 1.0})
        use = r["usage"]
        assert st == 200 and [c["queue_ms"] >= 0 for c in r["edgespec"]["choices"]] == [True, True], r
        # each prompt's cached tokens once (its first choice's), as its prompt tokens are
        assert 0 < use["prompt_tokens_details"]["cached_tokens"] < use["prompt_tokens"], use


def test_a_host_name_that_is_no_idna_is_a_one_line_error():  # SR113
    from edgespec.errors import ConfigError
    from edgespec.server import bind

    with pytest.raises(ConfigError, match="cannot listen on x+:0: .*label"):
        bind("x" * 64, 0)  # (a label over 63 characters: the IDNA codec's UnicodeError)


def test_a_body_of_the_limit_exactly_is_read(engine, model_id):  # SR89, SR90
    from edgespec.server_protocol import MAX_BODY

    head = json.dumps({"prompt": "1, 2,", "max_tokens": 1}).encode()
    body = head[:-1] + b" " * (MAX_BODY - len(head)) + b"}"
    assert len(body) == MAX_BODY
    with _InProcess(engine, model_id, temperature=0) as s:
        assert http(s.url + "/v1/completions", body)[0] == 200  # (its Content-Length: the limit)
        host, port = s.url.removeprefix("http://").split(":")
        conn = HTTPConnection(host, int(port), timeout=60)
        try:  # chunked: its size counted as read
            conn.putrequest("POST", "/v1/completions")
            conn.putheader("Content-Type", "application/json")
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            for i in range(0, MAX_BODY, 1 << 20):
                piece = body[i:i + (1 << 20)]
                conn.send(b"%x\r\n" % len(piece) + piece + b"\r\n")
            conn.send(b"0\r\n\r\n")
            r = conn.getresponse()
            assert r.status == 200, r.read()[:300]
        finally:
            conn.close()


def test_a_port_a_stopped_server_just_used_binds_again():  # SR112
    """A restart on the port of a server that just closed its clients' connections (theirs in TIME_WAIT)."""
    import socket

    from edgespec.server import bind

    first = bind("127.0.0.1", 0)
    port = first.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn, _ = first.accept()
    conn.close()  # (the server's side closes first: its end waits in TIME_WAIT)
    client.close()
    first.close()
    bind("127.0.0.1", port).close()


def test_a_method_not_allowed_says_the_methods_and_a_crash_is_a_500(engine, model_id, monkeypatch):  # SR93, SR94
    def boom(*a, **kw):
        raise ValueError("planted")

    with _InProcess(engine, model_id, temperature=0) as s:
        st, h = _raw(s.url + "/tokenize")
        assert st == 405 and h["allow"] == "POST", dict(h)
        monkeypatch.setattr(engine.tokenizer, "decode", boom)
        st, err = http(s.url + "/detokenize", {"tokens": [1, 2]})
        assert st == 500 and err["error"]["code"] == "internal_error" and "ValueError" in err["error"]["message"]


def test_a_cut_replys_closed_thinking_is_complete_and_choices_add_their_thinking(think_engine):  # SR62, SR82, SR86
    """(session 100) A Responses reply cut after its thinking closed: the reasoning item is completed, the message
    incomplete, streamed or not; several chat choices' reasoning tokens add up in the usage."""
    from tiny import WHY

    with _InProcess(think_engine, "m", temperature=0) as s:
        resp = s.url + "/v1/responses"
        st, full = http(resp, {"input": "Why is the sky blue?", "max_output_tokens": 40})
        thought = full["usage"]["output_tokens_details"]["reasoning_tokens"]
        cut = {"input": "Why is the sky blue?", "max_output_tokens": thought + 2}
        st, r = http(resp, cut)
        assert st == 200 and r["status"] == "incomplete", r
        assert [(o["type"], o["status"]) for o in r["output"]] == [("reasoning", "completed"),
                                                                   ("message", "incomplete")], r["output"]
        st, raw = http(resp, {**cut, "stream": True})
        last = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")][-1]
        assert [(o["type"], o["status"]) for o in last["response"]["output"]] == [("reasoning", "completed"),
                                                                                  ("message", "incomplete")], last
        st, one = http(s.url + "/v1/chat/completions", {"messages": [WHY], "max_tokens": 40})
        st, two = http(s.url + "/v1/chat/completions", {"messages": [WHY], "max_tokens": 40, "n": 2})
        per = one["usage"]["completion_tokens_details"]["reasoning_tokens"]
        assert st == 200 and per > 0 and two["usage"]["completion_tokens_details"]["reasoning_tokens"] == 2 * per, two
