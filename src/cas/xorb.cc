#include "megackpt/cas/xorb.h"

#include <immintrin.h>
#include <lz4frame.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "cas/bytes.h"
#include "megackpt/core/checksum.h"

namespace megackpt::cas {

namespace {

constexpr char kFooterMagic[8] = {'M', 'C', 'K', 'X', 'O', 'R', 'B', '1'};
constexpr uint32_t kFooterVersion = 1;

// Bytes sampled per lane to decide whether BG4 is worth trying.
constexpr size_t kSampleBytes = 16 * 1024;

// Splits `in` into 4 byte lanes (bytes 4i+k go to lane k), lanes concatenated.
void SplitBg4Scalar(const uint8_t* in, size_t n, uint8_t* const lane[4], size_t from) {
  for (size_t i = from; i < n / 4; ++i) {
    lane[0][i] = in[4 * i];
    lane[1][i] = in[4 * i + 1];
    lane[2][i] = in[4 * i + 2];
    lane[3][i] = in[4 * i + 3];
  }
}

// 16 input bytes at a time: one byte shuffle puts each lane's 4 bytes together.
__attribute__((target("ssse3"))) size_t SplitBg4Ssse3(const uint8_t* in, size_t n,
                                                      uint8_t* const lane[4]) {
  const __m128i mask = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  size_t groups = n / 16;
  for (size_t g = 0; g < groups; ++g) {
    __m128i v =
        _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 16 * g)), mask);
    uint32_t w[4];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(w), v);
    std::memcpy(lane[0] + 4 * g, &w[0], 4);
    std::memcpy(lane[1] + 4 * g, &w[1], 4);
    std::memcpy(lane[2] + 4 * g, &w[2], 4);
    std::memcpy(lane[3] + 4 * g, &w[3], 4);
  }
  return groups * 4;  // 4-byte groups done
}

__attribute__((target("ssse3"))) size_t JoinBg4Ssse3(const uint8_t* const lane[4], size_t n,
                                                     uint8_t* out) {
  const __m128i mask = _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  size_t groups = n / 16;
  for (size_t g = 0; g < groups; ++g) {
    uint32_t w[4];
    std::memcpy(&w[0], lane[0] + 4 * g, 4);
    std::memcpy(&w[1], lane[1] + 4 * g, 4);
    std::memcpy(&w[2], lane[2] + 4 * g, 4);
    std::memcpy(&w[3], lane[3] + 4 * g, 4);
    // The shuffle is its own inverse (a 4x4 byte transpose).
    __m128i v = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)), mask);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16 * g), v);
  }
  return groups * 4;
}

bool HaveSsse3() {
  static const bool have = __builtin_cpu_supports("ssse3");
  return have;
}

void LaneStarts(size_t n, size_t lane_size[4]) {
  for (int k = 0; k < 4; ++k) lane_size[k] = n > static_cast<size_t>(k) ? (n - k + 3) / 4 : 0;
}

void SplitBg4(const uint8_t* in, size_t n, uint8_t* out) {
  size_t ls[4];
  LaneStarts(n, ls);
  uint8_t* const lane[4] = {out, out + ls[0], out + ls[0] + ls[1], out + ls[0] + ls[1] + ls[2]};
  size_t done = HaveSsse3() ? SplitBg4Ssse3(in, n, lane) : 0;
  SplitBg4Scalar(in, n, lane, done);
  size_t groups = n / 4;
  for (size_t j = groups * 4; j < n; ++j) lane[j % 4][groups] = in[j];
}

void JoinBg4(const uint8_t* in, size_t n, uint8_t* out) {
  size_t ls[4];
  LaneStarts(n, ls);
  const uint8_t* const lane[4] = {in, in + ls[0], in + ls[0] + ls[1], in + ls[0] + ls[1] + ls[2]};
  size_t done = HaveSsse3() ? JoinBg4Ssse3(lane, n, out) : 0;
  size_t groups = n / 4;
  for (size_t i = done; i < groups; ++i) {
    out[4 * i] = lane[0][i];
    out[4 * i + 1] = lane[1][i];
    out[4 * i + 2] = lane[2][i];
    out[4 * i + 3] = lane[3][i];
  }
  for (size_t j = groups * 4; j < n; ++j) out[j] = lane[j % 4][groups];
}

