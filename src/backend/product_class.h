// Classes of a forward pass's matrix products, as a bit mask: which products a backend runs with bf16 or fp16
// operands (the CUDA prompt GEMMs' per-class precision, KernelSwitches::reduced_classes; the CPU backend's
// emulation of it, CpuOptions::emulate_bf16 / emulate_fp16).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace lily {

enum ProductClass : uint32_t {
  kProdExpertsGateUp = 1u << 0,  // routed experts: gate and up
  kProdExpertsDown = 1u << 1,    // routed experts: down
  kProdShared = 1u << 2,         // the shared expert's gate, up and down (MoE layers)
  kProdMlp = 1u << 3,            // a dense model's MLP gate, up and down
  kProdAttnIn = 1u << 4,         // full attention q (with its gate), k, v
  kProdAttnOut = 1u << 5,        // full attention o
  kProdGdnIn = 1u << 6,          // DeltaNet in_proj (qkv(z), z, b, a)
  kProdGdnOut = 1u << 7,         // DeltaNet out_proj
  kProdRouter = 1u << 8,         // the MoE router and the shared-expert gate (the logits that weigh experts)
  kProdLmHead = 1u << 9,         // lm_head
  kProdMtpFc = 1u << 10,         // the MTP block's input projection (fc)
  kProdAll = (1u << 11) - 1,
};

// "experts_gu,attn_in,..." (also the groups experts, attn, gdn, all, none, and gpu_bf16: every class but
// the router, what the CUDA backend's --precision bf16 runs) as a mask. Throws InputError naming `what`
// and the unknown name.
uint32_t parse_product_classes(const std::string& list, const char* what);
// The names of the mask's classes, comma separated ("none" for 0).
std::string product_class_names(uint32_t mask);
// Every name parse_product_classes accepts, with what it covers.
std::vector<std::string> product_class_help();

}  // namespace lily
