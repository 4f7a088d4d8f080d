// promptcache._promptcache: the Python face of promptcache::Engine (docs/python.md). The Python
// package (python/promptcache/__init__.py) re-exports these names and adds Engine.eval's
// iterator and progress bar.
//
// - The GIL is released around every call into the engine; the C++ Engine serves several
//   threads at once, so one Python Engine may be used from several threads.
// - Ctrl-C: generation polls Python's signal handlers between tokens (at most every 20 ms, on the
//   main thread only), stops the request through its token callback and raises KeyboardInterrupt;
//   an evaluation stops the batch it runs the same way (its rows are not written). The engine is
//   left usable.
// - promptcache::Error becomes promptcache.Error, or its subclasses SchemaError (PML problems, also
//   a ValueError) and ModelError (model folders and files), with the CLI's message and the
//   location as attributes.
// - next_token_logits hands the LibTorch tensor to Python's torch through DLPack: no copy, and no
//   link to libtorch_python (docs/python.md, "Tensors").
#include <ATen/DLConvertor.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pythread.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "promptcache/engine.hpp"
#include "promptcache/error.hpp"
#include "promptcache/eval.hpp"
#include "promptcache/generation.hpp"
#include "promptcache/model/blas_core.hpp"
#include "promptcache/model/threads.hpp"
#include "promptcache/pml/prompt.hpp"
#include "promptcache/pml/schema.hpp"

namespace py = pybind11;
using namespace promptcache;

namespace {

// The exception classes, made when the module is imported.
PyObject* g_error = nullptr;
PyObject* g_schema_error = nullptr;
PyObject* g_model_error = nullptr;
// Python's main thread (the one its signal handlers run in), whichever thread imported us.
unsigned long g_main_thread = 0;

bool is_schema_kind(ErrorKind k) {
  switch (k) {
    case ErrorKind::kXmlSyntax:
    case ErrorKind::kSchema:
    case ErrorKind::kUnknownSchema:
    case ErrorKind::kUnknownModule:
    case ErrorKind::kUnionConflict:
    case ErrorKind::kUnknownParameter:
    case ErrorKind::kArgumentTooLong:
    case ErrorKind::kPrompt:
      return true;
    default:
      return false;
  }
}

bool is_model_kind(ErrorKind k) {
  return k == ErrorKind::kModel || k == ErrorKind::kSafetensors || k == ErrorKind::kTokenizer;
}

void raise_error(const Error& e, PyObject* type) {
  py::object cls = py::reinterpret_borrow<py::object>(type);
  py::object exc = cls(py::str(e.what()));
  const SourceLocation& w = e.where();
  exc.attr("kind") = py::str(to_string(e.kind()));
  exc.attr("message") = py::str(e.message());
  exc.attr("file") = w.file.empty() ? py::object(py::none()) : py::object(py::str(w.file));
  exc.attr("line") = w.line > 0 ? py::object(py::int_(w.line)) : py::object(py::none());
  exc.attr("column") = w.column > 0 ? py::object(py::int_(w.column)) : py::object(py::none());
  exc.attr("element") = w.element.empty() ? py::object(py::none()) : py::object(py::str(w.element));
  PyErr_SetObject(type, exc.ptr());
}

// Error -> the Python class for its kind. While Engine() opens the model, a file that cannot be
// read is the model's too (ModelError).
void translate(const Error& e, bool opening_model) {
  if (is_model_kind(e.kind()) || (opening_model && e.kind() == ErrorKind::kIo)) {
    return raise_error(e, g_model_error);
  }
  if (is_schema_kind(e.kind())) return raise_error(e, g_schema_error);
  raise_error(e, g_error);
}

// Polls Python's signal handlers from inside a GIL-free call (between tokens or rows): true when
// one raised (KeyboardInterrupt is then the thread's pending exception). Only the main thread
// runs Python's handlers; every 20 ms at most, so the GIL is not taken per token.
class InterruptPoll {
 public:
  bool operator()() {
    if (hit_) return true;
    if (PyThread_get_thread_ident() != g_main_thread) return false;  // no GIL needed
    const double now = now_ms();
    if (now - last_ < 20) return false;
    last_ = now;
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) hit_ = true;
    return hit_;
  }
  bool hit() const { return hit_; }

