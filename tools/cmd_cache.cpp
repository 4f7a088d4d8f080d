// promptcache cache ls|verify|rm: what a cache folder (or some states files) holds, whether every
// byte is intact, and removing what is no longer wanted.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "promptcache/cache/cache_file.hpp"
#include "promptcache/error.hpp"

namespace promptcache::cli {
namespace {

namespace fs = std::filesystem;

// The states files named on the command line, or every *.states file of the folder (sorted).
std::vector<std::string> states_files(const std::string& dir, const std::vector<std::string>& files,
                                      const std::string& command) {
  if (!files.empty()) return files;
  if (dir.empty()) throw UsageError("cache " + command + ": give --cache-dir DIR or files");
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw UsageError("--cache-dir " + dir + ": not a folder");
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (entry.is_regular_file() && entry.path().extension() == ".states") {
      out.push_back(entry.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

nlohmann::json info_json(const CacheFileInfo& i) {
  return {{"file", i.path},
          {"schema", i.schema},
          {"format", i.format},
          {"current_format", i.current_format},
          {"dtype", i.dtype},
          {"kv_dtype", i.kv_dtype},
          {"encoding", i.encoding},
          {"model", i.model_fingerprint},
          {"layout", i.layout_fingerprint},
          {"spans", i.spans},
          {"tokens", i.tokens},
          {"bytes", i.bytes}};
}

}  // namespace

Command register_cache(CLI::App& root) {
  struct Options {
    std::string dir;
    std::vector<std::string> files, schemas;
    bool json = false, stale = false, all = false, dry_run = false;
  };
  auto o = std::make_shared<Options>();
  auto* app = root.add_subcommand(
      "cache",
      "Inspect, verify and clean compiled states (the files of compile --out/--cache-dir).\n"
      "Examples:\n"
      "  promptcache cache ls --cache-dir ~/.cache/promptcache\n"
      "  promptcache cache verify --cache-dir ~/.cache/promptcache     (exit 1 if any is corrupt)\n"
      "  promptcache cache rm --cache-dir ~/.cache/promptcache --schema trip");
  app->require_subcommand(1);
  auto* ls = app->add_subcommand("ls", "list states files: schema, dtypes, spans, tokens, size");
  auto* verify =
      app->add_subcommand("verify", "check every checksum (metadata and each span's tensor)");
  auto* rm = app->add_subcommand("rm", "remove states files of --schema NAME, --stale or --all");
  for (auto* sub : {ls, verify, rm}) {
    sub->add_option("--cache-dir", o->dir, "the folder (its *.states files)");
  }
  ls->add_option("files", o->files, "states files (instead of a folder)");
  verify->add_option("files", o->files, "states files (instead of a folder)");
  ls->add_flag("--json", o->json, "one JSON object per file");
  verify->add_flag("--json", o->json, "one JSON object per file");
  rm->add_option("--schema", o->schemas, "remove this schema's files (repeatable)");
  rm->add_flag("--stale", o->stale, "remove files of an earlier format (they would be recompiled)");
  rm->add_flag("--all", o->all, "remove every states file of the folder");
  rm->add_flag("--dry-run", o->dry_run, "only say what would be removed");
  return {
      app, [o, ls, verify, rm]() {
        if (ls->parsed()) {
          const auto files = states_files(o->dir, o->files, "ls");
          if (!o->json) {
            std::cout << fmt::format("{:<28} {:>6} {:>8} {:>10} {:>5} {:>5} {:>9}  {}\n", "schema",
                                     "spans", "tokens", "MB", "dtype", "kv", "encoding", "file");
          }
          for (const auto& f : files) {
            try {
              const auto i = read_cache_file_info(f);
              if (o->json) {
                std::cout << info_json(i).dump() << "\n";
              } else {
                std::cout << fmt::format(
                    "{:<28} {:>6} {:>8} {:>10.1f} {:>5} {:>5} {:>9}  {}{}\n", i.schema, i.spans,
                    i.current_format ? std::to_string(i.tokens) : "-", i.bytes / 1e6, i.dtype,
                    i.kv_dtype, i.encoding, f,
                    i.current_format ? "" : "  (earlier format: compiled again when used)");
              }
            } catch (const Error& e) {
              if (o->json) {
                std::cout << nlohmann::json({{"file", f}, {"error", e.what()}}).dump() << "\n";
              } else {
                std::cout << "unreadable: " << e.what() << "\n";
              }
            }
          }
          return 0;
        }
        if (verify->parsed()) {
          const auto files = states_files(o->dir, o->files, "verify");
          int bad = 0;
          for (const auto& f : files) {
            std::string problem;
            try {
              verify_cache_file(f);
            } catch (const Error& e) {
              problem = e.what();
              ++bad;
            }
            if (o->json) {
              nlohmann::json j = {{"file", f}, {"ok", problem.empty()}};
              if (!problem.empty()) j["error"] = problem;
              std::cout << j.dump() << "\n";
            } else {
              std::cout << (problem.empty() ? "ok       " + f : "CORRUPT  " + problem) << "\n";
            }
          }
          if (!o->json) {
            std::cerr << fmt::format("[{} files, {} intact, {} corrupt]\n", files.size(),
                                     files.size() - bad, bad);
          }
          return bad == 0 ? 0 : 1;
        }
        if (rm->parsed()) {
          if (o->schemas.empty() && !o->stale && !o->all) {
            throw UsageError("cache rm: say what to remove: --schema NAME, --stale or --all");
          }
          const auto files = states_files(o->dir, {}, "rm");
          int removed = 0;
          for (const auto& f : files) {
            bool match = o->all;
            try {
              const auto i = read_cache_file_info(f);
              match = match || (o->stale && !i.current_format) ||
                      std::find(o->schemas.begin(), o->schemas.end(), i.schema) != o->schemas.end();
            } catch (const Error&) {
              // Not a readable states file: only --all removes it.
            }
            if (!match) continue;
            std::cout << (o->dry_run ? "would remove " : "removed ") << f << "\n";
            if (!o->dry_run) {
              std::error_code ec;
              fs::remove(f, ec);
              if (ec) throw Error(ErrorKind::kIo, "cannot remove: " + ec.message(), {f});
            }
            ++removed;
          }
          std::cerr << fmt::format("[{} file{} {}]\n", removed, removed == 1 ? "" : "s",
                                   o->dry_run ? "would be removed" : "removed");
          return 0;
        }
        return 2;
      }};
}

}  // namespace promptcache::cli
