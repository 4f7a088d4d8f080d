// BLOOM, MPT and Falcon: each tiny random checkpoint (stored under its family's own tensor names,
// fused QKV included) against a plain float64 reference written here from HF's modeling_bloom,
// modeling_mpt and modeling_falcon (the fused QKV split from the projection's OUTPUT, as HF does,
// not from the weights as the loader does; ALiBi as HF adds it, slope times the key's position
// alone, which the softmax cannot tell from slope times the distance); the ALiBi slopes against
// HF's formulas; every attention path (fused kernel with f32 and bf16 states, library calls);
// incremental decoding; and a module compiled at two reserved offsets and reused at each.
#include <torch/types.h>
#include "support/catch_torch.hpp"
#include "support/model_inputs.hpp"

#include <cmath>
#include <functional>
#include <random>

#include "promptcache/error.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/model/synthetic.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "support/cpu_kernels.hpp"
#include "support/test_support.hpp"

using namespace promptcache;

namespace {

// HF's build_alibi_tensor (BLOOM) slopes, as written there.
std::vector<double> hf_bloom_slopes(int64_t heads) {
  const auto closest = static_cast<int64_t>(std::pow(2.0, std::floor(std::log2(heads))));
  const double base = std::pow(2.0, -std::pow(2.0, -(std::log2(closest) - 3)));
  std::vector<double> slopes;
  for (int64_t p = 1; p <= closest; ++p) slopes.push_back(std::pow(base, p));
  if (closest != heads) {
    const double extra = std::pow(2.0, -std::pow(2.0, -(std::log2(2 * closest) - 3)));
    const int64_t remaining = std::min(closest, heads - closest);
    for (int64_t p = 1; p < 1 + 2 * remaining; p += 2) slopes.push_back(std::pow(extra, p));
  }
  return slopes;
}

// HF's build_mpt_alibi_tensor slopes.
std::vector<double> hf_mpt_slopes(int64_t heads, double bias_max) {
  const auto pow2 = static_cast<int64_t>(std::pow(2.0, std::ceil(std::log2(heads))));
  std::vector<double> s;
  for (int64_t i = 1; i <= pow2; ++i) s.push_back(1.0 / std::pow(2.0, i * (bias_max / pow2)));
  if (pow2 == heads) return s;
  std::vector<double> out;
  for (int64_t i = 1; i < pow2; i += 2) out.push_back(s[i]);
  for (int64_t i = 0; i < pow2; i += 2) out.push_back(s[i]);
  out.resize(heads);
  return out;
}

using Weights = std::map<std::string, torch::Tensor>;

struct Ref {
  const ModelConfig& c;
  const Weights& w;
  torch::Tensor W(const std::string& name) const {
    auto it = w.find(name);
    REQUIRE(it != w.end());
    return it->second.to(torch::kFloat64);
  }
  bool has(const std::string& name) const { return w.count(name) > 0; }
  torch::Tensor linear(const torch::Tensor& x, const std::string& name) const {
    auto y = x.matmul(W(name + ".weight").t());
    return has(name + ".bias") ? y + W(name + ".bias") : y;
  }
  // nn.LayerNorm (biased variance); MPT's norms have no bias.
  torch::Tensor ln(const torch::Tensor& x, const std::string& name) const {
    auto mean = x.mean(-1, true);
    auto var = (x - mean).pow(2).mean(-1, true);
    auto y = (x - mean) / torch::sqrt(var + c.rms_norm_eps) * W(name + ".weight");
    return has(name + ".bias") ? y + W(name + ".bias") : y;
  }
};

torch::Tensor gelu_erf(const torch::Tensor& x) {
  return 0.5 * x * (1.0 + torch::erf(x / std::sqrt(2.0)));
}
// bloom_gelu_forward
torch::Tensor gelu_tanh(const torch::Tensor& x) {
  return x * 0.5 * (1.0 + torch::tanh(0.79788456 * x * (1 + 0.044715 * x * x)));
}

// Per head: softmax(q k^T * scale + bias_j, masked) v. q [n, heads, d], k and v [n, kv, d].
torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const std::vector<std::vector<bool>>& mask,
                     const std::function<double(int64_t, int64_t)>& bias) {
  const int64_t n = q.size(0), heads = q.size(1), kv = k.size(1), d = q.size(2);
  auto out = torch::zeros({n, heads * d}, torch::kFloat64);
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t g = h / (heads / kv);
    auto scores = q.select(1, h).matmul(k.select(1, g).t()) / std::sqrt(static_cast<double>(d));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        scores[i][j] = mask[i][j] ? scores[i][j].item<double>() + bias(h, j) : -INFINITY;
      }
    }
    out.narrow(1, h * d, d).copy_(scores.softmax(-1).matmul(v.select(1, g)));
  }
  return out;
}

