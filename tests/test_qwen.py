"""The Qwen2.5-Coder pair (1.5B INT4 target at block 32 or 128 with a 0.5B INT8 or INT4 drafter; both
in fp32), when its bundles have been exported (README, "Real models"). Too heavy for CI's budget: run by hand."""
from __future__ import annotations

import pytest

import edgespec
from conftest import BUNDLES


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen-coder", "qwen-coder-d4", "qwen-coder-d4a", "qwen-coder-fp32",
                                  "qwen-coder-b128", "qwen-coder-b128-xk", "qwen-coder-b128-v64k",
                                  "qwen-coder-b128-v64k-xk", "qwen-coder-b128-dhqq-v64k-xk",
                                  "qwen-coder-b128-v64k-xk8"])
def test_qwen_pair_greedy_speculative_equals_autoregressive(name):
    bundle = BUNDLES / name
    if not (bundle / "edgespec.json").is_file():
        pytest.skip(f"no Qwen bundle at {bundle}: export it as the README's 'Real models' section says")
    eng = edgespec.load(bundle, max_context=1024)
    for prompt in ("def quicksort(arr):", "Explain what a hash map is in two sentences."):
        msgs = [{"role": "user", "content": prompt}]
        eng.reset()
        ref = eng.generate(msgs, max_new_tokens=48, drafter="none").token_ids
        for d, k in (("model", None), ("model", 2), ("model", 4), ("prompt-lookup", None), ("auto", None)):
            eng.reset()
            assert eng.generate(msgs, max_new_tokens=48, drafter=d, draft_tokens=k).token_ids == ref, (prompt, d, k)


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("name,algorithm", [("qwen-coder-gguf-xk", "gguf"), ("qwen-coder-hqq128-xk", "hqq"),
                                            ("qwen-coder-q4k-xk", "q4_k")])
def test_qwen_float_zero_point_target_decodes_exactly(name, algorithm):
    """The targets exported with --quant-algo gguf, hqq or q4_k --exact-kernels (README, 'Real models'; no
    drafter): float minimums per block (gguf and q4_k: Q4_K's scale bytes in 112 of its nodes); greedy prompt lookup and auto equal
    plain decoding token for token."""
    import json

    bundle = BUNDLES / name
    if not (bundle / "edgespec.json").is_file():
        pytest.skip(f"no Qwen bundle at {bundle}: export it as the README's 'Real models' section says")
    t = json.loads((bundle / "edgespec.json").read_text())["models"]["target"]
    assert t["quant"]["algorithm"] == algorithm and t["kernels"] == "edgespec-q4"
    import onnx

    nodes = [n for n in onnx.load(str(bundle / "target" / "model.onnx"), load_external_data=False).graph.node
             if n.op_type == "MatMulQ4"]
    kscales = sum(len(n.input) > 6 and bool(n.input[6]) for n in nodes)  # (input 6: Q4_K's scale bytes)
    assert kscales == (112 if algorithm in ("gguf", "q4_k") else 0), (kscales, len(nodes))
    eng = edgespec.load(bundle, max_context=1024)
    for prompt in ("def quicksort(arr):", "Repeat this list: apples, pears, plums, apples, pears, plums."):
        msgs = [{"role": "user", "content": prompt}]
        eng.reset()
        ref = eng.generate(msgs, max_new_tokens=48, drafter="none").token_ids
        for d in ("prompt-lookup", "auto"):
            eng.reset()
            assert eng.generate(msgs, max_new_tokens=48, drafter=d).token_ids == ref, (prompt, d)


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen-coder-b128-v64k-xk", "qwen-coder-b128-v64k-xk8"])
def test_qwen_prompt_cache_restores_a_chat_exactly(name):
    """On the benchmark bundle (edgespec's width-invariant kernels; int8 KV caches too): a chat set aside by another
    and restored replies as a fresh engine prefilling its whole history does, token for token."""
    bundle = BUNDLES / name
    if not (bundle / "edgespec.json").is_file():
        pytest.skip(f"no Qwen bundle at {bundle}: export it as the README's 'Real models' section says")
    a = [{"role": "user", "content": "Write a Python function that checks whether a string is a palindrome."}]
    eng = edgespec.load(bundle, max_context=1024, prompt_cache_mb=64, memory=False)
    a += [{"role": "assistant", "content": eng.generate(a, max_new_tokens=48).text},
          {"role": "user", "content": "Now make it ignore case and punctuation."}]
    eng.generate([{"role": "user", "content": "Name three prime numbers."}], max_new_tokens=16)
    got = eng.generate(a, max_new_tokens=48)
    assert got.stats["restored_prompt_tokens"] > 50
    eng.close()
    fresh = edgespec.load(bundle, max_context=1024, prompt_cache_mb=0, memory=False)
    assert fresh.generate(a, max_new_tokens=48).token_ids == got.token_ids


