// promptcache/jinja/value.hpp — the values a Jinja chat template computes with.
//
// Python's types as templates see them: undefined, none, bool, int, float, string, list, dict
// (insertion order kept), a callable (macro or builtin) and a namespace (namespace() objects,
// the one thing a template may mutate). Lists, dicts and namespaces are shared by reference as in
// Python; the interpreter never mutates a list or dict (HF renders in an immutable sandbox), only
// namespaces. No LibTorch.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "promptcache/error.hpp"

namespace promptcache::jinja {

// The kind of every template error: a chat template is the model's prompt format. (A kind of
// its own would change promptcache/error.hpp, which every unit includes.)
constexpr ErrorKind kTemplateError = ErrorKind::kPrompt;

class Value;
class Interpreter;

// Arguments of a call: positional, then keyword in the order written.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
  const Value* find(const std::string& name) const;
};

using Builtin = std::function<Value(Interpreter&, CallArgs&)>;

class Dict;
using List = std::vector<Value>;

class Value {
 public:
  enum class Type {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kCallable,
    kNamespace
  };

  Value() = default;  // undefined
  static Value undefined(std::string hint = {}) {
    Value v;
    v.str_ = std::make_shared<const std::string>(std::move(hint));
    return v;
  }
  static Value none() { return Value(Type::kNone); }
  Value(bool b) : type_(Type::kBool), int_(b ? 1 : 0) {}
  Value(int i) : type_(Type::kInt), int_(i) {}
  Value(int64_t i) : type_(Type::kInt), int_(i) {}
  Value(double d) : type_(Type::kFloat), float_(d) {}
  Value(std::string s)
      : type_(Type::kString), str_(std::make_shared<const std::string>(std::move(s))) {}
  Value(const char* s) : Value(std::string(s)) {}
  // Error(kTemplateError) when the list would nest more than kMaxValueDepth levels.
  Value(List l);
  // A tuple: a list that prints as (a, b), is never equal to a list, and tojson writes as a list.
  static Value tuple(List l) {
    Value v(std::move(l));
    v.int_ = 1;
    return v;
  }
  static Value dict(std::shared_ptr<Dict> d);
  static Value namespace_(std::shared_ptr<Dict> d);
  static Value callable(std::string name, Builtin fn);

  Type type() const { return type_; }
  bool is_undefined() const { return type_ == Type::kUndefined; }
  bool is_none() const { return type_ == Type::kNone; }
  bool is_bool() const { return type_ == Type::kBool; }
  bool is_int() const { return type_ == Type::kInt; }
  bool is_float() const { return type_ == Type::kFloat; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return type_ == Type::kString; }
  bool is_list() const { return type_ == Type::kList; }
  bool is_tuple() const { return type_ == Type::kList && int_ == 1; }
  bool is_dict() const { return type_ == Type::kDict; }
  bool is_namespace() const { return type_ == Type::kNamespace; }
  bool is_mapping() const { return is_dict() || is_namespace(); }
  bool is_callable() const { return type_ == Type::kCallable; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }
  double as_float() const { return is_float() ? float_ : static_cast<double>(int_); }
  const std::string& as_string() const { return *str_; }
  const List& as_list() const { return *list_; }
  const Dict& as_dict() const { return *dict_; }
  Dict& mutable_namespace() const { return *dict_; }
  const std::shared_ptr<Dict>& dict_ptr() const { return dict_; }
  const std::shared_ptr<const List>& list_ptr() const { return list_; }
  const Builtin& function() const { return *fn_; }
  // The callable's name, or the name an undefined value was looked up by.
  const std::string& name() const;

  // Levels of lists, dicts and namespaces inside this value (0 for a scalar).
  int depth() const;

  // Python truthiness.
  bool truthy() const;
  // Python str(): what {{ value }} prints (undefined prints nothing). Error past depth limits.
  std::string str() const;
  // Python repr() (lists and dicts print their items so).
  std::string repr() const;
  // The type's Python name, for error messages ("str", "list", "NoneType", ...).
  const char* type_name() const;

 private:
  explicit Value(Type t) : type_(t) {}
  Type type_ = Type::kUndefined;
  int64_t int_ = 0;
  double float_ = 0;
  std::shared_ptr<const std::string> str_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Builtin> fn_;
  int depth_ = 0;  // lists
};

// How deep values may nest: past it, building one is an error (destroying or printing a deeper
// one would recurse past the stack).
constexpr int kMaxValueDepth = 256;

// A dict (or a namespace's attributes): insertion order, keys are hashable values (strings,
// numbers, bools, none), looked up in constant time.
class Dict {
 public:
  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const { return find(Value(key)); }
  // Error(kTemplateError) when the value would make the dict nest too deeply.
  void set(const Value& key, Value value);
  std::size_t size() const { return items_.size(); }
  int depth() const { return depth_; }
  // Empties the dict: how a render breaks the reference cycles a namespace can form
  // ({% set ns.self = [ns] %}), which shared ownership alone would never free.
  void clear() {
    items_.clear();
    index_.clear();
    depth_ = 1;
  }
  const std::vector<std::pair<Value, Value>>& items() const { return items_; }

 private:
  std::vector<std::pair<Value, Value>> items_;
  std::unordered_map<std::string, std::size_t> index_;
  int depth_ = 1;
};

// Python ==. Lists and dicts compare item by item; 1 == 1.0 == True.
bool equals(const Value& a, const Value& b);
// Python json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=sort_keys); indent < 0
// means None (", " and ": " separators). Undefined and callables are an error.
std::string to_json(const Value& value, int indent = -1, bool sort_keys = false);
// Python repr() of a float ("1.0", "1e+16", "0.1").
std::string float_repr(double d);

}  // namespace promptcache::jinja
