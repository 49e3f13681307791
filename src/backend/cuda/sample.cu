// Device sampling (sample.h). One draw:
//   memset ctl
//   penalize  (grid)   w = penalised logits, ctl.best = max composite (lowest id on ties)
//   histogram (grid)   per bin of d = (w - max)/T (1/8 nat wide, 2048 bins): count and fixed-point mass
//   plan      (1 block) greedy: the token. Otherwise the bins that can hold the kept set (top-k bin,
//                      min-p bin, top-p bin from the prefix sums), or with no filter the bin of the draw
//   compact   (grid)   ids of those bins -> candidate list (any order: everything after is order-free)
//   final     (1 block) exact radix selects over the candidates' composites: top-k boundary, top-p
//                      boundary, the draw; records the token (out, counts, step)
// Bins are monotone in the logit (a larger logit never lands in a later bin), so "bins <= b" is a prefix
// of the (logit desc, id asc) order and holds every token that order puts before them.
#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/cuda/sample.h"

namespace lily::cuda {
namespace {

constexpr int kIdBits = 18;
constexpr uint64_t kIdMask = (uint64_t(1) << kIdBits) - 1;
constexpr int kBins = 2048;
constexpr double kBinsPerNat = 8.0;
constexpr double kMassScale = 17592186044416.0;  // 2^44: V·2^44 < 2^62, so sums of masses never overflow
constexpr int kFinalThreads = 1024;              // plan and final: 2 bins per thread, 1024 radix digits
constexpr int kDigitBits = 10;
constexpr int kLevels = 5;                       // 5 · 10 bits = the 50-bit composite

struct Ctl {
  int slot;                  // the row's sampler (index into the slot table), set by penalize
  int first;                 // 1: the row is its slot's first of the call (applies and clears the mask)
  unsigned long long rng;    // RNG counter of the draw: the slot's draws before the call + the row's offset
  unsigned long long best;   // max composite (atomicMax)
  unsigned int ncand;        // candidates compacted
  int mode;                  // 0 greedy (done in plan), 1 plain draw within one bin, 2 filtered
  int lo, hi;                // candidate bins [lo, hi]
  unsigned long long target; // mode 1: draw target (1-based) within the bin
  unsigned long long ztotal; // Σ mass over all V
  // the kept set of the last draw (sample_probs): composite >= c_lo and, when z > 0, the min-p test
  unsigned long long c_lo;
  unsigned long long total;  // Σ mass of the kept set
  double z;                  // min-p normaliser (top-k mass / 2^44); 0: min-p off
  int token;
  unsigned int hcount[kBins];
  unsigned long long hmass[kBins];
};

__device__ __forceinline__ uint32_t fkey(float w) {
  const uint32_t u = __float_as_uint(w);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float kfloat(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
__device__ __forceinline__ uint64_t composite(float w, int id) {
  return (uint64_t(fkey(w)) << kIdBits) | (kIdMask - uint64_t(id));
}
__device__ __forceinline__ int id_of(uint64_t c) { return int(kIdMask - (c & kIdMask)); }
__device__ __forceinline__ float w_of(uint64_t c) { return kfloat(uint32_t(c >> kIdBits)); }

// (w - max) / T as the host computes it: float difference, double division. <= 0.
__device__ __forceinline__ double scaled(float w, float mx, float T) { return double(__fsub_rn(w, mx)) / double(T); }
__device__ __forceinline__ int bin_of(double d) {
  const double x = -d * kBinsPerNat;
  return x < double(kBins - 1) ? int(x) : kBins - 1;  // NaN and -inf logits land in the last bin
}
__device__ __forceinline__ uint64_t mass_of(double d) { return uint64_t(llrint(exp(d) * kMassScale)); }

__host__ __device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
__host__ __device__ __forceinline__ double uniform01(uint64_t seed, uint64_t step) {
  const uint64_t h = mix64(seed ^ mix64(step + 0x9e3779b97f4a7c15ULL));
  return double(h >> 11) * (1.0 / 9007199254740992.0);  // 53 bits
}
// r in [0, total) for the draw of (seed, step).
__device__ __forceinline__ uint64_t draw_r(uint64_t seed, uint64_t step, uint64_t total) {
  const uint64_t r = uint64_t(uniform01(seed, step) * double(total));
  return r < total ? r : total - 1;
}
// Fixed-point top-p target: the prefix must reach ceil(top_p · Z).
__device__ __forceinline__ uint64_t topp_target(float top_p, uint64_t Z) {
  uint64_t t = uint64_t(ceil(double(top_p) * double(Z)));
  return t < 1 ? 1 : (t > Z ? Z : t);
}

// Where one call's rows write (sample_rows).
struct Dest {
  int32_t* out;
  const int32_t* fed_slot;
  int32_t* fed;
};

// Records the drawn token of row r: its output, the slot's fed word, the penalty history, the RNG counter
// (rows of one slot in a call add up: atomics).
__device__ void record(Ctl* ctl, int tok, SampleSlot* slots, const Dest& dst, int r) {
  SampleSlot& S = slots[ctl->slot];
  ctl->token = tok;
  dst.out[r] = tok;
  if (dst.fed_slot && dst.fed && dst.fed_slot[r] >= 0) dst.fed[dst.fed_slot[r]] = tok;
  atomicAdd(S.counts + tok, 1);
  atomicAdd(reinterpret_cast<unsigned long long*>(&S.step), 1ull);
  if (ctl->first) S.mask_on = 0;
}

// Inclusive scan of one uint64 per thread over the block (blockDim.x a multiple of 32); *total gets the sum.
__device__ uint64_t block_scan(uint64_t v, uint64_t* wt /* [32] shared */, uint64_t* total) {
  const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t y = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += y;
  }
  __syncthreads();
  if (lane == 31) wt[wid] = v;
  __syncthreads();
  if (wid == 0) {
    uint64_t t = lane < nw ? wt[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const uint64_t y = __shfl_up_sync(0xffffffffu, t, o);
      if (lane >= o) t += y;
    }
    wt[lane] = t;
  }
  __syncthreads();
  *total = wt[nw - 1];
  return v + (wid > 0 ? wt[wid - 1] : 0);
}

__device__ uint64_t block_total(uint64_t v, uint64_t* wt) {
  uint64_t total;
  block_scan(v, wt, &total);
  return total;
}

// ---------------------------------------------------------------------------------------------
// grid (blocks, rows): row r = blockIdx.y draws from logits row src[r] with slots[slot[r]].
__global__ void penalize_kernel(const float* __restrict__ logits, int V, const SampleSlot* __restrict__ slots,
                                const int32_t* __restrict__ src, const int32_t* __restrict__ slot_of,
                                const int32_t* __restrict__ off, float* __restrict__ w_all, Ctl* ctl_all) {
  const int r = blockIdx.y;
  const int sl = slot_of[r];
  const SampleSlot& S = slots[sl];
  const SampleParams p = S.p;
  const int32_t* __restrict__ counts = S.counts;
  const bool first = !off || off[r] == 0;
  const uint64_t* __restrict__ mask = first && S.mask_on ? S.mask : nullptr;
  const float* __restrict__ bias = S.bias;
  const float* __restrict__ lg = logits + int64_t(src ? src[r] : r) * V;
  float* __restrict__ w = w_all + int64_t(r) * V;
  Ctl* ctl = ctl_all + r;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    ctl->slot = sl;
    ctl->first = first ? 1 : 0;
    ctl->rng = S.step + uint64_t(off ? off[r] : 0);
  }
  const bool pen = p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  unsigned long long best = 0;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < V; i += gridDim.x * blockDim.x) {
    // the host's order: logit bias, then the vocabulary limit and the mask, then the penalties
    float l = bias ? __fadd_rn(lg[i], bias[i]) : lg[i];
    if ((p.vocab_limit > 0 && i >= p.vocab_limit) || (mask && !((mask[i >> 6] >> (i & 63)) & 1ull))) l = -INFINITY;
    if (pen) {
      const int c = counts[i];
      if (c > 0) {  // the host's order and rounding, no contraction
        if (p.repetition_penalty != 1.0f) l = l > 0 ? __fdiv_rn(l, p.repetition_penalty) : __fmul_rn(l, p.repetition_penalty);
        l = __fsub_rn(l, __fadd_rn(p.presence_penalty, __fmul_rn(p.frequency_penalty, float(c))));
      }
    }
    l = __fadd_rn(l, 0.0f);  // -0 -> +0: the host compares them equal (a tie), the key must too
    w[i] = l;
    const unsigned long long c = composite(l, i);
    best = c > best ? c : best;
  }
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long y = __shfl_xor_sync(0xffffffffu, best, o);
    best = y > best ? y : best;
  }
  if ((threadIdx.x & 31) == 0) atomicMax(&ctl->best, best);
}

