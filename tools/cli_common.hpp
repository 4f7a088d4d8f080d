// Shared pieces of the promptcache CLI subcommands.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "promptcache/pml/schema.hpp"
#include "promptcache/pml/source.hpp"
#include "promptcache/sampling.hpp"

namespace promptcache::cli {

// Each subcommand registers itself and returns the function that runs it after parsing.
using Runner = std::function<int()>;
struct Command {
  CLI::App* app;
  Runner run;
};

// Options shared by the commands that load a model.
struct ModelOptions {
  std::string model_dir;
  std::string device = "cpu";
  // Empty: chosen for the checkpoint (choose_dtypes in promptcache/model/llama.hpp).
  std::string dtype;
  std::string weights;
  std::string kv_dtype;  // --kv-dtype
  int threads = 0;
};
void add_model_options(CLI::App& app, ModelOptions& o, bool model_required = false);
// Fails with a helpful message (how to make a synthetic model) when --model was not given.
void require_model(const ModelOptions& o);
// Applies --threads and returns a one-line description.
std::string apply_threads(const ModelOptions& o);

struct SamplingOptions {
  SamplingParams params;
  std::vector<std::string> stop;
};
void add_sampling_options(CLI::App& app, SamplingOptions& o);

Command register_make_model(CLI::App& root);
Command register_generate(CLI::App& root);
Command register_layout(CLI::App& root);
Command register_run(CLI::App& root);
Command register_qa(CLI::App& root);
Command register_demo(CLI::App& root);
Command register_tokenize(CLI::App& root);
Command register_compile(CLI::App& root);
Command register_cache(CLI::App& root);
Command register_fidelity(CLI::App& root);
Command register_serve(CLI::App& root);
Command register_eval(CLI::App& root);
Command register_info(CLI::App& root);
Command register_template(CLI::App& root);
// A command this build leaves out (PROMPTCACHE_DEMO_ONLY, scripts/demo.sh): it takes any
// arguments and exits 2 saying that scripts/build.sh builds it.
Command register_absent(CLI::App& root, const std::string& name);

// Number checks whose messages say what is wanted ("--max-new-tokens: expects a whole number
// >= 0, got 'abc'"); CLI11's own checks print the range as 0.000000 to 1.797693e+308.
// whole_number: digits only, min <= value <= max (max: the option's type's limit).
CLI::Validator whole_number(unsigned long long min, unsigned long long max);
CLI::Validator number_in(double min, double max);
CLI::Validator positive_number();

// --allow-src-outside: a schema file's module src attributes may name files outside its folder.
void add_src_flag(CLI::App& app, bool& allow_src_outside);
// Parses a schema file whose src files resolve inside its folder (anywhere with
// allow_src_outside); the refusal names the flag.
pml::Schema read_schema_file(const std::string& path, bool allow_src_outside);

// Prints what a schema or prompt accepted leniently to stderr, one "warning: FILE:LINE: ..." each.
void print_warnings(const std::vector<pml::Warning>& warnings);

// A user mistake: printed as "promptcache: error: ..." without a stack trace; exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace promptcache::cli
