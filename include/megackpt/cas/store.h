// The content-addressed store: backends that hold xorbs, file reconstructions
// and the dedup index, and CasStore, the client that uploads files (chunk →
// hash → dedup → pack → write xorbs, then the reconstruction) and downloads
// whole files or byte ranges (fetching only the xorb ranges that cover them and
// checking every byte against its chunk hash).
//
// Layering: CasStore talks only to a CasBackend. The local-directory backend is
// here; the hub adds a remote (HTTP) backend implementing the same interface.
// On-disk layout, formats, dedup and GC rules: docs/cas.md.
//
// Thread-safety: CasBackend implementations and CasStore are thread-safe
// (several uploads/downloads may run at once). An UploadStream is used by one
// thread at a time.
#ifndef MEGACKPT_CAS_STORE_H_
#define MEGACKPT_CAS_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/cas/hash.h"
#include "megackpt/cas/reconstruction.h"
#include "megackpt/core/file.h"
#include "megackpt/core/status.h"
#include "megackpt/core/thread_pool.h"

namespace megackpt::cas {

// ---------------------------------------------------------------------------
// Backend interface
// ---------------------------------------------------------------------------

// Store-wide advisory locks coordinating writers (across processes for the
// local backend). Released when the returned object is destroyed.
enum class StoreLockKind {
  // Held (shared) by an upload from its first dedup lookup until its
  // reconstruction is stored, so a GC cannot delete xorbs it references.
  kUpload,
  // Exclusive counterpart of kUpload, held by GarbageCollect.
  kCollect,
  // Exclusive, held briefly while an upload re-checks the dedup index and
  // writes one xorb, so that concurrent uploaders of the same content store
  // each chunk once.
  kCommit,
};

class StoreLock {
 public:
  virtual ~StoreLock() = default;
};

// Where xorbs, file reconstructions and the dedup index live. All methods are
// thread-safe. Hashes name content, so every Put is idempotent.
class CasBackend {
 public:
  virtual ~CasBackend() = default;

  // For messages, e.g. "local CAS store /data/cas" or "hub http://host:port".
  virtual std::string Describe() const = 0;

  // ---- xorbs ----
  // Stores a serialized xorb (chunk records only, no footer) whose chunks are
  // described by `layout` (layout.xorb_hash names it). Returns true when this
  // call stored it, false when it was already present (content unchanged).
  // After OK the xorb is durable (unless the backend was opened without sync)
  // and its chunks are in the dedup index.
  // InvalidArgument when layout.serialized_bytes != serialized.size() or the
  // layout is invalid.
  virtual Result<bool> PutXorb(std::string_view serialized, const XorbLayout& layout) = 0;

  // Optional two-phase PutXorb, so that the slow part (writing and syncing
  // the bytes) runs outside the store's kCommit lock and concurrent uploads
  // overlap: StageXorb writes the xorb durably where no reader sees it (same
  // arguments and errors as PutXorb; nullptr = this backend does not stage);
  // PublishStagedXorb then makes it visible exactly as PutXorb would (same
  // result and guarantees). Dropping a StagedXorb unpublished discards it.
  class StagedXorb {
   public:
    virtual ~StagedXorb() = default;
  };
  virtual Result<std::unique_ptr<StagedXorb>> StageXorb(std::string_view serialized,
                                                        const XorbLayout& layout) {
    (void)serialized;
    (void)layout;
    return std::unique_ptr<StagedXorb>();
  }
  // REQUIRES: `staged` came from this backend's StageXorb for this layout, or is
  // nullptr (then this is PutXorb(serialized, layout)).
  virtual Result<bool> PublishStagedXorb(std::unique_ptr<StagedXorb> staged,
                                         std::string_view serialized, const XorbLayout& layout) {
    (void)staged;
    return PutXorb(serialized, layout);
  }

