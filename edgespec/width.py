"""The exactness width: how many tokens every target call must carry so that greedy speculative
output equals autoregressive output (docs/how-it-works.md, "Exactness"), measured when a session opens."""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from .providers import log

# call widths the probe compares: one token, and verify calls up to 8 draft tokens
PROBE_WIDTHS = (1, 2, 3, 4, 5, 6, 8, 9)
# ... on a GPU provider, every width up to 16 (edgespec/graphs.py captures each of them): its calls
# take a few ms, and its kernels may change with the number of rows anywhere (cuBLAS chooses its
# algorithm by shape; onnxruntime's MatMulNBits takes another kernel past a few rows), so the probe
# checks each width the decoder may call and the decoder calls no wider (``CausalLM.verified_width``)
GPU_PROBE_WIDTHS = tuple(range(1, 17))
# the widest verify call a GPU policy must allow (a draft of 8 tokens, as the probe always allowed)
GPU_MIN_VERIFIED = 9
# onnxruntime's CPU kernels are probed as a GPU's are (every width 1-16, calls bounded by where they agree) since
# session 45: MLAS splits a call's rows between threads and computes a part of one row on its one-row path, so a
# call of 33 tokens on 2 threads computed its last row otherwise than narrower calls (65 and 97 likewise; fp32 and
# INT4 graphs), and a draft of 32 made greedy speculative output differ from plain decoding. Where the row split
# falls depends on the thread count, so only a probe of every width allowed says. edgespec's own kernels compute a
# row alike at every width by construction: for them the probe keeps to PROBE_WIDTHS, with no bound.


