// FileSystemWriter / FileSystemReader: the DCP-native layout (docs/dcp.md).
//
// Write path (the hot one): items are spread over `thread_count` data files by
// size; each file is written by one thread, item after item, straight from the
// tensor's memory in 2 MiB pieces ending on multiples of core's WritePieceFor
// the file (NextWritePiece); each piece's block CRCs are computed right before
// its pwrite, whose copy then finds the bytes in cache.
// Strided tensors go through a bounded per-thread buffer. After an item's bytes
// comes its block CRC table (u32 LE per block; .metadata records its offset). With
// FileSystemWriterOptions::hash_block_size, each piece is also fed to an XXH3-128
// BlockHasher (dcp/block_hashes.h) right after its CRC. Each file is fsynced
// before WriteData returns; the coordinator's Finish writes .metadata last. A
// durable save asks for writeback of every 32 MiB already written, so the device
// works while the next bytes are copied and the final fsync has less to wait for.
//
// Read path: a ReadItem is a box of a stored row-major chunk. The box is cut
// into contiguous byte ranges of the file ("pieces"); a piece whose destination
// is contiguous is read with pread straight into the caller's tensor, any other
// through a per-thread staging buffer. A verified read first fetches the slice
// of the item's block CRC table its blocks need. Only the needed ranges are read; CRC
// blocks fully covered by a read are verified (see VerifyMode). F4 boxes that
// are not whole bytes are read span by span and copied nibble-exactly
// (dcp/f4_box.h, docs/dcp.md "F4 resharding").
#include "megackpt/dcp/filesystem.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>

#include "dcp/block_hashes.h"
#include "dcp/f4_box.h"
#include "dcp/guard.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/endian.h"
#include "megackpt/core/file.h"  // BaseName, kWritebackUnit
#include "megackpt/core/packed.h"
#include "megackpt/core/path_safety.h"
#include "megackpt/core/thread_pool.h"
#include "megackpt/dcp/checkpoint_folder.h"

namespace megackpt::dcp {
namespace {

constexpr std::string_view kDataSuffix = ".distcp";
constexpr uint64_t kDataAlignment = 64;      // start of every item in a data file
constexpr uint64_t kTableAlignment = 4;      // start of an item's block CRC table (after its bytes)
constexpr uint64_t kCrcEntry = 4;            // bytes per block CRC in a table (u32 LE)
constexpr uint64_t kReadUnit = 32ull << 20;  // work unit of a contiguous read
constexpr uint64_t kReadPiece = 1ull << 20;  // pread size inside a unit
constexpr uint64_t kVerifiedReadPiece =
    kCrcHotPiece;                                 // verified reads: CRC'd right after the pread
constexpr uint64_t kMaxSegment = 2 * kReadUnit;   // runs sharing blocks: one read unit up to this
constexpr uint64_t kDirectReadMin = 64ull << 10;  // shorter stretches go through the piece buffer
// Automatic checksum blocks (FileSystemWriterOptions::checksum_block_size =
// kAutoChecksumBlockSize): core's AutoCrcBlockSize of a row of the chunk (its
// last dim; the whole chunk for 0-D/1-D), at most kMaxAutoBlock; docs/dcp.md
// "Verified reads" has the numbers.
constexpr uint64_t kMaxAutoBlock = 256ull << 10;
constexpr double kF4MaxOverhead = 0.05;  // F4 spans read at most 5% more than their runs

std::string CrcString(uint32_t crc) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "crc32:%08x", crc);
  return buf;
}

std::string MetadataFileName(const StorageSetUp& setup) {
  if (!setup.use_collectives && setup.rank > 0) {
    return std::string(kMetadataFileName) + ".rank" + std::to_string(setup.rank);
  }
  return std::string(kMetadataFileName);
}

// The checksum block size of `item` under the writer option (see kMaxAutoBlock).
uint64_t ChecksumBlockSizeFor(const WriteItem& item, uint64_t option) {
  if (option != kAutoChecksumBlockSize) return option;
  if (item.type == WriteItemType::kByteIO || !item.tensor_data) return kMaxAutoBlock;  // read whole
  const Shape& sizes = item.tensor_data->chunk.sizes;
  const DType dtype = item.tensor_data->properties.dtype;
  uint64_t row = WriteItemNbytes(item);
  if (sizes.size() >= 2) {
    const int64_t last = sizes.back();
    auto n = LogicalNbytes(dtype, std::span<const int64_t>(&last, 1));
    if (n.ok()) row = *n;
  }
  return AutoCrcBlockSize(row, kMaxAutoBlock);
}

// An item's checksums: core's BlockCrc32Stream, fed each piece right before
// its pwrite, whose copy then reads the piece from cache (core kCrcWritePiece).
class BlockCrc {
 public:
  BlockCrc(uint64_t block_size, uint64_t item_bytes) : crc_(block_size, item_bytes) {}
  void Add(std::span<const std::byte> data) { crc_.Add(data); }

  // Sets the item's checksum and block size; returns its block CRC table as
  // stored in the data file (u32 little-endian per block; empty when
  // block_size is 0).
  std::span<const std::byte> Finish(StorageInfo* info) {
    crc_.Finish();
    info->checksum = CrcString(crc_.whole());
    info->block_size = crc_.block();
    return EncodeBlockTableInPlace(crc_.blocks());
  }

 private:
  BlockCrc32Stream crc_;
};

// Calls fn(bytes) over the elements of `t` in row-major order, in pieces of at
// most `max_bytes` (except that a contiguous tensor is handed over whole), copying
// strided parts through `buffer` (>= max_bytes).
Status ForEachContiguousPiece(const Tensor& t, uint64_t max_bytes, std::byte* buffer,
                              const std::function<Status(std::span<const std::byte>)>& fn) {
  if (t.numel() == 0) return Status::OK();
  if (t.is_contiguous()) {
    return fn(std::span<const std::byte>(static_cast<const std::byte*>(t.data()), t.nbytes()));
  }
  if (t.nbytes() <= max_bytes) {
    MEGA_ASSIGN_OR_RETURN(Tensor dst, Tensor::FromBlob(buffer, t.dtype(), t.shape()));
    MEGA_RETURN_IF_ERROR(CopyTensor(t, dst));
    return fn(std::span<const std::byte>(buffer, t.nbytes()));
  }
  int dim = 0;
  while (dim < t.ndim() && t.shape()[dim] == 1) ++dim;
  const int64_t rows = t.shape()[dim];
  const uint64_t row_bytes = t.nbytes() / static_cast<uint64_t>(rows);
  const int64_t step =
      std::max<int64_t>(1, static_cast<int64_t>(max_bytes / std::max<uint64_t>(row_bytes, 1)));
  for (int64_t start = 0; start < rows; start += step) {
    MEGA_ASSIGN_OR_RETURN(Tensor slab, t.Narrow(dim, start, std::min(step, rows - start)));
    MEGA_RETURN_IF_ERROR(ForEachContiguousPiece(slab, max_bytes, buffer, fn));
  }
  return Status::OK();
}

// ============================== writer =====================================

class FileSystemWriterImpl final : public StorageWriter {
 public:
  FileSystemWriterImpl(std::string path, FileSystemWriterOptions options)
      : path_(std::move(path)), options_(std::move(options)) {
    if (options_.thread_count < 1) options_.thread_count = 1;
    if (options_.max_write_bytes < (1u << 16)) options_.max_write_bytes = 1u << 16;
    save_id_ = RandomHex(8);
  }

  Status Reset(std::string_view checkpoint_id) override {
    if (!checkpoint_id.empty()) path_ = std::string(checkpoint_id);
    save_id_ = RandomHex(8);
    written_.clear();
    committed_ = false;
    next_file_ = 0;
    return Status::OK();
  }

