// CheckpointManager (include/megackpt/dcp/checkpoint_manager.h,
// docs/checkpoint-manager.md).
//
// Ordering that makes a crash at any instant harmless:
//   save:   step.json -> dcp::Save (the writer's .metadata rename is the step's
//           commit point) -> `latest` (atomic replace) -> retention.
//   remove: .metadata first (the step stops being complete in one unlink), then
//           the rest of the folder, then the folder.
// A reader only trusts .metadata, so a step is either complete (committed,
// durable) or ignored; `latest` is only ever written to name a complete step,
// and Latest() re-checks it anyway.
#include "megackpt/dcp/checkpoint_manager.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>

#include "dcp/entry_io.h"
#include "dcp/incremental.h"
#include "megackpt/core/file.h"  // BaseName, ParentOf
#include "megackpt/dcp/filesystem.h"
#include "megackpt/dcp/metadata.h"

namespace megackpt::dcp {

using nlohmann::json;

namespace {

constexpr std::string_view kLatestFormat = "megackpt-ckpt-latest";
constexpr std::string_view kStepFormat = "megackpt-ckpt-step";
constexpr std::string_view kStepPrefix = "step-";
constexpr uint64_t kMaxRecordBytes = 1 << 20;

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Statuses that mean "this step's data is damaged or gone", as opposed to a
// mismatch between the caller's state dict and the checkpoint.
bool IsDamage(const Status& s) {
  return s.code() == StatusCode::kDataLoss || s.code() == StatusCode::kNotFound ||
         s.code() == StatusCode::kIOError || s.code() == StatusCode::kOutOfRange;
}

std::string JoinSkipped(const std::vector<SkippedStep>& skipped) {
  std::string out;
  for (const SkippedStep& s : skipped) {
    out += "\n  step " + std::to_string(s.step) + ": " + s.reason.ToString();
  }
  return out;
}

}  // namespace

std::string StepFolderName(int64_t step, int digits) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%0*lld", std::clamp(digits, 1, 19), static_cast<long long>(step));
  return std::string(kStepPrefix) + buf;
}

