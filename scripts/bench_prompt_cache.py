#!/usr/bin/env python3
"""Conversations that take turns, with and without the prompt cache (edgespec/prompt_cache.py).

Several chats over long documents (``scripts/data/long_prompts.jsonl``: code, summaries, questions
over documents), served one request at a time in turns: every conversation's first turn, then every
one's second, ... as a server sees several clients (or one client's side requests: a title, tags).
Without a prompt cache each turn finds the KV cache holding another conversation and prefills its
whole history again; with one, the history's rows are copied back and only the new message is
prefilled. One process, one engine, the passes alternating (off, on, off, on, ...: this VM's speed
drifts); greedy, so each request's reply must be the same in both (checked: ``same replies``).

    python scripts/bench_prompt_cache.py bundles/qwen-coder-b128-v64k-xk --conversations 3 --turns 3 [--restart]

``--restart`` then times a chat's next turn in a new engine that reads a prompt cache file the last
one wrote, against a new engine without it. Prints per pass the time to first token of first turns and of later turns, the total, the tokens
restored; ``--json`` writes them. Exit 2 on a bad argument or bundle, 1 if replies differ.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

FOLLOW_UPS = ["Now say that in two sentences.", "What is the single most important point, in a few words?",
              "List two follow-up questions a reader might ask.", "Thanks. Anything else worth noting?"]


def conversations(path: Path, n: int) -> list[str]:
    docs = [json.loads(line)["turns"][0] for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    # one of each category first (code, summarization, rag), then the rest
    order = docs[0::2] + docs[1::2]
    return order[:n]


def run_pass(eng, docs: list[str], turns: int, max_new: int, drafter: str) -> list[dict]:
    """Every conversation's turn 1, then every one's turn 2, ...; a record per request."""
    from edgespec.errors import ContextOverflowError

    history = [[{"role": "user", "content": d}] for d in docs]
    out = []
    for t in range(turns):
        for i, msgs in enumerate(history):
            if msgs is None:
                continue
            if t:
                msgs.append({"role": "user", "content": FOLLOW_UPS[(t - 1) % len(FOLLOW_UPS)]})
            t0 = time.perf_counter()
            try:
                r = eng.generate(msgs, max_new_tokens=max_new, temperature=0.0, drafter=drafter)
            except ContextOverflowError:
                history[i] = None  # this conversation outgrew the context: it ends here
                continue
            wall = time.perf_counter() - t0
            msgs.append({"role": "assistant", "content": r.text})
            s = r.stats
            out.append({"conversation": i, "turn": t + 1, "prompt_tokens": s["prompt_tokens"],
                        "reused": s["reused_prompt_tokens"], "restored": s["restored_prompt_tokens"],
                        "ttft_s": s["ttft_ms"] / 1000, "total_s": wall, "tokens": r.token_ids})
    return out


def summary(recs: list[dict]) -> dict:
    first = [r["ttft_s"] for r in recs if r["turn"] == 1]
    later = [r["ttft_s"] for r in recs if r["turn"] > 1]
    return {"requests": len(recs), "ttft_first_s": statistics.mean(first) if first else None,
            "ttft_later_s": statistics.mean(later) if later else None,
            "prompt_tokens_later": statistics.mean(r["prompt_tokens"] for r in recs if r["turn"] > 1) if later else None,
            "restored_tokens": sum(r["restored"] for r in recs), "total_s": sum(r["total_s"] for r in recs)}


def after_restart(args, doc: str) -> dict:
    """A conversation's first turn in one engine with a prompt cache file, then the engine closed (the
    file written) and a new one loaded with the file: its second turn's time to first token, against
    a new engine without the file (file, none, none, file: this VM drifts; the file is read from the
    page cache, so a cold restart's load may take longer)."""
    import tempfile

    import edgespec

    kw = dict(max_new_tokens=args.max_new_tokens, temperature=0.0, drafter=args.drafter)
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "prompt-cache.npz"
        msgs = [{"role": "user", "content": doc}]
        with edgespec.load(args.bundle, model_sampling=False, memory=False, prompt_cache_mb=args.prompt_cache_mb, prompt_cache_file=f) as e:
            msgs += [{"role": "assistant", "content": e.generate(msgs, **kw).text},
                     {"role": "user", "content": FOLLOW_UPS[0]}]
        size = f.stat().st_size  # (the chat kept from the live cache at close)
        kept = f.read_bytes()
        out = {}
        for run, mode in enumerate(("file", "none", "none", "file")):
            mode = f"{mode}{run // 2 + 1}"
            t0 = time.perf_counter()
            with edgespec.load(args.bundle, model_sampling=False, memory=False, prompt_cache_mb=args.prompt_cache_mb,
                               prompt_cache_file=f if mode.startswith("file") else None) as e:
                load_s = time.perf_counter() - t0
                r = e.generate(msgs, **kw)
            if mode.startswith("file"):  # (closing wrote the longer chat: the next run reads the same file)
                f.write_bytes(kept)
            out[mode] = {"load_s": load_s, "ttft_s": r.stats["ttft_ms"] / 1000,
                         "restored": r.stats["restored_prompt_tokens"], "tokens": r.token_ids}
            print(f"after a restart, {'with' if mode.startswith('file') else 'without'} the prompt cache file"
                  + (f" ({size / 2**20:.0f} MiB)" if mode.startswith("file") else "")
                  + f": load {load_s:.2f} s, the second turn's TTFT {out[mode]['ttft_s']:.2f} s "
                  f"({out[mode]['restored']} of {r.stats['prompt_tokens']} prompt tokens restored)", flush=True)
    toks = [v["tokens"] for v in out.values()]
    return {"file_bytes": size, **out, "same": all(t == toks[0] for t in toks)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--conversations", type=int, default=3)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--passes", type=int, default=2, help="off/on pairs")
    ap.add_argument("--drafter", default="auto")
    ap.add_argument("--prompt-cache-mb", type=int, default=None, help="the 'on' passes' budget (default: the plan's)")
    ap.add_argument("--prompts", default=str(Path(__file__).resolve().parent / "data" / "long_prompts.jsonl"))
    ap.add_argument("--json", default=None, help="write the records and summaries here")
    ap.add_argument("--restart", action="store_true",
                    help="then a chat's next turn after a restart, with and without a prompt cache file")
    args = ap.parse_args(argv)
    if min(args.conversations, args.turns, args.max_new_tokens, args.passes) < 1:
        ap.error("--conversations, --turns, --max-new-tokens and --passes must be >= 1")
    if args.prompt_cache_mb is not None and args.prompt_cache_mb < 1:
        ap.error("--prompt-cache-mb must be >= 1 (the 'off' passes run without one)")
    import edgespec
    from edgespec.errors import EdgespecError
    from edgespec.prompt_cache import PromptCache

    try:
        docs = conversations(Path(args.prompts), args.conversations)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: cannot read {args.prompts}: {e}", file=sys.stderr)
        return 2
    if not docs:
        print(f"error: {args.prompts} has no prompts", file=sys.stderr)
        return 2
    try:
        eng = edgespec.load(args.bundle, model_sampling=False, memory=False, prompt_cache_mb=args.prompt_cache_mb)
        eng.config(drafter=args.drafter)
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    target = eng.decoder.target
    budget = eng.plan.prompt_cache
    if not budget or not target.cache.host:
        print("error: this engine has no prompt cache (a GPU target, or the plan left no memory for one)",
              file=sys.stderr)
        return 2
    print(f"{Path(args.bundle).name}: {len(docs)} conversations x {args.turns} turns, {args.max_new_tokens} new "
          f"tokens, drafter {args.drafter}, prompt cache {budget / 2**20:.0f} MiB, context {eng.max_context}")
    results = {"off": [], "on": []}
    for p in range(args.passes):
        for mode in ("off", "on"):
            eng.reset()
            target.prompt_cache = PromptCache(budget) if mode == "on" else None
            recs = run_pass(eng, docs, args.turns, args.max_new_tokens, args.drafter)
            s = summary(recs)
            results[mode].append({"records": recs, "summary": s,
                                  "cache": target.prompt_cache.stats() if target.prompt_cache else None})
            later = f"{s['ttft_later_s']:.2f} s" if s["ttft_later_s"] is not None else "-"
            print(f"pass {p + 1} prompt cache {mode:3s}: TTFT first turns {s['ttft_first_s']:.2f} s, later turns "
                  f"{later} (~{s['prompt_tokens_later'] or 0:.0f} prompt tokens, {s['restored_tokens']} restored "
                  f"in all); {s['requests']} requests in {s['total_s']:.1f} s", flush=True)
    same = all([r["tokens"] for r in a["records"]] == [r["tokens"] for r in b["records"]]
               for a, b in zip(results["off"], results["on"]))
    print(f"same replies with and without the prompt cache: {'yes' if same else 'NO'}")
    restart = None
    if args.restart:
        eng.close()
        try:
            restart = after_restart(args, docs[0])
        except EdgespecError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        same = same and restart["same"]
    if args.json:
        Path(args.json).write_text(json.dumps({"bundle": args.bundle, "args": vars(args), "same": same,
                                               "budget": budget, "results": results, "restart": restart}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
