// HubStore: the hub's storage engine, used in-process by `mega://` in embedded
// mode and by the `megahub` server. Metadata in SQLite (WAL, one transaction
// per change, writers take the lock up front with BEGIN IMMEDIATE), file
// content in the CAS engine (local backend). Layout under the root folder
// (created 0700, hub.db and its -wal/-shm 0600: they hold token hashes and
// the key that signs CAS tokens):
//
//   ROOT/hub.db (+ -wal, -shm)   SQLite metadata (schema: src/hub/store_schema.h)
//   ROOT/cas/                    CAS local store (xorbs, reconstructions, index)
//   ROOT/uploads/<id>/           parts of resumable multipart uploads
//
// Several processes may open the same root at once (e.g. ranks of a job in
// embedded mode, or megahub plus the CLI); they never corrupt it: every
// metadata change is one SQLite transaction and CAS objects are immutable.
//
// Thread-safety: all methods are thread-safe.
#ifndef MEGACKPT_HUB_STORE_H_
#define MEGACKPT_HUB_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/cas/store.h"
#include "megackpt/core/file.h"
#include "megackpt/core/status.h"
#include "megackpt/hub/types.h"

namespace megackpt::hub {

// A WritableFile that streams bytes into a CAS upload while hashing them with
// SHA-256 (no temporary copy). After Close(), entry() describes the content
// (path left empty).
class ContentUpload : public WritableFile {
 public:
  // REQUIRES: stream is a fresh upload of some CasStore.
  ContentUpload(std::string name, std::unique_ptr<cas::UploadStream> stream);
  ~ContentUpload() override;
  const std::string& name() const override { return name_; }
  Status Append(std::span<const std::byte> data) override;
  uint64_t size() const override { return size_; }
  Status Sync() override { return Status::OK(); }
  Status Close() override;
  // REQUIRES: Close() returned OK.
  const FileEntry& entry() const { return entry_; }
  // Upload statistics (new bytes etc.); REQUIRES: Close() returned OK.
  const cas::FileUploadResult& result() const { return result_; }

  // Called by Close() after the content is stored (e.g. to record it in the
  // hub); its error becomes Close()'s error.
  using OnClose = std::function<Status(const FileEntry&, const cas::FileUploadResult&)>;
  void set_on_close(OnClose fn) { on_close_ = std::move(fn); }

 private:
  std::string name_;
  std::unique_ptr<cas::UploadStream> stream_;
  struct ShaState;
  std::unique_ptr<ShaState> sha_;
  uint64_t size_ = 0;
  bool closed_ = false;
  FileEntry entry_;
  cas::FileUploadResult result_;
  OnClose on_close_;
};

// Opens a stored file for random-access reads: each ReadAt downloads only the
// xorb ranges it covers. Empty files need no CAS object. `name` is for messages.
Result<std::unique_ptr<RandomAccessFile>> OpenCasContent(cas::CasStore& cas, const FileEntry& entry,
                                                         std::string name);

struct HubStoreOptions {
  // fsync CAS objects (the SQLite database is always synchronous=FULL).
  bool sync = true;
  // SQLite connections kept open for concurrent readers.
  int db_connections = 8;
  // CAS client options (threads, compression).
  cas::CasStoreOptions cas;
};

struct GcReport {
  uint64_t live_files = 0;
  cas::GcResult cas;
  uint64_t expired_uploads = 0;  // staged content / multipart uploads dropped
};

class HubStore {
 public:
  // Opens (creating) a hub root folder.
  static Result<std::unique_ptr<HubStore>> Open(const std::string& root,
                                                const HubStoreOptions& options = {});
  ~HubStore();

  const std::string& root() const { return root_; }
  cas::CasStore& cas() { return *cas_; }

  // ---- repositories ----
  // Creates a repo with a `main` branch at an empty initial commit.
  // AlreadyExists when present (any type) unless exist_ok (then returns it).
  // InvalidArgument for a bad namespace/name.
  Result<RepoInfo> CreateRepo(const RepoSpec& spec, bool exist_ok = false);
  // NotFound "repo 'ns/name' not found".
  Result<RepoInfo> GetRepo(std::string_view repo);
  // Deletes the repo and its commits (content is freed by the next GC).
  Status DeleteRepo(std::string_view repo);
  // Repos ordered by id ("ns/name"), starting after `after`.
  Result<std::vector<RepoInfo>> ListRepos(std::string_view owner, std::string_view after,
                                          size_t limit);

