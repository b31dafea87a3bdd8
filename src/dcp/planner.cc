// Default save/load planners and their building blocks (dedup, validation of
// chunk layouts, resharding read items). Pure: no I/O, no threads.
#include "megackpt/dcp/planner.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <numeric>
#include <set>
#include <unordered_map>

#include "megackpt/core/packed.h"

namespace megackpt::dcp {

std::string_view WriteItemTypeName(WriteItemType type) {
  switch (type) {
    case WriteItemType::kTensor:
      return "TENSOR";
    case WriteItemType::kShard:
      return "SHARD";
    case WriteItemType::kByteIO:
      return "BYTE_IO";
  }
  return "?";
}

std::string_view LoadItemTypeName(LoadItemType type) {
  return type == LoadItemType::kTensor ? "TENSOR" : "BYTE_IO";
}

Status CheckResolvedData(const WriteItem& item, const ResolvedData& data) {
  if (item.type == WriteItemType::kByteIO) {
    if (data.bytes.size() == item.bytes_size) return Status::OK();
    return InternalError("planner resolved " + ToString(item.index) + " to " +
                         std::to_string(data.bytes.size()) + " bytes, the plan says " +
                         std::to_string(item.bytes_size));
  }
  const Tensor& t = data.tensor;
  if (t.defined() && item.tensor_data && t.dtype() == item.tensor_data->properties.dtype &&
      t.shape() == item.tensor_data->chunk.sizes) {
    return Status::OK();
  }
  return InternalError("planner resolved " + ToString(item.index) +
                       " to a tensor that does not match the plan");
}

uint64_t WriteItemNbytes(const WriteItem& item) {
  if (item.type == WriteItemType::kByteIO || !item.tensor_data) return item.bytes_size;
  auto n = LogicalNbytes(item.tensor_data->properties.dtype, item.tensor_data->chunk.sizes);
  return n.ok() ? *n : 0;
}

namespace {

// Elements in a box; 1 for 0-d. Saturates instead of overflowing (shapes were
// validated by LogicalNbytes before this is used for real decisions).
uint64_t Volume(const Shape& sizes) {
  uint64_t v = 1;
  for (int64_t s : sizes) {
    if (s <= 0) return 0;
    if (v > UINT64_MAX / static_cast<uint64_t>(s)) return UINT64_MAX;
    v *= static_cast<uint64_t>(s);
  }
  return v;
}

bool BoxesOverlap(const ChunkStorageMetadata& a, const ChunkStorageMetadata& b) {
  if (Volume(a.sizes) == 0 || Volume(b.sizes) == 0) return false;
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    if (a.offsets[d] + a.sizes[d] <= b.offsets[d] || b.offsets[d] + b.sizes[d] <= a.offsets[d]) {
      return false;
    }
  }
  return true;
}

std::string ChunkString(const ChunkStorageMetadata& c) {
  return "offsets " + ShapeToString(c.offsets) + " sizes " + ShapeToString(c.sizes);
}

Status CheckInBounds(const std::string& fqn, const Shape& global, const Shape& offsets,
                     const Shape& sizes) {
  if (offsets.size() != global.size() || sizes.size() != global.size()) {
    return InvalidArgumentError("tensor '" + fqn + "': chunk " + ShapeToString(offsets) + " has " +
                                std::to_string(sizes.size()) + " dims, global shape " +
                                ShapeToString(global) + " has " + std::to_string(global.size()));
  }
  for (size_t d = 0; d < global.size(); ++d) {
    if (offsets[d] < 0 || sizes[d] < 0 || offsets[d] > global[d] ||
        sizes[d] > global[d] - offsets[d]) {
      return InvalidArgumentError("tensor '" + fqn + "': chunk at offsets " +
                                  ShapeToString(offsets) + " with sizes " + ShapeToString(sizes) +
                                  " is outside the global shape " + ShapeToString(global));
    }
  }
  return Status::OK();
}

Status MergePlannerData(PlannerData* into, const PlannerData& from) {
  for (const auto& [fqn, path] : from.object_paths) {
    auto [it, inserted] = into->object_paths.emplace(fqn, path);
    if (!inserted && it->second != path) {
      return InvalidArgumentError("ranks disagree on the nesting of '" + fqn + "'");
    }
  }
  if (into->extra.empty()) into->extra = from.extra;
  return Status::OK();
}

// ---- DefaultSavePlanner --------------------------------------------------------

class DefaultSavePlanner final : public SavePlanner {
 public:
  explicit DefaultSavePlanner(DefaultSavePlannerOptions options) : options_(std::move(options)) {}

