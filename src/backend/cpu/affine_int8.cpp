// Affine 4/8-bit × int8 activation products (contract in affine_int8.h).
//
// Activation layout (built once per product, per token row):
//   q  [T][in] int8. 8-bit weights: natural order. 4-bit weights: the row is cut into chunks of 128 inputs
//      (then one of 64 and one of 32 for the remainder); inside a chunk of width w the even inputs come
//      first, then the odd ones: input cb+i sits at cb + (i even ? i/2 : w/2 + i/2). The low nibbles of
//      the chunk's w/2 packed bytes are exactly the even codes and the high nibbles the odd codes, so the
//      kernels unpack with one AND and one shift and never interleave.
//   d  [T][in/32 · rep] the block scale d_b repeated rep times (rep 4 for 4-bit, 8 for 8-bit): that is the
//      block of each int32 lane of a vpdpbusd over the layout above, so one load gives the lane scales.
//   xs [T][gp] exact float Σx per weight group, zero-padded to gp = multiple of 16 groups.
// Weight scales and biases of the rows in flight are converted to float once per row block.
#include "backend/cpu/affine_int8.h"
#include "backend/cpu/affine_int8_internal.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"

namespace lily::cpu {

namespace {

using int8_detail::Acts;
using int8_detail::pos4;

}  // namespace

int8_detail::Chunk4 int8_detail::chunk4(int64_t i, int64_t in) {
  const int64_t full = in / 128 * 128;
  if (i < full) return {i / 128 * 128, 128};
  if (in - full >= 64 && i < full + 64) return {full, 64};
  return {in - 32, 32};
}

int64_t int8_detail::pos4(int64_t i, int64_t in) {
  const auto [cb, w] = chunk4(i, in);
  const int64_t o = i - cb;
  return cb + ((o & 1) ? w / 2 + o / 2 : o / 2);
}

namespace {

// Sizes the buffers of `a` for T rows; quantize_token_* fill one row each.
void prepare_acts(int64_t T, int64_t in, int bits, int64_t gs, Acts& a) {
  const int rep = bits == 4 ? 4 : 8;
  const int64_t G = in / gs;
  a.T = T;
  a.in = in;
  a.dl = in / 32 * rep;
  a.gp = (G + 15) / 16 * 16;
  a.qv.resize(size_t(T * in));
  a.dv.resize(size_t(T * a.dl));
  a.xsv.assign(size_t(T * a.gp), 0.0f);
  a.q = a.qv.data();
  a.d = a.dv.data();
  a.xs = a.xsv.data();
}

// Plain quantiser of one row (pos: the 4-bit layout positions, or null for 8-bit).
void quantize_token_plain(const float* xt, int64_t in, int bits, int64_t gs, const int64_t* pos, int8_t* qt,
                          float* dt, float* st) {
  const int rep = bits == 4 ? 4 : 8;
  for (int64_t b = 0; b < in / 32; ++b) {
    const float* xb = xt + b * 32;
    float amax = 0;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
    for (int k = 0; k < rep; ++k) dt[b * rep + k] = d;
    int8_t qb[32];
    for (int i = 0; i < 32; ++i) {
      const float v = xb[i] * id;  // |v| ≤ 127 (+ rounding), round half away from zero
      qb[i] = int8_t(std::clamp(int(v + (v >= 0 ? 0.5f : -0.5f)), -127, 127));
    }
    if (bits == 4)
      for (int i = 0; i < 32; ++i) qt[pos[b * 32 + i]] = qb[i];
    else
      std::memcpy(qt + b * 32, qb, 32);
  }
  for (int64_t g = 0; g < in / gs; ++g) {
    float s = 0;
    for (int64_t i = 0; i < gs; ++i) s += xt[g * gs + i];
    st[g] = s;
  }
}

// One block of weight rows for a kernel: code bytes per row, float scales / biases [rows][ld].
struct KArgs {
  const uint8_t* w[4] = {};
  const float* s = nullptr;
  const float* b = nullptr;
  int64_t ld = 0;
  const Acts* a = nullptr;
  int64_t in = 0, gs = 0;
  int gshift = 0;                           // log2(gs): the kernels' group index of input i is i >> gshift
};

// Scalar kernel: integer block sums in int32, float accumulation in double. One row, all tokens.
void scalar_row(int bits, const KArgs& k, int64_t T, float* y, int64_t ys, const int64_t* pos) {
  const Acts& a = *k.a;
  const int rep = bits == 4 ? 4 : 8;
  const int64_t in = k.in, nb = in / 32, G = in / k.gs;
  for (int64_t t = 0; t < T; ++t) {
    const int8_t* q = a.q + t * in;
    const float* d = a.d + t * a.dl;
    double acc = 0;
    for (int64_t b = 0; b < nb; ++b) {
      int32_t isum = 0;
      for (int64_t i = b * 32; i < b * 32 + 32; ++i) {
        const int32_t c = bits == 4 ? (k.w[0][i / 2] >> (4 * (i & 1))) & 15 : k.w[0][i];
        isum += c * int32_t(q[bits == 4 ? pos[i] : i]);
      }
      acc += double(k.s[b * 32 / k.gs]) * double(d[b * rep]) * double(isum);
    }
    for (int64_t g = 0; g < G; ++g) acc += double(k.b[g]) * double(a.xs[t * a.gp + g]);
    y[t * ys] = float(acc);
  }
}

#if LILY_X86

LILY_INT8_ZMM_BEGIN
namespace zmm {

// One token row of quantize_acts (same per-element float operations as the scalar loop, so the same
// codes and block scales; the group sums Σx are added in another order).
void quantize_token(const float* xt, int64_t in, int bits, int64_t gs, int8_t* qt, float* dt, float* st) {
  const int rep = bits == 4 ? 4 : 8;
  const __m512 signm = _mm512_set1_ps(-0.0f), half = _mm512_set1_ps(0.5f);
  const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const int64_t full = in / 128 * 128;
  for (int64_t cb = 0; cb < in;) {
    const int64_t w = cb < full ? 128 : (in - cb >= 64 ? 64 : 32);
    __m512i I[8];
    for (int64_t p = 0; p < w / 16; p += 2) {  // block (cb + 16p) / 32
      const float* xb = xt + cb + p * 16;
      const __m512 a0 = _mm512_loadu_ps(xb), a1 = _mm512_loadu_ps(xb + 16);
      const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a0), _mm512_abs_ps(a1)));
      const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
      float* db = dt + (cb + p * 16) / 32 * rep;
      for (int k = 0; k < rep; ++k) db[k] = d;
      __m512 v0 = _mm512_mul_ps(a0, _mm512_set1_ps(id)), v1 = _mm512_mul_ps(a1, _mm512_set1_ps(id));
      v0 = _mm512_add_ps(v0, _mm512_or_ps(_mm512_and_ps(v0, signm), half));  // round half away from zero
      v1 = _mm512_add_ps(v1, _mm512_or_ps(_mm512_and_ps(v1, signm), half));
      I[p] = _mm512_cvttps_epi32(v0);
      I[p + 1] = _mm512_cvttps_epi32(v1);
    }
    if (bits == 8) {
      for (int64_t p = 0; p < w / 16; ++p)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qt + cb + 16 * p), _mm512_cvtsepi32_epi8(I[p]));
    } else {  // evens of the chunk first, then odds
      for (int64_t j = 0; j < w / 32; ++j) {
        const __m512i e = _mm512_permutex2var_epi32(I[2 * j], ie, I[2 * j + 1]);
        const __m512i o = _mm512_permutex2var_epi32(I[2 * j], io, I[2 * j + 1]);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qt + cb + 16 * j), _mm512_cvtsepi32_epi8(e));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qt + cb + w / 2 + 16 * j), _mm512_cvtsepi32_epi8(o));
      }
    }
    cb += w;
  }
  for (int64_t g = 0; g < in / gs; ++g) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < gs; i += 16) acc = _mm512_add_ps(acc, _mm512_loadu_ps(xt + g * gs + i));
    st[g] = _mm512_reduce_add_ps(acc);
  }
}

}  // namespace zmm
LILY_INT8_ZMM_END

