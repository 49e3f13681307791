// Jinja's builtin filters ({{ x | tojson }}) and tests ({% if x is defined %}).
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>

#include "text/jinja_interp.h"
#include "text/jinja_number.h"
#include "text/utf8.h"

namespace lily::text::jinja::detail {

// jinja2's int filter: int(s, base) for strings, int(v) otherwise, then int(float(v)), then `def`
// (also for inf and nan). Python's big ints are out of range here: an error.
Value Interp::to_int(const Node& n, const Value& v, const Value& def, int base) const {
  auto from_float = [&](double d) -> Value {
    if (!std::isfinite(d)) return def;
    auto r = float_to_int(d);
    if (!r) error(n, "int: " + float_repr(d) + " is outside the 64-bit integer range");
    return Value(*r);
  };
  switch (v.kind) {
    case Value::Int: return v;
    case Value::Bool: return Value(int64_t(v.b));
    case Value::Float: return from_float(v.f);
    case Value::Str: {
      bool overflow = false;
      if (auto r = parse_int(v.s, base, overflow)) return Value(*r);
      if (overflow) error(n, "int: '" + v.s + "' is outside the 64-bit integer range");
      if (auto d = parse_float(v.s)) return from_float(*d);
      return def;
    }
    default: return def;
  }
}

// Attribute path "a.b" for selectattr/map/sort/join/groupby.
Value Interp::attr_path(const Node& n, const Value& v, const std::string& path) const {
  Value cur = v;
  size_t s = 0;
  while (true) {
    size_t e = path.find('.', s);
    std::string part = path.substr(s, e == std::string::npos ? std::string::npos : e - s);
    if (cur.is_undef()) return cur;
    int64_t idx = 0;
    const bool is_index = !part.empty() && std::isdigit(uint8_t(part[0]));
    // An index too large for int64 is past every list: undefined, as Python's getitem fails.
    if (is_index && std::from_chars(part.data(), part.data() + part.size(), idx).ec != std::errc()) return Value::undef(part);
    cur = get_item(n, cur, is_index ? Value(idx) : Value(part));
    if (e == std::string::npos) return cur;
    s = e + 1;
  }
}

// jinja2's round(value, precision=0, method='common'): 'common' is Python's round (half to even; an
// int stays an int), 'ceil' / 'floor' scale by 10**precision and give a float.
Value Interp::round_filter(const Node& n, const Value& v, CallArgs& a) const {
  Value p = a.get(0, "precision"), m = a.get(1, "method");
  if (!p.is_undef() && p.kind != Value::Int) error(n, "round: precision must be an integer");
  int64_t prec = p.is_undef() ? 0 : p.i;
  std::string method = m.is_undef() ? "common" : to_str(m);
  if (method != "common" && method != "ceil" && method != "floor")
    error(n, "round: method must be common, ceil or floor (got '" + method + "')");
  if (!v.is_num()) error(n, std::string("round expects a number, got ") + type_name(v));
  if (method == "common") {
    if (v.kind == Value::Float) return Value(round_half_even(v.f, prec));
    auto r = round_int(v.kind == Value::Int ? v.i : v.b, prec);
    if (!r) error(n, "integer overflow in round (result outside 64 bits)");
    return Value(*r);
  }
  double scale = std::pow(10.0, double(prec)), x = v.num() * scale;
  // + 0.0: Python's math.ceil gives the int 0, never -0.0.
  return Value(((method == "floor" ? std::floor(x) : std::ceil(x)) + 0.0) / scale);
}

// The key sort / dictsort / min / max compare by: the attribute path if given, strings lowered unless
// case_sensitive.
Value Interp::sort_key(const Node& n, const Value& x, const Value& attr, bool case_sensitive) const {
  Value k = attr.kind == Value::Str ? attr_path(n, x, attr.s) : x;
  if (!case_sensitive && k.kind == Value::Str) return Value(case_map(k.s, 0));
  return k;
}

Value Interp::apply_filter(const Node& n, const std::string& f, const Value& v, CallArgs& a, Ctx& c) const {
  if (f == "tojson") {
    Value ind = a.get(0, "indent");
    int indent = ind.kind == Value::Int ? int(ind.i) : -1;
    Value sep = a.get(SIZE_MAX, "separators");
    std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
    if (sep.kind == Value::Arr && sep.a->size() == 2) {
      item_sep = to_str((*sep.a)[0]);
      key_sep = to_str((*sep.a)[1]);
    }
    return Value(dumps(v, indent, item_sep, key_sep, a.get(SIZE_MAX, "sort_keys").truthy()));
  }
  if (f == "safe" || f == "e" || f == "escape" || f == "forceescape") {
    if (f == "safe") return v;
    std::string out;
    for (char ch : to_str(v)) {
      switch (ch) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&#34;"; break;
        case '\'': out += "&#39;"; break;
        default: out += ch;
      }
    }
    return Value(out);
  }
  if (f == "string") return v.kind == Value::Str ? v : Value(to_str(v));
  if (f == "trim") return Value(strip_chars(to_str(v), a.get(0, "chars"), true, true));
  if (f == "upper") return Value(case_map(to_str(v), 1));
  if (f == "lower") return Value(case_map(to_str(v), 0));
  if (f == "title") return Value(case_map(to_str(v), 2));
  if (f == "capitalize") return Value(case_map(to_str(v), 3));
  if (f == "length" || f == "count") {
    switch (v.kind) {
      case Value::Str: return Value(int64_t(utf8_length(v.s)));
      case Value::Arr: return Value(int64_t(v.a->size()));
      case Value::Obj: return Value(int64_t(v.o->items.size()));
      case Value::Undefined: return Value(int64_t(0));
      default: error(n, std::string("object of type '") + type_name(v) + "' has no len()");
    }
  }
  if (f == "default" || f == "d") {
    bool boolean = a.get(1, "boolean").truthy();
    if (v.is_undef() || (boolean && !v.truthy())) {
      Value d = a.get(0, "default_value");
      return d.is_undef() ? Value("") : d;
    }
    return v;
  }
  if (f == "items") {
    if (v.is_undef()) return Value(Array{});
    if (v.kind != Value::Obj) error(n, "items filter expects a mapping");
    CallArgs none;
    return call_method(n, v, "items", none);
  }
  if (f == "list") return Value(iterate(n, v));
  if (f == "first" || f == "last") {
    auto items = iterate(n, v);
    if (items.empty()) return Value::undef();
    return f == "first" ? items.front() : items.back();
  }
  if (f == "reverse") {
    if (v.kind == Value::Str) {
      auto cp = cps(v.s);
      std::reverse(cp.begin(), cp.end());
      return Value(from_cps(cp, 0, cp.size()));
    }
    auto items = iterate(n, v);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }
  if (f == "join") {
    Value sep = a.get(0, "d");
    Value attr = a.get(1, "attribute");
    std::string out;
    bool first = true;
    for (auto& x : iterate(n, v)) {
      if (!first) out += sep.kind == Value::Str ? sep.s : "";
      out += to_str(attr.kind == Value::Str ? attr_path(n, x, attr.s) : x);
      check_len(n, out.size(), "a joined string");
      first = false;
    }
    return Value(out);
  }
  if (f == "replace") {
    Value from = a.get(0, "old"), to = a.get(1, "new"), cnt = a.get(2, "count");
    return Value(replace(to_str(v), to_str(from), to_str(to), cnt.kind == Value::Int ? cnt.i : -1));
  }
  if (f == "int") {
    Value def = a.get(0, "default"), base = a.get(1, "base");
    if (!base.is_undef() && base.kind != Value::Int) error(n, "int: base must be an integer");
    return to_int(n, v, def.is_undef() ? Value(int64_t(0)) : def, base.is_undef() ? 10 : int(std::clamp<int64_t>(base.i, -1, 37)));
  }
  if (f == "float") {  // jinja2: float(v), else the default as given
    if (v.is_num()) return Value(v.num());
    if (v.kind == Value::Str)
      if (auto d = parse_float(v.s)) return Value(*d);
    Value d = a.get(0, "default");
    return d.is_undef() ? Value(0.0) : d;
  }
  if (f == "abs") {
    if (v.kind == Value::Int || v.kind == Value::Bool) {
      int64_t x = v.kind == Value::Int ? v.i : v.b;
      if (x == INT64_MIN) error(n, "integer overflow in abs (result outside 64 bits)");
      return Value(x < 0 ? -x : x);
    }
    if (v.kind == Value::Float) return Value(std::fabs(v.f));
    error(n, "abs expects a number");
  }
  if (f == "round") return round_filter(n, v, a);
  if (f == "unique") {
    Array r;
    for (auto& x : iterate(n, v)) {
      bool seen = false;
      for (auto& y : r) seen |= equal(x, y);
      if (!seen) r.push_back(x);
    }
    return Value(std::move(r));
  }
  if (f == "sum") {
    Value attr = a.get(0, "attribute");
    Value acc = a.get(1, "start");
    if (acc.is_undef()) acc = Value(int64_t(0));
    for (auto& x : iterate(n, v)) acc = binop(n, "+", acc, attr.kind == Value::Str ? attr_path(n, x, attr.s) : x);
    return acc;
  }
  if (f == "min" || f == "max") {  // min(value, case_sensitive=False, attribute=None): the first extreme
    auto items = iterate(n, v);
    if (items.empty()) return Value::undef();
    bool cs = a.get(0, "case_sensitive").truthy();
    Value attr = a.get(1, "attribute");
    size_t best = 0;
    Value best_key = sort_key(n, items[0], attr, cs);
    for (size_t k = 1; k < items.size(); ++k) {
      Value key = sort_key(n, items[k], attr, cs);
      int r = compare(n, key, best_key);
      if (f == "min" ? r < 0 : r > 0) best = k, best_key = std::move(key);
    }
    return items[best];
  }
  if (f == "sort") {  // sort(value, reverse=False, case_sensitive=False, attribute=None)
    bool rev = a.get(0, "reverse").truthy(), cs = a.get(1, "case_sensitive").truthy();
    Value attr = a.get(2, "attribute");
    auto items = iterate(n, v);
    std::vector<std::pair<Value, Value>> keyed;
    for (auto& x : items) keyed.emplace_back(sort_key(n, x, attr, cs), x);
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
      int r = compare(n, x.first, y.first);
      return rev ? r > 0 : r < 0;
    });
    Array r;
    for (auto& [k, x] : keyed) r.push_back(std::move(x));
    return Value(std::move(r));
  }
  if (f == "dictsort") {  // dictsort(value, case_sensitive=False, by='key', reverse=False) -> [key, value] pairs
    if (v.kind != Value::Obj) error(n, std::string("dictsort expects a mapping, got ") + type_name(v));
    bool cs = a.get(0, "case_sensitive").truthy(), rev = a.get(2, "reverse").truthy();
    Value by = a.get(1, "by");
    std::string by_s = by.is_undef() ? "key" : to_str(by);
    if (by_s != "key" && by_s != "value") error(n, "dictsort: you can only sort by either 'key' or 'value'");
    size_t pos = by_s == "value" ? 1 : 0;
    CallArgs none;
    Array items = *call_method(n, v, "items", none).a;
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      int r = compare(n, sort_key(n, (*x.a)[pos], Value::undef(), cs), sort_key(n, (*y.a)[pos], Value::undef(), cs));
      return rev ? r > 0 : r < 0;
    });
    return Value(std::move(items));
  }
  if (f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") {
    bool attr_mode = f == "selectattr" || f == "rejectattr";
    bool keep_when = f == "selectattr" || f == "select";
    Array r;
    std::string attr = attr_mode ? to_str(a.get(0, "attribute")) : "";
    size_t test_idx = attr_mode ? 1 : 0;
    Value test = test_idx < a.pos.size() ? a.pos[test_idx] : Value::undef();
    CallArgs targs;
    for (size_t k = test_idx + 1; k < a.pos.size(); ++k) targs.pos.push_back(a.pos[k]);
    for (auto& x : iterate(n, v)) {
      Value subj = attr_mode ? attr_path(n, x, attr) : x;
      bool ok = test.is_undef() ? subj.truthy() : apply_test(n, to_str(test), subj, targs);
      if (ok == keep_when) r.push_back(x);
    }
    return Value(std::move(r));
  }
  if (f == "map") {
    Array r;
    Value attr = a.get(SIZE_MAX, "attribute");
    if (attr.kind == Value::Str) {
      Value def = a.get(SIZE_MAX, "default");
      for (auto& x : iterate(n, v)) {
        Value y = attr_path(n, x, attr.s);
        r.push_back(y.is_undef() && !def.is_undef() ? def : y);
      }
      return Value(std::move(r));
    }
    if (a.pos.empty()) error(n, "map needs a filter name or attribute=");
    std::string fname = to_str(a.pos[0]);
    CallArgs fargs;
    for (size_t k = 1; k < a.pos.size(); ++k) fargs.pos.push_back(a.pos[k]);
    fargs.kw = a.kw;
    for (auto& x : iterate(n, v)) r.push_back(apply_filter(n, fname, x, fargs, c));
    return Value(std::move(r));
  }
  if (f == "indent") {
    Value w = a.get(0, "width");
    const int64_t width = w.kind == Value::Int ? std::max<int64_t>(w.i, 0) : 4;  // Python pads nothing below 0
    check_len(n, uint64_t(width), "an indent");
    std::string pad = w.kind == Value::Str ? w.s : std::string(size_t(width), ' ');
    bool first = a.get(1, "first").truthy(), blank = a.get(2, "blank").truthy();
    std::string s = to_str(v), out;
    size_t line = 0, b = 0;
    while (b <= s.size()) {
      size_t e = s.find('\n', b);
      std::string ln = s.substr(b, e == std::string::npos ? std::string::npos : e - b);
      if ((line > 0 || first) && (blank || !ln.empty())) out += pad;
      out += ln;
      check_len(n, out.size(), "an indented string");
      if (e == std::string::npos) break;
      out += '\n';
      b = e + 1;
      ++line;
    }
    return Value(out);
  }
  if (f == "wordcount") return Value(int64_t(split(to_str(v), Value::undef(), -1).size()));
  if (f == "attr") return get_attr(n, v, to_str(a.get(0, "name")));
  if (f == "batch") {
    Value lc = to_int(n, a.get(0, "linecount"), Value(int64_t(1)), 10);
    int64_t size = lc.kind == Value::Int ? lc.i : 1;
    if (size <= 0) error(n, "batch size must be positive");
    Array r, cur;
    for (auto& x : iterate(n, v)) {
      cur.push_back(x);
      if (int64_t(cur.size()) == size) r.push_back(Value(std::move(cur))), cur.clear();
    }
    if (!cur.empty()) {
      Value fill = a.get(1, "fill_with");
      if (!fill.is_undef())
        while (int64_t(cur.size()) < size) cur.push_back(fill);
      r.push_back(Value(std::move(cur)));
    }
    return Value(std::move(r));
  }
  (void)c;
  error(n, "unknown filter '" + f + "'");
}

