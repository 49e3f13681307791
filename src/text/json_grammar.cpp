#include "text/json_grammar.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "core/error.h"

namespace lily::text {

using json = nlohmann::ordered_json;
using Seq = Grammar::Seq;
using RuleId = Grammar::RuleId;

namespace {

constexpr int kIndent = 16, kIntDigits = 16, kFracDigits = 16, kExpDigits = 2;
constexpr int64_t kMaxRepeat = 4096;      // largest bounded count unrolled into rules
constexpr int kMaxNesting = 256;          // schemas inside schemas, counting allOf and $ref expansions
constexpr size_t kMaxRules = size_t(1) << 19;  // grammar rules one builder (a request's schemas) may add
constexpr size_t kMaxProperties = 4096;        // properties of one object schema (after allOf merges)

std::string pointer_child(const std::string& where, const std::string& key) { return where + "/" + key; }

}  // namespace

struct JsonGrammarBuilder::Impl {
  Grammar& g;
  int counter = 0;
  std::optional<RuleId> ws_, sep_, str_char_, string_, number_, integer_, value_, object_, array_;
  std::optional<RuleId> plain_key_char_;
  const json* root = nullptr;
  std::string root_where;  // names the root schema in errors; a $ref target is root_where + its pointer
  std::map<std::string, RuleId> refs;
  int nesting = 0;
  size_t rules_at_start;  // the grammar's rules before this builder: kMaxRules counts the rest

  explicit Impl(Grammar& gr) : g(gr), rules_at_start(gr.rules()) {}

  std::string fresh(const std::string& base) { return fmt::format("{}-{}", base, counter++); }
  Seq lit(std::string_view s) { return g.lit(s); }
  Grammar::Symbol set(const ByteSet& s) { return g.bytes(s); }
  static Grammar::Symbol ref(RuleId r) { return Grammar::ref(r); }

  // item{0, n} as nested optional rules (n < 0: unbounded).
  RuleId up_to(const std::string& name, const Seq& item, int64_t n) {
    if (n < 0) {
      RuleId r = g.rule(fresh(name));
      g.alt(r, {});
      g.alt(r, cat({item, {ref(r)}}));
      return r;
    }
    RuleId r = g.rule(fresh(name), {{}});
    for (int64_t k = 1; k <= n; ++k) {
      RuleId next = g.rule(fresh(name));
      g.alt(next, {});
      g.alt(next, cat({item, {ref(r)}}));
      r = next;
    }
    return r;
  }
  // item{lo, hi} (hi < 0: unbounded).
  Seq repeat(const std::string& name, const Seq& item, int64_t lo, int64_t hi) {
    Seq s;
    for (int64_t i = 0; i < lo; ++i) s.insert(s.end(), item.begin(), item.end());
    if (hi < 0 || hi > lo) s.push_back(ref(up_to(name, item, hi < 0 ? -1 : hi - lo)));
    return s;
  }

