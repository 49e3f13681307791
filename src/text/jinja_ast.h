// The parsed form of a Jinja template (internal to src/text): one Node type for statements and
// expressions, built by the parser (jinja_parser.h) and walked by the interpreter (jinja_interp.h).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "text/jinja_value.h"

namespace lily::text::jinja {

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

namespace detail {

// Lexes and parses a template (its trailing newline already dropped). Syntax errors -> InputError
// "NAME line L, column C: ...".
NodeP parse(const std::string& src, const std::string& name);

}  // namespace detail

}  // namespace lily::text::jinja
