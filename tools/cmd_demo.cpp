// promptcache demo: the first thing a new user runs (scripts/demo.sh). Two parts:
//  1. A story on a real, trained model: stories260K (models/stories260K) with the schema
//     schemas/story.xml and its prompt schemas/story.prompt.xml (both compiled into the binary).
//     The schema is compiled once; the prompt is answered greedily with and without the cache,
//     both answers are printed one above the other with their TTFTs, and checked identical (the
//     prompt selects a gap-free prefix of the schema: prefix-exact, contract 2).
//  2. Speed: a synthetic model made in memory (--shape, bench-small by default: random weights
//     kept in bf16) with a document schema of --speed-tokens tokens, where the cache's gap is
//     large.
// --model DIR runs both parts on that folder instead.
#include <fmt/format.h>

#include <cctype>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <limits>
#include <sstream>

#include "docqa.hpp"
#include "engine_setup.hpp"
#include "promptcache/builtin_data.hpp"
#include "promptcache/model/llama.hpp"
#include "promptcache/model/synthetic.hpp"
#include "promptcache/model/tokenizer.hpp"

namespace promptcache::cli {

// schemas/story.xml and schemas/story.prompt.xml (generated from them by CMake).
const char* demo_story_schema();
const char* demo_story_prompt();

namespace {
namespace fs = std::filesystem;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Where stories260K may be: beside the binary's folder in a checkout (build/promptcache ->
// models/), under an installed prefix (bin/ -> share/promptcache/models/), or under the current
// folder (the repository root).
std::vector<fs::path> stories260k_candidates() {
  std::vector<fs::path> out;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path prefix = exe.parent_path().parent_path();
    out.push_back(prefix / "models" / "stories260K");
    out.push_back(prefix / "share" / "promptcache" / "models" / "stories260K");
  }
  const fs::path cwd = fs::current_path(ec);
  if (!ec) out.push_back(cwd / "models" / "stories260K");
  return out;
}

// The default model of the story part; UsageError listing where it looked when it is absent.
std::string find_stories260k() {
  std::string looked;
  for (const auto& dir : stories260k_candidates()) {
    if (fs::exists(dir / "model.safetensors") && fs::exists(dir / "config.json")) {
      return dir.lexically_normal().string();
    }
    looked += "\n  " + dir.lexically_normal().string();
  }
  throw UsageError(
      "demo: the stories260K model was not found; it ships with the repository in "
      "models/stories260K. Looked in:" +
      looked + "\nRun the demo from a checkout (scripts/demo.sh) or give --model DIR.");
}

// The built-in corpus, dealt line by line into `n` documents, up to `budget` tokens in all (the
// schema must fit the model's context).
std::string document_schema(int documents, int64_t budget, const Tokenizer& tokenizer) {
  std::istringstream in(builtin_corpus());
  std::vector<std::string> docs(documents);
  int64_t used = 0;
  int d = 0;
  while (used < budget) {
    bool any = false;
    in.clear();
    in.seekg(0);
    for (std::string l; std::getline(in, l);) {
      if (l.empty()) continue;
      used += static_cast<int64_t>(tokenizer.encode(l).size()) + 1;
      if (used > budget) break;
      docs[d] += docqa::xml_escape(l) + " ";
      d = (d + 1) % documents;
      any = true;
    }
    if (!any) break;  // a line longer than the budget
  }
  std::string xml =
      "<schema name=\"demo\">\n  <system>You are a helpful assistant. Answer using the "
      "documents.</system>\n";
  for (int i = 0; i < documents; ++i) {
    xml += "  <module name=\"doc" + std::to_string(i) + "\">" + docs[i] + "</module>\n";
  }
  return xml + "</schema>\n";
}

struct Timed {
  Response response;
  double best_ttft_ms = 1e300;
};

// Runs `prompt` `repeats` times, with or without the cache; the best TTFT and the last response.
Timed best_of(Engine& engine, const std::string& prompt, const SamplingParams& params,
              bool use_cache, int repeats) {
  Timed t;
  for (int i = 0; i < repeats; ++i) {
    RequestOptions request;
    request.use_cache = use_cache;
    // Each cached run assembles its modules anew: none are kept from the run before.
    request.reuse_buffer = false;
    t.response = engine.generate_xml(prompt, params, {}, request);
    t.best_ttft_ms = std::min(t.best_ttft_ms, t.response.timings.ttft_ms);
  }
  return t;
}

// "identical: yes (N tokens)", or where the two answers part.
std::string compare_answers(const Engine& engine, const Response& cached, const Response& plain) {
  if (cached.tokens == plain.tokens) {
    return fmt::format("identical: yes ({} tokens, token for token)", cached.tokens.size());
  }
  std::size_t i = 0;
  while (i < cached.tokens.size() && i < plain.tokens.size() &&
         cached.tokens[i] == plain.tokens[i]) {
    ++i;
  }
  const auto piece = [&](const Response& r) {
    return i < r.tokens.size()
               ? fmt::format("'{}' (id {})", engine.tokenizer().decode({r.tokens[i]}), r.tokens[i])
               : std::string("the end");
  };
  return fmt::format(
      "identical: NO: they diverge at generated token {} (after \"{}\"): cached {}, no cache {}", i,
      engine.tokenizer().decode(
          std::vector<TokenId>(cached.tokens.begin(), cached.tokens.begin() + i)),
      piece(cached), piece(plain));
}

struct Options {
  ModelOptions model;
  std::string shape = "bench-small";
  int tokens = 64;
  int speed_tokens = 1024;
  int repeats = 2;
};

// Prints and flushes (progress lines must show before the work they announce).
void say(const std::string& line) {
  std::cout << line << std::endl;
}

// Modules a layout declares, the schema's root not counted.
std::size_t module_count(const pml::Layout& layout) {
  return layout.modules.empty() ? 0 : layout.modules.size() - 1;
}

// Part 1: the story schema on a real model.
void story_part(const Options& o, ModelOptions model, bool default_model) {
  const auto start = std::chrono::steady_clock::now();
  say(default_model
          ? "1) A story on stories260K, a real Llama (260K parameters) trained on TinyStories"
          : "1) A story on " + model.model_dir);
  EngineFlags flags;
  if (default_model) flags.chat_template = "plain";  // stories260K has no chat format
  auto engine = open_engine(model, flags);
  const auto& layout = engine->add_schema_string(demo_story_schema(), "schemas/story.xml");
  const double compile_s = seconds_since(start);
  std::string prompt = demo_story_prompt();
  while (!prompt.empty() && std::isspace(static_cast<unsigned char>(prompt.back()))) {
    prompt.pop_back();
  }
  SamplingParams params;  // greedy
  params.max_new_tokens = o.tokens;
  params.stop_strings = {"\n"};  // one paragraph
  const Timed plain = best_of(*engine, prompt, params, false, o.repeats);
  const Timed cached = best_of(*engine, prompt, params, true, o.repeats);
  const auto& c = cached.response;
  say(fmt::format("   model:  {}", model.model_dir));
  say(
      fmt::format("   schema: schemas/story.xml, {} modules, {} positions; loaded and compiled in "
                  "{:.2f} s",
                  module_count(layout), layout.total_length, compile_s));
  say(fmt::format("   prompt: {}", prompt));
  say(
      fmt::format("           {} cached + {} fresh tokens; greedy, one paragraph (at most {} "
                  "tokens)",
                  c.cached_tokens, c.fresh_tokens, o.tokens));
  say("   with the cache:    " + c.text);
  say("   without the cache: " + plain.response.text);
  say("   " + compare_answers(*engine, c, plain.response));
  say(
      fmt::format("   TTFT with the cache {:.2f} ms (assembly {:.2f} ms), without {:.2f} ms (best "
                  "of {} each)",
                  cached.best_ttft_ms, c.timings.assembly_ms, plain.best_ttft_ms, o.repeats));
  say(fmt::format("   part 1 took {:.1f} s\n", seconds_since(start)));
}

// The speed part's default model, made in memory (no 250 MB file to write): the --shape's
// random weights, stored and kept in bf16 (--weights overrides), with stories260K's tokenizer.
std::unique_ptr<Engine> synthetic_engine(const Options& o, const std::string& tokenizer_file) {
  apply_threads(o.model);
  auto tokenizer = load_sentencepiece_tokenizer(tokenizer_file);
  ModelConfig config = synthetic_config(o.shape);
  config.vocab_size = std::max<int64_t>(config.vocab_size, tokenizer->vocab_size());
  config.bos_token_id = tokenizer->bos_id();
  config.eos_token_ids = {tokenizer->eos_id()};
  EngineOptions options;
  options.chat_template = "llama-2";
  options.load = load_options(o.model);
  // bf16 weights, set explicitly: the loader's default has been f32 weights.
  if (!options.load.weights) options.load.weights = torch::kBFloat16;
  // As make-model: the larger shapes get N(0, 0.02) weights, the tiny ones peaked attention.
  const double init_std = o.shape == "bench-small" || o.shape == "tinyllama-1.1b" ? 0.02 : 0.1;
  auto model =
      LlamaModel::from_tensors(config, random_llama_weights(config, 0, init_std, torch::kBFloat16),
                               options.load, "<synthetic " + o.shape + ">");
  return std::make_unique<Engine>(std::move(model), std::move(tokenizer), options);
}

// Part 2: TTFT with and without the cache on a bigger model and a long schema.
void speed_part(const Options& o, const std::string& stories_dir) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<Engine> engine;
  if (o.model.model_dir.empty()) {
    say(fmt::format("2) Speed on a synthetic '{}' model (random weights: its text is noise)",
                    o.shape));
    say("   making it in memory ...");
    engine = synthetic_engine(o, stories_dir + "/tokenizer.model");
  } else {
    say("2) Speed on " + o.model.model_dir);
    engine = open_engine(o.model, EngineFlags{});
  }
  const auto& config = engine->model().config();
  say(fmt::format("   {} layers, hidden {}, {} weights, {} compute; ready in {:.1f} s",
                  config.num_hidden_layers, config.hidden_size,
                  dtype_name(engine->model().weight_dtype()), dtype_name(engine->model().dtype()),
                  seconds_since(start)));
  const int64_t budget = std::min<int64_t>(o.speed_tokens, config.max_position_embeddings - 200);
  const auto compile_start = std::chrono::steady_clock::now();
  const auto& layout = engine->add_schema_string(document_schema(4, budget, engine->tokenizer()),
                                                 "<demo documents>", "", progress_bar());
  const double compile_s = seconds_since(compile_start);
  say(fmt::format("   schema: {} documents, {} positions; compiled in {:.1f} s (one full prefill)",
                  module_count(layout), layout.total_length, compile_s));
  const std::string prompt =
      "<prompt schema=\"demo\"><doc0/><doc1/><doc2/><doc3/><user>What did Lily see in the "
      "park?</user></prompt>";
  SamplingParams params;
  params.max_new_tokens = 8;
  say(
      fmt::format("   prompt: the {} documents and a question; answering without the cache (a "
                  "full prefill, about {:.{}f} s each, {} run{}) ...",
                  module_count(layout), compile_s, compile_s < 10 ? 1 : 0, o.repeats,
                  o.repeats == 1 ? "" : "s"));
  const Timed plain = best_of(*engine, prompt, params, false, o.repeats);
  const Timed cached = best_of(*engine, prompt, params, true, o.repeats);
  const auto& c = cached.response;
  say(fmt::format("   {} cached + {} fresh tokens", c.cached_tokens, c.fresh_tokens));
  say(fmt::format("   TTFT without the cache: {:9.1f} ms", plain.best_ttft_ms));
  say(fmt::format("   TTFT with the cache:    {:9.1f} ms  (assembly {:.2f} ms)",
                  cached.best_ttft_ms, c.timings.assembly_ms));
  say(fmt::format("   speedup {:.0f}x (best of {} each); {}",
                  plain.best_ttft_ms / cached.best_ttft_ms, o.repeats,
                  compare_answers(*engine, c, plain.response)));
  say(fmt::format("   part 2 took {:.1f} s", seconds_since(start)));
}
}  // namespace