  bool ValidateCheckpointId(std::string_view checkpoint_id) const override {
    return !checkpoint_id.empty() && fs::FileSystemForPath(checkpoint_id).ok();
  }

  std::optional<StorageMeta> GetStorageMeta() const override {
    StorageMeta m;
    m.checkpoint_id = path_;
    m.save_id = save_id_;
    return m;
  }

  Status SetUpStorageWriter(const StorageSetUp& setup) override {
    setup_ = setup;
    if (options_.fs) {
      fs_ = options_.fs;
    } else {
      MEGA_ASSIGN_OR_RETURN(fs_, fs::FileSystemForPath(path_));
    }
    if (setup.is_coordinator) {
      MEGA_RETURN_IF_ERROR(fs_->CreateDirectories(path_));
      if (!options_.overwrite) {
        MEGA_ASSIGN_OR_RETURN(bool exists,
                              fs_->Exists(fs::JoinPath(path_, MetadataFileName(setup_))));
        if (exists) {
          return AlreadyExistsError("a checkpoint already exists at " + path_ + " (" +
                                    MetadataFileName(setup_) +
                                    " present); set overwrite to replace it");
        }
        MEGA_RETURN_IF_ERROR(CheckNoOtherLayout(*fs_, path_, StorageLayout::kFileSystem));
      }
    }
    return Status::OK();
  }

  Result<SavePlan> PrepareLocalPlan(SavePlan plan) override { return plan; }

  Result<std::vector<SavePlan>> PrepareGlobalPlan(std::vector<SavePlan> plans) override {
    for (size_t i = 0; i < plans.size(); ++i) {
      int rank = setup_.use_collectives ? static_cast<int>(i) : setup_.rank;
      plans[i].storage_data = "__" + save_id_ + "_" + std::to_string(rank) + "_";
    }
    return plans;
  }

  Result<std::vector<WriteResult>> WriteData(const SavePlan& plan, SavePlanner& planner) override {
    if (!fs_) return FailedPreconditionError(path_ + ": SetUpStorageWriter was not called");
    const std::string& prefix = plan.storage_data;
    if (prefix.empty() || prefix.find('/') != std::string::npos) {
      return FailedPreconditionError(path_ +
                                     ": save plan has no data file prefix "
                                     "(PrepareGlobalPlan did not run on the coordinator)");
    }
    // Spread items over files by size (largest first onto the lightest file);
    // within a file keep plan order.
    const size_t nfiles =
        std::min<size_t>(options_.thread_count, std::max<size_t>(plan.items.size(), 1));
    std::vector<size_t> order(plan.items.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return WriteItemNbytes(plan.items[a]) > WriteItemNbytes(plan.items[b]);
    });
    std::vector<std::vector<size_t>> bins(nfiles);
    std::vector<uint64_t> load(nfiles, 0);
    for (size_t i : order) {
      size_t best = std::min_element(load.begin(), load.end()) - load.begin();
      bins[best].push_back(i);
      load[best] += WriteItemNbytes(plan.items[i]) + kDataAlignment;
    }
    std::vector<std::string> names(nfiles);
    for (size_t f = 0; f < nfiles; ++f) {
      std::sort(bins[f].begin(), bins[f].end());
      names[f] = prefix + std::to_string(next_file_++) + std::string(kDataSuffix);
    }
    std::vector<WriteResult> results(plan.items.size());
    if (!pool_ && options_.thread_count > 1) {
      pool_ = std::make_unique<ThreadPool>(options_.thread_count - 1);
    }
    // Every file is created before any is written, so that the folder's new
    // entries go out before the data (WriteOutNewEntries).
    std::vector<std::unique_ptr<WritableFile>> files(nfiles);
    for (size_t f = 0; f < nfiles; ++f) {
      if (bins[f].empty()) continue;
      const std::string full = fs::JoinPath(path_, names[f]);
      written_.push_back(full);
      MEGA_ASSIGN_OR_RETURN(files[f], fs_->OpenForWrite(full));
      if (options_.sync && options_.direct_io) files[f]->UseDirectIo();  // a hint; refused is fine
    }
    WriteOutNewEntries(*fs_, path_, {MetadataFileName(setup_)});
    Status s = ParallelFor(
        pool_.get(), nfiles,
        [&](size_t f) -> Status {
          if (bins[f].empty()) return Status::OK();
          return Guard("FileSystemWriter::WriteData", [&] {
            return WriteFile(std::move(files[f]), fs::JoinPath(path_, names[f]), names[f], plan,
                             bins[f], planner, &results);
          });
        },
        options_.thread_count);
    MEGA_RETURN_IF_ERROR(s);
    return results;
  }

  Status Finish(const Metadata& metadata,
                const std::vector<std::vector<WriteResult>>& results) override {
    (void)results;
    if (!fs_) return FailedPreconditionError(path_ + ": SetUpStorageWriter was not called");
    Metadata md = metadata;
    if (!md.storage_meta) md.storage_meta = StorageMeta();
    if (md.storage_meta->checkpoint_id.empty()) md.storage_meta->checkpoint_id = path_;
    if (md.storage_meta->save_id.empty()) md.storage_meta->save_id = save_id_;
    // Data files' directory entries must be durable before the commit can be.
    if (options_.sync) MEGA_RETURN_IF_ERROR(fs_->SyncDirectory(path_));
    const std::string name = MetadataFileName(setup_);
    MEGA_RETURN_IF_ERROR(
        fs_->WriteAtomically(fs::JoinPath(path_, name), EncodeMetadata(md), options_.sync)
            .WithContext(path_ + ": commit of " + name));
    committed_ = true;
    RemoveUnreferencedDataFiles(md);
    // The folder now holds exactly this checkpoint: files of another layout
    // (a MEGA save's shards and index) go, after the commit, never before.
    RemoveOtherLayouts(*fs_, path_, StorageLayout::kFileSystem);
    return Status::OK();
  }

  void Abort() override {
    if (committed_ || !fs_) return;
    for (const auto& f : written_) fs_->Remove(f).IgnoreError();
    written_.clear();
  }

 private:
  Status WriteFile(std::unique_ptr<WritableFile> file, const std::string& full,
                   const std::string& name, const SavePlan& plan, const std::vector<size_t>& items,
                   SavePlanner& planner, std::vector<WriteResult>* results) {
    const bool positioned = file->supports_write_at();
    const uint64_t write_piece = WritePieceFor(*file);
    std::shared_ptr<std::byte> buffer;  // for strided tensors, allocated on first need
    uint64_t offset = 0;
    uint64_t written_back = 0;  // durable saves: writeback started for [0, written_back)
    static const std::byte kZeros[kDataAlignment] = {};
    for (size_t idx : items) {
      const WriteItem& item = plan.items[idx];
      uint64_t pad = (kDataAlignment - offset % kDataAlignment) % kDataAlignment;
      if (pad && !positioned) {
        MEGA_RETURN_IF_ERROR(file->Append(std::span<const std::byte>(kZeros, pad)));
      }
      offset += pad;
      const uint64_t start = offset;
      const uint64_t expected = WriteItemNbytes(item);
      BlockCrc crc(ChecksumBlockSizeFor(item, options_.checksum_block_size), expected);
      std::optional<BlockHasher> hasher;  // FileSystemWriterOptions::hash_block_size
      if (options_.hash_block_size > 0) hasher.emplace(options_.hash_block_size);
      auto write = [&](std::span<const std::byte> bytes) -> Status {
        while (!bytes.empty()) {
          const uint64_t n = NextWritePiece(offset, bytes.size(), write_piece);
          auto piece = bytes.first(static_cast<size_t>(n));
          // Checksums before the pwrite: they bring the piece into cache and
          // the pwrite's copy reads it from there (core kCrcWritePiece).
          crc.Add(piece);
          if (hasher) hasher->Add(piece);
          if (positioned) {
            MEGA_RETURN_IF_ERROR(file->WriteAt(offset, piece));
          } else {
            MEGA_RETURN_IF_ERROR(file->Append(piece));
          }
          offset += n;
          bytes = bytes.subspan(static_cast<size_t>(n));
          if (options_.sync && offset - written_back >= kWritebackUnit) {
            // The device starts on this range while we copy the next one.
            file->StartWriteback(written_back, offset - written_back);
            written_back = offset;
          }
        }
        return Status::OK();
      };
      {
        MEGA_ASSIGN_OR_RETURN(ResolvedData data, planner.ResolveData(item));
        MEGA_RETURN_IF_ERROR(CheckResolvedData(item, data));
        if (item.type == WriteItemType::kByteIO) {
          MEGA_RETURN_IF_ERROR(write(AsBytes(data.bytes)));
        } else {
          const Tensor& t = data.tensor;
          if (!t.is_contiguous() && !buffer) {
            MEGA_ASSIGN_OR_RETURN(buffer, AllocateBuffer(options_.max_write_bytes));
          }
          MEGA_RETURN_IF_ERROR(
              ForEachContiguousPiece(t, options_.max_write_bytes, buffer.get(), write));
        }
      }  // releases the resolved data before the next item (staging pools)
      if (offset - start != expected) {
        return InternalError(full + ": wrote " + std::to_string(offset - start) + " bytes for " +
                             ToString(item.index) + ", expected " + std::to_string(expected));
      }
      WriteResult& r = (*results)[idx];
      r.index = item.index;
      r.size_in_bytes = expected;
      r.storage_data.relative_path = name;
      r.storage_data.offset = start;
      r.storage_data.length = expected;
      const std::span<const std::byte> table = crc.Finish(&r.storage_data);
      if (hasher) r.storage_data.extra = EncodeBlockHashes(hasher->Finish());
      if (r.storage_data.block_size != 0) {
        // The block CRC table follows the item's bytes (docs/dcp.md, "Block CRC tables").
        const uint64_t table_pad = (kTableAlignment - offset % kTableAlignment) % kTableAlignment;
        if (table_pad && !positioned) {
          MEGA_RETURN_IF_ERROR(file->Append(std::span<const std::byte>(kZeros, table_pad)));
        }
        offset += table_pad;
        r.storage_data.block_table_offset = offset;
        if (!table.empty()) {
          if (positioned) {
            MEGA_RETURN_IF_ERROR(
                ForEachTableWritePiece(table, [&](uint64_t o, std::span<const std::byte> piece) {
                  return file->WriteAt(offset + o, piece);
                }));
          } else {
            MEGA_RETURN_IF_ERROR(file->Append(table));
          }
          offset += table.size();
        }
      }
    }
    if (options_.sync) MEGA_RETURN_IF_ERROR(file->Sync());
    return file->Close();
  }

  // After the commit: the previous saves' data files are garbage. Failures are
  // harmless (the next save retries), so they are ignored.
  void RemoveUnreferencedDataFiles(const Metadata& md) {
    std::set<std::string> referenced;
    for (const auto& [idx, info] : md.storage_data) referenced.insert(info.relative_path);
    auto listing = fs_->List(path_);
    if (!listing.ok()) return;
    std::vector<std::string> garbage;
    for (const fs::FileInfo& fi : *listing) {
      if (fi.is_directory) continue;
      std::string base = BaseName(fi.path);
      int rank = -1;
      if (!ParseDistcpFileName(base, &rank) || referenced.count(base)) continue;
      // Without collectives every rank owns only its own files.
      if (!setup_.use_collectives && rank != setup_.rank) continue;
      garbage.push_back(fs::JoinPath(path_, base));
    }
    fs_->RemoveGarbage(garbage);
  }

  std::string path_;
  FileSystemWriterOptions options_;
  std::shared_ptr<fs::FileSystem> fs_;
  StorageSetUp setup_;
  std::string save_id_;
  std::vector<std::string> written_;
  bool committed_ = false;
  uint64_t next_file_ = 0;
  std::unique_ptr<ThreadPool> pool_;
};

