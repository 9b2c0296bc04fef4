#!/usr/bin/env python3
"""Where should a model draft end? A teacher-forced probe of the drafter's confidence against the
target's acceptance, and a simulation of draft-length rules on it (session 12; docs/how-it-works.md, "How it
works": dynamic model drafts).

    python scripts/probe_draft_stop.py bundles/qwen-coder-b128-v64k-xk --temperature 0.7 --tokens 128

For each shipped prompt (first turn) the target generates (greedy, or sampled at --temperature);
then target and drafter read prompt + output in one pass each, and every output position gives:
the acceptance of the drafter's proposal there (greedy: its argmax is the target's; sampled:
sum(min(p, q)), the rejection rule's acceptance, q the drafter's distribution at the same settings)
and the drafter's top probability (softmax at temperature 1); sampled, also the acceptance of the
drafter's argmax drafted as a point mass (p of it: exact too, and better where the drafter is less
sure than the target; on the Qwen pair it was not, session 32: 0.769 against 0.798 at T = 0.7,
0.681 against 0.757 at T = 1). Rounds are then simulated over those
positions (acceptance drawn from them, 30 passes): a fixed k with the old per-token stop, and the
cumulative stop (draft while the product of top probabilities stays above theta), costed with a
drafter step of --step (a fraction of a one-token target call) and the width curve of --widths
(bench_width.py's JSON; without it session 11's AMX curve). Prints tokens per unit of target time,
i.e. the speedup over plain decoding the rule would reach if nothing else cost anything.
"""
from __future__ import annotations

import argparse
import json

import numpy as np

import edgespec
from edgespec.bench import read_prompts
from edgespec.decoder import GenerationConfig

AMX_S11 = [1.00, 1.11, 1.17, 1.20, 1.24, 1.29, 1.33, 1.37, 1.42, 1.46, 1.50, 1.53, 1.57, 1.60, 1.63]  # widths 1..15


def _softmax(x: np.ndarray, t: float) -> np.ndarray:
    z = (x - x.max()) / t
    e = np.exp(z.astype(np.float64))
    return e / e.sum()


def teacher_forced(eng, prompts, temperature: float, tokens: int):
    """For each prompt (first turn, chat template; the i-th seeded i) the target generates ``tokens`` tokens
    at ``temperature`` (greedy at 0); then target and drafter read prompt + output in one pass each. Yields
    (prompt index, prompt, target logits, drafter logits) at every output position; prompts the context does
    not hold with the output are left out."""
    dec = eng.decoder
    if "model" not in dec.drafters:
        raise SystemExit("the bundle has no drafter model")
    target, md = dec.target, dec.drafters["model"]
    for i, p in enumerate(prompts):
        ids = eng.encode([{"role": "user", "content": p["turns"][0]}])
        if len(ids) + tokens > eng.max_context:
            continue
        out = [tok for s in dec.generate(ids, GenerationConfig(max_new_tokens=tokens, temperature=temperature,
                                                                drafter="none", seed=i)) for tok in s.tokens]
        target.reset()
        md.lm.reset()
        lt = [target.prefill(ids)] + (list(target.forward(out[:-1])) if len(out) > 1 else [])
        ld = [md.lm.prefill(ids)] + (list(md.lm.forward(out[:-1])) if len(out) > 1 else [])
        for a, b in zip(lt, ld):
            yield i, p, a, b
        target.reset()
        md.lm.reset()
        print(f"  {p['question_id']}: {len(out)} tokens", flush=True)


