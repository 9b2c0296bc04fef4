#!/usr/bin/env python3
"""Speculative decoding per category, side by side in one run: edgespec's drafters against
edgespec's own autoregressive decoding and against onnxruntime-genai (autoregressive, draft-model
speculation, n-gram speculation) on the same bundle graphs.

    python scripts/bench_spec.py bundles/qwen-coder --per-category 1 --max-new-tokens 64 \\
        --out reports/spec-qwen

For every prompt (and chat turn) each runner generates greedily from the same prompt ids, one
after the other, so every figure comes from the same machine state. ``speedup`` is against
edgespec's ``none`` (exact autoregressive) in the same run; ``exact`` says whether a runner's tokens
equal that reference (for genai's speculative rows: genai's own autoregressive tokens). genai rows: ``genai-ar`` (its generator, no speculation), ``genai-draft:K``
(the bundle's drafter graph as genai's draft model, K tokens per round), ``genai-ngram:K``
(prompt lookup with ngram size N, up to K tokens). Writes report.json / report.md / plots like
``edgespec bench``.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import edgespec  # noqa: E402
from edgespec.bench import parse_drafters, read_prompts, run_bench, write_partial_report, write_report  # noqa: E402
from genai_baseline import (GENAI_CONFIG, MAX_DRAFT_TOKENS, genai_autoregressive, genai_speculative,  # noqa: E402
                            model_dir)
from llamacpp_baseline import SERVER, llamacpp_runners  # noqa: E402
from one_line_errors import one_line_errors  # noqa: E402


def genai_runners(bundle: Path, k: int, ngram_size: int, with_draft: bool, threads: int | None) -> dict:
    target = bundle / "target"

    def ar(ids, n):
        out, dec, pre = genai_autoregressive(target, ids, n, threads=threads)
        return {"token_ids": out, "decode_s": dec, "ttft_ms": 1000 * pre, "target_calls": len(out)}

    def spec(drafter_dir):
        def run(ids, n):
            out, dec, st = genai_speculative(target, ids, n, k, drafter_dir, ngram_size=ngram_size, threads=threads)
            return {"token_ids": out, "decode_s": dec, "ttft_ms": 1000 * st["prefill_seconds"],
                    "drafted": st.get("draft_tokens_proposed", 0), "accepted": st.get("draft_tokens_accepted", 0),
                    "rounds": st.get("rounds", 0), "reference": "genai-ar",
                    "target_calls": st.get("target_forward_passes", 0) + st.get("standard_fallback_steps", 0)}
        return run

    runners = {"genai-ar": ar}
    if with_draft and (bundle / "drafter" / GENAI_CONFIG).is_file():
        runners[f"genai-draft:{k}"] = spec(bundle / "drafter")
    elif with_draft:  # (a traceback once the models had loaded: a drafter whose vocabulary was cut, `drafter-vocab`)
        print(f"bench_spec: no genai-draft:{k} run: the bundle's drafter has no {GENAI_CONFIG} (a drafter-vocab "
              "drafter's cut vocabulary is not the target's, which onnxruntime-genai's draft model needs)",
              file=sys.stderr)
    runners[f"genai-ngram:{k}"] = spec(None)
    return runners


def _mkdir(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


def repeat_passes(prompts: list[dict], passes: int) -> list[dict]:
    """The prompt set ``passes`` times over, pass after pass; a repeat's question_id gets ``#n``."""
    return [q if p == 0 else dict(q, question_id=f"{q['question_id']}#{p + 1}") for p in range(passes) for q in prompts]


