// src/model/kernels/quant_unpack.inl — 256-bit unpacking of GGML weight blocks into unsigned
// byte values, and the pieces of the four-row decode kernels (reductions, scales, prefetch, f32
// combination), shared by the AVX2 and AVX-512 VNNI dot products (quant_avx2.cpp,
// quant_avx512.cpp). Included inside each unit's anonymous namespace, after <immintrin.h> and
// quant_blocks.hpp, so each compiles it with its own instruction set.

// An f16 scale, converted by F16C (exact, as f16_to_f32).
float half(const uint8_t* p) {
  return _cvtsh_ss(load_u16(p));
}

int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

__m256i load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// 16 bytes of nibbles as 32 values (0..15): the low nibbles, then the high ones.
__m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i low = _mm_set1_epi8(0x0F);
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i lo = _mm_and_si128(q, low), hi = _mm_and_si128(_mm_srli_epi16(q, 4), low);
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

// A Q4_0 block's 32 values (0..15).
__m256i unpack_q4_0(const uint8_t* w) {
  return unpack_nibbles(w + 2);
}

// Byte j of the result (j < 32) is 0xFF where bit j of `bits` is set, else 0: byte j / 8 of
// `bits` spread over the j-th group of 8 bytes, each byte's own bit then tested.
__m256i bit_mask32(uint32_t bits) {
  const __m256i spread =
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303);
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), spread);
  const __m256i others = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);  // all bits but byte j's own
  return _mm256_cmpeq_epi8(_mm256_or_si256(v, others), _mm256_set1_epi64x(-1));
}

// A Q5_0 / Q5_1 block's 32 values (0..31): the nibbles of qs, bit j of qh as value j's 16.
__m256i unpack_q5(const uint8_t* qh, const uint8_t* qs) {
  return _mm256_or_si256(unpack_nibbles(qs),
                         _mm256_and_si256(bit_mask32(load_u32(qh)), _mm256_set1_epi8(16)));
}

// A Q4_K/Q5_K block's 6-bit scales (sc) and the sum over sub-blocks of min x sum(x) (returned).
int32_t k_scales(const uint8_t* w, const XQK& x, int* sc) {
  int32_t summ = 0;
  for (int s = 0; s < 8; ++s) {
    int m;
    scale_min_k4(s, w + 4, &sc[s], &m);
    summ += m * (x.bsums[2 * s] + x.bsums[2 * s + 1]);
  }
  return summ;
}

// Sub-blocks 2c (lo) and 2c + 1 (hi) of a Q4_K (qh null) or Q5_K block: 0..15 or 0..31.
template <bool kFive>
void unpack_qkx_pair(const uint8_t* qs, __m256i qh, int c, __m256i* lo, __m256i* hi) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  const __m256i q = load32(qs + 32 * c);
  *lo = _mm256_and_si256(q, low);
  *hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
  if (kFive) {
    const __m256i sixteen = _mm256_set1_epi8(16);
    const __m256i b0 = _mm256_set1_epi8(static_cast<char>(1 << (2 * c)));
    const __m256i b1 = _mm256_set1_epi8(static_cast<char>(1 << (2 * c + 1)));
    *lo = _mm256_or_si256(
        *lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b0), b0), sixteen));
    *hi = _mm256_or_si256(
        *hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), sixteen));
  }
}

// The -32 of every Q6_K value: sum over the 16 groups of scale x sum(x) (times 32 by the caller).
int32_t q6_bias(const int8_t* sc, const XQK& x) {
  int32_t bias = 0;
  for (int g = 0; g < 16; ++g) bias += sc[g] * x.bsums[g];
  return bias;
}

// Half h of a Q6_K block: its four groups of 32 values, 0..63 (q + 32).
void unpack_q6_half(const uint8_t* w, int h, __m256i* u) {
  const __m256i low = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
  const __m256i ql0 = load32(w + 64 * h), ql1 = load32(w + 64 * h + 32);
  const __m256i qh = load32(w + 128 + 32 * h);
  auto high = [&](int shift) {
    return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, shift), two), 4);
  };
  u[0] = _mm256_or_si256(_mm256_and_si256(ql0, low), high(0));
  u[1] = _mm256_or_si256(_mm256_and_si256(ql1, low), high(2));
  u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low), high(4));
  u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low), high(6));
}

