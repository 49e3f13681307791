#include "text/grammar.h"

#include <algorithm>
#include <climits>
#include <map>
#include <queue>

#include <fmt/format.h>

#include "core/error.h"

namespace lily::text {

Grammar::RuleId Grammar::rule(std::string name) {
  rules_.push_back({std::move(name), {}});
  return RuleId(rules_.size() - 1);
}

void Grammar::alt(RuleId r, Seq seq) {
  LILY_ASSERT(r < rules_.size());
  for (auto& s : seq) LILY_ASSERT(s.kind == Symbol::Rule || s.index < sets_.size());  // rules: check()
  rules_[r].alts.push_back(std::move(seq));
}

Grammar::RuleId Grammar::rule(std::string name, std::vector<Seq> alts) {
  RuleId r = rule(std::move(name));
  for (auto& a : alts) alt(r, std::move(a));
  return r;
}

Grammar::Symbol Grammar::bytes(const ByteSet& s) {
  LILY_ASSERT(!s.empty());
  for (size_t i = 0; i < sets_.size(); ++i)
    if (sets_[i] == s) return {Symbol::Bytes, uint32_t(i)};
  sets_.push_back(s);
  return {Symbol::Bytes, uint32_t(sets_.size() - 1)};
}

Grammar::Seq Grammar::lit(std::string_view s) {
  Seq out;
  for (char c : s) out.push_back(bytes(ByteSet::of(uint8_t(c))));
  return out;
}

std::vector<int32_t> Grammar::min_lengths() const {
  std::vector<RuleId> all(rules_.size());
  for (size_t r = 0; r < all.size(); ++r) all[r] = RuleId(r);
  return min_lengths(all);
}

// Knuth's generalisation of Dijkstra: an alternative's length is known once all its rules' are; the
// shortest known rule is final. O(symbols log rules), however the rules refer to each other.
std::vector<int32_t> Grammar::min_lengths(const std::vector<RuleId>& rules) const {
  const int64_t inf = INT32_MAX / 4;
  std::vector<int32_t> len(rules_.size(), int32_t(inf));
  struct Alt {
    RuleId owner;
    int64_t sum = 0;     // bytes plus the lengths of the rules known so far
    size_t pending = 0;  // rule symbols whose length is not known yet
  };
  std::vector<Alt> alts;
  std::vector<std::vector<uint32_t>> users(rules_.size());  // rule -> alternatives using it (once per use)
  using Item = std::pair<int64_t, RuleId>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> queue;
  for (RuleId r : rules)
    for (auto& a : rules_[r].alts) {
      Alt x{r};
      for (auto& s : a) {
        if (s.kind == Symbol::Bytes) {
          ++x.sum;
        } else {
          users[s.index].push_back(uint32_t(alts.size()));
          ++x.pending;
        }
      }
      if (x.pending == 0) queue.push({x.sum, r});
      alts.push_back(x);
    }
  std::vector<char> done(rules_.size(), 0);
  while (!queue.empty()) {
    auto [d, r] = queue.top();
    queue.pop();
    if (done[r]) continue;
    done[r] = 1;
    len[r] = int32_t(std::min(d, inf));
    for (uint32_t ai : users[r]) {
      Alt& a = alts[ai];
      a.sum = std::min(a.sum + len[r], inf);
      if (--a.pending == 0 && !done[a.owner]) queue.push({a.sum, a.owner});
    }
  }
  return len;
}

std::string Grammar::problem(RuleId from) const {
  if (from >= rules_.size()) return fmt::format("grammar rule {} does not exist", from);
  // The rules reachable from `from`, each checked for alternatives and known references.
  std::vector<char> seen(rules_.size(), 0);
  std::vector<RuleId> reach = {from};
  seen[from] = 1;
  for (size_t i = 0; i < reach.size(); ++i) {
    const RuleDef& d = rules_[reach[i]];
    if (d.alts.empty()) return fmt::format("grammar rule '{}' has no alternative", d.name);
    for (auto& a : d.alts)
      for (auto& s : a) {
        if (s.kind != Symbol::Rule) continue;
        if (s.index >= rules_.size()) return fmt::format("grammar rule '{}' refers to an unknown rule", d.name);
        if (!seen[s.index]) {
          seen[s.index] = 1;
          reach.push_back(s.index);
        }
      }
  }
  auto len = min_lengths(reach);
  for (RuleId r : reach)
    if (len[r] >= INT32_MAX / 4) return fmt::format("grammar rule '{}' can never finish (or needs over 512 MiB of text)", rules_[r].name);
  // Left recursion: r reaches itself through symbols that can all be empty. An explicit stack: chains
  // of optional rules can be long.
  auto left = [&](RuleId r) {
    std::vector<RuleId> out;
    for (auto& a : rules_[r].alts)
      for (auto& s : a) {
        if (s.kind == Symbol::Bytes) break;
        out.push_back(s.index);
        if (len[s.index] > 0) break;
      }
    return out;
  };
  std::vector<int> mark(rules_.size(), 0);  // 0 new, 1 on the path, 2 done
  struct Frame {
    RuleId r;
    std::vector<RuleId> next;
    size_t i = 0;
  };
  for (RuleId start : reach) {
    if (mark[start]) continue;
    std::vector<Frame> path;
    path.push_back({start, left(start)});
    mark[start] = 1;
    while (!path.empty()) {
      Frame& f = path.back();
      if (f.i == f.next.size()) {
        mark[f.r] = 2;
        path.pop_back();
        continue;
      }
      RuleId n = f.next[f.i++];
      if (mark[n] == 1) return fmt::format("grammar rule '{}' is left-recursive", rules_[n].name);
      if (mark[n] == 0) {
        mark[n] = 1;
        path.push_back({n, left(n)});
      }
    }
  }
  return {};
}

void Grammar::check() const {
  LILY_ASSERT(root_ < rules_.size());
  if (std::string p = problem(root_); !p.empty()) throw InternalError(p);
}

namespace {

std::string set_text(const ByteSet& s) {
  auto esc = [](unsigned c) {
    if (c == '\\' || c == ']' || c == '[' || c == '-' || c == '^') return fmt::format("\\{}", char(c));
    if (c >= 0x21 && c < 0x7f) return std::string(1, char(c));
    return fmt::format("\\x{:02x}", c);
  };
  int n = 0;
  for (unsigned c = 0; c < 256; ++c) n += s.has(uint8_t(c));
  if (n == 1)
    for (unsigned c = 0; c < 256; ++c)
      if (s.has(uint8_t(c))) {
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') return fmt::format("\"{}\"", char(c));
        return fmt::format("[{}]", esc(c));
      }
  std::string o = "[";
  for (unsigned c = 0; c < 256;) {
    if (!s.has(uint8_t(c))) {
      ++c;
      continue;
    }
    unsigned e = c;
    while (e + 1 < 256 && s.has(uint8_t(e + 1))) ++e;
    o += esc(c);
    if (e > c) {
      o += '-';
      o += esc(e);
    }
    c = e + 1;
  }
  return o + "]";
}

}  // namespace

std::string Grammar::to_string() const {
  std::string o;
  for (size_t r = 0; r < rules_.size(); ++r) {
    o += fmt::format("{} ::=", rules_[r].name);
    for (size_t a = 0; a < rules_[r].alts.size(); ++a) {
      if (a) o += " |";
      if (rules_[r].alts[a].empty()) o += " \"\"";
      for (auto& s : rules_[r].alts[a])
        o += " " + (s.kind == Symbol::Bytes ? set_text(sets_[s.index]) : rules_[s.index].name);
    }
    o += "\n";
  }
  return o;
}

Grammar::Seq cat(std::initializer_list<Grammar::Seq> parts) {
  Grammar::Seq out;
  for (auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

Grammar::RuleId text_until(Grammar& g, const std::string& name, std::string_view stop, const ByteSet& allowed,
                           std::initializer_list<std::string_view> forbidden) {
  LILY_ASSERT(!stop.empty());
  // States: the prefixes of stop, then those of the forbidden strings (a keyword automaton); a state is
  // the longest suffix of the text so far that is one of them.
  std::vector<std::string> node;
  std::map<std::string, size_t, std::less<>> index;
  auto add = [&](std::string_view w) {
    for (size_t k = 0; k < w.size(); ++k)
      if (index.emplace(std::string(w.substr(0, k)), node.size()).second) node.emplace_back(w.substr(0, k));
  };
  add(stop);
  for (std::string_view f : forbidden) {
    LILY_ASSERT(!f.empty() && stop.find(f) == std::string_view::npos);
    add(f);
  }
  const size_t m = node.size();
  std::vector<Grammar::RuleId> st(m);
  for (size_t k = 0; k < m; ++k) st[k] = g.rule(k ? fmt::format("{}-{}", name, k) : name);
  for (size_t k = 0; k < m; ++k) {
    std::vector<ByteSet> to(m + 1);  // to[m]: stop completed
    for (unsigned b = 0; b < 256; ++b) {
      const std::string t = node[k] + char(b);
      const std::string_view tv = t;
      if (std::any_of(forbidden.begin(), forbidden.end(), [&](std::string_view f) { return tv.ends_with(f); })) continue;
      size_t j = m;
      if (!tv.ends_with(stop))
        for (size_t cut = 0; j == m; ++cut)
          if (auto it = index.find(tv.substr(cut)); it != index.end()) j = it->second;
      const bool advances = t.size() <= stop.size() && stop.starts_with(tv);  // along stop itself
      if (advances || allowed.has(uint8_t(b))) to[j].add(uint8_t(b));
    }
    for (size_t j = 0; j <= m; ++j) {
      if (to[j].empty()) continue;
      if (j == m) g.alt(st[k], {g.bytes(to[j])});
      else g.alt(st[k], {g.bytes(to[j]), Grammar::ref(st[j])});
    }
  }
  return st[0];
}

Grammar::RuleId utf8_char(Grammar& g, const std::string& name, const ByteSet& ascii) {
  auto b = [&](uint8_t lo, uint8_t hi) { return g.bytes(ByteSet::range(lo, hi)); };
  std::vector<Grammar::Seq> alts;
  if (!ascii.empty()) alts.push_back({g.bytes(ascii)});
  alts.push_back({b(0xC2, 0xDF), b(0x80, 0xBF)});
  alts.push_back({b(0xE0, 0xE0), b(0xA0, 0xBF), b(0x80, 0xBF)});
  alts.push_back({g.bytes(ByteSet::range(0xE1, 0xEC).add(0xEE, 0xEF)), b(0x80, 0xBF), b(0x80, 0xBF)});
  alts.push_back({b(0xED, 0xED), b(0x80, 0x9F), b(0x80, 0xBF)});
  alts.push_back({b(0xF0, 0xF0), b(0x90, 0xBF), b(0x80, 0xBF), b(0x80, 0xBF)});
  alts.push_back({b(0xF1, 0xF3), b(0x80, 0xBF), b(0x80, 0xBF), b(0x80, 0xBF)});
  alts.push_back({b(0xF4, 0xF4), b(0x80, 0x8F), b(0x80, 0xBF), b(0x80, 0xBF)});
  return g.rule(name, std::move(alts));
}

}  // namespace lily::text
