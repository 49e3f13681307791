#include "backend/cpu/ops.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/simd.h"

namespace lily::cpu {

void rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double ss = 0;
    for (int64_t i = 0; i < n; ++i) ss += double(xr[i]) * xr[i];
    float inv = float(1.0 / std::sqrt(ss / double(n) + double(eps)));
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * inv * w[i];
  }
}

float sigmoid(float v) { return 1.0f / (1.0f + std::exp(-v)); }
float silu(float v) { return v / (1.0f + std::exp(-v)); }
float softplus(float v) { return v > 20.0f ? v : std::log1p(std::exp(v)); }

void causal_conv_silu(const float* x, int64_t T, int64_t C, int64_t K, const float* conv, float* state, float* y) {
  // Window of K-1 carried rows followed by the T new rows.
  std::vector<float> win(static_cast<size_t>((K - 1 + T) * C));
  std::memcpy(win.data(), state, size_t((K - 1) * C) * 4);
  std::memcpy(win.data() + (K - 1) * C, x, size_t(T * C) * 4);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      float s = 0;
      for (int64_t j = 0; j < K; ++j) s += conv[c * K + j] * win[size_t((t + j) * C + c)];
      y[t * C + c] = s / (1.0f + std::exp(-s));
    }
  std::memcpy(state, win.data() + T * C, size_t((K - 1) * C) * 4);
}

void delta_rule_recurrent(const DeltaArgs& a) {
  const int64_t dk = a.dk, dv = a.dv;
  for (int64_t t = 0; t < a.T; ++t) {
    const float* q = a.q + t * a.qs;
    const float* k = a.k + t * a.ks;
    const float* v = a.v + t * a.vs;
    const float decay = std::exp(a.g[t]), beta = a.beta[t];
    float* o = a.o + t * a.os;
    for (int64_t d = 0; d < dv; ++d) {
      float* s = a.S + d * dk;
      // S ← αS ; m = Sᵀk ; δ = β(v − m) ; S ← S + kδᵀ ; o = Sᵀq   (row d of S, dk contiguous)
      float m = decay * dot(s, k, dk);
      const float delta = beta * (v[d] - m);
      const v8f dv8 = {decay, decay, decay, decay, decay, decay, decay, decay};
      const v8f de8 = {delta, delta, delta, delta, delta, delta, delta, delta};
      v8f acc = {};
      int64_t i = 0;
      for (; i + 8 <= dk; i += 8) {
        v8f sv = load8(s + i) * dv8 + load8(k + i) * de8;
        store8(s + i, sv);
        acc += sv * load8(q + i);
      }
      float out = hsum(acc);
      for (; i < dk; ++i) {
        s[i] = s[i] * decay + k[i] * delta;
        out += s[i] * q[i];
      }
      o[d] = out;
    }
  }
}

