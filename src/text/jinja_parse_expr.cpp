// Jinja parser, expressions: conditional, boolean, comparison and arithmetic operators by precedence,
// literals, attribute / subscript / slice / call postfixes, filters and tests.
#include <memory>
#include <string>

#include "core/error.h"
#include "text/jinja_parser.h"

namespace lily::text::jinja::detail {

NodeP Parser::parse_tuple_or_expr() {
  auto first = parse_expr();
  if (!is_op(",")) return first;
  auto t = node(NK::Tuple, cur());
  t->list.push_back(first);
  while (is_op(",")) {
    ++i_;
    if (cur().type == Tok::BlockEnd || is_op(")")) break;
    t->list.push_back(parse_expr());
  }
  return t;
}

NodeP Parser::parse_expr(bool with_cond) {
  Nest nest(*this);
  auto e = parse_or();
  if (!with_cond) return e;
  while (is_name("if")) {
    auto n = node(NK::Cond, cur());
    ++i_;
    n->a = parse_or();
    n->b = e;
    if (is_name("else")) {
      ++i_;
      n->c = parse_expr();
    }
    e = n;
  }
  return e;
}
NodeP Parser::parse_or() {
  auto l = parse_and();
  while (is_name("or")) {
    auto n = node(NK::Or, cur());
    ++i_;
    n->a = l;
    n->b = parse_and();
    l = n;
  }
  return l;
}
NodeP Parser::parse_and() {
  auto l = parse_not();
  while (is_name("and")) {
    auto n = node(NK::And, cur());
    ++i_;
    n->a = l;
    n->b = parse_not();
    l = n;
  }
  return l;
}
NodeP Parser::parse_not() {
  Nest nest(*this);
  if (is_name("not")) {
    auto n = node(NK::Not, cur());
    ++i_;
    n->a = parse_not();
    return n;
  }
  return parse_compare();
}
NodeP Parser::parse_compare() {
  auto l = parse_math1();
  while (true) {
    std::string op;
    const Token& t = cur();
    if (t.type == Tok::Op && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" || t.text == "<=" ||
                              t.text == ">=")) {
      op = t.text;
      ++i_;
    } else if (is_name("in")) {
      op = "in";
      ++i_;
    } else if (is_name("not") && i_ + 1 < t_.size() && t_[i_ + 1].type == Tok::Name && t_[i_ + 1].text == "in") {
      op = "not in";
      i_ += 2;
    } else {
      return l;
    }
    auto n = node(NK::Bin, t);
    n->str = op;
    n->a = l;
    n->b = parse_math1();
    l = n;
  }
}
NodeP Parser::parse_math1() {
  auto l = parse_concat();
  while (is_op("+") || is_op("-")) {
    auto n = node(NK::Bin, cur());
    n->str = next().text;
    n->a = l;
    n->b = parse_concat();
    l = n;
  }
  return l;
}
NodeP Parser::parse_concat() {
  auto l = parse_math2();
  while (is_op("~")) {
    auto n = node(NK::Bin, cur());
    n->str = next().text;
    n->a = l;
    n->b = parse_math2();
    l = n;
  }
  return l;
}
NodeP Parser::parse_math2() {
  auto l = parse_pow();
  while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
    auto n = node(NK::Bin, cur());
    n->str = next().text;
    n->a = l;
    n->b = parse_pow();
    l = n;
  }
  return l;
}
NodeP Parser::parse_pow() {
  auto l = parse_unary();
  while (is_op("**")) {
    auto n = node(NK::Bin, cur());
    n->str = next().text;
    n->a = l;
    n->b = parse_unary();
    l = n;
  }
  return l;
}
NodeP Parser::parse_unary(bool with_filter) {
  Nest nest(*this);
  NodeP n;
  if (is_op("-") || is_op("+")) {
    n = node(is_op("-") ? NK::Neg : NK::Pos, cur());
    ++i_;
    n->a = parse_unary(false);
  } else {
    n = parse_postfix(parse_primary());
  }
  return with_filter ? parse_filters(n, false) : n;
}

