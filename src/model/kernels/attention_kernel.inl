// src/model/kernels/attention_kernel.inl — fused attention of a few query rows over one KV
// head's slots, written once for any SIMD width. Included by the per-ISA units after
// linear_kernel.inl (whose linear_rows makes the scores of a decode step's few rows); same rules
// as that file: internal linkage, no standard headers.
//
// A cached request runs a question of a few tokens over thousands of assembled slots. Done with
// library calls, that is per KV head one GEMM for the scores, a mask fill, a softmax and one
// GEMM with V: four passes, and OpenBLAS (pthreads build) ran calls made from two threads at
// once no faster than one after the other. Here one thread takes a KV head and does all of it in
// one call: the scores of up to kAttendRowChunk rows stay in its scratch (L2), the softmax and
// the product with V read them from there, and the threads work on different heads at once.
// On bench-small, 16 tokens over 2064 slots, the attention of all 12 layers went from ~20 ms to
// ~8 ms (two threads, AVX-512), which is about what its multiplies cost at the rate the linear
// kernels reach.

namespace {

// e^x for x <= 0 (or -inf): Cephes' single-precision range reduction and polynomial (within a
// few ulp of expf). Results below e^-87 (1.6e-38, under f32 resolution next to the row's maximum
// term of 1) are flushed to 0, which is also what a masked slot's -inf gives.
inline typename Vec::Reg exp_nonpositive(typename Vec::Reg x) {
  using R = typename Vec::Reg;
  const R limit = Vec::set1(-87.0f);
  const R xc = Vec::max(x, limit);
  const R n = Vec::round(Vec::mul(xc, Vec::set1(1.44269504088896341f)));
  R r = Vec::fma(n, Vec::set1(-0.693359375f), xc);
  r = Vec::fma(n, Vec::set1(2.12194440e-4f), r);
  R p = Vec::set1(1.9875691500e-4f);
  p = Vec::fma(p, r, Vec::set1(1.3981999507e-3f));
  p = Vec::fma(p, r, Vec::set1(8.3334519073e-3f));
  p = Vec::fma(p, r, Vec::set1(4.1665795894e-2f));
  p = Vec::fma(p, r, Vec::set1(1.6666665459e-1f));
  p = Vec::fma(p, r, Vec::set1(5.0000001201e-1f));
  p = Vec::fma(p, Vec::mul(r, r), Vec::add(r, Vec::set1(1.0f)));
  return Vec::zero_below(x, limit, Vec::scale2(p, n));
}

// Softmax numerators of one row of scores in place: e^(s - max) with closed slots at 0. Returns
// the row's sum, 0 when it sees no slot.
inline float softmax_numerators(float* s, Index slots, const bool* mask_row, Index open) {
  constexpr float kNegInf = -__builtin_inff();
  if (mask_row != nullptr) {
    for (Index j = open; j < slots; ++j) {
      if (!mask_row[j]) s[j] = kNegInf;
    }
  }
  typename Vec::Reg mv = Vec::set1(kNegInf);
  Index j = 0;
  for (; j + Vec::kWidth <= slots; j += Vec::kWidth) mv = Vec::max(mv, Vec::load(s + j));
  float m = Vec::reduce_max(mv);
  for (; j < slots; ++j) m = s[j] > m ? s[j] : m;
  if (m == kNegInf) {  // sees nothing: zero weights, so the product with V gives zeros
    for (j = 0; j < slots; ++j) s[j] = 0.0f;
    return 0.0f;
  }
  const typename Vec::Reg mb = Vec::set1(m);
  typename Vec::Reg sv = Vec::zero();
  for (j = 0; j + Vec::kWidth <= slots; j += Vec::kWidth) {
    const typename Vec::Reg e = exp_nonpositive(Vec::sub(Vec::load(s + j), mb));
    Vec::store(s + j, e);
    sv = Vec::add(sv, e);
  }
  if (j < slots) {
    const int left = static_cast<int>(slots - j);
    // Padding lanes load as 0 and would give e^(0 - m); they are masked out of the sum.
    const typename Vec::Reg e = exp_nonpositive(Vec::sub(Vec::load_first(s + j, left), mb));
    Vec::store_first(s + j, left, e);
    sv = Vec::add(sv, Vec::keep_first(e, left));
  }
  return Vec::sum(sv);
}

using Segment = promptcache::kernels::AttendSegment;

// out[r, c0 .. c0 + C * kWidth) = scale[r] * sum_j p[r, j] * v[j, c0 ..] for R rows, j running
// over the slots of every run in turn.
template <int R, int C>
inline void weighted_values(const float* p, Index ldp, const Segment* segs, Index nseg, Index d,
                            Index c0, const float* scale, float* out) {
  typename Vec::Reg acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = Vec::zero();
  }
  for (Index s = 0; s < nseg; ++s) {
    const float* v = segs[s].v;
    for (Index j = 0; j < segs[s].slots; ++j) {
      typename Vec::Reg vv[C];
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) vv[c] = Vec::load(v + j * d + c0 + c * Vec::kWidth);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const typename Vec::Reg b = Vec::set1(p[r * ldp + j]);
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) acc[r][c] = Vec::fma(vv[c], b, acc[r][c]);
      }
    }
    p += segs[s].slots;
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const typename Vec::Reg sc = Vec::set1(scale[r]);
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      Vec::store(out + r * d + c0 + c * Vec::kWidth, Vec::mul(acc[r][c], sc));
    }
  }
}

