// gguf_model.cpp — GGUF metadata to ModelConfig and back, llama.cpp's tensor names to HF's and
// back, and the file's tensors as LibTorch tensors for LlamaModel::from_tensors.
#include "promptcache/model/gguf_model.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "promptcache/error.hpp"
#include "promptcache/model/q8_weights.hpp"

namespace promptcache::gguf {
namespace {

[[noreturn]] void fail(const std::string& origin, const std::string& message,
                       const std::string& element = {}) {
  throw Error(ErrorKind::kModel, message, {origin, 0, 0, element});
}

// Per-layer names: llama.cpp's suffix after "blk.N." and HF's after "model.layers.N.".
const std::pair<const char*, const char*> kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.bias", "self_attn.o_proj.bias"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
    {"ffn_gate.bias", "mlp.gate_proj.bias"},
    {"ffn_up.bias", "mlp.up_proj.bias"},
    {"ffn_down.bias", "mlp.down_proj.bias"},
};
const std::pair<const char*, const char*> kGlobalNames[] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

// "<prefix><digits>.<rest>" -> {layer, rest}; layer -1 when the name is not of that form.
std::pair<int64_t, std::string> split_layer(const std::string& name, const std::string& prefix) {
  if (name.compare(0, prefix.size(), prefix) != 0) return {-1, {}};
  std::size_t i = prefix.size();
  int64_t layer = 0;
  const std::size_t digits_begin = i;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9' && i - digits_begin < 9) {
    layer = layer * 10 + (name[i] - '0');
    ++i;
  }
  if (i == digits_begin || i >= name.size() || name[i] != '.') return {-1, {}};
  return {layer, name.substr(i + 1)};
}

bool permuted(const ModelConfig& c, const std::string& hf_name) {
  if (c.model_type != "llama" && c.model_type != "mistral") return false;
  const auto [layer, rest] = split_layer(hf_name, "model.layers.");
  return layer >= 0 &&
         (rest.rfind("self_attn.q_proj.", 0) == 0 || rest.rfind("self_attn.k_proj.", 0) == 0);
}

int64_t permute_heads(const ModelConfig& c, const std::string& hf_name) {
  return hf_name.find(".k_proj.") != std::string::npos ? c.num_key_value_heads
                                                       : c.num_attention_heads;
}

torch::Dtype torch_dtype_of(uint32_t type) {
  switch (type) {
    case 0:
      return torch::kFloat32;
    case 1:
      return torch::kFloat16;
    case 30:
      return torch::kBFloat16;
    default:
      return torch::kUInt8;
  }
}

// Hands the heap's free pages back to the system: the metadata just released (a 32000-token
// vocabulary is ~9 MB of parsed values) and the load's temporaries would otherwise stay resident
// in the allocator's free lists, part of the process's memory for as long as it runs.
void release_freed_heap() {
#if defined(__GLIBC__)
  ::malloc_trim(0);
#endif
}

}  // namespace

torch::Tensor q8_from_q8_0(const uint8_t* src, int64_t n, int64_t k, int64_t unpermute_heads) {
  const int64_t blocks = k / 32;
  torch::Tensor out = torch::empty({n, q8_row_bytes(k)}, torch::kInt8);
  auto* dst = reinterpret_cast<uint8_t*>(out.data_ptr<int8_t>());
  const int64_t row_bytes = q8_row_bytes(k);
  // unpermute_rows_from_gguf's row order: HF row (head, s, i) is the file's row (head, i, s).
  const int64_t half = unpermute_heads > 0 ? n / unpermute_heads / 2 : 0;
  const auto source_row = [&](int64_t r) {
    if (half == 0) return r;
    const int64_t head = r / (2 * half), s = r % (2 * half) / half, i = r % half;
    return head * 2 * half + 2 * i + s;
  };
  at::parallel_for(0, n, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* in = src + source_row(r) * blocks * 34;
      uint8_t* row = dst + r * row_bytes;
      for (int64_t b = 0; b < blocks; ++b) {
        std::memcpy(row + k + 2 * b, in + b * 34, 2);
        std::memcpy(row + b * 32, in + b * 34 + 2, 32);
      }
    }
  });
  return out;
}

std::string q8_0_from_q8(const torch::Tensor& q8, int64_t k) {
  const torch::Tensor q = q8.contiguous();
  const int64_t n = q.size(0), blocks = k / 32, row_bytes = q8_row_bytes(k);
  std::string out(static_cast<std::size_t>(n * blocks * 34), '\0');
  const auto* src = reinterpret_cast<const uint8_t*>(q.data_ptr<int8_t>());
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      char* block = &out[static_cast<std::size_t>((r * blocks + b) * 34)];
      std::memcpy(block, src + r * row_bytes + k + 2 * b, 2);
      std::memcpy(block + 2, src + r * row_bytes + b * 32, 32);
    }
  }
  return out;
}

std::string gguf_tensor_name(const std::string& hf) {
  for (const auto& [g, h] : kGlobalNames) {
    if (hf == h) return g;
  }
  const auto [layer, rest] = split_layer(hf, "model.layers.");
  if (layer < 0) return {};
  for (const auto& [g, h] : kLayerNames) {
    if (rest == h) return "blk." + std::to_string(layer) + "." + g;
  }
  return {};
}

