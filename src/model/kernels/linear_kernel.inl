// src/model/kernels/linear_kernel.inl — the small-row linear kernel, written once for any
// SIMD width. Included only by the per-ISA translation units (linear_avx2.cpp,
// avx512.cpp), each of which defines `Vec` for its instruction set and is compiled with
// that instruction set enabled.
//
// out[t, j] = sum_i x[t, i] * w[j, i] for a few rows t of x (fresh tokens, one decode token) and
// the weight rows j in [n0, n1). Up to 12 rows, each block keeps kRows weight rows and kTokens
// token rows of partial sums in registers, so a weight row is read from memory once and reused
// from L1 for every token group; from 13 rows on, the tokens run along the vector lanes
// (lane_linear below). No packing: the weights are streamed in their stored layout, which is
// what makes this faster than a general GEMM when there are only a few rows (a GEMM packs the
// whole weight matrix on every call).
//
// Everything here has internal linkage and the file includes no standard headers, so no
// inline function compiled for this ISA can be merged with a generic copy by the linker.

namespace {

using Index = long long;
// Prefetches go to L2 (locality 2): the next block's rows plus the current block's and the
// token rows can exceed L1 for wide rows (k = 2048 floats is 8 KiB a row).
constexpr int kPrefetchLocality = 2;

// The address `floats` floats past p, for a prefetch only: computed as an integer, since it may
// lie past the end of the array (a request there is dropped, and the loop stays branch-free).
inline const void* prefetch_address(const float* p, Index floats) {
  return reinterpret_cast<const void*>(reinterpret_cast<__UINTPTR_TYPE__>(p) +
                                       static_cast<__UINTPTR_TYPE__>(floats) * sizeof(float));
}

// Prefetching: while a block multiplies its weight rows it asks for rows of the next block
// (`next`): those whose index has its bit set in `prefetch_rows`. With several token groups per
// block, linear_rows spreads the next block's rows over the groups' passes, so memory keeps
// streaming while the later passes reuse the current rows from L1. Without it the weight GEMMs
// of a 16-token forward over bench-small took 24 ms instead of 19 (the same calls with the
// weights in cache: 13 ms); the hardware prefetcher alone does not run far enough ahead.
template <int R, int T>
inline void linear_block(const float* x, Index k, const float* w, int rows, float* out, Index ldo,
                         const float* next, unsigned prefetch_rows) {
  typename Vec::Reg acc[R][T];
  const float* wr[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) wr[r] = w + (r < rows ? r : 0) * k;  // spare rows redo row 0
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t] = Vec::zero();
  }
  Index i = 0;
  for (; i + Vec::kWidth <= k; i += Vec::kWidth) {
    typename Vec::Reg a[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      if ((prefetch_rows >> r) & 1u) __builtin_prefetch(next + r * k + i, 0, kPrefetchLocality);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) a[r] = Vec::load(wr[r] + i);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const typename Vec::Reg xv = Vec::load(x + t * k + i);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][t] = Vec::fma(a[r], xv, acc[r][t]);
    }
  }
  if (i < k) {
    const int left = static_cast<int>(k - i);
    typename Vec::Reg a[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) a[r] = Vec::load_first(wr[r] + i, left);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const typename Vec::Reg xv = Vec::load_first(x + t * k + i, left);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][t] = Vec::fma(a[r], xv, acc[r][t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < rows; ++r) out[t * ldo + r] = Vec::sum(acc[r][t]);
  }
}

// The last (fewer than kTokens) token rows: picks the block instantiated for exactly that many.
template <int T>
inline void linear_block_tail(int tokens, const float* x, Index k, const float* w, int rows,
                              float* out, Index ldo, const float* next, unsigned prefetch_rows) {
  if constexpr (T > 0) {
    if (tokens == T) {
      linear_block<Vec::kRows, T>(x, k, w, rows, out, ldo, next, prefetch_rows);
    } else {
      linear_block_tail<T - 1>(tokens, x, k, w, rows, out, ldo, next, prefetch_rows);
    }
  }
}

