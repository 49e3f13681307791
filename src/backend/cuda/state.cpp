// The pool of sequence slots: device context, pinned blocks, CudaState (KV cache, version rings of the
// DeltaNet states, the slot table entries) and compact snapshots.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_impl.h"
#include "core/error.h"
#include "core/half.h"

namespace lily::cuda {
namespace {
size_t al256(size_t b) { return (b + 255) & ~size_t(255); }
}  // namespace

// ---------------------------------------------------------------------------------------------
Device::Device(int ord) : ordinal(ord) {
  LILY_CU(cudaSetDevice(ord));
  LILY_CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
}

Device::~Device() {
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
}

void* Device::alloc(size_t bytes) {
  void* p = nullptr;
  if (bytes == 0) return nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw InputError(fmt::format("CUDA: cannot allocate {:.1f} MiB of device memory ({})", double(bytes) / 1048576.0,
                                 cudaGetErrorString(e)));
  }
  cur += bytes;
  peak = std::max(peak, cur);
  return p;
}

void Device::free(void* p, size_t bytes) {
  if (!p) return;
  cudaFree(p);
  cur -= bytes;
}

void Device::sync() const { LILY_CU(cudaStreamSynchronize(stream)); }

PinnedPool::~PinnedPool() {
  for (Block& b : free_) cudaFreeHost(b.p);
}

PinnedPool::Block PinnedPool::get(size_t bytes) {
  bytes = std::max<size_t>(bytes, 256);
  size_t best = free_.size();
  for (size_t i = 0; i < free_.size(); ++i)
    if (free_[i].bytes >= bytes && (best == free_.size() || free_[i].bytes < free_[best].bytes)) best = i;
  if (best < free_.size()) {
    Block b = free_[best];
    free_.erase(free_.begin() + std::ptrdiff_t(best));
    return b;
  }
  Block b;
  b.bytes = std::max<size_t>(4096, (bytes + 4095) & ~size_t(4095));
  LILY_CU(cudaMallocHost(&b.p, b.bytes));
  return b;
}

void PinnedPool::put(Block& b) {
  if (!b.p) return;
  constexpr size_t kKeepMax = size_t(64) << 20;  // larger blocks (prompt logits) are not hoarded
  if (b.bytes > kKeepMax || free_.size() >= 64) cudaFreeHost(b.p);
  else free_.push_back(b);
  b = Block{};
}

// ---------------------------------------------------------------------------------------------
int CudaBackend::take_slot(CudaState* st) {
  for (size_t i = 0; i < slots_.size(); ++i)
    if (!slots_[i]) {
      slots_[i] = st;
      return int(i);
    }
  if (int(slots_.size()) == slot_cap_) {  // grow the tables (captured graphs read their addresses)
    const int cap = std::max(64, 2 * slot_cap_);
    const size_t L = table_rows();
    auto* tab = static_cast<DevSlotLayer*>(dev_->alloc(sizeof(DevSlotLayer) * size_t(cap) * L));
    auto* fed = static_cast<int32_t*>(dev_->alloc(sizeof(int32_t) * size_t(cap)));
    auto* samp = static_cast<SampleSlot*>(dev_->alloc(sizeof(SampleSlot) * size_t(cap)));
    LILY_CU(cudaMemsetAsync(tab, 0, sizeof(DevSlotLayer) * size_t(cap) * L, stream_));
    LILY_CU(cudaMemsetAsync(fed, 0, sizeof(int32_t) * size_t(cap), stream_));
    LILY_CU(cudaMemsetAsync(samp, 0, sizeof(SampleSlot) * size_t(cap), stream_));
    if (slot_cap_ > 0) {
      LILY_CU(cudaMemcpy2DAsync(tab, sizeof(DevSlotLayer) * size_t(cap), slot_tab_, sizeof(DevSlotLayer) * size_t(slot_cap_),
                                sizeof(DevSlotLayer) * size_t(slot_cap_), L, cudaMemcpyDeviceToDevice, stream_));
      LILY_CU(cudaMemcpyAsync(fed, fed_, sizeof(int32_t) * size_t(slot_cap_), cudaMemcpyDeviceToDevice, stream_));
      LILY_CU(cudaMemcpyAsync(samp, samp_slots_, sizeof(SampleSlot) * size_t(slot_cap_), cudaMemcpyDeviceToDevice, stream_));
    }
    dev_->sync();
    drop_graphs();
    dev_->free(slot_tab_, sizeof(DevSlotLayer) * size_t(slot_cap_) * L);
    dev_->free(fed_, sizeof(int32_t) * size_t(slot_cap_));
    dev_->free(samp_slots_, sizeof(SampleSlot) * size_t(slot_cap_));
    slot_tab_ = tab;
    fed_ = fed;
    samp_slots_ = samp;
    slot_cap_ = cap;
  }
  slots_.push_back(st);
  return int(slots_.size()) - 1;
}

