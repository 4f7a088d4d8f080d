// src/model/kernels/quant_scalar.cpp — the scalar reference of GGML's block formats
// (quant_blocks.hpp): dequantization (which defines each format), quantization of weights with a
// scale search, x quantized for the integer dot products, and the scalar dot-product kernels
// that the SIMD ones must match bit for bit. Built with fp contraction off (CMakeLists.txt), so
// the f32 arithmetic is exactly what is written here.
#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "quant_blocks.hpp"

namespace promptcache::kernels::quant {

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: man x 2^-24, exact in f32
    float f = static_cast<float>(man) * 0x1p-24f;
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  }
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 : 0);  // inf / nan
  if (ax >= 0x477ff000u) return sign | 0x7c00;  // rounds past the largest f16 (65504)
  if (ax < 0x38800000u) {                       // below 2^-14: subnormal or zero
    float a;
    std::memcpy(&a, &ax, 4);
    // a x 2^24 rounded to nearest even: the subnormal's mantissa (may carry into 0x400, the
    // smallest normal, which is the right encoding).
    return sign | static_cast<uint16_t>(std::nearbyint(a * 0x1p24f));
  }
  // Normal: drop 13 mantissa bits, rounding to nearest even (a carry moves up the exponent).
  const uint32_t rounded = ax + 0xfff + ((ax >> 13) & 1);
  return sign | static_cast<uint16_t>((rounded - (112u << 23)) >> 13);
}

namespace {

int nearest(float v) {
  return static_cast<int>(std::nearbyint(v));
}

// ---- dequantization (the reference) ----

void dequant_q4_0(const uint8_t* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0xF) - 8);
    y[j + 16] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

// A Q5_0 / Q5_1 block's 32 values, 0..31: the nibbles of qs with the bits of qh as bit 4.
void unpack_q5(const uint8_t* qh_bytes, const uint8_t* qs, int* q) {
  const uint32_t qh = load_u32(qh_bytes);
  for (int j = 0; j < 16; ++j) {
    q[j] = (qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4);
    q[j + 16] = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
  }
}

void dequant_q5_0(const uint8_t* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  int q[32];
  unpack_q5(b + 2, b + 6, q);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(q[j] - 16);
}

void dequant_q5_1(const uint8_t* b, float* y) {
  const float d = f16_to_f32(load_u16(b)), m = f16_to_f32(load_u16(b + 2));
  int q[32];
  unpack_q5(b + 4, b + 8, q);
  for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(q[j]) + m;
}

