// megahub's large request bodies (POST /v1/xorbs) arrive through the HTTP
// layer's large per-connection buffer. These tests speak raw HTTP/1.1 over one
// keep-alive connection and pipeline the next request behind the body, so a
// receiver that read one byte too many or too few breaks the next answer.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "cas/test_util.h"
#include "hub/test_server.h"
#include "megackpt/cas/hash.h"
#include "megackpt/cas/xorb.h"
#include "megackpt/hub/server.h"
#include "megackpt/hub/store.h"

namespace megackpt::hub {
namespace {

using cas::testing::RandomBytes;
using testing::ExpectAnswer;
using testing::RawConnection;

// A serialized xorb of `chunks` random chunks of 64 KiB and its hash.
std::pair<std::string, std::string> MakeXorb(int chunks, uint32_t seed) {
  cas::XorbBuilder b;
  for (int i = 0; i < chunks; ++i) {
    std::string c = RandomBytes(seed + i, 64 << 10);
    std::string rec;
    cas::AppendChunkRecord(std::as_bytes(std::span(c)), cas::CompressionPolicy::kAuto, &rec);
    b.Add(cas::ChunkHash(std::as_bytes(std::span(c))), static_cast<uint32_t>(c.size()), rec);
  }
  auto fin = b.Finish();
  return {std::string(reinterpret_cast<const char*>(fin.serialized.data()), fin.serialized.size()),
          fin.layout.xorb_hash.ToHex()};
}

class HubServerBodyTest : public testing::InProcessHubTest {
 protected:
  HubServerBodyTest() : InProcessHubTest("megackpt-server-body") {}

  std::string PostHead(const std::string& hash, size_t len) const {
    return "POST /v1/xorbs/default/" + hash +
           " HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + token_ +
           "\r\nContent-Type: application/octet-stream\r\nContent-Length: " + std::to_string(len) +
           "\r\n\r\n";
  }
  std::string RangeGet(const std::string& hash, size_t first, size_t last) const {
    return "GET /v1/xorbs/default/" + hash +
           " HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + token_ +
           "\r\nRange: bytes=" + std::to_string(first) + "-" + std::to_string(last) + "\r\n\r\n";
  }
};

TEST_F(HubServerBodyTest, PipelinedRequestsBehindLargeBodiesStayInSync) {
  RawConnection c(port_);
  ASSERT_TRUE(c.ok());
  auto [x1, h1] = MakeXorb(40, 1);  // ~2.5 MiB
  auto [x2, h2] = MakeXorb(3, 100);
  // Two uploads and a range read in ONE send: each body is followed at once
  // by the next request's bytes.
  std::string wire =
      PostHead(h1, x1.size()) + x1 + PostHead(h2, x2.size()) + x2 + RangeGet(h1, 5, 104);
  auto a1 = c.Exchange(wire);
  ASSERT_NO_FATAL_FAILURE(ExpectAnswer(a1, 200));
  EXPECT_NE(a1->body.find("\"was_inserted\":true"), std::string::npos) << a1->body;
  auto a2 = c.Read();
  ASSERT_NO_FATAL_FAILURE(ExpectAnswer(a2, 200));
  auto a3 = c.Read();
  ASSERT_NO_FATAL_FAILURE(ExpectAnswer(a3, 206));
  EXPECT_EQ(a3->body, x1.substr(5, 100));
  HubServerStats st = server_->stats();
  EXPECT_EQ(st.xorbs_received, 2u);
  EXPECT_EQ(st.xorb_bytes_received, x1.size() + x2.size());
  EXPECT_EQ(st.xorbs_inserted, 2u);
}

TEST_F(HubServerBodyTest, SlowBodyAndCorruptBodyKeepTheConnectionUsable) {
  RawConnection c(port_);
  ASSERT_TRUE(c.ok());
  auto [x, h] = MakeXorb(20, 7);
  // The body trickles in: the headers with a few bytes, a pause, the rest in pieces.
  ASSERT_TRUE(c.Send(PostHead(h, x.size()) + x.substr(0, 1000)));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  for (size_t off = 1000; off < x.size(); off += 300'000) {
    ASSERT_TRUE(c.Send(std::string_view(x).substr(off, 300'000)));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto a = c.Read();
  ASSERT_NO_FATAL_FAILURE(ExpectAnswer(a, 200));
  // A corrupt body (one byte of a chunk flipped) is refused (400) and the
  // connection still answers the next request.
  std::string bad = x;
  bad[bad.size() / 2] = static_cast<char>(bad[bad.size() / 2] ^ 0x5a);
  auto [y, hy] = MakeXorb(2, 55);
  auto refused = c.Exchange(PostHead(hy, bad.size()) + bad + RangeGet(h, 0, 9));
  ASSERT_NO_FATAL_FAILURE(ExpectAnswer(refused, 400));
  auto after = c.Read();
  ASSERT_NO_FATAL_FAILURE(ExpectAnswer(after, 206));
  EXPECT_EQ(after->body, x.substr(0, 10));
}

TEST_F(HubServerBodyTest, TinyBodiesAndManyUploadsOnOneConnection) {
  RawConnection c(port_);
  ASSERT_TRUE(c.ok());
  // A tiny xorb (the whole body arrives with the headers), then several
  // large ones pipelined in a row.
  cas::XorbBuilder b;
  std::string small = RandomBytes(3, 1000), rec;
  cas::AppendChunkRecord(std::as_bytes(std::span(small)), cas::CompressionPolicy::kNone, &rec);
  b.Add(cas::ChunkHash(std::as_bytes(std::span(small))), 1000, rec);
  auto fin = b.Finish();
  std::string xs(reinterpret_cast<const char*>(fin.serialized.data()), fin.serialized.size());
  auto tiny = c.Exchange(PostHead(fin.layout.xorb_hash.ToHex(), xs.size()) + xs);
  ASSERT_NO_FATAL_FAILURE(ExpectAnswer(tiny, 200));
  std::string wire;
  std::vector<std::pair<std::string, std::string>> more;
  for (int i = 0; i < 4; ++i) {
    more.push_back(MakeXorb(1 + i * 5, 1000 + i * 10));
    wire += PostHead(more.back().second, more.back().first.size()) + more.back().first;
  }
  ASSERT_TRUE(c.Send(wire));
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(i);
    ASSERT_NO_FATAL_FAILURE(ExpectAnswer(c.Read(), 200));
  }
  for (const auto& [bytes, hash] : more) {
    auto a = c.Exchange(RangeGet(hash, bytes.size() - 50, bytes.size() - 1));
    ASSERT_NO_FATAL_FAILURE(ExpectAnswer(a, 206));
    EXPECT_EQ(a->body, bytes.substr(bytes.size() - 50));
  }
}

}  // namespace
}  // namespace megackpt::hub
