// Whole-piece reads through a StorageReader (see whole_pieces.h).
#include "dcp/whole_pieces.h"

#include <map>
#include <mutex>

#include "megackpt/dcp/planner.h"

namespace megackpt::dcp::internal {
namespace {

// A planner that hands the reader preset destinations, one per stored piece.
class PresetPlanner final : public LoadPlanner {
 public:
  explicit PresetPlanner(const std::vector<WholePieceRead>& reads) {
    for (const WholePieceRead& r : reads) by_index_[r.index] = &r;
  }
  Status SetUp(StateDict*, const Metadata&, bool) override { return Status::OK(); }
  Result<LoadPlan> CreateLocalPlan() override { return LoadPlan{}; }
  Result<std::vector<LoadPlan>> CreateGlobalPlan(std::vector<LoadPlan> all) override { return all; }
  Result<LoadPlan> FinishPlan(LoadPlan plan) override { return plan; }
  Status LoadBytes(const ReadItem& item, std::string value) override {
    MEGA_ASSIGN_OR_RETURN(const WholePieceRead* r, Find(item));
    if (r->bytes) *r->bytes = std::move(value);
    return Status::OK();
  }
  Result<Tensor> ResolveTensor(const ReadItem& item) override {
    MEGA_ASSIGN_OR_RETURN(const WholePieceRead* r, Find(item));
    return r->dest;
  }
  Status CommitTensor(const ReadItem&, const Tensor&) override { return Status::OK(); }

 private:
  Result<const WholePieceRead*> Find(const ReadItem& item) const {
    MetadataIndex key = item.storage_index;
    key.index.reset();
    auto it = by_index_.find(key);
    if (it == by_index_.end()) return InternalError("no destination for " + ToString(key));
    return it->second;
  }
  std::map<MetadataIndex, const WholePieceRead*> by_index_;
};

}  // namespace

Status ReadWholePieces(StorageReader& reader, const std::vector<WholePieceRead>& reads) {
  LoadPlan plan;
  for (const WholePieceRead& r : reads) {
    ReadItem item;
    item.storage_index = r.index;
    item.dest_index = r.index;
    if (r.is_bytes) {
      item.type = LoadItemType::kByteIO;
    } else {
      item.type = LoadItemType::kTensor;
      item.lengths = r.dest.shape();
      item.storage_offsets = Shape(item.lengths.size(), 0);
      item.dest_offsets = Shape(item.lengths.size(), 0);
    }
    plan.items.push_back(std::move(item));
  }
  PresetPlanner planner(reads);
  return reader.ReadData(plan, planner);
}

}  // namespace megackpt::dcp::internal
