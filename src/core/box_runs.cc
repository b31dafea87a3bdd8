// The box -> runs planner (include/megackpt/core/box_runs.h).
#include "megackpt/core/box_runs.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "megackpt/core/tensor.h"

namespace megackpt::inline core {

Status CheckBox(std::span<const int64_t> shape, std::span<const int64_t> strides,
                std::span<const int64_t> start, std::span<const int64_t> lengths) {
  const size_t nd = shape.size();
  if (start.size() != nd || lengths.size() != nd || (!strides.empty() && strides.size() != nd)) {
    return InvalidArgumentError("box of rank " + std::to_string(start.size()) + "/" +
                                std::to_string(lengths.size()) + " for an array of rank " +
                                std::to_string(nd));
  }
  for (size_t d = 0; d < nd; ++d) {
    if (shape[d] < 0 || start[d] < 0 || lengths[d] < 0 || (!strides.empty() && strides[d] < 0)) {
      return InvalidArgumentError("negative shape, stride or box value in dimension " +
                                  std::to_string(d));
    }
    if (lengths[d] > shape[d] || start[d] > shape[d] - lengths[d]) {
      return OutOfRangeError("box " + ShapeToString(start) + "+" + ShapeToString(lengths) +
                             " exceeds the shape " + ShapeToString(shape));
    }
  }
  return Status::OK();
}

Status ForEachBoxRun(std::span<const int64_t> shape, std::span<const int64_t> strides,
                     std::span<const int64_t> start, std::span<const int64_t> lengths,
                     const std::function<Status(const BoxRun&)>& fn) {
  MEGA_RETURN_IF_ERROR(CheckBox(shape, strides, start, lengths));
  const size_t nd = shape.size();
  for (int64_t l : lengths) {
    if (l == 0) return Status::OK();
  }
  std::vector<int64_t> own;
  if (strides.empty()) {
    own = ContiguousStrides(shape);
    strides = own;
  }
  // Fold dims from the innermost outwards while the next index of a dim starts
  // where the run of the dims inside it ends: dims [j, nd) are one run.
  uint64_t run = 1;
  size_t j = nd;
  while (j > 0) {
    const size_t d = j - 1;
    if (lengths[d] != 1 && static_cast<uint64_t>(strides[d]) != run) break;
    run *= static_cast<uint64_t>(lengths[d]);
    j = d;
  }
  uint64_t base = 0;
  for (size_t d = 0; d < nd; ++d) base += static_cast<uint64_t>(start[d]) * strides[d];
  // Odometer over dims [0, j); adjacent runs are merged before fn sees them.
  std::vector<int64_t> idx(j, 0);
  BoxRun cur{base, 0, 0};
  uint64_t src = base, dst = 0;
  while (true) {
    if (cur.n > 0 && src == cur.src + cur.n) {
      cur.n += run;
    } else {
      if (cur.n > 0) MEGA_RETURN_IF_ERROR(fn(cur));
      cur = BoxRun{src, dst, run};
    }
    dst += run;
    size_t d = j;
    while (d > 0) {
      --d;
      src += strides[d];
      if (++idx[d] < lengths[d]) break;
      src -= static_cast<uint64_t>(strides[d]) * static_cast<uint64_t>(lengths[d]);
      idx[d] = 0;
      if (d == 0) return fn(cur);
    }
    if (j == 0) return fn(cur);
  }
}

Result<std::vector<BoxRun>> BoxRuns(std::span<const int64_t> shape,
                                    std::span<const int64_t> strides,
                                    std::span<const int64_t> start,
                                    std::span<const int64_t> lengths) {
  std::vector<BoxRun> out;
  MEGA_RETURN_IF_ERROR(ForEachBoxRun(shape, strides, start, lengths, [&](const BoxRun& r) {
    out.push_back(r);
    return Status::OK();
  }));
  return out;
}

Status ForEachBoxByteRun(DType dtype, std::span<const int64_t> shape,
                         std::span<const int64_t> start, std::span<const int64_t> lengths,
                         const std::function<Status(const BoxRun&)>& fn) {
  if (dtype == DType::kF4) {
    return ForEachBoxRun(shape, {}, start, lengths, [&](const BoxRun& r) -> Status {
      if (r.src % 2 != 0 || r.n % 2 != 0) {
        return InvalidArgumentError("F4 box " + ShapeToString(start) + "+" +
                                    ShapeToString(lengths) + " of " + ShapeToString(shape) +
                                    " has runs that do not start and end on whole bytes");
      }
      return fn(BoxRun{r.src / 2, r.dst / 2, r.n / 2});
    });
  }
  const uint64_t es = DTypeSize(dtype);
  return ForEachBoxRun(shape, {}, start, lengths, [&](const BoxRun& r) {
    return fn(BoxRun{r.src * es, r.dst * es, r.n * es});
  });
}

Status ForEachByteSpan(std::span<const BoxRun> runs, uint64_t max_span_bytes, double max_overhead,
                       const std::function<Status(const ByteSpan&)>& fn) {
  size_t i = 0;
  while (i < runs.size()) {
    const uint64_t begin = runs[i].src;
    uint64_t end = runs[i].src + runs[i].n;
    uint64_t needed = runs[i].n;
    size_t k = i + 1;
    while (k < runs.size()) {
      const BoxRun& r = runs[k];
      const uint64_t new_end = std::max(end, r.src + r.n);
      if (r.src < end || new_end - begin > max_span_bytes ||
          static_cast<double>(new_end - begin) >
              static_cast<double>(needed + r.n) * (1.0 + max_overhead)) {
        break;
      }
      end = new_end;
      needed += r.n;
      ++k;
    }
    MEGA_RETURN_IF_ERROR(fn(ByteSpan{begin, end, runs.subspan(i, k - i)}));
    i = k;
  }
  return Status::OK();
}

Status ReadBoxRuns(const RandomAccessFile& file, uint64_t base, std::span<const BoxRun> runs,
                   std::span<std::byte> out) {
  constexpr uint64_t kMaxSpan = 8ull << 20;
  thread_local std::shared_ptr<std::byte> staging;
  return ForEachByteSpan(runs, kMaxSpan, 0.05, [&](const ByteSpan& span) -> Status {
    if (span.runs.size() == 1) {
      const BoxRun& r = span.runs[0];
      return file.ReadExactlyAt(base + r.src, out.subspan(r.dst, r.n));
    }
    if (!staging) {
      MEGA_ASSIGN_OR_RETURN(staging, AllocateBuffer(kMaxSpan));
    }
    MEGA_RETURN_IF_ERROR(file.ReadExactlyAt(
        base + span.begin, std::span<std::byte>(staging.get(), span.end - span.begin)));
    for (const BoxRun& r : span.runs)
      std::memcpy(out.data() + r.dst, staging.get() + (r.src - span.begin), r.n);
    return Status::OK();
  });
}

}  // namespace megackpt::inline core
