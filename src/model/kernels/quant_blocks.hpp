// src/model/kernels/quant_blocks.hpp — GGML's block formats (Q4_0, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
// Q6_K) as byte
// layouts, their scalar reference (quant_scalar.cpp) and the entry points of the per-ISA integer
// dot-product kernels (quant_avx2.cpp, quant_avx512.cpp). Private to the library:
// src/model/ggml_quant.cpp and src/model/quant_linear.cpp use them.
//
// Block layouts (little-endian, f16 = IEEE half bits), QK = 256 for the K-quants:
//   Q4_0 (18 bytes, 32 weights): f16 d; u8 qs[16]. w[j] = d * ((qs[j] & 15) - 8),
//        w[j + 16] = d * ((qs[j] >> 4) - 8), j < 16.
//   Q8_0 (34 bytes, 32 weights): f16 d; i8 qs[32]. w[j] = d * qs[j].
//   Q5_0 (22 bytes, 32 weights): f16 d; u8 qh[4]; u8 qs[16]. With h = qh as a little-endian u32,
//        w[j] = d * (((qs[j] & 15) | (bit j of h) << 4) - 16),
//        w[j + 16] = d * (((qs[j] >> 4) | (bit j + 16 of h) << 4) - 16), j < 16.
//   Q5_1 (24 bytes, 32 weights): f16 d; f16 m; u8 qh[4]; u8 qs[16]. The same 5-bit values q
//        (0..31) as Q5_0, w = d * q + m.
//   Q4_K (144 bytes, 256 weights): f16 d; f16 dmin; u8 scales[12]; u8 qs[128]. Eight sub-blocks
//        of 32 with a 6-bit scale sc and min m each (packed, see scale_min_k4). For sub-block pair
//        c < 4, qs[32c + l] holds sub-block 2c's value l in its low nibble and 2c+1's in its high
//        one; w = d * sc * q - dmin * m.
//   Q5_K (176 bytes): f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]. As Q4_K, plus bit s
//        of qh[l] as the fifth bit (16) of sub-block s's value l.
//   Q6_K (210 bytes): u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d. Half h < 2 of the block
//        (values 128h + 32g + l, g < 4, l < 32) reads ql[64h + l] (g = 0 low nibble, g = 2 high),
//        ql[64h + 32 + l] (g = 1 low, g = 3 high) and bits 2g, 2g+1 of qh[32h + l] as bits 4, 5
//        of q in [0, 64); w = d * scales[p / 16] * (q - 32) for the value at position p.
#pragma once

#include <cstdint>
#include <cstring>

