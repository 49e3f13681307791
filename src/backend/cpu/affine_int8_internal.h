// Shared by the int8-activation affine kernels (affine_int8.cpp: activations, row kernels, dispatch;
// affine_int8_tiles.cpp: the many-token tile kernels). Not part of the backend's interface.
#pragma once
#include <cstdint>
#include <vector>

#include "quant/affine/affine.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define LILY_X86 1
#else
#define LILY_X86 0
#endif

// Target regions: the functions defined between LILY_TARGET_BEGIN("isa,...") and LILY_TARGET_END are
// compiled for that ISA whatever the build flags (the kernels are picked at run time). GCC: push_options and
// target; clang (the sanitizer build): an attribute pushed onto every function of the region.
#define LILY_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define LILY_TARGET_BEGIN(isa) LILY_PRAGMA(clang attribute push(__attribute__((target(isa))), apply_to = function))
#define LILY_TARGET_END _Pragma("clang attribute pop")
#else
#define LILY_TARGET_BEGIN(isa) _Pragma("GCC push_options") LILY_PRAGMA(GCC target(isa))
#define LILY_TARGET_END _Pragma("GCC pop_options")
#endif

// Brackets of the AVX-512 VNNI code of the int8 kernels. GCC 12's AVX-512 headers seed masked builtins with
// _mm512_undefined_*(), which -Wuninitialized reports inside inlined intrinsics (GCC bug 105593); nothing
// there reads an uninitialised value.
#define LILY_INT8_ZMM_BEGIN                                                                           \
  LILY_TARGET_BEGIN("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")                   \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")                \
  LILY_INT8_NO_MAYBE_UNINIT
#define LILY_INT8_ZMM_END _Pragma("GCC diagnostic pop") LILY_TARGET_END
#if defined(__clang__)
#define LILY_INT8_NO_MAYBE_UNINIT
#else
#define LILY_INT8_NO_MAYBE_UNINIT _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"")
#endif

namespace lily::cpu::int8_detail {

// Quantised activation rows of one product (layout: affine_int8.cpp's header comment).
struct Acts {
  int64_t T = 0, in = 0, dl = 0, gp = 0;  // dl: d floats per token; gp: padded groups per token
  std::vector<int8_t> qv;
  std::vector<float> dv, xsv;
  const int8_t* q = nullptr;
  const float* d = nullptr;
  const float* xs = nullptr;
};

// The chunk of the 4-bit activation layout holding input i: [cb, cb + w), w = 128, then 64 and 32 at the end.
struct Chunk4 {
  int64_t cb, w;
};
Chunk4 chunk4(int64_t i, int64_t in);
// Position of input i of a row of `in` inputs in the 4-bit activation layout.
int64_t pos4(int64_t i, int64_t in);

// Tiles: blocks of kTileRows weight rows.
constexpr int kTileRows = 16;

// The activation positions of input block b (inputs 32b .. 32b+31) are two runs of 16 bytes:
// [lo, lo + 16) and [hi, hi + 16). 4-bit: the block's even inputs, then its odd ones; 8-bit: natural order.
struct BlockRuns {
  int64_t lo, hi;
};
BlockRuns block_runs(int64_t in, int bits, int64_t b);

// The u8 tile of rows o0 .. o0+15 (rows at or past w.out are zero), in the vpdpbusd layout: per input
// block b, 8 vectors of 64 bytes (quads k < 4 from the lo run, k ≥ 4 from the hi run),
//   tile[((8b + k) · 16 + r) · 4 + j] = code of row o0 + r at activation position (k < 4 ? lo : hi) + 4(k % 4) + j
// built by the plain loop or (simd) the AVX-512 transposes; they must agree (tests). tile: in · 16 bytes.
void tile_build(const quant::AffineWeight& w, int64_t o0, bool simd, uint8_t* tile);

// Scales and biases of rows o0 .. o0+15 as [group][16] floats (zero past w.out), by the plain loop or (simd)
// the AVX-512 transposes; they must agree (tests). s, b: w.groups() · 16 floats each.
void params_transposed(const quant::AffineWeight& w, int64_t o0, bool simd, float* s, float* b);

// The AVX-512 VNNI kernels: tokens [0, T) × rows [o0, o0 + 16) ∩ [0, w.out) of y (row stride ys; y points at
// column o0). Both compute every output with one arithmetic, whatever T:
//   acc = 0;  acc ← fma(float(I_b), s_g(b) · d_b, acc) for the input blocks b in order (I_b: the exact integer
//   sum of block b's 32 code × activation products);  acc ← fma(bias_g, Σx_g, acc) for the groups in order.
// tile_rows_avx512: the codes unpacked once into a tile, 12 tokens at a time (prompts);
// gemv_blocks_avx512: the row blocks [blk0, blk1) (rows [16 blk0, 16 blk1) ∩ [0, w.out); y points at column
// 0) from the packed rows, 1–2 tokens at a time (decode).
void tile_rows_avx512(const quant::AffineWeight& w, const Acts& a, int64_t o0, float* y, int64_t ys);
void gemv_blocks_avx512(const quant::AffineWeight& w, const Acts& a, int64_t blk0, int64_t blk1, float* y, int64_t ys);

}  // namespace lily::cpu::int8_detail

#if LILY_X86
LILY_INT8_ZMM_BEGIN
namespace lily::cpu::int8_detail {

// One 16-group slab of params_transposed: groups [g0, g0 + 16) ∩ [0, w.groups()) of the scales and biases
// of rows o0 .. o0+15 as floats into s, b [group - g0][16] (the AVX-512 transposes).
void params_slab(const quant::AffineWeight& w, int64_t o0, int64_t g0, float* s, float* b);

// v[r] lane j ← v[j] lane r (16 × 16 dwords): dwords, then qwords interleaved within 128-bit lanes (u[4i + c]
// lane L: column 4L + c of rows 4i..4i+3), then the 128-bit lanes transposed 4 × 4. Fully unrolled so that
// v stays in registers.
__attribute__((always_inline)) inline void transpose16(__m512i (&v)[16]) {
  __m512i t[16], u[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
#pragma GCC unroll 4
  for (int c = 0; c < 4; ++c) {
    const __m512i a = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x88), b = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xDD);
    const __m512i e = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x88), f = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xDD);
    v[c] = _mm512_shuffle_i32x4(a, e, 0x88);
    v[8 + c] = _mm512_shuffle_i32x4(a, e, 0xDD);
    v[4 + c] = _mm512_shuffle_i32x4(b, f, 0x88);
    v[12 + c] = _mm512_shuffle_i32x4(b, f, 0xDD);
  }
}

}  // namespace lily::cpu::int8_detail
LILY_INT8_ZMM_END
#endif
