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

#define PROMPTCACHE_ISA_BUILT
#endif

#define PROMPTCACHE_ISA avx512
#define PROMPTCACHE_ISA_WIDTH kAvx512Width
#include "isa_exports.inl"
