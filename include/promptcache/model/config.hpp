// promptcache/model/config.hpp — the model configuration (HF config.json) of the decoder families
// LlamaModel runs: the Llama layer's (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3) and those whose
// layer differs in its parts (BLOOM, MPT, Falcon: LayerNorm, ALiBi, GELU MLP, parallel residual,
// fused QKV). What tells them apart is data (FamilyTraits), read here once, not branches spread
// through the forward pass.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace promptcache {

struct RopeScaling {
  // kDynamic (HF "dynamic" NTK) changes the frequencies only for sequences longer than
  // max_position_embeddings, which the engine never runs: within the context it is kNone.
  enum class Type { kNone, kLinear, kLlama3, kDynamic } type = Type::kNone;
  double factor = 1.0;
  // llama3 only
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

enum class NormKind { kRms, kLayerNorm };  // RMSNorm (Llama) or LayerNorm (BLOOM, MPT, Falcon)
// Where positions enter: rotary embeddings of q and k, or ALiBi, a bias of slope_h * (key
// position - query position) on head h's scores (BLOOM, MPT), from the position ids.
enum class PositionKind { kRope, kAlibi };
// SwiGLU (gate, up, down; Llama) or GELU between up and down (erf: MPT, Falcon; tanh: BLOOM).
enum class MlpKind { kGatedSilu, kGelu, kGeluTanh };
// How a checkpoint stores q/k/v. kSeparate: q_proj, k_proj, v_proj. Fused in one matrix, split
// at load into those three: kHeadsInterleaved [heads, 3, head_dim] (BLOOM, Falcon without
// multi-query), kMultiQuery [heads + 2, head_dim] (Falcon-7B), kGrouped [kv_heads, q_per_kv + 2,
// head_dim] (Falcon's new_decoder_architecture), kConcatenated [q; k; v] (MPT's Wqkv).
enum class FusedQkv { kSeparate, kHeadsInterleaved, kMultiQuery, kGrouped, kConcatenated };

// The switches in which the supported families differ from a plain Llama 2 layer.
struct FamilyTraits {
  bool qkv_bias = false;  // biases on q/k/v_proj (Qwen2; Llama's attention_bias)
  bool o_bias = false;    // a bias on o_proj (Llama's attention_bias)
  bool mlp_bias = false;  // biases on gate/up/down_proj (Llama's mlp_bias)
  bool qk_norm = false;   // RMSNorm over each head of q and k before RoPE (Qwen3: q_norm, k_norm)
  // Sliding-window attention (Mistral; Qwen2/3 with use_sliding_window): a token at position p
  // sees only keys at positions > p - sliding_window. 0 = none. Which layers use it:
  // sliding_layers[i] (empty = every layer).
  int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;
  bool layer_slides(int64_t layer) const {
    return sliding_window > 0 &&
           (sliding_layers.empty() || sliding_layers.at(static_cast<std::size_t>(layer)));
  }
  NormKind norm = NormKind::kRms;  // every norm of the model (epsilon: rms_norm_eps)
  bool norm_bias = false;          // LayerNorms with a bias (BLOOM, Falcon; not MPT's no_bias)
  bool embed_norm = false;         // a norm on the embeddings (BLOOM's word_embeddings_layernorm)
  PositionKind position = PositionKind::kRope;
  // ALiBi slopes: 0 = BLOOM's rule (powers of 2^(-8/n), extra slopes interleaved), > 0 = MPT's
  // (1 / 2^(i * alibi_bias_max / n), reordered for head counts that are not powers of two).
  double alibi_bias_max = 0.0;
  MlpKind mlp = MlpKind::kGatedSilu;
  // x + attention(norm(x)) + mlp(norm'(x)) instead of one after the other (Falcon); norm' is the
  // MLP's own norm when mlp_norm (Falcon's new_decoder_architecture: ln_mlp), else the
  // attention's (Falcon-7B).
  bool parallel_residual = false;
  bool mlp_norm = true;
  FusedQkv fused_qkv = FusedQkv::kSeparate;
};

struct ModelConfig {
  // One of supported_architectures(): LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
  // Qwen3ForCausalLM, BloomForCausalLM, MPTForCausalLM, FalconForCausalLM.
  std::string architecture = "LlamaForCausalLM";
  std::string model_type = "llama";
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // defaults to num_attention_heads
  int64_t head_dim = 0;             // defaults to hidden_size / num_attention_heads
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;  // every norm's epsilon (BLOOM's, MPT's, Falcon's layer_norm_epsilon)
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  int64_t bos_token_id = 1;
  std::vector<int64_t> eos_token_ids = {2};
  std::string torch_dtype = "float32";
  FamilyTraits traits;
  // Chat template family for PML chat tags, as config.json names it (promptcache_chat_template);
  // empty when it does not: see default_chat_template().
  std::string chat_template;

  // The chat template family of this architecture when config.json names none: "chatml" for
  // Qwen, "mistral" for Mistral, "llama-3" for a Llama with Llama 3's vocabulary or RoPE scaling,
  // else "llama-2". (The engine also looks at the tokenizer's special tokens first.)
  std::string default_chat_template() const;

  // Parses a config.json file; Error(kModel) naming the file and the field on any problem
  // (missing field, wrong type, heads not dividing hidden size, kv heads not dividing heads, ...).
  static ModelConfig from_json_file(const std::string& path);
  static ModelConfig from_json_string(const std::string& json, const std::string& origin);
  std::string to_json_string() const;  // HF-compatible config.json text
  void validate(const std::string& origin) const;
};

// "LlamaForCausalLM, MistralForCausalLM, ...", for messages.
std::string supported_architectures();

// The ALiBi slope of each of `heads` heads: BLOOM's rule for alibi_bias_max 0 (2^(-8i/p) for the
// power of two p at or below heads, then the odd powers of 2^(-4/p) for the rest), MPT's for
// alibi_bias_max > 0 (2^(-i * alibi_bias_max / p) for the power of two p at or above heads, the
// odd-indexed ones first when p != heads).
std::vector<double> alibi_slopes(int64_t heads, double alibi_bias_max);

}  // namespace promptcache
