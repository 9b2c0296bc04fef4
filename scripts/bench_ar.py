#!/usr/bin/env python3
"""Autoregressive decoding, side by side in one run: edgespec vs onnxruntime-genai's own generator
on the same graph, plus edgespec's time per token spent outside ``session.run``.

    python scripts/bench_ar.py bundles/smollm2-int4 [bundles/qwen-int4 ...] --tokens 128 --reps 3

Runs are interleaved (edgespec, genai, edgespec, ...) with the same prompt ids; the median of
``--reps`` runs is reported. For INT4 accuracy-level-4 graphs edgespec's exact mode runs every
target call with two tokens (docs/how-it-works.md, "Exactness"); ``1-token`` is the same loop with that policy
off (the arithmetic the kernel uses for one token), shown to price the policy. The sampled column
runs the exact mode at ``--temperature``/``--top-p``; "outside session.run" is the share of decode
time spent anywhere but the target's session.run (logit processing, sampling, bookkeeping).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import edgespec  # noqa: E402
from genai_baseline import genai_autoregressive  # noqa: E402
from one_line_errors import one_line_errors  # noqa: E402

PROMPT = "Write a Python function that parses a CSV line into a list of fields, handling quoted fields."


def edgespec_run(eng, ids, n, **sampling):
    """One autoregressive run (greedy unless ``sampling`` says otherwise); returns (tokens, stats)."""
    eng.reset()
    out, st = [], None
    for _, toks, st, _ in eng.stream_ids(ids, max_new_tokens=n, drafter="none", ignore_eos=True, **sampling):
        out.extend(toks)
    return out, st


@one_line_errors
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundles", nargs="+")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--temperature", type=float, default=0.7, help="for the sampled column")
    ap.add_argument("--top-p", type=float, default=0.8, help="for the sampled column")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.tokens < 2:
        ap.error(f"--reps must be >= 1 and --tokens >= 2, got {args.reps} and {args.tokens}")
    sampled = {"temperature": args.temperature, "top_p": args.top_p}
    import onnxruntime

    from edgespec.native import cpu_supported, isa
    print(f"onnxruntime {onnxruntime.__version__}; edgespec's INT4 kernel (exact-kernels bundles): "
          f"{cpu_supported() or isa() + ' path'}")
    print(f"| bundle | edgespec exact tok/s | edgespec 1-token tok/s | genai tok/s | edgespec/genai | "
          f"outside session.run (greedy) | sampled T={args.temperature} top-p={args.top_p} tok/s | "
          f"outside session.run (sampled) | same tokens as genai |")
    print("|---|---|---|---|---|---|---|---|---|")
    for b in args.bundles:
        eng = edgespec.load(b, model_sampling=False, use_drafter=False, threads=args.threads, prompt_cache_mb=0)
        one_token = edgespec.load(b, model_sampling=False, use_drafter=False, threads=args.threads, min_width=1,  # the policy off
                                  prompt_cache_mb=0)
        ids = eng.encode([{"role": "user", "content": PROMPT}]) if eng.manifest.chat_template else eng.encode(PROMPT)
        # onnxruntime-genai runs the bundle's own graph; an exact-kernels bundle uses edgespec's operator
        genai = eng.manifest.target.kernels == "onnxruntime" and (eng.manifest.target.path.parent
                                                                  / "genai_config.json").exists()
        # warm-up both
        edgespec_run(eng, ids, 8)
        edgespec_run(one_token, ids, 8)
        if genai:
            genai_autoregressive(b, ids, 8, threads=args.threads)
        ex, one, ga, over, smp, over_s = [], [], [], [], [], []
        same = True
        for _ in range(args.reps):
            out, st = edgespec_run(eng, ids, args.tokens)
            ex.append(st.tokens_per_second)
            over.append(max(st.decode_s - st.target_run_s, 0) / st.decode_s)
            out1, st1 = edgespec_run(one_token, ids, args.tokens)
            one.append(st1.tokens_per_second)
            _, sts = edgespec_run(eng, ids, args.tokens, **sampled)
            smp.append(sts.tokens_per_second)
            over_s.append(max(sts.decode_s - sts.target_run_s, 0) / sts.decode_s)
            if genai:
                gids, gdec, _ = genai_autoregressive(b, ids, args.tokens, threads=args.threads)
                ga.append((len(gids) - 1) / gdec if gdec else 0)
                # genai stops at the end of the reply, edgespec's runs go on past it (ignore_eos): genai's tokens
                # are compared with as many of edgespec's, and a shorter run is said (its tok/s is over fewer tokens)
                same &= out1[: len(gids)] == gids
                if len(gids) < args.tokens:
                    print(f"note: {Path(b).name}: genai ended its reply after {len(gids)} of {args.tokens} tokens; "
                          f"its tok/s is over those", file=sys.stderr)
        med = statistics.median
        g = (f"{med(ga):.1f} | {med(one) / med(ga):.2f}" if ga and med(ga) else "– | –")
        print(f"| {Path(b).name} | {med(ex):.1f} | {med(one):.1f} | {g} | "
              f"{100 * med(over):.1f}% | {med(smp):.1f} | {100 * med(over_s):.1f}% | "
              f"{('yes' if same else 'no') if genai else '–'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
