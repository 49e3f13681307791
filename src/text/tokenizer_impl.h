// What the tokenizer's files share (internal to src/text): the loaded tokenizer (Tokenizer::Impl) and
// its pre-tokenizer steps. Loading is in tokenizer_load.cpp, the pre-tokenizer and the byte map in
// tokenizer_pretok.cpp (the only file that sees PCRE2), encoding and decoding in tokenizer.cpp.
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "text/tokenizer.h"

namespace lily::text {

namespace detail {

// GPT-2 byte <-> unicode map: printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100...
struct ByteMap {
  static constexpr uint32_t kCps = 256 + 68;  // code points used by the map
  std::array<std::string, 256> to_str;
  std::array<int16_t, kCps> from_cp;  // -1: not a mapped code point
  ByteMap();
  int byte_of(uint32_t cp) const { return cp < kCps ? from_cp[cp] : -1; }
};
const ByteMap& byte_map();

// The GPT-2 pre-tokenizer regex, used by ByteLevel when use_regex is true.
inline constexpr const char* kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The pattern rewritten for PCRE2 so that \s / \S match what the reference's Oniguruma matches.
std::string adapt_regex(const std::string& p);
// A pattern matching `s` literally.
std::string regex_quote(const std::string& s);

// A compiled PCRE2 pattern (UTF, UCP; JIT when available). Bad pattern -> InputError naming `where`.
struct Regex;
std::shared_ptr<const Regex> compile_regex(const std::string& pattern, const std::string& where);

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

struct PreTokStep {
  enum Kind { Split, ByteLevel, Digits } kind;
  std::shared_ptr<const Regex> re;  // Split; ByteLevel with use_regex
  SplitBehavior behavior = SplitBehavior::Isolated;
  bool invert = false;
  bool add_prefix_space = false;
  bool individual_digits = false;
};

enum class NormForm { NFC, NFD, NFKC, NFKD };

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

}  // namespace detail

struct Tokenizer::Impl {
  std::string where;
  std::unordered_map<std::string, int32_t, detail::StringHash, std::equal_to<>> vocab;
  std::vector<std::string> id_str, id_bytes;
  std::vector<uint8_t> id_special;  // 1 for added tokens marked special
  std::vector<uint8_t> id_known;
  std::array<int32_t, 256> byte_id{};
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left, right) -> (rank, merged)
  bool ignore_merges = false;
  std::vector<AddedToken> added;
  std::array<std::vector<int>, 256> added_by_first;  // indices into `added`, longest first
  std::vector<detail::NormForm> norm;
  std::vector<detail::PreTokStep> pretok;
  std::map<std::string, std::string> cfg_tokens;
  int32_t eos = -1, im_end = -1, im_start = -1, endoftext = -1, pad = -1;

  mutable std::shared_mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>, detail::StringHash, std::equal_to<>> cache;
  static constexpr size_t kCacheMax = 1 << 17;

  static uint64_t key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  // encoding (tokenizer.cpp)
  std::string normalize(std::string_view s) const;
  // Splits `s` at added tokens (those with normalized == want_normalized); calls plain(text) for the text
  // between them and tok(id) for each token.
  template <typename Plain, typename Tok>
  void split_added(std::string_view s, bool want_normalized, bool parse_special, Plain&& plain, Tok&& tok) const;
  void bpe(std::string_view word, std::vector<int32_t>& out) const;
  std::vector<int32_t> merge_word(std::string_view word) const;
  void encode_plain(std::string_view raw, bool parse_special, std::vector<int32_t>& out) const;

  // pre-tokenizer (tokenizer_pretok.cpp)
  // Applies the pre-tokenizer steps; returns the pieces (views into `s` or into `store`).
  void pre_tokenize(std::string_view s, std::vector<std::string_view>& pieces, std::deque<std::string>& store) const;
  void split_regex(std::string_view p, const detail::PreTokStep& st, std::vector<std::string_view>& out) const;
};

}  // namespace lily::text
