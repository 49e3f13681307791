// UTF-8 helpers shared by the tokenizer, the template engine and the output parsers.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace lily::text {

// Appends code point `cp` (must be <= 0x10FFFF) as UTF-8.
void append_utf8(std::string& out, uint32_t cp);

// Decodes the code point starting at s[i] and advances i. Input must be valid UTF-8.
uint32_t next_cp(std::string_view s, size_t& i);

// True when `s` is well-formed UTF-8 (no overlongs, surrogates or values above U+10FFFF).
bool utf8_valid(std::string_view s);

// Replaces each maximal ill-formed subsequence with U+FFFD (the WHATWG / Unicode "maximal subpart"
// rule, as Rust's from_utf8_lossy and JavaScript's TextDecoder do).
std::string utf8_sanitize(std::string_view s);

// Length of the longest prefix of `s` that does not end inside a sequence which more bytes could still
// complete. The rest (at most 3 bytes) is held back by streaming decoders.
size_t utf8_complete_prefix(std::string_view s);

// Unicode NFC of valid UTF-8 (utf8proc). Text made only of code points below U+0300 is returned as is.
std::string nfc(std::string_view s);

// Number of code points in valid UTF-8.
size_t utf8_length(std::string_view s);

}  // namespace lily::text
