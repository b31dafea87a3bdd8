#include "megackpt/core/tensor.h"

#include <dlpack/dlpack.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace megackpt::inline core {
namespace {

constexpr size_t kHugeThreshold = 2u << 20;
constexpr size_t kHugePage = 2u << 20;

// Number of leading dims to iterate; the trailing dims [k, ndim) form one
// contiguous run in both tensors. Returns k and the run length in elements.
struct RunLayout {
  int outer_dims;
  uint64_t run_elems;
};

RunLayout InnerRun(const Tensor& a, const Tensor& b) {
  int k = a.ndim();
  uint64_t run = 1;
  int64_t expect = 1;
  while (k > 0) {
    int d = k - 1;
    int64_t size = a.shape()[d];
    if (size != 1 && (a.strides()[d] != expect || b.strides()[d] != expect)) break;
    run *= static_cast<uint64_t>(size);
    expect *= size;
    --k;
  }
  return {k, run};
}

}  // namespace

std::string ShapeToString(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::vector<int64_t> ContiguousStrides(std::span<const int64_t> shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

Result<std::shared_ptr<std::byte>> AllocateBuffer(size_t nbytes, bool prefault) {
  if (nbytes == 0) nbytes = 1;
  if (nbytes >= kHugeThreshold) {
    size_t len = (nbytes + kHugePage - 1) / kHugePage * kHugePage;
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      return ErrnoToStatus("mmap of " + std::to_string(len) + " bytes", errno);
    }
    madvise(p, len, MADV_HUGEPAGE);
    if (prefault) {
      auto* bytes = static_cast<volatile std::byte*>(p);
      for (size_t off = 0; off < len; off += 4096) bytes[off] = std::byte{0};
    }
    return std::shared_ptr<std::byte>(static_cast<std::byte*>(p),
                                      [len](std::byte* q) { munmap(q, len); });
  }
  size_t len = (nbytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, len);
  if (!p) return ResourceExhaustedError("cannot allocate " + std::to_string(len) + " bytes");
  if (prefault) std::memset(p, 0, len);
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
}

Result<Tensor> Tensor::Empty(DType dtype, Shape shape, bool zero) {
  MEGA_ASSIGN_OR_RETURN(uint64_t nbytes, LogicalNbytes(dtype, shape));
  MEGA_ASSIGN_OR_RETURN(auto buffer, AllocateBuffer(nbytes, false));
  if (zero) std::memset(buffer.get(), 0, nbytes);
  void* data = buffer.get();
  return FromBlob(data, dtype, std::move(shape), std::shared_ptr<void>(std::move(buffer)));
}

Result<Tensor> Tensor::FromBlob(void* data, DType dtype, Shape shape, std::shared_ptr<void> owner) {
  auto strides = ContiguousStrides(shape);
  return FromBlobStrided(data, dtype, std::move(shape), std::move(strides), std::move(owner));
}

Result<Tensor> Tensor::FromBlobStrided(void* data, DType dtype, Shape shape,
                                       std::vector<int64_t> strides, std::shared_ptr<void> owner) {
  if (strides.size() != shape.size()) {
    return InvalidArgumentError("strides rank " + std::to_string(strides.size()) +
                                " != shape rank " + std::to_string(shape.size()));
  }
  MEGA_ASSIGN_OR_RETURN(uint64_t numel, NumElements(shape));
  if (numel > 0 && data == nullptr) return InvalidArgumentError("null data for non-empty tensor");
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = std::move(shape);
  t.strides_ = std::move(strides);
  t.numel_ = numel;
  t.data_ = data;
  t.owner_ = std::move(owner);
  t.defined_ = true;
  if (dtype == DType::kF4 && !t.is_contiguous()) {
    return InvalidArgumentError("F4 tensors must be contiguous");
  }
  return t;
}

bool Tensor::is_contiguous() const {
  if (numel_ == 0) return true;
  int64_t expect = 1;
  for (int d = ndim() - 1; d >= 0; --d) {
    if (shape_[d] != 1 && strides_[d] != expect) return false;
    expect *= shape_[d];
  }
  return true;
}

Result<Tensor> Tensor::Narrow(int dim, int64_t start, int64_t length) const {
  if (dim < 0 || dim >= ndim()) {
    return InvalidArgumentError("narrow: dim " + std::to_string(dim) + " out of range for shape " +
                                ShapeToString(shape_));
  }
  if (start < 0 || length < 0 || start > shape_[dim] || length > shape_[dim] - start) {
    return InvalidArgumentError("narrow: range [" + std::to_string(start) + ", " +
                                std::to_string(start + length) + ") out of bounds for dim " +
                                std::to_string(dim) + " of shape " + ShapeToString(shape_));
  }
  Tensor t = *this;
  t.shape_[dim] = length;
  MEGA_ASSIGN_OR_RETURN(t.numel_, NumElements(t.shape_));
  int64_t elem_offset = start * strides_[dim];
  if (dtype_ == DType::kF4) {
    if (elem_offset % 2 != 0) {
      return InvalidArgumentError("narrow: F4 view must start on a byte boundary");
    }
    t.data_ = static_cast<std::byte*>(data_) + elem_offset / 2;
    if (!t.is_contiguous()) return InvalidArgumentError("narrow: F4 view must be contiguous");
  } else if (t.numel_ > 0) {
    t.data_ = static_cast<std::byte*>(data_) + elem_offset * DTypeSize(dtype_);
  }
  return t;
}

void StreamingCopy(std::byte* dst, const std::byte* src, size_t n) {
#if defined(__x86_64__)
  // Head: up to the first 16-byte aligned destination byte.
  const size_t head = std::min<size_t>(n, (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();  // streaming stores are weakly ordered
#else
  std::memcpy(dst, src, n);
#endif
}

Status CopyTensor(const Tensor& src, const Tensor& dst) {
  if (src.dtype() != dst.dtype()) {
    return InvalidArgumentError(std::string("copy: dtype ") + std::string(DTypeName(src.dtype())) +
                                " != " + std::string(DTypeName(dst.dtype())));
  }
  if (src.shape() != dst.shape()) {
    return InvalidArgumentError("copy: shape " + ShapeToString(src.shape()) +
                                " != " + ShapeToString(dst.shape()));
  }
  if (src.numel() == 0) return Status::OK();
  if (src.dtype() == DType::kF4) {
    if (!src.is_contiguous() || !dst.is_contiguous()) {
      return InvalidArgumentError("copy: F4 tensors must be contiguous");
    }
    std::memmove(dst.data(), src.data(), src.nbytes());
    return Status::OK();
  }
  const size_t esize = DTypeSize(src.dtype());
  RunLayout layout = InnerRun(src, dst);
  const size_t run_bytes = layout.run_elems * esize;
  if (layout.outer_dims == 0) {
    std::memmove(dst.data(), src.data(), run_bytes);
    return Status::OK();
  }
  // Odometer over the outer dims.
  const int k = layout.outer_dims;
  std::vector<int64_t> idx(k, 0);
  auto* s = static_cast<const std::byte*>(src.data());
  auto* d = static_cast<std::byte*>(dst.data());
  const auto& shape = src.shape();
  const auto& ss = src.strides();
  const auto& ds = dst.strides();
  int64_t soff = 0, doff = 0;
  while (true) {
    if (layout.run_elems == 1) {
      std::memcpy(d + doff * esize, s + soff * esize, esize);
    } else {
      std::memcpy(d + doff * esize, s + soff * esize, run_bytes);
    }
    int dim = k - 1;
    while (dim >= 0) {
      ++idx[dim];
      soff += ss[dim];
      doff += ds[dim];
      if (idx[dim] < shape[dim]) break;
      soff -= ss[dim] * shape[dim];
      doff -= ds[dim] * shape[dim];
      idx[dim] = 0;
      --dim;
    }
    if (dim < 0) break;
  }
  return Status::OK();
}

bool TensorBytesEqual(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
  if (a.numel() == 0) return true;
  if (a.is_contiguous() && b.is_contiguous()) {
    return std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
  }
  auto ca = Tensor::Empty(a.dtype(), a.shape());
  auto cb = Tensor::Empty(b.dtype(), b.shape());
  if (!ca.ok() || !cb.ok()) return false;
  if (!CopyTensor(a, *ca).ok() || !CopyTensor(b, *cb).ok()) return false;
  return std::memcmp(ca->data(), cb->data(), a.nbytes()) == 0;
}

namespace {

// DLPack 1.1 codes that the 0.6 header this file builds with lacks.
constexpr uint8_t kDLBoolCode = 6, kDLFloat8E4M3FnCode = 10, kDLFloat8E5M2Code = 12,
                  kDLFloat8E8M0FnuCode = 14;

// Every dtype with a DLPack 1.1 type code (its bits are the dtype's): the one
// map both directions use.
struct DLCode {
  DType dtype;
  uint8_t code;
};
constexpr DLCode kDLCodes[] = {
    {DType::kI8, kDLInt},
    {DType::kI16, kDLInt},
    {DType::kI32, kDLInt},
    {DType::kI64, kDLInt},
    {DType::kU8, kDLUInt},
    {DType::kU16, kDLUInt},
    {DType::kU32, kDLUInt},
    {DType::kU64, kDLUInt},
    {DType::kF16, kDLFloat},
    {DType::kF32, kDLFloat},
    {DType::kF64, kDLFloat},
    {DType::kBF16, kDLBfloat},
    {DType::kBool, kDLBoolCode},
    {DType::kF8_E4M3, kDLFloat8E4M3FnCode},
    {DType::kF8_E5M2, kDLFloat8E5M2Code},
    {DType::kF8_E8M0, kDLFloat8E8M0FnuCode},
};

// Export speaks DLPack 0.6 (codes int, uint, float, bfloat): bool goes out as
// uint8, the newer codes not at all.
Result<DLDataType> DTypeToDL(DType d) {
  DLDataType t;
  t.lanes = 1;
  t.bits = static_cast<uint8_t>(DTypeBits(d));
  if (d == DType::kBool) {
    t.code = kDLUInt;
    return t;
  }
  for (const DLCode& c : kDLCodes) {
    if (c.dtype == d && c.code <= kDLBfloat) {
      t.code = c.code;
      return t;
    }
  }
  return InvalidArgumentError("dlpack: dtype " + std::string(DTypeName(d)) +
                              " has no DLPack 0.6 code");
}

struct DLExportContext {
  Tensor tensor;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
};

}  // namespace

Result<Tensor> FromDLPack(DLManagedTensor* managed) {
  if (managed == nullptr) return InvalidArgumentError("dlpack: null tensor");
  std::shared_ptr<void> owner(managed, [](void* p) {
    auto* m = static_cast<DLManagedTensor*>(p);
    if (m->deleter) m->deleter(m);
  });
  const DLTensor& dl = managed->dl_tensor;
  if (dl.device.device_type != kDLCPU && dl.device.device_type != kDLCUDAHost) {
    return InvalidArgumentError("dlpack: only CPU tensors are supported");
  }
  if (dl.ndim < 0) return InvalidArgumentError("dlpack: negative ndim");
  MEGA_ASSIGN_OR_RETURN(DType dtype, DTypeFromDLPack(dl.dtype.code, dl.dtype.bits, dl.dtype.lanes));
  Shape shape(dl.shape, dl.shape + dl.ndim);
  std::vector<int64_t> strides = dl.strides ? std::vector<int64_t>(dl.strides, dl.strides + dl.ndim)
                                            : ContiguousStrides(shape);
  void* data = static_cast<std::byte*>(dl.data) + dl.byte_offset;
  return Tensor::FromBlobStrided(data, dtype, std::move(shape), std::move(strides),
                                 std::move(owner));
}

Result<DLManagedTensor*> ToDLPack(const Tensor& tensor) {
  MEGA_ASSIGN_OR_RETURN(DLDataType dt, DTypeToDL(tensor.dtype()));
  auto* ctx = new DLExportContext{tensor, tensor.shape(), tensor.strides()};
  auto* m = new DLManagedTensor{};
  m->dl_tensor.data = tensor.data();
  m->dl_tensor.device = DLDevice{kDLCPU, 0};
  m->dl_tensor.ndim = tensor.ndim();
  m->dl_tensor.dtype = dt;
  m->dl_tensor.shape = ctx->shape.data();
  m->dl_tensor.strides = ctx->strides.data();
  m->dl_tensor.byte_offset = 0;
  m->manager_ctx = ctx;
  m->deleter = [](DLManagedTensor* self) {
    delete static_cast<DLExportContext*>(self->manager_ctx);
    delete self;
  };
  return m;
}

Result<DType> DTypeFromDLPack(uint8_t code, uint8_t bits, uint16_t lanes, std::string_view what) {
  for (const DLCode& c : kDLCodes) {
    if (lanes == 1 && c.code == code && DTypeBits(c.dtype) == bits) return c.dtype;
  }
  return InvalidArgumentError(std::string(what) + ": unsupported array dtype (DLPack code " +
                              std::to_string(code) + ", " + std::to_string(bits) + " bits, " +
                              std::to_string(lanes) + " lanes)");
}

}  // namespace megackpt::inline core
