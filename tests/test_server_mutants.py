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


def test_tokenize_bounds_exactly(engine, model_id):  # SV27, SV28
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


def test_a_prompt_filling_the_context(engine, model_id):  # SV43
    with _InProcess(engine, model_id, temperature=0) as s:
        for stream in (False, True):
            st, err = http(s.url + "/v1/completions", {"prompt": [1] * CONTEXT, "max_tokens": 4, "stream": stream})
            assert st == 400 and err["error"]["code"] == "context_length_exceeded", (stream, st, err)
            assert err["error"]["param"] == "prompt"
        assert http(s.url + "/v1/completions", {"prompt": [1] * (CONTEXT - 1), "max_tokens": 4})[0] == 200


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


def test_an_engine_refusal_names_its_field():  # SV55 (server_protocol refuses such values first over HTTP)
    from edgespec.server import _param_of

    assert _param_of("max_draft_tokens must be in 1..64, got 0") == "edgespec.max_draft_tokens"
    assert _param_of("draft_tokens must be in 0..64, got 99") == "edgespec.draft_tokens"
    assert _param_of("logit_bias holds token id 7") == "logit_bias" and _param_of("what else") is None