void delta_rule_chunked(const DeltaArgs& a, int64_t C) {
  const int64_t dk = a.dk, dv = a.dv;
  std::vector<float> gam(static_cast<size_t>(C)), A(static_cast<size_t>(C * C)), U(static_cast<size_t>(C * dv)), W(static_cast<size_t>(C * dk)), Vn(static_cast<size_t>(C * dv)),
      Aqk(static_cast<size_t>(C * C)), kb(static_cast<size_t>(C * dk)), q(static_cast<size_t>(C * dk)), v(static_cast<size_t>(C * dv)), beta(static_cast<size_t>(C));
  for (int64_t c0 = 0; c0 < a.T; c0 += C) {
    const int64_t n = std::min(C, a.T - c0);  // rows past n are padding: they do not exist
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(&kb[size_t(r * dk)], a.k + (c0 + r) * a.ks, size_t(dk) * 4);
      std::memcpy(&q[size_t(r * dk)], a.q + (c0 + r) * a.qs, size_t(dk) * 4);
      std::memcpy(&v[size_t(r * dv)], a.v + (c0 + r) * a.vs, size_t(dv) * 4);
      beta[size_t(r)] = a.beta[c0 + r];
      gam[size_t(r)] = (r ? gam[size_t(r - 1)] : 0.0f) + a.g[c0 + r];
    }
    // A = strict_lower(diag(β) K Kᵀ ⊙ Γ); T = (I + A)⁻¹ applied by forward substitution.
    for (int64_t r = 0; r < n; ++r)
      for (int64_t s = 0; s < r; ++s) {
        const float d = dot(&kb[size_t(r * dk)], &kb[size_t(s * dk)], dk);
        A[size_t(r * C + s)] = beta[size_t(r)] * d * std::exp(gam[size_t(r)] - gam[size_t(s)]);
      }
    // U = T diag(β) V ; W = T diag(β e^γ) K  (row r: x_r = b_r − Σ_{s<r} A_rs x_s)
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t d = 0; d < dv; ++d) U[size_t(r * dv + d)] = beta[size_t(r)] * v[size_t(r * dv + d)];
      const float be = beta[size_t(r)] * std::exp(gam[size_t(r)]);
      for (int64_t i = 0; i < dk; ++i) W[size_t(r * dk + i)] = be * kb[size_t(r * dk + i)];
      for (int64_t s = 0; s < r; ++s) {
        const float ars = A[size_t(r * C + s)];
        axpy(-ars, &U[size_t(s * dv)], &U[size_t(r * dv)], dv);
        axpy(-ars, &W[size_t(s * dk)], &W[size_t(r * dk)], dk);
      }
    }
    // Aqk = (Q Kᵀ) ⊙ Γ including the diagonal.
    for (int64_t r = 0; r < n; ++r)
      for (int64_t s = 0; s <= r; ++s) {
        const float d = dot(&q[size_t(r * dk)], &kb[size_t(s * dk)], dk);
        Aqk[size_t(r * C + s)] = d * std::exp(gam[size_t(r)] - gam[size_t(s)]);
      }
    // V' = U − W S ; O = (Q ⊙ e^γ) S + Aqk V'. S is [dv][dk], so (W S)[r][d] = Σ_i W[r][i] S[d][i].
    for (int64_t r = 0; r < n; ++r) {
      const float eg = std::exp(gam[size_t(r)]);
      for (int64_t d = 0; d < dv; ++d) {
        const float* s = a.S + d * dk;
        Vn[size_t(r * dv + d)] = U[size_t(r * dv + d)] - dot(&W[size_t(r * dk)], s, dk);
        a.o[(c0 + r) * a.os + d] = eg * dot(&q[size_t(r * dk)], s, dk);
      }
    }
    for (int64_t r = 0; r < n; ++r) {
      float* o = a.o + (c0 + r) * a.os;
      for (int64_t s = 0; s <= r; ++s) {
        axpy(Aqk[size_t(r * C + s)], &Vn[size_t(s * dv)], o, dv);
      }
    }
    // S ← e^{γ_last} S + (K ⊙ e^{γ_last − γ})ᵀ V'
    const float gl = gam[size_t(n - 1)];
    const float el = std::exp(gl);
    for (int64_t d = 0; d < dv; ++d) {
      float* s = a.S + d * dk;
      for (int64_t i = 0; i < dk; ++i) s[i] *= el;
    }
    for (int64_t r = 0; r < n; ++r) {
      const float f = std::exp(gl - gam[size_t(r)]);
      for (int64_t d = 0; d < dv; ++d) {
        axpy(f * Vn[size_t(r * dv + d)], &kb[size_t(r * dk)], a.S + d * dk, dk);
      }
    }
  }
}

void rope(float* x, int64_t rot, const float* inv_freq, int64_t pos) {
  const int64_t half = rot / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float ang = float(pos) * inv_freq[i];
    const float c = std::cos(ang), s = std::sin(ang);
    const float a = x[i], b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = b * c + a * s;
  }
}

}  // namespace lily::cpu