namespace promptcache::kernels::quant {

// The kernel tables below are indexed by these values.
enum class Format { kQ4_0, kQ8_0, kQ4_K, kQ5_K, kQ6_K, kQ5_0, kQ5_1 };
constexpr int kFormats = 7;

constexpr long long kQK = 256;  // K-quant super-block
constexpr long long kQ32 = 32;  // Q4_0 / Q8_0 block

constexpr long long format_elements(Format f) {
  return f == Format::kQ4_K || f == Format::kQ5_K || f == Format::kQ6_K ? kQK : kQ32;
}
constexpr long long format_bytes(Format f) {
  switch (f) {
    case Format::kQ4_0:
      return 18;
    case Format::kQ8_0:
      return 34;
    case Format::kQ4_K:
      return 144;
    case Format::kQ5_K:
      return 176;
    case Format::kQ6_K:
      return 210;
    case Format::kQ5_0:
      return 22;
    case Format::kQ5_1:
      return 24;
  }
  return 0;
}

// x quantized for the integer dot products (internal; never stored in files):
//  XQ32, per 32 values (Q4_0, Q5_0, Q5_1 and Q8_0 weights): f32 d, the int32 sum of the values,
//  32 int8.
//  XQK, per 256 values (K-quant weights): f32 d, 256 int8, the int16 sums of each 16.
// x = d * q, q = round-to-nearest-even(x / d), d = max |x| / 127 per block (0 for a zero block).
struct XQ32 {
  float d;
  int32_t sum;
  int8_t qs[32];
};
struct XQK {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};
static_assert(sizeof(XQ32) == 40 && sizeof(XQK) == 292, "packed activation blocks");

// f16 bits <-> f32 (round to nearest even), exact for every f16.
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Scalar reference. `k` values (a multiple of format_elements(f)); `blocks` is k / elements
// blocks of format_bytes(f) bytes.
void dequantize_row(Format f, const uint8_t* blocks, long long k, float* out);
void quantize_row(Format f, const float* x, long long k, uint8_t* blocks);
// x quantized for weights of format f: XQ32 blocks for the 32-value formats, XQK for the K-quants.
void quantize_x(Format f, const float* x, long long k, void* out);
// x as the integer kernels see it, in f32: each block of 32 (Q4_0, Q5_0, Q5_1, Q8_0) or 256 values
// (K-quants)
// rounded to q * d as quantize_x rounds it. The dequantize + GEMM path multiplies this, so both
// paths compute the same products (up to f32 rounding of the sums).
void round_x(Format f, const float* x, long long k, float* out);
constexpr long long x_block(Format f) {
  return format_elements(f) == kQ32 ? kQ32 : kQK;
}
constexpr long long x_row_bytes(Format f, long long k) {
  return format_elements(f) == kQ32 ? k / kQ32 * static_cast<long long>(sizeof(XQ32))
                                    : k / kQK * static_cast<long long>(sizeof(XQK));
}

// The 6-bit scale and min of sub-block j < 8 from a Q4_K/Q5_K block's 12 scale bytes.
static inline void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

static inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
static inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// out[t * ldo + j] = dot(weight row j, x row t) for t < m, n0 <= j < n1: weight rows of
// k / elements blocks, `xq` m rows of x_row_bytes(f, k) bytes (quantize_x). Every kernel combines
// a block's integer sums in f32 in the same order as the scalar one (fp contraction off), so all
// of them give bitwise the same result.
using QuantRowsFn = void (*)(const uint8_t* w, long long k, const uint8_t* xq, long long m,
                             long long n0, long long n1, float* out, long long ldo);
// Scalar (always there), AVX2 (null unless built with it), AVX-512 VNNI (AVX-512 F/BW/VL/VNNI).
extern const QuantRowsFn quant_rows_scalar[kFormats];
extern const QuantRowsFn quant_rows_avx2[kFormats];
extern const QuantRowsFn quant_rows_avx512vnni[kFormats];

// dequantize_row's work for one format (k values), bitwise the same results (the same f32
// multiply, then subtract, per value). Null where the unit is not built.
using DequantRowFn = void (*)(const uint8_t* blocks, long long k, float* out);
extern const DequantRowFn dequant_row_avx2[kFormats];

// One weight row of nb blocks times one row of quantized x.
using DotFn = float (*)(const uint8_t* w, const uint8_t* xq, long long nb);

// A QuantRowsFn from a DotFn: tiles of up to 16 rows of x (about 14 KB of quantized x, kept in
// L1/L2) against each weight row in turn (a row stays in L1 for the tile's rows).
template <DotFn kDot, Format kF>
static void dot_rows(const uint8_t* w, long long k, const uint8_t* xq, long long m, long long n0,
                     long long n1, float* out, long long ldo) {
  constexpr long long kTile = 16;
  const long long nb = k / format_elements(kF), row = nb * format_bytes(kF);
  const long long xrow = x_row_bytes(kF, k);
  for (long long t0 = 0; t0 < m; t0 += kTile) {
    const long long t1 = t0 + kTile < m ? t0 + kTile : m;
    for (long long j = n0; j < n1; ++j) {
      for (long long t = t0; t < t1; ++t) out[t * ldo + j] = kDot(w + j * row, xq + t * xrow, nb);
    }
  }
}

// The f32 combinations of a block's integer sums, shared by every kernel (internal linkage: each
// unit compiles its own copy with its own flags, and fp contraction is off in all of them).
// Q4_0 / Q5_0 / Q8_0 weights: block scale wd, x scale xd, integer dot s.
static inline float combine_q32(float wd, float xd, int32_t s) {
  return wd * xd * static_cast<float>(s);
}
// Q5_1: w = wd * q + wm, so the block's dot is xd * (wd * dot(q, xq) + wm * sum(xq)).
static inline float combine_q51(float wd, float wm, float xd, int32_t s, int32_t sum) {
  return xd * (wd * static_cast<float>(s) + wm * static_cast<float>(sum));
}
// Q4_K / Q5_K: sum over sub-blocks of sc * dot (sumi) and m * sum(x) (summ).
static inline float combine_qkx(float d, float dmin, float xd, int32_t sumi, int32_t summ) {
  return xd * (d * static_cast<float>(sumi) - dmin * static_cast<float>(summ));
}
// Q6_K: sum over the 16 groups of scale * dot of (q - 32) and x.
static inline float combine_q6k(float d, float xd, int32_t sumi) {
  return xd * d * static_cast<float>(sumi);
}

}  // namespace promptcache::kernels::quant
