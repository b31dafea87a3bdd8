// CasStore: the upload pipeline (chunk → hash → dedup → compress → pack →
// write xorbs → write the reconstruction) and the verified range reader.
//
// Upload pipeline. The caller's thread copies appended bytes into a batch and
// runs the chunker over them. A full batch (whole chunks only) goes to a
// background task that hashes its chunks (in parallel), looks them up in the
// dedup index, compresses the new ones (in parallel) and packs them into the
// current xorb, while the caller fills the next batch. At most one batch is in
// flight, so batches are packed in order. A full xorb goes to a committer
// thread (at most one in flight) while the next one fills: the backend first
// writes and syncs it without locks (CasBackend::StageXorb), then, under the
// store's kCommit lock, its chunks are re-checked against the index: chunks
// that another uploader stored meanwhile are referenced there instead, so
// concurrent uploads of the same content keep one copy.
#include "megackpt/cas/store.h"

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "cas/bytes.h"
#include "megackpt/cas/chunker.h"
#include "megackpt/cas/shard.h"
#include "megackpt/cas/xorb.h"
#include "megackpt/core/checksum.h"

namespace megackpt::cas {

namespace {

using internal::ByteBuffer;

// Bytes of whole chunks per pipeline batch.
constexpr size_t kBatchBytes = 8u << 20;
constexpr size_t kBatchCapacity = 2 * kBatchBytes + 2 * kMaxChunkSize;
// Largest serialized span fetched from a xorb at once when downloading.
constexpr size_t kFetchBytes = 8u << 20;

// Where one chunk of the file being uploaded lives: a slot in the upload's
// xorb table and the chunk index, or (slot == kPending) the id of a chunk in
// a xorb not yet committed.
struct ChunkRef {
  static constexpr uint32_t kPending = ~0u;
  uint32_t slot = kPending;
  uint32_t index = 0;
};

struct Batch {
  ByteBuffer data;  // stream bytes [base, base + data.size())
  uint64_t base = 0;
  std::vector<uint32_t> ends;  // chunk ends relative to base (whole chunks only)
  std::vector<MerkleHash> hashes;
  std::vector<std::optional<ChunkLocation>> found;
  ByteBuffer records;  // one slot of (size + 8) bytes per chunk
  std::vector<uint64_t> slot_offset;
  std::vector<uint32_t> record_size;

  uint32_t ChunkStart(size_t i) const { return i == 0 ? 0 : ends[i - 1]; }
  std::span<const std::byte> Chunk(size_t i) const {
    return std::span<const std::byte>(data.data() + ChunkStart(i), ends[i] - ChunkStart(i));
  }
};

}  // namespace

class UploadStreamImpl final : public UploadStream {
 public:
  UploadStreamImpl(CasStore* store, UploadOptions options, std::unique_ptr<StoreLock> lease)
      : store_(store),
        backend_(&store->backend()),
        options_(std::move(options)),
        lease_(std::move(lease)),
        builder_(store->options().max_xorb_bytes, store->options().max_xorb_chunks),
        rebuild_(store->options().max_xorb_bytes, store->options().max_xorb_chunks),
        committing_(store->options().max_xorb_bytes, store->options().max_xorb_chunks) {
    for (Batch& b : batches_) {
      // A batch holds up to kBatchBytes of whole chunks, the tail of an
      // unfinished chunk and one appended piece (<= kBatchBytes).
      b.data = internal::BufferCache::Take(kBatchCapacity);
      b.data.Reserve(kBatchCapacity);
      b.records = internal::BufferCache::Take(kBatchCapacity);
      b.records.Reserve(kBatchCapacity);
    }
    fill_ = &batches_[0];
    idle_ = &batches_[1];
    pool_ = store->options().pool ? store->options().pool : &ThreadPool::Default();
    threads_ = std::max(1, store->options().upload_threads);
    policy_ = store->options().compress ? CompressionPolicy::kAuto : CompressionPolicy::kNone;
  }

  ~UploadStreamImpl() override {
    if (worker_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      worker_.join();
    }
    if (commit_thread_.joinable()) commit_thread_.join();
    for (Batch& b : batches_) {
      internal::BufferCache::Give(std::move(b.data));
      internal::BufferCache::Give(std::move(b.records));
    }
  }

  const std::string& name() const override { return options_.name; }
  uint64_t size() const override { return position_; }
  const FileUploadResult* result() const override { return done_ ? &result_ : nullptr; }

  Status Append(std::span<const std::byte> data) override {
    while (!data.empty()) {
      size_t take = std::min(data.size(), kBatchBytes);
      MEGA_RETURN_IF_ERROR(AppendWith(take, [&](std::span<std::byte> dst) {
        std::memcpy(dst.data(), data.data(), dst.size());
        return Status::OK();
      }));
      data = data.subspan(take);
    }
    return Status::OK();
  }

