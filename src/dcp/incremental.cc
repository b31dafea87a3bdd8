// IncrementalWriter (dcp/incremental.h). Per WriteData call:
//   1. hash every item (XXH3-128 per fixed block, items in parallel), straight
//      from the tensor's memory (strided tensors through a bounded buffer);
//   2. an item whose block hashes equal the base's record for the same
//      MetadataIndex (same length, same block size) is referenced: the base's
//      data file is hard-linked into this folder under its own name (unique:
//      it carries the base's save id) and the base's StorageInfo -- offset,
//      length, CRCs -- is returned for it;
//   3. the other items go to the wrapped FileSystemWriter in one sub-plan; their
//      hashes are added to their results (StorageInfo::extra) for the next step.
// Links are made before WriteData returns, i.e. before the commit, so the
// committed .metadata only names files present in the folder. Abort removes
// the links this rank made.
#include "dcp/incremental.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "megackpt/core/file.h"  // BaseName, ParentOf
#include "megackpt/core/checksum.h"
#include "megackpt/core/thread_pool.h"
#include "megackpt/dcp/filesystem.h"

namespace megackpt::dcp {
namespace {

constexpr uint64_t kGatherBytes = 16ull << 20;  // strided tensors are hashed through this much

// Feeds a byte stream, cut at block boundaries, to XXH3-128.
class BlockHasher {
 public:
  explicit BlockHasher(uint64_t block_size) : block_size_(block_size), state_(XXH3_createState()) {
    XXH3_128bits_reset(state_);
  }
  ~BlockHasher() { XXH3_freeState(state_); }
  BlockHasher(const BlockHasher&) = delete;
  BlockHasher& operator=(const BlockHasher&) = delete;

  void Add(std::span<const std::byte> data) {
    while (!data.empty()) {
      const uint64_t n = std::min<uint64_t>(data.size(), block_size_ - in_block_);
      XXH3_128bits_update(state_, data.data(), static_cast<size_t>(n));
      in_block_ += n;
      data = data.subspan(static_cast<size_t>(n));
      if (in_block_ == block_size_) Close();
    }
  }
  BlockHashes Finish() {
    if (in_block_ > 0 || out_.digests.empty()) Close();
    out_.block_size = block_size_;
    return std::move(out_);
  }

 private:
  void Close() {
    XXH128_hash_t h = XXH3_128bits_digest(state_);
    out_.digests.emplace_back(h.high64, h.low64);
    XXH3_128bits_reset(state_);
    in_block_ = 0;
  }
  uint64_t block_size_;
  XXH3_state_t* state_;
  uint64_t in_block_ = 0;
  BlockHashes out_;
};

// Hashes the dense row-major bytes of `t`.
Result<BlockHashes> HashTensor(const Tensor& t, uint64_t block_size) {
  if (t.is_contiguous() || t.numel() == 0) {
    return HashBlocks(std::span<const std::byte>(static_cast<const std::byte*>(t.data()), t.nbytes()),
                      block_size);
  }
  // Slabs along the first dim, copied into a contiguous buffer.
  const int64_t rows = t.shape()[0];
  const uint64_t row_bytes = t.nbytes() / static_cast<uint64_t>(std::max<int64_t>(rows, 1));
  const int64_t step = std::max<int64_t>(1, static_cast<int64_t>(kGatherBytes / std::max<uint64_t>(row_bytes, 1)));
  std::vector<std::byte> buffer(static_cast<size_t>(std::min<uint64_t>(t.nbytes(), row_bytes * step)));
  BlockHasher hasher(block_size);
  for (int64_t start = 0; start < rows; start += step) {
    const int64_t n = std::min(step, rows - start);
    MEGA_ASSIGN_OR_RETURN(Tensor slab, t.Narrow(0, start, n));
    MEGA_ASSIGN_OR_RETURN(Tensor dst, Tensor::FromBlob(buffer.data(), t.dtype(), slab.shape()));
    MEGA_RETURN_IF_ERROR(CopyTensor(slab, dst));
    hasher.Add(std::span<const std::byte>(buffer.data(), slab.nbytes()));
  }
  return hasher.Finish();
}

class IncrementalWriter final : public StorageWriter {
 public:
  IncrementalWriter(std::unique_ptr<StorageWriter> inner, std::string dir,
                    std::shared_ptr<fs::FileSystem> fs, IncrementalWriterOptions options,
                    std::shared_ptr<IncrementalStats> stats)
      : inner_(std::move(inner)), dir_(std::move(dir)), fs_(std::move(fs)),
        options_(std::move(options)), stats_(stats ? std::move(stats) : std::make_shared<IncrementalStats>()) {
    if (options_.block_size == 0) options_.block_size = 1ull << 20;
    if (options_.thread_count < 1) options_.thread_count = 1;
  }

