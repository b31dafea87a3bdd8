// Hub commands: push, pull, ls, rm, log (and `bench hub`). Thin shells over
// megackpt::hub (HubConnection, HubTransaction, MegaFileSystem).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>

#include "hub_bench.h"  // bench/
#include "hub_progress.h"
#include "megackpt/commands.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/thread_pool.h"
#include "megackpt/hub/client.h"
#include "megackpt/hub/mega_fs.h"
#include "megackpt/hub/mega_uri.h"
#include "megackpt/hub/transaction.h"

namespace megackpt::cli {
namespace {

using json = nlohmann::json;

struct HubFlags {
  std::string endpoint;  // "" = MEGA_ENDPOINT / default
  std::string token;     // "" = MEGA_TOKEN
  bool json = false;
  bool quiet = false;
  int threads = 4;
};

void AddHubFlags(CLI::App* cmd, HubFlags* f) {
  cmd->add_option("--endpoint", f->endpoint,
                  "Hub endpoint: http://HOST:PORT (megahub) or file:///DIR (embedded); "
                  "default $MEGA_ENDPOINT, else $MEGA_HOME/hub");
  cmd->add_option("--token", f->token, "Bearer token (default $MEGA_TOKEN)");
  cmd->add_flag("--json", f->json, "Print the result as JSON");
  cmd->add_flag("-q,--quiet", f->quiet, "No progress output on stderr");
}

int Fail(const Status& s) { return ReportError("", s, ExitCodeFor(s)); }

Result<std::shared_ptr<hub::HubConnection>> Connect(const HubFlags& f) {
  std::optional<std::string> token;
  if (!f.token.empty()) token = f.token;
  return hub::ConnectHub(f.endpoint, token);
}

// ---- push ----

int Push(const std::string& dir, const std::string& target, const HubFlags& f,
         const std::string& message, bool is_private, bool rebase) {
  const double start = NowSeconds();  // for the "seconds" and "gbps" JSON keys
  auto uri = hub::ParseMegaUri(target);
  if (!uri.ok()) return Fail(uri.status());
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    return Fail(InvalidArgumentError("push: '" + dir + "' is not a folder"));
  }
  std::vector<std::pair<std::string, uint64_t>> files;  // relative path, size
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (!it->is_regular_file(ec)) continue;
    files.emplace_back(std::filesystem::relative(it->path(), dir, ec).generic_string(),
                       it->file_size(ec));
  }
  if (ec) return Fail(ErrnoToStatus("push: listing " + dir, ec.value()));
  std::sort(files.begin(), files.end());
  uint64_t total = 0;
  for (const auto& [p, s] : files) total += s;

  EndpointChoice where = ChooseEndpoint(f.endpoint);
  auto hub = Connect(f);
  if (!hub.ok()) return Fail(hub.status());
  hub::TransactionOptions opts;
  opts.message =
      message.empty() ? "megackpt push " + std::to_string(files.size()) + " files" : message;
  opts.rebase = rebase;
  opts.create_private = is_private;
  auto txn = hub::HubTransaction::Begin(*hub, *uri, opts);
  if (!txn.ok()) return Fail(txn.status());
  TransferProgress progress(TransferProgress::ModeFor(f.quiet, f.json), "push", where, files.size(),
                            total);
  ThreadPool pool(std::max(1, f.threads));
  Status s = ParallelFor(&pool, files.size(), [&](size_t i) -> Status {
    const auto& [rel, size] = files[i];
    MEGA_ASSIGN_OR_RETURN(auto in, OpenLocalFile(dir + "/" + rel));
    MEGA_ASSIGN_OR_RETURN(auto out, (*txn)->OpenForWrite(rel));
    MEGA_RETURN_IF_ERROR(ForEachBlock(*in, [&](std::span<std::byte> block) {
      MEGA_RETURN_IF_ERROR(out->Append(block));
      progress.AddBytes(block.size());
      return Status::OK();
    }));
    MEGA_RETURN_IF_ERROR(out->Close());
    progress.FileDone(rel, size, "uploaded");
    return Status::OK();
  });
  if (!s.ok()) {
    progress.Finish();
    (*txn)->Abort();
    return Fail(s);
  }
  auto commit = (*txn)->Commit();
  progress.Finish();
  if (!commit.ok()) return Fail(commit.status());
  hub::TransactionStats st = (*txn)->stats();
  if (f.json) {
    const double seconds = NowSeconds() - start;
    json out = {{"commit", commit->id},
                {"files", files.size()},
                {"bytes", total},
                {"uploaded_bytes", st.new_bytes},
                {"total_bytes", total},  // = "bytes"; read by tests/hub_cli_test.cc
                {"seconds", seconds},
                {"gbps", seconds > 0 ? total / seconds / 1e9 : 0.0},
                {"endpoint", where.endpoint}};
    if (commit->no_change) out["no_change"] = true;
    std::printf("%s\n", out.dump().c_str());
  } else if (commit->no_change) {
    // The hub made no commit: every file was already there, unchanged.
    std::printf("nothing to change: %s is already at commit %s (%zu files, %s)\n",
                uri->Root().ToString().c_str(), commit->id.c_str(), files.size(),
                HumanBytes(total).c_str());
  } else {
    std::printf("%s %s: %zu files, %s, %s uploaded (new content)\n",
                commit->id.empty() ? "updated" : ("commit " + commit->id).c_str(),
                uri->Root().ToString().c_str(), files.size(), HumanBytes(total).c_str(),
                HumanBytes(st.new_bytes).c_str());
  }
  return 0;
}