// BLOOM (modeling_bloom): embeddings LayerNorm, fused QKV viewed [n, heads, 3, d], ALiBi of
// slope * key position, tanh GELU, tied output.
torch::Tensor bloom_reference(const ModelConfig& c, const Weights& w,
                              const std::vector<int64_t>& ids, const std::vector<int64_t>& pos,
                              const std::vector<std::vector<bool>>& mask) {
  const Ref r{c, w};
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t heads = c.num_attention_heads, d = c.hidden_size / heads;
  const auto slopes = hf_bloom_slopes(heads);
  auto x = r.W("transformer.word_embeddings.weight").index_select(0, torch::tensor(ids));
  x = r.ln(x, "transformer.word_embeddings_layernorm");
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    auto fused = r.linear(r.ln(x, p + "input_layernorm"), p + "self_attention.query_key_value")
                     .view({n, heads, 3, d});
    auto ctx = attend(fused.select(2, 0), fused.select(2, 1), fused.select(2, 2), mask,
                      [&](int64_t h, int64_t j) { return slopes[h] * pos[j]; });
    x = x + r.linear(ctx, p + "self_attention.dense");
    auto h2 = r.ln(x, p + "post_attention_layernorm");
    x = x + r.linear(gelu_tanh(r.linear(h2, p + "mlp.dense_h_to_4h")), p + "mlp.dense_4h_to_h");
  }
  x = r.ln(x, "transformer.ln_f");
  return x.matmul(r.W("transformer.word_embeddings.weight").t());
}

// MPT (modeling_mpt): LayerNorms without bias, Wqkv chunked in three, ALiBi with MPT's slopes,
// erf GELU, output tied to wte.
torch::Tensor mpt_reference(const ModelConfig& c, const Weights& w, const std::vector<int64_t>& ids,
                            const std::vector<int64_t>& pos,
                            const std::vector<std::vector<bool>>& mask) {
  const Ref r{c, w};
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t heads = c.num_attention_heads, hd = c.hidden_size, d = hd / heads;
  const auto slopes = hf_mpt_slopes(heads, c.traits.alibi_bias_max);
  auto x = r.W("transformer.wte.weight").index_select(0, torch::tensor(ids));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "transformer.blocks." + std::to_string(l) + ".";
    auto qkv = r.linear(r.ln(x, p + "norm_1"), p + "attn.Wqkv").chunk(3, -1);
    auto ctx = attend(qkv[0].reshape({n, heads, d}), qkv[1].reshape({n, heads, d}),
                      qkv[2].reshape({n, heads, d}), mask,
                      [&](int64_t h, int64_t j) { return slopes[h] * pos[j]; });
    x = x + r.linear(ctx, p + "attn.out_proj");
    auto h2 = r.ln(x, p + "norm_2");
    x = x + r.linear(gelu_erf(r.linear(h2, p + "ffn.up_proj")), p + "ffn.down_proj");
  }
  x = r.ln(x, "transformer.norm_f");
  return x.matmul(r.W("transformer.wte.weight").t());
}