std::optional<int64_t> ParseStepFolderName(std::string_view name) {
  if (!name.starts_with(kStepPrefix)) return std::nullopt;
  name.remove_prefix(kStepPrefix.size());
  if (name.empty() || name.size() > 19) return std::nullopt;
  int64_t v = 0;
  for (char c : name) {
    if (c < '0' || c > '9') return std::nullopt;
    if (v > (INT64_MAX - 9) / 10) return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::vector<int64_t> StepsToKeep(const std::vector<int64_t>& steps,
                                 const std::vector<std::optional<double>>& metrics,
                                 const RetentionPolicy& policy) {
  if (steps.empty() || policy.keeps_everything()) return steps;
  std::set<int64_t> keep;
  keep.insert(steps.back());  // the newest complete step, always
  const size_t n = steps.size();
  for (size_t i = 0; i < n; ++i) {
    if (policy.keep_last > 0 && i + static_cast<size_t>(policy.keep_last) >= n)
      keep.insert(steps[i]);
    if (policy.keep_every > 0 && steps[i] % policy.keep_every == 0) keep.insert(steps[i]);
  }
  if (policy.keep_best > 0) {
    std::vector<size_t> with_metric;
    for (size_t i = 0; i < n; ++i) {
      if (metrics[i] && !std::isnan(*metrics[i])) with_metric.push_back(i);
    }
    // Best first; ties go to the newer step.
    std::stable_sort(with_metric.begin(), with_metric.end(), [&](size_t a, size_t b) {
      double ma = *metrics[a], mb = *metrics[b];
      if (ma != mb) return policy.best_is_max ? ma > mb : ma < mb;
      return steps[a] > steps[b];
    });
    for (size_t k = 0; k < with_metric.size() && k < static_cast<size_t>(policy.keep_best); ++k) {
      keep.insert(steps[with_metric[k]]);
    }
  }
  return std::vector<int64_t>(keep.begin(), keep.end());
}

// ---- the async save in flight ------------------------------------------------

struct CheckpointManager::PendingSave {
  int64_t step = 0;
  std::shared_future<Status> done;
};

CheckpointManager::CheckpointManager(std::string root, CheckpointManagerOptions options,
                                     std::shared_ptr<fs::FileSystem> fs, std::string storage)
    : root_(std::move(root)),
      options_(std::move(options)),
      fs_(std::move(fs)),
      storage_(std::move(storage)) {
  if (options_.group) {
    group_ = options_.group;
  } else {
    single_ = dist::NewSingleProcessGroup();
    group_ = single_.get();
  }
}

CheckpointManager::~CheckpointManager() { WaitForPendingSave().IgnoreError(); }

Result<std::unique_ptr<CheckpointManager>> CheckpointManager::Open(
    std::string root, CheckpointManagerOptions options) {
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  if (root.empty()) return InvalidArgumentError("checkpoint manager: empty root folder");
  const bool is_uri = root.rfind("mega://", 0) == 0;
  std::string storage = options.storage.empty() ? (is_uri ? "mega" : "fs") : options.storage;
  if (storage != "fs" && storage != "mega") {
    return InvalidArgumentError("checkpoint manager: unknown storage '" + storage +
                                "' (expected fs or mega)");
  }
  std::shared_ptr<fs::FileSystem> fs = options.fs;
  if (!fs) {
    MEGA_ASSIGN_OR_RETURN(fs, fs::FileSystemForPath(root));
  }
  std::unique_ptr<CheckpointManager> m(new CheckpointManager(std::move(root), std::move(options),
                                                             std::move(fs), std::move(storage)));
  Status local;
  if (m->group_->rank() == 0) {
    local = m->fs_->CreateDirectories(m->root_).WithContext("checkpoint root " + m->root_);
    if (local.ok() && m->options_.remove_incomplete) {
      auto folders = m->ListStepFolders();
      if (!folders.ok()) {
        local = folders.status();
      } else {
        for (const auto& [step, folder] : *folders) {
          auto info = m->DescribeStep(step, folder);
          if (info.ok() && !info->complete) {
            // Left by a crash: never loadable, so nothing is lost.
            m->RemoveFolderTree(fs::JoinPath(m->root_, folder)).IgnoreError();
          }
        }
      }
    }
    if (local.ok()) local = m->RepairLatestRecord();
  }
  MEGA_RETURN_IF_ERROR(m->Collective(local));
  return m;
}

std::string CheckpointManager::StepPath(int64_t step) const {
  return fs::JoinPath(root_, StepFolderName(step, options_.step_digits));
}

Status CheckpointManager::Collective(const Status& local_on_rank0) {
  if (group_->world_size() == 1) return local_on_rank0;
  Status s = group_->AllReduceStatus(group_->rank() == 0 ? local_on_rank0 : Status::OK());
  return s;
}

// ---- listing -------------------------------------------------------------------

Result<std::vector<std::pair<int64_t, std::string>>> CheckpointManager::ListStepFolders() const {
  auto listing = fs_->List(root_);
  if (!listing.ok()) {
    if (listing.status().code() == StatusCode::kNotFound) {
      return std::vector<std::pair<int64_t, std::string>>{};
    }
    return listing.status().WithContext("checkpoint root " + root_);
  }
  std::vector<std::pair<int64_t, std::string>> out;
  for (const fs::FileInfo& fi : *listing) {
    if (!fi.is_directory) continue;
    std::string name = BaseName(fi.path);
    if (auto step = ParseStepFolderName(name)) out.emplace_back(*step, name);
  }
  // Two spellings of one number (step-100, step-0100): keep both, the
  // canonical one first.
  std::sort(out.begin(), out.end());
  return out;
}

Result<StepInfo> CheckpointManager::DescribeStep(int64_t step, const std::string& folder) const {
  StepInfo info;
  info.step = step;
  info.folder = folder;
  info.path = fs::JoinPath(root_, folder);
  const std::string md_path = fs::JoinPath(info.path, kMetadataFileName);
  auto text = fs_->ReadWhole(md_path, kMaxMetadataBytes);
  if (!text.ok()) {
    if (text.status().code() != StatusCode::kNotFound) return text.status();
    info.problem = "no committed checkpoint (" + md_path +
                   " missing): the save was cut short or is still running";
  } else {
    auto md = DecodeMetadata(*text);
    if (!md.ok()) {
      info.problem = md_path + ": " + md.status().message();
    } else {
      info.complete = true;
      info.storage = StorageKindOf(*md, storage_);
      info.tensors = md->state_dict_metadata.size();
      // Files of this save carry its save id; others were linked from earlier steps.
      const std::string own =
          md->storage_meta ? "__" + md->storage_meta->save_id + "_" : std::string();
      for (const auto& [index, si] : md->storage_data) {
        info.stored_bytes += si.length;
        const bool linked =
            info.storage == "fs" && !own.empty() && si.relative_path.rfind(own, 0) != 0;
        (linked ? info.bytes_referenced : info.bytes_written) += si.length;
      }
    }
  }
  auto record = fs_->ReadWhole(fs::JoinPath(info.path, kStepRecordFileName), kMaxRecordBytes);
  if (record.ok()) {
    // The record is informative; a damaged one only loses the metric.
    json j = json::parse(*record, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("format", "") == kStepFormat) {
      if (j.contains("metric") && j["metric"].is_number()) info.metric = j["metric"].get<double>();
      if (j.contains("time") && j["time"].is_number())
        info.saved_unix_seconds = j["time"].get<double>();
      if (j.contains("base") && j["base"].is_number_integer())
        info.base_step = j["base"].get<int64_t>();
    }
  }
  return info;
}

Result<std::vector<StepInfo>> CheckpointManager::Steps() const {
  MEGA_ASSIGN_OR_RETURN(auto folders, ListStepFolders());
  std::vector<StepInfo> out;
  for (const auto& [step, folder] : folders) {
    MEGA_ASSIGN_OR_RETURN(StepInfo info, DescribeStep(step, folder));
    out.push_back(std::move(info));
  }
  return out;
}

Result<std::vector<int64_t>> CheckpointManager::CompleteStepsDescending() const {
  MEGA_ASSIGN_OR_RETURN(auto steps, Steps());
  std::vector<int64_t> out;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (it->complete && it->folder == StepFolderName(it->step, options_.step_digits)) {
      out.push_back(it->step);
    }
  }
  return out;
}

Result<std::optional<int64_t>> CheckpointManager::Latest() const {
  // The commit point of a step is its .metadata, so the newest complete step
  // is the truth; the `latest` record can lag behind it by one step after a
  // crash between a commit and the record's write (Open rolls it forward).
  MEGA_ASSIGN_OR_RETURN(auto folders, ListStepFolders());
  for (auto it = folders.rbegin(); it != folders.rend(); ++it) {
    if (it->second != StepFolderName(it->first, options_.step_digits)) continue;
    MEGA_ASSIGN_OR_RETURN(StepInfo info, DescribeStep(it->first, it->second));
    if (info.complete) return std::optional<int64_t>(it->first);
  }
  return std::optional<int64_t>();
}

Result<std::optional<int64_t>> CheckpointManager::LatestRecord() const {
  auto record = fs_->ReadWhole(fs::JoinPath(root_, kLatestFileName), kMaxRecordBytes);
  if (!record.ok()) {
    if (record.status().code() == StatusCode::kNotFound) return std::optional<int64_t>();
    return record.status();
  }
  json j = json::parse(*record, nullptr, false);
  if (!j.is_object() || j.value("format", "") != kLatestFormat || !j.contains("step") ||
      !j["step"].is_number_integer()) {
    return DataLossError(fs::JoinPath(root_, kLatestFileName) + ": not a " +
                         std::string(kLatestFormat) + " record");
  }
  return std::optional<int64_t>(j["step"].get<int64_t>());
}

Status CheckpointManager::RepairLatestRecord() {
  MEGA_ASSIGN_OR_RETURN(std::optional<int64_t> newest, Latest());
  auto record = LatestRecord();
  if (record.ok() && *record == newest) return Status::OK();
  if (!newest) return fs_->Remove(fs::JoinPath(root_, kLatestFileName));
  return WriteLatest(*newest);
}

// ---- verification -----------------------------------------------------------

Status CheckpointManager::VerifyStep(int64_t step, VerifyLevel level) const {
  const std::string folder = StepFolderName(step, options_.step_digits);
  MEGA_ASSIGN_OR_RETURN(StepInfo info, DescribeStep(step, folder));
  if (!info.complete) return NotFoundError("step " + std::to_string(step) + ": " + info.problem);
  MEGA_ASSIGN_OR_RETURN(std::string text, fs_->ReadWhole(fs::JoinPath(info.path, kMetadataFileName),
                                                         kMaxMetadataBytes));
  MEGA_ASSIGN_OR_RETURN(Metadata md, DecodeMetadata(text));
  // Structure: every referenced file exists and holds the ranges named.
  std::map<std::string, uint64_t> sizes;
  for (const auto& [index, si] : md.storage_data) {
    auto it = sizes.find(si.relative_path);
    if (it == sizes.end()) {
      const std::string file = fs::JoinPath(info.path, si.relative_path);
      auto st = fs_->Stat(file);
      if (!st.ok()) {
        return Status(st.status().code(), "step " + std::to_string(step) + ": " +
                                              st.status().message() + " (holds " + ToString(index) +
                                              ")");
      }
      it = sizes.emplace(si.relative_path, st->size).first;
    }
    if (si.offset > it->second || (info.storage == "fs" && si.length > it->second - si.offset)) {
      return DataLossError("step " + std::to_string(step) + ": " +
                           fs::JoinPath(info.path, si.relative_path) + " is truncated: it has " +
                           std::to_string(it->second) + " bytes, " + ToString(index) +
                           " is stored at [" + std::to_string(si.offset) + ", " +
                           std::to_string(si.offset + si.length) + ")");
    }
  }
  if (level == VerifyLevel::kStructure) return Status::OK();
  // Every byte: load one entry at a time through the storage's own reader
  // (which verifies every checksum block it returns).
  for (const auto& [fqn, entry] : md.state_dict_metadata) {
    auto value = LoadEntryWhole(info.storage, info.path, md, fqn, options_.storage_options);
    if (!value.ok()) return value.status().WithContext("step " + std::to_string(step));
  }
  return Status::OK();
}

Result<ValidStep> CheckpointManager::LatestValid(VerifyLevel level) const {
  MEGA_ASSIGN_OR_RETURN(auto steps, Steps());
  ValidStep out;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    if (it->folder != StepFolderName(it->step, options_.step_digits)) continue;
    if (!it->complete) {
      out.skipped.push_back({it->step, NotFoundError(it->problem)});
      continue;
    }
    Status s = VerifyStep(it->step, level);
    if (s.ok()) {
      out.step = it->step;
      out.path = it->path;
      return out;
    }
    out.skipped.push_back({it->step, s});
  }
  return NotFoundError("no valid step in " + root_ +
                       (out.skipped.empty()
                            ? std::string(" (no step folders)")
                            : ": every step was skipped:" + JoinSkipped(out.skipped)));
}

