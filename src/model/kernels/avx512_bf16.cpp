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
}  // namespace

#include "avx512_vec.inl"

#include "lane_softmax.inl"

namespace {
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

// ---- Attention over bf16 keys and values with vdpbf16ps (attend_rows_bf16) ----
// The lane layout of attention_kernel.inl's lane_rows (a chunk of up to 48 query rows along the
// vector lanes, scores st[j][r] in f32, the same lane_softmax), with both products done by
// vdpbf16ps on the stored bf16 values instead of f32 FMAs on keys and values first converted to
// f32 a block at a time: each instruction takes a pair of adjacent elements per lane.
//   scores  lane r holds (q[r][i], q[r][i+1]) as a high and a low bf16 pair (x = high + low
//           to 2^-16 of x; the query rounded to bf16 alone, as the linear kernel rounds its x,
//           moved the contract suites' logits past their bound); the key pair (k[j][i],
//           k[j][i+1]) is one 32-bit broadcast from the stored row.
//   values  lane r holds the softmax numerators (p[j][r], p[j+1][r]) as a high and a low bf16
//           pair (the scale 1 / sum stays f32); the value pair (v[j][c], v[j+1][c]) is
//           broadcast from a block of values interleaved two rows at a time (pair_values), 64
//           slots at a time.
// Every lane sums its own row's products in one order whatever the other rows of the call, so a
// row's output does not depend on them. Slots pair up within a run; a run's odd last slot pairs
// with a zero weight and zero values.
using promptcache::kernels::AttendArgs;
using promptcache::kernels::AttendSegment;
using promptcache::kernels::kAttendWidenSlots;
// Keys (scores) or value columns (values) per block: 8 x 3 row vectors = 24 accumulators.
constexpr int kAttendJ = 8;

// For a prefetch only: may point past the end of an array (computed as an integer).
inline const void* ahead(const Bf16* p, Index elements) {
  return reinterpret_cast<const void*>(reinterpret_cast<__UINTPTR_TYPE__>(p) +
                                       static_cast<__UINTPTR_TYPE__>(elements) * sizeof(Bf16));
}

// The 32 bits at p (two bf16) in every lane.
inline __m512bh broadcast_pair(const void* p) {
  int bits;
  __builtin_memcpy(&bits, p, sizeof bits);
  return as_bh(_mm512_set1_epi32(bits));
}

// Word r of the result = (element r, element 16 + r) of a vector of 32 bf16: the 16-bit
// indices 2r <- r and 2r + 1 <- 16 + r.
inline __m512i interleave_halves(__m512i v) {
  static const unsigned short kIndex[32] = {0,  16, 1,  17, 2,  18, 3,  19, 4,  20, 5,
                                            21, 6,  22, 7,  23, 8,  24, 9,  25, 10, 26,
                                            11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_permutexvar_epi16(_mm512_loadu_si512(kIndex), v);
}

// x - (x rounded to bf16): the low part of x (x = high + low + under 2^-16 |x|).
inline __m512 below_bf16(__m512 x) {
  const __m256i h = (__m256i)_mm512_cvtneps_pbh(x);
  return _mm512_sub_ps(x, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
}

// Two rows of ld words (ld a multiple of 16) at dst: word c of the first is (a[c], b[c])
// rounded to bf16, of the second their low parts (below_bf16) rounded; b null: zeros.
inline void pair_rows(const float* a, const float* b, float* dst, Index ld) {
  for (Index c = 0; c < ld; c += 16) {
    const __m512 x = _mm512_loadu_ps(a + c);
    const __m512 y = b != nullptr ? _mm512_loadu_ps(b + c) : _mm512_setzero_ps();
    // The low 16 bf16 come from the second operand.
    _mm512_storeu_si512(dst + c, interleave_halves((__m512i)_mm512_cvtne2ps_pbh(y, x)));
    _mm512_storeu_si512(dst + ld + c, interleave_halves((__m512i)_mm512_cvtne2ps_pbh(
                                          below_bf16(y), below_bf16(x))));
  }
}

// The n (<= kAttendWidenSlots) value rows at v (d bf16 each, d a multiple of 16) as (n + 1) / 2
// rows of d words: word c of row jp is (v[2jp][c], v[2jp + 1][c]), zeros past the last row.
inline void pair_values(const Bf16* v, Index n, Index d, float* vp) {
  for (Index j = 0; j < n; j += 2) {
    const Bf16* a = v + j * d;
    for (Index c = 0; c < d; c += 16) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + c));
      const __m256i y = j + 1 < n ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + d + c))
                                  : _mm256_setzero_si256();
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(x), y, 1);
      _mm512_storeu_si512(vp + (j / 2) * d + c, interleave_halves(both));
    }
  }
}

