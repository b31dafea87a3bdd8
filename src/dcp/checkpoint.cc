// The save and load flows (spec/dcp.md §2). Every rank runs the same steps; the
// coordinator (rank 0) plans globally and commits. Errors travel inside the
// collectives' messages (an "envelope" holding a status or a payload), so a rank
// that fails still takes part in every collective until the error has reached
// all ranks: no rank is left waiting, and every rank returns the same status.
#include "megackpt/dcp/checkpoint.h"

#include <chrono>
#include <exception>
#include <set>

#include "dcp/codec.h"
#include "dcp/guard.h"

namespace megackpt::dcp {
namespace {

using internal::DecodeEnvelope;
using internal::EncodeEnvelope;

constexpr int kCoordinator = 0;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void GuardedAbort(StorageWriter& writer) {
  try {
    writer.Abort();
  } catch (...) {
  }
}

// Rank bookkeeping plus collectives that degrade to local copies for a single
// process (group == nullptr) or use_collectives == false.
class Comm {
 public:
  Comm(dist::ProcessGroup* group, bool use_collectives)
      : group_(use_collectives ? group : nullptr),
        rank_(group ? group->rank() : 0),
        world_(group ? group->world_size() : 1),
        collectives_(use_collectives) {}

  int rank() const { return rank_; }
  int world() const { return world_; }
  bool collective() const { return group_ != nullptr && world_ > 1; }
  bool is_coordinator() const { return !collective() || rank_ == kCoordinator; }
  bool use_collectives() const { return collectives_; }

  Result<std::vector<std::string>> Gather(std::string blob) {
    if (!collective()) return std::vector<std::string>{std::move(blob)};
    return group_->Gather(std::move(blob), kCoordinator);
  }
  Result<std::string> Scatter(std::vector<std::string> blobs) {
    if (!collective()) return blobs.empty() ? std::string() : std::move(blobs[0]);
    return group_->Scatter(std::move(blobs), kCoordinator);
  }
  Result<std::string> Broadcast(std::string blob) {
    if (!collective()) return blob;
    return group_->Broadcast(std::move(blob), kCoordinator);
  }
  // Every rank passes its (already attributed) status; all get the lowest
  // failing rank's.
  Status Agree(const Status& local) {
    if (!collective()) return local;
    auto all = group_->AllGather(EncodeEnvelope(local, ""));
    if (!all.ok()) return all.status();
    auto payloads = Unpack(*all);
    return payloads.status();
  }

  // Prefixes an error that happened on `rank` when there are several ranks.
  // Every error is attributed exactly once, where it happens.
  Status Attribute(const Status& s, int rank) const {
    if (s.ok() || world_ <= 1) return s;
    return Status(s.code(), "rank " + std::to_string(rank) + ": " + s.message());
  }

  // The lowest failing rank's error among envelopes (as its sender attributed
  // it), or the payloads.
  Result<std::vector<std::string>> Unpack(const std::vector<std::string>& blobs) const {
    std::vector<std::string> payloads;
    payloads.reserve(blobs.size());
    for (size_t r = 0; r < blobs.size(); ++r) {
      if (blobs[r].empty() || (blobs[r][0] != 'P' && blobs[r][0] != 'E')) {
        return Attribute(DataLossError("malformed collective message"), static_cast<int>(r));
      }
      auto p = DecodeEnvelope(blobs[r]);
      if (!p.ok()) return p.status();
      payloads.push_back(std::move(*p));
    }
    return payloads;
  }

  // Unpack, then each rank's payload decoded by `decode` (a Result<T>); a
  // decode error is attributed to the rank that sent the payload.
  template <typename T, typename Decode>
  Result<std::vector<T>> UnpackEach(const std::vector<std::string>& blobs, Decode decode) const {
    MEGA_ASSIGN_OR_RETURN(std::vector<std::string> payloads, Unpack(blobs));
    std::vector<T> out;
    out.reserve(payloads.size());
    for (size_t r = 0; r < payloads.size(); ++r) {
      Result<T> v = decode(payloads[r]);
      if (!v.ok()) return Attribute(v.status(), static_cast<int>(r));
      out.push_back(std::move(*v));
    }
    return out;
  }