 private:
  bool hit_ = false;
  double last_ = now_ms();  // the first poll after 20 ms: a short call never takes the GIL
};

// The pml::Prompt of a Python prompt: PML text, or a Prompt object.
pml::Prompt to_prompt(const py::handle& p) {
  if (py::isinstance<pml::Prompt>(p)) return p.cast<pml::Prompt>();
  if (py::isinstance<py::str>(p)) return pml::parse_prompt_string(p.cast<std::string>());
  throw py::type_error("a prompt is PML text (str) or a promptcache.Prompt, not " +
                       std::string(py::str(p.get_type())));
}

// modules=["inst", ("guide", {"name": "Anna"}), ("doc", {}, ["intro"])]
std::vector<pml::ModuleRef> to_refs(const py::handle& list, int depth) {
  if (depth > 32) throw py::value_error("modules are nested deeper than 32 levels");
  std::vector<pml::ModuleRef> out;
  for (const py::handle& item : list) {
    pml::ModuleRef ref;
    if (py::isinstance<py::str>(item)) {
      ref.name = item.cast<std::string>();
    } else if (py::isinstance<py::tuple>(item) || py::isinstance<py::list>(item)) {
      const py::sequence t = py::reinterpret_borrow<py::sequence>(item);
      if (t.size() < 1 || t.size() > 3 || !py::isinstance<py::str>(t[0])) {
        throw py::type_error(
            "a module is a name or a tuple (name, {parameter: value}, [nested modules])");
      }
      ref.name = t[0].cast<std::string>();
      if (t.size() >= 2 && !t[1].is_none()) {
        for (const auto& kv : t[1].cast<py::dict>()) {
          ref.arguments.push_back(
              {py::str(kv.first).cast<std::string>(), py::str(kv.second).cast<std::string>(), {}});
        }
      }
      if (t.size() == 3) ref.children = to_refs(t[2], depth + 1);
    } else {
      throw py::type_error(
          "a module is a name or a tuple (name, {parameter: value}, [nested modules])");
    }
    ref.where = SourceLocation{"<Prompt>", 0, 0, "module '" + ref.name + "'"};
    out.push_back(std::move(ref));
  }
  return out;
}

SamplingParams sampling(int max_new_tokens, double temperature, const py::object& stop, int top_k,
                        double top_p, double repetition_penalty, uint64_t seed, bool ignore_eos) {
  SamplingParams p;
  p.max_new_tokens = max_new_tokens;
  p.temperature = static_cast<float>(temperature);
  p.top_k = top_k;
  p.top_p = static_cast<float>(top_p);
  p.repetition_penalty = static_cast<float>(repetition_penalty);
  p.seed = seed;
  p.stop_at_eos = !ignore_eos;
  if (!stop.is_none()) {
    if (py::isinstance<py::str>(stop)) {
      p.stop_strings.push_back(stop.cast<std::string>());
    } else {
      p.stop_strings = stop.cast<std::vector<std::string>>();
    }
  }
  p.validate();
  return p;
}

struct Generation {
  std::string text;
  std::vector<TokenId> token_ids;
  int64_t prompt_tokens = 0, cached_tokens = 0, fresh_tokens = 0;
  double ttft_ms = 0, assembly_ms = 0, prefill_ms = 0, decode_ms = 0;
  std::string stop_reason;
};

Generation to_generation(const Response& r) {
  Generation g;
  g.text = r.text;
  g.token_ids = r.tokens;
  g.prompt_tokens = r.cached_tokens + r.fresh_tokens;
  g.cached_tokens = r.cached_tokens;
  g.fresh_tokens = r.fresh_tokens;
  g.ttft_ms = r.timings.ttft_ms;
  g.assembly_ms = r.timings.assembly_ms;
  g.prefill_ms = r.timings.fresh_prefill_ms;
  g.decode_ms = r.timings.decode_ms;
  g.stop_reason = to_string(r.stop_reason);
  return g;
}

struct Score {
  std::vector<double> logprobs;
  std::vector<std::vector<TokenId>> tokens;
  std::vector<std::vector<double>> logprob_per_token;
  std::size_t pred = 0;
  int64_t prompt_tokens = 0, cached_tokens = 0;
};

