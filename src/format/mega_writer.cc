// MegaWriter: streams caller tensors into a MEGA v1 file.
//
// Plan of Finish():
//   1. Units: every tensor, or every chunk of a chunked tensor, is one unit
//      with its own stored bytes and checksum.
//   2. Compression pass (only for units that ask for zstd): compress each unit
//      from caller memory, keep the output when it pays off (min_ratio) and
//      fits the in-memory budget, else remember only its size and checksum and
//      recompress in the write pass (zstd is deterministic for fixed input
//      feeding and parameters; the write pass re-checks size and checksum).
//   3. Layout: payload offsets (packed or tensor_alignment), header size
//      (exact: every field of the header has a known width before checksums
//      are known).
//   4. Payload pass: the payload is cut into work items of ~io_block_size
//      bytes: large contiguous units are written straight from caller memory;
//      small or strided ones are gathered into a reused staging buffer. CRC-32
//      is computed per piece right after the bytes are touched and combined
//      per unit (so items can run in parallel). SHA-256 (sequential by nature)
//      is computed per unit in a separate pass over memory.
//      - positioned sinks: items run in parallel with WriteAt; the header is
//        written last at offset 0.
//      - sequential sinks: a first pass computes the checksums, then header
//        and items are appended in order. Both give identical bytes.
#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>

#include "format/mega_internal.h"
#include "format/quote.h"
#include "megackpt/core/checksum.h"
#include "megackpt/format/mega.h"
#include "megackpt/core/thread_pool.h"

namespace megackpt::format {

using mega_internal::ByteWriter;

struct MegaWriter::PendingTensor {
  std::string name;
  Tensor tensor;
  MegaTensorWriteOptions options;
};

using mega_internal::Checker;

namespace {

constexpr uint64_t kDirectMin = 1u << 20;  // contiguous units this big skip the staging buffer
constexpr size_t kZstdFeed = 1u << 20;      // input granularity fed to zstd (fixed: determinism)

using format_internal::Quote;

struct CctxFree {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};

// One independently stored byte range: a whole tensor or one chunk.
struct Unit {
  size_t tensor = 0;
  int64_t chunk = -1;
  uint64_t logical_offset = 0;  // within the tensor
  uint64_t logical = 0;
  bool want_zstd = false;
  bool want_shuffle = false;
  uint32_t elem_size = 1;
  MegaChecksumType checksum_type = MegaChecksumType::kNone;
  // Results.
  bool compressed = false;
  uint64_t stored = 0;
  uint64_t payload_offset = 0;
  MegaChecksum checksum{};
  bool checksum_done = false;
  std::string held;  // compressed bytes kept from the compression pass
  bool held_valid = false;
  // CRC-32 partials from the payload pass, in unit order.
  std::vector<std::pair<uint32_t, uint64_t>> crc_parts;

