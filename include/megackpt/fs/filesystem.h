// The filesystem seam: every checkpoint reader/writer reaches storage through a
// FileSystem, so the same code saves to a local folder and to `mega://` paths.
//
// Implementations: LocalFileSystem() here (POSIX: pread/pwrite, mmap, fsync,
// atomic rename), and the mega:// filesystem of the hub layer
// (megackpt/hub/mega_fs.h), which registers itself for the "mega" scheme (see
// RegisterFileSystemScheme). Code below the hub (this layer, format, dcp) never
// names the hub: FileSystemForPath picks the implementation by the path's scheme.
//
// Paths are full paths or URIs ("scheme://..."). Visibility and durability rules
// every implementation follows:
//  - A file opened with OpenForWrite becomes visible at its path only after
//    Close() returns OK (local: written in place; callers who need atomic
//    replacement use WriteAtomically or a Transaction).
//  - Several files that must appear together (a checkpoint) are written inside a
//    Transaction (BeginTransaction): nothing of it counts as committed before
//    Commit, and a crash at any instant leaves the old or the new state.
//
// Thread-safety: every FileSystem method may be called from several threads at
// once (implementations are internally synchronized or stateless). A returned
// WritableFile is used by one thread at a time (WriteAt on disjoint ranges
// excepted, see core/file.h); a RandomAccessFile by any number of threads.
//
// Errors (Status codes, messages naming the path): NotFound for a missing file or
// folder; InvalidArgument for a malformed path or URI; PermissionDenied/IOError
// from the OS or the store; FailedPrecondition when the operation is not possible
// in the current state (e.g. a read-only revision); Unimplemented when the store
// cannot do it at all (see capabilities()).
#ifndef MEGACKPT_FS_FILESYSTEM_H_
#define MEGACKPT_FS_FILESYSTEM_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/file.h"
#include "megackpt/core/status.h"

namespace megackpt::fs {

struct FileInfo {
  std::string path;  // full path or URI
  uint64_t size = 0;
  bool is_directory = false;
};

// What a FileSystem can do, so callers pick a strategy up front instead of
// trying and reading an error code.
struct FileSystemCapabilities {
  // Files from OpenForWrite and Transaction::OpenForWrite support WriteAt
  // (positioned writes, any order, several threads). False: sequential sinks
  // (Append only), e.g. an upload stream.
  bool positioned_writes = false;
  // Transactions are isolated: their files stay invisible to every other
  // reader -- even under the names of committed files -- until Commit, which
  // publishes all of them at once (the hub: one commit). False: a transaction's
  // OpenForWrite files are written in place under their final names (the caller
  // picks names the committed state does not use) and its Puts land one by one at
  // Commit, in order, the last one being the commit point.
  bool isolated_transactions = false;
  // Rename replaces its target atomically.
  bool atomic_rename = false;
  // Link makes hard links (a second name of the same file).
  bool hard_links = false;
  // Name lookups (Exists) are answered from a kernel cache once made: a lookup
  // made early, while the folder is idle, saves a later one from reading the
  // folder from the device (WriteOutNewEntries in dcp/checkpoint_folder.h).
  // False: a lookup fills no cache (the hub: each one is a round trip).
  bool cached_name_lookups = false;
};

struct TransactionOptions {
  // Describes the change; stores with history record it (the hub commit's
  // message and description). Default: "megackpt: update <root>".
  std::string message;
  std::string description;
  // "" = based on the root's current state. Otherwise a token naming the state
  // to build on: another participant's Transaction::token() (ranks joining the
  // coordinator's save: what they write and Export is committed by the
  // coordinator, who Imports it), or the id a previous Commit() returned (a
  // follow-up transaction on top of that commit).
  std::string base;
  // Stores with history: when the root's branch moved past the base by Commit
  // time, commit on top of the new state as long as no path this transaction
  // touches changed there (otherwise Commit fails with Aborted).
  bool rebase = false;
  // Make the committed files and folder entries durable (fsync) before Commit
  // returns. False: atomic against process crashes, not against power loss.
  bool sync = true;
  // Also route writes, removes and renames made through the FileSystem itself
  // (not through the Transaction) below the root into this transaction, and let
  // the FileSystem's reads below the root see them (read-your-writes) until it
  // commits or aborts. Honoured by isolated stores only: elsewhere such writes
  // land as they are made (the caller's own protocol keeps them safe).
  // FailedPrecondition at BeginTransaction when another capturing transaction of
  // this FileSystem overlaps the root.
  bool capture_filesystem_writes = false;
};

// What a transaction's writes cost the store. Stores that do not count report 0.
struct TransactionStats {
  uint64_t files_written = 0;  // files closed through OpenForWrite/Put
  uint64_t bytes_written = 0;  // their bytes
  // Bytes the store actually added after deduplication (the hub: serialized
  // xorbs new to its CAS, what travelled to a remote hub).
  uint64_t new_bytes = 0;
};

// A set of writes and removals below one root folder that commits all at once
// (isolated stores) or through an ordered commit point (local). Obtained from
// FileSystem::BeginTransaction.
//
// Guarantees (every implementation):
//  - Before Commit returns OK, nothing staged here is part of the committed
//    state: a reader that trusts the last Put (e.g. a checkpoint's .metadata)
//    keeps seeing the previous state, and Abort, a failed Commit or a crash
//    leaves it loadable. After Commit returns OK, all of it is.
//  - Paths are relative to root(): no leading '/', no "..".
//
// Multi-participant use (one commit for many ranks or processes): the
// coordinator begins, sends token() to the others; each begins with
// options.base = that token, writes its files, and sends Export() to the
// coordinator, which Imports every export and Commits once. A participant that
// exported does not commit; it just destroys its transaction.
//
// Thread-safety: OpenForWrite, Put, Remove and Import may be called from several
// threads at once; each returned WritableFile is used by one thread (WriteAt on
// disjoint ranges excepted). Commit and Abort are called once, by one thread,
// after the other calls returned.
//
// Destroying an open transaction without Commit or Abort is treated like a
// crash: nothing becomes committed, and files written in place (non-isolated
// stores) stay behind as leftovers for a later commit's clean-up.
class Transaction {
 public:
  virtual ~Transaction() = default;

