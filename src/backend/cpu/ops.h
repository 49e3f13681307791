// Plain float32 reference operations of the Qwen hybrid blocks (model doc §3–§4). Row-major arrays.
#pragma once
#include <cstdint>

namespace lily::cpu {

// y[t] = x[t] / sqrt(mean(x[t]²) + eps) · w   (w already holds 1 + w for zero-centred norms)
void rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y);

float silu(float v);
float sigmoid(float v);
float softplus(float v);  // PyTorch's: identity above 20

// The vector forms (simd.h exp8: within 2 ulp of expf, the same result for a value at any index), split
// over the thread pool when long:
// g[i] = silu(g[i]) · up[i]   (the SwiGLU product)
void swiglu(float* g, const float* up, int64_t n);
// o[i] *= sigmoid(gate[i])
void mul_sigmoid(float* o, const float* gate, int64_t n);
// x[i] = e^(x[i] - shift); returns the sum (a softmax's numerators and denominator)
float exp_shift_sum(float* x, int64_t n, float shift);
// Gated RMSNorm of `rows` rows of d: o = o / sqrt(mean(o²) + eps) · w ⊙ silu(z)   (o, z: [rows][d])
void gated_rms_norm(float* o, const float* z, const float* w, int64_t rows, int64_t d, float eps);

// Causal depthwise conv over T rows of C channels with a carried state of K-1 previous rows
// (state[j*C + c], oldest first), then SiLU. conv[c*K + j] multiplies the input K-1-j steps back.
// Updates `state` to the last K-1 inputs.
void causal_conv_silu(const float* x, int64_t T, int64_t C, int64_t K, const float* conv, float* state, float* y);

// Gated delta rule over T tokens for one value head. q, k: [T, dk] (q already L2-normalised and
// scaled by 1/sqrt(dk), k L2-normalised); v: [T, dv]; beta, g: [T]; S: state [dv][dk] fp32, updated;
// o: [T, dv]. qs/ks/vs are the row strides of q, k, v and o.
struct DeltaArgs {
  const float *q, *k, *v, *beta, *g;
  int64_t qs, ks, vs;
  float* o;
  int64_t os;
  float* S;
  int64_t T, dk, dv;
};
void delta_rule_recurrent(const DeltaArgs& a);
void delta_rule_chunked(const DeltaArgs& a, int64_t chunk = 64);

// Partial NeoX RoPE in place over the first `rot` dims of one head at position `pos`: pairs (i, i+rot/2)
// rotate by pos · inv_freq[i] (fp32 angle, as HF computes it).
void rope(float* x, int64_t rot, const float* inv_freq, int64_t pos);

}  // namespace lily::cpu