  // Appends n bytes (n <= kBatchBytes) that `fill` writes straight into the
  // batch buffer (UploadFile reads the file there: no extra copy).
  Status AppendWith(size_t n, const std::function<Status(std::span<std::byte>)>& fill) {
    if (!status_.ok()) return status_;
    if (finished_) return FailedPreconditionError(options_.name + ": upload already finished");
    size_t old = fill_->data.size();
    fill_->data.Resize(old + n);
    std::span<std::byte> dst(fill_->data.data() + old, n);
    Status s = fill(dst);
    if (!s.ok()) {
      fill_->data.Resize(old);
      status_ = s;
      return s;
    }
    ends_scratch_.clear();
    chunker_.Feed(dst, &ends_scratch_);
    for (uint64_t e : ends_scratch_) fill_->ends.push_back(static_cast<uint32_t>(e - fill_->base));
    position_ += n;
    if (!fill_->ends.empty() && fill_->ends.back() >= kBatchBytes) {
      status_ = Dispatch(/*wait=*/false);
      if (!status_.ok()) return status_;
      if (options_.progress) options_.progress(position_);
    }
    return Status::OK();
  }

  Result<FileUploadResult> Finish() override {
    if (!status_.ok()) return status_;
    if (finished_) return FailedPreconditionError(options_.name + ": Finish called twice");
    finished_ = true;
    status_ = FinishInternal();
    if (!status_.ok()) return status_;
    done_ = true;
    lease_.reset();
    if (options_.progress) options_.progress(position_);
    return result_;
  }

  Status Close() override { return Finish().status(); }

 private:
  // Hands the filled batch to the background stage (after the previous one
  // has finished) and starts filling the other batch with the leftover tail.
  Status Dispatch(bool wait) {
    MEGA_RETURN_IF_ERROR(WaitInFlight());
    Batch* full = fill_;
    Batch* next = idle_;
    uint32_t complete = full->ends.empty() ? 0 : full->ends.back();
    next->data.Clear();
    next->ends.clear();
    next->base = full->base + complete;
    next->data.Append(full->data.data() + complete, full->data.size() - complete);
    full->data.Resize(complete);
    fill_ = next;
    idle_ = full;
    if (full->ends.empty()) return Status::OK();
    // Synchronously (final batch, or one thread): all threads hash/compress.
    if (wait || threads_ <= 1) return ProcessBatch(*full, threads_);
    if (!worker_.joinable()) worker_ = std::thread([this] { WorkerLoop(); });
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = full;
      busy_ = true;
    }
    cv_.notify_all();
    return Status::OK();
  }

