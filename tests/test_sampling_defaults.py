"""The model's recommended sampling (session 63): read at export (generation_config.json where it samples, a GGUF
file's general.sampling.* keys), kept in the manifest (``sampling_defaults``), and the default of the options a
generation leaves out in the Python API, generate, chat and serve (``--no-model-sampling``: none)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import openai
import pytest
from click.testing import CliRunner

import edgespec
from edgespec.cli import main
from edgespec.errors import ManifestError
from edgespec.manifest import MANIFEST_NAME, check_sampling_defaults

PROMPT = "1, 2, 3, 4,"


def _with_defaults(copy_bundle, bundle, defaults: dict) -> Path:
    """A copy of ``bundle`` whose manifest recommends ``defaults``."""
    b = copy_bundle(bundle)
    m = json.loads((b / MANIFEST_NAME).read_text())
    m["sampling_defaults"] = defaults
    (b / MANIFEST_NAME).write_text(json.dumps(m))
    return b


def _cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r


def _ids(*args):
    return json.loads(_cli("generate", *args, "-p", PROMPT, "--max-new-tokens", "24", "--json").output)["token_ids"]


def test_the_manifests_field_is_checked():
    assert check_sampling_defaults({"temperature": 0.7, "top_k": 20, "top_p": 0.8, "min_p": 0.05,
                                    "repetition_penalty": 1.05}, "x") == {
        "temperature": 0.7, "top_k": 20, "top_p": 0.8, "min_p": 0.05, "repetition_penalty": 1.05}
    for bad, msg in (({"temperature": -1}, "temperature must be"), ({"top_k": 1.5}, "top_k must be an integer"),
                     ({"typical_p": 0.9}, "'typical_p' is not a sampling option"), ({"top_p": True}, "a number"),
                     ({"top_p": -0.1}, "top_p must be in"), ({"repetition_penalty": 0}, "repetition_penalty must be"),
                     ([0.7], "must be an object")):
        with pytest.raises(ManifestError, match=msg):
            check_sampling_defaults(bad, "manifest.sampling_defaults")


def test_a_bundle_with_a_bad_recommendation_is_refused_in_one_line(tiny_bundle, copy_bundle):
    b = _with_defaults(copy_bundle, tiny_bundle, {"temperature": "hot"})
    with pytest.raises(ManifestError, match=f"{MANIFEST_NAME}: sampling_defaults.temperature must be a number"):
        edgespec.load(b)
    r = CliRunner().invoke(main, ["info", str(b)])
    lines = [ln for ln in r.output.splitlines() if ln]
    assert r.exit_code == 2 and len(lines) == 1 and "sampling_defaults" in lines[0], r.output


def test_the_engine_takes_the_models_recommendation_for_what_a_generation_leaves_out(tiny_bundle, copy_bundle):
    """temperature 1 with top-k 1 samples the greedy reply: the recommendation applied, option by option (a
    generation's own top_k 0 samples freely); model_sampling=False: greedy, as a bundle without one."""
    greedy = edgespec.load(tiny_bundle).generate(PROMPT, max_new_tokens=24).token_ids
    b = _with_defaults(copy_bundle, tiny_bundle, {"temperature": 1.0, "top_k": 1, "repetition_penalty": 1.0})
    eng = edgespec.load(b)
    assert eng.sampling_defaults == {"temperature": 1.0, "top_k": 1, "repetition_penalty": 1.0}
    assert eng.defaults.temperature == 1.0 and eng.defaults.top_k == 1
    assert eng.generate(PROMPT, max_new_tokens=24, seed=3).token_ids == greedy
    free = eng.generate(PROMPT, max_new_tokens=24, seed=3, top_k=0).token_ids
    assert free != greedy
    off = edgespec.load(b, model_sampling=False)
    assert off.sampling_defaults == {} and off.defaults.temperature == 0.0
    assert off.generate(PROMPT, max_new_tokens=24).token_ids == greedy
    with pytest.raises(edgespec.ConfigError, match="model_sampling must be True or False"):
        edgespec.load(b, model_sampling="no")


def test_generate_and_chat_take_it_and_info_shows_it(tiny_bundle, copy_bundle):
    greedy = _ids(tiny_bundle)
    b = _with_defaults(copy_bundle, tiny_bundle, {"temperature": 1.0})
    assert "recommended sampling (the defaults of generate, chat and serve; --no-model-sampling for none): " \
           "temperature 1" in _cli("info", b).output
    sampled = _ids(b, "--seed", "3")
    assert sampled != greedy and sampled == _ids(tiny_bundle, "--temperature", "1", "--seed", "3")
    assert _ids(b, "--seed", "3", "--no-model-sampling") == greedy
    assert _ids(b, "--temperature", "0") == greedy
    assert _ids(b, "--seed", "3", "--top-k", "1") == greedy  # (an option given, the others the model's)
    r = CliRunner().invoke(main, ["chat", str(b), "--max-new-tokens", "4"], input="/set\n")
    assert "temperature=1.0" in r.output, r.output
    r = CliRunner().invoke(main, ["chat", str(b), "--max-new-tokens", "4", "--no-model-sampling"], input="/set\n")
    assert "temperature=0.0" in r.output, r.output


def test_serve_takes_it_for_what_a_request_leaves_out(tiny_bundle, copy_bundle):
    """A request without temperature gets the model's (not OpenAI's 1), without top_k the model's; what it sends
    wins (repetition_penalty 1 included, which turns the model's penalty off); the response reports each value."""
    from test_server import _InProcess, http

    b = _with_defaults(copy_bundle, tiny_bundle, {"temperature": 0.5, "top_k": 1, "repetition_penalty": 1.3})
    eng = edgespec.load(b)
    greedy = edgespec.load(tiny_bundle).generate(PROMPT, max_new_tokens=16, repetition_penalty=1.3).text
    with _InProcess(eng, "m") as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        r = c.completions.create(model="m", prompt=PROMPT, max_tokens=16, seed=4)
        ext = r.model_extra["edgespec"]
        assert (ext["temperature"], ext["top_k"], ext["repetition_penalty"]) == (0.5, 1, 1.3), ext
        assert r.choices[0].text == greedy  # top-k 1: the greedy reply under the model's penalty
        r = c.completions.create(model="m", prompt=PROMPT, max_tokens=16, seed=4, temperature=1.0,
                                 extra_body={"top_k": 0, "repetition_penalty": 1.0})
        ext = r.model_extra["edgespec"]
        assert (ext["temperature"], ext["top_k"], ext["repetition_penalty"]) == (1.0, 0, 1.0), ext
        status, r = http(s.url + "/v1/responses", {"input": PROMPT, "max_output_tokens": 2})
        assert status == 200 and (r["temperature"], r["top_p"]) == (0.5, 1.0), r  # (the model names no top_p)
        status, r = http(s.url + "/v1/responses", {"input": PROMPT, "max_output_tokens": 2, "top_p": 0.7})
        assert status == 200 and r["top_p"] == 0.7, r
    with _InProcess(eng, "m", temperature=0.9) as s:  # serve --temperature: over the model's
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        assert c.completions.create(model="m", prompt=PROMPT, max_tokens=2).model_extra["edgespec"][
            "temperature"] == 0.9


def test_export_reads_generation_config_and_gguf_keys(tiny_dirs, tmp_path):
    from export.bundle import _sampling_defaults, gguf_metadata
    from export.source import Source

    src = tmp_path / "hf"
    shutil.copytree(tiny_dirs["llama"], src)
    logged = []
    gc = {"bos_token_id": 1, "do_sample": True, "temperature": 0.6, "top_p": 0.9, "top_k": 20,
          "repetition_penalty": 1.05, "min_p": 2.0, "typical_p": 0.5}
    (src / "generation_config.json").write_text(json.dumps(gc))
    got = _sampling_defaults(Source(str(src), "hf-dir", src), logged.append)
    assert got == {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05}
    assert any("min_p must be in [0, 1]" in line and "left out" in line for line in logged), logged
    (src / "generation_config.json").write_text(json.dumps({"do_sample": True, "top_k": 64, "top_p": 0.95}))
    assert _sampling_defaults(Source(str(src), "hf-dir", src), logged.append) == {  # (Gemma 3's: sampled at 1)
        "temperature": 1.0, "top_k": 64, "top_p": 0.95}
    (src / "generation_config.json").write_text(json.dumps({**gc, "do_sample": False}))
    assert _sampling_defaults(Source(str(src), "hf-dir", src), logged.append) == {}  # greedy recommended: none
    (src / "generation_config.json").unlink()
    assert _sampling_defaults(Source(str(src), "hf-dir", src), logged.append) == {}

    import gguf

    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("general.name", "x" * 300)
    w.add_array("tokenizer.ggml.tokens", ["a", "bb", "ccc"])
    w.add_array("tokenizer.ggml.scores", [0.5, 0.25, 0.125])
    w.add_array("general.nested", [[1, 2], [3]])
    w.add_array("general.sampling.min_p", [0.1])  # (a key of ours holding no number: not taken)
    w.add_float32("general.sampling.temp", 0.7)
    w.add_uint32("general.sampling.top_k", 40)
    w.add_float32("general.sampling.top_p", 0.95)
    w.add_float32("general.sampling.penalty_repeat", 1.1)
    w.add_int32("general.sampling.penalty_last_n", 64)
    w.add_tensor("t", np.zeros(4, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    fields = gguf.GGUFReader(str(path)).fields
    keys = ["general.sampling.temp", "general.sampling.top_k", "general.sampling.top_p",
            "general.sampling.penalty_repeat", "general.sampling.penalty_last_n", "general.sampling.min_p"]
    theirs = {k: fields[k].contents() for k in keys  # (its scalars: min_p's array left out)
              if k in fields and not isinstance(fields[k].contents(), list)}
    ours = gguf_metadata(path, keys)
    assert ours.keys() == theirs.keys() and all(np.float32(ours[k]) == np.float32(theirs[k]) for k in ours)
    assert ours["general.sampling.temp"] == 0.7 and ours["general.sampling.top_k"] == 40  # (float32's shortest text)
    got = _sampling_defaults(Source(str(path), "gguf", path), logged.append)
    assert got == {"temperature": 0.7, "top_k": 40, "top_p": 0.95, "repetition_penalty": 1.1}  # (float32's text)
    with pytest.raises(ValueError, match="not a GGUF file"):
        gguf_metadata(src / "config.json", keys)


def test_an_export_keeps_it(tiny_dirs, tmp_path):
    """The whole export: the manifest holds the recommendation, which reads back."""
    from export.bundle import export_bundle

    src = tmp_path / "hf"
    shutil.copytree(tiny_dirs["llama"], src)
    (src / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.6, "top_p": 0.9}))
    out = export_bundle(str(src), tmp_path / "b", target_precision="fp32", quality=False)
    assert edgespec.load(out).sampling_defaults == {"temperature": 0.6, "top_p": 0.9}
    assert json.loads((out / MANIFEST_NAME).read_text())["sampling_defaults"] == {"temperature": 0.6, "top_p": 0.9}


def test_serve_takes_the_models_temperature_and_exact_kernels_keeps_it(tiny_bundle, tiny_int4_bundle, copy_bundle,
                                                                      tmp_path):
    """The command line's serve (no --temperature): a request without one gets the model's; the banner says so.
    An exact-kernels rewrite keeps the recommendation."""
    from test_server import _start_server, http

    from export.kernels import apply_to_bundle

    b = _with_defaults(copy_bundle, tiny_bundle, {"temperature": 0.4, "top_p": 0.9})
    xk = tmp_path / "xk"
    apply_to_bundle(_with_defaults(copy_bundle, tiny_int4_bundle, {"temperature": 0.4, "top_p": 0.9}), xk,
                    log=lambda *a: None)
    assert edgespec.load(xk).sampling_defaults == {"temperature": 0.4, "top_p": 0.9}
    log = tmp_path / "serve.log"
    proc, url = _start_server(b, log, "--min-p", "0.05")
    try:
        status, r = http(url + "/v1/completions", {"prompt": PROMPT, "max_tokens": 2})
        assert status == 200 and (r["edgespec"]["temperature"], r["edgespec"]["top_p"]) == (0.4, 0.9), r
        assert r["edgespec"]["min_p"] == 0.05, r  # (serve --min-p)
    finally:
        proc.terminate()
        proc.wait(30)
    assert "default temperature 0.4, min_p 0.05; the model's recommended sampling temperature 0.4, top_p 0.9" \
        in log.read_text()


def test_serve_sets_its_own_defaults(tiny_bundle):
    """serve --top-p/--top-k/--min-p/--repetition-penalty (create_app's ``sampling``): the defaults of requests that
    send none, over the model's; min-p 1 at temperature 1 samples the greedy reply, a request's own min-p 0 does
    not."""
    from test_server import _InProcess

    eng = edgespec.load(tiny_bundle)
    greedy = eng.generate(PROMPT, max_new_tokens=16).text
    with _InProcess(eng, "m", temperature=1.0, sampling={"min_p": 1.0, "top_k": 5}) as s:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
        r = c.completions.create(model="m", prompt=PROMPT, max_tokens=16, seed=4)
        assert r.choices[0].text == greedy and r.model_extra["edgespec"]["min_p"] == 1.0
        assert r.model_extra["edgespec"]["top_k"] == 5
        r = c.completions.create(model="m", prompt=PROMPT, max_tokens=16, seed=4, extra_body={"min_p": 0})
        assert r.choices[0].text != greedy and r.model_extra["edgespec"]["min_p"] == 0
    from edgespec.server import create_app

    for bad, words in (({"min_p": 2.0}, "min_p must be in"), ({"temperature": 0.5}, "its own argument"),
                       ({"typical_p": 0.5}, "not typical_p")):
        with pytest.raises(edgespec.ConfigError, match=words):
            create_app(eng, "m", sampling=bad)
