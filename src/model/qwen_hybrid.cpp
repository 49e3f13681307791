#include "model/qwen_hybrid.h"

#include "core/error.h"

namespace lily {

void forward_step(Backend& be, SequenceState& st, std::span<const int32_t> tokens, int64_t logit_rows, float* logits) {
  const auto& cfg = be.weights().cfg;
  const int64_t T = int64_t(tokens.size());
  LILY_ASSERT(T > 0 && logit_rows >= 0 && logit_rows <= T);
  for (int32_t t : tokens)
    if (t < 0 || t >= cfg.vocab) fail("token id {} is outside the vocabulary [0, {})", t, cfg.vocab);
  if (st.n_tokens() + T > st.capacity())
    fail("context overflow: {} tokens in the cache + {} new exceed the context size {}", st.n_tokens(), T, st.capacity());

  be.begin(st, T);
  be.embed(tokens.data());                             // x = embed_tokens[tokens]
  for (int l = 0; l < int(cfg.layers); ++l) {
    if (cfg.layer_kinds[size_t(l)] == LayerKind::LinearAttention)
      be.gdn_mixer(l);                                 // x += GDN(norm(x))
    else
      be.attn_mixer(l);                                // x += Attn(norm(x))
    be.ffn(l);                                         // x += MoE(norm(x))
  }
  if (logit_rows > 0) be.head(logit_rows, logits);     // logits = norm(x) · lm_headᵀ
  be.end();
}

}  // namespace lily
