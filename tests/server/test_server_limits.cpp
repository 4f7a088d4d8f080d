// `promptcache serve` under hostile or careless clients (in-process): posted schemas read no
// files (or only under --schema-root), bodies and budgets have limits answered with 413/429 JSON
// naming them, compiles run beside generation and stop when cancelled. After each refusal the
// server still answers a good request.
#include <fstream>
#include <thread>

#include "server/server_fixture.hpp"
#include "support/test_support.hpp"

using nlohmann::json;
using namespace promptcache;
using namespace promptcache::test;

namespace {

const std::string kCanary = "CANARY-server-outside-3c1d";

std::string src_schema(const std::string& name, const std::string& src) {
  return "<schema name=\"" + name + "\"><module name=\"m\" src=\"" + src + "\"/></schema>";
}

// A good request still gets its answer (the server is up and serving).
void still_serves(const TestServer& s) {
  post_schema(s, docs_schema());
  const json r = post_json(s, "/v1/prompt", {{"prompt", docs_prompt(1)}, {"max_new_tokens", 2}});
  CHECK(r["token_ids"].size() == 2);
}

// The refusal's status, and its JSON error (with "limit" when `limit` is given).
json refused(const Posted& r, int status, const std::string& limit = "") {
  INFO(r.status << " " << r.body);
  REQUIRE(r.status == status);
  const json body = json::parse(r.body);
  REQUIRE(body.contains("error"));
  if (!limit.empty()) CHECK(body["error"]["limit"] == limit);
  CHECK(r.body.find(kCanary) == std::string::npos);
  return body;
}

// Many modules of repeated text: compiling it takes many forwards on the long-context model.
std::string big_schema(const std::string& name, int modules) {
  std::string xml = "<schema name=\"" + name + "\">";
  for (int m = 0; m < modules; ++m) {
    xml += "<module name=\"m" + std::to_string(m) + "\">";
    for (int i = 0; i < 40; ++i) xml += "Tom went to the park and saw a big dog there. ";
    xml += "</module>";
  }
  return xml + "</schema>";
}

// A wider tiny model with a long context: compiling big_schema takes tens of seconds, so a test
// can be sure to act while it runs (and it is cancelled long before it would end).
std::unique_ptr<Engine> slow_compile_engine() {
  ModelConfig c = tiny_config();
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.max_position_embeddings = 32768;
  EngineOptions options;
  options.chat_template = "llama-2";
  return std::make_unique<Engine>(
      LlamaModel::from_tensors(c, random_llama_weights(c, 1, 0.05), test_load_options()),
      load_sentencepiece_tokenizer(tiny_tokenizer_path()), options);
}

}  // namespace

TEST_CASE("serve limits: a posted schema reads no file, and with --schema-root only inside it",
          "[server][security]") {
  TempDir dir("promptcache-root");
  const auto root = dir.path() / "root";
  std::filesystem::create_directories(root);
  std::ofstream(root / "inside.txt") << "The cat sat on the mat.";
  std::ofstream(dir.path() / "canary.txt") << kCanary;
  std::filesystem::create_symlink(dir.path() / "canary.txt", root / "link.txt");
  const std::string outside = (dir.path() / "canary.txt").string();

  TestServer plain;
  for (const std::string& src : {outside, std::string("inside.txt"), std::string("/etc/passwd")}) {
    const json e =
        refused(post(plain, "/v1/schemas", src_schema("s", src), {}, {}, "application/xml"), 400);
    CHECK(e["error"]["message"].get<std::string>().find("--schema-root") != std::string::npos);
  }
  // The same as JSON, with the path spelled in JSON escapes.
  refused(post(plain, "/v1/schemas",
               json{{"xml", src_schema("s",
                                       "\x2f"
                                       "etc"
                                       "\x2f"
                                       "passwd")}}
                   .dump()),
          400);
  still_serves(plain);

  server::ServerOptions options;
  options.schema_root = root.string();
  TestServer rooted(options);
  const auto events = post_schema(rooted, src_schema("ok", "inside.txt"));
  REQUIRE(events.back()["type"] == "done");
  CHECK(get_json(rooted, "/v1/schemas/ok").dump().find("The cat sat on the mat") !=
        std::string::npos);
  for (const std::string& src : {outside, std::string("../canary.txt"), std::string("link.txt"),
                                 std::string("no-such.txt"), std::string("/etc/hostname")}) {
    INFO(src);
    refused(post(rooted, "/v1/schemas", src_schema("bad", src), {}, {}, "application/xml"), 400);
  }
  CHECK(get_json(rooted, "/v1/schemas").dump().find(kCanary) == std::string::npos);
  still_serves(rooted);
}

TEST_CASE("serve limits: bodies, depth and numbers past the limits are 4xx JSON",
          "[server][security]") {
  server::ServerOptions options;
  options.max_body_bytes = 4096;
  TestServer s(options);
  refused(post(s, "/v1/prompt", json{{"prompt", std::string(5000, 'x')}}.dump()), 413,
          "max_body_bytes");
  CHECK(metric(s, "promptcache_refused_total{limit=\"max_body_bytes\"}") == 1);
  refused(post(s, "/v1/chat/completions",
               "{\"messages\": " + std::string(2000, '[') + std::string(2000, ']') + "}"),
          400);
  refused(post(s, "/v1/prompt",
               R"({"prompt": "<prompt schema=\"docs\"><d1/></prompt>", "temperature": 1e400})"),
          400);
  refused(post(s, "/v1/chat/completions",
               R"({"messages": [{"role": "user", "content": "Hi"}], "top_p": -1e400})"),
          400);
  still_serves(s);
}

