#!/usr/bin/env python3
"""Greedy speculative output against greedy autoregressive output, prompt by prompt, on a bundle as
users load it (session 27: how the cuda-layout SmolLM2's drift on the CPU EP was found, and checked
fixed). Each prompt (first turn, the chat template where the bundle has one) is decoded with
``--drafter none`` and with each drafter at each ``--max-draft`` bound; every output that differs
is printed with where it parts and the widest target call that run made.

    python scripts/check_exact.py bundles/smollm2-int4-cuda --provider cpu --max-draft 8,30

Exit 0 when every output equals greedy decoding, 1 when one does not, 2 on a bad argument or
bundle. ``--min-width`` forces the width policy instead of the load-time probe (to compare).
"""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--prompts", default=None, help="a prompt file in Spec-Bench's format (default: the shipped one)")
    ap.add_argument("--provider", default=None)
    ap.add_argument("--drafters", default="auto,prompt-lookup")
    ap.add_argument("--max-draft", default="8,30", help="comma-separated max_draft_tokens bounds")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--min-width", type=int, default=None)
    args = ap.parse_args(argv)
    if args.max_new_tokens < 1:
        ap.error("--max-new-tokens must be >= 1")
    import edgespec
    from edgespec.bench import read_prompts
    from edgespec.decoder import GenerationConfig
    from edgespec.errors import EdgespecError

    try:
        try:
            bounds = [int(b) for b in args.max_draft.split(",")]
        except ValueError:
            raise EdgespecError(f"--max-draft takes comma-separated integers, got {args.max_draft!r}") from None
        runs = [(d.strip(), b) for d in args.drafters.split(",") for b in bounds]
        for d, b in runs:
            GenerationConfig(max_new_tokens=args.max_new_tokens, drafter=d, max_draft_tokens=b)  # checked here
        qs = read_prompts(args.prompts)
        eng = edgespec.load(args.bundle, model_sampling=False, provider=args.provider, memory=False, min_width=args.min_width,
                            prompt_cache_mb=0)
        lm = eng.decoder.target
        print(f"width policy: at least {lm.min_width}, a multiple of {lm.width_multiple}, "
              f"verified up to {lm.verified_width or 'any'} tokens a call ({lm.device})")
        tok, bad, checked = eng.tokenizer, 0, 0
        for q in qs:
            turn = q["turns"][0]
            ids = tok.encode_chat([{"role": "user", "content": turn}]) if eng.manifest.chat_template else tok.encode(turn)
            if len(ids) + args.max_new_tokens > lm.max_context:
                print(f"{q['question_id']}: left out ({len(ids)} prompt tokens do not leave room in the context)")
                continue
            outs = {}
            for d, b in [("none", 1)] + runs:
                eng.decoder.reset()
                widths, orig = [], lm._run
                lm._run = lambda i, p, _o=orig, **kw: widths.append(len(i)) or _o(i, p, **kw)
                try:
                    cfg = GenerationConfig(max_new_tokens=args.max_new_tokens, drafter=d, max_draft_tokens=b)
                    toks = []
                    for s in eng.decoder.generate(ids, cfg):
                        if not toks:
                            widths.clear()  # the prompt's prefill calls: not verify calls
                        toks.extend(s.tokens)
                    outs[(d, b)] = (toks, max(widths or [0]))
                finally:
                    del lm._run
            ref = outs[("none", 1)][0]
            for (d, b), (o, w) in outs.items():
                checked += d != "none"
                if o != ref:
                    bad += 1
                    at = next((i for i, (x, y) in enumerate(zip(o, ref)) if x != y), min(len(o), len(ref)))
                    print(f"{q['question_id']}: {d} (max draft {b}) differs from greedy at token {at} "
                          f"(widest call {w} tokens)")
        if not checked:
            raise EdgespecError("no prompt fits the context: nothing was checked")
        print(f"{checked - bad} of {checked} outputs equal to greedy decoding")
        return 1 if bad else 0
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
