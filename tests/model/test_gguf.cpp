// GGUF files: the reader/writer round trip of every metadata type, `convert` of tiny models of
// each family and of stories260K loading back to the folder's logits (exactly where the weights
// are the same numbers), the tokenizer from metadata giving the folder's ids, the Q8_0 error
// bound, the Q4_K_M type plan and the Q/K row permutation, and q4_k / q6_k / q4_k_m files loading
// as mapped GGML blocks (bitwise the same blocks quantized in memory; within stated bounds of the
// folder's f32 logits), their fallbacks included.
#include "support/catch_torch.hpp"

#include <cstring>
#include <filesystem>
#include <sstream>

#include "promptcache/builtin_data.hpp"
#include "promptcache/error.hpp"
#include "promptcache/generation.hpp"
#include "promptcache/model/ggml_quant.hpp"
#include "promptcache/model/gguf.hpp"
#include "promptcache/model/gguf_convert.hpp"
#include "promptcache/model/gguf_model.hpp"
#include "promptcache/model/gguf_vocab.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/model/q8_weights.hpp"
#include "promptcache/model/safetensors.hpp"
#include "promptcache/model/synthetic.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "support/test_support.hpp"

using namespace promptcache;

namespace {

torch::Tensor all_logits(const LlamaModel& m, const std::vector<TokenId>& prompt) {
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  KVCache cache = m.make_cache(static_cast<int64_t>(ids.size()) + 1);
  ForwardOptions o;
  o.all_logits = true;
  return m.forward(torch::tensor(ids).unsqueeze(0), torch::arange((int64_t)ids.size()), cache, o);
}

std::vector<TokenId> greedy(const LlamaModel& m, const Tokenizer& tok,
                            const std::vector<TokenId>& prompt, int n) {
  SamplingParams p;
  p.max_new_tokens = n;
  p.stop_at_eos = false;
  return generate(m, tok, prompt, p, [](TokenId, const std::string&) { return true; }).tokens;
}

LoadOptions with_weights(std::optional<torch::Dtype> w) {
  LoadOptions o;
  o.weights = w;
  return o;
}

// Texts for the tokenizer comparison: the corpus's lines and a few harder ones.
std::vector<std::string> tokenizer_texts() {
  std::vector<std::string> out;
  std::istringstream lines(builtin_corpus());
  for (std::string line; std::getline(lines, line);) out.push_back(line);
  for (const char* s : {"", " ", "  two  spaces", "Hello\n\nworld\t!", "caf\xC3\xA9 na\xC3\xAFve",
                        "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E", "emoji \xF0\x9F\x99\x82 ok",
                        "<|im_start|>user\nhi<|im_end|>", "<s> and </s>", "12345 3.14159"}) {
    out.emplace_back(s);
  }
  return out;
}

}  // namespace

