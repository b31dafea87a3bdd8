// The conformance suite every CasBackend must pass (local directory here; the
// hub's remote backend and embedded store too). Include this header in exactly
// ONE .cc file of a gtest binary and instantiate it with a factory:
//
//   INSTANTIATE_TEST_SUITE_P(Local, CasBackendConformanceTest,
//       ::testing::Values(megackpt::cas::testing::BackendFactory{
//           "local", [](const std::string& dir) { return OpenLocalBackend(dir); }}),
//       megackpt::cas::testing::BackendFactoryName);
//
// The factory gets a fresh empty folder per test (a remote backend may ignore
// it and must then start empty).
#ifndef MEGACKPT_SRC_CAS_BACKEND_CONFORMANCE_H_
#define MEGACKPT_SRC_CAS_BACKEND_CONFORMANCE_H_

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cas/test_util.h"
#include "core/test_files.h"
#include "megackpt/cas/store.h"
#include "megackpt/cas/xorb.h"

namespace megackpt::cas::testing {

struct BackendFactory {
  std::string name;
  std::function<Result<std::shared_ptr<CasBackend>>(const std::string& dir)> make;
  // False for a backend whose listing and deletion are done server-side only
  // (the hub's remote CAS): those calls must then answer Unimplemented, and
  // the checks that need them are skipped.
  bool lists_and_deletes = true;
};

inline std::string BackendFactoryName(const ::testing::TestParamInfo<BackendFactory>& info) {
  return info.param.name;
}

class CasBackendConformanceTest : public ::testing::TestWithParam<BackendFactory> {
 protected:
  void SetUp() override {
    auto b = GetParam().make(dir_.File("store"));
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    backend_ = *b;
  }
  void TearDown() override { backend_.reset(); }

  // A xorb of `n` chunks; returns its bytes and layout and each chunk's data.
  struct Built {
    std::string serialized;
    XorbLayout layout;
    std::vector<std::string> chunks;
  };
  static Built MakeXorb(uint64_t seed, int n) {
    XorbBuilder b;
    Built out;
    for (int i = 0; i < n; ++i) {
      std::string d = (i % 2) ? std::string(3000 + i, static_cast<char>('a' + i))
                              : RandomBytes(seed * 100 + i, 5000 + i);
      std::string rec;
      AppendChunkRecord(std::as_bytes(std::span(d)), CompressionPolicy::kAuto, &rec);
      b.Add(ChunkHash(std::as_bytes(std::span(d))), static_cast<uint32_t>(d.size()), rec);
      out.chunks.push_back(d);
    }
    auto fin = b.Finish();
    out.serialized.assign(reinterpret_cast<const char*>(fin.serialized.data()),
                          fin.serialized.size());
    out.layout = fin.layout;
    return out;
  }

  static FileReconstruction FileOf(const Built& x, uint32_t start, uint32_t end) {
    FileReconstruction r;
    std::vector<HashAndSize> leaves;
    std::vector<MerkleHash> hashes;
    ReconstructionTerm t;
    t.xorb_hash = x.layout.xorb_hash;
    t.chunk_start = start;
    t.chunk_end = end;
    for (uint32_t c = start; c < end; ++c) {
      t.unpacked_bytes += x.layout.chunks[c].unpacked_bytes;
      leaves.push_back({x.layout.chunks[c].hash, x.layout.chunks[c].unpacked_bytes});
      hashes.push_back(x.layout.chunks[c].hash);
    }
    t.verification_hash = RangeVerificationHash(hashes);
    r.terms.push_back(t);
    r.size = t.unpacked_bytes;
    r.file_hash = FileHash(leaves);
    return r;
  }

