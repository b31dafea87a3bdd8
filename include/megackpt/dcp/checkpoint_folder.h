// A checkpoint folder as a whole: which layouts it holds, what its `.metadata`
// describes, verification of every stored byte, and clean-up of other
// layouts' files after a save.
//
// Layouts the project writes (docs/dcp.md §6, docs/mega-storage.md):
//   fs     .metadata + __<save>_<rank>_<n>.distcp           (FileSystemWriter)
//   mega   .metadata + *.mega / *.safetensors + *.index.json (MegaStorageWriter,
//          sharded or consolidated)
//   hf     *.index.json + shards, or one .mega / .safetensors, no .metadata
//          (convert, external tools)
// The CLI's inspect / verify / convert / consolidate use these calls, so they
// agree on what a checkpoint holds.
#ifndef MEGACKPT_DCP_CHECKPOINT_FOLDER_H_
#define MEGACKPT_DCP_CHECKPOINT_FOLDER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/status.h"
#include "megackpt/dcp/metadata.h"
#include "megackpt/fs/filesystem.h"

namespace megackpt::dcp {

enum class StorageLayout {
  kNone,        // nothing the project writes
  kFileSystem,  // .metadata referencing .distcp data files
  kMega,        // .metadata referencing .mega / .safetensors shards (+ index)
  kIndexOnly,   // shards + index (or a single shard), no .metadata
};
const char* StorageLayoutName(StorageLayout layout);  // "dcp-fs", "dcp-mega", "hf", "none"

// The files of each layout found directly in a folder (names, sorted).
struct FolderListing {
  bool has_metadata = false;               // .metadata
  std::vector<std::string> rank_metadata;  // .metadata.rank<r>
  std::vector<std::string> distcp_files;   // __<16 hex>_<rank>_<n>.distcp
  std::vector<std::string> shard_files;    // *.mega, *.safetensors
  std::vector<std::string> index_files;    // *.index.json
};

// True when `name` is a FileSystemWriter data file name,
// __<16 hex>_<rank>_<n>.distcp; sets *rank.
bool ParseDistcpFileName(std::string_view name, int* rank);

// Lists `dir` (NotFound when it does not exist).
Result<FolderListing> ListCheckpointFolder(fs::FileSystem& fs, const std::string& dir);

// True when `dir`/.metadata is not megackpt's JSON encoding but a pickled one
// (what TensorPlay's and torch's own DCP writers store; first byte 0x80, the
// pickle protocol marker). Such folders are described by their index and
// shards (the MEGA reader rebuilds their Metadata from the shard headers). A
// damaged megackpt .metadata is never taken for one: no single bit flip turns
// its first byte '{' into 0x80. False when there is no readable .metadata.
bool HasForeignMetadata(fs::FileSystem& fs, const std::string& dir);

// Reads and decodes the metadata file `name` (".metadata", or a per-rank one)
// of the checkpoint folder `dir`. NotFound "no checkpoint at <dir>: <name> not
// found" when it is missing; a decode error (DataLoss) names the file.
Result<Metadata> ReadMetadataFile(fs::FileSystem& fs, const std::string& dir,
                                  const std::string& name);

// The layout a folder holds: from its `.metadata` when present and megackpt's
// (see HasForeignMetadata), else kIndexOnly when it has shards or an index.
Result<StorageLayout> DetectLayout(fs::FileSystem& fs, const std::string& dir);

// One stored name of a DCP checkpoint, as the caller sees it after a load.
struct EntrySummary {
  std::string fqn;
  bool is_bytes = false;
  DType dtype = DType::kU8;        // tensors
  Shape shape;                     // global shape (bytes: {length})
  uint64_t nbytes = 0;             // logical bytes of the whole tensor / the value
  size_t chunks = 0;               // stored pieces (1 for bytes)
  bool whole = false;              // stored as one chunk covering the whole tensor
  std::vector<std::string> files;  // files holding its pieces (sorted, unique)
};

struct CheckpointSummary {
  std::string path;
  StorageLayout layout = StorageLayout::kNone;
  Metadata metadata;
  std::vector<EntrySummary> entries;  // in fqn order
  size_t tensors = 0, bytes_values = 0;
  uint64_t tensor_bytes = 0, bytes_value_bytes = 0;
  size_t sharded_tensors = 0;      // tensors not stored whole
  std::vector<std::string> files;  // every referenced file (sorted)
};

// Reads and decodes `dir`/.metadata (its content checksum and file names
// checked, see DecodeMetadata) and summarises it. NotFound when the folder has
// no .metadata; DataLoss naming the file otherwise.
Result<CheckpointSummary> DescribeDcpCheckpoint(const std::string& dir,
                                                std::shared_ptr<fs::FileSystem> fs = nullptr);

struct VerifyReport {
  CheckpointSummary summary;
  std::vector<Status> problems;  // each names the file and the entry
  uint64_t chunks_checked = 0;   // stored pieces read and verified
  uint64_t bytes_checked = 0;    // their bytes
};

// Verifies a DCP checkpoint (fs or MEGA storage): the metadata, then every
// stored piece read whole through the storage's own reader with verification
// on (so every checksum block of every .distcp item, and every MEGA tensor's
// checksum, is checked), reporting every failing piece. Returns an error only
// when the metadata itself cannot be read (then nothing else can be checked).
Result<VerifyReport> VerifyDcpCheckpoint(const std::string& dir,
                                         std::shared_ptr<fs::FileSystem> fs = nullptr);

// The files directly in `dir` that belong to a layout other than `kept` (for
// kFileSystem: shards and index files; for kMega: .distcp data files), sorted
// names. NotFound when `dir` does not exist.
Result<std::vector<std::string>> OtherLayoutFiles(fs::FileSystem& fs, const std::string& dir,
                                                  StorageLayout kept);

// After a committed save of layout `kept` into `dir`: removes the files of the
// other layout (an fs save removes shards and index files; a MEGA save removes
// .distcp data files) so the folder holds exactly the new checkpoint.
// `.metadata.rank<r>` files (saves without collectives, either storage) stay. Called after the
// commit only, so a crash before it leaves the old checkpoint loadable.
// Best-effort: failures are ignored (a later save retries).
void RemoveOtherLayouts(fs::FileSystem& fs, const std::string& dir, StorageLayout kept);

// Called by a writer once this rank's data files exist in `dir` and before
// their bytes are written: writes the folder's new entries out now
// (FileSystem::SyncDirectory), before the data adds to the device's queue.
// Otherwise, where directory blocks are written back together with file data
// (ext4 without a journal, as on the benchmark VM), the folder's block is still
// dirty when the data's writeback starts, goes to the device behind it, and the
// commit's first lookup or rename in the folder waits 50-100 ms for it
// (docs/dcp.md, "The folder's entries before the data"). Costs one small
// metadata write. A speed measure, not a durability step (a durable save still
// syncs the folder at its commit): failures are ignored.
// `commit_names`: the files the commit will create in `dir` (.metadata, a
// MEGA index). When `fs` caches name lookups
// (FileSystemCapabilities::cached_name_lookups: a local file system) they are
// looked up now, while the folder's block is in memory and idle, so that the
// commit finds them in the kernel's name cache: with a local file system's
// atomic write (core/file.h WriteLocalFileAtomically, an unnamed file linked
// in) the commit then reads no folder block, which may by then be queued for
// writeback behind the data (docs/dcp.md, "The folder's entries before the
// data"). Elsewhere (the hub) a lookup is a round trip that fills no cache,
// and none is made.
void WriteOutNewEntries(fs::FileSystem& fs, const std::string& dir,
                        const std::vector<std::string>& commit_names = {});

// For saves that must not overwrite: AlreadyExists naming the files when `dir`
// holds files of a layout other than `kept` (a save of `kept` would remove
// them after its commit).
Status CheckNoOtherLayout(fs::FileSystem& fs, const std::string& dir, StorageLayout kept);

}  // namespace megackpt::dcp

#endif  // MEGACKPT_DCP_CHECKPOINT_FOLDER_H_
