// bench_fidelity — how far cached answers drift from no-cache ones, and what recompute buys back.
//
// Two parts, one JSON line per setting:
//  * fidelity (stories260K, models/stories260K or --model DIR): four schemas of 4-8
//    story paragraphs (the same pool of paragraphs in different subsets and orders), and
//    --prompts prompts (default 200, seed --seed) that each select a random subset of one schema
//    that is not a prefix of it (so at least one module follows a gap or other modules than it
//    was compiled after), then a continuation cue. For every r of --recompute and criterion of
//    --criteria: first-token agreement and KL against the no-cache run, 24- and --tokens-token
//    (default 32) greedy exact agreement, mean tokens before the first divergence, the
//    log-likelihood per token of the no-cache greedy continuation under the cached run, TTFT;
//    and how close the calls were: the no-cache margin (top-1 minus top-2 log-probability) where
//    the continuations diverge, and the share of prompts whose first token wins by < 0.1 nats.
//    --select-layer L: the deviation criterion's layer (RecomputeOptions::select_layer);
//    --first-k K: the firstk criteria's tokens per module (RecomputeOptions::first_k, default 8).
//    --precision f32,default (the default: both, one line each, side by side): "f32" is the
//    model as stored (stories260K is an f32 file: f32 weights and states), "default" the same
//    model stored in bf16 (converted by the bench into a temporary folder, as HF ships current
//    models) and loaded with no dtype set: bf16 weights mapped as stored, bf16 module states,
//    f32 compute (choose_dtypes). Each line names its precision, weights and KV dtype.
//  * floor (same model and prompts): the no-cache answers of an f32 engine against those of
//    engines with a bf16/f16 KV cache, bf16/q8 weights, or the bf16 checkpoint at the defaults
//    (bf16 weights and states): how much accepted arithmetic changes flip the same near-ties
//    (not run by default).
//  * speed (a synthetic --shape model, default bench-small): a --schema-token (default 2048)
//    document schema of 128-token modules, a prompt selecting all but its second module (--layout
//    gap, the default), all but its middle one (--layout late-gap: the first half is an exact
//    run, which recompute leaves alone) or all of them (--layout prefix: exact without
//    recompute, so a share r finds nothing to recompute), then --fresh (default 16) fresh tokens.
//    Cached TTFT at every r and criterion against the no-cache TTFT, all measured in this run, best
//    of --repeats (default 3), repeats interleaved; then --repeats more runs of each through
//    recompute_prefill for its phases (RecomputeReport, each phase's fastest).
//
//   build/benchmarks/bench_fidelity [--part fidelity,speed,floor] [--recompute
//   0,0.05,0.1,0.2,0.3,0.5,1]
//       [--criteria deviation,boundary] [--prompts 200] [--seed 7] [--tokens 32] [--model DIR]
//       [--select-layer 1] [--first-k 8] [--precision f32,default]
//       [--shape bench-small] [--schema 2048] [--fresh 16] [--layout gap] [--repeats 3]
//       [--threads N]
#include <torch/types.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "bench_common.hpp"
#include "bench_engine.hpp"
#include "promptcache/fidelity.hpp"
#include "promptcache/model/safetensors.hpp"
#include "promptcache/model/threads.hpp"
#include "promptcache/recompute.hpp"
#include "story_prompts.hpp"

using namespace promptcache;

namespace {

using bench::kSchemas;
using bench::make_prompts;
using bench::schema_xml;

std::vector<double> parse_doubles(const std::string& text) {
  std::vector<double> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stod(item));
  return out;
}

// The --model folder (default: the repository's models/stories260K, from the repository root,
// where the bench runs), or empty after saying that `part` is skipped.
std::string story_model_dir(const bench::Flags& flags, const std::string& part) {
  const std::string dir = flags.text("model", "models/stories260K");
  if (std::filesystem::exists(std::filesystem::path(dir) / "config.json")) return dir;
  std::cerr << "bench_fidelity: SKIPPED the " << part << " part: " << dir
            << " is absent (give --model DIR)\n";
  return {};
}

// What the JSON lines call the model: the --model folder's name (stories260K by default).
std::string model_name(const std::string& dir) {
  const auto path = std::filesystem::path(dir);
  const std::string name = path.filename().string();
  return name.empty() ? path.parent_path().filename().string() : name;
}

