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
  server::Scheduler scheduler(*engine, metrics, /*max_batch=*/12, "");
  scheduler.add_schema_file(dir.file("docs.xml"), {});
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
