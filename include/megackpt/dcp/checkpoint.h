// Save, load and async_save of distributed checkpoints.
//
// Every rank calls the same function with its own state dict, its own
// StorageWriter/Reader object and its ProcessGroup; rank 0 coordinates. The flow
// (spec/dcp.md §2, docs/dcp.md "Flows"):
//   save: plan locally -> gather plans -> coordinator builds the global plan and
//         Metadata -> scatter -> every rank writes its items -> gather results ->
//         coordinator commits (StorageWriter::Finish) -> broadcast the outcome.
//   load: read Metadata -> plan locally (resharding) -> gather/scatter -> read
//         into the caller's tensors in place -> agree on the outcome.
// An error on any rank at any step is returned on every rank (its message
// prefixed with "rank R: "); no rank waits forever (ProcessGroup deadlines).
#ifndef MEGACKPT_DCP_CHECKPOINT_H_
#define MEGACKPT_DCP_CHECKPOINT_H_

#include <cstdint>
#include <future>
#include <memory>
#include <string>

#include "megackpt/core/status.h"
#include "megackpt/dcp/planner.h"
#include "megackpt/dcp/state_dict.h"
#include "megackpt/dcp/storage.h"
#include "megackpt/dist/process_group.h"

namespace megackpt::dcp {

// Wall-clock seconds per phase of one rank's save/load (optional output).
struct SaveStats {
  double plan_seconds = 0;     // set-up, local/global planning and the plan collectives
  double write_seconds = 0;    // WriteData on this rank
  double commit_seconds = 0;   // result gather, Finish (coordinator) and the outcome broadcast
  uint64_t bytes_written = 0;  // sum of this rank's WriteResult::size_in_bytes
};

struct LoadStats {
  double metadata_seconds = 0;
  double plan_seconds = 0;
  double read_seconds = 0;  // ReadData plus the final status agreement
};

struct SaveOptions {
  // Passed to StorageWriter::Reset when non-empty.
  std::string checkpoint_id;
  // nullptr: a default save planner (DefaultSavePlannerOptions{}).
  SavePlanner* planner = nullptr;
  // False: no collectives; every rank saves alone (see StorageSetUp).
  bool use_collectives = true;
  // When non-null, receives this rank's phase timings.
  SaveStats* stats = nullptr;
};

struct LoadOptions {
  std::string checkpoint_id;
  // nullptr: a default load planner (DefaultLoadPlannerOptions{}).
  LoadPlanner* planner = nullptr;
  bool use_collectives = true;
  LoadStats* stats = nullptr;
};

// Saves `state_dict` through `writer`. `group` == nullptr means a single
// process. Returns OK on every rank once the checkpoint is committed, or the
// same error on every rank (after calling writer.Abort() on each rank).
Status Save(const StateDict& state_dict, StorageWriter& writer, dist::ProcessGroup* group = nullptr,
            const SaveOptions& options = {});

// Loads the checkpoint read by `reader` into `state_dict` in place: tensors (whole
// and every local shard) are filled, bytes values replaced. The caller's
// tensors define the destination sharding; any sharding of the saved checkpoint
// is accepted. Errors: NotFound for a key missing in the checkpoint (unless
// partial load), InvalidArgument for dtype/shape/kind mismatch, DataLoss for
// corrupt or truncated data.
Status Load(StateDict& state_dict, StorageReader& reader, dist::ProcessGroup* group = nullptr,
            const LoadOptions& options = {});

// ---- single-process conveniences ------------------------------------------
// Save / Load of a whole state dict at a path in one call, for one process:
//   dcp::Save(state_dict, "/ckpt/step-100");       // or "mega://org/model@main/ckpt/step-100"
//   dcp::Load("/ckpt/step-100", state_dict);       // fills the tensors in place
// The filesystem comes from the path (fs::FileSystemForPath: a local folder, or
// mega:// when the hub layer is linked); the storage format from the options.
struct PathSaveOptions {
  // "mega" (MegaStorageWriter: .mega shards + index, the default) or "fs"
  // (FileSystemWriter: .distcp files).
  std::string storage = "mega";
  int thread_count = 2;
  // fsync before the commit (see MegaStorageWriterOptions::sync).
  bool sync = true;
  // False: AlreadyExists when a checkpoint is already committed at the path.
  bool overwrite = true;
  // With sync: data files skip the page cache (StorageFactoryOptions::direct_io).
  bool direct_io = false;
};

struct PathLoadOptions {
  // As PathSaveOptions::storage; must match how the checkpoint was saved
  // ("mega" also reads Hugging Face safetensors layouts and single files).
  std::string storage = "mega";
  int thread_count = 2;
};

// Save(state_dict, writer) with the writer for `path` (MakeStorageWriter).
// Errors: InvalidArgument for an unknown storage; FailedPrecondition for a
// scheme no linked layer serves; otherwise as Save.
Status Save(const StateDict& state_dict, const std::string& path,
            const PathSaveOptions& options = {});

// Load(state_dict, reader) with the reader for `path` (MakeStorageReader).
// Errors as Save above and Load.
Status Load(const std::string& path, StateDict& state_dict, const PathLoadOptions& options = {});

// Reusable staging memory for AsyncSave, pre-faulted (huge-page) and kept for
// later saves. A save whose tensors fit `capacity_bytes` takes an arena of
// its own size for the whole save, without waiting (one more arena is made
// when saves overlap, e.g. thread ranks sharing a pool). A larger state is
// staged in waves through one arena of at most `capacity_bytes`, one such save
// at a time (a second one waits). Thread-safe. Pools come from Create
// (AsyncSave relies on its implementation).
class StagingPool {
 public:
  static std::shared_ptr<StagingPool> Create(uint64_t capacity_bytes);
  virtual ~StagingPool() = default;
  virtual uint64_t capacity_bytes() const = 0;
  // Bytes currently reserved (allocated and pre-faulted).
  virtual uint64_t reserved_bytes() const = 0;
};

struct AsyncSaveOptions {
  SaveOptions save;
  // Where tensors are staged. nullptr: a process-wide pool of
  // default_pool_capacity_bytes (created on first use, reused).
  std::shared_ptr<StagingPool> pool;
  uint64_t default_pool_capacity_bytes = 1ull << 30;
};

struct AsyncSaveHandle {
  // Ready once every tensor/bytes value of this rank has been copied out of the
  // caller's state dict (or the save failed first): from then on the caller may
  // modify or free its tensors. Holds the save's status so far.
  std::shared_future<Status> staged;
  // Ready when the save is committed (OK on every rank) or failed (the same
  // error on every rank). Destroying the last copy waits for completion.
  std::shared_future<Status> done;
};

// Saves in the background. The state is staged into `pool` (copies of tensors
// and bytes); when it fits, every tensor is copied first, by several threads,
// and `staged` is ready once that copy is done and the storage is set up; when
// it exceeds the pool, it is staged in pieces and each piece is
// written as soon as it is full, so `staged` comes after all but the last
// piece has been written. `writer` and `group` are used from a background thread
// until `done`; the caller must not use `group` for other collectives meanwhile.
// `group` may be null (single process) and must outlive `done`.
AsyncSaveHandle AsyncSave(StateDict state_dict, std::shared_ptr<StorageWriter> writer,
                          dist::ProcessGroup* group = nullptr, AsyncSaveOptions options = {});

}  // namespace megackpt::dcp

#endif  // MEGACKPT_DCP_CHECKPOINT_H_
