// promptcache eval: a model over a JSONL dataset, the schema's shared modules (instruction,
// few-shot examples) cached: each row scores its choices or generates (docs/eval.md).
//
// The data is untrusted input: every line is parsed once, here, into a typed Row (bounded JSON:
// its size and nesting; every field checked for its type), and a line that fails is reported with
// its number and skipped (--strict: the run stops there), never taking rows before it along.
// --out is appended a line per row with one write() each, so a killed run loses only the rows in
// flight (a line cut short by the kill is removed when the run is resumed), and a rerun skips the
// ids already there.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>

#include "engine_setup.hpp"
#include "promptcache/error.hpp"
#include "request.hpp"

namespace promptcache::cli {
namespace {

using nlohmann::json;

constexpr int kMaxJsonDepth = 64;
constexpr std::size_t kMaxLineBytes = std::size_t{16} << 20;
constexpr std::size_t kMaxChoices = 4096;
constexpr std::size_t kMaxIdBytes = 1024;

// Reads lines of at most kMaxLineBytes; a longer one is skipped (too_long) without holding it.
class LineReader {
 public:
  explicit LineReader(std::istream& in) : in_(in) {}
  // The next line (without '\n'); false at the end of the input.
  bool next(std::string& line, bool& too_long) {
    line.clear();
    too_long = false;
    bool any = false;
    char c;
    while (in_.get(c)) {
      any = true;
      if (c == '\n') return true;
      if (line.size() < kMaxLineBytes) {
        line.push_back(c);
      } else {
        too_long = true;
      }
    }
    return any;
  }

 private:
  std::istream& in_;
};

bool blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return pml::is_xml_space(c); });
}

std::string trimmed(const std::string& s) {
  return std::string(pml::trim(s));
}

