// Affine 4/8-bit × int8 activations for one to four tokens at a time (AVX-512 VNNI): decode-sized products,
// straight from the packed rows, with the tiles' arithmetic (affine_int8_internal.h: one sum per input block,
// folded in order), so that a row's result does not depend on how many tokens run with it.
//
// Per block of 16 weight rows, in two parts:
//  1. the row pass: each row in turn (one sequential stream of weights per thread: interleaved rows defeat
//     the hardware prefetcher of some CPUs), per 128 inputs one 64-byte load, the nibbles split, two
//     vpdpbusd per token, giving "block lanes" (128-bit lane L: 4 partial sums of input block 4j + L); per
//     512 inputs the four steps' block lanes are summed within their 128-bit lanes (9 integer ops) into one
//     vector of the 16 blocks' sums, stored to a small buffer (one 64-byte store per 256 weight bytes at 4 bits);
//  2. the fold: the block's scales and biases transposed to [group][16] (params_slab), and per 512 inputs the
//     16 rows' vectors transposed (16 × 16 dwords) into one vector per input block with the 16 rows in its
//     lanes, folded like the tiles.
// The fold is shuffle-bound and issues no weight loads, the row pass is bound by the weight stream: the fold
// of a block runs in steps between the rows of the next block's row pass, so that the two overlap (on Zen 4
// with the 0.8B model's weights, 1.04-1.07x against folding each block right after its rows).
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

// Every weight line is prefetched into L2 this many bytes ahead of its load. The row pass has ~12 instructions
// per 64-byte line, so the reorder window alone keeps ~1.5 KB of the stream in flight, less than DRAM latency ×
// bandwidth; on Zen 4 with the 0.8B model's weights (page cache) this measured 1.15-1.28x at 8-64 KB ahead
// (8 KB best), one prefetch per 128 bytes 0.87-0.98x, and prefetches into L1 (T0) 0.84-0.99x.
constexpr int64_t kStreamAhead = 8192;
inline void prefetch_stream(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p) + kStreamAhead, _MM_HINT_T1); }

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

// Lane L·4 + k of the result: the sum of the 4 dwords in 128-bit lane L of v[k].
inline __m512i quad_sums(const __m512i (&v)[4]) {
  const __m512i s0 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[0], v[1]), _mm512_unpackhi_epi32(v[0], v[1]));
  const __m512i s1 = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2], v[3]), _mm512_unpackhi_epi32(v[2], v[3]));
  return _mm512_add_epi32(_mm512_unpacklo_epi64(s0, s1), _mm512_unpackhi_epi64(s0, s1));
}

// quad_sums where every dword of v fits in int16 (4-bit chunks: 8 products of a code ≤ 15 and |q| ≤ 127,
// |dword| ≤ 15,240): two levels of word packs and pair sums, 6 ops against 9. Per 128-bit lane L, the packs
// interleave 4 words of each source, so the sums land in the same lanes (4L + k) as quad_sums'.
inline __m512i quad_sums16(const __m512i (&v)[4]) {
  const __m512i one = _mm512_set1_epi16(1);
  const __m512i s01 = _mm512_madd_epi16(_mm512_packs_epi32(v[0], v[1]), one);  // |pair| ≤ 30,480: still int16
  const __m512i s23 = _mm512_madd_epi16(_mm512_packs_epi32(v[2], v[3]), one);
  return _mm512_madd_epi16(_mm512_packs_epi32(s01, s23), one);
}

// quad_sums of 512 inputs of a 4-bit row (four full 128-code chunks: 256 code bytes at p), for NT tokens
// (x[t]: their activations at the span's first input). The fast path of the row pass: no masks, no branches.
template <int NT>
__attribute__((always_inline)) inline void span4(const uint8_t* p, const int8_t* const* x, __m512i* out) {
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  __m512i v[NT][4];
#pragma GCC unroll 4
  for (int k = 0; k < 4; ++k) {
    const __m512i P = _mm512_loadu_si512(p + 64 * k);
    prefetch_stream(p + 64 * k);
    const __m512i lo = _mm512_and_si512(P, m4), hi = _mm512_and_si512(_mm512_srli_epi16(P, 4), m4);
    for (int t = 0; t < NT; ++t)
      v[t][k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(x[t] + 128 * k)),
                                    hi, _mm512_loadu_si512(x[t] + 128 * k + 64));
  }
  for (int t = 0; t < NT; ++t) out[t] = quad_sums16(v[t]);
}

