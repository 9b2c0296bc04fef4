#!/usr/bin/env python3
"""What a drafter step costs by what ran before it: back to back, after a target call (as in every
round of speculative decoding), after a numpy sweep of ``--sweep-mib`` (the caches flushed), after a
16 MiB sweep, after a 2 ms sleep. The median of ``--reps`` steps each, after a 256-token context (less
where the models hold less).

    python scripts/probe_drafter_cache.py bundles/qwen-coder-b128-v64k-xk

On session 20's Xeon the Qwen 0.5B drafter's step took 7.9-8.3 ms back to back, 9.3-9.6 after a
target call and 10-11 after a 1 GiB sweep: back to back, part of its weights come from the L3, which
the target's weight stream evicts (docs/bench/sessions.md, session 20).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def probe(bundle: str, reps: int = 30, sweep_mib: int = 1024) -> dict[str, float]:
    import numpy as np

    import edgespec
    from edgespec.errors import ConfigError

    eng = edgespec.load(bundle, model_sampling=False, memory=False, max_context=1024)
    if "model" not in eng.decoder.drafters:
        raise ConfigError(f"{bundle}: no drafter model is loaded")
    target, drafter = eng.decoder.target, eng.decoder.drafters["model"].lm
    n = min(256, target.max_context - 1, drafter.max_context - 1)  # the context the steps run after
    ids = [(7919 * i + 13) % min(30000, drafter.spec.vocab_size) for i in range(n + 1)]
    target.reset()
    target.forward(ids[:n])
    drafter.reset()
    drafter.forward(ids[:n])
    big = np.ones((sweep_mib << 20) // 4, np.float32)
    small = np.ones((16 << 20) // 4, np.float32)

    def step(lm) -> float:
        t = time.perf_counter()
        lm.forward([ids[n]])
        lm.rewind(1)
        return time.perf_counter() - t

    for _ in range(5):
        step(drafter)
        step(target)
    out = {}
    for name, before in (("back to back", lambda: None), ("after a target call", lambda: step(target)),
                         (f"after a {sweep_mib} MiB sweep", lambda: big.sum()),
                         ("after a 16 MiB sweep", lambda: small.sum()), ("after a 2 ms sleep", lambda: time.sleep(0.002))):
        xs = []
        for _ in range(reps):
            before()
            xs.append(step(drafter))
        out[name] = statistics.median(xs) * 1e3
    eng.close()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--sweep-mib", type=int, default=1024)
    args = ap.parse_args(argv)
    if args.reps < 1 or args.sweep_mib < 1:
        ap.error("--reps and --sweep-mib must be positive")
    from edgespec.errors import EdgespecError

    try:
        res = probe(args.bundle, args.reps, args.sweep_mib)
    except EdgespecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, ms in res.items():
        print(f"drafter step {name}: {ms:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
