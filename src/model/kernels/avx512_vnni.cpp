// src/model/kernels/avx512_vnni.cpp — the Q8 kernel of avx512.cpp with AVX-512 VNNI: up to
// kQ8DotMaxRows rows of x (a decode step), each 32-value block's integer dot product takes one
// vpdpbusd where AVX2 needs vpmaddubsw and vpmaddwd; the sums are the same integers, so the
// output equals avx512.cpp's bitwise. More rows run the AVX-512F code unchanged.
//
// Compiled with -mavx512f -mavx512vl -mavx512vnni; cpu_linear.cpp calls it only under the
// avx512-bf16 setting and where CPUID reports AVX512_VNNI.
#include "kernels.hpp"

#if defined(__x86_64__) && defined(__AVX512F__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#include <immintrin.h>

#include "avx512_vec.hpp"

#define PROMPTCACHE_LINEAR_Q8_ONLY 1
#include "linear_kernel.inl"

namespace promptcache::kernels {
const LinearRowsQ8Fn linear_rows_q8_avx512vnni = &linear_rows_q8;
}  // namespace promptcache::kernels
#else
namespace promptcache::kernels {
const LinearRowsQ8Fn linear_rows_q8_avx512vnni = nullptr;
}  // namespace promptcache::kernels
#endif