// ---- pull ----

struct RemoteFile {
  std::string rel;  // path relative to the URI's path
  hub::FileEntry entry;
  hub::MegaUri where;
};

Result<std::vector<RemoteFile>> ResolveFiles(hub::HubConnection& hub, const hub::MegaUri& uri,
                                             std::string* commit_out) {
  std::vector<RemoteFile> out;
  std::string prefix = uri.path.empty() ? "" : uri.path + "/";
  if (uri.is_bucket) {
    MEGA_ASSIGN_OR_RETURN(auto list,
                          hub.ListBucket(uri.repo_id(), uri.path.empty() ? "" : uri.path));
    for (const auto& e : list) {
      if (!uri.path.empty() && e.path != uri.path && !e.path.starts_with(prefix)) continue;
      RemoteFile rf;
      rf.rel = e.path == uri.path ? std::filesystem::path(e.path).filename().string()
                                  : e.path.substr(prefix.size());
      rf.entry.path = e.path;
      rf.entry.size = e.size;
      rf.entry.sha256 = e.sha256;
      rf.entry.xet_hash = e.xet_hash;
      MEGA_ASSIGN_OR_RETURN(rf.where, uri.WithPath(e.path));
      out.push_back(std::move(rf));
    }
    return out;
  }
  MEGA_ASSIGN_OR_RETURN(std::string commit, hub.ResolveRevision(uri.repo_id(), uri.revision));
  *commit_out = commit;
  hub::MegaUri pinned = uri;
  pinned.revision = commit;
  pinned.has_revision = true;
  if (!uri.path.empty()) {
    auto single = hub.GetFile(uri.repo_id(), commit, uri.path);
    if (single.ok()) {
      RemoteFile rf;
      rf.rel = std::filesystem::path(uri.path).filename().string();
      rf.entry = *single;
      rf.where = pinned;
      out.push_back(std::move(rf));
      return out;
    }
    if (single.status().code() != StatusCode::kNotFound) return single.status();
  }
  MEGA_ASSIGN_OR_RETURN(auto list, hub.ListFiles(uri.repo_id(), commit, prefix));
  for (const auto& e : list) {
    RemoteFile rf;
    rf.rel = e.path.substr(prefix.size());
    rf.entry = e;
    MEGA_ASSIGN_OR_RETURN(rf.where, pinned.WithPath(e.path));
    out.push_back(std::move(rf));
  }
  return out;
}

// Whether `path` already holds `entry`: same size and SHA-256 (read
// locally in large blocks). Entries without a SHA-256 never match.
Result<bool> LocalCopyMatches(const std::string& path, const hub::FileEntry& entry) {
  std::error_code ec;
  if (entry.sha256.empty() || !std::filesystem::is_regular_file(path, ec)) return false;
  uint64_t size = std::filesystem::file_size(path, ec);
  if (ec || size != entry.size) return false;
  MEGA_ASSIGN_OR_RETURN(auto in, OpenLocalFile(path));
  Sha256 sha;
  MEGA_RETURN_IF_ERROR(ForEachBlock(*in, [&](std::span<std::byte> block) {
    sha.Update(block);
    return Status::OK();
  }));
  Sha256Digest d = sha.Finish();
  return ToHex(std::span<const uint8_t>(d.data(), d.size())) == entry.sha256;
}

