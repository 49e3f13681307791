// Jinja lexer: template source -> tokens, with jinja2's trim_blocks and lstrip_blocks, the '-' / '+'
// whitespace controls, comments and {% raw %} blocks.
#include <cctype>
#include <string>
#include <vector>

#include "core/error.h"
#include "text/jinja_parser.h"
#include "text/utf8.h"

namespace lily::text::jinja::detail {

namespace {

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

std::vector<Token> lex(const std::string& src, const std::string& name) { return Lexer(src, name).run(); }

}  // namespace lily::text::jinja::detail