// ---- saving -------------------------------------------------------------------

bool CheckpointManager::save_in_flight() const {
  return pending_ && pending_->done.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
}

Status CheckpointManager::WaitForPendingSave() {
  if (!pending_) return Status::OK();
  Status s = pending_->done.get();
  pending_.reset();
  return s;
}

Status CheckpointManager::CheckCanStart(int64_t step, const StepSaveOptions& options) {
  (void)options;
  if (step < 0)
    return InvalidArgumentError("checkpoint step must be >= 0, got " + std::to_string(step));
  if (save_in_flight() && options_.in_flight == InFlightPolicy::kFail) {
    return FailedPreconditionError("cannot save step " + std::to_string(step) + " to " + root_ +
                                   ": the async save of step " + std::to_string(pending_->step) +
                                   " is still in flight (InFlightPolicy::kFail)");
  }
  // kWait, or finished: its outcome stays in its own handle.
  WaitForPendingSave().IgnoreError();
  return Status::OK();
}

bool CheckpointManager::incremental_possible() const {
  // Hard links keep every referenced file inside the step folder; the local
  // filesystem has them, a hub path does not (it deduplicates by content).
  return options_.incremental.enabled && storage_ == "fs" && fs_->capabilities().hard_links;
}

// Rank 0: makes the step folder ready for the writer, picks the base of an
// incremental save and writes step.json. Returns the base folder ("" = full).
Result<std::string> CheckpointManager::PrepareStep(int64_t step, const StepSaveOptions& options) {
  const std::string folder = StepFolderName(step, options_.step_digits);
  const std::string path = fs::JoinPath(root_, folder);
  MEGA_ASSIGN_OR_RETURN(bool exists, fs_->Exists(path));
  if (exists) {
    MEGA_ASSIGN_OR_RETURN(StepInfo info, DescribeStep(step, folder));
    if (info.complete && !options.overwrite) {
      return AlreadyExistsError("step " + std::to_string(step) + " already exists at " + path +
                                " (StepSaveOptions::overwrite replaces it)");
    }
    // An incomplete folder is a crashed save's: start from nothing.
    if (!info.complete) MEGA_RETURN_IF_ERROR(RemoveFolderTree(path));
  }
  std::optional<int64_t> base;
  int64_t depth = 0;
  if (incremental_possible() && !options.force_full) {
    // The newest complete step below `step`: folders from the newest down,
    // each .metadata read once, up to the first complete one.
    MEGA_ASSIGN_OR_RETURN(auto folders, ListStepFolders());
    for (auto f = folders.rbegin(); f != folders.rend(); ++f) {
      const int64_t c = f->first;
      if (c >= step || f->second != StepFolderName(c, options_.step_digits)) continue;
      MEGA_ASSIGN_OR_RETURN(StepInfo prev, DescribeStep(c, f->second));
      if (!prev.complete) continue;
      if (prev.storage != "fs") break;
      // The chain of incremental saves since the last full one.
      auto record = fs_->ReadWhole(fs::JoinPath(prev.path, kStepRecordFileName), kMaxRecordBytes);
      int64_t prev_depth = 0;
      if (record.ok()) {
        json j = json::parse(*record, nullptr, false);
        if (j.is_object() && j.contains("depth") && j["depth"].is_number_integer()) {
          prev_depth = j["depth"].get<int64_t>();
        }
      }
      if (options_.incremental.full_every > 0 && prev_depth + 1 >= options_.incremental.full_every)
        break;
      base = c;
      depth = prev_depth + 1;
      break;
    }
  }
  MEGA_RETURN_IF_ERROR(fs_->CreateDirectories(path));
  json record = {{"format", kStepFormat},
                 {"version", 1},
                 {"step", step},
                 {"time", UnixNow()},
                 {"storage", storage_},
                 {"depth", depth},
                 {"base", base ? json(*base) : json(nullptr)}};
  if (options.metric) {
    record["metric"] = std::isfinite(*options.metric) ? json(*options.metric) : json(nullptr);
  }
  MEGA_RETURN_IF_ERROR(fs_->WriteAtomically(fs::JoinPath(path, kStepRecordFileName), record.dump(),
                                            options_.storage_options.sync));
  return base ? StepPath(*base) : std::string();
}

