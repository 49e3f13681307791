// CudaBackend: one step from begin() to finish() — the checks, the descriptor uploaded from a pinned
// block, the scratch, the ticket, the outputs' way to the host.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_impl.h"
#include "core/error.h"

namespace lily::cuda {
namespace {
size_t al16(size_t b) { return (b + 15) & ~size_t(15); }
size_t al256(size_t b) { return (b + 255) & ~size_t(255); }
}  // namespace

DescLayout desc_layout(int T, int G, int O, int S, int n_attn_short, int n_attn_short_rows, int n_gdn_short) {
  DescLayout d;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t r = off;
    off += al16(bytes);
    return r;
  };
  d.groups = take(sizeof(DevGroup) * size_t(G));  // first: 8-byte members
  d.tokens = take(4 * size_t(T));
  d.row_group = take(4 * size_t(T));
  d.out_rows = take(4 * size_t(O));
  d.sample_src = take(4 * size_t(S));
  d.sample_slot = take(4 * size_t(S));
  d.sample_fed = take(4 * size_t(S));
  d.attn_short = take(4 * size_t(n_attn_short));
  d.attn_short_rows = take(4 * size_t(n_attn_short_rows));
  d.gdn_short = take(4 * size_t(n_gdn_short));
  d.bytes = std::max<size_t>(off, 16);
  return d;
}

