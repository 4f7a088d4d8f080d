// The server's edge (request.hpp): bodies become typed requests or a clear 4xx Error, whatever
// their size, depth or numbers; nothing downstream sees an unchecked value.
#include "request.hpp"
#include "support/catch_torch.hpp"  // views.hpp brings LibTorch (and glog's CHECK)
#include "views.hpp"

using namespace promptcache;
using namespace promptcache::server;

namespace {

// The body is refused with Error(kind) whose message contains `says`.
template <typename F>
void refused(F&& parse, ErrorKind kind, const std::string& says) {
  try {
    parse();
    FAIL("accepted; expected: " << says);
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(e.kind() == kind);
    CHECK(std::string(e.what()).find(says) != std::string::npos);
    CHECK(error_status(e) / 100 == 4);
  }
}

std::string nested(std::size_t depth, char open, char close, const std::string& inner = "") {
  return std::string(depth, open) + inner + std::string(depth, close);
}

const std::string kChat = R"("messages": [{"role": "user", "content": "Hi"}])";

}  // namespace

TEST_CASE("request: JSON nested past the limit is refused while it is read", "[server][request]") {
  const RequestLimits limits;
  CHECK(parse_json_body("{\"a\": " + nested(62, '[', ']') + "}", limits).is_object());
  refused([&] { parse_json_body("{\"a\": " + nested(64, '[', ']') + "}", limits); },
          ErrorKind::kInvalidArgument, "--max-json-depth");
  // 100,000 levels in every field a client may nest: the top level, messages, modules, stop,
  // sampling numbers, the prompt.
  const std::string deep = nested(100000, '[', ']');
  for (const std::string& body :
       {deep, "{\"messages\": " + deep + "}", "{" + kChat + ", \"stop\": " + deep + "}",
        "{" + kChat + ", \"temperature\": " + deep + "}",
        "{" + kChat + ", \"promptcache\": {\"schema\": \"s\", \"modules\": " + deep + "}}",
        "{\"prompt\": " + deep + "}"}) {
    refused([&] { parse_completion_request(body, true, limits); }, ErrorKind::kInvalidArgument,
            "nests deeper than 64");
  }
  std::string objects;
  for (int i = 0; i < 100000; ++i) objects += "{\"a\":";
  refused([&] { parse_prompt_request(objects, limits); }, ErrorKind::kInvalidArgument,
          "nests deeper");
}

TEST_CASE("request: numbers must be finite and in range", "[server][request]") {
  const RequestLimits limits;
  const auto prompt = [&](const std::string& extra) {
    return parse_prompt_request(R"({"prompt": "<prompt schema=\"s\"/>", )" + extra + "}", limits);
  };
  CHECK(prompt(R"("temperature": 0.7)").params.temperature == Approx(0.7));
  for (const std::string& extra :
       {R"("temperature": 1e400)", R"("temperature": -1e400)", R"("temperature": -1)",
        R"("top_p": 1.5)", R"("max_new_tokens": 1e400)", R"("max_new_tokens": -1)",
        R"("max_new_tokens": 99999999999999999999)", R"("seed": -3)", R"("recompute": 2)",
        R"("repetition_penalty": 0)", R"("temperature": "hot")", R"("top_k": 1.5)"}) {
    INFO(extra);
    refused([&] { prompt(extra); }, ErrorKind::kInvalidArgument, "");
  }
  // 1e-400 underflows to 0: a valid temperature.
  CHECK(prompt(R"("temperature": 1e-400)").params.temperature == 0.0f);
}

TEST_CASE("request: lists and strings are bounded", "[server][request]") {
  const RequestLimits limits;
  std::string many = "[";
  for (int i = 0; i < 5000; ++i)
    many += std::string(i ? "," : "") + R"({"role":"user","content":"x"})";
  many += "]";
  refused([&] { parse_completion_request("{\"messages\": " + many + "}", true, limits); },
          ErrorKind::kInvalidArgument, "more than the 4096");
  refused(
      [&] {
        // 17 stop strings, one more than a request may have.
        parse_completion_request(
            "{" + kChat +
                R"(, "stop": ["a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a","a"]})",
            true, limits);
      },
      ErrorKind::kInvalidArgument, "'stop' must be");
  refused(
      [&] {
        parse_completion_request("{" + kChat + R"(, "stop": ")" + std::string(2000, 'x') + "\"}",
                                 true, limits);
      },
      ErrorKind::kInvalidArgument, "'stop' must be");
  // The error quotes at most a few dozen bytes of a value, never the whole of it.
  try {
    parse_prompt_request(R"({"prompt": "<prompt schema=\"s\"/>", "temperature": ")" +
                             std::string(100000, 'z') + "\"}",
                         limits);
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).size() < 400);
  }
}

