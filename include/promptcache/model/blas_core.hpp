// promptcache/model/blas_core.hpp — which kernels OpenBLAS runs the long GEMMs with.
//
// OpenBLAS picks its kernels ("core") from the processor's model number when it loads. A model
// it does not know falls back to generic SSE3 kernels ("Prescott") even on a processor with
// AVX-512: measured on a 2-core Xeon (Debian's OpenBLAS 0.3.21), the f32 GEMM ran at 70 GFLOPS
// instead of 290 and a 512-token prefill at a third of its speed. select_blas_core() then
// switches OpenBLAS to the kernels the processor's own feature flags allow (Cooperlake with
// AVX512_BF16, SkylakeX with AVX-512, Haswell with AVX2 + FMA). It leaves every choice OpenBLAS
// made from a model it knows alone, and a core the user named in OPENBLAS_CORETYPE.
#pragma once

#include <string>

namespace promptcache {

struct BlasCore {
  bool openblas = false;  // OpenBLAS with run-time kernel selection was found
  std::string detected;   // the kernels OpenBLAS chose itself when it loaded
  std::string core;       // the kernels in use now
  bool switched = false;  // select_blas_core() changed them
  std::string note;       // why they are what they are, for `promptcache info` and logs
};

// The first call decides and may switch OpenBLAS's kernels; later calls return that result.
// It must run before any BLAS work is in flight on another thread: configure_threads() calls it,
// and every promptcache executable calls that at its start. Nothing happens without OpenBLAS.
// With `may_switch` false the first call only records OpenBLAS's choice, with `why_not` as the
// note (the Python module, imported while other threads run, cannot know none is in a GEMM).
const BlasCore& select_blas_core(bool may_switch = true, const std::string& why_not = "");

// What select_blas_core() switches to: the core the processor's features allow (`avx2_fma`,
// `avx512`: F, CD, BW, DQ and VL, `avx512_bf16`) when `detected` is a generic core below it
// (SSE-only or AVX without AVX2), else "" (keep it). Case-insensitive on `detected`.
std::string better_blas_core(const std::string& detected, bool avx2_fma, bool avx512,
                             bool avx512_bf16);

}  // namespace promptcache
