// The Jinja parser: tokens into a syntax tree, with Jinja's operator precedence. Nesting (blocks
// inside blocks, expressions inside expressions) is counted against Limits::max_nesting, so a
// hostile template ends with an error instead of exhausting the stack.
#include "ast.hpp"

namespace promptcache::jinja {
namespace {

using K = Token::Kind;

class Parser {
 public:
  Parser(std::vector<Token> tokens, const std::string& origin, const Limits& limits)
      : t_(std::move(tokens)), origin_(origin), limits_(limits) {}

  NodePtr root() {
    auto node = make(Node::Kind::kRoot, t_.front());
    std::string end;
    node->body = body({}, end);
    return node;
  }

 private:
  struct Depth {
    Depth(Parser& p, const Token& at) : p(p) {
      if (++p.depth_ > p.limits_.max_nesting) {
        p.fail(at, "the template nests deeper than " + std::to_string(p.limits_.max_nesting) +
                       " levels");
      }
    }
    ~Depth() { --p.depth_; }
    Parser& p;
  };

  // A chain built in a loop (a + b + c, x|f|g, a.b.c, f()()) nests its tree as deep as it is
  // long: each link counts against the nesting limit.
  void link(int& chain, const Token& at) {
    if (depth_ + ++chain > limits_.max_nesting) {
      fail(at, "the template nests deeper than " + std::to_string(limits_.max_nesting) + " levels");
    }
  }