// A data line as typed values.
struct Row {
  std::size_t line = 0;
  json id;          // as given (a string or a whole number), else the line number
  std::string key;  // id.dump(): how ids are matched on resume
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

Error row_error(const std::string& message) {
  return Error(ErrorKind::kInvalidArgument, message);
}

// The sampling fields of a row over the flags' values ("max_tokens", "stop", "temperature", ...).
SamplingParams row_sampling(const json& row, const SamplingOptions& flags) {
  const SamplingParams& f = flags.params;
  json merged = {{"max_tokens", f.max_new_tokens},
                 {"temperature", f.temperature},
                 {"top_k", f.top_k},
                 {"top_p", f.top_p},
                 {"repetition_penalty", f.repetition_penalty},
                 {"seed", f.seed},
                 {"stop", flags.stop}};
  for (const char* key :
       {"max_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "seed", "stop"}) {
    if (row.contains(key)) merged[key] = row[key];
  }
  return server::sampling_from_json(merged, "max_tokens");
}

const std::set<std::string>& known_fields() {
  static const std::set<std::string> known = {
      "id",   "prompt",     "modules",     "messages", "choices", "answer",
      "stop", "max_tokens", "temperature", "top_k",    "top_p",   "repetition_penalty",
      "seed"};
  return known;
}

// Parses one data line into a Row (no model work). Errors: Error whose message says what is wrong.
Row parse_row(const std::string& text, std::size_t line, const std::string& data,
              const std::string& schema, const std::vector<pml::ModuleRef>& default_modules,
              const SamplingOptions& flags, std::set<std::string>& unknown_seen) {
  const json j = server::parse_json_bounded(text, kMaxJsonDepth, "the line",
                                            " (deeper structures are not data for eval)");
  if (!j.is_object()) throw row_error("the line must be a JSON object");
  for (const auto& item : j.items()) {
    if (known_fields().count(item.key()) == 0 && unknown_seen.insert(item.key()).second) {
      std::string key = item.key().size() > 64 ? item.key().substr(0, 64) + "..." : item.key();
      std::cerr << fmt::format("promptcache: warning: {}:{}: field '{}' is not used by eval\n",
                               data, line, key);
    }
  }
  Row row;
  row.line = line;
  if (j.contains("id") && !j["id"].is_null()) {
    const json& id = j["id"];
    if (!(id.is_string() || id.is_number_integer())) {
      throw row_error("'id' must be a string or a whole number");
    }
    if (id.is_string() && id.get_ref<const std::string&>().size() > kMaxIdBytes) {
      throw row_error("'id' is longer than " + std::to_string(kMaxIdBytes) + " bytes");
    }
    row.id = id;
  } else {
    row.id = line;
  }
  row.key = row.id.dump();

  const std::string origin = data + ":" + std::to_string(line);
  row.prompt.schema = schema;
  row.prompt.file = origin;
  row.prompt.where = SourceLocation{origin, 0, 0, "prompt"};
  bool pml_prompt = false;
  if (j.contains("prompt") && !j["prompt"].is_null()) {
    if (!j["prompt"].is_string()) throw row_error("'prompt' must be a string");
    const std::string& p = j["prompt"].get_ref<const std::string&>();
    const std::string body = trimmed(p);
    if (body.rfind("<prompt", 0) == 0) {
      pml_prompt = true;
      row.prompt = pml::parse_prompt_string(body, origin);
      print_warnings(row.prompt.warnings);
    } else if (!body.empty()) {
      row.prompt.turns.push_back(
          {std::nullopt, pml::compact_whitespace(p), SourceLocation{origin, 0, 0, "prompt"}});
    }
  }
  server::RequestLimits limits;
  if (j.contains("modules") && !j["modules"].is_null()) {
    if (pml_prompt) {
      throw row_error("'modules' with a PML 'prompt': name the modules in one of them");
    }
    row.prompt.modules = server::module_refs_from_json(j["modules"], "modules", limits);
  } else if (!pml_prompt) {
    row.prompt.modules = default_modules;
  }
  if (j.contains("messages") && !j["messages"].is_null()) {
    for (auto& turn : server::chat_turns_from_json(j, limits)) {
      turn.where.file = origin;
      row.prompt.turns.push_back(std::move(turn));
    }
  }
  if (row.prompt.turns.empty()) {
    throw row_error(
        "the row has no text: give 'prompt' (text or a PML prompt with text) or "
        "'messages'");
  }

  if (j.contains("choices") && !j["choices"].is_null()) {
    const json& c = j["choices"];
    if (!c.is_array() || c.empty() || c.size() > kMaxChoices) {
      throw row_error("'choices' must be a list of 1 to " + std::to_string(kMaxChoices) +
                      " strings");
    }
    for (std::size_t k = 0; k < c.size(); ++k) {
      if (!c[k].is_string()) throw row_error("choices[" + std::to_string(k) + "] must be a string");
      if (blank(c[k].get_ref<const std::string&>())) {
        throw row_error("choices[" + std::to_string(k) + "] is blank");
      }
      row.choice_texts.push_back(c[k].get<std::string>());
    }
    for (const char* key :
         {"max_tokens", "stop", "temperature", "top_k", "top_p", "repetition_penalty", "seed"}) {
      if (j.contains(key)) {
        throw row_error(std::string("'") + key +
                        "' is for generation; a row with 'choices' is scored, not generated");
      }
    }
  } else {
    row.params = row_sampling(j, flags);
  }
  if (j.contains("answer") && !j["answer"].is_null()) {
    const json& a = j["answer"];
    if (a.is_number_integer()) {
      if (!row.scored())
        throw row_error("'answer' is an index into 'choices', but the row has none");
      if (a.is_number_unsigned()
              ? a.get<uint64_t>() >= row.choice_texts.size()
              : (a.get<int64_t>() < 0 ||
                 a.get<int64_t>() >= static_cast<int64_t>(row.choice_texts.size()))) {
        throw row_error("'answer' " + a.dump() + " is not an index into the " +
                        std::to_string(row.choice_texts.size()) + " choices");
      }
      row.answer_index = a.get<std::size_t>();
    } else if (a.is_string()) {
      if (row.scored()) {
        const auto it = std::find(row.choice_texts.begin(), row.choice_texts.end(),
                                  a.get_ref<const std::string&>());
        if (it == row.choice_texts.end()) throw row_error("'answer' is not one of the choices");
        row.answer_index = static_cast<std::size_t>(it - row.choice_texts.begin());
      } else {
        row.answer_text = a.get<std::string>();
      }
    } else {
      throw row_error("'answer' must be an index into 'choices' or the expected text");
    }
  }
  return row;
}

// Checks a row against the loaded schema and the model: modules, arguments, its tokens within
// the context. Errors as Engine's (kUnknownModule, kContextOverflow, ...).
void check_row(const Engine& engine, Row& row, bool use_cache) {
  const pml::ResolvedPrompt r = engine.resolve(row.prompt);
  row.prompt_tokens = static_cast<int64_t>(r.baseline.size());
  const int64_t limit = engine.model().config().max_position_embeddings;
  const auto next = static_cast<int64_t>(use_cache ? r.next_position() : r.baseline.size());
  if (next > limit) {
    throw Error(ErrorKind::kContextOverflow,
                "the prompt needs positions up to " + std::to_string(next - 1) +
                    " but the model's context is " + std::to_string(limit));
  }
  for (std::size_t k = 0; k < row.choice_texts.size(); ++k) {
    auto tokens = engine.encode_continuation(row.choice_texts[k]);
    const int64_t last = next + static_cast<int64_t>(tokens.size()) - 1;
    if (last >= limit) {
      throw Error(ErrorKind::kContextOverflow,
                  "the prompt and choices[" + std::to_string(k) + "] need positions up to " +
                      std::to_string(last) + " but the model's context is " +
                      std::to_string(limit));
    }
    row.choices.push_back(std::move(tokens));
  }
}

Outcome scored_outcome(const Row& row, const ScoreResponse& s) {
  Outcome o;
  auto choices = nlohmann::ordered_json::array();
  std::size_t pred = 0;
  for (std::size_t k = 0; k < s.continuations.size(); ++k) {
    const auto& c = s.continuations[k];
    choices.push_back(
        {{"logprob", c.logprob}, {"tokens", c.tokens}, {"logprob_per_token", c.logprob_per_token}});
    if (c.logprob > s.continuations[pred].logprob) pred = k;
    o.logprobs.push_back(c.logprob_per_token);
    o.other_tokens += static_cast<int64_t>(c.tokens.size());
  }
  o.pred = pred;
  o.line = {{"id", row.id}, {"choices", std::move(choices)}, {"pred", pred}};
  if (row.answer_index) {
    o.correct = pred == *row.answer_index;
    o.line["correct"] = *o.correct;
  }
  o.prompt_tokens = s.prompt_tokens;
  o.cached_tokens = s.cached_tokens;
  o.line["prompt_tokens"] = s.prompt_tokens;
  o.line["cached_tokens"] = s.cached_tokens;
  return o;
}

Outcome generated_outcome(const Row& row, const Response& r) {
  Outcome o;
  o.text = r.text;
  o.line = {{"id", row.id}, {"text", r.text}};
  if (row.answer_text) {
    o.correct = trimmed(r.text) == trimmed(*row.answer_text);
    o.line["correct"] = *o.correct;
  }
  o.prompt_tokens = row.prompt_tokens;
  o.cached_tokens = r.cached_tokens;
  o.other_tokens = static_cast<int64_t>(r.tokens.size());
  o.line["prompt_tokens"] = row.prompt_tokens;
  o.line["cached_tokens"] = r.cached_tokens;
  return o;
}

// --out: ids already there, and an append-only descriptor.
class OutFile {
 public:
  // Reads the ids (and `correct` values) of an existing file; a last line cut short by a killed
  // run is removed (its row runs again).
  explicit OutFile(const std::string& path) : path_(path) {
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) read_existing();
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      throw Error(ErrorKind::kIo,
                  "cannot open " + path + " for appending: " + std::strerror(errno));
    }
  }
  OutFile(const OutFile&) = delete;
  OutFile& operator=(const OutFile&) = delete;
  ~OutFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  // One row's line, in one write (a kill leaves it whole or cut, never interleaved).
  void append(const nlohmann::ordered_json& line) {
    const std::string text =
        line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        throw Error(ErrorKind::kIo, "cannot write " + path_ + ": " + std::strerror(errno));
      done += static_cast<std::size_t>(n);
    }
  }
  // id key -> its `correct` value (null when the row had no answer).
  const std::map<std::string, json>& done() const { return done_; }

 private:
  void read_existing() {
    std::ifstream in(path_, std::ios::binary);
    if (!in) throw Error(ErrorKind::kIo, "cannot read " + path_);
    LineReader reader(in);
    std::string line;
    bool too_long = false;
    std::size_t number = 0;
    std::uintmax_t good_bytes = 0;  // up to the end of the last line with its '\n'
    bool cut = false;
    while (reader.next(line, too_long)) {
      ++number;
      if (in.eof()) {  // no '\n' after it: a line cut short
        cut = true;
        break;
      }
      good_bytes += line.size() + 1;
      if (too_long || blank(line)) continue;
      try {
        const json j = server::parse_json_bounded(line, kMaxJsonDepth, "the line");
        if (!j.is_object() || !j.contains("id")) throw row_error("it has no 'id'");
        done_[j["id"].dump()] = j.contains("correct") ? j["correct"] : json();
      } catch (const Error& e) {
        std::cerr << fmt::format(
            "promptcache: warning: {}:{}: not a result line ({}); its row, "
            "if any, runs again\n",
            path_, number, e.message());
      }
    }
    if (cut) {
      std::cerr << fmt::format(
          "promptcache: warning: {}:{}: the last line was cut short (an "
          "interrupted run); removed, its row runs again\n",
          path_, number);
      std::filesystem::resize_file(path_, good_bytes);
    }
  }

  std::string path_;
  int fd_ = -1;
  std::map<std::string, json> done_;
};

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