  Status SetUp(const StateDict& state_dict, const std::optional<StorageMeta>& storage_meta,
               bool is_coordinator) override {
    storage_meta_ = storage_meta;
    is_coordinator_ = is_coordinator;
    data_.clear();
    items_.clear();
    planner_data_ = PlannerData();
    // The planner never modifies the state dict; FlattenStateDict only hands out
    // pointers.
    auto& sd = const_cast<StateDict&>(state_dict);
    std::vector<FlatEntry> flat;
    if (options_.flatten_state_dict) {
      MEGA_ASSIGN_OR_RETURN(flat, FlattenStateDict(sd, &planner_data_.object_paths));
    } else {
      for (auto& [key, value] : sd) {
        if (value.is_dict() || value.is_list() || value.is_none()) {
          return InvalidArgumentError("state dict entry '" + key + "' is a " +
                                      std::string(KindName(value.kind())) +
                                      " but flatten_state_dict is off");
        }
        flat.push_back(FlatEntry{key, &value});
      }
    }
    for (const FlatEntry& e : flat) MEGA_RETURN_IF_ERROR(AddEntry(e));
    return Status::OK();
  }

  Result<SavePlan> CreateLocalPlan() override {
    SavePlan plan;
    plan.items = items_;
    plan.planner_data = planner_data_;
    return plan;
  }

  Result<GlobalSavePlan> CreateGlobalPlan(std::vector<SavePlan> all_plans) override {
    GlobalSavePlan out;
    MEGA_ASSIGN_OR_RETURN(out.plans, DedupSavePlans(std::move(all_plans), options_.dedup));
    MEGA_ASSIGN_OR_RETURN(out.metadata, BuildMetadataFromPlans(out.plans));
    for (auto& plan : out.plans) {
      MEGA_RETURN_IF_ERROR(MergePlannerData(&out.metadata.planner_data, plan.planner_data));
      plan.planner_data = PlannerData();  // only the coordinator needs it
    }
    out.metadata.storage_meta = storage_meta_;
    out.metadata.version = options_.version;
    return out;
  }

  Result<SavePlan> FinishPlan(SavePlan central_plan) override { return central_plan; }

  Result<ResolvedData> ResolveData(const WriteItem& item) override {
    auto it = data_.find(item.index);
    if (it == data_.end()) {
      return NotFoundError("save planner: no data for write item " + ToString(item.index));
    }
    return it->second;
  }

