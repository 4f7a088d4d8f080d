// src/model/kernels/quant_avx2.cpp — integer dot products of GGML weight blocks with x quantized
// to 8 bits (quant_blocks.hpp), AVX2: 32 unsigned weight values times 32 signed x values with
// vpmaddubsw, pairs of int16 summed (and scaled by the sub-block's scale) with vpmaddwd. Every
// block's integer sums equal the scalar kernel's, combined in f32 in the same order, so the
// result is bitwise the scalar one's.
#include "quant_blocks.hpp"

#if defined(__x86_64__) && defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>

namespace promptcache::kernels::quant {
namespace {

#include "quant_unpack.inl"

// Unsigned bytes u times signed bytes x, pairs summed to int16, then pairs times `scale` (int16
// lanes) summed to int32.
__m256i dot_scaled(__m256i u, __m256i x, __m256i scale) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), scale);
}

float dot_q4_0(const uint8_t* w, const uint8_t* xq, long long nb) {
  const auto* x = reinterpret_cast<const XQ32*>(xq);
  const __m256i ones = _mm256_set1_epi16(1);
  float acc = 0;
  for (long long i = 0; i < nb; ++i, w += 18) {
    const int32_t s = hsum(dot_scaled(unpack_q4_0(w), load32(x[i].qs), ones)) - 8 * x[i].sum;
    acc += combine_q32(half(w), x[i].d, s);
  }
  return acc;
}

float dot_q5_0(const uint8_t* w, const uint8_t* xq, long long nb) {
  const auto* x = reinterpret_cast<const XQ32*>(xq);
  const __m256i ones = _mm256_set1_epi16(1);
  float acc = 0;
  for (long long i = 0; i < nb; ++i, w += 22) {
    const int32_t s =
        hsum(dot_scaled(unpack_q5(w + 2, w + 6), load32(x[i].qs), ones)) - 16 * x[i].sum;
    acc += combine_q32(half(w), x[i].d, s);
  }
  return acc;
}

float dot_q5_1(const uint8_t* w, const uint8_t* xq, long long nb) {
  const auto* x = reinterpret_cast<const XQ32*>(xq);
  const __m256i ones = _mm256_set1_epi16(1);
  float acc = 0;
  for (long long i = 0; i < nb; ++i, w += 24) {
    const int32_t s = hsum(dot_scaled(unpack_q5(w + 4, w + 8), load32(x[i].qs), ones));
    acc += combine_q51(half(w), half(w + 2), x[i].d, s, x[i].sum);
  }
  return acc;
}

float dot_q8_0(const uint8_t* w, const uint8_t* xq, long long nb) {
  const auto* x = reinterpret_cast<const XQ32*>(xq);
  const __m256i ones = _mm256_set1_epi16(1);
  float acc = 0;
  for (long long i = 0; i < nb; ++i, w += 34) {
    const __m256i q = load32(w + 2);
    // |w| (unsigned; -128 becomes 128) times x with w's sign.
    const __m256i s =
        dot_scaled(_mm256_sign_epi8(q, q), _mm256_sign_epi8(load32(x[i].qs), q), ones);
    acc += combine_q32(half(w), x[i].d, hsum(s));
  }
  return acc;
}

// A Q4_K (kFive false) or Q5_K block's integer sum with x's block, int32 lanes: each sub-block's
// products scaled by its scale sc[s].
template <bool kFive, class Scale>
__m256i qkx_block_sum(const uint8_t* w, const XQK& x, const Scale* sc) {
  const __m256i qh = kFive ? load32(w + 16) : _mm256_setzero_si256();
  __m256i sum = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {
    __m256i lo, hi;
    unpack_qkx_pair<kFive>(w + (kFive ? 48 : 16), qh, c, &lo, &hi);
    sum = _mm256_add_epi32(sum, dot_scaled(lo, load32(x.qs + 64 * c),
                                           _mm256_set1_epi16(static_cast<short>(sc[2 * c]))));
    sum = _mm256_add_epi32(sum, dot_scaled(hi, load32(x.qs + 64 * c + 32),
                                           _mm256_set1_epi16(static_cast<short>(sc[2 * c + 1]))));
  }
  return sum;
}