NodeP Parser::parse_primary() {
  const Token& t = cur();
  switch (t.type) {
    case Tok::String: {
      auto n = node(NK::Literal, t);
      std::string s = next().text;
      while (cur().type == Tok::String) s += next().text;  // adjacent literals concatenate
      n->lit = Value(s);
      return n;
    }
    case Tok::Int: {
      auto n = node(NK::Literal, t);
      n->lit = Value(next().i);
      return n;
    }
    case Tok::Float: {
      auto n = node(NK::Literal, t);
      n->lit = Value(next().f);
      return n;
    }
    case Tok::Name: {
      std::string s = next().text;
      auto n = node(NK::Literal, t);
      if (s == "true" || s == "True") n->lit = Value(true);
      else if (s == "false" || s == "False") n->lit = Value(false);
      else if (s == "none" || s == "None") n->lit = Value::none();
      else {
        n->kind = NK::Name;
        n->str = s;
      }
      return n;
    }
    case Tok::Op:
      if (t.text == "(") {
        ++i_;
        if (is_op(")")) {
          ++i_;
          return node(NK::Tuple, t);
        }
        auto e = parse_expr();
        if (is_op(",")) {
          auto tup = node(NK::Tuple, t);
          tup->list.push_back(e);
          while (is_op(",")) {
            ++i_;
            if (is_op(")")) break;
            tup->list.push_back(parse_expr());
          }
          e = tup;
        }
        expect_op(")");
        return e;
      }
      if (t.text == "[") {
        ++i_;
        auto n = node(NK::List, t);
        while (!is_op("]")) {
          n->list.push_back(parse_expr());
          if (!is_op(",")) break;
          ++i_;
        }
        expect_op("]");
        return n;
      }
      if (t.text == "{") {
        ++i_;
        auto n = node(NK::Dict, t);
        while (!is_op("}")) {
          n->list.push_back(parse_expr());
          expect_op(":");
          n->list2.push_back(parse_expr());
          if (!is_op(",")) break;
          ++i_;
        }
        expect_op("}");
        return n;
      }
      break;
    default: break;
  }
  error(t, "expected an expression" + got());
}

void Parser::parse_call_args(Node& n) {
  expect_op("(");
  while (!is_op(")")) {
    if (cur().type == Tok::Name && i_ + 1 < t_.size() && t_[i_ + 1].type == Tok::Op && t_[i_ + 1].text == "=") {
      n.names.push_back(next().text);
      ++i_;
      n.list2.push_back(parse_expr());
    } else {
      if (!n.names.empty()) error(cur(), "positional argument after keyword argument");
      n.list.push_back(parse_expr());
    }
    if (!is_op(",")) break;
    ++i_;
  }
  expect_op(")");
}

NodeP Parser::parse_postfix(NodeP e) {
  while (true) {
    if (is_op(".")) {
      auto n = node(NK::Attr, cur());
      ++i_;
      if (cur().type == Tok::Int) n->str = std::to_string(next().i);
      else n->str = expect_name();
      n->a = e;
      e = n;
    } else if (is_op("[")) {
      const Token& t = next();
      NodeP idx[3];
      bool slice = false;
      int part = 0;
      while (!is_op("]")) {
        if (is_op(":")) {
          slice = true;
          if (++part > 2) error(cur(), "too many ':' in slice");
          ++i_;
          continue;
        }
        if (idx[part]) error(cur(), "expected ']'" + got());
        idx[part] = parse_expr();
      }
      ++i_;
      if (!slice && !idx[0]) error(t, "empty subscript");
      auto n = node(slice ? NK::Slice : NK::Item, t);
      n->a = e;
      n->b = idx[0];
      n->c = idx[1];
      n->d = idx[2];
      e = n;
    } else if (is_op("(")) {
      auto n = node(NK::Call, cur());
      n->a = e;
      parse_call_args(*n);
      e = n;
    } else {
      return e;
    }
  }
}

NodeP Parser::parse_filters(NodeP e, bool block_filter) {
  bool first = true;
  while (true) {
    if ((block_filter && first) || is_op("|")) {
      if (!(block_filter && first)) ++i_;
      first = false;
      auto n = node(NK::Filter, cur());
      n->str = expect_name();
      while (is_op(".")) {
        ++i_;
        n->str += '.';
        n->str += expect_name();
      }
      n->a = e;
      if (is_op("(")) parse_call_args(*n);
      e = n;
    } else if (is_name("is")) {
      auto n = node(NK::Test, cur());
      ++i_;
      if (is_name("not")) {
        n->flag = true;
        ++i_;
      }
      n->str = expect_name();
      n->a = e;
      if (is_op("(")) {
        parse_call_args(*n);
      } else if (cur().type == Tok::String || cur().type == Tok::Int || cur().type == Tok::Float ||
                 (cur().type == Tok::Name && !is_name("and") && !is_name("or") && !is_name("else") &&
                  !is_name("if") && !is_name("in") && !is_name("is") && !is_name("not"))) {
        n->list.push_back(parse_postfix(parse_primary()));
      }
      e = n;
    } else {
      return e;
    }
  }
}

}  // namespace lily::text::jinja::detail
