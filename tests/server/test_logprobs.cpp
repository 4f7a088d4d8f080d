// `logprobs`, `top_logprobs` and `echo` of the OpenAI endpoints (issue 33, the server side):
// the answers' shapes against a recorded OpenAI structure (data/openai_logprobs.json), their
// values against a no-cache forward of the same tokens, streaming, and the requests refused.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "promptcache/generation.hpp"
#include "promptcache/logprobs.hpp"
#include "request.hpp"
#include "server/server_fixture.hpp"

using nlohmann::json;
using namespace promptcache;
using namespace promptcache::test;

namespace {

json openai_fixture() {
  std::ifstream in(source_dir() + "/tests/server/data/openai_logprobs.json");
  REQUIRE(in);
  std::stringstream s;
  s << in.rdbuf();
  return json::parse(s.str());
}

bool ends_with(const std::string& s, const std::string& end) {
  return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
}

bool same_type(const json& a, const json& b) {
  if (a.is_number() && b.is_number()) return true;
  return a.type() == b.type();
}

// Every key of the recorded `want` is in `got` with the same JSON type (numbers of any kind
// alike), recursively; list items are compared with the recorded list's first non-null item.
// Objects under "top_logprobs" of the legacy shape are maps token -> number. Items of
// token_logprobs and top_logprobs may be null (a first echoed token, as OpenAI sends it).
void check_shape(const json& got, const json& want, const std::string& path) {
  INFO(path << ": " << got.dump().substr(0, 300));
  if (want.is_null()) return;
  if (want.is_object() && ends_with(path, "top_logprobs[]") && !want.contains("token")) {
    REQUIRE(got.is_object());
    for (const auto& [k, v] : got.items()) CHECK(v.is_number());
    return;
  }
  REQUIRE(same_type(got, want));
  if (want.is_object()) {
    for (const auto& [k, v] : want.items()) {
      if (k == "_comment") continue;
      INFO("key " << k);
      REQUIRE(got.contains(k));
      check_shape(got[k], v, path + "." + k);
    }
  } else if (want.is_array()) {
    const auto item =
        std::find_if(want.begin(), want.end(), [](const json& v) { return !v.is_null(); });
    if (item == want.end()) return;
    const bool nullable = ends_with(path, "token_logprobs") || ends_with(path, "top_logprobs");
    for (std::size_t i = 0; i < got.size(); ++i) {
      if (nullable && got[i].is_null()) continue;
      check_shape(got[i], *item, path + "[]");
    }
  }
}

// Log-softmax of one no-cache forward over `ids` at positions 0..n-1: [n, vocab].
torch::Tensor reference_logprobs(const Engine& e, const std::vector<TokenId>& ids) {
  const auto n = static_cast<int64_t>(ids.size());
  KVCache cache = e.model().make_cache(n);
  ForwardOptions options;
  options.all_logits = true;
  std::vector<int64_t> v(ids.begin(), ids.end());
  auto logits = e.model().forward(torch::tensor(v, torch::kInt64).unsqueeze(0),
                                  torch::arange(n, torch::kInt64).unsqueeze(0), cache, options);
  return torch::log_softmax(logits.reshape({n, -1}).to(torch::kCPU, torch::kFloat32), -1);
}

const std::vector<TokenId> kPrompt = {1, 45, 120, 7, 300, 12, 99, 250, 31, 64, 5, 77};

}  // namespace

TEST_CASE("logprobs: token_logprob is the log-softmax and its top list is sorted", "[server]") {
  const std::vector<float> logits = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  double z = 0;
  for (float x : logits) z += std::exp(static_cast<double>(x));
  const TokenLogprob lp = token_logprob(logits.data(), logits.size(), 4, 3);
  CHECK(lp.token == 4);
  CHECK(std::abs(lp.logprob - (0.5 - std::log(z))) < 1e-12);
  REQUIRE(lp.top.size() == 3);
  CHECK(lp.top[0].first == 1);  // a tie: the lower id first
  CHECK(lp.top[1].first == 3);
  CHECK(lp.top[2].first == 0);
  CHECK(token_logprob(logits.data(), logits.size(), 0, 0).top.empty());
  CHECK(token_logprob(logits.data(), logits.size(), 0, 20).top.size() == 5);
  CHECK_THROWS_AS(token_logprob(logits.data(), logits.size(), 0, 21), Error);
  CHECK_THROWS_AS(token_logprob(logits.data(), logits.size(), 5, 0), Error);
}

