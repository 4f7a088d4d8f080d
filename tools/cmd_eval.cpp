// promptcache eval: a model over a JSONL dataset, the schema's shared modules (instruction,
// few-shot examples) cached: each row scores its choices or generates (docs/eval.md). The rows,
// their parsing, batches, results file and resume rules are promptcache/eval.hpp's (shared with
// Python's Engine.eval); here are the flags, the progress bar and --check.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>

#include "engine_setup.hpp"
#include "promptcache/error.hpp"
#include "promptcache/eval.hpp"
#include "promptcache/fidelity.hpp"
#include "recompute_flags.hpp"

namespace promptcache::cli {
namespace {

using eval::Outcome;
using eval::Row;
using nlohmann::json;

// A progress bar on a terminal, a plain line every 10 s otherwise.
class Progress {
 public:
  explicit Progress(std::size_t total)
      : total_(total), tty_(::isatty(2)), start_(now_ms()), last_print_(start_) {}
  void update(std::size_t done, bool last = false) {
    const double now = now_ms();
    if (!last && !tty_ && now - last_print_ < 10000) return;
    if (!last && tty_ && now - last_print_ < 200) return;
    last_print_ = now;
    const double s = (now - start_) / 1e3;
    const double rate = s > 0 ? static_cast<double>(done) / s : 0;
    const std::size_t left = total_ > done ? total_ - done : 0;
    const std::string eta =
        rate > 0 ? fmt::format("{:.0f}s", static_cast<double>(left) / rate) : std::string("?");
    if (tty_) {
      const int width = 24;
      const int filled = total_ ? static_cast<int>(width * std::min(done, total_) / total_) : width;
      std::cerr << fmt::format("\reval [{}{}] {}/{} rows  {:.1f} rows/s  ETA {}   ",
                               std::string(filled, '#'), std::string(width - filled, '.'), done,
                               total_, rate, eta)
                << (last ? "\n" : "") << std::flush;
    } else {
      std::cerr << fmt::format("eval: {}/{} rows, {:.1f} rows/s, ETA {}\n", done, total_, rate,
                               eta);
    }
  }

