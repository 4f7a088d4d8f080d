// src/model/kernels/linear_avx512.cpp — the small-row linear kernel for AVX-512F
// (16 floats per register; 4 weight rows x 6 tokens = 24 of the 32 registers hold sums).
#include "linear_kernels.hpp"

#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>

namespace {
struct Vec {
  using Reg = __m512;
  static constexpr int kWidth = 16, kRows = 4, kTokens = 6;
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static Reg load_first(const float* p, int n) {  // the first n (< 16) floats, the rest zero
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1u), p);
  }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static float sum(Reg v) { return _mm512_reduce_add_ps(v); }
};
}  // namespace

#include "linear_kernel.inl"

namespace promptcache::kernels {
const LinearRowsFn linear_rows_avx512 = &linear_rows;
}
#else
namespace promptcache::kernels {
const LinearRowsFn linear_rows_avx512 = nullptr;
}
#endif