LILY_TARGET_BEGIN("avx2,fma,f16c")
namespace ymm_quant {

// quantize_token for AVX2 hosts without AVX-512: the plain loop's per-element float operations (same codes
// and block scales); the group sums Σx are added in 8 lanes, then across them.
void quantize_token(const float* xt, int64_t in, int bits, int64_t gs, int8_t* qt, float* dt, float* st) {
  const int rep = bits == 4 ? 4 : 8;
  const __m256 signm = _mm256_set1_ps(-0.0f), half = _mm256_set1_ps(0.5f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);  // dwords of the two packs back in input order
  // per 128-bit lane: the 8 even bytes, then the 8 odd ones
  const __m256i eo = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12,
                                      14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t b = 0; b < in / 32; ++b) {
    const float* xb = xt + b * 32;
    __m256 v[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xb + 8 * i);
      m = _mm256_max_ps(m, _mm256_andnot_ps(signm, v[i]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float d = amax / 127.0f, id = amax > 0 ? 127.0f / amax : 0.0f;
    for (int k = 0; k < rep; ++k) dt[b * rep + k] = d;
    __m256i I[4];
    for (int i = 0; i < 4; ++i) {
      const __m256 u = _mm256_mul_ps(v[i], _mm256_set1_ps(id));
      I[i] = _mm256_cvttps_epi32(_mm256_add_ps(u, _mm256_or_ps(_mm256_and_ps(u, signm), half)));  // half away from 0
    }
    // |I| ≤ 127: the saturating packs are exact
    const __m256i q = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(_mm256_packs_epi32(I[0], I[1]), _mm256_packs_epi32(I[2], I[3])), order);
    if (bits == 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qt + b * 32), q);
      continue;
    }
    // the block's evens go to cb + o/2, its odds to cb + w/2 + o/2 (o: the block's offset in its chunk)
    const auto [cb, w] = int8_detail::chunk4(b * 32, in);
    const int64_t o = b * 32 - cb;
    const __m256i e = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(q, eo), 0xD8);  // [16 evens | 16 odds]
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qt + cb + o / 2), _mm256_castsi256_si128(e));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qt + cb + w / 2 + o / 2), _mm256_extracti128_si256(e, 1));
  }
  for (int64_t g = 0; g < in / gs; ++g) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < gs; i += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(xt + g * gs + i));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    st[g] = _mm_cvtss_f32(_mm_add_ss(s4, _mm_movehdup_ps(s4)));
  }
}

}  // namespace ymm_quant
LILY_TARGET_END

