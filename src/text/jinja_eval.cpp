// Jinja evaluation: expressions to values, statements to output, macros and call blocks as callables.
#include <algorithm>
#include <cstdint>
#include <memory>

#include "text/jinja_interp.h"

namespace lily::text::jinja::detail {

Value Interp::eval(const Node& n, Ctx& c) const {
  if (eval_depth >= 1000) error(n, "expression nested too deeply");
  charge(n, 1);
  DepthGuard guard(eval_depth);
  Value v = eval_node(n, c);
  if (v.kind == Value::Str) {
    check_len(n, v.s.size(), "a string");
    charge(n, v.s.size() / 64);
  } else if (v.kind == Value::Arr && n.kind != NK::Name && n.kind != NK::Attr && n.kind != NK::Item) {
    charge(n, v.a->size());
  }
  return v;
}

Value Interp::eval_node(const Node& n, Ctx& c) const {
  switch (n.kind) {
    case NK::Literal: return n.lit;
    case NK::Name: return lookup(c, n.str);
    case NK::Attr: return get_attr(n, eval(*n.a, c), n.str);
    case NK::Item: return get_item(n, eval(*n.a, c), eval(*n.b, c));
    case NK::Slice:
      return slice(n, eval(*n.a, c), n.b ? eval(*n.b, c) : Value::undef(), n.c ? eval(*n.c, c) : Value::undef(),
                   n.d ? eval(*n.d, c) : Value::undef());
    case NK::Neg:
    case NK::Pos: {
      Value v = eval(*n.a, c);
      if (v.kind == Value::Bool) v = Value(int64_t(v.b));  // Python: -True == -1
      if (v.kind == Value::Int) {
        if (n.kind == NK::Neg && v.i == INT64_MIN) error(n, "integer overflow in unary - (result outside 64 bits)");
        return n.kind == NK::Neg ? Value(-v.i) : v;
      }
      if (v.kind == Value::Float) return n.kind == NK::Neg ? Value(-v.f) : v;
      error(n, std::string("bad operand type for unary ") + (n.kind == NK::Neg ? "-" : "+") + ": " + type_name(v));
    }
    case NK::Not: return Value(!eval(*n.a, c).truthy());
    case NK::And: {
      Value l = eval(*n.a, c);
      return l.truthy() ? eval(*n.b, c) : l;
    }
    case NK::Or: {
      Value l = eval(*n.a, c);
      return l.truthy() ? l : eval(*n.b, c);
    }
    case NK::Cond:
      if (eval(*n.a, c).truthy()) return eval(*n.b, c);
      return n.c ? eval(*n.c, c) : Value::undef();
    case NK::Bin: {
      Value x = eval(*n.a, c), y = eval(*n.b, c);
      const std::string& op = n.str;
      if (op == "==") return Value(equal(x, y));
      if (op == "!=") return Value(!equal(x, y));
      if (op == "<") return Value(compare(n, x, y) < 0);
      if (op == ">") return Value(compare(n, x, y) > 0);
      if (op == "<=") return Value(compare(n, x, y) <= 0);
      if (op == ">=") return Value(compare(n, x, y) >= 0);
      if (op == "in") return Value(contains(n, y, x));
      if (op == "not in") return Value(!contains(n, y, x));
      return binop(n, op, x, y);
    }
    case NK::List:
    case NK::Tuple: {
      Array a;
      for (auto& e : n.list) a.push_back(eval(*e, c));
      return Value(std::move(a));
    }
    case NK::Dict: {
      auto o = std::make_shared<Object>();
      for (size_t k = 0; k < n.list.size(); ++k) {
        Value key = eval(*n.list[k], c);
        o->set(key.kind == Value::Str ? key.s : to_str(key), eval(*n.list2[k], c));
      }
      return Value(o);
    }
    case NK::Call: return eval_call(n, c);
    case NK::Filter: {
      CallArgs args = eval_args(n, c);
      return apply_filter(n, n.str, eval(*n.a, c), args, c);
    }
    case NK::Test: {
      CallArgs args = eval_args(n, c);
      bool r = apply_test(n, n.str, eval(*n.a, c), args);
      return Value(n.flag ? !r : r);
    }
    default: error(n, "not an expression");
  }
}

CallArgs Interp::eval_args(const Node& n, Ctx& c) const {
  CallArgs a;
  for (auto& e : n.list) a.pos.push_back(eval(*e, c));
  for (size_t k = 0; k < n.names.size(); ++k) a.kw.emplace_back(n.names[k], eval(*n.list2[k], c));
  return a;
}

Value Interp::eval_call(const Node& n, Ctx& c) const {
  CallArgs args = eval_args(n, c);
  if (n.a->kind == NK::Attr) {
    Value obj = eval(*n.a->a, c);
    const std::string& m = n.a->str;
    if (obj.kind == Value::Str || obj.kind == Value::Arr ||
        (obj.kind == Value::Obj && !(obj.o->get(m) && obj.o->get(m)->kind == Value::Fn)))
      return call_method(n, obj, m, args);
    Value f = get_attr(*n.a, obj, m);
    if (f.kind != Value::Fn) error(n, "'" + m + "' is not callable");
    return call_fn(n, f, args);
  }
  Value f = eval(*n.a, c);
  if (f.kind != Value::Fn) {
    if (n.a->kind == NK::Name) error(n, "'" + n.a->str + "' is " + (f.is_undef() ? "undefined" : "not callable"));
    error(n, "value is not callable");
  }
  return call_fn(n, f, args);
}

Value Interp::call_fn(const Node& n, const Value& f, CallArgs& args) const {
  try {
    return (*f.fn)(args);
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    error(n, e.what());
  }
}

Flow Interp::exec(const Node& n, Ctx& c, std::string& out) const {
  charge(n, n.kind == NK::Text ? 1 + n.str.size() / 64 : 1);
  const Flow f = exec_node(n, c, out);
  check_len(n, out.size(), "the output");
  return f;
}

Flow Interp::exec_node(const Node& n, Ctx& c, std::string& out) const {
  switch (n.kind) {
    case NK::Body:
      for (auto& s : n.list) {
        Flow f = exec(*s, c, out);
        if (f != Flow::Normal) return f;
      }
      return Flow::Normal;
    case NK::Text: out += n.str; return Flow::Normal;
    case NK::Emit: out += to_str(eval(*n.a, c)); return Flow::Normal;
    case NK::If:
      for (size_t k = 0; k < n.list.size(); ++k)
        if (eval(*n.list[k], c).truthy()) return exec(*n.list2[k], c, out);
      if (n.a) return exec(*n.a, c, out);
      return Flow::Normal;
    case NK::For: return exec_for(n, c, out);
    case NK::Set: {
      Value v = eval(*n.a, c);
      if (!n.str.empty()) {
        Value ns = lookup(c, n.names[0]);
        if (ns.kind != Value::Obj || !ns.o->is_namespace)
          error(n, "cannot assign attribute on '" + n.names[0] + "': not a namespace");
        ns.o->set(n.str, v);
        return Flow::Normal;
      }
      assign(n, c, n.names, v);
      return Flow::Normal;
    }
    case NK::SetBlock: {
      std::string body;
      if (Flow f = exec(*n.a, c, body); f != Flow::Normal) return f;
      c.frames.back()[n.names[0]] = Value(body);
      return Flow::Normal;
    }
    case NK::Macro: c.frames.back()[n.str] = make_macro(n, c); return Flow::Normal;
    case NK::CallBlock: {
      // caller() renders the block body in the current scope.
      Value caller = make_macro(n, c);
      const Node& call = *n.b;
      CallArgs args = eval_args(call, c);
      args.kw.emplace_back("caller", caller);
      Value f = eval(*call.a, c);
      if (f.kind != Value::Fn) error(n, "call block target is not a macro");
      out += to_str(call_fn(call, f, args));
      return Flow::Normal;
    }
    case NK::FilterBlock: {
      std::string body;
      if (Flow f = exec(*n.a, c, body); f != Flow::Normal) return f;
      // Re-evaluate the filter chain with the body text as its innermost operand.
      std::vector<const Node*> chain;
      for (const Node* k = n.b.get(); k->kind == NK::Filter; k = k->a.get()) chain.push_back(k);
      Value v(body);
      for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
        CallArgs args = eval_args(**it, c);
        v = apply_filter(**it, (*it)->str, v, args, c);
      }
      out += to_str(v);
      return Flow::Normal;
    }
    case NK::Generation: return exec(*n.a, c, out);
    case NK::Break: return Flow::Break;
    case NK::Continue: return Flow::Continue;
    default: error(n, "not a statement");
  }
}

