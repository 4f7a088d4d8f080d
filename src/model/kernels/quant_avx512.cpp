// src/model/kernels/quant_avx512.cpp — integer dot products of GGML weight blocks with x
// quantized to 8 bits (quant_blocks.hpp), AVX-512 VNNI: vpdpbusd sums four unsigned weight values
// times four signed x values into each int32 lane in one instruction (AVX2 needs vpmaddubsw and
// vpmaddwd); the K-quants take two sub-blocks (64 values) per 512-bit register and scale the
// lanes with vpmulld. Every block's integer sums equal the scalar kernel's, combined in f32 in the
// same order, so the result is bitwise the scalar one's.
#include "quant_blocks.hpp"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include <immintrin.h>

namespace promptcache::kernels::quant {
namespace {

#include "quant_unpack.inl"

// Two 32-byte halves as one 512-bit register (a in the low half).
__m512i join(__m256i a, __m256i b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}

// int32 lanes 0..7 = a, 8..15 = b.
__m512i two_scales(int a, int b) {
  return join(_mm256_set1_epi32(a), _mm256_set1_epi32(b));
}

float dot_q4_0(const uint8_t* w, const uint8_t* xq, long long nb) {
  const auto* x = reinterpret_cast<const XQ32*>(xq);
  float acc = 0;
  for (long long i = 0; i < nb; ++i, w += 18) {
    const __m256i d = _mm256_dpbusd_epi32(_mm256_setzero_si256(), unpack_q4_0(w), load32(x[i].qs));
    acc += combine_q32(half(w), x[i].d, hsum(d) - 8 * x[i].sum);
  }
  return acc;
}

float dot_q5_0(const uint8_t* w, const uint8_t* xq, long long nb) {
  const auto* x = reinterpret_cast<const XQ32*>(xq);
  float acc = 0;
  for (long long i = 0; i < nb; ++i, w += 22) {
    const __m256i d =
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), unpack_q5(w + 2, w + 6), load32(x[i].qs));
    acc += combine_q32(half(w), x[i].d, hsum(d) - 16 * x[i].sum);
  }
  return acc;
}

float dot_q5_1(const uint8_t* w, const uint8_t* xq, long long nb) {
  const auto* x = reinterpret_cast<const XQ32*>(xq);
  float acc = 0;
  for (long long i = 0; i < nb; ++i, w += 24) {
    const __m256i d =
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), unpack_q5(w + 4, w + 8), load32(x[i].qs));
    acc += combine_q51(half(w), half(w + 2), x[i].d, hsum(d), x[i].sum);
  }
  return acc;
}

float dot_q8_0(const uint8_t* w, const uint8_t* xq, long long nb) {
  const auto* x = reinterpret_cast<const XQ32*>(xq);
  float acc = 0;
  for (long long i = 0; i < nb; ++i, w += 34) {
    const __m256i q = load32(w + 2);
    const __m256i d = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(q, q),
                                          _mm256_sign_epi8(load32(x[i].qs), q));
    acc += combine_q32(half(w), x[i].d, hsum(d));
  }
  return acc;
}

template <bool kFive>
float dot_qkx(const uint8_t* w, const uint8_t* xq, long long nb) {
  const auto* x = reinterpret_cast<const XQK*>(xq);
  constexpr long long kBytes = kFive ? 176 : 144;
  float acc = 0;
  for (long long i = 0; i < nb; ++i, w += kBytes) {
    int sc[8];
    const int32_t summ = k_scales(w, x[i], sc);
    const __m256i qh = kFive ? load32(w + 16) : _mm256_setzero_si256();
    __m512i sum = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      __m256i lo, hi;
      unpack_qkx_pair<kFive>(w + (kFive ? 48 : 16), qh, c, &lo, &hi);
      const __m512i xv = _mm512_loadu_si512(x[i].qs + 64 * c);
      const __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), join(lo, hi), xv);
      sum = _mm512_add_epi32(sum, _mm512_mullo_epi32(d, two_scales(sc[2 * c], sc[2 * c + 1])));
    }
    acc += combine_qkx(half(w), half(w + 2), x[i].d, _mm512_reduce_add_epi32(sum), summ);
  }
  return acc;
}