TEST_CASE("request: promptcache.modules is read without recursion, bounded in depth and count",
          "[server][request]") {
  RequestLimits limits;
  const auto modules = [&](const std::string& list) {
    return parse_completion_request(
        "{" + kChat + R"(, "promptcache": {"schema": "s", "modules": )" + list + "}}", true,
        limits);
  };
  const CompletionRequest r = modules(
      R"(["a", {"name": "b", "arguments": {"x": "1"}, "modules": ["c", {"name": "d"}]}, "e"])");
  REQUIRE(r.prompt);
  REQUIRE(r.prompt->modules.size() == 3);
  CHECK(r.prompt->modules[1].name == "b");
  CHECK(r.prompt->modules[1].arguments[0].value == "1");
  REQUIRE(r.prompt->modules[1].children.size() == 2);
  CHECK(r.prompt->modules[1].children[1].name == "d");
  CHECK(r.prompt->modules[2].name == "e");
  CHECK(r.prompt->turns.size() == 1);

  std::string deep;
  for (int i = 0; i < 30; ++i) deep += R"({"name": "m", "modules": [)";
  deep += "\"x\"";
  for (int i = 0; i < 30; ++i) deep += "]}";
  limits.max_json_depth = 1000;
  CHECK_NOTHROW(modules("[" + deep + "]"));
  limits.max_module_depth = 8;
  refused([&] { modules("[" + deep + "]"); }, ErrorKind::kInvalidArgument, "deeper than 8");
  limits.max_module_refs = 10;
  std::string wide = "[";
  for (int i = 0; i < 11; ++i) wide += std::string(i ? "," : "") + "\"m\"";
  refused([&] { modules(wide + "]"); }, ErrorKind::kInvalidArgument, "more than 10 modules");
  refused([&] { modules(R"([{"name": "m", "extra": 1}])"); }, ErrorKind::kInvalidArgument,
          "unknown field 'extra'");
}

TEST_CASE("request: bodies that are not what the endpoint takes", "[server][request]") {
  const RequestLimits limits;
  refused([&] { parse_prompt_request("[1]", limits); }, ErrorKind::kInvalidArgument,
          "must be a JSON object");
  refused([&] { parse_prompt_request("{\"prompt\": 1", limits); }, ErrorKind::kInvalidArgument,
          "not valid JSON");
  refused([&] { parse_prompt_request("{\"a\": \"\xff\"}", limits); }, ErrorKind::kInvalidArgument,
          "not valid JSON");
  refused([&] { parse_prompt_request(R"({"prompt": "<prompt schema=\"s\"/>", "x": 1})", limits); },
          ErrorKind::kInvalidArgument, "unknown field 'x'");
  refused(
      [&] { parse_prompt_request(R"({"prompt": "<prompt schema=\"s\"/>", "stream": 1})", limits); },
      ErrorKind::kInvalidArgument, "'stream' must be true or false");
  RequestLimits small;
  small.max_body_bytes = 10;
  refused([&] { parse_prompt_request(R"({"prompt": "<prompt schema=\"s\"/>"})", small); },
          ErrorKind::kInvalidArgument, "--max-body-bytes");
}

TEST_CASE("request: a posted schema reads no file, and its nesting is bounded",
          "[server][request]") {
  const RequestLimits limits;
  const pml::NoSrcFiles none("no files here");
  CHECK(schema_xml_from_body(R"({"xml": "<schema name=\"s\">x</schema>"})",
                             "Application/JSON; charset=utf-8",
                             limits) == "<schema name=\"s\">x</schema>");
  CHECK(schema_xml_from_body("<schema/>", "application/xml", limits) == "<schema/>");
  refused([&] { schema_xml_from_body(R"({"xml": 1})", "application/json", limits); },
          ErrorKind::kInvalidArgument, "{\"xml\"");
  // JSON escapes are decoded before the XML parser and the resolver see the text.
  refused(
      [&] {
        parse_posted_schema(
            schema_xml_from_body(
                R"({"xml": "<schema name=\"s\"><module name=\"m\" src=\"\u002fetc\u002fpasswd\"/></schema>"})",
                "application/json", limits),
            none, limits);
      },
      ErrorKind::kSchema, "module src \"/etc/passwd\" is not read");
  std::string deep = "<schema name=\"s\">";
  for (int i = 0; i < 70; ++i) deep += "<module name=\"m" + std::to_string(i) + "\">";
  deep += "x";
  for (int i = 0; i < 70; ++i) deep += "</module>";
  deep += "</schema>";
  refused([&] { parse_posted_schema(deep, none, limits); }, ErrorKind::kSchema,
          "nest deeper than 64");
  std::string very_deep = "<schema name=\"s\">";
  for (int i = 0; i < 100000; ++i) very_deep += "<module name=\"m\">";
  refused([&] { parse_posted_schema(very_deep, none, limits); }, ErrorKind::kXmlSyntax, "");
  // A few MB with an unterminated tag: an error, no regex recursion.
  refused(
      [&] {
        parse_posted_schema("<schema name=\"s\"><module " + std::string(4 << 20, 'a'), none,
                            limits);
      },
      ErrorKind::kXmlSyntax, "");
}

