// Integration tests of the CAS engine: the dedup scenario of issue 5 (a
// synthetic checkpoint, a 10%-changed second version, a re-sharded third) and
// two processes uploading the same content at once.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <set>

#include "cas/dedup_scenario.h"
#include "core/test_files.h"
#include "megackpt/cas/chunker.h"
#include "megackpt/cas/store.h"

namespace megackpt::cas {
namespace {

using ::megackpt::test_util::TempDir;

TEST(CasDedupTest, CheckpointVersionsAndResharding) {
  TempDir dir;
  auto store = CasStore::OpenLocal(dir.path(), {}, {.create = true, .sync = false});
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  scenario::Options opts;
  opts.total_bytes = 64ull << 20;
  auto report = scenario::Run(**store, opts, /*verify=*/true);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  std::printf("%s", report->ToString().c_str());
  ASSERT_EQ(report->phases.size(), 3u);
  const auto& v1 = report->phases[0];
  const auto& v2 = report->phases[1];
  const auto& v3 = report->phases[2];
  // v1 is all new (a tiny amount of repetition inside is allowed).
  EXPECT_GT(v1.new_fraction(), 0.95);
  // v2: about the changed share of bytes is new, and at most 15%.
  double changed = static_cast<double>(report->changed_tensor_bytes) / v2.bytes;
  EXPECT_GT(changed, 0.08);
  EXPECT_GE(v2.new_fraction(), changed * 0.95);
  EXPECT_LE(v2.new_fraction(), 0.15);
  // v3: the same tensors in different files: mostly deduplicated.
  EXPECT_LE(v3.new_fraction(), 0.05);
  auto stats = (*store)->Stat();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->files, static_cast<uint64_t>(opts.shards * 2 + opts.reshards));
  EXPECT_GT(stats->dedup_ratio(), 2.5);
  std::printf(
      "store: %llu files, %.1f MiB logical, %.1f MiB unique, %.1f MiB on disk, dedup %.2fx\n",
      static_cast<unsigned long long>(stats->files), stats->logical_bytes / 1048576.0,
      stats->unpacked_bytes / 1048576.0, stats->stored_bytes / 1048576.0, stats->dedup_ratio());
  EXPECT_TRUE((*store)->Verify().ok());

  // Dropping v1 and v2 keeps v3 intact and frees the chunks only they used.
  std::vector<MerkleHash> live = report->files[2];
  auto gc = (*store)->GarbageCollect({.live_files = live});
  ASSERT_TRUE(gc.ok()) << gc.status().ToString();
  EXPECT_EQ(gc->files_deleted, static_cast<uint64_t>(opts.shards * 2));
  EXPECT_GT(gc->xorbs_deleted + gc->xorbs_kept, 0u);
  EXPECT_TRUE((*store)->Verify().ok());
  auto after = (*store)->Stat();
  EXPECT_LE(after->unpacked_bytes, stats->unpacked_bytes);
}

std::string Data(uint64_t seed, size_t n) {
  std::string out(n, '\0');
  uint64_t s = seed;
  for (size_t i = 0; i + 8 <= n; i += 8) {
    s += 0x9E3779B97F4A7C15ull;
    uint64_t z = s;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(out.data() + i, &z, 8);
  }
  return out;
}

std::set<MerkleHash> ChunkHashes(const std::string& data) {
  std::set<MerkleHash> out;
  uint64_t prev = 0;
  for (uint64_t end : ChunkBoundaries(std::as_bytes(std::span(data)))) {
    out.insert(ChunkHash(std::as_bytes(std::span(data)).subspan(prev, end - prev)));
    prev = end;
  }
  return out;
}

// Forks `n` children that wait on a pipe, then upload data[i] to the store at
// once (small xorbs, so the uploads commit many xorbs each and interleave).
// Returns the children's exit codes.
std::vector<int> UploadConcurrently(const std::string& dir, const std::vector<std::string>& data) {
  int go[2];
  EXPECT_EQ(::pipe(go), 0);
  std::vector<pid_t> pids;
  for (size_t i = 0; i < data.size(); ++i) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(go[1]);
      char c;
      if (::read(go[0], &c, 1) != 1) ::_exit(3);
      ThreadPool pool(2);  // the parent's threads do not exist in the child
      CasStoreOptions opts;
      opts.pool = &pool;
      opts.max_xorb_bytes = 256u << 10;
      auto store = CasStore::OpenLocal(dir, opts, {.create = true, .sync = false});
      if (!store.ok()) ::_exit(4);
      auto r = (*store)->Upload(std::as_bytes(std::span(data[i])));
      if (!r.ok()) {
        std::fprintf(stderr, "child %zu: %s\n", i, r.status().ToString().c_str());
        ::_exit(5);
      }
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  ::close(go[0]);
  std::string start(data.size(), 'g');
  EXPECT_EQ(::write(go[1], start.data(), start.size()), static_cast<ssize_t>(start.size()));
  ::close(go[1]);
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status));
  }
  return codes;
}

TEST(CasConcurrencyTest, TwoProcessesUploadingTheSameContentStoreOneCopy) {
  for (int round = 0; round < 2; ++round) {
    TempDir dir;
    std::string shared = Data(round + 1, 12u << 20);
    // Round 0: identical files. Round 1: same content, different tails.
    std::vector<std::string> data = {shared, shared};
    if (round == 1) {
      data[0] += "tail of file A";
      data[1] += "tail of file B, a little longer";
    }
    std::vector<int> codes = UploadConcurrently(dir.path(), data);
    ASSERT_EQ(codes, std::vector<int>(data.size(), 0)) << "round " << round;

    auto store = CasStore::OpenLocal(dir.path(), {}, {.create = false, .sync = false});
    ASSERT_TRUE(store.ok());
    std::set<MerkleHash> unique;
    for (const auto& d : data) {
      auto h = ChunkHashes(d);
      unique.insert(h.begin(), h.end());
    }
    auto stats = (*store)->Stat();
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->chunks, unique.size()) << "round " << round << ": a chunk was stored twice";
    EXPECT_EQ(stats->files, round == 0 ? 1u : 2u);
    EXPECT_EQ(stats->referenced_xorbs, stats->xorbs);
    auto files = (*store)->backend().ListFiles();
    ASSERT_TRUE(files.ok());
    for (const MerkleHash& f : *files) {
      auto got = (*store)->Read(f);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      EXPECT_TRUE(*got == data[0] || *got == data[1]);
    }
    EXPECT_TRUE((*store)->Verify().ok());
    std::printf("round %d: %llu chunks stored once, %llu xorbs, %llu files\n", round,
                static_cast<unsigned long long>(stats->chunks),
                static_cast<unsigned long long>(stats->xorbs),
                static_cast<unsigned long long>(stats->files));
  }
}

}  // namespace
}  // namespace megackpt::cas