// acc[x][y] += (hi[y] + lo[y]) . (the pair at first + x * stride, in every lane), high part
// first, for X pairs and Y vectors of rows.
template <int X, int Y, class P>
inline void split_products(__m512 (&acc)[X][Y], const __m512bh (&hi)[Y], const __m512bh (&lo)[Y],
                           const P* first, Index stride) {
#pragma GCC unroll 8
  for (int x = 0; x < X; ++x) {
    const __m512bh b = broadcast_pair(first + x * stride);
#pragma GCC unroll 4
    for (int y = 0; y < Y; ++y) {
      acc[x][y] = _mm512_dpbf16_ps(acc[x][y], hi[y], b);
      acc[x][y] = _mm512_dpbf16_ps(acc[x][y], lo[y], b);
    }
  }
}

// st[j][r] = q[r] . k[j] for the J keys at k, q as pairs of its high and low bf16 parts (row
// 2 (i / 2) of qt2: the high parts' pairs (q[r][i], q[r][i + 1]), the next row the low parts');
// asks for the next
// block's keys (L1) and this block's values (L2) meanwhile.
template <int RV, int J>
inline void bf16_scores_block(const float* qt2, Index d, const Bf16* k, const Bf16* v, float* st,
                              Index ld) {
  __m512 acc[J][RV];
#pragma GCC unroll 8
  for (int j = 0; j < J; ++j) {
#pragma GCC unroll 4
    for (int c = 0; c < RV; ++c) acc[j][c] = _mm512_setzero_ps();
  }
  for (Index i = 0; i < d; i += 2) {
    __builtin_prefetch(ahead(k, J * d + i * J), 0, 3);
    __builtin_prefetch(ahead(v, i * J), 0, 2);
    __m512bh hi[RV], lo[RV];
#pragma GCC unroll 4
    for (int c = 0; c < RV; ++c) {
      hi[c] = as_bh(_mm512_loadu_si512(qt2 + i * ld + c * 16));
      lo[c] = as_bh(_mm512_loadu_si512(qt2 + i * ld + ld + c * 16));
    }
    split_products(acc, hi, lo, k + i, d);
  }
#pragma GCC unroll 8
  for (int j = 0; j < J; ++j) {
#pragma GCC unroll 4
    for (int c = 0; c < RV; ++c) _mm512_storeu_ps(st + j * ld + c * 16, acc[j][c]);
  }
}

// The last (fewer than J) keys of a run: the block instantiated for exactly that many.
template <int RV, int J>
inline void bf16_scores_tail(int keys, const float* qt2, Index d, const Bf16* k, const Bf16* v,
                             float* st, Index ld) {
  if constexpr (J > 0) {
    if (keys == J) {
      bf16_scores_block<RV, J>(qt2, d, k, v, st, ld);
    } else {
      bf16_scores_tail<RV, J - 1>(keys, qt2, d, k, v, st, ld);
    }
  }
}

// sums[c][r] += sum over the pairs jp of (p pair of row r) . (v pair of column c), for the C
// columns from c0; pt holds two rows of ld words per pair (pair_rows: high, low parts), vp d
// words per pair.
template <int RV, int C>
inline void bf16_values_block(const float* pt, const float* vp, Index pairs, Index d, Index c0,
                              float* sums, Index ld) {
  __m512 acc[C][RV];
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) {
#pragma GCC unroll 4
    for (int r = 0; r < RV; ++r) acc[c][r] = _mm512_loadu_ps(sums + (c0 + c) * ld + r * 16);
  }
  for (Index jp = 0; jp < pairs; ++jp) {
    __m512bh hi[RV], lo[RV];
#pragma GCC unroll 4
    for (int r = 0; r < RV; ++r) {
      hi[r] = as_bh(_mm512_loadu_si512(pt + 2 * jp * ld + r * 16));
      lo[r] = as_bh(_mm512_loadu_si512(pt + 2 * jp * ld + ld + r * 16));
    }
    split_products(acc, hi, lo, vp + jp * d + c0, 1);
  }
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) {
#pragma GCC unroll 4
    for (int r = 0; r < RV; ++r) _mm512_storeu_ps(sums + (c0 + c) * ld + r * 16, acc[c][r]);
  }
}