// Falcon (modeling_falcon): the three QKV layouts, rotary (float32 angles, rotate_half), the
// parallel block with one or two norms or the sequential one, erf GELU.
torch::Tensor falcon_reference(const ModelConfig& c, const Weights& w,
                               const std::vector<int64_t>& ids, const std::vector<int64_t>& pos,
                               const std::vector<std::vector<bool>>& mask, bool new_arch,
                               bool multi_query, bool parallel, int norms) {
  const Ref r{c, w};
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t heads = c.num_attention_heads, d = c.hidden_size / heads;
  const int64_t kv = new_arch ? c.num_key_value_heads : multi_query ? 1 : heads;
  auto rope = [&](const torch::Tensor& x /*[n, h, d]*/) {
    auto out = x.clone();
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < d / 2; ++j) {
        const auto inv = static_cast<float>(1.0 / std::pow(c.rope_theta, 2.0 * j / d));
        const double angle = static_cast<double>(static_cast<float>(pos[t]) * inv);
        auto a = x.select(0, t).select(-1, j), b = x.select(0, t).select(-1, j + d / 2);
        out.select(0, t).select(-1, j).copy_(a * std::cos(angle) - b * std::sin(angle));
        out.select(0, t).select(-1, j + d / 2).copy_(b * std::cos(angle) + a * std::sin(angle));
      }
    }
    return out;
  };
  auto x = r.W("transformer.word_embeddings.weight").index_select(0, torch::tensor(ids));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "transformer.h." + std::to_string(l) + ".";
    torch::Tensor a_in, m_in;
    if (new_arch && norms == 2) {
      a_in = r.ln(x, p + "ln_attn");
      m_in = r.ln(x, p + "ln_mlp");
    } else {
      a_in = r.ln(x, p + "input_layernorm");
    }
    auto fused = r.linear(a_in, p + "self_attention.query_key_value");
    torch::Tensor q, k, v;
    if (new_arch) {
      auto f = fused.view({n, kv, heads / kv + 2, d});
      q = f.narrow(2, 0, heads / kv).reshape({n, heads, d});
      k = f.select(2, heads / kv);
      v = f.select(2, heads / kv + 1);
    } else if (multi_query) {
      auto f = fused.view({n, heads + 2, d});
      q = f.narrow(1, 0, heads);
      k = f.narrow(1, heads, 1);
      v = f.narrow(1, heads + 1, 1);
    } else {
      auto f = fused.view({n, heads, 3, d});
      q = f.select(2, 0), k = f.select(2, 1), v = f.select(2, 2);
    }
    auto ctx = attend(rope(q), rope(k), v, mask, [](int64_t, int64_t) { return 0.0; });
    auto attn = r.linear(ctx, p + "self_attention.dense");
    torch::Tensor residual = x;
    if (!new_arch) {
      if (parallel) {
        m_in = a_in;
      } else {
        residual = x + attn;
        m_in = r.ln(residual, p + "post_attention_layernorm");
      }
    }
    if (new_arch && norms == 1) m_in = a_in;
    auto mlp = r.linear(gelu_erf(r.linear(m_in, p + "mlp.dense_h_to_4h")), p + "mlp.dense_4h_to_h");
    if (new_arch || parallel) mlp = mlp + attn;
    x = mlp + residual;
  }
  x = r.ln(x, "transformer.ln_f");
  return x.matmul(r.W("transformer.word_embeddings.weight").t());
}

struct Variant {
  std::string name;
  ModelConfig config;
  std::function<torch::Tensor(const ModelConfig&, const Weights&, const std::vector<int64_t>&,
                              const std::vector<int64_t>&, const std::vector<std::vector<bool>>&)>
      reference;
};

ModelConfig small_vocab(ModelConfig c) {
  c.vocab_size = 97;
  return c;
}

