// Plans and planners: what each rank writes or reads, decided before any I/O.
//
// A SavePlanner turns a state dict into WriteItems (one per tensor chunk or bytes
// value), and on the coordinator merges every rank's plan into the global plan
// plus the checkpoint Metadata. A LoadPlanner turns the caller's state dict and
// the checkpoint Metadata into ReadItems: one per overlap of a local destination
// chunk with a stored chunk, which is what makes resharding work.
//
// Planners are pure: no I/O, no threads, no collectives (the save/load flow in
// checkpoint.h does those). The call order is spec/dcp.md §2.
#ifndef MEGACKPT_DCP_PLANNER_H_
#define MEGACKPT_DCP_PLANNER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "megackpt/config.h"  // MEGACKPT_VERSION (CMake's project version)
#include "megackpt/core/status.h"
#include "megackpt/core/tensor.h"
#include "megackpt/dcp/metadata.h"
#include "megackpt/dcp/state_dict.h"

namespace megackpt::dcp {

enum class WriteItemType { kTensor, kShard, kByteIO };
enum class LoadItemType { kTensor, kByteIO };

std::string_view WriteItemTypeName(WriteItemType type);  // "TENSOR", "SHARD", "BYTE_IO"
std::string_view LoadItemTypeName(LoadItemType type);    // "TENSOR", "BYTE_IO"

struct TensorWriteData {
  ChunkStorageMetadata chunk;
  TensorProperties properties;
  Shape size;  // global shape
  friend bool operator==(const TensorWriteData&, const TensorWriteData&) = default;
};

// One piece a rank writes. TENSOR: a whole tensor (chunk = everything);
// SHARD: one chunk of a sharded tensor; BYTE_IO: a bytes value of bytes_size bytes.
struct WriteItem {
  MetadataIndex index;
  WriteItemType type = WriteItemType::kTensor;
  std::optional<TensorWriteData> tensor_data;  // TENSOR and SHARD
  uint64_t bytes_size = 0;                     // BYTE_IO
  friend bool operator==(const WriteItem& a, const WriteItem& b) {
    return a.index == b.index && a.index.index == b.index.index && a.type == b.type &&
           a.tensor_data == b.tensor_data && a.bytes_size == b.bytes_size;
  }
};

// Bytes this item writes (tensor chunk bytes or bytes_size).
uint64_t WriteItemNbytes(const WriteItem& item);

// Copy the box `lengths` from the stored piece `storage_index` (starting at
// `storage_offsets`, relative to the stored chunk) into the destination
// `dest_index` (starting at `dest_offsets`, relative to the destination chunk).
// BYTE_IO items have empty offsets/lengths and copy the whole value.
struct ReadItem {
  LoadItemType type = LoadItemType::kTensor;
  MetadataIndex dest_index;
  Shape dest_offsets;
  MetadataIndex storage_index;
  Shape storage_offsets;
  Shape lengths;
  friend bool operator==(const ReadItem& a, const ReadItem& b) {
    return a.type == b.type && a.dest_index == b.dest_index && a.dest_offsets == b.dest_offsets &&
           a.storage_index == b.storage_index && a.storage_offsets == b.storage_offsets &&
           a.lengths == b.lengths;
  }
};

// storage_data: opaque, storage-defined (the FileSystemWriter puts the data file
// prefix there in PrepareGlobalPlan).
struct SavePlan {
  std::vector<WriteItem> items;
  std::string storage_data;
  PlannerData planner_data;
  friend bool operator==(const SavePlan&, const SavePlan&) = default;
};

struct LoadPlan {
  std::vector<ReadItem> items;
  std::string storage_data;
  PlannerData planner_data;
  friend bool operator==(const LoadPlan&, const LoadPlan&) = default;
};

// What a StorageWriter reports for each item it wrote. size_in_bytes = the
// item's bytes (not a file size).
struct WriteResult {
  MetadataIndex index;
  uint64_t size_in_bytes = 0;
  StorageInfo storage_data;
  // Storage-defined data the coordinator's StorageWriter::Finish needs besides
  // the metadata, e.g. what this rank staged in its storage transaction
  // (MegaStorageWriter: fs::Transaction::Export()). Travels with the results
  // to the coordinator; never stored in the checkpoint. Usually empty.
  std::string commit_token;
  friend bool operator==(const WriteResult&, const WriteResult&) = default;
};

// The bytes of one WriteItem, as handed to a StorageWriter.
//  - TENSOR/SHARD: `tensor`, a view of the chunk (shape == chunk sizes, dtype as
//    planned). It may be strided; storage writes it in row-major order.
//  - BYTE_IO: `bytes`.
// The memory stays valid while this object (its `hold`) lives and, for a
// synchronous save, until Save returns. Writers must not modify it.
struct ResolvedData {
  Tensor tensor;
  std::string_view bytes;
  std::shared_ptr<const void> hold;  // keeps staged memory alive; may be null
};

// OK when `data` is what the plan asks for `item`: item.bytes_size bytes
// (BYTE_IO), or a defined tensor of the chunk's dtype and shape; otherwise
// Internal "planner resolved <index> to ...". Storage writers check every
// SavePlanner::ResolveData result with it before writing.
Status CheckResolvedData(const WriteItem& item, const ResolvedData& data);

struct GlobalSavePlan {
  std::vector<SavePlan> plans;  // one per rank, index = rank
  Metadata metadata;
};

class SavePlanner {
 public:
  virtual ~SavePlanner() = default;

