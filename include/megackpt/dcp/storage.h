// StorageWriter / StorageReader: the interface between the DCP framework and a
// storage backend (FileSystemWriter/Reader in filesystem.h; the MEGA backend).
//
// Call order for a save, on every rank (spec/dcp.md §2):
//   Reset(checkpoint_id)            [always; empty id = keep the target; starts a new save]
//   GetStorageMeta()                 -> given to the planner
//   SetUpStorageWriter(setup)
//   PrepareLocalPlan(local plan)     -> gathered to the coordinator
//   PrepareGlobalPlan(all plans)     [coordinator only; assigns file names/prefixes]
//   WriteData(plan, planner)         [may be called several times per save, see below]
//   Finish(metadata, all results)    [coordinator only: the commit]
//   Abort()                          [any rank, after a failure before the commit]
// and for a load:
//   Reset(checkpoint_id) [always] -> ReadMetadata() -> SetUpStorageReader(metadata, setup)
//   -> PrepareLocalPlan -> PrepareGlobalPlan [coordinator] -> ReadData(plan, planner).
//
// A writer/reader object serves one rank; the framework never calls one object
// from two threads at once (except where noted), but different ranks' objects may
// run concurrently in one process (threads backend).
#ifndef MEGACKPT_DCP_STORAGE_H_
#define MEGACKPT_DCP_STORAGE_H_

#include <future>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/status.h"
#include "megackpt/dcp/metadata.h"
#include "megackpt/dcp/planner.h"

namespace megackpt::dcp {

struct StorageSetUp {
  bool is_coordinator = true;
  int rank = 0;
  int world_size = 1;
  // False: every rank plans, writes and commits alone (no collectives); each
  // rank is its own coordinator.
  bool use_collectives = true;
};

class StorageWriter {
 public:
  virtual ~StorageWriter() = default;

  // Re-targets the writer at `checkpoint_id` (a path or URI) and forgets the
  // state of any previous save. Empty keeps the current target.
  virtual Status Reset(std::string_view checkpoint_id) = 0;

  // True when this backend can write to `checkpoint_id` (used to pick a backend).
  virtual bool ValidateCheckpointId(std::string_view checkpoint_id) const = 0;

  virtual Status SetUpStorageWriter(const StorageSetUp& setup) = 0;

  virtual Result<SavePlan> PrepareLocalPlan(SavePlan plan) = 0;

  // Coordinator only. Returns the plans (index = rank), typically with
  // plan.storage_data naming where each rank writes. File names must be unique
  // per rank (and per save, if the backend promises crash-safe re-saves).
  virtual Result<std::vector<SavePlan>> PrepareGlobalPlan(std::vector<SavePlan> plans) = 0;

  // Writes every item of `plan` (data from planner.ResolveData) and returns one
  // WriteResult per item. Nothing may become visible as a committed checkpoint
  // before Finish. May be called more than once per save with disjoint subsets of
  // the rank's plan (async_save stages large states in pieces); data of earlier
  // calls must not be overwritten by later ones.
  virtual Result<std::vector<WriteResult>> WriteData(const SavePlan& plan,
                                                     SavePlanner& planner) = 0;

  // WriteData on a background thread. The default runs WriteData with std::async;
  // plan and planner must outlive the future.
  virtual std::future<Result<std::vector<WriteResult>>> WriteDataAsync(const SavePlan& plan,
                                                                       SavePlanner& planner);

  // Coordinator only: commits the checkpoint. `metadata` is complete
  // (storage_data filled from `results`, which holds every rank's results,
  // index = rank). After Finish returns OK the checkpoint is durable and
  // loadable; if it fails or the process crashes before, the previous content
  // of the target stays loadable.
  virtual Status Finish(const Metadata& metadata,
                        const std::vector<std::vector<WriteResult>>& results) = 0;

  // Best-effort removal of what this rank wrote in the current save, unless it
  // was committed. Never fails.
  virtual void Abort() = 0;

  // Describes the target (checkpoint_id, save_id); nullopt when unknown.
  virtual std::optional<StorageMeta> GetStorageMeta() const { return std::nullopt; }
};

class StorageReader {
 public:
  virtual ~StorageReader() = default;

  virtual Status Reset(std::string_view checkpoint_id) = 0;
  virtual bool ValidateCheckpointId(std::string_view checkpoint_id) const = 0;

  // Reads and decodes the checkpoint's Metadata. NotFound when there is no
  // committed checkpoint at the target; DataLoss when it is corrupt.
  virtual Result<Metadata> ReadMetadata() = 0;

  virtual Status SetUpStorageReader(const Metadata& metadata, const StorageSetUp& setup) = 0;
  virtual Result<LoadPlan> PrepareLocalPlan(LoadPlan plan) = 0;
  // Coordinator only.
  virtual Result<std::vector<LoadPlan>> PrepareGlobalPlan(std::vector<LoadPlan> plans) = 0;

  // Reads every item of `plan`: BYTE_IO -> planner.LoadBytes; TENSOR -> the
  // stored box is copied into planner.ResolveTensor(item), then
  // planner.CommitTensor. May call the planner from several threads. Errors name
  // the file and the item (DataLoss for checksum mismatch or truncated data).
  virtual Status ReadData(const LoadPlan& plan, LoadPlanner& planner) = 0;
};

}  // namespace megackpt::dcp

#endif  // MEGACKPT_DCP_STORAGE_H_
