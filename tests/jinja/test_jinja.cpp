// The Jinja interpreter on its own: Python semantics the real templates depend on, errors that
// name the template line, and the limits that stop a hostile template (deep nesting, recursion,
// huge loops, huge output) with an error instead of a crash or a hang. The byte-for-byte
// comparison with python3-jinja2 on real templates is compare_reference.py (jinja_reference).
#include "support/catch.hpp"

#include <string>

#include "promptcache/jinja/chat_source.hpp"
#include "promptcache/jinja/template.hpp"

using namespace promptcache;
using namespace promptcache::jinja;

namespace {

std::string render(const std::string& source,
                   const std::vector<std::pair<std::string, Value>>& vars = {},
                   const Limits& limits = {}) {
  return Template::parse(source, "t.jinja", limits).render(vars);
}

// The Error a render throws (parse or render), or fails the test.
Error render_error(const std::string& source, const Limits& limits = {}) {
  try {
    render(source, {}, limits);
  } catch (const Error& e) {
    return e;
  }
  FAIL("expected an error from: " << source);
  throw std::logic_error("unreachable");
}

}  // namespace

TEST_CASE("jinja renders text, expressions and Python's printing of values", "[jinja]") {
  CHECK(render("Hello {{ name }}!", {{"name", Value("Ann")}}) == "Hello Ann!");
  CHECK(render("{{ 7 / 2 }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 2 ** 8 }} {{ 0.1 + 0.2 }}") ==
        "3.5 3 2 256 0.30000000000000004");
  CHECK(render("{{ [1, 'a', none, true] }} {{ {'k': [1.0]} }} {{ (1,) }}") ==
        "[1, 'a', None, True] {'k': [1.0]} (1,)");
  CHECK(render("{{ missing }}|{{ missing is defined }}|{{ none }}") == "|False|None");
  CHECK(render("{{ 'héllo'[::-1] }} {{ 'héllo'[1] }} {{ 'héllo' | length }}") == "olléh é 5");
  CHECK(float_repr(1e16) == "1e+16");
  CHECK(float_repr(123.456) == "123.456");
  CHECK(float_repr(1e-5) == "1e-05");
}

TEST_CASE("jinja applies HF's whitespace rules (trim_blocks, lstrip_blocks, - and +)", "[jinja]") {
  CHECK(render("  {% if true %}\nyes\n  {% endif %}\nend") == "yes\nend");
  CHECK(render("a  {%- if true -%}  b  {%- endif %}") == "ab");
  CHECK(render("  {%+ if true %}x{% endif %}") == "  x");
  CHECK(render("{% if true +%}\nx{% endif %}") == "\nx");
  CHECK(render("line\n") == "line");  // one trailing newline dropped
  CHECK(render("a {# note #} b") == "a  b");
}

TEST_CASE("jinja statements: loops, scoping, namespace, macros, call and filter blocks",
          "[jinja]") {
  CHECK(
      render("{% for x in 'abc' %}{{ loop.index }}{{ x }}{{ ',' if not loop.last }}{% endfor %}") ==
      "1a,2b,3c");
  CHECK(render("{% set v = 1 %}{% for i in [1] %}{% set v = 2 %}{% endfor %}{{ v }}") == "1");
  CHECK(render("{% set ns = namespace(v=1) %}{% for i in [1] %}{% set ns.v = 2 %}{% endfor %}"
               "{{ ns.v }}") == "2");
  CHECK(render("{% macro m(a, b='B') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(2, b=3) }}") ==
        "1B23");
  CHECK(render("{% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}in{% endcall %}") ==
        "[in]");
  CHECK(render("{% filter upper %}abc{% endfilter %}") == "ABC");
  CHECK(render("{% for i in range(9) %}{% if i > 2 %}{% break %}{% endif %}{{ i }}{% endfor %}") ==
        "012");
}

TEST_CASE("jinja tojson writes like json.dumps(ensure_ascii=False)", "[jinja]") {
  Value v = value_from_json(
      nlohmann::ordered_json::parse(R"({"z": 1, "a": [true, null, 1.5, "é\n\"q\""], "e": {}})"));
  CHECK(render("{{ v | tojson }}", {{"v", v}}) ==
        R"({"z": 1, "a": [true, null, 1.5, "é\n\"q\""], "e": {}})");
  CHECK(render("{{ v.a | tojson(indent=2) }}", {{"v", v}}) ==
        "[\n  true,\n  null,\n  1.5,\n  \"é\\n\\\"q\\\"\"\n]");
}

