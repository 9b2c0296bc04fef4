#!/usr/bin/env python3
"""How much the order of requests decides what a fresh `auto` policy learns (session 54): none, prompt-lookup, suffix
and auto on the 14 held-out first turns, bench-like (engine.reset() before each generation, each runner's policy its
own, greedy outputs checked against none's), in the prompts' order or reversed; prints tokens/s ratios against none
per runner and category, and auto's rounds by drafter.

    python scripts/ab_order.py forward|reversed [BUNDLE]
"""
import collections
import copy
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if len(sys.argv) < 2 or sys.argv[1] not in ("forward", "reversed"):
    sys.exit("usage: ab_order.py forward|reversed [BUNDLE]")
bundle = sys.argv[2] if len(sys.argv) > 2 else str(ROOT / "bundles" / "qwen-coder-b128-v64k-xk")
sys.path.insert(0, str(ROOT))
import edgespec  # noqa: E402
eng = edgespec.load(bundle, model_sampling=False, memory=False)
eng.generate("Hello", max_new_tokens=8, drafter="none")
dec = eng.decoder
runners = ["none", "prompt-lookup", "suffix", "auto"]
memo = {id(d): d for d in dec.drafters.values()}; memo[id(dec.target)] = dec.target
states = {r: copy.deepcopy(dec.policy, dict(memo)) for r in runners}
seen = collections.Counter(); qs = []
for l in open(ROOT / "edgespec" / "data" / "prompts.jsonl"):
    q = json.loads(l)
    if seen[q["category"]] >= 2: continue
    seen[q["category"]] += 1; qs.append(q)
if sys.argv[1] == "reversed": qs = qs[::-1]
tot = collections.defaultdict(float); cat = collections.defaultdict(lambda: collections.defaultdict(float))
used = collections.defaultdict(collections.Counter); ref = {}
for qi, q in enumerate(qs):
    order = runners if qi % 2 else runners[:1] + runners[1:][::-1]
    for rn in order:
        dec.policy = states[rn]
        eng.reset()
        r = eng.generate([{"role": "user", "content": q["turns"][0]}], max_new_tokens=128, drafter=rn)
        if rn == "none": ref[qi] = r.token_ids
        else: assert r.token_ids == ref[qi], (rn, q["category"])
        s = r.stats
        dt = s["total_s"] - s["ttft_ms"] / 1000
        tot[rn] += dt; cat[q["category"]][rn] += dt
        used[rn].update(s["rounds_by_drafter"])
print(sys.argv[1], {r: round(tot["none"] / v, 3) for r, v in tot.items()}, flush=True)
for c, v in cat.items():
    print(" ", c, {r: round(v["none"] / x, 2) for r, x in v.items()})
print(" ", {r: dict(u) for r, u in used.items() if r == "auto"})