void dequant_q8_0(const uint8_t* b, float* y) {
  const float d = f16_to_f32(load_u16(b));
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// Q4_K (bits5 = null) and Q5_K (bits5 = qh).
void dequant_qkx(const uint8_t* b, const uint8_t* qh, const uint8_t* qs, float* y) {
  const float d = f16_to_f32(load_u16(b)), dmin = f16_to_f32(load_u16(b + 2));
  const uint8_t* scales = b + 4;
  for (int s = 0; s < 8; ++s) {
    int sc, m;
    scale_min_k4(s, scales, &sc, &m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (s / 2);
    const int shift = (s & 1) * 4;
    for (int l = 0; l < 32; ++l) {
      int v = (q[l] >> shift) & 0xF;
      if (qh != nullptr) v |= ((qh[l] >> s) & 1) << 4;
      y[32 * s + l] = d1 * static_cast<float>(v) - m1;
    }
  }
}

// A Q6_K block's 256 values, q - 32 (-32..31), in position order.
void unpack_q6(const uint8_t* b, int8_t* q) {
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b + 64 * h;
    const uint8_t* qh = b + 128 + 32 * h;
    int8_t* y = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      y[l] = static_cast<int8_t>(((ql[l] & 0xF) | ((qh[l] & 3) << 4)) - 32);
      y[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
      y[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
      y[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
    }
  }
}

void dequant_q6_k(const uint8_t* b, float* y) {
  const float d = f16_to_f32(load_u16(b + 208));
  const auto* scales = reinterpret_cast<const int8_t*>(b + 192);
  int8_t q[256];
  unpack_q6(b, q);
  for (int g = 0; g < 16; ++g) {
    const float ds = d * static_cast<float>(scales[g]);
    for (int i = 16 * g; i < 16 * g + 16; ++i) y[i] = ds * static_cast<float>(q[i]);
  }
}

// ---- quantization of weights ----

void quant_q8_0(const float* x, uint8_t* b) {
  float amax = 0;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
  const uint16_t dh = f32_to_f16(d);
  std::memcpy(b, &dh, 2);
  for (int j = 0; j < 32; ++j) {
    b[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(std::clamp(nearest(x[j] * id), -127, 127)));
  }
}

// As ggml's reference: the value of largest magnitude maps to -8.
void quant_q4_0(const float* x, uint8_t* b) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
  const uint16_t dh = f32_to_f16(d);
  std::memcpy(b, &dh, 2);
  for (int j = 0; j < 16; ++j) {
    const int lo = std::clamp(static_cast<int>(x[j] * id + 8.5f), 0, 15);
    const int hi = std::clamp(static_cast<int>(x[j + 16] * id + 8.5f), 0, 15);
    b[2 + j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

// The 5-bit values q[0..32) into qh (bit j = bit 4 of q[j], little-endian) and qs (nibbles as
// Q4_0's).
void pack_q5(const int* q, uint8_t* qh_bytes, uint8_t* qs) {
  uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
    qh |= static_cast<uint32_t>((q[j] >> 4) & 1) << j;
    qh |= static_cast<uint32_t>((q[j + 16] >> 4) & 1) << (j + 16);
  }
  std::memcpy(qh_bytes, &qh, 4);
}

// As ggml's reference: the value of largest magnitude maps to -16.
void quant_q5_0(const float* x, uint8_t* b) {
  float amax = 0, max = 0;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -16.0f, id = d != 0 ? 1.0f / d : 0.0f;
  const uint16_t dh = f32_to_f16(d);
  std::memcpy(b, &dh, 2);
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = std::clamp(static_cast<int>(x[j] * id + 16.5f), 0, 31);
  pack_q5(q, b + 2, b + 6);
}

// As ggml's reference: d = (max - min) / 31, m = min, q = round((x - min) / d).
void quant_q5_1(const float* x, uint8_t* b) {
  float lo = x[0], hi = x[0];
  for (int j = 1; j < 32; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  const float d = (hi - lo) / 31.0f, id = d != 0 ? 1.0f / d : 0.0f;
  const uint16_t dh = f32_to_f16(d), mh = f32_to_f16(lo);
  std::memcpy(b, &dh, 2);
  std::memcpy(b + 2, &mh, 2);
  int q[32];
  for (int j = 0; j < 32; ++j) q[j] = std::clamp(static_cast<int>((x[j] - lo) * id + 0.5f), 0, 31);
  pack_q5(q, b + 4, b + 8);
}

// x[0..n) ~ scale * q - min with q in [0, nmax], min >= 0: tries 21 candidate scales around
// (max - min) / nmax, fits scale and min by least squares to each assignment, keeps the one of
// least squared error.
void fit_affine(const float* x, int n, int nmax, float* scale, float* min_out) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  lo = std::min(lo, 0.0f);
  if (hi <= lo) {
    *scale = 0;
    *min_out = -lo;
    return;
  }
  float best_err = INFINITY, best_s = (hi - lo) / static_cast<float>(nmax), best_b = lo;
  for (int step = -10; step <= 10; ++step) {
    const float iscale = (static_cast<float>(nmax) + 0.1f * static_cast<float>(step)) / (hi - lo);
    double sq = 0, sqq = 0, sx = 0, sqx = 0;
    int q[256];
    for (int i = 0; i < n; ++i) {
      q[i] = std::clamp(nearest(iscale * (x[i] - lo)), 0, nmax);
      sq += q[i];
      sqq += static_cast<double>(q[i]) * q[i];
      sx += x[i];
      sqx += static_cast<double>(q[i]) * x[i];
    }
    const double det = n * sqq - sq * sq;
    if (det <= 0) continue;
    double s = (n * sqx - sq * sx) / det, b = (sqq * sx - sq * sqx) / det;
    if (b > 0) {  // the min must stay >= 0 (w = s q - min)
      b = 0;
      s = sqq > 0 ? sqx / sqq : 0;
    }
    if (s <= 0) continue;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = s * q[i] + b - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = static_cast<float>(err);
      best_s = static_cast<float>(s);
      best_b = static_cast<float>(b);
    }
  }
  *scale = best_s;
  *min_out = -best_b;
}

// Q4_K (nmax 15, qh null) and Q5_K (nmax 31): per sub-block of 32 an affine fit, the 8 scales and
// mins quantized to 6 bits against the super-block's d and dmin, then the values quantized again
// with the scales as stored.
void quant_qkx(const float* x, int nmax, uint8_t* b, uint8_t* qh, uint8_t* qs) {
  float scales[8], mins[8], max_scale = 0, max_min = 0;
  for (int s = 0; s < 8; ++s) {
    fit_affine(x + 32 * s, 32, nmax, &scales[s], &mins[s]);
    max_scale = std::max(max_scale, scales[s]);
    max_min = std::max(max_min, mins[s]);
  }
  const float d = max_scale / 63.0f, dmin = max_min / 63.0f;
  const uint16_t dh = f32_to_f16(d), dminh = f32_to_f16(dmin);
  std::memcpy(b, &dh, 2);
  std::memcpy(b + 2, &dminh, 2);
  const float ds = f16_to_f32(dh), dms = f16_to_f32(dminh);
  int ls[8], lm[8];
  for (int s = 0; s < 8; ++s) {
    ls[s] = ds > 0 ? std::clamp(nearest(scales[s] / ds), 0, 63) : 0;
    lm[s] = dms > 0 ? std::clamp(nearest(mins[s] / dms), 0, 63) : 0;
  }
  uint8_t* sc = b + 4;
  std::memset(sc, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      sc[j] = static_cast<uint8_t>(ls[j]);
      sc[j + 4] = static_cast<uint8_t>(lm[j]);
    } else {
      sc[j + 4] = static_cast<uint8_t>((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
      sc[j - 4] |= static_cast<uint8_t>((ls[j] >> 4) << 6);
      sc[j] |= static_cast<uint8_t>((lm[j] >> 4) << 6);
    }
  }
  if (qh != nullptr) std::memset(qh, 0, 32);
  std::memset(qs, 0, 128);
  for (int s = 0; s < 8; ++s) {
    const float d1 = ds * static_cast<float>(ls[s]), m1 = dms * static_cast<float>(lm[s]);
    for (int l = 0; l < 32; ++l) {
      const int q = d1 > 0 ? std::clamp(nearest((x[32 * s + l] + m1) / d1), 0, nmax) : 0;
      qs[32 * (s / 2) + l] |= static_cast<uint8_t>((q & 0xF) << ((s & 1) * 4));
      if (qh != nullptr) qh[l] |= static_cast<uint8_t>(((q >> 4) & 1) << s);
    }
  }
}

// x[0..16) ~ scale * q with q in [-32, 31]: the value of largest magnitude maps to about -32;
// 19 candidate scales, each refit by least squares, the best kept. Returns the scale (signed).
float fit_symmetric(const float* x) {
  float amax = 0, max = 0;
  for (int i = 0; i < 16; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax == 0) return 0;
  float best_err = INFINITY, best = max / -32.0f;
  for (int step = -9; step <= 9; ++step) {
    const float iscale = -(32.0f + 0.1f * static_cast<float>(step)) / max;
    double sqx = 0, sqq = 0;
    int q[16];
    for (int i = 0; i < 16; ++i) {
      q[i] = std::clamp(nearest(iscale * x[i]), -32, 31);
      sqx += static_cast<double>(q[i]) * x[i];
      sqq += static_cast<double>(q[i]) * q[i];
    }
    if (sqq <= 0) continue;
    const double s = sqx / sqq;
    double err = 0;
    for (int i = 0; i < 16; ++i) {
      const double e = s * q[i] - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = static_cast<float>(err);
      best = static_cast<float>(s);
    }
  }
  return best;
}

void quant_q6_k(const float* x, uint8_t* b) {
  float scales[16], amax = 0, max = 0;
  for (int g = 0; g < 16; ++g) {
    scales[g] = fit_symmetric(x + 16 * g);
    if (std::fabs(scales[g]) > amax) {
      amax = std::fabs(scales[g]);
      max = scales[g];
    }
  }
  const float d = max / -128.0f;
  const uint16_t dh = f32_to_f16(d);
  std::memcpy(b + 208, &dh, 2);
  const float ds = f16_to_f32(dh);
  auto* sc = reinterpret_cast<int8_t*>(b + 192);
  int u[256];
  for (int g = 0; g < 16; ++g) {
    const int l = ds != 0 ? std::clamp(nearest(scales[g] / ds), -128, 127) : 0;
    sc[g] = static_cast<int8_t>(l);
    const float dd = ds * static_cast<float>(l);
    for (int i = 0; i < 16; ++i) {
      const int q = dd != 0 ? std::clamp(nearest(x[16 * g + i] / dd), -32, 31) : 0;
      u[16 * g + i] = q + 32;
    }
  }
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const int* v = u + 128 * h + l;
      ql[64 * h + l] = static_cast<uint8_t>((v[0] & 0xF) | ((v[64] & 0xF) << 4));
      ql[64 * h + 32 + l] = static_cast<uint8_t>((v[32] & 0xF) | ((v[96] & 0xF) << 4));
      qh[32 * h + l] = static_cast<uint8_t>((v[0] >> 4) | ((v[32] >> 4) << 2) |
                                            ((v[64] >> 4) << 4) | ((v[96] >> 4) << 6));
    }
  }
}

// ---- x for the integer dot products ----

// n values: d = max |x| / 127, q = round(x / d) (nearest even); returns d.
float quantize_block_x(const float* x, int n, int8_t* q) {
  float amax = 0;
  for (int i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
  for (int i = 0; i < n; ++i) q[i] = static_cast<int8_t>(std::clamp(nearest(x[i] * id), -127, 127));
  return d;
}

// ---- scalar dot products: one weight row (nb blocks) with one row of quantized x ----

float dot_q4_0(const uint8_t* w, const uint8_t* xq, long long nb) {
  const auto* x = reinterpret_cast<const XQ32*>(xq);
  float acc = 0;
  for (long long i = 0; i < nb; ++i, w += 18) {
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) {
      s += ((w[2 + j] & 0xF) - 8) * x[i].qs[j] + ((w[2 + j] >> 4) - 8) * x[i].qs[j + 16];
    }
    acc += combine_q32(f16_to_f32(load_u16(w)), x[i].d, s);
  }
  return acc;
}

float dot_q8_0(const uint8_t* w, const uint8_t* xq, long long nb) {
  const auto* x = reinterpret_cast<const XQ32*>(xq);
  float acc = 0;
  for (long long i = 0; i < nb; ++i, w += 34) {
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) s += static_cast<int8_t>(w[2 + j]) * x[i].qs[j];
    acc += combine_q32(f16_to_f32(load_u16(w)), x[i].d, s);
  }
  return acc;
}

float dot_q5_0(const uint8_t* w, const uint8_t* xq, long long nb) {
  const auto* x = reinterpret_cast<const XQ32*>(xq);
  float acc = 0;
  for (long long i = 0; i < nb; ++i, w += 22) {
    int q[32];
    unpack_q5(w + 2, w + 6, q);
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) s += (q[j] - 16) * x[i].qs[j];
    acc += combine_q32(f16_to_f32(load_u16(w)), x[i].d, s);
  }
  return acc;
}

