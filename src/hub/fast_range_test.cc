// HttpClient::FastRangeGet (large Range reads without cpp-httplib's 4 KiB
// reads) against an in-process megahub server, and RemoteRangeFile using it.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <thread>

#include "hub/http_client.h"
#include "megackpt/hub/client.h"
#include "megackpt/hub/server.h"
#include "megackpt/hub/store.h"
#include "hub/test_server.h"
#include "megackpt/hub/transaction.h"

namespace megackpt::hub {
namespace {

using testing::RandomText;

class FastRangeTest : public testing::InProcessHubTest {
 protected:
  FastRangeTest() : InProcessHubTest("megackpt-fast-range") {}
};

TEST_F(FastRangeTest, LargeReadsGoStraightIntoTheBufferAndOddCasesFallBack) {
  auto hub = OpenRemoteHub(endpoint_, token_);
  ASSERT_TRUE(hub.ok()) << hub.status().ToString();
  const std::string data = RandomText(3'300'000, 11);
  {
    auto txn = HubTransaction::Begin(*hub, *ParseMegaUri("mega://fr/repo@main"));
    ASSERT_TRUE(txn.ok()) << txn.status().ToString();
    ASSERT_TRUE((*txn)->Put("w.bin", data).ok());
    ASSERT_TRUE((*txn)->Commit().ok());
  }
  // Through the remote hub's file: whole file, a large middle range (fast path), and
  // a small range (cpp-httplib path).
  auto where = ParseMegaUri("mega://fr/repo@main/w.bin");
  ASSERT_TRUE(where.ok());
  auto entry = (*hub)->GetFile("fr/repo", "main", "w.bin");
  ASSERT_TRUE(entry.ok()) << entry.status().ToString();
  ASSERT_EQ(entry->size, data.size());
  auto f = (*hub)->OpenFile(*where, *entry);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  std::string whole(data.size(), '\0');
  ASSERT_TRUE((*f)->ReadExactlyAt(0, std::as_writable_bytes(std::span(whole))).ok());
  EXPECT_TRUE(whole == data);
  std::string mid(1'500'001, '\0');
  ASSERT_TRUE((*f)->ReadExactlyAt(777'777, std::as_writable_bytes(std::span(mid))).ok());
  EXPECT_TRUE(mid == data.substr(777'777, mid.size()));
  std::string small(1000, '\0');
  ASSERT_TRUE((*f)->ReadExactlyAt(5, std::as_writable_bytes(std::span(small))).ok());
  EXPECT_TRUE(small == data.substr(5, 1000));

  // Directly: a good range, then cases that must answer "fall back".
  const std::string target = "/api/repos/fr/repo/resolve?revision=main&path=w.bin";
  HttpClient http(endpoint_, token_, RemoteOptions{});
  std::string buf(2'000'000, '\0');
  std::string xet;
  ASSERT_TRUE(http.FastRangeGet(target, 1000, std::as_writable_bytes(std::span(buf)), &xet));
  EXPECT_TRUE(buf == data.substr(1000, buf.size()));
  EXPECT_FALSE(xet.empty());
  EXPECT_EQ(http.bytes_received(), buf.size());
  // Past the end: 416, not 206.
  EXPECT_FALSE(http.FastRangeGet(target, data.size() - 10, std::as_writable_bytes(std::span(buf)), &xet));
  // Unknown path: 404.
  EXPECT_FALSE(http.FastRangeGet("/api/repos/fr/repo/resolve?revision=main&path=nope.bin", 0,
                                 std::as_writable_bytes(std::span(buf)), &xet));
  // Bad token: 401.
  HttpClient bad(endpoint_, "mega_" + std::string(40, '0'), RemoteOptions{});
  EXPECT_FALSE(bad.FastRangeGet(target, 0, std::as_writable_bytes(std::span(buf)), &xet));
  // Not plain http, or nothing listening: fall back, no hang.
  HttpClient tls("https://127.0.0.1:1", token_, RemoteOptions{});
  EXPECT_FALSE(tls.FastRangeGet(target, 0, std::as_writable_bytes(std::span(buf)), &xet));
  HttpClient closed("http://127.0.0.1:1", token_, RemoteOptions{});
  EXPECT_FALSE(closed.FastRangeGet(target, 0, std::as_writable_bytes(std::span(buf)), &xet));
}

}  // namespace
}  // namespace megackpt::hub
