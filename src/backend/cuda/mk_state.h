// The CUDA backend's state for the decode step kernel (mk.h): the plans per step key, the buffers its ops
// exchange through, and the error record the kernel copies out (mk_backend.cpp).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "backend/cuda/mk.h"
#include "backend/cuda/mk_launch.h"

namespace lily::cuda {

struct MkState {
  // Why the model's shapes or formats are not covered ("" when they are); computed once.
  bool checked = false;
  std::string uncovered;
  struct Entry {
    mk::Plan plan;
    mk::DevPlan dev;
    unsigned long long* trace = nullptr;  // device [tasks][kTraceWords] (CudaOptions::mk_trace)
    size_t trace_bytes = 0;
  };
  std::map<std::pair<int, int>, Entry> plans;  // (context bucket, GraphKey::kind)
  std::pair<int, int> key{0, 0};
  bool building = false;  // the current step's blocks append ops to `next`
  mk::Plan next;
  std::vector<int> last;  // the ops the next op of the step depends on
  int64_t steps = 0;      // launches
  // device buffers (one allocation, sized for the model)
  void* buf = nullptr;
  size_t buf_bytes = 0;
  float *logits = nullptr, *w = nullptr, *h = nullptr, *gpart = nullptr, *po = nullptr, *pm = nullptr, *pl = nullptr;
  int32_t* idx = nullptr;
  unsigned long long* keys = nullptr;
  uint32_t* host_err = nullptr;      // mapped host memory: the kernel copies a timed-out wait's record here
  uint32_t* host_err_dev = nullptr;  // its device address
};

}  // namespace lily::cuda