  Status Reset(std::string_view checkpoint_id) override {
    if (!checkpoint_id.empty()) dir_ = std::string(checkpoint_id);
    links_.clear();
    return inner_->Reset(checkpoint_id);
  }
  bool ValidateCheckpointId(std::string_view id) const override { return inner_->ValidateCheckpointId(id); }
  std::optional<StorageMeta> GetStorageMeta() const override { return inner_->GetStorageMeta(); }

  Status SetUpStorageWriter(const StorageSetUp& setup) override {
    MEGA_RETURN_IF_ERROR(inner_->SetUpStorageWriter(setup));
    base_.clear();
    if (options_.base_dir.empty()) return Status::OK();
    const std::string md_path = fs::JoinPath(options_.base_dir, kMetadataFileName);
    MEGA_ASSIGN_OR_RETURN(std::string text, fs_->ReadWhole(md_path, kMaxMetadataBytes));
    auto md = DecodeMetadata(text);
    if (!md.ok()) return Status(md.status().code(), md_path + ": " + md.status().message());
    for (auto& [index, info] : md->storage_data) {
      auto hashes = DecodeBlockHashes(info.extra);
      // Only data files of this layout, named plainly inside the base folder.
      if (!hashes || !info.relative_path.ends_with(".distcp") ||
          info.relative_path.find('/') != std::string::npos) {
        continue;
      }
      base_.emplace(index, BaseItem{info, std::move(*hashes)});
    }
    return Status::OK();
  }

  Result<SavePlan> PrepareLocalPlan(SavePlan plan) override { return inner_->PrepareLocalPlan(std::move(plan)); }
  Result<std::vector<SavePlan>> PrepareGlobalPlan(std::vector<SavePlan> plans) override {
    return inner_->PrepareGlobalPlan(std::move(plans));
  }

  Result<std::vector<WriteResult>> WriteData(const SavePlan& plan, SavePlanner& planner) override {
    const size_t n = plan.items.size();
    std::vector<std::optional<BlockHashes>> hashes(n);
    if (!pool_ && options_.thread_count > 1) pool_ = std::make_unique<ThreadPool>(options_.thread_count - 1);
    MEGA_RETURN_IF_ERROR(ParallelFor(
        pool_.get(), n,
        [&](size_t i) -> Status {
          const WriteItem& item = plan.items[i];
          MEGA_ASSIGN_OR_RETURN(ResolvedData data, planner.ResolveData(item));
          if (item.type == WriteItemType::kByteIO) {
            hashes[i] = HashBlocks(AsBytes(data.bytes), options_.block_size);
            return Status::OK();
          }
          auto h = HashTensor(data.tensor, options_.block_size);
          if (h.ok()) hashes[i] = std::move(*h);  // else: written, without a record
          return Status::OK();
        },
        options_.thread_count));
    std::vector<WriteResult> results(n);
    SavePlan changed;
    changed.storage_data = plan.storage_data;
    changed.planner_data = plan.planner_data;
    std::vector<size_t> changed_at;
    for (size_t i = 0; i < n; ++i) {
      const WriteItem& item = plan.items[i];
      MetadataIndex key = item.index;
      key.index.reset();
      auto it = base_.find(key);
      if (hashes[i] && it != base_.end() && it->second.info.length == WriteItemNbytes(item) &&
          it->second.hashes == *hashes[i]) {
        MEGA_RETURN_IF_ERROR(LinkFromBase(it->second.info.relative_path));
        WriteResult& r = results[i];
        r.index = item.index;
        r.size_in_bytes = it->second.info.length;
        r.storage_data = it->second.info;
        stats_->items_referenced += 1;
        stats_->bytes_referenced += r.size_in_bytes;
        continue;
      }
      changed.items.push_back(item);
      changed_at.push_back(i);
    }
    if (!changed.items.empty()) {
      MEGA_ASSIGN_OR_RETURN(std::vector<WriteResult> written, inner_->WriteData(changed, planner));
      if (written.size() != changed.items.size()) {
        return InternalError(dir_ + ": the writer returned " + std::to_string(written.size()) +
                             " results for " + std::to_string(changed.items.size()) + " items");
      }
      for (size_t k = 0; k < written.size(); ++k) {
        const size_t i = changed_at[k];
        WriteResult& r = results[i];
        r = std::move(written[k]);
        if (hashes[i] && r.storage_data.extra.empty()) r.storage_data.extra = EncodeBlockHashes(*hashes[i]);
        stats_->items_written += 1;
        stats_->bytes_written += r.size_in_bytes;
      }
    }
    return results;
  }

  Status Finish(const Metadata& metadata, const std::vector<std::vector<WriteResult>>& results) override {
    MEGA_RETURN_IF_ERROR(inner_->Finish(metadata, results));
    committed_ = true;
    return Status::OK();
  }