// Every rank: rank 0 prepares, every rank learns the base folder.
Result<std::string> CheckpointManager::StartStep(int64_t step, const StepSaveOptions& options) {
  Result<std::string> base = std::string();
  if (group_->rank() == 0) base = PrepareStep(step, options);
  MEGA_RETURN_IF_ERROR(Collective(base.status()));
  std::string dir = *base;
  if (group_->world_size() > 1) {
    MEGA_ASSIGN_OR_RETURN(dir, group_->Broadcast(dir, 0));
  }
  return dir;
}

Result<std::unique_ptr<StorageWriter>> CheckpointManager::MakeStepWriter(
    int64_t step, const std::string& base_dir) {
  if (!incremental_possible())
    return MakeStorageWriter(storage_, StepPath(step), options_.storage_options);
  // The fs writer as MakeStorageWriter makes it, hashing every item it writes
  // (full saves in incremental mode too: the next save compares against them).
  IncrementalWriterOptions io;
  io.base_dir = base_dir;
  io.block_size =
      options_.incremental.block_size > 0 ? options_.incremental.block_size : 1ull << 20;
  io.thread_count = options_.storage_options.thread_count;
  FileSystemWriterOptions fo = FileSystemWriterOptionsFrom(options_.storage_options);
  fo.hash_block_size = io.block_size;
  return NewIncrementalWriter(NewFileSystemWriter(StepPath(step), std::move(fo)), StepPath(step),
                              fs_, std::move(io), options_.incremental.stats);
}