TEST_CASE("gguf writer and reader round-trip every value type and tensor info", "[gguf]") {
  test::TempDir dir("promptcache-gguf");
  gguf::Writer w;
  auto scalar = [](gguf::ValueType t, uint64_t u, int64_t i, double f) {
    gguf::Value v;
    v.type = t;
    v.u = u;
    v.i = i;
    v.f = f;
    return v;
  };
  using VT = gguf::ValueType;
  w.set("u8", scalar(VT::kUint8, 200, 0, 0));
  w.set("i8", scalar(VT::kInt8, 0, -100, 0));
  w.set("u16", scalar(VT::kUint16, 60000, 0, 0));
  w.set("i16", scalar(VT::kInt16, 0, -30000, 0));
  w.set("u32", gguf::Value::u32(4000000000u));
  w.set("i32", gguf::Value::i32(-2000000000));
  w.set("u64", gguf::Value::u64(1ull << 40));
  w.set("i64", scalar(VT::kInt64, 0, -(1ll << 40), 0));
  w.set("f32", gguf::Value::f32(0.5f));
  w.set("f64", scalar(VT::kFloat64, 0, 0, 1e-300));
  w.set("bool", gguf::Value::boolean(true));
  w.set("str", gguf::Value::string("h\xC3\xA9llo"));
  gguf::Value nested;
  nested.type = VT::kArray;
  nested.item_type = VT::kArray;
  nested.items = {gguf::Value::strings({"a", "bc"}), gguf::Value::strings({})};
  w.set("nested", nested);
  w.add_tensor("a", {4, 3}, 0, std::string(48, '\1'));
  w.add_tensor("b", {64}, 8, std::string(68, '\2'));
  w.add_tensor("c", {5}, 1, std::string(10, '\3'));
  const std::string path = dir.file("t.gguf");
  w.write(path);

  const auto f = gguf::File::open(path);
  CHECK(f->header().version == 3);
  CHECK(f->find("u8")->u == 200);
  CHECK(f->find("i8")->i == -100);
  CHECK(f->find("u16")->u == 60000);
  CHECK(f->find("i16")->i == -30000);
  CHECK(f->get_int("u32") == 4000000000ll);
  CHECK(f->find("i32")->i == -2000000000);
  CHECK(f->find("u64")->u == (1ull << 40));
  CHECK(f->find("i64")->i == -(1ll << 40));
  CHECK(f->get_number("f32") == 0.5);
  CHECK(f->find("f64")->f == 1e-300);
  CHECK(f->get_bool("bool") == true);
  CHECK(f->get_string("str") == std::string("h\xC3\xA9llo"));
  const gguf::Value* n = f->find("nested");
  REQUIRE(n != nullptr);
  REQUIRE(n->items.size() == 2);
  CHECK(n->items[0].items[1].str == "bc");
  CHECK(n->items[1].items.empty());
  CHECK_THROWS_AS(f->get_string("u32"), Error);
  REQUIRE(f->header().tensors.size() == 3);
  const gguf::TensorInfo* b = f->tensor("b");
  REQUIRE(b != nullptr);
  CHECK(b->nbytes == 68);
  CHECK(b->offset % 32 == 0);
  CHECK(f->data(*b)[0] == 2);
  CHECK((f->header().data_offset % 32) == 0);
  CHECK(gguf::is_gguf_file(path));
  CHECK_FALSE(gguf::is_gguf_file(dir.file("absent.gguf")));
}

TEST_CASE("gguf Q/K row permutation is llama.cpp's and undoes itself", "[gguf]") {
  // One head of dimension 4 with rows r0..r3: HF's halves [r0 r1 | r2 r3] interleave to
  // r0 r2 r1 r3 (convert_hf_to_gguf.py's permute).
  const auto w = torch::arange(8, torch::kFloat32).reshape({4, 2});
  const auto p = gguf::permute_rows_for_gguf(w, 1);
  CHECK(torch::equal(p.select(1, 0), torch::tensor({0.f, 4.f, 2.f, 6.f})));
  CHECK(torch::equal(gguf::unpermute_rows_from_gguf(p, 1), w));
  const auto blocks = torch::randint(0, 255, {16, 2, 34}).to(torch::kUInt8);
  CHECK(torch::equal(gguf::unpermute_rows_from_gguf(gguf::permute_rows_for_gguf(blocks, 2), 2),
                     blocks));
  // Q8_0 blocks repacked into q8 with the rows put back in the same copy: the repack, then the
  // row order undone.
  for (const int64_t heads : {1, 2, 4}) {
    CAPTURE(heads);
    const auto q8_0 = torch::randint(0, 255, {16, 2, 34}).to(torch::kUInt8).contiguous();
    const auto* data = q8_0.data_ptr<uint8_t>();
    CHECK(torch::equal(gguf::q8_from_q8_0(data, 16, 64, heads),
                       gguf::unpermute_rows_from_gguf(gguf::q8_from_q8_0(data, 16, 64), heads)));
  }
}

TEST_CASE("gguf File::release_metadata frees the metadata and keeps the tensors", "[gguf]") {
  test::TempDir dir("promptcache-gguf-release");
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::string("llama"));
  w.add_tensor("t", {4}, 0, std::string(16, '\x01'));
  const std::string path = dir.file("m.gguf");
  w.write(path);
  const auto f = gguf::File::open(path);
  REQUIRE(f->find("general.architecture") != nullptr);
  f->release_metadata();
  CHECK(f->metadata().empty());
  CHECK(f->find("general.architecture") == nullptr);
  const auto* t = f->tensor("t");
  REQUIRE(t != nullptr);
  CHECK(f->data(*t)[0] == 1);
  CHECK(f->data(*t)[15] == 1);
}

