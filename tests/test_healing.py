"""Token healing (edgespec/healing.py): the masks against brute force, exactness under every drafter (greedy
token for token; sampled by a chi-square test over whole sequences against the exact held distribution, and a
planted bug it catches), and the engine's handling of the text backed off (returned text, ids, logprobs, stop
strings, fill in the middle, refusals)."""
from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys

import numpy as np
import pytest

import edgespec
from edgespec.decoder import Decoder
from edgespec.drafters import ModelDrafter, PromptLookupDrafter
from edgespec.errors import ConfigError
from edgespec.healing import Healer, HealConstraint
from edgespec.sampling import SamplingParams, probs
from test_decoder import _chi2, _chi2_crit, make, run
from tiny import FakeLM, split_runs

TABLE = [b"a", b"ab", b"b", b"ba", b"", b"abb"]  # token 4: special (never heals)


def brute(table, rest: bytes) -> np.ndarray:
    return np.array([bool(b) and (rest.startswith(b) or b.startswith(rest)) for b in table])


def test_masks_are_the_tokens_that_spell_the_rest():
    h = Healer(TABLE)
    for rest in (b"a", b"ab", b"abb", b"b", b"ba", b"bab", b"c"):
        assert (h.mask(rest) == brute(TABLE, rest)).all(), rest
    rng = np.random.default_rng(0)
    table = [bytes(rng.integers(97, 100, size=rng.integers(1, 5)).tolist()) for _ in range(300)]
    h = Healer(table)
    for _ in range(50):
        rest = bytes(rng.integers(97, 100, size=rng.integers(1, 6)).tolist())
        assert (h.mask(rest) == brute(table, rest)).all(), rest
    c = HealConstraint(Healer(TABLE), b"abb")
    allowed, n = c.masks([0, 2, 4, 3])  # a, b, then the special token: not allowed
    assert n == 2 and (allowed[0] == brute(TABLE, b"abb")).all() and (allowed[1] == brute(TABLE, b"bb")).all()
    assert (allowed[2] == brute(TABLE, b"b")).all()
    c.consume([1])
    assert not c.done and (c.mask() == brute(TABLE, b"b")).all()
    c.push(2)
    assert c.mask().all()  # spelled: everything is allowed after
    c.pop()
    c.consume([3])
    assert c.done and c.masks([4, 4])[1] == 2


def test_a_constraints_rows_pushes_and_end_follow_the_bytes_of_each_token():
    """(session 71, a mutation test) Rows after tokens of several bytes, pushes that add up and a pop that takes
    them all back, the end reached exactly, and a tokenizer's special tokens never healing (each went unchecked)."""
    h = Healer(TABLE)
    c = HealConstraint(h, b"abba")
    allowed, n = c.masks([1, 3, 0])  # "ab", "ba": spelled, then anything
    assert n == 3 and (allowed[1] == brute(TABLE, b"ba")).all() and allowed[2].all() and allowed[3].all()
    c.push(0)
    c.push(2)  # "a" then "b": two bytes pushed
    assert (c.mask() == brute(TABLE, b"ba")).all()
    c.pop()
    assert (c.mask() == brute(TABLE, b"abba")).all()
    c.consume([1, 2])
    assert not c.done and (c.mask() == brute(TABLE, b"a")).all()
    c.consume([0])  # the fourth byte of four
    assert c.done and c.mask().all()

    class Tok:  # (Healer.of reads these three)
        def special_ids_texts(self):
            return {"<s>"}

        def token_to_id(self, t):
            return {"<s>": 2}[t]

        def token_bytes(self, i):
            return [b"a", b"ab", b"<s>", b"<"][i]

    assert Healer.of(Tok(), 4).mask(b"<").tolist() == [False, False, False, True]


def _healing_decoder(vocab=6, seed=0):
    dec = make(vocab=vocab, seed=seed)
    dec.healer = lambda: Healer(TABLE)
    return dec


def test_greedy_healed_output_is_the_same_under_every_drafter():
    dec = _healing_decoder()
    for prompt, need in (([1, 2, 1, 2, 1], b"abb"), ([3, 3, 0, 1], b"b"), ([0], b"ba"), ([2, 2], b"a")):
        ref, _ = run(dec, prompt, max_new_tokens=30, drafter="none", heal=need)
        spelled = b"".join(TABLE[t] for t in ref)
        assert spelled.startswith(need), (ref, need)
        for d, k in (("model", 3), ("model", None), ("prompt-lookup", None), ("suffix", None), ("auto", None)):
            assert run(dec, prompt, max_new_tokens=30, drafter=d, draft_tokens=k, heal=need)[0] == ref, (d, k)


