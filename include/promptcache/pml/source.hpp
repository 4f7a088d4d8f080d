// promptcache/pml/source.hpp — what the schema and prompt parsers share: loading XML with
// pugixml so that every node can be named by file, line and column; the XML-name rule; the
// whitespace-compaction rule; and the one text-to-tokens rule every PML span follows.
//
// Header-only, no LibTorch. Everything here lives in promptcache::pml and is usable on its own
// (tests and the CLI call compact_whitespace / encode_span directly).
#pragma once

#include <pugixml.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "promptcache/error.hpp"
#include "promptcache/model/tokenizer.hpp"
#include "promptcache/pml/lenient.hpp"
#include "promptcache/pml/limits.hpp"

namespace promptcache::pml {

// True for the ASCII whitespace XML knows about (space, tab, CR, LF).
inline bool is_xml_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// True when text is empty or whitespace only.
inline bool is_blank(std::string_view text) {
  return std::all_of(text.begin(), text.end(), is_xml_space);
}

// The reference's rule: a leading run of whitespace becomes one space, a trailing run becomes
// one space, the inside is untouched. "\n  Hello  world \n" -> " Hello  world ".
// A whitespace-only text becomes " "; an empty text stays empty.
inline std::string compact_whitespace(std::string_view text) {
  std::size_t b = 0, e = text.size();
  while (b < e && is_xml_space(text[b])) ++b;
  if (b == e) return text.empty() ? std::string() : std::string(" ");
  while (e > b && is_xml_space(text[e - 1])) --e;
  std::string out;
  out.reserve(e - b + 2);
  if (b > 0) out += ' ';
  out.append(text.substr(b, e - b));
  if (e < text.size()) out += ' ';
  return out;
}

// Removes leading and trailing whitespace.
inline std::string_view trim(std::string_view text) {
  std::size_t b = 0, e = text.size();
  while (b < e && is_xml_space(text[b])) ++b;
  while (e > b && is_xml_space(text[e - 1])) --e;
  return text.substr(b, e - b);
}

// THE span tokenization rule (docs/pml.md, "Tokens at span boundaries"). A span's text is
// encoded on its own, without BOS, so a span's tokens never depend on its neighbours; blank text
// yields no tokens. What happens to its edge whitespace depends on the tokenizer:
//  * SentencePiece (Tokenizer::prefixes_space()): the text is trimmed and its dummy prefix starts
//    the span with "▁", i.e. each span boundary stands for exactly one space whatever the author
//    wrote there;
//  * byte-level BPE (no dummy prefix; a space is a byte of the next token): trailing whitespace
//    is dropped and a leading run of whitespace becomes one space, so text written on its own
//    line inside a module starts with " word" as in running prose, and text written right after
//    a tag (e.g. <user>Hi</user> after a chat template's "...user\n") starts without one, as
//    HuggingFace chat templates produce it.
// The no-cache baseline concatenates these same token lists, so cached and uncached runs see
// identical ids.
inline std::vector<TokenId> encode_span(const Tokenizer& tokenizer, std::string_view text) {
  const std::string_view body = trim(text);
  if (body.empty()) return {};
  if (tokenizer.prefixes_space() || !is_xml_space(text.front())) {
    return tokenizer.encode(body, /*add_bos=*/false);
  }
  return tokenizer.encode(" " + std::string(body), /*add_bos=*/false);
}

// XML 1.0 Name production, restricted to what authors use: a letter, '_' or ':' first, then
// letters, digits, '.', '-', '_', ':'. Bytes >= 0x80 (UTF-8 encoded letters) are accepted.
inline bool is_xml_name(std::string_view name) {
  if (name.empty()) return false;
  auto letter = [](unsigned char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || c == ':' || c >= 0x80;
  };
  if (!letter(static_cast<unsigned char>(name[0]))) return false;
  for (char ch : name.substr(1)) {
    const auto c = static_cast<unsigned char>(ch);
    if (!(letter(c) || (c >= '0' && c <= '9') || c == '.' || c == '-')) return false;
  }
  return true;
}

// Reads a whole file; Error(kIo) naming the file (and `where`, if given) when it cannot, and
// Error(kInvalidArgument) when it is larger than kMaxSourceFileBytes (a schema, prompt or src
// file that size is a mistake, and reading it could exhaust memory). The file is read in chunks
// and the limit applies to what was read, not to the size the file system reports: a device or
// pipe (/dev/zero, a FIFO) reports none, and a file may grow while it is read.
inline std::string read_text_file(const std::string& path, SourceLocation where = {}) {
  if (where.file.empty()) where.file = path;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::kIo, "cannot read file '" + path + "'", std::move(where));
  auto too_large = [&](const std::string& what) {
    return Error(ErrorKind::kInvalidArgument,
                 "file '" + path + "' " + what + " more than the " +
                     std::to_string(kMaxSourceFileBytes >> 20) + " MiB a PML input may have",
                 where);
  };
  // A regular file larger than the limit is refused without reading it.
  {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (!ec && size > kMaxSourceFileBytes)
      throw too_large("is " + std::to_string(size) + " bytes,");
  }
  std::string text;
  std::vector<char> chunk(std::size_t{1} << 16);
  while (in) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    const auto got = static_cast<std::size_t>(in.gcount());
    if (text.size() + got > kMaxSourceFileBytes) {
      // Not a regular file (a device, a pipe) or one that grew while it was read.
      throw too_large("yields");
    }
    text.append(chunk.data(), got);
  }
  if (in.bad()) throw Error(ErrorKind::kIo, "cannot read file '" + path + "'", std::move(where));
  return text;
}

