"""``edgespec info``'s lines for a model's validation and quality reports (kept out of cli.py)."""
from __future__ import annotations

from .manifest import Quality, Validation


def report_lines(v: Validation, q: Quality) -> list[str]:
    """``info``'s validation and quality lines; a report with missing fields (an older or
    hand-edited manifest) is shown as such."""
    lines = []
    mark = "✓" if v.passed else "✗"
    if v.max_abs_logit_diff and v.top1_agreement is not None:
        tol = f" (tolerance {v.tolerance})" if v.tolerance is not None else ""
        over = f" over {v.positions} positions" if v.positions else ""
        lines.append(f"validation vs torch: {mark} max |Δlogit| {max(v.max_abs_logit_diff.values()):.3g}{tol}, "
                     f"top-1 {v.top1_agreement:.3f}{over}")
    elif v:
        lines.append(f"validation vs torch: {mark} (details missing from the manifest)")
    if v.weights_checked is not None:
        lines.append(f"weights vs torch: {v.weights_checked} matrices, worst relative difference "
                     + (f"{v.weight_error:.3g}" if v.weight_error is not None else "not a number")
                     + (f"; {v.weights_unmapped} not mapped" if v.weights_unmapped else ""))
    if q.perplexity:
        if None in (q.perplexity_torch, q.perplexity_delta, q.top1_agreement, q.mean_kl, q.greedy_match_tokens,
                    q.greedy_match_of):
            lines.append("quality: (report incomplete in the manifest)")
        else:
            lines.append(f"quality: perplexity {q.perplexity_torch} -> {q.perplexity} "
                         f"(Δ {q.perplexity_delta:+}), top-1 {q.top1_agreement}, KL {q.mean_kl}, "
                         f"greedy match {list(q.greedy_match_tokens)}/{q.greedy_match_of}"
                         + (f" ({q.tokens} tokens scored)" if q.tokens else ""))
    else:
        lines.append("quality: not measured (exported with --no-quality)")
    if q.greedy_agreement_with_target is not None:
        lines.append(f"predicted greedy acceptance (agreement with target): {q.greedy_agreement_with_target}"
                     + (f" over {q.agreement_tokens} tokens" if q.agreement_tokens else ""))
    return lines
