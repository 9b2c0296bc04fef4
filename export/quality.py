"""Quality report at export: the exported graph against the original torch model on a small
text set written for this project (export/data/quality.txt)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from edgespec.drafters import fed_ids
from edgespec.manifest import ModelSpec, Quality
from edgespec.onnx_lm import OnnxLM
from edgespec.providers import choose

TEXTS = [t.strip() for t in (Path(__file__).parent / "data" / "quality.txt").read_text().split("===") if t.strip()]
MAX_TOKENS = 160
CONT_PROMPTS = ("def quicksort(arr):\n", "The three most important things to know about the ocean are")
CONT_TOKENS = 24
AGREE_TOKENS = 48


def _finite(x: float, digits: int) -> float | None:
    """``x`` rounded for the manifest; None where it is no finite number (a broken model's perplexity overflows
    to inf: written as Infinity and NaN, which JSON readers refuse; session 49, a review)."""
    return round(float(x), digits) if np.isfinite(x) else None


def _softmax_parts(x: np.ndarray):
    """(row maxima, exp(x - max), each row's sum of them in float64, the rows' log-sum-exp in float64): a
    log-softmax's parts without a float64 copy of the logits (float32 exponentials, sums and constants in float64)."""
    x = np.asarray(x, dtype=np.float32)
    m = x.max(-1, keepdims=True)
    e = np.exp(x - m)
    s = e.sum(-1, dtype=np.float64)
    return e, s, m[:, 0].astype(np.float64) + np.log(s)


def score(pairs) -> dict:
    """Teacher-forced comparison of two models on token sequences: ``pairs`` yields ``(ids,
    reference logits, logits)``, each logits ``[len(ids), vocab]``. Returns both perplexities, the
    top-1 agreement over every position, the mean KL(reference || other) and the tokens scored.
    (log p = x - lse(x); KL = sum p (r - g) - lse(r) + lse(g), p summing to 1: the whole log-softmaxes in float64
    took ~1.4 s a text at a 49k vocabulary, ~90% of an export's quality step; this form agrees to ~1e-8.)"""
    nll_r = nll_g = kl = 0.0
    n = agree = positions = 0
    for ids, ref, got in pairs:
        r = np.asarray(ref[:-1], dtype=np.float32)
        g = np.asarray(got[:-1], dtype=np.float32)
        er, sr, lse_r = _softmax_parts(r)
        _, _, lse_g = _softmax_parts(g)
        tgt = np.array(ids[1:])
        rows = np.arange(len(tgt))
        nll_r -= float((r[rows, tgt].astype(np.float64) - lse_r).sum())
        nll_g -= float((g[rows, tgt].astype(np.float64) - lse_g).sum())
        kl += float(((er * (r - g)).sum(-1, dtype=np.float64) / sr - lse_r + lse_g).sum())
        agree += int((ref.argmax(-1) == got.argmax(-1)).sum())
        n += len(tgt)
        positions += len(ids)
    return {"perplexity_ref": float(np.exp(nll_r / n)), "perplexity": float(np.exp(nll_g / n)),
            "top1": agree / positions, "kl": float(kl / n), "tokens": n}


