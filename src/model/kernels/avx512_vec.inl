// src/model/kernels/avx512_vec.inl — `Vec` for AVX-512F (16 floats per register): the vector
// operations linear_kernel.inl, attention_kernel.inl and lane_softmax.inl are written in. Included
// by avx512.cpp and avx512_bf16.cpp (both compiled with AVX-512F) after <immintrin.h>; internal
// linkage, no standard headers.

namespace {
using promptcache::kernels::Bf16;
using promptcache::kernels::F16;
using promptcache::kernels::Q8;

struct Vec {
  using Reg = __m512;
  static constexpr int kWidth = 16, kRows = 4, kTokens = 6, kValueRows = 6, kValueCols = 4,
                       kLaneAcc = 24, kLaneRowVecs = 3, kLaneValueSlots = 64, kLinearLaneAcc = 12,
                       kLinearLaneVecs = 2;
  static __mmask16 first(int n) { return static_cast<__mmask16>((1u << n) - 1u); }
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg set1(float x) { return _mm512_set1_ps(x); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static Reg load_first(const float* p, int n) {  // the first n (< 16) floats, the rest zero
    return _mm512_maskz_loadu_ps(first(n), p);
  }
  // bf16 -> f32: its 16 bits become the f32's high half; f16 -> f32 (AVX-512F). Both exact.
  static Reg load(const Bf16* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static Reg load(const F16* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  // 16 int8 values (Q8 weights) -> f32, exact; scaled by the caller.
  static Reg load(const Q8* p) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  }
  static float half_to_float(unsigned short bits) { return _cvtsh_ss(bits); }
  template <class W>
  static Reg load_first(const W* p, int n) {  // 16/8-bit weights: the first n (< 16), rest zero
    W buf[kWidth] = {};
    __builtin_memcpy(buf, p, n * sizeof(W));
    return load(buf);
  }
  static void store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static void store_first(float* p, int n, Reg v) { _mm512_mask_storeu_ps(p, first(n), v); }
  static Reg keep_first(Reg v, int n) { return _mm512_maskz_mov_ps(first(n), v); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm512_max_ps(a, b); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg round(Reg v) {
    return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static Reg scale2(Reg p, Reg n) { return _mm512_scalef_ps(p, n); }  // p * 2^n
  static Reg zero_below(Reg x, Reg limit, Reg v) {                    // v where x >= limit, else 0
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, limit, _CMP_GE_OQ), v);
  }
  static float sum(Reg v) { return _mm512_reduce_add_ps(v); }
  static float reduce_max(Reg v) { return _mm512_reduce_max_ps(v); }
};
}  // namespace
