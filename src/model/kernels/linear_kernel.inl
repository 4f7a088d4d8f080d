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
// The weights W are f32, bf16 or f16 (kernels::Bf16, F16): Vec::load / load_first convert them
// to f32 registers (the lanes, and f16 over several passes, convert a block of rows into the
// scratch first), so one template serves all three and the f32 code is what it was before
// (measured unchanged, benchmarks/bench_linear). The sums are f32 either way: the result is the
// f32 product with the weights converted, which are exact.
//
// Everything here has internal linkage and the file includes no standard headers, so no
// inline function compiled for this ISA can be merged with a generic copy by the linker.

namespace {

using Index = long long;
using promptcache::kernels::Bf16;
using promptcache::kernels::F16;
// Prefetches go to L2 (locality 2): the next block's rows plus the current block's and the
// token rows can exceed L1 for wide rows (k = 2048 floats is 8 KiB a row).
constexpr int kPrefetchLocality = 2;

// The address `elements` elements past p, for a prefetch only: computed as an integer, since it
// may lie past the end of the array (a request there is dropped, and the loop stays branch-free).
template <class W>
inline const void* prefetch_address(const W* p, Index elements) {
  return reinterpret_cast<const void*>(reinterpret_cast<__UINTPTR_TYPE__>(p) +
                                       static_cast<__UINTPTR_TYPE__>(elements) * sizeof(W));
}

// ---- 8-bit weights (kernels::Q8) ----
// A Q8 row is k int8 values then one f16 scale per block of kQ8Block values (q8_row_bytes(k)
// bytes), so rows are not k elements apart as for the other weight types: row_at() finds them.
template <class W>
constexpr bool kIsQ8 = false;
template <>
constexpr bool kIsQ8<Q8> = true;
using promptcache::kernels::kQ8Block;
using promptcache::kernels::q8_row_bytes;

template <class W>
inline const W* row_at(const W* w, Index row, Index k) {
  if constexpr (kIsQ8<W>) {
    return w + row * q8_row_bytes(k);
  } else {
    return w + row * k;
  }
}

// The scale of block `block` of the Q8 row at `row` (k weights).
inline float q8_scale(const Q8* row, Index k, Index block) {
  unsigned short bits;
  __builtin_memcpy(&bits, row + k + 2 * block, sizeof(bits));
  return Vec::half_to_float(bits);
}

// One Q8 row of k weights into k floats.
inline void dequantize_q8_row(const Q8* row, Index k, float* dst) {
  for (Index b0 = 0; b0 < k; b0 += kQ8Block) {
    const typename Vec::Reg s = Vec::set1(q8_scale(row, k, b0 / kQ8Block));
    const Index end = k - b0 < kQ8Block ? k : b0 + kQ8Block;
    Index i = b0;
    for (; i + Vec::kWidth <= end; i += Vec::kWidth) {
      Vec::store(dst + i, Vec::mul(Vec::load(row + i), s));
    }
    if (i < end) {
      const int left = static_cast<int>(end - i);
      Vec::store_first(dst + i, left, Vec::mul(Vec::load_first(row + i, left), s));
    }
  }
}

// linear_block (below) for Q8 weights: each vector of int8 values is widened and multiplied by
// its block's scale once, then meets every token row as the f32 weights do. The scale is folded
// into the weight (one multiply per weight vector) rather than into R x T partial sums per block:
// that would double the accumulators, which AVX2's 16 registers cannot hold.
template <int R, int T>
inline void linear_block_q8(const float* x, Index k, const Q8* w, int rows, float* out, Index ldo,
                            const Q8* next, unsigned prefetch_rows) {
  const Index stride = q8_row_bytes(k);
  typename Vec::Reg acc[R][T];
  const Q8* wr[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) wr[r] = w + (r < rows ? r : 0) * stride;  // spare rows redo row 0
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t] = Vec::zero();
  }
  for (Index b0 = 0; b0 < k; b0 += kQ8Block) {
    float scale[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) scale[r] = q8_scale(wr[r], k, b0 / kQ8Block);
    // One 64-byte line of int8 values every other block.
    if (b0 % 64 == 0) {
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        if ((prefetch_rows >> r) & 1u) {
          __builtin_prefetch(next + r * stride + b0, 0, kPrefetchLocality);
        }
      }
    }
    if (k - b0 >= kQ8Block) {
#pragma GCC unroll 4
      for (Index i = b0; i < b0 + kQ8Block; i += Vec::kWidth) {
        typename Vec::Reg a[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) a[r] = Vec::mul(Vec::load(wr[r] + i), Vec::set1(scale[r]));
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
          const typename Vec::Reg xv = Vec::load(x + t * k + i);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[r][t] = Vec::fma(a[r], xv, acc[r][t]);
        }
      }
    } else {  // the row's last, shorter block
      for (Index i = b0; i < k; i += Vec::kWidth) {
        const int left = k - i < Vec::kWidth ? static_cast<int>(k - i) : Vec::kWidth;
        typename Vec::Reg a[R];
        for (int r = 0; r < R; ++r) {
          const typename Vec::Reg v =
              left == Vec::kWidth ? Vec::load(wr[r] + i) : Vec::load_first(wr[r] + i, left);
          a[r] = Vec::mul(v, Vec::set1(scale[r]));
        }
        for (int t = 0; t < T; ++t) {
          const typename Vec::Reg xv =
              left == Vec::kWidth ? Vec::load(x + t * k + i) : Vec::load_first(x + t * k + i, left);
          for (int r = 0; r < R; ++r) acc[r][t] = Vec::fma(a[r], xv, acc[r][t]);
        }
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < rows; ++r) out[t * ldo + r] = Vec::sum(acc[r][t]);
  }
}

