# session 90: edgespec/native/q4gemm.cpp's attention (D: DecodeAttention and DecodeAttentionF16) and topp.cpp (T).
# Written by a helper session. Each mutant's comment: what it breaks, then "(likely: TEST NAMES)" naming the tests
# in tests/test_native.py (or other files) expected to catch it, or "(no test found)" where you believe none does.
# (D also covers DecodeAttentionQ8's shared code and its int8 stores and loads: tests/test_kv_q8.py; T's tests are in
# tests/test_decoder.py. "isa avx2 / portable": the tests' EDGESPEC_Q4_ISA runs; "this-cpu": the AVX-512 path where
# the CPU has it, as the machine these ran on does.)
Q = "edgespec/native/q4gemm.cpp"
T = "edgespec/native/topp.cpp"
MUTANTS = [
# ---- attributes and registration (attn_create_v2) ----
# D1 local_window_size 0 accepted (taken as no window) (likely: test_decode_attention_refuses_a_bad_window_or_softcap)
("D1", Q, "  if (a->window == 0 || a->window < -1 || !(a->softcap >= 0.f)", "  if (a->window < -1 || !(a->softcap >= 0.f)"),
# D2 an infinite softcap accepted (its scores then NaN) (likely: test_decode_attention_refuses_a_bad_window_or_softcap)
("D2", Q, "!(a->softcap >= 0.f) || !std::isfinite(a->softcap))", "!(a->softcap >= 0.f))"),
# D3 rotary_interleaved ignored: an interleaved rotary computed as the halves' one (likely:
# test_decode_attention_partial_rotary_follows_onnxruntime_and_rows_do_not_depend_on_the_width [inter=1 cases])
("D3", Q, "    a->interleaved = inter != 0;", "    a->interleaved = false;"),
# D4 the scale attribute ignored (1 / sqrt(D) always) (no test found: every attention test passes scale 0; a bundle
# test only where its graph's scale is not 1 / sqrt(D))
("D4", Q, "  a->scale = scale;", "  a->scale = 0.f;"),
# D5 attention never takes the AVX-512 (16-lane, quads) path: AVX2's bits on this-cpu (no test found: this-cpu runs
# are compared with onnxruntime within tolerance and with themselves; test_decode_attention_in_fours compares quads
# with pairs, both then AVX2's)
("D5", Q, "  a->avx512 = g_avx512;", "  a->avx512 = false;"),
# D6 attention never takes the portable path (EDGESPEC_Q4_ISA=portable runs AVX2's code) (no test found: the
# portable-vs-avx2 tests then compare AVX2 with itself; nothing checks which path attention ran)
("D6", Q, "  a->portable = g_portable;", "  a->portable = false;"),
# ---- input checks (attn_compute_v2) ----
# D7 sin's shape unchecked against cos's (likely: test_decode_attention_refuses_rotary_tables_of_the_wrong_shape)
("D7", Q, "cd.size() != 2 ||\n      dims_of(in[5]) != cd)", "cd.size() != 2)"),
# D8 a seqlens_k of several values taken (its first read) (likely: test_decode_attention_refuses_bad_lengths_with_an_error)
("D8", Q, "  if (sn != 1 || !data_of(in[3])) return", "  if (!data_of(in[3])) return"),
# D9 Q8 caches whose rows are not D + D / 8 bytes taken (likely: test_q8_refuses_a_head_size_or_cache_rows_it_cannot_hold
# [widths 32 and 40 at D 32])
("D9", Q, "  if (a->q8 && (D % kQ8Group || kd[3] != row_len<Q8>(D)))", "  if (a->q8 && (D % kQ8Group))"),
# D10 a Q8 head size that is no multiple of 32 taken where the rows' width matches (D 48, rows 52: a group read past the
# head) (no test found: the test's D 48 case has rows of 54 bytes, refused by the width check alone)
("D10", Q, "  if (a->q8 && (D % kQ8Group || kd[3] != row_len<Q8>(D)))", "  if (a->q8 && (kd[3] != row_len<Q8>(D)))"),
# D11 a negative position accepted (likely: test_decode_attention_alternates_compute_the_bits_of_a_one_token_call
# [the refused [0, 1, 2, 3, 4, -1, 1, 2]])
("D11", Q, "      if (rel[i] < 0 || rel[i] >= m)", "      if (rel[i] >= m)"),
# D12 an alternate at position m (one past the causal rows) accepted (no test found: the refused cases are a count
# mismatch, 9 and -1)
("D12", Q, "      if (rel[i] < 0 || rel[i] >= m)", "      if (rel[i] < 0 || rel[i] > m)"),
# ---- attend: the new keys and values, the calls ----
# D13 an alternate's key rotated at its slot's position, not its own (likely:
# test_decode_attention_alternates_compute_the_bits_of_a_one_token_call, test_q8_alternates_and_windows_...)
("D13", Q, "const int64_t pos = past + (rel ? rel[i] : i), slot = past + i;", "const int64_t pos = past + i, slot = past + i;"),
# D14 an alternate's key and value written at its position's slot (over the causal row's) (likely:
# test_decode_attention_alternates_compute_the_bits_of_a_one_token_call)
("D14", Q, "const int64_t pos = past + (rel ? rel[i] : i), slot = past + i;", "const int64_t pos = past + (rel ? rel[i] : i), slot = pos;"),
# D15 the default scale from the rotary's width (2R), not the head's: wrong for a partial rotary only (likely:
# test_decode_attention_partial_rotary_follows_onnxruntime_and_rows_do_not_depend_on_the_width)
("D15", Q, "a->scale : 1.0f / std::sqrt(float(D));", "a->scale : 1.0f / std::sqrt(float(2 * R));"),
# D16 the 16-lane path taken on EDGESPEC_Q4_ISA=avx2 too (likely: test_the_portable_path_computes_the_avx2_paths_attention_bits,
# test_the_portable_path_computes_the_avx2_paths_q8_bits)
("D16", Q, "  const bool wide = a->avx512 && D % 16 == 0;", "  const bool wide = D % 16 == 0;"),
# D17 an alternate's output written over its position's causal row (likely:
# test_decode_attention_alternates_compute_the_bits_of_a_one_token_call)
("D17", Q, "out + i * a->H * D, scale, wide,", "out + rel[i] * a->H * D, scale, wide,"),
# D18 the alternates' calls without the rotary's width (their queries not rotated) (likely:
# test_decode_attention_alternates_compute_the_bits_of_a_one_token_call, test_q8_alternates_and_windows_...)
("D18", Q, "  for (AttnCall<T>& c : calls) c.rot = R;", "  calls.front().rot = R;"),
# D19 the past values copied D elements a row, not the row's length (Q8: D + D / 8 bytes, so its scales and later rows
# are lost; float32 and float16 unchanged) (likely: test_q8_stores_numpys_rows_and_attends_their_values_alike_at_every_width)
("D19", Q, "std::memcpy(V + g * L * S, pv + g * L * S, size_t(past * S) * sizeof(T));", "std::memcpy(V + g * L * S, pv + g * L * S, size_t(past * D) * sizeof(T));"),
# ---- attend_rows (AVX2 / AVX-512) ----
# D20 the x86 paths' window one key short (W - 1 keys) (likely: test_decode_attention_window_and_softcap_follow_onnxruntime_...
# [this-cpu, avx2], test_the_portable_path_computes_the_avx2_paths_attention_bits)
("D20", Q, "std::max<int64_t>(0, keys_of(x) - W) : int64_t(0); };", "std::max<int64_t>(0, keys_of(x) - W + 1) : int64_t(0); };"),
# D21 the last key before a query's window not given weight 0 (its raw score weighs a value) (likely:
# test_decode_attention_window_and_softcap_..., test_decode_attention_window_rows_of_several_tasks_are_one_row_calls)
("D21", Q, "for (int64_t r = from; r < k1; ++r) sc[x * stride + r] = 0.f;", "for (int64_t r = from; r < k1 - 1; ++r) sc[x * stride + r] = 0.f;"),
# D22 no room for an own slot's block of 4 scores (its padding overwrites the next query's first scores) (likely:
# test_decode_attention_alternates_compute_the_bits_of_a_one_token_call [this-cpu, avx2])
("D22", Q, "  const int64_t stride = (maxkeys + 3) / 4 * 4 + (c.own >= 0 ? 4 : 0);", "  const int64_t stride = (maxkeys + 3) / 4 * 4;"),
# D23 the x86 paths' own-slot shift one row off (an alternate's own key read from the slot before) (likely:
# test_decode_attention_alternates_compute_the_bits_of_a_one_token_call [this-cpu, avx2], test_q8_alternates_...)
("D23", Q, "const int64_t shift = c.own >= 0 ? (c.own - split)", "const int64_t shift = c.own >= 0 ? (c.own - maxkeys)"),
# D24 the x86 paths' query heads mapped to KV groups interleaved (h = x * KVH + g, not g * group + x) (likely:
# test_decode_attention_matches_onnxruntime_and_rows_do_not_depend_on_the_width [KVH 2 cases, this-cpu, avx2])
("D24", Q, "const int64_t i = r0 + x / group, h = g * group + x % group, pos = c.past + i;\n    rotary(c.qkv + (i * (H + 2 * c.a->KVH) + h) * D, q + x * D",
 "const int64_t i = r0 + x / group, h = x % group * c.a->KVH + g, pos = c.past + i;\n    rotary(c.qkv + (i * (H + 2 * c.a->KVH) + h) * D, q + x * D"),
# D25 the x86 paths' queries rotated at their row within the task, not the call (rows from 8 on) (likely:
# test_decode_attention_matches_onnxruntime_and_rows_do_not_depend_on_the_width [9 rows], test_decode_attention_window_rows_of_several_tasks_...)
("D25", Q, "const int64_t i = r0 + x / group, h = g * group + x % group, pos = c.past + i;\n    rotary(c.qkv + (i * (H + 2 * c.a->KVH) + h) * D, q + x * D",
 "const int64_t i = r0 + x / group, h = g * group + x % group, pos = c.past + x / group;\n    rotary(c.qkv + (i * (H + 2 * c.a->KVH) + h) * D, q + x * D"),
# D26 the x86 paths' softcap as c * tanh(s), not c * tanh(s / c) (likely: test_decode_attention_window_and_softcap_...
# [this-cpu, avx2], test_the_portable_path_computes_the_avx2_paths_attention_bits, test_decode_attention_alternates_... [window-softcap])
("D26", Q, "se[r] = cap * std::tanh(se[r] / cap);\n    }\n    __m256 mx", "se[r] = cap * std::tanh(se[r]);\n    }\n    __m256 mx"),
# D27 the max's 8-lane loop stops a block early (the last whole block by std::max, which passes over a NaN: another max
# than the portable path's over a NaN score; the same for finite scores) (likely:
# test_the_portable_path_takes_the_softmax_max_as_the_avx2_path_over_a_nan_score)
("D27", Q, "for (; j + 8 <= kw; j += 8) mx = _mm256_max_ps(", "for (; j + 8 < kw; j += 8) mx = _mm256_max_ps("),
# D28 the max not subtracted in the softmax's whole blocks of 8 (a last partial block's still is) (likely:
# test_decode_attention_matches_onnxruntime_and_rows_do_not_depend_on_the_width [this-cpu, avx2])
("D28", Q, "exp8(_mm256_sub_ps(_mm256_loadu_ps(se + j), mv))", "exp8(_mm256_loadu_ps(se + j))"),
# D29 the AVX2 scores' last 8 lanes of a head dropped (likely: test_decode_attention_matches_onnxruntime_... [avx2],
# test_the_portable_path_computes_the_avx2_paths_attention_bits)
("D29", Q, "    for (int64_t d = 0; d < D; d += 8) {\n      const __m256 va", "    for (int64_t d = 0; d + 8 < D; d += 8) {\n      const __m256 va"),
# D30 the AVX-512 scores fold a chain's low half twice, its high half dropped (likely:
# test_decode_attention_matches_onnxruntime_and_rows_do_not_depend_on_the_width [this-cpu])
("D30", Q, "_mm512_extractf64x4_pd(_mm512_castps_pd(acc[u]), 1)", "_mm512_extractf64x4_pd(_mm512_castps_pd(acc[u]), 0)"),
# D31 the four-query tile's fourth query scored with the third's vector (likely:
# test_decode_attention_in_fours_computes_the_bits_of_pairs, test_decode_attention_matches_onnxruntime_... [this-cpu])
("D31", Q, "acc[12 + u] = _mm512_fmadd_ps(v3, kv, acc[12 + u]);", "acc[12 + u] = _mm512_fmadd_ps(v2, kv, acc[12 + u]);"),
# D32 a pair of queries skipped in a value block where the earlier one has no key (the later's first key there lost:
# rows ending at a 64-key boundary) (likely: test_the_portable_path_computes_the_avx2_paths_attention_bits [past 63],
# test_decode_attention_window_rows_of_several_tasks_are_one_row_calls, test_decode_attention_alternates_... [past 62])
("D32", Q, "        if (kb <= k0) continue;", "        if (ka <= k0) continue;"),
# D33 the AVX2 value sums: the later query of a pair misses its keys past the earlier one's (its own key, where the pair
# straddles two rows) (likely: test_decode_attention_matches_onnxruntime_... [avx2, H 3 / 14 per group],
# test_the_portable_path_computes_the_avx2_paths_attention_bits)
("D33", Q, "  for (; r < kb; ++r) {  // the later query's keys past the earlier one's", "  for (; r < ka; ++r) {  // the later query's keys past the earlier one's"),
# D34 the AVX2 value sums' 8-lane slices after the 32-lane ones stop one short (the head's last 8 lanes 0 where D is not
# a multiple of 32) (likely: test_decode_attention_matches_onnxruntime_... [avx2, D 48 / 16])
("D34", Q, "  for (; d0 < D; d0 += 8) weigh_pair<1>(", "  for (; d0 + 8 < D; d0 += 8) weigh_pair<1>("),
# D35 the four-query value sums: each later query's extra keys skipped for the first query past the earlier ones
# (likely: test_decode_attention_matches_onnxruntime_... [this-cpu], test_decode_attention_in_fours_computes_the_bits_of_pairs)
("D35", Q, "        for (int p = p0; p < 4; ++p) a[p][v] =", "        for (int p = p0 + 1; p < 4; ++p) a[p][v] ="),
# ---- float16 and int8 stores and loads ----
# D36 the x86 paths' float16 keys and values rounded toward zero (likely:
# test_decode_attention_f16_rounds_each_new_key_once_and_rows_do_not_depend_on_the_width [this-cpu, avx2],
# test_the_portable_path_rounds_new_keys_and_values_to_float16_as_f16c)
("D36", Q, "_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)", "_mm256_cvtps_ph(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC)"),
# D37 the x86 paths' float16 store turns a NaN into -65504 (max_ps's operands swapped) (likely:
# test_decode_attention_f16_saturates_what_float16_cannot_hold, test_the_portable_path_rounds_new_keys_and_values_to_float16_as_f16c)
("D37", Q, "_mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_loadu_ps(x + d)))", "_mm256_min_ps(hi, _mm256_max_ps(_mm256_loadu_ps(x + d), lo))"),
# D38 the AVX-512 int8 loads take group 0's scale for every lane (likely:
# test_q8_stores_numpys_rows_and_attends_their_values_alike_at_every_width [this-cpu, D >= 64])
("D38", Q, "return _mm512_mul_ps(x, _mm512_set1_ps(q8_scale(row, d, D)));", "return _mm512_mul_ps(x, _mm512_set1_ps(q8_scale(row, 0, D)));"),
# D39 the int8 numbers x * (1 / s), not x / s (likely: test_q8_store_rounds_exact_ties_to_even_and_divides_by_the_scale)
("D39", Q, "std::nearbyint(x[d] / s)", "std::nearbyint(x[d] * (1.0f / s))"),
# D40 a group's finiteness from its last lane only (an infinity or NaN elsewhere: a scale of inf or NaN numbers) (likely:
# test_q8_stores_extreme_and_non_finite_values_as_numpy_does)
("D40", Q, "      finite = finite && std::isfinite(x[d]);", "      finite = std::isfinite(x[d]);"),
# ---- rotary (every path) ----
# D41 the interleaved rotary's first lane with the sine's sign flipped (likely:
# test_decode_attention_partial_rotary_follows_onnxruntime_... [inter=1]; the portable-vs-avx2 tests cannot see it:
# every path shares rotary())
("D41", Q, "      y[2 * j] = a * c - b * s;", "      y[2 * j] = a * c + b * s;"),
# D42 a partial rotary's first passed lane (2R) not copied (likely:
# test_decode_attention_partial_rotary_follows_onnxruntime_and_rows_do_not_depend_on_the_width)
("D42", Q, "  for (int64_t j = 2 * half; j < D; ++j) y[j] = x[j];", "  for (int64_t j = 2 * half + 1; j < D; ++j) y[j] = x[j];"),
# D43 the halves' rotary pairs lane j with lane j + D/2, not j + R (the same for a whole rotary) (likely:
# test_decode_attention_partial_rotary_follows_onnxruntime_and_rows_do_not_depend_on_the_width [inter=0])
("D43", Q, "a = x[j], b = x[j + half];", "a = x[j], b = x[j + D / 2];"),
# ---- the portable path ----
# D44 the portable scores' chains unfused (a multiply, then an add) (likely:
# test_the_portable_path_computes_the_avx2_paths_attention_bits, test_the_portable_path_computes_the_avx2_paths_q8_bits)
("D44", Q, "lanes[l] = std::fma(q[d + l], ld1(k, d + l, D), lanes[l]);", "lanes[l] = lanes[l] + q[d + l] * ld1(k, d + l, D);"),
# D45 the portable max's lanes by std::max (which passes over a NaN; AVX2's max_ps takes it) (likely:
# test_the_portable_path_takes_the_softmax_max_as_the_avx2_path_over_a_nan_score)
("D45", Q, "mv[l] = mv[l] > se[jm + l] ? mv[l] : se[jm + l];", "mv[l] = std::max(mv[l], se[jm + l]);"),
# D46 the portable window one key longer (W + 1 keys, onnxruntime before 1.32) (likely:
# test_decode_attention_window_and_softcap_... [portable], test_the_portable_path_computes_the_avx2_paths_attention_bits)
("D46", Q, "k1 = W > 0 ? std::max<int64_t>(0, kn - W) : 0,", "k1 = W > 0 ? std::max<int64_t>(0, kn - W - 1) : 0,"),
# D47 the portable path's softcap never applied (likely: test_decode_attention_window_and_softcap_... [portable],
# test_the_portable_path_computes_the_avx2_paths_attention_bits)
("D47", Q, "    if (c.a->softcap > 0.f) {\n      const float cap", "    if (c.a->softcap < 0.f) {\n      const float cap"),
# D48 the portable outputs divided by the sum, not multiplied by its inverse (likely:
# test_the_portable_path_computes_the_avx2_paths_attention_bits, test_the_portable_path_computes_the_avx2_paths_q8_bits)
("D48", Q, "for (int64_t d = 0; d < D; ++d) o[d] = acc[d] * inv;", "for (int64_t d = 0; d < D; ++d) o[d] = acc[d] / tree8(sum);"),
# D49 the portable path's own key's value read from slot split (the causal row's), not the own slot (likely:
# test_decode_attention_alternates_... [portable], test_the_portable_path_computes_the_avx2_paths_attention_bits)
("D49", Q, "const T* vr = (j < split ? V : V + shift)", "const T* vr = (j <= split ? V : V + shift)"),
# D50 the portable float16 store saturating at 65520 (which rounds to an infinity) (likely:
# test_the_portable_path_rounds_new_keys_and_values_to_float16_as_f16c [65520, 1e30 lanes],
# test_decode_attention_f16_saturates_what_float16_cannot_hold [portable])
("D50", Q, "    v = 65504.0f < v ? 65504.0f : v;", "    v = 65520.0f < v ? 65520.0f : v;"),
# D51 the portable float16 rounding's ties away from zero (likely:
# test_the_portable_path_rounds_new_keys_and_values_to_float16_as_f16c, test_decode_attention_f16_... [portable])
("D51", Q, "  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;", "  if (rest >= 0x1000u) ++h;"),
# ---- topp.cpp ----
# T1 the token crossing top-p not kept (cum < limit, not cum - v) (likely: test_native_top_p_declines_a_row_with_nan
# [100 equal weights keep 90], test_native_top_p_equals_numpys_bitwise)
("T1", T, "        if (cum - v < limit) ++k;", "        if (cum < limit) ++k;"),
# T2 a NaN in the second 4 floats of a block of 8 not seen (likely: test_native_top_p_declines_a_row_with_nan [index 37])
("T2", T, "        na |= u != u;\n        nb |= v != v;", "        na |= u != u;"),
# T3 an infinite maximum not declined (likely: test_a_row_with_nan_or_inf_is_a_typed_error [native, inf and the all -inf row])
("T3", T, "    if (nan || !std::isfinite(m)) return -1;", "    if (nan) return -1;"),
# T4 the left-out tokens' bound dropped (the total's upper bound without the tail) (likely:
# test_top_p_undecided_near_the_cut_takes_the_exact_pass [native, tail -8],
# test_top_p_whose_likeliest_tokens_hold_the_cut_between_the_totals_bounds_takes_the_exact_pass [native])
("T4", T, "        const double tail = static_cast<double>(n - count) *", "        const double tail = 0.0 *"),
# T5 the near tokens outside the likeliest ignored in the total's bounds (likely: test_native_top_p_equals_numpys_bitwise,
# test_top_p_just_past_the_likeliest_token_keeps_the_next_of_a_flat_tail [native])
("T5", T, "            const double rest = std::max(z - in_sub, 0.0);", "            const double rest = 0.0;"),
# T6 the likeliest tokens taken where they hold top-p of the lower bound only (likely:
# test_top_p_just_past_the_likeliest_token_keeps_the_next_of_a_flat_tail [native],
# test_top_p_whose_likeliest_tokens_hold_the_cut_between_the_totals_bounds_takes_the_exact_pass [native])
("T6", T, "            if (ws < top_p * hi) continue;", "            if (ws < top_p * lo) continue;"),
# T7 the cut decided at the lower bound alone (the upper bound's cut never compared) (likely:
# test_top_p_whose_likeliest_tokens_hold_the_cut_between_the_totals_bounds_takes_the_exact_pass [native, tail -8];
# the undecided test's rows never reach the comparison)
("T7", T, "            if (keep_count(sw, top_p, hi) != keep) continue;", "            if (keep_count(sw, top_p, lo) != keep) continue;"),
# T8 the descending sort not stable (ties at the cut not kept in vocabulary order) (likely:
# test_native_top_p_equals_numpys_bitwise [the row of 50 ties])
("T8", T, "            std::stable_sort(order.begin(), order.end(),", "            std::sort(order.begin(), order.end(),"),
# T9 the float64 weights without the temperature (likely: test_native_top_p_equals_numpys_bitwise [T 0.7, 0.3, 1.5],
# test_sparse_distribution_equals_the_full_sort [native])
("T9", T, "wnear[j] = std::exp((static_cast<double>(x[near[j]]) - fm) * inv_t);", "wnear[j] = std::exp(static_cast<double>(x[near[j]]) - fm);"),
]
