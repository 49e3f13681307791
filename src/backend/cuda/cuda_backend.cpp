// CudaBackend: the blocks of backend/backend.h on one CUDA device, one stream.
#include "backend/cuda/cuda_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <map>
#include <tuple>
#include <vector>

#include "backend/cuda/ops.h"
#include "backend/cuda/sample.h"
#include "core/error.h"
#include "core/half.h"
#include "quant/affine/affine.h"
#include "quant/exl3/exl3.h"

namespace lily {
namespace {

using namespace lily::cuda;

// Device allocations with a running total for peak_memory().
struct DevMem {
  size_t cur = 0, peak = 0;
  void* alloc(size_t bytes) {
    void* p = nullptr;
    if (bytes == 0) return nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess)
      throw InputError(fmt::format("CUDA: cannot allocate {:.1f} MiB of device memory ({})", bytes / 1048576.0,
                                   cudaGetErrorString(e)));
    cur += bytes;
    peak = std::max(peak, cur);
    return p;
  }
  void free(void* p, size_t bytes) {
    if (!p) return;
    cudaFree(p);
    cur -= bytes;
  }
};

struct DevLayer {
  LayerKind kind;
  float *in_norm = nullptr, *post_norm = nullptr;
  // DeltaNet
  std::vector<std::pair<Mat, int>> gdn_in;  // runs of [qkv|z|b|a] rows in one format: (matrix, rows)
  Mat gdn_out;                              // [H, Hv·dv]
  GdnDev gdn;
  // attention
  std::vector<std::pair<Mat, int>> attn_in;  // runs of [q|gate ·Hq, k, v] rows
  Mat attn_o;                                // [H, Hq·hd]
  AttnDev attn;
  MoeDev moe;
};

class CudaBackend;

class CudaState final : public SequenceState {
 public:
  CudaState(CudaBackend& be, int64_t cap);
  ~CudaState() override;
  int64_t n_tokens() const override { return n_; }
  int64_t capacity() const override { return cap_; }
  std::unique_ptr<SequenceState> clone() const override;
  void restore(const SequenceState& snapshot) override;
  void reset() override;
  size_t nbytes() const override { return fixed_bytes_ + size_t(n_) * kv_bytes_per_token_; }

  CudaBackend& be_;
  int64_t cap_, n_ = 0;
  int64_t* d_pos = nullptr;
  std::vector<uint16_t*> kc, vc;          // per layer (attention layers)
  std::vector<float*> conv, S;            // per layer (DeltaNet layers)
  void* region = nullptr;
  size_t region_bytes = 0, fixed_bytes_ = 0, kv_bytes_per_token_ = 0;
  std::map<int, cudaGraphExec_t> graphs;  // decode graph per context bucket (key: bucket, +1000 argmax-fed, +2000 sampler-fed)
  uint64_t graph_gen = 0;
  void drop_graphs();
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(std::shared_ptr<const ModelWeights> w, const CudaOptions& opt);
  ~CudaBackend() override;
  std::string name() const override { return "cuda"; }
  const ModelWeights& weights() const override { return *w_; }
  std::unique_ptr<SequenceState> new_state(int64_t max_tokens) override;
  void begin(SequenceState& st, int64_t T) override;
  void embed(const int32_t* tokens) override;
  void gdn_mixer(int layer) override;
  void attn_mixer(int layer) override;
  void ffn(int layer) override;
  void head(int64_t rows, float* logits) override;
  void end() override;
  void synchronize() override { LILY_CU(cudaStreamSynchronize(stream_)); }
  size_t peak_memory() const override { return mem_.peak; }
  // Longer steps fill the expert tiles of the grouped GEMMs (8 slots × T / E rows per expert) and run
  // fewer launches per token; the scratch grows with T (35B-A3B affine4: 22.2 GB peak at 8192, 20.3 at 2048).
  int64_t preferred_prefill_chunk() const override { return 8192; }
  // Device-to-device cudaMemcpy of 1 GiB (bytes read + written per second), median of 5, measured once.
  double copy_bandwidth() override;
  double copy_bw_ = 0;

  // greedy mode: the step's input token is already in d_tokens_[0]; head writes the argmax there.
  void set_greedy(bool on) { greedy_ = on; }
  // with greedy mode: head runs the device sampler (sample.h) instead of the argmax
  bool sampler_ = false;
  SampleDev samp_;
  void* samp_mem_ = nullptr;
  // zeroed words that kernels leave zero: the argmax scratch (argmax_scratch_bytes(1)), then the top-k fold
  // counter shared by the MoE layers (LILY_TOPK_FOLD=0: no fold)
  void* amax_ = nullptr;
  static size_t small_bytes() { return (argmax_scratch_bytes(1) + 15) / 16 * 16 + 16; }
  unsigned* topk_counter() const {
    static const bool on = [] {
      const char* v = std::getenv("LILY_TOPK_FOLD");
      return !(v && v[0] == '0');
    }();
    return on ? reinterpret_cast<unsigned*>(static_cast<char*>(amax_) + (argmax_scratch_bytes(1) + 15) / 16 * 16) : nullptr;
  }
  size_t samp_bytes_ = 0;
  void ensure_sampler();
  void fed_step(SequenceState& st);  // one decode step whose input id is already in d_tokens_[0]
  bool can_decode_on_device() const override { return true; }
  DeviceDecodeResult decode_on_device(SequenceState& st, const DeviceDecode& req, const std::function<bool(int32_t)>& on_token,
                                      float* last_logits) override;
  std::vector<KernelLaunch> describe(int64_t ctx);

  std::shared_ptr<const ModelWeights> w_;
  CudaOptions opt_;
  DevMem mem_;
  cudaStream_t stream_ = nullptr, side_ = nullptr;  // side_: shared expert, forked/joined by events
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  std::vector<DevLayer> layers_;
  Mat embed_, lm_head_;
  float* final_norm_ = nullptr;
  float* inv_freq_ = nullptr;
  std::vector<std::pair<void*, size_t>> weight_allocs_;

  // scratch (grown in begin(); growing drops captured graphs)
  int cap_T_ = 0;
  uint64_t scratch_gen_ = 1;
  float *x_ = nullptr, *u_ = nullptr, *proj_ = nullptr, *core_ = nullptr, *logits_ = nullptr;
  int32_t* d_tokens_ = nullptr;
  void* work_ = nullptr;
  size_t work_bytes_ = 0, scratch_bytes_ = 0;
  int max_proj_ = 0, max_core_ = 0;