  RuleId ws() {
    if (!ws_) {
      RuleId indent = up_to("indent", lit(" "), kIndent);
      ws_ = g.rule("ws", {{}, lit(" "), cat({lit("\n"), {ref(indent)}})});
    }
    return *ws_;
  }
  RuleId sep() {  // between members / items: the previous one ends with ws
    if (!sep_) sep_ = g.rule("sep", {cat({lit(","), {ref(ws())}})});
    return *sep_;
  }
  RuleId hex_nonsurrogate() {
    auto hex = set(ByteSet::range('0', '9').add('a', 'f').add('A', 'F'));
    auto no_d = set(ByteSet::range('0', '9').add('a', 'c').add('e', 'f').add('A', 'C').add('E', 'F'));
    return g.rule("hex4", {{no_d, hex, hex, hex}, {set(ByteSet::of('d').add('D')), set(ByteSet::range('0', '7')), hex, hex}});
  }
  RuleId str_char() {
    if (!str_char_) {
      ByteSet ascii = ByteSet::range(0x20, 0x7f);
      ascii.remove('"').remove('\\');
      RuleId u = utf8_char(g, "str-utf8", ascii);
      RuleId esc = g.rule("str-escape", {{set(ByteSet().add('"').add('\\').add('/').add('b').add('f').add('n').add('r').add('t'))},
                                         cat({lit("u"), {ref(hex_nonsurrogate())}})});
      str_char_ = g.rule("str-char", {{ref(u)}, cat({lit("\\"), {ref(esc)}})});
    }
    return *str_char_;
  }
  RuleId string(int64_t lo = 0, int64_t hi = -1) {
    if (lo == 0 && hi < 0 && string_) return *string_;
    RuleId r = g.rule(lo == 0 && hi < 0 ? std::string("string") : fresh("string"),
                      {cat({lit("\""), repeat("chars", {ref(str_char())}, lo, hi), lit("\"")})});
    if (lo == 0 && hi < 0) string_ = r;
    return r;
  }
  RuleId integer_part() {
    auto digit = set(ByteSet::range('0', '9'));
    return g.rule(fresh("int"), {lit("0"), cat({{set(ByteSet::range('1', '9'))}, {ref(up_to("digits", {digit}, kIntDigits - 1))}})});
  }
  RuleId integer() {
    if (!integer_) {
      RuleId ip = integer_part();
      integer_ = g.rule("integer", {{ref(ip)}, cat({lit("-"), {ref(ip)}})});
    }
    return *integer_;
  }
  RuleId number() {
    if (!number_) {
      auto digit = set(ByteSet::range('0', '9'));
      RuleId sign = g.rule("sign", {{}, lit("-")});
      RuleId frac = g.rule("frac", {{}, cat({lit("."), repeat("frac-digits", {digit}, 1, kFracDigits)})});
      RuleId exp_sign = g.rule("exp-sign", {{}, lit("+"), lit("-")});
      RuleId exp = g.rule("exp", {{}, cat({{set(ByteSet::of('e').add('E'))}, {ref(exp_sign)}, repeat("exp-digits", {digit}, 1, kExpDigits)})});
      number_ = g.rule("number", {{ref(sign), ref(integer_part()), ref(frac), ref(exp)}});
    }
    return *number_;
  }
  RuleId literal(const json& v) { return g.rule(fresh("literal"), {lit(v.dump())}); }
  RuleId one_of(const std::string& name, const std::vector<RuleId>& rs) {
    if (rs.size() == 1) return rs[0];
    std::vector<Seq> alts;
    for (RuleId r : rs) alts.push_back({ref(r)});
    return g.rule(fresh(name), std::move(alts));
  }

  // Generic JSON (any value, any object, any array), recursive.
  void generic() {
    if (value_) return;
    value_ = g.rule("value");
    object_ = g.rule("object");
    array_ = g.rule("array");
    Seq member = cat({{ref(string())}, {ref(ws())}, lit(":"), {ref(ws())}, {ref(*value_)}, {ref(ws())}});
    RuleId more_members = up_to("members", cat({{ref(sep())}, member}), -1);
    g.alt(*object_, cat({lit("{"), {ref(ws())}, lit("}")}));
    g.alt(*object_, cat({lit("{"), {ref(ws())}, member, {ref(more_members)}, lit("}")}));
    Seq item = {ref(*value_), ref(ws())};
    RuleId more_items = up_to("items", cat({{ref(sep())}, item}), -1);
    g.alt(*array_, cat({lit("["), {ref(ws())}, lit("]")}));
    g.alt(*array_, cat({lit("["), {ref(ws())}, item, {ref(more_items)}, lit("]")}));
    for (RuleId r : {*object_, *array_, string(), number()}) g.alt(*value_, {ref(r)});
    for (const char* w : {"true", "false", "null"}) g.alt(*value_, lit(w));
  }

  [[noreturn]] void bad(const std::string& where, const std::string& msg) { fail("{}: {}", where, msg); }
  // Refuses a schema whose grammar would pass kMaxRules with `more` rules added.
  void charge(const std::string& where, size_t more = 0) {
    if (g.rules() - rules_at_start + more > kMaxRules) bad(where, fmt::format("the schema compiles to more than {} grammar rules", kMaxRules));
  }

  // ---- schemas ----

  const json& resolve(const std::string& ref_str, const std::string& where) {
    if (ref_str == "#") return *root;
    if (ref_str.rfind("#/", 0) != 0) bad(where, fmt::format("$ref '{}' is not supported (only local references '#/...')", ref_str));
    try {
      const json& t = root->at(json::json_pointer(ref_str.substr(1)));
      if (!t.is_object() && !t.is_boolean()) bad(where, fmt::format("$ref '{}' points to {}, not a schema", ref_str, t.type_name()));
      return t;
    } catch (const InputError&) {
      throw;
    } catch (const std::exception&) {
      bad(where, fmt::format("$ref '{}' does not resolve", ref_str));
    }
  }

