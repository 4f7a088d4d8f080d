// src/core/sentencepiece_data.hpp — the fields of a SentencePiece ModelProto that the tokenizer
// uses, parsed from the protobuf bytes of a tokenizer.model (private to
// promptcache_core). GGUF files carry the same vocabulary as metadata (tokenizer.ggml.*):
// gguf_tokenizer.cpp converts between the two through this struct.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "promptcache/model/tokenizer.hpp"

namespace promptcache::detail {

struct SentencePieceData {
  struct Piece {
    std::string text;
    float score = 0;
    int type = 1;  // 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
  };
  std::vector<Piece> pieces;
  int model_type = 1;  // the proto's default (UNIGRAM); 2 = BPE
  bool byte_fallback = false;
  // As stored: the proto's defaults when absent; values outside the vocabulary mean none.
  int32_t unk_id = 0, bos_id = 1, eos_id = 2, pad_id = -1;
  std::string normalizer_name, charmap;
  bool add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
};

// Error(kTokenizer) naming `origin` for bytes that are not a ModelProto.
SentencePieceData parse_sentencepiece_model(const std::string& bytes, const std::string& origin);
// The tokenizer of parsed (or assembled) data: what load_sentencepiece_tokenizer_from_bytes gives
// for the bytes `data` came from. Error(kTokenizer) naming `origin` as that function does.
std::unique_ptr<Tokenizer> sentencepiece_tokenizer_from_data(SentencePieceData data,
                                                             const std::string& origin);

}  // namespace promptcache::detail
