// bench_ttft — cached vs uncached time-to-first-token on a synthetic bench-small model.
//
// For each schema size (tokens reserved by a document-QA style schema of 128-token modules) and
// fresh-question size, prints one JSON line with the uncached TTFT (the same tokens as one
// ordinary prefill), the cached TTFT (assemble stored states + run the fresh tokens), the
// assembly time and its bandwidth next to a plain memcpy of the same bytes measured in the run.
// The cached TTFT is cold (nothing kept from the request before) and takes the engine's default:
// module states read in place from the store where the attention can (f32 on the CPU with the
// fused kernel), else copied. copied_* columns copy every span (RequestOptions::in_place = false);
// assembly_ms, kv_bytes and assembly_gbps are theirs. warm_cached_ttft_ms repeats the prompt
// with the buffer still holding its modules, as for a second question over the same documents.
//
// --kernels on,off measures both settings of the CPU's small-row paths (linear kernels and
// fused few-query attention, PROMPTCACHE_CPU_KERNELS) in one run, one JSON line each. Their repeats
// are interleaved (uncached on, uncached off, uncached on, ...), so drift and load on this shared
// machine hit both settings alike; times are the best of the repeats, medians are given too.
//
//   build/benchmarks/bench_ttft [--schema 512,1024,2048,4096] [--fresh 16,64] [--repeats 3]
//                               [--threads N] [--shape bench-small] [--device cpu|cuda]
//                               [--dtype f32|f16|bf16] [--weights f32|bf16|f16|q8]
//                               [--kv-dtype f32|bf16|f16] [--checkpoint bf16|f16|f32]
//                               [--kernels on|off|avx512|avx2,...] [--model FILE.gguf|DIR]
// The synthetic checkpoint is stored in --checkpoint (default bf16, as current HuggingFace
// models ship). --dtype is the compute dtype, --weights the dtype the weight matrices are kept
// in (bf16/f16/q8 with f32 compute on the CPU), --kv-dtype the KV cache's and the stored
// states' (bf16/f16 with f32 compute on the CPU: half the bytes to store, assemble and read);
// each unset, the model chooses it for the checkpoint as for a user's folder (on the CPU: f32
// compute, weights as stored, bf16 KV with bf16 weights). --model runs a model file or folder
// instead of the synthetic shape (a GGUF file's weights as it stores them, its own tokenizer for
// the schema's texts); its lines then name it in "model" and "shape" is "--model".
#include <torch/types.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench_common.hpp"
#include "bench_engine.hpp"
#include "bench_kernels.hpp"
#include "promptcache/engine.hpp"
#include "promptcache/model/cpu_linear.hpp"
#include "promptcache/model/threads.hpp"

using namespace promptcache;

