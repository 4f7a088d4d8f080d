// promptcache make-model: a deterministic random checkpoint of one of the supported families,
// with a trained tokenizer or a real one given by --tokenizer.
#include <fmt/format.h>

#include <iostream>

#include "cli_common.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/model/synthetic.hpp"

namespace promptcache::cli {

Command register_make_model(CLI::App& root) {
  struct Options {
    std::string shape = "tiny";
    std::string out;
    std::uint64_t seed = 0;
    std::string dtype;  // empty: bf16 for the full-size shapes, f32 for the tiny ones
    std::string tokenizer;
  };
  auto o = std::make_shared<Options>();
  auto* app = root.add_subcommand(
      "make-model",
      "Write a synthetic model folder (random weights, trained or given tokenizer).\n"
      "Examples: promptcache make-model --shape bench-small --out /tmp/bench --seed 1\n"
      "          promptcache make-model --shape qwen3-tiny --tokenizer qwen3/tokenizer.json "
      "--out /tmp/q3");
  app->add_option("--shape", o->shape,
                  "tiny | bench-small | tinyllama-1.1b | qwen2-tiny | qwen3-tiny | llama3-tiny | "
                  "mistral-tiny | bloom-tiny | mpt-tiny | falcon-tiny")
      ->capture_default_str()
      ->check(CLI::IsMember(synthetic_shapes()));
  app->add_option("--out,-o", o->out, "output folder")->required();
  app->add_option("--seed", o->seed, "weights seed")->capture_default_str();
  app->add_option("--dtype", o->dtype,
                  "storage dtype: f32, f16 or bf16 (default: bf16 for bench-small and "
                  "tinyllama-1.1b, as current HuggingFace models ship and as they load at the "
                  "defaults; f32 for the tiny test shapes)");
  app->add_option("--tokenizer", o->tokenizer,
                  "a real tokenizer.json or tokenizer.model to put in the folder (with the "
                  "tokenizer_config.json beside it); the vocabulary grows to fit it");
  return {app, [o]() {
            const bool full_size = o->shape == "bench-small" || o->shape == "tinyllama-1.1b";
            const auto dtype = !o->dtype.empty() ? parse_dtype(o->dtype)
                               : full_size       ? torch::kBFloat16
                                                 : torch::kFloat32;
            std::cerr << fmt::format("making '{}' model ({}) in {} ...\n", o->shape,
                                     dtype_name(dtype), o->out);
            make_synthetic_model(o->out, o->shape, o->seed, dtype, o->tokenizer);
            std::cout << o->out << "\n";
            return 0;
          }};
}

}  // namespace promptcache::cli