TEST_CASE("gguf Q4_K_M type plan follows llama_model_quantize", "[gguf]") {
  using gguf::FileType;
  const std::vector<int64_t> m = {4096, 4096};
  auto plan = [&](const std::string& name, bool tied = false) {
    return gguf::type_name_of_id(gguf::plan_tensor_type(FileType::kQ4_K_M, name, m, 32, tied));
  };
  CHECK(plan("output.weight") == "Q6_K");
  CHECK(plan("token_embd.weight") == "Q4_K");
  CHECK(plan("token_embd.weight", true) == "Q6_K");
  CHECK(plan("blk.10.attn_q.weight") == "Q4_K");
  // use_more_bits for 32 layers: 0-3, 28-31 and 4 + 3j + 2 = 6, 9, ..., 27.
  for (int layer = 0; layer < 32; ++layer) {
    const bool more = layer < 4 || layer >= 28 || (layer - 4) % 3 == 2;
    INFO("layer " << layer);
    CHECK(plan("blk." + std::to_string(layer) + ".attn_v.weight") == (more ? "Q6_K" : "Q4_K"));
    CHECK(plan("blk." + std::to_string(layer) + ".ffn_down.weight") == (more ? "Q6_K" : "Q4_K"));
    CHECK(plan("blk." + std::to_string(layer) + ".ffn_up.weight") == "Q4_K");
  }
  CHECK(gguf::plan_tensor_type(FileType::kQ4_K_M, "blk.0.attn_norm.weight", {4096}, 32, false) ==
        0);
  // Rows that are not whole 256-blocks fall back as llama_tensor_get_type's table says (Q4_K to
  // Q5_0, Q6_K to Q8_0), then F16 when not whole 32-blocks.
  CHECK(gguf::plan_tensor_type(FileType::kQ4_K_M, "blk.1.ffn_up.weight", {64, 96}, 32, false) == 6);
  CHECK(gguf::plan_tensor_type(FileType::kQ4_K, "blk.1.ffn_up.weight", {64, 96}, 32, false) == 6);
  CHECK(gguf::plan_tensor_type(FileType::kQ4_K_M, "output.weight", {64, 96}, 32, false) == 8);
  CHECK(gguf::plan_tensor_type(FileType::kQ6_K, "blk.1.ffn_up.weight", {64, 96}, 32, false) == 8);
  CHECK(gguf::plan_tensor_type(FileType::kQ4_K_M, "blk.1.ffn_up.weight", {64, 40}, 32, false) == 1);
  CHECK(gguf::plan_tensor_type(FileType::kQ8_0, "blk.1.ffn_up.weight", {64, 40}, 32, false) == 1);
  CHECK(gguf::plan_tensor_type(FileType::kBF16, "blk.1.ffn_up.weight", {64, 40}, 32, false) == 30);
}