TEST_CASE("request: media types ignore case, spaces and parameters", "[server][request]") {
  CHECK(media_type("application/json") == "application/json");
  CHECK(media_type(" Application/JSON ; charset=utf-8") == "application/json");
  CHECK(media_type("application/jsonx") == "application/jsonx");
  CHECK(media_type("") == "");
}

TEST_CASE("request: logprobs, top_logprobs and echo are typed and range-checked",
          "[server][request]") {
  const RequestLimits limits;
  const auto completion = [&](const std::string& fields) {
    return parse_completion_request(R"({"prompt": "Hi")" + fields + "}", false, limits);
  };
  const auto chat = [&](const std::string& fields) {
    return parse_completion_request("{" + kChat + fields + "}", true, limits);
  };
  CHECK(completion("").logprobs == -1);
  CHECK(!completion("").echo);
  CHECK(completion(R"(, "logprobs": null)").logprobs == -1);
  CHECK(completion(R"(, "logprobs": 0)").logprobs == 0);
  CHECK(completion(R"(, "logprobs": 5)").logprobs == 5);
  const CompletionRequest scoring = completion(R"(, "logprobs": 1, "echo": true, "max_tokens": 0)");
  CHECK(scoring.echo);
  CHECK(scoring.logprobs == 1);
  CHECK(scoring.params.max_new_tokens == 0);
  CHECK(chat("").logprobs == -1);
  CHECK(chat(R"(, "logprobs": false)").logprobs == -1);
  CHECK(chat(R"(, "logprobs": true)").logprobs == 0);
  CHECK(chat(R"(, "logprobs": true, "top_logprobs": 20)").logprobs == 20);
  CHECK(chat(R"(, "logprobs": true, "top_logprobs": 0)").logprobs == 0);

  const auto bad = ErrorKind::kInvalidArgument;
  for (const char* v : {"6", "-1", "true", "1.5", "\"2\"", "[1]", "18446744073709551616"}) {
    INFO(v);
    refused([&] { completion(std::string(R"(, "logprobs": )") + v); }, bad, "'logprobs'");
  }
  refused([&] { completion(R"(, "echo": 1)"); }, bad, "'echo'");
  refused([&] { completion(R"(, "echo": true, "stream": true)"); }, bad, "'echo'");
  refused([&] { completion(R"(, "top_logprobs": 2)"); }, bad, "'top_logprobs'");
  refused([&] { completion(R"(, "echo": true, "promptcache": {"schema": "s"})"); }, bad, "'echo'");
  refused([&] { chat(R"(, "logprobs": 3)"); }, bad, "'logprobs'");
  refused([&] { chat(R"(, "top_logprobs": 3)"); }, bad, "'top_logprobs'");
  refused([&] { chat(R"(, "logprobs": false, "top_logprobs": 3)"); }, bad, "'top_logprobs'");
  refused([&] { chat(R"(, "logprobs": true, "top_logprobs": 21)"); }, bad, "'top_logprobs'");
  refused([&] { chat(R"(, "logprobs": true, "top_logprobs": -1)"); }, bad, "'top_logprobs'");
  refused([&] { chat(R"(, "echo": true)"); }, bad, "'echo'");
}

TEST_CASE("request: a completion prompt may be token ids", "[server][request]") {
  const RequestLimits limits;
  const auto ids = [&](const std::string& prompt) {
    return parse_completion_request(R"({"prompt": )" + prompt + "}", false, limits);
  };
  const CompletionRequest r = ids("[1, 2, 3]");
  REQUIRE(r.prompt_ids);
  CHECK(*r.prompt_ids == std::vector<TokenId>({1, 2, 3}));
  CHECK(r.turns.empty());
  CHECK(*ids("[[4, 5]]").prompt_ids == std::vector<TokenId>({4, 5}));
  CHECK(!ids(R"("text")").prompt_ids);
  const auto bad = ErrorKind::kInvalidArgument;
  for (const char* p : {"[1, -2]", "[1, 2.5]", "[1, \"a\"]", "[2147483648]", "[]", "[[1], [2]]"}) {
    INFO(p);
    refused([&] { ids(p); }, bad, "'prompt'");
  }
  refused(
      [&] {
        parse_completion_request(R"({"prompt": [1, 2], "promptcache": {"schema": "s"}})", false,
                                 limits);
      },
      bad, "'prompt'");
}