std::string hf_tensor_name(const std::string& gguf) {
  for (const auto& [g, h] : kGlobalNames) {
    if (gguf == g) return h;
  }
  const auto [layer, rest] = split_layer(gguf, "blk.");
  if (layer < 0) return {};
  for (const auto& [g, h] : kLayerNames) {
    if (rest == g) return "model.layers." + std::to_string(layer) + "." + h;
  }
  return {};
}

torch::Tensor permute_rows_for_gguf(const torch::Tensor& w, int64_t heads) {
  // HF rows per head: [2 halves, d/2] -> llama.cpp's [d/2, 2] (convert_hf_to_gguf.py's permute).
  std::vector<int64_t> shape = {heads, 2, w.size(0) / heads / 2};
  for (int64_t i = 1; i < w.dim(); ++i) shape.push_back(w.size(i));
  return w.reshape(shape).transpose(1, 2).reshape(w.sizes()).contiguous();
}

torch::Tensor unpermute_rows_from_gguf(const torch::Tensor& w, int64_t heads) {
  std::vector<int64_t> shape = {heads, w.size(0) / heads / 2, 2};
  for (int64_t i = 1; i < w.dim(); ++i) shape.push_back(w.size(i));
  return w.reshape(shape).transpose(1, 2).reshape(w.sizes()).contiguous();
}

bool holds_block_types(const File& file) {
  for (const TensorInfo& t : file.header().tensors) {
    if (type_info(t.type)->block_elements > 1 && t.type != 8) return true;
  }
  return false;
}

std::map<std::string, torch::Tensor> hf_tensors(const std::shared_ptr<File>& file,
                                                const ModelConfig& config) {
  // Q8_0 runs as the q8 layout in a Q8_0 file (as a folder's --weights q8), and as blocks beside
  // the other block types (Q4_K_M's fallbacks): one kind of quantized linear per file. An
  // embedding table that is only looked up (not tied to the lm_head) stays blocks either way: a
  // view of the mapping, whose pages become resident only for the rows a prompt uses.
  const bool q8_0_as_blocks = holds_block_types(*file);
  std::map<std::string, torch::Tensor> out;
  for (const TensorInfo& t : file->header().tensors) {
    const std::string element = "tensor '" + t.name + "'";
    const std::string hf = hf_tensor_name(t.name);
    if (hf.empty()) {
      fail(file->path(), "is not a tensor of the " + config.model_type + " architecture", element);
    }
    std::vector<int64_t> shape(t.dims.rbegin(), t.dims.rend());
    const TypeInfo* info = type_info(t.type);
    const auto* bytes = file->data(t);
    const bool permute = permuted(config, hf);
    const int64_t heads = permute ? permute_heads(config, hf) : 0;
    if (permute && (heads <= 0 || shape.empty() || shape[0] % (2 * heads) != 0)) {
      fail(file->path(), "rows do not split into " + std::to_string(heads) + " heads", element);
    }
    torch::Tensor tensor;
    bool copied = false;
    bool in_hf_order = !permute;
    const bool lookup_only = hf == "model.embed_tokens.weight" && !config.tie_word_embeddings;
    if (t.type == 8 && shape.size() == 2 && !q8_0_as_blocks && !lookup_only) {
      // Repacked and put in HF's row order in one copy (no second copy of Q and K).
      tensor = q8_from_q8_0(bytes, shape[0], shape[1], heads);
      copied = true;
      in_hf_order = true;
    } else if (info->block_elements == 1) {
      std::shared_ptr<File> keep = file;
      tensor = torch::from_blob(
          const_cast<uint8_t*>(bytes), shape, [keep](void*) mutable { keep.reset(); },
          torch::TensorOptions().dtype(torch_dtype_of(t.type)));
    } else {
      // The blocks verbatim, a view of the mapping (ggml_quant.hpp's uint8 [n, k / B, bytes]).
      if (shape.size() != 2) {
        fail(file->path(), std::string(info->name) + " tensors must be 2-D", element);
      }
      if (shape[1] % info->block_elements != 0) {
        fail(file->path(),
             "rows of " + std::to_string(shape[1]) + " elements are no whole number of " +
                 info->name + " blocks of " + std::to_string(info->block_elements),
             element);
      }
      shape = {shape[0], shape[1] / info->block_elements, info->block_bytes};
      std::shared_ptr<File> keep = file;
      tensor = torch::from_blob(
          const_cast<uint8_t*>(bytes), shape, [keep](void*) mutable { keep.reset(); },
          torch::TensorOptions().dtype(torch::kUInt8));
    }
    if (!in_hf_order) {
      tensor = unpermute_rows_from_gguf(tensor, heads);
      copied = true;
    }
    if (copied) file->drop_pages(t);
    out.emplace(hf, std::move(tensor));
  }
  return out;
}

std::unique_ptr<LlamaModel> load_model(const std::string& path, const LoadOptions& options) {
  const auto file = File::open(path);
  const ModelConfig config = config_from_file(*file);
  // The weights keep the file (its mapping) alive, not its vocabulary and other metadata: the
  // tokenizer reads those from a File of its own (load_tokenizer).
  file->release_metadata();
  auto model = LlamaModel::from_tensors(config, hf_tensors(file, config), options, path);
  release_freed_heap();
  return model;
}

}  // namespace promptcache::gguf
