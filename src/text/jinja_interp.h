// The Jinja interpreter (internal to src/text): walks a Node tree against a stack of variable frames.
// Expressions and statements are in jinja_eval.cpp, Python's operations on values in jinja_ops.cpp,
// the str / dict / list methods in jinja_methods.cpp, filters and tests in jinja_filters.cpp.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "text/jinja_ast.h"

namespace lily::text::jinja::detail {

enum class Flow { Normal, Break, Continue };

using Frame = std::unordered_map<std::string, Value>;

// Names resolve from the innermost frame outwards, then in `root`. At top level root is null and
// frames[0] holds the globals and top-level assignments; a macro's context has root pointing at that
// live frame (a deque keeps it in place), so macros see names set after their definition, themselves
// and each other, as in jinja2.
struct Ctx {
  std::deque<Frame> frames;
  Frame* root = nullptr;
};

// Counts one level of a recursion bound for the guard's lifetime.
struct DepthGuard {
  int& d;
  explicit DepthGuard(int& depth) : d(++depth) {}
  ~DepthGuard() { --d; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;
};

struct Interp {
  const std::string& name;
  const RenderLimits& limits;
  mutable int eval_depth = 0;  // bounds recursion on long operator chains such as 1+1+...+1
  mutable uint64_t steps = 0;  // work done so far, against limits.steps
  mutable int macro_depth = 0;  // macro and caller() calls in progress
  static constexpr int kMaxMacroDepth = 64;

  [[noreturn]] void error(const Node& n, const std::string& msg) const {
    fail("{} line {}, column {}: {}", name, n.line, n.col, msg);
  }

  // Charges `cost` steps of work to the render.
  void charge(const Node& n, uint64_t cost) const {
    steps += cost;
    if (steps > limits.steps) error(n, fmt::format("rendering takes more than {} steps (a loop without end?)", limits.steps));
  }
  void check_len(const Node& n, uint64_t len, const char* what) const {
    if (len > kMaxStringBytes) error(n, std::string(what) + " would be longer than 64 MiB");
  }

  // values (jinja_ops.cpp)
  static Value lookup(Ctx& c, const std::string& k);
  static const char* type_name(const Value& v);
  static std::vector<uint32_t> cps(const std::string& s);
  static std::string from_cps(const std::vector<uint32_t>& v, size_t b, size_t e);
  std::vector<Value> iterate(const Node& n, const Value& v) const;
  static bool equal(const Value& x, const Value& y);
  int compare(const Node& n, const Value& x, const Value& y) const;
  bool contains(const Node& n, const Value& hay, const Value& needle) const;
  Value get_attr(const Node& n, const Value& obj, const std::string& key) const;
  Value get_item(const Node& n, const Value& obj, const Value& key) const;
  Value slice(const Node& n, const Value& obj, const Value& b, const Value& e, const Value& st) const;
  Value binop(const Node& n, const std::string& op, const Value& x, const Value& y) const;

  // expressions and statements (jinja_eval.cpp)
  // One step per expression; a string result also costs its bytes / 64 (values are copied by value)
  // and a list the expression builds its length.
  Value eval(const Node& n, Ctx& c) const;
  Value eval_node(const Node& n, Ctx& c) const;
  CallArgs eval_args(const Node& n, Ctx& c) const;
  Value eval_call(const Node& n, Ctx& c) const;
  Value call_fn(const Node& n, const Value& f, CallArgs& args) const;
  // One step per statement (a text node also its bytes / 64); what it writes to `out` stays within
  // kMaxStringBytes.
  Flow exec(const Node& n, Ctx& c, std::string& out) const;
  Flow exec_node(const Node& n, Ctx& c, std::string& out) const;
  void assign(const Node& n, Ctx& c, const std::vector<std::string>& names, const Value& v) const;
  Flow exec_for(const Node& n, Ctx& c, std::string& out) const;
  Value make_macro(const Node& n, Ctx& c) const;

  // methods (jinja_methods.cpp)
  static std::string strip_chars(const std::string& s, const Value& chars, bool left, bool right);
  static std::string case_map(const std::string& s, int mode);  // 0 lower, 1 upper, 2 title, 3 capitalize
  static std::vector<std::string> split(const std::string& s, const Value& sep, int64_t maxsplit);
  static std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);
  Value call_method(const Node& n, const Value& obj, const std::string& m, CallArgs& a) const;

  // filters and tests (jinja_filters.cpp)
  Value to_int(const Node& n, const Value& v, const Value& def, int base) const;
  Value round_filter(const Node& n, const Value& v, CallArgs& a) const;
  Value sort_key(const Node& n, const Value& x, const Value& attr, bool case_sensitive) const;
  Value attr_path(const Node& n, const Value& v, const std::string& path) const;
  Value apply_filter(const Node& n, const std::string& f, const Value& v, CallArgs& a, Ctx& c) const;
  bool apply_test(const Node& n, const std::string& t, const Value& v, CallArgs& a) const;
};

}  // namespace lily::text::jinja::detail