 private:
  Status AddEntry(const FlatEntry& e) {
    StateValue& v = *e.value;
    if (v.is_bytes()) {
      WriteItem item;
      item.index = MetadataIndex(e.fqn);
      item.type = WriteItemType::kByteIO;
      item.bytes_size = v.bytes().size();
      data_[item.index] = ResolvedData{Tensor(), v.bytes(), nullptr};
      items_.push_back(std::move(item));
      return Status::OK();
    }
    if (v.is_tensor()) {
      const Tensor& t = v.tensor();
      if (!t.defined())
        return InvalidArgumentError("state dict tensor '" + e.fqn + "' is undefined");
      WriteItem item;
      item.index = MetadataIndex(e.fqn, Shape(t.ndim(), 0), 0);
      item.type = WriteItemType::kTensor;
      item.tensor_data = TensorWriteData{ChunkStorageMetadata{Shape(t.ndim(), 0), t.shape()},
                                         TensorProperties{t.dtype(), false}, t.shape()};
      data_[item.index] = ResolvedData{t, {}, nullptr};
      items_.push_back(std::move(item));
      return Status::OK();
    }
    const ShardedTensor& st = v.sharded();
    MEGA_RETURN_IF_ERROR(LogicalNbytes(st.dtype, st.global_shape).status());
    bool any = false;
    for (size_t i = 0; i < st.shards.size(); ++i) {
      const Shard& sh = st.shards[i];
      if (!sh.tensor.defined()) {
        return InvalidArgumentError("sharded tensor '" + e.fqn + "' shard " + std::to_string(i) +
                                    " is undefined");
      }
      if (sh.tensor.dtype() != st.dtype) {
        return InvalidArgumentError("sharded tensor '" + e.fqn + "' shard " + std::to_string(i) +
                                    " has dtype " + std::string(DTypeName(sh.tensor.dtype())) +
                                    ", the tensor is " + std::string(DTypeName(st.dtype)));
      }
      MEGA_RETURN_IF_ERROR(CheckInBounds(e.fqn, st.global_shape, sh.offsets, sh.tensor.shape()));
      if (Volume(sh.tensor.shape()) == 0) continue;
      WriteItem item;
      item.index = MetadataIndex(e.fqn, sh.offsets);
      item.type = WriteItemType::kShard;
      item.tensor_data = TensorWriteData{ChunkStorageMetadata{sh.offsets, sh.tensor.shape()},
                                         TensorProperties{st.dtype, false}, st.global_shape};
      if (!data_.emplace(item.index, ResolvedData{sh.tensor, {}, nullptr}).second) {
        return InvalidArgumentError("sharded tensor '" + e.fqn + "' has two shards at offsets " +
                                    ShapeToString(sh.offsets));
      }
      items_.push_back(std::move(item));
      any = true;
    }
    if (!any && Volume(st.global_shape) == 0) {
      // An empty global tensor still needs an entry (one empty chunk).
      WriteItem item;
      Shape zeros(st.global_shape.size(), 0);
      item.index = MetadataIndex(e.fqn, zeros);
      item.type = WriteItemType::kShard;
      item.tensor_data = TensorWriteData{ChunkStorageMetadata{zeros, st.global_shape},
                                         TensorProperties{st.dtype, false}, st.global_shape};
      MEGA_ASSIGN_OR_RETURN(Tensor empty, Tensor::Empty(st.dtype, st.global_shape));
      data_[item.index] = ResolvedData{empty, {}, nullptr};
      items_.push_back(std::move(item));
    }
    return Status::OK();
  }

  DefaultSavePlannerOptions options_;
  std::optional<StorageMeta> storage_meta_;
  bool is_coordinator_ = false;
  std::unordered_map<MetadataIndex, ResolvedData, MetadataIndexHash> data_;
  std::vector<WriteItem> items_;
  PlannerData planner_data_;
};

// ---- DefaultLoadPlanner --------------------------------------------------------

class DefaultLoadPlanner final : public LoadPlanner {
 public:
  explicit DefaultLoadPlanner(DefaultLoadPlannerOptions options) : options_(options) {}

  Status SetUp(StateDict* state_dict, const Metadata& metadata, bool is_coordinator) override {
    state_dict_ = state_dict;
    metadata_ = &metadata;
    is_coordinator_ = is_coordinator;
    tensors_.clear();
    f4_mutexes_.clear();
    bytes_.clear();
    return Status::OK();
  }

