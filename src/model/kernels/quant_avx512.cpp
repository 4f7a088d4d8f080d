// src/model/kernels/quant_avx512.cpp — integer dot products of GGML weight blocks with x
// quantized to 8 bits (quant_blocks.hpp), AVX-512 VNNI: vpdpbusd sums four unsigned weight values
// times four signed x values into each int32 lane in one instruction (AVX2 needs vpmaddubsw and
// vpmaddwd); the K-quants take two sub-blocks (64 values) per 512-bit register, pack the 4-value
// sums to int16 and scale them with vpdpwssd (the single-row dot_* functions: vpmulld). Every
// block's integer sums equal the scalar kernel's, combined in f32 in the same order, so the result
// is bitwise the scalar one's.
#include "quant_blocks.hpp"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include <immintrin.h>

#include <cstring>
#include <vector>

namespace promptcache::kernels::quant {
namespace {

// [sum of a, sum of b, sum of c, sum of d] of four int32 vectors (before quant_unpack.inl, whose
// four-row kernels call it).
__m128i hsum4(__m512i a, __m512i b, __m512i c, __m512i d) {
  const __m512i ab = _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
  const __m512i cd = _mm512_add_epi32(_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
  const __m512i abcd =
      _mm512_add_epi32(_mm512_unpacklo_epi64(ab, cd), _mm512_unpackhi_epi64(ab, cd));
  const __m256i h =
      _mm256_add_epi32(_mm512_castsi512_si256(abcd), _mm512_extracti64x4_epi64(abcd, 1));
  return _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}

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

// ---- one row of x against four weight rows at a time (the decode path) ----
// The same per-block integer sums as dot_qkx / dot_q6_k, reached with fewer instructions: each
// 4-value product sum (at most 4 * 63 * 127 in magnitude) is packed to int16 and multiplied by
// its sub-block's scale with vpdpwssd (two per block) instead of vpmulld (four), and four rows'
// horizontal sums share one reduction. The f32 combination is each row's same expression, in
// the same order over the blocks, so every result is bitwise dot_qkx's / dot_q6_k's.

// packs_epi32(a, b) puts a's int32 lanes 4L..4L+3, then b's, into 128-bit lane L as int16: the
// int16 at i came from a where i % 8 < 4, from lane 4 (i / 8) + i % 4 of a or b.
// For two registers of 64 values each (a: values 0..63, b: 64..127 of a 128-value half), the
// 16-value group of int16 i is (i % 8 < 4 ? 0 : 4) + i / 8; the 32-value sub-block of a Q4_K
// pair register (lanes 0-7 its first sub-block, 8-15 its second) is (i % 8 < 4 ? 0 : 2) + i / 16.
struct GroupIndex {
  alignas(64) int16_t v[32];
  constexpr GroupIndex(int first, bool k_quant_pairs) : v{} {
    for (int i = 0; i < 32; ++i) {
      v[i] = static_cast<int16_t>(k_quant_pairs ? first + (i % 8 < 4 ? 0 : 2) + i / 16
                                                : first + (i % 8 < 4 ? 0 : 4) + i / 8);
    }
  }
};
constexpr GroupIndex kFirstPairs(0, true), kSecondPairs(4, true);
constexpr GroupIndex kFirstGroups(0, false), kLastGroups(8, false);

// Constants of the K-quant kernels below.
struct KConsts {
  __m512i low = _mm512_set1_epi8(0x0F);
  // int16 shift counts: 0 for the low 32 bytes (low nibbles), 4 for the high 32 (high nibbles).
  __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
  __m512i first_pairs = _mm512_load_si512(kFirstPairs.v);
  __m512i second_pairs = _mm512_load_si512(kSecondPairs.v);
  __m512i first_groups = _mm512_load_si512(kFirstGroups.v);
  __m512i last_groups = _mm512_load_si512(kLastGroups.v);
};

// A Q4_K (values 0..15) or Q5_K (0..31) block's four 64-value registers: register c holds
// sub-block 2c in its low 32 bytes and 2c + 1 in its high 32, as x's values 64c..64c+63.
template <bool kFive>
void qkx_values(const uint8_t* b, const KConsts& k, __m512i q[4]) {
  const uint8_t* qs = b + (kFive ? 48 : 16);
  const __m512i qh = kFive ? _mm512_broadcast_i64x4(load32(b + 16)) : _mm512_setzero_si512();
  for (int c = 0; c < 4; ++c) {
    q[c] = _mm512_and_si512(_mm512_srlv_epi16(_mm512_broadcast_i64x4(load32(qs + 32 * c)), k.shift),
                            k.low);
    if (kFive) {
      // Bit 2c of qh[l] is sub-block 2c's fifth bit (the low half), bit 2c + 1 the high's.
      const __m512i bits =
          _mm512_inserti64x4(_mm512_set1_epi8(static_cast<char>(1 << (2 * c))),
                             _mm256_set1_epi8(static_cast<char>(1 << (2 * c + 1))), 1);
      q[c] =
          _mm512_mask_add_epi8(q[c], _mm512_test_epi8_mask(qh, bits), q[c], _mm512_set1_epi8(16));
    }
  }
}

// A Q6_K block's four 64-value registers (q + 32, 0..63), as x's values 64r..64r+63.
void q6k_values(const uint8_t* b, __m512i q[4]) {
  for (int h = 0; h < 2; ++h) {
    __m256i u[4];
    unpack_q6_half(b, h, u);
    q[2 * h] = join(u[0], u[1]);
    q[2 * h + 1] = join(u[2], u[3]);
  }
}

// The scales of vpdpwssd for packs_epi32(p0, p1) and packs_epi32(p2, p3) (GroupIndex), from the
// block's scales as int16 lanes.
struct ScalePair {
  __m512i first, second;
};
ScalePair scale_pair(__m256i scales16, __m512i first, __m512i second) {
  const __m512i scales = _mm512_castsi256_si512(scales16);
  return {_mm512_permutexvar_epi16(first, scales), _mm512_permutexvar_epi16(second, scales)};
}

// One block's integer sum with 256 values of x, in int32 lanes: the 4-value products of each
// register (vpdpbusd), packed to int16, times their scales (vpdpwssd).
__m512i scaled_dots(const __m512i q[4], const int8_t* xqs, const ScalePair& s) {
  __m512i p[4];
  for (int c = 0; c < 4; ++c) {
    p[c] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[c], _mm512_loadu_si512(xqs + 64 * c));
  }
  const __m512i a =
      _mm512_dpwssd_epi32(_mm512_setzero_si512(), _mm512_packs_epi32(p[0], p[1]), s.first);
  return _mm512_dpwssd_epi32(a, _mm512_packs_epi32(p[2], p[3]), s.second);
}

// Q6_K's -32 of every value as an int32 vector to add: 32 times the sum over groups of scale x
// sum(x), negated.
__m512i q6k_bias(__m256i scales16, const XQK& x) {
  const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.bsums));
  return _mm512_zextsi256_si512(_mm256_sub_epi32(
      _mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(scales16, bsums), 5)));
}

