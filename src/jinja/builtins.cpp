// The builtins of the Jinja interpreter: operators, attribute and item access, the filters and
// tests, the str/list/dict methods chat templates call, and the globals (range, namespace, dict,
// raise_exception, strftime_now) — with Python's results, and HF's sandbox (no list or dict is
// ever changed). Strings are UTF-8; lengths, indexes and slices count code points as Python does.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <ctime>

#include "interpreter.hpp"

namespace promptcache::jinja {
namespace {

// The sandbox's cap on range() (jinja2.sandbox.MAX_RANGE).
constexpr int64_t kMaxRange = 100000;

// Byte offsets where each code point starts, plus the end.
std::vector<std::size_t> char_starts(const std::string& s) {
  std::vector<std::size_t> starts;
  for (std::size_t i = 0; i < s.size();) {
    starts.push_back(i);
    const unsigned char c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80           ? 1
                    : (c >> 5) == 0x6  ? 2
                    : (c >> 4) == 0xE  ? 3
                    : (c >> 3) == 0x1E ? 4
                                       : 1;
    if (i + n > s.size()) n = 1;
    for (std::size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) n = 1;
    }
    i += n;
  }
  starts.push_back(s.size());
  return starts;
}

std::vector<std::string> chars_of(const std::string& s) {
  const auto starts = char_starts(s);
  std::vector<std::string> out;
  for (std::size_t i = 0; i + 1 < starts.size(); ++i) {
    out.push_back(s.substr(starts[i], starts[i + 1] - starts[i]));
  }
  return out;
}

int64_t length_of(const std::string& s) {
  return static_cast<int64_t>(char_starts(s).size()) - 1;
}

bool is_space(const std::string& ch) {
  if (ch.size() == 1) {
    const char c = ch[0];
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' ||
           (c >= 0x1c && c <= 0x1f);
  }
  // U+0085, U+00A0, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000, U+1680
  static const char* const kSpaces[] = {"\xc2\x85",     "\xc2\xa0",     "\xe1\x9a\x80",
                                        "\xe2\x80\xa8", "\xe2\x80\xa9", "\xe2\x80\xaf",
                                        "\xe2\x81\x9f", "\xe3\x80\x80"};
  for (const char* sp : kSpaces) {
    if (ch == sp) return true;
  }
  return ch.size() == 3 && static_cast<unsigned char>(ch[0]) == 0xe2 &&
         static_cast<unsigned char>(ch[1]) == 0x80 && static_cast<unsigned char>(ch[2]) <= 0x8a;
}

// str.strip/lstrip/rstrip: whitespace, or any of `chars`.
std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  const std::vector<std::string> cs = chars_of(s);
  std::vector<std::string> set;
  const bool by_set = chars != nullptr && !chars->is_none() && !chars->is_undefined();
  if (by_set) set = chars_of(chars->str());
  auto strippable = [&](const std::string& c) {
    return by_set ? std::find(set.begin(), set.end(), c) != set.end() : is_space(c);
  };
  std::size_t b = 0, e = cs.size();
  if (left) {
    while (b < e && strippable(cs[b])) ++b;
  }
  if (right) {
    while (e > b && strippable(cs[e - 1])) --e;
  }
  std::string out;
  for (std::size_t i = b; i < e; ++i) out += cs[i];
  return out;
}

std::string ascii_map(const std::string& s, int (*f)(int)) {
  std::string out = s;
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x80) c = static_cast<char>(f(c));
  }
  return out;
}

std::string capitalize(const std::string& s) {
  std::string out = ascii_map(s, [](int c) { return std::tolower(c); });
  if (!out.empty() && static_cast<unsigned char>(out[0]) < 0x80)
    out[0] = static_cast<char>(std::toupper(out[0]));
  return out;
}

std::string title(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (std::isalpha(u)) {
      c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
      start = false;
    } else {
      start = !(u >= 0x80 || std::isdigit(u) || c == '\'');
    }
  }
  return out;
}

