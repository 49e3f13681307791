// Affine 4/8-bit × int8 activations over many tokens: register tiles of 16 weight rows × up to 12 tokens
// (AVX-512 VNNI), for prompt-sized products.
//
// Per block of 16 rows the codes are unpacked once into a u8 tile in the vpdpbusd layout (16 rows × 4
// activation positions per 64-byte vector: affine_int8_internal.h), and the block's scales and biases are
// transposed to [group][16]. The kernel then keeps one int32 and one float accumulator per token: per
// position quad, one tile load and one vpdpbusd per token with its 4 activation bytes broadcast; per block
// of 32 inputs the int32 sums are converted once and added with s_g · d_b; Σ_g b_g · Σx_g follows at the
// end. The integer block sums are the scalar kernel's; only the float summation order differs.
//
// Cost per weight row and token (in = 1024): 256 vpdpbusd + 96 float ops, against ~440 instructions of the
// row kernels (which unpack the codes again for every 3 tokens); the tile build (16-row dword transposes)
// is paid once per row block, ~0.1 instruction per code.
#include <algorithm>
#include <array>
#include <cstring>
#include <utility>
#include <vector>

#include "backend/cpu/affine_int8_internal.h"
#include "core/error.h"
#include "core/half.h"

namespace lily::cpu::int8_detail {

BlockRuns block_runs(int64_t in, int bits, int64_t b) {
  if (bits != 4) return {32 * b, 32 * b + 16};
  const auto [cb, w] = chunk4(32 * b, in);
  const int64_t m = (32 * b - cb) / 32;
  return {cb + 16 * m, cb + w / 2 + 16 * m};
}

namespace {

void params_transposed_plain(const quant::AffineWeight& w, int64_t o0, float* s, float* b) {
  const int64_t G = w.groups(), n = std::min<int64_t>(kTileRows, w.out - o0);
  std::fill(s, s + G * kTileRows, 0.0f);
  std::fill(b, b + G * kTileRows, 0.0f);
  for (int which = 0; which < 2; ++which) {
    const void* src = which ? w.biases : w.scales;
    float* dst = which ? b : s;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t i0 = (o0 + r) * G;
      if (w.scale_dtype == DType::F32) {
        for (int64_t g = 0; g < G; ++g) dst[g * kTileRows + r] = static_cast<const float*>(src)[i0 + g];
      } else {
        const uint16_t* h = static_cast<const uint16_t*>(src) + i0;
        if (w.scale_dtype == DType::BF16)
          for (int64_t g = 0; g < G; ++g) dst[g * kTileRows + r] = bf16_to_f32(h[g]);
        else
          for (int64_t g = 0; g < G; ++g) dst[g * kTileRows + r] = f16_to_f32(h[g]);
      }
    }
  }
}

void tile_build_plain(const quant::AffineWeight& w, int64_t o0, uint8_t* tile) {
  const int64_t in = w.in, n = std::min<int64_t>(kTileRows, w.out - o0);
  std::vector<int64_t> input_at(static_cast<size_t>(in));  // activation position -> input
  for (int64_t i = 0; i < in; ++i) input_at[size_t(w.bits == 4 ? pos4(i, in) : i)] = i;
  std::memset(tile, 0, size_t(in) * kTileRows);
  for (int64_t r = 0; r < n; ++r) {
    const uint32_t* row = w.packed + (o0 + r) * w.row_words;
    for (int64_t b = 0; b < in / 32; ++b) {
      const BlockRuns br = block_runs(in, w.bits, b);
      for (int k = 0; k < 8; ++k)
        for (int j = 0; j < 4; ++j) {
          const int64_t p = (k < 4 ? br.lo : br.hi) + 4 * (k % 4) + j;
          tile[((8 * b + k) * kTileRows + r) * 4 + j] = uint8_t(quant::affine_code(row, w.bits, input_at[size_t(p)]));
        }
    }
  }
}

}  // namespace