TEST_CASE("logprobs: prompt_logprobs in chunks equals one no-cache forward", "[server]") {
  auto e = tiny_engine();
  const torch::Tensor ref = reference_logprobs(*e, kPrompt);
  for (int64_t chunk : {1, 5, 128}) {
    const auto lps = prompt_logprobs(e->model(), kPrompt, 2, chunk);
    REQUIRE(lps.size() == kPrompt.size() - 1);
    for (std::size_t i = 0; i < lps.size(); ++i) {
      CHECK(lps[i].token == kPrompt[i + 1]);
      CHECK(std::abs(lps[i].logprob - ref[i][kPrompt[i + 1]].item<double>()) < 1e-4);
      CHECK(lps[i].top.size() == 2);
      CHECK(std::abs(lps[i].top[0].second - ref[i].max().item<double>()) < 1e-4);
    }
  }
  CHECK(prompt_logprobs(e->model(), {5}, 0).empty());
  CHECK_THROWS_AS(prompt_logprobs(e->model(), {5, -1}, 0), Error);
}

TEST_CASE("logprobs: /v1/completions echo scores the prompt as a no-cache forward does",
          "[server]") {
  TestServer s;
  auto ref = tiny_engine();
  const json fixture = openai_fixture();
  const torch::Tensor lp = reference_logprobs(*ref, kPrompt);

  SECTION("echo, max_tokens 0 and logprobs: the harness's loglikelihood request") {
    const json r = post_json(s, "/v1/completions",
                             {{"model", "tiny"},
                              {"prompt", kPrompt},
                              {"max_tokens", 0},
                              {"echo", true},
                              {"logprobs", 1}});
    check_shape(r, fixture["completion_echo"], "completion_echo");
    const json& l = r["choices"][0]["logprobs"];
    REQUIRE(l["tokens"].size() == kPrompt.size());
    CHECK(l["token_logprobs"][0].is_null());
    CHECK(l["top_logprobs"][0].is_null());
    for (std::size_t i = 1; i < kPrompt.size(); ++i) {
      INFO("token " << i);
      CHECK(std::abs(l["token_logprobs"][i].get<double>() - lp[i - 1][kPrompt[i]].item<double>()) <
            1e-4);
      CHECK(l["top_logprobs"][i].size() == 1);
      const std::string piece = ref->tokenizer().decode_piece(kPrompt[i]);
      if (server::invalid_utf8_at(piece) == std::string::npos) CHECK(l["tokens"][i] == piece);
    }
    // The text is the tokens' strings, text_offset where each starts.
    std::string text;
    for (std::size_t i = 0; i < kPrompt.size(); ++i) {
      CHECK(l["text_offset"][i] == text.size());
      text += l["tokens"][i].get<std::string>();
    }
    CHECK(r["choices"][0]["text"] == text);
    CHECK(r["usage"]["completion_tokens"] == 0);
    CHECK(r["usage"]["prompt_tokens"] == kPrompt.size());
  }
  SECTION("echo and generation: the prompt's entries, then the generated tokens'") {
    SamplingParams p;
    p.max_new_tokens = 4;
    const GenerationResult g = generate(ref->model(), ref->tokenizer(), kPrompt, p);
    std::vector<TokenId> all = kPrompt;
    all.insert(all.end(), g.tokens.begin(), g.tokens.end());
    const torch::Tensor full = reference_logprobs(*ref, all);
    // The answer holds no ids: the greedy tokens are generate()'s, compared by position.
    const json r =
        post_json(s, "/v1/completions",
                  {{"prompt", kPrompt}, {"max_tokens", 4}, {"echo", true}, {"logprobs", 3}});
    check_shape(r, fixture["completion_echo"], "completion_echo");
    const json& l = r["choices"][0]["logprobs"];
    REQUIRE(l["token_logprobs"].size() == all.size());
    CHECK(l["token_logprobs"][0].is_null());
    for (std::size_t i = 1; i < all.size(); ++i) {
      INFO("token " << i);
      CHECK(std::abs(l["token_logprobs"][i].get<double>() - full[i - 1][all[i]].item<double>()) <
            1e-4);
    }
    CHECK(r["usage"]["completion_tokens"] == g.tokens.size());
  }
}

