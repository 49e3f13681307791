// MLX affine quantization (mlx.core.quantize, mode "affine"), as mlx-lm stores it.
//
// A matrix W [out, in] (y = x · Wᵀ) is cut into groups of `group_size` consecutive input columns per row;
// every group g of row o has a scale s and a bias b (bf16, fp16 or f32) and unsigned codes q in [0, 2^bits):
//     W[o, i] = s[o, i / group_size] · q[o, i] + b[o, i / group_size]
// Codes of one row form a little-endian bit stream: code i occupies bits [i·bits, (i+1)·bits) of the
// row's bytes, lowest bit first. For bits 2/4/8 this is "32/bits codes per uint32, first code in the
// low bits"; for 3/5/6 it is mlx's 8 codes in 3 or 5 bytes / 4 codes in 3 bytes. 8 codes always take
// exactly `bits` bytes, so a row is in·bits/8 bytes = in·bits/32 uint32 words (in % 32 == 0).
//
// Tensors: BASE.weight U32 [out, in·bits/32], BASE.scales and BASE.biases [out, in/group_size];
// mlx-lm's stacked experts add a leading [E] dimension to all three.
#pragma once
#include <cstdint>
#include <vector>

#include "core/dtype.h"

namespace lily::quant {

struct AffineWeight {
  int bits = 4;                       // 2, 3, 4, 5, 6 or 8
  int group_size = 64;                // 32, 64 or 128
  int64_t out = 0, in = 0;            // logical shape of W
  const uint32_t* packed = nullptr;   // [out, row_words], rows contiguous
  int64_t row_words = 0;              // in · bits / 32
  DType scale_dtype = DType::BF16;    // dtype of scales and biases: BF16, F16 or F32
  const void* scales = nullptr;       // [out, groups()] row-major
  const void* biases = nullptr;       // [out, groups()] row-major

  int64_t groups() const { return in / group_size; }
  size_t nbytes() const { return size_t(out) * size_t(row_words) * 4 + 2 * size_t(out * groups()) * dtype_size(scale_dtype); }
};

bool affine_bits_supported(int bits);
bool affine_group_supported(int group_size);

// Throws InputError naming `what` when bits / group size / shape do not fit together.
void affine_validate(const AffineWeight& w, const char* what);

float affine_scale(const AffineWeight& w, int64_t row, int64_t group);
float affine_bias(const AffineWeight& w, int64_t row, int64_t group);

// Code i of a packed row (plain bit-stream read; the reference for every fast unpacker).
uint32_t affine_code(const uint32_t* row, int bits, int64_t i);

// All `n` codes (n % 8 == 0) of a packed row, fast path.
void affine_unpack(const uint32_t* row, int bits, int64_t n, uint8_t* codes);
// Packs n codes (n % 8 == 0, each < 2^bits) into n·bits/32 words.
void affine_pack(const uint8_t* codes, int bits, int64_t n, uint32_t* row);

// Row `row` of W as float32 (fast path) and its plain reference.
void affine_dequant_row(const AffineWeight& w, int64_t row, float* out);
void affine_dequant_row_ref(const AffineWeight& w, int64_t row, float* out);

// mlx.core.quantize on a float32 matrix: per group, the larger-magnitude edge (min or max) is pinned to
// an exact code, scale = ±(max − min)/(2^bits − 1) re-derived as edge/q0, bias = edge (0 when the edge
// rounds to code 0), codes round((w − bias)/scale) half away from zero clamped to [0, 2^bits − 1] using
// the float32 scale and bias; scales and biases are then stored in `scale_dtype`.
struct AffineQuantized {
  int bits = 4, group_size = 64;
  int64_t out = 0, in = 0;
  DType scale_dtype = DType::BF16;
  std::vector<uint32_t> packed;        // [out, in·bits/32]
  std::vector<uint16_t> scales, biases;  // [out, in/group_size] as bf16 / fp16 bits
  AffineWeight view() const;
};
AffineQuantized affine_quantize(const float* w, int64_t out, int64_t in, int bits, int group_size,
                                DType scale_dtype = DType::BF16);

}  // namespace lily::quant