__global__ void histogram_kernel(const float* __restrict__ w_all, int V, const SampleSlot* __restrict__ slots, Ctl* ctl_all) {
  __shared__ unsigned int sc[kBins];
  __shared__ unsigned long long sm[kBins];
  Ctl* ctl = ctl_all + blockIdx.y;
  const float* __restrict__ w = w_all + int64_t(blockIdx.y) * V;
  const float T = slots[ctl->slot].p.temperature;
  if (T == 0.0f) return;  // greedy: the plan takes the max
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) { sc[b] = 0; sm[b] = 0; }
  __syncthreads();
  const float mx = w_of(ctl->best);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < V; i += gridDim.x * blockDim.x) {
    const double d = scaled(w[i], mx, T);
    const int b = bin_of(d);
    atomicAdd(&sc[b], 1u);
    atomicAdd(&sm[b], (unsigned long long)mass_of(d));
  }
  __syncthreads();
  for (int b = threadIdx.x; b < kBins; b += blockDim.x) {
    if (sc[b]) atomicAdd(&ctl->hcount[b], sc[b]);
    if (sm[b]) atomicAdd(&ctl->hmass[b], sm[b]);
  }
}

__global__ void __launch_bounds__(kFinalThreads) plan_kernel(int V, SampleSlot* slots, Ctl* ctl_all, const Dest dst) {
  __shared__ uint64_t wt[32];
  __shared__ int s_bin;
  const int row = blockIdx.x;
  Ctl* ctl = ctl_all + row;
  const SampleParams p = slots[ctl->slot].p;
  const int t = threadIdx.x;
  if (p.temperature == 0.0f) {
    if (t == 0) {
      const int tok = id_of(ctl->best);
      ctl->mode = 0;
      ctl->c_lo = ctl->best;
      ctl->total = 1;
      ctl->z = 0;
      record(ctl, tok, slots, dst, row);
    }
    return;
  }
  // thread t owns bins 2t and 2t+1 (bin 0: the most likely tokens)
  const uint64_t c0 = ctl->hcount[2 * t], c1 = ctl->hcount[2 * t + 1];
  const uint64_t m0 = ctl->hmass[2 * t], m1 = ctl->hmass[2 * t + 1];
  uint64_t ctot, mtot;
  const uint64_t cex = block_scan(c0 + c1, wt, &ctot) - c0 - c1;
  const uint64_t mex = block_scan(m0 + m1, wt, &mtot) - m0 - m1;
  if (t == 0) s_bin = kBins - 1;
  __syncthreads();
  const bool topk = p.top_k > 0 && p.top_k < V, minp = p.min_p > 0.0f, topp = p.top_p < 1.0f;
  if (!topk && !minp && !topp) {
    // Plain draw over all V: pick the bin holding cumulative mass r, then the token inside it (final).
    const uint64_t r = draw_r(p.seed, ctl->rng, mtot);
    if (mex <= r && r < mex + m0) { ctl->lo = ctl->hi = 2 * t; ctl->target = r - mex + 1; }
    if (mex + m0 <= r && r < mex + m0 + m1) { ctl->lo = ctl->hi = 2 * t + 1; ctl->target = r - mex - m0 + 1; }
    if (t == 0) {
      ctl->mode = 1;
      ctl->ztotal = mtot;
      ctl->c_lo = 0;
      ctl->total = mtot;
      ctl->z = 0;
    }
    return;
  }
  int hi;
  if (topk) {  // the bin of the k-th token: all of the top-k set lies in bins <= it
    const uint64_t k = uint64_t(p.top_k);
    if (cex < k && k <= cex + c0) s_bin = 2 * t;
    if (cex + c0 < k && k <= cex + c0 + c1) s_bin = 2 * t + 1;
    __syncthreads();
    hi = s_bin;
  } else {
    // min-p keeps e >= ~min_p, i.e. bins <= -ln(min_p)·8 (one bin of slack for rounding); top-p without
    // top-k cuts at the bin where the prefix mass reaches the same fixed-point target final uses.
    int bm = kBins - 1;
    if (minp) bm = min(kBins - 1, int(-log(double(p.min_p)) * kBinsPerNat) + 1);
    if (topp) {
      const uint64_t tg = topp_target(p.top_p, mtot);
      if (mex < tg && tg <= mex + m0) s_bin = 2 * t;
      if (mex + m0 < tg && tg <= mex + m0 + m1) s_bin = 2 * t + 1;
    }
    __syncthreads();
    hi = min(bm, s_bin);
  }
  if (t == 0) {
    ctl->mode = 2;
    ctl->lo = 0;
    ctl->hi = hi;
    ctl->ztotal = mtot;
  }
}

