// edgespec's width-invariant INT4 matrix multiply for onnxruntime's CPU execution provider.
//
// Y[M, N] = A[M, K] x dequant(B)^T with MatMulNBits' 4-bit quantization (per (column, block of K) a
// float scale and a 4-bit zero point, 8 when absent), its weights stored in this kernel's layout by
// `edgespec exact-kernels` (edgespec_export/kernels.py, pack_q4), so nothing is repacked or copied at
// load: columns in tiles of 16, and per (tile, block)
//   B:      block/8 groups of 64 bytes, byte 4i+j of group p = w[16t+i][8p+j] | w[16t+i][8p+4+j] << 4
//   scales: 16 floats, zero points: 16 bytes (one per column; columns past N have scale 0).
// Activations are quantized to int8 per row and block (symmetric, round to nearest even; the
// reductions over a block are a max and an integer sum, exact in any order); each block's dot product is exact int32
// (AVX-512 VNNI, or AVX2's u8 x s8 pair products, exact in int16 for up to four 8-byte groups, widened to
// int32); the float accumulation over blocks runs in block order, one chain per (row, column), with the
// same operations per lane on both paths (convert, multiply, fused multiply-add).
// So a row's result does not depend on how many rows the call has, nor on how columns are split over
// threads, nor on which of the two instruction sets computed it: a one-token call computes what a wider
// call computes for the same row, which lets edgespec decode one token at a time and stay
// token-identical to speculative verification.
//
// The path is chosen when the library is registered: AVX-512 VNNI where the CPU has it, else AVX2 + FMA;
// on a CPU with AMX-INT8 (and the kernel's permission to use its tiles), calls of amx_min_rows rows or more (4 at
// block 128) compute the block dots with AMX tile multiplies instead (TDPBSSD: exact int32 sums as well, then the same
// float chain per lane), which makes the extra rows of a verify or prefill call cheap where VNNI pays for
// each. EDGESPEC_Q4_ISA=avx2 forces the AVX2 path, =avx512 the AVX-512 VNNI path without AMX (to compare
// the paths on one machine).
//
// The ABI below is declared here (the onnxruntime C API is append-only and versioned): only the
// functions used are named, by their position in OrtApi.
#if defined(__x86_64__) || defined(__i386__)
#define ES_X86 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define ES_X86 0
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#include <sys/auxv.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <mutex>

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

extern "C" {
struct OrtStatus;
struct OrtValue;
struct OrtKernelInfo;
struct OrtKernelContext;
struct OrtSessionOptions;
struct OrtCustomOpDomain;
struct OrtTensorTypeAndShapeInfo;
struct OrtApi {
  void* fn[300];
};
struct OrtApiBase {
  const OrtApi* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)();
};
struct OrtCustomOp {
  uint32_t version;
  void* (*CreateKernel)(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo*);
  const char* (*GetName)(const OrtCustomOp*);
  const char* (*GetExecutionProviderType)(const OrtCustomOp*);
  int (*GetInputType)(const OrtCustomOp*, size_t);
  size_t (*GetInputTypeCount)(const OrtCustomOp*);
  int (*GetOutputType)(const OrtCustomOp*, size_t);
  size_t (*GetOutputTypeCount)(const OrtCustomOp*);
  void (*KernelCompute)(void*, OrtKernelContext*);
  void (*KernelDestroy)(void*);
  int (*GetInputCharacteristic)(const OrtCustomOp*, size_t);
  int (*GetOutputCharacteristic)(const OrtCustomOp*, size_t);
  int (*GetInputMemoryType)(const OrtCustomOp*, size_t);
  int (*GetVariadicInputMinArity)(const OrtCustomOp*);
  int (*GetVariadicInputHomogeneity)(const OrtCustomOp*);
  int (*GetVariadicOutputMinArity)(const OrtCustomOp*);
  int (*GetVariadicOutputHomogeneity)(const OrtCustomOp*);
  OrtStatus* (*CreateKernelV2)(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo*, void**);  // version 16
  OrtStatus* (*KernelComputeV2)(void*, OrtKernelContext*);
  void* InferOutputShapeFn;  // version 17
  int (*GetStartVersion)(const OrtCustomOp*);
  int (*GetEndVersion)(const OrtCustomOp*);
};
OrtStatus* RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base);
}

namespace {

// positions in OrtApi (stable since API version 1, ParallelFor since 17)
enum : int {
  kCreateStatus = 0,
  kCreateCustomOpDomain = 26,
  kCustomOpDomainAdd = 27,
  kAddCustomOpDomain = 28,
  kGetTensorMutableData = 51,
  kGetDimensionsCount = 61,
  kGetDimensions = 62,
  kGetTensorTypeAndShape = 65,
  kKernelInfoGetAttributeFloat = 85,
  kKernelInfoGetAttributeInt64 = 86,
  kKernelContextGetInputCount = 88,
  kKernelContextGetInput = 90,
  kKernelContextGetOutput = 91,
  kReleaseStatus = 93,
  kReleaseTensorTypeAndShapeInfo = 99,
  kKernelContextParallelFor = 274,
};
constexpr int kFloat = 1, kUint8 = 2, kInt8 = 3, kInt32 = 6, kInt64 = 7, kFloat16 = 10;  // ONNXTensorElementDataType
constexpr int kRequired = 0, kOptional = 1;

// The globals are set at each session's registration (RegisterCustomOps), which onnxruntime may run while another
// session's kernels are being made or run: atomics, each stored once with its final value (no data race, no
// transient value between two stores)
std::atomic<const OrtApi*> g_api{nullptr};
std::atomic<bool> g_parallel{false};
std::atomic<bool> g_avx512{false};  // the path kernels created from now on take (set at registration)
std::atomic<bool> g_portable{!ES_X86};  // ... or the portable one (off x86-64 the only one; EDGESPEC_Q4_ISA=portable on it)
std::atomic<bool> g_amx{false};     // and whether calls of amx_min_rows rows or more take the AMX one
std::atomic<bool> g_hugepages{true};  // whether kernels copy their weights onto 2 MiB pages (own_weights)
std::atomic<bool> g_attn_quads{true};  // DecodeAttention's AVX-512 path: four queries a tile (false: pairs, the same bits)
std::atomic<uint64_t> g_amx_calls{0};  // MatMulQ4 calls that took an AMX path (edgespec_q4_amx_calls: tests)
// attention calls by the path they took: 0 AVX2's 8 lanes, 1 AVX-512's 16, 2 the portable one (edgespec_attn_calls:
// the tests check that the path they compare ran; static storage: zeros)
std::atomic<uint64_t> g_attn_calls[3];

// the AMX path needs a compiler that knows its instructions (GCC 11, clang 12): an older one (Ubuntu 20.04's GCC 9,
// RHEL 8's GCC 8) builds the library without it, the AVX-512 VNNI path then taking those calls (the same bits);
// -DES_NO_AMX builds it so anywhere (the tests' check of this switch)
#if ES_X86 && !defined(ES_NO_AMX) && \
    ((defined(__clang__) && __clang_major__ >= 12) || (!defined(__clang__) && __GNUC__ >= 11))
#define ES_AMX_BUILT 1
#else
#define ES_AMX_BUILT 0
#endif

#if ES_X86
#define ES_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c")))
#define ES_AVX2 __attribute__((target("avx2,fma,f16c")))
#endif
#if ES_AMX_BUILT
#define ES_AMX __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c,amx-tile,amx-int8")))
#endif

template <typename F>
F api(int i) { return reinterpret_cast<F>(g_api.load(std::memory_order_relaxed)->fn[i]); }

OrtStatus* fail(const char* msg) { return api<OrtStatus* (*)(int, const char*)>(kCreateStatus)(2, msg); }  // ORT_INVALID_ARGUMENT

bool ok(OrtStatus* s) {
  if (!s) return true;
  api<void (*)(OrtStatus*)>(kReleaseStatus)(s);
  return false;
}

std::vector<int64_t> dims_of(const OrtValue* v) {
  OrtTensorTypeAndShapeInfo* info = nullptr;
  std::vector<int64_t> d;
  if (!ok(api<OrtStatus* (*)(const OrtValue*, OrtTensorTypeAndShapeInfo**)>(kGetTensorTypeAndShape)(v, &info))) return d;
  size_t n = 0;
  api<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, size_t*)>(kGetDimensionsCount)(info, &n);
  d.resize(n);
  if (n) api<OrtStatus* (*)(const OrtTensorTypeAndShapeInfo*, int64_t*, size_t)>(kGetDimensions)(info, d.data(), n);
  api<void (*)(OrtTensorTypeAndShapeInfo*)>(kReleaseTensorTypeAndShapeInfo)(info);
  return d;
}

void* data_of(const OrtValue* v) {
  void* p = nullptr;
  ok(api<OrtStatus* (*)(OrtValue*, void**)>(kGetTensorMutableData)(const_cast<OrtValue*>(v), &p));
  return p;
}

constexpr int kTile = 16;  // output columns a vector holds

// AMX: rows a tile multiply takes at once (a tile's most)
constexpr int kAmxRows = 16;
// AMX multiplies signed activations by signed weights less their zero point (w - z, in -128..15), so it
// takes zero points of up to 128 only; MatMulNBits' are 4-bit (0..15). A kernel given larger ones (never
// seen) computes every width on the VNNI path
constexpr int kAmxMaxZero = 128;
// the fewest rows a call has for its block dots to be AMX tile multiplies (amx_min_rows: by block size). AMX has to
// unpack each weight tile into memory first, and stores its sums after every block; the VNNI path loads and
// splits each 64-byte group once for up to 8 rows but pays a VPDPBUSD pair per row and group (one a cycle on
// the Xeon: compute-bound from ~6 rows). Until session 21 AMX started at 9 rows. Since its unpacking prefetches
// the weights into L2 and the scales, and the one-chunk path unpacks the next block during this one's tile
// multiplies (amx_tiles_pairs), it is cheaper from 4 rows at block 128 (the kernel alone on the Qwen 1.5B's
// shapes past the caches, us a gate+up matrix, VNNI against AMX: 4 rows 530/509, 6: 587/540, 8: 712/571; 3:
// 497/501), from 6 at block 64 and from 8 at block 32 (more blocks, so more of AMX's per-block work).
constexpr int64_t kAmxMinRows = 4;
inline int64_t amx_min_rows(int64_t block) { return block >= 128 ? kAmxMinRows : block >= 64 ? 6 : 8; }
// AMX: how many blocks ahead (in a column tile's blocks) its unpacking prefetches the scales and zero points
constexpr int64_t kAmxPrefetchScales = 4;
// the VNNI path's second prefetch distance, in bytes of packed weights (into L2; see rows_tiles)
constexpr int64_t kPrefetchL2 = 16384;
constexpr int kPrefetchL2Rows = 7;  // ... in calls of up to this many rows (a pass of rows_tiles)

struct Chunk;  // of the pool of weight copies (own_weights)

struct Kernel {
  int64_t K = 0, N = 0, block = 0, nb = 0, tiles = 0;
  int64_t kstep = 0;  // AMX: bytes of K one tile multiply takes (divides block; 0: no AMX path)
  bool avx512 = false;
  bool portable = false;  // the portable path (g_portable when the kernel was made)
  // SwiGLU (attribute swiglu=1): the weights are the gate's and the up projection's N columns each, their tiles
  // interleaved (gate tile i at 2i, up's at 2i + 1), and the output silu(gate) * up, N columns (finish16)
  bool swiglu = false;
  bool huge = false;  // g_hugepages when the kernel was made (a later registration does not change it)
  // the B whose (and whose scales' and zero points') sizes were checked; atomic: runs may overlap
  std::atomic<const void*> checked{nullptr};
  // every zero point of the checked weights is at most kAmxMaxZero (checked with B: like the sizes, this assumes
  // the weights are initializers, fixed for the session, as every bundle's are)
  std::atomic<bool> amx_zero_ok{true};
  // the weights copied into memory on 2 MiB pages (see own_weights); null: read them where onnxruntime has them
  std::mutex mu;
  Chunk* own = nullptr;    // the pool chunk the copy is a slice of
  const void* own_src = nullptr;  // the weights it is a copy of (one copy a kernel, of the first weights seen)
  const uint8_t* own_w = nullptr;
  const float* own_s = nullptr;
  const uint8_t* own_z = nullptr;
  const float* own_mn = nullptr;   // (minimums and k-quant scales: copied with them)
  const uint8_t* own_ks = nullptr;
  ~Kernel();
};

struct Weights {
  const uint8_t* w;
  const float* scale;
  const uint8_t* zp;  // nullptr: 8 (0 with minimums)
  // per (tile, block) 16 float minimums (input 5; nullptr: none): a block's weights are scale x w - minimum, the
  // asymmetric blocks of GGUF's Q4_1 and Q4_K kept as they are (no zero points then: a byte per 32 weights less
  // to read); see block_min
  const float* mn;
  // k-quant scales (input 6; nullptr: none), GGUF's Q4_K kept as it is stored: per (tile, block) 16 bytes of 6-bit
  // scales then 16 of 6-bit minimums, and ``scale`` per (tile, super-block of 8 blocks) 16 float scales of the scales
  // (d) then 16 of the minimums (dmin): a block's scale is d x its byte, its minimum dmin x its byte (exact float
  // products of a float16 and an integer below 64: the bits of the float format's precomputed values, from 24
  // bytes a column per 8 blocks instead of 64). See scale_min16
  const uint8_t* ks;
  bool minimums;  // mn or ks: zero points 0 where there are none, and block_min's correction
};

struct Call {
  const Kernel* k;
  Weights q;
  int64_t M;
  const int8_t* xq;    // [M][K]
  const float* xd;     // [M][nb]
  const int32_t* xs;   // [M][nb]
  float* y;            // [M][N]
  const float* bias;   // [N] or nullptr (input 4)
  bool epilogue;       // a bias or SwiGLU: outputs through finish16
  int64_t chunk;       // tiles per task
  // AMX (else nullptr): xq block-major, [nb][chunks * rows][block] (rows: min(M, kAmxRows)), its rows padded
  // with zeros to whole chunks: a block's A tiles for every chunk are one contiguous run (row stride: the block), where in xq
  // (row stride K) a tile's 16 rows are 16 lines K bytes apart, which the prefetchers do not follow (session
  // 20: a prefill chunk of 256 rows through the down projection, K = 8,960, 2.3 MB of activations, 17.9 ->
  // 9.7 ns a tile multiply with its loads; K = 1,536: 9.3 -> 8.1)
  const int8_t* xa;
  int64_t chunks;      // AMX: ceil(M / kAmxRows)
  int64_t rows;        // AMX: rows of a chunk's tiles, min(M, kAmxRows)
};

#if ES_X86  // MatMulQ4's AVX2, AVX-512 VNNI and AMX paths
// A block's zero points (8 where there are none) and scales for the 16 columns at sb: what the VNNI path reads
// per (tile, block).
struct BlockQ {
  __m512i z;
  __m512 s;
  __m512 m;  // the minimums (zeros where the kernel has none: then unused)
};

// tile t's block b: its 16 columns' scales and minimums (zeros without), from whichever format the kernel has
ES_AVX512 inline void scale_min16(const Call& c, int64_t t, int64_t b, __m512* s, __m512* m) {
  const size_t sb = size_t((t * c.k->nb + b) * kTile);
  if (c.q.ks) {
    const uint8_t* p = c.q.ks + 2 * sb;
    const float* d = c.q.scale + size_t((t * (c.k->nb / 8) + b / 8) * 2 * kTile);
    *s = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))),
                       _mm512_loadu_ps(d));
    *m = _mm512_mul_ps(
        _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kTile)))),
        _mm512_loadu_ps(d + kTile));
    return;
  }
  *s = _mm512_loadu_ps(c.q.scale + sb);
  *m = c.q.mn ? _mm512_loadu_ps(c.q.mn + sb) : _mm512_setzero_ps();
}
// ... 8 of them (half h of the tile), for the AVX2 path: the same products
ES_AVX2 inline void scale_min8(const Call& c, int64_t t, int64_t b, int h, __m256* s, __m256* m) {
  const size_t sb = size_t((t * c.k->nb + b) * kTile);
  if (c.q.ks) {
    const uint8_t* p = c.q.ks + 2 * sb + 8 * h;
    const float* d = c.q.scale + size_t((t * (c.k->nb / 8) + b / 8) * 2 * kTile) + 8 * h;
    *s = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))),
                       _mm256_loadu_ps(d));
    *m = _mm256_mul_ps(
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + kTile)))),
        _mm256_loadu_ps(d + kTile));
    return;
  }
  *s = _mm256_loadu_ps(c.q.scale + sb + 8 * h);
  *m = c.q.mn ? _mm256_loadu_ps(c.q.mn + sb + 8 * h) : _mm256_setzero_ps();
}

// The AVX2 path's twins of block_q's zero points and block_fma (8 columns, half h of a tile): the same operations
// per lane, so the same bits as the AVX-512 paths
ES_AVX2 inline __m256i block_z8(const Call& c, size_t sb, int h) {
  return c.q.zp ? _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c.q.zp + sb + 8 * h)))
                : _mm256_set1_epi32(c.q.minimums ? 0 : 8);
}
// a block's activations: their scale times their integer sum (block_min's factor; a float product)
inline float block_xsum(const Call& c, int64_t rb) { return c.xd[rb] * float(c.xs[rb]); }
ES_AVX2 inline __m256 block_fma8(const Call& c, __m256i z, __m256 s, __m256 mn, __m256i dot, int64_t rb, __m256 acc) {
  const __m256i corr = _mm256_sub_epi32(dot, _mm256_mullo_epi32(z, _mm256_set1_epi32(c.xs[rb])));
  acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(corr), _mm256_mul_ps(s, _mm256_set1_ps(c.xd[rb])), acc);
  return c.q.minimums ? _mm256_fnmadd_ps(mn, _mm256_set1_ps(block_xsum(c, rb)), acc) : acc;
}

ES_AVX512 inline BlockQ block_q(const Call& c, int64_t t, int64_t b) {
  const size_t sb = size_t((t * c.k->nb + b) * kTile);
  BlockQ q;
  q.z = c.q.zp ? _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c.q.zp + sb)))
               : _mm512_set1_epi32(c.q.minimums ? 0 : 8);
  scale_min16(c, t, b, &q.s, &q.m);
  return q;
}

// One block's exact int32 dot into a row's float sums: subtract zero point x the activations' sum (the VNNI
// path; the AMX path's tile multiplies give the corrected integer itself), convert, multiply by scale x the
// activations' scale, fused multiply-add: block_fma_corrected is the one chain per lane both AVX-512 paths run
// (row block rb), so they compute the same bits.
// With minimums, block_min then takes minimum x the block's activation sum off (sum x (s w - m) = s sum x w - m sum x):
// one more fused multiply-add per lane, by the activations' scale times their integer sum (a float product, the
// same on every path).
ES_AVX512 inline __m512 block_fma_corrected(const Call& c, __m512 s, __m512i corr, int64_t rb, __m512 acc) {
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(corr), _mm512_mul_ps(s, _mm512_set1_ps(c.xd[rb])), acc);
}
ES_AVX512 inline __m512 block_min(const Call& c, __m512 m, int64_t rb, __m512 acc) {
  return c.q.minimums ? _mm512_fnmadd_ps(m, _mm512_set1_ps(block_xsum(c, rb)), acc) : acc;
}
ES_AVX512 inline __m512 block_fma(const Call& c, const BlockQ& q, __m512i dot, int64_t rb, __m512 acc) {
  const __m512i corr = _mm512_sub_epi32(dot, _mm512_mullo_epi32(q.z, _mm512_set1_epi32(c.xs[rb])));
  return block_min(c, q.m, rb, block_fma_corrected(c, q.s, corr, rb, acc));
}