  Result<LoadPlan> CreateLocalPlan() override {
    std::vector<FlatEntry> flat;
    if (options_.flatten_state_dict) {
      MEGA_ASSIGN_OR_RETURN(flat, FlattenStateDict(*state_dict_, nullptr));
    } else {
      for (auto& [key, value] : *state_dict_) {
        if (value.is_dict() || value.is_list() || value.is_none()) {
          return InvalidArgumentError("state dict entry '" + key + "' is a " +
                                      std::string(KindName(value.kind())) +
                                      " but flatten_state_dict is off");
        }
        flat.push_back(FlatEntry{key, &value});
      }
    }
    LoadPlan plan;
    std::vector<std::string> missing;
    for (const FlatEntry& e : flat) {
      auto it = metadata_->state_dict_metadata.find(e.fqn);
      if (it == metadata_->state_dict_metadata.end()) {
        missing.push_back(e.fqn);
        continue;
      }
      MEGA_RETURN_IF_ERROR(PlanEntry(e, it->second, &plan));
    }
    if (!missing.empty() && !options_.allow_partial_load) {
      std::string list;
      for (size_t i = 0; i < missing.size() && i < 5; ++i)
        list += (i ? ", '" : "'") + missing[i] + "'";
      if (missing.size() > 5) list += " (+" + std::to_string(missing.size() - 5) + " more)";
      return NotFoundError("checkpoint has no entry for " + list + " (" +
                           std::to_string(metadata_->state_dict_metadata.size()) +
                           " entries in the checkpoint; use allow_partial_load to skip)");
    }
    return plan;
  }

  Result<std::vector<LoadPlan>> CreateGlobalPlan(std::vector<LoadPlan> all_plans) override {
    return all_plans;
  }
  Result<LoadPlan> FinishPlan(LoadPlan central_plan) override { return central_plan; }

  Status LoadBytes(const ReadItem& item, std::string value) override {
    auto it = bytes_.find(item.dest_index.fqn);
    if (it == bytes_.end()) {
      return NotFoundError("load planner: no bytes destination for " + ToString(item.dest_index));
    }
    *it->second = std::move(value);
    return Status::OK();
  }

  // F4 boxes that are not a byte-aligned contiguous view of the destination
  // (see F4BoxIsView) are read into a fresh contiguous F4 tensor of shape
  // item.lengths, which CommitTensor copies into the destination. Nothing is
  // remembered between the two calls: CommitTensor recomputes the decision, and
  // the temporary travels through the reader (it is the tensor CommitTensor
  // receives), so concurrent items never share planner state.
  Result<Tensor> ResolveTensor(const ReadItem& item) override {
    MEGA_ASSIGN_OR_RETURN(const Dest* dest, FindDest(item));
    Tensor view = dest->tensor;
    if (view.dtype() == DType::kF4) {
      if (!F4BoxIsView(view, item)) return Tensor::Empty(DType::kF4, item.lengths, /*zero=*/true);
      // Narrow checks each step for a byte boundary (a row may start mid-byte
      // even when the box does): make the view from the box's first element.
      const uint64_t first = F4BoxFirstElement(view, item);
      return Tensor::FromBlob(static_cast<std::byte*>(view.data()) + first / 2, DType::kF4,
                              item.lengths, view.owner());
    }
    for (int d = 0; d < view.ndim(); ++d) {
      MEGA_ASSIGN_OR_RETURN(view, view.Narrow(d, item.dest_offsets[d], item.lengths[d]));
    }
    return view;
  }

  Status CommitTensor(const ReadItem& item, const Tensor& tensor) override {
    MEGA_ASSIGN_OR_RETURN(const Dest* dest, FindDest(item));
    const Tensor& full = dest->tensor;
    if (full.dtype() != DType::kF4 || F4BoxIsView(full, item)) return Status::OK();
    if (Volume(item.lengths) == 0) return Status::OK();
    if (!tensor.defined() || tensor.dtype() != DType::kF4 || tensor.shape() != item.lengths ||
        !tensor.is_contiguous()) {
      return InvalidArgumentError("load planner: CommitTensor for " + ToString(item.dest_index) +
                                  " got a tensor that is not the F4 buffer ResolveTensor made");
    }
    const Shape zeros(item.lengths.size(), 0);
    // Boxes of one destination may share a byte (two nibbles): serialize the
    // read-modify-write copies into the same memory.
    std::lock_guard<std::mutex> lock(*dest->f4_mu);
    return CopyF4Box({static_cast<const std::byte*>(tensor.data()), tensor.shape()}, zeros,
                     {static_cast<std::byte*>(full.data()), full.shape()}, item.dest_offsets,
                     item.lengths);
  }

