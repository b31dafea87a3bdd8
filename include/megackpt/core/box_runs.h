// Box -> runs: which contiguous pieces of a stored N-d array a sub-box covers.
//
// A stored array has a shape and element strides (row-major by default). A
// sub-box [start, start + lengths) of it, copied into a dense row-major
// destination of shape `lengths`, is a sequence of runs: `n` elements that are
// contiguous in the stored array (stride 1 along the run) starting at stored
// element `src`, landing at destination element `dst`. Runs are produced in
// destination order and adjacent ones are merged (a run continues while the
// next one starts where it ends in both arrays), so a box of whole rows of a
// row-major array is one run.
//
// This is the one planner behind every "read a box of a stored tensor":
// MegaReader::ReadSlice / ReadRange (src/format), the MEGA storage reader
// (src/dcp/mega_storage_files.cc) and the F4 span grouping (src/dcp/f4_box.cc).
// Offsets are in elements; BoxByteRuns converts to bytes for a dtype.
//
//   ForEachBoxRun({1024, 1024}, {}, {512, 0}, {16, 1024}, fn)   -> one run of 16 Ki elements
//   ForEachBoxRun({1024, 1024}, {}, {0, 512}, {1024, 16}, fn)   -> 1024 runs of 16 elements
#ifndef MEGACKPT_CORE_BOX_RUNS_H_
#define MEGACKPT_CORE_BOX_RUNS_H_

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "megackpt/core/dtype.h"
#include "megackpt/core/file.h"
#include "megackpt/core/status.h"

namespace megackpt::inline core {

// `n` elements from stored element `src` to destination element `dst`.
struct BoxRun {
  uint64_t src = 0;
  uint64_t dst = 0;
  uint64_t n = 0;
  friend bool operator==(const BoxRun&, const BoxRun&) = default;
};

// Checks that the box [start, start + lengths) lies inside `shape` and that
// `strides` (elements; empty = row-major contiguous) has the right rank with
// non-negative values. InvalidArgument for rank mismatches or negative values,
// OutOfRange for a box outside the array.
Status CheckBox(std::span<const int64_t> shape, std::span<const int64_t> strides,
                std::span<const int64_t> start, std::span<const int64_t> lengths);

// Calls fn for every run of the box, in destination order, adjacent runs
// merged. A 0-d array is one run of 1 element; an empty box calls nothing.
// Errors: those of CheckBox, or fn's first error (iteration stops there).
Status ForEachBoxRun(std::span<const int64_t> shape, std::span<const int64_t> strides,
                     std::span<const int64_t> start, std::span<const int64_t> lengths,
                     const std::function<Status(const BoxRun&)>& fn);

// The runs as a vector (convenient for small boxes and tests).
Result<std::vector<BoxRun>> BoxRuns(std::span<const int64_t> shape,
                                    std::span<const int64_t> strides,
                                    std::span<const int64_t> start,
                                    std::span<const int64_t> lengths);

// Byte runs of a box of a row-major array of `dtype`: src/dst/n in bytes.
// F4 (two elements per byte): InvalidArgument unless every run starts and
// ends on a whole byte (use ForEachBoxRun in elements and CopyF4Box then).
Status ForEachBoxByteRun(DType dtype, std::span<const int64_t> shape,
                         std::span<const int64_t> start, std::span<const int64_t> lengths,
                         const std::function<Status(const BoxRun&)>& fn);

// Groups byte runs (sorted by src, non-overlapping, as ForEachBoxByteRun
// yields them) into spans to read in one request each: a span [begin, end)
// takes the next run while end - begin stays <= max_span_bytes and the bytes
// read stay <= (1 + max_overhead) x the bytes of its runs. A run longer than
// max_span_bytes is a span of its own. fn gets the span and its runs.
struct ByteSpan {
  uint64_t begin = 0;
  uint64_t end = 0;
  std::span<const BoxRun> runs;
};
Status ForEachByteSpan(std::span<const BoxRun> runs, uint64_t max_span_bytes, double max_overhead,
                       const std::function<Status(const ByteSpan&)>& fn);

// Reads byte runs (src relative to file offset `base`, dst into out) without
// verification: a run alone in its span straight into out, neighbouring short
// runs joined into one read while it reads at most 5% more than the runs need
// (docs/architecture.md: resharding reads <= 1.05x), through a per-thread staging buffer
// of 8 MiB. Errors: the file's, with its name.
Status ReadBoxRuns(const RandomAccessFile& file, uint64_t base, std::span<const BoxRun> runs,
                   std::span<std::byte> out);

}  // namespace megackpt::inline core

#endif  // MEGACKPT_CORE_BOX_RUNS_H_