@one_line_errors
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--drafters", default="model,model:4,prompt-lookup,auto",
                    help="edgespec drafters (none always runs as the baseline); model:4 fixes k")
    ap.add_argument("--genai-k", type=int, default=4, help="draft tokens per round for genai's speculation")
    ap.add_argument("--ngram-size", type=int, default=4, help="genai n-gram size (matches the last N-1 tokens)")
    ap.add_argument("--no-genai", action="store_true")
    ap.add_argument("--llamacpp", action="store_true",
                    help="also run llama.cpp (scripts/build_llamacpp.sh) on the GGUFs the bundle was exported from: "
                         "autoregressive, draft model, n-gram")
    ap.add_argument("--llamacpp-draft-k", default="4,8", help="draft lengths for llama.cpp's draft-model runs")
    ap.add_argument("--llamacpp-target", default=None, help="target GGUF (default: the manifest's source)")
    ap.add_argument("--llamacpp-drafter", default=None, help="drafter GGUF (default: the manifest's source)")
    ap.add_argument("--temperature", type=float, default=0.0, help="sampled runs (no exactness check, no anchors)")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--min-p", type=float, default=0.0, help="sampled runs: min-p (0: off)")
    ap.add_argument("--top-k", type=int, default=0, help="sampled runs: top-k (0: off)")
    ap.add_argument("--seed", type=int, default=None,
                    help="sampled runs: seed every generation (a reproducible one: the round policy's priors)")
    ap.add_argument("--repetition-penalty", type=float, default=1.0,
                    help="1: off; another value runs edgespec alone (the anchors take none)")
    ap.add_argument("--prompts", default=None, help="Spec-Bench question.jsonl (default: the shipped set)")
    ap.add_argument("--per-category", type=int, default=1)
    ap.add_argument("--categories", default=None)
    ap.add_argument("--passes", type=int, default=1,
                    help="run the prompt set this many times (sampled runs differ from pass to pass: more "
                         "samples a figure; the repeats are named QID#2, QID#3, ...)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", default="reports/spec")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)

    bundle = Path(args.bundle).resolve()
    names = [d.strip() for d in args.drafters.split(",") if d.strip()]
    if args.passes < 1:
        ap.error(f"--passes must be >= 1, got {args.passes}")
    from edgespec.decoder import GenerationConfig
    from edgespec.errors import ConfigError

    if args.seed is not None and args.temperature <= 0:
        ap.error("--seed seeds sampled runs: give --temperature above 0")
    try:  # (before the models load)
        GenerationConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                         repetition_penalty=args.repetition_penalty, seed=args.seed)
    except ConfigError as e:
        ap.error(str(e))
    # (sampled, or greedy under a penalty: the anchors' runs get neither, so there is nothing to compare them with)
    sampled = args.temperature > 0 or args.repetition_penalty != 1.0
    if sampled and args.llamacpp:  # (its runs are greedy: nothing to compare a sampled run with)
        ap.error("--llamacpp runs plain greedy decoding only: leave out --temperature and --repetition-penalty, "
                 "or --llamacpp")
    # (each of these ended in a traceback once the model, and genai, had loaded; a review)
    if not 1 <= args.genai_k <= MAX_DRAFT_TOKENS:
        ap.error(f"--genai-k must be in 1..{MAX_DRAFT_TOKENS} (onnxruntime-genai's bound), got {args.genai_k}")
    if not 2 <= args.ngram_size <= 16:
        ap.error(f"--ngram-size must be in 2..16, got {args.ngram_size}")
    if args.llamacpp:
        ks = [k.strip() for k in args.llamacpp_draft_k.split(",") if k.strip()]
        if not all(k.isdecimal() and k.isascii() and 1 <= int(k) <= 64 for k in ks):
            ap.error(f"--llamacpp-draft-k must be draft lengths (1..64) separated by commas, got "
                     f"{args.llamacpp_draft_k!r}")
        if not SERVER.is_file():
            ap.error(f"--llamacpp: {SERVER} is missing: run scripts/build_llamacpp.sh first")
        for opt, f in (("--llamacpp-target", args.llamacpp_target), ("--llamacpp-drafter", args.llamacpp_drafter)):
            if f is not None and not Path(f).is_file():
                ap.error(f"{opt}: no such file: {f}")
    parse_drafters(names)  # a bad entry, prompts file or category is refused before the model loads
    prompts = read_prompts(args.prompts, categories=args.categories.split(",") if args.categories else None,
                           per_category=args.per_category)
    if not (args.no_genai or sampled):  # (a traceback once the model and llama.cpp had loaded)
        from edgespec.manifest import load_manifest

        load_manifest(bundle)  # (not a bundle at all: that error first)
        try:
            model_dir(bundle / "target")  # (where genai_runners' runs look)
        except FileNotFoundError:
            ap.error(f"{bundle} has no {GENAI_CONFIG} for onnxruntime-genai's runs (an exact-kernels bundle's "
                     "graphs run on edgespec's kernels only): give --no-genai, or run genai on the bundle it was "
                     "rewritten from")
    # no memory of earlier runs (every runner sees a prompt fresh) and no prompt cache (its memory is not in the
    # plan the report compares with; scripts/bench_prompt_cache.py measures it)
    eng = edgespec.load(bundle, model_sampling=False, threads=args.threads, memory=False, prompt_cache_mb=0)
    has_model = eng.decoder.drafters.get("model") is not None
    if not has_model:
        names = [n for n in names if not n.startswith("model")]
    prompts = repeat_passes(prompts, args.passes)
    external = {} if args.no_genai or sampled else genai_runners(bundle, args.genai_k, args.ngram_size, has_model,
                                                                  args.threads)
    close_llama = None
    try:  # (llama-server processes are closed whatever ends the run: an error in genai's warm-up left two
        # running after the script had exited)
        if args.llamacpp and not sampled:
            tgt = args.llamacpp_target or eng.manifest.sources.get("target")
            dft = args.llamacpp_drafter or eng.manifest.sources.get("drafter")
            if not tgt or not str(tgt).endswith(".gguf"):
                ap.error("--llamacpp needs the target GGUF (--llamacpp-target): the bundle was not exported from one")
            if not Path(tgt).is_file():
                ap.error(f"--llamacpp: the target GGUF the bundle was exported from is not here: {tgt} "
                         "(--llamacpp-target)")
            ks = tuple(int(k) for k in args.llamacpp_draft_k.split(",") if k.strip())
            runners, close_llama = llamacpp_runners(tgt, dft if dft and str(dft).endswith(".gguf") else None,
                                                    threads=args.threads or os.cpu_count() or 2, ctx=eng.max_context,
                                                    draft_ks=ks, logs=_mkdir(Path(args.out)))
            external.update(runners)
        if external:  # first calls of genai's sessions pick kernels: keep them out of the figures
            warm = eng.tokenizer.encode("Hello")
            for fn in external.values():
                fn(warm, 8)
        print(f"bench_spec: {bundle.name}, {len(prompts)} prompts, edgespec "
              f"{['none'] + [n for n in names if n != 'none']}, genai {list(external)}, {args.max_new_tokens} new "
              "tokens", file=sys.stderr, flush=True)
        try:
            # (genai's models live in this process: the report's peak memory says it holds theirs too)
            rep = run_bench(eng, prompts, names, max_new_tokens=args.max_new_tokens, external=external,
                            temperature=args.temperature, top_p=args.top_p, min_p=args.min_p, top_k=args.top_k,
                            repetition_penalty=args.repetition_penalty, seed=args.seed,
                            in_process=[n for n in external if n.startswith("genai")])
        except BaseException as e:  # Ctrl-C, llama-server gone: the runs done are written, marked as stopped early
            write_partial_report(getattr(e, "report", None), args.out)
            raise
    finally:
        if close_llama:
            close_llama()
    files = write_report(rep, args.out, plots=not args.no_plots)
    print(rep.markdown())
    print("wrote " + ", ".join(str(f) for f in files), file=sys.stderr)
    return 0 if all(r.exact is not False for r in rep.runs if r.drafter not in external) else 1  # edgespec's own


if __name__ == "__main__":
    sys.exit(main())