// The last (fewer than kValueCols) vectors of a row: picks the block instantiated for exactly
// that many.
template <int R, int C>
inline void weighted_values_cols(int cols, const float* p, Index ldp, const Segment* segs,
                                 Index nseg, Index d, Index c0, const float* scale, float* out) {
  if constexpr (C > 0) {
    if (cols == C) {
      weighted_values<R, C>(p, ldp, segs, nseg, d, c0, scale, out);
    } else {
      weighted_values_cols<R, C - 1>(cols, p, ldp, segs, nseg, d, c0, scale, out);
    }
  }
}

template <int R>
inline void weighted_values_rows(const float* p, Index ldp, const Segment* segs, Index nseg,
                                 Index d, const float* scale, float* out) {
  constexpr Index kSpan = Vec::kValueCols * Vec::kWidth;
  Index c0 = 0;
  for (; c0 + kSpan <= d; c0 += kSpan) {
    weighted_values<R, Vec::kValueCols>(p, ldp, segs, nseg, d, c0, scale, out);
  }
  if (c0 < d) {
    weighted_values_cols<R, Vec::kValueCols - 1>(static_cast<int>((d - c0) / Vec::kWidth), p, ldp,
                                                 segs, nseg, d, c0, scale, out);
  }
}

template <int R>
inline void weighted_values_row_tail(int rows, const float* p, Index ldp, const Segment* segs,
                                     Index nseg, Index d, const float* scale, float* out) {
  if constexpr (R > 0) {
    if (rows == R) {
      weighted_values_rows<R>(p, ldp, segs, nseg, d, scale, out);
    } else {
      weighted_values_row_tail<R - 1>(rows, p, ldp, segs, nseg, d, scale, out);
    }
  }
}

