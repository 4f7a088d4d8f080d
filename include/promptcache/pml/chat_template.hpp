// promptcache/pml/chat_template.hpp — what <system>, <user> and <assistant> become, per model
// family, as data.
//
// A template gives each role an opening and a closing text. The template's special pieces
// ("<s>", "<|im_start|>", ...) are cut out first and become their single vocabulary id
// (Tokenizer::piece_to_id); a special piece the vocabulary lacks is tokenized as ordinary text,
// so every template works with every tokenizer. The text between them is tokenized like any other
// span (source.hpp, encode_span) for SentencePiece tokenizers, and as written, newlines included,
// for byte-level BPE ones (Tokenizer::prefixes_space() false), whose chat formats (ChatML, Llama
// 3) depend on those newlines. Header-only, no LibTorch.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "promptcache/error.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "promptcache/pml/schema.hpp"
#include "promptcache/pml/source.hpp"

namespace promptcache::pml {

struct RoleTemplate {
  std::string open;   // text before the tag's content
  std::string close;  // text after it
};

struct ChatTemplate {
  std::string family;  // "llama-2", "chatml", "plain", or a user-defined name
  RoleTemplate system;
  RoleTemplate user;
  RoleTemplate assistant;
  // Llama-2 folds the system prompt into the first [INST] block: a <user> whose preceding chat
  // tag (in document order) is a <system> opens with this instead of user.open. Unused if
  // use_user_open_after_system is false.
  bool use_user_open_after_system = false;
  std::string user_open_after_system;
  // Appended after a prompt whose last turn is a <user> turn, so the model answers (like
  // HuggingFace's add_generation_prompt).
  std::string generation_prompt;
  // Put before the first chat tag (in document order) when that tag is not a <system>: the
  // system turn a template writes when the conversation has none (Qwen2.5's "You are Qwen...").
  std::string default_system;
  // Substrings of the texts above that are single vocabulary pieces, longest match first.
  std::vector<std::string> special_pieces;

  const RoleTemplate& role(ChatRole r) const {
    return r == ChatRole::kSystem ? system : r == ChatRole::kUser ? user : assistant;
  }
  // The opening text of role r, given the role of the chat tag before it (none: r is the first;
  // a first tag other than <system> opens with default_system).
  std::string open_text(ChatRole r, const ChatRole* previous) const {
    if (r == ChatRole::kUser && use_user_open_after_system && previous != nullptr &&
        *previous == ChatRole::kSystem) {
      return user_open_after_system;
    }
    if (previous == nullptr && r != ChatRole::kSystem) return default_system + role(r).open;
    return role(r).open;
  }

