// src/model/kernels/linear_avx2.cpp — the small-row linear kernel for AVX2 + FMA
// (8 floats per register; 3 weight rows x 4 tokens = 12 of the 16 registers hold sums).
#include "linear_kernels.hpp"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

namespace {
struct Vec {
  using Reg = __m256;
  static constexpr int kWidth = 8, kRows = 3, kTokens = 4;
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static Reg load_first(const float* p, int n) {  // the first n (< 8) floats, the rest zero
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes));
  }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static float sum(Reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};
}  // namespace

#include "linear_kernel.inl"

namespace promptcache::kernels {
const LinearRowsFn linear_rows_avx2 = &linear_rows;
}
#else
namespace promptcache::kernels {
const LinearRowsFn linear_rows_avx2 = nullptr;
}
#endif