def collect(bundle: str, temperature: float, tokens: int, limit: int | None = None) -> np.ndarray:
    """Rows (prompt index, acceptance, drafter top probability, acceptance of the drafter's argmax as a
    point-mass draft) over every output position (greedy, the last equals the second)."""
    eng = edgespec.load(bundle, model_sampling=False, memory=False)
    md = eng.decoder.drafters.get("model")
    head, vocab = (md.head_ids if md is not None else None), eng.decoder.vocab
    t = temperature if temperature > 0 else 1.0
    rows = []
    for i, _, a, b in teacher_forced(eng, read_prompts(limit=limit), temperature, tokens):
        top = float(_softmax(b, 1.0).max())
        if temperature > 0:
            p_t = _softmax(a[:vocab], t)
            q = np.zeros(vocab)
            q[head if head is not None else np.arange(b.shape[0])] = _softmax(b, t)
            acc = float(np.minimum(p_t, q).sum())
            point = float(p_t[int(np.argmax(q))])  # q = None: accepted with the target's probability
        else:
            j = int(np.argmax(b))
            acc = point = float((int(head[j]) if head is not None else j) == int(np.argmax(a[:vocab])))
        rows.append((i, acc, top, point))
    return np.array(rows)


def simulate(rows: np.ndarray, step: float, widths: list[float], rule, passes: int = 30, seed: int = 0) -> float:
    """Tokens per unit of time (a one-token target call = 1) over ``rows`` in rounds that draft what
    ``rule(top probabilities ahead)`` says; ``widths[w]``: a call of w tokens (``widths[0]`` unused)."""
    rng = np.random.default_rng(seed)
    acc, top = rows[:, 1], rows[:, 2]
    segments = [np.flatnonzero(rows[:, 0] == i) for i in np.unique(rows[:, 0])]
    kmax = len(widths) - 2
    tokens = cost = 0.0
    for _ in range(passes):
        for s in segments:
            at = 0
            while at < len(s):
                n = min(rule(top[s[at:at + kmax]]), len(s) - at - 1, kmax)
                cost += n * step + widths[n + 1]
                kept = 0
                while kept < n and rng.random() < acc[s[at + kept]]:
                    kept += 1
                tokens += kept + 1
                at += kept + 1
    return tokens / cost


def fixed(k: int, floor: float):
    def rule(tops):
        n = 0
        for t in tops[:k]:
            n += 1
            if t < floor:
                break
        return n
    return rule


def cumulative(theta: float):
    def rule(tops):
        n, sure = 0, 1.0
        for t in tops:
            n += 1
            sure *= t
            if sure < theta:
                break
        return n
    return rule


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--step", type=float, default=None,
                    help="drafter step / one-token target call (default: from --widths, else session 11's 0.28)")
    ap.add_argument("--widths", help="bench_width.py JSON: the target's cost by width (default: session 11's AMX curve)")
    ap.add_argument("--save", help="write the collected rows here (.npy)")
    ap.add_argument("--limit", type=int, default=None, help="the first N prompts only")
    args = ap.parse_args(argv)
    curve = AMX_S11
    if args.widths:
        w = json.load(open(args.widths))
        ms = {int(k): v for k, v in (w.get("policy_ms") or {}).items()}
        if 1 not in ms:
            raise SystemExit(f"{args.widths}: no per-width timings (policy_ms) found")
        curve = [ms[i] / ms[1] for i in sorted(ms)]
        if args.step is None and w.get("drafter_step_ms"):
            args.step = w["drafter_step_ms"]["1"] / ms[1]
    if args.step is None:
        args.step = 0.28
    rows = collect(args.bundle, args.temperature, args.tokens, args.limit)
    if args.save:
        np.save(args.save, rows)
    print(f"{len(rows)} positions, mean acceptance {rows[:, 1].mean():.3f}")
    if args.temperature > 0:  # (session 32: drafting the argmax under sampling was no better)
        print(f"the drafter's argmax drafted as a point mass instead: mean acceptance {rows[:, 3].mean():.3f}")
    for k in (2, 3, 4, 5, 6, 8):
        print(f"fixed k={k}, per-token stop 0.5: {simulate(rows, args.step, [0] + curve, fixed(k, 0.5)):.3f}x")
    for theta in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8):
        print(f"cumulative stop theta={theta}: {simulate(rows, args.step, [0] + curve, cumulative(theta)):.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
