#include "model/qwen_hybrid.h"

#include "core/error.h"

namespace lily {

uint64_t forward(Backend& be, const Step& step) {
  const auto& cfg = be.weights().cfg;
  for (int32_t t : step.tokens)
    if (t != kFedToken && (t < 0 || t >= cfg.vocab)) fail("token id {} is outside the vocabulary [0, {})", t, cfg.vocab);
  for (const StepGroup& g : step.groups)
    if (g.seq && g.seq->n_tokens() + g.rows > g.seq->capacity())
      fail("context overflow: {} tokens in the cache + {} new exceed the context size {}", g.seq->n_tokens(), g.rows,
           g.seq->capacity());

  be.begin(step);
  be.embed();                                          // x = embed_tokens[tokens]
  for (int l = 0; l < int(cfg.layers); ++l) {
    if (cfg.layer_kinds[size_t(l)] == LayerKind::LinearAttention)
      be.gdn_mixer(l);                                 // x += GDN(norm(x))
    else
      be.attn_mixer(l);                                // x += Attn(norm(x))
    be.ffn(l);                                         // x += MoE(norm(x))
  }
  be.head();                                           // logits = norm(x) · lm_headᵀ (or ids drawn from them)
  return be.end();
}

void forward_step(Backend& be, SequenceState& st, std::span<const int32_t> tokens, int64_t logit_rows, float* logits) {
  LILY_ASSERT(!tokens.empty() && logit_rows >= 0 && logit_rows <= int64_t(tokens.size()));
  Step step;
  step.add(st, tokens, int32_t(logit_rows));
  be.finish(forward(be, step), StepOutputs{logits, nullptr});
}

}  // namespace lily