  bool shuffled() const { return compressed && want_shuffle; }
};

// Feeds the unit's input stream (plain bytes, or byte planes when shuffling)
// to `feed` in pieces of kZstdFeed bytes.
Status ForEachInputPiece(const Tensor& src, const Unit& u, bool shuffle,
                         const std::function<Status(std::span<const std::byte>, bool last)>& feed) {
  if (u.logical == 0) return feed({}, true);
  const bool contiguous = src.is_contiguous();
  const auto* base = static_cast<const std::byte*>(src.data());
  // Contiguous, unshuffled sources are fed straight from caller memory.
  std::shared_ptr<std::byte> buf;
  if (!contiguous || shuffle) {
    MEGA_ASSIGN_OR_RETURN(buf, AllocateBuffer(std::min<uint64_t>(kZstdFeed, u.logical)));
  }
  std::byte* b = buf.get();
  if (!shuffle) {
    for (uint64_t off = 0; off < u.logical; off += kZstdFeed) {
      const uint64_t n = std::min<uint64_t>(kZstdFeed, u.logical - off);
      if (contiguous) {
        MEGA_RETURN_IF_ERROR(feed({base + u.logical_offset + off, n}, off + n == u.logical));
      } else {
        mega_internal::GatherBytes(src, u.logical_offset + off, {b, n});
        MEGA_RETURN_IF_ERROR(feed({b, n}, off + n == u.logical));
      }
    }
    return Status::OK();
  }
  const size_t es = u.elem_size;
  const uint64_t n_elems = u.logical / es;
  // Strided sources: gather elements into a second buffer, then pick the plane.
  std::shared_ptr<std::byte> gather_buf;
  const uint64_t block_elems = kZstdFeed / es;
  if (!contiguous) {
    MEGA_ASSIGN_OR_RETURN(gather_buf, AllocateBuffer(std::min(block_elems, n_elems) * es));
  }
  for (size_t plane = 0; plane < es; ++plane) {
    for (uint64_t e0 = 0; e0 < n_elems; e0 += kZstdFeed) {
      const uint64_t n = std::min<uint64_t>(kZstdFeed, n_elems - e0);
      for (uint64_t g0 = 0; g0 < n; g0 += block_elems) {
        const uint64_t gn = std::min<uint64_t>(block_elems, n - g0);
        const std::byte* elems;
        if (contiguous) {
          elems = base + u.logical_offset + (e0 + g0) * es;
        } else {
          mega_internal::GatherBytes(src, u.logical_offset + (e0 + g0) * es,
                                     {gather_buf.get(), gn * es});
          elems = gather_buf.get();
        }
        for (uint64_t k = 0; k < gn; ++k) b[g0 + k] = elems[k * es + plane];
      }
      const bool last = plane + 1 == es && e0 + n == n_elems;
      MEGA_RETURN_IF_ERROR(feed({b, n}, last));
    }
  }
  return Status::OK();
}

// Compresses unit u as one zstd frame (content size in the frame header),
// passing output pieces to `out`. `out` returns false to stop early.
// Returns whether it ran to completion.
Result<bool> CompressUnit(const Tensor& src, const Unit& u, int level,
                          const std::function<bool(std::span<const std::byte>)>& out) {
  // One context per thread, reset for every unit (creating one per small
  // tensor would dominate the cost).
  thread_local std::unique_ptr<ZSTD_CCtx, CctxFree> cctx;
  if (!cctx) cctx.reset(ZSTD_createCCtx());
  if (!cctx) return ResourceExhaustedError("ZSTD_createCCtx failed");
  ZSTD_CCtx_reset(cctx.get(), ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(cctx.get(), ZSTD_c_contentSizeFlag, 1);
  ZSTD_CCtx_setPledgedSrcSize(cctx.get(), u.logical);
  const size_t out_cap = ZSTD_CStreamOutSize();
  MEGA_ASSIGN_OR_RETURN(auto obuf, AllocateBuffer(out_cap));
  bool stopped = false;
  Status st = ForEachInputPiece(src, u, u.want_shuffle, [&](std::span<const std::byte> in_bytes,
                                                            bool last) -> Status {
    ZSTD_inBuffer in{in_bytes.data(), in_bytes.size(), 0};
    const ZSTD_EndDirective mode = last ? ZSTD_e_end : ZSTD_e_continue;
    while (true) {
      ZSTD_outBuffer ob{obuf.get(), out_cap, 0};
      size_t rem = ZSTD_compressStream2(cctx.get(), &ob, &in, mode);
      if (ZSTD_isError(rem)) return InternalError(std::string("zstd: ") + ZSTD_getErrorName(rem));
      if (ob.pos > 0 && !out({obuf.get(), ob.pos})) {
        stopped = true;
        return AbortedError("stop");
      }
      if (last ? rem == 0 : in.pos == in.size) break;
    }
    return Status::OK();
  });
  if (stopped) return false;
  MEGA_RETURN_IF_ERROR(st);
  return true;
}


// A piece of payload: `len` bytes of unit `unit` from `unit_off` (unit < 0: zeros).
struct Piece {
  int64_t unit;
  uint64_t unit_off;
  uint64_t len;
  int64_t crc_slot;  // index into the unit's crc_parts, -1 = no CRC in this pass
};

enum class ItemKind { kDirect, kStaged, kStream };

struct WorkItem {
  ItemKind kind;
  uint64_t payload_offset;  // relative to header_length
  uint64_t len;
  std::vector<Piece> pieces;
};

// Reused staging buffers, one per concurrently running item.
class StagingPool {
 public:
  explicit StagingPool(size_t size) : size_(size) {}
  Result<std::shared_ptr<std::byte>> Acquire() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        auto b = std::move(free_.back());
        free_.pop_back();
        return b;
      }
    }
    return AllocateBuffer(size_, /*prefault=*/true);
  }
  void Release(std::shared_ptr<std::byte> b) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(b));
  }

 private:
  size_t size_;
  std::mutex mu_;
  std::vector<std::shared_ptr<std::byte>> free_;
};

bool IsProfileKey(std::string_view key) {
  return key == "general.architecture" || key == "general.alignment" ||
         key == "mega.tensor_info.format" || key == "tensorplay.container" ||
         key == "tensorplay.byteorder" || key == "tensorplay.tensor_devices" ||
         key == "tensorplay.checksum" || key == "tensorplay.tensor_checksums";
}

// Keys describing tables this writer produces itself (or never produces).
bool IsWriterManagedKey(std::string_view key) {
  return key.starts_with("mega.chunk_directory.") || key.starts_with("mega.segment_directory.") ||
         key.starts_with("mega.moe.");
}

}  // namespace