void CudaBackend::release_slot(int slot) {
  drop_slot_graphs(slot);
  if (slot >= 0 && slot < int(slots_.size())) slots_[size_t(slot)] = nullptr;
}

void CudaBackend::put_slot_table(const CudaState& st) {
  const size_t L = table_rows();
  for (size_t l = 0; l < L; ++l) {  // one entry per layer row of the table
    const DevSlotLayer e = st.table_entry(l);
    upload_async(slot_tab_ + l * size_t(slot_cap_) + size_t(st.slot_), &e, sizeof(DevSlotLayer));
  }
}

std::unique_ptr<SequenceState> CudaBackend::new_state(int64_t max_tokens) {
  if (max_tokens <= 0) fail("context size must be positive, got {}", max_tokens);
  auto st = std::make_unique<CudaState>(*this, max_tokens, -1);
  st->slot_ = take_slot(st.get());
  put_slot_table(*st);
  return st;
}

// ---------------------------------------------------------------------------------------------
CudaState::CudaState(CudaBackend& be, int64_t cap, int slot) : be_(be), dev_(be.dev_), slot_(slot), cap_(cap) {
  const ModelConfig& c = be.w_->cfg;
  const size_t L = size_t(c.layers), rows = be.table_rows();  // rows: the layers, then the MTP layer
  H_ = c.hidden;
  k.assign(rows, nullptr); v.assign(rows, nullptr); conv.assign(rows, nullptr); S.assign(rows, nullptr);
  conv_n_ = size_t(c.conv_kernel - 1) * size_t(c.conv_channels());
  S_n_ = size_t(c.lin_v_heads) * size_t(c.lin_v_dim) * size_t(c.lin_k_dim);
  const size_t per = size_t(c.n_kv_heads) * size_t(c.head_dim) * 2;  // bytes of one token's K (or V) row
  kv_layer_bytes_ = 2 * per;
  auto attn = [&](size_t l) { return l == L || c.layer_kinds[l] == LayerKind::FullAttention; };
  size_t total = 0;
  for (size_t l = 0; l < rows; ++l)
    if (attn(l)) {
      total += 2 * al256(per * size_t(cap));
      if (l < L) kv_bytes_per_token_ += 2 * per;
    } else {
      fixed_bytes_ += 4 * (conv_n_ + S_n_);
    }
  kv_region_bytes = total;
  char* p = static_cast<char*>(dev_->alloc(total));
  kv_region = p;
  for (size_t l = 0; l < rows; ++l)
    if (attn(l)) {
      k[l] = reinterpret_cast<uint16_t*>(p); p += al256(per * size_t(cap));
      v[l] = reinterpret_cast<uint16_t*>(p); p += al256(per * size_t(cap));
    }
  try {
    if (rows > L) hprime_ = static_cast<float*>(dev_->alloc(4 * size_t(H_)));
    alloc_ring(1);
  } catch (...) {
    dev_->free(kv_region, kv_region_bytes);
    dev_->free(hprime_, 4 * size_t(H_));
    throw;
  }
  reset();
}

CudaState::~CudaState() {
  cudaStreamSynchronize(dev_->stream);  // no queued step still reads or writes the buffers
  be_.release_slot(slot_);
  dev_->free(kv_region, kv_region_bytes);
  dev_->free(ring_region, ring_region_bytes);
  dev_->free(hidden_, 4 * size_t(hidden_cap_) * size_t(H_));
  dev_->free(hprime_, 4 * size_t(H_));
  const size_t V = size_t(be_.w_->cfg.vocab);
  dev_->free(counts_, 4 * V);
  dev_->free(bias_, 4 * V);
  dev_->free(mask_, 8 * ((V + 63) / 64));
}

// Version rings of R versions per DeltaNet layer (conv, then S), zeroed.
void CudaState::alloc_ring(int R) {
  const ModelConfig& c = be_.w_->cfg;
  const size_t L = size_t(c.layers);
  const size_t cb = al256(4 * conv_n_ * size_t(R)), sb = al256(4 * S_n_ * size_t(R));
  size_t total = 0;
  for (size_t l = 0; l < L; ++l)
    if (c.layer_kinds[l] == LayerKind::LinearAttention) total += cb + sb;
  char* p = static_cast<char*>(dev_->alloc(total));
  LILY_CU(cudaMemsetAsync(p, 0, total, dev_->stream));
  ring_region = p;
  ring_region_bytes = total;
  for (size_t l = 0; l < L; ++l)
    if (c.layer_kinds[l] == LayerKind::LinearAttention) {
      conv[l] = reinterpret_cast<float*>(p); p += cb;
      S[l] = reinterpret_cast<float*>(p); p += sb;
    }
  R_ = R;
  cur_ = 0;
}

