#include "megackpt/core/dtype.h"

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

namespace megackpt::inline core {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  int bits;
};

constexpr std::array<DTypeInfo, kNumDTypes> kDTypes = {{
    {DType::kBool, "BOOL", 8},
    {DType::kU8, "U8", 8},
    {DType::kI8, "I8", 8},
    {DType::kI16, "I16", 16},
    {DType::kU16, "U16", 16},
    {DType::kI32, "I32", 32},
    {DType::kU32, "U32", 32},
    {DType::kI64, "I64", 64},
    {DType::kU64, "U64", 64},
    {DType::kF16, "F16", 16},
    {DType::kBF16, "BF16", 16},
    {DType::kF32, "F32", 32},
    {DType::kF64, "F64", 64},
    {DType::kF8_E5M2, "F8_E5M2", 8},
    {DType::kF8_E4M3, "F8_E4M3", 8},
    {DType::kF8_E8M0, "F8_E8M0", 8},
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

bool IsFloatDType(DType dtype) {
  switch (dtype) {
    case DType::kF16:
    case DType::kBF16:
    case DType::kF32:
    case DType::kF64:
    case DType::kF8_E5M2:
    case DType::kF8_E4M3:
      return true;
    default:
      return false;
  }
}

namespace {

// A binary floating-point number with `exp_bits` exponent and `man_bits`
// mantissa bits in the low bits of `bits` (IEEE-style: subnormals, and
// infinities/NaN at the all-ones exponent when `ieee_special`).
double DecodeMinifloat(uint32_t bits, int exp_bits, int man_bits, bool ieee_special) {
  const uint32_t man = bits & ((1u << man_bits) - 1);
  const uint32_t exp = (bits >> man_bits) & ((1u << exp_bits) - 1);
  const bool neg = (bits >> (man_bits + exp_bits)) & 1;
  const int bias = (1 << (exp_bits - 1)) - 1;
  const uint32_t all_ones = (1u << exp_bits) - 1;
  double v;
  if (ieee_special && exp == all_ones) {
    v = man == 0 ? std::numeric_limits<double>::infinity()
                 : std::numeric_limits<double>::quiet_NaN();
  } else if (!ieee_special && exp == all_ones && man == (1u << man_bits) - 1) {
    v = std::numeric_limits<double>::quiet_NaN();  // E4M3fn: S.1111.111
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(man), 1 - bias - man_bits);
  } else {
    v = std::ldexp(static_cast<double>(man | (1u << man_bits)),
                   static_cast<int>(exp) - bias - man_bits);
  }
  return neg ? -v : v;
}

}  // namespace

double FloatElementAt(DType dtype, const void* p) {
  switch (dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kF64: {
      double d;
      std::memcpy(&d, p, 8);
      return d;
    }
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      uint32_t w = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &w, 4);
      return f;
    }
    case DType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return DecodeMinifloat(h, 5, 10, true);
    }
    case DType::kF8_E5M2:
      return DecodeMinifloat(*static_cast<const uint8_t*>(p), 5, 2, true);
    case DType::kF8_E4M3:
      return DecodeMinifloat(*static_cast<const uint8_t*>(p), 4, 3, false);
    default:
      return std::numeric_limits<double>::quiet_NaN();
  }
}

}  // namespace megackpt::inline core