// exp(x) for x <= 0 (a softmax's s - max), 8 lanes: Cephes' expf polynomial after reduction by ln 2
ES_AVX2 inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// SwiGLU's activation, 8 lanes: silu(g) * u, silu(g) = g * sigmoid(g), the sigmoid from e = exp(-|g|) (in (0, 1],
// exp8's range): 1 / (1 + e) where g >= 0, e / (1 + e) below. Every path computes it in these halves: the same bits.
ES_AVX2 inline __m256 swiglu8(__m256 g, __m256 u) {
  const __m256 e = exp8(_mm256_or_ps(g, _mm256_set1_ps(-0.0f)));
  const __m256 r = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_add_ps(_mm256_set1_ps(1.0f), e));
  const __m256 sig = _mm256_blendv_ps(_mm256_mul_ps(e, r), r, _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_GE_OQ));
  return _mm256_mul_ps(_mm256_mul_ps(g, sig), u);
}

// Column tile t's 16 sums of row r (``v``, 32-byte aligned) into the output through the kernel's epilogue: plus the
// bias (the same float addition onnxruntime's Add makes), or, for a SwiGLU kernel, the gate's tile (t even) kept in
// the output until the up projection's (t + 1, the same thread's next tile) makes it silu(gate) * up. Tiles are
// computed in order within a task, and tasks hold whole (gate, up) pairs.
ES_AVX2 void finish16(const Call& c, int64_t r, int64_t t, const float* v) {
  const Kernel& k = *c.k;
  const int64_t n0 = (k.swiglu ? t / 2 : t) * kTile, cols = std::min<int64_t>(kTile, k.N - n0);
  float* y = c.y + r * k.N + n0;
  if (cols == kTile) {  // (a whole tile: straight through the output; a partial one through buffers below)
    for (int h = 0; h < 2; ++h) {
      const __m256 x = _mm256_load_ps(v + 8 * h);
      if (!k.swiglu)
        _mm256_storeu_ps(y + 8 * h, _mm256_add_ps(x, _mm256_loadu_ps(c.bias + n0 + 8 * h)));
      else
        _mm256_storeu_ps(y + 8 * h, t % 2 == 0 ? x : swiglu8(_mm256_loadu_ps(y + 8 * h), x));
    }
    return;
  }
  alignas(32) float out[kTile];
  if (k.swiglu) {
    if (t % 2 == 0) {
      std::memcpy(y, v, size_t(cols) * sizeof(float));
      return;
    }
    alignas(32) float gate[kTile] = {};
    std::memcpy(gate, y, size_t(cols) * sizeof(float));
    for (int h = 0; h < 2; ++h)
      _mm256_store_ps(out + 8 * h, swiglu8(_mm256_load_ps(gate + 8 * h), _mm256_load_ps(v + 8 * h)));
  } else {  // the bias
    alignas(32) float b[kTile] = {};
    std::memcpy(b, c.bias + n0, size_t(cols) * sizeof(float));
    for (int h = 0; h < 2; ++h)
      _mm256_store_ps(out + 8 * h, _mm256_add_ps(_mm256_load_ps(v + 8 * h), _mm256_load_ps(b + 8 * h)));
  }
  std::memcpy(y, out, size_t(cols) * sizeof(float));
}

// Rows r0..r0+R-1 (R <= 8) of tiles [t0, t1): each 64-byte group of weights is loaded and split
// into nibbles once for all R rows. Up to kSplitRows rows, each row's block dot is two VPDPBUSD chains (low
// nibbles, high nibbles) added at the block's end: one chain of two VPDPBUSD a group bounds a one-row pass by
// their latency (2 x 4-5 cycles per 64 bytes, near a Zen 4 core's share of memory bandwidth); the int32 sums are
// exact, so the bits are the same.
constexpr int kSplitRows = 2;
template <int R>
ES_AVX512 void rows_tiles(const Call& c, int64_t r0, int64_t t0, int64_t t1) {
  const Kernel& k = *c.k;
  const int64_t nb = k.nb, P = k.block / 8, tb = k.block * kTile / 2;
  const __m512i lo4 = _mm512_set1_epi8(0x0F);
  for (int64_t t = t0; t < t1; ++t) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* wp = c.q.w + (t * nb + b) * tb;
      __m512i dot[R], dot2[R];  // dot2: the high nibbles' chain up to kSplitRows rows (see below), else unused
      for (int r = 0; r < R; ++r) dot[r] = dot2[r] = _mm512_setzero_si512();
      const int8_t* xb[R];
      for (int r = 0; r < R; ++r) xb[r] = c.xq + (r0 + r) * k.K + b * k.block;
      for (int64_t p = 0; p < P; ++p) {
        // the line two blocks ahead in this tile's weights into L1 (a prefetch never faults past their end):
        // the hardware prefetcher alone kept a one-row call of the Qwen 1.5B at 45.5 ms, this at 38.5; and,
        // up to kPrefetchL2Rows rows, the line kPrefetchL2 bytes ahead into L2, a longer stream in flight
        // than L1's fill buffers hold (session 15, calls alternating with the other model's as in decoding,
        // ms: target 1 row 40.8 -> 36.0, 4 rows 48 -> 43, 6 rows 51 -> 47, 7 rows 54 -> 51; drafter 12.5 ->
        // 11.2; 12 or 24 KiB ahead the same within noise, 32-64 KiB less). At 8 rows, where the loop is
        // compute-bound, the extra instruction cost more than it saved (54 -> 55.5 ms)
        _mm_prefetch(reinterpret_cast<const char*>(wp + p * 64 + 2 * tb), _MM_HINT_T0);
        if constexpr (R <= kPrefetchL2Rows)
          _mm_prefetch(reinterpret_cast<const char*>(wp + p * 64 + kPrefetchL2), _MM_HINT_T1);
        const __m512i v = _mm512_loadu_si512(reinterpret_cast<const void*>(wp + p * 64));
        const __m512i lo = _mm512_and_si512(v, lo4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
        for (int r = 0; r < R; ++r) {
          int32_t a, bq;
          std::memcpy(&a, xb[r] + 8 * p, 4);
          std::memcpy(&bq, xb[r] + 8 * p + 4, 4);
          dot[r] = _mm512_dpbusd_epi32(dot[r], lo, _mm512_set1_epi32(a));
          if constexpr (R <= kSplitRows)
            dot2[r] = _mm512_dpbusd_epi32(dot2[r], hi, _mm512_set1_epi32(bq));
          else
            dot[r] = _mm512_dpbusd_epi32(dot[r], hi, _mm512_set1_epi32(bq));
        }
      }
      if constexpr (R <= kSplitRows)
        for (int r = 0; r < R; ++r) dot[r] = _mm512_add_epi32(dot[r], dot2[r]);
      const BlockQ q = block_q(c, t, b);
      for (int r = 0; r < R; ++r) acc[r] = block_fma(c, q, dot[r], (r0 + r) * nb + b, acc[r]);
    }
    if (c.epilogue) {
      alignas(64) float v[kTile];
      for (int r = 0; r < R; ++r) {
        _mm512_store_ps(v, acc[r]);
        finish16(c, r0 + r, t, v);
      }
      continue;
    }
    const int64_t n0 = t * kTile, cols = std::min<int64_t>(kTile, k.N - n0);
    const __mmask16 mask = __mmask16((1u << cols) - 1u);
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(c.y + (r0 + r) * k.N + n0, mask, acc[r]);
  }
}

// AVX2: rows r0..r0+R-1 (R <= 8) of tile t. A tile's 16 columns are two vectors of 8 int32/float lanes, one
// per 32-byte half of each 64-byte group (4 weights of k = 8p..8p+3 in the low nibbles and 8p+4..8p+7 in the
// high ones, per column). Per block, each half is one pass over the block's groups: its nibbles split once for
// all R rows, then per row _mm256_maddubs_epi16 multiplies the unsigned nibbles by the int8 activations and adds
// pairs into int16 (|pair| <= 2*15*127, no saturation); four groups sum to at most 16*15*127 = 30480 in int16,
// then _mm256_madd_epi16 widens to int32 into the block's dots, kept in memory (touched once every four groups):
// the block's dot is exact. One half at a time and the dots in memory keep a pass's sums in registers (R int16
// sums, R + 6 of AVX2's 16). Until session 24 both halves went in one pass of up to 3 rows with the dots in
// registers: 19 of them, and the compiler spilled every product to the stack (Zen 3: an 8-token verify of the
// Qwen 1.5B cost 3.2x a one-token call, now ~2.1x). The empty asm after each group's sums keeps GCC from
// reassociating a batch's adds into one tree whose products all live at once (the spills again); it emits
// nothing. A one-row call takes both halves in one pass (rows_tile2_both), sharing the activations' broadcasts;
// two rows that way were slower than one half of up to 8 rows at a time. Each pass that reads a block first (the
// one-row pass, a wider one's first half) prefetches its lines two blocks ahead into L1, as the AVX-512 path does:
// on Zen 3 (the kernel alone, caches cold, alternating) a one-row gate+up product 1039 -> 893 us, 4 rows 1070
// -> 883, 8 rows 1734 -> 1588 (session 9 found nothing in it on Zen 1); an L2 prefetch further ahead added nothing.
template <int R>
ES_AVX2 inline void half_group(const uint8_t* g, const int8_t* const* xb, int64_t p, __m256i lo4, __m256i* s16,
                               const uint8_t* ahead) {
  if (ahead) _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g));
  const __m256i lo = _mm256_and_si256(v, lo4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
  for (int r = 0; r < R; ++r) {
    int32_t a, bq;
    std::memcpy(&a, xb[r] + 8 * p, 4);
    std::memcpy(&bq, xb[r] + 8 * p + 4, 4);
    const __m256i m = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(a)),
                                       _mm256_maddubs_epi16(hi, _mm256_set1_epi32(bq)));
    s16[r] = _mm256_add_epi16(s16[r], m);
    asm("" : "+x"(s16[r]));
  }
}

// the int16 sums of up to four groups, widened into the block's int32 dots and cleared
template <int R>
ES_AVX2 inline void widen_half(__m256i* s16, int32_t (*dot)[8]) {
  const __m256i ones = _mm256_set1_epi16(1);
  for (int r = 0; r < R; ++r) {
    __m256i* d = reinterpret_cast<__m256i*>(dot[r]);
    _mm256_store_si256(d, _mm256_add_epi32(_mm256_load_si256(d), _mm256_madd_epi16(s16[r], ones)));
    s16[r] = _mm256_setzero_si256();
  }
}

// Rows (one, in practice: see above) with both halves in one pass: the activations' two broadcasts a group serve
// both halves' products (one row: 11 registers; the empty asm as in half_group)
template <int R>
ES_AVX2 void rows_tile2_both(const Call& c, int64_t r0, int64_t t) {
  const Kernel& k = *c.k;
  const int64_t nb = k.nb, P = k.block / 8, tb = k.block * kTile / 2;
  const __m256i lo4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wp = c.q.w + (t * nb + b) * tb;
    const int8_t* xb[R];
    for (int r = 0; r < R; ++r) xb[r] = c.xq + (r0 + r) * k.K + b * k.block;
    __m256i dot[R][2], s16[R][2];
    for (int r = 0; r < R; ++r) dot[r][0] = dot[r][1] = s16[r][0] = s16[r][1] = _mm256_setzero_si256();
    for (int64_t p0 = 0; p0 < P; p0 += 4) {  // four groups a batch (a block of 8 * (4n + 1..3): fewer in its last)
      const int64_t pe = std::min<int64_t>(P, p0 + 4);
#pragma GCC unroll 4
      for (int64_t p = p0; p < pe; ++p) {
        const uint8_t* g = wp + p * 64;
        _mm_prefetch(reinterpret_cast<const char*>(g + 2 * tb), _MM_HINT_T0);
        __m256i lo[2], hi[2];
        for (int h = 0; h < 2; ++h) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 32 * h));
          lo[h] = _mm256_and_si256(v, lo4);
          hi[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
        }
        for (int r = 0; r < R; ++r) {
          int32_t a, bq;
          std::memcpy(&a, xb[r] + 8 * p, 4);
          std::memcpy(&bq, xb[r] + 8 * p + 4, 4);
          const __m256i va = _mm256_set1_epi32(a), vb = _mm256_set1_epi32(bq);
          for (int h = 0; h < 2; ++h) {
            s16[r][h] = _mm256_add_epi16(s16[r][h], _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], va),
                                                                     _mm256_maddubs_epi16(hi[h], vb)));
            asm("" : "+x"(s16[r][h]));
          }
        }
      }
      for (int r = 0; r < R; ++r)
        for (int h = 0; h < 2; ++h) {
          dot[r][h] = _mm256_add_epi32(dot[r][h], _mm256_madd_epi16(s16[r][h], ones));
          s16[r][h] = _mm256_setzero_si256();
        }
    }
    const size_t sb = size_t((t * nb + b) * kTile);
    for (int h = 0; h < 2; ++h) {
      const __m256i z = block_z8(c, sb, h);
      __m256 s, mn;
      scale_min8(c, t, b, h, &s, &mn);
      for (int r = 0; r < R; ++r) {
        const int64_t rb = (r0 + r) * nb + b;
        acc[r][h] = block_fma8(c, z, s, mn, dot[r][h], rb, acc[r][h]);
      }
    }
  }
  const int64_t n0 = t * kTile, cols = std::min<int64_t>(kTile, k.N - n0);
  for (int r = 0; r < R; ++r) {
    alignas(32) float v[kTile];
    _mm256_store_ps(v, acc[r][0]);
    _mm256_store_ps(v + 8, acc[r][1]);
    if (c.epilogue)
      finish16(c, r0 + r, t, v);
    else
      std::memcpy(c.y + (r0 + r) * k.N + n0, v, size_t(cols) * sizeof(float));
  }
}

template <int R>
ES_AVX2 void rows_tile2(const Call& c, int64_t r0, int64_t t) {
  const Kernel& k = *c.k;
  const int64_t nb = k.nb, P = k.block / 8, tb = k.block * kTile / 2;
  const __m256i lo4 = _mm256_set1_epi8(0x0F);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wp = c.q.w + (t * nb + b) * tb;
    const int8_t* xb[R];
    for (int r = 0; r < R; ++r) xb[r] = c.xq + (r0 + r) * k.K + b * k.block;
    const size_t sb = size_t((t * nb + b) * kTile);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* g = wp + 32 * h;
      __m256i s16[R];
      alignas(32) int32_t dot[R][8] = {};
      for (int r = 0; r < R; ++r) s16[r] = _mm256_setzero_si256();
      int64_t p = 0;
      // the first half's pass prefetches each line two blocks ahead into L1 (as the one-row path)
      const uint8_t* ahead = h == 0 ? wp + 2 * tb : nullptr;
      for (; p + 4 <= P; p += 4) {  // four groups a batch
        for (int q = 0; q < 4; ++q)
          half_group<R>(g + (p + q) * 64, xb, p + q, lo4, s16, ahead ? ahead + (p + q) * 64 : nullptr);
        widen_half<R>(s16, dot);
      }
      if (p < P) {  // a block of 8 * (4n + 1..3)
        for (; p < P; ++p) half_group<R>(g + p * 64, xb, p, lo4, s16, ahead ? ahead + p * 64 : nullptr);
        widen_half<R>(s16, dot);
      }
      const __m256i z = block_z8(c, sb, h);
      __m256 s, mn;
      scale_min8(c, t, b, h, &s, &mn);
      for (int r = 0; r < R; ++r) {
        const int64_t rb = (r0 + r) * nb + b;
        acc[r][h] = block_fma8(c, z, s, mn, _mm256_load_si256(reinterpret_cast<const __m256i*>(dot[r])), rb, acc[r][h]);
      }
    }
  }
  if (c.epilogue) {
    alignas(32) float v[kTile];
    for (int r = 0; r < R; ++r) {
      _mm256_store_ps(v, acc[r][0]);
      _mm256_store_ps(v + 8, acc[r][1]);
      finish16(c, r0 + r, t, v);
    }
    return;
  }
  const int64_t n0 = t * kTile, cols = std::min<int64_t>(kTile, k.N - n0);
  for (int r = 0; r < R; ++r) {
    float* y = c.y + (r0 + r) * k.N + n0;
    if (cols == kTile) {
      _mm256_storeu_ps(y, acc[r][0]);
      _mm256_storeu_ps(y + 8, acc[r][1]);
    } else {
      alignas(32) float tmp[kTile];
      _mm256_store_ps(tmp, acc[r][0]);
      _mm256_store_ps(tmp + 8, acc[r][1]);
      std::memcpy(y, tmp, size_t(cols) * sizeof(float));
    }
  }
}

#if ES_AMX_BUILT
// AMX: tiles [t0, t1) of all rows. Per (tile, block), the packed weights are unpacked once into a
// B tile's layout, which the packing already is per nibble: row 2p of the block's B = the low nibbles of
// group p (k = 8p..8p+3, 4 bytes per column), row 2p+1 = the high ones (k = 8p+4..8p+7), each less its
// column's zero point, as signed bytes (w - z). TDPBSSD (s8 x s8) of the activations (A: xq's rows, as they
// are) then gives C[r][n] = sum x (w - z) = sum x w - z sum x: the integer the VNNI path computes from its
// dot product and zero-point correction, exactly. Then block_fma_corrected, the chain per lane rows_tiles
// runs too (in block order), so the two paths give the same bits. (Until session 20 A was x + 128 as u8 with
// a row of ones under it for the weights' sums, TDPBUSD, and the correction per row and block: 15 rows a
// chunk, and ~40% more work per row after each tile multiply.)
struct alignas(64) TileConfig {
  uint8_t palette, start_row, reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// Tile t's block b of packed weights into B tiles' layout at w (block * 16 bytes, 64-byte aligned): each
// weight less its column's zero point, a signed byte.
ES_AMX inline void amx_unpack(const Call& c, int64_t t, int64_t b, uint8_t* w) {
  const int64_t P = c.k->block / 8, tb = c.k->block * kTile / 2;
  const uint8_t* wp = c.q.w + (t * c.k->nb + b) * tb;
  const __m512i lo4 = _mm512_set1_epi8(0x0F);
  // the 16 columns' zero points, each in the 4 bytes of its column in a B row
  const __m512i z = c.q.zp ? _mm512_cvtepu8_epi32(_mm_loadu_si128(
                                 reinterpret_cast<const __m128i*>(c.q.zp + (t * c.k->nb + b) * kTile)))
                           : _mm512_set1_epi32(c.q.minimums ? 0 : 8);
  const __m512i zb = _mm512_mullo_epi32(z, _mm512_set1_epi32(0x01010101));
  // the scales and zero points a few blocks ahead (amx_chunk_sums waited on the scales: they are a stream of
  // their own, 64 bytes a block, that no hardware prefetcher followed; session 21, 9 rows: ~5% a matrix)
  const int64_t ahead = (t * c.k->nb + b + kAmxPrefetchScales) * kTile;
  _mm_prefetch(reinterpret_cast<const char*>(c.q.scale + ahead), _MM_HINT_T0);
  if (c.q.zp) _mm_prefetch(reinterpret_cast<const char*>(c.q.zp + ahead), _MM_HINT_T0);
  for (int64_t p = 0; p < P; ++p) {
    // the next block's line into L1, and the line kPrefetchL2 bytes ahead into L2 as the VNNI path does (session
    // 21: a 9-row gate+up matrix 709 -> 652 us)
    _mm_prefetch(reinterpret_cast<const char*>(wp + p * 64 + tb), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(wp + p * 64 + kPrefetchL2), _MM_HINT_T1);
    const __m512i v = _mm512_loadu_si512(reinterpret_cast<const void*>(wp + p * 64));
    _mm512_store_si512(reinterpret_cast<void*>(w + p * 128), _mm512_sub_epi8(_mm512_and_si512(v, lo4), zb));
    _mm512_store_si512(reinterpret_cast<void*>(w + p * 128 + 64),
                       _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), lo4), zb));
  }
}

