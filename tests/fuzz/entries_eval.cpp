// Fuzz entry "eval_row": the lines of a `promptcache eval` dataset (also Python's Engine.eval),
// read by eval::LineReader and parsed by eval::parse_row into typed rows. LibTorch-free:
// promptcache_eval_rows is the untrusted edge of the evaluation, on its own.
#include <sstream>
#include <string>
#include <vector>

#include "fuzz/fuzz_entries.hpp"
#include "promptcache/error.hpp"
#include "promptcache/eval_rows.hpp"

namespace promptcache::fuzz {
namespace {

using detail::check;

// What a parsed row promises to the evaluation (eval_rows.hpp, docs/eval.md).
void check_row(const eval::Row& row, std::size_t line) {
  check(row.line == line, "the row has another line number");
  check(row.id.is_string() || row.id.is_number_integer(), "an id that is no string or number");
  if (row.id.is_string()) {
    check(row.id.get_ref<const std::string&>().size() <= eval::kMaxIdBytes, "an id too long");
  }
  check(row.key == row.id.dump(), "the resume key is not the id's JSON");
  check(!row.prompt.turns.empty(), "a row without text");
  check(row.prompt.schema == "s", "the row's prompt names another schema than the run's");
  check(row.choice_texts.size() <= eval::kMaxChoices, "more choices than allowed");
  for (const std::string& c : row.choice_texts) check(!eval::blank(c), "a blank choice");
  if (row.answer_index) {
    check(*row.answer_index < row.choice_texts.size(), "an answer index outside the choices");
  }
  check(!(row.scored() && row.answer_text), "a scored row with an answer text");
  if (!row.scored()) {
    try {
      row.params.validate();
    } catch (const Error& e) {
      throw InvariantViolation(std::string("a row's sampling fields passed but do not validate: ") +
                               e.what());
    }
  }
  check(row.choices.empty() && row.prompt_tokens == 0, "parsing did model work");
}

}  // namespace

void eval_row_entry(const std::uint8_t* data, std::size_t size) {
  // Byte 0, bit 0: whether the schema has modules outside unions (the rows' default).
  if (size == 0) return;
  std::vector<pml::ModuleRef> defaults;
  if (data[0] & 1) {
    defaults.push_back({"inst", {}, {}, {}});
    defaults.push_back({"shots", {}, {{"first", {}, {}, {}}}, {}});
  }
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::istringstream in(text);
  eval::LineReader reader(in);
  eval::RowDefaults flags;
  std::set<std::string> unknown;
  std::string line;
  bool too_long = false;
  std::size_t number = 0;
  while (reader.next(line, too_long)) {
    ++number;
    check(line.size() <= eval::kMaxLineBytes, "a line longer than LineReader's bound");
    if (too_long || eval::blank(line)) continue;
    try {
      const eval::Row row = eval::parse_row(line, number, "data.jsonl", "s", defaults, flags,
                                            unknown, [](const std::string& w) {
                                              // A field name is cut to 64 bytes: a warning stays
                                              // short.
                                              check(w.size() < 256, "an unbounded warning");
                                            });
      check_row(row, number);
    } catch (const Error& e) {
      detail::rejected(e);  // a clean rejection of this line; the next lines still run
    }
  }
}

}  // namespace promptcache::fuzz
