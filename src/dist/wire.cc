#include "dist/wire.h"

#include <cstring>
#include <string_view>

#include "megackpt/core/endian.h"

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

std::string EncodeStatus(const Status& status) {
  std::string out;
  out.reserve(kStatusBlobHeaderBytes + status.message().size());
  out.push_back(static_cast<char>(kStatusBlobVersion));
  out.push_back(0);
  AppendLE16(&out, static_cast<uint16_t>(status.code()));
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
  const uint16_t code = LoadLE16(blob.data() + 2);
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
  AppendLE64(&out, blobs.size());
  for (const std::string& b : blobs) AppendLE64(&out, b.size());
  for (const std::string& b : blobs) out += b;
  return out;
}

Result<std::vector<std::string>> UnpackBlobs(std::string_view packed) {
  if (packed.size() < 8) {
    return DataLossError("blob list: " + std::to_string(packed.size()) +
                         " bytes, too short for the count");
  }
  const uint64_t count = LoadLE64(packed.data());
  // Each blob needs 8 bytes of length: bounds the count before any allocation.
  if (count > (packed.size() - 8) / 8) {
    return DataLossError("blob list: count " + std::to_string(count) + " does not fit in " +
                         std::to_string(packed.size()) + " bytes");
  }
  size_t offset = 8 + 8 * count;
  uint64_t payload = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t len = LoadLE64(packed.data() + 8 + 8 * i);
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
    const uint64_t len = LoadLE64(packed.data() + 8 + 8 * i);
    blobs.emplace_back(packed.substr(offset, len));
    offset += len;
  }
  return blobs;
}

namespace {

// "rank <digits>: ..." (what CombineRankStatuses writes).
bool NamesItsRank(std::string_view message) {
  constexpr std::string_view kRank = "rank ";
  if (!message.starts_with(kRank)) return false;
  size_t i = kRank.size();
  const size_t digits = i;
  while (i < message.size() && message[i] >= '0' && message[i] <= '9') ++i;
  return i > digits && message.substr(i).starts_with(": ");
}

}  // namespace

Status CombineRankStatuses(const std::vector<Status>& statuses) {
  for (size_t r = 0; r < statuses.size(); ++r) {
    if (statuses[r].ok()) continue;
    if (NamesItsRank(statuses[r].message())) return statuses[r];
    return statuses[r].WithContext("rank " + std::to_string(r));
  }
  return Status::OK();
}

}  // namespace megackpt::dist
