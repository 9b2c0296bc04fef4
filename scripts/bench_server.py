#!/usr/bin/env python3
"""Time to first token and decode speed through ``edgespec serve`` (HTTP, streamed) against the
Python API on the same bundle and prompts; the server's overhead as a share of decode time.

    python scripts/bench_server.py bundles/smollm2-int4 --max-tokens 64 --reps 2

The server runs as ``edgespec serve BUNDLE --port 0`` in a subprocess (127.0.0.1); the API runs
in this process. Runs are interleaved (API, HTTP, API, HTTP, ...) over the first turn of one
prompt per category of the shipped set, greedy, same drafter policy. Both sides are timed the
same way, as a caller sees them: TTFT from the call (the HTTP request; ``encode`` for the API) to
the first text, decode time from the first text to the end of the reply (``[DONE]``).

The server's overhead: the time a caller waits outside the engine (its wall time minus the
engine's own TTFT and decode time, from the stats of the same run) through HTTP, minus the same
through the API, as a share of the engine's decode time. It is what HTTP, JSON, SSE framing, the
queue and the thread hop add, free of the speed noise between two processes on shared cores
(the caller-side tok/s columns carry that noise).
"""
from __future__ import annotations

import argparse
import json
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from http.client import HTTPConnection
from importlib import resources
from pathlib import Path

import edgespec


@dataclass
class Run:
    text: str
    new_tokens: int
    ttft_s: float
    decode_s: float  # first text to the end of the reply, as the caller sees it
    total_s: float  # the call to the end of the reply
    engine_decode_s: float  # the engine's own decode time (after its first token)
    engine_total_s: float  # the engine's own time: its TTFT plus its decode time
    reused: int

    @property
    def outside_s(self) -> float:
        """Time the caller waited that the engine did not spend generating."""
        return self.total_s - self.engine_total_s


def first_turns(per_category: int = 1) -> list[tuple[str, str]]:
    seen: dict[str, int] = {}
    out = []
    for line in resources.files("edgespec").joinpath("data/prompts.jsonl").read_text(encoding="utf-8").splitlines():
        d = json.loads(line)
        if seen.get(d["category"], 0) < per_category:
            seen[d["category"]] = seen.get(d["category"], 0) + 1
            out.append((d["question_id"], d["turns"][0]))
    return out


def _engine_decode_s(new_tokens: int, tokens_per_second: float) -> float:
    return (new_tokens - 1) / tokens_per_second if new_tokens > 1 and tokens_per_second else 0.0


def api_run(eng, messages, n: int, drafter: str | None) -> Run:
    t0 = time.perf_counter()
    ids = eng.encode(messages)
    first, parts, st = None, [], None
    for delta, _, st, _ in eng.stream_ids(ids, max_new_tokens=n, temperature=0.0, drafter=drafter):
        if delta:
            first = first or time.perf_counter()
            parts.append(delta)
    end = time.perf_counter()
    first = first or end
    dec = _engine_decode_s(st.new_tokens, st.tokens_per_second)
    return Run("".join(parts), st.new_tokens, first - t0, end - first, end - t0, dec, st.ttft_ms / 1e3 + dec,
               st.reused_prompt_tokens)


def http_run(conn: HTTPConnection, model: str, messages, n: int, drafter: str | None) -> Run:
    body = {"model": model, "messages": messages, "max_tokens": n, "temperature": 0, "stream": True}
    if drafter:
        body["edgespec"] = {"drafter": drafter}
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"error: the server answered {resp.status}: {resp.read().decode()[:300]}")
    first, parts, ext = None, [], None
    while True:
        line = resp.readline()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            break
        obj = json.loads(data)
        choice = obj["choices"][0]
        text = choice["delta"].get("content")
        if text:
            first = first or time.perf_counter()
            parts.append(text)
        if choice["finish_reason"]:
            ext = obj["edgespec"]
    resp.read()
    end = time.perf_counter()
    first = first or end
    dec = _engine_decode_s(ext["new_tokens"], ext["tokens_per_second"])
    return Run("".join(parts), ext["new_tokens"], first - t0, end - first, end - t0, dec, ext["ttft_ms"] / 1e3 + dec,
               ext["reused_prompt_tokens"])


