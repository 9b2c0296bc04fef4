#!/usr/bin/env python3
"""Which drafter the round policy picks, round by round in aggregate, when drafters run one after the other on ONE
engine (what it learned carries from one generation to the next, as in a server): per generation the tokens per
second, the rounds and the tokens kept by drafter, and the drafter's time. A probe, not a benchmark (one process,
no isolation between the drafters' runs, unlike bench_spec.py); run it alone on the machine.

    python scripts/probe_policy_rounds.py bundles/qwen-coder-b128-v64k-xk --prompts sum-1,sum-2 \\
        --drafters suffix,prompt-lookup,auto,model --passes 2      # session 63: auto against the copies on summaries
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--prompts", required=True, help="question ids of the shipped prompt set, comma-separated")
    ap.add_argument("--drafters", default="suffix,prompt-lookup,auto,model")
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    import edgespec
    from edgespec.bench import read_prompts
    from edgespec.drafters import drafter_choices

    prompts = {p["question_id"]: p for p in read_prompts()}
    wanted = [q.strip() for q in args.prompts.split(",") if q.strip()]
    unknown = [q for q in wanted if q not in prompts]
    if unknown:
        ap.error(f"no such prompt id: {', '.join(unknown)} (the shipped set has {', '.join(prompts)})")
    drafters = [x.strip() for x in args.drafters.split(",") if x.strip()]
    bad = [d for d in drafters if d not in drafter_choices()]
    if bad:  # (before the models load)
        ap.error(f"no such drafter: {', '.join(bad)} (one of {', '.join(drafter_choices())})")
    try:
        with edgespec.load(args.bundle, model_sampling=False, memory=False, prompt_cache_mb=0) as eng:
            for p in range(args.passes):
                for qid in wanted:
                    ids = eng.tokenizer.encode_chat([{"role": "user", "content": prompts[qid]["turns"][0]}])
                    for d in drafters:
                        eng.reset()
                        st = None
                        for _, _, st, _ in eng.stream_ids(ids, max_new_tokens=args.max_new_tokens, temperature=0.0,
                                                          drafter=d):
                            pass
                        print(f"pass {p + 1} {qid} {d:14s} {st.tokens_per_second:6.1f} tok/s  target calls "
                              f"{st.target_calls:3d}  drafter {st.draft_s:.3f} s  rounds {dict(st.rounds_by_drafter)}"
                              f"  kept {dict(st.accepted_by_drafter)}", flush=True)
    except edgespec.EdgespecError as e:
        print(f"probe_policy_rounds.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
