// bench_prefill — prefill and decode speed of the Llama forward on the synthetic bench-small model,
// compared with a plain torch::matmul of comparable size measured in the same run.
//
//   build-bench/benchmarks/bench_prefill [--tokens 16,32,...,2048]
//       [--weights default,f32,bf16,f16,q8,q4_0,q8_0,q4_k,q5_k,q6_k] [--kv-dtype
//       default,f32,bf16,f16]
//       [--checkpoint bf16|f16|f32] [--shape bench-small|tinyllama-1.1b] [--threads N]
//       [--torch-threads N] [--repeats R] [--decode-steps D] [--kernels on] [--breakdown]
//       [--model FILE.gguf|DIR]
//
// --model runs a model file or folder (a GGUF file of any type `promptcache convert` writes)
// instead of the synthetic checkpoint, its dtypes as it chooses them (--weights default or a
// dtype); each line then has the file's bytes and the process's resident memory (VmRSS) before
// the load, right after it and after the runs, whose differences are what the model holds
// (weights; then KV cache, activations, scratch) against the file's size. The config is read
// from the file's metadata (no load before the measured one), and the reference matmul (below)
// runs once at its largest size before the load, so its buffers (OpenBLAS's, the allocator's)
// are in the baseline rather than counted as the model's.
// The synthetic checkpoint is stored in --checkpoint (default bf16, as current HuggingFace models
// ship); "default" (the default of both lists) leaves the dtype unset, so the model chooses it
// for that checkpoint as a user's does (choose_dtypes: bf16 weights mapped as stored, bf16 KV,
// f32 compute on the CPU). --kernels on,avx512,avx512-bf16 (benchmarks/bench_kernels.hpp) runs
// every setting under each CPU kernel in turn: on an AVX512_BF16 processor `--weights f32,bf16
// --kernels avx512,avx512-bf16` compares f32 weights, bf16 widened to f32 and bf16 dot products
// (vdpbf16ps) in one run. One JSON line per kernel, weights setting, KV setting and token count,
// with the dtypes chosen and the weights' resident bytes. The decode steps run after the prefill,
// over its n tokens of context: with long inputs they show what a bf16/f16 KV cache (half the bytes
// the attention reads) saves. Times are the BEST of R repeats (the machine is shared with builds,
// so the minimum is the least disturbed measurement); the median prefill time is printed too.
// --breakdown also times the parts of one decoder layer (re-implemented here with the same LibTorch
// calls as src/model/llama.cpp) to show where the prefill time goes; its layer_sum_ms adds up the
// parts of the full-square attention, attention_core_blocked256_ms is what the blocked 1.x path
// costs instead.
#include <ATen/ATen.h>
#include <torch/types.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "bench_ggml.hpp"
#include "bench_kernels.hpp"
#include "promptcache/generation.hpp"
#include "promptcache/model/blas_core.hpp"
#include "promptcache/model/gguf_config.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/model/synthetic.hpp"
#include "promptcache/model/threads.hpp"

namespace pc = promptcache;
using ordered_json = nlohmann::ordered_json;

namespace {

using pc::bench::block_type_named;

struct Args {
  // The few-row kernels' range (to kCpuLinearMaxRows = 256) in steps, so a cliff shows, then
  // the long inputs.
  std::vector<int64_t> tokens{16, 32, 64, 96, 128, 192, 256, 512, 1024, 2048};
  std::vector<std::string> weights{"default"};
  std::vector<std::string> kv_dtypes{"default"};
  std::string checkpoint = "bf16";
  std::vector<std::string> kernels{"on"};
  std::string shape = "bench-small";
  int threads = 0;
  int torch_threads = 0;
  int repeats = 3;
  int decode_steps = 16;
  bool breakdown = false;
  std::string model;  // a GGUF file or a folder instead of the synthetic checkpoint
};

// The process's resident memory (VmRSS) in bytes; 0 where /proc cannot say.
int64_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return 0;
}

// The process's anonymous resident memory (RssAnon: heap, thread stacks, copies of weights, the
// KV cache) in bytes; 0 where /proc cannot say.
int64_t anonymous_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("RssAnon:", 0) == 0) return std::atoll(line.c_str() + 8) * 1024;
  }
  return 0;
}

