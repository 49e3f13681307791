// Jinja parser, statements: the template body, {% if / for / set / macro / call / filter / generation %},
// break and continue. The entry point detail::parse.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "text/jinja_parser.h"

namespace lily::text::jinja::detail {

NodeP parse(const std::string& src, const std::string& name) { return Parser(lex(src, name), name).parse_template(); }

NodeP Parser::parse_template() {
  auto body = parse_body({});
  if (cur().type != Tok::End) error(cur(), "unexpected '" + peek_block_name() + "'");
  return body;
}

void Parser::expect_op(const char* op) {
  if (!is_op(op)) error(cur(), std::string("expected '") + op + "'" + got());
  ++i_;
}
std::string Parser::got() const {
  switch (cur().type) {
    case Tok::End: return ", got end of template";
    case Tok::BlockEnd: return ", got end of tag";
    case Tok::VarEnd: return ", got '}}'";
    default: return ", got '" + cur().text + "'";
  }
}
std::string Parser::expect_name() {
  if (cur().type != Tok::Name) error(cur(), "expected a name" + got());
  return next().text;
}
void Parser::expect_block_end() {
  if (cur().type != Tok::BlockEnd) error(cur(), "expected end of tag" + got());
  ++i_;
}
std::string Parser::peek_block_name() const {
  if (cur().type == Tok::BlockBegin && i_ + 1 < t_.size() && t_[i_ + 1].type == Tok::Name) return t_[i_ + 1].text;
  return cur().text;
}

// Parses statements until a block tag whose name is in `stops` (left unconsumed, at its BlockBegin).
NodeP Parser::parse_body(std::initializer_list<const char*> stops) {
  auto body = node(NK::Body, cur());
  while (true) {
    const Token& t = cur();
    if (t.type == Tok::End) {
      if (stops.size()) error(t, std::string("missing {% ") + *(stops.end() - 1) + " %}");
      return body;
    }
    if (t.type == Tok::Text) {
      auto n = node(NK::Text, t);
      n->str = t.text;
      body->list.push_back(n);
      ++i_;
    } else if (t.type == Tok::VarBegin) {
      ++i_;
      auto n = node(NK::Emit, t);
      n->a = parse_expr();
      if (cur().type != Tok::VarEnd) error(cur(), "expected '}}'" + got());
      ++i_;
      body->list.push_back(n);
    } else if (t.type == Tok::BlockBegin) {
      std::string kw = peek_block_name();
      for (const char* s : stops)
        if (kw == s) return body;
      body->list.push_back(parse_statement());
    } else {
      error(t, "unexpected token");
    }
  }
}

NodeP Parser::parse_statement() {
  Nest nest(*this);
  const Token& open = next();  // BlockBegin
  const Token& kwt = cur();
  if (kwt.type != Tok::Name) error(kwt, "expected a statement name" + got());
  std::string kw = next().text;
  if (kw == "if") return parse_if(kwt);
  if (kw == "for") return parse_for(kwt);
  if (kw == "set") return parse_set(kwt);
  if (kw == "macro") return parse_macro(kwt);
  if (kw == "call") return parse_call_block(kwt);
  if (kw == "filter") return parse_filter_block(kwt);
  if (kw == "generation") {
    expect_block_end();
    auto n = node(NK::Generation, kwt);
    n->a = parse_body({"endgeneration"});
    end_tag("endgeneration");
    return n;
  }
  if (kw == "break" || kw == "continue") {
    if (loops_ == 0) error(kwt, "{% " + kw + " %} outside a for loop");
    expect_block_end();
    return node(kw == "break" ? NK::Break : NK::Continue, kwt);
  }
  (void)open;
  error(kwt, "unknown statement '" + kw + "'");
}

void Parser::end_tag(const char* name) {
  next();  // BlockBegin
  if (!is_name(name)) error(cur(), std::string("expected '") + name + "'");
  ++i_;
  expect_block_end();
}

NodeP Parser::parse_if(const Token& t) {
  auto n = node(NK::If, t);
  n->list.push_back(parse_expr());
  expect_block_end();
  n->list2.push_back(parse_body({"elif", "else", "endif"}));
  while (true) {
    next();  // BlockBegin
    std::string kw = next().text;
    if (kw == "elif") {
      n->list.push_back(parse_expr());
      expect_block_end();
      n->list2.push_back(parse_body({"elif", "else", "endif"}));
    } else if (kw == "else") {
      expect_block_end();
      n->a = parse_body({"endif"});
      end_tag("endif");
      return n;
    } else {
      expect_block_end();
      return n;
    }
  }
}

NodeP Parser::parse_for(const Token& t) {
  auto n = node(NK::For, t);
  n->names.push_back(expect_name());
  while (is_op(",")) {
    ++i_;
    n->names.push_back(expect_name());
  }
  if (!is_name("in")) error(cur(), "expected 'in'" + got());
  ++i_;
  n->a = parse_expr(false);  // the iterable; no conditional expression (its 'if' filters the loop)
  if (is_name("if")) {
    ++i_;
    n->b = parse_expr();
  }
  if (is_name("recursive")) error(cur(), "recursive loops are not supported");
  expect_block_end();
  ++loops_;
  n->c = parse_body({"else", "endfor"});
  --loops_;
  next();
  std::string kw = next().text;
  expect_block_end();
  if (kw == "else") {  // runs outside the loop: a break there leaves the enclosing loop
    n->d = parse_body({"endfor"});
    end_tag("endfor");
  }
  return n;
}

NodeP Parser::parse_set(const Token& t) {
  std::vector<std::string> targets{expect_name()};
  std::string attr;
  if (is_op(".")) {
    ++i_;
    attr = expect_name();
  }
  while (is_op(",")) {
    ++i_;
    targets.push_back(expect_name());
  }
  if (cur().type == Tok::BlockEnd) {
    if (targets.size() != 1 || !attr.empty()) error(t, "block set takes one plain name");
    ++i_;
    auto n = node(NK::SetBlock, t);
    n->names = targets;
    n->a = parse_body({"endset"});
    end_tag("endset");
    return n;
  }
  if (is_op("|")) error(cur(), "filtered block set is not supported");
  expect_op("=");
  auto n = node(NK::Set, t);
  n->names = targets;
  n->str = attr;
  n->a = parse_tuple_or_expr();
  expect_block_end();
  return n;
}

// Parameter list "(a, b=1)" into names/list2 (defaults, null when none).
void Parser::parse_params(Node& n) {
  expect_op("(");
  while (!is_op(")")) {
    n.names.push_back(expect_name());
    if (is_op("=")) {
      ++i_;
      n.list2.push_back(parse_expr());
    } else {
      n.list2.push_back(nullptr);
    }
    if (!is_op(",")) break;
    ++i_;
  }
  expect_op(")");
}

NodeP Parser::parse_macro(const Token& t) {
  auto n = node(NK::Macro, t);
  n->str = expect_name();
  parse_params(*n);
  expect_block_end();
  int loops = std::exchange(loops_, 0);
  n->a = parse_body({"endmacro"});
  loops_ = loops;
  end_tag("endmacro");
  return n;
}

NodeP Parser::parse_call_block(const Token& t) {
  auto n = node(NK::CallBlock, t);
  if (is_op("(")) parse_params(*n);
  n->b = parse_expr();
  if (n->b->kind != NK::Call) error(t, "call block needs a macro call");
  expect_block_end();
  int loops = std::exchange(loops_, 0);
  n->a = parse_body({"endcall"});
  loops_ = loops;
  end_tag("endcall");
  return n;
}

NodeP Parser::parse_filter_block(const Token& t) {
  auto n = node(NK::FilterBlock, t);
  auto placeholder = node(NK::Literal, t);
  n->b = parse_filters(placeholder, true);
  expect_block_end();
  n->a = parse_body({"endfilter"});
  end_tag("endfilter");
  return n;
}

}  // namespace lily::text::jinja::detail