// A Q6_K block's integer sum with x's block of the values q + 32, int32 lanes (the -32 apart).
__m256i q6k_block_sum(const uint8_t* w, const XQK& x) {
  const auto* sc = reinterpret_cast<const int8_t*>(w + 192);
  __m256i sum = _mm256_setzero_si256();
  for (int h = 0; h < 2; ++h) {
    __m256i u[4];
    unpack_q6_half(w, h, u);
    for (int g = 0; g < 4; ++g) {
      const int s = 8 * h + 2 * g;  // the two 16-value groups of these 32 values
      const __m256i scale = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(sc[s])),
                                                    _mm_set1_epi16(sc[s + 1]), 1);
      sum = _mm256_add_epi32(sum, dot_scaled(u[g], load32(x.qs + 128 * h + 32 * g), scale));
    }
  }
  return sum;
}

// Q4_K (kFive false) and Q5_K.
template <bool kFive>
float dot_qkx(const uint8_t* w, const uint8_t* xq, long long nb) {
  const auto* x = reinterpret_cast<const XQK*>(xq);
  constexpr long long kBytes = kFive ? 176 : 144;
  float acc = 0;
  for (long long i = 0; i < nb; ++i, w += kBytes) {
    int sc[8];
    const int32_t summ = k_scales(w, x[i], sc);
    acc += combine_qkx(half(w), half(w + 2), x[i].d, hsum(qkx_block_sum<kFive>(w, x[i], sc)), summ);
  }
  return acc;
}

float dot_q6_k(const uint8_t* w, const uint8_t* xq, long long nb) {
  const auto* x = reinterpret_cast<const XQK*>(xq);
  float acc = 0;
  for (long long i = 0; i < nb; ++i, w += 210) {
    const auto* sc = reinterpret_cast<const int8_t*>(w + 192);
    acc +=
        combine_q6k(half(w + 208), x[i].d, hsum(q6k_block_sum(w, x[i])) - 32 * q6_bias(sc, x[i]));
  }
  return acc;
}

// ---- one row of x against four weight rows at a time (the decode path) ----
// dot_qkx's and dot_q6_k's integer sums per block, with the scales unpacked by vector operations,
// four rows' horizontal sums in one reduction and the block two ahead prefetched; each row's f32
// combination as theirs, in the same order over the blocks, so bitwise their results.

template <bool kFive>
void qkx_rows4(const uint8_t* w, long long nb, const XQK* x, float* out) {
  qkx_rows4_with<kFive>(w, nb, x, out, [](const uint8_t* b, __m256i scales_mins, const XQK& xb) {
    alignas(32) int16_t sc[16];
    _mm256_store_si256(reinterpret_cast<__m256i*>(sc), scales_mins);
    return qkx_block_sum<kFive>(b, xb, sc);
  });
}

void q6k_rows4(const uint8_t* w, long long nb, const XQK* x, float* out) {
  q6k_rows4_with(w, nb, x, out, [](const uint8_t* b, const XQK& xb) {
    // The values are q + 32: less 32 times the sum over groups of scale x sum(x).
    const __m256i scales16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
    const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.bsums));
    return _mm256_sub_epi32(q6k_block_sum(b, xb),
                            _mm256_slli_epi32(_mm256_madd_epi16(scales16, bsums), 5));
  });
}

// One row of x takes the four-row kernels; more, the single-row dot products row by row.
template <void (*kRows4)(const uint8_t*, long long, const XQK*, float*), DotFn kDot, Format kF>
void rows_kquant(const uint8_t* w, long long k, const uint8_t* xq, long long m, long long n0,
                 long long n1, float* out, long long ldo) {
  if (m == 1) {
    decode_rows<kRows4, kDot, kF>(w, k, xq, n0, n1, out);
  } else {
    dot_rows<kDot, kF>(w, k, xq, m, n0, n1, out, ldo);
  }
}

// ---- dequantization (the dequantize + GEMM path), as quant_scalar.cpp's ----

// 32 byte values (signed when kSigned) to f32, times `scale`, minus `shift` (not fused; signed
// bytes have none), into y.
template <bool kSigned>
void widen32(__m256i v, float scale, float shift, float* y) {
  const __m256 sc = _mm256_set1_ps(scale), sh = _mm256_set1_ps(shift);
  for (int part = 0; part < 4; ++part) {
    const __m128i bytes = part < 2 ? _mm256_castsi256_si128(v) : _mm256_extracti128_si256(v, 1);
    const __m128i eight = (part & 1) ? _mm_srli_si128(bytes, 8) : bytes;
    const __m256i wide = kSigned ? _mm256_cvtepi8_epi32(eight) : _mm256_cvtepu8_epi32(eight);
    __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(wide), sc);
    if (!kSigned) f = _mm256_sub_ps(f, sh);
    _mm256_storeu_ps(y + 8 * part, f);
  }
}

