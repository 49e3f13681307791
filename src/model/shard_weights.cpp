// Rank shares (model/shard.h): each matrix cut by rows (output features) or columns (input features) in
// its own format; views where the storage allows, gathered copies otherwise. A shapes-only share (or a
// source without storage, as the on-device synth builds) carries sizes and formats but no data.
#include <fmt/format.h>

#include <cstring>

#include "core/error.h"
#include "model/shard.h"
#include "quant/affine/affine.h"
#include "quant/exl3/exl3.h"

namespace lily {

namespace {

struct Cutter {
  std::vector<std::shared_ptr<void>>& owned;
  bool shapes_only = false;

  template <typename T>
  T* buffer(size_t n) {
    auto b = std::shared_ptr<T[]>(new T[std::max<size_t>(n, 1)]);
    owned.push_back(std::shared_ptr<void>(b, b.get()));
    return b.get();
  }

  static bool has_data(const Linear& l) {
    switch (l.format) {
      case WeightFormat::Dense: return l.dense.data != nullptr;
      case WeightFormat::Affine: return l.affine && l.affine->packed != nullptr;
      case WeightFormat::Exl3: return l.exl3 && l.exl3->trellis != nullptr;
    }
    return false;
  }

  // Output rows `rs` (in order) of src.
  Linear rows(const Linear& src, const std::vector<Range>& rs) {
    if (src.empty()) return src;
    int64_t n = 0;
    for (const Range& r : rs) {
      if (r.begin < 0 || r.end > src.out || r.size() <= 0) throw InternalError(fmt::format("{}: bad row range", src.name));
      n += r.size();
    }
    if (rs.size() == 1 && rs[0].begin == 0 && rs[0].end == src.out) return src;
    const bool copy = !shapes_only && has_data(src);
    Linear l = src;
    l.out = n;
    if (src.format == WeightFormat::Dense) {
      const size_t es = dtype_size(src.dense.dtype);
      const auto* base = static_cast<const uint8_t*>(src.dense.data);
      if (rs.size() == 1) {
        l.dense.data = base ? base + size_t(rs[0].begin * src.dense.row_stride) * es : nullptr;
        return l;
      }
      uint8_t* d = copy ? buffer<uint8_t>(size_t(n * src.in) * es) : nullptr;
      l.dense = {src.dense.dtype, d, src.in};
      for (const Range& r : rs)
        for (int64_t i = r.begin; copy && i < r.end; ++i, d += size_t(src.in) * es)
          std::memcpy(d, base + size_t(i * src.dense.row_stride) * es, size_t(src.in) * es);
      return l;
    }
    if (src.format == WeightFormat::Affine) {
      const quant::AffineWeight& a = *src.affine;
      const int64_t G = a.groups();
      const size_t ss = dtype_size(a.scale_dtype);
      auto q = std::make_shared<quant::AffineWeight>(a);
      q->out = n;
      if (rs.size() == 1) {  // rows are contiguous: a view
        const int64_t b = rs[0].begin;
        if (a.packed) q->packed = a.packed + b * a.row_words;
        if (a.scales) q->scales = static_cast<const uint8_t*>(a.scales) + size_t(b * G) * ss;
        if (a.biases) q->biases = static_cast<const uint8_t*>(a.biases) + size_t(b * G) * ss;
      } else {
        uint32_t* p = copy ? buffer<uint32_t>(size_t(n * a.row_words)) : nullptr;
        uint8_t* sc = copy ? buffer<uint8_t>(size_t(n * G) * ss) : nullptr;
        uint8_t* bi = copy ? buffer<uint8_t>(size_t(n * G) * ss) : nullptr;
        q->packed = p;
        q->scales = sc;
        q->biases = bi;
        int64_t o = 0;
        for (const Range& r : rs)
          for (int64_t i = r.begin; copy && i < r.end; ++i, ++o) {
            std::memcpy(p + o * a.row_words, a.packed + i * a.row_words, size_t(a.row_words) * 4);
            std::memcpy(sc + size_t(o * G) * ss, static_cast<const uint8_t*>(a.scales) + size_t(i * G) * ss, size_t(G) * ss);
            std::memcpy(bi + size_t(o * G) * ss, static_cast<const uint8_t*>(a.biases) + size_t(i * G) * ss, size_t(G) * ss);
          }
      }
      l.affine = std::move(q);
      return l;
    }
    return exl3_rows(src, rs, n, copy);
  }

