// Defaults follow the checkpoint (choose_dtypes, LoadOptions left unset): a bf16 folder loads with
// its bf16 weights mapped as stored, bf16 module states and f32 compute on the CPU; the weights'
// resident bytes stay within 1.1x the file; stories260K stored in bf16 keeps the f32 reference's
// greedy output; given dtypes override; mixed files are decided by their projection matrices.
#include "support/catch_torch.hpp"

#include <unistd.h>

#include <fstream>

#include "promptcache/generation.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/model/safetensors.hpp"
#include "promptcache/model/synthetic.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "support/stories260k_reference.hpp"
#include "support/test_support.hpp"
#include "support/tiny_model.hpp"

using namespace promptcache;

namespace {

int64_t file_bytes(const std::string& path) {
  return static_cast<int64_t>(std::filesystem::file_size(path));
}

// Resident bytes of this process (/proc/self/statm's second field), or -1 where there is none.
int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = -1;
  if (!(statm >> size >> resident)) return -1;
  return resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE));
}

// A folder with config.json and model.safetensors: `c`'s random weights stored in `dtype`, the
// tensors that `f32_names` name kept in f32.
std::string write_checkpoint(const test::TempDir& dir, const ModelConfig& c, torch::Dtype dtype,
                             const std::vector<std::string>& f32_suffixes = {}) {
  std::map<std::string, torch::Tensor> w;
  for (auto& [name, t] : random_llama_weights(c, 3, 0.05)) {
    bool keep = false;
    for (const auto& s : f32_suffixes) {
      keep = keep ||
             (name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0);
    }
    w[name] = keep ? t : t.to(dtype);
  }
  write_safetensors(dir.file("model.safetensors"), w, {{"format", "pt"}});
  std::ofstream(dir.file("config.json")) << c.to_json_string();
  return dir.path().string();
}

ModelConfig small_config() {
  ModelConfig c = synthetic_config("tiny");
  c.vocab_size = 97;
  return c;
}

}  // namespace

TEST_CASE("unset dtypes follow the checkpoint: bf16, f16 and f32 files", "[llama][defaults]") {
  const ModelConfig c = small_config();
  struct Want {
    torch::Dtype file, weights, kv;
  };
  for (const Want want : {Want{torch::kBFloat16, torch::kBFloat16, torch::kBFloat16},
                          Want{torch::kFloat16, torch::kFloat16, torch::kFloat16},
                          Want{torch::kFloat32, torch::kFloat32, torch::kFloat32}}) {
    INFO("checkpoint " << dtype_name(want.file));
    test::TempDir dir("promptcache-defaults");
    const std::string folder = write_checkpoint(dir, c, want.file);
    const auto model = LlamaModel::load(folder);
    CHECK(model->dtype_choice().checkpoint == want.file);
    CHECK_FALSE(model->dtype_choice().mixed);
    CHECK(model->weight_dtype() == want.weights);
    CHECK(model->dtype() == torch::kFloat32);
    CHECK(model->kv_dtype() == want.kv);
    CHECK(model->make_cache(4).keys(0).scalar_type() == want.kv);
    CHECK_THAT(model->dtype_choice().weights_reason, Catch::Contains("as the checkpoint stores"));
    // Mapped as stored: the weights take the file's bytes, not more.
    CHECK(model->weight_bytes() <= file_bytes(dir.file("model.safetensors")) * 1.1);
    // The same model from the same tensors in memory (from_tensors) chooses alike.
    const auto checkpoint = SafetensorsCheckpoint::open_folder(folder);
    std::map<std::string, torch::Tensor> w;
    for (const auto& name : checkpoint.names()) w[name] = checkpoint.tensor(name);
    CHECK(LlamaModel::from_tensors(c, w)->kv_dtype() == want.kv);
  }
}