// A copy of the model folder `dir` with its tensors stored in bf16 (made once per run), or `dir`
// itself when its matrices are stored in bf16 already.
std::string bf16_folder(const std::string& dir) {
  namespace fs = std::filesystem;
  static std::map<std::string, std::string> made;
  auto& out = made[dir];
  if (!out.empty()) return out;
  const auto checkpoint = SafetensorsCheckpoint::open_folder(dir);
  std::map<std::string, torch::Tensor> w;
  for (const auto& name : checkpoint.names()) w[name] = checkpoint.tensor(name);
  if (checkpoint_dtype(w).first == torch::kBFloat16) return out = dir;
  const fs::path to =
      fs::temp_directory_path() / ("bench_fidelity-bf16-" + std::to_string(::getpid()));
  fs::create_directories(to);
  for (auto& entry : w) entry.second = entry.second.to(torch::kBFloat16);
  write_safetensors((to / "model.safetensors").string(), w, {{"format", "pt"}});
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors" && entry.is_regular_file()) {
      fs::copy_file(entry.path(), to / entry.path().filename(),
                    fs::copy_options::overwrite_existing);
    }
  }
  // Removed when the bench ends.
  static const struct Cleanup {
    fs::path path;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } cleanup{to};
  return out = to.string();
}

// An engine on the story model with the four story schemas.
std::unique_ptr<Engine> story_engine(const std::string& dir, const LoadOptions& load = {}) {
  EngineOptions options;
  options.chat_template = "plain";
  options.load = load;
  auto engine = Engine::open(dir, options);
  for (const auto& [name, paragraphs] : kSchemas) {
    engine->add_schema_string(schema_xml(name, paragraphs));
  }
  return engine;
}

void fidelity_part(const bench::Flags& flags, const std::vector<double>& fractions,
                   const std::vector<std::string>& criteria) {
  const std::string dir = story_model_dir(flags, "fidelity");
  if (dir.empty()) return;
  const int count = flags.integer("prompts", 200);
  const auto seed = static_cast<unsigned>(flags.integer("seed", 7));
  const int tokens = flags.integer("tokens", 32);
  std::vector<pml::Prompt> prompts;
  for (const auto& xml : make_prompts(count, seed))
    prompts.push_back(pml::parse_prompt_string(xml));
  // Side by side: each setting at f32 and at the defaults of a bf16 checkpoint.
  std::vector<std::pair<std::string, std::unique_ptr<Engine>>> engines;
  for (const auto& precision : flags.words("precision", "f32,default")) {
    if (precision == "f32") {
      LoadOptions f32;
      f32.dtype = f32.weights = f32.kv_dtype = torch::kFloat32;
      engines.emplace_back(precision, story_engine(dir, f32));
    } else if (precision == "default") {
      engines.emplace_back(precision, story_engine(bf16_folder(dir)));
    } else {
      std::cerr << "bench_fidelity: unknown --precision " << precision << " (f32, default)\n";
      std::exit(2);
    }
  }
  for (const auto& criterion : criteria) {
    for (double r : fractions) {
      if (r == 0 && criterion != criteria.front()) continue;  // r = 0 runs no criterion
      for (const auto& [precision, engine] : engines) {
        FidelityOptions fo;
        fo.tokens = tokens;
        fo.recompute = {r, parse_recompute_criterion(criterion), flags.integer("select-layer", 1),
                        flags.integer("first-k", 8)};
        std::vector<PromptFidelity> results;
        int exact24 = 0, close_calls = 0;
        for (const auto& p : prompts) {
          results.push_back(measure_fidelity(*engine, p, fo));
          const auto& f = results.back();
          exact24 += f.exact || f.agreed_tokens >= 24 ? 1 : 0;
          close_calls += f.first_token_margin < 0.1 ? 1 : 0;
        }
        const auto s = summarize_fidelity(results);
        nlohmann::json j = {{"bench", "fidelity"},
                            {"model", model_name(dir)},
                            {"prompts", s.prompts},
                            {"seed", seed},
                            {"recompute", r},
                            {"criterion", r == 0 ? "none" : criterion},
                            {"select_layer", flags.integer("select-layer", 1)},
                            {"first_k", flags.integer("first-k", 8)},
                            {"recomputed_share", s.recomputed_share},
                            {"first_token_agreement", s.first_token_agreement},
                            {"mean_first_token_kl", s.mean_first_token_kl},
                            {"exact_24", static_cast<double>(exact24) / s.prompts},
                            {"tokens", tokens},
                            {"exact_" + std::to_string(tokens), s.exact_agreement},
                            {"mean_agreed_tokens", s.mean_agreed_tokens},
                            {"logprob_per_token", s.mean_logprob_per_token},
                            {"baseline_logprob_per_token", s.mean_baseline_logprob_per_token},
                            {"median_divergence_margin", s.median_divergence_margin},
                            {"near_tie_divergences", s.near_tie_divergences},
                            // prompts whose no-cache first token wins by < 0.1 nats
                            {"close_first_tokens", static_cast<double>(close_calls) / s.prompts},
                            {"cached_ttft_ms", s.cached_ttft_ms},
                            {"baseline_ttft_ms", s.baseline_ttft_ms},
                            {"precision", precision},
                            {"weights", dtype_name(engine->model().weight_dtype())},
                            {"kv_dtype", dtype_name(engine->model().kv_dtype())}};
        std::cout << j.dump() << std::endl;
      }
    }
  }
}