__m256i q6k_scales(const uint8_t* b) {
  return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
}

int32_t hsum(__m128i v) {
  v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4e));
  return _mm_cvtsi128_si32(_mm_add_epi32(v, _mm_shuffle_epi32(v, 0xb1)));
}

template <bool kFive>
void qkx_rows4(const uint8_t* w, long long nb, const XQK* x, float* out) {
  const KConsts k;
  qkx_rows4_with<kFive>(w, nb, x, out, [&k](const uint8_t* b, __m256i scales_mins, const XQK& xb) {
    __m512i q[4];
    qkx_values<kFive>(b, k, q);
    return scaled_dots(q, xb.qs, scale_pair(scales_mins, k.first_pairs, k.second_pairs));
  });
}

void q6k_rows4(const uint8_t* w, long long nb, const XQK* x, float* out) {
  const KConsts k;
  q6k_rows4_with(w, nb, x, out, [&k](const uint8_t* b, const XQK& xb) {
    const __m256i scales = q6k_scales(b);
    __m512i q[4];
    q6k_values(b, q);
    return _mm512_add_epi32(
        scaled_dots(q, xb.qs, scale_pair(scales, k.first_groups, k.last_groups)),
        q6k_bias(scales, xb));
  });
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

// The K-quants' tiles: a weight block unpacked once (values, scales), then its integer sums with
// the tile's rows of x four at a time (one reduction for four), the rest one by one; each output
// accumulated over the blocks in order with its row's f32 expression, so bitwise dot_qkx's /
// dot_q6_k's.

// A Q4_K/Q5_K block's unpacked values, scales and mins; d and dmin.
template <bool kFive>
struct QkxTileBlock {
  static constexpr long long kBytes = kFive ? 176 : 144;
  static constexpr bool kMins = true;
  __m512i q[4];
  ScalePair scales;
  __m128i mins;
  float d, dmin;
  QkxTileBlock(const uint8_t* b, const KConsts& k) : d(half(b)), dmin(half(b + 2)) {
    qkx_values<kFive>(b, k, q);
    const __m256i scales_mins = k_scales_mins(b + 4);
    scales = scale_pair(scales_mins, k.first_pairs, k.second_pairs);
    mins = _mm256_extracti128_si256(scales_mins, 1);
  }
  // Integer sums with one row of x (lanes), and of its mins with x's sub-block sums.
  __m512i sumi(const XQK& x) const { return scaled_dots(q, x.qs, scales); }
  // `sums`: x's eight sub-block sums (pair_sums, computed once per tile).
  __m128i summ(const int16_t* sums) const {
    return _mm_madd_epi16(mins, _mm_loadu_si128(reinterpret_cast<const __m128i*>(sums)));
  }
  // combine_qkx for four rows of x, and for one.
  __m128 combine4(__m128 xd, __m128 si, __m128 sm) const {
    return _mm_mul_ps(
        xd, _mm_sub_ps(_mm_mul_ps(_mm_set1_ps(d), si), _mm_mul_ps(_mm_set1_ps(dmin), sm)));
  }
  float combine1(const XQK& x, const int16_t* sums) const {
    return combine_qkx(d, dmin, x.d, _mm512_reduce_add_epi32(sumi(x)), hsum(summ(sums)));
  }
};

// A Q6_K block's unpacked values and scales; d.
struct Q6kTileBlock {
  static constexpr long long kBytes = 210;
  __m512i q[4];
  ScalePair scales;
  __m256i scales16;
  float d;
  Q6kTileBlock(const uint8_t* b, const KConsts& k) : scales16(q6k_scales(b)), d(half(b + 208)) {
    q6k_values(b, q);
    scales = scale_pair(scales16, k.first_groups, k.last_groups);
  }
  __m512i sumi(const XQK& x) const {
    return _mm512_add_epi32(scaled_dots(q, x.qs, scales), q6k_bias(scales16, x));
  }
  static constexpr bool kMins = false;
  __m128i summ(const int16_t*) const { return _mm_setzero_si128(); }
  // combine_q6k: xd * d * sumi.
  __m128 combine4(__m128 xd, __m128 si, __m128) const {
    return _mm_mul_ps(_mm_mul_ps(xd, _mm_set1_ps(d)), si);
  }
  float combine1(const XQK& x, const int16_t*) const {
    return combine_q6k(d, x.d, _mm512_reduce_add_epi32(sumi(x)));
  }
};

// out[t * ldo] for the tile's rows x[0..rows) of x (rows <= kTile) against one weight row;
// sums[(t * nb + i) * 8 ...]: row t's sub-block sums of block i (Q4_K/Q5_K).
template <class Block>
void kquant_tile(const uint8_t* wr, long long nb, const XQK* const* x, const int16_t* sums,
                 int rows, const KConsts& k, float* out, long long ldo) {
  __m128 acc[kTile / 4];
  for (auto& a : acc) a = _mm_setzero_ps();
  float rest[4] = {};
  const int full = rows / 4 * 4;
  for (long long i = 0; i < nb; ++i) {
    const Block block(wr + i * Block::kBytes, k);
    for (int g = 0; g < full; g += 4) {
      const XQK& x0 = x[g][i];
      const XQK& x1 = x[g + 1][i];
      const XQK& x2 = x[g + 2][i];
      const XQK& x3 = x[g + 3][i];
      const __m128 si =
          _mm_cvtepi32_ps(hsum4(block.sumi(x0), block.sumi(x1), block.sumi(x2), block.sumi(x3)));
      const int16_t* s = sums + (g * nb + i) * 8;
      const __m128 sm =
          _mm_cvtepi32_ps(hsum4(block.summ(s), block.summ(s + nb * 8), block.summ(s + 2 * nb * 8),
                                block.summ(s + 3 * nb * 8)));
      acc[g / 4] =
          _mm_add_ps(acc[g / 4], block.combine4(_mm_setr_ps(x0.d, x1.d, x2.d, x3.d), si, sm));
    }
    for (int t = full; t < rows; ++t) {
      rest[t - full] += block.combine1(x[t][i], sums + (t * nb + i) * 8);
    }
  }
  for (int g = 0; g < full; g += 4) {
    alignas(16) float four[4];
    _mm_store_ps(four, acc[g / 4]);
    for (int r = 0; r < 4; ++r) out[(g + r) * ldo] = four[r];
  }
  for (int t = full; t < rows; ++t) out[t * ldo] = rest[t - full];
}

template <class Block>
void kquant_tiled(const uint8_t* w, long long k, const uint8_t* xq, long long m, long long n0,
                  long long n1, float* out, long long ldo) {
  const long long nb = k / kQK, row = nb * Block::kBytes;
  const long long xrow = nb * static_cast<long long>(sizeof(XQK));
  const KConsts consts;
  thread_local std::vector<int16_t> sums;
  if (Block::kMins) sums.resize(static_cast<std::size_t>(kTile * nb * 8));
  for (long long t0 = 0; t0 < m; t0 += kTile) {
    const int rows = static_cast<int>(t0 + kTile < m ? kTile : m - t0);
    const XQK* x[kTile];
    for (int t = 0; t < rows; ++t) {
      x[t] = reinterpret_cast<const XQK*>(xq + (t0 + t) * xrow);
      for (long long i = 0; Block::kMins && i < nb; ++i) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(sums.data() + (t * nb + i) * 8),
                         pair_sums(x[t][i]));
      }
    }
    for (long long j = n0; j < n1; ++j) {
      kquant_tile<Block>(w + j * row, nb, x, sums.data(), rows, consts, out + t0 * ldo + j, ldo);
    }
  }
}

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