// ---- Q8 weights times a few rows of x, in integers ----
// Up to kQ8DotMaxRows rows (a decode step, a very short question) the rows of x are quantized as
// the weights are (blocks of kQ8Block, scale = max |x| / 127) and each block's dot product is taken
// in 8-bit integers, as llama.cpp does for Q8_0: per 32 weights one load, two sign ops, one
// multiply-add of bytes and one of words, a conversion and a scaled add, where widening every
// weight to f32 took three times the instructions and made the 8-bit decode slower than the
// bf16 one (bench-small, 2 threads: 85 against 95 tokens/s). The sums are exact integers; the
// approximation is x's own rounding to 8 bits (relative 1/254 of a block's largest value).
// These use 256-bit AVX2 integer instructions on both ISAs (-mavx512f implies AVX2; AVX-512BW
// is not assumed).
using promptcache::kernels::kQ8DotMaxRows;

inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax256(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The m rows of x (k values each) quantized into xq [m][blocks * kQ8Block] (zero padded) and xs
// [m][blocks]: value = round(x / scale) with scale = max |x| / 127 per block (0 for a block of
// zeros), the rounding to nearest even of the f32 product x * (1 / scale). Whole blocks go
// through vectors (cvtps2dq rounds to nearest even, as nearbyintf does under the default
// rounding mode): done element by element, with fmaxf a library call, it took 5% of a q8
// decode step.
inline void quantize_x_q8(const float* x, Index m, Index k, signed char* xq, float* xs) {
  const Index blocks = (k + kQ8Block - 1) / kQ8Block;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  // packs works within 128-bit lanes: this puts the four 8-value groups back in order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (Index t = 0; t < m; ++t) {
    for (Index b = 0; b < blocks; ++b) {
      const float* src = x + t * k + b * kQ8Block;
      const Index len = k - b * kQ8Block < kQ8Block ? k - b * kQ8Block : kQ8Block;
      signed char* dst = xq + (t * blocks + b) * kQ8Block;
      if (len == kQ8Block) {
        __m256 v[4];
        __m256 top = _mm256_setzero_ps();
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
          v[i] = _mm256_loadu_ps(src + 8 * i);
          top = _mm256_max_ps(top, _mm256_andnot_ps(sign, v[i]));
        }
        const float scale = hmax256(top) / 127.0f;
        const __m256 inverse = _mm256_set1_ps(scale > 0.0f ? 1.0f / scale : 0.0f);
        __m256i q[4];
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inverse));
        const __m256i bytes =
            _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                            _mm256_permutevar8x32_epi32(bytes, order));
        xs[t * blocks + b] = scale;
        continue;
      }
      float amax = 0.0f;
      for (Index i = 0; i < len; ++i) {
        const float a = src[i] < 0.0f ? -src[i] : src[i];
        amax = a > amax ? a : amax;
      }
      const float scale = amax / 127.0f;
      const float inverse = scale > 0.0f ? 1.0f / scale : 0.0f;
      for (Index i = 0; i < kQ8Block; ++i) {
        dst[i] = i < len ? static_cast<signed char>(__builtin_nearbyintf(src[i] * inverse)) : 0;
      }
      xs[t * blocks + b] = scale;
    }
  }
}

