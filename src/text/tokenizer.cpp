#include "text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <queue>
#include <shared_mutex>
#include <unordered_map>

#include "core/error.h"
#include "core/mapped_file.h"
#include "text/utf8.h"

namespace lily::text {

namespace {

using json = nlohmann::json;

// GPT-2 byte <-> unicode map: printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100...
struct ByteMap {
  static constexpr uint32_t kCps = 256 + 68;  // code points used by the map
  std::array<std::string, 256> to_str;
  std::array<int16_t, kCps> from_cp;  // -1: not a mapped code point
  ByteMap() {
    from_cp.fill(-1);
    uint32_t extra = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      uint32_t cp = printable ? uint32_t(b) : 256 + extra++;
      append_utf8(to_str[b], cp);
      from_cp[cp] = int16_t(b);
    }
  }
  int byte_of(uint32_t cp) const { return cp < kCps ? from_cp[cp] : -1; }
};
const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

// The GPT-2 pre-tokenizer regex, used by ByteLevel when use_regex is true.
constexpr const char* kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

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

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct PreTokStep {
  enum Kind { Split, ByteLevel, Digits } kind;
  std::unique_ptr<Regex> re;
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  bool add_prefix_space = false;
  bool individual_digits = false;
};

enum class NormForm { NFC, NFD, NFKC, NFKD };

bool is_word_char(uint32_t cp) {
  if (cp == '_') return true;
  auto cat = utf8proc_category(utf8proc_int32_t(cp));
  return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
         (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
}
bool is_ws(uint32_t cp) {
  return cp == ' ' || (cp >= 9 && cp <= 13) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}
// Last code point before byte offset `end` (valid UTF-8).
uint32_t cp_before(std::string_view s, size_t end, size_t* start = nullptr) {
  size_t i = end;
  do --i;
  while (i > 0 && (uint8_t(s[i]) & 0xC0) == 0x80);
  if (start) *start = i;
  size_t j = i;
  return next_cp(s, j);
}

// " " + p, kept alive in `store`.
std::string_view with_space(std::string_view p, std::deque<std::string>& store) {
  auto& s = store.emplace_back();
  s.reserve(p.size() + 1);
  s.push_back(' ');
  s.append(p);
  return s;
}

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

std::string read_file(const std::filesystem::path& p) { return read_text_file(p.string()); }

}  // namespace

struct Tokenizer::Impl {
  std::string where;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab;
  std::vector<std::string> id_str, id_bytes;
  std::vector<uint8_t> id_special;  // 1 for added tokens marked special
  std::vector<uint8_t> id_known;
  std::array<int32_t, 256> byte_id{};
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left, right) -> (rank, merged)
  bool ignore_merges = false;
  std::vector<AddedToken> added;
  std::array<std::vector<int>, 256> added_by_first;  // indices into `added`, longest first
  std::vector<NormForm> norm;
  std::vector<PreTokStep> pretok;
  std::map<std::string, std::string> cfg_tokens;
  int32_t eos = -1, im_end = -1, im_start = -1, endoftext = -1, pad = -1;

