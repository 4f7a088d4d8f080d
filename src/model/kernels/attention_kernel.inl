// src/model/kernels/attention_kernel.inl — fused attention of a few query rows over one KV
// head's slots, written once for any SIMD width. Included by the per-ISA units after
// linear_kernel.inl (whose linear_rows makes the scores of a decode step's few rows); same rules
// as that file: internal linkage, no standard headers.
//
// A cached request runs a question of a few tokens over thousands of assembled slots. Done with
// library calls, that is per KV head one GEMM for the scores, a mask fill, a softmax and one
// GEMM with V: four passes, and OpenBLAS (pthreads build) ran calls made from two threads at
// once no faster than one after the other. Here one thread takes a KV head and does all of it in
// one call: the scores of a chunk of rows stay in its scratch (L2), the softmax and the product
// with V read them from there, and the threads work on different heads at once. The query rows
// run along the vector lanes (lane_rows below): on bench-small, 16 tokens over 2064 slots, the
// attention of all 12 layers takes ~5.5 ms on two AVX-512 threads, where library calls took
// ~20 ms and key tiles transposed in registers ~8 ms (docs/benchmarks-history.md).

#include "lane_softmax.inl"

namespace {

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

// A run's keys and values as elements of the call's type T: float, or Bf16/F16 (linear_kernel.inl's
// Vec::load converts those to f32 registers; blocks of them are converted into the scratch with
// convert_rows where the f32 code reads single elements).
template <class T>
inline const T* keys_of(const Segment& s) {
  return static_cast<const T*>(s.k);
}
template <class T>
inline const T* values_of(const Segment& s) {
  return static_cast<const T*>(s.v);
}
template <class T>
constexpr bool kF32Kv = sizeof(T) == sizeof(float);

// out[r, c0 .. c0 + C * kWidth) = scale[r] * sum_j p[r, j] * v[j, c0 ..] for R rows, j running
// over the slots of every run in turn.
template <class T, int R, int C>
inline void weighted_values(const float* p, Index ldp, const Segment* segs, Index nseg, Index d,
                            Index c0, const float* scale, float* out) {
  typename Vec::Reg acc[R][C];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = Vec::zero();
  }
  for (Index s = 0; s < nseg; ++s) {
    const T* v = values_of<T>(segs[s]);
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
template <class T, int R, int C>
inline void weighted_values_cols(int cols, const float* p, Index ldp, const Segment* segs,
                                 Index nseg, Index d, Index c0, const float* scale, float* out) {
  if constexpr (C > 0) {
    if (cols == C) {
      weighted_values<T, R, C>(p, ldp, segs, nseg, d, c0, scale, out);
    } else {
      weighted_values_cols<T, R, C - 1>(cols, p, ldp, segs, nseg, d, c0, scale, out);
    }
  }
}

template <class T, int R>
inline void weighted_values_rows(const float* p, Index ldp, const Segment* segs, Index nseg,
                                 Index d, const float* scale, float* out) {
  constexpr Index kSpan = Vec::kValueCols * Vec::kWidth;
  Index c0 = 0;
  for (; c0 + kSpan <= d; c0 += kSpan) {
    weighted_values<T, R, Vec::kValueCols>(p, ldp, segs, nseg, d, c0, scale, out);
  }
  if (c0 < d) {
    weighted_values_cols<T, R, Vec::kValueCols - 1>(static_cast<int>((d - c0) / Vec::kWidth), p,
                                                    ldp, segs, nseg, d, c0, scale, out);
  }
}

template <class T, int R>
inline void weighted_values_row_tail(int rows, const float* p, Index ldp, const Segment* segs,
                                     Index nseg, Index d, const float* scale, float* out) {
  if constexpr (R > 0) {
    if (rows == R) {
      weighted_values_rows<T, R>(p, ldp, segs, nseg, d, scale, out);
    } else {
      weighted_values_row_tail<T, R - 1>(rows, p, ldp, segs, nseg, d, scale, out);
    }
  }
}

// ---- Query rows along the lanes (kAttendLaneMinRows rows and more) ----
// A chunk of up to Vec::kLaneRowVecs * kWidth query rows is laid out with its rows running along
// the vector lanes: the queries transposed, qt[i][r], and the scores st[j][r]. Keys and values are
// then read in their stored rows and broadcast one element at a time, so nothing is transposed per
// key tile and the softmax's maximum and sum are lane-wise. Each block keeps kLaneAcc
// accumulators: RV row vectors times J keys (scores) or J value columns (output).

// The product is lane_linear_block's (linear_kernel.inl) with the keys as weight rows; only what
// each step asks for differs. One block shared by both, with the requests passed in, measured 35%
// slower on the 16-token linears (the compiler kept fewer row pointers in registers), so each
// keeps its own.
//
// st[j][r] = q[r] . k[j] for the J keys of one block; while it runs, it asks for the next block's
// keys (to L1, needed next) and its own block's values (to L2, needed after the softmax): both
// stream in while the multiplies run, instead of stalling the product with V later.
template <int RV, int J>
inline void lane_scores_block(const float* qt, Index d, const float* k, const float* v, float* st,
                              Index ld) {
  typename Vec::Reg acc[J][RV];
#pragma GCC unroll 32
  for (int j = 0; j < J; ++j) {
#pragma GCC unroll 4
    for (int c = 0; c < RV; ++c) acc[j][c] = Vec::zero();
  }
  // A block's keys (or values) are J * d floats: d steps of J floats cover the next block's (past
  // a run's last block, whatever follows it: prefetch_address never faults).
  for (Index i = 0; i < d; ++i) {
    __builtin_prefetch(prefetch_address(k, J * d + i * J), 0, 3);
    __builtin_prefetch(prefetch_address(v, i * J), 0, 2);
    typename Vec::Reg qv[RV];
#pragma GCC unroll 4
    for (int c = 0; c < RV; ++c) qv[c] = Vec::load(qt + i * ld + c * Vec::kWidth);
#pragma GCC unroll 32
    for (int j = 0; j < J; ++j) {
      const typename Vec::Reg b = Vec::set1(k[j * d + i]);
#pragma GCC unroll 4
      for (int c = 0; c < RV; ++c) acc[j][c] = Vec::fma(qv[c], b, acc[j][c]);
    }
  }
#pragma GCC unroll 32
  for (int j = 0; j < J; ++j) {
#pragma GCC unroll 4
    for (int c = 0; c < RV; ++c) Vec::store(st + j * ld + c * Vec::kWidth, acc[j][c]);
  }
}

// The last (fewer than J) keys of a run: picks the block instantiated for exactly that many.
template <int RV, int J>
inline void lane_scores_tail(int keys, const float* qt, Index d, const float* k, const float* v,
                             float* st, Index ld) {
  if constexpr (J > 0) {
    if (keys == J) {
      lane_scores_block<RV, J>(qt, d, k, v, st, ld);
    } else {
      lane_scores_tail<RV, J - 1>(keys, qt, d, k, v, st, ld);
    }
  }
}

// The scores of one run of slots. bf16/f16 keys are converted a block at a time into `widen`
// (kAttendWidenSlots x d floats) first: the block then reads single f32 elements as it does
// for f32 keys (its prefetches then go to the converted block, which convert_rows's own
// prefetches have already brought in).
template <int RV, class T>
inline void lane_scores(const float* qt, Index d, const Segment& run, float* st, Index ld,
                        float* widen) {
  constexpr int J = Vec::kLaneAcc / RV;
  static_assert(J <= promptcache::kernels::kAttendWidenSlots);
  const T* k = keys_of<T>(run);
  const T* v = values_of<T>(run);
  Index j = 0;
  for (; j + J <= run.slots; j += J) {
    if constexpr (kF32Kv<T>) {
      lane_scores_block<RV, J>(qt, d, k + j * d, v + j * d, st + j * ld, ld);
    } else {
      convert_rows(k + j * d, J * d, widen);
      lane_scores_block<RV, J>(qt, d, widen, widen, st + j * ld, ld);
    }
  }
  if (j < run.slots) {
    const int keys = static_cast<int>(run.slots - j);
    if constexpr (kF32Kv<T>) {
      lane_scores_tail<RV, J - 1>(keys, qt, d, k + j * d, v + j * d, st + j * ld, ld);
    } else {
      convert_rows(k + j * d, keys * d, widen);
      lane_scores_tail<RV, J - 1>(keys, qt, d, widen, widen, st + j * ld, ld);
    }
  }
}

// acc[c][r] += sum_j p[j][r] * v[j][c0 + c] over `n` slots, for C columns; the sums live in
// sums[c][r] between calls.
template <int RV, int C>
inline void lane_values_block(const float* p, const float* v, Index n, Index d, Index c0,
                              float* sums, Index ld) {
  typename Vec::Reg acc[C][RV];
#pragma GCC unroll 32
  for (int c = 0; c < C; ++c) {
#pragma GCC unroll 4
    for (int r = 0; r < RV; ++r) acc[c][r] = Vec::load(sums + (c0 + c) * ld + r * Vec::kWidth);
  }
  for (Index j = 0; j < n; ++j) {
    typename Vec::Reg pv[RV];
#pragma GCC unroll 4
    for (int r = 0; r < RV; ++r) pv[r] = Vec::load(p + j * ld + r * Vec::kWidth);
#pragma GCC unroll 32
    for (int c = 0; c < C; ++c) {
      const typename Vec::Reg b = Vec::set1(v[j * d + c0 + c]);
#pragma GCC unroll 4
      for (int r = 0; r < RV; ++r) acc[c][r] = Vec::fma(pv[r], b, acc[c][r]);
    }
  }
#pragma GCC unroll 32
  for (int c = 0; c < C; ++c) {
#pragma GCC unroll 4
    for (int r = 0; r < RV; ++r) Vec::store(sums + (c0 + c) * ld + r * Vec::kWidth, acc[c][r]);
  }
}

template <int RV, int C>
inline void lane_values_tail(int cols, const float* p, const float* v, Index n, Index d, Index c0,
                             float* sums, Index ld) {
  if constexpr (C > 0) {
    if (cols == C) {
      lane_values_block<RV, C>(p, v, n, d, c0, sums, ld);
    } else {
      lane_values_tail<RV, C - 1>(cols, p, v, n, d, c0, sums, ld);
    }
  }
}

// The attention of `rows` (at most RV * kWidth) query rows starting at row r0.
template <int RV, class T>
inline void lane_rows(const promptcache::kernels::AttendArgs& a, Index r0, Index rows,
                      float* scratch) {
  constexpr Index ld = RV * Vec::kWidth;
  constexpr int J = Vec::kLaneAcc / RV;
  const Index d = a.d, slots = a.slots;
  float* qt = scratch;            // [d][ld]
  float* st = qt + d * ld;        // [slots][ld]
  float* sums = st + slots * ld;  // [d][ld]
  // [kAttendWidenSlots][d]: bf16/f16 keys or values converted (after everything the chunk uses).
  float* widen = scratch + promptcache::kernels::attend_scratch_floats(d, slots) -
                 promptcache::kernels::kAttendWidenSlots * d;
  for (Index i = 0; i < d; ++i) {  // padding lanes get zero queries (their results are dropped)
    for (Index r = 0; r < ld; ++r) qt[i * ld + r] = r < rows ? a.q[(r0 + r) * d + i] : 0.0f;
  }
  Index first = 0;
  for (Index s = 0; s < a.segment_count; ++s) {
    lane_scores<RV, T>(qt, d, a.segments[s], st + first * ld, ld, widen);
    first += a.segments[s].slots;
  }
  float scale[ld];
  lane_softmax<RV>(a, r0, rows, st, scale);
  // The product with V, a block of kLaneValueSlots slots at a time: that block's values and
  // weights stay in L1 while every column block uses them.
  for (Index i = 0; i < d * ld; ++i) sums[i] = 0.0f;
  const float* p = st;
  for (Index s = 0; s < a.segment_count; ++s) {
    const Segment& run = a.segments[s];
    const T* values = values_of<T>(run);
    for (Index j0 = 0; j0 < run.slots; j0 += Vec::kLaneValueSlots) {
      const Index n = run.slots - j0 < Vec::kLaneValueSlots ? run.slots - j0 : Vec::kLaneValueSlots;
      const float* v = nullptr;
      if constexpr (kF32Kv<T>) {
        v = values + j0 * d;
      } else {
        convert_rows(values + j0 * d, n * d, widen);
        v = widen;
      }
      Index c0 = 0;
      for (; c0 + J <= d; c0 += J) lane_values_block<RV, J>(p + j0 * ld, v, n, d, c0, sums, ld);
      if (c0 < d) {
        lane_values_tail<RV, J - 1>(static_cast<int>(d - c0), p + j0 * ld, v, n, d, c0, sums, ld);
      }
    }
    p += run.slots * ld;
  }
  for (Index r = 0; r < rows; ++r) {
    for (Index c = 0; c < d; ++c) a.out[(r0 + r) * d + c] = sums[c * ld + r] * scale[r];
  }
}

// Rows along the lanes, in chunks of up to kLaneRowVecs vectors of rows.
template <class T>
inline void attend_rows_in_lanes(const promptcache::kernels::AttendArgs& a, Index r0, Index rows) {
  constexpr Index kChunk = Vec::kLaneRowVecs * Vec::kWidth;
  for (Index r = r0; r < r0 + rows; r += kChunk) {
    const Index n = r0 + rows - r < kChunk ? r0 + rows - r : kChunk;
    const Index vecs = (n + Vec::kWidth - 1) / Vec::kWidth;
    if (vecs >= 3) {
      lane_rows<3, T>(a, r, n, a.scratch);
    } else if (vecs == 2) {
      lane_rows<2, T>(a, r, n, a.scratch);
    } else {
      lane_rows<1, T>(a, r, n, a.scratch);
    }
  }
}

// The attention with keys and values of type T (float, Bf16 or F16).
template <class T>
void attend_rows_of(const promptcache::kernels::AttendArgs& a) {
  namespace pk = promptcache::kernels;
  static_assert(Vec::kLaneRowVecs * Vec::kWidth <= pk::kAttendRowChunk);
  static_assert(Vec::kLaneRowVecs <= 3);
  static_assert(Vec::kLaneValueSlots <= pk::kAttendWidenSlots);
  const Index slots = a.slots, d = a.d;
  if (a.rows >= pk::kAttendLaneMinRows) {
    attend_rows_in_lanes<T>(a, 0, a.rows);
    return;
  }
  // A decode step's few rows: dot products for the scores (linear_rows), row by row.
  const Index lds = slots;
  float* scores = a.scratch;                          // [rows, slots]
  float* scale = scores + pk::kAttendRowChunk * lds;  // [rows]
  const Index rows = a.rows;
  Index first = 0;
  for (Index s = 0; s < a.segment_count; ++s) {
    const Segment& seg = a.segments[s];
    linear_rows_of<T>(a.q, rows, d, keys_of<T>(seg), 0, seg.slots, scores + first, lds, nullptr);
    first += seg.slots;
  }
  for (Index r = 0; r < rows; ++r) {
    if (a.slopes != nullptr) {  // ALiBi: the row's slope times each key's distance from it
      const float slope = a.slopes[r / a.tokens], query = a.query_pos[r % a.tokens];
      float* row = scores + r * lds;
      for (Index j = 0; j < slots; ++j) row[j] += slope * (a.key_pos[j] - query);
    }
    const bool* mask_row = a.mask == nullptr ? nullptr : a.mask + (r % a.tokens) * a.mask_ld;
    const float sum = softmax_numerators(scores + r * lds, slots, mask_row, a.open);
    scale[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
  }
  Index r = 0;
  for (; r + Vec::kValueRows <= rows; r += Vec::kValueRows) {
    weighted_values_rows<T, Vec::kValueRows>(scores + r * lds, lds, a.segments, a.segment_count, d,
                                             scale + r, a.out + r * d);
  }
  if (r < rows) {
    weighted_values_row_tail<T, Vec::kValueRows - 1>(static_cast<int>(rows - r), scores + r * lds,
                                                     lds, a.segments, a.segment_count, d, scale + r,
                                                     a.out + r * d);
  }
}

// The entry point each ISA unit exports (signature of kernels::AttendRowsFn). d must be a
// multiple of Vec::kWidth.
void attend_rows(const promptcache::kernels::AttendArgs& a) {
  using promptcache::kernels::KvType;
  switch (a.kv) {
    case KvType::kBf16:
      attend_rows_of<Bf16>(a);
      break;
    case KvType::kF16:
      attend_rows_of<F16>(a);
      break;
    default:
      attend_rows_of<float>(a);
  }
}

}  // namespace