  void Abort() override {
    inner_->Abort();
    if (committed_) return;
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::string& l : links_) fs_->Remove(l).IgnoreError();
    links_.clear();
  }

 private:
  struct BaseItem {
    StorageInfo info;
    BlockHashes hashes;
  };

  // Makes base_dir/name available as dir/name (once per file and save).
  Status LinkFromBase(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string to = fs::JoinPath(dir_, name);
    if (linked_.count(to)) return Status::OK();
    const std::string from = fs::JoinPath(options_.base_dir, name);
    Status s = fs_->Link(from, to);
    if (s.code() == StatusCode::kAlreadyExists) {
      // Another rank of this save linked it first (same folder, same name:
      // the base's file, named by the base's save id), or an aborted attempt left it.
      MEGA_ASSIGN_OR_RETURN(fs::FileInfo a, fs_->Stat(from));
      MEGA_ASSIGN_OR_RETURN(fs::FileInfo b, fs_->Stat(to));
      if (a.size != b.size) {
        return DataLossError(to + " exists and differs from " + from + " (" + std::to_string(b.size) +
                             " vs " + std::to_string(a.size) + " bytes)");
      }
      s = Status::OK();
    } else if (s.ok()) {
      links_.push_back(to);
    }
    MEGA_RETURN_IF_ERROR(s.WithContext("incremental save: referencing " + BaseName(from) + " of the base"));
    linked_.insert(to);
    return Status::OK();
  }

  std::unique_ptr<StorageWriter> inner_;
  std::string dir_;
  std::shared_ptr<fs::FileSystem> fs_;
  IncrementalWriterOptions options_;
  std::shared_ptr<IncrementalStats> stats_;
  std::map<MetadataIndex, BaseItem> base_;
  std::unique_ptr<ThreadPool> pool_;
  std::mutex mu_;
  std::vector<std::string> links_;  // made by this rank in this save
  std::set<std::string> linked_;
  bool committed_ = false;
};

}  // namespace

std::string EncodeBlockHashes(const BlockHashes& hashes) {
  std::string out(kBlockHashPrefix);
  out += std::to_string(hashes.block_size);
  out += '/';
  char buf[40];
  for (const auto& [hi, lo] : hashes.digests) {
    std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                  static_cast<unsigned long long>(lo));
    out += buf;
  }
  return out;
}

std::optional<BlockHashes> DecodeBlockHashes(std::string_view extra) {
  if (!extra.starts_with(kBlockHashPrefix)) return std::nullopt;
  extra.remove_prefix(kBlockHashPrefix.size());
  const size_t slash = extra.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash > 19) return std::nullopt;
  BlockHashes h;
  for (char c : extra.substr(0, slash)) {
    if (c < '0' || c > '9') return std::nullopt;
    h.block_size = h.block_size * 10 + static_cast<uint64_t>(c - '0');
  }
  if (h.block_size == 0) return std::nullopt;
  std::string_view hex = extra.substr(slash + 1);
  if (hex.empty() || hex.size() % 32 != 0) return std::nullopt;
  auto word = [](std::string_view s, uint64_t* v) {
    *v = 0;
    for (char c : s) {
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (d < 0) return false;
      *v = (*v << 4) | static_cast<uint64_t>(d);
    }
    return true;
  };
  for (size_t p = 0; p < hex.size(); p += 32) {
    uint64_t hi = 0, lo = 0;
    if (!word(hex.substr(p, 16), &hi) || !word(hex.substr(p + 16, 16), &lo)) return std::nullopt;
    h.digests.emplace_back(hi, lo);
  }
  return h;
}

BlockHashes HashBlocks(std::span<const std::byte> data, uint64_t block_size) {
  BlockHashes out;
  out.block_size = block_size;
  if (data.empty()) {
    XXH128_hash_t h = XXH3_128bits(nullptr, 0);
    out.digests.emplace_back(h.high64, h.low64);
    return out;
  }
  for (uint64_t pos = 0; pos < data.size(); pos += block_size) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(block_size, data.size() - pos));
    XXH128_hash_t h = XXH3_128bits(data.data() + pos, n);
    out.digests.emplace_back(h.high64, h.low64);
  }
  return out;
}

std::unique_ptr<StorageWriter> NewIncrementalWriter(std::unique_ptr<StorageWriter> inner, std::string dir,
                                                    std::shared_ptr<fs::FileSystem> fs,
                                                    IncrementalWriterOptions options,
                                                    std::shared_ptr<IncrementalStats> stats) {
  return std::make_unique<IncrementalWriter>(std::move(inner), std::move(dir), std::move(fs),
                                             std::move(options), std::move(stats));
}

}  // namespace megackpt::dcp
