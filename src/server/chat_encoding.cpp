#include "chat_encoding.hpp"

#include <optional>

#include "promptcache/pml/source.hpp"

namespace promptcache::server {

std::vector<TokenId> encode_chat(const Tokenizer& tokenizer, const pml::ChatTemplate& tmpl,
                                 const std::vector<pml::Turn>& turns) {
  std::vector<TokenId> out;
  auto append = [&](const std::vector<TokenId>& ids) {
    out.insert(out.end(), ids.begin(), ids.end());
  };
  if (tokenizer.adds_bos()) out.push_back(tokenizer.bos_id());
  std::optional<pml::ChatRole> previous;
  for (const pml::Turn& turn : turns) {
    if (!turn.role) {
      append(pml::encode_span(tokenizer, turn.text));
      continue;
    }
    const pml::ChatRole prev = previous.value_or(pml::ChatRole::kUser);
    append(tmpl.encode(tokenizer, tmpl.open_text(*turn.role, previous ? &prev : nullptr)));
    append(pml::encode_span(tokenizer, turn.text));
    append(tmpl.encode(tokenizer, tmpl.role(*turn.role).close));
    previous = turn.role;
  }
  if (!turns.empty() && turns.back().role == pml::ChatRole::kUser) {
    append(tmpl.encode(tokenizer, tmpl.generation_prompt));
  }
  return out;
}

}  // namespace promptcache::server
