// Stored states are not trusted blindly: Redis values carry a keyed MAC (another secret, another
// key or one changed byte is refused, reported on stderr, counted and compiled again), a states
// file that fails its checks is reported and counted too, and files are published atomically (a
// write that fails leaves the old file byte for byte and no temporary file).
#include "support/catch_torch.hpp"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <thread>

#include "promptcache/atomic_file.hpp"
#include "promptcache/cache/cache_file.hpp"
#include "promptcache/cache/redis_tier.hpp"
#include "promptcache/model/safetensors.hpp"
#include "support/redis_server.hpp"
#include "support/tiny_model.hpp"
#include "support/trip_schema.hpp"

using namespace promptcache;

namespace {

const std::vector<std::string> kPrompts = {
    R"(<prompt schema="trip"><city/><rainy/><who guide="Anna"/>Where do we go?</prompt>)",
    R"(<prompt schema="trip"><city/><sunny/><live/>And now?</prompt>)",
};

SamplingParams greedy() {
  SamplingParams p;
  p.max_new_tokens = 5;
  p.stop_at_eos = false;
  return p;
}

EngineOptions with_redis(const std::string& url, const std::string& secret,
                         int64_t host_bytes = 0) {
  EngineOptions o;
  o.redis_url = url;
  o.cache_secret = secret;
  o.max_host_bytes = host_bytes;
  return o;
}

// What the code under test writes to std::cerr while it lives.
class StderrCapture {
 public:
  StderrCapture() : old_(std::cerr.rdbuf(text_.rdbuf())) {}
  ~StderrCapture() { std::cerr.rdbuf(old_); }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;
  std::string text() const { return text_.str(); }