#if LILY_X86

LILY_INT8_ZMM_BEGIN
namespace {

void tile_build_zmm(const quant::AffineWeight& w, int64_t o0, uint8_t* tile) {
  const int64_t in = w.in, n = std::min<int64_t>(kTileRows, w.out - o0), row_bytes = w.row_words * 4;
  const uint8_t* base = reinterpret_cast<const uint8_t*>(w.packed) + o0 * row_bytes;
  const __m512i m4 = _mm512_set1_epi8(0x0F);
  const int64_t full = w.bits == 4 ? in / 128 * 128 : in / 64 * 64;
  for (int64_t cb = 0; cb < in;) {
    // chunk of width cw codes: 4-bit 128 / 64 / 32 ([evens | odds] in the activations), 8-bit 64 / 32
    const int64_t cw = cb < full ? (w.bits == 4 ? 128 : 64) : (in - cb >= 64 && w.bits == 4 ? 64 : 32);
    const int64_t nbytes = cw * w.bits / 8, ndw = nbytes / 4;
    const __mmask64 lm = nbytes == 64 ? ~__mmask64(0) : (__mmask64(1) << nbytes) - 1;
    __m512i v[16];
    const uint8_t* src = base + cb * w.bits / 8;
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r)
      v[r] = r < n ? _mm512_maskz_loadu_epi8(lm, src + r * row_bytes) : _mm512_setzero_si512();
    transpose16(v);  // v[j]: dword j of the chunk's bytes, one lane per row
    // 4-bit: the low nibbles of dword j are positions cb + 4j.. (the chunk's even inputs), the high ones
    // cb + cw/2 + 4j..; both belong to block cb/32 + j/4, as its quad j % 4 of the lo / hi run.
    // 8-bit: dword j is positions cb + 4j.., quad j % 8 of block cb/32 + j/8.
    uint8_t* t = tile + cb / 32 * 512;
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      if (j >= ndw) break;
      if (w.bits == 4) {
        uint8_t* tb = t + (j / 4) * 512 + (j % 4) * 64;
        _mm512_storeu_si512(tb, _mm512_and_si512(v[j], m4));
        _mm512_storeu_si512(tb + 256, _mm512_and_si512(_mm512_srli_epi16(v[j], 4), m4));
      } else {
        _mm512_storeu_si512(t + j * 64, v[j]);
      }
    }
    cb += cw;
  }
}

// params_transposed through 16 × 16 transposes: per 16 groups, each row's scales (masked loads, widened to
// float) into one vector, then transposed to one vector per group with the 16 rows in its lanes.
// 16 scales or biases from src + i as floats (lanes off m zero, nothing read there); D: the stored dtype.
template <DType D>
inline __m512i load_params16(const void* src, int64_t i, __mmask16 m) {
  if constexpr (D == DType::F32) return _mm512_maskz_loadu_epi32(m, static_cast<const float*>(src) + i);
  const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(src) + i);
  if constexpr (D == DType::BF16) return _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
  return _mm512_castps_si512(_mm512_cvtph_ps(h));
}

