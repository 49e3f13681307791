// Python semantics of Jinja values: lookup, iteration, ==, ordering, `in`, attribute and item access,
// slices and the arithmetic operators.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "text/jinja_interp.h"
#include "text/jinja_number.h"
#include "text/utf8.h"

namespace lily::text::jinja::detail {

Value Interp::lookup(Ctx& c, const std::string& k) {
  for (size_t f = c.frames.size(); f-- > 0;) {
    auto it = c.frames[f].find(k);
    if (it != c.frames[f].end()) return it->second;
  }
  if (c.root) {
    auto it = c.root->find(k);
    if (it != c.root->end()) return it->second;
  }
  return Value::undef(k);
}

const char* Interp::type_name(const Value& v) {
  switch (v.kind) {
    case Value::Undefined: return "undefined";
    case Value::None: return "none";
    case Value::Bool: return "boolean";
    case Value::Int: return "integer";
    case Value::Float: return "float";
    case Value::Str: return "string";
    case Value::Arr: return "list";
    case Value::Obj: return "dict";
    case Value::Fn: return "function";
  }
  return "?";
}

std::vector<uint32_t> Interp::cps(const std::string& s) {
  std::vector<uint32_t> v;
  for (size_t k = 0; k < s.size();) v.push_back(next_cp(s, k));
  return v;
}
std::string Interp::from_cps(const std::vector<uint32_t>& v, size_t b, size_t e) {
  std::string s;
  for (size_t k = b; k < e; ++k) append_utf8(s, v[k]);
  return s;
}

// Iteration as Python does it: lists, dict keys, string characters.
std::vector<Value> Interp::iterate(const Node& n, const Value& v) const {
  switch (v.kind) {
    case Value::Arr: return *v.a;
    case Value::Obj: {
      std::vector<Value> r;
      for (auto& [k, x] : v.o->items) r.emplace_back(k);
      return r;
    }
    case Value::Str: {
      std::vector<Value> r;
      for (size_t k = 0; k < v.s.size();) {
        size_t s = k;
        next_cp(v.s, k);
        r.emplace_back(v.s.substr(s, k - s));
      }
      return r;
    }
    case Value::Undefined: return {};
    default: error(n, std::string("'") + type_name(v) + "' object is not iterable");
  }
}

bool Interp::equal(const Value& x, const Value& y) {
  if (x.is_num() && y.is_num()) {
    if (x.kind == Value::Float || y.kind == Value::Float) return x.num() == y.num();
    return int64_t(x.kind == Value::Int ? x.i : x.b) == int64_t(y.kind == Value::Int ? y.i : y.b);
  }
  if (x.kind != y.kind) return false;
  switch (x.kind) {
    case Value::Undefined:
    case Value::None: return true;
    case Value::Str: return x.s == y.s;
    case Value::Arr:
      if (x.a->size() != y.a->size()) return false;
      for (size_t k = 0; k < x.a->size(); ++k)
        if (!equal((*x.a)[k], (*y.a)[k])) return false;
      return true;
    case Value::Obj:
      if (x.o->items.size() != y.o->items.size()) return false;
      for (auto& [k, v] : x.o->items) {
        auto* w = y.o->get(k);
        if (!w || !equal(v, *w)) return false;
      }
      return true;
    case Value::Fn: return x.fn == y.fn;
    default: return false;
  }
}

int Interp::compare(const Node& n, const Value& x, const Value& y) const {
  if (x.is_num() && y.is_num()) return x.num() < y.num() ? -1 : x.num() > y.num() ? 1 : 0;
  if (x.kind == Value::Str && y.kind == Value::Str) return x.s < y.s ? -1 : x.s > y.s ? 1 : 0;
  if (x.kind == Value::Arr && y.kind == Value::Arr) {
    for (size_t k = 0; k < x.a->size() && k < y.a->size(); ++k) {
      if (equal((*x.a)[k], (*y.a)[k])) continue;
      return compare(n, (*x.a)[k], (*y.a)[k]);
    }
    return x.a->size() < y.a->size() ? -1 : x.a->size() > y.a->size() ? 1 : 0;
  }
  error(n, std::string("cannot compare ") + type_name(x) + " with " + type_name(y));
}

bool Interp::contains(const Node& n, const Value& hay, const Value& needle) const {
  switch (hay.kind) {
    case Value::Str:
      if (needle.kind != Value::Str) error(n, "'in <string>' requires a string on the left");
      return hay.s.find(needle.s) != std::string::npos;
    case Value::Arr:
      for (auto& x : *hay.a)
        if (equal(x, needle)) return true;
      return false;
    case Value::Obj: return needle.kind == Value::Str && hay.o->get(needle.s) != nullptr;
    case Value::Undefined: return false;
    default: error(n, std::string("argument of type '") + type_name(hay) + "' is not iterable");
  }
}

Value Interp::get_attr(const Node& n, const Value& obj, const std::string& key) const {
  if (obj.kind == Value::Undefined)
    error(n, "'" + (obj.undefined_name.empty() ? std::string("value") : obj.undefined_name) + "' is undefined (reading ." + key + ")");
  if (obj.kind == Value::Obj) {
    if (auto* v = obj.o->get(key)) return *v;
  }
  if (obj.kind == Value::Arr) {
    char* end = nullptr;
    long idx = std::strtol(key.c_str(), &end, 10);
    if (!key.empty() && *end == 0 && idx >= 0 && size_t(idx) < obj.a->size()) return (*obj.a)[size_t(idx)];
  }
  return Value::undef(key);
}

Value Interp::get_item(const Node& n, const Value& obj, const Value& key) const {
  if (obj.kind == Value::Undefined)
    error(n, "'" + (obj.undefined_name.empty() ? std::string("value") : obj.undefined_name) + "' is undefined (reading [" + repr(key) + "])");
  if (obj.kind == Value::Obj) {
    if (key.kind == Value::Str) {
      if (auto* v = obj.o->get(key.s)) return *v;
      return Value::undef(key.s);
    }
    return Value::undef();
  }
  if ((obj.kind == Value::Arr || obj.kind == Value::Str) && (key.kind == Value::Int || key.kind == Value::Bool)) {
    int64_t idx = key.kind == Value::Int ? key.i : key.b;
    if (obj.kind == Value::Arr) {
      int64_t len = int64_t(obj.a->size());
      if (idx < 0) idx += len;
      if (idx < 0 || idx >= len) return Value::undef();
      return (*obj.a)[size_t(idx)];
    }
    auto v = cps(obj.s);
    int64_t len = int64_t(v.size());
    if (idx < 0) idx += len;
    if (idx < 0 || idx >= len) return Value::undef();
    return Value(from_cps(v, size_t(idx), size_t(idx) + 1));
  }
  if (key.kind == Value::Str) return get_attr(n, obj, key.s);
  return Value::undef();
}

Value Interp::slice(const Node& n, const Value& obj, const Value& b, const Value& e, const Value& st) const {
  auto as_int = [&](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.kind == Value::Undefined || v.kind == Value::None) return std::nullopt;
    if (v.kind != Value::Int) error(n, std::string("slice ") + what + " must be an integer");
    return v.i;
  };
  int64_t step = as_int(st, "step").value_or(1);
  if (step == 0) error(n, "slice step cannot be zero");
  auto sb = as_int(b, "start"), se = as_int(e, "stop");
  auto indices = [&](int64_t len) {
    std::vector<size_t> out;
    auto norm = [&](std::optional<int64_t> x, int64_t def) {
      if (!x) return def;
      int64_t v = *x < 0 ? *x + len : *x;
      if (step > 0) return std::clamp<int64_t>(v, 0, len);
      return std::clamp<int64_t>(v, -1, len - 1);
    };
    int64_t start = norm(sb, step > 0 ? 0 : len - 1), stop = norm(se, step > 0 ? len : -1);
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) out.push_back(size_t(k));
    return out;
  };
  if (obj.kind == Value::Arr) {
    Array r;
    for (auto k : indices(int64_t(obj.a->size()))) r.push_back((*obj.a)[k]);
    return Value(std::move(r));
  }
  if (obj.kind == Value::Str) {
    auto v = cps(obj.s);
    std::string r;
    for (auto k : indices(int64_t(v.size()))) append_utf8(r, v[k]);
    return Value(r);
  }
  error(n, std::string("cannot slice ") + type_name(obj));
}

