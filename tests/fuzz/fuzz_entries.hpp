// tests/fuzz/fuzz_entries.hpp — one entry function per fuzz target, shared by the libFuzzer
// targets (tests/fuzz/fuzz_<target>.cpp, built with -DPROMPTCACHE_FUZZ=ON) and the replay test
// (tests/fuzz/replay.cpp, built with the regular compiler and run by CTest).
//
// An entry hands the bytes to the library the way a user's file reaches it and checks a few
// invariants of the result. It returns normally when the library accepted the input or refused
// it with promptcache::Error (a clean rejection). Anything else escapes and is a finding: another
// exception (an InvariantViolation included), a crash, a sanitizer report, a leak or a hang.
//
// The entries live in libraries by what they link, so that a target pulls in no more than
// it exercises: entries_pml.cpp (header-only PML, no LibTorch), entries_tokenizer.cpp
// (promptcache_core), entries_jinja.cpp (chat templates, promptcache_jinja), entries_request.cpp
// (the server's request unit, promptcache_request: no LibTorch), entries_eval.cpp (an eval
// dataset's rows, promptcache_eval_rows: no LibTorch), entries_config.cpp (promptcache_core) and
// entries_model.cpp (LibTorch). None links libsentencepiece: the library reads tokenizer.model
// itself (src/core/sentencepiece_tokenizer.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "promptcache/error.hpp"

