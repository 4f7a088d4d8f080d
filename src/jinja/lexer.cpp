// The Jinja lexer: template text into tokens, with the whitespace rules HF renders chat templates
// with (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False).
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "ast.hpp"
#include "core/unicode_text.hpp"

namespace promptcache::jinja {

void template_error(const std::string& origin, int line, int column, const std::string& message,
                    const std::string& element) {
  throw Error(kTemplateError, message,
              {origin, static_cast<std::size_t>(line > 0 ? line : 0),
               static_cast<std::size_t>(column > 0 ? column : 0), element});
}

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

class Lexer {
 public:
  Lexer(std::string source, const std::string& origin) : src_(std::move(source)), origin_(origin) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const std::size_t tag = find_tag(pos_);
      std::string text = src_.substr(pos_, tag - pos_);
      const int text_line = line_, text_column = column_;
      advance_to(tag);
      if (tag == src_.size()) {
        emit_text(std::move(text), text_line, text_column);
        break;
      }
      const char type = src_[tag + 1];  // '{', '%' or '#'
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (sign == '-') {
        std::size_t end = text.size();
        while (end > 0 && is_space(text[end - 1])) --end;
        text.resize(end);
      } else if (sign != '+' && type != '{') {
        // lstrip_blocks: spaces between the line start and a block or comment tag go.
        const std::size_t line_start =
            text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if (line_start > 0 || line_starting) {
          bool blank = line_start < text.size();
          for (std::size_t i = line_start; i < text.size(); ++i) blank = blank && is_space(text[i]);
          if (blank) text.resize(line_start);
        }
      }
      emit_text(std::move(text), text_line, text_column);
      const int tag_line = line_, tag_column = column_;
      advance_to(tag + 2 + (sign == '-' || sign == '+' ? 1 : 0));
      if (type == '#') {
        line_starting = comment(tag_line, tag_column);
      } else if (type == '%') {
        line_starting = block(tag_line, tag_column);
      } else {
        line_starting = variable(tag_line, tag_column);
      }
    }
    tokens_.push_back({Token::Kind::kEof, "", 0, 0, line_, column_});
    return std::move(tokens_);
  }

 private:
  std::size_t find_tag(std::size_t from) const {
    for (std::size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return src_.size();
  }

  void advance_to(std::size_t to) {
    for (; pos_ < to; ++pos_) {
      if (src_[pos_] == '\n') {
        ++line_;
        column_ = 1;
      } else {
        ++column_;
      }
    }
  }

  void emit_text(std::string text, int line, int column) {
    if (!text.empty()) tokens_.push_back({Token::Kind::kText, std::move(text), 0, 0, line, column});
  }

  // After `-%}`: all whitespace goes; after `%}` (trim_blocks): one newline. Returns whether what
  // was consumed ends a line (lstrip_blocks then applies to the next tag with no newline before).
  bool end_tag(std::size_t end_begin, std::size_t end_size, bool trim_newline) {
    const bool strip = end_begin > 0 && src_[end_begin] == '-';
    const bool keep = end_begin > 0 && src_[end_begin] == '+';
    advance_to(end_begin + end_size + (strip || keep ? 1 : 0));
    if (strip) {
      std::size_t to = pos_;
      while (to < src_.size() && is_space(src_[to])) ++to;
      const bool newline = to > pos_ && src_[to - 1] == '\n';
      advance_to(to);
      return newline;
    }
    if (!keep && trim_newline && pos_ < src_.size() && src_[pos_] == '\n') {
      advance_to(pos_ + 1);
      return true;
    }
    return false;
  }

  bool comment(int line, int column) {
    const std::size_t end = src_.find("#}", pos_);
    if (end == std::string::npos)
      template_error(origin_, line, column, "missing end of comment tag", "{#");
    std::size_t marker = end;
    if (end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+')) marker = end - 1;
    advance_to(marker);
    return end_tag(marker, 2, true);
  }

  bool variable(int line, int column) {
    tokens_.push_back({Token::Kind::kVarBegin, "{{", 0, 0, line, column});
    const std::size_t end = tag_tokens('}', line, column, "{{");
    const bool strip = src_[end] == '-';
    tokens_.push_back({Token::Kind::kVarEnd, "}}", 0, 0, line_, column_});
    advance_to(end + (strip ? 3 : 2));
    if (strip) {
      std::size_t to = pos_;
      while (to < src_.size() && is_space(src_[to])) ++to;
      const bool newline = to > pos_ && src_[to - 1] == '\n';
      advance_to(to);
      return newline;
    }
    return false;
  }

  bool block(int line, int column) {
    tokens_.push_back({Token::Kind::kBlockBegin, "{%", 0, 0, line, column});
    const std::size_t first = tokens_.size();
    const std::size_t end = tag_tokens('%', line, column, "{%");
    tokens_.push_back({Token::Kind::kBlockEnd, "%}", 0, 0, line_, column_});
    const bool newline = end_tag(end, 2, true);
    if (tokens_.size() == first + 2 && tokens_[first].kind == Token::Kind::kName &&
        tokens_[first].text == "raw") {
      return raw(line, column);
    }
    return newline;
  }

  // {% raw %}...{% endraw %}: the text as written.
  bool raw(int line, int column) {
    tokens_.resize(tokens_.size() - 3);  // {% raw %}
    std::size_t search = pos_;
    while (true) {
      const std::size_t open = src_.find("{%", search);
      if (open == std::string::npos)
        template_error(origin_, line, column, "missing end of raw directive", "{% raw %}");
      std::size_t i = open + 2;
      const char sign = i < src_.size() ? src_[i] : '\0';
      if (sign == '-' || sign == '+') ++i;
      while (i < src_.size() && is_space(src_[i])) ++i;
      if (src_.compare(i, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      i += 6;
      while (i < src_.size() && is_space(src_[i])) ++i;
      std::size_t marker = i;
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
      if (src_.compare(i, 2, "%}") != 0) {
        search = open + 2;
        continue;
      }
      std::string text = src_.substr(pos_, open - pos_);
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      }
      emit_text(std::move(text), line_, column_);
      advance_to(marker);
      if (src_[marker] != '-' && src_[marker] != '+') marker = i;
      return end_tag(marker, 2, true);
    }
  }

  // Tokens up to the tag's end (`}}` or `%}`, optionally after '-' or '+'), outside brackets.
  // Returns the index where the end marker (its sign, if any) starts.
  std::size_t tag_tokens(char closer, int line, int column, const char* element) {
    std::vector<char> brackets;
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= src_.size()) {
        template_error(origin_, line, column,
                       std::string("unexpected end of template, expected '") + closer + "}'",
                       element);
      }
      if (brackets.empty()) {
        const char c = src_[pos_];
        if ((c == '-' || c == '+') && pos_ + 2 < src_.size() && src_[pos_ + 1] == closer &&
            src_[pos_ + 2] == '}') {
          if (closer == '%' || c == '-') return pos_;
        }
        if (c == closer && pos_ + 1 < src_.size() && src_[pos_ + 1] == '}') return pos_;
      }
      token(brackets);
    }
  }

  void token(std::vector<char>& brackets) {
    const int line = line_, column = column_;
    const char c = src_[pos_];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t end = pos_;
      while (end < src_.size() &&
             (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) {
        ++end;
      }
      tokens_.push_back({Token::Kind::kName, src_.substr(pos_, end - pos_), 0, 0, line, column});
      advance_to(end);
      return;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      number(line, column);
      return;
    }
    if (c == '\'' || c == '"') {
      string_literal(c, line, column);
      return;
    }
    static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                       "/",  "%",  "~",  "(",  ")",  "[",  "]", "{", "}",
                                       ",",  ".",  ":",  "|",  "=",  "<",  ">", ";"};
    for (const char* op : kOps) {
      const std::size_t n = std::char_traits<char>::length(op);
      if (src_.compare(pos_, n, op) == 0) {
        if (n == 1 && (c == '(' || c == '[' || c == '{')) {
          brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
        } else if (n == 1 && (c == ')' || c == ']' || c == '}')) {
          if (brackets.empty())
            template_error(origin_, line, column, std::string("unexpected '") + c + "'");
          if (brackets.back() != c) {
            template_error(
                origin_, line, column,
                std::string("unexpected '") + c + "', expected '" + brackets.back() + "'");
          }
          brackets.pop_back();
        }
        tokens_.push_back({Token::Kind::kOp, op, 0, 0, line, column});
        advance_to(pos_ + n);
        return;
      }
    }
    template_error(origin_, line, column, std::string("unexpected char '") + c + "'");
  }

  void number(int line, int column) {
    std::size_t end = pos_;
    std::string digits;
    auto take_digits = [&] {
      while (end < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[end])) ||
                                   (src_[end] == '_' && end + 1 < src_.size() &&
                                    std::isdigit(static_cast<unsigned char>(src_[end + 1]))))) {
        if (src_[end] != '_') digits += src_[end];
        ++end;
      }
    };
    take_digits();
    bool is_float = false;
    if (end + 1 < src_.size() && src_[end] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
      is_float = true;
      digits += '.';
      ++end;
      take_digits();
    }
    if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      std::size_t e = end + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
        is_float = true;
        digits += 'e';
        digits.append(src_, end + 1, e - end - 1);
        end = e;
        take_digits();
      }
    }
    Token t{is_float ? Token::Kind::kFloat : Token::Kind::kInt, digits, 0, 0, line, column};
    if (is_float) {
      t.float_value = std::strtod(digits.c_str(), nullptr);
    } else {
      errno = 0;
      char* stop = nullptr;
      t.int_value = std::strtoll(digits.c_str(), &stop, 10);
      if (errno == ERANGE)
        template_error(origin_, line, column, "integer literal out of range", digits);
    }
    tokens_.push_back(std::move(t));
    advance_to(end);
  }

  // Python's string escapes (\n, \t, \\, \', \", \xNN, \uNNNN, \UNNNNNNNN); others stay as written.
  void string_literal(char quote, int line, int column) {
    std::string value;
    std::size_t i = pos_ + 1;
    while (true) {
      if (i >= src_.size()) template_error(origin_, line, column, "unterminated string literal");
      const char c = src_[i];
      if (c == quote) break;
      if (c != '\\' || i + 1 >= src_.size()) {
        value += c;
        ++i;
        continue;
      }
      const char e = src_[i + 1];
      i += 2;
      switch (e) {
        case 'n':
          value += '\n';
          break;
        case 't':
          value += '\t';
          break;
        case 'r':
          value += '\r';
          break;
        case '\\':
          value += '\\';
          break;
        case '\'':
          value += '\'';
          break;
        case '"':
          value += '"';
          break;
        case 'a':
          value += '\a';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'v':
          value += '\v';
          break;
        case '0':
          value += '\0';
          break;
        case '\n':
          break;
        case 'x':
        case 'u':
        case 'U': {
          const std::size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (i + n > src_.size())
            template_error(origin_, line, column, "truncated \\" + std::string(1, e) + " escape");
          unsigned long cp = 0;
          for (std::size_t k = 0; k < n; ++k) {
            const char h = src_[i + k];
            if (!std::isxdigit(static_cast<unsigned char>(h))) {
              template_error(origin_, line, column, "truncated \\" + std::string(1, e) + " escape");
            }
            cp = cp * 16 + static_cast<unsigned long>(std::isdigit(static_cast<unsigned char>(h))
                                                          ? h - '0'
                                                          : (std::tolower(h) - 'a' + 10));
          }
          i += n;
          if (cp > 0x10FFFF)
            template_error(origin_, line, column, "illegal Unicode character in escape");
          unicode::append_utf8(value, static_cast<char32_t>(cp));
          break;
        }
        default:
          value += '\\';
          value += e;
      }
    }
    tokens_.push_back({Token::Kind::kString, std::move(value), 0, 0, line, column});
    advance_to(i + 1);
  }

  std::string src_;
  const std::string& origin_;
  std::size_t pos_ = 0;
  int line_ = 1, column_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> lex(std::string_view source, const std::string& origin) {
  // Newlines normalized to \n; one trailing newline dropped (keep_trailing_newline=False).
  std::string text;
  text.reserve(source.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      text += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      text += source[i];
    }
  }
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return Lexer(std::move(text), origin).run();
}

}  // namespace promptcache::jinja