// ---- shared by the four-row decode kernels (one row of x against four weight rows) ----

// [sum of a, sum of b, sum of c, sum of d] of four int32 vectors.
__m128i hsum4(__m128i a, __m128i b, __m128i c, __m128i d) {
  const __m128i ab = _mm_add_epi32(_mm_unpacklo_epi32(a, b), _mm_unpackhi_epi32(a, b));
  const __m128i cd = _mm_add_epi32(_mm_unpacklo_epi32(c, d), _mm_unpackhi_epi32(c, d));
  return _mm_add_epi32(_mm_unpacklo_epi64(ab, cd), _mm_unpackhi_epi64(ab, cd));
}

// A Q4_K/Q5_K block's eight 6-bit scales (int16 lanes 0-7) and mins (lanes 8-15), unpacked from
// its 12 bytes as scale_min_k4 reads them.
__m256i k_scales_mins(const uint8_t* packed) {
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  uint32_t u[3];
  std::memcpy(u, packed, 12);
  const uint32_t sc_lo = u[0] & kLow6, m_lo = u[1] & kLow6;
  const uint32_t sc_hi = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
  const uint32_t m_hi = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
  return _mm256_cvtepu8_epi16(_mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi),
                                             static_cast<int>(m_lo), static_cast<int>(m_hi)));
}

// The block two ahead in the same row, asked for now: four rows read side by side are four
// streams the hardware prefetcher alone leaves the kernel waiting on (bench_linear, one row of x,
// tinyllama's 5632 x 2048 from memory: Q4_K 0.467 ms without, 0.355 ms two blocks ahead, 0.384
// four, 0.482 one).
constexpr long long kPrefetchBlocks = 2;
inline void prefetch_ahead(const uint8_t* block, long long bytes) {
  const char* p = reinterpret_cast<const char*>(block + kPrefetchBlocks * bytes);
  for (long long o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

// The x sums of each 32-value sub-block of an XQK block (pairs of its bsums), as int16.
__m128i pair_sums(const XQK& x) {
  const __m256i sums = _mm256_madd_epi16(
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.bsums)), _mm256_set1_epi16(1));
  return _mm_packs_epi32(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
}

inline __m128i hsum4(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i ab = _mm256_add_epi32(_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b));
  const __m256i cd = _mm256_add_epi32(_mm256_unpacklo_epi32(c, d), _mm256_unpackhi_epi32(c, d));
  const __m256i abcd =
      _mm256_add_epi32(_mm256_unpacklo_epi64(ab, cd), _mm256_unpackhi_epi64(ab, cd));
  return _mm_add_epi32(_mm256_castsi256_si128(abcd), _mm256_extracti128_si256(abcd, 1));
}

// combine_qkx for four weight rows' blocks: `dm` their first four bytes (f16 d, then dmin), x's
// scale, and the rows' integer sums; the same f32 operations per row.
__m128 combine_qkx4(const uint32_t dm[4], float xd, __m128i sumi, __m128i summ) {
  const __m256 halves =
      _mm256_cvtph_ps(_mm_setr_epi32(static_cast<int>(dm[0]), static_cast<int>(dm[1]),
                                     static_cast<int>(dm[2]), static_cast<int>(dm[3])));
  const __m128 lo = _mm256_castps256_ps128(halves), hi = _mm256_extractf128_ps(halves, 1);
  const __m128 d = _mm_shuffle_ps(lo, hi, _MM_SHUFFLE(2, 0, 2, 0));
  const __m128 dmin = _mm_shuffle_ps(lo, hi, _MM_SHUFFLE(3, 1, 3, 1));
  const __m128 si = _mm_cvtepi32_ps(sumi), sm = _mm_cvtepi32_ps(summ);
  return _mm_mul_ps(_mm_set1_ps(xd), _mm_sub_ps(_mm_mul_ps(d, si), _mm_mul_ps(dmin, sm)));
}