// One 16-group slab: groups [g0, g0 + 16) ∩ [0, G) of the scales and biases of rows o0 .. o0+15 into
// s, b [group - g0][16]. Branch-free per row (rows past w.out load with an empty mask), so that the loops
// unroll and v stays in registers through the transpose. bf16: one transpose of (bias << 16 | scale) pairs.
template <DType D>
void params_slab_zmm(const quant::AffineWeight& w, int64_t o0, int64_t g0, float* s, float* b) {
  const int64_t G = w.groups(), n = std::min<int64_t>(kTileRows, w.out - o0), ng = std::min<int64_t>(16, G - g0);
  const __mmask16 m = __mmask16((1u << ng) - 1);
  __m512i v[16];
  if constexpr (D == DType::BF16) {
    const __m512i pairs = _mm512_setr_epi32(0x00200000, 0x00210001, 0x00220002, 0x00230003, 0x00240004, 0x00250005,
                                            0x00260006, 0x00270007, 0x00280008, 0x00290009, 0x002A000A, 0x002B000B,
                                            0x002C000C, 0x002D000D, 0x002E000E, 0x002F000F);  // word 2j: s_j, 2j+1: b_j
    const uint16_t* ps = static_cast<const uint16_t*>(w.scales);
    const uint16_t* pb = static_cast<const uint16_t*>(w.biases);
#pragma GCC unroll 16
    for (int r = 0; r < 16; ++r) {
      const int64_t i = (o0 + std::min<int64_t>(r, n - 1)) * G + g0;
      const __mmask16 mr = r < n ? m : __mmask16(0);
      v[r] = _mm512_permutex2var_epi16(_mm512_castsi256_si512(_mm256_maskz_loadu_epi16(mr, ps + i)), pairs,
                                       _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(mr, pb + i)));
    }
    transpose16(v);
    const __m512i hi = _mm512_set1_epi32(int32_t(0xFFFF0000u));
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) {
      if (j >= ng) break;
      _mm512_storeu_si512(s + j * kTileRows, _mm512_slli_epi32(v[j], 16));
      _mm512_storeu_si512(b + j * kTileRows, _mm512_and_si512(v[j], hi));
    }
  } else {
    for (int which = 0; which < 2; ++which) {
      const void* src = which ? w.biases : w.scales;
      float* dst = which ? b : s;
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r)
        v[r] = load_params16<D>(src, (o0 + std::min<int64_t>(r, n - 1)) * G + g0, r < n ? m : __mmask16(0));
      transpose16(v);
#pragma GCC unroll 16
      for (int j = 0; j < 16; ++j) {
        if (j >= ng) break;
        _mm512_storeu_si512(dst + j * kTileRows, v[j]);
      }
    }
  }
}

}  // namespace

void params_slab(const quant::AffineWeight& w, int64_t o0, int64_t g0, float* s, float* b) {
  switch (w.scale_dtype) {
    case DType::F32: return params_slab_zmm<DType::F32>(w, o0, g0, s, b);
    case DType::BF16: return params_slab_zmm<DType::BF16>(w, o0, g0, s, b);
    default: return params_slab_zmm<DType::F16>(w, o0, g0, s, b);
  }
}

namespace {

void params_transposed_zmm(const quant::AffineWeight& w, int64_t o0, float* s, float* b) {
  for (int64_t g0 = 0; g0 < w.groups(); g0 += 16) params_slab(w, o0, g0, s + g0 * kTileRows, b + g0 * kTileRows);
}

struct TileArgs {
  const uint8_t* tile;
  const float *s, *b;    // [group][16]
  const BlockRuns* runs;  // [in / 32]
  const Acts* a;
  int64_t in, G;
  int gshift, rep;  // group of block b: b >> gshift
  __mmask16 rows;
};

template <int NT>
void tile_kernel(const TileArgs& k, int64_t t0, float* y, int64_t ys) {
  const Acts& a = *k.a;
  __m512 acc[NT];
  const int8_t* xq[NT];
  const float* xd[NT];
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm512_setzero_ps();
    xq[t] = a.q + (t0 + t) * k.in;
    xd[t] = a.d + (t0 + t) * a.dl;
  }
  const int64_t nb = k.in / 32;
  for (int64_t b = 0; b < nb; ++b) {
    __m512i I[NT];
    for (int t = 0; t < NT; ++t) I[t] = _mm512_setzero_si512();
    const uint8_t* tb = k.tile + b * 512;
    const BlockRuns br = k.runs[b];
#pragma GCC unroll 8
    for (int qd = 0; qd < 8; ++qd) {
      const __m512i W = _mm512_loadu_si512(tb + qd * 64);
      const int64_t off = (qd < 4 ? br.lo : br.hi) + 4 * (qd % 4);
      for (int t = 0; t < NT; ++t) {
        int32_t x4;
        std::memcpy(&x4, xq[t] + off, 4);
        I[t] = _mm512_dpbusd_epi32(I[t], W, _mm512_set1_epi32(x4));
      }
    }
    const __m512 sv = _mm512_loadu_ps(k.s + (b >> k.gshift) * 16);
    for (int t = 0; t < NT; ++t)
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(I[t]), _mm512_mul_ps(sv, _mm512_set1_ps(xd[t][b * k.rep])), acc[t]);
  }
  for (int64_t g = 0; g < k.G; ++g) {  // bias term
    const __m512 bv = _mm512_loadu_ps(k.b + g * 16);
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_fmadd_ps(bv, _mm512_set1_ps(a.xs[(t0 + t) * a.gp + g]), acc[t]);
  }
  for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(y + t * ys, k.rows, acc[t]);
}

