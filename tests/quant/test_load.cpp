// Loading quantized linears from safetensors: affine (config block, per-module overrides, stacked experts),
// EXL3 (markers, padding, bias), row selection, and every refusal by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "backend/cpu/matmul.h"
#include "core/error.h"
#include "core/half.h"
#include "model/load_linear.h"
#include "quant/affine/affine.h"
#include "quant/exl3/exl3.h"
#include "quant/exl3/exl3_quant.h"
#include "../model/test_util.h"

namespace fs = std::filesystem;
using namespace lily;
using namespace lily::quant;

namespace {

using lily::test::randn;

struct Dir {
  std::string path;
  explicit Dir(const std::string& name) {
    path = (fs::temp_directory_path() / ("lily_test_load_" + std::to_string(::getpid()) + "_" + name)).string();
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Dir() { fs::remove_all(path); }
};

// Minimal holder of tensors to write.
struct Tensors {
  std::vector<TensorToWrite> t;
  std::vector<std::shared_ptr<std::vector<uint8_t>>> keep;
  template <typename T>
  void add(const std::string& n, DType dt, std::vector<int64_t> shape, const std::vector<T>& v) {
    auto b = std::make_shared<std::vector<uint8_t>>(v.size() * sizeof(T));
    std::memcpy(b->data(), v.data(), b->size());
    keep.push_back(b);
    t.push_back({n, dt, std::move(shape), b->data(), b->size()});
  }
  void write(const std::string& dir) { write_safetensors(dir + "/model.safetensors", t); }
};

ModelConfig config_with(const nlohmann::json& q) {
  ModelConfig c;
  c.quantization = q;
  c.n_experts = 3;
  c.moe_inter = 64;
  c.hidden = 128;
  return c;
}

void add_affine(Tensors& T, const std::string& base, const AffineQuantized& q) {
  T.add(base + ".weight", DType::U32, {q.out, q.in * q.bits / 32}, q.packed);
  T.add(base + ".scales", DType::BF16, {q.out, q.in / q.group_size}, q.scales);
  T.add(base + ".biases", DType::BF16, {q.out, q.in / q.group_size}, q.biases);
}

void add_exl3(Tensors& T, const std::string& base, const Exl3Quantized& q, int marker /*0 none, 1 mcg, 2 mul1*/,
              uint32_t mult = 0) {
  T.add(base + ".trellis", DType::I16, {q.in_p / 16, q.out_p / 16, 16 * int64_t(q.K)}, q.trellis);
  T.add(base + ".suh", DType::F16, {q.in_p}, q.suh);
  T.add(base + ".svh", DType::F16, {q.out_p}, q.svh);
  if (marker == 1) T.add(base + ".mcg", DType::I32, {}, std::vector<uint32_t>{mult ? mult : kExl3McgMult});
  if (marker == 2) T.add(base + ".mul1", DType::I32, {}, std::vector<uint32_t>{mult ? mult : kExl3Mul1Mult});
}

// Random trellis words and scales (every bit pattern decodes): a valid EXL3 tensor set, made instantly.
Exl3Quantized small_exl3(int64_t out, int64_t in, int K, Exl3Codebook cb, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  Exl3Quantized q;
  q.K = K;
  q.codebook = cb;
  q.in = in;
  q.out = out;
  q.in_p = (in + 127) / 128 * 128;
  q.out_p = (out + 127) / 128 * 128;
  q.trellis.resize(size_t(q.in_p / 16 * (q.out_p / 16) * 16 * K));
  for (auto& w : q.trellis) w = uint16_t(rng());
  for (int64_t i = 0; i < q.in_p; ++i) q.suh.push_back(f32_to_f16((rng() & 1 ? -0.05f : 0.05f) * u(rng)));
  for (int64_t i = 0; i < q.out_p; ++i) q.svh.push_back(f32_to_f16((rng() & 1 ? -1.0f : 1.0f) * u(rng)));
  return q;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(QuantLoad, AffineWithOverridesAndSelectRows) {
  Dir d("affine");
  Tensors T;
  auto w = randn(40 * 128, 1, 0.1f);
  auto q4 = affine_quantize(w.data(), 40, 128, 4, 64);
  auto q8 = affine_quantize(w.data(), 40, 128, 8, 32);
  add_affine(T, "a", q4);
  add_affine(T, "b", q8);
  T.write(d.path);
  Checkpoint ck(d.path);
  std::vector<std::shared_ptr<void>> owned;
  auto cfg = config_with({{"bits", 4}, {"group_size", 64}, {"b", {{"bits", 8}, {"group_size", 32}}}});
  Linear a = load_linear(ck, cfg, "a", 40, 128, owned);
  Linear b = load_linear(ck, cfg, "b", 40, 128, owned);
  ASSERT_EQ(a.format, WeightFormat::Affine);
  EXPECT_EQ(a.affine->bits, 4);
  EXPECT_EQ(b.affine->bits, 8);
  EXPECT_EQ(b.affine->group_size, 32);
  EXPECT_EQ(quantized_nbytes(a), size_t(40 * 128 / 2 + 2 * 2 * 40 * 2));
  // config disagreeing with the tensors is refused by name
  auto bad = config_with({{"bits", 3}, {"group_size", 64}});
  EXPECT_NE(error_of([&] { load_linear(ck, bad, "a", 40, 128, owned); }).find("'a.weight'"), std::string::npos);
  auto mx = config_with({{"bits", 4}, {"group_size", 64}, {"mode", "mxfp4"}});
  EXPECT_NE(error_of([&] { load_linear(ck, mx, "a", 40, 128, owned); }).find("mxfp4"), std::string::npos);
  EXPECT_NE(error_of([&] { load_linear(ck, cfg, "a", 41, 128, owned); }).find("shape"), std::string::npos);
  // selected rows: same products as the full matrix's rows
  std::vector<int64_t> rows = {39, 0, 7, 7, 20};
  Linear s = select_rows(a, rows, owned);
  auto x = randn(3 * 128, 2, 0.1f);
  std::vector<float> yf(3 * 40), ys(3 * rows.size());
  cpu::matmul(a, x.data(), 3, yf.data());
  cpu::matmul(s, x.data(), 3, ys.data());
  for (int t = 0; t < 3; ++t)
    for (size_t j = 0; j < rows.size(); ++j) EXPECT_FLOAT_EQ(ys[t * rows.size() + j], yf[size_t(t * 40 + rows[j])]);
}

TEST(QuantLoad, AffineStackedExperts) {
  Dir d("stacked");
  Tensors T;
  const int64_t E = 3, I = 64, H = 128;
  std::vector<uint32_t> pk[3];
  std::vector<uint16_t> sc[3], bi[3];
  std::vector<std::vector<float>> dense(9);
  const char* names[3] = {"gate_proj", "up_proj", "down_proj"};
  for (int p = 0; p < 3; ++p) {
    const int64_t out = p == 2 ? H : I, in = p == 2 ? I : H;
    for (int64_t e = 0; e < E; ++e) {
      auto w = randn(size_t(out * in), uint32_t(10 * p + e), 0.1f);
      auto q = affine_quantize(w.data(), out, in, 4, 32);
      pk[p].insert(pk[p].end(), q.packed.begin(), q.packed.end());
      sc[p].insert(sc[p].end(), q.scales.begin(), q.scales.end());
      bi[p].insert(bi[p].end(), q.biases.begin(), q.biases.end());
      dense[size_t(p * 3 + e)].resize(size_t(out * in));
      for (int64_t o = 0; o < out; ++o) affine_dequant_row_ref(q.view(), o, dense[size_t(p * 3 + e)].data() + o * in);
    }
    const std::string b = std::string("m.switch_mlp.") + names[p];
    T.add(b + ".weight", DType::U32, {E, out, in * 4 / 32}, pk[p]);
    T.add(b + ".scales", DType::BF16, {E, out, in / 32}, sc[p]);
    T.add(b + ".biases", DType::BF16, {E, out, in / 32}, bi[p]);
  }
  T.write(d.path);
  Checkpoint ck(d.path);
  std::vector<std::shared_ptr<void>> owned;
  std::vector<Expert> ex;
  auto cfg = config_with({{"bits", 4}, {"group_size", 32}});
  ASSERT_TRUE(load_stacked_experts(ck, cfg, "m.", ex, owned));
  ASSERT_EQ(ex.size(), 3u);
  for (int e = 0; e < 3; ++e) {
    std::vector<float> row(64);
    cpu::weight_row(ex[size_t(e)].down, 100, row.data());
    for (int i = 0; i < 64; ++i) ASSERT_EQ(row[size_t(i)], dense[size_t(6 + e)][size_t(100 * 64 + i)]);
    row.resize(128);
    cpu::weight_row(ex[size_t(e)].up, 5, row.data());
    for (int i = 0; i < 128; ++i) ASSERT_EQ(row[size_t(i)], dense[size_t(3 + e)][size_t(5 * 128 + i)]);
  }
  // wrong expert count is refused by name
  auto cfg4 = cfg;
  cfg4.n_experts = 4;
  EXPECT_NE(error_of([&] { load_stacked_experts(ck, cfg4, "m.", ex, owned); }).find("4 experts"), std::string::npos);
}

TEST(QuantLoad, Exl3MarkersPaddingAndRefusals) {
  Dir d("exl3");
  Tensors T;
  auto q = small_exl3(100, 72, 3, Exl3Codebook::Mcg, 3);  // padded to 128 x 128
  add_exl3(T, "ok", q, 1);
  auto q1 = small_exl3(100, 72, 2, Exl3Codebook::Mul1, 4);
  add_exl3(T, "mul1", q1, 2);
  auto q0 = small_exl3(100, 72, 4, Exl3Codebook::Inst3, 5);
  add_exl3(T, "inst", q0, 0);
  add_exl3(T, "badmult", q, 1, 0x12345678u);
  add_exl3(T, "both", q, 1);
  T.add("both.mul1", DType::I32, {}, std::vector<uint32_t>{kExl3Mul1Mult});
  T.add("legacy.trellis", DType::I16, {8, 8, 48}, q.trellis);
  T.add("legacy.su", DType::I16, {8}, std::vector<uint16_t>(8, 0));
  T.add("legacy.svh", DType::F16, {128}, q.svh);
  T.write(d.path);
  Checkpoint ck(d.path);
  std::vector<std::shared_ptr<void>> owned;
  auto cfg = config_with(nlohmann::json());
  Linear a = load_linear(ck, cfg, "ok", 100, 72, owned);
  ASSERT_EQ(a.format, WeightFormat::Exl3);
  EXPECT_EQ(a.exl3->K, 3);
  EXPECT_EQ(a.exl3->codebook, Exl3Codebook::Mcg);
  EXPECT_EQ(a.exl3->in_p, 128);
  EXPECT_EQ(load_linear(ck, cfg, "mul1", 100, 72, owned).exl3->codebook, Exl3Codebook::Mul1);
  EXPECT_EQ(load_linear(ck, cfg, "inst", 100, 72, owned).exl3->codebook, Exl3Codebook::Inst3);
  EXPECT_NE(error_of([&] { load_linear(ck, cfg, "badmult", 100, 72, owned); }).find("0x12345678"), std::string::npos);
  EXPECT_NE(error_of([&] { load_linear(ck, cfg, "both", 100, 72, owned); }).find("both"), std::string::npos);
  EXPECT_NE(error_of([&] { load_linear(ck, cfg, "legacy", 100, 72, owned); }).find("legacy"), std::string::npos);
  EXPECT_NE(error_of([&] { load_linear(ck, cfg, "ok", 300, 72, owned); }).find("'ok.trellis'"), std::string::npos);
  // the loaded weight computes what the quantizer's own view computes
  auto x = randn(2 * 72, 6, 0.1f);
  std::vector<float> y(2 * 100), yr(2 * 100);
  cpu::matmul(a, x.data(), 2, y.data());
  auto v = q.view();
  exl3_forward_ref(v, x.data(), 2, yr.data());
  for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], yr[i], 1e-4f * (1 + std::fabs(yr[i])));
  // selected rows of an EXL3 weight: gathered after the output Hadamard
  std::vector<int64_t> rows = {99, 3, 64, 3};
  Linear s = select_rows(a, rows, owned);
  std::vector<float> ys(2 * rows.size());
  cpu::matmul(s, x.data(), 2, ys.data());
  for (int t = 0; t < 2; ++t)
    for (size_t j = 0; j < rows.size(); ++j) EXPECT_FLOAT_EQ(ys[t * rows.size() + j], y[size_t(t * 100 + rows[j])]);
  std::vector<float> wr(72);
  cpu::weight_row(s, 0, wr.data());
  std::vector<float> wf(72);
  cpu::weight_row(a, 99, wf.data());
  for (int i = 0; i < 72; ++i) EXPECT_FLOAT_EQ(wr[size_t(i)], wf[size_t(i)]);
}

TEST(QuantLoad, Exl3ExpertsMustShareK) {
  Dir d("mixed");
  Tensors T;
  for (int e = 0; e < 3; ++e) {
    add_exl3(T, "m.experts." + std::to_string(e) + ".gate_proj", small_exl3(64, 128, e == 2 ? 3 : 2, Exl3Codebook::Mcg, 10 + e), 1);
    add_exl3(T, "m.experts." + std::to_string(e) + ".up_proj", small_exl3(64, 128, 2, Exl3Codebook::Mcg, 20 + e), 1);
    add_exl3(T, "m.experts." + std::to_string(e) + ".down_proj", small_exl3(128, 64, 2, Exl3Codebook::Mcg, 30 + e), 1);
  }
  T.write(d.path);
  Checkpoint ck(d.path);
  std::vector<std::shared_ptr<void>> owned;
  std::vector<Expert> ex;
  auto cfg = config_with(nlohmann::json());
  auto msg = error_of([&] { load_stacked_experts(ck, cfg, "m.", ex, owned); });
  EXPECT_NE(msg.find("mixed K within one expert projection"), std::string::npos) << msg;
  EXPECT_NE(msg.find("m.experts.2.gate_proj"), std::string::npos) << msg;
}
