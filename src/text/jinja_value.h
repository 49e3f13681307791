// Runtime values of the Jinja interpreter (internal to src/text).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/jinja.h"

namespace lily::text::jinja {

struct Value;
using Array = std::vector<Value>;
struct Object;
struct CallArgs;
using Function = std::function<Value(CallArgs&)>;

struct Value {
  enum Kind : uint8_t { Undefined, None, Bool, Int, Float, Str, Arr, Obj, Fn };
  Kind kind = Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<Array> a;
  std::shared_ptr<Object> o;
  std::shared_ptr<Function> fn;
  std::string undefined_name;  // what was looked up, for error messages

  Value() = default;
  static Value none() { Value v; v.kind = None; return v; }
  static Value undef(std::string what = {}) { Value v; v.undefined_name = std::move(what); return v; }
  Value(bool x) : kind(Bool), b(x) {}
  Value(int x) : kind(Int), i(x) {}
  Value(int64_t x) : kind(Int), i(x) {}
  Value(size_t x) : kind(Int), i(int64_t(x)) {}
  Value(double x) : kind(Float), f(x) {}
  Value(std::string x) : kind(Str), s(std::move(x)) {}
  Value(std::string_view x) : kind(Str), s(x) {}
  Value(const char* x) : kind(Str), s(x) {}
  Value(Array x) : kind(Arr), a(std::make_shared<Array>(std::move(x))) {}
  Value(std::shared_ptr<Object> x) : kind(Obj), o(std::move(x)) {}
  Value(Function f) : kind(Fn), fn(std::make_shared<Function>(std::move(f))) {}

  bool is_undef() const { return kind == Undefined; }
  bool is_num() const { return kind == Int || kind == Float || kind == Bool; }
  double num() const { return kind == Float ? f : kind == Int ? double(i) : double(b); }
  bool truthy() const;
};

struct Object {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;
  const Value* get(std::string_view k) const {
    for (auto& [key, v] : items)
      if (key == k) return &v;
    return nullptr;
  }
  void set(const std::string& k, Value v) {
    for (auto& [key, old] : items)
      if (key == k) {
        old = std::move(v);
        return;
      }
    items.emplace_back(k, std::move(v));
  }
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Argument by position or keyword; Undefined when absent.
  Value get(size_t idx, std::string_view name) const {
    for (auto& [k, v] : kw)
      if (k == name) return v;
    return idx < pos.size() ? pos[idx] : Value::undef();
  }
};

// InputError when a string of n bytes would pass kMaxStringBytes; `what` names it.
void check_length(size_t n, const char* what = "a string");

Value from_json(const nlohmann::ordered_json& j);
nlohmann::ordered_json to_json(const Value& v);
// Python str() of a value (what {{ }} prints).
std::string to_str(const Value& v);
// Python repr() of a value.
std::string repr(const Value& v);
// json.dumps(v, ensure_ascii=False, indent=indent, separators=..., sort_keys=...) as Python writes it.
std::string dumps(const Value& v, int indent, const std::string& item_sep, const std::string& key_sep, bool sort_keys,
                  int depth = 0);
// Python repr of a float ("1.0", "0.1", "1e-05", "inf").
std::string float_repr(double d);

}  // namespace lily::text::jinja
