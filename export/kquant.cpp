// llama.cpp's Q4_K quantizer for ``--quant-algo q4_k`` and the tensors ``--quant-algo gguf`` rounds
// (export/gguf_blocks.py, k4_blocks): ``quantize_row_q4_K_ref`` and the ``make_qkx2_quants`` it calls, from
// ggml/src/ggml-quants.c (MIT, the ggml authors), transcribed statement by statement in float32 so that the
// blocks are those llama.cpp writes for the same floats (tests/test_gguf_blocks.py compares the bytes with
// llama.cpp's own function where its build is present). Built with edgespec's flags (-O3, -ffp-contract=off,
// no -m flags: no fused multiply-adds, sums in the C code's order), as ggml-base is built.
//
// Instead of block_q4_K's packed bytes it writes what edgespec's graphs hold: per block of 32 the float scale
// d x sc and minimum dmin x m (exact float32 products of a float16 and a 6-bit integer) and the 32 integers,
// one a byte (0 where a block's scale is 0: its weights are minus its minimum whatever they hold, where llama.cpp
// leaves make_qkx2_quants' integers in them; the weights are the same).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace {

constexpr int QK_K = 256;

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ggml_compute_fp32_to_fp16 / fp16_to_fp32 (ggml-impl.h: round to nearest even, as F16C converts)
uint16_t fp32_to_fp16(float f) {
  const float scale_to_inf = float_of(0x77800000u);
  const float scale_to_zero = float_of(0x08800000u);
  float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = bits_of(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = float_of((bias >> 1) + 0x07800000u) + base;
  const uint32_t b = bits_of(base);
  const uint32_t exp_bits = (b >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = b & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return uint16_t((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}
float fp16_to_fp32(uint16_t h) {
  const uint32_t w = uint32_t(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const uint32_t exp_offset = 0xE0u << 23;
  const float exp_scale = float_of(0x7800000u);
  const float normalized_value = float_of((two_w >> 4) + exp_offset) * exp_scale;
  const uint32_t magic_mask = 126u << 23;
  const float magic_bias = 0.5f;
  const float denormalized_value = float_of((two_w >> 17) | magic_mask) - magic_bias;
  const uint32_t denormalized_cutoff = 1u << 27;
  const uint32_t result = sign | (two_w < denormalized_cutoff ? bits_of(denormalized_value) : bits_of(normalized_value));
  return float_of(result);
}

inline int nearest_int(float fval) {
  float val = fval + 12582912.f;
  int i;
  std::memcpy(&i, &val, sizeof(int));
  return (i & 0x007fffff) - 0x00400000;
}

// make_qkx2_quants(n, nmax, x, weights, L, &the_min, Laux, rmin, rdelta, nstep, use_mad = false)
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                       uint8_t* Laux, float rmin, float rdelta, int nstep) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    int l = nearest_int(iscale * (x[i] - min));
    L[i] = uint8_t(std::max(0, std::min(nmax, l)));
    float diff = scale * L[i] + min - x[i];
    diff = diff * diff;
    float w = weights[i];
    best_error += w * diff;
  }
  if (nstep < 1) {
    *the_min = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      int l = nearest_int(iscale * (x[i] - min));
      l = std::max(0, std::min(nmax, l));
      Laux[i] = uint8_t(l);
      float w = weights[i];
      sum_l += w * l;
      sum_l2 += w * l * l;
      sum_xl += w * l * x[i];
    }
    float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * Laux[i] + this_min - x[i];
        diff = diff * diff;
        float w = weights[i];
        cur_error += w * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// quantize_row_q4_K_ref for one row of k floats (k a multiple of 256): per block of 32 its float scale and
// minimum (sb, mb: d x ls and dmin x lm, the float16 and 6-bit bytes ggml packs, multiplied out) and integers (q)
void quantize_row(const float* x, int64_t k, float* sb, float* mb, uint8_t* q) {
  const int64_t nb = k / QK_K;
  uint8_t L[QK_K];
  uint8_t Laux[32];
  float weights[32];
  float mins[QK_K / 32];
  float scales[QK_K / 32];
  for (int64_t i = 0; i < nb; i++) {
    float max_scale = 0;
    float max_min = 0;
    for (int j = 0; j < QK_K / 32; ++j) {
      float sum_x2 = 0;
      for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
      float av_x = std::sqrt(sum_x2 / 32);
      for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
      scales[j] = make_qkx2_quants(32, 15, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -1.f, 0.1f, 20);
      if (scales[j] > max_scale) max_scale = scales[j];
      if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    const float d = fp16_to_fp32(fp32_to_fp16(max_scale / 63.f));
    const float dmin = fp16_to_fp32(fp32_to_fp16(max_min / 63.f));
    for (int j = 0; j < QK_K / 32; ++j) {
      uint8_t ls = uint8_t(nearest_int(inv_scale * scales[j]));
      uint8_t lm = uint8_t(nearest_int(inv_min * mins[j]));
      if (ls > 63) ls = 63;
      if (lm > 63) lm = 63;
      const float dj = d * ls;
      const float dm = dmin * lm;
      sb[8 * i + j] = dj;
      mb[8 * i + j] = dm;
      uint8_t* qj = q + QK_K * i + 32 * j;
      if (!dj) {
        std::memset(qj, 0, 32);
        continue;
      }
      for (int ii = 0; ii < 32; ++ii) {
        int l = nearest_int((x[32 * j + ii] + dm) / dj);
        qj[ii] = uint8_t(std::max(0, std::min(15, l)));
      }
    }
    x += QK_K;
  }
}

}  // namespace

// rows x k floats (k a multiple of 256) -> scale, minimum [rows][k/32] (float32) and q [rows][k] (0..15), the
// rows split over ``threads`` threads (each row's numbers do not depend on the split)
extern "C" __attribute__((visibility("default"))) void es_quantize_q4_k(const float* x, int64_t rows, int64_t k,
                                                                        float* scale, float* minimum, uint8_t* q,
                                                                        int threads) {
  auto work = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      quantize_row(x + r * k, k, scale + r * (k / 32), minimum + r * (k / 32), q + r * k);
  };
  if (threads < 2 || rows < 2) return work(0, rows);
  const int64_t n = std::min<int64_t>(threads, rows);
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < n; ++t) pool.emplace_back(work, rows * t / n, rows * (t + 1) / n);
  for (auto& th : pool) th.join();
}