// Lanes buffer of one row block: [t][16 rows][nq][16] int32, lane 4L + k of vector q = the sum of input
// block 16q + 4k + L. Each row's stores go to consecutive lines (stores strided across rows halved the speed
// of DRAM-resident products on Zen 4).
template <int BITS, int NT>
inline void row_pass(const uint8_t* row, int64_t in, int64_t nq, const int8_t* const* xq, int32_t* lanes,
                     int64_t tstride) {
  const int64_t nj = (in + 127) / 128, nqf = BITS == 4 ? in / 512 : 0;
  for (int64_t q = 0; q < nqf; ++q) {
    const int8_t* x[NT];
    for (int t = 0; t < NT; ++t) x[t] = xq[t] + 512 * q;
    __m512i u[NT];
    span4<NT>(row + 256 * q, x, u);
    for (int t = 0; t < NT; ++t) _mm512_storeu_si512(lanes + t * tstride + q * 16, u[t]);
  }
  for (int64_t q = nqf; q < nq; ++q) {
    __m512i v[NT][4];
    for (int k = 0; k < 4; ++k) {
      const int64_t j = 4 * q + k;
      if (j >= nj) {
        for (int t = 0; t < NT; ++t) v[t][k] = _mm512_setzero_si512();
        continue;
      }
      prefetch_stream(row + j * 128 * BITS / 8);
      if constexpr (BITS == 8) prefetch_stream(row + j * 128 + 64);
      __m512i u[NT];
      block_lanes<BITS, NT>(row, j * 128, in, xq, u);
      for (int t = 0; t < NT; ++t) v[t][k] = u[t];
    }
    for (int t = 0; t < NT; ++t) _mm512_storeu_si512(lanes + t * tstride + q * 16, quad_sums(v[t]));
  }
}

// The fold of one row block, as a list of steps: the param slabs, then per token the nq transposes-and-folds
// in input order, then per token the bias term and the store.
struct Fold {
  const quant::AffineWeight* w = nullptr;
  const Acts* a = nullptr;
  int64_t t0 = 0, o0 = 0, G = 0, nq = 0, ns = 0;  // ns: 16-group slabs
  int nt = 0, step = 0, steps = 0;
  int t = 0, q = 0;  // the next fold step's token and 512-input span
  const int32_t* lanes = nullptr;
  float* s = nullptr;  // [G][16] scales, then [G][16] biases
  float* y = nullptr;
  int64_t ys = 0;
  __m512 acc[4];  // per token of the pass (NT <= 4)
};

void fold_step(Fold& f) {
  const quant::AffineWeight& w = *f.w;
  const int64_t G = f.G, k = f.step++;
  if (k < f.ns) {
    params_slab(w, f.o0, 16 * k, f.s + 16 * k * kTileRows, f.s + (G + 16 * k) * kTileRows);
    return;
  }
  const Acts& a = *f.a;
  const int t = f.t;
  if (k < f.ns + f.nt * f.nq) {
    const int64_t q = f.q, nb = w.in / 32;
    if (++f.q == f.nq) f.q = 0, ++f.t;
    const int gshift = w.group_size == 32 ? 0 : w.group_size == 64 ? 1 : 2, rep = w.bits == 4 ? 4 : 8;
    const float* xd = a.d + (f.t0 + t) * a.dl;
    const float* sT = f.s;
    const int32_t* L0 = f.lanes + (t * 16 * f.nq + q) * 16;
    __m512i B[16];
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) B[r] = _mm512_loadu_si512(L0 + r * f.nq * 16);
    transpose16(B);  // B[4L + k]: block 16q + 4k + L, one lane per row
    __m512 acc = q == 0 ? _mm512_setzero_ps() : f.acc[t];
    if (16 * q + 16 <= nb) {
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) {
        const int64_t b = 16 * q + i;  // i = 4k + L
        const __m512 sv = _mm512_loadu_ps(sT + (b >> gshift) * 16);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(B[4 * (i % 4) + i / 4]), _mm512_mul_ps(sv, _mm512_set1_ps(xd[b * rep])), acc);
      }
    } else {
      for (int i = 0; i < 16 && 16 * q + i < nb; ++i) {
        const int64_t b = 16 * q + i;
        const __m512 sv = _mm512_loadu_ps(sT + (b >> gshift) * 16);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(B[4 * (i % 4) + i / 4]), _mm512_mul_ps(sv, _mm512_set1_ps(xd[b * rep])), acc);
      }
    }
    f.acc[t] = acc;
    if (f.t == f.nt) f.t = 0;
    return;
  }
  const int64_t n = std::min<int64_t>(kTileRows, w.out - f.o0);
  const float* xs = a.xs + (f.t0 + t) * a.gp;
  const float* bT = f.s + G * kTileRows;
  __m512 acc = f.acc[t];
  for (int64_t g = 0; g < G; ++g) acc = _mm512_fmadd_ps(_mm512_loadu_ps(bT + g * 16), _mm512_set1_ps(xs[g]), acc);
  _mm512_mask_storeu_ps(f.y + (f.t0 + t) * f.ys + f.o0, __mmask16((1u << n) - 1), acc);
  ++f.t;
}

