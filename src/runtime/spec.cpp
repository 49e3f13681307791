#include "runtime/spec.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace lily {

const char* spec_mode_name(SpecMode m) {
  switch (m) {
    case SpecMode::Mtp: return "mtp";
    case SpecMode::Ngram: return "ngram";
    case SpecMode::Off: break;
  }
  return "off";
}

SpecMode parse_spec_mode(const std::string& s, const std::string& what) {
  if (s == "mtp") return SpecMode::Mtp;
  if (s == "ngram") return SpecMode::Ngram;
  if (s == "off") return SpecMode::Off;
  fail("{}: '{}' is not a speculation mode (mtp, ngram or off)", what, s);
}

int parse_spec_depth(const std::string& s, const std::string& what) {
  if (s == "auto") return 0;
  char* end = nullptr;
  const long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || v < 1 || v > kMaxSpecDepth)
    fail("{}: '{}' is not a draft depth (1..{} or auto)", what, s, kMaxSpecDepth);
  return int(v);
}

void validate(const SpecParams& p) {
  if (p.depth < 0 || p.depth > kMaxSpecDepth) fail("spec depth must be 1..{} or auto (got {})", kMaxSpecDepth, p.depth);
  if (p.auto_max < 1 || p.auto_max > kMaxSpecDepth) fail("spec auto_max must be 1..{} (got {})", kMaxSpecDepth, p.auto_max);
  if (!(p.typical >= 0.0f && p.typical < 1.0f)) fail("typical acceptance threshold must be in [0, 1) (got {})", p.typical);
  if (p.lookup_min < 1 || p.lookup_max < p.lookup_min || p.lookup_max > 64)
    fail("prompt lookup n-gram sizes must satisfy 1 <= min <= max <= 64 (got {}..{})", p.lookup_min, p.lookup_max);
  if (p.fallback_match < 0) fail("spec fallback_match must be >= 0 (got {})", p.fallback_match);
  if (p.draft_vocab != 0 && p.draft_vocab < kMinDraftVocab)
    fail("spec draft vocabulary must be 0 (every id) or at least {} ids (got {})", kMinDraftVocab, p.draft_vocab);
}

std::vector<double> SpecStats::acceptance_per_position() const {
  std::vector<double> a(tried.size(), 0.0);
  for (size_t i = 0; i < tried.size(); ++i) a[i] = tried[i] > 0 ? double(hit[i]) / double(tried[i]) : 0.0;
  return a;
}

void SpecStats::add_round(int k, int acc, int evaluated, int out) {
  LILY_ASSERT(k >= 1 && acc >= 0 && acc <= k && evaluated <= k);
  ++rounds;
  drafted += k;
  accepted += acc;
  emitted += out;
  last_depth = k;
  if (tried.size() < size_t(k)) {
    tried.resize(size_t(k), 0);
    hit.resize(size_t(k), 0);
  }
  for (int i = 0; i < evaluated; ++i) ++tried[size_t(i)];
  for (int i = 0; i < acc; ++i) ++hit[size_t(i)];
  if (depth_rounds.size() <= size_t(k)) depth_rounds.resize(size_t(k) + 1, 0);
  ++depth_rounds[size_t(k)];
}

void SpecStats::merge(const SpecStats& o) {
  rounds += o.rounds;
  drafted += o.drafted;
  accepted += o.accepted;
  emitted += o.emitted;
  auto add = [](std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    if (a.size() < b.size()) a.resize(b.size(), 0);
    for (size_t i = 0; i < b.size(); ++i) a[i] += b[i];
  };
  add(tried, o.tried);
  add(hit, o.hit);
  add(depth_rounds, o.depth_rounds);
  if (o.rounds > 0) last_depth = o.last_depth;
  if (mode.empty()) mode = o.mode;
}

nlohmann::ordered_json SpecStats::to_json() const {
  return {{"mode", mode},
          {"rounds", rounds},
          {"drafted", drafted},
          {"accepted", accepted},
          {"acceptance", acceptance()},
          {"tokens_per_round", tokens_per_round()},
          {"acceptance_per_position", acceptance_per_position()},
          {"depth", last_depth},
          {"mean_depth", mean_depth()}};
}

}  // namespace lily
