// AsyncSave: stage the state into a reusable pool, let the caller go on, write
// in the background.
//
// When the rank's tensors fit the pool, they are all copied first (several
// threads, byte ranges; "staging the whole state first" below) and the save is
// an ordinary Save of the copies. Otherwise the save flow itself is Save()
// unchanged; two thin wrappers adapt it:
//  - StagingWriter wraps the caller's StorageWriter. Its WriteData cuts the
//    rank's plan into "waves" that fit the pool, copies a wave's items out of the
//    caller's tensors into the pool, and hands the wave to the real writer. Once
//    the last wave is copied the `staged` promise is fulfilled: the caller's
//    tensors are no longer read.
//  - StagingPlanner wraps the caller's SavePlanner and resolves items of the
//    current wave to their staged copies.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "megackpt/core/thread_pool.h"
#include "megackpt/dcp/checkpoint.h"

namespace megackpt::dcp {
namespace {

constexpr uint64_t kAlign = 64;

uint64_t AlignUp(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

class StagingPoolImpl final : public StagingPool {
 public:
  explicit StagingPoolImpl(uint64_t cap) : cap_(std::max<uint64_t>(cap, 1u << 20)) {}

  uint64_t capacity_bytes() const override { return cap_; }
  uint64_t reserved_bytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return arena_size_ + whole_bytes_;
  }

  // Whole-state staging: an arena of at least n bytes owned by one save until
  // GiveBack, taken without waiting (a free one, else a new pre-faulted one).
  // It must not wait: the save holds it across the ranks' plan exchange, and
  // thread ranks of one process share a pool (a waiting rank would stall the
  // collective of the one holding it).
  Result<std::pair<std::shared_ptr<std::byte>, uint64_t>> TakeWhole(uint64_t n) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (size_t k = 0; k < free_whole_.size(); ++k) {
        if (free_whole_[k].second >= n) {
          auto a = std::move(free_whole_[k]);
          free_whole_.erase(free_whole_.begin() + k);
          return a;
        }
      }
    }
    MEGA_ASSIGN_OR_RETURN(auto mem, AllocateBuffer(n, /*prefault=*/true));
    std::lock_guard<std::mutex> lock(mu_);
    whole_bytes_ += n;
    return std::make_pair(std::move(mem), n);
  }
  void GiveBack(std::pair<std::shared_ptr<std::byte>, uint64_t> arena) {
    std::lock_guard<std::mutex> lock(mu_);
    free_whole_.push_back(std::move(arena));
  }

  // One save at a time.
  std::unique_lock<std::mutex> Acquire() { return std::unique_lock<std::mutex>(use_mu_); }

  // An arena of at least n (<= cap) bytes, pre-faulted; kept for later saves.
  Result<std::byte*> Reserve(uint64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    if (arena_size_ < n) {
      arena_.reset();
      arena_size_ = 0;
      MEGA_ASSIGN_OR_RETURN(arena_, AllocateBuffer(n, /*prefault=*/true));
      arena_size_ = n;
    }
    return arena_.get();
  }

 private:
  const uint64_t cap_;
  std::mutex use_mu_;
  mutable std::mutex mu_;
  std::shared_ptr<std::byte> arena_;
  uint64_t arena_size_ = 0;
  std::vector<std::pair<std::shared_ptr<std::byte>, uint64_t>>
      free_whole_;            // TakeWhole's, not in use
  uint64_t whole_bytes_ = 0;  // every TakeWhole arena, in use or free
};

class StagingPlanner final : public SavePlanner {
 public:
  explicit StagingPlanner(SavePlanner* inner) : inner_(inner) {}

  Status SetUp(const StateDict& sd, const std::optional<StorageMeta>& meta, bool coord) override {
    return inner_->SetUp(sd, meta, coord);
  }
  Result<SavePlan> CreateLocalPlan() override { return inner_->CreateLocalPlan(); }
  Result<GlobalSavePlan> CreateGlobalPlan(std::vector<SavePlan> plans) override {
    return inner_->CreateGlobalPlan(std::move(plans));
  }
  Result<SavePlan> FinishPlan(SavePlan plan) override {
    return inner_->FinishPlan(std::move(plan));
  }

  Result<ResolvedData> ResolveData(const WriteItem& item) override {
    auto it = staged_.find(item.index);
    if (it == staged_.end()) {
      return InternalError("async save: " + ToString(item.index) + " was not staged");
    }
    return it->second;
  }

  SavePlanner* inner() { return inner_; }
  // Replaced between waves (never while a wave is being written).
  void SetStaged(std::unordered_map<MetadataIndex, ResolvedData, MetadataIndexHash> staged) {
    staged_ = std::move(staged);
  }

