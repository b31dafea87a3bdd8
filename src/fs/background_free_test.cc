// The local file system's RemoveGarbage (background_free.h): names go at once,
// large files are freed by the background thread, small files, links and hard
// links are handled inline, and a forked child never pins the parent's garbage.
// WriteAtomically over a file: the replaced file is freed by the thread too.
#include "fs/background_free.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/test_files.h"
#include "megackpt/fs/filesystem.h"

namespace megackpt::fs {
namespace {

namespace stdfs = std::filesystem;
using ::megackpt::test_util::TempDir;

void WriteBytes(const std::string& path, size_t n) {
  std::ofstream out(path, std::ios::binary);
  std::string block(1 << 20, 'x');
  for (size_t done = 0; done < n; done += block.size()) {
    out.write(block.data(), static_cast<std::streamsize>(std::min(block.size(), n - done)));
  }
  ASSERT_TRUE(out.good()) << path;
}

// This process's descriptors of unlinked files below `dir`.
std::vector<std::string> DeletedFilesHeldOpen(const std::string& dir) {
  std::vector<std::string> held;
  std::error_code ec;
  for (const auto& e : stdfs::directory_iterator("/proc/self/fd", ec)) {
    std::error_code lec;
    const std::string target = stdfs::read_symlink(e.path(), lec).string();
    if (!lec && target.rfind(dir + "/", 0) == 0 && target.ends_with(" (deleted)")) {
      held.push_back(target);
    }
  }
  return held;
}

constexpr size_t kBig = internal::kMinBackgroundFreeBytes + (1 << 20);

TEST(BackgroundFreeTest, NamesGoAtOnceAndLargeFilesAreFreedByTheThread) {
  TempDir dir;
  const std::string d = dir.path();
  WriteBytes(d + "/big1", kBig);
  WriteBytes(d + "/big2", kBig);
  WriteBytes(d + "/small", 4096);
  WriteBytes(d + "/linked", kBig);
  stdfs::create_hard_link(d + "/linked", d + "/linked-too");
  WriteBytes(d + "/target", 10);
  stdfs::create_symlink(d + "/target", d + "/symlink");
  internal::PauseBackgroundFreesForTesting(true);
  LocalFileSystem()->RemoveGarbage(
      {d + "/big1", d + "/big2", d + "/small", d + "/linked", d + "/symlink", d + "/missing"});
  for (const char* gone : {"big1", "big2", "small", "linked", "symlink"}) {
    EXPECT_FALSE(stdfs::exists(stdfs::symlink_status(d + "/" + gone))) << gone;
  }
  // Other names of the same data stay: the hard link's twin, the link's target.
  EXPECT_EQ(stdfs::file_size(d + "/linked-too"), kBig);
  EXPECT_EQ(stdfs::file_size(d + "/target"), 10u);
  // Only the two large files with no other name wait for the thread.
  EXPECT_EQ(internal::QueuedBackgroundFreesForTesting(), 2u);
  EXPECT_EQ(DeletedFilesHeldOpen(d).size(), 2u);
  internal::PauseBackgroundFreesForTesting(false);
  FinishBackgroundFrees();
  EXPECT_EQ(internal::QueuedBackgroundFreesForTesting(), 0u);
  EXPECT_TRUE(DeletedFilesHeldOpen(d).empty());
}

TEST(BackgroundFreeTest, ANewFileMayTakeAGarbageNameAtOnce) {
  TempDir dir;
  const std::string name = dir.path() + "/shard.mega";
  WriteBytes(name, kBig);
  internal::PauseBackgroundFreesForTesting(true);
  LocalFileSystem()->RemoveGarbage({name});
  WriteBytes(name, 3);
  internal::PauseBackgroundFreesForTesting(false);
  FinishBackgroundFrees();
  EXPECT_EQ(stdfs::file_size(name), 3u);  // the late close freed the old file only
}

TEST(BackgroundFreeTest, AForkedChildDoesNotPinTheParentsGarbageAndFreesItsOwn) {
  TempDir dir;
  const std::string d = dir.path();
  WriteBytes(d + "/parent", kBig);
  internal::PauseBackgroundFreesForTesting(true);
  LocalFileSystem()->RemoveGarbage({d + "/parent"});
  ASSERT_EQ(DeletedFilesHeldOpen(d).size(), 1u);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The child: none of the parent's queued descriptors, and a working freer.
    int code = DeletedFilesHeldOpen(d).empty() ? 0 : 1;
    std::ofstream(d + "/child", std::ios::binary) << std::string(kBig, 'y');
    LocalFileSystem()->RemoveGarbage({d + "/child"});
    if (stdfs::exists(d + "/child")) code |= 2;
    FinishBackgroundFrees();
    if (!DeletedFilesHeldOpen(d).empty()) code |= 4;
    _exit(code);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: inherited garbage kept open; 2: name kept; "
                                       "4: the child's own garbage not freed";
  EXPECT_EQ(DeletedFilesHeldOpen(d).size(), 1u);  // the parent's, still paused
  internal::PauseBackgroundFreesForTesting(false);
  FinishBackgroundFrees();
  EXPECT_TRUE(DeletedFilesHeldOpen(d).empty());
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// WriteAtomically over an existing file (a commit record replaced): the old
// file, however small, is freed by the thread, not inside the rename; a new
// name and a failed replacement queue nothing.
TEST(BackgroundFreeTest, AReplacedFileIsFreedByTheThread) {
  TempDir dir;
  const std::string d = dir.path();
  auto fs = LocalFileSystem();
  ASSERT_TRUE(fs->WriteAtomically(d + "/.metadata", "old", false).ok());
  internal::PauseBackgroundFreesForTesting(true);
  ASSERT_TRUE(fs->WriteAtomically(d + "/.metadata", "new", false).ok());
  EXPECT_EQ(ReadAll(d + "/.metadata"), "new");
  EXPECT_EQ(internal::QueuedBackgroundFreesForTesting(), 1u);
  EXPECT_EQ(DeletedFilesHeldOpen(d).size(), 1u);
  // Nothing replaced: a new name, and a replacement that fails.
  ASSERT_TRUE(fs->WriteAtomically(d + "/index.json", "first", true).ok());
  Status failed = internal::ReplaceFreeingInBackground(
      d + "/index.json", [] { return IOError("the replacement failed"); });
  EXPECT_EQ(failed.code(), StatusCode::kIOError);
  EXPECT_EQ(ReadAll(d + "/index.json"), "first");
  EXPECT_EQ(internal::QueuedBackgroundFreesForTesting(), 1u);
  internal::PauseBackgroundFreesForTesting(false);
  FinishBackgroundFrees();
  EXPECT_TRUE(DeletedFilesHeldOpen(d).empty());
}

// Replaced files do not count as calls: a RemoveGarbage after them waits only
// for earlier RemoveGarbage calls (kMaxUnfinishedCalls), never for them.
TEST(BackgroundFreeTest, ReplacedFilesDoNotCountAsCalls) {
  TempDir dir;
  const std::string d = dir.path();
  auto fs = LocalFileSystem();
  ASSERT_TRUE(fs->WriteAtomically(d + "/record", "0", false).ok());
  WriteBytes(d + "/big", kBig);
  internal::PauseBackgroundFreesForTesting(true);
  ASSERT_TRUE(fs->WriteAtomically(d + "/record", "1", false).ok());
  ASSERT_TRUE(fs->WriteAtomically(d + "/record", "2", false).ok());
  EXPECT_EQ(internal::QueuedBackgroundFreesForTesting(), 2u);
  EXPECT_EQ(internal::UnfinishedCallsForTesting(), 0u);
  fs->RemoveGarbage({d + "/big"});
  EXPECT_EQ(internal::QueuedBackgroundFreesForTesting(), 3u);
  EXPECT_EQ(internal::UnfinishedCallsForTesting(), 1u);
  internal::PauseBackgroundFreesForTesting(false);
  FinishBackgroundFrees();
  EXPECT_EQ(internal::UnfinishedCallsForTesting(), 0u);
  EXPECT_TRUE(DeletedFilesHeldOpen(d).empty());
}

}  // namespace
}  // namespace megackpt::fs
