"""Session 55: `auto` with its first model read deferred (apply docs/bench/policy_defer_s55.patch first; not adopted) beside
auto-old (defer_calls=inf: the shipped policy), suffix and none, on the 14 held-out first turns.

    python docs/bench/ab_defer_s55.py forward|reversed [BUNDLE]
"""
import collections, copy, json, sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import edgespec
order = sys.argv[1]
eng = edgespec.load(sys.argv[2] if len(sys.argv) > 2 else "bundles/qwen-coder-b128-v64k-xk", memory=False)
eng.generate("Hello", max_new_tokens=8, drafter="none")
dec = eng.decoder
runners = ["none", "suffix", "auto-old", "auto"]
memo = {id(d): d for d in dec.drafters.values()}; memo[id(dec.target)] = dec.target
states = {r: copy.deepcopy(dec.policy, dict(memo)) for r in runners}
states["auto-old"].defer_calls = float("inf")
seen = collections.Counter(); qs = []
for l in open(sys.path[0] + "/edgespec/data/prompts.jsonl"):
    q = json.loads(l)
    if seen[q["category"]] >= 2: continue
    seen[q["category"]] += 1; qs.append(q)
if order == "reversed": qs = qs[::-1]
tot = collections.defaultdict(float); cat = collections.defaultdict(lambda: collections.defaultdict(float)); ref = {}
for qi, q in enumerate(qs):
    order_r = runners if qi % 2 else runners[:1] + runners[1:][::-1]
    for rn in order_r:
        dec.policy = states[rn]
        eng.reset()
        r = eng.generate([{"role": "user", "content": q["turns"][0]}], max_new_tokens=128, drafter=rn.replace("-old", ""))
        if rn == "none": ref[qi] = r.token_ids
        else: assert r.token_ids == ref[qi], (rn, q["category"])
        s = r.stats; dt = s["total_s"] - s["ttft_ms"] / 1000
        tot[rn] += dt; cat[q["category"]][rn] += dt
print(order, {r: round(tot["none"] / v, 3) for r, v in tot.items()}, flush=True)
for c, v in cat.items():
    print(" ", c, {r: round(v["none"] / x, 2) for r, x in v.items()})