// log2(c / total) for every count c <= total, for the two totals a full
// sample gives (one lane, all four lanes). Each entry is the very expression
// Entropy evaluates otherwise, so the result is bit-identical (the scheme
// choice, hence the xorb bytes, must not change); it saves 1280 log2 calls
// per chunk (~3% of an upload's CPU, perf).
struct Log2Table {
  explicit Log2Table(uint32_t t) : total(t), values(t + 1) {
    for (uint32_t c = 1; c <= t; ++c) values[c] = std::log2(static_cast<double>(c) / t);
  }
  uint32_t total;
  std::vector<double> values;
};

const std::vector<double>* Log2Of(uint32_t total) {
  static const Log2Table lane(kSampleBytes / 4), all(kSampleBytes);
  if (total == lane.total) return &lane.values;
  if (total == all.total) return &all.values;
  return nullptr;
}

double Entropy(const uint32_t* counts, uint32_t total) {
  if (total == 0) return 0;
  double h = 0;
  if (const std::vector<double>* table = Log2Of(total)) {
    for (int b = 0; b < 256; ++b) {
      if (counts[b] == 0) continue;
      double p = static_cast<double>(counts[b]) / total;
      h -= p * (*table)[counts[b]];
    }
    return h;
  }
  for (int b = 0; b < 256; ++b) {
    if (counts[b] == 0) continue;
    double p = static_cast<double>(counts[b]) / total;
    h -= p * std::log2(p);
  }
  return h;
}

// The per-chunk choice of kAuto, from byte statistics of a sample: BG4 when
// the four byte lanes have clearly different entropy (float-like data), LZ4
// when the bytes look compressible, otherwise none.
CompressionScheme PredictScheme(const uint8_t* p, size_t n) {
  size_t m = std::min(n, kSampleBytes) & ~size_t{3};
  if (m < 64) return CompressionScheme::kLz4;
  uint32_t lane_counts[4][256] = {};
  for (size_t i = 0; i < m; i += 4) {
    lane_counts[0][p[i]]++;
    lane_counts[1][p[i + 1]]++;
    lane_counts[2][p[i + 2]]++;
    lane_counts[3][p[i + 3]]++;
  }
  uint32_t all[256];
  double lo = 9, hi = -1;
  for (int b = 0; b < 256; ++b) {
    all[b] = lane_counts[0][b] + lane_counts[1][b] + lane_counts[2][b] + lane_counts[3][b];
  }
  uint32_t per_lane = static_cast<uint32_t>(m / 4);
  for (int k = 0; k < 4; ++k) {
    double h = Entropy(lane_counts[k], per_lane);
    lo = std::min(lo, h);
    hi = std::max(hi, h);
  }
  // A lane of a 4096-byte sample can show at most 12 bits; random bytes give
  // ~7.95 bits per lane, so a spread of 1 bit is a real difference.
  if (hi - lo > 1.0) return CompressionScheme::kByteGrouping4Lz4;
  if (Entropy(all, static_cast<uint32_t>(m)) < 7.5) return CompressionScheme::kLz4;
  return CompressionScheme::kNone;
}

struct Scratch {
  std::vector<uint8_t> split;
  std::vector<uint8_t> compressed;
  LZ4F_dctx* dctx = nullptr;
  ~Scratch() {
    if (dctx) LZ4F_freeDecompressionContext(dctx);
  }
};
thread_local Scratch tls_scratch;

// Compresses into tls_scratch.compressed; returns the compressed size or 0
// when it failed or is not smaller than n.
size_t Lz4Compress(const uint8_t* src, size_t n) {
  LZ4F_preferences_t prefs;
  std::memset(&prefs, 0, sizeof(prefs));
  prefs.frameInfo.blockSizeID = LZ4F_max256KB;
  size_t bound = LZ4F_compressFrameBound(n, &prefs);
  if (tls_scratch.compressed.size() < bound) tls_scratch.compressed.resize(bound);
  size_t r = LZ4F_compressFrame(tls_scratch.compressed.data(), bound, src, n, &prefs);
  if (LZ4F_isError(r) || r >= n) return 0;
  return r;
}