namespace promptcache::fuzz {

// A broken promise of the library that did not crash (a span outside its module, an id
// outside the vocabulary, ...). Not a promptcache::Error, so it escapes like a crash.
struct InvariantViolation : std::logic_error {
  using std::logic_error::logic_error;
};

// "schema": PML schema text -> parse_schema_string -> layout (a fake word tokenizer, llama-2
// and chatml templates) -> render_layout, encoding passes.
void schema_entry(const std::uint8_t* data, std::size_t size);
// "prompt": PML prompt text -> parse_prompt_string -> resolve against a fixed small schema.
void prompt_entry(const std::uint8_t* data, std::size_t size);
// "http_request": a `promptcache serve` request body -> the validated request
// (src/server/request.hpp). Byte 0 picks the endpoint (0 /v1/prompt, 1 /v1/chat/completions,
// 2 /v1/completions, 3 /v1/schemas as JSON, 4 as XML; modulo 5), byte 1 the limits (even: the
// defaults; odd: small ones sized by the other bits), the rest is the body.
void http_request_entry(const std::uint8_t* data, std::size_t size);
// "openai_json": byte 0 (bit 0: 0 = chat, 1 = completion; the other bits: the limits as above),
// then the body -> parse_completion_request; messages, module references and sampling numbers
// within their limits.
void openai_json_entry(const std::uint8_t* data, std::size_t size);
// "posted_pml": byte 0 (bit 0: 0 = a RootedSrcFiles resolver over a scratch root with files,
// links leading out, a FIFO; 1 = NoSrcFiles; bit 1: a small max_pml_depth), then schema XML
// ("@ROOT@" and "@CANARY@" stand for the root's and an outside file's absolute paths) ->
// parse_posted_schema; no text of a file outside the root ever reaches the schema.
void posted_pml_entry(const std::uint8_t* data, std::size_t size);
// "config_json": config.json bytes -> ModelConfig::from_json_string; sizes positive, special ids
// in the vocabulary, and the config written back (to_json_string) reads back the same.
void config_json_entry(const std::uint8_t* data, std::size_t size);
// "eval_row": byte 0 (bit 0: whether the run's schema gives default modules), then the lines of
// a `promptcache eval` dataset -> eval::LineReader -> eval::parse_row for each; ids, resume
// keys, choices, answers and sampling fields within what the evaluation relies on.
void eval_row_entry(const std::uint8_t* data, std::size_t size);
// "chat_template": a Jinja chat template -> jinja::Template::parse -> render on a fixed
// conversation with tools, under small limits (entries_jinja.cpp, promptcache_jinja: no
// LibTorch); the render stays within max_output_bytes.
void chat_template_entry(const std::uint8_t* data, std::size_t size);
// "tokenizer_json": tokenizer.json bytes, optionally followed by NUL-separated parts: a text to
// encode, tokenizer_config.json, generation_config.json -> load_bpe_tokenizer -> encode (the
// text and fixed strings) and decode.
void tokenizer_json_entry(const std::uint8_t* data, std::size_t size);
// "sentencepiece": tokenizer.model bytes -> load_sentencepiece_tokenizer_from_bytes -> encode
// fixed strings and the model's own pieces, decode.
void sentencepiece_entry(const std::uint8_t* data, std::size_t size);
// "safetensors": the bytes as a whole .safetensors file -> SafetensorsFile::open -> tensor().
// A GGUF model file: the reader, the config and the tokenizer of its metadata (LibTorch-free).
void gguf_entry(const std::uint8_t* data, std::size_t size);
void safetensors_entry(const std::uint8_t* data, std::size_t size);
// "cache_file": the bytes as a cache file -> load_cache_file against a fixed schema layout and a
// tiny random model; then once more with the file's checksums recomputed, so that mutations get
// past the checksum checks to the shape checks.
void cache_file_entry(const std::uint8_t* data, std::size_t size);
// "redis_value": the bytes as a value read from the Redis tier -> sealed::open (the LibTorch-free
// checks of RedisTier::decode) under a fixed key and secret, as a few fixed dtypes and shapes;
// then once more with the value's MAC recomputed (sealed::reseal), so that mutations get past
// the MAC to the checks behind it.
void redis_value_entry(const std::uint8_t* data, std::size_t size);
// The key and secret of redis_value's seeds and entry.
inline constexpr const char* kRedisValueKey = "promptcache:span:fuzz:0";
inline constexpr const char* kRedisValueSecret = "fuzz-secret";

// Writes the generated (binary) seeds into corpus_root/<target>/: tokenizer.json and
// tokenizer.model files (write_tokenizer_seeds), safetensors and cache files (write_model_seeds,
// with the library's own writers and the cache_file target's fixed schema and model; redis values
// with RedisTier::encode).
void write_tokenizer_seeds(const std::string& corpus_root);
void write_model_seeds(const std::string& corpus_root);
void write_gguf_seeds(const std::string& corpus_root);

namespace detail {

// A folder under the temp dir for the files an entry writes, made once per process and removed
// when it ends normally.
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& tag) {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("promptcache-fuzz-" + tag + "-" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::string& path, const void* data, std::size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!out) throw std::runtime_error("fuzz harness: cannot write " + path);
}

// A file an entry writes for one input and removes when the input is done. Never truncating a
// file over and over matters: ext4 (auto_da_alloc) flushes a file rewritten with O_TRUNC or
// renamed over, and on a busy machine that stalled single inputs for 10+ seconds (spurious
// libFuzzer timeouts); a removed file's unwritten data is simply dropped.
class ScratchFile {
 public:
  ScratchFile(std::string path, const void* data, std::size_t size) : path_(std::move(path)) {
    remove();
    write_bytes(path_, data, size);
  }
  // Only removes the file at the end (for files the library itself writes).
  explicit ScratchFile(std::string path) : path_(std::move(path)) { remove(); }
  ~ScratchFile() { remove(); }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  void remove() const {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  std::string path_;
};

// Called for every clean rejection; with PROMPTCACHE_FUZZ_VERBOSE set (fuzz_replay -v) it prints
// the message, to see how far a seed gets.
inline void rejected(const Error& e) {
  static const bool verbose = std::getenv("PROMPTCACHE_FUZZ_VERBOSE") != nullptr;
  if (verbose) std::cerr << "  rejected: " << e.what() << "\n";
}

inline void check(bool ok, const std::string& what) {
  if (!ok) throw InvariantViolation(what);
}

}  // namespace detail
}  // namespace promptcache::fuzz