 private:
  struct Dest {
    Tensor tensor;
    // F4 destinations: guards CommitTensor's nibble copies into its memory
    // (shared by destinations with the same owner or data pointer).
    std::shared_ptr<std::mutex> f4_mu;
  };

  Result<const Dest*> FindDest(const ReadItem& item) const {
    auto it = tensors_.find(item.dest_index);
    if (it == tensors_.end()) {
      return NotFoundError("load planner: no tensor destination for " + ToString(item.dest_index));
    }
    const int nd = it->second.tensor.ndim();
    if (item.dest_offsets.size() != static_cast<size_t>(nd) ||
        item.lengths.size() != static_cast<size_t>(nd)) {
      return InvalidArgumentError("load planner: read item for " + ToString(item.dest_index) +
                                  " has the wrong number of dims");
    }
    return &it->second;
  }

  // Flat index in `dest` (contiguous) of the first element of item's box.
  static uint64_t F4BoxFirstElement(const Tensor& dest, const ReadItem& item) {
    const std::vector<int64_t> strides = ContiguousStrides(dest.shape());
    uint64_t first = 0;
    for (size_t d = 0; d < strides.size(); ++d) {
      first += static_cast<uint64_t>(item.dest_offsets[d] * strides[d]);
    }
    return first;
  }

  // True when the box of `item` in the F4 tensor `dest` is a view the reader
  // may write whole bytes into: non-empty, contiguous, starting on a byte
  // boundary, and owning its last byte (an even element count, or ending at
  // the end of `dest`, whose padding nibble is its own).
  static bool F4BoxIsView(const Tensor& dest, const ReadItem& item) {
    const Shape& shape = dest.shape();
    const size_t nd = shape.size();
    for (size_t d = 0; d < nd; ++d) {
      if (item.dest_offsets[d] < 0 || item.lengths[d] <= 0 ||
          item.dest_offsets[d] + item.lengths[d] > shape[d]) {
        return false;
      }
    }
    // Contiguous: dims before the first partial one are single indices.
    size_t k = nd;
    while (k > 0 && item.lengths[k - 1] == shape[k - 1]) --k;
    for (size_t d = 0; d + 1 < k; ++d) {
      if (item.lengths[d] != 1) return false;
    }
    const uint64_t first = F4BoxFirstElement(dest, item);
    const uint64_t n = Volume(item.lengths);
    return first % 2 == 0 && (n % 2 == 0 || first + n == dest.numel());
  }

