#!/usr/bin/env python3
"""Code completion in an editor: fill-in-the-middle requests (the code before the cursor, the code after
it, the reply the missing lines), per drafter, greedy, every reply checked against plain decoding's.

    python scripts/bench_infill.py bundles/qwen-coder-b128-v64k-xk --reps 2
    python scripts/bench_infill.py --make-cases edgespec/*.py --out scripts/data/infill_cases.jsonl

Workload: scripts/data/infill_cases.jsonl, gaps cut from Python files written after the models were
trained (``--make-cases``: a gap of 1-3 lines, from the line's start after its indentation or from inside
it; up to 40 lines before it and 20 after it, as editors' completion plugins send). Each request runs
from an empty engine (``reset``), so its prompt is prefilled every time, as an edit elsewhere in the file
would make it. The figures are the reply's latency (prefill included: what the editor waits for),
decode tokens/s after the first token, target calls, and how often the reply equals the lines cut out
(the model's quality at filling, the same under every drafter). Drafters alternate within a rep, so
drift hits them alike.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CASES = Path(__file__).resolve().parent / "data" / "infill_cases.jsonl"


def make_cases(files: list[str], n: int, seed: int, before: int = 40, after: int = 20) -> list[dict]:
    """``n`` gaps cut from ``files`` (deterministic for a seed): a gap ends at the end of a line and starts
    at its first line's indentation or inside that line (half each); blank lines and comments are skipped."""
    rng = random.Random(seed)
    sources = [(f, Path(f).read_text(encoding="utf-8").splitlines(keepends=True)) for f in sorted(files)]
    sources = [(f, lines) for f, lines in sources if len(lines) > before + after]
    if not sources:
        raise SystemExit(f"error: no file of more than {before + after} lines among {len(files)}")
    cases, seen = [], set()
    while len(cases) < n:
        f, lines = rng.choice(sources)
        i, g = rng.randrange(5, len(lines) - 3), rng.choice((1, 1, 2, 3))
        first = lines[i]
        body = first.strip()
        if (f, i) in seen or not body or body.startswith(("#", '"""', "'''")) or len(body) < 8:
            continue
        seen.add((f, i))
        indent = len(first) - len(first.lstrip())
        cut = indent if rng.random() < 0.5 else indent + rng.randrange(1, len(body) - 3)
        prefix = "".join(lines[max(0, i - before):i]) + first[:cut]
        middle = first[cut:] + "".join(lines[i + 1:i + g])
        middle = middle[:-1] if middle.endswith("\n") else middle  # (the line break goes to the suffix)
        suffix = "\n" + "".join(lines[i + g:i + g + after])
        cases.append({"id": f"{Path(f).name}:{i + 1}", "prefix": prefix, "suffix": suffix, "middle": middle})
    return cases


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", nargs="?")
    ap.add_argument("--cases", default=str(CASES), help="a JSONL file of {id, prefix, suffix, middle}")
    ap.add_argument("--drafters", default="none,prompt-lookup,suffix,model,auto")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="the first N cases only")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="write every run's figures here")
    ap.add_argument("--typing", action="store_true", help="after each request, another with half the gap's first "
                    "line typed, on the engine's cache (an editor asking again as the user types)")
    ap.add_argument("--llamacpp", action="store_true", help="also llama.cpp (scripts/build_llamacpp.sh) on the GGUF "
                    "the bundle was exported from, plain and with n-gram speculation, on the same prompt ids")
    ap.add_argument("--make-cases", nargs="+", metavar="FILE", help="cut gaps from these files into --out")
    ap.add_argument("--out", default=None)
    ap.add_argument("--n", type=int, default=24, help="--make-cases: how many")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--report", metavar="RUNS_JSON", help="print the report of a --json file of an earlier run")
    args = ap.parse_args(argv)
    if args.report:
        runs = json.loads(Path(args.report).read_text(encoding="utf-8"))
        cases = {c["id"]: c for c in map(json.loads, Path(args.cases).read_text(encoding="utf-8").splitlines())}
        for r in (r for r in runs if not r.get("typed")):  # (figures added since that run, from its texts)
            r.setdefault("first_line", first_line(r["text"]) == first_line(cases[r["case"]]["middle"]))
        drafters = list(dict.fromkeys(r["drafter"] for r in runs))
        print(report(runs, drafters, args.bundle or Path(args.report).stem, 1 + max(r["rep"] for r in runs),
                     len({r["case"] for r in runs})))
        return 0
    if args.make_cases:
        if not args.out:
            ap.error("--make-cases needs --out")
        cases = make_cases(args.make_cases, args.n, args.seed)
        Path(args.out).write_text("".join(json.dumps(c) + "\n" for c in cases), encoding="utf-8")
        print(f"{len(cases)} cases -> {args.out}")
        return 0
    if not args.bundle:
        ap.error("give a bundle (or --make-cases)")
    if args.reps < 1 or args.max_new_tokens < 1:
        ap.error("--reps and --max-new-tokens must be >= 1")
    import edgespec
    from edgespec.errors import EdgespecError

    try:
        cases = [json.loads(line) for line in Path(args.cases).read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        print(f"error: cannot read the cases {args.cases}: {e}", file=sys.stderr)
        return 2
    cases = cases[:args.limit]
    drafters = [d for d in args.drafters.split(",") if d]
    try:
        eng = edgespec.load(args.bundle, model_sampling=False, threads=args.threads, memory=False)
        eng.infill_stops()  # a model without FIM tokens: refused before any run
        for d in drafters:
            eng.config(drafter=d)
    except EdgespecError as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    servers = {}
    if args.llamacpp:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from llamacpp_baseline import plain_and_ngram

        try:
            servers = plain_and_ngram(eng, args.threads)
        except (ValueError, OSError, RuntimeError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    eng.generate(cases[0]["prefix"], suffix=cases[0]["suffix"], max_new_tokens=4, temperature=0)  # warm-up
    runs, ref = [], {}
    for rep in range(args.reps):
        for c in cases:
            for d in drafters:
                eng.reset()
                r = eng.generate(c["prefix"], suffix=c["suffix"], max_new_tokens=args.max_new_tokens, temperature=0,
                                 drafter=d)
                s = r.stats
                same = ref.setdefault(c["id"], r.token_ids) == r.token_ids
                runs.append({"rep": rep, "case": c["id"], "drafter": d, "new_tokens": s["new_tokens"],
                             "prompt_tokens": s["prompt_tokens"], "total_s": s["total_s"],
                             "decode_s": max(s["total_s"] - s["prefill_ms"] / 1000.0, 1e-9),
                             "target_calls": s["target_calls"], "same": same, "finish_reason": r.finish_reason,
                             "exact": r.text.strip() == c["middle"].strip(),
                             "first_line": first_line(r.text) == first_line(c["middle"]), "text": r.text})
                if not same:
                    print(f"MISMATCH: {c['id']} {d} differs from plain decoding", file=sys.stderr)
                if args.typing:  # the user types on: half the gap's first line, and the editor asks again
                    typed = c["middle"].split("\n", 1)[0]
                    typed = typed[: max(1, len(typed) // 2)]
                    r = eng.generate(c["prefix"] + typed, suffix=c["suffix"], max_new_tokens=args.max_new_tokens,
                                     temperature=0, drafter=d)
                    s = r.stats
                    same = ref.setdefault((c["id"], "typed"), r.token_ids) == r.token_ids
                    runs.append({"rep": rep, "case": c["id"], "drafter": d, "typed": True,
                                 "new_tokens": s["new_tokens"], "prompt_tokens": s["prompt_tokens"],
                                 "reused": s["reused_prompt_tokens"], "prefill_ms": s["prefill_ms"],
                                 "total_s": s["total_s"], "decode_s": max(s["total_s"] - s["prefill_ms"] / 1000.0, 1e-9),
                                 "target_calls": s["target_calls"], "same": same, "finish_reason": r.finish_reason})
                    if not same:
                        print(f"MISMATCH: {c['id']} {d} (typed on) differs from plain decoding", file=sys.stderr)
            ids = eng.encode(c["prefix"], suffix=c["suffix"])
            for name, srv in servers.items():  # llama.cpp stops at its own end-of-generation tokens (FIM's too)
                out = srv.complete(ids, args.max_new_tokens)
                tm, text = out.get("timings", {}), out.get("content", "")
                n = int(tm.get("predicted_n", len(out.get("tokens") or [])))
                same = ref.setdefault((c["id"], "llama"), out.get("tokens")) == out.get("tokens")
                runs.append({"rep": rep, "case": c["id"], "drafter": name, "new_tokens": n,
                             "prompt_tokens": len(ids), "target_calls": n,
                             "total_s": (float(tm.get("prompt_ms", 0.0)) + float(tm.get("predicted_ms", 0.0))) / 1000,
                             "decode_s": max(float(tm.get("predicted_ms", 0.0)) / 1000.0, 1e-9), "same": same,
                             "finish_reason": "length" if n >= args.max_new_tokens else "eos",
                             "exact": text.strip() == c["middle"].strip(),
                             "first_line": first_line(text) == first_line(c["middle"]), "text": text})
    for srv in servers.values():
        srv.close()
    drafters += list(servers)
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1), encoding="utf-8")
    print(report(runs, drafters, Path(args.bundle).name, args.reps, len(cases)))
    return 0 if all(r["same"] for r in runs) else 1  # (llama.cpp's n-gram runs: against its own plain ones)


def first_line(text: str) -> str:
    """What an editor shows first: the first line of a completion, its ends' whitespace ignored."""
    return text.split("\n", 1)[0].strip()


def report(runs: list[dict], drafters: list[str], name: str, reps: int, n: int) -> str:
    """The table: per runner, mean latency (prefill and decode), decode tokens/s against the first runner's,
    tokens per target call, replies equal to plain decoding's (llama.cpp's: to its own plain decoding's),
    and replies whose first line is the first line cut out."""
    typed = [r for r in runs if r.get("typed")]
    runs = [r for r in runs if not r.get("typed")]
    base = drafters[0]
    first = [r for r in runs if r["drafter"] == base]
    out = [f"{name}, greedy, {reps} rep(s), {n} gaps; prompt {statistics.mean(r['prompt_tokens'] for r in first):.0f} "
           f"tokens and reply {statistics.mean(r['new_tokens'] for r in first):.1f} tokens on average; "
           f"{sum(r['exact'] for r in first) / len(first):.0%} of replies equal the lines cut out, "
           f"{sum(r['first_line'] for r in first) / len(first):.0%} their first line; "
           f"{sum(r['finish_reason'] == 'eos' for r in first) / len(first):.0%} end on their own\n",
           f"| runner | latency, mean | decode tok/s | / {base} | tokens per target call | equal to plain decoding "
           f"| first line right |", "|---|---|---|---|---|---|---|"]
    tps = {}
    for d in drafters:
        rs = [r for r in runs if r["drafter"] == d]
        tps[d] = sum(r["new_tokens"] - 1 for r in rs) / sum(r["decode_s"] for r in rs)
        per_call = sum(r["new_tokens"] for r in rs) / sum(r["target_calls"] for r in rs)
        out.append(f"| {d} | {statistics.mean(r['total_s'] for r in rs) * 1000:.0f} ms | {tps[d]:.1f} | "
                   f"{tps[d] / tps[base]:.2f}x | {per_call:.2f} | {sum(r['same'] for r in rs)}/{len(rs)} | "
                   f"{sum(r['first_line'] for r in rs)}/{len(rs)} |")
    if typed:
        out += ["", "Typed on (half the gap's first line, then the same request again, on the engine's cache):", "",
                "| runner | latency, mean | prefill, mean | prompt tokens reused | decode tok/s | equal to plain decoding |",
                "|---|---|---|---|---|---|"]
        for d in drafters:
            rs = [r for r in typed if r["drafter"] == d]
            if rs:
                out.append(f"| {d} | {statistics.mean(r['total_s'] for r in rs) * 1000:.0f} ms | "
                           f"{statistics.mean(r['prefill_ms'] for r in rs):.0f} ms | "
                           f"{sum(r['reused'] for r in rs) / sum(r['prompt_tokens'] for r in rs):.0%} | "
                           f"{sum(r['new_tokens'] - 1 for r in rs) / sum(r['decode_s'] for r in rs):.1f} | "
                           f"{sum(r['same'] for r in rs)}/{len(rs)} |")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