// This thread's buffers for the AMX paths, kept from call to call: the unpacked weights of a group of
// ``group`` column tiles (64-byte aligned), and per row the group's float sums.
struct AmxBuffers {
  uint8_t* w;
  float* acc;
};
ES_AMX AmxBuffers amx_buffers(const Call& c, int64_t group, int64_t acc_group = 0) {
  thread_local std::vector<uint8_t> wraw;
  thread_local std::vector<float> araw;
  const size_t wbytes = size_t(group * c.k->block * kTile) + 64,
               accs = size_t(c.M * (acc_group ? acc_group : group) * kTile) + 16;
  if (wraw.size() < wbytes) wraw.resize(wbytes);
  if (araw.size() < accs) araw.resize(accs);
  return {wraw.data() + ((64 - reinterpret_cast<uintptr_t>(wraw.data()) % 64) % 64),
          araw.data() + ((64 - reinterpret_cast<uintptr_t>(araw.data()) % 64) % 64) / 4};
}

// Block b's scales and minimums for the group's G column tiles (s[j], m[j]): read once a block, for every chunk.
ES_AMX inline void amx_block_scales(const Call& c, int64_t G, int64_t t, int64_t b, __m512* s, __m512* m) {
  for (int64_t j = 0; j < G; ++j) scale_min16(c, t + j, b, &s[j], &m[j]);
}

// After a chunk's tile multiplies for block b (the G column tiles' C stored at cb, 16 x 16 int32 each): each
// of the chunk's rows' block dot into its float sums (acc: per row ``group`` tiles of 16), by block_fma_corrected
// and block_min's operations per lane (the same bits), rows outer: a row's activation scale and its product with
// the row's sum (block_xsum) are broadcast once for the G tiles, the tiles' scales and minimums are in registers
// (amx_block_scales), and nothing is read from the Call in the loop (session 37: at block 32, where this is most
// of a prefill's time, the per-tile reloads and scalar products were half of it).
template <int G, bool Minimums, int P>
ES_AMX inline void amx_chunk_sums_g(const Call& c, const int32_t* cb, float* acc, int64_t group, const __m512* s,
                                    const __m512* m, int64_t b, int64_t ch) {
  const int64_t nb = c.k->nb, r0 = ch * c.rows, n = std::min<int64_t>(c.rows, c.M - r0);
  const float* xd = c.xd;
  const int32_t* xs = c.xs;
  __m512 sj[P * G], mj[P * G];
  for (int i = 0; i < P * G; ++i) sj[i] = s[(i / G) * 4 + i % G], mj[i] = m[(i / G) * 4 + i % G];
  for (int64_t r = 0; r < n; ++r) {
    float* a = acc + (r0 + r) * group * kTile;
    __m512 v[G];
    for (int j = 0; j < G; ++j) v[j] = _mm512_load_ps(a + j * kTile);
    for (int p = 0; p < P; ++p) {  // block b + p, in block order (the chain per lane)
      const int64_t rb = (r0 + r) * nb + b + p;
      const __m512 d = _mm512_set1_ps(xd[rb]);
      const int32_t* cr = cb + p * 4 * 16 * kTile + r * kTile;
      for (int j = 0; j < G; ++j)
        v[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(cr + j * 16 * kTile)), _mm512_mul_ps(sj[p * G + j], d),
                               v[j]);
      if (Minimums) {
        const __m512 xsum = _mm512_set1_ps(xd[rb] * float(xs[rb]));  // (block_xsum)
        for (int j = 0; j < G; ++j) v[j] = _mm512_fnmadd_ps(mj[p * G + j], xsum, v[j]);
      }
    }
    for (int j = 0; j < G; ++j) _mm512_store_ps(a + j * kTile, v[j]);
  }
}
template <bool Minimums, int P>
ES_AMX inline void amx_chunk_sums_m(const Call& c, const int32_t* cb, float* acc, int64_t group, int64_t G,
                                    const __m512* s, const __m512* m, int64_t b, int64_t ch) {
  switch (G) {
    case 4: return amx_chunk_sums_g<4, Minimums, P>(c, cb, acc, group, s, m, b, ch);
    case 3: return amx_chunk_sums_g<3, Minimums, P>(c, cb, acc, group, s, m, b, ch);
    case 2: return amx_chunk_sums_g<2, Minimums, P>(c, cb, acc, group, s, m, b, ch);
    default: return amx_chunk_sums_g<1, Minimums, P>(c, cb, acc, group, s, m, b, ch);
  }
}
// P (1 or 2) blocks from b: their C tiles at cb, block b + p's column tile j at cb + (4p + j) x 16 x 16, its scales
// and minimums s[4p + j], m[4p + j]. Two blocks a pass read and write each row's sums once for both (session 37:
// at block 32 the sums' traffic through L2 was the epilogue's largest cost).
ES_AMX inline void amx_chunk_sums(const Call& c, const int32_t* cb, float* acc, int64_t group, int64_t G,
                                  const __m512* s, const __m512* m, int64_t b, int64_t ch, int P = 1) {
  if (c.q.minimums)
    P == 2 ? amx_chunk_sums_m<true, 2>(c, cb, acc, group, G, s, m, b, ch)
           : amx_chunk_sums_m<true, 1>(c, cb, acc, group, G, s, m, b, ch);
  else
    P == 2 ? amx_chunk_sums_m<false, 2>(c, cb, acc, group, G, s, m, b, ch)
           : amx_chunk_sums_m<false, 1>(c, cb, acc, group, G, s, m, b, ch);
}

// The group's sums (column tiles t..t+G-1) into the output, row by row: the group's columns one contiguous
// run of a row (column tile by column tile, each of the M rows' lines would be far from the last, in a
// different page from 1,024 columns on).
ES_AMX inline void amx_store_group(const Call& c, const float* acc, int64_t group, int64_t G, int64_t t) {
  for (int64_t r = 0; r < c.M; ++r)
    for (int64_t j = 0; j < G; ++j) {
      if (c.epilogue) {  // (acc is 64-byte aligned, a tile's 16 sums a line)
        finish16(c, r, t + j, acc + (r * group + j) * kTile);
        continue;
      }
      const int64_t n0 = (t + j) * kTile, cols = std::min<int64_t>(kTile, c.k->N - n0);
      _mm512_mask_storeu_ps(c.y + r * c.k->N + n0, __mmask16((1u << cols) - 1u),
                            _mm512_load_ps(acc + (r * group + j) * kTile));
    }
}

// Up to four column tiles at a time, so that four independent accumulations (C tiles 0-3) share each A
// tile load and overlap in the tile unit; B tiles rotate over 5-7.
ES_AMX void amx_tiles(const Call& c, int64_t t0, int64_t t1) {
  const Kernel& k = *c.k;
  const int64_t nb = k.nb, ks = k.kstep, steps = k.block / ks;
  const int64_t rows = c.rows, wstride = k.block * kTile;  // A/C rows per chunk; unpacked bytes a tile
  TileConfig cfg{};
  cfg.palette = 1;
  for (int i = 0; i < 4; ++i) cfg.rows[i] = uint8_t(rows), cfg.colsb[i] = 64;  // C: rows x 16 int32
  cfg.rows[4] = uint8_t(rows), cfg.colsb[4] = uint16_t(ks);                     // A: rows x ks bytes
  for (int i = 5; i < 8; ++i) cfg.rows[i] = uint8_t(ks / 4), cfg.colsb[i] = 64;  // B: ks/4 k quads x 16 x 4
  _tile_loadconfig(&cfg);
  const AmxBuffers buf = amx_buffers(c, 8, 4);  // the unpacked weights of two blocks, the sums of four tiles
  float* acc = buf.acc;
  alignas(64) int32_t cb[2 * 4 * 16 * kTile];
  for (int64_t t = t0; t < t1; t += 4) {
    const int64_t G = std::min<int64_t>(4, t1 - t);
    std::fill(acc, acc + c.M * 4 * kTile, 0.f);
    for (int64_t b = 0; b < nb; b += 2) {
      const int P = b + 1 < nb ? 2 : 1;  // blocks b and b + 1 a pass (see amx_chunk_sums)
      __m512 s[8], m[8];
      for (int p = 0; p < P; ++p) {
        for (int64_t j = 0; j < G; ++j) amx_unpack(c, t + j, b + p, buf.w + (4 * p + j) * wstride);
        amx_block_scales(c, G, t, b + p, s + 4 * p, m + 4 * p);
      }
      for (int64_t ch = 0; ch < c.chunks; ++ch) {
        for (int p = 0; p < P; ++p) {
          const uint8_t* wb = buf.w + 4 * p * wstride;
          int32_t* cp = cb + p * 4 * 16 * kTile;
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
          for (int64_t st = 0; st < steps; ++st) {
            const uint8_t* ws = wb + st * ks * kTile;
            _tile_loadd(4, c.xa + ((b + p) * c.chunks + ch) * rows * k.block + st * ks, k.block);
            _tile_loadd(5, ws, 64);
            _tile_dpbssd(0, 4, 5);
            if (G > 1) {
              _tile_loadd(6, ws + wstride, 64);
              _tile_dpbssd(1, 4, 6);
            }
            if (G > 2) {
              _tile_loadd(7, ws + 2 * wstride, 64);
              _tile_dpbssd(2, 4, 7);
            }
            if (G > 3) {
              _tile_loadd(5, ws + 3 * wstride, 64);
              _tile_dpbssd(3, 4, 5);
            }
          }
          _tile_stored(0, cp, 64);
          if (G > 1) _tile_stored(1, cp + 16 * kTile, 64);
          if (G > 2) _tile_stored(2, cp + 32 * kTile, 64);
          if (G > 3) _tile_stored(3, cp + 48 * kTile, 64);
        }
        amx_chunk_sums(c, cb, acc, 4, G, s, m, b, ch, P);
      }
    }
    amx_store_group(c, acc, 4, G, t);
  }
  _tile_release();
}

// AMX for calls of one chunk (up to 16 rows: a verify call) in blocks of one or two tile steps: two
// column tiles at a time, each B tile (step, column) in a register of its own (tiles 4-7; A: 2-3, a step
// each; C: 0-1), loaded once a block for every chunk. amx_tiles takes four column tiles with one A for
// more accumulations in flight, which pays from two chunks on; with one, reusing a B register within a
// step (it waits for the multiply before it to finish reading) cost more (session 20, the kernel alone on
// 275 MB: 9 rows 51.5 -> 48.6 ms/GB, 16 rows 58.5 -> 53.8; at 4 chunks 138 against 153, so not there).
// The weights are unpacked a block ahead into a second buffer, between this block's tile multiplies and their
// stores, so the unpacking's loads and stores overlap the tile unit's work (in program order after it, they
// waited behind the stores and the float sums; session 21, the Qwen 1.5B target: 8 rows 51.1 -> 48.1 ms).
// Per (row, column) the blocks go in the same order through the same chain, so the same bits.
ES_AMX void amx_tiles_pairs(const Call& c, int64_t t0, int64_t t1) {
  const Kernel& k = *c.k;
  const int64_t nb = k.nb, ks = k.kstep, steps = k.block / ks;  // steps <= 2
  const int64_t rows = c.rows, wstride = k.block * kTile;
  TileConfig cfg{};
  cfg.palette = 1;
  for (int i = 0; i < 2; ++i) cfg.rows[i] = uint8_t(rows), cfg.colsb[i] = 64;      // C: rows x 16 int32
  for (int i = 2; i < 4; ++i) cfg.rows[i] = uint8_t(rows), cfg.colsb[i] = uint16_t(ks);  // A: rows x ks bytes
  for (int i = 4; i < 8; ++i) cfg.rows[i] = uint8_t(ks / 4), cfg.colsb[i] = 64;  // B: ks/4 k quads x 16 x 4
  _tile_loadconfig(&cfg);
  const AmxBuffers buf = amx_buffers(c, 4);  // two buffers of two column tiles: blocks b (even, odd) and b + 1
  float* acc = buf.acc;
  alignas(64) int32_t cb[2 * 16 * kTile];
  __m512 s[2], m[2];
  for (int64_t t = t0; t < t1; t += 2) {
    const int64_t G = std::min<int64_t>(2, t1 - t);
    std::fill(acc, acc + c.M * 2 * kTile, 0.f);
    for (int64_t j = 0; j < G; ++j) amx_unpack(c, t + j, 0, buf.w + j * wstride);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* wb = buf.w + (b & 1) * 2 * wstride;
      _tile_loadd(4, wb, 64);  // step 0, column tile 0
      if (G > 1) _tile_loadd(5, wb + wstride, 64);
      if (steps > 1) {
        _tile_loadd(6, wb + ks * kTile, 64);  // step 1
        if (G > 1) _tile_loadd(7, wb + wstride + ks * kTile, 64);
      }
      for (int64_t ch = 0; ch < c.chunks; ++ch) {
        const int8_t* xa = c.xa + (b * c.chunks + ch) * rows * k.block;
        _tile_zero(0);
        _tile_zero(1);
        _tile_loadd(2, xa, k.block);
        _tile_dpbssd(0, 2, 4);
        if (G > 1) _tile_dpbssd(1, 2, 5);
        if (steps > 1) {
          _tile_loadd(3, xa + ks, k.block);
          _tile_dpbssd(0, 3, 6);
          if (G > 1) _tile_dpbssd(1, 3, 7);
        }
        if (ch == 0 && b + 1 < nb) {  // the next block's weights into the other buffer (see above)
          uint8_t* wn = buf.w + ((b + 1) & 1) * 2 * wstride;
          for (int64_t j = 0; j < G; ++j) amx_unpack(c, t + j, b + 1, wn + j * wstride);
        }
        _tile_stored(0, cb, 64);
        if (G > 1) _tile_stored(1, cb + 16 * kTile, 64);
        if (ch == 0) amx_block_scales(c, G, t, b, s, m);
        amx_chunk_sums(c, cb, acc, 2, G, s, m, b, ch);
      }
    }
    amx_store_group(c, acc, 2, G, t);
  }
  _tile_release();
}
#endif  // ES_AMX_BUILT

#endif  // ES_X86

// ---- MatMulQ4's portable path: plain C++ (aarch64's, where the compiler vectorizes it; EDGESPEC_Q4_ISA=portable on
// x86-64). The x86 paths' arithmetic, lane for lane: int8 activations per block (quantize_row_portable), each block's
// exact int32 dot less zero point x the activations' sum, converted, then one fused multiply-add (std::fma) by scale x
// the activations' scale per (row, column) in block order, the minimums' second one, the epilogue's add or SwiGLU
// (exp_portable: exp8's operations). So it gives the x86 paths' bits (the tests run them side by side), and a row's
// result does not depend on the call's width here either.

// _mm256_cvtps_epi32 of one float: to nearest, ties to even (the default rounding mode, as std::nearbyint's); a NaN
// or a value out of int32's range gives INT32_MIN, as the instruction does
inline int32_t cvt_nearest(float v) {
  return std::fabs(v) < 2147483648.f ? int32_t(std::nearbyint(v)) : INT32_MIN;
}

// quantize_row's numbers: the block's largest magnitude (max_ps's operand order: a NaN lane ends as the next
// value, and the lanes' max ignores one), its scale and inverse, each value to the nearest int8 in -127..127; a
// block holding a NaN gets a NaN scale, so that the row's results are NaN (an overflow upstream must reach the
// logits' check, not come out as a row of zeros)
void quantize_row_portable(const float* x, int64_t K, int64_t block, int8_t* q, float* d, int32_t* s) {
  for (int64_t b = 0; b < K / block; ++b) {
    const float* xb = x + b * block;
    float mv[8] = {};
    bool nan = false;
    for (int64_t j = 0; j < block; j += 8)
      for (int l = 0; l < 8; ++l) {
        const float a = std::fabs(xb[j + l]);
        nan |= a != a;
        mv[l] = mv[l] > a ? mv[l] : a;
      }
    float amax = 0.f;
    for (float v : mv) amax = std::max(amax, v);
    // inv is 0 where 127 / amax is not finite (amax 0, or below ~3.7e-37): the block's values are then all 0 (0 * inf
    // was NaN and quantized to -127)
    const float scale = amax / 127.f, inv = 127.f / amax <= std::numeric_limits<float>::max() ? 127.f / amax : 0.f;
    int32_t total = 0;
    for (int64_t j = 0; j < block; ++j) {
      const int32_t v = std::min(127, std::max(-127, cvt_nearest(xb[j] * inv)));
      q[b * block + j] = int8_t(v);
      total += v;
    }
    d[b] = nan ? std::numeric_limits<float>::quiet_NaN() : scale;
    s[b] = total;
  }
}

// exp8's operations on one lane (x <= 0; max_ps's operand order: a NaN becomes -87)
inline float exp_portable(float x) {
  x = x > -87.0f ? x : -87.0f;
  const float fx = std::nearbyint(x * 1.44269504088896341f);
  x = std::fma(-fx, 0.693359375f, x);
  x = std::fma(-fx, -2.12194440e-4f, x);
  float y = 1.9875691500e-4f;
  y = std::fma(y, x, 1.3981999507e-3f);
  y = std::fma(y, x, 8.3334519073e-3f);
  y = std::fma(y, x, 4.1665795894e-2f);
  y = std::fma(y, x, 1.6666665459e-1f);
  y = std::fma(y, x, 5.0000001201e-1f);
  y = std::fma(y, x * x, x + 1.0f);
  const uint32_t e = uint32_t(cvt_nearest(fx) + 127) << 23;
  float p;
  std::memcpy(&p, &e, sizeof p);
  return y * p;
}

// swiglu8's operations on one lane
inline float swiglu_portable(float g, float u) {
  const float e = exp_portable(-std::fabs(g));
  const float r = 1.0f / (1.0f + e);
  const float sig = g >= 0.f ? r : e * r;
  return (g * sig) * u;
}

// finish16's epilogue for tile t's 16 sums of row r
void finish_portable(const Call& c, int64_t r, int64_t t, const float* v) {
  const Kernel& k = *c.k;
  const int64_t n0 = (k.swiglu ? t / 2 : t) * kTile, cols = std::min<int64_t>(kTile, k.N - n0);
  float* y = c.y + r * k.N + n0;
  for (int64_t i = 0; i < cols; ++i)
    y[i] = !k.swiglu ? v[i] + c.bias[n0 + i] : t % 2 == 0 ? v[i] : swiglu_portable(y[i], v[i]);
}

