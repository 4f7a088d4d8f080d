// Broken model folders and tokenizer files: Engine::open refuses each with an Error naming the
// folder or file, and the field or tensor at fault; a good folder opened afterwards works.
#include "support/catch_torch.hpp"

#include <filesystem>

#include "bad_inputs/bad_input.hpp"
#include "promptcache/model/safetensors.hpp"
#include "promptcache/model/synthetic.hpp"

using namespace promptcache;
using bad::Expect;
namespace fs = std::filesystem;

namespace {

EngineOptions llama2() {
  EngineOptions o;
  o.chat_template = "llama-2";
  return o;
}

// A working tiny model folder: config.json, model.safetensors, tokenizer.model.
class ModelFolders {
 public:
  ModelFolders() {
    good_ = dir_.file("good");
    write_model_folder(good_, config_, weights_);
    fs::copy_file(test::tiny_tokenizer_path(), good_ + "/tokenizer.model");
  }
  const std::string& good() const { return good_; }
  const ModelConfig& config() const { return config_; }
  const std::map<std::string, torch::Tensor>& weights() const { return weights_; }

  // A copy of the good folder to break.
  std::string copy(const std::string& name) const {
    const std::string out = dir_.file(name);
    fs::copy(good_, out, fs::copy_options::recursive);
    return out;
  }

 private:
  test::TempDir dir_{"promptcache-bad-model"};
  ModelConfig config_ = test::tiny_config();
  std::map<std::string, torch::Tensor> weights_ = random_llama_weights(config_, 7, 0.15);
  std::string good_;
};

// The safetensors file's 8-byte little-endian header length, replaced.
void set_header_length(const std::string& path, std::uint64_t length) {
  std::string bytes = bad::read_file(path);
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  bad::write_file(path, bytes);
}

std::uint64_t header_length(const std::string& path) {
  const std::string bytes = bad::read_file(path);
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[i]);
  return n;
}

// Replaces the first occurrence of `from` in a file.
void edit_file(const std::string& path, const std::string& from, const std::string& to) {
  std::string text = bad::read_file(path);
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  text.replace(at, from.size(), to);
  bad::write_file(path, text);
}

void open_engine(const std::string& dir) {
  Engine::open(dir, llama2());
}

}  // namespace

