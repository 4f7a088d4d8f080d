// The scheduler on its own: queued prompts decode together in one continuous batch (at most
// max_batch rows, each with its own sampling parameters), later ones join as rows finish, and
// each gets the answer it would get alone; one bad prompt fails alone.
#include <fstream>
#include <map>

#include "scheduler.hpp"
#include "server/server_fixture.hpp"

using namespace promptcache;
using namespace promptcache::test;

namespace {

server::JobPtr prompt_job(const std::string& xml, int max_new_tokens) {
  auto job = std::make_shared<server::Job>();
  job->kind = server::Job::Kind::kPrompt;
  job->prompt = pml::parse_prompt_string(xml);
  job->params.max_new_tokens = max_new_tokens;
  job->arrival_ms = now_ms();
  return job;
}

server::JobPtr plain_job(std::vector<TokenId> ids, int max_new_tokens) {
  auto job = std::make_shared<server::Job>();
  job->kind = server::Job::Kind::kPlain;
  job->ids = std::move(ids);
  job->params.max_new_tokens = max_new_tokens;
  job->params.stop_at_eos = false;
  job->arrival_ms = now_ms();
  return job;
}

// The job's last event (kDone or kError), with its tokens streamed before it.
struct Outcome {
  server::Event last;
  std::vector<TokenId> streamed;
  bool accepted = false;
};
Outcome wait(server::Job& job) {
  Outcome out;
  for (;;) {
    auto ev = job.channel.pop(std::chrono::milliseconds(60000));
    REQUIRE(ev);
    if (ev->type == server::Event::Type::kAccepted) out.accepted = true;
    if (ev->type == server::Event::Type::kToken) out.streamed.push_back(ev->id);
    if (ev->type == server::Event::Type::kDone || ev->type == server::Event::Type::kError) {
      out.last = std::move(*ev);
      return out;
    }
  }
}

}  // namespace

TEST_CASE("scheduler: prompts decode together, at most max_batch rows, and join as rows free",
          "[server]") {
  TempDir dir("promptcache-sched");
  { std::ofstream(dir.file("docs.xml")) << docs_schema(); }
  auto engine = tiny_engine();
  auto ref = tiny_engine();
  ref->add_schema_string(docs_schema());
  server::Metrics metrics;
  server::Scheduler scheduler(*engine, metrics, server::SchedulerOptions{/*max_batch=*/12});
  scheduler.add_schema(pml::parse_schema_file(dir.file("docs.xml")), {});
  // 16 good prompts and one naming a module that does not exist, all queued before the
  // scheduler starts, so which run together does not depend on timing.
  std::vector<server::JobPtr> jobs;
  for (int i = 0; i < 16; ++i) {
    jobs.push_back(prompt_job(docs_prompt(i), 10));
    if (i == 3) jobs.push_back(prompt_job("<prompt schema=\"docs\"><d42/></prompt>", 10));
  }
  // One with other sampling parameters runs in the same batch and finishes first.
  auto other = prompt_job(docs_prompt(7), 6);
  jobs.insert(jobs.begin() + 2, other);
  for (auto& job : jobs) scheduler.submit(job);
  scheduler.start();
  std::vector<int> sizes;
  int good = 0;
  for (auto& job : jobs) {
    Outcome o = wait(*job);
    if (job->prompt.modules[0].name == "d42") {
      CHECK(o.last.type == server::Event::Type::kError);
      CHECK(o.last.status == 400);
      CHECK(o.last.body["error"]["kind"] == "unknown module");
      continue;
    }
    REQUIRE(o.last.type == server::Event::Type::kDone);
    CHECK(o.accepted);
    const Response expected = ref->generate(job->prompt, job->params);
    CHECK(o.last.response.tokens == expected.tokens);
    CHECK(o.streamed == expected.tokens);
    CHECK(o.last.batch_size <= 12);
    if (job == other) {
      CHECK(o.last.batch_size == 12);
    } else {
      sizes.push_back(o.last.batch_size);
      ++good;
    }
  }
  CHECK(good == 16);
  // Queue order: 2 good, the other, 2 good, the bad one (refused, taking no row), 12 good. The
  // first 12 rows are 11 good ones and the other; the 12th good one joins when the other
  // finishes (after 6 tokens), the last 4 when the first 11 have finished.
  std::map<int, int> count;
  for (int s : sizes) ++count[s];
  CHECK(count[12] == 12);
  CHECK(count[5] == 4);
  const std::string text = metrics.render({});
  CHECK(text.find("promptcache_batch_joins_total 5\n") != std::string::npos);
  CHECK(text.find("promptcache_batch_size_bucket{le=\"16\"} 17") != std::string::npos);
  scheduler.stop();
}

