// The families beyond Llama 2 (Qwen2, Qwen3, Llama 3.x, Mistral): each tiny random checkpoint
// against a plain float64 reference of that family's layer written here from the HF definitions
// (projection biases, per-head q/k RMSNorm, llama3 RoPE scaling, the sliding window by position
// ids), incremental decoding against one full pass, and real-world config.json files.
#include <torch/types.h>
#include "support/catch_torch.hpp"
#include "support/model_inputs.hpp"

#include <cmath>
#include <fstream>
#include <random>

#include "promptcache/error.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/model/synthetic.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "support/test_support.hpp"

using namespace promptcache;

namespace {

const std::vector<std::string> kFamilies = {"qwen2-tiny", "qwen3-tiny", "llama3-tiny",
                                            "mistral-tiny"};

ModelConfig family_config(const std::string& shape) {
  ModelConfig c = synthetic_config(shape);
  c.vocab_size = 97;
  return c;
}

// RoPE inverse frequencies from the definitions: theta^(-2j/d), then HF's llama3 rule.
std::vector<double> reference_frequencies(const ModelConfig& c) {
  std::vector<double> freqs;
  const int64_t d = c.head_dim;
  for (int64_t j = 0; j < d / 2; ++j) {
    double f = std::pow(c.rope_theta, -2.0 * static_cast<double>(j) / static_cast<double>(d));
    const RopeScaling& s = c.rope_scaling;
    if (s.type == RopeScaling::Type::kLinear) f /= s.factor;
    if (s.type == RopeScaling::Type::kLlama3) {
      const double old_len = static_cast<double>(s.original_max_position_embeddings);
      const double wavelen = 2 * M_PI / f;
      if (wavelen > old_len / s.low_freq_factor) {
        f /= s.factor;  // long wavelengths: interpolated
      } else if (wavelen >= old_len / s.high_freq_factor) {
        const double smooth =
            (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        f = (1 - smooth) * f / s.factor + smooth * f;
      }
    }
    freqs.push_back(static_cast<double>(static_cast<float>(f)));  // HF keeps them in float32
  }
  return freqs;
}

// Plain reference: float64, per-head loops. Token i sees token j iff mask[i][j] and, in layers
// with a sliding window, positions[j] > positions[i] - window. Returns logits [n, vocab].
torch::Tensor reference_forward(const ModelConfig& c, const std::map<std::string, torch::Tensor>& w,
                                const std::vector<int64_t>& ids,
                                const std::vector<int64_t>& positions,
                                const std::vector<std::vector<bool>>& mask) {
  auto W = [&](const std::string& name) { return w.at(name).to(torch::kFloat64); };
  auto has = [&](const std::string& name) { return w.count(name) > 0; };
  const auto n = static_cast<int64_t>(ids.size());
  const int64_t d = c.head_dim, hq = c.num_attention_heads, hkv = c.num_key_value_heads;
  const auto freqs = reference_frequencies(c);
  auto norm = [&](const torch::Tensor& x, const torch::Tensor& g) {
    return g * x / torch::sqrt(x.pow(2).mean(-1, true) + c.rms_norm_eps);
  };
  auto rope = [&](const torch::Tensor& x /*[n, d]*/) {
    auto out = x.clone();
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < d / 2; ++j) {
        const double angle =
            static_cast<double>(static_cast<float>(static_cast<double>(positions[t]) * freqs[j]));
        const double a = x[t][j].item<double>(), b = x[t][j + d / 2].item<double>();
        out[t][j] = a * std::cos(angle) - b * std::sin(angle);
        out[t][j + d / 2] = b * std::cos(angle) + a * std::sin(angle);
      }
    }
    return out;
  };
  // Biases only where the family has them (the weights of a family may be read as another's).
  auto linear = [&](const torch::Tensor& x, const std::string& name, bool bias) {
    auto y = x.matmul(W(name + ".weight").t());
    return bias && has(name + ".bias") ? y + W(name + ".bias") : y;
  };
  const FamilyTraits& t = c.traits;
  auto x = W("model.embed_tokens.weight").index_select(0, torch::tensor(ids, torch::kInt64));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto h = norm(x, W(p + "input_layernorm.weight"));
    auto q = linear(h, p + "self_attn.q_proj", t.qkv_bias);
    auto k = linear(h, p + "self_attn.k_proj", t.qkv_bias);
    auto v = linear(h, p + "self_attn.v_proj", t.qkv_bias);
    auto attn = torch::zeros({n, hq * d}, torch::kFloat64);
    for (int64_t head = 0; head < hq; ++head) {
      const int64_t kv = head / (hq / hkv);
      auto qh = q.narrow(1, head * d, d), kh = k.narrow(1, kv * d, d);
      if (t.qk_norm) {
        qh = norm(qh, W(p + "self_attn.q_norm.weight"));
        kh = norm(kh, W(p + "self_attn.k_norm.weight"));
      }
      qh = rope(qh);
      kh = rope(kh);
      auto scores = qh.matmul(kh.t()) / std::sqrt(static_cast<double>(d));
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          const bool in_window =
              !t.layer_slides(l) || positions[j] > positions[i] - t.sliding_window;
          if (!mask[i][j] || !in_window) scores[i][j] = -INFINITY;
        }
      }
      attn.narrow(1, head * d, d).copy_(scores.softmax(-1).matmul(v.narrow(1, kv * d, d)));
    }
    x = x + linear(attn, p + "self_attn.o_proj", t.o_bias);
    auto h2 = norm(x, W(p + "post_attention_layernorm.weight"));
    auto gate = linear(h2, p + "mlp.gate_proj", t.mlp_bias);
    auto up = linear(h2, p + "mlp.up_proj", t.mlp_bias);
    x = x + linear(gate * torch::sigmoid(gate) * up, p + "mlp.down_proj", t.mlp_bias);
  }
  x = norm(x, W("model.norm.weight"));
  return x.matmul(W(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight").t());
}

using test::causal_mask;
using test::random_ids;
using test::row;

}  // namespace

