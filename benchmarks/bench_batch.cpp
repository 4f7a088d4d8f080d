// bench_batch — prompts with different module selections: one batch vs one after another.
//
// A document schema on a synthetic bench-small model; prompt i selects its own `--select`
// documents (a different set, at different positions, for every prompt) and asks a question of
// `--fresh` tokens. For each batch size, the same prompts run (a) one after another through
// Engine::generate and (b) together through Engine::generate_batch, `--new` tokens each, every
// prompt served from the cache both ways. Repeats of the two are interleaved, so drift on this
// shared machine hits both alike. One JSON line per batch size: wall times, generated tokens per
// second, time to the first token of every prompt (the batch's vs the last sequential prompt's)
// and whether both ways produced the same tokens. --uneven 1 gives the prompts answers of
// different lengths, as EOS would: prompt i of n stops (through the token callback) after
// ceil(--new x (i + 1) / n) tokens, both ways; the batch then also runs keeping its finished
// rows to the end (RequestOptions::drop_finished_rows = false), for what dropping them saves.
//
//   build/benchmarks/bench_batch [--batch 1,2,4,8] [--docs 8] [--doc-tokens 256] [--select 3]
//                                [--fresh 16] [--new 16] [--uneven 0|1] [--repeats 3] [--threads N]
//                                [--shape bench-small] [--device cpu|cuda] [--dtype f32|f16|bf16]
#include <algorithm>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "bench_common.hpp"
#include "bench_engine.hpp"
#include "promptcache/engine.hpp"
#include "promptcache/model/threads.hpp"

using namespace promptcache;