void Interp::assign(const Node& n, Ctx& c, const std::vector<std::string>& names, const Value& v) const {
  if (names.size() == 1) {
    c.frames.back()[names[0]] = v;
    return;
  }
  auto items = iterate(n, v);
  if (items.size() != names.size())
    error(n, fmt::format("cannot unpack {} values into {} names", items.size(), names.size()));
  for (size_t k = 0; k < names.size(); ++k) c.frames.back()[names[k]] = items[k];
}

Flow Interp::exec_for(const Node& n, Ctx& c, std::string& out) const {
  Value seq = eval(*n.a, c);
  auto items = iterate(*n.a, seq);
  if (n.b) {  // loop filter: evaluated with the loop variable bound
    std::vector<Value> kept;
    c.frames.emplace_back();
    for (auto& x : items) {
      assign(n, c, n.names, x);
      if (eval(*n.b, c).truthy()) kept.push_back(x);
    }
    c.frames.pop_back();
    items.swap(kept);
  }
  if (items.empty()) return n.d ? exec(*n.d, c, out) : Flow::Normal;  // else: a break leaves the outer loop
  c.frames.emplace_back();
  size_t len = items.size();
  for (size_t k = 0; k < len; ++k) {
    auto loop = std::make_shared<Object>();
    loop->items = {{"index", Value(k + 1)},
                   {"index0", Value(k)},
                   {"revindex", Value(len - k)},
                   {"revindex0", Value(len - k - 1)},
                   {"first", Value(k == 0)},
                   {"last", Value(k + 1 == len)},
                   {"length", Value(len)},
                   {"previtem", k > 0 ? items[k - 1] : Value::undef("previtem")},
                   {"nextitem", k + 1 < len ? items[k + 1] : Value::undef("nextitem")},
                   {"depth", Value(int64_t(1))},
                   {"depth0", Value(int64_t(0))}};
    size_t idx = k;
    loop->items.emplace_back("cycle", Value(Function([idx](CallArgs& a) -> Value {
                               if (a.pos.empty()) throw InputError("loop.cycle() needs arguments");
                               return a.pos[idx % a.pos.size()];
                             })));
    c.frames.back()["loop"] = Value(loop);
    assign(n, c, n.names, items[k]);
    Flow f = exec(*n.c, c, out);
    if (f == Flow::Break) break;
  }
  c.frames.pop_back();
  return Flow::Normal;
}

