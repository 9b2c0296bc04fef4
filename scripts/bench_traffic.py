#!/usr/bin/env python3
"""Repeated traffic: what a device that answers similar requests again and again gains from drafters
that remember (issue #17), then the per-category bench with no memory.

    python scripts/bench_traffic.py bundles/smollm2-int4 --out reports/traffic-smollm2

Workload, in order (chat template, greedy, every request run by each drafter one after the other):

- ``repeat-first``: the shipped prompts (edgespec/data/prompts.jsonl, first turns), asked once;
- ``repeat-again``: the same prompts asked again with light paraphrase ("Please ...", "... Thanks!");
- ``repeat-same``: and a third time word for word (a kiosk's frequent questions);
- ``code-edit``: one multi-turn session editing a small module (the history carries each reply);
- ``rag``: questions over one document set (scripts/data/kiosk_manual.md: the retrieved section
  in the prompt, the whole manual given to the engine as ``documents``), each asked twice.

Each reference output is remembered with its prompt (``SuffixDrafter.remember(out, prompt=ids)``), as
a generation records itself, so a later request that repeats a prompt recalls its answer.

Every run starts from an empty engine (``eng.reset()``: the target's and the model drafter's
caches), unless ``--keep-caches``: then requests follow one another as a server or the REPL serves
them, and a model drafter (used by ``auto`` alone) keeps the context it read for the last request,
reading only what the next prompt does not share with it (a code-edit turn extends the last; a RAG
question asked again repeats it). Prefill is not in the decoding time either way; the drafter's
reads are (they happen at its first draft).

The memory starts empty. Every drafter of a request sees the same memory: recording is off while
they run, and after each request the reference (``none``) output is added, as the engine would
have added it. ``speedup`` is tokens/s against ``none`` on the same requests in the same minutes;
``exact``: the same tokens as ``none``. Then ``run_bench`` (per category, the shipped prompts) runs
with the memory and documents cleared, so it measures first-time prompts.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import edgespec
from edgespec.bench import file_part, read_prompts, run_bench
from edgespec.errors import EdgespecError
from edgespec.measure import file_rss, high_water_rss

MANUAL = Path(__file__).resolve().parent / "data" / "kiosk_manual.md"

CODE = '''```python
def total(items):
    s = 0
    for i in range(len(items)):
        s = s + items[i]['price'] * items[i]['qty']
    return s


def discount(total, code):
    if code == 'SAVE10':
        return total * 0.9
    if code == 'HALF':
        return total * 0.5
    return total


def receipt(items, code):
    t = discount(total(items), code)
    lines = []
    for it in items:
        lines.append(it['name'] + ': ' + str(it['qty']) + ' x ' + str(it['price']))
    lines.append('Total: ' + str(t))
    return '\\n'.join(lines)
```'''

CODE_TURNS = [
    f"Here is a small module:\n\n{CODE}\n\nAdd type hints to every function. Show the whole module.",
    "Now add a one-line docstring to each function. Show the whole module again.",
    "Rename `total` to `order_total` everywhere and show the whole module.",
    "Write three pytest tests for `discount`.",
]

RAG = [  # (section title, question, paraphrase)
    ("## 6. Error codes", "What does error E202 mean and what should the operator do?",
     "The kiosk shows E202. What does it mean, and what must I do?"),
    ("## 4. Replacing the paper roll", "How do I replace the paper roll? List the steps.",
     "List the steps to put a new paper roll in the printer."),
    ("## 2. Daily checks", "What must the operator check every morning?",
     "Which three things are checked each morning?"),
    ("## 5. Payments", "Which payment methods does the kiosk accept, and can it give refunds?",
     "Can customers pay cash or get a refund at the kiosk?"),
]

PARAPHRASE = [("Please ", ""), ("", " Thanks!"), ("Hi! ", ""), ("Could you help me? ", "")]


def paraphrase(text: str, i: int) -> str:
    pre, post = PARAPHRASE[i % len(PARAPHRASE)]
    if pre == "Please " and text[:1].isupper() and not text[1:2].isupper():
        text = text[0].lower() + text[1:]
    return pre + text + post


def section(manual: str, title: str) -> str:
    start = manual.index(title)
    nxt = manual.find("\n## ", start + len(title))
    return manual[start: nxt if nxt != -1 else None].strip()


def workload(limit: int | None) -> list[tuple[str, str, list[dict] | None]]:
    """(category, id, messages); messages None: the next turn of the code-editing session."""
    prompts = read_prompts(None, limit)
    items = [("repeat-first", q["question_id"], [{"role": "user", "content": q["turns"][0]}]) for q in prompts]
    items += [("repeat-again", q["question_id"], [{"role": "user", "content": paraphrase(q["turns"][0], i)}])
              for i, q in enumerate(prompts)]
    items += [("repeat-same", q["question_id"], [{"role": "user", "content": q["turns"][0]}]) for q in prompts]
    items += [("code-edit", f"turn-{i + 1}", None) for i in range(len(CODE_TURNS))]
    manual = MANUAL.read_text(encoding="utf-8")
    for phrasing in (1, 2):
        for title, q, q2 in RAG:
            text = (f"Using only the manual section below, answer the question.\n\n{section(manual, title)}\n\n"
                    f"Question: {q if phrasing == 1 else q2}")
            items.append(("rag", f"{title.split('. ')[1].lower()}-{phrasing}", [{"role": "user", "content": text}]))
    return items


def summarize(runs: list[dict]) -> dict:
    out: dict[str, dict] = {}
    cats = list(dict.fromkeys(r["category"] for r in runs)) + ["all"]
    drafters = list(dict.fromkeys(r["drafter"] for r in runs))
    for c in cats:
        rows = [r for r in runs if c == "all" or r["category"] == c]
        out[c] = {}
        for d in drafters:
            rs = [r for r in rows if r["drafter"] == d]
            toks = sum(max(r["new_tokens"] - 1, 0) for r in rs)
            secs = sum(r["decode_s"] for r in rs)
            drafted, acc = sum(r["drafted"] for r in rs), sum(r["accepted"] for r in rs)
            out[c][d] = {"tokens_per_second": round(toks / secs, 2) if secs else 0.0,
                         "acceptance": round(acc / drafted, 3) if drafted else None,
                         "tokens_per_call": round(sum(r["new_tokens"] for r in rs) /
                                                  max(1, sum(r["target_calls"] for r in rs)), 2),
                         "exact": all(r["exact"] is not False for r in rs), "runs": len(rs),
                         "rounds_by_drafter": _sum_dicts(r["rounds_by_drafter"] for r in rs)}
        base = out[c].get("none", {}).get("tokens_per_second")
        for v in out[c].values():
            v["speedup"] = round(v["tokens_per_second"] / base, 3) if base else None
    return out


def _sum_dicts(ds) -> dict:
    out: dict = {}
    for d in ds:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def each_request(eng, limit: int | None, serve, done=None) -> None:
    """The workload's requests in order, as ``run_traffic`` and ``replay_policy.py --traffic`` run them:
    ``serve(n, total, category, id, messages, ids)`` returns the request's plain reply (its reference), which is
    remembered with its prompt (the suffix drafter records nothing itself) and, in the code-editing session, is the
    assistant's turn before the next; then ``done(n)``."""
    sfx = eng.decoder.drafters["suffix"]
    sfx.recording = False  # one reference output per request is added below
    session: list[dict] = []
    items = workload(limit)
    for n, (cat, qid, messages) in enumerate(items, 1):
        if messages is None:  # the code-editing session's next turn, after the replies before it
            session.append({"role": "user", "content": CODE_TURNS[int(qid.split("-")[1]) - 1]})
            messages = session
        ids = eng.tokenizer.encode_chat(messages)
        ref = serve(n, len(items), cat, qid, messages, ids)
        sfx.remember(ref, prompt=ids)
        if cat == "code-edit":
            session.append({"role": "assistant", "content": eng.tokenizer.decode(ref)})
        if done is not None:
            done(n)