// out[t * ldo + r] for the m quantized rows of x and `rows` (<= R) Q8 weight rows from w.
template <int R>
inline void q8_dot_rows(const signed char* xq, const float* xs, Index m, Index k, const Q8* w,
                        int rows, float* out, Index ldo, const Q8* next, unsigned prefetch_rows) {
  const Index stride = q8_row_bytes(k), blocks = (k + kQ8Block - 1) / kQ8Block;
  const Index whole =
      k / kQ8Block;  // blocks read straight from the row; a short last one is copied
  const __m256i ones = _mm256_set1_epi16(1);
  const Q8* wr[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) wr[r] = w + (r < rows ? r : 0) * stride;  // spare rows redo row 0
  for (Index t = 0; t < m; ++t) {
    __m256 acc[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
    for (Index b = 0; b < blocks; ++b) {
      if (t == 0 && b % 2 == 0) {
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          if ((prefetch_rows >> r) & 1u) {
            __builtin_prefetch(next + r * stride + b * kQ8Block, 0, kPrefetchLocality);
          }
        }
      }
      const __m256i xv =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + (t * blocks + b) * kQ8Block));
      const float x_scale = xs[t * blocks + b];
      const __m256i xa = _mm256_sign_epi8(xv, xv);  // |x|, for every row
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        __m256i wv;
        if (b < whole) {
          wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wr[r] + b * kQ8Block));
        } else {
          signed char tail[kQ8Block] = {};
          __builtin_memcpy(tail, wr[r] + b * kQ8Block,
                           static_cast<unsigned long>(k - b * kQ8Block));
          wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tail));
        }
        // |x| (unsigned) times w with x's sign: the products w * x, summed in pairs (at most
        // 2 x 127 x 127, no saturation), then in fours as 32-bit integers (one sign operation
        // per weight row; llama.cpp's |w| times x with w's sign takes two). Converting 8
        // blocks' scales at once (through a buffer: 112 -> 95 tokens/s on bench-small's q8
        // decode; as a vector, each block taking its lane with a permute: no faster, slower
        // for k = 768) did not pay.
        const __m256i pairs = _mm256_maddubs_epi16(xa, _mm256_sign_epi8(wv, xv));
        const __m256 sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
        acc[r] = _mm256_fmadd_ps(sums, _mm256_set1_ps(q8_scale(wr[r], k, b) * x_scale), acc[r]);
      }
    }
    for (int r = 0; r < rows; ++r) out[t * ldo + r] = hsum256(acc[r]);
  }
}

