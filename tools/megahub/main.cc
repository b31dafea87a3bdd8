// megahub: the MEGA hub service (HTTP) over a hub root folder, plus admin
// commands (tokens, garbage collection). A thin shell over megackpt::hub.
#include <microhttpd.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <thread>

#include "megackpt/config.h"  // MEGACKPT_VERSION
#include "megackpt/hub/server.h"
#include "megackpt/hub/store.h"

namespace {

using megackpt::hub::HubServer;
using megackpt::hub::HubServerOptions;
using megackpt::hub::HubStore;

// The one error line of megahub: "megahub: error: Code: message" on stderr.
// Returns the exit code: 2 for InvalidArgument (usage), else 1.
int ReportError(const megackpt::Status& s) {
  std::fprintf(stderr, "megahub: error: %s\n", s.ToString().c_str());
  return s.code() == megackpt::StatusCode::kInvalidArgument ? 2 : 1;
}

int Serve(const std::string& root, HubServerOptions options) {
  // Block the shutdown signals in every thread; one thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  auto store = HubStore::Open(root);
  if (!store.ok()) {
    return ReportError(store.status());
  }
  std::shared_ptr<HubStore> shared(std::move(*store));
  auto server = HubServer::Create(shared, options);
  if (!server.ok()) {
    return ReportError(server.status());
  }
  auto port = (*server)->Bind();
  if (!port.ok()) {
    return ReportError(port.status());
  }
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    timespec tick{0, 200 * 1000 * 1000};
    while (!done) {
      int sig = sigtimedwait(&signals, nullptr, &tick);
      if (sig == SIGINT || sig == SIGTERM) {
        std::fprintf(stderr, "megahub: signal %d, shutting down\n", sig);
        (*server)->Stop();
        break;
      }
    }
  });
  std::printf("listening on %s:%d\n", options.host.c_str(), *port);
  std::fflush(stdout);
  megackpt::Status s = (*server)->Serve();
  done = true;
  waiter.join();
  server->reset();  // finish in-flight work before the store (and its DB) closes
  shared.reset();
  if (!s.ok()) {
    return ReportError(s);
  }
  std::fprintf(stderr, "megahub: stopped\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "megahub: the MEGA hub service. Repositories, buckets and Xet CAS content over HTTP,\n"
      "speaking the routes the MEGA client uses (docs/hub.md).\n\n"
      "Examples:\n"
      "  megahub serve --root /data/hub --port 8080       serve on 127.0.0.1:8080\n"
      "  megahub serve --root /tmp/hub --port 0           pick a free port (printed)\n"
      "  megahub token create --root /data/hub --scope write --namespace org\n"
      "  megahub gc --root /data/hub --grace-seconds 3600",
      "megahub"};
  app.require_subcommand(1);
  app.footer("Exit codes: 0 success; 1 failure; 2 usage error.");
  app.set_version_flag("--version", std::string("megahub " MEGACKPT_VERSION " (libmicrohttpd ") +
                                        MHD_get_version() + ")");
  int exit_code = 0;

  HubServerOptions options;
  std::string root;
  CLI::App* serve =
      app.add_subcommand("serve", "Serve a hub root over HTTP/1.1 until SIGINT/SIGTERM");
  serve->add_option("--root", root, "Hub root folder (created when missing)")->required();
  serve->add_option("--port", options.port, "TCP port; 0 picks a free one")->default_val(8080);
  serve->add_option("--host", options.host, "Address to listen on")->default_val("127.0.0.1");
  serve
      ->add_option("--threads", options.threads,
                   "Event threads serving the connections (an idle connection holds none)")
      ->default_val(64);
  serve
      ->add_option("--listen-backlog", options.listen_backlog,
                   "Backlog of the listening socket (clamped by net.core.somaxconn)")
      ->default_val(1024);
  serve
      ->add_option("--max-connections", options.max_connections,
                   "Connections open at once; more are closed at once")
      ->default_val(1024);
  serve
      ->add_option("--max-connections-per-client", options.max_connections_per_client,
                   "Connections open at once from one client IP address")
      ->default_val(256);
  serve
      ->add_option("--header-timeout", options.header_timeout_seconds,
                   "Seconds a connection may stay silent while sending request headers or idle")
      ->default_val(30);
  serve
      ->add_option("--read-timeout", options.read_timeout_seconds,
                   "Seconds a connection may stay silent while sending a body or being answered")
      ->default_val(60);
  serve->add_option("--max-object-bytes", options.max_object_bytes,
                    "Largest xorb / blob / upload-part / shard body (413 beyond)");
  serve->add_option("--max-json-bytes", options.max_json_bytes,
                    "Largest JSON / NDJSON body (413 beyond)");
  serve->add_option("--part-size", options.upload_part_size, "Part size for /api/uploads");
  serve->add_flag("--log", options.log_requests, "Log every request to stderr");
  serve->callback([&] { exit_code = Serve(root, options); });

  CLI::App* token = app.add_subcommand("token", "Manage bearer tokens");
  token->require_subcommand(1);
  std::string scope = "read", ns, description;
  CLI::App* create = token->add_subcommand("create", "Create a token and print it (stored hashed)");
  create->add_option("--root", root, "Hub root folder")->required();
  create->add_option("--scope", scope, "read or write")->check(CLI::IsMember({"read", "write"}));
  create->add_option("--namespace", ns, "Limit the token to one namespace");
  create->add_option("--description", description, "A note stored with the token");
  create->callback([&] {
    auto store = HubStore::Open(root);
    if (!store.ok()) {
      exit_code = ReportError(store.status());
      return;
    }
    auto t = (*store)->CreateToken(
        scope == "write" ? megackpt::hub::TokenScope::kWrite : megackpt::hub::TokenScope::kRead,
        ns.empty() ? std::nullopt : std::optional<std::string>(ns), description);
    if (!t.ok()) {
      exit_code = ReportError(t.status());
      return;
    }
    std::printf("%s\n", t->c_str());
  });

  double grace = 3600;
  CLI::App* gc =
      app.add_subcommand("gc", "Delete content no commit, bucket or recent upload references");
  gc->add_option("--root", root, "Hub root folder")->required();
  gc->add_option("--grace-seconds", grace, "Keep content uploaded less than this long ago")
      ->default_val(3600);
  gc->callback([&] {
    auto store = HubStore::Open(root);
    if (!store.ok()) {
      exit_code = ReportError(store.status());
      return;
    }
    auto r = (*store)->CollectGarbage(grace);
    if (!r.ok()) {
      exit_code = ReportError(r.status());
      return;
    }
    std::printf(
        "live files %llu, xorbs kept %llu, xorbs deleted %llu (%llu bytes), expired uploads %llu\n",
        static_cast<unsigned long long>(r->live_files),
        static_cast<unsigned long long>(r->cas.xorbs_kept),
        static_cast<unsigned long long>(r->cas.xorbs_deleted),
        static_cast<unsigned long long>(r->cas.bytes_deleted),
        static_cast<unsigned long long>(r->expired_uploads));
  });

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success))
      return app.exit(e);  // --help, --version
    std::fprintf(stderr, "megahub: error: %s (run with --help for the options)\n", e.what());
    return 2;  // usage error
  }
  return exit_code;
}
