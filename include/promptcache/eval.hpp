// promptcache/eval.hpp — a model over a JSONL dataset, the schema's shared modules (instruction,
// few-shot examples) cached: each row scores its choices or generates (docs/eval.md). One
// implementation for `promptcache eval` and Python's `Engine.eval`.
//
// The data is untrusted input: every line is parsed once, here, into a typed Row (bounded JSON:
// its size and nesting; every field checked for its type), and a line that fails is reported with
// its number and skipped (strict: the run stops there), never taking rows before it along. The
// results file is appended a line per row with one write() each, so a killed run loses only the
// rows in flight (a line cut short by the kill is removed when the run is resumed), and a rerun
// skips the ids already there.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <istream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "promptcache/engine.hpp"
#include "promptcache/eval_rows.hpp"

namespace promptcache::eval {

// What a row gave, ready to be written.
struct Outcome {
  nlohmann::ordered_json line;  // "id" first, the fields in the order docs/eval.md lists them
  std::optional<bool> correct;
  int64_t prompt_tokens = 0, cached_tokens = 0, other_tokens = 0;  // other: choices or generated
  // For --check.
  std::vector<std::vector<double>> logprobs;
  std::optional<std::size_t> pred;
  std::string text;
};

Outcome scored_outcome(const Row& row, const ScoreResponse& s);
Outcome generated_outcome(const Row& row, const Response& r);

// Every module of the schema outside unions, in schema order, nested as in the schema: the
// modules of a row that names none.
std::vector<pml::ModuleRef> default_modules(const pml::Layout& layout);

// The results file: ids already there, and an append-only descriptor.
class OutFile {
 public:
  // Reads the ids (and `correct` values) of an existing file; a last line cut short by a killed
  // run is removed (its row runs again). Lines that are no result are passed to `warn`.
  OutFile(const std::string& path, const std::function<void(const std::string&)>& warn);
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  ~OutFile();
  // One row's line, in one write (a kill leaves it whole or cut, never interleaved).
  void append(const nlohmann::ordered_json& line);
  // id key -> its `correct` value (null when the row had no answer).
  const std::map<std::string, nlohmann::json>& done() const { return done_; }

 private:
  void read_existing(const std::function<void(const std::string&)>& warn);
  std::string path_;
  int fd_ = -1;
  std::map<std::string, nlohmann::json> done_;
};

struct Totals {
  std::size_t rows = 0, resumed = 0, failed = 0, scored = 0, generated = 0;
  std::size_t answered = 0, correct = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0, other_tokens = 0;
};

struct EvalOptions {
  RowDefaults defaults;
  bool use_cache = true;
  // RequestOptions::recompute and its criterion for every row (docs/fidelity.md); unset: the
  // schema's recompute attribute, else 0.
  std::optional<double> recompute;
  RecomputeCriterion recompute_criterion = RecomputeCriterion::kImpact;
  int64_t recompute_select_layer = 1;
  int64_t recompute_first_k = 8;
  std::size_t batch = 8;  // rows run together (>= 1)
  bool strict = false;    // the first bad line stops the run
  // Asked while a batch generates; true stops it: its rows are not written (they run again on a
  // resume) and add_line/flush throw Error(kCancelled). Python's Ctrl-C.
  std::function<bool()> cancelled;
  // Receives each warning ("D.jsonl:3: field 'x' is not used by eval"), without a prefix.
  std::function<void(const std::string&)> warn;
};

// One evaluation of rows against one loaded schema. Lines go in one at a time (add_line); rows
// run in batches of options.batch as they fill (and at flush()); each answered row is appended to
// the results file (when there is one) and handed out by take_events() with the errors, in the
// order they happened.
class Evaluation {
 public:
  struct Event {
    std::size_t line = 0;
    std::optional<Row> row;          // an answered row ...
    std::optional<Outcome> outcome;  // ... and what it gave
    std::string error;               // or a bad line: "D.jsonl:LINE: what"
  };

  // `data` names the rows in messages ("D.jsonl"); `out` is the results file ("" for none: no
  // resume).
  Evaluation(Engine& engine, const std::string& schema, std::string data, const std::string& out,
             EvalOptions options);

  // Parses line `number` (1-based; too_long: it was longer than kMaxLineBytes) and queues its
  // row, skipping it when its id is in the results file; runs the batch when it is full. Blank
  // lines are ignored. Nothing happens once stopped().
  void add_line(const std::string& text, std::size_t number, bool too_long = false);
  // Reads lines from `reader` (numbered from 1 across calls) and adds them until something
  // happened (a batch ran, a line failed) or the input ended, at most `limit` rows in all (blank
  // lines do not count; 0: no limit); at the end, runs the queued rows. False once everything
  // is read and run.
  bool read_some(LineReader& reader, std::size_t limit = 0);
  // The rows read_some has read (bad ones included).
  std::size_t rows_read() const { return rows_read_; }
  // Runs the queued rows.
  void flush();
  // Strict and a bad line was seen.
  bool stopped() const { return stopped_; }
  std::vector<Event> take_events();
  const Totals& totals() const { return totals_; }
  bool use_cache() const { return options_.use_cache; }
  // The summary of docs/eval.md ("rows", "resumed", ..., "accuracy").
  nlohmann::ordered_json summary(double wall_s) const;

 private:
  void report(std::string message, std::size_t line);
  std::vector<std::optional<Outcome>> run_batch(std::vector<std::string>& errors);

  Engine& engine_;
  std::string schema_, data_;
  EvalOptions options_;
  std::vector<pml::ModuleRef> defaults_;
  std::optional<OutFile> out_;
  Totals totals_;
  std::vector<Row> pending_;
  std::map<std::string, std::size_t> seen_;  // id key -> its line, this run
  std::set<std::string> unknown_seen_;
  std::vector<Event> events_;
  std::size_t lines_read_ = 0, rows_read_ = 0;  // read_some's
  bool stopped_ = false, input_done_ = false;
};

}  // namespace promptcache::eval
