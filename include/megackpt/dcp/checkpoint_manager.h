// CheckpointManager: the checkpoints of a training run, one folder per step.
//
//   ROOT/
//     latest                    {"format": "megackpt-ckpt-latest", "step": N, "folder": ...}
//     step-000000100/           a normal checkpoint folder (fs or MEGA storage) plus
//       step.json               the manager's record of the step (metric, time)
//     step-000000200/ ...
//
// A step is *complete* when its folder holds a committed checkpoint (a decodable
// `.metadata`, the writers' commit point). The `latest` record is replaced
// atomically, and only after the step it names is committed and durable (for
// mega:// roots: after its hub commit exists). A crash at any instant leaves
// every complete step loadable and `latest` naming a complete step; a step cut
// short has no `.metadata` and is never loaded (Open removes such folders, see
// CheckpointManagerOptions::remove_incomplete). docs/checkpoint-manager.md has
// the layout, the record formats and the crash-safety argument.
//
// Multi-rank use: every rank opens a manager on the same root with its own
// ProcessGroup and calls Save/Load with the same step, like dcp::Save/Load; rank
// 0 writes the records and applies retention, and every rank returns the same
// status. One job at a time may write into a root.
#ifndef MEGACKPT_DCP_CHECKPOINT_MANAGER_H_
#define MEGACKPT_DCP_CHECKPOINT_MANAGER_H_

#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/status.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/state_dict.h"
#include "megackpt/dcp/storage_factory.h"
#include "megackpt/dist/process_group.h"
#include "megackpt/fs/filesystem.h"

namespace megackpt::dcp {

// Name of the record of the newest committed step, in the root folder.
inline constexpr std::string_view kLatestFileName = "latest";
// Name of the manager's record inside a step folder.
inline constexpr std::string_view kStepRecordFileName = "step.json";

// Which complete steps survive a save (or `megackpt ckpt gc`). A step is kept
// when any rule keeps it; the newest complete step is always kept. With every
// rule 0, all steps are kept.
struct RetentionPolicy {
  // The newest `keep_last` complete steps.
  int keep_last = 0;
  // Every step whose number is a multiple of `keep_every` (0: none).
  int64_t keep_every = 0;
  // The `keep_best` steps with the best metric (StepSaveOptions::metric; steps
  // without a metric never count as best).
  int keep_best = 0;
  // True: a higher metric is better (accuracy); false: lower (loss).
  bool best_is_max = false;

