// The pre-tokenizer: Split (PCRE2 regex or literal) with its behaviours, ByteLevel and Digits steps; the
// GPT-2 byte map.
#include <string>
#include <vector>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace lily::text {

namespace detail {

ByteMap::ByteMap() {
  from_cp.fill(-1);
  uint32_t extra = 0;
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    uint32_t cp = printable ? uint32_t(b) : 256 + extra++;
    append_utf8(to_str[b], cp);
    from_cp[cp] = int16_t(b);
  }
}
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// PCRE2's \s under UCP lacks U+0085 (NEL), which is White_Space for the Oniguruma engine the reference
// uses; rewrite \s / \S so that the two agree.
std::string adapt_regex(const std::string& p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char d = p[i + 1];
      if (d == 's') out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]";
      else if (d == 'S' && !in_class) out += "[^\\s\\x{85}]";
      else out += p.substr(i, 2);
      ++i;
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];  // a leading ']' is literal
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return out;
}

std::string regex_quote(const std::string& s) {
  std::string out = "\\Q";
  for (size_t i = 0; i < s.size(); ++i) {
    if (s.compare(i, 2, "\\E") == 0) {
      out += "\\E\\\\E\\Q";
      ++i;
    } else {
      out += s[i];
    }
  }
  return out + "\\E";
}

struct Regex {
  pcre2_code* code = nullptr;
  bool jit = false;
  Regex(const std::string& pattern, const std::string& where) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                         &off, nullptr);
    if (!code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      fail("{}: cannot compile regex at offset {}: {}", where, size_t(off), reinterpret_cast<char*>(msg));
    }
    jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
};

std::shared_ptr<const Regex> compile_regex(const std::string& pattern, const std::string& where) {
  return std::make_shared<const Regex>(pattern, where);
}

}  // namespace detail

namespace {

// Per-thread PCRE2 match state (match data sized for any of our patterns, a JIT stack for long runs).
struct MatchState {
  pcre2_match_data* md = pcre2_match_data_create(4, nullptr);
  pcre2_match_context* mc = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* js = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  MatchState() { pcre2_jit_stack_assign(mc, nullptr, js); }
  ~MatchState() {
    pcre2_match_data_free(md);
    pcre2_match_context_free(mc);
    pcre2_jit_stack_free(js);
  }
};
MatchState& match_state() {
  thread_local MatchState s;
  return s;
}

// " " + p, kept alive in `store`.
std::string_view with_space(std::string_view p, std::deque<std::string>& store) {
  auto& s = store.emplace_back();
  s.reserve(p.size() + 1);
  s.push_back(' ');
  s.append(p);
  return s;
}

}  // namespace

using detail::PreTokStep;
using detail::SplitBehavior;

void Tokenizer::Impl::pre_tokenize(std::string_view s, std::vector<std::string_view>& pieces,
                                   std::deque<std::string>& store) const {
  pieces.clear();
  pieces.push_back(s);
  std::vector<std::string_view> next;
  for (const auto& st : pretok) {
    next.clear();
    if (st.kind == PreTokStep::ByteLevel && !st.re) {
      if (st.add_prefix_space) {
        for (auto p : pieces) {
          if (!p.empty() && p[0] != ' ') {
            next.push_back(with_space(p, store));
          } else {
            next.push_back(p);
          }
        }
        pieces.swap(next);
      }
      continue;
    }
    if (st.kind == PreTokStep::Digits) {
      for (auto p : pieces) {
        size_t i = 0;
        while (i < p.size()) {
          bool dig = p[i] >= '0' && p[i] <= '9';
          size_t j = i + 1;
          if (!st.individual_digits || !dig)
            while (j < p.size() && (p[j] >= '0' && p[j] <= '9') == dig) ++j;
          next.push_back(p.substr(i, j - i));
          i = j;
        }
      }
      pieces.swap(next);
      continue;
    }
    for (auto p : pieces) {
      if (st.kind == PreTokStep::ByteLevel && st.add_prefix_space && !p.empty() && p[0] != ' ') {
        p = with_space(p, store);
      }
      split_regex(p, st, next);
    }
    pieces.swap(next);
  }
}

void Tokenizer::Impl::split_regex(std::string_view p, const PreTokStep& st, std::vector<std::string_view>& out) const {
  auto& ms = match_state();
  // (offset, length, is_match) spans covering p
  size_t pos = 0, last = 0;
  std::vector<std::pair<std::string_view, bool>> spans;
  auto subj = reinterpret_cast<PCRE2_SPTR>(p.data());
  while (pos <= p.size()) {
    int rc = st.re->jit ? pcre2_jit_match(st.re->code, subj, p.size(), pos, 0, ms.md, ms.mc)
                        : pcre2_match(st.re->code, subj, p.size(), pos, PCRE2_NO_UTF_CHECK, ms.md, ms.mc);
    if (rc < 0) {
      if (rc == PCRE2_ERROR_NOMATCH) break;
      fail("{}: pre-tokenizer regex failed with PCRE2 error {}", where, rc);
    }
    auto* ov = pcre2_get_ovector_pointer(ms.md);
    size_t s0 = ov[0], s1 = ov[1];
    if (s1 == s0) {  // empty match: step one character
      if (s0 >= p.size()) break;
      pos = s0 + 1;
      while (pos < p.size() && (uint8_t(p[pos]) & 0xC0) == 0x80) ++pos;
      continue;
    }
    if (s0 > last) spans.push_back({p.substr(last, s0 - last), false});
    spans.push_back({p.substr(s0, s1 - s0), true});
    last = pos = s1;
  }
  if (last < p.size()) spans.push_back({p.substr(last), false});
  if (st.invert)
    for (auto& sp : spans) sp.second = !sp.second;
  auto join = [](std::string_view a, std::string_view b) { return std::string_view(a.data(), a.size() + b.size()); };
  switch (st.behavior) {
    case SplitBehavior::Isolated:
      for (auto& sp : spans) out.push_back(sp.first);
      break;
    case SplitBehavior::Removed:
      for (auto& sp : spans)
        if (!sp.second) out.push_back(sp.first);
      break;
    case SplitBehavior::MergedWithPrevious: {
      size_t base = out.size();
      for (auto& sp : spans) {
        if (sp.second && out.size() > base) out.back() = join(out.back(), sp.first);
        else out.push_back(sp.first);
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool carry = false;
      for (auto& sp : spans) {
        if (carry) out.back() = join(out.back(), sp.first);
        else out.push_back(sp.first);
        carry = sp.second;
      }
      break;
    }
    case SplitBehavior::Contiguous: {
      bool prev_match = false;
      size_t base = out.size();
      for (auto& sp : spans) {
        if (sp.second && prev_match && out.size() > base) out.back() = join(out.back(), sp.first);
        else out.push_back(sp.first);
        prev_match = sp.second;
      }
      break;
    }
  }
}

}  // namespace lily::text