  const Token& peek(std::size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& next() {
    const Token& t = t_[i_];
    if (i_ + 1 < t_.size()) ++i_;
    return t;
  }
  bool is_op(const char* op, std::size_t ahead = 0) const {
    return peek(ahead).kind == K::kOp && peek(ahead).text == op;
  }
  bool is_name(const char* name, std::size_t ahead = 0) const {
    return peek(ahead).kind == K::kName && peek(ahead).text == name;
  }
  bool accept_op(const char* op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool accept_name(const char* name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail(const Token& at, const std::string& message) const {
    template_error(origin_, at.line, at.column, message, element_);
  }
  std::string describe(const Token& t) const {
    switch (t.kind) {
      case K::kEof:
        return "end of template";
      case K::kBlockEnd:
        return "end of statement block";
      case K::kVarEnd:
        return "end of print statement";
      case K::kString:
        return "string";
      default:
        return "'" + t.text + "'";
    }
  }
  void expect_op(const char* op) {
    if (!accept_op(op)) fail(peek(), std::string("expected '") + op + "', got " + describe(peek()));
  }
  std::string expect_name() {
    if (peek().kind != K::kName) fail(peek(), "expected a name, got " + describe(peek()));
    return next().text;
  }
  void expect_block_end() {
    if (peek().kind != K::kBlockEnd)
      fail(peek(), "expected end of statement block, got " + describe(peek()));
    next();
  }
  NodePtr make(Node::Kind kind, const Token& at) {
    auto n = std::make_unique<Node>();
    n->kind = kind;
    n->line = at.line;
    n->column = at.column;
    return n;
  }

  // Statements up to a block whose first name is in `ends` (consumed up to that name; its name is
  // put in `end`). An empty `ends` reads to the end of the template.
  std::vector<NodePtr> body(const std::vector<std::string>& ends, std::string& end) {
    std::vector<NodePtr> out;
    while (true) {
      const Token& t = peek();
      if (t.kind == K::kEof) {
        if (!ends.empty()) {
          std::string expected;
          for (const auto& e : ends) expected += (expected.empty() ? "'" : " or '") + e + "'";
          fail(t, "unexpected end of template, expected " + expected + " (for " + element_ + ")");
        }
        return out;
      }
      if (t.kind == K::kText) {
        auto n = make(Node::Kind::kText, t);
        n->name = next().text;
        out.push_back(std::move(n));
      } else if (t.kind == K::kVarBegin) {
        next();
        auto n = make(Node::Kind::kOutput, t);
        n->a = expression();
        if (peek().kind != K::kVarEnd)
          fail(peek(), "expected end of print statement, got " + describe(peek()));
        next();
        out.push_back(std::move(n));
      } else if (t.kind == K::kBlockBegin) {
        next();
        const Token& keyword = peek();
        if (keyword.kind != K::kName)
          fail(keyword, "expected a statement name, got " + describe(keyword));
        for (const auto& e : ends) {
          if (keyword.text == e) {
            end = next().text;
            return out;
          }
        }
        out.push_back(statement());
      } else {
        fail(t, "unexpected " + describe(t));
      }
    }
  }

  NodePtr statement() {
    const Token& at = peek();
    Depth depth(*this, at);
    const std::string saved = element_;
    const std::string keyword = next().text;
    element_ = "{% " + keyword + " %} at line " + std::to_string(at.line);
    NodePtr n;
    if (keyword == "if") {
      n = if_statement(at);
    } else if (keyword == "for") {
      n = for_statement(at);
    } else if (keyword == "set") {
      n = set_statement(at);
    } else if (keyword == "macro") {
      n = macro_statement(at);
    } else if (keyword == "call") {
      n = call_statement(at);
    } else if (keyword == "filter") {
      n = make(Node::Kind::kFilterBlock, at);
      n->a = filter_chain(nullptr);
      expect_block_end();
      std::string end;
      n->body = body({"endfilter"}, end);
      expect_block_end();
    } else if (keyword == "break" || keyword == "continue") {
      if (loop_depth_ == 0) fail(at, "'" + keyword + "' outside of a loop");
      n = make(keyword == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, at);
      expect_block_end();
    } else if (keyword == "generation") {
      // transformers' {% generation %} marks assistant text; it renders as its body.
      n = make(Node::Kind::kGeneration, at);
      expect_block_end();
      std::string end;
      n->body = body({"endgeneration"}, end);
      expect_block_end();
    } else {
      fail(at, "unknown tag '" + keyword + "'");
    }
    element_ = saved;
    return n;
  }

  NodePtr if_statement(const Token& at) {
    auto n = make(Node::Kind::kIf, at);
    n->items.push_back(expression());
    expect_block_end();
    while (true) {
      std::string end;
      auto branch = body({"elif", "else", "endif"}, end);
      if (end == "elif") {
        n->bodies.push_back(std::move(branch));
        n->items.push_back(expression());
        expect_block_end();
      } else if (end == "else") {
        n->bodies.push_back(std::move(branch));
        expect_block_end();
        n->else_body = body({"endif"}, end);
        expect_block_end();
        return n;
      } else {
        n->bodies.push_back(std::move(branch));
        expect_block_end();
        return n;
      }
    }
  }

  NodePtr for_statement(const Token& at) {
    auto n = make(Node::Kind::kFor, at);
    n->names.push_back(expect_name());
    bool parens = false;
    while (accept_op(",")) {
      if (peek().kind != K::kName) break;
      n->names.push_back(expect_name());
    }
    (void)parens;
    if (!accept_name("in")) fail(peek(), "expected 'in', got " + describe(peek()));
    n->a = expression(/*with_condexpr=*/false);
    if (accept_name("if")) n->b = expression();
    if (accept_name("recursive")) fail(at, "recursive loops are not supported");
    expect_block_end();
    ++loop_depth_;
    std::string end;
    n->body = body({"else", "endfor"}, end);
    --loop_depth_;
    expect_block_end();
    if (end == "else") {
      n->else_body = body({"endfor"}, end);
      expect_block_end();
    }
    return n;
  }

  NodePtr set_statement(const Token& at) {
    std::string first = expect_name();
    if (accept_op(".")) {
      auto n = make(Node::Kind::kSet, at);
      n->names.push_back(first);
      n->attr = expect_name();
      expect_op("=");
      n->a = tuple_or_expression();
      expect_block_end();
      return n;
    }
    std::vector<std::string> names{first};
    while (accept_op(",")) names.push_back(expect_name());
    if (accept_op("=")) {
      auto n = make(Node::Kind::kSet, at);
      n->names = std::move(names);
      n->a = tuple_or_expression();
      expect_block_end();
      return n;
    }
    auto n = make(Node::Kind::kSetBlock, at);
    n->names = std::move(names);
    if (is_op("|")) n->a = filter_chain(nullptr);
    expect_block_end();
    std::string end;
    ++loop_depth_guard_;
    n->body = body({"endset"}, end);
    --loop_depth_guard_;
    expect_block_end();
    return n;
  }

  void parameters(Node& n) {
    expect_op("(");
    while (!is_op(")")) {
      if (!n.names.empty()) expect_op(",");
      if (is_op(")")) break;
      n.names.push_back(expect_name());
      n.items.push_back(accept_op("=") ? expression() : nullptr);
    }
    expect_op(")");
  }

  NodePtr macro_statement(const Token& at) {
    auto n = make(Node::Kind::kMacro, at);
    n->name = expect_name();
    parameters(*n);
    expect_block_end();
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    n->body = body({"endmacro"}, end);
    loop_depth_ = saved_loops;
    if (peek().kind == K::kName) next();  // {% endmacro name %}
    expect_block_end();
    return n;
  }

  NodePtr call_statement(const Token& at) {
    auto n = make(Node::Kind::kCallBlock, at);
    if (is_op("(")) parameters(*n);
    n->a = expression();
    if (n->a->kind != Node::Kind::kCall) fail(at, "expected a call after {% call %}");
    expect_block_end();
    std::string end;
    n->body = body({"endcall"}, end);
    expect_block_end();
    return n;
  }

  // `|f(args)|g...` applied to `input` (nullptr: a filter block's or set block's own body).
  NodePtr filter_chain(NodePtr input) {
    int chain = 0;
    do {
      link(chain, peek());
      input = filter(std::move(input));
    } while (is_op("|"));
    return input;
  }

  NodePtr filter(NodePtr input) {
    accept_op("|");
    const Token& at = peek();
    auto n = make(Node::Kind::kFilter, at);
    n->name = expect_name();
    while (accept_op(".")) n->name += "." + expect_name();
    n->a = std::move(input);
    if (is_op("(")) call_arguments(*n);
    return n;
  }

  void call_arguments(Node& n) {
    expect_op("(");
    while (!is_op(")")) {
      if (!n.items.empty() || !n.kwargs.empty()) {
        expect_op(",");
        if (is_op(")")) break;
      }
      if (peek().kind == K::kName && is_op("=", 1)) {
        std::string key = next().text;
        next();
        n.kwargs.emplace_back(std::move(key), expression());
      } else {
        if (!n.kwargs.empty()) fail(peek(), "positional argument after keyword argument");
        n.items.push_back(expression());
      }
    }
    expect_op(")");
  }

  // `a, b` (a tuple) or one expression.
  NodePtr tuple_or_expression() {
    const Token& at = peek();
    auto first = expression();
    if (!is_op(",")) return first;
    auto n = make(Node::Kind::kTuple, at);
    n->items.push_back(std::move(first));
    while (accept_op(",")) {
      if (peek().kind == K::kBlockEnd) break;
      n->items.push_back(expression());
    }
    return n;
  }

  NodePtr expression(bool with_condexpr = true) {
    Depth depth(*this, peek());
    auto n = or_expression();
    int chain = 0;
    if (with_condexpr) {
      while (is_name("if")) {
        const Token& at = next();
        link(chain, at);
        auto cond = make(Node::Kind::kCond, at);
        cond->a = std::move(n);
        cond->b = or_expression();
        if (accept_name("else")) cond->c = expression();
        n = std::move(cond);
      }
    }
    return n;
  }

  NodePtr or_expression() {
    auto n = and_expression();
    int chain = 0;
    while (is_name("or")) {
      const Token& at = next();
      link(chain, at);
      auto op = make(Node::Kind::kOr, at);
      op->a = std::move(n);
      op->b = and_expression();
      n = std::move(op);
    }
    return n;
  }

  NodePtr and_expression() {
    auto n = not_expression();
    int chain = 0;
    while (is_name("and")) {
      const Token& at = next();
      link(chain, at);
      auto op = make(Node::Kind::kAnd, at);
      op->a = std::move(n);
      op->b = not_expression();
      n = std::move(op);
    }
    return n;
  }

  NodePtr not_expression() {
    if (is_name("not")) {
      const Token& at = next();
      Depth depth(*this, at);
      auto n = make(Node::Kind::kNot, at);
      n->a = not_expression();
      return n;
    }
    return compare();
  }

  NodePtr compare() {
    const Token& at = peek();
    auto first = math1();
    NodePtr n;
    while (true) {
      std::string op;
      if (peek().kind == K::kOp &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
           peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!n) {
        n = make(Node::Kind::kCompare, at);
        n->items.push_back(std::move(first));
      }
      n->names.push_back(op);
      n->items.push_back(math1());
    }
    return n ? std::move(n) : std::move(first);
  }

  NodePtr binary(NodePtr left, const Token& at, NodePtr right) {
    auto n = make(Node::Kind::kBinary, at);
    n->name = at.text;
    n->a = std::move(left);
    n->b = std::move(right);
    return n;
  }

  NodePtr math1() {
    auto n = concat();
    int chain = 0;
    while (is_op("+") || is_op("-")) {
      const Token& at = next();
      link(chain, at);
      n = binary(std::move(n), at, concat());
    }
    return n;
  }

  NodePtr concat() {
    const Token& at = peek();
    auto first = math2();
    if (!is_op("~")) return first;
    auto n = make(Node::Kind::kConcat, at);
    n->items.push_back(std::move(first));
    while (accept_op("~")) n->items.push_back(math2());
    return n;
  }

  NodePtr math2() {
    auto n = pow();
    int chain = 0;
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& at = next();
      link(chain, at);
      n = binary(std::move(n), at, pow());
    }
    return n;
  }

  NodePtr pow() {
    auto n = unary(true);
    int chain = 0;
    while (is_op("**")) {
      const Token& at = next();
      link(chain, at);
      n = binary(std::move(n), at, unary(true));
    }
    return n;
  }

  NodePtr unary(bool with_filter) {
    const Token& at = peek();
    Depth depth(*this, at);
    NodePtr n;
    if (accept_op("-")) {
      n = make(Node::Kind::kNeg, at);
      n->a = unary(false);
    } else if (accept_op("+")) {
      n = make(Node::Kind::kPos, at);
      n->a = unary(false);
    } else {
      n = postfix(primary());
    }
    if (with_filter) n = filter_expression(std::move(n));
    return n;
  }

  NodePtr filter_expression(NodePtr n) {
    int chain = 0;
    while (true) {
      link(chain, peek());
      if (is_op("|")) {
        n = filter(std::move(n));
      } else if (is_name("is")) {
        const Token& at = next();
        auto test = make(Node::Kind::kTest, at);
        test->flag = accept_name("not");
        test->name = expect_name();
        while (accept_op(".")) test->name += "." + expect_name();
        test->a = std::move(n);
        if (is_op("(")) {
          call_arguments(*test);
        } else if (peek().kind == K::kString || peek().kind == K::kInt ||
                   peek().kind == K::kFloat ||
                   (peek().kind == K::kName && !is_name("else") && !is_name("or") &&
                    !is_name("and") && !is_name("if") && !is_name("is") && !is_name("in") &&
                    !is_name("not")) ||
                   is_op("[") || is_op("{")) {
          // `x is divisibleby 3`, `x is sameas none`: one argument without parentheses.
          test->items.push_back(postfix(primary()));
        }
        n = std::move(test);
      } else if (is_op("(")) {
        n = postfix(std::move(n));
      } else {
        return n;
      }
    }
  }

  NodePtr postfix(NodePtr n) {
    int chain = 0;
    while (true) {
      const Token& at = peek();
      link(chain, at);
      if (accept_op(".")) {
        auto attr = make(Node::Kind::kAttr, at);
        if (peek().kind == K::kInt) {
          attr->kind = Node::Kind::kItem;
          auto index = make(Node::Kind::kLiteral, peek());
          index->literal = Value(next().int_value);
          attr->b = std::move(index);
        } else {
          attr->name = expect_name();
        }
        attr->a = std::move(n);
        n = std::move(attr);
      } else if (accept_op("[")) {
        Depth depth(*this, at);
        n = subscript(std::move(n), at);
      } else if (is_op("(")) {
        Depth depth(*this, at);
        auto call = make(Node::Kind::kCall, at);
        call->a = std::move(n);
        call_arguments(*call);
        n = std::move(call);
      } else {
        return n;
      }
    }
  }

  NodePtr subscript(NodePtr target, const Token& at) {
    NodePtr parts[3];
    int part = 0;
    bool slice = false;
    while (!is_op("]")) {
      if (accept_op(":")) {
        slice = true;
        if (++part > 2) fail(peek(), "too many ':' in a slice");
        continue;
      }
      if (parts[part]) fail(peek(), "expected ']' or ':', got " + describe(peek()));
      parts[part] = expression();
    }
    expect_op("]");
    if (!slice) {
      if (!parts[0]) fail(at, "expected an index");
      auto n = make(Node::Kind::kItem, at);
      n->a = std::move(target);
      n->b = std::move(parts[0]);
      return n;
    }
    auto n = make(Node::Kind::kSlice, at);
    n->a = std::move(target);
    for (auto& p : parts) n->items.push_back(std::move(p));
    return n;
  }

  NodePtr primary() {
    const Token& t = peek();
    Depth depth(*this, t);
    switch (t.kind) {
      case K::kString: {
        auto n = make(Node::Kind::kLiteral, t);
        std::string s = next().text;
        while (peek().kind == K::kString) s += next().text;  // "a" "b" is "ab"
        n->literal = Value(std::move(s));
        return n;
      }
      case K::kInt: {
        auto n = make(Node::Kind::kLiteral, t);
        n->literal = Value(next().int_value);
        return n;
      }
      case K::kFloat: {
        auto n = make(Node::Kind::kLiteral, t);
        n->literal = Value(next().float_value);
        return n;
      }
      case K::kName: {
        auto n = make(Node::Kind::kLiteral, t);
        const std::string& name = t.text;
        if (name == "true" || name == "True") {
          n->literal = Value(true);
        } else if (name == "false" || name == "False") {
          n->literal = Value(false);
        } else if (name == "none" || name == "None") {
          n->literal = Value::none();
        } else {
          n->kind = Node::Kind::kName;
          n->name = name;
        }
        next();
        return n;
      }
      case K::kOp:
        if (accept_op("(")) {
          if (accept_op(")")) return make(Node::Kind::kTuple, t);
          auto first = expression();
          if (accept_op(")")) return first;
          auto n = make(Node::Kind::kTuple, t);
          n->items.push_back(std::move(first));
          while (accept_op(",")) {
            if (is_op(")")) break;
            n->items.push_back(expression());
          }
          expect_op(")");
          return n;
        }
        if (accept_op("[")) {
          auto n = make(Node::Kind::kList, t);
          while (!is_op("]")) {
            if (!n->items.empty()) {
              expect_op(",");
              if (is_op("]")) break;
            }
            n->items.push_back(expression());
          }
          expect_op("]");
          return n;
        }
        if (accept_op("{")) {
          auto n = make(Node::Kind::kDict, t);
          while (!is_op("}")) {
            if (!n->items.empty()) {
              expect_op(",");
              if (is_op("}")) break;
            }
            n->items.push_back(expression());
            expect_op(":");
            n->items.push_back(expression());
          }
          expect_op("}");
          return n;
        }
        break;
      default:
        break;
    }
    fail(t, "unexpected " + describe(t));
  }

  std::vector<Token> t_;
  std::size_t i_ = 0;
  const std::string& origin_;
  const Limits& limits_;
  int depth_ = 0;
  int loop_depth_ = 0;
  int loop_depth_guard_ = 0;
  std::string element_;
};

}  // namespace

NodePtr parse_tokens(std::vector<Token> tokens, const std::string& origin, const Limits& limits) {
  return Parser(std::move(tokens), origin, limits).root();
}

}  // namespace promptcache::jinja