TEST_CASE("gguf convert of each family loads back to the folder's logits", "[gguf]") {
  for (const std::string shape : {"tiny", "qwen2-tiny", "qwen3-tiny", "mistral-tiny"}) {
    DYNAMIC_SECTION(shape) {
      test::TempDir dir("promptcache-gguf-fam");
      const std::string folder = dir.file("m");
      make_synthetic_model(folder, shape, 11, torch::kBFloat16);
      const auto tok = load_tokenizer(folder);
      const auto prompt = tok->encode("Once upon a time the river flowed to the sea.", true);
      REQUIRE(prompt.size() > 8);

      // bf16: the same numbers, mapped, run by the same kernels: identical logits.
      const std::string bf16 = dir.file("m-bf16.gguf");
      gguf::convert_folder(folder, bf16, gguf::FileType::kBF16);
      const auto ref = LlamaModel::load(folder);
      const auto from_bf16 = LlamaModel::load(bf16);
      CHECK(from_bf16->config().architecture == ref->config().architecture);
      CHECK(from_bf16->weight_dtype() == torch::kBFloat16);
      CHECK(torch::equal(all_logits(*from_bf16, prompt), all_logits(*ref, prompt)));

      // f32: the folder loaded with f32 weights.
      const std::string f32 = dir.file("m-f32.gguf");
      gguf::convert_folder(folder, f32, gguf::FileType::kF32);
      const auto ref32 = LlamaModel::load(folder, with_weights(torch::kFloat32));
      const auto from_f32 = LlamaModel::load(f32);
      CHECK(from_f32->weight_dtype() == torch::kFloat32);
      CHECK(torch::equal(all_logits(*from_f32, prompt), all_logits(*ref32, prompt)));

      // q8_0: the folder loaded with q8 weights (the same quantization).
      const std::string q8 = dir.file("m-q8_0.gguf");
      const auto report = gguf::convert_folder(folder, q8, gguf::FileType::kQ8_0);
      const auto ref_q8 = LlamaModel::load(folder, with_weights(torch::kInt8));
      const auto from_q8 = LlamaModel::load(q8);
      CHECK(from_q8->weight_dtype() == torch::kInt8);
      CHECK(torch::equal(all_logits(*from_q8, prompt), all_logits(*ref_q8, prompt)));
      // The embedding table: repacked into q8 when the lm_head is the same matrix, else the
      // file's Q8_0 blocks, mapped (only the rows a prompt looks up become resident).
      INFO("tie_word_embeddings " << from_q8->config().tie_word_embeddings);
      if (from_q8->config().tie_word_embeddings) {
        CHECK(is_q8(from_q8->embedding()));
      } else {
        CHECK(ggml::quant_type_of(from_q8->embedding()) == ggml::Type::Q8_0);
      }
      for (const auto& t : report.tensors) {
        INFO(t.name << " " << t.type);
        if (t.shape.size() == 2) CHECK(t.type == "Q8_0");
        CHECK(t.rms_relative_error < 0.01);
      }

      // f16: the bf16 values in f16 (exact within f16's range), run by the f16 kernels with f16
      // states (the defaults for an f16 file): within 0.5% of the logits' range of f32's.
      const std::string f16 = dir.file("m-f16.gguf");
      gguf::convert_folder(folder, f16, gguf::FileType::kF16);
      const auto from_f16 = LlamaModel::load(f16);
      CHECK(from_f16->weight_dtype() == torch::kFloat16);
      CHECK(from_f16->kv_dtype() == torch::kFloat16);
      const auto want = all_logits(*ref32, prompt);
      const double diff = (all_logits(*from_f16, prompt) - want).abs().max().item<double>();
      const double range = want.abs().max().item<double>();
      INFO("f16 max logit difference " << diff << " of " << range);
      CHECK(diff < 5e-3 * range);

      // The GGUF's tokenizer gives the folder's ids, and greedy decoding agrees.
      const auto gtok = load_tokenizer(q8);
      CHECK(gtok->encode("Once upon a time the river flowed to the sea.", true) == prompt);
      CHECK(greedy(*from_q8, *gtok, prompt, 12) == greedy(*ref_q8, *tok, prompt, 12));
    }
  }
}

TEST_CASE("gguf convert of stories260K: same logits, greedy tokens and tokenizer ids",
          "[gguf][stories260k]") {
  const std::string folder = test::checked_stories260k_dir();
  test::TempDir dir("promptcache-gguf-s");
  const auto tok = load_tokenizer(folder);
  const auto prompt = tok->encode("Once upon a time, there was a little girl", true);
  // The folder is f32: bf16 and q8 are the folder loaded with --weights bf16 / q8. Its MLP
  // width, 172, is no whole number of Q8_0 blocks: down_proj falls back to F16 in the q8_0 file
  // (as llama.cpp's converter does), where --weights q8 pads the last block, so q8_0 agrees
  // within a tolerance instead of exactly.
  const struct {
    gguf::FileType type;
    torch::Dtype folder_weights;
    double tolerance;
  } cases[] = {{gguf::FileType::kF32, torch::kFloat32, 0.0},
               {gguf::FileType::kBF16, torch::kBFloat16, 0.0},
               {gguf::FileType::kQ8_0, torch::kInt8, 0.02}};
  for (const auto& c : cases) {
    const std::string path = dir.file("s-" + gguf::file_type_name(c.type) + ".gguf");
    gguf::convert_folder(folder, path, c.type);
    const auto ref = LlamaModel::load(folder, with_weights(c.folder_weights));
    const auto model = LlamaModel::load(path);
    INFO(path);
    CHECK(model->weight_dtype() == ref->weight_dtype());
    CHECK(model->kv_dtype() == ref->kv_dtype());
    const auto want = all_logits(*ref, prompt);
    const auto got = all_logits(*model, prompt);
    if (c.tolerance == 0) {
      CHECK(torch::equal(got, want));
    } else {
      const double diff = (got - want).abs().max().item<double>();
      INFO("max logit difference " << diff);
      CHECK(diff < c.tolerance * want.abs().max().item<double>());
    }
    const auto gtok = load_tokenizer(path);
    CHECK(greedy(*model, *gtok, prompt, 20) == greedy(*ref, *tok, prompt, 20));
  }
  // The tokenizer from the metadata: the folder's ids on every text, BOS/EOS, add_bos.
  const std::string path = dir.file("s-f32.gguf");
  const auto gtok = load_tokenizer(path);
  CHECK(gtok->bos_id() == tok->bos_id());
  CHECK(gtok->eos_id() == tok->eos_id());
  CHECK(gtok->unk_id() == tok->unk_id());
  CHECK(gtok->adds_bos() == tok->adds_bos());
  CHECK(gtok->vocab_size() == tok->vocab_size());
  int compared = 0;
  for (const std::string& text : tokenizer_texts()) {
    INFO(text);
    CHECK(gtok->encode(text, true) == tok->encode(text, true));
    CHECK(gtok->decode(gtok->encode(text)) == tok->decode(tok->encode(text)));
    ++compared;
  }
  CHECK(compared >= 50);
}

