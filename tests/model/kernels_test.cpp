// CPU fast paths against their plain references at awkward sizes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>

#include "backend/cpu/attention.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/simd.h"
#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "runtime/sampler.h"
#include "test_util.h"

using namespace lily;

namespace {

using test::randn;

struct DenseMat {
  std::vector<uint8_t> bytes;
  Linear lin;
};

DenseMat make_dense(DType dt, int64_t out, int64_t in, uint32_t seed) {
  auto v = randn(size_t(out * in), seed, 1.0f / std::sqrt(float(in)));
  DenseMat m;
  m.bytes.resize(size_t(out * in) * dtype_size(dt));
  for (int64_t i = 0; i < out * in; ++i) {
    if (dt == DType::F32) std::memcpy(m.bytes.data() + 4 * i, &v[size_t(i)], 4);
    else {
      uint16_t h = dt == DType::BF16 ? f32_to_bf16(v[size_t(i)]) : f32_to_f16(v[size_t(i)]);
      std::memcpy(m.bytes.data() + 2 * i, &h, 2);
    }
  }
  m.lin.name = "test";
  m.lin.out = out;
  m.lin.in = in;
  m.lin.dense = {dt, m.bytes.data(), in};
  return m;
}

TEST(Matmul, MatchesReferenceAtAwkwardSizes) {
  for (DType dt : {DType::BF16, DType::F16, DType::F32})
    for (int64_t T : {1, 2, 3, 17, 64, 65})
      for (auto [N, K] : {std::pair<int64_t, int64_t>{1, 1}, {17, 33}, {63, 64}, {65, 129}, {129, 7}, {300, 256}}) {
        auto W = make_dense(dt, N, K, uint32_t(N * 7 + K));
        auto x = randn(size_t(T * K), uint32_t(T));
        std::vector<float> y(size_t(T * N), NAN), r(size_t(T * N));
        cpu::matmul(W.lin, x.data(), T, y.data());
        cpu::matmul_ref(W.lin, x.data(), T, r.data());
        double err = 0, ref = 0;
        for (size_t i = 0; i < y.size(); ++i) {
          ASSERT_TRUE(std::isfinite(y[i])) << "unwritten output " << i;
          err += (y[i] - r[i]) * (y[i] - r[i]);
          ref += r[i] * r[i];
        }
        EXPECT_LE(std::sqrt(err / std::max(ref, 1e-30)), 1e-5) << dtype_name(dt) << " T=" << T << " N=" << N << " K=" << K;
      }
}

TEST(DeltaRule, ChunkedMatchesRecurrent) {
  for (int64_t T : {1, 2, 17, 63, 64, 65, 129, 150})
    for (auto [dk, dv] : {std::pair<int64_t, int64_t>{32, 32}, {16, 48}, {128, 128}}) {
      auto q = randn(size_t(T * dk), 1), k = randn(size_t(T * dk), 2), v = randn(size_t(T * dv), 3);
      for (int64_t t = 0; t < T; ++t)
        for (auto* p : {&q, &k}) {
          float ss = 0;
          for (int64_t i = 0; i < dk; ++i) ss += (*p)[size_t(t * dk + i)] * (*p)[size_t(t * dk + i)];
          for (int64_t i = 0; i < dk; ++i) (*p)[size_t(t * dk + i)] /= std::sqrt(ss);
        }
      std::vector<float> beta(static_cast<size_t>(T)), g(static_cast<size_t>(T));
      std::mt19937 rng(9);
      std::uniform_real_distribution<float> u(0, 1);
      for (int64_t t = 0; t < T; ++t) {
        beta[size_t(t)] = u(rng);
        g[size_t(t)] = -2.0f * u(rng);
      }
      auto S0 = randn(size_t(dv * dk), 4, 0.1f);
      std::vector<float> S1 = S0, S2 = S0, o1(size_t(T * dv)), o2(size_t(T * dv));
      cpu::DeltaArgs a{q.data(), k.data(), v.data(), beta.data(), g.data(), dk, dk, dv, o1.data(), dv, S1.data(), T, dk, dv};
      cpu::delta_rule_recurrent(a);
      a.o = o2.data();
      a.S = S2.data();
      cpu::delta_rule_chunked(a);
      double e = 0, es = 0;
      for (size_t i = 0; i < o1.size(); ++i) e = std::max(e, double(std::fabs(o1[i] - o2[i])));
      for (size_t i = 0; i < S1.size(); ++i) es = std::max(es, double(std::fabs(S1[i] - S2[i])));
      EXPECT_LE(e, 2e-5) << "T=" << T << " dk=" << dk;
      EXPECT_LE(es, 2e-5) << "T=" << T << " dk=" << dk;
    }
}

TEST(Simd, GemmNnMatchesLoops) {
  for (int64_t M : {1, 3, 4, 5, 17, 64})
    for (int64_t N : {1, 7, 8, 16, 17, 33, 64, 129})
      for (int64_t K : {1, 13, 64, 128})
        for (bool acc : {false, true})
          for (bool at : {false, true}) {  // A row-major [M][K] or read through its transpose [K][M]
            const int64_t ldb = N + 1, ldc = N + 2, a_is = at ? 1 : K + 3, a_ks = at ? M + 2 : 1;
            auto A = randn(size_t(std::max(M * a_is, K * a_ks) + K + M), 11), B = randn(size_t(K * ldb), 12),
                 C0 = randn(size_t(M * ldc), 13);
            auto C = C0;
            cpu::gemm_nn(M, N, K, A.data(), a_is, a_ks, B.data(), ldb, C.data(), ldc, acc);
            for (int64_t i = 0; i < M; ++i)
              for (int64_t j = 0; j < N; ++j) {
                double want = acc ? C0[size_t(i * ldc + j)] : 0.0;
                for (int64_t k = 0; k < K; ++k) want += double(A[size_t(i * a_is + k * a_ks)]) * B[size_t(k * ldb + j)];
                ASSERT_NEAR(C[size_t(i * ldc + j)], want, 1e-4 * (1 + std::fabs(want))) << M << "x" << N << "x" << K;
              }
            for (int64_t i = 0; i < M; ++i)  // the padding between rows is untouched
              for (int64_t j = N; j < ldc; ++j) ASSERT_EQ(C[size_t(i * ldc + j)], C0[size_t(i * ldc + j)]);
          }
}

TEST(Conv, StateCarriesAcrossSteps) {
  const int64_t K = 4;
  // (T, C): a tail of channels below one vector, odd sizes, and one large enough to split over the pool.
  for (auto [T, C] : {std::pair<int64_t, int64_t>{9, 5}, {1, 17}, {3, 8}, {129, 65}, {64, 4100}}) {
    auto x = randn(size_t(T * C), 5), w = randn(size_t(C * K), 6);
    std::vector<float> st1(size_t((K - 1) * C), 0.0f), st2 = st1, y1(size_t(T * C)), y2(size_t(T * C));
    cpu::causal_conv_silu(x.data(), T, C, K, w.data(), st1.data(), y1.data());
    for (int64_t t = 0; t < T; ++t)
      cpu::causal_conv_silu(x.data() + t * C, 1, C, K, w.data(), st2.data(), y2.data() + t * C);
    for (size_t i = 0; i < y1.size(); ++i) ASSERT_EQ(y1[i], y2[i]) << T << "x" << C << " at " << i;
    for (size_t i = 0; i < st1.size(); ++i) ASSERT_EQ(st1[i], st2[i]);
    // Plain definition: y[t][c] = silu(Σ_j w[c][j] x[t-K+1+j][c]).
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double s = 0;
        for (int64_t j = 0; j < K; ++j) {
          int64_t src = t - K + 1 + j;
          if (src >= 0) s += double(w[size_t(c * K + j)]) * x[size_t(src * C + c)];
        }
        ASSERT_NEAR(y1[size_t(t * C + c)], s / (1 + std::exp(-s)), 1e-5) << T << "x" << C;
      }
  }
}

