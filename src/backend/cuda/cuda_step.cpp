// CudaBackend: one step from begin() to finish() — the checks, the descriptor uploaded from a pinned
// block, the scratch, the ticket, the outputs' way to the host.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_impl.h"
#include "backend/cuda/gemm_stage.h"
#include "core/error.h"

namespace lily::cuda {
namespace {
size_t al16(size_t b) { return (b + 15) & ~size_t(15); }
size_t al256(size_t b) { return (b + 255) & ~size_t(255); }
}  // namespace

DescLayout desc_layout(int T, int G, int O, int S, int n_attn_short, int n_attn_short_rows, int n_gdn_short,
                       int n_gdn_short_rows, int n_hidden) {
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
  d.sample_off = take(4 * size_t(S));
  d.sample_fed = take(4 * size_t(S));
  d.attn_short = take(4 * size_t(n_attn_short));
  d.attn_short_rows = take(4 * size_t(n_attn_short_rows));
  d.gdn_short = take(4 * size_t(n_gdn_short));
  d.gdn_short_rows = take(4 * size_t(n_gdn_short_rows));
  d.hidden = take(4 * size_t(n_hidden));
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
  // the prompt GEMMs' input staging (gemm_stage.h) for the captured steps: expert products read up to
  // T · slots rows, of at most max_in inputs
  int slots = 1, max_in = std::max(2 * H, max_core_);
  for (const DevLayer& D : layers_) {
    slots = std::max(slots, D.moe.slots_per_token());
    max_in = std::max({max_in, D.moe.I, D.moe.Is});
  }
  const int cap = std::min(newT, kMaxGraphRows);
  reserve_gemm_stage(stream_, int64_t(cap) * slots, max_in);
  reserve_gemm_stage(side_, cap, max_in);
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
  if (step.mtp) w_->require_mtp();  // names the missing tensors
  mtp_ = step.mtp;
  head_vocab_ = step.mtp ? step.head_vocab : 0;
  keep_ = false;
  const AttnDev* attn0 = nullptr;
  const GdnDev* gdn0 = nullptr;
  for (const DevLayer& D : layers_) {
    if (D.kind == LayerKind::FullAttention && !attn0) attn0 = &D.attn;
    if (D.kind == LayerKind::LinearAttention && !gdn0) gdn0 = &D.gdn;
  }
  const int Gq = attn0 ? attn0->Hq / attn0->Hkv : 1;
  const bool attn_batch = !attn0 || attn_decode_covers(attn0->hd);
  groups_.clear();
  for (size_t i = 0; i < step.groups.size(); ++i) {
    const StepGroup& g = step.groups[i];
    auto* st = dynamic_cast<CudaState*>(g.seq);
    if (!st || &st->be_ != this)
      throw InternalError(fmt::format("step group {}: its sequence state belongs to another backend", i));
    if (st->slot_ < 0 || st->slot_ >= int(slots_.size()) || slots_[size_t(st->slot_)] != st)
      throw InternalError(fmt::format("step group {}: its sequence is not in the pool", i));
    if (g.sample && !mtp_ && !st->sampler_)
      throw InternalError(fmt::format("step group {}: draws ids, but set_sampling was not called for its sequence", i));
    if (step.tokens[size_t(g.first)] == kFedToken && !st->fed_)
      throw InternalError(fmt::format("step group {}: a fed row (kFedToken), but no earlier step drew an id for its sequence", i));
    if (g.keep_hidden && !w_->mtp)
      throw InternalError(fmt::format("step group {}: keeps its hidden rows for MTP steps, but the model has no MTP block", i));
    if (mtp_ && step.hidden[size_t(g.first)] == kMtpHidden && !st->has_mtp_h_)
      throw InternalError(fmt::format("step group {}: an MTP row reads the previous MTP step's h', but its sequence ran no "
                                      "MTP step since its last reset", i));
    Group gr{st, g.first, g.rows, g.out_rows, g.logits, g.sample, g.tentative, g.keep_hidden, mtp_ ? st->mtp_n_ : st->n_,
             false, false, 1};
    if (g.keep_hidden) {
      st->ensure_hidden(g.rows);
      keep_ = true;
    }
    // a group's path is a function of the group alone (its result does not depend on its batch)
    gr.attn_short = attn_batch && int64_t(Gq) * g.rows <= kAttnDecodeRows;
    gr.gdn_short = g.rows <= kGdnShortRows && (g.rows < opt_.chunk_min || g.tentative);
    groups_.push_back(gr);
  }
  set_kernel_switches(opt_.kernels);
  T_ = int(step.rows());
  const int G = int(groups_.size());

  // outputs: logits rows (logits or sampled groups), sampled rows, the sampler kind
  std::vector<int32_t> out_rows, s_src, s_slot, s_off, s_fed;
  bool plain = true;
  for (const Group& g : groups_) {
    if (!(g.logits || g.sample)) continue;
    for (int32_t k = 0; k < g.out_rows; ++k) {
      if (g.sample) {
        s_src.push_back(int32_t(out_rows.size()));
        s_slot.push_back(g.st->slot_);
        s_off.push_back(k);
        s_fed.push_back(k == g.out_rows - 1 && !mtp_ ? g.st->slot_ : -1);  // MTP argmax rows feed nothing
      }
      out_rows.push_back(g.first + g.rows - g.out_rows + k);
    }
    if (g.sample && g.out_rows > 0 && !mtp_) plain = plain && g.st->greedy_plain_ && !g.st->mask_on_;
  }
  O_ = int(out_rows.size());
  S_ = int(s_src.size());
  if (mtp_ && S_ > kArgmaxRows)
    throw InternalError(fmt::format("an MTP step asks for {} argmax rows (at most {})", S_, kArgmaxRows));
  kind_ = S_ == 0 ? 0 : plain && S_ <= kArgmaxRows ? 1 : 2;
  out_tail_ = true;
  for (int i = 0; i < O_; ++i) out_tail_ = out_tail_ && out_rows[size_t(i)] == T_ - O_ + i;

  // the short launches: their groups and step rows
  std::vector<int32_t> as, as_rows, gs, gs_rows;
  int max_short = 0;
  int64_t ctx_short = 0, ctx_all = 0;
  bool uniform = true;
  ba_groups_ = opt_.ba_fold;
  for (int gi = 0; gi < G; ++gi) {
    const Group& g = groups_[size_t(gi)];
    const int64_t ctx = g.pos0 + g.rows;
    ctx_all = std::max(ctx_all, ctx);
    if (g.attn_short) {
      as.push_back(gi);
      for (int32_t r = g.first; r < g.first + g.rows; ++r) as_rows.push_back(r);
      max_short = std::max(max_short, int(g.rows));
      ctx_short = std::max(ctx_short, ctx);
    }
    if (g.gdn_short) {
      gs.push_back(gi);
      for (int32_t r = g.first; r < g.first + g.rows; ++r) gs_rows.push_back(r);
    }
    uniform = uniform && g.rows == groups_[0].rows && (g.attn_short || !attn0) && (g.gdn_short || !gdn0);
    ba_groups_ = ba_groups_ && g.gdn_short && g.rows <= kBaFoldRows;
  }
  n_attn_short_ = int(as.size());
  n_attn_short_rows_ = int(as_rows.size());
  n_gdn_short_ = int(gs.size());
  n_gdn_short_rows_ = int(gs_rows.size());

  // launch shapes: a captured step's are functions of its key (the context bucket for the splits)
  capture_ = replay_ = false;
  exec_ = nullptr;
  const bool graph = recording_ || (opt_.graphs && !opt_.profile && uniform && T_ <= kMaxGraphRows);
  if (graph) {
    const int b = bucket_for(ctx_all);
    graph_key_ = GraphKey{-1, T_, G, b, O_, S_, kind_, out_tail_, mtp_, keep_, head_vocab_};
    ctx_short = int64_t(256) << b;
  }
  size_t work = 0;
  nsplit_short_ = attn0 && n_attn_short_ > 0 ? attn_splits(*attn0, max_short, ctx_short, n_attn_short_) : 1;
  for (Group& g : groups_)
    if (attn0 && !g.attn_short) g.nsplit = attn_splits(*attn0, g.rows, g.pos0 + g.rows);
  for (const DevLayer& D : layers_) {
    if (D.kind == LayerKind::LinearAttention) {
      if (n_gdn_short_ > 0) work = std::max(work, gdn_scratch_bytes(D.gdn, T_));
      for (const Group& g : groups_)
        if (!g.gdn_short) work = std::max(work, gdn_scratch_bytes(D.gdn, g.rows));
    } else {
      size_t part = n_attn_short_ > 0 ? attn_partials_bytes(D.attn, T_, nsplit_short_) : 0;
      for (const Group& g : groups_)
        if (!g.attn_short) part = std::max(part, attn_partials_bytes(D.attn, g.rows, g.nsplit));
      work = std::max(work, attn_q_bytes(D.attn, T_) + part);
    }
    work = std::max(work, moe_scratch_bytes(D.moe, T_));
  }
  ensure_scratch(T_, work);
  stage_flights();  // earlier steps' logits leave the buffer before this step (or its growth) overwrites it
  ensure_logits(O_);
  if (kind_ == 2) ensure_sampler_rows(S_);

  // the descriptor: this step's rows and groups, from a pinned block into the device copy
  lay_ = desc_layout(T_, G, O_, S_, n_attn_short_, n_attn_short_rows_, n_gdn_short_, n_gdn_short_rows_, mtp_ ? T_ : 0);
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
    d.keep = g.keep ? 1 : 0;
    d.pos = g.pos0;
    dg[gi] = d;
  }
  auto put = [&](size_t off, const std::vector<int32_t>& v) {
    if (!v.empty()) std::memcpy(h + off, v.data(), 4 * v.size());
  };
  put(lay_.out_rows, out_rows);
  put(lay_.sample_src, s_src);
  put(lay_.sample_slot, s_slot);
  put(lay_.sample_off, s_off);
  put(lay_.sample_fed, s_fed);
  put(lay_.attn_short, as);
  put(lay_.attn_short_rows, as_rows);
  put(lay_.gdn_short, gs);
  put(lay_.gdn_short_rows, gs_rows);
  if (mtp_) put(lay_.hidden, step.hidden);
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
  mk_begin();  // mk_backend.cpp: whether this step runs as one kernel (its first step of a key: uncaptured)
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
  f.mk = mk_ && !recording_;
  f.desc = desc_host_;
  desc_host_ = PinnedPool::Block{};
  f.uploads = std::move(uploads_);
  uploads_.clear();
  if (!recording_) {
    int64_t row = 0;
    for (const Group& g : groups_) {
      if (g.logits && g.out_rows > 0) {
        f.logit_ranges.push_back({row, g.out_rows});
        f.logit_rows += g.out_rows;
      }
      if (g.logits || g.sample) row += g.out_rows;
      if (mtp_) {  // its argmax rows (sample) neither feed a row nor use the sampler
        g.st->mtp_n_ += g.rows;
        g.st->has_mtp_h_ = true;
        continue;
      }
      if (g.sample && g.out_rows > 0) {
        g.st->fed_ = true;
        g.st->mask_on_ = false;  // the draw used it
      }
      if (g.tentative) g.st->pending_ = g.rows;
      else g.st->n_ += g.rows;
      g.st->hidden_n_ = g.keep ? g.rows : 0;  // a main step without keep_hidden drops the kept rows
    }
    if (S_ > 0) {  // the drawn ids come back without a synchronisation: finish() waits for them
      f.ids = pinned_.get(4 * size_t(S_));
      f.sample_rows = S_;
      LILY_CU(cudaMemcpyAsync(f.ids.p, ids_dev_, 4 * size_t(S_), cudaMemcpyDeviceToHost, stream_));
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
  if (f.mk) mk_wait(f.done);  // mk_backend.cpp: a failed step kernel names the op it waited at
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
  for (PinnedPool::Block& u : f.uploads) pinned_.put(u);
  put_event(f.done);
  flights_.pop_front();
}

void CudaBackend::upload_async(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  PinnedPool::Block b = pinned_.get(bytes);
  std::memcpy(b.p, src, bytes);
  LILY_CU(cudaMemcpyAsync(dst, b.p, bytes, cudaMemcpyHostToDevice, stream_));
  uploads_.push_back(b);
}

CudaState& CudaBackend::own(SequenceState& seq, const char* what) {
  auto* st = dynamic_cast<CudaState*>(&seq);
  if (!st || &st->be_ != this) throw InternalError(fmt::format("{}: the sequence state belongs to another backend", what));
  return *st;
}

}  // namespace lily::cuda
