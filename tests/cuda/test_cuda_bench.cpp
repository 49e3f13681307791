// Timing of the CUDA backend on the Qwen3.5-35B-A3B shape in bf16 (random weights built in memory).
// Runs only when LILY_CUDA_BENCH is set (scripts/device/check.sh sets it); prints one table.
// Weight values come from a few shared random pools (host memory stays small); every matrix still has
// its own device copy, and each layer's router is drawn separately so top-k spreads over all experts.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaBench, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <random>

#include <fmt/format.h>

#include "backend/cuda/cuda_backend.h"
#include "core/half.h"
#include "model/qwen_hybrid.h"
#include "model/weights.h"
#include "quant/affine/affine.h"
#include "runtime/engine.h"
#include "runtime/generate.h"
#include "runtime/session.h"
#include "tools/synth.h"

using namespace lily;

namespace {

struct Pools {
  std::vector<std::shared_ptr<void>> keep;
  std::vector<std::shared_ptr<std::vector<uint16_t>>> p;  // by fan-in
  std::vector<int64_t> fan;
  std::mt19937_64 rng{7};
  const uint16_t* get(int64_t out, int64_t in) {
    size_t i = 0;
    while (i < fan.size() && fan[i] != in) ++i;
    const size_t need = size_t(out) * size_t(in);
    if (i == fan.size() || p[i]->size() < need + 4096 * 8) {
      auto v = std::make_shared<std::vector<uint16_t>>(std::max<size_t>(need + 4096 * 8, size_t(1) << 24));
      std::uniform_real_distribution<float> d(-std::sqrt(3.f / float(in)), std::sqrt(3.f / float(in)));
      for (auto& x : *v) x = f32_to_bf16(d(rng));
      if (i == fan.size()) { fan.push_back(in); p.push_back(v); }
      else { keep.push_back(p[i]); p[i] = v; }  // earlier matrices still point into the old pool
    }
    const size_t off = size_t(rng() % 4096) * 8;
    return p[i]->data() + off;
  }
};

int g_bits = 0;  // 0: bf16 matrices; 4 or 8: MLX affine, group 64 (routers stay bf16)

// Random packed codes with scale 2a/(2^bits - 1) and bias -a: weights uniform on [-a, a], a = sqrt(3/in).
Linear affine(Pools& P, const std::string& name, int64_t out, int64_t in) {
  auto a = std::make_shared<quant::AffineWeight>();
  a->bits = g_bits; a->group_size = 64; a->out = out; a->in = in;
  a->row_words = in * g_bits / 32;
  a->packed = reinterpret_cast<const uint32_t*>(P.get(out * 2 * a->row_words, 1));  // 2 bf16 per word, any bits
  const float lim = std::sqrt(3.f / float(in));
  auto sb = std::make_shared<std::vector<uint16_t>>(size_t(out * (in / 64)) * 2);
  for (size_t i = 0; i < sb->size() / 2; ++i) {
    (*sb)[i] = f32_to_bf16(2 * lim / float((1 << g_bits) - 1));
    (*sb)[sb->size() / 2 + i] = f32_to_bf16(-lim);
  }
  a->scale_dtype = DType::BF16;
  a->scales = sb->data();
  a->biases = sb->data() + sb->size() / 2;
  Linear l;
  l.name = name; l.out = out; l.in = in; l.format = WeightFormat::Affine;
  l.affine = std::shared_ptr<const quant::AffineWeight>(a, a.get());
  P.keep.push_back(a);
  P.keep.push_back(sb);
  return l;
}

Linear dense(Pools& P, const std::string& name, int64_t out, int64_t in) {
  if (g_bits) return affine(P, name, out, in);
  Linear l;
  l.name = name; l.out = out; l.in = in; l.format = WeightFormat::Dense;
  l.dense.dtype = DType::BF16; l.dense.data = P.get(out, in); l.dense.row_stride = in;
  return l;
}

std::shared_ptr<ModelWeights> build_35b(int layers) {
  SynthOptions so;
  so.preset = "qwen3.5-35b-a3b";
  auto j = synth_config(so);
  auto w = std::make_shared<ModelWeights>();
  w->cfg = ModelConfig::from_json(j, "bench");
  ModelConfig& c = w->cfg;
  c.layers = layers;
  c.layer_kinds.resize(size_t(layers));
  c.layer_is_moe.resize(size_t(layers), true);
  for (int i = 0; i < layers; ++i) c.layer_kinds[size_t(i)] = (i + 1) % 4 == 0 ? LayerKind::FullAttention : LayerKind::LinearAttention;
  Pools P;
  const int64_t H = c.hidden;
  w->embed = dense(P, "embed", c.vocab, H);
  w->lm_head = dense(P, "lm_head", c.vocab, H);
  if (!g_bits) w->lm_head.dense.data = static_cast<const uint16_t*>(w->lm_head.dense.data) + 8;  // a separate matrix
  w->final_norm.assign(size_t(H), 1.f);
  for (int64_t i = 0; i < c.rotary_dim / 2; ++i)
    w->rope_inv_freq.push_back(float(1.0 / std::pow(c.rope_theta, double(2 * i) / double(c.rotary_dim))));
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  w->layers.resize(size_t(layers));
  for (int l = 0; l < layers; ++l) {
    LayerWeights& L = w->layers[size_t(l)];
    L.kind = c.layer_kinds[size_t(l)];
    L.input_norm.assign(size_t(H), 1.f);
    L.post_norm.assign(size_t(H), 1.f);
    if (L.kind == LayerKind::LinearAttention) {
      const int64_t Cc = c.conv_channels(), VD = c.lin_value_dim();
      L.gdn.in_qkv = dense(P, "qkv", Cc, H);
      L.gdn.in_z = dense(P, "z", VD, H);
      L.gdn.in_b = dense(P, "b", c.lin_v_heads, H);
      L.gdn.in_a = dense(P, "a", c.lin_v_heads, H);
      L.gdn.conv.resize(size_t(Cc * c.conv_kernel));
      for (auto& v : L.gdn.conv) v = 0.5f * nd(rng);
      L.gdn.dt_bias.assign(size_t(c.lin_v_heads), 0.f);
      L.gdn.A_neg.assign(size_t(c.lin_v_heads), -1.f);
      L.gdn.norm.assign(size_t(c.lin_v_dim), 1.f);
      L.gdn.out = dense(P, "out", H, VD);
    } else {
      L.attn.q = dense(P, "q", c.n_heads * 2 * c.head_dim, H);
      L.attn.k = dense(P, "k", c.n_kv_heads * c.head_dim, H);
      L.attn.v = dense(P, "v", c.n_kv_heads * c.head_dim, H);
      L.attn.o = dense(P, "o", H, c.n_heads * c.head_dim);
      L.attn.q_norm.assign(size_t(c.head_dim), 1.f);
      L.attn.k_norm.assign(size_t(c.head_dim), 1.f);
    }
    FfnWeights& F = L.ffn;
    F.moe = true;
    F.router = synth_router(so, l, w->owned);
    F.experts.resize(size_t(c.n_experts));
    for (auto& e : F.experts) {
      e.gate = dense(P, "gate", c.moe_inter, H);
      e.up = dense(P, "up", c.moe_inter, H);
      e.down = dense(P, "down", H, c.moe_inter);
    }
    F.shared.gate = dense(P, "sgate", c.shared_inter, H);
    F.shared.up = dense(P, "sup", c.shared_inter, H);
    F.shared.down = dense(P, "sdown", H, c.shared_inter);
    F.shared_gate = dense(P, "sg", 1, H);
  }
  w->owned.push_back(std::make_shared<Pools>(std::move(P)));
  return w;
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void run_bench(int bits);

TEST(CudaBench, Qwen35_35B_affine4) {
  if (!std::getenv("LILY_CUDA_BENCH")) GTEST_SKIP() << "set LILY_CUDA_BENCH=1 to run";
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  run_bench(4);
}

TEST(CudaBench, Qwen35_35B_bf16) {
  if (!std::getenv("LILY_CUDA_BENCH")) GTEST_SKIP() << "set LILY_CUDA_BENCH=1 to run";
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  run_bench(0);
}

void run_bench(int bits) {
  g_bits = bits;
  const int layers = std::getenv("LILY_BENCH_LAYERS") ? std::atoi(std::getenv("LILY_BENCH_LAYERS")) : 40;
  double t0 = now_s();
  auto w = build_35b(layers);
  EngineOptions eo;
  eo.backend = "cuda";
  auto engine = Engine::from_backend(w, make_cuda_backend(w), eo);
  Backend* be = &engine->backend();
  std::printf("bench: %s, %d layers built and uploaded in %.1f s; %s\n", bits ? "affine4 g64" : "bf16", layers, now_s() - t0,
              cuda_device_info().c_str());
  const int64_t V = w->cfg.vocab;
  std::mt19937 rng(3);
  std::vector<int32_t> prompt(4096);
  for (auto& t : prompt) t = int32_t(rng() % uint32_t(V));
  auto st = be->new_state(4096 + 300);
  std::vector<float> row(static_cast<size_t>(V));
  std::printf("\n| %s | value |\n|---|---|\n", bits ? "affine4" : "bf16");
  for (int64_t P : {512, 4096}) {
    std::vector<double> ts;
    for (int rep = 0; rep < 3; ++rep) {
      st->reset();
      be->synchronize();
      const double a = now_s();
      forward_step(*be, *st, std::span(prompt).first(size_t(P)), 1, row.data());
      be->synchronize();
      ts.push_back(now_s() - a);
    }
    std::sort(ts.begin(), ts.end());
    std::printf("| prefill %lld tokens | %.0f tok/s (%.1f ms, median of 3) |\n", (long long)P, double(P) / ts[1], ts[1] * 1e3);
  }
  // decode at 4K context: the generation loop's device path (greedy drawn on the GPU, the drawn id fed
  // into the next step on the device, steps pipelined)
  for (int rep = 0; rep < 2; ++rep) {
    Session s(*engine, 4096 + 300);
    GenerateOptions go;
    go.max_tokens = 129;
    const GenerateResult r = generate(s, prompt, go);
    const double n = double(r.tokens.size()) - 1;  // decode_seconds runs from the first emitted token
    std::printf("| decode at ctx %lld, generation loop (%s), %.0f steps%s | %.1f tok/s (%.3f ms/token) |\n",
                (long long)(4096), r.device_sampled ? "device sampler" : "host sampler", n,
                rep == 0 ? " (first: includes capture)" : "", n / r.decode_seconds, r.decode_seconds / n * 1e3);
  }
  {
    const int n = 64;
    int32_t tok = 5;
    be->synchronize();
    const double a = now_s();
    for (int i = 0; i < n; ++i) forward_step(*be, *st, std::span(&tok, 1), 1, row.data());
    const double dt = now_s() - a;
    std::printf("| decode at ctx ~4.1K, forward_step + host logits | %.1f tok/s |\n", double(n) / dt);
  }
  if (bits) {  // where a decode step's time goes: every block timed on its own (no graph, synchronised)
    CudaOptions po;
    po.profile = true;
    auto pb = make_cuda_backend(w, po);
    auto ps = pb->new_state(4096 + 64);
    forward_step(*pb, *ps, prompt, 1, row.data());
    auto before = cuda_block_profile(*pb);
    const int n = 16;
    int32_t tok = 7;
    for (int i = 0; i < n; ++i) forward_step(*pb, *ps, std::span(&tok, 1), 1, row.data());
    auto after = cuda_block_profile(*pb);
    std::string line;
    double total = 0;
    for (size_t i = 0; i < after.ms.size(); ++i) {
      double b0 = 0;
      for (auto& [k, v] : before.ms)
        if (k == after.ms[i].first) b0 = v;
      const double per = (after.ms[i].second - b0) / n;
      total += per;
      line += fmt::format("{} {:.3f} ms, ", after.ms[i].first, per);
    }
    std::printf("| decode step, blocks timed apart (no graph), per token | %s total %.3f ms |\n", line.c_str(), total);
  }
  auto ks = cuda_describe_decode_step(*be, 4096);
  std::printf("| kernels per decode step | %zu (%.1f per layer) |\n", ks.size(), double(ks.size()) / layers);
  std::printf("| active weight bytes per token | %.3f GB |\n", double(w->active_bytes_per_token()) / 1e9);
  std::printf("| peak device memory | %.2f GiB |\n", double(be->peak_memory()) / (1 << 30));
}

}  // namespace
#endif
