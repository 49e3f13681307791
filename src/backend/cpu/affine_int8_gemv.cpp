// Affine 4/8-bit × int8 activations for one or two tokens at a time (AVX-512 VNNI): decode-sized products,
// straight from the packed rows, with the tiles' arithmetic (affine_int8_internal.h: one sum per input block,
// folded in order), so that a row's result does not depend on how many tokens run with it.
//
// Per block of 16 weight rows, in two passes:
//  1. each row in turn (one sequential stream of weights per thread: interleaved rows defeat the hardware
//     prefetcher of some CPUs), per 128 inputs: one 64-byte load, the nibbles split, two vpdpbusd per token,
//     giving "block lanes" (128-bit lane L: 4 partial sums of input block 4j + L); per 512 inputs the four
//     steps' block lanes are summed within their 128-bit lanes (9 integer ops) into one vector of the 16
//     blocks' sums, stored to a small buffer (one 64-byte store per 256 weight bytes at 4 bits);
//  2. per 512 inputs, the 16 rows' vectors are transposed (16 × 16 dwords) into one vector per input block
//     with the 16 rows in its lanes, folded like the tiles.
#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cpu/affine_int8_internal.h"
#include "core/error.h"

namespace lily::cpu::int8_detail {

#if LILY_X86

LILY_INT8_ZMM_BEGIN
namespace {

inline __mmask64 bytes_mask(int64_t n) { return n >= 64 ? ~__mmask64(0) : (__mmask64(1) << n) - 1; }

// Block lanes of one row for inputs [c, c + 128) ∩ [0, in) and NT tokens (xq[t] + c: their activations).
// 4-bit: the chunk layout of pos4 (a 128-code chunk, or the tail's 64- and 32-code chunks); 8-bit: natural.
template <int BITS, int NT>
inline void block_lanes(const uint8_t* row, int64_t c, int64_t in, const int8_t* const* xq, __m512i* out) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  if constexpr (BITS == 4) {
    // One chunk of width w at cb: bytes [cb/2, cb/2 + w/2): low nibbles are positions cb.. (w/2 of them, the
    // chunk's even inputs), high nibbles cb + w/2..; dword lane l covers inputs cb + 8l .. + 7, block (cb + 8l)/32.
    auto chunk = [&](int64_t cb, int64_t w, __m512i* acc) {
      const __mmask64 m = bytes_mask(w / 2);
      const __m512i P = _mm512_maskz_loadu_epi8(m, row + cb / 2);
      const __m512i lo = _mm512_and_si512(P, m4), hi = _mm512_and_si512(_mm512_srli_epi16(P, 4), m4);
      for (int t = 0; t < NT; ++t) {
        const __m512i xl = _mm512_maskz_loadu_epi8(m, xq[t] + cb), xh = _mm512_maskz_loadu_epi8(m, xq[t] + cb + w / 2);
        acc[t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, xl), hi, xh);
      }
    };
    if (in - c >= 128) return chunk(c, 128, out);
    // tail: a 64-chunk (blocks c/32, c/32 + 1 in lanes 0-7) and / or a 32-chunk (one block in lanes 0-3)
    int64_t cb = c;
    for (int t = 0; t < NT; ++t) out[t] = _mm512_setzero_si512();
    if (in - cb >= 64) {
      chunk(cb, 64, out);
      cb += 64;
    }
    if (in - cb == 32) {
      __m512i v[NT];
      chunk(cb, 32, v);
      const int L = int((cb - c) / 32);  // 128-bit lane of the block: 0 or 2
      for (int t = 0; t < NT; ++t)
        out[t] = L ? _mm512_inserti32x4(out[t], _mm512_castsi512_si128(v[t]), 2)
                   : _mm512_inserti32x4(out[t], _mm512_castsi512_si128(v[t]), 0);
    }
  } else {
    // 64 codes per load, lane l: inputs 4l.., block l/8; two loads give blocks 0-1 and 2-3 in 128-bit lane
    // pairs, which one shuffle-add folds to one 128-bit lane per block.
    const int64_t n = std::min<int64_t>(128, in - c);
    const __mmask64 m0 = bytes_mask(n), m1 = bytes_mask(n - 64 > 0 ? n - 64 : 0);
    const __m512i P0 = _mm512_maskz_loadu_epi8(m0, row + c), P1 = _mm512_maskz_loadu_epi8(m1, row + c + 64);
    for (int t = 0; t < NT; ++t) {
      const __m512i i0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), P0, _mm512_maskz_loadu_epi8(m0, xq[t] + c));
      const __m512i i1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), P1, _mm512_maskz_loadu_epi8(m1, xq[t] + c + 64));
      out[t] = _mm512_add_epi32(_mm512_shuffle_i32x4(i0, i1, 0x88), _mm512_shuffle_i32x4(i0, i1, 0xDD));
    }
  }
}

struct Lanes {
  __m512i v;  // wrapped: a vector type as a template argument loses its alignment attribute
};

