#!/usr/bin/env python3
"""Would alternates pay under sampling? A teacher-forced probe (session 39).

    python scripts/probe_sampled_alternates.py bundles/qwen-coder-b128-v64k-xk --temperature 0.7

Greedy rounds verify a drafter's second choice beside a draft token (docs/how-it-works.md, "Alternates"): where the
target rejects the draft token and takes the alternate, the round keeps one token more. Sampled, the
exact counterpart is recursive rejection sampling without replacement (Jeon et al. 2024): the draft
token x1 ~ q is accepted with probability min(1, p(x1)/q(x1)); on a rejection, an alternate x2 drawn
from q without x1 (q1) is accepted with probability min(1, p1(x2)/q1(x2)), p1 = norm(max(p - q, 0))
the residual; only on its rejection too is the token drawn from norm(max(p1 - q1, 0)).

For each shipped prompt the target samples a reply; target and drafter then read prompt + reply
(probe_draft_stop.teacher_forced) and every position gives the acceptance sum(min(p, q)) and the
probability that a rejection there is rescued by an alternate, summed exactly over x1:
sum over x1 with p(x1) < q(x1) of (q(x1) - p(x1)) * sum_y min(p1(y), q1(y)). Rounds are then simulated
(cumulative stop, the width curve) without alternates and with alternates at every draft position or
at the first few, to bound what the feature could gain before building it.
"""
from __future__ import annotations

import argparse

import numpy as np

import edgespec
from edgespec.bench import read_prompts

from probe_draft_stop import AMX_S11, _softmax, cumulative, teacher_forced


def rescue(p: np.ndarray, q: np.ndarray, top: int = 64) -> tuple[float, float]:
    """(acceptance, probability of a rejection an alternate rescues) at one position."""
    acc = float(np.minimum(p, q).sum())
    r = np.maximum(p - q, 0.0)
    if r.sum() <= 0:
        return acc, 0.0
    p1 = r / r.sum()
    sup = np.flatnonzero(p1 > 1e-9)  # (the rest weighs under 1e-9 x vocab in all)
    cand = np.argpartition(q, -top)[-top:]
    cand = cand[(p[cand] < q[cand]) & (q[cand] > 1e-5)]
    c = 1.0 / np.maximum(1e-12, 1.0 - q[cand])
    s = np.minimum(p1[sup][None, :], q[sup][None, :] * c[:, None]).sum(axis=1)
    return acc, float(((q[cand] - p[cand]) * s).sum())


def given(p: np.ndarray, q: np.ndarray, x1: int) -> tuple[float, float]:
    """(probability that x1 is rejected, probability that it is rejected and the alternate kept), x1 drafted."""
    if p[x1] >= q[x1]:
        return 0.0, 0.0
    r = np.maximum(p - q, 0.0)
    p1 = r / r.sum()
    sup = np.flatnonzero(p1 > 1e-9)
    rej = 1.0 - p[x1] / q[x1]
    return rej, rej * float(np.minimum(p1[sup], q[sup] / max(1e-12, 1.0 - q[x1])).sum())


def collect(bundle: str, temperature: float, tokens: int, limit: int | None) -> np.ndarray:
    """Rows (prompt, acceptance, drafter's top probability at T = 1, rescued; then for one x1 drawn from q:
    rejected, rescued, q(x1), the largest q of another token, q's second-largest)."""
    eng = edgespec.load(bundle, model_sampling=False, memory=False)
    md = eng.decoder.drafters["model"]
    head, vocab = md.head_ids, eng.decoder.vocab
    rng = np.random.default_rng(0)
    rows = []
    for i, _, a, b in teacher_forced(eng, read_prompts(limit=limit), temperature, tokens):
        p = _softmax(a[:vocab], temperature)
        q = np.zeros(vocab)
        q[head if head is not None else np.arange(b.shape[0])] = _softmax(b, temperature)
        acc, res = rescue(p, q)
        x1 = int(rng.choice(vocab, p=q / q.sum()))
        rej, res1 = given(p, q, x1)
        two = np.partition(q, -2)[-2:]
        other = float(two[1]) if int(np.argmax(q)) != x1 else float(two[0])
        rows.append((i, acc, float(_softmax(b, 1.0).max()), res, rej, res1, float(q[x1]), other, float(two[0])))
    return np.array(rows)


def simulate(rows, step, widths, theta, alts: int, row_cost: float, passes=30, seed=0) -> float:
    """Tokens per unit of target time; ``alts`` alternates at the draft's first positions, each a
    row costing ``row_cost`` of a one-token call beyond the causal width curve's."""
    rng = np.random.default_rng(seed)
    acc, top, res = rows[:, 1], rows[:, 2], rows[:, 3]
    segments = [np.flatnonzero(rows[:, 0] == i) for i in np.unique(rows[:, 0])]
    kmax = len(widths) - 2
    rule = cumulative(theta)
    tokens = cost = 0.0
    for _ in range(passes):
        for s in segments:
            at = 0
            while at < len(s):
                n = min(rule(top[s[at:at + kmax]]), len(s) - at - 1, kmax)
                m = min(alts, n)
                cost += n * step + widths[n + 1] + m * row_cost
                kept, extra = 0, 0
                while kept < n:
                    j = s[at + kept]
                    if rng.random() < acc[j]:
                        kept += 1
                        continue
                    if kept < m and rng.random() < res[j] / max(1e-12, 1.0 - acc[j]):
                        extra = 1
                    break
                tokens += kept + 1 + extra
                at += kept + 1 + extra
    return tokens / cost


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--step", type=float, default=0.28, help="drafter step / one-token target call")
    ap.add_argument("--save", help="write the rows here (.npy)")
    ap.add_argument("--load", help="read rows saved before instead of collecting")
    args = ap.parse_args(argv)
    rows = np.load(args.load) if args.load else collect(args.bundle, args.temperature, args.tokens, args.limit)
    if args.save:
        np.save(args.save, rows)
    rej = 1 - rows[:, 1]
    print(f"{len(rows)} positions: acceptance {rows[:, 1].mean():.3f}, rejection {rej.mean():.3f}, "
          f"rescued {rows[:, 3].mean():.3f} (of rejections {rows[:, 3].sum() / rej.sum():.3f})")
    if rows.shape[1] > 4:  # which drafter-side figure predicts a rescue (given the drafted x1)?
        res1 = rows[:, 5]
        for name, f in (("1 - q(x1)", 1 - rows[:, 6]), ("largest other q", rows[:, 7]), ("q's second", rows[:, 8]),
                        ("q(x1)(1 - q(x1))", rows[:, 6] * (1 - rows[:, 6]))):
            edges = np.quantile(f, [0, .2, .4, .6, .8, 1])
            bins = np.clip(np.searchsorted(edges, f, side="right") - 1, 0, 4)
            cal = " ".join(f"{f[bins == b].mean():.2f}->{res1[bins == b].mean():.3f}" for b in range(5))
            print(f"  {name}: corr {np.corrcoef(f, res1)[0, 1]:.3f}; quintiles {cal}")
        print(f"  rescued given x1: mean {res1.mean():.3f}, rejected given x1 {rows[:, 4].mean():.3f}")
    curve = [0] + AMX_S11
    for theta in (0.3, 0.5, 0.7):
        base = simulate(rows, args.step, curve, theta, 0, 0.0)
        line = [f"theta={theta}: none {base:.3f}x"]
        for m in (1, 2, 4, 8):
            for rc in (0.04, 0.08):
                line.append(f"{m} alts @{rc} {simulate(rows, args.step, curve, theta, m, rc) / base:.3f}")
        print("  ".join(line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
