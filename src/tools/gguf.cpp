#include "tools/gguf.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <set>
#include <sstream>

#include "core/error.h"
#include "core/half.h"

namespace lily::gguf {

const char* type_name(TensorType t) {
  switch (t) {
    case TensorType::F32: return "f32";
    case TensorType::F16: return "f16";
    case TensorType::BF16: return "bf16";
    case TensorType::Q8_0: return "q8_0";
    case TensorType::Q4_0: return "q4_0";
  }
  return "?";
}

int64_t block_size(TensorType t) { return t == TensorType::Q4_0 || t == TensorType::Q8_0 ? 32 : 1; }

size_t row_bytes(TensorType t, int64_t n) {
  switch (t) {
    case TensorType::F32: return size_t(n) * 4;
    case TensorType::F16:
    case TensorType::BF16: return size_t(n) * 2;
    case TensorType::Q8_0: return size_t(n / 32) * 34;
    case TensorType::Q4_0: return size_t(n / 32) * 18;
  }
  return 0;
}

void encode(TensorType t, const float* x, int64_t n, uint8_t* out) {
  switch (t) {
    case TensorType::F32: std::memcpy(out, x, size_t(n) * 4); return;
    case TensorType::F16:
      for (int64_t i = 0; i < n; ++i) { uint16_t h = f32_to_f16(x[i]); std::memcpy(out + 2 * i, &h, 2); }
      return;
    case TensorType::BF16:
      for (int64_t i = 0; i < n; ++i) { uint16_t h = f32_to_bf16(x[i]); std::memcpy(out + 2 * i, &h, 2); }
      return;
    case TensorType::Q8_0:
      for (int64_t b = 0; b < n / 32; ++b, out += 34) {
        const float* v = x + b * 32;
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(v[j]));
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f;
        uint16_t dh = f32_to_f16(d);
        std::memcpy(out, &dh, 2);
        for (int j = 0; j < 32; ++j) out[2 + j] = uint8_t(int8_t(std::lround(v[j] * id)));
      }
      return;
    case TensorType::Q4_0:
      for (int64_t b = 0; b < n / 32; ++b, out += 18) {
        const float* v = x + b * 32;
        float amax = 0, m = 0;
        for (int j = 0; j < 32; ++j)
          if (std::fabs(v[j]) > amax) { amax = std::fabs(v[j]); m = v[j]; }
        float d = m / -8.0f, id = d != 0 ? 1.0f / d : 0.0f;
        uint16_t dh = f32_to_f16(d);
        std::memcpy(out, &dh, 2);
        for (int j = 0; j < 16; ++j) {
          int q0 = std::min(15, int(v[j] * id + 8.5f)), q1 = std::min(15, int(v[j + 16] * id + 8.5f));
          out[2 + j] = uint8_t(q0 | (q1 << 4));
        }
      }
      return;
  }
}

void decode(TensorType t, const uint8_t* in, int64_t n, float* x) {
  switch (t) {
    case TensorType::F32: std::memcpy(x, in, size_t(n) * 4); return;
    case TensorType::F16:
      for (int64_t i = 0; i < n; ++i) { uint16_t h; std::memcpy(&h, in + 2 * i, 2); x[i] = f16_to_f32(h); }
      return;
    case TensorType::BF16:
      for (int64_t i = 0; i < n; ++i) { uint16_t h; std::memcpy(&h, in + 2 * i, 2); x[i] = bf16_to_f32(h); }
      return;
    case TensorType::Q8_0:
      for (int64_t b = 0; b < n / 32; ++b, in += 34) {
        uint16_t dh; std::memcpy(&dh, in, 2);
        float d = f16_to_f32(dh);
        for (int j = 0; j < 32; ++j) x[b * 32 + j] = d * float(int8_t(in[2 + j]));
      }
      return;
    case TensorType::Q4_0:
      for (int64_t b = 0; b < n / 32; ++b, in += 18) {
        uint16_t dh; std::memcpy(&dh, in, 2);
        float d = f16_to_f32(dh);
        for (int j = 0; j < 16; ++j) {
          x[b * 32 + j] = d * float((in[2 + j] & 15) - 8);
          x[b * 32 + j + 16] = d * float((in[2 + j] >> 4) - 8);
        }
      }
      return;
  }
}