TEST_CASE("scheduler: plain completions join the batch beside prompts and count as its rows",
          "[server]") {
  TempDir dir("promptcache-sched-plain");
  { std::ofstream(dir.file("docs.xml")) << docs_schema(); }
  auto engine = tiny_engine();
  auto ref = tiny_engine();
  ref->add_schema_string(docs_schema());
  server::Metrics metrics;
  server::Scheduler scheduler(*engine, metrics, server::SchedulerOptions{/*max_batch=*/3});
  scheduler.add_schema(pml::parse_schema_file(dir.file("docs.xml")), {});
  const Tokenizer& tok = ref->tokenizer();
  // Queued before the scheduler starts: a long prompt first, then plain prompts (sharing a
  // beginning) mixed with short prompts, and one empty plain prompt. Three rows: the long
  // prompt and two others start together; every later one joins the running batch as a row
  // frees, while the long prompt still decodes.
  std::vector<server::JobPtr> jobs;
  jobs.push_back(prompt_job(docs_prompt(0), 40));
  jobs.back()->params.stop_at_eos = false;
  const char* endings[] = {"a cat.", "a dog.", "a bird in a tree.", "a boat.", "a cake."};
  for (int i = 0; i < 8; ++i) {
    if (i % 3 == 1) {
      jobs.push_back(prompt_job(docs_prompt(i), 3 + i % 4));
      jobs.back()->params.stop_at_eos = false;
    } else {
      jobs.push_back(
          plain_job(tok.encode(std::string("Once upon a time there was ") + endings[i % 5], true),
                    3 + i % 4));
    }
    if (i == 4) jobs.push_back(plain_job({}, 4));
  }
  for (auto& job : jobs) scheduler.submit(job);
  scheduler.start();
  int plain = 0, plain_reused = 0, admitted = 0;
  for (std::size_t j = 0; j < jobs.size(); ++j) {
    server::Job& job = *jobs[j];
    Outcome o = wait(job);
    INFO("job " << j);
    if (job.kind == server::Job::Kind::kPlain && job.ids.empty()) {
      CHECK(o.last.type == server::Event::Type::kError);
      CHECK(o.last.status == 400);
      CHECK(o.last.body["error"]["message"].get<std::string>().find("no tokens") !=
            std::string::npos);
      continue;
    }
    REQUIRE(o.last.type == server::Event::Type::kDone);
    CHECK(o.accepted);
    ++admitted;
    CHECK(o.last.batch_size >= 2);
    CHECK(o.last.batch_size <= 3);
    std::vector<TokenId> expected;
    if (job.kind == server::Job::Kind::kPlain) {
      ++plain;
      expected = generate(ref->model(), tok, job.ids, job.params).tokens;
      plain_reused += o.last.response.cached_tokens > 0;
      CHECK(o.last.response.cached_tokens + o.last.response.fresh_tokens ==
            static_cast<int64_t>(job.ids.size()));
    } else {
      expected = ref->generate(job.prompt, job.params).tokens;
    }
    CHECK(o.last.response.tokens == expected);
    CHECK(o.streamed == expected);
  }
  CHECK(plain == 5);
  CHECK(admitted == 9);
  // The plain prompts after the first take their shared beginning from the prefix store.
  CHECK(plain_reused == 4);
  // The first three started the batch; the other six joined it while it decoded.
  const std::string text = metrics.render({});
  CHECK(text.find("promptcache_batch_joins_total 6\n") != std::string::npos);
  CHECK(text.find("promptcache_batch_size_count 9\n") != std::string::npos);
  scheduler.stop();
}