  // current step
  CudaState* st_ = nullptr;
  int T_ = 0;
  int nsplit_ = 1;
  bool capture_ = false, replay_ = false, greedy_ = false;
  int bucket_key_ = 0;
  float* host_logits_ = nullptr;
  int64_t host_rows_ = 0;
  // describe(): node counts at block boundaries while capturing
  bool recording_ = false;
  std::map<std::string, double> prof_;
  std::string prof_block_;
  std::chrono::steady_clock::time_point prof_t0_;
  int64_t prof_steps_ = 0;
  std::vector<std::pair<size_t, std::pair<int, std::string>>> marks_;

  void mark(int layer, const char* blk);
  void ensure_scratch(int T);
  void ensure_logits(int64_t rows);
  int64_t logits_rows_ = 0;
  // Uploads the matrices (same format and `in`) concatenated along their rows into one device matrix.
  Mat upload(const std::vector<const Linear*>& parts);
  Mat upload(const Linear& l) { return upload(std::vector<const Linear*>{&l}); }
  // EXL3 parts (one Exl3Part each); rows restart at 0 every `per_expert` parts (one expert's parts).
  Mat upload_exl3(const std::vector<const Linear*>& parts, int per_expert);
  // Consecutive parts of one format share an upload; each run is (matrix, rows).
  std::vector<std::pair<Mat, int>> upload_runs(const std::vector<const Linear*>& parts);
  void* alloc_w(size_t bytes) {
    void* p = mem_.alloc(bytes);
    weight_allocs_.push_back({p, bytes});
    return p;
  }
  float* upload_f32(const std::vector<float>& v) {
    if (v.empty()) return nullptr;
    auto* p = static_cast<float*>(mem_.alloc(v.size() * 4));
    weight_allocs_.push_back({p, v.size() * 4});
    LILY_CU(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    return p;
  }
  int bucket_for(int64_t ctx) const {
    int b = 0;
    while ((int64_t(256) << b) < ctx) ++b;
    return b;
  }
};

bool same_format(const Linear& a, const Linear& b);

// ---------------------------------------------------------------------------------------------
CudaBackend::CudaBackend(std::shared_ptr<const ModelWeights> w, const CudaOptions& opt) : w_(std::move(w)), opt_(opt) {
  LILY_CU(cudaSetDevice(opt_.device));
  LILY_CU(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  LILY_CU(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  amax_ = mem_.alloc(small_bytes());
  LILY_CU(cudaMemset(amax_, 0, small_bytes()));
  LILY_CU(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  LILY_CU(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
  init_kernels();
  const ModelConfig& c = w_->cfg;
  const int H = int(c.hidden);
  if (w_->embed.format == WeightFormat::Exl3)
    fail("CUDA backend: embedding '{}' is EXL3; the CUDA backend gathers embedding rows from bf16/f16/f32 or affine tables",
         w_->embed.name);
  embed_ = upload(w_->embed);
  const bool tied = w_->lm_head.format == w_->embed.format &&
                    (w_->lm_head.format == WeightFormat::Dense    ? w_->lm_head.dense.data == w_->embed.dense.data
                     : w_->lm_head.format == WeightFormat::Affine ? w_->lm_head.affine == w_->embed.affine
                                                                  : w_->lm_head.exl3 == w_->embed.exl3);
  lm_head_ = tied ? embed_ : upload(w_->lm_head);
  final_norm_ = upload_f32(w_->final_norm);
  layers_.resize(size_t(c.layers));
  for (int l = 0; l < int(c.layers); ++l) {
    const LayerWeights& L = w_->layers[size_t(l)];
    DevLayer& D = layers_[size_t(l)];
    D.kind = L.kind;
    D.in_norm = upload_f32(L.input_norm);
    D.post_norm = upload_f32(L.post_norm);
    if (L.kind == LayerKind::LinearAttention) {
      GdnDev& g = D.gdn;
      g.Hk = int(c.lin_k_heads); g.Hv = int(c.lin_v_heads); g.dk = int(c.lin_k_dim); g.dv = int(c.lin_v_dim);
      g.K = int(c.conv_kernel); g.eps = float(c.rms_eps);
      if (g.K < 1 || g.K > 8) fail("CUDA backend: linear_conv_kernel_dim {} is outside 1..8", g.K);
      const int PW = g.proj_width();
      D.gdn_in = upload_runs({&L.gdn.in_qkv, &L.gdn.in_z, &L.gdn.in_b, &L.gdn.in_a});
      D.gdn_out = upload(L.gdn.out);
      g.conv = upload_f32(L.gdn.conv); g.dt_bias = upload_f32(L.gdn.dt_bias);
      g.A_neg = upload_f32(L.gdn.A_neg); g.norm = upload_f32(L.gdn.norm);
      max_proj_ = std::max(max_proj_, PW);
      max_core_ = std::max(max_core_, g.Hv * g.dv);
    } else {
      AttnDev& a = D.attn;
      a.Hq = int(c.n_heads); a.Hkv = int(c.n_kv_heads); a.hd = int(c.head_dim); a.rot = int(c.rotary_dim);
      a.theta = float(c.rope_theta); a.eps = float(c.rms_eps);
      const int PW = a.proj_width();
      D.attn_in = upload_runs({&L.attn.q, &L.attn.k, &L.attn.v});
      D.attn_o = upload(L.attn.o);
      a.q_norm = upload_f32(L.attn.q_norm); a.k_norm = upload_f32(L.attn.k_norm);
      if (!w_->rope_inv_freq.empty()) {
        if (!inv_freq_) inv_freq_ = upload_f32(w_->rope_inv_freq);
        a.inv_freq = inv_freq_;
      }
      max_proj_ = std::max(max_proj_, PW);
      max_core_ = std::max(max_core_, a.Hq * a.hd);
    }
    const FfnWeights& F = L.ffn;
    MoeDev& m = D.moe;
    m.H = H;
    m.moe = F.moe;
    if (F.moe) {
      m.E = int(F.experts.size()); m.k = int(c.top_k); m.norm_topk = c.norm_topk;
      m.topk_counter = topk_counter();
      if (m.k > 64 || m.k > m.E) fail("CUDA backend: num_experts_per_tok {} must be <= 64 and <= num_experts", m.k);
      m.I = int(F.experts.at(0).gate.out);
      // the shared-expert gate rides along as router row E when both share a format (one GEMV fewer)
      if (!F.shared_gate.empty() && same_format(F.router, F.shared_gate)) {
        m.router = upload({&F.router, &F.shared_gate});
        m.gate_in_router = true;
      } else {
        m.router = upload(F.router);
      }
      std::vector<const Linear*> gu, dn;
      for (const Expert& ex : F.experts) {
        if (ex.gate.out != m.I || ex.down.in != m.I) fail("CUDA backend: experts of layer {} differ in size", l);
        gu.push_back(&ex.gate);
        gu.push_back(&ex.up);
        dn.push_back(&ex.down);
      }
      const bool ex3 = F.experts.at(0).gate.format == WeightFormat::Exl3;
      // the shared expert as expert E of the stacks: one GEMV pair for k + 1 slots, no side stream
      const Expert& e0 = F.experts.at(0);
      m.shared_in_stack = !ex3 && !F.shared.gate.empty() && F.shared.gate.out == m.I && F.shared.down.in == m.I &&
                          same_format(F.shared.gate, e0.gate) && same_format(F.shared.up, e0.up) &&
                          same_format(F.shared.down, e0.down) && (F.shared_gate.empty() || m.gate_in_router);
      if (m.shared_in_stack) {
        gu.push_back(&F.shared.gate);
        gu.push_back(&F.shared.up);
        dn.push_back(&F.shared.down);
      }
      m.gate_up = ex3 ? upload_exl3(gu, 2) : upload(gu);
      m.down = ex3 ? upload_exl3(dn, 1) : upload(dn);
      // expert strides: one expert = 2I rows of gate_up, H rows of down
      for (auto [mp, rows, in] : {std::tuple{&m.gate_up, int64_t(2) * m.I, int64_t(H)}, std::tuple{&m.down, int64_t(H), int64_t(m.I)}}) {
        mp->estride = rows * mp->ld;
        mp->qstride = rows * mp->row_words;
        mp->sstride = mp->affine ? rows * (in / mp->gs) : 0;
      }
      if (!F.shared_gate.empty()) m.sh_gate = m.gate_in_router ? m.router : upload(F.shared_gate);
    }
    if (!F.shared.gate.empty()) m.Is = int(F.shared.gate.out);
    if (!F.shared.gate.empty() && !m.shared_in_stack) {
      m.sh_gate_up = upload({&F.shared.gate, &F.shared.up});
      m.sh_down = upload(F.shared.down);
    }
  }
  LILY_CU(cudaDeviceSynchronize());
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);
  for (auto& [p, n] : weight_allocs_) mem_.free(p, n);
  mem_.free(work_, scratch_bytes_);
  mem_.free(logits_, size_t(logits_rows_) * size_t(w_->cfg.vocab) * 4);
  mem_.free(samp_mem_, samp_bytes_);
  mem_.free(amax_, small_bytes());
  cudaStreamDestroy(stream_);
  cudaStreamDestroy(side_);
  cudaEventDestroy(fork_);
  cudaEventDestroy(join_);
}

double CudaBackend::copy_bandwidth() {
  if (copy_bw_ > 0) return copy_bw_;
  const size_t bytes = size_t(1) << 30;
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess) return 0;
  if (cudaMalloc(&b, bytes) != cudaSuccess) {
    cudaFree(a);
    return 0;
  }
  cudaEvent_t e0, e1;
  LILY_CU(cudaEventCreate(&e0));
  LILY_CU(cudaEventCreate(&e1));
  std::vector<double> bw;
  for (int i = 0; i < 6; ++i) {
    LILY_CU(cudaEventRecord(e0, stream_));
    LILY_CU(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream_));
    LILY_CU(cudaEventRecord(e1, stream_));
    LILY_CU(cudaEventSynchronize(e1));
    float ms = 0;
    LILY_CU(cudaEventElapsedTime(&ms, e0, e1));
    if (i > 0) bw.push_back(2.0 * double(bytes) / (double(ms) * 1e-3));  // first copy: warm-up
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  std::sort(bw.begin(), bw.end());
  copy_bw_ = bw[bw.size() / 2];
  return copy_bw_;
}

bool same_format(const Linear& a, const Linear& b) {
  if (a.in != b.in || a.format != b.format) return false;
  if (a.format == WeightFormat::Exl3)
    return a.exl3->K == b.exl3->K && a.exl3->codebook == b.exl3->codebook && a.exl3->in_p == b.exl3->in_p;
  if (a.format != WeightFormat::Affine) return true;
  return a.affine->bits == b.affine->bits && a.affine->group_size == b.affine->group_size;
}

Mat CudaBackend::upload(const std::vector<const Linear*>& parts) {
  const Linear& f = *parts.at(0);
  size_t rows = 0;
  for (const Linear* p : parts) {
    if (!same_format(*p, f)) throw InternalError("CudaBackend::upload: parts differ in format");
    rows += size_t(p->out);
  }
  const size_t in = size_t(f.in);
  Mat m;
  if (f.format == WeightFormat::Dense) {
    auto* dst = static_cast<uint16_t*>(alloc_w(rows * in * 2));
    m = Mat::bf16(dst, int64_t(in));
    size_t r0 = 0;
    for (const Linear* p : parts) {
      const DenseWeight& d = p->dense;
      const size_t out = size_t(p->out);
      if (d.dtype == DType::BF16) {
        LILY_CU(cudaMemcpy2D(dst + r0 * in, in * 2, d.data, size_t(d.row_stride) * 2, in * 2, out, cudaMemcpyHostToDevice));
      } else {
        std::vector<uint16_t> tmp(out * in);
        for (size_t r = 0; r < out; ++r)
          for (size_t i = 0; i < in; ++i) {
            float v;
            if (d.dtype == DType::F32) v = static_cast<const float*>(d.data)[r * size_t(d.row_stride) + i];
            else if (d.dtype == DType::F16) v = f16_to_f32(static_cast<const uint16_t*>(d.data)[r * size_t(d.row_stride) + i]);
            else fail("CUDA backend: weight '{}' has dtype {}, expected a float type", p->name, dtype_name(d.dtype));
            tmp[r * in + i] = f32_to_bf16(v);
          }
        LILY_CU(cudaMemcpy(dst + r0 * in, tmp.data(), tmp.size() * 2, cudaMemcpyHostToDevice));
      }
      r0 += out;
    }
    return m;
  }
  if (f.format == WeightFormat::Exl3) return upload_exl3(parts, int(parts.size()));
  if (f.format != WeightFormat::Affine)
    fail("CUDA backend: weight '{}' is in format {}, which the CUDA backend does not run yet (bf16/f16/f32, affine 4/8 bit)",
         f.name, format_name(f.format));
  const quant::AffineWeight& a0 = *f.affine;
  if (a0.bits != 4 && a0.bits != 8)
    fail("CUDA backend: weight '{}' is affine {}-bit; the CUDA backend runs 4 and 8 bit", f.name, a0.bits);
  if (a0.group_size % 32 != 0 || f.in % 32 != 0)
    fail("CUDA backend: weight '{}': affine group size {} and input size {} must be multiples of 32", f.name, a0.group_size, f.in);
  const size_t words = size_t(a0.row_words), groups = size_t(a0.groups());
  auto* q = static_cast<uint32_t*>(alloc_w(rows * words * 4));
  auto* sc = static_cast<uint16_t*>(alloc_w(rows * groups * 2));
  auto* bi = static_cast<uint16_t*>(alloc_w(rows * groups * 2));
  size_t r0 = 0;
  for (const Linear* p : parts) {
    const quant::AffineWeight& a = *p->affine;
    if (a.scale_dtype != DType::BF16)
      fail("CUDA backend: weight '{}' has {} affine scales; the CUDA backend reads bf16 scales", p->name, dtype_name(a.scale_dtype));
    const size_t out = size_t(p->out);
    LILY_CU(cudaMemcpy(q + r0 * words, a.packed, out * words * 4, cudaMemcpyHostToDevice));
    LILY_CU(cudaMemcpy(sc + r0 * groups, a.scales, out * groups * 2, cudaMemcpyHostToDevice));
    LILY_CU(cudaMemcpy(bi + r0 * groups, a.biases, out * groups * 2, cudaMemcpyHostToDevice));
    r0 += out;
  }
  m.affine = true;
  m.q = q; m.s = sc; m.b = bi;
  m.bits = a0.bits; m.gs = a0.group_size; m.row_words = int64_t(words);
  return m;
}

Mat CudaBackend::upload_exl3(const std::vector<const Linear*>& parts, int per_expert) {
  const Linear& f = *parts.at(0);
  if (per_expert <= 0 || parts.size() % size_t(per_expert) != 0)
    throw InternalError("CudaBackend::upload_exl3: parts do not divide into experts");
  auto al = [](size_t b) { return (b + 255) & ~size_t(255); };  // 256-byte aligned pieces (16-byte loads)
  size_t total = 0;
  for (const Linear* p : parts) {
    if (p->format != WeightFormat::Exl3 || !p->exl3) throw InternalError("CudaBackend::upload_exl3: not an EXL3 weight");
    const quant::Exl3Weight& w = *p->exl3;
    if (!same_format(*p, f))
      fail("CUDA backend: EXL3 weight '{}' (K={}, {}, in {}) cannot share a device matrix with '{}' (K={}, {}, in {})",
           p->name, w.K, quant::exl3_codebook_name(w.codebook), w.in_p, f.name, f.exl3->K,
           quant::exl3_codebook_name(f.exl3->codebook), f.exl3->in_p);
    if (w.out != p->out || w.in != p->in) throw InternalError("CudaBackend::upload_exl3: Linear and EXL3 sizes differ");
    total += al(size_t(w.in_p) * size_t(w.out_p) * size_t(w.K) / 8) + al(2 * size_t(w.in_p)) + 2 * al(2 * size_t(w.out_p)) +
             al(4 * size_t(w.out));
  }
  char* dev = static_cast<char*>(alloc_w(total));
  std::vector<Exl3Part> host(parts.size());
  size_t off = 0;
  auto put = [&](const void* src, size_t bytes) {
    char* d = dev + off;
    LILY_CU(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));
    off += al(bytes);
    return d;
  };
  int col_blocks = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    const Linear& l = *parts[i];
    const quant::Exl3Weight& w = *l.exl3;
    const size_t pe = i % size_t(per_expert);
    const Exl3Part& first = host[pe];
    Exl3Part& h = host[i];
    h.in_p = int(w.in_p);
    h.out_p = int(w.out_p);
    h.rows = int(w.out);
    h.row0 = pe == 0 ? 0 : host[i - 1].row0 + host[i - 1].rows;
    if (i >= size_t(per_expert) && (h.out_p != first.out_p || h.rows != first.rows))
      fail("CUDA backend: EXL3 expert weight '{}' has shape [{} (padded {}), {}], unlike the first expert's", l.name, w.out,
           w.out_p, w.in);
    if (i < size_t(per_expert)) col_blocks += h.out_p / 128;
    h.trellis = reinterpret_cast<const uint16_t*>(put(w.trellis, size_t(w.in_p) * size_t(w.out_p) * size_t(w.K) / 8));
    h.suh = reinterpret_cast<const uint16_t*>(put(w.suh, 2 * size_t(w.in_p)));
    h.svh = reinterpret_cast<const uint16_t*>(put(w.svh, 2 * size_t(w.out_p)));
    if (w.bias) h.bias = reinterpret_cast<const uint16_t*>(put(w.bias, 2 * size_t(w.out_p)));
    if (w.out_rows) h.out_rows = reinterpret_cast<const int32_t*>(put(w.out_rows, 4 * size_t(w.out)));
  }
  auto* dparts = static_cast<Exl3Part*>(alloc_w(sizeof(Exl3Part) * host.size()));
  LILY_CU(cudaMemcpy(dparts, host.data(), sizeof(Exl3Part) * host.size(), cudaMemcpyHostToDevice));
  Mat m;
  m.exl3 = true;
  m.parts = dparts;
  m.nparts = per_expert;
  m.K = f.exl3->K;
  m.cb = int(f.exl3->codebook);
  m.col_blocks = col_blocks;
  m.in_p = int(f.exl3->in_p);
  return m;
}

std::vector<std::pair<Mat, int>> CudaBackend::upload_runs(const std::vector<const Linear*>& parts) {
  std::vector<std::pair<Mat, int>> runs;
  for (size_t i = 0; i < parts.size();) {
    size_t j = i + 1;
    int rows = int(parts[i]->out);
    while (j < parts.size() && same_format(*parts[j], *parts[i])) rows += int(parts[j++]->out);
    runs.push_back({upload(std::vector<const Linear*>(parts.begin() + long(i), parts.begin() + long(j))), rows});
    i = j;
  }
  return runs;
}

void CudaBackend::ensure_scratch(int T) {
  if (T <= cap_T_) return;
  const int newT = std::max(T, 1);
  const ModelConfig& c = w_->cfg;
  const int H = int(c.hidden);
  size_t work = 0;
  for (const DevLayer& D : layers_) {
    if (D.kind == LayerKind::LinearAttention) work = std::max(work, gdn_scratch_bytes(D.gdn, newT));
    else work = std::max(work, attn_scratch_bytes(D.attn, newT, attn_splits(D.attn, newT, int64_t(1) << 40)));
    work = std::max(work, moe_scratch_bytes(D.moe, newT));
  }
  auto al = [](size_t b) { return (b + 255) & ~size_t(255); };
  const size_t bx = al(4 * size_t(newT) * H), bp = al(4 * size_t(newT) * max_proj_), bc = al(4 * size_t(newT) * max_core_);
  const size_t bt = al(4 * size_t(newT));
  const size_t total = 2 * bx + bp + bc + bt + al(work);
  cudaStreamSynchronize(stream_);
  mem_.free(work_, scratch_bytes_);
  char* base = static_cast<char*>(mem_.alloc(total));
  work_ = base;
  scratch_bytes_ = total;
  x_ = reinterpret_cast<float*>(base); base += bx;
  u_ = reinterpret_cast<float*>(base); base += bx;
  proj_ = reinterpret_cast<float*>(base); base += bp;
  core_ = reinterpret_cast<float*>(base); base += bc;
  d_tokens_ = reinterpret_cast<int32_t*>(base); base += bt;
  cap_T_ = newT;
  work_bytes_ = work;
  ++scratch_gen_;
  ensure_logits(1);
}

// Logits rows [rows, V]: grown outside captures only (captured steps have one row).
void CudaBackend::ensure_logits(int64_t rows) {
  if (rows <= logits_rows_) return;
  cudaStreamSynchronize(stream_);
  const size_t V = size_t(w_->cfg.vocab);
  mem_.free(logits_, size_t(logits_rows_) * V * 4);
  logits_ = static_cast<float*>(mem_.alloc(size_t(rows) * V * 4));
  logits_rows_ = rows;
  ++scratch_gen_;
}

std::unique_ptr<SequenceState> CudaBackend::new_state(int64_t max_tokens) {
  if (max_tokens <= 0) fail("context size must be positive, got {}", max_tokens);
  return std::make_unique<CudaState>(*this, max_tokens);
}

void CudaBackend::mark(int layer, const char* blk) {
  if (opt_.profile && !capture_ && !replay_) {  // close the previous block's interval, open this one
    LILY_CU(cudaStreamSynchronize(stream_));
    const auto now = std::chrono::steady_clock::now();
    if (!prof_block_.empty()) prof_[prof_block_] += std::chrono::duration<double, std::milli>(now - prof_t0_).count();
    prof_block_ = std::string(blk) == "step" ? "" : blk;
    prof_t0_ = now;
    if (std::string(blk) == "step") ++prof_steps_;
  }
  if (!recording_) return;
  cudaStreamCaptureStatus status;
  cudaGraph_t g = nullptr;
  LILY_CU(cudaStreamGetCaptureInfo(stream_, &status, nullptr, &g, nullptr, nullptr, nullptr));
  size_t n = 0;
  if (g) LILY_CU(cudaGraphGetNodes(g, nullptr, &n));
  marks_.push_back({n, {layer, blk}});
}

void CudaBackend::begin(SequenceState& st, int64_t T) {
  auto* cs = dynamic_cast<CudaState*>(&st);
  if (!cs || &cs->be_ != this) throw InternalError("CudaBackend::begin: state from another backend");
  LILY_ASSERT(T > 0 && cs->n_ + T <= cs->cap_);
  st_ = cs;
  T_ = int(T);
  ensure_scratch(T_);
  if (cs->graph_gen != scratch_gen_) { cs->drop_graphs(); cs->graph_gen = scratch_gen_; }
  host_logits_ = nullptr;
  host_rows_ = 0;
  capture_ = replay_ = false;
  const int bucket = bucket_for(cs->n_ + T);
  const int64_t ctx_max = T == 1 ? (int64_t(256) << bucket) : cs->n_ + T;
  // split factor for this step: a function of the bucket for graphed steps
  nsplit_ = 1;
  for (const DevLayer& D : layers_)
    if (D.kind == LayerKind::FullAttention) { nsplit_ = attn_splits(D.attn, T_, ctx_max); break; }
  if ((opt_.graphs && !opt_.profile && T == 1) || recording_) {
    bucket_key_ = bucket + (greedy_ ? (sampler_ ? 2000 : 1000) : 0);
    auto it = cs->graphs.find(bucket_key_);
    if (it != cs->graphs.end() && !recording_) replay_ = true;
    else capture_ = true;
  }
}

void CudaBackend::embed(const int32_t* tokens) {
  const int H = int(w_->cfg.hidden);
  if (!greedy_) LILY_CU(cudaMemcpyAsync(d_tokens_, tokens, sizeof(int32_t) * size_t(T_), cudaMemcpyHostToDevice, stream_));
  if (capture_) {
    LILY_CU(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  }
  if (replay_) return;
  mark(-1, "embed");
  cuda::embed(embed_, H, d_tokens_, T_, x_, stream_);
}

void CudaBackend::gdn_mixer(int layer) {
  if (replay_) return;
  mark(layer, "gdn");
  const DevLayer& D = layers_[size_t(layer)];
  const int H = int(w_->cfg.hidden);
  const GdnDev& g = D.gdn;
  const int PW = g.proj_width();
  const float eps = float(w_->cfg.rms_eps);
  const bool fuse = T_ <= kGemvMaxRows;  // the GEMVs normalise x themselves
  if (!fuse) rmsnorm(x_, H, D.in_norm, T_, H, eps, u_, H, stream_);
  static const bool ba_fold = [] {
    const char* v = std::getenv("LILY_BA_FOLD");
    return !(v && std::string(v) == "0");
  }();
  int c0 = 0;
  GdnBa ba;
  const GdnBa* bap = nullptr;
  for (auto& [m, rows] : D.gdn_in) {
    if (ba_fold && c0 == g.C() + g.Hv * g.dv && rows == 2 * g.Hv) {
      // b|a in a format of its own: gdn_core runs it, inside the recurrent step for one token
      ba.W = &m; ba.in = H; ba.x = fuse ? x_ : u_; ba.ldx = H; ba.norm_w = fuse ? D.in_norm : nullptr; ba.eps = eps;
      bap = &ba;
    } else {
      linear(m, rows, H, fuse ? x_ : u_, H, T_, proj_ + c0, PW, false, stream_, fuse ? D.in_norm : nullptr, eps);
    }
    c0 += rows;
  }
  gdn_core(g, proj_, T_, st_->conv[size_t(layer)], st_->S[size_t(layer)], core_, work_ ? static_cast<char*>(work_) + (scratch_bytes_ - work_bytes_) : nullptr,
           stream_, opt_.chunk_min, bap);
  linear(D.gdn_out, H, g.Hv * g.dv, core_, g.Hv * g.dv, T_, x_, H, true, stream_);
}

void CudaBackend::attn_mixer(int layer) {
  if (replay_) return;
  mark(layer, "attn");
  const DevLayer& D = layers_[size_t(layer)];
  const int H = int(w_->cfg.hidden);
  const AttnDev& a = D.attn;
  const int PW = a.proj_width();
  const float eps = float(w_->cfg.rms_eps);
  const bool fuse = T_ <= kGemvMaxRows;
  if (!fuse) rmsnorm(x_, H, D.in_norm, T_, H, eps, u_, H, stream_);
  int c0 = 0;
  for (auto& [m, rows] : D.attn_in) {
    linear(m, rows, H, fuse ? x_ : u_, H, T_, proj_ + c0, PW, false, stream_, fuse ? D.in_norm : nullptr, eps);
    c0 += rows;
  }
  attn_core(a, proj_, T_, st_->d_pos, st_->kc[size_t(layer)], st_->vc[size_t(layer)], st_->cap_, nsplit_, core_,
            static_cast<char*>(work_) + (scratch_bytes_ - work_bytes_), stream_);
  linear(D.attn_o, H, a.Hq * a.hd, core_, a.Hq * a.hd, T_, x_, H, true, stream_);
}

void CudaBackend::ffn(int layer) {
  if (replay_) return;
  mark(layer, "ffn");
  const DevLayer& D = layers_[size_t(layer)];
  const int H = int(w_->cfg.hidden);
  const float eps = float(w_->cfg.rms_eps);
  const bool fuse = T_ <= kGemvMaxRows;
  if (!fuse) rmsnorm(x_, H, D.post_norm, T_, H, eps, u_, H, stream_);
  moe(D.moe, fuse ? nullptr : u_, T_, x_, static_cast<char*>(work_) + (scratch_bytes_ - work_bytes_), stream_, side_, fork_,
      join_, D.post_norm, eps);
}

void CudaBackend::head(int64_t rows, float* logits) {
  LILY_ASSERT(rows >= 0 && rows <= T_);
  host_logits_ = logits;
  host_rows_ = rows;
  if (replay_ || rows == 0) return;
  if (!capture_) ensure_logits(rows);
  mark(-1, "head");
  const int H = int(w_->cfg.hidden), V = int(w_->cfg.vocab);
  const float* xr = x_ + size_t(T_ - rows) * H;
  const float eps = float(w_->cfg.rms_eps);
  if (rows <= kGemvMaxRows) {
    linear(lm_head_, V, H, xr, H, int(rows), logits_, V, false, stream_, final_norm_, eps);
  } else {
    rmsnorm(xr, H, final_norm_, int(rows), H, eps, u_, H, stream_);
    linear(lm_head_, V, H, u_, H, int(rows), logits_, V, false, stream_);
  }
  if (greedy_) {  // the next step's input slot
    if (sampler_) sample(samp_, logits_ + size_t(rows - 1) * V, d_tokens_, stream_);
    else argmax(logits_ + size_t(rows - 1) * V, 1, V, d_tokens_, amax_, stream_);
  }
}

void CudaBackend::end() {
  if (!replay_) {
    mark(-1, "step");
    advance_pos(st_->d_pos, T_, stream_);
  }
  if (capture_) {
    cudaGraph_t g = nullptr;
    LILY_CU(cudaStreamEndCapture(stream_, &g));
    if (recording_) {
      size_t n = 0;
      LILY_CU(cudaGraphGetNodes(g, nullptr, &n));
      std::vector<cudaGraphNode_t> nodes(n);
      LILY_CU(cudaGraphGetNodes(g, nodes.data(), &n));
      // Nodes come back in creation order for a linear stream capture.
      std::vector<KernelLaunch>* out = reinterpret_cast<std::vector<KernelLaunch>*>(host_logits_);
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
        } else {
          k.name = fmt::format("node type {}", int(ty));
        }
        out->push_back(k);
      }
      st_->graphs.erase(-1);
      LILY_CU(cudaGraphDestroy(g));
      return;  // nothing ran
    }
    cudaGraphExec_t ex = nullptr;
    LILY_CU(cudaGraphInstantiate(&ex, g, 0));
    LILY_CU(cudaGraphDestroy(g));
    st_->graphs[bucket_key_] = ex;
    replay_ = true;
  }
  if (replay_) LILY_CU(cudaGraphLaunch(st_->graphs[bucket_key_], stream_));
  st_->n_ += T_;
  if (host_rows_ > 0 && host_logits_) {
    const int64_t V = w_->cfg.vocab;
    LILY_CU(cudaMemcpyAsync(host_logits_, logits_, sizeof(float) * size_t(host_rows_ * V), cudaMemcpyDeviceToHost, stream_));
    LILY_CU(cudaStreamSynchronize(stream_));
  }
  st_ = nullptr;
}

std::vector<KernelLaunch> CudaBackend::describe(int64_t ctx) {
  auto st = new_state(ctx + 1);
  auto* cs = static_cast<CudaState*>(st.get());
  cs->n_ = ctx;  // only the launch shapes matter: nothing runs
  std::vector<KernelLaunch> out;
  recording_ = true;
  marks_.clear();
  try {
    begin(*st, 1);
    int32_t tok = 0;
    embed(&tok);
    const ModelConfig& c = w_->cfg;
    for (int l = 0; l < int(c.layers); ++l) {
      if (c.layer_kinds[size_t(l)] == LayerKind::LinearAttention) gdn_mixer(l);
      else attn_mixer(l);
      ffn(l);
    }
    head(1, nullptr);
    host_logits_ = reinterpret_cast<float*>(&out);
    host_rows_ = 0;
    end();
  } catch (...) {
    recording_ = false;
    cudaGraph_t g;
    cudaStreamEndCapture(stream_, &g);
    throw;
  }
  recording_ = false;
  st_ = nullptr;
  return out;
}

// ---------------------------------------------------------------------------------------------
CudaState::CudaState(CudaBackend& be, int64_t cap) : be_(be), cap_(cap) {
  const ModelConfig& c = be.w_->cfg;
  const size_t L = size_t(c.layers);
  kc.assign(L, nullptr); vc.assign(L, nullptr); conv.assign(L, nullptr); S.assign(L, nullptr);
  auto al = [](size_t b) { return (b + 255) & ~size_t(255); };
  size_t total = al(8);
  for (size_t l = 0; l < L; ++l) {
    if (c.layer_kinds[l] == LayerKind::FullAttention) {
      const size_t per = size_t(c.n_kv_heads) * size_t(c.head_dim) * 2;
      total += 2 * al(per * size_t(cap));
      kv_bytes_per_token_ += 2 * per;
    } else {
      const size_t cb = 4 * size_t(c.conv_kernel - 1) * size_t(c.conv_channels());
      const size_t sb = 4 * size_t(c.lin_v_heads) * size_t(c.lin_v_dim) * size_t(c.lin_k_dim);
      total += al(cb) + al(sb);
      fixed_bytes_ += cb + sb;
    }
  }
  region_bytes = total;
  char* p = static_cast<char*>(be.mem_.alloc(total));
  region = p;
  d_pos = reinterpret_cast<int64_t*>(p); p += al(8);
  for (size_t l = 0; l < L; ++l) {
    if (c.layer_kinds[l] == LayerKind::FullAttention) {
      const size_t per = size_t(c.n_kv_heads) * size_t(c.head_dim) * 2;
      kc[l] = reinterpret_cast<uint16_t*>(p); p += al(per * size_t(cap));
      vc[l] = reinterpret_cast<uint16_t*>(p); p += al(per * size_t(cap));
    } else {
      const size_t cb = 4 * size_t(c.conv_kernel - 1) * size_t(c.conv_channels());
      const size_t sb = 4 * size_t(c.lin_v_heads) * size_t(c.lin_v_dim) * size_t(c.lin_k_dim);
      conv[l] = reinterpret_cast<float*>(p); p += al(cb);
      S[l] = reinterpret_cast<float*>(p); p += al(sb);
    }
  }
  reset();
}

CudaState::~CudaState() {
  cudaStreamSynchronize(be_.stream_);
  drop_graphs();
  be_.mem_.free(region, region_bytes);
}

void CudaState::drop_graphs() {
  for (auto& [k, g] : graphs)
    if (g) cudaGraphExecDestroy(g);
  graphs.clear();
}

void CudaState::reset() {
  LILY_CU(cudaMemsetAsync(region, 0, region_bytes, be_.stream_));  // KV rows beyond n are never read
  LILY_CU(cudaStreamSynchronize(be_.stream_));
  n_ = 0;
}

static void copy_state(const CudaState& src, CudaState& dst, cudaStream_t s) {
  const ModelConfig& c = src.be_.w_->cfg;
  LILY_CU(cudaMemcpyAsync(dst.d_pos, src.d_pos, 8, cudaMemcpyDeviceToDevice, s));
  for (size_t l = 0; l < size_t(c.layers); ++l) {
    if (c.layer_kinds[l] == LayerKind::FullAttention) {
      const size_t row = size_t(c.head_dim) * 2;
      const size_t w = row * size_t(src.n_);
      if (w == 0) continue;
      LILY_CU(cudaMemcpy2DAsync(dst.kc[l], row * size_t(dst.cap_), src.kc[l], row * size_t(src.cap_), w, size_t(c.n_kv_heads),
                                cudaMemcpyDeviceToDevice, s));
      LILY_CU(cudaMemcpy2DAsync(dst.vc[l], row * size_t(dst.cap_), src.vc[l], row * size_t(src.cap_), w, size_t(c.n_kv_heads),
                                cudaMemcpyDeviceToDevice, s));
    } else {
      const size_t cb = 4 * size_t(c.conv_kernel - 1) * size_t(c.conv_channels());
      const size_t sb = 4 * size_t(c.lin_v_heads) * size_t(c.lin_v_dim) * size_t(c.lin_k_dim);
      LILY_CU(cudaMemcpyAsync(dst.conv[l], src.conv[l], cb, cudaMemcpyDeviceToDevice, s));
      LILY_CU(cudaMemcpyAsync(dst.S[l], src.S[l], sb, cudaMemcpyDeviceToDevice, s));
    }
  }
  dst.n_ = src.n_;
}

std::unique_ptr<SequenceState> CudaState::clone() const {
  auto c = std::make_unique<CudaState>(be_, cap_);
  copy_state(*this, *c, be_.stream_);
  LILY_CU(cudaStreamSynchronize(be_.stream_));
  return c;
}

void CudaState::restore(const SequenceState& snapshot) {
  auto* s = dynamic_cast<const CudaState*>(&snapshot);
  if (!s || &s->be_ != &be_) throw InternalError("CudaState::restore: snapshot from another backend");
  if (s->n_ > cap_) fail("cannot restore a snapshot of {} tokens into a context of {}", s->n_, cap_);
  copy_state(*s, *this, be_.stream_);
  LILY_CU(cudaStreamSynchronize(be_.stream_));
}

// ---------------------------------------------------------------------------------------------
// Decoding with the sampler on the device.
void CudaBackend::ensure_sampler() {
  if (samp_mem_) return;
  const int V = int(w_->cfg.vocab);
  if (V > kSampleMaxVocab) fail("CUDA sampling: a vocabulary of {} ids exceeds the sampler's {}", V, kSampleMaxVocab);
  samp_bytes_ = sample_bytes(V);
  samp_mem_ = mem_.alloc(samp_bytes_);
  samp_ = sample_layout(samp_mem_, V);
}

void CudaBackend::fed_step(SequenceState& st) {
  const ModelConfig& c = w_->cfg;
  begin(st, 1);
  embed(nullptr);
  for (int l = 0; l < int(c.layers); ++l) {
    if (c.layer_kinds[size_t(l)] == LayerKind::LinearAttention) gdn_mixer(l);
    else attn_mixer(l);
    ffn(l);
  }
  head(1, nullptr);
  end();
}

// Pipeline: step s_i absorbs t_i and draws t_{i+1} into d_tokens_[0] (graph replay, no host round trip);
// it is enqueued as soon as t_i is known to be emitted (t_0..t_{i-1} passed the host's checks), i.e.
// before the host has seen t_i, so the device runs s_i while the host checks t_i. A stop at t_i therefore
// leaves the state exactly after t_i; the draw of t_{i+1} is discarded.
DeviceDecodeResult CudaBackend::decode_on_device(SequenceState& st, const DeviceDecode& req,
                                                 const std::function<bool(int32_t)>& on_token, float* last_logits) {
  auto* cs = dynamic_cast<CudaState*>(&st);
  if (!cs || &cs->be_ != this) throw InternalError("CudaBackend::decode_on_device: state from another backend");
  if (!req.first_logits) throw InternalError("CudaBackend::decode_on_device: no logits to draw the first token from");
  DeviceDecodeResult res;
  if (req.max_tokens <= 0) return res;
  const int V = int(w_->cfg.vocab);
  ensure_scratch(1);
  ensure_sampler();
  const DeviceSampling& q = req.sampling;
  SampleParams p;
  p.temperature = q.temperature;
  p.top_k = q.top_k;
  p.top_p = q.top_p;
  p.min_p = q.min_p;
  p.repetition_penalty = q.repetition_penalty;
  p.presence_penalty = q.presence_penalty;
  p.frequency_penalty = q.frequency_penalty;
  p.seed = q.seed;
  if (req.vocab_limit < 0 || req.vocab_limit > V)
    throw InternalError(fmt::format("CudaBackend::decode_on_device: vocab_limit {} outside 0..{}", req.vocab_limit, V));
  p.vocab_limit = req.vocab_limit == V ? 0 : req.vocab_limit;
  std::vector<int32_t> counts(size_t(V), 0);
  for (int32_t t : req.history)
    if (t >= 0 && t < V) ++counts[size_t(t)];
  sample_setup(samp_, p, counts.data(), 0, stream_);
  // greedy without penalties: the plain argmax graph (the same token, fewer kernels)
  const bool argmax_only = q.temperature == 0.0f && q.repetition_penalty == 1.0f && q.presence_penalty == 0.0f &&
                           q.frequency_penalty == 0.0f && p.vocab_limit == 0;

  // ids come back through a pinned ring: slot i % 4 holds t_i, at most two are in flight
  struct Ring {
    cudaStream_t s;
    int32_t* ids = nullptr;
    cudaEvent_t ev[4] = {};
    ~Ring() {
      cudaStreamSynchronize(s);
      for (auto& e : ev)
        if (e) cudaEventDestroy(e);
      if (ids) cudaFreeHost(ids);
    }
  } ring{stream_};
  LILY_CU(cudaMallocHost(&ring.ids, 4 * sizeof(int32_t)));
  for (auto& e : ring.ev) LILY_CU(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  struct Mode {
    CudaBackend* b;
    ~Mode() { b->greedy_ = b->sampler_ = false; }
  } mode{this};

  // t_0: drawn by the same kernels from the host's row
  LILY_CU(cudaMemcpyAsync(logits_, req.first_logits, sizeof(float) * size_t(V), cudaMemcpyHostToDevice, stream_));
  sample(samp_, logits_, d_tokens_, stream_);
  LILY_CU(cudaMemcpyAsync(ring.ids, d_tokens_, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  LILY_CU(cudaEventRecord(ring.ev[0], stream_));

  greedy_ = true;
  sampler_ = !argmax_only;
  for (int64_t i = 0;; ++i) {
    const bool fits = cs->n_ + 1 <= cs->cap_;
    if (fits) {  // s_i: absorb t_i, draw t_{i+1}
      fed_step(st);
      LILY_CU(cudaMemcpyAsync(ring.ids + (i + 1) % 4, d_tokens_, sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
      LILY_CU(cudaEventRecord(ring.ev[(i + 1) % 4], stream_));
      ++res.absorbed;
    }
    LILY_CU(cudaEventSynchronize(ring.ev[i % 4]));
    const int32_t tok = ring.ids[i % 4];
    res.tokens.push_back(tok);
    // the host loop's checks, in its order (runtime/generate.cpp)
    const bool is_stop = std::find(req.stop_ids.begin(), req.stop_ids.end(), tok) != req.stop_ids.end();
    if (on_token && !on_token(tok)) { res.stopped = true; break; }
    if (is_stop) { res.stopped = true; break; }
    if (i + 1 == req.max_tokens) break;
    if (!fits) break;  // context full: t_i could not be absorbed
  }
  if (res.absorbed > 0 && last_logits)
    LILY_CU(cudaMemcpyAsync(last_logits, logits_, sizeof(float) * size_t(V), cudaMemcpyDeviceToHost, stream_));
  LILY_CU(cudaStreamSynchronize(stream_));
  return res;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
bool cuda_available() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

std::string cuda_device_info(int device) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return fmt::format("no usable CUDA device ({})", cudaGetErrorString(e));
  if (device < 0 || device >= n) return fmt::format("no CUDA device {} ({} present)", device, n);
  cudaDeviceProp p{};
  if (cudaGetDeviceProperties(&p, device) != cudaSuccess) return "CUDA device properties unavailable";
  return fmt::format("{} (sm_{}{}, {} SMs, {:.0f} GiB)", p.name, p.major, p.minor, p.multiProcessorCount,
                     double(p.totalGlobalMem) / (1024.0 * 1024 * 1024));
}

std::unique_ptr<Backend> make_cuda_backend(std::shared_ptr<const ModelWeights> weights, const CudaOptions& opt) {
  if (!cuda_available()) fail("CUDA backend: {}", cuda_device_info(opt.device));
  return std::make_unique<CudaBackend>(std::move(weights), opt);
}

int64_t cuda_generate_greedy(Backend& be, SequenceState& st, int32_t first, int64_t n,
                             const std::function<bool(int32_t)>& on_token) {
  auto* cb = dynamic_cast<CudaBackend*>(&be);
  if (!cb) fail("cuda_generate_greedy needs the CUDA backend, got '{}'", be.name());
  if (n <= 0) return 0;
  if (st.n_tokens() + n > st.capacity())
    fail("context overflow: {} tokens in the cache + {} new exceed the context size {}", st.n_tokens(), n, st.capacity());
  cb->ensure_scratch(1);
  LILY_CU(cudaMemcpyAsync(cb->d_tokens_, &first, 4, cudaMemcpyHostToDevice, cb->stream_));
  int32_t* pinned = nullptr;
  LILY_CU(cudaMallocHost(&pinned, size_t(n) * 4));
  std::vector<cudaEvent_t> ev(static_cast<size_t>(n), nullptr);
  for (auto& e : ev) LILY_CU(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  const ModelConfig& c = cb->w_->cfg;
  int64_t produced = 0;
  bool stop = false;
  auto drain = [&](int64_t upto, bool wait) {
    while (produced < upto && !stop) {
      if (!wait && cudaEventQuery(ev[size_t(produced)]) != cudaSuccess) break;
      LILY_CU(cudaEventSynchronize(ev[size_t(produced)]));
      if (!on_token(pinned[produced])) stop = true;
      ++produced;
    }
  };
  try {
    for (int64_t i = 0; i < n && !stop; ++i) {
      cb->set_greedy(true);
      cb->begin(st, 1);
      cb->embed(nullptr);
      for (int l = 0; l < int(c.layers); ++l) {
        if (c.layer_kinds[size_t(l)] == LayerKind::LinearAttention) cb->gdn_mixer(l);
        else cb->attn_mixer(l);
        cb->ffn(l);
      }
      cb->head(1, nullptr);
      cb->end();
      LILY_CU(cudaMemcpyAsync(pinned + i, cb->d_tokens_, 4, cudaMemcpyDeviceToHost, cb->stream_));
      LILY_CU(cudaEventRecord(ev[size_t(i)], cb->stream_));
      drain(i, false);  // everything up to the previous step that is already there
    }
    drain(n, true);
  } catch (...) {
    cb->set_greedy(false);
    throw;
  }
  cb->set_greedy(false);
  cb->synchronize();
  for (auto& e : ev) cudaEventDestroy(e);
  cudaFreeHost(pinned);
  return produced;
}

CudaBlockProfile cuda_block_profile(Backend& be) {
  auto* cb = dynamic_cast<CudaBackend*>(&be);
  if (!cb) fail("cuda_block_profile needs the CUDA backend, got '{}'", be.name());
  CudaBlockProfile p;
  for (auto& [k, v] : cb->prof_) p.ms.push_back({k, v});
  p.steps = cb->prof_steps_;
  return p;
}

std::vector<KernelLaunch> cuda_describe_decode_step(Backend& be, int64_t ctx) {
  auto* cb = dynamic_cast<CudaBackend*>(&be);
  if (!cb) fail("cuda_describe_decode_step needs the CUDA backend, got '{}'", be.name());
  return cb->describe(ctx);
}

}  // namespace lily