// kAuto's early bail-out: a chunk longer than two samples is compressed
// only when its first kSampleBytes, transformed and LZ4-compressed the same
// way, shrink by at least 1/kMinSavingDivisor (~3%). Trained float weights
// pass the lane test but BG4+LZ4 saves only ~1% on them; trying the whole
// chunk would cost more than everything else of an upload. Compression never
// changes a hash (xorb hashes cover uncompressed chunks), so dedup is unaffected.
constexpr size_t kMinSavingDivisor = 32;

bool SampleCompresses(const uint8_t* p, CompressionScheme scheme) {
  const size_t m = kSampleBytes;
  const uint8_t* src = p;
  if (scheme == CompressionScheme::kByteGrouping4Lz4) {
    if (tls_scratch.split.size() < m) tls_scratch.split.resize(m);
    SplitBg4(p, m, tls_scratch.split.data());
    src = tls_scratch.split.data();
  }
  size_t clen = Lz4Compress(src, m);
  return clen != 0 && clen <= m - m / kMinSavingDivisor;
}

std::string At(size_t offset) { return "chunk record at offset " + std::to_string(offset); }

// Decompresses an LZ4 frame into exactly dst_len bytes.
Status Lz4Decompress(const uint8_t* src, size_t src_len, uint8_t* dst, size_t dst_len,
                     size_t offset) {
  if (!tls_scratch.dctx) {
    if (LZ4F_isError(LZ4F_createDecompressionContext(&tls_scratch.dctx, LZ4F_VERSION))) {
      tls_scratch.dctx = nullptr;
      return InternalError("cannot create an LZ4 decompression context");
    }
  }
  LZ4F_dctx* dctx = tls_scratch.dctx;
  LZ4F_resetDecompressionContext(dctx);
  size_t src_pos = 0, dst_pos = 0;
  while (true) {
    size_t dst_size = dst_len - dst_pos;
    size_t src_size = src_len - src_pos;
    size_t r = LZ4F_decompress(dctx, dst + dst_pos, &dst_size, src + src_pos, &src_size, nullptr);
    if (LZ4F_isError(r)) {
      return DataLossError(At(offset) + ": bad LZ4 frame: " + LZ4F_getErrorName(r));
    }
    src_pos += src_size;
    dst_pos += dst_size;
    if (r == 0) break;  // frame complete
    if (src_size == 0 && dst_size == 0) {
      return DataLossError(At(offset) + ": LZ4 frame is truncated or decodes to more than " +
                           std::to_string(dst_len) + " bytes");
    }
  }
  if (src_pos != src_len) {
    return DataLossError(At(offset) + ": " + std::to_string(src_len - src_pos) +
                         " bytes after the end of the LZ4 frame");
  }
  if (dst_pos != dst_len) {
    return DataLossError(At(offset) + ": LZ4 frame decodes to " + std::to_string(dst_pos) +
                         " bytes, header says " + std::to_string(dst_len));
  }
  return Status::OK();
}

}  // namespace

const char* CompressionSchemeName(CompressionScheme scheme) {
  switch (scheme) {
    case CompressionScheme::kNone:
      return "none";
    case CompressionScheme::kLz4:
      return "lz4";
    case CompressionScheme::kByteGrouping4Lz4:
      return "bg4-lz4";
  }
  return "unknown";
}

