// Speculative decoding: a request's parameters (GenParams::spec) and what it measured (GenResult::spec).
// Each round a drafter (runtime/drafter.h) proposes up to k tokens after the sequence; the generation
// loop (runtime/loop.h) verifies them in one tentative step of k + 1 rows [last token, d1..dk] and
// commits the accepted prefix plus the model's own next token (runtime/verify.h). Greedy output equals
// decoding without speculation; sampled output has the same distribution (speculative sampling), except
// with the opt-in typical acceptance.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace lily {

class Drafter;

enum class SpecMode { Off, Mtp, Ngram };
constexpr int kMaxSpecDepth = 16;  // drafted tokens per round (a verification of kMaxSpecDepth + 1 rows)
constexpr int kMinDraftVocab = 256;  // the smallest draft head (SpecParams::draft_vocab) besides 0

struct SpecParams {
  SpecMode mode = SpecMode::Off;
  int depth = 0;           // drafted tokens per round, 1..kMaxSpecDepth; 0: auto (runtime/depth_planner.h)
  int auto_max = 6;        // auto: the deepest round considered
  // Typical acceptance (opt-in, sampled requests only; not lossless): a draft d is accepted when
  // p(d) >= min(t, sqrt(t) · exp(-H(p))) for threshold t in (0, 1); 0: standard speculative sampling.
  float typical = 0.0f;
  // Prompt lookup: the longest suffix of the sequence of lookup_min..lookup_max tokens that occurred
  // before proposes the tokens that followed its most recent occurrence.
  int lookup_min = 2, lookup_max = 8;
  // MTP: draft by prompt lookup instead when the sequence's suffix matches at least this many tokens
  // (0: never).
  int fallback_match = 8;
  // MTP: the draft head covers ids [0, draft_vocab) only, the most frequent in a byte-level BPE vocabulary
  // (ids follow merge order); 0: every id. Lossless either way (the verification decides); a smaller head
  // makes each draft cheaper and misses drafts whose id lies past it.
  int draft_vocab = 0;
  // A drafter for this request instead of the mode's (tests' replay drafter, the bench's oracle).
  std::shared_ptr<Drafter> drafter;

  bool on() const { return mode != SpecMode::Off || drafter != nullptr; }
};

const char* spec_mode_name(SpecMode m);
// "mtp" | "ngram" | "off"; throws InputError naming `what`.
SpecMode parse_spec_mode(const std::string& s, const std::string& what);
// "auto" -> 0, "N" -> N in 1..kMaxSpecDepth; throws InputError naming `what`.
int parse_spec_depth(const std::string& s, const std::string& what);
// Throws InputError naming the field when out of range.
void validate(const SpecParams& p);

// Counts of one request (or summed over many): rounds are verification steps holding drafts.
struct SpecStats {
  int64_t rounds = 0;    // verification rounds with at least one drafted token
  int64_t drafted = 0;   // tokens drafted in them
  int64_t accepted = 0;  // drafts the verification accepted
  int64_t emitted = 0;   // tokens those rounds emitted (accepted drafts + the model's own)
  std::vector<int64_t> tried, hit;  // per draft position i (0-based): drafts verified there / accepted
  std::vector<int64_t> depth_rounds;  // rounds per drafted count (index k, 0..kMaxSpecDepth)
  int last_depth = 0;    // drafted tokens of the latest round
  std::string mode;      // the drafter's name ("" when speculation was off)

  double acceptance() const { return drafted > 0 ? double(accepted) / double(drafted) : 0.0; }
  double tokens_per_round() const { return rounds > 0 ? double(emitted) / double(rounds) : 0.0; }
  // Acceptance at position i given that every earlier position was accepted.
  std::vector<double> acceptance_per_position() const;
  double mean_depth() const { return rounds > 0 ? double(drafted) / double(rounds) : 0.0; }
  // One round: k drafted, `accepted` of them accepted, `evaluated` positions verified (accepted + 1, or
  // fewer when the request ended inside the round), `emitted` tokens out.
  void add_round(int k, int accepted, int evaluated, int emitted);
  void merge(const SpecStats& o);
  // {mode, rounds, drafted, accepted, acceptance, tokens_per_round, acceptance_per_position, depth,
  // mean_depth} for replies, `lily generate --json` and the bench.
  nlohmann::ordered_json to_json() const;
};

}  // namespace lily