TEST_CASE("gguf tokenizer of a byte-level BPE folder gives the folder's ids", "[gguf]") {
  test::TempDir dir("promptcache-gguf-bpe");
  const std::string folder = dir.file("q");
  make_synthetic_model(folder, "qwen2-tiny", 3, torch::kBFloat16);
  const std::string path = dir.file("q.gguf");
  gguf::convert_folder(folder, path, gguf::FileType::kBF16);
  const auto f = gguf::File::open(path);
  CHECK(f->get_string("tokenizer.ggml.model") == std::string("gpt2"));
  CHECK(f->get_string("tokenizer.ggml.pre") == std::string("qwen2"));
  const auto tok = load_tokenizer(folder);
  const auto gtok = load_tokenizer(path);
  CHECK(gtok->kind() == tok->kind());
  CHECK(gtok->eos_id() == tok->eos_id());
  CHECK(gtok->adds_bos() == tok->adds_bos());
  CHECK(gtok->end_of_turn_ids() == tok->end_of_turn_ids());
  for (const std::string& text : tokenizer_texts()) {
    INFO(text);
    CHECK(gtok->encode(text) == tok->encode(text));
  }
}

TEST_CASE("gguf q8_0 quantization error stays within ggml's bound", "[gguf]") {
  test::TempDir dir("promptcache-gguf-q8");
  const std::string folder = dir.file("m");
  make_synthetic_model(folder, "tiny", 5, torch::kFloat32);
  const auto report = gguf::convert_folder(folder, dir.file("m.gguf"), gguf::FileType::kQ8_0);
  const auto checkpoint = SafetensorsCheckpoint::open_folder(folder);
  int matrices = 0;
  for (const auto& t : report.tensors) {
    INFO(t.name);
    if (t.type != "Q8_0") {
      CHECK(t.rms_relative_error == 0);
      continue;
    }
    ++matrices;
    // Per element: half a step of amax / 127, plus the f16 rounding of the step (2^-11 of it,
    // times up to 127): 0.57 steps of the tensor's largest block.
    const std::string hf = gguf::hf_tensor_name(t.name);
    const double amax = checkpoint.tensor(hf).abs().max().item<double>();
    CHECK(t.max_abs_error <= 0.57 * amax / 127);
    CHECK(t.rms_relative_error > 0);
    CHECK(t.rms_relative_error < 0.01);
  }
  CHECK(matrices == 2 + 7 * 2);  // embeddings, lm_head, and 7 per layer
}

