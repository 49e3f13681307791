#include "text/jinja.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <unordered_map>

#include <utf8proc.h>

#include "core/error.h"
#include "text/jinja_value.h"
#include "text/utf8.h"

namespace lily::text::jinja {

// ---------------------------------------------------------------- lexer

namespace {

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };

struct Token {
  Tok type;
  std::string text;
  int line, col;
  int64_t i = 0;
  double f = 0;
};

struct Pos {
  int line, col;
};

class Lexer {
 public:
  Lexer(const std::string& src, const std::string& name) : src_(src), name_(name) {}

  std::vector<Token> run() {
    bool lstrip_next = false;   // previous tag ended with '-'
    bool line_start = true;     // the text that follows begins a line
    while (p_ < src_.size()) {
      size_t open = find_open(p_);
      std::string text = src_.substr(p_, open - p_);
      Pos tpos = pos_at(p_);
      if (lstrip_next) {
        size_t k = 0;
        while (k < text.size() && std::isspace(uint8_t(text[k]))) ++k;
        text.erase(0, k);
      }
      if (open >= src_.size()) {
        push_text(text, tpos);
        break;
      }
      char kind = src_[open + 1];  // '{', '%' or '#'
      char mod = open + 2 < src_.size() ? src_[open + 2] : 0;
      if (mod == '-') {
        size_t k = text.size();
        while (k > 0 && std::isspace(uint8_t(text[k - 1]))) --k;
        text.resize(k);
      } else if (kind != '{' && mod != '+') {
        // lstrip_blocks: drop spaces and tabs between the start of the line and a block or comment tag.
        size_t nlp = text.rfind('\n');
        size_t from = nlp == std::string::npos ? 0 : nlp + 1;
        if ((nlp != std::string::npos || line_start) &&
            text.find_first_not_of(" \t", from) == std::string::npos)
          text.resize(from);
      }
      push_text(text, tpos);
      size_t q = open + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      Pos opos = pos_at(open);
      if (kind == '#') {
        size_t close = src_.find("#}", q);
        if (close == std::string::npos) error(opos, "unterminated comment");
        lstrip_next = close > q && src_[close - 1] == '-';
        p_ = close + 2;
        line_start = trim_newline();
        continue;
      }
      bool block = kind == '%';
      out_.push_back({block ? Tok::BlockBegin : Tok::VarBegin, "", opos.line, opos.col});
      p_ = q;
      lex_expr(block ? '%' : '}', opos);
      // p_ now at the closing "-%}" / "%}" / "}}"
      lstrip_next = src_[p_] == '-';
      Pos cpos = pos_at(p_);
      p_ += lstrip_next ? 3 : 2;
      out_.push_back({block ? Tok::BlockEnd : Tok::VarEnd, "", cpos.line, cpos.col});
      line_start = false;
      if (block) {
        line_start = trim_newline();
        if (is_raw_start()) lex_raw(&lstrip_next, &line_start);
      }
    }
    Pos e = pos_at(src_.size());
    out_.push_back({Tok::End, "", e.line, e.col});
    return out_;
  }

 private:
  const std::string& src_;
  const std::string& name_;
  size_t p_ = 0;
  std::vector<Token> out_;

  [[noreturn]] void error(Pos p, const std::string& msg) { fail("{} line {}, column {}: {}", name_, p.line, p.col, msg); }

  // Line and column (in code points) of byte offset `off`; advances from the last query when it can.
  Pos pos_at(size_t off) {
    if (off < pos_off_) pos_off_ = 0, pos_ = {1, 1};
    for (; pos_off_ < off && pos_off_ < src_.size(); ++pos_off_) {
      if (src_[pos_off_] == '\n') ++pos_.line, pos_.col = 1;
      else if ((uint8_t(src_[pos_off_]) & 0xC0) != 0x80) ++pos_.col;
    }
    return pos_;
  }
  size_t pos_off_ = 0;
  Pos pos_{1, 1};

  size_t find_open(size_t from) const {
    for (size_t k = from; k + 1 < src_.size(); ++k)
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#')) return k;
    return src_.size();
  }

  // trim_blocks: one newline right after a block tag is removed.
  bool trim_newline() {
    if (p_ < src_.size() && src_[p_] == '\n') return ++p_, true;
    if (p_ + 1 < src_.size() && src_[p_] == '\r' && src_[p_ + 1] == '\n') return p_ += 2, true;
    return false;
  }

  void push_text(const std::string& t, Pos p) {
    if (!t.empty()) out_.push_back({Tok::Text, t, p.line, p.col});
  }

