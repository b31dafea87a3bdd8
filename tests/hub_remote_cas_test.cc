// The CAS backend conformance suite (src/cas/backend_conformance.h) against
// the hub's RemoteCasBackend talking to a real `megahub serve` child process
// on loopback (a fresh hub root per test), plus the garbage-collection race
// checks: content that is uploaded but not yet recorded or committed must
// survive a GC that runs meanwhile (docs/hub.md, "Garbage collection").
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "cas/backend_conformance.h"
#include "hub/http_client.h"
#include "hub/remote_cas.h"
#include "hub_test_server.h"
#include "megackpt/cas/xorb.h"
#include "megackpt/hub/store.h"

namespace megackpt {
namespace {

using ::megackpt::testing::CreateToken;
using ::megackpt::testing::MegahubBinary;
using ::megackpt::testing::MegahubProcess;
using ::megackpt::testing::RunCommand;
using ::megackpt::testing::TempDir;

// A RemoteCasBackend that owns the megahub process it talks to.
struct RemoteHubBackend {
  MegahubProcess server;
  std::shared_ptr<cas::CasBackend> backend;
};

Result<std::shared_ptr<cas::CasBackend>> StartRemoteBackend(const std::string& root) {
  std::string token = CreateToken(root, "write");
  if (token.empty()) return UnavailableError("megahub token create failed for " + root);
  auto holder = std::make_shared<RemoteHubBackend>();
  if (!holder->server.Start(root))
    return UnavailableError("megahub serve did not start on " + root);
  hub::RemoteOptions options;
  options.max_retries = 1;
  auto http = std::make_shared<hub::HttpClient>(holder->server.endpoint(), token, options);
  holder->backend = hub::NewRemoteCasBackend(http);
  // Aliasing: the backend pointer keeps the process alive; the last owner
  // stops it (SIGTERM).
  return std::shared_ptr<cas::CasBackend>(holder, holder->backend.get());
}

}  // namespace
}  // namespace megackpt

namespace megackpt::cas::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(RemoteHub, CasBackendConformanceTest,
                         ::testing::Values(BackendFactory{"remote_megahub", &StartRemoteBackend,
                                                          /*lists_and_deletes=*/false}),
                         BackendFactoryName);

}  // namespace
}  // namespace megackpt::cas::testing