// The noise floor: how often a change of arithmetic that users accept as harmless (a bf16/f16
// KV cache, bf16 or 8-bit weights) flips the same no-cache answers. Per perturbation, the
// no-cache runs of the fidelity part's prompts on an f32 engine and on a perturbed one:
// first-token KL and agreement, exact 24- and --tokens-token greedy agreement. Drift that
// small flips the near-ties too, which bounds what any cache fidelity can be held to.
void floor_part(const bench::Flags& flags) {
  const std::string dir = story_model_dir(flags, "floor");
  if (dir.empty()) return;
  LoadOptions f32;
  f32.dtype = f32.weights = f32.kv_dtype = torch::kFloat32;
  const auto reference = story_engine(dir, f32);
  const int count = flags.integer("prompts", 200);
  const auto seed = static_cast<unsigned>(flags.integer("seed", 7));
  const int tokens = flags.integer("tokens", 32);
  SamplingParams greedy;
  greedy.max_new_tokens = tokens;
  RequestOptions no_cache;
  no_cache.use_cache = false;
  struct Perturbation {
    std::string name;
    LoadOptions load;
  };
  std::vector<Perturbation> perturbations(5);
  perturbations[0] = {"kv bf16", {}};
  perturbations[0].load.kv_dtype = torch::kBFloat16;
  perturbations[1] = {"kv f16", {}};
  perturbations[1].load.kv_dtype = torch::kFloat16;
  perturbations[2] = {"weights bf16", {}};
  perturbations[2].load.weights = torch::kBFloat16;
  perturbations[2].load.kv_dtype = torch::kFloat32;  // the weights alone
  perturbations[3] = {"weights q8", {}};
  perturbations[3].load.weights = torch::kInt8;
  // The model stored in bf16, loaded with nothing set: bf16 weights and bf16 states.
  perturbations[4] = {"bf16 checkpoint, defaults", {}};
  const auto xmls = make_prompts(count, seed);
  for (const auto& perturbation : perturbations) {
    const auto other = perturbation.name == "bf16 checkpoint, defaults"
                           ? story_engine(bf16_folder(dir))
                           : story_engine(dir, perturbation.load);
    int first = 0, exact = 0, exact24 = 0;
    double kl = 0, agreed = 0;
    for (const auto& xml : xmls) {
      const auto prompt = pml::parse_prompt_string(xml);
      const auto first_logits = [&](const Engine& engine) {
        KVCache cache = engine.model().make_cache(0);
        return engine.prefill(engine.resolve(prompt), cache, false).logits;
      };
      const auto a = first_logits(*reference), b = first_logits(*other);
      kl += logits_kl(a, b);
      first += a.argmax().item<int64_t>() == b.argmax().item<int64_t>() ? 1 : 0;
      const auto x = reference->generate(prompt, greedy, {}, no_cache).tokens;
      const auto y = other->generate(prompt, greedy, {}, no_cache).tokens;
      std::size_t same = 0;
      while (same < std::min(x.size(), y.size()) && x[same] == y[same]) ++same;
      agreed += static_cast<double>(same);
      exact += x == y ? 1 : 0;
      exact24 += x == y || same >= 24 ? 1 : 0;
    }
    const double n = static_cast<double>(xmls.size());
    nlohmann::json j = {{"bench", "fidelity_floor"},
                        {"model", model_name(dir)},
                        {"prompts", xmls.size()},
                        {"seed", seed},
                        {"perturbation", perturbation.name},
                        {"first_token_agreement", first / n},
                        {"mean_first_token_kl", kl / n},
                        {"exact_24", exact24 / n},
                        {"tokens", tokens},
                        {"exact_" + std::to_string(tokens), exact / n},
                        {"mean_agreed_tokens", agreed / n}};
    std::cout << j.dump() << std::endl;
  }
}

