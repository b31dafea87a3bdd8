// MegaStorageWriter / MegaStorageReader: distributed checkpoints stored as MEGA
// (`.mega`) shards plus `model.mega.index.json`, the layout TensorPlay and
// megatensors read. docs/mega-storage.md has the full description: file naming,
// the commit protocol and why a crash at any instant leaves the previous or the
// new checkpoint (never a mix), the `tensorplay.dcp.*` shard keys, rebuilding
// Metadata from shard headers, consolidation and interop.
//
// A checkpoint folder written by MegaStorageWriter holds
//   model.mega | model-NNNNN-of-MMMMM.mega   shards (TensorPlay profile, CRC32 per
//                                           tensor); with a save id in the name
//                                           (model-<id>-NNNNN-of-MMMMM.mega) when
//                                           the plain names are taken; without a
//                                           mapping files_per_rank (default
//                                           thread_count) files per rank
//   model.mega.index.json                   weight_map of every whole entry, the
//                                           chunks of every sharded one
//   .metadata                               the encoded dcp Metadata; its rename is
//                                           the commit point
// Every stored piece (a whole tensor, one chunk of a sharded tensor, or a bytes
// value as a U8 tensor) is a tensor named by its fqn; its chunk offsets, global
// shape and kind are recorded in the shard's `tensorplay.dcp.entries` key, so
// Metadata can be rebuilt from the shard headers alone.
//
// MegaStorageReader reads those checkpoints, checkpoints whose `.metadata` is
// missing or unreadable (e.g. TensorPlay's pickle: Metadata is rebuilt from the
// index and shard headers) and Hugging Face layouts (`model.safetensors.index.json`
// + shards, or one `.safetensors` file), resharding into any destination layout.
// Paths may be local folders or mega:// URIs (through fs::FileSystemForPath, or
// any options.fs). Every save goes through ONE commit path over the
// filesystem's fs::Transaction (docs/mega-storage.md §4): every rank writes its
// shards inside its own transaction joined to the coordinator's, and the
// coordinator commits all of them with the index, .metadata and the removal of
// the previous checkpoint's stale files. Locally that is the in-place protocol
// (.metadata's rename is the commit point). On mega:// (§8) it is ONE hub
// commit: shards stream straight into the hub's CAS, the commit is
// parent-checked (a concurrent commit on the branch -> Aborted "conflict: branch
// '<b>' ..."), and abort, any error or a crash before the commit leaves the
// branch untouched; buckets: one batch. The reader pins the state
// (FileSystem::PinPath: one commit per load) and reads only the byte ranges each
// request needs.
#ifndef MEGACKPT_DCP_MEGA_STORAGE_H_
#define MEGACKPT_DCP_MEGA_STORAGE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/status.h"
#include "megackpt/dcp/metadata.h"
#include "megackpt/dcp/storage.h"
#include "megackpt/format/mega.h"
#include "megackpt/fs/filesystem.h"

