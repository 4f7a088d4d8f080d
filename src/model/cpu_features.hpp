// src/model/cpu_features.hpp — processor features read from CPUID where the compiler's
// __builtin_cpu_supports does not know them (F16C on clang 14, AVX512_BF16 on older compilers).
// Internal to the library's CPU units (cpu_linear.cpp, blas_core.cpp).
#pragma once

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace promptcache::cpu {

#if defined(__x86_64__)
// F16C from CPUID (leaf 1, ECX bit 29). The AVX state it needs is enabled wherever an AVX2 or
// AVX-512 check of __builtin_cpu_supports passes.
inline bool has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

// AVX512_BF16 (vdpbf16ps, vcvtne2ps2bf16): CPUID leaf 7 subleaf 1, EAX bit 5, with AVX-512
// F/BW/VL (leaf 7 subleaf 0, EBX bits 16, 30, 31), and the OS saving the opmask and zmm state
// (OSXSAVE, then XCR0 bits 1, 2, 5, 6, 7).
inline bool has_avx512_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & bit_OSXSAVE) == 0) return false;
  unsigned xcr0_low = 0, xcr0_high = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  constexpr unsigned kZmmState = 0xe6;  // SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM
  if ((xcr0_low & kZmmState) != kZmmState) return false;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  constexpr unsigned kF = 1u << 16, kBw = 1u << 30, kVl = 1u << 31;
  if ((ebx & (kF | kBw | kVl)) != (kF | kBw | kVl)) return false;
  __cpuid_count(7, 1, eax, ebx, ecx, edx);
  return (eax & (1u << 5)) != 0;
}
#endif

}  // namespace promptcache::cpu