Status CheckpointManager::WriteLatest(int64_t step) {
  json j = {{"format", kLatestFormat},
            {"version", 1},
            {"step", step},
            {"folder", StepFolderName(step, options_.step_digits)}};
  return fs_
      ->WriteAtomically(fs::JoinPath(root_, kLatestFileName), j.dump() + "\n",
                        options_.storage_options.sync)
      .WithContext("checkpoint root " + root_ + ": writing " + std::string(kLatestFileName));
}

// Every rank, after dcp::Save returned `saved` (the same on every rank).
Status CheckpointManager::FinishStep(int64_t step, Status saved) {
  Status local;
  if (group_->rank() == 0) {
    if (!saved.ok()) {
      // A failed save leaves no committed step; drop its folder unless an
      // earlier commit of the same step is still there.
      auto info = DescribeStep(step, StepFolderName(step, options_.step_digits));
      if (info.ok() && !info->complete) RemoveFolderTree(info->path).IgnoreError();
    } else {
      auto newest = Latest();  // reads .metadata files down to the newest complete step only
      if (!newest.ok()) {
        local = newest.status();
      } else if (*newest == step) {
        local = WriteLatest(step);
      }
      if (local.ok() && !options_.retention.keeps_everything()) {
        local = CollectGarbage(options_.retention, step).status();
      }
      if (!local.ok()) {
        local = local.WithContext("step " + std::to_string(step) + " is committed, but");
      }
    }
  }
  if (!saved.ok()) return saved;
  return Collective(local);
}

