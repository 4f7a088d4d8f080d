// src/model/kernels/avx512_bf16.cpp — bf16 weights times x rounded to bf16, with AVX-512 BF16's
// vdpbf16ps: each instruction multiplies 16 pairs of bf16 and adds both products of a pair into
// an f32 lane (32 multiply-adds, where an f32 FMA does 16 and the widening kernel of avx512.cpp
// must first turn each bf16 weight into an f32).
//
// x is rounded to bf16 once per call (round_bf16_rows: round to nearest even, as
// vcvtne2ps2bf16 does), into rows padded with zeros to a multiple of kBf16DotChunk; the weights
// are read as stored. Each output element (t, j) has its own accumulator, which takes the row's
// chunks of 32 in order and is summed across its lanes by one fixed tree (reduce4): the same
// instructions on the same values whatever the register block, the tail of tokens or weight
// rows, the tile of tokens or the thread split. So a row of x gives bitwise the same output
// alone as in a call with any number of other rows (the batch-exact and prefix-exact contracts
// compare such calls), and no lane-transposed path (the f32 kernels' from 13 rows) is used.
//
// Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16; cpu_linear.cpp calls it only
// where CPUID reports AVX512_BF16 and the OS saves the zmm state.
#include "kernels.hpp"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__) && defined(__AVX512BF16__)
#include <immintrin.h>

namespace {
using Index = long long;
using promptcache::kernels::Bf16;
using promptcache::kernels::bf16_dot_stride;
using promptcache::kernels::kBf16DotChunk;
static_assert(kBf16DotChunk == 32);

// Weight rows per register block (reduce4 sums four accumulators at once) and token rows: 4 x 6
// = 24 sums, 4 weight vectors and one of x: 29 of the 32 registers.
constexpr int kRows = 4, kTokens = 6;
// Token rows per tile: every weight row of the call meets a tile of x while the tile stays in
// L2 (a 2048-token prefill's x is 3 MB in bf16 for 768 inputs).
constexpr Index kTileBytes = 256 << 10;
constexpr int kPrefetchLocality = 2;

inline __mmask16 first16(Index n) {
  if (n <= 0) return 0;
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
}
inline __mmask32 first32(Index n) {
  if (n <= 0) return 0;
  return n >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << n) - 1u);
}

// A 512-bit integer vector as 32 bf16 (GCC 12 declares __m512bh as shorts, later compilers as
// __bf16: a vector cast between same-sized vectors reinterprets the bits for both).
inline __m512bh as_bh(__m512i v) {
  return (__m512bh)v;
}

void round_bf16_rows(const float* x, Index m, Index k, Bf16* xb) {
  const Index kp = bf16_dot_stride(k);
  for (Index t = 0; t < m; ++t) {
    const float* src = x + t * k;
    Bf16* dst = xb + t * kp;
    for (Index i = 0; i < kp; i += kBf16DotChunk) {
      __m512 lo, hi;
      if (i + kBf16DotChunk <= k) {
        lo = _mm512_loadu_ps(src + i);
        hi = _mm512_loadu_ps(src + i + 16);
      } else {
        lo = _mm512_maskz_loadu_ps(first16(k - i), src + i);
        hi = _mm512_maskz_loadu_ps(first16(k - i - 16), src + i + 16);
      }
      // The low 16 bf16 come from the second operand.
      const __m512bh r = _mm512_cvtne2ps_pbh(hi, lo);
      _mm512_storeu_si512(dst + i, (__m512i)r);
    }
  }
}

