#include "megackpt/cas/reconstruction.h"

#include "megackpt/cas/xorb.h"

namespace megackpt::cas {

Status FileReconstruction::Validate() const {
  const std::string name = "file " + file_hash.ToHex();
  uint64_t total = 0;
  for (size_t i = 0; i < terms.size(); ++i) {
    const ReconstructionTerm& t = terms[i];
    if (t.chunk_end <= t.chunk_start) {
      return InvalidArgumentError(name + ": term " + std::to_string(i) +
                                  " has empty chunk range [" + std::to_string(t.chunk_start) +
                                  ", " + std::to_string(t.chunk_end) + ")");
    }
    if (t.unpacked_bytes == 0) {
      return InvalidArgumentError(name + ": term " + std::to_string(i) + " has 0 bytes");
    }
    total += t.unpacked_bytes;
    if (total < t.unpacked_bytes) return InvalidArgumentError(name + ": size overflows");
  }
  if (total != size) {
    return InvalidArgumentError(name + ": terms hold " + std::to_string(total) +
                                " bytes but the file size is " + std::to_string(size));
  }
  return Status::OK();
}

Status XorbLayout::Validate() const {
  const std::string name = "xorb " + xorb_hash.ToHex();
  if (chunks.empty()) return DataLossError(name + ": layout lists no chunks");
  if (chunks.size() > kMaxXorbChunks) {
    return DataLossError(name + ": layout lists " + std::to_string(chunks.size()) +
                         " chunks (max " + std::to_string(kMaxXorbChunks) + ")");
  }
  if (chunks[0].byte_offset != 0) return DataLossError(name + ": first record is not at offset 0");
  std::vector<HashAndSize> leaves;
  leaves.reserve(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    uint64_t end = RecordEnd(i);
    if (end < uint64_t{chunks[i].byte_offset} + kChunkRecordHeaderSize || end > serialized_bytes) {
      return DataLossError(name + " chunk " + std::to_string(i) + ": record [" +
                           std::to_string(chunks[i].byte_offset) + ", " + std::to_string(end) +
                           ") is not a valid record range within " +
                           std::to_string(serialized_bytes) + " bytes");
    }
    if (chunks[i].unpacked_bytes == 0 || chunks[i].unpacked_bytes > kMaxRecordLength) {
      return DataLossError(name + " chunk " + std::to_string(i) + ": bad unpacked size " +
                           std::to_string(chunks[i].unpacked_bytes));
    }
    leaves.push_back({chunks[i].hash, chunks[i].unpacked_bytes});
  }
  if (XorbHash(leaves) != xorb_hash) {
    return DataLossError(name + ": chunk list does not hash to the xorb's name (got " +
                         XorbHash(leaves).ToHex() + ")");
  }
  return Status::OK();
}

}  // namespace megackpt::cas