def padded_width(n: int, min_width: int = 1, multiple: int = 1) -> int:
    """The width a call of ``n`` tokens runs under the policy (``min_width``, ``multiple``): at least
    ``min_width`` tokens, rounded up to a multiple of ``multiple``."""
    w = max(int(n), int(min_width))
    return -(-w // int(multiple)) * int(multiple)


# onnxruntime's ops whose CPU kernels split a call's rows between threads (MLAS: the last row of a 33-token call on
# another path than the rest, session 45): a graph of edgespec's kernels that keeps one of them is no longer alike
# at every width (exact-kernels keeps a MatMulNBits it cannot take, an input dimension no multiple of its block)
WIDTH_DEPENDENT_OPS = ("MatMulNBits", "MatMul")  # (GroupQueryAttention: exact-kernels --onnxruntime-attention keeps
# it on purpose, padded to two or more query rows, its rows alike at every width: tests/test_native.py)


def width_invariant(lm) -> bool:
    """Whether ``lm`` computes a row alike at every call width by construction: edgespec's own INT4 kernels
    (``exact-kernels`` bundles) on the CPU, with none of onnxruntime's ``WIDTH_DEPENDENT_OPS`` left beside them.
    Such a model is probed on ``PROBE_WIDTHS`` only and its verify calls are not bounded; every other
    (onnxruntime's kernels, any GPU) is probed at every width it may be called at and bounded there."""
    return lm.device == "cpu" and width_invariant_spec(lm.spec)


def width_invariant_spec(spec) -> bool:
    """Whether a model's graph (``ModelSpec``) computes a row alike at every call width on the CPU: edgespec's kernels
    with none of onnxruntime's ``WIDTH_DEPENDENT_OPS`` beside them (``width_invariant``)."""
    ops = getattr(spec, "operators", None) or {}
    return getattr(spec, "kernels", None) == "edgespec-q4" and not any(ops.get(op) for op in WIDTH_DEPENDENT_OPS)


def _candidates(widths: Sequence[int]) -> list[tuple[int, int]]:
    """Policies the probe can confirm, cheapest first: by the width a one-token call pays, then by
    the padding over every probed width. (1, 1) is no policy; (2, 1) is "at least two tokens"
    (MatMulNBits' one-token GEMV path); (2, 2) is "an even number of tokens" (a kernel that
    computes rows in pairs and an odd last row on the one-row path: MatMulNBits at block 64 and
    128 with int8 activations on AVX-512, measured); (w, 1) for a small-M path up to w - 1 rows."""
    top = max(widths)
    cands = {(w, 1) for w in widths} | {(2, 2), (4, 2), (4, 4)}
    return sorted(cands, key=lambda c: (padded_width(1, *c), sum(padded_width(n, *c) for n in range(1, top + 1)),
                                        c))


def measure_width(lm, prefix: int = 16, widths: Sequence[int] | None = None) -> tuple[int, int]:
    """The width policy, ``(min_width, multiple)``, measured on ``lm`` (a ``CausalLM``): after the
    same ``prefix`` tokens, calls of each width in ``widths`` compute the positions they share; the
    result is the cheapest policy under which every pair of calls it allows (widths of at least
    ``min_width`` tokens, multiples of ``multiple``) computes them bitwise the same. A call of 2
    tokens made twice must also agree with itself, or no policy can help (warned). ``lm`` is left
    as it was found: empty cache, no calls counted. What each call took is kept as
    ``lm.width_seconds`` (width -> seconds; the repeated 2-token call keeps the faster of its two):
    the round policy starts from these instead of a guessed verify-width slope.

    ``widths`` defaults to ``GPU_PROBE_WIDTHS`` (1-16), and the policy also bounds the widest call:
    ``lm.verified_width`` is the widest probed width up to which the allowed calls agree (at least
    ``GPU_MIN_VERIFIED``, else a wider ``min_width`` is taken), and the decoder verifies no more tokens a
    call than that. For edgespec's own kernels (``exact-kernels``, on the CPU) it stays None, no bound, and
    the probe keeps to ``PROBE_WIDTHS``: they compute a row alike at every width by construction
    (``tests/test_native.py``). Until session 45 onnxruntime's CPU kernels were probed so too, wider calls
    trusted to compute as those do, which MLAS's split of a call's rows between threads broke (above)."""
    gpu = lm.device != "cpu"
    bounded = not width_invariant(lm)  # every width the decoder may call is probed, and it calls no wider
    lm.verified_width = None
    if widths is None:  # (bounded, the widths the window leaves room for)
        widths = tuple(w for w in GPU_PROBE_WIDTHS if prefix + w <= lm.max_context) if bounded else PROBE_WIDTHS
        widths = widths if len(widths) >= 2 else PROBE_WIDTHS
    need = prefix + max(widths)
    if lm.max_context < need:
        if bounded:  # not probed: no wider than the old probe's widest call
            lm.verified_width = GPU_MIN_VERIFIED
        return width_policy(lm.device)  # too small to probe: the rule measured on the CPU
    vocab = min(lm.spec.vocab_size, 32000)
    ids = [(7919 * i + 13) % vocab for i in range(need)]  # fixed, spread over the vocabulary
    rows, took = {}, {}
    saved = lm.min_width, lm.width_multiple
    lm.min_width, lm.width_multiple = 1, 1
    ar_rows = None
    try:
        lm.reset()
        lm.forward(ids[:prefix])
        if getattr(lm, "graphs", None) is not None and lm.max_context >= prefix + 28:
            # CUDA graphs: widths whose replays differ from ordinary runs run ordinary calls; the
            # rows timed and compared below are replays of the others' captured graphs
            from .graphs import CHECK_OFFSETS, GRAPH_MAX_WIDTH, check_replays

            more = [(7919 * i + 13) % vocab for i in range(prefix + max(CHECK_OFFSETS) + GRAPH_MAX_WIDTH + 1)]
            bad = check_replays(lm, more, prefix)
            if bad:
                log.info(f"{lm.spec.role}: CUDA graph replays of {sorted(bad)} tokens compute other logits than "
                         f"ordinary runs on {lm.device}: those calls run without graphs")
            lm.forward(ids[:prefix])
        for w in widths:
            lm.rewind(lm.length - prefix)
            t = time.perf_counter()
            rows[w] = lm.forward(ids[prefix: prefix + w])
            took[w] = time.perf_counter() - t
        lm.rewind(lm.length - prefix)
        t = time.perf_counter()
        again = lm.forward(ids[prefix: prefix + 2])
        took[2] = min(took.get(2, np.inf), time.perf_counter() - t)
        if gpu:  # one-token calls one after another, as autoregressive decoding runs them: each
            lm.rewind(lm.length - prefix)  # position's row against the wide calls' rows there
            ar_rows = np.concatenate([lm.forward(ids[prefix + j: prefix + j + 1]) for j in range(max(widths))])
        if getattr(lm, "device_argmax", False):  # greedy rounds read only the argmax there: price those calls
            top = {}
            for w in widths:
                lm.rewind(lm.length - prefix)
                t = time.perf_counter()
                top[w] = lm.forward_argmax(ids[prefix: prefix + w])
                took[w] = min(took[w], time.perf_counter() - t) if w == 2 else time.perf_counter() - t
            # the device's argmax must pick what numpy's does in the logits it computed (the first
            # index among equal values): else greedy rounds read the logits
            bad = [w for w in widths if not np.array_equal(top[w], np.argmax(rows[w], axis=-1))]
            if bad:
                lm.device_argmax = False
                log.warning(f"{lm.spec.role}: the graph's argmax on {lm.device} disagrees with the logits at "
                            f"width {bad[0]}; greedy decoding reads the logits instead")
        lm.width_seconds = took
    finally:
        lm.reset()
        lm.min_width, lm.width_multiple = saved
        if hasattr(lm, "_init_counters"):
            lm._init_counters()
        else:
            lm.calls, lm.run_seconds = 0, 0.0
    if not np.array_equal(again, rows[2]):
        log.warning(f"{lm.spec.role}: the same call computed twice gives different logits on {lm.device}; "
                    f"greedy speculative output may differ from autoregressive output here")
        if bounded:
            lm.verified_width = GPU_MIN_VERIFIED
        return width_policy(lm.device)
    ws = sorted(widths)
    for min_width, multiple in _candidates(ws):
        group = [w for w in ws if w >= min_width and w % multiple == 0]
        # the widest call up to which every allowed call agrees (bitwise equality is transitive: each
        # call against the widest of the group); unbounded (edgespec's kernels) the whole group must agree
        # (bounded, the widest probed call is a reference only: at least 9 tokens, or what the window left room for)
        tops = (sorted((w for w in group if w >= min(GPU_MIN_VERIFIED, ws[-2])), reverse=True) if bounded
                else group[-1:])
        for top in tops:
            upto = [w for w in group if w <= top]
            # bounded, each allowed call up to ``top`` against a wider one's rows, its last row included (a call
            # that computes its last row otherwise, as MLAS' row split between threads does, agrees with every
            # narrower call on their rows: compared with those alone it passed)
            ref = next((w for w in group if w > top), None) if bounded else top
            if ref is None:
                continue
            if len(upto) >= 2 and all(np.array_equal(rows[a], rows[ref][:a]) for a in upto if a != ref) and (
                    min_width > 1 or ar_rows is None or np.array_equal(ar_rows[:top], rows[top])):
                if bounded:
                    lm.verified_width = top
                    if top < ws[-1]:
                        log.info(f"{lm.spec.role}: calls of more than {top} tokens compute their rows otherwise "
                                 f"on {lm.device}; verify calls carry at most {top}")
                if not gpu and min_width == 1 and bounded:
                    # onnxruntime's CPU kernels: a one-token call's path can differ on some data only
                    # (session 27: the cuda-layout SmolLM2 on the CPU EP, float16 activations, at ~1 in
                    # 3 positions of real text, the probe's tokens agreeing at every width); only
                    # edgespec's own kernels compute one row as they compute several, by construction
                    log.info(f"{lm.spec.role}: one-token calls agree with wider ones in the probe; on "
                             f"onnxruntime's CPU kernels calls carry at least 2 tokens all the same")
                    return 2, multiple
                return min_width, multiple
    if bounded:
        lm.verified_width = ws[-1]
    return ws[-1], 1


def width_policy(device: str) -> tuple[int, int]:
    """The policy where it cannot be measured (a context too small for the probe, or arithmetic that
    does not reproduce): what ``measure_width`` found on the CPU EP for most graphs measured (fp32,
    fp8, int4 and int8 at accuracy level 4): a one-token call takes another path than wider calls
    (MatMulNBits' int8-activation GEMV, MLAS' SGEMV; up to ~0.7 and ~2e-5 apart in logits), and
    calls of 2 to 9 tokens compute their rows bitwise the same. INT4 at block 64/128 on AVX-512
    needs even widths, which the probe finds; this fallback does not know it. GPU kernels are not
    measured here: (1, 1), and the probe decides at load."""
    return (2, 1) if device == "cpu" else (1, 1)
