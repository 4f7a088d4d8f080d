// promptcache/model/llama.hpp — the forward pass of the decoder families: the Llama layer's
// (Llama 2/3.x, TinyLlama, CodeLlama, Mistral, Qwen2/2.5, Qwen3) and those whose layer differs
// in its parts (BLOOM, MPT, Falcon).
//
// RMSNorm, RoPE (HF rotate-half convention, rope_theta, rope_scaling), grouped-query attention,
// SwiGLU MLP, tied or untied lm_head; and, as the config's FamilyTraits say, projection biases,
// per-head q/k RMSNorm, sliding-window attention (by position ids: a token at position p sees
// the keys at positions > p - window, in every path, Prompt Cache assembly included), LayerNorm
// with or without bias, a norm on the embeddings, a GELU MLP, attention and MLP in parallel, and
// ALiBi instead of RoPE: head h's score of a key gets slope_h * (key position - query position),
// from the position ids of the keys (as the cache records them) and of the new tokens, in every
// attention path, so module states compiled at their schema positions are reused exactly. The
// forward takes token ids AND explicit position ids (they need not be contiguous) and appends the
// new K (RoPE applied) and V to a KVCache.
#pragma once

#include <torch/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "promptcache/model/config.hpp"
#include "promptcache/model/kv_cache.hpp"

