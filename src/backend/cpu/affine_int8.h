// Affine 4/8-bit products with int8 activations (the fast CPU path; lossy in the activations only).
//
// Each activation row is quantised once per product in blocks of 32 consecutive inputs:
//   d_b = max|x| / 127, q_i = round(x_i / d_b) ∈ [−127, 127]
// and the exact float sum Σx of every weight group is kept for the bias term, so
//   y[t, o] = Σ_b s_{g(b)} · d_b · (Σ_{i∈b} code_i · q_i) + Σ_g b_g · Σ_{i∈g} x_i
// where the integer block sums are exact (unsigned codes × signed int8, vpdpbusd / maddubs / scalar).
// The only error against the float product is the activation rounding (the bias term uses exact sums):
//   |Δy| ≤ Σ_i |s_{g(i)} · code_i| · d_{b(i)} / 2.
//
// Kernels: AVX-512 VNNI (zmm, blocks of 16 weight rows: from the packed rows for 1–2 tokens at a time, and
// for many tokens as tiles, the codes of 16 rows unpacked once into a u8 tile and run against up to 12
// tokens: affine_int8_gemv.cpp, affine_int8_tiles.cpp), AVX-VNNI and AVX2 (ymm: 4-bit blocks of 8 rows
// from the packed rows for 1–2 tokens at a time, and for many tokens tiles of 8 rows unpacked once and run
// against up to 5 tokens: affine_int8_ymm_gemv.inc, affine_int8_ymm_tiles.inc; 8-bit in row pairs from the
// packed rows: affine_int8_ymm.inc), and
// a scalar one (any machine; the reference the others are tested against: same quantised activations, same
// integer sums, only the float summation order differs). The best kernel is picked at run time from the
// CPU's features, whatever flags the binary was built with. Every kernel computes each output with one
// arithmetic whatever the number of tokens, so a token's row does not depend on the rows it runs with
// (the AVX-512 ones and the 4-bit ymm ones: one exact integer sum per input block, folded in block order,
// and the bias term; rows and tiles of one ISA give identical results).
#pragma once
#include <cstdint>
#include <span>

#include "quant/affine/affine.h"

namespace lily::cpu {

enum class Int8Isa { Scalar, Avx2, AvxVnni, Avx512Vnni };

const char* int8_isa_name(Int8Isa isa);
bool int8_isa_available(Int8Isa isa);  // compiled in and supported by this CPU
Int8Isa int8_isa_best();

// bits 4 or 8, group size 32/64/128, in % 32 == 0.
bool affine_int8_supported(const quant::AffineWeight& w);

// Row kernels or tiles: Auto takes tiles from kInt8TileMinTokens tokens on where the ISA has them (the ymm
// ISAs: 4-bit weights); Tiles on an ISA without them is an error (int8_tiles_available). Results are the
// same either way.
enum class Int8Tiling { Auto, Rows, Tiles };
constexpr int64_t kInt8TileMinTokens = 5;
bool int8_tiles_available(Int8Isa isa);

// y[T, out] = x[T, in] · Wᵀ through int8 activations with the given kernel (tests force each one).
void affine_matmul_int8(const quant::AffineWeight& w, const float* x, int64_t T, float* y, Int8Isa isa,
                        Int8Tiling tiling = Int8Tiling::Auto);
inline void affine_matmul_int8(const quant::AffineWeight& w, const float* x, int64_t T, float* y) {
  affine_matmul_int8(w, x, T, y, int8_isa_best());
}

// Several products y = x · Wᵀ in one parallel pass: the row blocks of all of them are shared out together
// (one hand-off to the pool instead of one per product), and products with the same x, T and layout
// quantise it once. Results equal separate affine_matmul_int8 calls bit for bit.
struct Int8Job {
  const quant::AffineWeight* w;
  const float* x;
  int64_t T;
  float* y;
};
void affine_matmul_int8_batch(std::span<const Int8Job> jobs, Int8Isa isa, Int8Tiling tiling = Int8Tiling::Auto);
inline void affine_matmul_int8_batch(std::span<const Int8Job> jobs) { affine_matmul_int8_batch(jobs, int8_isa_best()); }

// One activation row in the kernels' layout (q [in], d [in/32 · (bits == 4 ? 4 : 8)], xsum [in/group_size])
// by the plain quantiser or (simd) the AVX-512 one, else the AVX2 one; they must agree (tests).
void affine_int8_quantize_row(const float* x, int64_t in, int bits, int group_size, bool simd, int8_t* q, float* d,
                              float* xsum);

// Σ_i |s_{g(i)} · code_i| · d_{b(i)}(x_t) / 2 per output: the bound on |int8 path − exact product| from activation
// rounding alone (tests use it; plain loops).
void affine_int8_error_bound(const quant::AffineWeight& w, const float* x, int64_t T, float* bound);

}  // namespace lily::cpu
