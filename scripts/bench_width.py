#!/usr/bin/env python3
"""The verify-width cost curve: what one target call of w tokens costs, w = 1..16, and one drafter
step, on the models of a bundle opened as the runtime opens them (provider, threads, the
process-wide pool). The curve is what bounds speculative decoding on a device: a round of k draft
tokens costs a call of width k + 1 (padded by the exactness width policy) plus k drafter steps.

    python scripts/bench_width.py bundles/qwen-coder-b128 --widths 1-16 --context 256 --reps 12

Each width is timed ``--reps`` times after a ``--context``-token prefill (the call is rewound after
each rep, so the cache stays at the same length), widths taken in turn (round-robin) so that
machine drift spreads over all of them; the median is reported. ``raw`` runs the width as asked
(the kernel's own path); ``policy`` is the width the runtime really runs under the measured policy
(min_width, multiple). ``--json`` writes the figures (per width: raw and policy median ms). Run it
alone on the machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_widths(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        a, _, b = part.partition("-")
        out += list(range(int(a), int(b) + 1)) if b else [int(a)]
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"widths must be positive integers: {text!r}")
    return sorted(set(out))


def time_widths(lm, widths: list[int], context: int, reps: int, vocab: int,
                argmax: bool = False, last_only: bool = False) -> dict[int, float]:
    """Median seconds of a call of each width after ``context`` tokens (``lm`` as it is set up:
    its min_width/width_multiple pad the calls or not). ``argmax``: time ``forward_argmax`` (what a
    greedy round calls) instead of ``forward``; ``last_only``: ``forward_from`` the last position (a
    prefill chunk's or a catch-up read's call: the model's logits skip where it has one)."""
    ids = [(7919 * i + 13) % vocab for i in range(context + max(widths))]
    lm.reset()
    lm.forward(ids[:context]) if context <= getattr(lm, "prefill_chunk", context) else lm.feed(ids[:context])
    samples: dict[int, list[float]] = {w: [] for w in widths}
    call = lm.forward_argmax if argmax else lm.forward
    if last_only:
        def call(ids):
            return lm.forward_from(ids, len(ids) - 1, copy=False)
    for w in widths:  # warm-up: first calls of a width allocate
        call(ids[context: context + w])
        lm.rewind(w)
    for _ in range(reps):
        for w in widths:
            t = time.perf_counter()
            call(ids[context: context + w])
            samples[w].append(time.perf_counter() - t)
            lm.rewind(w)
    lm.reset()
    return {w: statistics.median(s) for w, s in samples.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--widths", type=parse_widths, default=parse_widths("1-16"))
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--provider", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args(argv)
    import edgespec

    eng = edgespec.load(args.bundle, model_sampling=False, provider=args.provider, threads=args.threads, memory=False,
                        max_context=max(512, args.context + max(args.widths) + 8), prompt_cache_mb=0)
    target = eng.decoder.target
    vocab = min(eng.manifest.target.vocab_size, 32000)
    policy = (target.min_width, target.width_multiple)
    pol = time_widths(target, args.widths, args.context, args.reps, vocab)
    target.min_width, target.width_multiple = 1, 1
    raw = time_widths(target, args.widths, args.context, args.reps, vocab)
    target.min_width, target.width_multiple = policy
    step = None
    model = eng.decoder.drafters.get("model")
    if model is not None:
        step = time_widths(model.lm, [1, 2], args.context, args.reps * 2, vocab)
    base = raw[1] if 1 in raw else min(raw.values())
    print(f"{eng.manifest.root.name} on {target.device}; context {args.context}; width policy "
          f"(min_width, multiple) = {policy}; median of {args.reps}")
    print("| width | raw ms | x raw 1-token | policy ms | tokens/s if all accepted (policy) |")
    print("|---:|---:|---:|---:|---:|")
    for w in args.widths:
        print(f"| {w} | {raw[w] * 1e3:.2f} | {raw[w] / base:.2f} | {pol[w] * 1e3:.2f} | {w / pol[w]:.1f} |")
    if step is not None:
        print(f"drafter step (1 token): {step[1] * 1e3:.2f} ms; 2-token catch-up: {step[2] * 1e3:.2f} ms "
              f"({step[1] / pol[1]:.2f} of a policy 1-token target call)")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "bundle": str(eng.manifest.root), "device": target.device, "context": args.context,
            "policy": list(policy), "raw_ms": {w: raw[w] * 1e3 for w in args.widths},
            "policy_ms": {w: pol[w] * 1e3 for w in args.widths},
            "drafter_step_ms": None if step is None else {w: s * 1e3 for w, s in step.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
