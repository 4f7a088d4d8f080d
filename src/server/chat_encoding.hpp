// The token ids of a chat request without prompt modules (the plain model; BatchSession::
// admit_tokens runs them, reusing the longest prefix of the previous such request).
#pragma once

#include <vector>

#include "promptcache/engine.hpp"

namespace promptcache::server {

// The ids of a chat without modules: BOS (when the tokenizer adds one), each turn wrapped by the
// chat template as PML wraps a prompt's turns, then the generation prompt after a final user
// turn. Turn texts are whitespace-compacted at their edges as PML text is.
std::vector<TokenId> encode_chat(const Tokenizer& tokenizer, const pml::ChatTemplate& tmpl,
                                 const std::vector<pml::Turn>& turns);

}  // namespace promptcache::server
