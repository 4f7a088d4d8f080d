#include "docqa.hpp"

#include <algorithm>
#include <filesystem>
#include <set>

#include "promptcache/error.hpp"
#include "promptcache/pml/schema.hpp"

namespace promptcache::docqa {

namespace fs = std::filesystem;

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

namespace {
std::string module_name(const std::string& stem, std::set<std::string>& taken) {
  std::string name;
  for (char c : stem)
    name += (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-') ? c : '_';
  if (name.empty() || !(std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_')) {
    name = "doc_" + name;
  }
  if (pml::is_reserved_module_name(name)) name = "doc_" + name;
  std::string unique = name;
  for (int i = 2; taken.count(unique); ++i) unique = name + "_" + std::to_string(i);
  taken.insert(unique);
  return unique;
}
}  // namespace

std::vector<Document> collect_documents(const std::vector<std::string>& paths) {
  std::vector<fs::path> files;
  for (const auto& p : paths) {
    if (fs::is_directory(p)) {
      std::vector<fs::path> found;
      for (const auto& e : fs::recursive_directory_iterator(p)) {
        const auto ext = e.path().extension().string();
        if (e.is_regular_file() && (ext == ".txt" || ext == ".md")) found.push_back(e.path());
      }
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(p)) {
      files.emplace_back(p);
    } else {
      throw Error(ErrorKind::kIo, "no such document file or folder", {p});
    }
  }
  if (files.empty()) {
    throw Error(ErrorKind::kIo, "no .txt or .md documents found in the given paths");
  }
  std::vector<Document> docs;
  std::set<std::string> taken;
  for (const auto& f : files) {
    docs.push_back(
        {fs::absolute(f).string(), f.filename().string(), module_name(f.stem().string(), taken)});
  }
  return docs;
}

std::string schema_xml(const std::vector<Document>& docs, const std::string& system) {
  std::string xml = std::string("<schema name=\"") + kSchemaName + "\">\n";
  if (!system.empty()) xml += "  <system>" + xml_escape(system) + "</system>\n";
  for (const auto& d : docs) {
    xml += "  <module name=\"" + d.module + "\" src=\"" + xml_escape(d.path) + "\"/>\n";
  }
  return xml + "</schema>\n";
}

std::string prompt_xml(const std::vector<std::string>& modules, const std::string& question) {
  std::string xml = std::string("<prompt schema=\"") + kSchemaName + "\">";
  for (const auto& m : modules) xml += "<" + m + "/>";
  return xml + "<user>" + xml_escape(question) + "</user></prompt>";
}

}  // namespace promptcache::docqa
