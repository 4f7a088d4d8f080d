#include "cli_common.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <limits>

#include "promptcache/model/blas_core.hpp"
#include "promptcache/model/threads.hpp"

namespace promptcache::cli {

CLI::Validator whole_number(unsigned long long min, unsigned long long max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        const bool digits =
            !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
        errno = 0;
        const unsigned long long v = digits ? std::strtoull(text.c_str(), nullptr, 10) : 0;
        if (!digits || v < min)
          return fmt::format("expects a whole number >= {}, got '{}'", min, text);
        if (errno == ERANGE || v > max) {
          return fmt::format("expects a whole number from {} to {}, got '{}'", min, max, text);
        }
        return "";
      },
      fmt::format("INT>={}", min));
}

namespace {
CLI::Validator real_number_check(const std::string& wanted, std::function<bool(double)> ok) {
  return CLI::Validator(
      [wanted, ok](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || !ok(v)) {
          return fmt::format("expects {}, got '{}'", wanted, text);
        }
        return "";
      },
      wanted);
}
}  // namespace

CLI::Validator number_in(double min, double max) {
  const bool open_ended = max == std::numeric_limits<double>::infinity();
  return real_number_check(open_ended ? fmt::format("a number >= {}", min)
                                      : fmt::format("a number from {} to {}", min, max),
                           [min, max](double v) { return v >= min && v <= max; });
}

CLI::Validator positive_number() {
  return real_number_check("a number > 0", [](double v) {
    return v > 0 && v < std::numeric_limits<double>::infinity();
  });
}

void add_model_options(CLI::App& app, ModelOptions& o, bool model_required) {
  auto* model =
      app.add_option("--model,-m", o.model_dir,
                     "HuggingFace model folder (config.json, *.safetensors, tokenizer.json or "
                     "tokenizer.model: Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3, BLOOM, MPT, "
                     "Falcon) or GGUF file (FILE.gguf of a Llama, Mistral, Qwen2 or Qwen3: F32, "
                     "F16, BF16, Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K)");
  if (model_required) model->required();
  app.add_option("--device", o.device, "cpu or cuda[:N]")->capture_default_str();
  app.add_option("--dtype", o.dtype,
                 "compute dtype (activations): f32, f16 or bf16 (default: f32 on the CPU; on "
                 "a GPU the dtype the checkpoint stores its matrices in)");
  app.add_option("--weights", o.weights,
                 "dtype the weights are kept in: f32, bf16, f16 or q8 (default: as the "
                 "checkpoint stores them, mapped from the file, where the compute dtype takes "
                 "it; else --dtype). With f32 compute on the CPU, bf16/f16 halve the weights' "
                 "memory and q8 (8-bit blocks of 32 with an f16 scale, quantized at load) takes "
                 "about a quarter");
  app.add_option("--kv-dtype", o.kv_dtype,
                 "dtype of the KV cache and the stored module states: f32, bf16 or f16 "
                 "(default: bf16/f16 with bf16/f16 weights and f32 compute on the CPU, else the "
                 "compute dtype). 16-bit states halve the states' memory, cache files and "
                 "assembly bytes; the attention still computes in f32");
  app.add_option("--threads", o.threads, "CPU threads (0 = all cores)")
      ->capture_default_str()
      ->check(whole_number(0, std::numeric_limits<int>::max()));
}

void require_model(const ModelOptions& o) {
  if (!o.model_dir.empty()) return;
  throw UsageError(
      "no model given: pass --model DIR (a HuggingFace folder of a Llama 2/3.x, Mistral, "
      "Qwen2/2.5 or Qwen3 model: config.json, *.safetensors, tokenizer.json or "
      "tokenizer.model).\n"
      "  For a quick start without downloads, make a synthetic one:\n"
      "    promptcache make-model --shape tiny --out /tmp/tiny-llama\n"
      "  then pass --model /tmp/tiny-llama");
}

std::string apply_threads(const ModelOptions& o) {
  const auto t = configure_threads(o.threads);
  const BlasCore& core = select_blas_core();
  return fmt::format("threads: torch {} / blas {}{}", t.torch_threads, t.blas_threads,
                     t.openblas ? fmt::format(" (OpenBLAS, {} kernels{})", core.core,
                                              core.switched ? ", not " + core.detected : "")
                                : "");
}

Command register_absent(CLI::App& root, const std::string& name) {
  CLI::App* app = root.add_subcommand(name, "(not in this build: scripts/build.sh builds it)");
  app->allow_extras();
  app->prefix_command();
  return {app, [name]() -> int {
            std::cerr << "promptcache: `" << name
                      << "` is not in this build: scripts/demo.sh builds the demo alone "
                         "(PROMPTCACHE_DEMO_ONLY); scripts/build.sh builds every command\n";
            return 2;
          }};
}

void add_sampling_options(CLI::App& app, SamplingOptions& o) {
  auto& p = o.params;
  app.add_option("-n,--max-new-tokens", p.max_new_tokens, "tokens to generate")
      ->capture_default_str()
      ->check(whole_number(0, std::numeric_limits<int>::max()));
  app.add_option("--temperature,-t", p.temperature, "0 = greedy")
      ->capture_default_str()
      ->check(number_in(0, std::numeric_limits<double>::infinity()));
  app.add_option("--top-k", p.top_k, "keep the k most likely tokens (0 = off)")
      ->capture_default_str()
      ->check(whole_number(0, std::numeric_limits<int>::max()));
  app.add_option("--top-p", p.top_p, "nucleus sampling mass (1 = off)")
      ->capture_default_str()
      ->check(number_in(0, 1));
  app.add_option("--repetition-penalty", p.repetition_penalty, "1 = off")
      ->capture_default_str()
      ->check(positive_number());
  app.add_option("--seed", p.seed, "random seed for sampling")
      ->capture_default_str()
      ->check(whole_number(0, std::numeric_limits<std::uint64_t>::max()));
  app.add_option("--stop", o.stop, "stop when this text appears (repeatable)");
}

void add_src_flag(CLI::App& app, bool& allow_src_outside) {
  app.add_flag("--allow-src-outside", allow_src_outside,
               "let module src attributes name files outside the schema's folder (absolute "
               "paths, '..', symbolic links leading out); by default they are refused");
}

pml::Schema read_schema_file(const std::string& path, bool allow_src_outside) {
  using Scope = pml::RootedSrcFiles::Scope;
  return pml::parse_schema_file(
      path, pml::src_files_beside(path, allow_src_outside ? Scope::kAnywhere : Scope::kInsideRoot,
                                  " (pass --allow-src-outside to read files outside the "
                                  "schema's folder)"));
}

void print_warnings(const std::vector<pml::Warning>& warnings) {
  for (const auto& w : warnings) std::cerr << "warning: " << w.render() << "\n";
}

}  // namespace promptcache::cli
