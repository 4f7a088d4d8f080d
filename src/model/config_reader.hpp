// src/model/config_reader.hpp — typed access to the fields of a config.json object, each error
// naming the file and the field: what config.cpp and the family units (families/*_config.cpp)
// read config.json with. Private to the library; no LibTorch.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "promptcache/error.hpp"

namespace promptcache::config_reader {

using json = nlohmann::json;

[[noreturn]] inline void fail(const std::string& origin, const std::string& message) {
  throw Error(ErrorKind::kModel, message, SourceLocation{origin, 0, 0, {}});
}

class Reader {
 public:
  Reader(const json& j, std::string origin) : j_(j), origin_(std::move(origin)) {}

  // Present and not null.
  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  int64_t integer(const char* key, const json& v) const {
    if (!v.is_number_integer()) type_error(key, "an integer", v);
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      fail(origin_, std::string("field '") + key + "' is out of range");
    }
    return v.get<int64_t>();
  }
  int64_t integer(const char* key) const {
    if (!has(key)) fail(origin_, std::string("missing required field '") + key + "'");
    return integer(key, j_[key]);
  }
  int64_t integer(const char* key, int64_t fallback) const {
    return has(key) ? integer(key, j_[key]) : fallback;
  }
  double number(const char* key, const json& v) const {
    if (!v.is_number()) type_error(key, "a number", v);
    return v.get<double>();
  }
  double number(const char* key, double fallback) const {
    return has(key) ? number(key, j_[key]) : fallback;
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_boolean()) type_error(key, "a boolean", j_[key]);
    return j_[key].get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_string()) type_error(key, "a string", j_[key]);
    return j_[key].get<std::string>();
  }
  [[noreturn]] void type_error(const std::string& key, const char* expected, const json& v) const {
    fail(origin_, "field '" + key + "' must be " + expected + ", got " + v.type_name());
  }
  const json& operator[](const char* key) const { return j_[key]; }

 private:
  const json& j_;
  std::string origin_;
};

}  // namespace promptcache::config_reader