// Resident bytes of the process's mappings of `path` (/proc/self/smaps): the pages of a mapped
// model file that a run has touched.
int64_t mapped_file_bytes(const std::string& path) {
  std::error_code ec;
  const std::string file = std::filesystem::canonical(path, ec).string();
  if (ec) return 0;
  std::ifstream smaps("/proc/self/smaps");
  int64_t total = 0;
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    // A mapping's first line starts with its address range ("7f..-7f.. r--s ... /path"); the
    // lines of its fields with a name and a colon ("Rss:   123 kB").
    const auto dash = line.find('-');
    const bool mapping =
        dash != std::string::npos && dash > 0 &&
        std::all_of(line.begin(), line.begin() + static_cast<long>(dash),
                    [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; });
    if (mapping) {
      const auto slash = line.find('/');
      inside = slash != std::string::npos && line.compare(slash, std::string::npos, file) == 0;
    } else if (inside && line.rfind("Rss:", 0) == 0) {
      total += std::atoll(line.c_str() + 4) * 1024;
    }
  }
  return total;
}

[[noreturn]] void usage(const std::string& problem) {
  std::cerr << "bench_prefill: " << problem
            << "\nusage: bench_prefill [--tokens 16,32,64,96,128,192,256,512,1024,2048] "
               "[--weights default,f32,bf16,f16,q8] [--kv-dtype default,f32,bf16,f16] "
               "[--checkpoint bf16|f16|f32] [--shape bench-small|tinyllama-1.1b] [--threads N] "
               "[--torch-threads N] [--repeats R] [--decode-steps D] "
               "[--kernels on,off,avx512-bf16,avx512,avx2] [--breakdown] [--model FILE.gguf|DIR]\n";
  std::exit(2);
}

int64_t parse_int(const std::string& flag, const std::string& text, int64_t min) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v < min)
    usage(flag + " needs an integer >= " + std::to_string(min) + ", got '" + text + "'");
  return v;
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--breakdown") {
      a.breakdown = true;
      continue;
    }
    if (flag == "--help" || flag == "-h") usage("help");
    if (i + 1 >= argc) usage(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--tokens") {
      a.tokens.clear();
      std::stringstream ss(value);
      std::string item;
      while (std::getline(ss, item, ',')) a.tokens.push_back(parse_int(flag, item, 1));
      if (a.tokens.empty()) usage("--tokens needs at least one count");
    } else if (flag == "--weights") {
      a.weights.clear();
      std::stringstream ss(value);
      std::string item;
      while (std::getline(ss, item, ',')) {
        try {
          if (item != "default" && !block_type_named(item)) pc::parse_weight_dtype(item);
        } catch (const std::exception& e) {
          usage(std::string("--weights: ") + e.what());
        }
        a.weights.push_back(item);
      }
      if (a.weights.empty()) usage("--weights needs at least one dtype");
    } else if (flag == "--kv-dtype") {
      a.kv_dtypes.clear();
      std::stringstream ss(value);
      std::string item;
      while (std::getline(ss, item, ',')) {
        try {
          if (item != "default") pc::parse_dtype(item);
        } catch (const std::exception& e) {
          usage(std::string("--kv-dtype: ") + e.what());
        }
        a.kv_dtypes.push_back(item);
      }
      if (a.kv_dtypes.empty()) usage("--kv-dtype needs at least one dtype");
    } else if (flag == "--checkpoint") {
      try {
        pc::parse_dtype(value);
      } catch (const std::exception& e) {
        usage(std::string("--checkpoint: ") + e.what());
      }
      a.checkpoint = value;
    } else if (flag == "--kernels") {
      a.kernels.clear();
      std::stringstream ss(value);
      std::string item;
      while (std::getline(ss, item, ',')) a.kernels.push_back(item);
      if (a.kernels.empty()) usage("--kernels needs at least one setting");
    } else if (flag == "--shape") {
      a.shape = value;
    } else if (flag == "--model") {
      a.model = value;
    } else if (flag == "--threads") {
      a.threads = static_cast<int>(parse_int(flag, value, 0));
    } else if (flag == "--torch-threads") {
      a.torch_threads = static_cast<int>(parse_int(flag, value, 0));
    } else if (flag == "--repeats") {
      a.repeats = static_cast<int>(parse_int(flag, value, 1));
    } else if (flag == "--decode-steps") {
      a.decode_steps = static_cast<int>(parse_int(flag, value, 0));
    } else {
      usage("unknown flag " + flag);
    }
  }
  if (!a.model.empty()) {
    for (const std::string& w : a.weights) {
      if (block_type_named(w))
        usage("--weights " + w +
              " quantizes the synthetic checkpoint; with --model the file's types run");
    }
    if (a.breakdown) usage("--breakdown needs the synthetic checkpoint (no --model)");
  }
  return a;
}

