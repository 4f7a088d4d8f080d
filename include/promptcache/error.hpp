// promptcache/error.hpp — the one exception type the library throws, with context.
//
// Every user-facing failure (bad XML, unknown module, wrong model files, corrupt cache file, bad
// argument) is an Error whose kind says what went wrong and whose location says where: the file,
// the line and column, and the element. what() renders all of it as one readable message.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>

namespace promptcache {

enum class ErrorKind {
  kIo,             // a file is missing or unreadable
  kXmlSyntax,      // malformed XML
  kSchema,         // structurally invalid schema (duplicate names, misplaced elements, ...)
  kUnknownSchema,  // prompt names a schema that is not loaded
  kUnknownModule,  // prompt names a module the schema does not have
  kUnionConflict,  // two members of one union selected
  kUnknownParameter,
  kArgumentTooLong,  // argument has more tokens than its parameter reserves
  kPrompt,           // structurally invalid prompt (text where only module refs are allowed, ...)
  kModel,            // wrong or inconsistent model files (config.json, safetensors)
  kSafetensors,      // malformed safetensors file
  kTokenizer,        // tokenizer could not be loaded or used
  kCacheFile,        // corrupt or mismatched cache file
  kInvalidArgument,  // a bad value passed to an API or the CLI
  kContextOverflow,  // the request needs more positions than the model or cache holds
  kCancelled,        // work stopped because its caller asked (a compile whose client went away)
};

inline const char* to_string(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kIo:
      return "io";
    case ErrorKind::kXmlSyntax:
      return "xml syntax";
    case ErrorKind::kSchema:
      return "schema";
    case ErrorKind::kUnknownSchema:
      return "unknown schema";
    case ErrorKind::kUnknownModule:
      return "unknown module";
    case ErrorKind::kUnionConflict:
      return "union conflict";
    case ErrorKind::kUnknownParameter:
      return "unknown parameter";
    case ErrorKind::kArgumentTooLong:
      return "argument too long";
    case ErrorKind::kPrompt:
      return "prompt";
    case ErrorKind::kModel:
      return "model";
    case ErrorKind::kSafetensors:
      return "safetensors";
    case ErrorKind::kTokenizer:
      return "tokenizer";
    case ErrorKind::kCacheFile:
      return "cache file";
    case ErrorKind::kInvalidArgument:
      return "invalid argument";
    case ErrorKind::kContextOverflow:
      return "context overflow";
    case ErrorKind::kCancelled:
      return "cancelled";
  }
  return "error";
}

// Where in the user's input an error is. Empty fields are left out of the message.
struct SourceLocation {
  std::string file;        // path as the user gave it, or "<string>" for in-memory input
  std::size_t line = 0;    // 1-based; 0 = unknown
  std::size_t column = 0;  // 1-based; 0 = unknown
  std::string element;     // e.g. "<module name=\"intro\">" or a tensor name
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, SourceLocation where = {})
      : std::runtime_error(render(kind, message, where)),
        kind_(kind),
        message_(std::move(message)),
        where_(std::move(where)) {}

  ErrorKind kind() const noexcept { return kind_; }
  // The bare message without location, e.g. "unknown module 'intro'".
  const std::string& message() const noexcept { return message_; }
  const SourceLocation& where() const noexcept { return where_; }

 private:
  static std::string render(ErrorKind kind, const std::string& message,
                            const SourceLocation& where) {
    std::string out;
    if (!where.file.empty()) {
      out += where.file;
      if (where.line > 0) {
        out += ":" + std::to_string(where.line);
        if (where.column > 0) out += ":" + std::to_string(where.column);
      }
      out += ": ";
    }
    out += std::string(to_string(kind)) + " error: " + message;
    if (!where.element.empty()) out += " (in " + where.element + ")";
    return out;
  }

  ErrorKind kind_;
  std::string message_;
  SourceLocation where_;
};

}  // namespace promptcache