// Refuses (kInvalidArgument) an XML text larger than kMaxSourceFileBytes before parsing it.
inline void check_source_size(const std::string& xml, const std::string& origin) {
  if (xml.size() > kMaxSourceFileBytes) {
    throw Error(ErrorKind::kInvalidArgument,
                "the XML text is " + std::to_string(xml.size()) + " bytes, more than the " +
                    std::to_string(kMaxSourceFileBytes >> 20) + " MiB a PML input may have",
                SourceLocation{origin, 0, 0, {}});
  }
}

// Joins a directory and a relative path ("" or absolute paths pass through).
inline std::string join_path(const std::string& dir, const std::string& path) {
  if (dir.empty() || (!path.empty() && path[0] == '/')) return path;
  return dir.back() == '/' ? dir + path : dir + "/" + path;
}

// The directory part of a path ("" when it has none).
inline std::string parent_dir(const std::string& path) {
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? std::string() : path.substr(0, slash);
}

// Something the parser accepted but the author should look at (a '<' read as text, ...).
struct Warning {
  std::string message;
  SourceLocation where;  // file, line, column of the first character concerned, element

  // "FILE:LINE: message (in <element>)": what the CLI prints after "warning: ".
  std::string render() const {
    std::string out;
    if (!where.file.empty()) {
      out += where.file;
      if (where.line > 0) out += ":" + std::to_string(where.line);
      out += ": ";
    }
    out += message;
    if (!where.element.empty()) out += " (in " + where.element + ")";
    return out;
  }
};

// A parsed XML document together with its source text, so that node offsets become line:column.
class XmlSource {
 public:
  // At most this many warnings are listed (one per line); the rest are counted in a last one.
  static constexpr std::size_t kMaxWarnings = 100;

  // Parses text (pugixml parse_default | parse_ws_pcdata: whitespace-only text nodes are kept,
  // comments and declarations are skipped; a DOCTYPE that declares anything is refused) after
  // repair_stray_markup(text, repair) has escaped the '<' and '&' that start no markup
  // (lenient.hpp); each becomes a warning. Lines, columns and offsets everywhere refer to the text
  // as given. Error(kXmlSyntax) with line:column on malformed XML.
  XmlSource(std::string text, std::string origin, const RepairOptions& repair = {})
      : text_(std::move(text)), origin_(std::move(origin)) {
    std::size_t pos = 0;
    line_starts_.push_back(0);
    while ((pos = text_.find('\n', pos)) != std::string::npos) line_starts_.push_back(++pos);
    repaired_ = repair_stray_markup(text_, repair);
    if (repaired_.too_many) {
      const auto offset = static_cast<std::ptrdiff_t>(repaired_.too_many_offset);
      throw Error(ErrorKind::kXmlSyntax,
                  "more than " + std::to_string(RepairedText::kMaxRepairs) +
                      " '<' or '&' would have to be read as text: this is not a PML document",
                  at_offset_original(offset, element_before(offset)));
    }
    if (!repaired_.unterminated_what.empty()) {
      // Where it opens, rather than at the end of the text where pugixml would notice.
      const auto offset = static_cast<std::ptrdiff_t>(repaired_.unterminated_offset);
      throw Error(ErrorKind::kXmlSyntax,
                  "malformed XML: " + repaired_.unterminated_what + " (it is never closed)",
                  at_offset_original(offset, element_before(offset)));
    }
    // pugixml parses the repaired copy in place: no third copy of a large document.
    const pugi::xml_parse_result result = doc_.load_buffer_inplace(
        repaired_.text.data(), repaired_.text.size(),
        pugi::parse_default | pugi::parse_ws_pcdata | pugi::parse_doctype, pugi::encoding_utf8);
    if (!result) {
      const std::ptrdiff_t offset = original_offset(result.offset);
      throw Error(ErrorKind::kXmlSyntax, std::string("malformed XML: ") + result.description(),
                  at_offset_original(offset, element_before(offset)));
    }
    check_depth();
    make_warnings();
  }

