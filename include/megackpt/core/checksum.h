// CRC-32 (zlib/gzip polynomial) and SHA-256, incremental, plus hex helpers.
#ifndef MEGACKPT_CORE_CHECKSUM_H_
#define MEGACKPT_CORE_CHECKSUM_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/status.h"

namespace megackpt::inline core {

// Standard CRC-32 as zlib's crc32(): Crc32Extend(0, data) of "123456789" is
// 0xCBF43926. Extend with more data by passing the previous value. isa-l's
// kernels, except on CPUs with 256-bit VPCLMULQDQ but no AVX-512 (AMD Zen 3,
// Intel client cores), where spans of 256 bytes and more are folded here in
// 256-bit registers, about twice as fast as isa-l's 128-bit kernel.
uint32_t Crc32Extend(uint32_t crc, std::span<const std::byte> data);
inline uint32_t Crc32(std::span<const std::byte> data) { return Crc32Extend(0, data); }

// Block CRC table: out[j] = Crc32 of bytes [j * block, min((j + 1) * block,
// size)) for every j -- the same values as one Crc32 call per block. Small
// blocks (64..512 bytes, multiples of 16: the automatic blocks of short rows)
// are folded inline, four blocks in flight, with VPCLMULQDQ (512- or 256-bit
// registers) or PCLMULQDQ when the CPU has them, without the per-call set-up
// that dominates a library call on 128 bytes; other sizes call Crc32.
// REQUIRES: block > 0; out has room for ceil(size / block) entries.
void BlockCrc32s(std::span<const std::byte> bytes, uint64_t block, uint32_t* out);

// Copies src into dst and returns Crc32Extend(crc, src), in one pass over the
// bytes: each 64-byte stretch is loaded once, stored, and folded into the CRC
// (VPCLMULQDQ: four 512-bit or eight 256-bit folds in flight). Without that
// CPU feature: memcpy and Crc32Extend in kCrcHotPiece pieces, each
// checksummed while in cache.
// The verified read of a mapped local file (RandomAccessFile::
// ReadExactlyAtWithCrc32) runs on it: the CRC costs no pass of its own.
// REQUIRES: dst.size() == src.size(); the two do not overlap.
uint32_t CopyWithCrc32(uint32_t crc, std::span<std::byte> dst, std::span<const std::byte> src);

// The largest piece a verified read checksums right after its pread: the copy
// passes source and destination through the core's L2 (2 MiB on the bench
// machine), so a piece this size is still there when its CRC runs (1 MiB
// pieces were partly evicted). The one such constant of the readers (fs and
// MEGA). A power of two >= every CRC block size the writers pick.
inline constexpr uint64_t kCrcHotPiece = 256ull << 10;

// The pwrite size of the writers (fs and MEGA) through the page cache; pieces
// end on file offsets that are multiples of it (the first piece of an item or
// tensor is shorter). Each piece is CRC'd first and pwritten second: the CRC
// pass streams the piece from memory into the core's caches, and the kernel's
// copy into the page cache then reads it from there, so the source is read
// from memory once. 2 MiB because the kernel (ext4, large folios) caches a
// file in folios of the pwrite's size: 2 MiB pwrites on 2 MiB file offsets
// give 2 MiB folios, fewer and cheaper to allocate than 256 KiB ones, and
// with sources in 4 KiB pages (torch and numpy memory) 256 KiB folios often
// made the copy two to three times slower on the bench VM. Measured there
// (AMD Zen 4, 1 MiB L2, Linux 6.18; 2 threads writing 2 GiB, 256 B CRC
// blocks, medians GB/s): 2 MiB CRC-then-pwrite 8.6-9.0 from 4 KiB pages and
// 9.2 from huge pages, against 7.3-7.5 and 7.7 for 256 KiB pwrite-then-CRC
// and 8.1-8.4 for 2 MiB pwrite-then-CRC (docs/benchmarks.md, "Write pieces
// of 2 MiB, CRC first"). Files written with direct I/O use kDirectWritePiece
// (core/file.h WritePieceFor), the same size for a reason of its own. A
// multiple of every CRC block size the writers pick.
inline constexpr uint64_t kCrcWritePiece = 2ull << 20;

// The largest pwrite of a block CRC table (fs and MEGA writers, positioned
// writes); a longer table goes out in pieces of this size. Tables of 256 B
// blocks are 1/64 of their tensor (2 MiB for 128 MiB), and on the bench VM
// (AMD Zen 4, Linux 6.18, ext4) writing each in one pwrite cost a 2 GiB
// no-sync fs save 50-70 ms more kernel time (sys 0.46-0.49 s per save
// against 0.40 with the tables in 256 KiB pieces or not written at all, and
// 0.40-0.42 with 4 KiB blocks, whose tables are 128 KiB), about 0.1 of the
// page-cache write ceiling. Why the single large pwrite of a table is that
// slow is not known (docs/benchmarks.md, "Block tables in 256 KiB pwrites").
inline constexpr uint64_t kTableWritePiece = 256ull << 10;

// Hands `table` to write(offset_in_table, piece) in order, in pieces of at
// most kTableWritePiece bytes (the one place the fs and MEGA writers split a
// block CRC table for positioned writes); returns the first error.
// WriteFn: Status(uint64_t, std::span<const std::byte>).
template <typename WriteFn>
Status ForEachTableWritePiece(std::span<const std::byte> table, WriteFn&& write) {
  for (uint64_t o = 0; o < table.size(); o += kTableWritePiece) {
    const uint64_t left = table.size() - o;
    MEGA_RETURN_IF_ERROR(
        write(o, table.subspan(o, left < kTableWritePiece ? left : kTableWritePiece)));
  }
  return Status::OK();
}

// The length of the next write piece at file offset `at` with `left` bytes to
// go: up to the next multiple of `piece`, rounded down to a multiple of 64
// bytes (whole elements of every dtype) when that leaves anything, so a piece
// never splits an element.
// REQUIRES: piece is a multiple of 64.
inline uint64_t NextWritePiece(uint64_t at, uint64_t left, uint64_t piece = kCrcWritePiece) {
  uint64_t n = piece - at % piece;
  if (n != piece && n >= 64) n = n / 64 * 64;
  return n < left ? n : left;
}

// The CRC block size the writers (fs and MEGA) pick for a tensor whose
// innermost dimension (its row) is `row_bytes` long (0-D/1-D: the whole
// tensor): the power of two at or below row / 16, clamped to [64, max_block].
// A verified read widens each run to whole blocks, so a column slice of 1/k of
// a row reads about k/16 more than it needs (the resharded-read budget of
// docs/dcp.md, "Verified reads"). The price is CRC work per block at save
// time, where the bytes mostly come from memory: on the bench VM (one core,
// Zen 4 with AVX-512) BlockCrc32s runs at ~37 GB/s on 256 B blocks in cache
// (~20 from memory), against ~40 (~24) on 1 KiB and up, and ~20 on 64 B
// blocks; on a Zen 3 VM (256-bit VPCLMULQDQ) at ~11 (~10) on 64 B, ~15-17
// (~11-12) on 128-512 B and ~18-22 (~16-18) on 1 KiB and up.
// REQUIRES: max_block is a power of two >= 64.
uint64_t AutoCrcBlockSize(uint64_t row_bytes, uint64_t max_block);

// A block CRC table as the writers store it (u32 little-endian per block):
// converts `crcs` in place (nothing to do on a little-endian host) and returns
// its bytes, without a copy. Afterwards the entries are stored values, no
// longer native integers on a big-endian host.
std::span<const std::byte> EncodeBlockTableInPlace(std::vector<uint32_t>& crcs);

// Checks `bytes` against its block CRC table: expected[j] is the CRC of block
// j (bytes [j * block, (j + 1) * block), the last possibly short), as
// BlockCrc32s computes. Returns the first block whose CRC differs, with the
// CRC computed for it in *got; nullopt when every block matches. Runs one
// streamed CRC over the span and compares it with the table combined (four
// independent chains of Crc32Shift lookups), about twice as fast as a CRC per
// small block; the per-block CRCs run only when the two disagree. A damaged
// span passes only when its errors cancel in the 32-bit combination (the
// strength of one CRC-32 over the span).
// `span_crc`, when given, is Crc32(bytes) computed by the caller (e.g. while
// it also feeds a whole-tensor checksum): the span is then not read again
// unless a block must be named.
// REQUIRES: block > 0; expected.size() == ceil(bytes.size() / block).
std::optional<size_t> FindBadBlock(std::span<const std::byte> bytes, uint64_t block,
                                   std::span<const uint32_t> expected, uint32_t* got,
                                   std::optional<uint32_t> span_crc = std::nullopt);

// CRC-32 of A||B from crc(A), crc(B) and len(B) (zlib crc32_combine semantics).
uint32_t Crc32Combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

// Crc32Combine for one fixed len(B), precomputed: Append(crc(A), crc(B)) =
// crc(A||B) for every B of `len_b` bytes, in a few table lookups (cheap enough
// to combine a CRC per 256-byte block). Copyable; immutable after construction.
class Crc32Shift {
 public:
  explicit Crc32Shift(uint64_t len_b);
  uint64_t len() const { return len_; }
  uint32_t Append(uint32_t crc_a, uint32_t crc_b) const {
    return table_[0][crc_a & 0xFF] ^ table_[1][(crc_a >> 8) & 0xFF] ^
           table_[2][(crc_a >> 16) & 0xFF] ^ table_[3][crc_a >> 24] ^ crc_b;
  }

