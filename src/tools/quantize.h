// `lily quantize`: a float (bf16/fp16/f32) checkpoint to MLX affine or EXL3.
//   affine: mlx-lm's layout — every linear and the embedding whose input width is a multiple of the group
//           size becomes BASE.weight (U32 codes) + .scales + .biases; routers and shared-expert gates at
//           8 bits / group 64 (per-module entries of config.json's quantization block, as mlx-lm's
//           quant_predicate does); experts stacked as mlp.switch_mlp.{gate,up,down}_proj [E, ...].
//   exl3:   exllamav3's layout — per-expert tensors; routers, shared-expert gate, GDN b/a projections,
//           embeddings and norms unquantized; lm_head at head_bits; a tied head quantized as lm_head.*.
//           Fractional bits mix integer K per tensor group (all experts of one projection share K).
// The MTP block (mtp.*) is quantized like the layers (fc as a linear, its experts stacked or per expert),
// or copied unchanged with keep_mtp. Other tensors are copied unchanged; tokenizer / generation files
// are copied.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lily {

struct QuantizeOptions {
  std::string model_dir, out_dir;
  std::string format;           // "affine" | "exl3"
  double bits = 4;              // affine: 2,3,4,5,6,8; exl3: 1..8, fractional = per-tensor mix
  int group_size = 64;          // affine
  std::string codebook = "mcg";  // exl3: mcg | mul1 | 3inst
  int head_bits = 6;            // exl3 lm_head K (16 = keep unquantized)
  std::string calibration;      // exl3: token-id file for Hessians (LDLQ); empty = no error feedback
  int64_t calibration_tokens = 2048;
  bool keep_mtp = false;        // leave the MTP block in its float dtype (as most quantized releases do)
  bool progress = true;         // progress bar on stderr
};

struct QuantizeResult {
  int64_t tensors_quantized = 0;
  int64_t tiles = 0;            // exl3 16x16 tiles encoded
  double seconds = 0;           // wall time of the encode
  double bits_per_weight = 0;   // achieved average over quantized matrices (incl. scales and padding)
  double proxy_err_mean = 0;    // exl3: mean over matrices of tr(E H Eᵀ)/tr(W H Wᵀ) in the rotated basis
  size_t bytes_written = 0;
};

QuantizeResult quantize_model(const QuantizeOptions& opt);

// EXL3 bit allocation: every group (one matrix, or all experts of one projection, which must share K)
// starts at floor(bits); groups then get +1 in priority order (lower first: attention / GDN, shared
// expert, expert down, expert gate/up), skipping any that would push the weighted average past bits.
struct Exl3Group {
  std::string name;
  double weights = 0;
  int priority = 0;
  int K = 0;  // result
};
void exl3_allocate_bits(std::vector<Exl3Group>& groups, double bits);

}  // namespace lily