  // The background stage: one persistent thread per stream (not a pool task,
  // so a stream used from inside pool tasks cannot starve the pool).
  void WorkerLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return job_ != nullptr || stop_; });
      if (job_ == nullptr) return;
      Batch* b = std::exchange(job_, nullptr);
      lock.unlock();
      // The caller's thread is chunking the next batch meanwhile: it counts
      // as one of the upload's threads.
      Status s = ProcessBatch(*b, std::max(1, threads_ - 1));
      lock.lock();
      job_status_ = s;
      busy_ = false;
      cv_.notify_all();
    }
  }

  Status WaitInFlight() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !busy_; });
    return std::exchange(job_status_, Status::OK());
  }

  // REQUIRES: state_mu_ held (or no commit in flight).
  uint32_t SlotOf(const MerkleHash& xorb) {
    auto [it, inserted] = slot_of_.try_emplace(xorb, static_cast<uint32_t>(xorbs_.size()));
    if (inserted) xorbs_.push_back(xorb);
    return it->second;
  }

  Status ProcessBatch(Batch& b, int parallel) {
    const size_t n = b.ends.size();
    b.hashes.resize(n);
    MEGA_RETURN_IF_ERROR(ParallelFor(
        pool_, n,
        [&](size_t i) {
          b.hashes[i] = ChunkHash(b.Chunk(i));
          return Status::OK();
        },
        parallel));
    MEGA_ASSIGN_OR_RETURN(b.found, backend_->LookupChunks(b.hashes));

    // Chunks to store: not in the index, not seen earlier in this upload, and
    // the first of their hash within this batch.
    std::vector<size_t> fresh;
    std::unordered_set<MerkleHash> batch_seen;
    for (size_t i = 0; i < n; ++i) {
      if (b.found[i] || seen_.count(b.hashes[i]) || !batch_seen.insert(b.hashes[i]).second)
        continue;
      fresh.push_back(i);
    }
    b.slot_offset.assign(n, 0);
    b.record_size.assign(n, 0);
    uint64_t total = 0;
    for (size_t i : fresh) {
      b.slot_offset[i] = total;
      total += b.Chunk(i).size() + kChunkRecordHeaderSize;
    }
    b.records.Resize(total);
    MEGA_RETURN_IF_ERROR(ParallelFor(
        pool_, fresh.size(),
        [&](size_t k) {
          size_t i = fresh[k];
          b.record_size[i] = static_cast<uint32_t>(
              EncodeChunkRecord(b.Chunk(i), policy_, b.records.data() + b.slot_offset[i]));
          return Status::OK();
        },
        parallel));

    for (size_t i = 0; i < n; ++i) {
      const MerkleHash& h = b.hashes[i];
      const uint32_t size = static_cast<uint32_t>(b.Chunk(i).size());
      leaves_.push_back({h, size});
      auto seen = seen_.find(h);
      if (seen != seen_.end()) {
        refs_.push_back(seen->second);
        continue;
      }
      ChunkRef ref;
      if (b.found[i]) {
        std::lock_guard<std::mutex> lock(state_mu_);
        ref.slot = SlotOf(b.found[i]->xorb_hash);
        ref.index = b.found[i]->chunk_index;
      } else {
        std::span<const std::byte> record(b.records.data() + b.slot_offset[i], b.record_size[i]);
        if (!builder_.Fits(record.size())) MEGA_RETURN_IF_ERROR(CommitXorb());
        builder_.Add(h, size, record);
        std::lock_guard<std::mutex> lock(state_mu_);
        ref.index = static_cast<uint32_t>(pending_.size());
        builder_ids_.push_back(ref.index);
        pending_.push_back(ChunkRef{});
      }
      seen_.emplace(h, ref);
      refs_.push_back(ref);
    }
    return Status::OK();
  }

  // Stores one finished xorb and maps the pending chunk ids it holds.
  Status PutBuilt(XorbBuilder& builder, const std::vector<uint32_t>& ids) {
    XorbBuilder::Finished fin = builder.Finish();
    MEGA_ASSIGN_OR_RETURN(bool created, backend_->PutXorb(AsView(fin.serialized), fin.layout));
    MapStored(fin.layout, ids, created);
    return Status::OK();
  }

  static std::string_view AsView(std::span<const std::byte> bytes) {
    return std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  }

  // Points the pending chunk ids at their stored xorb and counts what was new.
  void MapStored(const XorbLayout& layout, const std::vector<uint32_t>& ids, bool created) {
    std::lock_guard<std::mutex> lock(state_mu_);
    uint32_t slot = SlotOf(layout.xorb_hash);
    for (size_t k = 0; k < ids.size(); ++k) pending_[ids[k]] = {slot, static_cast<uint32_t>(k)};
    if (created) {
      result_.new_xorbs += 1;
      result_.new_chunks += layout.chunks.size();
      result_.stored_bytes += layout.serialized_bytes;
      for (const XorbChunk& c : layout.chunks) result_.new_bytes += c.unpacked_bytes;
    }
  }

  // Hands the current xorb to the committer and starts a new one. With more
  // than one upload thread the commit (a backend write: file + fsync, or an
  // HTTP upload) runs on its own thread while the pipeline fills the next
  // xorb; at most one commit is in flight, so xorbs are stored in order.
  Status CommitXorb() {
    if (builder_.empty()) return Status::OK();
    MEGA_RETURN_IF_ERROR(WaitCommit());
    std::swap(builder_, committing_);
    std::swap(builder_ids_, committing_ids_);
    builder_ids_.clear();
    if (threads_ <= 1) return CommitBuilt(committing_, committing_ids_);
    commit_thread_ =
        std::thread([this] { commit_status_ = CommitBuilt(committing_, committing_ids_); });
    return Status::OK();
  }

  Status WaitCommit() {
    if (commit_thread_.joinable()) commit_thread_.join();
    return commit_status_;  // an error stays: the upload is failed
  }

  // Stores `builder`'s xorb. The bytes are written (and synced) first,
  // outside the store's commit lock, so concurrent uploads overlap their
  // writes; under the lock the chunks are looked up again and the staged xorb
  // is published only when no other uploader stored any of them meanwhile —
  // otherwise it is dropped, the stored copies are referenced and the rest is
  // stored as a smaller xorb (one copy of every chunk either way).
  Status CommitBuilt(XorbBuilder& builder, std::vector<uint32_t>& ids) {
    XorbBuilder::Finished fin = builder.Finish();
    const std::string_view bytes = AsView(fin.serialized);
    MEGA_ASSIGN_OR_RETURN(auto staged, backend_->StageXorb(bytes, fin.layout));
    MEGA_ASSIGN_OR_RETURN(auto commit_lock, backend_->Lock(StoreLockKind::kCommit));
    std::vector<MerkleHash> hashes;
    hashes.reserve(fin.layout.chunks.size());
    for (const XorbChunk& c : fin.layout.chunks) hashes.push_back(c.hash);
    MEGA_ASSIGN_OR_RETURN(auto found, backend_->LookupChunks(hashes));
    bool any = std::any_of(found.begin(), found.end(), [](const auto& f) { return f.has_value(); });
    if (!any) {
      MEGA_ASSIGN_OR_RETURN(bool created,
                            backend_->PublishStagedXorb(std::move(staged), bytes, fin.layout));
      MapStored(fin.layout, ids, created);
    } else {
      staged.reset();
      std::vector<uint32_t> kept;
      rebuild_.Clear();
      for (size_t k = 0; k < fin.layout.chunks.size(); ++k) {
        if (found[k]) {
          std::lock_guard<std::mutex> lock(state_mu_);
          pending_[ids[k]] = {SlotOf(found[k]->xorb_hash), found[k]->chunk_index};
        } else {
          const XorbChunk& c = fin.layout.chunks[k];
          const uint64_t end = fin.layout.RecordEnd(static_cast<uint32_t>(k));
          rebuild_.Add(c.hash, c.unpacked_bytes,
                       fin.serialized.subspan(c.byte_offset, end - c.byte_offset));
          kept.push_back(ids[k]);
        }
      }
      if (!rebuild_.empty()) MEGA_RETURN_IF_ERROR(PutBuilt(rebuild_, kept));
    }
    builder.Clear();
    ids.clear();
    return Status::OK();
  }

  Status FinishInternal() {
    if (auto last = chunker_.Finish())
      fill_->ends.push_back(static_cast<uint32_t>(*last - fill_->base));
    MEGA_RETURN_IF_ERROR(Dispatch(/*wait=*/true));
    MEGA_RETURN_IF_ERROR(WaitInFlight());
    MEGA_RETURN_IF_ERROR(CommitXorb());
    MEGA_RETURN_IF_ERROR(WaitCommit());

    FileReconstruction& rec = result_.reconstruction;
    rec.terms.clear();
    std::vector<size_t> term_first;
    for (size_t i = 0; i < refs_.size(); ++i) {
      ChunkRef ref = refs_[i].slot == ChunkRef::kPending ? pending_[refs_[i].index] : refs_[i];
      if (ref.slot == ChunkRef::kPending)
        return InternalError(options_.name + ": unresolved chunk");
      const MerkleHash& xorb = xorbs_[ref.slot];
      if (!rec.terms.empty() && rec.terms.back().xorb_hash == xorb &&
          rec.terms.back().chunk_end == ref.index) {
        rec.terms.back().chunk_end++;
        rec.terms.back().unpacked_bytes += leaves_[i].size;
        continue;
      }
      ReconstructionTerm t;
      t.xorb_hash = xorb;
      t.chunk_start = ref.index;
      t.chunk_end = ref.index + 1;
      t.unpacked_bytes = leaves_[i].size;
      rec.terms.push_back(t);
      term_first.push_back(i);
    }
    std::vector<MerkleHash> hashes;
    for (size_t k = 0; k < rec.terms.size(); ++k) {
      ReconstructionTerm& t = rec.terms[k];
      hashes.clear();
      for (size_t i = term_first[k]; i < term_first[k] + (t.chunk_end - t.chunk_start); ++i) {
        hashes.push_back(leaves_[i].hash);
      }
      t.verification_hash = RangeVerificationHash(hashes);
    }
    rec.file_hash = FileHash(leaves_, store_->options().file_hash_salt);
    rec.size = position_;
    result_.file_hash = rec.file_hash;
    result_.size = position_;
    result_.chunks = refs_.size();
    return backend_->PutFile(rec);
  }

  CasStore* store_;
  CasBackend* backend_;
  UploadOptions options_;
  std::unique_ptr<StoreLock> lease_;
  ThreadPool* pool_;
  int threads_;
  CompressionPolicy policy_;

  Chunker chunker_;
  std::vector<uint64_t> ends_scratch_;
  uint64_t position_ = 0;
  Batch batches_[2];
  Batch* fill_;
  Batch* idle_;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  Batch* job_ = nullptr;  // guarded by mu_
  bool busy_ = false;     // guarded by mu_
  bool stop_ = false;     // guarded by mu_
  Status job_status_;     // guarded by mu_

  // Touched only by the batch stage (one at a time, in order).
  XorbBuilder builder_, rebuild_, committing_;
  std::vector<uint32_t> builder_ids_;     // pending id of each chunk in builder_
  std::vector<uint32_t> committing_ids_;  // the same for committing_
  std::thread commit_thread_;             // stores committing_ (at most one)
  Status commit_status_;                  // written by commit_thread_, read after join
  // Guards pending_, xorbs_, slot_of_ and result_'s counters, which the
  // committer updates while the batch stage appends.
  std::mutex state_mu_;
  std::vector<ChunkRef> pending_;  // pending id -> final location
  std::vector<MerkleHash> xorbs_;  // slot -> xorb hash
  std::unordered_map<MerkleHash, uint32_t> slot_of_;
  std::unordered_map<MerkleHash, ChunkRef> seen_;
  std::vector<ChunkRef> refs_;       // per chunk of the file
  std::vector<HashAndSize> leaves_;  // per chunk of the file

  Status status_;
  bool finished_ = false;
  bool done_ = false;
  FileUploadResult result_;
};

