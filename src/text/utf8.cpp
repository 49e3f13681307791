#include "text/utf8.h"

#include <cstdlib>
#include <utf8proc.h>

#include "core/error.h"

namespace lily::text {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

uint32_t next_cp(std::string_view s, size_t& i) {
  auto b = uint8_t(s[i]);
  if (b < 0x80) return ++i, b;
  int n = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : 1;
  uint32_t cp = b & (0x3F >> n);
  ++i;
  for (int k = 0; k < n && i < s.size(); ++k, ++i) cp = (cp << 6) | (uint8_t(s[i]) & 0x3F);
  return cp;
}

// Length of the valid sequence at s[i], 0 when ill-formed; `need` receives the bytes still missing when
// the input ends inside a sequence that is valid so far.
static size_t seq_len(std::string_view s, size_t i, size_t* need = nullptr) {
  auto b = uint8_t(s[i]);
  if (need) *need = 0;
  if (b < 0x80) return 1;
  size_t n;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) n = 2;
  else if (b >= 0xE0 && b <= 0xEF) {
    n = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    n = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k < n; ++k) {
    if (i + k >= s.size()) {
      if (need) *need = n - k;
      return 0;
    }
    auto c = uint8_t(s[i + k]);
    if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) return 0;
  }
  return n;
}

// Bytes of the maximal subpart (prefix of a valid sequence) starting at s[i]; at least 1.
static size_t bad_len(std::string_view s, size_t i) {
  auto b = uint8_t(s[i]);
  size_t n;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) n = 2;
  else if (b >= 0xE0 && b <= 0xEF) {
    n = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    n = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return 1;
  }
  size_t k = 1;
  for (; k < n && i + k < s.size(); ++k) {
    auto c = uint8_t(s[i + k]);
    if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xBF)) break;
  }
  return k;
}

bool utf8_valid(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    if (uint8_t(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t n = seq_len(s, i);
    if (!n) return false;
    i += n;
  }
  return true;
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t n = seq_len(s, i);
    if (n) {
      out.append(s.data() + i, n);
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += bad_len(s, i);
    }
  }
  return out;
}

size_t utf8_complete_prefix(std::string_view s) {
  size_t start = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = start; i < s.size(); ++i) {
    auto b = uint8_t(s[i]);
    if (b < 0xC0) continue;  // ASCII or continuation byte: cannot begin an incomplete sequence
    size_t need = 0;
    if (!seq_len(s, i, &need) && need > 0) return i;
  }
  return s.size();
}

std::string nfc(std::string_view s) {
  bool simple = true;
  for (size_t i = 0; i < s.size(); ++i) {
    auto b = uint8_t(s[i]);
    // Lead bytes >= 0xCC start code points >= U+0300 (the first combining marks).
    if (b >= 0xCC) {
      simple = false;
      break;
    }
  }
  if (simple) return std::string(s);
  utf8proc_uint8_t* out = nullptr;
  auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), utf8proc_ssize_t(s.size()), &out,
                        utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) throw InputError(std::string("text is not valid UTF-8: ") + utf8proc_errmsg(n));
  std::string r(reinterpret_cast<char*>(out), size_t(n));
  std::free(out);
  return r;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (char c : s) n += (uint8_t(c) & 0xC0) != 0x80;
  return n;
}

}  // namespace lily::text
