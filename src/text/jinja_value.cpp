#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "text/jinja_value.h"

#include "core/error.h"
#include "text/utf8.h"

namespace lily::text::jinja {

bool Value::truthy() const {
  switch (kind) {
    case Undefined:
    case None: return false;
    case Bool: return b;
    case Int: return i != 0;
    case Float: return f != 0;
    case Str: return !s.empty();
    case Arr: return !a->empty();
    case Obj: return !o->items.empty();
    case Fn: return true;
  }
  return false;
}

namespace {
// Recursion bound for converting and printing nested values.
constexpr int kMaxDepth = 512;
struct DepthGuard {
  static inline thread_local int depth = 0;
  DepthGuard() {
    if (depth >= kMaxDepth) throw InputError("value nested more than 512 levels deep");
    ++depth;
  }
  ~DepthGuard() { --depth; }
};
}  // namespace

void check_length(size_t n, const char* what) {
  if (n > kMaxStringBytes) throw InputError(std::string(what) + " would be longer than 64 MiB");
}

Value from_json(const nlohmann::ordered_json& j) {
  DepthGuard guard;
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: return Value(int64_t(j.get<uint64_t>()));
    case nlohmann::json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      Array a;
      a.reserve(j.size());
      for (auto& x : j) a.push_back(from_json(x));
      return Value(std::move(a));
    }
    case nlohmann::json::value_t::object: {
      auto o = std::make_shared<Object>();
      for (auto it = j.begin(); it != j.end(); ++it) o->items.emplace_back(it.key(), from_json(it.value()));
      return Value(o);
    }
    default: return Value::none();
  }
}

nlohmann::ordered_json to_json(const Value& v) {
  switch (v.kind) {
    case Value::Undefined:
    case Value::None:
    case Value::Fn: return nullptr;
    case Value::Bool: return v.b;
    case Value::Int: return v.i;
    case Value::Float: return v.f;
    case Value::Str: return v.s;
    case Value::Arr: {
      auto j = nlohmann::ordered_json::array();
      for (auto& x : *v.a) j.push_back(to_json(x));
      return j;
    }
    case Value::Obj: {
      auto j = nlohmann::ordered_json::object();
      for (auto& [k, x] : v.o->items) j[k] = to_json(x);
      return j;
    }
  }
  return nullptr;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // e.g. "-1.2345e+02"
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  auto e = sci.find('e');
  int exp = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : sci.substr(0, e))
    if (c != '.') digits += c;
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp >= 0) {
      if (int(digits.size()) <= exp + 1) out = digits + std::string(exp + 1 - digits.size(), '0') + ".0";
      else out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    } else {
      out = "0." + std::string(-exp - 1, '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1, std::string::npos);
    }
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return neg ? "-" + out : out;
}

static std::string str_repr(const std::string& s) {
  bool has_sq = s.find('\'') != std::string::npos, has_dq = s.find('"') != std::string::npos;
  char q = has_sq && !has_dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == q || c == '\\') out += '\\', out += char(c);
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7F) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else out += char(c);
  }
  return out + q;
}

std::string repr(const Value& v) {
  DepthGuard guard;
  switch (v.kind) {
    case Value::Str: return str_repr(v.s);
    case Value::Arr: {
      std::string out = "[";
      for (size_t k = 0; k < v.a->size(); ++k) {
        out += (k ? ", " : "") + repr((*v.a)[k]);
        check_length(out.size(), "a printed list");
      }
      return out + "]";
    }
    case Value::Obj: {
      std::string out = "{";
      bool first = true;
      for (auto& [k, x] : v.o->items) {
        out += (first ? "" : ", ") + str_repr(k) + ": " + repr(x);
        check_length(out.size(), "a printed dict");
        first = false;
      }
      return out + "}";
    }
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Undefined: return "";
    case Value::None: return "None";
    case Value::Bool: return v.b ? "True" : "False";
    case Value::Int: return std::to_string(v.i);
    case Value::Float: return float_repr(v.f);
    case Value::Str: return v.s;
    case Value::Arr:
    case Value::Obj: return repr(v);
    case Value::Fn: return "<function>";
  }
  return "";
}

static void json_str(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

std::string dumps(const Value& v, int indent, const std::string& item_sep, const std::string& key_sep, bool sort_keys,
                  int depth) {
  DepthGuard guard;
  std::string out;
  auto nl = [&](int d) {
    if (indent < 0) return;
    check_length(size_t(indent) * size_t(d) + out.size(), "tojson output");
    out += '\n';
    out.append(size_t(indent) * size_t(d), ' ');
  };
  switch (v.kind) {
    case Value::Undefined:
    case Value::None:
    case Value::Fn: return "null";
    case Value::Bool: return v.b ? "true" : "false";
    case Value::Int: return std::to_string(v.i);
    case Value::Float:
      if (std::isnan(v.f)) return "NaN";
      if (std::isinf(v.f)) return v.f > 0 ? "Infinity" : "-Infinity";
      return float_repr(v.f);
    case Value::Str: json_str(out, v.s); return out;
    case Value::Arr:
      if (v.a->empty()) return "[]";
      out += '[';
      for (size_t k = 0; k < v.a->size(); ++k) {
        if (k) out += item_sep;
        nl(depth + 1);
        out += dumps((*v.a)[k], indent, item_sep, key_sep, sort_keys, depth + 1);
        check_length(out.size(), "tojson output");
      }
      nl(depth);
      return out + ']';
    case Value::Obj: {
      if (v.o->items.empty()) return "{}";
      std::vector<const std::pair<std::string, Value>*> items;
      for (auto& it : v.o->items) items.push_back(&it);
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* x, auto* y) { return x->first < y->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += item_sep;
        nl(depth + 1);
        json_str(out, items[k]->first);
        out += key_sep;
        out += dumps(items[k]->second, indent, item_sep, key_sep, sort_keys, depth + 1);
        check_length(out.size(), "tojson output");
      }
      nl(depth);
      return out + '}';
    }
  }
  return "null";
}

}  // namespace lily::text::jinja
