// The Jinja interpreter: walks the syntax tree with Python's semantics and Jinja's scoping (a loop
// body and a macro call are scopes; an if block is not), counting work, output and macro depth
// against the template's Limits.
#include "interpreter.hpp"

#include <algorithm>

namespace promptcache::jinja {
namespace {

// Sets the node errors point at while it is evaluated.
class At {
 public:
  At(const Node*& slot, const Node& node) : slot_(slot), saved_(slot) { slot = &node; }
  ~At() { slot_ = saved_; }

 private:
  const Node*& slot_;
  const Node* saved_;
};

std::string describe(const Node& n) {
  switch (n.kind) {
    case Node::Kind::kFilter:
      return "filter '" + n.name + "'";
    case Node::Kind::kTest:
      return "test '" + n.name + "'";
    case Node::Kind::kName:
      return "'" + n.name + "'";
    case Node::Kind::kAttr:
      return "attribute '" + n.name + "'";
    case Node::Kind::kCall:
      return n.a && (n.a->kind == Node::Kind::kName || n.a->kind == Node::Kind::kAttr)
                 ? "call of '" + n.a->name + "'"
                 : "call";
    case Node::Kind::kFor:
      return "{% for %}";
    case Node::Kind::kIf:
      return "{% if %}";
    case Node::Kind::kSet:
    case Node::Kind::kSetBlock:
      return "{% set %}";
    case Node::Kind::kMacro:
      return "{% macro " + n.name + " %}";
    case Node::Kind::kCallBlock:
      return "{% call %}";
    case Node::Kind::kOutput:
      return "{{ }}";
    case Node::Kind::kBinary:
      return "operator '" + n.name + "'";
    default:
      return "";
  }
}

}  // namespace

SourceLocation Interpreter::location() const {
  if (at_ == nullptr) return {origin_};
  return {origin_, static_cast<std::size_t>(at_->line), static_cast<std::size_t>(at_->column),
          describe(*at_)};
}

void Interpreter::fail(const std::string& message) const {
  throw Error(kTemplateError, message, location());
}

void Interpreter::step(std::uint64_t n) {
  steps_ += n;
  if (steps_ > limits_.max_steps) {
    fail("the template does more than " + std::to_string(limits_.max_steps) +
         " steps of work (loop iterations and items built): stopped");
  }
}

void Interpreter::write(const std::string& text) {
  if (out_.size() + text.size() > limits_.max_output_bytes) {
    fail("the rendered text exceeds " + std::to_string(limits_.max_output_bytes) + " bytes");
  }
  out_ += text;
}

std::string Interpreter::render(const Node& root,
                                const std::vector<std::pair<std::string, Value>>& variables) {
  Frame globals;
  add_globals(globals);
  Frame top;
  top.parent = &globals;
  for (const auto& [name, value] : variables) top.vars[name] = value;
  root_ = &top;
  // Nothing of a render outlives it but its text: emptying its namespaces on every way out frees
  // any cycle they formed (a namespace that holds itself, directly or through a list or macro).
  struct BreakCycles {
    std::vector<std::weak_ptr<Dict>>& namespaces;
    ~BreakCycles() {
      for (const auto& weak : namespaces) {
        if (const auto ns = weak.lock()) ns->clear();
      }
      namespaces.clear();
    }
  } break_cycles{namespaces_};
  try {
    exec(root.body, top);
  } catch (const RaisedError&) {
    throw;
  } catch (const Error& e) {
    // Errors from the value layer carry no place: give them the node being evaluated.
    if (!e.where().file.empty()) throw;
    throw Error(e.kind(), e.message(), location());
  }
  return std::move(out_);
}

Interpreter::Flow Interpreter::exec(const std::vector<NodePtr>& body, Frame& frame) {
  for (const NodePtr& node : body) {
    const Flow flow = exec(*node, frame);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

std::string Interpreter::capture(const std::vector<NodePtr>& body, Frame& frame) {
  std::string saved;
  saved.swap(out_);
  try {
    exec(body, frame);
  } catch (...) {
    out_.swap(saved);
    throw;
  }
  out_.swap(saved);
  return saved;
}

Interpreter::Flow Interpreter::exec(const Node& node, Frame& frame) {
  At at(at_, node);
  switch (node.kind) {
    case Node::Kind::kText:
      write(node.name);
      return Flow::kNormal;
    case Node::Kind::kOutput:
      write(eval(*node.a, frame).str());
      return Flow::kNormal;
    case Node::Kind::kIf:
      for (std::size_t i = 0; i < node.items.size(); ++i) {
        if (eval(*node.items[i], frame).truthy()) return exec(node.bodies[i], frame);
      }
      return exec(node.else_body, frame);
    case Node::Kind::kFor: {
      Flow flow = Flow::kNormal;
      exec_for(node, frame, flow);
      return flow;
    }
    case Node::Kind::kSet:
      if (!node.attr.empty()) {
        const Value* ns = frame.find(node.names[0]);
        if (ns == nullptr || !ns->is_namespace()) {
          fail("cannot assign attribute on non-namespace object '" + node.names[0] + "'");
        }
        ns->mutable_namespace().set(Value(node.attr), eval(*node.a, frame));
      } else {
        assign(node, frame, eval(*node.a, frame));
      }
      return Flow::kNormal;
    case Node::Kind::kSetBlock: {
      Value text(capture(node.body, frame));
      if (node.a) text = eval_filter(*node.a, frame, &text);
      assign(node, frame, std::move(text));
      return Flow::kNormal;
    }
    case Node::Kind::kMacro:
      frame.vars[node.name] = make_macro(node, frame);
      return Flow::kNormal;
    case Node::Kind::kCallBlock: {
      // The body becomes `caller`, passed to the called macro.
      std::shared_ptr<const Frame> kept = snapshot(frame);
      const Frame* site = kept ? kept.get() : root_;
      const Node* block = &node;
      Value caller =
          Value::callable("caller", [this, site, kept, block](Interpreter&, CallArgs& args) {
            Frame local;
            local.parent = site;
            for (std::size_t i = 0; i < block->names.size(); ++i) {
              local.vars[block->names[i]] =
                  i < args.positional.size() ? args.positional[i]
                  : block->items[i]          ? eval(*block->items[i], local)
                                    : Value::undefined("'" + block->names[i] + "' is undefined");
            }
            return Value(capture(block->body, local));
          });
      const Node& call = *node.a;
      At at_call(at_, call);
      Value callee = eval(*call.a, frame);
      CallArgs args = arguments(call, frame);
      args.keyword.emplace_back("caller", caller);
      write(this->call(callee, args).str());
      return Flow::kNormal;
    }
    case Node::Kind::kFilterBlock: {
      Value text(capture(node.body, frame));
      write(eval_filter(*node.a, frame, &text).str());
      return Flow::kNormal;
    }
    case Node::Kind::kBreak:
      return Flow::kBreak;
    case Node::Kind::kContinue:
      return Flow::kContinue;
    case Node::Kind::kGeneration:
      return exec(node.body, frame);
    default:
      fail("internal: not a statement");
  }
}

std::shared_ptr<const Frame> Interpreter::snapshot(const Frame& frame) const {
  // A macro or caller may outlive the loop that made it (kept in a namespace): it sees a copy of
  // the scopes between its definition and the top level, which lives for the whole render.
  if (&frame == root_) return nullptr;
  auto copy = std::make_shared<Frame>();
  for (const Frame* f = &frame; f != nullptr && f != root_; f = f->parent) {
    for (const auto& [name, value] : f->vars) copy->vars.emplace(name, value);
  }
  copy->parent = root_;
  return copy;
}

void Interpreter::assign(const Node& node, Frame& frame, Value value) {
  if (node.names.size() == 1) {
    frame.vars[node.names[0]] = std::move(value);
    return;
  }
  const List items = iterate(*this, value);
  if (items.size() != node.names.size()) {
    fail("cannot unpack " + std::to_string(items.size()) + " values into " +
         std::to_string(node.names.size()) + " names");
  }
  for (std::size_t i = 0; i < items.size(); ++i) frame.vars[node.names[i]] = items[i];
}

void Interpreter::exec_for(const Node& node, Frame& frame, Flow& flow) {
  List items = iterate(*this, eval(*node.a, frame));
  if (node.b) {
    // `for x in xs if cond`: the loop sees only the items that pass (loop.length counts them).
    List kept;
    for (Value& item : items) {
      step();
      Frame probe;
      probe.parent = &frame;
      Value target = item;
      if (node.names.size() == 1) {
        probe.vars[node.names[0]] = target;
      } else {
        const List parts = iterate(*this, target);
        for (std::size_t k = 0; k < node.names.size() && k < parts.size(); ++k) {
          probe.vars[node.names[k]] = parts[k];
        }
      }
      if (eval(*node.b, probe).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    exec(node.else_body, frame);
    return;
  }
  const int64_t length = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < length; ++i) {
    step();
    Frame body;
    body.parent = &frame;
    const Value& item = items[static_cast<std::size_t>(i)];
    if (node.names.size() == 1) {
      body.vars[node.names[0]] = item;
    } else {
      const List parts = iterate(*this, item);
      if (parts.size() != node.names.size()) {
        fail("cannot unpack " + std::to_string(parts.size()) + " values into " +
             std::to_string(node.names.size()) + " loop variables");
      }
      for (std::size_t k = 0; k < parts.size(); ++k) body.vars[node.names[k]] = parts[k];
    }
    auto loop = std::make_shared<Dict>();
    loop->set(Value("index0"), Value(i));
    loop->set(Value("index"), Value(i + 1));
    loop->set(Value("revindex0"), Value(length - i - 1));
    loop->set(Value("revindex"), Value(length - i));
    loop->set(Value("first"), Value(i == 0));
    loop->set(Value("last"), Value(i == length - 1));
    loop->set(Value("length"), Value(length));
    loop->set(Value("depth"), Value(1));
    loop->set(Value("depth0"), Value(0));
    loop->set(Value("previtem"), i > 0 ? items[static_cast<std::size_t>(i - 1)]
                                       : Value::undefined("there is no previous item"));
    loop->set(Value("nextitem"), i + 1 < length ? items[static_cast<std::size_t>(i + 1)]
                                                : Value::undefined("there is no next item"));
    loop->set(Value("cycle"), Value::callable("cycle", [i](Interpreter& in, CallArgs& args) {
                if (args.positional.empty()) in.fail("no items for cycling given");
                return args.positional[static_cast<std::size_t>(i) % args.positional.size()];
              }));
    body.vars["loop"] = Value::dict(loop);
    const Flow f = exec(node.body, body);
    if (f == Flow::kBreak) break;
  }
  flow = Flow::kNormal;
}

Value Interpreter::make_macro(const Node& node, const Frame& frame) {
  const Node* macro = &node;
  std::shared_ptr<const Frame> kept = snapshot(frame);
  const Frame* closure = kept ? kept.get() : root_;
  return Value::callable(node.name, [this, macro, closure, kept](Interpreter&, CallArgs& args) {
    if (call_depth_ >= limits_.max_call_depth) {
      fail("macro '" + macro->name + "' calls nest deeper than " +
           std::to_string(limits_.max_call_depth));
    }
    ++call_depth_;
    struct Leave {
      int& depth;
      ~Leave() { --depth; }
    } leave{call_depth_};
    Frame local;
    local.parent = closure;
    const std::size_t n = macro->names.size();
    List varargs;
    for (std::size_t i = 0; i < args.positional.size(); ++i) {
      if (i < n) {
        local.vars[macro->names[i]] = args.positional[i];
      } else {
        varargs.push_back(args.positional[i]);
      }
    }
    auto kwargs = std::make_shared<Dict>();
    for (auto& [key, value] : args.keyword) {
      auto it = std::find(macro->names.begin(), macro->names.end(), key);
      if (it != macro->names.end()) {
        if (static_cast<std::size_t>(it - macro->names.begin()) < args.positional.size()) {
          fail("macro '" + macro->name + "' got multiple values for argument '" + key + "'");
        }
        local.vars[key] = value;
      } else if (key == "caller") {
        local.vars["caller"] = value;
      } else {
        kwargs->set(Value(key), value);
      }
    }
    for (std::size_t i = 0; i < n; ++i) {
      if (local.vars.count(macro->names[i])) continue;
      local.vars[macro->names[i]] =
          macro->items[i] ? eval(*macro->items[i], local)
                          : Value::undefined("'" + macro->names[i] + "' is undefined");
    }
    local.vars["varargs"] = Value::tuple(std::move(varargs));
    local.vars["kwargs"] = Value::dict(kwargs);
    return Value(capture(macro->body, local));
  });
}

CallArgs Interpreter::arguments(const Node& node, Frame& frame) {
  CallArgs args;
  for (const NodePtr& arg : node.items) args.positional.push_back(eval(*arg, frame));
  for (const auto& [key, arg] : node.kwargs) args.keyword.emplace_back(key, eval(*arg, frame));
  return args;
}

Value Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) {
    fail(callee.name().empty() ? "call of an undefined value" : callee.name());
  }
  if (!callee.is_callable())
    fail(std::string("'") + callee.type_name() + "' object is not callable");
  return callee.function()(*this, args);
}

Value Interpreter::eval_call(const Node& node, Frame& frame) {
  Value callee = eval(*node.a, frame);
  At at(at_, node);
  CallArgs args = arguments(node, frame);
  return call(callee, args);
}

Value Interpreter::eval_filter(const Node& node, Frame& frame, const Value* input) {
  // A chain a|f|g is nested: evaluate the innermost input first.
  Value value;
  if (node.a) {
    value = node.a->kind == Node::Kind::kFilter && input != nullptr
                ? eval_filter(*node.a, frame, input)
                : eval(*node.a, frame);
  } else if (input != nullptr) {
    value = *input;
  }
  At at(at_, node);
  CallArgs args = arguments(node, frame);
  return apply_filter(node.name, value, args);
}

Value Interpreter::apply_filter(const std::string& name, const Value& input, CallArgs& args) {
  return filter_builtin(*this, name, input, args);
}

bool Interpreter::apply_test(const std::string& name, const Value& input, CallArgs& args) {
  return test_builtin(*this, name, input, args);
}

Value Interpreter::eval(const Node& node, Frame& frame) {
  At at(at_, node);
  switch (node.kind) {
    case Node::Kind::kLiteral:
      return node.literal;
    case Node::Kind::kName: {
      const Value* v = frame.find(node.name);
      return v ? *v : Value::undefined("'" + node.name + "' is undefined");
    }
    case Node::Kind::kList:
    case Node::Kind::kTuple: {
      List items;
      step(node.items.size());
      for (const NodePtr& item : node.items) items.push_back(eval(*item, frame));
      return node.kind == Node::Kind::kTuple ? Value::tuple(std::move(items))
                                             : Value(std::move(items));
    }
    case Node::Kind::kDict: {
      auto dict = std::make_shared<Dict>();
      step(node.items.size());
      for (std::size_t i = 0; i + 1 < node.items.size(); i += 2) {
        Value key = eval(*node.items[i], frame);
        dict->set(key, eval(*node.items[i + 1], frame));
      }
      return Value::dict(dict);
    }
    case Node::Kind::kAttr: {
      Value object = eval(*node.a, frame);
      return get_attribute(*this, object, node.name);
    }
    case Node::Kind::kItem: {
      Value object = eval(*node.a, frame);
      Value key = eval(*node.b, frame);
      return get_item(*this, object, key);
    }
    case Node::Kind::kSlice: {
      Value object = eval(*node.a, frame);
      Value parts[3];
      for (int i = 0; i < 3; ++i) {
        parts[i] = node.items[i] ? eval(*node.items[i], frame) : Value::none();
      }
      return slice(*this, object, parts[0], parts[1], parts[2]);
    }
    case Node::Kind::kCall:
      return eval_call(node, frame);
    case Node::Kind::kFilter:
      return eval_filter(node, frame, nullptr);
    case Node::Kind::kTest: {
      Value input = eval(*node.a, frame);
      CallArgs args = arguments(node, frame);
      const bool result = apply_test(node.name, input, args);
      return Value(node.flag ? !result : result);
    }
    case Node::Kind::kNot:
      return Value(!eval(*node.a, frame).truthy());
    case Node::Kind::kNeg:
    case Node::Kind::kPos: {
      Value v = eval(*node.a, frame);
      if (v.is_undefined()) fail(v.name());
      if (!v.is_number())
        fail(std::string("bad operand type for unary ") +
             (node.kind == Node::Kind::kNeg ? "-" : "+") + ": '" + v.type_name() + "'");
      if (node.kind == Node::Kind::kPos) return v.is_bool() ? Value(v.as_int()) : v;
      if (v.is_float()) return Value(-v.as_float());
      if (v.as_int() == INT64_MIN) fail("integer overflow");
      return Value(-v.as_int());
    }
    case Node::Kind::kBinary: {
      Value a = eval(*node.a, frame);
      Value b = eval(*node.b, frame);
      At again(at_, node);
      return binary_op(*this, node.name, a, b);
    }
    case Node::Kind::kAnd: {
      Value a = eval(*node.a, frame);
      return a.truthy() ? eval(*node.b, frame) : a;
    }
    case Node::Kind::kOr: {
      Value a = eval(*node.a, frame);
      return a.truthy() ? a : eval(*node.b, frame);
    }
    case Node::Kind::kCompare: {
      Value left = eval(*node.items[0], frame);
      for (std::size_t i = 0; i < node.names.size(); ++i) {
        Value right = eval(*node.items[i + 1], frame);
        At again(at_, node);
        if (!compare_op(*this, node.names[i], left, right)) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case Node::Kind::kCond:
      if (eval(*node.b, frame).truthy()) return eval(*node.a, frame);
      return node.c ? eval(*node.c, frame)
                    : Value::undefined("the condition was false and there is no else");
    case Node::Kind::kConcat: {
      std::string out;
      for (const NodePtr& item : node.items) {
        out += eval(*item, frame).str();
        step(1);
        if (out.size() > limits_.max_output_bytes) {
          fail("a string exceeds " + std::to_string(limits_.max_output_bytes) + " bytes");
        }
      }
      return Value(std::move(out));
    }
    default:
      fail("internal: not an expression");
  }
}

Template Template::parse(std::string_view source, std::string origin, const Limits& limits) {
  if (source.size() > limits.max_template_bytes) {
    throw Error(kTemplateError,
                "the template has " + std::to_string(source.size()) + " bytes, more than the " +
                    std::to_string(limits.max_template_bytes) + " allowed",
                {origin});
  }
  Template t;
  t.origin_ = std::make_shared<const std::string>(std::move(origin));
  t.limits_ = limits;
  t.root_ = parse_tokens(lex(source, *t.origin_), *t.origin_, t.limits_);
  return t;
}

std::string Template::render(const std::vector<std::pair<std::string, Value>>& variables) const {
  Interpreter interpreter(*origin_, limits_);
  return interpreter.render(*root_, variables);
}

}  // namespace promptcache::jinja
