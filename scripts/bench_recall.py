"""The suffix drafter memory's recall, timed against what the store holds: a store filled to its token cap (65,536)
with replies of 2-200 tokens after 400-token prompts (253 signature hashes each), then the median of 5 recalls, each
after one more add (the cost a generation pays before its first token). Session 53: 198.7 / 89.3 / 15.2 / 4.1 ms
before the sorted index, 2.3 / 1.3 / 1.0 / 0.4 ms after (2-core Zen 3). Usage: python scripts/bench_recall.py"""
import numpy as np, time
from edgespec.memory import MemoryStore
from edgespec.ngram import prompt_signature
rng = np.random.default_rng(0)
for reply in (2, 10, 50, 200):
    s = MemoryStore(None, "fp", 151936)
    while s.evicted == 0:
        p = rng.integers(0, 151936, 400)
        s.add(np.concatenate([p[-8:], rng.integers(0, 151936, reply)]), prompt_signature(p))
    ts = []
    for i in range(5):
        q = prompt_signature(rng.integers(0, 151936, 400))
        s.add(np.arange(12), q)  # the last generation recorded: the index is rebuilt at the next recall
        t = time.perf_counter(); s.recall(q); ts.append(time.perf_counter() - t)
    print(f"replies of {reply:>3} tokens: {len(s):>5} stored, {sum(g.size for g in s.sigs):>8} hashes, "
          f"{s.nbytes / 2**20:5.1f} MiB; recall {1000 * np.median(ts):6.1f} ms (median of 5)")