bool Interp::apply_test(const Node& n, const std::string& t, const Value& v, CallArgs& a) const {
  Value arg = a.get(0, "other");
  if (t == "defined") return !v.is_undef();
  if (t == "undefined") return v.is_undef();
  if (t == "none") return v.kind == Value::None;
  if (t == "boolean") return v.kind == Value::Bool;
  if (t == "false") return v.kind == Value::Bool && !v.b;
  if (t == "true") return v.kind == Value::Bool && v.b;
  if (t == "integer") return v.kind == Value::Int;
  if (t == "float") return v.kind == Value::Float;
  if (t == "number") return v.kind == Value::Int || v.kind == Value::Float || v.kind == Value::Bool;
  if (t == "string") return v.kind == Value::Str;
  if (t == "mapping") return v.kind == Value::Obj;
  if (t == "iterable") return v.kind == Value::Arr || v.kind == Value::Obj || v.kind == Value::Str;
  if (t == "sequence") return v.kind == Value::Arr || v.kind == Value::Obj || v.kind == Value::Str;
  if (t == "callable") return v.kind == Value::Fn;
  if (t == "odd" || t == "even") {
    if (v.kind != Value::Int) error(n, "'" + t + "' test expects an integer");
    return (((v.i % 2) + 2) % 2 == 1) == (t == "odd");
  }
  if (t == "divisibleby") {
    if (v.kind != Value::Int || arg.kind != Value::Int || arg.i == 0) error(n, "divisibleby expects non-zero integers");
    return v.i % arg.i == 0;
  }
  if (t == "eq" || t == "equalto" || t == "==") return equal(v, arg);
  if (t == "ne" || t == "!=") return !equal(v, arg);
  if (t == "lt" || t == "lessthan" || t == "<") return compare(n, v, arg) < 0;
  if (t == "le" || t == "<=") return compare(n, v, arg) <= 0;
  if (t == "gt" || t == "greaterthan" || t == ">") return compare(n, v, arg) > 0;
  if (t == "ge" || t == ">=") return compare(n, v, arg) >= 0;
  if (t == "in") return contains(n, arg, v);
  if (t == "sameas") return v.kind == arg.kind && (v.kind == Value::None || v.kind == Value::Undefined ? true : equal(v, arg));
  if (t == "lower") return v.kind == Value::Str && case_map(v.s, 0) == v.s;
  if (t == "upper") return v.kind == Value::Str && case_map(v.s, 1) == v.s;
  if (t == "escaped") return false;
  error(n, "unknown test '" + t + "'");
}

}  // namespace lily::text::jinja::detail