size_t EncodeChunkRecord(std::span<const std::byte> chunk, CompressionPolicy policy, std::byte* out,
                         CompressionScheme* scheme_out) {
  const uint8_t* p = internal::U8(chunk.data());
  const size_t n = chunk.size();
  CompressionScheme scheme = CompressionScheme::kNone;
  switch (policy) {
    case CompressionPolicy::kNone:
      break;
    case CompressionPolicy::kAuto:
      scheme = PredictScheme(p, n);
      if (scheme != CompressionScheme::kNone && n >= 2 * kSampleBytes &&
          !SampleCompresses(p, scheme)) {
        scheme = CompressionScheme::kNone;
      }
      break;
    case CompressionPolicy::kLz4:
      scheme = CompressionScheme::kLz4;
      break;
    case CompressionPolicy::kBg4Lz4:
      scheme = CompressionScheme::kByteGrouping4Lz4;
      break;
  }
  size_t clen = 0;
  if (scheme == CompressionScheme::kLz4) {
    clen = Lz4Compress(p, n);
  } else if (scheme == CompressionScheme::kByteGrouping4Lz4) {
    if (tls_scratch.split.size() < n) tls_scratch.split.resize(n);
    SplitBg4(p, n, tls_scratch.split.data());
    clen = Lz4Compress(tls_scratch.split.data(), n);
  }
  if (clen == 0) scheme = CompressionScheme::kNone;
  uint8_t* h = reinterpret_cast<uint8_t*>(out);
  h[0] = 0;
  h[4] = static_cast<uint8_t>(scheme);
  StoreLE24(h + 5, static_cast<uint32_t>(n));
  if (scheme == CompressionScheme::kNone) {
    StoreLE24(h + 1, static_cast<uint32_t>(n));
    std::memcpy(out + kChunkRecordHeaderSize, p, n);
    clen = n;
  } else {
    StoreLE24(h + 1, static_cast<uint32_t>(clen));
    std::memcpy(out + kChunkRecordHeaderSize, tls_scratch.compressed.data(), clen);
  }
  if (scheme_out) *scheme_out = scheme;
  return kChunkRecordHeaderSize + clen;
}

CompressionScheme AppendChunkRecord(std::span<const std::byte> chunk, CompressionPolicy policy,
                                    std::string* out) {
  size_t old = out->size();
  out->resize(old + chunk.size() + kChunkRecordHeaderSize);
  CompressionScheme scheme;
  size_t n =
      EncodeChunkRecord(chunk, policy, reinterpret_cast<std::byte*>(out->data() + old), &scheme);
  out->resize(old + n);
  return scheme;
}

Result<ChunkRecordHeader> ParseChunkRecordHeader(std::span<const std::byte> buf, size_t offset) {
  if (offset > buf.size() || buf.size() - offset < kChunkRecordHeaderSize) {
    return DataLossError(At(offset) + ": truncated header (" +
                         std::to_string(offset > buf.size() ? 0 : buf.size() - offset) +
                         " bytes left, need 8)");
  }
  const uint8_t* h = internal::U8(buf.data() + offset);
  ChunkRecordHeader header;
  header.version = h[0];
  header.compressed_len = LoadLE24(h + 1);
  header.uncompressed_len = LoadLE24(h + 5);
  if (header.version != 0) {
    return DataLossError(At(offset) + ": unknown version " + std::to_string(header.version));
  }
  if (h[4] > 2)
    return DataLossError(At(offset) + ": unknown compression scheme " + std::to_string(h[4]));
  header.scheme = static_cast<CompressionScheme>(h[4]);
  if (header.compressed_len > buf.size() - offset - kChunkRecordHeaderSize) {
    return DataLossError(At(offset) + ": compressed length " +
                         std::to_string(header.compressed_len) + " passes the end of the data (" +
                         std::to_string(buf.size() - offset - kChunkRecordHeaderSize) +
                         " bytes left)");
  }
  // LZ4 cannot expand a byte into more than 255 (a match length costs at least
  // one byte per 255): refuse headers promising more before allocating for them.
  if (header.scheme != CompressionScheme::kNone &&
      uint64_t{header.uncompressed_len} > 256 * uint64_t{header.compressed_len} + 64) {
    return DataLossError(At(offset) + ": uncompressed length " +
                         std::to_string(header.uncompressed_len) + " is impossible for " +
                         std::to_string(header.compressed_len) + " LZ4 bytes");
  }
  if (header.scheme == CompressionScheme::kNone &&
      header.compressed_len != header.uncompressed_len) {
    return DataLossError(At(offset) + ": uncompressed record with lengths " +
                         std::to_string(header.compressed_len) +
                         " != " + std::to_string(header.uncompressed_len));
  }
  return header;
}

