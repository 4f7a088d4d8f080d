// Derives PML's per-role open/close texts from a Jinja chat template by rendering it on probe
// conversations with sentinel contents and splitting the output at the sentinels.
#include "promptcache/jinja/derive.hpp"

#include <algorithm>

namespace promptcache::jinja {
namespace {

using ojson = nlohmann::ordered_json;

// Contents no template rewrites (no surrounding whitespace, no markup) and no template text has.
constexpr const char* kSystem = "PCSENTINELSYSTEM";
constexpr const char* kUser1 = "PCSENTINELUSERONE";
constexpr const char* kAssistant1 = "PCSENTINELASSISTANTONE";
constexpr const char* kUser2 = "PCSENTINELUSERTWO";
constexpr const char* kAssistant2 = "PCSENTINELASSISTANTTWO";
constexpr const char* kUser3 = "PCSENTINELUSERTHREE";

ojson message(const char* role, const char* content) {
  return ojson{{"role", role}, {"content", content}};
}

bool starts_with(const std::string& s, const std::string& p) {
  return s.compare(0, p.size(), p) == 0;
}
bool ends_with(const std::string& s, const std::string& p) {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

// The special-looking pieces of the texts: <...> and [...] tokens, plus bos/eos.
std::vector<std::string> special_pieces(const pml::ChatTemplate& t,
                                        const ChatTemplateSource& source) {
  std::vector<std::string> out;
  auto add = [&](const std::string& piece) {
    if (!piece.empty() && std::find(out.begin(), out.end(), piece) == out.end())
      out.push_back(piece);
  };
  if (source.bos_token) add(*source.bos_token);
  if (source.eos_token) add(*source.eos_token);
  for (const std::string* text :
       {&t.system.open, &t.system.close, &t.user.open, &t.user.close, &t.assistant.open,
        &t.assistant.close, &t.user_open_after_system, &t.generation_prompt}) {
    for (std::size_t i = 0; i < text->size(); ++i) {
      const char open = (*text)[i];
      if (open != '<' && open != '[') continue;
      const char close = open == '<' ? '>' : ']';
      const std::size_t end = text->find(close, i + 1);
      if (end == std::string::npos || end - i > 48) continue;
      const std::string piece = text->substr(i, end - i + 1);
      if (piece.find_first_of(" \n\t", 0) == std::string::npos) add(piece);
    }
  }
  return out;
}

}  // namespace

std::string render_with_pieces(const pml::ChatTemplate& chat, const ojson& messages,
                               bool add_generation_prompt) {
  std::string out;
  const pml::ChatRole* previous = nullptr;
  pml::ChatRole last{};
  for (const ojson& m : messages) {
    const std::string role = m.at("role").get<std::string>();
    const pml::ChatRole r =
        role == "system" ? pml::ChatRole::kSystem
        : role == "user" ? pml::ChatRole::kUser
        : role == "assistant"
            ? pml::ChatRole::kAssistant
            : throw Error(kTemplateError, "no PML chat tag for role '" + role + "'");
    out += chat.open_text(r, previous);
    out += m.at("content").get<std::string>();
    out += chat.role(r).close;
    last = r;
    previous = &last;
  }
  if (add_generation_prompt && previous != nullptr && last == pml::ChatRole::kUser) {
    out += chat.generation_prompt;
  }
  return out;
}

DerivedChatTemplate derive_chat_template(const ChatTemplateSource& source, const Limits& limits) {
  DerivedChatTemplate result;
  std::optional<Template> parsed;
  try {
    parsed = Template::parse(source.text, source.origin, limits);
  } catch (const Error& e) {
    result.reason = std::string("the template does not parse: ") + e.what();
    return result;
  }
  auto render = [&](const ojson& messages, bool generation) {
    ChatInputs inputs;
    inputs.messages = messages;
    inputs.add_generation_prompt = generation;
    std::string text = parsed->render(chat_variables(source, inputs));
    // The layout puts the BOS itself.
    if (source.bos_token && !source.bos_token->empty() && starts_with(text, *source.bos_token)) {
      text.erase(0, source.bos_token->size());
    }
    return text;
  };
  const ojson user_only = ojson::array({message("user", kUser1)});
  const ojson turns = ojson::array(
      {message("user", kUser1), message("assistant", kAssistant1), message("user", kUser2)});
  const ojson with_system = ojson::array({message("system", kSystem), message("user", kUser1)});
  const ojson long_system = ojson::array(
      {message("system", kSystem), message("user", kUser1), message("assistant", kAssistant1),
       message("user", kUser2), message("assistant", kAssistant2), message("user", kUser3)});
  const ojson long_plain = ojson::array({message("user", kUser1), message("assistant", kAssistant1),
                                         message("user", kUser2), message("assistant", kAssistant2),
                                         message("user", kUser3)});
  std::string b, d, c;
  try {
    b = render(user_only, false);
    d = render(user_only, true);
    c = render(turns, false);
  } catch (const Error& e) {
    result.reason = std::string("the template fails on a user/assistant conversation: ") + e.what();
    return result;
  }
  auto fail = [&](const std::string& why) {
    result.reason = "the template cannot be split into fixed texts per role: " + why;
    return result;
  };
  pml::ChatTemplate t;
  t.family = "jinja";
  const std::size_t u = b.find(kUser1);
  if (u == std::string::npos) return fail("a user's content does not appear in the text");
  t.user.open = b.substr(0, u);
  t.user.close = b.substr(u + std::string(kUser1).size());
  if (!starts_with(d, b)) return fail("add_generation_prompt changes the text before it");
  t.generation_prompt = d.substr(b.size());
  const std::size_t cu1 = c.find(kUser1), ca1 = c.find(kAssistant1), cu2 = c.find(kUser2);
  if (cu1 == std::string::npos || ca1 == std::string::npos || cu2 == std::string::npos ||
      !(cu1 < ca1 && ca1 < cu2)) {
    return fail("the turns of a conversation do not appear in order");
  }
  const std::string between_user_assistant =
      c.substr(cu1 + std::string(kUser1).size(), ca1 - cu1 - std::string(kUser1).size());
  const std::string between_assistant_user =
      c.substr(ca1 + std::string(kAssistant1).size(), cu2 - ca1 - std::string(kAssistant1).size());
  if (!starts_with(between_user_assistant, t.user.close)) {
    return fail("a user turn closes differently when an assistant turn follows");
  }
  t.assistant.open = between_user_assistant.substr(t.user.close.size());
  if (!ends_with(between_assistant_user, t.user.open)) {
    return fail("a user turn opens differently after an assistant turn");
  }
  t.assistant.close =
      between_assistant_user.substr(0, between_assistant_user.size() - t.user.open.size());
  // The system turn: its open text, and what comes between it and the user's content.
  std::string a;
  try {
    a = render(with_system, false);
  } catch (const Error& e) {
    result.reason = std::string("the template refuses a system turn: ") + e.what();
    return result;
  }
  const std::size_t as = a.find(kSystem), au = a.find(kUser1);
  if (as == std::string::npos || au == std::string::npos || as > au) {
    return fail("a system prompt does not appear before the user's turn");
  }
  t.system.open = a.substr(0, as);
  const std::string middle =
      a.substr(as + std::string(kSystem).size(), au - as - std::string(kSystem).size());
  if (ends_with(middle, t.user.open)) {
    t.system.close = middle.substr(0, middle.size() - t.user.open.size());
  } else {
    // Llama 2: the system prompt sits inside the first user block.
    t.system.close = middle;
    t.use_user_open_after_system = true;
    t.user_open_after_system.clear();
  }
  t.special_pieces = special_pieces(t, source);
  // Check: longer conversations, with and without the generation prompt, predicted exactly.
  for (const ojson* probe : {&user_only, &turns, &with_system, &long_system, &long_plain}) {
    for (bool generation : {false, true}) {
      std::string actual;
      try {
        actual = render(*probe, generation);
      } catch (const Error& e) {
        result.reason = std::string("the template fails on a probe conversation: ") + e.what();
        return result;
      }
      if (render_with_pieces(t, *probe, generation) != actual) {
        return fail("the text of a " + std::to_string(probe->size()) +
                    "-turn conversation depends on the turns' position (it differs from the "
                    "fixed texts)");
      }
    }
  }
  result.chat = std::move(t);
  return result;
}

}  // namespace promptcache::jinja