@pytest.mark.real
@pytest.mark.slow
def test_qwen_plain_export_with_the_logits_skip_prefills_alike(tmp_path):
    """The plain export (onnxruntime's MatMulNBits, whose one-row path differs) with the logits skip every
    export has since session 29, on a copy of ``qwen-coder-b128`` (exported before: hard links to its
    weights, its graphs rewritten by export's own ``add_logits_skip``; a bundle exported since then is used
    as it is): a fresh prefill and a re-prefill
    of the same prompt give the same bits on both models (before the review's fix 12 of 24 prompt lengths
    differed on the drafter), and greedy speculative decoding equals greedy decoding."""
    import hashlib
    import json
    import os
    import shutil

    import numpy as np

    from edgespec.manifest import load_manifest
    from edgespec.onnx_lm import OnnxLM
    from edgespec.providers import choose
    from edgespec_export.kernels import SKIP_INPUT, add_logits_skip

    src = BUNDLES / "qwen-coder-b128"
    if not (src / "edgespec.json").is_file():
        pytest.skip(f"no Qwen bundle at {src}: export it as the README's 'Real models' section says")
    man = json.loads((src / "edgespec.json").read_text())
    if all(spec["io"].get("logits_skip") for spec in man["models"].values() if spec):
        dst = src  # exported since session 29: its graphs have the skip already
    else:
        dst = tmp_path / "qwen-skip"
        shutil.copytree(src, dst, copy_function=os.link)
        (dst / "edgespec.json").unlink()
        for role, spec in man["models"].items():
            if not spec:
                continue
            g = dst / role / "model.onnx"
            data = g.read_bytes()
            g.unlink()  # its own file: the source bundle's graph stays as it is
            g.write_bytes(data)
            assert add_logits_skip(g, spec["io"]["logits"])
            spec["io"]["logits_skip"] = SKIP_INPUT
            spec["files"][f"{role}/model.onnx"] = {"bytes": g.stat().st_size,
                                                  "sha256": hashlib.sha256(g.read_bytes()).hexdigest()}
        (dst / "edgespec.json").write_text(json.dumps(man, indent=1))
    m = load_manifest(dst)
    ids = list(range(1000, 1044))
    for spec in (m.target, m.drafter):
        lm = OnnxLM(spec, 128, choose(["cpu"]))
        assert lm.skips_logits and lm.min_width >= 2  # onnxruntime's kernels: a width policy
        for n in range(20, 44):
            lm.reset()
            fresh = lm.prefill(ids[:n]).copy()
            assert np.array_equal(fresh, lm.prefill(ids[:n])), (spec.role, n)
    eng = edgespec.load(dst, max_context=1024, memory=False, prompt_cache_mb=0)
    msgs = [{"role": "user", "content": "def quicksort(arr):"}]
    ref = eng.generate(msgs, max_new_tokens=32, drafter="none").token_ids
    for d in ("model", "auto"):
        eng.reset()
        assert eng.generate(msgs, max_new_tokens=32, drafter=d).token_ids == ref, d


@pytest.mark.real
@pytest.mark.slow
def test_qwen_coder_calls_a_tool_and_answers_its_result():
    """Qwen2.5-Coder writes its calls as fenced JSON, not <tool_call> blocks: both are read. Greedy,
    the same calls under every drafter."""
    bundle = BUNDLES / "qwen-coder-b128-v64k-xk"
    if not (bundle / "edgespec.json").is_file():
        pytest.skip(f"no Qwen bundle at {bundle}: export it as the README's 'Real models' section says")
    import json

    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    ask = [{"role": "user", "content": "What's the weather like in Paris?"}]
    eng = edgespec.load(bundle, max_context=1024, memory=False)
    seen = set()
    for d in ("none", "model", "auto"):
        r = eng.generate(ask, tools=tools, max_new_tokens=64, temperature=0, drafter=d)
        seen.add(json.dumps([(c["function"]["name"], c["function"]["arguments"]) for c in r.tool_calls]))
        assert r.text == "" and [(c["function"]["name"], json.loads(c["function"]["arguments"]))
                                 for c in r.tool_calls] == [("get_weather", {"city": "Paris"})], d
    assert len(seen) == 1
    r = eng.generate(ask, tools=tools, max_new_tokens=64, temperature=0, tool_choice="required")
    assert [c["function"]["name"] for c in r.tool_calls] == ["get_weather"]
    history = ask + [{"role": "assistant", "content": None, "tool_calls": r.tool_calls},
                     {"role": "tool", "tool_call_id": r.tool_calls[0]["id"], "content": '{"temp_c": 14, "sky": "rain"}'}]
    nxt = eng.generate(history, tools=tools, max_new_tokens=64, temperature=0)
    assert nxt.finish_reason == "eos" and (nxt.tool_calls or "14" in nxt.text)