struct Totals {
  std::size_t rows = 0, resumed = 0, failed = 0, scored = 0, generated = 0;
  std::size_t answered = 0, correct = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0, other_tokens = 0;
};

// The rows of one batch: scored rows in one score_batch, generation rows in one generate_batch
// per set of sampling parameters. A batch the engine refuses as a whole runs again row by row,
// so that the error belongs to its row.
std::vector<std::optional<Outcome>> run_batch(Engine& engine, const std::vector<Row>& rows,
                                              const RequestOptions& request,
                                              const std::string& data,
                                              std::vector<std::string>& errors) {
  std::vector<std::optional<Outcome>> out(rows.size());
  auto fail = [&](std::size_t i, const Error& e) {
    errors.push_back(fmt::format("{}:{}: {}", data, rows[i].line, e.message()));
  };
  auto run_scored = [&](const std::vector<std::size_t>& group) {
    std::vector<pml::Prompt> prompts;
    std::vector<std::vector<std::vector<TokenId>>> choices;
    for (std::size_t i : group) {
      prompts.push_back(rows[i].prompt);
      choices.push_back(rows[i].choices);
    }
    const auto scores = engine.score_batch(prompts, choices, request);
    for (std::size_t g = 0; g < group.size(); ++g) {
      out[group[g]] = scored_outcome(rows[group[g]], scores[g]);
    }
  };
  auto run_generated = [&](const std::vector<std::size_t>& group) {
    std::vector<pml::Prompt> prompts;
    for (std::size_t i : group) prompts.push_back(rows[i].prompt);
    const auto responses = engine.generate_batch(prompts, rows[group.front()].params, {}, request);
    for (std::size_t g = 0; g < group.size(); ++g) {
      out[group[g]] = generated_outcome(rows[group[g]], responses[g]);
    }
  };
  auto run_group = [&](const std::vector<std::size_t>& group, bool scored) {
    try {
      scored ? run_scored(group) : run_generated(group);
    } catch (const Error&) {
      if (group.size() == 1) throw;
      for (std::size_t i : group) {
        try {
          scored ? run_scored({i}) : run_generated({i});
        } catch (const Error& e) {
          fail(i, e);
        }
      }
    }
  };
  std::vector<std::size_t> scored;
  std::vector<std::vector<std::size_t>> generated;  // rows with equal sampling parameters
  auto same_params = [](const SamplingParams& a, const SamplingParams& b) {
    return a.temperature == b.temperature && a.top_k == b.top_k && a.top_p == b.top_p &&
           a.repetition_penalty == b.repetition_penalty && a.seed == b.seed &&
           a.max_new_tokens == b.max_new_tokens && a.stop_strings == b.stop_strings &&
           a.stop_token_ids == b.stop_token_ids && a.stop_at_eos == b.stop_at_eos;
  };
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].scored()) {
      scored.push_back(i);
      continue;
    }
    auto it = std::find_if(generated.begin(), generated.end(), [&](const auto& g) {
      return same_params(rows[g.front()].params, rows[i].params);
    });
    if (it == generated.end()) {
      generated.push_back({i});
    } else {
      it->push_back(i);
    }
  }
  auto guarded = [&](const std::vector<std::size_t>& group, bool is_scored) {
    try {
      run_group(group, is_scored);
    } catch (const Error& e) {
      fail(group.front(), e);
    }
  };
  if (!scored.empty()) guarded(scored, true);
  for (const auto& g : generated) guarded(g, false);
  return out;
}