// One block's 16 int32 dots of tile t (its weights ``wp``, P groups of 64 bytes) with a row's int8 activations
// ``xb``: per column and group, 4 weight bytes (low nibbles) by activations 8p..8p+3 and their high nibbles by
// 8p+4..8p+7, what a 4-way dot-product instruction takes. Integer sums are exact in any order, so each variant gives
// the same numbers: plain C++, and on aarch64 NEON's (SDOT where the CPU has the dot-product extension, ARMv8.2's:
// a Jetson Orin's Cortex-A78AE; else widening multiplies, ARMv8.0's: a Jetson Nano's or a Raspberry Pi 4's A57/A72).
inline void block_dots_scalar(const uint8_t* wp, const int8_t* xb, int64_t P, int32_t* dot) {
  for (int i = 0; i < kTile; ++i) dot[i] = 0;
  for (int64_t p = 0; p < P; ++p) {
    const uint8_t* g = wp + p * 64;
    const int8_t* x = xb + 8 * p;
    for (int i = 0; i < kTile; ++i) {
      int32_t lo = 0, hi = 0;
      for (int j = 0; j < 4; ++j) {
        lo += int32_t(g[4 * i + j] & 15) * x[j];
        hi += int32_t(g[4 * i + j] >> 4) * x[4 + j];
      }
      dot[i] += lo + hi;
    }
  }
}

#if defined(__aarch64__) && (defined(__clang__) || __GNUC__ >= 8)  // (GCC 7, JetPack 4's, has no dotprod target)
#define ES_SDOT 1
#else
#define ES_SDOT 0
#endif

#if defined(__aarch64__)
std::atomic<bool> g_dotprod{false};  // the CPU has ARMv8.2's dot-product instructions (getauxval, at registration)

#if ES_SDOT
__attribute__((target("arch=armv8.2-a+dotprod"))) void block_dots_sdot(const uint8_t* wp, const int8_t* xb, int64_t P,
                                                                     int32_t* dot) {
  const uint8x16_t lo4 = vdupq_n_u8(0x0F);
  int32x4_t acc[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
  for (int64_t p = 0; p < P; ++p) {
    const uint8_t* g = wp + p * 64;
    int32_t a, b;
    std::memcpy(&a, xb + 8 * p, 4);
    std::memcpy(&b, xb + 8 * p + 4, 4);
    const int8x16_t xa = vreinterpretq_s8_s32(vdupq_n_s32(a)), xh = vreinterpretq_s8_s32(vdupq_n_s32(b));
    for (int q = 0; q < 4; ++q) {  // columns 4q..4q+3: 16 bytes, 4 a column
      const uint8x16_t v = vld1q_u8(g + 16 * q);
      acc[q] = vdotq_s32(acc[q], vreinterpretq_s8_u8(vandq_u8(v, lo4)), xa);
      acc[q] = vdotq_s32(acc[q], vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), xh);
    }
  }
  for (int q = 0; q < 4; ++q) vst1q_s32(dot + 4 * q, acc[q]);
}
#endif

// ARMv8.0: widening multiplies into int16 (|product| <= 15 x 127: two of them and four groups' pair sums fit, as
// the AVX2 path's), their pairs accumulated into int32 lanes, each column's two lanes added at the end
void block_dots_neon(const uint8_t* wp, const int8_t* xb, int64_t P, int32_t* dot) {
  const uint8x16_t lo4 = vdupq_n_u8(0x0F);
  int32x4_t acc[8];  // acc[2q + h]: columns 4q + 2h, 4q + 2h + 1, two lanes each
  for (auto& v : acc) v = vdupq_n_s32(0);
  for (int64_t p = 0; p < P; ++p) {
    const uint8_t* g = wp + p * 64;
    int32_t a, b;
    std::memcpy(&a, xb + 8 * p, 4);
    std::memcpy(&b, xb + 8 * p + 4, 4);
    const int8x8_t xa = vreinterpret_s8_s32(vdup_n_s32(a)), xh = vreinterpret_s8_s32(vdup_n_s32(b));
    for (int q = 0; q < 4; ++q) {
      const uint8x16_t v = vld1q_u8(g + 16 * q);
      const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(v, lo4)), hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
      for (int h = 0; h < 2; ++h) {  // 8 bytes: two columns
        const int8x8_t l = h ? vget_high_s8(lo) : vget_low_s8(lo), u = h ? vget_high_s8(hi) : vget_low_s8(hi);
        acc[2 * q + h] = vpadalq_s16(acc[2 * q + h], vaddq_s16(vmull_s8(l, xa), vmull_s8(u, xh)));
      }
    }
  }
  for (int q = 0; q < 4; ++q)  // lanes (c, c, c + 1, c + 1) of each half: pairwise sums give the 4 columns
    vst1q_s32(dot + 4 * q, vpaddq_s32(acc[2 * q], acc[2 * q + 1]));
}
#endif

inline void block_dots(const uint8_t* wp, const int8_t* xb, int64_t P, int32_t* dot) {
#if defined(__aarch64__)
#if ES_SDOT
  if (g_dotprod.load(std::memory_order_relaxed)) return block_dots_sdot(wp, xb, P, dot);
#endif
  return block_dots_neon(wp, xb, P, dot);
#else
  block_dots_scalar(wp, xb, P, dot);
#endif
}

// row r of column tile t: per block the 16 columns' int32 dots (block_dots), then the float chain per column
void tile_portable(const Call& c, int64_t r, int64_t t) {
  const Kernel& k = *c.k;
  const int64_t nb = k.nb, P = k.block / 8, tb = k.block * kTile / 2;
  float acc[kTile] = {};
  for (int64_t b = 0; b < nb; ++b) {
    int32_t dot[kTile];
    block_dots(c.q.w + (t * nb + b) * tb, c.xq + r * k.K + b * k.block, P, dot);
    const size_t sb = size_t((t * nb + b) * kTile);
    const int64_t rb = r * nb + b;
    const float xd = c.xd[rb], xsum = c.xd[rb] * float(c.xs[rb]);
    const int32_t xs = c.xs[rb];
    float s[kTile], m[kTile] = {};
    int32_t z[kTile];
    if (c.q.ks) {
      const uint8_t* ks = c.q.ks + 2 * sb;
      const float* kd = c.q.scale + size_t((t * (nb / 8) + b / 8) * 2 * kTile);
      for (int i = 0; i < kTile; ++i) {
        s[i] = float(ks[i]) * kd[i];
        m[i] = float(ks[kTile + i]) * kd[kTile + i];
      }
    } else {
      for (int i = 0; i < kTile; ++i) s[i] = c.q.scale[sb + i];
      if (c.q.mn)
        for (int i = 0; i < kTile; ++i) m[i] = c.q.mn[sb + i];
    }
    for (int i = 0; i < kTile; ++i) z[i] = c.q.zp ? int32_t(c.q.zp[sb + i]) : c.q.minimums ? 0 : 8;
    for (int i = 0; i < kTile; ++i) {
      const int32_t corr = int32_t(uint32_t(dot[i]) - uint32_t(z[i]) * uint32_t(xs));  // (mullo's wrap-around)
      acc[i] = std::fma(float(corr), s[i] * xd, acc[i]);
    }
    if (c.q.minimums)
      for (int i = 0; i < kTile; ++i) acc[i] = std::fma(-m[i], xsum, acc[i]);
  }
  if (c.epilogue) return finish_portable(c, r, t, acc);
  const int64_t n0 = t * kTile;
  std::memcpy(c.y + r * k.N + n0, acc, size_t(std::min<int64_t>(kTile, k.N - n0)) * sizeof(float));
}

void run_tiles(const Call& c, int64_t t0, int64_t t1) {
  if (c.k->portable) {
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t r = 0; r < c.M; ++r) tile_portable(c, r, t);
    return;
  }
#if ES_X86
  int64_t r = 0;
  if (c.xa) {
#if ES_AMX_BUILT
    if (c.chunks == 1 && c.k->block / c.k->kstep <= 2)
      amx_tiles_pairs(c, t0, t1);
    else
      amx_tiles(c, t0, t1);
#endif
    return;
  }
  if (c.k->avx512) {
    for (; r + 8 <= c.M; r += 8) rows_tiles<8>(c, r, t0, t1);
    switch (c.M - r) {
      case 7: rows_tiles<7>(c, r, t0, t1); break;
      case 6: rows_tiles<6>(c, r, t0, t1); break;
      case 5: rows_tiles<5>(c, r, t0, t1); break;
      case 4: rows_tiles<4>(c, r, t0, t1); break;
      case 3: rows_tiles<3>(c, r, t0, t1); break;
      case 2: rows_tiles<2>(c, r, t0, t1); break;
      case 1: rows_tiles<1>(c, r, t0, t1); break;
      default: break;
    }
    return;
  }
  // AVX2: every pass of rows over one tile before the next tile, so a wide call reads each tile's weights from
  // memory once (its later passes find them in L1 or L2)
  for (int64_t t = t0; t < t1; ++t) {
    for (r = 0; r + 8 <= c.M; r += 8) rows_tile2<8>(c, r, t);
    switch (c.M - r) {
      case 7: rows_tile2<7>(c, r, t); break;
      case 6: rows_tile2<6>(c, r, t); break;
      case 5: rows_tile2<5>(c, r, t); break;
      case 4: rows_tile2<4>(c, r, t); break;
      case 3: rows_tile2<3>(c, r, t); break;
      case 2: rows_tile2<2>(c, r, t); break;
      case 1: rows_tile2_both<1>(c, r, t); break;
      default: break;
    }
  }
#endif
}

void task(void* data, size_t i) {
  const Call& c = *static_cast<const Call*>(data);
  const int64_t t0 = int64_t(i) * c.chunk, t1 = std::min(c.k->tiles, t0 + c.chunk);
  if (t0 < t1) run_tiles(c, t0, t1);
}

#if ES_X86  // quantize_row: AVX2
// int8 per block, symmetric, round to nearest even (the default rounding of _mm256_cvtps_epi32, as
// std::nearbyint's), the same numbers on both paths; block is a multiple of 8
ES_AVX2 void quantize_row(const float* x, int64_t K, int64_t block, int8_t* q, float* d, int32_t* s) {
  const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256i lim = _mm256_set1_epi32(127), nlim = _mm256_set1_epi32(-127);
  for (int64_t b = 0; b < K / block; ++b) {
    const float* xb = x + b * block;
    __m256 m = _mm256_setzero_ps(), nan = _mm256_setzero_ps();
    for (int64_t j = 0; j < block; j += 8) {
      const __m256 a = _mm256_and_ps(_mm256_loadu_ps(xb + j), absmask);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
      m = _mm256_max_ps(m, a);
    }
    alignas(32) float mv[8];
    _mm256_store_ps(mv, m);
    float amax = 0.f;
    for (float v : mv) amax = std::max(amax, v);
    const float scale = amax / 127.f, inv = 127.f / amax <= std::numeric_limits<float>::max() ? 127.f / amax : 0.f;
    const __m256 vinv = _mm256_set1_ps(inv);
    __m256i sum = _mm256_setzero_si256();
    for (int64_t j = 0; j < block; j += 8) {
      __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + j), vinv));
      v = _mm256_min_epi32(_mm256_max_epi32(v, nlim), lim);
      sum = _mm256_add_epi32(sum, v);
      const __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q + b * block + j), _mm_packs_epi16(p16, p16));
    }
    alignas(32) int32_t sv[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sv), sum);
    int32_t total = 0;
    for (int32_t v : sv) total += v;
    d[b] = _mm256_movemask_ps(nan) ? std::numeric_limits<float>::quiet_NaN() : scale;  // (quantize_row_portable's)
    s[b] = total;
  }
}

#endif  // ES_X86

// One row of a call's activations quantized (quantize_row), and, for the AMX path, copied into its block-major A
// rows (Call::xa, ``mp`` rows a block). Rows are independent: the same bytes whichever thread takes one.
struct Quantize {
  const Kernel* k;
  const float* a;   // [M][K]
  int8_t* xq;       // [M][K]
  float* xd;        // [M][nb]
  int32_t* xs;      // [M][nb]
  int8_t* xa;       // nullptr: no AMX
  int64_t mp;
};
constexpr int64_t kQuantizeParallelRows = 16;
constexpr size_t kKeptActivationBytes = size_t(16) << 20;  // compute_v2's buffers kept between calls, at most

void quantize_task(void* data, size_t i) {
  const Quantize& q = *static_cast<const Quantize*>(data);
  const Kernel& k = *q.k;
  const int64_t m = int64_t(i);
  int8_t* row = q.xq + m * k.K;
#if ES_X86
  if (!k.portable)
    quantize_row(q.a + m * k.K, k.K, k.block, row, q.xd + m * k.nb, q.xs + m * k.nb);
  else
#endif
    quantize_row_portable(q.a + m * k.K, k.K, k.block, row, q.xd + m * k.nb, q.xs + m * k.nb);
  if (q.xa)
    for (int64_t b = 0; b < k.nb; ++b) std::memcpy(q.xa + (b * q.mp + m) * k.block, row + b * k.block, size_t(k.block));
}

OrtStatus* create_kernel_v2(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo* info, void** out) {
  auto* k = new Kernel();
  *out = k;
  auto get = [&](const char* name, int64_t* v) {
    return ok(api<OrtStatus* (*)(const OrtKernelInfo*, const char*, int64_t*)>(kKernelInfoGetAttributeInt64)(info, name, v));
  };
  int64_t bits = 4;
  get("bits", &bits);
  if (!get("K", &k->K) || !get("N", &k->N) || !get("block_size", &k->block))
    return fail("edgespec.MatMulQ4: attributes K, N and block_size are required");
  if (bits != 4 || k->K <= 0 || k->N <= 0 || k->block < 8 || k->block % 8 || k->K % k->block)
    return fail("edgespec.MatMulQ4: needs bits=4, a block_size that is a multiple of 8 and K a multiple of it");
  int64_t swiglu = 0;
  get("swiglu", &swiglu);
  if (swiglu != 0 && swiglu != 1) return fail("edgespec.MatMulQ4: swiglu is 0 or 1");
  k->swiglu = swiglu == 1;
  k->nb = k->K / k->block;
  k->avx512 = g_avx512;
  k->portable = g_portable;
  k->huge = g_hugepages;
  if (g_amx)  // the largest multiple of 4 up to 64 that divides the block (a multiple of 8)
    for (int64_t ks : {64, 32, 16, 8})
      if (k->block % ks == 0) {
        k->kstep = ks;
        break;
      }
  k->tiles = (k->N + kTile - 1) / kTile * (k->swiglu ? 2 : 1);
  return nullptr;
}

void* create_kernel(const OrtCustomOp* op, const OrtApi* a, const OrtKernelInfo* info) {  // before version 16
  void* k = nullptr;
  if (OrtStatus* s = create_kernel_v2(op, a, info, &k)) {
    ok(s);
    static_cast<Kernel*>(k)->K = 0;  // compute() refuses
  }
  return k;
}

// Whether every page of [b, e) (page-aligned) that this process has is a file's own page (or shared memory's),
// none a private copy written since, and none swapped out: /proc/self/pagemap's bits 61 ("file page or shared
// anonymous"), 62 (swapped) and 63 (present). Such pages can be dropped from this process (MADV_DONTNEED) and
// come back unchanged, from the file, should anything read them again; pages not present read as they did.
// onnxruntime maps a bundle's weights privately and writable (rw-p), but never writes them.
// ``sample``: look at up to 9 pages spread over the range only (whether it is a file's mapping at all, before the
// copy: onnxruntime's own memory has its pages present and anonymous; reading the kernel's page table for every
// page of the Qwen pair's weights costs ~0.25 s); the pages are dropped only after every one is checked.
bool file_pages_only(uintptr_t b, uintptr_t e, bool sample = false) {
  FILE* f = std::fopen("/proc/self/pagemap", "rb");
  if (!f) return false;
  const uintptr_t pg = uintptr_t(sysconf(_SC_PAGESIZE));
  const size_t pages = (e - b) / pg;
  auto bad = [](uint64_t v) { return (v >> 62) & 1 || ((v >> 63) & 1 && !((v >> 61) & 1)); };  // swapped, or not the file's
  bool ok = true;
  if (sample) {
    for (size_t i = 0; i < 9 && ok; ++i) {
      uint64_t v = 0;
      const size_t at = pages <= 1 ? 0 : i * (pages - 1) / 8;
      ok = std::fseek(f, long((b / pg + at) * 8), SEEK_SET) == 0 && std::fread(&v, 8, 1, f) == 1 && !bad(v);
    }
  } else {
    std::vector<uint64_t> flags(pages);
    ok = std::fseek(f, long(b / pg * 8), SEEK_SET) == 0 && std::fread(flags.data(), 8, flags.size(), f) == flags.size();
    for (size_t i = 0; ok && i < pages; ++i) ok = !bad(flags[i]);
  }
  std::fclose(f);
  return ok;
}

// Memory on 2 MiB pages for the kernels' weight copies: chunks of 64 MiB (2 MiB-aligned, transparent huge pages
// asked for with madvise, reserved lazily: only what is written is resident), cut into 64-byte-aligned slices in
// the order kernels ask; a chunk is unmapped when the last kernel with a slice of it is destroyed. One pool, so
// a small matrix does not hold a 2 MiB page of its own.
struct Chunk {
  uint8_t* base;
  size_t size, used;
  int live;
};
std::mutex g_pool_mu;
Chunk* g_open = nullptr;  // the chunk slices are cut from now

void* pool_take(size_t bytes, Chunk** from) {
  constexpr size_t kHuge = size_t(2) << 20, kChunk = size_t(64) << 20;
  bytes = (bytes + 63) / 64 * 64;
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (!g_open || g_open->used + bytes > g_open->size) {
    const size_t size = std::max(kChunk, (bytes + kHuge - 1) / kHuge * kHuge);
    void* m = mmap(nullptr, size + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    // a huge page needs a 2 MiB-aligned address: keep the aligned part, unmap the slack either side
    const uintptr_t lo = reinterpret_cast<uintptr_t>(m), at = (lo + kHuge - 1) / kHuge * kHuge;
    if (at > lo) munmap(m, at - lo);
    if (lo + kHuge > at) munmap(reinterpret_cast<void*>(at + size), lo + kHuge - at);
    madvise(reinterpret_cast<void*>(at), size, MADV_HUGEPAGE);
    if (g_open && g_open->live == 0) {  // nothing lives in the old one (kernels came and went)
      munmap(g_open->base, g_open->size);
      delete g_open;
    }
    g_open = new Chunk{reinterpret_cast<uint8_t*>(at), size, 0, 0};
  }
  void* p = g_open->base + g_open->used;
  g_open->used += bytes;
  g_open->live += 1;
  *from = g_open;
  return p;
}

void pool_give(Chunk* c) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  if (--c->live > 0) return;
  if (c == g_open) {  // the open chunk stays for the next kernels, empty: its pages handed back, cut from its start
    madvise(c->base, c->used, MADV_DONTNEED);
    c->used = 0;
    return;
  }
  munmap(c->base, c->size);
  delete c;
}

Kernel::~Kernel() {
  if (own) pool_give(own);
}