int Pull(const std::string& source, const std::string& dir, const HubFlags& f) {
  const double start = NowSeconds();  // for the "seconds" and "gbps" JSON keys
  auto uri = hub::ParseMegaUri(source);
  if (!uri.ok()) return Fail(uri.status());
  EndpointChoice where = ChooseEndpoint(f.endpoint);
  auto hub = Connect(f);
  if (!hub.ok()) return Fail(hub.status());
  std::string commit;
  auto files = ResolveFiles(**hub, *uri, &commit);
  if (!files.ok()) return Fail(files.status());
  if (files->empty()) return Fail(NotFoundError(source + ": no files"));
  uint64_t total = 0;
  for (const auto& rf : *files) total += rf.entry.size;
  TransferProgress progress(TransferProgress::ModeFor(f.quiet, f.json), "pull", where,
                            files->size(), total);
  ThreadPool pool(std::max(1, f.threads));
  // Files whose local copy already has the same size and SHA-256 are not
  // downloaded again (checked in parallel).
  std::vector<char> skip(files->size(), 0);
  for (const RemoteFile& rf : *files) {
    Status vs = hub::ValidateRepoPath(rf.rel);
    if (!vs.ok()) return Fail(vs);
  }
  Status checked = ParallelFor(&pool, files->size(), [&](size_t i) -> Status {
    const RemoteFile& rf = (*files)[i];
    MEGA_ASSIGN_OR_RETURN(bool same, LocalCopyMatches(dir + "/" + rf.rel, rf.entry));
    if (same) {
      skip[i] = 1;
      progress.FileDone(rf.rel, rf.entry.size, "skipped");
    }
    return Status::OK();
  });
  if (!checked.ok()) return Fail(checked);
  // Files are split into pieces downloaded in parallel (one range request each).
  constexpr uint64_t kPiece = 16u << 20;
  struct Piece {
    size_t file;
    uint64_t offset, length;
  };
  std::vector<Piece> pieces;
  std::vector<std::unique_ptr<WritableFile>> outs(files->size());
  std::vector<std::unique_ptr<RandomAccessFile>> ins(files->size());
  std::vector<std::string> tmps(files->size());
  std::vector<std::atomic<int>> left(files->size());
  uint64_t downloaded = 0;
  size_t skipped = 0;
  for (size_t i = 0; i < files->size(); ++i) {
    const RemoteFile& rf = (*files)[i];
    if (skip[i]) {
      ++skipped;
      continue;
    }
    downloaded += rf.entry.size;
    std::string path = dir + "/" + rf.rel;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    tmps[i] = path + ".megackpt-partial";
    auto out = CreateLocalFile(tmps[i]);
    if (!out.ok()) return Fail(out.status());
    outs[i] = *std::move(out);
    auto in = (*hub)->OpenFile(rf.where, rf.entry);
    if (!in.ok()) return Fail(in.status());
    ins[i] = *std::move(in);
    int n = 0;
    for (uint64_t off = 0; off < rf.entry.size; off += kPiece) {
      pieces.push_back({i, off, std::min(kPiece, rf.entry.size - off)});
      ++n;
    }
    left[i] = n;
    if (n == 0) pieces.push_back({i, 0, 0}), left[i] = 1;
  }
  Status s = ParallelFor(&pool, pieces.size(), [&](size_t k) -> Status {
    const Piece& p = pieces[k];
    std::string buf(p.length, '\0');
    auto dst = std::as_writable_bytes(std::span<char>(buf.data(), buf.size()));
    if (p.length) {
      MEGA_RETURN_IF_ERROR(ins[p.file]->ReadExactlyAt(p.offset, dst));
      MEGA_RETURN_IF_ERROR(outs[p.file]->WriteAt(p.offset, dst));
      progress.AddBytes(p.length);
    }
    if (--left[p.file] == 0) {
      MEGA_RETURN_IF_ERROR(outs[p.file]->Close());
      const RemoteFile& rf = (*files)[p.file];
      std::error_code ec;
      std::filesystem::rename(tmps[p.file], dir + "/" + rf.rel, ec);
      if (ec) return ErrnoToStatus("rename " + tmps[p.file], ec.value());
      progress.FileDone(rf.rel, rf.entry.size, "downloaded");
    }
    return Status::OK();
  });
  progress.Finish();
  if (!s.ok()) {
    for (const auto& t : tmps) {
      if (!t.empty()) std::filesystem::remove(t);
    }
    return Fail(s);
  }
  if (f.json) {
    const double seconds = NowSeconds() - start;
    std::printf("%s\n", json{{"commit", commit},
                             {"files", files->size()},
                             {"bytes", total},
                             {"downloaded_bytes", downloaded},
                             {"skipped_files", skipped},
                             {"seconds", seconds},
                             {"gbps", seconds > 0 ? total / seconds / 1e9 : 0.0},
                             {"endpoint", where.endpoint}}
                            .dump()
                            .c_str());
  } else {
    std::printf("pulled %zu files (%s)%s into %s%s\n", files->size(), HumanBytes(total).c_str(),
                commit.empty() ? "" : (" at " + commit).c_str(), dir.c_str(),
                skipped ? (": " + std::to_string(skipped) + " already up to date, " +
                           HumanBytes(downloaded) + " downloaded")
                              .c_str()
                        : "");
  }
  return 0;
}

