#include "megackpt/core/dtype.h"

#include <array>
#include <string>

namespace megackpt::inline core {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  int bits;
};

constexpr std::array<DTypeInfo, kNumDTypes> kDTypes = {{
    {DType::kBool, "BOOL", 8},      {DType::kU8, "U8", 8},
    {DType::kI8, "I8", 8},          {DType::kI16, "I16", 16},
    {DType::kU16, "U16", 16},       {DType::kI32, "I32", 32},
    {DType::kU32, "U32", 32},       {DType::kI64, "I64", 64},
    {DType::kU64, "U64", 64},       {DType::kF16, "F16", 16},
    {DType::kBF16, "BF16", 16},     {DType::kF32, "F32", 32},
    {DType::kF64, "F64", 64},       {DType::kF8_E5M2, "F8_E5M2", 8},
    {DType::kF8_E4M3, "F8_E4M3", 8}, {DType::kF8_E8M0, "F8_E8M0", 8},
    {DType::kF4, "F4", 4},
}};

}  // namespace

std::string_view DTypeName(DType dtype) { return kDTypes[static_cast<int>(dtype)].name; }

int DTypeBits(DType dtype) { return kDTypes[static_cast<int>(dtype)].bits; }

Result<DType> DTypeFromName(std::string_view name) {
  for (const auto& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return InvalidArgumentError("unknown dtype '" + std::string(name) + "'");
}

Result<uint64_t> NumElements(std::span<const int64_t> shape) {
  uint64_t n = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return InvalidArgumentError("negative dimension " + std::to_string(shape[i]) + " at axis " +
                                  std::to_string(i));
    }
    uint64_t out;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(shape[i]), &out) ||
        out > static_cast<uint64_t>(INT64_MAX)) {
      return InvalidArgumentError("element count overflows at axis " + std::to_string(i));
    }
    n = out;
  }
  return n;
}

uint64_t NbytesForElements(DType dtype, uint64_t elements) {
  int bits = DTypeBits(dtype);
  if (bits == 4) return (elements + 1) / 2;
  return elements * static_cast<uint64_t>(bits / 8);
}

Result<uint64_t> LogicalNbytes(DType dtype, std::span<const int64_t> shape) {
  MEGA_ASSIGN_OR_RETURN(uint64_t n, NumElements(shape));
  int bits = DTypeBits(dtype);
  if (bits == 4) return (n + 1) / 2;
  uint64_t out;
  if (__builtin_mul_overflow(n, static_cast<uint64_t>(bits / 8), &out) ||
      out > static_cast<uint64_t>(INT64_MAX)) {
    return InvalidArgumentError("tensor byte size overflows");
  }
  return out;
}

}  // namespace megackpt::core
