// Fuzz entry "config_json": a model folder's config.json (ModelConfig::from_json_string, the
// reader every model load goes through). LibTorch-free: src/model/config.cpp is part of
// promptcache_core.
#include <cmath>
#include <string>

#include "fuzz/fuzz_entries.hpp"
#include "promptcache/error.hpp"
#include "promptcache/model/config.hpp"

namespace promptcache::fuzz {
namespace {

using detail::check;

// What a loaded config promises to the model code (config.hpp, ModelConfig::validate).
void check_config(const ModelConfig& c) {
  check(c.hidden_size > 0 && c.intermediate_size > 0 && c.num_hidden_layers > 0 &&
            c.num_attention_heads > 0 && c.num_key_value_heads > 0 && c.head_dim > 0 &&
            c.vocab_size > 0 && c.max_position_embeddings > 0,
        "a size of the config is not positive");
  check(c.num_attention_heads % c.num_key_value_heads == 0, "kv heads do not divide the heads");
  check(c.head_dim % 2 == 0, "odd head_dim (rotary embeddings need pairs)");
  check(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0, "rms_norm_eps not finite or <= 0");
  check(std::isfinite(c.rope_theta) && c.rope_theta > 0, "rope_theta not finite or <= 0");
  if (c.rope_scaling.type != RopeScaling::Type::kNone) {
    check(std::isfinite(c.rope_scaling.factor) && c.rope_scaling.factor > 0,
          "rope_scaling.factor not finite or <= 0");
  }
  check(c.bos_token_id >= 0 && c.bos_token_id < c.vocab_size, "BOS outside the vocabulary");
  for (int64_t id : c.eos_token_ids) {
    check(id >= 0 && id < c.vocab_size, "an EOS id outside the vocabulary");
  }
  check(c.traits.sliding_window >= 0, "negative sliding window");
  check(c.traits.sliding_layers.empty() ||
            static_cast<int64_t>(c.traits.sliding_layers.size()) == c.num_hidden_layers,
        "sliding_layers is not one flag per layer");
  const std::string family = c.default_chat_template();
  check(!family.empty(), "no default chat template");
}

// to_json_string() writes what from_json_string() reads back to the same config.
void check_round_trip(const ModelConfig& a) {
  ModelConfig b;
  try {
    b = ModelConfig::from_json_string(a.to_json_string(), "<fuzz, written back>");
  } catch (const Error& e) {
    throw InvariantViolation(std::string("a written config does not load again: ") + e.what());
  }
  const FamilyTraits& t = a.traits;
  const FamilyTraits& u = b.traits;
  check(a.architecture == b.architecture && a.model_type == b.model_type &&
            a.hidden_size == b.hidden_size && a.intermediate_size == b.intermediate_size &&
            a.num_hidden_layers == b.num_hidden_layers &&
            a.num_attention_heads == b.num_attention_heads &&
            a.num_key_value_heads == b.num_key_value_heads && a.head_dim == b.head_dim &&
            a.vocab_size == b.vocab_size && a.max_position_embeddings == b.max_position_embeddings,
        "the sizes change when the config is written and read again");
  check(a.rms_norm_eps == b.rms_norm_eps && a.rope_theta == b.rope_theta &&
            a.rope_scaling.type == b.rope_scaling.type &&
            (a.rope_scaling.type == RopeScaling::Type::kNone ||
             a.rope_scaling.factor == b.rope_scaling.factor),
        "the norm or RoPE numbers change when the config is written and read again");
  check(a.tie_word_embeddings == b.tie_word_embeddings && a.bos_token_id == b.bos_token_id &&
            a.eos_token_ids == b.eos_token_ids && a.torch_dtype == b.torch_dtype &&
            a.chat_template == b.chat_template,
        "the special ids, dtype or chat template change when the config is written and read again");
  check(t.qkv_bias == u.qkv_bias && t.o_bias == u.o_bias && t.mlp_bias == u.mlp_bias &&
            t.qk_norm == u.qk_norm && t.sliding_window == u.sliding_window,
        "the family traits change when the config is written and read again");
  for (int64_t i = 0; i < a.num_hidden_layers && i < 4096; ++i) {
    check(t.layer_slides(i) == u.layer_slides(i),
          "the sliding layers change when the config is written and read again");
  }
}

}  // namespace

void config_json_entry(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ModelConfig config = ModelConfig::from_json_string(text, "<fuzz>/config.json");
    check_config(config);
    check_round_trip(config);
  } catch (const Error& e) {
    detail::rejected(e);  // a clean rejection
  }
}

}  // namespace promptcache::fuzz