// ---- Tokens along the lanes (kLinearLaneMinRows rows of x and more) ----
// x is transposed once per call into xt [k][tv * kWidth] (tokens padded with zeros), and each
// weight element is broadcast against a vector of tokens: no sums across lanes at the end, and
// every weight row is still read once per block of J rows. With 16 tokens (a question) the
// 12 layers' linears of bench-small take 14.7-15.2 ms against 18.5-18.8 with the blocks above,
// with 64 tokens 44-49 against 57 ms (docs/benchmarks.md).

// The lines a block of rows reads next are asked for one row per step, staggered (row r at steps
// r, r + kWidth, ...), never all at once: every row crosses into a new line at the same step, and
// 12 rows' misses at once, plus as many requests for the next block, stalled the loads. Each
// step asks for (to L1) its row's line kLaneAheadFloats ahead and, when `next` is set, (to L2)
// the same line of the next block's row. With 16 tokens the 12 layers' linears of bench-small
// took 14.7-15.2 ms this way against 16.7-16.9 with both requested for all rows every kWidth steps.
constexpr Index kLaneAheadFloats = 64;

// sums[j][t] = sum_i w[j][i] * xt[i][t] for J weight rows and TV vectors of tokens; `ahead`
// asks for the rows' next lines (the first pass over a block), `next` is the next block's first
// row or null.
template <int TV, int J>
inline void lane_linear_block(const float* xt, Index ldx, Index k, const float* w, float* sums,
                              bool ahead, const float* next) {
  typename Vec::Reg acc[J][TV];
#pragma GCC unroll 32
  for (int j = 0; j < J; ++j) {
#pragma GCC unroll 4
    for (int t = 0; t < TV; ++t) acc[j][t] = Vec::zero();
  }
  for (Index i = 0; i < k; ++i) {
    if (ahead) {
      const int step = static_cast<int>(i % Vec::kWidth);
      const Index line = i - step;
      for (int j = step; j < J; j += Vec::kWidth) {
        __builtin_prefetch(prefetch_address(w, j * k + line + kLaneAheadFloats), 0, 3);
        if (next != nullptr) {
          __builtin_prefetch(prefetch_address(next, j * k + line), 0, kPrefetchLocality);
        }
      }
    }
    typename Vec::Reg xv[TV];
#pragma GCC unroll 4
    for (int t = 0; t < TV; ++t) xv[t] = Vec::load(xt + i * ldx + t * Vec::kWidth);
#pragma GCC unroll 32
    for (int j = 0; j < J; ++j) {
      const typename Vec::Reg b = Vec::set1(w[j * k + i]);
#pragma GCC unroll 4
      for (int t = 0; t < TV; ++t) acc[j][t] = Vec::fma(b, xv[t], acc[j][t]);
    }
  }
#pragma GCC unroll 32
  for (int j = 0; j < J; ++j) {
#pragma GCC unroll 4
    for (int t = 0; t < TV; ++t)
      Vec::store(sums + j * (TV * Vec::kWidth) + t * Vec::kWidth, acc[j][t]);
  }
}

template <int TV, int J>
inline void lane_linear_tail(int rows, const float* xt, Index ldx, Index k, const float* w,
                             float* sums, bool ahead, const float* next) {
  if constexpr (J > 0) {
    if (rows == J) {
      lane_linear_block<TV, J>(xt, ldx, k, w, sums, ahead, next);
    } else {
      lane_linear_tail<TV, J - 1>(rows, xt, ldx, k, w, sums, ahead, next);
    }
  }
}