__global__ void compact_kernel(const float* __restrict__ w_all, int V, const SampleSlot* __restrict__ slots, Ctl* ctl_all,
                               uint64_t* __restrict__ key_all, uint64_t* __restrict__ mass_all) {
  Ctl* ctl = ctl_all + blockIdx.y;
  if (ctl->mode == 0) return;
  const float* __restrict__ w = w_all + int64_t(blockIdx.y) * V;
  uint64_t* __restrict__ cand_key = key_all + int64_t(blockIdx.y) * V;
  uint64_t* __restrict__ cand_mass = mass_all + int64_t(blockIdx.y) * V;
  const float T = slots[ctl->slot].p.temperature;
  const float mx = w_of(ctl->best);
  const int lo = ctl->lo, hi = ctl->hi;
  const int lane = threadIdx.x & 31;
  // warp-uniform loop (blockDim.x is a multiple of 32): one atomic per warp and iteration
  for (int base = blockIdx.x * blockDim.x; base < V; base += gridDim.x * blockDim.x) {
    const int i = base + threadIdx.x;
    float wi = 0.0f;
    double d = 0.0;
    bool take = false;
    if (i < V) {
      wi = w[i];
      d = scaled(wi, mx, T);
      const int b = bin_of(d);
      take = b >= lo && b <= hi;
    }
    const unsigned mask = __ballot_sync(0xffffffffu, take);
    if (!mask) continue;
    const int leader = __ffs(mask) - 1;
    unsigned pos = 0;
    if (lane == leader) pos = atomicAdd(&ctl->ncand, unsigned(__popc(mask)));
    pos = __shfl_sync(0xffffffffu, pos, leader);
    if (take) {
      const unsigned slot = pos + unsigned(__popc(mask & ((1u << lane) - 1u)));
      cand_key[slot] = composite(wi, i);
      cand_mass[slot] = mass_of(d);
    }
  }
}

