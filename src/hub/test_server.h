// Test helper: a megahub HubServer served in-process on a loopback port, over
// a fresh store in a temp folder, with one write token. For the hub layer's
// unit tests (the integration tests run the megahub binary: tests/hub_test_server.h).
#ifndef MEGACKPT_SRC_HUB_TEST_SERVER_H_
#define MEGACKPT_SRC_HUB_TEST_SERVER_H_

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "megackpt/hub/server.h"
#include "megackpt/hub/store.h"

namespace megackpt::hub::testing {

// `n` pseudo-random bytes from `seed` (deterministic).
inline std::string RandomText(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

// A fixture base: SetUp opens a store under /tmp/<prefix>-XXXXXX/hub (no
// fsync), creates a write token and serves it on 127.0.0.1; TearDown stops the
// server and removes the folder.
class InProcessHubTest : public ::testing::Test {
 protected:
  explicit InProcessHubTest(std::string prefix) : prefix_(std::move(prefix)) {}

  void SetUp() override {
    std::string tmpl = "/tmp/" + prefix_ + "-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    root_ = tmpl;
    HubStoreOptions so;
    so.sync = false;
    auto store = HubStore::Open(root_ + "/hub", so);
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    auto token = (*store)->CreateToken(TokenScope::kWrite, std::nullopt);
    ASSERT_TRUE(token.ok()) << token.status().ToString();
    token_ = *token;
    auto server = HubServer::Create(std::shared_ptr<HubStore>(std::move(*store)));
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    auto port = server_->Bind();
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    port_ = *port;
    endpoint_ = "http://127.0.0.1:" + std::to_string(port_);
    serving_ = std::thread([this] { (void)server_->Serve(); });
  }

  void TearDown() override {
    if (server_) server_->Stop();
    if (serving_.joinable()) serving_.join();
    server_.reset();
    std::error_code ec;
    if (!root_.empty()) std::filesystem::remove_all(root_, ec);
  }

  std::string prefix_, root_, token_, endpoint_;
  int port_ = 0;
  std::unique_ptr<HubServer> server_;
  std::thread serving_;
};

}  // namespace megackpt::hub::testing

#endif  // MEGACKPT_SRC_HUB_TEST_SERVER_H_
