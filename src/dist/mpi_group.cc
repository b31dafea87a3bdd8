// The MPI backend (OpenMPI), with bounded-time collectives.
//
// Why point-to-point and not MPI's collectives: a blocking MPI collective cannot be
// given a deadline, and a nonblocking one (MPI_Igather...) cannot be cancelled nor
// tagged. Every collective here is one or two "phases" of nonblocking sends and
// receives (MPI_Isend/MPI_Irecv) polled with MPI_Test until done or until the
// deadline. Each message carries a header naming the collective kind, root, phase
// and sequence number, so ranks that call different collectives are detected when
// their messages meet. Algorithms: Gather/Scatter linear at the root, Broadcast a
// binomial tree, AllGather = Gather to 0 + Broadcast of the packed list, Barrier =
// empty Gather to 0 + empty Broadcast.
//
// Every group runs on its own duplicate of MPI_COMM_WORLD (MPI_Comm_idup), so stale
// messages of a broken group never reach another group, and the duplicate uses
// MPI_ERRORS_RETURN so MPI errors become a Status instead of killing the process.
//
// A failed collective leaves requests MPI may still hold buffers of (a send nobody
// receives cannot be cancelled reliably). Those requests and their buffers are kept
// until they complete, and leaked on purpose when they never do: freeing a buffer
// MPI may still write into would be memory corruption.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dist/mpi_internal.h"
#include "dist/wire.h"
#include "megackpt/core/endian.h"
#include "megackpt/dist/process_group.h"

namespace megackpt::dist {
namespace {

using Clock = std::chrono::steady_clock;

// Serializes every MPI call megackpt makes, which makes MPI_THREAD_SERIALIZED
// sufficient. Never held while sleeping.
std::mutex& MpiMutex() {
  static std::mutex* mu = new std::mutex;  // leaked: used from atexit
  return *mu;
}

std::atomic<int> g_thread_level{-1};
std::atomic<bool> g_initialized_by_us{false};
std::atomic<size_t> g_fragment_bytes{kMpiDefaultFragmentBytes};
// Set when any group of this process failed a collective; see FinalizeAtExit.
std::atomic<bool> g_any_group_failed{false};
std::atomic<int64_t> g_max_timeout_ms{0};

std::string MpiErrorString(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(rc);
  return std::string(buf, static_cast<size_t>(len));
}

Status MpiCallError(const std::string& what, int rc) {
  // A communication error on the group's communicator almost always means a peer
  // process is gone: the group cannot continue.
  return AbortedError(what + " failed: " + MpiErrorString(rc));
}

// MPI_Finalize synchronizes with every other rank. When a peer exited without
// finalizing and the launcher did not kill the job (mpirun --enable-recovery, other
// launchers), it would wait forever. So after a group failure, a watchdog ends the
// process with status 1 when MPI_Finalize has not returned within twice the largest
// collective timeout (at least 5 s): live peers reach MPI_Finalize within about one
// timeout of us, since their collectives fail too.
void FinalizeAtExit() {
  if (g_any_group_failed) {
    const auto grace = std::chrono::milliseconds(std::max<int64_t>(5000, 2 * g_max_timeout_ms));
    std::thread([grace] {
      std::this_thread::sleep_for(grace);
      std::fprintf(stderr,
                   "megackpt: MPI_Finalize did not return within %lld ms after a process group "
                   "failure (a peer rank is gone?); exiting with status 1\n",
                   static_cast<long long>(grace.count()));
      std::fflush(stderr);
      std::_Exit(1);
    }).detach();
  }
  std::lock_guard<std::mutex> lock(MpiMutex());
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

Status EnsureMpiInitialized() {
  std::lock_guard<std::mutex> lock(MpiMutex());
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return FailedPreconditionError("MPI backend: MPI was already finalized");
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = -1;
  if (!initialized) {
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) {
      return FailedPreconditionError(
          "MPI backend: MPI_Init_thread failed (start the program with mpirun -np N): " +
          MpiErrorString(rc));
    }
    g_initialized_by_us = true;
    std::atexit(FinalizeAtExit);
  } else {
    MPI_Query_thread(&provided);
  }
  g_thread_level = provided;
  return Status::OK();
}

// Polling cadence, by time since the last completed request: spin for 1 ms, then
// yield until 5 ms, then sleep 50 us, and after 50 ms sleep 1 ms. A payload moves
// in 1 MiB fragments, each completion counts as progress, so a transfer keeps
// spinning at full speed (yielding is not enough: on a loaded machine a yield can
// cost a whole time slice per MPI_Test). A rank waiting for a slow peer soon
// sleeps and does not burn a core on an oversubscribed machine.
class Backoff {
 public:
  void Reset() { last_progress_ = Clock::now(); }
  void Idle() {
    const auto idle = Clock::now() - last_progress_;
    if (idle < std::chrono::milliseconds(1)) {
      return;
    } else if (idle < std::chrono::milliseconds(5)) {
      std::this_thread::yield();
    } else if (idle < std::chrono::milliseconds(50)) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

 private:
  Clock::time_point last_progress_ = Clock::now();
};

// What every header of one phase of one collective must say.
struct PhaseId {
  CollectiveKind kind;
  uint8_t phase;
  int root;
  uint64_t seq;
};

std::string DescribeCall(CollectiveKind kind, int root) {
  std::string s = CollectiveKindName(kind);
  if (kind == CollectiveKind::kGather || kind == CollectiveKind::kScatter ||
      kind == CollectiveKind::kBroadcast) {
    s += "(root " + std::to_string(root) + ")";
  }
  return s;
}

std::string EncodeHeader(const PhaseId& id, int sender, uint64_t length) {
  std::string h;
  h.reserve(kMpiHeaderBytes);
  AppendLE32(&h, kMpiHeaderMagic);
  h.push_back(static_cast<char>(kMpiHeaderVersion));
  h.push_back(static_cast<char>(id.kind));
  h.push_back(static_cast<char>(id.phase));
  h.push_back(0);
  AppendLE32(&h, static_cast<uint32_t>(id.root));
  AppendLE32(&h, static_cast<uint32_t>(sender));
  AppendLE64(&h, id.seq);
  AppendLE64(&h, length);
  return h;
}

std::string RankList(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) {
    if (!s.empty()) s += ',';
    s += std::to_string(r);
  }
  return s;
}

// One phase of a collective: concurrent sends to some peers and receives from
// others, driven to completion by Run(). Owns every buffer MPI may touch.
class Exchange {
 public:
  Exchange(MPI_Comm comm, int tag, PhaseId id, int self, size_t fragment_bytes)
      : comm_(comm), tag_(tag), id_(id), self_(self), fragment_bytes_(fragment_bytes) {}