def _exact(prompt, n, sp, need):
    target = FakeLM(6, seed=7, sharpness=1.0)
    h = Healer(TABLE)
    out = {}
    for seq in itertools.product(range(6), repeat=n):
        p, reply = 1.0, []
        for t in seq:
            row = target.logits_for(list(prompt) + reply).astype(np.float64)
            cov = sum(len(TABLE[x]) for x in reply)
            if cov < len(need):
                row = np.where(h.mask(need[cov:]), row, -np.inf)
            p *= probs(row[None], sp)[0][t]
            reply.append(t)
        out[seq] = p
    return out


def _counts(sp, runs, drafter, need=b"abb", prompt=(1, 2, 1, 2, 1)):
    def work(seeds):
        target = FakeLM(6, seed=7, sharpness=1.0, reuse_buffer=True)
        dl = FakeLM(6, table=target.table + np.random.default_rng(3).normal(0, 1.0, target.table.shape),
                    reuse_buffer=True)
        dec = Decoder(target, (), drafters=[ModelDrafter(dl, 6), PromptLookupDrafter()])
        dec.healer = lambda: Healer(TABLE)
        counts: dict = {}
        for i in seeds:
            out, _ = run(dec, list(prompt), max_new_tokens=4, temperature=sp.temperature, top_k=sp.top_k,
                         top_p=sp.top_p, seed=i, drafter=drafter, draft_tokens=2, heal=need)
            counts[tuple(out)] = counts.get(tuple(out), 0) + 1
        return counts

    counts = split_runs(work, runs)
    # (4 new tokens: a round verifies two draft tokens, at 3 only one; session 55, a review)
    return _chi2(counts, _exact(list(prompt), 4, sp, need), runs)


@pytest.mark.parametrize("drafter, sp", [("model", SamplingParams(1.0)), ("auto", SamplingParams(0.7, top_k=4)),
                                         ("prompt-lookup", SamplingParams(1.3, top_p=0.9))])
def test_sampled_healed_output_follows_the_held_distribution(drafter, sp):
    stat, df = _counts(sp, 4000, drafter)
    assert stat < _chi2_crit(df), f"chi2 {stat:.1f} with {df} dof"


def test_the_statistical_test_catches_verify_rows_left_unheld(monkeypatch):
    """Plant a bug: a verify call's rows after the first held to the mask of the first (the draft's tokens
    before them not counted in), as a constraint that forgets to advance would."""
    real = HealConstraint.masks

    def masks(self, draft):
        allowed, n = real(self, draft)
        return np.repeat(allowed[:1], len(allowed), axis=0), n

    monkeypatch.setattr(HealConstraint, "masks", masks)
    monkeypatch.setattr(ModelDrafter, "takes_grammar", False)  # drafts that cross the healed bytes
    stat, df = _counts(SamplingParams(1.0), 4000, "model")
    assert stat > _chi2_crit(df), f"the planted bug went unnoticed (chi2 {stat:.1f}, {df} dof)"


def test_healing_and_a_grammar_or_bad_values_are_refused():
    from edgespec.decoder import GenerationConfig

    with pytest.raises(ConfigError, match="cannot be combined with a response format"):
        GenerationConfig(heal=b"ab", grammar="g")
    with pytest.raises(ConfigError, match="heal must be bytes"):
        GenerationConfig(heal="ab")
    dec = make()
    with pytest.raises(ConfigError, match="no tokenizer for token healing"):
        run(dec, [1, 2], max_new_tokens=3, heal=b"a")


