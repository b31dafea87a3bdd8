// The local file system's RemoveGarbage: unlinks now, frees large files later.
//
// On ext4 mounted with online discard (common on cloud VMs), unlinking a
// 2 GiB file costs more than writing it into the page cache: the blocks are
// freed and discarded inside unlink. A file's blocks are freed when its last
// name AND its last open descriptor are gone, so a large file is opened,
// unlinked (cheap: only the name goes), and its descriptor is closed on one
// background thread, where the freeing happens. A file replaced by
// WriteAtomically (a commit record) is handed over the same way. Private to
// the fs layer.
#ifndef MEGACKPT_SRC_FS_BACKGROUND_FREE_H_
#define MEGACKPT_SRC_FS_BACKGROUND_FREE_H_

#include <functional>
#include <string>
#include <vector>

#include "megackpt/core/status.h"

namespace megackpt::fs::internal {

// Files smaller than this are unlinked and freed inline (cheap anyway).
inline constexpr unsigned long long kMinBackgroundFreeBytes = 8ull << 20;
// At most this many descriptors wait for the thread; beyond it files are freed
// inline, so garbage never takes more than a handful of the process's fds.
inline constexpr size_t kMaxQueuedFrees = 64;
// A call waits while this many earlier calls still have files queued, which
// bounds the disk space held by garbage when saves come faster than frees.
inline constexpr size_t kMaxUnfinishedCalls = 2;

// Unlinks every path (missing ones and failures are skipped). A regular file
// of at least kMinBackgroundFreeBytes with no other name is kept open across
// its unlink and handed to the background thread (started on first use). A
// forked child closes its inherited copies of the queued descriptors, so it
// never pins the parent's garbage.
void UnlinkFreeingInBackground(const std::vector<std::string>& paths);

// Runs `replace`, which puts a new file at `path` (a rename over it, say),
// holding the file that was there open. When that file has no name left
// afterwards (the rename took its last link), its descriptor goes to the
// background thread, whatever its size, instead of its blocks being freed
// inside `replace`: on ext4 without a journal and with online discard, even a
// one-block file is discarded synchronously there, which waited 20-40 ms behind
// the writeback of a no-sync save's data (docs/benchmarks.md, "A save over the
// previous save waited in its commit's rename"). Not counted against
// kMaxUnfinishedCalls (the file is as small as a commit record, and a later
// RemoveGarbage must not wait for it). Returns replace()'s status.
Status ReplaceFreeingInBackground(const std::string& path, const std::function<Status()>& replace);

// Waits until the background thread has closed every queued descriptor.
void FinishBackgroundFreesNow();

// Tests: while paused the thread closes nothing, so that queued descriptors
// can be observed (and a fork made while they are queued).
void PauseBackgroundFreesForTesting(bool paused);
// Tests: descriptors queued or being closed right now.
size_t QueuedBackgroundFreesForTesting();
// Tests: calls of UnlinkFreeingInBackground with descriptors queued or being
// closed right now (what a call's wait for kMaxUnfinishedCalls counts).
size_t UnfinishedCallsForTesting();

}  // namespace megackpt::fs::internal

#endif  // MEGACKPT_SRC_FS_BACKGROUND_FREE_H_