 private:
  std::size_t total_;
  bool tty_;
  double start_;
  double last_print_;
};

// --check: a sampled row and what it gave with the cache.
struct Checked {
  Row row;
  Outcome cached;
};

// Generated rows are also measured as `promptcache fidelity` does (greedy, the row's max_tokens,
// the run's recompute): first-token agreement and KL against no cache, exact agreement and the
// mean tokens agreed before the first divergence.
json run_check(Engine& engine, const std::vector<Checked>& sample,
               const RecomputeOptions& recompute) {
  std::size_t scored = 0, same_pred = 0, generated = 0, identical = 0;
  double max_diff = 0;
  std::vector<PromptFidelity> fidelity;
  const RequestOptions plain{false};
  for (const auto& c : sample) {
    if (c.row.scored()) {
      const auto s = engine.score(c.row.prompt, c.row.choices, plain);
      const Outcome o = eval::scored_outcome(c.row, s);
      ++scored;
      same_pred += o.pred == c.cached.pred;
      for (std::size_t k = 0; k < o.logprobs.size(); ++k) {
        for (std::size_t t = 0; t < o.logprobs[k].size(); ++t) {
          max_diff = std::max(max_diff, std::abs(o.logprobs[k][t] - c.cached.logprobs[k][t]));
        }
      }
    } else {
      const auto r = engine.generate(c.row.prompt, c.row.params, {}, plain);
      ++generated;
      identical += r.text == c.cached.text;
      FidelityOptions options;
      options.tokens = std::max<int64_t>(1, c.row.params.max_new_tokens);
      options.recompute = recompute;
      fidelity.push_back(measure_fidelity(engine, c.row.prompt, options));
    }
  }
  const FidelitySummary f = summarize_fidelity(fidelity);
  std::cerr << fmt::format("eval: --check: {} rows again without the cache", sample.size());
  if (scored > 0) {
    std::cerr << fmt::format("; scored rows: {}/{} same prediction, max logprob difference {:.3g}",
                             same_pred, scored, max_diff);
  }
  if (generated > 0) {
    std::cerr << fmt::format(
        "; generations: {}/{} identical; greedy against no cache (r = {}): first token {:.3f}, "
        "exact {:.3f}, mean agreed tokens {:.1f}, first-token KL {:.3g}",
        identical, generated, recompute.fraction, f.first_token_agreement, f.exact_agreement,
        f.mean_agreed_tokens, f.mean_first_token_kl);
  }
  std::cerr << "\n";
  json j = {{"rows", sample.size()},
            {"scored", scored},
            {"same_pred", same_pred},
            {"generated", generated},
            {"identical_generations", identical}};
  j["max_logprob_diff"] = scored > 0 ? json(max_diff) : json();
  if (generated > 0) {
    j["recompute"] = recompute.fraction;
    j["first_token_agreement"] = f.first_token_agreement;
    j["exact_agreement"] = f.exact_agreement;
    j["mean_agreed_tokens"] = f.mean_agreed_tokens;
    j["mean_first_token_kl"] = f.mean_first_token_kl;
  }
  return j;
}

}  // namespace

Command register_eval(CLI::App& root) {
  struct Options {
    bool allow_src_outside = false;
    ModelOptions model;
    SamplingOptions sampling;
    EngineFlags engine;
    std::string schema, data, out, cache_file;
    bool no_cache = false, json = false, strict = false;
    std::size_t batch = 8, limit = 0, check = 0;
    RecomputeFlags recompute;
  };
  auto o = std::make_shared<Options>();
  o->sampling.params.max_new_tokens = 32;
  auto* app = root.add_subcommand(
      "eval",
      "Evaluate a model on a JSONL dataset, the schema's shared modules (instruction, few-shot "
      "examples) cached.\n"
      "Each line: {\"id\", \"prompt\", \"modules\", \"messages\", \"choices\", \"answer\", "
      "\"max_tokens\", \"stop\"} (docs/eval.md).\n"
      "Example: promptcache eval --model DIR --schema examples/eval/quiz.xml --data "
      "examples/eval/quiz.jsonl --out results.jsonl\n"
      "         --out is appended and a rerun skips the ids already in it");
  add_model_options(*app, o->model, true);
  add_sampling_options(*app, o->sampling);
  add_engine_flags(*app, o->engine);
  app->add_option("--schema,-s", o->schema, "schema XML file with the shared modules")
      ->required()
      ->check(CLI::ExistingFile);
  add_src_flag(*app, o->allow_src_outside);
  app->add_option("--data,-d", o->data, "JSONL file, one row per line")
      ->required()
      ->check(CLI::ExistingFile);
  app->add_option("--out,-o", o->out,
                  "JSONL results, appended a line per row; the ids already there are skipped")
      ->required();
  app->add_option("--cache", o->cache_file,
                  "states file: loaded when it matches, else compiled and saved there");
  app->add_flag("--no-cache", o->no_cache,
                "run every row's whole prompt as one ordinary prefill (the baseline)");
  app->add_option("--batch", o->batch, "rows run together")
      ->capture_default_str()
      ->check(whole_number(1, 4096));
  app->add_option("--limit", o->limit, "only the first N rows of --data (0: all)")
      ->check(whole_number(0, std::numeric_limits<std::size_t>::max()));
  app->add_option("--check", o->check,
                  "run N sampled rows again without the cache and report the agreement")
      ->check(whole_number(0, std::numeric_limits<std::size_t>::max()));
  app->add_flag("--strict", o->strict,
                "stop at the first bad line (exit 1) instead of skipping it");
  app->add_flag("--json", o->json, "print the summary as one JSON line on stdout");
  add_recompute_flags(*app, o->recompute);
  return {
      app, [o]() {
        if (o->check > 0 && o->no_cache) {
          throw UsageError(
              "--check compares rows with the cache against rows without it; "
              "drop --no-cache");
        }
        auto engine = open_engine(o->model, o->engine);
        const auto schema = read_schema_file(o->schema, o->allow_src_outside);
        print_warnings(schema.warnings);
        engine->add_schema(schema, progress_bar(),
                           states_file(*engine, schema, o->cache_file, o->engine));

        eval::EvalOptions options;
        options.defaults.params = o->sampling.params;
        options.defaults.stop = o->sampling.stop;
        options.use_cache = !o->no_cache;
        const RecomputeOptions recompute = recompute_options(o->recompute, schema.recompute);
        options.recompute = given_recompute(o->recompute);
        options.recompute_criterion = recompute.criterion;
        options.recompute_select_layer = recompute.select_layer;
        options.recompute_first_k = recompute.first_k;
        options.batch = o->batch;
        options.strict = o->strict;
        options.warn = [](const std::string& w) {
          std::cerr << "promptcache: warning: " << w << "\n";
        };
        eval::Evaluation run(*engine, schema.name, o->data, o->out, options);
        std::ifstream in(o->data, std::ios::binary);
        if (!in) throw Error(ErrorKind::kIo, "cannot read " + o->data);
        Progress progress(eval::count_rows(o->data, o->limit));
        std::vector<Checked> sample;  // --check: a reservoir of rows
        std::mt19937_64 rng(1234);
        std::size_t eligible = 0;
        const double start = now_ms();
        auto drain = [&] {
          for (auto& e : run.take_events()) {
            if (!e.outcome) {
              std::cerr << "promptcache: error: " << e.error << "\n";
              continue;
            }
            if (o->check == 0) continue;
            ++eligible;  // reservoir sampling: every row equally likely
            if (sample.size() < o->check) {
              sample.push_back({std::move(*e.row), std::move(*e.outcome)});
            } else {
              const auto slot = std::uniform_int_distribution<std::size_t>(0, eligible - 1)(rng);
              if (slot < o->check) sample[slot] = {std::move(*e.row), std::move(*e.outcome)};
            }
          }
        };
        eval::LineReader reader(in);
        while (run.read_some(reader, o->limit)) {
          drain();
          progress.update(run.rows_read());
        }
        drain();
        progress.update(run.rows_read(), true);
        const double wall_s = (now_ms() - start) / 1e3;

        nlohmann::ordered_json summary = run.summary(wall_s);
        const eval::Totals& t = run.totals();
        std::cerr << fmt::format(
            "eval: {} rows in {:.2f} s ({:.2f} rows/s, {:.0f} tokens/s); {} resumed from {}, "
            "{} failed\n",
            t.rows, wall_s, summary["rows_per_s"].get<double>(),
            summary["tokens_per_s"].get<double>(), t.resumed, o->out, t.failed);
        std::cerr << fmt::format(
            "eval: prompt tokens {} ({} cached, {} fresh){}\n", t.prompt_tokens, t.cached_tokens,
            t.prompt_tokens - t.cached_tokens, run.use_cache() ? "" : " --no-cache");
        if (t.answered > 0) {
          std::cerr << fmt::format("eval: accuracy {:.4f} ({}/{} rows with an answer)\n",
                                   summary["accuracy"].get<double>(), t.correct, t.answered);
        }
        if (!sample.empty() && !run.stopped())
          summary["check"] = run_check(*engine, sample, recompute);
        if (o->json) std::cout << summary.dump() << "\n";
        return run.stopped() ? 1 : 0;
      }};
}

}  // namespace promptcache::cli
