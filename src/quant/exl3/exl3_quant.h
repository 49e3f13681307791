// EXL3 encoder (exl3-format.md §5): tail-biting Viterbi per 16x16 tile, regularisation (random signs,
// channel scales, blockwise Hadamard on both sides) and LDLQ error feedback with a Hessian.
#pragma once
#include <cstdint>
#include <vector>

#include "quant/exl3/exl3.h"

namespace lily::quant {

// Standard deviation of a codebook's 65536 values (the target spread of the regularised weights).
double exl3_codebook_std(Exl3Codebook cb);

// Scratch for one thread's tile encodes (per-step edge minima: 256 · 2^(16−K) floats).
struct ViterbiScratch {
  std::vector<float> edge_min;
};

// Best tail-biting state sequence for one tile given in stream order: minimises Σ_t (cb(s_t) − v_t)²
// over sequences with s_t = (s_{t−1} << K | c_t) & 0xFFFF for all t, s_{−1} = s_255 (two passes: a free
// run rotated by 128 fixes the wrap edge, a second run is constrained to it). Returns the squared error.
double exl3_encode_tile(const float* v, int K, Exl3Codebook cb, uint16_t* states, ViterbiScratch& scratch);

// One linear quantized to EXL3, ready to write: tensors of exl3-format.md §1.1.
struct Exl3Quantized {
  int K = 4;
  Exl3Codebook codebook = Exl3Codebook::Mcg;
  int64_t in = 0, out = 0, in_p = 0, out_p = 0;
  std::vector<uint16_t> trellis;  // [in_p/16, out_p/16, 16K]
  std::vector<uint16_t> suh;      // fp16 [in_p]
  std::vector<uint16_t> svh;      // fp16 [out_p]
  std::vector<uint16_t> bias;     // fp16 [out_p] or empty
  double proxy_err = 0;           // tr(E H Eᵀ) / tr(W H Wᵀ) (H = I without calibration)
  Exl3Weight view() const;
};

struct Exl3QuantOptions {
  int K = 4;
  Exl3Codebook codebook = Exl3Codebook::Mcg;
  uint64_t seed = 1;              // random input/output signs
  const double* hessian = nullptr;  // [in, in] E[xᵀx] of the layer's inputs, or null (no error feedback)
  double damp = 0.025;            // H += damp · mean(diag H) · I
  bool threaded = true;           // tiles of one strip in parallel on ThreadPool::global()
  // Called after every 16-row strip with the number of tiles done so far (progress reporting).
  void (*progress)(void* ctx, int64_t tiles_done) = nullptr;
  void* progress_ctx = nullptr;
};

// W: row-major [out, in] float32 (HF orientation, y = x · Wᵀ); bias: [out] or null.
Exl3Quantized exl3_quantize(const float* W, int64_t out, int64_t in, const float* bias, const Exl3QuantOptions& opt);

}  // namespace lily::quant
