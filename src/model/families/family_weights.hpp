// src/model/families/family_weights.hpp — the checkpoints of the families whose tensors are not
// named (or fused) as the Llama layer's: BLOOM, MPT, Falcon. Each family's unit (bloom.cpp,
// mpt.cpp, falcon.cpp) is one table of its tensor names and shapes and the name each takes in
// the layer LlamaModel runs; this unit reads a checkpoint through such a table (renaming, and
// splitting a fused QKV into q/k/v as FusedQkv says) and lists it for make-model. Private to the
// library.
#pragma once

#include <torch/types.h>

#include <map>
#include <string>
#include <vector>

#include "promptcache/model/config.hpp"

namespace promptcache::family_weights {

// kFusedQkv: a fused query_key_value (weight or bias) split into q_proj, k_proj, v_proj of
// `target` (which then ends in "self_attn."), as the config's FusedQkv says.
enum class Kind { kMatrix, kNorm, kBias, kFusedQkv, kFusedQkvBias };

struct Entry {
  std::string source;  // the checkpoint's name ("transformer." prefixes may be absent there)
  std::string target;  // the layer's name (model.layers.N.self_attn.o_proj.weight)
  std::vector<int64_t> shape;
  Kind kind;
};

// The table of a family (empty for the Llama-layer families, whose checkpoints already use the
// layer's names).
std::vector<Entry> entries(const ModelConfig& config);
std::vector<Entry> bloom_entries(const ModelConfig& config);
std::vector<Entry> mpt_entries(const ModelConfig& config);
std::vector<Entry> falcon_entries(const ModelConfig& config);

// The checkpoint's tensors under the layer's names (fused QKV split, views where the layout
// allows); `w` itself for the Llama-layer families. Error(kModel) naming `origin` and the tensor
// for a missing tensor or a shape that is not the config's.
std::map<std::string, torch::Tensor> layer_tensors(const ModelConfig& config,
                                                   const std::map<std::string, torch::Tensor>& w,
                                                   const std::string& origin);

}  // namespace promptcache::family_weights
