// The decode step kernel on the device (mk_kernel.cu): a finalized Plan uploaded once, launched per step
// (also inside a graph capture).
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "backend/cuda/mk.h"

namespace lily::cuda::mk {

struct DevPlan {
  void* mem = nullptr;
  size_t bytes = 0;
  const OpDesc* ops = nullptr;
  const Task* tasks = nullptr;
  const int32_t* task_begin = nullptr;
  uint32_t* counters = nullptr;
  uint32_t* err = nullptr;  // kErrWords words
  int n_counters = 0, blocks = 0, stages = 0, n_ops = 0;
  uint32_t stage_bytes = 0;
  size_t smem = 0;
};

// Blocks the kernel runs (one per SM).
int blocks();
// Copies a finalized plan to the device (synchronous: call outside stream captures). Throws InternalError
// when the plan's shared memory does not fit the device.
DevPlan upload(const Plan& p);
void release(DevPlan& d);
void launch(const DevPlan& d, const StepArgs& step, cudaStream_t s);
// After a step kernel failed (it traps when a wait outlasts its timeout, a bug): `record`
// (StepArgs::host_err, kErrWords words of mapped host memory) names the op, block, wait and counter value;
// the message ("" when the record is clear), which also clears the record.
std::string record_message(uint32_t* record, const Plan& p);

}  // namespace lily::cuda::mk