TEST_CASE("each family's forward equals its plain reference", "[llama][families]") {
  for (const std::string& shape : kFamilies) {
    INFO(shape);
    const ModelConfig c = family_config(shape);
    const auto w = random_llama_weights(c, 11, 0.15);
    const auto model = LlamaModel::from_tensors(c, w);
    // 40 tokens with gaps in their positions (up to 113): the window of mistral-tiny (24) cuts.
    const int64_t n = 40;
    const auto ids = random_ids(n, c.vocab_size, 5);
    std::vector<int64_t> positions;
    for (int64_t i = 0; i < n; ++i) positions.push_back(i < 20 ? i : 2 * i + 33);
    KVCache cache = model->make_cache(n);
    ForwardOptions all;
    all.all_logits = true;
    const auto got = model->forward(row(ids), row(positions), cache, all)[0];
    const auto expected = reference_forward(c, w, ids, positions, causal_mask(n));
    const double diff = (got.to(torch::kFloat64) - expected).abs().max().item<double>();
    INFO("max abs diff " << diff);
    CHECK(diff <= 1e-4);

    // The family's switch is what makes the difference: the same weights read as a plain
    // Llama 2 layer (no biases, no q/k norms, no scaling, no window) give other logits.
    ModelConfig plain = c;
    plain.traits = FamilyTraits{};
    plain.rope_scaling = RopeScaling{};
    const auto without = reference_forward(plain, w, ids, positions, causal_mask(n));
    CHECK((without - expected).abs().max().item<double>() > 1e-3);
  }
}

