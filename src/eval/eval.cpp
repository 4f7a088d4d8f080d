// The evaluation of a JSONL dataset (promptcache/eval.hpp, docs/eval.md): shared by
// `promptcache eval` (tools/cmd_eval.cpp) and Python's Engine.eval (python/module.cpp).
#include "promptcache/eval.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "promptcache/error.hpp"
#include "request.hpp"

namespace promptcache::eval {

using nlohmann::json;

namespace {

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

}  // namespace

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
    o.correct = pml::trim(r.text) == pml::trim(*row.answer_text);
    o.line["correct"] = *o.correct;
  }
  o.prompt_tokens = row.prompt_tokens;
  o.cached_tokens = r.cached_tokens;
  o.other_tokens = static_cast<int64_t>(r.tokens.size());
  o.line["prompt_tokens"] = row.prompt_tokens;
  o.line["cached_tokens"] = r.cached_tokens;
  return o;
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

OutFile::OutFile(const std::string& path, const std::function<void(const std::string&)>& warn)
    : path_(path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec)) read_existing(warn);
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    throw Error(ErrorKind::kIo, "cannot open " + path + " for appending: " + std::strerror(errno));
  }
}

OutFile::~OutFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutFile::append(const nlohmann::ordered_json& line) {
  const std::string text =
      line.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd_, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error(ErrorKind::kIo, "cannot write " + path_ + ": " + std::strerror(errno));
    done += static_cast<std::size_t>(n);
  }
}

void OutFile::read_existing(const std::function<void(const std::string&)>& warn) {
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
      if (!j.is_object() || !j.contains("id"))
        throw Error(ErrorKind::kInvalidArgument, "it has no 'id'");
      done_[j["id"].dump()] = j.contains("correct") ? j["correct"] : json();
    } catch (const Error& e) {
      if (warn) {
        warn(fmt::format("{}:{}: not a result line ({}); its row, if any, runs again", path_,
                         number, e.message()));
      }
    }
  }
  if (cut) {
    if (warn) {
      warn(fmt::format(
          "{}:{}: the last line was cut short (an interrupted run); removed, its row runs again",
          path_, number));
    }
    std::filesystem::resize_file(path_, good_bytes);
  }
}

Evaluation::Evaluation(Engine& engine, const std::string& schema, std::string data,
                       const std::string& out, EvalOptions options)
    : engine_(engine),
      schema_(schema),
      data_(std::move(data)),
      options_(std::move(options)),
      defaults_(default_modules(engine.layout(schema))) {
  if (options_.batch == 0) throw Error(ErrorKind::kInvalidArgument, "the batch size must be >= 1");
  if (!out.empty()) out_.emplace(out, options_.warn);
}

void Evaluation::report(std::string message, std::size_t line) {
  ++totals_.failed;
  Event e;
  e.line = line;
  e.error = std::move(message);
  events_.push_back(std::move(e));
  if (options_.strict) stopped_ = true;
}

void Evaluation::add_line(const std::string& text, std::size_t number, bool too_long) {
  if (stopped_) return;
  if (!too_long && blank(text)) return;
  const std::string where = fmt::format("{}:{}", data_, number);
  if (too_long) {
    report(fmt::format("{}: the line is longer than {} bytes", where, kMaxLineBytes), number);
    return;
  }
  Row row;
  try {
    row = parse_row(text, number, data_, schema_, defaults_, options_.defaults, unknown_seen_,
                    options_.warn);
  } catch (const Error& e) {
    report(where + ": " + e.message(), number);
    return;
  }
  if (const auto it = seen_.find(row.key); it != seen_.end()) {
    report(fmt::format("{}: id {} was already used at line {}", where, row.key, it->second),
           number);
    return;
  }
  seen_[row.key] = number;
  if (out_) {
    if (const auto it = out_->done().find(row.key); it != out_->done().end()) {
      ++totals_.resumed;
      if (it->second.is_boolean()) {
        ++totals_.answered;
        totals_.correct += it->second.get<bool>();
      }
      return;
    }
  }
  try {
    check_row(engine_, row, options_.use_cache);
  } catch (const Error& e) {
    report(where + ": " + e.message(), number);
    return;
  }
  pending_.push_back(std::move(row));
  if (pending_.size() >= options_.batch) flush();
}

bool Evaluation::read_some(LineReader& reader, std::size_t limit) {
  if (input_done_) return false;
  std::string line;
  bool too_long = false;
  while (events_.empty()) {
    if (stopped_ || (limit > 0 && rows_read_ >= limit) || !reader.next(line, too_long)) {
      flush();
      input_done_ = true;
      return !events_.empty();
    }
    ++lines_read_;
    if (!too_long && blank(line)) continue;
    ++rows_read_;
    add_line(line, lines_read_, too_long);
  }
  return true;
}