// The K-quants: one row of x takes the four-row kernels above.
template <void (*kRows4)(const uint8_t*, long long, const XQK*, float*), DotFn kDot, Format kF,
          class Block>
void rows_kquant(const uint8_t* w, long long k, const uint8_t* xq, long long m, long long n0,
                 long long n1, float* out, long long ldo) {
  if (m == 1) {
    decode_rows<kRows4, kDot, kF>(w, k, xq, n0, n1, out);
  } else {
    kquant_tiled<Block>(w, k, xq, m, n0, n1, out, ldo);
  }
}

}  // namespace

const QuantRowsFn quant_rows_avx512vnni[kFormats] = {
    &rows_k<&dot_q4_0, Format::kQ4_0, Q40Block>,
    &rows_k<&dot_q8_0, Format::kQ8_0, Q80Block>,
    &rows_kquant<&qkx_rows4<false>, &dot_qkx<false>, Format::kQ4_K, QkxTileBlock<false>>,
    &rows_kquant<&qkx_rows4<true>, &dot_qkx<true>, Format::kQ5_K, QkxTileBlock<true>>,
    &rows_kquant<&q6k_rows4, &dot_q6_k, Format::kQ6_K, Q6kTileBlock>,
    &rows_k<&dot_q5_0, Format::kQ5_0, Q50Block>,
    &rows_k<&dot_q5_1, Format::kQ5_1, Q51Block>};

}  // namespace promptcache::kernels::quant
#else
namespace promptcache::kernels::quant {
const QuantRowsFn quant_rows_avx512vnni[kFormats] = {};
}  // namespace promptcache::kernels::quant
#endif