// ---------------------------------------------------------------------------
// Reading

namespace {

// The decoded bytes of one chunk kept for small sequential reads.
struct ChunkCache {
  MerkleHash xorb;
  uint32_t index = ~0u;
  std::string data;
};

class RangeReader {
 public:
  RangeReader(CasBackend* backend, ThreadPool* pool, int threads)
      : backend_(backend), pool_(pool), threads_(threads) {}
  ~RangeReader() {
    internal::BufferCache::Give(std::move(fetch_));
    internal::BufferCache::Give(std::move(out_));
  }

  // `direct` (optional): the caller's destination of [offset, offset + length)
  // (clamped to the file); then `sink` is not called: pieces lying wholly inside
  // are decoded (and verified) straight into it (one copy less), the edges are
  // copied into place from out_.
  Status Read(const FileReconstruction& rec, uint64_t offset, uint64_t length, const ByteSink& sink,
              ChunkCache* cache, std::span<std::byte> direct = {}) {
    if (offset > rec.size) {
      return OutOfRangeError("file " + rec.file_hash.ToHex() + ": offset " +
                             std::to_string(offset) + " is past its end (" +
                             std::to_string(rec.size) + " bytes)");
    }
    length = std::min(length, rec.size - offset);
    const uint64_t end = offset + length;
    uint64_t term_start = 0;
    for (size_t ti = 0; ti < rec.terms.size() && term_start < end; ++ti) {
      const ReconstructionTerm& t = rec.terms[ti];
      const uint64_t term_end = term_start + t.unpacked_bytes;
      if (term_end <= offset) {
        term_start = term_end;
        continue;
      }
      MEGA_ASSIGN_OR_RETURN(XorbLayout layout, Layout(t.xorb_hash));
      const std::string xname = "xorb " + t.xorb_hash.ToHex();
      if (t.chunk_end > layout.chunks.size()) {
        return DataLossError("file " + rec.file_hash.ToHex() + " term " + std::to_string(ti) +
                             ": chunks [" + std::to_string(t.chunk_start) + ", " +
                             std::to_string(t.chunk_end) + ") exceed the " +
                             std::to_string(layout.chunks.size()) + " chunks of " + xname);
      }
      // Chunks of this term overlapping [offset, end).
      uint64_t pos = term_start;
      uint32_t first = t.chunk_end, last = t.chunk_start;  // [first, last)
      uint64_t first_pos = 0, term_bytes = 0;
      for (uint32_t c = t.chunk_start; c < t.chunk_end; ++c) {
        uint64_t csize = layout.chunks[c].unpacked_bytes;
        if (pos + csize > offset && pos < end) {
          if (first == t.chunk_end) {
            first = c;
            first_pos = pos;
          }
          last = c + 1;
        }
        pos += csize;
        term_bytes += csize;
      }
      if (term_bytes != t.unpacked_bytes) {
        return DataLossError("file " + rec.file_hash.ToHex() + " term " + std::to_string(ti) +
                             ": says " + std::to_string(t.unpacked_bytes) + " bytes but chunks [" +
                             std::to_string(t.chunk_start) + ", " + std::to_string(t.chunk_end) +
                             ") of " + xname + " hold " + std::to_string(term_bytes));
      }
      // Fetch and decode [first, last) in pieces of at most kFetchBytes.
      uint32_t a = first;
      uint64_t a_pos = first_pos;
      while (a < last) {
        // Bounded both in fetched (serialized) and decoded bytes.
        uint32_t b = a + 1;
        uint64_t piece_bytes = layout.chunks[a].unpacked_bytes;
        while (b < last && layout.RecordEnd(b) - layout.chunks[a].byte_offset <= kFetchBytes &&
               piece_bytes + layout.chunks[b].unpacked_bytes <= kFetchBytes) {
          piece_bytes += layout.chunks[b].unpacked_bytes;
          ++b;
        }
        std::span<const std::byte> piece;
        if (!direct.empty() && a_pos >= offset && a_pos + piece_bytes <= end &&
            !(b == a + 1 && cache && cache->xorb == t.xorb_hash && cache->index == a)) {
          MEGA_RETURN_IF_ERROR(
              FetchAndDecode(layout, a, b, direct.subspan(a_pos - offset, piece_bytes)));
          a_pos += piece_bytes;
          a = b;
          continue;
        }
        if (b == a + 1 && cache && cache->xorb == t.xorb_hash && cache->index == a) {
          piece = std::as_bytes(std::span(cache->data));
        } else {
          if (out_.capacity() == 0) {
            // Records are never larger than their chunks plus a header.
            out_ = internal::BufferCache::Take(kFetchBytes + 2 * kMaxChunkSize);
            out_.Reserve(kFetchBytes + 2 * kMaxChunkSize);
          }
          out_.Resize(piece_bytes);
          MEGA_RETURN_IF_ERROR(
              FetchAndDecode(layout, a, b, std::span<std::byte>(out_.data(), piece_bytes)));
          piece = out_.span();
          if (b == a + 1 && cache) {
            cache->xorb = t.xorb_hash;
            cache->index = a;
            cache->data.assign(reinterpret_cast<const char*>(piece.data()), piece.size());
          }
        }
        // Trim to [offset, end).
        uint64_t lo = std::max(offset, a_pos), hi = std::min(end, a_pos + piece_bytes);
        if (hi > lo && !direct.empty()) {
          std::memcpy(direct.data() + (lo - offset), piece.data() + (lo - a_pos), hi - lo);
        } else if (hi > lo) {
          MEGA_RETURN_IF_ERROR(sink(piece.subspan(lo - a_pos, hi - lo)));
        }
        a_pos += piece_bytes;
        a = b;
      }
      term_start = term_end;
    }
    return Status::OK();
  }