 private:
  uint64_t len_;
  uint32_t table_[4][256];
};

// The block CRC table of a byte stream handed over in pieces of any size
// (pieces may cross block boundaries): blocks()[j] = Crc32 of bytes
// [j * block, (j + 1) * block), the last block possibly short, as
// BlockCrc32s gives; and whole() = Crc32 of the entire stream, combined from the
// block CRCs (a few table lookups per block) rather than computed in a second
// pass. block == 0: no table, whole() streamed. The one block-CRC builder of
// the writers (fs .distcp items and MEGA shards). The writers feed each piece
// right before its pwrite, whose copy then reads it from cache (kCrcWritePiece).
class BlockCrc32Stream {
 public:
  // `expected_bytes` only reserves the table.
  explicit BlockCrc32Stream(uint64_t block, uint64_t expected_bytes = 0);
  void Add(std::span<const std::byte> data);
  // Closes the short last block. REQUIRES: called once, after the last Add;
  // whole() and blocks() are valid only after it.
  void Finish();
  uint64_t block() const { return block_; }
  uint32_t whole() const { return whole_; }
  std::vector<uint32_t>& blocks() { return blocks_; }

 private:
  void CloseBlock();
  uint64_t block_;
  std::shared_ptr<const Crc32Shift> shift_;  // Append for one whole block
  uint32_t cur_ = 0;                         // CRC of the open block's bytes
  uint64_t in_block_ = 0;                    // bytes in the open block
  uint32_t whole_ = 0;
  std::vector<uint32_t> blocks_;
};

using Sha256Digest = std::array<uint8_t, 32>;

// Incremental SHA-256 (OpenSSL, SHA-NI when the CPU has it).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  void Update(std::span<const std::byte> data);
  // Returns the digest; the object may not be updated afterwards.
  Sha256Digest Finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

Sha256Digest Sha256Of(std::span<const std::byte> data);

// Lowercase hex of bytes.
std::string ToHex(std::span<const uint8_t> bytes);

// `n_bytes` random bytes from the OS-seeded CSPRNG (OpenSSL RAND_bytes) as
// 2 * n_bytes lowercase hex digits: the one maker of ids, tokens, secrets and
// temp-file suffixes. Thread-safe.
std::string RandomHex(size_t n_bytes);
// Parses lowercase or uppercase hex into exactly out.size() bytes.
Status FromHex(std::string_view hex, std::span<uint8_t> out);

// Views helpers.
inline std::span<const std::byte> AsBytes(std::string_view s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

}  // namespace megackpt::inline core

#endif  // MEGACKPT_CORE_CHECKSUM_H_