// ============================== reader =====================================

// A byte range of a stored item that one read item needs, and where it goes.
struct Run {
  size_t item = 0;                // index into the plan
  uint64_t rel = 0;               // start, relative to the stored item
  uint64_t len = 0;               // bytes needed
  std::byte* dest_ptr = nullptr;  // contiguous destination of the whole range
  Tensor dest;                    // otherwise: the destination box of the range
  Shape shape;                    // shape of the range as a box (when !dest_ptr)
  uint64_t staged_at = 0;         // box runs: offset in the segment's staging buffer
};

// One unit of work: bytes [a, b) of one stored item and the runs inside them.
// When verifying, a and b are checksum-block boundaries (or the item's end),
// every block of [a, b) is read once and verified while its bytes are hot,
// and runs that share a block belong to one segment, so a block several
// destinations need is read and verified once.
struct Segment {
  size_t owner = 0;  // a plan index naming the stored item (ItemState info/file)
  uint64_t a = 0, b = 0;
  std::vector<Run> runs;  // sorted by rel
  uint64_t staging = 0;   // bytes of box runs (staged, copied after verification)
  bool f4 = false;        // an F4 box read span by span (ReadF4Segment); no runs
};

// The block CRCs a read fetched: crcs[k - first] is the CRC of block k, for k
// in [first, end).
struct CrcTable {
  const uint32_t* crcs = nullptr;
  uint64_t first = 0, end = 0;
};

struct ItemState {
  const StorageInfo* info = nullptr;
  const RandomAccessFile* file = nullptr;
  DType dtype = DType::kU8;
  Tensor dest;        // full destination view (TENSOR)
  std::string value;  // BYTE_IO: the value being read
  Shape chunk_shape;  // TENSOR: the stored chunk's shape
  std::atomic<size_t> remaining{0};
};

class FileSystemReaderImpl final : public StorageReader {
 public:
  FileSystemReaderImpl(std::string path, FileSystemReaderOptions options)
      : path_(std::move(path)), options_(std::move(options)) {
    if (options_.thread_count < 1) options_.thread_count = 1;
    if (options_.staging_bytes < (1u << 20)) options_.staging_bytes = 1u << 20;
  }

  Status Reset(std::string_view checkpoint_id) override {
    if (!checkpoint_id.empty()) path_ = std::string(checkpoint_id);
    metadata_.reset();
    files_.clear();
    return Status::OK();
  }

  bool ValidateCheckpointId(std::string_view checkpoint_id) const override {
    return !checkpoint_id.empty() && fs::FileSystemForPath(checkpoint_id).ok();
  }

  Result<Metadata> ReadMetadata() override {
    MEGA_RETURN_IF_ERROR(EnsureFs());
    std::string name = options_.metadata_rank >= 1 ? std::string(kMetadataFileName) + ".rank" +
                                                         std::to_string(options_.metadata_rank)
                                                   : std::string(kMetadataFileName);
    MEGA_RETURN_IF_ERROR(CheckResolvesInside(path_, fs::JoinPath(path_, name)));
    MEGA_ASSIGN_OR_RETURN(Metadata md, ReadMetadataFile(*fs_, path_, name));
    if (!md.storage_meta) md.storage_meta = StorageMeta();
    md.storage_meta->load_id = RandomHex(8);
    return md;
  }