float dot_q6_k(const uint8_t* w, const uint8_t* xq, long long nb) {
  const auto* x = reinterpret_cast<const XQK*>(xq);
  // Lane l of a 64-value product holds values 4l..4l+3: its scale is the (l / 4)-th of four.
  const __m128i spread = _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
  float acc = 0;
  for (long long i = 0; i < nb; ++i, w += 210) {
    const auto* sc = reinterpret_cast<const int8_t*>(w + 192);
    __m512i sum = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      __m256i u[4];
      unpack_q6_half(w, h, u);
      const __m512i pairs[2] = {join(u[0], u[1]), join(u[2], u[3])};
      for (int p = 0; p < 2; ++p) {
        const int s = 8 * h + 4 * p;  // the four 16-value groups of these 64 values
        int32_t four;
        __builtin_memcpy(&four, sc + s, 4);
        const __m512i scale =
            _mm512_cvtepi8_epi32(_mm_shuffle_epi8(_mm_cvtsi32_si128(four), spread));
        const __m512i xv = _mm512_loadu_si512(x[i].qs + 128 * h + 64 * p);
        const __m512i d = _mm512_dpbusd_epi32(_mm512_setzero_si512(), pairs[p], xv);
        sum = _mm512_add_epi32(sum, _mm512_mullo_epi32(d, scale));
      }
    }
    acc +=
        combine_q6k(half(w + 208), x[i].d, _mm512_reduce_add_epi32(sum) - 32 * q6_bias(sc, x[i]));
  }
  return acc;
}

// ---- rows for several rows of x: each weight block unpacked once for a tile of rows ----
// The same sums as the dot_* functions above, each output accumulated over the blocks in the same
// order, so bitwise the same results; the unpacking is shared by up to kTile rows of x.

constexpr long long kTile = 16;

// out[t, j] for the rows of x in [t0, t1) and weight row j, from per-block partial sums.
template <class Block>
void tile_rows(const uint8_t* w, long long nb, long long bytes, const uint8_t* xq, long long xrow,
               long long t0, long long t1, long long j, float* out, long long ldo) {
  float acc[kTile] = {};
  const uint8_t* wr = w + j * nb * bytes;
  for (long long i = 0; i < nb; ++i) {
    const Block block(wr + i * bytes);
    for (long long t = t0; t < t1; ++t) {
      acc[t - t0] += block.dot(reinterpret_cast<const typename Block::X*>(xq + t * xrow)[i]);
    }
  }
  for (long long t = t0; t < t1; ++t) out[t * ldo + j] = acc[t - t0];
}

template <class Block>
void rows_tiled(const uint8_t* w, long long k, const uint8_t* xq, long long m, long long n0,
                long long n1, float* out, long long ldo) {
  const long long nb = k / Block::kElements;
  const long long xrow = nb * static_cast<long long>(sizeof(typename Block::X));
  for (long long t0 = 0; t0 < m; t0 += kTile) {
    const long long t1 = t0 + kTile < m ? t0 + kTile : m;
    for (long long j = n0; j < n1; ++j) {
      tile_rows<Block>(w, nb, Block::kBytes, xq, xrow, t0, t1, j, out, ldo);
    }
  }
}

// A Q4_K (kFive false) or Q5_K block unpacked: four 64-value registers and their scales.
template <bool kFive>
struct QkxBlock {
  using X = XQK;
  static constexpr long long kElements = 256, kBytes = kFive ? 176 : 144;
  __m512i q[4], scale[4];
  int m[8];
  float d, dmin;
  explicit QkxBlock(const uint8_t* w) : d(half(w)), dmin(half(w + 2)) {
    int sc[8];
    for (int s = 0; s < 8; ++s) scale_min_k4(s, w + 4, &sc[s], &m[s]);
    const __m256i qh = kFive ? load32(w + 16) : _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {
      __m256i lo, hi;
      unpack_qkx_pair<kFive>(w + (kFive ? 48 : 16), qh, c, &lo, &hi);
      q[c] = join(lo, hi);
      scale[c] = two_scales(sc[2 * c], sc[2 * c + 1]);
    }
  }
  float dot(const XQK& x) const {
    int32_t summ = 0;
    for (int s = 0; s < 8; ++s) summ += m[s] * (x.bsums[2 * s] + x.bsums[2 * s + 1]);
    __m512i sum = _mm512_setzero_si512();
    for (int c = 0; c < 4; ++c) {
      const __m512i p =
          _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[c], _mm512_loadu_si512(x.qs + 64 * c));
      sum = _mm512_add_epi32(sum, _mm512_mullo_epi32(p, scale[c]));
    }
    return combine_qkx(d, dmin, x.d, _mm512_reduce_add_epi32(sum), summ);
  }
};

