// promptcache/pml/lenient.hpp — reading '<' and '&' that start no markup as text.
//
// Schemas written for the reference Prompt Cache hold code and math in module text
// (`if (a < b && c)`, `#include <vector>`, `List<String>`): lxml, which the reference parses
// with in recovery mode, lets that through, strict XML does not. repair_stray_markup() pre-scans
// the raw text and escapes exactly the characters that cannot be markup, so pugixml reads them
// as text, and records each one so the parser can warn (file, line, column) and so offsets
// pugixml reports in the repaired text map back onto the author's text. Anything that does look
// like markup is left alone: unclosed PML elements, mismatched tags and the like stay errors.
// The rules (docs/pml.md, "Lenient input"):
//
//  '<' is text when it is followed by
//   1. a character that starts no markup: not a name letter, '/', '!' or '?' (`a < b`, `<=`,
//      `<<`, `x<3`);
//   2. '!' other than `<!--`, `<![CDATA[` or `<!DOCTYPE`;
//   3. '?' inside the top element (a processing instruction there would be dropped silently;
//      before and after the top element `<?xml ...?>` stays markup);
//   4. '/' and no name (`</ x`);
//   5. with the schema rules only (RepairOptions::known_elements not empty) — a tag whose name is
//      not a PML element: a start tag that is malformed (`<typename T>`, `<K, V>`), or
//      well-formed but neither self-closing nor followed anywhere later by `</name`
//      (`#include <vector>`, `List<String>`); a malformed end tag (`</b c`).
//   A tag named after a PML element (`<module`, `</union`) is always markup, malformed or not,
//   and so is every well-formed end tag (`</modul>`), so their errors are reported where they
//   are; prompts (whose elements are named after modules) keep every `<name` and `</name` as
//   markup.
//  '&' is text unless it starts `&lt;` `&gt;` `&amp;` `&quot;` `&apos;` or a character reference
//   `&#N;` / `&#xH;` of a character XML allows (so `&nbsp;`, `&&`, `R&D` and `&#0;` are text).
//  Comments, CDATA sections, `<!DOCTYPE ...>` and `<?...?>` are copied untouched. Inside a tag
//  that is markup, '<' and stray '&' in quoted attribute values are escaped the same way.
// Header-only, no LibTorch.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace promptcache::pml {

struct RepairOptions {
  // The element names of the dialect (schemas: schema, module, union, ...). Empty: every tag
  // that starts like one (`<name`, `</name`) is markup (rule 5 off), as for prompts.
  std::vector<std::string> known_elements;
};

// One character read as text.
struct Repair {
  std::size_t offset = 0;  // in the original text
  char character = '<';    // '<' or '&'
  std::string reason;      // why it is not markup, for the warning
  std::string element;     // the element it is in, e.g. `<module name="a">` ("" at the top)
};

// The text pugixml parses, and how its offsets map back onto the original.
struct RepairedText {
  // Details are kept for the first this many repairs (warnings list at most 100 lines); every
  // repair is counted and mapped.
  static constexpr std::size_t kMaxListed = 1000;
  // More repairs than this and the scan stops (too_many): such a text is not a PML document,
  // and the offset map (16 bytes a repair) must stay small.
  static constexpr std::size_t kMaxRepairs = 1000000;

  std::string text;
  std::vector<Repair> listed;  // the first kMaxListed repairs, in offset order
  bool too_many = false;       // stopped at kMaxRepairs + 1, at offset too_many_offset
  std::size_t too_many_offset = 0;
  // The first comment, CDATA section, declaration or processing instruction that is never
  // closed (an error wherever it is; pugixml would report it at the end of the text): its
  // offset and what it lacks, e.g. "the comment '<!--' has no '-->'". Empty what: none.
  std::size_t unterminated_offset = 0;
  std::string unterminated_what;

