// MegaFileSystem: the FileSystem seam (megackpt/fs/filesystem.h) for `mega://` paths,
// over a HubConnection (embedded store or remote megahub). Implemented in
// src/fs/mega_fs.cc; FileSystemForPath("mega://...") returns the process's
// shared instance for the environment's endpoint (MEGA_ENDPOINT / MEGA_TOKEN /
// MEGA_HOME, see hub/client.h).
//
// Paths: `mega://[type/]ns/name[@rev]/path` and `mega://buckets/ns/name/path`.
//  - Reads resolve the revision once at OpenForRead: the file is pinned to
//    that commit even if the branch moves while it is read. Each ReadAt
//    fetches only the bytes it covers.
//  - Writes outside a transaction: a repo file becomes one commit on Close()
//    (landing on the branch head; Aborted only if the same path changed
//    concurrently); a bucket file is visible at once (last writer wins). The
//    repo/bucket is created when missing.
//  - Writes inside a transaction (BeginTransaction): every write, remove or
//    rename through this FileSystem below the transaction's root is staged
//    and lands in that transaction's single commit. Reads through this
//    FileSystem see the staged files (read-your-writes).
//  - Folders are implied by file paths: CreateDirectories and SyncDirectory
//    are no-ops; List of a folder with no files is NotFound; Stat of a
//    folder reports is_directory. Rename is a commit (copy + delete, no bytes
//    move) within one repo branch or bucket.
#ifndef MEGACKPT_HUB_MEGA_FS_H_
#define MEGACKPT_HUB_MEGA_FS_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/fs/filesystem.h"
#include "megackpt/hub/client.h"
#include "megackpt/hub/transaction.h"

namespace megackpt::hub {

class MegaFileSystem : public fs::FileSystem {
 public:
  ~MegaFileSystem() override = default;

  HubConnection& hub() { return *hub_; }
  std::shared_ptr<HubConnection> hub_ptr() { return hub_; }

  // Starts a transaction whose root is `root_uri` (a repo URI with a branch
  // revision, default main, or a bucket URI) and routes this FileSystem's
  // writes below the root into it until it commits or aborts (see above).
  // Several transactions may be open on disjoint roots.
  virtual Result<std::shared_ptr<HubTransaction>> BeginTransaction(
      std::string_view root_uri, TransactionOptions options = {}, std::string base_commit = "") = 0;

 protected:
  explicit MegaFileSystem(std::shared_ptr<HubConnection> hub) : hub_(std::move(hub)) {}
  std::shared_ptr<HubConnection> hub_;
};

// A mega:// filesystem over `hub`.
std::shared_ptr<MegaFileSystem> NewMegaFileSystem(std::shared_ptr<HubConnection> hub);

// The shared mega:// filesystem for `endpoint` ("" = the environment's, see
// ConnectHub); one instance per (endpoint, token) per process.
Result<std::shared_ptr<MegaFileSystem>> MegaFileSystemFor(std::string_view endpoint = "",
                                                          std::optional<std::string> token = std::nullopt);

// The MegaFileSystem behind `fs`, or nullptr when it is another filesystem.
inline MegaFileSystem* AsMegaFileSystem(fs::FileSystem* fs) { return dynamic_cast<MegaFileSystem*>(fs); }

}  // namespace megackpt::hub

#endif  // MEGACKPT_HUB_MEGA_FS_H_
