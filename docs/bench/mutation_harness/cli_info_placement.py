# session 84: edgespec/cli_info.py (I) and edgespec/cli_placement.py (L)
F = "edgespec/cli_info.py"
G = "edgespec/cli_placement.py"
MUTANTS = [
("I1", F, 'mark = "✓" if v.passed else "✗"', 'mark = "✓"'),
("I2", F, 'if v.max_abs_logit_diff and v.top1_agreement is not None:', 'if v.max_abs_logit_diff:'),
("I3", F, 'tol = f" (tolerance {v.tolerance})" if v.tolerance is not None else ""', 'tol = ""'),
("I4", F, 'over = f" over {v.positions} positions" if v.positions else ""', 'over = ""'),
("I5", F, '{max(v.max_abs_logit_diff.values()):.3g}', '{min(v.max_abs_logit_diff.values()):.3g}'),
("I6", F, '    elif v:\n', '    elif False:\n'),
("I7", F, 'if v.weights_checked is not None:', 'if v.weights_checked:'),
("I8", F, '(f"{v.weight_error:.3g}" if v.weight_error is not None else "not a number")', '(f"{v.weight_error}")'),
("I9", F, '(f"; {v.weights_unmapped} not mapped" if v.weights_unmapped else "")', '""'),
("I10", F, 'if None in (q.perplexity_torch, q.perplexity_delta, q.top1_agreement, q.mean_kl, q.greedy_match_tokens,\n                    q.greedy_match_of):', 'if None in (q.perplexity_torch, q.perplexity_delta):'),
("I11", F, '(Δ {q.perplexity_delta:+})', '(Δ {q.perplexity_delta})'),
("I12", F, '+ (f" ({q.tokens} tokens scored)" if q.tokens else ""))', ')'),
("I13", F, '    if q.greedy_agreement_with_target is not None:', '    if q.greedy_agreement_with_target:'),
("I14", F, '+ (f" over {q.agreement_tokens} tokens" if q.agreement_tokens else ""))', ')'),
("I15", F, '    else:\n        lines.append("quality: not measured', '    elif False:\n        lines.append("quality: not measured'),
("L1", G, 'out = {"drafter_provider": params["drafter_provider"]} if params.get("drafter_provider") else {}', 'out = {}'),
("L2", G, '    if params.get("cuda_graphs") is not None:', '    if params.get("cuda_graphs"):'),
("L3", G, 'default=None,\n                           help="On the CUDA EP', 'default=True,\n                           help="On the CUDA EP'),
("L4", G, 'wrapper = load_params(f, "drafter_provider", "cuda_graphs")', 'wrapper = load_params(f, "drafter_provider")'),
]