// Prefetching: while a block multiplies its weight rows it asks for rows of the next block
// (`next`): those whose index has its bit set in `prefetch_rows`. With several token groups per
// block, linear_rows spreads the next block's rows over the groups' passes, so memory keeps
// streaming while the later passes reuse the current rows from L1. Without it the weight GEMMs
// of a 16-token forward over bench-small took 24 ms instead of 19 (the same calls with the
// weights in cache: 13 ms); the hardware prefetcher alone does not run far enough ahead.
template <class W, int R, int T>
inline void linear_block(const float* x, Index k, const W* w, int rows, float* out, Index ldo,
                         const W* next, unsigned prefetch_rows) {
  if constexpr (kIsQ8<W>) {
    linear_block_q8<R, T>(x, k, w, rows, out, ldo, next, prefetch_rows);
    return;
  }
  typename Vec::Reg acc[R][T];
  const W* wr[R];
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
template <class W, int T>
inline void linear_block_tail(int tokens, const float* x, Index k, const W* w, int rows, float* out,
                              Index ldo, const W* next, unsigned prefetch_rows) {
  if constexpr (T > 0) {
    if (tokens == T) {
      linear_block<W, Vec::kRows, T>(x, k, w, rows, out, ldo, next, prefetch_rows);
    } else {
      linear_block_tail<W, T - 1>(tokens, x, k, w, rows, out, ldo, next, prefetch_rows);
    }
  }
}

// ---- Tokens along the lanes (kLinearLaneMinRows rows of x and more) ----
// x is transposed once per call into xt [k][tv * kWidth] (tokens padded with zeros), and each
// weight element is broadcast against a vector of tokens: no sums across lanes at the end, and
// every weight row is still read once per block of J rows. With 16 tokens (a question) the
// 12 layers' linears of bench-small take 14.7-15.2 ms against 18.5-18.8 with the blocks above,
// with 64 tokens 44-49 against 57 ms (docs/benchmarks-history.md).

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

// The `count` 16-bit weights at src (rows in a row) converted to f32 into dst, asking (to L2)
// for the weights kConvertAheadBytes further on: the rows a kernel call takes are one stream.
constexpr Index kConvertAheadBytes = 16384;
template <class W>
inline void convert_rows(const W* src, Index count, float* dst) {
  constexpr Index kLine = 64 / static_cast<Index>(sizeof(W));
  constexpr Index kAhead = kConvertAheadBytes / static_cast<Index>(sizeof(W));
  Index i = 0;
  for (; i + Vec::kWidth <= count; i += Vec::kWidth) {
    if (i % kLine == 0) __builtin_prefetch(prefetch_address(src, i + kAhead), 0, kPrefetchLocality);
    Vec::store(dst + i, Vec::load(src + i));
  }
  if (i < count) {
    const int left = static_cast<int>(count - i);
    Vec::store_first(dst + i, left, Vec::load_first(src + i, left));
  }
}

// Weight rows [j, j + rows) of w (k weights each) into rows x k floats at dst.
template <class W>
inline void widen_block(const W* w, Index j, Index rows, Index k, float* dst) {
  if constexpr (kIsQ8<W>) {
    for (Index r = 0; r < rows; ++r) dequantize_q8_row(row_at(w, j + r, k), k, dst + r * k);
  } else {
    convert_rows(w + j * k, rows * k, dst);
  }
}

// Weight rows [n0, n1), J at a time; each block of rows meets the tokens in passes of up to
// kLinearLaneVecs vectors while its rows are in L1, and the first pass asks for the next block.
// bf16/f16 rows (W) are first converted, a block at a time, into `wf` (J x k floats, L2-sized);
// the passes then run the f32 code on them. Converting
// each weight as it is broadcast instead (a load and an AND for bf16, a shuffle and a convert for
// f16) took bench_linear's 16 and 64 rows to 1.35x (bf16) and 1.9x (f16) the f32 time; with the
// block converted first they take about the f32 time.
template <int J, class W>
inline void lane_linear_blocks(const float* xt, Index ldx, Index m, Index k, const W* w, Index n0,
                               Index n1, float* out, Index ldo, float* wf) {
  static_assert(Vec::kLinearLaneVecs == 2);
  static_assert(J <= promptcache::kernels::kLinearLaneMaxBlockRows);
  constexpr Index kPassTokens = Vec::kLinearLaneVecs * Vec::kWidth;
  constexpr bool kF32 = sizeof(W) == sizeof(float);
  float sums[J * kPassTokens];
  for (Index j = n0; j < n1; j += J) {
    const int rows = static_cast<int>(n1 - j < J ? n1 - j : J);
    const float* wj = nullptr;
    if constexpr (kF32) {
      wj = w + j * k;
    } else {
      widen_block(w, j, rows, k, wf);
      wj = wf;
    }
    for (Index t0 = 0; t0 < m; t0 += kPassTokens) {
      const Index tokens = m - t0 < kPassTokens ? m - t0 : kPassTokens;
      const float* next = nullptr;
      if constexpr (kF32) next = t0 == 0 && j + J < n1 ? w + (j + J) * k : nullptr;
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

// All m rows of x, transposed first into xt (the scratch; 16-bit weights' rows go after it).
template <class W>
inline void lane_linear(const float* x, Index m, Index k, const W* w, Index n0, Index n1,
                        float* out, Index ldo, float* xt) {
  const Index ldx = (m + Vec::kWidth - 1) / Vec::kWidth * Vec::kWidth;
  for (Index i = 0; i < k; ++i) {
    for (Index t = 0; t < ldx; ++t) xt[i * ldx + t] = t < m ? x[t * k + i] : 0.0f;
  }
  float* wf = xt + promptcache::kernels::linear_scratch_x_floats(m, k);
  // As many weight rows per block as the accumulators allow for the widest pass.
  if (ldx > Vec::kWidth) {
    lane_linear_blocks<Vec::kLinearLaneAcc / 2>(xt, ldx, m, k, w, n0, n1, out, ldo, wf);
  } else {
    lane_linear_blocks<Vec::kLinearLaneAcc>(xt, ldx, m, k, w, n0, n1, out, ldo, wf);
  }
}

// The entry points each ISA unit exports (signature of kernels::LinearRowsOf<W>).
// f16 rows taking several passes (more than kTokens rows of x) are converted once per block into
// the scratch: at 8-12 rows bf16 converted in every pass took 1.1-1.25x the f32 time against
// 1.3x converted first, f16 1.45x in every pass against 1.3x first (vcvtph2ps costs more than
// bf16's zero-extend and shift).
template <class W>
constexpr bool kConvertFirst = false;
template <>
constexpr bool kConvertFirst<F16> = true;
// Q8 rows take a convert, a multiply by the scale and a scale load per block: converted once.
template <>
constexpr bool kConvertFirst<Q8> = true;

template <class W>
void linear_rows_of(const float* x, Index m, Index k, const W* w, Index n0, Index n1, float* out,
                    Index ldo, float* xt) {
  if (xt != nullptr && m >= promptcache::kernels::kLinearLaneMinRows) {
    lane_linear<W>(x, m, k, w, n0, n1, out, ldo, xt);
    return;
  }
  if constexpr (kIsQ8<W>) {
    if (xt != nullptr && m <= kQ8DotMaxRows) {
      constexpr int kDotRows = 4;
      const Index blocks = (k + kQ8Block - 1) / kQ8Block;
      float* xs = xt;
      auto* xq = reinterpret_cast<signed char*>(xt + m * blocks);
      quantize_x_q8(x, m, k, xq, xs);
      for (Index j = n0; j < n1; j += kDotRows) {
        const int rows = static_cast<int>(n1 - j < kDotRows ? n1 - j : kDotRows);
        const Index jn = j + kDotRows;
        const int next_rows =
            static_cast<int>(jn >= n1 ? 0 : (n1 - jn < kDotRows ? n1 - jn : kDotRows));
        q8_dot_rows<kDotRows>(xq, xs, m, k, row_at(w, j, k), rows, out + j, ldo, row_at(w, jn, k),
                              (1u << next_rows) - 1u);
      }
      return;
    }
  }
  const int passes = static_cast<int>((m + Vec::kTokens - 1) / Vec::kTokens);
  if constexpr (kConvertFirst<W>) {
    if (passes > 1 && xt != nullptr) {
      float* wf = xt + promptcache::kernels::linear_scratch_x_floats(m, k);
      for (Index j = n0; j < n1; j += Vec::kRows) {
        const int rows = static_cast<int>(n1 - j < Vec::kRows ? n1 - j : Vec::kRows);
        widen_block(w, j, rows, k, wf);
        Index t = 0;
        for (; t + Vec::kTokens <= m; t += Vec::kTokens) {
          linear_block<float, Vec::kRows, Vec::kTokens>(x + t * k, k, wf, rows, out + t * ldo + j,
                                                        ldo, wf, 0u);
        }
        if (t < m) {
          linear_block_tail<float, Vec::kTokens - 1>(static_cast<int>(m - t), x + t * k, k, wf,
                                                     rows, out + t * ldo + j, ldo, wf, 0u);
        }
      }
      return;
    }
  }
  for (Index j = n0; j < n1; j += Vec::kRows) {
    const int rows = static_cast<int>(n1 - j < Vec::kRows ? n1 - j : Vec::kRows);
    const Index jn = j + Vec::kRows;
    const int next_rows =
        static_cast<int>(jn >= n1 ? 0 : (n1 - jn < Vec::kRows ? n1 - jn : Vec::kRows));
    const W* next = row_at(w, jn, k);
    const W* wj = row_at(w, j, k);
    // Pass p prefetches the next block's rows r with r % passes == p.
    auto prefetch_rows = [&](int pass) {
      unsigned bits = 0;
      for (int r = pass; r < next_rows; r += passes) bits |= 1u << r;
      return bits;
    };
    Index t = 0;
    int pass = 0;
    for (; t + Vec::kTokens <= m; t += Vec::kTokens, ++pass) {
      linear_block<W, Vec::kRows, Vec::kTokens>(x + t * k, k, wj, rows, out + t * ldo + j, ldo,
                                                next, prefetch_rows(pass));
    }
    if (t < m) {
      linear_block_tail<W, Vec::kTokens - 1>(static_cast<int>(m - t), x + t * k, k, wj, rows,
                                             out + t * ldo + j, ldo, next, prefetch_rows(pass));
    }
  }
}

void linear_rows(const float* x, Index m, Index k, const float* w, Index n0, Index n1, float* out,
                 Index ldo, float* xt) {
  linear_rows_of<float>(x, m, k, w, n0, n1, out, ldo, xt);
}
void linear_rows_bf16(const float* x, Index m, Index k, const Bf16* w, Index n0, Index n1,
                      float* out, Index ldo, float* xt) {
  linear_rows_of<Bf16>(x, m, k, w, n0, n1, out, ldo, xt);
}
void linear_rows_f16(const float* x, Index m, Index k, const F16* w, Index n0, Index n1, float* out,
                     Index ldo, float* xt) {
  linear_rows_of<F16>(x, m, k, w, n0, n1, out, ldo, xt);
}
void linear_rows_q8(const float* x, Index m, Index k, const Q8* w, Index n0, Index n1, float* out,
                    Index ldo, float* xt) {
  linear_rows_of<Q8>(x, m, k, w, n0, n1, out, ldo, xt);
}
void widen_q8(const Q8* src, Index rows, Index k, float* dst) {
  widen_block(src, 0, rows, k, dst);
}
void widen_bf16(const Bf16* src, Index count, float* dst) {
  convert_rows(src, count, dst);
}
void widen_f16(const F16* src, Index count, float* dst) {
  convert_rows(src, count, dst);
}

}  // namespace