@pytest.mark.real
@pytest.mark.slow
def test_qwen_coder_fills_in_the_middle_exactly_under_every_drafter():
    """Qwen2.5-Coder's FIM tokens: the middle of a function, ended by the model (<|endoftext|>), the same
    tokens under every drafter; a long FIM prompt (the model drafter reads its head) too."""
    bundle = BUNDLES / "qwen-coder-b128-v64k-xk"
    if not (bundle / "edgespec.json").is_file():
        pytest.skip(f"no Qwen bundle at {bundle}: export it as the README's 'Real models' section says")
    eng = edgespec.load(bundle, max_context=2048, memory=False)
    prefix, suffix = "def fibonacci(n):\n    ", "\n\nprint(fibonacci(10))\n"
    long_prefix = "".join(f"def helper_{i}(x):\n    return x * {i} + {i}\n\n" for i in range(30)) + prefix
    for p in (prefix, long_prefix):
        ref = eng.generate(p, suffix=suffix, max_new_tokens=64, temperature=0, drafter="none")
        assert ref.finish_reason == "eos" and "return" in ref.text and "fibonacci(n" in ref.text, ref.text
        for d in ("model", "prompt-lookup", "suffix", "auto"):
            eng.reset()
            r = eng.generate(p, suffix=suffix, max_new_tokens=64, temperature=0, drafter=d)
            assert r.token_ids == ref.token_ids, (d, r.text)
    assert len(eng.encode(long_prefix, suffix=suffix)) > 128  # (past the drafter's read window: its head)
    eng.close()


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("name", ["qwen-coder-b128-v64k-xk", "qwen-coder-b128-v64k"])
def test_qwen_logprobs_equal_plain_decodings_and_the_scored_text(name):
    """Logprobs (README, Logprobs) on the pair: under ``auto`` and ``model`` the same values as plain decoding's,
    bit for bit (every row from a call of two or more tokens on either kernel), and a scored prompt + reply
    (64-token calls) gives the reply's values again, bit for bit too."""
    bundle = BUNDLES / name
    if not (bundle / "edgespec.json").is_file():
        pytest.skip(f"no Qwen bundle at {bundle}: export it as the README's 'Real models' section says")
    eng = edgespec.load(bundle, max_context=1024, memory=False)
    msgs = [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}]
    ref = eng.generate(msgs, max_new_tokens=64, drafter="none", logprobs=5)
    for d in ("auto", "model"):
        eng.reset()
        r = eng.generate(msgs, max_new_tokens=64, drafter=d, logprobs=5)
        assert r.token_ids == ref.token_ids and r.logprobs == ref.logprobs, d
        assert r.stats["accepted"] > 0 or d == "auto"  # (auto may decline to draft on a loaded machine)
    prompt = eng.encode(msgs)
    _, entries = eng.score(prompt + ref.token_ids, logprobs=5)
    assert [e["logprob"] for e in entries[len(prompt):]] == [e["logprob"] for e in ref.logprobs]  # (measured: equal)
    assert [e["top_logprobs"][0]["token_id"] for e in entries[len(prompt):]] == ref.token_ids


@pytest.mark.real
def test_qwen_logit_bias_refuses_the_models_padding_rows():
    """(session 64, a review) Qwen2.5's head has 151,936 rows, its tokenizer 151,665 tokens: a bias of +100 on a
    padding row made the reply "[PAD151900]" over and over. Refused as an id no token has; a real token still
    takes a bias."""
    bundle = BUNDLES / "qwen-coder-b128-v64k-xk"
    if not (bundle / "edgespec.json").is_file():
        pytest.skip(f"no Qwen bundle at {bundle}: export it as the README's 'Real models' section says")
    eng = edgespec.load(bundle, max_context=256, memory=False, use_drafter=False)
    with pytest.raises(edgespec.ConfigError, match="which no token of this model's tokenizer has"):
        eng.generate("Hi", max_new_tokens=2, logit_bias={151900: 100})
    t = eng.tokenizer.encode(" cat", add_special=False)[-1]
    assert eng.generate("Hi", max_new_tokens=2, logit_bias={t: 100}).token_ids == [t, t]
    eng.close()