namespace {

int64_t numel(const std::vector<int64_t>& ne) {
  int64_t n = 1;
  for (auto d : ne) n *= d;
  return n;
}

size_t tensor_bytes(TensorType t, const std::vector<int64_t>& ne) {
  if (ne.empty()) return row_bytes(t, 1);
  size_t rows = 1;
  for (size_t d = 1; d < ne.size(); ++d) rows *= size_t(ne[d]);
  return row_bytes(t, ne[0]) * rows;
}

size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

class Out {
 public:
  explicit Out(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "wb")) {
    if (!f_) fail("{}: cannot open for writing", path);
    buf_.reserve(1 << 20);
  }
  ~Out() { if (f_) std::fclose(f_); }
  void bytes(const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
    pos_ += n;
    if (buf_.size() >= (1 << 20)) flush();
  }
  template <typename T> void pod(T v) { bytes(&v, sizeof v); }
  void str(const std::string& s) { pod<uint64_t>(s.size()); bytes(s.data(), s.size()); }
  void pad_to(size_t a) {
    static const uint8_t zeros[64] = {};
    size_t p = align_up(pos_, a) - pos_;
    while (p) { size_t k = std::min<size_t>(p, sizeof zeros); bytes(zeros, k); p -= k; }
  }
  void flush() {
    if (!buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size())
      fail("{}: write failed (disk full?)", path_);
    buf_.clear();
  }
  void close() {
    flush();
    if (std::fclose(f_) != 0) { f_ = nullptr; fail("{}: write failed", path_); }
    f_ = nullptr;
  }
  size_t pos() const { return pos_; }

 private:
  std::string path_;
  FILE* f_;
  std::vector<uint8_t> buf_;
  size_t pos_ = 0;
};

void write_value(Out& o, const Value& v) {
  std::visit(
      [&](auto&& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, uint32_t>) { o.pod(ValueType::U32); o.pod(x); }
        else if constexpr (std::is_same_v<T, int32_t>) { o.pod(ValueType::I32); o.pod(x); }
        else if constexpr (std::is_same_v<T, uint64_t>) { o.pod(ValueType::U64); o.pod(x); }
        else if constexpr (std::is_same_v<T, float>) { o.pod(ValueType::F32); o.pod(x); }
        else if constexpr (std::is_same_v<T, bool>) { o.pod(ValueType::BOOL); o.pod<uint8_t>(x ? 1 : 0); }
        else if constexpr (std::is_same_v<T, std::string>) { o.pod(ValueType::STRING); o.str(x); }
        else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
          o.pod(ValueType::ARRAY); o.pod(ValueType::STRING); o.pod<uint64_t>(x.size());
          for (auto& s : x) o.str(s);
        } else if constexpr (std::is_same_v<T, std::vector<int32_t>>) {
          o.pod(ValueType::ARRAY); o.pod(ValueType::I32); o.pod<uint64_t>(x.size());
          for (auto e : x) o.pod(e);
        } else if constexpr (std::is_same_v<T, std::vector<float>>) {
          o.pod(ValueType::ARRAY); o.pod(ValueType::F32); o.pod<uint64_t>(x.size());
          for (auto e : x) o.pod(e);
        } else if constexpr (std::is_same_v<T, std::vector<bool>>) {
          o.pod(ValueType::ARRAY); o.pod(ValueType::BOOL); o.pod<uint64_t>(x.size());
          for (bool e : x) o.pod<uint8_t>(e ? 1 : 0);
        }
      },
      v);
}

}  // namespace

size_t TensorSpec::nbytes() const { return tensor_bytes(type, ne); }
size_t TensorInfo::nbytes() const { return tensor_bytes(type, ne); }

