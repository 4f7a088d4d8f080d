// benchmarks/bench_fresh.cpp — where the time of a cached request's fresh forward goes: a few
// tokens (a question) run through the model over a long filled KV cache (the assembled modules),
// as Engine::generate does after assembly, plus one decode step over the same cache.
//
// For each context size and question length, one JSON line with the whole forward and its parts,
// each timed on its own with the same calls the forward makes (best of the repeats, ms):
//   linears_ms    the weight GEMMs of every layer (q, k, v, o, gate, up, down), weights streamed
//                 from memory layer after layer as in the forward; qkv_ms, o_ms, gate_up_ms and
//                 down_ms are its parts, each timed alone over the 12 layers;
//   lm_head_ms    the last token's logits;
//   attention_ms  the attention core of every layer over the cache (fused kernel: scores, mask,
//                 softmax, product with V), only where the fused CPU attention runs;
//   rest_ms       forward_ms minus the three (norms, RoPE, activations, residuals, mask setup);
//   weight_gb_s   the bytes of the layer weights over linears_ms.
// --kernels on,off runs both settings of the CPU's small-row paths, interleaved.
//
//   build/benchmarks/bench_fresh [--context 512,2048,4096] [--fresh 16,64] [--repeats 7]
//                                [--shape bench-small] [--kernels on|off|avx512|avx2,...]
//                                [--checkpoint bf16|f16|f32] [--weights f32|bf16|f16]
//                                [--kv-dtype f32|bf16|f16] [--only forward]
// The synthetic checkpoint is stored in --checkpoint (default bf16, as the other benchmarks) and
// every dtype left unset follows it as for a user's folder (the defaults: bf16 weights mapped,
// bf16 KV, f32 compute). --only forward times the forward alone (for a profiler).
#include <torch/types.h>

#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "bench_kernels.hpp"
#include "promptcache/model/cpu_attention.hpp"
#include "promptcache/model/cpu_linear.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/model/synthetic.hpp"
#include "promptcache/model/threads.hpp"

namespace pc = promptcache;
using ordered_json = nlohmann::ordered_json;