// The weights copied once, at the first call, into the pool's memory on 2 MiB pages: onnxruntime maps a
// bundle's weights from its file in 4 KiB pages (or, where the page cache has them so, in larger folios: how
// fast a call streams them then depended on where the file's pages happened to sit, up to 25%, session 18),
// and a call streams them all, a TLB miss every 4 KiB (a nested page walk in a virtual machine). Session 19,
// the Qwen 1.5B from bundles/ on the Xeon: a one-token target call 34.8 -> 31.1 ms, a drafter step 10.0 ->
// 8.7 ms (README). Where every page of the weights this process has is the file's own (file_pages_only), they
// are then dropped from the process: they stay in the page cache for the next process and in the file, so the
// copy does not double the resident memory. No copy where the memory cannot be had, or where the weights are not
// a file's pages (they could not be handed back): calls then read the weights where they are. Either way the same
// numbers.
void own_weights(Kernel* k, const uint8_t* w, const float* s, const uint8_t* z, size_t tile_blocks, size_t scales,
                 const float* mn, const uint8_t* ks) {
  const size_t wb = tile_blocks * size_t(k->block) * kTile / 2, sb = scales * sizeof(float),
               zb = z ? tile_blocks * kTile : 0, mb = mn ? tile_blocks * kTile * sizeof(float) : 0,
               kb = ks ? tile_blocks * 2 * kTile : 0;
  const uintptr_t pg = uintptr_t(sysconf(_SC_PAGESIZE));
  auto inner = [pg](const void* q, size_t n) {  // the whole pages inside [q, q + n): (begin, end)
    const uintptr_t a = reinterpret_cast<uintptr_t>(q);
    return std::make_pair((a + pg - 1) / pg * pg, (a + n) / pg * pg);
  };
  const auto [wb0, we0] = inner(w, wb);
  // weights that are not a file's pages (onnxruntime's own copy of them) could not be handed back: a copy
  // would hold them twice, so they are read where they are
  if (we0 > wb0 && !file_pages_only(wb0, we0, true)) return;
  Chunk* from = nullptr;
  uint8_t* p = static_cast<uint8_t*>(pool_take(wb + sb + zb + mb + kb, &from));
  if (!p) return;
  std::memcpy(p, w, wb);
  std::memcpy(p + wb, s, sb);
  if (z) std::memcpy(p + wb + sb, z, zb);
  if (mn) std::memcpy(p + wb + sb + zb, mn, mb);  // (offsets multiples of 16 bytes)
  if (ks) std::memcpy(p + wb + sb + zb + mb, ks, kb);
  k->own = from;
  k->own_src = w;
  k->own_w = p;
  k->own_s = reinterpret_cast<const float*>(p + wb);
  k->own_z = z ? p + wb + sb : nullptr;
  k->own_mn = mn ? reinterpret_cast<const float*>(p + wb + sb + zb) : nullptr;
  k->own_ks = ks ? p + wb + sb + zb + mb : nullptr;
  auto drop = [&inner](const void* q, size_t n) {
    const auto [b, e] = inner(q, n);
    if (e > b && file_pages_only(b, e)) madvise(reinterpret_cast<void*>(b), e - b, MADV_DONTNEED);
  };
  drop(w, wb);
  drop(s, sb);
  if (z) drop(z, zb);
  if (mn) drop(mn, mb);
  if (ks) drop(ks, kb);
}

OrtStatus* compute_v2(void* self, OrtKernelContext* ctx);

void compute(void* self, OrtKernelContext* ctx) {
  OrtStatus* s = compute_v2(self, ctx);
  if (s) ok(s);
}

OrtStatus* compute_v2(void* self, OrtKernelContext* ctx) {
  auto* k = static_cast<Kernel*>(self);
  size_t count = 0;
  api<OrtStatus* (*)(const OrtKernelContext*, size_t*)>(kKernelContextGetInputCount)(ctx, &count);
  auto input = [&](size_t i) -> const OrtValue* {
    if (i >= count) return nullptr;
    const OrtValue* v = nullptr;
    if (!ok(api<OrtStatus* (*)(const OrtKernelContext*, size_t, const OrtValue**)>(kKernelContextGetInput)(ctx, i, &v)))
      return nullptr;
    return v;
  };
  const OrtValue *A = input(0), *B = input(1), *S = input(2), *Z = input(3), *bias = input(4), *Mn = input(5), *Ks = input(6);
  std::vector<int64_t> ad = A ? dims_of(A) : std::vector<int64_t>();
  if (!k->K) return fail("edgespec.MatMulQ4: bad attributes");
  if (!A || !B || !S) return fail("edgespec.MatMulQ4: inputs A, B and scales are required");
  if (ad.empty() || ad.back() != k->K) return fail("edgespec.MatMulQ4: A's last dimension is not K");
  auto numel = [](const std::vector<int64_t>& d) {
    int64_t n = 1;
    for (int64_t x : d) n *= x;
    return d.empty() ? int64_t(0) : n;
  };
  const void* b_data = data_of(B);
  if (k->checked.load(std::memory_order_acquire) != b_data) {  // the weights are initializers: their sizes are checked once, not every call
    const int64_t tile_blocks = k->tiles * k->nb;
    // (k-quant scales: the scales input holds two floats per column and super-block of 8 blocks)
    const int64_t scales = Ks ? k->tiles * (k->nb / 8) * 2 * kTile : tile_blocks * kTile;
    if (Ks && (k->nb % 8 || Mn))
      return fail("edgespec.MatMulQ4: k-quant scales take super-blocks of 8 blocks (K a multiple of 8 x block_size) "
                  "and no float minimums");
    if (Ks && numel(dims_of(Ks)) != tile_blocks * 2 * kTile)
      return fail("edgespec.MatMulQ4: k-quant scales do not have the size K, N and block_size say (tiled layout)");
    if (numel(dims_of(B)) != tile_blocks * k->block * kTile / 2 || numel(dims_of(S)) != scales)
      return fail("edgespec.MatMulQ4: B or scales do not have the size K, N and block_size say (tiled layout)");
    if (Z && numel(dims_of(Z)) != tile_blocks * kTile)
      return fail("edgespec.MatMulQ4: zero points do not have the size K, N and block_size say (tiled layout)");
    if (Mn && numel(dims_of(Mn)) != tile_blocks * kTile)
      return fail("edgespec.MatMulQ4: minimums do not have the size K, N and block_size say (tiled layout)");
    std::lock_guard<std::mutex> lock(k->mu);  // runs may overlap: one copy, published before checked says so
    if (Z) {  // the AMX path's bound on zero points (see kAmxMaxZero)
      const uint8_t* z = static_cast<const uint8_t*>(data_of(Z));
      k->amx_zero_ok.store(*std::max_element(z, z + tile_blocks * kTile) <= kAmxMaxZero, std::memory_order_relaxed);
    }
    if (k->huge && !k->own)
      own_weights(k, static_cast<const uint8_t*>(b_data), static_cast<const float*>(data_of(S)),
                  Z ? static_cast<const uint8_t*>(data_of(Z)) : nullptr, size_t(tile_blocks), size_t(scales),
                  Mn ? static_cast<const float*>(data_of(Mn)) : nullptr,
                  Ks ? static_cast<const uint8_t*>(data_of(Ks)) : nullptr);
    k->checked.store(b_data, std::memory_order_release);
  }
  if (bias && (numel(dims_of(bias)) != k->N || k->swiglu))  // (every call: a bias need not be an initializer)
    return fail("edgespec.MatMulQ4: the bias has N values, and a SwiGLU kernel takes none");
  int64_t M = 1;
  for (size_t i = 0; i + 1 < ad.size(); ++i) M *= ad[i];
  std::vector<int64_t> yd = ad;
  yd.back() = k->N;
  OrtValue* Y = nullptr;
  if (OrtStatus* s = api<OrtStatus* (*)(OrtKernelContext*, size_t, const int64_t*, size_t, OrtValue**)>(kKernelContextGetOutput)(
          ctx, 0, yd.data(), yd.size(), &Y))
    return s;
  if (M == 0) return nullptr;
  const float* a = static_cast<const float*>(data_of(A));
  const bool amx = k->kstep && M >= amx_min_rows(k->block) && k->amx_zero_ok.load(std::memory_order_relaxed);
  const int64_t chunks = amx ? (M + kAmxRows - 1) / kAmxRows : 0;
  // the quantized activations, in this thread's buffers kept from call to call (a prefill chunk's are MBs: fresh
  // vectors each call came as fresh pages, faulted in and cleared, 5% of a 1,024-token prefill in session 20)
  thread_local std::vector<int8_t> xq, xa;
  thread_local std::vector<float> xd;
  thread_local std::vector<int32_t> xs;
  struct Trim {  // ... up to kKeptActivationBytes each: a larger call's (an unchunked long prefill) are let go after it
    ~Trim() {
      for (auto* v : {&xq, &xa})
        if (v->capacity() > kKeptActivationBytes) std::vector<int8_t>().swap(*v);
    }
  } trim;
  auto fit = [](auto& v, int64_t n) {
    if (v.size() < size_t(n)) v.resize(size_t(n));
  };
  fit(xq, M * k->K);
  fit(xd, M * k->nb);
  fit(xs, M * k->nb);
  Weights q{static_cast<const uint8_t*>(b_data), static_cast<const float*>(data_of(S)),
            Z ? static_cast<const uint8_t*>(data_of(Z)) : nullptr, Mn ? static_cast<const float*>(data_of(Mn)) : nullptr,
            Ks ? static_cast<const uint8_t*>(data_of(Ks)) : nullptr, Mn || Ks};
  if (k->own && k->own_src == b_data) q = Weights{k->own_w, k->own_s, k->own_z, k->own_mn, k->own_ks, q.minimums};
  Call c{k, q, M, xq.data(), xd.data(), xs.data(), static_cast<float*>(data_of(Y)),
         bias ? static_cast<const float*>(data_of(bias)) : nullptr, bias || k->swiglu, 0, nullptr, 0, 0};
  Quantize qt{k, a, xq.data(), xd.data(), xs.data(), nullptr, 0};
  if (amx) {  // AMX's A tiles (see Call::xa)
    g_amx_calls.fetch_add(1, std::memory_order_relaxed);
    c.chunks = chunks;
    c.rows = std::min<int64_t>(M, kAmxRows);
    qt.mp = chunks * c.rows;  // rows a block holds: whole chunks (c.rows is kAmxRows from 2 chunks on)
    fit(xa, qt.mp * k->K);
    for (int64_t b = 0; b < k->nb && qt.mp > M; ++b)  // the padding rows: zeros
      std::memset(xa.data() + (b * qt.mp + M) * k->block, 0, size_t((qt.mp - M) * k->block));
    c.xa = qt.xa = xa.data();
  }
  // rows are quantized on both threads from kQuantizeParallelRows rows (a prefill chunk's 256 rows of the down
  // projection's 8,960 columns took ~1.5 ms on one)
  using PF = OrtStatus* (*)(const OrtKernelContext*, void (*)(void*, size_t), size_t, size_t, void*);
  if (!(g_parallel && M >= kQuantizeParallelRows &&
        ok(api<PF>(kKernelContextParallelFor)(ctx, quantize_task, size_t(M), 0, &qt))))
    for (int64_t m = 0; m < M; ++m) quantize_task(&qt, size_t(m));
  // about 64 KiB of packed weights a task, at least 4 tiles
  c.chunk = std::max<int64_t>(4, (64 * 1024) / std::max<int64_t>(1, k->nb * k->block * kTile / 2));
  if (c.xa)  // each AMX task configures the tiles and sets up its buffers: few tasks (8), whole groups of four tiles
    c.chunk = std::max<int64_t>(c.chunk, (k->tiles + 31) / 32 * 4);
  if (k->swiglu) c.chunk += c.chunk & 1;  // whole (gate, up) pairs (an even start: the gate's tile first)
  const int64_t tasks = (k->tiles + c.chunk - 1) / c.chunk;
  if (g_parallel && tasks > 1) {
    if (ok(api<PF>(kKernelContextParallelFor)(ctx, task, size_t(tasks), 0, &c))) return nullptr;
  }
  run_tiles(c, 0, k->tiles);
  return nullptr;
}


// ---- edgespec.DecodeAttention: GroupQueryAttention for the CPU, its arithmetic the same for every call width ----
//
// What `edgespec exact-kernels` puts in place of the builder's com.microsoft.GroupQueryAttention (float32, packed
// QKV, rotary embedding with cos/sin caches, a KV cache of [1, kv_heads, L, head] bound as both past and present,
// causal). onnxruntime's CPU kernel spends ~75-137 us a layer at 256 positions on overhead (session 17's profile)
// and computes one query row on another path than several. Here every query row is computed on its own, the same
// way whatever the call's width: its rotary, its dot products with the keys 0..its position (one fused
// multiply-add chain of 8 lanes per key, summed in a fixed order), the softmax (the max, then exp(s - max) summed
// in key order), the weighted sum of the values in key order. The new keys and values are written first.
//   inputs:  qkv [1, n, (H + 2 KVH) * D], past_key, past_value [1, KVH, L, D], seqlens_k int32 [1] (valid - 1),
//            cos, sin [P, R] (non-interleaved rotary over the head's first 2R lanes: R = D / 2, or fewer for a partial
//            rotary, whose other lanes pass as they are, as onnxruntime's op; rotary_interleaved 1: lanes 2j and 2j + 1
//            are the pairs, GPT-J's and ERNIE 4.5's)
//   outputs: out [1, n, H * D], present_key, present_value (the past buffers, written in place when bound so)
//   attributes: num_heads, kv_num_heads (int), scale (float, 0: 1 / sqrt(D)); optional, as onnxruntime's op:
//            local_window_size (int, -1: none; W > 0: a query at position p attends its last W keys, max(0, p - W + 1)
//            .. p, as onnxruntime 1.32's op) and softcap (float, 0: none; c > 0: each scaled score s becomes c * tanh(s / c) before the softmax)
// edgespec.DecodeAttentionF16 is the same op over float16 caches (`exact-kernels --kv-dtype float16`): half the bytes
// a decode call streams and half the memory. A new key or value is rounded to float16 (to nearest, ties to even) as it
// is written, and every query reads the keys and values from the cache, its own row's too, each widened to float32
// as it is loaded: the arithmetic after that is the float32 op's, so the rows stay the same at every width.

struct Attn {
  int64_t H = 0, KVH = 0;
  float scale = 0.f;
  int64_t window = -1;  // local_window_size (-1: every key up to the query's)
  float softcap = 0.f;  // 0: none
  bool interleaved = false;  // rotary_interleaved: pairs of adjacent lanes
  bool ok = false;
  bool avx512 = false;  // 16-lane chains where the heads allow (the path chosen at registration, as MatMulQ4's)
  bool portable = false;  // the portable path (attend_rows_portable: the AVX2 path's 8-lane arithmetic)
  bool quads = true;    // g_attn_quads when the kernel was made
  bool half = false;    // edgespec.DecodeAttentionF16: float16 caches
  bool q8 = false;      // edgespec.DecodeAttentionQ8: int8 caches (rows of numbers and their groups' scales)
};

// a cache's elements: float32, float16 bits (uint16_t) widened as they are loaded, or int8 (Q8: rows of D int8
// numbers and then D / 32 float32 scales, one per group of 32 lanes; a lane's value is its number times its group's
// scale, one rounding, computed as it is loaded)
using Half = uint16_t;
using Q8 = int8_t;
constexpr int64_t kQ8Group = 32;
// a cache row's length in elements: D, or for Q8 D bytes of numbers and D / 32 scales of 4 bytes
template <typename T> inline int64_t row_len(int64_t D) { return D; }
template <> inline int64_t row_len<Q8>(int64_t D) { return D + D / kQ8Group * int64_t(sizeof(float)); }
// lane d's group scale of a Q8 row of D lanes (d: a multiple of 8 within one group)
inline float q8_scale(const Q8* row, int64_t d, int64_t D) {
  float s;
  std::memcpy(&s, row + D + d / kQ8Group * int64_t(sizeof(float)), sizeof s);
  return s;
}
#if ES_X86  // the x86 paths' cache loads and stores: lanes d.. of a row of D lanes
template <typename T> inline __m256 ld8(const T* row, int64_t d, int64_t D);
template <> ES_AVX2 inline __m256 ld8<float>(const float* row, int64_t d, int64_t) { return _mm256_loadu_ps(row + d); }
template <> ES_AVX2 inline __m256 ld8<Half>(const Half* row, int64_t d, int64_t) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d)));
}
template <> ES_AVX2 inline __m256 ld8<Q8>(const Q8* row, int64_t d, int64_t D) {
  const __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + d))));
  return _mm256_mul_ps(x, _mm256_set1_ps(q8_scale(row, d, D)));
}
template <typename T> inline __m512 ld16(const T* row, int64_t d, int64_t D);
template <> ES_AVX512 inline __m512 ld16<float>(const float* row, int64_t d, int64_t) { return _mm512_loadu_ps(row + d); }
template <> ES_AVX512 inline __m512 ld16<Half>(const Half* row, int64_t d, int64_t) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + d)));
}
template <> ES_AVX512 inline __m512 ld16<Q8>(const Q8* row, int64_t d, int64_t D) {
  const __m512 x = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + d))));
  return _mm512_mul_ps(x, _mm512_set1_ps(q8_scale(row, d, D)));
}
// D floats (a multiple of 8) into the cache's type: float16 rounded to nearest, ties to even (as numpy's astype),
// saturating at +-65504 (float16's largest) where numpy would give an infinity, whose scores and softmax would be
// NaN; a NaN stays NaN (max and min return their second operand when either is NaN)
ES_AVX2 inline void store_row(const float* x, float* y, int64_t D) { std::memcpy(y, x, size_t(D) * sizeof(float)); }
ES_AVX2 inline void store_row(const float* x, Half* y, int64_t D) {
  const __m256 lo = _mm256_set1_ps(-65504.0f), hi = _mm256_set1_ps(65504.0f);
  for (int64_t d = 0; d < D; d += 8) {
    const __m256 v = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_loadu_ps(x + d)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + d), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

#endif  // ES_X86

template <typename T>
struct AttnCall {
  const Attn* a;
  int64_t n, D, L, past;
  const float* qkv;
  const float *cos, *sin;
  const T *K, *V;  // present: [KVH, L, D]
  float* out;
  float scale;
  bool wide;  // the AVX-512 (16-lane) path
  // >= 0 (a one-row call: an alternate, see attend): the row's own key and value, its last (at position past), are
  // read from this slot, not from slot past
  int64_t own = -1;
  int64_t rot = 0;  // the rotary's pairs (cos and sin columns): D / 2, or fewer for a partial rotary
};

// non-interleaved rotary of one head vector of D at position pos over its first 2 x half lanes (x1 = x[:half],
// x2 = x[half:2 half]); the lanes past them (a partial rotary: Phi-4-mini, Phi-2, StableLM) are copied
// interleaved (GPT-J's, ERNIE 4.5's: rotary_interleaved): the pairs are lanes 2j and 2j + 1
inline void rotary(const float* x, float* y, const float* cos, const float* sin, int64_t half, int64_t D,
                   bool interleaved) {
  if (interleaved) {
    for (int64_t j = 0; j < half; ++j) {
      const float c = cos[j], s = sin[j], a = x[2 * j], b = x[2 * j + 1];
      y[2 * j] = a * c - b * s;
      y[2 * j + 1] = b * c + a * s;
    }
  } else {
    for (int64_t j = 0; j < half; ++j) {
      const float c = cos[j], s = sin[j], a = x[j], b = x[j + half];
      y[j] = a * c - b * s;
      y[j + half] = b * c + a * s;
    }
  }
  for (int64_t j = 2 * half; j < D; ++j) y[j] = x[j];
}

#if ES_X86  // DecodeAttention's AVX2 and AVX-512 tiles
// the sums of the lanes of 8 vectors, one per lane of the result, each by the same tree:
// ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7)), whatever the other vectors hold
ES_AVX2 inline __m256 sum8x8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// how far ahead (keys) the scores and the value sums prefetch the keys and values they will read (into L1), where
// the first queries of a task read a block: a decode call's cache streams from memory, which the hardware's
// prefetchers alone fed at 4-10 GB/s (a one-token call of the Qwen 1.5B at 2,048 positions)
constexpr int64_t kAttnPrefetch = 64;

// rows [row, row + rows) of a [keys, D] cache towards L1 (a prefetch never faults: rows past the cache cost nothing)
template <typename T>
inline void prefetch_rows(const T* base, int64_t row, int64_t rows, int64_t D) {
  const int64_t S = row_len<T>(D);
  const char* p = reinterpret_cast<const char*>(base + row * S);
  const int64_t bytes = rows * S * int64_t(sizeof(T));
  for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
}

// two queries' value sums over keys [k0, kb) of 8 * NV output lanes from d0 (the first query's keys end at ka <= kb):
// per lane one chain of fused multiply-adds in key order, continued from (and stored back to) ca and cb
template <int NV, typename T>
ES_AVX2 inline void weigh_pair(const float* pa, const float* pb, const T* V, int64_t D, int64_t d0, int64_t k0,
                               int64_t ka, int64_t kb, float* ca, float* cb, bool two, bool pf) {
  __m256 a[NV], b[NV];
  for (int v = 0; v < NV; ++v) {
    a[v] = _mm256_loadu_ps(ca + d0 + 8 * v);
    b[v] = _mm256_loadu_ps(cb + d0 + 8 * v);
  }
  int64_t r = k0;
  for (; r < ka; ++r) {
    const T* vr = V + r * row_len<T>(D);
    if (pf) prefetch_rows(V, r + kAttnPrefetch, 1, D);
    const __m256 wa = _mm256_set1_ps(pa[r]), wb = _mm256_set1_ps(pb[r]);
    for (int v = 0; v < NV; ++v) {
      const __m256 x = ld8(vr, d0 + 8 * v, D);
      a[v] = _mm256_fmadd_ps(wa, x, a[v]);
      b[v] = _mm256_fmadd_ps(wb, x, b[v]);
    }
  }
  for (; r < kb; ++r) {  // the later query's keys past the earlier one's
    const T* vr = V + r * row_len<T>(D);
    if (pf) prefetch_rows(V, r + kAttnPrefetch, 1, D);
    const __m256 wb = _mm256_set1_ps(pb[r]);
    for (int v = 0; v < NV; ++v) b[v] = _mm256_fmadd_ps(wb, ld8(vr, d0 + 8 * v, D), b[v]);
  }
  for (int v = 0; v < NV; ++v) {
    if (two) _mm256_storeu_ps(cb + d0 + 8 * v, b[v]);
    _mm256_storeu_ps(ca + d0 + 8 * v, a[v]);
  }
}

// scores of two queries (qa, qb) for keys [j0, kn) (kn - j0 <= kAttnKeys), into sa and sb (sb only if two): per
// (query, key) one chain of fused multiply-adds over the head's chunks, then a fixed tree over the lanes; four keys
// a tile (a last tile padded with zero keys). The 8-lane version (AVX2) and the 16-lane one (AVX-512, heads a
// multiple of 16) compute different bits; a process takes one of them for every call (Attn::wide)
template <typename T>
ES_AVX2 void qk_block_avx2(const float* qa, const float* qb, const T* K, const T* zero, int64_t D, int64_t j0,
                           int64_t kn, float scale, float* sa, float* sb, bool two, bool pf) {
  alignas(32) float t[8];
  const __m256 sv = _mm256_set1_ps(scale);
  for (int64_t j = j0; j < kn; j += 4) {
    if (pf) prefetch_rows(K, j + kAttnPrefetch, 4, D);
    const T* kr[4];
    for (int u = 0; u < 4; ++u) kr[u] = j + u < kn ? K + (j + u) * row_len<T>(D) : zero;
    __m256 acc[8];
    for (int u = 0; u < 8; ++u) acc[u] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
      const __m256 va = _mm256_loadu_ps(qa + d), vb = _mm256_loadu_ps(qb + d);
      for (int u = 0; u < 4; ++u) {
        const __m256 kv = ld8(kr[u], d, D);
        acc[u] = _mm256_fmadd_ps(va, kv, acc[u]);
        acc[4 + u] = _mm256_fmadd_ps(vb, kv, acc[4 + u]);
      }
    }
    _mm256_store_ps(t, _mm256_mul_ps(sum8x8(acc), sv));
    std::memcpy(sa + j, t, 4 * sizeof(float));
    if (two) std::memcpy(sb + j, t + 4, 4 * sizeof(float));
  }
}