  Result<XorbLayout> Layout(const MerkleHash& h) {
    auto it = layouts_.find(h);
    if (it != layouts_.end()) return it->second;
    MEGA_ASSIGN_OR_RETURN(XorbLayout layout, backend_->GetXorbLayout(h));
    if (layouts_.size() > 256) layouts_.clear();
    layouts_.emplace(h, layout);
    return layout;
  }

  // Reads the records of chunks [a, b) and decodes them into `out` (their
  // unpacked bytes exactly), checking every chunk against its hash.
  Status FetchAndDecode(const XorbLayout& layout, uint32_t a, uint32_t b,
                        std::span<std::byte> out) {
    const uint64_t start = layout.chunks[a].byte_offset;
    const uint64_t stop = layout.RecordEnd(b - 1);
    if (fetch_.capacity() == 0) {
      fetch_ = internal::BufferCache::Take(kFetchBytes + 2 * kMaxChunkSize);
      fetch_.Reserve(kFetchBytes + 2 * kMaxChunkSize);
    }
    fetch_.Resize(stop - start);
    std::span<std::byte> dst(fetch_.data(), fetch_.size());
    MEGA_RETURN_IF_ERROR(backend_->ReadXorbRange(layout.xorb_hash, start, dst));
    std::vector<uint64_t> out_pos(b - a + 1, 0);
    for (uint32_t c = a; c < b; ++c)
      out_pos[c - a + 1] = out_pos[c - a] + layout.chunks[c].unpacked_bytes;
    if (out_pos.back() != out.size()) {
      return InternalError("xorb " + layout.xorb_hash.ToHex() + ": chunks [" + std::to_string(a) +
                           ", " + std::to_string(b) + ") hold " + std::to_string(out_pos.back()) +
                           " bytes, destination " + std::to_string(out.size()));
    }
    const std::span<const std::byte> fetched(fetch_.data(), fetch_.size());
    auto decode = [&](size_t k) -> Status {
      const uint32_t c = a + static_cast<uint32_t>(k);
      const std::string where = "xorb " + layout.xorb_hash.ToHex() + " chunk " + std::to_string(c);
      const uint64_t rec_start = layout.chunks[c].byte_offset - start;
      const uint64_t rec_end = layout.RecordEnd(c) - start;
      std::span<std::byte> chunk = out.subspan(out_pos[k], layout.chunks[c].unpacked_bytes);
      Result<size_t> next = DecodeChunkRecordTo(fetched.first(rec_end), rec_start, chunk);
      if (!next.ok()) return next.status().WithContext(where);
      if (*next != rec_end) {
        return DataLossError(where + ": record ends at " + std::to_string(*next + start) +
                             ", layout says " + std::to_string(rec_end + start));
      }
      if (ChunkHash(chunk) != layout.chunks[c].hash) {
        return DataLossError(where + ": content does not match its hash " +
                             layout.chunks[c].hash.ToHex());
      }
      return Status::OK();
    };
    return ParallelFor(b - a > 1 ? pool_ : nullptr, b - a, decode, threads_);
  }

