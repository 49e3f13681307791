#include "backend/cuda/shard_synth.h"

#include <cmath>
#include <functional>

#include "backend/cuda/shard_ops.h"
#include "core/half.h"
#include "quant/affine/affine.h"
#include "quant/exl3/exl3.h"
#include "quant/exl3/exl3_quant.h"

namespace lily::cuda {

namespace {
uint64_t key_of(const Linear& l, uint64_t salt) { return std::hash<std::string>{}(l.name) * 0x9E3779B97F4A7C15ull + salt; }
float spread(const Linear& l) { return std::sqrt(3.0f / float(std::max<int64_t>(l.in, 1))); }
}  // namespace

void synth_dense(uint16_t* dst, const Linear& l, cudaStream_t s) {
  synth_bf16(dst, l.out, l.in, l.in, key_of(l, 1), spread(l), s);
}

void synth_affine(uint32_t* q, uint16_t* scales, uint16_t* biases, const Linear& l, cudaStream_t s) {
  const quant::AffineWeight& a = *l.affine;
  const float r = spread(l);
  synth_words(q, size_t(a.out) * size_t(a.row_words), key_of(l, 2), s);
  synth_fill16(scales, size_t(a.out * a.groups()), f32_to_bf16(2 * r / float((1 << a.bits) - 1)), s);
  synth_fill16(biases, size_t(a.out * a.groups()), f32_to_bf16(-r), s);
}

void synth_exl3(const Exl3Part& p, const Linear& l, cudaStream_t s) {
  const quant::Exl3Weight& x = *l.exl3;
  const size_t words = size_t(x.in_p) * size_t(x.out_p) * size_t(x.K) / 32;  // 32-bit words of the trellis
  synth_words(reinterpret_cast<uint32_t*>(const_cast<uint16_t*>(p.trellis)), words, key_of(l, 3), s);
  synth_signs16(const_cast<uint16_t*>(p.suh), size_t(x.in_p), key_of(l, 4), f32_to_f16(1.0f), f32_to_f16(-1.0f), s);
  const float sv = float(1.0 / (std::sqrt(double(x.in)) * quant::exl3_codebook_std(x.codebook)));
  synth_signs16(const_cast<uint16_t*>(p.svh), size_t(x.out_p), key_of(l, 5), f32_to_f16(sv), f32_to_f16(-sv), s);
}

}  // namespace lily::cuda
