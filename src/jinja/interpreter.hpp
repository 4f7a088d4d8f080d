// src/jinja/interpreter.hpp — the tree walker that renders a parsed template, and the builtins
// (filters, tests, methods, globals) it calls (private to the jinja unit).
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ast.hpp"

namespace promptcache::jinja {

// One scope: the template's top level, a loop body, a macro call.
struct Frame {
  std::unordered_map<std::string, Value> vars;
  const Frame* parent = nullptr;
  const Value* find(const std::string& name) const {
    for (const Frame* f = this; f != nullptr; f = f->parent) {
      auto it = f->vars.find(name);
      if (it != f->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

class Interpreter {
 public:
  Interpreter(const std::string& origin, const Limits& limits) : origin_(origin), limits_(limits) {}

  std::string render(const Node& root, const std::vector<std::pair<std::string, Value>>& variables);

  // For the builtins.
  [[noreturn]] void fail(const std::string& message) const;
  SourceLocation location() const;
  // Counts work (loop iterations, items built) against Limits::max_steps.
  void step(std::uint64_t n = 1);
  Value call(const Value& callee, CallArgs& args);
  // namespace() objects made during this render, emptied when it ends (see Dict::clear).
  void track_namespace(const std::shared_ptr<Dict>& ns) { namespaces_.push_back(ns); }
  Value apply_filter(const std::string& name, const Value& input, CallArgs& args);
  bool apply_test(const std::string& name, const Value& input, CallArgs& args);
  const Limits& limits() const { return limits_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  Flow exec(const std::vector<NodePtr>& body, Frame& frame);
  Flow exec(const Node& node, Frame& frame);
  void exec_for(const Node& node, Frame& frame, Flow& flow);
  void assign(const Node& node, Frame& frame, Value value);
  std::string capture(const std::vector<NodePtr>& body, Frame& frame);
  Value eval(const Node& node, Frame& frame);
  Value eval_call(const Node& node, Frame& frame);
  Value eval_filter(const Node& node, Frame& frame, const Value* input);
  CallArgs arguments(const Node& node, Frame& frame);
  Value make_macro(const Node& node, const Frame& frame);
  std::shared_ptr<const Frame> snapshot(const Frame& frame) const;
  void write(const std::string& text);

  const std::string& origin_;
  const Limits& limits_;
  const Node* at_ = nullptr;  // the node being evaluated, for error locations
  std::string out_;
  std::uint64_t steps_ = 0;
  int call_depth_ = 0;
  Frame* root_ = nullptr;
  std::vector<std::weak_ptr<Dict>> namespaces_;
};

// builtins.cpp
Value get_attribute(Interpreter& in, const Value& object, const std::string& name);
Value get_item(Interpreter& in, const Value& object, const Value& key);
Value slice(Interpreter& in, const Value& object, const Value& start, const Value& stop,
            const Value& step);
Value binary_op(Interpreter& in, const std::string& op, const Value& a, const Value& b);
bool compare_op(Interpreter& in, const std::string& op, const Value& a, const Value& b);
// The items a `for` iterates (a dict's keys, a string's characters); Error if not iterable.
List iterate(Interpreter& in, const Value& v);
void add_globals(Frame& frame);
Value filter_builtin(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);
bool test_builtin(Interpreter& in, const std::string& name, const Value& input, CallArgs& args);

}  // namespace promptcache::jinja
