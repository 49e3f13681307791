#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/simd.h"
#include "core/thread_pool.h"

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

namespace {
// Runs fn(i0, i1) over [0, n) in pieces of >= ~16K elements' work (elements per index: per): one piece, on the
// calling thread, for decode-sized calls.
template <class Fn>
void split(int64_t n, int64_t per, const Fn& fn) {
  ThreadPool::global().parallel_for(n, std::max<int64_t>(1, (int64_t(1) << 14) / std::max<int64_t>(1, per)), fn);
}
}  // namespace

void swiglu(float* g, const float* up, int64_t n) {
  split((n + 7) / 8, 8, [&](int64_t b0, int64_t b1) {
    for (int64_t i = b0 * 8; i < std::min(n, b1 * 8); i += 8) {
      const int64_t m = std::min<int64_t>(8, n - i);
      store_n(g + i, silu8(load_n(g + i, m)) * load_n(up + i, m), m);
    }
  });
}

void mul_sigmoid(float* o, const float* gate, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t m = std::min<int64_t>(8, n - i);
    store_n(o + i, load_n(o + i, m) * sigmoid8(load_n(gate + i, m)), m);
  }
}

float exp_shift_sum(float* x, int64_t n, float shift) {
  v8f acc = {};
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t m = std::min<int64_t>(8, n - i);
    const v8f e = exp8(load_n(x, m) - shift);
    store_n(x, e, m);
    acc += m == 8 ? e : load_n(x, m);  // the tail's padding lanes stay out of the sum
    x += 8;
  }
  return hsum(acc);
}

void gated_rms_norm(float* o, const float* z, const float* w, int64_t rows, int64_t d, float eps) {
  split(rows, d, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* orow = o + r * d;
      const float* zr = z + r * d;
      const float inv = 1.0f / std::sqrt(dot(orow, orow, d) / float(d) + eps);
      for (int64_t i = 0; i < d; i += 8) {
        const int64_t m = std::min<int64_t>(8, d - i);
        store_n(orow + i, load_n(orow + i, m) * inv * load_n(w + i, m) * silu8(load_n(zr + i, m)), m);
      }
    }
  });
}

void causal_conv_silu(const float* x, int64_t T, int64_t C, int64_t K, const float* conv, float* state, float* y) {
  // Window of K-1 carried rows followed by the T new rows; taps transposed to [K][C] so that one vector
  // load serves 8 channels. Blocks of 8 channels are split over the pool.
  std::vector<float> win(static_cast<size_t>((K - 1 + T) * C)), taps(static_cast<size_t>(K * C));
  std::memcpy(win.data(), state, size_t((K - 1) * C) * 4);
  std::memcpy(win.data() + (K - 1) * C, x, size_t(T * C) * 4);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < K; ++j) taps[size_t(j * C + c)] = conv[c * K + j];
  split((C + 7) / 8, 8 * T * (K + 8), [&](int64_t b0, int64_t b1) {
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = b0 * 8; c < std::min(C, b1 * 8); c += 8) {
        const int64_t m = std::min<int64_t>(8, C - c);
        v8f s = {};
        for (int64_t j = 0; j < K; ++j) s += load_n(taps.data() + j * C + c, m) * load_n(win.data() + (t + j) * C + c, m);
        store_n(y + t * C + c, silu8(s), m);
      }
  });
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