// the scores of keys j..j+3 for two queries from their 16-lane chains (acc[u]: the first query and key j + u, acc[4 + u]:
// the second's): lane i + lane i + 8, then sum8x8's tree, times the scale, into sa (and sb if two)
ES_AVX512 inline void store_scores(const __m512* acc, __m256 sv, int64_t j, float* sa, float* sb, bool two) {
  alignas(32) float t[8];
  __m256 half[8];
  for (int u = 0; u < 8; ++u)
    half[u] = _mm256_add_ps(_mm512_castps512_ps256(acc[u]),
                            _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[u]), 1)));
  _mm256_store_ps(t, _mm256_mul_ps(sum8x8(half), sv));
  std::memcpy(sa + j, t, 4 * sizeof(float));
  if (two) std::memcpy(sb + j, t + 4, 4 * sizeof(float));
}

template <typename T>
ES_AVX512 void qk_block_avx512(const float* qa, const float* qb, const T* K, const T* zero, int64_t D,
                               int64_t j0, int64_t kn, float scale, float* sa, float* sb, bool two, bool pf) {
  const __m256 sv = _mm256_set1_ps(scale);
  for (int64_t j = j0; j < kn; j += 4) {
    if (pf) prefetch_rows(K, j + kAttnPrefetch, 4, D);
    const T* kr[4];
    for (int u = 0; u < 4; ++u) kr[u] = j + u < kn ? K + (j + u) * row_len<T>(D) : zero;
    __m512 acc[8];
    for (int u = 0; u < 8; ++u) acc[u] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
      const __m512 va = _mm512_loadu_ps(qa + d), vb = _mm512_loadu_ps(qb + d);
      for (int u = 0; u < 4; ++u) {
        const __m512 kv = ld16(kr[u], d, D);
        acc[u] = _mm512_fmadd_ps(va, kv, acc[u]);
        acc[4 + u] = _mm512_fmadd_ps(vb, kv, acc[4 + u]);
      }
    }
    store_scores(acc, sv, j, sa, sb, two);
  }
}

template <typename T>
ES_AVX2 void weigh_avx2(const float* pa, const float* pb, const T* V, int64_t D, int64_t k0, int64_t ka,
                        int64_t kb, float* ca, float* cb, bool two, bool pf) {
  int64_t d0 = 0;  // (the first slice prefetches the rows)
  for (; d0 + 32 <= D; d0 += 32) weigh_pair<4>(pa, pb, V, D, d0, k0, ka, kb, ca, cb, two, pf && d0 == 0);
  for (; d0 < D; d0 += 8) weigh_pair<1>(pa, pb, V, D, d0, k0, ka, kb, ca, cb, two, pf && d0 == 0);
}

// weigh_pair with 16-lane vectors: 64 lanes a slice, then 16 (heads a multiple of 16)
template <int NV, typename T>
ES_AVX512 inline void weigh_pair16(const float* pa, const float* pb, const T* V, int64_t D, int64_t d0, int64_t k0,
                                   int64_t ka, int64_t kb, float* ca, float* cb, bool two, bool pf) {
  __m512 a[NV], b[NV];
  for (int v = 0; v < NV; ++v) {
    a[v] = _mm512_loadu_ps(ca + d0 + 16 * v);
    b[v] = _mm512_loadu_ps(cb + d0 + 16 * v);
  }
  int64_t r = k0;
  for (; r < ka; ++r) {
    const T* vr = V + r * row_len<T>(D);
    if (pf) prefetch_rows(V, r + kAttnPrefetch, 1, D);
    const __m512 wa = _mm512_set1_ps(pa[r]), wb = _mm512_set1_ps(pb[r]);
    for (int v = 0; v < NV; ++v) {
      const __m512 x = ld16(vr, d0 + 16 * v, D);
      a[v] = _mm512_fmadd_ps(wa, x, a[v]);
      b[v] = _mm512_fmadd_ps(wb, x, b[v]);
    }
  }
  for (; r < kb; ++r) {
    const T* vr = V + r * row_len<T>(D);
    if (pf) prefetch_rows(V, r + kAttnPrefetch, 1, D);
    const __m512 wb = _mm512_set1_ps(pb[r]);
    for (int v = 0; v < NV; ++v) b[v] = _mm512_fmadd_ps(wb, ld16(vr, d0 + 16 * v, D), b[v]);
  }
  for (int v = 0; v < NV; ++v) {
    if (two) _mm512_storeu_ps(cb + d0 + 16 * v, b[v]);
    _mm512_storeu_ps(ca + d0 + 16 * v, a[v]);
  }
}

template <typename T>
ES_AVX512 void weigh_avx512(const float* pa, const float* pb, const T* V, int64_t D, int64_t k0, int64_t ka,
                            int64_t kb, float* ca, float* cb, bool two, bool pf) {
  int64_t d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) weigh_pair16<4>(pa, pb, V, D, d0, k0, ka, kb, ca, cb, two, pf && d0 == 0);
  for (; d0 < D; d0 += 16) weigh_pair16<1>(pa, pb, V, D, d0, k0, ka, kb, ca, cb, two, pf && d0 == 0);
}

// scores of four queries (q[0..3]; n of them real, the rest repeats) for keys [j0, kn): per (query, key) the chain
// and tree of qk_block_avx512 (the same bits), each key tile loaded once for four queries
template <typename T>
ES_AVX512 void qk_block4_avx512(const float* const* q, int n, const T* K, const T* zero, int64_t D,
                                int64_t j0, int64_t kn, float scale, float* const* s, bool pf) {
  const __m256 sv = _mm256_set1_ps(scale);
  for (int64_t j = j0; j < kn; j += 4) {
    if (pf) prefetch_rows(K, j + kAttnPrefetch, 4, D);
    const T* kr[4];
    for (int u = 0; u < 4; ++u) kr[u] = j + u < kn ? K + (j + u) * row_len<T>(D) : zero;
    __m512 acc[16];  // query p, key u: acc[4 * p + u]
    for (int u = 0; u < 16; ++u) acc[u] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
      const __m512 v0 = _mm512_loadu_ps(q[0] + d), v1 = _mm512_loadu_ps(q[1] + d), v2 = _mm512_loadu_ps(q[2] + d),
                   v3 = _mm512_loadu_ps(q[3] + d);
      for (int u = 0; u < 4; ++u) {
        const __m512 kv = ld16(kr[u], d, D);
        acc[u] = _mm512_fmadd_ps(v0, kv, acc[u]);
        acc[4 + u] = _mm512_fmadd_ps(v1, kv, acc[4 + u]);
        acc[8 + u] = _mm512_fmadd_ps(v2, kv, acc[8 + u]);
        acc[12 + u] = _mm512_fmadd_ps(v3, kv, acc[12 + u]);
      }
    }
    for (int p = 0; p < n; p += 2) store_scores(acc + 4 * p, sv, j, s[p], s[p + 1], p + 1 < n);  // two queries a time
  }
}

// four queries' value sums over keys [k0, k[3]) of 16 * NV output lanes from d0, query p's keys ending at k[p]
// (k[0] <= k[1] <= k[2] <= k[3]): per lane one chain of fused multiply-adds in key order, as weigh_pair16's
template <int NV, typename T>
ES_AVX512 inline void weigh4_16(const float* const* pw, const T* V, int64_t D, int64_t d0, int64_t k0,
                                const int64_t* k, float* const* c, int n, bool pf) {
  __m512 a[4][NV];
  for (int p = 0; p < 4; ++p)
    for (int v = 0; v < NV; ++v) a[p][v] = _mm512_loadu_ps(c[p] + d0 + 16 * v);
  int64_t r = k0;
  for (; r < k[0]; ++r) {  // every query
    const T* vr = V + r * row_len<T>(D);
    if (pf) prefetch_rows(V, r + kAttnPrefetch, 1, D);
    const __m512 w0 = _mm512_set1_ps(pw[0][r]), w1 = _mm512_set1_ps(pw[1][r]), w2 = _mm512_set1_ps(pw[2][r]),
                 w3 = _mm512_set1_ps(pw[3][r]);
    for (int v = 0; v < NV; ++v) {
      const __m512 x = ld16(vr, d0 + 16 * v, D);
      a[0][v] = _mm512_fmadd_ps(w0, x, a[0][v]);
      a[1][v] = _mm512_fmadd_ps(w1, x, a[1][v]);
      a[2][v] = _mm512_fmadd_ps(w2, x, a[2][v]);
      a[3][v] = _mm512_fmadd_ps(w3, x, a[3][v]);
    }
  }
  for (int p0 = 1; p0 < 4; ++p0)  // then the later queries' keys past the earlier ones'
    for (; r < k[p0]; ++r) {
      const T* vr = V + r * row_len<T>(D);
      if (pf) prefetch_rows(V, r + kAttnPrefetch, 1, D);
      for (int v = 0; v < NV; ++v) {
        const __m512 x = ld16(vr, d0 + 16 * v, D);
        for (int p = p0; p < 4; ++p) a[p][v] = _mm512_fmadd_ps(_mm512_set1_ps(pw[p][r]), x, a[p][v]);
      }
    }
  for (int p = 0; p < n; ++p)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c[p] + d0 + 16 * v, a[p][v]);
}

template <typename T>
ES_AVX512 void weigh4_avx512(const float* const* pw, const T* V, int64_t D, int64_t k0, const int64_t* k,
                             float* const* c, int n, bool pf) {
  int64_t d0 = 0;
  for (; d0 + 64 <= D; d0 += 64) weigh4_16<4>(pw, V, D, d0, k0, k, c, n, pf && d0 == 0);
  for (; d0 < D; d0 += 16) weigh4_16<1>(pw, V, D, d0, k0, k, c, n, pf && d0 == 0);
}

#endif  // ES_X86

// rows a task takes (with one KV group): its queries are the rows' heads of that group
constexpr int64_t kAttnRows = 8;
// keys a block: every query of the task reads a block of keys (then of values) before the next (L1-sized:
// 64 keys of 128 floats are 32 KiB)
constexpr int64_t kAttnKeys = 64;
// the fewest multiply-adds a call has for its tasks to go to the thread pool (EDGESPEC_ATTN_PARALLEL overrides).
// A decode call's keys and values stream from memory (the Qwen 1.5B: 512 KiB a layer at 256 positions), which one
// thread reads at a fraction of what two do: session 19, a one-token target call at 256 positions, the op's 28
// nodes 2.5 -> 1.6 ms with the pool (onnxruntime's profiler), the call 31.4 / 32.2 -> 30.5 / 31.5 ms. Below this
// the pool's hand-off costs more than it saves (a few keys).
constexpr double kAttnParallelWork = 2e5;

#if ES_X86  // attend_rows: AVX2 / AVX-512
// The queries of rows [r0, r1) and one KV group g (each row's H / KVH heads of the group, which read the group's
// keys and values): the task ParallelFor runs. Queries go in pairs (the last alone with itself), so that each key
// and each value row loaded serves two queries. Per (query, key) one chain of fused multiply-adds over the head's
// 8-lane chunks, then sum8x8's tree (the same for every slot); per (query, output lane) one chain over the keys in
// order. A query's numbers depend on it alone, not on its partner, its row's place in the call or the call's
// width. Keys past a query's last (the partner's, or a block's padding) are computed and never read.
template <typename T>
ES_AVX2 void attend_rows(const AttnCall<T>& c, int64_t r0, int64_t r1, int64_t g) {
  const int64_t D = c.D, H = c.a->H, group = H / c.a->KVH, half = c.rot;
  const int64_t nq = (r1 - r0) * group, maxkeys = c.past + r1;  // the last row's keys
  // a query's scores, padded to blocks of 4 (an own slot's key, scored in a block of 4 from its index, 4 more)
  const int64_t stride = (maxkeys + 3) / 4 * 4 + (c.own >= 0 ? 4 : 0);
  thread_local std::vector<float> buf;
  const size_t need = size_t(nq * D + nq * stride + D + nq * D);
  if (buf.size() < need) buf.resize(need + 1024);
  float* q = buf.data();                 // nq x D rotated queries
  float* sc = buf.data() + nq * D;       // nq x stride scores, then weights
  const T* zero = reinterpret_cast<const T*>(sc + nq * stride);  // a key of zeros past the last row's keys
  std::memset(sc + nq * stride, 0, size_t(D) * sizeof(float));
  auto keys_of = [&](int64_t x) { return c.past + r0 + x / group + 1; };
  // a sliding window: query x attends keys [first_of(x), keys_of(x)) (its last W); the task scores and weighs keys
  // from ``from`` (its first query's first key, down to a block), and a query's keys before its own first are weighed
  // by 0 (a multiply-add of 0 leaves a chain as it was: the same bits as from its first, for every finite value; an
  // infinite or NaN value there, which only a model already computing them writes, and float16 caches never hold an
  // infinity, would make the row's output NaN in some calls and not others)
  const int64_t W = c.a->window;
  auto first_of = [&](int64_t x) { return W > 0 ? std::max<int64_t>(0, keys_of(x) - W) : int64_t(0); };
  const int64_t from = first_of(0) / kAttnKeys * kAttnKeys;
  for (int64_t x = 0; x < nq; ++x) {
    const int64_t i = r0 + x / group, h = g * group + x % group, pos = c.past + i;
    rotary(c.qkv + (i * (H + 2 * c.a->KVH) + h) * D, q + x * D, c.cos + pos * half, c.sin + pos * half, half, D,
           c.a->interleaved);
  }
  const T* K = c.K + g * c.L * row_len<T>(D);
  const T* V = c.V + g * c.L * row_len<T>(D);
  // keys [0, split) from K and V; with an own slot, the last key after them from there (bases shifted so that its
  // index is still the last: each key's score and each value's multiply-add are the same wherever the key sits)
  const int64_t split = c.own >= 0 ? maxkeys - 1 : maxkeys;
  const int64_t shift = c.own >= 0 ? (c.own - split) * row_len<T>(D) : 0;
  alignas(32) float t[8];
  // scores: a block of keys (kAttnKeys, L1-sized) for every pair of queries before the next block; two queries x
  // four keys a tile
  // (AVX-512: four queries a tile where there are more than two, each key loaded once for all four; the same
  // chains and tree per (query, key), so the same bits as pairs. Session 19, the Qwen 1.5B: a 1,024-token prefill
  // 3.01 / 2.99 -> 2.72 / 2.62 s, a 4-token call at 1,000 positions 42.6 / 42.0 -> 40.8 / 41.0 ms)
  const int64_t span = c.wide && c.a->quads && nq > 2 ? 4 : 2;
  auto scores = [&](const T* Kb, int64_t from, int64_t to) {
    for (int64_t k0 = from; k0 < to; k0 += kAttnKeys) {
      const int64_t end = std::min(to, k0 + kAttnKeys);
      for (int64_t x = 0; x < nq; x += span) {
        if (span == 4 && nq - x > 2) {  // (a last one or two queries go as a pair: no tile of repeats)
          const float* qs[4];
          float* ss[4];
          const int n = int(std::min<int64_t>(4, nq - x));
          for (int p = 0; p < 4; ++p) {
            const int64_t y = x + std::min(p, n - 1);
            qs[p] = q + y * D;
            ss[p] = sc + y * stride;
          }
          const int64_t kn = std::min(keys_of(x + n - 1), end);  // the last query's row is the latest
          qk_block4_avx512(qs, n, Kb, zero, D, k0, kn, c.scale, ss, x == 0);
          continue;
        }
        const int64_t y = std::min(x + 1, nq - 1);
        const float *qa = q + x * D, *qb = q + y * D;
        const int64_t kn = std::min(keys_of(y), end);  // the pair's keys in this block (y's row is x's or later)
        if (c.wide) qk_block_avx512(qa, qb, Kb, zero, D, k0, kn, c.scale, sc + x * stride, sc + y * stride, y != x, x == 0);
        else qk_block_avx2(qa, qb, Kb, zero, D, k0, kn, c.scale, sc + x * stride, sc + y * stride, y != x, x == 0);
      }
    }
  };
  scores(K, from, split);
  if (split < maxkeys) scores(K + shift, split, maxkeys);
  std::vector<float> total(static_cast<size_t>(nq));
  for (int64_t x = 0; x < nq; ++x) {  // softmax weights (unnormalized) and their sum
    const int64_t k1 = first_of(x), kn = keys_of(x);
    for (int64_t r = from; r < k1; ++r) sc[x * stride + r] = 0.f;  // (keys before the window: weight 0)
    float* se = sc + x * stride + k1;  // the query's scores from its first key (the lanes below count from it)
    const int64_t kw = kn - k1;
    if (c.a->softcap > 0.f) {  // c * tanh(s / c), as onnxruntime's op: a function of the score alone
      const float cap = c.a->softcap;
      for (int64_t r = 0; r < kw; ++r) se[r] = cap * std::tanh(se[r] / cap);
    }
    __m256 mx = _mm256_set1_ps(-INFINITY);  // the max (exact in any order)
    int64_t j = 0;
    for (; j + 8 <= kw; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(se + j));
    float m = -INFINITY;
    for (int64_t r = j; r < kw; ++r) m = std::max(m, se[r]);
    _mm256_store_ps(t, mx);
    for (int r = 0; r < 8; ++r) m = std::max(m, t[r]);
    // exp(s - max) 8 keys at a time; the sum: lane l adds keys l, l + 8, ... in order (a last block's missing
    // keys add 0), then a fixed tree over the lanes
    const __m256 mv = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    for (j = 0; j + 8 <= kw; j += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(se + j), mv));
      _mm256_storeu_ps(se + j, e);
      sum = _mm256_add_ps(sum, e);
    }
    if (j < kw) {
      for (int64_t r = 0; r < 8; ++r) t[r] = j + r < kw ? se[j + r] - m : -87.0f;
      _mm256_store_ps(t, exp8(_mm256_load_ps(t)));
      for (int64_t r = 0; r < 8; ++r) {
        if (j + r < kw) se[j + r] = t[r];
        else t[r] = 0.f;
      }
      sum = _mm256_add_ps(sum, _mm256_load_ps(t));
    }
    __m256 lanes[8] = {sum, sum, sum, sum, sum, sum, sum, sum};
    _mm256_store_ps(t, sum8x8(lanes));
    total[size_t(x)] = t[0];
  }
  // outputs: per query and output lane one chain over the keys in order, kept in acc (nq x D) between blocks of
  // values (kAttnKeys, L1-sized); two queries x 32 lanes a tile, each value row loaded once for both
  float* acc = sc + nq * stride + D;  // (past the zero key, whose D floats hold a key of either type)
  std::memset(acc, 0, size_t(nq * D) * sizeof(float));
  auto values = [&](const T* Vb, int64_t from, int64_t to) {
    for (int64_t k0 = from; k0 < to; k0 += kAttnKeys) {
      const int64_t end = std::min(to, k0 + kAttnKeys);
      for (int64_t x = 0; x < nq; x += span) {
        if (span == 4 && nq - x > 2) {
          const float* pw[4];
          float* cs[4];
          int64_t ks[4];
          const int n = int(std::min<int64_t>(4, nq - x));
          for (int p = 0; p < 4; ++p) {
            const int64_t y = x + std::min(p, n - 1);
            pw[p] = sc + y * stride;
            cs[p] = acc + y * D;
            ks[p] = std::min(keys_of(y), end);
          }
          if (ks[3] > k0) weigh4_avx512(pw, Vb, D, k0, ks, cs, n, x == 0);
          continue;
        }
        const int64_t y = std::min(x + 1, nq - 1);
        const int64_t ka = std::min(keys_of(x), end), kb = std::min(keys_of(y), end);
        if (kb <= k0) continue;
        const float *pa = sc + x * stride, *pb = sc + y * stride;
        float *ca = acc + x * D, *cb = acc + y * D;
        if (c.wide) weigh_avx512(pa, pb, Vb, D, k0, ka, kb, ca, cb, y != x, x == 0);
        else weigh_avx2(pa, pb, Vb, D, k0, ka, kb, ca, cb, y != x, x == 0);
      }
    }
  };
  values(V, from, split);
  if (split < maxkeys) values(V + shift, split, maxkeys);
  for (int64_t x = 0; x < nq; ++x) {
    float* o = c.out + ((r0 + x / group) * H + g * group + x % group) * D;
    const __m256 inv = _mm256_set1_ps(1.0f / total[size_t(x)]);
    for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(acc + x * D + d), inv));
  }
}

