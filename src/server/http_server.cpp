// The HTTP side of `promptcache serve`: routes, the API key, and how a job's events become a
// JSON body or a server-sent event stream. The engine is only reached through the Scheduler.
#include <httplib.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <optional>

#include "chat_encoding.hpp"
#include "http_guard.hpp"
#include "openai.hpp"
#include "promptcache/server/server.hpp"
#include "request.hpp"
#include "scheduler.hpp"
#include "views.hpp"

namespace promptcache::server {

const char* playground_html();  // generated from web/playground.html

using nlohmann::json;

namespace {

// How long a handler waits for its job's next event before it writes something to its client
// (a space before a JSON body, an SSE comment in a stream): a write is how a client that went
// away is noticed, and its generation then stops at the next token.
constexpr std::chrono::milliseconds kPoll{200};

// How a job's events become the response.
struct Format {
  std::function<std::string(const Event&)> accepted;  // stream: written first (may be "")
  std::function<std::string(const Event&)> token;     // stream: one per token
  std::function<std::string(const Event&)> progress;  // stream: compile progress
  std::function<std::string(const Event&)> done;      // stream: last event; else the JSON body
  std::string end;                                    // stream: after the last event
};

std::string sse(const json& j) {
  return "data: " + dump(j) + "\n\n";
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump(body), "application/json");
}

// What a posted schema's src attributes may read: nothing, or with --schema-root files inside
// that folder. A file the client names that is missing there is the client's mistake (400).
class PostedSrcFiles final : public pml::SrcResolver {
 public:
  explicit PostedSrcFiles(const std::string& root)
      : root_(root.empty() ? nullptr
                           : std::make_unique<pml::RootedSrcFiles>(
                                 root, pml::RootedSrcFiles::Scope::kInsideRoot,
                                 " (the server reads src files only inside its --schema-root)")) {}
  std::string read(const std::string& src, const SourceLocation& where) const override {
    if (!root_) {
      throw Error(ErrorKind::kSchema,
                  "module src \"" + src +
                      "\" is not read: schemas posted to the server may not read files; put the "
                      "text in the module, or start the server with --schema-root DIR (src "
                      "files inside DIR) or --schema FILE",
                  where);
    }
    try {
      return root_->read(src, where);
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kIo) throw;
      throw Error(ErrorKind::kSchema, e.message(), e.where());
    }
  }

 private:
  std::unique_ptr<pml::RootedSrcFiles> root_;
};

bool stream_query(const httplib::Request& req, bool fallback) {
  if (!req.has_param("stream")) return fallback;
  const std::string v = req.get_param_value("stream");
  return !(v == "0" || v == "false" || v == "no");
}

}  // namespace

SchedulerOptions scheduler_options(const ServerOptions& o) {
  SchedulerOptions s;
  s.max_batch = o.max_batch;
  s.cache_dir = o.cache_dir;
  s.max_queue = o.max_queue;
  s.max_compiles = o.max_compiles;
  s.max_schemas = o.max_schemas;
  s.max_schema_positions = o.max_schema_positions;
  return s;
}

RequestLimits request_limits(const ServerOptions& o) {
  RequestLimits limits;
  limits.max_body_bytes = o.max_body_bytes;
  limits.max_json_depth = o.max_json_depth;
  return limits;
}

// A body the server will not read: chunked (411: its size is unknown until it has been read) or
// announced larger than max_body_bytes (413), or a Content-Length that is no number (400).
static std::optional<LimitError> body_size_refusal(const httplib::Request& req,
                                                   std::size_t max_bytes) {
  if (req.has_header("Transfer-Encoding")) {
    return LimitError(411, "",
                      "request bodies must be sent with a Content-Length (chunked bodies are not "
                      "accepted: their size is unknown until they have been read)");
  }
  if (!req.has_header("Content-Length")) return std::nullopt;
  const std::string value = req.get_header_value("Content-Length");
  std::size_t length = 0;
  bool number = !value.empty() && value.size() <= 19;
  for (const char c : value) {
    number = number && c >= '0' && c <= '9';
    if (number) length = length * 10 + static_cast<std::size_t>(c - '0');
  }
  if (!number) return LimitError(400, "", "the Content-Length header is not a number");
  if (length > max_bytes) {
    return LimitError(413, "max_body_bytes",
                      "the request body is " + std::to_string(length) + " bytes, more than the " +
                          std::to_string(max_bytes) +
                          " the server takes (start it with --max-body-bytes N to allow more)");
  }
  return std::nullopt;
}

