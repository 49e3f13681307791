// Reading request fields from a parsed JSON body: typed getters that throw FieldError naming the
// field. Shared by every API's request parser; nothing here knows an API's field names.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace lily::server {

using json = nlohmann::ordered_json;

// A request field with a bad value: HTTP 400 naming `param` (dotted path, "" for the whole body).
struct FieldError : InputError {
  FieldError(std::string param, const std::string& message, std::string code = "invalid_value")
      : InputError(message), param(std::move(param)), code(std::move(code)) {}
  std::string param, code;
};

[[noreturn]] inline void bad(std::string param, const std::string& message, std::string code = "invalid_value") {
  throw FieldError(std::move(param), message, std::move(code));
}

// Limits on the shape of a JSON body (server/json_body.h enforces them while parsing).
struct JsonLimits {
  size_t depth = 64;                      // nested objects and arrays
  size_t object_keys = 4096;              // keys in one object
  size_t array_items = size_t(1) << 20;   // items in one array
  size_t string_bytes = size_t(4) << 20;  // one string or key
};

// Limits on what one request may ask for, beyond the size of its body. FieldError names the field.
struct RequestLimits {
  JsonLimits json;
  size_t tools = 128;              // tool definitions
  size_t stop_strings = 16;        // stop strings
  size_t stop_string_bytes = 256;  // bytes of one stop string
  size_t logit_bias = 1024;        // logit_bias entries
};

// FieldError (limit_exceeded) naming `param` when a request holds more than `limit` of something.
void check_count(const std::string& param, size_t count, size_t limit, const char* what);

// The value of `k` in object `b`; null when absent or JSON null.
const json* field(const json& b, const char* k);
// Typed reads of `k`: nothing when absent or null, FieldError(k) when of the wrong type; `b` is the
// body, or the object at dotted path `where` (then the error names where.k).
std::optional<double> number(const json& b, const char* k, const std::string& where = "");
std::optional<int64_t> integer(const json& b, const char* k, const std::string& where = "");
std::optional<bool> boolean(const json& b, const char* k, const std::string& where = "");

}  // namespace lily::server
