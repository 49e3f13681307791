// `lily bench --gemm`: the prompt GEMMs alone on the device, each kernel on the same data. The expert
// products of a prompt of P tokens at the Qwen3.5-35B-A3B shape (256 experts, top-8, hidden 2048, expert
// 512: gate‖up 1024 × 2048, down 2048 × 512), routed uniformly at random (seeded; every expert gets
// ~P/32 rows) through the tile map the MoE block builds (64-row tiles for mma.sync, 128 for wgmma), in bf16 and
// affine 4-bit g64; and one large dense bf16 product (8192³) for the card's dense bf16 rate in the same run. The
// wgmma rows include the input staging (gemm_stage.h), also timed alone. Inputs are random (never zeros).
#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/gemm_bench.h"
#include "backend/cuda/gemm_stage.h"
#include "backend/cuda/gemm_tc.h"
#include "backend/cuda/gemm_wgmma.h"
#include "backend/cuda/kernels.cuh"

namespace lily {
namespace {

__device__ __forceinline__ uint32_t mix(uint64_t i, uint32_t seed) {
  uint64_t z = i * 0x9E3779B97F4A7C15ull + seed;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return uint32_t(z ^ (z >> 31));
}
// Uniform in [-scale, scale).
__global__ void fill_f32(float* p, int64_t n, float scale, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = scale * (float(mix(uint64_t(i), seed) >> 8) * (2.f / 16777216.f) - 1.f);
}
__global__ void fill_bf16(uint16_t* p, int64_t n, float scale, float offset, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = offset + scale * (float(mix(uint64_t(i), seed) >> 8) * (2.f / 16777216.f) - 1.f);
    p[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
}
__global__ void fill_u32(uint32_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    p[i] = mix(uint64_t(i), seed);
}

template <typename T>
struct Buf {
  T* p = nullptr;
  int64_t n = 0;
  explicit Buf(int64_t count) : n(count) { LILY_CU(cudaMalloc(&p, sizeof(T) * size_t(std::max<int64_t>(1, n)))); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  ~Buf() { cudaFree(p); }
};

// Weights of E stacked [out, in] matrices: bf16 (bits 0) or affine (bits 4, group 64), random.
struct BenchWeights {
  Buf<uint16_t> w, s, b;
  Buf<uint32_t> q;
  cuda::Mat m;
  BenchWeights(int bits, int E, int out, int in)
      : w(bits ? 1 : int64_t(E) * out * in), s(bits ? int64_t(E) * out * (in / 64) : 1),
        b(bits ? int64_t(E) * out * (in / 64) : 1), q(bits ? int64_t(E) * out * in * bits / 32 : 1) {
    if (bits == 0) {
      fill_bf16<<<1024, 256>>>(w.p, w.n, 1.f / std::sqrt(float(in)), 0.f, 1);
      m = cuda::Mat::bf16(w.p, in, int64_t(out) * in);
    } else {
      fill_u32<<<1024, 256>>>(q.p, q.n, 2);
      fill_bf16<<<1024, 256>>>(s.p, s.n, 0.002f, 0.01f, 3);
      fill_bf16<<<1024, 256>>>(b.p, b.n, 0.02f, -0.08f, 4);
      m.affine = true; m.q = q.p; m.s = s.p; m.b = b.p; m.bits = bits; m.gs = 64;
      m.row_words = int64_t(in) * bits / 32;
      m.qstride = int64_t(out) * m.row_words;
      m.sstride = int64_t(out) * (in / 64);
    }
    LILY_CU_LAUNCH();
  }
};

// Milliseconds per call of f: one warm-up call, then `reps` calls between two events.
template <typename F>
double time_ms(F&& f, int reps) {
  cudaEvent_t e0, e1;
  LILY_CU(cudaEventCreate(&e0));
  LILY_CU(cudaEventCreate(&e1));
  f();
  LILY_CU(cudaDeviceSynchronize());
  LILY_CU(cudaEventRecord(e0));
  for (int i = 0; i < reps; ++i) f();
  LILY_CU(cudaEventRecord(e1));
  LILY_CU(cudaEventSynchronize(e1));
  float ms = 0;
  LILY_CU(cudaEventElapsedTime(&ms, e0, e1));
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return double(ms) / reps;
}

// The wgmma kernel's rows: bf16 weights in bf16 straight from shared memory; affine weights (and bf16 weights in
// fp16) dequantised in the consumers' registers (KernelSwitches::wgmma_rs) or by producer warps into shared memory.
struct WgmmaRow {
  const char* name;
  cuda::GemmPrec prec;
  bool rs;
};
std::vector<WgmmaRow> wgmma_rows(bool affine) {
  std::vector<WgmmaRow> r;
  if (affine) {
    r.push_back({"wgmma+TMA (bf16 operands), weights dequantised in registers", cuda::GemmPrec::kBf16, true});
    r.push_back({"wgmma+TMA (fp16 operands, scaled rows), weights dequantised in registers", cuda::GemmPrec::kFp16, true});
    r.push_back({"wgmma+TMA (bf16 operands), weights dequantised into shared memory", cuda::GemmPrec::kBf16, false});
  } else {
    r.push_back({"wgmma+TMA (bf16 operands)", cuda::GemmPrec::kBf16, true});
    r.push_back({"wgmma+TMA (fp16 operands, scaled rows), weights converted in registers", cuda::GemmPrec::kFp16, true});
    r.push_back({"wgmma+TMA (fp16 operands, scaled rows), weights converted in shared memory", cuda::GemmPrec::kFp16, false});
  }
  return r;
}
// f() under ks with wgmma_rs = rs.
template <typename F>
void with_rs(const cuda::KernelSwitches& ks, bool rs, F&& f) {
  cuda::KernelSwitches k = ks;
  k.wgmma_rs = rs;
  cuda::set_kernel_switches(k);
  f();
  cuda::set_kernel_switches(ks);
}

}  // namespace

std::vector<CudaGemmBenchRow> cuda_gemm_bench(int prompt_tokens, int repeats, const cuda::KernelSwitches& ks) {
  cuda::set_kernel_switches(ks);
  cuda::init_kernels();
  const bool hopper = ks.gemm_wgmma != cuda::kWgmmaOff && cuda::gemm_wgmma_device();  // the wgmma rows
  std::vector<CudaGemmBenchRow> rows;
  const int E = 256, k = 8, H = 2048, I = 512, P = std::max(1, prompt_tokens);
  // routing: k distinct experts per token, uniform; slots sorted by expert, tiles of <= 64 rows
  std::mt19937 rng(7);
  std::vector<std::vector<int32_t>> by_e(static_cast<size_t>(E));
  for (int t = 0; t < P; ++t) {
    int chosen[8], m = 0;
    while (m < k) {
      const int e = int(rng() % uint32_t(E));
      if (std::find(chosen, chosen + m, e) == chosen + m) chosen[m++] = e;
    }
    for (int j = 0; j < k; ++j) by_e[size_t(chosen[j])].push_back(t);
  }
  std::vector<int32_t> gather, tiles, tiles_u;  // tiles of 64 rows (mma.sync) and of the wgmma unit's 128
  int lo = P, hi = 0;
  for (int e = 0; e < E; ++e) {
    const int c = int(by_e[size_t(e)].size()), o = int(gather.size());
    lo = std::min(lo, c);
    hi = std::max(hi, c);
    for (int r = 0; r < c; r += cuda::kGemmBM) tiles.insert(tiles.end(), {e, o + r, std::min(cuda::kGemmBM, c - r)});
    for (int r = 0; r < c; r += cuda::kGemmUnitRows)
      tiles_u.insert(tiles_u.end(), {e, o + r, std::min(cuda::kGemmUnitRows, c - r)});
    gather.insert(gather.end(), by_e[size_t(e)].begin(), by_e[size_t(e)].end());
  }
  const int n = int(gather.size()), nt = int(tiles.size() / 3), nu = int(tiles_u.size() / 3);
  Buf<int32_t> dg(n), dt(int64_t(tiles.size())), dn(1), du(int64_t(tiles_u.size())), dnu(1);
  LILY_CU(cudaMemcpy(dg.p, gather.data(), 4 * gather.size(), cudaMemcpyHostToDevice));
  LILY_CU(cudaMemcpy(dt.p, tiles.data(), 4 * tiles.size(), cudaMemcpyHostToDevice));
  LILY_CU(cudaMemcpy(dn.p, &nt, 4, cudaMemcpyHostToDevice));
  LILY_CU(cudaMemcpy(du.p, tiles_u.data(), 4 * tiles_u.size(), cudaMemcpyHostToDevice));
  LILY_CU(cudaMemcpy(dnu.p, &nu, 4, cudaMemcpyHostToDevice));
  const std::string routing = " (" + std::to_string(P) + " tokens, top-8 of 256: " + std::to_string(lo) + ".." +
                              std::to_string(hi) + " rows per expert)";

  struct Shape {
    const char* name;
    int out, in;
    bool gathered;
  };
  const Shape shapes[] = {{"experts gate|up 1024x2048", 2 * I, H, true}, {"experts down 2048x512", H, I, false}};
  for (int bits : {0, 4})
    for (const Shape& sh : shapes) {
      BenchWeights W(bits, E, sh.out, sh.in);
      const int xrows = sh.gathered ? P : n;
      Buf<float> x(int64_t(xrows) * sh.in), y(int64_t(n) * sh.out);
      fill_f32<<<1024, 256>>>(x.p, x.n, 1.f, 5);
      LILY_CU_LAUNCH();
      const double flop = 2.0 * n * double(sh.out) * sh.in;
      const int32_t* g = sh.gathered ? dg.p : nullptr;
      auto add = [&](const char* kernel, auto&& f) {
        const double ms = time_ms(f, repeats);
        rows.push_back({std::string(sh.name) + routing, bits ? "affine4-g64" : "bf16", kernel, ms,
                        kernel[0] == ' ' ? 0.0 : flop / (ms * 1e-3) / 1e12});  // staging alone: no FLOPs
      };
      if (hopper) {
        for (const WgmmaRow& r : wgmma_rows(bits != 0))
          add(r.name, [&] {
            with_rs(ks, r.rs, [&] {
              cuda::gemm_wgmma(W.m, sh.out, sh.in, x.p, sh.in, g, y.p, sh.out, false, du.p, dnu.p, nu, n, r.prec, nullptr);
            });
          });
        if (bits == 0)
          add("  wgmma's input staging alone (bf16)", [&] {
            cuda::stage_rows(false, x.p, sh.in, sh.in, g, du.p, dnu.p, nu, n, nullptr);
          });
      }
      add("mma.sync (bf16 operands)", [&] {
        cuda::gemm_tc(W.m, sh.out, sh.in, x.p, sh.in, g, y.p, sh.out, false, dt.p, dn.p, nt, n, cuda::GemmPrec::kBf16, nullptr);
      });
      add("mma.sync (fp16 operands, scaled rows)", [&] {
        cuda::gemm_tc(W.m, sh.out, sh.in, x.p, sh.in, g, y.p, sh.out, false, dt.p, dn.p, nt, n, cuda::GemmPrec::kFp16,
                      nullptr, xrows);
      });
      add("mma.sync split hi/lo (--precision high)", [&] {
        cuda::gemm_tc(W.m, sh.out, sh.in, x.p, sh.in, g, y.p, sh.out, false, dt.p, dn.p, nt, n, cuda::GemmPrec::kSplit, nullptr);
      });
    }
  {  // the dense bf16 rate: 8192 rows × 8192 × 8192
    const int D = 8192;
    BenchWeights W(0, 1, D, D);
    Buf<float> x(int64_t(D) * D), y(int64_t(D) * D);
    fill_f32<<<1024, 256>>>(x.p, x.n, 1.f, 6);
    LILY_CU_LAUNCH();
    const double flop = 2.0 * double(D) * D * D;
    auto add = [&](const char* kernel, auto&& f) {
      const double ms = time_ms(f, std::max(1, repeats / 4));
      rows.push_back({"dense 8192x8192, 8192 rows", "bf16", kernel, ms, kernel[0] == ' ' ? 0.0 : flop / (ms * 1e-3) / 1e12});
    };
    if (hopper) {
      for (const WgmmaRow& r : wgmma_rows(false))
        add(r.name, [&] {
          with_rs(ks, r.rs, [&] {
            cuda::gemm_wgmma(W.m, D, D, x.p, D, nullptr, y.p, D, false, nullptr, nullptr, int(cuda::cdiv(D, cuda::kGemmBM)),
                             D, r.prec, nullptr);
          });
        });
      add("  wgmma's input staging alone (bf16)", [&] {
        cuda::stage_rows(false, x.p, D, D, nullptr, nullptr, nullptr, 0, D, nullptr);
      });
    }
    add("mma.sync (bf16 operands)", [&] {
      cuda::gemm_tc(W.m, D, D, x.p, D, nullptr, y.p, D, false, nullptr, nullptr, int(cuda::cdiv(D, cuda::kGemmBM)), D,
                    cuda::GemmPrec::kBf16, nullptr);
    });
    add("mma.sync (fp16 operands, scaled rows)", [&] {
      cuda::gemm_tc(W.m, D, D, x.p, D, nullptr, y.p, D, false, nullptr, nullptr, int(cuda::cdiv(D, cuda::kGemmBM)), D,
                    cuda::GemmPrec::kFp16, nullptr);
    });
  }
  LILY_CU(cudaDeviceSynchronize());
  return rows;
}

}  // namespace lily
