// bench_eval — a dataset evaluation (promptcache eval's work) with the few-shot prefix cached vs
// without the cache, in the same run.
//
// A schema of one few-shot prefix of `--prefix` tokens (modules of 128 tokens of the corpus) on
// a synthetic model; `--rows` rows of `--row-tokens` fresh tokens each (every row its own text).
// Two tasks, each run with the cache and with use_cache = false, rows in batches of `--batch`:
// - choices: every row scores `--choices` continuations of 1 to `--choice-tokens` tokens
//   (Engine::score_batch: the row's context once, its continuations packed in one forward);
// - generate: every row generates `--new` tokens greedily (Engine::generate_batch).
// One JSON line per task: rows/s cached and uncached, their ratio, and how far the two ways'
// results are apart (max log-probability difference; rows whose generations are identical):
// the prefix is a prefix, so they should agree within float rounding.
//
//   build/benchmarks/bench_eval [--prefix 1000] [--rows 200] [--row-tokens 64] [--choices 4]
//                               [--choice-tokens 4] [--new 16] [--batch 8] [--tasks
//                               choices,generate]
//                               [--threads N] [--shape bench-small] [--device cpu|cuda]
//                               [--dtype f32|f16|bf16]
#include <algorithm>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>

#include "bench_common.hpp"
#include "bench_engine.hpp"
#include "promptcache/engine.hpp"
#include "promptcache/model/threads.hpp"

using namespace promptcache;

