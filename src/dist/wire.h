// Byte encodings shared by the process-group backends (docs/dist.md, "Wire formats").
//
// Status blob (AllReduceStatus):
//   offset 0  u8   version = 1
//   offset 1  u8   pad = 0
//   offset 2  u16  code (StatusCode value, little endian)
//   offset 4  ...  message bytes (UTF-8, no terminator; empty for OK)
//
// Blob list (AllGather over MPI, packed once on rank 0 and broadcast):
//   u64 count, then count x u64 length, then the blobs back to back (little endian).
#ifndef MEGACKPT_DIST_WIRE_H_
#define MEGACKPT_DIST_WIRE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/status.h"

namespace megackpt::dist {

// The collectives, tagged on every exchange so that ranks calling different
// collectives at the same position in their sequence are detected.
enum class CollectiveKind : uint8_t {
  kBarrier = 1,
  kGather = 2,
  kScatter = 3,
  kBroadcast = 4,
  kAllGather = 5,
};

// "Barrier", "Gather", ...; "Unknown(<n>)" for values outside the enum.
std::string CollectiveKindName(CollectiveKind kind);

inline constexpr uint8_t kStatusBlobVersion = 1;
inline constexpr size_t kStatusBlobHeaderBytes = 4;

std::string EncodeStatus(const Status& status);
// Sets *status to the decoded status. Returns DataLoss (and leaves *status alone)
// when `blob` is truncated, has an unknown version or an unknown code.
Status DecodeStatus(std::string_view blob, Status* status);

std::string PackBlobs(const std::vector<std::string>& blobs);
// DataLoss when the lengths do not add up to the buffer size exactly.
Result<std::vector<std::string>> UnpackBlobs(std::string_view packed);

// The combined result AllReduceStatus returns given every rank's status:
// OK when all are OK, else the lowest failing rank's status with its message
// prefixed "rank R: ". A message that already starts with "rank N: " (a
// status an earlier AllReduceStatus combined, passed on) is kept as it is: it
// names the rank that failed, and a second prefix would name one that did not.
Status CombineRankStatuses(const std::vector<Status>& statuses);

}  // namespace megackpt::dist

#endif  // MEGACKPT_DIST_WIRE_H_
