// A context-free grammar over bytes, the form structured outputs are compiled to (JSON schemas, forced
// tool calls). Rules are alternatives of sequences; a symbol is a set of bytes or a reference to a rule.
// Terminals are bytes, not characters: UTF-8 is spelled out as byte sequences, so a token holding part
// of a character is matched like any other bytes. Grammars must not be left-recursive (checked).
#pragma once
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace lily::text {

struct ByteSet {
  std::array<uint64_t, 4> w{};
  static ByteSet of(uint8_t c) { return ByteSet().add(c); }
  static ByteSet range(uint8_t lo, uint8_t hi) { return ByteSet().add(lo, hi); }
  ByteSet& add(uint8_t c) {
    w[c >> 6] |= uint64_t(1) << (c & 63);
    return *this;
  }
  ByteSet& add(uint8_t lo, uint8_t hi) {
    for (unsigned c = lo; c <= hi; ++c) add(uint8_t(c));
    return *this;
  }
  ByteSet& remove(uint8_t c) {
    w[c >> 6] &= ~(uint64_t(1) << (c & 63));
    return *this;
  }
  bool has(uint8_t c) const { return w[c >> 6] >> (c & 63) & 1; }
  bool empty() const { return !(w[0] | w[1] | w[2] | w[3]); }
  bool operator==(const ByteSet&) const = default;
};

class Grammar {
 public:
  using RuleId = uint32_t;
  struct Symbol {
    enum Kind : uint8_t { Bytes, Rule } kind = Bytes;
    uint32_t index = 0;  // Bytes: into byte_sets(); Rule: the rule id
  };
  using Seq = std::vector<Symbol>;

  // A new rule without alternatives (add them with alt(); a rule may refer to itself or to later rules).
  RuleId rule(std::string name);
  void alt(RuleId r, Seq seq);
  // A rule with the given alternatives.
  RuleId rule(std::string name, std::vector<Seq> alts);

  Symbol bytes(const ByteSet& s);
  static Symbol ref(RuleId r) { return {Symbol::Rule, r}; }
  Seq lit(std::string_view s);  // one byte symbol per byte

  void set_root(RuleId r) { root_ = r; }
  RuleId root() const { return root_; }

  size_t rules() const { return rules_.size(); }
  const std::string& name(RuleId r) const { return rules_[r].name; }
  const std::vector<Seq>& alts(RuleId r) const { return rules_[r].alts; }
  const std::vector<ByteSet>& byte_sets() const { return sets_; }

  // The first problem among the rules reachable from `from`, naming the rule: one without an alternative,
  // left-recursive, or one that can never finish (every derivation infinite, or over 512 MiB); "" if none.
  std::string problem(RuleId from) const;
  // InternalError with problem(root()) (a grammar built by the engine itself).
  void check() const;
  // Fewest bytes any derivation of each rule spells (after check()).
  std::vector<int32_t> min_lengths() const;
  // The same over `rules` alone (they must refer to no rule outside them); other entries stay unknown.
  std::vector<int32_t> min_lengths(const std::vector<RuleId>& rules) const;
  // GBNF-like text, for messages and tests.
  std::string to_string() const;

 private:
  struct RuleDef {
    std::string name;
    std::vector<Seq> alts;
  };
  std::vector<RuleDef> rules_;
  std::vector<ByteSet> sets_;
  RuleId root_ = 0;
};

// Concatenation of sequences.
Grammar::Seq cat(std::initializer_list<Grammar::Seq> parts);

// Any bytes that do not contain `stop` nor any of `forbidden`, then `stop` itself (the rule ends right
// after the first occurrence of `stop`). `allowed` limits the bytes of the text before `stop`.
// `forbidden` strings must not occur in `stop`.
Grammar::RuleId text_until(Grammar& g, const std::string& name, std::string_view stop, const ByteSet& allowed,
                           std::initializer_list<std::string_view> forbidden = {});

// Rules for well-formed UTF-8 characters (one to four bytes, no surrogates or overlongs) whose first
// byte lies in `ascii` when it is a single byte.
Grammar::RuleId utf8_char(Grammar& g, const std::string& name, const ByteSet& ascii);

}  // namespace lily::text