 private:
  std::ostringstream text_;
  std::streambuf* old_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::string> files_in(const std::filesystem::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    out.push_back(e.path().filename().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// A copy of a states file with one byte of every tensor flipped, renamed over it (a new file:
// an engine's mapping of the old one stays as it was).
void corrupt_every_tensor(const std::string& path) {
  std::string bytes = read_file(path);
  {
    const auto file = SafetensorsFile::open(path);
    std::uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = (header << 8) | static_cast<unsigned char>(bytes[i]);
    for (const auto& [name, entry] : file->entries()) {
      if (entry.end > entry.begin) bytes[8 + header + entry.begin] ^= 0x40;
    }
  }
  write_file(path + ".new", bytes);
  std::filesystem::rename(path + ".new", path);
}

// Every span's states of `schema` in `a` and `b` are identical.
void check_same_states(const Engine& a, const Engine& b, const std::string& schema) {
  const auto& spans = a.store().spans_of(schema);
  REQUIRE_FALSE(spans.empty());
  CHECK(spans.size() == b.store().spans_of(schema).size());
  for (const auto& [span, states] : spans) {
    INFO("span " << span);
    const SpanStates* other = b.store().find(schema, span);
    REQUIRE(other != nullptr);
    CHECK(torch::equal(states.kv, other->kv));
  }
}

}  // namespace

TEST_CASE("a redis value is sealed with a MAC over its key and every byte", "[cache][redis]") {
  const std::vector<int64_t> shape = {1, 2, 1, 3, 2};
  const auto block = torch::arange(12, torch::kFloat32).reshape(shape) * 0.5f;
  const std::string key = "promptcache:span:m:l:0:k", secret = "secret-a";
  const std::string value = RedisTier::encode(key, block, secret);
  CHECK_THAT(value, Catch::StartsWith("promptcache-span-v2 "));
  CHECK(torch::equal(RedisTier::decode(key, value, secret, torch::kFloat32, shape), block));

  auto refused = [&](const std::string& k, const std::string& v, const std::string& s,
                     torch::Dtype dtype, const std::vector<int64_t>& sh, const std::string& why) {
    try {
      RedisTier::decode(k, v, s, dtype, sh);
      FAIL("accepted: " << why);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::kCacheFile);
      CHECK_THAT(e.message(), Catch::Contains(why));
    }
  };
  refused(key, value, "secret-b", torch::kFloat32, shape, "MAC does not match");
  refused(key + "x", value, secret, torch::kFloat32, shape, "MAC does not match");
  // Any byte changed: the MAC's own digits, the format, the dtype and shape line, the states.
  for (std::size_t i = 0; i < value.size(); ++i) {
    std::string damaged = value;
    damaged[i] = static_cast<char>(damaged[i] ^ 0x01);
    INFO("byte " << i);
    CHECK_THROWS_AS(RedisTier::decode(key, damaged, secret, torch::kFloat32, shape), Error);
  }
  CHECK_THROWS_AS(
      RedisTier::decode(key, value.substr(0, value.size() - 1), secret, torch::kFloat32, shape),
      Error);
  // The unkeyed values of the earlier version are refused (and compiled again), not trusted.
  refused(key, "promptcache-span-v1 f32 5 1 2 1 3 2 0123456789abcdef\n" + std::string(48, 'x'),
          secret, torch::kFloat32, shape, "earlier version");
  refused(key, "", secret, torch::kFloat32, shape, "not a promptcache span value");
  // Behind a valid MAC, the dtype, shape and length are still checked against the caller's.
  refused(key, RedisTier::reseal(key, value, secret), secret, torch::kFloat16, shape, "dtype");
  refused(key, value, secret, torch::kFloat32, {1, 2, 1, 2, 3}, "another shape");
  refused(key, RedisTier::reseal(key, value + "x", secret), secret, torch::kFloat32, shape,
          "truncated or overlong");
  refused(key, RedisTier::reseal(key, "-\nf32 5 1 2 1 3 2 7\n", secret), secret, torch::kFloat32,
          shape, "malformed shape");
  refused(key, RedisTier::reseal(key, "-\nf32 99999999999999999999\n", secret), secret,
          torch::kFloat32, shape, "malformed shape");
  CHECK(torch::equal(
      RedisTier::decode(key, RedisTier::reseal(key, value, secret), secret, torch::kFloat32, shape),
      block));
  // No secret, no tier.
  CHECK_THROWS_AS(RedisTier::encode(key, block, ""), Error);
  CHECK_THROWS_WITH(RedisTier::connect("redis://127.0.0.1:6379", ""),
                    Catch::Contains("--cache-secret"));
  EngineOptions no_secret;
  no_secret.redis_url = "redis://127.0.0.1:6379";
  CHECK_THROWS_WITH(test::tiny_engine(1, no_secret), Catch::Contains("secret"));
}

TEST_CASE("redis values sealed with another secret are refused, counted and compiled again",
          "[cache][redis]") {
  test::RedisServer server;
  REQUIRE_REDIS(server);
  auto first = test::tiny_engine(1, with_redis(server.url(), "secret-a"));
  first->add_schema_string(test::kTripSchema);
  REQUIRE(first->tier_stats().remote_puts > 0);

  auto second = test::tiny_engine(1, with_redis(server.url(), "secret-b"));
  {
    StderrCapture err;
    second->add_schema_string(test::kTripSchema);
    CHECK_THAT(err.text(), Catch::Contains("redis " + server.url() + " key 'promptcache:span:") &&
                               Catch::Contains("failed its check") &&
                               Catch::Contains("MAC does not match"));
  }
  CHECK(second->compile_report("trip").source == "compiled");
  const TierStats s = second->tier_stats();
  CHECK(s.remote_rejected == 1);  // the first value refused: the schema is compiled
  CHECK(s.remote_loads == 0);
  CHECK(s.compiled_spans > 0);
  // Its states are a fresh compile's.
  auto fresh = test::tiny_engine(1);
  fresh->add_schema_string(test::kTripSchema);
  check_same_states(*second, *fresh, "trip");
  // And the values were replaced, sealed with the new secret: a third engine loads them.
  auto third = test::tiny_engine(1, with_redis(server.url(), "secret-b"));
  third->add_schema_string(test::kTripSchema);
  CHECK(third->compile_report("trip").source == "loaded from " + server.url());
  CHECK(third->tier_stats().remote_rejected == 0);
  check_same_states(*third, *fresh, "trip");
}

TEST_CASE("a changed redis value or one moved to another key is refused and counted",
          "[cache][redis]") {
  test::RedisServer server;
  REQUIRE_REDIS(server);
  const std::string secret = "the-secret";
  auto reference = test::tiny_engine();
  reference->add_schema_string(test::kTripSchema);
  // A budget of one byte: every request takes its spans from redis (or compiles them).
  auto engine = test::tiny_engine(1, with_redis(server.url(), secret, 1));
  engine->add_schema_string(test::kTripSchema);
  // Someone who can write to redis but lacks the secret: every other value gets one byte of its
  // states flipped, the rest are swapped between keys (each validly sealed for its own key).
  const auto& layout = engine->layout("trip");
  const auto model_fp = model_fingerprint(engine->model());
  const auto keys = span_keys(layout, model_fp, engine->model().dtype(), engine->model().kv_dtype(),
                              EncodingMode::kScaffold);
  REQUIRE(keys.size() >= 2);
  std::vector<std::pair<std::string, std::string>> values;  // remote key, its value
  for (const auto& [span, key] : keys) {
    const std::string remote = remote_key(model_fp, layout_fingerprint(layout), span, key);
    values.emplace_back(
        remote, RedisTier::encode(remote, reference->store().find("trip", span)->kv, secret));
  }
  auto redis = RedisTier::connect(server.url(), secret);
  for (std::size_t i = 0; i < values.size(); ++i) {
    std::string value = values[i].second;
    if (i % 2 == 0) {
      value[value.size() - 1] ^= 0x20;
    } else {
      value = values[(i + 1) % values.size()].second;  // another key's value
    }
    REQUIRE(redis->put_value(values[i].first, value));
  }
  const TierStats before = engine->tier_stats();
  StderrCapture err;
  for (const auto& prompt : kPrompts) {
    INFO(prompt);
    CHECK(engine->generate_xml(prompt, greedy()).tokens ==
          reference->generate_xml(prompt, greedy()).tokens);
  }
  const TierStats s = engine->tier_stats();
  const int64_t misses = s.misses - before.misses;
  CHECK(misses > 0);
  CHECK(s.remote_loads == before.remote_loads);  // nothing served from redis
  CHECK(s.remote_rejected - before.remote_rejected == misses);
  CHECK(s.recompiles - before.recompiles == misses);
  CHECK_THAT(err.text(), Catch::Contains("failed its check: its MAC does not match"));
}

TEST_CASE("a states file that fails its checks is reported on stderr and counted",
          "[cache][file]") {
  test::TempDir dir;
  const std::string file = dir.file("trip.states");
  auto first = test::tiny_engine(1);
  first->add_schema(pml::parse_schema_string(test::kTripSchema), {}, file);
  corrupt_every_tensor(file);

  // Added with a corrupt file: one line on stderr naming it and why, counted, compiled again.
  auto second = test::tiny_engine(1);
  {
    StderrCapture err;
    second->add_schema(pml::parse_schema_string(test::kTripSchema), {}, file);
    const std::string text = err.text();
    CHECK_THAT(text, Catch::Contains("states file " + file + " failed its check") &&
                         Catch::Contains("checksum") && Catch::Contains("compiling schema 'trip'"));
    CHECK(std::count(text.begin(), text.end(), '\n') == 1);
  }
  CHECK(second->tier_stats().file_rejected == 1);
  CHECK_THAT(second->compile_report("trip").source, Catch::Contains("stale"));
  check_same_states(*second, *first, "trip");

  // A span re-read from a file damaged after its schema was added: reported and counted too.
  auto engine = test::tiny_engine(1, [] {
    EngineOptions o;
    o.max_host_bytes = 1;
    return o;
  }());
  engine->add_schema(pml::parse_schema_string(test::kTripSchema), {}, file);  // loads it
  CHECK(engine->tier_stats().file_rejected == 0);
  corrupt_every_tensor(file);
  StderrCapture err;
  CHECK(engine->generate_xml(kPrompts[0], greedy()).tokens ==
        first->generate_xml(kPrompts[0], greedy()).tokens);
  const TierStats s = engine->tier_stats();
  CHECK(s.file_rejected == s.misses);
  CHECK(s.file_rejected > 0);
  CHECK_THAT(err.text(), Catch::Contains(file) && Catch::Contains("checksum"));
}

TEST_CASE("a file write that fails leaves the old file byte for byte and no temporary file",
          "[cache][file]") {
  test::TempDir dir;
  const std::string path = dir.file("kb.states");
  write_safetensors(path, {{"x", torch::arange(16, torch::kFloat32)}}, {{"note", "old"}});
  const std::string old_bytes = read_file(path);
  REQUIRE(files_in(dir.path()) == std::vector<std::string>{"kb.states"});

  SECTION("the file size limit is reached mid-write (as on a full disk)") {
    // In a child: RLIMIT_FSIZE stops the write at 4 KiB (EFBIG; SIGXFSZ ignored). The tensor is
    // made before the fork: the child runs no parallel LibTorch code.
    const auto big = torch::ones({64 * 1024}, torch::kFloat32);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::signal(SIGXFSZ, SIG_IGN);
      const rlimit limit{4096, 4096};
      if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) ::_exit(3);
      try {
        write_safetensors(path, {{"x", big}}, {{"note", "new"}});
      } catch (const Error& e) {
        ::_exit(e.kind() == ErrorKind::kIo ? 0 : 1);
      } catch (...) {
        ::_exit(1);
      }
      ::_exit(2);  // written despite the limit
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
  SECTION("the writer fails after writing part of the file") {
    CHECK_THROWS_WITH(write_file_atomically(path,
                                            [](const FileSink& write) {
                                              write("partial", 7);
                                              throw Error(ErrorKind::kIo, "the disk is full");
                                            }),
                      Catch::Contains("the disk is full"));
  }
  SECTION("the target's folder is gone") {
    CHECK_THROWS_WITH(write_file_atomically(dir.file("missing/kb.states"),
                                            [](const FileSink& write) { write("x", 1); }),
                      Catch::Contains("missing/kb.states"));
  }
  CHECK(read_file(path) == old_bytes);
  CHECK(files_in(dir.path()) == std::vector<std::string>{"kb.states"});
}

TEST_CASE("writers of one file at once each publish whole files under unique temporary names",
          "[cache][file]") {
  test::TempDir dir;
  const std::string path = dir.file("shared.bin");
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&, t] {
      const std::string bytes(200000 + t, static_cast<char>('a' + t));
      for (int i = 0; i < 5; ++i) {
        write_file_atomically(path, [&](const FileSink& write) {
          write(bytes.data(), bytes.size() / 2);
          write(bytes.data() + bytes.size() / 2, bytes.size() - bytes.size() / 2);
        });
      }
    });
  }
  for (auto& t : threads) t.join();
  const std::string got = read_file(path);
  REQUIRE(got.size() >= 200000);
  const int t = static_cast<int>(got.size() - 200000);
  CHECK(got == std::string(200000 + t, static_cast<char>('a' + t)));
  CHECK(files_in(dir.path()) == std::vector<std::string>{"shared.bin"});
}