  // Shallow merge of `over` onto `base` (properties merged, required united); schemas may be booleans.
  static json merged(const json& base, const json& over) {
    if (base.is_boolean() || over.is_boolean()) {
      if (base == false || over == false) return false;
      return base.is_boolean() ? over : base;
    }
    json out = base;
    for (auto& [k, v] : over.items()) {
      if (k == "properties" && out.contains(k) && out[k].is_object() && v.is_object()) {
        for (auto& [pk, pv] : v.items()) out[k][pk] = pv;
      } else if (k == "required" && out.contains(k) && out[k].is_array() && v.is_array()) {
        for (auto& x : v)
          if (std::find(out[k].begin(), out[k].end(), x) == out[k].end()) out[k].push_back(x);
      } else {
        out[k] = v;
      }
    }
    return out;
  }

  RuleId compile(const json& s, const std::string& where) {
    struct Nest {
      int& n;
      explicit Nest(int& x) : n(++x) {}
      ~Nest() { --n; }
    } nest(nesting);
    if (nesting > kMaxNesting)
      bad(where, fmt::format("the schema nests deeper than {} levels (counting allOf and $ref; does it contain itself through allOf?)", kMaxNesting));
    charge(where);
    if (s.is_boolean()) {
      if (!s.get<bool>()) bad(where, "the schema 'false' matches nothing");
      generic();
      return *value_;
    }
    if (!s.is_object()) bad(where, "a schema must be an object or a boolean");
    if (auto it = s.find("$ref"); it != s.end()) {
      if (!it->is_string()) bad(pointer_child(where, "$ref"), "'$ref' must be a string");
      std::string r = it->get<std::string>();
      if (auto f = refs.find(r); f != refs.end()) return f->second;
      RuleId rule = g.rule(fresh("ref"));
      refs.emplace(r, rule);
      const json& target = resolve(r, pointer_child(where, "$ref"));
      json rest = s;
      rest.erase("$ref");
      RuleId body = compile(rest.empty() ? target : merged(target, rest), root_where + r.substr(1));
      g.alt(rule, {ref(body)});
      return rule;
    }
    if (auto it = s.find("allOf"); it != s.end()) {
      if (!it->is_array() || it->empty()) bad(pointer_child(where, "allOf"), "'allOf' must be a non-empty array of schemas");
      json m = s;
      m.erase("allOf");
      for (size_t i = 0; i < it->size(); ++i) {
        const json& sub = (*it)[i];
        if (!sub.is_object()) bad(fmt::format("{}/allOf/{}", where, i), "a schema must be an object");
        const std::string w = fmt::format("{}/allOf/{}", where, i);
        if (auto r = sub.find("$ref"); r != sub.end() && !r->is_string()) bad(pointer_child(w, "$ref"), "'$ref' must be a string");
        m = merged(m, sub.contains("$ref") ? resolve(sub["$ref"].get<std::string>(), w) : sub);
      }
      return compile(m, where);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      auto it = s.find(key);
      if (it == s.end()) continue;
      if (!it->is_array() || it->empty()) bad(pointer_child(where, key), fmt::format("'{}' must be a non-empty array of schemas", key));
      json base = s;
      base.erase(key);
      std::vector<RuleId> alts;
      for (size_t i = 0; i < it->size(); ++i) {
        const json& sub = (*it)[i];
        std::string w = fmt::format("{}/{}/{}", where, key, i);
        if (sub.is_boolean() || base.empty()) alts.push_back(compile(sub, w));
        else if (!sub.is_object()) bad(w, "a schema must be an object or a boolean");
        else alts.push_back(compile(merged(base, sub), w));
      }
      return one_of("any-of", alts);
    }
    if (auto it = s.find("const"); it != s.end()) return literal(*it);
    if (auto it = s.find("enum"); it != s.end()) {
      if (!it->is_array() || it->empty()) bad(pointer_child(where, "enum"), "'enum' must be a non-empty array");
      std::vector<RuleId> alts;
      for (auto& v : *it) alts.push_back(literal(v));
      return one_of("enum", alts);
    }
    std::vector<std::string> types;
    if (auto it = s.find("type"); it != s.end()) {
      auto check = [&](const json& t) {
        static const std::set<std::string> known = {"object", "array", "string", "number", "integer", "boolean", "null"};
        if (!t.is_string() || !known.count(t.get<std::string>()))
          bad(pointer_child(where, "type"), fmt::format("unknown type {} (expected object, array, string, number, integer, boolean or null)", t.dump()));
        types.push_back(t.get<std::string>());
      };
      if (it->is_array()) {
        if (it->empty()) bad(pointer_child(where, "type"), "'type' must not be an empty array");
        for (auto& t : *it) check(t);
      } else {
        check(*it);
      }
    } else if (s.contains("properties") || s.contains("required") || s.contains("additionalProperties")) {
      types = {"object"};
    } else if (s.contains("items") || s.contains("prefixItems") || s.contains("minItems") || s.contains("maxItems")) {
      types = {"array"};
    } else if (s.contains("minLength") || s.contains("maxLength")) {
      types = {"string"};
    } else {
      generic();
      return *value_;
    }
    if (auto it = s.find("nullable"); it != s.end() && it->is_boolean() && it->get<bool>()) types.push_back("null");
    std::vector<RuleId> alts;
    for (auto& t : types) {
      if (t == "object") alts.push_back(object(s, where));
      else if (t == "array") alts.push_back(array(s, where));
      else if (t == "string") alts.push_back(string_schema(s, where));
      else if (t == "number") alts.push_back(number());
      else if (t == "integer") alts.push_back(integer());
      else if (t == "boolean") alts.push_back(g.rule(fresh("boolean"), {lit("true"), lit("false")}));
      else alts.push_back(g.rule(fresh("null"), {lit("null")}));
    }
    return one_of("types", alts);
  }