void dequant_q4_0(const uint8_t* w, long long k, float* y) {
  for (long long i = 0; i < k / 32; ++i, w += 18, y += 32) {
    widen32<true>(_mm256_sub_epi8(unpack_q4_0(w), _mm256_set1_epi8(8)), half(w), 0.0f, y);
  }
}

void dequant_q5_0(const uint8_t* w, long long k, float* y) {
  for (long long i = 0; i < k / 32; ++i, w += 22, y += 32) {
    widen32<true>(_mm256_sub_epi8(unpack_q5(w + 2, w + 6), _mm256_set1_epi8(16)), half(w), 0.0f, y);
  }
}

// d * q + m as d * q - (-m) (the same f32 result).
void dequant_q5_1(const uint8_t* w, long long k, float* y) {
  for (long long i = 0; i < k / 32; ++i, w += 24, y += 32)
    widen32<false>(unpack_q5(w + 4, w + 8), half(w), -half(w + 2), y);
}

void dequant_q8_0(const uint8_t* w, long long k, float* y) {
  for (long long i = 0; i < k / 32; ++i, w += 34, y += 32)
    widen32<true>(load32(w + 2), half(w), 0.0f, y);
}

template <bool kFive>
void dequant_qkx(const uint8_t* w, long long k, float* y) {
  constexpr long long kBytes = kFive ? 176 : 144;
  for (long long i = 0; i < k / 256; ++i, w += kBytes, y += 256) {
    const float d = half(w), dmin = half(w + 2);
    const __m256i qh = kFive ? load32(w + 16) : _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      __m256i lo, hi;
      unpack_qkx_pair<kFive>(w + (kFive ? 48 : 16), qh, c, &lo, &hi);
      int sc, m;
      scale_min_k4(2 * c, w + 4, &sc, &m);
      widen32<false>(lo, d * static_cast<float>(sc), dmin * static_cast<float>(m), y + 64 * c);
      scale_min_k4(2 * c + 1, w + 4, &sc, &m);
      widen32<false>(hi, d * static_cast<float>(sc), dmin * static_cast<float>(m), y + 64 * c + 32);
    }
  }
}

// Each group of 16 has its own scale: the 32 values of a group pair widened 16 at a time.
void dequant_q6_k(const uint8_t* w, long long k, float* y) {
  for (long long i = 0; i < k / 256; ++i, w += 210, y += 256) {
    const float d = half(w + 208);
    const auto* sc = reinterpret_cast<const int8_t*>(w + 192);
    for (int h = 0; h < 2; ++h) {
      __m256i u[4];
      unpack_q6_half(w, h, u);
      for (int g = 0; g < 4; ++g) {
        alignas(32) int8_t q[32];
        _mm256_store_si256(reinterpret_cast<__m256i*>(q),
                           _mm256_sub_epi8(u[g], _mm256_set1_epi8(32)));
        for (int half16 = 0; half16 < 2; ++half16) {
          const int s = 8 * h + 2 * g + half16;
          const __m256 ds = _mm256_set1_ps(d * static_cast<float>(sc[s]));
          for (int part = 0; part < 2; ++part) {
            const __m128i eight =
                _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + 16 * half16 + 8 * part));
            _mm256_storeu_ps(y + 128 * h + 32 * g + 16 * half16 + 8 * part,
                             _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(eight)), ds));
          }
        }
      }
    }
  }
}

}  // namespace

const DequantRowFn dequant_row_avx2[kFormats] = {
    &dequant_q4_0, &dequant_q8_0, &dequant_qkx<false>, &dequant_qkx<true>,
    &dequant_q6_k, &dequant_q5_0, &dequant_q5_1};

const QuantRowsFn quant_rows_avx2[kFormats] = {
    &dot_rows<&dot_q4_0, Format::kQ4_0>,
    &dot_rows<&dot_q8_0, Format::kQ8_0>,
    &rows_kquant<&qkx_rows4<false>, &dot_qkx<false>, Format::kQ4_K>,
    &rows_kquant<&qkx_rows4<true>, &dot_qkx<true>, Format::kQ5_K>,
    &rows_kquant<&q6k_rows4, &dot_q6_k, Format::kQ6_K>,
    &dot_rows<&dot_q5_0, Format::kQ5_0>,
    &dot_rows<&dot_q5_1, Format::kQ5_1>};

}  // namespace promptcache::kernels::quant
#else
namespace promptcache::kernels::quant {
const DequantRowFn dequant_row_avx2[kFormats] = {};
const QuantRowsFn quant_rows_avx2[kFormats] = {};
}  // namespace promptcache::kernels::quant
#endif
