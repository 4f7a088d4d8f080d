// Resource limits (docs/reliability.md): inputs too large for the model are refused early with a
// clear Error — by their byte size before they are tokenized, by their declared size before
// anything is allocated — never an out-of-memory crash or a minutes-long hang.
#include "support/catch_torch.hpp"

#include <chrono>
#include <climits>
#include <filesystem>
#include <fstream>

#include "bad_inputs/bad_input.hpp"
#include "promptcache/pml/limits.hpp"

using namespace promptcache;
using bad::EngineUnderTest;
using bad::Expect;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t kMB = 1000 * 1000;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// MemAvailable from /proc/meminfo in bytes (0 when unknown).
std::uint64_t available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  std::uint64_t value = 0;
  std::string unit;
  while (in >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;
  }
  return 0;
}

// n bytes of prose: words and single spaces, as a document would be.
std::string prose(std::size_t n) {
  static const std::string sentence = "The river flows from the mountains to the sea. ";
  std::string out;
  out.reserve(n);
  while (out.size() + sentence.size() <= n) out += sentence;
  out.append(n - out.size(), 'x');
  return out;
}

// A bound on how long refusing any of these may take, sanitizers and a busy machine included;
// tokenizing 100 MB instead would take minutes.
constexpr double kQuickSeconds = 60;

}  // namespace

TEST_CASE("limits: the byte rule refuses only texts no tokenizer could fit", "[bad][limits]") {
  using pml::cannot_fit;
  using pml::kMaxBytesPerToken;
  // Exactly 256 bytes a position fits the rule; one byte more does not.
  CHECK_FALSE(cannot_fit(std::string(10 * kMaxBytesPerToken, 'a'), 10));
  CHECK(cannot_fit(std::string(10 * kMaxBytesPerToken + 1, 'a'), 10));
  // A whitespace run weighs one byte (SentencePiece folds it), so padding is not counted.
  std::string spaced(10 * kMaxBytesPerToken - 1, 'a');
  spaced += std::string(100000, ' ');
  CHECK_FALSE(cannot_fit(spaced, 10));
  CHECK(pml::text_weight("a  \n\t b   c") == 5);
  // Zero positions hold no text; an empty text fits anywhere.
  CHECK(cannot_fit("x", 0));
  CHECK_FALSE(cannot_fit("", 0));
  // The scan stops once the bound is passed: a huge count of positions does not overflow.
  CHECK_FALSE(cannot_fit("abc", std::numeric_limits<std::size_t>::max()));
  CHECK(pml::text_weight(std::string(1000, 'a'), 10) == 11);
  // And the rule is sound for the test tokenizer: its densest real text is far below the bound.
  auto tok = load_tokenizer(test::tiny_tokenizer_path());
  const std::string text = prose(20000) + "antidisestablishmentarianism";
  CHECK(text.size() < 8 * tok->encode(text).size());
}