// Weight rows [n0, n1), J at a time; each block of rows meets the tokens in passes of up to
// kLinearLaneVecs vectors while its rows are in L1, and the first pass asks for the next block.
template <int J>
inline void lane_linear_blocks(const float* xt, Index ldx, Index m, Index k, const float* w,
                               Index n0, Index n1, float* out, Index ldo) {
  static_assert(Vec::kLinearLaneVecs == 2);
  constexpr Index kPassTokens = Vec::kLinearLaneVecs * Vec::kWidth;
  float sums[J * kPassTokens];
  for (Index j = n0; j < n1; j += J) {
    const int rows = static_cast<int>(n1 - j < J ? n1 - j : J);
    const float* wj = w + j * k;
    for (Index t0 = 0; t0 < m; t0 += kPassTokens) {
      const Index tokens = m - t0 < kPassTokens ? m - t0 : kPassTokens;
      const float* next = t0 == 0 && j + J < n1 ? w + (j + J) * k : nullptr;
      const Index width = tokens > Vec::kWidth ? 2 * Vec::kWidth : Vec::kWidth;
      if (width > Vec::kWidth) {
        lane_linear_tail<2, J>(rows, xt + t0, ldx, k, wj, sums, t0 == 0, next);
      } else {
        lane_linear_tail<1, J>(rows, xt + t0, ldx, k, wj, sums, t0 == 0, next);
      }
      for (Index t = 0; t < tokens; ++t) {
        for (int r = 0; r < rows; ++r) out[(t0 + t) * ldo + j + r] = sums[r * width + t];
      }
    }
  }
}

// All m rows of x, transposed first into xt.
inline void lane_linear(const float* x, Index m, Index k, const float* w, Index n0, Index n1,
                        float* out, Index ldo, float* xt) {
  const Index ldx = (m + Vec::kWidth - 1) / Vec::kWidth * Vec::kWidth;
  for (Index i = 0; i < k; ++i) {
    for (Index t = 0; t < ldx; ++t) xt[i * ldx + t] = t < m ? x[t * k + i] : 0.0f;
  }
  // As many weight rows per block as the accumulators allow for the widest pass.
  if (ldx > Vec::kWidth) {
    lane_linear_blocks<Vec::kLinearLaneAcc / 2>(xt, ldx, m, k, w, n0, n1, out, ldo);
  } else {
    lane_linear_blocks<Vec::kLinearLaneAcc>(xt, ldx, m, k, w, n0, n1, out, ldo);
  }
}

// The entry point each ISA unit exports (signature of kernels::LinearRowsFn).
void linear_rows(const float* x, Index m, Index k, const float* w, Index n0, Index n1, float* out,
                 Index ldo, float* xt) {
  if (xt != nullptr && m >= promptcache::kernels::kLinearLaneMinRows) {
    lane_linear(x, m, k, w, n0, n1, out, ldo, xt);
    return;
  }
  const int passes = static_cast<int>((m + Vec::kTokens - 1) / Vec::kTokens);
  for (Index j = n0; j < n1; j += Vec::kRows) {
    const int rows = static_cast<int>(n1 - j < Vec::kRows ? n1 - j : Vec::kRows);
    const Index jn = j + Vec::kRows;
    const int next_rows =
        static_cast<int>(jn >= n1 ? 0 : (n1 - jn < Vec::kRows ? n1 - jn : Vec::kRows));
    const float* next = w + jn * k;
    // Pass p prefetches the next block's rows r with r % passes == p.
    auto prefetch_rows = [&](int pass) {
      unsigned bits = 0;
      for (int r = pass; r < next_rows; r += passes) bits |= 1u << r;
      return bits;
    };
    Index t = 0;
    int pass = 0;
    for (; t + Vec::kTokens <= m; t += Vec::kTokens, ++pass) {
      linear_block<Vec::kRows, Vec::kTokens>(x + t * k, k, w + j * k, rows, out + t * ldo + j, ldo,
                                             next, prefetch_rows(pass));
    }
    if (t < m) {
      linear_block_tail<Vec::kTokens - 1>(static_cast<int>(m - t), x + t * k, k, w + j * k, rows,
                                          out + t * ldo + j, ldo, next, prefetch_rows(pass));
    }
  }
}

}  // namespace