def test_the_engine_backs_off_the_cursors_token_and_returns_the_text_after_it(smol_int4):
    eng = edgespec.load(smol_int4, memory=False)
    prompt = "The three primary colours are red, yel"
    ids = eng.tokenizer.encode(prompt)
    healed, need = eng.heal(ids)
    assert healed == ids[:-1] and need == eng.tokenizer.token_bytes(ids[-1]) and need
    r = eng.generate(prompt, max_new_tokens=12, token_healing=True, logprobs=0)
    whole = eng.tokenizer.decode(r.token_ids)
    assert whole.startswith(need.decode()) and r.text == whole[len(need.decode()):]
    assert r.stats["healed"] == need.decode() and [e["token_id"] for e in r.logprobs] == r.token_ids
    for d in ("none", "prompt-lookup"):
        assert eng.generate(prompt, max_new_tokens=12, token_healing=True, drafter=d).token_ids == r.token_ids
    assert "".join(eng.stream(prompt, max_new_tokens=12, token_healing=True)) == r.text
    # a stop string in the text returned: the ids stop with it
    stop = r.text[3:6]
    s = eng.generate(prompt, max_new_tokens=12, token_healing=True, stop=[stop], logprobs=0)
    assert s.text == r.text[:r.text.index(stop)] and s.finish_reason == "stop"
    assert eng.tokenizer.decode(s.token_ids).startswith(need.decode() + s.text)
    assert [e["token_id"] for e in s.logprobs] == s.token_ids
    # ... a stop string inside a later word: the ids are the fewest that spell what healing re-spelled and the text
    # (session 81, a mutation test: cut without the healed characters, they missed the token the stop string begins
    # in, which the one above, 3 characters in, did not show)
    word = re.search(r" [A-Za-z]{5,}", r.text[8:])
    stop = r.text[8 + word.start() + 2: 8 + word.start() + 5]
    s = eng.generate(prompt, max_new_tokens=12, token_healing=True, stop=[stop])
    spelled = need.decode() + s.text
    assert s.finish_reason == "stop" and len(s.text) >= 8, (r.text, s.text)
    assert eng.tokenizer.decode(s.token_ids).startswith(spelled)
    assert not eng.tokenizer.decode(s.token_ids[:-1]).startswith(spelled)
    # nothing to heal: a prompt of one token, a special token last
    one = eng.tokenizer.encode("Hi")
    assert eng.heal(one[-1:]) == (one[-1:], b"")
    im_end = eng.tokenizer.token_to_id("<|im_end|>")
    assert eng.heal([*ids, im_end]) == ([*ids, im_end], b"")
    for kw, msg in ((dict(token_healing="yes"), "token_healing must be true or false"),):
        with pytest.raises(ConfigError, match=msg):
            eng.generate(prompt, max_new_tokens=2, **kw)
    with pytest.raises(ConfigError, match="needs a plain prompt"):
        eng.generate([{"role": "user", "content": "hi"}], max_new_tokens=2, token_healing=True)
    with pytest.raises(ConfigError, match="response format"):
        eng.generate(prompt, max_new_tokens=2, token_healing=True, response_format={"type": "json_object"})
    for bad in (0, "", None):
        with pytest.raises(ConfigError, match="token_healing must be true or false"):
            eng.generate(prompt, max_new_tokens=2, token_healing=bad)
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        eng.heal([1, 10**7])
    for bad in ("ab", [1, "x"], [1.5], None):  # (session 43: an untyped ValueError or TypeError)
        with pytest.raises(ConfigError, match="heal\\(\\) takes the prompt's token ids"):
            eng.heal(bad)
    with pytest.raises(ConfigError, match="a token's are at most"):
        eng.generate(prompt, max_new_tokens=2, heal=b"x" * 1000)
    # a tokenizer whose decoder spells the token otherwise than its bytes where the reply is decoded (after the
    # prompt's last ids): the text returned could not be cut exactly, so nothing heals (a SentencePiece token's
    # leading space is text there since session 55, and heals: tests/test_runtime.py)
    real = eng.tokenizer.decode
    ctx = eng.tokenizer.text_context(ids[:-1])
    eng.tokenizer.decode = lambda t, skip_special=True: (real(t, skip_special)[:-1] if list(t) == [*ctx, ids[-1]]
                                                         else real(t, skip_special))
    try:
        assert eng.heal(ids) == (ids, b"")
    finally:
        eng.tokenizer.decode = real
    # a reply cut before it spelled the text backed off: stats say what it spelled
    part = eng.tokenizer.encode(need.decode()[:1], add_special=False)
    assert len(part) == 1 and len(need) > 1
    short = eng.generate(prompt, max_new_tokens=1, token_healing=True, logit_bias={part[0]: 100})
    assert short.token_ids == part and short.stats["healed"] == need.decode()[:1] and short.text == ""


def test_the_cli_and_the_server_take_token_healing(smol_int4, tmp_path):
    openai = pytest.importorskip("openai")
    pytest.importorskip("uvicorn")
    from test_server import _start_server

    prompt = "The three primary colours are red, yel"
    eng = edgespec.load(smol_int4, memory=False)
    ref = eng.generate(prompt, max_new_tokens=10, token_healing=True)
    p = subprocess.run([sys.executable, "-m", "edgespec.cli", "generate", str(smol_int4), "-p", prompt,
                        "--max-new-tokens", "10", "--token-healing", "--json", "--no-memory"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["text"] == ref.text
    proc, url = _start_server(smol_int4, tmp_path / "server.log", "--temperature", "0", "--no-memory")
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        r = client.completions.create(model=smol_int4.name, prompt=prompt, max_tokens=10,
                                      extra_body={"edgespec": {"token_healing": True}})
        assert r.choices[0].text == ref.text
        assert r.model_extra["edgespec"]["healed"] == ref.stats["healed"] != ""  # (session 65: as the API's stats)
        plain = client.completions.create(model=smol_int4.name, prompt=prompt, max_tokens=4)
        assert "healed" not in plain.model_extra["edgespec"]
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model=smol_int4.name, prompt=prompt, max_tokens=10, stream=True,
            extra_body={"edgespec": {"token_healing": True}}))
        assert streamed == ref.text
        from test_server import http

        status, err = http(url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                          "edgespec": {"token_healing": True}})
        assert status == 400 and err["error"]["param"] == "edgespec.token_healing", err
        status, err = http(url + "/v1/completions", {"prompt": "hi", "edgespec": {"token_healing": "yes"}})
        assert status == 400 and err["error"]["param"] == "edgespec.token_healing", err
    finally:
        proc.terminate()
        proc.wait(timeout=30)
