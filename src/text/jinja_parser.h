// The Jinja lexer's tokens and the recursive-descent parser (internal to src/text). The parser's
// statements are in jinja_parser.cpp, its expressions in jinja_parse_expr.cpp.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "text/jinja_ast.h"

namespace lily::text::jinja::detail {

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };

struct Token {
  Tok type;
  std::string text;
  int line, col;
  int64_t i = 0;
  double f = 0;
};

// The tokens of `src`, ending with Tok::End. Lexical errors -> InputError "NAME line L, column C: ...".
std::vector<Token> lex(const std::string& src, const std::string& name);

// Tokens -> Node tree. Errors name the template, line and column.
class Parser {
 public:
  Parser(std::vector<Token> toks, const std::string& name) : t_(std::move(toks)), name_(name) {}

  NodeP parse_template();

 private:
  std::vector<Token> t_;
  const std::string& name_;
  size_t i_ = 0;
  int depth_ = 0;
  int loops_ = 0;  // for-loop bodies enclosing the current statement (reset inside macro and call bodies)

  // Bounds the parser's recursion (and so the interpreter's) on deeply nested input.
  struct Nest {
    Parser& p;
    Nest(Parser& parser) : p(parser) {
      if (++p.depth_ > 200) p.error(p.cur(), "template nested too deeply");
    }
    ~Nest() { --p.depth_; }
  };

  const Token& cur() const { return t_[i_]; }
  const Token& next() { return t_[i_++]; }
  [[noreturn]] void error(const Token& t, const std::string& msg) {
    fail("{} line {}, column {}: {}", name_, t.line, t.col, msg);
  }
  NodeP node(NK k, const Token& t) {
    auto n = std::make_shared<Node>();
    n->kind = k;
    n->line = t.line;
    n->col = t.col;
    return n;
  }
  bool is_op(const char* op) const { return cur().type == Tok::Op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::Name && cur().text == n; }
  void expect_op(const char* op);
  std::string got() const;
  std::string expect_name();
  void expect_block_end();
  std::string peek_block_name() const;

  // statements (jinja_parser.cpp)
  NodeP parse_body(std::initializer_list<const char*> stops);
  NodeP parse_statement();
  void end_tag(const char* name);
  NodeP parse_if(const Token& t);
  NodeP parse_for(const Token& t);
  NodeP parse_set(const Token& t);
  void parse_params(Node& n);
  NodeP parse_macro(const Token& t);
  NodeP parse_call_block(const Token& t);
  NodeP parse_filter_block(const Token& t);

  // expressions (jinja_parse_expr.cpp), lowest precedence first
  NodeP parse_tuple_or_expr();
  NodeP parse_expr(bool with_cond = true);
  NodeP parse_or();
  NodeP parse_and();
  NodeP parse_not();
  NodeP parse_compare();
  NodeP parse_math1();
  NodeP parse_concat();
  NodeP parse_math2();
  NodeP parse_pow();
  NodeP parse_unary(bool with_filter = true);
  NodeP parse_primary();
  void parse_call_args(Node& n);
  NodeP parse_postfix(NodeP e);
  NodeP parse_filters(NodeP e, bool block_filter);
};

}  // namespace lily::text::jinja::detail
