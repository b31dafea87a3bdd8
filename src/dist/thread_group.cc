// The threads backend: N ranks in one process meeting at a shared rendezvous.
//
// Every collective is one "generation" of the rendezvous: ranks arrive (depositing
// their input and checking that they all called the same collective with the same
// root), the last arrival marks it complete, each rank takes its output, and the last
// to depart resets the state and advances the generation. A rank may only arrive at
// generation g after everyone departed g-1. All waits use the collective's deadline.
//
// Failure: the first failure (a rank's fn returned an error or threw, a timeout, a
// mismatch, a rank that returned while others wait for it) is recorded as the
// rendezvous' cause; every pending and later collective then fails at once.
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/wire.h"
#include "megackpt/dist/process_group.h"

namespace megackpt::dist {
namespace {

using Clock = std::chrono::steady_clock;
using dist::CollectiveKind;
using dist::CollectiveKindName;

std::string CollectiveLabel(CollectiveKind kind, uint64_t seq) {
  return CollectiveKindName(kind) + " #" + std::to_string(seq);
}

// State shared by the ranks of one RunThreadRanks call. Guarded by mu.
struct Rendezvous {
  explicit Rendezvous(int n)
      : world_size(n), arrived_mask(n, false), finished(n, false), inputs(n) {}

  std::mutex mu;
  std::condition_variable cv;
  const int world_size;

  // The collective being assembled is number `generation` of every rank.
  uint64_t generation = 0;
  int arrived = 0;
  int departed = 0;
  bool complete = false;
  CollectiveKind kind = CollectiveKind::kBarrier;
  int root = 0;
  int first_rank = 0;  // the rank whose arrival fixed kind/root
  std::vector<bool> arrived_mask;
  std::vector<bool> finished;  // the rank's fn has returned OK
  std::vector<std::string> inputs;
  std::vector<std::string> scatter_blobs;

  // First failure; once set, the group is broken for everyone.
  Status cause;
  int cause_rank = -1;
  uint64_t cause_seq = 0;
  bool cause_is_timeout = false;
};

class ThreadProcessGroup final : public ProcessGroup {
 public:
  ThreadProcessGroup(int rank, Rendezvous* rv, ProcessGroupOptions options)
      : rank_(rank), rv_(rv), options_(options) {}

  int rank() const override { return rank_; }
  int world_size() const override { return rv_->world_size; }
  std::string_view backend() const override { return "threads"; }

  Status Barrier() override {
    return Collective(CollectiveKind::kBarrier, 0, nullptr, nullptr, nullptr);
  }

  Result<std::vector<std::string>> Gather(std::string blob, int root) override {
    std::vector<std::string> out;
    MEGA_RETURN_IF_ERROR(Collective(CollectiveKind::kGather, root, &blob, nullptr, &out));
    return out;
  }

  Result<std::string> Scatter(std::vector<std::string> blobs, int root) override {
    std::string out;
    MEGA_RETURN_IF_ERROR(Collective(CollectiveKind::kScatter, root, &out, &blobs, nullptr));
    return out;
  }

  Result<std::string> Broadcast(std::string blob, int root) override {
    MEGA_RETURN_IF_ERROR(Collective(CollectiveKind::kBroadcast, root, &blob, nullptr, nullptr));
    return blob;
  }

  Result<std::vector<std::string>> AllGather(std::string blob) override {
    std::vector<std::string> out;
    MEGA_RETURN_IF_ERROR(Collective(CollectiveKind::kAllGather, 0, &blob, nullptr, &out));
    return out;
  }

  // Called by RunThreadRanks when this rank's fn returned `status`.
  void Finish(const Status& status) {
    std::lock_guard<std::mutex> lock(rv_->mu);
    if (status.ok()) {
      rv_->finished[rank_] = true;
      rv_->cv.notify_all();
    } else {
      FailLocked(status, seq_, /*timeout=*/false, rank_).IgnoreError();
    }
  }

