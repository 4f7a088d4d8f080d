// src/model/kernels/linear_kernels.hpp — entry points of the per-ISA small-row linear kernels
// (see linear_kernel.inl). Private to the library; src/model/cpu_linear.cpp dispatches to them.
#pragma once

namespace promptcache::kernels {

// out[t * ldo + j] = sum_i x[t * k + i] * w[j * k + i] for t in [0, m) and j in [n0, n1).
// x is m x k, w is (at least n1) x k, both row-major and dense; f32.
using LinearRowsFn = void (*)(const float* x, long long m, long long k, const float* w,
                              long long n0, long long n1, float* out, long long ldo);

// Compiled with AVX-512F / with AVX2+FMA enabled; call only where the CPU has them. Null on
// processors for which these kernels are not built.
extern const LinearRowsFn linear_rows_avx512;
extern const LinearRowsFn linear_rows_avx2;

}  // namespace promptcache::kernels
