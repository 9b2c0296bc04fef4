"""Run by tests/test_min_deps.py in a subprocess whose PYTHONPATH puts .venv/min-deps first: the runtime on the
oldest releases pyproject.toml admits (scripts/min-deps.txt). Arguments: the pins file, then bundles. Exits
non-zero (an AssertionError's traceback) on the first thing that differs from what the newest releases give."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from importlib import metadata
from pathlib import Path

PROMPT = "def fizzbuzz(n):\n    for i in range(1, n + 1):\n        if i % 15 == 0:\n"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["name", "n"], "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "thing", "schema": SCHEMA}}


def check_versions(pins_file: str) -> None:
    for line in Path(pins_file).read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            got = metadata.version(name)
            assert got == version, f"{name} {got} runs here, not the pinned {version}: PYTHONPATH misses the pins"
            module = {"onnxruntime": "onnxruntime", "numpy": "numpy", "tokenizers": "tokenizers"}.get(name)
            if module:
                assert getattr(__import__(module), "__version__") == version, (module, version)


def check_engine(bundle: str) -> None:
    import edgespec

    eng = edgespec.load(bundle)
    plain = eng.generate(PROMPT, max_new_tokens=40, drafter="none", ignore_eos=True)
    assert len(plain.token_ids) == 40
    for drafter in ("model", "prompt-lookup", "suffix", "auto"):
        spec = eng.generate(PROMPT, max_new_tokens=40, drafter=drafter, ignore_eos=True)
        assert spec.token_ids == plain.token_ids, (bundle, drafter)
    a = eng.generate(PROMPT, max_new_tokens=24, drafter="auto", temperature=0.8, seed=7, ignore_eos=True)
    b = eng.generate(PROMPT, max_new_tokens=24, drafter="auto", temperature=0.8, seed=7, ignore_eos=True)
    assert a.token_ids == b.token_ids, "a seeded sampled generation is not reproducible"
    messages = [{"role": "user", "content": "Name a thing and a digit."}]
    held = [eng.generate(messages, max_new_tokens=48, drafter=d, response_format=FORMAT) for d in ("none", "auto")]
    assert held[0].token_ids == held[1].token_ids, "constrained greedy speculative output differs from plain"
    if held[0].finish_reason != "length":
        value = json.loads(held[0].text)
        assert set(value) == {"name", "n"} and 0 <= value["n"] <= 9, value


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgespec.cli", *args], capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


def check_cli(bundle: str) -> None:
    """click's oldest release under the CLI: commands, a usage error and a bundle error in one line each."""
    out = _cli("generate", bundle, "-p", PROMPT, "--max-new-tokens", "8", "--temperature", "0")
    assert out.returncode == 0 and out.stdout.strip(), out.stderr[-2000:]
    out = _cli("info", bundle)
    assert out.returncode == 0 and "target" in out.stdout, out.stderr[-2000:]
    out = _cli("plan", bundle)
    assert out.returncode == 0, out.stderr[-2000:]
    for args, code in ((("generate", bundle, "-p", "x", "--max-new-tokens", "zero"), 2),
                       (("generate", bundle), 2), (("generate", bundle + "-missing", "-p", "x"), 2)):
        out = _cli(*args)
        lines = out.stderr.strip().splitlines()
        assert out.returncode == code and len(lines) == 1 and lines[0].startswith("error: "), (args, out.stderr)
    out = _cli("memory")
    assert out.returncode in (0, 2) and "Usage:" in out.stdout + out.stderr, out.stderr[-2000:]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def check_server(bundle: str, log: Path) -> None:
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "edgespec.cli", "serve", bundle, "--port", "0",
                                 "--temperature", "0", "--no-memory"], stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        url, deadline = None, time.monotonic() + 120
        while url is None and time.monotonic() < deadline and proc.poll() is None:
            m = re.search(r"serving on (http://127\.0\.0\.1:\d+)/v1", log.read_text())
            url = m and m.group(1)
            time.sleep(0.2)
        assert url, f"the server did not start:\n{log.read_text()}"
        with urllib.request.urlopen(url + "/v1/models", timeout=30) as r:
            model = json.loads(r.read())["data"][0]["id"]
        chat = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16}
        reply = _post(url + "/v1/chat/completions", chat)
        assert reply["choices"][0]["message"]["content"] is not None and reply["usage"]["completion_tokens"] > 0
        with urllib.request.urlopen(urllib.request.Request(
                url + "/v1/chat/completions", json.dumps({**chat, "stream": True}).encode(),
                {"Content-Type": "application/json"}), timeout=120) as r:
            events = [line[6:] for line in r.read().decode().splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        streamed = "".join(json.loads(e)["choices"][0]["delta"].get("content") or ""
                           for e in events[:-1] if json.loads(e)["choices"])
        assert streamed == reply["choices"][0]["message"]["content"], "the stream differs from the reply"
        held = _post(url + "/v1/chat/completions", {**chat, "max_tokens": 48, "response_format": FORMAT})
        if held["choices"][0]["finish_reason"] == "stop":
            assert set(json.loads(held["choices"][0]["message"]["content"])) == {"name", "n"}
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    pins, log, *bundles = sys.argv[1:]
    check_versions(pins)
    for bundle in bundles:
        check_engine(bundle)
    check_cli(bundles[0])
    check_server(bundles[0], Path(log))
    assert "torch" not in sys.modules, "the runtime imported torch"
    print("min-deps ok:", ", ".join(f"{p}" for p in bundles))


if __name__ == "__main__":
    main()
