// Tensor: a typed, shaped, strided view of memory plus an owner that keeps it alive.
//
// A Tensor never copies on construction: FromBlob wraps caller memory (the caller
// keeps it alive, or passes an owner), Empty allocates a fresh buffer, and views
// (Narrow) share their parent's owner. Copying a Tensor object copies the view,
// not the bytes. Writes go through views: CopyTensor(src, dst) fills dst's memory.
//
// Strides are in elements. F4 (two elements per byte) tensors must be contiguous
// and may only be narrowed at even element offsets along the flattened layout.
#ifndef MEGACKPT_CORE_TENSOR_H_
#define MEGACKPT_CORE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/dtype.h"
#include "megackpt/core/status.h"

struct DLManagedTensor;  // from <dlpack/dlpack.h>

namespace megackpt::inline core {

using Shape = std::vector<int64_t>;

// "[2, 3]".
std::string ShapeToString(std::span<const int64_t> shape);

// Row-major (C-contiguous) strides for `shape`, in elements.
std::vector<int64_t> ContiguousStrides(std::span<const int64_t> shape);

// Allocates `nbytes` of 64-byte-aligned memory. Allocations of 2 MiB or more
// come from mmap with MADV_HUGEPAGE (first-touch faults are expensive here);
// `prefault` touches every page so later writes run at memory speed.
// The returned owner frees the memory. ResourceExhausted when the OS refuses.
Result<std::shared_ptr<std::byte>> AllocateBuffer(size_t nbytes, bool prefault = false);

class Tensor {
 public:
  // An undefined tensor (defined() == false).
  Tensor() = default;

  // A new contiguous tensor in a fresh buffer (contents unspecified unless
  // `zero`). InvalidArgument on a bad shape; ResourceExhausted if allocation fails.
  static Result<Tensor> Empty(DType dtype, Shape shape, bool zero = false);

  // Wraps caller memory without copying. `owner` (may be null) is kept alive as
  // long as any view of this tensor exists; with a null owner the caller must
  // keep `data` alive. REQUIRES: data points to at least LogicalNbytes bytes
  // (for strided: to every element the strides reach).
  static Result<Tensor> FromBlob(void* data, DType dtype, Shape shape,
                                 std::shared_ptr<void> owner = nullptr);
  static Result<Tensor> FromBlobStrided(void* data, DType dtype, Shape shape,
                                        std::vector<int64_t> strides,
                                        std::shared_ptr<void> owner = nullptr);

  bool defined() const { return defined_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const std::vector<int64_t>& strides() const { return strides_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  uint64_t numel() const { return numel_; }
  // Bytes of the dense form of this view (F4: (numel + 1) / 2).
  uint64_t nbytes() const { return NbytesForElements(dtype_, numel_); }
  // Address of the first element (element [0, 0, ...]).
  void* data() const { return data_; }
  const std::shared_ptr<void>& owner() const { return owner_; }

  // True when elements are laid out row-major with no gaps (dims of size 1 and
  // empty tensors are contiguous whatever their strides).
  bool is_contiguous() const;

  // View of `length` entries of dimension `dim` starting at `start`.
  // InvalidArgument when dim or the range is out of bounds.
  Result<Tensor> Narrow(int dim, int64_t start, int64_t length) const;

  // The dense bytes of this view. REQUIRES: is_contiguous().
  std::span<std::byte> Bytes() const {
    return {static_cast<std::byte*>(data_), static_cast<size_t>(nbytes())};
  }

 private:
  DType dtype_ = DType::kU8;
  Shape shape_;
  std::vector<int64_t> strides_;
  uint64_t numel_ = 0;
  void* data_ = nullptr;
  std::shared_ptr<void> owner_;
  bool defined_ = false;
};

// Copies every element of src into dst. REQUIRES nothing; returns
// InvalidArgument when dtypes or shapes differ, or when an F4 side is not
// contiguous. Contiguous inner runs are copied with memcpy.
Status CopyTensor(const Tensor& src, const Tensor& dst);

// memcpy(dst, src, n) with non-temporal (streaming) stores on x86-64 (plain
// memcpy elsewhere), for copies whose destination is not read again soon (a
// staging copy the background writer reads much later). Plain stores first
// read every destination line (read-for-ownership): three memory transfers
// per byte instead of two; glibc streams only pieces above its non-temporal
// threshold. The stores are fenced before it returns, so another thread that
// is told afterwards sees the bytes. REQUIRES: the ranges do not overlap.
void StreamingCopy(std::byte* dst, const std::byte* src, size_t n);

// True when both have the same dtype and shape and identical element bytes.
bool TensorBytesEqual(const Tensor& a, const Tensor& b);

// DLPack interchange (dlpack 0.6). FromDLPack takes ownership of `managed`
// (its deleter runs when the last view is gone); CPU memory only. BOOL is
// exported as uint8 (DLPack 0.6 has no bool code); F8 and F4 cannot be
// exported (InvalidArgument). ToDLPack keeps the tensor's owner alive until
// the consumer calls the deleter.
Result<Tensor> FromDLPack(DLManagedTensor* managed);
// The dtype of a DLPack data type (code, bits, lanes) in DLPack 1.1 numbering
// (int 0, uint 1, float 2, bfloat 4, bool 6, float8 e4m3fn 10, e5m2 12,
// e8m0fnu 14): the one DLPack dtype map (FromDLPack, the Python arrays).
// InvalidArgument starting with `what` for anything else (lanes != 1 too).
Result<DType> DTypeFromDLPack(uint8_t code, uint8_t bits, uint16_t lanes,
                              std::string_view what = "dlpack");
Result<DLManagedTensor*> ToDLPack(const Tensor& tensor);

}  // namespace megackpt::inline core

#endif  // MEGACKPT_CORE_TENSOR_H_