// The Python Engine: a shared C++ Engine (threads may hold it while Python drops its object).
class PyEngine {
 public:
  PyEngine(const std::string& model, const std::string& device, const py::object& weights,
           int threads, const py::object& cache_dir, const py::object& redis,
           const py::object& dtype, const py::object& kv_dtype, const py::object& chat_template,
           const std::string& encoding, const py::object& cache_secret) {
    namespace fs = std::filesystem;
    std::string dir = model;
    std::error_code ec;
    if (fs::is_regular_file(dir, ec)) dir = fs::path(dir).parent_path().string();  // config.json
    if (!cache_dir.is_none()) cache_dir_ = cache_dir.cast<std::string>();
    EngineOptions options;
    try {
      options.load.device = parse_device(device);
      if (!weights.is_none())
        options.load.weights = parse_weight_dtype(weights.cast<std::string>());
      if (!dtype.is_none()) options.load.dtype = parse_dtype(dtype.cast<std::string>());
      if (!kv_dtype.is_none()) options.load.kv_dtype = parse_dtype(kv_dtype.cast<std::string>());
      options.encoding = parse_encoding_mode(encoding);
    } catch (const Error& e) {
      translate(e, false);
      throw py::error_already_set();
    }
    if (!chat_template.is_none()) options.chat_template = chat_template.cast<std::string>();
    if (!redis.is_none()) {
      options.redis_url = redis.cast<std::string>();
      if (!cache_secret.is_none()) {
        options.cache_secret = cache_secret.cast<std::string>();
      } else if (const char* env = std::getenv("PROMPTCACHE_CACHE_SECRET")) {
        options.cache_secret = env;
      }
      if (options.cache_secret.empty()) {
        throw py::value_error(
            "redis= needs a secret to seal the values it stores, the same in every process "
            "sharing the server: cache_secret= or $PROMPTCACHE_CACHE_SECRET");
      }
    }
    try {
      py::gil_scoped_release nogil;
      configure_threads(threads);
      engine_ = Engine::open(dir, options);
    } catch (const Error& e) {
      translate(e, true);
      throw py::error_already_set();
    }
  }

  Engine& engine() { return *engine_; }

