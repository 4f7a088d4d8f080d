// GGUF files: the reader/writer round trip of every metadata type, `convert` of tiny models of
// each family and of stories260K loading back to the folder's logits (exactly where the weights
// are the same numbers), the tokenizer from metadata giving the folder's ids, the Q8_0 error
// bound, the Q4_K_M type plan and the Q/K row permutation.
#include "support/catch_torch.hpp"

#include <cstring>
#include <filesystem>
#include <sstream>

#include "promptcache/builtin_data.hpp"
#include "promptcache/error.hpp"
#include "promptcache/generation.hpp"
#include "promptcache/model/gguf.hpp"
#include "promptcache/model/gguf_convert.hpp"
#include "promptcache/model/gguf_model.hpp"
#include "promptcache/model/gguf_vocab.hpp"
#include "promptcache/model/llama.hpp"
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
  // Rows that are not whole 256-blocks fall back (Q8_0), then F16 when not whole 32-blocks.
  CHECK(gguf::plan_tensor_type(FileType::kQ4_K_M, "blk.1.ffn_up.weight", {64, 96}, 32, false) == 8);
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
      for (const auto& t : report.tensors) {
        INFO(t.name << " " << t.type);
        if (t.shape.size() == 2) CHECK(t.type == "Q8_0");
        CHECK(t.rms_relative_error < 0.01);
      }

      // f16: rounded to f16 from bf16 (exact for bf16 values within f16's range).
      const std::string f16 = dir.file("m-f16.gguf");
      gguf::convert_folder(folder, f16, gguf::FileType::kF16);
      const auto from_f16 = LlamaModel::load(f16);
      CHECK(from_f16->weight_dtype() == torch::kFloat16);
      const auto diff = (all_logits(*from_f16, prompt) - all_logits(*ref32, prompt)).abs().max();
      CHECK(diff.item<double>() < 1e-3);

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
  const struct {
    gguf::FileType type;
    std::optional<torch::Dtype> folder_weights;
  } cases[] = {{gguf::FileType::kF32, torch::kFloat32},
               {gguf::FileType::kQ8_0, torch::kInt8},
               {gguf::FileType::kBF16, std::nullopt}};
  for (const auto& c : cases) {
    const std::string path = dir.file("s-" + gguf::file_type_name(c.type) + ".gguf");
    gguf::convert_folder(folder, path, c.type);
    const auto ref = LlamaModel::load(folder, with_weights(c.folder_weights));
    const auto model = LlamaModel::load(path);
    INFO(path);
    CHECK(model->weight_dtype() == ref->weight_dtype());
    CHECK(torch::equal(all_logits(*model, prompt), all_logits(*ref, prompt)));
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
  CHECK(compared > 50);
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

TEST_CASE("gguf K-quant types say they are not in this build yet", "[gguf]") {
  test::TempDir dir("promptcache-gguf-k");
  const std::string folder = dir.file("m");
  ModelConfig c = synthetic_config("tiny");
  c.hidden_size = 256;
  c.intermediate_size = 256;
  c.num_hidden_layers = 1;
  c.head_dim = c.hidden_size / c.num_attention_heads;
  make_synthetic_model(folder, "tiny", 1);
  write_model_folder(folder, c, random_llama_weights(c, 1));
  try {
    gguf::convert_folder(folder, dir.file("k.gguf"), gguf::FileType::kQ4_K_M);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kInvalidArgument);
    CHECK_THAT(e.what(), Catch::Contains("not in this build yet"));
  }
  CHECK_FALSE(std::filesystem::exists(dir.file("k.gguf")));
}