std::vector<Variant> variants() {
  std::vector<Variant> v;
  v.push_back({"bloom-tiny", small_vocab(synthetic_config("bloom-tiny")), bloom_reference});
  v.push_back({"mpt-tiny", small_vocab(synthetic_config("mpt-tiny")), mpt_reference});
  // MPT with biases (no_bias false) and 6 heads: MPT's reordered slopes.
  v.push_back({"mpt-6-heads-biased",
               small_vocab(ModelConfig::from_json_string(
                   R"({"architectures": ["MPTForCausalLM"], "d_model": 96, "n_layers": 2,
                       "n_heads": 6, "expansion_ratio": 2, "vocab_size": 97, "no_bias": false,
                       "attn_config": {"alibi": true, "alibi_bias_max": 16}})",
                   "mpt6")),
               mpt_reference});
  // Heads of 12: no fused kernel takes them, so a few tokens go through the KV heads split over
  // threads with library calls (attend_split_heads) while the kernels are on.
  v.push_back({"mpt-head-12",
               small_vocab(ModelConfig::from_json_string(
                   R"({"architectures": ["MPTForCausalLM"], "d_model": 48, "n_layers": 2,
                       "n_heads": 4, "expansion_ratio": 4, "vocab_size": 97})",
                   "mpt12")),
               mpt_reference});
  auto falcon = [](bool new_arch, bool multi_query, bool parallel, int norms) {
    return [=](const ModelConfig& c, const Weights& w, const std::vector<int64_t>& ids,
               const std::vector<int64_t>& pos, const std::vector<std::vector<bool>>& mask) {
      return falcon_reference(c, w, ids, pos, mask, new_arch, multi_query, parallel, norms);
    };
  };
  v.push_back(
      {"falcon-tiny", small_vocab(synthetic_config("falcon-tiny")), falcon(false, true, true, 1)});
  // Falcon-40B's new decoder architecture: 2 KV heads for 4, ln_attn and ln_mlp, biases.
  v.push_back({"falcon-new-decoder",
               small_vocab(ModelConfig::from_json_string(
                   R"({"architectures": ["FalconForCausalLM"], "hidden_size": 64,
                       "num_hidden_layers": 2, "num_attention_heads": 4, "num_kv_heads": 2,
                       "new_decoder_architecture": true, "bias": true, "vocab_size": 97,
                       "rope_theta": 500.0})",
                   "falcon40")),
               falcon(true, false, true, 2)});
  // Sequential attention then MLP, QKV [heads, 3, d] (neither multi-query nor the new layout).
  v.push_back({"falcon-sequential",
               small_vocab(ModelConfig::from_json_string(
                   R"({"architectures": ["FalconForCausalLM"], "hidden_size": 64,
                       "num_hidden_layers": 2, "num_attention_heads": 4, "multi_query": false,
                       "parallel_attn": false, "vocab_size": 97})",
                   "falcon-seq")),
               falcon(false, false, false, 1)});
  return v;
}

using test::causal_mask;
using test::random_ids;
using test::row;

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kFloat64) - b.to(torch::kFloat64)).abs().max().item<double>();
}

torch::Tensor all_logits(const LlamaModel& model, const std::vector<int64_t>& ids,
                         const std::vector<int64_t>& positions) {
  KVCache cache = model.make_cache(static_cast<int64_t>(ids.size()));
  ForwardOptions all;
  all.all_logits = true;
  return model.forward(row(ids), row(positions), cache, all)[0];
}

}  // namespace

TEST_CASE("ALiBi slopes follow BLOOM's and MPT's definitions", "[config][alibi]") {
  for (int64_t heads = 1; heads <= 40; ++heads) {
    INFO(heads << " heads");
    const auto bloom = alibi_slopes(heads, 0.0);
    const auto hf_bloom = hf_bloom_slopes(heads);
    REQUIRE(bloom.size() == hf_bloom.size());
    for (std::size_t i = 0; i < bloom.size(); ++i) CHECK(bloom[i] == Approx(hf_bloom[i]));
    for (double bias_max : {8.0, 16.0}) {
      const auto mpt = alibi_slopes(heads, bias_max);
      const auto hf_mpt = hf_mpt_slopes(heads, bias_max);
      REQUIRE(mpt.size() == hf_mpt.size());
      for (std::size_t i = 0; i < mpt.size(); ++i) CHECK(mpt[i] == Approx(hf_mpt[i]));
    }
  }
  // By hand: 6 heads, BLOOM: 4^-1..4^-4, then the extra 2^-1, 2^-3.
  const std::vector<double> six = {0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125};
  const auto got = alibi_slopes(6, 0.0);
  for (std::size_t i = 0; i < six.size(); ++i) CHECK(got[i] == six[i]);
  // MPT with alibi_bias_max 8 and 8 heads: 2^-1 .. 2^-8.
  const auto mpt8 = alibi_slopes(8, 8.0);
  for (int i = 0; i < 8; ++i) CHECK(mpt8[i] == std::pow(2.0, -(i + 1)));
}