  // Tokens of one template text: special pieces become their ids, the text between them is
  // tokenized with encode_span (trimmed, no BOS; blank pieces give nothing).
  std::vector<TokenId> encode(const Tokenizer& tokenizer, std::string_view text) const {
    std::vector<TokenId> out;
    std::size_t plain_begin = 0, i = 0;
    const bool verbatim = !tokenizer.prefixes_space();
    auto flush = [&](std::size_t end) {
      const std::string_view plain = text.substr(plain_begin, end - plain_begin);
      auto ids = !verbatim       ? encode_span(tokenizer, plain)
                 : plain.empty() ? std::vector<TokenId>{}
                                 : tokenizer.encode(plain, /*add_bos=*/false);
      out.insert(out.end(), ids.begin(), ids.end());
    };
    while (i < text.size()) {
      const std::string* match = nullptr;
      for (const std::string& piece : special_pieces) {
        if (!piece.empty() && text.compare(i, piece.size(), piece) == 0 &&
            (match == nullptr || piece.size() > match->size())) {
          match = &piece;
        }
      }
      const TokenId id = match ? tokenizer.piece_to_id(*match) : -1;
      if (id < 0) {
        ++i;
        continue;
      }
      flush(i);
      out.push_back(id);
      i += match->size();
      plain_begin = i;
    }
    flush(text.size());
    return out;
  }
};

// Llama-2 chat: <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s><s>[INST]
// ... (The schema's leading <s> is the layout's BOS, not part of the template.)
inline ChatTemplate llama2_chat_template() {
  ChatTemplate t;
  t.family = "llama-2";
  t.system = {"[INST] <<SYS>>\n", "\n<</SYS>>\n\n"};
  t.user = {"[INST]", "[/INST]"};
  t.assistant = {"", "</s><s>"};
  t.use_user_open_after_system = true;
  t.user_open_after_system = "";
  t.special_pieces = {"<s>", "</s>"};
  return t;
}

// ChatML (Qwen, many fine-tunes): <|im_start|>role\n{content}<|im_end|>\n
inline ChatTemplate chatml_template() {
  ChatTemplate t;
  t.family = "chatml";
  t.system = {"<|im_start|>system\n", "<|im_end|>\n"};
  t.user = {"<|im_start|>user\n", "<|im_end|>\n"};
  t.assistant = {"<|im_start|>assistant\n", "<|im_end|>\n"};
  t.generation_prompt = "<|im_start|>assistant\n";
  t.special_pieces = {"<|im_start|>", "<|im_end|>", "<s>", "</s>"};
  return t;
}

// Llama 3.x: <|start_header_id|>role<|end_header_id|>\n\n{content}<|eot_id|> (the schema's
// leading <|begin_of_text|> is the layout's BOS).
inline ChatTemplate llama3_chat_template() {
  ChatTemplate t;
  t.family = "llama-3";
  auto header = [](const char* role) {
    return std::string("<|start_header_id|>") + role + "<|end_header_id|>\n\n";
  };
  t.system = {header("system"), "<|eot_id|>"};
  t.user = {header("user"), "<|eot_id|>"};
  t.assistant = {header("assistant"), "<|eot_id|>"};
  t.generation_prompt = header("assistant");
  t.special_pieces = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                      "<|eot_id|>"};
  return t;
}

// Mistral instruct: [INST] {user} [/INST]{assistant}</s>[INST] ... A system prompt goes at the
// start of the first [INST] block, before the user's text, as Mistral's own templates put it.
inline ChatTemplate mistral_chat_template() {
  ChatTemplate t;
  t.family = "mistral";
  t.system = {"[INST] ", "\n\n"};
  t.user = {"[INST]", "[/INST]"};
  t.assistant = {"", "</s>"};
  t.use_user_open_after_system = true;
  t.user_open_after_system = "";
  t.special_pieces = {"<s>", "</s>", "[INST]", "[/INST]"};
  return t;
}

// No template: chat tags are transparent, only their content remains.
inline ChatTemplate plain_template() {
  ChatTemplate t;
  t.family = "plain";
  return t;
}

// The built-in families, in a stable order.
inline std::vector<std::string> chat_template_families() {
  return {"llama-2", "llama-3", "mistral", "chatml", "plain"};
}

// The built-in template of a family ("llama-2" also answers to "llama2"). Error(kInvalidArgument)
// listing the families when the name is unknown.
inline ChatTemplate chat_template(const std::string& family) {
  if (family == "llama-2" || family == "llama2") return llama2_chat_template();
  if (family == "llama-3" || family == "llama3") return llama3_chat_template();
  if (family == "mistral") return mistral_chat_template();
  if (family == "chatml" || family == "qwen") return chatml_template();
  if (family == "plain" || family.empty()) return plain_template();
  std::string known;
  for (const auto& f : chat_template_families()) known += (known.empty() ? "" : ", ") + f;
  throw Error(ErrorKind::kInvalidArgument,
              "unknown chat template family '" + family + "' (known: " + known + ")");
}

// The family a model's chat tags use: `requested` (a --template flag) if given, else what the
// model's config.json names (`configured`), else what the tokenizer's special tokens show
// (<|start_header_id|>: llama-3, <|im_start|>: chatml), else the architecture's default
// (`architecture_default`, ModelConfig::default_chat_template).
inline std::string choose_chat_template(const std::string& requested, const std::string& configured,
                                        const Tokenizer& tokenizer,
                                        const std::string& architecture_default) {
  if (!requested.empty()) return requested;
  if (!configured.empty()) return configured;
  if (tokenizer.piece_to_id("<|start_header_id|>") >= 0) return "llama-3";
  if (tokenizer.piece_to_id("<|im_start|>") >= 0) return "chatml";
  return architecture_default;
}

}  // namespace promptcache::pml
