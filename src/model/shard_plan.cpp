// ShardPlan (model/shard.h): which heads, experts, intermediate columns and vocabulary rows each rank holds,
// and the checks that the model divides that way.
#include <fmt/format.h>

#include "core/error.h"
#include "model/shard.h"
#include "quant/affine/affine.h"

namespace lily {

std::vector<Range> balanced_ranges(int64_t total, int n, int64_t align) {
  if (n < 1 || align < 1) throw InternalError("balanced_ranges: bad arguments");
  const int64_t units = (total + align - 1) / align;
  if (units < n) throw InternalError(fmt::format("balanced_ranges: {} units of {} for {} ranges", units, align, n));
  std::vector<Range> r(static_cast<size_t>(n));
  int64_t at = 0;
  for (int i = 0; i < n; ++i) {
    const int64_t u = units / n + (i < units % n ? 1 : 0);
    r[size_t(i)] = {at * align, std::min(total, (at + u) * align)};
    at += u;
  }
  return r;
}

namespace {

// Columns a cut of `W`'s input must fall on (a rank's share of it then starts and ends on them): affine
// groups, EXL3's 128-wide input Hadamard blocks; dense rows stay 16-byte aligned in bf16 (8 columns).
int64_t col_align(const Linear& W) {
  switch (W.format) {
    case WeightFormat::Affine: return W.affine->group_size;
    case WeightFormat::Exl3: return 128;
    default: return 8;
  }
}

std::string describe(const Linear& W) {
  switch (W.format) {
    case WeightFormat::Affine: return fmt::format("affine {}-bit, group size {}", W.affine->bits, W.affine->group_size);
    case WeightFormat::Exl3: return "EXL3, 128-column Hadamard blocks";
    default: return "dense";
  }
}

// `heads` split over n ranks, or copied: each rank's share of `outer` (split evenly) reads one of them.
void heads(int n, int64_t outer, int64_t inner, const char* outer_field, const char* inner_field, bool& copied,
           std::vector<Range>& outer_r, std::vector<Range>& inner_r) {
  if (outer % n != 0) fail("--devices {}: {} = {} is not a multiple of {}", n, outer_field, outer, n);
  outer_r = balanced_ranges(outer, n);
  inner_r.assign(size_t(n), Range{});
  if (inner % n == 0) {
    copied = false;
    inner_r = balanced_ranges(inner, n);
  } else if (n % inner == 0) {
    copied = true;  // rank r's outer heads all read inner head r / (n / inner)
    for (int r = 0; r < n; ++r) {
      const int64_t h = r / (n / inner);
      inner_r[size_t(r)] = {h, h + 1};
    }
  } else {
    fail("--devices {}: {} = {} neither divides by {} nor divides it (its heads can be neither split nor copied)", n,
         inner_field, inner, n);
  }
}

// A matrix whose input columns are cut in pieces of `width` (a rank's heads) must be cut on its format's boundaries.
void check_col_cut(const Linear& W, int n, int64_t width, const char* what) {
  if (W.empty() || n == 1) return;
  const int64_t a = col_align(W);
  if (width % a != 0)
    fail("--devices {}: '{}' ({}) cannot be cut into the ranks' {} input columns each ({}): not a multiple of {}", n, W.name,
         describe(W), width, what, a);
}

FfnCut ffn_cut(const FfnWeights& F, int n, int layer) {
  FfnCut c;
  const Expert& e = F.shared;
  if (e.gate.empty()) return c;
  const int64_t I = e.down.in, a = col_align(e.down);
  if ((I + a - 1) / a >= n) c.inter = balanced_ranges(I, n, a);
  else c.owner = layer % n;  // too narrow to cut on the format's boundaries: whole on one rank
  return c;
}

}  // namespace

ShardPlan ShardPlan::make(const ModelWeights& w, int n) {
  const ModelConfig& c = w.cfg;
  if (n < 1) fail("--devices: {} ranks (at least 1)", n);
  ShardPlan p;
  p.ranks = n;
  p.rank.resize(size_t(n));
  const bool attn = c.n_full_layers() > 0 || w.mtp;
  std::vector<Range> q, kv, k, v, ex, voc;
  if (attn) heads(n, c.n_heads, c.n_kv_heads, "num_attention_heads", "num_key_value_heads", p.kv_copied, q, kv);
  if (c.n_linear_layers() > 0)
    heads(n, c.lin_v_heads, c.lin_k_heads, "linear_num_value_heads", "linear_num_key_heads", p.k_copied, v, k);
  if (c.n_moe_layers() > 0) {
    if (c.n_experts < n) fail("--devices {}: num_experts = {} gives some rank no expert", n, c.n_experts);
    ex = balanced_ranges(c.n_experts, n);
  }
  if (c.vocab < n) fail("--devices {}: vocab_size = {} gives some rank no vocabulary row", n, c.vocab);
  // vocabulary rows in units of 128 (EXL3 output blocks) where the vocabulary allows, else of 4 (16-byte
  // aligned logits columns)
  const int64_t va = c.vocab >= 128 * int64_t(n) ? 128 : c.vocab >= 4 * int64_t(n) ? 4 : 1;
  voc = balanced_ranges(c.vocab, n, va);
  for (int r = 0; r < n; ++r) {
    RankPlan& rp = p.rank[size_t(r)];
    if (attn) { rp.q_heads = q[size_t(r)]; rp.kv_heads = kv[size_t(r)]; }
    if (!v.empty()) { rp.v_heads = v[size_t(r)]; rp.k_heads = k[size_t(r)]; }
    if (!ex.empty()) rp.experts = ex[size_t(r)];
    rp.vocab = voc[size_t(r)];
  }
  auto layer = [&](const LayerWeights& L, int l) {
    if (L.kind == LayerKind::FullAttention) check_col_cut(L.attn.o, n, c.n_heads / n * c.head_dim, "query heads' columns");
    else check_col_cut(L.gdn.out, n, c.lin_v_heads / n * c.lin_v_dim, "value heads' columns");
    p.ffn.push_back(ffn_cut(L.ffn, n, l));
  };
  for (int l = 0; l < int(c.layers); ++l) layer(w.layers[size_t(l)], l);
  if (w.mtp) layer(w.mtp->layer, int(c.layers));
  return p;
}

}  // namespace lily