  // Called first, on every rank. `state_dict` must stay unchanged and alive until
  // the save finishes (for async_save: until staged).
  virtual Status SetUp(const StateDict& state_dict, const std::optional<StorageMeta>& storage_meta,
                       bool is_coordinator) = 0;

  // This rank's proposal: every item it holds (replicas included).
  virtual Result<SavePlan> CreateLocalPlan() = 0;

  // Coordinator only: every rank's plan (index = rank) after the writer's
  // PrepareLocalPlan. Returns the plan each rank must execute and the Metadata
  // (without storage_data, which the writers' results fill in).
  virtual Result<GlobalSavePlan> CreateGlobalPlan(std::vector<SavePlan> all_plans) = 0;

  // Every rank: its part of the global plan (after the writer's PrepareGlobalPlan).
  virtual Result<SavePlan> FinishPlan(SavePlan central_plan) = 0;

  // The data to write for `item` (an item of the finished plan).
  // Thread-safe: writers call it from several threads. It may block while a
  // bounded staging pool is full; a writer thread must release (destroy) one
  // ResolvedData before resolving the next item.
  virtual Result<ResolvedData> ResolveData(const WriteItem& item) = 0;
};

class LoadPlanner {
 public:
  virtual ~LoadPlanner() = default;

  // Called after the reader produced the checkpoint's Metadata. `state_dict` is
  // the caller's: tensors are filled in place, bytes values replaced. It must stay
  // alive and structurally unchanged until the load returns.
  virtual Status SetUp(StateDict* state_dict, const Metadata& metadata, bool is_coordinator) = 0;

  virtual Result<LoadPlan> CreateLocalPlan() = 0;
  // Coordinator only; index = rank.
  virtual Result<std::vector<LoadPlan>> CreateGlobalPlan(std::vector<LoadPlan> all_plans) = 0;
  virtual Result<LoadPlan> FinishPlan(LoadPlan central_plan) = 0;

  // BYTE_IO: stores the value read for item. Thread-safe across distinct items.
  virtual Status LoadBytes(const ReadItem& item, std::string value) = 0;
  // TENSOR: the destination view for item (shape == item.lengths, the caller's
  // dtype). The reader copies the stored box into it, then calls CommitTensor.
  // Thread-safe across distinct items.
  virtual Result<Tensor> ResolveTensor(const ReadItem& item) = 0;
  virtual Status CommitTensor(const ReadItem& item, const Tensor& tensor) = 0;
};

// ---- Default planners ------------------------------------------------------

enum class DedupMode {
  kLowestRank,    // a replicated item is written by the lowest rank holding it
  kLoadBalanced,  // ... by the holder with the fewest bytes assigned so far
};

struct DefaultSavePlannerOptions {
  // Flatten nested dicts/lists to dotted fqns (and record their paths). When
  // false, nested values are an error.
  bool flatten_state_dict = true;
  DedupMode dedup = DedupMode::kLowestRank;
  // Producer string stored in Metadata::version: "megackpt <project version>".
  std::string version = "megackpt " MEGACKPT_VERSION;
};

struct DefaultLoadPlannerOptions {
  bool flatten_state_dict = true;
  // When true, entries of the state dict missing from the checkpoint are left
  // untouched instead of failing the load with NotFound.
  bool allow_partial_load = false;
};

std::unique_ptr<SavePlanner> NewDefaultSavePlanner(DefaultSavePlannerOptions options = {});
// The default load planner resolves a TENSOR item to a view of the caller's
// tensor, except for F4 boxes that are not a byte-aligned contiguous view: those
// resolve to a temporary that CommitTensor(item, that tensor) copies in
// nibble-exactly (docs/dcp.md "F4 resharding").
std::unique_ptr<LoadPlanner> NewDefaultLoadPlanner(DefaultLoadPlannerOptions options = {});

// ---- Building blocks (used by the default planners; reusable) --------------

// Keeps one copy of every item that several plans propose (same MetadataIndex).
// InvalidArgument when the copies disagree (type, dtype, sizes, global shape).
Result<std::vector<SavePlan>> DedupSavePlans(std::vector<SavePlan> plans, DedupMode mode);

// Builds state_dict_metadata from deduplicated plans and checks each tensor:
// one dtype and global shape across ranks, chunks inside the global shape,
// pairwise disjoint, covering it exactly. InvalidArgument naming the fqn/chunks.
Result<Metadata> BuildMetadataFromPlans(const std::vector<SavePlan>& plans);

// The boxes of stored chunks that overlap the destination chunk (`dest_offsets`,
// `dest_sizes` in global coordinates) of tensor `fqn`: one ReadItem per
// non-empty intersection. `dest_index` is the destination's MetadataIndex.
std::vector<ReadItem> CreateReadItemsForChunk(const MetadataIndex& dest_index,
                                              const Shape& dest_offsets, const Shape& dest_sizes,
                                              const TensorStorageMetadata& stored);

}  // namespace megackpt::dcp

#endif  // MEGACKPT_DCP_PLANNER_H_