float dot_q5_1(const uint8_t* w, const uint8_t* xq, long long nb) {
  const auto* x = reinterpret_cast<const XQ32*>(xq);
  float acc = 0;
  for (long long i = 0; i < nb; ++i, w += 24) {
    int q[32];
    unpack_q5(w + 4, w + 8, q);
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) s += q[j] * x[i].qs[j];
    acc += combine_q51(f16_to_f32(load_u16(w)), f16_to_f32(load_u16(w + 2)), x[i].d, s, x[i].sum);
  }
  return acc;
}

template <bool kFive>
float dot_qkx(const uint8_t* w, const uint8_t* xq, long long nb) {
  const auto* x = reinterpret_cast<const XQK*>(xq);
  constexpr long long kBytes = kFive ? 176 : 144;
  float acc = 0;
  for (long long i = 0; i < nb; ++i, w += kBytes) {
    const uint8_t* qh = kFive ? w + 16 : nullptr;
    const uint8_t* qs = w + (kFive ? 48 : 16);
    int32_t sumi = 0, summ = 0;
    for (int s = 0; s < 8; ++s) {
      int sc, m;
      scale_min_k4(s, w + 4, &sc, &m);
      int32_t dot = 0;
      for (int l = 0; l < 32; ++l) {
        int v = (qs[32 * (s / 2) + l] >> ((s & 1) * 4)) & 0xF;
        if (kFive) v |= ((qh[l] >> s) & 1) << 4;
        dot += v * x[i].qs[32 * s + l];
      }
      sumi += sc * dot;
      summ += m * (x[i].bsums[2 * s] + x[i].bsums[2 * s + 1]);
    }
    acc += combine_qkx(f16_to_f32(load_u16(w)), f16_to_f32(load_u16(w + 2)), x[i].d, sumi, summ);
  }
  return acc;
}