namespace {

// A tiny model whose matrices are whole K-quant blocks: rows of 256 (hidden) and 512 (MLP), 8
// layers so that Q4_K_M's use_more_bits picks some (layers 0, 3, 6 and 7).
std::string kquant_folder(test::TempDir& dir, const std::string& shape, int64_t intermediate) {
  const std::string folder = dir.file(shape + "-" + std::to_string(intermediate));
  make_synthetic_model(folder, shape, 3);
  ModelConfig c = synthetic_config(shape);
  c.hidden_size = 256;
  c.intermediate_size = intermediate;
  c.num_hidden_layers = 8;
  c.head_dim = c.hidden_size / c.num_attention_heads;
  // Weights of N(0, 0.02), as real checkpoints start and bench-small has them: with 0.1 eight
  // random layers of 256 amplify any perturbation (a chaotic stack: Q6_K's 1.7% weight error
  // moved the logits by 30% of their range), which says nothing of the loader.
  write_model_folder(folder, c, random_llama_weights(c, 7, 0.02));
  return folder;
}

// The folder's matrices quantized in memory as `type`'s plan gives them (ggml::quantize), the
// rest as they are: what a GGUF file of that type must load as.
std::map<std::string, torch::Tensor> planned_blocks(const std::string& folder,
                                                    gguf::FileType type) {
  const ModelConfig c = ModelConfig::from_json_file(folder + "/config.json");
  const auto checkpoint = SafetensorsCheckpoint::open_folder(folder);
  const bool tied = c.tie_word_embeddings || !checkpoint.contains("lm_head.weight");
  std::map<std::string, torch::Tensor> out;
  for (const std::string& name : checkpoint.names()) {
    torch::Tensor t = checkpoint.tensor(name).to(torch::kFloat32);
    if (t.dim() == 2) {
      const uint32_t id = gguf::plan_tensor_type(type, gguf::gguf_tensor_name(name),
                                                 t.sizes().vec(), c.num_hidden_layers, tied);
      if (id == 12 || id == 14) t = ggml::quantize(t, static_cast<ggml::Type>(id));
    }
    out.emplace(name, t);
  }
  return out;
}

// The share of positions whose largest logit is the same token.
double top1_agreement(const torch::Tensor& a, const torch::Tensor& b) {
  return a.argmax(-1).eq(b.argmax(-1)).to(torch::kFloat64).mean().item<double>();
}

}  // namespace

TEST_CASE("gguf q4_k, q6_k and q4_k_m files load as mapped blocks and agree with the folder",
          "[gguf][kquant]") {
  for (const std::string shape : {"tiny", "qwen2-tiny"}) {
    DYNAMIC_SECTION(shape) {
      test::TempDir dir("promptcache-gguf-kq");
      const std::string folder = kquant_folder(dir, shape, 512);
      const ModelConfig config = ModelConfig::from_json_file(folder + "/config.json");
      const auto tok = load_tokenizer(folder);
      const auto prompt = tok->encode("Once upon a time the river flowed to the sea.", true);
      REQUIRE(prompt.size() > 8);
      const auto ref = LlamaModel::load(folder, with_weights(torch::kFloat32));
      const auto want = all_logits(*ref, prompt);
      const double range = want.abs().max().item<double>();
      for (const auto type :
           {gguf::FileType::kQ6_K, gguf::FileType::kQ4_K_M, gguf::FileType::kQ4_K}) {
        const std::string name = gguf::file_type_name(type);
        INFO(name);
        const std::string path = dir.file(shape + "-" + name + ".gguf");
        const auto report = gguf::convert_folder(folder, path, type);

        // Every matrix is a K-quant (no fallback at these widths), within the per-type bounds of
        // ggml::quantize (docs/architecture.md: Q6_K < 2%, Q4_K < 8% RMS relative error).
        std::map<std::string, int64_t> tensors_of_type;
        for (const auto& t : report.types) {
          INFO(t.type << " rms " << t.rms_relative_error << " worst "
                      << t.worst_rms_relative_error);
          tensors_of_type[t.type] = t.tensors;
          if (t.type == "Q6_K") CHECK(t.worst_rms_relative_error < 0.02);
          if (t.type == "Q4_K") CHECK(t.worst_rms_relative_error < 0.08);
          if (t.type == "Q4_K" || t.type == "Q6_K") CHECK(t.rms_relative_error > 0);
          if (t.type == "F32") CHECK(t.worst_rms_relative_error == 0);
        }
        const int64_t matrices = 7 * 8 + (config.tie_word_embeddings ? 1 : 2);
        if (type == gguf::FileType::kQ6_K) CHECK(tensors_of_type["Q6_K"] == matrices);
        if (type == gguf::FileType::kQ4_K) CHECK(tensors_of_type["Q4_K"] == matrices);
        if (type == gguf::FileType::kQ4_K_M) {
          // output.weight (token_embd.weight when tied), attn_v and ffn_down of layers 0, 3, 6, 7.
          CHECK(tensors_of_type["Q6_K"] == 1 + 2 * 4);
          CHECK(tensors_of_type["Q4_K"] == matrices - 9);
        }
        CHECK(tensors_of_type.count("Q8_0") == 0);
        CHECK(tensors_of_type.count("F16") == 0);

        // Loaded as the file's blocks: the weights' bytes are the file's, not a dequantized copy.
        const auto model = LlamaModel::load(path);
        CHECK(model->dtype_choice().checkpoint == torch::kUInt8);
        CHECK(model->weight_bytes() <= 1.1 * static_cast<double>(report.file_bytes));
        CHECK(model->weight_bytes() >= 0.8 * static_cast<double>(report.file_bytes));

        // Bitwise the model made from the same blocks in memory (the loader's mapping, names and
        // Q/K row order are the converter's inverse).
        const auto got = all_logits(*model, prompt);
        const auto same = LlamaModel::from_tensors(config, planned_blocks(folder, type));
        CHECK(torch::equal(got, all_logits(*same, prompt)));

        // Against the folder in f32, on this random model's nearly flat logits (their range is
        // about 1): the RMS of the logits' difference relative to theirs, the largest difference
        // against their range, and the share of positions whose top token agrees. Measured
        // (2026-12-07, tiny / qwen2-tiny): Q6_K RMS 5.6% / 6.2%, max 7.3% / 6.1% of the range,
        // top-1 0.92 / 1.0; Q4_K and Q4_K_M RMS 19-25%, max 20-30%, top-1 0.38-0.61 (the
        // weights' 7% error, plus 8-bit activations, on logits that differ by little).
        const bool q6 = type == gguf::FileType::kQ6_K;
        const double rms = ((got - want).norm() / want.norm()).item<double>();
        const double diff = (got - want).abs().max().item<double>();
        const double agree = top1_agreement(got, want);
        INFO(shape << " " << name << ": logits RMS relative difference " << rms
                   << ", max logit difference " << diff << " of " << range << ", top-1 agreement "
                   << agree);
        CHECK(rms < (q6 ? 0.1 : 0.35));
        CHECK(diff < (q6 ? 0.1 : 0.35) * range);
        CHECK(agree >= (q6 ? 0.85 : 0.3));
        const auto gtok = load_tokenizer(path);
        CHECK(gtok->encode("Once upon a time the river flowed to the sea.", true) == prompt);
      }
    }
  }
}