// ---- ls / rm / log ----

int Ls(const std::string& target, const HubFlags& f, bool recursive) {
  auto uri = hub::ParseMegaUri(target);
  if (!uri.ok()) return Fail(uri.status());
  if (!f.quiet && !f.json) {
    std::fprintf(stderr, "ls: %s\n", DescribeEndpoint(ChooseEndpoint(f.endpoint)).c_str());
  }
  auto hub = Connect(f);
  if (!hub.ok()) return Fail(hub.status());
  json out = json::array();
  if (recursive) {
    std::string commit;
    auto files = ResolveFiles(**hub, *uri, &commit);
    if (!files.ok()) return Fail(files.status());
    for (const auto& rf : *files) {
      if (f.json) {
        out.push_back({{"path", rf.entry.path},
                       {"size", rf.entry.size},
                       {"sha256", rf.entry.sha256},
                       {"xet_hash", rf.entry.xet_hash}});
      } else {
        std::printf("%12llu  %s\n", static_cast<unsigned long long>(rf.entry.size),
                    rf.entry.path.c_str());
      }
    }
  } else {
    auto fs = hub::NewMegaFileSystem(*hub);
    auto st = fs->Stat(target);
    if (!st.ok()) return Fail(st.status());
    std::vector<fs::FileInfo> list;
    if (st->is_directory) {
      auto l = fs->List(target);
      if (!l.ok()) return Fail(l.status());
      list = *std::move(l);
    } else {
      list.push_back(*st);
    }
    for (const auto& e : list) {
      if (f.json) {
        out.push_back(
            {{"path", e.path}, {"size", e.size}, {"type", e.is_directory ? "directory" : "file"}});
      } else if (e.is_directory) {
        std::printf("%12s  %s/\n", "-", e.path.c_str());
      } else {
        std::printf("%12llu  %s\n", static_cast<unsigned long long>(e.size), e.path.c_str());
      }
    }
  }
  if (f.json) std::printf("%s\n", out.dump().c_str());
  return 0;
}

