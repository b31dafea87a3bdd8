// Safety of names read from checkpoint files, and of the messages that show them.
//
// A checkpoint describes itself: `.metadata` storage entries, index files
// (`weight_map`) and shard headers name the files the reader opens next. Those
// names are untrusted input. Every reader passes them through
// ValidateRelativePath (lexical rules) and, for local folders,
// CheckResolvesInside (symlinks) before it opens anything; OpenLocalFile
// (core/file.h) refuses non-regular files without blocking. Messages that show
// untrusted strings (names, JSON values, file contents) escape them with
// EscapeBytes / Quote (core/text.h), so no raw byte of a file (or of whatever a
// symlink points to) reaches a terminal.
#ifndef MEGACKPT_CORE_PATH_SAFETY_H_
#define MEGACKPT_CORE_PATH_SAFETY_H_

#include <string>
#include <string_view>

#include "megackpt/core/status.h"
#include "megackpt/core/text.h"  // IsValidUtf8, EscapeBytes, Quote

namespace megackpt::inline core {

// Longest relative name accepted, and longest component (POSIX NAME_MAX).
inline constexpr size_t kMaxRelativePathBytes = 4096;
inline constexpr size_t kMaxPathComponentBytes = 255;

// Lexical check of a file name that a checkpoint file gives relative to its
// folder: non-empty, at most kMaxRelativePathBytes, not absolute, no empty, "."
// or ".." component, no component longer than kMaxPathComponentBytes, no NUL,
// no other control byte, no backslash, valid UTF-8. Returns DataLoss naming the
// (escaped) name and the rule it breaks; callers add which file named it.
Status ValidateRelativePath(std::string_view name);

// For a local folder `dir` and a path `path` inside it (dir + "/" + a name that
// passed ValidateRelativePath): DataLoss when `path` exists and its real path
// (symlinks resolved) is not inside the real path of `dir`. OK when `path` does
// not exist (the caller's open reports NotFound) and for URIs (anything with
// "://": the hub has no symlinks).
Status CheckResolvesInside(const std::string& dir, const std::string& path);

}  // namespace megackpt::inline core

#endif  // MEGACKPT_CORE_PATH_SAFETY_H_