void write_file(const std::string& path, const std::vector<KV>& kvs, const std::vector<TensorSpec>& tensors,
                size_t alignment) {
  for (auto& t : tensors) {
    if (t.ne.empty() || t.ne.size() > 4) fail("{}: tensor '{}' has {} dimensions (1 to 4 allowed)", path, t.name, t.ne.size());
    if (t.ne[0] % block_size(t.type) != 0)
      fail("{}: tensor '{}' has rows of {} values, not a multiple of the {} block of {}", path, t.name, t.ne[0],
           type_name(t.type), block_size(t.type));
  }
  Out o(path);
  o.bytes("GGUF", 4);
  o.pod<uint32_t>(3);
  o.pod<uint64_t>(tensors.size());
  o.pod<uint64_t>(kvs.size());
  for (auto& kv : kvs) { o.str(kv.key); write_value(o, kv.value); }
  size_t off = 0;
  std::vector<size_t> offsets;
  for (auto& t : tensors) {
    o.str(t.name);
    o.pod<uint32_t>(uint32_t(t.ne.size()));
    for (auto d : t.ne) o.pod<uint64_t>(uint64_t(d));
    o.pod<uint32_t>(uint32_t(t.type));
    o.pod<uint64_t>(off);
    offsets.push_back(off);
    off = align_up(off + t.nbytes(), alignment);
  }
  o.pad_to(alignment);
  const size_t data_start = o.pos();
  std::vector<uint8_t> buf;
  for (size_t i = 0; i < tensors.size(); ++i) {
    LILY_ASSERT(o.pos() - data_start == offsets[i]);
    buf.assign(tensors[i].nbytes(), 0);
    tensors[i].produce(buf.data());
    o.bytes(buf.data(), buf.size());
    o.pad_to(alignment);
  }
  o.close();
}

// ---- reader ----

namespace {

// Reads the header from a stream of `size` bytes; every length is checked against the bytes left
// before anything is allocated for it.
class In {
 public:
  In(std::istream& f, uint64_t size, const std::string& where) : f_(f), size_(size), where_(where) {}
  void bytes(void* p, size_t n) {
    if (n > left()) fail("{}: truncated GGUF header (needs {} more bytes at offset {}, {} left)", where_, n, pos_, left());
    f_.read(static_cast<char*>(p), std::streamsize(n));
    if (size_t(f_.gcount()) != n) fail("{}: truncated GGUF header", where_);
    pos_ += n;
  }
  template <typename T> T pod() { T v; bytes(&v, sizeof v); return v; }
  std::string str() {
    uint64_t n = pod<uint64_t>();
    if (n > left()) fail("{}: GGUF string of {} bytes at offset {} runs past the end ({} left)", where_, n, pos_, left());
    std::string s(n, '\0');
    bytes(s.data(), n);
    return s;
  }
  // An array count whose elements take at least `min_elem` bytes each.
  uint64_t count(uint64_t n, size_t min_elem) {
    if (n > left() / min_elem) fail("{}: GGUF array of {} elements at offset {} runs past the end", where_, n, pos_);
    return n;
  }
  uint64_t pos() const { return pos_; }
  uint64_t left() const { return size_ - pos_; }
  const std::string& where() const { return where_; }

 private:
  std::istream& f_;
  uint64_t size_, pos_ = 0;
  std::string where_;
};

size_t value_size(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    case ValueType::STRING: return 8;  // at least the length
    case ValueType::ARRAY: return 12;  // at least the type and the count
  }
  return 0;
}

template <typename T> T scalar(In& in, ValueType t) {
  switch (t) {
    case ValueType::U8: return T(in.pod<uint8_t>());
    case ValueType::I8: return T(in.pod<int8_t>());
    case ValueType::U16: return T(in.pod<uint16_t>());
    case ValueType::I16: return T(in.pod<int16_t>());
    case ValueType::U32: return T(in.pod<uint32_t>());
    case ValueType::I32: return T(in.pod<int32_t>());
    case ValueType::U64: return T(in.pod<uint64_t>());
    case ValueType::I64: return T(in.pod<int64_t>());
    case ValueType::F32: return T(in.pod<float>());
    case ValueType::F64: return T(in.pod<double>());
    case ValueType::BOOL: return T(in.pod<uint8_t>() != 0);
    default: fail("{}: unexpected GGUF value type {}", in.where(), uint32_t(t));
  }
}

