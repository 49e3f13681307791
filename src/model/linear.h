// A Linear is one weight matrix W [out, in] (y = x · Wᵀ) in whatever format the checkpoint stores it.
// Kernels dispatch on `format` once; model code only passes Linear handles around.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/dtype.h"

namespace lily {

namespace quant {
struct AffineWeight;  // quant/affine/affine.h
struct Exl3Weight;    // quant/exl3/exl3.h
}  // namespace quant

enum class WeightFormat : uint8_t { Dense, Affine, Exl3 };

// Row-major [out, in] floating-point matrix (F32, F16 or BF16), rows `row_stride` elements apart.
struct DenseWeight {
  DType dtype = DType::BF16;
  const void* data = nullptr;
  int64_t row_stride = 0;
};

struct Linear {
  std::string name;  // checkpoint name, for messages
  int64_t out = 0, in = 0;
  WeightFormat format = WeightFormat::Dense;
  DenseWeight dense;
  std::shared_ptr<const quant::AffineWeight> affine;
  std::shared_ptr<const quant::Exl3Weight> exl3;

  bool empty() const { return out == 0; }
  // Both handles read the same stored matrix (a tied lm_head and embedding).
  bool same_storage(const Linear& o) const {
    return format == o.format && (format == WeightFormat::Dense    ? dense.data == o.dense.data
                                  : format == WeightFormat::Affine ? affine == o.affine
                                                                   : exl3 == o.exl3);
  }
  size_t nbytes() const;  // bytes a full pass over the weights reads
};

const char* format_name(WeightFormat f);

}  // namespace lily