TEST_CASE("gguf q4_k_m rows that are no whole K-quant block fall back to Q5_0 and Q8_0 blocks",
          "[gguf][kquant]") {
  // An MLP of 288: gate/up rows (256) are Q4_K, down_proj's rows (288) Q5_0 where the plan says
  // Q4_K and Q8_0 where it says Q6_K (llama.cpp's fallbacks), which a file with K-quants holds as
  // blocks beside them (mapped, not repacked into q8).
  test::TempDir dir("promptcache-gguf-kqf");
  const std::string folder = kquant_folder(dir, "tiny", 288);
  const std::string path = dir.file("m.gguf");
  const auto report = gguf::convert_folder(folder, path, gguf::FileType::kQ4_K_M);
  std::map<std::string, std::string> type_of;
  for (const auto& t : report.tensors) type_of[t.name] = t.type;
  CHECK(type_of["blk.1.ffn_down.weight"] == "Q5_0");  // Q4_K by the plan
  CHECK(type_of["blk.0.ffn_down.weight"] == "Q8_0");  // Q6_K by the plan
  CHECK(type_of["blk.1.ffn_up.weight"] == "Q4_K");
  CHECK(type_of["blk.0.attn_v.weight"] == "Q6_K");
  for (const auto& t : report.types) {
    INFO(t.type);
    if (t.type == "Q8_0") CHECK(t.worst_rms_relative_error < 0.01);
    if (t.type == "Q5_0") CHECK(t.worst_rms_relative_error < 0.05);
  }

  const auto file = gguf::File::open(path);
  CHECK(gguf::holds_block_types(*file));
  const ModelConfig config = ModelConfig::from_json_file(folder + "/config.json");
  const auto tensors = gguf::hf_tensors(file, config);
  const auto& down = tensors.at("model.layers.1.mlp.down_proj.weight");
  CHECK(ggml::quant_type_of(down) == ggml::Type::Q5_0);
  CHECK(down.data_ptr() == static_cast<const void*>(file->data(
                               *file->tensor("blk.1.ffn_down.weight"))));  // a view of the mapping
  const auto& down0 = tensors.at("model.layers.0.mlp.down_proj.weight");
  CHECK(ggml::quant_type_of(down0) == ggml::Type::Q8_0);
  CHECK(down0.data_ptr() ==
        static_cast<const void*>(file->data(*file->tensor("blk.0.ffn_down.weight"))));
  CHECK(ggml::quant_type_of(tensors.at("model.layers.1.mlp.up_proj.weight")) == ggml::Type::Q4_K);

  const auto model = LlamaModel::load(path);
  const auto ref = LlamaModel::load(folder, with_weights(torch::kFloat32));
  const auto tok = load_tokenizer(folder);
  const auto prompt = tok->encode("Once upon a time the river flowed to the sea.", true);
  const auto want = all_logits(*ref, prompt);
  const double diff = (all_logits(*model, prompt) - want).abs().max().item<double>();
  INFO("max logit difference " << diff);
  CHECK(diff < 0.35 * want.abs().max().item<double>());  // as Q4_K_M's bound above (0.18 measured)
  CHECK(model->weight_bytes() <= 1.1 * static_cast<double>(report.file_bytes));
}

