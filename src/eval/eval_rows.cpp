// A dataset's lines as typed rows (promptcache/eval_rows.hpp): the untrusted part of
// `promptcache eval` and Python's Engine.eval, parsed here and nowhere else. No LibTorch (the
// eval_row fuzz target links it alone).
#include "promptcache/eval_rows.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>

#include "promptcache/error.hpp"
#include "request.hpp"

namespace promptcache::eval {

using nlohmann::json;

bool LineReader::next(std::string& line, bool& too_long) {
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

bool blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return pml::is_xml_space(c); });
}

std::size_t count_rows(const std::string& path, std::size_t limit) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::kIo, "cannot read " + path);
  LineReader reader(in);
  std::string line;
  bool too_long = false;
  std::size_t total = 0;
  while (reader.next(line, too_long) && (limit == 0 || total < limit)) {
    total += too_long || !blank(line);
  }
  return total;
}

namespace {

std::string trimmed(const std::string& s) {
  return std::string(pml::trim(s));
}

Error row_error(const std::string& message) {
  return Error(ErrorKind::kInvalidArgument, message);
}

// The sampling fields of a row over the flags' values ("max_tokens", "stop", "temperature", ...).
SamplingParams row_sampling(const json& row, const RowDefaults& flags) {
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

}  // namespace

// Parses one data line into a Row (no model work). Errors: Error whose message says what is wrong.
Row parse_row(const std::string& text, std::size_t line, const std::string& data,
              const std::string& schema, const std::vector<pml::ModuleRef>& default_modules,
              const RowDefaults& flags, std::set<std::string>& unknown_seen,
              const std::function<void(const std::string&)>& warn) {
  const json j = server::parse_json_bounded(text, kMaxJsonDepth, "the line",
                                            " (deeper structures are not data for eval)");
  if (!j.is_object()) throw row_error("the line must be a JSON object");
  for (const auto& item : j.items()) {
    if (known_fields().count(item.key()) == 0 && unknown_seen.insert(item.key()).second) {
      std::string key = item.key().size() > 64 ? item.key().substr(0, 64) + "..." : item.key();
      if (warn) warn(fmt::format("{}:{}: field '{}' is not used by eval", data, line, key));
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
      // An engine may hold other schemas too (Python's Engine): a row runs against this run's.
      if (row.prompt.schema != schema) {
        const std::string named = row.prompt.schema.size() > 64
                                      ? row.prompt.schema.substr(0, 64) + "..."
                                      : row.prompt.schema;
        throw row_error("the PML prompt names schema '" + named + "', but this run evaluates '" +
                        schema + "'");
      }
      if (warn) {
        for (const auto& w : row.prompt.warnings) warn(w.render());
      }
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

}  // namespace promptcache::eval