  // Every repair: how many, and each one's original offset and character.
  std::size_t count() const { return shifts_.size(); }
  std::size_t offset_of(std::size_t k) const { return shifts_[k].start - inserted_before(k); }
  char character_of(std::size_t k) const {
    return shifts_[k].inserted - inserted_before(k) == 3 ? '<' : '&';
  }
  // Whether the character at this original offset was read as text.
  bool repaired_at(std::size_t original) const {
    std::size_t lo = 0, hi = shifts_.size();
    while (lo < hi) {
      const std::size_t mid = lo + (hi - lo) / 2;
      if (offset_of(mid) < original) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    return lo < shifts_.size() && offset_of(lo) == original;
  }

  // The original offset of a byte of `text` (a byte of an inserted "&lt;" maps to its '<').
  std::size_t original_offset(std::size_t repaired) const {
    auto it = std::upper_bound(shifts_.begin(), shifts_.end(), repaired,
                               [](std::size_t r, const Shift& s) { return r < s.start; });
    if (it == shifts_.begin()) return repaired;
    const auto k = static_cast<std::size_t>(it - shifts_.begin()) - 1;
    const std::size_t width = shifts_[k].inserted - inserted_before(k) + 1;  // "&lt;" / "&amp;"
    if (repaired < shifts_[k].start + width) return offset_of(k);
    return repaired - shifts_[k].inserted;
  }

 private:
  friend class StrayMarkupScanner;
  struct Shift {
    std::size_t start;     // where repair k's escape starts in `text`
    std::size_t inserted;  // bytes inserted by repairs 0..k
  };
  std::size_t inserted_before(std::size_t k) const { return k == 0 ? 0 : shifts_[k - 1].inserted; }
  std::vector<Shift> shifts_;
};

namespace detail {

inline bool is_name_start(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_' || c == ':' || c >= 0x80;
}
inline bool is_name_char(unsigned char c) {
  return is_name_start(c) || (c >= '0' && c <= '9') || c == '.' || c == '-';
}
inline bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

// Whether a character reference's code point is a character XML 1.0 allows.
inline bool is_xml_char(std::uint32_t c) {
  return c == 0x9 || c == 0xA || c == 0xD || (c >= 0x20 && c <= 0xD7FF) ||
         (c >= 0xE000 && c <= 0xFFFD) || (c >= 0x10000 && c <= 0x10FFFF);
}

// The length of the entity or character reference at text[i] == '&', or 0 when it is none.
inline std::size_t entity_length(std::string_view text, std::size_t i) {
  for (const char* name : {"&lt;", "&gt;", "&amp;", "&quot;", "&apos;"}) {
    if (text.compare(i, std::char_traits<char>::length(name), name) == 0) {
      return std::char_traits<char>::length(name);
    }
  }
  if (i + 2 >= text.size() || text[i + 1] != '#') return 0;
  std::size_t j = i + 2;
  const bool hex = text[j] == 'x';
  if (hex) ++j;
  const std::size_t digits_begin = j;
  std::uint32_t value = 0;
  for (; j < text.size() && j - digits_begin < 8; ++j) {
    const char c = text[j];
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    if (hex && c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    if (hex && c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    if (digit < 0) break;
    value = value * (hex ? 16 : 10) + static_cast<std::uint32_t>(digit);
  }
  if (j == digits_begin || j >= text.size() || text[j] != ';' || !is_xml_char(value)) return 0;
  return j + 1 - i;
}

}  // namespace detail

// The pre-scan; use repair_stray_markup().
class StrayMarkupScanner {
 public:
  StrayMarkupScanner(std::string_view text, const RepairOptions& options)
      : in_(text), options_(options) {}

  RepairedText run() {
    if (!options_.known_elements.empty()) index_end_tags();
    out_.text.reserve(in_.size() + in_.size() / 64);
    std::size_t i = 0;
    while (i < in_.size() && !out_.too_many) {
      const char c = in_[i];
      if (c == '&') {
        i = ampersand(i, "");
      } else if (c == '<') {
        i = less_than(i);
      } else {
        // Copy the run up to the next special character at once.
        std::size_t next = in_.find_first_of("<&", i);
        if (next == std::string_view::npos) next = in_.size();
        out_.text.append(in_.data() + i, next - i);
        i = next;
      }
    }
    return std::move(out_);
  }

 private:
  struct Open {
    std::string name;
    std::string description;  // `<module name="a">`
  };

  // A start or end tag as far as it scans: [begin, end) and whether it is well-formed.
  struct Tag {
    std::string name;
    std::string name_attribute;  // the value of name="...", for descriptions
    bool well_formed = false;
    bool self_closing = false;
    std::size_t end = 0;  // one past '>' when well-formed
  };

  bool known(const std::string& name) const {
    const auto& k = options_.known_elements;
    return std::find(k.begin(), k.end(), name) != k.end();
  }
  bool schema_rules() const { return !options_.known_elements.empty(); }

  std::string current_element() const { return open_.empty() ? "" : open_.back().description; }

  void escape(std::size_t offset, char character, std::string reason, std::string element) {
    if (out_.shifts_.size() == RepairedText::kMaxRepairs) {
      if (!out_.too_many) out_.too_many_offset = offset;
      out_.too_many = true;
    }
    const std::size_t start = out_.text.size();
    const std::size_t before = out_.shifts_.empty() ? 0 : out_.shifts_.back().inserted;
    out_.text += character == '<' ? "&lt;" : "&amp;";
    out_.shifts_.push_back({start, before + (character == '<' ? 3 : 4)});
    if (out_.listed.size() < RepairedText::kMaxListed) {
      out_.listed.push_back({offset, character, std::move(reason), std::move(element)});
    }
  }

  // Every `</name` in the text, at its last offset: rule 5 asks whether a start tag is closed
  // later. (Literal text: one inside a comment counts too.)
  void index_end_tags() {
    for (std::size_t i = in_.find("</"); i != std::string_view::npos; i = in_.find("</", i + 2)) {
      const std::string name = read_name(i + 2);
      if (!name.empty()) last_end_tag_[name] = i;
    }
  }

  std::string read_name(std::size_t i) const {
    if (i >= in_.size() || !detail::is_name_start(static_cast<unsigned char>(in_[i]))) return "";
    std::size_t j = i + 1;
    while (j < in_.size() && detail::is_name_char(static_cast<unsigned char>(in_[j]))) ++j;
    return std::string(in_.substr(i, j - i));
  }

  std::size_t ampersand(std::size_t i, const std::string& element_override) {
    if (const std::size_t n = detail::entity_length(in_, i)) {
      out_.text.append(in_.data() + i, n);
      return i + n;
    }
    escape(i, '&', "starts no entity or character reference",
           element_override.empty() ? current_element() : element_override);
    return i + 1;
  }

  // Copies in_[i, end) verbatim (a comment, CDATA, declaration) and returns end.
  std::size_t copy_through(std::size_t i, std::string_view terminator, const char* what) {
    const std::size_t t = in_.find(terminator, i);
    if (t == std::string_view::npos && out_.unterminated_what.empty()) {
      out_.unterminated_offset = i;
      out_.unterminated_what = std::string(what) + " has no '" + std::string(terminator) + "'";
    }
    // Unterminated: copy the rest (the parser reports it).
    const std::size_t end = t == std::string_view::npos ? in_.size() : t + terminator.size();
    out_.text.append(in_.data() + i, end - i);
    return end;
  }

  bool starts(std::size_t i, std::string_view s) const { return in_.compare(i, s.size(), s) == 0; }

  std::size_t less_than(std::size_t i) {
    const char next = i + 1 < in_.size() ? in_[i + 1] : '\0';
    if (next == '!') {
      if (starts(i, "<!--")) return copy_through(i, "-->", "the comment '<!--'");
      if (starts(i, "<![CDATA[")) return copy_through(i, "]]>", "the CDATA section '<![CDATA['");
      if (starts(i, "<!DOCTYPE")) {
        // With an internal subset ("[ ... ]") the declaration ends at "]>".
        const std::size_t bracket = in_.find('[', i), close = in_.find('>', i);
        return copy_through(i, bracket < close ? "]>" : ">", "the declaration '<!DOCTYPE'");
      }
      return stray(i, "'<!' starts no comment, CDATA section or DOCTYPE");
    }
    if (next == '?') {
      if (open_.empty()) return copy_through(i, "?>", "the processing instruction '<?'");
      return stray(i, "'<?' inside an element: processing instructions mean nothing in PML");
    }
    if (next == '/') return end_tag(i);
    if (detail::is_name_start(static_cast<unsigned char>(next))) return start_tag(i);
    return stray(i, "starts no tag");
  }

  std::size_t stray(std::size_t i, std::string reason) {
    escape(i, '<', std::move(reason), current_element());
    return i + 1;
  }

  // Scans `<name attr="v" ...>` or `.../>` from i (in_[i] == '<'), without copying.
  // in_.find(quote, from), remembering the last answer: tag after tag of an unterminated value
  // (`<a x="<a x="...`) would otherwise search to the end each time.
  std::size_t next_quote(char quote, std::size_t from) const {
    Memo& m = quote == '"' ? double_quote_ : single_quote_;
    if (!(m.valid && from >= m.from && (m.found == std::string_view::npos || from <= m.found))) {
      m = {true, from, in_.find(quote, from)};
    }
    return m.found;
  }

  Tag scan_start_tag(std::size_t i) const {
    Tag tag;
    tag.name = read_name(i + 1);
    std::size_t j = i + 1 + tag.name.size();
    while (true) {
      const std::size_t before_space = j;
      while (j < in_.size() && detail::is_space(in_[j])) ++j;
      if (j >= in_.size()) return tag;
      if (in_[j] == '>') break;
      if (in_[j] == '/') {
        if (j + 1 < in_.size() && in_[j + 1] == '>') {
          tag.self_closing = true;
          ++j;
          break;
        }
        return tag;
      }
      // An attribute needs whitespace before it, a name, '=', and a quoted value.
      if (j == before_space) return tag;
      const std::string attr = read_name(j);
      if (attr.empty()) return tag;
      j += attr.size();
      while (j < in_.size() && detail::is_space(in_[j])) ++j;
      if (j >= in_.size() || in_[j] != '=') return tag;
      ++j;
      while (j < in_.size() && detail::is_space(in_[j])) ++j;
      if (j >= in_.size() || (in_[j] != '"' && in_[j] != '\'')) return tag;
      const std::size_t close = next_quote(in_[j], j + 1);
      if (close == std::string_view::npos) return tag;
      if (attr == "name") tag.name_attribute = std::string(in_.substr(j + 1, close - j - 1));
      j = close + 1;
    }
    tag.well_formed = true;
    tag.end = j + 1;
    return tag;
  }

  static std::string describe(const Tag& tag) {
    std::string out = "<" + tag.name;
    if (!tag.name_attribute.empty()) out += " name=\"" + tag.name_attribute + "\"";
    return out + ">";
  }

  std::size_t start_tag(std::size_t i) {
    const Tag tag = scan_start_tag(i);
    if (schema_rules() && !known(tag.name)) {
      if (!tag.well_formed) {
        return stray(i, "starts no well-formed tag, and <" + tag.name + "> is not a PML element");
      }
      const auto closed = last_end_tag_.find(tag.name);
      if (!tag.self_closing && (closed == last_end_tag_.end() || closed->second < i)) {
        return stray(i, "<" + tag.name + "> is not a PML element and is never closed");
      }
    }
    if (!tag.well_formed) {
      // A PML element (or, in a prompt, any element) that is malformed: leave it to pugixml,
      // which reports it with its line.
      out_.text += '<';
      return i + 1;
    }
    // Markup: copy it, escaping '<' and stray '&' inside its quoted attribute values.
    const std::string description = describe(tag);
    char quote = '\0';
    for (std::size_t j = i; j < tag.end; ++j) {
      const char c = in_[j];
      if (quote != '\0') {
        if (c == quote) {
          quote = '\0';
        } else if (c == '<') {
          escape(j, '<', "in an attribute value", description);
          continue;
        } else if (c == '&') {
          j = ampersand(j, description) - 1;
          continue;
        }
      } else if (c == '"' || c == '\'') {
        quote = c;
      }
      out_.text += c;
    }
    if (!tag.self_closing) {
      // Past kMaxTracked levels only the depth is counted (such a document is refused for its
      // depth anyway), so that end tags never search a huge stack.
      if (open_.size() < kMaxTracked) {
        open_.push_back({tag.name, description});
      } else {
        ++untracked_;
      }
    }
    return tag.end;
  }

  std::size_t end_tag(std::size_t i) {
    const std::string name = read_name(i + 2);
    std::size_t j = i + 2 + name.size();
    while (j < in_.size() && detail::is_space(in_[j])) ++j;
    const bool well_formed = !name.empty() && j < in_.size() && in_[j] == '>';
    if (name.empty()) return stray(i, "starts no end tag");
    if (!well_formed && schema_rules() && !known(name)) {
      return stray(i, "starts no well-formed end tag, and <" + name + "> is not a PML element");
    }
    if (!well_formed) {
      out_.text += '<';
      return i + 1;
    }
    // A well-formed end tag is markup whatever its name, so a typo (`</modul>`) or a mismatch is
    // reported where it is. Close up to the matching element.
    if (untracked_ > 0) {
      --untracked_;
    } else {
      const auto open =
          std::find_if(open_.rbegin(), open_.rend(), [&](const Open& o) { return o.name == name; });
      if (open != open_.rend()) open_.erase(std::next(open).base(), open_.end());
    }
    out_.text.append(in_.data() + i, j + 1 - i);
    return j + 1;
  }

  struct Memo {
    bool valid = false;
    std::size_t from = 0, found = 0;
  };
  static constexpr std::size_t kMaxTracked = 1024;

  std::string_view in_;
  const RepairOptions& options_;
  RepairedText out_;
  std::vector<Open> open_;
  std::size_t untracked_ = 0;
  std::map<std::string, std::size_t> last_end_tag_;
  mutable Memo double_quote_, single_quote_;
};

// Escapes the '<' and '&' of `text` that cannot start markup (rules at the top of this file).
inline RepairedText repair_stray_markup(std::string_view text, const RepairOptions& options = {}) {
  return StrayMarkupScanner(text, options).run();
}

}  // namespace promptcache::pml
