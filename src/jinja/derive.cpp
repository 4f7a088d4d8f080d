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
        &t.assistant.close, &t.user_open_after_system, &t.generation_prompt, &t.default_system}) {
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
  // Each probe's render (without the layout's BOS), or nullopt when the template raises on it.
  auto try_render = [&](const ojson& messages, bool generation) -> std::optional<std::string> {
    try {
      return render(messages, generation);
    } catch (const Error&) {
      return std::nullopt;
    }
  };
  auto check = [&](const pml::ChatTemplate& t) -> std::string {
    for (const ojson* probe : {&user_only, &turns, &with_system, &long_system, &long_plain}) {
      for (bool generation : {false, true}) {
        std::string actual;
        try {
          actual = render(*probe, generation);
        } catch (const Error& e) {
          return std::string("the template fails on a probe conversation: ") + e.what();
        }
        if (render_with_pieces(t, *probe, generation) != actual) {
          return "the template cannot be split into fixed texts per role: the text of a " +
                 std::to_string(probe->size()) +
                 "-turn conversation depends on the turns' position (it differs from the fixed "
                 "texts)";
        }
      }
    }
    return {};
  };
  // The second way to split, for templates that write a system turn of their own when the
  // conversation has none (Qwen2.5): every text is read from conversations that have a system
  // turn (each turn's close text is what follows it when it is last), and the user-alone render
  // gives the default system turn, the text before the user's opening.
  auto derive_default_system = [&]() -> std::optional<pml::ChatTemplate> {
    const ojson system_assistant = ojson::array(
        {message("system", kSystem), message("user", kUser1), message("assistant", kAssistant1)});
    const ojson system_turns =
        ojson::array({message("system", kSystem), message("user", kUser1),
                      message("assistant", kAssistant1), message("user", kUser2)});
    const auto a = try_render(with_system, false), ag = try_render(with_system, true);
    const auto f = try_render(system_assistant, false), e = try_render(system_turns, false);
    const auto b = try_render(user_only, false);
    if (!a || !ag || !f || !e || !b) return std::nullopt;
    const std::string S = kSystem, U1 = kUser1, A1 = kAssistant1, U2 = kUser2;
    const std::size_t as = a->find(S), au = a->find(U1);
    const std::size_t es = e->find(S), eu1 = e->find(U1), ea1 = e->find(A1), eu2 = e->find(U2);
    const std::size_t fa = f->find(A1), bu = b->find(U1);
    if (as == std::string::npos || au == std::string::npos || as > au || fa == std::string::npos ||
        bu == std::string::npos || es == std::string::npos || eu1 == std::string::npos ||
        ea1 == std::string::npos || eu2 == std::string::npos ||
        !(es < eu1 && eu1 < ea1 && ea1 < eu2)) {
      return std::nullopt;
    }
    pml::ChatTemplate t;
    t.family = "jinja";
    t.system.open = a->substr(0, as);
    t.user.close = a->substr(au + U1.size());
    t.assistant.close = f->substr(fa + A1.size());
    if (!starts_with(*ag, *a)) return std::nullopt;
    t.generation_prompt = ag->substr(a->size());
    const std::string user_to_assistant = e->substr(eu1 + U1.size(), ea1 - eu1 - U1.size());
    const std::string assistant_to_user = e->substr(ea1 + A1.size(), eu2 - ea1 - A1.size());
    if (!starts_with(user_to_assistant, t.user.close) ||
        !starts_with(assistant_to_user, t.assistant.close)) {
      return std::nullopt;
    }
    t.assistant.open = user_to_assistant.substr(t.user.close.size());
    t.user.open = assistant_to_user.substr(t.assistant.close.size());
    const std::string middle = a->substr(as + S.size(), au - as - S.size());
    const std::string before_user = b->substr(0, bu);
    if (!ends_with(middle, t.user.open) || !ends_with(before_user, t.user.open)) {
      return std::nullopt;
    }
    t.system.close = middle.substr(0, middle.size() - t.user.open.size());
    t.default_system = before_user.substr(0, before_user.size() - t.user.open.size());
    t.special_pieces = special_pieces(t, source);
    if (!check(t).empty()) return std::nullopt;
    return t;
  };
  // The first way (below) failed: the second, else the first's reason.
  auto fallback = [&](std::string reason) {
    if (auto t = derive_default_system()) {
      result.chat = std::move(*t);
      return result;
    }
    result.reason = std::move(reason);
    return result;
  };
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
    return fallback("the template cannot be split into fixed texts per role: " + why);
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
    return fallback(std::string("the template refuses a system turn: ") + e.what());
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
  if (std::string why = check(t); !why.empty()) return fallback(why);
  result.chat = std::move(t);
  return result;
}

ModelChatTemplate model_chat_template(const std::filesystem::path& model,
                                      const std::string& requested, const std::string& configured,
                                      const Tokenizer& tokenizer,
                                      const std::string& architecture_default,
                                      const std::optional<ChatTemplateSource>& jinja_source) {
  ModelChatTemplate out;
  const bool want_jinja = requested == "jinja";
  if (!requested.empty() && !want_jinja) {
    out.chat = pml::chat_template(requested);
    out.origin = "--template " + requested;
    return out;
  }
  if (!want_jinja && !configured.empty()) {
    out.chat = pml::chat_template(configured);
    out.origin = "config.json promptcache_chat_template";
    return out;
  }
  std::optional<ChatTemplateSource> source = jinja_source;
  std::string why_not;
  if (!source && !model.empty()) {
    try {
      source = model_chat_template_source(model);
    } catch (const Error& e) {
      // A malformed template field does not keep the model from loading with a family's texts.
      if (want_jinja) throw;
      why_not = std::string("its chat template could not be read: ") + e.what();
    }
  }
  if (source) {
    // A folder without tokenizer_config.json's tokens: the tokenizer's own BOS/EOS pieces, as HF's
    // tokenizer has them from its special tokens.
    if (!source->bos_token && tokenizer.bos_id() >= 0) {
      source->bos_token = tokenizer.id_to_piece(tokenizer.bos_id());
    }
    if (!source->eos_token && tokenizer.eos_id() >= 0) {
      source->eos_token = tokenizer.id_to_piece(tokenizer.eos_id());
    }
    DerivedChatTemplate derived = derive_chat_template(*source);
    if (derived.chat) {
      out.chat = std::move(*derived.chat);
      out.origin = source->origin;
      return out;
    }
    why_not = source->origin + ": " + derived.reason;
  } else if (why_not.empty()) {
    why_not = "the model has no Jinja chat template";
  }
  if (want_jinja) throw Error(kTemplateError, "--template jinja: " + why_not);
  const std::string family = pml::choose_chat_template("", "", tokenizer, architecture_default);
  out.chat = pml::chat_template(family);
  out.origin = "family " + family + " (" + why_not + ")";
  return out;
}

}  // namespace promptcache::jinja