#endif  // ES_X86

// ---- DecodeAttention's portable path: the AVX2 path's 8-lane arithmetic in plain C++ (the bits of
// attend_rows where it takes 8-lane chains; the tests run them side by side on x86-64) ----

// float16 bits <-> float: exact widening; narrowing to nearest, ties to even, as F16C's (aarch64: the hardware's
// conversions, which round so too)
#if defined(__aarch64__)
inline float half_to_float(Half h) {
  __fp16 v;
  std::memcpy(&v, &h, sizeof v);
  return float(v);
}
inline Half float_to_half(float f) {
  const __fp16 v = __fp16(f);
  Half h;
  std::memcpy(&h, &v, sizeof h);
  return h;
}
#else
inline float half_to_float(Half h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {  // zero or subnormal: m x 2^-24, exact in float
    const float v = std::ldexp(float(m), -24);
    return sign ? -v : v;
  }
  const uint32_t bits = sign | (e == 31 ? 0x7f800000u | (m << 13) : ((e + 112) << 23) | (m << 13));
  float v;
  std::memcpy(&v, &bits, sizeof v);
  return v;
}
inline Half float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u)  // infinity, or a NaN (quieted, its payload's top bits kept)
    return Half(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u | ((x >> 13) & 0x3ffu) : 0u));
  if (x >= 0x477ff000u) return Half(sign | 0x7c00u);  // rounds past 65504
  if (x < 0x38800000u) {  // below float16's smallest normal: a multiple of 2^-24, to nearest, ties to even
    if (x <= 0x33000000u) return Half(sign);  // at most 2^-25: 0
    const uint32_t e = x >> 23, m = (x & 0x7fffffu) | 0x800000u, shift = 126 - e;  // value = m x 2^(e - 150)
    uint32_t h = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (h & 1u))) ++h;
    return Half(sign | h);
  }
  uint32_t h = ((x - 0x38000000u) >> 13);  // exponent rebiased, mantissa's top 10 bits
  const uint32_t rest = x & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // (a carry into the exponent is right)
  return Half(sign | h);
}
#endif

// lane d of a cache row of D lanes
inline float ld1(const float* row, int64_t d, int64_t) { return row[d]; }
inline float ld1(const Half* row, int64_t d, int64_t) { return half_to_float(row[d]); }
inline float ld1(const Q8* row, int64_t d, int64_t D) { return float(row[d]) * q8_scale(row, d, D); }

// store_row's numbers: float16 saturating at +-65504 (min and max's operand order: a NaN stays NaN)
inline void store_row_portable(const float* x, float* y, int64_t D) { std::memcpy(y, x, size_t(D) * sizeof(float)); }
inline void store_row_portable(const float* x, Half* y, int64_t D) {
  for (int64_t d = 0; d < D; ++d) {
    float v = -65504.0f > x[d] ? -65504.0f : x[d];
    v = 65504.0f < v ? 65504.0f : v;
    y[d] = float_to_half(v);
  }
}

// a row of D floats into Q8 (every path: scalar code, the same bytes): per group of 32 lanes the scale s = max |x| /
// 127 (float32 division) and each number x / s rounded to nearest, ties to even (numpy's rint), within +-127; a group
// of zeros has scale 0. A group holding an infinity or a NaN (which only a model already computing them writes) has
// a NaN scale and numbers 0: its lanes read as NaN, as a float cache's would make the scores.
inline void store_row_q8(const float* x, Q8* y, int64_t D) {
  for (int64_t g0 = 0; g0 < D; g0 += kQ8Group) {
    float amax = 0.f;
    bool finite = true;
    for (int64_t d = g0; d < g0 + kQ8Group; ++d) {
      finite = finite && std::isfinite(x[d]);
      amax = std::max(amax, std::fabs(x[d]));
    }
    const float s = finite ? amax / 127.0f : NAN;
    for (int64_t d = g0; d < g0 + kQ8Group; ++d) {
      float t = finite && s > 0.f ? std::nearbyint(x[d] / s) : 0.f;
      t = t > 127.f ? 127.f : t < -127.f ? -127.f : t;
      y[d] = Q8(int(t));
    }
    std::memcpy(y + D + g0 / kQ8Group * int64_t(sizeof(float)), &s, sizeof s);
  }
}

inline void store_any(const Attn*, const float* x, Q8* y, int64_t D) { store_row_q8(x, y, D); }

template <typename T>
inline void store_any(const Attn* a, const float* x, T* y, int64_t D) {
#if ES_X86
  if (!a->portable) return store_row(x, y, D);
#endif
  (void)a;
  store_row_portable(x, y, D);
}

// a query's 8-lane chains with one key (lane l: the fused multiply-adds of lanes l, l + 8, ... in order), and a value
// row weighed into the output's chains: plain C++, and on aarch64 NEON's fused multiply-adds (vfmaq: the same
// operation per lane, so the same bits) with float16 widened by the hardware
#if defined(__aarch64__)
inline float32x4_t ld4(const float* row, int64_t d, int64_t) { return vld1q_f32(row + d); }
inline float32x4_t ld4(const Half* row, int64_t d, int64_t) {
  return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(row + d)));
}
inline float32x4_t ld4(const Q8* row, int64_t d, int64_t D) {  // (ld1's products, one rounding each)
  const float v[4] = {ld1(row, d, D), ld1(row, d + 1, D), ld1(row, d + 2, D), ld1(row, d + 3, D)};
  return vld1q_f32(v);
}
template <typename T>
inline void score_lanes(const float* q, const T* k, int64_t D, float* lanes) {
  float32x4_t a = vdupq_n_f32(0.f), b = vdupq_n_f32(0.f);
  for (int64_t d = 0; d < D; d += 8) {
    a = vfmaq_f32(a, vld1q_f32(q + d), ld4(k, d, D));
    b = vfmaq_f32(b, vld1q_f32(q + d + 4), ld4(k, d + 4, D));
  }
  vst1q_f32(lanes, a);
  vst1q_f32(lanes + 4, b);
}
template <typename T>
inline void weigh_row(float w, const T* v, int64_t D, float* acc) {
  for (int64_t d = 0; d < D; d += 4) vst1q_f32(acc + d, vfmaq_n_f32(vld1q_f32(acc + d), ld4(v, d, D), w));
}
#else
template <typename T>
inline void score_lanes(const float* q, const T* k, int64_t D, float* lanes) {
  for (int64_t d = 0; d < D; d += 8)
    for (int l = 0; l < 8; ++l) lanes[l] = std::fma(q[d + l], ld1(k, d + l, D), lanes[l]);
}
template <typename T>
inline void weigh_row(float w, const T* v, int64_t D, float* acc) {
  for (int64_t d = 0; d < D; ++d) acc[d] = std::fma(w, ld1(v, d, D), acc[d]);
}
#endif

// sum8x8's tree on one vector's lanes
inline float tree8(const float* a) { return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7])); }