TEST_CASE("config.json of BLOOM and MPT and Falcon", "[config][families][alibi]") {
  // bigscience/bloom-560m (n_embed, no hidden_size).
  const auto bloom = ModelConfig::from_json_string(
      R"({"architectures": ["BloomForCausalLM"], "model_type": "bloom", "n_embed": 1024,
          "n_layer": 24, "num_attention_heads": 16, "vocab_size": 250880, "bos_token_id": 1,
          "eos_token_id": 2, "layer_norm_epsilon": 1e-05,
          "apply_residual_connection_post_layernorm": false})",
      "bloom-560m/config.json");
  CHECK(bloom.hidden_size == 1024);
  CHECK(bloom.num_hidden_layers == 24);
  CHECK(bloom.head_dim == 64);
  CHECK(bloom.intermediate_size == 4096);
  CHECK(bloom.traits.position == PositionKind::kAlibi);
  CHECK(bloom.traits.alibi_bias_max == 0.0);
  CHECK(bloom.traits.norm == NormKind::kLayerNorm);
  CHECK(bloom.traits.embed_norm);
  CHECK(bloom.traits.mlp == MlpKind::kGeluTanh);
  CHECK(bloom.traits.fused_qkv == FusedQkv::kHeadsInterleaved);
  CHECK(bloom.tie_word_embeddings);
  // mosaicml/mpt-7b.
  const auto mpt = ModelConfig::from_json_string(
      R"({"architectures": ["MPTForCausalLM"], "model_type": "mpt", "d_model": 4096,
          "n_heads": 32, "n_layers": 32, "expansion_ratio": 4, "max_seq_len": 2048,
          "vocab_size": 50432, "no_bias": true, "norm_type": "low_precision_layernorm",
          "attn_config": {"alibi": true, "alibi_bias_max": 8, "attn_impl": "torch",
                          "clip_qkv": null, "qk_ln": false, "softmax_scale": null,
                          "prefix_lm": false}, "logit_scale": null})",
      "mpt-7b/config.json");
  CHECK(mpt.intermediate_size == 16384);
  CHECK(mpt.traits.alibi_bias_max == 8.0);
  CHECK_FALSE(mpt.traits.qkv_bias);
  CHECK_FALSE(mpt.traits.norm_bias);
  CHECK(mpt.traits.fused_qkv == FusedQkv::kConcatenated);
  // HF's MptForCausalLM class name is the same family.
  CHECK(ModelConfig::from_json_string(
            R"({"architectures": ["MptForCausalLM"], "d_model": 64, "n_heads": 4,
                "n_layers": 2, "vocab_size": 100})",
            "hf-mpt")
            .architecture == "MPTForCausalLM");
  // tiiuae/falcon-7b and falcon-40b.
  const auto f7 = ModelConfig::from_json_string(
      R"({"architectures": ["FalconForCausalLM"], "model_type": "falcon", "hidden_size": 4544,
          "num_hidden_layers": 32, "num_attention_heads": 71, "multi_query": true,
          "parallel_attn": true, "bias": false, "alibi": false, "vocab_size": 65024,
          "bos_token_id": 11, "eos_token_id": 11, "new_decoder_architecture": false})",
      "falcon-7b/config.json");
  CHECK(f7.num_key_value_heads == 1);
  CHECK(f7.head_dim == 64);
  CHECK(f7.traits.parallel_residual);
  CHECK_FALSE(f7.traits.mlp_norm);
  CHECK(f7.traits.position == PositionKind::kRope);
  CHECK(f7.traits.fused_qkv == FusedQkv::kMultiQuery);
  const auto f40 = ModelConfig::from_json_string(
      R"({"architectures": ["FalconForCausalLM"], "model_type": "falcon", "hidden_size": 8192,
          "num_hidden_layers": 60, "num_attention_heads": 128, "num_kv_heads": 8,
          "new_decoder_architecture": true, "parallel_attn": true, "bias": false,
          "alibi": false, "vocab_size": 65024})",
      "falcon-40b/config.json");
  CHECK(f40.num_key_value_heads == 8);
  CHECK(f40.traits.fused_qkv == FusedQkv::kGrouped);
  CHECK(f40.traits.mlp_norm);
  // Written and read back: the same family switches.
  for (const ModelConfig* c : {&bloom, &mpt, &f7, &f40}) {
    const auto again = ModelConfig::from_json_string(c->to_json_string(), "again");
    CHECK(again.architecture == c->architecture);
    CHECK(again.hidden_size == c->hidden_size);
    CHECK(again.intermediate_size == c->intermediate_size);
    CHECK(again.num_key_value_heads == c->num_key_value_heads);
    CHECK(again.traits.fused_qkv == c->traits.fused_qkv);
    CHECK(again.traits.position == c->traits.position);
    CHECK(again.traits.alibi_bias_max == c->traits.alibi_bias_max);
    CHECK(again.traits.parallel_residual == c->traits.parallel_residual);
    CHECK(again.traits.mlp_norm == c->traits.mlp_norm);
    CHECK(again.traits.qkv_bias == c->traits.qkv_bias);
  }
  // What the layer does not run is refused by field.
  auto refused = [](const std::string& json, const std::string& field) {
    try {
      ModelConfig::from_json_string(json, "x.json");
      FAIL("accepted " << json);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::kModel);
      CHECK_THAT(e.what(), Catch::Contains(field));
    }
  };
  refused(R"({"architectures": ["FalconForCausalLM"], "hidden_size": 64,
              "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10,
              "alibi": true})",
          "alibi");
  refused(R"({"architectures": ["MPTForCausalLM"], "d_model": 64, "n_heads": 4, "n_layers": 2,
              "vocab_size": 10, "attn_config": {"clip_qkv": 6}})",
          "clip_qkv");
  refused(R"({"architectures": ["MPTForCausalLM"], "d_model": 64, "n_heads": 4, "n_layers": 2,
              "vocab_size": 10, "attn_config": {"alibi": false}})",
          "alibi");
  refused(R"({"architectures": ["BloomForCausalLM"], "hidden_size": 64, "n_layer": 2,
              "n_head": 5, "vocab_size": 10})",
          "n_head");
  refused(R"({"architectures": ["BloomForCausalLM"], "hidden_size": 64, "n_head": 4,
              "vocab_size": 10})",
          "n_layer");
  // Sizes whose products would overflow (4 x hidden, expansion_ratio x d_model).
  refused(R"({"architectures": ["BloomForCausalLM"], "hidden_size": 4611686018427387904,
              "n_layer": 2, "n_head": 4, "vocab_size": 10})",
          "hidden_size");
  refused(R"({"architectures": ["MPTForCausalLM"], "d_model": 64, "n_heads": 4, "n_layers": 2,
              "vocab_size": 10, "expansion_ratio": 4611686018427387904})",
          "expansion_ratio");
  refused(R"({"architectures": ["MPTForCausalLM"], "d_model": 4611686018427387904, "n_heads": 4,
              "n_layers": 2, "vocab_size": 10, "expansion_ratio": 4})",
          "d_model");
}