  // After "{% raw %}" the text up to "{% endraw %}" is literal.
  bool is_raw_start() const {
    size_t n = out_.size();
    return n >= 3 && out_[n - 3].type == Tok::BlockBegin && out_[n - 2].type == Tok::Name && out_[n - 2].text == "raw" &&
           out_[n - 1].type == Tok::BlockEnd;
  }
  void lex_raw(bool* lstrip_next, bool* line_start) {
    Pos start = pos_at(p_);
    out_.resize(out_.size() - 3);
    size_t k = p_;
    while (true) {
      size_t open = src_.find("{%", k);
      if (open == std::string::npos) error(start, "missing {% endraw %}");
      size_t q = open + 2;
      bool minus = q < src_.size() && src_[q] == '-';
      if (minus || (q < src_.size() && src_[q] == '+')) ++q;
      while (q < src_.size() && std::isspace(uint8_t(src_[q]))) ++q;
      if (src_.compare(q, 6, "endraw") == 0) {
        std::string text = src_.substr(p_, open - p_);
        if (*lstrip_next) text.erase(0, text.find_first_not_of(" \t\r\n") == std::string::npos ? text.size() : text.find_first_not_of(" \t\r\n"));
        if (minus) {
          size_t e = text.size();
          while (e > 0 && std::isspace(uint8_t(text[e - 1]))) --e;
          text.resize(e);
        }
        push_text(text, start);
        q += 6;
        while (q < src_.size() && std::isspace(uint8_t(src_[q]))) ++q;
        *lstrip_next = q < src_.size() && src_[q] == '-';
        if (*lstrip_next) ++q;
        if (src_.compare(q, 2, "%}") != 0) error(pos_at(q), "expected %} after endraw");
        p_ = q + 2;
        *line_start = trim_newline();
        return;
      }
      k = open + 2;
    }
  }

  // A tag holds at most this many tokens, which bounds expression trees (and the recursion over them).
  static constexpr size_t kMaxTagTokens = 4000;

  void lex_expr(char close, Pos open_pos) {
    size_t first = out_.size();
    while (true) {
      if (out_.size() - first > kMaxTagTokens) error(open_pos, "tag has more than 4000 tokens");
      while (p_ < src_.size() && std::isspace(uint8_t(src_[p_]))) ++p_;
      if (p_ >= src_.size()) error(open_pos, close == '%' ? "unclosed {% tag" : "unclosed {{ expression");
      Pos ps = pos_at(p_);
      char c = src_[p_];
      // closing delimiter, optionally preceded by '-'
      auto at_close = [&](size_t k) {
        return k + 1 < src_.size() && src_[k] == close && src_[k + 1] == '}';
      };
      if (at_close(p_)) return;
      if (c == '-' && at_close(p_ + 1)) return;
      if (std::isalpha(uint8_t(c)) || c == '_') {
        size_t s = p_;
        while (p_ < src_.size() && (std::isalnum(uint8_t(src_[p_])) || src_[p_] == '_')) ++p_;
        out_.push_back({Tok::Name, src_.substr(s, p_ - s), ps.line, ps.col});
        continue;
      }
      if (std::isdigit(uint8_t(c))) {
        size_t s = p_;
        bool flt = false;
        while (p_ < src_.size() && (std::isdigit(uint8_t(src_[p_])) || src_[p_] == '_')) ++p_;
        if (p_ + 1 < src_.size() && src_[p_] == '.' && std::isdigit(uint8_t(src_[p_ + 1]))) {
          flt = true;
          ++p_;
          while (p_ < src_.size() && std::isdigit(uint8_t(src_[p_]))) ++p_;
        }
        if (p_ < src_.size() && (src_[p_] == 'e' || src_[p_] == 'E')) {
          size_t k = p_ + 1;
          if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
          if (k < src_.size() && std::isdigit(uint8_t(src_[k]))) {
            flt = true;
            p_ = k;
            while (p_ < src_.size() && std::isdigit(uint8_t(src_[p_]))) ++p_;
          }
        }
        std::string num;
        for (size_t k = s; k < p_; ++k)
          if (src_[k] != '_') num += src_[k];
        Token t{flt ? Tok::Float : Tok::Int, num, ps.line, ps.col};
        try {
          if (flt) t.f = std::stod(num);
          else t.i = std::stoll(num);
        } catch (const std::exception&) {
          error(ps, "number out of range: " + num);
        }
        out_.push_back(t);
        continue;
      }
      if (c == '"' || c == '\'') {
        out_.push_back({Tok::String, lex_string(c, ps), ps.line, ps.col});
        continue;
      }
      static const char* ops[] = {"==", "!=", "<=", ">=", "//", "**", "+", "-", "*", "/", "%", "~", "<", ">", "=",
                                  "(", ")", "[", "]", "{", "}", ",", ".", ":", "|"};
      bool found = false;
      for (const char* op : ops) {
        size_t n = std::char_traits<char>::length(op);
        if (src_.compare(p_, n, op) == 0) {
          out_.push_back({Tok::Op, op, ps.line, ps.col});
          p_ += n;
          found = true;
          break;
        }
      }
      if (!found) error(ps, std::string("unexpected character '") + c + "'");
    }
  }

