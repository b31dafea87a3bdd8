// MegaFileSystem: the FileSystem seam (megackpt/fs/filesystem.h) for `mega://`
// paths, over a HubConnection (embedded store or remote megahub). The hub layer
// registers it for the "mega" scheme, so fs::FileSystemForPath("mega://...")
// returns the process's shared instance for the environment's endpoint
// (MEGA_ENDPOINT / MEGA_TOKEN / MEGA_HOME, see hub/client.h) in any program that
// links megackpt::hub (see RegisterMegaScheme).
//
// Paths: `mega://[type/]ns/name[@rev]/path` and `mega://buckets/ns/name/path`.
//  - Reads resolve the revision once at OpenForRead: the file is pinned to
//    that commit even if the branch moves while it is read. Each ReadAt
//    fetches only the bytes it covers. PinPath replaces a branch or tag by the
//    commit it names now (buckets have no history: unchanged).
//  - Writes outside a transaction: a repo file becomes one commit on Close()
//    (landing on the branch head; Aborted only if the same path changed
//    concurrently); a bucket file is visible at once (last writer wins). The
//    repo/bucket is created when missing. Files are sequential sinks (no WriteAt).
//  - Transactions are isolated (capabilities().isolated_transactions):
//    fs::FileSystem::BeginTransaction over a folder inside a repo branch or a
//    bucket stages every write, Put and Remove and makes ONE hub commit (a
//    bucket: one batch) at Commit, parent-checked against the base commit
//    (options.base, or the branch head at Begin; Aborted "conflict: branch
//    '<b>' ..." when the branch moved and could not be rebased). Export is the
//    staged entries (path, size, sha256, xet hash) as JSON; Import stages
//    another participant's. token() is the base commit.
//  - A capturing transaction (options.capture_filesystem_writes, or
//    BeginHubTransaction) also routes every write, remove or rename through this
//    FileSystem below its root into it, and reads through this FileSystem see
//    the staged files (read-your-writes).
//  - Folders are implied by file paths: CreateDirectories and SyncDirectory
//    are no-ops; List of a folder with no files is NotFound; Stat of a
//    folder reports is_directory. Rename is a commit (copy + delete, no bytes
//    move) within one repo branch or bucket.
// Thread-safety: as fs::FileSystem (every method from any thread).
#ifndef MEGACKPT_HUB_MEGA_FS_H_
#define MEGACKPT_HUB_MEGA_FS_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "megackpt/fs/filesystem.h"
#include "megackpt/hub/client.h"
#include "megackpt/hub/transaction.h"

namespace megackpt::hub {

class MegaFileSystem : public fs::FileSystem {
 public:
  ~MegaFileSystem() override = default;

  HubConnection& hub() { return *hub_; }
  std::shared_ptr<HubConnection> hub_ptr() { return hub_; }

  // The hub-level form of a capturing transaction: starts a HubTransaction
  // whose root is `root_uri` (a repo URI with a branch revision, default main,
  // or a bucket URI; a whole repository is fine here) and routes this
  // FileSystem's writes below the root into it until it commits or aborts.
  // Several transactions may be open on disjoint roots; FailedPrecondition for
  // an overlapping one. Errors of HubTransaction::Begin otherwise.
  virtual Result<std::shared_ptr<HubTransaction>> BeginHubTransaction(
      std::string_view root_uri, TransactionOptions options = {}, std::string base_commit = "") = 0;

 protected:
  explicit MegaFileSystem(std::shared_ptr<HubConnection> hub) : hub_(std::move(hub)) {}
  std::shared_ptr<HubConnection> hub_;
};

// A mega:// filesystem over `hub`.
std::shared_ptr<MegaFileSystem> NewMegaFileSystem(std::shared_ptr<HubConnection> hub);

// The shared mega:// filesystem for `endpoint` ("" = the environment's, see
// ConnectHub); one instance per (endpoint, token) per process.
Result<std::shared_ptr<MegaFileSystem>> MegaFileSystemFor(
    std::string_view endpoint = "", std::optional<std::string> token = std::nullopt);

// Registers the "mega" scheme with fs::RegisterFileSystemScheme: mega:// paths
// are checked with ParseMegaUri (InvalidArgument naming the bad part) and served
// by MegaFileSystemFor(). Idempotent and thread-safe. It runs by itself before
// main() in every program linked against megackpt::hub through CMake or
// pkg-config (their link flags keep the registering object,
// megackpt_hub_mega_scheme_registered, in the link); a program linked some other
// way calls it once itself.
void RegisterMegaScheme();

}  // namespace megackpt::hub

#endif  // MEGACKPT_HUB_MEGA_FS_H_
