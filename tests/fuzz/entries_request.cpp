// Fuzz entries "http_request", "openai_json" and "posted_pml": the server's edge
// (src/server/request.hpp), where every request body becomes a typed, validated request before
// anything else runs. LibTorch-free: promptcache_request links the PML headers and
// promptcache_core only.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fuzz/fuzz_entries.hpp"
#include "promptcache/error.hpp"
#include "promptcache/pml/prompt.hpp"
#include "promptcache/pml/schema.hpp"
#include "promptcache/pml/src_files.hpp"
#include "request.hpp"

namespace promptcache::fuzz {
namespace {

using detail::check;
using server::RequestLimits;

// Limits small enough that short inputs reach every bound (depth, list sizes, string sizes);
// selected by a header byte of the input: bits 0-1 the JSON depth (2-5), bits 2-3 the PML depth
// (2-5), bit 4 a body limit of 128 bytes.
RequestLimits small_limits(std::uint8_t knob) {
  RequestLimits l;
  l.max_json_depth = 2 + (knob & 3);
  l.max_pml_depth = 2 + ((knob >> 2) & 3);
  if (knob & 16) l.max_body_bytes = 128;
  l.max_messages = 3;
  l.max_content_parts = 2;
  l.max_stop_strings = 2;
  l.max_stop_bytes = 4;
  l.max_module_refs = 4;
  l.max_module_depth = 2;
  l.max_arguments = 2;
  return l;
}

// Header byte `knob`: odd = small limits (the other bits size them), even = the server's defaults.
RequestLimits limits_from(std::uint8_t knob) {
  return (knob & 1) ? small_limits(static_cast<std::uint8_t>(knob >> 1)) : RequestLimits{};
}

// A refusal of a client's body must be a 4xx: the kinds the server answers with 500 (its own
// files, model, tokenizer, cache: views.cpp error_status) must not come out of the request unit.
void refused(const Error& e) {
  detail::rejected(e);
  switch (e.kind()) {
    case ErrorKind::kIo:
    case ErrorKind::kModel:
    case ErrorKind::kSafetensors:
    case ErrorKind::kTokenizer:
    case ErrorKind::kCacheFile:
    case ErrorKind::kCancelled:
      throw InvariantViolation(
          std::string("a body refused with a server-side error kind (a 5xx): ") + e.what());
    default:
      break;
  }
}

bool finite_in(double x, double lo, double hi) {
  return std::isfinite(x) && x >= lo && x <= hi;
}

// What every accepted request promises about its sampling numbers and stop strings.
void check_params(const SamplingParams& p, const RequestLimits& limits) {
  check(std::isfinite(p.temperature) && p.temperature >= 0, "temperature not finite or < 0");
  check(finite_in(p.top_p, 0, 1), "top_p outside [0, 1]");
  check(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0,
        "repetition_penalty not finite or <= 0");
  check(p.top_k >= 0 && p.max_new_tokens >= 0, "negative top_k or max_new_tokens");
  check(p.stop_strings.size() <= limits.max_stop_strings, "more stop strings than the limit");
  for (const std::string& s : p.stop_strings) {
    check(s.size() <= limits.max_stop_bytes, "a stop string longer than the limit");
  }
}

void check_recompute(const std::optional<double>& r) {
  check(!r || finite_in(*r, 0, 1), "recompute outside [0, 1]");
}

// Counts the references of a module tree and its depth (1 = top-level refs), without recursion;
// checks the arguments' count on the way.
void check_module_refs(const std::vector<pml::ModuleRef>& top, const RequestLimits& limits,
                       std::size_t max_refs, std::size_t max_depth) {
  std::size_t count = 0;
  std::vector<std::pair<const pml::ModuleRef*, std::size_t>> stack;
  for (const pml::ModuleRef& r : top) stack.push_back({&r, 1});
  while (!stack.empty()) {
    const auto [ref, depth] = stack.back();
    stack.pop_back();
    ++count;
    check(depth <= max_depth, "module references nest deeper than the limit");
    check(ref->arguments.size() <= limits.max_arguments, "more arguments than the limit");
    for (const pml::ModuleRef& child : ref->children) stack.push_back({&child, depth + 1});
  }
  check(count <= max_refs, "more module references than the limit");
}

void check_completion(const server::CompletionRequest& r, bool chat, const RequestLimits& limits) {
  check(r.chat == chat, "the request's chat flag is not the endpoint's");
  if (chat) {
    check(!r.turns.empty() && r.turns.size() <= limits.max_messages,
          "chat messages empty or over the limit");
    for (const pml::Turn& t : r.turns) check(t.role.has_value(), "a chat message without a role");
  } else if (r.prompt_ids) {
    // Token ids instead of text: no turns, none negative, and never with modules.
    check(r.turns.empty(), "a completion with token ids also has text");
    check(!r.prompt_ids->empty(), "a completion with an empty list of token ids");
    for (TokenId id : *r.prompt_ids) check(id >= 0, "a negative token id in the prompt");
    check(!r.prompt, "token ids with promptcache modules");
  } else {
    check(r.turns.size() == 1 && !r.turns[0].role, "a completion is not one plain text");
  }
  // logprobs: -1 (none) or within the endpoint's limit; echo only on /v1/completions, never
  // with stream or modules.
  check(r.logprobs >= -1 &&
            r.logprobs <= (chat ? server::kMaxChatTopLogprobs : server::kMaxCompletionLogprobs),
        "logprobs outside the endpoint's range");
  check(!r.echo || (!chat && !r.stream && !r.prompt), "echo with chat, stream or modules");
  check_params(r.params, limits);
  check_recompute(r.recompute);
  if (r.prompt) {
    check_module_refs(r.prompt->modules, limits, limits.max_module_refs,
                      static_cast<std::size_t>(limits.max_module_depth));
    check(r.prompt->turns.size() == r.turns.size(), "the prompt's turns are not the request's");
  }
}

void check_prompt(const server::PromptRequest& r, const RequestLimits& limits) {
  check_params(r.params, limits);
  check_recompute(r.recompute);
  // The prompt element is level 1, its module references level 2 and below.
  check_module_refs(r.prompt.modules, limits, static_cast<std::size_t>(-1),
                    static_cast<std::size_t>(limits.max_pml_depth) - 1);
}

// Every node of a schema, without recursion.
std::vector<const pml::Node*> all_nodes(const pml::Node& root) {
  std::vector<const pml::Node*> out;
  std::vector<const pml::Node*> stack{&root};
  while (!stack.empty()) {
    const pml::Node* n = stack.back();
    stack.pop_back();
    out.push_back(n);
    for (const pml::Node& child : n->children) stack.push_back(&child);
  }
  return out;
}

// With NoSrcFiles nothing of the schema may come from a file: no module keeps a src.
void check_no_files(const pml::Schema& schema) {
  for (const pml::Node* n : all_nodes(schema.root)) {
    check(n->src.empty(), "a module read its src although no file may be read");
  }
}

// --- posted_pml: a scratch root with files, links leading out, a FIFO; a canary outside -------

// A random marker (not in any seed or dictionary) that only the canary file outside the root
// holds; found in a parsed schema whose input did not contain it, it came from that file.
const std::string& canary_marker() {
  static const std::string marker = [] {
    std::random_device rd;
    std::string m = "CANARY";
    const char* hex = "0123456789abcdef";
    for (int i = 0; i < 24; ++i) m += hex[rd() % 16];
    return m;
  }();
  return marker;
}

struct SrcTree {
  SrcTree();
  detail::ScratchDir dir{"posted"};
  std::string root;                  // dir/root: what RootedSrcFiles may read
  std::string canary;                // dir/canary.txt: outside the root
  std::vector<std::string> allowed;  // the compacted texts of the regular files inside the root
};

SrcTree::SrcTree() {
  namespace fs = std::filesystem;
  const fs::path base = dir.path();
  root = (base / "root").string();
  canary = (base / "canary.txt").string();
  fs::create_directories(base / "root" / "sub");
  fs::create_directories(base / "outside");
  const std::string secret = "the canary " + canary_marker() + " lives outside the root\n";
  detail::write_bytes(canary, secret.data(), secret.size());
  detail::write_bytes((base / "outside" / "secret.txt").string(), secret.data(), secret.size());
  const std::pair<const char*, std::string> files[] = {
      {"doc.txt", "A document inside the root.\nIt has two lines.\n"},
      {"sub/inner.txt", "  Inner text, in a sub folder.  "},
      {"empty.txt", ""},
      {"sub/blank.txt", " \n\t \n"},
  };
  for (const auto& [name, text] : files) {
    detail::write_bytes((base / "root" / name).string(), text.data(), text.size());
    allowed.push_back(pml::compact_whitespace(text));
  }
  // Links leading out (a file, a folder, a device, the root's parent) and inside, a loop, a
  // FIFO, a link to the FIFO. Failures to make one leave that case out.
  std::error_code ec;
  fs::create_symlink(canary, base / "root" / "out.txt", ec);
  fs::create_symlink("../canary.txt", base / "root" / "rel-out.txt", ec);
  fs::create_symlink("../../outside", base / "root" / "sub" / "away", ec);
  fs::create_symlink("..", base / "root" / "up", ec);
  fs::create_symlink("/dev/zero", base / "root" / "zero", ec);
  fs::create_symlink("doc.txt", base / "root" / "alias.txt", ec);
  fs::create_symlink("loop", base / "root" / "loop", ec);
  ::mkfifo((base / "root" / "pipe").c_str(), 0600);
  fs::create_symlink("pipe", base / "root" / "pipe-link", ec);
}

const SrcTree& src_tree() {
  static const SrcTree tree;
  return tree;
}

// "@ROOT@" and "@CANARY@" in the input stand for the absolute paths of the root and the canary,
// which change from run to run (seeds and the dictionary use the placeholders).
std::string expand_paths(std::string text) {
  const SrcTree& t = src_tree();
  const std::pair<std::string, std::string> subs[] = {{"@ROOT@", t.root}, {"@CANARY@", t.canary}};
  for (const auto& [from, to] : subs) {
    for (std::size_t at = text.find(from); at != std::string::npos;
         at = text.find(from, at + to.size())) {
      text.replace(at, from.size(), to);
    }
  }
  return text;
}

// No text of the schema holds the canary (unless the input itself did), and every module read
// from a src file holds exactly the text of a regular file inside the root.
void check_no_leak(const pml::Schema& schema, const std::string& input) {
  const SrcTree& t = src_tree();
  const bool input_has_marker = input.find(canary_marker()) != std::string::npos;
  for (const pml::Node* n : all_nodes(schema.root)) {
    if (!input_has_marker) {
      check(n->text.find(canary_marker()) == std::string::npos &&
                n->name.find(canary_marker()) == std::string::npos,
            "the canary's text (a file outside the root) reached the parsed schema");
    }
    if (n->kind == pml::NodeKind::kModule && !n->src.empty()) {
      check(n->children.size() == 1 && n->children[0].kind == pml::NodeKind::kText,
            "a src module is not one text node");
      bool known = false;
      for (const std::string& text : t.allowed) known = known || n->children[0].text == text;
      check(known, "a src module holds text that is no file inside the root");
    }
  }
}

}  // namespace

void http_request_entry(const std::uint8_t* data, std::size_t size) {
  if (size < 2) return;
  const int endpoint = data[0] % 5;
  const RequestLimits limits = limits_from(data[1]);
  const std::string_view body(reinterpret_cast<const char*>(data + 2), size - 2);
  try {
    switch (endpoint) {
      case 0: {  // POST /v1/prompt
        const server::PromptRequest r = server::parse_prompt_request(body, limits);
        check(body.size() <= limits.max_body_bytes, "a body over max_body_bytes accepted");
        check_prompt(r, limits);
        break;
      }
      case 1:    // POST /v1/chat/completions
      case 2: {  // POST /v1/completions
        const bool chat = endpoint == 1;
        const server::CompletionRequest r = server::parse_completion_request(body, chat, limits);
        check(body.size() <= limits.max_body_bytes, "a body over max_body_bytes accepted");
        check_completion(r, chat, limits);
        break;
      }
      default: {  // POST /v1/schemas, as JSON {"xml": ...} or as XML; no src may be read
        const bool as_json = endpoint == 3;
        const std::string xml = server::schema_xml_from_body(
            body, as_json ? "Application/JSON; charset=utf-8" : "application/xml", limits);
        if (as_json) check(body.size() <= limits.max_body_bytes, "a body over max_body_bytes");
        const pml::Schema schema =
            server::parse_posted_schema(xml, pml::NoSrcFiles("posted"), limits);
        check(server::schema_depth(schema.root) <= static_cast<std::size_t>(limits.max_pml_depth),
              "a schema nested deeper than max_pml_depth accepted");
        check_no_files(schema);
        break;
      }
    }
  } catch (const Error& e) {
    refused(e);  // a clean rejection, as a 4xx
  }
}

void openai_json_entry(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return;
  const bool chat = (data[0] & 1) == 0;
  const RequestLimits limits = limits_from(static_cast<std::uint8_t>(data[0] >> 1));
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const server::CompletionRequest r = server::parse_completion_request(body, chat, limits);
    check_completion(r, chat, limits);
  } catch (const Error& e) {
    refused(e);  // a clean rejection, as a 4xx
  }
}

void posted_pml_entry(const std::uint8_t* data, std::size_t size) {
  if (size < 1) return;
  const bool rooted = (data[0] & 1) == 0;
  RequestLimits limits;
  if (data[0] & 2) limits.max_pml_depth = 2 + (data[0] >> 2) % 4;
  const std::string xml =
      expand_paths(std::string(reinterpret_cast<const char*>(data + 1), size - 1));
  try {
    if (rooted) {
      const pml::Schema schema = server::parse_posted_schema(
          xml, pml::RootedSrcFiles(src_tree().root, pml::RootedSrcFiles::Scope::kInsideRoot),
          limits);
      check_no_leak(schema, xml);
    } else {
      const pml::Schema schema = server::parse_posted_schema(xml, pml::NoSrcFiles(), limits);
      check_no_files(schema);
      check_no_leak(schema, xml);
    }
  } catch (const Error& e) {
    // A clean rejection. kIo too: a src naming a missing file inside the root, a loop.
    detail::rejected(e);
  }
}

}  // namespace promptcache::fuzz