TEST_CASE("limits: a 100 MB document is refused before it is tokenized", "[bad][limits]") {
  EngineUnderTest engine;
  const std::string document = prose(100 * kMB);

  // As module text inside the schema.
  {
    const std::string xml = "<schema name=\"good\">\n  Intro.\n  <module name=\"book\">" +
                            document + "</module>\n</schema>";
    const auto start = std::chrono::steady_clock::now();
    engine.expect("a 100 MB module text", [&](Engine& e) { e.add_schema_string(xml, "big.xml"); },
                  {ErrorKind::kContextOverflow,
                   {"big.xml:3:", "module 'book'", "100000000 bytes", "it was not tokenized"}});
    CHECK(seconds_since(start) < kQuickSeconds);
  }
  // As a src file.
  test::TempDir dir;
  bad::write_file(dir.file("book.txt"), document);
  bad::write_file(dir.file("src.xml"),
                  "<schema name=\"good\">\n  Intro.\n  <module name=\"book\" src=\"book.txt\"/>\n"
                  "</schema>");
  {
    const auto start = std::chrono::steady_clock::now();
    engine.expect("a 100 MB src file", [&](Engine& e) { e.add_schema_file(dir.file("src.xml")); },
                  {ErrorKind::kContextOverflow, {dir.file("src.xml") + ":3:", "module 'book'"}});
    CHECK(seconds_since(start) < kQuickSeconds);
  }
  // As an argument.
  {
    const std::string xml = "<prompt schema=\"good\">\n  <ask topic=\"" + document +
                            "\"/>\n  <user>Why?</user>\n</prompt>";
    const auto start = std::chrono::steady_clock::now();
    engine.expect(
        "a 100 MB argument",
        [&](Engine& e) { e.generate_xml(xml, bad::greedy(), {}, {}, "arg.xml"); },
        {ErrorKind::kArgumentTooLong,
         {"arg.xml:2:3:", "parameter 'topic'", "100000000 bytes", "parameter of 8 tokens"}});
    CHECK(seconds_since(start) < kQuickSeconds);
  }
  // As the prompt's own text.
  {
    const std::string xml =
        "<prompt schema=\"good\">\n  <doc/>\n  <user>" + document + "</user>\n</prompt>";
    const auto start = std::chrono::steady_clock::now();
    engine.expect(
        "a 100 MB prompt text",
        [&](Engine& e) { e.generate_xml(xml, bad::greedy(), {}, {}, "text.xml"); },
        {ErrorKind::kContextOverflow, {"text.xml:3:3:", "100000000 bytes", "not tokenized"}});
    CHECK(seconds_since(start) < kQuickSeconds);
  }
}

TEST_CASE("limits: a 1 GB argument is refused by its size", "[bad][limits]") {
  EngineUnderTest engine;
  // The rule at its limit value: the slot holds 8 tokens, so 8 x 256 bytes may be tried, one
  // byte more is refused without tokenizing.
  auto prompt_with = [](std::string value) {
    pml::Prompt p = pml::parse_prompt_string(bad::kGoodPrompt, "one-gb.xml");
    for (auto& ref : p.modules) {
      if (ref.name == "ask") ref.arguments.at(0).value = std::move(value);
    }
    return p;
  };
  const std::size_t limit = 8 * pml::kMaxBytesPerToken;
  engine.expect(
      "an argument one byte past the byte rule",
      [&](Engine& e) { e.generate(prompt_with(std::string(limit + 1, 'a')), bad::greedy()); },
      {ErrorKind::kArgumentTooLong, {"one-gb.xml:1:", "2049 bytes"}});
  // At the limit it is tokenized, and refused by its token count.
  engine.expect("an argument at the byte rule's limit",
                [&](Engine& e) { e.generate(prompt_with(prose(limit)), bad::greedy()); },
                {ErrorKind::kArgumentTooLong, {"reserves 8 tokens"}});

  // The real thing, where the machine has the memory for it (a 1 GiB string, made once).
  const std::uint64_t gib = std::uint64_t{1} << 30;
  if (available_memory() < 4 * gib) {
    WARN(
        "SKIPPED the 1 GiB argument: less than 4 GiB of memory available; the rule was tested "
        "at its limit above");
    return;
  }
  pml::Prompt huge = prompt_with(std::string(gib, 'a'));
  const auto start = std::chrono::steady_clock::now();
  engine.expect(
      "a 1 GiB argument", [&](Engine& e) { e.generate(huge, bad::greedy()); },
      {ErrorKind::kArgumentTooLong, {"one-gb.xml:1:", "1073741824 bytes", "parameter 'topic'"}});
  CHECK(seconds_since(start) < kQuickSeconds);
}

