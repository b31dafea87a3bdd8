// IncrementalWriter (dcp/incremental.h). Per WriteData call:
//   1. an item with no usable base record (none for its MetadataIndex, another
//      length or block size) is changed; of the others (contiguous tensors and
//      bytes values) the FIRST block is hashed and compared with the base's
//      record, items in parallel;
//   2. the items known changed go to the wrapped FileSystemWriter at once (on
//      a separate thread), which writes them and hashes them while it writes
//      (FileSystemWriterOptions::hash_block_size: the record lands in
//      StorageInfo::extra for the next step);
//   3. meanwhile the undecided items are hashed block by block from the
//      tensor's memory (strided tensors through a bounded buffer), each given
//      up at its first block that differs from the base record; those go to
//      the writer in a second sub-plan once the first one is done;
//   4. an item equal in every block is referenced: the base's data file is
//      hard-linked into this folder under its own name (unique: it carries
//      the base's save id) and the base's StorageInfo -- offset, length, CRCs,
//      hash record -- is returned for it.
// Links are made before WriteData returns, i.e. before the commit, so the
// committed .metadata only names files present in the folder. Abort removes
// the links this rank made.
#include "dcp/incremental.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <thread>

#include "dcp/guard.h"
#include "megackpt/core/checksum.h"  // AsBytes
#include "megackpt/core/file.h"      // BaseName
#include "megackpt/core/thread_pool.h"
#include "megackpt/dcp/filesystem.h"

namespace megackpt::dcp {
namespace {

constexpr uint64_t kGatherBytes = 16ull << 20;  // strided tensors are compared through this much

// Blocks an item of `length` bytes has in a record of `block_size`.
uint64_t BlockCount(uint64_t length, uint64_t block_size) {
  return length == 0 ? 1 : (length + block_size - 1) / block_size;
}

// Compares a byte stream, from block `first` of the item on, with a base
// record, block by block as the blocks complete.
class BlockMatcher {
 public:
  BlockMatcher(const BlockHashes& base, size_t first)
      : base_(base), next_(first), hasher_(base.block_size) {}

  // False as soon as a completed block differs (feed no more then).
  bool Add(std::span<const std::byte> data) {
    const uint64_t bs = base_.block_size;
    while (!data.empty()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(data.size(), bs - fed_ % bs));
      hasher_.Add(data.first(n));
      fed_ += n;
      data = data.subspan(n);
      if (!Check(hasher_.completed())) return false;
    }
    return true;
  }
  // True when every block equals the base's (the stream is complete).
  bool Finish() {
    const BlockHashes h = hasher_.Finish();
    return Check(h.digests) && next_ == base_.digests.size();
  }
  uint64_t fed() const { return fed_; }  // bytes hashed

 private:
  bool Check(const std::vector<BlockDigest>& done) {
    for (; checked_ < done.size(); ++checked_, ++next_) {
      if (next_ >= base_.digests.size() || done[checked_] != base_.digests[next_]) return false;
    }
    return true;
  }
  const BlockHashes& base_;
  size_t next_;         // base block the next completed block is compared with
  size_t checked_ = 0;  // of hasher_.completed()
  uint64_t fed_ = 0;
  BlockHasher hasher_;
};

// The stored bytes of an item when they are one contiguous span of memory.
std::optional<std::span<const std::byte>> ContiguousBytes(const WriteItem& item,
                                                          const ResolvedData& data) {
  if (item.type == WriteItemType::kByteIO) return AsBytes(data.bytes);
  const Tensor& t = data.tensor;
  if (t.numel() == 0) return std::span<const std::byte>();
  if (!t.is_contiguous()) return std::nullopt;
  return std::span<const std::byte>(static_cast<const std::byte*>(t.data()), t.nbytes());
}

// Feeds the dense row-major bytes of the strided tensor `t` to `m` through a
// buffer of at most kGatherBytes (slabs along the first dim); stops at the
// first differing block.
Result<bool> MatchStrided(const Tensor& t, BlockMatcher& m) {
  const int64_t rows = t.shape()[0];
  const uint64_t row_bytes = t.nbytes() / static_cast<uint64_t>(std::max<int64_t>(rows, 1));
  const int64_t step =
      std::max<int64_t>(1, static_cast<int64_t>(kGatherBytes / std::max<uint64_t>(row_bytes, 1)));
  std::vector<std::byte> buffer(
      static_cast<size_t>(std::min<uint64_t>(t.nbytes(), row_bytes * step)));
  for (int64_t start = 0; start < rows; start += step) {
    const int64_t n = std::min(step, rows - start);
    MEGA_ASSIGN_OR_RETURN(Tensor slab, t.Narrow(0, start, n));
    MEGA_ASSIGN_OR_RETURN(Tensor dst, Tensor::FromBlob(buffer.data(), t.dtype(), slab.shape()));
    MEGA_RETURN_IF_ERROR(CopyTensor(slab, dst));
    if (!m.Add(std::span<const std::byte>(buffer.data(), slab.nbytes()))) return false;
  }
  return m.Finish();
}

class IncrementalWriter final : public StorageWriter {
 public:
  IncrementalWriter(std::unique_ptr<StorageWriter> inner, std::string dir,
                    std::shared_ptr<fs::FileSystem> fs, IncrementalWriterOptions options,
                    std::shared_ptr<IncrementalStats> stats)
      : inner_(std::move(inner)),
        dir_(std::move(dir)),
        fs_(std::move(fs)),
        options_(std::move(options)),
        stats_(stats ? std::move(stats) : std::make_shared<IncrementalStats>()) {
    if (options_.block_size == 0) options_.block_size = 1ull << 20;
    if (options_.thread_count < 1) options_.thread_count = 1;
  }

