// Jinja values: Python's truthiness, str(), repr(), == and json.dumps, as chat templates see them.
#include "promptcache/jinja/value.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "promptcache/error.hpp"

namespace promptcache::jinja {
namespace {

// Nested lists and dicts (or a namespace holding itself) printed or serialized deeper than this
// are an error, not a stack overflow.
constexpr int kMaxPrintDepth = kMaxValueDepth + 1;

[[noreturn]] void fail(const std::string& message) {
  throw Error(kTemplateError, message);
}

// A key's identity for hashing: Python's 1 == 1.0 == True hash alike.
std::string key_of(const Value& key) {
  switch (key.type()) {
    case Value::Type::kString:
      return "s" + key.as_string();
    case Value::Type::kBool:
    case Value::Type::kInt:
      return "n" + std::to_string(key.as_int());
    case Value::Type::kFloat: {
      const double d = key.as_float();
      if (std::floor(d) == d && std::fabs(d) < 9.2e18) {
        return "n" + std::to_string(static_cast<int64_t>(d));
      }
      return "f" + float_repr(d);
    }
    case Value::Type::kNone:
      return "0";
    default:
      fail(std::string("unhashable type: '") + key.type_name() + "'");
  }
}

void append_repr_string(std::string& out, const std::string& s) {
  // Python picks single quotes unless the text has one and no double quote.
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out += quote;
  for (unsigned char c : s) {
    if (c == static_cast<unsigned char>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
}

void append_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);  // ensure_ascii=False: UTF-8 as is
        }
    }
  }
  out += '"';
}

void append_repr(std::string& out, const Value& v, int depth) {
  if (depth > kMaxPrintDepth) fail("a value nested too deeply to print");
  switch (v.type()) {
    case Value::Type::kString:
      append_repr_string(out, v.as_string());
      return;
    case Value::Type::kList: {
      out += v.is_tuple() ? '(' : '[';
      bool first = true;
      for (const Value& item : v.as_list()) {
        if (!first) out += ", ";
        first = false;
        append_repr(out, item, depth + 1);
      }
      if (v.is_tuple() && v.as_list().size() == 1) out += ',';
      out += v.is_tuple() ? ')' : ']';
      return;
    }
    case Value::Type::kDict: {
      out += '{';
      bool first = true;
      for (const auto& [key, item] : v.as_dict().items()) {
        if (!first) out += ", ";
        first = false;
        append_repr(out, key, depth + 1);
        out += ": ";
        append_repr(out, item, depth + 1);
      }
      out += '}';
      return;
    }
    default:
      out += v.str();
  }
}