TEST_CASE("BLOOM and MPT and Falcon forwards equal their plain references in every path",
          "[llama][families][alibi]") {
  test::KernelGuard guard;
  for (const Variant& v : variants()) {
    INFO(v.name);
    const ModelConfig& c = v.config;
    const auto w = random_llama_weights(c, 21, 0.15);
    CHECK(w.count("model.embed_tokens.weight") == 0);  // the family's own names
    // 40 tokens with gaps in their positions (up to 113).
    const int64_t n = 40;
    const auto ids = random_ids(n, c.vocab_size, 9);
    std::vector<int64_t> positions;
    for (int64_t i = 0; i < n; ++i) positions.push_back(i < 20 ? i : 2 * i + 33);
    const auto expected = v.reference(c, w, ids, positions, causal_mask(n));
    // The fused kernel (the default on this CPU), then the library calls (kernels off).
    std::vector<CpuLinearKernel> kernels = test::available_kernels();
    kernels.push_back(CpuLinearKernel::kNone);
    for (CpuLinearKernel kernel : kernels) {
      INFO("kernels " << cpu_linear_name(kernel));
      REQUIRE(select_cpu_linear(kernel));
      const auto model = LlamaModel::from_tensors(c, w);
      const double diff = max_diff(all_logits(*model, ids, positions), expected);
      INFO("max abs diff " << diff);
      CHECK(diff <= 1e-4);
      // bf16 states: the fused kernel converts (or multiplies with vdpbf16ps) as it reads.
      LoadOptions bf16;
      bf16.kv_dtype = torch::kBFloat16;
      const auto rounded = LlamaModel::from_tensors(c, w, bf16);
      const double diff16 = max_diff(all_logits(*rounded, ids, positions), expected);
      INFO("bf16 states: max abs diff " << diff16);
      CHECK(diff16 <= 2e-2 * expected.abs().max().item<double>());
    }
    // Positions matter: other gaps give other logits. ALiBi is relative: the same positions all
    // moved by 500 give the same logits (RoPE too, up to its float32 angles).
    const auto model = LlamaModel::from_tensors(c, w);
    std::vector<int64_t> other = positions, moved = positions;
    for (int64_t i = 20; i < n; ++i) other[i] += 7;
    for (auto& p : moved) p += 500;
    const auto base = all_logits(*model, ids, positions);
    CHECK(max_diff(all_logits(*model, ids, other), base) > 1e-3);
    if (c.traits.position == PositionKind::kAlibi) {
      CHECK(max_diff(all_logits(*model, ids, moved), base) <= 1e-4);
    }
  }
}

