// promptcache convert: a HuggingFace model folder to one GGUF file (llama.cpp's format), in
// f32, f16, bf16 or q8_0 (q4_k, q6_k and q4_k_m once the K-quants are in the build), with the
// quantization error of every tensor.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <iostream>

#include "cli_common.hpp"
#include "cmd_convert.hpp"
#include "promptcache/model/gguf_convert.hpp"

namespace promptcache::cli {

Command register_convert(CLI::App& root) {
  struct Options {
    std::string model_dir, out, type = "f16";
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  auto* app = root.add_subcommand(
      "convert",
      "Convert a HuggingFace model folder to a GGUF file (llama.cpp's names, metadata and Q/K "
      "layout) that --model FILE.gguf, llama.cpp, Ollama and LM Studio load.\n"
      "Example: promptcache convert --model /tmp/tiny --out /tmp/tiny.gguf --type q8_0");
  app->add_option("--model,-m", o->model_dir, "HuggingFace model folder")->required();
  app->add_option("--out,-o", o->out, "the GGUF file to write")->required();
  app->add_option("--type", o->type,
                  "f32, f16, bf16, q8_0, q4_k, q6_k or q4_k_m (vectors stay f32; q4_k, q6_k and "
                  "q4_k_m need the block-quantized types, not in this build yet)")
      ->capture_default_str();
  app->add_flag("--json", o->json,
                "print the report as JSON: every tensor's type, bytes and quantization error");
  return {app, [o]() {
            const auto report =
                gguf::convert_folder(o->model_dir, o->out, gguf::parse_file_type(o->type));
            double worst = 0;
            for (const auto& t : report.tensors) worst = std::max(worst, t.rms_relative_error);
            if (o->json) {
              nlohmann::json tensors = nlohmann::json::array();
              for (const auto& t : report.tensors) {
                tensors.push_back({{"name", t.name},
                                   {"type", t.type},
                                   {"shape", t.shape},
                                   {"bytes", t.bytes},
                                   {"rms_relative_error", t.rms_relative_error},
                                   {"max_abs_error", t.max_abs_error}});
              }
              nlohmann::json j = {{"out", report.out},
                                  {"type", gguf::file_type_name(report.type)},
                                  {"file_bytes", report.file_bytes},
                                  {"max_rms_relative_error", worst},
                                  {"tensors", tensors}};
              std::cout << j.dump(1) << "\n";
            } else {
              std::cout << fmt::format(
                  "wrote {} ({}, {} tensors, {} bytes); worst tensor RMS "
                  "relative error {:.3g}\n",
                  report.out, gguf::file_type_name(report.type), report.tensors.size(),
                  report.file_bytes, worst);
            }
            return 0;
          }};
}

}  // namespace promptcache::cli
