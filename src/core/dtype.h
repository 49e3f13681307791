// Element types as named in safetensors headers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace lily {

enum class DType : uint8_t { F32, F16, BF16, F64, I8, U8, I16, U16, I32, U32, I64, U64, BOOL };

inline size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: case DType::U64: return 8;
    case DType::F32: case DType::I32: case DType::U32: return 4;
    case DType::F16: case DType::BF16: case DType::I16: case DType::U16: return 2;
    case DType::I8: case DType::U8: case DType::BOOL: return 1;
  }
  return 0;
}

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F64: return "F64";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::I16: return "I16";
    case DType::U16: return "U16";
    case DType::I32: return "I32";
    case DType::U32: return "U32";
    case DType::I64: return "I64";
    case DType::U64: return "U64";
    case DType::BOOL: return "BOOL";
  }
  return "?";
}

inline std::optional<DType> dtype_from_name(std::string_view s) {
  static constexpr DType all[] = {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I8,
                                  DType::U8,  DType::I16, DType::U16,  DType::I32, DType::U32,
                                  DType::I64, DType::U64, DType::BOOL};
  for (DType t : all)
    if (s == dtype_name(t)) return t;
  return std::nullopt;
}

inline bool dtype_is_float(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64;
}

}  // namespace lily