float dot_q6_k(const uint8_t* w, const uint8_t* xq, long long nb) {
  const auto* x = reinterpret_cast<const XQK*>(xq);
  float acc = 0;
  for (long long i = 0; i < nb; ++i, w += 210) {
    const auto* sc = reinterpret_cast<const int8_t*>(w + 192);
    int8_t q[256];
    unpack_q6(w, q);
    int32_t sumi = 0;
    for (int g = 0; g < 16; ++g) {
      int32_t dot = 0;
      for (int p = 16 * g; p < 16 * g + 16; ++p) dot += q[p] * x[i].qs[p];
      sumi += sc[g] * dot;
    }
    acc += combine_q6k(f16_to_f32(load_u16(w + 208)), x[i].d, sumi);
  }
  return acc;
}

}  // namespace

void dequantize_row(Format f, const uint8_t* b, long long k, float* y) {
  const long long nb = k / format_elements(f), bytes = format_bytes(f);
  for (long long i = 0; i < nb; ++i, b += bytes, y += format_elements(f)) {
    switch (f) {
      case Format::kQ4_0:
        dequant_q4_0(b, y);
        break;
      case Format::kQ8_0:
        dequant_q8_0(b, y);
        break;
      case Format::kQ4_K:
        dequant_qkx(b, nullptr, b + 16, y);
        break;
      case Format::kQ5_K:
        dequant_qkx(b, b + 16, b + 48, y);
        break;
      case Format::kQ6_K:
        dequant_q6_k(b, y);
        break;
      case Format::kQ5_0:
        dequant_q5_0(b, y);
        break;
      case Format::kQ5_1:
        dequant_q5_1(b, y);
        break;
    }
  }
}