void speed_part(const bench::Flags& flags, const std::vector<double>& fractions,
                const std::vector<std::string>& criteria, const ThreadSettings& threads) {
  const std::string shape = flags.text("shape", "bench-small");
  const auto owner = bench::synthetic_engine("bench_fidelity", shape, "cpu", "");
  Engine& engine = *owner;
  const auto words = bench::corpus_words();
  const int schema_tokens = flags.integer("schema", 2048), fresh = flags.integer("fresh", 16);
  const int repeats = flags.integer("repeats", 3);
  const int select_layer = flags.integer("select-layer", 1);
  const int first_k = flags.integer("first-k", 8);
  const std::string layout = flags.text("layout", "gap");
  if (layout != "gap" && layout != "late-gap" && layout != "prefix") {
    std::cerr << "bench_fidelity: unknown --layout " << layout << " (gap, late-gap, prefix)\n";
    std::exit(2);
  }
  const int module_count = (schema_tokens - 1 + 127) / 128;
  const int left_out = layout == "prefix" ? -1 : layout == "gap" ? 1 : module_count / 2;
  std::ostringstream xml, refs;
  xml << "<schema name=\"docs\">";
  std::size_t from = 0;
  int remaining = schema_tokens - 1, modules = 0;
  while (remaining > 0) {
    const int n = std::min(128, remaining);
    xml << "<module name=\"d" << modules << "\">"
        << bench::text_of_tokens(engine.tokenizer(), words, from, n) << "</module>";
    if (modules != left_out) refs << "<d" << modules << "/>";
    remaining -= n;
    ++modules;
  }
  xml << "</schema>";
  engine.add_schema_string(xml.str());
  std::size_t qfrom = 7;
  const std::string prompt = "<prompt schema=\"docs\">" + refs.str() +
                             bench::text_of_tokens(engine.tokenizer(), words, qfrom, fresh) +
                             "</prompt>";
  SamplingParams one;
  one.max_new_tokens = 1;
  struct Setting {
    double r;
    std::string criterion;
    std::vector<double> ttft;
    Response last;
    RecomputeReport phases;
  };
  std::vector<Setting> settings;
  settings.push_back({-1, "no cache", {}, {}, {}});
  for (const auto& criterion : criteria) {
    for (double r : fractions) {
      if (r == 0 && criterion != criteria.front()) continue;
      settings.push_back({r, r == 0 ? "none" : criterion, {}, {}, {}});
    }
  }
  for (int rep = 0; rep < repeats; ++rep) {
    for (auto& s : settings) {
      RequestOptions request;
      request.use_cache = s.r >= 0;
      request.reuse_buffer = false;
      request.recompute = std::max(0.0, s.r);
      if (s.r > 0) request.recompute_criterion = parse_recompute_criterion(s.criterion);
      request.recompute_select_layer = select_layer;
      request.recompute_first_k = first_k;
      s.last = engine.generate_xml(prompt, one, {}, request);
      s.ttft.push_back(s.last.timings.ttft_ms);
    }
  }
  // Where a recomputing request's time goes: --repeats more runs of each setting straight
  // through recompute_prefill (same assembly as a request's), phase by phase, each phase's
  // fastest kept (a shared machine's stalls land in one phase of one run).
  const auto resolved = engine.resolve(pml::parse_prompt_string(prompt));
  const auto exact = static_cast<int64_t>(
      exact_prefix_tokens(engine.layout("docs"), resolved, EncodingMode::kScaffold));
  for (int rep = 0; rep < repeats; ++rep) {
    for (auto& s : settings) {
      if (s.r <= 0) continue;
      KVCache cache = engine.model().make_cache(0);
      auto assembled = Assembler().assemble(resolved, engine.layout("docs"), engine.store(), cache,
                                            static_cast<int64_t>(resolved.baseline.size()),
                                            AssembleOptions{false, true});
      assembled.exact_tokens = exact;  // as a request's prefill sets it
      RecomputeReport phases;
      recompute_prefill(
          engine.model(), resolved, assembled, cache,
          RecomputeOptions{s.r, parse_recompute_criterion(s.criterion), select_layer, first_k},
          &phases);
      if (rep == 0) {
        s.phases = phases;
      } else {
        s.phases.move_ms = std::min(s.phases.move_ms, phases.move_ms);
        s.phases.select_ms = std::min(s.phases.select_ms, phases.select_ms);
        s.phases.forward_ms = std::min(s.phases.forward_ms, phases.forward_ms);
        s.phases.finish_ms = std::min(s.phases.finish_ms, phases.finish_ms);
      }
    }
  }
  const double uncached = bench::best_time(settings[0].ttft);
  double r0_cached = 0;  // plain Prompt Cache's TTFT (r = 0), when measured
  for (const auto& s : settings) {
    if (s.r == 0) r0_cached = bench::best_time(s.ttft);
  }
  for (const auto& s : settings) {
    if (s.r < 0) continue;
    const double cached = bench::best_time(s.ttft);
    nlohmann::json j = {
        {"bench", "fidelity_speed"},
        {"shape", shape},
        {"layout", layout},
        {"cached_tokens", s.last.cached_tokens},
        {"exact_tokens", exact},
        {"fresh_tokens", s.last.fresh_tokens},
        {"recompute", s.r},
        {"criterion", s.criterion},
        {"recomputed_tokens", s.last.recomputed_tokens},
        {"select_layer", select_layer},
        {"uncached_ttft_ms", uncached},
        {"cached_ttft_ms", cached},
        {"speedup", uncached / cached},
        {"cached_ttft_ms_median", bench::median_time(s.ttft)},
        {"uncached_ttft_ms_median", bench::median_time(settings[0].ttft)},
        {"repeats", repeats},
        {"phase_move_ms", s.phases.move_ms},
        {"phase_select_ms", s.phases.select_ms},
        {"phase_forward_ms", s.phases.forward_ms},
        {"phase_finish_ms", s.phases.finish_ms},
        {"first_k", first_k},
        // What the recompute forward costs per token against the no-cache
        // prefill's mean per token (1: the same; attention over the whole
        // assembled cache made it about 1.6)
        {"forward_cost_per_token_vs_prefill",
         s.r > 0 ? (s.phases.forward_ms / static_cast<double>(s.phases.recomputed_tokens + fresh)) /
                       (uncached / static_cast<double>(s.last.cached_tokens + s.last.fresh_tokens))
                 : 0.0},
        {"cached_ttft_vs_r0", cached / r0_cached}};
    j.update(bench::run_facts(engine, "cpu", "f32", threads));
    std::cout << j.dump() << std::endl;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Flags flags(
      argc, argv, "bench_fidelity",
      {"part", "recompute", "criteria", "prompts", "seed", "tokens", "model", "shape", "schema",
       "fresh", "repeats", "threads", "select-layer", "precision", "first-k", "layout"});
  const auto threads = configure_threads(flags.integer("threads", 0));
  const auto fractions = parse_doubles(flags.text("recompute", "0,0.05,0.1,0.2,0.3,0.5,1"));
  const auto criteria = flags.words("criteria", "deviation,boundary");
  for (const auto& part : flags.words("part", "fidelity,speed")) {
    if (part == "fidelity") {
      fidelity_part(flags, fractions, criteria);
    } else if (part == "speed") {
      speed_part(flags, fractions, criteria, threads);
    } else if (part == "floor") {
      floor_part(flags);
    } else {
      std::cerr << "bench_fidelity: unknown --part " << part << " (fidelity, speed, floor)\n";
      return 2;
    }
  }
  return 0;
}