  mutable std::shared_mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache;
  static constexpr size_t kCacheMax = 1 << 17;

  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  std::string normalize(std::string_view s) const {
    std::string cur(s);
    for (auto f : norm) {
      if (f == NormForm::NFC) {
        cur = nfc(cur);
        continue;
      }
      int opt = UTF8PROC_STABLE;
      if (f == NormForm::NFD) opt |= UTF8PROC_DECOMPOSE;
      if (f == NormForm::NFKC) opt |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      if (f == NormForm::NFKD) opt |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      utf8proc_uint8_t* out = nullptr;
      auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(cur.data()), utf8proc_ssize_t(cur.size()), &out,
                            utf8proc_option_t(opt));
      if (n < 0) throw InputError(std::string("normalizer: ") + utf8proc_errmsg(n));
      cur.assign(reinterpret_cast<char*>(out), size_t(n));
      std::free(out);
    }
    return cur;
  }

  // Splits `s` at added tokens (those with normalized == want_normalized); calls plain(text) for the text
  // between them and tok(id) for each token.
  template <typename Plain, typename Tok>
  void split_added(std::string_view s, bool want_normalized, bool parse_special, Plain&& plain, Tok&& tok) const {
    size_t emitted = 0, i = 0;
    while (i < s.size()) {
      const auto& cands = added_by_first[uint8_t(s[i])];
      int hit = -1;
      for (int k : cands) {
        const auto& a = added[k];
        if (a.normalized != want_normalized || (a.special && !parse_special)) continue;
        if (s.compare(i, a.content.size(), a.content) == 0) {
          hit = k;
          break;
        }
      }
      if (hit < 0) {
        ++i;
        continue;
      }
      const auto& a = added[hit];
      size_t start = i, stop = i + a.content.size();
      if (a.single_word) {
        bool left_ok = start == 0 || !is_word_char(cp_before(s, start));
        size_t j = stop;
        bool right_ok = stop == s.size() || !is_word_char(next_cp(s, j));
        if (!left_ok || !right_ok) {
          i = stop;
          continue;
        }
      }
      if (a.lstrip) {
        while (start > emitted) {
          size_t p;
          uint32_t cp = cp_before(s, start, &p);
          if (!is_ws(cp)) break;
          start = p;
        }
      }
      if (a.rstrip) {
        while (stop < s.size()) {
          size_t j = stop;
          if (!is_ws(next_cp(s, j))) break;
          stop = j;
        }
      }
      if (start > emitted) plain(s.substr(emitted, start - emitted));
      tok(a.id);
      emitted = i = stop;
    }
    if (emitted < s.size()) plain(s.substr(emitted));
  }

  // Applies the pre-tokenizer steps; returns the pieces (views into `s` or into `store`).
  void pre_tokenize(std::string_view s, std::vector<std::string_view>& pieces, std::deque<std::string>& store) const {
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

  void split_regex(std::string_view p, const PreTokStep& st, std::vector<std::string_view>& out) const {
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

  void bpe(std::string_view word, std::vector<int32_t>& out) const {
    if (word.empty()) return;
    {
      std::shared_lock lk(cache_mu);
      auto it = cache.find(word);
      if (it != cache.end()) {
        out.insert(out.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> ids;
    if (ignore_merges) {
      std::string bl;
      for (char c : word) bl += byte_map().to_str[uint8_t(c)];
      auto it = vocab.find(bl);
      if (it != vocab.end()) ids.push_back(it->second);
    }
    if (ids.empty()) ids = merge_word(word);
    out.insert(out.end(), ids.begin(), ids.end());
    std::unique_lock lk(cache_mu);
    if (cache.size() >= kCacheMax) cache.clear();
    cache.emplace(std::string(word), std::move(ids));
  }

  // Merges by rank, lowest rank first and leftmost first among equal ranks.
  std::vector<int32_t> merge_word(std::string_view word) const {
    struct Sym {
      int32_t id;
      int prev, next;
    };
    std::vector<Sym> sy(word.size());
    for (size_t i = 0; i < word.size(); ++i) sy[i] = {byte_id[uint8_t(word[i])], int(i) - 1, i + 1 < word.size() ? int(i) + 1 : -1};
    struct Cand {
      int32_t rank;
      int pos;
      int32_t l, r;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<>> q;
    auto push = [&](int i) {
      if (i < 0 || sy[i].next < 0) return;
      auto it = merges.find(key(sy[i].id, sy[sy[i].next].id));
      if (it != merges.end()) q.push({it->second.first, i, sy[i].id, sy[sy[i].next].id});
    };
    for (size_t i = 0; i + 1 < word.size(); ++i) push(int(i));
    while (!q.empty()) {
      auto c = q.top();
      q.pop();
      int i = c.pos;
      if (sy[i].id != c.l || sy[i].next < 0 || sy[sy[i].next].id != c.r) continue;  // stale
      int j = sy[i].next;
      sy[i].id = merges.at(key(c.l, c.r)).second;
      sy[i].next = sy[j].next;
      if (sy[j].next >= 0) sy[sy[j].next].prev = i;
      sy[j].id = -1;
      push(sy[i].prev);
      push(i);
    }
    std::vector<int32_t> ids;
    for (int i = 0; i >= 0; i = sy[i].next) ids.push_back(sy[i].id);
    return ids;
  }

  void encode_plain(std::string_view raw, bool parse_special, std::vector<int32_t>& out) const {
    std::string normed = norm.empty() ? std::string(raw) : normalize(raw);
    std::vector<std::string_view> pieces;
    std::deque<std::string> store;
    split_added(
        normed, true, parse_special,
        [&](std::string_view seg) {
          store.clear();
          pre_tokenize(seg, pieces, store);
          for (auto p : pieces) bpe(p, out);
        },
        [&](int32_t id) { out.push_back(id); });
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::shared_ptr<const Tokenizer> Tokenizer::load(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  fs::path file = path, dir = path;
  if (fs::is_directory(path)) file = path / "tokenizer.json";
  else dir = path.parent_path();
  if (!fs::exists(file)) fail("tokenizer: {} not found", file.string());
  json tok, cfg;
  try {
    tok = json::parse(read_file(file));
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", file.string(), e.what());
  }
  auto cfg_file = dir / "tokenizer_config.json";
  if (fs::exists(cfg_file)) {
    try {
      cfg = json::parse(read_file(cfg_file));
    } catch (const json::exception& e) {
      fail("{}: not valid JSON: {}", cfg_file.string(), e.what());
    }
  }
  return from_json(tok, cfg, file.string());
}

std::shared_ptr<const Tokenizer> Tokenizer::from_json(const json& tok, const json& cfg, const std::string& where) {
  auto im = std::make_unique<Impl>();
  im->where = where;
  auto field = [&](const json& obj, const char* name, const std::string& path) -> const json& {
    if (!obj.is_object() || !obj.contains(name)) fail("{}: missing field {}.{}", where, path, name);
    return obj.at(name);
  };
  auto get_str = [&](const json& v, const std::string& path) -> std::string {
    if (!v.is_string()) fail("{}: {} must be a string", where, path);
    return v.get<std::string>();
  };
  if (!tok.is_object()) fail("{}: top level must be a JSON object", where);

  // model
  const json& model = field(tok, "model", "");
  if (model.contains("type") && !(model["type"].is_string() && model["type"] == "BPE"))
    fail("{}: model.type {} is not supported (only BPE)", where, model["type"].dump());
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(k) && model[k].is_string() && !model[k].get<std::string>().empty())
      fail("{}: model.{} is not supported", where, k);
  if (model.contains("byte_fallback") && model["byte_fallback"].is_boolean() && model["byte_fallback"].get<bool>())
    fail("{}: model.byte_fallback is not supported (byte-level BPE only)", where);
  if (model.contains("ignore_merges") && model["ignore_merges"].is_boolean())
    im->ignore_merges = model["ignore_merges"].get<bool>();
  const json& vocab = field(model, "vocab", "model");
  if (!vocab.is_object()) fail("{}: model.vocab must be an object", where);
  int32_t max_id = -1;
  im->vocab.reserve(vocab.size() + 1024);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > INT32_MAX)
      fail("{}: model.vocab[\"{}\"] must be a non-negative integer id", where, it.key());
    auto id = it.value().get<int32_t>();
    im->vocab.emplace(it.key(), id);
    max_id = std::max(max_id, id);
  }
  const json* added = tok.contains("added_tokens") ? &tok["added_tokens"] : nullptr;
  if (added && !added->is_null() && !added->is_array()) fail("{}: added_tokens must be an array", where);
  if (added && added->is_array()) {
    for (size_t i = 0; i < added->size(); ++i) {
      const json& a = (*added)[i];
      std::string path = fmt::format("added_tokens[{}]", i);
      AddedToken t;
      const json& idv = field(a, "id", path);
      if (!idv.is_number_integer() || idv.get<int64_t>() < 0 || idv.get<int64_t>() > INT32_MAX)
        fail("{}: {}.id must be a non-negative integer", where, path);
      t.id = idv.get<int32_t>();
      t.content = get_str(field(a, "content", path), path + ".content");
      if (t.content.empty()) fail("{}: {}.content is empty", where, path);
      if (!utf8_valid(t.content)) fail("{}: {}.content is not valid UTF-8", where, path);
      auto flag = [&](const char* n, bool def) {
        if (!a.contains(n) || a[n].is_null()) return def;
        if (!a[n].is_boolean()) fail("{}: {}.{} must be true or false", where, path, n);
        return a[n].get<bool>();
      };
      t.special = flag("special", false);
      t.normalized = flag("normalized", !t.special);
      t.lstrip = flag("lstrip", false);
      t.rstrip = flag("rstrip", false);
      t.single_word = flag("single_word", false);
      max_id = std::max(max_id, t.id);
      im->added.push_back(std::move(t));
    }
  }
  size_t n = size_t(max_id + 1);
  im->id_str.assign(n, {});
  im->id_bytes.assign(n, {});
  im->id_special.assign(n, 0);
  im->id_known.assign(n, 0);
  const auto& bm = byte_map();
  for (auto& [s, id] : im->vocab) {
    im->id_str[id] = s;
    std::string bytes;
    for (size_t i = 0; i < s.size();) {
      size_t st = i;
      int byte = bm.byte_of(next_cp(s, i));
      if (byte >= 0) bytes += char(byte);
      else bytes.append(s, st, i - st);
    }
    im->id_bytes[id] = std::move(bytes);
    im->id_known[id] = 1;
  }
  for (auto& a : im->added) {
    im->id_str[a.id] = a.content;
    im->id_bytes[a.id] = a.content;
    im->id_special[a.id] = a.special;
    im->id_known[a.id] = 1;
    im->vocab.emplace(a.content, a.id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = im->vocab.find(bm.to_str[b]);
    if (it == im->vocab.end())
      fail("{}: model.vocab lacks the byte-level token for byte 0x{:02X} (\"{}\"); only byte-level BPE is supported", where, b,
           bm.to_str[b]);
    im->byte_id[b] = it->second;
  }
  const json& merges = field(model, "merges", "model");
  if (!merges.is_array()) fail("{}: model.merges must be an array", where);
  im->merges.reserve(merges.size() * 2);
  std::string a, b, ab;
  for (size_t r = 0; r < merges.size(); ++r) {
    const json& m = merges[r];
    if (m.is_string()) {
      auto s = m.get<std::string>();
      auto sp = s.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 >= s.size() || s.find(' ', sp + 1) != std::string::npos)
        fail("{}: model.merges[{}] \"{}\" is not two tokens separated by one space", where, r, s);
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get_ref<const std::string&>();
      b = m[1].get_ref<const std::string&>();
    } else {
      fail("{}: model.merges[{}] must be \"a b\" or [\"a\", \"b\"]", where, r);
    }
    ab.assign(a).append(b);
    auto ia = im->vocab.find(a), ib = im->vocab.find(b), iab = im->vocab.find(ab);
    if (ia == im->vocab.end() || ib == im->vocab.end() || iab == im->vocab.end())
      fail("{}: model.merges[{}] (\"{}\" + \"{}\") uses a token missing from model.vocab", where, r, a, b);
    im->merges.emplace(Impl::key(ia->second, ib->second), std::pair<int32_t, int32_t>{int32_t(r), iab->second});
  }
  for (size_t k = 0; k < im->added.size(); ++k) im->added_by_first[uint8_t(im->added[k].content[0])].push_back(int(k));
  for (auto& v : im->added_by_first)
    std::stable_sort(v.begin(), v.end(), [&](int x, int y) { return im->added[x].content.size() > im->added[y].content.size(); });

  // normalizer
  std::function<void(const json&, const std::string&)> add_norm = [&](const json& nj, const std::string& path) {
    if (nj.is_null()) return;
    std::string type = get_str(field(nj, "type", path), path + ".type");
    if (type == "NFC") im->norm.push_back(NormForm::NFC);
    else if (type == "NFD") im->norm.push_back(NormForm::NFD);
    else if (type == "NFKC") im->norm.push_back(NormForm::NFKC);
    else if (type == "NFKD") im->norm.push_back(NormForm::NFKD);
    else if (type == "Sequence") {
      const json& l = field(nj, "normalizers", path);
      if (!l.is_array()) fail("{}: {}.normalizers must be an array", where, path);
      for (size_t i = 0; i < l.size(); ++i) add_norm(l[i], fmt::format("{}.normalizers[{}]", path, i));
    } else {
      fail("{}: {}.type \"{}\" is not supported (NFC, NFD, NFKC, NFKD, Sequence)", where, path, type);
    }
  };
  if (tok.contains("normalizer")) add_norm(tok["normalizer"], "normalizer");

  // pre-tokenizer
  std::function<void(const json&, const std::string&)> add_pre = [&](const json& pj, const std::string& path) {
    if (pj.is_null()) return;
    std::string type = get_str(field(pj, "type", path), path + ".type");
    PreTokStep st{};
    if (type == "Sequence") {
      const json& l = field(pj, "pretokenizers", path);
      if (!l.is_array()) fail("{}: {}.pretokenizers must be an array", where, path);
      for (size_t i = 0; i < l.size(); ++i) add_pre(l[i], fmt::format("{}.pretokenizers[{}]", path, i));
      return;
    } else if (type == "Split") {
      st.kind = PreTokStep::Split;
      const json& pat = field(pj, "pattern", path);
      std::string re;
      if (pat.is_object() && pat.contains("Regex")) re = adapt_regex(get_str(pat["Regex"], path + ".pattern.Regex"));
      else if (pat.is_object() && pat.contains("String")) re = regex_quote(get_str(pat["String"], path + ".pattern.String"));
      else fail("{}: {}.pattern must be {{\"Regex\": ...}} or {{\"String\": ...}}", where, path);
      st.re = std::make_unique<Regex>(re, where + ": " + path + ".pattern");
      std::string beh = get_str(field(pj, "behavior", path), path + ".behavior");
      if (beh == "Isolated") st.behavior = SplitBehavior::Isolated;
      else if (beh == "Removed") st.behavior = SplitBehavior::Removed;
      else if (beh == "MergedWithPrevious") st.behavior = SplitBehavior::MergedWithPrevious;
      else if (beh == "MergedWithNext") st.behavior = SplitBehavior::MergedWithNext;
      else if (beh == "Contiguous") st.behavior = SplitBehavior::Contiguous;
      else fail("{}: {}.behavior \"{}\" is not a known split behaviour", where, path, beh);
      if (pj.contains("invert") && pj["invert"].is_boolean()) st.invert = pj["invert"].get<bool>();
    } else if (type == "ByteLevel") {
      st.kind = PreTokStep::ByteLevel;
      if (pj.contains("add_prefix_space") && pj["add_prefix_space"].is_boolean())
        st.add_prefix_space = pj["add_prefix_space"].get<bool>();
      bool use_regex = !pj.contains("use_regex") || (pj["use_regex"].is_boolean() && pj["use_regex"].get<bool>());
      if (use_regex) st.re = std::make_unique<Regex>(adapt_regex(kGpt2Regex), where + ": " + path);
    } else if (type == "Digits") {
      st.kind = PreTokStep::Digits;
      st.individual_digits = pj.contains("individual_digits") && pj["individual_digits"].is_boolean() &&
                             pj["individual_digits"].get<bool>();
    } else {
      fail("{}: {}.type \"{}\" is not supported (Split, ByteLevel, Digits, Sequence)", where, path, type);
    }
    im->pretok.push_back(std::move(st));
  };
  if (tok.contains("pre_tokenizer")) add_pre(tok["pre_tokenizer"], "pre_tokenizer");
  if (tok.contains("decoder") && tok["decoder"].is_object()) {
    const json& d = tok["decoder"];
    if (d.contains("type") && d["type"].is_string() && d["type"] != "ByteLevel")
      fail("{}: decoder.type {} is not supported (ByteLevel)", where, d["type"].dump());
  }

  // named tokens
  if (cfg.is_object()) {
    for (const char* name : {"bos_token", "eos_token", "pad_token", "unk_token"}) {
      if (!cfg.contains(name)) continue;
      const json& v = cfg[name];
      if (v.is_string()) im->cfg_tokens[name] = v.get<std::string>();
      else if (v.is_object() && v.contains("content") && v["content"].is_string())
        im->cfg_tokens[name] = v["content"].get<std::string>();
    }
  }
  auto find = [&](const std::string& s) -> int32_t {
    auto it = im->vocab.find(s);
    return it == im->vocab.end() ? -1 : it->second;
  };
  im->im_end = find("<|im_end|>");
  im->im_start = find("<|im_start|>");
  im->endoftext = find("<|endoftext|>");
  im->eos = im->cfg_tokens.count("eos_token") ? find(im->cfg_tokens["eos_token"]) : -1;
  if (im->eos < 0) im->eos = im->im_end >= 0 ? im->im_end : im->endoftext;
  im->pad = im->cfg_tokens.count("pad_token") ? find(im->cfg_tokens["pad_token"]) : -1;
  if (im->pad < 0) im->pad = im->endoftext;
  return std::shared_ptr<const Tokenizer>(new Tokenizer(std::move(im)));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::string clean;
  if (!utf8_valid(text)) {
    clean = utf8_sanitize(text);
    text = clean;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  impl_->split_added(
      text, false, parse_special, [&](std::string_view seg) { impl_->encode_plain(seg, parse_special, out); },
      [&](int32_t id) { out.push_back(id); });
  return out;
}

const std::string& Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || size_t(id) >= impl_->id_known.size() || !impl_->id_known[id])
    fail("token id {} is not in the vocabulary of {}", id, impl_->where);
  return impl_->id_bytes[id];
}

const std::string& Tokenizer::token_string(int32_t id) const {
  token_bytes(id);
  return impl_->id_str[id];
}

std::optional<int32_t> Tokenizer::token_id(std::string_view s) const {
  auto it = impl_->vocab.find(s);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (auto id : ids) {
    const auto& b = token_bytes(id);
    if (skip_special && impl_->id_special[id]) continue;
    bytes += b;
  }
  return utf8_valid(bytes) ? bytes : utf8_sanitize(bytes);
}

int32_t Tokenizer::vocab_size() const { return int32_t(impl_->id_known.size()); }
bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && size_t(id) < impl_->id_special.size() && impl_->id_special[id];
}
const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }
int32_t Tokenizer::eos_id() const { return impl_->eos; }
int32_t Tokenizer::im_end_id() const { return impl_->im_end; }
int32_t Tokenizer::im_start_id() const { return impl_->im_start; }
int32_t Tokenizer::endoftext_id() const { return impl_->endoftext; }
int32_t Tokenizer::pad_id() const { return impl_->pad; }
const std::string& Tokenizer::config_token(const std::string& name) const {
  static const std::string empty;
  auto it = impl_->cfg_tokens.find(name);
  return it == impl_->cfg_tokens.end() ? empty : it->second;
}
std::vector<int32_t> Tokenizer::stop_ids() const {
  std::vector<int32_t> v;
  for (int32_t id : {impl_->eos, impl_->im_end, impl_->endoftext})
    if (id >= 0 && std::find(v.begin(), v.end(), id) == v.end()) v.push_back(id);
  return v;
}

StreamDecoder::StreamDecoder(std::shared_ptr<const Tokenizer> tok, bool skip_special)
    : tok_(std::move(tok)), skip_special_(skip_special) {}

std::string StreamDecoder::push(int32_t id) {
  const auto& b = tok_->token_bytes(id);
  if (skip_special_ && tok_->is_special(id)) return {};
  pending_ += b;
  size_t n = utf8_complete_prefix(pending_);
  if (n == 0) return {};
  std::string out = utf8_sanitize(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

void StreamDecoder::reset() { pending_.clear(); }

}  // namespace lily::text