struct Server::Impl {
  Impl(std::unique_ptr<Engine> e, ServerOptions o)
      : engine(std::move(e)),
        options(std::move(o)),
        limits(request_limits(options)),
        posted_src(options.schema_root),
        scheduler(*engine, metrics, scheduler_options(options)) {}

  std::unique_ptr<Engine> engine;
  ServerOptions options;
  RequestLimits limits;
  PostedSrcFiles posted_src;
  Metrics metrics;
  Scheduler scheduler;
  httplib::Server http;
  int port = -1;
  bool started = false;
  std::thread listener;
  std::atomic<uint64_t> next_id{1};

  void routes();
  void reply(const JobPtr& job, bool stream, Format format, httplib::Response& res);
  void post_schema(const httplib::Request& req, httplib::Response& res);
  void post_prompt(const httplib::Request& req, httplib::Response& res);
  void post_openai(const httplib::Request& req, httplib::Response& res, bool chat);
  std::vector<TokenId> plain_ids(const std::vector<pml::Turn>& turns) const;
  // Token ids a client sent as the prompt, checked against the vocabulary and the context.
  std::vector<TokenId> checked_ids(std::vector<TokenId> ids) const;
  void delete_schema(const std::string& name, httplib::Response& res);
  void start_scheduler() {
    if (!started) scheduler.start();
    started = true;
  }
};

namespace {

// The headers the guard reads (http_guard.hpp); a header sent more than once is joined with
// ", ", which no rule accepts.
GuardRequest guard_request(const httplib::Request& req) {
  GuardRequest g;
  g.method = req.method;
  g.path = req.path;
  const auto header = [&req](const char* name) -> std::optional<std::string> {
    const std::size_t n = req.get_header_value_count(name);
    if (n == 0) return std::nullopt;
    std::string value = req.get_header_value(name, 0);
    for (std::size_t i = 1; i < n; ++i) value += ", " + req.get_header_value(name, i);
    return value;
  };
  g.host = header("Host");
  g.origin = header("Origin");
  g.content_type = header("Content-Type");
  g.authorization = header("Authorization");
  g.x_api_key = header("X-API-Key");
  return g;
}

}  // namespace

void Server::Impl::reply(const JobPtr& job, bool stream, Format format, httplib::Response& res) {
  job->arrival_ms = now_ms();
  scheduler.submit(job);
  std::optional<Event> first;
  while (!(first = job->channel.pop(kPoll))) {
  }
  if (first->type == Event::Type::kError) {
    send_json(res, first->status, first->body);
    return;
  }
  if (!stream && format.accepted) format.accepted(*first);  // what it records (token counts)
  auto pending = std::make_shared<std::optional<Event>>(std::move(first));
  const auto releaser = [job](bool success) {
    if (!success) job->cancelled = true;
  };
  if (stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [job, format, pending](size_t, httplib::DataSink& sink) {
          const auto write = [&](const std::string& s) {
            if (s.empty() || sink.write(s.data(), s.size())) return true;
            job->cancelled = true;
            return false;
          };
          if (*pending) {
            if (!write(format.accepted(**pending))) return false;
            pending->reset();
          }
          for (;;) {
            std::optional<Event> ev = job->channel.pop(kPoll);
            if (!ev) {
              if (!write(": waiting\n\n")) return false;
              continue;
            }
            switch (ev->type) {
              case Event::Type::kToken:
                if (!write(format.token(*ev))) return false;
                break;
              case Event::Type::kProgress:
                if (!write(format.progress(*ev))) return false;
                break;
              case Event::Type::kDone:
                if (!write(format.done(*ev)) || !write(format.end)) return false;
                sink.done();
                return true;
              case Event::Type::kError:
                // After the status line went out: the error is the stream's last event.
                if (!write(sse(ev->body)) || !write(format.end)) return false;
                sink.done();
                return true;
              case Event::Type::kAccepted:
                break;
            }
          }
        },
        releaser);
    return;
  }
  res.set_chunked_content_provider(
      "application/json",
      [job, format](size_t, httplib::DataSink& sink) {
        double last_write = now_ms();
        for (;;) {
          std::optional<Event> ev = job->channel.pop(kPoll);
          if (now_ms() - last_write >= kPoll.count()) {
            // JSON allows leading whitespace: a space keeps the connection checked.
            if (!sink.write(" ", 1)) {
              job->cancelled = true;
              return false;
            }
            last_write = now_ms();
          }
          if (!ev || (ev->type != Event::Type::kDone && ev->type != Event::Type::kError)) continue;
          const std::string body =
              ev->type == Event::Type::kDone ? format.done(*ev) : dump(ev->body);
          if (!sink.write(body.data(), body.size())) return false;
          sink.done();
          return true;
        }
      },
      releaser);
}