  Status SetUpStorageReader(const Metadata& metadata, const StorageSetUp& setup) override {
    (void)setup;
    MEGA_RETURN_IF_ERROR(EnsureFs());
    metadata_ = std::make_shared<Metadata>(metadata);
    return Status::OK();
  }

  Result<LoadPlan> PrepareLocalPlan(LoadPlan plan) override { return plan; }
  Result<std::vector<LoadPlan>> PrepareGlobalPlan(std::vector<LoadPlan> plans) override {
    return plans;
  }

  Status ReadData(const LoadPlan& plan, LoadPlanner& planner) override {
    if (!metadata_) return FailedPreconditionError(path_ + ": SetUpStorageReader was not called");
    const size_t n = plan.items.size();
    std::vector<ItemState> items(n);
    std::vector<Run> runs;
    std::vector<Segment> segments;
    for (size_t i = 0; i < n; ++i) {
      MEGA_RETURN_IF_ERROR(PlanItem(plan, i, planner, &items[i], &runs, &segments));
    }
    BuildSegments(items, std::move(runs), &segments);
    for (const Segment& seg : segments) {
      if (seg.f4) items[seg.owner].remaining.fetch_add(1);
      for (const Run& r : seg.runs) items[r.item].remaining.fetch_add(1);
    }
    if (!pool_ && options_.thread_count > 1) {
      pool_ = std::make_unique<ThreadPool>(options_.thread_count - 1);
    }
    // Items with nothing to read (empty boxes, empty bytes) are done right away.
    for (size_t i = 0; i < n; ++i) {
      if (items[i].remaining.load() == 0) MEGA_RETURN_IF_ERROR(CommitItem(plan, planner, items, i));
    }
    const std::vector<std::pair<size_t, size_t>> tasks = GroupSegments(items, segments);
    return ParallelFor(
        pool_.get(), tasks.size(),
        [&](size_t k) -> Status {
          return Guard("FileSystemReader::ReadData", [&] {
            return ReadSegmentGroup(plan, planner, items, segments, tasks[k].first,
                                    tasks[k].second);
          });
        },
        options_.thread_count);
  }

 private:
  bool verifying() const { return options_.verify != VerifyMode::kOff; }
  uint64_t PieceBytes() const { return verifying() ? kVerifiedReadPiece : kReadPiece; }

  Status CommitItem(const LoadPlan& plan, LoadPlanner& planner, std::vector<ItemState>& items,
                    size_t i) {
    const ReadItem& item = plan.items[i];
    if (item.type == LoadItemType::kByteIO)
      return planner.LoadBytes(item, std::move(items[i].value));
    return planner.CommitTensor(item, items[i].dest);
  }

  // The units of work: ranges [first, last) of `segments`. When verifying
  // against a block CRC table in the data file, consecutive segments of one
  // stored item spanning at most kReadUnit form one unit, so the slice of the
  // table they need is fetched with one pread (column slices of row-saved
  // chunks are many small segments); otherwise every segment is a unit.
  std::vector<std::pair<size_t, size_t>> GroupSegments(const std::vector<ItemState>& items,
                                                       const std::vector<Segment>& segments) const {
    std::vector<std::pair<size_t, size_t>> tasks;
    for (size_t k = 0; k < segments.size(); ++k) {
      const Segment& seg = segments[k];
      const StorageInfo* info = items[seg.owner].info;
      if (!tasks.empty() && verifying() && !seg.f4 && info->block_table_offset) {
        const Segment& head = segments[tasks.back().first];
        if (!head.f4 && items[head.owner].info == info && tasks.back().second == k &&
            seg.b - head.a <= kReadUnit) {
          tasks.back().second = k + 1;
          continue;
        }
      }
      tasks.emplace_back(k, k + 1);
    }
    return tasks;
  }

  Status ReadSegmentGroup(const LoadPlan& plan, LoadPlanner& planner, std::vector<ItemState>& items,
                          const std::vector<Segment>& segments, size_t first, size_t last) {
    const Segment& head = segments[first];
    if (head.f4) return ReadSegmentAt(plan, planner, items, head, CrcTable{});
    const ItemState& st = items[head.owner];
    thread_local std::vector<uint32_t> table_buf;
    CrcTable table;
    if (verifying()) {
      uint64_t b = head.b;
      for (size_t k = first; k < last; ++k) b = std::max(b, segments[k].b);
      MEGA_RETURN_IF_ERROR(FetchTable(st, plan.items[head.owner], head.a, b, &table_buf, &table));
    }
    for (size_t k = first; k < last; ++k) {
      MEGA_RETURN_IF_ERROR(ReadSegmentAt(plan, planner, items, segments[k], table));
    }
    return Status::OK();
  }

  // One unit of work; items are committed when their last run is in (and
  // verified).
  Status ReadSegmentAt(const LoadPlan& plan, LoadPlanner& planner, std::vector<ItemState>& items,
                       const Segment& seg, const CrcTable& table) {
    if (seg.f4) {
      MEGA_RETURN_IF_ERROR(ReadF4Segment(items[seg.owner], plan.items[seg.owner]));
      if (items[seg.owner].remaining.fetch_sub(1) == 1) {
        return CommitItem(plan, planner, items, seg.owner);
      }
      return Status::OK();
    }
    MEGA_RETURN_IF_ERROR(ReadSegment(items[seg.owner], plan.items[seg.owner], seg, table));
    for (const Run& r : seg.runs) {
      if (items[r.item].remaining.fetch_sub(1) == 1) {
        MEGA_RETURN_IF_ERROR(CommitItem(plan, planner, items, r.item));
      }
    }
    return Status::OK();
  }

  Status EnsureFs() {
    if (fs_) return Status::OK();
    if (options_.fs) {
      fs_ = options_.fs;
      return Status::OK();
    }
    MEGA_ASSIGN_OR_RETURN(fs_, fs::FileSystemForPath(path_));
    return Status::OK();
  }

  Result<const RandomAccessFile*> OpenFile(const std::string& rel, const ReadItem& item) {
    auto it = files_.find(rel);
    if (it != files_.end()) return it->second.get();
    Status valid = ValidateRelativePath(rel);
    if (!valid.ok()) {
      return DataLossError(fs::JoinPath(path_, std::string(kMetadataFileName)) +
                           ": storage entry of " + ToString(item.storage_index) + ": " +
                           valid.message());
    }
    const std::string full = fs::JoinPath(path_, rel);
    MEGA_RETURN_IF_ERROR(CheckResolvesInside(path_, full));
    auto f = fs_->OpenForRead(full);
    if (!f.ok()) {
      if (f.status().code() == StatusCode::kNotFound) {
        return NotFoundError("data file " + full + " is missing (needed for " +
                             ToString(item.storage_index) + ")");
      }
      return Status(f.status().code(), f.status().message() + " (data file needed for " +
                                           ToString(item.storage_index) + ")");
    }
    const RandomAccessFile* raw = f->get();
    files_.emplace(rel, std::move(*f));
    return raw;
  }