  // REQUIRES: MpiMutex() held by the caller for Post* and Test*.
  Status PostSend(int dst, std::shared_ptr<const std::string> payload) {
    if (payload->size() > kMpiMaxBlobBytes) {
      return ResourceExhaustedError("blob of " + std::to_string(payload->size()) +
                                    " bytes exceeds the MPI backend limit of " +
                                    std::to_string(kMpiMaxBlobBytes));
    }
    auto s = std::make_unique<Send>();
    s->dst = dst;
    s->header = EncodeHeader(id_, self_, payload->size());
    s->payload = std::move(payload);
    Send& send = *s;
    sends_.push_back(std::move(s));
    send.reqs.push_back(MPI_REQUEST_NULL);
    int rc = MPI_Isend(send.header.data(), static_cast<int>(kMpiHeaderBytes), MPI_BYTE, dst, tag_,
                       comm_, &send.reqs.back());
    if (rc != MPI_SUCCESS) return MpiCallError("MPI_Isend to rank " + std::to_string(dst), rc);
    for (size_t off = 0; off < send.payload->size(); off += fragment_bytes_) {
      const size_t n = std::min(fragment_bytes_, send.payload->size() - off);
      send.reqs.push_back(MPI_REQUEST_NULL);
      rc = MPI_Isend(send.payload->data() + off, static_cast<int>(n), MPI_BYTE, dst, tag_, comm_,
                     &send.reqs.back());
      if (rc != MPI_SUCCESS) return MpiCallError("MPI_Isend to rank " + std::to_string(dst), rc);
    }
    return Status::OK();
  }

  Status PostRecv(int src) {
    auto r = std::make_unique<Recv>();
    r->src = src;
    Recv& recv = *r;
    recvs_.push_back(std::move(r));
    const int rc = MPI_Irecv(recv.header, static_cast<int>(kMpiHeaderBytes), MPI_BYTE, src, tag_,
                             comm_, &recv.header_req);
    if (rc != MPI_SUCCESS) return MpiCallError("MPI_Irecv from rank " + std::to_string(src), rc);
    return Status::OK();
  }