TEST_CASE("each family: a custom mask and a batch of rows at other positions",
          "[llama][families]") {
  for (const std::string& shape : kFamilies) {
    INFO(shape);
    const ModelConfig c = family_config(shape);
    const auto w = random_llama_weights(c, 12, 0.15);
    const auto model = LlamaModel::from_tensors(c, w);
    const int64_t n = 36;
    // Two rows: the same tokens, the second row at positions shifted by 30 after token 12 and
    // with a block mask (tokens 12.. do not see 4..11).
    const auto ids = random_ids(n, c.vocab_size, 6);
    std::vector<int64_t> p0, p1;
    auto mask1 = causal_mask(n);
    for (int64_t i = 0; i < n; ++i) {
      p0.push_back(i);
      p1.push_back(i < 12 ? i : i + 30);
      for (int64_t j = 4; j < 12; ++j) {
        if (i >= 12) mask1[i][j] = false;
      }
    }
    auto mask = torch::zeros({2, n, n}, torch::kBool);
    auto m = mask.accessor<bool, 3>();
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        m[0][i][j] = j <= i;
        m[1][i][j] = mask1[i][j];
      }
    }
    KVCache cache = model->make_cache(n + 1, 2);
    ForwardOptions options;
    options.all_logits = true;
    options.attention_mask = mask;
    auto ids2 = torch::cat({row(ids), row(ids)});
    auto pos2 = torch::cat({row(p0), row(p1)});
    const auto got = model->forward(ids2, pos2, cache, options);
    CHECK(cache.row_positions(1) == p1);
    const auto e0 = reference_forward(c, w, ids, p0, causal_mask(n));
    const auto e1 = reference_forward(c, w, ids, p1, mask1);
    CHECK((got[0].to(torch::kFloat64) - e0).abs().max().item<double>() <= 1e-4);
    CHECK((got[1].to(torch::kFloat64) - e1).abs().max().item<double>() <= 1e-4);
    // Then one decoding step per row, each at its own next position, over the batch cache.
    const auto next = random_ids(1, c.vocab_size, 7);
    auto step = model->forward(torch::tensor({next[0], next[0]}, torch::kInt64).unsqueeze(1),
                               torch::tensor({n, n + 30}, torch::kInt64).unsqueeze(1), cache);
    for (int r = 0; r < 2; ++r) {
      auto all_ids = ids;
      all_ids.push_back(next[0]);
      auto pos = r == 0 ? p0 : p1;
      pos.push_back(r == 0 ? n : n + 30);
      auto seen = r == 0 ? causal_mask(n) : mask1;
      for (auto& line : seen) line.push_back(false);
      seen.push_back(std::vector<bool>(n + 1, true));
      const auto e = reference_forward(c, w, all_ids, pos, seen);
      INFO("row " << r);
      CHECK((step[r][0].to(torch::kFloat64) - e[n]).abs().max().item<double>() <= 1e-4);
    }
  }
}

TEST_CASE("each family: incremental decoding equals one full forward pass", "[llama][families]") {
  for (const std::string& shape : kFamilies) {
    INFO(shape);
    const ModelConfig c = family_config(shape);
    const auto model = LlamaModel::from_tensors(c, random_llama_weights(c, 13, 0.15));
    const int64_t n = 48;  // twice mistral-tiny's window
    const auto ids = random_ids(n, c.vocab_size, 8);
    KVCache full_cache = model->make_cache(n);
    ForwardOptions all;
    all.all_logits = true;
    const auto full = model->forward(row(ids), torch::arange(n, torch::kInt64), full_cache, all)[0];
    KVCache cache = model->make_cache(64);
    const int64_t prefix = 10;
    const std::vector<int64_t> head(ids.begin(), ids.begin() + prefix);
    auto logits = model->forward(row(head), torch::arange(prefix, torch::kInt64), cache, all)[0];
    double diff = (logits - full.narrow(0, 0, prefix)).abs().max().item<double>();
    // Then a chunk of 7 (a prefill continued over a cache), then one token at a time.
    const std::vector<int64_t> chunk(ids.begin() + prefix, ids.begin() + prefix + 7);
    logits =
        model->forward(row(chunk), torch::arange(prefix, prefix + 7, torch::kInt64), cache, all)[0];
    diff = std::max(diff, (logits - full.narrow(0, prefix, 7)).abs().max().item<double>());
    for (int64_t t = prefix + 7; t < n; ++t) {
      auto step = model->forward(row({ids[t]}), torch::tensor({t}, torch::kInt64), cache);
      diff = std::max(diff, (step[0][0] - full[t]).abs().max().item<double>());
    }
    INFO("max abs diff " << diff);
    CHECK(diff <= 1e-4);
  }
}

