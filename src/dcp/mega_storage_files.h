// Reading side of the MEGA storage backend, shared by MegaStorageReader and
// consolidation: locating a checkpoint, rebuilding Metadata from shard headers
// (MEGA or safetensors), and reading boxes of stored pieces with only the byte
// ranges they need.
#ifndef MEGACKPT_SRC_DCP_MEGA_STORAGE_FILES_H_
#define MEGACKPT_SRC_DCP_MEGA_STORAGE_FILES_H_

#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <utility>

#include "dcp/mega_storage_shard.h"
#include "megackpt/core/status.h"
#include "megackpt/core/tensor.h"
#include "megackpt/core/thread_pool.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/dcp/metadata.h"
#include "megackpt/format/mega.h"
#include "megackpt/format/safetensors.h"
#include "megackpt/fs/filesystem.h"

namespace megackpt::dcp::mega_storage {

// Where a checkpoint lives. Shard names are relative to `dir`.
struct CheckpointPaths {
  std::shared_ptr<fs::FileSystem> fs;
  std::string path;         // as given
  std::string dir;          // the folder holding the shards
  std::string index_file;   // set when `path` names an index file (name in dir)
  std::string single_file;  // set when `path` names one .mega / .safetensors file
};

// Classifies `path` by its suffix (index file, shard file, or folder).
Result<CheckpointPaths> ResolveCheckpointPath(const std::string& path,
                                              std::shared_ptr<fs::FileSystem> fs);

// Rebuilds Metadata from the index and the shard headers (see
// RebuildMetadataFromShards in mega_storage.h). *source tells which layout.
Result<Metadata> RebuildMetadata(const CheckpointPaths& paths, CheckpointSource* source);

// Every file name a Metadata references (storage_data relative paths).
std::set<std::string> ReferencedFiles(const Metadata& metadata);

// Reads the box [start, start + dst.shape()) of a dense row-major tensor of
// shape `stored` whose bytes start at file offset `base`, into dst (any
// strides), without verification (for files that carry no checksums:
// safetensors): the runs of core/box_runs.h, read with core ReadBoxRuns. F4
// boxes that are not the whole tensor are read in spans and copied
// nibble-exactly into dst (contiguous, as every F4 tensor; dcp/f4_box.h).
// `what` prefixes error messages.
Status ReadUnverifiedBox(const RandomAccessFile& file, uint64_t base, DType dtype,
                         const Shape& stored, const Shape& start, const Tensor& dst,
                         const std::string& what);

// Integrity keys a shard of tensorplay.dcp.version >= 2 must carry: the header
// checksum and a block CRC of every non-empty checksummed tensor (a flipped
// byte cannot turn them off). DataLoss naming the file otherwise.
Status CheckShardIntegrity(const std::string& file, const format::MegaReader& reader);

// Opened shard files of one checkpoint folder, shared by reader threads.
class ShardFiles {
 public:
  ShardFiles(std::shared_ptr<fs::FileSystem> fs, std::string dir, bool verify_checksums)
      : fs_(std::move(fs)), dir_(std::move(dir)), verify_(verify_checksums) {}

  // Reads the box [start, start + dst.shape()) of the stored piece `name`
  // (an entry of file info.relative_path, of `dtype` and shape `stored_sizes`,
  // at `chunk_offsets` in its global tensor of `global_shape`) into dst (any
  // strides). With verification on (the default) every byte handed over is
  // verified (MEGA): a whole piece against its checksum, a partial box block
  // by block (MegaReader::ReadSlice; whole-piece verification once for shards
  // without block CRCs); with `verify_partial` the whole piece is verified
  // once as well. Checks the shard header against `info` and the arguments
  // (offset, length, checksum; dtype, shape, chunk offsets and global shape
  // from tensorplay.dcp.entries): DataLoss naming file and tensor when they
  // disagree (a file replaced after the commit, a corrupt .metadata).
  Status ReadBox(const StorageInfo& info, const std::string& name, DType dtype,
                 const Shape& stored_sizes, const Shape& chunk_offsets, const Shape& global_shape,
                 const Shape& start, const Tensor& dst, bool verify_partial);
  // One whole piece for ReadWhole: ReadBox's arguments, with dst of the
  // stored dtype and shape `stored_sizes` (any strides).
  struct WholeRead {
    const StorageInfo* info = nullptr;
    const std::string* name = nullptr;
    DType dtype = DType::kU8;
    const Shape* stored_sizes = nullptr;
    const Shape* chunk_offsets = nullptr;
    const Shape* global_shape = nullptr;
    Tensor dst;
  };
  // Reads whole pieces with the pool's threads and the caller's taking part in
  // each, shard by shard: MegaReader::ReadTensors (a large plain piece in
  // read-block items, their CRC-32 partials combined and checked against the
  // piece's checksum, so shards without block CRCs split too) or
  // SafetensorsReader::ReadTensors. Same checks and errors as ReadBox.
  // Call it from outside the pool: inside one of its tasks the other threads
  // are busy and the caller would read everything alone.
  Status ReadWhole(std::span<const WholeRead> reads, ThreadPool* pool);
  // A bytes entry (stored as a U8 tensor).
  Result<std::string> ReadBytes(const StorageInfo& info, const std::string& name);
  // Verifies the stored checksum of one piece (MEGA; safetensors has none).
  Status Verify(const StorageInfo& info, const std::string& name);

 private:
  struct Shard {
    std::unique_ptr<format::MegaReader> mega;
    std::unique_ptr<format::SafetensorsReader> st;
    // tensorplay.dcp.entries of the shard (empty for files without it).
    std::map<std::string, ShardEntry> entries;
  };
  Result<Shard*> Open(const std::string& relative_path);
  Status CheckInfo(const Shard& shard, const StorageInfo& info, const std::string& name,
                   DType dtype, const Shape& sizes, size_t* mega_index) const;
  // The piece's tensorplay.dcp.entries record against what the load expects.
  Status CheckEntry(const Shard& shard, const StorageInfo& info, const std::string& name,
                    bool is_bytes, const Shape* chunk_offsets, const Shape* global_shape) const;

  std::shared_ptr<fs::FileSystem> fs_;
  std::string dir_;
  bool verify_;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<Shard>> shards_;
  std::set<std::pair<std::string, std::string>> verified_;
};

}  // namespace megackpt::dcp::mega_storage

#endif  // MEGACKPT_SRC_DCP_MEGA_STORAGE_FILES_H_
