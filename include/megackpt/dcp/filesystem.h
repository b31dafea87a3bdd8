// FileSystemWriter / FileSystemReader: the DCP-native checkpoint layout on any
// FileSystem (local folders; mega:// through the fs seam). docs/dcp.md, sections
// 4-5, has the byte-level layout and the crash-safety argument.
//
// A checkpoint folder holds
//   .metadata                              the encoded Metadata; written LAST
//   __<save_id>_<rank>_<n>.distcp          data files: items back to back
// Each item is followed in its data file by its block CRC table (u32 LE per
// block_size bytes; docs/dcp.md "Block CRC tables"); its StorageInfo records
// {file, offset, length, crc32 of the item, block_size, block_table_offset}. File names read back
// from .metadata must be relative names inside the folder (core/path_safety.h); anything else is
// DataLoss before any file is opened. Re-saving into the same folder never overwrites a
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

// FileSystemWriterOptions::checksum_block_size: pick per item (see below).
inline constexpr uint64_t kAutoChecksumBlockSize = UINT64_MAX;

struct FileSystemWriterOptions {
  // Worker threads per rank; also the number of data files per rank (items are
  // spread over them by size).
  int thread_count = 2;
  // fsync every data file before the commit, and the metadata commit itself.
  // False: faster, not durable across a power loss (still atomic in-process).
  bool sync = true;
  // False: saving where a committed checkpoint exists fails with AlreadyExists,
  // and so does saving into a folder that holds another layout's checkpoint
  // (MEGA shards, an index file); true: after the commit, those files are
  // removed (RemoveOtherLayouts in dcp/checkpoint_folder.h).
  bool overwrite = true;
  // CRC32 granularity recorded per item; a verified load reads whole blocks.
  // kAutoChecksumBlockSize (the default): 1/16 of a row of the item's chunk
  // (its last dim; the whole chunk for 0-D/1-D tensors), a power of two in
  // [64 B, 256 KiB], so a resharded load that reads a column slice of a
  // row-saved chunk stays within ~10% of the bytes it needs (docs/dcp.md,
  // "Verified reads"); bytes values use 256 KiB. Any other value: that size
  // for every item (0: one CRC for the whole item, so any partial read reads
  // the whole item). Each block costs 4 bytes of table in the data file.
  uint64_t checksum_block_size = kAutoChecksumBlockSize;
  // Largest single write call (bytes go straight from tensor memory; strided
  // tensors are copied through a per-thread buffer of this size).
  uint64_t max_write_bytes = 64ull << 20;
  // 0 (the default): no content hashes. > 0: the writer threads also compute
  // XXH3-128 of every hash_block_size bytes of each item's stored (dense,
  // row-major) bytes, piece by piece right after its CRC and before its write
  // (the bytes are in cache), and return the record
  // "xxh3-128/<hash_block_size>/<32 hex digits per block>" (the last block
  // short; one block for an empty item) in WriteResult::storage_data.extra,
  // so it lands in .metadata. Incremental saves compare against it
  // (docs/checkpoint-manager.md, "Incremental saves").
  uint64_t hash_block_size = 0;
  // With sync: ask each data file for direct I/O (WritableFile::UseDirectIo:
  // O_DIRECT, the page cache bypassed; files that cannot, e.g. on tmpfs or
  // mega://, are written as usual). Faster durable saves where new page-cache
  // pages are slow to come by (a VM whose free memory goes back to the host:
  // docs/benchmarks.md, "Direct-I/O durable writes"); a load right after reads
  // from the device. Ignored without sync.
  bool direct_io = false;
  // Filesystem to use; nullptr: FileSystemForPath(path).
  std::shared_ptr<fs::FileSystem> fs;
};

enum class VerifyMode {
  // The default: every byte a load hands to the caller is covered by a
  // verified checksum. Reads are widened to whole checksum blocks; each block
  // is read and verified once per load unit, even when several destinations
  // need parts of it; the CRC is computed on the bytes while they are hot,
  // before they are copied into a staged destination. A checksum mismatch is
  // DataLoss naming the data file, the tensor (fqn and chunk offset) and the
  // byte range; a storage entry without any checksum is FailedPrecondition.
  kAll,
  // No verification: reads exactly the bytes needed. Only when asked for.
  kOff,
  // Older names of kAll (partial blocks used to be left unverified).
  kAllTouchedBlocks = kAll,
  kReadBlocks = kAll,
};

struct FileSystemReaderOptions {
  int thread_count = 2;
  VerifyMode verify = VerifyMode::kAll;
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