 private:
  // One collective. `blob`: input (Gather/Broadcast/AllGather) and output
  // (Scatter/Broadcast). `blobs`: the root's Scatter input. `out`: Gather/AllGather output.
  Status Collective(CollectiveKind kind, int root, std::string* blob,
                    std::vector<std::string>* blobs, std::vector<std::string>* out) {
    const auto start = Clock::now();
    const auto deadline = start + options_.timeout;
    const uint64_t seq = seq_++;
    const std::string label = CollectiveLabel(kind, seq);
    Rendezvous& rv = *rv_;
    std::unique_lock<std::mutex> lock(rv.mu);
    if (!rv.cause.ok()) return BrokenError(seq, /*waiting=*/false);
    if (root < 0 || root >= rv.world_size) {
      return FailLocked(
          InvalidArgumentError(label + ": root " + std::to_string(root) + " out of range [0, " +
                               std::to_string(rv.world_size) + ")"),
          seq, false, rank_);
    }
    if (kind == CollectiveKind::kScatter && rank_ == root &&
        blobs->size() != static_cast<size_t>(rv.world_size)) {
      return FailLocked(
          InvalidArgumentError(label + ": root passed " + std::to_string(blobs->size()) +
                               " blobs, expected world_size " + std::to_string(rv.world_size)),
          seq, false, rank_);
    }

    // Wait until every rank left the previous collective.
    if (!rv.cv.wait_until(lock, deadline, [&] { return rv.generation == seq || !rv.cause.ok(); })) {
      return FailLocked(DeadlineExceededError(label + ": timed out after " +
                                              std::to_string(options_.timeout.count()) +
                                              " ms waiting for ranks to leave the previous "
                                              "collective"),
                        seq, true, -1);
    }
    if (!rv.cause.ok()) return BrokenError(seq, /*waiting=*/true);

    // Arrive.
    if (rv.arrived == 0) {
      rv.kind = kind;
      rv.root = root;
      rv.first_rank = rank_;
    } else if (rv.kind != kind || rv.root != root) {
      return FailLocked(
          FailedPreconditionError(
              "collective mismatch at #" + std::to_string(seq) + ": rank " + std::to_string(rank_) +
              " called " + CollectiveKindName(kind) + "(root " + std::to_string(root) +
              ") but rank " + std::to_string(rv.first_rank) + " called " +
              CollectiveKindName(rv.kind) + "(root " + std::to_string(rv.root) + ")"),
          seq, false, -1);
    }
    switch (kind) {
      case CollectiveKind::kGather:
      case CollectiveKind::kAllGather:
        rv.inputs[rank_] = std::move(*blob);
        break;
      case CollectiveKind::kBroadcast:
        if (rank_ == root) rv.inputs[rank_] = std::move(*blob);
        break;
      case CollectiveKind::kScatter:
        if (rank_ == root) rv.scatter_blobs = std::move(*blobs);
        break;
      default:
        break;
    }
    rv.arrived_mask[rank_] = true;
    if (++rv.arrived == rv.world_size) {
      rv.complete = true;
      rv.cv.notify_all();
    } else {
      int gone = -1;  // a rank that returned from fn without arriving: it never will
      auto ready = [&] {
        if (rv.complete || !rv.cause.ok()) return true;
        for (int r = 0; r < rv.world_size; ++r) {
          if (rv.finished[r] && !rv.arrived_mask[r]) {
            gone = r;
            return true;
          }
        }
        return false;
      };
      const bool woke = rv.cv.wait_until(lock, deadline, ready);
      if (!rv.complete) {
        if (!rv.cause.ok()) return BrokenError(seq, /*waiting=*/true);
        if (woke && gone >= 0) {
          return FailLocked(AbortedError(label + ": rank " + std::to_string(gone) +
                                         " returned from its function without calling it"),
                            seq, false, /*cause_rank=*/-1);
        }
        std::string missing;
        for (int r = 0; r < rv.world_size; ++r) {
          if (rv.arrived_mask[r]) continue;
          if (!missing.empty()) missing += ',';
          missing += std::to_string(r);
        }
        return FailLocked(DeadlineExceededError(label + ": timed out after " +
                                                std::to_string(options_.timeout.count()) +
                                                " ms waiting for rank(s) " + missing),
                          seq, true, -1);
      }
    }

    // Complete: inputs stay untouched until everyone departed, and each rank only
    // moves out of its own slots, so outputs are taken without holding the lock.
    lock.unlock();
    switch (kind) {
      case CollectiveKind::kGather:
        if (rank_ == root) *out = std::move(rv.inputs);  // only the root reads them
        break;
      case CollectiveKind::kAllGather:
        *out = rv.inputs;
        break;
      case CollectiveKind::kBroadcast:
        *blob = rv.inputs[root];
        break;
      case CollectiveKind::kScatter:
        *blob = std::move(rv.scatter_blobs[rank_]);
        break;
      default:
        break;
    }
    lock.lock();
    if (++rv.departed == rv.world_size) {
      rv.arrived = 0;
      rv.departed = 0;
      rv.complete = false;
      rv.arrived_mask.assign(rv.world_size, false);
      rv.inputs.assign(rv.world_size, std::string());
      rv.scatter_blobs.clear();
      ++rv.generation;
      rv.cv.notify_all();
    }
    return Status::OK();
  }