namespace promptcache {

// How attention is computed. kAuto: LibTorch 2.x's fused scaled_dot_product_attention on GPUs,
// the library's own attention on the CPU, where it was measured faster
// (docs/benchmarks-history.md): the fused kernel of cpu_attention.hpp (long inputs in blocks of 64
// query tokens), or query blocks of library GEMMs where that kernel does not apply (both are
// "blocked" below). With kAuto the environment variable PROMPTCACHE_ATTENTION=sdpa|blocked|auto
// decides instead, for comparisons.
enum class AttentionImpl { kAuto, kSdpa, kBlocked };

struct LoadOptions {
  torch::Device device = torch::kCPU;
  // Every dtype below left unset follows the checkpoint (choose_dtypes says how, and why):
  // a bf16 file keeps bf16 weights, as stored (mapped, not converted).
  //
  // The compute dtype: activations (and the KV cache, unless kv_dtype says otherwise). Unset:
  // f32 on the CPU (which reads bf16/f16 weights and states through its own kernels); on other
  // devices the dtype the checkpoint's projection matrices are stored in (bf16 or f16; f32 for
  // f32 and f64 files), or `weights` when that is given.
  std::optional<torch::Dtype> dtype;
  // The dtype the weight matrices are kept in (projections, embeddings, lm_head); norms and
  // biases follow the compute dtype. Unset: the checkpoint's dtype where the compute dtype takes
  // it, else the compute dtype. On the CPU with f32 compute they may be bf16 or f16: a
  // checkpoint stored so is then mapped, not converted (half the memory), and the linear
  // layers read it through the reduced-precision kernels of cpu_linear.hpp. Elsewhere it must
  // equal the compute dtype (Error(kInvalidArgument) otherwise). torch::kInt8 selects 8-bit
  // weights (q8, promptcache/model/q8_weights.hpp), quantized from the checkpoint as it loads:
  // CPU and f32 compute only, like bf16/f16 weights.
  std::optional<torch::Dtype> weights;
  // The dtype of the KV cache, and so of the module states compiled into the store and saved to
  // cache files. Unset: bf16 with bf16 weights and f16 with f16 weights on the CPU with f32
  // compute, else the compute dtype. On the CPU with f32 compute it may be bf16 or f16: half
  // the bytes to store, assemble and read, with the fused attention (cpu_attention.hpp)
  // converting keys and values to f32 as it reads them; everything else is still computed in
  // f32. Elsewhere it must equal the compute dtype (Error(kInvalidArgument) otherwise).
  std::optional<torch::Dtype> kv_dtype;
  // kSdpa on LibTorch 1.x, which lacks it, is an Error(kInvalidArgument) when the model is made.
  AttentionImpl attention = AttentionImpl::kAuto;
};

// The dtypes a model runs in, each with why: what LoadOptions gave, and what the unset ones were
// chosen as for the checkpoint. Reported by `promptcache info` and `generate --json`.
struct DtypeChoice {
  // The dtype of the checkpoint's projection matrices (q/k/v/o, gate/up/down): the one holding
  // most of their elements. It decides, whatever the other tensors are stored in.
  torch::Dtype checkpoint = torch::kFloat32;
  // Other floating-point tensors of the checkpoint are stored in another dtype (norms kept in
  // f32 beside bf16 matrices, say): the ones that differ from `weights` are converted as they load.
  bool mixed = false;
  torch::Dtype compute = torch::kFloat32, weights = torch::kFloat32, kv = torch::kFloat32;
  std::string compute_reason, weights_reason, kv_reason;  // one clause each
};

// The rule: given options are taken as they are (and checked when the model is made); unset ones
// follow the checkpoint's dtype on `options.device`, as LoadOptions describes.
DtypeChoice choose_dtypes(torch::Dtype checkpoint, const LoadOptions& options);
// The checkpoint dtype of tensors named as in HF checkpoints: the dtype of most elements of the
// projection matrices (*_proj.weight; all 2-D tensors when there are none), and whether any
// floating-point tensor is stored in another dtype.
std::pair<torch::Dtype, bool> checkpoint_dtype(const std::map<std::string, torch::Tensor>& w);

// Parses "cpu", "cuda", "cuda:1" and "f32"/"float32", "f16"/"float16"/"half", "bf16"/"bfloat16";
// Error(kInvalidArgument) naming the value otherwise (or when CUDA is not available).
torch::Device parse_device(const std::string& text);
torch::Dtype parse_dtype(const std::string& text);
// As parse_dtype, plus "q8" (torch::kInt8): what LoadOptions::weights takes.
torch::Dtype parse_weight_dtype(const std::string& text);
// "f32", "f16", "bf16", "q8" (int8 weights), else LibTorch's name.
std::string dtype_name(torch::Dtype dtype);

struct ForwardOptions {
  // Logits for every new token ([batch, n, vocab]) instead of only the last ([batch, 1, vocab]).
  bool all_logits = false;
  // Which slots each new token may attend to: bool [n, cache_length + n], true = visible, or
  // [batch, n, cache_length + n] for a mask per batch row (sequences of different lengths
  // padded into one batch). Every row must see at least one slot (itself, for padding), and
  // every slot up to cache_length must hold finite values, masked or not: a masked slot still
  // enters the attention product with weight 0, and 0 x NaN is NaN.
  // Undefined = every cached slot plus the new tokens causally (ordinary incremental decoding).
  torch::Tensor attention_mask;
  // Run only the first `layers` layers (> 0; 0 = all) and return their output hidden states
  // [batch, n, hidden] (the model's dtype) instead of logits (also when `layers` reaches the
  // last layer: the states before the final norm). The later layers' slots of the new
  // tokens are left unwritten: for a cache used for nothing else (recompute.hpp's deviation pass).
  int64_t layers = 0;
  // Start at layer `first_layer` (> 0) from `hidden` [batch, n, hidden_size], the new tokens'
  // hidden states entering that layer, instead of embedding token_ids (which must still be
  // given). The earlier layers' slots of the new tokens are left unwritten: the caller fills
  // them (recompute.hpp, whose selection pass already computed them). first_layer may equal the
  // number of layers: `hidden` then goes straight to the final norm and the logits.
  int64_t first_layer = 0;
  torch::Tensor hidden;
  // When set, receives [layers, cache_length + n] float32 on the CPU: per layer, the attention
  // weight each slot received, summed over the batch, the heads and the new tokens (rows of the
  // layers not run stay 0). For choosing which slots matter (recompute.hpp's attention
  // criterion); it takes the library attention path (no fused kernel, no SDPA), so it is slower.
  torch::Tensor* attention_mass = nullptr;
};

class LlamaModel {
 public:
  // Loads config.json + *.safetensors from a HuggingFace checkpoint folder. Errors (kModel /
  // kSafetensors / kIo) name the folder, file and tensor, and say expected vs found shapes.
  static std::unique_ptr<LlamaModel> load(const std::string& dir, const LoadOptions& options = {});
  // Builds a model from tensors named as in HF checkpoints
  // (model.layers.N.self_attn.q_proj.weight).
  static std::unique_ptr<LlamaModel> from_tensors(const ModelConfig& config,
                                                  const std::map<std::string, torch::Tensor>& w,
                                                  const LoadOptions& options = {},
                                                  const std::string& origin = "<tensors>");

  const ModelConfig& config() const { return config_; }
  torch::Device device() const { return options_.device; }
  torch::Dtype dtype() const { return choice_.compute; }
  torch::Dtype weight_dtype() const { return choice_.weights; }
  // The KV cache's and the stored module states' dtype (LoadOptions::kv_dtype).
  torch::Dtype kv_dtype() const { return choice_.kv; }
  // How these three were chosen, and the checkpoint's dtype.
  const DtypeChoice& dtype_choice() const { return choice_; }
  // Bytes held by the weights (mapped or in memory), counted once for tied embeddings.
  int64_t weight_bytes() const;
  torch::TensorOptions tensor_options() const;
  // The model's device with kv_dtype(): what KV caches and stored module states are made of.
  torch::TensorOptions kv_options() const;
  // The attention this model runs, resolved from LoadOptions::attention: "sdpa" or "blocked"
  // (the library's own: on the CPU the fused kernel when cpu_attention_available(head_dim), with
  // the small-row kernels on).
  std::string attention_name() const { return sdpa_ ? "sdpa" : "blocked"; }

  // A cache shaped for this model, on its device, in kv_dtype().
  KVCache make_cache(int64_t capacity, int64_t batch = 1) const;

