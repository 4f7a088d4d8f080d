// Llama forward: incremental decoding equals a full pass (contract 1), and arbitrary position ids
// match an independent, plainly written RoPE-attention reference.
#include <torch/types.h>
#include "support/catch_torch.hpp"

#include <c10/core/InferenceMode.h>
#include <torch/version.h>

#include <cmath>
#include <random>

#include "promptcache/error.hpp"
#include "promptcache/model/cpu_attention.hpp"
#include "promptcache/model/cpu_linear.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/model/synthetic.hpp"
#include "support/tiny_model.hpp"

using namespace promptcache;

namespace {

ModelConfig tiny_gqa_config() {
  ModelConfig c = synthetic_config("tiny");
  c.num_hidden_layers = 3;
  c.vocab_size = 97;
  return c;
}

torch::Tensor ids_tensor(const std::vector<int64_t>& ids) {
  return torch::tensor(ids, torch::kInt64).unsqueeze(0);
}

// Plain reference: float64, explicit per-head loops, GQA by index arithmetic, RoPE from its
// definition. Returns logits [n, vocab] for tokens at `positions` where token i sees j iff
// mask[i][j].
torch::Tensor reference_forward(const ModelConfig& c, const std::map<std::string, torch::Tensor>& w,
                                const std::vector<int64_t>& ids,
                                const std::vector<int64_t>& positions,
                                const std::vector<std::vector<bool>>& mask) {
  auto W = [&](const std::string& name) { return w.at(name).to(torch::kFloat64); };
  const int64_t n = ids.size(), d = c.head_dim, hq = c.num_attention_heads,
                hkv = c.num_key_value_heads;
  auto norm = [&](const torch::Tensor& x, const torch::Tensor& g) {
    return g * x / torch::sqrt(x.pow(2).mean(-1, true) + c.rms_norm_eps);
  };
  auto rope = [&](torch::Tensor x /*[n, d]*/) {
    auto out = x.clone();
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < d / 2; ++j) {
        const double angle = positions[t] * std::pow(c.rope_theta, -2.0 * j / d);
        const double a = x[t][j].item<double>(), b = x[t][j + d / 2].item<double>();
        out[t][j] = a * std::cos(angle) - b * std::sin(angle);
        out[t][j + d / 2] = b * std::cos(angle) + a * std::sin(angle);
      }
    }
    return out;
  };
  auto x = W("model.embed_tokens.weight").index_select(0, torch::tensor(ids, torch::kInt64));
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto h = norm(x, W(p + "input_layernorm.weight"));
    auto q = h.matmul(W(p + "self_attn.q_proj.weight").t());
    auto k = h.matmul(W(p + "self_attn.k_proj.weight").t());
    auto v = h.matmul(W(p + "self_attn.v_proj.weight").t());
    auto attn = torch::zeros({n, hq * d}, torch::kFloat64);
    for (int64_t head = 0; head < hq; ++head) {
      const int64_t kv = head / (hq / hkv);
      auto qh = rope(q.narrow(1, head * d, d));
      auto kh = rope(k.narrow(1, kv * d, d));
      auto vh = v.narrow(1, kv * d, d);
      auto scores = qh.matmul(kh.t()) / std::sqrt(static_cast<double>(d));
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j)
          if (!mask[i][j]) scores[i][j] = -INFINITY;
      attn.narrow(1, head * d, d).copy_(scores.softmax(-1).matmul(vh));
    }
    x = x + attn.matmul(W(p + "self_attn.o_proj.weight").t());
    auto h2 = norm(x, W(p + "post_attention_layernorm.weight"));
    auto gate = h2.matmul(W(p + "mlp.gate_proj.weight").t());
    auto up = h2.matmul(W(p + "mlp.up_proj.weight").t());
    x = x + (gate * torch::sigmoid(gate) * up).matmul(W(p + "mlp.down_proj.weight").t());
  }
  x = norm(x, W("model.norm.weight"));
  return x.matmul(W(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight").t());
}

}  // namespace