  // Elements may nest at most this deep. The schema and prompt readers, the layout and the
  // compiler walk the tree recursively, so a limit here is what keeps a hostile or mistaken file
  // (100,000 nested modules) from overflowing the stack; real schemas nest a few levels.
  static constexpr std::size_t kMaxDepth = 128;
  XmlSource(const XmlSource&) = delete;
  XmlSource& operator=(const XmlSource&) = delete;

  const pugi::xml_document& document() const { return doc_; }
  const std::string& origin() const { return origin_; }
  // The characters read as text, one warning per line (at most kMaxWarnings, then a count).
  const std::vector<Warning>& warnings() const { return warnings_; }

  // The tag that opens most recently before offset (in the text as given) ("<module>"), to name
  // the element a syntax error is in; "" when there is none. A '<' read as text is no tag.
  std::string element_before(std::ptrdiff_t offset) const {
    if (offset < 0) return "";
    std::size_t pos = std::min(static_cast<std::size_t>(offset), text_.size());
    while (pos > 0) {
      pos = text_.rfind('<', pos - 1);
      if (pos == std::string::npos) return "";
      if (repaired_.repaired_at(pos)) {
        if (pos == 0) break;
        continue;
      }
      std::size_t e = pos + 1;
      if (e < text_.size() && text_[e] == '/') ++e;
      const std::size_t b = e;
      while (e < text_.size() && !is_xml_space(text_[e]) && text_[e] != '>' && text_[e] != '/' &&
             text_[e] != '<')
        ++e;
      if (e > b && is_xml_name(std::string_view(text_).substr(b, e - b))) {
        return "<" + text_.substr(pos + 1, e - pos - 1) + ">";
      }
      if (pos == 0) break;
    }
    return "";
  }

  // The location of a byte offset of the parsed (repaired) text, as pugixml reports offsets
  // (1-based line and column of the text as given; column counts bytes).
  SourceLocation at_offset(std::ptrdiff_t offset, std::string element) const {
    return at_offset_original(original_offset(offset), std::move(element));
  }

