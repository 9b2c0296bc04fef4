"""The exactness width: how many tokens every target call must carry so that greedy speculative
output equals autoregressive output (README, "Exactness"), measured when a session opens."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .providers import log

# call widths the probe compares: one token, and verify calls up to 8 draft tokens
PROBE_WIDTHS = (1, 2, 3, 5, 9)


def measure_min_width(lm, prefix: int = 16, widths: Sequence[int] = PROBE_WIDTHS) -> int:
    """The width policy's call width, measured on ``lm`` (a ``CausalLM``): after the same ``prefix``
    tokens, calls of each width in ``widths`` compute the positions they share; the result is the
    smallest width from which every wider probed call computes them bitwise the same. A call of 2
    tokens made twice must also agree with itself, or no width can help (warned). ``lm`` is left
    as it was found: empty cache, no calls counted."""
    need = prefix + max(widths)
    if lm.max_context < need:
        return width_policy(lm.device)  # too small to probe: the rule measured on the CPU
    vocab = min(lm.spec.vocab_size, 32000)
    ids = [(7919 * i + 13) % vocab for i in range(need)]  # fixed, spread over the vocabulary
    rows = {}
    saved, lm.min_width = lm.min_width, 1
    try:
        lm.reset()
        lm.forward(ids[:prefix])
        for w in widths:
            lm.rewind(lm.length - prefix)
            rows[w] = lm.forward(ids[prefix: prefix + w])
        lm.rewind(lm.length - prefix)
        again = lm.forward(ids[prefix: prefix + 2])
    finally:
        lm.reset()
        lm.min_width = saved
        lm.calls, lm.run_seconds = 0, 0.0
    if not np.array_equal(again, rows[2]):
        log.warning(f"{lm.spec.role}: the same call computed twice gives different logits on {lm.device}; "
                    f"greedy speculative output may differ from autoregressive output here")
        return width_policy(lm.device)
    ws = sorted(widths)
    for w0 in ws:
        group = [w for w in ws if w >= w0]
        if all(np.array_equal(rows[a], rows[b][:a]) for i, a in enumerate(group) for b in group[i + 1:]):
            return w0
    return ws[-1]


def width_policy(device: str) -> int:
    """The width where it cannot be measured (a context too small for the probe, or arithmetic that
    does not reproduce): what ``measure_min_width`` found on the CPU EP for every graph measured
    (fp32, fp8, int4 and int8 at accuracy level 4): a one-token call takes another path than wider
    calls (MatMulNBits' int8-activation GEMV, MLAS' SGEMV; up to ~0.7 and ~2e-5 apart in logits),
    and calls of 2 to 9 tokens compute their rows bitwise the same. GPU kernels are not measured
    here: 1, and the probe decides at load."""
    return 2 if device == "cpu" else 1
