// The backend-independent part of ProcessGroup and the single-process backend.
#include "megackpt/dist/process_group.h"

#include <cstdlib>

#include "dist/wire.h"

namespace megackpt::dist {

Status ProcessGroup::AllReduceStatus(const Status& local) {
  Result<std::vector<std::string>> all = AllGather(dist::EncodeStatus(local));
  if (!all.ok()) {
    // The exchange itself failed (peer died, timeout, broken group): ranks can no
    // longer agree. A rank with its own error reports that (it is the more useful
    // message); the others report why the exchange failed.
    if (!local.ok()) return local.WithContext("rank " + std::to_string(rank()));
    return all.status();
  }
  std::vector<Status> statuses;
  statuses.reserve(all->size());
  for (size_t r = 0; r < all->size(); ++r) {
    Status s;
    Status decoded = dist::DecodeStatus((*all)[r], &s);
    if (!decoded.ok())
      return decoded.WithContext("AllReduceStatus: from rank " + std::to_string(r));
    statuses.push_back(std::move(s));
  }
  return dist::CombineRankStatuses(statuses);
}

namespace {

class SingleProcessGroup final : public ProcessGroup {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  std::string_view backend() const override { return "single"; }

  Status Barrier() override { return broken_; }

  Result<std::vector<std::string>> Gather(std::string blob, int root) override {
    MEGA_RETURN_IF_ERROR(CheckRoot("Gather", root));
    std::vector<std::string> out;
    out.push_back(std::move(blob));
    return out;
  }

  Result<std::string> Scatter(std::vector<std::string> blobs, int root) override {
    MEGA_RETURN_IF_ERROR(CheckRoot("Scatter", root));
    if (blobs.size() != 1) {
      return Break(InvalidArgumentError("Scatter: root passed " + std::to_string(blobs.size()) +
                                        " blobs, expected world_size 1"));
    }
    return std::move(blobs[0]);
  }

  Result<std::string> Broadcast(std::string blob, int root) override {
    MEGA_RETURN_IF_ERROR(CheckRoot("Broadcast", root));
    return blob;
  }

  Result<std::vector<std::string>> AllGather(std::string blob) override {
    MEGA_RETURN_IF_ERROR(broken_);
    std::vector<std::string> out;
    out.push_back(std::move(blob));
    return out;
  }

 private:
  Status CheckRoot(const char* what, int root) {
    MEGA_RETURN_IF_ERROR(broken_);
    if (root != 0) {
      return Break(InvalidArgumentError(std::string(what) + ": root " + std::to_string(root) +
                                        " out of range [0, 1)"));
    }
    return Status::OK();
  }
  // Same contract as the other backends: after a failed collective the group is broken.
  Status Break(Status s) {
    broken_ = AbortedError("process group is broken by an earlier failure: " + s.ToString());
    return s;
  }

  Status broken_;
};

}  // namespace

std::unique_ptr<ProcessGroup> NewSingleProcessGroup() {
  return std::make_unique<SingleProcessGroup>();
}

bool LaunchedByMpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0') return true;
  }
  return false;
}

}  // namespace megackpt::dist