  int64_t count(const json& s, const char* key, const std::string& where, int64_t dflt) {
    auto it = s.find(key);
    if (it == s.end() || it->is_null()) return dflt;
    if (!it->is_number_integer() || it->get<int64_t>() < 0)
      bad(pointer_child(where, key), fmt::format("'{}' must be a non-negative integer", key));
    int64_t v = it->get<int64_t>();
    if (v > kMaxRepeat) bad(pointer_child(where, key), fmt::format("'{}' above {} is not supported", key, kMaxRepeat));
    return v;
  }

  RuleId string_schema(const json& s, const std::string& where) {
    int64_t lo = count(s, "minLength", where, 0), hi = count(s, "maxLength", where, -1);
    if (hi >= 0 && hi < lo) bad(pointer_child(where, "maxLength"), "'maxLength' is below 'minLength'");
    return string(lo, hi);
  }

  RuleId array(const json& s, const std::string& where) {
    int64_t lo = count(s, "minItems", where, 0), hi = count(s, "maxItems", where, -1);
    if (hi >= 0 && hi < lo) bad(pointer_child(where, "maxItems"), "'maxItems' is below 'minItems'");
    std::vector<RuleId> prefix;
    if (auto it = s.find("prefixItems"); it != s.end()) {
      if (!it->is_array()) bad(pointer_child(where, "prefixItems"), "'prefixItems' must be an array of schemas");
      for (size_t i = 0; i < it->size(); ++i) prefix.push_back(compile((*it)[i], fmt::format("{}/prefixItems/{}", where, i)));
    }
    std::optional<RuleId> rest;  // items after the prefix; none: no more items
    auto it = s.find("items");
    if (it == s.end() || it->is_null()) {
      generic();
      rest = *value_;
    } else if (it->is_boolean() && !it->get<bool>()) {
      if (hi < 0 || hi > int64_t(prefix.size())) hi = int64_t(prefix.size());
    } else if (it->is_array()) {  // the pre-2020 tuple form
      for (size_t i = 0; i < it->size(); ++i) prefix.push_back(compile((*it)[i], fmt::format("{}/items/{}", where, i)));
      generic();
      rest = *value_;
    } else {
      rest = compile(*it, pointer_child(where, "items"));
    }
    if (!rest && lo > int64_t(prefix.size())) bad(pointer_child(where, "minItems"), "'minItems' exceeds the items the schema allows");
    // L(i): the items from position i on (i > 0: a separator first); L(0) is the list.
    auto item = [&](int64_t i) -> Seq {
      RuleId r = i < int64_t(prefix.size()) ? prefix[size_t(i)] : *rest;
      Seq s2;
      if (i > 0) s2.push_back(ref(sep()));
      s2.push_back(ref(r));
      s2.push_back(ref(ws()));
      return s2;
    };
    const int64_t p = int64_t(prefix.size());
    if (!rest) hi = hi < 0 ? p : std::min(hi, p);
    RuleId next;  // L(i + 1) while building L(i)
    int64_t from;
    if (hi < 0) {
      // Past the prefix and the minimum every position is alike and optional: a loop.
      from = std::max(lo, p);
      RuleId loop = g.rule(fresh("items"));
      g.alt(loop, {});
      g.alt(loop, cat({item(1), {ref(loop)}}));
      if (from == 0) next = g.rule(fresh("items"), {{}, cat({item(0), {ref(loop)}})});
      else next = loop;
    } else {
      from = hi;
      next = g.rule(fresh("items"), {{}});
    }
    for (int64_t i = from - 1; i >= 0; --i) {
      RuleId r = g.rule(fresh("items"));
      if (i >= lo) g.alt(r, {});
      g.alt(r, cat({item(i), {ref(next)}}));
      next = r;
    }
    return g.rule(fresh("array"), {cat({lit("["), {ref(ws())}, {ref(next)}, lit("]")})});
  }

