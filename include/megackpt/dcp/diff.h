// Differences between two checkpoints, entry by entry: what `megackpt diff A B`
// prints. Both are read through their storage's reader (every byte verified),
// one entry at a time (memory: the largest entry of each, twice).
#ifndef MEGACKPT_DCP_DIFF_H_
#define MEGACKPT_DCP_DIFF_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "megackpt/core/dtype.h"
#include "megackpt/core/status.h"
#include "megackpt/core/tensor.h"

namespace megackpt::dcp {

struct EntryDiff {
  std::string fqn;
  // "values" (same kind, dtype and shape, different content), or what else
  // differs: "kind", "dtype", "shape".
  std::string what;
  bool is_bytes = false;
  DType dtype_a = DType::kU8, dtype_b = DType::kU8;  // tensors
  Shape shape_a, shape_b;
  uint64_t nbytes_a = 0, nbytes_b = 0;
  // "values": elements (bytes values: bytes) that differ, and their bytes.
  // Otherwise: every element/byte counts as changed (max of both sizes).
  uint64_t changed_elements = 0;
  uint64_t changed_bytes = 0;
  // Float dtypes, "values" only: max |a - b| over differing elements (NaN
  // when a NaN meets a number), and how many differ where either is NaN/Inf.
  std::optional<double> max_abs_diff;
  uint64_t non_finite_changes = 0;
};

struct CheckpointDiff {
  std::vector<std::string> added;     // in B only, fqn order
  std::vector<std::string> removed;   // in A only
  std::vector<EntryDiff> changed;     // in both, different
  uint64_t unchanged = 0;             // entries in both, byte-identical
  uint64_t bytes_a = 0, bytes_b = 0;  // logical bytes of all entries
  uint64_t changed_bytes = 0;         // sum over `changed`, plus added entries' bytes
};

// Compares the committed checkpoints in folders `a` and `b` (fs or MEGA
// storage, local or mega://). NotFound/DataLoss naming the folder, file and
// entry when one cannot be read.
Result<CheckpointDiff> DiffCheckpoints(const std::string& a, const std::string& b);

}  // namespace megackpt::dcp

#endif  // MEGACKPT_DCP_DIFF_H_