TEST_CASE("logprobs: echo with max_tokens 1 always reports its one generated token", "[server]") {
  // lm-evaluation-harness reads token_logprobs[ctxlen:-1]: one entry past the prompt, always.
  TestServer s;
  auto ref = tiny_engine();
  // A prompt after which the model's likeliest token is EOS: generation stops there, yet the
  // echo answer still has its entry.
  const TokenId eos = ref->tokenizer().eos_id();
  std::vector<TokenId> ends;
  for (TokenId a = 3; a < 400 && ends.empty(); ++a) {
    for (TokenId b = 3; b < 400; b += 7) {
      const std::vector<TokenId> ids = {1, a, b};
      if (reference_logprobs(*ref, ids)[2].argmax().item<int64_t>() == eos) {
        ends = ids;
        break;
      }
    }
  }
  std::vector<std::vector<TokenId>> prompts = {kPrompt};
  if (ends.empty()) {
    WARN("no 3-token prompt found whose greedy next token is EOS: that case is not checked");
  } else {
    prompts.push_back(ends);
  }
  for (const auto& prompt : prompts) {
    SamplingParams p;
    p.max_new_tokens = 1;
    p.stop_at_eos = false;
    const GenerationResult g = generate(ref->model(), ref->tokenizer(), prompt, p);
    REQUIRE(g.tokens.size() == 1);
    std::vector<TokenId> all = prompt;
    all.push_back(g.tokens[0]);
    const torch::Tensor full = reference_logprobs(*ref, all);
    const json r = post_json(s, "/v1/completions",
                             {{"prompt", prompt},
                              {"max_tokens", 1},
                              {"echo", true},
                              {"logprobs", 1},
                              {"temperature", 0}});
    const json& l = r["choices"][0]["logprobs"];
    REQUIRE(l["token_logprobs"].size() == prompt.size() + 1);
    CHECK(std::abs(l["token_logprobs"][prompt.size()].get<double>() -
                   full[prompt.size() - 1][g.tokens[0]].item<double>()) < 1e-4);
    CHECK(r["usage"]["completion_tokens"] == 1);
  }
}