def run_traffic(eng, drafters: list[str], max_new_tokens: int, limit: int | None, log,
                keep_caches: bool = False) -> tuple[list[dict], list]:
    sfx = eng.decoder.drafters["suffix"]
    runs, store_growth = [], []

    def serve(n, total, cat, qid, messages, ids):
        ref = None
        for d in ["none", *drafters]:
            if not keep_caches:  # every run from empty caches: the drafter reads each prompt whole
                eng.reset()
            out, st = [], None
            for _, toks, st, _ in eng.stream_ids(ids, max_new_tokens=max_new_tokens, temperature=0.0, drafter=d):
                out.extend(toks)
            if d == "none":
                ref = out
            runs.append({"category": cat, "id": qid, "drafter": d, "new_tokens": st.new_tokens,
                         "decode_s": st.decode_s, "drafted": st.drafted, "accepted": st.accepted,
                         "target_calls": st.target_calls, "rounds_by_drafter": dict(st.rounds_by_drafter),
                         "draft_s": round(st.draft_s, 4), "target_s": round(st.target_s, 4),
                         "prefill_s": round(st.prefill_ms / 1000, 4), "prompt_tokens": len(ids),
                         "drafted_by_drafter": dict(st.drafted_by_drafter),
                         "accepted_by_drafter": dict(st.accepted_by_drafter),
                         "exact": None if d == "none" else out == ref,
                         "recalled": [] if d == "none" else list(sfx.recall_scores)})
            log(f"  [{n}/{total}] {cat:12s} {qid:18s} {d:13s} {st.tokens_per_second:6.1f} tok/s "
                f"acc {st.acceptance_rate:.2f}" + ("" if d == "none" or out == ref else "  MISMATCH"))
        return ref

    def done(n):
        s = sfx.stats()
        store_growth.append((n, s["memory_tokens"], s["memory_bytes"]))

    each_request(eng, limit, serve, done)
    return runs, store_growth