namespace megackpt::dcp {

// Index file written next to the shards.
inline constexpr std::string_view kMegaStorageIndexName = "model.mega.index.json";
inline constexpr std::string_view kSafetensorsStorageIndexName = "model.safetensors.index.json";

// Shard header keys (MEGA metadata, or safetensors `__metadata__` entries).
//  tensorplay.dcp.version      UINT32 2 (2: the shard also carries the header
//                                      CRC and block CRCs, format/mega_encoder.h)
//  tensorplay.dcp.save_id      STRING  id of the save that wrote the file
//  tensorplay.dcp.entries      STRING  JSON {fqn: {"kind": "tensor"|"bytes",
//                                      "dtype": "F32", "global_shape": [..],
//                                      "offsets": [..]}} for every tensor of the file
//  tensorplay.dcp.object_paths STRING  JSON {fqn: [key or index, ...]} (nesting of
//                                      the fqns of this file, when nested)
inline constexpr std::string_view kDcpVersionKey = "tensorplay.dcp.version";
inline constexpr std::string_view kDcpSaveIdKey = "tensorplay.dcp.save_id";
inline constexpr std::string_view kDcpEntriesKey = "tensorplay.dcp.entries";
inline constexpr std::string_view kDcpObjectPathsKey = "tensorplay.dcp.object_paths";
inline constexpr uint32_t kDcpShardVersion = 2;
// Top-level member of model.mega.index.json listing sharded entries:
// {fqn: {"dtype", "shape", "chunks": [{"file", "offsets", "sizes"}]}}.
inline constexpr std::string_view kDcpIndexShardedKey = "tensorplay.dcp.sharded";

// fqn -> bucket number (1..N). Entries of bucket b go to files of bucket b;
// fqns absent from the mapping go to bucket 1.
using FqnToIndexMapping = std::map<std::string, int>;

enum class ConsolidateFormat { kMega, kSafetensors };

struct MegaStorageWriterOptions {
  // Worker threads per rank (files, or items of one file, are written in
  // parallel).
  int thread_count = 2;
  // Shard files per rank when no fqn_to_index_mapping is given (the default
  // bucket): 0 = automatic = thread_count; 1 = one file per rank (plus one per
  // further chunk of an fqn the rank holds twice). The rank's items are
  // balanced over the files by bytes (largest first onto the lightest file),
  // never more files than items; each writer thread then writes whole files,
  // so no two threads write one file at once (docs/mega-storage.md §1). An
  // explicit mapping ignores this: one file per bucket per rank. < 0 is
  // treated as 0.
  int files_per_rank = 0;
  // fsync every shard before the commit and the commit itself. False: faster,
  // atomic against process crashes but not durable across a power loss.
  bool sync = true;
  // False: saving where a committed checkpoint exists fails with AlreadyExists.
  bool overwrite = true;
  // Per-tensor checksum stored in the shards (kNone, kCrc32 or kSha256).
  format::MegaChecksumType checksum = format::MegaChecksumType::kCrc32;
  // Alignment of each tensor's payload within a shard (bytes).
  uint64_t tensor_alignment = 64;
  // After the commit, rewrite the checkpoint in place as whole tensors (one
  // entry per fqn; see consolidate.h). The sharded save is committed first, so a
  // failure or crash during consolidation leaves a loadable checkpoint.
  bool consolidate = false;
  ConsolidateFormat consolidate_format = ConsolidateFormat::kMega;
  // Largest consolidated file (0: one file, or one per mapping bucket).
  uint64_t consolidate_max_shard_size = 0;
  // With sync: ask each shard for direct I/O (WritableFile::UseDirectIo:
  // O_DIRECT, the page cache bypassed; files that cannot, e.g. on tmpfs or
  // mega://, are written as usual). Faster durable saves where new page-cache
  // pages are slow to come by (a VM whose free memory goes back to the host:
  // docs/benchmarks.md, "Direct-I/O durable writes"); a load right after reads
  // from the device. Ignored without sync.
  bool direct_io = false;
  // Filesystem to use; nullptr: FileSystemForPath(path).
  std::shared_ptr<fs::FileSystem> fs;
};

class MegaStorageWriter final : public StorageWriter {
 public:
  // `path`: the checkpoint folder (local path or mega:// URI).
  explicit MegaStorageWriter(std::string path,
                             std::optional<FqnToIndexMapping> fqn_to_index_mapping = std::nullopt,
                             MegaStorageWriterOptions options = {});
  ~MegaStorageWriter() override;

  Status Reset(std::string_view checkpoint_id) override;
  bool ValidateCheckpointId(std::string_view checkpoint_id) const override;
  Status SetUpStorageWriter(const StorageSetUp& setup) override;
  Result<SavePlan> PrepareLocalPlan(SavePlan plan) override;
  // Assigns every item a shard file. With a mapping: one file per (bucket,
  // rank, k) where k separates several chunks of one fqn held by one rank.
  // Without: options.files_per_rank files per rank (k = 0..F-1; a rank's items
  // balanced by bytes; a further file when every file holds the fqn already).
  // Files are numbered globally in (bucket, rank, k) order, so M in "-of-M" is
  // the global count. InvalidArgument for a mapping value < 1.
  Result<std::vector<SavePlan>> PrepareGlobalPlan(std::vector<SavePlan> plans) override;
  // Writes the items into their shards, in parallel: with at least as many
  // files in the call as threads, one task per file (its items in file order,
  // then its header), else items in parallel. A shard's header is written (and
  // the file fsynced) once all its items are in, so several calls with
  // disjoint subsets of the plan (async_save waves) are fine.
  Result<std::vector<WriteResult>> WriteData(const SavePlan& plan, SavePlanner& planner) override;
  // Commits the coordinator's transaction: imports every rank's export
  // (WriteResult::commit_token), stages the removal of the previous
  // checkpoint's files and of crashed saves' leftovers, Puts the index and
  // .metadata, commits (local: folder fsync, index, .metadata rename = the
  // commit point, removals). With options.consolidate, consolidates in place
  // after. FailedPrecondition when no save is in progress (aborted, or
  // PrepareGlobalPlan did not run on this writer).
  Status Finish(const Metadata& metadata,
                const std::vector<std::vector<WriteResult>>& results) override;
  // Aborts this rank's transaction (local: removes the files this rank created
  // in the current save) unless the committed .metadata references them.
  void Abort() override;
  std::optional<StorageMeta> GetStorageMeta() const override;

