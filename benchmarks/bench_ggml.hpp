// Benchmarks' names for GGML's block types (promptcache/model/ggml_quant.hpp): q4_0, q8_0, q4_k,
// q5_k, q6_k on the command line, as --dtypes/--weights take them.
#pragma once

#include <cctype>
#include <optional>
#include <string>

#include "promptcache/model/ggml_quant.hpp"

namespace promptcache::bench {

// The block type a lower-case name stands for (nullopt: not one).
inline std::optional<ggml::Type> block_type_named(const std::string& name) {
  for (auto t :
       {ggml::Type::Q4_0, ggml::Type::Q8_0, ggml::Type::Q4_K, ggml::Type::Q5_K, ggml::Type::Q6_K}) {
    std::string lower(ggml::type_name(t));
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower == name) return t;
  }
  return std::nullopt;
}

}  // namespace promptcache::bench
