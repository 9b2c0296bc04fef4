// edgespec's top-p cut in one call (edgespec.sampling._top_p_near, the same rule and numbers; sums
// in another order and glibc's float32 exp, so a cut within rounding of a boundary may differ).
//
// numpy computes it in ~25 calls over small arrays; right after session.run each call runs with
// cold caches (README, "Sampling"), so one call here is most of sampling's time saved. Portable
// C++17, no intrinsics: built with g++ on first use, numpy's path where it cannot be.
//
// The rule: only the tokens whose weight exp((x - max) / T) is at least eps / n are weighed, so
// all the others together weigh under eps (the maximum weighs 1); a float32 exp sizes them, a
// float64 one (the C library's exp, as numpy's float64 exp on CPUs without AVX-512) weighs the
// likeliest; the cut is decided only when it is the same at both ends of the total's range.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

namespace {

typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));

inline v4f load4(const float* p) {
    v4f v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

inline bool any(v4i c) {  // a lane of a comparison set
    uint64_t lo, hi;
    std::memcpy(&lo, &c, 8);
    std::memcpy(&hi, reinterpret_cast<const char*>(&c) + 8, 8);
    return (lo | hi) != 0;
}

int64_t keep_count(const std::vector<double>& sw, double top_p, double total) {
    // numpy: max(count_nonzero(cumsum(sw) - sw < top_p * total), 1)
    const double limit = top_p * total;
    double cum = 0.0;
    int64_t k = 0;
    for (double v : sw) {
        cum += v;
        if (cum - v < limit) ++k;
    }
    return std::max<int64_t>(k, 1);
}

}  // namespace

// x: n float32 logits. Returns the number of kept tokens, written in vocabulary order to idx and w
// (their float64 weights, the maximum's 1); 0: undecided (the caller takes the exact pass over
// every token; also where more than near_max tokens are near the maximum); -1: the row has a NaN or
// an infinite maximum, or more than cap tokens are kept (the caller's numpy path).
extern "C" __attribute__((visibility("default"))) int64_t es_top_p(
    const float* x, int64_t n, double temperature, double top_p, const double* eps, int64_t neps,
    int64_t near_max, int64_t* idx, double* w_out, int64_t cap) {
    if (n <= 0) return -1;
    // the maximum, and whether a NaN is in the row, 8 floats a step in two 4-lane vectors (GCC/Clang
    // vector extensions: SIMD on any target without intrinsics; 16-byte vectors, the baseline's width)
    v4f a, b;
    v4i na = {0, 0, 0, 0}, nb = {0, 0, 0, 0};
    for (int l = 0; l < 4; ++l) a[l] = b[l] = x[0];
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const v4f u = load4(x + i), v = load4(x + i + 4);
        a = u > a ? u : a;
        b = v > b ? v : b;
        na |= u != u;
        nb |= v != v;
    }
    float m = x[0];
    bool nan = any(na | nb);
    for (int l = 0; l < 4; ++l) {
        m = a[l] > m ? a[l] : m;
        m = b[l] > m ? b[l] : m;
    }
    for (; i < n; ++i) {
        m = x[i] > m ? x[i] : m;
        nan |= x[i] != x[i];
    }
    if (nan || !std::isfinite(m)) return -1;  // numpy's path says what is wrong with the row
    const double inv_t = 1.0 / temperature, fm = static_cast<double>(m);
    const float m32 = m, inv_t32 = static_cast<float>(inv_t);
    static const double gaps[] = {7.0, 14.0, 28.0, INFINITY};
    // kept between calls (per thread): no allocation, no fresh pages a token
    static thread_local std::vector<int64_t> slots, sub, order;
    static thread_local std::vector<float> e;
    static thread_local std::vector<double> w, sw, wnear;
    for (int64_t k = 0; k < neps; ++k) {
        const float thr = static_cast<float>(fm - std::log(static_cast<double>(n) / eps[k]) * temperature);
        if (static_cast<int64_t>(slots.size()) < n) slots.resize(n);  // grows once, never shrinks
        int64_t* near = slots.data();
        e.clear();
        const v4f t = {thr, thr, thr, thr};
        int64_t j = 0, count = 0;
        for (; j + 16 <= n; j += 16)  // 16 at a time: most blocks have no token near the maximum
            if (any((load4(x + j) >= t) | (load4(x + j + 4) >= t) | (load4(x + j + 8) >= t) | (load4(x + j + 12) >= t)))
                for (int64_t q = j; q < j + 16; ++q) {  // branch-free: a near token's place is kept
                    near[count] = q;
                    count += x[q] >= thr;
                }
        for (; j < n; ++j) {
            near[count] = j;
            count += x[j] >= thr;
        }
        if (count > near_max) return 0;  // a flat row: the exact pass is cheaper
        double z = 0.0;
        for (int64_t q = 0; q < count; ++q) {
            e.push_back(std::exp((x[near[q]] - m32) * inv_t32));
            z += e.back();
        }
        wnear.assign(count, -1.0);  // float64 weights, computed when first needed
        // each left-out token is below thr, so weighs under exp((thr - m) / T)
        const double tail = static_cast<double>(n - count) *
                            std::exp((static_cast<double>(thr) - fm) * inv_t) * (1 + 1e-9);
        // the likeliest first, widened while a token outside them could be inside the cut or the
        // cut is not the same at both ends of the total's range (the float32 weights outside them)
        for (double gap : gaps) {
            const float floor_e = std::isinf(gap) ? -1.0f : static_cast<float>(std::exp(-gap));
            sub.clear();
            w.clear();
            double in_sub = 0.0, ws = 0.0;
            for (int64_t j = 0; j < count; ++j) {
                if (e[j] < floor_e) continue;
                if (wnear[j] < 0) wnear[j] = std::exp((static_cast<double>(x[near[j]]) - fm) * inv_t);
                sub.push_back(near[j]);
                w.push_back(wnear[j]);
                ws += w.back();
                in_sub += e[j];
            }
            const double rest = std::max(z - in_sub, 0.0);  // float32 weights: within 1e-4
            const double lo = ws + rest * (1 - 1e-4), hi = ws + rest * (1 + 1e-4) + tail;
            if (ws < top_p * hi) continue;
            order.resize(sub.size());
            std::iota(order.begin(), order.end(), 0);
            // a stable sort by descending weight: ties in vocabulary order (sampling._first)
            std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) { return w[p] > w[q]; });
            sw.clear();
            for (int64_t j : order) sw.push_back(w[j]);
            const int64_t keep = keep_count(sw, top_p, lo);
            if (keep_count(sw, top_p, hi) != keep) continue;
            if (keep > cap) return -1;
            std::sort(order.begin(), order.begin() + keep);
            for (int64_t j = 0; j < keep; ++j) {
                idx[j] = sub[order[j]];
                w_out[j] = w[order[j]];
            }
            return keep;
        }
    }
    return 0;
}