TEST_CASE("a checkpoint missing a family tensor is refused by name", "[llama][families]") {
  const ModelConfig c = family_config("qwen3-tiny");
  auto w = random_llama_weights(c, 1, 0.1);
  w.erase("model.layers.1.self_attn.k_norm.weight");
  CHECK_THROWS_WITH(LlamaModel::from_tensors(c, w, {}, "q3"),
                    Catch::Contains("model.layers.1.self_attn.k_norm.weight"));
  const ModelConfig q2 = family_config("qwen2-tiny");
  auto w2 = random_llama_weights(q2, 1, 0.1);
  w2["model.layers.0.self_attn.q_proj.bias"] = torch::zeros({3});
  CHECK_THROWS_WITH(LlamaModel::from_tensors(q2, w2, {}, "q2"),
                    Catch::Contains("q_proj.bias") && Catch::Contains("shape [3]"));
}

namespace {

// config.json files as the hub ships them (trimmed of fields the runtime ignores).
const char* kQwen25 = R"({"architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896,
  "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
  "max_window_layers": 21, "model_type": "qwen2", "num_attention_heads": 14,
  "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
  "torch_dtype": "bfloat16", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";
const char* kQwen3 = R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128,
  "hidden_act": "silu", "hidden_size": 1024, "initializer_range": 0.02,
  "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
  "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})";
const char* kLlama32 = R"({"architectures": ["LlamaForCausalLM"], "attention_bias": false,
  "attention_dropout": 0.0, "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009],
  "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
  "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "use_cache": true, "vocab_size": 128256})";
const char* kMistral = R"({"architectures": ["MistralForCausalLM"], "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
  "vocab_size": 32000})";

std::string replaced(std::string s, const std::string& from, const std::string& to) {
  const auto at = s.find(from);
  REQUIRE(at != std::string::npos);
  return s.replace(at, from.size(), to);
}

}  // namespace

TEST_CASE("config.json of Qwen2.5, Qwen3, Llama 3.2 and Mistral", "[config][families]") {
  const auto q25 = ModelConfig::from_json_string(kQwen25, "qwen2.5/config.json");
  CHECK(q25.architecture == "Qwen2ForCausalLM");
  CHECK(q25.traits.qkv_bias);
  CHECK_FALSE(q25.traits.o_bias);
  CHECK_FALSE(q25.traits.qk_norm);
  CHECK(q25.traits.sliding_window == 0);  // use_sliding_window false
  CHECK(q25.tie_word_embeddings);
  CHECK(q25.head_dim == 64);
  CHECK(q25.default_chat_template() == "chatml");

  const auto q3 = ModelConfig::from_json_string(kQwen3, "qwen3/config.json");
  CHECK(q3.traits.qk_norm);
  CHECK_FALSE(q3.traits.qkv_bias);
  CHECK(q3.head_dim == 128);  // not hidden / heads (64)
  CHECK(q3.rope_scaling.type == RopeScaling::Type::kNone);

  const auto l32 = ModelConfig::from_json_string(kLlama32, "llama3.2/config.json");
  CHECK(l32.rope_scaling.type == RopeScaling::Type::kLlama3);
  CHECK(l32.rope_scaling.factor == 32.0);
  CHECK(l32.eos_token_ids == std::vector<int64_t>{128001, 128008, 128009});
  CHECK(l32.default_chat_template() == "llama-3");
  CHECK_FALSE(l32.traits.qkv_bias);

  const auto m = ModelConfig::from_json_string(kMistral, "mistral/config.json");
  CHECK(m.traits.sliding_window == 4096);
  CHECK(m.traits.layer_slides(0));
  CHECK(m.traits.layer_slides(31));
  CHECK(m.default_chat_template() == "mistral");
  // Mistral v0.2+ has no window.
  const auto m2 = ModelConfig::from_json_string(
      replaced(kMistral, R"("sliding_window": 4096)", R"("sliding_window": null)"), "m2");
  CHECK(m2.traits.sliding_window == 0);

  // Qwen with use_sliding_window: the layers from max_window_layers on use it.
  const auto qw = ModelConfig::from_json_string(
      replaced(kQwen25, R"("use_sliding_window": false)", R"("use_sliding_window": true)"), "qw");
  CHECK(qw.traits.sliding_window == 32768);
  CHECK_FALSE(qw.traits.layer_slides(20));
  CHECK(qw.traits.layer_slides(21));
  // Written and read back, every family keeps its switches.
  for (const ModelConfig& c : {q25, q3, l32, m, qw}) {
    const auto again = ModelConfig::from_json_string(c.to_json_string(), "again");
    CHECK(again.to_json_string() == c.to_json_string());
    CHECK(again.traits.qkv_bias == c.traits.qkv_bias);
    CHECK(again.traits.qk_norm == c.traits.qk_norm);
    CHECK(again.traits.sliding_window == c.traits.sliding_window);
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      CHECK(again.traits.layer_slides(l) == c.traits.layer_slides(l));
    }
  }
  // Llama with attention_bias: q/k/v and o biases; mlp_bias: the MLP's.
  const auto biased = ModelConfig::from_json_string(
      replaced(replaced(kLlama32, R"("attention_bias": false)", R"("attention_bias": true)"),
               R"("mlp_bias": false)", R"("mlp_bias": true)"),
      "b");
  CHECK(biased.traits.qkv_bias);
  CHECK(biased.traits.o_bias);
  CHECK(biased.traits.mlp_bias);
}