using TileFn = void (*)(const TileArgs&, int64_t, float*, int64_t);
constexpr int kTileTokens = 12;
template <int... N>
constexpr auto tile_table(std::integer_sequence<int, N...>) {
  return std::array<TileFn, sizeof...(N)>{&tile_kernel<N + 1>...};
}
constexpr auto kTileFns = tile_table(std::make_integer_sequence<int, kTileTokens>{});

}  // namespace
LILY_INT8_ZMM_END

#endif  // LILY_X86

void tile_build(const quant::AffineWeight& w, int64_t o0, bool simd, uint8_t* tile) {
  LILY_CHECK((w.bits == 4 || w.bits == 8) && w.in % 32 == 0 && o0 >= 0 && o0 < w.out, "bad tile build shape");
#if LILY_X86
  if (simd) return tile_build_zmm(w, o0, tile);
#else
  LILY_CHECK(!simd, "no SIMD tile build on this architecture");
#endif
  tile_build_plain(w, o0, tile);
}

void params_transposed(const quant::AffineWeight& w, int64_t o0, bool simd, float* s, float* b) {
  LILY_CHECK(o0 >= 0 && o0 < w.out, "bad row block for the transposed parameters");
#if LILY_X86
  if (simd) return params_transposed_zmm(w, o0, s, b);
#else
  LILY_CHECK(!simd, "no SIMD parameter transpose on this architecture");
#endif
  params_transposed_plain(w, o0, s, b);
}

void tile_rows_avx512(const quant::AffineWeight& w, const Acts& a, int64_t o0, float* y, int64_t ys) {
#if LILY_X86
  thread_local std::vector<uint8_t> tile;
  thread_local std::vector<float> sb;
  thread_local std::vector<BlockRuns> runs;
  const int64_t G = w.groups(), n = std::min<int64_t>(kTileRows, w.out - o0);
  tile.resize(size_t(w.in) * kTileRows);
  sb.resize(size_t(2 * G * kTileRows));
  runs.resize(size_t(w.in / 32));
  for (int64_t b = 0; b < w.in / 32; ++b) runs[size_t(b)] = block_runs(w.in, w.bits, b);
  tile_build_zmm(w, o0, tile.data());
  params_transposed_zmm(w, o0, sb.data(), sb.data() + G * kTileRows);
  const TileArgs k{tile.data(), sb.data(), sb.data() + G * kTileRows, runs.data(), &a, w.in, G,
                   w.group_size == 32 ? 0 : w.group_size == 64 ? 1 : 2, w.bits == 4 ? 4 : 8, __mmask16((1u << n) - 1)};
  for (int64_t t = 0; t < a.T; t += kTileTokens) {
    const int64_t nt = std::min<int64_t>(kTileTokens, a.T - t);
    kTileFns[size_t(nt - 1)](k, t, y + t * ys, ys);
  }
#else
  (void)w, (void)a, (void)o0, (void)y, (void)ys;
  throw InternalError("AVX-512 tile kernel on a non-x86 build");
#endif
}

}  // namespace lily::cpu::int8_detail
