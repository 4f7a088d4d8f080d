// src/model/families/family_configs.hpp — the families whose config.json does not use the Llama
// layer's keys (BLOOM, MPT, Falcon): one unit each (bloom_config.cpp, mpt_config.cpp,
// falcon_config.cpp) turns its keys into a ModelConfig, FamilyTraits included, and writes them
// back. config.cpp dispatches to them by architecture. Private to the library; no LibTorch
// (these units live in promptcache_core with config.cpp).
#pragma once

#include <string>

#include "../config_reader.hpp"
#include "promptcache/model/config.hpp"

namespace promptcache::family_configs {

struct FamilyConfig {
  const char* architecture;
  const char* model_type;
  // Sets the shape, norm epsilon, positions and traits of `c` from config.json's keys (r);
  // config.cpp reads the keys every family shares (token ids, torch_dtype) and validates after.
  // Error(kModel) naming the file and the field for anything the layer does not run.
  void (*read)(const config_reader::Reader& r, ModelConfig& c, const std::string& origin);
  // The family's own keys for `c` (what read takes back).
  void (*write)(const ModelConfig& c, config_reader::json& j);
};

extern const FamilyConfig kBloom;
extern const FamilyConfig kMpt;
extern const FamilyConfig kFalcon;

// The family of this architecture name; nullptr for the Llama-layer families.
const FamilyConfig* find(const std::string& architecture);
// The family whose model_type this is; nullptr otherwise.
const FamilyConfig* find_model_type(const std::string& model_type);

// `value` (config.json's field `field`) times `factor`, Error(kModel) naming the field when the
// product would leave 2^40 (far above any model's sizes; a fuzzed config.json must not overflow).
int64_t scaled_size(int64_t value, int64_t factor, const char* field, const std::string& origin);

// The first of `keys` present (not null) as an integer; Error(kModel) naming the first key when
// none is.
int64_t integer_of(const config_reader::Reader& r, std::initializer_list<const char*> keys);

}  // namespace promptcache::family_configs