  virtual Result<bool> HasXorb(const MerkleHash& xorb_hash) = 0;
  // Bytes [offset, offset+length) of the serialized chunk records. NotFound
  // when the xorb is missing; OutOfRange when the range passes its end.
  virtual Result<std::string> GetXorbRange(const MerkleHash& xorb_hash, uint64_t offset,
                                           uint64_t length) = 0;
  // Reads bytes [offset, offset + dst.size()) of the serialized chunk records
  // into dst (no allocation). Same errors as GetXorbRange. Default:
  // GetXorbRange + copy.
  virtual Status ReadXorbRange(const MerkleHash& xorb_hash, uint64_t offset,
                               std::span<std::byte> dst);
  // The whole serialized xorb (chunk records only, as uploaded).
  virtual Result<std::string> GetXorb(const MerkleHash& xorb_hash) = 0;
  // Chunk hashes and record offsets of a stored xorb. NotFound when missing;
  // DataLoss when the stored layout is corrupt.
  virtual Result<XorbLayout> GetXorbLayout(const MerkleHash& xorb_hash) = 0;
  // Every stored xorb, in no particular order.
  virtual Result<std::vector<MerkleHash>> ListXorbs() = 0;
  // Deletes xorbs and their dedup index entries. Missing xorbs are ignored.
  // REQUIRES: the caller holds the kCollect lock (no upload is relying on them).
  virtual Status DeleteXorbs(std::span<const MerkleHash> xorb_hashes) = 0;
  // Size in bytes of a stored xorb's chunk records. NotFound when missing.
  virtual Result<uint64_t> XorbSize(const MerkleHash& xorb_hash) = 0;

  // ---- file reconstructions ----
  // Stores a reconstruction under recon.file_hash; a record already stored
  // under that hash is kept (same hash, same bytes). FailedPrecondition naming the xorb when a
  // referenced xorb is not stored (xorbs are written before the reconstructions that use them);
  // InvalidArgument when recon.Validate() fails.
  virtual Status PutFile(const FileReconstruction& recon) = 0;
  // NotFound naming the hash when no such file is stored.
  virtual Result<FileReconstruction> GetFile(const MerkleHash& file_hash) = 0;
  virtual Result<bool> HasFile(const MerkleHash& file_hash) = 0;
  virtual Result<std::vector<MerkleHash>> ListFiles() = 0;
  // Missing files are ignored.
  virtual Status DeleteFiles(std::span<const MerkleHash> file_hashes) = 0;

  // ---- dedup index ----
  // For each chunk hash, where a stored copy is (any one if several), or
  // nullopt. The result has chunk_hashes.size() entries. Sees every xorb whose
  // PutXorb returned before the call (also from other processes).
  virtual Result<std::vector<std::optional<ChunkLocation>>> LookupChunks(
      std::span<const MerkleHash> chunk_hashes) = 0;

  // ---- coordination ----
  // Blocks until the lock is held. Default: a no-op lock (backends whose
  // server serialises writes itself).
  virtual Result<std::unique_ptr<StoreLock>> Lock(StoreLockKind kind);

