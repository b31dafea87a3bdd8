// Names from checkpoint files, non-regular files, and escaped messages
// (core/path_safety.h, OpenLocalFile).
#include "megackpt/core/path_safety.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string_view>
#include <vector>

#include "core/test_files.h"
#include "megackpt/core/file.h"
#include "megackpt/core/path_components.h"

namespace megackpt::inline core {
namespace {

namespace stdfs = std::filesystem;

class TempFolder : public test_util::TempDir {
 public:
  TempFolder() : test_util::TempDir("megackpt-path-safety") {}
};

TEST(PathComponents, EveryComponentEmptyOnesIncluded) {
  using V = std::vector<std::string_view>;
  EXPECT_EQ(PathComponents(""), V{""});
  EXPECT_EQ(PathComponents("a"), V{"a"});
  EXPECT_EQ(PathComponents("a/b/c"), (V{"a", "b", "c"}));
  EXPECT_EQ(PathComponents("a//b/"), (V{"a", "", "b", ""}));
  EXPECT_EQ(PathComponents("/a"), (V{"", "a"}));
  EXPECT_EQ(PathComponents("/"), (V{"", ""}));
}

TEST(ValidateRelativePath, AcceptsPlainNames) {
  for (const char* name : {"model.mega", "__0123456789abcdef_0_0.distcp", "sub/dir/x.bin",
                           "model-00001-of-00002.mega", "\xc3\xa9t\xc3\xa9.mega", "a..b", "...x"}) {
    EXPECT_TRUE(ValidateRelativePath(name).ok()) << name;
  }
}

TEST(ValidateRelativePath, RefusesEveryBadKind) {
  struct Case {
    std::string name;
    const char* why;
  };
  const Case cases[] = {
      {"", "empty"},
      {"/etc/passwd", "absolute"},
      {"../outside/evil.mega", "'..'"},
      {"a/../../b", "'..'"},
      {"..", "'..'"},
      {"a//b", "empty path component"},
      {"a/", "empty path component"},
      {"./a", "'.'"},
      {std::string("a\0b", 3), "NUL"},
      {"a\nb", "control"},
      {"a\\b", "backslash"},
      {"\xff\xfe.mega", "UTF-8"},
      {std::string(256, 'x'), "longer than 255"},
      {std::string(5000, 'x'), "longer than 4096"},
  };
  for (const Case& c : cases) {
    Status s = ValidateRelativePath(c.name);
    ASSERT_FALSE(s.ok()) << EscapeBytes(c.name);
    EXPECT_EQ(s.code(), StatusCode::kDataLoss);
    EXPECT_NE(s.message().find(c.why), std::string::npos) << s.message();
    // The message never carries the raw control/invalid bytes.
    for (char ch : s.message()) {
      EXPECT_GE(static_cast<unsigned char>(ch), 0x20) << EscapeBytes(s.message());
    }
    EXPECT_TRUE(IsValidUtf8(s.message())) << EscapeBytes(s.message());
  }
}

TEST(CheckResolvesInside, RefusesSymlinksLeavingTheFolder) {
  TempFolder t;
  const std::string dir = t.path() + "/ckpt";
  stdfs::create_directories(dir);
  std::ofstream(t.path() + "/secret") << "outside bytes \x1b]0;title\x07";
  std::ofstream(dir + "/inside.bin") << "ok";
  stdfs::create_symlink(t.path() + "/secret", dir + "/evil.mega");
  stdfs::create_symlink("inside.bin", dir + "/alias.bin");
  EXPECT_TRUE(CheckResolvesInside(dir, dir + "/inside.bin").ok());
  EXPECT_TRUE(CheckResolvesInside(dir, dir + "/alias.bin").ok());
  EXPECT_TRUE(CheckResolvesInside(dir, dir + "/missing.bin").ok());
  Status s = CheckResolvesInside(dir, dir + "/evil.mega");
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("outside the checkpoint folder"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("outside bytes"), std::string::npos) << s.message();
  EXPECT_TRUE(CheckResolvesInside("mega://org/repo/ckpt", "mega://org/repo/ckpt/x").ok());
}

// A FIFO, a socket and a device are refused at once (the open would block on a
// FIFO without O_NONBLOCK; this test would then hang until ctest kills it).
TEST(OpenLocalFile, RefusesNonRegularFilesWithoutBlocking) {
  TempFolder t;
  const std::string fifo = t.path() + "/model.mega";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  auto f = OpenLocalFile(fifo);
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(f.status().message().find("a FIFO"), std::string::npos) << f.status().message();
  EXPECT_FALSE(ReadLocalFile(fifo).ok());

  const std::string sock = t.path() + "/s";
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock.c_str());
  if (sock.size() < sizeof addr.sun_path &&
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    auto s = OpenLocalFile(sock);
    EXPECT_FALSE(s.ok());
  }
  close(fd);

  auto dev = OpenLocalFile("/dev/null");
  ASSERT_FALSE(dev.ok());
  EXPECT_NE(dev.status().message().find("character device"), std::string::npos);

  // Regular files still open, and reads work (O_NONBLOCK was cleared).
  std::ofstream(t.path() + "/x") << "hello";
  auto ok = ReadLocalFile(t.path() + "/x");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(*ok, "hello");
}

}  // namespace
}  // namespace megackpt::inline core