Status CheckpointManager::Save(int64_t step, const StateDict& state_dict,
                               const StepSaveOptions& options) {
  MEGA_RETURN_IF_ERROR(CheckCanStart(step, options));
  MEGA_ASSIGN_OR_RETURN(std::string base_dir, StartStep(step, options));
  auto writer = MakeStepWriter(step, base_dir);
  SaveOptions so;
  so.planner = options.planner;
  Status saved = writer.ok() ? dcp::Save(state_dict, **writer, group_, so) : writer.status();
  return FinishStep(step, saved);
}

Result<StepSaveHandle> CheckpointManager::AsyncSave(int64_t step, StateDict state_dict,
                                                    const StepSaveOptions& options) {
  MEGA_RETURN_IF_ERROR(CheckCanStart(step, options));
  MEGA_ASSIGN_OR_RETURN(std::string base_dir, StartStep(step, options));
  auto made = MakeStepWriter(step, base_dir);
  if (!made.ok()) {
    Status s = FinishStep(step, made.status());
    return s;
  }
  std::shared_ptr<StorageWriter> writer = std::move(*made);
  AsyncSaveOptions ao;
  ao.pool = options_.pool;
  ao.save.planner = options.planner;
  AsyncSaveHandle inner = dcp::AsyncSave(std::move(state_dict), writer, group_, ao);
  StepSaveHandle handle;
  handle.step = step;
  handle.staged = inner.staged;
  // The records and retention run after the commit, on the same background
  // side, so the next save (which waits for `done`) never overlaps them.
  handle.done = std::async(std::launch::async, [this, step, inner]() {
                  Status saved = inner.done.get();
                  return FinishStep(step, saved);
                }).share();
  pending_ = std::make_shared<PendingSave>();
  pending_->step = step;
  pending_->done = handle.done;
  return handle;
}

// ---- loading ------------------------------------------------------------------

Result<ValidStep> CheckpointManager::Load(StateDict& state_dict, std::optional<int64_t> step,
                                          const StepLoadOptions& options) {
  // The group cannot run two flows at once; a pending save finishes first.
  WaitForPendingSave().IgnoreError();
  // Rank 0 picks the candidates (newest first) so every rank tries the same.
  Status listed;
  std::string payload;
  if (group_->rank() == 0) {
    std::vector<int64_t> candidates;
    if (step) {
      auto info = DescribeStep(*step, StepFolderName(*step, options_.step_digits));
      if (!info.ok()) {
        listed = info.status();
      } else if (!info->complete) {
        listed =
            NotFoundError("step " + std::to_string(*step) + " in " + root_ + ": " + info->problem);
      } else {
        candidates.push_back(*step);
      }
    } else {
      auto complete = CompleteStepsDescending();
      if (!complete.ok()) {
        listed = complete.status();
      } else if (complete->empty()) {
        listed = NotFoundError("no complete step in " + root_);
      } else {
        candidates = *complete;
      }
    }
    json j = json::array();
    for (int64_t c : candidates) {
      auto info = DescribeStep(c, StepFolderName(c, options_.step_digits));
      j.push_back({c, info.ok() ? info->storage : storage_});
    }
    payload = j.dump();
  }
  MEGA_RETURN_IF_ERROR(Collective(listed));
  if (group_->world_size() > 1) {
    MEGA_ASSIGN_OR_RETURN(payload, group_->Broadcast(payload, 0));
  }
  json candidates = json::parse(payload, nullptr, false);
  if (!candidates.is_array()) return InternalError("checkpoint manager: bad candidate list");
  ValidStep out;
  for (const json& c : candidates) {
    const int64_t s = c[0].get<int64_t>();
    const std::string storage = c[1].get<std::string>();
    auto reader = MakeStorageReader(storage, StepPath(s), options_.storage_options);
    LoadOptions lo;
    lo.planner = options.planner;
    Status loaded = reader.ok() ? dcp::Load(state_dict, **reader, group_, lo) : reader.status();
    if (loaded.ok()) {
      out.step = s;
      out.path = StepPath(s);
      return out;
    }
    if (step || !IsDamage(loaded)) return loaded.WithContext("loading step " + std::to_string(s));
    out.skipped.push_back({s, loaded});
  }
  return NotFoundError("no step of " + root_ + " loads:" + JoinSkipped(out.skipped));
}