void quantize_row(Format f, const float* x, long long k, uint8_t* b) {
  const long long nb = k / format_elements(f), bytes = format_bytes(f);
  for (long long i = 0; i < nb; ++i, b += bytes, x += format_elements(f)) {
    switch (f) {
      case Format::kQ4_0:
        quant_q4_0(x, b);
        break;
      case Format::kQ8_0:
        quant_q8_0(x, b);
        break;
      case Format::kQ4_K:
        quant_qkx(x, 15, b, nullptr, b + 16);
        break;
      case Format::kQ5_K:
        quant_qkx(x, 31, b, b + 16, b + 48);
        break;
      case Format::kQ6_K:
        quant_q6_k(x, b);
        break;
      case Format::kQ5_0:
        quant_q5_0(x, b);
        break;
      case Format::kQ5_1:
        quant_q5_1(x, b);
        break;
    }
  }
}

void quantize_x(Format f, const float* x, long long k, void* out) {
  if (format_elements(f) == kQ32) {
    auto* blocks = static_cast<XQ32*>(out);
    for (long long i = 0; i < k / kQ32; ++i) {
      blocks[i].d = quantize_block_x(x + i * kQ32, 32, blocks[i].qs);
      int32_t sum = 0;
      for (int j = 0; j < 32; ++j) sum += blocks[i].qs[j];
      blocks[i].sum = sum;
    }
    return;
  }
  auto* blocks = static_cast<XQK*>(out);
  for (long long i = 0; i < k / kQK; ++i) {
    blocks[i].d = quantize_block_x(x + i * kQK, 256, blocks[i].qs);
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += blocks[i].qs[16 * g + j];
      blocks[i].bsums[g] = static_cast<int16_t>(sum);
    }
  }
}

void round_x(Format f, const float* x, long long k, float* out) {
  const long long block = x_block(f);
  int8_t q[kQK];
  for (long long i = 0; i < k; i += block) {
    const float d = quantize_block_x(x + i, static_cast<int>(block), q);
    for (long long j = 0; j < block; ++j) out[i + j] = static_cast<float>(q[j]) * d;
  }
}

const QuantRowsFn quant_rows_scalar[kFormats] = {
    &dot_rows<&dot_q4_0, Format::kQ4_0>,       &dot_rows<&dot_q8_0, Format::kQ8_0>,
    &dot_rows<&dot_qkx<false>, Format::kQ4_K>, &dot_rows<&dot_qkx<true>, Format::kQ5_K>,
    &dot_rows<&dot_q6_k, Format::kQ6_K>,       &dot_rows<&dot_q5_0, Format::kQ5_0>,
    &dot_rows<&dot_q5_1, Format::kQ5_1>};

}  // namespace promptcache::kernels::quant