  bool keeps_everything() const { return keep_last <= 0 && keep_every <= 0 && keep_best <= 0; }
};

// Which of the given complete steps `policy` keeps (sorted ascending). `metrics`
// is parallel to `steps` (nullopt: no metric). Pure; used by the manager and gc.
// REQUIRES: steps sorted ascending, unique; metrics.size() == steps.size().
std::vector<int64_t> StepsToKeep(const std::vector<int64_t>& steps,
                                 const std::vector<std::optional<double>>& metrics,
                                 const RetentionPolicy& policy);

// What a second save does while an async save is still in flight.
enum class InFlightPolicy {
  kWait,  // wait for the earlier save to finish (its outcome is not changed)
  kFail,  // fail at once with FailedPrecondition naming the step in flight
};

// Incremental saves (docs/checkpoint-manager.md, "Incremental saves"): an entry
// piece whose bytes equal the same piece of the previous complete step is not
// written again but referenced (its data file hard-linked into the new step
// folder). fs storage on local roots only; other roots save in full (a mega://
// hub deduplicates the unchanged bytes by content anyway).
// What the incremental saves of one rank did, summed over its saves
// (IncrementalOptions::stats).
struct IncrementalStats {
  uint64_t items_written = 0, items_referenced = 0;
  uint64_t bytes_written = 0, bytes_referenced = 0;
  // Bytes hashed to compare items with their base: every block of an
  // unchanged item, and of a changed one up to its first differing block.
  // Written items are hashed while they are written, not counted here, so a
  // full save adds 0.
  uint64_t bytes_compared = 0;
};

struct IncrementalOptions {
  bool enabled = false;
  // Every `full_every`-th save in a row is a full one (0: never forced), which
  // bounds how long old data files stay alive through links.
  int full_every = 0;
  // Hash granularity (XXH3-128 per block).
  uint64_t block_size = 1ull << 20;
  // Optional: each incremental save of this manager (full ones in incremental
  // mode included) adds this rank's counts. Read it when no save is in flight.
  std::shared_ptr<IncrementalStats> stats;
};

struct CheckpointManagerOptions {
  // Storage of the step folders: "fs" (FileSystemWriter/Reader) or "mega"
  // (MegaStorageWriter/Reader). Empty: "mega" for mega:// roots (one hub commit
  // per save), else "fs".
  std::string storage;
  StorageFactoryOptions storage_options;
  RetentionPolicy retention;
  // Digits of the zero-padded step number in folder names (step-000000100).
  // Larger steps get more digits; any number of digits is recognised.
  int step_digits = 9;
  InFlightPolicy in_flight = InFlightPolicy::kWait;
  // Open: remove step folders without a committed checkpoint (left by a crash).
  // False: leave them; they are still never loaded. Saving a step over an
  // incomplete folder of the same number always removes it first.
  bool remove_incomplete = true;
  // Staging pool of async saves; nullptr: AsyncSave's process-wide default.
  std::shared_ptr<StagingPool> pool;
  // Ranks; nullptr: one process. Must outlive the manager; while an async save
  // is in flight the caller must not use it for other collectives.
  dist::ProcessGroup* group = nullptr;
  // Filesystem of the root; nullptr: FileSystemForPath(root).
  std::shared_ptr<fs::FileSystem> fs;
  IncrementalOptions incremental;
};

struct StepSaveOptions {
  // The user's metric of this step (retention keep_best); recorded in step.json.
  std::optional<double> metric;
  // Save again a step that is already complete (its folder is replaced through
  // the writers' own commit). False: AlreadyExists.
  bool overwrite = false;
  // Save planner (nullptr: the default one). Must outlive the save (`done`).
  SavePlanner* planner = nullptr;
  // With incremental saves on: write everything this time.
  bool force_full = false;
};

struct StepLoadOptions {
  // Load planner (nullptr: the default one). Its SetUp runs again for each
  // step tried.
  LoadPlanner* planner = nullptr;
};

// One step folder as the manager sees it.
struct StepInfo {
  int64_t step = 0;
  std::string folder;  // "step-000000100"
  std::string path;    // root/folder
  // A committed checkpoint is present (`.metadata` decodes). Incomplete steps
  // are never loaded.
  bool complete = false;
  // Why the step is incomplete (empty when complete).
  std::string problem;
  std::string storage;  // "fs", "mega" or "" (incomplete)
  std::optional<double> metric;
  double saved_unix_seconds = 0;  // from step.json (0: unknown)
  uint64_t tensors = 0;           // entries stored (tensors and bytes values)
  uint64_t stored_bytes = 0;      // sum of the stored pieces' lengths
  // Of stored_bytes: written by this step's save / referenced from files of
  // earlier steps (incremental saves; 0 otherwise).
  uint64_t bytes_written = 0;
  uint64_t bytes_referenced = 0;
  // The step an incremental save compared against (nullopt: a full save).
  std::optional<int64_t> base_step;
};

// How thoroughly a step is checked.
enum class VerifyLevel {
  // `.metadata` decodes and every file it references exists and is long enough
  // for the ranges it names.
  kStructure,
  // Every stored byte is read through the storage's reader and verified
  // against its checksum (one entry at a time: memory bounded by the largest
  // entry).
  kFull,
};

// A step passed over by LatestValid / Load, and why.
struct SkippedStep {
  int64_t step = 0;
  Status reason;  // e.g. DataLoss naming the file, the tensor and the byte range
};

struct ValidStep {
  int64_t step = 0;
  std::string path;
  // Newer steps passed over, newest first.
  std::vector<SkippedStep> skipped;
};

// Handle of an async step save. `staged`: the caller may modify its tensors.
// `done`: the step is committed, recorded in `latest` and retention applied (OK
// on every rank), or the same error on every rank.
struct StepSaveHandle {
  int64_t step = 0;
  std::shared_future<Status> staged;
  std::shared_future<Status> done;
};

class CheckpointManager {
 public:
  // Opens (creating when missing) the root folder `root` (a local path or a
  // mega:// folder). With remove_incomplete, removes the step folders that hold
  // no committed checkpoint; then makes the `latest` record name the newest
  // complete step (rank 0; the others wait). Collective when
  // options.group is set. Errors: InvalidArgument for a bad storage name or
  // URI; the filesystem's errors naming the root.
  static Result<std::unique_ptr<CheckpointManager>> Open(std::string root,
                                                         CheckpointManagerOptions options = {});

  // Waits for an async save still in flight (its outcome stays in its handle).
  ~CheckpointManager();

  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  const std::string& root() const { return root_; }
  const std::string& storage() const { return storage_; }
  // root/step-<N> (zero-padded).
  std::string StepPath(int64_t step) const;

  // Saves `state_dict` as step `step` and returns once it is committed, durable
  // (per storage_options.sync), recorded in `latest` (when it is the newest
  // complete step) and retention was applied. Collective. Errors:
  // InvalidArgument for a negative step; AlreadyExists when the step is complete
  // and !options.overwrite; FailedPrecondition while an async save is in flight
  // under InFlightPolicy::kFail; the save's errors (nothing of the step becomes
  // visible as complete). A failure after the commit (writing `latest`,
  // retention) is returned too, but the step stays complete and loadable.
  Status Save(int64_t step, const StateDict& state_dict, const StepSaveOptions& options = {});

