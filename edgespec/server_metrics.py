"""``GET /metrics`` for ``edgespec serve``: Prometheus text exposition (format 0.0.4), no dependency.

Counters for requests (by endpoint and status), generations (by finish reason), tokens (prompt,
reused from the KV cache, generated, drafted, accepted), target calls, time; gauges for the queue,
the running generation, overall acceptance and this process's memory.
"""
from __future__ import annotations

import threading
from collections import Counter
from typing import Callable

from .measure import peak_rss, proc_status

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/health", "/metrics", "/tokenize",
             "/detokenize")


def _memory() -> dict:
    """Resident (``VmRSS``, Linux only) and peak resident (``VmHWM``, or ``ru_maxrss`` where there
    is no /proc) bytes of this process, read by ``edgespec.measure``."""
    out = proc_status()
    out.setdefault("VmHWM", peak_rss())
    return out


class Metrics:
    def __init__(self, gauges: Callable[[], dict]):
        self._gauges = gauges
        self._lock = threading.Lock()
        self.requests: Counter = Counter()  # (endpoint, status) -> n
        self.finished: Counter = Counter()  # engine finish reason / cancelled / error -> n
        self.tokens: Counter = Counter()
        self.rejected = 0
        self.seconds = {"queue": 0.0, "ttft": 0.0}

    def add(self, key: str, n: int = 1) -> None:
        """Count ``n`` more of ``key`` (tool calls returned, generations held to a grammar)."""
        with self._lock:
            self.tokens[key] += n

    def request(self, endpoint: str, status: int) -> None:
        with self._lock:
            # a fixed set: a client's path never becomes a label (a model's page and the stored-response routes,
            # which answer 404 as edgespec stores none, each have one; session 98: the latter were "other")
            label = endpoint if endpoint in ENDPOINTS else next(
                (f"{root}/{{id}}" for root in ("/v1/models", "/v1/responses") if endpoint.startswith(root + "/")),
                "other")
            self.requests[(label, status)] += 1

    def generation(self, s: dict | None, queue_ms: float, *, cancelled: bool, failed: bool) -> None:
        with self._lock:
            reason = "error" if failed else "cancelled" if cancelled else (s or {}).get("finish_reason") or "unknown"
            self.finished[reason] += 1
            self.seconds["queue"] += queue_ms / 1000
            if s:
                for key in ("prompt_tokens", "reused_prompt_tokens", "restored_prompt_tokens", "new_tokens", "drafted_tokens",
                            "accepted_tokens", "target_calls", "accepted_prediction_tokens",
                            "rejected_prediction_tokens"):
                    self.tokens[key] += int(s.get(key) or 0)
                self.seconds["ttft"] += (s.get("ttft_ms") or 0) / 1000
                if s.get("tokens_per_second") and (s.get("new_tokens") or 0) > 1:
                    self.seconds["decode"] = self.seconds.get("decode", 0.0) + (s["new_tokens"] - 1) / s[
                        "tokens_per_second"]

    def render(self) -> str:
        lines: list[str] = []

        def metric(name, kind, help_, samples):
            lines.append(f"# HELP edgespec_{name} {help_}")
            lines.append(f"# TYPE edgespec_{name} {kind}")
            for labels, v in samples:
                lab = ",".join(f'{k}="{val}"' for k, val in labels.items())
                lines.append(f"edgespec_{name}{{{lab}}} {v}" if lab else f"edgespec_{name} {v}")

        with self._lock:
            req = sorted(self.requests.items())
            fin = sorted(self.finished.items())
            tok, sec, rejected = dict(self.tokens), dict(self.seconds), self.rejected
        g = self._gauges()
        metric("requests_total", "counter", "HTTP requests by endpoint and status.",
               [({"endpoint": e, "status": str(s)}, n) for (e, s), n in req])
        metric("rejected_requests_total", "counter", "Requests refused with 429 because the queue was full.",
               [({}, rejected)])
        metric("generations_total", "counter", "Finished generations by reason (eos, stop, length, context, "
               "cancelled: the client disconnected, error).", [({"reason": r}, n) for r, n in fin])
        for key, help_ in (("prompt_tokens", "Prompt tokens of finished generations."),
                           ("reused_prompt_tokens", "Prompt tokens reused from the KV cache (not prefilled)."),
                           ("restored_prompt_tokens", "Of the reused prompt tokens, those the prompt cache copied "
                            "back (a conversation set aside and continued)."),
                           ("new_tokens", "Generated tokens."),
                           ("drafted_tokens", "Tokens proposed by drafters."),
                           ("accepted_tokens", "Drafted tokens accepted by the target."),
                           ("target_calls", "Calls of the target model (prefill and verify)."),
                           ("accepted_prediction_tokens", "Tokens of requests' predictions (predicted outputs) that "
                            "appeared in the replies returned."),
                           ("rejected_prediction_tokens", "Tokens of requests' predictions that did not."),
                           ("tool_calls", "Tool calls returned to clients (calls of the requests' tools)."),
                           ("constrained_generations", "Generations held to a grammar (response_format, a forced or "
                            "strict tool call).")):
            metric(f"{key}_total", "counter", help_, [({}, tok.get(key, 0))])
        drafted = tok.get("drafted_tokens", 0)
        metric("acceptance_rate", "gauge", "Accepted over drafted tokens since the start.",
               [({}, round(tok.get("accepted_tokens", 0) / drafted, 6) if drafted else 0)])
        calls = tok.get("target_calls", 0)
        metric("tokens_per_target_call", "gauge", "Generated tokens per target call since the start.",
               [({}, round(tok.get("new_tokens", 0) / calls, 6) if calls else 0)])
        metric("queue_seconds_total", "counter", "Time requests waited for the engine.", [({}, round(sec["queue"], 6))])
        metric("ttft_seconds_total", "counter", "Time to the first token (prefill), summed.",
               [({}, round(sec["ttft"], 6))])
        metric("decode_seconds_total", "counter", "Decode time after the first token, summed.",
               [({}, round(sec.get("decode", 0.0), 6))])
        metric("queue_depth", "gauge", "Requests waiting for the engine.", [({}, g["queue_depth"])])
        metric("queue_capacity", "gauge", "Most requests that may wait (more get 429).", [({}, g["queue_capacity"])])
        metric("generation_running", "gauge", "1 while a generation holds the engine.", [({}, g["generation_running"])])
        metric("max_context_tokens", "gauge", "The engine's context window.", [({}, g["max_context"])])
        pc = g.get("prompt_cache")
        if pc:  # (none on a GPU target, or with --prompt-cache-mb 0)
            metric("prompt_cache_bytes", "gauge", "Host memory the prompt cache holds (set-aside conversations).",
                   [({}, pc["bytes"])])
            metric("prompt_cache_budget_bytes", "gauge", "The most the prompt cache may hold.", [({}, pc["budget"])])
            metric("prompt_cache_entries", "gauge", "Sequences the prompt cache keeps.", [({}, pc["entries"])])
            metric("prompt_cache_evictions_total", "counter", "Kept sequences dropped for room (least recently used).",
                   [({}, pc["evictions"])])
        mem = _memory()
        if "VmRSS" in mem:
            metric("resident_memory_bytes", "gauge", "Resident memory of the server process.", [({}, mem["VmRSS"])])
        if "VmHWM" in mem:
            metric("peak_resident_memory_bytes", "gauge", "Peak resident memory of the server process.",
                   [({}, mem["VmHWM"])])
        return "\n".join(lines) + "\n"


class RequestCounter:
    """ASGI middleware: counts every HTTP request by path and response status."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500

        async def counted(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counted)
        finally:
            self.metrics.request(scope.get("path", ""), status)
