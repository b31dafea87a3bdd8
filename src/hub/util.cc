#include "hub/util.h"

#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <random>

#include "megackpt/core/checksum.h"
#include "megackpt/hub/mega_uri.h"
#include "megackpt/hub/types.h"

namespace megackpt::hub {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string FormatTimestamp(int64_t unix_ms) {
  time_t secs = static_cast<time_t>(unix_ms / 1000);
  int ms = static_cast<int>(unix_ms % 1000);
  if (ms < 0) {
    ms += 1000;
    --secs;
  }
  struct tm tm;
  gmtime_r(&secs, &tm);
  char buf[64];
  snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
           tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ms);
  return buf;
}

int64_t ParseTimestamp(std::string_view text) {
  int y, mo, d, h, mi, sec;
  std::string t(text);
  if (std::sscanf(t.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d", &y, &mo, &d, &h, &mi, &sec) != 6) return 0;
  int ms = 0;
  size_t dot = t.find('.');
  if (dot != std::string::npos) {
    int scale = 100;
    for (size_t i = dot + 1;
         i < t.size() && std::isdigit(static_cast<unsigned char>(t[i])) && scale > 0; ++i) {
      ms += (t[i] - '0') * scale;
      scale /= 10;
    }
  }
  struct tm tm = {};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = sec;
  return static_cast<int64_t>(timegm(&tm)) * 1000 + ms;
}

std::string Sha256Hex(std::string_view data) {
  auto d = Sha256Of(AsBytes(data));
  return ToHex(d);
}

std::string HmacSha256Hex(std::string_view key, std::string_view data) {
  unsigned char out[32];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &len);
  return ToHex(std::span<const uint8_t>(out, len));
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

Result<std::pair<std::string, std::string>> SplitRepoId(std::string_view id) {
  size_t slash = id.find('/');
  if (slash == std::string_view::npos || id.find('/', slash + 1) != std::string_view::npos) {
    return InvalidArgumentError("repo id '" + std::string(id) + "' is not 'namespace/name'");
  }
  std::string ns(id.substr(0, slash)), name(id.substr(slash + 1));
  MEGA_RETURN_IF_ERROR(
      ValidateRepoNamePart(ns, "namespace").WithContext("repo id '" + std::string(id) + "'"));
  MEGA_RETURN_IF_ERROR(
      ValidateRepoNamePart(name, "name").WithContext("repo id '" + std::string(id) + "'"));
  return std::make_pair(std::move(ns), std::move(name));
}

}  // namespace megackpt::hub