void append_json(std::string& out, const Value& v, int indent, bool sort_keys, int depth) {
  if (depth > kMaxPrintDepth) fail("a value nested too deeply for tojson");
  auto newline = [&](int level) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<std::size_t>(indent) * level, ' ');
  };
  const char* item_sep = indent < 0 ? ", " : ",";
  switch (v.type()) {
    case Value::Type::kNone:
      out += "null";
      return;
    case Value::Type::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Type::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Type::kFloat: {
      const double d = v.as_float();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        out += float_repr(d);
      }
      return;
    }
    case Value::Type::kString:
      append_json_string(out, v.as_string());
      return;
    case Value::Type::kList: {
      const List& list = v.as_list();
      if (list.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t i = 0; i < list.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        append_json(out, list[i], indent, sort_keys, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::Type::kDict:
    case Value::Type::kNamespace: {
      if (v.is_namespace()) fail("Object of type Namespace is not JSON serializable");
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& item : v.as_dict().items()) items.push_back(&item);
      if (items.empty()) {
        out += "{}";
        return;
      }
      auto json_key = [](const Value& k) {
        if (k.is_string()) return k.as_string();
        if (k.is_none()) return std::string("null");
        if (k.is_bool()) return std::string(k.as_bool() ? "true" : "false");
        if (k.is_int()) return std::to_string(k.as_int());
        return float_repr(k.as_float());
      };
      if (sort_keys) {
        std::stable_sort(items.begin(), items.end(),
                         [&](auto* a, auto* b) { return json_key(a->first) < json_key(b->first); });
      }
      out += '{';
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        append_json_string(out, json_key(items[i]->first));
        out += ": ";
        append_json(out, items[i]->second, indent, sort_keys, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    case Value::Type::kUndefined:
      fail("Object of type Undefined is not JSON serializable");
    case Value::Type::kCallable:
      fail("Object of type function is not JSON serializable");
  }
}

}  // namespace

const Value* CallArgs::find(const std::string& name) const {
  for (const auto& [key, value] : keyword) {
    if (key == name) return &value;
  }
  return nullptr;
}

Value::Value(List l) : type_(Type::kList) {
  int deepest = 0;
  for (const Value& item : l) deepest = std::max(deepest, item.depth());
  depth_ = deepest + 1;
  if (depth_ > kMaxValueDepth) {
    fail("lists and dicts nested more than " + std::to_string(kMaxValueDepth) + " levels deep");
  }
  list_ = std::make_shared<const List>(std::move(l));
}

int Value::depth() const {
  if (is_list()) return depth_;
  if (is_mapping()) return dict_->depth();
  return 0;
}

Value Value::dict(std::shared_ptr<Dict> d) {
  Value v(Type::kDict);
  v.dict_ = std::move(d);
  return v;
}

Value Value::namespace_(std::shared_ptr<Dict> d) {
  Value v(Type::kNamespace);
  v.dict_ = std::move(d);
  return v;
}

Value Value::callable(std::string name, Builtin fn) {
  Value v(Type::kCallable);
  v.str_ = std::make_shared<const std::string>(std::move(name));
  v.fn_ = std::make_shared<const Builtin>(std::move(fn));
  return v;
}

const std::string& Value::name() const {
  static const std::string empty;
  return (is_callable() || is_undefined()) && str_ ? *str_ : empty;
}

bool Value::truthy() const {
  switch (type_) {
    case Type::kUndefined:
    case Type::kNone:
      return false;
    case Type::kBool:
    case Type::kInt:
      return int_ != 0;
    case Type::kFloat:
      return float_ != 0.0;
    case Type::kString:
      return !str_->empty();
    case Type::kList:
      return !list_->empty();
    case Type::kDict:
      return dict_->size() > 0;
    default:
      return true;
  }
}

std::string Value::str() const {
  switch (type_) {
    case Type::kUndefined:
      return "";
    case Type::kNone:
      return "None";
    case Type::kBool:
      return int_ ? "True" : "False";
    case Type::kInt:
      return std::to_string(int_);
    case Type::kFloat:
      return float_repr(float_);
    case Type::kString:
      return *str_;
    case Type::kList:
    case Type::kDict: {
      std::string out;
      append_repr(out, *this, 0);
      return out;
    }
    case Type::kCallable:
      return "<function " + *str_ + ">";
    case Type::kNamespace:
      return "<Namespace>";
  }
  return "";
}

std::string Value::repr() const {
  std::string out;
  append_repr(out, *this, 0);
  return out;
}

const char* Value::type_name() const {
  switch (type_) {
    case Type::kUndefined:
      return "Undefined";
    case Type::kNone:
      return "NoneType";
    case Type::kBool:
      return "bool";
    case Type::kInt:
      return "int";
    case Type::kFloat:
      return "float";
    case Type::kString:
      return "str";
    case Type::kList:
      return is_tuple() ? "tuple" : "list";
    case Type::kDict:
      return "dict";
    case Type::kCallable:
      return "function";
    case Type::kNamespace:
      return "Namespace";
  }
  return "object";
}

const Value* Dict::find(const Value& key) const {
  auto it = index_.find(key_of(key));
  return it == index_.end() ? nullptr : &items_[it->second].second;
}

void Dict::set(const Value& key, Value value) {
  const int depth = value.depth() + 1;
  if (depth > kMaxValueDepth) {
    fail("lists and dicts nested more than " + std::to_string(kMaxValueDepth) + " levels deep");
  }
  depth_ = std::max(depth_, depth);
  auto [it, inserted] = index_.emplace(key_of(key), items_.size());
  if (inserted) {
    items_.emplace_back(key, std::move(value));
  } else {
    items_[it->second].second = std::move(value);
  }
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return true;
    case Value::Type::kString:
      return a.as_string() == b.as_string();
    case Value::Type::kList: {
      if (a.is_tuple() != b.is_tuple()) return false;
      const List &x = a.as_list(), &y = b.as_list();
      if (x.size() != y.size()) return false;
      for (std::size_t i = 0; i < x.size(); ++i) {
        if (!equals(x[i], y[i])) return false;
      }
      return true;
    }
    case Value::Type::kDict: {
      const Dict &x = a.as_dict(), &y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto& [key, value] : x.items()) {
        const Value* other = y.find(key);
        if (other == nullptr || !equals(value, *other)) return false;
      }
      return true;
    }
    default:
      return a.dict_ptr() == b.dict_ptr() && &a.function() == &b.function();
  }
}

std::string to_json(const Value& value, int indent, bool sort_keys) {
  std::string out;
  append_json(out, value, indent, sort_keys, 0);
  return out;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // The shortest digits that read back as d (Python's repr), then Python's layout of them.
  char buf[40];
  int precision = 1;
  for (; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*e", precision - 1, d);
    if (std::strtod(buf, nullptr) == d) break;
  }
  // buf: [-]D.DDDDe[+-]XX
  std::string s(buf);
  const bool negative = s[0] == '-';
  if (negative) s.erase(0, 1);
  const std::size_t e = s.find('e');
  const int exponent = std::atoi(s.c_str() + e + 1);
  std::string digits = s.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exponent < -4 || exponent >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp[16];
    std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += exp;
  } else if (exponent < 0) {
    out = "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
  } else {
    const std::size_t int_digits = static_cast<std::size_t>(exponent) + 1;
    if (digits.size() <= int_digits) {
      out = digits + std::string(int_digits - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, int_digits) + "." + digits.substr(int_digits);
    }
  }
  return negative ? "-" + out : out;
}

}  // namespace promptcache::jinja