struct SelectSmem {
  unsigned long long hist[1 << kDigitBits];
  uint64_t wt[32];
  int digit;
  uint64_t newbase;
};

// Over the candidates j < n with keep(c_j): the composite C* with W(c > C*) < target <= W(c >= C*), where
// W sums weight(j) (1 or the mass) in composite order, largest first. False when W(all) < target.
// Composites are unique, so C* names one token. Requires blockDim.x == 1024 and target >= 1.
template <class Keep>
__device__ bool radix_select(const uint64_t* __restrict__ key, const uint64_t* __restrict__ mass, int n, bool by_mass,
                             Keep keep, uint64_t target, uint64_t* result, SelectSmem& sh) {
  const int t = threadIdx.x;
  uint64_t prefix = 0, base = 0;
  for (int lev = 0; lev < kLevels; ++lev) {
    const int shift = (kLevels - 1 - lev) * kDigitBits;
    sh.hist[t] = 0;
    __syncthreads();
    // Runs of one digit are summed in a register before their atomic: over a flat distribution most
    // candidates share the leading digits, and one shared-memory address taking every add serialises.
    int run_digit = -1;
    unsigned long long run = 0;
    for (int j = t; j < n; j += blockDim.x) {
      const uint64_t c = key[j];
      if ((c >> (shift + kDigitBits)) == (prefix >> (shift + kDigitBits)) && keep(c)) {
        const int dg = int((c >> shift) & ((1u << kDigitBits) - 1));
        if (dg != run_digit) {
          if (run_digit >= 0) atomicAdd(&sh.hist[run_digit], run);
          run_digit = dg;
          run = 0;
        }
        run += by_mass ? (unsigned long long)mass[j] : 1ull;
      }
    }
    if (run_digit >= 0) atomicAdd(&sh.hist[run_digit], run);
    __syncthreads();
    // thread t takes digit 1023 - t, so the inclusive scan runs from the largest digit down
    const int dg = (1 << kDigitBits) - 1 - t;
    const uint64_t h = sh.hist[dg];
    uint64_t tot;
    const uint64_t incl = block_scan(h, sh.wt, &tot), excl = incl - h;
    if (lev == 0 && tot < target) return false;  // block-uniform
    if (base + excl < target && target <= base + incl) {  // exactly one digit (h > 0)
      sh.digit = dg;
      sh.newbase = base + excl;
    }
    __syncthreads();
    prefix |= uint64_t(sh.digit) << shift;
    base = sh.newbase;
    __syncthreads();  // everyone has read digit/newbase before the next level writes them
  }
  *result = prefix;
  return true;
}

