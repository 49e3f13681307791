// EXL3 test operands for the CUDA tests: random EXL3 linears on the host (with their float64 reference
// forward) and their device copies as one cuda::Mat.
#pragma once
#ifdef LILY_HAVE_CUDA
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/half.h"
#include "cuda_test_util.h"
#include "quant/exl3/exl3.h"

namespace lily::cudatest {

inline double silu(double v) { return v / (1 + std::exp(-v)); }

// A random EXL3 linear on the host (every trellis bit pattern is a valid code stream).
struct HostExl3 {
  std::vector<uint16_t> trellis, suh, svh, bias;
  std::vector<int32_t> out_rows;
  quant::Exl3Weight w;
  HostExl3(int K, quant::Exl3Codebook cb, int64_t in, int64_t out, std::mt19937& rng, bool with_bias = false) {
    w.K = K;
    w.codebook = cb;
    w.in = in;
    w.out = out;
    w.in_p = (in + 127) / 128 * 128;
    w.out_p = (out + 127) / 128 * 128;
    trellis.resize(size_t(w.in_p * w.out_p * K / 16));
    for (auto& t : trellis) t = uint16_t(rng());
    std::uniform_real_distribution<float> u(0.5f, 1.5f);
    const float s = 1.f / std::sqrt(float(w.in_p));
    suh.resize(size_t(w.in_p));
    svh.resize(size_t(w.out_p));
    for (auto& v : suh) v = f32_to_f16((rng() & 1 ? -1.f : 1.f) * u(rng));
    for (auto& v : svh) v = f32_to_f16((rng() & 1 ? -s : s) * u(rng));
    if (with_bias) {
      bias.resize(size_t(w.out_p));
      for (auto& v : bias) v = f32_to_f16(u(rng) - 1.f);
    }
    fix();
  }
  HostExl3(const HostExl3& o) : trellis(o.trellis), suh(o.suh), svh(o.svh), bias(o.bias), out_rows(o.out_rows), w(o.w) { fix(); }
  void fix() {
    w.trellis = trellis.data();
    w.suh = suh.data();
    w.svh = svh.data();
    w.bias = bias.empty() ? nullptr : bias.data();
    w.out_rows = out_rows.empty() ? nullptr : out_rows.data();
  }
  std::vector<double> ref(const std::vector<float>& x, int T) const {
    std::vector<float> y(size_t(T) * size_t(w.out));
    quant::exl3_forward_ref(w, x.data(), T, y.data());
    return std::vector<double>(y.begin(), y.end());
  }
};

// Device copy of several EXL3 linears as one cuda::Mat (parts[e·per_expert + p]).
struct DevExl3 {
  std::vector<std::unique_ptr<Dev<uint16_t>>> u16;
  std::vector<std::unique_ptr<Dev<int32_t>>> i32;
  std::unique_ptr<Dev<uint8_t>> parts;
  cuda::Mat m;
  DevExl3(const std::vector<const HostExl3*>& ps, int per_expert) {
    std::vector<cuda::Exl3Part> h(ps.size());
    auto up16 = [&](const std::vector<uint16_t>& v) -> const uint16_t* {
      if (v.empty()) return nullptr;
      u16.push_back(std::make_unique<Dev<uint16_t>>(v));
      return u16.back()->p;
    };
    for (size_t i = 0; i < ps.size(); ++i) {
      const HostExl3& q = *ps[i];
      h[i].trellis = up16(q.trellis);
      h[i].suh = up16(q.suh);
      h[i].svh = up16(q.svh);
      h[i].bias = up16(q.bias);
      if (!q.out_rows.empty()) {
        i32.push_back(std::make_unique<Dev<int32_t>>(q.out_rows));
        h[i].out_rows = i32.back()->p;
      }
      h[i].in_p = int(q.w.in_p);
      h[i].out_p = int(q.w.out_p);
      h[i].rows = int(q.w.out);
      h[i].row0 = i % size_t(per_expert) == 0 ? 0 : h[i - 1].row0 + h[i - 1].rows;
    }
    std::vector<uint8_t> bytes(sizeof(cuda::Exl3Part) * h.size());
    std::memcpy(bytes.data(), h.data(), bytes.size());
    parts = std::make_unique<Dev<uint8_t>>(bytes);
    m.exl3 = true;
    m.parts = reinterpret_cast<const cuda::Exl3Part*>(parts->p);
    m.nparts = per_expert;
    m.K = ps[0]->w.K;
    m.cb = int(ps[0]->w.codebook);
    m.in_p = int(ps[0]->w.in_p);
    for (int p = 0; p < per_expert; ++p) m.col_blocks += int(ps[size_t(p)]->w.out_p / 128);
  }
};

}  // namespace lily::cudatest
#endif