  Status PlanEntry(const FlatEntry& e, const StorageMetadata& md, LoadPlan* plan) {
    StateValue& v = *e.value;
    if (v.is_bytes()) {
      if (!std::holds_alternative<BytesStorageMetadata>(md)) {
        return InvalidArgumentError("'" + e.fqn +
                                    "' is bytes in the state dict but a tensor in the checkpoint");
      }
      bytes_[e.fqn] = &v.bytes();
      ReadItem item;
      item.type = LoadItemType::kByteIO;
      item.dest_index = MetadataIndex(e.fqn);
      item.storage_index = MetadataIndex(e.fqn);
      plan->items.push_back(std::move(item));
      return Status::OK();
    }
    const auto* stored = std::get_if<TensorStorageMetadata>(&md);
    if (!stored) {
      return InvalidArgumentError("'" + e.fqn +
                                  "' is a tensor in the state dict but bytes in the checkpoint");
    }
    DType dtype;
    Shape global;
    struct DestChunk {
      Shape offsets;
      Tensor tensor;
    };
    std::vector<DestChunk> dests;
    if (v.is_tensor()) {
      if (!v.tensor().defined()) {
        return InvalidArgumentError("state dict tensor '" + e.fqn + "' is undefined");
      }
      dtype = v.tensor().dtype();
      global = v.tensor().shape();
      dests.push_back(DestChunk{Shape(global.size(), 0), v.tensor()});
    } else {
      dtype = v.sharded().dtype;
      global = v.sharded().global_shape;
      for (const Shard& sh : v.sharded().shards) {
        if (!sh.tensor.defined() || sh.tensor.dtype() != dtype) {
          return InvalidArgumentError("sharded tensor '" + e.fqn +
                                      "' has an undefined shard or one of another dtype");
        }
        MEGA_RETURN_IF_ERROR(CheckInBounds(e.fqn, global, sh.offsets, sh.tensor.shape()));
        dests.push_back(DestChunk{sh.offsets, sh.tensor});
      }
    }
    if (dtype != stored->properties.dtype) {
      return InvalidArgumentError("dtype mismatch for '" + e.fqn + "': checkpoint has " +
                                  std::string(DTypeName(stored->properties.dtype)) +
                                  ", state dict has " + std::string(DTypeName(dtype)));
    }
    if (global != stored->size) {
      return InvalidArgumentError("shape mismatch for '" + e.fqn + "': checkpoint has " +
                                  ShapeToString(stored->size) + ", state dict has " +
                                  ShapeToString(global));
    }
    for (DestChunk& d : dests) {
      MetadataIndex dest_index(e.fqn, d.offsets);
      std::shared_ptr<std::mutex> mu;
      if (dtype == DType::kF4) {
        const void* key = d.tensor.owner() ? d.tensor.owner().get() : d.tensor.data();
        auto& slot = f4_mutexes_[key];
        if (!slot) slot = std::make_shared<std::mutex>();
        mu = slot;
      }
      if (!tensors_.emplace(dest_index, Dest{d.tensor, std::move(mu)}).second) {
        return InvalidArgumentError("sharded tensor '" + e.fqn + "' has two shards at offsets " +
                                    ShapeToString(d.offsets));
      }
      const Shape& sizes = d.tensor.shape();
      if (Volume(sizes) == 0) continue;
      std::vector<ReadItem> items = CreateReadItemsForChunk(dest_index, d.offsets, sizes, *stored);
      uint64_t covered = 0;
      for (const auto& it : items) covered += Volume(it.lengths);
      if (covered != Volume(sizes)) {
        return DataLossError("checkpoint chunks of '" + e.fqn + "' do not cover the region at " +
                             ShapeToString(d.offsets) + " of size " + ShapeToString(sizes) +
                             " (covered " + std::to_string(covered) + " of " +
                             std::to_string(Volume(sizes)) + " elements)");
      }
      for (auto& it : items) plan->items.push_back(std::move(it));
    }
    return Status::OK();
  }

  DefaultLoadPlannerOptions options_;
  StateDict* state_dict_ = nullptr;
  const Metadata* metadata_ = nullptr;
  bool is_coordinator_ = false;
  std::unordered_map<MetadataIndex, Dest, MetadataIndexHash> tensors_;
  std::unordered_map<const void*, std::shared_ptr<std::mutex>> f4_mutexes_;
  std::unordered_map<std::string, std::string*> bytes_;
};

}  // namespace

std::unique_ptr<SavePlanner> NewDefaultSavePlanner(DefaultSavePlannerOptions options) {
  return std::make_unique<DefaultSavePlanner>(std::move(options));
}

std::unique_ptr<LoadPlanner> NewDefaultLoadPlanner(DefaultLoadPlannerOptions options) {
  return std::make_unique<DefaultLoadPlanner>(options);
}