  // token_ids and positions: int64 [batch, n] (or [n] for batch 1); each batch row has its own
  // position ids, and the cache records those of row 0 (KVCache::positions). Appends n slots to
  // `cache` and returns float32 logits on the model's device.
  torch::Tensor forward(const torch::Tensor& token_ids, const torch::Tensor& positions,
                        KVCache& cache, const ForwardOptions& options = {}) const;

  // Layer `layer`'s keys (rotated by RoPE at `positions`) and values for hidden states entering
  // it ([batch, n, hidden], as ForwardOptions::layers returns them): [batch, kv_heads, n,
  // head_dim] each in kv_dtype(), what a forward would write into the cache there, without the
  // layer's attention and MLP (recompute.hpp's selection pass needs only these on its last layer).
  std::pair<torch::Tensor, torch::Tensor> layer_key_values(int64_t layer,
                                                           const torch::Tensor& hidden,
                                                           const torch::Tensor& positions) const;

  // RoPE cos/sin tables ([n, head_dim], float32) for the given positions — exposed for tests.
  // Under ALiBi, cos 1 and sin 0: the rotation leaves q and k exactly as they are.
  std::pair<torch::Tensor, torch::Tensor> rope_tables(const torch::Tensor& positions) const;

  // The token embedding table as held: a GGUF file's blocks stay a view of its mapping when the
  // table is only looked up (not tied to the lm_head) — exposed for tests.
  const torch::Tensor& embedding() const { return embed_; }

  // Under ALiBi, each query head's slope (float32 [heads] on the model's device); undefined
  // under RoPE.
  const torch::Tensor& alibi_slopes() const { return alibi_slopes_; }

  // Approximate FLOPs of a prefill of n tokens with `context` cached slots (for benchmarks).
  double prefill_flops(int64_t n, int64_t context = 0) const;

 private:
  struct Layer {
    // post_norm is undefined where the MLP reads the attention's norm (Falcon-7B's parallel
    // block); the biases where the norms have none.
    torch::Tensor input_norm, post_norm, input_norm_bias, post_norm_bias;
    torch::Tensor wq, wk, wv, wo;
    torch::Tensor w_gate, w_up, w_down;  // no gate in a GELU MLP
    // Undefined unless the family has them (FamilyTraits).
    torch::Tensor bq, bk, bv, bo, b_gate, b_up, b_down;
    torch::Tensor q_norm, k_norm;  // [head_dim]
    bool sliding = false;          // this layer attends within the sliding window
  };
  // What every layer of one forward shares, decided once per forward.
  struct LayerInputs {
    bool small_ops = false;  // the fused elementwise steps of cpu_ops.hpp
    // The fused attention of cpu_attention.hpp, which reads the cache's slots where they are
    // (KVCache::segments); the other paths take views of the buffer.
    bool fused_attention = false;
    // RoPE tables: [b, n, d] dense f32 for the fused steps, else [b or 1, 1, n, d] in the
    // model's dtype (broadcast over the heads).
    torch::Tensor cos, sin;
    torch::Tensor mask;  // as ForwardOptions::attention_mask, or the causal mask; may be undefined
    bool causal = true;  // no mask from the caller: the ordinary causal rule
    int64_t open_slots = 0;  // leading slots that every new token sees
    // ForwardOptions::attention_mass: this layer's row of it is added to (library path only).
    torch::Tensor attention_mass;
    // ALiBi: the position of every slot [b, cache_length + n] (the cache's, then the new
    // tokens') and of every new token [b, n], float32 on the model's device; undefined under
    // RoPE.
    torch::Tensor key_positions, query_positions;
  };
  LlamaModel() = default;
  // The inputs of the layers that use the sliding window: `full`'s, with the window's rule added
  // to the mask. `full` itself when no new token's window leaves out a slot it would see.
  LayerInputs windowed(const LayerInputs& full, const torch::Tensor& positions,
                       const KVCache& cache, int64_t n) const;
  torch::Tensor attention(const Layer& layer, int64_t index, const torch::Tensor& x, KVCache& cache,
                          const LayerInputs& in) const;
  // The family's norm (FamilyTraits::norm) of x with weight and bias (bias may be undefined).
  torch::Tensor norm(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                     bool small_ops) const;
  // The family's MLP (FamilyTraits::mlp) of the normed h.
  torch::Tensor mlp(const Layer& layer, const torch::Tensor& h) const;

  ModelConfig config_;
  LoadOptions options_;  // as given, with device and attention used as they are
  DtypeChoice choice_;
  torch::Tensor embed_, final_norm_, final_norm_bias_, lm_head_;
  torch::Tensor embed_norm_, embed_norm_bias_;  // undefined unless the family has one
  torch::Tensor alibi_slopes_;                  // ALiBi: float32 [heads]
  std::vector<Layer> layers_;
  torch::Tensor inv_freq_;  // float32 [head_dim / 2], rope_scaling applied
  bool sdpa_ = false;       // attention through scaled_dot_product_attention (fixed at load)
};

}  // namespace promptcache