// Scores of R query rows against a tile of 2 * kWidth keys transposed into kt [d][2 * kWidth]:
// s[r, 0 .. 2 * kWidth) = q[r] . key. The key dimension runs down the vector lanes, so there is
// nothing to reduce across lanes (a dot product per score would end in a horizontal sum, which
// for a 64-wide head costs as much as its multiplies).
template <int R>
inline void tile_scores(const float* q, Index d, const float* kt, float* s, Index lds) {
  constexpr int kTile = 2 * Vec::kWidth;
  typename Vec::Reg acc[R][2];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = Vec::zero();
  for (Index i = 0; i < d; ++i) {
    const typename Vec::Reg a0 = Vec::load(kt + i * kTile);
    const typename Vec::Reg a1 = Vec::load(kt + i * kTile + Vec::kWidth);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const typename Vec::Reg b = Vec::set1(q[r * d + i]);
      acc[r][0] = Vec::fma(a0, b, acc[r][0]);
      acc[r][1] = Vec::fma(a1, b, acc[r][1]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    Vec::store(s + r * lds, acc[r][0]);
    Vec::store(s + r * lds + Vec::kWidth, acc[r][1]);
  }
}

template <int R>
inline void tile_scores_tail(int rows, const float* q, Index d, const float* kt, float* s,
                             Index lds) {
  if constexpr (R > 0) {
    if (rows == R) {
      tile_scores<R>(q, d, kt, s, lds);
    } else {
      tile_scores_tail<R - 1>(rows, q, d, kt, s, lds);
    }
  }
}

// scores[r, j] = q[r] . k[j] for `rows` rows and every slot of one run, tile by tile. Whole
// tiles are stored: up to a tile's width of columns past `slots` get zero keys' scores (the
// score stride leaves room for them).
inline void all_scores(const float* q, Index rows, Index d, const float* k, Index slots, float* kt,
                       float* scores, Index lds) {
  constexpr int kTile = 2 * Vec::kWidth;
  for (Index j0 = 0; j0 < slots; j0 += kTile) {
    const Index cols = slots - j0 < kTile ? slots - j0 : kTile;
    // The next tile's keys are asked for now; they arrive while this tile's scores are made.
    if (j0 + 2 * kTile <= slots) {
      const char* next = reinterpret_cast<const char*>(k + (j0 + kTile) * d);
      for (Index byte = 0; byte < kTile * d * 4; byte += 64) __builtin_prefetch(next + byte, 0, 3);
    }
    if (cols == kTile) {
      // Square blocks of kWidth keys x kWidth dims, transposed in registers.
      for (Index i0 = 0; i0 < d; i0 += Vec::kWidth) {
        Vec::transpose(k + j0 * d + i0, d, kt + i0 * kTile, kTile);
        Vec::transpose(k + (j0 + Vec::kWidth) * d + i0, d, kt + i0 * kTile + Vec::kWidth, kTile);
      }
    } else {
      for (Index c = 0; c < cols; ++c) {
        const float* key = k + (j0 + c) * d;
        for (Index i = 0; i < d; ++i) kt[i * kTile + c] = key[i];
      }
      for (Index c = cols; c < kTile; ++c) {
        for (Index i = 0; i < d; ++i) kt[i * kTile + c] = 0.0f;
      }
    }
    Index r = 0;
    for (; r + Vec::kScoreRows <= rows; r += Vec::kScoreRows) {
      tile_scores<Vec::kScoreRows>(q + r * d, d, kt, scores + r * lds + j0, lds);
    }
    if (r < rows) {
      tile_scores_tail<Vec::kScoreRows - 1>(static_cast<int>(rows - r), q + r * d, d, kt,
                                            scores + r * lds + j0, lds);
    }
  }
}

// The entry point each ISA unit exports (signature of kernels::AttendRowsFn). d must be a
// multiple of Vec::kWidth.
void attend_rows(const promptcache::kernels::AttendArgs& a) {
  namespace pk = promptcache::kernels;
  static_assert(2 * Vec::kWidth <= pk::kAttendTile);
  const Index slots = a.slots, d = a.d;
  const Index lds = pk::attend_score_stride(slots);
  float* scores = a.scratch;                          // [chunk, lds]
  float* scale = scores + pk::kAttendRowChunk * lds;  // [chunk]
  float* kt = scale + pk::kAttendRowChunk;            // [d, 2 * kWidth]
  for (Index r0 = 0; r0 < a.rows; r0 += pk::kAttendRowChunk) {
    const Index chunk = a.rows - r0 < pk::kAttendRowChunk ? a.rows - r0 : pk::kAttendRowChunk;
    // Run by run, in slot order: a run's last tile may spill into the next run's columns, which
    // that run then overwrites.
    Index first = 0;
    for (Index s = 0; s < a.segment_count; ++s) {
      const Segment& seg = a.segments[s];
      // Transposing a key tile pays off when many rows use it; a decode step's few rows take
      // dot products instead.
      if (chunk >= pk::kAttendTileMinRows) {
        all_scores(a.q + r0 * d, chunk, d, seg.k, seg.slots, kt, scores + first, lds);
      } else {
        linear_rows(a.q + r0 * d, chunk, d, seg.k, 0, seg.slots, scores + first, lds);
      }
      first += seg.slots;
    }
    for (Index r = 0; r < chunk; ++r) {
      const Index token = (r0 + r) % a.tokens;
      const bool* mask_row = a.mask == nullptr ? nullptr : a.mask + token * a.mask_ld;
      const float sum = softmax_numerators(scores + r * lds, slots, mask_row, a.open);
      scale[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
    }
    Index r = 0;
    for (; r + Vec::kValueRows <= chunk; r += Vec::kValueRows) {
      weighted_values_rows<Vec::kValueRows>(scores + r * lds, lds, a.segments, a.segment_count, d,
                                            scale + r, a.out + (r0 + r) * d);
    }
    if (r < chunk) {
      weighted_values_row_tail<Vec::kValueRows - 1>(static_cast<int>(chunk - r), scores + r * lds,
                                                    lds, a.segments, a.segment_count, d, scale + r,
                                                    a.out + (r0 + r) * d);
    }
  }
}

}  // namespace