  RuleId plain_key_char() {
    if (!plain_key_char_) {
      ByteSet ascii = ByteSet::range(0x20, 0x7f);
      ascii.remove('"').remove('\\');
      plain_key_char_ = utf8_char(g, "key-utf8", ascii);
    }
    return *plain_key_char_;
  }

  // A JSON string without escapes whose text is none of `names` (extra keys never repeat a declared one).
  RuleId key_except(const std::vector<std::string>& names, const std::string& where) {
    RuleId any_rest = up_to("key-chars", {ref(plain_key_char())}, -1);
    if (names.empty()) return g.rule(fresh("key"), {cat({lit("\""), {ref(any_rest)}, lit("\"")})});
    // A trie of the names: at a character boundary, either close the key where no name ends, follow a
    // name's byte, or leave the trie with a character no name continues with.
    struct TNode {
      std::map<uint8_t, size_t> next;
      bool end = false, boundary = true;
    };
    std::vector<TNode> t(1);
    for (auto& n : names) {
      size_t at = 0;
      for (size_t j = 0; j < n.size(); ++j) {
        const uint8_t c = uint8_t(n[j]);
        auto f = t[at].next.find(c);
        if (f == t[at].next.end()) {
          t.push_back({});
          t.back().boundary = j + 1 == n.size() || (uint8_t(n[j + 1]) & 0xC0) != 0x80;
          f = t[at].next.emplace(c, t.size() - 1).first;
        }
        at = f->second;
      }
      t[at].end = true;
    }
    charge(where, t.size());
    std::vector<RuleId> rule(t.size());
    for (size_t i = 0; i < t.size(); ++i) rule[i] = g.rule(fresh("key-trie"));
    ByteSet ascii = ByteSet::range(0x20, 0x7f);
    ascii.remove('"').remove('\\');
    RuleId mb = utf8_char(g, fresh("key-mb"), ByteSet());
    for (size_t i = 0; i < t.size(); ++i) {
      for (auto& [c, child] : t[i].next) g.alt(rule[i], {set(ByteSet::of(c)), ref(rule[child])});
      if (!t[i].boundary) continue;
      if (!t[i].end) g.alt(rule[i], lit("\""));
      ByteSet leave = ascii;
      bool multibyte_child = false;
      for (auto& [c, child] : t[i].next) {
        if (c < 0x80) leave.remove(c);
        else multibyte_child = true;
      }
      if (!leave.empty()) g.alt(rule[i], {set(leave), ref(any_rest), set(ByteSet::of('"'))});
      if (!multibyte_child) g.alt(rule[i], {ref(mb), ref(any_rest), set(ByteSet::of('"'))});
    }
    return g.rule(fresh("key"), {cat({lit("\""), {ref(rule[0])}})});
  }

