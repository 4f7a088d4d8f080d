// The bad-input catalogue's harness: run a case, require a promptcache::Error of the expected
// kind whose message names what it must (the file, line, element or tensor), and — for the
// engine-level cases — require that the same Engine then answers a good request exactly as it
// did before. PROMPTCACHE_CATALOGUE=FILE appends "| case | message |" rows to FILE: the table
// of docs/reliability.md is made from it.
#pragma once

#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "promptcache/engine.hpp"
#include "promptcache/error.hpp"
#include "support/catch_torch.hpp"
#include "support/test_support.hpp"
#include "support/tiny_model.hpp"

namespace promptcache::bad {

struct Expect {
  ErrorKind kind;
  std::vector<std::string> mentions;  // each must appear in what()
};

inline void record(const std::string& what, const std::string& message) {
  const char* path = std::getenv("PROMPTCACHE_CATALOGUE");
  if (path == nullptr) return;
  std::string cell = message;
  for (std::size_t i = 0; (i = cell.find('|', i)) != std::string::npos; i += 2) {
    cell.replace(i, 1, "\\|");
  }
  std::ofstream(path, std::ios::app) << "| " << what << " | `" << cell << "` |\n";
}

// Runs `run`, which must throw Error(expect.kind) naming every expected mention; returns it.
inline Error expect_error(const std::string& what, const std::function<void()>& run,
                          const Expect& expect) {
  INFO("case: " << what);
  try {
    run();
  } catch (const Error& e) {
    INFO("error: " << e.what());
    CHECK(to_string(e.kind()) == std::string(to_string(expect.kind)));
    for (const std::string& m : expect.mentions) CHECK_THAT(e.what(), Catch::Contains(m));
    record(what, e.what());
    return e;
  } catch (const std::exception& e) {
    FAIL("not a promptcache::Error: " << e.what());
  }
  FAIL("no error was thrown");
  return Error(ErrorKind::kIo, "unreachable");
}

// The schema and prompt every engine-level case checks the engine against afterwards.
inline const char* kGoodSchema = R"(<schema name="good">
  <system>You answer questions about a river.</system>
  <user>
    <module name="doc">The river flows from the mountains to the sea. It is long and cold.</module>
    <union scaffold="short">
      <module name="short">Answer briefly.</module>
      <module name="long">Answer in detail, with reasons.</module>
    </union>
    <module name="ask">Tell me about <parameter name="topic" length="8" scaffold="the topic"/>.</module>
  </user>
</schema>)";
inline const char* kGoodPrompt =
    R"(<prompt schema="good"><doc/><long/><ask topic="the sea"/><user>Where does it flow?</user></prompt>)";

inline SamplingParams greedy(int tokens = 5) {
  SamplingParams p;
  p.max_new_tokens = tokens;
  p.stop_at_eos = false;
  return p;
}

// A tiny engine with the good schema compiled, and its answer to the good prompt.
class EngineUnderTest {
 public:
  explicit EngineUnderTest(std::unique_ptr<Engine> engine = test::tiny_engine(5))
      : engine_(std::move(engine)) {
    engine_->add_schema_string(kGoodSchema, "good.xml");
    expected_ = engine_->generate_xml(kGoodPrompt, greedy());
    expected_fresh_ = engine_->generate_xml(kGoodPrompt, greedy(), {}, RequestOptions{false});
    REQUIRE(expected_.tokens.size() == 5);
    REQUIRE(expected_.cached_tokens > 0);
  }

  Engine& operator*() { return *engine_; }
  Engine* operator->() { return engine_.get(); }

  // The good prompt again, cached and not: the same tokens as before the bad input.
  void still_answers() {
    const Response cached = engine_->generate_xml(kGoodPrompt, greedy());
    CHECK(cached.tokens == expected_.tokens);
    CHECK(cached.text == expected_.text);
    const Response fresh = engine_->generate_xml(kGoodPrompt, greedy(), {}, RequestOptions{false});
    CHECK(fresh.tokens == expected_fresh_.tokens);
  }

  // A bad input through this engine: the error, then the good prompt still answered.
  Error expect(const std::string& what, const std::function<void(Engine&)>& run,
               const Expect& expect) {
    Error e = expect_error(
        what, [&] { run(*engine_); }, expect);
    still_answers();
    return e;
  }

 private:
  std::unique_ptr<Engine> engine_;
  Response expected_, expected_fresh_;
};

// Writes `text` to `path` (binary).
inline void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace promptcache::bad