void Server::Impl::post_schema(const httplib::Request& req, httplib::Response& res) {
  const std::string xml =
      schema_xml_from_body(req.body, req.get_header_value("Content-Type"), limits);
  auto job = std::make_shared<Job>();
  job->kind = Job::Kind::kCompile;
  job->schema = parse_posted_schema(xml, posted_src, limits);
  Format f;
  f.accepted = [](const Event& e) { return sse(e.body); };
  f.progress = [](const Event& e) { return sse(e.body); };
  f.token = [](const Event&) { return std::string(); };
  const bool stream = stream_query(req, true);
  f.done = [stream](const Event& e) {
    json done = {{"type", "done"}, {"schema", e.body}};
    return stream ? sse(done) : dump(e.body);
  };
  reply(job, stream, f, res);
}

void Server::Impl::delete_schema(const std::string& name, httplib::Response& res) {
  auto job = std::make_shared<Job>();
  job->kind = Job::Kind::kDelete;
  job->schema_name = name;
  job->arrival_ms = now_ms();
  scheduler.submit(job);
  std::optional<Event> ev;
  while (!(ev = job->channel.pop(kPoll))) {
  }
  send_json(res, ev->type == Event::Type::kError ? ev->status : 200, ev->body);
}

void Server::Impl::post_prompt(const httplib::Request& req, httplib::Response& res) {
  PromptRequest request = parse_prompt_request(req.body, limits);
  auto job = std::make_shared<Job>();
  job->kind = Job::Kind::kPrompt;
  job->params = std::move(request.params);
  job->prompt = std::move(request.prompt);
  job->use_cache = request.use_cache;
  job->recompute = request.recompute;
  resolve_within_context(*engine, job->prompt, job->use_cache);  // errors before queueing
  const bool stream = request.stream;
  const bool use_cache = job->use_cache;
  Format f;
  f.accepted = [](const Event& e) {
    return sse({{"type", "accepted"}, {"prompt_tokens", e.prompt_tokens}});
  };
  f.progress = [](const Event&) { return std::string(); };
  f.token = [](const Event& e) { return sse({{"type", "token"}, {"id", e.id}, {"text", e.text}}); };
  f.done = [stream, use_cache](const Event& e) {
    json j = response_json(e.response, use_cache, e.batch_size, e.queue_ms);
    if (!stream) return dump(j);
    j["type"] = "done";
    return sse(j);
  };
  reply(job, stream, f, res);
}

std::vector<TokenId> Server::Impl::checked_ids(std::vector<TokenId> ids) const {
  const int64_t limit = engine->model().config().max_position_embeddings;
  const int64_t vocab = engine->model().config().vocab_size;
  if (ids.empty()) throw Error(ErrorKind::kPrompt, "the prompt has no tokens");
  for (TokenId id : ids) {
    if (id < 0 || id >= vocab) {
      throw Error(ErrorKind::kInvalidArgument, "'prompt' holds token id " + std::to_string(id) +
                                                   ", outside the model's vocabulary of " +
                                                   std::to_string(vocab));
    }
  }
  if (static_cast<int64_t>(ids.size()) > limit) {
    throw Error(ErrorKind::kContextOverflow, "the prompt is " + std::to_string(ids.size()) +
                                                 " tokens but the model's context is " +
                                                 std::to_string(limit));
  }
  return ids;
}

