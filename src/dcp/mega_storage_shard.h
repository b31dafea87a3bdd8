// Internals of the MEGA storage backend shared by the writer, the reader and
// consolidation: the shard encoder options (the encoder is format::MegaEncoder),
// the `tensorplay.dcp.*` shard entries codec and the shard file naming rules
// (docs/mega-storage.md).
#ifndef MEGACKPT_SRC_DCP_MEGA_STORAGE_SHARD_H_
#define MEGACKPT_SRC_DCP_MEGA_STORAGE_SHARD_H_

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/file.h"
#include "megackpt/core/status.h"
#include "megackpt/core/tensor.h"
#include "megackpt/dcp/metadata.h"
#include "megackpt/format/mega.h"
#include "megackpt/format/mega_encoder.h"

namespace megackpt::dcp::mega_storage {

// ---- shard encoding ------------------------------------------------------------

// The encoder options of every shard this backend writes (docs/mega-storage.md
// §1): TensorPlay profile, alignment 4096, each payload aligned to
// `tensor_alignment`, `checksum` per tensor, block CRC-32s of every tensor and
// the header CRC (format/mega_encoder.h), so every partial read is verified.
format::MegaEncoderOptions ShardEncoderOptions(uint64_t tensor_alignment,
                                               format::MegaChecksumType checksum);

// ---- shard entries (tensorplay.dcp.entries) ------------------------------------

struct ShardEntry {
  bool is_bytes = false;
  DType dtype = DType::kU8;  // tensor dtype (bytes: U8)
  Shape global_shape;        // tensors
  Shape offsets;             // chunk offsets in the global tensor
};

// JSON {fqn: {"kind", "dtype", "global_shape", "offsets"}} (keys sorted).
std::string EncodeShardEntries(const std::map<std::string, ShardEntry>& entries);
// DataLoss naming `file` for malformed JSON or values.
Result<std::map<std::string, ShardEntry>> DecodeShardEntries(std::string_view file,
                                                             std::string_view json);

std::string EncodeObjectPaths(const std::map<std::string, ObjectPath>& paths);
Result<std::map<std::string, ObjectPath>> DecodeObjectPaths(std::string_view file,
                                                            std::string_view json);

// ---- naming ---------------------------------------------------------------------

// "model.mega" when count == 1, else "model-NNNNN-of-MMMMM.mega"; with a
// non-empty save id "model-<id>.mega" / "model-<id>-NNNNN-of-MMMMM.mega"; with
// rank_tag >= 0 (saves without collectives) "model-rank<r>-..." always with id.
// `ext` is ".mega" or ".safetensors".
std::string ShardFileName(std::string_view ext, size_t number, size_t count,
                          std::string_view save_id, int rank_tag = -1);
// True for names ShardFileName can produce (any id, counts, ext); *rank_tag = r
// for rank-tagged names, else -1.
bool IsShardFileName(std::string_view name, int* rank_tag = nullptr);

// 12 random lowercase hex digits.
std::string NewSaveId();

// "crc32:%08x".
std::string CrcString(uint32_t crc);
// "crc32:..." / "sha256:..." / "" for a tensor of a MEGA file.
std::string MegaChecksumString(const format::MegaTensorInfo& t);

// 'name' with non-printable bytes escaped (core::Quote; for messages).
std::string Quote(std::string_view s);

}  // namespace megackpt::dcp::mega_storage

#endif  // MEGACKPT_SRC_DCP_MEGA_STORAGE_SHARD_H_
