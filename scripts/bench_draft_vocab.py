#!/usr/bin/env python3
"""A reduced draft vocabulary (export --drafter-vocab N), measured: what N costs and saves.

    python scripts/bench_draft_vocab.py bundles/qwen-coder-d4a \\
        --reduced bundles/qwen-coder-d4a-v16k bundles/qwen-coder-d4a-v32k --out docs/bench/draft-vocab

1. Coverage and agreement, for every N of ``--sizes`` at once, on the full bundle: the target's
   greedy output on the shipped prompts (every turn, ``--max-new-tokens``), the fraction of its
   tokens inside the N ids a reduced head keeps (``select_head_ids``: special tokens, then BPE
   merge order), and the drafter's greedy agreement with the target (teacher-forced over prompt +
   output, the drafter's argmax over all tokens and over the kept N only, from the same logits).
   Agreement is the greedy acceptance rate of a one-token draft; a reduced head loses it only at
   tokens outside its set.
2. Step cost: the drafter graph of each bundle (the full one and every ``--reduced``) opened as
   the runtime opens it (one-token steps, the process-wide pool), the same one-token step timed
   ``--steps`` times after a ``--context``-token prefill, bundles taken in turn (round-robin
   blocks), median and quartiles in ms.

Writes report.json and report.md under ``--out``. Run it alone on the machine (timings).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import edgespec
from edgespec.bench import read_prompts
from edgespec.manifest import load_manifest
from edgespec.onnx_lm import OnnxLM
from edgespec.providers import choose


def corpus_ranking(tokenizer_dir: Path, paths: list[str]) -> list[int]:
    from edgespec_export.head import corpus_ranking as rank

    return rank(tokenizer_dir / "tokenizer.json", paths)


def coverage(bundle: Path, sizes: list[int], per_category: int | None, max_new: int,
             corpus: list[str] | None = None) -> dict:
    """Target outputs and teacher-forced drafter argmaxes on the shipped prompts, scored for every
    N under each ranking: merge order; a corpus's token frequencies (``corpus``); and the target's
    own outputs on the other prompts (leave one prompt out: a held-out estimate of what the target's
    output frequencies buy)."""
    from collections import Counter

    from edgespec_export.head import select_head_ids

    eng = edgespec.load(bundle, model_sampling=False, memory=False)
    m = eng.manifest
    tj = json.loads((m.tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))

    def kept(n, ranked=()):
        return select_head_ids(tj, n, eos_ids=m.eos_token_ids, bos_id=m.bos_token_id,
                               vocab_size=m.target.vocab_size, ranked=ranked)

    dlm = eng.decoder.drafters["model"].lm
    tok = eng.tokenizer
    runs = []  # (prompt index, output ids, drafter argmax rows' logits restricted later)
    for qi, q in enumerate(read_prompts(None, per_category=per_category)):
        history = []
        for turn in q["turns"]:
            history.append({"role": "user", "content": turn})
            ids = tok.encode_chat(history)
            eng.reset()
            out = [t for _, toks, _, _ in eng.stream_ids(ids, max_new_tokens=max_new, drafter="none") for t in toks]
            seq = list(ids) + out  # teacher-forced drafter over prompt + output: row i predicts token i + 1
            dlm.reset()
            rows = [dlm.forward(seq[s: s + 128]) for s in range(0, len(seq) - 1, 128)]
            logits = np.concatenate(rows)[len(ids) - 1: len(seq) - 1, : m.target.vocab_size]
            runs.append((qi, np.asarray(out), logits))
            history.append({"role": "assistant", "content": tok.decode(out)})
            print(f"  {q['question_id']}: {len(out)} tokens", file=sys.stderr, flush=True)
    dlm.reset()
    rankings = {"merge order": lambda qi: ()}
    if corpus:
        ranked = corpus_ranking(m.tokenizer_dir, corpus)
        rankings["corpus"] = lambda qi: ranked
    counts = {qi: Counter(out.tolist()) for qi, out, _ in runs}

    def held_out(qi):
        c = Counter()
        for other, cnt in counts.items():
            if other != qi:
                c.update(cnt)
        return [t for t, _ in c.most_common()]
    rankings["target outputs (other prompts)"] = held_out
    allout = np.concatenate([out for _, out, _ in runs])
    total = int(allout.size)
    agree_full = sum(int((np.argmax(lg, axis=1) == out).sum()) for _, out, lg in runs)
    res = {}
    for name, fn in rankings.items():
        res[name] = {}
        for n in sizes:
            inside = agree = 0
            for qi, out, lg in runs:
                k = kept(n, fn(qi))
                inside += int(np.isin(out, k).sum())
                agree += int((k[np.argmax(lg[:, k], axis=1)] == out).sum())
            res[name][str(n)] = {"coverage": inside / total, "agreement": agree / total}
    return {"tokens": total, "distinct": int(np.unique(allout).size), "max_new_tokens": max_new,
            "agreement_full": agree_full / total, "corpus": corpus or [], "rankings": res}


def step_costs(bundles: list[Path], steps: int, context: int, block: int = 25) -> dict:
    lms = {}
    for b in bundles:
        m = load_manifest(b)
        lm = OnnxLM(m.drafter, context + 8, choose(["cpu"]), min_width=1)
        rng = np.random.default_rng(0)
        lm.prefill(rng.integers(100, 20000, size=context).tolist())
        for _ in range(10):  # warm-up
            lm.forward([1234])
            lm.rewind(1)
        lms[b] = lm
    times = {b: [] for b in bundles}
    while min(len(t) for t in times.values()) < steps:
        for b, lm in lms.items():
            for i in range(block):
                t0 = time.perf_counter()
                lm.forward([1000 + i])
                times[b].append(time.perf_counter() - t0)
                lm.rewind(1)
    out = {}
    for b, ts in times.items():
        ms = sorted(1000 * t for t in ts)
        q = statistics.quantiles(ms, n=4)
        spec = lms[b].spec
        out[b.name] = {"head": spec.head_size or spec.vocab_size, "median_ms": statistics.median(ms),
                       "q1_ms": q[0], "q3_ms": q[2], "steps": len(ms),
                       "drafter_mib_on_disk": spec.bytes_on_disk / (1 << 20)}
    return out


def markdown(rep: dict) -> str:
    lines = []
    c = rep.get("coverage")
    if c:
        lines += [f"Target greedy output on the shipped prompts: {c['tokens']} tokens ({c['distinct']} distinct), "
                  f"up to {c['max_new_tokens']} per turn. Drafter greedy agreement with the full head: "
                  f"{c['agreement_full']:.3f}." + (f" Corpus: {', '.join(c['corpus'])}." if c["corpus"] else ""), "",
                  "| ranking | N kept | target tokens inside | drafter agreement |", "|---|---:|---:|---:|"]
        for name, sizes in c["rankings"].items():
            for n, v in sizes.items():
                lines.append(f"| {name} | {n} | {v['coverage']:.4f} | {v['agreement']:.3f} |")
        lines.append("")
    s = rep.get("steps")
    if s:
        lines += ["| drafter | head | step median ms | q1 | q3 | MiB on disk |", "|---|---:|---:|---:|---:|---:|"]
        for name, v in s.items():
            lines.append(f"| {name} | {v['head']} | {v['median_ms']:.2f} | {v['q1_ms']:.2f} | {v['q3_ms']:.2f} | "
                         f"{v['drafter_mib_on_disk']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", help="the bundle with the full drafter head")
    ap.add_argument("--reduced", nargs="*", default=[], help="bundles with reduced heads (step cost)")
    ap.add_argument("--sizes", default="8192,16384,32768,65536")
    ap.add_argument("--per-category", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--no-coverage", action="store_true")
    ap.add_argument("--no-steps", action="store_true")
    ap.add_argument("--corpus", nargs="*", default=[], help="text files/directories for the corpus ranking")
    ap.add_argument("--out", default="reports/draft-vocab")
    args = ap.parse_args(argv)
    full = Path(args.bundle)
    rep = {"bundle": str(full), "command": " ".join(sys.argv)}
    if not args.no_coverage:
        rep["coverage"] = coverage(full, [int(x) for x in args.sizes.split(",")], args.per_category,
                                   args.max_new_tokens, args.corpus)
    if not args.no_steps:
        rep["steps"] = step_costs([full] + [Path(b) for b in args.reduced], args.steps, args.context)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(rep, indent=1))
    md = markdown(rep)
    (out / "report.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
