// Small helpers shared by the hub's store, server and client.
#ifndef MEGACKPT_HUB_UTIL_H_
#define MEGACKPT_HUB_UTIL_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "megackpt/core/checksum.h"  // RandomHex, ToHex
#include "megackpt/core/status.h"
#include "megackpt/core/text.h"  // ToLower, IsHex

namespace megackpt::hub {

// Lowercase hex SHA-256 of `data`.
std::string Sha256Hex(std::string_view data);
// HMAC-SHA256(key, data) as lowercase hex.
std::string HmacSha256Hex(std::string_view key, std::string_view data);
// Constant-time comparison of equal-length strings (false when lengths differ).
bool ConstantTimeEquals(std::string_view a, std::string_view b);

inline bool IsCommitId(std::string_view s) { return IsLowerHex(s, 40); }
inline bool IsSha256Hex(std::string_view s) { return IsLowerHex(s, 64); }
// A Xet hash in text form (64 hex digits, either case).
inline bool IsXetHashText(std::string_view s) { return IsHex(s, 64); }

// Parses FormatTimestamp's form ("2026-11-29T17:42:46.635Z", fraction
// optional) into Unix milliseconds; 0 when malformed.
int64_t ParseTimestamp(std::string_view text);

// "ns/name" -> {ns, name}. InvalidArgument naming the id otherwise.
Result<std::pair<std::string, std::string>> SplitRepoId(std::string_view id);

}  // namespace megackpt::hub

#endif  // MEGACKPT_HUB_UTIL_H_
