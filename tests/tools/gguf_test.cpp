// GGUF encoding, the export layout (names, shapes, norms, ssm_a, value-head order), read back with our reader
// and compared against the safetensors the export came from.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/error.h"
#include "core/half.h"
#include "io/safetensors.h"
#include "model/weights.h"
#include "tools/gguf.h"
#include "tools/gguf_export.h"

namespace lily {
namespace {

namespace fs = std::filesystem;
using gguf::TensorType;

std::string tmp_path(const std::string& name) {
  auto d = fs::temp_directory_path() / ("lily_tools_test_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return (d / name).string();
}

float read_st(const TensorInfo& t, int64_t i) {
  if (t.dtype == DType::F32) { float v; std::memcpy(&v, t.data + 4 * i, 4); return v; }
  uint16_t h;
  std::memcpy(&h, t.data + 2 * i, 2);
  return t.dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}

TEST(Gguf, BlockQuantRoundTripWithinHalfStep) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 1);
  for (int64_t n : {32, 64, 96, 2048}) {
    std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
    for (auto& v : x) v = nd(rng);
    x[5] = 0;  // exact zero stays representable
    for (TensorType t : {TensorType::Q8_0, TensorType::Q4_0}) {
      std::vector<uint8_t> buf(gguf::row_bytes(t, n));
      gguf::encode(t, x.data(), n, buf.data());
      gguf::decode(t, buf.data(), n, y.data());
      for (int64_t b = 0; b < n / 32; ++b) {
        const float* v = x.data() + b * 32;
        float amax = 0, m = 0;
        for (int j = 0; j < 32; ++j)
          if (std::fabs(v[j]) > amax) { amax = std::fabs(v[j]); m = v[j]; }
        // Encoding rounds x / d to the nearest code with the float32 d; decoding multiplies by the fp16 d.
        const size_t bb = t == TensorType::Q8_0 ? 34 : 18;
        uint16_t dh;
        std::memcpy(&dh, buf.data() + size_t(b) * bb, 2);
        const float d = t == TensorType::Q8_0 ? amax / 127 : m / -8, d16 = f16_to_f32(dh);
        const float qmax = t == TensorType::Q8_0 ? 127 : 8;
        for (int j = 0; j < 32; ++j) {
          // Q4_0 codes stop at +7: values beyond 7.5·d on the side opposite m clamp (error up to one step).
          const bool clamped = t == TensorType::Q4_0 && v[j] / d > 7.5f;
          const float bound = (clamped ? std::fabs(v[j] - 7 * d) : 0.5f * std::fabs(d)) + qmax * std::fabs(d - d16) + 1e-6f;
          EXPECT_LE(std::fabs(v[j] - y[size_t(b * 32 + j)]), bound) << gguf::type_name(t) << " n=" << n << " i=" << b * 32 + j;
        }
      }
      // The value of largest magnitude in a Q4_0 block is exactly -8·d (code 0).
      if (t == TensorType::Q4_0) {
        uint16_t dh;
        std::memcpy(&dh, buf.data(), 2);
        float d = f16_to_f32(dh), m = 0;
        for (int j = 0; j < 32; ++j) if (std::fabs(x[size_t(j)]) > std::fabs(m)) m = x[size_t(j)];
        EXPECT_NEAR(-8 * d, m, std::fabs(m) * 1e-3f);
      }
    }
    for (TensorType t : {TensorType::F32, TensorType::BF16, TensorType::F16}) {
      std::vector<uint8_t> buf(gguf::row_bytes(t, n));
      gguf::encode(t, x.data(), n, buf.data());
      gguf::decode(t, buf.data(), n, y.data());
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(x[size_t(i)], y[size_t(i)], std::fabs(x[size_t(i)]) * (t == TensorType::F32 ? 0 : 4e-3f));
    }
  }
}

TEST(Gguf, WriteReadKeysAndTensors) {
  std::string p = tmp_path("kv.gguf");
  std::vector<float> a(96 * 3);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i) * 0.25f - 7;
  std::vector<gguf::TensorSpec> ts;
  for (TensorType t : {TensorType::F32, TensorType::Q8_0, TensorType::BF16}) {
    gguf::TensorSpec s;
    s.name = std::string("t.") + gguf::type_name(t);
    s.ne = {96, 3};
    s.type = t;
    s.produce = [&a, t](uint8_t* out) {
      for (int r = 0; r < 3; ++r) gguf::encode(t, a.data() + r * 96, 96, out + size_t(r) * gguf::row_bytes(t, 96));
    };
    ts.push_back(s);
  }
  gguf::write_file(p, {{"a.u32", uint32_t(7)}, {"a.str", std::string("x")}, {"a.bools", std::vector<bool>{true, false, true}},
                       {"a.ints", std::vector<int32_t>{11, 11, 10, 0}}, {"a.f", 1e-6f}},
                   ts);
  auto f = gguf::File::read(p);
  EXPECT_EQ(std::get<uint32_t>(*f.find("a.u32")), 7u);
  EXPECT_EQ(std::get<std::string>(*f.find("a.str")), "x");
  EXPECT_EQ(std::get<std::vector<bool>>(*f.find("a.bools")), (std::vector<bool>{true, false, true}));
  EXPECT_EQ(std::get<std::vector<int32_t>>(*f.find("a.ints")), (std::vector<int32_t>{11, 11, 10, 0}));
  ASSERT_EQ(f.tensors.size(), 3u);
  for (auto& t : f.tensors) {
    EXPECT_EQ(t.offset % 32, 0u);
    auto v = f.read_f32(t);
    ASSERT_EQ(v.size(), a.size());
    EXPECT_NEAR(v[0], a[0], 0.05f);
    EXPECT_NEAR(v[100], a[100], 0.1f) << t.name;
  }
  // Rows that do not fit the block size are refused with the tensor named.
  gguf::TensorSpec bad;
  bad.name = "bad";
  bad.ne = {33, 1};
  bad.type = TensorType::Q4_0;
  bad.produce = [](uint8_t*) {};
  try {
    gguf::write_file(tmp_path("bad.gguf"), {}, {bad});
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("bad"), std::string::npos);
  }
}