class QualityRun:
    def __init__(self, tokenizer, precision: str):
        self.tok = tokenizer
        self.precision = precision

    def _ids(self, text: str, room: int = MAX_TOKENS, vocab: int | None = None) -> list[int]:
        """``text``'s tokens, at most MAX_TOKENS and ``room`` (a bundle's context can be shorter: --max-context), as
        a model of ``vocab`` ids reads them (``fed_ids``: a drafter with fewer ids than the tokenizer, Gemma 3 1B's)."""
        return fed_ids(self.tok(text, add_special_tokens=False)["input_ids"][: min(MAX_TOKENS, room)], vocab)

    def __call__(self, role: str, model, spec: ModelSpec, progress) -> Quality:
        import torch

        # wide calls only (the texts, the continuations teacher-forced): no width probe, as the drafter's agreement
        lm = OnnxLM(spec, min(spec.max_context, 512), choose(["cpu"]), min_width=1)

        def pairs():
            for text in TEXTS:
                ids = self._ids(text, lm.max_context, spec.vocab_size)
                with torch.no_grad():
                    ref = model(torch.tensor([ids])).logits[0].float().numpy()[:, : spec.vocab_size]
                lm.reset()
                yield ids, ref, lm.forward(ids)[:, : spec.vocab_size]

        s = score(pairs())
        ppl_t, ppl_o = s["perplexity_ref"], s["perplexity"]
        matches = []
        cont = min(CONT_TOKENS, lm.max_context // 2)  # prompt and continuation within the context
        for prompt in CONT_PROMPTS:
            ids = self._ids(prompt, lm.max_context // 2, spec.vocab_size)
            with torch.no_grad():
                ref = model.generate(torch.tensor([ids]), max_new_tokens=cont, do_sample=False,
                                     pad_token_id=self.tok.eos_token_id or 0)[0, len(ids):].tolist()
            # the graph's greedy continuation agrees with torch's up to its first other token: read from one call
            # teacher-forced on torch's (the graph's own decoding is torch's up to there; one call a token was ~95%
            # of an HQQ or gguf export's quality step, where onnxruntime's kernel costs the same at any width)
            lm.reset()
            pred = lm.forward(fed_ids(ids + ref[:-1], spec.vocab_size))[len(ids) - 1:].argmax(-1) if ref else []
            m = 0
            while m < len(ref) and int(pred[m]) == ref[m]:
                m += 1
            matches.append(m)
        q = Quality(perplexity_torch=_finite(ppl_t, 4), perplexity=_finite(ppl_o, 4),
                    perplexity_delta=_finite(ppl_o - ppl_t, 4), top1_agreement=round(s["top1"], 4),
                    mean_kl=_finite(s["kl"], 6), greedy_match_tokens=tuple(matches), greedy_match_of=cont,
                    tokens=s["tokens"])
        progress.log(f"    quality: perplexity {ppl_t:.3f} (torch) -> {ppl_o:.3f} (onnx, Δ {ppl_o - ppl_t:+.3f}), "
                     f"top-1 {q.top1_agreement:.3f}, KL {q.mean_kl:.4f}, greedy match {matches}/{cont}")
        return q

    def drafter_agreement(self, ts: ModelSpec, ds: ModelSpec, progress) -> Quality:
        """Teacher-forced greedy agreement of the drafter ``ds`` with the exported target ``ts``
        (``drafter_agreement``). Returns the drafter's quality record with it added."""
        return drafter_agreement(ts, ds, lambda text, room: self._ids(text, room), progress.log)


def drafter_agreement(ts: ModelSpec, ds: ModelSpec, encode, log=None, head_ids: np.ndarray | None = None) -> Quality:
    """Teacher-forced greedy agreement of the drafter ``ds`` with the exported target ``ts``: the fraction of target
    greedy tokens the drafter predicts. It is what greedy speculative acceptance will be. ``encode(text, room)``: a
    text's ids, at most ``room``; ``head_ids``: the token of each of the drafter's logits where its head is cut
    (--drafter-vocab: measured as the runtime drafts, after the cut). Returns the drafter's quality record with it."""
    ctx = min(512, ts.max_context, ds.max_context)
    # the drafter only makes wide calls here: no width probe (min_width 1, as the runtime runs it)
    t, d = OnnxLM(ts, ctx, choose(["cpu"])), OnnxLM(ds, ctx, choose(["cpu"]), min_width=1)
    hits = total = 0
    for text in TEXTS[:4]:
        ids = encode(text, ctx // 2)[:32]
        t.reset()
        logits = t.forward(ids)[-1]
        cont = []
        for _ in range(min(AGREE_TOKENS, ctx - len(ids))):
            tok = int(np.argmax(logits))
            cont.append(tok)
            logits = t.forward([tok])[-1]
        d.reset()  # (ids past a smaller drafter's vocabulary read as 0, as the runtime feeds them)
        dl = d.forward(fed_ids(ids + cont[:-1], ds.vocab_size))[len(ids) - 1:]
        pred = dl.argmax(-1)[: len(cont)]
        if head_ids is not None:
            pred = np.asarray(head_ids)[pred]
        hits += int((pred == np.array(cont)).sum())
        total += len(cont)
    rate = hits / total
    if log:
        log(f"    drafter agrees with the exported target on {hits}/{total} greedy tokens ({rate:.2f})")
    return replace(ds.quality, greedy_agreement_with_target=round(rate, 4), agreement_tokens=total)
