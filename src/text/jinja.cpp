#include "text/jinja.h"

#include <ctime>
#include <memory>
#include <vector>

#include "core/error.h"
#include "text/jinja_interp.h"

namespace lily::text::jinja {

using detail::Ctx;
using detail::Frame;

namespace {

// The namespaces of one render: `set ns.a = ns` (or a value holding ns) makes a cycle of shared pointers that
// would outlive the render, so the render empties every namespace it made when it ends (also on an error).
struct Namespaces {
  std::vector<std::weak_ptr<Object>> made;
  Namespaces() = default;
  Namespaces(const Namespaces&) = delete;
  Namespaces& operator=(const Namespaces&) = delete;
  ~Namespaces() {
    for (auto& w : made)
      if (auto o = w.lock()) o->items.clear();
  }
};

Value make_namespace(CallArgs& a, Namespaces& spaces) {
  auto o = std::make_shared<Object>();
  spaces.made.push_back(o);
  o->is_namespace = true;
  for (auto& p : a.pos)
    if (p.kind == Value::Obj)
      for (auto& [k, v] : p.o->items) o->set(k, v);
  for (auto& [k, v] : a.kw) o->set(k, v);
  return Value(o);
}

}  // namespace

Template::Template(std::string source, std::string name) : source_(std::move(source)), name_(std::move(name)) {
  // jinja2 drops a single trailing newline (keep_trailing_newline = False).
  std::string src = source_;
  if (!src.empty() && src.back() == '\n') {
    src.pop_back();
    if (!src.empty() && src.back() == '\r') src.pop_back();
  }
  root_ = detail::parse(src, name_);
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& globals, const RenderLimits& limits) const {
  Namespaces spaces;  // outlives the context below, whose values may hold the namespaces
  detail::Interp in{name_, limits};
  Ctx c;
  c.frames.emplace_back();
  Frame& g = c.frames[0];
  g["namespace"] = Value(Function([&spaces](CallArgs& a) { return make_namespace(a, spaces); }));
  g["dict"] = Value(Function([](CallArgs& a) {
    auto o = std::make_shared<Object>();
    for (auto& p : a.pos)
      if (p.kind == Value::Obj)
        for (auto& [k, v] : p.o->items) o->set(k, v);
    for (auto& [k, v] : a.kw) o->set(k, v);
    return Value(o);
  }));
  g["range"] = Value(Function([](CallArgs& a) {
    int64_t start = 0, stop = 0, step = 1;
    auto num = [](const Value& v) {
      if (v.kind != Value::Int) throw InputError("range() expects integers");
      return v.i;
    };
    if (a.pos.size() == 1) stop = num(a.pos[0]);
    else if (a.pos.size() >= 2) start = num(a.pos[0]), stop = num(a.pos[1]);
    if (a.pos.size() >= 3) step = num(a.pos[2]);
    if (step == 0) throw InputError("range() step must not be zero");
    Array r;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      if (r.size() > 1000000) throw InputError("range() too long");
      r.emplace_back(k);
    }
    return Value(std::move(r));
  }));
  std::string tname = name_;
  g["raise_exception"] = Value(Function([tname](CallArgs& a) -> Value {
    throw InputError(fmt::format("{} raised an exception: {}", tname, a.pos.empty() ? "" : to_str(a.pos[0])));
  }));
  g["strftime_now"] = Value(Function([](CallArgs& a) {
    std::string fmt_s = a.pos.empty() ? "%Y-%m-%d" : to_str(a.pos[0]);
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    size_t n = std::strftime(buf, sizeof buf, fmt_s.c_str(), &tm);
    return Value(std::string(buf, n));
  }));
  if (globals.is_object())
    for (auto it = globals.begin(); it != globals.end(); ++it) g[it.key()] = from_json(it.value());
  std::string out;
  in.exec(*root_, c, out);
  return out;
}

}  // namespace lily::text::jinja