TEST_CASE("broken model folders: refused naming the file and the field or tensor", "[bad][model]") {
  ModelFolders folders;
  using bad::expect_error;

  expect_error("a model folder that does not exist", [&] { open_engine("/nonexistent/model"); },
               {ErrorKind::kModel, {"/nonexistent/model", "does not exist"}});

  const std::string no_config = folders.copy("no-config");
  fs::remove(no_config + "/config.json");
  expect_error("a folder without config.json", [&] { open_engine(no_config); },
               {ErrorKind::kModel, {no_config, "config.json is missing"}});

  const std::string bad_json = folders.copy("bad-json");
  bad::write_file(bad_json + "/config.json", "{\"hidden_size\": 64,");
  expect_error("config.json that is not JSON", [&] { open_engine(bad_json); },
               {ErrorKind::kModel, {bad_json + "/config.json", "not valid JSON"}});

  const std::string no_field = folders.copy("no-field");
  edit_file(no_field + "/config.json", "\"hidden_size\"", "\"hidden_sizes\"");
  expect_error("config.json without hidden_size", [&] { open_engine(no_field); },
               {ErrorKind::kModel, {no_field + "/config.json", "'hidden_size'"}});

  const std::string arch = folders.copy("arch");
  edit_file(arch + "/config.json", "LlamaForCausalLM", "GPTNeoXForCausalLM");
  expect_error("an unknown architecture", [&] { open_engine(arch); },
               {ErrorKind::kModel,
                {arch + "/config.json", "unsupported architecture 'GPTNeoXForCausalLM'",
                 "LlamaForCausalLM"}});

  const std::string no_weights = folders.copy("no-weights");
  fs::remove(no_weights + "/model.safetensors");
  expect_error("a folder without safetensors", [&] { open_engine(no_weights); },
               {ErrorKind::kModel, {no_weights, "no *.safetensors files"}});

  const std::string missing = folders.copy("missing-tensor");
  {
    auto w = folders.weights();
    w.erase("model.layers.1.mlp.up_proj.weight");
    write_safetensors(missing + "/model.safetensors", w);
  }
  expect_error("a tensor missing from the checkpoint", [&] { open_engine(missing); },
               {ErrorKind::kModel, {missing, "tensor 'model.layers.1.mlp.up_proj.weight'"}});

  const std::string shape = folders.copy("shape");
  {
    auto w = folders.weights();
    w["model.layers.0.self_attn.k_proj.weight"] = torch::zeros({16, 64});
    write_safetensors(shape + "/model.safetensors", w);
  }
  expect_error("a tensor whose shape does not match config.json", [&] { open_engine(shape); },
               {ErrorKind::kModel,
                {shape, "tensor 'model.layers.0.self_attn.k_proj.weight'", "[16, 64]",
                 "config.json implies"}});

  const std::string dtype = folders.copy("dtype");
  edit_file(dtype + "/model.safetensors", "\"dtype\":\"F32\"", "\"dtype\":\"Q4\" ");
  expect_error(
      "a tensor of a dtype the reader does not know", [&] { open_engine(dtype); },
      {ErrorKind::kSafetensors, {dtype + "/model.safetensors", "unknown dtype 'Q4'", "tensor '"}});

  const std::string int_dtype = folders.copy("int-dtype");
  {
    auto w = folders.weights();
    w["model.layers.0.mlp.up_proj.weight"] =
        w["model.layers.0.mlp.up_proj.weight"].to(torch::kInt32);
    write_safetensors(int_dtype + "/model.safetensors", w);
  }
  expect_error(
      "a weight stored as integers", [&] { open_engine(int_dtype); },
      {ErrorKind::kModel,
       {int_dtype, "tensor 'model.layers.0.mlp.up_proj.weight'", "Int", "floating-point"}});

  const std::string truncated = folders.copy("truncated");
  const std::string st = truncated + "/model.safetensors";
  fs::resize_file(st, fs::file_size(st) - 1000);
  expect_error("a truncated safetensors file", [&] { open_engine(truncated); },
               {ErrorKind::kSafetensors, {st, "beyond the data section", "tensor '"}});

  const std::string past_end = folders.copy("past-end");
  const std::string pe = past_end + "/model.safetensors";
  set_header_length(pe, fs::file_size(pe) + 10);
  expect_error("a header length larger than the file", [&] { open_engine(past_end); },
               {ErrorKind::kSafetensors, {pe, "runs past the end of the file"}});

  const std::string huge = folders.copy("huge-header");
  set_header_length(huge + "/model.safetensors", std::uint64_t{1} << 40);
  expect_error(
      "an oversized header (1 TiB)", [&] { open_engine(huge); },
      {ErrorKind::kSafetensors, {huge + "/model.safetensors", "exceeds the 100 MB limit"}});

  const std::string garbled = folders.copy("garbled-header");
  {
    std::string bytes = bad::read_file(garbled + "/model.safetensors");
    bytes[8] = '[';
    bytes[9] = '[';
    bad::write_file(garbled + "/model.safetensors", bytes);
  }
  expect_error("a header that is not JSON", [&] { open_engine(garbled); },
               {ErrorKind::kSafetensors, {garbled + "/model.safetensors", "not valid JSON"}});

  const std::string tiny_file = folders.copy("tiny-file");
  bad::write_file(tiny_file + "/model.safetensors", "abc");
  expect_error("a safetensors file of 3 bytes", [&] { open_engine(tiny_file); },
               {ErrorKind::kSafetensors, {tiny_file + "/model.safetensors", "3 bytes"}});

  const std::string dir_file = folders.copy("dir-file");
  fs::remove(dir_file + "/model.safetensors");
  fs::create_directory(dir_file + "/model.safetensors");
  expect_error("model.safetensors that is a folder", [&] { open_engine(dir_file); },
               {ErrorKind::kIo, {dir_file + "/model.safetensors", "not a regular file"}});

  const std::string index = folders.copy("index");
  bad::write_file(index + "/model.safetensors.index.json",
                  R"({"weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}})");
  expect_error("an index naming a missing shard", [&] { open_engine(index); },
               {ErrorKind::kModel, {index, "model-00002-of-00002.safetensors", "missing"}});

  const std::string small_vocab = folders.copy("small-vocab");
  {
    ModelConfig c = folders.config();
    c.vocab_size = 100;
    write_model_folder(small_vocab, c, random_llama_weights(c, 7, 0.15));
  }
  expect_error(
      "a tokenizer larger than the model's vocabulary", [&] { open_engine(small_vocab); },
      {ErrorKind::kModel, {small_vocab + ": model error:", "400 pieces", "only 100 embeddings"}});

  // Nothing above left state behind: the good folder opens and answers.
  auto engine = Engine::open(folders.good(), llama2());
  engine->add_schema_string(bad::kGoodSchema);
  CHECK(engine->generate_xml(bad::kGoodPrompt, bad::greedy()).tokens.size() == 5);
  CHECK(header_length(folders.good() + "/model.safetensors") < 100000);
}