  std::string lex_string(char q, Pos ps) {
    std::string out;
    ++p_;
    while (true) {
      if (p_ >= src_.size()) error(ps, "unterminated string literal");
      char c = src_[p_++];
      if (c == q) return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (p_ >= src_.size()) error(ps, "unterminated string literal");
      char e = src_[p_++];
      switch (e) {
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'v': out += '\v'; break;
        case '0': out += '\0'; break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case '\n': break;
        case 'x':
        case 'u':
        case 'U': {
          int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (p_ + n > src_.size()) error(ps, "bad escape in string literal");
          uint32_t cp = 0;
          for (int k = 0; k < n; ++k) {
            char h = src_[p_++];
            if (!std::isxdigit(uint8_t(h))) error(ps, "bad escape in string literal");
            cp = cp * 16 + uint32_t(std::isdigit(uint8_t(h)) ? h - '0' : std::tolower(h) - 'a' + 10);
          }
          if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) error(ps, "bad code point in string literal");
          append_utf8(out, cp);
          break;
        }
        default: out += '\\'; out += e;
      }
    }
  }
};

}  // namespace

// ---------------------------------------------------------------- AST

enum class NK {
  // statements
  Body, Text, Emit, If, For, Set, SetBlock, Macro, CallBlock, Break, Continue, FilterBlock, Generation,
  // expressions
  Literal, Name, Attr, Item, Slice, Call, Filter, Test, Neg, Pos, Not, And, Or, Bin, Cond, List, Dict, Tuple
};

struct Node {
  NK kind;
  int line = 0, col = 0;
  std::string str;                         // name, attribute, operator, filter or test name
  Value lit;                               // Literal
  std::shared_ptr<Node> a, b, c, d;        // operands / condition / iterable / filter
  std::vector<std::shared_ptr<Node>> list; // body, arguments, items, branch conditions
  std::vector<std::shared_ptr<Node>> list2;// else body, keyword argument values, branch bodies, defaults
  std::vector<std::string> names;          // loop / set targets, keyword names, macro parameters
  bool flag = false;                       // negated test
};
using NodeP = std::shared_ptr<Node>;

// ---------------------------------------------------------------- parser

namespace {

class Parser {
 public:
  Parser(std::vector<Token> toks, const std::string& name) : t_(std::move(toks)), name_(name) {}

  NodeP parse_template() {
    auto body = parse_body({});
    if (cur().type != Tok::End) error(cur(), "unexpected '" + peek_block_name() + "'");
    return body;
  }

 private:
  std::vector<Token> t_;
  const std::string& name_;
  size_t i_ = 0;
  int depth_ = 0;

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
  void expect_op(const char* op) {
    if (!is_op(op)) error(cur(), std::string("expected '") + op + "'" + got());
    ++i_;
  }
  std::string got() const {
    switch (cur().type) {
      case Tok::End: return ", got end of template";
      case Tok::BlockEnd: return ", got end of tag";
      case Tok::VarEnd: return ", got '}}'";
      default: return ", got '" + cur().text + "'";
    }
  }
  std::string expect_name() {
    if (cur().type != Tok::Name) error(cur(), "expected a name" + got());
    return next().text;
  }
  void expect_block_end() {
    if (cur().type != Tok::BlockEnd) error(cur(), "expected end of tag" + got());
    ++i_;
  }
  std::string peek_block_name() const {
    if (cur().type == Tok::BlockBegin && i_ + 1 < t_.size() && t_[i_ + 1].type == Tok::Name) return t_[i_ + 1].text;
    return cur().text;
  }

  // Parses statements until a block tag whose name is in `stops` (left unconsumed, at its BlockBegin).
  NodeP parse_body(std::initializer_list<const char*> stops) {
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

  NodeP parse_statement() {
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
      expect_block_end();
      return node(kw == "break" ? NK::Break : NK::Continue, kwt);
    }
    (void)open;
    error(kwt, "unknown statement '" + kw + "'");
  }

  void end_tag(const char* name) {
    next();  // BlockBegin
    if (!is_name(name)) error(cur(), std::string("expected '") + name + "'");
    ++i_;
    expect_block_end();
  }