LILY_TARGET_BEGIN("avx2,fma,f16c,avxvnni")
namespace ymm_vnni {
constexpr int kRows = 4;
#define LILY_YMM_VNNI 1
#include "backend/cpu/affine_int8_ymm.inc"
#include "backend/cpu/affine_int8_ymm_tiles.inc"
#include "backend/cpu/affine_int8_ymm_gemv.inc"
#undef LILY_YMM_VNNI
}  // namespace ymm_vnni
LILY_TARGET_END

LILY_TARGET_BEGIN("avx2,fma,f16c")
namespace ymm_avx2 {
constexpr int kRows = 4;
#define LILY_YMM_VNNI 0
#include "backend/cpu/affine_int8_ymm.inc"
#include "backend/cpu/affine_int8_ymm_tiles.inc"
#include "backend/cpu/affine_int8_ymm_gemv.inc"
#undef LILY_YMM_VNNI
}  // namespace ymm_avx2
LILY_TARGET_END

#endif  // LILY_X86

int rows_per_block(Int8Isa isa) {
#if LILY_X86
  switch (isa) {
    case Int8Isa::Avx512Vnni: return int8_detail::kTileRows;
    case Int8Isa::AvxVnni: return ymm_vnni::kRows;
    case Int8Isa::Avx2: return ymm_avx2::kRows;
    default: break;
  }
#endif
  return 1;
}

