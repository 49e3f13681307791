// CudaBackend: decode steps as one persistent kernel (mk.h). The model's own forward() walks the blocks; in
// a step the kernel covers, each block appends its ops to a plan instead of launching kernels, and head()
// launches the one kernel (captured into the step's graph like any launch). A plan is a function of the
// step's key (context bucket, output kind): it is built and uploaded by the first step of its key, which
// runs uncaptured; the steps after it capture and replay.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "backend/cuda/cuda_impl.h"
#include "backend/cuda/mk_state.h"
#include "core/error.h"

namespace lily::cuda {
namespace {

constexpr int kGdnTileRows = 32;  // DeltaNet state rows per tile (its stage: 32 · dk floats)
constexpr int kAttnKeys = 32;     // keys per attention stage (32 KB at head dim 256)
constexpr int kMaxSplits = 64;    // attention splits per KV head
constexpr int kMaxStaged = mk::kMaxStagedInputs;

mk::WMat wmat(const Mat& m, int in) {
  mk::WMat w;
  if (m.affine) {
    w.bits = m.bits;
    w.gs = m.gs;
    w.ng = in / m.gs;
    w.w = reinterpret_cast<const uint8_t*>(m.q);
    w.s = m.s;
    w.b = m.b;
    w.row_b = m.row_words * 4;
    w.e_b = m.qstride * 4;
    w.e_s = m.sstride;
  } else {
    w.w = reinterpret_cast<const uint8_t*>(m.w);
    w.row_b = m.ld * 2;
    w.e_b = m.estride * 2;
  }
  return w;
}

// Why the kernel cannot stream W [.., in] ("" when it can): rows (and each expert's scale block) 16-byte
// aligned for the bulk copies, inputs in whole 16-byte columns (of one part) within the staged size.
std::string mat_problem(const Mat& m, int in, const char* what) {
  if (m.exl3) return fmt::format("{} is EXL3", what);
  const int C = m.affine ? 128 / std::max(m.bits, 1) : 8;
  if (in % C != 0 || in > kMaxStaged) return fmt::format("{} has {} inputs (needs a multiple of {} up to {})", what, in, C, kMaxStaged);
  if (m.affine) {
    if (m.bits != 4 && m.bits != 8) return fmt::format("{} is affine {}-bit", what, m.bits);
    if (m.gs % 32 != 0 || in % m.gs != 0 || m.sstride % 8 != 0 || (m.row_words * 4) % 16 != 0)
      return fmt::format("{}: affine group size {} with {} inputs", what, m.gs, in);
  } else if ((m.ld * 2) % 16 != 0 || (m.estride * 2) % 16 != 0) {
    return fmt::format("{}: rows not 16-byte aligned", what);
  }
  return "";
}

int splits_for(int bucket) { return std::clamp((256 << bucket) / 64, 1, kMaxSplits); }



}  // namespace

std::string CudaBackend::mk_uncovered() {
  MkState& S = *mk_state_;
  if (S.checked) return S.uncovered;
  S.checked = true;
  const ModelConfig& c = w_->cfg;
  const int H = int(c.hidden);
  std::string why;
  auto need = [&](const std::string& p) {
    if (why.empty() && !p.empty()) why = p;
  };
  if (H % 32 != 0 || H > kMaxStaged) need(fmt::format("hidden size {}", H));
  if (table_rows() > size_t(mk::kMaxLayers)) need(fmt::format("{} layers", table_rows()));
  need(mat_problem(lm_head_, H, "lm_head"));
  for (size_t l = 0; l < size_t(c.layers); ++l) {
    const DevLayer& D = layers_[l];
    const std::string at = fmt::format(" of layer {}", l);
    if (D.kind == LayerKind::LinearAttention) {
      const GdnDev& g = D.gdn;
      if (g.dk != 32 && g.dk != 64 && g.dk != 128) need(fmt::format("DeltaNet key head dim {}", g.dk));
      if (g.dv % kGdnTileRows != 0) need(fmt::format("DeltaNet value head dim {}", g.dv));
      if (g.K < 2 || g.K > 4) need(fmt::format("DeltaNet conv kernel {}", g.K));
      for (auto& [m, rows] : D.gdn_in) need(mat_problem(m, H, ("the DeltaNet input projection" + at).c_str()));
      need(mat_problem(D.gdn_out, g.Hv * g.dv, ("the DeltaNet output projection" + at).c_str()));
    } else {
      const AttnDev& a = D.attn;
      const int G = a.Hq / a.Hkv;
      if (a.hd != 64 && a.hd != 128 && a.hd != 256) need(fmt::format("attention head dim {}", a.hd));
      if (G > 16 || G * a.hd > mk::kMaxAttnOutputs) need(fmt::format("{} query heads per KV head", G));
      for (auto& [m, rows] : D.attn_in) need(mat_problem(m, H, ("the attention input projection" + at).c_str()));
      need(mat_problem(D.attn_o, a.Hq * a.hd, ("the attention output projection" + at).c_str()));
    }
    const MoeDev& m = D.moe;
    if (!m.moe) {
      need("a dense MLP layer" + at);
      continue;
    }
    if (!m.shared_in_stack && m.Is > 0) need("a shared expert outside the expert stacks" + at);
    const bool sh_gate = m.sh_gate.exl3 ? m.sh_gate.parts != nullptr : m.sh_gate.affine ? m.sh_gate.q != nullptr : m.sh_gate.w != nullptr;
    if (sh_gate && !m.gate_in_router) need("a shared-expert gate outside the router" + at);
    if (m.slots_per_token() > mk::kMaxParts || m.slots_per_token() * m.I > kMaxStaged)
      need(fmt::format("{} expert slots of {}", m.slots_per_token(), m.I));
    need(mat_problem(m.router, H, ("the router" + at).c_str()));
    need(mat_problem(m.gate_up, H, ("the expert gate|up stack" + at).c_str()));
    need(mat_problem(m.down, m.I, ("the expert down stack" + at).c_str()));
  }
  S.uncovered = why;
  return why;
}

void CudaBackend::mk_alloc() {
  MkState& S = *mk_state_;
  if (S.buf) return;
  const ModelConfig& c = w_->cfg;
  size_t logits = 0, slots = 0, h = 0, gpart = 0, attn = 0;
  for (const DevLayer& D : layers_) {
    if (D.kind == LayerKind::LinearAttention) gpart = std::max(gpart, size_t(D.gdn.Hv) * size_t(D.gdn.dv / kGdnTileRows));
    else attn = std::max(attn, size_t(D.attn.Hq) * kMaxSplits);
    if (D.moe.moe) {
      logits = std::max(logits, size_t(D.moe.E) + 1);
      slots = std::max(slots, size_t(D.moe.slots_per_token()));
      h = std::max(h, size_t(D.moe.slots_per_token()) * size_t(D.moe.I));
    }
  }
  size_t hd = 0;
  for (const DevLayer& D : layers_)
    if (D.kind == LayerKind::FullAttention) hd = std::max(hd, size_t(D.attn.hd));
  auto al = [](size_t b) { return (b + 255) & ~size_t(255); };
  const size_t n_keys = size_t(mk::blocks());
  const size_t sizes[] = {al(4 * logits), al(4 * slots), al(4 * slots), al(4 * h), al(4 * gpart), al(4 * attn * hd),
                          al(4 * attn), al(4 * attn), al(8 * n_keys)};
  size_t total = 0;
  for (size_t b : sizes) total += b;
  S.buf = dev_->alloc(total);
  S.buf_bytes = total;
  char* p = static_cast<char*>(S.buf);
  S.logits = reinterpret_cast<float*>(p); p += sizes[0];
  S.idx = reinterpret_cast<int32_t*>(p); p += sizes[1];
  S.w = reinterpret_cast<float*>(p); p += sizes[2];
  S.h = reinterpret_cast<float*>(p); p += sizes[3];
  S.gpart = reinterpret_cast<float*>(p); p += sizes[4];
  S.po = reinterpret_cast<float*>(p); p += sizes[5];
  S.pm = reinterpret_cast<float*>(p); p += sizes[6];
  S.pl = reinterpret_cast<float*>(p); p += sizes[7];
  S.keys = reinterpret_cast<unsigned long long*>(p);
  LILY_CU(cudaHostAlloc(reinterpret_cast<void**>(&S.host_err), 4 * mk::kErrWords, cudaHostAllocMapped));
  std::memset(S.host_err, 0, 4 * mk::kErrWords);
  LILY_CU(cudaHostGetDevicePointer(reinterpret_cast<void**>(&S.host_err_dev), S.host_err, 0));
  (void)c;
}

void CudaBackend::mk_release() {
  if (!mk_state_) return;
  MkState& S = *mk_state_;
  for (auto& [k, e] : S.plans) {
    mk::release(e.dev);
    dev_->free(e.trace, e.trace_bytes);
  }
  S.plans.clear();
  S.building = false;
}

void CudaBackend::mk_free() {
  if (!mk_state_) return;
  mk_release();
  MkState& S = *mk_state_;
  dev_->free(S.buf, S.buf_bytes);
  S.buf = nullptr;
  if (S.host_err) cudaFreeHost(S.host_err);
  S.host_err = nullptr;
}

// In begin(), once the step's groups, outputs and graph key are known.
void CudaBackend::mk_begin() {
  mk_ = false;
  mk_plan_only_ = false;
  if (!opt_.mk || T_ != 1 || groups_.size() != 1 || O_ != 1 || mtp_ || keep_ || groups_[0].tentative || rank_) return;  // one device only
  if (!mk_state_) mk_state_ = std::make_unique<MkState>();
  if (!mk_uncovered().empty()) return;
  MkState& S = *mk_state_;
  mk_ = true;
  if (!recording_) ++S.steps;
  mk_alloc();
  S.key = {bucket_for(groups_[0].pos0 + 1), kind_};
  S.last.clear();
  S.building = !S.plans.count(S.key);
  if (S.building) {  // this step builds the plan: uncaptured (recording: nothing launched)
    S.next = mk::Plan{};
    mk_plan_only_ = recording_;
    capture_ = replay_ = false;
    exec_ = nullptr;
  }
}

int CudaBackend::mk_add(mk::OpDesc op, std::vector<int> deps) {
  MkState& S = *mk_state_;
  return S.next.add(op, std::move(deps));
}

// A GEMV-class op of W [out, in] (parts row blocks per tile) with its tile rows and stage size (at most cap).
static void gemv_shape(mk::OpDesc& op, const Mat& W, int out, int in, int parts, int tiles_per, uint32_t cap) {
  op.m = wmat(W, in);
  op.out = out;
  op.in = in;
  op.parts = parts;
  auto stage = [&](int rows) {
    return int64_t(parts) * rows * op.m.row_b + (op.m.bits ? 2 * int64_t(parts) * mk::scale_row_bytes(rows, op.m.ng) : 0);
  };
  op.rows = mk::tile_rows(stage(1), cap, mk::kMaxTileRows);
  while (op.rows > 1 && stage(op.rows) > int64_t(cap)) --op.rows;
  op.stage_bytes = uint32_t(stage(op.rows));
  op.ntiles = tiles_per * int((out + op.rows - 1) / op.rows);
}

// Bytes of one ring stage (CudaOptions::mk_stage_kb): the largest tile the ops are cut into. The GDN and
// attention stages (16 KB at dk 128, 32 KB at head dim 256) are fixed.
uint32_t CudaBackend::mk_stage_cap() const { return uint32_t(std::max(opt_.mk_stage_kb, 32)) * 1024u; }

void CudaBackend::mk_embed() {
  MkState& S = *mk_state_;
  if (!S.building) return;
  mk::OpDesc op;
  op.type = mk::kEmbed;
  op.m = wmat(embed_, int(w_->cfg.hidden));
  op.out = int(w_->cfg.hidden);
  op.y = x_;
  op.ntiles = 1;
  S.last = {mk_add(op, {})};
}

// The input projections of a mixer: one op per run of rows in one format, x normalised in each.
std::vector<int> CudaBackend::mk_in_proj(const std::vector<std::pair<Mat, int>>& runs, const float* norm, int layer) {
  MkState& S = *mk_state_;
  const int H = int(w_->cfg.hidden);
  std::vector<int> ops;
  int c0 = 0;
  for (auto& [m, rows] : runs) {
    mk::OpDesc op;
    op.type = mk::kGemv;
    op.layer = layer;
    gemv_shape(op, m, rows, H, 1, 1, mk_stage_cap());
    op.in_kind = mk::kInNorm;
    op.x = x_;
    op.norm_w = norm;
    op.eps = float(w_->cfg.rms_eps);
    op.y = proj_ + c0;
    ops.push_back(mk_add(op, S.last));
    c0 += rows;
  }
  return ops;
}

void CudaBackend::mk_gdn(int layer) {
  MkState& S = *mk_state_;
  if (!S.building) return;
  const DevLayer& D = layers_[size_t(layer)];
  const GdnDev& g = D.gdn;
  const std::vector<int> in = mk_in_proj(D.gdn_in, D.in_norm, layer);
  mk::OpDesc op;
  op.type = mk::kGdn;
  op.layer = layer;
  mk::GdnArgs& a = op.gdn;
  a.Hk = g.Hk; a.Hv = g.Hv; a.dk = g.dk; a.dv = g.dv; a.K = g.K; a.nck = g.dv / kGdnTileRows;
  a.convw = g.conv; a.dt_bias = g.dt_bias; a.A_neg = g.A_neg;
  a.proj = proj_;
  a.out = core_;
  a.part = S.gpart;
  a.readcnt = S.next.counter(g.Hk);
  op.ntiles = g.Hv * a.nck;
  op.stage_bytes = uint32_t(kGdnTileRows * g.dk * 4);
  const int step = mk_add(op, in);
  mk::OpDesc o;
  o.type = mk::kGemv;
  o.layer = layer;
  gemv_shape(o, D.gdn_out, int(w_->cfg.hidden), g.Hv * g.dv, 1, 1, mk_stage_cap());
  o.in_kind = mk::kInGdnGated;
  o.x = core_;
  o.aux0 = proj_ + g.C();  // z
  o.aux1 = S.gpart;
  o.norm_w = g.norm;
  o.eps = g.eps;
  o.gated_dv = g.dv;
  o.gated_nck = a.nck;
  o.y = x_;
  o.accumulate = 1;
  S.last = {mk_add(o, {step})};
}

void CudaBackend::mk_attn(int layer) {
  MkState& S = *mk_state_;
  if (!S.building) return;
  const DevLayer& D = layers_[size_t(layer)];
  const AttnDev& ad = D.attn;
  const std::vector<int> in = mk_in_proj(D.attn_in, D.in_norm, layer);
  mk::OpDesc op;
  op.type = mk::kAttnSplit;
  op.layer = layer;
  mk::AttnArgs& a = op.attn;
  a.Hq = ad.Hq; a.Hkv = ad.Hkv; a.hd = ad.hd; a.rot = ad.rot; a.nsplit = splits_for(S.key.first); a.kc = kAttnKeys;
  a.eps = ad.eps; a.theta = ad.theta; a.q_norm = ad.q_norm; a.k_norm = ad.k_norm; a.inv_freq = ad.inv_freq;
  a.proj = proj_;
  a.po = S.po; a.pm = S.pm; a.pl = S.pl;
  a.out = core_;
  op.ntiles = ad.Hkv * a.nsplit;
  op.stage_bytes = uint32_t(2 * kAttnKeys * ad.hd * 2);
  const int split = mk_add(op, in);
  mk::OpDesc mg = op;
  mg.type = mk::kAttnMerge;
  mg.ntiles = ad.Hq;
  mg.stage_bytes = 0;
  const int merge = mk_add(mg, {split});
  mk::OpDesc o;
  o.type = mk::kGemv;
  o.layer = layer;
  gemv_shape(o, D.attn_o, int(w_->cfg.hidden), ad.Hq * ad.hd, 1, 1, mk_stage_cap());
  o.in_kind = mk::kInPlain;
  o.x = core_;
  o.y = x_;
  o.accumulate = 1;
  S.last = {mk_add(o, {merge})};
}

void CudaBackend::mk_ffn(int layer) {
  MkState& S = *mk_state_;
  if (!S.building) return;
  const DevLayer& D = layers_[size_t(layer)];
  const MoeDev& m = D.moe;
  const int H = int(w_->cfg.hidden), kk = m.slots_per_token();
  const float eps = float(w_->cfg.rms_eps);
  mk::OpDesc r;
  r.type = mk::kRouter;
  r.layer = layer;
  gemv_shape(r, m.router, m.E + (m.gate_in_router ? 1 : 0), H, 1, 1, mk_stage_cap());
  r.in_kind = mk::kInNorm;
  r.x = x_;
  r.norm_w = D.post_norm;
  r.eps = eps;
  r.y = S.logits;
  r.route.E = m.E; r.route.k = m.k; r.route.norm_topk = m.norm_topk ? 1 : 0;
  r.route.shared = m.shared_in_stack ? 1 : 0; r.route.gated = m.gate_in_router ? 1 : 0;
  r.route.idx = S.idx; r.route.w = S.w;
  r.route.routed = S.next.counter();
  const int router = mk_add(r, S.last);
  const int routed = r.route.routed;
  mk::OpDesc gu;
  gu.type = mk::kExpertGu;
  gu.layer = layer;
  gemv_shape(gu, m.gate_up, m.I, H, 2, kk, mk_stage_cap());
  gu.in_kind = mk::kInNorm;
  gu.x = x_;
  gu.norm_w = D.post_norm;
  gu.eps = eps;
  gu.y = S.h;
  gu.experts = S.idx;
  gu.shared_slot = m.shared_in_stack ? m.k : -1;
  gu.shared_e = m.E;
  gu.stage_dep = routed;
  gu.dep[0] = routed;  // the routing implies every router task is done
  gu.dep_n[0] = 1;
  const int gate_up = mk_add(gu, {router});  // (the routed counter already implies the router's tasks)
  mk::OpDesc dn;
  dn.type = mk::kExpertDown;
  dn.layer = layer;
  gemv_shape(dn, m.down, H, m.I, kk, 1, mk_stage_cap());
  dn.in_kind = mk::kInConcat;
  dn.x = S.h;
  dn.aux0 = S.w;
  dn.y = x_;
  dn.accumulate = 1;
  dn.experts = S.idx;
  dn.shared_slot = gu.shared_slot;
  dn.shared_e = m.E;
  dn.stage_dep = routed;
  S.last = {mk_add(dn, {gate_up})};
}

void CudaBackend::mk_head() {
  MkState& S = *mk_state_;
  if (S.building) {
    mk::OpDesc op;
    op.type = mk::kHead;
    gemv_shape(op, lm_head_, int(w_->cfg.vocab), int(w_->cfg.hidden), 1, 1, mk_stage_cap());
    op.in_kind = mk::kInNorm;
    op.x = x_;
    op.norm_w = final_norm_;
    op.eps = float(w_->cfg.rms_eps);
    op.y = logits_;
    op.head.keys = S.keys;
    op.head.ids = kind_ == 1 ? ids_dev_ : nullptr;
    op.head.feed = kind_ == 1 ? 1 : 0;
    op.head.index = S.next.counter();
    mk_add(op, S.last);
    S.next.finalize(mk::blocks(), mk_stage_cap());
    MkState::Entry e;
    e.plan = std::move(S.next);
    e.dev = mk::upload(e.plan);
    if (opt_.mk_trace) {
      e.trace_bytes = sizeof(unsigned long long) * mk::kTraceWords * std::max<size_t>(1, e.plan.tasks().size());
      e.trace = static_cast<unsigned long long*>(dev_->alloc(e.trace_bytes));
    }
    S.plans[S.key] = std::move(e);
    S.building = false;
  }
  if (mk_plan_only_) return;
  const MkState::Entry& e = S.plans.at(S.key);
  mk::StepArgs a;
  a.tokens = d_tokens();
  a.groups = d_groups();
  a.slots = slot_tab_;
  a.slot_cap = slot_cap_;
  a.layers = int(table_rows());
  a.fed = fed_;
  a.host_err = S.host_err_dev;
  a.trace = e.trace;
  a.skip_dots = opt_.mk_skip_dots ? 1 : 0;
  mk::launch(e.dev, a, stream_);
  if (kind_ == 2)
    sample_rows(samp_, samp_slots_, logits_, S_, d_i32(lay_.sample_src), d_i32(lay_.sample_slot), d_i32(lay_.sample_off),
                ids_dev_, stream_, d_i32(lay_.sample_fed), fed_);
}

// In finish(), for a step that ran the kernel: its failure (a wait past the timeout traps) names the op.
void CudaBackend::mk_wait(cudaEvent_t done) {
  const cudaError_t e = cudaEventSynchronize(done);
  if (e == cudaSuccess) return;
  MkState& S = *mk_state_;
  static const mk::Plan empty;
  const std::string m = mk::record_message(S.host_err, S.plans.count(S.key) ? S.plans.at(S.key).plan : empty);
  if (m.empty()) LILY_CU(e);
  throw InternalError(fmt::format("{} ({})", m, cudaGetErrorString(e)));
}

CudaMkInfo CudaBackend::mk_info() {
  if (!mk_state_) mk_state_ = std::make_unique<MkState>();
  CudaMkInfo i;
  i.uncovered = mk_uncovered();
  const MkState& S = *mk_state_;
  i.steps = S.steps;
  if (!S.plans.count(S.key)) return i;
  const MkState::Entry& e = S.plans.at(S.key);
  i.ops = e.plan.describe();
  if (e.trace) {
    dev_->sync();
    std::vector<unsigned long long> tr(e.trace_bytes / sizeof(unsigned long long));
    LILY_CU(cudaMemcpy(tr.data(), e.trace, e.trace_bytes, cudaMemcpyDeviceToHost));
    i.trace = e.plan.trace_report(tr);
    if (!opt_.mk_trace_csv.empty()) {
      std::FILE* f = std::fopen(opt_.mk_trace_csv.c_str(), "w");
      if (!f) fail("--cuda-opt mk_trace_csv={}: cannot write the file", opt_.mk_trace_csv);
      const std::string csv = e.plan.trace_csv(tr);
      std::fwrite(csv.data(), 1, csv.size(), f);
      std::fclose(f);
    }
  }
  return i;
}

}  // namespace lily::cuda