 private:
  CasBackend* backend_;
  ThreadPool* pool_;
  int threads_;
  ByteBuffer fetch_, out_;
  std::unordered_map<MerkleHash, XorbLayout> layouts_;
};

class CasFile final : public RandomAccessFile {
 public:
  CasFile(std::shared_ptr<CasBackend> backend, ThreadPool* pool, int threads,
          FileReconstruction rec)
      : backend_(std::move(backend)),
        name_("cas:" + rec.file_hash.ToHex()),
        rec_(std::move(rec)),
        reader_(backend_.get(), pool, threads) {}

  const std::string& name() const override { return name_; }
  uint64_t size() const override { return rec_.size; }

  Result<size_t> ReadAt(uint64_t offset, std::span<std::byte> dst) const override {
    if (offset >= rec_.size || dst.empty()) return size_t{0};
    std::lock_guard<std::mutex> lock(mu_);
    const size_t n = static_cast<size_t>(std::min<uint64_t>(dst.size(), rec_.size - offset));
    MEGA_RETURN_IF_ERROR(reader_.Read(
        rec_, offset, n, [](std::span<const std::byte>) { return Status::OK(); }, &cache_,
        dst.first(n)));
    return n;
  }

 private:
  std::shared_ptr<CasBackend> backend_;
  std::string name_;
  FileReconstruction rec_;
  mutable std::mutex mu_;
  mutable RangeReader reader_;
  mutable ChunkCache cache_;
};

}  // namespace

// ---------------------------------------------------------------------------
// CasStore

CasStore::CasStore(std::shared_ptr<CasBackend> backend, const CasStoreOptions& options)
    : backend_(std::move(backend)), options_(options) {}
CasStore::~CasStore() = default;

Result<std::unique_ptr<CasStore>> CasStore::Open(std::shared_ptr<CasBackend> backend,
                                                 const CasStoreOptions& options) {
  if (!backend) return InvalidArgumentError("CasStore::Open: no backend");
  if (options.max_xorb_bytes < kMaxChunkSize + kChunkRecordHeaderSize ||
      options.max_xorb_bytes > kMaxXorbBytes || options.max_xorb_chunks == 0 ||
      options.max_xorb_chunks > kMaxXorbChunks) {
    return InvalidArgumentError("CasStore::Open: xorb limits must be within [" +
                                std::to_string(kMaxChunkSize + kChunkRecordHeaderSize) + ", " +
                                std::to_string(kMaxXorbBytes) + "] bytes and [1, " +
                                std::to_string(kMaxXorbChunks) + "] chunks");
  }
  return std::unique_ptr<CasStore>(new CasStore(std::move(backend), options));
}