TEST_CASE("gguf q4_k and q4_k_m of stories260K: the fallbacks, greedy tokens as the folder's",
          "[gguf][kquant][stories260k]") {
  // stories260K's rows are 64 and 172 wide, no whole 256-blocks: as llama.cpp's quantizer, a
  // q4_k / q4_k_m file stores them as Q5_0 (planned Q4_K) or Q8_0 (planned Q6_K: q4_k_m's
  // output, attn_v and ffn_down picks) where they are whole 32-blocks (64), else F16 (172).
  const std::string folder = test::checked_stories260k_dir();
  test::TempDir dir("promptcache-gguf-sk");
  const auto tok = load_tokenizer(folder);
  const auto prompt = tok->encode("Once upon a time, there was a little girl", true);
  const auto ref = LlamaModel::load(folder, with_weights(torch::kFloat32));
  const auto want_logits = all_logits(*ref, prompt);
  const auto want = greedy(*ref, *tok, prompt, 20);
  for (const auto type : {gguf::FileType::kQ4_K, gguf::FileType::kQ4_K_M}) {
    const std::string path = dir.file("s-" + gguf::file_type_name(type) + ".gguf");
    INFO(path);
    const auto report = gguf::convert_folder(folder, path, type);
    std::map<std::string, int> count;
    for (const auto& t : report.tensors) {
      INFO(t.name);
      if (t.shape.size() != 2) continue;
      ++count[t.type];
      if (t.shape[1] % 32 != 0) {
        CHECK(t.type == "F16");
      } else if (type == gguf::FileType::kQ4_K) {
        CHECK(t.type == "Q5_0");
      } else {
        CHECK((t.type == "Q5_0" || t.type == "Q8_0"));
      }
      if (t.type == "Q5_0") CHECK(t.rms_relative_error < 0.06);  // 0.0498 measured at worst
    }
    CHECK(count["Q5_0"] > 0);
    if (type == gguf::FileType::kQ4_K_M) CHECK(count["Q8_0"] > 0);
    CHECK(count["Q4_K"] + count["Q6_K"] == 0);
    const auto model = LlamaModel::load(path);
    CHECK(model->dtype_choice().checkpoint == torch::kUInt8);  // Q5_0 blocks, mapped
    // Against the folder in f32: stories260K's logits are peaked (a trained model), so the file's
    // 5-bit weights keep the top token. Measured (2026-12-07): logits RMS relative difference
    // 0.072 (q4_k) and 0.062 (q4_k_m), the top token at every position and all 20 greedy tokens
    // the folder's.
    const auto got = all_logits(*model, prompt);
    const double rms = ((got - want_logits).norm() / want_logits.norm()).item<double>();
    const double agree = top1_agreement(got, want_logits);
    INFO("logits RMS relative difference " << rms << ", top-1 agreement " << agree);
    CHECK(rms < 0.15);
    CHECK(agree >= 0.9);
    const auto gtok = load_tokenizer(path);
    CHECK(greedy(*model, *gtok, prompt, 20) == want);
  }
}
