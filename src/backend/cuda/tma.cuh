// Shared-memory mbarriers and bulk copies (sm_90): the Tensor Memory Accelerator copies global memory
// into shared memory and counts the bytes on an mbarrier. On older devices these compile to __trap()
// (launchers never run them there).
#pragma once
#include <cstdint>

namespace lily::cuda {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define LILY_SM90(...) __trap()
#else
#define LILY_SM90(...) __VA_ARGS__
#endif

__device__ __forceinline__ uint32_t sm_addr(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
  LILY_SM90(asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(sm_addr(bar)), "r"(count) : "memory"));
}
// Makes barrier initialisations visible to the async proxy (and the cluster).
__device__ __forceinline__ void mbar_init_fence() {
  LILY_SM90(asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"));
}
// One arrival plus `bytes` expected transaction bytes in the barrier's current phase.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  LILY_SM90(asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sm_addr(bar)), "r"(bytes) : "memory"));
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  LILY_SM90(asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(sm_addr(bar)) : "memory"));
}
// True once the phase of parity `parity` has completed (a bounded wait: callers loop).
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  LILY_SM90(asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(sm_addr(bar)), "r"(parity)
      : "memory"));
  return done != 0;
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}
// Orders this thread's generic-proxy accesses of shared memory before later async-proxy ones (bulk copies).
__device__ __forceinline__ void fence_proxy_async_smem() {
  LILY_SM90(asm volatile("fence.proxy.async.shared::cta;" ::: "memory"));
}
// Global -> shared bulk copy (bytes % 16 == 0, both addresses 16-byte aligned), counted on bar.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  LILY_SM90(asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(sm_addr(dst)),
      "l"(src), "r"(bytes), "r"(sm_addr(bar))
      : "memory"));
}

// An L2 policy for data read once per use (streamed weights, state): evicted first, so the small data that
// many blocks re-read (activations, norms, op descriptors) stays in L2.
__device__ __forceinline__ uint64_t l2_evict_first() {
  uint64_t pol = 0;
  LILY_SM90(asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol)));
  return pol;
}
// bulk_copy with an L2 cache policy (l2_evict_first).
__device__ __forceinline__ void bulk_copy_hint(void* dst, const void* src, uint32_t bytes, uint64_t* bar, uint64_t pol) {
  LILY_SM90(asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          sm_addr(dst)),
      "l"(src), "r"(bytes), "r"(sm_addr(bar)), "l"(pol)
      : "memory"));
}

}  // namespace lily::cuda