  // ---- refs and commits ----
  // A branch, a tag or a full commit id (40 hex) of this repo -> commit id.
  // Branches win over tags. NotFound naming the revision.
  Result<std::string> ResolveRevision(std::string_view repo, std::string_view revision);
  Result<std::vector<RefInfo>> ListRefs(std::string_view repo);
  // Creates a branch or tag at `revision`. AlreadyExists unless exist_ok.
  Result<RefInfo> CreateRef(std::string_view repo, std::string_view name, std::string_view revision,
                            bool is_tag, bool exist_ok = false,
                            std::optional<std::string> message = std::nullopt);
  // NotFound when missing. Deleting the last branch is allowed.
  Status DeleteRef(std::string_view repo, std::string_view name, bool is_tag);

  // The commit `revision` resolves to, with its changes when with_changes.
  Result<CommitInfo> GetCommit(std::string_view repo, std::string_view revision,
                               bool with_changes = true);
  // History from `revision` back to the root, newest first, [offset, offset+limit).
  Result<std::vector<CommitInfo>> ListCommits(std::string_view repo, std::string_view revision,
                                              size_t offset, size_t limit);
  // Files of a commit (commit id, not revision) sorted by path; only paths
  // starting with `prefix` and sorting after `after`; at most `limit`.
  Result<std::vector<FileEntry>> ListFiles(std::string_view repo, std::string_view commit_id,
                                           std::string_view prefix = "",
                                           std::string_view after = "", size_t limit = SIZE_MAX);
  // NotFound "entry 'p' not found in ns/name at <commit>".
  Result<FileEntry> GetFile(std::string_view repo, std::string_view commit_id,
                            std::string_view path);

  // Applies a commit atomically (one SQLite transaction). Errors:
  //  Aborted "conflict: ..." when request.parent is set, the branch moved, and
  //    either !rebase or a touched path changed in between;
  //  NotFound for a missing repo/branch/deleted path/copy source;
  //  FailedPrecondition when an added entry's content is not in the CAS;
  //  InvalidArgument for a bad path (.., absolute, empty segment, a segment
  //    longer than 255 bytes).
  // A content hash the request's `access` may not read fails exactly like an
  // unknown one. When the branch exists and the operations leave its tree
  // unchanged, no commit is made: the answer is the head with no_change set.
  Result<CommitInfo> Commit(const CommitRequest& request);

  // ---- content ----
  // Starts a streaming upload into the CAS. Close() records the content
  // (RecordContent with a verified SHA-256 and `grant_ns`), which keeps it
  // from GC until committed or the grace period ends.
  Result<std::unique_ptr<ContentUpload>> BeginUpload(
      std::string name = "upload", std::optional<std::string> grant_ns = std::nullopt);
  // Remembers uploaded content (size, xet hash, sha256). `sha256_verified`:
  // the hub computed the SHA-256 itself, so FindBySha256 may return it.
  // `grant_ns`: the uploader is limited to that namespace, which may then name
  // this content (ContentAccess) for the GC grace period.
  // FailedPrecondition when the CAS does not hold entry.xet_hash.
  Status RecordContent(const FileEntry& entry, bool sha256_verified,
                       std::optional<std::string> grant_ns = std::nullopt);
  // Content previously recorded with a verified SHA-256 (blob staging) that
  // `access` may read, or nullopt (unknown and unreadable alike). With
  // `claimed_in_ns`, content whose SHA-256 was only claimed by its uploader
  // (a Xet shard's metadata) also answers when it was uploaded with a grant
  // to that namespace within the GC grace period: the claim is trusted only
  // by the namespace whose writers made it (NDJSON `lfsFile` lines naming what
  // hf_xet just uploaded for that repository). Verified content wins.
  Result<std::optional<FileEntry>> FindBySha256(
      std::string_view sha256, const ContentAccess& access = {},
      std::optional<std::string> claimed_in_ns = std::nullopt);
  // Global dedup: the other xorbs of the (at most 16 newest) recorded files
  // that use `xorb` and that `access` may read, at most `max_xorbs`, not
  // `xorb` itself. A client that learns one chunk of a file this way can
  // deduplicate against the rest of it (Xet's dedup answers name a shard's
  // xorbs, not only the chunk's). Unreadable files contribute nothing.
  Result<std::vector<cas::MerkleHash>> DedupCompanionXorbs(const cas::MerkleHash& xorb,
                                                           const ContentAccess& access,
                                                           size_t max_xorbs);
  // Whether the CAS holds the content (always true for empty files).
  Result<bool> HasContent(std::string_view xet_hash);
  Result<std::unique_ptr<RandomAccessFile>> OpenContent(const FileEntry& entry, std::string name);