  // Records `status` as the group's failure (unless one is recorded already) and
  // wakes every waiting rank. Returns `status` for this rank. REQUIRES: rv_->mu held.
  // `cause_rank`: the rank that failed; -1 for a condition of the group (a timeout,
  // a rank that left), reported as such.
  Status FailLocked(Status status, uint64_t seq, bool timeout, int cause_rank) {
    Rendezvous& rv = *rv_;
    if (rv.cause.ok()) {
      rv.cause = status;
      rv.cause_rank = cause_rank;
      rv.cause_seq = seq;
      rv.cause_is_timeout = timeout;
      rv.cv.notify_all();
    }
    return status;
  }

  // What collective #seq returns on this rank once the group is broken; `waiting`:
  // this rank was already waiting inside the collective.
  // REQUIRES: rv_->mu held, rv_->cause not OK.
  Status BrokenError(uint64_t seq, bool waiting) const {
    const Rendezvous& rv = *rv_;
    // Ranks waiting in the collective that timed out waited for the same missing
    // rank(s): they report the timeout itself.
    if (waiting && rv.cause_is_timeout && rv.cause_seq == seq) {
      return Status(StatusCode::kDeadlineExceeded, rv.cause.message());
    }
    if (rv.cause_rank < 0) return AbortedError("process group broken: " + rv.cause.ToString());
    return AbortedError("rank " + std::to_string(rv.cause_rank) +
                        " failed: " + rv.cause.ToString());
  }

  const int rank_;
  Rendezvous* const rv_;
  const ProcessGroupOptions options_;
  uint64_t seq_ = 0;  // number of collectives this rank has called
};

}  // namespace

std::vector<Status> RunThreadRanks(int world_size, const std::function<Status(ProcessGroup&)>& fn,
                                   ProcessGroupOptions options) {
  if (world_size < 1) {
    return {
        InvalidArgumentError("RunThreadRanks: world_size " + std::to_string(world_size) + " < 1")};
  }
  if (options.timeout.count() <= 0) {
    return std::vector<Status>(
        world_size, InvalidArgumentError("RunThreadRanks: timeout must be positive, got " +
                                         std::to_string(options.timeout.count()) + " ms"));
  }
  Rendezvous rv(world_size);
  std::vector<std::unique_ptr<ThreadProcessGroup>> groups;
  groups.reserve(world_size);
  for (int r = 0; r < world_size; ++r) {
    groups.push_back(std::make_unique<ThreadProcessGroup>(r, &rv, options));
  }
  std::vector<Status> results(world_size);
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      Status s;
      try {
        s = fn(*groups[r]);
      } catch (const std::exception& e) {
        s = InternalError("rank " + std::to_string(r) + " threw an exception: " + e.what());
      } catch (...) {
        s = InternalError("rank " + std::to_string(r) + " threw a non-standard exception");
      }
      groups[r]->Finish(s);
      results[r] = std::move(s);
    });
  }
  for (std::thread& t : threads) t.join();
  return results;
}

}  // namespace megackpt::dist
