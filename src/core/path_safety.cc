// Name and message safety (megackpt/core/path_safety.h).
#include "megackpt/core/path_safety.h"

#include <climits>
#include <cstdlib>
#include <cstring>

namespace megackpt::inline core {
namespace {

// Length of the well-formed UTF-8 sequence starting at s[i] (1..4), or 0 when
// the bytes there are not one (RFC 3629 table: no overlong forms, no
// surrogates, nothing above U+10FFFF).
size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(1) < lo || b(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (b(k) < 0x80 || b(k) > 0xBF) return 0;
  }
  return n;
}

std::string RealPath(const std::string& p) {
  char* r = realpath(p.c_str(), nullptr);
  if (!r) return std::string();
  std::string out(r);
  std::free(r);
  return out;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = Utf8SequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string EscapeForMessage(std::string_view s, size_t max_bytes) {
  std::string out;
  const bool cut = s.size() > max_bytes;
  if (cut) s = s.substr(0, max_bytes);
  out.reserve(s.size() + 8);
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      size_t n = Utf8SequenceLength(s, i);
      if (n > 1) {
        out.append(s.substr(i, n));
        i += n;
        continue;
      }
    }
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c >= 0x7F) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
    ++i;
  }
  if (cut) out += "...";
  return out;
}

std::string QuoteForMessage(std::string_view s) {
  std::string out = "'";
  out.append(EscapeForMessage(s)).push_back('\'');
  return out;
}

Status ValidateRelativePath(std::string_view name) {
  auto bad = [&](std::string_view why) {
    // Appended piece by piece (GCC 12 reports a false -Wrestrict on chained +).
    std::string msg = "file name ";
    msg.append(QuoteForMessage(name)).append(" ").append(why);
    return DataLossError(std::move(msg));
  };
  if (name.empty()) return bad("is empty");
  if (name.size() > kMaxRelativePathBytes) {
    return bad("is longer than " + std::to_string(kMaxRelativePathBytes) + " bytes");
  }
  if (name.front() == '/') return bad("is absolute (names must be relative to the checkpoint folder)");
  for (unsigned char c : name) {
    if (c == 0) return bad("holds a NUL byte");
    if (c < 0x20 || c == 0x7F) return bad("holds a control byte");
    if (c == '\\') return bad("holds a backslash");
  }
  if (!IsValidUtf8(name)) return bad("is not valid UTF-8");
  size_t start = 0;
  while (start <= name.size()) {
    size_t slash = name.find('/', start);
    if (slash == std::string_view::npos) slash = name.size();
    std::string_view part = name.substr(start, slash - start);
    if (part.empty()) return bad("has an empty path component");
    if (part == ".") return bad("has a '.' component");
    if (part == "..") return bad("has a '..' component (it would leave the checkpoint folder)");
    if (part.size() > kMaxPathComponentBytes) {
      return bad("has a component longer than " + std::to_string(kMaxPathComponentBytes) + " bytes");
    }
    start = slash + 1;
  }
  return Status::OK();
}

Status CheckResolvesInside(const std::string& dir, const std::string& path) {
  if (dir.find("://") != std::string::npos || path.find("://") != std::string::npos) {
    return Status::OK();
  }
  const std::string real = RealPath(path);
  if (real.empty()) return Status::OK();  // missing: the open says NotFound
  std::string root = RealPath(dir.empty() ? "." : dir);
  if (root.empty()) return Status::OK();
  if (root != "/") root += '/';
  if (!real.starts_with(root)) {
    std::string msg = QuoteForMessage(path);
    msg.append(" resolves outside the checkpoint folder (a symlink leaves ")
        .append(QuoteForMessage(dir))
        .append("); refusing to open it");
    return DataLossError(std::move(msg));
  }
  return Status::OK();
}

}  // namespace megackpt::core
