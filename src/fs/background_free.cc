#include "fs/background_free.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <system_error>
#include <thread>

namespace megackpt::fs::internal {
namespace {

// A descriptor of an unlinked file, waiting to be closed.
struct Pending {
  int fd;
  dev_t dev;
  ino_t ino;
  uint64_t call;  // which UnlinkFreeingInBackground queued it; kNoCall: a replaced file
};

// The `call` of a file queued by ReplaceFreeingInBackground: no call waits for it.
constexpr uint64_t kNoCall = ~0ull;

struct Freer {
  std::mutex mu;
  std::condition_variable cv;  // work queued, a descriptor closed, unpaused
  std::deque<Pending> queue;
  std::optional<Pending> closing;  // taken by the thread, being closed
  uint64_t next_call = 0;
  bool started = false;
  bool paused = false;
};

// Never destroyed: the detached thread may outlive static destruction. A forked
// child gets a fresh one (ChildAfterFork): the parent's thread does not exist
// there, and its mutex and condition variable may be in any state.
Freer* g_freer = nullptr;
Freer* g_parents_freer = nullptr;  // in a forked child: kept reachable, never used

void PrepareFork() { g_freer->mu.lock(); }
void ParentAfterFork() { g_freer->mu.unlock(); }
void ChildAfterFork() {
  Freer* old = g_freer;  // locked by PrepareFork; left as is, never used again
  // The child's copies of the queued descriptors would keep the parent's
  // garbage on disk for as long as the child lives (a data-loader worker, say).
  for (const Pending& p : old->queue) close(p.fd);
  if (old->closing) {
    // The parent's thread may have closed it already and the number been
    // reused since: close it only if it is still the same unlinked file.
    struct stat st;
    if (fstat(old->closing->fd, &st) == 0 && st.st_dev == old->closing->dev &&
        st.st_ino == old->closing->ino) {
      close(old->closing->fd);
    }
  }
  g_parents_freer = old;
  g_freer = new Freer();
}

Freer& TheFreer() {
  static const bool registered = [] {
    g_freer = new Freer();
    pthread_atfork(PrepareFork, ParentAfterFork, ChildAfterFork);
    return true;
  }();
  (void)registered;
  return *g_freer;
}

void CloseQueued(Freer* f) {
  std::unique_lock<std::mutex> lock(f->mu);
  for (;;) {
    f->cv.wait(lock, [&] { return !f->queue.empty() && !f->paused; });
    f->closing = f->queue.front();
    f->queue.pop_front();
    const int fd = f->closing->fd;
    lock.unlock();
    close(fd);  // where the file's blocks are freed (and discarded)
    lock.lock();
    f->closing.reset();
    f->cv.notify_all();
  }
}

// Calls with descriptors still queued or being closed. REQUIRES: f.mu held.
size_t UnfinishedCalls(const Freer& f) {
  std::set<uint64_t> calls;
  for (const Pending& p : f.queue) calls.insert(p.call);
  if (f.closing) calls.insert(f.closing->call);
  calls.erase(kNoCall);
  return calls.size();
}

// Starts the thread on first use and wakes it; false when no thread can be
// had (a process at its thread limit): the caller frees its files itself.
// REQUIRES: f.mu held.
bool WakeCloser(Freer& f) {
  if (!f.started) {
    try {
      std::thread(CloseQueued, &f).detach();
      f.started = true;
    } catch (const std::system_error&) {
      return false;
    }
  }
  f.cv.notify_all();
  return true;
}

}  // namespace

void UnlinkFreeingInBackground(const std::vector<std::string>& paths) {
  Freer& f = TheFreer();
  std::unique_lock<std::mutex> lock(f.mu);
  f.cv.wait(lock, [&] { return UnfinishedCalls(f) < kMaxUnfinishedCalls || f.paused; });
  const uint64_t call = f.next_call++;
  size_t queued = 0;
  for (const std::string& path : paths) {
    // O_NOFOLLOW: a symbolic link is unlinked, never its target kept open.
    // O_NONBLOCK: opening a FIFO must not wait for a writer.
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    struct stat st {};
    const bool later =
        fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_nlink == 1 &&
        static_cast<unsigned long long>(st.st_blocks) * 512 >= kMinBackgroundFreeBytes &&
        f.queue.size() < kMaxQueuedFrees;
    if (unlink(path.c_str()) != 0 || !later) {
      if (fd >= 0) close(fd);
      continue;
    }
    f.queue.push_back(Pending{fd, st.st_dev, st.st_ino, call});
    ++queued;
  }
  if (queued == 0) return;
  if (!WakeCloser(f)) {  // no thread to be had: free them now
    for (const Pending& p : f.queue) close(p.fd);
    f.queue.clear();
  }
}

Status ReplaceFreeingInBackground(const std::string& path, const std::function<Status()>& replace) {
  // The flags as in UnlinkFreeingInBackground.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return replace();  // nothing there yet (or not ours to open)
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return replace();
  }
  Status s = replace();
  struct stat after {};
  Freer& f = TheFreer();
  std::unique_lock<std::mutex> lock(f.mu);
  if (fstat(fd, &after) != 0 || after.st_nlink != 0 || f.queue.size() >= kMaxQueuedFrees) {
    lock.unlock();
    close(fd);  // still named (replace failed), or the queue is full
    return s;
  }
  f.queue.push_back(Pending{fd, st.st_dev, st.st_ino, kNoCall});
  if (!WakeCloser(f)) {
    f.queue.pop_back();
    lock.unlock();
    close(fd);
  }
  return s;
}

void FinishBackgroundFreesNow() {
  Freer& f = TheFreer();
  std::unique_lock<std::mutex> lock(f.mu);
  f.cv.wait(lock, [&] { return (f.queue.empty() || f.paused) && !f.closing; });
}

void PauseBackgroundFreesForTesting(bool paused) {
  Freer& f = TheFreer();
  std::lock_guard<std::mutex> lock(f.mu);
  f.paused = paused;
  f.cv.notify_all();
}

size_t QueuedBackgroundFreesForTesting() {
  Freer& f = TheFreer();
  std::lock_guard<std::mutex> lock(f.mu);
  return f.queue.size() + (f.closing ? 1 : 0);
}

size_t UnfinishedCallsForTesting() {
  Freer& f = TheFreer();
  std::lock_guard<std::mutex> lock(f.mu);
  return UnfinishedCalls(f);
}

}  // namespace megackpt::fs::internal