  // Stores with history (mega:// repos): the id of the commit the last
  // successful Finish made (the consolidation commit when consolidating); ""
  // otherwise (local paths, buckets, other ranks).
  std::string last_hub_commit() const;
  // This rank's uploads in its last save, as its transaction counts them
  // (fs::TransactionStats; mega://): bytes of the shards it wrote, and the bytes
  // that were new to the hub's CAS (what travelled to a remote hub after
  // deduplication). 0 for local paths (not counted).
  uint64_t hub_bytes_written() const;
  uint64_t hub_new_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct MegaStorageReaderOptions {
  int thread_count = 2;
  // Verify every byte a load hands over (default): a read of a whole stored
  // piece against its checksum, a partial read block by block against the
  // shard's block CRCs (widened to whole blocks; shards without them, e.g.
  // TensorPlay's, get the whole stored tensor verified once first). False
  // turns all of it off — never silently: ReadMetadata prints a warning
  // naming the checkpoint to stderr, and verification() says so.
  // Safetensors shards carry no checksums and cannot be verified.
  bool verify_checksums = true;
  // Additionally verify the whole stored tensor a partial read comes from
  // (reads it once more; with block CRCs this only adds the bytes outside the
  // slice).
  bool verify_partial_reads = false;
  // Which metadata file to read: -1 ".metadata"; r >= 1 ".metadata.rank<r>"
  // (saves with use_collectives = false).
  int metadata_rank = -1;
  std::shared_ptr<fs::FileSystem> fs;
};

// Where ReadMetadata found the checkpoint description.
enum class CheckpointSource {
  kMetadataFile,      // the committed .metadata
  kMegaShardHeaders,  // rebuilt from model.mega.index.json (or a lone .mega) + headers
  kSafetensors,       // rebuilt from a Hugging Face layout
};

class MegaStorageReader final : public StorageReader {
 public:
  // `path`: a checkpoint folder, an index file (*.mega.index.json,
  // *.safetensors.index.json), or one .mega / .safetensors file.
  explicit MegaStorageReader(std::string path, MegaStorageReaderOptions options = {});
  ~MegaStorageReader() override;

  Status Reset(std::string_view checkpoint_id) override;
  bool ValidateCheckpointId(std::string_view checkpoint_id) const override;
  // The committed .metadata when present and decodable; otherwise Metadata
  // rebuilt from the index and shard headers (MEGA or safetensors). NotFound when
  // the path holds no checkpoint; DataLoss when shards disagree (different save
  // ids, overlapping or missing chunks) or an index names a missing shard.
  Result<Metadata> ReadMetadata() override;
  Status SetUpStorageReader(const Metadata& metadata, const StorageSetUp& setup) override;
  Result<LoadPlan> PrepareLocalPlan(LoadPlan plan) override;
  Result<std::vector<LoadPlan>> PrepareGlobalPlan(std::vector<LoadPlan> plans) override;
  // Reads only the byte ranges each item needs, in parallel, straight into the
  // planner's destinations. Errors name the shard file and the tensor.
  Status ReadData(const LoadPlan& plan, LoadPlanner& planner) override;

  // Valid after ReadMetadata.
  CheckpointSource source() const;
  // "verified" or "off" (options.verify_checksums), as logged by ReadMetadata.
  std::string_view verification() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Rebuilds a checkpoint's Metadata from its shard headers only (ignores
// .metadata): `path` as for MegaStorageReader. Errors as ReadMetadata.
Result<Metadata> RebuildMetadataFromShards(const std::string& path,
                                           std::shared_ptr<fs::FileSystem> fs = nullptr);

// Verifies the checksum of every stored piece of the checkpoint at `path`
// (whole-tensor reads; parallel on `thread_count` threads). DataLoss naming the
// shard and tensor for the first mismatch.
Status VerifyMegaCheckpoint(const std::string& path, int thread_count = 2,
                            std::shared_ptr<fs::FileSystem> fs = nullptr);

}  // namespace megackpt::dcp

#endif  // MEGACKPT_DCP_MEGA_STORAGE_H_