  std::string add_schema(const std::string& schema) {
    namespace fs = std::filesystem;
    const auto first = schema.find_first_not_of(" \t\r\n");
    const bool xml = first != std::string::npos && schema[first] == '<';
    InterruptPoll poll;  // Ctrl-C stops a long compile (the engine keeps what it had)
    std::string name;
    try {
      py::gil_scoped_release nogil;
      pml::Schema parsed =
          xml ? pml::parse_schema_string(schema, "<string>") : pml::parse_schema_file(schema);
      std::string file;
      if (!cache_dir_.empty()) {
        std::error_code ec;
        fs::create_directories(cache_dir_, ec);
        file =
            (fs::path(cache_dir_) / cache_file_name(engine_->layout_only(parsed), engine_->model(),
                                                    engine_->options().encoding))
                .string();
      }
      engine_->add_schema(parsed, {}, file, Engine::StatesPolicy::kReuse, [&] { return poll(); });
      name = parsed.name;
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kCancelled || !poll.hit()) throw;
    }
    if (poll.hit()) throw py::error_already_set();  // the KeyboardInterrupt the poll raised
    return name;
  }

  Generation generate(const py::object& prompt, const SamplingParams& params, bool no_cache) {
    pml::Prompt p = to_prompt(prompt);
    RequestOptions request;
    request.use_cache = !no_cache;
    InterruptPoll poll;
    Response r;
    {
      py::gil_scoped_release nogil;
      r = engine_->generate(
          p, params, [&](TokenId, const std::string&) { return !poll(); }, request);
    }
    if (poll.hit()) throw py::error_already_set();
    return to_generation(r);
  }

  std::vector<Generation> generate_batch(const py::list& prompts, const SamplingParams& params,
                                         bool no_cache) {
    std::vector<pml::Prompt> ps;
    for (const auto& p : prompts) ps.push_back(to_prompt(p));
    RequestOptions request;
    request.use_cache = !no_cache;
    InterruptPoll poll;
    std::vector<Response> rs;
    {
      py::gil_scoped_release nogil;
      rs = engine_->generate_batch(
          ps, params, [&](std::size_t, TokenId, const std::string&) { return !poll(); }, request);
    }
    if (poll.hit()) throw py::error_already_set();
    std::vector<Generation> out;
    for (const auto& r : rs) out.push_back(to_generation(r));
    return out;
  }

  Score score(const py::object& prompt, const std::vector<std::string>& choices, bool no_cache) {
    pml::Prompt p = to_prompt(prompt);
    RequestOptions request;
    request.use_cache = !no_cache;
    ScoreResponse s;
    {
      py::gil_scoped_release nogil;
      std::vector<std::vector<TokenId>> conts;
      for (const auto& c : choices) conts.push_back(engine_->encode_continuation(c));
      s = engine_->score(p, conts, request);
    }
    Score out;
    for (std::size_t k = 0; k < s.continuations.size(); ++k) {
      const auto& c = s.continuations[k];
      out.logprobs.push_back(c.logprob);
      out.tokens.push_back(c.tokens);
      out.logprob_per_token.push_back(c.logprob_per_token);
      if (c.logprob > out.logprobs[out.pred]) out.pred = k;
    }
    out.prompt_tokens = s.prompt_tokens;
    out.cached_tokens = s.cached_tokens;
    return out;
  }

  // [vocab] float32 logits after the prompt, as a DLPack capsule (torch.from_dlpack in Python).
  py::capsule next_token_logits(const py::object& prompt, bool no_cache) {
    pml::Prompt p = to_prompt(prompt);
    torch::Tensor logits;
    {
      py::gil_scoped_release nogil;
      const pml::ResolvedPrompt resolved = engine_->resolve(p);
      KVCache cache = engine_->model().make_cache(0);
      logits = engine_->prefill(resolved, cache, !no_cache).logits.contiguous();
    }
    DLManagedTensor* dl = at::toDLPack(logits);
    return py::capsule(dl, "dltensor", [](PyObject* capsule) {
      // Still named "dltensor": nobody took it (torch renames it "used_dltensor").
      if (PyCapsule_IsValid(capsule, "dltensor")) {
        auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
        if (t != nullptr && t->deleter != nullptr) t->deleter(t);
      }
    });
  }

  std::vector<TokenId> tokenize(const std::string& text, bool bos) {
    return engine_->tokenizer().encode(text, bos && engine_->tokenizer().adds_bos());
  }
  std::string detokenize(const std::vector<TokenId>& ids) {
    return engine_->tokenizer().decode(ids);
  }

  py::list layout(const std::string& schema) {
    const pml::Layout& l = engine_->layout(schema);
    py::list out;
    for (const auto& m : l.modules) {
      if (m.is_root()) continue;
      py::dict d;
      d["name"] = m.name;
      d["path"] = m.path;
      d["begin"] = m.begin;
      d["end"] = m.end;
      d["length"] = m.length();
      d["cached"] = m.cacheable;
      d["in_union"] = !m.unions.empty();
      d["parameters"] = m.parameters.size();
      out.append(d);
    }
    return out;
  }

 private:
  std::shared_ptr<Engine> engine_;
  std::string cache_dir_;
};

// One evaluation run (python/promptcache/__init__.py wraps it as Engine.eval's iterator).
class PyEvaluation {
 public:
  PyEvaluation(PyEngine& engine, const std::string& schema, const py::object& path,
               const std::string& data_name, const py::object& out, bool no_cache,
               std::size_t batch, std::size_t limit, bool strict, const SamplingParams& params) {
    eval::EvalOptions options;
    options.defaults.params = params;
    options.defaults.stop = params.stop_strings;
    options.defaults.params.stop_strings.clear();
    options.use_cache = !no_cache;
    options.batch = batch;
    options.strict = strict;
    options.cancelled = [this] { return poll_(); };
    options.warn = [this](const std::string& w) { warnings_.push_back(w); };
    limit_ = limit;
    run_.emplace(engine.engine(), schema, data_name, out.is_none() ? "" : out.cast<std::string>(),
                 options);
    if (!path.is_none()) {
      const std::string p = path.cast<std::string>();
      in_.emplace(p, std::ios::binary);
      if (!*in_) throw Error(ErrorKind::kIo, "cannot read " + p);
      reader_.emplace(*in_);
    }
    start_ = now_ms();
  }

