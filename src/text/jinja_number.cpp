// Python's numeric semantics for the Jinja interpreter: integer power, round, int() and float().
#include "text/jinja_number.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>

namespace lily::text::jinja::detail {

std::optional<int64_t> int_pow(int64_t b, int64_t e) {
  int64_t r = 1;
  while (e > 0) {
    if ((e & 1) && __builtin_mul_overflow(r, b, &r)) return std::nullopt;
    e >>= 1;
    if (e > 0 && __builtin_mul_overflow(b, b, &b)) return std::nullopt;
  }
  return r;
}

double round_half_even(double x, int64_t ndigits) {
  if (!std::isfinite(x) || x == 0) return x;
  if (ndigits >= 0) {
    // printf rounds the exact binary value, ties to even, as CPython's dtoa does.
    if (ndigits > 340) return x;  // beyond the last significant digit of any double
    std::string buf(size_t(ndigits) + 330, '\0');
    int len = std::snprintf(buf.data(), buf.size(), "%.*f", int(ndigits), x);
    buf.resize(size_t(len));
    return std::strtod(buf.c_str(), nullptr);
  }
  if (ndigits < -308) return std::copysign(0.0, x);
  double scale = std::pow(10.0, double(-ndigits));
  return std::nearbyint(x / scale) * scale;  // nearbyint: ties to even in the default rounding mode
}

std::optional<int64_t> round_int(int64_t x, int64_t ndigits) {
  if (ndigits >= 0) return x;
  if (ndigits < -18) return 0;  // |x| < 10**19 / 2
  int64_t m = 1;
  for (int64_t k = 0; k < -ndigits; ++k) m *= 10;
  int64_t q = x / m, r = x % m;
  if (r < 0) --q, r += m;  // floor division: 0 <= r < m
  if (2 * r > m || (2 * r == m && (q & 1))) ++q;
  int64_t out;
  if (__builtin_mul_overflow(q, m, &out)) return std::nullopt;
  return out;
}

std::optional<int64_t> float_to_int(double d) {
  if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) return std::nullopt;
  return int64_t(d);
}

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string_view strip(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool iequal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t k = 0; k < a.size(); ++k)
    if (std::tolower(uint8_t(a[k])) != b[k]) return false;
  return true;
}

// Appends a run of decimal digits with single '_' between digits to `out`; returns the digits read.
size_t digits(std::string_view s, size_t& k, std::string& out) {
  size_t n = 0;
  while (k < s.size()) {
    if (s[k] >= '0' && s[k] <= '9') {
      out += s[k++];
      ++n;
    } else if (s[k] == '_' && n > 0 && k + 1 < s.size() && s[k + 1] >= '0' && s[k + 1] <= '9') {
      ++k;
    } else {
      break;
    }
  }
  return n;
}

}  // namespace

std::optional<double> parse_float(std::string_view s) {
  s = strip(s);
  std::string t;
  size_t k = 0;
  if (k < s.size() && (s[k] == '+' || s[k] == '-')) t += s[k++];
  std::string_view rest = s.substr(k);
  if (iequal(rest, "inf") || iequal(rest, "infinity")) return t == "-" ? -HUGE_VAL : HUGE_VAL;
  if (iequal(rest, "nan")) return std::nan("");
  size_t n = digits(s, k, t);
  if (k < s.size() && s[k] == '.') {
    t += s[k++];
    n += digits(s, k, t);
  }
  if (n == 0) return std::nullopt;
  if (k < s.size() && (s[k] == 'e' || s[k] == 'E')) {
    t += s[k++];
    if (k < s.size() && (s[k] == '+' || s[k] == '-')) t += s[k++];
    if (digits(s, k, t) == 0) return std::nullopt;
  }
  if (k != s.size()) return std::nullopt;
  return std::strtod(t.c_str(), nullptr);
}

std::optional<int64_t> parse_int(std::string_view s, int base, bool& overflow) {
  overflow = false;
  if (base != 0 && (base < 2 || base > 36)) return std::nullopt;
  s = strip(s);
  size_t k = 0;
  bool neg = false;
  if (k < s.size() && (s[k] == '+' || s[k] == '-')) neg = s[k++] == '-';
  auto prefix = [&](char p) {
    return k + 1 < s.size() && s[k] == '0' && std::tolower(uint8_t(s[k + 1])) == p;
  };
  bool prefixed = false;
  int b = base;
  for (auto [p, pb] : {std::pair{'x', 16}, std::pair{'o', 8}, std::pair{'b', 2}})
    if (!prefixed && (base == 0 || base == pb) && prefix(p)) b = pb, k += 2, prefixed = true;
  if (b == 0) b = 10;
  if (base == 0 && !prefixed && k + 1 < s.size() && s[k] == '0') {
    // base 0 rejects leading zeros ("012") but takes "0", "00", "0_0".
    for (size_t j = k; j < s.size(); ++j)
      if (s[j] != '0' && s[j] != '_') return std::nullopt;
  }
  uint64_t acc = 0, limit = neg ? uint64_t(INT64_MAX) + 1 : uint64_t(INT64_MAX);
  size_t n = 0;
  bool big = false;
  for (; k < s.size(); ++k) {
    char c = s[k];
    if (c == '_') {  // one '_' between digits, or right after a prefix
      if (!(n > 0 || prefixed) || k + 1 >= s.size() || s[k + 1] == '_') return std::nullopt;
      continue;
    }
    int d = c >= '0' && c <= '9' ? c - '0' : std::isalpha(uint8_t(c)) ? std::tolower(uint8_t(c)) - 'a' + 10 : 99;
    if (d >= b) return std::nullopt;
    if (!big && (acc > (limit - uint64_t(d)) / uint64_t(b))) big = true;
    if (!big) acc = acc * uint64_t(b) + uint64_t(d);
    ++n;
  }
  if (n == 0) return std::nullopt;
  if (big) {
    overflow = true;
    return std::nullopt;
  }
  return neg ? int64_t(0 - acc) : int64_t(acc);
}

}  // namespace lily::text::jinja::detail
