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
#include "megackpt/core/text.h"
#include "megackpt/core/thread_pool.h"
#include "megackpt/format/mega.h"
#include "megackpt/format/mega_encoder.h"

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
constexpr size_t kZstdFeed = 1u << 20;     // input granularity fed to zstd (fixed: determinism)

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
  Status st = ForEachInputPiece(
      src, u, u.want_shuffle, [&](std::span<const std::byte> in_bytes, bool last) -> Status {
        ZSTD_inBuffer in{in_bytes.data(), in_bytes.size(), 0};
        const ZSTD_EndDirective mode = last ? ZSTD_e_end : ZSTD_e_continue;
        while (true) {
          ZSTD_outBuffer ob{obuf.get(), out_cap, 0};
          size_t rem = ZSTD_compressStream2(cctx.get(), &ob, &in, mode);
          if (ZSTD_isError(rem))
            return InternalError(std::string("zstd: ") + ZSTD_getErrorName(rem));
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

struct PayloadHasher {
  uint32_t crc = 0;
  Sha256 sha;
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
  if (!IsCleanText(key)) {
    return InvalidArgumentError("MegaWriter: metadata key " + Quote(key) +
                                " is not valid UTF-8 without NUL");
  }
  if (!IsCleanMetaValue(value)) {
    return InvalidArgumentError("MegaWriter: metadata value of " + Quote(key) +
                                " holds a string that is not valid UTF-8 without NUL");
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
      return InvalidArgumentError(
          "MegaWriter: mega.tensor_info.format must be \"self_describing\"");
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
  if (!IsCleanText(name)) {
    return InvalidArgumentError("MegaWriter: tensor name " + Quote(name) +
                                " is not valid UTF-8 without NUL");
  }
  if (!tensor.defined())
    return InvalidArgumentError("MegaWriter: tensor " + Quote(name) + " is undefined");
  if (tensor.dtype() == DType::kF4 && !tensor.is_contiguous()) {
    return InvalidArgumentError("MegaWriter: F4 tensor " + Quote(name) + " must be contiguous");
  }
  if (names_.count(name))
    return InvalidArgumentError("MegaWriter: duplicate tensor name " + Quote(name));
  names_.emplace(name, tensors_.size());
  tensors_.push_back({std::move(name), tensor, tensor_options});
  return Status::OK();
}

// ---- Finish, step by step ------------------------------------------------------------

namespace {

// Everything one Finish works on.
struct FinishState {
  const std::string& fname;
  const MegaWriterOptions& o;
  ThreadPool* pool = nullptr;
  int par = 1;
  bool positioned = false;
  std::vector<Unit> units;
  std::vector<std::vector<size_t>> tensor_units;
  std::vector<bool> tensor_chunked;
  std::unique_ptr<MegaEncoder> encoder;
  std::vector<WorkItem> items;
};

}  // namespace

class MegaWriter::Finisher {
 public:
  Finisher(const std::vector<PendingTensor>& tensors, const MegaMetadata& user_metadata,
           const MegaWriterOptions& options)
      : tensors_(tensors), user_metadata_(user_metadata), options_(options) {}

  // 0. Options that cannot be written.
  Status CheckFinishOptions(const std::string& fname, const WritableFile& file) const {
    const MegaWriterOptions& o = options_;
    if (!(o.min_ratio > 0))
      return InvalidArgumentError(fname + ": MegaWriter min_ratio must be > 0");
    if (o.zstd_level < ZSTD_minCLevel() || o.zstd_level > ZSTD_maxCLevel()) {
      return InvalidArgumentError(fname + ": zstd level " + std::to_string(o.zstd_level) +
                                  " out of range");
    }
    if (file.size() != 0) return InvalidArgumentError(fname + ": MegaWriter needs an empty file");
    return Status::OK();
  }

  // 1. Units: every tensor, or every chunk of a chunked tensor.
  Status MakeUnits(FinishState& s) const {
    const MegaWriterOptions& o = s.o;
    s.tensor_units.assign(tensors_.size(), {});
    s.tensor_chunked.assign(tensors_.size(), false);
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const PendingTensor& p = tensors_[i];
      const MegaTensorWriteOptions& to = p.options;
      const MegaChecksumType ck = to.checksum.value_or(o.checksum);
      if (static_cast<uint32_t>(ck) > 2)
        return InvalidArgumentError(s.fname + ": bad checksum type");
      const MegaCodec codec = to.compression.value_or(o.compression);
      if (static_cast<uint32_t>(codec) > 1) return InvalidArgumentError(s.fname + ": bad codec");
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
        s.tensor_chunked[i] = true;
        const uint64_t step = std::max<uint64_t>(chunk_bytes / es * es, es);
        int64_t c = 0;
        for (uint64_t off = 0; off < logical; off += step, ++c) {
          Unit u = base;
          u.chunk = c;
          u.logical_offset = off;
          u.logical = std::min(step, logical - off);
          s.tensor_units[i].push_back(s.units.size());
          s.units.push_back(std::move(u));
        }
      } else {
        Unit u = base;
        u.logical = logical;
        s.tensor_units[i].push_back(s.units.size());
        s.units.push_back(std::move(u));
      }
    }
    return Status::OK();
  }

  // 2. Compression pass (units that ask for zstd): compress from caller memory,
  // keep the output when it pays off (min_ratio) and fits the in-memory budget,
  // else remember only its size and checksum (recompressed in the write pass).
  Status CompressUnits(FinishState& s) const {
    const MegaWriterOptions& o = s.o;
    std::atomic<uint64_t> held_bytes{0};
    return ParallelFor(
        s.pool, s.units.size(),
        [&](size_t ui) -> Status {
          Unit& u = s.units[ui];
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
        s.par);
  }

  // 3. Layout: the encoder plans offsets, header and profile keys from the units.
  Status PlanLayout(FinishState& s) const {
    std::vector<MegaEncoderTensor> specs(tensors_.size());
    for (size_t i = 0; i < tensors_.size(); ++i) {
      MegaEncoderTensor& t = specs[i];
      t.name = tensors_[i].name;
      t.dtype = tensors_[i].tensor.dtype();
      t.shape = tensors_[i].tensor.shape();
      t.chunked = s.tensor_chunked[i];
      for (size_t ui : s.tensor_units[i]) {
        const Unit& u = s.units[ui];
        t.checksum = u.checksum_type;
        if (u.shuffled()) t.shuffle_elem_size = u.elem_size;
        t.units.push_back({u.logical_offset, u.logical, u.stored, u.compressed, u.shuffled()});
      }
    }
    MegaEncoderOptions eo;
    eo.alignment = s.o.alignment;
    eo.tensor_alignment = s.o.tensor_alignment;
    eo.profile = s.o.profile;
    eo.tensorplay_container = s.o.tensorplay_container;
    eo.checksum = s.o.checksum;
    eo.payload_hashes = s.o.payload_hashes;
    MEGA_ASSIGN_OR_RETURN(s.encoder,
                          MegaEncoder::Plan(s.fname, std::move(specs), user_metadata_, eo));
    for (size_t i = 0; i < tensors_.size(); ++i) {
      for (size_t k = 0; k < s.tensor_units[i].size(); ++k) {
        s.units[s.tensor_units[i][k]].payload_offset =
            s.encoder->unit_file_offset(i, k) - s.encoder->header_length();
      }
    }
    return Status::OK();
  }

  // 4. Work items of ~io_block_size bytes: large contiguous units straight from
  // caller memory, small or strided ones gathered into a reused staging buffer,
  // compressed units that were not kept streamed through zstd again.
  void MakeWorkItems(FinishState& s) const {
    const uint64_t block = s.o.io_block_size;
    std::vector<int64_t> next_slot(s.units.size(), 0);
    WorkItem staged{ItemKind::kStaged, 0, 0, {}};
    auto flush = [&]() {
      if (staged.len > 0) s.items.push_back(std::move(staged));
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
    for (size_t ui = 0; ui < s.units.size(); ++ui) {
      Unit& u = s.units[ui];
      if (u.payload_offset > pos) add_staged(-1, 0, u.payload_offset - pos, 1);
      const Tensor& src = tensors_[u.tensor].tensor;
      const bool held = u.compressed && u.held_valid;
      const bool contiguous_source = held || (!u.compressed && src.is_contiguous());
      if (u.compressed && !u.held_valid) {
        flush();
        s.items.push_back(
            {ItemKind::kStream, pos, u.stored, {{static_cast<int64_t>(ui), 0, u.stored, -1}}});
        pos += u.stored;
      } else if (contiguous_source && u.stored >= kDirectMin) {
        flush();
        for (uint64_t off = 0; off < u.stored; off += block) {
          uint64_t n = std::min<uint64_t>(block, u.stored - off);
          s.items.push_back(
              {ItemKind::kDirect, pos, n, {{static_cast<int64_t>(ui), off, n, next_slot[ui]++}}});
          pos += n;
        }
      } else {
        const uint64_t granule = contiguous_source ? 1 : u.elem_size;
        add_staged(static_cast<int64_t>(ui), 0, u.stored, granule);
      }
    }
    flush();
    for (size_t ui = 0; ui < s.units.size(); ++ui)
      s.units[ui].crc_parts.assign(next_slot[ui], {0, 0});
  }

  // Produces one item's bytes and hands them to `sink` (file offset, bytes),
  // computing CRC partials when `crc` and feeding `payload_hash`.
  Status RunItem(FinishState& s, StagingPool& staging, const WorkItem& item, bool crc,
                 const std::function<Status(uint64_t, std::span<const std::byte>)>& sink,
                 PayloadHasher* payload_hash) const {
    const uint64_t item_file_off = s.encoder->header_length() + item.payload_offset;
    auto emit = [&](uint64_t file_off, std::span<const std::byte> bytes) -> Status {
      if (payload_hash) {
        payload_hash->crc = Crc32Extend(payload_hash->crc, bytes);
        payload_hash->sha.Update(bytes);
      }
      if (!sink) {
        s.encoder->Observe(file_off, bytes);
        return Status::OK();
      }
      return sink(file_off, bytes);
    };
    auto record_crc = [&](const Piece& p, std::span<const std::byte> bytes) {
      Unit& u = s.units[p.unit];
      if (crc && p.crc_slot >= 0 && u.checksum_type == MegaChecksumType::kCrc32 &&
          !u.checksum_done) {
        u.crc_parts[p.crc_slot] = {Crc32(bytes), bytes.size()};
      }
    };
    if (item.kind == ItemKind::kDirect) {
      const Piece& p = item.pieces[0];
      const Unit& u = s.units[p.unit];
      const std::byte* src =
          u.compressed
              ? reinterpret_cast<const std::byte*>(u.held.data())
              : static_cast<const std::byte*>(tensors_[u.tensor].tensor.data()) + u.logical_offset;
      std::span<const std::byte> bytes(src + p.unit_off, p.len);
      record_crc(p, bytes);
      return emit(item_file_off, bytes);
    }
    if (item.kind == ItemKind::kStream) {
      const Piece& p = item.pieces[0];
      const Unit& u = s.units[p.unit];
      Checker ck(u.checksum_type);
      uint64_t off = 0;
      Status st;
      const std::string changed = s.fname + ": zstd output of tensor " +
                                  Quote(tensors_[u.tensor].name) + " changed between passes";
      auto out = [&](std::span<const std::byte> piece) {
        if (off + piece.size() > u.stored) {
          st = InternalError(changed);
          return false;
        }
        ck.Update(piece);
        st = emit(item_file_off + off, piece);
        off += piece.size();
        return st.ok();
      };
      MEGA_ASSIGN_OR_RETURN(bool complete,
                            CompressUnit(tensors_[u.tensor].tensor, u, s.o.zstd_level, out));
      MEGA_RETURN_IF_ERROR(st);
      if (!complete || off != u.stored || ck.Finish() != u.checksum) return InternalError(changed);
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
        const Unit& u = s.units[p.unit];
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
  }

  // SHA-256 of raw units: one sequential pass per unit (parallel across units).
  Status HashSha256Units(FinishState& s, StagingPool& staging) const {
    const uint64_t block = s.o.io_block_size;
    return ParallelFor(
        s.pool, s.units.size(),
        [&](size_t ui) -> Status {
          Unit& u = s.units[ui];
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
        s.par);
  }

  // Combines the CRC partials of every unit and hands all checksums to the encoder.
  void FinishChecksums(FinishState& s) const {
    for (size_t i = 0; i < s.tensor_units.size(); ++i) {
      for (size_t k = 0; k < s.tensor_units[i].size(); ++k) {
        Unit& u = s.units[s.tensor_units[i][k]];
        if (!u.checksum_done && u.checksum_type == MegaChecksumType::kCrc32) {
          uint32_t crc = 0;
          for (const auto& [part, len] : u.crc_parts) crc = Crc32Combine(crc, part, len);
          u.checksum = mega_internal::Crc32Field(crc);
          u.checksum_done = true;
        }
        s.encoder->SetUnitChecksum(i, k, u.checksum);
      }
    }
  }

 private:
  const std::vector<PendingTensor>& tensors_;
  const MegaMetadata& user_metadata_;
  const MegaWriterOptions& options_;
};

Result<MegaWriteResult> MegaWriter::Finish(WritableFile& file) {
  if (finished_) return FailedPreconditionError("MegaWriter: Finish called twice");
  finished_ = true;
  const std::string& fname = file.name();
  Finisher steps(tensors_, user_metadata_, options_);
  MEGA_RETURN_IF_ERROR(steps.CheckFinishOptions(fname, file));
  FinishState s{fname, options_};
  s.positioned = file.supports_write_at();
  s.pool = options_.max_parallel > 1 ? (options_.pool ? options_.pool : &ThreadPool::Default())
                                     : nullptr;
  s.par = std::max(options_.max_parallel, 1);
  MEGA_RETURN_IF_ERROR(steps.MakeUnits(s));
  MEGA_RETURN_IF_ERROR(steps.CompressUnits(s));
  MEGA_RETURN_IF_ERROR(steps.PlanLayout(s));
  steps.MakeWorkItems(s);
  StagingPool staging(options_.io_block_size);
  MEGA_RETURN_IF_ERROR(steps.HashSha256Units(s, staging));
  MegaEncoder& enc = *s.encoder;

  // A first, ordered pass is needed when the header must precede the payload
  // (sequential sinks) or when it carries whole-payload hashes.
  if (options_.payload_hashes) {
    PayloadHasher ph;
    for (const WorkItem& item : s.items)
      MEGA_RETURN_IF_ERROR(steps.RunItem(s, staging, item, true, nullptr, &ph));
    if (enc.planned_size() >= enc.header_length() + kMegaFooterTrailerSize &&
        enc.tail_guard_needed()) {
      // The tail guard appends zeros that are part of the payload.
      const std::string zeros(kMegaFooterTrailerSize, '\0');
      ph.crc = Crc32Extend(ph.crc, AsBytes(zeros));
      ph.sha.Update(AsBytes(zeros));
    }
    enc.SetPayloadHashes(ph.crc, ph.sha.Finish());
    steps.FinishChecksums(s);
  } else if (!s.positioned) {
    MEGA_RETURN_IF_ERROR(ParallelFor(
        s.pool, s.items.size(),
        [&](size_t i) {
          // Stream items computed their checksum in the compression pass.
          if (s.items[i].kind == ItemKind::kStream) return Status::OK();
          return steps.RunItem(s, staging, s.items[i], true, nullptr, nullptr);
        },
        s.par));
    steps.FinishChecksums(s);
  }

  if (s.positioned) {
    MEGA_RETURN_IF_ERROR(ParallelFor(
        s.pool, s.items.size(),
        [&](size_t i) {
          return steps.RunItem(
              s, staging, s.items[i], true,
              [&](uint64_t off, std::span<const std::byte> bytes) {
                return enc.WriteAt(file, off, bytes);
              },
              nullptr);
        },
        s.par));
    steps.FinishChecksums(s);
    MEGA_RETURN_IF_ERROR(enc.FinishPositioned(file));
  } else {
    MEGA_RETURN_IF_ERROR(enc.AppendHeader(file));
    for (const WorkItem& item : s.items) {
      MEGA_RETURN_IF_ERROR(steps.RunItem(
          s, staging, item, false,
          [&](uint64_t off, std::span<const std::byte> bytes) {
            return enc.Append(file, off, bytes);
          },
          nullptr));
    }
    MEGA_RETURN_IF_ERROR(enc.FinishAppend(file));
  }
  return enc.result();
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
      return InvalidArgumentError(path + ": footer overlay may not set structural key " +
                                  Quote(e.key));
    }
    if (!IsCleanText(e.key) || !IsCleanMetaValue(e.value)) {
      return InvalidArgumentError(path + ": footer overlay entry " + Quote(e.key) +
                                  " is not valid UTF-8 without NUL");
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
  if (Status st = PwriteFull(fd, bytes.data(), bytes.size(), next.overlay_offset,
                             path + " (footer overlay)");
      !st.ok()) {
    ::close(fd);
    return st;
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