// exp8 against double-precision e^x: within 2 ulp on [-87, 88], clamped outside, NaN kept; a value's
// result does not depend on its lane.
TEST(Simd, Exp8WithinTwoUlp) {
  double worst = 0;
  for (int i = 0; i <= 1750000; ++i) {
    const float x = -87.0f + float(i) * 1e-4f;
    cpu::v8f v = {};
    v[i % 8] = x;
    const float got = cpu::exp8(v)[i % 8], want = float(std::exp(double(x)));
    const double ulp = std::nextafter(want, INFINITY) - want;
    worst = std::max(worst, std::fabs(double(got) - std::exp(double(x))) / ulp);
    if (i % 4099 == 0) {
      float buf[3] = {1.0f, x, 2.0f};
      ASSERT_EQ(cpu::exp8(cpu::load_n(buf + 1, 1))[0], got) << x;
    }
  }
  EXPECT_LE(worst, 2.0);
  const cpu::v8f big = {100.0f, -100.0f, INFINITY, -INFINITY, NAN, 0.0f, 1.0f, -1.0f};
  const cpu::v8f e = cpu::exp8(big);
  EXPECT_FLOAT_EQ(e[0], std::exp(88.0f));
  EXPECT_FLOAT_EQ(e[1], std::exp(-87.0f));
  EXPECT_FLOAT_EQ(e[2], std::exp(88.0f));
  EXPECT_FLOAT_EQ(e[3], std::exp(-87.0f));
  EXPECT_TRUE(std::isnan(e[4]));
  EXPECT_EQ(e[5], 1.0f);
  EXPECT_FLOAT_EQ(e[6], std::exp(1.0f));
  EXPECT_FLOAT_EQ(e[7], std::exp(-1.0f));
}