std::vector<TokenId> Server::Impl::plain_ids(const std::vector<pml::Turn>& turns) const {
  const int64_t limit = engine->model().config().max_position_embeddings;
  check_turns_fit(turns, limit);
  std::vector<TokenId> ids = encode_chat(engine->tokenizer(), engine->chat_template(), turns);
  if (ids.empty()) throw Error(ErrorKind::kPrompt, "the prompt has no tokens");
  if (static_cast<int64_t>(ids.size()) > limit) {
    throw Error(ErrorKind::kContextOverflow, "the prompt is " + std::to_string(ids.size()) +
                                                 " tokens but the model's context is " +
                                                 std::to_string(limit));
  }
  return ids;
}

void Server::Impl::post_openai(const httplib::Request& req, httplib::Response& res, bool chat) {
  CompletionRequest request = parse_completion_request(req.body, chat, limits);
  auto job = std::make_shared<Job>();
  job->params = std::move(request.params);
  if (request.prompt) {
    job->kind = Job::Kind::kPrompt;
    job->prompt = std::move(*request.prompt);
    job->use_cache = request.use_cache;
    job->recompute = request.recompute;
    resolve_within_context(*engine, job->prompt, job->use_cache);  // errors before queueing
  } else {
    // Tokenized and held to the context here, in the request's own thread: the scheduler gets
    // ids that fit.
    job->kind = Job::Kind::kPlain;
    job->ids =
        request.prompt_ids ? checked_ids(std::move(*request.prompt_ids)) : plain_ids(request.turns);
  }
  job->logprobs = request.logprobs;
  job->echo = request.echo;
  // Harnesses score with echo and max_tokens 1 and drop the last entry as the generated one
  // (lm-evaluation-harness: token_logprobs[ctxlen:-1]): that token is reported even when it
  // ends the sequence, as OpenAI does, or the continuation's last token would be dropped.
  if (request.echo && job->params.max_new_tokens == 1) job->params.stop_at_eos = false;
  auto reply_info = std::make_shared<OpenAIReply>();
  reply_info->chat = chat;
  reply_info->id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
  reply_info->model = options.model_name;
  reply_info->created = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  reply_info->logprobs = request.logprobs;
  reply_info->echo = request.echo;
  const Tokenizer* tokenizer = &engine->tokenizer();
  reply_info->token_text = [tokenizer](TokenId id) { return tokenizer->decode_piece(id); };
  auto prompt_tokens = std::make_shared<int64_t>(0);
  const bool usage = request.include_usage;
  Format f;
  f.accepted = [reply_info, prompt_tokens](const Event& e) {
    *prompt_tokens = e.prompt_tokens;
    return reply_info->chat ? sse(openai_chunk(*reply_info, "", true, nullptr)) : std::string();
  };
  f.progress = [](const Event&) { return std::string(); };
  // Streamed log-probabilities: a token whose text is not out yet (part of a character, or held
  // back for a stop string) has its entry sent with the next chunk that has text, or the last.
  struct StreamedLogprobs {
    std::vector<TokenLogprob> pending;
    std::size_t offset = 0;  // text_offset of the next token
  };
  auto streamed = std::make_shared<StreamedLogprobs>();
  const auto take_pending = [reply_info, streamed] {
    std::vector<TokenLogprob> lps = std::move(streamed->pending);
    streamed->pending.clear();
    const std::size_t offset = streamed->offset;
    for (const TokenLogprob& lp : lps)
      streamed->offset += token_string(*reply_info, lp.token).size();
    return std::make_pair(std::move(lps), offset);
  };
  f.token = [reply_info, streamed, take_pending](const Event& e) {
    if (e.logprob) streamed->pending.push_back(*e.logprob);
    if (e.text.empty()) return std::string();
    auto [lps, offset] = take_pending();
    return sse(openai_chunk(*reply_info, e.text, false, nullptr, lps, offset));
  };
  const bool stream = request.stream;
  f.done = [reply_info, prompt_tokens, stream, usage, take_pending](const Event& e) {
    if (!stream) return dump(openai_response(*reply_info, e, *prompt_tokens));
    auto [lps, offset] = take_pending();
    std::string out = sse(
        openai_chunk(*reply_info, "", false, finish_reason(e.response.stop_reason), lps, offset));
    if (usage) out += sse(openai_usage_chunk(*reply_info, e, *prompt_tokens));
    return out;
  };
  f.end = "data: [DONE]\n\n";
  reply(job, stream, f, res);
}