MegaWriter::MegaWriter(MegaWriterOptions options) : options_(std::move(options)) {
  if (options_.io_block_size == 0) options_.io_block_size = mega_internal::kDefaultIoBlock;
  // Keep blocks a multiple of 8 so strided pieces always end on element boundaries.
  options_.io_block_size = std::max<size_t>(options_.io_block_size / 8 * 8, 4096);
}

MegaWriter::~MegaWriter() = default;

Status MegaWriter::AddMetadata(std::string key, MetaValue value) {
  if (finished_) return FailedPreconditionError("MegaWriter: AddMetadata after Finish");
  if (!mega_internal::IsValidUtf8(key)) {
    return InvalidArgumentError("MegaWriter: metadata key is not valid UTF-8");
  }
  if (options_.profile == MegaProfile::kTensorPlay && IsProfileKey(key)) {
    return InvalidArgumentError("MegaWriter: metadata key " + Quote(key) +
                                " is written by the TensorPlay profile itself");
  }
  if (IsWriterManagedKey(key)) {
    return InvalidArgumentError("MegaWriter: metadata key " + Quote(key) +
                                " describes a table the writer manages");
  }
  if (key == "general.alignment") {
    auto v = value.AsUint64();
    if (!v.ok() || *v != options_.alignment) {
      return InvalidArgumentError("MegaWriter: general.alignment " + value.ToJson() +
                                  " differs from options.alignment " +
                                  std::to_string(options_.alignment));
    }
  }
  if (key == "mega.tensor_info.format") {
    auto s = value.AsString();
    if (!s.ok() || *s != "self_describing") {
      return InvalidArgumentError("MegaWriter: mega.tensor_info.format must be \"self_describing\"");
    }
  }
  if (options_.payload_hashes &&
      (key == "mega.hash.payload.crc32" || key == "mega.hash.payload.sha256")) {
    return InvalidArgumentError("MegaWriter: " + Quote(key) + " is computed (payload_hashes)");
  }
  return user_metadata_.Add(std::move(key), std::move(value));
}

Status MegaWriter::AddTensor(std::string name, const Tensor& tensor,
                             const MegaTensorWriteOptions& tensor_options) {
  if (finished_) return FailedPreconditionError("MegaWriter: AddTensor after Finish");
  if (name.empty()) return InvalidArgumentError("MegaWriter: empty tensor name");
  if (name.size() > UINT32_MAX) return InvalidArgumentError("MegaWriter: tensor name too long");
  if (!mega_internal::IsValidUtf8(name)) {
    return InvalidArgumentError("MegaWriter: tensor name is not valid UTF-8");
  }
  if (!tensor.defined()) return InvalidArgumentError("MegaWriter: tensor " + Quote(name) + " is undefined");
  if (tensor.dtype() == DType::kF4 && !tensor.is_contiguous()) {
    return InvalidArgumentError("MegaWriter: F4 tensor " + Quote(name) + " must be contiguous");
  }
  if (names_.count(name)) return InvalidArgumentError("MegaWriter: duplicate tensor name " + Quote(name));
  names_.emplace(name, tensors_.size());
  tensors_.push_back({std::move(name), tensor, tensor_options});
  return Status::OK();
}