TEST_CASE("serve limits: schema budgets and the queue answer 429 naming the limit",
          "[server][security]") {
  server::ServerOptions options;
  options.max_schemas = 2;
  TestServer s(options);
  post_schema(s, docs_schema("a"));
  post_schema(s, docs_schema("b"));
  post_schema(s, docs_schema("b"));  // replacing one is no new schema
  const json e =
      refused(post(s, "/v1/schemas?stream=false", docs_schema("c"), {}, {}, "application/xml"), 429,
              "max_schemas");
  CHECK(e["error"]["message"].get<std::string>().find("--max-schemas") != std::string::npos);
  CHECK(get_json(s, "/v1/schemas")["schemas"].size() == 2);
  auto res = s.client().Delete("/v1/schemas/a");
  REQUIRE(res);
  CHECK(res->status == 200);
  post_schema(s, docs_schema("c"));

  server::ServerOptions positions;
  positions.max_schema_positions = 100;
  TestServer p(positions);
  refused(post(p, "/v1/schemas?stream=false", docs_schema(), {}, {}, "application/xml"), 429,
          "max_schema_positions");
  CHECK(metric(p, "promptcache_refused_total{limit=\"max_schema_positions\"}") == 1);

  // One decoding request fills the batch (max_batch 1); a queue of one holds the next; the
  // third is refused at once. The first streams until the test drops it.
  server::ServerOptions queue;
  queue.max_batch = 1;
  queue.max_queue = 1;
  TestServer q(queue, long_context_engine());
  post_schema(q, docs_schema());
  std::atomic<bool> streaming{false}, drop{false};
  std::atomic<int> second_status{0};
  std::thread first([&] {
    post(q, "/v1/prompt",
         json{{"prompt", docs_prompt(1)}, {"max_new_tokens", 30000}, {"stream", true}}.dump(),
         [&](const std::string& chunk) {
           // Decoding (its first token): it has left the queue for the batch.
           if (chunk.find("\"type\":\"token\"") != std::string::npos) streaming = true;
           return !drop.load();
         });
  });
  for (int i = 0; i < 6000 && !streaming; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::thread second([&] {
    second_status =
        post(q, "/v1/prompt", json{{"prompt", docs_prompt(2)}, {"max_new_tokens", 2}}.dump())
            .status;
  });
  for (int i = 0; i < 500 && metric(q, "promptcache_queued_requests") < 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const Posted third =
      post(q, "/v1/prompt", json{{"prompt", docs_prompt(3)}, {"max_new_tokens", 2}}.dump());
  drop = true;
  first.join();
  second.join();
  CHECK(streaming);
  refused(third, 429, "max_queue");
  CHECK(second_status == 200);
  CHECK(metric(q, "promptcache_refused_total{limit=\"max_queue\"}") == 1);
}

TEST_CASE("serve limits: a compile runs beside generation and stops when cancelled",
          "[server][security]") {
  server::ServerOptions options;
  options.max_compiles = 1;
  TestServer s(options, slow_compile_engine());
  post_schema(s, docs_schema());

  // A long compile streams; meanwhile a prompt on the loaded schema is answered, a second compile
  // is refused (max_compiles), and then the client goes away: the compile stops.
  std::atomic<bool> started{false}, drop{false};
  Posted big;
  std::thread compile([&] {
    big = post(
        s, "/v1/schemas", big_schema("big", 20),
        [&](const std::string&) {
          started = true;
          return !drop.load();
        },
        {}, "application/xml");
  });
  for (int i = 0; i < 600 && !started; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  REQUIRE(started);
  const json answer =
      post_json(s, "/v1/prompt", {{"prompt", docs_prompt(1)}, {"max_new_tokens", 2}});
  CHECK(answer["token_ids"].size() == 2);
  const Posted other =
      post(s, "/v1/schemas?stream=false", docs_schema("other"), {}, {}, "application/xml");
  drop = true;
  compile.join();
  {
    INFO("the big compile's stream: " << big.body.substr(0, 3000));
    refused(other, 429, "max_compiles");
  }
  bool stopped = false;
  for (int i = 0; i < 300 && !stopped; ++i) {
    stopped = metric(s, "promptcache_cancelled_total") >= 1;
    if (!stopped) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  CHECK(stopped);
  CHECK(get_json(s, "/v1/schemas").dump().find("\"big\"") == std::string::npos);

  // DELETE while it compiles: the compile stops, its client gets 409, the schema is not listed.
  Posted deleted_compile;
  started = false;
  std::thread second([&] {
    deleted_compile = post(
        s, "/v1/schemas?stream=false", big_schema("big", 20),
        [&](const std::string&) {
          started = true;
          return true;
        },
        {}, "application/xml");
  });
  for (int i = 0; i < 600 && !started; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto res = s.client().Delete("/v1/schemas/big");
  second.join();
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(json::parse(res->body)["cancelled_compiles"] == 1);
  CHECK(deleted_compile.status == 200);  // the status went out with the first keep-alive
  CHECK(deleted_compile.body.find("cancelled") != std::string::npos);
  CHECK(get_json(s, "/v1/schemas").dump().find("\"big\"") == std::string::npos);
  still_serves(s);

  // Shutdown while a compile runs: it stops at its next forward, so stop() returns promptly
  // (the whole compile takes tens of seconds).
  Posted at_shutdown;
  started = false;
  std::thread third([&] {
    at_shutdown = post(
        s, "/v1/schemas", big_schema("big", 20),
        [&](const std::string&) {
          started = true;
          return true;
        },
        {}, "application/xml");
  });
  for (int i = 0; i < 600 && !started; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double before = now_ms();
  s.srv->stop();
  const double stop_ms = now_ms() - before;
  third.join();
  CHECK(stop_ms < 10000);
  CHECK(at_shutdown.body.find("\"type\":\"done\"") == std::string::npos);
}
