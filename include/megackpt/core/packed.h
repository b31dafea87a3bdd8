// Packed 4-bit (F4) arrays: nibble-exact copies of N-d boxes.
//
// Nibble order (megackpt's; no spec fixes one; docs/dcp.md "F4 resharding"):
// element i of a packed F4 array — row-major flat index i — is in
// byte i / 2, in the low nibble (bits 0-3) when i is even and in the high nibble
// (bits 4-7) when i is odd. An array of n elements takes (n + 1) / 2 bytes; when
// n is odd the high nibble of the last byte is padding.
//
// F4 tensors cannot be narrowed to arbitrary boxes (a view must start on a byte
// boundary and be contiguous, see tensor.h), so code that moves boxes of F4
// data between differently shaped arrays (resharded loads) uses CopyF4Box.
#ifndef MEGACKPT_CORE_PACKED_H_
#define MEGACKPT_CORE_PACKED_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>

#include "megackpt/core/status.h"

namespace megackpt::inline core {

// A read-only packed row-major F4 array of shape `shape`, or a window of its
// bytes: `data` points at byte `first_byte` of the array (so a staging buffer
// holding only bytes [first_byte, ...) of a larger array can be used directly).
// The shape must outlive the call it is passed to.
struct F4ConstArray {
  const std::byte* data = nullptr;
  std::span<const int64_t> shape;
  uint64_t first_byte = 0;
};

// A writable packed row-major F4 array of shape `shape` (data = its byte 0).
struct F4Array {
  std::byte* data = nullptr;
  std::span<const int64_t> shape;
};

// Copies the box [src_start, src_start + lengths) of `src` into the box
// [dst_start, dst_start + lengths) of `dst`, element by element (any nibble
// alignment on either side). Only the nibbles of the destination box are
// written: the other nibbles of every byte the box touches (neighbouring
// elements, padding) keep their values; the write is a read-modify-write of
// those bytes, so callers writing boxes that share a destination byte from
// several threads must serialize those calls.
// REQUIRES: the source window holds every byte of the source box; src and dst
// memory do not overlap.
// InvalidArgument when the ranks differ, a start or length is negative, a box
// exceeds its array's shape, or the source box starts before the window.
// An empty box (some length 0) copies nothing. A 0-d box copies one element.
Status CopyF4Box(const F4ConstArray& src, std::span<const int64_t> src_start, const F4Array& dst,
                 std::span<const int64_t> dst_start, std::span<const int64_t> lengths);

// The bytes [begin, end) of a packed array of shape `shape` that hold the box
// [start, start + lengths): from the byte of its first element to the byte of
// its last element, in flat (row-major) order. {0, 0} for an empty box.
// REQUIRES: the box lies inside the shape (not checked).
std::pair<uint64_t, uint64_t> F4BoxByteRange(std::span<const int64_t> shape,
                                             std::span<const int64_t> start,
                                             std::span<const int64_t> lengths);

}  // namespace megackpt::inline core

#endif  // MEGACKPT_CORE_PACKED_H_