// Best time (ms) of `reps` calls of fn, after one untimed call.
double time_best(int reps, const std::function<void()>& fn) {
  fn();
  double b = std::numeric_limits<double>::infinity();
  for (int r = 0; r < reps; ++r) {
    const double t0 = pc::now_ms();
    fn();
    b = std::min(b, pc::now_ms() - t0);
  }
  return b;
}

// GFLOP/s of [n, 768] x [768, 2048] f32 (the shape of the MLP's gate/up projections), best of 5.
double gemm_gflops(int64_t n, int64_t k, int64_t m) {
  auto a = torch::randn({n, k});
  auto b = torch::randn({k, m});
  torch::Tensor c;
  const double ms = time_best(5, [&] { c = torch::matmul(a, b); });
  return 2.0 * n * k * m / (ms * 1e-3) / 1e9;
}

// --breakdown: the parts of one decoder layer on n fresh tokens, as src/model/llama.cpp computes
// them (LibTorch 1.x branch), each timed alone (best of reps), in ms for one layer.
ordered_json layer_breakdown(const pc::ModelConfig& c,
                             const std::map<std::string, torch::Tensor>& w, int64_t n, int reps) {
  const std::string p = "model.layers.0.";
  const auto& wq = w.at(p + "self_attn.q_proj.weight");
  const auto& wk = w.at(p + "self_attn.k_proj.weight");
  const auto& wv = w.at(p + "self_attn.v_proj.weight");
  const auto& wo = w.at(p + "self_attn.o_proj.weight");
  const auto& wg = w.at(p + "mlp.gate_proj.weight");
  const auto& wu = w.at(p + "mlp.up_proj.weight");
  const auto& wd = w.at(p + "mlp.down_proj.weight");
  const auto& norm = w.at(p + "input_layernorm.weight");
  const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_attention_heads;
  const int64_t hkv = c.num_key_value_heads, groups = hq / hkv, b = 1;
  const double eps = c.rms_norm_eps;

  auto x = torch::randn({b, n, h});
  auto rms = [&](const torch::Tensor& t) {
    auto f = t.to(torch::kFloat32);
    f = f * torch::rsqrt(f.pow(2).mean(-1, true) + eps);
    return norm * f;
  };
  auto rot = [](const torch::Tensor& t) {
    const int64_t half = t.size(-1) / 2;
    return torch::cat({-t.narrow(-1, half, half), t.narrow(-1, 0, half)}, -1);
  };
  auto pos = torch::arange(n, torch::kInt64).to(torch::kFloat32).unsqueeze(-1);
  auto inv = torch::rand({d / 2});
  auto emb = torch::cat({pos * inv, pos * inv}, -1);
  auto cos = emb.cos().unsqueeze(0).unsqueeze(0), sin = emb.sin().unsqueeze(0).unsqueeze(0);
  auto cols = torch::arange(n).unsqueeze(0), rows = torch::arange(n).unsqueeze(1);
  auto mask = cols <= rows;
  auto q = torch::linear(x, wq).view({b, n, hq, d}).transpose(1, 2);
  auto k = torch::linear(x, wk).view({b, n, hkv, d}).transpose(1, 2);
  auto v = torch::linear(x, wv).view({b, n, hkv, d}).transpose(1, 2).contiguous();
  auto kc = k.contiguous();  // as read back from the cache
  auto qg = q.reshape({b, hkv, groups * n, d});
  auto scores = torch::matmul(qg, kc.transpose(-1, -2));
  auto probs = scores.softmax(-1);
  auto attn = torch::matmul(probs, v);
  auto merged = attn.view({b, hq, n, d}).transpose(1, 2).reshape({b, n, hq * d});
  auto hid = torch::silu(torch::linear(x, wg)) * torch::linear(x, wu);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  auto additive = torch::zeros({n, n}).masked_fill_(mask.logical_not(), neg_inf);

  ordered_json j;
  j["bench"] = "prefill_breakdown";
  j["tokens"] = n;
  torch::Tensor sink;
  j["rms_norm_x2_ms"] = 2 * time_best(reps, [&] { sink = rms(x); });
  j["qkv_proj_ms"] = time_best(reps, [&] {
    sink = torch::linear(x, wq);
    sink = torch::linear(x, wk);
    sink = torch::linear(x, wv);
  });
  j["rope_ms"] = time_best(reps, [&] {
    sink = q * cos + rot(q) * sin;
    sink = k * cos + rot(k) * sin;
  });
  j["q_group_reshape_ms"] = time_best(reps, [&] { sink = q.reshape({b, hkv, groups * n, d}); });
  j["scores_matmul_ms"] = time_best(reps, [&] { sink = torch::matmul(qg, kc.transpose(-1, -2)); });
  j["scale_ms"] = time_best(reps, [&] { scores.mul_(1.0); });
  j["mask_fill_ms"] = time_best(reps, [&] {
    scores.view({b, hkv, groups, n, n}).masked_fill_(mask.logical_not(), neg_inf);
  });
  j["softmax_ms"] = time_best(reps, [&] { sink = scores.softmax(-1); });
  j["pv_matmul_ms"] = time_best(reps, [&] { sink = torch::matmul(probs, v); });
  j["merge_heads_ms"] = time_best(reps, [&] {
    sink = attn.view({b, hq, n, d}).transpose(1, 2).reshape({b, n, hq * d});
  });
  j["o_proj_ms"] = time_best(reps, [&] { sink = torch::linear(merged, wo); });
  j["mlp_gate_up_ms"] = time_best(reps, [&] {
    sink = torch::linear(x, wg);
    sink = torch::linear(x, wu);
  });
  j["mlp_silu_mul_ms"] = time_best(reps, [&] { sink = torch::silu(hid) * hid; });
  j["mlp_down_ms"] = time_best(reps, [&] { sink = torch::linear(hid, wd); });
  j["residual_add_x2_ms"] = 2 * time_best(reps, [&] { sink = x + x; });
  // The attention core as one unit (scores, scale, mask, softmax, PV) over the full n x n square...
  j["attention_core_full_ms"] = time_best(reps, [&] {
    auto s = torch::matmul(qg, kc.transpose(-1, -2));
    s.mul_(1.0 / std::sqrt(static_cast<double>(d)));
    s.view({b, hkv, groups, n, n}).masked_fill_(mask.logical_not(), neg_inf);
    sink = torch::matmul(s.softmax(-1), v);
  });
  // ...and blocked causally as src/model/llama.cpp does it (1.x path): query rows in blocks of 256,
  // each against keys [0, block end) only, so the masked upper triangle is never computed.
  j["attention_core_blocked256_ms"] = time_best(reps, [&] {
    const int64_t chunk = 256;
    auto q5 = q.reshape({b, hkv, groups, n, d});
    auto out = torch::empty({b, hkv, groups, n, d});
    for (int64_t s0 = 0; s0 < n; s0 += chunk) {
      const int64_t c = std::min(chunk, n - s0), e = s0 + c;
      auto qc = q5.narrow(3, s0, c).reshape({b, hkv, groups * c, d});
      auto s = torch::matmul(qc, kc.narrow(2, 0, e).transpose(-1, -2));
      s.mul_(1.0 / std::sqrt(static_cast<double>(d)));
      s.view({b, hkv, groups, c, e})
          .masked_fill_(mask.narrow(0, s0, c).narrow(1, 0, e).logical_not(), neg_inf);
      out.narrow(3, s0, c).copy_(
          torch::matmul(s.softmax(-1), v.narrow(2, 0, e)).view({b, hkv, groups, c, d}));
    }
    sink = out;
  });
  // Alternatives for the attention core, for comparison with scores+scale+mask+softmax.
  j["alt_baddbmm_additive_mask_softmax_ms"] = time_best(reps, [&] {
    auto s = torch::baddbmm(additive.expand({hkv, groups, n, n}).reshape({hkv, groups * n, n}),
                            qg.view({hkv, groups * n, d}), kc.view({hkv, n, d}).transpose(1, 2),
                            1.0, 1.0 / std::sqrt(static_cast<double>(d)));
    sink = s.softmax(-1);
  });
  j["alt_inplace_add_mask_softmax_ms"] = time_best(reps, [&] {
    auto s = torch::matmul(qg, kc.transpose(-1, -2));
    s.mul_(1.0 / std::sqrt(static_cast<double>(d)));
    s.view({b, hkv, groups, n, n}).add_(additive);
    sink = at::_softmax(s, -1, false);
  });
  double sum = 0;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string key = it.key();
    if (key.size() > 3 && key.compare(key.size() - 3, 3, "_ms") == 0 && key.rfind("alt_", 0) != 0 &&
        key.rfind("attention_core", 0) != 0)
      sum += it.value().get<double>();
  }
  j["layer_sum_ms"] = sum;
  j["model_estimate_ms"] = sum * c.num_hidden_layers;
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  torch::NoGradGuard no_grad;
  const pc::ThreadSettings applied = pc::configure_threads(args.threads, args.torch_threads);

  const int64_t rss_start = resident_bytes();
  const pc::ModelConfig config = args.model.empty() ? pc::synthetic_config(args.shape)
                                                    : pc::gguf::load_model_config(args.model);
  // The checkpoint as stored (what a folder of that dtype maps).
  std::map<std::string, torch::Tensor> weights;
  if (args.model.empty()) {
    for (auto& [name, t] : pc::random_llama_weights(config, /*seed=*/1, 0.02)) {
      weights[name] = t.to(pc::parse_dtype(args.checkpoint));
    }
  }
  // The breakdown's plain LibTorch calls take f32 (the checkpoint's values).
  std::map<std::string, torch::Tensor> breakdown_weights;
  if (args.breakdown) {
    for (const auto& [name, t] : weights) breakdown_weights[name] = t.to(torch::kFloat32);
  }
  // Every kernel setting with every weights setting, kernel by kernel.
  std::vector<std::pair<pc::CpuLinearKernel, std::string>> settings;
  for (const auto kernel : pc::bench::kernel_settings("bench_prefill", args.kernels)) {
    for (const std::string& weights_flag : args.weights)
      settings.emplace_back(kernel, weights_flag);
  }
  for (const auto& [kernel, weights_flag] : settings) {
    pc::select_cpu_linear(kernel);
    for (const std::string& kv_flag : args.kv_dtypes) {
      pc::LoadOptions load;
      const auto block = block_type_named(weights_flag);
      if (weights_flag != "default" && !block) load.weights = pc::parse_weight_dtype(weights_flag);
      if (kv_flag != "default") load.kv_dtype = pc::parse_dtype(kv_flag);
      // A GGML block type: every matrix quantized to it (as a GGUF file of that type holds them).
      std::map<std::string, torch::Tensor> blocks;
      if (block) {
        for (const auto& [name, t] : weights) {
          blocks[name] = t.dim() == 2 ? pc::ggml::quantize(t, *block) : t;
        }
      }
      const int64_t max_n = *std::max_element(args.tokens.begin(), args.tokens.end());
      if (!args.model.empty()) {
        // The reference matmul's buffers before the baseline: they are not the model's.
        gemm_gflops(std::max<int64_t>(128, max_n), config.hidden_size, config.intermediate_size);
      }
      const int64_t rss_before = resident_bytes();
      const int64_t anon_before = anonymous_bytes();
      const auto model = args.model.empty()
                             ? pc::LlamaModel::from_tensors(config, block ? blocks : weights, load)
                             : pc::LlamaModel::load(args.model, load);
      const int64_t rss_loaded = resident_bytes();
      const std::string weights_dtype =
          block ? weights_flag : pc::dtype_name(model->weight_dtype());
      const std::string kv_dtype = pc::dtype_name(model->kv_dtype());
      std::cerr << "bench_prefill: " << (args.model.empty() ? args.shape : args.model) << " ("
                << args.checkpoint << " checkpoint) with " << weights_dtype << " weights ("
                << weights_flag << "), KV cache in " << kv_dtype << " (" << kv_flag
                << "), CPU kernels " << pc::cpu_linear_name(kernel) << "\n";

      torch::manual_seed(0);
      const auto all_ids =
          torch::randint(0, config.vocab_size, {1, max_n + args.decode_steps}, torch::kInt64);
      const auto all_pos = torch::arange(max_n + args.decode_steps, torch::kInt64).unsqueeze(0);

      // Warm-up: one small prefill + decode step (thread pools, allocator, BLAS buffers).
      {
        auto cache = model->make_cache(128 + 1);
        model->forward(all_ids.narrow(1, 0, std::min<int64_t>(128, max_n)),
                       all_pos.narrow(1, 0, std::min<int64_t>(128, max_n)), cache);
        gemm_gflops(128, config.hidden_size, config.intermediate_size);
      }

      for (const int64_t n : args.tokens) {
        const double gemm = gemm_gflops(n, config.hidden_size, config.intermediate_size);
        auto cache = model->make_cache(n + args.decode_steps);
        std::vector<double> prefill_ms, decode_ms;
        for (int r = 0; r < args.repeats; ++r) {
          cache.clear();
          const double t0 = pc::now_ms();
          auto logits = model->forward(all_ids.narrow(1, 0, n), all_pos.narrow(1, 0, n), cache);
          prefill_ms.push_back(pc::now_ms() - t0);
          if (args.decode_steps > 0) {
            const double t1 = pc::now_ms();
            for (int s = 0; s < args.decode_steps; ++s) {
              logits =
                  model->forward(all_ids.narrow(1, n + s, 1), all_pos.narrow(1, n + s, 1), cache);
            }
            decode_ms.push_back(pc::now_ms() - t1);
          }
        }
        const double ms = pc::bench::best_time(prefill_ms);
        const double gflops = model->prefill_flops(n) / (ms * 1e-3) / 1e9;
        ordered_json j;
        j["bench"] = "prefill";
        j["shape"] = args.model.empty() ? args.shape : "--model";
        j["checkpoint"] = args.checkpoint;
        j["settings"] = "weights " + weights_flag + ", kv " + kv_flag;
        j["weights"] = weights_dtype;
        j["weight_bytes"] = model->weight_bytes();
        if (!args.model.empty()) {
          j["model"] = args.model;
          const auto stored = model->dtype_choice().checkpoint;
          j["checkpoint"] = stored == torch::kUInt8 ? "ggml-blocks" : pc::dtype_name(stored);
          std::error_code ec;
          const auto size = std::filesystem::file_size(args.model, ec);
          j["file_bytes"] = ec ? int64_t{0} : static_cast<int64_t>(size);
          j["rss_process_start_bytes"] = rss_start;
          j["rss_before_load_bytes"] = rss_before;
          j["rss_after_load_bytes"] = rss_loaded;
          j["rss_after_bytes"] = resident_bytes();
          // What the model holds, without the code of shared libraries paged in by the first
          // forward: anonymous memory grown since before the load (weights copied at load, KV
          // cache, activations, allocator) plus the file's resident mapped pages.
          const int64_t anon = anonymous_bytes() - anon_before;
          const int64_t mapped = mapped_file_bytes(args.model);
          j["anon_grown_bytes"] = anon;
          j["file_resident_bytes"] = mapped;
          j["model_memory_bytes"] = anon + mapped;
        }
        j["kv_dtype"] = kv_dtype;
        j["kernels"] = pc::cpu_linear_name(kernel);
        j["tokens"] = n;
        j["prefill_ms"] = ms;
        j["prefill_tokens_per_s"] = n / (ms * 1e-3);
        j["prefill_gflops"] = gflops;
        j["gemm_gflops"] = gemm;
        j["ratio_to_gemm"] = gflops / gemm;
        j["decode_tokens_per_s"] =
            args.decode_steps > 0 ? args.decode_steps / (pc::bench::best_time(decode_ms) * 1e-3)
                                  : 0.0;
        j["threads"] = applied.openblas ? applied.blas_threads : applied.torch_threads;
        j["torch_threads"] = applied.torch_threads;
        j["openblas"] = applied.openblas;
        j["blas_core"] = pc::select_blas_core().core;  // OpenBLAS's kernels (the long GEMMs)
        j["blas_core_detected"] = pc::select_blas_core().detected;
        j["statistic"] = "best_of_" + std::to_string(args.repeats);
        j["prefill_ms_median"] = pc::bench::median_time(prefill_ms);
        std::cout << j.dump() << std::endl;
        if (args.breakdown)
          std::cout << layer_breakdown(config, breakdown_weights, n, args.repeats).dump()
                    << std::endl;
      }
    }
  }
  return 0;
}
