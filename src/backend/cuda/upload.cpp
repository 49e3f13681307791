// CudaBackend: construction and weight upload (bf16 / affine / EXL3 matrices, fp32 vectors), and the model
// shapes the kernels cover.
#include <fmt/format.h>

#include <algorithm>
#include <tuple>

#include "backend/cuda/cuda_impl.h"
#include "backend/cuda/mk_state.h"
#include "backend/cuda/shard_synth.h"
#include "core/error.h"
#include "core/half.h"
#include "quant/affine/affine.h"
#include "quant/exl3/exl3.h"

namespace lily::cuda {

void check_cuda_shape(const ModelConfig& c) {
  auto bad = [](const char* field, int64_t v, const char* want) {
    fail("CUDA backend: {} = {} is not supported (the CUDA kernels take {})", field, v, want);
  };
  const bool attn = c.n_full_layers() > 0, gdn = c.n_linear_layers() > 0;
  if (attn) {
    if (c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256) bad("head_dim", c.head_dim, "64, 128 or 256");
    if (c.n_kv_heads <= 0 || c.n_heads % c.n_kv_heads != 0)
      bad("num_key_value_heads", c.n_kv_heads, "a divisor of num_attention_heads");
    if (c.rotary_dim % 2 != 0 || c.rotary_dim > c.head_dim) bad("partial_rotary_factor (rotary dim)", c.rotary_dim, "an even size <= head_dim");
  }
  if (gdn) {
    if (c.lin_k_dim != 32 && c.lin_k_dim != 64 && c.lin_k_dim != 128 && c.lin_k_dim != 256)
      bad("linear_key_head_dim", c.lin_k_dim, "32, 64, 128 or 256");
    if (c.conv_kernel < 1 || c.conv_kernel > 8) bad("linear_conv_kernel_dim", c.conv_kernel, "1..8");
    if (c.lin_k_heads <= 0 || c.lin_v_heads % c.lin_k_heads != 0)
      bad("linear_num_value_heads", c.lin_v_heads, "a multiple of linear_num_key_heads");
    if (c.lin_v_dim < 1) bad("linear_value_head_dim", c.lin_v_dim, "a positive size");
  }
  if (c.n_experts > 0) {
    if (c.n_experts > 512) bad("num_experts", c.n_experts, "at most 512");
    if (c.top_k < 1 || c.top_k > 31 || c.top_k > c.n_experts) bad("num_experts_per_tok", c.top_k, "1..31 and <= num_experts");
  }
}

CudaBackend::CudaBackend(std::shared_ptr<const ModelWeights> w, const CudaOptions& opt) : w_(std::move(w)), opt_(opt) {
  check_cuda_shape(w_->cfg);
  if (opt_.chunk_min < 1) fail("CUDA backend: chunk_min must be >= 1 (got {})", opt_.chunk_min);
  set_kernel_switches(opt_.kernels);
  dev_ = std::make_shared<Device>(opt_.device);
  stream_ = dev_->stream;
  LILY_CU(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  small_ = dev_->alloc(small_bytes());
  LILY_CU(cudaMemset(small_, 0, small_bytes()));
  LILY_CU(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
  LILY_CU(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming));
  init_kernels();
  upload_weights();
  if (exl3_scratch_) {  // released by the destructor, which runs only after the constructor ends
    exl3_split_scratch_acquire(stream_);
    exl3_split_scratch_acquire(side_);
  }
  LILY_CU(cudaDeviceSynchronize());
}

CudaBackend::~CudaBackend() {
  cudaStreamSynchronize(stream_);
  drop_graphs();
  mk_free();
  for (PinnedPool::Block& u : uploads_) pinned_.put(u);
  for (Flight& f : flights_) {
    pinned_.put(f.desc);
    pinned_.put(f.ids);
    pinned_.put(f.staged);
    for (PinnedPool::Block& u : f.uploads) pinned_.put(u);
    if (f.done) cudaEventDestroy(f.done);
  }
  pinned_.put(desc_host_);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (auto& [p, n] : weight_allocs_) dev_->free(p, n);
  dev_->free(scratch_, scratch_bytes_);
  dev_->free(logits_, size_t(logits_rows_) * size_t(w_->cfg.vocab) * 4);
  dev_->free(desc_dev_, desc_cap_);
  dev_->free(slot_tab_, sizeof(DevSlotLayer) * size_t(slot_cap_) * table_rows());
  dev_->free(fed_, sizeof(int32_t) * size_t(slot_cap_));
  dev_->free(samp_slots_, sizeof(SampleSlot) * size_t(slot_cap_));
  dev_->free(samp_mem_, samp_bytes_);
  dev_->free(small_, small_bytes());
  if (exl3_scratch_) {
    exl3_split_scratch_release(stream_);
    exl3_split_scratch_release(side_);
  }
  cudaStreamDestroy(side_);
  cudaEventDestroy(fork_);
  cudaEventDestroy(join_);
}

void CudaBackend::upload_weights() {
  const ModelConfig& c = w_->cfg;
  if (w_->embed.format == WeightFormat::Exl3)
    fail("CUDA backend: embedding '{}' is EXL3; the CUDA backend gathers embedding rows from bf16/f16/f32 or affine tables",
         w_->embed.name);
  embed_ = upload(w_->embed);
  const bool tied = w_->lm_head.format == w_->embed.format &&
                    (w_->lm_head.format == WeightFormat::Dense    ? w_->lm_head.dense.data == w_->embed.dense.data
                     : w_->lm_head.format == WeightFormat::Affine ? w_->lm_head.affine == w_->embed.affine
                                                                  : w_->lm_head.exl3 == w_->embed.exl3);
  lm_head_ = tied ? embed_ : upload(w_->lm_head);
  lm_head_.cls = kProdLmHead;
  final_norm_ = upload_f32(w_->final_norm);
  layers_.resize(size_t(c.layers));
  for (int l = 0; l < int(c.layers); ++l) upload_layer(w_->layers[size_t(l)], layers_[size_t(l)], l);
  if (w_->mtp) upload_mtp();
}

// One decoder layer (l: its index, for messages; cfg.layers: the MTP layer).
void CudaBackend::upload_layer(const LayerWeights& L, DevLayer& D, int l) {
  const ModelConfig& c = w_->cfg;
  const int H = int(c.hidden);
  D.kind = L.kind;
  D.in_norm = upload_f32(L.input_norm);
  D.post_norm = upload_f32(L.post_norm);
  if (L.kind == LayerKind::LinearAttention) {
    GdnDev& g = D.gdn;
    g.Hk = int(c.lin_k_heads); g.Hv = int(c.lin_v_heads); g.dk = int(c.lin_k_dim); g.dv = int(c.lin_v_dim);
    g.K = int(c.conv_kernel); g.eps = float(c.rms_eps);
    const int PW = g.proj_width();
    D.gdn_in = upload_runs({&L.gdn.in_qkv, &L.gdn.in_z, &L.gdn.in_b, &L.gdn.in_a});
    for (auto& [m, rows] : D.gdn_in) m.cls = kProdGdnIn;
    D.gdn_out = upload(L.gdn.out);
    D.gdn_out.cls = kProdGdnOut;
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
    for (auto& [m, rows] : D.attn_in) m.cls = kProdAttnIn;
    D.attn_o = upload(L.attn.o);
    D.attn_o.cls = kProdAttnOut;
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
  if (!F.moe) m.zero_id = zero_id();
  if (F.moe) {
    m.E = int(F.experts.size()); m.k = int(c.top_k); m.norm_topk = c.norm_topk;
    m.topk_counter = opt_.topk_fold ? topk_counter() : nullptr;
    m.I = int(F.experts.at(0).gate.out);
    // the shared-expert gate rides along as router row E when both share a format (one GEMV fewer)
    if (!F.shared_gate.empty() && same_format(F.router, F.shared_gate)) {
      m.router = upload({&F.router, &F.shared_gate});
      m.gate_in_router = true;
    } else {
      m.router = upload(F.router);
    }
    m.router.cls = kProdRouter;  // with the shared-expert gate when it rides along
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
    // ... and only when the options' reduced-operand classes treat the routed and the shared expert products alike
    const uint32_t bc = opt_.kernels.reduced_classes;
    auto same_prec = [bc](uint32_t x, uint32_t y) { return !(bc & x) == !(bc & y); };
    m.shared_in_stack = opt_.shared_in_stack && !F.shared.gate.empty() && F.shared.gate.out == m.I &&
                        F.shared.down.in == m.I && same_format(F.shared.gate, e0.gate) && same_format(F.shared.up, e0.up) &&
                        same_format(F.shared.down, e0.down) && (F.shared_gate.empty() || m.gate_in_router) &&
                        same_prec(kProdExpertsGateUp, kProdShared) && same_prec(kProdExpertsDown, kProdShared);
    if (m.shared_in_stack) {
      gu.push_back(&F.shared.gate);
      gu.push_back(&F.shared.up);
      dn.push_back(&F.shared.down);
    }
    m.gate_up = ex3 ? upload_exl3(gu, 2) : upload(gu);
    m.down = ex3 ? upload_exl3(dn, 1) : upload(dn);
    m.gate_up.cls = kProdExpertsGateUp;
    m.down.cls = kProdExpertsDown;
    // expert strides: one expert = 2I rows of gate_up, H rows of down
    for (auto [mp, rows, in] : {std::tuple{&m.gate_up, int64_t(2) * m.I, int64_t(H)}, std::tuple{&m.down, int64_t(H), int64_t(m.I)}}) {
      mp->estride = rows * mp->ld;
      mp->qstride = rows * mp->row_words;
      mp->sstride = mp->affine ? rows * (in / mp->gs) : 0;
    }
    if (!F.shared_gate.empty()) m.sh_gate = m.gate_in_router ? m.router : upload(F.shared_gate);
    m.sh_gate.cls = kProdRouter;
  }
  if (!F.shared.gate.empty()) m.Is = int(F.shared.gate.out);
  if (!F.shared.gate.empty() && !m.shared_in_stack) {
    m.sh_gate_up = upload({&F.shared.gate, &F.shared.up});
    m.sh_down = upload(F.shared.down);
    m.sh_gate_up.cls = m.sh_down.cls = F.moe ? kProdShared : kProdMlp;
  }
}

void* CudaBackend::alloc_w(size_t bytes) {
  bytes += 256;  // slack: bulk copies may read a 16-byte unit past a row block's end (mk_kernel.cu)
  void* p = dev_->alloc(bytes);
  weight_allocs_.push_back({p, bytes});
  return p;
}

float* CudaBackend::upload_f32(const std::vector<float>& v) {
  if (v.empty()) return nullptr;
  auto* p = static_cast<float*>(alloc_w(v.size() * 4));
  LILY_CU(cudaMemcpy(p, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  return p;
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
      if (!d.data) {  // a shapes-only synth matrix: drawn here (shard_synth.h)
        synth_dense(dst + r0 * in, *p, stream_);
      } else if (d.dtype == DType::BF16) {
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
    if (!a.packed) {  // a shapes-only synth matrix: drawn here (shard_synth.h)
      synth_affine(q + r0 * words, sc + r0 * groups, bi + r0 * groups, *p, stream_);
      r0 += out;
      continue;
    }
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
  exl3_scratch_ = true;
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
    if (src) LILY_CU(cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice));  // none: drawn below
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
    if (!w.trellis) synth_exl3(h, l, stream_);  // a shapes-only synth matrix (shard_synth.h)
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

}  // namespace lily::cuda