TEST_CASE("logprobs: generated tokens' logprobs are the log-softmax at their step, streamed too",
          "[server]") {
  TestServer s;
  post_schema(s, docs_schema());
  auto ref = tiny_engine();
  const json fixture = openai_fixture();
  SamplingParams p;
  p.max_new_tokens = 6;
  const GenerationResult g = generate(ref->model(), ref->tokenizer(), kPrompt, p);
  REQUIRE(!g.tokens.empty());
  std::vector<TokenId> all = kPrompt;
  all.insert(all.end(), g.tokens.begin(), g.tokens.end());
  const torch::Tensor full = reference_logprobs(*ref, all);
  const json body = {{"prompt", kPrompt}, {"max_tokens", 6}, {"logprobs", 5}};

  const json r = post_json(s, "/v1/completions", body);
  check_shape(r, fixture["completion"], "completion");
  const json& l = r["choices"][0]["logprobs"];
  REQUIRE(l["token_logprobs"].size() == g.tokens.size());
  for (std::size_t k = 0; k < g.tokens.size(); ++k) {
    INFO("generated token " << k);
    const auto step = kPrompt.size() - 1 + k;
    CHECK(std::abs(l["token_logprobs"][k].get<double>() - full[step][g.tokens[k]].item<double>()) <
          1e-4);
    const std::string piece = ref->tokenizer().decode_piece(g.tokens[k]);
    if (server::invalid_utf8_at(piece) == std::string::npos) CHECK(l["tokens"][k] == piece);
    // Greedy: the chosen token is the likeliest alternative.
    REQUIRE(l["top_logprobs"][k].size() >= 1);
    double best = -1e300;
    for (const auto& [tok, v] : l["top_logprobs"][k].items())
      best = std::max(best, v.get<double>());
    CHECK(std::abs(best - l["token_logprobs"][k].get<double>()) < 1e-9);
  }

  SECTION("streamed chunks carry the same entries, in order") {
    json streamed = body;
    streamed["stream"] = true;
    Posted sr = post(s, "/v1/completions", streamed.dump());
    REQUIRE(sr.status == 200);
    std::vector<double> got;
    std::vector<int64_t> offsets;
    for (const json& e : sse_events(sr.body)) {
      if (e == "[DONE]" || e["choices"].empty()) continue;
      const json& c = e["choices"][0];
      if (c["logprobs"].is_null()) continue;
      check_shape(e, fixture["completion_chunk"], "completion_chunk");
      for (const json& v : c["logprobs"]["token_logprobs"]) got.push_back(v.get<double>());
      for (const json& v : c["logprobs"]["text_offset"]) offsets.push_back(v.get<int64_t>());
    }
    REQUIRE(got.size() == g.tokens.size());
    for (std::size_t k = 0; k < got.size(); ++k) {
      // This request reuses the previous one's prompt states (plain prefix reuse): equal
      // within float rounding.
      CHECK(std::abs(got[k] - l["token_logprobs"][k].get<double>()) < 1e-4);
      CHECK(offsets[k] == l["text_offset"][k].get<int64_t>());
    }
  }
  SECTION("chat, with modules: logprobs.content, top_logprobs alternatives, streamed too") {
    const json chat = {{"messages", {{{"role", "user"}, {"content", "What happened?"}}}},
                       {"max_tokens", 5},
                       {"logprobs", true},
                       {"top_logprobs", 3},
                       {"promptcache", {{"schema", "docs"}, {"modules", {"d0"}}}}};
    const json c = post_json(s, "/v1/chat/completions", chat);
    check_shape(c, fixture["chat"], "chat");
    const json& content = c["choices"][0]["logprobs"]["content"];
    REQUIRE(content.size() == c["usage"]["completion_tokens"].get<std::size_t>());
    for (const json& t : content) {
      REQUIRE(t["top_logprobs"].size() == 3);
      CHECK(t["top_logprobs"][0]["logprob"] == t["logprob"]);  // greedy
      CHECK(t["top_logprobs"][0]["logprob"] >= t["top_logprobs"][1]["logprob"]);
      std::string bytes;
      for (const json& b : t["bytes"]) bytes += static_cast<char>(b.get<int>());
      if (server::invalid_utf8_at(bytes) == std::string::npos) {
        CHECK(bytes == t["token"].get<std::string>());
      }
    }
    json streamed = chat;
    streamed["stream"] = true;
    Posted sr = post(s, "/v1/chat/completions", streamed.dump());
    REQUIRE(sr.status == 200);
    std::vector<json> entries;
    for (const json& e : sse_events(sr.body)) {
      if (e == "[DONE]" || e["choices"].empty()) continue;
      const json& lp = e["choices"][0]["logprobs"];
      if (lp.is_null()) continue;
      check_shape(e, fixture["chat_chunk"], "chat_chunk");
      for (const json& t : lp["content"]) entries.push_back(t);
    }
    REQUIRE(entries.size() == content.size());
    for (std::size_t k = 0; k < entries.size(); ++k) {
      CHECK(entries[k]["token"] == content[k]["token"]);
      CHECK(std::abs(entries[k]["logprob"].get<double>() - content[k]["logprob"].get<double>()) <
            1e-4);
    }
  }
  SECTION("without logprobs: null, as before") {
    const json plain = post_json(s, "/v1/completions", {{"prompt", kPrompt}, {"max_tokens", 2}});
    CHECK(plain["choices"][0]["logprobs"].is_null());
    const json chat =
        post_json(s, "/v1/chat/completions",
                  {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"max_tokens", 2}});
    CHECK(chat["choices"][0]["logprobs"].is_null());
  }
}