// The vector element-wise ops against plain double loops at awkward lengths, one long enough to split
// over the pool; each element equal to the same value computed alone (no dependence on its index).
TEST(Ops, VectorFormsMatchPlain) {
  auto silu_d = [](double v) { return v / (1 + std::exp(-v)); };
  auto sig_d = [](double v) { return 1 / (1 + std::exp(-v)); };
  for (int64_t n : {1, 2, 3, 7, 8, 9, 16, 17, 63, 64, 65, 129, 40001}) {
    auto g = randn(size_t(n), 21, 4.0f), up = randn(size_t(n), 22), o = randn(size_t(n), 23), gate = randn(size_t(n), 24, 3.0f);
    auto g2 = g, o2 = o, sc = randn(size_t(n), 25, 5.0f), sc2 = sc;
    cpu::swiglu(g2.data(), up.data(), n);
    cpu::mul_sigmoid(o2.data(), gate.data(), n);
    const float mx = *std::max_element(sc.begin(), sc.end());
    const float sum = cpu::exp_shift_sum(sc2.data(), n, mx);
    double want_sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const size_t u = size_t(i);
      ASSERT_NEAR(g2[u], silu_d(g[u]) * up[u], 1e-6 * (1 + std::fabs(g[u] * up[u]))) << n << " " << i;
      ASSERT_NEAR(o2[u], o[u] * sig_d(gate[u]), 1e-6 * (1 + std::fabs(o[u]))) << n << " " << i;
      const double e = std::exp(double(sc[u] - mx));  // the shift in float, as the op does
      ASSERT_NEAR(sc2[u], e, 3e-7 * e) << n << " " << i;
      want_sum += e;
    }
    EXPECT_NEAR(sum, want_sum, 1e-5 * want_sum) << n;
    float one_g = g[size_t(n - 1)];
    cpu::swiglu(&one_g, &up[size_t(n - 1)], 1);
    EXPECT_EQ(one_g, g2[size_t(n - 1)]) << n;
  }
  for (auto [rows, d] : {std::pair<int64_t, int64_t>{1, 5}, {3, 8}, {17, 128}, {129, 63}, {300, 128}}) {
    auto o = randn(size_t(rows * d), 31, 2.0f), z = randn(size_t(rows * d), 32, 3.0f), w = randn(size_t(d), 33);
    auto o2 = o;
    const float eps = 1e-6f;
    cpu::gated_rms_norm(o2.data(), z.data(), w.data(), rows, d, eps);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < d; ++i) ss += double(o[size_t(r * d + i)]) * o[size_t(r * d + i)];
      const double inv = 1 / std::sqrt(ss / double(d) + eps);
      for (int64_t i = 0; i < d; ++i) {
        const size_t u = size_t(r * d + i);
        const double want = o[u] * inv * w[size_t(i)] * silu_d(z[u]);
        ASSERT_NEAR(o2[u], want, 2e-6 * (1 + std::fabs(want))) << rows << "x" << d;
      }
    }
  }
}