void Server::Impl::routes() {
  http.new_task_queue = [n = options.http_threads] {
    return new httplib::ThreadPool(static_cast<size_t>(n));
  };
  // Larger bodies are refused (413) by cpp-httplib before they are read; the error handler
  // below gives that answer its JSON body. A client that stops sending is dropped after the
  // read timeout.
  http.set_payload_max_length(options.max_body_bytes);
  http.set_read_timeout(std::chrono::seconds(10));
  http.set_write_timeout(std::chrono::seconds(30));
  http.set_keep_alive_timeout(5);
  // Host, Origin, the API key and the POST content type, checked on the headers before the
  // body is read (http_guard.hpp).
  const auto guard = std::make_shared<const GuardOptions>(make_guard_options(
      options.host, options.allowed_origins, options.allowed_hosts, options.api_key));
  http.set_pre_routing_handler([this, guard](const httplib::Request& req, httplib::Response& res) {
    const GuardDecision d = check_request(*guard, guard_request(req));
    for (const auto& [name, value] : d.headers) res.set_header(name, value);
    if (d.status > 0 && d.status < 400) {
      res.status = d.status;  // a preflight's 204
      return httplib::Server::HandlerResponse::Handled;
    }
    json error;
    if (d.status >= 400) {
      res.status = d.status;
      error = error_json(d.message, d.error_type);
    } else if (const std::optional<LimitError> too_large =
                   body_size_refusal(req, options.max_body_bytes)) {
      // Before the body is read: cpp-httplib would read a chunked body of any size, and drain
      // an announced one before its own 413.
      res.status = too_large->status;
      error = error_json(*too_large);
      if (!too_large->limit.empty()) metrics.count_refused(too_large->limit);
    } else {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    const auto body = std::make_shared<const std::string>(dump(error));
    const bool unread_body =
        req.has_header("Transfer-Encoding") ||
        (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
    if (!unread_body) {
      res.set_content(*body, "application/json");
      return httplib::Server::HandlerResponse::Handled;
    }
    // The refused request's body is not read. Were the connection kept, httplib would read that
    // body as the next request: a page could send a request inside a text/plain body past the
    // Origin check. A content provider that reports failure once it wrote the whole answer makes
    // httplib close the connection after the answer.
    res.set_header("Connection", "close");
    res.set_content_provider(body->size(), "application/json",
                             [body](size_t offset, size_t length, httplib::DataSink& sink) {
                               sink.write(body->data() + offset, length);
                               return false;
                             });
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (res.status == 413 && res.body.empty() && !res.content_provider_) {
      metrics.count_refused("max_body_bytes");
      send_json(res, 413,
                error_json(LimitError(413, "max_body_bytes",
                                      "the request body is larger than the " +
                                          std::to_string(options.max_body_bytes) +
                                          " bytes the server takes (start it with "
                                          "--max-body-bytes N to allow more)")));
    }
    if (res.status == 404 && res.body.empty()) {
      send_json(res, 404,
                error_json("no endpoint " + req.method + " " + req.path + " (see docs/server.md)",
                           "not_found_error"));
    }
  });
  // Counted before the response is written (the logger runs after it), so a client that has its
  // answer and then reads /metrics sees its own request.
  http.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    metrics.count_request(endpoint_label(req.path), res.status);
  });
  // Every handler's promptcache::Error becomes a 4xx/5xx JSON error naming the problem.
  const auto guarded = [](std::function<void(const httplib::Request&, httplib::Response&)> h) {
    return [h](const httplib::Request& req, httplib::Response& res) {
      try {
        h(req, res);
      } catch (const Error& e) {
        send_json(res, error_status(e), error_json(e));
      } catch (const LimitError& e) {
        send_json(res, e.status, error_json(e));
      } catch (const std::exception& e) {
        send_json(res, 500, error_json(std::string("internal error: ") + e.what(), "server_error"));
      }
    };
  };
  http.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(playground_html(), "text/html; charset=utf-8");
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const Gauges g = scheduler.gauges();
    send_json(res, 200, {{"status", "ok"}, {"schemas", g.schemas}, {"queued", g.queued}});
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics.render(scheduler.gauges()), "text/plain; version=0.0.4");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200,
              {{"object", "list"},
               {"data", json::array({{{"id", options.model_name},
                                      {"object", "model"},
                                      {"created", 0},
                                      {"owned_by", "promptcache"}}})}});
  });
  http.Get("/v1/schemas", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"schemas", scheduler.schema_list()}});
  });
  http.Get(R"(/v1/schemas/([^/]+))",
           guarded([this](const httplib::Request& req, httplib::Response& res) {
             const std::string name = req.matches[1];
             auto view = scheduler.schema(name);
             if (!view)
               throw Error(ErrorKind::kUnknownSchema, "schema '" + name + "' is not loaded");
             send_json(res, 200, *view);
           }));
  http.Delete(R"(/v1/schemas/([^/]+))",
              guarded([this](const httplib::Request& req, httplib::Response& res) {
                delete_schema(req.matches[1], res);
              }));
  http.Post("/v1/schemas", guarded([this](const httplib::Request& req, httplib::Response& res) {
              post_schema(req, res);
            }));
  http.Post("/v1/prompt", guarded([this](const httplib::Request& req, httplib::Response& res) {
              post_prompt(req, res);
            }));
  http.Post("/v1/chat/completions",
            guarded([this](const httplib::Request& req, httplib::Response& res) {
              post_openai(req, res, true);
            }));
  http.Post("/v1/completions", guarded([this](const httplib::Request& req, httplib::Response& res) {
              post_openai(req, res, false);
            }));
}