  // Validates a read item against the metadata, resolves its destination and
  // appends its runs (or, for F4 boxes that are not whole bytes, a segment).
  Status PlanItem(const LoadPlan& plan, size_t i, LoadPlanner& planner, ItemState* st,
                  std::vector<Run>* runs, std::vector<Segment>* segments) {
    const ReadItem& item = plan.items[i];
    MetadataIndex key = item.storage_index;
    key.index.reset();
    auto sit = metadata_->storage_data.find(key);
    if (sit == metadata_->storage_data.end()) {
      return DataLossError(path_ + ": checkpoint metadata has no storage entry for " +
                           ToString(key));
    }
    st->info = &sit->second;
    if (verifying() && !HasChecksums(*st->info)) {
      return FailedPreconditionError(
          path_ + ": storage entry of " + ToString(key) +
          " has no checksum, so its bytes cannot be verified; load with verify = VerifyMode::kOff "
          "to read it unverified");
    }
    MEGA_ASSIGN_OR_RETURN(st->file, OpenFile(st->info->relative_path, item));
    const uint64_t fsize = st->file->size();
    if (st->info->offset > fsize || st->info->length > fsize - st->info->offset) {
      return DataLossError("data file " + st->file->name() + " is truncated: it has " +
                           std::to_string(fsize) + " bytes, " + ToString(key) + " is stored at [" +
                           std::to_string(st->info->offset) + ", " +
                           std::to_string(st->info->offset + st->info->length) + ")");
    }
    if (verifying() && st->info->block_table_offset) {
      const uint64_t table_at = *st->info->block_table_offset;
      const uint64_t table_bytes = BlockCount(*st->info) * kCrcEntry;
      if (table_at > fsize || table_bytes > fsize - table_at) {
        return DataLossError("data file " + st->file->name() + " is truncated: it has " +
                             std::to_string(fsize) + " bytes, the checksum table of " +
                             ToString(key) + " is stored at [" + std::to_string(table_at) + ", " +
                             std::to_string(table_at + table_bytes) + ")");
      }
    }
    auto mit = metadata_->state_dict_metadata.find(key.fqn);
    if (mit == metadata_->state_dict_metadata.end()) {
      return DataLossError(path_ + ": no metadata entry for " + ToString(key));
    }
    if (item.type == LoadItemType::kByteIO) {
      if (!std::holds_alternative<BytesStorageMetadata>(mit->second)) {
        return InvalidArgumentError(ToString(key) +
                                    " is a tensor in the checkpoint, read as bytes");
      }
      st->value.assign(st->info->length, '\0');
      if (st->info->length == 0) return Status::OK();
      Run r;
      r.item = i;
      r.len = st->info->length;
      r.dest_ptr = reinterpret_cast<std::byte*>(st->value.data());
      runs->push_back(std::move(r));
      return Status::OK();
    }
    const auto* tm = std::get_if<TensorStorageMetadata>(&mit->second);
    if (!tm)
      return InvalidArgumentError(ToString(key) + " is bytes in the checkpoint, read as a tensor");
    const ChunkStorageMetadata* chunk = nullptr;
    if (item.storage_index.index && *item.storage_index.index >= 0 &&
        static_cast<size_t>(*item.storage_index.index) < tm->chunks.size() && key.offset &&
        tm->chunks[*item.storage_index.index].offsets == *key.offset) {
      chunk = &tm->chunks[*item.storage_index.index];
    }
    for (size_t c = 0; !chunk && c < tm->chunks.size(); ++c) {
      if (key.offset && tm->chunks[c].offsets == *key.offset) chunk = &tm->chunks[c];
    }
    if (!chunk) return DataLossError(path_ + ": no stored chunk for " + ToString(key));
    st->dtype = tm->properties.dtype;
    const Shape& S = chunk->sizes;
    st->chunk_shape = S;
    const size_t nd = S.size();
    if (item.storage_offsets.size() != nd || item.lengths.size() != nd) {
      return InvalidArgumentError("read item for " + ToString(key) + " has " +
                                  std::to_string(item.lengths.size()) + " dims, stored chunk has " +
                                  std::to_string(nd));
    }
    for (size_t d = 0; d < nd; ++d) {
      if (item.storage_offsets[d] < 0 || item.lengths[d] < 0 || item.storage_offsets[d] > S[d] ||
          item.lengths[d] > S[d] - item.storage_offsets[d]) {
        return InvalidArgumentError(
            "read item for " + ToString(key) + " box " + ShapeToString(item.storage_offsets) + "+" +
            ShapeToString(item.lengths) + " exceeds stored chunk " + ShapeToString(S));
      }
    }
    MEGA_ASSIGN_OR_RETURN(uint64_t chunk_bytes, ChunkNbytes(st->dtype, S));
    if (chunk_bytes != st->info->length) {
      return DataLossError(path_ + ": " + ToString(key) + " is stored as " +
                           std::to_string(st->info->length) + " bytes, its chunk " +
                           ShapeToString(S) + " of " + std::string(DTypeName(st->dtype)) +
                           " needs " + std::to_string(chunk_bytes));
    }
    MEGA_ASSIGN_OR_RETURN(st->dest, planner.ResolveTensor(item));
    if (st->dest.dtype() != st->dtype || st->dest.shape() != item.lengths) {
      return InvalidArgumentError("destination of " + ToString(key) + " is " +
                                  std::string(DTypeName(st->dest.dtype())) +
                                  ShapeToString(st->dest.shape()) + ", the read is " +
                                  std::string(DTypeName(st->dtype)) + ShapeToString(item.lengths));
    }
    if (st->dest.numel() == 0) return Status::OK();

    // Row-major strides of the stored chunk, in elements.
    const std::vector<int64_t> sstr = ContiguousStrides(S);
    const uint64_t esize = DTypeSize(st->dtype);
    // j: the split dim; all dims after j are read whole, so a run covers dims
    // [j, nd) contiguously.
    size_t j = nd;
    while (j > 0 && item.lengths[j - 1] == S[j - 1]) --j;
    if (j > 0) --j;  // dim j is partially read (or is the first dim)
    // Whole box contiguous in storage: all dims before j are single indices.
    bool one_run = true;
    for (size_t d = 0; d < j; ++d) one_run = one_run && item.lengths[d] == 1;
    uint64_t needed = st->dest.numel() * esize;
    uint64_t start_elem = 0;
    for (size_t d = 0; d < nd; ++d)
      start_elem += static_cast<uint64_t>(item.storage_offsets[d]) * sstr[d];
    if (st->dtype == DType::kF4) {
      // Bytes map 1:1 onto the destination for the whole chunk, or for one
      // storage run that starts on a byte boundary and fills whole bytes.
      const bool whole = j == 0 && item.lengths == S;
      const bool bytewise =
          st->dest.is_contiguous() &&
          (whole || (one_run && start_elem % 2 == 0 && st->dest.numel() % 2 == 0));
      if (!bytewise) {
        Segment seg;
        seg.owner = i;
        seg.f4 = true;
        segments->push_back(std::move(seg));
        return Status::OK();
      }
      needed = whole ? st->info->length : st->dest.numel() / 2;
    }
    if ((nd == 0 || one_run) && st->dest.is_contiguous()) {
      // Flat: cut into runs of about kReadUnit at block boundaries (relative
      // to the item), so that no two of them share a block.
      const uint64_t start = st->dtype == DType::kF4 ? start_elem / 2 : start_elem * esize;
      const uint64_t bs = BlockSizeOf(*st->info);
      const uint64_t unit = std::max<uint64_t>(kReadUnit / bs * bs, bs);
      uint64_t pos = start;
      const uint64_t end = start + needed;
      while (pos < end) {
        uint64_t next = std::min(end, (pos / unit + 1) * unit);
        Run r;
        r.item = i;
        r.rel = pos;
        r.len = next - pos;
        r.dest_ptr = static_cast<std::byte*>(st->dest.data()) + (pos - start);
        runs->push_back(std::move(r));
        pos = next;
      }
      return Status::OK();
    }
    return AddBoxRuns(i, item, *st, S, sstr, esize, j, runs);
  }