namespace megackpt {
namespace {

using ::megackpt::test_util::RandomData;

// The hub store itself: an upload whose content is in the CAS but not yet
// recorded (between ContentUpload::Close and RecordContent, or between a
// shard import and its record) must not be collected by a GC that runs in
// that window.
TEST(HubGcRaceTest, UnrecordedUploadSurvivesGcAndCommits) {
  TempDir dir("hub-gc-race");
  auto store = hub::HubStore::Open(dir.path() + "/root", {.sync = false});
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  hub::RepoSpec spec;
  spec.ns = "org";
  spec.name = "m";
  ASSERT_TRUE((*store)->CreateRepo(spec).ok());

  std::string data = RandomData(300'000, 7);
  auto up = (*store)->BeginUpload("in-flight");
  ASSERT_TRUE(up.ok());
  (*up)->set_on_close(nullptr);  // the window: stored in the CAS, not yet recorded
  ASSERT_TRUE((*up)->Append(std::as_bytes(std::span(data))).ok());
  ASSERT_TRUE((*up)->Close().ok());
  hub::FileEntry entry = (*up)->entry();

  auto gc = (*store)->CollectGarbage(/*grace_seconds=*/3600);
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_EQ(gc->cas.files_deleted, 0u) << "GC deleted an upload in flight";
  EXPECT_EQ(gc->cas.xorbs_deleted, 0u);

  ASSERT_TRUE((*store)->RecordContent(entry, true).ok());
  hub::CommitRequest cr;
  cr.repo = "org/m";
  cr.message = "add";
  hub::CommitOperation op;
  op.path = "w.bin";
  op.entry = entry;
  cr.ops.push_back(op);
  auto c = (*store)->Commit(cr);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto f = (*store)->GetFile("org/m", c->id, "w.bin");
  ASSERT_TRUE(f.ok());
  auto file = (*store)->OpenContent(*f, "w.bin");
  ASSERT_TRUE(file.ok());
  std::string back(data.size(), '\0');
  ASSERT_TRUE((*file)->ReadAt(0, std::as_writable_bytes(std::span(back))).ok());
  EXPECT_TRUE(back == data);

  // Once committed it is live; an uncommitted orphan still goes after the
  // grace period (grace 0 here).
  auto orphan = (*store)->BeginUpload("orphan");
  ASSERT_TRUE(orphan.ok());
  (*orphan)->set_on_close(nullptr);
  std::string other = RandomData(200'000, 8);
  ASSERT_TRUE((*orphan)->Append(std::as_bytes(std::span(other))).ok());
  ASSERT_TRUE((*orphan)->Close().ok());
  auto gc0 = (*store)->CollectGarbage(3600);  // first sight: kept, adopted
  ASSERT_TRUE(gc0.ok());
  EXPECT_EQ(gc0->cas.files_deleted, 0u);
  EXPECT_TRUE(*(*store)->HasContent((*orphan)->entry().xet_hash));
  auto gc1 = (*store)->CollectGarbage(0);  // grace over: collected
  ASSERT_TRUE(gc1.ok());
  EXPECT_EQ(gc1->cas.files_deleted, 1u);
  EXPECT_FALSE(*(*store)->HasContent((*orphan)->entry().xet_hash));
  EXPECT_TRUE(*(*store)->HasContent(entry.xet_hash));
}

// Through a real megahub: xorbs of a remote upload in flight (sent, the
// shard not yet) survive `megahub gc` run by another process meanwhile, and
// the upload then completes.
TEST(HubGcRaceTest, RemoteXorbsInFlightSurviveConcurrentGc) {
  TempDir dir("hub-gc-remote");
  std::string root = dir.path() + "/root";
  auto backend = StartRemoteBackend(root);
  ASSERT_TRUE(backend.ok()) << backend.status().ToString();
  cas::XorbBuilder b;
  std::vector<cas::HashAndSize> leaves;
  std::vector<cas::MerkleHash> hashes;
  for (int i = 0; i < 3; ++i) {
    std::string d = RandomData(20'000 + i, 100 + i);
    std::string rec;
    cas::AppendChunkRecord(std::as_bytes(std::span(d)), cas::CompressionPolicy::kAuto, &rec);
    cas::MerkleHash h = cas::ChunkHash(std::as_bytes(std::span(d)));
    b.Add(h, static_cast<uint32_t>(d.size()), rec);
    leaves.push_back({h, d.size()});
    hashes.push_back(h);
  }
  auto x = b.Finish();
  std::string serialized(reinterpret_cast<const char*>(x.serialized.data()), x.serialized.size());
  ASSERT_TRUE((*backend)->PutXorb(serialized, x.layout).ok());

  int rc = -1;
  std::string out =
      RunCommand(MegahubBinary() + " gc --root '" + root + "' --grace-seconds 3600", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(*(*backend)->HasXorb(x.layout.xorb_hash)) << out;

  cas::FileReconstruction f;
  cas::ReconstructionTerm t;
  t.xorb_hash = x.layout.xorb_hash;
  t.chunk_start = 0;
  t.chunk_end = 3;
  for (const auto& c : x.layout.chunks) t.unpacked_bytes += c.unpacked_bytes;
  t.verification_hash = cas::RangeVerificationHash(hashes);
  f.terms.push_back(t);
  f.size = t.unpacked_bytes;
  f.file_hash = cas::FileHash(leaves);
  ASSERT_TRUE((*backend)->PutFile(f).ok());
  auto got = (*backend)->GetFile(f.file_hash);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, f);

  // The shard import recorded the content: a second GC keeps it too.
  out = RunCommand(MegahubBinary() + " gc --root '" + root + "' --grace-seconds 3600", &rc);
  ASSERT_EQ(rc, 0) << out;
  EXPECT_TRUE(*(*backend)->HasFile(f.file_hash));
}

}  // namespace
}  // namespace megackpt