def markdown(rep: dict) -> str:
    lines = [f"# Repeated traffic: {rep['bundle']}", "",
             f"{rep['settings']}", "", "| category | drafter | tok/s | speedup | acceptance | tokens/call | exact |",
             "|---|---|---|---|---|---|---|"]
    for c, per in rep["traffic"].items():
        for d, v in per.items():
            acc = "–" if v["acceptance"] is None else f"{v['acceptance']:.2f}"
            lines.append(f"| {c} | {d} | {v['tokens_per_second']:.1f} | {v['speedup']:.2f}× | {acc} | "
                         f"{v['tokens_per_call']:.2f} | {'✓' if v['exact'] else '✗'} |")
    m = rep["memory"]
    lines += ["", f"Store after the workload: {m['memory_sequences']} outputs, {m['memory_tokens']} tokens "
                  f"(cap {m['memory_cap_tokens']}), {m['memory_bytes'] / 1024:.0f} KiB in memory, "
                  f"{m.get('file_bytes', 0) / 1024:.0f} KiB on disk; documents {m['document_tokens']} tokens, "
                  f"{m['document_bytes'] / 1024:.0f} KiB. Peak resident memory {rep['peak_rss'] / 2**20:.0f} MiB"
                  f"{file_part(rep.get('file_rss'))}."]
    if rep.get("per_category"):
        lines += ["", "## Per category (shipped prompts, no memory, no documents)", "",
                  "| category | drafter | tok/s | speedup | acceptance | exact |", "|---|---|---|---|---|---|"]
        for c, per in rep["per_category"].items():
            for d, v in per.items():
                acc = "–" if v["acceptance_rate"] is None else f"{v['acceptance_rate']:.2f}"
                lines.append(f"| {c} | {d} | {v['tokens_per_second']:.1f} | {v['speedup']:.2f}× | {acc} | "
                             f"{'✓' if v['exact'] else '✗'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--drafters", default="prompt-lookup,suffix,auto")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--limit", type=int, default=None, help="only the first N shipped prompts")
    ap.add_argument("--no-per-category", action="store_true", help="skip the per-category bench")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default="reports/traffic")
    ap.add_argument("--keep-caches", action="store_true",
                    help="no engine reset between runs, as a server or the REPL runs one request after "
                         "another: a model drafter keeps the context it read last (only auto's runs use "
                         "it), so a request that extends or shares a prefix with the last reads the rest")
    args = ap.parse_args(argv)
    if args.max_new_tokens < 1 or (args.limit is not None and args.limit < 1):
        ap.error("--max-new-tokens and --limit must be positive")
    try:
        return run(args)
    except EdgespecError as e:  # a bad bundle, a context too small for the workload's prompts, ...
        print(f"error: {e}", file=sys.stderr)
        return 2


def run(args) -> int:
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]

    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "store.npz"
        eng = edgespec.load(args.bundle, model_sampling=False, threads=args.threads, memory=store, documents=[MANUAL],
                            prompt_cache_mb=0)  # (decoding as in earlier sessions: bench_prompt_cache.py has it)
        if "model" not in eng.decoder.drafters:
            drafters = [d for d in drafters if d != "model"]
        eng.reset()
        list(eng.stream_ids(eng.tokenizer.encode("Hello"), max_new_tokens=8, drafter="none"))  # warm-up
        t0 = time.perf_counter()
        runs, growth = run_traffic(eng, drafters, args.max_new_tokens, args.limit, log, args.keep_caches)
        mem = eng.memory_stats()
        mem["file_bytes"] = store.stat().st_size if store.exists() else 0
        rep = {"bundle": str(Path(args.bundle).resolve().name),
               "settings": f"greedy · max_new_tokens {args.max_new_tokens} · drafters {['none', *drafters]} · "
                           f"{'caches kept between requests' if args.keep_caches else 'caches reset every run'} · "
                           f"{len(runs)} runs · {time.perf_counter() - t0:.0f} s",
               "traffic": summarize(runs), "memory": mem, "store_growth": growth, "runs": runs}
        if not args.no_per_category:
            sfx = eng.decoder.drafters["suffix"]
            eng.clear_memory()
            sfx.clear_documents()
            report = run_bench(eng, read_prompts(None, args.limit), drafters, max_new_tokens=args.max_new_tokens,
                               log=log)
            rep["per_category"] = report.summary()
            rep["per_category_runs"] = [r.__dict__ for r in report.runs]
        rep["peak_rss"] = high_water_rss()
        rep["file_rss"] = file_rss()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(rep, indent=1), encoding="utf-8")
    md = markdown(rep)
    (out / "report.md").write_text(md, encoding="utf-8")
    print(md)
    exact = all(r["exact"] is not False for r in runs) and all(
        r.get("exact") is not False for r in rep.get("per_category_runs", []))
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