 private:
  SavePlanner* inner_;
  std::unordered_map<MetadataIndex, ResolvedData, MetadataIndexHash> staged_;
};

class StagingWriter final : public StorageWriter {
 public:
  // planner == nullptr: the state was staged whole before the save (its tensors
  // are the copies); WriteData forwards, and `staged` is reported once the
  // storage is set up (a save that fails before that reports its error there).
  StagingWriter(std::shared_ptr<StorageWriter> inner, std::shared_ptr<StagingPoolImpl> pool,
                StagingPlanner* planner, std::function<void(Status)> on_staged)
      : inner_(std::move(inner)),
        pool_(std::move(pool)),
        planner_(planner),
        on_staged_(std::move(on_staged)) {}

  Status Reset(std::string_view id) override { return inner_->Reset(id); }
  bool ValidateCheckpointId(std::string_view id) const override {
    return inner_->ValidateCheckpointId(id);
  }
  Status SetUpStorageWriter(const StorageSetUp& setup) override {
    Status s = inner_->SetUpStorageWriter(setup);
    if (!planner_) NotifyStaged(s);
    return s;
  }
  Result<SavePlan> PrepareLocalPlan(SavePlan plan) override {
    return inner_->PrepareLocalPlan(std::move(plan));
  }
  Result<std::vector<SavePlan>> PrepareGlobalPlan(std::vector<SavePlan> plans) override {
    return inner_->PrepareGlobalPlan(std::move(plans));
  }
  Status Finish(const Metadata& md, const std::vector<std::vector<WriteResult>>& results) override {
    return inner_->Finish(md, results);
  }
  void Abort() override { inner_->Abort(); }
  std::optional<StorageMeta> GetStorageMeta() const override { return inner_->GetStorageMeta(); }

  Result<std::vector<WriteResult>> WriteData(const SavePlan& plan, SavePlanner& planner) override {
    if (!planner_) return inner_->WriteData(plan, planner);
    // Otherwise `planner` is always planner_, which wraps the caller's planner.
    auto lock = pool_->Acquire();
    // Waves: consecutive items whose staged sizes fit the pool.
    std::vector<std::vector<size_t>> waves;
    uint64_t in_wave = 0, largest_wave = 0;
    for (size_t i = 0; i < plan.items.size(); ++i) {
      uint64_t n = AlignUp(WriteItemNbytes(plan.items[i]));
      if (waves.empty() || in_wave + n > pool_->capacity_bytes()) {
        waves.emplace_back();
        in_wave = 0;
      }
      waves.back().push_back(i);
      in_wave += n;
      largest_wave = std::max(largest_wave, in_wave);
    }
    std::byte* arena = nullptr;
    if (!waves.empty()) {
      MEGA_ASSIGN_OR_RETURN(arena, pool_->Reserve(std::min(largest_wave, pool_->capacity_bytes())));
    }
    std::vector<WriteResult> results;
    for (size_t w = 0; w < waves.size(); ++w) {
      std::unordered_map<MetadataIndex, ResolvedData, MetadataIndexHash> staged;
      MEGA_RETURN_IF_ERROR(Stage(plan, waves[w], arena, &staged));
      planner_->SetStaged(std::move(staged));
      if (w + 1 == waves.size()) NotifyStaged(Status::OK());
      SavePlan wave_plan;
      wave_plan.storage_data = plan.storage_data;
      wave_plan.planner_data = plan.planner_data;
      for (size_t i : waves[w]) wave_plan.items.push_back(plan.items[i]);
      MEGA_ASSIGN_OR_RETURN(auto wave_results, inner_->WriteData(wave_plan, *planner_));
      planner_->SetStaged({});
      for (auto& r : wave_results) results.push_back(std::move(r));
    }
    NotifyStaged(Status::OK());
    return results;
  }

  void NotifyStaged(const Status& s) {
    if (on_staged_) {
      on_staged_(s);
      on_staged_ = nullptr;
    }
  }

