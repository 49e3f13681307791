// Loading one Linear from a checkpoint, whatever its format. A checkpoint stores a matrix as
//   BASE.weight (float)                          -> Dense
//   BASE.weight (uint32) + BASE.scales/.biases   -> Affine (MLX)        quant/affine
//   BASE.trellis + BASE.suh/.svh (+ .mcg/.mul1)  -> Exl3                quant/exl3
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/config.h"
#include "model/weights.h"

namespace lily {

// Throws InputError naming the tensor when absent, of the wrong shape or dtype.
Linear load_linear(const Checkpoint& ck, const ModelConfig& cfg, const std::string& base, int64_t out, int64_t in,
                   std::vector<std::shared_ptr<void>>& owned);

// The [out, in] that a checkpoint stores for matrix BASE, whatever its format, and the tensor that says so.
// EXL3 sizes are padded to 128 (`padded`); in == -1 when the format leaves it open (MLX affine without
// bits in config.json's quantization block). nullopt when BASE is absent (load_linear then names it).
struct StoredShape {
  const TensorInfo* tensor = nullptr;
  int64_t out = 0, in = 0;
  bool padded = false;
};
std::optional<StoredShape> stored_shape(const Checkpoint& ck, const ModelConfig& cfg, const std::string& base);

// Experts stored stacked in a quantized format (e.g. mlx-lm's switch_mlp); false when not present.
bool load_stacked_experts(const Checkpoint& ck, const ModelConfig& cfg, const std::string& mlp_prefix,
                          std::vector<Expert>& experts, std::vector<std::shared_ptr<void>>& owned);

// A Linear holding the given output rows of `src`, in src's order.
Linear select_rows(const Linear& src, const std::vector<int64_t>& rows, std::vector<std::shared_ptr<void>>& owned);
Linear select_rows_quantized(const Linear& src, const std::vector<int64_t>& rows,
                             std::vector<std::shared_ptr<void>>& owned);
size_t quantized_nbytes(const Linear& l);
// A view of the first n output rows of `src` (no copy; valid while src's storage lives) for dense and affine
// weights, whose rows are stored one after another; an empty Linear for EXL3, whose output Hadamard mixes
// every column.
Linear row_prefix(const Linear& src, int64_t n);

}  // namespace lily