void Evaluation::flush() {
  if (pending_.empty()) return;
  std::vector<std::string> errors;
  std::vector<std::optional<Outcome>> outcomes;
  try {
    outcomes = run_batch(errors);
  } catch (...) {
    pending_.clear();  // cancelled (or worse): these rows were not written, a resume runs them
    throw;
  }
  for (std::size_t i = 0; i < pending_.size(); ++i) {
    if (!outcomes[i]) continue;
    Outcome& r = *outcomes[i];
    if (out_) out_->append(r.line);
    ++totals_.rows;
    ++(pending_[i].scored() ? totals_.scored : totals_.generated);
    totals_.prompt_tokens += r.prompt_tokens;
    totals_.cached_tokens += r.cached_tokens;
    totals_.other_tokens += r.other_tokens;
    if (r.correct) {
      ++totals_.answered;
      totals_.correct += *r.correct;
    }
    Event e;
    e.line = pending_[i].line;
    e.row = std::move(pending_[i]);
    e.outcome = std::move(r);
    events_.push_back(std::move(e));
  }
  for (auto& e : errors) {
    // "D.jsonl:LINE: ..." (the line is for the event's order only)
    report(std::move(e), 0);
  }
  pending_.clear();
}

std::vector<Evaluation::Event> Evaluation::take_events() {
  std::vector<Event> out;
  out.swap(events_);
  return out;
}

nlohmann::ordered_json Evaluation::summary(double wall_s) const {
  const Totals& t = totals_;
  nlohmann::ordered_json summary = {
      {"rows", t.rows},
      {"resumed", t.resumed},
      {"failed", t.failed},
      {"scored", t.scored},
      {"generated", t.generated},
      {"answered", t.answered},
      {"correct", t.correct},
      {"cached", options_.use_cache},
      {"prompt_tokens", t.prompt_tokens},
      {"cached_tokens", t.cached_tokens},
      {"fresh_tokens", t.prompt_tokens - t.cached_tokens},
      {"choice_or_generated_tokens", t.other_tokens},
      {"wall_s", wall_s},
      {"rows_per_s", wall_s > 0 ? t.rows / wall_s : 0.0},
      {"tokens_per_s", wall_s > 0 ? (t.prompt_tokens + t.other_tokens) / wall_s : 0.0}};
  summary["accuracy"] = t.answered > 0 ? json(static_cast<double>(t.correct) / t.answered) : json();
  return summary;
}

// The rows of one batch: scored rows in one score_batch, generation rows in one generate_batch
// per set of sampling parameters. A batch the engine refuses as a whole runs again row by row,
// so that the error belongs to its row.
std::vector<std::optional<Outcome>> Evaluation::run_batch(std::vector<std::string>& errors) {
  Engine& engine = engine_;
  const std::vector<Row>& rows = pending_;
  const std::string& data = data_;
  RequestOptions request;
  request.use_cache = options_.use_cache;
  request.recompute = options_.recompute;
  request.recompute_criterion = options_.recompute_criterion;
  request.recompute_select_layer = options_.recompute_select_layer;
  request.recompute_first_k = options_.recompute_first_k;
  const auto& cancelled = options_.cancelled;
  auto check_cancelled = [&] {
    if (cancelled && cancelled()) throw Error(ErrorKind::kCancelled, "the evaluation was stopped");
  };
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
    check_cancelled();
    const auto scores = engine.score_batch(prompts, choices, request);
    check_cancelled();
    for (std::size_t g = 0; g < group.size(); ++g) {
      out[group[g]] = scored_outcome(rows[group[g]], scores[g]);
    }
  };
  auto run_generated = [&](const std::vector<std::size_t>& group) {
    std::vector<pml::Prompt> prompts;
    for (std::size_t i : group) prompts.push_back(rows[i].prompt);
    BatchTokenCallback stop_when_cancelled;
    if (cancelled)
      stop_when_cancelled = [&](std::size_t, TokenId, const std::string&) { return !cancelled(); };
    const auto responses =
        engine.generate_batch(prompts, rows[group.front()].params, stop_when_cancelled, request);
    check_cancelled();
    for (std::size_t g = 0; g < group.size(); ++g) {
      out[group[g]] = generated_outcome(rows[group[g]], responses[g]);
    }
  };
  auto run_group = [&](const std::vector<std::size_t>& group, bool scored) {
    try {
      scored ? run_scored(group) : run_generated(group);
    } catch (const Error& e) {
      if (group.size() == 1 || e.kind() == ErrorKind::kCancelled) throw;
      for (std::size_t i : group) {
        try {
          scored ? run_scored({i}) : run_generated({i});
        } catch (const Error& e) {
          if (e.kind() == ErrorKind::kCancelled) throw;
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
      if (e.kind() == ErrorKind::kCancelled) throw;
      fail(group.front(), e);
    }
  };
  if (!scored.empty()) guarded(scored, true);
  for (const auto& g : generated) guarded(g, false);
  return out;
}

}  // namespace promptcache::eval
