#include "backend/product_class.h"

#include "core/error.h"

namespace lily {
namespace {

struct Name {
  const char* name;
  uint32_t mask;
  const char* help;
};

constexpr uint32_t kGpuBf16 = kProdAll & ~uint32_t(kProdRouter);

const Name kNames[] = {
    {"experts_gu", kProdExpertsGateUp, "routed experts' gate and up"},
    {"experts_down", kProdExpertsDown, "routed experts' down"},
    {"shared", kProdShared, "shared expert (gate, up, down)"},
    {"mlp", kProdMlp, "dense MLP (gate, up, down)"},
    {"attn_in", kProdAttnIn, "attention q, k, v"},
    {"attn_out", kProdAttnOut, "attention o"},
    {"gdn_in", kProdGdnIn, "DeltaNet in_proj"},
    {"gdn_out", kProdGdnOut, "DeltaNet out_proj"},
    {"router", kProdRouter, "MoE router and shared-expert gate"},
    {"lm_head", kProdLmHead, "lm_head"},
    {"mtp_fc", kProdMtpFc, "MTP input projection"},
    {"experts", kProdExpertsGateUp | kProdExpertsDown, "experts_gu + experts_down"},
    {"attn", kProdAttnIn | kProdAttnOut, "attn_in + attn_out"},
    {"gdn", kProdGdnIn | kProdGdnOut, "gdn_in + gdn_out"},
    {"gpu_bf16", kGpuBf16, "every class but router (the CUDA backend's --precision bf16)"},
    {"all", kProdAll, "every class"},
    {"none", 0, "no class"},
};

}  // namespace

uint32_t parse_product_classes(const std::string& list, const char* what) {
  uint32_t m = 0;
  size_t i = 0;
  while (i <= list.size()) {
    const size_t j = std::min(list.find(',', i), list.size());
    const std::string n = list.substr(i, j - i);
    i = j + 1;
    bool found = false;
    for (const Name& k : kNames)
      if (n == k.name) {
        m |= k.mask;
        found = true;
      }
    if (!found) {
      std::string known;
      for (const Name& k : kNames) known += std::string(known.empty() ? "" : ", ") + k.name;
      fail("{}: unknown product class '{}' (known: {})", what, n, known);
    }
  }
  return m;
}

std::string product_class_names(uint32_t mask) {
  std::string s;
  for (const Name& k : kNames)
    if ((k.mask & (k.mask - 1)) == 0 && k.mask != 0 && (mask & k.mask)) s += std::string(s.empty() ? "" : ",") + k.name;
  return s.empty() ? "none" : s;
}

std::vector<std::string> product_class_help() {
  std::vector<std::string> v;
  for (const Name& k : kNames) v.push_back(std::string(k.name) + ": " + k.help);
  return v;
}

}  // namespace lily