TEST_CASE("broken tokenizer files: refused naming the folder or file", "[bad][tokenizer]") {
  ModelFolders folders;
  using bad::expect_error;

  const std::string none = folders.copy("no-tokenizer");
  fs::remove(none + "/tokenizer.model");
  expect_error("a folder without a tokenizer", [&] { open_engine(none); },
               {ErrorKind::kIo, {none, "neither tokenizer.json", "nor tokenizer.model"}});
  expect_error("load_tokenizer on a missing file",
               [&] { load_tokenizer(none + "/tokenizer.model"); },
               {ErrorKind::kIo, {none + "/tokenizer.model", "no such file"}});

  const std::string corrupt = folders.copy("corrupt-spm");
  std::string garbage(4096, '\0');
  for (std::size_t i = 0; i < garbage.size(); ++i) garbage[i] = static_cast<char>(i * 131 + 7);
  bad::write_file(corrupt + "/tokenizer.model", garbage);
  expect_error("a corrupt tokenizer.model", [&] { open_engine(corrupt); },
               {ErrorKind::kTokenizer, {corrupt + "/tokenizer.model"}});

  const std::string truncated = folders.copy("truncated-spm");
  {
    const std::string path = truncated + "/tokenizer.model";
    fs::resize_file(path, fs::file_size(path) / 2);
  }
  expect_error("a truncated tokenizer.model", [&] { open_engine(truncated); },
               {ErrorKind::kTokenizer, {truncated + "/tokenizer.model"}});

  const std::string empty = folders.copy("empty-spm");
  bad::write_file(empty + "/tokenizer.model", "");
  expect_error("an empty tokenizer.model", [&] { open_engine(empty); },
               {ErrorKind::kTokenizer, {empty + "/tokenizer.model"}});

  // tokenizer.json wins over tokenizer.model, so a broken one is reported, not skipped.
  const std::string json = folders.copy("bad-json");
  bad::write_file(json + "/tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": ");
  expect_error("a tokenizer.json that is not JSON", [&] { open_engine(json); },
               {ErrorKind::kTokenizer, {json + "/tokenizer.json"}});

  const std::string unigram = folders.copy("unigram-json");
  bad::write_file(unigram + "/tokenizer.json",
                  R"({"model": {"type": "Unigram", "vocab": [["a", 0.0]]}})");
  expect_error("a tokenizer.json of an unsupported model type", [&] { open_engine(unigram); },
               {ErrorKind::kTokenizer, {unigram + "/tokenizer.json", "Unigram"}});

  const std::string no_vocab = folders.copy("no-vocab-json");
  bad::write_file(no_vocab + "/tokenizer.json", R"({"model": {"type": "BPE", "merges": []}})");
  expect_error("a tokenizer.json without a vocabulary", [&] { open_engine(no_vocab); },
               {ErrorKind::kTokenizer, {no_vocab + "/tokenizer.json", "vocab"}});

  // The good folder still opens.
  CHECK(load_tokenizer(folders.good())->vocab_size() == 400);
}