TEST_CASE("jinja string escapes of hex and Unicode code points write UTF-8", "[jinja]") {
  CHECK(render(R"({{ '\x41\u00e9\u20ac\U0001F600' }})") == "A\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
}

TEST_CASE("jinja raise_exception carries the template's own message and line", "[jinja]") {
  try {
    render("line one\n{% if true %}\n{{ raise_exception('Roles must alternate') }}\n{% endif %}");
    FAIL("no exception");
  } catch (const RaisedError& e) {
    CHECK(e.message() == "Roles must alternate");
    CHECK(e.where().file == "t.jinja");
    CHECK(e.where().line == 3);
  }
}

TEST_CASE("jinja syntax and render errors name the template line, column and construct",
          "[jinja]") {
  Error e = render_error("ok\n{% if x %}\nno end");
  CHECK(e.where().file == "t.jinja");
  CHECK_THAT(e.message(), Catch::Contains("endif"));

  e = render_error("a\nb\n{{ 1 + }}");
  CHECK(e.where().line == 3);
  CHECK(e.where().column > 0);

  e = render_error("\n\n\n{{ 'x' | no_such_filter }}");
  CHECK(e.where().line == 4);
  CHECK_THAT(e.message(), Catch::Contains("no_such_filter"));

  e = render_error("{% frobnicate %}");
  CHECK_THAT(e.message(), Catch::Contains("unknown tag 'frobnicate'"));

  e = render_error("{{ undefined_thing.attr }}");
  CHECK_THAT(e.message(), Catch::Contains("'undefined_thing' is undefined"));

  e = render_error("{{ 1 + 'a' }}");
  CHECK_THAT(e.message(), Catch::Contains("unsupported operand"));

  e = render_error("{{ 'unterminated }}");
  CHECK_THAT(e.message(), Catch::Contains("unterminated string"));

  e = render_error("{% for x in [1] %}{% endif %}");
  CHECK(e.where().line == 1);
}

TEST_CASE("jinja keeps HF's immutable sandbox: lists and dicts cannot be changed", "[jinja]") {
  Error e = render_error("{% set l = [1] %}{{ l.append(2) }}");
  CHECK_THAT(e.message(),
             Catch::Contains("access to attribute 'append' of 'list' object is unsafe"));
  e = render_error("{% set d = {} %}{{ d.update({'a': 1}) }}");
  CHECK_THAT(e.message(), Catch::Contains("unsafe"));
  e = render_error("{{ range(100001) | length }}");
  CHECK_THAT(e.message(), Catch::Contains("MAX_RANGE"));
}

TEST_CASE("jinja stops hostile templates: nesting, recursion, work and output limits",
          "[jinja][limits]") {
  // Nesting deeper than the parser allows: an error, not a stack overflow.
  std::string deep;
  for (int i = 0; i < 5000; ++i) deep += "{% if true %}";
  CHECK_THAT(render_error(deep).message(), Catch::Contains("nests deeper"));
  const std::string parens = std::string(5000, '(') + "1" + std::string(5000, ')');
  CHECK_THAT(render_error("{{ " + parens + " }}").message(), Catch::Contains("nests deeper"));
  CHECK_THAT(render_error("{{ " + std::string(100000, '(') + " }}").message(),
             Catch::Contains("unexpected '}'"));
  std::string nots;
  for (int i = 0; i < 50000; ++i) nots += "not ";
  CHECK_THAT(render_error("{{ " + nots + "1 }}").message(), Catch::Contains("nests deeper"));
  std::string filters = "{{ 'x'";
  for (int i = 0; i < 50000; ++i) filters += "|trim";
  // A chain of filters is a loop in the parser but a nested tree: evaluation must be bounded.
  Limits small;
  small.max_nesting = 100;
  const Error chain = render_error(filters + " }}", small);
  CHECK_THAT(chain.message(), Catch::Contains("nests deeper"));

  // Unbounded macro recursion.
  const Error rec = render_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}");
  CHECK_THAT(rec.message(), Catch::Contains("calls nest deeper"));

  // Work: nested loops far beyond the budget end with an error.
  Limits limits;
  limits.max_steps = 100000;
  const Error work = render_error(
      "{% for a in range(1000) %}{% for b in range(1000) %}{% endfor %}{% endfor %}", limits);
  CHECK_THAT(work.message(), Catch::Contains("steps of work"));

  // Output.
  limits = Limits{};
  limits.max_output_bytes = 1000;
  CHECK_THAT(render_error("{% for i in range(1000) %}xxxxxxxxxx{% endfor %}", limits).message(),
             Catch::Contains("exceeds 1000 bytes"));
  CHECK_THAT(render_error("{{ 'x' * 100000 }}", limits).message(), Catch::Contains("too long"));

  // Source size.
  limits = Limits{};
  limits.max_template_bytes = 10;
  CHECK_THAT(render_error("0123456789ABC", limits).message(), Catch::Contains("more than the 10"));

  // A namespace holding itself cannot be printed forever.
  CHECK_THAT(
      render_error("{% set ns = namespace() %}{% set ns.self = [ns] %}{{ ns.self | tojson }}")
          .message(),
      Catch::Contains("not JSON serializable"));
}
