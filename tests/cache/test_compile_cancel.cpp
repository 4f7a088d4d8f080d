// A compile stops at its next forward when its caller asks (Engine::add_schema's `cancelled`),
// and leaves the engine as it was: the old version of the schema, or none.
#include "support/catch_torch.hpp"

#include "support/tiny_model.hpp"

using namespace promptcache;

namespace {

// Enough text for several forwards of compile_chunk_tokens tokens each.
std::string long_schema(const std::string& name, const std::string& word) {
  std::string xml = "<schema name=\"" + name + "\"><module name=\"a\">";
  for (int i = 0; i < 60; ++i) xml += word + " went to the park and saw a dog. ";
  return xml + "</module><module name=\"b\">The end.</module></schema>";
}

}  // namespace

TEST_CASE("compile: cancelled before its third forward, it stops and changes nothing",
          "[cache][cancel]") {
  EngineOptions options;
  options.compile_chunk_tokens = 64;
  auto engine = test::tiny_engine(1, options);
  int asked = 0;
  const auto cancel_at_third = [&] { return ++asked >= 3; };
  try {
    engine->add_schema(pml::parse_schema_string(long_schema("s", "Tom")), {}, "",
                       Engine::StatesPolicy::kReuse, cancel_at_third);
    FAIL("the compile ran to its end");
  } catch (const Error& e) {
    CHECK(e.kind() == ErrorKind::kCancelled);
  }
  CHECK(asked == 3);  // asked before every forward, stopped at once
  CHECK_FALSE(engine->has_schema("s"));

  // An older version stays loaded and keeps answering as before.
  engine->add_schema(pml::parse_schema_string(long_schema("s", "Lily")));
  const int64_t before = static_cast<int64_t>(engine->layout("s").total_length);
  asked = 0;
  CHECK_THROWS_AS(engine->add_schema(pml::parse_schema_string(long_schema("s", "Benjamin")), {}, "",
                                     Engine::StatesPolicy::kReuse, cancel_at_third),
                  Error);
  REQUIRE(engine->has_schema("s"));
  CHECK(static_cast<int64_t>(engine->layout("s").total_length) == before);
  SamplingParams p;
  p.max_new_tokens = 2;
  CHECK_NOTHROW(engine->generate_xml("<prompt schema=\"s\"><a/> Who?</prompt>", p));

  // Never cancelled: the same compile finishes.
  asked = 0;
  engine->add_schema(pml::parse_schema_string(long_schema("s", "Benjamin")), {}, "",
                     Engine::StatesPolicy::kReuse, [&] { return ++asked < 0; });
  CHECK(asked > 3);
  CHECK(static_cast<int64_t>(engine->layout("s").total_length) != before);
}
