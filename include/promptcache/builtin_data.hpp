// promptcache/builtin_data.hpp — data compiled into the library.
#pragma once

namespace promptcache {
// English text (data/corpus.txt) used to train the tokenizer of synthetic models and tests.
const char* builtin_corpus();
}  // namespace promptcache