TEST_CASE("logprobs: out-of-range logprobs, top_logprobs and echo get a 400 naming the field",
          "[server]") {
  TestServer s;
  post_schema(s, docs_schema());
  const auto refused = [&](const std::string& path, const json& body, const std::string& field) {
    Posted r = post(s, path, body.dump());
    INFO(path << " " << body.dump() << " -> " << r.status << " " << r.body);
    CHECK(r.status == 400);
    CHECK(r.body.find(field) != std::string::npos);
  };
  const json messages = {{{"role", "user"}, {"content", "Hi"}}};
  refused("/v1/completions", {{"prompt", "Hi"}, {"logprobs", 6}}, "'logprobs'");
  refused("/v1/completions", {{"prompt", "Hi"}, {"logprobs", -1}}, "'logprobs'");
  refused("/v1/completions", {{"prompt", "Hi"}, {"logprobs", true}}, "'logprobs'");
  refused("/v1/completions", {{"prompt", "Hi"}, {"logprobs", 1.5}}, "'logprobs'");
  refused("/v1/completions", {{"prompt", "Hi"}, {"echo", 1}}, "'echo'");
  refused("/v1/completions", {{"prompt", "Hi"}, {"echo", true}, {"stream", true}}, "'echo'");
  refused("/v1/completions", {{"prompt", "Hi"}, {"top_logprobs", 2}}, "'top_logprobs'");
  refused("/v1/completions",
          {{"prompt", "Hi"}, {"echo", true}, {"promptcache", {{"schema", "docs"}}}}, "'echo'");
  refused("/v1/completions", {{"prompt", {1, -2}}}, "'prompt'");
  refused("/v1/completions", {{"prompt", {1, 100000}}}, "'prompt'");
  refused("/v1/chat/completions", {{"messages", messages}, {"logprobs", 2}}, "'logprobs'");
  refused("/v1/chat/completions", {{"messages", messages}, {"top_logprobs", 2}}, "'top_logprobs'");
  refused("/v1/chat/completions",
          {{"messages", messages}, {"logprobs", true}, {"top_logprobs", 21}}, "'top_logprobs'");
  refused("/v1/chat/completions",
          {{"messages", messages}, {"logprobs", true}, {"top_logprobs", -1}}, "'top_logprobs'");
  refused("/v1/chat/completions", {{"messages", messages}, {"echo", true}}, "'echo'");
  // The server still answers.
  post_json(s, "/v1/completions", {{"prompt", "Hi"}, {"max_tokens", 1}, {"logprobs", 5}});
}

TEST_CASE("logprobs: echo on token ids reuses a registered schema's modules they begin with",
          "[server]") {
  // An evaluation harness sends context + continuation as ids and names no modules: the server
  // reads the part that is a registered schema's stored spans from the store (cached_tokens),
  // and every log-probability stays what a no-cache forward gives.
  TestServer s;
  auto ref = tiny_engine();
  const std::string xml = R"(<schema name="fewshot">
  <module name="inst">Answer the question in one word.</module>
  <module name="shots">Q: sky? A: blue. Q: grass? A: green.</module>
</schema>)";
  REQUIRE(post_schema(s, xml).back()["type"] == "done");
  ref->add_schema_string(xml);
  std::vector<TokenId> ids =
      ref->resolve(pml::parse_prompt_string(R"(<prompt schema="fewshot"><inst/><shots/></prompt>)"))
          .baseline;
  const std::size_t shared = ids.size();
  const std::vector<TokenId> question = {45, 120, 7, 300, 12};
  ids.insert(ids.end(), question.begin(), question.end());
  const torch::Tensor lp = reference_logprobs(*ref, ids);
  for (int round = 0; round < 2; ++round) {  // the second reads the prefix's kept entries
    INFO("round " << round);
    const json r = post_json(s, "/v1/completions",
                             {{"prompt", ids}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 2}});
    CHECK(r["usage"]["prompt_tokens_details"]["cached_tokens"] == shared);
    CHECK(r["usage"]["prompt_tokens"] == ids.size());
    const json& l = r["choices"][0]["logprobs"];
    REQUIRE(l["token_logprobs"].size() == ids.size());
    for (std::size_t i = 1; i < ids.size(); ++i) {
      INFO("token " << i);
      CHECK(std::abs(l["token_logprobs"][i].get<double>() - lp[i - 1][ids[i]].item<double>()) <
            1e-4);
      // Two alternatives, fewer where two ids show the same text (the legacy map keeps one).
      double best = -1e300;
      for (const auto& [text, v] : l["top_logprobs"][i].items())
        best = std::max(best, v.get<double>());
      CHECK(std::abs(best - lp[i - 1].max().item<double>()) < 1e-4);
    }
  }
  // A sequence that leaves the schema's text early reuses nothing past BOS and is still exact.
  std::vector<TokenId> other = ids;
  other[3] = other[3] == 9 ? 10 : 9;
  const json r = post_json(s, "/v1/completions",
                           {{"prompt", other}, {"max_tokens", 0}, {"echo", true}, {"logprobs", 0}});
  CHECK(r["usage"]["prompt_tokens_details"]["cached_tokens"] < shared);
  const torch::Tensor other_lp = reference_logprobs(*ref, other);
  for (std::size_t i = 1; i < other.size(); ++i) {
    CHECK(std::abs(r["choices"][0]["logprobs"]["token_logprobs"][i].get<double>() -
                   other_lp[i - 1][other[i]].item<double>()) < 1e-4);
  }
}