  // Polls until every send and receive completed, an error, or `deadline`.
  Status Run(Clock::time_point deadline, const std::string& label,
             std::chrono::milliseconds timeout) {
    Backoff backoff;
    while (true) {
      bool progress = false;
      bool done = false;
      {
        std::lock_guard<std::mutex> lock(MpiMutex());
        Result<bool> r = TestLocked(&progress);
        if (!r.ok()) return r.status().WithContext(label);
        done = *r;
      }
      if (done) return Status::OK();
      if (Clock::now() >= deadline) return TimeoutError(label, timeout);
      if (progress) {
        backoff.Reset();
      } else {
        backoff.Idle();
      }
    }
  }

  // The payload received from `src`. REQUIRES: Run() returned OK.
  std::string TakeReceived(int src) {
    for (auto& r : recvs_) {
      if (r->src == src) return std::move(r->data);
    }
    return std::string();
  }

  // After a failure: cancels receives (they complete as cancelled); sends stay
  // pending. REQUIRES: MpiMutex() held.
  void CancelReceivesLocked() {
    for (auto& r : recvs_) {
      if (r->header_req != MPI_REQUEST_NULL) MPI_Cancel(&r->header_req);
      for (MPI_Request& req : r->data_reqs) {
        if (req != MPI_REQUEST_NULL) MPI_Cancel(&req);
      }
    }
  }