int Rm(const std::string& target, const HubFlags& f, bool recursive, const std::string& message) {
  auto uri = hub::ParseMegaUri(target);
  if (!uri.ok()) return Fail(uri.status());
  if (uri->path.empty())
    return Fail(InvalidArgumentError("rm: " + target + " names no path inside the repo"));
  auto hub = Connect(f);
  if (!hub.ok()) return Fail(hub.status());
  if (uri->is_bucket) {
    std::vector<hub::BucketOperation> ops;
    auto single = (*hub)->GetBucketEntry(uri->repo_id(), uri->path);
    if (single.ok()) {
      hub::BucketOperation op;
      op.kind = hub::BucketOperation::Kind::kDelete;
      op.entry.path = uri->path;
      ops.push_back(op);
    } else if (recursive) {
      auto list = (*hub)->ListBucket(uri->repo_id(), uri->path + "/");
      if (!list.ok()) return Fail(list.status());
      for (const auto& e : *list) {
        hub::BucketOperation op;
        op.kind = hub::BucketOperation::Kind::kDelete;
        op.entry.path = e.path;
        ops.push_back(op);
      }
    }
    if (ops.empty()) return Fail(NotFoundError(target + ": no such file"));
    Status s = (*hub)->BucketBatch(uri->repo_id(), ops);
    if (!s.ok()) return Fail(s);
    if (f.json)
      std::printf("%s\n", json{{"deleted", ops.size()}}.dump().c_str());
    else
      std::printf("deleted %zu file(s) from %s\n", ops.size(), uri->Root().ToString().c_str());
    return 0;
  }
  hub::CommitRequest req;
  req.repo = uri->repo_id();
  req.branch = uri->revision;
  req.message = message.empty() ? "megackpt rm " + uri->path : message;
  hub::CommitOperation op;
  op.kind =
      recursive ? hub::CommitOperation::Kind::kDeleteFolder : hub::CommitOperation::Kind::kDelete;
  op.path = uri->path;
  if (recursive) {
    // `rm -r` of a single file is fine too.
    auto head = (*hub)->ResolveRevision(req.repo, req.branch);
    if (head.ok() && (*hub)->GetFile(req.repo, *head, uri->path).ok())
      op.kind = hub::CommitOperation::Kind::kDelete;
  }
  req.ops.push_back(op);
  auto c = (*hub)->Commit(req);
  if (!c.ok()) return Fail(c.status());
  if (f.json) {
    std::printf("%s\n", json{{"commit", c->id}, {"deleted", c->changes.size()}}.dump().c_str());
  } else {
    std::printf("commit %s: deleted %zu file(s)\n", c->id.c_str(), c->changes.size());
  }
  return 0;
}