// Attention in blocks of rows through gemm_nn against the row-by-row path (dot products per key), several
// sequences in one step at awkward row counts and cached prefixes, GQA 4:1.
TEST(Attention, BlocksMatchRowByRow) {
  const int64_t Hq = 8, Hkv = 2, hd = 40, kvw = Hkv * hd;
  for (int64_t rows : {1, 2, 3, 16, 17, 63, 64, 65, 129})
    for (int64_t prefix : {0, 5}) {
      // two sequences: `rows` new rows after `prefix` cached ones, and 3 rows after 7
      const int64_t rows2 = 3, prefix2 = 7, T = rows + rows2;
      auto k1 = randn(size_t((prefix + rows) * kvw), 41), v1 = randn(size_t((prefix + rows) * kvw), 42);
      auto k2 = randn(size_t((prefix2 + rows2) * kvw), 43), v2 = randn(size_t((prefix2 + rows2) * kvw), 44);
      auto q = randn(size_t(T * Hq * hd), 45, 2.0f), gate = randn(size_t(T * Hq * 2 * hd), 46);
      std::vector<cpu::AttnSeq> seqs = {{k1.data(), v1.data(), 0, rows, prefix}, {k2.data(), v2.data(), rows, rows2, prefix2}};
      std::vector<float> o_rows(size_t(T * Hq * hd)), o_blocks(o_rows.size());
      cpu::AttnArgs a{q.data(), gate.data() + hd, Hq * 2 * hd, 2 * hd, o_rows.data(), Hq, Hkv, hd, 1.0f / std::sqrt(float(hd))};
      a.block_min_rows = 1 << 30;
      cpu::attention(a, seqs);
      a.o = o_blocks.data();
      a.block_min_rows = 1;
      cpu::attention(a, seqs);
      for (size_t i = 0; i < o_rows.size(); ++i)
        ASSERT_NEAR(o_blocks[i], o_rows[i], 2e-6 * (1 + std::fabs(o_rows[i]))) << rows << " rows after " << prefix << " at " << i;
      // one row against the plain definition in double
      const int64_t t = rows - 1, h = 5, kh = h / 4, n = prefix + rows;
      std::vector<double> sc(static_cast<size_t>(n));
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        double d = 0;
        for (int64_t c = 0; c < hd; ++c) d += double(q[size_t((t * Hq + h) * hd + c)]) * k1[size_t(j * kvw + kh * hd + c)];
        mx = std::max(mx, sc[size_t(j)] = d / std::sqrt(double(hd)));
      }
      for (auto& x : sc) sum += (x = std::exp(x - mx));
      for (int64_t c = 0; c < hd; ++c) {
        double want = 0;
        for (int64_t j = 0; j < n; ++j) want += sc[size_t(j)] / sum * v1[size_t(j * kvw + kh * hd + c)];
        want /= 1 + std::exp(-double(gate[size_t(t * Hq * 2 * hd + h * 2 * hd + hd + c)]));
        ASSERT_NEAR(o_blocks[size_t((t * Hq + h) * hd + c)], want, 1e-5) << rows << " rows";
      }
    }
}

// The row-by-row path groups a KV head's query heads four at a time (fewer in the last group) and its values in
// blocks of keys: each head's output must not depend on the grouping (a row alone runs a task per head on a
// 2-thread pool, two rows a task per KV head), and must match the definition at head sizes with a scalar tail.
TEST(Attention, RowByRowSameForAnyHeadGrouping) {
  for (int64_t hd : {20, 44, 64})
    for (int64_t Hq : {1, 6, 9})
      for (int64_t prefix : {0, 15, 40}) {
        const int64_t Hkv = 1, kvw = hd, n = prefix + 2;
        auto k = randn(size_t(n * kvw), 51), v = randn(size_t(n * kvw), 52);
        auto q = randn(size_t(2 * Hq * hd), 53, 2.0f), gate = randn(size_t(2 * Hq * 2 * hd), 54);
        std::vector<float> o_two(size_t(2 * Hq * hd)), o_one(o_two.size());
        cpu::AttnArgs a{q.data(), gate.data() + hd, Hq * 2 * hd, 2 * hd, o_two.data(), Hq, Hkv, hd, 1.0f / std::sqrt(float(hd))};
        cpu::attention(a, {{k.data(), v.data(), 0, 2, prefix}});
        a.o = o_one.data();
        cpu::attention(a, {{k.data(), v.data(), 1, 1, prefix + 1}});
        for (int64_t i = Hq * hd; i < 2 * Hq * hd; ++i)
          ASSERT_EQ(o_one[size_t(i)], o_two[size_t(i)]) << "hd " << hd << " Hq " << Hq << " prefix " << prefix << " at " << i;
        for (int64_t h = 0; h < Hq; ++h) {
          std::vector<double> sc(static_cast<size_t>(n));
          double mx = -INFINITY, sum = 0;
          for (int64_t j = 0; j < n; ++j) {
            double d = 0;
            for (int64_t c = 0; c < hd; ++c) d += double(q[size_t((Hq + h) * hd + c)]) * k[size_t(j * kvw + c)];
            mx = std::max(mx, sc[size_t(j)] = d / std::sqrt(double(hd)));
          }
          for (auto& x : sc) sum += (x = std::exp(x - mx));
          for (int64_t c = 0; c < hd; ++c) {
            double want = 0;
            for (int64_t j = 0; j < n; ++j) want += sc[size_t(j)] / sum * v[size_t(j * kvw + c)];
            want /= 1 + std::exp(-double(gate[size_t(Hq * 2 * hd + h * 2 * hd + hd + c)]));
            ASSERT_NEAR(o_two[size_t((Hq + h) * hd + c)], want, 1e-5) << "hd " << hd << " Hq " << Hq << " head " << h;
          }
        }
      }
}

