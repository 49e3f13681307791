#include "model/load_linear.h"

#include "core/error.h"

namespace lily {

namespace {

Linear dense_linear(const TensorInfo& t, const std::string& base, int64_t out, int64_t in) {
  if (!dtype_is_float(t.dtype) || t.dtype == DType::F64)
    fail("{}: tensor '{}' has dtype {}; a dense weight must be BF16, F16 or F32", t.file, t.name, dtype_name(t.dtype));
  if (t.shape != std::vector<int64_t>{out, in})
    fail("{}: tensor '{}' has shape {}, expected [{}, {}]", t.file, t.name, t.shape_str(), out, in);
  Linear l;
  l.name = base;
  l.out = out;
  l.in = in;
  l.format = WeightFormat::Dense;
  l.dense = {t.dtype, t.data, in};
  return l;
}

}  // namespace

Linear load_linear(const Checkpoint& ck, const ModelConfig& cfg, const std::string& base, int64_t out, int64_t in,
                   std::vector<std::shared_ptr<void>>& owned) {
  const TensorInfo* w = ck.find(base + ".weight");
  if (w && dtype_is_float(w->dtype)) return dense_linear(*w, base, out, in);
  if (ck.find(base + ".trellis") || ck.find(base + ".scales"))
    fail("{}: tensor '{}' is quantized; this build cannot load quantized weights", ck.dir(), base);
  if (!w) fail("{}: missing tensor '{}.weight'", ck.dir(), base);
  fail("{}: tensor '{}' has dtype {}, expected BF16, F16 or F32", w->file, w->name, dtype_name(w->dtype));
}

bool load_stacked_experts(const Checkpoint&, const ModelConfig&, const std::string&, std::vector<Expert>&,
                          std::vector<std::shared_ptr<void>>&) {
  return false;
}

Linear select_rows_quantized(const Linear& src, const std::vector<int64_t>&, std::vector<std::shared_ptr<void>>&) {
  fail("{}: cannot regroup rows of a {} weight", src.name, format_name(src.format));
}

size_t quantized_nbytes(const Linear& l) {
  fail("{}: size of {} weights unknown", l.name, format_name(l.format));
}

}  // namespace lily
