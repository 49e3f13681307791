// The NCCL collective of CUDA ranks on distinct GPUs of one host (shard_rank.h). libnccl.so.2 is loaded
// at run time (the CUDA toolkit ships it beside nccl.h; a binary without multi-GPU use never needs it), one
// communicator per rank from ncclCommInitAll; every call is grouped over the ranks and queued on each rank's
// stream, so a captured decode step holds its all-reduces. NVLink multicast (NVLS) stays off: the GPU hosts
// here forbid multicast objects.
#include <fmt/format.h>

#include <cstdlib>

#include "backend/cuda/shard_rank.h"
#include "core/error.h"

#ifdef LILY_HAVE_NCCL
#include <dlfcn.h>
#include <nccl.h>
#endif

namespace lily::cuda {

#ifdef LILY_HAVE_NCCL
namespace {

struct NcclApi {
  ncclResult_t (*comm_init_all)(ncclComm_t*, int, const int*) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*all_gather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*group_start)() = nullptr;
  ncclResult_t (*group_end)() = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;
  std::string why;  // empty: loaded
};

const NcclApi& nccl() {
  static const NcclApi api = [] {
    NcclApi a;
    void* h = nullptr;
    for (const char* name : {"libnccl.so.2", LILY_NCCL_LIBRARY})
      if (!h && name[0]) h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      a.why = fmt::format("cannot load libnccl.so.2 (nor {}): {}", LILY_NCCL_LIBRARY, dlerror());
      return a;
    }
    auto sym = [&](auto& f, const char* n) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(h, n));
      if (!f && a.why.empty()) a.why = fmt::format("libnccl.so.2 lacks {}", n);
    };
    sym(a.comm_init_all, "ncclCommInitAll");
    sym(a.comm_destroy, "ncclCommDestroy");
    sym(a.all_reduce, "ncclAllReduce");
    sym(a.all_gather, "ncclAllGather");
    sym(a.broadcast, "ncclBroadcast");
    sym(a.group_start, "ncclGroupStart");
    sym(a.group_end, "ncclGroupEnd");
    sym(a.error_string, "ncclGetErrorString");
    return a;
  }();
  return api;
}

void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw InternalError(fmt::format("NCCL {}: {}", what, nccl().error_string(r)));
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(const std::vector<int>& devices, const std::vector<cudaStream_t>& streams)
      : devices_(devices), streams_(streams), comms_(devices.size()) {
    check(nccl().comm_init_all(comms_.data(), int(devices.size()), devices.data()), "ncclCommInitAll");
  }
  ~NcclCollective() override {
    for (size_t r = 0; r < comms_.size(); ++r) {
      DeviceScope d(devices_[r]);
      nccl().comm_destroy(comms_[r]);
    }
  }

  void all_reduce(std::span<float* const> bufs, size_t n) override {
    check(nccl().group_start(), "ncclGroupStart");
    for (size_t r = 0; r < bufs.size(); ++r) {
      DeviceScope d(devices_[r]);
      check(nccl().all_reduce(bufs[r], bufs[r], n, ncclFloat32, ncclSum, comms_[r], streams_[r]), "ncclAllReduce");
    }
    check(nccl().group_end(), "ncclGroupEnd");
  }

  void all_gather_columns(std::span<const RankColumns> parts) override {
    const size_t N = parts.size();
    bool packed = parts[0].rows == 1;  // one row of equal blocks in rank order: one in-place all-gather
    for (size_t r = 0; r < N; ++r)
      packed = packed && parts[r].cols == parts[0].cols && parts[r].col0 == int64_t(r) * parts[0].cols &&
               parts[r].ld == int64_t(N) * parts[0].cols;
    check(nccl().group_start(), "ncclGroupStart");
    for (size_t r = 0; r < N; ++r) {
      DeviceScope d(devices_[r]);
      const RankColumns& p = parts[r];
      if (packed) {
        check(nccl().all_gather(p.data + p.col0, p.data, size_t(p.cols), ncclFloat32, comms_[r], streams_[r]), "ncclAllGather");
        continue;
      }
      for (size_t q = 0; q < N; ++q)  // rank q's columns of every row, from q to all
        for (int64_t i = 0; i < p.rows; ++i) {
          float* row = p.data + i * p.ld + parts[q].col0;
          check(nccl().broadcast(row, row, size_t(parts[q].cols), ncclFloat32, int(q), comms_[r], streams_[r]), "ncclBroadcast");
        }
    }
    check(nccl().group_end(), "ncclGroupEnd");
  }

 private:
  std::vector<int> devices_;
  std::vector<cudaStream_t> streams_;
  std::vector<ncclComm_t> comms_;
};

}  // namespace

std::unique_ptr<Collective> make_nccl_collective(const std::vector<int>& devices, const std::vector<cudaStream_t>& streams) {
  if (!nccl().why.empty()) fail("--devices: several GPUs need NCCL: {}", nccl().why);
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // no NVLink multicast objects (cuMulticastCreate) on these hosts
  return std::make_unique<NcclCollective>(devices, streams);
}
#else
std::unique_ptr<Collective> make_nccl_collective(const std::vector<int>&, const std::vector<cudaStream_t>&) {
  fail("--devices: several GPUs need NCCL, and this build found no nccl.h at configure time");
}
#endif

}  // namespace lily::cuda