TEST_CASE("given dtypes override the checkpoint's", "[llama][defaults]") {
  const ModelConfig c = small_config();
  test::TempDir dir("promptcache-defaults");
  const std::string folder = write_checkpoint(dir, c, torch::kBFloat16);
  const auto bf16 = LlamaModel::load(folder);
  {
    LoadOptions o;
    o.weights = torch::kFloat32;  // --weights f32: f32 weights and, with them, f32 states
    const auto m = LlamaModel::load(folder, o);
    CHECK(m->weight_dtype() == torch::kFloat32);
    CHECK(m->kv_dtype() == torch::kFloat32);
    CHECK(m->dtype_choice().weights_reason == "given (--weights)");
    CHECK(m->weight_bytes() > bf16->weight_bytes() * 1.9);
  }
  {
    LoadOptions o;
    o.kv_dtype = torch::kFloat32;  // --kv-dtype f32: f32 states beside the bf16 weights
    const auto m = LlamaModel::load(folder, o);
    CHECK(m->weight_dtype() == torch::kBFloat16);
    CHECK(m->kv_dtype() == torch::kFloat32);
  }
  {
    LoadOptions o;
    o.weights = torch::kInt8;  // q8: f32 states, as before
    const auto m = LlamaModel::load(folder, o);
    CHECK(m->weight_dtype() == torch::kInt8);
    CHECK(m->kv_dtype() == torch::kFloat32);
  }
  {
    LoadOptions o;
    o.dtype = torch::kBFloat16;  // bf16 compute: everything in bf16
    const auto m = LlamaModel::load(folder, o);
    CHECK(m->weight_dtype() == torch::kBFloat16);
    CHECK(m->kv_dtype() == torch::kBFloat16);
    CHECK(m->dtype() == torch::kBFloat16);
  }
  {
    // An f32 file with --weights bf16: converted, bf16 states follow the bf16 weights.
    test::TempDir f32_dir("promptcache-defaults");
    LoadOptions o;
    o.weights = torch::kBFloat16;
    const auto m = LlamaModel::load(write_checkpoint(f32_dir, c, torch::kFloat32), o);
    CHECK(m->weight_dtype() == torch::kBFloat16);
    CHECK(m->kv_dtype() == torch::kBFloat16);
  }
}

TEST_CASE("off the CPU the compute dtype follows the checkpoint", "[llama][defaults]") {
  // The rule alone (no GPU needed): weights and states must equal the compute dtype there.
  LoadOptions cuda;
  cuda.device = torch::Device(torch::kCUDA, 0);
  for (torch::Dtype file : {torch::kBFloat16, torch::kFloat16, torch::kFloat32}) {
    const DtypeChoice d = choose_dtypes(file, cuda);
    CHECK(d.compute == file);
    CHECK(d.weights == file);
    CHECK(d.kv == file);
  }
  CHECK(choose_dtypes(torch::kFloat64, cuda).compute == torch::kFloat32);
  LoadOptions f32 = cuda;
  f32.dtype = torch::kFloat32;  // --dtype f32 on a bf16 file: f32 everywhere
  const DtypeChoice a = choose_dtypes(torch::kBFloat16, f32);
  CHECK(a.weights == torch::kFloat32);
  CHECK(a.kv == torch::kFloat32);
  LoadOptions f16 = cuda;
  f16.weights = torch::kFloat16;  // --weights f16 alone: the compute dtype follows it
  CHECK(choose_dtypes(torch::kBFloat16, f16).compute == torch::kFloat16);
  // On the CPU an f64 file computes in f32 with f32 weights (converted).
  const DtypeChoice cpu = choose_dtypes(torch::kFloat64, LoadOptions{});
  CHECK(cpu.weights == torch::kFloat32);
  CHECK(cpu.kv == torch::kFloat32);
}

TEST_CASE("a mixed checkpoint is decided by its projection matrices", "[llama][defaults]") {
  const ModelConfig c = small_config();
  {
    // bf16 matrices, f32 norms (and an f32 embedding): bf16 weights, the embedding converted.
    test::TempDir dir("promptcache-mixed");
    const auto m = LlamaModel::load(
        write_checkpoint(dir, c, torch::kBFloat16, {"norm.weight", "embed_tokens.weight"}));
    CHECK(m->dtype_choice().checkpoint == torch::kBFloat16);
    CHECK(m->dtype_choice().mixed);
    CHECK(m->weight_dtype() == torch::kBFloat16);
    CHECK(m->kv_dtype() == torch::kBFloat16);
  }
  {
    // f32 matrices beside a bf16 embedding: f32.
    test::TempDir dir("promptcache-mixed");
    std::vector<std::string> f32;
    for (const char* s : {"proj.weight", "norm.weight"}) f32.push_back(s);
    const auto m = LlamaModel::load(write_checkpoint(dir, c, torch::kBFloat16, f32));
    CHECK(m->dtype_choice().checkpoint == torch::kFloat32);
    CHECK(m->dtype_choice().mixed);
    CHECK(m->weight_dtype() == torch::kFloat32);
    CHECK(m->kv_dtype() == torch::kFloat32);
  }
}