Result<size_t> DecodeChunkRecordTo(std::span<const std::byte> buf, size_t offset,
                                   std::span<std::byte> out) {
  MEGA_ASSIGN_OR_RETURN(ChunkRecordHeader h, ParseChunkRecordHeader(buf, offset));
  if (out.size() != h.uncompressed_len) {
    return DataLossError(At(offset) + ": holds " + std::to_string(h.uncompressed_len) +
                         " bytes, expected " + std::to_string(out.size()));
  }
  const uint8_t* payload = internal::U8(buf.data() + offset + kChunkRecordHeaderSize);
  uint8_t* dst = reinterpret_cast<uint8_t*>(out.data());
  switch (h.scheme) {
    case CompressionScheme::kNone:
      std::memcpy(dst, payload, h.uncompressed_len);
      break;
    case CompressionScheme::kLz4:
      MEGA_RETURN_IF_ERROR(
          Lz4Decompress(payload, h.compressed_len, dst, h.uncompressed_len, offset));
      break;
    case CompressionScheme::kByteGrouping4Lz4: {
      std::vector<uint8_t>& tmp = tls_scratch.split;
      if (tmp.size() < h.uncompressed_len) tmp.resize(h.uncompressed_len);
      MEGA_RETURN_IF_ERROR(
          Lz4Decompress(payload, h.compressed_len, tmp.data(), h.uncompressed_len, offset));
      JoinBg4(tmp.data(), h.uncompressed_len, dst);
      break;
    }
  }
  return offset + kChunkRecordHeaderSize + h.compressed_len;
}

Result<size_t> DecodeChunkRecord(std::span<const std::byte> buf, size_t offset, std::string* out) {
  MEGA_ASSIGN_OR_RETURN(ChunkRecordHeader h, ParseChunkRecordHeader(buf, offset));
  size_t old = out->size();
  out->resize(old + h.uncompressed_len);
  Result<size_t> next = DecodeChunkRecordTo(
      buf, offset, std::as_writable_bytes(std::span(out->data() + old, h.uncompressed_len)));
  if (!next.ok()) out->resize(old);
  return next;
}

Result<XorbLayout> VerifyXorb(std::span<const std::byte> serialized) {
  if (serialized.size() > kMaxSerializedXorbBytes) {
    return DataLossError("xorb: " + std::to_string(serialized.size()) +
                         " bytes exceeds the xorb limit of " +
                         std::to_string(kMaxSerializedXorbBytes));
  }
  thread_local std::vector<std::byte> scratch;
  XorbLayout layout;
  layout.serialized_bytes = static_cast<uint32_t>(serialized.size());
  std::vector<HashAndSize> leaves;
  size_t offset = 0;
  while (offset < serialized.size()) {
    const size_t i = layout.chunks.size();
    if (i >= kMaxXorbChunks) {
      return DataLossError("xorb: more than " + std::to_string(kMaxXorbChunks) + " chunks");
    }
    auto where = [i] { return "xorb chunk " + std::to_string(i); };
    auto header = ParseChunkRecordHeader(serialized, offset);
    if (!header.ok()) return header.status().WithContext(where());
    scratch.resize(header->uncompressed_len);
    std::span<std::byte> chunk(scratch.data(), scratch.size());
    Result<size_t> next = DecodeChunkRecordTo(serialized, offset, chunk);
    if (!next.ok()) return next.status().WithContext(where());
    const MerkleHash h = ChunkHash(chunk);
    layout.chunks.push_back(
        {h, static_cast<uint32_t>(offset), static_cast<uint32_t>(chunk.size())});
    leaves.push_back({h, chunk.size()});
    offset = *next;
  }
  if (scratch.capacity() > (1u << 20)) std::vector<std::byte>().swap(scratch);  // hostile sizes
  layout.xorb_hash = XorbHash(leaves);
  return layout;
}