// Integers are kept as the variant's types do: signed ones as int32, unsigned ones as uint32 (64-bit
// ones as uint64); values that do not fit are refused rather than wrapped.
template <typename T> T narrow(In& in, ValueType t) {
  int64_t v = 0;
  switch (t) {
    case ValueType::U64: {
      const uint64_t u = in.pod<uint64_t>();
      if (u > uint64_t(std::numeric_limits<int64_t>::max())) fail("{}: GGUF integer {} out of range", in.where(), u);
      v = int64_t(u);
      break;
    }
    case ValueType::I64: v = in.pod<int64_t>(); break;
    default: v = scalar<int64_t>(in, t);
  }
  if (v < int64_t(std::numeric_limits<T>::min()) || v > int64_t(std::numeric_limits<T>::max()))
    fail("{}: GGUF integer {} does not fit the value's type", in.where(), v);
  return T(v);
}

float real(In& in, ValueType t) {
  if (t == ValueType::F32) return in.pod<float>();
  const double d = in.pod<double>();
  if (std::isfinite(d) && std::fabs(d) > double(std::numeric_limits<float>::max()))
    fail("{}: GGUF float {} out of the float32 range", in.where(), d);
  return float(d);
}

Value read_value(In& in, ValueType t) {
  switch (t) {
    case ValueType::STRING: return in.str();
    case ValueType::BOOL: return in.pod<uint8_t>() != 0;
    case ValueType::F32: case ValueType::F64: return real(in, t);
    case ValueType::U64: return in.pod<uint64_t>();
    case ValueType::I64: return uint64_t(in.pod<int64_t>());
    case ValueType::I32: case ValueType::I8: case ValueType::I16: return narrow<int32_t>(in, t);
    case ValueType::U8: case ValueType::U16: case ValueType::U32: return narrow<uint32_t>(in, t);
    case ValueType::ARRAY: {
      auto et = in.pod<ValueType>();
      const size_t es = value_size(et);
      if (es == 0 || et == ValueType::ARRAY) fail("{}: GGUF array of unsupported element type {}", in.where(), uint32_t(et));
      const uint64_t n = in.count(in.pod<uint64_t>(), es);
      if (et == ValueType::STRING) {
        std::vector<std::string> v;
        v.reserve(n);
        for (uint64_t i = 0; i < n; ++i) v.push_back(in.str());
        return v;
      }
      if (et == ValueType::BOOL) {
        std::vector<bool> v;
        v.reserve(n);
        for (uint64_t i = 0; i < n; ++i) v.push_back(in.pod<uint8_t>() != 0);
        return v;
      }
      if (et == ValueType::F32 || et == ValueType::F64) {
        std::vector<float> v;
        v.reserve(n);
        for (uint64_t i = 0; i < n; ++i) v.push_back(real(in, et));
        return v;
      }
      std::vector<int32_t> v;
      v.reserve(n);
      for (uint64_t i = 0; i < n; ++i) v.push_back(narrow<int32_t>(in, et));
      return v;
    }
  }
  fail("{}: unknown GGUF value type {}", in.where(), uint32_t(t));
}

