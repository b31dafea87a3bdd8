// MegaStorageWriter/Reader over mega:// under mpirun (tests/cmake/dcp.cmake;
// main() in tests/dist_mpi_gtest_main.cc): rank 0 starts a real `megahub` on
// loopback and shares its endpoint and a write token; every MPI process saves
// its part to mega://org/...@main/ckpt -> exactly one new commit; the
// checkpoint loads back resharded on the MPI ranks and in one process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>

#include "dcp/synthetic.h"
#include "hub_test_server.h"
#include "megackpt/dcp/checkpoint.h"
#include "megackpt/dcp/mega_storage.h"
#include "megackpt/dist/process_group.h"
#include "megackpt/hub/client.h"
#include "megackpt/hub/mega_fs.h"

namespace megackpt::dcp {
namespace {

using ::megackpt::testing::CreateToken;
using ::megackpt::testing::MegahubProcess;
using ::megackpt::testing::TempDir;

TEST(MegaStorageHubMpi, MultiProcessSaveIsOneCommitAndLoadsResharded) {
  dist::ProcessGroupOptions po;
  po.timeout = std::chrono::seconds(60);
  auto group = dist::NewMpiProcessGroup(po);
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  dist::ProcessGroup& g = **group;
  if (g.world_size() < 2) GTEST_SKIP() << "run under mpirun -np 2 or more";

  // Rank 0 owns the server; everyone learns "endpoint token".
  std::unique_ptr<TempDir> root;
  std::unique_ptr<MegahubProcess> server;
  std::string shared;
  if (g.rank() == 0) {
    root = std::make_unique<TempDir>("mshub-mpi");
    server = std::make_unique<MegahubProcess>();
    const std::string token = CreateToken(root->path(), "write");
    if (!token.empty() && server->Start(root->path())) shared = server->endpoint() + " " + token;
  }
  auto b = g.Broadcast(shared, 0);
  ASSERT_TRUE(b.ok());
  ASSERT_FALSE(b->empty()) << "rank 0 could not start megahub";
  const std::string endpoint = b->substr(0, b->find(' '));
  const std::string token = b->substr(b->find(' ') + 1);
  auto hub = hub::OpenRemoteHub(endpoint, token);
  ASSERT_TRUE(hub.ok()) << hub.status().ToString();
  auto fs = hub::NewMegaFileSystem(*hub);

  const std::string repo = "org/mpi" + std::to_string(getpid());
  auto repo_b = g.Broadcast(repo, 0);
  ASSERT_TRUE(repo_b.ok());
  const std::string path = "mega://" + *repo_b + "@main/ckpt/step-1";
  if (g.rank() == 0) {
    hub::RepoSpec spec;
    spec.ns = "org";
    spec.name = repo_b->substr(4);
    ASSERT_TRUE((*hub)->CreateRepo(spec, false).ok());
  }
  ASSERT_TRUE(g.Barrier().ok());
  auto commits = [&]() -> size_t {
    auto l = (*hub)->ListCommits(*repo_b, "main", 1000);
    return l.ok() ? l->size() : 0;
  };
  const size_t before = commits();

  const synthetic::Spec spec = synthetic::MakeSpec(11, 3 << 20);
  const int world = g.world_size();
  Status saved = [&]() -> Status {
    MEGA_ASSIGN_OR_RETURN(StateDict sd, synthetic::BuildRankState(spec, world, g.rank(), 0, true));
    MegaStorageWriterOptions o;
    o.fs = fs;
    MegaStorageWriter writer(path, std::nullopt, o);
    return Save(sd, writer, &g);
  }();
  EXPECT_TRUE(saved.ok()) << saved.ToString();
  ASSERT_TRUE(g.Barrier().ok());
  EXPECT_EQ(commits(), before + 1) << "a save of " << world << " processes must be one commit";

  // Resharded load on the MPI ranks (another layout of every tensor).
  Status loaded = [&]() -> Status {
    MEGA_ASSIGN_OR_RETURN(StateDict sd, synthetic::BuildRankState(spec, world, g.rank(), 1, false));
    MegaStorageReaderOptions o;
    o.fs = fs;
    MegaStorageReader reader(path, o);
    MEGA_RETURN_IF_ERROR(Load(sd, reader, &g));
    return synthetic::VerifyRankState(spec, sd);
  }();
  EXPECT_TRUE(loaded.ok()) << loaded.ToString();
  // And in one process (world 1).
  if (g.rank() == 0) {
    auto sd = synthetic::BuildRankState(spec, 1, 0, 1, false);
    ASSERT_TRUE(sd.ok());
    MegaStorageReaderOptions o;
    o.fs = fs;
    MegaStorageReader reader(path, o);
    Status s = Load(*sd, reader);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(synthetic::VerifyRankState(spec, *sd).ok());
  }
  ASSERT_TRUE(g.Barrier().ok());
  if (server) server->Stop();
}

}  // namespace
}  // namespace megackpt::dcp