DevSlotLayer CudaState::table_entry(size_t l) const {
  DevSlotLayer e;
  e.k = k[l];
  e.v = v[l];
  e.cap = cap_;
  e.conv = conv[l];
  e.S = S[l];
  if (l == size_t(be_.w_->cfg.layers)) {  // the MTP row
    e.hidden = hidden_;
    e.hprime = hprime_;
  }
  return e;
}

void CudaState::commit(int64_t n) {
  if (n < 0 || n > pending_)
    throw InternalError(fmt::format("commit({}) with {} tentative rows pending", n, pending_));
  n_ += n;
  cur_ = ver(int(n));
  pending_ = 0;
  hidden_n_ = std::min(hidden_n_, n);
}

void CudaState::reserve_tentative(int rows) {
  if (rows < 0 || rows > kMaxTentativeRows)
    throw InternalError(fmt::format("reserve_tentative({}): at most {} rows", rows, kMaxTentativeRows));
  if (pending_ > 0) throw InternalError("reserve_tentative with tentative rows pending");
  if (rows + 1 <= R_) return;
  const ModelConfig& c = be_.w_->cfg;
  void* old = ring_region;
  const size_t old_bytes = ring_region_bytes;
  const std::vector<float*> oc = conv, os = S;
  const int oc_cur = cur_;
  alloc_ring(rows + 1);  // version 0 takes the current state
  for (size_t l = 0; l < size_t(c.layers); ++l)
    if (c.layer_kinds[l] == LayerKind::LinearAttention) {
      LILY_CU(cudaMemcpyAsync(conv[l], oc[l] + size_t(oc_cur) * conv_n_, 4 * conv_n_, cudaMemcpyDeviceToDevice, dev_->stream));
      LILY_CU(cudaMemcpyAsync(S[l], os[l] + size_t(oc_cur) * S_n_, 4 * S_n_, cudaMemcpyDeviceToDevice, dev_->stream));
    }
  be_.put_slot_table(*this);
  be_.drop_slot_graphs(slot_);
  dev_->sync();  // queued steps may still read the old ring
  dev_->free(old, old_bytes);
}

void CudaState::reset() {
  LILY_CU(cudaMemsetAsync(ring_region, 0, ring_region_bytes, dev_->stream));  // KV rows past n are never read
  n_ = 0;
  pending_ = 0;
  cur_ = 0;
  fed_ = false;
  mtp_n_ = hidden_n_ = 0;
  has_mtp_h_ = false;
}

// The table rows of a snapshot: every layer, then the MTP layer (as an attention layer of mtp_n rows).
namespace {
bool attn_row(const ModelConfig& c, size_t l) { return l == size_t(c.layers) || c.layer_kinds[l] == LayerKind::FullAttention; }
}  // namespace

std::unique_ptr<StateSnapshot> CudaState::snapshot() const {
  if (pending_ > 0) throw InternalError("snapshot with tentative rows pending");
  const ModelConfig& c = be_.w_->cfg;
  const size_t rows = be_.table_rows();
  const size_t row = size_t(c.head_dim) * 2;  // bytes of one head's row
  auto s = std::make_unique<CudaSnapshot>();
  s->dev = dev_;
  s->w = be_.w_;
  s->owner = &be_;
  s->n = n_;
  s->mtp_n = mtp_n_;
  s->off.resize(rows);
  size_t total = 0;
  for (size_t l = 0; l < rows; ++l) {
    s->off[l] = total;
    const size_t kvn = size_t(c.n_kv_heads) * row * size_t(l == size_t(c.layers) ? mtp_n_ : n_);
    total += attn_row(c, l) ? 2 * al256(kvn) : al256(4 * conv_n_) + al256(4 * S_n_);
  }
  s->mem = dev_->alloc(total);
  s->bytes = total;
  char* base = static_cast<char*>(s->mem);
  for (size_t l = 0; l < rows; ++l) {
    char* d = base + s->off[l];
    if (attn_row(c, l)) {
      const size_t n = size_t(l == size_t(c.layers) ? mtp_n_ : n_), kvn = size_t(c.n_kv_heads) * row * n;
      if (n == 0) continue;
      LILY_CU(cudaMemcpy2DAsync(d, row * n, k[l], row * size_t(cap_), row * n, size_t(c.n_kv_heads),
                                cudaMemcpyDeviceToDevice, dev_->stream));
      LILY_CU(cudaMemcpy2DAsync(d + al256(kvn), row * n, v[l], row * size_t(cap_), row * n, size_t(c.n_kv_heads),
                                cudaMemcpyDeviceToDevice, dev_->stream));
    } else {
      LILY_CU(cudaMemcpyAsync(d, conv_at(l, cur_), 4 * conv_n_, cudaMemcpyDeviceToDevice, dev_->stream));
      LILY_CU(cudaMemcpyAsync(d + al256(4 * conv_n_), S_at(l, cur_), 4 * S_n_, cudaMemcpyDeviceToDevice, dev_->stream));
    }
  }
  return s;
}