TEST(Half, RoundTrips) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 0x1p-14f, 0x1p-24f, 0x3p-20f, -0.0f}) {
    EXPECT_EQ(f16_to_f32(f32_to_f16(f)), f) << f;
    EXPECT_NEAR(bf16_to_f32(f32_to_bf16(f)), f, std::fabs(f) / 128 + 1e-40) << f;
  }
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
  // Every fp16 bit pattern survives f16 -> f32 -> f16 (NaNs stay NaN).
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = f16_to_f32(uint16_t(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f), h) << h;
  }
}

TEST(ThreadPool, CoversRangeAndPropagatesErrors) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 7, 1000}) {
    std::vector<std::atomic<int>> hit(static_cast<size_t>(n));
    pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) hit[size_t(i)]++;
    });
    for (auto& h : hit) EXPECT_EQ(h.load(), 1);
  }
  EXPECT_THROW(pool.parallel_for(100, 1, [](int64_t b, int64_t) { if (b >= 50) throw std::runtime_error("x"); }),
               std::runtime_error);
}

// Back-to-back small jobs (workers caught while spinning), jobs after the pool went to sleep (longer
// than the spin window), and two callers at once: every index exactly once, every job complete on return.
TEST(ThreadPool, ManySmallJobsSleepAndTwoCallers) {
  ThreadPool pool(3);
  std::vector<int64_t> out(64);
  for (int job = 0; job < 20000; ++job) {
    const int64_t n = 1 + job % 64;
    pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) out[size_t(i)] = job;
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[size_t(i)], job) << "job " << job << " index " << i;
  }
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    std::atomic<int64_t> sum{0};
    pool.parallel_for(1000, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum += i;
    });
    EXPECT_EQ(sum.load(), 999 * 1000 / 2);
  }
  std::atomic<int64_t> total{0};
  auto caller = [&] {
    for (int j = 0; j < 2000; ++j)
      pool.parallel_for(10, 1, [&](int64_t b, int64_t e) { total += e - b; });
  };
  std::thread t1(caller), t2(caller);
  t1.join();
  t2.join();
  EXPECT_EQ(total.load(), 2 * 2000 * 10);
}

// Guided chunks: every index once, every chunk but the last at least the grain, the same boundaries on every
// call (they depend on n and the grain only), and the last chunks no larger than the first.
TEST(ThreadPool, GuidedChunksKeepTheGrainAndFixedBoundaries) {
  ThreadPool pool(2);
  for (int64_t n : {1, 5, 17, 100, 1153})
    for (int64_t grain : {1, 3, 8, 64}) {
      std::vector<std::pair<int64_t, int64_t>> first;
      for (int rep = 0; rep < 3; ++rep) {
        std::mutex mu;
        std::vector<std::pair<int64_t, int64_t>> chunks;
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
          std::lock_guard lk(mu);
          chunks.push_back({b, e});
        });
        std::sort(chunks.begin(), chunks.end());
        int64_t at = 0;
        for (const auto& [b, e] : chunks) {
          ASSERT_EQ(b, at) << "n " << n << " grain " << grain;
          if (e < n) {
            EXPECT_GE(e - b, std::min(grain, n)) << "n " << n << " grain " << grain;
          }
          at = e;
        }
        ASSERT_EQ(at, n);
        EXPECT_LE(chunks.back().second - chunks.back().first, chunks.front().second - chunks.front().first);
        if (rep == 0) {
          first = chunks;
        } else {
          EXPECT_EQ(chunks, first) << "n " << n << " grain " << grain;
        }
      }
    }
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(8, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      pool.parallel_for(100, 1, [&](int64_t c, int64_t d) {
        for (int64_t j = c; j < d; ++j) sum += j;
      });
  });
  EXPECT_EQ(sum.load(), 8 * (99 * 100 / 2));
}