  // Groups the runs by stored item and cuts each group into segments: runs
  // whose block-widened ranges share a block go into one segment (up to
  // kMaxSegment bytes, beyond which a shared boundary block is read again).
  void BuildSegments(const std::vector<ItemState>& items, std::vector<Run> runs,
                     std::vector<Segment>* segments) const {
    std::stable_sort(runs.begin(), runs.end(), [&](const Run& x, const Run& y) {
      const StorageInfo* a = items[x.item].info;
      const StorageInfo* b = items[y.item].info;
      if (a != b) return std::less<const StorageInfo*>()(a, b);
      return x.rel < y.rel;
    });
    const bool verify = verifying();
    const StorageInfo* group = nullptr;
    for (Run& r : runs) {
      const StorageInfo& info = *items[r.item].info;
      uint64_t wa = r.rel, wb = r.rel + r.len;
      if (verify) std::tie(wa, wb) = Expanded(info, r.rel, r.len);
      const bool same = group == &info && !segments->empty() && !segments->back().f4;
      if (same && verify && wa < segments->back().b && wb - segments->back().a <= kMaxSegment) {
        Segment& seg = segments->back();
        seg.b = std::max(seg.b, wb);
        if (!r.dest_ptr) {
          r.staged_at = seg.staging;
          seg.staging += r.len;
        }
        seg.runs.push_back(std::move(r));
        continue;
      }
      group = &info;
      Segment seg;
      seg.owner = r.item;
      seg.a = wa;
      seg.b = wb;
      if (!r.dest_ptr) {
        r.staged_at = 0;
        seg.staging = r.len;
      }
      seg.runs.push_back(std::move(r));
      segments->push_back(std::move(seg));
    }
  }

  // Cuts the box of `item` into runs that are contiguous in storage and at most
  // staging_bytes long, in row-major order.
  Status AddBoxRuns(size_t i, const ReadItem& item, const ItemState& st, const Shape& S,
                    const std::vector<int64_t>& sstr, uint64_t esize, size_t j,
                    std::vector<Run>* runs) {
    const size_t nd = S.size();
    const uint64_t max_bytes = options_.staging_bytes;
    // Odometer over dims [0, j): one run per index tuple; a run is dim j's range
    // [off_j, off_j + len_j) with all later dims whole.
    std::vector<int64_t> idx(j, 0);
    while (true) {
      Shape offs(nd), lens(nd);
      for (size_t d = 0; d < j; ++d) {
        offs[d] = idx[d];
        lens[d] = 1;
      }
      for (size_t d = j; d < nd; ++d) {
        offs[d] = 0;
        lens[d] = item.lengths[d];
      }
      MEGA_RETURN_IF_ERROR(SplitRun(i, item, st, S, sstr, esize, j, offs, lens, max_bytes, runs));
      size_t d = j;
      while (d > 0) {
        --d;
        if (++idx[d] < item.lengths[d]) break;
        idx[d] = 0;
        if (d == 0) return Status::OK();
      }
      if (j == 0) return Status::OK();
    }
  }

  // offs/lens: a box relative to the read box, contiguous in storage (dims > k
  // whole, dims < k single). Emits it or splits along dim k.
  Status SplitRun(size_t i, const ReadItem& item, const ItemState& st, const Shape& S,
                  const std::vector<int64_t>& sstr, uint64_t esize, size_t k, Shape offs,
                  Shape lens, uint64_t max_bytes, std::vector<Run>* runs) {
    const size_t nd = S.size();
    uint64_t elems = 1;
    for (int64_t l : lens) elems *= static_cast<uint64_t>(l);
    if (elems * esize <= max_bytes || k >= nd) {
      Run r;
      r.item = i;
      uint64_t start = 0;
      for (size_t d = 0; d < nd; ++d) {
        start += static_cast<uint64_t>(item.storage_offsets[d] + offs[d]) * sstr[d];
      }
      r.rel = start * esize;
      r.len = elems * esize;
      Tensor v = st.dest;
      for (size_t d = 0; d < nd; ++d) {
        if (offs[d] != 0 || lens[d] != v.shape()[d]) {
          MEGA_ASSIGN_OR_RETURN(v, v.Narrow(static_cast<int>(d), offs[d], lens[d]));
        }
      }
      r.shape = lens;
      if (v.is_contiguous()) {
        r.dest_ptr = static_cast<std::byte*>(v.data());
      } else {
        r.dest = std::move(v);
      }
      runs->push_back(std::move(r));
      return Status::OK();
    }
    uint64_t row_elems = elems / static_cast<uint64_t>(lens[k]);
    uint64_t row_bytes = row_elems * esize;
    if (row_bytes <= max_bytes) {
      int64_t step = static_cast<int64_t>(max_bytes / row_bytes);
      const int64_t base = offs[k], total = lens[k];
      for (int64_t s = 0; s < total; s += step) {
        offs[k] = base + s;
        lens[k] = std::min(step, total - s);
        MEGA_RETURN_IF_ERROR(SplitRun(i, item, st, S, sstr, esize, k, offs, lens, max_bytes, runs));
      }
      return Status::OK();
    }
    const int64_t base = offs[k], total = lens[k];
    for (int64_t s = 0; s < total; ++s) {
      offs[k] = base + s;
      lens[k] = 1;
      MEGA_RETURN_IF_ERROR(
          SplitRun(i, item, st, S, sstr, esize, k + 1, offs, lens, max_bytes, runs));
    }
    return Status::OK();
  }

  // The checksum block size of an item: its recorded block size, or the whole
  // item when it has one checksum only.
  static uint64_t BlockSizeOf(const StorageInfo& info) {
    return info.block_size != 0 ? info.block_size : std::max<uint64_t>(info.length, 1);
  }

  // [rel, rel+len) widened to whole checksum blocks (clipped to the item).
  static std::pair<uint64_t, uint64_t> Expanded(const StorageInfo& info, uint64_t rel,
                                                uint64_t len) {
    const uint64_t bs = BlockSizeOf(info);
    uint64_t a = rel / bs * bs;
    uint64_t b = std::min(info.length, (rel + len + bs - 1) / bs * bs);
    return {a, b};
  }

  static bool HasChecksums(const StorageInfo& info) {
    if (info.block_size != 0) return true;
    return info.checksum.starts_with("crc32:") || info.checksum.starts_with("sha256:");
  }

  // Fetches the CRCs of the blocks covering item bytes [a, b) into *table:
  // from the item's table in the data file (one pread of just those entries,
  // into *buf), or the inline table of an older checkpoint's metadata. No
  // table (block_size 0): *table stays empty.
  Status FetchTable(const ItemState& st, const ReadItem& item, uint64_t a, uint64_t b,
                    std::vector<uint32_t>* buf, CrcTable* table) const {
    const StorageInfo& info = *st.info;
    *table = CrcTable{};
    if (info.block_size == 0) return Status::OK();
    if (!info.block_table_offset) {
      table->crcs = info.block_crc32.data();
      table->end = info.block_crc32.size();
      return Status::OK();
    }
    const uint64_t first = a / info.block_size;
    const uint64_t end = std::min(BlockCount(info), (b + info.block_size - 1) / info.block_size);
    if (end <= first) return Status::OK();
    buf->resize(end - first);
    const uint64_t at = *info.block_table_offset + first * kCrcEntry;
    MEGA_RETURN_IF_ERROR(
        st.file->ReadExactlyAt(at, std::as_writable_bytes(std::span<uint32_t>(*buf)))
            .WithContext("reading the checksum table of " + ToString(item.storage_index)));
    for (uint32_t& c : *buf) c = LoadLE32(&c);
    table->crcs = buf->data();
    table->first = first;
    table->end = end;
    return Status::OK();
  }

