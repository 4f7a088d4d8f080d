// promptcache/jinja/derive.hpp — a PML chat template (role open/close texts) derived from a
// model's Jinja chat template.
//
// PML wraps <system>, <user> and <assistant> in fixed texts per role (pml::ChatTemplate). A
// Jinja template is a program, but most render every turn the same way: the template is rendered
// on probe conversations whose contents are sentinels (system + user, user alone, user +
// assistant + user, with and without add_generation_prompt), the output is split at the
// sentinels into the RoleTemplate pieces, and the pieces are checked by predicting longer probe
// conversations and comparing with their real render. A template whose text depends on the
// turns' position or content (a system prompt folded into the last user turn, a default system
// prompt only when none is given, a role it refuses) cannot be split consistently: the result
// says why, and the caller keeps the hand-written family format. The bos_token the template
// writes first is left out (the layout's BOS). Contents are assumed to be passed through
// unchanged (templates that trim contents give the same text for contents without surrounding
// whitespace). No LibTorch.
#pragma once

#include <optional>
#include <string>

#include "promptcache/jinja/chat_source.hpp"
#include "promptcache/pml/chat_template.hpp"

namespace promptcache::jinja {

struct DerivedChatTemplate {
  std::optional<pml::ChatTemplate> chat;  // family "jinja", when the template splits consistently
  std::string reason;                     // else why not
};

DerivedChatTemplate derive_chat_template(const ChatTemplateSource& source,
                                         const Limits& limits = {});

// The chat template a model's PML chat tags and chat messages use, and where it came from:
// `requested` (--template: a family name, or "jinja" for the model's own template, which must
// then split), else the family config.json names (`configured`), else the model's Jinja template
// (`jinja_source` when given, else model_chat_template_source(model): a folder's or a GGUF
// file's) when it splits into role texts, else the family the tokenizer's special tokens or the
// architecture suggest (pml::choose_chat_template). `origin` says which, and why a Jinja template
// was not used. A template source without bos_token/eos_token gets the tokenizer's BOS/EOS
// pieces (a folder without tokenizer_config.json).
struct ModelChatTemplate {
  pml::ChatTemplate chat;
  std::string origin;
};
ModelChatTemplate model_chat_template(const std::filesystem::path& model,
                                      const std::string& requested, const std::string& configured,
                                      const Tokenizer& tokenizer,
                                      const std::string& architecture_default,
                                      const std::optional<ChatTemplateSource>& jinja_source = {});

// The text a derived (or hand-written) template gives a conversation of string contents, as PML
// renders chat tags: each turn's open text (user_open_after_system after a system turn), its
// content and close text, then the generation prompt when the last turn is a user's and
// `add_generation_prompt`. Roles other than system/user/assistant are an Error.
std::string render_with_pieces(const pml::ChatTemplate& chat,
                               const nlohmann::ordered_json& messages, bool add_generation_prompt);

}  // namespace promptcache::jinja
