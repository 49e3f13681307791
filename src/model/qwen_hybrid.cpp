#include "model/qwen_hybrid.h"

#include "core/error.h"

namespace lily {

uint64_t forward(Backend& be, const Step& step) {
  const auto& cfg = be.weights().cfg;
  for (int32_t t : step.tokens)
    if (t != kFedToken && (t < 0 || t >= cfg.vocab)) fail("token id {} is outside the vocabulary [0, {})", t, cfg.vocab);
  for (const StepGroup& g : step.groups) {
    const int64_t at = !g.seq ? 0 : step.mtp ? g.seq->mtp_tokens() : g.seq->n_tokens();
    if (g.seq && at + g.rows > g.seq->capacity())
      fail("context overflow: {} tokens in the cache + {} new exceed the context size {}", at, g.rows, g.seq->capacity());
  }
  if (step.mtp) {
    be.weights().require_mtp();                        // names the missing tensors
    const int L = int(cfg.layers);                     // the MTP layer's index
    be.begin(step);
    be.embed();                                        // x = fc([norm(embed[x]) ‖ norm(h)])
    be.attn_mixer(L);                                  // x += Attn(norm(x)), the MTP KV cache
    be.ffn(L);                                         // x += MoE(norm(x))
    be.head();                                         // h' = norm(x); logits = h' · lm_headᵀ
    return be.end();
  }

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