// 64-byte-aligned scratch of n elements, kept per thread (no allocation once it has grown).
template <class T>
T* scratch(std::vector<T>& v, size_t n) {
  v.resize(n + 64 / sizeof(T));
  const uintptr_t p = reinterpret_cast<uintptr_t>(v.data());
  return reinterpret_cast<T*>((p + 63) & ~uintptr_t(63));
}

// Tokens [t0, t0 + NT) of the row blocks [blk0, blk1).
template <int BITS, int NT>
void gemv_pass(const quant::AffineWeight& w, const Acts& a, int64_t t0, int64_t blk0, int64_t blk1, float* y,
               int64_t ys) {
  const int64_t in = w.in, G = w.groups(), row_bytes = w.row_words * 4, nq = (in + 511) / 512;
  const int64_t lanes_n = NT * 16 * nq * 16, params_n = 2 * G * kTileRows;
  thread_local std::vector<int32_t> lbuf;
  thread_local std::vector<float> pbuf;
  int32_t* const lanes[2] = {scratch(lbuf, size_t(2 * lanes_n)), nullptr};
  float* const params[2] = {scratch(pbuf, size_t(2 * params_n)), nullptr};
  int32_t* const lanes1 = lanes[0] + lanes_n;
  float* const params1 = params[0] + params_n;
  const int8_t* xq[NT];
  for (int t = 0; t < NT; ++t) xq[t] = a.q + (t0 + t) * in;
  Fold prev;  // the previous block's fold, run between this block's rows
  for (int64_t blk = blk0; blk < blk1; ++blk) {
    const int64_t o0 = blk * kTileRows, n = std::min<int64_t>(kTileRows, w.out - o0);
    int32_t* const lb = (blk & 1) ? lanes1 : lanes[0];
    Fold cur;
    cur.w = &w;
    cur.a = &a;
    cur.t0 = t0;
    cur.o0 = o0;
    cur.G = G;
    cur.nq = nq;
    cur.ns = (G + 15) / 16;
    cur.nt = NT;
    cur.steps = int(cur.ns + NT * nq + NT);
    cur.lanes = lb;
    cur.s = (blk & 1) ? params1 : params[0];
    cur.y = y;
    cur.ys = ys;
    const uint8_t* base = reinterpret_cast<const uint8_t*>(w.packed) + o0 * row_bytes;
    for (int64_t r = 0; r < kTileRows; ++r) {
      int32_t* lr = lb + r * nq * 16;
      if (r < n) {
        row_pass<BITS, NT>(base + r * row_bytes, in, nq, xq, lr, 16 * nq * 16);
      } else {
        for (int t = 0; t < NT; ++t)
          for (int64_t q = 0; q < nq; ++q) _mm512_storeu_si512(lr + t * 16 * nq * 16 + q * 16, _mm512_setzero_si512());
      }
      const int until = int(((r + 1) * prev.steps + kTileRows - 1) / kTileRows);
      while (prev.step < until) fold_step(prev);
    }
    prev = cur;
  }
  while (prev.step < prev.steps) fold_step(prev);
}

}  // namespace
LILY_INT8_ZMM_END

#endif  // LILY_X86

void gemv_blocks_avx512(const quant::AffineWeight& w, const Acts& a, int64_t blk0, int64_t blk1, float* y, int64_t ys) {
#if LILY_X86
  // passes of 4 tokens, then the rest in one pass (3, 2 or 1): every pass reads the weights once
  int64_t t = 0;
  for (; t + 4 <= a.T; t += 4)
    w.bits == 4 ? gemv_pass<4, 4>(w, a, t, blk0, blk1, y, ys) : gemv_pass<8, 4>(w, a, t, blk0, blk1, y, ys);
  if (a.T - t == 3)
    w.bits == 4 ? gemv_pass<4, 3>(w, a, t, blk0, blk1, y, ys) : gemv_pass<8, 3>(w, a, t, blk0, blk1, y, ys);
  else if (a.T - t == 2)
    w.bits == 4 ? gemv_pass<4, 2>(w, a, t, blk0, blk1, y, ys) : gemv_pass<8, 2>(w, a, t, blk0, blk1, y, ys);
  else if (a.T - t == 1)
    w.bits == 4 ? gemv_pass<4, 1>(w, a, t, blk0, blk1, y, ys) : gemv_pass<8, 1>(w, a, t, blk0, blk1, y, ys);
#else
  (void)w, (void)a, (void)blk0, (void)blk1, (void)y, (void)ys;
  throw InternalError("AVX-512 gemv kernel on a non-x86 build");
#endif
}

}  // namespace lily::cpu::int8_detail