TEST_CASE("BLOOM and MPT and Falcon: incremental decoding equals one full pass",
          "[llama][families][alibi]") {
  for (const Variant& v : variants()) {
    INFO(v.name);
    const auto w = random_llama_weights(v.config, 22, 0.15);
    const auto model = LlamaModel::from_tensors(v.config, w);
    const int64_t n = 24;
    const auto ids = random_ids(n, v.config.vocab_size, 3);
    std::vector<int64_t> positions;
    for (int64_t i = 0; i < n; ++i) positions.push_back(3 * i + 5);
    const auto full = all_logits(*model, ids, positions);
    KVCache cache = model->make_cache(n);
    const int64_t prefill = 16;
    auto first = model->forward(row({ids.begin(), ids.begin() + prefill}),
                                row({positions.begin(), positions.begin() + prefill}), cache);
    CHECK(max_diff(first[0][0], full[prefill - 1]) <= 1e-4);
    for (int64_t i = prefill; i < n; ++i) {  // decode steps: the kernel's few-rows path
      auto step = model->forward(row({ids[i]}), row({positions[i]}), cache);
      CHECK(max_diff(step[0][0], full[i]) <= 1e-4);
    }
  }
}

TEST_CASE("ALiBi: a module compiled at two reserved offsets is reused exactly at each",
          "[llama][families][alibi]") {
  test::KernelGuard guard;
  std::vector<CpuLinearKernel> kernels = test::available_kernels();
  kernels.push_back(CpuLinearKernel::kNone);
  for (const std::string shape : {"bloom-tiny", "mpt-tiny"}) {
    const ModelConfig c = small_vocab(synthetic_config(shape));
    const auto w = random_llama_weights(c, 23, 0.15);
    for (CpuLinearKernel kernel : kernels) {
      INFO(shape << " kernels " << cpu_linear_name(kernel));
      REQUIRE(select_cpu_linear(kernel));
      const auto model = LlamaModel::from_tensors(c, w);
      const int64_t m = 12, q = 5;
      const auto module = random_ids(m, c.vocab_size, 4);
      const auto question = random_ids(q, c.vocab_size, 5);
      // The question sits at positions 80..84 both times; the module at 3..14 or at 40..51.
      std::vector<int64_t> question_positions;
      for (int64_t i = 0; i < q; ++i) question_positions.push_back(80 + i);
      std::vector<torch::Tensor> reused;
      for (int64_t offset : {int64_t{3}, int64_t{40}}) {
        std::vector<int64_t> module_positions;
        for (int64_t i = 0; i < m; ++i) module_positions.push_back(offset + i);
        // Compiled once at its reserved offset: its states, as the store keeps them.
        KVCache compiled = model->make_cache(m);
        model->forward(row(module), row(module_positions), compiled);
        const auto block = compiled.all_slots(0, m).select(2, 0).clone();
        // Reused: the states put back by reference with their positions, the question run.
        KVCache assembled = model->make_cache(m + q);
        assembled.append_block(block, module_positions);
        ForwardOptions all;
        all.all_logits = true;
        auto got = model->forward(row(question), row(question_positions), assembled, all)[0];
        // No cache: module and question in one pass at the same position ids.
        std::vector<int64_t> ids = module, positions = module_positions;
        ids.insert(ids.end(), question.begin(), question.end());
        positions.insert(positions.end(), question_positions.begin(), question_positions.end());
        const auto expected = all_logits(*model, ids, positions).narrow(0, m, q);
        const double diff = max_diff(got, expected);
        INFO("offset " << offset << " max abs diff " << diff);
        CHECK(diff <= 1e-4);
        reused.push_back(got);
      }
      // The distance between question and module differs: so do the logits.
      CHECK(max_diff(reused[0], reused[1]) > 1e-3);
    }
  }
}