  // Reads lines of the file until something happened (a batch ran, a line failed) or it ended.
  // Returns the events as tuples: ("row", line, json text) or ("error", line, message); an empty
  // list at the end (after the last batch has run).
  py::list next_events() {
    std::vector<eval::Evaluation::Event> events;
    run_guarded([&] {
      run_->read_some(*reader_, limit_);
      events = run_->take_events();
    });
    return to_list(events);
  }

  // One row given as a JSON line (an iterable of dicts); rows run when a batch is full.
  py::list add(const std::string& text) {
    std::vector<eval::Evaluation::Event> events;
    run_guarded([&] {
      ++rows_read_;
      run_->add_line(text, rows_read_, text.size() > eval::kMaxLineBytes);
      events = run_->take_events();
    });
    return to_list(events);
  }

  py::list finish_rows() {
    std::vector<eval::Evaluation::Event> events;
    run_guarded([&] {
      finish();
      events = run_->take_events();
    });
    return to_list(events);
  }

  std::size_t rows_read() const { return reader_ ? run_->rows_read() : rows_read_; }
  bool stopped() const { return run_->stopped(); }
  std::string summary() const { return run_->summary((now_ms() - start_) / 1e3).dump(); }

 private:
  void finish() { run_->flush(); }

  template <typename F>
  void run_guarded(F&& work) {
    bool cancelled = false;
    {
      py::gil_scoped_release nogil;
      try {
        work();
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kCancelled || !poll_.hit()) throw;
        cancelled = true;
      }
    }
    if (cancelled) throw py::error_already_set();  // the KeyboardInterrupt the poll raised
  }

  py::list to_list(std::vector<eval::Evaluation::Event>& events) {
    auto stderr_write = py::module_::import("sys").attr("stderr").attr("write");
    for (const auto& w : warnings_) stderr_write("promptcache: warning: " + w + "\n");
    warnings_.clear();
    py::list out;
    for (auto& e : events) {
      if (e.outcome) {
        out.append(
            py::make_tuple("row", e.line,
                           e.outcome->line.dump(-1, ' ', false,
                                                nlohmann::ordered_json::error_handler_t::replace)));
      } else {
        out.append(py::make_tuple("error", e.line, e.error));
      }
    }
    return out;
  }

  InterruptPoll poll_;
  std::optional<eval::Evaluation> run_;
  std::optional<std::ifstream> in_;
  std::optional<eval::LineReader> reader_;
  std::vector<std::string> warnings_;
  std::size_t rows_read_ = 0, limit_ = 0;  // rows_read_: add()'s
  double start_ = 0;
};

// Milliseconds of each of `calls` runs of `work`, with the GIL released (bench_python.py).
template <typename F>
std::vector<double> time_calls(int calls, F&& work) {
  std::vector<double> ms;
  py::gil_scoped_release nogil;
  for (int i = 0; i < calls; ++i) {
    const double start = now_ms();
    work();
    ms.push_back(now_ms() - start);
  }
  return ms;
}

PyObject* make_exception(const char* name, const char* doc, py::tuple bases, py::module_& m) {
  PyObject* cls = PyErr_NewExceptionWithDoc(name, doc, bases.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  const std::string short_name = std::string(name).substr(std::string(name).rfind('.') + 1);
  m.add_object(short_name.c_str(), py::handle(cls));
  return cls;
}

}  // namespace

