// promptcache/eval.hpp, the evaluation `promptcache eval` and Python's Engine.eval share: a
// batch stopped by its `cancelled` hook writes none of its rows and throws Error(kCancelled); a
// second run on the same results file runs the rest, each id once; bad lines are events of
// their own and the rows around them are answered.
#include "support/catch_torch.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "promptcache/eval.hpp"
#include "support/test_support.hpp"
#include "support/tiny_model.hpp"

using namespace promptcache;

namespace {

const char* kSchema =
    "<schema name=\"q\"><module name=\"rules\">Answer the question about the trip.</module>"
    "<module name=\"shots\">Q: Where is the hotel? A: near the sea.</module></schema>";

std::string row(int id, int max_tokens) {
  return nlohmann::json{{"id", id},
                        {"prompt", "Q: question " + std::to_string(id) + "? A:"},
                        {"max_tokens", max_tokens}}
      .dump();
}

std::vector<nlohmann::json> ids_in(const std::string& path) {
  std::vector<nlohmann::json> ids;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) ids.push_back(nlohmann::json::parse(line)["id"]);
  return ids;
}

}  // namespace

TEST_CASE("eval: a cancelled batch writes none of its rows, and a rerun runs the rest once",
          "[eval][cancel]") {
  auto engine = test::tiny_engine();
  engine->add_schema(pml::parse_schema_string(kSchema));
  test::TempDir dir("promptcache-eval");
  const std::string out = (dir.path() / "r.jsonl").string();
  int tokens = 0;
  eval::EvalOptions options;
  options.batch = 4;
  // Stop in the second batch's generation (its 4 rows generate 8 tokens each at most).
  options.cancelled = [&] { return ++tokens > 45; };
  {
    eval::Evaluation run(*engine, "q", "d.jsonl", out, options);
    int line = 0;
    try {
      for (; line < 12; ++line) run.add_line(row(line, 8), static_cast<std::size_t>(line + 1));
      FAIL("the run was not cancelled");
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::kCancelled);
    }
    CHECK(line == 7);  // the line that filled the second batch
    const auto events = run.take_events();
    REQUIRE(events.size() == 4);
    for (const auto& e : events) CHECK(e.outcome.has_value());
  }
  CHECK(ids_in(out) == std::vector<nlohmann::json>{0, 1, 2, 3});

  options.cancelled = {};
  eval::Evaluation rerun(*engine, "q", "d.jsonl", out, options);
  for (int line = 0; line < 12; ++line) {
    rerun.add_line(row(line, 8), static_cast<std::size_t>(line + 1));
  }
  rerun.flush();
  CHECK(rerun.totals().resumed == 4);
  CHECK(rerun.totals().rows == 8);
  const auto ids = ids_in(out);
  CHECK(ids.size() == 12);
  CHECK(std::set<nlohmann::json>(ids.begin(), ids.end()).size() == 12);
}

TEST_CASE("eval: bad lines are error events between the answered rows", "[eval]") {
  auto engine = test::tiny_engine();
  engine->add_schema(pml::parse_schema_string(kSchema));
  eval::EvalOptions options;
  options.batch = 1;
  std::vector<std::string> warnings;
  options.warn = [&](const std::string& w) { warnings.push_back(w); };
  eval::Evaluation run(*engine, "q", "d.jsonl", "", options);
  run.add_line(row(1, 2), 1);
  run.add_line("{\"id\": 2, \"prompt\": \"x\", \"modules\": [\"nope\"]}", 2);
  run.add_line("   ", 3);  // blank: no row, no error
  run.add_line("{\"id\": 4, \"prompt\": \"x\", \"choices\": [\"a\", \"b\"], \"extra\": 1}", 4);
  run.add_line("not json", 5);
  run.flush();
  const auto events = run.take_events();
  REQUIRE(events.size() == 4);
  CHECK(events[0].outcome);
  CHECK(events[1].error.rfind("d.jsonl:2: ", 0) == 0);
  CHECK(events[1].error.find("nope") != std::string::npos);
  REQUIRE(events[2].outcome);
  CHECK(events[2].outcome->line["choices"].size() == 2);
  CHECK(events[3].error.rfind("d.jsonl:5: the line is not valid JSON", 0) == 0);
  CHECK(run.totals().rows == 2);
  CHECK(run.totals().failed == 2);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0] == "d.jsonl:4: field 'extra' is not used by eval");
}