  NodeP parse_if(const Token& t) {
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

  NodeP parse_for(const Token& t) {
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
    n->c = parse_body({"else", "endfor"});
    next();
    std::string kw = next().text;
    expect_block_end();
    if (kw == "else") {
      n->d = parse_body({"endfor"});
      end_tag("endfor");
    }
    return n;
  }

  NodeP parse_set(const Token& t) {
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
  void parse_params(Node& n) {
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

  NodeP parse_macro(const Token& t) {
    auto n = node(NK::Macro, t);
    n->str = expect_name();
    parse_params(*n);
    expect_block_end();
    n->a = parse_body({"endmacro"});
    end_tag("endmacro");
    return n;
  }

  NodeP parse_call_block(const Token& t) {
    auto n = node(NK::CallBlock, t);
    if (is_op("(")) parse_params(*n);
    n->b = parse_expr();
    if (n->b->kind != NK::Call) error(t, "call block needs a macro call");
    expect_block_end();
    n->a = parse_body({"endcall"});
    end_tag("endcall");
    return n;
  }

  NodeP parse_filter_block(const Token& t) {
    auto n = node(NK::FilterBlock, t);
    auto placeholder = node(NK::Literal, t);
    n->b = parse_filters(placeholder, true);
    expect_block_end();
    n->a = parse_body({"endfilter"});
    end_tag("endfilter");
    return n;
  }

  // ---- expressions

  NodeP parse_tuple_or_expr() {
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

  NodeP parse_expr(bool with_cond = true) {
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
  NodeP parse_or() {
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
  NodeP parse_and() {
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
  NodeP parse_not() {
    Nest nest(*this);
    if (is_name("not")) {
      auto n = node(NK::Not, cur());
      ++i_;
      n->a = parse_not();
      return n;
    }
    return parse_compare();
  }
  NodeP parse_compare() {
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
  NodeP parse_math1() {
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
  NodeP parse_concat() {
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
  NodeP parse_math2() {
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
  NodeP parse_pow() {
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
  NodeP parse_unary(bool with_filter = true) {
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

  NodeP parse_primary() {
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

  void parse_call_args(Node& n) {
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

  NodeP parse_postfix(NodeP e) {
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

  NodeP parse_filters(NodeP e, bool block_filter) {
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
};

}  // namespace

// ---------------------------------------------------------------- interpreter

namespace {

enum class Flow { Normal, Break, Continue };

using Frame = std::unordered_map<std::string, Value>;

struct Ctx {
  std::vector<Frame> frames;  // frames[0]: globals and top-level assignments
  std::string name;
  int depth = 0;
};

struct Interp {
  const std::string& name;
  mutable int eval_depth = 0;  // bounds recursion on long operator chains such as 1+1+...+1

  [[noreturn]] void error(const Node& n, const std::string& msg) const {
    fail("{} line {}, column {}: {}", name, n.line, n.col, msg);
  }

  static Value lookup(Ctx& c, const std::string& k) {
    for (size_t f = c.frames.size(); f-- > 0;) {
      auto it = c.frames[f].find(k);
      if (it != c.frames[f].end()) return it->second;
    }
    return Value::undef(k);
  }

  static const char* type_name(const Value& v) {
    switch (v.kind) {
      case Value::Undefined: return "undefined";
      case Value::None: return "none";
      case Value::Bool: return "boolean";
      case Value::Int: return "integer";
      case Value::Float: return "float";
      case Value::Str: return "string";
      case Value::Arr: return "list";
      case Value::Obj: return "dict";
      case Value::Fn: return "function";
    }
    return "?";
  }

  static std::vector<uint32_t> cps(const std::string& s) {
    std::vector<uint32_t> v;
    for (size_t k = 0; k < s.size();) v.push_back(next_cp(s, k));
    return v;
  }
  static std::string from_cps(const std::vector<uint32_t>& v, size_t b, size_t e) {
    std::string s;
    for (size_t k = b; k < e; ++k) append_utf8(s, v[k]);
    return s;
  }

  // Iteration as Python does it: lists, dict keys, string characters.
  std::vector<Value> iterate(const Node& n, const Value& v) const {
    switch (v.kind) {
      case Value::Arr: return *v.a;
      case Value::Obj: {
        std::vector<Value> r;
        for (auto& [k, x] : v.o->items) r.emplace_back(k);
        return r;
      }
      case Value::Str: {
        std::vector<Value> r;
        for (size_t k = 0; k < v.s.size();) {
          size_t s = k;
          next_cp(v.s, k);
          r.emplace_back(v.s.substr(s, k - s));
        }
        return r;
      }
      case Value::Undefined: return {};
      default: error(n, std::string("'") + type_name(v) + "' object is not iterable");
    }
  }

  static bool equal(const Value& x, const Value& y) {
    if (x.is_num() && y.is_num()) {
      if (x.kind == Value::Float || y.kind == Value::Float) return x.num() == y.num();
      return int64_t(x.kind == Value::Int ? x.i : x.b) == int64_t(y.kind == Value::Int ? y.i : y.b);
    }
    if (x.kind != y.kind) return false;
    switch (x.kind) {
      case Value::Undefined:
      case Value::None: return true;
      case Value::Str: return x.s == y.s;
      case Value::Arr:
        if (x.a->size() != y.a->size()) return false;
        for (size_t k = 0; k < x.a->size(); ++k)
          if (!equal((*x.a)[k], (*y.a)[k])) return false;
        return true;
      case Value::Obj:
        if (x.o->items.size() != y.o->items.size()) return false;
        for (auto& [k, v] : x.o->items) {
          auto* w = y.o->get(k);
          if (!w || !equal(v, *w)) return false;
        }
        return true;
      case Value::Fn: return x.fn == y.fn;
      default: return false;
    }
  }

  int compare(const Node& n, const Value& x, const Value& y) const {
    if (x.is_num() && y.is_num()) return x.num() < y.num() ? -1 : x.num() > y.num() ? 1 : 0;
    if (x.kind == Value::Str && y.kind == Value::Str) return x.s < y.s ? -1 : x.s > y.s ? 1 : 0;
    if (x.kind == Value::Arr && y.kind == Value::Arr) {
      for (size_t k = 0; k < x.a->size() && k < y.a->size(); ++k) {
        if (equal((*x.a)[k], (*y.a)[k])) continue;
        return compare(n, (*x.a)[k], (*y.a)[k]);
      }
      return x.a->size() < y.a->size() ? -1 : x.a->size() > y.a->size() ? 1 : 0;
    }
    error(n, std::string("cannot compare ") + type_name(x) + " with " + type_name(y));
  }

  bool contains(const Node& n, const Value& hay, const Value& needle) const {
    switch (hay.kind) {
      case Value::Str:
        if (needle.kind != Value::Str) error(n, "'in <string>' requires a string on the left");
        return hay.s.find(needle.s) != std::string::npos;
      case Value::Arr:
        for (auto& x : *hay.a)
          if (equal(x, needle)) return true;
        return false;
      case Value::Obj: return needle.kind == Value::Str && hay.o->get(needle.s) != nullptr;
      case Value::Undefined: return false;
      default: error(n, std::string("argument of type '") + type_name(hay) + "' is not iterable");
    }
  }

  Value get_attr(const Node& n, const Value& obj, const std::string& key) const {
    if (obj.kind == Value::Undefined)
      error(n, "'" + (obj.undefined_name.empty() ? std::string("value") : obj.undefined_name) + "' is undefined (reading ." + key + ")");
    if (obj.kind == Value::Obj) {
      if (auto* v = obj.o->get(key)) return *v;
    }
    if (obj.kind == Value::Arr) {
      char* end = nullptr;
      long idx = std::strtol(key.c_str(), &end, 10);
      if (!key.empty() && *end == 0 && idx >= 0 && size_t(idx) < obj.a->size()) return (*obj.a)[size_t(idx)];
    }
    return Value::undef(key);
  }

  Value get_item(const Node& n, const Value& obj, const Value& key) const {
    if (obj.kind == Value::Undefined)
      error(n, "'" + (obj.undefined_name.empty() ? std::string("value") : obj.undefined_name) + "' is undefined (reading [" + repr(key) + "])");
    if (obj.kind == Value::Obj) {
      if (key.kind == Value::Str) {
        if (auto* v = obj.o->get(key.s)) return *v;
        return Value::undef(key.s);
      }
      return Value::undef();
    }
    if ((obj.kind == Value::Arr || obj.kind == Value::Str) && (key.kind == Value::Int || key.kind == Value::Bool)) {
      int64_t idx = key.kind == Value::Int ? key.i : key.b;
      if (obj.kind == Value::Arr) {
        int64_t len = int64_t(obj.a->size());
        if (idx < 0) idx += len;
        if (idx < 0 || idx >= len) return Value::undef();
        return (*obj.a)[size_t(idx)];
      }
      auto v = cps(obj.s);
      int64_t len = int64_t(v.size());
      if (idx < 0) idx += len;
      if (idx < 0 || idx >= len) return Value::undef();
      return Value(from_cps(v, size_t(idx), size_t(idx) + 1));
    }
    if (key.kind == Value::Str) return get_attr(n, obj, key.s);
    return Value::undef();
  }

  Value slice(const Node& n, const Value& obj, const Value& b, const Value& e, const Value& st) const {
    auto as_int = [&](const Value& v, const char* what) -> std::optional<int64_t> {
      if (v.kind == Value::Undefined || v.kind == Value::None) return std::nullopt;
      if (v.kind != Value::Int) error(n, std::string("slice ") + what + " must be an integer");
      return v.i;
    };
    int64_t step = as_int(st, "step").value_or(1);
    if (step == 0) error(n, "slice step cannot be zero");
    auto sb = as_int(b, "start"), se = as_int(e, "stop");
    auto indices = [&](int64_t len) {
      std::vector<size_t> out;
      auto norm = [&](std::optional<int64_t> x, int64_t def) {
        if (!x) return def;
        int64_t v = *x < 0 ? *x + len : *x;
        if (step > 0) return std::clamp<int64_t>(v, 0, len);
        return std::clamp<int64_t>(v, -1, len - 1);
      };
      int64_t start = norm(sb, step > 0 ? 0 : len - 1), stop = norm(se, step > 0 ? len : -1);
      for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) out.push_back(size_t(k));
      return out;
    };
    if (obj.kind == Value::Arr) {
      Array r;
      for (auto k : indices(int64_t(obj.a->size()))) r.push_back((*obj.a)[k]);
      return Value(std::move(r));
    }
    if (obj.kind == Value::Str) {
      auto v = cps(obj.s);
      std::string r;
      for (auto k : indices(int64_t(v.size()))) append_utf8(r, v[k]);
      return Value(r);
    }
    error(n, std::string("cannot slice ") + type_name(obj));
  }

  Value binop(const Node& n, const std::string& op, const Value& x, const Value& y) const {
    if (op == "~") return Value(to_str(x) + to_str(y));
    if (op == "+") {
      if (x.kind == Value::Str && y.kind == Value::Str) return Value(x.s + y.s);
      if (x.kind == Value::Arr && y.kind == Value::Arr) {
        Array r = *x.a;
        r.insert(r.end(), y.a->begin(), y.a->end());
        return Value(std::move(r));
      }
    }
    if (op == "*" && ((x.kind == Value::Str && y.kind == Value::Int) || (x.kind == Value::Int && y.kind == Value::Str))) {
      const std::string& s = x.kind == Value::Str ? x.s : y.s;
      int64_t k = x.kind == Value::Int ? x.i : y.i;
      std::string r;
      for (int64_t j = 0; j < k && r.size() < (64u << 20); ++j) r += s;
      return Value(r);
    }
    if (x.is_num() && y.is_num() && x.kind != Value::Bool && y.kind != Value::Bool) {
      bool ints = x.kind == Value::Int && y.kind == Value::Int;
      if (op == "+") return ints ? Value(int64_t(uint64_t(x.i) + uint64_t(y.i))) : Value(x.num() + y.num());
      if (op == "-") return ints ? Value(int64_t(uint64_t(x.i) - uint64_t(y.i))) : Value(x.num() - y.num());
      if (op == "*") return ints ? Value(int64_t(uint64_t(x.i) * uint64_t(y.i))) : Value(x.num() * y.num());
      if (op == "/") {
        if (y.num() == 0) error(n, "division by zero");
        return Value(x.num() / y.num());
      }
      if (op == "//" || op == "%") {
        if (y.num() == 0) error(n, "division by zero");
        if (ints) {
          if (x.i == INT64_MIN && y.i == -1) error(n, "integer overflow");
          int64_t q = x.i / y.i, r = x.i % y.i;
          if (r != 0 && ((r < 0) != (y.i < 0))) --q, r += y.i;
          return op == "//" ? Value(q) : Value(r);
        }
        double q = std::floor(x.num() / y.num());
        return op == "//" ? Value(q) : Value(x.num() - q * y.num());
      }
      if (op == "**") {
        if (ints && y.i >= 0) {
          int64_t r = 1;
          for (int64_t k = 0; k < y.i && k < 64; ++k) r = int64_t(uint64_t(r) * uint64_t(x.i));
          return Value(r);
        }
        return Value(std::pow(x.num(), y.num()));
      }
    }
    if (op == "%" && x.kind == Value::Str) error(n, "printf-style string formatting is not supported");
    error(n, "unsupported operand types for " + op + ": " + type_name(x) + " and " + type_name(y));
  }

  // ---- evaluation

  Value eval(const Node& n, Ctx& c) const {
    if (eval_depth >= 1000) error(n, "expression nested too deeply");
    ++eval_depth;
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{eval_depth};
    return eval_node(n, c);
  }

  Value eval_node(const Node& n, Ctx& c) const {
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
        if (v.kind == Value::Int) return n.kind == NK::Neg ? Value(-v.i) : v;
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

  CallArgs eval_args(const Node& n, Ctx& c) const {
    CallArgs a;
    for (auto& e : n.list) a.pos.push_back(eval(*e, c));
    for (size_t k = 0; k < n.names.size(); ++k) a.kw.emplace_back(n.names[k], eval(*n.list2[k], c));
    return a;
  }

  Value eval_call(const Node& n, Ctx& c) const {
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

  Value call_fn(const Node& n, const Value& f, CallArgs& args) const {
    try {
      return (*f.fn)(args);
    } catch (const InputError&) {
      throw;
    } catch (const std::exception& e) {
      error(n, e.what());
    }
  }

  static std::string strip_chars(const std::string& s, const Value& chars, bool left, bool right) {
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

  static std::string case_map(const std::string& s, int mode) {  // 0 lower, 1 upper, 2 title, 3 capitalize
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

  static std::vector<std::string> split(const std::string& s, const Value& sep, int64_t maxsplit) {
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

  Value call_method(const Node& n, const Value& obj, const std::string& m, CallArgs& a) const {
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
              size_t idx = size_t(std::stoul(key));
              v = idx < a.pos.size() ? a.pos[idx] : Value::undef();
            } else v = a.get(SIZE_MAX, key);
            out += to_str(v);
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

  static std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
    if (from.empty()) {
      std::string out;
      int64_t done = 0;
      auto v = cps(s);
      for (size_t k = 0; k <= v.size(); ++k) {
        if (count < 0 || done < count) out += to, ++done;
        if (k < v.size()) append_utf8(out, v[k]);
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
      start = p + from.size();
      ++done;
    }
    out.append(s, start, std::string::npos);
    return out;
  }

  int64_t to_int(const Value& v, int64_t def) const {
    switch (v.kind) {
      case Value::Int: return v.i;
      case Value::Bool: return v.b;
      case Value::Float: return int64_t(v.f);
      case Value::Str: {
        try {
          size_t used = 0;
          std::string t = strip_chars(v.s, Value::undef(), true, true);
          int64_t r = std::stoll(t, &used);
          if (used == t.size()) return r;
          double d = std::stod(t, &used);
          if (used == t.size()) return int64_t(d);
        } catch (const std::exception&) {
        }
        return def;
      }
      default: return def;
    }
  }

  // Attribute path "a.b" for selectattr/map/sort/join/groupby.
  Value attr_path(const Node& n, const Value& v, const std::string& path) const {
    Value cur = v;
    size_t s = 0;
    while (true) {
      size_t e = path.find('.', s);
      std::string part = path.substr(s, e == std::string::npos ? std::string::npos : e - s);
      if (cur.is_undef()) return cur;
      cur = get_item(n, cur, std::isdigit(uint8_t(part.empty() ? 'x' : part[0])) ? Value(int64_t(std::stoll(part))) : Value(part));
      if (e == std::string::npos) return cur;
      s = e + 1;
    }
  }

  Value apply_filter(const Node& n, const std::string& f, const Value& v, CallArgs& a, Ctx& c) const {
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
        first = false;
      }
      return Value(out);
    }
    if (f == "replace") {
      Value from = a.get(0, "old"), to = a.get(1, "new"), cnt = a.get(2, "count");
      return Value(replace(to_str(v), to_str(from), to_str(to), cnt.kind == Value::Int ? cnt.i : -1));
    }
    if (f == "int") return Value(to_int(v, to_int(a.get(0, "default"), 0)));
    if (f == "float") {
      if (v.is_num()) return Value(v.num());
      if (v.kind == Value::Str) {
        try {
          size_t used = 0;
          double d = std::stod(v.s, &used);
          if (used == v.s.size()) return Value(d);
        } catch (const std::exception&) {
        }
      }
      Value d = a.get(0, "default");
      return d.is_num() ? Value(d.num()) : Value(0.0);
    }
    if (f == "abs") {
      if (v.kind == Value::Int) return Value(v.i < 0 ? -v.i : v.i);
      if (v.kind == Value::Float) return Value(std::fabs(v.f));
      error(n, "abs expects a number");
    }
    if (f == "round") {
      Value p = a.get(0, "precision");
      double scale = std::pow(10.0, p.kind == Value::Int ? double(p.i) : 0.0);
      std::string method = to_str(a.get(1, "method"));
      double x = v.num() * scale;
      double r = method == "floor" ? std::floor(x) : method == "ceil" ? std::ceil(x) : std::round(x);
      return Value(r / scale);
    }
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
    if (f == "min" || f == "max") {
      auto items = iterate(n, v);
      if (items.empty()) return Value::undef();
      Value best = items[0];
      for (auto& x : items)
        if ((f == "min") ? compare(n, x, best) < 0 : compare(n, x, best) > 0) best = x;
      return best;
    }
    if (f == "sort" || f == "dictsort") {
      bool rev = a.get(f == "sort" ? 0 : 2, "reverse").truthy();
      Value attr = a.get(2, "attribute");
      auto items = f == "sort" ? iterate(n, v) : std::vector<Value>{};
      if (f == "dictsort") {
        CallArgs none;
        items = *call_method(n, v, "items", none).a;
      }
      auto key = [&](const Value& x) {
        if (f == "dictsort") return (*x.a)[a.get(1, "by").kind == Value::Str && a.get(1, "by").s == "value" ? 1 : 0];
        return attr.kind == Value::Str ? attr_path(n, x, attr.s) : x;
      };
      std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
        Value kx = key(x), ky = key(y);
        if (kx.kind == Value::Str && ky.kind == Value::Str && !a.get(1, "case_sensitive").truthy() && f == "sort") {
          kx = Value(case_map(kx.s, 0));
          ky = Value(case_map(ky.s, 0));
        }
        int r = compare(n, kx, ky);
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
      std::string pad = w.kind == Value::Str ? w.s : std::string(size_t(w.kind == Value::Int ? w.i : 4), ' ');
      bool first = a.get(1, "first").truthy(), blank = a.get(2, "blank").truthy();
      std::string s = to_str(v), out;
      size_t line = 0, b = 0;
      while (b <= s.size()) {
        size_t e = s.find('\n', b);
        std::string ln = s.substr(b, e == std::string::npos ? std::string::npos : e - b);
        if ((line > 0 || first) && (blank || !ln.empty())) out += pad;
        out += ln;
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
      int64_t size = to_int(a.get(0, "linecount"), 1);
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

  bool apply_test(const Node& n, const std::string& t, const Value& v, CallArgs& a) const {
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

  // ---- statements

  Flow exec(const Node& n, Ctx& c, std::string& out) const {
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
        exec(*n.a, c, body);
        c.frames.back()[n.names[0]] = Value(body);
        return Flow::Normal;
      }
      case NK::Macro: c.frames.back()[n.str] = make_macro(n, c, nullptr); return Flow::Normal;
      case NK::CallBlock: {
        // caller() renders the block body in the current scope.
        auto snapshot = std::make_shared<Ctx>(c);
        Value caller = make_macro(n, *snapshot, snapshot);
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
        exec(*n.a, c, body);
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

  void assign(const Node& n, Ctx& c, const std::vector<std::string>& names, const Value& v) const {
    if (names.size() == 1) {
      c.frames.back()[names[0]] = v;
      return;
    }
    auto items = iterate(n, v);
    if (items.size() != names.size())
      error(n, fmt::format("cannot unpack {} values into {} names", items.size(), names.size()));
    for (size_t k = 0; k < names.size(); ++k) c.frames.back()[names[k]] = items[k];
  }

  Flow exec_for(const Node& n, Ctx& c, std::string& out) const {
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
    if (items.empty()) {
      if (n.d) return exec(*n.d, c, out) == Flow::Break ? Flow::Normal : Flow::Normal;
      return Flow::Normal;
    }
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

  // A macro (or a call block's caller when `scope` is set) as a callable value. It points into the
  // template's tree, which outlives every render.
  Value make_macro(const Node& n, Ctx& c, std::shared_ptr<Ctx> scope) const {
    const Node* np = &n;
    Frame globals = c.frames.front();
    const Interp* self = this;
    return Value(Function([self, np, globals, scope](CallArgs& a) -> Value {
      Ctx mc;
      if (scope) mc = *scope;
      else mc.frames.push_back(globals);
      mc.depth = scope ? scope->depth + 1 : 1;
      if (mc.depth > 64) self->error(*np, "macro recursion too deep");
      Frame params;
      size_t npos = 0;
      std::vector<Value> varargs;
      for (size_t k = 0; k < np->names.size(); ++k) {
        Value v = Value::undef(np->names[k]);
        bool found = false;
        for (auto& [key, val] : a.kw)
          if (key == np->names[k]) v = val, found = true;
        if (!found && npos < a.pos.size()) v = a.pos[npos++], found = true;
        if (!found && k < np->list2.size() && np->list2[k]) v = self->eval(*np->list2[k], mc);
        params[np->names[k]] = v;
      }
      for (; npos < a.pos.size(); ++npos) varargs.push_back(a.pos[npos]);
      params["varargs"] = Value(std::move(varargs));
      auto kwargs = std::make_shared<Object>();
      for (auto& [key, val] : a.kw) {
        bool is_param = std::find(np->names.begin(), np->names.end(), key) != np->names.end();
        if (key == "caller") params["caller"] = val;
        else if (!is_param) kwargs->set(key, val);
      }
      params["kwargs"] = Value(kwargs);
      mc.frames.push_back(std::move(params));
      std::string out;
      self->exec(*np->a, mc, out);
      return Value(out);
    }));
  }
};

Value make_namespace(CallArgs& a) {
  auto o = std::make_shared<Object>();
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
  auto toks = Lexer(src, name_).run();
  root_ = Parser(std::move(toks), name_).parse_template();
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& globals) const {
  Interp in{name_};
  Ctx c;
  c.frames.emplace_back();
  Frame& g = c.frames[0];
  g["namespace"] = Value(Function(make_namespace));
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