  // The folder this transaction covers (as given to BeginTransaction, without a
  // trailing '/').
  virtual const std::string& root() const = 0;
  // root() as of the state this transaction builds on: read the previous
  // content there (the hub: pinned at the base commit; local: root()).
  virtual const std::string& base_root() const = 0;
  // What other participants pass as TransactionOptions::base to join this
  // transaction (the hub: the base commit id; "" where nothing is needed).
  virtual std::string token() const = 0;

  // Creates root/relative_path for writing (parent folders as needed). The file
  // is part of this transaction once Close() returns OK. Supports WriteAt when
  // the FileSystem's capabilities().positioned_writes. FailedPrecondition after
  // Commit/Abort; InvalidArgument for a bad relative path.
  virtual Result<std::unique_ptr<WritableFile>> OpenForWrite(std::string_view relative_path) = 0;
  // A whole small file (an index, a metadata record) written at or before
  // Commit, atomically (readers see the old or the new content). Isolated
  // stores publish Puts with everything else; local ones write them at Commit
  // in the order they were Put, the last Put being the commit point. A later
  // Put of the same path replaces the earlier one (and takes its turn at the
  // end of that order).
  virtual Status Put(std::string_view relative_path, std::string_view data) = 0;
  // Stages the removal of root/relative_path, applied at Commit after everything
  // else (a path missing by then is ignored). Local: removal failures after the
  // commit point are ignored (a later commit's clean-up retries).
  virtual Status Remove(std::string_view relative_path) = 0;

  // This participant's staged files, as an opaque token for Import by the
  // committing participant (see above). May be called several times; each
  // export holds everything staged so far, and importing one twice is harmless.
  virtual Result<std::string> Export() = 0;
  // Adds another participant's Export() to this transaction. InvalidArgument for
  // a malformed token or one naming paths outside root().
  virtual Status Import(std::string_view token) = 0;
  // Files written in this transaction so far (OpenForWrite, Put, Import),
  // relative to root(), sorted; removals excluded.
  virtual std::vector<std::string> staged_files() const = 0;

  virtual TransactionStats stats() const = 0;

  // Commits: afterwards every staged file is committed and every staged removal
  // done. Returns an id of the new state for TransactionOptions::base (the hub:
  // the commit id; "" for stores without history). Aborted when the base moved
  // and could not be rebased (a concurrent commit; nothing changed); other errors
  // leave the previous state committed. After Commit the transaction is closed;
  // a failed Commit discards it as Abort does.
  virtual Result<std::string> Commit() = 0;
  // Discards everything staged and removes what this participant wrote in
  // place (imports excluded). Idempotent; never fails.
  virtual void Abort() = 0;
  virtual bool is_open() const = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // "local" or the URI scheme it serves ("mega").
  virtual std::string_view scheme() const = 0;

  // What this filesystem can do (see FileSystemCapabilities). Default: nothing
  // optional.
  virtual FileSystemCapabilities capabilities() const { return {}; }

  // Opens an existing file for random-access reads (ranges are fetched on
  // demand; nothing is downloaded or read up front). NotFound when missing.
  virtual Result<std::unique_ptr<RandomAccessFile>> OpenForRead(const std::string& path) = 0;

  // Creates/truncates a file for writing. Parent folders are created as needed.
  virtual Result<std::unique_ptr<WritableFile>> OpenForWrite(const std::string& path) = 0;

  // Writes a whole small file so that readers see the old or the new content,
  // never a mix (local: temp + fsync + rename + folder fsync; the file it
  // replaces is freed off the caller's path, as RemoveGarbage frees large files).
  virtual Status WriteAtomically(const std::string& path, std::string_view data,
                                 bool sync = true) = 0;

