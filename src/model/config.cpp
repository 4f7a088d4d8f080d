// config.cpp — HF config.json parsing and writing: the Llama-layer families' keys (Llama,
// Mistral, Qwen2, Qwen3) turned into FamilyTraits here, the other families' (BLOOM, MPT, Falcon)
// by their units in families/*_config.cpp; the keys every family shares, the ALiBi slopes and
// the checks of the result (validate) for all of them.
#include "promptcache/model/config.hpp"

#include "config_reader.hpp"
#include "families/family_configs.hpp"
#include "promptcache/error.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

namespace promptcache {
namespace {

using json = nlohmann::json;
using config_reader::fail;
using config_reader::Reader;

struct Arch {
  const char* architecture;
  const char* model_type;
};
const Arch kArchitectures[] = {{"LlamaForCausalLM", "llama"},
                               {"MistralForCausalLM", "mistral"},
                               {"Qwen2ForCausalLM", "qwen2"},
                               {"Qwen3ForCausalLM", "qwen3"}};

// Far above any real model (the largest have ~130 layers), far below what per-layer tables
// cost: a config.json claiming 10^11 layers built a flag per layer for minutes and gigabytes
// (found reading the code beside the config_json fuzz target; regression
// tests/fuzz/regressions/config_json/qwen-window-layers-huge-count).
constexpr int64_t kMaxHiddenLayers = 65536;

void check_layer_count(int64_t layers, const std::string& origin) {
  if (layers > kMaxHiddenLayers) {
    fail(origin, "field 'num_hidden_layers' (" + std::to_string(layers) + ") is more than the " +
                     std::to_string(kMaxHiddenLayers) + " layers a model may have");
  }
}

RopeScaling parse_rope_scaling(const json& v, const std::string& origin) {
  RopeScaling rs;
  if (v.is_null()) return rs;
  if (!v.is_object()) {
    fail(origin,
         std::string("field 'rope_scaling' must be an object or null, got ") + v.type_name());
  }
  Reader r(v, origin);
  std::string type = r.string("rope_type", "");
  if (type.empty()) type = r.string("type", "");
  if (type.empty()) fail(origin, "field 'rope_scaling' needs a 'rope_type' (or 'type')");
  auto need_number = [&](const char* key) {
    if (!r.has(key))
      fail(origin, std::string("field 'rope_scaling.") + key + "' is required for " + type);
    return r.number(key, r[key]);
  };
  if (type == "default") return rs;
  if (type == "dynamic") {
    rs.type = RopeScaling::Type::kDynamic;
    rs.factor = need_number("factor");
  } else if (type == "linear") {
    rs.type = RopeScaling::Type::kLinear;
    rs.factor = need_number("factor");
  } else if (type == "llama3") {
    rs.type = RopeScaling::Type::kLlama3;
    rs.factor = need_number("factor");
    rs.low_freq_factor = need_number("low_freq_factor");
    rs.high_freq_factor = need_number("high_freq_factor");
    if (!r.has("original_max_position_embeddings")) {
      fail(origin, "field 'rope_scaling.original_max_position_embeddings' is required for llama3");
    }
    rs.original_max_position_embeddings = r.integer("original_max_position_embeddings");
  } else {
    fail(origin, "field 'rope_scaling' has unsupported type '" + type +
                     "' (supported: default, linear, dynamic, llama3)");
  }
  return rs;
}

// The family switches: Llama's attention_bias/mlp_bias, Qwen2's q/k/v biases, Qwen3's per-head
// q/k norms, and the sliding window of Mistral (every layer) or of Qwen with use_sliding_window
// (layers from max_window_layers on, or as layer_types lists them).
FamilyTraits parse_traits(const Reader& r, const json& j, const std::string& model_type,
                          int64_t layers, const std::string& origin) {
  FamilyTraits t;
  const bool qwen = model_type == "qwen2" || model_type == "qwen3";
  if (model_type == "llama" || model_type == "qwen3") {
    t.qkv_bias = t.o_bias = r.boolean("attention_bias", false);
  }
  if (model_type == "qwen2") t.qkv_bias = true;  // Qwen2 always has them, o_proj never
  if (model_type == "llama") t.mlp_bias = r.boolean("mlp_bias", false);
  t.qk_norm = model_type == "qwen3";
  const bool windowed = model_type == "mistral" || (qwen && r.boolean("use_sliding_window", false));
  if (windowed && r.has("sliding_window")) {
    t.sliding_window = r.integer("sliding_window");
    if (t.sliding_window <= 0) {
      fail(origin, "field 'sliding_window' must be positive or null, got " +
                       std::to_string(t.sliding_window));
    }
  }
  if (t.sliding_window == 0) return t;
  if (r.has("layer_types")) {
    const json& types = j["layer_types"];
    if (!types.is_array() || static_cast<int64_t>(types.size()) != layers) {
      fail(origin,
           "field 'layer_types' must list one type per layer (" + std::to_string(layers) + ")");
    }
    for (const json& type : types) {
      if (!type.is_string() || (type != "sliding_attention" && type != "full_attention")) {
        fail(origin, "field 'layer_types' holds " + type.dump() +
                         " (expected \"sliding_attention\" or \"full_attention\")");
      }
      t.sliding_layers.push_back(type == "sliding_attention");
    }
  } else if (qwen) {
    check_layer_count(layers, origin);  // one flag per layer below
    const int64_t first = r.integer("max_window_layers", 0);
    for (int64_t i = 0; i < layers; ++i) t.sliding_layers.push_back(i >= first);
  }
  return t;
}

// The keys every family reads alike: BOS/EOS ids, torch_dtype, the chat template's name.
void read_shared_fields(const Reader& r, const json& j, ModelConfig& c) {
  c.bos_token_id = r.integer("bos_token_id", c.bos_token_id);
  if (j.contains("eos_token_id")) {
    const json& e = j["eos_token_id"];
    c.eos_token_ids.clear();
    if (e.is_array()) {
      for (const json& id : e) c.eos_token_ids.push_back(r.integer("eos_token_id", id));
    } else if (!e.is_null()) {
      c.eos_token_ids.push_back(r.integer("eos_token_id", e));
    }
  }
  c.torch_dtype = r.string("torch_dtype", c.torch_dtype);
  c.chat_template = r.string("promptcache_chat_template", "");
}

}  // namespace

namespace family_configs {

const FamilyConfig* find(const std::string& architecture) {
  for (const FamilyConfig* f : {&kBloom, &kMpt, &kFalcon}) {
    if (architecture == f->architecture) return f;
  }
  return nullptr;
}

const FamilyConfig* find_model_type(const std::string& model_type) {
  for (const FamilyConfig* f : {&kBloom, &kMpt, &kFalcon}) {
    if (model_type == f->model_type) return f;
  }
  return nullptr;
}

int64_t scaled_size(int64_t value, int64_t factor, const char* field, const std::string& origin) {
  constexpr int64_t kLimit = int64_t{1} << 40;
  if (value <= 0 || factor <= 0 || value > kLimit / factor) {
    fail(origin, std::string("field '") + field + "' (" + std::to_string(value) +
                     ") must be positive and at most " + std::to_string(kLimit / factor));
  }
  return value * factor;
}

int64_t integer_of(const Reader& r, std::initializer_list<const char*> keys) {
  for (const char* key : keys) {
    if (r.has(key)) return r.integer(key);
  }
  return r.integer(*keys.begin());  // missing: the error names the first
}

}  // namespace family_configs

std::string supported_architectures() {
  std::string out;
  for (const auto& a : kArchitectures) {
    if (!out.empty()) out += ", ";
    out += a.architecture;
  }
  for (const auto* f : {&family_configs::kBloom, &family_configs::kMpt, &family_configs::kFalcon}) {
    out += std::string(", ") + f->architecture;
  }
  return out;
}

std::vector<double> alibi_slopes(int64_t heads, double alibi_bias_max) {
  std::vector<double> slopes;
  if (heads <= 0) return slopes;
  int64_t pow2 = 1;  // MPT: the power of two at or above heads; BLOOM: at or below
  if (alibi_bias_max > 0) {
    while (pow2 < heads) pow2 *= 2;
    std::vector<double> all;
    for (int64_t i = 1; i <= pow2; ++i) {
      all.push_back(
          1.0 / std::pow(2.0, static_cast<double>(i) * alibi_bias_max / static_cast<double>(pow2)));
    }
    if (pow2 == heads) return all;
    for (int64_t i = 1; i < pow2; i += 2) slopes.push_back(all[static_cast<std::size_t>(i)]);
    for (int64_t i = 0; i < pow2; i += 2) slopes.push_back(all[static_cast<std::size_t>(i)]);
    slopes.resize(static_cast<std::size_t>(heads));
    return slopes;
  }
  while (pow2 * 2 <= heads) pow2 *= 2;
  const double base = std::pow(2.0, -8.0 / static_cast<double>(pow2));
  for (int64_t i = 1; i <= pow2; ++i) slopes.push_back(std::pow(base, static_cast<double>(i)));
  if (pow2 != heads) {
    const double extra = std::pow(2.0, -8.0 / static_cast<double>(2 * pow2));
    const int64_t remaining = std::min(pow2, heads - pow2);
    for (int64_t i = 0; i < remaining; ++i) {
      slopes.push_back(std::pow(extra, static_cast<double>(2 * i + 1)));
    }
  }
  return slopes;
}

std::string ModelConfig::default_chat_template() const {
  if (model_type == "qwen2" || model_type == "qwen3") return "chatml";
  if (model_type == "mistral") return "mistral";
  if (model_type == "mpt") return "chatml";  // MPT's chat models
  if (vocab_size >= 128000 || rope_scaling.type == RopeScaling::Type::kLlama3) return "llama-3";
  return "llama-2";
}

ModelConfig ModelConfig::from_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::kIo, "cannot read model config", SourceLocation{path, 0, 0, {}});
  std::ostringstream ss;
  ss << in.rdbuf();
  return from_json_string(ss.str(), path);
}