  // Completes what can be completed without waiting; true when nothing is pending.
  // REQUIRES: MpiMutex() held.
  bool DrainLocked() {
    bool pending = false;
    auto drain = [&](MPI_Request* req) {
      if (*req == MPI_REQUEST_NULL) return;
      int flag = 0;
      if (MPI_Test(req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag) pending = true;
    };
    for (auto& s : sends_) {
      for (MPI_Request& req : s->reqs) drain(&req);
    }
    for (auto& r : recvs_) {
      drain(&r->header_req);
      for (MPI_Request& req : r->data_reqs) drain(&req);
    }
    return !pending;
  }

 private:
  struct Send {
    int dst = 0;
    std::string header;
    std::shared_ptr<const std::string> payload;
    std::vector<MPI_Request> reqs;
  };
  struct Recv {
    int src = 0;
    char header[kMpiHeaderBytes];
    MPI_Request header_req = MPI_REQUEST_NULL;
    bool header_done = false;
    std::string data;
    std::vector<MPI_Request> data_reqs;
  };

  // MPI_Test of each pending request of `reqs` (what + peer: the transfer, for
  // the error): sets *progress when one completed, clears *all_done when one is
  // still pending.
  static Status TestRequests(std::vector<MPI_Request>& reqs, const char* what, int peer,
                             bool* progress, bool* all_done) {
    for (MPI_Request& req : reqs) {
      if (req == MPI_REQUEST_NULL) continue;
      int flag = 0;
      const int rc = MPI_Test(&req, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) return MpiCallError(what + std::to_string(peer), rc);
      if (flag) {
        *progress = true;
      } else {
        *all_done = false;
      }
    }
    return Status::OK();
  }

  // One MPI_Test round over every pending request. Returns true when all are done.
  Result<bool> TestLocked(bool* progress) {
    bool all_done = true;
    for (auto& s : sends_) {
      MEGA_RETURN_IF_ERROR(TestRequests(s->reqs, "sending to rank ", s->dst, progress, &all_done));
    }
    for (auto& r : recvs_) {
      if (!r->header_done) {
        int flag = 0;
        MPI_Status status;
        const int rc = MPI_Test(&r->header_req, &flag, &status);
        if (rc != MPI_SUCCESS) {
          return MpiCallError("receiving from rank " + std::to_string(r->src), rc);
        }
        if (!flag) {
          all_done = false;
          continue;
        }
        *progress = true;
        r->header_done = true;
        int count = 0;
        MPI_Get_count(&status, MPI_BYTE, &count);
        MEGA_RETURN_IF_ERROR(CheckHeader(*r, count));
        MEGA_RETURN_IF_ERROR(PostDataReceives(r.get()));
      }
      MEGA_RETURN_IF_ERROR(
          TestRequests(r->data_reqs, "receiving from rank ", r->src, progress, &all_done));
    }
    return all_done;
  }

  Status CheckHeader(const Recv& r, int count) const {
    const std::string from = "message from rank " + std::to_string(r.src);
    if (count != static_cast<int>(kMpiHeaderBytes)) {
      return DataLossError(from + ": header of " + std::to_string(count) + " bytes, expected " +
                           std::to_string(kMpiHeaderBytes));
    }
    const char* h = r.header;
    if (LoadLE32(h) != kMpiHeaderMagic || static_cast<uint8_t>(h[4]) != kMpiHeaderVersion) {
      return DataLossError(from + ": bad header magic/version (not a megackpt message?)");
    }
    const auto kind = static_cast<CollectiveKind>(static_cast<uint8_t>(h[5]));
    const uint8_t phase = static_cast<uint8_t>(h[6]);
    const int root = static_cast<int>(LoadLE32(h + 8));
    const uint64_t seq = LoadLE64(h + 16);
    if (kind != id_.kind || phase != id_.phase || root != id_.root || seq != id_.seq) {
      return FailedPreconditionError(
          "collective mismatch at #" + std::to_string(id_.seq) + ": rank " + std::to_string(self_) +
          " called " + DescribeCall(id_.kind, id_.root) + " but rank " + std::to_string(r.src) +
          " sent " + DescribeCall(kind, root) + " #" + std::to_string(seq) + " (phase " +
          std::to_string(phase) + ")");
    }
    const uint64_t length = LoadLE64(h + 24);
    if (length > kMpiMaxBlobBytes) {
      return DataLossError(from + ": payload length " + std::to_string(length) +
                           " exceeds the limit " + std::to_string(kMpiMaxBlobBytes));
    }
    return Status::OK();
  }

  Status PostDataReceives(Recv* r) {
    const uint64_t length = LoadLE64(r->header + 24);
    r->data.resize(length);
    for (size_t off = 0; off < length; off += fragment_bytes_) {
      const size_t n = std::min<size_t>(fragment_bytes_, length - off);
      r->data_reqs.push_back(MPI_REQUEST_NULL);
      const int rc = MPI_Irecv(r->data.data() + off, static_cast<int>(n), MPI_BYTE, r->src, tag_,
                               comm_, &r->data_reqs.back());
      if (rc != MPI_SUCCESS)
        return MpiCallError("MPI_Irecv from rank " + std::to_string(r->src), rc);
    }
    return Status::OK();
  }

  Status TimeoutError(const std::string& label, std::chrono::milliseconds timeout) const {
    std::vector<int> silent;     // we are still waiting for their message
    std::vector<int> unreached;  // our message to them has not been received
    for (const auto& r : recvs_) {
      bool pending = !r->header_done;
      for (MPI_Request req : r->data_reqs) pending |= req != MPI_REQUEST_NULL;
      if (pending) silent.push_back(r->src);
    }
    for (const auto& s : sends_) {
      bool pending = false;
      for (MPI_Request req : s->reqs) pending |= req != MPI_REQUEST_NULL;
      if (pending) unreached.push_back(s->dst);
    }
    std::string msg = label + ": timed out after " + std::to_string(timeout.count()) + " ms";
    if (!silent.empty()) msg += "; no message from rank(s) " + RankList(silent);
    if (!unreached.empty()) msg += "; not received by rank(s) " + RankList(unreached);
    return DeadlineExceededError(msg);
  }

  MPI_Comm comm_;
  int tag_;
  PhaseId id_;
  int self_;
  size_t fragment_bytes_;
  // unique_ptr: MPI holds pointers into these, so they must never move.
  std::vector<std::unique_ptr<Send>> sends_;
  std::vector<std::unique_ptr<Recv>> recvs_;
};

// Exchanges whose requests never completed, kept alive until the process exits.
std::vector<std::unique_ptr<Exchange>>& Graveyard() {
  static auto* graveyard = new std::vector<std::unique_ptr<Exchange>>;  // leaked on purpose
  return *graveyard;
}

class MpiProcessGroup final : public ProcessGroup {
 public:
  MpiProcessGroup(MPI_Comm comm, int rank, int size, int tag_ub, ProcessGroupOptions options)
      : comm_(comm), rank_(rank), size_(size), tag_ub_(tag_ub), options_(options) {}