namespace {

// Wall time of one call of f, ms.
template <class F>
double time_ms(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  namespace bench = pc::bench;
  const bench::Flags flags(argc, argv, "bench_fresh",
                           {"context", "fresh", "repeats", "shape", "kernels", "checkpoint",
                            "weights", "kv-dtype", "only"});
  const auto contexts = flags.list("context", {512, 2048, 4096});
  const auto fresh_sizes = flags.list("fresh", {16, 64});
  const int repeats = std::max(1, flags.integer("repeats", 7));
  const std::string shape = flags.text("shape", "bench-small");
  const auto settings = bench::kernel_settings("bench_fresh", flags.words("kernels", "on"));

  const auto threads = pc::configure_threads();
  c10::InferenceMode inference;
  const pc::ModelConfig c = pc::synthetic_config(shape);
  std::cerr << "bench_fresh: making " << shape << " weights...\n";
  const std::string checkpoint = flags.text("checkpoint", "bf16");
  const bool forward_only = flags.text("only", "") == "forward";
  std::map<std::string, torch::Tensor> stored;
  for (auto& [name, t] : pc::random_llama_weights(c, 1, 0.02)) {
    stored[name] = t.to(pc::parse_dtype(checkpoint));
  }
  pc::LoadOptions load;
  if (!flags.text("weights", "").empty()) {
    load.weights = pc::parse_dtype(flags.text("weights", ""));
  }
  if (!flags.text("kv-dtype", "").empty()) {
    load.kv_dtype = pc::parse_dtype(flags.text("kv-dtype", ""));
  }
  const auto model = pc::LlamaModel::from_tensors(c, stored, load, shape);
  // The matrices the parts below time, in the dtype the model keeps them in.
  std::map<std::string, torch::Tensor> weights;
  for (const auto& [name, t] : stored) {
    weights[name] = t.dim() == 2 ? t.to(model->weight_dtype()) : t;
  }
  std::cerr << "bench_fresh: weights " << pc::dtype_name(model->weight_dtype()) << ", KV "
            << pc::dtype_name(model->kv_dtype()) << "\n";
  const int64_t layers = c.num_hidden_layers, hkv = c.num_key_value_heads, d = c.head_dim;
  const int64_t groups = c.num_attention_heads / hkv;
  double weight_bytes = 0;
  for (const auto& [name, w] : weights) {
    if (name.find("model.layers.") == 0 && w.dim() == 2)
      weight_bytes += w.numel() * w.element_size();
  }

  for (int context : contexts) {
    // The cache holds `context` filled slots (random states: speed does not depend on them).
    // Room for the longest question and a decode step.
    const int longest = *std::max_element(fresh_sizes.begin(), fresh_sizes.end());
    pc::KVCache cache = model->make_cache(context + longest + 1);
    for (int64_t l = 0; l < layers; ++l) {
      cache.key_slots(l, 0, context).normal_();
      cache.value_slots(l, 0, context).normal_();
    }
    std::vector<int64_t> positions(context);
    for (int64_t i = 0; i < context; ++i) positions[i] = i;
    cache.fill_external(context, positions);

    for (int fresh : fresh_sizes) {
      const auto ids = torch::randint(0, c.vocab_size, {fresh}, torch::kInt64);
      const auto pos = torch::arange(context, context + fresh, torch::kInt64);
      // The Prompt Cache mask: every cached slot, the fresh tokens causally.
      auto mask = torch::ones({fresh, context + fresh}, torch::kBool);
      mask.narrow(1, context, fresh).copy_(torch::tril(torch::ones({fresh, fresh}, torch::kBool)));
      pc::ForwardOptions options;
      options.attention_mask = mask;
      const auto x = torch::randn({1, fresh, c.hidden_size});
      const auto xo = torch::randn({1, fresh, c.num_attention_heads * d});
      const auto xf = torch::randn({1, fresh, c.intermediate_size});
      const auto last = torch::randn({1, 1, c.hidden_size});
      const auto qg = torch::randn({1, hkv, groups * fresh, d}) / std::sqrt(double(d));

      struct Sample {
        std::vector<double> forward, decode, linears, lm_head, attention;
        std::vector<double> qkv, o, gate_up, down;
      };
      std::vector<Sample> samples(settings.size());
      for (int r = 0; r < repeats; ++r) {
        for (std::size_t s = 0; s < settings.size(); ++s) {
          pc::select_cpu_linear(settings[s]);
          Sample& out = samples[s];
          out.forward.push_back(time_ms([&] { model->forward(ids, pos, cache, options); }));
          out.decode.push_back(time_ms([&] {
            model->forward(ids.narrow(0, 0, 1), torch::tensor({context + fresh}, torch::kInt64),
                           cache);
          }));
          cache.truncate(context);
          if (forward_only) continue;
          auto each_layer = [&](const std::vector<const char*>& names, const torch::Tensor& in) {
            return time_ms([&] {
              for (int64_t l = 0; l < layers; ++l) {
                const std::string p = "model.layers." + std::to_string(l) + ".";
                for (const char* name : names) {
                  pc::linear_layer(in, weights.at(p + name + ".weight"));
                }
              }
            });
          };
          out.qkv.push_back(
              each_layer({"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}, x));
          out.o.push_back(each_layer({"self_attn.o_proj"}, xo));
          out.gate_up.push_back(each_layer({"mlp.gate_proj", "mlp.up_proj"}, x));
          out.down.push_back(each_layer({"mlp.down_proj"}, xf));
          out.linears.push_back(time_ms([&] {
            for (int64_t l = 0; l < layers; ++l) {
              const std::string p = "model.layers." + std::to_string(l) + ".";
              for (const char* name : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                       "mlp.gate_proj", "mlp.up_proj"}) {
                pc::linear_layer(x, weights.at(p + name + ".weight"));
              }
              pc::linear_layer(xo, weights.at(p + "self_attn.o_proj.weight"));
              pc::linear_layer(xf, weights.at(p + "mlp.down_proj.weight"));
            }
          }));
          out.lm_head.push_back(
              time_ms([&] { pc::linear_layer(last, weights.at("model.embed_tokens.weight")); }));
          if (pc::cpu_attention_available(d)) {
            out.attention.push_back(time_ms([&] {
              for (int64_t l = 0; l < layers; ++l) {
                pc::attend_few_queries(qg, cache.key_slots(l, 0, context + fresh),
                                       cache.value_slots(l, 0, context + fresh), mask, context,
                                       pc::kernel_threads());
              }
            }));
          }
        }
      }
      for (std::size_t s = 0; s < settings.size(); ++s) {
        const Sample& v = samples[s];
        if (forward_only) {
          std::cout << ordered_json{{"bench", "fresh"},
                                    {"context", context},
                                    {"fresh_tokens", fresh},
                                    {"forward_ms", bench::best_time(v.forward)},
                                    {"decode_step_ms", bench::best_time(v.decode)}}
                           .dump()
                    << std::endl;
          continue;
        }
        const double forward = bench::best_time(v.forward), linears = bench::best_time(v.linears);
        const double lm_head = bench::best_time(v.lm_head);
        ordered_json j;
        j["bench"] = "fresh";
        j["shape"] = shape;
        j["kernels"] = pc::cpu_linear_name(settings[s]);
        j["context"] = context;
        j["fresh_tokens"] = fresh;
        j["forward_ms"] = forward;
        j["forward_ms_median"] = bench::median_time(v.forward);
        j["decode_step_ms"] = bench::best_time(v.decode);
        j["weights"] = pc::dtype_name(model->weight_dtype());
        j["kv_dtype"] = pc::dtype_name(model->kv_dtype());
        j["linears_ms"] = linears;
        j["qkv_ms"] = bench::best_time(v.qkv);
        j["o_ms"] = bench::best_time(v.o);
        j["gate_up_ms"] = bench::best_time(v.gate_up);
        j["down_ms"] = bench::best_time(v.down);
        j["lm_head_ms"] = lm_head;
        if (!v.attention.empty()) {
          const double attention = bench::best_time(v.attention);
          j["attention_ms"] = attention;
          j["rest_ms"] = forward - linears - lm_head - attention;
        } else {
          j["attention_ms"] = nullptr;
          j["rest_ms"] = nullptr;
        }
        j["weight_gb_s"] = weight_bytes / (linears * 1e6);
        j["threads"] = threads.blas_threads > 0 ? threads.blas_threads : pc::kernel_threads();
        std::cout << j.dump() << std::endl;
      }
    }
  }
  return 0;
}