Result<std::unique_ptr<CasStore>> CasStore::OpenLocal(const std::string& dir,
                                                      const CasStoreOptions& options,
                                                      const LocalBackendOptions& local) {
  MEGA_ASSIGN_OR_RETURN(auto backend, OpenLocalBackend(dir, local));
  return Open(std::move(backend), options);
}

Result<std::unique_ptr<UploadStream>> CasStore::BeginUpload(const UploadOptions& options) {
  MEGA_ASSIGN_OR_RETURN(auto lease, backend_->Lock(StoreLockKind::kUpload));
  return std::unique_ptr<UploadStream>(
      std::make_unique<UploadStreamImpl>(this, options, std::move(lease)));
}

Result<FileUploadResult> CasStore::Upload(std::span<const std::byte> data,
                                          const UploadOptions& options) {
  MEGA_ASSIGN_OR_RETURN(auto stream, BeginUpload(options));
  MEGA_RETURN_IF_ERROR(stream->Append(data));
  return stream->Finish();
}

Result<FileUploadResult> CasStore::UploadFile(const RandomAccessFile& file,
                                              const UploadOptions& options) {
  UploadOptions opts = options;
  if (opts.name == "upload") opts.name = file.name();
  MEGA_ASSIGN_OR_RETURN(auto lease, backend_->Lock(StoreLockKind::kUpload));
  UploadStreamImpl stream(this, opts, std::move(lease));
  for (uint64_t off = 0; off < file.size();) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(kBatchBytes, file.size() - off));
    MEGA_RETURN_IF_ERROR(stream.AppendWith(
        n, [&](std::span<std::byte> dst) { return file.ReadExactlyAt(off, dst); }));
    off += n;
  }
  return stream.Finish();
}

Result<FileUploadResult> CasStore::UploadFile(const std::string& path,
                                              const UploadOptions& options) {
  MEGA_ASSIGN_OR_RETURN(auto file, OpenLocalFile(path));
  UploadOptions opts = options;
  if (opts.name == "upload") opts.name = path;
  return UploadFile(*file, opts);
}

Status CasStore::Download(const MerkleHash& file_hash, ByteRange range, const ByteSink& sink) {
  MEGA_ASSIGN_OR_RETURN(FileReconstruction rec, backend_->GetFile(file_hash));
  RangeReader reader(backend_.get(), options_.pool ? options_.pool : &ThreadPool::Default(),
                     std::max(1, options_.upload_threads));
  return reader.Read(rec, range.offset, range.length, sink, nullptr);
}

Result<std::string> CasStore::Read(const MerkleHash& file_hash, ByteRange range) {
  std::string out;
  MEGA_RETURN_IF_ERROR(Download(file_hash, range, [&](std::span<const std::byte> piece) {
    out.append(reinterpret_cast<const char*>(piece.data()), piece.size());
    return Status::OK();
  }));
  return out;
}

Status CasStore::DownloadToFile(const MerkleHash& file_hash, const std::string& path,
                                ByteRange range) {
  MEGA_ASSIGN_OR_RETURN(auto out, AtomicFileWriter::Create(path));
  MEGA_RETURN_IF_ERROR(Download(
      file_hash, range, [&](std::span<const std::byte> piece) { return out->Append(piece); }));
  return out->Commit();
}

Result<std::unique_ptr<RandomAccessFile>> CasStore::OpenFile(const MerkleHash& file_hash) {
  MEGA_ASSIGN_OR_RETURN(FileReconstruction rec, backend_->GetFile(file_hash));
  return std::unique_ptr<RandomAccessFile>(
      std::make_unique<CasFile>(backend_, options_.pool ? options_.pool : &ThreadPool::Default(),
                                std::max(1, options_.upload_threads), std::move(rec)));
}

Result<FileReconstruction> CasStore::GetReconstruction(const MerkleHash& file_hash) {
  return backend_->GetFile(file_hash);
}

Result<bool> CasStore::HasFile(const MerkleHash& file_hash) { return backend_->HasFile(file_hash); }

Result<StoreStats> CasStore::Stat() {
  StoreStats stats;
  MEGA_ASSIGN_OR_RETURN(auto files, backend_->ListFiles());
  std::unordered_set<MerkleHash> referenced;
  for (const MerkleHash& f : files) {
    Result<FileReconstruction> rec = backend_->GetFile(f);
    if (rec.status().code() == StatusCode::kNotFound) continue;  // deleted meanwhile
    if (!rec.ok()) return rec.status();
    stats.files++;
    stats.logical_bytes += rec->size;
    for (const auto& t : rec->terms) referenced.insert(t.xorb_hash);
  }
  MEGA_ASSIGN_OR_RETURN(auto xorbs, backend_->ListXorbs());
  for (const MerkleHash& x : xorbs) {
    Result<XorbLayout> layout = backend_->GetXorbLayout(x);
    if (layout.status().code() == StatusCode::kNotFound) continue;
    if (!layout.ok()) return layout.status();
    stats.xorbs++;
    stats.chunks += layout->chunks.size();
    stats.stored_bytes += layout->serialized_bytes;
    for (const auto& c : layout->chunks) stats.unpacked_bytes += c.unpacked_bytes;
    if (referenced.count(x)) stats.referenced_xorbs++;
  }
  return stats;
}