ModelConfig ModelConfig::from_json_string(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(origin, std::string("config is not valid JSON: ") + e.what());
  }
  if (!j.is_object())
    fail(origin, std::string("config must be a JSON object, got ") + j.type_name());
  Reader r(j, origin);
  ModelConfig c;

  // Architecture: the first entry of "architectures", else inferred from model_type.
  const std::string model_type = r.string("model_type", "");
  std::string arch;
  if (r.has("architectures")) {
    const json& a = j["architectures"];
    if (!a.is_array() || a.empty() || !a[0].is_string()) {
      fail(origin, "field 'architectures' must be a non-empty list of strings");
    }
    arch = a[0].get<std::string>();
  } else {
    for (const auto& k : kArchitectures) {
      if (model_type == k.model_type) arch = k.architecture;
    }
    if (const auto* f = family_configs::find_model_type(model_type)) arch = f->architecture;
    if (arch.empty()) {
      fail(origin, "missing field 'architectures' (and model_type '" + model_type +
                       "' is not one of llama, mistral, qwen2, qwen3, bloom, mpt, falcon)");
    }
  }
  // HF's MPT class is MptForCausalLM, MosaicML's MPTForCausalLM: one family.
  if (arch == "MptForCausalLM") arch = "MPTForCausalLM";
  const Arch* known = nullptr;
  for (const auto& k : kArchitectures) {
    if (arch == k.architecture) known = &k;
  }
  const family_configs::FamilyConfig* family = family_configs::find(arch);
  if (family != nullptr) {
    c.architecture = family->architecture;
    c.model_type = family->model_type;
    family->read(r, c, origin);
    if (c.traits.position == PositionKind::kRope && j.contains("rope_scaling")) {
      c.rope_scaling = parse_rope_scaling(j["rope_scaling"], origin);
    }
    read_shared_fields(r, j, c);
    c.validate(origin);
    return c;
  }
  if (!known) {
    fail(origin, "field 'architectures': unsupported architecture '" + arch +
                     "' (supported: " + supported_architectures() + ")");
  }
  c.architecture = known->architecture;
  // The architecture decides the family (and so which fields mean what), whatever model_type says.
  c.model_type = known->model_type;

  c.hidden_size = r.integer("hidden_size");
  c.intermediate_size = r.integer("intermediate_size");
  c.num_hidden_layers = r.integer("num_hidden_layers");
  c.num_attention_heads = r.integer("num_attention_heads");
  c.vocab_size = r.integer("vocab_size");
  c.num_key_value_heads = r.integer("num_key_value_heads", c.num_attention_heads);
  if (r.has("head_dim")) {
    c.head_dim = r.integer("head_dim");
  } else {
    if (c.num_attention_heads <= 0) {
      fail(origin, "field 'num_attention_heads' must be positive, got " +
                       std::to_string(c.num_attention_heads));
    }
    if (c.hidden_size % c.num_attention_heads != 0) {
      fail(origin, "field 'num_attention_heads' (" + std::to_string(c.num_attention_heads) +
                       ") does not divide field 'hidden_size' (" + std::to_string(c.hidden_size) +
                       ") and no 'head_dim' is given");
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  c.max_position_embeddings = r.integer("max_position_embeddings", c.max_position_embeddings);
  c.rms_norm_eps = r.number("rms_norm_eps", c.rms_norm_eps);
  c.rope_theta = r.number("rope_theta", c.rope_theta);
  if (j.contains("rope_scaling")) c.rope_scaling = parse_rope_scaling(j["rope_scaling"], origin);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", c.tie_word_embeddings);
  read_shared_fields(r, j, c);
  const std::string act = r.string("hidden_act", "silu");
  if (act != "silu") {
    fail(origin, "field 'hidden_act' is '" + act + "'; only 'silu' (SwiGLU) is supported");
  }
  c.traits = parse_traits(r, j, known->model_type, c.num_hidden_layers, origin);
  c.validate(origin);
  return c;
}

void ModelConfig::validate(const std::string& origin) const {
  auto positive = [&](const char* field, int64_t v) {
    if (v <= 0)
      fail(origin, std::string("field '") + field + "' must be positive, got " + std::to_string(v));
  };
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("head_dim", head_dim);
  positive("vocab_size", vocab_size);
  positive("max_position_embeddings", max_position_embeddings);
  check_layer_count(num_hidden_layers, origin);
  if (num_attention_heads % num_key_value_heads != 0) {
    fail(origin, "field 'num_key_value_heads' (" + std::to_string(num_key_value_heads) +
                     ") does not divide field 'num_attention_heads' (" +
                     std::to_string(num_attention_heads) + ")");
  }
  if (head_dim % 2 != 0) {
    fail(origin,
         "field 'head_dim' must be even for rotary embeddings, got " + std::to_string(head_dim));
  }
  if (!(rms_norm_eps > 0)) fail(origin, "field 'rms_norm_eps' must be positive");
  if (!(rope_theta > 0)) fail(origin, "field 'rope_theta' must be positive");
  if (rope_scaling.type != RopeScaling::Type::kNone && !(rope_scaling.factor > 0)) {
    fail(origin, "field 'rope_scaling.factor' must be positive");
  }
  if (rope_scaling.type == RopeScaling::Type::kLlama3) {
    if (!(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor)) {
      fail(origin, "field 'rope_scaling.high_freq_factor' must exceed 'low_freq_factor'");
    }
    if (rope_scaling.original_max_position_embeddings <= 0) {
      fail(origin, "field 'rope_scaling.original_max_position_embeddings' must be positive");
    }
  }
  if (traits.sliding_window < 0) fail(origin, "field 'sliding_window' must not be negative");
  if (!traits.sliding_layers.empty() &&
      static_cast<int64_t>(traits.sliding_layers.size()) != num_hidden_layers) {
    fail(origin, "field 'layer_types' must list one type per layer");
  }
  if (bos_token_id < 0 || bos_token_id >= vocab_size) {
    fail(origin,
         "field 'bos_token_id' (" + std::to_string(bos_token_id) + ") is outside the vocabulary");
  }
  for (int64_t id : eos_token_ids) {
    if (id < 0 || id >= vocab_size) {
      fail(origin, "field 'eos_token_id' (" + std::to_string(id) + ") is outside the vocabulary");
    }
  }
}

namespace {

// The keys every family writes alike (what read_shared_fields reads back).
void write_shared_fields(const ModelConfig& c, json& j) {
  j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else {
    j["eos_token_id"] = c.eos_token_ids;  // a list, or [] for none
  }
  j["torch_dtype"] = c.torch_dtype;
  if (!c.chat_template.empty()) j["promptcache_chat_template"] = c.chat_template;
}

}  // namespace

std::string ModelConfig::to_json_string() const {
  json j = json::object();
  j["architectures"] = json::array({architecture});
  j["model_type"] = model_type;
  if (const auto* family = family_configs::find(architecture)) {
    family->write(*this, j);
    write_shared_fields(*this, j);
    return j.dump(2) + "\n";
  }
  j["hidden_size"] = hidden_size;
  j["intermediate_size"] = intermediate_size;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_attention_heads"] = num_attention_heads;
  j["num_key_value_heads"] = num_key_value_heads;
  j["head_dim"] = head_dim;
  j["vocab_size"] = vocab_size;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rms_norm_eps"] = rms_norm_eps;
  j["rope_theta"] = rope_theta;
  switch (rope_scaling.type) {
    case RopeScaling::Type::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScaling::Type::kLinear:
    case RopeScaling::Type::kDynamic: {
      const char* type = rope_scaling.type == RopeScaling::Type::kLinear ? "linear" : "dynamic";
      j["rope_scaling"] = {{"rope_type", type}, {"type", type}, {"factor", rope_scaling.factor}};
      break;
    }
    case RopeScaling::Type::kLlama3:
      j["rope_scaling"] = {
          {"rope_type", "llama3"},
          {"factor", rope_scaling.factor},
          {"low_freq_factor", rope_scaling.low_freq_factor},
          {"high_freq_factor", rope_scaling.high_freq_factor},
          {"original_max_position_embeddings", rope_scaling.original_max_position_embeddings}};
      break;
  }
  j["hidden_act"] = "silu";
  // Each family's own fields for its traits (what parse_traits reads back).
  const FamilyTraits& t = traits;
  const json window = t.sliding_window > 0 ? json(t.sliding_window) : json(nullptr);
  if (model_type == "llama") {
    j["attention_bias"] = t.qkv_bias;
    j["mlp_bias"] = t.mlp_bias;
  } else if (model_type == "mistral") {
    j["sliding_window"] = window;
  } else {  // qwen2, qwen3
    if (model_type == "qwen3") j["attention_bias"] = t.qkv_bias;
    j["use_sliding_window"] = t.sliding_window > 0;
    j["sliding_window"] = window;
    j["max_window_layers"] = 0;  // with use_sliding_window: every layer, unless layer_types says
  }
  if (t.sliding_window > 0 && !t.sliding_layers.empty()) {
    json types = json::array();
    for (int64_t i = 0; i < num_hidden_layers; ++i) {
      types.push_back(t.layer_slides(i) ? "sliding_attention" : "full_attention");
    }
    j["layer_types"] = types;
  }
  j["tie_word_embeddings"] = tie_word_embeddings;
  write_shared_fields(*this, j);
  return j.dump(2) + "\n";
}

}  // namespace promptcache
