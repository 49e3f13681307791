// Python's str, dict and list methods as chat templates call them (s.strip(), d.items(), l.index(x), ...).
#include <cctype>
#include <charconv>
#include <cstdint>

#include <utf8proc.h>

#include "text/jinja_interp.h"
#include "text/utf8.h"

namespace lily::text::jinja::detail {

std::string Interp::strip_chars(const std::string& s, const Value& chars, bool left, bool right) {
  auto is_strip = [&](uint32_t cp) {
    if (chars.kind == Value::Str) {
      for (size_t k = 0; k < chars.s.size();)
        if (next_cp(chars.s, k) == cp) return true;
      return false;
    }
    return cp == ' ' || (cp >= 9 && cp <= 13) || (cp >= 0x1C && cp <= 0x1F) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
  };
  auto v = cps(s);
  size_t b = 0, e = v.size();
  if (left)
    while (b < e && is_strip(v[b])) ++b;
  if (right)
    while (e > b && is_strip(v[e - 1])) --e;
  return from_cps(v, b, e);
}

std::string Interp::case_map(const std::string& s, int mode) {
  std::string out;
  bool prev_cased = false;
  size_t idx = 0;
  for (size_t k = 0; k < s.size(); ++idx) {
    uint32_t cp = next_cp(s, k);
    int32_t r;
    if (mode == 0) r = utf8proc_tolower(int32_t(cp));
    else if (mode == 1) r = utf8proc_toupper(int32_t(cp));
    else if (mode == 2) r = prev_cased ? utf8proc_tolower(int32_t(cp)) : utf8proc_totitle(int32_t(cp));
    else r = idx == 0 ? utf8proc_totitle(int32_t(cp)) : utf8proc_tolower(int32_t(cp));
    auto cat = utf8proc_category(int32_t(cp));
    prev_cased = cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
    append_utf8(out, uint32_t(r));
  }
  return out;
}

std::vector<std::string> Interp::split(const std::string& s, const Value& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep.kind == Value::Str) {
    size_t start = 0;
    while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
      size_t p = s.find(sep.s, start);
      if (p == std::string::npos) break;
      out.push_back(s.substr(start, p - start));
      start = p + sep.s.size();
    }
    out.push_back(s.substr(start));
    return out;
  }
  size_t k = 0;
  auto ws = [](char ch) { return ch == ' ' || (ch >= 9 && ch <= 13); };
  while (true) {
    while (k < s.size() && ws(s[k])) ++k;
    if (k >= s.size()) break;
    if (maxsplit >= 0 && int64_t(out.size()) >= maxsplit) {
      std::string rest = s.substr(k);
      while (!rest.empty() && ws(rest.back())) rest.pop_back();
      out.push_back(rest);
      break;
    }
    size_t b = k;
    while (k < s.size() && !ws(s[k])) ++k;
    out.push_back(s.substr(b, k - b));
  }
  return out;
}