  // As Save, in the background (dcp::AsyncSave). At most one async save is in
  // flight per manager: a second Save/AsyncSave waits for it or fails (see
  // InFlightPolicy); the second save starts only after the first one's `done`,
  // so their commits, records and retention never overlap. Errors known before
  // anything starts (bad step, kFail conflict, AlreadyExists) are returned
  // directly; later ones through the handle.
  Result<StepSaveHandle> AsyncSave(int64_t step, StateDict state_dict,
                                   const StepSaveOptions& options = {});

  // Waits for the async save in flight, if any, and returns its outcome (OK
  // when none).
  Status WaitForPendingSave();
  // True while an async save has not finished.
  bool save_in_flight() const;

  // Every step folder of the root (complete or not), ascending. Reads each
  // step's `.metadata` and step.json. Collective-free; any rank may call it.
  Result<std::vector<StepInfo>> Steps() const;

  // The newest complete step (nullopt: none). Reads `.metadata` files from the
  // newest step folder down to the first complete one; no payloads.
  Result<std::optional<int64_t>> Latest() const;

  // The step the `latest` record names (nullopt: no record). It names a
  // complete step, but may lag one step behind Latest() after a crash between a
  // step's commit and the record's write (Open rolls it forward). DataLoss when
  // the record is not one.
  Result<std::optional<int64_t>> LatestRecord() const;

  // The newest complete step that passes `level`'s checks, and the newer
  // complete steps skipped with the reason of each. NotFound (listing every
  // skipped step and why) when no step passes. Checks run on the calling rank
  // only.
  Result<ValidStep> LatestValid(VerifyLevel level = VerifyLevel::kFull) const;

  // Checks one step (see VerifyLevel). DataLoss / NotFound naming the file and
  // entry; NotFound when the step is not complete.
  Status VerifyStep(int64_t step, VerifyLevel level = VerifyLevel::kFull) const;

  // Loads step `step` into `state_dict` in place (resharded to the caller's
  // layout, every byte verified by the reader). Without a step: the newest
  // complete step that loads; a step whose load fails (damaged, missing files)
  // is skipped and the next older one tried, each skip reported in the result.
  // Waits for an async save in flight first. Collective; every rank returns the
  // same step. Errors: NotFound when there is
  // no complete step (or `step` is not complete); the load's errors for an
  // explicit step; NotFound listing every skipped step when none loads.
  Result<ValidStep> Load(StateDict& state_dict, std::optional<int64_t> step = std::nullopt,
                         const StepLoadOptions& options = {});

  // Applies `policy` (default: options.retention) now and removes incomplete
  // step folders (except one an async save is writing); returns the removed
  // steps. Not collective: call it on one rank (tools, rank 0).
  Result<std::vector<int64_t>> GarbageCollect(std::optional<RetentionPolicy> policy = std::nullopt);

  // Removes one step folder: its `.metadata` first (the step stops being
  // complete at once), then the rest (fs::FileSystem::RemoveGarbage: a local
  // file system may free the space of large files after this returns).
  // Rewrites `latest` if it named the step.
  Status RemoveStep(int64_t step);

 private:
  CheckpointManager(std::string root, CheckpointManagerOptions options,
                    std::shared_ptr<fs::FileSystem> fs, std::string storage);

  struct PendingSave;

  Status CheckCanStart(int64_t step, const StepSaveOptions& options);
  Result<std::string> PrepareStep(int64_t step, const StepSaveOptions& options);
  Result<std::string> StartStep(int64_t step, const StepSaveOptions& options);
  Result<std::unique_ptr<StorageWriter>> MakeStepWriter(int64_t step, const std::string& base_dir);
  bool incremental_possible() const;
  Status FinishStep(int64_t step, Status saved);
  Status WriteLatest(int64_t step);
  Status RepairLatestRecord();
  Result<std::vector<int64_t>> CollectGarbage(const RetentionPolicy& policy,
                                              std::optional<int64_t> in_flight);
  Status RemoveFolderTree(const std::string& path) const;
  Result<StepInfo> DescribeStep(int64_t step, const std::string& folder) const;
  Result<std::vector<std::pair<int64_t, std::string>>> ListStepFolders() const;
  Result<std::vector<int64_t>> CompleteStepsDescending() const;
  Status Collective(const Status& local_on_rank0);

  std::string root_;
  CheckpointManagerOptions options_;
  std::shared_ptr<fs::FileSystem> fs_;
  std::string storage_;
  std::unique_ptr<dist::ProcessGroup> single_;  // when options_.group is null
  dist::ProcessGroup* group_ = nullptr;
  std::shared_ptr<PendingSave> pending_;
};

// "step-000000100" for step 100 with 9 digits.
std::string StepFolderName(int64_t step, int digits = 9);
// The step of a folder name "step-<digits>", or nullopt.
std::optional<int64_t> ParseStepFolderName(std::string_view name);

}  // namespace megackpt::dcp

#endif  // MEGACKPT_DCP_CHECKPOINT_MANAGER_H_