TEST_CASE("a bf16 checkpoint's resident memory stays within 1.1x its file", "[llama][defaults]") {
  // 21M parameters (42 MB in bf16): large enough that the process's own noise is small beside it.
  ModelConfig c = synthetic_config("tiny");
  c.hidden_size = 512;
  c.num_attention_heads = 8;
  c.num_key_value_heads = 4;
  c.head_dim = 64;
  c.intermediate_size = 1408;
  c.num_hidden_layers = 4;
  c.vocab_size = 8000;
  c.tie_word_embeddings = false;
  test::TempDir dir("promptcache-rss");
  const std::string folder = write_checkpoint(dir, c, torch::kBFloat16);
  const int64_t file = file_bytes(dir.file("model.safetensors"));
  const auto ids = torch::arange(1, 9).unsqueeze(0);
  const auto pos = torch::arange(8).unsqueeze(0);
  {
    // Thread pools, kernels and allocator warmed up on a small model first.
    const auto warm =
        LlamaModel::from_tensors(small_config(), random_llama_weights(small_config(), 1));
    KVCache cache = warm->make_cache(16);
    warm->forward(ids, pos, cache);
  }
  auto resident_growth = [&](const LoadOptions& options, int64_t& weight_bytes) {
    const int64_t before = resident_bytes();
    const auto model = LlamaModel::load(folder, options);
    KVCache cache = model->make_cache(16);
    model->forward(ids, pos, cache);  // touches every matrix (and the lm_head: all of it)
    weight_bytes = model->weight_bytes();
    return resident_bytes() - before;
  };
  int64_t bf16_weights = 0, f32_weights = 0;
  const int64_t bf16_growth = resident_growth(LoadOptions{}, bf16_weights);
  LoadOptions f32;
  f32.weights = torch::kFloat32;
  const int64_t f32_growth = resident_growth(f32, f32_weights);
  WARN("bf16 checkpoint of " << file / 1e6 << " MB: weights " << bf16_weights / 1e6
                             << " MB by default (resident growth " << bf16_growth / 1e6 << " MB), "
                             << f32_weights / 1e6 << " MB with --weights f32 (" << f32_growth / 1e6
                             << " MB)");
  CHECK(bf16_weights <= file * 1.1);
  CHECK(f32_weights > file * 1.9);
  if (bf16_growth >= 0) CHECK(bf16_growth <= file * 1.1);
}

TEST_CASE("stories260K stored in bf16 loads with no flags as bf16 and keeps the greedy output",
          "[stories260k][defaults]") {
  const auto ref = test::stories260k_reference();
  const std::string dir = test::checked_stories260k_dir();
  // Converted by the test: a bf16 copy of the checkpoint, as HF ships current models.
  test::TempDir bf16_dir("promptcache-bf16");
  test::write_converted_folder(dir, bf16_dir, torch::kBFloat16);
  const auto model = LlamaModel::load(bf16_dir.path().string());  // no options: the defaults
  CHECK(model->weight_dtype() == torch::kBFloat16);
  CHECK(model->kv_dtype() == torch::kBFloat16);
  CHECK(model->dtype() == torch::kFloat32);
  const int64_t file = file_bytes(bf16_dir.file("model.safetensors"));
  INFO("weights " << model->weight_bytes() << " bytes, file " << file);
  CHECK(model->weight_bytes() <= file * 1.1);
  const auto tok = load_sentencepiece_tokenizer(dir + "/tokenizer.model");
  const auto result =
      generate(*model, *tok, ref.prompt_ids, test::greedy_params(ref.greedy_new_tokens));
  const std::size_t same = test::greedy_tokens_matching(ref, result.tokens);
  WARN("stories260K, bf16 checkpoint at the defaults (bf16 weights, bf16 KV, f32 compute): "
       << same << " of " << ref.greedy_ids.size() << " greedy tokens equal the f32 reference");
  if (same < ref.greedy_ids.size()) {
    // Where it parts: the f32 model's margin (top-1 minus top-2 logit) at that step.
    const auto f32 = LlamaModel::load(dir);
    std::vector<int64_t> ids(ref.prompt_ids.begin(), ref.prompt_ids.end());
    ids.insert(ids.end(), ref.greedy_ids.begin(), ref.greedy_ids.begin() + same);
    KVCache cache = f32->make_cache(static_cast<int64_t>(ids.size()));
    const auto logits =
        f32->forward(torch::tensor(ids).unsqueeze(0),
                     torch::arange(static_cast<int64_t>(ids.size())).unsqueeze(0), cache)
            .reshape({-1});
    const auto top = logits.topk(2);
    WARN("first divergence at generated token "
         << same << ": f32 margin " << (std::get<0>(top)[0] - std::get<0>(top)[1]).item<double>());
  }
  CHECK(result.tokens == ref.greedy_ids);
}