// Float scales and biases of `n` rows from `o0`, zero-padded to ld per row.
void load_row_params_plain(const quant::AffineWeight& w, int64_t o0, int n, int64_t ld, float* s, float* b) {
  const int64_t G = w.groups();
  for (int r = 0; r < n; ++r) {
    float* sr = s + r * ld;
    float* br = b + r * ld;
    if (w.scale_dtype == DType::BF16) {
      const uint16_t* ps = static_cast<const uint16_t*>(w.scales) + (o0 + r) * G;
      const uint16_t* pb = static_cast<const uint16_t*>(w.biases) + (o0 + r) * G;
      for (int64_t g = 0; g < G; ++g) {
        sr[g] = bf16_to_f32(ps[g]);
        br[g] = bf16_to_f32(pb[g]);
      }
    } else {
      for (int64_t g = 0; g < G; ++g) {
        sr[g] = quant::affine_scale(w, o0 + r, g);
        br[g] = quant::affine_bias(w, o0 + r, g);
      }
    }
    std::fill(sr + G, sr + ld, 0.0f);
    std::fill(br + G, br + ld, 0.0f);
  }
}


}  // namespace

const char* int8_isa_name(Int8Isa isa) {
  switch (isa) {
    case Int8Isa::Scalar: return "scalar";
    case Int8Isa::Avx2: return "avx2";
    case Int8Isa::AvxVnni: return "avx-vnni";
    case Int8Isa::Avx512Vnni: return "avx512-vnni";
  }
  return "?";
}

#if LILY_X86
// AVX-VNNI (256-bit): CPUID.(EAX=7, ECX=1):EAX bit 4; clang 14's __builtin_cpu_supports does not name it.
static bool has_avx_vnni() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1u);
}
#endif

bool int8_isa_available(Int8Isa isa) {
#if LILY_X86
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  switch (isa) {
    case Int8Isa::Scalar: return true;
    case Int8Isa::Avx2: return avx2;
    case Int8Isa::AvxVnni: return avx2 && has_avx_vnni();
    case Int8Isa::Avx512Vnni:
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vnni");
  }
  return false;
#else
  return isa == Int8Isa::Scalar;
#endif
}

Int8Isa int8_isa_best() {
  static const Int8Isa best = [] {
    for (Int8Isa i : {Int8Isa::Avx512Vnni, Int8Isa::AvxVnni, Int8Isa::Avx2})
      if (int8_isa_available(i)) return i;
    return Int8Isa::Scalar;
  }();
  return best;
}

bool affine_int8_supported(const quant::AffineWeight& w) {
  return (w.bits == 4 || w.bits == 8) && (w.group_size == 32 || w.group_size == 64 || w.group_size == 128) &&
         w.in % 32 == 0 && w.in % w.group_size == 0 && w.in > 0;
}