int Log(const std::string& target, const HubFlags& f, size_t limit) {
  auto uri = hub::ParseMegaUri(target);
  if (!uri.ok()) return Fail(uri.status());
  if (uri->is_bucket) return Fail(InvalidArgumentError("log: buckets have no history"));
  auto hub = Connect(f);
  if (!hub.ok()) return Fail(hub.status());
  auto commits = (*hub)->ListCommits(uri->repo_id(), uri->revision, limit);
  if (!commits.ok()) return Fail(commits.status());
  json out = json::array();
  for (const auto& c : *commits) {
    if (f.json) {
      out.push_back({{"commit", c.id},
                     {"parent", c.parent ? json(*c.parent) : json(nullptr)},
                     {"author", c.author},
                     {"date", hub::FormatTimestamp(c.created_ms)},
                     {"message", c.message}});
    } else {
      std::printf("%s  %s  %-12s %s\n", c.id.c_str(), hub::FormatTimestamp(c.created_ms).c_str(),
                  c.author.c_str(), c.message.c_str());
    }
  }
  if (f.json) std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

void RegisterHubCommands(CLI::App& app, CLI::App& bench, int* exit_code) {
  static HubFlags flags;
  static std::string a, b, message;
  static bool is_private = false, rebase = false, recursive = false;
  static size_t limit = 50;

  CLI::App* push = app.add_subcommand(
      "push",
      "Upload a folder to a hub repo or bucket as ONE commit; only content the hub lacks travels.\n"
      "  megackpt push ./ckpt mega://org/model@main/ckpt/step-100 --json\n"
      "  -> {\"commit\": \"<40 hex>\", \"uploaded_bytes\": N, \"total_bytes\": N, \"files\": N}\n"
      "The repo is created when missing (when the token may write to the namespace).");
  push->add_option("DIR", a, "Local folder")->required();
  push->add_option("URI", b,
                   "mega://[type/]NS/REPO[@BRANCH][/PATH] or mega://buckets/NS/NAME[/PATH]")
      ->required();
  push->add_option("-m,--message", message, "Commit message");
  push->add_flag("--private", is_private, "Create the repo private when it does not exist");
  push->add_flag("--rebase", rebase,
                 "If the branch moved meanwhile, commit on top unless the same paths changed");
  push->add_option("-j,--threads", flags.threads, "Files uploaded in parallel")->default_val(4);
  AddHubFlags(push, &flags);
  push->callback([exit_code] { *exit_code = Push(a, b, flags, message, is_private, rebase); });

  CLI::App* pull = app.add_subcommand(
      "pull",
      "Download a repo folder/file (at a branch, tag or commit) or bucket folder into DIR.\n"
      "  megackpt pull mega://org/model@main/ckpt/step-100 ./restored");
  pull->add_option("URI", a, "mega:// source")->required();
  pull->add_option("DIR", b, "Local destination folder")->required();
  pull->add_option("-j,--threads", flags.threads, "Parallel range downloads")->default_val(4);
  AddHubFlags(pull, &flags);
  pull->callback([exit_code] { *exit_code = Pull(a, b, flags); });

  CLI::App* ls = app.add_subcommand("ls",
                                    "List a hub folder (or every file below it with -r)\n"
                                    "  megackpt ls mega://org/model@main/ckpt");
  ls->add_option("URI", a, "mega:// folder or file")->required();
  ls->add_flag("-r,--recursive", recursive, "Every file below the folder, with full paths");
  AddHubFlags(ls, &flags);
  ls->callback([exit_code] { *exit_code = Ls(a, flags, recursive); });

  CLI::App* rm = app.add_subcommand("rm",
                                    "Delete a file (or a folder with -r) as one commit\n"
                                    "  megackpt rm -r mega://org/model@main/ckpt/step-90");
  rm->add_option("URI", a, "mega:// file or folder")->required();
  rm->add_flag("-r,--recursive", recursive, "Delete a folder");
  rm->add_option("-m,--message", message, "Commit message");
  AddHubFlags(rm, &flags);
  rm->callback([exit_code] { *exit_code = Rm(a, flags, recursive, message); });

  CLI::App* log = app.add_subcommand("log",
                                     "Commit history of a repo branch, newest first\n"
                                     "  megackpt log mega://org/model");
  log->add_option("URI", a, "mega://[type/]NS/REPO[@REV]")->required();
  log->add_option("-n,--limit", limit, "At most this many commits")->default_val(50);
  AddHubFlags(log, &flags);
  log->callback([exit_code] { *exit_code = Log(a, flags, limit); });

  static uint64_t bench_bytes = 256ull << 20;
  static std::string bench_size;
  static int bench_reps = 5;
  static bool bench_json = false;
  CLI::App* hb = bench.add_subcommand(
      "hub",
      "Save/load through mega:// (embedded and a megahub on loopback) vs a local path vs the\n"
      "page-cache limits, plus second-version upload bytes/time (10% of files changed).");
  auto* size_opt =
      hb->add_option("--size", bench_size, "Checkpoint size, e.g. 2GiB, 512MB (default 256MiB)");
  hb->add_option("--bytes", bench_bytes, "Checkpoint size in plain bytes (same as --size)")
      ->default_val(256ull << 20)
      ->excludes(size_opt);
  hb->add_option("--reps", bench_reps, "Measured repetitions (after one warm-up)")->default_val(5);
  hb->add_flag("--json", bench_json, "JSON output");
  hb->callback([exit_code] {
    std::string self = std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
    std::string megahub = self + "/megahub";
    bench::HubBenchOptions o;
    o.bytes = bench_bytes;
    if (!bench_size.empty() &&
        !ParseSizeFlag("bench hub", "--size", bench_size, &o.bytes, exit_code))
      return;
    o.reps = bench_reps;
    o.megahub = std::filesystem::exists(megahub) ? megahub : "";
    o.json = bench_json;
    auto out = bench::RunHubBench(o);
    if (!out.ok()) {
      *exit_code = ReportError("bench hub", out.status());
      return;
    }
    std::printf("%s", out->c_str());
  });

  static bench::HubLoadOptions load;
  CLI::App* hl = bench.add_subcommand(
      "hub-load",
      "Load test: N clients push and pull through a megahub on loopback for a bounded time;\n"
      "prints throughput, errors (must be 0) and the server's peak RSS.");
  hl->add_option("--clients", load.clients, "Concurrent clients")->default_val(16);
  hl->add_option("--seconds", load.seconds, "Duration")->default_val(15);
  hl->add_option("--file-bytes", load.file_bytes, "Bytes per push")->default_val(256 * 1024);
  hl->add_flag("--json", load.json, "JSON output");
  hl->callback([exit_code] {
    std::string self = std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
    load.megahub = self + "/megahub";
    auto out = bench::RunHubLoad(load);
    if (!out.ok()) {
      *exit_code = ReportError("bench hub-load", out.status());
      return;
    }
    std::printf("%s", out->c_str());
  });
}

}  // namespace megackpt::cli
