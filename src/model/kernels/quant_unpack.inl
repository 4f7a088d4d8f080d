// src/model/kernels/quant_unpack.inl — 256-bit unpacking of GGML weight blocks into unsigned
// byte values, shared by the AVX2 and AVX-512 VNNI dot products (quant_avx2.cpp,
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
