// GGUF (version 3) writing and reading, as llama.cpp's gguf library lays it out:
//   "GGUF" u32 version, u64 n_tensors, u64 n_kv, n_kv × (string key, u32 type, value),
//   n_tensors × (string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset),
//   zero padding to `alignment`, then the tensor data (each tensor at its offset, padded to alignment).
// Strings are u64 length + bytes; all integers little-endian. `ne` is ggml order: ne[0] is the
// contiguous dimension, i.e. a PyTorch shape reversed ([out, in] -> ne {in, out}).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace lily::gguf {

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7, STRING = 8, ARRAY = 9,
  U64 = 10, I64 = 11, F64 = 12,
};

// ggml tensor types used here (values as in ggml.h).
enum class TensorType : uint32_t { F32 = 0, F16 = 1, Q4_0 = 2, Q8_0 = 8, BF16 = 30 };

const char* type_name(TensorType t);
// Bytes of one row of `n` elements (n must be a multiple of the block size for block types).
size_t row_bytes(TensorType t, int64_t n);
int64_t block_size(TensorType t);  // 1 for float types, 32 for Q4_0 / Q8_0

// Encodes n floats (n a multiple of block_size(t)) into `out` (row_bytes(t, n) bytes).
// Q8_0: per 32 values fp16 d = max|x|/127, q = round(x/d). Q4_0: per 32 values fp16 d = m/-8 with m the
// value of largest magnitude, nibble q = min(15, int(x/d + 8.5)); byte j holds x[j] (low) and x[j+16] (high).
void encode(TensorType t, const float* x, int64_t n, uint8_t* out);
// Inverse of encode (reference dequantisation).
void decode(TensorType t, const uint8_t* in, int64_t n, float* x);

using Value = std::variant<uint32_t, int32_t, uint64_t, float, bool, std::string, std::vector<std::string>,
                           std::vector<int32_t>, std::vector<bool>, std::vector<float>>;

struct KV {
  std::string key;
  Value value;
};

// A tensor whose bytes are produced at write time (so a writer never holds the whole model).
struct TensorSpec {
  std::string name;
  std::vector<int64_t> ne;  // ggml order
  TensorType type = TensorType::F32;
  // Fills exactly nbytes() bytes.
  std::function<void(uint8_t* out)> produce;
  size_t nbytes() const;
};

// Writes a complete file. Throws InputError naming the path on I/O failure.
void write_file(const std::string& path, const std::vector<KV>& kvs, const std::vector<TensorSpec>& tensors,
                size_t alignment = 32);

// Reader, for tests and tools: parses the header and maps nothing (data read on demand).
struct TensorInfo {
  std::string name;
  std::vector<int64_t> ne;
  TensorType type;
  uint64_t offset;  // from the start of the data section
  size_t nbytes() const;
};
struct File {
  uint32_t version = 0;
  std::vector<KV> kvs;
  std::vector<TensorInfo> tensors;
  size_t data_start = 0;
  size_t alignment = 32;
  std::string path;
  uint64_t file_size = 0;
  std::string_view image;  // the bytes parse() read (empty for read())

  // Throws InputError naming the file and what is wrong: truncation, lengths past the end, integers
  // that do not fit, bad alignment, duplicate tensor names, tensors past the end of the file.
  static File read(const std::string& path);
  // The same from a GGUF image in memory (`where` names it in errors); `image` must outlive the File.
  static File parse(std::string_view image, const std::string& where);
  const Value* find(const std::string& key) const;
  const TensorInfo* tensor(const std::string& name) const;
  // Reads a tensor and decodes it to float32 (ne[0] fastest).
  std::vector<float> read_f32(const TensorInfo& t) const;
};

}  // namespace lily::gguf
