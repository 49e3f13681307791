// CudaBackend: the device sampler per sequence (Backend::set_sampling / set_mask): each slot's parameters,
// penalty counts, logit bias and allowed-id mask in the slot's SampleSlot (sample.h), and the per-row
// scratch of the batched sampler.
#include <fmt/format.h>

#include <cstddef>
#include <vector>

#include "backend/cuda/cuda_impl.h"
#include "core/error.h"

namespace lily::cuda {

void CudaBackend::ensure_sampler_rows(int rows) {
  if (rows <= samp_.rows) return;
  const int V = int(w_->cfg.vocab);
  const int n = std::max(rows, std::max(4, 2 * samp_.rows));
  dev_->sync();
  drop_graphs();
  dev_->free(samp_mem_, samp_bytes_);
  samp_mem_ = nullptr;
  samp_bytes_ = 0;
  samp_ = SampleDev{};
  samp_bytes_ = sample_bytes(V, n);
  samp_mem_ = dev_->alloc(samp_bytes_);
  samp_ = sample_layout(samp_mem_, V, n);
}

void CudaBackend::put_sample_slot(const CudaState& st, const SampleSlot& e) {
  // every field but the device-kept RNG counter, which restarts at 0 with new parameters
  SampleSlot z = e;
  z.step = 0;
  upload_async(samp_slots_ + st.slot_, &z, sizeof(SampleSlot));
}

void CudaBackend::set_sampling(SequenceState& seq, const DeviceSampling& p, std::span<const int32_t> history) {
  CudaState& st = own(seq, "set_sampling");
  const int V = int(w_->cfg.vocab);
  if (!can_sample()) throw InternalError(fmt::format("CUDA sampling: a vocabulary of {} ids exceeds the sampler's {}", V, kSampleMaxVocab));
  if (p.vocab_limit < 0) throw InternalError(fmt::format("set_sampling: vocab_limit {} is negative", p.vocab_limit));
  if (!st.counts_) st.counts_ = static_cast<int32_t*>(dev_->alloc(4 * size_t(V)));
  std::vector<int32_t> counts(size_t(V), 0);
  for (int32_t t : history)
    if (t >= 0 && t < V) ++counts[size_t(t)];
  upload_async(st.counts_, counts.data(), 4 * size_t(V));
  SampleSlot e;
  e.p.temperature = p.temperature;
  e.p.top_k = p.top_k;
  e.p.top_p = p.top_p;
  e.p.min_p = p.min_p;
  e.p.repetition_penalty = p.repetition_penalty;
  e.p.presence_penalty = p.presence_penalty;
  e.p.frequency_penalty = p.frequency_penalty;
  e.p.seed = p.seed;
  e.p.vocab_limit = p.vocab_limit >= V ? 0 : p.vocab_limit;
  e.counts = st.counts_;
  bool biased = false;
  if (!p.logit_bias.empty()) {
    std::vector<float> bias(size_t(V), 0.0f);
    for (auto [id, b] : p.logit_bias)
      if (id >= 0 && id < V) {
        bias[size_t(id)] += b;
        biased = true;
      }
    if (biased) {
      if (!st.bias_) st.bias_ = static_cast<float*>(dev_->alloc(4 * size_t(V)));
      upload_async(st.bias_, bias.data(), 4 * size_t(V));
      e.bias = st.bias_;
    }
  }
  e.mask = st.mask_;
  e.mask_on = 0;
  put_sample_slot(st, e);
  st.sampler_ = true;
  st.mask_on_ = false;
  st.greedy_plain_ = p.temperature == 0.0f && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f &&
                     p.frequency_penalty == 0.0f && e.p.vocab_limit == 0 && !biased;
}

void CudaBackend::set_mask(SequenceState& seq, std::span<const uint64_t> mask) {
  CudaState& st = own(seq, "set_mask");
  if (!st.sampler_) throw InternalError("set_mask: set_sampling was not called for the sequence");
  const size_t words = (size_t(w_->cfg.vocab) + 63) / 64;
  struct {
    const uint64_t* mask;
    int32_t on;
  } part{nullptr, 0};
  static_assert(offsetof(SampleSlot, mask_on) == offsetof(SampleSlot, mask) + sizeof(void*), "mask_on follows mask");
  if (!mask.empty()) {
    if (mask.size() < words)
      throw InternalError(fmt::format("set_mask: {} words cover {} ids, the vocabulary has {}", mask.size(), mask.size() * 64,
                                      w_->cfg.vocab));
    if (!st.mask_) st.mask_ = static_cast<uint64_t*>(dev_->alloc(8 * words));
    upload_async(st.mask_, mask.data(), 8 * words);
    part.mask = st.mask_;
    part.on = 1;
  }
  upload_async(reinterpret_cast<char*>(samp_slots_ + st.slot_) + offsetof(SampleSlot, mask), &part,
               sizeof(void*) + sizeof(int32_t));
  st.mask_on_ = part.on != 0;
}

}  // namespace lily::cuda
