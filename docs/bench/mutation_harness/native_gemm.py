# session 90: edgespec/native/q4gemm.cpp's INT4 matrix kernel (G: edgespec.MatMulQ4, its AVX2, AVX-512 VNNI, AMX and
# portable paths, the activations' quantization, the epilogue, the checks and the weights' copy). Written here.
# Each mutant compiles (checked with the library's own flags before the run). Likely tests: tests/test_native.py's
# kernel tests (test_kernel_*, test_a_block_too_small..., test_a_nan_in_a_row..., test_amx_path_*, test_avx2_and_...,
# test_swiglu_kernel_*, test_bias_kernel_*, test_kernel_copies_mapped_weights_*), then its exact-kernels tests.
Q = "edgespec/native/q4gemm.cpp"
MUTANTS = [
# G1 AVX2: a block without zero points takes 7, not 8
("G1", Q, "                : _mm256_set1_epi32(c.q.minimums ? 0 : 8);", "                : _mm256_set1_epi32(c.q.minimums ? 0 : 7);"),
# G2 AVX2: the zero point's correction added, not subtracted
("G2", Q, "const __m256i corr = _mm256_sub_epi32(dot, _mm256_mullo_epi32(z,", "const __m256i corr = _mm256_add_epi32(dot, _mm256_mullo_epi32(z,"),
# G3 AVX2: the activations' scale left out of the block's product
("G3", Q, "acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(corr), _mm256_mul_ps(s, _mm256_set1_ps(c.xd[rb])), acc);", "acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(corr), s, acc);"),
# G4 AVX2: the minimums added, not taken off
("G4", Q, "return c.q.minimums ? _mm256_fnmadd_ps(mn,", "return c.q.minimums ? _mm256_fmadd_ps(mn,"),
# G5 the minimums' factor without the activations' scale (block_xsum: AVX2 and VNNI)
("G5", Q, "inline float block_xsum(const Call& c, int64_t rb) { return c.xd[rb] * float(c.xs[rb]); }", "inline float block_xsum(const Call& c, int64_t rb) { return float(c.xs[rb]); }"),
# G6 AVX-512 VNNI: a block without zero points takes 0
("G6", Q, "               : _mm512_set1_epi32(c.q.minimums ? 0 : 8);\n  scale_min16", "               : _mm512_set1_epi32(c.q.minimums ? 0 : 0);\n  scale_min16"),
# G7 AVX-512 VNNI: the zero point's correction added
("G7", Q, "const __m512i corr = _mm512_sub_epi32(dot, _mm512_mullo_epi32(q.z,", "const __m512i corr = _mm512_add_epi32(dot, _mm512_mullo_epi32(q.z,"),
# G8 VNNI and AMX: the activations' scale left out (block_fma_corrected)
("G8", Q, "return _mm512_fmadd_ps(_mm512_cvtepi32_ps(corr), _mm512_mul_ps(s, _mm512_set1_ps(c.xd[rb])), acc);", "return _mm512_fmadd_ps(_mm512_cvtepi32_ps(corr), s, acc);"),
# G9 VNNI: the minimums ignored
("G9", Q, "return c.q.minimums ? _mm512_fnmadd_ps(m, _mm512_set1_ps(block_xsum(c, rb)), acc) : acc;", "return acc;"),
# G10 AVX-512 (VNNI, AMX): k-quant scales of the first super-block for every block
("G10", Q, "    const float* d = c.q.scale + size_t((t * (c.k->nb / 8) + b / 8) * 2 * kTile);\n    *s = _mm512_mul_ps", "    const float* d = c.q.scale + size_t((t * (c.k->nb / 8)) * 2 * kTile);\n    *s = _mm512_mul_ps"),
# G11 AVX-512: a k-quant block's minimum scaled by the scales' d, not dmin
("G11", Q, "        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kTile)))),\n        _mm512_loadu_ps(d + kTile));", "        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kTile)))),\n        _mm512_loadu_ps(d));"),
# G12 AVX-512: float minimums read as zeros
("G12", Q, "*m = c.q.mn ? _mm512_loadu_ps(c.q.mn + sb) : _mm512_setzero_ps();", "*m = _mm512_setzero_ps();"),
# G13 AVX2: a k-quant tile's second half takes the first half's d
("G13", Q, "const float* d = c.q.scale + size_t((t * (c.k->nb / 8) + b / 8) * 2 * kTile) + 8 * h;", "const float* d = c.q.scale + size_t((t * (c.k->nb / 8) + b / 8) * 2 * kTile);"),
# G14 AVX2: float minimums of the tile's first half for both halves
("G14", Q, "*m = c.q.mn ? _mm256_loadu_ps(c.q.mn + sb + 8 * h)", "*m = c.q.mn ? _mm256_loadu_ps(c.q.mn + sb)"),
# G15 exp8 (SwiGLU on the x86 paths): a coefficient rounded
("G15", Q, "y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));", "y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0e-1f));"),
# G16 exp8: the clamp at -88 (underflows to 0 where the portable path gives 2^-126 x y)
("G16", Q, "x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));", "x = _mm256_max_ps(x, _mm256_set1_ps(-88.0f));"),
# G17 swiglu8: the sigmoid's halves swapped
("G17", Q, "_mm256_blendv_ps(_mm256_mul_ps(e, r), r,", "_mm256_blendv_ps(r, _mm256_mul_ps(e, r),"),
# G18 swiglu8: an approximate reciprocal
("G18", Q, "const __m256 r = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));", "const __m256 r = _mm256_rcp_ps(_mm256_add_ps(_mm256_set1_ps(1.0f), e));"),
# G19 finish16: a whole tile's bias not added
("G19", Q, "_mm256_storeu_ps(y + 8 * h, _mm256_add_ps(x, _mm256_loadu_ps(c.bias + n0 + 8 * h)));", "_mm256_storeu_ps(y + 8 * h, x);"),
# G20 finish16: a whole tile's gate and up swapped
("G20", Q, "t % 2 == 0 ? x : swiglu8(_mm256_loadu_ps(y + 8 * h), x)", "t % 2 == 0 ? x : swiglu8(x, _mm256_loadu_ps(y + 8 * h))"),
# G21 finish16: a partial tile's bias read from the bias's start
("G21", Q, "std::memcpy(b, c.bias + n0, size_t(cols) * sizeof(float));", "std::memcpy(b, c.bias, size_t(cols) * sizeof(float));"),
# G22 finish16: a SwiGLU tile's columns one tile off for the up projection
("G22", Q, "  const int64_t n0 = (k.swiglu ? t / 2 : t) * kTile, cols = std::min<int64_t>(kTile, k.N - n0);\n  float* y = c.y + r * k.N + n0;\n  if (cols == kTile) {", "  const int64_t n0 = (k.swiglu ? (t + 1) / 2 : t) * kTile, cols = std::min<int64_t>(kTile, k.N - n0);\n  float* y = c.y + r * k.N + n0;\n  if (cols == kTile) {"),
# G23 VNNI, up to 2 rows: the high nibbles' chain not added
("G23", Q, "        for (int r = 0; r < R; ++r) dot[r] = _mm512_add_epi32(dot[r], dot2[r]);", "        for (int r = 0; r < R; ++r) dot[r] = dot[r];"),
# G24 VNNI, up to 2 rows: the high nibbles multiplied by the low activations
("G24", Q, "dot2[r] = _mm512_dpbusd_epi32(dot2[r], hi, _mm512_set1_epi32(bq));", "dot2[r] = _mm512_dpbusd_epi32(dot2[r], hi, _mm512_set1_epi32(a));"),
# G25 VNNI, 3+ rows: the same
("G25", Q, "            dot[r] = _mm512_dpbusd_epi32(dot[r], hi, _mm512_set1_epi32(bq));", "            dot[r] = _mm512_dpbusd_epi32(dot[r], hi, _mm512_set1_epi32(a));"),
# G26 VNNI: every row of a pass reads the pass's first row
("G26", Q, "xb[r] = c.xq + (r0 + r) * k.K + b * k.block;\n      for (int64_t p = 0; p < P; ++p) {\n        // the line", "xb[r] = c.xq + (r0) * k.K + b * k.block;\n      for (int64_t p = 0; p < P; ++p) {\n        // the line"),
# G27 VNNI: a partial tile's last column not stored
("G27", Q, "const __mmask16 mask = __mmask16((1u << cols) - 1u);", "const __mmask16 mask = __mmask16((1u << (cols - 1)) - 1u);"),
# G28 VNNI: a pass past the first 8 rows takes the first rows' activation scales
("G28", Q, "acc[r] = block_fma(c, q, dot[r], (r0 + r) * nb + b, acc[r]);", "acc[r] = block_fma(c, q, dot[r], r * nb + b, acc[r]);"),
# G29 AVX2 one row: the halves' dots swapped
("G29", Q, "acc[r][h] = block_fma8(c, z, s, mn, dot[r][h], rb, acc[r][h]);", "acc[r][h] = block_fma8(c, z, s, mn, dot[r][1 - h], rb, acc[r][h]);"),
# G30 AVX2 one row: eight groups' int16 sums before widening (they can wrap)
("G30", Q, "    for (int64_t p0 = 0; p0 < P; p0 += 4) {  // four groups a batch (a block of 8 * (4n + 1..3): fewer in its last)\n      const int64_t pe = std::min<int64_t>(P, p0 + 4);", "    for (int64_t p0 = 0; p0 < P; p0 += 8) {  // four groups a batch (a block of 8 * (4n + 1..3): fewer in its last)\n      const int64_t pe = std::min<int64_t>(P, p0 + 8);"),
# G31 AVX2 2+ rows: the second half reads the first half's weights
("G31", Q, "      const uint8_t* g = wp + 32 * h;", "      const uint8_t* g = wp;"),
# G32 AVX2 2+ rows: a block's last groups (8 x (4n + 1..3)) not widened into its dots
("G32", Q, "        for (; p < P; ++p) half_group<R>(g + p * 64, xb, p, lo4, s16, ahead ? ahead + p * 64 : nullptr);\n        widen_half<R>(s16, dot);", "        for (; p < P; ++p) half_group<R>(g + p * 64, xb, p, lo4, s16, ahead ? ahead + p * 64 : nullptr);"),
# G33 AVX2 2+ rows: a partial tile's last column not stored
("G33", Q, "std::memcpy(y, tmp, size_t(cols) * sizeof(float));", "std::memcpy(y, tmp, size_t(cols - 1) * sizeof(float));"),
# G34 AVX2 2+ rows: a batch's widened sums replace the block's dots
("G34", Q, "_mm256_store_si256(d, _mm256_add_epi32(_mm256_load_si256(d), _mm256_madd_epi16(s16[r], ones)));", "_mm256_store_si256(d, _mm256_madd_epi16(s16[r], ones));"),
# G35 AVX2 2+ rows: the high nibbles multiplied by the low activations
("G35", Q, "_mm256_maddubs_epi16(hi, _mm256_set1_epi32(bq)));\n    s16[r] = ", "_mm256_maddubs_epi16(hi, _mm256_set1_epi32(a)));\n    s16[r] = "),
# G36 AMX: a block without zero points takes 7
("G36", Q, "                           : _mm512_set1_epi32(c.q.minimums ? 0 : 8);\n  const __m512i zb", "                           : _mm512_set1_epi32(c.q.minimums ? 0 : 7);\n  const __m512i zb"),
# G37 AMX: the high nibbles written over the low ones
("G37", Q, "_mm512_store_si512(reinterpret_cast<void*>(w + p * 128 + 64),", "_mm512_store_si512(reinterpret_cast<void*>(w + p * 128),"),
# G38 AMX: the zero point taken off one byte of a column's four
("G38", Q, "_mm512_mullo_epi32(z, _mm512_set1_epi32(0x01010101))", "_mm512_mullo_epi32(z, _mm512_set1_epi32(0x00000001))"),
# G39 AMX: the minimums added
("G39", Q, "v[j] = _mm512_fnmadd_ps(mj[p * G + j], xsum, v[j]);", "v[j] = _mm512_fmadd_ps(mj[p * G + j], xsum, v[j]);"),
# G40 AMX: the activations' scale left out
("G40", Q, "const __m512 d = _mm512_set1_ps(xd[rb]);", "const __m512 d = _mm512_set1_ps(1.0f);"),
# G41 AMX: a second block's scales read at the first's place where a group has fewer than 4 tiles
("G41", Q, "sj[i] = s[(i / G) * 4 + i % G], mj[i] = m[(i / G) * 4 + i % G];", "sj[i] = s[i], mj[i] = m[i];"),
# G42 AMX, several chunks: a last block of an even count left out
("G42", Q, "const int P = b + 1 < nb ? 2 : 1;", "const int P = b + 2 < nb ? 2 : 1;"),
# G43 AMX, several chunks: a group's sums only half cleared
("G43", Q, "std::fill(acc, acc + c.M * 4 * kTile, 0.f);", "std::fill(acc, acc + c.M * 2 * kTile, 0.f);"),
# G44 AMX, several chunks: a group's fourth tile multiplied by the third's weights
("G44", Q, "_tile_loadd(5, ws + 3 * wstride, 64);", "_tile_loadd(5, ws + 2 * wstride, 64);"),
# G45 AMX, one chunk: every block read from the first buffer
("G45", Q, "const uint8_t* wb = buf.w + (b & 1) * 2 * wstride;", "const uint8_t* wb = buf.w;"),
# G46 AMX, one chunk: the second tile step takes the first step's activations
("G46", Q, "_tile_loadd(3, xa + ks, k.block);", "_tile_loadd(3, xa, k.block);"),
# G47 AMX, one chunk: the first block's scales for every block
("G47", Q, "if (ch == 0) amx_block_scales(c, G, t, b, s, m);", "if (b == 0) amx_block_scales(c, G, t, b, s, m);"),
# G48 AMX: a one-chunk call takes the pairs path at any block (it takes two tile steps a block at most)
("G48", Q, "if (c.chunks == 1 && c.k->block / c.k->kstep <= 2)", "if (c.chunks == 1)"),
# G49 AMX from 6 rows at block 32 (the same bits: only the path's count)
("G49", Q, "return block >= 128 ? kAmxMinRows : block >= 64 ? 6 : 8;", "return block >= 128 ? kAmxMinRows : block >= 64 ? 6 : 6;"),
# G50 AMX: a zero point of 128 leaves the call to VNNI
("G50", Q, "*std::max_element(z, z + tile_blocks * kTile) <= kAmxMaxZero", "*std::max_element(z, z + tile_blocks * kTile) < kAmxMaxZero"),
# G51 x86 quantization: truncation, not rounding to nearest
("G51", Q, "__m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j), vinv));", "__m256i v = _mm256_cvttps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j), vinv));"),
# G52 x86 quantization: the scale over 128
("G52", Q, "    const float scale = amax / 127.f, inv = 127.f / amax <= std::numeric_limits<float>::max() ? 127.f / amax : 0.f;\n    const __m256 vinv", "    const float scale = amax / 128.f, inv = 127.f / amax <= std::numeric_limits<float>::max() ? 127.f / amax : 0.f;\n    const __m256 vinv"),
# G53 x86 quantization: a NaN block keeps its scale
("G53", Q, "d[b] = _mm256_movemask_ps(nan) ? std::numeric_limits<float>::quiet_NaN() : scale;", "d[b] = scale;"),
# G54 x86 quantization: the activations' sum of the last 8 only
("G54", Q, "sum = _mm256_add_epi32(sum, v);", "sum = v;"),
# G55 portable quantization: truncation
("G55", Q, "const int32_t v = std::min(127, std::max(-127, cvt_nearest(xb[j] * inv)));", "const int32_t v = std::min(127, std::max(-127, int32_t(xb[j] * inv)));"),
# G56 portable: an unfused multiply-add
("G56", Q, "acc[i] = std::fma(float(corr), s[i] * xd, acc[i]);", "acc[i] += float(corr) * (s[i] * xd);"),
# G57 portable: minimums with a zero point of 8
("G57", Q, "z[i] = c.q.zp ? int32_t(c.q.zp[sb + i]) : c.q.minimums ? 0 : 8;", "z[i] = c.q.zp ? int32_t(c.q.zp[sb + i]) : 8;"),
# G58 portable: a k-quant minimum scaled by d
("G58", Q, "m[i] = float(ks[kTile + i]) * kd[kTile + i];", "m[i] = float(ks[kTile + i]) * kd[i];"),
# G59 portable: the high nibbles by the low activations
("G59", Q, "hi += int32_t(g[4 * i + j] >> 4) * x[4 + j];", "hi += int32_t(g[4 * i + j] >> 4) * x[j];"),
# G60 portable: gate and up swapped
("G60", Q, "t % 2 == 0 ? v[i] : swiglu_portable(y[i], v[i]);", "t % 2 == 0 ? v[i] : swiglu_portable(v[i], y[i]);"),
# G61 portable exp: the clamp at -88
("G61", Q, "x = x > -87.0f ? x : -87.0f;", "x = x > -88.0f ? x : -88.0f;"),
# G62 a K that is no multiple of the block accepted
("G62", Q, "k->block < 8 || k->block % 8 || k->K % k->block)", "k->block < 8 || k->block % 8)"),
# G63 a last partial tile of columns not computed
("G63", Q, "k->tiles = (k->N + kTile - 1) / kTile * (k->swiglu ? 2 : 1);", "k->tiles = k->N / kTile * (k->swiglu ? 2 : 1);"),
# G64 zero points of the wrong size accepted
("G64", Q, "if (Z && numel(dims_of(Z)) != tile_blocks * kTile)", "if (false && Z && numel(dims_of(Z)) != tile_blocks * kTile)"),
# G65 a bias given to a SwiGLU kernel accepted
("G65", Q, "if (bias && (numel(dims_of(bias)) != k->N || k->swiglu))", "if (bias && (numel(dims_of(bias)) != k->N))"),
# G66 SwiGLU: a task's tiles can end between a gate's tile and its up projection's
("G66", Q, "if (k->swiglu) c.chunk += c.chunk & 1;", "if (k->swiglu) c.chunk += 0;"),
# G67 AMX: every row's activations copied into the first row of its block
("G67", Q, "std::memcpy(q.xa + (b * q.mp + m) * k.block, row + b * k.block, size_t(k.block));", "std::memcpy(q.xa + (b * q.mp) * k.block, row + b * k.block, size_t(k.block));"),
# G68 the weights' copy: k-quant scales pointed at the scales
("G68", Q, "k->own_ks = ks ? p + wb + sb + zb + mb : nullptr;", "k->own_ks = ks ? p + wb : nullptr;"),
# G69 the weights' copy: zero points pointed at the weights
("G69", Q, "k->own_z = z ? p + wb + sb : nullptr;", "k->own_z = z ? p : nullptr;"),
# G70 AMX: a partial tile's last column not stored
("G70", Q, "_mm512_mask_storeu_ps(c.y + r * c.k->N + n0, __mmask16((1u << cols) - 1u),", "_mm512_mask_storeu_ps(c.y + r * c.k->N + n0, __mmask16((1u << (cols - 1)) - 1u),"),
# G71 AVX2 one row: a partial tile's last column not stored
("G71", Q, "      std::memcpy(c.y + (r0 + r) * k.N + n0, v, size_t(cols) * sizeof(float));", "      std::memcpy(c.y + (r0 + r) * k.N + n0, v, size_t(cols - 1) * sizeof(float));"),
# G72 VNNI: the activations' L2 prefetch dropped from every call (speed only: the same bits)
("G72", Q, "        if constexpr (R <= kPrefetchL2Rows)\n          _mm_prefetch", "        if constexpr (R < 0)\n          _mm_prefetch"),
]