Result<GcResult> CasStore::GarbageCollect(const GcOptions& options) {
  MEGA_ASSIGN_OR_RETURN(auto lock, backend_->Lock(StoreLockKind::kCollect));
  GcResult result;
  MEGA_ASSIGN_OR_RETURN(auto files, backend_->ListFiles());
  std::unordered_set<MerkleHash> live;
  std::vector<MerkleHash> dead_files;
  if (options.live_files) {
    std::unordered_set<MerkleHash> stored(files.begin(), files.end());
    for (const MerkleHash& f : *options.live_files) {
      if (!stored.count(f)) {
        return NotFoundError("GC: live file " + f.ToHex() + " is not stored in " +
                             backend_->Describe() + "; nothing was deleted");
      }
      live.insert(f);
    }
    for (const MerkleHash& f : files) {
      if (!live.count(f)) dead_files.push_back(f);
    }
  } else {
    live.insert(files.begin(), files.end());
  }
  std::unordered_set<MerkleHash> referenced;
  for (const MerkleHash& f : live) {
    MEGA_ASSIGN_OR_RETURN(FileReconstruction rec, backend_->GetFile(f));
    for (const auto& t : rec.terms) referenced.insert(t.xorb_hash);
  }
  MEGA_ASSIGN_OR_RETURN(auto xorbs, backend_->ListXorbs());
  std::vector<MerkleHash> dead_xorbs;
  for (const MerkleHash& x : xorbs) {
    if (referenced.count(x)) {
      result.xorbs_kept++;
      continue;
    }
    if (options.min_xorb_age_seconds > 0) {
      MEGA_ASSIGN_OR_RETURN(double age, backend_->XorbAgeSeconds(x));
      if (age < options.min_xorb_age_seconds) {
        result.xorbs_kept++;
        continue;
      }
    }
    Result<uint64_t> size = backend_->XorbSize(x);
    if (size.ok()) result.bytes_deleted += *size;
    dead_xorbs.push_back(x);
  }
  result.files_kept = live.size();
  result.files_deleted = dead_files.size();
  result.xorbs_deleted = dead_xorbs.size();
  if (!options.dry_run) {
    // Files first: no stored file may reference a deleted xorb at any moment.
    MEGA_RETURN_IF_ERROR(backend_->DeleteFiles(dead_files));
    MEGA_RETURN_IF_ERROR(backend_->DeleteXorbs(dead_xorbs));
  }
  return result;
}

Status CasStore::Verify() {
  MEGA_ASSIGN_OR_RETURN(auto xorbs, backend_->ListXorbs());
  std::unordered_map<MerkleHash, XorbLayout> layouts;
  for (const MerkleHash& x : xorbs) {
    MEGA_ASSIGN_OR_RETURN(XorbLayout layout, backend_->GetXorbLayout(x));
    MEGA_ASSIGN_OR_RETURN(std::string bytes, backend_->GetXorb(x));
    MEGA_RETURN_IF_ERROR(DecodeXorb(AsBytes(bytes), &layout).status());
    layouts.emplace(x, std::move(layout));
  }
  MEGA_ASSIGN_OR_RETURN(auto files, backend_->ListFiles());
  for (const MerkleHash& f : files) {
    MEGA_ASSIGN_OR_RETURN(FileReconstruction rec, backend_->GetFile(f));
    std::vector<HashAndSize> leaves;
    for (size_t i = 0; i < rec.terms.size(); ++i) {
      const ReconstructionTerm& t = rec.terms[i];
      auto it = layouts.find(t.xorb_hash);
      const std::string where = "file " + f.ToHex() + " term " + std::to_string(i);
      if (it == layouts.end())
        return DataLossError(where + ": xorb " + t.xorb_hash.ToHex() + " is missing");
      if (t.chunk_end > it->second.chunks.size()) {
        return DataLossError(where + ": chunk range exceeds xorb " + t.xorb_hash.ToHex());
      }
      uint64_t bytes = 0;
      for (uint32_t c = t.chunk_start; c < t.chunk_end; ++c) {
        bytes += it->second.chunks[c].unpacked_bytes;
        leaves.push_back({it->second.chunks[c].hash, it->second.chunks[c].unpacked_bytes});
      }
      if (bytes != t.unpacked_bytes)
        return DataLossError(where + ": byte count does not match the xorb");
    }
    if (FileHash(leaves, options_.file_hash_salt) != f) {
      return DataLossError("file " + f.ToHex() + ": its chunks do not hash to its name");
    }
  }
  return Status::OK();
}

}  // namespace megackpt::cas