  // Seconds since the xorb was stored (for GC grace periods); default 1e30
  // (always old enough).
  virtual Result<double> XorbAgeSeconds(const MerkleHash& xorb_hash);
};

struct LocalBackendOptions {
  // Create the folder (and its subfolders) when it does not exist.
  bool create = true;
  // fsync xorbs, reconstructions and folders before reporting success.
  bool sync = true;
};

// A store in a local folder (layout in docs/cas.md):
//   DIR/CAS_STORE            marker "megackpt-cas 1"
//   DIR/xorbs/<2 hex>/<hex>  serialized xorb + footer (chunk hashes, offsets)
//   DIR/files/<hex>          file reconstruction (an MDB shard v2 with one file)
//   DIR/index/chunks.idx     append-only dedup index records
//   DIR/locks/*.lock         flock(2) lock files
//   DIR/tmp/                 temp files, renamed into place
// Safe for several processes at once: objects are written to tmp/, fsynced and
// linked into place (an existing object wins; identical by construction).
// NotFound when the folder is missing and !create; FailedPrecondition when it
// exists, is not empty and is not a CAS store.
Result<std::shared_ptr<CasBackend>> OpenLocalBackend(const std::string& dir,
                                                     const LocalBackendOptions& options = {});

// Whether local backends write large synced xorbs (>= 1 MiB) with O_DIRECT,
// bypassing the page cache (docs/cas.md §4): on unless the environment sets
// MEGACKPT_CAS_DIRECT_IO=0; read at every such write. Reads of those xorbs
// right after the write then come from the device.
bool LocalXorbWritesUseDirectIo();

// ---------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------

struct CasStoreOptions {
  // Pool for hashing/compressing chunks; nullptr → ThreadPool::Default().
  ThreadPool* pool = nullptr;
  // Threads one upload keeps busy, counting the caller's: 1 = everything on
  // the caller's thread; N > 1 = the caller chunks while a background stage
  // hashes and compresses on N - 1 threads (pool threads beyond the first).
  // Downloads decode chunks on up to this many threads.
  int upload_threads = 2;
  // Try LZ4 / BG4+LZ4 per chunk (stored compressed only when smaller).
  bool compress = true;
  // Key of the final file-hash step; Xet's default is 32 zero bytes.
  MerkleHash file_hash_salt;
  // Xorb limits (the protocol's maxima are 64 MiB and 8192 chunks).
  uint32_t max_xorb_bytes = 64u << 20;
  uint32_t max_xorb_chunks = 8192;
};

struct UploadOptions {
  // Name for messages and WritableFile::name() (e.g. the source path).
  std::string name = "upload";
  // Called now and then from the uploading thread with the bytes consumed.
  std::function<void(uint64_t bytes_done)> progress;
};

struct FileUploadResult {
  MerkleHash file_hash;
  uint64_t size = 0;          // bytes of the file
  uint64_t new_bytes = 0;     // uncompressed bytes of chunks not stored before
  uint64_t chunks = 0;        // chunks of the file
  uint64_t new_chunks = 0;    // chunks not stored before (each stored once)
  uint64_t new_xorbs = 0;     // xorbs this upload wrote
  uint64_t stored_bytes = 0;  // serialized (compressed) bytes of the new chunks
  FileReconstruction reconstruction;
};

// A file being uploaded piece by piece. Is-a WritableFile so a writer can
// stream a checkpoint shard straight into the store (no temp file): Append
// bytes, then Close()/Finish(). Chunk boundaries do not depend on how the
// bytes are split across Append calls. Xorbs are written as they fill, the
// reconstruction at Finish. Destroying an unfinished stream abandons it
// (already written xorbs stay until a GC removes them).
class UploadStream : public WritableFile {
 public:
  const std::string& name() const override = 0;
  // Consumes bytes. After an error the stream is failed: every later call
  // returns the same error.
  Status Append(std::span<const std::byte> data) override = 0;
  uint64_t size() const override = 0;
  // A no-op: bytes are durable once Finish/Close returns OK.
  Status Sync() override { return Status::OK(); }
  // Flushes the last chunk and xorb, stores the reconstruction, returns the
  // result. May be called once (later calls: FailedPrecondition).
  virtual Result<FileUploadResult> Finish() = 0;
  // Finish() keeping the result for result().
  Status Close() override = 0;
  // The result of Close(); nullptr before a successful Close()/Finish().
  virtual const FileUploadResult* result() const = 0;
};

// A byte range of a file: [offset, offset + length). Ranges reaching past the
// end are clipped; offset > file size is OutOfRange.
struct ByteRange {
  static constexpr uint64_t kToEnd = std::numeric_limits<uint64_t>::max();
  uint64_t offset = 0;
  uint64_t length = kToEnd;
};

// Receives downloaded bytes in order. A non-OK status aborts the download.
using ByteSink = std::function<Status(std::span<const std::byte>)>;

struct StoreStats {
  uint64_t files = 0;
  uint64_t logical_bytes = 0;  // sum of stored files' sizes
  uint64_t xorbs = 0;
  uint64_t chunks = 0;            // chunks in xorbs
  uint64_t unpacked_bytes = 0;    // uncompressed bytes of all stored chunks
  uint64_t stored_bytes = 0;      // serialized bytes of all xorbs
  uint64_t referenced_xorbs = 0;  // xorbs used by at least one stored file
  // logical_bytes / unpacked_bytes (1 when nothing is shared); 0 when empty.
  double dedup_ratio() const {
    return unpacked_bytes ? static_cast<double>(logical_bytes) / unpacked_bytes : 0;
  }
  double compression_ratio() const {
    return stored_bytes ? static_cast<double>(unpacked_bytes) / stored_bytes : 0;
  }
};

struct GcOptions {
  // Files to keep. Unset: every stored file is live. Set: stored files not in
  // the list are deleted too. A listed file that is not stored is NotFound
  // (nothing is deleted).
  std::optional<std::vector<MerkleHash>> live_files;
  // Report what would be deleted without deleting.
  bool dry_run = false;
  // Keep unreferenced xorbs younger than this (uploads in flight elsewhere).
  double min_xorb_age_seconds = 0;
};

struct GcResult {
  uint64_t files_kept = 0, files_deleted = 0;
  uint64_t xorbs_kept = 0, xorbs_deleted = 0;
  uint64_t bytes_deleted = 0;  // serialized xorb bytes freed
};

class CasStore {
 public:
  static Result<std::unique_ptr<CasStore>> Open(std::shared_ptr<CasBackend> backend,
                                                const CasStoreOptions& options = {});
  // OpenLocalBackend(dir) + Open.
  static Result<std::unique_ptr<CasStore>> OpenLocal(const std::string& dir,
                                                     const CasStoreOptions& options = {},
                                                     const LocalBackendOptions& local = {});
  ~CasStore();