void CudaState::restore(const StateSnapshot& snap) {
  auto* s = dynamic_cast<const CudaSnapshot*>(&snap);
  if (!s || s->owner != &be_) throw InternalError("CudaState::restore: snapshot from another backend");
  if (s->n > cap_ || s->mtp_n > cap_)
    fail("cannot restore a snapshot of {} tokens into a context of {}", std::max(s->n, s->mtp_n), cap_);
  if (pending_ > 0) throw InternalError("restore with tentative rows pending");
  const ModelConfig& c = be_.w_->cfg;
  const size_t row = size_t(c.head_dim) * 2;
  const char* base = static_cast<const char*>(s->mem);
  for (size_t l = 0; l < be_.table_rows(); ++l) {
    const char* d = base + s->off[l];
    if (attn_row(c, l)) {
      const size_t n = size_t(l == size_t(c.layers) ? s->mtp_n : s->n), kvn = size_t(c.n_kv_heads) * row * n;
      if (n == 0) continue;
      LILY_CU(cudaMemcpy2DAsync(k[l], row * size_t(cap_), d, row * n, row * n, size_t(c.n_kv_heads),
                                cudaMemcpyDeviceToDevice, dev_->stream));
      LILY_CU(cudaMemcpy2DAsync(v[l], row * size_t(cap_), d + al256(kvn), row * n, row * n, size_t(c.n_kv_heads),
                                cudaMemcpyDeviceToDevice, dev_->stream));
    } else {
      LILY_CU(cudaMemcpyAsync(conv_at(l, cur_), d, 4 * conv_n_, cudaMemcpyDeviceToDevice, dev_->stream));
      LILY_CU(cudaMemcpyAsync(S_at(l, cur_), d + al256(4 * conv_n_), 4 * S_n_, cudaMemcpyDeviceToDevice, dev_->stream));
    }
  }
  n_ = s->n;
  mtp_n_ = s->mtp_n;
  hidden_n_ = 0;  // a restored sequence keeps no hidden rows and has no h'
  has_mtp_h_ = false;
  pending_ = 0;
  fed_ = false;
}

// ---------------------------------------------------------------------------------------------
CudaSnapshot::~CudaSnapshot() {
  cudaStreamSynchronize(dev->stream);  // copies into or out of it may be queued
  dev->free(mem, bytes);
}

std::vector<float> CudaSnapshot::contents() const {
  const ModelConfig& c = w->cfg;
  dev->sync();
  std::vector<char> h(bytes);
  LILY_CU(cudaMemcpy(h.data(), mem, bytes, cudaMemcpyDeviceToHost));
  const size_t Hkv = size_t(c.n_kv_heads), hd = size_t(c.head_dim);
  const size_t conv_n = size_t(c.conv_kernel - 1) * size_t(c.conv_channels());
  const size_t S_n = size_t(c.lin_v_heads) * size_t(c.lin_v_dim) * size_t(c.lin_k_dim);
  std::vector<float> out;
  for (size_t l = 0; l < off.size(); ++l) {
    const char* d = h.data() + off[l];
    if (attn_row(c, l)) {
      const size_t nn = size_t(l == size_t(c.layers) ? mtp_n : n), kvn = Hkv * hd * 2 * nn;
      for (int part = 0; part < 2; ++part) {  // [Hkv][n][hd] bf16 -> [n][Hkv·hd] float
        const auto* src = reinterpret_cast<const uint16_t*>(d + (part ? al256(kvn) : 0));
        for (size_t t = 0; t < nn; ++t)
          for (size_t hh = 0; hh < Hkv; ++hh)
            for (size_t e = 0; e < hd; ++e) out.push_back(bf16_to_f32(src[(hh * nn + t) * hd + e]));
      }
    } else {
      const auto* cv = reinterpret_cast<const float*>(d);
      const auto* sv = reinterpret_cast<const float*>(d + al256(4 * conv_n));
      out.insert(out.end(), cv, cv + conv_n);
      out.insert(out.end(), sv, sv + S_n);
    }
  }
  return out;
}

}  // namespace lily::cuda
