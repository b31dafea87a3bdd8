// Tensors for tests (header-only; tests only, never linked into a production
// layer): one named tensor of every dtype, for round trips that must cover
// them all.
#ifndef MEGACKPT_SRC_CORE_TEST_TENSORS_H_
#define MEGACKPT_SRC_CORE_TEST_TENSORS_H_

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "megackpt/core/dtype.h"
#include "megackpt/core/tensor.h"

namespace megackpt::test_util {

// Makes a tensor of `dtype` and `shape` whose bytes depend on `seed`.
using TensorFiller = std::function<Tensor(DType dtype, Shape shape, int seed)>;

// For every dtype d, in DType order: (prefix + DTypeName(d), fill(d, shape, i))
// where i is d's index.
inline std::vector<std::pair<std::string, Tensor>> OneOfEveryDType(const std::string& prefix,
                                                                   const Shape& shape,
                                                                   const TensorFiller& fill) {
  std::vector<std::pair<std::string, Tensor>> out;
  for (int i = 0; i < kNumDTypes; ++i) {
    const DType d = static_cast<DType>(i);
    out.emplace_back(prefix + std::string(DTypeName(d)), fill(d, shape, i));
  }
  return out;
}

}  // namespace megackpt::test_util

#endif  // MEGACKPT_SRC_CORE_TEST_TENSORS_H_