namespace {

double best_of(int repeats, const std::function<double()>& f) {
  double best = 1e300;
  for (int i = 0; i < repeats; ++i) best = std::min(best, f());
  return best;
}

// Samples of one kernel setting for one schema size and question length.
struct Samples {
  CpuLinearKernel kernel = CpuLinearKernel::kNone;
  std::vector<double> uncached, cached, copied, warm;
  double assembly_ms = 1e300, in_place_assembly_ms = 1e300, fresh_prefill_ms = 1e300;
  int64_t warm_reused_tokens = 0;  // should be every cached token
  Response cached_response, copied_response, uncached_response;
};

int run(int argc, char** argv) {
  const bench::Flags flags(argc, argv, "bench_ttft",
                           {"schema", "fresh", "repeats", "threads", "shape", "device", "dtype",
                            "weights", "kv-dtype", "checkpoint", "kernels", "model"});
  const auto schema_sizes = flags.list("schema", {512, 1024, 2048, 4096});
  const auto fresh_sizes = flags.list("fresh", {16, 64});
  const int repeats = flags.integer("repeats", 3), threads = flags.integer("threads", 0);
  const std::string model_path = flags.text("model", "");
  const std::string shape = model_path.empty() ? flags.text("shape", "bench-small") : "--model";
  const std::string device = flags.text("device", "cpu"), dtype = flags.text("dtype", "");
  const auto applied = configure_threads(threads);
  const auto kernel_settings = bench::kernel_settings(
      "bench_ttft",
      flags.words("kernels", cpu_linear_kernel() == CpuLinearKernel::kNone ? "off" : "on"));
  select_cpu_linear(kernel_settings.front());  // for compiling
  const auto engine_owner =
      model_path.empty()
          ? bench::synthetic_engine("bench_ttft", shape, device, dtype, flags.text("weights", ""),
                                    flags.text("kv-dtype", ""), flags.text("checkpoint", "bf16"))
          : bench::file_engine("bench_ttft", model_path, device, dtype, flags.text("weights", ""),
                               flags.text("kv-dtype", ""));
  Engine& engine = *engine_owner;
  const auto words = bench::corpus_words();
  auto make_schema = [&](const std::string& name, int tokens, std::size_t from) {
    return bench::document_schema(engine.tokenizer(), words, name, tokens, from);
  };

  for (int schema_tokens : schema_sizes) {
    const std::string name = "docs" + std::to_string(schema_tokens);
    const auto [xml, refs] = make_schema(name, schema_tokens, 0);
    const double compile_start = now_ms();
    const auto& layout = engine.add_schema_string(xml);
    const double compile_ms = now_ms() - compile_start;
    // Other documents of the same size: a cold request follows one over them (untimed), as a
    // request that shares nothing with the one before does.
    const auto [other_xml, other_refs] = make_schema(name + "-other", schema_tokens, 5000);
    engine.add_schema_string(other_xml);
    for (int fresh : fresh_sizes) {
      std::size_t qfrom = 7;
      const std::string question = bench::text_of_tokens(engine.tokenizer(), words, qfrom, fresh);
      const std::string prompt = "<prompt schema=\"" + name + "\">" + refs + question + "</prompt>";
      const std::string other_prompt =
          "<prompt schema=\"" + name + "-other\">" + other_refs + question + "</prompt>";
      SamplingParams one;
      one.max_new_tokens = 1;
      std::vector<Samples> samples(kernel_settings.size());
      for (std::size_t i = 0; i < samples.size(); ++i) samples[i].kernel = kernel_settings[i];
      // Cold: after a request over the other documents, in the same mode (in place where the
      // attention can read so, or with every span copied). Warm: the same prompt again, the
      // buffer still holding its modules.
      RequestOptions cold;
      cold.reuse_buffer = false;
      RequestOptions copy = cold;
      copy.in_place = false;
      for (int r = 0; r < repeats; ++r) {
        for (auto& s : samples) {
          select_cpu_linear(s.kernel);
          s.uncached_response = engine.generate_xml(prompt, one, {}, RequestOptions{false});
          s.uncached.push_back(s.uncached_response.timings.ttft_ms);
        }
      }
      for (int r = 0; r < repeats + 2; ++r) {
        for (auto& s : samples) {
          select_cpu_linear(s.kernel);
          engine.generate_xml(other_prompt, one, {}, cold);
          s.cached_response = engine.generate_xml(prompt, one, {}, cold);
          s.cached.push_back(s.cached_response.timings.ttft_ms);
          s.in_place_assembly_ms =
              std::min(s.in_place_assembly_ms, s.cached_response.timings.assembly_ms);
          s.fresh_prefill_ms =
              std::min(s.fresh_prefill_ms, s.cached_response.timings.fresh_prefill_ms);
          engine.generate_xml(other_prompt, one, {}, copy);
          s.copied_response = engine.generate_xml(prompt, one, {}, copy);
          s.copied.push_back(s.copied_response.timings.ttft_ms);
          s.assembly_ms = std::min(s.assembly_ms, s.copied_response.timings.assembly_ms);
          const Response warm = engine.generate_xml(prompt, one);
          s.warm.push_back(warm.timings.ttft_ms);
          s.warm_reused_tokens = warm.reused_tokens;
        }
      }
      // A plain copy of the same number of bytes, same run: memcpy on the CPU, a device-to-device
      // tensor copy on a GPU.
      const std::size_t bytes = static_cast<std::size_t>(samples[0].copied_response.kv_bytes);
      double memcpy_ms = 0;
      if (engine.model().device().is_cpu()) {
        std::vector<char> src(bytes, 1), dst(bytes, 0);
        memcpy_ms = best_of(repeats + 2, [&] {
          const double t = now_ms();
          std::memcpy(dst.data(), src.data(), bytes);
          return now_ms() - t;
        });
      } else {
        const auto on_device =
            torch::TensorOptions().device(engine.model().device()).dtype(torch::kUInt8);
        auto src = torch::ones({static_cast<int64_t>(bytes)}, on_device);
        auto dst = torch::zeros({static_cast<int64_t>(bytes)}, on_device);
        memcpy_ms = best_of(repeats + 2, [&] {
          synchronize(dst);
          const double t = now_ms();
          dst.copy_(src);
          synchronize(dst);
          return now_ms() - t;
        });
      }
      for (const auto& s : samples) {
        const double uncached_ms = bench::best_time(s.uncached),
                     cached_ms = bench::best_time(s.cached);
        const double warm_ms = bench::best_time(s.warm);
        const double copied_ms = bench::best_time(s.copied);
        const auto& cached = s.cached_response;
        nlohmann::json j = {
            {"bench", "ttft"},
            {"shape", shape},
            {"schema_tokens", layout.total_length},
            {"fresh_tokens", cached.fresh_tokens},
            {"cached_tokens", cached.cached_tokens},
            {"uncached_ttft_ms", uncached_ms},
            {"cached_ttft_ms", cached_ms},
            {"in_place_tokens", cached.in_place_tokens},
            {"in_place_assembly_ms", s.in_place_assembly_ms},
            {"fresh_prefill_ms", s.fresh_prefill_ms},
            {"speedup", uncached_ms / cached_ms},
            {"copied_cached_ttft_ms", copied_ms},
            {"copied_speedup", uncached_ms / copied_ms},
            {"assembly_ms", s.assembly_ms},
            {"warm_cached_ttft_ms", warm_ms},
            {"warm_speedup", uncached_ms / warm_ms},
            {"warm_reused_tokens", s.warm_reused_tokens},
            {"uncached_ttft_ms_median", bench::median_time(s.uncached)},
            {"cached_ttft_ms_median", bench::median_time(s.cached)},
            {"speedup_median", bench::median_time(s.uncached) / bench::median_time(s.cached)},
            {"kv_bytes", s.copied_response.kv_bytes},
            {"assembly_gbps", bytes / (s.assembly_ms * 1e6)},
            {"memcpy_gbps", bytes / (memcpy_ms * 1e6)},
            {"assembly_to_memcpy", memcpy_ms / s.assembly_ms},
            {"compile_ms", compile_ms},
            {"same_first_token", cached.tokens == s.uncached_response.tokens &&
                                     s.copied_response.tokens == s.uncached_response.tokens},
            {"kernels", cpu_linear_name(s.kernel)}};
        j.update(bench::run_facts(engine, device, dtype, applied));
        if (!model_path.empty()) j["model"] = model_path;
        std::cout << j.dump() << std::endl;
      }
    }
  }
  return 0;
}

}  // namespace

// A request the model cannot take (a schema longer than its context, a missing file) ends with
// the library's message, not an uncaught exception.
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "bench_ttft: " << e.what() << "\n";
    return 1;
  }
}