// The attention of `rows` (at most RV * 16) query rows starting at row r0. The scratch is laid
// out as attention_kernel.inl's lane_rows lays it out (attend_scratch_floats).
template <int RV>
void bf16_lane_rows(const AttendArgs& a, Index r0, Index rows, float* scratch) {
  constexpr Index ld = RV * 16;
  constexpr int J = kAttendJ;
  const Index d = a.d, slots = a.slots;
  float* qt2 = scratch;           // [d / 2][2][ld] words: pairs of high, then of low parts
  float* st = qt2 + d * ld;       // [slots][ld]; then the weights' pairs, ld words per pair
  float* sums = st + slots * ld;  // [d][ld]; first the queries' high, low parts [ld][d] bf16
  // [kAttendWidenSlots / 2][d] words: a block's values in pairs; then its weights in pairs
  // (pair_rows), [kAttendWidenSlots / 2][2][ld] words.
  float* vp = scratch + promptcache::kernels::attend_scratch_floats(d, slots) -
              kAttendWidenSlots * d - kAttendWidenSlots * promptcache::kernels::kAttendRowChunk;
  float* pp = vp + kAttendWidenSlots / 2 * d;
  // Each query q = high + low + (under 2^-16 |q|), high and low bf16 (round to nearest even):
  // with both multiplied, the scores keep nearly f32's precision (a query rounded to bf16 alone
  // moved bench-small-like scores by up to 2^-9 of sum |q_i k_i|, which the softmax amplifies).
  auto* high = reinterpret_cast<Bf16*>(sums);
  Bf16* low = high + ld * d;
  for (Index r = 0; r < ld; ++r) {  // padding lanes get zero queries (their results are dropped)
    for (Index c = 0; c < d; c += 16) {
      const __m512 q = r < rows ? _mm512_loadu_ps(a.q + (r0 + r) * d + c) : _mm512_setzero_ps();
      const __m256i h = (__m256i)_mm512_cvtneps_pbh(q);
      const __m512 hf = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(high + r * d + c), h);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(low + r * d + c),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_sub_ps(q, hf)));
    }
  }
  for (Index i = 0; i < d; i += 2) {
    for (Index r = 0; r < ld; ++r) {
      __builtin_memcpy(qt2 + i * ld + r, high + r * d + i, 4);
      __builtin_memcpy(qt2 + i * ld + ld + r, low + r * d + i, 4);
    }
  }
  Index first = 0;
  for (Index s = 0; s < a.segment_count; ++s) {
    const AttendSegment& run = a.segments[s];
    const auto* k = static_cast<const Bf16*>(run.k);
    const auto* v = static_cast<const Bf16*>(run.v);
    float* out = st + first * ld;
    Index j = 0;
    for (; j + J <= run.slots; j += J) {
      bf16_scores_block<RV, J>(qt2, d, k + j * d, v + j * d, out + j * ld, ld);
    }
    if (j < run.slots) {
      bf16_scores_tail<RV, J - 1>(static_cast<int>(run.slots - j), qt2, d, k + j * d, v + j * d,
                                  out + j * ld, ld);
    }
    first += run.slots;
  }
  float scale[ld];
  lane_softmax<RV>(a, r0, rows, st, scale);
  for (Index i = 0; i < d * ld; ++i) sums[i] = 0.0f;
  const float* p = st;
  for (Index s = 0; s < a.segment_count; ++s) {
    const AttendSegment& run = a.segments[s];
    const auto* values = static_cast<const Bf16*>(run.v);
    for (Index j0 = 0; j0 < run.slots; j0 += kAttendWidenSlots) {
      const Index n = run.slots - j0 < kAttendWidenSlots ? run.slots - j0 : kAttendWidenSlots;
      pair_values(values + j0 * d, n, d, vp);
      for (Index j = 0; j < n; j += 2) {
        const float* row = p + (j0 + j) * ld;
        pair_rows(row, j + 1 < n ? row + ld : nullptr, pp + j * ld, ld);
      }
      // d is a multiple of 16, so of J: no column tail.
      for (Index c0 = 0; c0 < d; c0 += J) {
        bf16_values_block<RV, J>(pp, vp, (n + 1) / 2, d, c0, sums, ld);
      }
    }
    p += run.slots * ld;
  }
  for (Index r = 0; r < rows; ++r) {
    for (Index c = 0; c < d; ++c) a.out[(r0 + r) * d + c] = sums[c * ld + r] * scale[r];
  }
}

// kernels::attend_rows_bf16_avx512bf16: bf16 keys and values, at least kAttendLaneMinRows rows,
// d a multiple of 16 (cpu_attention.cpp checks all three), in chunks of up to 48 rows.
void attend_rows_bf16(const AttendArgs& a) {
  static_assert(Vec::kWidth == 16 && kAttendWidenSlots % 2 == 0 && 16 % kAttendJ == 0);
  static_assert(3 * 16 <= promptcache::kernels::kAttendRowChunk);
  for (Index r = 0; r < a.rows; r += 48) {
    const Index n = a.rows - r < 48 ? a.rows - r : 48;
    const Index vecs = (n + 15) / 16;
    if (vecs == 3) {
      bf16_lane_rows<3>(a, r, n, a.scratch);
    } else if (vecs == 2) {
      bf16_lane_rows<2>(a, r, n, a.scratch);
    } else {
      bf16_lane_rows<1>(a, r, n, a.scratch);
    }
  }
}

}  // namespace

namespace promptcache::kernels {
const RoundBf16Fn round_bf16_avx512bf16 = &round_bf16_rows;
const LinearRowsBf16DotFn linear_rows_bf16_dot_avx512bf16 = &linear_rows_bf16_dot;
const AttendRowsFn attend_rows_bf16_avx512bf16 = &attend_rows_bf16;
}  // namespace promptcache::kernels
#else
namespace promptcache::kernels {
const RoundBf16Fn round_bf16_avx512bf16 = nullptr;
const LinearRowsBf16DotFn linear_rows_bf16_dot_avx512bf16 = nullptr;
const AttendRowsFn attend_rows_bf16_avx512bf16 = nullptr;
}  // namespace promptcache::kernels
#endif
