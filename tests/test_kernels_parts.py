"""(session 88) export/kernels.py's parts on their own, where the exact-kernels rewrites of real and tiny bundles
(test_native, test_kv_q8, test_archs) never send what they refuse or must leave alone. Mutation-tested
(docs/bench/mutation_s88.md)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import q4k_like


def _mnb(K=64, N=8, bits=4, block=32, inputs=("A", "B", "S", "Z"), name="m"):
    from onnx import helper

    return helper.make_node("MatMulNBits", list(inputs), ["Y"], name=name, domain="com.microsoft", K=K, N=N,
                            bits=bits, block_size=block)


def test_the_kernel_takes_4_bit_matmulnbits_of_whole_blocks_only():
    """``_q4_attrs``: a 4-bit MatMulNBits whose K is whole blocks of a multiple of 8 lanes, reading its weights,
    scales and zero points (or none) from initializers; trailing empty inputs are no inputs. Anything else stays
    onnxruntime's: 8 bits (an int8 head beside int4 layers), an act-order g_idx, a bias, a block that does not
    divide K, a block of 4, weights computed in the graph, no scales, another domain."""
    from edgespec_export.kernels import _q4_attrs

    inits = {"B": 1, "S": 1, "Z": 1, "G": 1, "bias": 1}
    assert _q4_attrs(_mnb(), inits)["block_size"] == 32
    assert _q4_attrs(_mnb(inputs=("A", "B", "S")), inits) is not None
    assert _q4_attrs(_mnb(inputs=("A", "B", "S", "", "", "")), inits) is not None
    assert _q4_attrs(_mnb(K=128, block=128), inits) is not None
    for node in (_mnb(bits=8), _mnb(inputs=("A", "B", "S", "Z", "G")), _mnb(inputs=("A", "B", "S", "", "", "bias")),
                 _mnb(K=80, block=32), _mnb(K=64, block=4), _mnb(inputs=("A", "B")), None):
        assert _q4_attrs(node, inits) is None, node
    assert _q4_attrs(_mnb(), {"S": 1, "Z": 1}) is None  # (the weights an output of another node)
    other = _mnb()
    other.domain = "edgespec"
    assert _q4_attrs(other, inits) is None


def test_kquant_scales_take_minimums_only_within_float_rounding_of_q4ks():
    """Q4_K's minimums are ``dmin x m``, kept by MatMulNBits as a float zero point ``minimum / scale``: recovered
    within 4 float spacings (the zero point's rounding), refused past that (another quantizer's minimums would be
    computed with the wrong bytes); negative minimums or scales are none of Q4_K's."""
    from edgespec_export.kernels import kquant_scales

    N, K = 16, 256
    _, scale, zp, minimum = q4k_like(N, K, seed=3)
    nb = K // 32
    s = scale.reshape(N, nb)
    d, sb = kquant_scales(s, (zp * scale).reshape(N, nb))  # (as the rewrite gives them: zp x scale)
    assert d.shape == (N, nb // 8, 2) and sb.shape == (N, nb, 2) and sb.dtype == np.uint8
    assert np.array_equal(d[..., 1][:, :, None] * sb[..., 1].reshape(N, nb // 8, 8).astype(np.float32),
                          minimum.reshape(N, nb // 8, 8))
    off = minimum.copy()
    off[2, 5] *= 1.001
    assert kquant_scales(s, off) is None
    for neg_s, neg_m in ((True, False), (False, True)):
        ss, mm = s.copy(), minimum.copy()
        (ss if neg_s else mm)[1, 1] *= -1
        assert kquant_scales(ss, mm) is None