namespace {

// The activation rows of a product, quantised once (shared by products with the same input and layout).
struct Quantised {
  Acts a;
  std::vector<int64_t> pos;  // the plain quantiser's 4-bit positions (also the scalar kernel's)
};

void quantise(const quant::AffineWeight& w, const float* x, int64_t T, Int8Isa isa, Quantised& out) {
  Acts& acts = out.a;
  prepare_acts(T, w.in, w.bits, w.group_size, acts);
  // The activations are quantised the same way whichever kernel runs (the AVX-512 and AVX2 quantisers give the
  // plain one's codes and scales), so the kernels can be compared on identical inputs.
  static const bool zmm_quant = int8_isa_available(Int8Isa::Avx512Vnni);
  static const bool ymm_quant = !zmm_quant && int8_isa_available(Int8Isa::Avx2);
  out.pos.clear();
  if (w.bits == 4 && ((!zmm_quant && !ymm_quant) || isa == Int8Isa::Scalar)) {
    out.pos.resize(size_t(w.in));
    for (int64_t i = 0; i < w.in; ++i) out.pos[size_t(i)] = pos4(i, w.in);
  }
  for (int64_t t = 0; t < T; ++t) {
    int8_t* qt = acts.qv.data() + t * w.in;
    float* dt = acts.dv.data() + t * acts.dl;
    float* st = acts.xsv.data() + t * acts.gp;
#if LILY_X86
    if (zmm_quant) {
      zmm::quantize_token(x + t * w.in, w.in, w.bits, w.group_size, qt, dt, st);
      continue;
    }
    if (ymm_quant) {
      ymm_quant::quantize_token(x + t * w.in, w.in, w.bits, w.group_size, qt, dt, st);
      continue;
    }
#endif
    quantize_token_plain(x + t * w.in, w.in, w.bits, w.group_size, out.pos.data(), qt, dt, st);
  }
}

// Row blocks [b0, b1) (R = rows_per_block(isa) rows each) of y[T, w.out] = x · Wᵀ: the ymm 8-bit and scalar
// kernels (AVX-512 VNNI runs its own: gemv_blocks_avx512 / tile_rows_avx512).
void run_blocks(const quant::AffineWeight& w, const Quantised& qa, int64_t T, float* y, Int8Isa isa, int64_t b0,
                int64_t b1) {
  const Acts& a = qa.a;
  const int R = rows_per_block(isa);
  const int64_t out = w.out, ld = a.gp + 16, row_bytes = w.row_words * 4;
  // [4][ld] scales, [4][ld] biases (load_row_params_plain zero-pads each row)
  thread_local std::vector<float> sb;
  if (sb.size() < size_t(8 * ld)) sb.resize(size_t(8 * ld));
  KArgs k;
  k.s = sb.data();
  k.b = sb.data() + 4 * ld;
  k.ld = ld;
  k.a = &a;
  k.in = w.in;
  k.gs = w.group_size;
  k.gshift = w.group_size == 32 ? 5 : w.group_size == 64 ? 6 : 7;
  for (int64_t blk = b0; blk < b1; ++blk) {
    const int64_t o0 = blk * R;
    const int n = int(std::min<int64_t>(R, out - o0));
    for (int r0 = 0; r0 < n;) {
      const int rr = (n == R) ? R : 1;  // full block, or the last rows one at a time
      load_row_params_plain(w, o0 + r0, rr, ld, sb.data(), sb.data() + 4 * ld);
      for (int r = 0; r < rr; ++r)
        k.w[r] = reinterpret_cast<const uint8_t*>(w.packed) + (o0 + r0 + r) * row_bytes;
      float* yo = y + o0 + r0;
      switch (isa) {
#if LILY_X86
        case Int8Isa::AvxVnni: ymm_vnni::run_block8(rr, k, T, yo, out); break;
        case Int8Isa::Avx2: ymm_avx2::run_block8(rr, k, T, yo, out); break;
#endif
        default: scalar_row(w.bits, k, T, yo, out, qa.pos.data()); break;
      }
      r0 += rr;
    }
  }
}

// 8-row blocks [b0, b1) of a 4-bit product on the ymm ISAs: tiles (affine_int8_ymm_tiles.inc) or the
// decode kernel (affine_int8_ymm_gemv.inc).
#if LILY_X86
constexpr int rows8_ymm = ymm_avx2::kTileRows8;
static_assert(ymm_avx2::kGemvRows8 == rows8_ymm);
#else
constexpr int rows8_ymm = 1;
#endif
void run_ymm8(const quant::AffineWeight& w, const Acts& a, float* y, Int8Isa isa, bool tiles, int64_t b0, int64_t b1) {
#if LILY_X86
  const bool vnni = isa == Int8Isa::AvxVnni;
  if (!tiles) return vnni ? ymm_vnni::gemv_rows8(w, a, b0, b1, y, w.out) : ymm_avx2::gemv_rows8(w, a, b0, b1, y, w.out);
  for (int64_t blk = b0; blk < b1; ++blk) {
    const int64_t o0 = blk * rows8_ymm;
    if (vnni) ymm_vnni::tile_rows8(w, a, o0, y + o0, w.out);
    else ymm_avx2::tile_rows8(w, a, o0, y + o0, w.out);
  }
#else
  (void)w, (void)a, (void)y, (void)isa, (void)tiles, (void)b0, (void)b1;
#endif
}

void check_job(const quant::AffineWeight& w, Int8Isa isa) {
  LILY_CHECK(affine_int8_supported(w), "int8 affine path: unsupported bits {} / group {} / in {}", w.bits,
             w.group_size, w.in);
  LILY_CHECK(int8_isa_available(isa), "int8 affine path: {} is not available on this CPU", int8_isa_name(isa));
}

}  // namespace

