// CudaBackend: decode steps captured as CUDA graphs (the blocks launch into the capture; end() instantiates
// and replays) and the record mode of `lily inspect` (the model's own forward() captured, listed, dropped).
#include <fmt/format.h>

#include "backend/cuda/cuda_impl.h"
#include "core/error.h"
#include "model/qwen_hybrid.h"

namespace lily::cuda {

void CudaBackend::begin_capture() { LILY_CU(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal)); }

cudaGraphExec_t CudaBackend::end_capture() {
  cudaGraph_t g = nullptr;
  LILY_CU(cudaStreamEndCapture(stream_, &g));
  capture_ = false;
  if (recording_) {
    // nodes come back in creation order for a linear stream capture
    size_t n = 0;
    LILY_CU(cudaGraphGetNodes(g, nullptr, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    LILY_CU(cudaGraphGetNodes(g, nodes.data(), &n));
    size_t mi = 0;
    for (size_t i = 0; i < n; ++i) {
      while (mi + 1 < marks_.size() && marks_[mi + 1].first <= i) ++mi;
      cudaGraphNodeType ty;
      LILY_CU(cudaGraphNodeGetType(nodes[i], &ty));
      KernelLaunch k;
      k.layer = marks_.empty() ? -1 : marks_[mi].second.first;
      k.block = marks_.empty() ? "" : marks_[mi].second.second;
      if (ty == cudaGraphNodeTypeKernel) {
        cudaKernelNodeParams p{};
        LILY_CU(cudaGraphKernelNodeGetParams(nodes[i], &p));
        const char* nm = nullptr;
        if (cudaFuncGetName(&nm, p.func) == cudaSuccess && nm) k.name = nm;
        else k.name = "kernel";
        k.grid[0] = p.gridDim.x; k.grid[1] = p.gridDim.y; k.grid[2] = p.gridDim.z;
        k.threads[0] = p.blockDim.x; k.threads[1] = p.blockDim.y; k.threads[2] = p.blockDim.z;
        k.smem = p.sharedMemBytes;
      } else if (ty == cudaGraphNodeTypeMemcpy) {
        k.name = "memcpy";
      } else if (ty == cudaGraphNodeTypeMemset) {
        k.name = "memset";
      } else {
        k.name = fmt::format("node type {}", int(ty));
      }
      recorded_.push_back(k);
    }
    LILY_CU(cudaGraphDestroy(g));
    return nullptr;  // nothing runs
  }
  cudaGraphExec_t ex = nullptr;
  LILY_CU(cudaGraphInstantiate(&ex, g, 0));
  LILY_CU(cudaGraphDestroy(g));
  graphs_[graph_key_] = ex;
  return ex;
}

void CudaBackend::drop_graphs() {
  if (!graphs_.empty()) cudaStreamSynchronize(stream_);
  for (auto& [k, g] : graphs_)
    if (g) cudaGraphExecDestroy(g);
  graphs_.clear();
  mk_release();  // the step kernel's plans hold the same addresses
}

void CudaBackend::drop_slot_graphs(int slot) {
  for (auto it = graphs_.begin(); it != graphs_.end();) {
    if (it->first.slot == slot && slot >= 0) {
      cudaStreamSynchronize(stream_);
      cudaGraphExecDestroy(it->second);
      it = graphs_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<KernelLaunch> CudaBackend::describe(int64_t ctx, int rows, int groups) {
  if (ctx < 0) fail("inspect: the context must be >= 0 (got {})", ctx);
  if (groups < 1 || rows < groups || rows % groups != 0)
    fail("inspect: --rows {} must be a positive multiple of --groups {}", rows, groups);
  const int r = rows / groups;
  std::vector<std::unique_ptr<SequenceState>> sts;
  Step step;
  const std::vector<int32_t> toks(size_t(r), 0);
  const bool ids = can_sample();  // the runtime's device path: each sequence draws its next id greedily
  for (int g = 0; g < groups; ++g) {
    sts.push_back(new_state(ctx + r));
    static_cast<CudaState*>(sts.back().get())->n_ = ctx;  // only the launch shapes matter: nothing runs
    if (ids) set_sampling(*sts.back(), DeviceSampling{}, {});
    step.add(*sts.back(), toks, 1, !ids, ids);
  }
  for (int pass = 0; pass < 2; ++pass) {
    recording_ = true;
    marks_.clear();
    recorded_.clear();
    try {
      finish(forward(*this, step), StepOutputs{});
    } catch (...) {
      recording_ = false;
      abandon_step();
      throw;
    }
    recording_ = false;
    if (!mk_plan_only_) break;  // that pass built the step kernel's plan: record the step that launches it
  }
  return std::move(recorded_);
}

}  // namespace lily::cuda
