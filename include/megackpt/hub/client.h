// HubConnection: one interface to a MEGA hub, with two implementations:
//  - embedded: a HubStore in this process (endpoint `file:///DIR`);
//  - remote: an HTTP/1.1 client of `megahub` (endpoint `http://host:port`),
//    authenticated with a bearer token. Uploads chunk and deduplicate locally
//    with the CAS engine and send only the xorbs the hub lacks (Xet CAS routes);
//    reads use HTTP Range requests, so only the requested bytes travel.
// The mega:// filesystem, transactions and the CLI are written against this
// interface, so they behave the same in both modes.
//
// Environment (megatensors' names): MEGA_ENDPOINT (default: embedded hub at
// $MEGA_HOME/hub; MEGA_HOME defaults to $HOME/.cache/mega), MEGA_TOKEN.
//
// Thread-safety: every method may be called from several threads at once.
#ifndef MEGACKPT_HUB_CLIENT_H_
#define MEGACKPT_HUB_CLIENT_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/file.h"
#include "megackpt/core/status.h"
#include "megackpt/hub/mega_uri.h"
#include "megackpt/hub/store.h"
#include "megackpt/hub/types.h"

namespace megackpt::hub {

class HubConnection {
 public:
  virtual ~HubConnection() = default;

  // "embedded hub /path" or "hub http://host:port".
  virtual std::string Describe() const = 0;
  virtual bool is_remote() const = 0;
  // Remote: HTTP bytes this connection received so far (headers excluded),
  // e.g. to check that a slice read downloads about the slice. Embedded: 0.
  virtual uint64_t bytes_received() const { return 0; }

  // ---- repositories (ids are "ns/name") ----
  virtual Result<RepoInfo> GetRepo(std::string_view repo) = 0;
  virtual Result<RepoInfo> CreateRepo(const RepoSpec& spec, bool exist_ok) = 0;
  virtual Status DeleteRepo(std::string_view repo) = 0;
  // Branch, tag or commit id -> 40-hex commit id. NotFound naming it.
  virtual Result<std::string> ResolveRevision(std::string_view repo, std::string_view revision) = 0;
  virtual Result<std::vector<RefInfo>> ListRefs(std::string_view repo) = 0;
  virtual Result<RefInfo> CreateBranch(std::string_view repo, std::string_view name,
                                       std::string_view revision) = 0;
  // Newest first, at most `limit`.
  virtual Result<std::vector<CommitInfo>> ListCommits(std::string_view repo,
                                                      std::string_view revision, size_t limit) = 0;
  // Every file of a commit whose path starts with `prefix`, sorted by path.
  virtual Result<std::vector<FileEntry>> ListFiles(std::string_view repo, std::string_view commit,
                                                   std::string_view prefix = "") = 0;
  // NotFound when the path is not a file of the commit.
  virtual Result<FileEntry> GetFile(std::string_view repo, std::string_view commit,
                                    std::string_view path) = 0;
  // See HubStore::Commit for semantics and errors (Aborted "conflict: ...").
  virtual Result<CommitInfo> Commit(const CommitRequest& request) = 0;

  // ---- content ----
  // A streaming upload (no local temp copy); after Close(), entry() holds
  // {size, sha256, xet_hash} ready for a CommitOperation or bucket add.
  virtual Result<std::unique_ptr<ContentUpload>> BeginUpload(std::string name) = 0;
  // Random access to a stored file. `where` locates it for the remote client
  // (a repo URI whose revision is the commit id, or a bucket URI with the
  // path); each ReadAt fetches only the bytes it covers.
  virtual Result<std::unique_ptr<RandomAccessFile>> OpenFile(const MegaUri& where,
                                                             const FileEntry& entry) = 0;
  // Random access to uploaded content by its hash alone (e.g. staged, not
  // yet committed). Remote: through the CAS routes, fetching only the xorb
  // ranges each ReadAt covers (chunks checked against their hashes).
  virtual Result<std::unique_ptr<RandomAccessFile>> OpenContent(const FileEntry& entry,
                                                                std::string name) = 0;

  // ---- buckets ----
  virtual Result<BucketInfo> GetBucket(std::string_view bucket) = 0;
  virtual Result<BucketInfo> CreateBucket(std::string_view ns, std::string_view name,
                                          bool is_private, bool exist_ok) = 0;
  virtual Status DeleteBucket(std::string_view bucket) = 0;
  virtual Status BucketBatch(std::string_view bucket, const std::vector<BucketOperation>& ops) = 0;
  virtual Result<std::vector<BucketEntry>> ListBucket(std::string_view bucket,
                                                      std::string_view prefix = "") = 0;
  virtual Result<BucketEntry> GetBucketEntry(std::string_view bucket, std::string_view path) = 0;
};

struct RemoteOptions {
  // Connections kept per host (also the parallelism of uploads/downloads).
  int max_connections = 8;
  // Retries of transient failures (connection errors, 408, 429, 5xx) with
  // exponential backoff starting at `initial_backoff_ms`, capped at 8 s.
  int max_retries = 5;
  int initial_backoff_ms = 100;
  int connect_timeout_seconds = 10;
  int io_timeout_seconds = 120;
};

// An embedded hub at `root` (created when missing).
Result<std::shared_ptr<HubConnection>> OpenEmbeddedHub(const std::string& root);
// A remote hub. `token` may be empty (anonymous: public reads only).
Result<std::shared_ptr<HubConnection>> OpenRemoteHub(const std::string& endpoint,
                                                     const std::string& token,
                                                     const RemoteOptions& options = {});

// The endpoint from the environment: MEGA_ENDPOINT, else
// "file://" + $MEGA_HOME/hub (MEGA_HOME defaults to $HOME/.cache/mega).
std::string DefaultEndpoint();

// Connects to `endpoint` ("" = DefaultEndpoint()) with `token` (nullopt =
// $MEGA_TOKEN). `file://DIR` is embedded, `http(s)://...` remote. Connections
// are shared per (endpoint, token) within the process. InvalidArgument for
// any other scheme.
Result<std::shared_ptr<HubConnection>> ConnectHub(std::string_view endpoint = "",
                                                  std::optional<std::string> token = std::nullopt);

// Remote only: GET /api/stats of a megahub (server-side counters as JSON).
Result<std::string> FetchServerStats(const std::string& endpoint);

}  // namespace megackpt::hub

#endif  // MEGACKPT_HUB_CLIENT_H_