TEST(Gguf, TiledValueHeadsMatchTheConverterPermute) {
  // llama.cpp's converter: view [Hk, r, d] -> swap the first two axes -> [r, Hk, d]; position (i, g)
  // then holds HF head g·r + i.
  for (auto [Hk, Hv] : std::vector<std::pair<int64_t, int64_t>>{{2, 4}, {16, 32}, {3, 9}, {4, 4}}) {
    auto p = tiled_value_heads(Hk, Hv);
    const int64_t r = Hv / Hk;
    ASSERT_EQ(int64_t(p.size()), Hv);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t g = 0; g < Hk; ++g) EXPECT_EQ(p[size_t(i * Hk + g)], g * r + i);
    std::vector<int64_t> sorted = p;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t j = 0; j < Hv; ++j) EXPECT_EQ(sorted[size_t(j)], j);
  }
}

void check_export(const std::string& model, TensorType type) {
  const std::string dir = std::string(LILY_TEST_DATA) + "/golden/" + model;
  auto w = ModelWeights::load(dir);
  GgufExportOptions opt;
  opt.type = type;
  opt.model_dir = dir;
  std::string file = tmp_path(model + ".gguf");
  export_gguf(*w, file, opt);
  auto f = gguf::File::read(file);
  Checkpoint ck(dir);
  const auto& c = w->cfg;
  const bool next = c.arch == Arch::Qwen3Next, dense = c.arch == Arch::Qwen35;
  const std::string arch = next ? "qwen3next" : dense ? "qwen35" : "qwen35moe";
  EXPECT_EQ(std::get<std::string>(*f.find("general.architecture")), arch);
  const bool mtp = w->mtp.has_value();  // exported as one more layer (dense MLP in the dense model)
  EXPECT_EQ(std::get<uint32_t>(*f.find(arch + ".block_count")), uint32_t(c.layers + (mtp ? 1 : 0)));
  EXPECT_EQ(std::get<uint32_t>(*f.find(arch + ".ssm.group_count")), uint32_t(c.lin_k_heads));
  EXPECT_EQ(std::get<uint32_t>(*f.find(arch + ".ssm.time_step_rank")), uint32_t(c.lin_v_heads));
  EXPECT_EQ(std::get<uint32_t>(*f.find(arch + ".rope.dimension_count")), uint32_t(c.rotary_dim));
  std::vector<bool> recurrent = {true, true, true, false};
  if (mtp) recurrent.push_back(false);
  EXPECT_EQ(std::get<std::vector<bool>>(*f.find(arch + ".attention.recurrent_layers")), recurrent);
  if (mtp && dense) {
    EXPECT_NE(f.tensor("blk.4.ffn_up.weight"), nullptr);
  }
  EXPECT_EQ(f.find(arch + ".rope.dimension_sections") != nullptr, !next);
  EXPECT_EQ(std::get<std::vector<std::string>>(*f.find("tokenizer.ggml.tokens")).size(), size_t(c.vocab));
  EXPECT_EQ(f.find(arch + ".expert_count") != nullptr, !dense);
  if (dense) {
    EXPECT_EQ(std::get<uint32_t>(*f.find(arch + ".feed_forward_length")), uint32_t(c.dense_inter));
  }
  EXPECT_EQ(f.tensor("output.weight") != nullptr, !c.tie_embeddings);  // tied: llama.cpp reuses token_embd
  for (const auto& t : f.tensors) EXPECT_EQ(t.name.find("mtp"), std::string::npos) << t.name;

  auto T = [&](const std::string& n) {
    const auto* t = f.tensor(n);
    EXPECT_NE(t, nullptr) << n;
    return t;
  };
  const std::string P = c.tensor_prefix;
  // Norms (1 + w) in F32.
  {
    auto* t = T("output_norm.weight");
    EXPECT_EQ(t->type, TensorType::F32);
    auto v = f.read_f32(*t);
    const auto& src = ck.get(P + "norm.weight");
    for (int64_t i = 0; i < c.hidden; ++i) EXPECT_FLOAT_EQ(v[size_t(i)], 1.0f + read_st(src, i));
  }
  const int64_t Hk = c.lin_k_heads, Hv = c.lin_v_heads, dk = c.lin_k_dim, dv = c.lin_v_dim, H = c.hidden, r = Hv / Hk;
  const std::string L0 = P + "layers.0.linear_attn.";
  // ssm_a = -exp(A_log), permuted for qwen35moe.
  auto perm = next ? std::vector<int64_t>() : tiled_value_heads(Hk, Hv);
  auto vh = [&](int64_t p) { return next ? p : perm[size_t(p)]; };
  {
    auto a = f.read_f32(*T("blk.0.ssm_a"));
    const auto& src = ck.get(L0 + "A_log");
    for (int64_t p = 0; p < Hv; ++p) EXPECT_NEAR(a[size_t(p)], -std::exp(read_st(src, vh(p))), 1e-6f);
    auto n = f.read_f32(*T("blk.0.ssm_norm.weight"));
    const auto& ns = ck.get(L0 + "norm.weight");
    for (int64_t d = 0; d < dv; ++d) EXPECT_EQ(n[size_t(d)], read_st(ns, d));  // plain, no +1
  }
  if (type != TensorType::F32) return;  // exact element checks below
  auto qkv = f.read_f32(*T("blk.0.attn_qkv.weight"));
  auto z = f.read_f32(*T("blk.0.attn_gate.weight"));
  auto out = f.read_f32(*T("blk.0.ssm_out.weight"));
  EXPECT_EQ(T("blk.0.ssm_out.weight")->ne, (std::vector<int64_t>{Hv * dv, H}));
  if (next) {
    // Grouped qkvz: per key head g [q dk | k dk | v r·dv | z r·dv]; exported flat q‖k‖v (HF order) + z.
    const auto& src = ck.get(L0 + "in_proj_qkvz.weight");
    const int64_t B = 2 * dk + 2 * r * dv;
    for (int64_t g = 0; g < Hk; ++g)
      for (int64_t d = 0; d < dk; d += 7) {
        EXPECT_EQ(qkv[size_t((g * dk + d) * H + 3)], read_st(src, (g * B + d) * H + 3));
        EXPECT_EQ(qkv[size_t((Hk * dk + g * dk + d) * H + 5)], read_st(src, (g * B + dk + d) * H + 5));
      }
    for (int64_t j = 0; j < Hv; ++j)
      for (int64_t d = 0; d < dv; d += 5) {
        const int64_t g = j / r, i = j % r;
        EXPECT_EQ(qkv[size_t((2 * Hk * dk + j * dv + d) * H + 1)], read_st(src, (g * B + 2 * dk + i * dv + d) * H + 1));
        EXPECT_EQ(z[size_t((j * dv + d) * H + 2)], read_st(src, (g * B + 2 * dk + r * dv + i * dv + d) * H + 2));
      }
    auto ba = f.read_f32(*T("blk.0.ssm_ba.weight"));
    const auto& bs = ck.get(L0 + "in_proj_ba.weight");
    for (int64_t i = 0; i < 2 * Hv * H; ++i) EXPECT_EQ(ba[size_t(i)], read_st(bs, i));
  } else {
    const auto& src = ck.get(L0 + "in_proj_qkv.weight");
    const auto& zs = ck.get(L0 + "in_proj_z.weight");
    const auto& os = ck.get(L0 + "out_proj.weight");
    const auto& bs = ck.get(L0 + "in_proj_b.weight");
    auto beta = f.read_f32(*T("blk.0.ssm_beta.weight"));
    for (int64_t k = 0; k < 2 * Hk * dk; k += 3) EXPECT_EQ(qkv[size_t(k * H + 4)], read_st(src, k * H + 4));
    for (int64_t p = 0; p < Hv; ++p) {
      for (int64_t d = 0; d < dv; d += 3) {
        EXPECT_EQ(qkv[size_t((2 * Hk * dk + p * dv + d) * H + 6)], read_st(src, (2 * Hk * dk + vh(p) * dv + d) * H + 6));
        EXPECT_EQ(z[size_t((p * dv + d) * H + 7)], read_st(zs, (vh(p) * dv + d) * H + 7));
        EXPECT_EQ(out[size_t(9 * Hv * dv + p * dv + d)], read_st(os, 9 * Hv * dv + vh(p) * dv + d));
      }
      EXPECT_EQ(beta[size_t(p * H + 11)], read_st(bs, vh(p) * H + 11));
    }
  }
  if (dense) {  // the dense MLP: ffn_gate / ffn_up [H, I], ffn_down [I, H] in ggml order
    const int64_t I = c.dense_inter;
    EXPECT_EQ(T("blk.1.ffn_gate.weight")->ne, (std::vector<int64_t>{H, I}));
    EXPECT_EQ(T("blk.3.ffn_down.weight")->ne, (std::vector<int64_t>{I, H}));
    auto up = f.read_f32(*T("blk.2.ffn_up.weight"));
    const auto& us = ck.get(P + "layers.2.mlp.up_proj.weight");
    for (int64_t i = 0; i < I * H; i += 89) EXPECT_EQ(up[size_t(i)], read_st(us, i));
    EXPECT_EQ(f.tensor("blk.1.ffn_gate_exps.weight"), nullptr);
    return;
  }
  // Experts stacked [E, I, H] in ggml order {H, I, E}.
  auto* ge = T("blk.1.ffn_gate_exps.weight");
  EXPECT_EQ(ge->ne, (std::vector<int64_t>{H, c.moe_inter, c.n_experts}));
  auto gv = f.read_f32(*ge);
  const auto& e3 = ck.get(P + "layers.1.mlp.experts.3.gate_proj.weight");
  for (int64_t i = 0; i < c.moe_inter * H; i += 97) EXPECT_EQ(gv[size_t(3 * c.moe_inter * H + i)], read_st(e3, i));
}

TEST(GgufExport, Qwen3NextLayout) { check_export("qwen3_next-a", TensorType::F32); }
TEST(GgufExport, Qwen35MoeLayoutTiledValueHeads) { check_export("qwen3_5_moe_text-a", TensorType::F32); }
TEST(GgufExport, Qwen35DenseLayout) { check_export("qwen3_5_text-a-mtp", TensorType::F32); }
TEST(GgufExport, QuantizedTypesWrite) {
  check_export("qwen3_5_text-a-mtp", TensorType::Q8_0);
  check_export("qwen3_5_moe_text-a", TensorType::Q8_0);
  check_export("qwen3_next-a", TensorType::Q4_0);
  check_export("qwen3_next-a", TensorType::BF16);
}

}  // namespace
}  // namespace lily
