// Document QA: one prompt module per document, compiled once, then questions over any subset.
// Shared by `promptcache qa` and examples/docqa.
#pragma once

#include <string>
#include <vector>

#include "promptcache/engine.hpp"

namespace promptcache::docqa {

struct Document {
  std::string path;    // absolute path of the file
  std::string label;   // file name, as the user refers to it
  std::string module;  // XML-safe, unique module name
};

// Files given directly, plus the .txt/.md files of folders (sorted). Error(kIo) for a missing
// path or when no document is found.
std::vector<Document> collect_documents(const std::vector<std::string>& paths);
// The schema: an optional system prompt, then one module per document (text from src=).
std::string schema_xml(const std::vector<Document>& docs, const std::string& system);
// A prompt selecting `docs` (module names) with the question as a user turn.
std::string prompt_xml(const std::vector<std::string>& modules, const std::string& question);
std::string xml_escape(const std::string& text);

constexpr const char* kSchemaName = "docqa";

}  // namespace promptcache::docqa