bool int8_tiles_available(Int8Isa isa) { return isa != Int8Isa::Scalar && int8_isa_available(isa); }

void affine_matmul_int8(const quant::AffineWeight& w, const float* x, int64_t T, float* y, Int8Isa isa,
                        Int8Tiling tiling) {
  const Int8Job job{&w, x, T, y};
  affine_matmul_int8_batch(std::span<const Int8Job>(&job, 1), isa, tiling);
}

void affine_matmul_int8_batch(std::span<const Int8Job> jobs, Int8Isa isa, Int8Tiling tiling) {
  LILY_CHECK(tiling != Int8Tiling::Tiles || int8_tiles_available(isa), "int8 affine path: no tile kernel for {}",
             int8_isa_name(isa));
  // Quantise each distinct (input, rows, layout) once; on the calling thread, alive while the pool runs.
  thread_local std::vector<std::unique_ptr<Quantised>> pool_q;
  std::vector<int> qi(jobs.size(), -1);
  std::vector<int64_t> start(jobs.size() + 1, 0);  // first global block of each job
  std::vector<char> tiles(jobs.size(), 0);           // job runs as tiles of kTileRows rows
  std::vector<char> gemv8(jobs.size(), 0);           // job runs the ymm 8-row decode kernel
  const int R = rows_per_block(isa);
  int used = 0;
  int64_t madds = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const Int8Job& jb = jobs[j];
    check_job(*jb.w, isa);
    start[j + 1] = start[j];
    if (jb.T <= 0 || jb.w->out <= 0) continue;
    for (size_t p = 0; p < j && qi[j] < 0; ++p)
      if (qi[p] >= 0 && jobs[p].x == jb.x && jobs[p].T == jb.T && jobs[p].w->in == jb.w->in &&
          jobs[p].w->bits == jb.w->bits && jobs[p].w->group_size == jb.w->group_size)
        qi[j] = qi[p];
    if (qi[j] < 0) {
      if (size_t(used) == pool_q.size()) pool_q.push_back(std::make_unique<Quantised>());
      quantise(*jb.w, jb.x, jb.T, isa, *pool_q[size_t(used)]);
      qi[j] = used++;
    }
    // the ymm tiles take 4-bit weights only (8-bit codes would saturate maddubs); 8-bit runs the row kernels
    tiles[j] = int8_tiles_available(isa) && (isa == Int8Isa::Avx512Vnni || jb.w->bits == 4) &&
               (tiling == Int8Tiling::Tiles || (tiling == Int8Tiling::Auto && jb.T >= kInt8TileMinTokens));
    // 4-bit rows on the ymm ISAs: the 8-row decode kernel (affine_int8_ymm_gemv.inc)
    gemv8[j] = !tiles[j] && jb.w->bits == 4 && (isa == Int8Isa::Avx2 || isa == Int8Isa::AvxVnni);
    const int Rj = (tiles[j] && isa != Int8Isa::Avx512Vnni) || gemv8[j] ? rows8_ymm : R;
    start[j + 1] = start[j] + (jb.w->out + Rj - 1) / Rj;
    madds += jb.w->out * jb.w->in * jb.T;
  }
  const int64_t nblk = start[jobs.size()];
  if (nblk == 0) return;
  // Blocks of less than ~64K multiply-adds per call are not worth a hand-off to the pool.
  const int64_t per_block = std::max<int64_t>(1, madds / nblk);
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / per_block);
  const auto& qs = pool_q;  // the calling thread's buffers (the lambda runs on the workers too)
  ThreadPool::global().parallel_for(nblk, grain, [&](int64_t b0, int64_t b1) {
    size_t j = size_t(std::upper_bound(start.begin(), start.end(), b0) - start.begin()) - 1;
    for (int64_t b = b0; b < b1;) {
      while (start[j + 1] <= b) ++j;  // skips empty jobs
      const int64_t e = std::min(b1, start[j + 1]);
      const Int8Job& jb = jobs[j];
      if (isa == Int8Isa::Avx512Vnni) {
        const auto& a = qs[size_t(qi[j])]->a;
        if (!tiles[j]) int8_detail::gemv_blocks_avx512(*jb.w, a, b - start[j], e - start[j], jb.y, jb.w->out);
        else
          for (int64_t blk = b - start[j]; blk < e - start[j]; ++blk) {
            const int64_t o0 = blk * int8_detail::kTileRows;
            int8_detail::tile_rows_avx512(*jb.w, a, o0, jb.y + o0, jb.w->out);
          }
      } else if (tiles[j] || gemv8[j]) {
        run_ymm8(*jb.w, qs[size_t(qi[j])]->a, jb.y, isa, tiles[j], b - start[j], e - start[j]);
      } else {
        run_blocks(*jb.w, *qs[size_t(qi[j])], jb.T, jb.y, isa, b - start[j], e - start[j]);
      }
      b = e;
    }
  });
}