  // Checks the bytes of [a, b) of a stored item as they stream past, block by
  // block, in order, against `table` (which must cover those blocks when the
  // item has block CRCs). REQUIRES: a is a block boundary; b is one or the
  // item end.
  class BlockChecker {
   public:
    BlockChecker(const ItemState& st, const ReadItem& item, uint64_t a, bool verify,
                 const CrcTable& table)
        : st_(st),
          item_(item),
          verify_(verify),
          bs_(BlockSizeOf(*st.info)),
          pos_(a),
          block_(a / bs_),
          block_end_(std::min(st.info->length, (block_ + 1) * bs_)),
          table_(st.info->block_size != 0 ? &table : nullptr) {
      if (verify && st.info->block_size == 0 && st.info->checksum.starts_with("sha256:")) {
        sha256_.emplace();
      }
    }

    // One pass over the bytes while they are in cache: per block one CRC call
    // and one compare; CloseBlock (the message) only for a mismatch or an
    // item's single checksum. `data_crc`, when given, is Crc32(data) from the
    // read itself (ReadExactlyAtWithCrc32): whole blocks of the table, or a
    // stretch inside one block, are then checked without reading data again.
    Status Feed(std::span<const std::byte> data, std::optional<uint32_t> data_crc = std::nullopt) {
      if (!verify_) return Status::OK();
      MEGA_RETURN_IF_ERROR(FeedWholeBlocks(&data, data_crc));
      while (!data.empty()) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(block_end_ - pos_, data.size()));
        if (sha256_) {
          sha256_->Update(data.first(n));
        } else if (data_crc && n == data.size()) {
          crc_ = Crc32Combine(crc_, *data_crc, n);
        } else {
          crc_ = Crc32Extend(crc_, data.first(n));
        }
        data_crc.reset();  // it covers all of data, which no longer starts here
        pos_ += n;
        data = data.subspan(n);
        if (pos_ == block_end_) {
          if (!table_ || block_ < table_->first || block_ >= table_->end ||
              table_->crcs[block_ - table_->first] != crc_) {
            MEGA_RETURN_IF_ERROR(CloseBlock(block_));
          }
          crc_ = 0;
          ++block_;
          block_end_ = std::min(st_.info->length, block_end_ + bs_);
          // On a block boundary again: the rest goes through the streamed check.
          MEGA_RETURN_IF_ERROR(FeedWholeBlocks(&data, data_crc));
        }
      }
      return Status::OK();
    }

   private:
    // The whole blocks at the front of `data` that the fetched table covers,
    // when `data` starts on a block boundary: checked with one streamed CRC
    // (FindBadBlock). Leaves the rest in *data for Feed's block-by-block loop:
    // a block's head, a short last block, or a block outside the table (which
    // CloseBlock reports).
    Status FeedWholeBlocks(std::span<const std::byte>* data, std::optional<uint32_t>& data_crc) {
      if (sha256_ || !table_ || pos_ % bs_ != 0) return Status::OK();
      if (block_ < table_->first || block_ >= table_->end) return Status::OK();
      const uint64_t whole = std::min(
          std::min<uint64_t>(data->size(), st_.info->length - pos_) / bs_, table_->end - block_);
      if (whole == 0) return Status::OK();
      uint32_t bad_crc = 0;
      const std::span<const uint32_t> want(table_->crcs + (block_ - table_->first),
                                           static_cast<size_t>(whole));
      // data_crc is the CRC of these blocks only when they are all of data.
      const std::optional<uint32_t> span_crc =
          whole * bs_ == data->size() ? data_crc : std::optional<uint32_t>();
      data_crc.reset();  // what is left of data (if anything) is not what it covers
      const auto blocks = data->first(static_cast<size_t>(whole * bs_));
      if (auto bad = FindBadBlock(blocks, bs_, want, &bad_crc, span_crc)) {
        crc_ = bad_crc;
        Status s = CloseBlock(block_ + *bad);  // the named DataLoss error
        return s.ok()
                   ? InternalError("block check of " + st_.file->name() + " disagrees with itself")
                   : s;
      }
      pos_ += whole * bs_;
      block_ += whole;
      block_end_ = std::min(st_.info->length, (block_ + 1) * bs_);
      *data = data->subspan(static_cast<size_t>(whole * bs_));
      return Status::OK();
    }

    Status CloseBlock(uint64_t b) {
      const StorageInfo& info = *st_.info;
      if (sha256_) {
        const Sha256Digest digest = sha256_->Finish();
        if (ToHex(digest) != info.checksum.substr(7)) {
          return DataLossError("data file " + st_.file->name() + ": SHA-256 mismatch for " +
                               ToString(item_.storage_index));
        }
        return Status::OK();
      }
      const std::string range = "bytes [" + std::to_string(info.offset + b * bs_) + ", " +
                                std::to_string(info.offset + std::min(info.length, (b + 1) * bs_)) +
                                ") of the file";
      uint32_t expected = 0;
      if (info.block_size != 0) {
        if (b < table_->first || b >= table_->end) {
          return InternalError("data file " + st_.file->name() + ": no checksum of block " +
                               std::to_string(b) + " of " + ToString(item_.storage_index) +
                               " was fetched for this read");
        }
        expected = table_->crcs[b - table_->first];
      } else {
        expected = static_cast<uint32_t>(std::stoul(info.checksum.substr(6), nullptr, 16));
      }
      if (crc_ != expected) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "stored %08x, computed %08x", expected, crc_);
        if (info.block_size == 0) {
          return DataLossError("data file " + st_.file->name() + ": checksum mismatch in " +
                               ToString(item_.storage_index) + " " + range + " (" + buf +
                               "): the data is damaged");
        }
        return DataLossError("data file " + st_.file->name() + ": checksum mismatch in " +
                             ToString(item_.storage_index) + " block " + std::to_string(b) + ", " +
                             range + " (" + buf + "): data or its checksum table is damaged");
      }
      return Status::OK();
    }

    const ItemState& st_;
    const ReadItem& item_;
    bool verify_;
    uint64_t bs_;
    uint64_t pos_;
    uint64_t block_;         // index of the block pos_ is in
    uint64_t block_end_;     // its end (item-relative)
    const CrcTable* table_;  // block CRCs, or nullptr (one item checksum)
    uint32_t crc_ = 0;
    std::optional<Sha256> sha256_;  // items with one whole-item SHA-256
  };

  Status ReadPiece(const ItemState& st, const ReadItem& item, uint64_t rel,
                   std::span<std::byte> dst) const {
    return st.file->ReadExactlyAt(st.info->offset + rel, dst)
        .WithContext("reading " + ToString(item.storage_index));
  }

  // ReadPiece and its CRC from the same pass (ReadExactlyAtWithCrc32), fed
  // to `check`: the read step of every verified direct read.
  Status ReadPieceChecked(const ItemState& st, const ReadItem& item, uint64_t rel,
                          std::span<std::byte> dst, BlockChecker& check) const {
    Result<uint32_t> crc = st.file->ReadExactlyAtWithCrc32(st.info->offset + rel, dst);
    if (!crc.ok()) return crc.status().WithContext("reading " + ToString(item.storage_index));
    return check.Feed(dst, *crc);
  }

  // Reads item bytes [a, a + dst.size()) into dst, verifying every block
  // (REQUIRES: whole blocks when verifying).
  Status ReadVerified(const ItemState& st, const ReadItem& item, uint64_t a,
                      std::span<std::byte> dst) const {
    if (!verifying()) return ReadPiece(st, item, a, dst);
    std::vector<uint32_t> table_buf;
    CrcTable table;
    MEGA_RETURN_IF_ERROR(FetchTable(st, item, a, a + dst.size(), &table_buf, &table));
    BlockChecker check(st, item, a, true, table);
    return ReadPieceChecked(st, item, a, dst, check);
  }

  // Reads a segment: long stretches of one contiguous destination go straight
  // into it; everything else (block edges, gaps between runs that share a
  // block, box destinations) through a hot piece buffer, copied out after the
  // CRC. Box runs are staged and copied into place once every block of the
  // segment has been verified.
  Status ReadSegment(const ItemState& st, const ReadItem& item, const Segment& seg,
                     const CrcTable& table) {
    BlockChecker check(st, item, seg.a, verifying(), table);
    const std::vector<Run>& runs = seg.runs;
    ScratchLease staging(this, seg.staging);
    if (seg.staging && !staging.data()) {
      return ResourceExhaustedError("cannot allocate a read buffer of " +
                                    std::to_string(seg.staging) + " bytes");
    }
    std::optional<ScratchLease> piece_buf;
    uint64_t pos = seg.a;
    size_t k = 0;
    while (pos < seg.b) {
      while (k < runs.size() && runs[k].rel + runs[k].len <= pos) ++k;
      const uint64_t limit = std::min(seg.b, pos + PieceBytes());
      // Straight into the destination: [pos, direct_end) lies in run k only.
      // A verified stretch is read whole: ReadExactlyAtWithCrc32 checksums it
      // in the read's own pass (mapped local files) or piece by piece.
      if (k < runs.size() && runs[k].dest_ptr && runs[k].rel <= pos) {
        const Run& r = runs[k];
        uint64_t direct_end = std::min(verifying() ? seg.b : limit, r.rel + r.len);
        if (k + 1 < runs.size() && runs[k + 1].rel < direct_end) direct_end = runs[k + 1].rel;
        if (direct_end > pos && (direct_end - pos >= kDirectReadMin || direct_end == seg.b)) {
          std::span<std::byte> dst(r.dest_ptr + (pos - r.rel), direct_end - pos);
          if (verifying()) {
            MEGA_RETURN_IF_ERROR(ReadPieceChecked(st, item, pos, dst, check));
          } else {
            MEGA_RETURN_IF_ERROR(ReadPiece(st, item, pos, dst));
          }
          pos = direct_end;
          continue;
        }
      }
      // Through the piece buffer, stopping where a long direct stretch starts.
      uint64_t stop = limit;
      for (size_t j = k; j < runs.size() && runs[j].rel < stop; ++j) {
        if (runs[j].rel > pos && runs[j].dest_ptr && runs[j].len >= kDirectReadMin) {
          stop = runs[j].rel;
          break;
        }
      }
      if (!piece_buf) {
        piece_buf.emplace(this, kReadPiece);
        if (!piece_buf->data()) return ResourceExhaustedError("cannot allocate a read buffer");
      }
      std::span<std::byte> buf(piece_buf->data(), stop - pos);
      MEGA_RETURN_IF_ERROR(ReadPiece(st, item, pos, buf));
      MEGA_RETURN_IF_ERROR(check.Feed(buf));
      for (size_t j = k; j < runs.size() && runs[j].rel < stop; ++j) {
        const Run& r = runs[j];
        const uint64_t x = std::max(pos, r.rel), y = std::min(stop, r.rel + r.len);
        if (x >= y) continue;
        std::byte* to =
            r.dest_ptr ? r.dest_ptr + (x - r.rel) : staging.data() + r.staged_at + (x - r.rel);
        std::memcpy(to, buf.data() + (x - pos), y - x);
      }
      pos = stop;
    }
    for (const Run& r : runs) {
      if (r.dest_ptr) continue;
      MEGA_ASSIGN_OR_RETURN(Tensor src,
                            Tensor::FromBlob(staging.data() + r.staged_at, st.dtype, r.shape));
      MEGA_RETURN_IF_ERROR(CopyTensor(src, r.dest));
    }
    return Status::OK();
  }

  // Reads an F4 box that does not map onto whole destination bytes: each span
  // (grouped like ReadBoxRuns: at most staging_bytes, at most 5% more bytes
  // than its runs need), widened to whole checksum blocks when verifying, is
  // read and verified into staging, then its runs are copied nibble-exactly.
  Status ReadF4Segment(const ItemState& st, const ReadItem& item) {
    const Shape& S = st.chunk_shape;
    return ForEachF4Span(S, item.storage_offsets, item.lengths, options_.staging_bytes,
                         kF4MaxOverhead, [&](const F4Span& span) -> Status {
                           uint64_t a = span.begin, b = span.end;
                           if (verifying())
                             std::tie(a, b) = Expanded(*st.info, span.begin, span.end - span.begin);
                           ScratchLease lease(this, b - a);
                           if (!lease.data()) {
                             return ResourceExhaustedError("cannot allocate a read buffer of " +
                                                           std::to_string(b - a) + " bytes");
                           }
                           MEGA_RETURN_IF_ERROR(ReadVerified(
                               st, item, a, std::span<std::byte>(lease.data(), b - a)));
                           return CopyF4Span(span, lease.data(), a, S, st.dest);
                         });
  }

  // Reusable, pre-faulted staging buffers (first-touch faults are expensive).
  class ScratchLease {
   public:
    ScratchLease(FileSystemReaderImpl* r, uint64_t bytes) : r_(r) {
      if (bytes == 0) return;
      std::lock_guard<std::mutex> lock(r_->scratch_mu_);
      for (size_t k = 0; k < r_->scratch_.size(); ++k) {
        if (r_->scratch_[k].second >= bytes) {
          buf_ = std::move(r_->scratch_[k]);
          r_->scratch_.erase(r_->scratch_.begin() + k);
          return;
        }
      }
      // Piece buffers are small; other leases are sized for reuse by any later one.
      uint64_t size = bytes <= kReadPiece
                          ? kReadPiece
                          : std::max<uint64_t>(bytes, r_->options_.staging_bytes + 2 * kReadPiece);
      auto mem = AllocateBuffer(size, /*prefault=*/true);
      if (mem.ok()) buf_ = {std::move(*mem), size};
    }
    ~ScratchLease() {
      if (!buf_.first) return;
      std::lock_guard<std::mutex> lock(r_->scratch_mu_);
      r_->scratch_.push_back(std::move(buf_));
    }
    ScratchLease(const ScratchLease&) = delete;
    ScratchLease& operator=(const ScratchLease&) = delete;
    std::byte* data() const { return buf_.first.get(); }

   private:
    FileSystemReaderImpl* r_;
    std::pair<std::shared_ptr<std::byte>, uint64_t> buf_;
  };

  std::string path_;
  FileSystemReaderOptions options_;
  std::shared_ptr<fs::FileSystem> fs_;
  std::shared_ptr<Metadata> metadata_;
  std::map<std::string, std::unique_ptr<RandomAccessFile>> files_;
  std::unique_ptr<ThreadPool> pool_;
  std::mutex scratch_mu_;
  std::vector<std::pair<std::shared_ptr<std::byte>, uint64_t>> scratch_;
};

}  // namespace

std::unique_ptr<StorageWriter> NewFileSystemWriter(std::string path,
                                                   FileSystemWriterOptions options) {
  return std::make_unique<FileSystemWriterImpl>(std::move(path), std::move(options));
}

std::unique_ptr<StorageReader> NewFileSystemReader(std::string path,
                                                   FileSystemReaderOptions options) {
  return std::make_unique<FileSystemReaderImpl>(std::move(path), std::move(options));
}

}  // namespace megackpt::dcp
