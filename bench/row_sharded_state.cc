#include "row_sharded_state.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "bench_util.h"

namespace megackpt::bench {
namespace {

uint64_t RowSeed(int tensor, int64_t row) {
  return (static_cast<uint64_t>(tensor) << 40) ^ static_cast<uint64_t>(row) ^ 0x5eedull;
}

std::string TensorName(int t) { return "layers." + std::to_string(t) + ".weight"; }

}  // namespace

int64_t RowShardedLayout::RowsFor(uint64_t size) const {
  return std::max<int64_t>(1, static_cast<int64_t>(size / tensors / (cols * 4)));
}

uint64_t RowShardedLayout::BytesFor(uint64_t size) const {
  return static_cast<uint64_t>(RowsFor(size)) * cols * 4 * tensors;
}

Result<RowShardedRank> BuildRowShardedRank(const RowShardedLayout& layout, uint64_t size, int world,
                                           int rank) {
  RowShardedRank st;
  st.layout = layout;
  const int64_t rows = layout.RowsFor(size);
  st.rows = rows;
  const size_t row_bytes = static_cast<size_t>(layout.cols) * 4;
  for (int t = 0; t < layout.tensors; ++t) {
    const int64_t r0 = rows * rank / world, r1 = rows * (rank + 1) / world;
    const Shape local{r1 - r0, layout.cols};
    const uint64_t nbytes = static_cast<uint64_t>(r1 - r0) * row_bytes;
    MEGA_ASSIGN_OR_RETURN(auto a, AllocatePageAligned(nbytes, layout.pages));
    for (int64_t r = r0; r < r1; ++r)
      FillRandom(a.get() + (r - r0) * row_bytes, row_bytes, RowSeed(t, r));
    MEGA_ASSIGN_OR_RETURN(Tensor ta, Tensor::FromBlob(a.get(), DType::kF32, local, a));
    std::vector<dcp::Shard> sa;
    if (r1 > r0) sa.push_back(dcp::Shard{{r0, 0}, ta});
    st.save.Set(TensorName(t),
                dcp::StateValue(dcp::ShardedTensor{DType::kF32, {rows, layout.cols}, sa}));
    st.save_shards.push_back(ta);
    st.first_row.push_back(r0);
  }
  return st;
}

Status RowShardedRank::AddLoadDestinations() {
  if (!load_shards.empty() || save_shards.empty()) return Status::OK();
  for (size_t t = 0; t < save_shards.size(); ++t) {
    const Tensor& piece = save_shards[t];
    MEGA_ASSIGN_OR_RETURN(auto b, AllocatePageAligned(piece.nbytes(), layout.pages));
    MEGA_ASSIGN_OR_RETURN(Tensor tb, Tensor::FromBlob(b.get(), DType::kF32, piece.shape(), b));
    std::vector<dcp::Shard> sb;
    if (piece.nbytes() > 0) sb.push_back(dcp::Shard{{first_row[t], 0}, tb});
    load.Set(TensorName(static_cast<int>(t)),
             dcp::StateValue(dcp::ShardedTensor{DType::kF32, {rows, layout.cols}, sb}));
    load_shards.push_back(tb);
  }
  return Status::OK();
}

Status RowShardedRank::CheckLoaded(std::string_view who) const {
  const size_t row_bytes = static_cast<size_t>(layout.cols) * 4;
  std::string expect(row_bytes, '\0');
  if (load_shards.empty()) {
    return InternalError(std::string(who) + ": nothing was loaded (no load destinations)");
  }
  for (size_t t = 0; t < load_shards.size(); ++t) {
    const Tensor& dst = load_shards[t];
    const int64_t n = dst.shape().empty() ? 0 : dst.shape()[0];
    const auto* base = static_cast<const char*>(dst.data());
    for (int64_t r = 0; r < n; ++r) {
      FillRandom(expect.data(), row_bytes, RowSeed(static_cast<int>(t), first_row[t] + r));
      if (std::memcmp(base + r * row_bytes, expect.data(), row_bytes) != 0) {
        return InternalError(
            std::string(who) + ": loaded bytes differ from the saved ones in layers." +
            std::to_string(t) + ".weight, row " + std::to_string(first_row[t] + r));
      }
    }
  }
  return Status::OK();
}

}  // namespace megackpt::bench
