// tests/fuzz/cpu_supports_compat.hpp — force-included into src/model/cpu_linear.cpp in the fuzz
// build only (CMakeLists.txt, PROMPTCACHE_FUZZ), because clang 14 refuses
// __builtin_cpu_supports("f16c") ("invalid cpu feature string for builtin"; GCC knows it), so
// the library does not compile with clang at all. The real fix belongs in cpu_linear.cpp (read
// F16C from CPUID there, see docs/fuzzing.md); until then this answers the same question from
// CPUID and XCR0 for the features that file asks about.
#pragma once

#include <cpuid.h>

#include <cstring>

namespace promptcache_fuzz_compat {

inline unsigned long long xcr0() {
  unsigned eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<unsigned long long>(edx) << 32) | eax;
}

inline bool cpu_supports(const char* feature) {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool osxsave = (c & bit_OSXSAVE) != 0;
  const bool ymm = osxsave && (xcr0() & 0x6) == 0x6;    // SSE and AVX state enabled by the OS
  const bool zmm = osxsave && (xcr0() & 0xe6) == 0xe6;  // and the AVX-512 state
  const bool avx = ymm && (c & bit_AVX) != 0;
  if (std::strcmp(feature, "f16c") == 0) return avx && (c & bit_F16C) != 0;
  if (std::strcmp(feature, "fma") == 0) return avx && (c & bit_FMA) != 0;
  unsigned a7 = 0, b7 = 0, c7 = 0, d7 = 0;
  if (!__get_cpuid_count(7, 0, &a7, &b7, &c7, &d7)) return false;
  if (std::strcmp(feature, "avx2") == 0) return avx && (b7 & bit_AVX2) != 0;
  if (std::strcmp(feature, "avx512f") == 0) return zmm && (b7 & bit_AVX512F) != 0;
  return false;  // a feature this shim does not know: take the portable path
}

}  // namespace promptcache_fuzz_compat

#define __builtin_cpu_supports(feature) ::promptcache_fuzz_compat::cpu_supports(feature)