Result<MegaWriteResult> MegaWriter::Finish(WritableFile& file) {
  if (finished_) return FailedPreconditionError("MegaWriter: Finish called twice");
  finished_ = true;
  const MegaWriterOptions& o = options_;
  const std::string& fname = file.name();
  // Alignments are padding sizes: 0 is meaningless and huge ones would make the
  // header (or the gaps) absurdly large.
  constexpr uint64_t kMaxAlignment = 1ull << 30;
  if (o.alignment == 0 || o.alignment > kMaxAlignment) {
    return InvalidArgumentError(fname + ": MegaWriter alignment " + std::to_string(o.alignment) +
                                " (must be 1..2^30)");
  }
  if (o.tensor_alignment == 0 || o.tensor_alignment > kMaxAlignment) {
    return InvalidArgumentError(fname + ": MegaWriter tensor_alignment " +
                                std::to_string(o.tensor_alignment) + " (must be 1..2^30)");
  }
  if (!(o.min_ratio > 0)) return InvalidArgumentError(fname + ": MegaWriter min_ratio must be > 0");
  if (o.zstd_level < ZSTD_minCLevel() || o.zstd_level > ZSTD_maxCLevel()) {
    return InvalidArgumentError(fname + ": zstd level " + std::to_string(o.zstd_level) + " out of range");
  }
  if (file.size() != 0) return InvalidArgumentError(fname + ": MegaWriter needs an empty file");
  const bool positioned = file.supports_write_at();
  ThreadPool* pool = o.max_parallel > 1 ? (o.pool ? o.pool : &ThreadPool::Default()) : nullptr;
  const int par = std::max(o.max_parallel, 1);
  const size_t block = o.io_block_size;

  // ---- 1. units ----------------------------------------------------------------
  std::vector<Unit> units;
  std::vector<std::vector<size_t>> tensor_units(tensors_.size());
  std::vector<bool> tensor_chunked(tensors_.size(), false);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const PendingTensor& p = tensors_[i];
    const MegaTensorWriteOptions& to = p.options;
    const MegaChecksumType ck = to.checksum.value_or(o.checksum);
    if (static_cast<uint32_t>(ck) > 2) return InvalidArgumentError(fname + ": bad checksum type");
    const MegaCodec codec = to.compression.value_or(o.compression);
    if (static_cast<uint32_t>(codec) > 1) return InvalidArgumentError(fname + ": bad codec");
    const bool shuffle = to.byte_shuffle.value_or(o.byte_shuffle);
    const uint64_t chunk_bytes = to.chunk_bytes.value_or(o.chunk_bytes);
    const uint64_t logical = p.tensor.nbytes();
    const uint32_t es = p.tensor.dtype() == DType::kF4 ? 1 : DTypeSize(p.tensor.dtype());
    Unit base;
    base.tensor = i;
    base.want_zstd = codec == MegaCodec::kZstd;
    base.want_shuffle = base.want_zstd && shuffle && es > 1;
    base.elem_size = es;
    base.checksum_type = ck;
    if (chunk_bytes > 0 && logical > chunk_bytes) {
      tensor_chunked[i] = true;
      const uint64_t step = std::max<uint64_t>(chunk_bytes / es * es, es);
      int64_t c = 0;
      for (uint64_t off = 0; off < logical; off += step, ++c) {
        Unit u = base;
        u.chunk = c;
        u.logical_offset = off;
        u.logical = std::min(step, logical - off);
        tensor_units[i].push_back(units.size());
        units.push_back(std::move(u));
      }
    } else {
      Unit u = base;
      u.logical = logical;
      tensor_units[i].push_back(units.size());
      units.push_back(std::move(u));
    }
  }

  // ---- 2. compression pass -------------------------------------------------------
  std::atomic<uint64_t> held_bytes{0};
  MEGA_RETURN_IF_ERROR(ParallelFor(
      pool, units.size(),
      [&](size_t ui) -> Status {
        Unit& u = units[ui];
        u.stored = u.logical;
        if (!u.want_zstd || u.logical == 0) return Status::OK();
        const Tensor& src = tensors_[u.tensor].tensor;
        const double limit = o.min_ratio * static_cast<double>(u.logical);
        Checker ck(u.checksum_type);
        uint64_t produced = 0;
        bool hold = true;
        std::string out;
        auto sink = [&](std::span<const std::byte> piece) {
          produced += piece.size();
          if (static_cast<double>(produced) > limit) return false;  // does not pay off
          ck.Update(piece);
          if (hold) {
            uint64_t prev = held_bytes.fetch_add(piece.size());
            if (prev + piece.size() > o.compression_buffer_limit) {
              held_bytes.fetch_sub(piece.size() + out.size());
              hold = false;
              std::string().swap(out);
            } else {
              out.append(reinterpret_cast<const char*>(piece.data()), piece.size());
            }
          }
          return true;
        };
        MEGA_ASSIGN_OR_RETURN(bool complete, CompressUnit(src, u, o.zstd_level, sink));
        if (!complete) {
          if (hold) held_bytes.fetch_sub(out.size());
          return Status::OK();  // stays raw
        }
        u.compressed = true;
        u.stored = produced;
        u.checksum = ck.Finish();
        u.checksum_done = true;
        u.held_valid = hold;
        u.held = std::move(out);
        return Status::OK();
      },
      par));

  // ---- 3. layout ------------------------------------------------------------------
  uint64_t cursor = 0;
  std::vector<uint64_t> tensor_offset(tensors_.size(), 0);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (mega_internal::AlignUp(cursor, o.tensor_alignment, &cursor)) {
      return InvalidArgumentError(fname + ": payload size overflows");
    }
    tensor_offset[i] = cursor;
    for (size_t ui : tensor_units[i]) {
      units[ui].payload_offset = cursor;
      if (mega_internal::AddOverflows(cursor, units[ui].stored, &cursor)) {
        return InvalidArgumentError(fname + ": payload size overflows");
      }
    }
  }
  const uint64_t payload_size = cursor;

  // Directory records (checksums filled in later).
  std::vector<MegaTensorInfo> infos(tensors_.size());
  uint64_t chunk_total = 0;
  auto fill_infos = [&]() {
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const PendingTensor& p = tensors_[i];
      MegaTensorInfo& t = infos[i];
      t = MegaTensorInfo{};
      t.tensor_id = static_cast<uint32_t>(i);
      t.name = p.name;
      t.dtype = p.tensor.dtype();
      t.shape = p.tensor.shape();
      t.logical_nbytes = p.tensor.nbytes();
      t.payload_offset = tensor_offset[i];
      if (!tensor_chunked[i]) {
        const Unit& u = units[tensor_units[i][0]];
        t.stored_nbytes = u.stored;
        t.tensor_flags = (u.compressed ? kMegaTensorCompressed : 0) |
                         (u.shuffled() ? kMegaTensorByteShuffled : 0);
        t.codec = u.compressed ? MegaCodec::kZstd : MegaCodec::kNone;
        t.shuffle_elem_size = u.shuffled() ? u.elem_size : 0;
        t.checksum_type = u.checksum_type;
        t.checksum = u.checksum;
      } else {
        t.storage_format = MegaStorageFormat::kChunkedRawDense;
        t.stored_nbytes = 0;
        for (size_t ui : tensor_units[i]) {
          const Unit& u = units[ui];
          MegaChunkInfo c;
          c.tensor_id = t.tensor_id;
          c.chunk_id = static_cast<uint32_t>(u.chunk);
          c.logical_offset = u.logical_offset;
          c.logical_size = u.logical;
          c.payload_offset = u.payload_offset;
          c.stored_size = u.stored;
          c.codec = u.compressed ? MegaCodec::kZstd : MegaCodec::kNone;
          c.flags = (u.compressed ? kMegaTensorCompressed : 0) |
                    (u.shuffled() ? kMegaTensorByteShuffled : 0);
          c.checksum_type = u.checksum_type;
          c.checksum = u.checksum;
          t.chunks.push_back(c);
          t.stored_nbytes += u.stored;
          t.tensor_flags |= c.flags;
          if (u.compressed) t.codec = MegaCodec::kZstd;
          if (u.shuffled()) t.shuffle_elem_size = u.elem_size;
        }
      }
      t.dir_flags = mega_internal::DirFlagsFor(t);
    }
  };
  fill_infos();
  for (const MegaTensorInfo& t : infos) chunk_total += t.chunks.size();

  // Metadata.
  uint32_t payload_crc = 0;
  Sha256Digest payload_sha{};
  auto build_metadata = [&]() -> Result<MegaMetadata> {
    MegaMetadata md;
    if (o.profile == MegaProfile::kTensorPlay) {
      MEGA_RETURN_IF_ERROR(mega_internal::AddTensorplayProfile(
          infos, o.alignment, o.tensorplay_container, o.checksum, &md));
    }
    for (const MetaEntry& e : user_metadata_.entries()) MEGA_RETURN_IF_ERROR(md.Add(e.key, e.value));
    if (o.profile == MegaProfile::kBare && !md.Contains("general.alignment") &&
        o.alignment != kMegaDefaultAlignment) {
      MEGA_RETURN_IF_ERROR(md.Add("general.alignment", MetaValue::UInt(o.alignment)));
    }
    if (chunk_total > 0) {
      MEGA_RETURN_IF_ERROR(md.Add("mega.chunk_directory.count", MetaValue::UInt(chunk_total)));
      MEGA_RETURN_IF_ERROR(md.Add("mega.chunk_directory.format", MetaValue::String("v1")));
    }
    if (o.payload_hashes) {
      MEGA_RETURN_IF_ERROR(md.Add("mega.hash.payload.crc32", MetaValue::U32(payload_crc)));
      MEGA_RETURN_IF_ERROR(md.Add("mega.hash.payload.sha256", MetaValue::String(ToHex(payload_sha))));
    }
    return md;
  };
  std::vector<MegaSegment> no_segments;
  std::vector<MegaMoeExpert> no_moe;
  MEGA_ASSIGN_OR_RETURN(MegaMetadata planned_md, build_metadata());
  const uint64_t header_length =
      mega_internal::EncodeHeader(planned_md, infos, no_segments, no_moe, o.alignment).size();
  const uint64_t file_end = header_length + payload_size;

  // ---- 4. payload work items -------------------------------------------------------
  std::vector<WorkItem> items;
  std::vector<int64_t> next_slot(units.size(), 0);
  {
    WorkItem staged{ItemKind::kStaged, 0, 0, {}};
    auto flush = [&]() {
      if (staged.len > 0) items.push_back(std::move(staged));
      staged = WorkItem{ItemKind::kStaged, 0, 0, {}};
    };
    uint64_t pos = 0;
    auto add_staged = [&](int64_t unit, uint64_t unit_off, uint64_t len, uint64_t granule) {
      while (len > 0) {
        if (staged.len == 0) staged.payload_offset = pos;
        uint64_t space = block - staged.len;
        uint64_t n = std::min(len, space / granule * granule);
        if (n == 0) {
          flush();
          continue;
        }
        int64_t slot = unit >= 0 ? next_slot[unit]++ : -1;
        staged.pieces.push_back({unit, unit_off, n, slot});
        staged.len += n;
        pos += n;
        unit_off += n;
        len -= n;
        if (staged.len == block) flush();
      }
    };
    for (size_t ui = 0; ui < units.size(); ++ui) {
      Unit& u = units[ui];
      if (u.payload_offset > pos) add_staged(-1, 0, u.payload_offset - pos, 1);
      const Tensor& src = tensors_[u.tensor].tensor;
      const bool held = u.compressed && u.held_valid;
      const bool contiguous_source = held || (!u.compressed && src.is_contiguous());
      if (u.compressed && !u.held_valid) {
        flush();
        items.push_back({ItemKind::kStream, pos, u.stored, {{static_cast<int64_t>(ui), 0, u.stored, -1}}});
        pos += u.stored;
      } else if (contiguous_source && u.stored >= kDirectMin) {
        flush();
        for (uint64_t off = 0; off < u.stored; off += block) {
          uint64_t n = std::min<uint64_t>(block, u.stored - off);
          items.push_back({ItemKind::kDirect, pos, n,
                           {{static_cast<int64_t>(ui), off, n, next_slot[ui]++}}});
          pos += n;
        }
      } else {
        const uint64_t granule = contiguous_source ? 1 : u.elem_size;
        add_staged(static_cast<int64_t>(ui), 0, u.stored, granule);
      }
    }
    flush();
  }
  for (size_t ui = 0; ui < units.size(); ++ui) units[ui].crc_parts.assign(next_slot[ui], {0, 0});

  // Bytes of the last 68 of the file, to avoid a file whose tail looks like a
  // footer trailer (a reader would then reject it).
  std::array<std::byte, 4> tail_probe{};
  const uint64_t probe_at = file_end >= kMegaFooterTrailerSize ? file_end - kMegaFooterTrailerSize : UINT64_MAX;
  auto probe = [&](uint64_t file_off, std::span<const std::byte> bytes) {
    if (probe_at == UINT64_MAX) return;
    const uint64_t b = std::max(file_off, probe_at);
    const uint64_t e = std::min(file_off + bytes.size(), probe_at + 4);
    for (uint64_t x = b; x < e; ++x) tail_probe[x - probe_at] = bytes[x - file_off];
  };

  StagingPool staging(block);
  // Runs one item: produces its bytes and hands them to `sink` (file offset,
  // bytes), computing CRC partials when `crc` and feeding `payload_hash`.
  struct PayloadHasher {
    uint32_t crc = 0;
    Sha256 sha;
  };
  auto run_item = [&](const WorkItem& item, bool crc,
                      const std::function<Status(uint64_t, std::span<const std::byte>)>& sink,
                      PayloadHasher* payload_hash) -> Status {
    const uint64_t item_file_off = header_length + item.payload_offset;
    auto emit = [&](uint64_t file_off, std::span<const std::byte> bytes) -> Status {
      if (payload_hash) {
        payload_hash->crc = Crc32Extend(payload_hash->crc, bytes);
        payload_hash->sha.Update(bytes);
      }
      probe(file_off, bytes);
      return sink ? sink(file_off, bytes) : Status::OK();
    };
    auto record_crc = [&](const Piece& p, std::span<const std::byte> bytes) {
      Unit& u = units[p.unit];
      if (crc && p.crc_slot >= 0 && u.checksum_type == MegaChecksumType::kCrc32 && !u.checksum_done) {
        u.crc_parts[p.crc_slot] = {Crc32(bytes), bytes.size()};
      }
    };
    if (item.kind == ItemKind::kDirect) {
      const Piece& p = item.pieces[0];
      const Unit& u = units[p.unit];
      const std::byte* src = u.compressed
                                 ? reinterpret_cast<const std::byte*>(u.held.data())
                                 : static_cast<const std::byte*>(tensors_[u.tensor].tensor.data()) +
                                       u.logical_offset;
      std::span<const std::byte> bytes(src + p.unit_off, p.len);
      record_crc(p, bytes);
      return emit(item_file_off, bytes);
    }
    if (item.kind == ItemKind::kStream) {
      const Piece& p = item.pieces[0];
      const Unit& u = units[p.unit];
      Checker ck(u.checksum_type);
      uint64_t off = 0;
      Status st;
      auto sink = [&](std::span<const std::byte> piece) {
        if (off + piece.size() > u.stored) {
          st = InternalError(fname + ": zstd output of tensor " + Quote(tensors_[u.tensor].name) +
                             " changed between passes");
          return false;
        }
        ck.Update(piece);
        st = emit(item_file_off + off, piece);
        off += piece.size();
        return st.ok();
      };
      MEGA_ASSIGN_OR_RETURN(bool complete,
                            CompressUnit(tensors_[u.tensor].tensor, u, o.zstd_level, sink));
      MEGA_RETURN_IF_ERROR(st);
      if (!complete || off != u.stored || ck.Finish() != u.checksum) {
        return InternalError(fname + ": zstd output of tensor " + Quote(tensors_[u.tensor].name) +
                             " changed between passes");
      }
      return Status::OK();
    }
    MEGA_ASSIGN_OR_RETURN(auto buf, staging.Acquire());
    std::byte* b = buf.get();
    uint64_t at = 0;
    for (const Piece& p : item.pieces) {
      std::span<std::byte> dst(b + at, p.len);
      if (p.unit < 0) {
        std::memset(dst.data(), 0, p.len);
      } else {
        const Unit& u = units[p.unit];
        if (u.compressed) {
          std::memcpy(dst.data(), u.held.data() + p.unit_off, p.len);
        } else {
          mega_internal::GatherBytes(tensors_[u.tensor].tensor, u.logical_offset + p.unit_off, dst);
        }
        record_crc(p, dst);
      }
      at += p.len;
    }
    Status st = emit(item_file_off, {b, item.len});
    staging.Release(std::move(buf));
    return st;
  };

  // SHA-256 of raw units: one sequential pass per unit (parallel across units).
  MEGA_RETURN_IF_ERROR(ParallelFor(
      pool, units.size(),
      [&](size_t ui) -> Status {
        Unit& u = units[ui];
        if (u.checksum_done || u.checksum_type != MegaChecksumType::kSha256) return Status::OK();
        Sha256 sha;
        const Tensor& src = tensors_[u.tensor].tensor;
        if (src.is_contiguous()) {
          sha.Update({static_cast<const std::byte*>(src.data()) + u.logical_offset, u.logical});
        } else {
          MEGA_ASSIGN_OR_RETURN(auto buf, staging.Acquire());
          for (uint64_t off = 0; off < u.logical; off += block) {
            std::span<std::byte> piece(buf.get(), std::min<uint64_t>(block, u.logical - off));
            mega_internal::GatherBytes(src, u.logical_offset + off, piece);
            sha.Update(piece);
          }
          staging.Release(std::move(buf));
        }
        u.checksum = mega_internal::Sha256Field(sha.Finish());
        u.checksum_done = true;
        return Status::OK();
      },
      par));

  auto finish_crcs = [&]() {
    for (Unit& u : units) {
      if (u.checksum_done || u.checksum_type != MegaChecksumType::kCrc32) continue;
      uint32_t crc = 0;
      for (const auto& [part, len] : u.crc_parts) crc = mega_internal::Crc32Combine(crc, part, len);
      u.checksum = mega_internal::Crc32Field(crc);
      u.checksum_done = true;
    }
  };
  auto final_header = [&]() -> Result<std::string> {
    fill_infos();
    MEGA_ASSIGN_OR_RETURN(MegaMetadata md, build_metadata());
    std::string header = mega_internal::EncodeHeader(md, infos, no_segments, no_moe, o.alignment);
    if (header.size() != header_length) {
      return InternalError(fname + ": header size changed from " + std::to_string(header_length) +
                           " to " + std::to_string(header.size()));
    }
    planned_md = std::move(md);
    return header;
  };

  // A first, ordered pass is needed when the header must precede the payload
  // (sequential sinks) or when it carries whole-payload hashes.
  const bool ordered_prepass = o.payload_hashes;
  const bool need_crc_prepass = !positioned;
  if (ordered_prepass) {
    PayloadHasher ph;
    for (const WorkItem& item : items) MEGA_RETURN_IF_ERROR(run_item(item, true, nullptr, &ph));
    if (probe_at != UINT64_MAX && probe_at >= header_length &&
        mega_internal::Load32(tail_probe.data()) == kMegaFooterMagic) {
      // The trailer guard below will append zeros that are part of the payload.
      std::string zeros(kMegaFooterTrailerSize, '\0');
      ph.crc = Crc32Extend(ph.crc, AsBytes(zeros));
      ph.sha.Update(AsBytes(zeros));
    }
    payload_crc = ph.crc;
    payload_sha = ph.sha.Finish();
    finish_crcs();
  } else if (need_crc_prepass) {
    MEGA_RETURN_IF_ERROR(ParallelFor(
        pool, items.size(),
        [&](size_t i) {
          // Stream items computed their checksum in the compression pass.
          if (items[i].kind == ItemKind::kStream) return Status::OK();
          return run_item(items[i], true, nullptr, nullptr);
        },
        par));
    finish_crcs();
  }

  if (positioned) {
    MEGA_RETURN_IF_ERROR(ParallelFor(
        pool, items.size(),
        [&](size_t i) {
          return run_item(items[i], true,
                          [&](uint64_t off, std::span<const std::byte> bytes) {
                            return file.WriteAt(off, bytes);
                          },
                          nullptr);
        },
        par));
    finish_crcs();
    MEGA_ASSIGN_OR_RETURN(std::string header, final_header());
    std::span<const std::byte> hb(reinterpret_cast<const std::byte*>(header.data()), header.size());
    probe(0, hb);
    MEGA_RETURN_IF_ERROR(file.WriteAt(0, hb));
  } else {
    MEGA_ASSIGN_OR_RETURN(std::string header, final_header());
    std::span<const std::byte> hb(reinterpret_cast<const std::byte*>(header.data()), header.size());
    probe(0, hb);
    MEGA_RETURN_IF_ERROR(file.Append(hb));
    uint64_t written = header.size();
    for (const WorkItem& item : items) {
      MEGA_RETURN_IF_ERROR(run_item(item, false,
                                    [&](uint64_t off, std::span<const std::byte> bytes) -> Status {
                                      if (off != written) {
                                        return InternalError(fname + ": out-of-order append");
                                      }
                                      written += bytes.size();
                                      return file.Append(bytes);
                                    },
                                    nullptr));
    }
  }
  uint64_t final_size = file_end;
  if (probe_at != UINT64_MAX && mega_internal::Load32(tail_probe.data()) == kMegaFooterMagic) {
    // Pad so the last 68 bytes are zeros (payload_end = file size, so trailing
    // zeros are just unused payload).
    std::string zeros(kMegaFooterTrailerSize, '\0');
    std::span<const std::byte> zb(reinterpret_cast<const std::byte*>(zeros.data()), zeros.size());
    MEGA_RETURN_IF_ERROR(positioned ? file.WriteAt(file_end, zb) : file.Append(zb));
    final_size += zeros.size();
  }

  MegaWriteResult result;
  result.file_size = final_size;
  result.header_length = header_length;
  result.payload_end = final_size;
  for (MegaTensorInfo& t : infos) {
    t.file_offset = header_length + t.payload_offset;
    for (MegaChunkInfo& c : t.chunks) c.file_offset = header_length + c.payload_offset;
  }
  result.tensors = std::move(infos);
  result.metadata = std::move(planned_md);
  return result;
}