 private:
  // Copies the wave's items into the arena (an item larger than the pool gets a
  // buffer of its own, freed after its write).
  Status Stage(const SavePlan& plan, const std::vector<size_t>& wave, std::byte* arena,
               std::unordered_map<MetadataIndex, ResolvedData, MetadataIndexHash>* staged) {
    std::vector<uint64_t> offsets(wave.size());
    uint64_t off = 0;
    for (size_t k = 0; k < wave.size(); ++k) {
      offsets[k] = off;
      off += AlignUp(WriteItemNbytes(plan.items[wave[k]]));
    }
    std::shared_ptr<std::byte> own;
    std::byte* base = arena;
    if (off > pool_->capacity_bytes()) {
      MEGA_ASSIGN_OR_RETURN(own, AllocateBuffer(off));
      base = own.get();
    }
    std::vector<ResolvedData> out(wave.size());
    SavePlanner* source = planner_->inner();
    MEGA_RETURN_IF_ERROR(ParallelFor(
        &ThreadPool::Default(), wave.size(),
        [&](size_t k) -> Status {
          try {
            return StageOne(plan.items[wave[k]], source, base + offsets[k], own, &out[k]);
          } catch (const std::exception& e) {
            return InternalError(std::string("SavePlanner::ResolveData threw an exception: ") +
                                 e.what());
          } catch (...) {
            return InternalError("SavePlanner::ResolveData threw a non-standard exception");
          }
        },
        2));
    for (size_t k = 0; k < wave.size(); ++k) {
      staged->emplace(plan.items[wave[k]].index, std::move(out[k]));
    }
    return Status::OK();
  }

  static Status StageOne(const WriteItem& item, SavePlanner* source, std::byte* dst,
                         const std::shared_ptr<std::byte>& own, ResolvedData* out) {
    MEGA_ASSIGN_OR_RETURN(ResolvedData src, source->ResolveData(item));
    if (item.type == WriteItemType::kByteIO) {
      std::memcpy(dst, src.bytes.data(), src.bytes.size());
      out->bytes = std::string_view(reinterpret_cast<const char*>(dst), src.bytes.size());
    } else {
      MEGA_ASSIGN_OR_RETURN(Tensor copy,
                            Tensor::FromBlob(dst, src.tensor.dtype(), src.tensor.shape()));
      MEGA_RETURN_IF_ERROR(CopyTensor(src.tensor, copy));
      out->tensor = std::move(copy);
    }
    out->hold = own;
    return Status::OK();
  }

  std::shared_ptr<StorageWriter> inner_;
  std::shared_ptr<StagingPoolImpl> pool_;
  StagingPlanner* planner_;
  std::function<void(Status)> on_staged_;
};

// ---- staging the whole state first ------------------------------------------
//
// When the rank's tensors fit the pool, AsyncSave copies them all before the
// save starts planning: the caller is blocked for the copy only (not for the
// plan exchange between ranks), and the copy is cut into byte ranges run on
// several threads, into an arena the save owns until it is done (TakeWhole). A
// state larger than the pool goes through StagingWriter's waves instead.

struct StageCopy {
  const std::byte* src = nullptr;  // contiguous source, or nullptr: CopyTensor(from, to)
  std::byte* dst = nullptr;
  uint64_t len = 0;
  Tensor from, to;
};

// Every tensor of the state (plain, shards, nested dicts and lists), in order.
void CollectTensors(StateDict& sd, std::vector<Tensor*>* out);
void CollectTensors(StateValue& v, std::vector<Tensor*>* out) {
  switch (v.kind()) {
    case StateValue::Kind::kTensor:
      out->push_back(&v.tensor());
      break;
    case StateValue::Kind::kSharded:
      for (Shard& s : v.sharded().shards) out->push_back(&s.tensor);
      break;
    case StateValue::Kind::kDict:
      CollectTensors(v.dict(), out);
      break;
    case StateValue::Kind::kList:
      for (StateValue& item : v.list()) CollectTensors(item, out);
      break;
    default:
      break;  // bytes are owned by the state dict already
  }
}
void CollectTensors(StateDict& sd, std::vector<Tensor*>* out) {
  for (auto& [key, value] : sd) CollectTensors(value, out);
}

uint64_t StagedBytes(const std::vector<Tensor*>& tensors) {
  uint64_t n = 0;
  for (const Tensor* t : tensors) n += AlignUp(t->nbytes());
  return n;
}

