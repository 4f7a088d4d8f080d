// Switching OpenBLAS's kernels when it fell back to generic ones (promptcache/model/blas_core.hpp).
// OpenBLAS is reached through LibTorch's libblas.so.3, so its functions are looked up at run
// time: gotoblas_dynamic_quit() forgets the chosen kernel table and gotoblas_dynamic_init()
// chooses again, reading OPENBLAS_CORETYPE as it does when the library loads.
#include "promptcache/model/blas_core.hpp"

#include <dlfcn.h>
#include <strings.h>

#include <cstdlib>
#include <mutex>

#include "cpu_features.hpp"

namespace promptcache {
namespace {

// How wide a core's vectors are: 0 SSE only, 1 AVX, 2 AVX2 + FMA, 3 AVX-512; -1 unknown.
int core_width(const std::string& name) {
  auto is = [&](const char* n) { return strcasecmp(name.c_str(), n) == 0; };
  for (const char* n : {"SkylakeX", "Cooperlake", "SapphireRapids"}) {
    if (is(n)) return 3;
  }
  for (const char* n : {"Haswell", "Zen", "Excavator"}) {
    if (is(n)) return 2;
  }
  for (const char* n : {"Sandybridge", "Bulldozer", "Piledriver", "Steamroller"}) {
    if (is(n)) return 1;
  }
  for (const char* n : {"Katmai", "Coppermine", "Northwood", "Prescott", "Banias", "Atom", "Core2",
                        "Penryn", "Dunnington", "Nehalem", "Athlon", "Opteron", "Opteron_SSE3",
                        "Barcelona", "Nano", "Bobcat"}) {
    if (is(n)) return 0;
  }
  return -1;
}

using CoreName = char* (*)();
using Hook = void (*)();

template <typename F>
F lookup(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
}

BlasCore decide(bool may_switch, const std::string& why_not) {
  BlasCore out;
  const auto corename = lookup<CoreName>("openblas_get_corename");
  const auto quit = lookup<Hook>("gotoblas_dynamic_quit");
  const auto init = lookup<Hook>("gotoblas_dynamic_init");
  if (corename == nullptr) {
    out.note = "not OpenBLAS";
    return out;
  }
  out.detected = out.core = corename();
  if (quit == nullptr || init == nullptr) {
    out.note = "OpenBLAS built for one processor (no run-time kernel choice)";
    return out;
  }
  out.openblas = true;
  if (!may_switch) {
    out.note = why_not;
    return out;
  }
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) {
    out.note = "as OPENBLAS_CORETYPE says";
    return out;
  }
#if defined(__x86_64__)
  const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("avx512vl");
  const std::string target =
      better_blas_core(out.detected, avx2_fma, avx512, avx512 && cpu::has_avx512_bf16());
#else
  const std::string target;
#endif
  if (target.empty()) {
    out.note = "chosen by OpenBLAS";
    return out;
  }
  // OpenBLAS reads the variable while it chooses; it is removed again so that processes started
  // from this one choose for themselves.
  setenv("OPENBLAS_CORETYPE", target.c_str(), 1);
  quit();
  init();
  unsetenv("OPENBLAS_CORETYPE");
  out.core = corename();
  if (core_width(out.core) > core_width(out.detected)) {
    out.switched = true;
    out.note = "OpenBLAS chose generic " + out.detected + " kernels for this processor; " +
               "switched to " + out.core + " by its features (set OPENBLAS_CORETYPE to choose)";
  } else {
    // Not wider than before, whatever happened: back to OpenBLAS's own choice.
    quit();
    init();
    out.core = corename();
    out.note = "OpenBLAS kept " + out.core + " (switching to " + target + " did not take)";
  }
  return out;
}

}  // namespace

std::string better_blas_core(const std::string& detected, bool avx2_fma, bool avx512,
                             bool avx512_bf16) {
  const int width = core_width(detected);
  // A core OpenBLAS chose from a model it knows (AVX2 or wider), or one this list does not
  // know, stays.
  if (width < 0 || width >= 2) return "";
  if (avx512 && avx512_bf16) return "Cooperlake";
  if (avx512) return "SkylakeX";
  if (avx2_fma) return "Haswell";
  return "";
}

const BlasCore& select_blas_core(bool may_switch, const std::string& why_not) {
  static std::once_flag once;
  static BlasCore chosen;
  std::call_once(once, [&] { chosen = decide(may_switch, why_not); });
  return chosen;
}

}  // namespace promptcache