struct Q6kBlock {
  using X = XQK;
  static constexpr long long kElements = 256, kBytes = 210;
  __m512i q[4], scale[4];
  const int8_t* sc;
  float d;
  explicit Q6kBlock(const uint8_t* w)
      : sc(reinterpret_cast<const int8_t*>(w + 192)), d(half(w + 208)) {
    const __m128i spread = _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    for (int h = 0; h < 2; ++h) {
      __m256i u[4];
      unpack_q6_half(w, h, u);
      q[2 * h] = join(u[0], u[1]);
      q[2 * h + 1] = join(u[2], u[3]);
      for (int p = 0; p < 2; ++p) {
        int32_t four;
        __builtin_memcpy(&four, sc + 8 * h + 4 * p, 4);
        scale[2 * h + p] = _mm512_cvtepi8_epi32(_mm_shuffle_epi8(_mm_cvtsi32_si128(four), spread));
      }
    }
  }
  float dot(const XQK& x) const {
    __m512i sum = _mm512_setzero_si512();
    for (int r = 0; r < 4; ++r) {
      const __m512i p =
          _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[r], _mm512_loadu_si512(x.qs + 64 * r));
      sum = _mm512_add_epi32(sum, _mm512_mullo_epi32(p, scale[r]));
    }
    return combine_q6k(d, x.d, _mm512_reduce_add_epi32(sum) - 32 * q6_bias(sc, x));
  }
};

// A Q4_0 block's values (0..15) or a Q8_0 block's (|w|, with w's sign to put on x).
struct Q40Block {
  using X = XQ32;
  static constexpr long long kElements = 32, kBytes = 18;
  __m256i u;
  float d;
  explicit Q40Block(const uint8_t* w) : u(unpack_q4_0(w)), d(half(w)) {}
  float dot(const XQ32& x) const {
    const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, load32(x.qs));
    return combine_q32(d, x.d, hsum(p) - 8 * x.sum);
  }
};

struct Q50Block {
  using X = XQ32;
  static constexpr long long kElements = 32, kBytes = 22;
  __m256i u;
  float d;
  explicit Q50Block(const uint8_t* w) : u(unpack_q5(w + 2, w + 6)), d(half(w)) {}
  float dot(const XQ32& x) const {
    const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, load32(x.qs));
    return combine_q32(d, x.d, hsum(p) - 16 * x.sum);
  }
};

struct Q51Block {
  using X = XQ32;
  static constexpr long long kElements = 32, kBytes = 24;
  __m256i u;
  float d, m;
  explicit Q51Block(const uint8_t* w) : u(unpack_q5(w + 4, w + 8)), d(half(w)), m(half(w + 2)) {}
  float dot(const XQ32& x) const {
    const __m256i p = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, load32(x.qs));
    return combine_q51(d, m, x.d, hsum(p), x.sum);
  }
};

struct Q80Block {
  using X = XQ32;
  static constexpr long long kElements = 32, kBytes = 34;
  __m256i q, magnitude;
  float d;
  explicit Q80Block(const uint8_t* w)
      : q(load32(w + 2)), magnitude(_mm256_sign_epi8(q, q)), d(half(w)) {}
  float dot(const XQ32& x) const {
    const __m256i p =
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), magnitude, _mm256_sign_epi8(load32(x.qs), q));
    return combine_q32(d, x.d, hsum(p));
  }
};

// One row of x: the single-row kernels (no tile to share the unpacking with); more: tiled.
template <DotFn kDot, Format kF, class Block>
void rows_k(const uint8_t* w, long long k, const uint8_t* xq, long long m, long long n0,
            long long n1, float* out, long long ldo) {
  if (m == 1) {
    dot_rows<kDot, kF>(w, k, xq, m, n0, n1, out, ldo);
  } else {
    rows_tiled<Block>(w, k, xq, m, n0, n1, out, ldo);
  }
}

}  // namespace

const QuantRowsFn quant_rows_avx512vnni[kFormats] = {
    &rows_k<&dot_q4_0, Format::kQ4_0, Q40Block>,
    &rows_k<&dot_q8_0, Format::kQ8_0, Q80Block>,
    &rows_k<&dot_qkx<false>, Format::kQ4_K, QkxBlock<false>>,
    &rows_k<&dot_qkx<true>, Format::kQ5_K, QkxBlock<true>>,
    &rows_k<&dot_q6_k, Format::kQ6_K, Q6kBlock>,
    &rows_k<&dot_q5_0, Format::kQ5_0, Q50Block>,
    &rows_k<&dot_q5_1, Format::kQ5_1, Q51Block>};

}  // namespace promptcache::kernels::quant
#else
namespace promptcache::kernels::quant {
const QuantRowsFn quant_rows_avx512vnni[kFormats] = {};
}  // namespace promptcache::kernels::quant
#endif