  // The location of a byte offset of the text as given.
  SourceLocation at_offset_original(std::ptrdiff_t offset, std::string element) const {
    SourceLocation where{origin_, 0, 0, std::move(element)};
    if (offset < 0) return where;
    const auto off = static_cast<std::size_t>(offset);
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), off);
    const auto line = static_cast<std::size_t>(it - line_starts_.begin());
    where.line = line;
    where.column = off - line_starts_[line - 1] + 1;
    return where;
  }

  // The location of a node; element nodes are described as `<tag name="...">`. pugixml's
  // offset_debug() points at the tag name, so the column is moved back onto the '<'.
  SourceLocation at(const pugi::xml_node& node) const {
    std::ptrdiff_t offset = node.offset_debug();
    if (node.type() == pugi::node_element && offset > 0) --offset;
    return at_offset(offset, describe(node));
  }

  // `<module name="intro">`, `<union>`, or "text" for text nodes.
  static std::string describe(const pugi::xml_node& node) {
    if (node.type() != pugi::node_element) return "text";
    std::string out = std::string("<") + node.name();
    if (auto name = node.attribute("name")) out += std::string(" name=\"") + name.value() + "\"";
    return out + ">";
  }

 private:
  std::ptrdiff_t original_offset(std::ptrdiff_t offset) const {
    if (offset < 0) return offset;
    return static_cast<std::ptrdiff_t>(repaired_.original_offset(static_cast<std::size_t>(offset)));
  }

  // One warning per line with repaired characters, naming each (at most kMaxPerLine) with its
  // column; at most kMaxWarnings lines, then one warning counting the rest.
  void make_warnings() {
    static constexpr std::size_t kMaxPerLine = 8;
    const auto& listed = repaired_.listed;
    std::size_t i = 0, lines = 0;
    while (i < listed.size()) {
      const SourceLocation first =
          at_offset_original(static_cast<std::ptrdiff_t>(listed[i].offset), listed[i].element);
      if (++lines > kMaxWarnings) break;
      std::string message = "read as text, not markup:";
      bool less = false, amp = false;
      std::size_t on_line = 0;
      for (; i < listed.size(); ++i, ++on_line) {
        const SourceLocation at =
            at_offset_original(static_cast<std::ptrdiff_t>(listed[i].offset), "");
        if (at.line != first.line) break;
        (listed[i].character == '<' ? less : amp) = true;
        if (on_line >= kMaxPerLine) continue;
        message += std::string(message.back() == ':' ? " " : "; ") + "'" + listed[i].character +
                   "' at column " + std::to_string(at.column) + " (" + listed[i].reason + ")";
      }
      if (on_line > kMaxPerLine) {
        message += "; and " + std::to_string(on_line - kMaxPerLine) + " more on this line";
      }
      message += std::string("; write ") + (less ? "&lt;" : "") + (less && amp ? " and " : "") +
                 (amp ? "&amp;" : "") + " to say it is text";
      warnings_.push_back({std::move(message), first});
    }
    if (i < repaired_.count()) {
      const std::size_t k = i;
      warnings_.push_back(
          {std::to_string(repaired_.count() - k) + " more '<' or '&' read as text (not listed)",
           at_offset_original(static_cast<std::ptrdiff_t>(repaired_.offset_of(k)), "")});
    }
  }

  // Error(kXmlSyntax) at the first element nested deeper than kMaxDepth, or one that repeats an
  // attribute (XML forbids it, pugixml keeps both, and a reader taking the first would decide on
  // another value than one taking the last). Walks the tree with pugixml's sibling/parent links,
  // without recursion.
  void check_depth() const {
    std::size_t depth = 0;
    pugi::xml_node node = doc_.first_child();
    while (node) {
      if (node.type() == pugi::node_element) check_unique_attributes(node);
      if (node.type() == pugi::node_doctype &&
          std::string_view(node.value()).find('[') != std::string_view::npos) {
        // pugixml never expands what a DOCTYPE declares: "&name;" would stay in the text as it
        // is written, so a document that declares entities is refused rather than misread.
        throw Error(ErrorKind::kXmlSyntax,
                    "a DOCTYPE with declarations (entities, elements) is not supported in PML; "
                    "write the text itself",
                    at(node));
      }
      if (node.type() == pugi::node_element && node.first_child()) {
        if (++depth > kMaxDepth) {
          throw Error(ErrorKind::kXmlSyntax,
                      "elements nested deeper than " + std::to_string(kMaxDepth) +
                          " levels (the limit of a schema or prompt)",
                      at(node));
        }
        node = node.first_child();
        continue;
      }
      while (node && !node.next_sibling()) {
        node = node.parent();
        if (node == doc_) return;
        --depth;
      }
      if (node) node = node.next_sibling();
    }
  }

  void check_unique_attributes(const pugi::xml_node& element) const {
    std::vector<std::string_view> names;
    for (pugi::xml_attribute a : element.attributes()) names.emplace_back(a.name());
    if (names.size() < 2) return;
    std::sort(names.begin(), names.end());
    const auto twice = std::adjacent_find(names.begin(), names.end());
    if (twice != names.end()) {
      throw Error(ErrorKind::kXmlSyntax,
                  "attribute '" + std::string(*twice) + "' appears more than once on <" +
                      element.name() + ">",
                  at(element));
    }
  }

  std::string text_;  // as given
  std::string origin_;
  std::vector<std::size_t> line_starts_;
  RepairedText repaired_;  // what pugixml parses (in place)
  std::vector<Warning> warnings_;
  pugi::xml_document doc_;
};

// The single element at the top of a document (the caller checks its name). Stray top-level
// text is an error of kind `structural` (kSchema for schemas, kPrompt for prompts).
inline pugi::xml_node document_element(const XmlSource& src, const char* tag,
                                       ErrorKind structural) {
  pugi::xml_node top;
  for (pugi::xml_node child : src.document().children()) {
    if (child.type() == pugi::node_pcdata || child.type() == pugi::node_cdata) {
      if (is_blank(child.value())) continue;
      throw Error(structural, "text outside the <" + std::string(tag) + "> element", src.at(child));
    }
    if (child.type() != pugi::node_element) continue;
    if (top) {
      throw Error(ErrorKind::kXmlSyntax,
                  "more than one top-level element (expected a single <" + std::string(tag) + ">)",
                  src.at(child));
    }
    top = child;
  }
  if (!top) {
    throw Error(ErrorKind::kXmlSyntax, "no <" + std::string(tag) + "> element",
                src.at_offset(0, "<" + std::string(tag) + ">"));
  }
  return top;
}

}  // namespace promptcache::pml