int main(int argc, char** argv) {
  const bench::Flags flags(argc, argv, "bench_eval",
                           {"prefix", "rows", "row-tokens", "choices", "choice-tokens", "new",
                            "batch", "tasks", "threads", "shape", "device", "dtype"});
  const int prefix = flags.integer("prefix", 1000), rows = flags.integer("rows", 200);
  const int row_tokens = flags.integer("row-tokens", 64), choices = flags.integer("choices", 4);
  const int choice_tokens = flags.integer("choice-tokens", 4),
            new_tokens = flags.integer("new", 16);
  const int batch = flags.integer("batch", 8);
  const auto tasks = flags.words("tasks", "choices,generate");
  const std::string shape = flags.text("shape", "bench-small");
  const std::string device = flags.text("device", "cpu"), dtype = flags.text("dtype", "f32");
  if (prefix < 2 || rows < 1 || row_tokens < 1 || choices < 1 || choice_tokens < 1 ||
      new_tokens < 1 || batch < 1) {
    std::cerr << "bench_eval: every size must be positive (--prefix at least 2)\n";
    return 2;
  }
  const auto applied = configure_threads(flags.integer("threads", 0));
  const auto engine_owner = bench::synthetic_engine("bench_eval", shape, device, dtype);
  Engine& engine = *engine_owner;
  const auto words = bench::corpus_words();
  const auto [schema, refs] =
      bench::document_schema(engine.tokenizer(), words, "fewshot", prefix, 0);
  std::cerr << "bench_eval: compiling a few-shot prefix of " << prefix << " tokens...\n";
  engine.add_schema_string(schema);

  // Row i: the prefix, then its own text; its choices are corpus words further on.
  std::vector<pml::Prompt> prompts;
  std::vector<std::vector<std::vector<TokenId>>> continuations;
  for (int i = 0; i < rows; ++i) {
    std::size_t from = 5000 + 97 * static_cast<std::size_t>(i);
    prompts.push_back(pml::parse_prompt_string(
        "<prompt schema=\"fewshot\">" + refs +
        bench::text_of_tokens(engine.tokenizer(), words, from, row_tokens) + "</prompt>"));
    std::vector<std::vector<TokenId>> row;
    for (int k = 0; k < choices; ++k) {
      const int n = 1 + (i + k) % choice_tokens;
      std::size_t cfrom = 20000 + 31 * static_cast<std::size_t>(i * choices + k);
      row.push_back(
          engine.encode_continuation(bench::text_of_tokens(engine.tokenizer(), words, cfrom, n)));
    }
    continuations.push_back(std::move(row));
  }
  SamplingParams params;
  params.max_new_tokens = new_tokens;
  params.stop_at_eos = false;  // every row generates exactly --new tokens

  for (const auto& task : tasks) {
    if (task != "choices" && task != "generate") {
      std::cerr << "bench_eval: unknown task '" << task << "' (choices, generate)\n";
      return 2;
    }
    std::vector<ScoreResponse> scores[2];
    std::vector<Response> texts[2];
    double ms[2] = {0, 0};
    int64_t cached_tokens = 0, prompt_tokens = 0;
    for (int cached = 1; cached >= 0; --cached) {
      const RequestOptions request{cached == 1};
      std::cerr << "bench_eval: " << task << ", " << (cached ? "cached" : "no cache") << "...\n";
      const double start = now_ms();
      for (int b = 0; b < rows; b += batch) {
        const int n = std::min(batch, rows - b);
        const std::vector<pml::Prompt> part(prompts.begin() + b, prompts.begin() + b + n);
        if (task == "choices") {
          const std::vector<std::vector<std::vector<TokenId>>> conts(continuations.begin() + b,
                                                                     continuations.begin() + b + n);
          for (auto& s : engine.score_batch(part, conts, request)) {
            if (cached) cached_tokens += s.cached_tokens, prompt_tokens += s.prompt_tokens;
            scores[cached].push_back(std::move(s));
          }
        } else {
          for (auto& r : engine.generate_batch(part, params, {}, request)) {
            if (cached) cached_tokens += r.cached_tokens;
            if (cached) prompt_tokens += r.cached_tokens + r.fresh_tokens;
            texts[cached].push_back(std::move(r));
          }
        }
      }
      ms[cached] = now_ms() - start;
    }
    double max_diff = 0;
    int same_pred = 0, identical = 0;
    for (int i = 0; i < rows; ++i) {
      if (task == "choices") {
        std::size_t pred[2] = {0, 0};
        for (int c = 0; c < 2; ++c) {
          const auto& s = scores[c][i].continuations;
          for (std::size_t k = 0; k < s.size(); ++k) {
            if (s[k].logprob > s[pred[c]].logprob) pred[c] = k;
          }
        }
        same_pred += pred[0] == pred[1];
        for (std::size_t k = 0; k < scores[1][i].continuations.size(); ++k) {
          const auto& a = scores[1][i].continuations[k].logprob_per_token;
          const auto& b = scores[0][i].continuations[k].logprob_per_token;
          for (std::size_t t = 0; t < a.size(); ++t) {
            max_diff = std::max(max_diff, std::abs(a[t] - b[t]));
          }
        }
      } else {
        identical += texts[1][i].tokens == texts[0][i].tokens;
      }
    }
    nlohmann::json j = {{"bench", "eval"},
                        {"task", task},
                        {"shape", shape},
                        {"rows", rows},
                        {"batch", batch},
                        {"prefix_tokens", prefix},
                        {"row_tokens", row_tokens},
                        {"prompt_tokens_per_row", prompt_tokens / rows},
                        {"cached_tokens_per_row", cached_tokens / rows},
                        {"cached_s", ms[1] / 1e3},
                        {"no_cache_s", ms[0] / 1e3},
                        {"cached_rows_per_s", rows * 1e3 / ms[1]},
                        {"no_cache_rows_per_s", rows * 1e3 / ms[0]},
                        {"speedup", ms[0] / ms[1]}};
    if (task == "choices") {
      j["choices"] = choices;
      j["choice_tokens_max"] = choice_tokens;
      j["max_logprob_diff"] = max_diff;
      j["same_pred_rows"] = same_pred;
    } else {
      j["new_tokens"] = new_tokens;
      j["identical_rows"] = identical;
    }
    j.update(bench::run_facts(engine, device, dtype, applied));
    std::cout << j.dump() << std::endl;
  }
  return 0;
}