// The scope a macro or caller() body closes over: the enclosing local frames (copied: jinja2
// closures see local values as they were at definition) and the live top-level frame.
static Ctx closure(Ctx& c) {
  Ctx k;
  k.root = c.root ? c.root : &c.frames.front();
  k.frames.assign(c.root ? c.frames.begin() : c.frames.begin() + 1, c.frames.end());
  return k;
}

// A macro (or a call block's caller) as a callable value. It points into the template's tree, which
// outlives every render, and into this render's Interp and top-level frame, which outlive the value
// (no value escapes a render). The macro sees itself through a weak reference (no ownership cycle).
Value Interp::make_macro(const Node& n, Ctx& c) const {
  const Node* np = &n;
  auto scope = std::make_shared<const Ctx>(closure(c));
  auto self_fn = std::make_shared<std::weak_ptr<Function>>();
  const Interp* in = this;
  Value macro(Function([in, np, scope, self_fn](CallArgs& a) -> Value {
    std::string what = np->kind == NK::Macro ? "macro '" + np->str + "'" : std::string("caller()");
    if (in->macro_depth >= kMaxMacroDepth)
      in->error(*np, fmt::format("{} nested deeper than {} calls (unbounded recursion?)", what, kMaxMacroDepth));
    DepthGuard guard(in->macro_depth);
    Ctx mc = *scope;
    Frame params;
    if (np->kind == NK::Macro)
      if (auto f = self_fn->lock()) {
        Value me;
        me.kind = Value::Fn;
        me.fn = std::move(f);
        params[np->str] = std::move(me);
      }
    mc.frames.push_back(std::move(params));
    Frame& p = mc.frames.back();
    size_t npos = 0;
    std::vector<Value> varargs;
    for (size_t k = 0; k < np->names.size(); ++k) {
      Value v = Value::undef(np->names[k]);
      bool found = false;
      for (auto& [key, val] : a.kw)
        if (key == np->names[k]) v = val, found = true;
      if (!found && npos < a.pos.size()) v = a.pos[npos++], found = true;
      if (!found && k < np->list2.size() && np->list2[k]) v = in->eval(*np->list2[k], mc);
      p[np->names[k]] = v;
    }
    for (; npos < a.pos.size(); ++npos) varargs.push_back(a.pos[npos]);
    p["varargs"] = Value(std::move(varargs));
    auto kwargs = std::make_shared<Object>();
    for (auto& [key, val] : a.kw) {
      bool is_param = std::find(np->names.begin(), np->names.end(), key) != np->names.end();
      if (key == "caller") p["caller"] = val;
      else if (!is_param) kwargs->set(key, val);
    }
    p["kwargs"] = Value(kwargs);
    std::string out;
    in->exec(*np->a, mc, out);
    return Value(out);
  }));
  *self_fn = macro.fn;
  return macro;
}

}  // namespace lily::text::jinja::detail