TEST(Sampler, GreedySeededAndFiltered) {
  std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f, 0.5f};
  SamplingParams p;
  EXPECT_EQ(Sampler(p).sample(logits), 1);
  p.temperature = 1.0f;
  p.seed = 42;
  Sampler a(p), b(p);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(a.sample(logits), b.sample(logits));
  p.top_k = 2;
  Sampler k(p);
  for (int i = 0; i < 200; ++i) {
    int t = k.sample(logits);
    EXPECT_TRUE(t == 1 || t == 2);
  }
  p.top_k = 0;
  p.min_p = 0.5f;  // keeps tokens with p >= 0.5 p_max: ids 1 and 2
  Sampler m(p);
  for (int i = 0; i < 200; ++i) {
    int t = m.sample(logits);
    EXPECT_TRUE(t == 1 || t == 2);
  }
  p.min_p = 0.0f;
  p.top_p = 0.3f;  // the top token alone holds more than 0.3
  Sampler tp(p);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(tp.sample(logits), 1);
  // Repetition penalty pushes a seen token down.
  SamplingParams g;
  g.repetition_penalty = 10.0f;
  std::vector<int32_t> hist = {1};
  EXPECT_EQ(Sampler(g).sample(logits, hist), 2);
  SamplingParams bad;
  bad.top_p = 0.0f;
  EXPECT_THROW(validate(bad), InputError);
  bad = {};
  bad.temperature = -1;
  EXPECT_THROW(validate(bad), InputError);
}

TEST(Sampler, DistributionFollowsSoftmax) {
  std::vector<float> logits = {0.0f, std::log(3.0f)};  // p = 0.25, 0.75
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 7;
  Sampler s(p);
  int ones = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ones += s.sample(logits) == 1;
  EXPECT_NEAR(double(ones) / n, 0.75, 0.015);
  EXPECT_NEAR(token_logprob(logits, 1), std::log(0.75), 1e-6);
  auto top = top_logprobs(logits, 2);
  ASSERT_EQ(top.size(), 2u);
  EXPECT_EQ(top[0].first, 1);
}

TEST(Sampler, DistributionIsWhatSampleDraws) {
  const std::vector<float> logits = {0.1f, 2.0f, 1.9f, -1.0f, 0.5f, 2.0f};
  SamplingParams p;
  auto g = Sampler(p).distribution(logits);  // greedy: the first of the tied maxima
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].first, 1);
  EXPECT_EQ(g[0].second, 1.0);
  p.temperature = 1.0f;
  p.top_k = 3;  // ids 1, 5 (tie, lower id first), 2
  p.seed = 3;
  auto d = Sampler(p).distribution(logits);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].first, 1);
  EXPECT_EQ(d[1].first, 5);
  EXPECT_EQ(d[2].first, 2);
  const double e = std::exp(double(1.9f - 2.0f)), z = 2 + e;  // the host's float difference
  EXPECT_NEAR(d[0].second, 1 / z, 1e-12);
  EXPECT_NEAR(d[2].second, e / z, 1e-12);
  p.top_p = 0.5f;  // 1/z = 0.3486 < 0.5 <= 2/z: ids 1 and 5
  auto tp = Sampler(p).distribution(logits);
  ASSERT_EQ(tp.size(), 2u);
  EXPECT_NEAR(tp[0].second, 0.5, 1e-12);
  // sample() draws from exactly that set, at those frequencies
  Sampler s(p);
  int ones = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    const int32_t t = s.sample(logits);
    ASSERT_TRUE(t == 1 || t == 5);
    ones += t == 1;
  }
  EXPECT_NEAR(double(ones) / n, 0.5, 0.04);
}

}  // namespace