// The lane sums of a, b, c, d in elements 0-3, each by the same tree: lanes i and i + 8, then
// i and i + 4, then i and i + 2, then i and i + 1. Each element's additions see only its own
// vector's lanes, so the sum of a vector does not depend on which others it is reduced with.
inline __m128 reduce4(__m512 a, __m512 b, __m512 c, __m512 d) {
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(1, 0, 1, 0)),
                                  _mm512_shuffle_f32x4(c, d, _MM_SHUFFLE(3, 2, 3, 2)));
  // 128-bit lane q holds the 8 lanes' sums of vector q: its first and second 4.
  const __m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_f32x4(ab, cd, _MM_SHUFFLE(3, 1, 3, 1)));
  const __m512 u = _mm512_add_ps(s, _mm512_permute_ps(s, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 v = _mm512_add_ps(u, _mm512_permute_ps(u, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512i pick = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(pick, v));
}

// out[t * ldo + r] = row t of xb (T rows, kp apart) . weight row r of w (rows <= R rows, k
// apart), for R a multiple of 4. While it runs it asks (to L2) for the `next_rows` rows at next.
template <int R, int T>
inline void dot_block(const Bf16* xb, Index kp, Index k, const Bf16* w, int rows, float* out,
                      Index ldo, const Bf16* next, int next_rows) {
  static_assert(R % 4 == 0);
  __m512 acc[R][T];
  const Bf16* wr[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) wr[r] = w + (r < rows ? r : 0) * k;  // spare rows redo row 0
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  const Index whole = k / kBf16DotChunk * kBf16DotChunk;
  Index i = 0;
  for (; i < whole; i += kBf16DotChunk) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      if (r < next_rows) __builtin_prefetch(next + r * k + i, 0, kPrefetchLocality);
    }
    __m512i a[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) a[r] = _mm512_loadu_si512(wr[r] + i);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512bh xv = as_bh(_mm512_loadu_si512(xb + t * kp + i));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], as_bh(a[r]), xv);
    }
  }
  if (i < k) {  // the rows' last, shorter chunk (x is padded with zeros to kp)
    const __mmask32 mask = first32(k - i);
    __m512i a[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) a[r] = _mm512_maskz_loadu_epi16(mask, wr[r] + i);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512bh xv = as_bh(_mm512_loadu_si512(xb + t * kp + i));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], as_bh(a[r]), xv);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
#pragma GCC unroll 2
    for (int r0 = 0; r0 < R; r0 += 4) {
      if (r0 >= rows) break;
      const __m128 sums = reduce4(acc[r0][t], acc[r0 + 1][t], acc[r0 + 2][t], acc[r0 + 3][t]);
      const int left = rows - r0;
      _mm_mask_storeu_ps(out + t * ldo + r0,
                         static_cast<__mmask8>(left >= 4 ? 0xfu : (1u << left) - 1u), sums);
    }
  }
}

// The last (fewer than kTokens) token rows: the block instantiated for exactly that many.
template <int R, int T>
inline void dot_block_tail(int tokens, const Bf16* xb, Index kp, Index k, const Bf16* w, int rows,
                           float* out, Index ldo, const Bf16* next, int next_rows) {
  if constexpr (T > 0) {
    if (tokens == T) {
      dot_block<R, T>(xb, kp, k, w, rows, out, ldo, next, next_rows);
    } else {
      dot_block_tail<R, T - 1>(tokens, xb, kp, k, w, rows, out, ldo, next, next_rows);
    }
  }
}

void linear_rows_bf16_dot(const Bf16* xb, Index m, Index k, const Bf16* w, Index n0, Index n1,
                          float* out, Index ldo) {
  const Index kp = bf16_dot_stride(k);
  const Index row_bytes = kp * static_cast<Index>(sizeof(Bf16));
  Index tile = kTileBytes / row_bytes / kTokens * kTokens;
  if (tile < kTokens) tile = kTokens;
  for (Index t0 = 0; t0 < m; t0 += tile) {
    const Index tm = m - t0 < tile ? m - t0 : tile;
    for (Index j = n0; j < n1; j += kRows) {
      const int rows = static_cast<int>(n1 - j < kRows ? n1 - j : kRows);
      const Index jn = j + kRows;
      const int next_rows = static_cast<int>(jn >= n1 ? 0 : (n1 - jn < kRows ? n1 - jn : kRows));
      const Bf16* wj = w + j * k;
      const Bf16* next = w + jn * k;
      // Only the first pass over a block of weight rows asks for the next block.
      Index t = 0;
      for (; t + kTokens <= tm; t += kTokens) {
        dot_block<kRows, kTokens>(xb + (t0 + t) * kp, kp, k, wj, rows, out + (t0 + t) * ldo + j,
                                  ldo, next, t == 0 ? next_rows : 0);
      }
      if (t < tm) {
        dot_block_tail<kRows, kTokens - 1>(static_cast<int>(tm - t), xb + (t0 + t) * kp, kp, k, wj,
                                           rows, out + (t0 + t) * ldo + j, ldo, next,
                                           t == 0 ? next_rows : 0);
      }
    }
  }
}

}  // namespace

namespace promptcache::kernels {
const RoundBf16Fn round_bf16_avx512bf16 = &round_bf16_rows;
const LinearRowsBf16DotFn linear_rows_bf16_dot_avx512bf16 = &linear_rows_bf16_dot;
}  // namespace promptcache::kernels
#else
namespace promptcache::kernels {
const RoundBf16Fn round_bf16_avx512bf16 = nullptr;
const LinearRowsBf16DotFn linear_rows_bf16_dot_avx512bf16 = nullptr;
}  // namespace promptcache::kernels
#endif
