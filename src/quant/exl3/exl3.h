// EXL3 (exllamav3 trellis codes), see shared/docs/exl3-format.md. Decoding here is bit-exact.
//
// Storage of one linear with true sizes in × out, padded to in_p, out_p (multiples of 128):
//   trellis  uint16 [in_p/16][out_p/16][16·K]   tile (i, j) = W_hat rows (k) 16i.., columns (n) 16j..,
//                                               tiles row-major over (i, j), 32·K bytes each
//   suh      fp16 [in_p]     input-side sign·scale
//   svh      fp16 [out_p]    output-side sign·scale
//   bias     fp16 [out_p]    optional
// The weight, k-major (y = x · W, W [in_p, out_p]):
//   W = diag(suh) · Hk · W_hat · Hn · diag(svh),  Hk / Hn = blockdiag of the orthonormal Sylvester H128.
// Forward: y = Hn( (Hk(x ⊙ suh)) · W_hat ) ⊙ svh + bias, then output j of the Linear is padded column
// out_rows[j] (identity when out_rows is null).
//
// Tile decode: the 16·K words of a tile, every aligned pair swapped, form an MSB-first bit stream S of
// 256 K-bit codes; stream position t has the 16-bit state made of the bits of S that end at (t+1)·K,
// read cyclically (tail-biting). State -> fp16 by the codebook; position t -> tile cell (r, c) =
// exl3_tc_perm()[t] / 16, % 16 (the tensor-core order).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace lily::quant {

enum class Exl3Codebook : uint8_t { Inst3 = 0, Mcg = 1, Mul1 = 2 };

inline constexpr uint32_t kExl3McgMult = 0xCBAC1FEDu;
inline constexpr uint32_t kExl3Mul1Mult = 0x83DCD12Du;

struct Exl3Weight {
  int K = 4;                                  // bits per weight, 1..8
  Exl3Codebook codebook = Exl3Codebook::Mcg;
  int64_t in = 0, out = 0;                    // logical sizes: x has `in` columns, y has `out`
  int64_t in_p = 0, out_p = 0;                // padded sizes (multiples of 128), in <= in_p
  const uint16_t* trellis = nullptr;          // [in_p/16, out_p/16, 16K]
  const uint16_t* suh = nullptr;              // fp16 [in_p]
  const uint16_t* svh = nullptr;              // fp16 [out_p]
  const uint16_t* bias = nullptr;             // fp16 [out_p] or null
  const int32_t* out_rows = nullptr;          // [out] padded column of each output, or null = 0..out-1

  int64_t tiles_k() const { return in_p / 16; }
  int64_t tiles_n() const { return out_p / 16; }
  int words_per_tile() const { return 16 * K; }
  const uint16_t* tile(int64_t i, int64_t j) const { return trellis + (i * tiles_n() + j) * 16 * K; }
  int64_t column(int64_t j) const { return out_rows ? out_rows[j] : j; }
  size_t nbytes() const {
    return size_t(in_p) * size_t(out_p) * size_t(K) / 8 + 2 * size_t(in_p + out_p) + (bias ? 2 * size_t(out_p) : 0);
  }
};

const char* exl3_codebook_name(Exl3Codebook cb);

// Throws InputError naming `what` when sizes do not fit (K, padding, in/out against in_p/out_p).
void exl3_validate(const Exl3Weight& w, const char* what);

// Codebook: 16-bit state -> fp16 bits (direct formula) and 65536-entry tables (fp16 bits and float).
uint16_t exl3_decode_state(Exl3Codebook cb, uint32_t state);
const uint16_t* exl3_lut_f16(Exl3Codebook cb);
const float* exl3_lut(Exl3Codebook cb);

// Stream position t -> r·16 + c of the tile (r = k row, c = n column).
const uint8_t* exl3_tc_perm();

// 256 states of one tile, stream order: plain bit-stream reference and the fast table-driven version.
void exl3_tile_states_ref(const uint16_t* words, int K, uint16_t* states);
void exl3_tile_states(const uint16_t* words, int K, uint16_t* states);
// Inverse: the low K bits of 256 states -> 16·K words.
void exl3_pack_tile(const uint16_t* states, int K, uint16_t* words);

// A decoded tile as float, row-major [16 (k)][16 (n)].
void exl3_decode_tile(const uint16_t* words, int K, Exl3Codebook cb, float* tile);

// In-place orthonormal Walsh–Hadamard transform of 128 floats (butterflies 1..64, then ·1/sqrt(128)).
void had128(float* v);

// Plain reference of the forward: y [T, out] = x [T, in] · W (+ bias), float64 accumulation.
void exl3_forward_ref(const Exl3Weight& w, const float* x, int64_t T, float* y);
// Column j (logical output j) of W as float, length `in`.
void exl3_weight_column(const Exl3Weight& w, int64_t j, float* out);

}  // namespace lily::quant