 private:
  dist::ProcessGroup* group_;
  int rank_;
  int world_;
  bool collectives_;
};

// Fills metadata.storage_data from every rank's results and checks that every
// stored chunk / bytes entry got exactly one.
Status MergeResults(Metadata* md, const std::vector<std::vector<WriteResult>>& all) {
  for (size_t r = 0; r < all.size(); ++r) {
    for (const WriteResult& wr : all[r]) {
      MetadataIndex key = wr.index;
      key.index.reset();
      if (!md->storage_data.emplace(key, wr.storage_data).second) {
        return InternalError("two write results for " + ToString(key) + " (second from rank " +
                             std::to_string(r) + ")");
      }
    }
  }
  for (const auto& [fqn, value] : md->state_dict_metadata) {
    if (const auto* t = std::get_if<TensorStorageMetadata>(&value)) {
      for (const auto& c : t->chunks) {
        if (!md->storage_data.count(MetadataIndex(fqn, c.offsets))) {
          return InternalError("storage wrote no result for " +
                               ToString(MetadataIndex(fqn, c.offsets)));
        }
      }
    } else if (!md->storage_data.count(MetadataIndex(fqn))) {
      return InternalError("storage wrote no result for " + ToString(MetadataIndex(fqn)));
    }
  }
  return ValidateMetadata(*md);
}

// The caller's stats (options.stats) or `local`, reset.
template <typename Stats>
Stats& ResetStats(Stats* given, Stats& local) {
  Stats& stats = given ? *given : local;
  stats = Stats();
  return stats;
}

// The caller's planner, or a default one made by `make` and owned by *owned.
template <typename Planner, typename Make>
Planner* PlannerOrDefault(Planner* given, std::unique_ptr<Planner>* owned, Make make) {
  if (given) return given;
  *owned = make();
  return owned->get();
}

}  // namespace

Status Save(const StateDict& state_dict, StorageWriter& writer, dist::ProcessGroup* group,
            const SaveOptions& options) {
  Comm comm(group, options.use_collectives);
  SaveStats local_stats;
  SaveStats& stats = ResetStats(options.stats, local_stats);
  std::unique_ptr<SavePlanner> default_planner;
  SavePlanner* planner =
      PlannerOrDefault(options.planner, &default_planner, [] { return NewDefaultSavePlanner(); });
  double t0 = Now();

  // 1. Local planning.
  SavePlan local_plan;
  Status local = [&]() -> Status {
    // Always: a writer starts every save fresh (new save id), as the reference does.
    MEGA_RETURN_IF_ERROR(
        Guard("StorageWriter::Reset", [&] { return writer.Reset(options.checkpoint_id); }));
    std::optional<StorageMeta> meta;
    try {
      meta = writer.GetStorageMeta();
    } catch (...) {
    }
    MEGA_RETURN_IF_ERROR(Guard("SavePlanner::SetUp", [&] {
      return planner->SetUp(state_dict, meta, comm.is_coordinator());
    }));
    StorageSetUp setup{comm.is_coordinator(), comm.rank(), comm.world(), comm.use_collectives()};
    MEGA_RETURN_IF_ERROR(Guard("StorageWriter::SetUpStorageWriter",
                               [&] { return writer.SetUpStorageWriter(setup); }));
    MEGA_ASSIGN_OR_RETURN(SavePlan plan, Guard("SavePlanner::CreateLocalPlan",
                                               [&] { return planner->CreateLocalPlan(); }));
    MEGA_ASSIGN_OR_RETURN(local_plan, Guard("StorageWriter::PrepareLocalPlan", [&] {
                            return writer.PrepareLocalPlan(std::move(plan));
                          }));
    return Status::OK();
  }();
  local = comm.Attribute(local, comm.rank());

  // 2. Gather plans; the coordinator builds the global plan and Metadata.
  auto gathered =
      comm.Gather(EncodeEnvelope(local, local.ok() ? internal::EncodeSavePlan(local_plan) : ""));
  if (!gathered.ok()) return gathered.status();
  Metadata metadata;
  std::vector<std::string> scatter_blobs;
  if (comm.is_coordinator()) {
    Status global = [&]() -> Status {
      MEGA_ASSIGN_OR_RETURN(std::vector<SavePlan> plans,
                            comm.UnpackEach<SavePlan>(*gathered, internal::DecodeSavePlan));
      auto gp = Guard("SavePlanner::CreateGlobalPlan",
                      [&] { return planner->CreateGlobalPlan(std::move(plans)); });
      if (!gp.ok()) return comm.Attribute(gp.status(), comm.rank());
      auto final_plans_or = Guard("StorageWriter::PrepareGlobalPlan",
                                  [&] { return writer.PrepareGlobalPlan(std::move(gp->plans)); });
      if (!final_plans_or.ok()) return comm.Attribute(final_plans_or.status(), comm.rank());
      std::vector<SavePlan> final_plans = std::move(*final_plans_or);
      if (final_plans.size() != gathered->size()) {
        return InternalError("global save plan has " + std::to_string(final_plans.size()) +
                             " plans for " + std::to_string(gathered->size()) + " ranks");
      }
      metadata = std::move(gp->metadata);
      for (const SavePlan& p : final_plans) {
        scatter_blobs.push_back(EncodeEnvelope(Status::OK(), internal::EncodeSavePlan(p)));
      }
      return Status::OK();
    }();
    if (!global.ok()) scatter_blobs.assign(gathered->size(), EncodeEnvelope(global, ""));
  }

  // 3. Scatter; every rank finishes its plan and writes.
  auto mine = comm.Scatter(std::move(scatter_blobs));
  if (!mine.ok()) return mine.status();
  auto central = DecodeEnvelope(*mine);
  if (!central.ok()) {
    GuardedAbort(writer);
    return central.status();
  }
  stats.plan_seconds = Now() - t0;
  double t1 = Now();
  std::vector<WriteResult> results;
  local = [&]() -> Status {
    MEGA_ASSIGN_OR_RETURN(SavePlan plan, internal::DecodeSavePlan(*central));
    MEGA_ASSIGN_OR_RETURN(SavePlan final_plan, Guard("SavePlanner::FinishPlan", [&] {
                            return planner->FinishPlan(std::move(plan));
                          }));
    MEGA_ASSIGN_OR_RETURN(results, Guard("StorageWriter::WriteData",
                                         [&] { return writer.WriteData(final_plan, *planner); }));
    std::set<MetadataIndex> planned, written;
    for (const auto& it : final_plan.items) planned.insert(it.index);
    for (const auto& r : results) written.insert(r.index);
    if (planned != written) {
      return InternalError("storage returned " + std::to_string(results.size()) +
                           " write results for a plan of " +
                           std::to_string(final_plan.items.size()) + " items");
    }
    for (const auto& r : results) stats.bytes_written += r.size_in_bytes;
    return Status::OK();
  }();
  local = comm.Attribute(local, comm.rank());
  stats.write_seconds = Now() - t1;
  double t2 = Now();

  // 4. Gather results; the coordinator commits; everyone learns the outcome.
  gathered =
      comm.Gather(EncodeEnvelope(local, local.ok() ? internal::EncodeWriteResults(results) : ""));
  if (!gathered.ok()) {
    GuardedAbort(writer);
    return gathered.status();
  }
  Status outcome;
  if (comm.is_coordinator()) {
    outcome = [&]() -> Status {
      MEGA_ASSIGN_OR_RETURN(
          std::vector<std::vector<WriteResult>> all,
          comm.UnpackEach<std::vector<WriteResult>>(*gathered, internal::DecodeWriteResults));
      Status merged = MergeResults(&metadata, all);
      if (!merged.ok()) return comm.Attribute(merged, comm.rank());
      return comm.Attribute(
          Guard("StorageWriter::Finish", [&] { return writer.Finish(metadata, all); }),
          comm.rank());
    }();
  }
  auto final_blob = comm.Broadcast(EncodeEnvelope(outcome, ""));
  Status result = final_blob.ok() ? DecodeEnvelope(*final_blob).status() : final_blob.status();
  if (!result.ok()) GuardedAbort(writer);
  stats.commit_seconds = Now() - t2;
  return result;
}

Status Load(StateDict& state_dict, StorageReader& reader, dist::ProcessGroup* group,
            const LoadOptions& options) {
  Comm comm(group, options.use_collectives);
  LoadStats local_stats;
  LoadStats& stats = ResetStats(options.stats, local_stats);
  std::unique_ptr<LoadPlanner> default_planner;
  LoadPlanner* planner =
      PlannerOrDefault(options.planner, &default_planner, [] { return NewDefaultLoadPlanner(); });
  double t0 = Now();
  Metadata metadata;
  LoadPlan local_plan;
  Status local = [&]() -> Status {
    MEGA_RETURN_IF_ERROR(
        Guard("StorageReader::Reset", [&] { return reader.Reset(options.checkpoint_id); }));
    MEGA_ASSIGN_OR_RETURN(
        metadata, Guard("StorageReader::ReadMetadata", [&] { return reader.ReadMetadata(); }));
    stats.metadata_seconds = Now() - t0;
    MEGA_RETURN_IF_ERROR(Guard("LoadPlanner::SetUp", [&] {
      return planner->SetUp(&state_dict, metadata, comm.is_coordinator());
    }));
    StorageSetUp setup{comm.is_coordinator(), comm.rank(), comm.world(), comm.use_collectives()};
    MEGA_RETURN_IF_ERROR(Guard("StorageReader::SetUpStorageReader",
                               [&] { return reader.SetUpStorageReader(metadata, setup); }));
    MEGA_ASSIGN_OR_RETURN(LoadPlan plan, Guard("LoadPlanner::CreateLocalPlan",
                                               [&] { return planner->CreateLocalPlan(); }));
    MEGA_ASSIGN_OR_RETURN(local_plan, Guard("StorageReader::PrepareLocalPlan", [&] {
                            return reader.PrepareLocalPlan(std::move(plan));
                          }));
    return Status::OK();
  }();
  local = comm.Attribute(local, comm.rank());

  auto gathered =
      comm.Gather(EncodeEnvelope(local, local.ok() ? internal::EncodeLoadPlan(local_plan) : ""));
  if (!gathered.ok()) return gathered.status();
  std::vector<std::string> scatter_blobs;
  if (comm.is_coordinator()) {
    Status global = [&]() -> Status {
      MEGA_ASSIGN_OR_RETURN(std::vector<LoadPlan> plans,
                            comm.UnpackEach<LoadPlan>(*gathered, internal::DecodeLoadPlan));
      auto global_plans = Guard("LoadPlanner::CreateGlobalPlan",
                                [&] { return planner->CreateGlobalPlan(std::move(plans)); });
      if (!global_plans.ok()) return comm.Attribute(global_plans.status(), comm.rank());
      auto prepared = Guard("StorageReader::PrepareGlobalPlan",
                            [&] { return reader.PrepareGlobalPlan(std::move(*global_plans)); });
      if (!prepared.ok()) return comm.Attribute(prepared.status(), comm.rank());
      plans = std::move(*prepared);
      if (plans.size() != gathered->size()) {
        return InternalError("global load plan has " + std::to_string(plans.size()) +
                             " plans for " + std::to_string(gathered->size()) + " ranks");
      }
      for (const LoadPlan& p : plans) {
        scatter_blobs.push_back(EncodeEnvelope(Status::OK(), internal::EncodeLoadPlan(p)));
      }
      return Status::OK();
    }();
    if (!global.ok()) scatter_blobs.assign(gathered->size(), EncodeEnvelope(global, ""));
  }
  auto mine = comm.Scatter(std::move(scatter_blobs));
  if (!mine.ok()) return mine.status();
  auto central = DecodeEnvelope(*mine);
  if (!central.ok()) return central.status();
  stats.plan_seconds = Now() - t0 - stats.metadata_seconds;
  double t1 = Now();
  local = [&]() -> Status {
    MEGA_ASSIGN_OR_RETURN(LoadPlan plan, internal::DecodeLoadPlan(*central));
    MEGA_ASSIGN_OR_RETURN(LoadPlan final_plan, Guard("LoadPlanner::FinishPlan", [&] {
                            return planner->FinishPlan(std::move(plan));
                          }));
    return Guard("StorageReader::ReadData", [&] { return reader.ReadData(final_plan, *planner); });
  }();
  Status result = comm.Agree(comm.Attribute(local, comm.rank()));
  stats.read_seconds = Now() - t1;
  return result;
}

}  // namespace megackpt::dcp