TEST_CASE("make-model's BLOOM and MPT and Falcon shapes load as their family",
          "[llama][families][alibi]") {
  for (const std::string shape : {"bloom-tiny", "mpt-tiny", "falcon-tiny"}) {
    INFO(shape);
    test::TempDir dir("promptcache-family");
    make_synthetic_model(dir.path().string(), shape, 3);
    const auto model = LlamaModel::load(dir.path().string());
    const ModelConfig expected = synthetic_config(shape);
    CHECK(model->config().architecture == expected.architecture);
    CHECK(model->config().traits.position == expected.traits.position);
    CHECK(model->config().traits.fused_qkv == expected.traits.fused_qkv);
    CHECK(model->alibi_slopes().defined() == (expected.traits.position == PositionKind::kAlibi));
    const auto tok = load_tokenizer(dir.path().string());
    CHECK(tok->kind() == "bpe");
    KVCache cache = model->make_cache(64);
    const auto ids = tok->encode("Once upon a time", tok->adds_bos());
    const auto logits = model->forward(torch::tensor(std::vector<int64_t>(ids.begin(), ids.end())),
                                       torch::arange(static_cast<int64_t>(ids.size())), cache);
    CHECK(logits.isfinite().all().item<bool>());
  }
  // A fused QKV of the wrong size is refused by name and shape.
  const ModelConfig c = synthetic_config("bloom-tiny");
  auto w = random_llama_weights(c, 1, 0.1);
  w["transformer.h.1.self_attention.query_key_value.weight"] = torch::zeros({10, 96});
  try {
    LlamaModel::from_tensors(c, w, {}, "bloom-folder");
    FAIL("accepted a wrong fused QKV");
  } catch (const Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("transformer.h.1.self_attention.query_key_value.weight"));
    CHECK_THAT(e.what(), Catch::Contains("[288, 96]"));
  }
}