// --check: a sampled row and what it gave with the cache.
struct Checked {
  Row row;
  Outcome cached;
};

json run_check(Engine& engine, const std::vector<Checked>& sample) {
  std::size_t scored = 0, same_pred = 0, generated = 0, identical = 0;
  double max_diff = 0;
  const RequestOptions plain{false};
  for (const auto& c : sample) {
    if (c.row.scored()) {
      const auto s = engine.score(c.row.prompt, c.row.choices, plain);
      const Outcome o = scored_outcome(c.row, s);
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
    }
  }
  std::cerr << fmt::format("eval: --check: {} rows again without the cache", sample.size());
  if (scored > 0) {
    std::cerr << fmt::format("; scored rows: {}/{} same prediction, max logprob difference {:.3g}",
                             same_pred, scored, max_diff);
  }
  if (generated > 0) {
    std::cerr << fmt::format("; generations: {}/{} identical", identical, generated);
  }
  std::cerr << "\n";
  json j = {{"rows", sample.size()},
            {"scored", scored},
            {"same_pred", same_pred},
            {"generated", generated},
            {"identical_generations", identical}};
  j["max_logprob_diff"] = scored > 0 ? json(max_diff) : json();
  return j;
}

// Every module of the schema outside unions, in schema order, nested as in the schema.
std::vector<pml::ModuleRef> default_modules(const pml::Layout& layout) {
  std::vector<pml::ModuleRef> top;
  // Explicit stack of (module, where its refs go); a schema's depth is bounded by its parser.
  std::vector<std::pair<std::size_t, std::vector<pml::ModuleRef>*>> stack{{0, &top}};
  while (!stack.empty()) {
    const auto [m, out] = stack.back();
    stack.pop_back();
    for (std::size_t c : layout.modules[m].children) {
      const pml::ModuleLayout& child = layout.modules[c];
      if (!child.unions.empty()) continue;
      pml::ModuleRef ref;
      ref.name = child.name;
      out->push_back(std::move(ref));
    }
    // Children's own children: after this level's refs are in place (no reallocation later).
    std::size_t k = 0;
    for (std::size_t c : layout.modules[m].children) {
      if (!layout.modules[c].unions.empty()) continue;
      stack.push_back({c, &(*out)[k].children});
      ++k;
    }
  }
  return top;
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
        const auto& layout = engine->add_schema(
            schema, progress_bar(), states_file(*engine, schema, o->cache_file, o->engine));
        const auto defaults = default_modules(layout);

        OutFile out(o->out);
        std::ifstream in(o->data, std::ios::binary);
        if (!in) throw Error(ErrorKind::kIo, "cannot read " + o->data);
        // The rows to run, for the progress bar: a first pass counts them.
        std::size_t total = 0;
        {
          LineReader counter(in);
          std::string line;
          bool too_long = false;
          while (counter.next(line, too_long) && (o->limit == 0 || total < o->limit)) {
            total += too_long || !blank(line);
          }
          in.clear();
          in.seekg(0);
        }
        Progress progress(total);
        RequestOptions request{!o->no_cache};
        Totals t;
        std::vector<Row> pending;
        std::map<std::string, std::size_t> seen;  // id key -> its line, this run
        std::vector<Checked> sample;              // --check: a reservoir of rows
        std::mt19937_64 rng(1234);
        std::size_t eligible = 0, rows_read = 0;
        const double start = now_ms();
        bool stopped = false;
        auto report = [&](const std::string& message) {
          ++t.failed;
          std::cerr << "promptcache: error: " << message << "\n";
          if (o->strict) stopped = true;
        };
        auto flush = [&] {
          if (pending.empty()) return;
          std::vector<std::string> errors;
          const auto outcomes = run_batch(*engine, pending, request, o->data, errors);
          for (std::size_t i = 0; i < pending.size(); ++i) {
            if (!outcomes[i]) continue;
            const Outcome& r = *outcomes[i];
            out.append(r.line);
            ++t.rows;
            ++(pending[i].scored() ? t.scored : t.generated);
            t.prompt_tokens += r.prompt_tokens;
            t.cached_tokens += r.cached_tokens;
            t.other_tokens += r.other_tokens;
            if (r.correct) {
              ++t.answered;
              t.correct += *r.correct;
            }
            if (o->check > 0) {  // reservoir sampling: every row equally likely
              ++eligible;
              if (sample.size() < o->check) {
                sample.push_back({pending[i], r});
              } else {
                const auto slot = std::uniform_int_distribution<std::size_t>(0, eligible - 1)(rng);
                if (slot < o->check) sample[slot] = {pending[i], r};
              }
            }
          }
          for (const auto& e : errors) report(e);
          pending.clear();
          progress.update(rows_read);
        };

        LineReader reader(in);
        std::string line;
        bool too_long = false;
        std::size_t number = 0;
        std::set<std::string> unknown_seen;
        while (!stopped && reader.next(line, too_long)) {
          ++number;
          if (!too_long && blank(line)) continue;
          if (o->limit > 0 && rows_read >= o->limit) break;
          ++rows_read;
          const std::string where = fmt::format("{}:{}", o->data, number);
          if (too_long) {
            report(fmt::format("{}: the line is longer than {} bytes", where, kMaxLineBytes));
            continue;
          }
          Row row;
          try {
            row =
                parse_row(line, number, o->data, schema.name, defaults, o->sampling, unknown_seen);
          } catch (const Error& e) {
            report(where + ": " + e.message());
            continue;
          }
          if (const auto it = seen.find(row.key); it != seen.end()) {
            report(
                fmt::format("{}: id {} was already used at line {}", where, row.key, it->second));
            continue;
          }
          seen[row.key] = number;
          if (const auto it = out.done().find(row.key); it != out.done().end()) {
            ++t.resumed;
            if (it->second.is_boolean()) {
              ++t.answered;
              t.correct += it->second.get<bool>();
            }
            continue;
          }
          try {
            check_row(*engine, row, request.use_cache);
          } catch (const Error& e) {
            report(where + ": " + e.message());
            continue;
          }
          pending.push_back(std::move(row));
          if (pending.size() >= o->batch) flush();
        }
        flush();
        progress.update(rows_read, true);
        const double wall_s = (now_ms() - start) / 1e3;

        nlohmann::ordered_json summary = {
            {"rows", t.rows},
            {"resumed", t.resumed},
            {"failed", t.failed},
            {"scored", t.scored},
            {"generated", t.generated},
            {"answered", t.answered},
            {"correct", t.correct},
            {"cached", request.use_cache},
            {"prompt_tokens", t.prompt_tokens},
            {"cached_tokens", t.cached_tokens},
            {"fresh_tokens", t.prompt_tokens - t.cached_tokens},
            {"choice_or_generated_tokens", t.other_tokens},
            {"wall_s", wall_s},
            {"rows_per_s", wall_s > 0 ? t.rows / wall_s : 0.0},
            {"tokens_per_s", wall_s > 0 ? (t.prompt_tokens + t.other_tokens) / wall_s : 0.0}};
        summary["accuracy"] =
            t.answered > 0 ? json(static_cast<double>(t.correct) / t.answered) : json();
        std::cerr << fmt::format(
            "eval: {} rows in {:.2f} s ({:.2f} rows/s, {:.0f} tokens/s); {} resumed from {}, "
            "{} failed\n",
            t.rows, wall_s, summary["rows_per_s"].get<double>(),
            summary["tokens_per_s"].get<double>(), t.resumed, o->out, t.failed);
        std::cerr << fmt::format(
            "eval: prompt tokens {} ({} cached, {} fresh){}\n", t.prompt_tokens, t.cached_tokens,
            t.prompt_tokens - t.cached_tokens, request.use_cache ? "" : " --no-cache");
        if (t.answered > 0) {
          std::cerr << fmt::format("eval: accuracy {:.4f} ({}/{} rows with an answer)\n",
                                   summary["accuracy"].get<double>(), t.correct, t.answered);
        }
        if (!sample.empty() && !stopped) summary["check"] = run_check(*engine, sample);
        if (o->json) std::cout << summary.dump() << "\n";
        return stopped ? 1 : 0;
      }};
}

}  // namespace promptcache::cli