std::string replace_all(Interpreter& in, const std::string& s, const std::string& from,
                        const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` between every character (and at both ends).
    const auto cs = chars_of(s);
    int64_t done = 0;
    for (std::size_t i = 0; i <= cs.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < cs.size()) out += cs[i];
      if (out.size() > in.limits().max_output_bytes) in.fail("replace() result too long");
    }
    return out;
  }
  std::size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const std::size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    if (out.size() > in.limits().max_output_bytes) in.fail("replace() result too long");
    pos = hit + from.size();
    ++done;
  }
  out.append(s, pos, std::string::npos);
  return out;
}

List split(const std::string& s, const Value* sep, int64_t maxsplit) {
  List out;
  if (sep == nullptr || sep->is_none()) {
    // Runs of whitespace; leading and trailing whitespace give no empty items.
    const auto cs = chars_of(s);
    std::size_t i = 0;
    while (i < cs.size()) {
      while (i < cs.size() && is_space(cs[i])) ++i;
      if (i >= cs.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::string rest;
        for (std::size_t k = i; k < cs.size(); ++k) rest += cs[k];
        // Python keeps the remainder as is, trailing whitespace stripped.
        out.emplace_back(strip(rest, nullptr, false, true));
        return out;
      }
      std::string word;
      while (i < cs.size() && !is_space(cs[i])) word += cs[i++];
      out.emplace_back(std::move(word));
    }
    return out;
  }
  const std::string by = sep->str();
  if (by.empty()) throw Error(kTemplateError, "empty separator");
  std::size_t pos = 0;
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    const std::size_t hit = s.find(by, pos);
    if (hit == std::string::npos) break;
    out.emplace_back(s.substr(pos, hit - pos));
    pos = hit + by.size();
  }
  out.emplace_back(s.substr(pos));
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Argument `index` by position or `name` by keyword, else nullptr.
const Value* arg(const CallArgs& args, std::size_t index, const char* name) {
  if (index < args.positional.size()) return &args.positional[index];
  return args.find(name);
}

int64_t int_arg(Interpreter& in, const CallArgs& args, std::size_t index, const char* name,
                int64_t fallback) {
  const Value* v = arg(args, index, name);
  if (v == nullptr || v->is_none()) return fallback;
  if (!v->is_int() && !v->is_bool())
    in.fail(std::string("argument '") + name + "' must be an integer");
  return v->as_int();
}

bool bool_arg(const CallArgs& args, std::size_t index, const char* name, bool fallback) {
  const Value* v = arg(args, index, name);
  return v == nullptr ? fallback : v->truthy();
}

[[noreturn]] void undefined_error(Interpreter& in, const Value& v) {
  in.fail(v.name().empty() ? "undefined value" : v.name());
}

// Python's < for two values (numbers, strings, lists); TypeError otherwise.
bool less(Interpreter& in, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_error(in, a);
  if (b.is_undefined()) undefined_error(in, b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() < b.as_float();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list()) {
    const List &x = a.as_list(), &y = b.as_list();
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return less(in, x[i], y[i]);
    }
    return x.size() < y.size();
  }
  in.fail(std::string("'<' not supported between instances of '") + a.type_name() + "' and '" +
          b.type_name() + "'");
}

bool contains(Interpreter& in, const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) {
      in.fail(std::string("'in <string>' requires string as left operand, not ") +
              item.type_name());
    }
    return container.as_string().find(item.as_string()) != std::string::npos;
  }
  if (container.is_list()) {
    for (const Value& v : container.as_list()) {
      if (equals(v, item)) return true;
    }
    return false;
  }
  if (container.is_dict()) return container.as_dict().find(item) != nullptr;
  if (container.is_undefined()) return false;
  in.fail(std::string("argument of type '") + container.type_name() + "' is not iterable");
}

Value method(std::string name, Builtin fn) {
  return Value::callable(std::move(name), std::move(fn));
}

[[noreturn]] void unsafe(Interpreter& in, const std::string& attr, const char* type) {
  in.fail("access to attribute '" + attr + "' of '" + type + "' object is unsafe.");
}

Value string_method(const Value& self, const std::string& name) {
  const std::string s = self.as_string();
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    return method(name, [s, name](Interpreter&, CallArgs& a) {
      return Value(strip(s, arg(a, 0, "chars"), name != "rstrip", name != "lstrip"));
    });
  }
  if (name == "split") {
    return method(name, [s](Interpreter& in, CallArgs& a) {
      return Value(split(s, arg(a, 0, "sep"), int_arg(in, a, 1, "maxsplit", -1)));
    });
  }
  if (name == "splitlines") {
    return method(name, [s](Interpreter&, CallArgs& a) {
      List out;
      const bool keep = bool_arg(a, 0, "keepends", false);
      std::size_t pos = 0;
      while (pos < s.size()) {
        std::size_t nl = s.find_first_of("\r\n", pos);
        if (nl == std::string::npos) {
          out.emplace_back(s.substr(pos));
          break;
        }
        std::size_t end = nl + (s[nl] == '\r' && nl + 1 < s.size() && s[nl + 1] == '\n' ? 2 : 1);
        out.emplace_back(s.substr(pos, (keep ? end : nl) - pos));
        pos = end;
      }
      return Value(std::move(out));
    });
  }
  if (name == "startswith" || name == "endswith") {
    return method(name, [s, name](Interpreter& in, CallArgs& a) {
      const Value* what = arg(a, 0, name == "startswith" ? "prefix" : "suffix");
      if (what == nullptr) in.fail(name + "() takes at least 1 argument");
      List options = what->is_list() ? what->as_list() : List{*what};
      for (const Value& o : options) {
        if (!o.is_string()) in.fail(name + " first arg must be str or a tuple of str");
        const std::string& p = o.as_string();
        if (p.size() > s.size()) continue;
        if (name == "startswith" ? s.compare(0, p.size(), p) == 0
                                 : s.compare(s.size() - p.size(), p.size(), p) == 0) {
          return Value(true);
        }
      }
      return Value(false);
    });
  }
  if (name == "replace") {
    return method(name, [s](Interpreter& in, CallArgs& a) {
      const Value* from = arg(a, 0, "old");
      const Value* to = arg(a, 1, "new");
      if (from == nullptr || to == nullptr || !from->is_string() || !to->is_string()) {
        in.fail("replace() takes two strings");
      }
      return Value(
          replace_all(in, s, from->as_string(), to->as_string(), int_arg(in, a, 2, "count", -1)));
    });
  }
  if (name == "upper")
    return method(name, [s](Interpreter&, CallArgs&) {
      return Value(ascii_map(s, [](int c) { return std::toupper(c); }));
    });
  if (name == "lower")
    return method(name, [s](Interpreter&, CallArgs&) {
      return Value(ascii_map(s, [](int c) { return std::tolower(c); }));
    });
  if (name == "title")
    return method(name, [s](Interpreter&, CallArgs&) { return Value(title(s)); });
  if (name == "capitalize")
    return method(name, [s](Interpreter&, CallArgs&) { return Value(capitalize(s)); });
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex" || name == "count") {
    return method(name, [s, name](Interpreter& in, CallArgs& a) {
      const Value* sub = arg(a, 0, "sub");
      if (sub == nullptr || !sub->is_string()) in.fail(name + "() takes a string");
      const std::string& t = sub->as_string();
      if (name == "count") {
        if (t.empty()) return Value(length_of(s) + 1);
        int64_t n = 0;
        for (std::size_t p = s.find(t); p != std::string::npos; p = s.find(t, p + t.size())) ++n;
        return Value(n);
      }
      const std::size_t hit = name[0] == 'r' ? s.rfind(t) : s.find(t);
      if (hit == std::string::npos) {
        if (name == "index" || name == "rindex") in.fail("substring not found");
        return Value(-1);
      }
      return Value(length_of(s.substr(0, hit)));
    });
  }
  if (name == "join") {
    return method(name, [s](Interpreter& in, CallArgs& a) {
      const Value* items = arg(a, 0, "iterable");
      if (items == nullptr) in.fail("join() takes one argument");
      std::string out;
      bool first = true;
      for (const Value& v : iterate(in, *items)) {
        if (!v.is_string())
          in.fail(std::string("sequence item: expected str instance, ") + v.type_name() + " found");
        if (!first) out += s;
        first = false;
        out += v.as_string();
        if (out.size() > in.limits().max_output_bytes) in.fail("join() result too long");
      }
      return Value(std::move(out));
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    return method(name, [s, name](Interpreter& in, CallArgs& a) {
      const Value* v = arg(a, 0, "affix");
      if (v == nullptr || !v->is_string()) in.fail(name + "() takes a string");
      const std::string& p = v->as_string();
      if (p.size() > s.size()) return Value(s);
      if (name == "removeprefix")
        return Value(s.compare(0, p.size(), p) == 0 ? s.substr(p.size()) : s);
      return Value(
          s.compare(s.size() - p.size(), p.size(), p) == 0 ? s.substr(0, s.size() - p.size()) : s);
    });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" ||
      name == "islower" || name == "isupper") {
    return method(name, [s, name](Interpreter&, CallArgs&) {
      if (s.empty()) return Value(false);
      bool cased = false;
      for (unsigned char c : s) {
        if (name == "isdigit" && !std::isdigit(c)) return Value(false);
        if (name == "isalpha" && !std::isalpha(c)) return Value(false);
        if (name == "isalnum" && !std::isalnum(c)) return Value(false);
        if (name == "isspace" && !std::isspace(c)) return Value(false);
        if (name == "islower" && std::isupper(c)) return Value(false);
        if (name == "isupper" && std::islower(c)) return Value(false);
        cased = cased || std::isalpha(c);
      }
      return Value(name == "islower" || name == "isupper" ? cased : true);
    });
  }
  return Value::undefined("'str object' has no attribute '" + name + "'");
}

Value dict_method(const Value& self, const std::string& name) {
  if (name == "items" || name == "keys" || name == "values") {
    return method(name, [self, name](Interpreter& in, CallArgs&) {
      List out;
      in.step(self.as_dict().size());
      for (const auto& [k, v] : self.as_dict().items()) {
        if (name == "items") {
          out.push_back(Value::tuple(List{k, v}));
        } else {
          out.push_back(name == "keys" ? k : v);
        }
      }
      return Value(std::move(out));
    });
  }
  if (name == "get") {
    return method(name, [self](Interpreter& in, CallArgs& a) {
      if (a.positional.empty()) in.fail("get() takes at least 1 argument");
      const Value* v = self.as_dict().find(a.positional[0]);
      if (v != nullptr) return *v;
      return a.positional.size() > 1 ? a.positional[1] : Value::none();
    });
  }
  if (name == "update" || name == "pop" || name == "setdefault" || name == "clear" ||
      name == "popitem") {
    return method(name, [name](Interpreter& in, CallArgs&) -> Value { unsafe(in, name, "dict"); });
  }
  return Value();
}

Value list_method(const Value& self, const std::string& name) {
  if (name == "index" || name == "count") {
    return method(name, [self, name](Interpreter& in, CallArgs& a) {
      if (a.positional.empty()) in.fail(name + "() takes 1 argument");
      int64_t n = 0, i = 0;
      for (const Value& v : self.as_list()) {
        if (equals(v, a.positional[0])) {
          if (name == "index") return Value(i);
          ++n;
        }
        ++i;
      }
      if (name == "index") in.fail("value is not in list");
      return Value(n);
    });
  }
  if (name == "append" || name == "extend" || name == "pop" || name == "insert" ||
      name == "remove" || name == "clear" || name == "sort" || name == "reverse") {
    return method(name, [name](Interpreter& in, CallArgs&) -> Value { unsafe(in, name, "list"); });
  }
  return Value::undefined("'list object' has no attribute '" + name + "'");
}

int64_t normalize_index(int64_t i, int64_t n) {
  return i < 0 ? i + n : i;
}

// Python's slice indices for a sequence of n items.
std::vector<int64_t> slice_indices(Interpreter& in, int64_t n, const Value& start,
                                   const Value& stop, const Value& step_value) {
  auto as_index = [&](const Value& v, const char* what) {
    if (!v.is_int() && !v.is_bool())
      in.fail(std::string("slice ") + what + " must be an integer or None");
    return v.as_int();
  };
  const int64_t step = step_value.is_none() ? 1 : as_index(step_value, "step");
  if (step == 0) in.fail("slice step cannot be zero");
  auto clamp = [&](const Value& v, int64_t fallback) {
    if (v.is_none()) return fallback;
    int64_t i = as_index(v, "index");
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = clamp(start, step > 0 ? 0 : n - 1);
  const int64_t e = clamp(stop, step > 0 ? n : -1);
  std::vector<int64_t> out;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step) out.push_back(i);
  return out;
}

Value map_like(Interpreter& in, const Value& input, CallArgs& args, bool select, bool by_attribute,
               bool keep) {
  // select/reject(test, args...), selectattr/rejectattr(attr, test, args...)
  List out;
  std::size_t first = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty() || !args.positional[0].is_string())
      in.fail("selectattr needs an attribute name");
    attribute = args.positional[0].as_string();
    first = 1;
  }
  std::string test;
  if (args.positional.size() > first) {
    test = args.positional[first].str();
  }
  for (const Value& item : iterate(in, input)) {
    in.step();
    Value subject = item;
    if (by_attribute) {
      for (std::size_t p = 0, q; p <= attribute.size(); p = q + 1) {
        q = attribute.find('.', p);
        if (q == std::string::npos) q = attribute.size();
        subject = get_attribute(in, subject, attribute.substr(p, q - p));
      }
    }
    bool passed;
    if (test.empty()) {
      passed = subject.truthy();
    } else {
      CallArgs targs;
      for (std::size_t i = first + 1; i < args.positional.size(); ++i)
        targs.positional.push_back(args.positional[i]);
      passed = in.apply_test(test, subject, targs);
    }
    if (passed == select) out.push_back(item);
  }
  (void)keep;
  return Value(std::move(out));
}

Value round_value(double x, int64_t precision, const std::string& method) {
  const double scale = std::pow(10.0, static_cast<double>(precision));
  double r;
  if (method == "ceil") {
    r = std::ceil(x * scale) / scale;
  } else if (method == "floor") {
    r = std::floor(x * scale) / scale;
  } else {
    // Python's round(): half to even.
    const double y = x * scale;
    double f = std::floor(y);
    const double diff = y - f;
    if (diff > 0.5 || (diff == 0.5 && std::fmod(f, 2.0) != 0)) f += 1;
    r = f / scale;
  }
  return Value(r);
}

}  // namespace

List iterate(Interpreter& in, const Value& v) {
  switch (v.type()) {
    case Value::Type::kList:
      in.step(v.as_list().size());
      return v.as_list();
    case Value::Type::kString: {
      List out;
      for (auto& c : chars_of(v.as_string())) out.emplace_back(std::move(c));
      in.step(out.size());
      return out;
    }
    case Value::Type::kDict: {
      List out;
      for (const auto& item : v.as_dict().items()) out.push_back(item.first);
      in.step(out.size());
      return out;
    }
    case Value::Type::kUndefined:
      return {};
    default:
      in.fail(std::string("'") + v.type_name() + "' object is not iterable");
  }
}

Value get_attribute(Interpreter& in, const Value& object, const std::string& name) {
  switch (object.type()) {
    case Value::Type::kUndefined:
      undefined_error(in, object);
    case Value::Type::kDict: {
      Value m = dict_method(object, name);
      if (!m.is_undefined()) return m;
      const Value* v = object.as_dict().find(name);
      return v ? *v : Value::undefined("'dict object' has no attribute '" + name + "'");
    }
    case Value::Type::kNamespace: {
      const Value* v = object.as_dict().find(name);
      return v ? *v : Value::undefined("'Namespace object' has no attribute '" + name + "'");
    }
    case Value::Type::kString:
      return string_method(object, name);
    case Value::Type::kList:
      return list_method(object, name);
    default:
      return Value::undefined(std::string("'") + object.type_name() +
                              " object' has no attribute '" + name + "'");
  }
}

Value get_item(Interpreter& in, const Value& object, const Value& key) {
  switch (object.type()) {
    case Value::Type::kUndefined:
      undefined_error(in, object);
    case Value::Type::kList:
    case Value::Type::kString: {
      if (key.is_int() || key.is_bool()) {
        if (object.is_list()) {
          const int64_t n = static_cast<int64_t>(object.as_list().size());
          const int64_t i = normalize_index(key.as_int(), n);
          if (i >= 0 && i < n) return object.as_list()[static_cast<std::size_t>(i)];
        } else {
          const auto starts = char_starts(object.as_string());
          const int64_t n = static_cast<int64_t>(starts.size()) - 1;
          const int64_t i = normalize_index(key.as_int(), n);
          if (i >= 0 && i < n) {
            const auto k = static_cast<std::size_t>(i);
            return Value(object.as_string().substr(starts[k], starts[k + 1] - starts[k]));
          }
        }
        return Value::undefined(std::string("'") + object.type_name() + " object' has no element " +
                                key.str());
      }
      if (key.is_string()) return get_attribute(in, object, key.as_string());
      return Value::undefined(std::string("'") + object.type_name() + " object' has no element " +
                              key.repr());
    }
    case Value::Type::kDict: {
      if (key.is_list() || key.is_dict() || key.is_namespace() || key.is_callable()) {
        return Value::undefined("'dict object' has no element " + key.repr());
      }
      const Value* v = key.is_undefined() ? nullptr : object.as_dict().find(key);
      if (v) return *v;
      if (key.is_string()) return get_attribute(in, object, key.as_string());
      return Value::undefined("'dict object' has no element " + key.repr());
    }
    default:
      if (key.is_string()) return get_attribute(in, object, key.as_string());
      return Value::undefined(std::string("'") + object.type_name() + " object' has no element " +
                              key.repr());
  }
}

Value slice(Interpreter& in, const Value& object, const Value& start, const Value& stop,
            const Value& step) {
  if (object.is_undefined()) undefined_error(in, object);
  if (object.is_list()) {
    const List& items = object.as_list();
    List out;
    for (int64_t i : slice_indices(in, static_cast<int64_t>(items.size()), start, stop, step)) {
      out.push_back(items[static_cast<std::size_t>(i)]);
    }
    in.step(out.size());
    return object.is_tuple() ? Value::tuple(std::move(out)) : Value(std::move(out));
  }
  if (object.is_string()) {
    const std::string& s = object.as_string();
    const auto starts = char_starts(s);
    std::string out;
    for (int64_t i :
         slice_indices(in, static_cast<int64_t>(starts.size()) - 1, start, stop, step)) {
      const auto k = static_cast<std::size_t>(i);
      out.append(s, starts[k], starts[k + 1] - starts[k]);
    }
    in.step(out.size());
    return Value(std::move(out));
  }
  in.fail(std::string("'") + object.type_name() + "' object is not subscriptable");
}

Value binary_op(Interpreter& in, const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_error(in, a);
  if (b.is_undefined()) undefined_error(in, b);
  auto unsupported = [&]() -> Value {
    in.fail("unsupported operand type(s) for " + op + ": '" + a.type_name() + "' and '" +
            b.type_name() + "'");
  };
  if (a.is_number() && b.is_number()) {
    const bool ints = !a.is_float() && !b.is_float();
    const int64_t x = a.as_int(), y = b.as_int();
    const double fx = a.as_float(), fy = b.as_float();
    int64_t r = 0;
    if (op == "+") {
      if (!ints) return Value(fx + fy);
      if (__builtin_add_overflow(x, y, &r)) in.fail("integer overflow");
      return Value(r);
    }
    if (op == "-") {
      if (!ints) return Value(fx - fy);
      if (__builtin_sub_overflow(x, y, &r)) in.fail("integer overflow");
      return Value(r);
    }
    if (op == "*") {
      if (!ints) return Value(fx * fy);
      if (__builtin_mul_overflow(x, y, &r)) in.fail("integer overflow");
      return Value(r);
    }
    if (op == "/") {
      if (fy == 0) in.fail("division by zero");
      return Value(fx / fy);
    }
    if (op == "//" || op == "%") {
      if (ints ? y == 0 : fy == 0)
        in.fail(op == "%" ? "modulo by zero" : "integer division or modulo by zero");
      if (ints) {
        if (x == INT64_MIN && y == -1) in.fail("integer overflow");
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        return op == "//" ? Value(q) : Value(m);
      }
      const double q = std::floor(fx / fy);
      if (op == "//") return Value(q);
      double m = std::fmod(fx, fy);
      if (m != 0 && ((m < 0) != (fy < 0))) m += fy;
      return Value(m);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t result = 1;
        for (int64_t i = 0; i < y; ++i) {
          if (__builtin_mul_overflow(result, x, &result)) in.fail("integer overflow");
          if (result == 0 || result == 1) break;
          if (result == -1) {
            result = (y - i - 1) % 2 == 0 ? -1 : 1;
            break;
          }
        }
        return Value(result);
      }
      return Value(std::pow(fx, fy));
    }
    return unsupported();
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      if (a.as_string().size() + b.as_string().size() > in.limits().max_output_bytes)
        in.fail("a string is too long");
      in.step(1);
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      List out = a.as_list();
      out.insert(out.end(), b.as_list().begin(), b.as_list().end());
      in.step(out.size());
      return a.is_tuple() ? Value::tuple(std::move(out)) : Value(std::move(out));
    }
    return unsupported();
  }
  if (op == "*") {
    const Value& seq = a.is_number() ? b : a;
    const Value& count = a.is_number() ? a : b;
    if ((seq.is_string() || seq.is_list()) && (count.is_int() || count.is_bool())) {
      const int64_t n = std::max<int64_t>(count.as_int(), 0);
      const std::size_t unit = seq.is_string() ? seq.as_string().size() : seq.as_list().size();
      if (unit > 0 && static_cast<uint64_t>(n) > in.limits().max_output_bytes / unit)
        in.fail("a repeated sequence is too long");
      in.step(static_cast<uint64_t>(n) * (seq.is_list() ? unit : 1));
      if (seq.is_string()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq.as_string();
        return Value(std::move(out));
      }
      List out;
      for (int64_t i = 0; i < n; ++i)
        out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
      return Value(std::move(out));
    }
    return unsupported();
  }
  if (op == "%" && a.is_string()) in.fail("printf-style string formatting is not supported");
  return unsupported();
}

bool compare_op(Interpreter& in, const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return equals(a, b);
  if (op == "!=") return !equals(a, b);
  if (op == "<") return less(in, a, b);
  if (op == ">") return less(in, b, a);
  if (op == "<=") return !less(in, b, a);
  if (op == ">=") return !less(in, a, b);
  if (op == "in") return contains(in, b, a);
  if (op == "not in") return !contains(in, b, a);
  in.fail("unknown comparison " + op);
}

void add_globals(Frame& frame) {
  frame.vars["range"] = method("range", [](Interpreter& in, CallArgs& a) {
    std::vector<int64_t> n;
    for (const Value& v : a.positional) {
      if (!v.is_int() && !v.is_bool()) in.fail("range() takes integers");
      n.push_back(v.as_int());
    }
    if (n.empty() || n.size() > 3) in.fail("range() takes 1 to 3 integers");
    const int64_t start = n.size() == 1 ? 0 : n[0], stop = n.size() == 1 ? n[0] : n[1];
    const int64_t step = n.size() == 3 ? n[2] : 1;
    if (step == 0) in.fail("range() arg 3 must not be zero");
    const long double count = step > 0 ? std::ceil(static_cast<long double>(stop - start) / step)
                                       : std::ceil(static_cast<long double>(start - stop) / -step);
    if (count > kMaxRange) {
      in.fail("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    }
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.emplace_back(i);
    in.step(out.size());
    return Value(std::move(out));
  });
  frame.vars["namespace"] = method("namespace", [](Interpreter& in, CallArgs& a) {
    auto d = std::make_shared<Dict>();
    for (const Value& v : a.positional) {
      if (!v.is_dict()) in.fail("namespace() takes keyword arguments or a dict");
      for (const auto& [k, x] : v.as_dict().items()) d->set(k, x);
    }
    for (const auto& [k, v] : a.keyword) d->set(Value(k), v);
    in.track_namespace(d);
    return Value::namespace_(d);
  });
  frame.vars["dict"] = method("dict", [](Interpreter& in, CallArgs& a) {
    auto d = std::make_shared<Dict>();
    for (const Value& v : a.positional) {
      if (!v.is_dict()) in.fail("dict() takes keyword arguments or a dict");
      for (const auto& [k, x] : v.as_dict().items()) d->set(k, x);
    }
    for (const auto& [k, v] : a.keyword) d->set(Value(k), v);
    return Value::dict(d);
  });
  frame.vars["raise_exception"] =
      method("raise_exception", [](Interpreter& in, CallArgs& a) -> Value {
        throw RaisedError(a.positional.empty() ? std::string() : a.positional[0].str(),
                          in.location());
      });
  frame.vars["strftime_now"] = method("strftime_now", [](Interpreter& in, CallArgs& a) {
    const Value* format = arg(a, 0, "format");
    if (format == nullptr || !format->is_string()) in.fail("strftime_now() takes a format string");
    if (format->as_string().size() > 256) in.fail("strftime_now() format too long");
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    char buf[1024];
    const std::size_t n = std::strftime(buf, sizeof buf, format->as_string().c_str(), &local);
    return Value(std::string(buf, n));
  });
}

Value filter_builtin(Interpreter& in, const std::string& name, const Value& input, CallArgs& args) {
  const Value& v = input;
  if (name == "default" || name == "d") {
    const Value* fallback = arg(args, 0, "default_value");
    const bool boolean = bool_arg(args, 1, "boolean", false);
    if (v.is_undefined() || (boolean && !v.truthy())) return fallback ? *fallback : Value("");
    return v;
  }
  if (name == "safe") return v.is_undefined() ? Value("") : v;
  if (name == "string") return Value(v.str());
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value(length_of(v.as_string()));
    if (v.is_list()) return Value(static_cast<int64_t>(v.as_list().size()));
    if (v.is_mapping()) return Value(static_cast<int64_t>(v.as_dict().size()));
    if (v.is_undefined()) return Value(0);
    in.fail(std::string("object of type '") + v.type_name() + "' has no len()");
  }
  if (name == "tojson") {
    const Value* indent = arg(args, 0, "indent");
    const Value* sort = args.find("sort_keys");
    int width = -1;
    if (indent != nullptr && !indent->is_none()) {
      if (!indent->is_int() || indent->as_int() < 0 || indent->as_int() > 64)
        in.fail("tojson indent must be an integer from 0 to 64");
      width = static_cast<int>(indent->as_int());
    }
    if (args.find("separators") != nullptr && !args.find("separators")->is_none())
      in.fail("tojson separators are not supported");
    return Value(to_json(v, width, sort != nullptr && sort->truthy()));
  }
  if (name == "trim") return Value(strip(v.str(), arg(args, 0, "chars"), true, true));
  if (name == "upper") return Value(ascii_map(v.str(), [](int c) { return std::toupper(c); }));
  if (name == "lower") return Value(ascii_map(v.str(), [](int c) { return std::tolower(c); }));
  if (name == "capitalize") return Value(capitalize(v.str()));
  if (name == "title") return Value(title(v.str()));
  if (name == "e" || name == "escape") return Value(html_escape(v.str()));
  if (name == "replace") {
    const Value* from = arg(args, 0, "old");
    const Value* to = arg(args, 1, "new");
    if (from == nullptr || to == nullptr) in.fail("replace needs two arguments");
    return Value(
        replace_all(in, v.str(), from->str(), to->str(), int_arg(in, args, 2, "count", -1)));
  }
  if (name == "list") return Value(iterate(in, v));
  if (name == "first" || name == "last") {
    const List items = iterate(in, v);
    if (items.empty()) return Value::undefined("no " + name + " item, sequence was empty");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (v.is_string()) {
      auto cs = chars_of(v.as_string());
      std::string out;
      for (auto it = cs.rbegin(); it != cs.rend(); ++it) out += *it;
      return Value(std::move(out));
    }
    List items = iterate(in, v);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (name == "join") {
    const Value* sep = arg(args, 0, "d");
    const Value* attribute = arg(args, 1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(in, v)) {
      if (!first && sep) out += sep->str();
      first = false;
      out += attribute ? get_attribute(in, item, attribute->str()).str() : item.str();
      if (out.size() > in.limits().max_output_bytes) in.fail("join result too long");
    }
    return Value(std::move(out));
  }
  if (name == "map") {
    List out;
    const Value* attribute = args.find("attribute");
    for (const Value& item : iterate(in, v)) {
      in.step();
      if (attribute) {
        Value got = get_attribute(in, item, attribute->str());
        if (got.is_undefined() && args.find("default")) got = *args.find("default");
        out.push_back(got);
      } else {
        if (args.positional.empty()) in.fail("map needs a filter name or attribute=");
        CallArgs rest;
        rest.positional.assign(args.positional.begin() + 1, args.positional.end());
        rest.keyword = args.keyword;
        out.push_back(in.apply_filter(args.positional[0].str(), item, rest));
      }
    }
    return Value(std::move(out));
  }
  if (name == "select") return map_like(in, v, args, true, false, true);
  if (name == "reject") return map_like(in, v, args, false, false, true);
  if (name == "selectattr") return map_like(in, v, args, true, true, true);
  if (name == "rejectattr") return map_like(in, v, args, false, true, true);
  if (name == "items") {
    if (v.is_undefined()) return Value(List{});
    if (!v.is_dict()) in.fail("items filter needs a mapping");
    List out;
    for (const auto& [k, x] : v.as_dict().items()) out.push_back(Value::tuple(List{k, x}));
    in.step(out.size());
    return Value(std::move(out));
  }
  if (name == "dictsort") {
    if (!v.is_dict()) in.fail("dictsort needs a mapping");
    const bool case_sensitive = bool_arg(args, 0, "case_sensitive", false);
    const Value* by = arg(args, 1, "by");
    const bool by_value = by && by->str() == "value";
    const bool reverse = bool_arg(args, 2, "reverse", false);
    List out;
    for (const auto& [k, x] : v.as_dict().items()) out.push_back(Value::tuple(List{k, x}));
    auto key = [&](const Value& pair) {
      Value k = pair.as_list()[by_value ? 1 : 0];
      if (!case_sensitive && k.is_string())
        k = Value(ascii_map(k.as_string(), [](int c) { return std::tolower(c); }));
      return k;
    };
    std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
      return reverse ? less(in, key(y), key(x)) : less(in, key(x), key(y));
    });
    return Value(std::move(out));
  }
  if (name == "sort") {
    const bool reverse = bool_arg(args, 0, "reverse", false);
    const bool case_sensitive = bool_arg(args, 1, "case_sensitive", false);
    const Value* attribute = arg(args, 2, "attribute");
    List items = iterate(in, v);
    auto key = [&](const Value& item) {
      Value k = attribute ? get_attribute(in, item, attribute->str()) : item;
      if (!case_sensitive && k.is_string())
        k = Value(ascii_map(k.as_string(), [](int c) { return std::tolower(c); }));
      return k;
    };
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      return reverse ? less(in, key(y), key(x)) : less(in, key(x), key(y));
    });
    return Value(std::move(items));
  }
  if (name == "unique") {
    List out;
    for (const Value& item : iterate(in, v)) {
      bool seen = false;
      for (const Value& o : out) {
        in.step();
        if (equals(o, item) ||
            (o.is_string() && item.is_string() &&
             ascii_map(o.as_string(), [](int c) { return std::tolower(c); }) ==
                 ascii_map(item.as_string(), [](int c) { return std::tolower(c); }))) {
          seen = true;
          break;
        }
      }
      if (!seen) out.push_back(item);
    }
    return Value(std::move(out));
  }
  if (name == "min" || name == "max") {
    const List items = iterate(in, v);
    if (items.empty()) return Value::undefined("no " + name + " item, sequence was empty");
    Value best = items[0];
    for (const Value& item : items) {
      if (name == "min" ? less(in, item, best) : less(in, best, item)) best = item;
    }
    return best;
  }
  if (name == "sum") {
    Value total = args.find("start") ? *args.find("start") : Value(0);
    for (const Value& item : iterate(in, v)) total = binary_op(in, "+", total, item);
    return total;
  }
  if (name == "abs") {
    if (v.is_float()) return Value(std::fabs(v.as_float()));
    if (v.is_int() || v.is_bool()) {
      if (v.as_int() == INT64_MIN) in.fail("integer overflow");
      return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
    }
    in.fail(std::string("bad operand type for abs(): '") + v.type_name() + "'");
  }
  if (name == "round") {
    if (!v.is_number()) in.fail("round needs a number");
    const Value* method_arg = arg(args, 1, "method");
    return round_value(v.as_float(), int_arg(in, args, 0, "precision", 0),
                       method_arg ? method_arg->str() : "common");
  }
  if (name == "int") {
    const int64_t fallback = int_arg(in, args, 0, "default", 0);
    if (v.is_int() || v.is_bool()) return Value(v.as_int());
    if (v.is_float()) {
      if (!std::isfinite(v.as_float()) || std::fabs(v.as_float()) > 9.2e18) return Value(fallback);
      return Value(static_cast<int64_t>(v.as_float()));
    }
    if (v.is_string()) {
      const std::string s = strip(v.as_string(), nullptr, true, true);
      char* end = nullptr;
      errno = 0;
      const long long x = std::strtoll(s.c_str(), &end, 10);
      if (!s.empty() && end == s.c_str() + s.size() && errno == 0)
        return Value(static_cast<int64_t>(x));
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(d) && std::fabs(d) < 9.2e18) {
        return Value(static_cast<int64_t>(d));
      }
    }
    return Value(fallback);
  }
  if (name == "float") {
    const Value* fallback = arg(args, 0, "default");
    if (v.is_number()) return Value(v.as_float());
    if (v.is_string()) {
      const std::string s = strip(v.as_string(), nullptr, true, true);
      char* end = nullptr;
      const double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size()) return Value(d);
    }
    return fallback ? Value(fallback->as_float()) : Value(0.0);
  }
  if (name == "indent") {
    const Value* width = arg(args, 0, "width");
    const std::string pad =
        width == nullptr ? std::string(4, ' ')
        : width->is_string()
            ? width->as_string()
            : std::string(static_cast<std::size_t>(std::clamp<int64_t>(width->as_int(), 0, 1024)),
                          ' ');
    const bool first = bool_arg(args, 1, "first", false);
    const bool blank = bool_arg(args, 2, "blank", false);
    std::string s = v.str() + "\n";
    CallArgs none;
    const Value lines_value = get_attribute(in, Value(s), "splitlines").function()(in, none);
    const List& lines = lines_value.as_list();
    std::string out;
    for (std::size_t i = 0; i < lines.size(); ++i) {
      const std::string& line = lines[i].as_string();
      if (i > 0) out += "\n";
      if (i > 0 && (blank || !line.empty())) out += pad;
      out += line;
      if (out.size() > in.limits().max_output_bytes) in.fail("indent result too long");
    }
    if (first) out = pad + out;
    return Value(std::move(out));
  }
  if (name == "wordcount") return Value(static_cast<int64_t>(split(v.str(), nullptr, -1).size()));
  if (name == "attr") {
    const Value* a = arg(args, 0, "name");
    if (a == nullptr) in.fail("attr needs a name");
    return get_attribute(in, v, a->str());
  }
  in.fail("no filter named '" + name + "'");
}

bool test_builtin(Interpreter& in, const std::string& name, const Value& v, CallArgs& args) {
  const Value* other = arg(args, 0, "other");
  auto need = [&]() -> const Value& {
    if (other == nullptr) in.fail("test '" + name + "' needs an argument");
    return *other;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return false;
  if (name == "lower")
    return v.is_string() &&
           v.as_string() == ascii_map(v.as_string(), [](int c) { return std::tolower(c); });
  if (name == "upper")
    return v.is_string() &&
           v.as_string() == ascii_map(v.as_string(), [](int c) { return std::toupper(c); });
  if (name == "odd" || name == "even") {
    if (!v.is_int() && !v.is_bool()) in.fail("test '" + name + "' needs an integer");
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const Value& d = need();
    if (!v.is_int() || !d.is_int() || d.as_int() == 0)
      in.fail("divisibleby needs nonzero integers");
    return v.as_int() % d.as_int() == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, need());
  if (name == "ne" || name == "!=") return !equals(v, need());
  if (name == "lt" || name == "lessthan" || name == "<") return less(in, v, need());
  if (name == "gt" || name == "greaterthan" || name == ">") return less(in, need(), v);
  if (name == "le" || name == "<=") return !less(in, need(), v);
  if (name == "ge" || name == ">=") return !less(in, v, need());
  if (name == "in") return contains(in, need(), v);
  if (name == "sameas") {
    const Value& o = need();
    if (v.is_none() || v.is_bool() || v.is_undefined()) return v.type() == o.type() && equals(v, o);
    if (v.is_list()) return o.is_list() && v.list_ptr() == o.list_ptr();
    if (v.is_mapping()) return o.is_mapping() && v.dict_ptr() == o.dict_ptr();
    return false;
  }
  in.fail("no test named '" + name + "'");
}

}  // namespace promptcache::jinja