Server::Server(std::unique_ptr<Engine> engine, ServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(engine), std::move(options))) {
  impl_->routes();
}

Server::~Server() {
  stop();
}

void Server::add_schema_file(const std::string& path, const Engine::ProgressCallback& progress) {
  if (impl_->started) {
    throw Error(ErrorKind::kInvalidArgument,
                "add_schema_file is for before serving; post schemas to /v1/schemas instead");
  }
  using Scope = pml::RootedSrcFiles::Scope;
  const pml::Schema schema = pml::parse_schema_file(
      path, pml::src_files_beside(
                path, impl_->options.allow_src_outside ? Scope::kAnywhere : Scope::kInsideRoot,
                " (start the server with --allow-src-outside to read files "
                "outside the schema's folder)"));
  try {
    impl_->scheduler.add_schema(schema, progress);
  } catch (const LimitError& e) {
    throw Error(ErrorKind::kInvalidArgument, e.what(), {path, 0, 0, {}});
  }
}

int Server::bind() {
  if (impl_->port >= 0) return impl_->port;
  // A client that goes away mid-response must not kill the server: writes then fail instead.
  std::signal(SIGPIPE, SIG_IGN);
  const ServerOptions& o = impl_->options;
  if (o.port == 0) {
    impl_->port = impl_->http.bind_to_any_port(o.host);
  } else if (impl_->http.bind_to_port(o.host, o.port)) {
    impl_->port = o.port;
  }
  if (impl_->port <= 0) {
    impl_->port = -1;
    throw Error(ErrorKind::kIo, "cannot listen on " + o.host + ":" + std::to_string(o.port) +
                                    " (in use, or not an address of this machine)");
  }
  return impl_->port;
}

void Server::listen() {
  bind();
  impl_->start_scheduler();
  impl_->http.listen_after_bind();
}

int Server::start() {
  const int p = bind();
  impl_->start_scheduler();
  impl_->listener = std::thread([this] { impl_->http.listen_after_bind(); });
  // Return once the listener thread is accepting, so the caller can connect at once.
  for (int waited = 0; !impl_->http.is_running(); ++waited) {
    if (waited == 10000) throw Error(ErrorKind::kIo, "the HTTP listener did not start");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return p;
}

void Server::stop() {
  if (!impl_) return;
  // The scheduler first: queued requests are refused and the running generation ends, so no
  // handler is left waiting when the HTTP threads are joined.
  impl_->scheduler.stop();
  impl_->http.stop();
  if (impl_->listener.joinable()) impl_->listener.join();
}

int Server::port() const {
  return impl_->port;
}

}  // namespace promptcache::server