TEST_CASE("incremental decoding equals one full forward pass (GQA, f32)", "[llama]") {
  const ModelConfig c = tiny_gqa_config();
  const auto weights = random_llama_weights(c, 7, 0.15);
  const auto model = LlamaModel::from_tensors(c, weights);
  std::vector<int64_t> ids;
  std::mt19937 rng(3);
  for (int i = 0; i < 24; ++i) ids.push_back(rng() % c.vocab_size);
  const int64_t n = ids.size();

  KVCache full_cache = model->make_cache(n);
  ForwardOptions all;
  all.all_logits = true;
  auto full = model->forward(ids_tensor(ids), torch::arange(n, torch::kInt64), full_cache, all)[0];
  REQUIRE(full.sizes() == std::vector<int64_t>{n, c.vocab_size});

  // Prefill 10, then one token at a time, into a cache with spare capacity.
  KVCache cache = model->make_cache(64);
  const int64_t prefix = 10;
  std::vector<int64_t> head(ids.begin(), ids.begin() + prefix);
  auto logits =
      model->forward(ids_tensor(head), torch::arange(prefix, torch::kInt64), cache, all)[0];
  double max_diff = (logits - full.narrow(0, 0, prefix)).abs().max().item<double>();
  for (int64_t t = prefix; t < n; ++t) {
    auto step = model->forward(ids_tensor({ids[t]}), torch::tensor({t}, torch::kInt64), cache);
    max_diff = std::max(max_diff, (step[0][0] - full[t]).abs().max().item<double>());
  }
  CHECK(cache.length() == n);
  CHECK(cache.max_position() == n - 1);
  INFO("max abs diff " << max_diff);
  CHECK(max_diff <= 1e-4);
  // The logits are not trivially equal everywhere: different positions give different rows.
  CHECK((full[0] - full[n - 1]).abs().max().item<double>() > 1e-2);
}

TEST_CASE("non-contiguous position ids match a plain RoPE-attention reference", "[llama]") {
  const ModelConfig c = tiny_gqa_config();
  const auto weights = random_llama_weights(c, 11, 0.15);
  const auto model = LlamaModel::from_tensors(c, weights);
  const std::vector<int64_t> ids = {5, 17, 3, 88, 42, 9, 60, 61, 2, 33};
  const std::vector<int64_t> positions = {0, 1, 2, 40, 41, 42, 7, 8, 100, 101};
  const int64_t n = ids.size();
  // A block mask: tokens 3..5 do not see 0..2; tokens 6..9 see everything before them.
  std::vector<std::vector<bool>> mask(n, std::vector<bool>(n, false));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j <= i; ++j) mask[i][j] = !(i >= 3 && i <= 5 && j < 3);
  auto expected = reference_forward(c, weights, ids, positions, mask);

  auto bool_mask = torch::zeros({n, n}, torch::kBool);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) bool_mask[i][j] = static_cast<bool>(mask[i][j]);
  KVCache cache = model->make_cache(n);
  ForwardOptions opts;
  opts.all_logits = true;
  opts.attention_mask = bool_mask;
  auto got =
      model->forward(ids_tensor(ids), torch::tensor(positions, torch::kInt64), cache, opts)[0];
  const double diff = (got.to(torch::kFloat64) - expected).abs().max().item<double>();
  INFO("max abs diff " << diff);
  CHECK(diff <= 1e-4);

  // The same tokens fed in two chunks through the cache (second chunk sees all of the first)
  // agree with the reference under the causal mask.
  std::vector<std::vector<bool>> causal(n, std::vector<bool>(n, false));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j <= i; ++j) causal[i][j] = true;
  auto expected_causal = reference_forward(c, weights, ids, positions, causal);
  KVCache chunked = model->make_cache(n);
  ForwardOptions all;
  all.all_logits = true;
  std::vector<int64_t> a(ids.begin(), ids.begin() + 4), b(ids.begin() + 4, ids.end());
  std::vector<int64_t> pa(positions.begin(), positions.begin() + 4),
      pb(positions.begin() + 4, positions.end());
  model->forward(ids_tensor(a), torch::tensor(pa, torch::kInt64), chunked, all);
  auto tail = model->forward(ids_tensor(b), torch::tensor(pb, torch::kInt64), chunked, all)[0];
  const double diff2 =
      (tail.to(torch::kFloat64) - expected_causal.narrow(0, 4, n - 4)).abs().max().item<double>();
  INFO("chunked max abs diff " << diff2);
  CHECK(diff2 <= 1e-4);
  CHECK(chunked.positions() == positions);
}

