"""The setup that the round policy's one-process A/Bs share (scripts/ab_alt_premium.py, ab_hint_first_read.py): their
arguments, the engine loaded and warmed, and one deep copy of its round policy per arm (the drafters and the target
shared, not copied), which the script's loop swaps in prompt by prompt."""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def policy_arms(doc: str, argv, names=("old", "new")):
    """Parse the A/B's arguments (``bundle``, ``--prompts``, ``--repeat``, ``--max-new-tokens``), load the bundle's
    engine with greedy model drafting, and return ``(args, prompts, engine, {name: a copy of its round policy})``."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", nargs="?", default=str(ROOT / "bundles" / "qwen-coder-b128-v64k-xk"))
    ap.add_argument("--prompts", default=str(ROOT / "scripts" / "data" / "more_prompts.jsonl"))
    ap.add_argument("--repeat", type=int, default=1, help="passes over the prompts")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args(argv)
    import edgespec
    from edgespec.bench import read_prompts

    prompts = read_prompts(args.prompts)
    eng = edgespec.load(args.bundle, model_sampling=False, memory=False)
    eng.generate("Hello", max_new_tokens=8, drafter="none")
    dec = eng.decoder
    memo = {id(d): d for d in dec.drafters.values()}
    memo[id(dec.target)] = dec.target
    return args, prompts, eng, {a: copy.deepcopy(dec.policy, dict(memo)) for a in names}


def rounds(args, prompts, eng, arms):
    """Each prompt's generations, one per arm (its policy swapped in, the engine reset; `auto` greedy), the arms'
    order swapped every prompt so that the machine's drift falls on both: yields ``(prompt, {arm: result})``. Exits
    with 1 where the arms' outputs differ (greedy output is the target's, whatever the policy)."""
    names = list(arms)
    for rep in range(args.repeat):
        for qi, q in enumerate(prompts):
            out = {}
            for arm in (names if (qi + rep) % 2 == 0 else names[::-1]):
                eng.decoder.policy = arms[arm]
                eng.reset()
                out[arm] = eng.generate([{"role": "user", "content": q["turns"][0]}],
                                        max_new_tokens=args.max_new_tokens, drafter="auto", temperature=0.0)
            if len({tuple(r.token_ids) for r in out.values()}) > 1:
                print(f"{q['question_id']}: the arms' outputs differ", file=sys.stderr)
                raise SystemExit(1)
            yield q, out
