// UTF-8 repair, normalization and JS white space (see unicode_text.hpp).
#include "unicode_text.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "promptcache/error.hpp"

namespace promptcache::unicode {
namespace {

const char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// One step of the WHATWG UTF-8 decoder from byte i: the length of the well-formed sequence that
// starts there, or 0 when the bytes from i form an invalid (maximal) subpart, whose length is
// then stored in `bad`.
std::size_t sequence_at(std::string_view s, std::size_t i, std::size_t& bad) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  std::size_t needed = 0;
  unsigned char lower = 0x80, upper = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    needed = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    needed = 2;
    if (lead == 0xE0) lower = 0xA0;
    if (lead == 0xED) upper = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    needed = 3;
    if (lead == 0xF0) lower = 0x90;
    if (lead == 0xF4) upper = 0x8F;  // nothing past U+10FFFF
  } else {
    bad = 1;
    return 0;
  }
  // The decoder consumes continuation bytes while they fit; the first that does not ends the
  // invalid subpart and is decoded afresh.
  std::size_t k = 1;
  for (; k <= needed; ++k) {
    if (i + k >= s.size()) {
      bad = k;
      return 0;
    }
    const unsigned char c = byte(i + k);
    if (c < lower || c > upper) {
      bad = k;
      return 0;
    }
    lower = 0x80;
    upper = 0xBF;
  }
  return needed + 1;
}

}  // namespace

bool is_valid_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    std::size_t bad = 0;
    const std::size_t n = sequence_at(text, i, bad);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string to_valid_utf8(std::string_view text) {
  if (is_valid_utf8(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 16);
  for (std::size_t i = 0; i < text.size();) {
    std::size_t bad = 0;
    const std::size_t n = sequence_at(text, i, bad);
    if (n > 0) {
      out.append(text, i, n);
      i += n;
    } else {
      out += kReplacement;
      i += bad;
    }
  }
  return out;
}

std::string normalize(std::string_view text, NormalForm form) {
  bool ascii = true;
  for (char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);  // every normal form leaves ASCII alone
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case NormalForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case NormalForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case NormalForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  // utf8proc_map with an explicit length (not NULLTERM): the text may hold NUL characters.
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                                          static_cast<utf8proc_option_t>(options));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(mapped, &std::free);
  if (n < 0) {
    throw Error(ErrorKind::kTokenizer,
                std::string("Unicode normalization failed: ") + utf8proc_errmsg(n));
  }
  return std::string(reinterpret_cast<const char*>(mapped), static_cast<std::size_t>(n));
}

std::size_t utf8_sequence_length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead >> 5) == 0x6) return 2;
  if ((lead >> 4) == 0xE) return 3;
  if ((lead >> 3) == 0x1E) return 4;
  return 1;
}

char32_t next_code_point(std::string_view text, std::size_t& i) {
  const unsigned char lead = static_cast<unsigned char>(text[i]);
  const std::size_t n = std::min(utf8_sequence_length(lead), text.size() - i);
  if (n == 1) {
    ++i;
    return lead;
  }
  char32_t cp = lead & (0xFF >> (n + 1));
  for (std::size_t k = 1; k < n; ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
  i += n;
  return cp;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool is_js_space(char32_t cp) {
  switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
    case 0xFEFF:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

std::string_view trim_js_start(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    std::size_t next = i;
    if (!is_js_space(next_code_point(text, next))) break;
    i = next;
  }
  return text.substr(i);
}

std::string_view trim_js_end(std::string_view text) {
  std::size_t end = text.size();
  while (end > 0) {
    std::size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    std::size_t i = start;
    if (!is_js_space(next_code_point(text, i))) break;
    end = start;
  }
  return text.substr(0, end);
}

}  // namespace promptcache::unicode