// Per chunk of C rows, the products run as gemm_nn over transposed copies (Kᵀ, Sᵀ) so that every
// product streams its right operand along contiguous rows.
void delta_rule_chunked(const DeltaArgs& a, int64_t C) {
  const int64_t dk = a.dk, dv = a.dv;
  auto buf = [](int64_t n) { return std::vector<float>(static_cast<size_t>(n)); };
  std::vector<float> gam = buf(C), beta = buf(C), A = buf(C * C), Aqk = buf(C * C), U = buf(C * dv), W = buf(C * dk),
                     Vn = buf(C * dv), P = buf(C * dv), kb = buf(C * dk), Kf = buf(C * dk), KT = buf(dk * C),
                     q = buf(C * dk), v = buf(C * dv), St = buf(dk * dv);
  for (int64_t c0 = 0; c0 < a.T; c0 += C) {
    const int64_t n = std::min(C, a.T - c0);  // rows past n are padding: they do not exist
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(&kb[size_t(r * dk)], a.k + (c0 + r) * a.ks, size_t(dk) * 4);
      std::memcpy(&q[size_t(r * dk)], a.q + (c0 + r) * a.qs, size_t(dk) * 4);
      std::memcpy(&v[size_t(r * dv)], a.v + (c0 + r) * a.vs, size_t(dv) * 4);
      beta[size_t(r)] = a.beta[c0 + r];
      gam[size_t(r)] = (r ? gam[size_t(r - 1)] : 0.0f) + a.g[c0 + r];
      for (int64_t i = 0; i < dk; ++i) KT[size_t(i * C + r)] = kb[size_t(r * dk + i)];
    }
    // A = strict_lower(diag(β) K Kᵀ ⊙ Γ); Aqk = lower(Q Kᵀ ⊙ Γ) including the diagonal, zero above.
    gemm_nn(n, n, dk, kb.data(), dk, 1, KT.data(), C, A.data(), C, false);
    gemm_nn(n, n, dk, q.data(), dk, 1, KT.data(), C, Aqk.data(), C, false);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t s = 0; s < n; ++s) {
        const float e = s <= r ? std::exp(gam[size_t(r)] - gam[size_t(s)]) : 0.0f;
        A[size_t(r * C + s)] = s < r ? beta[size_t(r)] * A[size_t(r * C + s)] * e : 0.0f;
        Aqk[size_t(r * C + s)] *= e;
      }
    // T = (I + A)⁻¹ by forward substitution: U = T diag(β) V ; W = T diag(β e^γ) K (x_r = b_r − Σ_{s<r} A_rs x_s)
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
    // V' = U − W S ; O = (Q ⊙ e^γ) S + Aqk V'. S is [dv][dk]; Sᵀ [dk][dv] is the products' right operand.
    for (int64_t d = 0; d < dv; ++d)
      for (int64_t i = 0; i < dk; ++i) St[size_t(i * dv + d)] = a.S[d * dk + i];
    gemm_nn(n, dv, dk, W.data(), dk, 1, St.data(), dv, Vn.data(), dv, false);
    gemm_nn(n, dv, dk, q.data(), dk, 1, St.data(), dv, P.data(), dv, false);
    const float gl = gam[size_t(n - 1)];
    for (int64_t r = 0; r < n; ++r) {
      const float eg = std::exp(gam[size_t(r)]), f = std::exp(gl - gam[size_t(r)]);
      float* o = a.o + (c0 + r) * a.os;
      for (int64_t d = 0; d < dv; ++d) {
        Vn[size_t(r * dv + d)] = U[size_t(r * dv + d)] - Vn[size_t(r * dv + d)];
        o[d] = eg * P[size_t(r * dv + d)];
      }
      for (int64_t i = 0; i < dk; ++i) Kf[size_t(r * dk + i)] = f * kb[size_t(r * dk + i)];
    }
    gemm_nn(n, dv, n, Aqk.data(), C, 1, Vn.data(), dv, a.o + c0 * a.os, a.os, true);
    // S ← e^{γ_last} S + V'ᵀ (K ⊙ e^{γ_last − γ}): S[d][i] += Σ_r V'[r][d] Kf[r][i]
    const float el = std::exp(gl);
    for (int64_t i = 0; i < dv * dk; ++i) a.S[i] *= el;
    gemm_nn(dv, dk, n, Vn.data(), 1, dv, Kf.data(), dk, a.S, dk, true);
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
