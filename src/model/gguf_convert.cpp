// gguf_convert.cpp — a HuggingFace folder to a GGUF file (`promptcache convert`): metadata,
// tokenizer, per-tensor type plan, quantization and its measured error.
#include "promptcache/model/gguf_convert.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include "promptcache/error.hpp"
#include "promptcache/jinja/chat_source.hpp"
#include "promptcache/model/ggml_quant.hpp"
#include "promptcache/model/gguf.hpp"
#include "promptcache/model/gguf_model.hpp"
#include "promptcache/model/gguf_vocab.hpp"
#include "promptcache/model/q8_weights.hpp"
#include "promptcache/model/safetensors.hpp"

namespace promptcache::gguf {
namespace {

constexpr uint32_t kF32 = 0, kF16 = 1, kQ5_0 = 6, kQ8_0 = 8, kQ4_K = 12, kQ6_K = 14, kBF16 = 30;

const std::pair<const char*, FileType> kFileTypes[] = {
    {"f32", FileType::kF32},      {"f16", FileType::kF16},   {"bf16", FileType::kBF16},
    {"q8_0", FileType::kQ8_0},    {"q4_k", FileType::kQ4_K}, {"q6_k", FileType::kQ6_K},
    {"q4_k_m", FileType::kQ4_K_M}};

// llama.cpp's LLAMA_FTYPE_* values, stored as general.file_type.
uint32_t llama_ftype(FileType t) {
  switch (t) {
    case FileType::kF32:
      return 0;
    case FileType::kF16:
      return 1;
    case FileType::kQ8_0:
      return 7;
    case FileType::kQ4_K:
      return 14;  // MOSTLY_Q4_K_S: Q4_K throughout is the closest llama.cpp names
    case FileType::kQ4_K_M:
      return 15;
    case FileType::kQ6_K:
      return 18;
    case FileType::kBF16:
      return 32;
  }
  return 0;
}

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third between.
bool use_more_bits(int64_t layer, int64_t layers) {
  return layer < layers / 8 || layer >= 7 * layers / 8 || (layer - layers / 8) % 3 == 2;
}

int64_t layer_of(const std::string& gguf_name) {
  if (gguf_name.compare(0, 4, "blk.") != 0) return -1;
  int64_t layer = 0;
  std::size_t i = 4;
  for (; i < gguf_name.size() && gguf_name[i] >= '0' && gguf_name[i] <= '9'; ++i) {
    layer = layer * 10 + (gguf_name[i] - '0');
  }
  return i > 4 ? layer : -1;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The bytes of `w` [n, k] (f32) stored as `type`, and what they read back as.
std::pair<std::string, torch::Tensor> encode(const torch::Tensor& w, uint32_t type,
                                             const std::string& name) {
  auto raw = [](const torch::Tensor& t) {
    const torch::Tensor c = t.contiguous();
    return std::string(static_cast<const char*>(c.data_ptr()),
                       static_cast<std::size_t>(c.numel() * c.element_size()));
  };
  switch (type) {
    case kF32:
      return {raw(w), w};
    case kF16: {
      const torch::Tensor h = w.to(torch::kFloat16);
      return {raw(h), h.to(torch::kFloat32)};
    }
    case kBF16: {
      const torch::Tensor h = w.to(torch::kBFloat16);
      return {raw(h), h.to(torch::kFloat32)};
    }
    case kQ8_0: {
      // ggml's Q8_0 is q8_weights.hpp's quantization (d = amax / 127 stored as f16,
      // q = round(x / d)), blocks laid out as the file wants them.
      const int64_t k = w.size(1);
      const torch::Tensor q = quantize_q8(w);
      return {q8_0_from_q8(q, k), dequantize_q8(q, k)};
    }
    case kQ5_0:
    case kQ4_K:
    case kQ6_K: {
      // ggml_quant.hpp's blocks [n, k / B, bytes] are the tensor's bytes in the file.
      const torch::Tensor q = ggml::quantize(w, static_cast<ggml::Type>(type));
      return {raw(q), ggml::dequantize(q)};
    }
    default:
      throw Error(ErrorKind::kInvalidArgument,
                  "convert does not write " + type_name_of_id(type) + " tensors",
                  {"", 0, 0, "tensor '" + name + "'"});
  }
}

}  // namespace

FileType parse_file_type(const std::string& text) {
  for (const auto& [name, type] : kFileTypes) {
    if (text == name) return type;
  }
  throw Error(ErrorKind::kInvalidArgument,
              "unknown GGUF type '" + text + "' (use f32, f16, bf16, q8_0, q4_k, q6_k or q4_k_m)");
}

std::string file_type_name(FileType type) {
  for (const auto& [name, t] : kFileTypes) {
    if (t == type) return name;
  }
  return "?";
}

uint32_t plan_tensor_type(FileType type, const std::string& name, const std::vector<int64_t>& shape,
                          int64_t num_layers, bool tied) {
  if (shape.size() != 2) return kF32;
  uint32_t want = kF32;
  switch (type) {
    case FileType::kF32:
      return kF32;
    case FileType::kF16:
      return kF16;
    case FileType::kBF16:
      return kBF16;
    case FileType::kQ8_0:
      want = kQ8_0;
      break;
    case FileType::kQ6_K:
      want = kQ6_K;
      break;
    case FileType::kQ4_K:
      want = kQ4_K;
      break;
    case FileType::kQ4_K_M: {
      want = kQ4_K;
      const int64_t layer = layer_of(name);
      if (name == "output.weight" || (tied && name == "token_embd.weight")) {
        want = kQ6_K;
      } else if ((ends_with(name, ".attn_v.weight") || ends_with(name, ".ffn_down.weight")) &&
                 layer >= 0 && use_more_bits(layer, num_layers)) {
        want = kQ6_K;
      }
      break;
    }
  }
  // llama.cpp's fallbacks (llama_tensor_get_type) for rows of no whole 256-block: Q4_K -> Q5_0,
  // Q6_K -> Q8_0, then F16 for rows of no whole 32-block either.
  const int64_t k = shape[1];
  if (want == kQ4_K || want == kQ6_K) {
    if (k % 256 == 0) return want;
    want = want == kQ4_K ? kQ5_0 : kQ8_0;
  }
  return k % 32 == 0 ? want : kF16;
}

ConvertReport convert_folder(const std::string& dir, const std::string& out, FileType type) {
  namespace fs = std::filesystem;
  const ModelConfig config = ModelConfig::from_json_file((fs::path(dir) / "config.json").string());
  config.validate(dir);
  Writer writer;
  put_config(writer, config);
  writer.set("general.name", Value::string(fs::path(dir).lexically_normal().filename().string()));
  writer.set("general.file_type", Value::u32(llama_ftype(type)));
  writer.set("general.quantization_version", Value::u32(2));
  Vocab vocab = vocab_from_folder(dir);
  // A vocabulary shorter than the embedding's rows is padded as llama.cpp's converter pads it,
  // with unused "[PAD<n>]" tokens (llama.cpp refuses a file whose token count is not the
  // embedding's rows).
  const auto known = static_cast<int64_t>(vocab.tokens.size());
  if (known < config.vocab_size) {
    if (vocab.token_types.empty()) vocab.token_types.assign(vocab.tokens.size(), 1);
    const bool spm = vocab.model == "llama";
    for (int64_t id = known; id < config.vocab_size; ++id) {
      vocab.tokens.push_back("[PAD" + std::to_string(spm ? id - known + 1 : id) + "]");
      if (spm) vocab.scores.push_back(-1000.0f);
      vocab.token_types.push_back(5);  // unused
    }
  }
  // The folder's chat template wherever it keeps it (chat_template.jinja first, then
  // tokenizer_config.json's string or the "default" of its named templates), as HF reads it.
  if (auto source = jinja::find_chat_template(dir)) vocab.chat_template = std::move(source->text);
  put_vocab(writer, vocab);

  const auto checkpoint = SafetensorsCheckpoint::open_folder(dir);
  ConvertReport report;
  report.out = out;
  report.type = type;
  std::vector<std::pair<std::string, std::string>> names;  // gguf, hf: embeddings first
  for (const std::string& hf : checkpoint.names()) {
    if (ends_with(hf, "rotary_emb.inv_freq")) continue;  // recomputed from the config
    if (hf == "lm_head.weight" && config.tie_word_embeddings) continue;
    const std::string g = gguf_tensor_name(hf);
    if (g.empty()) {
      throw Error(ErrorKind::kModel, "tensor has no llama.cpp name (not converted)",
                  {dir, 0, 0, "tensor '" + hf + "'"});
    }
    names.emplace_back(g, hf);
  }
  std::stable_sort(names.begin(), names.end(), [](const auto& a, const auto& b) {
    return layer_of(a.first) < layer_of(b.first);
  });
  const bool tied = config.tie_word_embeddings || !checkpoint.contains("lm_head.weight");
  const bool permute = config.model_type == "llama" || config.model_type == "mistral";
  std::map<uint32_t, TypeReport> types;
  std::map<uint32_t, std::pair<double, double>> per_type;  // sum of diff², of original²
  for (const auto& [g, hf] : names) {
    torch::Tensor w = checkpoint.tensor(hf).to(torch::kFloat32);
    if (permute &&
        (hf.find(".q_proj.") != std::string::npos || hf.find(".k_proj.") != std::string::npos)) {
      w = permute_rows_for_gguf(w, hf.find(".k_proj.") != std::string::npos
                                       ? config.num_key_value_heads
                                       : config.num_attention_heads);
    }
    w = w.contiguous();
    const std::vector<int64_t> shape = w.sizes().vec();
    const uint32_t t = plan_tensor_type(type, g, shape, config.num_hidden_layers, tied);
    auto [bytes, back] = encode(w, t, g);
    TensorReport r;
    r.name = g;
    r.type = type_name_of_id(t);
    r.shape = shape;
    r.bytes = static_cast<int64_t>(bytes.size());
    const torch::Tensor diff = back.reshape(w.sizes()) - w;
    const double norm = w.norm().item<double>();
    const double diff_norm = diff.norm().item<double>();
    r.rms_relative_error = norm > 0 ? diff_norm / norm : 0.0;
    r.max_abs_error = w.numel() > 0 ? diff.abs().max().item<double>() : 0.0;
    auto& sums = per_type[t];
    sums.first += diff_norm * diff_norm;
    sums.second += norm * norm;
    TypeReport& tr = types[t];
    tr.type = r.type;
    tr.tensors += 1;
    tr.elements += w.numel();
    tr.bytes += r.bytes;
    tr.worst_rms_relative_error = std::max(tr.worst_rms_relative_error, r.rms_relative_error);
    tr.max_abs_error = std::max(tr.max_abs_error, r.max_abs_error);
    report.tensors.push_back(r);
    writer.add_tensor(g, std::vector<int64_t>(shape.rbegin(), shape.rend()), t, std::move(bytes));
  }
  for (auto& [id, tr] : types) {
    const auto [diff2, norm2] = per_type[id];
    tr.rms_relative_error = norm2 > 0 ? std::sqrt(diff2 / norm2) : 0.0;
    report.types.push_back(tr);
  }
  writer.write(out);
  report.file_bytes = static_cast<int64_t>(fs::file_size(out));
  return report;
}

}  // namespace promptcache::gguf