Result<DecodedXorb> DecodeXorb(std::span<const std::byte> serialized, const XorbLayout* expected) {
  const std::string name = expected ? "xorb " + expected->xorb_hash.ToHex() : std::string("xorb");
  if (serialized.size() > kMaxSerializedXorbBytes) {
    return DataLossError(name + ": " + std::to_string(serialized.size()) +
                         " bytes exceeds the xorb limit of " +
                         std::to_string(kMaxSerializedXorbBytes));
  }
  if (expected && expected->serialized_bytes != serialized.size()) {
    return DataLossError(name + ": " + std::to_string(serialized.size()) + " bytes, layout says " +
                         std::to_string(expected->serialized_bytes));
  }
  DecodedXorb out;
  size_t offset = 0;
  while (offset < serialized.size()) {
    size_t i = out.chunks.size();
    std::string where = name + " chunk " + std::to_string(i);
    if (i >= kMaxXorbChunks) {
      return DataLossError(name + ": more than " + std::to_string(kMaxXorbChunks) + " chunks");
    }
    if (expected && (i >= expected->chunks.size() || expected->chunks[i].byte_offset != offset)) {
      return DataLossError(where + ": record at offset " + std::to_string(offset) +
                           " does not match the layout");
    }
    size_t before = out.data.size();
    Result<size_t> next = DecodeChunkRecord(serialized, offset, &out.data);
    if (!next.ok()) return next.status().WithContext(where);
    std::span<const std::byte> chunk(reinterpret_cast<const std::byte*>(out.data.data()) + before,
                                     out.data.size() - before);
    MerkleHash h = ChunkHash(chunk);
    if (expected &&
        (h != expected->chunks[i].hash || chunk.size() != expected->chunks[i].unpacked_bytes)) {
      return DataLossError(where + ": content does not match its hash (expected " +
                           expected->chunks[i].hash.ToHex() + ", got " + h.ToHex() + ")");
    }
    out.chunks.push_back({h, chunk.size()});
    out.record_offsets.push_back(static_cast<uint32_t>(offset));
    offset = *next;
  }
  if (expected && out.chunks.size() != expected->chunks.size()) {
    return DataLossError(name + ": " + std::to_string(out.chunks.size()) +
                         " chunk records, layout lists " + std::to_string(expected->chunks.size()));
  }
  return out;
}

XorbBuilder::XorbBuilder(uint32_t max_bytes, uint32_t max_chunks)
    : max_bytes_(max_bytes),
      max_chunks_(max_chunks),
      data_(std::make_unique<internal::ByteBuffer>()) {}
XorbBuilder::~XorbBuilder() {
  if (data_) internal::BufferCache::Give(std::move(*data_));
}
XorbBuilder::XorbBuilder(XorbBuilder&&) noexcept = default;
XorbBuilder& XorbBuilder::operator=(XorbBuilder&&) noexcept = default;

size_t XorbBuilder::size_bytes() const { return finished_ ? 0 : data_->size(); }

bool XorbBuilder::Fits(size_t record_size) const {
  return layout_.chunks.size() < max_chunks_ && size_bytes() + record_size <= max_bytes_;
}

uint32_t XorbBuilder::Add(const MerkleHash& chunk_hash, uint32_t unpacked_bytes,
                          std::span<const std::byte> record) {
  if (finished_) Clear();
  if (data_->capacity() == 0) {
    // First use: recycle a buffer big enough for a whole xorb when one is cached.
    *data_ = internal::BufferCache::Take(max_bytes_);
    data_->Reserve(max_bytes_);  // address space only: pages are touched as written
  }
  uint32_t index = static_cast<uint32_t>(layout_.chunks.size());
  layout_.chunks.push_back({chunk_hash, static_cast<uint32_t>(data_->size()), unpacked_bytes});
  data_->Append(record.data(), record.size());
  return index;
}

std::span<const std::byte> XorbBuilder::record(size_t i) const {
  uint32_t end = i + 1 < layout_.chunks.size() ? layout_.chunks[i + 1].byte_offset
                                               : static_cast<uint32_t>(data_->size());
  return std::span<const std::byte>(data_->data() + layout_.chunks[i].byte_offset,
                                    end - layout_.chunks[i].byte_offset);
}

XorbBuilder::Finished XorbBuilder::Finish() {
  std::vector<HashAndSize> leaves;
  leaves.reserve(layout_.chunks.size());
  for (const XorbChunk& c : layout_.chunks) leaves.push_back({c.hash, c.unpacked_bytes});
  layout_.xorb_hash = XorbHash(leaves);
  layout_.serialized_bytes = static_cast<uint32_t>(data_->size());
  Finished out{data_->span(), std::move(layout_)};
  layout_ = XorbLayout{};
  finished_ = true;  // the bytes stay in data_ until the next Add/Clear
  return out;
}

