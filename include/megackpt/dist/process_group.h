// ProcessGroup: the collectives distributed checkpointing needs, over small
// byte blobs (serialized plans, results, metadata, errors).
//
// Backends: single process (default), threads (N ranks inside one process, for
// tests and single-node jobs) and MPI (OpenMPI; `mpirun -np N`), which is how
// jobs run across machines.
//
// Failure contract (all backends):
//  - Every collective takes a deadline (ProcessGroupOptions::timeout). A rank that
//    died or stopped calling collectives makes the others fail with
//    DeadlineExceeded (or Aborted when the backend learns of the death sooner),
//    never hang.
//  - AllReduceStatus() is how an error on one rank reaches every rank: each rank
//    passes its local status and all receive the same result (the lowest failing
//    rank's status, its message prefixed with "rank R: " unless it already
//    starts with "rank N: ", i.e. was combined by an earlier AllReduceStatus).
//  - After a collective failed, the group is broken: later calls fail fast with
//    Aborted.
// REQUIRES: all ranks call the same collectives in the same order.
#ifndef MEGACKPT_DIST_PROCESS_GROUP_H_
#define MEGACKPT_DIST_PROCESS_GROUP_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/status.h"

namespace megackpt::dist {

struct ProcessGroupOptions {
  // Deadline for any one collective.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  // "single", "threads" or "mpi".
  virtual std::string_view backend() const = 0;

  virtual Status Barrier() = 0;

  // Every rank contributes `blob`; `root` receives all blobs indexed by rank,
  // the others receive an empty vector.
  virtual Result<std::vector<std::string>> Gather(std::string blob, int root) = 0;

  // `root` passes world_size() blobs (others pass anything, ignored); rank r
  // receives blobs[r].
  virtual Result<std::string> Scatter(std::vector<std::string> blobs, int root) = 0;

  // `root`'s blob is returned on every rank.
  virtual Result<std::string> Broadcast(std::string blob, int root) = 0;

  // Every rank receives every rank's blob, indexed by rank.
  virtual Result<std::vector<std::string>> AllGather(std::string blob) = 0;

  // Combines each rank's local status; see the failure contract above.
  Status AllReduceStatus(const Status& local);
};

// A group of one: collectives are local copies.
std::unique_ptr<ProcessGroup> NewSingleProcessGroup();

// Runs fn(rank_group) on `world_size` threads, each holding the threads-backend
// group for its rank, and returns each rank's status (index = rank). A rank
// whose fn throws reports Internal with the exception text; the other ranks'
// pending collectives then fail with Aborted instead of waiting.
std::vector<Status> RunThreadRanks(int world_size, const std::function<Status(ProcessGroup&)>& fn,
                                   ProcessGroupOptions options = {});

// The MPI backend over MPI_COMM_WORLD. Calls MPI_Init_thread on first use when
// MPI is not initialized yet (and registers MPI_Finalize at exit).
// FailedPrecondition when the process was not started by an MPI launcher in a
// way MPI accepts.
Result<std::unique_ptr<ProcessGroup>> NewMpiProcessGroup(ProcessGroupOptions options = {});

// True when this process looks like it was started by mpirun/mpiexec
// (OMPI_COMM_WORLD_SIZE or PMI_SIZE set).
bool LaunchedByMpi();

}  // namespace megackpt::dist

#endif  // MEGACKPT_DIST_PROCESS_GROUP_H_