// Copies every tensor into the arena (REQUIRES: StagedBytes fits) and points the
// state at the copies. Contiguous tensors are cut into byte ranges copied by
// several threads; a state of kStreamFrom or more (far more than the cores'
// private caches, and its copy is not read again soon) with streaming stores.
Status StageWholeState(const std::vector<Tensor*>& tensors, std::byte* arena) {
  constexpr uint64_t kMinPiece = 1ull << 20, kMaxPiece = 64ull << 20;
  constexpr uint64_t kStreamFrom = 64ull << 20;
  ThreadPool& pool = ThreadPool::Default();
  const int threads = std::max(2, pool.size());
  const uint64_t total = StagedBytes(tensors);
  const uint64_t piece =
      std::clamp<uint64_t>(total / (4 * static_cast<uint64_t>(threads)), kMinPiece, kMaxPiece);
  std::vector<StageCopy> copies;
  std::vector<Tensor> staged;
  uint64_t off = 0;
  for (Tensor* t : tensors) {
    std::byte* dst = arena + off;
    off += AlignUp(t->nbytes());
    MEGA_ASSIGN_OR_RETURN(Tensor copy, Tensor::FromBlob(dst, t->dtype(), t->shape()));
    if (t->nbytes() > 0) {
      if (t->is_contiguous()) {
        const auto* src = static_cast<const std::byte*>(t->data());
        for (uint64_t a = 0; a < t->nbytes(); a += piece) {
          copies.push_back({src + a, dst + a, std::min(piece, t->nbytes() - a), {}, {}});
        }
      } else {
        copies.push_back({nullptr, nullptr, 0, *t, copy});
      }
    }
    staged.push_back(std::move(copy));
  }
  MEGA_RETURN_IF_ERROR(ParallelFor(
      &pool, copies.size(),
      [&](size_t k) -> Status {
        const StageCopy& c = copies[k];
        if (c.src) {
          if (total >= kStreamFrom) {
            StreamingCopy(c.dst, c.src, c.len);
          } else {
            std::memcpy(c.dst, c.src, c.len);
          }
          return Status::OK();
        }
        return CopyTensor(c.from, c.to);
      },
      threads));
  for (size_t i = 0; i < tensors.size(); ++i) *tensors[i] = std::move(staged[i]);
  return Status::OK();
}

}  // namespace

std::shared_ptr<StagingPool> StagingPool::Create(uint64_t capacity_bytes) {
  return std::make_shared<StagingPoolImpl>(capacity_bytes);
}

std::future<Result<std::vector<WriteResult>>> StorageWriter::WriteDataAsync(const SavePlan& plan,
                                                                            SavePlanner& planner) {
  return std::async(std::launch::async,
                    [this, &plan, &planner] { return WriteData(plan, planner); });
}

AsyncSaveHandle AsyncSave(StateDict state_dict, std::shared_ptr<StorageWriter> writer,
                          dist::ProcessGroup* group, AsyncSaveOptions options) {
  auto staged_promise = std::make_shared<std::promise<Status>>();
  AsyncSaveHandle handle;
  handle.staged = staged_promise->get_future().share();
  std::shared_ptr<StagingPool> pool = options.pool;
  if (!pool) {
    static std::mutex mu;
    static std::shared_ptr<StagingPool> default_pool;
    std::lock_guard<std::mutex> lock(mu);
    if (!default_pool || default_pool->capacity_bytes() != options.default_pool_capacity_bytes) {
      default_pool = StagingPool::Create(options.default_pool_capacity_bytes);
    }
    pool = default_pool;
  }
  auto impl = std::static_pointer_cast<StagingPoolImpl>(pool);
  handle.done =
      std::async(std::launch::async,
                 [state = std::move(state_dict), writer = std::move(writer), group, options, impl,
                  staged_promise]() mutable -> Status {
                   auto once = std::make_shared<std::once_flag>();
                   auto notify = [staged_promise, once](Status s) {
                     std::call_once(*once, [&] { staged_promise->set_value(std::move(s)); });
                   };
                   // The whole state fits the pool: stage it first, then an
                   // ordinary Save of the copies.
                   std::vector<Tensor*> tensors;
                   CollectTensors(state, &tensors);
                   const uint64_t need = StagedBytes(tensors);
                   if (need > 0 && need <= impl->capacity_bytes()) {
                     auto arena = impl->TakeWhole(need);
                     Status staged =
                         arena.ok() ? StageWholeState(tensors, arena->first.get()) : arena.status();
                     if (staged.ok()) {
                       StagingWriter forward(writer, impl, nullptr, notify);
                       Status s = Save(state, forward, group, options.save);
                       notify(s);            // a save that failed before setting up its storage
                       state = StateDict();  // no views of the arena left
                       impl->GiveBack(std::move(*arena));
                       return s;
                     }
                     if (arena.ok()) impl->GiveBack(std::move(*arena));
                     // Not staged (the state still holds the caller's tensors):
                     // the waves below, whose errors Save reports on every rank.
                   }
                   std::unique_ptr<SavePlanner> default_planner;
                   SavePlanner* inner = options.save.planner;
                   if (!inner) {
                     default_planner = NewDefaultSavePlanner();
                     inner = default_planner.get();
                   }
                   StagingPlanner planner(inner);
                   StagingWriter staging_writer(writer, impl, &planner, notify);
                   SaveOptions save = options.save;
                   save.planner = &planner;
                   Status s = Save(state, staging_writer, group, save);
                   notify(s);  // a save that failed before staging finished
                   return s;
                 })
          .share();
  return handle;
}

}  // namespace megackpt::dcp
