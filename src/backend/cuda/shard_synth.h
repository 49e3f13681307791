// Matrices of a shapes-only synth model (SynthOptions::shapes_only) drawn on the device at upload
// (upload.cpp), for benchmarks of models larger than host memory: the formats' random weights of
// tools/synth.h with streams keyed by the matrix name (not the host synth's values).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/ops.h"
#include "model/linear.h"

namespace lily::cuda {

// bf16 [l.out, l.in] at dst (rows l.in apart), U(-a, a) with a = sqrt(3 / in).
void synth_dense(uint16_t* dst, const Linear& l, cudaStream_t s);
// MLX affine rows of l (its bits and group size): random codes, scale 2a / (2^bits - 1), bias -a.
void synth_affine(uint32_t* q, uint16_t* scales, uint16_t* biases, const Linear& l, cudaStream_t s);
// EXL3 pieces of part p (already allocated): random trellis words, suh = ±1, svh = ±1 / (sqrt(in) · codebook std).
void synth_exl3(const Exl3Part& p, const Linear& l, cudaStream_t s);

}  // namespace lily::cuda
