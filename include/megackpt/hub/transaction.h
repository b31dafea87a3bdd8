// HubTransaction: many file writes and deletes that land as ONE hub commit
// (all or nothing), the unit of a checkpoint save to `mega://`.
//
// Single process:
//   auto txn = HubTransaction::Begin(hub, *ParseMegaUri("mega://org/m@main/ckpt/step-100"));
//   auto f = (*txn)->OpenForWrite("model.mega");   // path relative to the root
//   ... f->Append(...); f->Close();                  // content streams into the CAS
//   auto commit = (*txn)->Commit();                  // one commit, parent-checked
//
// Several ranks (one commit for the whole job): the coordinator begins and
// broadcasts `base_commit()`; every rank calls Begin(hub, root, options,
// base_commit) and writes its files; ranks send `staged()` (SerializeStaged)
// to the coordinator, which calls Stage(...) with them (ParseStaged) and
// Commit(). Other ranks just drop their transaction (their uploaded content is
// committed by the coordinator's entries).
//
// Guarantees:
//  - Commit() makes exactly one commit whose parent is base_commit(). If the
//    branch moved since, it fails with Aborted "conflict: ..." and changes
//    nothing, unless options.rebase and no staged path changed on the branch
//    since base_commit() (then the commit lands on the new head).
//  - Abort(), destroying an uncommitted transaction, or a crash before
//    Commit() leaves the branch untouched (readers keep the old revision;
//    uploaded content is garbage-collected later).
//  - For a bucket root, Commit() applies all staged adds/deletes in one batch
//    (buckets have no history; last writer wins per path).
//
// Thread-safety: OpenForWrite/Delete/Stage may be called from several threads;
// each returned WritableFile is used by one thread. Commit/Abort once.
#ifndef MEGACKPT_HUB_TRANSACTION_H_
#define MEGACKPT_HUB_TRANSACTION_H_

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/file.h"
#include "megackpt/core/status.h"
#include "megackpt/fs/filesystem.h"
#include "megackpt/hub/client.h"
#include "megackpt/hub/mega_uri.h"
#include "megackpt/hub/types.h"

namespace megackpt::hub {

// One staged change: an uploaded file (entry) or a deletion. `entry.path` is
// the full path inside the repo/bucket.
struct StagedEntry {
  FileEntry entry;
  bool deleted = false;
  friend bool operator==(const StagedEntry&, const StagedEntry&) = default;
};

// JSON form of staged entries (a compact array) for sending between ranks.
std::string SerializeStaged(std::span<const StagedEntry> entries);
// InvalidArgument on malformed input (bad JSON, bad path, bad hashes).
Result<std::vector<StagedEntry>> ParseStaged(std::string_view json);

struct TransactionOptions {
  std::string message;  // default "megackpt: update <root path>"
  std::string description;
  // On a parent conflict, commit on top of the new head when no staged path
  // changed there (see above).
  bool rebase = false;
  // Create the repo (or bucket) at Begin when it does not exist.
  bool create = true;
  bool create_private = false;
};

// The fs seam's counts: new_bytes are the serialized bytes of the xorbs the
// uploads added to the hub's CAS (what travelled for a remote hub; dedup keeps
// it below bytes_written).
using TransactionStats = fs::TransactionStats;

class HubTransaction {
 public:
  // Begins on `root`: a repo URI whose revision is a branch (default "main")
  // or a bucket URI. Records the branch head as base_commit() (or uses
  // `base_commit` when given: ranks joining a coordinator's transaction).
  // NotFound for a missing repo/branch when !options.create; FailedPrecondition
  // when the revision is a tag or commit id (not writable).
  static Result<std::unique_ptr<HubTransaction>> Begin(std::shared_ptr<HubConnection> hub,
                                                       const MegaUri& root,
                                                       TransactionOptions options = {},
                                                       std::string base_commit = "");
  ~HubTransaction();

  const MegaUri& root() const { return root_; }
  // Parent of the commit this transaction makes ("" for buckets).
  const std::string& base_commit() const { return base_; }
  HubConnection& hub() { return *hub_; }

  // Streams a new file at root/relative_path into the hub's CAS (no local
  // temp copy). On Close() it is staged (replacing any earlier staging of
  // the same path). FailedPrecondition after Commit/Abort.
  Result<std::unique_ptr<WritableFile>> OpenForWrite(std::string_view relative_path);
  // Writes a whole file (OpenForWrite + Append + Close).
  Status Put(std::string_view relative_path, std::string_view data);
  // Stages the deletion of root/relative_path (applied at commit; a path
  // that does not exist then is ignored).
  Status Delete(std::string_view relative_path);
  // Adds entries staged elsewhere (other ranks). Paths are full repo paths.
  Status Stage(std::span<const StagedEntry> entries);

  TransactionStats stats() const;

  // Everything staged so far, sorted by path.
  std::vector<StagedEntry> staged() const;
  // The staged entry of a full repo path, if any (read-your-writes).
  std::optional<StagedEntry> FindStaged(std::string_view full_path) const;

  // Commits (see the guarantees above). For buckets the returned CommitInfo
  // has an empty id. After Commit (OK or not) the transaction is closed.
  Result<CommitInfo> Commit();
  // Discards the staged entries; the branch is untouched.
  void Abort();
  bool is_open() const;

 private:
  HubTransaction() = default;
  Status Record(StagedEntry entry, const cas::FileUploadResult* upload = nullptr);
  Result<std::string> FullPath(std::string_view relative_path) const;

  std::shared_ptr<HubConnection> hub_;
  MegaUri root_;
  TransactionOptions options_;
  std::string base_;
  mutable std::mutex mu_;
  bool open_ = true;
  TransactionStats stats_;
  std::map<std::string, StagedEntry> staged_;  // by path; last write wins
};

}  // namespace megackpt::hub

#endif  // MEGACKPT_HUB_TRANSACTION_H_