  CasBackend& backend() { return *backend_; }
  const CasStoreOptions& options() const { return options_; }

  // ---- upload ----
  Result<std::unique_ptr<UploadStream>> BeginUpload(const UploadOptions& options = {});
  Result<FileUploadResult> Upload(std::span<const std::byte> data,
                                  const UploadOptions& options = {});
  // Reads a local file in large blocks and uploads it.
  Result<FileUploadResult> UploadFile(const std::string& path, const UploadOptions& options = {});
  Result<FileUploadResult> UploadFile(const RandomAccessFile& file,
                                      const UploadOptions& options = {});

  // ---- download ----
  // Streams `range` of the file to `sink`, fetching only the xorb byte ranges
  // of the chunks that overlap it. Every chunk is checked against its hash:
  // DataLoss "xorb <hex> chunk <i>: ..." on a mismatch or a malformed record
  // (no wrong byte reaches the sink from that chunk). NotFound for an unknown
  // file or a missing xorb; OutOfRange when range.offset > size.
  Status Download(const MerkleHash& file_hash, ByteRange range, const ByteSink& sink);
  // Download into memory.
  Result<std::string> Read(const MerkleHash& file_hash, ByteRange range = {});
  // Download into a local file (created/truncated; atomic rename when done).
  Status DownloadToFile(const MerkleHash& file_hash, const std::string& path, ByteRange range = {});
  // Random access to a stored file; each ReadAt fetches only what it covers
  // (the last decoded chunks are cached).
  Result<std::unique_ptr<RandomAccessFile>> OpenFile(const MerkleHash& file_hash);

  // ---- metadata and maintenance ----
  Result<FileReconstruction> GetReconstruction(const MerkleHash& file_hash);
  Result<bool> HasFile(const MerkleHash& file_hash);
  Result<StoreStats> Stat();
  // Deletes xorbs no live file references (see GcOptions); holds the kCollect
  // lock so concurrent uploads either finish first or start after.
  // REQUIRES: the calling thread holds no unfinished UploadStream of this store
  // (it would wait for itself).
  Result<GcResult> GarbageCollect(const GcOptions& options = {});
  // Re-reads every stored chunk and checks it against its hash, and every
  // file's terms against the xorb layouts. DataLoss naming the first bad
  // xorb/chunk or file.
  Status Verify();

 private:
  CasStore(std::shared_ptr<CasBackend> backend, const CasStoreOptions& options);
  friend class UploadStreamImpl;
  std::shared_ptr<CasBackend> backend_;
  CasStoreOptions options_;
};

}  // namespace megackpt::cas

#endif  // MEGACKPT_CAS_STORE_H_