// Python's bool is an int: True + 1 == 2.
static Value as_arith(const Value& v) { return v.kind == Value::Bool ? Value(int64_t(v.b)) : v; }

Value Interp::binop(const Node& n, const std::string& op, const Value& x0, const Value& y0) const {
  if (op == "~") return Value(to_str(x0) + to_str(y0));
  if (op == "+") {
    if (x0.kind == Value::Str && y0.kind == Value::Str) return Value(x0.s + y0.s);
    if (x0.kind == Value::Arr && y0.kind == Value::Arr) {
      Array r = *x0.a;
      r.insert(r.end(), y0.a->begin(), y0.a->end());
      return Value(std::move(r));
    }
  }
  Value x = as_arith(x0), y = as_arith(y0);
  if (op == "*" && ((x.kind == Value::Str && y.kind == Value::Int) || (x.kind == Value::Int && y.kind == Value::Str))) {
    const std::string& s = x.kind == Value::Str ? x.s : y.s;
    int64_t k = x.kind == Value::Int ? x.i : y.i;
    // Python: a count <= 0 or an empty string gives ''; the loop below then runs at most
    // kMaxStringBytes / |s| times (an empty string repeated 2^62 times must not loop).
    if (k <= 0 || s.empty()) return Value(std::string());
    check_len(n, uint64_t(k) > kMaxStringBytes / s.size() ? kMaxStringBytes + 1 : s.size() * uint64_t(k), "a repeated string");
    std::string r;
    r.reserve(s.size() * size_t(k));
    for (int64_t j = 0; j < k; ++j) r += s;
    return Value(std::move(r));
  }
  if (x.is_num() && y.is_num()) {
    bool ints = x.kind == Value::Int && y.kind == Value::Int;
    auto overflow = [&]() -> Value { error(n, "integer overflow in " + op + " (result outside 64 bits)"); };
    if (op == "+" || op == "-" || op == "*") {
      if (!ints) return Value(op == "+" ? x.num() + y.num() : op == "-" ? x.num() - y.num() : x.num() * y.num());
      int64_t r;
      bool o = op == "+" ? __builtin_add_overflow(x.i, y.i, &r)
               : op == "-" ? __builtin_sub_overflow(x.i, y.i, &r)
                           : __builtin_mul_overflow(x.i, y.i, &r);
      return o ? overflow() : Value(r);
    }
    if (op == "/") {
      if (y.num() == 0) error(n, "division by zero");
      return Value(x.num() / y.num());
    }
    if (op == "//" || op == "%") {
      if (y.num() == 0) error(n, std::string(op == "%" ? "modulo" : "division") + " by zero");
      if (ints) {
        if (y.i == -1) {  // INT64_MIN / -1 traps
          if (op == "%") return Value(int64_t(0));
          if (x.i == INT64_MIN) return overflow();
          return Value(-x.i);
        }
        int64_t q = x.i / y.i, r = x.i % y.i;
        if (r != 0 && ((r < 0) != (y.i < 0))) --q, r += y.i;
        return op == "//" ? Value(q) : Value(r);
      }
      double q = std::floor(x.num() / y.num());
      return op == "//" ? Value(q) : Value(x.num() - q * y.num());
    }
    if (op == "**") {
      if (ints && y.i >= 0) {
        auto r = int_pow(x.i, y.i);
        return r ? Value(*r) : overflow();
      }
      if (x.num() == 0 && y.num() < 0) error(n, "0.0 cannot be raised to a negative power");
      if (x.num() < 0 && y.num() != std::floor(y.num()))
        error(n, "negative number raised to a fractional power (complex result)");
      double r = std::pow(x.num(), y.num());
      if (std::isinf(r) && std::isfinite(x.num()) && std::isfinite(y.num())) error(n, "float overflow in **");
      return Value(r);
    }
  }
  if (op == "%" && x.kind == Value::Str) error(n, "printf-style string formatting is not supported");
  error(n, "unsupported operand types for " + op + ": " + type_name(x0) + " and " + type_name(y0));
}

}  // namespace lily::text::jinja::detail
