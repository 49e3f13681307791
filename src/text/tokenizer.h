// Byte-level BPE tokenizer read from a Hugging Face tokenizer.json, producing the same ids as the
// `tokenizers` library: added tokens split out first (honouring special / normalized / lstrip / rstrip /
// single_word), then the normalizer (NFC, NFKC, NFD, NFKD or a Sequence of them), the pre-tokenizer
// (Split with a PCRE2 regex or literal, ByteLevel, or a Sequence), BPE merges by rank, and the ByteLevel
// decoder. Thread-safe: one Tokenizer may be used from many threads.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace lily::text {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false, normalized = false, lstrip = false, rstrip = false, single_word = false;
};

class Tokenizer {
 public:
  // Loads DIR/tokenizer.json (or the file itself when `path` names a .json file) and, when present,
  // DIR/tokenizer_config.json for the eos/bos/pad token names. Malformed input -> InputError naming the
  // file and the field.
  static std::shared_ptr<const Tokenizer> load(const std::filesystem::path& path);
  // Builds from parsed tokenizer.json (`where` names the source in errors); `config` may be null.
  static std::shared_ptr<const Tokenizer> from_json(const nlohmann::json& tok, const nlohmann::json& config,
                                                    const std::string& where);
  ~Tokenizer();

  // Text -> ids. Invalid UTF-8 is first replaced by U+FFFD. With parse_special = false, added tokens
  // marked special are not recognised in the text (they are tokenized as plain text).
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  // Ids -> text (invalid byte sequences become U+FFFD). Unknown id -> InputError.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // Raw bytes of one token (added tokens: their content). Unknown id -> InputError.
  const std::string& token_bytes(int32_t id) const;
  // Vocabulary form of a token ("Ġworld"), as in tokenizer.json.
  const std::string& token_string(int32_t id) const;
  std::optional<int32_t> token_id(std::string_view token_string) const;

  int32_t vocab_size() const;  // one past the largest id
  bool is_special(int32_t id) const;
  const std::vector<AddedToken>& added_tokens() const;

  // Ids of named tokens; -1 when absent. eos: tokenizer_config eos_token, else <|im_end|> / <|endoftext|>.
  int32_t eos_id() const;
  int32_t im_end_id() const;
  int32_t im_start_id() const;
  int32_t endoftext_id() const;
  int32_t pad_id() const;
  // Token strings from tokenizer_config.json ("" when absent): bos_token, eos_token, pad_token, unk_token.
  const std::string& config_token(const std::string& name) const;
  // Ids a generation loop should stop at: eos, <|im_end|>, <|endoftext|> (those that exist).
  std::vector<int32_t> stop_ids() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of token ids into text pieces without ever splitting a UTF-8 character: bytes of an
// incomplete character are held until a later token completes them (or flush() replaces them by U+FFFD).
class StreamDecoder {
 public:
  explicit StreamDecoder(std::shared_ptr<const Tokenizer> tok, bool skip_special = false);
  std::string push(int32_t id);  // text that became complete with this token (may be empty)
  std::string flush();           // whatever is held back, ill-formed bytes replaced
  void reset();

 private:
  std::shared_ptr<const Tokenizer> tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace lily::text
