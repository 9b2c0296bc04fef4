"""llama.cpp as a runner beside edgespec's in the benchmarks, on the same GGUF files and prompt ids.

One ``llama-server`` (built by scripts/build_llamacpp.sh) per mode, started once and kept: plain
autoregressive decoding, draft-model speculation (the bundle's drafter GGUF, k tokens a round), and
n-gram speculation (``--spec-type ngram-simple``). Each request sends the prompt as token ids (the
GGUFs carry the tokenizer edgespec's bundle was exported with) to ``/completion`` with greedy
settings, and reads the server's own timings: ``prompt_ms`` (time to first token) and
``predicted_ms`` / ``predicted_n`` (decode). Servers idle between requests with ``--poll 0`` so
they do not spin on the cores edgespec's runs use. The prompt cache is off, so every request
prefills its prompt as edgespec's runs do after a reset.
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / ".llamacpp" / "bin" / "llama-server"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """A llama-server process on a free local port; ``complete(ids, n)`` returns the generation."""

    def __init__(self, model: str | Path, *, threads: int, ctx: int, extra: list[str] = (), log: Path | None = None):
        if not SERVER.is_file():
            raise FileNotFoundError(f"{SERVER} is missing: run scripts/build_llamacpp.sh first")
        self.port = _free_port()
        cmd = [str(SERVER), "-m", str(model), "--host", "127.0.0.1", "--port", str(self.port), "-t", str(threads),
               "-tb", str(threads), "-c", str(ctx), "-np", "1", "--poll", "0", "--no-warmup", "--cache-ram", "0",
               "--no-webui", *extra]
        self.log = open(log or os.devnull, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        atexit.register(self.close)  # (a script that ends on an error before its close() left servers running)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}): {' '.join(cmd)}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        self.close()
        raise RuntimeError("llama-server did not become healthy in 300 s")

    def complete(self, ids: list[int], n: int, **sampling) -> dict:
        body = {"prompt": list(map(int, ids)), "n_predict": n, "temperature": 0.0, "top_k": 1,
                "cache_prompt": False, "return_tokens": True, "stream": False, "samplers": ["top_k"]}
        if sampling:
            body.update(sampling)
            body.pop("samplers", None)
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def plain_and_ngram(eng, threads: int | None) -> dict[str, LlamaServer]:
    """llama.cpp plain (``llama-ar``) and with n-gram speculation (``llama-ngram``) on the GGUF that
    ``eng``'s bundle was exported from; ValueError for a bundle exported from elsewhere."""
    tgt = eng.manifest.sources.get("target")
    if not (tgt and str(tgt).endswith(".gguf")):
        raise ValueError("--llamacpp needs a bundle exported from a GGUF")
    ar = LlamaServer(tgt, threads=threads or 2, ctx=eng.max_context)
    try:
        return {"llama-ar": ar, "llama-ngram": LlamaServer(tgt, threads=threads or 2, ctx=eng.max_context,
                                                           extra=["--spec-type", "ngram-simple"])}
    except BaseException:
        ar.close()
        raise


def llamacpp_runners(target_gguf: str, drafter_gguf: str | None, *, threads: int, ctx: int = 4096,
                     draft_ks: tuple[int, ...] = (4,), ngram: bool = True, logs: Path | None = None):
    """External runners for edgespec.bench.run_bench: name -> fn(ids, n) -> dict; and a close()."""
    servers: dict[str, LlamaServer] = {}

    def start(name, model, extra=()):
        servers[name] = LlamaServer(model, threads=threads, ctx=ctx, extra=list(extra),
                                    log=(logs / f"{name.replace(':', '-')}.log") if logs else None)

    try:
        start("llama-ar", target_gguf)
        for k in draft_ks if drafter_gguf else ():
            start(f"llama-draft:{k}", target_gguf, ["-md", str(drafter_gguf), "--spec-type", "draft-simple",
                                                    "--spec-draft-n-max", str(k), "--spec-draft-n-min", "0",
                                                    "-td", str(threads), "-tbd", str(threads), "--poll-draft", "0"])
        if ngram:
            start("llama-ngram", target_gguf, ["--spec-type", "ngram-simple"])
    except BaseException:  # (a later server that does not start: the ones started are closed)
        for srv in servers.values():
            srv.close()
        raise

    def runner(name):
        srv = servers[name]

        def run(ids, n):
            r = srv.complete(ids, n)
            t = r.get("timings", {})
            toks = r.get("tokens") or []
            pred_n = int(t.get("predicted_n", len(toks)))
            # predicted_ms covers the tokens after the first (which prefill produced): decode time
            out = {"token_ids": [int(x) for x in toks], "decode_s": float(t.get("predicted_ms", 0.0)) / 1000.0,
                   "ttft_ms": float(t.get("prompt_ms", 0.0)), "target_calls": pred_n}
            out["reference"] = "llama-ar"  # its own quantization: exact against its own greedy output
            if name != "llama-ar":
                out.update( drafted=int(t.get("draft_n", 0)),
                           accepted=int(t.get("draft_n_accepted", 0)))
            return out
        return run

    runners = {name: runner(name) for name in servers}

    def close():
        for s in servers.values():
            s.close()

    return runners, close
