// FileSystemWriter / FileSystemReader: the DCP-native checkpoint layout on any
// FileSystem (local folders; mega:// through the fs seam). docs/dcp.md, sections
// 4-5, has the byte-level layout and the crash-safety argument.
//
// A checkpoint folder holds
//   .metadata                              the encoded Metadata; written LAST
//   __<save_id>_<rank>_<n>.distcp          data files: items back to back
// Each item's StorageInfo records {file, offset, length, crc32 of the item,
// crc32 per block_size bytes}. Re-saving into the same folder never overwrites a
// file the current .metadata references (new files carry the new save id); the
// commit point is the rename of the new .metadata, after which the previous
// save's data files are deleted.
#ifndef MEGACKPT_DCP_FILESYSTEM_H_
#define MEGACKPT_DCP_FILESYSTEM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "megackpt/dcp/storage.h"
#include "megackpt/fs/filesystem.h"

namespace megackpt::dcp {

// Name of the metadata file in a checkpoint folder. With use_collectives=false
// and world size > 1, rank r > 0 writes ".metadata.rank<r>" instead.
inline constexpr std::string_view kMetadataFileName = ".metadata";

struct FileSystemWriterOptions {
  // Worker threads per rank; also the number of data files per rank (items are
  // spread over them by size).
  int thread_count = 2;
  // fsync every data file before the commit, and the metadata commit itself.
  // False: faster, not durable across a power loss (still atomic in-process).
  bool sync = true;
  // False: saving where a committed checkpoint exists fails with AlreadyExists.
  bool overwrite = true;
  // CRC32 granularity recorded per item (0: whole item only). Smaller blocks let
  // a resharded load verify smaller reads; each block costs 8 hex digits of metadata.
  uint64_t checksum_block_size = 256ull << 10;
  // Largest single write call (bytes go straight from tensor memory; strided
  // tensors are copied through a per-thread buffer of this size).
  uint64_t max_write_bytes = 64ull << 20;
  // Filesystem to use; nullptr: FileSystemForPath(path).
  std::shared_ptr<fs::FileSystem> fs;
};

enum class VerifyMode {
  // Verify every checksum block the load reads completely; a partially needed
  // block is read in full (and verified) when that costs at most
  // max_verify_overhead extra bytes of the item's read, else left unverified.
  kReadBlocks,
  // Read and verify every block a load touches (may read more than needed).
  kAllTouchedBlocks,
  kOff,
};

struct FileSystemReaderOptions {
  int thread_count = 2;
  VerifyMode verify = VerifyMode::kReadBlocks;
  double max_verify_overhead = 0.05;
  // Staging buffer per thread for reads that cannot go straight into the
  // destination (strided boxes).
  uint64_t staging_bytes = 16ull << 20;
  // Which metadata file to read: -1 ".metadata", r >= 1 ".metadata.rank<r>".
  int metadata_rank = -1;
  std::shared_ptr<fs::FileSystem> fs;
};

// `path` is the checkpoint folder (plain path or mega:// URI).
std::unique_ptr<StorageWriter> NewFileSystemWriter(std::string path,
                                                   FileSystemWriterOptions options = {});
std::unique_ptr<StorageReader> NewFileSystemReader(std::string path,
                                                   FileSystemReaderOptions options = {});

}  // namespace megackpt::dcp

#endif  // MEGACKPT_DCP_FILESYSTEM_H_