__global__ void __launch_bounds__(kFinalThreads) final_kernel(int V, SampleSlot* slots, const uint64_t* __restrict__ key_all,
                                                              const uint64_t* __restrict__ mass_all, Ctl* ctl_all,
                                                              const Dest dst) {
  __shared__ SelectSmem sh;
  const int row = blockIdx.x;
  Ctl* ctl = ctl_all + row;
  const uint64_t* __restrict__ cand_key = key_all + int64_t(row) * V;
  const uint64_t* __restrict__ cand_mass = mass_all + int64_t(row) * V;
  const int mode = ctl->mode;
  if (mode == 0) return;
  const SampleParams p = slots[ctl->slot].p;
  const int n = int(ctl->ncand);
  const int t = threadIdx.x;
  uint64_t pick = 0;
  if (mode == 1) {  // plain: the token at cumulative mass `target` inside the drawn bin
    const bool ok = radix_select(cand_key, cand_mass, n, true, [](uint64_t) { return true; }, ctl->target, &pick, sh);
    if (t == 0) record(ctl, ok ? id_of(pick) : id_of(ctl->best), slots, dst, row);
    return;
  }
  const bool topk = p.top_k > 0 && p.top_k < V, minp = p.min_p > 0.0f, topp = p.top_p < 1.0f;
  const float mx = w_of(ctl->best), T = p.temperature;
  // top-k: keep composites >= the k-th largest
  uint64_t ck = 0;
  if (topk) radix_select(cand_key, cand_mass, n, false, [](uint64_t) { return true; }, uint64_t(p.top_k), &ck, sh);
  // probabilities are normalised over the top-k set
  uint64_t Z = ctl->ztotal;
  if (topk) {
    uint64_t s = 0;
    for (int j = t; j < n; j += blockDim.x)
      if (cand_key[j] >= ck) s += cand_mass[j];
    Z = block_total(s, sh.wt);
  }
  const double zd = double(Z) / kMassScale;
  const double cut = (1.0 / zd) * double(p.min_p);  // the host: prob[0] · min_p, prob[0] = 1 / Σ
  auto minp_ok = [&](uint64_t c) { return !minp || exp(scaled(w_of(c), mx, T)) / zd >= cut; };
  // top-p: the shortest prefix of the min-p set whose mass reaches ceil(top_p · Z); all of it if none
  uint64_t cp = 0;
  if (topp) {
    uint64_t c = 0;
    if (radix_select(cand_key, cand_mass, n, true, [&](uint64_t x) { return x >= ck && minp_ok(x); },
                     topp_target(p.top_p, Z), &c, sh))
      cp = c;
  }
  const uint64_t c_lo = ck > cp ? ck : cp;
  auto kept = [&](uint64_t x) { return x >= c_lo && minp_ok(x); };
  uint64_t s = 0;
  for (int j = t; j < n; j += blockDim.x)
    if (kept(cand_key[j])) s += cand_mass[j];
  const uint64_t total = block_total(s, sh.wt);
  const uint64_t r = draw_r(p.seed, ctl->rng, total);
  const bool ok = radix_select(cand_key, cand_mass, n, true, kept, r + 1, &pick, sh);
  if (t == 0) {
    ctl->c_lo = c_lo;
    ctl->total = total;
    ctl->z = minp ? zd : 0.0;
    record(ctl, ok ? id_of(pick) : id_of(ctl->best), slots, dst, row);
  }
}