Result<std::vector<SavePlan>> DedupSavePlans(std::vector<SavePlan> plans, DedupMode mode) {
  // index -> ranks holding it (ascending) and a reference item.
  struct Holders {
    std::vector<int> ranks;
    const WriteItem* item = nullptr;
  };
  std::map<MetadataIndex, Holders> holders;
  for (size_t r = 0; r < plans.size(); ++r) {
    std::set<MetadataIndex> in_this_plan;
    for (const WriteItem& item : plans[r].items) {
      if (!in_this_plan.insert(item.index).second) {
        return InvalidArgumentError("rank " + std::to_string(r) + " proposes " +
                                    ToString(item.index) + " twice");
      }
      Holders& h = holders[item.index];
      if (h.item) {
        const WriteItem& a = *h.item;
        if (a.type != item.type || a.tensor_data != item.tensor_data ||
            a.bytes_size != item.bytes_size) {
          return InvalidArgumentError(
              "replicas of " + ToString(item.index) + " disagree: rank " +
              std::to_string(h.ranks.front()) + " has " + std::string(WriteItemTypeName(a.type)) +
              " of " + std::to_string(WriteItemNbytes(a)) + " bytes, rank " + std::to_string(r) +
              " has " + std::string(WriteItemTypeName(item.type)) + " of " +
              std::to_string(WriteItemNbytes(item)) + " bytes (dtype, chunk or global shape)");
        }
      } else {
        h.item = &item;
      }
      h.ranks.push_back(static_cast<int>(r));
    }
  }
  std::map<MetadataIndex, int> keeper;
  if (mode == DedupMode::kLowestRank) {
    for (const auto& [idx, h] : holders) keeper[idx] = h.ranks.front();
  } else {
    std::vector<uint64_t> load(plans.size(), 0);
    std::vector<const std::pair<const MetadataIndex, Holders>*> replicated;
    for (const auto& entry : holders) {
      if (entry.second.ranks.size() == 1) {
        keeper[entry.first] = entry.second.ranks.front();
        load[entry.second.ranks.front()] += WriteItemNbytes(*entry.second.item);
      } else {
        replicated.push_back(&entry);
      }
    }
    // Largest first, so the greedy assignment balances well.
    std::stable_sort(replicated.begin(), replicated.end(), [](auto* a, auto* b) {
      return WriteItemNbytes(*a->second.item) > WriteItemNbytes(*b->second.item);
    });
    for (auto* entry : replicated) {
      int best = entry->second.ranks.front();
      for (int r : entry->second.ranks) {
        if (load[r] < load[best]) best = r;
      }
      keeper[entry->first] = best;
      load[best] += WriteItemNbytes(*entry->second.item);
    }
  }
  for (size_t r = 0; r < plans.size(); ++r) {
    auto& items = plans[r].items;
    items.erase(std::remove_if(items.begin(), items.end(),
                               [&](const WriteItem& it) {
                                 return keeper.at(it.index) != static_cast<int>(r);
                               }),
                items.end());
  }
  return plans;
}

