#!/usr/bin/env python3
"""Structured outputs: JSON replies held to a schema (response_format json_schema), per drafter, greedy,
side by side with the same requests unconstrained; every constrained reply is checked to parse and to be
the same under every drafter.

    python scripts/bench_structured.py bundles/qwen-coder-b128-v64k-xk --reps 2 --llamacpp

Workload: scripts/data/structured_tasks.jsonl (extraction from a text in the prompt, a classification, a
configuration and a recipe written from a description). Each request runs from an empty engine
(``reset``); figures are decode tokens/s after the first token (as bench_spec.py) and tokens per target
call. Runs alternate within a rep, so drift hits them alike.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TASKS = Path(__file__).resolve().parent / "data" / "structured_tasks.jsonl"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--drafters", default="none,prompt-lookup,model,auto")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=400)
    ap.add_argument("--temperature", type=float, default=0.0, help="sampled runs (seeded alike per request and "
                    "rep; replies then differ by drafter and are not compared)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="write every run's figures here")
    ap.add_argument("--llamacpp", action="store_true", help="also llama.cpp (scripts/build_llamacpp.sh) on the GGUF "
                    "the bundle was exported from, plain and n-gram, with the same schema (its json_schema) and "
                    "without, on the same prompt ids")
    args = ap.parse_args(argv)
    import edgespec
    from edgespec.errors import EdgespecError

    tasks = [json.loads(line) for line in TASKS.read_text().splitlines() if line.strip()]
    drafters = [d for d in args.drafters.split(",") if d]
    try:
        eng = edgespec.load(args.bundle, model_sampling=False, threads=args.threads, memory=False)
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    servers = {}
    if args.llamacpp and args.temperature:
        print("error: --llamacpp runs greedy only (its samplers are not edgespec's)", file=sys.stderr)
        return 2
    if args.llamacpp:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from llamacpp_baseline import plain_and_ngram

        try:
            servers = plain_and_ngram(eng, args.threads)
        except (ValueError, OSError, RuntimeError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    runs, ref, ok = [], {}, True
    from edgespec.constrain import grammar_for

    # llguidance's tokenizer (~1 s), built before the timed runs; not a generation, which would teach the round
    # policy a 2-token reply (and keep the model drafter's first read out of the next requests)
    eng.decoder.constraints(grammar_for({"type": "json_object"}))
    for rep in range(args.reps):
        for t in tasks:
            msgs = [{"role": "user", "content": t["prompt"]}]
            if len(eng.encode(msgs)) + 8 > eng.max_context:
                print(f"{t['id']}: skipped, its prompt does not fit the context ({eng.max_context})", file=sys.stderr)
                continue
            fmt = {"type": "json_schema", "json_schema": {"name": t["id"], "schema": t["schema"]}}
            for d in drafters:
                for constrained in (True, False):
                    eng.reset()
                    r = eng.generate(msgs, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                     seed=rep, drafter=d, **({"response_format": fmt} if constrained else {}))
                    s = r.stats
                    same = ref.setdefault((t["id"], constrained), r.token_ids) == r.token_ids or bool(args.temperature)
                    valid = None
                    if constrained:
                        try:
                            json.loads(r.text)
                            valid = r.finish_reason == "eos"
                        except ValueError:
                            valid = False
                    ok &= same  # (a reply cut by --max-new-tokens is not valid JSON: counted, not failed)
                    runs.append({"rep": rep, "task": t["id"], "drafter": d, "constrained": constrained,
                                 "new_tokens": s["new_tokens"], "target_calls": s["target_calls"],
                                 "decode_s": max(s["total_s"] - s["prefill_ms"] / 1000.0, 1e-9), "same": same,
                                 "valid": valid, "text": r.text})
            ids = eng.encode(msgs)
            for name, srv in servers.items():
                for constrained in (True, False):
                    out = srv.complete(ids, args.max_new_tokens, **({"json_schema": t["schema"]} if constrained else {}))
                    tm = out.get("timings", {})
                    n = int(tm.get("predicted_n", len(out.get("tokens") or [])))
                    valid = None
                    if constrained:
                        try:
                            json.loads(out.get("content", ""))
                            valid = True
                        except ValueError:
                            valid = False
                    runs.append({"rep": rep, "task": t["id"], "drafter": name, "constrained": constrained,
                                 "new_tokens": n, "target_calls": n, "same": True, "valid": valid,
                                 "decode_s": max(float(tm.get("predicted_ms", 0.0)) / 1000.0, 1e-9),
                                 "text": out.get("content", "")})
    for srv in servers.values():
        srv.close()
    drafters = drafters + list(servers)
    how = f"sampled at T = {args.temperature:g}" if args.temperature else "greedy"
    print(f"{Path(args.bundle).name}, {how}, {args.reps} rep(s), {len(tasks)} requests\n")
    print("| drafter | held to the schema: tokens/s | x plain | tokens per target call | unconstrained: tokens/s "
          "| x plain | equal to plain / valid JSON |")
    print("|---|---|---|---|---|---|---|")

    def rate(d, c):
        rs = [r for r in runs if r["drafter"] == d and r["constrained"] == c]
        return sum(r["new_tokens"] - 1 for r in rs) / max(1e-9, sum(r["decode_s"] for r in rs)), rs
    base = {c: rate(drafters[0], c)[0] for c in (True, False)}
    for d in drafters:
        (tc, rc), (tu, _) = rate(d, True), rate(d, False)
        per = sum(r["new_tokens"] for r in rc) / max(1, sum(r["target_calls"] for r in rc))
        print(f"| {d} | {tc:.1f} | {tc / base[True]:.2f}x | {per:.2f} | {tu:.1f} | {tu / base[False]:.2f}x | "
              f"{sum(r['same'] for r in rc)}/{len(rc)}, {sum(bool(r['valid']) for r in rc)}/{len(rc)} |")
    print("\n| request | tokens (held / free) | the reply held to the schema, plain decoding |\n|---|---|---|")
    for t in tasks:
        if not any(r["task"] == t["id"] for r in runs):
            continue  # (skipped: too long for the context)
        a = next(r for r in runs if r["task"] == t["id"] and r["drafter"] == drafters[0] and r["constrained"])
        b = next(r for r in runs if r["task"] == t["id"] and r["drafter"] == drafters[0] and not r["constrained"])
        text = " ".join(a["text"].split())[:110].replace("|", "\\|")
        print(f"| {t['id']} | {a['new_tokens']} / {b['new_tokens']} | `{text}` |")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
