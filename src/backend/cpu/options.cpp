// CpuOptions by name (the CLI's repeated --cpu-opt name=value): one table of names.
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/product_class.h"
#include "core/error.h"
#include "core/named_options.h"

namespace lily::cpu {
namespace {

using Field = NamedField<CpuOptions>;

int64_t parse_int_in(const std::string& name, const std::string& v, int64_t lo, int64_t hi) {
  try {
    size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used == v.size() && x >= lo && x <= hi) return x;
  } catch (const std::exception&) {
  }
  fail("--cpu-opt {}={}: expected an integer in {}..{}", name, v, lo, hi);
}

bool parse_01(const std::string& name, const std::string& v) {
  if (v != "0" && v != "1") fail("--cpu-opt {}={}: expected 1 or 0", name, v);
  return v == "1";
}

const std::vector<Field>& fields() {
  static const std::vector<Field> f = {
      {"emulate_bf16", "product classes with bf16 operands, comma separated (emulating the CUDA bf16 prompt GEMMs)",
       [](CpuOptions& o, const std::string& v) { o.emulate_bf16 = parse_product_classes(v, "--cpu-opt emulate_bf16"); }},
      {"emulate_fp16", "product classes with fp16 operands and per-row power-of-two scales, comma separated "
                       "(emulating the CUDA fp16 prompt GEMMs; over emulate_bf16 where both name a class)",
       [](CpuOptions& o, const std::string& v) { o.emulate_fp16 = parse_product_classes(v, "--cpu-opt emulate_fp16"); }},
      {"emulate_bf16_rows", "steps of at least this many rows take the bf16 / fp16 emulation (default 33)",
       [](CpuOptions& o, const std::string& v) { o.emulate_bf16_rows = parse_int_in("emulate_bf16_rows", v, 1, int64_t(1) << 40); }},
      {"emulate_split", "the other classes' products with the split mode's bf16 hi + lo operands (CUDA's --precision high): 1 or 0",
       [](CpuOptions& o, const std::string& v) { o.emulate_split = parse_01("emulate_split", v); }},
      {"emulate_bf16_kv", "keys and values rounded to bf16 as they enter the cache (the CUDA backend's KV cache): 1 or 0",
       [](CpuOptions& o, const std::string& v) { o.emulate_bf16_kv = parse_01("emulate_bf16_kv", v); }},
      {"emulate_k_order", "the emulated products sum over k in order (0, default), reversed (1) or from the middle round "
                          "(2): the effect of a summation order alone",
       [](CpuOptions& o, const std::string& v) { o.emulate_k_order = int(parse_int_in("emulate_k_order", v, 0, 2)); }},
      {"recurrent_max_rows", "DeltaNet groups of up to this many rows use the recurrent rule (default 16)",
       [](CpuOptions& o, const std::string& v) { o.recurrent_max_rows = parse_int_in("recurrent_max_rows", v, 0, int64_t(1) << 40); }},
      {"affine", "affine 4/8-bit products: int8 (quantised activations) or exact (float activations)",
       [](CpuOptions& o, const std::string& v) {
         if (v == "int8") o.affine = AffinePath::Int8;
         else if (v == "exact") o.affine = AffinePath::Exact;
         else fail("--cpu-opt affine={}: expected int8 or exact", v);
       }},
  };
  return f;
}

}  // namespace

void set_cpu_option(CpuOptions& o, const std::string& kv) { set_named_option(fields(), o, "--cpu-opt", kv); }

std::vector<std::string> cpu_option_names() { return named_option_help(fields()); }

}  // namespace lily::cpu
