#include "server/json_body.h"

#include <unordered_set>
#include <vector>

#include <fmt/format.h>

#include "text/utf8.h"

namespace lily::server {

namespace {

// Builds the value from SAX events. Object members are appended to the ordered map's vector directly;
// a hash set of the object's keys catches duplicates (ordered_map::emplace searches linearly).
class Builder {
 public:
  Builder(const JsonLimits& lim, std::string where) : lim_(lim), where_(std::move(where)) {}

  json root;

  bool null() { return put(json(nullptr)); }
  bool boolean(bool v) { return put(json(v)); }
  bool number_integer(json::number_integer_t v) { return put(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return put(json(v)); }
  bool number_float(json::number_float_t v, const std::string&) { return put(json(v)); }
  bool string(std::string& s) {
    check_string(s, "string");
    return put(json(std::move(s)));
  }
  bool binary(json::binary_t&) { return put(json(nullptr)); }  // not produced by the text parser

  bool start_object(size_t) { return open(json::object()); }
  bool start_array(size_t) { return open(json::array()); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(std::string& k) {
    Frame& f = stack_.back();
    check_string(k, "key");
    if (f.keys.size() >= lim_.object_keys)
      bad(path(), fmt::format("{} has more than {} keys", name(path()), lim_.object_keys), "limit_exceeded");
    if (!f.keys.insert(k).second) {
      f.key = std::move(k);
      bad(path(), fmt::format("duplicate key in the request body: {}", name(path())), "invalid_json");
    }
    f.key = std::move(k);
    return true;
  }

  bool parse_error(size_t pos, const std::string&, const nlohmann::detail::exception& e) {
    std::string p = path();
    if (e.id == 406)  // number overflow
      bad(p, fmt::format("{} is a number out of range (finite double-precision values only)", name(p)));
    std::string msg = text::utf8_sanitize(e.what());
    // nlohmann's messages start "[json.exception.parse_error.101] parse error at line 1, column 5: ...".
    if (auto at = msg.find("] "); at != std::string::npos) msg = msg.substr(at + 2);
    // Between two members ("max_tokens": 01 reads as 0, then 1): the text right after the last member's
    // value is wrong, most likely that value.
    const char* where = "in";
    if (!stack_.empty() && stack_.back().value.is_object() && stack_.back().key.empty() && !stack_.back().last.empty()) {
      if (!p.empty()) p += '.';
      p += text::utf8_sanitize(stack_.back().last);
      where = "after";
    }
    bad(p, p.empty() ? fmt::format("the request body is not valid JSON: {}", msg)
                     : fmt::format("the request body is not valid JSON ({} {}): {}", where, p, msg),
        "invalid_json");
  }

 private:
  struct Frame {
    json value;
    std::string key;                       // objects: the member being read
    std::string last;                      // objects: the member read last
    std::unordered_set<std::string> keys;  // objects: keys so far
  };

  static std::string name(const std::string& p) { return p.empty() ? "the request body" : "'" + p + "'"; }

  // Dotted path of the value being read: where.key[3].key
  std::string path() const {
    std::string p = where_;
    for (const Frame& f : stack_) {
      if (f.value.is_object()) {
        if (f.key.empty() && &f == &stack_.back()) break;  // between members: the object itself
        if (!p.empty()) p += '.';
        p += text::utf8_sanitize(f.key);
      } else {
        p += fmt::format("[{}]", f.value.size());
      }
    }
    return p;
  }

  void check_string(const std::string& s, const char* what) {
    if (s.size() > lim_.string_bytes)
      bad(path(), fmt::format("{}: a {} of {} bytes is longer than the limit of {}", name(path()), what, s.size(), lim_.string_bytes),
          "limit_exceeded");
  }

  bool open(json v) {
    if (stack_.size() >= lim_.depth)
      bad(path(), fmt::format("{} nests deeper than {} levels", name(path()), lim_.depth), "limit_exceeded");
    if (!stack_.empty() && stack_.back().value.is_array()) check_items();
    stack_.push_back(Frame{std::move(v), {}, {}, {}});
    return true;
  }

  bool close() {
    json v = std::move(stack_.back().value);
    stack_.pop_back();
    return add(std::move(v));
  }

  bool put(json v) {
    if (!stack_.empty() && stack_.back().value.is_array()) check_items();
    return add(std::move(v));
  }

  void check_items() {
    if (stack_.back().value.size() < lim_.array_items) return;
    std::string p = path();
    p = p.substr(0, p.rfind('['));
    bad(p, fmt::format("{} has more than {} items", name(p), lim_.array_items), "limit_exceeded");
  }

  bool add(json v) {
    if (stack_.empty()) {
      root = std::move(v);
      return true;
    }
    Frame& f = stack_.back();
    if (f.value.is_array()) {
      f.value.get_ref<json::array_t&>().push_back(std::move(v));
    } else {
      auto& members = static_cast<json::object_t::Container&>(f.value.get_ref<json::object_t&>());
      f.last = f.key;
      members.emplace_back(std::move(f.key), std::move(v));
      f.key.clear();
    }
    return true;
  }

  const JsonLimits& lim_;
  std::string where_;
  std::vector<Frame> stack_;
};

}  // namespace

json parse_json(std::string_view text, const JsonLimits& limits, const std::string& where) {
  Builder b(limits, where);
  json::sax_parse(text, &b);
  return std::move(b.root);
}

}  // namespace lily::server