int main(int argc, char** argv) {
  const bench::Flags flags(argc, argv, "bench_batch",
                           {"batch", "docs", "doc-tokens", "select", "fresh", "new", "uneven",
                            "repeats", "threads", "shape", "device", "dtype"});
  const auto batch_sizes = flags.list("batch", {1, 2, 4, 8});
  const int docs = flags.integer("docs", 8), doc_tokens = flags.integer("doc-tokens", 256);
  const int select = flags.integer("select", 3), fresh = flags.integer("fresh", 16);
  const int new_tokens = flags.integer("new", 16), repeats = flags.integer("repeats", 3);
  const bool uneven = flags.integer("uneven", 0) != 0;
  const std::string shape = flags.text("shape", "bench-small");
  const std::string device = flags.text("device", "cpu"), dtype = flags.text("dtype", "");
  if (docs < 1 || select < 1 || select > docs || doc_tokens < 1 || fresh < 1 || new_tokens < 1 ||
      repeats < 1) {
    std::cerr << "bench_batch: need 1 <= --select <= --docs and positive --doc-tokens, --fresh, "
                 "--new and --repeats\n";
    return 2;
  }
  const auto applied = configure_threads(flags.integer("threads", 0));
  const auto engine_owner = bench::synthetic_engine("bench_batch", shape, device, dtype);
  Engine& engine = *engine_owner;
  const auto words = bench::corpus_words();
  std::size_t from = 0;
  std::ostringstream xml;
  xml << "<schema name=\"docs\">";
  for (int d = 0; d < docs; ++d) {
    xml << "<module name=\"d" << d << "\">"
        << bench::text_of_tokens(engine.tokenizer(), words, from, doc_tokens) << "</module>";
  }
  xml << "</schema>";
  std::cerr << "bench_batch: compiling " << docs << " documents of " << doc_tokens
            << " tokens...\n";
  engine.add_schema_string(xml.str());

  SamplingParams params;
  params.max_new_tokens = new_tokens;
  params.stop_at_eos = false;  // every prompt generates exactly --new tokens
  for (int batch : batch_sizes) {
    if (batch < 1) continue;
    // Prompt i selects documents i, i+1, ... (mod --docs) and asks its own question.
    std::vector<pml::Prompt> prompts;
    int64_t cached_tokens = 0;
    for (int i = 0; i < batch; ++i) {
      std::vector<int> chosen;
      for (int k = 0; k < select; ++k) chosen.push_back((i + k) % docs);
      std::sort(chosen.begin(), chosen.end());
      std::string p = "<prompt schema=\"docs\">";
      for (int d : chosen) p += "<d" + std::to_string(d) + "/>";
      std::size_t qfrom = 7 + 13 * static_cast<std::size_t>(i);
      p += bench::text_of_tokens(engine.tokenizer(), words, qfrom, fresh) + "</prompt>";
      prompts.push_back(pml::parse_prompt_string(p));
    }
    std::vector<int> wanted(batch, new_tokens);  // tokens prompt i generates
    int64_t generated = 0;
    for (int i = 0; i < batch; ++i) {
      if (uneven) wanted[i] = (new_tokens * (i + 1) + batch - 1) / batch;
      generated += wanted[i];
    }
    auto stop_after = [&](std::size_t i, std::size_t& count) {
      return [&wanted, i, &count](TokenId, const std::string&) {
        return static_cast<int>(++count) < wanted[i];
      };
    };
    std::vector<double> sequential_ms, batch_ms, batch_keep_ms, sequential_last_ttft, batch_ttft;
    bool same_tokens = true;
    for (int r = 0; r < repeats; ++r) {
      double start = now_ms();
      std::vector<Response> one_by_one;
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        std::size_t count = 0;
        one_by_one.push_back(engine.generate(prompts[i], params, stop_after(i, count)));
      }
      sequential_ms.push_back(now_ms() - start);
      // The last prompt's first token comes after every earlier prompt has finished.
      sequential_last_ttft.push_back(sequential_ms.back() - one_by_one.back().timings.decode_ms);
      auto run_batch = [&](bool drop_finished_rows, std::vector<double>& times) {
        RequestOptions request;
        request.drop_finished_rows = drop_finished_rows;
        std::vector<std::size_t> counts(prompts.size(), 0);
        const double t = now_ms();
        auto out = engine.generate_batch(
            prompts, params,
            [&](std::size_t i, TokenId id, const std::string& text) {
              return stop_after(i, counts[i])(id, text);
            },
            request);
        times.push_back(now_ms() - t);
        return out;
      };
      const auto together = run_batch(true, batch_ms);
      // Uneven answers: also the batch that keeps its finished rows to the end.
      if (uneven) {
        const auto kept = run_batch(false, batch_keep_ms);
        for (std::size_t i = 0; i < prompts.size(); ++i) {
          same_tokens = same_tokens && kept[i].tokens == together[i].tokens;
        }
      }
      batch_ttft.push_back(together.back().timings.ttft_ms);
      cached_tokens = 0;
      for (std::size_t i = 0; i < prompts.size(); ++i) {
        same_tokens = same_tokens && together[i].tokens == one_by_one[i].tokens &&
                      static_cast<int>(together[i].tokens.size()) == wanted[i];
        cached_tokens += together[i].cached_tokens;
      }
    }
    const double seq = bench::best_time(sequential_ms), bat = bench::best_time(batch_ms);
    nlohmann::json j = {
        {"bench", "batch"},
        {"shape", shape},
        {"batch", batch},
        {"cached_tokens_per_prompt", cached_tokens / batch},
        {"fresh_tokens", fresh},
        {"new_tokens", new_tokens},
        {"uneven", uneven},
        {"generated_tokens", generated},
        {"sequential_ms", seq},
        {"batch_ms", bat},
        {"speedup", seq / bat},
        {"speedup_median", bench::median_time(sequential_ms) / bench::median_time(batch_ms)},
        {"sequential_tokens_per_s", static_cast<double>(generated) * 1e3 / seq},
        {"batch_tokens_per_s", static_cast<double>(generated) * 1e3 / bat},
        {"sequential_last_ttft_ms", bench::best_time(sequential_last_ttft)},
        {"batch_ttft_ms", bench::best_time(batch_ttft)},
        {"same_tokens", same_tokens}};
    if (uneven) {
      // What dropping finished rows (RequestOptions::drop_finished_rows) saves.
      j["batch_keep_rows_ms"] = bench::best_time(batch_keep_ms);
      j["drop_rows_speedup"] = bench::best_time(batch_keep_ms) / bat;
      j["drop_rows_speedup_median"] =
          bench::median_time(batch_keep_ms) / bench::median_time(batch_ms);
    }
    j.update(bench::run_facts(engine, device, dtype, applied));
    std::cout << j.dump() << std::endl;
  }
  return 0;
}
