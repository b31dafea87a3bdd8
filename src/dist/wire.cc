#include "dist/wire.h"

#include <cstring>

namespace megackpt::dist {

std::string CollectiveKindName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kBarrier:
      return "Barrier";
    case CollectiveKind::kGather:
      return "Gather";
    case CollectiveKind::kScatter:
      return "Scatter";
    case CollectiveKind::kBroadcast:
      return "Broadcast";
    case CollectiveKind::kAllGather:
      return "AllGather";
  }
  return "Unknown(" + std::to_string(static_cast<int>(kind)) + ")";
}

void PutU16(std::string* out, uint16_t v) {
  for (int i = 0; i < 2; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint16_t GetU16(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint16_t>(u[0] | (u[1] << 8));
}
uint32_t GetU32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | u[i];
  return v;
}
uint64_t GetU64(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | u[i];
  return v;
}

std::string EncodeStatus(const Status& status) {
  std::string out;
  out.reserve(kStatusBlobHeaderBytes + status.message().size());
  out.push_back(static_cast<char>(kStatusBlobVersion));
  out.push_back(0);
  PutU16(&out, static_cast<uint16_t>(status.code()));
  out += status.message();
  return out;
}

Status DecodeStatus(std::string_view blob, Status* status) {
  if (blob.size() < kStatusBlobHeaderBytes) {
    return DataLossError("status blob: " + std::to_string(blob.size()) +
                         " bytes, expected at least " + std::to_string(kStatusBlobHeaderBytes));
  }
  if (static_cast<uint8_t>(blob[0]) != kStatusBlobVersion) {
    return DataLossError("status blob: version " + std::to_string(static_cast<uint8_t>(blob[0])) +
                         ", expected " + std::to_string(kStatusBlobVersion));
  }
  const uint16_t code = GetU16(blob.data() + 2);
  if (code > static_cast<uint16_t>(StatusCode::kIOError)) {
    return DataLossError("status blob: unknown status code " + std::to_string(code));
  }
  std::string message(blob.substr(kStatusBlobHeaderBytes));
  if (code == 0) {
    if (!message.empty()) return DataLossError("status blob: OK status with a message");
    *status = Status::OK();
    return Status::OK();
  }
  *status = Status(static_cast<StatusCode>(code), std::move(message));
  return Status::OK();
}

std::string PackBlobs(const std::vector<std::string>& blobs) {
  size_t total = 8 + 8 * blobs.size();
  for (const std::string& b : blobs) total += b.size();
  std::string out;
  out.reserve(total);
  PutU64(&out, blobs.size());
  for (const std::string& b : blobs) PutU64(&out, b.size());
  for (const std::string& b : blobs) out += b;
  return out;
}

Result<std::vector<std::string>> UnpackBlobs(std::string_view packed) {
  if (packed.size() < 8) {
    return DataLossError("blob list: " + std::to_string(packed.size()) +
                         " bytes, too short for the count");
  }
  const uint64_t count = GetU64(packed.data());
  // Each blob needs 8 bytes of length: bounds the count before any allocation.
  if (count > (packed.size() - 8) / 8) {
    return DataLossError("blob list: count " + std::to_string(count) + " does not fit in " +
                         std::to_string(packed.size()) + " bytes");
  }
  size_t offset = 8 + 8 * count;
  uint64_t payload = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t len = GetU64(packed.data() + 8 + 8 * i);
    if (len > packed.size() - offset - payload) {
      return DataLossError("blob list: blob " + std::to_string(i) + " length " +
                           std::to_string(len) + " exceeds the remaining bytes");
    }
    payload += len;
  }
  if (offset + payload != packed.size()) {
    return DataLossError("blob list: " + std::to_string(packed.size() - offset - payload) +
                         " trailing bytes");
  }
  std::vector<std::string> blobs;
  blobs.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t len = GetU64(packed.data() + 8 + 8 * i);
    blobs.emplace_back(packed.substr(offset, len));
    offset += len;
  }
  return blobs;
}

Status CombineRankStatuses(const std::vector<Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r) {
    if (!statuses[r].ok()) return statuses[r].WithContext("rank " + std::to_string(r));
  }
  return Status::OK();
}

}  // namespace megackpt::dist