// ---- removal ------------------------------------------------------------------

Status CheckpointManager::RemoveFolderTree(const std::string& path) const {
  auto listing = fs_->List(path);
  if (!listing.ok()) {
    return listing.status().code() == StatusCode::kNotFound ? Status::OK() : listing.status();
  }
  auto is_record = [](const fs::FileInfo& fi) {
    return !fi.is_directory && BaseName(fi.path).rfind(kMetadataFileName, 0) == 0;
  };
  // The commit record goes first: from then on the step is incomplete, so a
  // crash half-way through leaves a folder Open removes, never a half step.
  for (const fs::FileInfo& fi : *listing) {
    if (is_record(fi)) {
      Status s = fs_->Remove(fi.path);
      if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
    }
  }
  fs_->SyncDirectory(path).IgnoreError();
  // The data files are garbage now: their space may be freed in the background
  // (FileSystem::RemoveGarbage). One that could not be removed shows as the
  // folder not being empty below.
  std::vector<std::string> files;
  for (const fs::FileInfo& fi : *listing) {
    if (fi.is_directory) {
      Status s = RemoveFolderTree(fi.path);
      if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
    } else if (!is_record(fi)) {  // the records are gone already
      files.push_back(fi.path);
    }
  }
  fs_->RemoveGarbage(files);
  Status s = fs_->RemoveDirectory(path);
  if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
  return Status::OK();
}

Status CheckpointManager::RemoveStep(int64_t step) {
  const std::string path = StepPath(step);
  MEGA_RETURN_IF_ERROR(RemoveFolderTree(path).WithContext("removing step " + std::to_string(step)));
  fs_->SyncDirectory(root_).IgnoreError();
  // `latest` must keep naming a complete step.
  return RepairLatestRecord();
}

Result<std::vector<int64_t>> CheckpointManager::GarbageCollect(
    std::optional<RetentionPolicy> policy) {
  std::optional<int64_t> in_flight;
  if (save_in_flight()) in_flight = pending_->step;
  return CollectGarbage(policy ? *policy : options_.retention, in_flight);
}

Result<std::vector<int64_t>> CheckpointManager::CollectGarbage(const RetentionPolicy& p,
                                                               std::optional<int64_t> in_flight) {
  MEGA_ASSIGN_OR_RETURN(auto steps, Steps());
  std::vector<int64_t> complete;
  std::vector<std::optional<double>> metrics;
  std::vector<int64_t> removed;
  for (const StepInfo& info : steps) {
    if (info.folder != StepFolderName(info.step, options_.step_digits)) continue;
    if (!info.complete) {
      if (in_flight == info.step) continue;  // being written right now
      MEGA_RETURN_IF_ERROR(RemoveFolderTree(info.path));
      removed.push_back(info.step);
      continue;
    }
    complete.push_back(info.step);
    metrics.push_back(info.metric);
  }
  std::vector<int64_t> keep = StepsToKeep(complete, metrics, p);
  std::set<int64_t> kept(keep.begin(), keep.end());
  for (int64_t s : complete) {
    if (kept.count(s)) continue;
    MEGA_RETURN_IF_ERROR(RemoveStep(s));
    removed.push_back(s);
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

}  // namespace megackpt::dcp