  ~MpiProcessGroup() override {
    std::lock_guard<std::mutex> lock(MpiMutex());
    int finalized = 0;
    MPI_Finalized(&finalized);
    bool drained = true;
    for (auto& ex : abandoned_) {
      if (!finalized && ex->DrainLocked()) {
        ex.reset();
      } else {
        drained = false;
        Graveyard().push_back(std::move(ex));
      }
    }
    // MPI_Comm_free is only safe on a communicator without pending operations.
    if (!finalized && drained && broken_.ok()) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  std::string_view backend() const override { return "mpi"; }

  Status Barrier() override {
    std::lock_guard<std::mutex> call(call_mu_);
    MEGA_ASSIGN_OR_RETURN(Call c, Begin(CollectiveKind::kBarrier, 0));
    MEGA_RETURN_IF_ERROR(GatherPhase(c, 0, std::string(), nullptr));
    std::string empty;
    return BroadcastPhase(c, 1, &empty);
  }

  Result<std::vector<std::string>> Gather(std::string blob, int root) override {
    std::lock_guard<std::mutex> call(call_mu_);
    MEGA_ASSIGN_OR_RETURN(Call c, Begin(CollectiveKind::kGather, root));
    std::vector<std::string> out;
    MEGA_RETURN_IF_ERROR(GatherPhase(c, 0, std::move(blob), &out));
    return out;
  }

  Result<std::string> Scatter(std::vector<std::string> blobs, int root) override {
    std::lock_guard<std::mutex> call(call_mu_);
    MEGA_ASSIGN_OR_RETURN(Call c, Begin(CollectiveKind::kScatter, root));
    if (rank_ == root && blobs.size() != static_cast<size_t>(size_)) {
      // The others are waiting for our messages: they time out (or see a broken group).
      return Fail(InvalidArgumentError(c.label + ": root passed " + std::to_string(blobs.size()) +
                                       " blobs, expected world_size " + std::to_string(size_)));
    }
    Exchange* ex = NewExchange(c, 0);
    {
      std::lock_guard<std::mutex> lock(MpiMutex());
      if (rank_ == root) {
        for (int r = 0; r < size_; ++r) {
          if (r == root) continue;
          Status s = ex->PostSend(r, std::make_shared<const std::string>(std::move(blobs[r])));
          if (!s.ok()) return FailLocked(s.WithContext(c.label));
        }
      } else {
        Status s = ex->PostRecv(root);
        if (!s.ok()) return FailLocked(s.WithContext(c.label));
      }
    }
    MEGA_RETURN_IF_ERROR(RunExchange(c));
    std::string out = rank_ == root ? std::move(blobs[root]) : ex->TakeReceived(root);
    current_.reset();
    return out;
  }

  Result<std::string> Broadcast(std::string blob, int root) override {
    std::lock_guard<std::mutex> call(call_mu_);
    MEGA_ASSIGN_OR_RETURN(Call c, Begin(CollectiveKind::kBroadcast, root));
    MEGA_RETURN_IF_ERROR(BroadcastPhase(c, 0, &blob));
    return blob;
  }

  Result<std::vector<std::string>> AllGather(std::string blob) override {
    std::lock_guard<std::mutex> call(call_mu_);
    MEGA_ASSIGN_OR_RETURN(Call c, Begin(CollectiveKind::kAllGather, 0));
    std::vector<std::string> out;
    MEGA_RETURN_IF_ERROR(GatherPhase(c, 0, std::move(blob), &out));
    std::string packed;
    if (rank_ == 0) packed = PackBlobs(out);
    MEGA_RETURN_IF_ERROR(BroadcastPhase(c, 1, &packed));
    if (rank_ == 0) return out;
    Result<std::vector<std::string>> unpacked = UnpackBlobs(packed);
    if (!unpacked.ok()) return Fail(unpacked.status().WithContext(c.label + " from rank 0"));
    if (unpacked->size() != static_cast<size_t>(size_)) {
      return Fail(DataLossError(c.label + ": rank 0 sent " + std::to_string(unpacked->size()) +
                                " blobs, expected " + std::to_string(size_)));
    }
    return unpacked;
  }

 private:
  struct Call {
    CollectiveKind kind;
    int root;
    uint64_t seq;
    Clock::time_point deadline;
    std::string label;  // "Gather #3 (root 0)"
  };

  Result<Call> Begin(CollectiveKind kind, int root) {
    Call c{kind, root, seq_++, Clock::now() + options_.timeout, ""};
    c.label = CollectiveKindName(kind) + " #" + std::to_string(c.seq);
    if (kind != CollectiveKind::kBarrier && kind != CollectiveKind::kAllGather) {
      c.label += " (root " + std::to_string(root) + ")";
    }
    MEGA_RETURN_IF_ERROR(broken_);
    if (root < 0 || root >= size_) {
      return Fail(InvalidArgumentError(c.label + ": root " + std::to_string(root) +
                                       " out of range [0, " + std::to_string(size_) + ")"));
    }
    return c;
  }

  int TagFor(const Call& c, uint8_t phase) const {
    return static_cast<int>((c.seq * 2 + phase) % (static_cast<uint64_t>(tag_ub_) + 1));
  }

  Exchange* NewExchange(const Call& c, uint8_t phase) {
    current_ =
        std::make_unique<Exchange>(comm_, TagFor(c, phase), PhaseId{c.kind, phase, c.root, c.seq},
                                   rank_, g_fragment_bytes.load());
    return current_.get();
  }

  // Runs current_ to completion; on failure keeps it (its buffers may still be in
  // MPI's hands) and breaks the group.
  Status RunExchange(const Call& c) {
    Status s = current_->Run(c.deadline, c.label, options_.timeout);
    if (!s.ok()) {
      std::lock_guard<std::mutex> lock(MpiMutex());
      return FailLocked(s);
    }
    return s;
  }

  // Every rank sends `blob` to the call's root (rank 0 for Barrier/AllGather,
  // whose Call::root is 0); the root fills `out` (indexed by rank).
  Status GatherPhase(const Call& c, uint8_t phase, std::string blob,
                     std::vector<std::string>* out) {
    const int root = c.root;
    Exchange* ex = NewExchange(c, phase);
    {
      std::lock_guard<std::mutex> lock(MpiMutex());
      if (rank_ == root) {
        for (int r = 0; r < size_; ++r) {
          if (r == root) continue;
          Status s = ex->PostRecv(r);
          if (!s.ok()) return FailLocked(s.WithContext(c.label));
        }
      } else {
        Status s = ex->PostSend(root, std::make_shared<const std::string>(std::move(blob)));
        if (!s.ok()) return FailLocked(s.WithContext(c.label));
      }
    }
    MEGA_RETURN_IF_ERROR(RunExchange(c));
    if (rank_ == root && out != nullptr) {
      out->assign(size_, std::string());
      for (int r = 0; r < size_; ++r) {
        (*out)[r] = r == root ? std::move(blob) : ex->TakeReceived(r);
      }
    }
    current_.reset();
    return Status::OK();
  }

  // Binomial-tree broadcast of *blob from the call's root (relative rank 0): receive
  // from the parent, then send to every child at once.
  Status BroadcastPhase(const Call& c, uint8_t phase, std::string* blob) {
    const int n = size_;
    const int vr = (rank_ - c.root + n) % n;
    int mask = 1;
    while (mask < n) {
      if (vr & mask) {
        const int parent = (rank_ - mask + n) % n;
        Exchange* ex = NewExchange(c, phase);
        {
          std::lock_guard<std::mutex> lock(MpiMutex());
          Status s = ex->PostRecv(parent);
          if (!s.ok()) return FailLocked(s.WithContext(c.label));
        }
        MEGA_RETURN_IF_ERROR(RunExchange(c));
        *blob = ex->TakeReceived(parent);
        current_.reset();
        break;
      }
      mask <<= 1;
    }
    mask >>= 1;
    if (mask == 0 || vr + 1 >= n) return Status::OK();  // a leaf
    auto payload = std::make_shared<std::string>(std::move(*blob));
    Exchange* ex = NewExchange(c, phase);
    {
      std::lock_guard<std::mutex> lock(MpiMutex());
      for (; mask > 0; mask >>= 1) {
        if (vr + mask < n) {
          Status s = ex->PostSend((rank_ + mask) % n, payload);
          if (!s.ok()) return FailLocked(s.WithContext(c.label));
        }
      }
    }
    MEGA_RETURN_IF_ERROR(RunExchange(c));
    current_.reset();  // drops the exchange's references to payload
    *blob = std::move(*payload);
    return Status::OK();
  }

  Status Fail(Status s) {
    std::lock_guard<std::mutex> lock(MpiMutex());
    return FailLocked(std::move(s));
  }

  // Breaks the group: cancels what can be cancelled and keeps the current
  // exchange's buffers. REQUIRES: MpiMutex() held.
  Status FailLocked(Status s) {
    if (current_) {
      current_->CancelReceivesLocked();
      abandoned_.push_back(std::move(current_));
    }
    g_any_group_failed = true;
    if (broken_.ok()) {
      broken_ = AbortedError("MPI process group (rank " + std::to_string(rank_) +
                             ") is broken by an earlier failure: " + s.ToString());
    }
    return s;
  }

  MPI_Comm comm_;
  const int rank_;
  const int size_;
  const int tag_ub_;
  const ProcessGroupOptions options_;
  std::mutex call_mu_;  // one collective at a time per group object
  uint64_t seq_ = 0;
  Status broken_;
  std::unique_ptr<Exchange> current_;
  std::vector<std::unique_ptr<Exchange>> abandoned_;
};

}  // namespace

void SetMpiFragmentBytesForTesting(size_t bytes) {
  g_fragment_bytes = std::clamp<size_t>(bytes, 1, size_t{1} << 30);
}

int MpiThreadLevel() { return g_thread_level.load(); }

bool MpiInitializedByMegackpt() { return g_initialized_by_us.load(); }

Result<std::unique_ptr<ProcessGroup>> NewMpiProcessGroup(ProcessGroupOptions options) {
  if (options.timeout.count() <= 0) {
    return InvalidArgumentError("NewMpiProcessGroup: timeout must be positive, got " +
                                std::to_string(options.timeout.count()) + " ms");
  }
  MEGA_RETURN_IF_ERROR(dist::EnsureMpiInitialized());
  int64_t max_timeout = dist::g_max_timeout_ms.load();
  while (options.timeout.count() > max_timeout &&
         !dist::g_max_timeout_ms.compare_exchange_weak(max_timeout, options.timeout.count())) {
  }
  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  // MPI writes the new communicator when the request completes: if that never
  // happens (a rank did not come), the storage must outlive us, so it is heap
  // allocated and leaked on timeout.
  auto comm = std::make_unique<MPI_Comm>(MPI_COMM_NULL);
  auto req = std::make_unique<MPI_Request>(MPI_REQUEST_NULL);
  {
    std::lock_guard<std::mutex> lock(dist::MpiMutex());
    const int rc = MPI_Comm_idup(MPI_COMM_WORLD, comm.get(), req.get());
    if (rc != MPI_SUCCESS) return dist::MpiCallError("NewMpiProcessGroup: MPI_Comm_idup", rc);
  }
  dist::Backoff backoff;
  while (true) {
    int flag = 0;
    {
      std::lock_guard<std::mutex> lock(dist::MpiMutex());
      const int rc = MPI_Test(req.get(), &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) {
        (void)comm.release();
        (void)req.release();
        return dist::MpiCallError("NewMpiProcessGroup: MPI_Comm_idup", rc);
      }
    }
    if (flag) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      (void)comm.release();  // see above: MPI may still write it
      (void)req.release();
      dist::g_any_group_failed = true;
      return DeadlineExceededError(
          "NewMpiProcessGroup: timed out after " + std::to_string(options.timeout.count()) +
          " ms waiting for every rank of MPI_COMM_WORLD to create the group");
    }
    backoff.Idle();
  }
  int rank = 0;
  int size = 0;
  int tag_ub = 32767;  // the minimum MPI guarantees
  {
    std::lock_guard<std::mutex> lock(dist::MpiMutex());
    MPI_Comm_set_errhandler(*comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(*comm, &rank);
    MPI_Comm_size(*comm, &size);
    int* attr = nullptr;
    int flag = 0;
    if (MPI_Comm_get_attr(*comm, MPI_TAG_UB, &attr, &flag) == MPI_SUCCESS && flag && attr) {
      tag_ub = std::min(*attr, INT_MAX - 1);
    }
  }
  return std::unique_ptr<ProcessGroup>(
      std::make_unique<dist::MpiProcessGroup>(*comm, rank, size, tag_ub, options));
}

}  // namespace megackpt::dist