Result<MegaWriteResult> MegaWriter::WriteFile(const std::string& path, bool sync) {
  MEGA_ASSIGN_OR_RETURN(auto file, CreateLocalFile(path));
  auto result = Finish(*file);
  Status st = result.status();
  if (st.ok() && sync) st = file->Sync();
  Status close = file->Close();
  if (st.ok()) st = close;
  if (!st.ok()) {
    ::unlink(path.c_str());
    return st;
  }
  return result;
}

// ---- footer overlay ----------------------------------------------------------------

Result<MegaFooterOverlayInfo> AppendFooterOverlay(const std::string& path,
                                                  const MegaMetadata& entries, bool sync) {
  if (entries.empty()) return InvalidArgumentError(path + ": footer overlay with no entries");
  for (const MetaEntry& e : entries.entries()) {
    if (IsMegaStructuralKey(e.key)) {
      return InvalidArgumentError(path + ": footer overlay may not set structural key " + Quote(e.key));
    }
    if (!mega_internal::IsValidUtf8(e.key)) {
      return InvalidArgumentError(path + ": footer overlay key is not valid UTF-8");
    }
  }
  MegaReaderOptions ro;
  ro.verify_checksums = false;
  MEGA_ASSIGN_OR_RETURN(auto reader, MegaReader::OpenFile(path, ro));
  const MegaFooterOverlayInfo& prev = reader->footer_overlay();
  MegaFooterOverlayInfo next;
  next.present = true;
  next.generation = prev.present ? prev.generation + 1 : 1;
  next.base_size = prev.present ? prev.base_size : reader->file_size();
  next.overlay_offset = reader->file_size();
  next.metadata = prev.metadata;
  for (const MetaEntry& e : entries.entries()) next.metadata.Set(e.key, e.value);
  std::string bytes = mega_internal::EncodeOverlay(next.metadata);
  next.overlay_size = bytes.size();
  next.sha256 = Sha256Of(AsBytes(bytes));
  bytes += mega_internal::EncodeTrailer(next.generation, next.overlay_offset, next.overlay_size,
                                        next.base_size, next.sha256);
  reader.reset();

  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(path + ": open for append", errno);
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::pwrite(fd, bytes.data() + done, bytes.size() - done,
                         static_cast<off_t>(next.overlay_offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoToStatus(path + ": pwrite footer overlay", err);
    }
    done += static_cast<size_t>(n);
  }
  if (sync && ::fdatasync(fd) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoToStatus(path + ": fdatasync", err);
  }
  if (::close(fd) != 0) return ErrnoToStatus(path + ": close", errno);
  return next;
}

}  // namespace megackpt::format
