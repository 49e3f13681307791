#include "cli/spec_options.h"

#include "core/error.h"

namespace lily::cli {

void add_spec_options(CLI::App& app, SpecArgs& a) {
  app.add_option("--spec", a.mode, "Speculative decoding: mtp (the model's MTP head), ngram (prompt lookup) or off")
      ->capture_default_str();
  app.add_option("--spec-depth", a.depth, "Drafted tokens per round, 1..16, or auto (chosen from measured round costs)")
      ->capture_default_str();
  app.add_option("--spec-typical", a.typical,
                 "Typical acceptance with this threshold for sampled requests (0: off, exact speculative sampling)")
      ->capture_default_str();
  app.add_option("--spec-vocab", a.draft_vocab,
                 "MTP drafts from the first N token ids only (the most frequent in BPE merge order; cheaper drafts, "
                 "output unchanged; 0: every id)")
      ->capture_default_str();
}

SpecParams spec_params(const SpecArgs& a, const ModelWeights& w) {
  SpecParams p;
  p.mode = parse_spec_mode(a.mode, "--spec");
  p.depth = parse_spec_depth(a.depth, "--spec-depth");
  p.typical = a.typical;
  if (!(a.typical >= 0.0f && a.typical < 1.0f)) fail("--spec-typical must be in [0, 1) (got {})", a.typical);
  if (a.draft_vocab != 0 && (a.draft_vocab < kMinDraftVocab || a.draft_vocab > w.cfg.vocab))
    fail("--spec-vocab must be 0 (every id) or {}..{} (the vocabulary) (got {})", kMinDraftVocab, w.cfg.vocab, a.draft_vocab);
  p.draft_vocab = a.draft_vocab;
  validate(p);
  if (p.mode == SpecMode::Mtp) w.require_mtp();
  return p;
}

}  // namespace lily::cli