  RuleId object(const json& s, const std::string& where) {
    json props = json::object();
    if (auto it = s.find("properties"); it != s.end() && !it->is_null()) {
      if (!it->is_object()) bad(pointer_child(where, "properties"), "'properties' must be an object");
      props = *it;
    }
    std::set<std::string> required;
    if (auto it = s.find("required"); it != s.end() && !it->is_null()) {
      if (!it->is_array()) bad(pointer_child(where, "required"), "'required' must be an array of strings");
      for (auto& r : *it) {
        if (!r.is_string()) bad(pointer_child(where, "required"), "'required' must be an array of strings");
        required.insert(r.get<std::string>());
        if (!props.contains(r.get<std::string>())) props[r.get<std::string>()] = json::object();
      }
    }
    std::optional<RuleId> extra_value;
    if (auto it = s.find("additionalProperties"); it != s.end() && !it->is_null()) {
      if (it->is_boolean()) {
        if (it->get<bool>()) {
          generic();
          extra_value = *value_;
        }
      } else if (it->is_object()) {
        extra_value = compile(*it, pointer_child(where, "additionalProperties"));
      } else {
        bad(pointer_child(where, "additionalProperties"), "'additionalProperties' must be a boolean or a schema");
      }
    }
    if (props.size() > kMaxProperties)
      bad(pointer_child(where, "properties"), fmt::format("more than {} properties in one object", kMaxProperties));
    std::vector<std::string> names;
    std::vector<Seq> members;
    std::vector<bool> req;
    for (auto& [k, v] : props.items()) {
      RuleId val = compile(v, pointer_child(pointer_child(where, "properties"), k));
      names.push_back(k);
      members.push_back(cat({lit(json(k).dump()), {ref(ws())}, lit(":"), {ref(ws())}, {ref(val)}, {ref(ws())}}));
      req.push_back(required.count(k) > 0);
    }
    const size_t n = names.size();
    // R[i][c]: members i.. (c: one was already written, so a separator comes first).
    std::vector<std::array<RuleId, 2>> R(n + 1);
    for (int c = 0; c < 2; ++c) {
      RuleId tail = g.rule(fresh("extra"));
      g.alt(tail, {});
      if (extra_value) {
        Seq kv = cat({{ref(key_except(names, where))}, {ref(ws())}, lit(":"), {ref(ws())}, {ref(*extra_value)}, {ref(ws())}});
        RuleId more = up_to("extras", cat({{ref(sep())}, kv}), -1);
        g.alt(tail, cat({c ? Seq{ref(sep())} : Seq{}, kv, {ref(more)}}));
      }
      R[n][size_t(c)] = tail;
    }
    for (size_t i = n; i-- > 0;)
      for (int c = 0; c < 2; ++c) {
        RuleId r = g.rule(fresh("members"));
        g.alt(r, cat({c ? Seq{ref(sep())} : Seq{}, members[i], {ref(R[i + 1][1])}}));
        if (!req[i]) g.alt(r, {ref(R[i + 1][size_t(c)])});
        R[i][size_t(c)] = r;
      }
    return g.rule(fresh("object"), {cat({lit("{"), {ref(ws())}, {ref(R[0][0])}, lit("}")})});
  }
};

JsonGrammarBuilder::JsonGrammarBuilder(Grammar& g) : impl_(std::make_shared<Impl>(g)) {}

Grammar::RuleId JsonGrammarBuilder::schema(const json& schema, const std::string& where) {
  impl_->root = &schema;
  impl_->root_where = where;
  impl_->refs.clear();
  RuleId r = impl_->compile(schema, where);
  impl_->root = nullptr;
  if (std::string p = impl_->g.problem(r); !p.empty()) impl_->bad(where, fmt::format("the schema allows no finite JSON document ({})", p));
  return r;
}

Grammar::RuleId JsonGrammarBuilder::any_value() {
  impl_->generic();
  return *impl_->value_;
}

Grammar::RuleId JsonGrammarBuilder::any_object() {
  impl_->generic();
  return *impl_->object_;
}

Grammar json_schema_grammar(const json& schema, const std::string& where) {
  Grammar g;
  RuleId root = g.rule("root");
  JsonGrammarBuilder b(g);
  g.alt(root, {Grammar::ref(b.schema(schema, where))});
  g.set_root(root);
  g.check();
  return g;
}

Grammar json_object_grammar() {
  Grammar g;
  RuleId root = g.rule("root");
  JsonGrammarBuilder b(g);
  g.alt(root, {Grammar::ref(b.any_object())});
  g.set_root(root);
  return g;
}

}  // namespace lily::text
