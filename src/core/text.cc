// UTF-8 validation and escaping for messages (include/megackpt/core/text.h).
#include "megackpt/core/text.h"

#include <cstdint>
#include <cstdio>

namespace megackpt::inline core {
namespace {

// Length of the well-formed UTF-8 sequence at s[i] (1..4) and its code point,
// or 0 when the bytes there are not one (RFC 3629 table).
size_t Utf8Sequence(std::string_view s, size_t i, uint32_t* cp) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(s[i + k]); };
  const size_t left = s.size() - i;
  const uint8_t c = b(0);
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  size_t n;
  uint32_t v;
  uint8_t lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    v = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    v = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;  // overlong
    if (c == 0xED) hi = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    v = c & 0x07;
    if (c == 0xF0) lo = 0x90;  // overlong
    if (c == 0xF4) hi = 0x8F;  // > U+10FFFF
  } else {
    return 0;
  }
  if (left < n) return 0;
  for (size_t k = 1; k < n; ++k) {
    const uint8_t x = b(k);
    if (x < (k == 1 ? lo : 0x80) || x > (k == 1 ? hi : 0xBF)) return 0;
    v = v << 6 | (x & 0x3F);
  }
  *cp = v;
  return n;
}

void AppendHex(std::string& out, uint8_t c) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "\\x%02x", c);
  out += buf;
}

}  // namespace

bool IsValidUtf8(std::string_view s) {
  uint32_t cp;
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8Sequence(s, i, &cp);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

bool IsCleanText(std::string_view s) {
  return s.find('\0') == std::string_view::npos && IsValidUtf8(s);
}

std::string EscapeBytes(std::string_view s, size_t max_bytes) {
  const bool cut = s.size() > max_bytes;
  if (cut) s = s.substr(0, max_bytes);
  std::string out;
  out.reserve(s.size() + 3);
  uint32_t cp;
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8Sequence(s, i, &cp);
    if (n == 0) {
      AppendHex(out, static_cast<uint8_t>(s[i]));
      ++i;
      continue;
    }
    if (n == 1) {
      const char c = s[i];
      if (c == '\\') {
        out += "\\\\";
      } else if (c == '\'') {
        out += "\\'";
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '\t') {
        out += "\\t";
      } else if (c == '\r') {
        out += "\\r";
      } else if (cp < 0x20 || cp == 0x7F) {
        AppendHex(out, static_cast<uint8_t>(c));
      } else {
        out += c;
      }
    } else if (cp >= 0x80 && cp <= 0x9F) {  // C1 controls
      for (size_t k = 0; k < n; ++k) AppendHex(out, static_cast<uint8_t>(s[i + k]));
    } else {
      out.append(s.substr(i, n));
    }
    i += n;
  }
  if (cut) out += "...";
  return out;
}

std::string Quote(std::string_view s) {
  std::string out = "'";
  out += EscapeBytes(s);
  out += '\'';
  return out;
}

std::string ToLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

int HexDigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool IsHex(std::string_view s, size_t n) {
  if (s.empty() || (n != 0 && s.size() != n)) return false;
  for (char c : s) {
    if (HexDigitValue(c) < 0) return false;
  }
  return true;
}

bool IsLowerHex(std::string_view s, size_t n) {
  if (s.empty() || (n != 0 && s.size() != n)) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace megackpt::inline core