// combine_q6k for four weight rows' blocks (their f16 d).
__m128 combine_q6k4(const int16_t dh[4], float xd, __m128i sumi) {
  const __m128 d = _mm_cvtph_ps(_mm_setr_epi16(dh[0], dh[1], dh[2], dh[3], 0, 0, 0, 0));
  return _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(xd), d), _mm_cvtepi32_ps(sumi));
}

// One row of x against four weight rows' Q4_K/Q5_K blocks, block by block: block_sum(block,
// scales_mins, x's block) is a block's integer sum as int32 lanes, in the unit's own instructions
// (scales_mins: k_scales_mins); the prefetch, the mins' sums, the reduction of four rows and the
// f32 combination are shared.
template <bool kFive, class BlockSum>
void qkx_rows4_with(const uint8_t* w, long long nb, const XQK* x, float* out,
                    const BlockSum& block_sum) {
  constexpr long long kBytes = kFive ? 176 : 144;
  const long long row = nb * kBytes;
  __m128 acc = _mm_setzero_ps();
  for (long long i = 0; i < nb; ++i) {
    const __m128i sums32 = pair_sums(x[i]);
    decltype(block_sum(w, __m256i{}, x[i])) sumi[4];
    __m128i summ[4];
    uint32_t dm[4];
    for (int r = 0; r < 4; ++r) {
      const uint8_t* b = w + r * row + i * kBytes;
      prefetch_ahead(b, kBytes);
      dm[r] = load_u32(b);
      const __m256i scales_mins = k_scales_mins(b + 4);
      summ[r] = _mm_madd_epi16(_mm256_extracti128_si256(scales_mins, 1), sums32);
      sumi[r] = block_sum(b, scales_mins, x[i]);
    }
    acc = _mm_add_ps(acc, combine_qkx4(dm, x[i].d, hsum4(sumi[0], sumi[1], sumi[2], sumi[3]),
                                       hsum4(summ[0], summ[1], summ[2], summ[3])));
  }
  _mm_storeu_ps(out, acc);
}

// The same for Q6_K: block_sum(block, x's block) is a block's integer sum, its -32 included.
template <class BlockSum>
void q6k_rows4_with(const uint8_t* w, long long nb, const XQK* x, float* out,
                    const BlockSum& block_sum) {
  constexpr long long kBytes = 210;
  const long long row = nb * kBytes;
  __m128 acc = _mm_setzero_ps();
  for (long long i = 0; i < nb; ++i) {
    decltype(block_sum(w, x[i])) sumi[4];
    int16_t dh[4];
    for (int r = 0; r < 4; ++r) {
      const uint8_t* b = w + r * row + i * kBytes;
      prefetch_ahead(b, kBytes);
      dh[r] = static_cast<int16_t>(load_u16(b + 208));
      sumi[r] = block_sum(b, x[i]);
    }
    acc = _mm_add_ps(acc, combine_q6k4(dh, x[i].d, hsum4(sumi[0], sumi[1], sumi[2], sumi[3])));
  }
  _mm_storeu_ps(out, acc);
}

// One row of x: weight rows four at a time by kRows4, the rest by the single-row dot product.
template <void (*kRows4)(const uint8_t*, long long, const XQK*, float*), DotFn kDot, Format kF>
void decode_rows(const uint8_t* w, long long k, const uint8_t* xq, long long n0, long long n1,
                 float* out) {
  const long long nb = k / kQK, row = nb * format_bytes(kF);
  const auto* x = reinterpret_cast<const XQK*>(xq);
  long long j = n0;
  for (; j + 4 <= n1; j += 4) kRows4(w + j * row, nb, x, out + j);
  for (; j < n1; ++j) out[j] = kDot(w + j * row, xq, nb);
}
