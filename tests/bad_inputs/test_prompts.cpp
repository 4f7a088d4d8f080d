// Bad prompts sent to a working Engine: each is refused with its kind, file, line and element,
// and the next good prompt gets the same answer as before.
#include "support/catch_torch.hpp"

#include "bad_inputs/bad_input.hpp"

using namespace promptcache;
using bad::EngineUnderTest;
using bad::Expect;

namespace {
struct PromptCase {
  const char* what;
  std::string xml;
  Expect expect;
};
}  // namespace

TEST_CASE("bad prompts: refused with kind, file, line and element, and the engine carries on",
          "[bad][prompt]") {
  EngineUnderTest engine;
  const std::vector<PromptCase> cases = {
      {"malformed XML: an unclosed reference",
       "<prompt schema=\"good\">\n  <doc>\n</prompt>",
       {ErrorKind::kXmlSyntax, {"p.xml:3:3:", "mismatch", "</prompt>"}}},
      {"malformed XML: an attribute without a value",
       "<prompt schema=\"good\">\n  <ask topic>\n</prompt>",
       {ErrorKind::kXmlSyntax, {"p.xml:2:"}}},
      {"an empty prompt", "", {ErrorKind::kXmlSyntax, {"p.xml:1:1:", "No document element found"}}},
      {"no schema attribute",
       "<prompt>\n  Hi\n</prompt>",
       {ErrorKind::kPrompt, {"p.xml:1:1:", "needs a schema attribute", "<prompt>"}}},
      {"the top element is not <prompt>",
       "<schema name=\"good\">x</schema>",
       {ErrorKind::kPrompt, {"p.xml:1:1:", "must be <prompt>"}}},
      {"an unknown schema",
       "<prompt schema=\"other\">\n  Hi\n</prompt>",
       {ErrorKind::kUnknownSchema, {"p.xml:1:1:", "'other'", "loaded: 'good'"}}},
      {"an unknown module",
       "<prompt schema=\"good\">\n  <doc/>\n  <nowhere/>\n  Hi\n</prompt>",
       {ErrorKind::kUnknownModule,
        {"p.xml:3:3:", "no module 'nowhere'", "it has: doc", "<nowhere>"}}},
      {"a module that is not in the referenced scope",
       "<prompt schema=\"good\">\n  <doc>\n    <short/>\n  </doc>\n</prompt>",
       {ErrorKind::kUnknownModule, {"p.xml:3:5:", "module 'doc' has no module 'short'"}}},
      {"an unknown parameter",
       "<prompt schema=\"good\">\n  <ask subject=\"x\"/>\n</prompt>",
       {ErrorKind::kUnknownParameter, {"p.xml:2:3:", "no parameter 'subject'", "it has: topic"}}},
      {"two members of one union",
       "<prompt schema=\"good\">\n  <short/>\n  <long/>\n</prompt>",
       {ErrorKind::kUnionConflict, {"p.xml:3:3:", "'short' and 'long'", "<long>"}}},
      {"an argument longer than its parameter",
       "<prompt schema=\"good\">\n  <ask topic=\"one two three four five six seven eight nine ten "
       "eleven twelve\"/>\n</prompt>",
       {ErrorKind::kArgumentTooLong, {"p.xml:2:3:", "parameter 'topic'", "reserves 8 tokens"}}},
      {"text between module references",
       "<prompt schema=\"good\">\n  <doc/>\n  some text\n  <ask/>\n</prompt>",
       {ErrorKind::kPrompt, {"p.xml:4:3:", "after the prompt's text", "<ask>"}}},
      {"text inside a module reference",
       "<prompt schema=\"good\">\n  <doc>\n    words\n  </doc>\n</prompt>",
       {ErrorKind::kPrompt, {"p.xml:2:", "text inside module reference <doc>"}}},
      {"an element inside a turn",
       "<prompt schema=\"good\">\n  <user>\n    hi <doc/>\n  </user>\n</prompt>",
       {ErrorKind::kPrompt, {"p.xml:3:8:", "inside a <user> turn"}}},
      {"a turn with attributes",
       "<prompt schema=\"good\">\n  <user x=\"1\">hi</user>\n</prompt>",
       {ErrorKind::kPrompt, {"p.xml:2:3:", "takes no attributes"}}},
      {"a module referenced twice",
       "<prompt schema=\"good\">\n  <doc/>\n  <doc/>\n</prompt>",
       {ErrorKind::kPrompt, {"p.xml:3:3:", "referenced twice"}}},
      {"an unknown attribute on <prompt>",
       "<prompt schema=\"good\" model=\"x\">\n  Hi\n</prompt>",
       {ErrorKind::kPrompt, {"p.xml:1:1:", "unknown attribute 'model'"}}},
  };
  for (const PromptCase& c : cases) {
    engine.expect(
        c.what, [&](Engine& e) { e.generate_xml(c.xml, bad::greedy(), {}, {}, "p.xml"); },
        c.expect);
  }
  // The same refusals for a batch, which must not leave a half-made batch behind.
  engine.expect("a batch with one bad prompt",
                [&](Engine& e) {
                  e.generate_batch(
                      {pml::parse_prompt_string(bad::kGoodPrompt),
                       pml::parse_prompt_string("<prompt schema=\"good\"><short/><long/></prompt>",
                                                "batch.xml")},
                      bad::greedy());
                },
                {ErrorKind::kUnionConflict, {"batch.xml:1:"}});
  // Bad sampling values are refused before anything runs.
  SamplingParams nan_temperature = bad::greedy();
  nan_temperature.temperature = std::numeric_limits<float>::quiet_NaN();
  engine.expect(
      "a temperature that is not a number",
      [&](Engine& e) { e.generate_xml(bad::kGoodPrompt, nan_temperature); },
      {ErrorKind::kInvalidArgument, {"temperature must be a finite number >= 0, not nan"}});
  SamplingParams negative = bad::greedy();
  negative.max_new_tokens = -1;
  engine.expect("max_new_tokens = -1",
                [&](Engine& e) { e.generate_xml(bad::kGoodPrompt, negative); },
                {ErrorKind::kInvalidArgument, {"max new tokens"}});
  // A prompt whose text cannot fit in what is left of the context.
  std::string long_text = "<prompt schema=\"good\">\n  <doc/>\n  <user>";
  for (int i = 0; i < 800; ++i) long_text += "the cat sat on the mat. ";
  long_text += "</user>\n</prompt>";
  engine.expect(
      "a prompt text longer than the context",
      [&](Engine& e) { e.generate_xml(long_text, bad::greedy(), {}, {}, "long.xml"); },
      {ErrorKind::kContextOverflow,
       {"long.xml:1:1:", "the prompt needs positions up to", "context is 2048", "(in <prompt>)"}});
}
