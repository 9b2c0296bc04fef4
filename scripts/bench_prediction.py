#!/usr/bin/env python3
"""Predicted outputs: what a request's ``prediction`` buys, side by side with plain decoding, ``auto``
without it, and llama.cpp on the same GGUF and prompt ids.

    python scripts/bench_prediction.py bundles/qwen-coder-b128-v64k-xk --max-new-tokens 384 --llamacpp

Workload (scripts/data/prediction_tasks.jsonl, chat template, one request each):

- ``edit``: a file in the prompt (source code, a TOML profile, a manual with typos) and an instruction to
  change a few things and reply with the whole file; the prediction is the file as it is (what an editor
  plugin sends with OpenAI's ``prediction``);
- ``regenerate``: a request asked again ("regenerate"); the prediction is the earlier answer, sampled at
  temperature 0.7 (seed 0) before the timed runs: not in the prompt, so no other drafter sees it.

Runners, each request from an empty engine (``reset``), greedy unless ``--temperature``: ``none`` (plain
decoding), ``auto`` (no prediction), ``auto+prediction`` (the request's prediction beside the other
drafters), ``prediction`` (it alone); with ``--llamacpp`` llama.cpp's plain decoding and its n-gram
mode (which drafts from the prompt, so it sees an edit's file too). Greedy outputs are checked against
``none``'s; tokens/s is decode time after the first token, as bench_spec.py.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

TASKS = Path(__file__).resolve().parent / "data" / "prediction_tasks.jsonl"
RUNNERS = ("none", "auto", "auto+prediction", "prediction")


def request(task: dict) -> str:
    if task["kind"] == "edit":
        return f"{task['instruction']}\n\n```{task['lang']}\n{task['text']}```"
    return task["instruction"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--tasks", default=str(TASKS))
    ap.add_argument("--max-new-tokens", type=int, default=384)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--llamacpp", action="store_true", help="also llama.cpp's plain decoding and n-gram mode "
                    "(scripts/build_llamacpp.sh) on the GGUF the bundle was exported from")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="write every run's figures here")
    ap.add_argument("--only", default=None, help="task ids to run, comma-separated (default: all)")
    args = ap.parse_args(argv)
    import edgespec
    from edgespec.errors import EdgespecError

    try:
        tasks = [json.loads(line) for line in Path(args.tasks).read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as e:
        print(f"error: cannot read the tasks {args.tasks}: {e}", file=sys.stderr)
        return 2
    if args.only:
        want = set(args.only.split(","))
        tasks = [t for t in tasks if t["id"] in want]
        if not tasks:
            print(f"error: no task is called {args.only}", file=sys.stderr)
            return 2
    try:
        eng = edgespec.load(args.bundle, model_sampling=False, memory=False, prompt_cache_mb=0, threads=args.threads)
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    external, close = {}, lambda: None
    if args.llamacpp:
        from llamacpp_baseline import llamacpp_runners

        tgt = eng.manifest.sources.get("target")
        if not (tgt and str(tgt).endswith(".gguf")):
            print("error: --llamacpp needs a bundle exported from a GGUF", file=sys.stderr)
            return 2
        external, close = llamacpp_runners(tgt, None, threads=args.threads or 2, ctx=eng.max_context, ngram=True)
    eng.generate("Hello", max_new_tokens=8, drafter="auto")  # warm-up
    temp = args.temperature
    runs, mismatches = [], 0
    try:
        for t in tasks:
            ids = eng.encode([{"role": "user", "content": request(t)}])
            if t["kind"] == "edit":
                pred_text = f"```{t['lang']}\n{t['text']}```"
            else:  # the earlier answer: sampled before the timed runs
                eng.reset()
                pred_text = eng.generate([{"role": "user", "content": request(t)}], max_new_tokens=args.max_new_tokens,
                                         temperature=0.7, seed=0, drafter="none").text
            ref = None
            for name in RUNNERS:
                eng.reset()
                drafter = "auto" if name.startswith("auto") else name
                kw = {"prediction": pred_text} if "prediction" in name else {}
                out, st = [], None
                for _, toks, st, _ in eng.stream_ids(ids, max_new_tokens=args.max_new_tokens, drafter=drafter,
                                                  temperature=temp, **kw):
                    out.extend(toks)
                if name == "none":
                    ref = out
                exact = None if temp else out == ref
                mismatches += exact is False
                runs.append({"task": t["id"], "kind": t["kind"], "runner": name, "prompt_tokens": len(ids),
                             "new_tokens": st.new_tokens, "decode_s": st.decode_s, "tok_s": st.tokens_per_second,
                             "target_calls": st.target_calls, "accepted_prediction": st.accepted_by_drafter.get(
                                 "prediction", 0), "drafted_prediction": st.drafted_by_drafter.get("prediction", 0),
                             "exact": exact})
                print(f"{t['id']:14s} {name:16s} {st.tokens_per_second:6.1f} tok/s  {st.new_tokens} tokens  "
                      f"{st.new_tokens / max(st.target_calls, 1):.2f} tokens/call"
                      + ("" if exact in (None, True) else "  MISMATCH"), file=sys.stderr, flush=True)
            for name, fn in external.items():
                r = fn(list(ids), args.max_new_tokens)
                n, secs = len(r["token_ids"]), r["decode_s"]
                runs.append({"task": t["id"], "kind": t["kind"], "runner": name, "prompt_tokens": len(ids),
                             "new_tokens": n, "decode_s": secs, "tok_s": (n - 1) / secs if secs > 0 else 0.0,
                             "target_calls": r.get("target_calls", n), "exact": None})
                print(f"{t['id']:14s} {name:16s} {runs[-1]['tok_s']:6.1f} tok/s  {n} tokens", file=sys.stderr,
                      flush=True)
    finally:
        close()
    names = list(RUNNERS) + list(external)
    agg = collections.defaultdict(lambda: [0, 0.0])
    for r in runs:
        for key in (r["kind"], "all", r["task"]):
            a = agg[(key, r["runner"])]
            a[0] += r["new_tokens"] - 1
            a[1] += r["decode_s"]
    mode = f"sampled at temperature {temp}" if temp else "greedy"
    print(f"# predicted outputs: {Path(args.bundle).name}, {mode}, {args.max_new_tokens} new tokens at most, "
          f"{len(tasks)} requests\n")
    print("| requests | " + " | ".join(names) + " | auto+prediction / auto | auto+prediction / none |"
          + (" auto+prediction / llama-ar |" if "llama-ar" in names else ""))
    print("|---" * (len(names) + 3 + ("llama-ar" in names)) + "|")
    keys = [t["id"] for t in tasks] + ["edit", "regenerate", "all"]
    for key in keys:
        tps = {n: agg[(key, n)][0] / agg[(key, n)][1] for n in names if agg[(key, n)][1] > 0}
        if "none" not in tps:
            continue
        row = f"| {key} | " + " | ".join(f"{tps.get(n, 0):.1f}" for n in names)
        row += f" | {tps['auto+prediction'] / tps['auto']:.2f}x | {tps['auto+prediction'] / tps['none']:.2f}x |"
        if "llama-ar" in tps:
            row += f" {tps['auto+prediction'] / tps['llama-ar']:.2f}x |"
        print(row)
    if not temp:
        print(f"\nEvery edgespec output equal to plain decoding's: {'yes' if not mismatches else f'NO ({mismatches})'}")
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
