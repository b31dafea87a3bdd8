// DType: the element types megackpt stores, with their MEGA / safetensors names.
//
// The names are the ones both formats use on disk ("F32", "BF16", "F8_E4M3", ...).
// F4 packs two elements per byte: a tensor of n F4 elements takes (n + 1) / 2 bytes.
#ifndef MEGACKPT_CORE_DTYPE_H_
#define MEGACKPT_CORE_DTYPE_H_

#include <cstdint>
#include <span>
#include <string_view>

#include "megackpt/core/status.h"

namespace megackpt::inline core {

enum class DType : uint8_t {
  kBool,
  kU8,
  kI8,
  kI16,
  kU16,
  kI32,
  kU32,
  kI64,
  kU64,
  kF16,
  kBF16,
  kF32,
  kF64,
  kF8_E5M2,
  kF8_E4M3,
  kF8_E8M0,
  kF4,
};

inline constexpr int kNumDTypes = 17;

// The on-disk name, e.g. "F32". Never empty.
std::string_view DTypeName(DType dtype);

// Parses an on-disk name (exact, case-sensitive). NotFound-free: unknown names
// return InvalidArgument naming the string.
Result<DType> DTypeFromName(std::string_view name);

// Size of one element in bits: 1 byte types = 8, ..., F4 = 4.
int DTypeBits(DType dtype);

// Size of one element in whole bytes for byte-addressable types; 0 for F4.
inline int DTypeSize(DType dtype) { return DTypeBits(dtype) >= 8 ? DTypeBits(dtype) / 8 : 0; }

// Number of elements of `shape` (1 for a 0-d shape), or InvalidArgument on a
// negative dimension or overflow past 2^63.
Result<uint64_t> NumElements(std::span<const int64_t> shape);

// Bytes a dense tensor of `dtype` and `shape` takes: elements * size, or
// (elements + 1) / 2 for F4. InvalidArgument on overflow or negative dims.
Result<uint64_t> LogicalNbytes(DType dtype, std::span<const int64_t> shape);

// Bytes taken by `elements` elements of `dtype` (F4 rounds up). REQUIRES: no overflow
// (callers validated the shape with LogicalNbytes first).
uint64_t NbytesForElements(DType dtype, uint64_t elements);

// True for dtypes whose elements FloatElementAt converts: F16, BF16, F32, F64,
// F8_E5M2, F8_E4M3 (the "fn" variant: no infinities, S.1111.111 is NaN).
bool IsFloatDType(DType dtype);

// The element of floating dtype `dtype` stored (little-endian) at `p`, as a
// double (exact: every value of these types is a double). REQUIRES:
// IsFloatDType(dtype).
double FloatElementAt(DType dtype, const void* p);

}  // namespace megackpt::inline core

#endif  // MEGACKPT_CORE_DTYPE_H_