Result<Metadata> BuildMetadataFromPlans(const std::vector<SavePlan>& plans) {
  Metadata md;
  for (const SavePlan& plan : plans) {
    for (const WriteItem& item : plan.items) {
      const std::string& fqn = item.index.fqn;
      auto it = md.state_dict_metadata.find(fqn);
      if (item.type == WriteItemType::kByteIO) {
        if (it != md.state_dict_metadata.end() &&
            !std::holds_alternative<BytesStorageMetadata>(it->second)) {
          return InvalidArgumentError("'" + fqn + "' is a tensor on one rank and bytes on another");
        }
        md.state_dict_metadata[fqn] = BytesStorageMetadata{};
        continue;
      }
      if (!item.tensor_data) {
        return InvalidArgumentError("write item " + ToString(item.index) + " has no tensor data");
      }
      const TensorWriteData& td = *item.tensor_data;
      if (it == md.state_dict_metadata.end()) {
        MEGA_RETURN_IF_ERROR(LogicalNbytes(td.properties.dtype, td.size).status());
        it = md.state_dict_metadata.emplace(fqn, TensorStorageMetadata{td.properties, td.size, {}})
                 .first;
      }
      auto* tm = std::get_if<TensorStorageMetadata>(&it->second);
      if (!tm) {
        return InvalidArgumentError("'" + fqn + "' is bytes on one rank and a tensor on another");
      }
      if (tm->properties.dtype != td.properties.dtype) {
        return InvalidArgumentError(
            "'" + fqn + "' has dtype " + std::string(DTypeName(tm->properties.dtype)) +
            " on one rank and " + std::string(DTypeName(td.properties.dtype)) + " on another");
      }
      if (tm->size != td.size) {
        return InvalidArgumentError("'" + fqn + "' has global shape " + ShapeToString(tm->size) +
                                    " on one rank and " + ShapeToString(td.size) + " on another");
      }
      if (!item.index.offset || *item.index.offset != td.chunk.offsets) {
        return InvalidArgumentError("write item " + ToString(item.index) +
                                    " has an index that does not match its chunk offsets");
      }
      MEGA_RETURN_IF_ERROR(CheckInBounds(fqn, td.size, td.chunk.offsets, td.chunk.sizes));
      tm->chunks.push_back(td.chunk);
    }
  }
  // Chunks must tile the global shape: disjoint and covering it exactly.
  for (auto& [fqn, value] : md.state_dict_metadata) {
    auto* tm = std::get_if<TensorStorageMetadata>(&value);
    if (!tm) continue;
    auto& chunks = tm->chunks;
    std::sort(chunks.begin(), chunks.end(),
              [](const ChunkStorageMetadata& a, const ChunkStorageMetadata& b) {
                return a.offsets < b.offsets;
              });
    uint64_t total = 0;
    for (size_t i = 0; i < chunks.size(); ++i) {
      total += Volume(chunks[i].sizes);
      for (size_t j = i + 1; j < chunks.size(); ++j) {
        if (!chunks[i].offsets.empty() &&
            chunks[j].offsets[0] >= chunks[i].offsets[0] + chunks[i].sizes[0]) {
          break;  // sorted by dim 0 start: no later chunk can overlap chunk i
        }
        if (BoxesOverlap(chunks[i], chunks[j])) {
          return InvalidArgumentError("tensor '" + fqn + "': chunks " + ChunkString(chunks[i]) +
                                      " and " + ChunkString(chunks[j]) + " overlap");
        }
      }
    }
    if (total != Volume(tm->size)) {
      return InvalidArgumentError("tensor '" + fqn + "': chunks cover " + std::to_string(total) +
                                  " of " + std::to_string(Volume(tm->size)) +
                                  " elements of global shape " + ShapeToString(tm->size));
    }
  }
  return md;
}

std::vector<ReadItem> CreateReadItemsForChunk(const MetadataIndex& dest_index,
                                              const Shape& dest_offsets, const Shape& dest_sizes,
                                              const TensorStorageMetadata& stored) {
  std::vector<ReadItem> out;
  const size_t ndim = dest_offsets.size();
  for (size_t c = 0; c < stored.chunks.size(); ++c) {
    const ChunkStorageMetadata& sc = stored.chunks[c];
    if (sc.offsets.size() != ndim || sc.sizes.size() != ndim) continue;
    ReadItem item;
    item.type = LoadItemType::kTensor;
    item.dest_index = dest_index;
    item.storage_index = MetadataIndex(dest_index.fqn, sc.offsets, static_cast<int64_t>(c));
    bool empty = false;
    for (size_t d = 0; d < ndim; ++d) {
      int64_t lo = std::max(dest_offsets[d], sc.offsets[d]);
      int64_t hi = std::min(dest_offsets[d] + dest_sizes[d], sc.offsets[d] + sc.sizes[d]);
      if (hi <= lo) {
        empty = true;
        break;
      }
      item.dest_offsets.push_back(lo - dest_offsets[d]);
      item.storage_offsets.push_back(lo - sc.offsets[d]);
      item.lengths.push_back(hi - lo);
    }
    if (!empty) out.push_back(std::move(item));
  }
  return out;
}

}  // namespace megackpt::dcp