PYBIND11_MODULE(_promptcache, m) {
  m.doc() = "promptcache's C++ engine (use the promptcache package, which re-exports it)";
  g_main_thread =
      py::module_::import("threading").attr("main_thread")().attr("ident").cast<unsigned long>();
  // OpenBLAS's kernels for this processor (blas_core.hpp), chosen while no other thread can be
  // inside a GEMM: with other Python threads running, OpenBLAS's own choice is kept.
  if (py::module_::import("threading").attr("active_count")().cast<int>() == 1) {
    select_blas_core();
  } else {
    select_blas_core(false, "kept: promptcache was imported while other threads ran");
  }

  g_error = make_exception(
      "promptcache.Error",
      "Every error promptcache reports. str(e) is the message the CLI prints; kind, message, file, "
      "line, column and element say what and where (None when unknown).",
      py::make_tuple(py::handle(PyExc_Exception)), m);
  g_schema_error = make_exception(
      "promptcache.SchemaError",
      "A PML problem: malformed XML, an invalid schema or prompt, an unknown schema or module, two "
      "members of one union, an argument too long. Also a ValueError.",
      py::make_tuple(py::handle(g_error), py::handle(PyExc_ValueError)), m);
  g_model_error = make_exception(
      "promptcache.ModelError",
      "A model folder or file that cannot be used: missing, wrong or inconsistent config.json, "
      "safetensors or tokenizer files.",
      py::make_tuple(py::handle(g_error)), m);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      translate(e, false);
    }
  });

  py::class_<pml::Prompt>(m, "Prompt", R"doc(A prompt built in code instead of PML text.

Prompt(schema="trip", modules=["city", ("guide", {"name": "Anna"})], text="What should I pack?")

modules: names, or tuples (name, {parameter: argument}) and (name, {parameter: argument},
[nested modules]), in schema order. text: the prompt's own text after the modules.
Equal to <prompt schema="trip"><city/><guide name="Anna"/> What should I pack?</prompt>.)doc")
      .def(py::init(
               [](const std::string& schema, const py::object& modules, const std::string& text) {
                 if (schema.empty()) throw py::value_error("Prompt needs a schema name");
                 pml::Prompt p;
                 p.schema = schema;
                 p.file = "<Prompt>";
                 p.where = SourceLocation{"<Prompt>", 0, 0, "prompt"};
                 if (!modules.is_none()) p.modules = to_refs(modules, 0);
                 if (!pml::trim(text).empty()) {
                   p.turns.push_back({std::nullopt, pml::compact_whitespace(text),
                                      SourceLocation{"<Prompt>", 0, 0, "text"}});
                 }
                 return p;
               }),
           py::arg("schema"), py::arg("modules") = py::none(), py::arg("text") = "")
      .def_readonly("schema", &pml::Prompt::schema, "the schema's name")
      .def_property_readonly(
          "text",
          [](const pml::Prompt& p) {
            std::string t;
            for (const auto& turn : p.turns) t += turn.text;
            return t;
          },
          "the prompt's own text")
      .def_property_readonly(
          "modules",
          [](const pml::Prompt& p) {
            std::vector<std::string> names;
            for (const auto& r : p.modules) names.push_back(r.name);
            return names;
          },
          "the names of the modules it selects (top level)")
      .def("__repr__", [](const pml::Prompt& p) {
        std::string mods;
        for (const auto& r : p.modules) mods += (mods.empty() ? "'" : ", '") + r.name + "'";
        return "Prompt(schema='" + p.schema + "', modules=[" + mods + "])";
      });

  py::class_<SamplingParams>(m, "_Sampling")
      .def(py::init(&sampling), py::arg("max_new_tokens"), py::arg("temperature"), py::arg("stop"),
           py::arg("top_k"), py::arg("top_p"), py::arg("repetition_penalty"), py::arg("seed"),
           py::arg("ignore_eos"));

  py::class_<Generation>(m, "Generation", "What Engine.generate gave for one prompt.")
      .def_readonly("text", &Generation::text, "the generated text (stop string removed)")
      .def_readonly("token_ids", &Generation::token_ids, "the generated token ids")
      .def_readonly("prompt_tokens", &Generation::prompt_tokens,
                    "the prompt's tokens: cached_tokens + fresh_tokens")
      .def_readonly("cached_tokens", &Generation::cached_tokens,
                    "prompt tokens served from the module store")
      .def_readonly("fresh_tokens", &Generation::fresh_tokens,
                    "prompt tokens run through the model")
      .def_readonly("ttft_ms", &Generation::ttft_ms, "time to the first token, in ms")
      .def_readonly("assembly_ms", &Generation::assembly_ms,
                    "placing the stored states in the KV cache, in ms")
      .def_readonly("prefill_ms", &Generation::prefill_ms, "the fresh tokens' forward, in ms")
      .def_readonly("decode_ms", &Generation::decode_ms, "decoding after the first token, in ms")
      .def_readonly("stop_reason", &Generation::stop_reason,
                    "why it ended: 'max tokens', 'eos', 'stop string', ...")
      .def("__repr__", [](const Generation& g) {
        return "Generation(text=" + std::string(py::repr(py::str(g.text))) +
               ", prompt_tokens=" + std::to_string(g.prompt_tokens) +
               ", cached_tokens=" + std::to_string(g.cached_tokens) + ")";
      });

  py::class_<Score>(m, "Score", "What Engine.score gave: one entry per choice.")
      .def_readonly("logprobs", &Score::logprobs,
                    "each choice's log-probability (the sum over its tokens)")
      .def_readonly("tokens", &Score::tokens, "each choice's token ids")
      .def_readonly("logprob_per_token", &Score::logprob_per_token,
                    "each choice's per-token log-probabilities")
      .def_readonly("pred", &Score::pred, "the index of the likeliest choice")
      .def_readonly("prompt_tokens", &Score::prompt_tokens, "the prompt's tokens")
      .def_readonly("cached_tokens", &Score::cached_tokens,
                    "of those, tokens served from the module store")
      .def("__repr__", [](const Score& s) {
        return "Score(pred=" + std::to_string(s.pred) +
               ", logprobs=" + std::string(py::repr(py::cast(s.logprobs))) + ")";
      });

  py::class_<PyEngine>(m, "_Engine")
      .def(py::init<const std::string&, const std::string&, const py::object&, int,
                    const py::object&, const py::object&, const py::object&, const py::object&,
                    const py::object&, const std::string&, const py::object&>(),
           py::arg("model"), py::arg("device"), py::arg("weights"), py::arg("threads"),
           py::arg("cache_dir"), py::arg("redis"), py::arg("dtype"), py::arg("kv_dtype"),
           py::arg("template"), py::arg("encoding"), py::arg("cache_secret"))
      .def("add_schema", &PyEngine::add_schema)
      .def("generate", &PyEngine::generate)
      .def("generate_batch", &PyEngine::generate_batch)
      .def("score", &PyEngine::score)
      .def("next_token_logits", &PyEngine::next_token_logits)
      .def("tokenize", &PyEngine::tokenize)
      .def("detokenize", &PyEngine::detokenize)
      .def("layout", &PyEngine::layout);

  py::class_<PyEvaluation>(m, "_Evaluation")
      .def(py::init<PyEngine&, const std::string&, const py::object&, const std::string&,
                    const py::object&, bool, std::size_t, std::size_t, bool,
                    const SamplingParams&>(),
           py::keep_alive<1, 2>())
      .def("next_events", &PyEvaluation::next_events)
      .def("add", &PyEvaluation::add)
      .def("finish", &PyEvaluation::finish_rows)
      .def_property_readonly("rows_read", &PyEvaluation::rows_read)
      .def_property_readonly("stopped", &PyEvaluation::stopped)
      .def("summary", &PyEvaluation::summary);

  // benchmarks/bench_python.py: the C++ calls the Python layer is measured against, in the same
  // process (ms per call, the GIL released, the prompt parsed in each call as from Python).
  m.def(
      "_time_cpp_generate",
      [](PyEngine& e, const std::string& xml, const SamplingParams& params, int calls,
         bool callback) {
        // callback: a token callback as trivial as the module's interrupt poll between polls
        TokenCallback on_token;
        if (callback) on_token = [](TokenId, const std::string&) { return true; };
        return time_calls(calls, [&] { e.engine().generate_xml(xml, params, on_token); });
      },
      py::arg("engine"), py::arg("xml"), py::arg("params"), py::arg("calls"),
      py::arg("callback") = false);
  m.def(
      "_time_cpp_score",
      [](PyEngine& e, const std::string& xml, const std::vector<std::string>& choices, int calls) {
        return time_calls(calls, [&] {
          const pml::Prompt p = pml::parse_prompt_string(xml);
          std::vector<std::vector<TokenId>> conts;
          for (const auto& c : choices) conts.push_back(e.engine().encode_continuation(c));
          e.engine().score(p, conts);
        });
      },
      py::arg("engine"), py::arg("xml"), py::arg("choices"), py::arg("calls"));

  m.def(
      "count_rows",
      [](const std::string& path, std::size_t limit) { return eval::count_rows(path, limit); },
      py::arg("path"), py::arg("limit") = 0);
}
