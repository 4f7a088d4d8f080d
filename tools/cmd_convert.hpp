// tools/cmd_convert.hpp — `promptcache convert` (a HuggingFace folder to a GGUF file).
#pragma once

#include "cli_common.hpp"

namespace promptcache::cli {

Command register_convert(CLI::App& root);

}  // namespace promptcache::cli