void XorbBuilder::Clear() {
  data_->Clear();
  layout_ = XorbLayout{};
  finished_ = false;
}

std::string EncodeXorbFooter(const XorbLayout& layout) {
  std::string out;
  out.reserve(layout.chunks.size() * kXorbFooterEntrySize + kXorbFooterTrailerSize);
  for (const XorbChunk& c : layout.chunks) {
    out.append(reinterpret_cast<const char*>(c.hash.bytes.data()), 32);
    AppendLE32(&out, c.byte_offset);
    AppendLE32(&out, c.unpacked_bytes);
  }
  uint32_t crc = Crc32(AsBytes(out));
  AppendLE32(&out, static_cast<uint32_t>(layout.chunks.size()));
  AppendLE32(&out, layout.serialized_bytes);
  AppendLE32(&out, crc);
  AppendLE32(&out, kFooterVersion);
  out.append(kFooterMagic, 8);
  return out;
}

Result<std::pair<uint32_t, uint32_t>> ParseXorbFooterTrailer(std::span<const std::byte> trailer) {
  if (trailer.size() != kXorbFooterTrailerSize) {
    return DataLossError("xorb footer trailer: " + std::to_string(trailer.size()) +
                         " bytes, expected " + std::to_string(kXorbFooterTrailerSize));
  }
  const uint8_t* t = internal::U8(trailer.data());
  if (std::memcmp(t + 16, kFooterMagic, 8) != 0) {
    return DataLossError("xorb footer: bad magic (not a stored xorb)");
  }
  if (LoadLE32(t + 12) != kFooterVersion) {
    return DataLossError("xorb footer: unknown version " + std::to_string(LoadLE32(t + 12)));
  }
  uint32_t n = LoadLE32(t), bytes = LoadLE32(t + 4);
  if (n == 0 || n > kMaxXorbChunks || bytes > kMaxSerializedXorbBytes) {
    return DataLossError("xorb footer: " + std::to_string(n) + " chunks / " +
                         std::to_string(bytes) + " bytes is outside the xorb limits");
  }
  return std::make_pair(n, bytes);
}

Result<XorbLayout> ParseXorbFooter(std::span<const std::byte> footer, const MerkleHash& xorb_hash) {
  const std::string name = "xorb " + xorb_hash.ToHex();
  if (footer.size() < kXorbFooterTrailerSize) {
    return DataLossError(name + ": footer of " + std::to_string(footer.size()) +
                         " bytes is truncated");
  }
  auto trailer = ParseXorbFooterTrailer(footer.last(kXorbFooterTrailerSize));
  if (!trailer.ok()) return trailer.status().WithContext(name);
  auto [n, bytes] = *trailer;
  size_t table = size_t{n} * kXorbFooterEntrySize;
  if (footer.size() != table + kXorbFooterTrailerSize) {
    return DataLossError(name + ": footer is " + std::to_string(footer.size()) + " bytes, " +
                         std::to_string(n) + " chunks need " +
                         std::to_string(table + kXorbFooterTrailerSize));
  }
  const uint8_t* p = internal::U8(footer.data());
  uint32_t crc = LoadLE32(p + table + 8);
  if (Crc32(footer.first(table)) != crc) {
    return DataLossError(name + ": footer chunk table fails its CRC-32");
  }
  XorbLayout layout;
  layout.xorb_hash = xorb_hash;
  layout.serialized_bytes = bytes;
  layout.chunks.resize(n);
  for (uint32_t i = 0; i < n; ++i) {
    const uint8_t* e = p + size_t{i} * kXorbFooterEntrySize;
    std::memcpy(layout.chunks[i].hash.bytes.data(), e, 32);
    layout.chunks[i].byte_offset = LoadLE32(e + 32);
    layout.chunks[i].unpacked_bytes = LoadLE32(e + 36);
  }
  MEGA_RETURN_IF_ERROR(layout.Validate());
  return layout;
}

}  // namespace megackpt::cas
