#include "quant/exl3/exl3.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"

namespace lily::quant {

const char* exl3_codebook_name(Exl3Codebook cb) {
  switch (cb) {
    case Exl3Codebook::Inst3: return "3inst";
    case Exl3Codebook::Mcg: return "mcg";
    case Exl3Codebook::Mul1: return "mul1";
  }
  return "?";
}

void exl3_validate(const Exl3Weight& w, const char* what) {
  if (w.K < 1 || w.K > 8) fail("{}: EXL3 bits per weight K = {} unsupported (1..8)", what, w.K);
  if (w.in_p <= 0 || w.out_p <= 0 || w.in_p % 128 || w.out_p % 128)
    fail("{}: EXL3 padded shape [{}, {}] is not a multiple of 128", what, w.in_p, w.out_p);
  if (w.in <= 0 || w.in > w.in_p) fail("{}: input width {} does not fit the padded width {}", what, w.in, w.in_p);
  if (w.out <= 0 || (!w.out_rows && w.out > w.out_p))
    fail("{}: output width {} does not fit the padded width {}", what, w.out, w.out_p);
  if (w.out_rows)
    for (int64_t j = 0; j < w.out; ++j)
      if (w.out_rows[j] < 0 || w.out_rows[j] >= w.out_p) fail("{}: output row {} out of range", what, w.out_rows[j]);
}

namespace {

inline float h2f(uint32_t bits) { return f16_to_f32(uint16_t(bits & 0xFFFF)); }
inline uint32_t lop(uint32_t x) { return (x & 0x8FFF8FFFu) ^ 0x3B603B60u; }

}  // namespace

uint16_t exl3_decode_state(Exl3Codebook cb, uint32_t s) {
  s &= 0xFFFFu;
  switch (cb) {
    case Exl3Codebook::Inst3: {
      uint32_t x = lop(s * 89226354u + 64248484u);
      return f32_to_f16(h2f(x) + h2f(x >> 16));  // the half-sum is exact in float; one RNE rounding
    }
    case Exl3Codebook::Mcg: {
      uint32_t x = lop(s * kExl3McgMult);
      return f32_to_f16(h2f(x) + h2f(x >> 16));
    }
    case Exl3Codebook::Mul1: {
      uint32_t x = s * kExl3Mul1Mult;
      uint32_t n = (x & 255u) + ((x >> 8) & 255u) + ((x >> 16) & 255u) + (x >> 24);
      // (1024 + n)·h(0x1EEE) + h(0xC931) is exact in float (22 significant bits); one rounding = fp16 fma.
      float v = float(1024u + n) * h2f(0x1EEE) + h2f(0xC931);
      return f32_to_f16(v);
    }
  }
  return 0;
}

namespace {
struct Luts {
  std::array<std::vector<uint16_t>, 3> f16;
  std::array<std::vector<float>, 3> f32;
};
const Luts& luts() {
  static const Luts L = [] {
    Luts l;
    for (int cb = 0; cb < 3; ++cb) {
      l.f16[size_t(cb)].resize(65536);
      l.f32[size_t(cb)].resize(65536);
      for (uint32_t s = 0; s < 65536; ++s) {
        uint16_t h = exl3_decode_state(Exl3Codebook(cb), s);
        l.f16[size_t(cb)][s] = h;
        l.f32[size_t(cb)][s] = f16_to_f32(h);
      }
    }
    return l;
  }();
  return L;
}

struct Perm {
  uint8_t p[256];
  Perm() {
    static const int rows[4] = {0, 1, 8, 9};
    for (int L = 0; L < 32; ++L)
      for (int u = 0; u < 8; ++u) {
        int r = 2 * (L % 4) + rows[u % 4];
        int c = L / 4 + (u >= 4 ? 8 : 0);
        p[8 * L + u] = uint8_t(r * 16 + c);
      }
  }
};

// Per K: for stream position t, the two 32-bit words holding its 16-bit window and the right shift.
struct StateTable {
  uint8_t q0[256], q1[256], shift[256];
};
const StateTable& state_table(int K) {
  static const std::array<StateTable, 9> T = [] {
    std::array<StateTable, 9> t{};
    for (int k = 1; k <= 8; ++k)
      for (int i = 0; i < 256; ++i) {
        int b1 = (i + 1) * k + 256 * k, b0 = b1 - 16;
        t[size_t(k)].q0[i] = uint8_t((b0 / 32) % (8 * k));
        t[size_t(k)].q1[i] = uint8_t(((b1 - 1) / 32) % (8 * k));
        t[size_t(k)].shift[i] = uint8_t(32 * ((b1 - 1) / 32 + 1) - b1);
      }
    return t;
  }();
  return T[size_t(K)];
}
}  // namespace

const uint16_t* exl3_lut_f16(Exl3Codebook cb) { return luts().f16[size_t(cb)].data(); }
const float* exl3_lut(Exl3Codebook cb) { return luts().f32[size_t(cb)].data(); }

const uint8_t* exl3_tc_perm() {
  static const Perm P;
  return P.p;
}

void exl3_tile_states_ref(const uint16_t* words, int K, uint16_t* states) {
  const int nbits = 256 * K;
  auto bit = [&](int b) {  // stream bit b (MSB-first inside logical chunk b/16 = stored word (b/16)^1)
    b = ((b % nbits) + nbits) % nbits;
    return (words[(b / 16) ^ 1] >> (15 - b % 16)) & 1;
  };
  for (int t = 0; t < 256; ++t) {
    uint32_t s = 0;
    for (int b = (t + 1) * K - 16; b < (t + 1) * K; ++b) s = (s << 1) | uint32_t(bit(b));
    states[t] = uint16_t(s);
  }
}

void exl3_tile_states(const uint16_t* words, int K, uint16_t* states) {
  uint32_t w32[64];
  for (int q = 0; q < 8 * K; ++q) w32[q] = uint32_t(words[2 * q]) | (uint32_t(words[2 * q + 1]) << 16);
  const StateTable& T = state_table(K);
  for (int t = 0; t < 256; ++t) {
    uint64_t v = (uint64_t(w32[T.q0[t]]) << 32) | w32[T.q1[t]];
    states[t] = uint16_t(v >> T.shift[t]);
  }
}

void exl3_pack_tile(const uint16_t* states, int K, uint16_t* words) {
  const int n = 16 * K;
  std::memset(words, 0, size_t(n) * 2);
  const uint32_t mask = (1u << K) - 1;
  for (int t = 0; t < 256; ++t) {
    uint32_t c = states[t] & mask;
    for (int j = 0; j < K; ++j) {
      int b = t * K + j;  // stream bit, MSB of the code first
      if ((c >> (K - 1 - j)) & 1u) words[(b / 16) ^ 1] |= uint16_t(1u << (15 - b % 16));
    }
  }
}

void exl3_decode_tile(const uint16_t* words, int K, Exl3Codebook cb, float* tile) {
  uint16_t st[256];
  exl3_tile_states(words, K, st);
  const float* lut = exl3_lut(cb);
  const uint8_t* perm = exl3_tc_perm();
  for (int t = 0; t < 256; ++t) tile[perm[t]] = lut[st[t]];
}

template <typename F>
static void had128_t(F* v) {
  for (int h = 1; h < 128; h *= 2)
    for (int i = 0; i < 128; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        F a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
}

void had128(float* v) {
  had128_t(v);
  for (int i = 0; i < 128; ++i) v[i] *= 0.088388347648f;
}

void exl3_forward_ref(const Exl3Weight& w, const float* x, int64_t T, float* y) {
  const int64_t kp = w.in_p, np = w.out_p;
  const double s = 1.0 / std::sqrt(128.0);
  std::vector<double> xh(static_cast<size_t>(kp)), acc(static_cast<size_t>(np));
  std::vector<float> tile(256);
  // W_hat decoded once per call (this is the reference, not a kernel).
  std::vector<float> what(static_cast<size_t>(kp * np));
  for (int64_t i = 0; i < w.tiles_k(); ++i)
    for (int64_t j = 0; j < w.tiles_n(); ++j) {
      exl3_decode_tile(w.tile(i, j), w.K, w.codebook, tile.data());
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c) what[size_t((16 * i + r) * np + 16 * j + c)] = tile[size_t(r * 16 + c)];
    }
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < kp; ++k) xh[size_t(k)] = k < w.in ? double(x[t * w.in + k]) * f16_to_f32(w.suh[k]) : 0.0;
    for (int64_t b = 0; b < kp; b += 128) {
      had128_t(xh.data() + b);
      for (int i = 0; i < 128; ++i) xh[size_t(b + i)] *= s;
    }
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t k = 0; k < kp; ++k) {
      const double xv = xh[size_t(k)];
      const float* row = what.data() + k * np;
      for (int64_t n = 0; n < np; ++n) acc[size_t(n)] += xv * row[n];
    }
    for (int64_t b = 0; b < np; b += 128) {
      had128_t(acc.data() + b);
      for (int i = 0; i < 128; ++i) acc[size_t(b + i)] *= s;
    }
    for (int64_t j = 0; j < w.out; ++j) {
      int64_t n = w.column(j);
      double v = acc[size_t(n)] * f16_to_f32(w.svh[n]);
      if (w.bias) v += f16_to_f32(w.bias[n]);
      y[t * w.out + j] = float(v);
    }
  }
}

void exl3_weight_column(const Exl3Weight& w, int64_t j, float* out) {
  const int64_t n = w.column(j), nb = n / 128, c = n % 128;
  const float s = 0.088388347648f;
  std::vector<float> v(static_cast<size_t>(w.in_p), 0.0f), tile(256);
  for (int64_t i = 0; i < w.tiles_k(); ++i)
    for (int64_t jj = 0; jj < 8; ++jj) {
      exl3_decode_tile(w.tile(i, nb * 8 + jj), w.K, w.codebook, tile.data());
      for (int r = 0; r < 16; ++r) {
        float a = 0.0f;
        for (int cc = 0; cc < 16; ++cc) {
          int b = int(jj * 16 + cc);
          float h = (std::popcount(unsigned(b & c)) & 1) ? -s : s;
          a += tile[size_t(r * 16 + cc)] * h;
        }
        v[size_t(16 * i + r)] += a;
      }
    }
  for (int64_t b = 0; b < w.in_p; b += 128) had128(v.data() + b);
  const float sv = f16_to_f32(w.svh[n]);
  for (int64_t k = 0; k < w.in; ++k) out[k] = v[size_t(k)] * f16_to_f32(w.suh[k]) * sv;
}

}  // namespace lily::quant
