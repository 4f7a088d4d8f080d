// src/jinja/ast.hpp — the tokens and the syntax tree of a Jinja template (private to the jinja
// unit): lexer.cpp makes the tokens, parser.cpp the tree, interpreter.cpp walks it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "promptcache/jinja/template.hpp"

namespace promptcache::jinja {

struct Token {
  enum class Kind {
    kText,
    kVarBegin,
    kVarEnd,
    kBlockBegin,
    kBlockEnd,
    kName,
    kString,
    kInt,
    kFloat,
    kOp,
    kEof
  };
  Kind kind;
  std::string text;  // text, name, operator or the string literal's value
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1, column = 1;
};

// Splits a template into tokens with HF's whitespace rules (trim_blocks, lstrip_blocks, '-' and
// '+' markers, one trailing newline dropped, comments removed). Error(kTemplateError) on an
// unclosed tag, comment or string, or an unknown character.
std::vector<Token> lex(std::string_view source, const std::string& origin);

using NodePtr = std::unique_ptr<Node>;

struct Node {
  enum class Kind {
    // expressions
    kLiteral,
    kName,
    kList,
    kTuple,
    kDict,
    kAttr,
    kItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNot,
    kNeg,
    kPos,
    kBinary,
    kAnd,
    kOr,
    kCompare,
    kCond,
    kConcat,
    // statements
    kRoot,
    kText,
    kOutput,
    kIf,
    kFor,
    kSet,
    kSetBlock,
    kMacro,
    kCallBlock,
    kFilterBlock,
    kBreak,
    kContinue,
    kGeneration
  };
  Kind kind;
  int line = 0, column = 0;
  std::string name;  // name, attribute, filter, test, operator, macro; kText: the text
  std::string attr;  // kSet of `ns.attr`: the attribute
  Value literal;
  NodePtr a, b, c;
  std::vector<NodePtr>
      items;  // operands, arguments, list items, dict keys and values, if conditions
  std::vector<std::pair<std::string, NodePtr>> kwargs;
  std::vector<std::string> names;  // loop and set targets, macro parameters, compare operators
  std::vector<NodePtr> body, else_body;
  std::vector<std::vector<NodePtr>> bodies;  // kIf: one per condition
  bool flag = false;                         // kTest: negated; kFor: recursive
};

NodePtr parse_tokens(std::vector<Token> tokens, const std::string& origin, const Limits& limits);

// Error(kTemplateError) at a line and column of `origin`, naming the construct.
[[noreturn]] void template_error(const std::string& origin, int line, int column,
                                 const std::string& message, const std::string& element = {});

}  // namespace promptcache::jinja