// attend_rows' queries of rows [r0, r1) and KV group g, one query at a time: per (query, key) 8 chains of fused
// multiply-adds over the head's 8-lane chunks and tree8; the softmax's max, exp_portable(s - max) summed in 8 lanes
// (key l into lane l mod 8, in order) and tree8; per output lane one chain over the keys in order, from the query's
// first (the x86 path starts a window's chains at an earlier key with weight 0: the same bits for finite values)
template <typename T>
void attend_rows_portable(const AttnCall<T>& c, int64_t r0, int64_t r1, int64_t g) {
  const int64_t D = c.D, H = c.a->H, group = H / c.a->KVH, half = c.rot, W = c.a->window;
  const int64_t nq = (r1 - r0) * group, maxkeys = c.past + r1;
  const int64_t split = c.own >= 0 ? maxkeys - 1 : maxkeys, shift = c.own >= 0 ? (c.own - split) * row_len<T>(D) : 0;
  thread_local std::vector<float> buf;
  if (buf.size() < size_t(2 * D + maxkeys)) buf.resize(size_t(2 * D + maxkeys) + 1024);
  float *q = buf.data(), *acc = q + D, *se = acc + D;
  const T* K = c.K + g * c.L * row_len<T>(D);
  const T* V = c.V + g * c.L * row_len<T>(D);
  for (int64_t x = 0; x < nq; ++x) {
    const int64_t i = r0 + x / group, h = g * group + x % group, pos = c.past + i;
    rotary(c.qkv + (i * (H + 2 * c.a->KVH) + h) * D, q, c.cos + pos * half, c.sin + pos * half, half, D,
           c.a->interleaved);
    const int64_t kn = c.past + i + 1, k1 = W > 0 ? std::max<int64_t>(0, kn - W) : 0, kw = kn - k1;
    for (int64_t j = k1; j < kn; ++j) {
      const T* kr = (j < split ? K : K + shift) + j * row_len<T>(D);
      float lanes[8] = {};
      score_lanes(q, kr, D, lanes);
      se[j - k1] = tree8(lanes) * c.scale;
    }
    if (c.a->softcap > 0.f) {
      const float cap = c.a->softcap;
      for (int64_t r = 0; r < kw; ++r) se[r] = cap * std::tanh(se[r] / cap);
    }
    // the max as attend_rows takes it: 8 lanes over whole blocks of 8 (max_ps's operand order: a NaN score takes
    // its lane), the rest and then the lanes by std::max (which passes over a NaN)
    float mv[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int64_t jm = 0;
    for (; jm + 8 <= kw; jm += 8)
      for (int l = 0; l < 8; ++l) mv[l] = mv[l] > se[jm + l] ? mv[l] : se[jm + l];
    float m = -INFINITY;
    for (int64_t r = jm; r < kw; ++r) m = std::max(m, se[r]);
    for (int l = 0; l < 8; ++l) m = std::max(m, mv[l]);
    float sum[8] = {};
    for (int64_t r = 0; r < kw; ++r) {
      se[r] = exp_portable(se[r] - m);
      sum[r % 8] += se[r];
    }
    const float inv = 1.0f / tree8(sum);
    for (int64_t d = 0; d < D; ++d) acc[d] = 0.f;
    for (int64_t j = k1; j < kn; ++j) {
      const T* vr = (j < split ? V : V + shift) + j * row_len<T>(D);
      const float w = se[j - k1];
      weigh_row(w, vr, D, acc);
    }
    float* o = c.out + ((r0 + x / group) * H + h) * D;
    for (int64_t d = 0; d < D; ++d) o[d] = acc[d] * inv;
  }
}

template <typename T>
void attn_task(void* data, size_t t) {
  const AttnCall<T>& c = *static_cast<const AttnCall<T>*>(data);
  const int64_t tiles = (c.n + kAttnRows - 1) / kAttnRows;
  const int64_t g = int64_t(t) / tiles, r0 = (int64_t(t) % tiles) * kAttnRows;
#if ES_X86
  if (!c.a->portable) return attend_rows(c, r0, std::min(c.n, r0 + kAttnRows), g);
#endif
  attend_rows_portable(c, r0, std::min(c.n, r0 + kAttnRows), g);
}

// an error naming the op (DecodeAttention, DecodeAttentionF16 or DecodeAttentionQ8)
OrtStatus* attn_fail(const Attn* a, const char* what) {
  const std::string m = std::string(a->q8     ? "edgespec.DecodeAttentionQ8: "
                                    : a->half ? "edgespec.DecodeAttentionF16: "
                                              : "edgespec.DecodeAttention: ") + what;
  return fail(m.c_str());
}

// Kind: 0 edgespec.DecodeAttention (float32 caches), 1 DecodeAttentionF16 (float16), 2 DecodeAttentionQ8 (int8)
template <int Kind>
OrtStatus* attn_create_v2(const OrtCustomOp*, const OrtApi*, const OrtKernelInfo* info, void** out) {
  auto* a = new Attn();
  a->half = Kind == 1;
  a->q8 = Kind == 2;
  *out = a;
  if (!ok(api<OrtStatus* (*)(const OrtKernelInfo*, const char*, int64_t*)>(kKernelInfoGetAttributeInt64)(info, "num_heads", &a->H)) ||
      !ok(api<OrtStatus* (*)(const OrtKernelInfo*, const char*, int64_t*)>(kKernelInfoGetAttributeInt64)(info, "kv_num_heads", &a->KVH)))
    return attn_fail(a, "attributes num_heads and kv_num_heads are required");
  float scale = 0.f;
  if (!ok(api<OrtStatus* (*)(const OrtKernelInfo*, const char*, float*)>(kKernelInfoGetAttributeFloat)(info, "scale", &scale)))
    scale = 0.f;
  a->scale = scale;
  int64_t window = -1;
  if (ok(api<OrtStatus* (*)(const OrtKernelInfo*, const char*, int64_t*)>(kKernelInfoGetAttributeInt64)(info, "local_window_size", &window)))
    a->window = window;
  float cap = 0.f;
  if (ok(api<OrtStatus* (*)(const OrtKernelInfo*, const char*, float*)>(kKernelInfoGetAttributeFloat)(info, "softcap", &cap)))
    a->softcap = cap;
  int64_t inter = 0;
  if (ok(api<OrtStatus* (*)(const OrtKernelInfo*, const char*, int64_t*)>(kKernelInfoGetAttributeInt64)(info, "rotary_interleaved", &inter)))
    a->interleaved = inter != 0;
  if (a->window == 0 || a->window < -1 || !(a->softcap >= 0.f) || !std::isfinite(a->softcap))
    return attn_fail(a, "local_window_size must be -1 (none) or a positive number of keys, softcap 0 (none) or a "
                        "finite positive number");
  if (a->H <= 0 || a->KVH <= 0 || a->H % a->KVH || a->H / a->KVH > 16)
    return attn_fail(a, "num_heads must be a multiple of kv_num_heads, at most 16 times it");
  a->avx512 = g_avx512;
  a->portable = g_portable;
  a->quads = g_attn_quads;
  a->ok = true;
  return nullptr;
}

template <int Kind>
void* attn_create(const OrtCustomOp* op, const OrtApi* api_, const OrtKernelInfo* info) {
  void* a = nullptr;
  if (OrtStatus* s = attn_create_v2<Kind>(op, api_, info, &a)) ok(s);
  return a;
}

// calls of attend_rows: the causal rows' and each alternate's, their tasks numbered one after the other
template <typename T>
struct AttnCalls {
  const AttnCall<T>* calls;
  size_t count;
};

template <typename T>
size_t call_tasks(const AttnCall<T>& c) { return size_t((c.n + kAttnRows - 1) / kAttnRows * c.a->KVH); }

template <typename T>
void calls_task(void* data, size_t t) {
  const AttnCalls<T>& cs = *static_cast<const AttnCalls<T>*>(data);
  for (size_t i = 0; i < cs.count; ++i) {
    const size_t n = call_tasks(cs.calls[i]);
    if (t < n) return attn_task<T>(const_cast<AttnCall<T>*>(cs.calls + i), t);
    t -= n;
  }
}

// the calls' tasks (on the pool where the work pays for the hand-off)
template <typename T>
void attend_calls(const AttnCall<T>* calls, size_t count, OrtKernelContext* ctx) {
  size_t tasks = 0;
  double work = 0.0;  // multiply-adds of scores and value sums
  for (size_t i = 0; i < count; ++i) {
    const AttnCall<T>& c = calls[i];
    tasks += call_tasks(c);
    work += 2.0 * double(c.n) * double(c.a->H) * double(c.D) * double(c.past + c.n);
  }
  // a small call runs on this thread, where handing tasks to the pool's threads (woken for each of a forward
  // pass's layers) cost more than it saved
  const char* par = std::getenv("EDGESPEC_ATTN_PARALLEL");
  const double min_work = par ? std::atof(par) : kAttnParallelWork;
  AttnCalls<T> cs{calls, count};
  if (g_parallel && tasks > 1 && work >= min_work) {
    using PF = OrtStatus* (*)(const OrtKernelContext*, void (*)(void*, size_t), size_t, size_t, void*);
    if (ok(api<PF>(kKernelContextParallelFor)(ctx, calls_task<T>, tasks, 0, &cs))) return;
  }
  for (size_t t = 0; t < tasks; ++t) calls_task<T>(&cs, t);
}

// the call once its inputs are checked: the present caches (the past ones copied in where not bound in place), the
// new keys (rotated) and values written at their slots, then the queries' rows (tasks on the pool if it pays).
// ``rel`` (the optional positions input, nullptr: 0..n-1): row i stands at position past + rel[i] and its keys and
// values go to slot past + i. Rows [0, m) are the usual causal rows (rel[i] == i); a later row (an alternate, a
// token verified beside a draft's token at the same position) attends slots [0, past + rel[i]) and its own slot:
// it is computed as a one-row call at past + rel[i] whose last key and value are read from its own slot
// (AttnCall::own). So its numbers are those of a one-token call at that position over the same keys (the kernels'
// rows do not depend on the call's width or a row's place in it), and moving its slot to past + rel[i] afterwards
// (the runtime, when it is accepted) leaves the cache as a call of the accepted tokens alone would have.
template <typename T>
OrtStatus* attend(const Attn* a, OrtKernelContext* ctx, const OrtValue* const* in, OrtValue* O, OrtValue* PK, OrtValue* PV,
                  int64_t n, int64_t D, int64_t L, int64_t past, const int64_t* rel, int64_t m, int64_t R) {
  T *K = static_cast<T*>(data_of(PK)), *V = static_cast<T*>(data_of(PV));
  const T *pk = static_cast<const T*>(data_of(in[1])), *pv = static_cast<const T*>(data_of(in[2]));
  const int64_t S = row_len<T>(D);  // a cache row's elements
  if (K != pk)  // not bound in place: the present starts as a copy of the past
    for (int64_t g = 0; g < a->KVH; ++g) std::memcpy(K + g * L * S, pk + g * L * S, size_t(past * S) * sizeof(T));
  if (V != pv)
    for (int64_t g = 0; g < a->KVH; ++g) std::memcpy(V + g * L * S, pv + g * L * S, size_t(past * S) * sizeof(T));
  const float* qkv = static_cast<const float*>(data_of(in[0]));
  const float *cs = static_cast<const float*>(data_of(in[4])), *sn = static_cast<const float*>(data_of(in[5]));
  const int64_t half = R, row = (a->H + 2 * a->KVH) * D;
  thread_local std::vector<float> rot;
  if (rot.size() < size_t(D)) rot.resize(size_t(D));
  for (int64_t i = 0; i < n; ++i)  // the new keys (rotated at their positions) and values, at their slots
    for (int64_t g = 0; g < a->KVH; ++g) {
      const int64_t pos = past + (rel ? rel[i] : i), slot = past + i;
      rotary(qkv + i * row + (a->H + g) * D, rot.data(), cs + pos * half, sn + pos * half, half, D, a->interleaved);
      store_any(a, rot.data(), K + (g * L + slot) * S, D);
      store_any(a, qkv + i * row + (a->H + a->KVH + g) * D, V + (g * L + slot) * S, D);
    }
  float* out = static_cast<float*>(data_of(O));
  const float scale = a->scale != 0.f ? a->scale : 1.0f / std::sqrt(float(D));
  const bool wide = a->avx512 && D % 16 == 0;
  g_attn_calls[a->portable ? 2 : wide ? 1 : 0].fetch_add(1, std::memory_order_relaxed);
  thread_local std::vector<AttnCall<T>> calls;
  calls.clear();
  calls.push_back(AttnCall<T>{a, m, D, L, past, qkv, cs, sn, K, V, out, scale, wide});
  for (int64_t i = m; i < n; ++i)  // the alternates
    calls.push_back(AttnCall<T>{a, 1, D, L, past + rel[i], qkv + i * row, cs, sn, K, V, out + i * a->H * D, scale, wide,
                                past + i});
  for (AttnCall<T>& c : calls) c.rot = R;
  attend_calls(calls.data(), calls.size(), ctx);
  return nullptr;
}

OrtStatus* attn_compute_v2(void* self, OrtKernelContext* ctx) {
  auto* a = static_cast<Attn*>(self);
  if (!a->ok) return attn_fail(a, "bad attributes");
  const OrtValue* in[6] = {};
  size_t count = 0;
  api<OrtStatus* (*)(const OrtKernelContext*, size_t*)>(kKernelContextGetInputCount)(ctx, &count);
  if (count < 6) return attn_fail(a, "needs qkv, past_key, past_value, seqlens_k, cos, sin");
  for (size_t i = 0; i < 6; ++i)
    if (!ok(api<OrtStatus* (*)(const OrtKernelContext*, size_t, const OrtValue**)>(kKernelContextGetInput)(ctx, i, &in[i])) || !in[i])
      return attn_fail(a, "a required input is missing");
  const std::vector<int64_t> qd = dims_of(in[0]), kd = dims_of(in[1]), vd = dims_of(in[2]), cd = dims_of(in[4]);
  if (qd.size() != 3 || qd[0] != 1 || kd.size() != 4 || kd != vd || kd[0] != 1 || kd[1] != a->KVH || cd.size() != 2 ||
      dims_of(in[5]) != cd)
    return attn_fail(a, "expects batch 1, qkv [1, n, (H + 2 KVH) D], caches [1, KVH, L, D], cos and sin [P, R] "
                        "(R = D/2, or fewer for a partial rotary)");
  // the head size: the caches' last axis (Q8: qkv's, its caches' rows D numbers and D / 32 scales of 4 bytes)
  const int64_t n = qd[1], D = a->q8 ? qd[2] / (a->H + 2 * a->KVH) : kd[3], L = kd[2];
  if (a->q8 && (D % kQ8Group || kd[3] != row_len<Q8>(D)))
    return attn_fail(a, "the head size must be a multiple of 32 and the caches' rows D + D / 8 bytes (D int8 numbers "
                        "and a float32 scale for each 32)");
  if (qd[2] != (a->H + 2 * a->KVH) * D || D % 8 || cd[1] <= 0 || cd[1] * 2 > D)
    return attn_fail(a, "the head size does not match qkv and the caches (D a multiple of 8), or cos has more than D/2 "
                        "columns (its rotary pairs: D/2, or fewer for a partial rotary)");
  int64_t sn = 1;
  for (int64_t x : dims_of(in[3])) sn *= x;
  if (sn != 1 || !data_of(in[3])) return attn_fail(a, "seqlens_k must hold one value (batch 1)");
  const int64_t valid = int64_t(*static_cast<const int32_t*>(data_of(in[3]))) + 1;
  const int64_t past = valid - n;
  if (n <= 0 || past < 0 || valid > L || valid > cd[0])
    return attn_fail(a, "seqlens_k + 1 must be in [n, cache length] and within the rotary cache");
  // the optional positions (int64, n of them: see attend): rows [0, m) where rel[i] == i, later ones before theirs
  const int64_t* rel = nullptr;
  int64_t m = n;
  const OrtValue* P = nullptr;
  if (count > 6 && ok(api<OrtStatus* (*)(const OrtKernelContext*, size_t, const OrtValue**)>(kKernelContextGetInput)(ctx, 6, &P)) && P) {
    const std::vector<int64_t> pd = dims_of(P);
    int64_t pn = 1;
    for (int64_t x : pd) pn *= x;
    if (pd.empty() || pn != n) return attn_fail(a, "positions must hold one position offset a row of qkv");
    rel = static_cast<const int64_t*>(data_of(P));
    m = 0;
    while (m < n && rel[m] == m) ++m;
    for (int64_t i = m; i < n; ++i)
      if (rel[i] < 0 || rel[i] >= m)
        return attn_fail(a, "positions: each row after the causal ones (positions 0, 1, ...) must stand at one of theirs");
  }
  std::vector<int64_t> od = {1, n, a->H * D};
  OrtValue *O = nullptr, *PK = nullptr, *PV = nullptr;
  using GetOut = OrtStatus* (*)(OrtKernelContext*, size_t, const int64_t*, size_t, OrtValue**);
  if (OrtStatus* s = api<GetOut>(kKernelContextGetOutput)(ctx, 0, od.data(), od.size(), &O)) return s;
  if (OrtStatus* s = api<GetOut>(kKernelContextGetOutput)(ctx, 1, kd.data(), kd.size(), &PK)) return s;
  if (OrtStatus* s = api<GetOut>(kKernelContextGetOutput)(ctx, 2, vd.data(), vd.size(), &PV)) return s;
  return a->q8     ? attend<Q8>(a, ctx, in, O, PK, PV, n, D, L, past, rel, m, cd[1])
         : a->half ? attend<Half>(a, ctx, in, O, PK, PV, n, D, L, past, rel, m, cd[1])
                   : attend<float>(a, ctx, in, O, PK, PV, n, D, L, past, rel, m, cd[1]);
}

void attn_compute(void* self, OrtKernelContext* ctx) {
  if (OrtStatus* s = attn_compute_v2(self, ctx)) ok(s);
}

void attn_destroy(void* self) { delete static_cast<Attn*>(self); }
const char* attn_name(const OrtCustomOp*) { return "DecodeAttention"; }
const char* attn16_name(const OrtCustomOp*) { return "DecodeAttentionF16"; }
int attn_in_type(const OrtCustomOp*, size_t i) { return i == 3 ? kInt32 : i == 6 ? kInt64 : kFloat; }
int attn16_in_type(const OrtCustomOp*, size_t i) {
  return i == 3 ? kInt32 : i == 6 ? kInt64 : (i == 1 || i == 2) ? kFloat16 : kFloat;
}
int attn16_out_type(const OrtCustomOp*, size_t i) { return i == 0 ? kFloat : kFloat16; }
const char* attn8_name(const OrtCustomOp*) { return "DecodeAttentionQ8"; }
int attn8_in_type(const OrtCustomOp*, size_t i) {
  return i == 3 ? kInt32 : i == 6 ? kInt64 : (i == 1 || i == 2) ? kInt8 : kFloat;
}
int attn8_out_type(const OrtCustomOp*, size_t i) { return i == 0 ? kFloat : kInt8; }
size_t attn_in_count(const OrtCustomOp*) { return 7; }  // qkv, caches, seqlens_k, cos, sin, positions (optional)
size_t attn_out_count(const OrtCustomOp*) { return 3; }
int attn_char(const OrtCustomOp*, size_t) { return kRequired; }
int attn_in_char(const OrtCustomOp*, size_t i) { return i == 6 ? kOptional : kRequired; }

void destroy(void* self) { delete static_cast<Kernel*>(self); }

const char* op_name(const OrtCustomOp*) { return "MatMulQ4"; }
const char* op_ep(const OrtCustomOp*) { return "CPUExecutionProvider"; }
int in_type(const OrtCustomOp*, size_t i) { return (i == 1 || i == 3 || i == 6) ? kUint8 : kFloat; }
// A, B, scales, zero points (optional), bias (optional), minimums (optional), k-quant scales (optional)
size_t in_count(const OrtCustomOp*) { return 7; }
int out_type(const OrtCustomOp*, size_t) { return kFloat; }
size_t out_count(const OrtCustomOp*) { return 1; }
int in_char(const OrtCustomOp*, size_t i) { return i >= 3 ? kOptional : kRequired; }
int out_char(const OrtCustomOp*, size_t) { return kRequired; }
int mem_type(const OrtCustomOp*, size_t) { return 0; }
int one(const OrtCustomOp*) { return 1; }
int last(const OrtCustomOp*) { return 1 << 30; }

OrtCustomOp g_op{17,       create_kernel, op_name,  op_ep, in_type, in_count,         out_type,   out_count, compute,
                 destroy,  in_char,       out_char, mem_type, one,  one,              one,        one,
                 create_kernel_v2,        compute_v2, nullptr, one, last};

OrtCustomOp g_attn{17,           attn_create<0>, attn_name, op_ep,    attn_in_type, attn_in_count, out_type, attn_out_count,
                   attn_compute, attn_destroy, attn_in_char, attn_char, mem_type,  one,           one,      one,
                   one,          attn_create_v2<0>, attn_compute_v2, nullptr, one, last};

OrtCustomOp g_attn16{17,           attn_create<1>, attn16_name, op_ep,    attn16_in_type, attn_in_count, attn16_out_type,
                     attn_out_count, attn_compute, attn_destroy, attn_in_char, attn_char, mem_type, one, one, one,
                     one,          attn_create_v2<1>, attn_compute_v2, nullptr, one, last};

OrtCustomOp g_attn8{17,           attn_create<2>, attn8_name, op_ep,    attn8_in_type, attn_in_count, attn8_out_type,
                    attn_out_count, attn_compute, attn_destroy, attn_in_char, attn_char, mem_type, one, one, one,
                    one,          attn_create_v2<2>, attn_compute_v2, nullptr, one, last};

#if ES_X86  // AMX's permission, the x86 paths' choice
// AMX-INT8 on the CPU and Linux's permission to use its tile data (asked once; per process)
bool amx_permitted() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  const bool tile = d & (1u << 24), int8 = d & (1u << 25);
  if (!tile || !int8) return false;
  constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
}

// the paths kernels take: AVX-512 VNNI where the CPU has it, AMX from amx_min_rows rows where it has that too
// and the permission; EDGESPEC_Q4_ISA=avx2 / avx512 stops at that path
void choose_path(bool* avx512, bool* amx) {
  const char* isa = std::getenv("EDGESPEC_Q4_ISA");
  *avx512 = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
            __builtin_cpu_supports("avx512vl") && !(isa && std::strcmp(isa, "avx2") == 0);
  *amx = ES_AMX_BUILT && *avx512 && !(isa && std::strcmp(isa, "avx512") == 0) && amx_permitted();
}

#endif  // ES_X86

// the portable path (off x86-64 the only one): no AVX2 path's instructions needed
bool x86_simd() {
#if ES_X86
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

// the paths kernels take: AVX-512 VNNI where the CPU has it, AMX from amx_min_rows rows where it has that too and
// the permission, AVX2 else; the portable one off x86-64, on an x86-64 CPU without AVX2, FMA and F16C, or where
// EDGESPEC_Q4_ISA=portable; EDGESPEC_Q4_ISA=avx2 / avx512 stops at that path
void choose_paths(bool* portable, bool* avx512, bool* amx) {
  const char* isa = std::getenv("EDGESPEC_Q4_ISA");
  *portable = !x86_simd() || (isa && std::strcmp(isa, "portable") == 0);
  *avx512 = *amx = false;
#if ES_X86
  if (!*portable) choose_path(avx512, amx);
#endif
}

}  // namespace

// The path a kernel registered now would take (what `edgespec info` and the benchmarks print): decided by the
// same function as the registration, so the name cannot disagree with the path.
extern "C" __attribute__((visibility("default"))) const char* edgespec_q4_path() {
  bool portable = false, avx512 = false, amx = false;
  choose_paths(&portable, &avx512, &amx);
#if defined(__aarch64__)  // (which dot products its portable path takes: SDOT, or ARMv8.0's widening multiplies)
  return ES_SDOT && (getauxval(AT_HWCAP) & (1ul << 20)) ? "portable-sdot" : "portable-neon";
#endif
  return portable ? "portable" : amx ? "avx512-vnni+amx" : avx512 ? "avx512-vnni" : "avx2";
}

// How many MatMulQ4 calls took an AMX path in this process (the tests check that a path they compare ran).
extern "C" __attribute__((visibility("default"))) uint64_t edgespec_q4_amx_calls() {
  return g_amx_calls.load(std::memory_order_relaxed);
}

// How many attention calls took each path in this process (0: AVX2's 8 lanes, 1: AVX-512's 16 lanes, 2: the portable
// path; 0 for another number): the tests check that the path they compare ran.
extern "C" __attribute__((visibility("default"))) uint64_t edgespec_attn_calls(int path) {
  return path >= 0 && path < 3 ? g_attn_calls[path].load(std::memory_order_relaxed) : 0;
}

extern "C" __attribute__((visibility("default"))) OrtStatus* RegisterCustomOps(OrtSessionOptions* options,
                                                                               const OrtApiBase* base) {
  const OrtApi* api17 = base->GetApi(17);
  const OrtApi* got = api17 ? api17 : base->GetApi(1);
  if (!got) return nullptr;
  bool portable = false, avx512 = false, amx = false;
  choose_paths(&portable, &avx512, &amx);
  const char* quads = std::getenv("EDGESPEC_ATTN_QUADS");  // 0: pairs of queries (to compare: the same bits)
  const char* huge = std::getenv("EDGESPEC_Q4_HUGEPAGES");  // 0: read the weights where onnxruntime has them
  bool hugepages = !(huge && std::strcmp(huge, "0") == 0);
  if (FILE* f = std::fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r")) {  // "[never]": no huge pages to have
    char mode[128] = {0};
    if (std::fgets(mode, sizeof mode, f) && std::strstr(mode, "[never]")) hugepages = false;
    std::fclose(f);
  }
  g_api.store(got);
  g_parallel.store(api17 != nullptr);
  g_portable.store(portable);
  g_avx512.store(avx512);
  g_amx.store(amx);
#if defined(__aarch64__)
  g_dotprod.store(ES_SDOT && (getauxval(AT_HWCAP) & (1ul << 20)) != 0);  // HWCAP_ASIMDDP
#endif
  g_attn_quads.store(!(quads && std::strcmp(quads, "0") == 0));
  g_hugepages.store(hugepages);
  OrtCustomOpDomain* domain = nullptr;
  OrtStatus* s = api<OrtStatus* (*)(const char*, OrtCustomOpDomain**)>(kCreateCustomOpDomain)("edgespec", &domain);
  if (s) return s;
  s = api<OrtStatus* (*)(OrtCustomOpDomain*, const OrtCustomOp*)>(kCustomOpDomainAdd)(domain, &g_op);
  if (s) return s;
  s = api<OrtStatus* (*)(OrtCustomOpDomain*, const OrtCustomOp*)>(kCustomOpDomainAdd)(domain, &g_attn);
  if (s) return s;
  s = api<OrtStatus* (*)(OrtCustomOpDomain*, const OrtCustomOp*)>(kCustomOpDomainAdd)(domain, &g_attn16);
  if (s) return s;
  s = api<OrtStatus* (*)(OrtCustomOpDomain*, const OrtCustomOp*)>(kCustomOpDomainAdd)(domain, &g_attn8);
  if (s) return s;
  return api<OrtStatus* (*)(OrtSessionOptions*, OrtCustomOpDomain*)>(kAddCustomOpDomain)(options, domain);
}
