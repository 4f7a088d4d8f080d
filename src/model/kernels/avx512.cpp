// src/model/kernels/avx512.cpp — the CPU kernels for AVX-512F (16 floats per register).
// Linear: 4 weight rows x 6 tokens = 24 of the 32 registers hold sums; from 13 rows of x on,
// 12 weight rows x 16 tokens (or 6 x 32) = 12 sums along the lanes. Attention: 24 sums,
// 3 vectors of query rows (48 rows) x 8 keys or value columns; a decode step's values 6 rows x
// 4 vectors (a 64-wide head).
#include "kernels.hpp"

#if defined(__x86_64__) && defined(__AVX512F__)
#include <immintrin.h>

#include "avx512_vec.inl"

#include "linear_kernel.inl"

// After linear_kernel.inl: the attention computes a decode step's scores with linear_rows.
#include "attention_kernel.inl"

namespace promptcache::kernels {
const LinearRowsFn linear_rows_avx512 = &linear_rows;
const LinearRowsBf16Fn linear_rows_bf16_avx512 = &linear_rows_bf16;
const LinearRowsF16Fn linear_rows_f16_avx512 = &linear_rows_f16;
const WidenOf<Bf16> widen_bf16_avx512 = &widen_bf16;
const WidenOf<F16> widen_f16_avx512 = &widen_f16;
const LinearRowsQ8Fn linear_rows_q8_avx512 = &linear_rows_q8;
const WidenQ8Fn widen_q8_avx512 = &widen_q8;
const AttendRowsFn attend_rows_avx512 = &attend_rows;
static_assert(Vec::kWidth == kAvx512Width);
}  // namespace promptcache::kernels
#else
namespace promptcache::kernels {
const LinearRowsFn linear_rows_avx512 = nullptr;
const LinearRowsBf16Fn linear_rows_bf16_avx512 = nullptr;
const LinearRowsF16Fn linear_rows_f16_avx512 = nullptr;
const WidenOf<Bf16> widen_bf16_avx512 = nullptr;
const WidenOf<F16> widen_f16_avx512 = nullptr;
const LinearRowsQ8Fn linear_rows_q8_avx512 = nullptr;
const WidenQ8Fn widen_q8_avx512 = nullptr;
const AttendRowsFn attend_rows_avx512 = nullptr;
}  // namespace promptcache::kernels
#endif
