#include "quant/affine/affine.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/half.h"

namespace lily::quant {

bool affine_bits_supported(int bits) {
  return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
}
bool affine_group_supported(int g) { return g == 32 || g == 64 || g == 128; }

void affine_validate(const AffineWeight& w, const char* what) {
  if (!affine_bits_supported(w.bits)) fail("{}: affine bits {} unsupported (2, 3, 4, 5, 6 or 8)", what, w.bits);
  if (!affine_group_supported(w.group_size))
    fail("{}: affine group size {} unsupported (32, 64 or 128)", what, w.group_size);
  if (w.in <= 0 || w.out <= 0 || w.in % w.group_size != 0)
    fail("{}: input width {} is not a multiple of the group size {}", what, w.in, w.group_size);
  if (w.row_words * 32 != w.in * w.bits)
    fail("{}: {} words per row do not hold {} codes of {} bits", what, w.row_words, w.in, w.bits);
  if (w.scale_dtype != DType::BF16 && w.scale_dtype != DType::F16 && w.scale_dtype != DType::F32)
    fail("{}: scales/biases dtype {} unsupported (BF16, F16 or F32)", what, dtype_name(w.scale_dtype));
}

namespace {
inline float load_scalar(DType dt, const void* p, int64_t i) {
  switch (dt) {
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// 8 codes of `B` bits from B bytes (LSB-first stream).
template <int B>
inline void unpack8(const uint8_t* p, uint8_t* c) {
  uint64_t v = 0;
  std::memcpy(&v, p, B);  // little-endian host
  constexpr uint64_t mask = (uint64_t(1) << B) - 1;
  for (int j = 0; j < 8; ++j) c[j] = uint8_t((v >> (j * B)) & mask);
}

template <int B>
void unpack_row(const uint8_t* p, int64_t n, uint8_t* codes) {
  for (int64_t i = 0; i < n; i += 8) unpack8<B>(p + (i / 8) * B, codes + i);
}
}  // namespace

float affine_scale(const AffineWeight& w, int64_t row, int64_t g) {
  return load_scalar(w.scale_dtype, w.scales, row * w.groups() + g);
}
float affine_bias(const AffineWeight& w, int64_t row, int64_t g) {
  return load_scalar(w.scale_dtype, w.biases, row * w.groups() + g);
}

uint32_t affine_code(const uint32_t* row, int bits, int64_t i) {
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(row);
  uint32_t v = 0;
  for (int b = 0; b < bits; ++b) {
    int64_t bit = i * bits + b;
    v |= uint32_t((bytes[bit >> 3] >> (bit & 7)) & 1u) << b;
  }
  return v;
}

void affine_unpack(const uint32_t* row, int bits, int64_t n, uint8_t* codes) {
  const uint8_t* p = reinterpret_cast<const uint8_t*>(row);
  switch (bits) {
    case 2: unpack_row<2>(p, n, codes); break;
    case 3: unpack_row<3>(p, n, codes); break;
    case 4: unpack_row<4>(p, n, codes); break;
    case 5: unpack_row<5>(p, n, codes); break;
    case 6: unpack_row<6>(p, n, codes); break;
    case 8: std::memcpy(codes, p, size_t(n)); break;
    default: LILY_ASSERT(false);
  }
}

void affine_pack(const uint8_t* codes, int bits, int64_t n, uint32_t* row) {
  uint8_t* p = reinterpret_cast<uint8_t*>(row);
  for (int64_t i = 0; i < n; i += 8) {
    uint64_t v = 0;
    for (int j = 0; j < 8; ++j) v |= uint64_t(codes[i + j] & ((1u << bits) - 1)) << (j * bits);
    std::memcpy(p + (i / 8) * bits, &v, size_t(bits));
  }
}

void affine_dequant_row(const AffineWeight& w, int64_t row, float* out) {
  const int64_t G = w.groups(), gs = w.group_size;
  uint8_t codes[128];
  const uint8_t* base = reinterpret_cast<const uint8_t*>(w.packed + row * w.row_words);
  for (int64_t g = 0; g < G; ++g) {
    affine_unpack(reinterpret_cast<const uint32_t*>(base + g * gs * w.bits / 8), w.bits, gs, codes);
    const float s = affine_scale(w, row, g), b = affine_bias(w, row, g);
    float* o = out + g * gs;
    for (int64_t i = 0; i < gs; ++i) o[i] = s * float(codes[i]) + b;
  }
}

void affine_dequant_row_ref(const AffineWeight& w, int64_t row, float* out) {
  const uint32_t* r = w.packed + row * w.row_words;
  for (int64_t i = 0; i < w.in; ++i) {
    int64_t g = i / w.group_size;
    out[i] = affine_scale(w, row, g) * float(affine_code(r, w.bits, i)) + affine_bias(w, row, g);
  }
}

AffineWeight AffineQuantized::view() const {
  AffineWeight w;
  w.bits = bits;
  w.group_size = group_size;
  w.out = out;
  w.in = in;
  w.packed = packed.data();
  w.row_words = in * bits / 32;
  w.scale_dtype = scale_dtype;
  w.scales = scales.data();
  w.biases = biases.data();
  return w;
}

AffineQuantized affine_quantize(const float* w, int64_t out, int64_t in, int bits, int group_size, DType scale_dtype) {
  if (!affine_bits_supported(bits)) fail("affine bits {} unsupported (2, 3, 4, 5, 6 or 8)", bits);
  if (!affine_group_supported(group_size)) fail("affine group size {} unsupported (32, 64 or 128)", group_size);
  if (in % group_size != 0) fail("input width {} is not a multiple of the group size {}", in, group_size);
  if (scale_dtype != DType::BF16 && scale_dtype != DType::F16)
    fail("affine scales dtype {} unsupported (BF16 or F16)", dtype_name(scale_dtype));
  AffineQuantized q;
  q.bits = bits;
  q.group_size = group_size;
  q.out = out;
  q.in = in;
  q.scale_dtype = scale_dtype;
  const int64_t G = in / group_size, words = in * bits / 32;
  q.packed.assign(size_t(out * words), 0);
  q.scales.resize(size_t(out * G));
  q.biases.resize(size_t(out * G));
  const float n_bins = float((1 << bits) - 1);
  auto store = [&](float v) { return scale_dtype == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v); };
  std::vector<uint8_t> codes(static_cast<size_t>(in));
  for (int64_t o = 0; o < out; ++o) {
    const float* row = w + o * in;
    for (int64_t g = 0; g < G; ++g) {
      const float* x = row + g * group_size;
      float lo = x[0], hi = x[0];
      for (int i = 1; i < group_size; ++i) {
        lo = std::min(lo, x[i]);
        hi = std::max(hi, x[i]);
      }
      const bool low_edge = std::fabs(lo) > std::fabs(hi);
      float scale = std::max((hi - lo) / n_bins, 1e-7f);
      if (!low_edge) scale = -scale;
      const float edge = low_edge ? lo : hi;
      const float q0 = std::round(edge / scale);  // std::round: halves away from zero
      float bias = 0.0f;
      if (q0 != 0.0f) {
        scale = edge / q0;
        bias = edge;
      }
      for (int i = 0; i < group_size; ++i) {
        float c = std::round((x[i] - bias) / scale);
        codes[size_t(g * group_size + i)] = uint8_t(std::clamp(c, 0.0f, n_bins));
      }
      q.scales[size_t(o * G + g)] = store(scale);
      q.biases[size_t(o * G + g)] = store(bias);
    }
    affine_pack(codes.data(), bits, in, q.packed.data() + o * words);
  }
  return q;
}

}  // namespace lily::quant
