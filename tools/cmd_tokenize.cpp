// promptcache tokenize: the ids a model's tokenizer gives a text (tokenizer.json byte-level BPE or
// tokenizer.model SentencePiece), without loading any weights. No LibTorch in this unit.
#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>
#include <sstream>

#include "cli_common.hpp"
#include "promptcache/model/tokenizer.hpp"

namespace promptcache::cli {

Command register_tokenize(CLI::App& root) {
  struct Options {
    std::string model_dir;
    std::string tokenizer;
    std::string text;
    std::string file;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  auto* app = root.add_subcommand(
      "tokenize",
      "Print the token ids of a text (no special tokens added).\n"
      "Examples: promptcache tokenize --model /tmp/tiny --text \"Hello world\"\n"
      "          promptcache tokenize --tokenizer qwen3/tokenizer.json --file prompt.txt --json");
  app->add_option("--model,-m", o->model_dir,
                  "model folder: its tokenizer.json, else its tokenizer.model");
  app->add_option("--tokenizer", o->tokenizer,
                  "a tokenizer file: *.json is read as tokenizer.json, anything else as a "
                  "SentencePiece tokenizer.model");
  app->add_option("--text", o->text, "the text to tokenize");
  app->add_option("--file", o->file, "a file whose bytes are the text");
  app->add_flag("--json", o->json, "print {\"ids\": [...], \"tokens\": [...]} instead of the ids");
  return {app, [o, app]() {
            const bool model = app->count("--model") > 0, file = app->count("--tokenizer") > 0;
            if (model == file) {
              throw UsageError("tokenize: give exactly one of --model DIR or --tokenizer FILE");
            }
            const bool text = app->count("--text") > 0, from_file = app->count("--file") > 0;
            if (text == from_file) {
              throw UsageError("tokenize: give exactly one of --text TEXT or --file FILE");
            }
            std::string input = o->text;
            if (from_file) {
              std::ifstream in(o->file, std::ios::binary);
              if (!in) throw UsageError("tokenize: cannot read --file " + o->file);
              std::ostringstream bytes;
              bytes << in.rdbuf();
              input = bytes.str();
            }
            const auto tok = load_tokenizer(model ? o->model_dir : o->tokenizer);
            const std::vector<TokenId> ids = tok->encode(input);
            if (o->json) {
              nlohmann::json out = {{"ids", ids}, {"tokens", nlohmann::json::array()}};
              for (TokenId id : ids) out["tokens"].push_back(tok->id_to_piece(id));
              // Pieces are UTF-8 in every tokenizer we read; replace rather than throw if not.
              std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                        << "\n";
            } else {
              for (std::size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
              std::cout << "\n";
            }
            return 0;
          }};
}

}  // namespace promptcache::cli
