#include "server/fields.h"

#include <cmath>
#include <cstdint>

#include <fmt/format.h>

namespace lily::server {

void check_count(const std::string& param, size_t count, size_t limit, const char* what) {
  if (count > limit) bad(param, fmt::format("'{}' may hold at most {} {} (got {})", param, limit, what, count), "limit_exceeded");
}

const json* field(const json& b, const char* k) {
  auto it = b.find(k);
  return it == b.end() || it->is_null() ? nullptr : &*it;
}

namespace {
std::string named(const std::string& where, const char* k) { return where.empty() ? std::string(k) : where + "." + k; }
}  // namespace

std::optional<double> number(const json& b, const char* k, const std::string& where) {
  auto* v = field(b, k);
  if (!v) return std::nullopt;
  if (!v->is_number()) bad(named(where, k), fmt::format("'{}' must be a number", named(where, k)));
  return v->get<double>();
}

std::optional<int64_t> integer(const json& b, const char* k, const std::string& where) {
  auto* v = field(b, k);
  if (!v) return std::nullopt;
  const std::string p = named(where, k);
  if (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)) bad(p, fmt::format("'{}' is out of range", p));
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() && std::fabs(v->get<double>()) < 9e15)
    return int64_t(v->get<double>());
  bad(p, fmt::format("'{}' must be an integer", p));
}

std::optional<bool> boolean(const json& b, const char* k, const std::string& where) {
  auto* v = field(b, k);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) bad(named(where, k), fmt::format("'{}' must be true or false", named(where, k)));
  return v->get<bool>();
}

}  // namespace lily::server
