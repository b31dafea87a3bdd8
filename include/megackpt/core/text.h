// Text helpers: UTF-8 validation and escaping of bytes from files in messages,
// ASCII case folding, hex checks.
//
// Every error message that quotes bytes read from a file (tensor names, keys,
// metadata strings, paths) goes through Quote/EscapeBytes, so a name holding a
// NUL, a terminal escape or invalid UTF-8 is shown as what it is ('a\x00b'),
// never truncated or interpreted by the terminal.
#ifndef MEGACKPT_CORE_TEXT_H_
#define MEGACKPT_CORE_TEXT_H_

#include <cstddef>
#include <string>
#include <string_view>

namespace megackpt::inline core {

// True when `s` is well-formed UTF-8 (no overlong forms, no surrogates, code
// points <= U+10FFFF). NUL bytes are valid UTF-8; see IsCleanText.
bool IsValidUtf8(std::string_view s);

// Valid UTF-8 without NUL: what the formats accept for names, keys and strings.
bool IsCleanText(std::string_view s);

// `s` with every byte that is not printable escaped: \\ and \' for backslash
// and quote, \n \t \r, \xNN for other control bytes (C0, DEL), invalid UTF-8
// bytes and C1 controls; valid printable UTF-8 is kept as is. Input longer
// than `max_bytes` is cut there and the cut marked with "...".
inline constexpr size_t kMaxEscapedBytes = 1024;
std::string EscapeBytes(std::string_view s, size_t max_bytes = kMaxEscapedBytes);

// EscapeBytes(s) in single quotes: 'name'.
std::string Quote(std::string_view s);

// `s` with ASCII letters lowered (other bytes unchanged): for case-insensitive
// names (URI schemes, hex digests, flag values).
std::string ToLower(std::string_view s);

// The hex checkers for digests, hashes and ids in text. True when `s` is `n`
// hex digits (any length when n is 0, but not empty): IsHex either case,
// IsLowerHex only 0-9a-f (commit ids, SHA-256 as stored).
bool IsHex(std::string_view s, size_t n = 0);
bool IsLowerHex(std::string_view s, size_t n = 0);
// The value of hex digit `c` (either case), -1 when it is not one.
int HexDigitValue(char c);

}  // namespace megackpt::inline core

#endif  // MEGACKPT_CORE_TEXT_H_