  Status Reset(std::string_view checkpoint_id) override {
    if (!checkpoint_id.empty()) dir_ = std::string(checkpoint_id);
    links_.clear();
    linked_.clear();
    return inner_->Reset(checkpoint_id);
  }
  bool ValidateCheckpointId(std::string_view id) const override {
    return inner_->ValidateCheckpointId(id);
  }
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
      // Only data files of this layout, named plainly inside the base folder,
      // with a record of this save's block size.
      if (!info.relative_path.ends_with(".distcp") ||
          info.relative_path.find('/') != std::string::npos) {
        continue;
      }
      auto hashes = DecodeBlockHashes(info.extra);
      if (!hashes || hashes->block_size != options_.block_size ||
          hashes->digests.size() != BlockCount(info.length, hashes->block_size)) {
        continue;
      }
      base_.emplace(index, BaseItem{std::move(info), std::move(*hashes)});
    }
    return Status::OK();
  }

  Result<SavePlan> PrepareLocalPlan(SavePlan plan) override {
    return inner_->PrepareLocalPlan(std::move(plan));
  }
  Result<std::vector<SavePlan>> PrepareGlobalPlan(std::vector<SavePlan> plans) override {
    return inner_->PrepareGlobalPlan(std::move(plans));
  }

  Result<std::vector<WriteResult>> WriteData(const SavePlan& plan, SavePlanner& planner) override {
    const size_t n = plan.items.size();
    const uint64_t bs = options_.block_size;
    enum class Verdict { kChanged, kUndecided, kSame };
    std::vector<Verdict> verdict(n, Verdict::kChanged);
    std::vector<const BaseItem*> base(n, nullptr);
    std::vector<size_t> resume(n, 0);  // first block not yet compared
    for (size_t i = 0; i < n; ++i) {
      MetadataIndex key = plan.items[i].index;
      key.index.reset();
      auto it = base_.find(key);
      if (it != base_.end() && it->second.info.length == WriteItemNbytes(plan.items[i])) {
        base[i] = &it->second;
        verdict[i] = Verdict::kUndecided;
      }
    }
    if (!pool_ && options_.thread_count > 1)
      pool_ = std::make_unique<ThreadPool>(options_.thread_count - 1);
    std::atomic<uint64_t> compared{0};
    // 1. First blocks of the contiguous items.
    MEGA_RETURN_IF_ERROR(ParallelFor(
        pool_.get(), n,
        [&](size_t i) -> Status {
          if (verdict[i] != Verdict::kUndecided) return Status::OK();
          return Guard("IncrementalWriter::WriteData", [&]() -> Status {
            MEGA_ASSIGN_OR_RETURN(ResolvedData data, planner.ResolveData(plan.items[i]));
            const auto bytes = ContiguousBytes(plan.items[i], data);
            if (!bytes) return Status::OK();  // strided: all in step 3
            BlockMatcher m(base[i]->hashes, 0);
            const size_t head = static_cast<size_t>(std::min<uint64_t>(bs, bytes->size()));
            bool same = m.Add(bytes->first(head));
            compared += m.fed();
            if (same && bytes->size() <= bs) {
              verdict[i] = m.Finish() ? Verdict::kSame : Verdict::kChanged;
            } else if (!same) {
              verdict[i] = Verdict::kChanged;
            } else {
              resume[i] = 1;
            }
            return Status::OK();
          });
        },
        options_.thread_count));
    // 2. The items known changed go to the writer now...
    std::vector<WriteResult> results(n);
    std::vector<size_t> first_batch = Select(verdict, Verdict::kChanged);
    Result<std::vector<WriteResult>> written_first = std::vector<WriteResult>();
    std::thread writer;
    if (!first_batch.empty()) {
      writer = std::thread([&] {
        written_first = Guard("FileSystemWriter::WriteData", [&] {
          return inner_->WriteData(SubPlan(plan, first_batch), planner);
        });
      });
    }
    // 3. ...while the undecided ones are compared to the end or their first differing block.
    Status cmp = ParallelFor(
        pool_.get(), n,
        [&](size_t i) -> Status {
          if (verdict[i] != Verdict::kUndecided) return Status::OK();
          return Guard("IncrementalWriter::WriteData", [&]() -> Status {
            MEGA_ASSIGN_OR_RETURN(ResolvedData data, planner.ResolveData(plan.items[i]));
            BlockMatcher m(base[i]->hashes, resume[i]);
            Result<bool> same = false;
            if (const auto bytes = ContiguousBytes(plan.items[i], data)) {
              const auto rest = bytes->subspan(static_cast<size_t>(resume[i] * bs));
              same = m.Add(rest) && m.Finish();
            } else {
              same = MatchStrided(data.tensor, m);
            }
            compared += m.fed();
            MEGA_RETURN_IF_ERROR(same.status());
            verdict[i] = *same ? Verdict::kSame : Verdict::kChanged;
            return Status::OK();
          });
        },
        options_.thread_count);
    if (writer.joinable()) writer.join();
    stats_->bytes_compared += compared.load();
    MEGA_RETURN_IF_ERROR(cmp);
    MEGA_RETURN_IF_ERROR(Take(std::move(written_first), first_batch, &results));
    // 4. The items that differed after their first block, then the references.
    std::vector<size_t> second_batch;
    for (size_t i : Select(verdict, Verdict::kChanged)) {
      if (!std::binary_search(first_batch.begin(), first_batch.end(), i)) second_batch.push_back(i);
    }
    if (!second_batch.empty()) {
      MEGA_RETURN_IF_ERROR(
          Take(inner_->WriteData(SubPlan(plan, second_batch), planner), second_batch, &results));
    }
    for (size_t i : Select(verdict, Verdict::kSame)) {
      MEGA_RETURN_IF_ERROR(LinkFromBase(base[i]->info.relative_path));
      WriteResult& r = results[i];
      r.index = plan.items[i].index;
      r.size_in_bytes = base[i]->info.length;
      r.storage_data = base[i]->info;
      stats_->items_referenced += 1;
      stats_->bytes_referenced += r.size_in_bytes;
    }
    return results;
  }

  Status Finish(const Metadata& metadata,
                const std::vector<std::vector<WriteResult>>& results) override {
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

  template <typename V>
  static std::vector<size_t> Select(const std::vector<V>& verdict, V want) {
    std::vector<size_t> out;
    for (size_t i = 0; i < verdict.size(); ++i) {
      if (verdict[i] == want) out.push_back(i);
    }
    return out;
  }

  static SavePlan SubPlan(const SavePlan& plan, const std::vector<size_t>& at) {
    SavePlan sub;
    sub.storage_data = plan.storage_data;
    sub.planner_data = plan.planner_data;
    for (size_t i : at) sub.items.push_back(plan.items[i]);
    return sub;
  }

  // Puts the wrapped writer's results for the items `at` into `results`.
  Status Take(Result<std::vector<WriteResult>> written, const std::vector<size_t>& at,
              std::vector<WriteResult>* results) {
    MEGA_RETURN_IF_ERROR(written.status());
    if (written->size() != at.size()) {
      return InternalError(dir_ + ": the writer returned " + std::to_string(written->size()) +
                           " results for " + std::to_string(at.size()) + " items");
    }
    for (size_t k = 0; k < at.size(); ++k) {
      WriteResult& r = (*results)[at[k]];
      r = std::move((*written)[k]);
      stats_->items_written += 1;
      stats_->bytes_written += r.size_in_bytes;
    }
    return Status::OK();
  }

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
        return DataLossError(to + " exists and differs from " + from + " (" +
                             std::to_string(b.size) + " vs " + std::to_string(a.size) + " bytes)");
      }
      s = Status::OK();
    } else if (s.ok()) {
      links_.push_back(to);
    }
    MEGA_RETURN_IF_ERROR(
        s.WithContext("incremental save: referencing " + BaseName(from) + " of the base"));
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

std::unique_ptr<StorageWriter> NewIncrementalWriter(std::unique_ptr<StorageWriter> inner,
                                                    std::string dir,
                                                    std::shared_ptr<fs::FileSystem> fs,
                                                    IncrementalWriterOptions options,
                                                    std::shared_ptr<IncrementalStats> stats) {
  return std::make_unique<IncrementalWriter>(std::move(inner), std::move(dir), std::move(fs),
                                             std::move(options), std::move(stats));
}

}  // namespace megackpt::dcp