  // Reads a whole file. NotFound when missing; ResourceExhausted above max_size.
  virtual Result<std::string> ReadWhole(const std::string& path, uint64_t max_size = 1ull << 32);

  // False (not an error) when missing.
  virtual Result<bool> Exists(const std::string& path) = 0;
  // NotFound when missing.
  virtual Result<FileInfo> Stat(const std::string& path) = 0;
  // Direct children of a folder, sorted by path. NotFound when the folder is missing.
  virtual Result<std::vector<FileInfo>> List(const std::string& dir) = 0;
  // Removes a file. NotFound when missing.
  virtual Status Remove(const std::string& path) = 0;
  // Removes files that nothing refers to any more (a superseded save's data
  // files, a retired step's files). Best effort: missing files are skipped and
  // failures ignored (whoever cleans the folder next finds the rest). The
  // names are gone when this returns, so new files may take them at once; the
  // space may be freed later. The local file system frees large files on a
  // background thread (it keeps each one open across its unlink and closes it
  // there): on file systems mounted with online discard, freeing a large file
  // costs more than writing it. Default: Remove, one file after another.
  virtual void RemoveGarbage(const std::vector<std::string>& paths);
  // Removes an empty folder. NotFound when missing; FailedPrecondition when it
  // still has children. The default, for stores whose folders exist only
  // through the files below them (mega://), checks that nothing is left.
  virtual Status RemoveDirectory(const std::string& dir);
  // Makes `new_path` a second name of the existing file `existing` (a hard
  // link: the file's data lives until its last name is removed). AlreadyExists
  // when `new_path` exists. Unimplemented (the default) where the store has no
  // links (mega://; see capabilities().hard_links).
  virtual Status Link(const std::string& existing, const std::string& new_path);
  virtual Status CreateDirectories(const std::string& dir) = 0;
  // Renames (replacing `to`; atomically when capabilities().atomic_rename).
  // Unimplemented where the store has no rename between these paths.
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // Makes creations/renames inside `dir` durable (local: fsync of the folder).
  virtual Status SyncDirectory(const std::string& dir) = 0;

  // A path naming what `path` names now and unaffected by later commits, for
  // reads that must all come from one state (a load): the hub replaces a branch
  // or tag revision by the commit id it points at. Stores without history return
  // `path`. NotFound when the revision does not exist.
  virtual Result<std::string> PinPath(const std::string& path) { return path; }

  // Begins a transaction over the folder `root` (see Transaction). The default
  // implementation is the in-place protocol over this FileSystem's own methods
  // (OpenForWrite, WriteAtomically, Remove, SyncDirectory, ReadWhole): the local
  // one, also right for wrappers that forward those methods. Isolated stores
  // override it. InvalidArgument for a root no transaction can cover (the hub: a
  // repository or bucket root, or a malformed URI); FailedPrecondition for a
  // read-only root (a tag or commit revision) or an overlapping capturing
  // transaction; errors of options.base as NotFound/InvalidArgument.
  // REQUIRES: this FileSystem outlives the returned transaction.
  virtual Result<std::unique_ptr<Transaction>> BeginTransaction(
      const std::string& root, const TransactionOptions& options = {});
};

// The POSIX filesystem. Shared; its only state is the process-wide background
// thread of RemoveGarbage.
std::shared_ptr<FileSystem> LocalFileSystem();

// Returns once the local file system's background thread has freed every file
// that RemoveGarbage handed to it in this process. Not needed for correctness
// (the names are gone already; at exit the kernel frees what is left); for
// callers that want the disk space back now.
void FinishBackgroundFrees();

// ---- schemes ---------------------------------------------------------------

// Makes the FileSystem for a "scheme://..." path. Called by FileSystemForPath
// with the whole path; may return a shared instance.
using FileSystemFactory = std::function<Result<std::shared_ptr<FileSystem>>(std::string_view path)>;

// Registers `factory` for paths starting with "<scheme>://" (scheme compared
// case-insensitively; a second registration replaces the first). Thread-safe;
// may be called from static initializers. The hub layer registers "mega" (see
// megackpt/hub/mega_fs.h: RegisterMegaScheme).
void RegisterFileSystemScheme(std::string_view scheme, FileSystemFactory factory);

// True when a factory is registered for `scheme`.
bool IsFileSystemSchemeRegistered(std::string_view scheme);

// The scheme of `path` ("mega" for "mega://..."), or "" for a plain local path.
std::string_view PathScheme(std::string_view path);

// LocalFileSystem for plain paths; the registered factory's filesystem for
// "scheme://..." paths. FailedPrecondition naming the scheme when none is
// registered (e.g. mega:// in a build without the hub); the factory's errors
// (InvalidArgument naming the bad part of a URI) otherwise.
Result<std::shared_ptr<FileSystem>> FileSystemForPath(std::string_view path);

// Joins with exactly one '/': JoinPath("a/", "b") == "a/b"; works for URIs.
std::string JoinPath(std::string_view base, std::string_view name);

}  // namespace megackpt::fs

#endif  // MEGACKPT_FS_FILESYSTEM_H_