def start_server(bundle: str, log: Path, extra: list[str]) -> tuple[subprocess.Popen, str]:
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "edgespec.cli", "serve", bundle, "--port", "0", *extra],
                                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        m = re.search(r"serving on http://(127\.0\.0\.1):(\d+)/v1", log.read_text())
        if m:
            return proc, m.group(2)
        time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"error: the server did not start:\n{log.read_text()[-2000:]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--drafter", default=None, help="Drafter policy on both sides (default: the profile's).")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--max-context", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", dest="json_out", default=None, help="Also write every run to this JSON file.")
    args = ap.parse_args(argv)

    extra = []
    for flag, v in (("--profile", args.profile), ("--max-context", args.max_context), ("--threads", args.threads)):
        if v is not None:
            extra += [flag, str(v)]
    eng = edgespec.load(args.bundle, model_sampling=False, profile=args.profile, max_context=args.max_context, threads=args.threads)
    model = Path(args.bundle).resolve().name
    prompts = first_turns(args.per_category)
    with tempfile.TemporaryDirectory() as tmp:
        proc, port = start_server(args.bundle, Path(tmp) / "server.log", extra)
        try:
            conn = HTTPConnection("127.0.0.1", int(port), timeout=300)
            warm = [{"role": "user", "content": "Hello!"}]
            api_run(eng, warm, 8, args.drafter)
            http_run(conn, model, warm, 8, args.drafter)
            rows = []
            for rep in range(args.reps):
                for qid, text in prompts:
                    msgs = [{"role": "user", "content": text}]
                    a = api_run(eng, msgs, args.max_tokens, args.drafter)
                    time.sleep(0.3)  # let the API's idle pool threads stop spinning before the server runs
                    h = http_run(conn, model, msgs, args.max_tokens, args.drafter)
                    time.sleep(0.3)
                    rows.append((qid, rep, a, h))
            conn.close()
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()

    print(f"bundle {args.bundle}: {len(prompts)} prompts x {args.reps} reps, {args.max_tokens} new tokens, "
          f"greedy, drafter {args.drafter or 'profile default'}; times as the caller sees them\n")
    print("| prompt | tokens | TTFT API ms | TTFT HTTP ms | decode API tok/s | decode HTTP tok/s | "
          "outside the engine, API ms | outside the engine, HTTP ms | server overhead, % of decode | same text |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    by_prompt: dict[str, list] = {}
    for qid, _, a, h in rows:
        by_prompt.setdefault(qid, []).append((a, h))

    def med(xs):
        return statistics.median(list(xs))

    for qid, runs in by_prompt.items():
        toks = sum(a.new_tokens - 1 for a, _ in runs)
        over = sum(h.outside_s - a.outside_s for a, h in runs) / sum(h.engine_decode_s for _, h in runs)
        print(f"| {qid} | {runs[0][0].new_tokens} | {med(a.ttft_s for a, _ in runs) * 1e3:.0f} | "
              f"{med(h.ttft_s for _, h in runs) * 1e3:.0f} | {toks / sum(a.decode_s for a, _ in runs):.1f} | "
              f"{toks / sum(h.decode_s for _, h in runs):.1f} | {med(a.outside_s for a, _ in runs) * 1e3:.1f} | "
              f"{med(h.outside_s for _, h in runs) * 1e3:.1f} | {100 * over:.1f}% | "
              f"{'yes' if all(a.text == h.text for a, h in runs) else 'NO'} |")
    a_dec, h_dec = sum(r[2].decode_s for r in rows), sum(r[3].decode_s for r in rows)
    extra_s = sum(h.outside_s - a.outside_s for _, _, a, h in rows)
    h_eng = sum(h.engine_decode_s for _, _, _, h in rows)
    same = sum(a.text == h.text for _, _, a, h in rows)
    print(f"\nall {len(rows)} runs: the server adds {1e3 * extra_s / len(rows):.1f} ms per request outside the engine "
          f"over the API, {100 * extra_s / h_eng:.1f}% of decode time; TTFT through HTTP "
          f"{med((h.ttft_s - a.ttft_s) * 1e3 for _, _, a, h in rows):+.1f} ms (median); caller-side decode "
          f"time through HTTP {100 * (h_dec / a_dec - 1):+.1f}% vs the API (two processes: includes their "
          f"speed noise); same text in {same}/{len(rows)} runs")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            [{"prompt": q, "rep": r, "api": asdict(a), "http": asdict(h)} for q, r, a, h in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