TEST_CASE("unsupported architectures and activations are refused with the supported list",
          "[config][families]") {
  CHECK_THROWS_WITH(
      ModelConfig::from_json_string(
          replaced(kQwen3, R"(["Qwen3ForCausalLM"])", R"(["Qwen3MoeForCausalLM"])"), "moe.json"),
      Catch::Contains("moe.json") &&
          Catch::Contains("unsupported architecture 'Qwen3MoeForCausalLM'") &&
          Catch::Contains(
              "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"));
  CHECK_THROWS_WITH(
      ModelConfig::from_json_string(
          replaced(kMistral, R"("hidden_act": "silu")", R"("hidden_act": "gelu")"), "g.json"),
      Catch::Contains("hidden_act") && Catch::Contains("gelu"));
  CHECK_THROWS_WITH(
      ModelConfig::from_json_string(
          replaced(kQwen25, R"("rope_theta": 1000000.0)",
                   R"("rope_theta": 1000000.0, "rope_scaling": {"type": "yarn", "factor": 4})"),
          "y.json"),
      Catch::Contains("unsupported type 'yarn'"));
  // dynamic NTK scaling is the plain RoPE within the context the engine runs.
  const auto dynamic = ModelConfig::from_json_string(
      replaced(kMistral, R"("rope_theta": 10000.0)",
               R"("rope_theta": 10000.0, "rope_scaling": {"type": "dynamic", "factor": 2.0})"),
      "d.json");
  CHECK(dynamic.rope_scaling.type == RopeScaling::Type::kDynamic);
}

TEST_CASE("make-model family shapes load as their family", "[llama][families]") {
  for (const std::string& shape : kFamilies) {
    INFO(shape);
    test::TempDir dir("promptcache-family");
    make_synthetic_model(dir.path().string(), shape, 3);
    const auto model = LlamaModel::load(dir.path().string());
    const ModelConfig expected = synthetic_config(shape);
    CHECK(model->config().architecture == expected.architecture);
    CHECK(model->config().traits.qkv_bias == expected.traits.qkv_bias);
    CHECK(model->config().traits.qk_norm == expected.traits.qk_norm);
    CHECK(model->config().traits.sliding_window == expected.traits.sliding_window);
    CHECK(model->config().rope_scaling.type == expected.rope_scaling.type);
    const auto tok = load_tokenizer(dir.path().string());
    CHECK(tok->kind() == synthetic_tokenizer_kind(shape));
    CHECK(static_cast<int64_t>(tok->vocab_size()) <= model->config().vocab_size);
    KVCache cache = model->make_cache(64);
    const auto ids = tok->encode("Once upon a time", tok->adds_bos());
    const auto logits = model->forward(torch::tensor(std::vector<int64_t>(ids.begin(), ids.end())),
                                       torch::arange(static_cast<int64_t>(ids.size())), cache);
    const bool finite = !logits.isnan().any().item<bool>() && !logits.isinf().any().item<bool>();
    CHECK(finite);
  }
}
