// promptcache generate: plain text generation (no prompt modules) with timing.
#include <fmt/format.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "engine_setup.hpp"
#include "promptcache/generation.hpp"
#include "promptcache/model/llama.hpp"

namespace promptcache::cli {

Command register_generate(CLI::App& root) {
  struct Options {
    ModelOptions model;
    SamplingOptions sampling;
    std::string text;
    bool json = false;
    bool no_bos = false;
  };
  auto o = std::make_shared<Options>();
  auto* app = root.add_subcommand(
      "generate",
      "Continue a text with a model.\n"
      "Example: promptcache generate --model DIR --text \"Once upon a time\" -n 40 --json");
  add_model_options(*app, o->model);
  add_sampling_options(*app, o->sampling);
  app->add_option("--text", o->text, "the prompt text")->required();
  app->add_flag("--json", o->json, "print one JSON object with text, ids and timings");
  app->add_flag(
      "--no-bos", o->no_bos,
      "do not prepend the BOS token (models whose tokenizer adds none, as Qwen's, never get one)");
  return {app, [o]() {
            require_model(o->model);
            const std::string threads = apply_threads(o->model);
            const LoadOptions load = load_options(o->model);
            const auto model = LlamaModel::load(o->model.model_dir, load);
            const auto tok = load_tokenizer(o->model.model_dir);
            SamplingParams params = o->sampling.params;
            params.stop_strings = o->sampling.stop;
            const auto prompt = tok->encode(o->text, !o->no_bos && tok->adds_bos());
            TokenCallback stream;
            if (!o->json) {
              std::cout << o->text << std::flush;
              stream = [](TokenId, const std::string& s) {
                std::cout << s << std::flush;
                return true;
              };
            }
            const auto r = generate(*model, *tok, prompt, params, stream);
            if (o->json) {
              nlohmann::json j = {{"text", r.text},
                                  {"prompt_ids", prompt},
                                  {"token_ids", r.tokens},
                                  {"stop_reason", to_string(r.stop_reason)},
                                  {"ttft_ms", r.timings.ttft_ms},
                                  {"prefill_tokens", r.timings.prefill_tokens},
                                  {"prefill_tokens_per_s", r.timings.prefill_tokens_per_s()},
                                  {"decode_tokens_per_s", r.timings.decode_tokens_per_s()}};
              j.update(dtype_json(*model));
              std::cout << j.dump() << "\n";
            } else {
              std::cout << "\n";
              std::cerr << fmt::format(
                  "[{} prompt tokens, {} generated; TTFT {:.1f} ms, prefill {:.0f} tok/s, decode "
                  "{:.0f} tok/s; weights {} ({:.1f} MB); {}]\n",
                  prompt.size(), r.tokens.size(), r.timings.ttft_ms,
                  r.timings.prefill_tokens_per_s(), r.timings.decode_tokens_per_s(),
                  dtype_name(model->weight_dtype()), model->weight_bytes() / 1e6, threads);
            }
            return 0;
          }};
}

}  // namespace promptcache::cli