  // ---- buckets ----
  // AlreadyExists when present unless exist_ok.
  Result<BucketInfo> CreateBucket(std::string_view ns, std::string_view name, bool is_private,
                                  bool exist_ok = false);
  Result<BucketInfo> GetBucket(std::string_view bucket);
  Status DeleteBucket(std::string_view bucket);
  // Applies adds/deletes in one transaction (last writer wins per path).
  // FailedPrecondition when an added xet hash is not in the CAS (or `access`
  // may not read it: the same error); a delete of a missing path is ignored.
  Status BucketBatch(std::string_view bucket, const std::vector<BucketOperation>& ops,
                     const ContentAccess& access = {});
  // Entries sorted by path, with `prefix`, after `after`, at most `limit`.
  Result<std::vector<BucketEntry>> ListBucket(std::string_view bucket, std::string_view prefix,
                                              std::string_view after, size_t limit);
  // NotFound "entry 'p' not found in bucket ns/name".
  Result<BucketEntry> GetBucketEntry(std::string_view bucket, std::string_view path);

  // ---- multipart uploads (/api/uploads) ----
  struct MultipartUpload {
    std::string id;
    std::string repo, path, revision, sha256;
    uint64_t size = 0, part_size = 0;
    bool stage_only = true;
  };
  Result<MultipartUpload> CreateMultipartUpload(MultipartUpload spec);
  Result<MultipartUpload> GetMultipartUpload(std::string_view id);
  // (part_number, etag) of the stored parts, ascending.
  Result<std::vector<std::pair<int, std::string>>> ListUploadParts(std::string_view id);
  // Receives one part: Append the bytes, then Finish, which stores the part
  // (replacing an earlier one of the same number) and returns its etag.
  // InvalidArgument from Finish when the part has not exactly
  // `expected_size` bytes (nothing is stored then).
  class PartWriter {
   public:
    virtual ~PartWriter() = default;
    virtual Status Append(std::span<const std::byte> data) = 0;
    virtual Result<std::string> Finish() = 0;
  };
  Result<std::unique_ptr<PartWriter>> BeginUploadPart(std::string_view id, int part_number,
                                                      uint64_t expected_size);
  // Streams the parts (which must be exactly `parts`, in order, with those
  // etags) into the CAS, checks size and SHA-256 against the upload's
  // declaration (DataLoss on a mismatch), records the content (with
  // `grant_ns`, see RecordContent) and deletes the parts. Returns the
  // content entry (path = the upload's path).
  Result<FileEntry> CompleteMultipartUpload(std::string_view id,
                                            const std::vector<std::pair<int, std::string>>& parts,
                                            std::optional<std::string> grant_ns = std::nullopt);
  Status DeleteMultipartUpload(std::string_view id);

  // ---- tokens ----
  // Creates a token and returns its secret text ("mega_..."); only its
  // SHA-256 is stored.
  Result<std::string> CreateToken(TokenScope scope, std::optional<std::string> ns,
                                  std::string description = "");
  // Unauthenticated when unknown.
  Result<TokenInfo> Authenticate(std::string_view token);
  // A random secret kept in the database (signs short-lived CAS tokens).
  Result<std::string> ServerSecret();

  // ---- maintenance ----
  // Deletes CAS content no commit, bucket or recent upload references.
  // Content recorded less than `grace_seconds` ago is kept (uploads not yet
  // committed). Blocks writers while it runs.
  Result<GcReport> CollectGarbage(double grace_seconds = 3600);

 private:
  HubStore() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string root_;
  std::unique_ptr<cas::CasStore> cas_;
};

}  // namespace megackpt::hub

#endif  // MEGACKPT_HUB_STORE_H_