__global__ void probs_kernel(const float* __restrict__ w, int V, const SampleSlot* __restrict__ slots, const Ctl* ctl,
                             double* __restrict__ probs) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= V) return;
  const SampleParams* P = &slots[ctl->slot].p;
  if (ctl->mode == 0) {
    probs[i] = i == ctl->token ? 1.0 : -1.0;
    return;
  }
  const float T = P->temperature, mx = w_of(ctl->best);
  const double d = scaled(w[i], mx, T);
  bool keep = composite(w[i], i) >= ctl->c_lo;
  if (keep && ctl->z > 0) keep = exp(d) / ctl->z >= (1.0 / ctl->z) * double(P->min_p);
  probs[i] = keep ? double(mass_of(d)) / double(ctl->total) : -1.0;
}

size_t al256(size_t b) { return (b + 255) & ~size_t(255); }

}  // namespace

size_t sample_bytes(int V, int rows) {
  const size_t R = size_t(std::max(rows, 1));
  return al256(4 * size_t(V) * R) + 2 * al256(8 * size_t(V) * R) + al256(sizeof(Ctl) * R);
}

SampleDev sample_layout(void* base, int V, int rows) {
  if (V < 1 || V > kSampleMaxVocab) fail_internal("sample_layout: vocabulary size outside 1..262144");
  if (rows < 1) fail_internal("sample_layout: at least one row");
  SampleDev d;
  d.V = V;
  d.rows = rows;
  const size_t R = size_t(rows);
  char* p = static_cast<char*>(base);
  d.w = reinterpret_cast<float*>(p); p += al256(4 * size_t(V) * R);
  d.cand_key = reinterpret_cast<uint64_t*>(p); p += al256(8 * size_t(V) * R);
  d.cand_mass = reinterpret_cast<uint64_t*>(p); p += al256(8 * size_t(V) * R);
  d.ctl = p;
  d.ctl_bytes = sizeof(Ctl);
  return d;
}

void sample_rows(const SampleDev& d, SampleSlot* slots, const float* logits, int n, const int32_t* src,
                 const int32_t* slot, const int32_t* off, int32_t* out, cudaStream_t s, const int32_t* fed_slot,
                 int32_t* fed) {
  if (n <= 0) return;
  if (n > d.rows) fail_internal("sample_rows: more rows than the scratch holds");
  Ctl* ctl = static_cast<Ctl*>(d.ctl);
  const int V = d.V;
  const Dest dst{out, fed_slot, fed};
  const unsigned rows = unsigned(n);
  LILY_CU(cudaMemsetAsync(ctl, 0, sizeof(Ctl) * size_t(n), s));
  penalize_kernel<<<dim3(std::min(cdiv(V, 256), 1024u), rows), 256, 0, s>>>(logits, V, slots, src, slot, off, d.w, ctl);
  LILY_CU_LAUNCH();
  histogram_kernel<<<dim3(std::min(cdiv(V, 512 * 8), 132u), rows), 512, 0, s>>>(d.w, V, slots, ctl);
  LILY_CU_LAUNCH();
  plan_kernel<<<rows, kFinalThreads, 0, s>>>(V, slots, ctl, dst);
  LILY_CU_LAUNCH();
  compact_kernel<<<dim3(std::min(cdiv(V, 256), 1024u), rows), 256, 0, s>>>(d.w, V, slots, ctl, d.cand_key, d.cand_mass);
  LILY_CU_LAUNCH();
  final_kernel<<<rows, kFinalThreads, 0, s>>>(V, slots, d.cand_key, d.cand_mass, ctl, dst);
  LILY_CU_LAUNCH();
}

void sample_probs(const SampleDev& d, const SampleSlot* slots, int row, double* probs, cudaStream_t s) {
  if (row < 0 || row >= d.rows) fail_internal("sample_probs: row outside the scratch");
  probs_kernel<<<cdiv(d.V, 256), 256, 0, s>>>(d.w + int64_t(row) * d.V, d.V, slots, static_cast<const Ctl*>(d.ctl) + row,
                                              probs);
  LILY_CU_LAUNCH();
}

double sample_uniform(uint64_t seed, uint64_t step) { return uniform01(seed, step); }

}  // namespace lily::cuda
