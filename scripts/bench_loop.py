#!/usr/bin/env python3
"""The decoding loop's own time a target call: the round policy's choice and the drafting (Python,
and a model drafter's calls where one drafts), over the shipped prompts (first turns, chat template),
apart from the target's calls. On a GPU, where a call of a small model takes ~1 ms, this is what
keeps `auto` behind plain prompt lookup (session 27, GPU runs 9-10: ~0.5 ms a round against 0.25).

    python scripts/bench_loop.py /tmp/smollm2-int4 --drafters prompt-lookup,auto --max-draft 15

Prints, per drafter and pass, the target calls and the choose+draft milliseconds a call. Compare
two versions of the code in alternating runs (this VM drifts): `PYTHONPATH=OTHER_CHECKOUT python ...`.
Exit 2 on a bad argument or bundle.
"""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--drafters", default="prompt-lookup,auto")
    ap.add_argument("--max-draft", type=int, default=15)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--prompts", default=None)
    ap.add_argument("--provider", default="cpu")
    args = ap.parse_args(argv)
    if args.passes < 1 or args.max_new_tokens < 1:
        ap.error("--passes and --max-new-tokens must be >= 1")
    import edgespec
    from edgespec.bench import read_prompts
    from edgespec.decoder import GenerationConfig, Stats
    from edgespec.errors import EdgespecError

    try:
        names = [d.strip() for d in args.drafters.split(",")]
        for d in names:
            GenerationConfig(drafter=d, max_draft_tokens=args.max_draft, max_new_tokens=args.max_new_tokens)
        qs = read_prompts(args.prompts)
        eng = edgespec.load(args.bundle, model_sampling=False, provider=args.provider, memory=False, prompt_cache_mb=0)
        tok, lm = eng.tokenizer, eng.decoder.target
        for p in range(args.passes):
            for d in names:
                draft = calls = tokens = 0
                for q in qs:
                    t = q["turns"][0]
                    ids = tok.encode_chat([{"role": "user", "content": t}]) if eng.manifest.chat_template else tok.encode(t)
                    if len(ids) + args.max_new_tokens > lm.max_context:
                        continue
                    eng.decoder.reset()
                    st = Stats()
                    cfg = GenerationConfig(drafter=d, max_draft_tokens=args.max_draft, max_new_tokens=args.max_new_tokens)
                    for _ in eng.decoder.generate(ids, cfg, st):
                        pass
                    draft, calls, tokens = draft + st.draft_s, calls + st.target_calls, tokens + st.new_tokens
                if not calls:
                    raise EdgespecError("no prompt fits the context")
                print(f"pass {p + 1} {d:14s} {tokens} tokens, {calls} target calls, "
                      f"choose+draft {1000 * draft / calls:.3f} ms a call")
        return 0
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
