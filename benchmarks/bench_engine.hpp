// benchmarks/bench_engine.hpp — the engine the Prompt Cache benchmarks measure.
#pragma once

#include <torch/version.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "bench_common.hpp"
#include "promptcache/engine.hpp"
#include "promptcache/model/blas_core.hpp"
#include "promptcache/model/synthetic.hpp"
#include "promptcache/model/threads.hpp"
#include "promptcache/model/tokenizer.hpp"

namespace promptcache::bench {

// An engine over a synthetic model of `shape` (deterministic random weights, stored in
// `checkpoint` as a checkpoint folder stores them: bf16 by default, as current HuggingFace models
// ship) on `device`, with the built-in tokenizer and the plain chat template. `dtype` is the
// compute dtype, `weights` the weights' (f32, bf16, f16, q8), `kv_dtype` the KV cache's; each
// empty: chosen for the checkpoint as for a user's folder (choose_dtypes).
inline std::unique_ptr<Engine> synthetic_engine(
    const std::string& program, const std::string& shape, const std::string& device,
    const std::string& dtype, const std::string& weights = "", const std::string& kv_dtype = "",
    const std::string& checkpoint = "bf16", EngineOptions options = {}) {
  const ModelConfig config = synthetic_config(shape);
  std::cerr << program << ": making " << shape << " model (" << checkpoint
            << " checkpoint) and tokenizer...\n";
  options.chat_template = "plain";
  options.load.device = parse_device(device);
  if (!dtype.empty()) options.load.dtype = parse_dtype(dtype);
  if (!weights.empty()) options.load.weights = parse_weight_dtype(weights);
  if (!kv_dtype.empty()) options.load.kv_dtype = parse_dtype(kv_dtype);
  std::map<std::string, torch::Tensor> stored;
  for (auto& [name, t] : random_llama_weights(config, 1, 0.02)) {
    stored[name] = t.to(parse_dtype(checkpoint.empty() ? "bf16" : checkpoint));
  }
  auto model = LlamaModel::from_tensors(config, stored, options.load);
  std::cerr << program << ": weights " << dtype_name(model->weight_dtype()) << ", compute "
            << dtype_name(model->dtype()) << ", KV " << dtype_name(model->kv_dtype()) << "\n";
  return std::make_unique<Engine>(std::move(model), bench_tokenizer(), options);
}

// An engine over the model a file or folder holds (`--model FILE.gguf|DIR`: its weights in the
// dtypes the file chooses unless given, and its own tokenizer), with the plain chat template.
inline std::unique_ptr<Engine> file_engine(const std::string& program, const std::string& path,
                                           const std::string& device, const std::string& dtype,
                                           const std::string& weights = "",
                                           const std::string& kv_dtype = "",
                                           EngineOptions options = {}) {
  options.chat_template = "plain";
  options.load.device = parse_device(device);
  if (!dtype.empty()) options.load.dtype = parse_dtype(dtype);
  if (!weights.empty()) options.load.weights = parse_weight_dtype(weights);
  if (!kv_dtype.empty()) options.load.kv_dtype = parse_dtype(kv_dtype);
  auto model = LlamaModel::load(path, options.load);
  std::cerr << program << ": " << path << ": weights " << dtype_name(model->weight_dtype())
            << ", compute " << dtype_name(model->dtype()) << ", KV "
            << dtype_name(model->kv_dtype()) << "\n";
  return std::make_unique<Engine>(std::move(model), load_tokenizer(path), options);
}

// A document-QA schema `name` of `tokens` tokens: BOS + modules of 128 tokens of the corpus
// from word `from` on (the last one shortened so the total is exact). Returns the schema's XML
// and the prompt's module references (<d0/><d1/>...).
inline std::pair<std::string, std::string> document_schema(const Tokenizer& tokenizer,
                                                           const std::vector<std::string>& words,
                                                           const std::string& name, int tokens,
                                                           std::size_t from) {
  std::ostringstream xml, refs;
  xml << "<schema name=\"" << name << "\">";
  int remaining = tokens - 1, modules = 0;
  while (remaining > 0) {
    const int n = std::min(128, remaining);
    xml << "<module name=\"d" << modules << "\">" << text_of_tokens(tokenizer, words, from, n)
        << "</module>";
    refs << "<d" << modules << "/>";
    remaining -= n;
    ++modules;
  }
  xml << "</schema>";
  return {xml.str(), refs.str()};
}

// What a result line records about the run: attention, LibTorch version, device, dtype, the
// weights' dtype and resident bytes, threads.
inline nlohmann::json run_facts(const Engine& engine, const std::string& device,
                                const std::string& /*dtype*/, const ThreadSettings& threads) {
  return {{"attention", engine.model().attention_name()},
          {"torch_version", std::to_string(TORCH_VERSION_MAJOR) + "." +
                                std::to_string(TORCH_VERSION_MINOR) + "." +
                                std::to_string(TORCH_VERSION_PATCH)},
          {"device", device},
          {"dtype", dtype_name(engine.model().dtype())},
          // A GGUF file's K-quant blocks count as uint8 (llama_load.cpp's checkpoint_dtype).
          {"checkpoint", engine.model().dtype_choice().checkpoint == torch::kUInt8
                             ? std::string("ggml-blocks")
                             : dtype_name(engine.model().dtype_choice().checkpoint)},
          {"weights", dtype_name(engine.model().weight_dtype())},
          {"weight_bytes", engine.model().weight_bytes()},
          {"kv_dtype", dtype_name(engine.model().kv_dtype())},
          {"threads", threads.blas_threads},
          {"torch_threads", threads.torch_threads},
          // OpenBLAS's kernels (the long GEMMs: uncached prefills), and OpenBLAS's own choice.
          {"blas_core", select_blas_core().core},
          {"blas_core_detected", select_blas_core().detected}};
}

}  // namespace promptcache::bench
