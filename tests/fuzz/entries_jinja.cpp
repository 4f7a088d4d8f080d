// Fuzz entry "chat_template": a Jinja chat template from a model file (tokenizer_config.json's
// chat_template, chat_template.jinja, GGUF's tokenizer.chat_template) -> jinja::Template::parse ->
// render on a fixed conversation, under small limits so that every input ends quickly. Only an
// Error (a syntax error, a failed or raising render, a limit reached) may come out.
#include <string>

#include "fuzz/fuzz_entries.hpp"
#include "promptcache/jinja/chat_source.hpp"

namespace promptcache::fuzz {

void chat_template_entry(const std::uint8_t* data, std::size_t size) {
  jinja::Limits limits;
  limits.max_template_bytes = 64 << 10;
  limits.max_nesting = 64;
  limits.max_output_bytes = 256 << 10;
  limits.max_steps = 200000;
  limits.max_call_depth = 20;
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi <b>there</b> \u00e9"},
    {"role": "assistant", "content": "<think>ok</think>Hello", "tool_calls": [
      {"id": "call12345", "type": "function",
       "function": {"name": "f", "arguments": {"a": [1, 2.5, null, true]}}}]},
    {"role": "tool", "tool_call_id": "call12345", "content": "42"},
    {"role": "user", "content": ""}])");
  jinja::ChatInputs inputs;
  inputs.messages = messages;
  inputs.tools = nlohmann::ordered_json::parse(
      R"([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])");
  inputs.add_generation_prompt = size % 2 == 0;
  inputs.extra.emplace_back("enable_thinking", jinja::Value(false));
  const jinja::ChatTemplateSource source = jinja::from_string(
      std::string(reinterpret_cast<const char*>(data), size), "fuzz.jinja", "<s>", "</s>");
  try {
    const std::string text = jinja::render_chat(source, inputs, limits);
    if (text.size() > limits.max_output_bytes) {
      throw InvariantViolation("a render longer than max_output_bytes");
    }
  } catch (const Error&) {
    // A clean refusal (RaisedError included).
  }
}

}  // namespace promptcache::fuzz
