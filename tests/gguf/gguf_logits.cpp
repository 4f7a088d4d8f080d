// gguf_logits: promptcache's next-token log-probabilities at every position of a token sequence,
// for the llama.cpp cross-check (tests/gguf/js/check_llama_cpp.sh, llama_cpp_logits.mjs).
//
//   gguf_logits MODEL IDS OUT
//
// MODEL is a GGUF file (or a model folder), IDS the token ids as "1,2,3", OUT the file written:
// n x vocab float32 (little-endian), row t the log-softmax of the logits after ids[0..t], from
// one prefill of the whole sequence with the model's default dtypes (what `generate` runs). One
// JSON line on stdout: {"positions": n, "vocab": v}.
#include <ATen/ATen.h>

#include <cstdio>
#include <exception>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "promptcache/model/llama.hpp"

namespace {

std::vector<int64_t> parse_ids(const std::string& text) {
  std::vector<int64_t> ids;
  std::size_t i = 0;
  while (i < text.size()) {
    std::size_t end = text.find(',', i);
    if (end == std::string::npos) end = text.size();
    const std::string part = text.substr(i, end - i);
    if (part.empty() || part.size() > 10 ||
        part.find_first_not_of("0123456789") != std::string::npos) {
      throw std::runtime_error("bad token id '" + part + "' at byte " + std::to_string(i));
    }
    ids.push_back(std::stoll(part));
    i = end + 1;
  }
  if (ids.empty()) throw std::runtime_error("no token ids");
  return ids;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: gguf_logits MODEL IDS OUT\n";
    return 2;
  }
  try {
    using promptcache::LlamaModel;
    const auto model = LlamaModel::load(argv[1]);
    const std::vector<int64_t> ids = parse_ids(argv[2]);
    const auto n = static_cast<int64_t>(ids.size());
    for (int64_t id : ids) {
      if (id >= model->config().vocab_size) {
        throw std::runtime_error("token id " + std::to_string(id) + " is outside the vocabulary");
      }
    }
    auto cache = model->make_cache(n);
    promptcache::ForwardOptions options;
    options.all_logits = true;
    const auto logits =
        model->forward(torch::tensor(ids, torch::kInt64).unsqueeze(0),
                       torch::arange(n, torch::kInt64).unsqueeze(0), cache, options);
    const auto logp =
        at::log_softmax(logits.reshape({n, -1}).to(torch::kCPU, torch::kFloat32), -1).contiguous();
    std::ofstream out(argv[3], std::ios::binary);
    out.write(reinterpret_cast<const char*>(logp.data_ptr<float>()),
              static_cast<std::streamsize>(logp.numel() * sizeof(float)));
    if (!out) throw std::runtime_error(std::string("cannot write ") + argv[3]);
    std::cout << "{\"positions\": " << n << ", \"vocab\": " << logp.size(1) << "}\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "gguf_logits: " << e.what() << "\n";
    return 1;
  }
}