TEST_CASE("limits: absurd sizes are refused before anything is allocated", "[bad][limits]") {
  EngineUnderTest engine;
  // A parameter at the parser's limit, in a model of 2048 positions: refused before its slot of
  // a million placeholder ids is made.
  engine.expect(
      "a parameter of 1048576 positions",
      [&](Engine& e) {
        e.add_schema_string(
            "<schema name=\"good\">\n<module name=\"m\">Ask <parameter name=\"p\" "
            "length=\"1048576\"/></module>\n</schema>",
            "param.xml");
      },
      {ErrorKind::kContextOverflow, {"param.xml:2:", "parameter 'p'", "context (2048 positions)"}});
  engine.expect(
      "a parameter scaffold that could never fit its slot",
      [&](Engine& e) {
        e.add_schema_string(
            "<schema name=\"good\">\n<module name=\"m\">Ask <parameter name=\"p\" "
            "length=\"2\" scaffold=\"" +
                std::string(600, 'z') + "\"/></module>\n</schema>",
            "scaffold.xml");
      },
      {ErrorKind::kSchema, {"scaffold.xml:2:", "scaffold of 600 bytes", "could never fit"}});

  // A schema file of 1 GiB (sparse: no disk is used) is refused by its size, unread.
  test::TempDir dir;
  const std::string big = dir.file("huge.xml");
  bad::write_file(big, "<schema name=\"good\">");
  fs::resize_file(big, std::uint64_t{1} << 30);
  const auto start = std::chrono::steady_clock::now();
  engine.expect("a 1 GiB schema file", [&](Engine& e) { e.add_schema_file(big); },
                {ErrorKind::kInvalidArgument, {big, "1073741824 bytes", "256 MiB"}});
  CHECK(seconds_since(start) < 5);
  // The same for a prompt file and for a src file.
  bad::expect_error("a 1 GiB prompt file", [&] { pml::parse_prompt_file(big); },
                    {ErrorKind::kInvalidArgument, {big, "256 MiB"}});
  fs::rename(big, dir.file("huge.txt"));
  bad::write_file(dir.file("src.xml"),
                  "<schema name=\"good\">\n  <module name=\"doc\" src=\"huge.txt\"/>\n</schema>");
  engine.expect("a 1 GiB src file", [&](Engine& e) { e.add_schema_file(dir.file("src.xml")); },
                {ErrorKind::kInvalidArgument,
                 {dir.file("src.xml") + ":2:3:", "huge.txt", "256 MiB", "<module name=\"doc\">"}});

  // A src that is no regular file (/dev/zero never ends) is refused before it is read, even
  // where src may name any file (--allow-src-outside); it was a bad_alloc or a hang. A prompt
  // file that never ends is read in chunks up to the limit and refused there.
  if (fs::exists("/dev/zero") && available_memory() > (std::uint64_t{1} << 30)) {
    bad::write_file(
        dir.file("zero.xml"),
        "<schema name=\"good\">\n  <module name=\"doc\" src=\"/dev/zero\"/>\n</schema>");
    engine.expect(
        "a src that never ends (/dev/zero)",
        [&](Engine& e) {
          e.add_schema(pml::parse_schema_file(
              dir.file("zero.xml"),
              pml::RootedSrcFiles(dir.path().string(), pml::RootedSrcFiles::Scope::kAnywhere)));
        },
        {ErrorKind::kSchema, {dir.file("zero.xml") + ":2:3:", "/dev/zero", "not a regular file"}});
    bad::expect_error("a prompt file that never ends (/dev/zero)",
                      [&] { pml::parse_prompt_file("/dev/zero"); },
                      {ErrorKind::kInvalidArgument, {"/dev/zero", "256 MiB"}});
  }

  // An XML string over the limit, where there is memory to make one: refused before parsing.
  if (available_memory() > (std::uint64_t{2} << 30)) {
    const std::string xml(pml::kMaxSourceFileBytes + 1, ' ');
    bad::expect_error("an XML string over 256 MiB",
                      [&] { pml::parse_prompt_string(xml, "big-string.xml"); },
                      {ErrorKind::kInvalidArgument,
                       {"big-string.xml: invalid argument error", "268435457 bytes"}});
  }

  // max_new_tokens far past the context: the KV room reserved is capped at the context (an
  // uncapped reservation would be terabytes); decoding stops when asked to.
  SamplingParams endless = bad::greedy();
  endless.max_new_tokens = INT_MAX;
  int seen = 0;
  const Response r = engine->generate_xml(bad::kGoodPrompt, endless,
                                          [&](TokenId, const std::string&) { return ++seen < 3; });
  CHECK(r.tokens.size() == 3);
  CHECK(r.stop_reason == StopReason::kCallback);
  const auto batch =
      engine->generate_batch({pml::parse_prompt_string(bad::kGoodPrompt)}, endless,
                             [&](std::size_t, TokenId, const std::string&) { return false; });
  CHECK(batch.at(0).tokens.size() == 1);
  engine.still_answers();
}
