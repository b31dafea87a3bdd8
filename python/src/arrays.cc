// Python arrays <-> megackpt::Tensor, zero-copy in both directions.
//
// Import goes through nanobind's ndarray caster, which takes the buffer protocol
// (numpy, read-only arrays included) or __dlpack__ (torch, TensorPlay, numpy).
// The dtype codes are DLPack's (dlpack.h DLDataTypeCode; 1.1 numbering for bool
// and the float8 types, which the 0.6 header core/tensor.cc builds with lacks).
#include <cstdint>
#include <vector>

#include "common.h"

namespace megackpt::python {
namespace {

// DLPack codes of the arrays handed to numpy (megackpt::DTypeFromDLPack maps them back).
constexpr uint8_t kCodeInt = 0, kCodeUInt = 1, kCodeFloat = 2, kCodeBool = 6;

// The DLPack type code numpy gets for `d`: raw unsigned integers for the
// unsigned types and every dtype numpy lacks (NumpyLacksDType).
uint8_t NumpyCode(DType d) {
  switch (d) {
    case DType::kBool:
      return kCodeBool;
    case DType::kI8:
    case DType::kI16:
    case DType::kI32:
    case DType::kI64:
      return kCodeInt;
    case DType::kF16:
    case DType::kF32:
    case DType::kF64:
      return kCodeFloat;
    default:
      return kCodeUInt;  // U8..U64, BF16, F8_*, F4
  }
}

// numpy's dtype for `d`: the real one, or raw unsigned integers of its width
// (DTypeBits; F4 as its packed bytes).
nb::dlpack::dtype NumpyDType(DType d) {
  const uint8_t bits = d == DType::kF4 ? 8 : static_cast<uint8_t>(DTypeBits(d));
  return {NumpyCode(d), bits, 1};
}

template <typename Array>
Result<Tensor> WrapArray(const Array& a, std::string_view what) {
  if (a.device_type() != nb::device::cpu::value) {
    return InvalidArgumentError(std::string(what) + ": only CPU arrays can be saved or loaded");
  }
  MEGA_ASSIGN_OR_RETURN(DType dtype,
                        DTypeFromDLPack(a.dtype().code, a.dtype().bits, a.dtype().lanes, what));
  Shape shape(a.ndim());
  std::vector<int64_t> strides(a.ndim());
  for (size_t d = 0; d < a.ndim(); ++d) {
    shape[d] = static_cast<int64_t>(a.shape(d));
    strides[d] = a.stride(d);
  }
  auto owner = std::make_shared<Array>(a);
  auto t = Tensor::FromBlobStrided(const_cast<void*>(static_cast<const void*>(a.data())), dtype,
                                   std::move(shape), std::move(strides), std::move(owner));
  if (!t.ok()) return t.status().WithContext(what);
  return t;
}

}  // namespace

bool NumpyLacksDType(DType dtype) {
  return dtype == DType::kBF16 || dtype == DType::kF8_E4M3 || dtype == DType::kF8_E5M2 ||
         dtype == DType::kF8_E8M0 || dtype == DType::kF4;
}

Result<Tensor> TensorFromArray(nb::handle array, bool writable, std::string_view what) {
  if (writable) {
    nb::ndarray<> a;
    if (nb::try_cast(array, a, /*convert=*/false)) return WrapArray(a, what);
    nb::ndarray<nb::ro> ro;
    if (nb::try_cast(array, ro, /*convert=*/false)) {
      return InvalidArgumentError(std::string(what) +
                                  ": the array is read-only; a load needs a "
                                  "writable destination");
    }
  } else {
    nb::ndarray<nb::ro> a;
    if (nb::try_cast(array, a, /*convert=*/false)) return WrapArray(a, what);
  }
  std::string type = nb::cast<std::string>(nb::str(nb::handle(array).type()));
  return InvalidArgumentError(std::string(what) + ": " + type +
                              " is not a CPU array (expected the buffer protocol or __dlpack__)");
}

nb::object NumpyFromTensor(const Tensor& tensor) {
  auto* keep = new Tensor(tensor);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<size_t> shape;
  std::vector<int64_t> strides;
  if (tensor.dtype() == DType::kF4) {
    shape = {static_cast<size_t>(tensor.nbytes())};
    strides = {1};
  } else {
    for (int d = 0; d < tensor.ndim(); ++d) {
      shape.push_back(static_cast<size_t>(tensor.shape()[d]));
      strides.push_back(tensor.strides()[d]);
    }
  }
  nb::ndarray<nb::numpy> a(tensor.data(), shape.size(), shape.data(), owner, strides.data(),
                           NumpyDType(tensor.dtype()));
  return nb::cast(a);
}

void RegisterArrays(nb::module_& m) {
  // dtype name ("F32", "BF16", ...) of an array, as megackpt stores it.
  m.def("_array_dtype", [](nb::handle array) {
    Tensor t = Unwrap(TensorFromArray(array, /*writable=*/false, "array"));
    return std::string(DTypeName(t.dtype()));
  });
}

}  // namespace megackpt::python
