// fuzz_replay — runs the fuzz entries (fuzz_entries.hpp) over saved inputs, with the regular
// compiler and without libFuzzer, so CTest checks on every build that no crashing input found by
// fuzzing (tests/fuzz/regressions/<target>/) and no seed (tests/fuzz/corpus/<target>/) makes the
// library do anything but succeed or throw promptcache::Error.
//
//   fuzz_replay                          every target over its corpus and regressions folders
//   fuzz_replay TARGET                   one target over its folders
//   fuzz_replay TARGET PATH...           one target over the given files or folders
//   fuzz_replay -v ...                   the same, printing each input and every clean rejection
//   fuzz_replay --write-seeds ROOT       (re)writes the generated binary seeds into ROOT/<target>/
//
// Exit status 0 when every input passed, 1 when one escaped with another exception (named with
// its file), 2 on a usage error. A crash or a hang kills the process, which fails the test too.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "fuzz/fuzz_entries.hpp"
#include "promptcache/error.hpp"

namespace promptcache::fuzz {
const char* replay_dir();  // tests/fuzz in this checkout (replay_dir.cpp)
}  // namespace promptcache::fuzz

namespace {

namespace fs = std::filesystem;
using Entry = void (*)(const std::uint8_t*, std::size_t);

struct Target {
  const char* name;
  Entry entry;
};

const Target kTargets[] = {
    {"schema", promptcache::fuzz::schema_entry},
    {"prompt", promptcache::fuzz::prompt_entry},
    {"http_request", promptcache::fuzz::http_request_entry},
    {"openai_json", promptcache::fuzz::openai_json_entry},
    {"posted_pml", promptcache::fuzz::posted_pml_entry},
    {"config_json", promptcache::fuzz::config_json_entry},
    {"eval_row", promptcache::fuzz::eval_row_entry},
    {"chat_template", promptcache::fuzz::chat_template_entry},
    {"tokenizer_json", promptcache::fuzz::tokenizer_json_entry},
    {"sentencepiece", promptcache::fuzz::sentencepiece_entry},
    {"safetensors", promptcache::fuzz::safetensors_entry},
    {"gguf", promptcache::fuzz::gguf_entry},
    {"cache_file", promptcache::fuzz::cache_file_entry},
    {"redis_value", promptcache::fuzz::redis_value_entry},
};

// Every regular file under the paths (folders recursively), sorted; missing folders are empty.
std::vector<fs::path> inputs(const std::vector<fs::path>& paths) {
  std::vector<fs::path> out;
  for (const fs::path& p : paths) {
    std::error_code ec;
    if (fs::is_regular_file(p, ec)) {
      out.push_back(p);
    } else if (fs::is_directory(p, ec)) {
      for (const auto& e : fs::recursive_directory_iterator(p, ec)) {
        // README files describe a folder; they are not inputs.
        if (e.is_regular_file() && e.path().filename() != "README.md") out.push_back(e.path());
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

int replay(const Target& target, const std::vector<fs::path>& paths) {
  int failures = 0;
  const std::vector<fs::path> files = inputs(paths);
  for (const fs::path& file : files) {
    if (std::getenv("PROMPTCACHE_FUZZ_VERBOSE"))
      std::cerr << target.name << ": " << file.string() << "\n";
    std::ifstream in(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    try {
      target.entry(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      ++failures;
      std::cerr << target.name << ": " << file.string() << ": escaped: " << e.what() << "\n";
    } catch (...) {
      ++failures;
      std::cerr << target.name << ": " << file.string() << ": escaped: a non-std exception\n";
    }
  }
  std::cout << target.name << ": " << files.size() << " inputs, " << failures << " failures\n";
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "-v") {
    // Print every clean rejection (detail::rejected), to see how far each input gets.
    ::setenv("PROMPTCACHE_FUZZ_VERBOSE", "1", 1);
    args.erase(args.begin());
  }
  const fs::path fuzz_dir = promptcache::fuzz::replay_dir();
  if (!args.empty() && args[0] == "--write-seeds") {
    if (args.size() != 2) {
      std::cerr << "usage: fuzz_replay --write-seeds CORPUS_ROOT\n";
      return 2;
    }
    try {
      promptcache::fuzz::write_tokenizer_seeds(args[1]);
      promptcache::fuzz::write_model_seeds(args[1]);
      promptcache::fuzz::write_gguf_seeds(args[1]);
    } catch (const std::exception& e) {
      std::cerr << "fuzz_replay: " << e.what() << "\n";
      return 1;
    }
    return 0;
  }
  int failures = 0;
  bool found = args.empty();
  for (const Target& t : kTargets) {
    if (!args.empty() && args[0] != t.name) continue;
    found = true;
    std::vector<fs::path> paths(args.size() > 1 ? args.begin() + 1 : args.end(), args.end());
    if (paths.empty()) paths = {fuzz_dir / "corpus" / t.name, fuzz_dir / "regressions" / t.name};
    failures += replay(t, paths);
  }
  if (!found) {
    std::cerr << "fuzz_replay: unknown target '" << args[0] << "' (targets:";
    for (const Target& t : kTargets) std::cerr << " " << t.name;
    std::cerr << ")\n";
    return 2;
  }
  return failures == 0 ? 0 : 1;
}
