// promptcache/eval_rows.hpp — a dataset's lines as typed rows, for promptcache/eval.hpp
// (`promptcache eval`, Python's Engine.eval; docs/eval.md).
//
// The data is untrusted input: a line is read with a bounded length (LineReader) and parsed once,
// here, into a Row — bounded JSON (its size and nesting), every field checked for its type and
// range — before anything else sees it. No LibTorch, so the eval_row fuzz target (tests/fuzz)
// exercises exactly this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <istream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "promptcache/model/tokenizer.hpp"
#include "promptcache/pml/prompt.hpp"
#include "promptcache/sampling.hpp"

namespace promptcache::eval {

constexpr int kMaxJsonDepth = 64;
constexpr std::size_t kMaxLineBytes = std::size_t{16} << 20;
constexpr std::size_t kMaxChoices = 4096;
constexpr std::size_t kMaxIdBytes = 1024;

// Reads lines of at most kMaxLineBytes; a longer one is skipped (too_long) without holding it.
class LineReader {
 public:
  explicit LineReader(std::istream& in) : in_(in) {}
  // The next line (without '\n'); false at the end of the input.
  bool next(std::string& line, bool& too_long);

 private:
  std::istream& in_;
};

// Whether a line holds only whitespace (skipped, not counted as a row).
bool blank(const std::string& s);

// The rows of a file a run reads (blank lines left out, too-long ones in), at most `limit`
// (0: all): for a progress bar's total.
std::size_t count_rows(const std::string& path, std::size_t limit);

// What a row does when it does not say: the sampling flags of the CLI, the keyword arguments of
// Python's Engine.eval.
struct RowDefaults {
  SamplingParams params;  // max_new_tokens: 32 unless set
  std::vector<std::string> stop;
};

// A data line as typed values.
struct Row {
  std::size_t line = 0;
  nlohmann::json id;  // as given (a string or a whole number), else the line number
  std::string key;    // id.dump(): how ids are matched on resume
  pml::Prompt prompt;
  std::vector<std::string> choice_texts;  // empty: a generation row
  std::optional<std::size_t> answer_index;
  std::optional<std::string> answer_text;
  SamplingParams params;
  // Checked against the engine: the choices' tokens and the prompt's length.
  std::vector<std::vector<TokenId>> choices;
  int64_t prompt_tokens = 0;
  bool scored() const { return !choice_texts.empty(); }
};

// Parses data line number `line` of file `data` into a Row for `schema` (no model work): a row
// that names no modules gets `default_modules`, one without sampling fields `flags`. A field no
// row uses is reported once to `warn` (the names met so far are in unknown_seen). Errors:
// Error whose message says what is wrong (the caller adds the file and line).
Row parse_row(const std::string& text, std::size_t line, const std::string& data,
              const std::string& schema, const std::vector<pml::ModuleRef>& default_modules,
              const RowDefaults& flags, std::set<std::string>& unknown_seen,
              const std::function<void(const std::string&)>& warn);

}  // namespace promptcache::eval