void affine_int8_quantize_row(const float* x, int64_t in, int bits, int group_size, bool simd, int8_t* q, float* d,
                              float* xsum) {
  LILY_CHECK((bits == 4 || bits == 8) && in % 32 == 0 && in % group_size == 0, "bad int8 quantiser shape");
#if LILY_X86
  if (simd) {
    if (int8_isa_available(Int8Isa::Avx512Vnni)) return zmm::quantize_token(x, in, bits, group_size, q, d, xsum);
    LILY_CHECK(int8_isa_available(Int8Isa::Avx2), "the SIMD quantisers need AVX2 or AVX-512 VNNI");
    return ymm_quant::quantize_token(x, in, bits, group_size, q, d, xsum);
  }
#else
  LILY_CHECK(!simd, "no SIMD quantiser on this architecture");
#endif
  std::vector<int64_t> pos(static_cast<size_t>(in));
  for (int64_t i = 0; i < in; ++i) pos[size_t(i)] = pos4(i, in);
  quantize_token_plain(x, in, bits, group_size, pos.data(), q, d, xsum);
}

void affine_int8_error_bound(const quant::AffineWeight& w, const float* x, int64_t T, float* bound) {
  const int64_t nb = w.in / 32;
  std::vector<double> sw(static_cast<size_t>(nb));
  for (int64_t o = 0; o < w.out; ++o) {
    const uint32_t* row = w.packed + o * w.row_words;
    for (int64_t b = 0; b < nb; ++b) {  // Σ|s·code| per block: the part of W that multiplies rounded inputs
      double s = 0;
      for (int64_t i = b * 32; i < b * 32 + 32; ++i)
        s += std::fabs(double(quant::affine_scale(w, o, i / w.group_size)) * quant::affine_code(row, w.bits, i));
      sw[size_t(b)] = s;
    }
    for (int64_t t = 0; t < T; ++t) {
      double e = 0;
      for (int64_t b = 0; b < nb; ++b) {
        float amax = 0;
        for (int64_t i = b * 32; i < b * 32 + 32; ++i) amax = std::max(amax, std::fabs(x[t * w.in + i]));
        e += sw[size_t(b)] * double(amax / 127.0f) / 2;
      }
      bound[t * w.out + o] = float(e);
    }
  }
}

}  // namespace lily::cpu
