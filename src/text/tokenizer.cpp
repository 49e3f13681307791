// Encoding (added tokens, the normalizer, BPE merges by rank with a per-word cache) and decoding.
#include "text/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <queue>
#include <shared_mutex>

#include "core/error.h"
#include "text/tokenizer_impl.h"
#include "text/utf8.h"

namespace lily::text {

namespace {

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

}  // namespace

using detail::byte_map;
using detail::NormForm;

std::string Tokenizer::Impl::normalize(std::string_view s) const {
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

template <typename Plain, typename Tok>
void Tokenizer::Impl::split_added(std::string_view s, bool want_normalized, bool parse_special, Plain&& plain,
                                  Tok&& tok) const {
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

void Tokenizer::Impl::bpe(std::string_view word, std::vector<int32_t>& out) const {
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
std::vector<int32_t> Tokenizer::Impl::merge_word(std::string_view word) const {
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

void Tokenizer::Impl::encode_plain(std::string_view raw, bool parse_special, std::vector<int32_t>& out) const {
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

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

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
