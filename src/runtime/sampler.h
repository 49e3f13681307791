// Token sampling on the host. Greedy when temperature == 0; otherwise penalties, temperature,
// top-k, top-p, min-p, then a draw from a seeded generator (same seed, same tokens).
//
// Semantics (the plain definition, a full sort): candidates in the order (logit desc, id asc); top-k
// keeps the first k; probabilities exp((l - max) / T) normalised over the top-k set (all ids without
// top-k); min-p keeps the prefix with p >= p_max · min_p; top-p the shortest prefix whose mass reaches
// top_p; the draw walks the kept prefix in order. The selection never sorts the vocabulary: one pass
// finds the maximum, one computes every exp (vectorised) and a histogram of the mass over logit bins;
// the top-p cut and the draw fall in one bin, and only that bin is ordered (and the kept set, when it
// holds at most `sort_limit` ids). Kept sets and probabilities equal the full sort's up to rounding
// (sums in another order; exp within ~1 ulp of std::exp).
#pragma once
#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <vector>

namespace lily {

struct SamplingParams {
  float temperature = 0.0f;
  int top_k = 0;               // 0: off
  float top_p = 1.0f;          // 1: off
  float min_p = 0.0f;          // 0: off
  float repetition_penalty = 1.0f;  // llama.cpp/HF style: divides positive logits of seen tokens
  float presence_penalty = 0.0f;    // OpenAI style, subtracted once per seen token
  float frequency_penalty = 0.0f;   // OpenAI style, subtracted per occurrence
  std::optional<uint64_t> seed;     // unset: from std::random_device
};

// Throws InputError naming the parameter when out of range.
void validate(const SamplingParams& p);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& p);
  // `sort_limit`: kept sets of more ids are drawn from without ordering them (tests make it small).
  Sampler(const SamplingParams& p, size_t sort_limit);
  // `history`: tokens the penalties apply to (prompt + generated, as the caller chooses).
  // Logits must not be NaN or +inf, and (temperature > 0) not all -inf: InternalError.
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history = {});
  // The distribution sample() would draw from (no draw is made): the kept ids in draw order and their
  // probabilities renormalised over the kept set; greedy: the one id with probability 1.
  std::vector<std::pair<int32_t, double>> distribution(std::span<const float> logits, std::span<const int32_t> history = {});
  const SamplingParams& params() const { return p_; }
  // The generator's next uniform in [0, 1), and a draw from `dist` (probabilities summing to ~1), for
  // speculative verification (runtime/verify.h): same seed, same draws.
  double uniform();
  int32_t draw(std::span<const std::pair<int32_t, double>> dist);

  static constexpr size_t kDefaultSortLimit = 4096;
  static constexpr int kBins = 1024;  // logit bins of the mass histogram

 private:
  struct Cand {
    float l;
    int32_t id;
    double e;  // exp((l - max) / T)
  };
  SamplingParams p_;
  size_t sort_limit_;
  std::mt19937_64 rng_;
  // Scratch reused across calls (sized to the vocabulary).
  std::vector<float> work_;       // penalised logits
  std::vector<int32_t> counts_;   // history occurrences per id (zero between calls)
  std::vector<float> sub_l_;      // the top-k subset: logits and ids
  std::vector<int32_t> sub_id_;
  std::vector<double> bin_mass_;
  std::vector<uint32_t> bin_count_;
  std::vector<Cand> scratch_;     // the cut bin (the top-k candidates while selecting them)
  std::vector<Cand> draw_;        // the bin a draw falls in
  // The selection of the last call.
  std::span<const float> sel_l_;  // candidate logits (the vocabulary or the top-k subset)
  const int32_t* sel_id_ = nullptr;  // their ids (null: the index is the id)
  // exp((l - max) / T) and the histogram bin of logit l (kBins: cut by min-p). Every pass that needs
  // them evaluates these same expressions, so a candidate always lands in the same bin.
  struct Binning {
    float mx = 0, scale = 0;  // the largest candidate logit; bins per logit unit
    double inv_t = 1, log_min_p = 0;
    inline double mass(float l) const;
    inline uint16_t bin(float l) const;
  };
  Binning bins_;
  double z_ = 0;                  // sum of e over the candidates
  size_t kept_ = 0;               // kept ids
  double kept_mass_ = 0;          // sum of e over the kept ids
  int cut_bin_ = -1;              // bin holding the last kept id (-1: every candidate of a bin < kBins)
  size_t cut_pos_ = 0;            // its position in that bin's order (scratch_[0, cut_pos_] are kept)
  int32_t cut_id_ = -1;           // the last kept id
  bool cut_whole_ = false;        // scratch_ holds every bin up to the cut bin (ordered), not only it
  std::vector<Cand> kept_sorted_; // the kept set in draw order when materialised
  bool sorted_ = false;

  std::span<const float> penalised(std::span<const float> logits, std::span<const int32_t> history);
  void select(std::span<const float> logits, bool materialise);
  void gather(int lo, int hi, std::vector<Cand>& out) const;  // the candidates of bins [lo, hi] (index order)
  void materialise();
  int32_t id_of(size_t i) const { return sel_id_ ? sel_id_[i] : int32_t(i); }

};

// log-softmax of `logits` at `token`, and the top-n (token, logprob) pairs, highest first.
float token_logprob(std::span<const float> logits, int32_t token);
std::vector<std::pair<int32_t, float>> top_logprobs(std::span<const float> logits, int n);

namespace detail {
// exp(x) for x <= 0 within ~1 ulp of std::exp, branch-free (loops over it vectorise); 0 below -708.
double exp_nonpos(double x);
}  // namespace detail

}  // namespace lily
