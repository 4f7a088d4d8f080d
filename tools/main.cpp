// promptcache — command-line interface. One subcommand per file (cmd_*.cpp).
#include <CLI/CLI.hpp>

#include <iostream>

#include "cli_common.hpp"
#include "cmd_convert.hpp"
#include "promptcache/error.hpp"

int main(int argc, char** argv) {
  using namespace promptcache;
  CLI::App app{
      "promptcache — reuse attention states of prompt modules for fast LLM answers.\n"
      "Examples:\n"
      "  promptcache demo                                   (synthetic model, cached vs uncached)\n"
      "  promptcache make-model --shape tiny --out /tmp/tiny\n"
      "  promptcache info --model /tmp/tiny                 (shapes, dtypes and why, tokenizer)\n"
      "  promptcache layout schemas/trip.xml --model /tmp/tiny\n"
      "  promptcache run --model /tmp/tiny --schema schemas/trip.xml --prompt "
      "schemas/trip.prompt.xml\n"
      "  promptcache qa --model /tmp/tiny --docs docs/ --question \"What is a prompt module?\"\n"
      "  promptcache tokenize --model /tmp/tiny --text \"Hello world\" --json\n"
      "  promptcache compile schemas/trip.xml --model /tmp/tiny --cache-dir /tmp/states\n"
      "  promptcache cache ls --cache-dir /tmp/states\n"
      "  promptcache serve --model /tmp/tiny --schema schemas/trip.xml --port 8080\n"
      "  promptcache eval --model DIR --schema S.xml --data D.jsonl --out results.jsonl\n"
      "  promptcache template --model DIR --messages chat.json --add-generation-prompt\n"
      "  promptcache convert --model /tmp/tiny --out /tmp/tiny.gguf --type q8_0\n"};
  app.require_subcommand(1);
#ifdef PROMPTCACHE_DEMO_ONLY
  // scripts/demo.sh's build (PROMPTCACHE_DEMO_ONLY): the other commands are named, so that
  // calling one says how to build it instead of "not a command".
  std::vector<cli::Command> commands = {cli::register_demo(app)};
  for (const char* name : {"layout", "run", "qa", "generate", "make-model", "tokenize", "compile",
                           "cache", "fidelity", "serve", "eval", "info", "template", "convert"}) {
    commands.push_back(cli::register_absent(app, name));
  }
#else
  std::vector<cli::Command> commands = {
      cli::register_demo(app),     cli::register_layout(app),   cli::register_run(app),
      cli::register_qa(app),       cli::register_generate(app), cli::register_make_model(app),
      cli::register_tokenize(app), cli::register_compile(app),  cli::register_cache(app),
      cli::register_fidelity(app), cli::register_serve(app),    cli::register_eval(app),
      cli::register_info(app),     cli::register_template(app), cli::register_convert(app)};
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Prints help, or the error and a --help hint; any usage error exits 2 (CLI11 codes vary).
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    for (auto& c : commands) {
      if (c.app->parsed()) return c.run();
    }
  } catch (const cli::UsageError& e) {
    std::cerr << "promptcache: error: " << e.what() << "\n";
    return 2;
  } catch (const Error& e) {
    std::cerr << "promptcache: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "promptcache: internal error: " << e.what() << "\n";
    return 3;
  }
  return 2;
}