cudaEvent_t CudaBackend::get_event() {
  if (!events_.empty()) {
    cudaEvent_t e = events_.back();
    events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  LILY_CU(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

void CudaBackend::put_event(cudaEvent_t e) {
  if (e) events_.push_back(e);
}

// Activations [T] rows and `work` bytes of block scratch; growing waits for the device and drops the
// captured graphs (they hold the old addresses).
void CudaBackend::ensure_scratch(int T, size_t work) {
  if (T <= cap_T_ && work <= work_bytes_) return;
  const int newT = std::max({T, cap_T_, 1});
  work = std::max(work, work_bytes_);
  const int H = int(w_->cfg.hidden);
  const size_t bx = al256(4 * size_t(newT) * size_t(H)), bp = al256(4 * size_t(newT) * size_t(max_proj_)),
               bc = al256(4 * size_t(newT) * size_t(max_core_)), bt = al256(4 * size_t(newT));
  const size_t total = 2 * bx + bp + bc + bt + al256(work);
  dev_->sync();
  drop_graphs();
  dev_->free(scratch_, scratch_bytes_);
  scratch_ = nullptr;
  scratch_bytes_ = 0;
  char* base = static_cast<char*>(dev_->alloc(total));
  scratch_ = base;
  scratch_bytes_ = total;
  x_ = reinterpret_cast<float*>(base); base += bx;
  u_ = reinterpret_cast<float*>(base); base += bx;
  proj_ = reinterpret_cast<float*>(base); base += bp;
  core_ = reinterpret_cast<float*>(base); base += bc;
  ids_dev_ = reinterpret_cast<int32_t*>(base); base += bt;
  work_ = base;
  cap_T_ = newT;
  work_bytes_ = al256(work);
  ++scratch_gen_;
}

// Logits rows [rows, V] (grown outside captures only).
void CudaBackend::ensure_logits(int64_t rows) {
  rows = std::max<int64_t>(rows, 1);
  if (rows <= logits_rows_) return;
  dev_->sync();
  drop_graphs();
  const size_t V = size_t(w_->cfg.vocab);
  dev_->free(logits_, size_t(logits_rows_) * V * 4);
  logits_ = nullptr;
  logits_rows_ = 0;
  logits_ = static_cast<float*>(dev_->alloc(size_t(rows) * V * 4));
  logits_rows_ = rows;
  ++scratch_gen_;
}

void CudaBackend::ensure_desc(size_t bytes) {
  if (bytes <= desc_cap_) return;
  const size_t cap = std::max<size_t>({bytes, 2 * desc_cap_, 4096});
  dev_->sync();
  drop_graphs();
  dev_->free(desc_dev_, desc_cap_);
  desc_dev_ = nullptr;
  desc_cap_ = 0;
  desc_dev_ = dev_->alloc(cap);
  desc_cap_ = cap;
}

void CudaBackend::stage_flights() {
  const size_t V = size_t(w_->cfg.vocab);
  for (Flight& f : flights_) {
    if (f.logit_rows == 0 || f.staged_logits) continue;
    f.staged = pinned_.get(size_t(f.logit_rows) * V * 4);
    auto* dst = static_cast<float*>(f.staged.p);
    for (auto [row, n] : f.logit_ranges) {
      LILY_CU(cudaMemcpyAsync(dst, logits_ + size_t(row) * V, size_t(n) * V * 4, cudaMemcpyDeviceToHost, stream_));
      dst += size_t(n) * V;
    }
    LILY_CU(cudaEventRecord(f.done, stream_));  // finish() waits for the copy too
    f.staged_logits = true;
  }
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

CudaBlockProfile CudaBackend::block_profile() const {
  CudaBlockProfile p;
  for (auto& [k, v] : prof_) p.ms.push_back({k, v});
  p.steps = prof_steps_;
  return p;
}

// ---------------------------------------------------------------------------------------------
void CudaBackend::abandon_step() {
  if (capture_) {  // a block threw during a capture: close it, keep nothing
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream_, &g);
    if (g) cudaGraphDestroy(g);
    (void)cudaGetLastError();
  }
  capture_ = replay_ = false;
  exec_ = nullptr;
  pinned_.put(desc_host_);
  groups_.clear();
  stepping_ = false;
}

void CudaBackend::begin(const Step& step) {
  if (stepping_) abandon_step();  // the previous step threw before end(): its sequences are not advanced
  const ModelConfig& c = w_->cfg;
  step.validate(c.vocab);
  groups_.clear();
  for (size_t i = 0; i < step.groups.size(); ++i) {
    const StepGroup& g = step.groups[i];
    auto* st = dynamic_cast<CudaState*>(g.seq);
    if (!st || &st->be_ != this)
      throw InternalError(fmt::format("step group {}: its sequence state belongs to another backend", i));
    if (g.sample) throw InternalError(fmt::format("step group {}: the CUDA backend has no device sampler yet", i));
    if (step.tokens[size_t(g.first)] == kFedToken)
      throw InternalError(fmt::format("step group {}: a fed row (kFedToken), but the CUDA backend has no device sampler yet", i));
    if (g.tentative) throw InternalError(fmt::format("step group {}: tentative steps are not supported on CUDA yet", i));
    groups_.push_back({st, g.first, g.rows, g.out_rows, g.logits, g.sample, g.tentative});
  }
  set_kernel_switches(opt_.kernels);
  T_ = int(step.rows());
  const int G = int(groups_.size());
  std::vector<int32_t> out_rows;
  for (const Group& g : groups_)
    if (g.logits)
      for (int32_t r = g.first + g.rows - g.out_rows; r < g.first + g.rows; ++r) out_rows.push_back(r);
  O_ = int(out_rows.size());
  out_tail_ = true;
  for (int i = 0; i < O_; ++i) out_tail_ = out_tail_ && out_rows[size_t(i)] == T_ - O_ + i;

  // launch shapes: the split of each group's attention (a function of the context bucket when captured)
  capture_ = replay_ = false;
  exec_ = nullptr;
  const bool graph = recording_ || (opt_.graphs && !opt_.profile && T_ == 1 && G == 1);
  int64_t ctx_graph = 0;
  if (graph) {
    const int64_t need = groups_[0].st->n_ + T_;
    ctx_graph = int64_t(256) << bucket_for(need);
    graph_key_ = GraphKey{groups_[0].st->slot_, T_, G, bucket_for(need), O_, 0};
  }
  const DevLayer* attn0 = nullptr;
  for (const DevLayer& D : layers_)
    if (D.kind == LayerKind::FullAttention) { attn0 = &D; break; }
  size_t work = 0;
  nsplit_.assign(size_t(G), 1);
  for (int gi = 0; gi < G; ++gi) {
    const Group& g = groups_[size_t(gi)];
    const int64_t ctx = graph ? ctx_graph : g.st->n_ + g.rows;
    if (attn0) nsplit_[size_t(gi)] = attn_splits(attn0->attn, g.rows, ctx);
    for (const DevLayer& D : layers_) {
      if (D.kind == LayerKind::LinearAttention) work = std::max(work, gdn_scratch_bytes(D.gdn, g.rows));
      else work = std::max(work, attn_scratch_bytes(D.attn, g.rows, nsplit_[size_t(gi)]));
    }
  }
  for (const DevLayer& D : layers_) work = std::max(work, moe_scratch_bytes(D.moe, T_));
  ensure_scratch(T_, work);
  stage_flights();  // earlier steps' logits leave the buffer before this step (or its growth) overwrites it
  ensure_logits(O_);

  // the descriptor: this step's rows and groups, from a pinned block into the device copy
  lay_ = desc_layout(T_, G, O_, 0, 0, 0, 0);
  ensure_desc(lay_.bytes);
  PinnedPool::Block blk = pinned_.get(lay_.bytes);
  char* h = static_cast<char*>(blk.p);
  std::memcpy(h + lay_.tokens, step.tokens.data(), 4 * size_t(T_));
  auto* rg = reinterpret_cast<int32_t*>(h + lay_.row_group);
  auto* dg = reinterpret_cast<DevGroup*>(h + lay_.groups);
  for (int gi = 0; gi < G; ++gi) {
    const Group& g = groups_[size_t(gi)];
    for (int32_t r = g.first; r < g.first + g.rows; ++r) rg[r] = gi;
    DevGroup d;
    d.first = g.first;
    d.rows = g.rows;
    d.slot = g.st->slot_;
    d.tentative = g.tentative ? 1 : 0;
    d.cur = g.st->cur_;
    d.ring = g.st->R_;
    d.pos = g.st->n_;
    dg[gi] = d;
  }
  if (O_ > 0) std::memcpy(h + lay_.out_rows, out_rows.data(), 4 * size_t(O_));
  LILY_CU(cudaMemcpyAsync(desc_dev_, h, lay_.bytes, cudaMemcpyHostToDevice, stream_));
  desc_host_ = blk;

  if (graph) {
    auto it = graphs_.find(graph_key_);
    if (it != graphs_.end() && !recording_) {
      replay_ = true;
      exec_ = it->second;
    } else {
      capture_ = true;
    }
  }
  stepping_ = true;
}

uint64_t CudaBackend::end() {
  if (!stepping_) throw InternalError("CudaBackend::end without begin");
  if (!replay_) mark(-1, "step");
  cudaGraphExec_t ex = exec_;
  if (capture_) ex = end_capture();  // record mode: null, nothing runs
  if (ex) LILY_CU(cudaGraphLaunch(ex, stream_));
  stepping_ = false;
  Flight f;
  f.ticket = next_ticket_++;
  f.desc = desc_host_;
  desc_host_ = PinnedPool::Block{};
  if (!recording_) {
    int64_t row = 0;
    for (const Group& g : groups_) {
      if (g.logits && g.out_rows > 0) {
        f.logit_ranges.push_back({row, g.out_rows});
        f.logit_rows += g.out_rows;
      }
      if (g.logits) row += g.out_rows;
      if (g.tentative) g.st->pending_ = g.rows;
      else g.st->n_ += g.rows;
    }
  }
  f.done = get_event();
  LILY_CU(cudaEventRecord(f.done, stream_));
  flights_.push_back(std::move(f));
  groups_.clear();
  return flights_.back().ticket;
}

void CudaBackend::finish(uint64_t ticket, const StepOutputs& out) {
  if (flights_.empty() || flights_.front().ticket != ticket)
    throw InternalError(fmt::format("CudaBackend::finish: ticket {} is not the oldest unfinished step", ticket));
  Flight& f = flights_.front();
  const size_t V = size_t(w_->cfg.vocab);
  if (out.logits && f.logit_rows > 0 && !f.staged_logits) {
    // no later step has begun: the rows are still in the device buffer
    float* dst = out.logits;
    for (auto [row, n] : f.logit_ranges) {
      LILY_CU(cudaMemcpyAsync(dst, logits_ + size_t(row) * V, size_t(n) * V * 4, cudaMemcpyDeviceToHost, stream_));
      dst += size_t(n) * V;
    }
    LILY_CU(cudaStreamSynchronize(stream_));
  } else {
    LILY_CU(cudaEventSynchronize(f.done));
    if (out.logits && f.logit_rows > 0) std::memcpy(out.logits, f.staged.p, size_t(f.logit_rows) * V * 4);
  }
  if (out.ids && f.sample_rows > 0) std::memcpy(out.ids, f.ids.p, 4 * size_t(f.sample_rows));
  pinned_.put(f.desc);
  pinned_.put(f.ids);
  pinned_.put(f.staged);
  put_event(f.done);
  flights_.pop_front();
}

}  // namespace lily::cuda
