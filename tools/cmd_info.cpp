// promptcache info: what a model folder (or GGUF file) is and what it loads as — family and shapes,
// the checkpoint's dtype, the weights/compute/KV dtypes chosen and why, the weights' resident
// bytes, the tokenizer and the chat template.
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "engine_setup.hpp"
#include "promptcache/model/blas_core.hpp"
#include "promptcache/model/gguf.hpp"
#include "promptcache/model/llama.hpp"

namespace promptcache::cli {

namespace {

// Bytes of the folder's *.safetensors files, or of a GGUF file.
int64_t checkpoint_file_bytes(const std::string& dir) {
  if (gguf::is_gguf_file(dir)) return static_cast<int64_t>(std::filesystem::file_size(dir));
  int64_t total = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".safetensors") {
      total += static_cast<int64_t>(entry.file_size());
    }
  }
  return total;
}

}  // namespace

Command register_info(CLI::App& root) {
  struct Options {
    ModelOptions model;
    EngineFlags engine;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  auto* app = root.add_subcommand(
      "info",
      "Show what a model folder holds and how it loads: family and shapes, the checkpoint's "
      "dtype, the weights/compute/KV dtypes chosen (and why), the weights' resident bytes, the "
      "tokenizer and the chat template. --dtype/--weights/--kv-dtype show what they change.\n"
      "Example: promptcache info --model DIR [--weights f32] [--json]");
  add_model_options(*app, o->model, /*model_required=*/true);
  app->add_option(
      "--template", o->engine.chat_template,
      "chat template: llama-2, llama-3, mistral, chatml, plain, or jinja (the model's own "
      "template) (default: from the model)");
  app->add_flag("--json", o->json, "print one JSON object");
  return {app, [o]() {
            const auto engine = open_engine(o->model, o->engine);
            const LlamaModel& m = engine->model();
            const ModelConfig& c = m.config();
            const int64_t file_bytes = checkpoint_file_bytes(o->model.model_dir);
            nlohmann::json j = {{"model", o->model.model_dir},
                                {"architecture", c.architecture},
                                {"model_type", c.model_type},
                                {"layers", c.num_hidden_layers},
                                {"hidden_size", c.hidden_size},
                                {"intermediate_size", c.intermediate_size},
                                {"attention_heads", c.num_attention_heads},
                                {"kv_heads", c.num_key_value_heads},
                                {"head_dim", c.head_dim},
                                {"vocab_size", c.vocab_size},
                                {"max_position_embeddings", c.max_position_embeddings},
                                {"tie_word_embeddings", c.tie_word_embeddings},
                                {"device", m.device().str()},
                                {"attention", m.attention_name()},
                                {"checkpoint_bytes", file_bytes},
                                // Per token and layer: K and V of every KV head.
                                {"kv_bytes_per_token",
                                 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim *
                                     static_cast<int64_t>(c10::elementSize(m.kv_dtype()))},
                                {"tokenizer", engine->tokenizer().kind()},
                                {"tokenizer_vocab", engine->tokenizer().vocab_size()},
                                {"chat_template", engine->chat_template().family},
                                {"chat_template_origin", engine->chat_template_origin()},
                                {"blas_core", select_blas_core().core},
                                {"blas_core_detected", select_blas_core().detected},
                                {"blas_core_note", select_blas_core().note}};
            j.update(dtype_json(m));
            if (o->json) {
              std::cout << j.dump() << "\n";
              return 0;
            }
            const DtypeChoice& d = m.dtype_choice();
            std::cout << fmt::format(
                "model          {}\n"
                "family         {} ({}): {} layers, hidden {}, {} heads / {} KV heads of {}, "
                "MLP {}, vocab {}, {} positions{}\n"
                "checkpoint     {:.1f} MB of {}; matrices stored in {}{}\n"
                "weights        {}: {}\n"
                "compute        {}: {}\n"
                "KV / states    {}: {} ({} bytes a token)\n"
                "weight bytes   {:.1f} MB resident ({:.2f}x the checkpoint's files)\n"
                "device         {}, attention {}\n"
                "tokenizer      {}, {} tokens\n"
                "chat template  {}, from {}\n"
                "BLAS kernels   {}{}\n",
                o->model.model_dir, c.architecture, c.model_type, c.num_hidden_layers,
                c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim,
                c.intermediate_size, c.vocab_size, c.max_position_embeddings,
                c.tie_word_embeddings ? ", tied embeddings" : "", file_bytes / 1e6,
                gguf::is_gguf_file(o->model.model_dir) ? "GGUF" : "*.safetensors",
                d.checkpoint == torch::kUInt8 ? "GGML blocks" : dtype_name(d.checkpoint),
                d.mixed ? " (some other tensors in another dtype: the matrices decide)" : "",
                dtype_name(m.weight_dtype()), d.weights_reason, dtype_name(m.dtype()),
                d.compute_reason, dtype_name(m.kv_dtype()), d.kv_reason,
                j["kv_bytes_per_token"].get<int64_t>(), m.weight_bytes() / 1e6,
                file_bytes > 0 ? static_cast<double>(m.weight_bytes()) / file_bytes : 0.0,
                m.device().str(), m.attention_name(), engine->tokenizer().kind(),
                engine->tokenizer().vocab_size(), engine->chat_template().family,
                engine->chat_template_origin(),
                select_blas_core().core.empty() ? "none found" : select_blas_core().core,
                select_blas_core().note.empty() ? "" : ": " + select_blas_core().note);
            return 0;
          }};
}

}  // namespace promptcache::cli