Value Interp::call_method(const Node& n, const Value& obj, const std::string& m, CallArgs& a) const {
  auto str_arg = [&](size_t i, const char* nm) -> std::string {
    Value v = a.get(i, nm);
    if (v.kind != Value::Str) error(n, "." + m + "() expects a string argument");
    return v.s;
  };
  if (obj.kind == Value::Str) {
    const std::string& s = obj.s;
    if (m == "strip") return Value(strip_chars(s, a.get(0, "chars"), true, true));
    if (m == "lstrip") return Value(strip_chars(s, a.get(0, "chars"), true, false));
    if (m == "rstrip") return Value(strip_chars(s, a.get(0, "chars"), false, true));
    if (m == "upper") return Value(case_map(s, 1));
    if (m == "lower") return Value(case_map(s, 0));
    if (m == "title") return Value(case_map(s, 2));
    if (m == "capitalize") return Value(case_map(s, 3));
    if (m == "startswith" || m == "endswith") {
      Value p = a.get(0, "prefix");
      std::vector<std::string> opts;
      if (p.kind == Value::Str) opts.push_back(p.s);
      else if (p.kind == Value::Arr)
        for (auto& x : *p.a) {
          if (x.kind != Value::Str) error(n, "." + m + "() expects strings");
          opts.push_back(x.s);
        }
      else error(n, "." + m + "() expects a string or a tuple of strings");
      for (auto& o : opts) {
        if (m == "startswith" ? s.compare(0, o.size(), o) == 0
                              : (s.size() >= o.size() && s.compare(s.size() - o.size(), o.size(), o) == 0))
          return Value(true);
      }
      return Value(false);
    }
    if (m == "split" || m == "rsplit") {
      Value sep = a.get(0, "sep");
      Value mx = a.get(1, "maxsplit");
      int64_t maxsplit = mx.kind == Value::Int ? mx.i : -1;
      if (sep.kind == Value::Str && sep.s.empty()) error(n, "empty separator");
      std::vector<std::string> parts;
      if (m == "rsplit" && maxsplit >= 0 && sep.kind == Value::Str) {
        std::string rest = s;
        while (int64_t(parts.size()) < maxsplit) {
          size_t p = rest.rfind(sep.s);
          if (p == std::string::npos) break;
          parts.insert(parts.begin(), rest.substr(p + sep.s.size()));
          rest.resize(p);
        }
        parts.insert(parts.begin(), rest);
      } else {
        parts = split(s, sep, maxsplit);
      }
      Array r;
      for (auto& p : parts) r.emplace_back(p);
      return Value(std::move(r));
    }
    if (m == "splitlines") {
      Array r;
      size_t b = 0;
      for (size_t k = 0; k < s.size(); ++k) {
        if (s[k] == '\n' || s[k] == '\r') {
          r.emplace_back(s.substr(b, k - b));
          if (s[k] == '\r' && k + 1 < s.size() && s[k + 1] == '\n') ++k;
          b = k + 1;
        }
      }
      if (b < s.size()) r.emplace_back(s.substr(b));
      return Value(std::move(r));
    }
    if (m == "replace") {
      std::string from = str_arg(0, "old"), to = str_arg(1, "new");
      Value cnt = a.get(2, "count");
      return Value(replace(s, from, to, cnt.kind == Value::Int ? cnt.i : -1));
    }
    if (m == "find" || m == "rfind" || m == "index" || m == "count") {
      std::string sub = str_arg(0, "sub");
      if (m == "count") {
        if (sub.empty()) return Value(int64_t(utf8_length(s) + 1));
        int64_t k = 0;
        for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++k;
        return Value(k);
      }
      size_t p = m == "rfind" ? s.rfind(sub) : s.find(sub);
      if (p == std::string::npos) {
        if (m == "index") error(n, "substring not found");
        return Value(int64_t(-1));
      }
      return Value(int64_t(utf8_length(std::string_view(s).substr(0, p))));
    }
    if (m == "join") {
      Value it = a.get(0, "iterable");
      std::string out;
      bool first = true;
      for (auto& x : iterate(n, it)) {
        if (!first) out += s;
        out += to_str(x);
        check_len(n, out.size(), "a joined string");
        first = false;
      }
      return Value(out);
    }
    if (m == "isdigit" || m == "isalpha" || m == "isspace" || m == "isalnum" || m == "isupper" || m == "islower") {
      if (s.empty()) return Value(false);
      bool any_cased = false;
      for (size_t k = 0; k < s.size();) {
        auto cat = utf8proc_category(int32_t(next_cp(s, k)));
        bool L = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
        bool D = cat == UTF8PROC_CATEGORY_ND;
        bool S = cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_CC;
        if (m == "isdigit" && !D) return Value(false);
        if (m == "isalpha" && !L) return Value(false);
        if (m == "isalnum" && !L && !D) return Value(false);
        if (m == "isspace" && !S) return Value(false);
        if (m == "isupper" && cat == UTF8PROC_CATEGORY_LL) return Value(false);
        if (m == "islower" && (cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LT)) return Value(false);
        any_cased |= cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
      }
      if (m == "isupper" || m == "islower") return Value(any_cased);
      return Value(true);
    }
    if (m == "format") {
      std::string out;
      size_t auto_idx = 0;
      for (size_t k = 0; k < s.size(); ++k) {
        if (s[k] == '{' && k + 1 < s.size() && s[k + 1] == '{') out += '{', ++k;
        else if (s[k] == '}' && k + 1 < s.size() && s[k + 1] == '}') out += '}', ++k;
        else if (s[k] == '{') {
          size_t e = s.find('}', k);
          if (e == std::string::npos) error(n, "bad format string");
          std::string key = s.substr(k + 1, e - k - 1);
          Value v;
          if (key.empty()) v = auto_idx < a.pos.size() ? a.pos[auto_idx++] : Value::undef();
          else if (std::isdigit(uint8_t(key[0]))) {
            size_t idx = SIZE_MAX;  // past the arguments when the index does not fit
            std::from_chars(key.data(), key.data() + key.size(), idx);
            v = idx < a.pos.size() ? a.pos[idx] : Value::undef();
          } else v = a.get(SIZE_MAX, key);
          out += to_str(v);
          check_len(n, out.size(), "a formatted string");
          k = e;
        } else out += s[k];
      }
      return Value(out);
    }
  }
  if (obj.kind == Value::Obj) {
    if (m == "get") {
      if (a.pos.empty() || a.pos[0].kind != Value::Str) return a.pos.size() > 1 ? a.pos[1] : Value::none();
      if (auto* v = obj.o->get(a.pos[0].s)) return *v;
      return a.pos.size() > 1 ? a.pos[1] : Value::none();
    }
    if (m == "items" || m == "keys" || m == "values") {
      Array r;
      for (auto& [k, v] : obj.o->items) {
        if (m == "items") r.push_back(Value(Array{Value(k), v}));
        else if (m == "keys") r.emplace_back(k);
        else r.push_back(v);
      }
      return Value(std::move(r));
    }
  }
  if (obj.kind == Value::Arr) {
    if (m == "index") {
      for (size_t k = 0; k < obj.a->size(); ++k)
        if (equal((*obj.a)[k], a.get(0, "value"))) return Value(int64_t(k));
      error(n, "value is not in list");
    }
    if (m == "count") {
      int64_t k = 0;
      for (auto& x : *obj.a) k += equal(x, a.get(0, "value"));
      return Value(k);
    }
    if (m == "append" || m == "extend" || m == "pop" || m == "insert" || m == "remove")
      error(n, "lists are immutable in chat templates (." + m + "() is not allowed)");
  }
  error(n, std::string("'") + type_name(obj) + "' object has no method '" + m + "'");
}

std::string Interp::replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) {
    std::string out;
    int64_t done = 0;
    auto v = cps(s);
    for (size_t k = 0; k <= v.size(); ++k) {
      if (count < 0 || done < count) out += to, ++done;
      if (k < v.size()) append_utf8(out, v[k]);
      check_length(out.size(), "a replaced string");
    }
    return out;
  }
  std::string out;
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t p = s.find(from, start);
    if (p == std::string::npos) break;
    out.append(s, start, p - start);
    out += to;
    check_length(out.size(), "a replaced string");
    start = p + from.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

}  // namespace lily::text::jinja::detail