// Lane L·4 + k of the result: the sum of the 4 dwords in 128-bit lane L of v[k].
inline __m512i quad_sums(const __m512i (&v)[4]) {
  const __m512i s0 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
  const __m512i s1 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(s0, s1), _mm512_unpackhi_epi64(s0, s1));
}

template <int BITS, int NT>
void gemv16(const quant::AffineWeight& w, const Acts& a, int64_t t0, int64_t o0, const float* sT, const float* bT,
            float* y, int64_t ys) {
  const int64_t in = w.in, n = std::min<int64_t>(kTileRows, w.out - o0), row_bytes = w.row_words * 4;
  const int64_t nj = (in + 127) / 128, nq = (nj + 3) / 4, nb = in / 32, G = w.groups();
  const int gshift = w.group_size == 32 ? 0 : w.group_size == 64 ? 1 : 2, rep = BITS == 4 ? 4 : 8;
  // [NT][16 rows][nq]: lane 4L + k of vector q = the sum of block 16q + 4k + L. Each row's stores go to
  // consecutive lines (stores strided across rows halved the speed of DRAM-resident products on Zen 4).
  thread_local std::vector<Lanes> buf;
  buf.resize(size_t(NT * 16 * nq));
  Lanes* const lanes = buf.data();  // not re-read from the thread-local vector after each (aliasing) store
  const int8_t* xq[NT];
  for (int t = 0; t < NT; ++t) xq[t] = a.q + (t0 + t) * in;
  const uint8_t* base = reinterpret_cast<const uint8_t*>(w.packed) + o0 * row_bytes;
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* row = base + r * row_bytes;
    for (int64_t q = 0; q < nq; ++q) {
      __m512i v[NT][4];
      for (int k = 0; k < 4; ++k) {
        const int64_t j = 4 * q + k;
        if (j >= nj) {
          for (int t = 0; t < NT; ++t) v[t][k] = _mm512_setzero_si512();
          continue;
        }
        const char* ahead = reinterpret_cast<const char*>(row + j * 128 * BITS / 8 + 2048);
        _mm_prefetch(ahead, _MM_HINT_T0);
        if constexpr (BITS == 8) _mm_prefetch(ahead + 64, _MM_HINT_T0);
        __m512i u[NT];
        block_lanes<BITS, NT>(row, j * 128, in, xq, u);
        for (int t = 0; t < NT; ++t) v[t][k] = u[t];
      }
      for (int t = 0; t < NT; ++t) lanes[(t * 16 + r) * nq + q].v = quad_sums(v[t]);
    }
  }
  const __mmask16 rows = __mmask16((1u << n) - 1);
  for (int t = 0; t < NT; ++t) {
    const float* xd = a.d + (t0 + t) * a.dl;
    const float* xs = a.xs + (t0 + t) * a.gp;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t q = 0; q < nq; ++q) {
      __m512i B[16];
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) B[r] = r < n ? lanes[(t * 16 + r) * nq + q].v : _mm512_setzero_si512();
      transpose16(B);  // B[4L + k]: block 16q + 4k + L, one lane per row
      for (int k = 0; k < 4; ++k)
        for (int L = 0; L < 4; ++L) {
          const int64_t b = 16 * q + 4 * k + L;
          if (b >= nb) break;
          const __m512 sv = _mm512_loadu_ps(sT + (b >> gshift) * 16);
          acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(B[4 * L + k]), _mm512_mul_ps(sv, _mm512_set1_ps(xd[b * rep])), acc);
        }
    }
    for (int64_t g = 0; g < G; ++g) acc = _mm512_fmadd_ps(_mm512_loadu_ps(bT + g * 16), _mm512_set1_ps(xs[g]), acc);
    _mm512_mask_storeu_ps(y + (t0 + t) * ys, rows, acc);
  }
}

}  // namespace
LILY_INT8_ZMM_END

#endif  // LILY_X86

void gemv_rows_avx512(const quant::AffineWeight& w, const Acts& a, int64_t o0, float* y, int64_t ys) {
#if LILY_X86
  thread_local std::vector<float> sb;
  const int64_t G = w.groups();
  sb.resize(size_t(2 * G * kTileRows));
  params_transposed(w, o0, true, sb.data(), sb.data() + G * kTileRows);
  const float *s = sb.data(), *b = sb.data() + G * kTileRows;
  int64_t t = 0;
  for (; t + 2 <= a.T; t += 2) w.bits == 4 ? gemv16<4, 2>(w, a, t, o0, s, b, y, ys) : gemv16<8, 2>(w, a, t, o0, s, b, y, ys);
  if (t < a.T) w.bits == 4 ? gemv16<4, 1>(w, a, t, o0, s, b, y, ys) : gemv16<8, 1>(w, a, t, o0, s, b, y, ys);
#else
  (void)w, (void)a, (void)o0, (void)y, (void)ys;
  throw InternalError("AVX-512 gemv kernel on a non-x86 build");
#endif
}

}  // namespace lily::cpu::int8_detail
