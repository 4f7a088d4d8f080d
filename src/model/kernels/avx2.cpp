// src/model/kernels/avx2.cpp — the CPU kernels for AVX2 + FMA (8 floats per register), with
// F16C for f16 weights.
// Linear: 3 weight rows x 4 tokens = 12 of the 16 registers hold sums; from 13 rows of x on,
// 6 weight rows x 16 tokens = 12 sums along the lanes. Attention: 12 sums too,
// 3 vectors of query rows (24 rows) x 4 keys or value columns; a decode step's values 3 rows x
// 4 vectors.
#include "kernels.hpp"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

namespace {
using promptcache::kernels::Bf16;
using promptcache::kernels::F16;
using promptcache::kernels::Q8;

struct Vec {
  using Reg = __m256;
  static constexpr int kWidth = 8, kRows = 3, kTokens = 4, kValueRows = 3, kValueCols = 4,
                       kLaneAcc = 12, kLaneRowVecs = 3, kLaneValueSlots = 64, kLinearLaneAcc = 12,
                       kLinearLaneVecs = 2;
  static __m256i first(int n) {  // lanes [0, n) set
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes);
  }
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg set1(float x) { return _mm256_set1_ps(x); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static Reg load_first(const float* p, int n) {  // the first n (< 8) floats, the rest zero
    return _mm256_maskload_ps(p, first(n));
  }
  // bf16 -> f32: its 16 bits become the f32's high half; f16 -> f32 by F16C. Both exact.
  static Reg load(const Bf16* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static Reg load(const F16* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  // 8 int8 values (Q8 weights) -> f32, exact; scaled by the caller.
  static Reg load(const Q8* p) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
  }
  static float half_to_float(unsigned short bits) { return _cvtsh_ss(bits); }
  template <class W>
  static Reg load_first(const W* p, int n) {  // 16/8-bit weights: the first n (< 8), rest zero
    W buf[kWidth] = {};
    __builtin_memcpy(buf, p, n * sizeof(W));
    return load(buf);
  }
  static void store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  static void store_first(float* p, int n, Reg v) { _mm256_maskstore_ps(p, first(n), v); }
  static Reg keep_first(Reg v, int n) { return _mm256_and_ps(v, _mm256_castsi256_ps(first(n))); }
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm256_max_ps(a, b); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg round(Reg v) {
    return _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // p * 2^n for integral n in [-126, 127] (the exponent field built directly).
  static Reg scale2(Reg p, Reg n) {
    const __m256i e =
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
  }
  static Reg zero_below(Reg x, Reg limit, Reg v) {  // v where x >= limit, else 0
    return _mm256_and_ps(v, _mm256_cmp_ps(x, limit, _CMP_GE_OQ));
  }
  static float sum(Reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static float reduce_max(Reg v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};
}  // namespace

#include "linear_kernel.inl"

// After linear_kernel.inl: the attention computes a decode step's scores with linear_rows.
#include "attention_kernel.inl"

#define PROMPTCACHE_ISA_BUILT
#endif

#define PROMPTCACHE_ISA avx2
#define PROMPTCACHE_ISA_WIDTH kAvx2Width
#include "isa_exports.inl"