  // EXL3 output rows: the 128-wide blocks of the padded output that hold them (trellis tile columns, svh and
  // bias gathered), the rows mapped into them; where a range does not start on a block (or the source
  // already selects its outputs) the whole product stays and its outputs are selected.
  Linear exl3_rows(const Linear& src, const std::vector<Range>& rs, int64_t n, bool copy) {
    const quant::Exl3Weight& x = *src.exl3;
    Linear l = src;
    l.out = n;
    auto q = std::make_shared<quant::Exl3Weight>(x);
    q->out = n;
    bool blocks = x.out_rows == nullptr;
    for (const Range& r : rs) blocks = blocks && r.begin % 128 == 0 && (r.end % 128 == 0 || r.end == x.out);
    int32_t* map = buffer<int32_t>(size_t(n));
    if (!blocks) {  // keep the product, select the outputs
      int64_t o = 0;
      for (const Range& r : rs)
        for (int64_t i = r.begin; i < r.end; ++i) map[o++] = int32_t(x.out_rows ? x.out_rows[i] : i);
      q->out_rows = map;
      l.exl3 = std::move(q);
      return l;
    }
    int64_t cols = 0;  // padded output columns of the share
    for (const Range& r : rs) cols += (r.end + 127) / 128 * 128 - r.begin;
    const int64_t tk = x.tiles_k(), tn = x.tiles_n(), tw = 16 * x.K;
    uint16_t* tr = copy ? buffer<uint16_t>(size_t(tk * (cols / 16) * tw)) : nullptr;
    uint16_t* sv = copy ? buffer<uint16_t>(size_t(cols)) : nullptr;
    uint16_t* bi = copy && x.bias ? buffer<uint16_t>(size_t(cols)) : nullptr;
    int64_t c0 = 0, o = 0;
    bool identity = true;
    for (const Range& r : rs) {
      const int64_t w = (r.end + 127) / 128 * 128 - r.begin;
      for (int64_t i = r.begin; i < r.end; ++i, ++o) {
        map[o] = int32_t(c0 + i - r.begin);
        identity = identity && map[o] == o;
      }
      if (copy) {
        for (int64_t ti = 0; ti < tk; ++ti)
          std::memcpy(tr + (ti * (cols / 16) + c0 / 16) * tw, x.trellis + (ti * tn + r.begin / 16) * tw, size_t(w / 16 * tw) * 2);
        std::memcpy(sv + c0, x.svh + r.begin, size_t(w) * 2);
        if (bi) std::memcpy(bi + c0, x.bias + r.begin, size_t(w) * 2);
      }
      c0 += w;
    }
    q->out_p = cols;
    q->trellis = tr;
    q->svh = sv;
    q->bias = x.bias ? bi : nullptr;
    q->out_rows = identity ? nullptr : map;
    l.exl3 = std::move(q);
    return l;
  }