File parse_header(std::istream& is, uint64_t size, const std::string& where) {
  In in(is, size, where);
  char magic[4];
  in.bytes(magic, 4);
  if (std::memcmp(magic, "GGUF", 4) != 0) fail("{}: not a GGUF file (bad magic)", where);
  File f;
  f.path = where;
  f.file_size = size;
  f.version = in.pod<uint32_t>();
  if (f.version != 3) fail("{}: GGUF version {} (only 3 is read)", where, f.version);
  const uint64_t nt = in.pod<uint64_t>(), nkv = in.pod<uint64_t>();
  for (uint64_t i = 0; i < nkv; ++i) {
    KV kv;
    kv.key = in.str();
    kv.value = read_value(in, in.pod<ValueType>());
    if (kv.key == "general.alignment") {
      auto* a = std::get_if<uint32_t>(&kv.value);
      if (!a || *a == 0 || (*a & (*a - 1)) != 0 || *a > (1u << 20))
        fail("{}: general.alignment must be a power of two up to 2^20", where);
      f.alignment = *a;
    }
    f.kvs.push_back(std::move(kv));
  }
  std::set<std::string, std::less<>> names;
  for (uint64_t i = 0; i < nt; ++i) {
    TensorInfo t;
    t.name = in.str();
    if (!names.insert(t.name).second) fail("{}: tensor '{}' appears twice", where, t.name);
    uint32_t nd = in.pod<uint32_t>();
    if (nd == 0 || nd > 4) fail("{}: tensor '{}' has {} dimensions", where, t.name, nd);
    uint64_t elems = 1;
    for (uint32_t d = 0; d < nd; ++d) {
      const uint64_t e = in.pod<uint64_t>();
      if (e > (uint64_t(1) << 40) || (e != 0 && elems > (uint64_t(1) << 50) / e))
        fail("{}: tensor '{}' has an implausible size (dimension {} = {})", where, t.name, d, e);
      elems *= e;
      t.ne.push_back(int64_t(e));
    }
    t.type = in.pod<TensorType>();
    if (std::string(type_name(t.type)) == "?")
      fail("{}: tensor '{}' has a ggml type ({}) this reader does not decode", where, t.name, uint32_t(t.type));
    if (t.ne[0] % block_size(t.type) != 0)
      fail("{}: tensor '{}' has rows of {} values, not a multiple of the {} block of {}", where, t.name, t.ne[0],
           type_name(t.type), block_size(t.type));
    t.offset = in.pod<uint64_t>();
    if (t.offset % f.alignment != 0)
      fail("{}: tensor '{}' offset {} is not a multiple of the alignment {}", where, t.name, t.offset, f.alignment);
    f.tensors.push_back(std::move(t));
  }
  f.data_start = align_up(in.pos(), f.alignment);
  for (auto& t : f.tensors)
    if (t.offset > size || f.data_start + t.offset > size || t.nbytes() > size - f.data_start - t.offset)
      fail("{}: tensor '{}' ({} bytes at data offset {}) runs past the end of the file ({} bytes)", where, t.name,
           t.nbytes(), t.offset, size);
  return f;
}

}  // namespace

File File::read(const std::string& path) {
  std::ifstream is(path, std::ios::binary);
  if (!is) fail("{}: cannot open", path);
  is.seekg(0, std::ios::end);
  const auto end = is.tellg();
  if (end < 0) fail("{}: cannot determine the size", path);
  is.seekg(0, std::ios::beg);
  return parse_header(is, uint64_t(end), path);
}

File File::parse(std::string_view image, const std::string& where) {
  std::istringstream is{std::string(image)};
  File f = parse_header(is, image.size(), where);
  f.image = image;
  return f;
}

const Value* File::find(const std::string& key) const {
  for (auto& kv : kvs)
    if (kv.key == key) return &kv.value;
  return nullptr;
}

const TensorInfo* File::tensor(const std::string& name) const {
  for (auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

std::vector<float> File::read_f32(const TensorInfo& t) const {
  std::vector<uint8_t> raw(t.nbytes());
  if (raw.empty()) return {};  // a dimension is 0
  if (image.data() != nullptr) {
    if (data_start + t.offset + raw.size() > image.size()) fail("{}: tensor '{}' runs past the end of the file", path, t.name);
    std::memcpy(raw.data(), image.data() + data_start + t.offset, raw.size());
  } else {
    std::ifstream f(path, std::ios::binary);
    f.seekg(std::streamoff(data_start + t.offset));
    f.read(reinterpret_cast<char*>(raw.data()), std::streamsize(raw.size()));
    if (size_t(f.gcount()) != raw.size()) fail("{}: tensor '{}' runs past the end of the file", path, t.name);
  }
  std::vector<float> out(size_t(numel(t.ne)));
  decode(t.type, raw.data(), int64_t(out.size()), out.data());
  return out;
}

}  // namespace lily::gguf
