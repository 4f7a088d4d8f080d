// promptcache qa: questions over documents; every document is compiled once, each answer only
// runs the question.
#include <fmt/format.h>

#include <iostream>
#include <sstream>

#include "docqa.hpp"
#include "engine_setup.hpp"
#include "recompute_flags.hpp"
#include "tier_flags.hpp"

namespace promptcache::cli {

Command register_qa(CLI::App& root) {
  struct Options {
    ModelOptions model;
    SamplingOptions sampling;
    EngineFlags engine;
    RecomputeFlags recompute;
    std::vector<std::string> docs;
    std::vector<std::string> questions;
    std::string system = "Answer the question using only the documents given to you.";
    std::string cache_file;
    bool stats = false;
  };
  auto o = std::make_shared<Options>();
  auto* app = root.add_subcommand(
      "qa",
      "Answer questions over documents (one prompt module per document, compiled once).\n"
      "Examples:\n"
      "  promptcache qa --model DIR --docs notes/ --question \"When is the meeting?\"\n"
      "  promptcache qa --model DIR --docs notes/ -q \"When?\" -q \"Where?\"   (one batch)\n"
      "  promptcache qa --model DIR --docs a.txt b.md      (interactive: type a question;\n"
      "      :use a.txt picks documents, :docs lists them, :quit ends)");
  add_model_options(*app, o->model);
  add_sampling_options(*app, o->sampling);
  add_engine_flags(*app, o->engine);
  add_recompute_flags(*app, o->recompute);
  app->add_option("--docs,-d", o->docs, "document files or folders of .txt/.md files")->required();
  app->add_option("--question,-q", o->questions,
                  "answer this and exit (else: interactive); several are answered as one batch");
  app->add_option("--system", o->system, "system prompt")->capture_default_str();
  app->add_option("--cache", o->cache_file, "states file for the compiled documents");
  app->add_flag("--stats", o->stats,
                "after the answers, print the span tiers' stats (hits, misses, evictions, bytes "
                "per tier) as one JSON line on stderr");
  return {app, [o]() {
            const auto docs = docqa::collect_documents(o->docs);
            auto engine = open_engine(o->model, o->engine);
            const auto schema = pml::parse_schema_string(
                docqa::schema_xml(docs, o->system), "<qa documents>",
                // The documents are the files the user named (absolute paths).
                pml::RootedSrcFiles("", pml::RootedSrcFiles::Scope::kAnywhere));
            engine->add_schema(schema, progress_bar(),
                               states_file(*engine, schema, o->cache_file, o->engine));
            const auto& report = engine->compile_report(docqa::kSchemaName);
            std::cerr << fmt::format(
                "[{} documents, {} tokens stored, {:.1f} MB, {} in {:.0f} ms]\n", docs.size(),
                report.tokens_stored, report.bytes / 1e6, report.source, report.ms);
            SamplingParams params = o->sampling.params;
            params.stop_strings = o->sampling.stop;
            std::vector<std::string> selected;
            for (const auto& d : docs) selected.push_back(d.module);
            RequestOptions request;
            request.recompute = given_recompute(o->recompute);
            const RecomputeOptions recompute = recompute_options(o->recompute);
            request.recompute_criterion = recompute.criterion;
            request.recompute_select_layer = recompute.select_layer;
            request.recompute_first_k = recompute.first_k;
            auto answer = [&](const std::string& question) {
              const auto r = engine->generate_xml(
                  docqa::prompt_xml(selected, question), params,
                  [](TokenId, const std::string& s) {
                    std::cout << s << std::flush;
                    return true;
                  },
                  request);
              std::cout << "\n";
              std::cerr << fmt::format("[TTFT {:.1f} ms; {} cached{} + {} fresh tokens]\n",
                                       r.timings.ttft_ms, r.cached_tokens,
                                       cached_detail(r, "question"), r.fresh_tokens);
            };
            if (o->questions.size() == 1) {
              answer(o->questions[0]);
              if (o->stats) print_tier_stats(*engine);
              return 0;
            }
            if (o->questions.size() > 1) {
              // One batch over the same documents; each answer under its question.
              std::vector<pml::Prompt> prompts;
              for (const auto& q : o->questions) {
                prompts.push_back(pml::parse_prompt_string(docqa::prompt_xml(selected, q)));
              }
              const auto answers = engine->generate_batch(prompts, params, {}, request);
              for (std::size_t i = 0; i < answers.size(); ++i) {
                std::cout << "Q: " << o->questions[i] << "\n"
                          << answers[i].text << "\n"
                          << std::flush;  // before its stats line on stderr
                std::cerr << fmt::format(
                    "[TTFT {:.1f} ms for the batch; {} cached + {} fresh tokens]\n",
                    answers[i].timings.ttft_ms, answers[i].cached_tokens, answers[i].fresh_tokens);
              }
              if (o->stats) print_tier_stats(*engine);
              return 0;
            }
            std::cerr << "Ask a question (:use FILE... to pick documents, :docs, :quit).\n";
            std::string line;
            while (std::cerr << "> " << std::flush, std::getline(std::cin, line)) {
              if (line.empty()) continue;
              if (line == ":quit" || line == ":q") break;
              if (line == ":docs") {
                for (const auto& d : docs) {
                  const bool on =
                      std::find(selected.begin(), selected.end(), d.module) != selected.end();
                  // The module name can be typed where the file name has spaces.
                  std::cout << (on ? "* " : "  ") << d.label
                            << (d.label.find(' ') != std::string::npos ? " (:use " + d.module + ")"
                                                                       : std::string())
                            << "\n";
                }
                continue;
              }
              if (line.rfind(":use", 0) == 0) {
                std::istringstream in(line.substr(4));
                std::vector<std::string> next;
                std::string label;
                bool ok = true;
                while (in >> label) {
                  auto it = std::find_if(docs.begin(), docs.end(), [&](const docqa::Document& d) {
                    return d.label == label || d.module == label;
                  });
                  if (it == docs.end()) {
                    std::cerr << "no document '" << label << "' (:docs lists them)\n";
                    ok = false;
                  } else {
                    next.push_back(it->module);
                  }
                }
                if (ok && !next.empty()) {
                  // Modules are referenced in schema order.
                  selected.clear();
                  for (const auto& d : docs) {
                    if (std::find(next.begin(), next.end(), d.module) != next.end())
                      selected.push_back(d.module);
                  }
                  std::cerr << "using " << selected.size() << " document(s)\n";
                }
                continue;
              }
              if (line[0] == ':') {
                std::cerr << "unknown command " << line << " (:use, :docs, :quit)\n";
                continue;
              }
              try {
                answer(line);
              } catch (const Error& e) {
                std::cerr << "promptcache: " << e.what() << "\n";
              }
            }
            if (o->stats) print_tier_stats(*engine);
            return 0;
          }};
}

}  // namespace promptcache::cli