  // Input columns [c.begin, c.end) of src; `bias`: this share keeps the bias (one rank of a sum does).
  Linear cols(const Linear& src, Range c, bool bias) {
    if (src.empty() || (c.begin == 0 && c.end == src.in)) return src;
    const bool copy = !shapes_only && has_data(src);
    Linear l = src;
    l.in = c.size();
    if (src.format == WeightFormat::Dense) {
      if (src.dense.data)
        l.dense.data = static_cast<const uint8_t*>(src.dense.data) + size_t(c.begin) * dtype_size(src.dense.dtype);
      return l;
    }
    if (src.format == WeightFormat::Affine) {
      const quant::AffineWeight& a = *src.affine;
      if (c.begin % a.group_size != 0 || c.end % a.group_size != 0)
        throw InternalError(fmt::format("{}: column cut [{}, {}) off the affine groups", src.name, c.begin, c.end));
      const int64_t w0 = c.begin * a.bits / 32, words = c.size() * a.bits / 32, g0 = c.begin / a.group_size,
                    G = c.size() / a.group_size, Gs = a.groups();
      const size_t ss = dtype_size(a.scale_dtype);
      auto q = std::make_shared<quant::AffineWeight>(a);
      q->in = c.size();
      q->row_words = words;
      uint32_t* p = copy ? buffer<uint32_t>(size_t(a.out * words)) : nullptr;
      uint8_t* sc = copy ? buffer<uint8_t>(size_t(a.out * G) * ss) : nullptr;
      uint8_t* bi = copy ? buffer<uint8_t>(size_t(a.out * G) * ss) : nullptr;
      for (int64_t r = 0; copy && r < a.out; ++r) {
        std::memcpy(p + r * words, a.packed + r * a.row_words + w0, size_t(words) * 4);
        std::memcpy(sc + size_t(r * G) * ss, static_cast<const uint8_t*>(a.scales) + size_t(r * Gs + g0) * ss, size_t(G) * ss);
        std::memcpy(bi + size_t(r * G) * ss, static_cast<const uint8_t*>(a.biases) + size_t(r * Gs + g0) * ss, size_t(G) * ss);
      }
      q->packed = p;
      q->scales = sc;
      q->biases = bi;
      l.affine = std::move(q);
      return l;
    }
    const quant::Exl3Weight& x = *src.exl3;
    if (c.begin % 128 != 0 || (c.end % 128 != 0 && c.end != x.in))
      throw InternalError(fmt::format("{}: column cut [{}, {}) off the EXL3 Hadamard blocks", src.name, c.begin, c.end));
    auto q = std::make_shared<quant::Exl3Weight>(x);  // a view: the trellis rows (k tiles) of the range
    const int64_t end_p = c.end == x.in ? x.in_p : c.end;
    q->in = c.size();
    q->in_p = end_p - c.begin;
    if (x.trellis) q->trellis = x.trellis + (c.begin / 16) * x.tiles_n() * 16 * x.K;
    if (x.suh) q->suh = x.suh + c.begin;
    if (!bias) q->bias = nullptr;
    l.exl3 = std::move(q);
    return l;
  }
};

std::vector<float> slice(const std::vector<float>& v, int64_t b, int64_t e, int64_t width = 1) {
  return std::vector<float>(v.begin() + b * width, v.begin() + e * width);
}

void cut_ffn(Cutter& cut, const FfnWeights& F, const FfnCut& fc, const RankPlan& rp, int r, FfnWeights& out) {
  out.moe = F.moe;
  if (F.moe) {
    out.router = F.router;
    out.experts.assign(F.experts.begin() + rp.experts.begin, F.experts.begin() + rp.experts.end);
    out.expert0 = rp.experts.begin;
  }
  if (F.shared.gate.empty()) return;
  if (fc.owner >= 0) {  // whole on one rank
    if (fc.owner == r) {
      out.shared = F.shared;
      out.shared_gate = F.shared_gate;
    }
    return;
  }
  const Range& i = fc.inter[size_t(r)];
  out.shared.gate = cut.rows(F.shared.gate, {i});
  out.shared.up = cut.rows(F.shared.up, {i});
  out.shared.down = cut.cols(F.shared.down, i, r == 0);
  out.shared_gate = F.shared_gate;
}

void cut_layer(Cutter& cut, const ModelConfig& c, const LayerWeights& L, const FfnCut& fc, const RankPlan& rp, int r,
               LayerWeights& out) {
  out.kind = L.kind;
  out.input_norm = L.input_norm;
  out.post_norm = L.post_norm;
  if (L.kind == LayerKind::LinearAttention) {
    const GdnWeights& G = L.gdn;
    GdnWeights& g = out.gdn;
    const int64_t dk = c.lin_k_dim, dv = c.lin_v_dim, kd = c.lin_key_dim(), K = c.conv_kernel;
    const Range k = rp.k_heads, v = rp.v_heads;
    const std::vector<Range> qkv = {{k.begin * dk, k.end * dk}, {kd + k.begin * dk, kd + k.end * dk},
                                    {2 * kd + v.begin * dv, 2 * kd + v.end * dv}};
    g.in_qkv = cut.rows(G.in_qkv, qkv);
    g.in_z = cut.rows(G.in_z, {{v.begin * dv, v.end * dv}});
    g.in_b = cut.rows(G.in_b, {v});
    g.in_a = cut.rows(G.in_a, {v});
    for (const Range& ch : qkv) {
      const auto part = slice(G.conv, ch.begin, ch.end, K);
      g.conv.insert(g.conv.end(), part.begin(), part.end());
    }
    g.dt_bias = slice(G.dt_bias, v.begin, v.end);
    g.A_neg = slice(G.A_neg, v.begin, v.end);
    g.norm = G.norm;
    g.out = cut.cols(G.out, {v.begin * dv, v.end * dv}, r == 0);
  } else {
    const AttnWeights& A = L.attn;
    AttnWeights& a = out.attn;
    const int64_t hd = c.head_dim;
    const Range q = rp.q_heads, kv = rp.kv_heads;
    a.q = cut.rows(A.q, {{q.begin * 2 * hd, q.end * 2 * hd}});
    a.k = cut.rows(A.k, {{kv.begin * hd, kv.end * hd}});
    a.v = cut.rows(A.v, {{kv.begin * hd, kv.end * hd}});
    a.o = cut.cols(A.o, {q.begin * hd, q.end * hd}, r == 0);
    a.q_norm = A.q_norm;
    a.k_norm = A.k_norm;
  }
  cut_ffn(cut, L.ffn, fc, rp, r, out.ffn);
}

}  // namespace

std::shared_ptr<ModelWeights> rank_share(std::shared_ptr<const ModelWeights> w, const ShardPlan& plan, int r, bool shapes_only) {
  if (r < 0 || r >= plan.ranks) throw InternalError(fmt::format("rank_share: rank {} of {}", r, plan.ranks));
  const ModelConfig& c = w->cfg;
  const RankPlan& rp = plan.rank[size_t(r)];
  auto s = std::make_shared<ModelWeights>();
  Cutter cut{s->owned, shapes_only};
  s->cfg = c;
  if (c.n_full_layers() > 0 || w->mtp) {
    s->cfg.n_heads = rp.q_heads.size();
    s->cfg.n_kv_heads = rp.kv_heads.size();
  }
  if (c.n_linear_layers() > 0) {
    s->cfg.lin_k_heads = rp.k_heads.size();
    s->cfg.lin_v_heads = rp.v_heads.size();
  }
  s->rank = r;
  s->ranks = plan.ranks;
  s->vocab0 = rp.vocab.begin;
  s->embed = w->embed;
  s->lm_head = cut.rows(w->lm_head, {rp.vocab});
  s->final_norm = w->final_norm;
  s->rope_inv_freq = w->rope_inv_freq;
  s->layers.resize(w->layers.size());
  for (size_t l = 0; l < w->layers.size(); ++l) cut_layer(cut, c, w->layers[l], plan.ffn[l], rp, r, s->layers[l]);
  if (w->mtp) {
    const MtpWeights& m = *w->mtp;
    MtpWeights& o = s->mtp.emplace();
    o.prefix = m.prefix;
    o.norm_embed = m.norm_embed;
    o.norm_hidden = m.norm_hidden;
    o.fc = m.fc;
    o.final_norm = m.final_norm;
    cut_layer(cut, c, m.layer, plan.ffn[w->layers.size()], rp, r, o.layer);
  }
  s->mtp_absent = w->mtp_absent;
  s->ckpt = w->ckpt;
  s->owned.push_back(std::const_pointer_cast<ModelWeights>(w));  // the views read its storage
  return s;
}

size_t rank_weight_bytes(const ModelWeights& w, const ShardPlan& plan, int r, bool device) {
  auto share = rank_share(std::shared_ptr<const ModelWeights>(&w, [](const ModelWeights*) {}), plan, r, true);
  if (!device) return share->weight_bytes() + share->mtp_weight_bytes();
  size_t n = 0;
  auto add = [&](const Linear& l) {
    if (!l.empty()) n += l.format == WeightFormat::Dense ? size_t(l.out * l.in) * 2 : l.nbytes();
  };
  auto layer = [&](const LayerWeights& L) {
    for (const Linear* l : {&L.gdn.in_qkv, &L.gdn.in_z, &L.gdn.in_b, &L.gdn.in_a, &L.gdn.out, &L.attn.q, &L.attn.k,
                            &L.attn.v, &L.attn.o, &L.ffn.router, &L.ffn.shared_gate, &L.ffn.shared.gate, &L.ffn.shared.up,
                            &L.ffn.shared.down})
      add(*l);
    for (const Expert& e : L.ffn.experts) {
      add(e.gate);
      add(e.up);
      add(e.down);
    }
  };
  add(share->embed);
  if (!share->lm_head.same_storage(share->embed)) add(share->lm_head);
  for (const LayerWeights& L : share->layers) layer(L);
  if (share->mtp) {
    add(share->mtp->fc);
    layer(share->mtp->layer);
  }
  return n;
}

}  // namespace lily