  test_util::TempDir dir_{"cas-conformance"};  // outlives backend_
  std::shared_ptr<CasBackend> backend_;
};

TEST_P(CasBackendConformanceTest, PutAndReadXorb) {
  Built x = MakeXorb(1, 5);
  auto put = backend_->PutXorb(x.serialized, x.layout);
  ASSERT_TRUE(put.ok()) << put.status().ToString();
  EXPECT_TRUE(*put);
  EXPECT_TRUE(*backend_->HasXorb(x.layout.xorb_hash));
  EXPECT_EQ(*backend_->GetXorb(x.layout.xorb_hash), x.serialized);
  EXPECT_EQ(*backend_->GetXorbLayout(x.layout.xorb_hash), x.layout);
  EXPECT_EQ(*backend_->XorbSize(x.layout.xorb_hash), x.serialized.size());
  auto range = backend_->GetXorbRange(x.layout.xorb_hash, 10, 100);
  ASSERT_TRUE(range.ok());
  EXPECT_EQ(*range, x.serialized.substr(10, 100));
  std::string buf(50, '\0');
  ASSERT_TRUE(
      backend_->ReadXorbRange(x.layout.xorb_hash, 7, std::as_writable_bytes(std::span(buf))).ok());
  EXPECT_EQ(buf, x.serialized.substr(7, 50));
  EXPECT_EQ(backend_->GetXorbRange(x.layout.xorb_hash, x.serialized.size() - 1, 2).status().code(),
            StatusCode::kOutOfRange);
  auto list = backend_->ListXorbs();
  if (!GetParam().lists_and_deletes) {
    EXPECT_EQ(list.status().code(), StatusCode::kUnimplemented);
    return;
  }
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(*list, std::vector<MerkleHash>{x.layout.xorb_hash});
}

TEST_P(CasBackendConformanceTest, PutXorbIsIdempotentAndValidates) {
  Built x = MakeXorb(2, 3);
  EXPECT_TRUE(*backend_->PutXorb(x.serialized, x.layout));
  EXPECT_FALSE(*backend_->PutXorb(x.serialized, x.layout));
  XorbLayout wrong = x.layout;
  wrong.serialized_bytes += 1;
  EXPECT_EQ(backend_->PutXorb(x.serialized, wrong).status().code(), StatusCode::kInvalidArgument);
}

TEST_P(CasBackendConformanceTest, MissingObjectsAreNotFound) {
  MerkleHash h;
  h.bytes[3] = 3;
  EXPECT_FALSE(*backend_->HasXorb(h));
  EXPECT_FALSE(*backend_->HasFile(h));
  EXPECT_EQ(backend_->GetXorb(h).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(backend_->GetXorbLayout(h).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(backend_->GetXorbRange(h, 0, 1).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(backend_->GetFile(h).status().code(), StatusCode::kNotFound);
}

TEST_P(CasBackendConformanceTest, DedupIndexFollowsXorbs) {
  Built x = MakeXorb(3, 4);
  std::vector<MerkleHash> hashes;
  for (const auto& c : x.layout.chunks) hashes.push_back(c.hash);
  auto before = backend_->LookupChunks(hashes);
  ASSERT_TRUE(before.ok());
  for (const auto& f : *before) EXPECT_FALSE(f.has_value());
  ASSERT_TRUE(backend_->PutXorb(x.serialized, x.layout).ok());
  auto after = backend_->LookupChunks(hashes);
  ASSERT_TRUE(after.ok());
  for (size_t i = 0; i < hashes.size(); ++i) {
    ASSERT_TRUE((*after)[i].has_value());
    EXPECT_EQ((*after)[i]->xorb_hash, x.layout.xorb_hash);
    EXPECT_EQ(x.layout.chunks[(*after)[i]->chunk_index].hash, hashes[i]);
  }
  const MerkleHash dead[] = {x.layout.xorb_hash};
  if (!GetParam().lists_and_deletes) {
    EXPECT_EQ(backend_->DeleteXorbs(dead).code(), StatusCode::kUnimplemented);
    EXPECT_TRUE(*backend_->HasXorb(x.layout.xorb_hash));
    return;
  }
  ASSERT_TRUE(backend_->DeleteXorbs(dead).ok());
  EXPECT_FALSE(*backend_->HasXorb(x.layout.xorb_hash));
  auto gone = backend_->LookupChunks(hashes);
  ASSERT_TRUE(gone.ok());
  for (const auto& f : *gone) EXPECT_FALSE(f.has_value());
}

TEST_P(CasBackendConformanceTest, FilesNeedTheirXorbs) {
  Built x = MakeXorb(4, 4);
  FileReconstruction f = FileOf(x, 1, 3);
  EXPECT_EQ(backend_->PutFile(f).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(backend_->PutXorb(x.serialized, x.layout).ok());
  ASSERT_TRUE(backend_->PutFile(f).ok());
  ASSERT_TRUE(backend_->PutFile(f).ok());  // idempotent
  EXPECT_TRUE(*backend_->HasFile(f.file_hash));
  auto got = backend_->GetFile(f.file_hash);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, f);
  FileReconstruction bad = f;
  bad.size += 1;
  EXPECT_EQ(backend_->PutFile(bad).code(), StatusCode::kInvalidArgument);
  const MerkleHash files[] = {f.file_hash};
  if (!GetParam().lists_and_deletes) {
    EXPECT_EQ(backend_->ListFiles().status().code(), StatusCode::kUnimplemented);
    EXPECT_EQ(backend_->DeleteFiles(files).code(), StatusCode::kUnimplemented);
    EXPECT_TRUE(*backend_->HasFile(f.file_hash));
    return;
  }
  EXPECT_EQ(*backend_->ListFiles(), std::vector<MerkleHash>{f.file_hash});
  ASSERT_TRUE(backend_->DeleteFiles(files).ok());
  EXPECT_FALSE(*backend_->HasFile(f.file_hash));
  ASSERT_TRUE(backend_->DeleteFiles(files).ok());  // missing: ignored
}

TEST_P(CasBackendConformanceTest, ConcurrentPutsOfTheSameXorb) {
  Built x = MakeXorb(5, 6);
  std::vector<std::thread> threads;
  std::vector<int> created(8, -1);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto r = backend_->PutXorb(x.serialized, x.layout);
      created[t] = r.ok() ? (*r ? 1 : 0) : -1;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(std::count(created.begin(), created.end(), -1), 0);
  EXPECT_EQ(std::count(created.begin(), created.end(), 1), 1);
  EXPECT_EQ(*backend_->GetXorb(x.layout.xorb_hash), x.serialized);
}

TEST_P(CasBackendConformanceTest, StoreRoundTripThroughBackend) {
  auto store = CasStore::Open(backend_, {.max_xorb_bytes = 1u << 20});
  ASSERT_TRUE(store.ok());
  std::string data = RandomBytes(6, 3'000'000);
  auto r = (*store)->Upload(std::as_bytes(std::span(data)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(*(*store)->Read(r->file_hash) == data);
  EXPECT_TRUE(*(*store)->Read(r->file_hash, {123456, 777}) == data.substr(123456, 777));
  auto again = (*store)->Upload(std::as_bytes(std::span(data)));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->new_bytes, 0u);
  if (!GetParam().lists_and_deletes) {
    // Verification and GC need listings: the hub runs them itself.
    EXPECT_EQ((*store)->Verify().code(), StatusCode::kUnimplemented);
    return;
  }
  EXPECT_TRUE((*store)->Verify().ok());
  auto gc = (*store)->GarbageCollect({.live_files = std::vector<MerkleHash>{}});
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_EQ(gc->files_deleted, 1u);
  EXPECT_TRUE(backend_->ListXorbs()->empty());
}

}  // namespace megackpt::cas::testing

#endif  // MEGACKPT_SRC_CAS_BACKEND_CONFORMANCE_H_