Command register_demo(CLI::App& root) {
  auto o = std::make_shared<Options>();
  auto* app = root.add_subcommand(
      "demo",
      "1) A story on the real stories260K model (models/stories260K): schemas/story.xml compiled\n"
      "once, its prompt answered with and without the cache, both answers and TTFTs shown.\n"
      "2) Speed: TTFT with and without the cache on a synthetic bench-small model (bf16) with a\n"
      "long document schema. --model DIR runs both parts on that folder instead.\n"
      "Example: promptcache demo --speed-tokens 2048");
  add_model_options(*app, o->model);
  app->add_option("--shape", o->shape, "synthetic model of the speed part when no --model is given")
      ->capture_default_str()
      ->check(CLI::IsMember(synthetic_shapes()));
  app->add_option("-n,--max-new-tokens", o->tokens, "story tokens to generate (at most)")
      ->capture_default_str()
      ->check(whole_number(1, std::numeric_limits<int>::max()));
  app->add_option("--speed-tokens", o->speed_tokens,
                  "document tokens of the speed part's schema (0: skip that part)")
      ->capture_default_str()
      ->check(whole_number(0, std::numeric_limits<int>::max()));
  app->add_option("--repeats", o->repeats, "runs per mode; the best TTFT is shown")
      ->capture_default_str()
      ->check(whole_number(1, std::numeric_limits<int>::max()));
  return {app, [o]() {
            const bool default_model = o->model.model_dir.empty();
            ModelOptions story = o->model;
            if (default_model) story.model_dir = find_stories260k();
            story_part(*o, story, default_model);
            if (o->speed_tokens > 0) speed_part(*o, story.model_dir);
            return 0;
          }};
}

}  // namespace promptcache::cli