TEST_CASE("keys are stored with RoPE applied: a shifted block equals a recomputed one", "[llama]") {
  // Two caches of the same tokens at positions p and p+50 hold different keys, and each equals
  // what a fresh forward at those positions produces.
  const ModelConfig c = tiny_gqa_config();
  const auto model = LlamaModel::from_tensors(c, random_llama_weights(c, 5, 0.15));
  const std::vector<int64_t> ids = {4, 8, 15, 16, 23};
  KVCache a = model->make_cache(8), b = model->make_cache(8);
  model->forward(ids_tensor(ids), torch::arange(5, torch::kInt64), a);
  model->forward(ids_tensor(ids), torch::arange(50, 55, torch::kInt64), b);
  CHECK((a.values(0) - b.values(0)).abs().max().item<double>() < 1e-6);  // layer 0 V: no RoPE
  CHECK((a.keys(0) - b.keys(0)).abs().max().item<double>() > 1e-3);      // K rotated differently
}

TEST_CASE("forward rejects bad input with clear errors", "[llama]") {
  const ModelConfig c = tiny_gqa_config();
  const auto model = LlamaModel::from_tensors(c, random_llama_weights(c, 1));
  KVCache cache = model->make_cache(4);
  CHECK_THROWS_WITH(model->forward(ids_tensor({1, 2}), torch::arange(3, torch::kInt64), cache),
                    Catch::Contains("2 tokens but 3 positions"));
  CHECK_THROWS_WITH(model->forward(ids_tensor({1000}), torch::arange(1, torch::kInt64), cache),
                    Catch::Contains("vocabulary"));
  CHECK_THROWS_WITH(
      model->forward(ids_tensor({1, 2, 3, 4, 5}), torch::arange(5, torch::kInt64), cache),
      Catch::Contains("capacity"));
  auto weights = random_llama_weights(c, 1);
  weights["model.layers.1.mlp.up_proj.weight"] = torch::zeros({3, 3});
  try {
    LlamaModel::from_tensors(c, weights, {}, "some/folder");
    FAIL("expected an error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kModel);
    CHECK_THAT(e.what(), Catch::Contains("model.layers.1.mlp.up_proj.weight") &&
                             Catch::Contains("some/folder") && Catch::Contains("[3, 3]"));
  }
}

TEST_CASE("f16 and bf16 forward stay close to f32", "[llama]") {
  const ModelConfig c = tiny_gqa_config();
  const auto weights = random_llama_weights(c, 9, 0.15);
  const auto f32 = LlamaModel::from_tensors(c, weights);
  const std::vector<int64_t> ids = {3, 1, 4, 1, 5, 9, 2, 6};
  KVCache c32 = f32->make_cache(8);
  auto ref = f32->forward(ids_tensor(ids), torch::arange(8, torch::kInt64), c32);
  for (auto dtype : {torch::kBFloat16, torch::kFloat16}) {
    LoadOptions o;
    o.dtype = dtype;
#if TORCH_VERSION_MAJOR < 2
    if (dtype == torch::kFloat16) {  // LibTorch 1.x has no f16 GEMM on the CPU: a clear error
      CHECK_THROWS_WITH(LlamaModel::from_tensors(c, weights, o), Catch::Contains("f16"));
      continue;
    }
#endif
    const auto low = LlamaModel::from_tensors(c, weights, o);
    KVCache cache = low->make_cache(8);
    auto got = low->forward(ids_tensor(ids), torch::arange(8, torch::kInt64), cache);
    CHECK(cache.keys(0).scalar_type() == dtype);
    const double rel = ((got - ref).abs().max() / ref.abs().max()).item<double>();
    INFO(dtype_name(dtype) << " relative diff " << rel);
    CHECK(rel < 0.1);
  }
}

TEST_CASE("long prefills (attention in query blocks) equal step-by-step decoding", "[llama]") {
  const ModelConfig c = tiny_gqa_config();
  const auto model = LlamaModel::from_tensors(c, random_llama_weights(c, 21, 0.15));
  std::mt19937 rng(8);
  std::vector<int64_t> ids;
  for (int i = 0; i < 600; ++i) ids.push_back(rng() % c.vocab_size);
  const int64_t n = ids.size();
  ForwardOptions all;
  all.all_logits = true;
  KVCache full_cache = model->make_cache(n);
  auto full = model->forward(ids_tensor(ids), torch::arange(n, torch::kInt64), full_cache, all)[0];
  // 100 tokens, then 500 in one call on top of a non-empty cache, then compare.
  KVCache cache = model->make_cache(n);
  std::vector<int64_t> head(ids.begin(), ids.begin() + 100), tail(ids.begin() + 100, ids.end());
  model->forward(ids_tensor(head), torch::arange(100, torch::kInt64), cache, all);
  auto rest = model->forward(ids_tensor(tail), torch::arange(100, n, torch::kInt64), cache, all)[0];
  const double diff = (rest - full.narrow(0, 100, n - 100)).abs().max().item<double>();
  INFO("max abs diff " << diff);
  CHECK(diff <= 1e-4);
  // The same 600 tokens with an explicit causal mask (keys are not truncated then).
  auto mask = torch::ones({n, n}, torch::kBool).tril();
  ForwardOptions masked = all;
  masked.attention_mask = mask;
  KVCache mcache = model->make_cache(n);
  auto via_mask =
      model->forward(ids_tensor(ids), torch::arange(n, torch::kInt64), mcache, masked)[0];
  CHECK((via_mask - full).abs().max().item<double>() <= 1e-4);
  // And token by token for the last few positions.
  KVCache step_cache = model->make_cache(n);
  std::vector<int64_t> most(ids.begin(), ids.end() - 3);
  model->forward(ids_tensor(most), torch::arange(n - 3, torch::kInt64), step_cache);
  for (int64_t t = n - 3; t < n; ++t) {
    auto step = model->forward(ids_tensor({ids[t]}), torch::tensor({t}, torch::kInt64), step_cache);
    CHECK((step[0][0] - full[t]).abs().max().item<double>() <= 1e-4);
  }
}

TEST_CASE("a few fresh tokens after a long prefix: same logits under InferenceMode and kernels off",
          "[llama]") {
  // 16 tokens after 200 cached ones take the CPU's small-row paths (linear kernels, the fused
  // attention KV head by KV head on threads, whose 16-wide heads every kernel takes); InferenceMode
  // in the caller must carry into those threads. Kernels off is the blocked attention.
  const ModelConfig c = tiny_gqa_config();
  const auto model = LlamaModel::from_tensors(c, random_llama_weights(c, 11, 0.15));
  std::vector<int64_t> head, fresh;
  std::mt19937 rng(5);
  for (int i = 0; i < 200; ++i) head.push_back(rng() % c.vocab_size);
  for (int i = 0; i < 16; ++i) fresh.push_back(rng() % c.vocab_size);
  ForwardOptions all;
  all.all_logits = true;
  auto run = [&] {
    KVCache cache = model->make_cache(216);
    model->forward(ids_tensor(head), torch::arange(200, torch::kInt64), cache);
    return model->forward(ids_tensor(fresh), torch::arange(200, 216, torch::kInt64), cache, all)[0];
  };
  if (cpu_linear_kernel() != CpuLinearKernel::kNone) REQUIRE(cpu_attention_available(c.head_dim));
  const auto plain = run();
  torch::Tensor under_inference;
  {
    c10::InferenceMode guard;
    under_inference = run().clone();
  }
  REQUIRE(torch::allclose(plain, under_inference, 1e-5, 1e-5));
  const auto kernel = cpu_linear_kernel();
  REQUIRE(select_cpu_linear(CpuLinearKernel::kNone));
  const auto without = run();
  select_cpu_linear(kernel);
  REQUIRE((plain - without).abs().max().item<double>() < 1e-4);
}

TEST_CASE("long inputs: the fused attention in blocks equals the blocked attention", "[llama]") {
  // With the small-row kernels on, a long input's attention runs the fused kernel in blocks of
  // 64 query tokens; with them off, the blocked attention (library GEMMs). Both must agree on a
  // causal prefill over a filled cache and on a Prompt Cache style mask with gaps, several
  // blocks long, with partial last blocks.
  const ModelConfig c = tiny_gqa_config();
  const auto model = LlamaModel::from_tensors(c, random_llama_weights(c, 31, 0.15));
  if (!cpu_attention_available(c.head_dim)) {
    WARN("no fused CPU attention here: nothing to compare");
    return;
  }
  std::mt19937 rng(12);
  std::vector<int64_t> head, tail;
  for (int i = 0; i < 150; ++i) head.push_back(rng() % c.vocab_size);
  for (int i = 0; i < 203; ++i) tail.push_back(rng() % c.vocab_size);
  const int64_t slots = 150 + 203;
  auto gaps = torch::zeros({203, slots}, torch::kBool);
  for (int64_t i = 0; i < 203; ++i) {
    for (int64_t j = 0; j < 150; ++j)
      gaps[i][j] = (j / 10) % 3 != 1;  // every third run of 10 closed
    for (int64_t j = 150; j <= 150 + i; ++j) gaps[i][j] = true;
  }
  ForwardOptions causal_all;
  causal_all.all_logits = true;
  ForwardOptions gapped = causal_all;
  gapped.attention_mask = gaps;
  auto run = [&](const ForwardOptions& options) {
    KVCache cache = model->make_cache(slots);
    model->forward(ids_tensor(head), torch::arange(150, torch::kInt64), cache);
    return model->forward(ids_tensor(tail), torch::arange(400, 603, torch::kInt64), cache,
                          options)[0];
  };
  const auto fused_causal = run(causal_all), fused_gapped = run(gapped);
  const auto kernel = cpu_linear_kernel();
  REQUIRE(select_cpu_linear(CpuLinearKernel::kNone));
  const auto blocked_causal = run(causal_all), blocked_gapped = run(gapped);
  select_cpu_linear(kernel);
  CHECK((fused_causal - blocked_causal).abs().max().item<double>() < 1e-4);
  CHECK((fused_gapped - blocked_gapped).abs().max().item<double>() < 1e-4);
  // The gaps matter: the two masks give different logits.
  CHECK((fused_causal - fused_gapped).abs().max().item<double>() > 1e-3);
}

TEST_CASE("SDPA and the blocked attention give the same logits", "[llama][attention]") {
  // kAuto takes SDPA on GPUs and the blocked attention on the CPU; both must agree wherever they
  // run: a long causal prefill (several query blocks), fresh tokens under a custom mask with
  // gaps after cached slots (the Prompt Cache case), and a decode step.
  const ModelConfig c = tiny_gqa_config();
  const auto weights = random_llama_weights(c, 13, 0.15);
  LoadOptions load = test::test_load_options();
  load.attention = AttentionImpl::kBlocked;
  const auto blocked_model = LlamaModel::from_tensors(c, weights, load);
  CHECK(blocked_model->attention_name() == "blocked");
  load.attention = AttentionImpl::kSdpa;
#if TORCH_VERSION_MAJOR < 2
  CHECK_THROWS_WITH(LlamaModel::from_tensors(c, weights, load), Catch::Contains("LibTorch 2.x"));
  WARN("LibTorch 1.x has no scaled_dot_product_attention: only its clear error is checked");
#else
  const auto sdpa_model = LlamaModel::from_tensors(c, weights, load);
  CHECK(sdpa_model->attention_name() == "sdpa");
  std::mt19937 rng(9);
  std::vector<int64_t> head, fresh;
  for (int i = 0; i < 300; ++i) head.push_back(rng() % c.vocab_size);
  for (int i = 0; i < 12; ++i) fresh.push_back(rng() % c.vocab_size);
  // Fresh tokens at positions 400.. see every other cached slot and earlier fresh tokens.
  auto mask = torch::zeros({12, 312}, torch::kBool);
  for (int64_t i = 0; i < 12; ++i) {
    for (int64_t j = 0; j < 300; j += 2) mask[i][j] = true;
    for (int64_t j = 300; j <= 300 + i; ++j) mask[i][j] = true;
  }
  ForwardOptions all;
  all.all_logits = true;
  ForwardOptions masked = all;
  masked.attention_mask = mask;
  auto run = [&](const LlamaModel& model) {
    KVCache cache = model.make_cache(320);
    auto prefill = model.forward(ids_tensor(head), torch::arange(300, torch::kInt64), cache, all);
    auto after =
        model.forward(ids_tensor(fresh), torch::arange(400, 412, torch::kInt64), cache, masked);
    auto step = model.forward(ids_tensor({fresh[0]}), torch::tensor({412}, torch::kInt64), cache);
    return std::vector<torch::Tensor>{prefill.cpu(), after.cpu(), step.cpu()};
  };
  const auto blocked = run(*blocked_model);
  const auto sdpa = run(*sdpa_model);
  for (std::size_t i = 0; i < blocked.size(); ++i) {
    INFO("part " << i << " (prefill, masked fresh tokens, decode step)");
    CHECK((blocked[i] - sdpa[i]).abs().max().item<double>() < 1e-4);
  }
#endif
}

TEST_CASE("PROMPTCACHE_ATTENTION chooses the attention of kAuto models, a bad value is an error",
          "[llama][attention]") {
  struct RestoreEnv {
    const char* old = std::getenv("PROMPTCACHE_ATTENTION");
    std::string saved = old ? old : "";
    ~RestoreEnv() {
      if (old) {
        setenv("PROMPTCACHE_ATTENTION", saved.c_str(), 1);
      } else {
        unsetenv("PROMPTCACHE_ATTENTION");
      }
    }
  } restore;
  const ModelConfig c = tiny_gqa_config();
  const auto weights = random_llama_weights(c, 3, 0.15);
  setenv("PROMPTCACHE_ATTENTION", "flash", 1);
  CHECK_THROWS_WITH(LlamaModel::from_tensors(c, weights),
                    Catch::Contains("PROMPTCACHE_ATTENTION is 'flash'"));
  setenv("PROMPTCACHE_ATTENTION", "blocked", 1);
  CHECK(LlamaModel::from_tensors(c, weights)->attention_name() == "blocked");
  LoadOptions explicit_choice;  // an explicit choice is not overridden by the environment
  explicit_choice.attention = AttentionImpl::kBlocked;
  setenv("PROMPTCACHE_ATTENTION", "flash", 1);
  CHECK(LlamaModel::from_tensors(c, weights, explicit_choice)->attention_name() == "blocked");
  unsetenv("PROMPTCACHE_ATTENTION");
  // Without a choice: the blocked attention on the CPU, whatever the LibTorch version.
  CHECK(LlamaModel::from_tensors(c, weights)->attention_name() == "blocked");
}

TEST_CASE("a batch with one mask per row equals each row run alone", "[llama][batch]") {
  // Two sequences of different lengths share one batch: row 1 is left-padded (a padding token
  // sees only itself), each row attends only to its own slots, and its positions are its own.
  // Prefill (several query blocks), fresh tokens with gaps (few rows), and a decode step.
  const ModelConfig c = tiny_gqa_config();
  const auto weights = random_llama_weights(c, 21, 0.15);
  std::vector<AttentionImpl> impls = {AttentionImpl::kBlocked};
#if TORCH_VERSION_MAJOR >= 2
  impls.push_back(AttentionImpl::kSdpa);
#endif
  std::mt19937 rng(5);
  auto tokens = [&](int n) {
    std::vector<int64_t> t;
    for (int i = 0; i < n; ++i) t.push_back(rng() % c.vocab_size);
    return t;
  };
  const int64_t len = 300, pad = 120, fresh = 6;
  const auto a = tokens(len), b = tokens(len - pad), fa = tokens(fresh), fb = tokens(fresh);
  for (AttentionImpl impl : impls) {
    LoadOptions load = test::test_load_options();
    load.attention = impl;
    const auto model = LlamaModel::from_tensors(c, weights, load);
    INFO("attention " << model->attention_name());
    ForwardOptions all;
    all.all_logits = true;

    // Alone. Row 0: positions 0.., fresh tokens at 500.. see every other slot. Row 1: positions
    // 100.., fresh tokens at 700.. see every slot.
    KVCache alone0 = model->make_cache(len + fresh + 1);
    auto p0 = model->forward(ids_tensor(a), torch::arange(len, torch::kInt64), alone0, all)[0];
    auto gaps = torch::zeros({fresh, len + fresh}, torch::kBool);
    for (int64_t i = 0; i < fresh; ++i) {
      for (int64_t j = 0; j < len; j += 2) gaps[i][j] = true;
      for (int64_t j = len; j <= len + i; ++j) gaps[i][j] = true;
    }
    ForwardOptions gapped;
    gapped.attention_mask = gaps;
    auto f0 = model->forward(ids_tensor(fa), torch::arange(500, 500 + fresh, torch::kInt64), alone0,
                             gapped)[0][0];
    // (The decode steps see every slot.)
    auto d0 = model->forward(ids_tensor({fa[0]}), torch::tensor({600}, torch::kInt64), alone0);
    KVCache alone1 = model->make_cache(len + fresh + 1);
    auto p1 = model->forward(ids_tensor(b), torch::arange(100, 100 + len - pad, torch::kInt64),
                             alone1, all)[0];
    auto f1 = model->forward(ids_tensor(fb), torch::arange(700, 700 + fresh, torch::kInt64),
                             alone1)[0][0];
    auto d1 = model->forward(ids_tensor({fb[1]}), torch::tensor({800}, torch::kInt64), alone1);

    // Together.
    KVCache both = model->make_cache(len + fresh + 1, 2);
    std::vector<int64_t> b_padded(pad, 0), b_pos(pad, 0);
    b_padded.insert(b_padded.end(), b.begin(), b.end());
    for (int64_t i = 0; i < len - pad; ++i) b_pos.push_back(100 + i);
    auto causal = torch::ones({len, len}, torch::kBool).tril();
    auto mask = torch::stack({causal, causal.clone()});
    mask[1].narrow(0, 0, pad).fill_(false);
    mask[1].narrow(1, 0, pad).fill_(false);
    for (int64_t i = 0; i < pad; ++i) mask[1][i][i] = true;
    ForwardOptions prefill = all;
    prefill.attention_mask = mask;
    auto pb = model->forward(
        torch::stack({torch::tensor(a), torch::tensor(b_padded)}),
        torch::stack({torch::arange(len, torch::kInt64), torch::tensor(b_pos)}), both, prefill);
    auto fresh_mask = torch::zeros({2, fresh, len + fresh}, torch::kBool);
    fresh_mask[0].copy_(gaps);
    for (int64_t i = 0; i < fresh; ++i) {
      fresh_mask[1][i].narrow(0, pad, len - pad).fill_(true);
      for (int64_t j = len; j <= len + i; ++j) fresh_mask[1][i][j] = true;
    }
    ForwardOptions fresh_options;
    fresh_options.attention_mask = fresh_mask;
    auto fb_logits = model->forward(torch::stack({torch::tensor(fa), torch::tensor(fb)}),
                                    torch::stack({torch::arange(500, 500 + fresh, torch::kInt64),
                                                  torch::arange(700, 700 + fresh, torch::kInt64)}),
                                    both, fresh_options);
    auto step_mask = torch::ones({2, 1, len + fresh + 1}, torch::kBool);
    step_mask[1][0].narrow(0, 0, pad).fill_(false);
    ForwardOptions step_options;
    step_options.attention_mask = step_mask;
    auto db =
        model->forward(torch::tensor({fa[0], fb[1]}).unsqueeze(1),
                       torch::tensor({600, 800}, torch::kInt64).unsqueeze(1), both, step_options);

    auto diff = [](const torch::Tensor& x, const torch::Tensor& y) {
      return (x.cpu().reshape({-1}) - y.cpu().reshape({-1})).abs().max().item<double>();
    };
    CHECK(diff(pb[0], p0) < 1e-4);
    CHECK(diff(pb[1].narrow(0, pad, len - pad), p1) < 1e-4);
    CHECK(diff(fb_logits[0][0], f0) < 1e-4);
    CHECK(diff(fb_logits[1][0], f1) < 1e-4);
    CHECK(diff(db[0], d0) < 1e-4);
    CHECK(diff(db[1], d1) < 1e-4);
    // The comparison is sharp: without row 1's own mask (it would see row 0's layout) it fails.
    CHECK(diff(pb[1].narrow(0, pad, len - pad), p0.narrow(0, pad, len - pad)) > 1e-2);
  }
}

TEST_CASE("a per-row mask must match the batch", "[llama][batch]") {
  const ModelConfig c = tiny_gqa_config();
  const auto model = LlamaModel::from_tensors(c, random_llama_weights(c, 2, 0.15));
  KVCache cache = model->make_cache(8, 2);
  ForwardOptions options;
  options.attention_mask = torch::ones({3, 4, 4}, torch::kBool);
  CHECK_THROWS_WITH(model->forward(torch::zeros({2, 4}, torch::kInt64),
                                   torch::arange(4, torch::kInt64).repeat({2, 1}), cache, options),
                    Catch::Contains("attention mask must be [4, 4] or [2, 4, 4] but is [3, 4, 4]"));
}

TEST_CASE("a batch given one row of positions for all its rows equals each row run alone",
          "[llama][batch]") {
  // Positions [n] (or [1, n]) serve every row of the batch; a few rows take the CPU's fused
  // elementwise steps, which must broadcast them as the library operators do.
  const ModelConfig c = tiny_gqa_config();
  const auto model = LlamaModel::from_tensors(c, random_llama_weights(c, 23, 0.15));
  const std::vector<int64_t> r0 = {3, 14, 15, 92, 65}, r1 = {35, 89, 79, 32, 38};
  auto positions = torch::arange(10, 15, torch::kInt64);
  ForwardOptions all;
  all.all_logits = true;
  auto alone = [&](const std::vector<int64_t>& ids) {
    KVCache cache = model->make_cache(5);
    return model->forward(ids_tensor(ids), positions, cache, all)[0];
  };
  KVCache batch_cache = model->make_cache(5, 2);
  auto ids = torch::cat({ids_tensor(r0), ids_tensor(r1)}, 0);
  auto both = model->forward(ids, positions, batch_cache, all);
  CHECK((both[0] - alone(r0)).abs().max().item<double>() < 1e-5);
  CHECK((both[1] - alone(r1)).abs().max().item<double>() < 1e-5);
}
