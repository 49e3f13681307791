#include "backend/rank_driver.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace lily {

std::vector<int> parse_devices(const std::string& s) {
  auto number = [&](const std::string& t) {
    size_t used = 0;
    int v = -1;
    try {
      v = std::stoi(t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (t.empty() || used != t.size() || v < 0) fail("--devices '{}': '{}' is not a device count or a device number", s, t);
    return v;
  };
  std::vector<int> d;
  if (s.find(',') == std::string::npos) {
    const int n = number(s);
    if (n < 1 || n > 64) fail("--devices {}: between 1 and 64 ranks", n);
    for (int i = 0; i < n; ++i) d.push_back(i);
    return d;
  }
  for (size_t i = 0; i <= s.size();) {
    const size_t j = std::min(s.find(',', i), s.size());
    d.push_back(number(s.substr(i, j - i)));
    i = j + 1;
  }
  if (d.size() > 64) fail("--devices '{}': at most 64 ranks", s);
  return d;
}

void HostCollective::all_reduce(std::span<float* const> bufs, size_t n) {
  if (bufs.size() < 2) return;
  float* sum = bufs[0];
  for (size_t r = 1; r < bufs.size(); ++r)
    for (size_t i = 0; i < n; ++i) sum[i] += bufs[r][i];
  for (size_t r = 1; r < bufs.size(); ++r) std::memcpy(bufs[r], sum, n * sizeof(float));
}

void HostCollective::all_gather_columns(std::span<const RankColumns> parts) {
  for (const RankColumns& dst : parts)
    for (const RankColumns& src : parts) {
      if (&src == &dst || src.cols == 0) continue;
      for (int64_t i = 0; i < dst.rows; ++i)
        std::memcpy(dst.data + i * dst.ld + src.col0, src.data + i * src.ld + src.col0, size_t(src.cols) * sizeof(float));
    }
}

namespace {

class TpSnapshot final : public StateSnapshot {
 public:
  int64_t n_tokens() const override { return parts.front()->n_tokens(); }
  size_t nbytes() const override {
    size_t n = 0;
    for (auto& p : parts) n += p->nbytes();
    return n;
  }
  // The ranks' contents one after another.
  std::vector<float> contents() const override {
    std::vector<float> v;
    for (auto& p : parts) {
      auto c = p->contents();
      v.insert(v.end(), c.begin(), c.end());
    }
    return v;
  }
  const TensorParallel* owner = nullptr;
  std::vector<std::unique_ptr<StateSnapshot>> parts;
};

class TpState final : public SequenceState {
 public:
  TpState(const TensorParallel& owner, std::vector<std::unique_ptr<SequenceState>> parts)
      : owner_(&owner), parts_(std::move(parts)) {}
  int64_t n_tokens() const override { return parts_[0]->n_tokens(); }
  int64_t capacity() const override { return parts_[0]->capacity(); }
  int64_t pending() const override { return parts_[0]->pending(); }
  void commit(int64_t n) override {
    for (auto& p : parts_) p->commit(n);
  }
  int max_tentative() const override { return parts_[0]->max_tentative(); }
  void reserve_tentative(int rows) override {
    for (auto& p : parts_) p->reserve_tentative(rows);
  }
  std::unique_ptr<StateSnapshot> snapshot() const override {
    auto s = std::make_unique<TpSnapshot>();
    s->owner = owner_;
    for (auto& p : parts_) s->parts.push_back(p->snapshot());
    return s;
  }
  void restore(const StateSnapshot& snap) override {
    auto* o = dynamic_cast<const TpSnapshot*>(&snap);
    if (!o || o->owner != owner_ || o->parts.size() != parts_.size())
      throw InternalError("snapshot belongs to another backend or model");
    for (size_t r = 0; r < parts_.size(); ++r) parts_[r]->restore(*o->parts[r]);
  }
  void reset() override {
    for (auto& p : parts_) p->reset();
  }
  size_t nbytes() const override {
    size_t n = 0;
    for (auto& p : parts_) n += p->nbytes();
    return n;
  }
  int64_t mtp_tokens() const override { return parts_[0]->mtp_tokens(); }
  void truncate_mtp(int64_t n) override {
    for (auto& p : parts_) p->truncate_mtp(n);
  }
  int64_t hidden_rows() const override { return parts_[0]->hidden_rows(); }

  const TensorParallel* owner_;
  std::vector<std::unique_ptr<SequenceState>> parts_;
};

TpState& own(const TensorParallel* tp, SequenceState& seq, const char* what) {
  auto* st = dynamic_cast<TpState*>(&seq);
  if (!st || st->owner_ != tp) throw InternalError(fmt::format("{}: the sequence state belongs to another backend", what));
  return *st;
}

}  // namespace

TensorParallel::TensorParallel(std::shared_ptr<const ModelWeights> whole, std::vector<std::unique_ptr<RankBackend>> ranks,
                               std::unique_ptr<Collective> coll)
    : w_(std::move(whole)), ranks_(std::move(ranks)), coll_(std::move(coll)) {
  if (ranks_.empty() || !coll_) throw InternalError("TensorParallel: no ranks or no collective");
}

TensorParallel::~TensorParallel() = default;

std::string TensorParallel::name() const { return fmt::format("{}x{}", ranks_[0]->blocks().name(), ranks_.size()); }

std::unique_ptr<SequenceState> TensorParallel::new_state(int64_t max_tokens) {
  std::vector<std::unique_ptr<SequenceState>> parts;
  for (auto& r : ranks_) parts.push_back(r->blocks().new_state(max_tokens));
  return std::make_unique<TpState>(*this, std::move(parts));
}

void TensorParallel::begin(const Step& step) {
  step.validate(w_->cfg.vocab);
  steps_.assign(ranks_.size(), step);
  for (size_t g = 0; g < step.groups.size(); ++g) {
    TpState& st = own(this, *step.groups[g].seq, "TensorParallel::begin");
    for (size_t r = 0; r < ranks_.size(); ++r) steps_[r].groups[g].seq = st.parts_[r].get();
  }
  T_ = step.rows();
  for (size_t r = 0; r < ranks_.size(); ++r) ranks_[r]->blocks().begin(steps_[r]);
}

void TensorParallel::embed() {
  for (auto& r : ranks_) r->blocks().embed();
}

void TensorParallel::reduce() {
  if (ranks_[0]->replaying()) return;
  std::vector<float*> parts;
  for (auto& r : ranks_) parts.push_back(r->partial());
  coll_->all_reduce(parts, size_t(T_) * size_t(w_->cfg.hidden));
  for (auto& r : ranks_) r->add_partial();
}

void TensorParallel::gdn_mixer(int layer) {
  for (auto& r : ranks_) r->blocks().gdn_mixer(layer);
  reduce();
}

void TensorParallel::attn_mixer(int layer) {
  for (auto& r : ranks_) r->blocks().attn_mixer(layer);
  reduce();
}

void TensorParallel::ffn(int layer) {
  for (auto& r : ranks_) r->blocks().ffn(layer);
  reduce();
}

void TensorParallel::head() {
  std::vector<RankColumns> cols;
  for (auto& r : ranks_) {
    r->blocks().head();
    cols.push_back(r->head_columns());
  }
  if (ranks_[0]->replaying()) return;
  if (cols[0].rows > 0) coll_->all_gather_columns(cols);
  for (auto& r : ranks_) r->head_finish();
}

uint64_t TensorParallel::end() {
  std::vector<uint64_t> t;
  for (auto& r : ranks_) t.push_back(r->blocks().end());
  tickets_.push_back({next_ticket_, std::move(t)});
  return next_ticket_++;
}

void TensorParallel::finish(uint64_t ticket, const StepOutputs& out) {
  if (tickets_.empty() || tickets_.front().first != ticket)
    throw InternalError(fmt::format("TensorParallel::finish: ticket {} is not the oldest unfinished step", ticket));
  const std::vector<uint64_t> t = std::move(tickets_.front().second);
  tickets_.erase(tickets_.begin());
  for (size_t r = ranks_.size(); r-- > 0;) ranks_[r]->blocks().finish(t[r], r == 0 ? out : StepOutputs{});
}

bool TensorParallel::can_sample() const { return ranks_[0]->blocks().can_sample(); }

void TensorParallel::set_sampling(SequenceState& seq, const DeviceSampling& p, std::span<const int32_t> history) {
  TpState& st = own(this, seq, "TensorParallel::set_sampling");
  for (size_t r = 0; r < ranks_.size(); ++r) ranks_[r]->blocks().set_sampling(*st.parts_[r], p, history);
}

void TensorParallel::set_mask(SequenceState& seq, std::span<const uint64_t> mask) {
  TpState& st = own(this, seq, "TensorParallel::set_mask");
  for (size_t r = 0; r < ranks_.size(); ++r) ranks_[r]->blocks().set_mask(*st.parts_[r], mask);
}

bool TensorParallel::can_mtp() const {
  return std::all_of(ranks_.begin(), ranks_.end(), [](const auto& r) { return r->blocks().can_mtp(); });
}

void TensorParallel::synchronize() {
  for (auto& r : ranks_) r->blocks().synchronize();
}

size_t TensorParallel::peak_memory() const {
  size_t n = 0;
  for (auto& r : ranks_) n += r->blocks().peak_memory();
  return n;
}

int64_t TensorParallel::preferred_prefill_chunk() const { return ranks_[0]->blocks().preferred_prefill_chunk(); }

double TensorParallel::copy_bandwidth() { return ranks_[0]->blocks().copy_bandwidth(); }

}  // namespace lily
