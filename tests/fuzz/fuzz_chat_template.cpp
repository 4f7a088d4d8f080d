// libFuzzer target "chat_template" (see fuzz_entries.hpp; scripts/fuzz.sh builds and runs it).
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_entries.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  promptcache::fuzz::chat_template_entry(data, size);
  return 0;
}
