// CAS commands: `megackpt cas put|get|stat|gc|chunk|verify|export-shard|import-shard`
// and `megackpt bench cas`. A thin shell over include/megackpt/cas/ (docs/cas.md).
//
// Exit codes: 0 success; 1 failure (missing or corrupt data, I/O errors; the
// message names the file, xorb or chunk); 2 usage errors (bad flags, a
// malformed hash or range).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cas_bench.h"
#include "megackpt/cas/chunker.h"
#include "megackpt/cas/hash.h"
#include "megackpt/cas/shard.h"
#include "megackpt/cas/store.h"
#include "megackpt/commands.h"
#include "megackpt/core/checksum.h"
#include "megackpt/core/file.h"

namespace megackpt::cli {
namespace {

using cas::MerkleHash;
using nlohmann::ordered_json;

std::string Percent(uint64_t part, uint64_t whole) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f%%", whole ? 100.0 * part / whole : 0.0);
  return buf;
}

// Prints the failure of `cmd` and sets the failure exit code.
void Fail(const char* cmd, const Status& s, int* exit_code) {
  *exit_code = ReportError(std::string("cas ") + cmd, s);
}

std::optional<MerkleHash> ParseHashArg(const char* cmd, const std::string& text, int* exit_code) {
  auto h = MerkleHash::FromHex(text);
  if (!h.ok()) {
    *exit_code = ReportUsage(
        std::string("cas ") + cmd,
        h.status().message() + " (a file hash is 64 hex digits, as printed by `cas put`)");
    return std::nullopt;
  }
  return *h;
}

// Appends the hashes of `texts` to *out; false after a usage error (ParseHashArg).
bool ParseHashArgs(const char* cmd, const std::vector<std::string>& texts,
                   std::vector<MerkleHash>* out, int* exit_code) {
  for (const std::string& text : texts) {
    auto h = ParseHashArg(cmd, text, exit_code);
    if (!h) return false;
    out->push_back(*h);
  }
  return true;
}

// --progress / --quiet of the commands that move file bytes (put, get).
struct ProgressFlags {
  bool progress = false, quiet = false;
};

void AddProgressFlags(CLI::App* cmd, ProgressFlags* f, const std::string& progress_help) {
  cmd->add_flag("--progress", f->progress, progress_help);
  cmd->add_flag("--quiet", f->quiet, "no progress output");
}

// Progress is shown when asked for, or by default for 256 MiB and more on a terminal.
bool ShowProgress(const ProgressFlags& f, uint64_t bytes) {
  return !f.quiet && (f.progress || (bytes >= (256ull << 20) && ::isatty(2)));
}

struct StoreFlags {
  std::string dir;
  int threads = 2;
  bool no_compress = false;
  bool no_sync = false;
};

void AddStoreFlags(CLI::App* cmd, StoreFlags* f, bool writes) {
  cmd->add_option("--store", f->dir, "CAS store folder (created by `cas put` when missing)")
      ->required();
  if (writes) {
    cmd->add_option("--threads", f->threads, "threads hashing/compressing chunks (default 2)")
        ->check(CLI::Range(1, 64));
    cmd->add_flag("--no-compress", f->no_compress, "store chunks uncompressed (skip LZ4/BG4)");
    cmd->add_flag("--no-sync", f->no_sync,
                  "do not fsync xorbs and records (faster, not crash-safe)");
  }
}

Result<std::unique_ptr<cas::CasStore>> OpenStore(const StoreFlags& f, bool create) {
  cas::CasStoreOptions opts;
  opts.upload_threads = f.threads;
  opts.compress = !f.no_compress;
  cas::LocalBackendOptions local;
  local.create = create;
  local.sync = !f.no_sync;
  return cas::CasStore::OpenLocal(f.dir, opts, local);
}

ordered_json UploadJson(const cas::FileUploadResult& r) {
  ordered_json j;
  j["file_hash"] = r.file_hash.ToHex();
  j["size"] = r.size;
  j["new_bytes"] = r.new_bytes;
  j["chunks"] = r.chunks;
  j["new_chunks"] = r.new_chunks;
  j["new_xorbs"] = r.new_xorbs;
  j["stored_bytes"] = r.stored_bytes;
  j["terms"] = r.reconstruction.terms.size();
  return j;
}

// ---- cas put ----
void RegisterPut(CLI::App* cas_cmd, int* exit_code) {
  struct Args {
    StoreFlags store;
    std::vector<std::string> files;
    bool json = false;
    ProgressFlags progress;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = cas_cmd->add_subcommand(
      "put",
      "Store files: chunk (Gear CDC), hash (BLAKE3), dedup against the store, compress new chunks\n"
      "into xorbs, then record each file's reconstruction. Prints the Xet file hash to use with\n"
      "`cas get`, and how many bytes were new.\n"
      "Example: megackpt cas put --store /data/cas model-00001.mega --json");
  AddStoreFlags(cmd, &args->store, true);
  cmd->add_option("FILE", args->files, "files to store")->required()->check(CLI::ExistingFile);
  cmd->add_flag("--json", args->json,
                "print {\"file_hash\",\"size\",\"new_bytes\",\"chunks\",\"new_chunks\",...} (one "
                "object per file, one per line)");
  AddProgressFlags(cmd, &args->progress,
                   "report progress on stderr (default: for files over 256 MiB on a terminal)");
  cmd->callback([args, exit_code] {
    auto store = OpenStore(args->store, /*create=*/true);
    if (!store.ok()) return Fail("put", store.status(), exit_code);
    uint64_t total_new = 0, total = 0;
    for (const std::string& path : args->files) {
      std::error_code ec;
      uint64_t size = std::filesystem::file_size(path, ec);
      ByteProgress progress("put " + path, size, ShowProgress(args->progress, size));
      double t0 = NowSeconds();
      auto r = (*store)->UploadFile(
          path, {.name = path, .progress = [&](uint64_t n) { progress.Update(n); }});
      double dt = NowSeconds() - t0;
      if (!r.ok()) return Fail("put", r.status(), exit_code);
      total += r->size;
      total_new += r->new_bytes;
      if (args->json) {
        ordered_json j = UploadJson(*r);
        if (args->files.size() > 1) j["path"] = path;
        j["seconds"] = dt;
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf("%s\n  file hash  %s\n  size       %s (%" PRIu64 " bytes) in %" PRIu64
                    " chunks, %zu terms\n"
                    "  new        %s in %" PRIu64 " chunks (%s of the file), %s stored in %" PRIu64
                    " new xorbs\n  time       %.3f s (%s)\n",
                    path.c_str(), r->file_hash.ToHex().c_str(), HumanBytes(r->size).c_str(),
                    r->size, r->chunks, r->reconstruction.terms.size(),
                    HumanBytes(r->new_bytes).c_str(), r->new_chunks,
                    Percent(r->new_bytes, r->size).c_str(), HumanBytes(r->stored_bytes).c_str(),
                    r->new_xorbs, dt, HumanRate(dt > 0 ? r->size / dt : 0).c_str());
      }
    }
    if (!args->json && args->files.size() > 1) {
      std::printf("total: %s, new %s (%s)\n", HumanBytes(total).c_str(),
                  HumanBytes(total_new).c_str(), Percent(total_new, total).c_str());
    }
  });
}

// ---- cas get ----
void RegisterGet(CLI::App* cas_cmd, int* exit_code) {
  struct Args {
    StoreFlags store;
    std::string hash, out, range;
    ProgressFlags progress;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = cas_cmd->add_subcommand(
      "get",
      "Rebuild a stored file (or a byte range of it) from its xorbs. Only the xorb byte ranges\n"
      "covering the request are read; every chunk is checked against its hash (a corrupt chunk\n"
      "is an error naming the xorb and chunk, never wrong bytes).\n"
      "Example: megackpt cas get --store /data/cas <file_hash> out.bin --range 0-1023");
  AddStoreFlags(cmd, &args->store, false);
  cmd->add_option("FILE_HASH", args->hash, "the file hash printed by `cas put`")->required();
  cmd->add_option("OUT", args->out, "output file ('-' = stdout); written atomically")->required();
  cmd->add_option("--range", args->range,
                  "START-END: bytes START..END inclusive (as in HTTP Range); END may be omitted "
                  "('START-' = to the end)");
  AddProgressFlags(cmd, &args->progress,
                   "report progress on stderr (default: over 256 MiB on a terminal)");
  AddJsonFlag(
      cmd,
      "print {\"file_hash\", \"out\", \"bytes\", \"seconds\", \"gbps\"} (OUT must not be '-')");
  cmd->callback([args, exit_code] {
    if (JsonOutput() && args->out == "-") {
      *exit_code =
          ReportUsage("cas get", "--json prints the result on stdout; give an OUT file, not '-'");
      return;
    }
    const double t0 = NowSeconds();
    auto hash = ParseHashArg("get", args->hash, exit_code);
    if (!hash) return;
    cas::ByteRange range;
    if (!args->range.empty()) {
      size_t dash = args->range.find('-');
      try {
        if (dash == std::string::npos || dash == 0) throw std::invalid_argument("range");
        size_t used = 0;
        uint64_t start = std::stoull(args->range.substr(0, dash), &used);
        if (used != dash) throw std::invalid_argument("range");
        range.offset = start;
        std::string end_text = args->range.substr(dash + 1);
        if (!end_text.empty()) {
          uint64_t end = std::stoull(end_text, &used);
          if (used != end_text.size() || end < start) throw std::invalid_argument("range");
          range.length = end - start + 1;
        }
      } catch (...) {
        *exit_code = ReportUsage(
            "cas get", "--range '" + args->range + "' is not START-END with START <= END");
        return;
      }
    }
    auto store = OpenStore(args->store, /*create=*/false);
    if (!store.ok()) return Fail("get", store.status(), exit_code);
    auto rec = (*store)->GetReconstruction(*hash);
    if (!rec.ok()) return Fail("get", rec.status(), exit_code);
    const uint64_t want =
        range.offset >= rec->size ? 0 : std::min(range.length, rec->size - range.offset);
    ByteProgress progress("get " + args->hash.substr(0, 12), want,
                          ShowProgress(args->progress, want));
    uint64_t done = 0;
    Status s;
    if (args->out == "-") {
      s = (*store)->Download(*hash, range, [&](std::span<const std::byte> piece) {
        if (std::fwrite(piece.data(), 1, piece.size(), stdout) != piece.size()) {
          return IOError("stdout: write failed");
        }
        progress.Update(done += piece.size());
        return Status::OK();
      });
      std::fflush(stdout);
    } else {
      // Written to a temp file, renamed over OUT when complete and synced.
      auto out = AtomicFileWriter::Create(args->out);
      s = out.status();
      if (s.ok()) {
        s = (*store)->Download(*hash, range, [&](std::span<const std::byte> piece) {
          MEGA_RETURN_IF_ERROR((*out)->Append(piece));
          progress.Update(done += piece.size());
          return Status::OK();
        });
        if (s.ok()) s = (*out)->Commit();
      }
    }
    if (!s.ok()) return Fail("get", s, exit_code);
    if (JsonOutput()) {
      const double dt = NowSeconds() - t0;
      PrintJson({{"file_hash", args->hash},
                 {"out", args->out},
                 {"bytes", done},
                 {"seconds", dt},
                 {"gbps", dt > 0 ? done / dt / 1e9 : 0.0}},
                -1);
    }
  });
}

void PrintStats(const cas::StoreStats& st, bool json) {
  if (json) {
    ordered_json j;
    j["files"] = st.files;
    j["logical_bytes"] = st.logical_bytes;
    j["xorbs"] = st.xorbs;
    j["referenced_xorbs"] = st.referenced_xorbs;
    j["chunks"] = st.chunks;
    j["unique_bytes"] = st.unpacked_bytes;
    j["stored_bytes"] = st.stored_bytes;
    j["dedup_ratio"] = st.dedup_ratio();
    j["compression_ratio"] = st.compression_ratio();
    j["saved_bytes"] = st.logical_bytes > st.stored_bytes ? st.logical_bytes - st.stored_bytes : 0;
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("files          %" PRIu64 " holding %s\n", st.files,
              HumanBytes(st.logical_bytes).c_str());
  std::printf("unique chunks  %" PRIu64 " holding %s (dedup ratio %.2fx)\n", st.chunks,
              HumanBytes(st.unpacked_bytes).c_str(), st.dedup_ratio());
  std::printf("on disk        %s in %" PRIu64 " xorbs (compression %.2fx)\n",
              HumanBytes(st.stored_bytes).c_str(), st.xorbs, st.compression_ratio());
  std::printf("overall        %s stored for %s of files (%s saved)\n",
              HumanBytes(st.stored_bytes).c_str(), HumanBytes(st.logical_bytes).c_str(),
              Percent(st.logical_bytes > st.stored_bytes ? st.logical_bytes - st.stored_bytes : 0,
                      st.logical_bytes)
                  .c_str());
  std::printf("unreferenced   %" PRIu64 " xorbs (collected by `cas gc`)\n",
              st.xorbs - st.referenced_xorbs);
}

// ---- cas stat ----
void RegisterStat(CLI::App* cas_cmd, int* exit_code) {
  struct Args {
    StoreFlags store;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = cas_cmd->add_subcommand(
      "stat",
      "Dedup statistics of a store: files and their logical size, unique chunks, bytes on\n"
      "disk, dedup and compression ratios, unreferenced xorbs.");
  AddStoreFlags(cmd, &args->store, false);
  cmd->add_flag("--json", args->json, "print JSON");
  cmd->callback([args, exit_code] {
    auto store = OpenStore(args->store, false);
    Result<cas::StoreStats> st =
        store.ok() ? (*store)->Stat() : Result<cas::StoreStats>(store.status());
    if (!st.ok()) return Fail("stat", st.status(), exit_code);
    PrintStats(*st, args->json);
  });
}

// ---- cas gc ----
void RegisterGc(CLI::App* cas_cmd, int* exit_code) {
  struct Args {
    StoreFlags store;
    std::vector<std::string> keep;
    bool dry_run = false, json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = cas_cmd->add_subcommand(
      "gc",
      "Delete xorbs that no live file references. Without --keep every stored file is live\n"
      "(only xorbs of abandoned uploads are removed); with --keep, stored files not listed are\n"
      "deleted first. Waits for uploads in progress (store lock). Prints the statistics after.\n"
      "Example: megackpt cas gc --store /data/cas --keep <hash1> --keep <hash2> --dry-run");
  AddStoreFlags(cmd, &args->store, false);
  cmd->add_option("--keep", args->keep, "a live file hash (repeatable)");
  cmd->add_flag("--dry-run", args->dry_run, "report what would be deleted, delete nothing");
  cmd->add_flag("--json", args->json, "print JSON");
  cmd->callback([args, exit_code] {
    cas::GcOptions opts;
    opts.dry_run = args->dry_run;
    if (!args->keep.empty()) {
      opts.live_files.emplace();
      if (!ParseHashArgs("gc", args->keep, &*opts.live_files, exit_code)) return;
    }
    auto store = OpenStore(args->store, false);
    Result<cas::GcResult> r =
        store.ok() ? (*store)->GarbageCollect(opts) : Result<cas::GcResult>(store.status());
    if (!r.ok()) return Fail("gc", r.status(), exit_code);
    auto st = (*store)->Stat();
    if (args->json) {
      ordered_json j;
      j["dry_run"] = args->dry_run;
      j["files_kept"] = r->files_kept;
      j["files_deleted"] = r->files_deleted;
      j["xorbs_kept"] = r->xorbs_kept;
      j["xorbs_deleted"] = r->xorbs_deleted;
      j["bytes_deleted"] = r->bytes_deleted;
      if (st.ok()) {
        j["after"] = {{"files", st->files},
                      {"xorbs", st->xorbs},
                      {"stored_bytes", st->stored_bytes},
                      {"dedup_ratio", st->dedup_ratio()}};
      }
      std::printf("%s\n", j.dump(2).c_str());
      return;
    }
    std::printf("%s%" PRIu64 " files deleted (%" PRIu64 " kept), %" PRIu64
                " xorbs deleted (%" PRIu64 " kept), %s freed\n",
                args->dry_run ? "dry run: would have " : "", r->files_deleted, r->files_kept,
                r->xorbs_deleted, r->xorbs_kept, HumanBytes(r->bytes_deleted).c_str());
    if (st.ok()) PrintStats(*st, false);
  });
}

// ---- cas chunk ----
void RegisterChunk(CLI::App* cas_cmd, int* exit_code) {
  struct Args {
    std::string file;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = cas_cmd->add_subcommand(
      "chunk",
      "Chunk a file exactly as Xet does and print each chunk's end offset and hash, and the file\n"
      "hash (no store needed).\n"
      "Example: megackpt cas chunk model.mega --json");
  cmd->add_option("FILE", args->file, "the file")->required()->check(CLI::ExistingFile);
  cmd->add_flag(
      "--json", args->json,
      "print {\"boundaries\": [end offsets], \"chunk_hashes\": [hex], \"file_hash\": hex}");
  cmd->callback([args, exit_code] {
    auto file = OpenLocalFile(args->file);
    if (!file.ok()) return Fail("chunk", file.status(), exit_code);
    // Stream the file: keep the bytes of the current chunk, hash it when cut.
    cas::Chunker chunker;
    std::vector<uint64_t> ends, new_ends;
    std::vector<cas::HashAndSize> leaves;
    std::string pending;  // bytes of unfinished chunks
    uint64_t pending_start = 0;
    auto consume = [&](const std::vector<uint64_t>& cut) {
      size_t used = 0;
      for (uint64_t e : cut) {
        size_t len = static_cast<size_t>(e - pending_start) - used;
        leaves.push_back(
            {cas::ChunkHash(AsBytes(std::string_view(pending).substr(used, len))), len});
        used += len;
        ends.push_back(e);
      }
      pending.erase(0, used);
      pending_start += used;
    };
    const uint64_t size = (*file)->size();
    Status s = ForEachBlock(**file, [&](std::span<std::byte> block) {
      pending.append(reinterpret_cast<const char*>(block.data()), block.size());
      new_ends.clear();
      chunker.Feed(block, &new_ends);
      consume(new_ends);
      return Status::OK();
    });
    if (!s.ok()) return Fail("chunk", s, exit_code);
    if (auto last = chunker.Finish()) consume({*last});
    MerkleHash file_hash = cas::FileHash(leaves);
    if (args->json) {
      ordered_json j;
      j["boundaries"] = ends;
      j["chunk_hashes"] = ordered_json::array();
      for (const auto& l : leaves) j["chunk_hashes"].push_back(l.hash.ToHex());
      j["file_hash"] = file_hash.ToHex();
      std::printf("%s\n", j.dump().c_str());
      return;
    }
    std::printf("%-8s %14s %10s  %s\n", "chunk", "end offset", "size", "hash");
    uint64_t prev = 0;
    for (size_t i = 0; i < ends.size(); ++i) {
      std::printf("%-8zu %14" PRIu64 " %10" PRIu64 "  %s\n", i, ends[i], ends[i] - prev,
                  leaves[i].hash.ToHex().c_str());
      prev = ends[i];
    }
    std::printf("file hash %s (%zu chunks, %s)\n", file_hash.ToHex().c_str(), ends.size(),
                HumanBytes(size).c_str());
  });
}

// ---- cas verify ----
void RegisterVerify(CLI::App* cas_cmd, int* exit_code) {
  auto store_flags = std::make_shared<StoreFlags>();
  CLI::App* cmd = cas_cmd->add_subcommand(
      "verify",
      "Re-read every xorb and check every chunk against its hash, and every file's\n"
      "reconstruction against the xorbs and its file hash.");
  AddStoreFlags(cmd, store_flags.get(), false);
  AddJsonFlag(cmd, "print {\"store\", \"ok\": true}");
  cmd->callback([store_flags, exit_code] {
    auto store = OpenStore(*store_flags, false);
    Status s = store.ok() ? (*store)->Verify() : store.status();
    if (!s.ok()) return Fail("verify", s, exit_code);
    if (JsonOutput()) return PrintJson({{"store", store_flags->dir}, {"ok", true}});
    std::printf("ok: every chunk and file checks out\n");
  });
}

// ---- cas export-shard / import-shard ----
void RegisterShardCommands(CLI::App* cas_cmd, int* exit_code) {
  struct ExportArgs {
    StoreFlags store;
    std::string out;
    std::vector<std::string> files;
  };
  auto ex = std::make_shared<ExportArgs>();
  CLI::App* e = cas_cmd->add_subcommand(
      "export-shard",
      "Write the reconstructions of stored files (default: all) and the chunk lists of their\n"
      "xorbs as a Xet MDB shard (format v2).");
  AddStoreFlags(e, &ex->store, false);
  e->add_option("OUT", ex->out, "shard file to write")->required();
  e->add_option("FILE_HASH", ex->files, "files to include (default: every stored file)");
  AddJsonFlag(e, "print {\"out\", \"files\", \"bytes\"}");
  e->callback([ex, exit_code] {
    auto store = OpenStore(ex->store, false);
    if (!store.ok()) return Fail("export-shard", store.status(), exit_code);
    std::vector<MerkleHash> files;
    if (!ParseHashArgs("export-shard", ex->files, &files, exit_code)) return;
    if (files.empty()) {
      auto all = (*store)->backend().ListFiles();
      if (!all.ok()) return Fail("export-shard", all.status(), exit_code);
      files = *all;
    }
    auto shard = cas::ExportShard((*store)->backend(), files);
    Status s = shard.ok() ? WriteLocalFileAtomically(ex->out, *shard) : shard.status();
    if (!s.ok()) return Fail("export-shard", s, exit_code);
    if (JsonOutput())
      return PrintJson({{"out", ex->out}, {"files", files.size()}, {"bytes", shard->size()}});
    std::printf("%s: %zu files, %s\n", ex->out.c_str(), files.size(),
                HumanBytes(shard->size()).c_str());
  });

  struct ImportArgs {
    StoreFlags store;
    std::string shard;
  };
  auto im = std::make_shared<ImportArgs>();
  CLI::App* i = cas_cmd->add_subcommand(
      "import-shard",
      "Record the file reconstructions of a Xet MDB shard in the store. Their xorbs must already\n"
      "be stored; every term and file hash is checked against them.");
  AddStoreFlags(i, &im->store, false);
  i->add_option("SHARD", im->shard, "shard file")->required()->check(CLI::ExistingFile);
  AddJsonFlag(i, "print {\"files_imported\", \"files_already_present\"}");
  i->callback([im, exit_code] {
    auto store = OpenStore(im->store, false);
    auto bytes = ReadLocalFile(im->shard);
    Result<cas::ShardImportResult> r = !store.ok() ? Result<cas::ShardImportResult>(store.status())
                                       : !bytes.ok()
                                           ? Result<cas::ShardImportResult>(bytes.status())
                                           : cas::ImportShard((*store)->backend(), AsBytes(*bytes));
    if (!r.ok()) return Fail("import-shard", r.status(), exit_code);
    if (JsonOutput()) {
      return PrintJson({{"files_imported", r->files_imported},
                        {"files_already_present", r->files_already_present}});
    }
    std::printf("%" PRIu64 " files imported, %" PRIu64 " already present\n", r->files_imported,
                r->files_already_present);
  });
}

// ---- bench cas ----
void RegisterBench(CLI::App& bench, int* exit_code) {
  struct Args {
    std::string size = "256MiB", dedup = "0";
    bench::CasBenchOptions opts;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench.add_subcommand(
      "cas",
      "CAS engine throughput next to memcpy and page-cache limits from the same run: chunking,\n"
      "chunk hashing, compression, chunk+hash+compress on 1 and 2 threads, put of a file into a\n"
      "local store and get back into a warm buffer (min/median/max of --reps runs after a dropped\n"
      "warm-up). --dedup-size adds the checkpoint dedup scenario (v1, 10% changed, re-sharded).\n"
      "Example: megackpt bench cas --size 2GiB --dedup-size 1GiB");
  cmd->add_option("--size", args->size,
                  "bytes of test data (e.g. 2GiB, 268435456; default 256MiB)");
  cmd->add_option("--reps", args->opts.reps, "measured runs per row (default 5)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--warmup", args->opts.warmup, "dropped runs first (default 1)")
      ->check(CLI::Range(0, 100));
  cmd->add_option("--dir", args->opts.dir, "folder for temp files and stores (default $TMPDIR)");
  cmd->add_flag("--sync", args->opts.sync,
                "fsync xorbs in the put runs (compared with write+fsync)");
  cmd->add_option("--dedup-size", args->dedup,
                  "also run the dedup scenario with this many bytes per version (e.g. 1GiB)");
  cmd->add_flag(
      "--json", args->opts.json,
      "print JSON: chunk_gbps, hash_gbps, compress_gbps, chunk_hash_compress_{1,2}t_gbps, "
      "put_gbps, get_gbps, memcpy_gbps, page_cache_{write,read}_gbps, details, ratios");
  cmd->callback([args, exit_code] {
    auto size = ParseByteSize(args->size);
    auto dedup = ParseByteSize(args->dedup);
    if (!size.ok() || !dedup.ok()) {
      *exit_code = ReportUsage("bench cas", (!size.ok() ? size : dedup).status().message());
      return;
    }
    args->opts.size = *size;
    args->opts.dedup_size = *dedup;
    auto out = bench::RunCasBench(args->opts);
    if (!out.ok()) {
      *exit_code = ReportError("bench cas", out.status(), ExitCodeFor(out.status()));
      return;
    }
    std::fputs(out->c_str(), stdout);
  });
}

}  // namespace

void RegisterCasCommands(CLI::App& app, CLI::App& bench, int* exit_code) {
  CLI::App* cas_cmd = app.add_subcommand(
      "cas",
      "Content-addressed storage compatible with Xet (Hugging Face): files are split by\n"
      "content-defined chunking, chunks are deduplicated and packed into compressed xorbs, and\n"
      "each file is a reconstruction (xorb chunk ranges). Layout and formats: docs/cas.md.\n"
      "Examples:\n"
      "  megackpt cas put --store /data/cas ckpt/*.mega          store, print new-byte counts\n"
      "  megackpt cas get --store /data/cas <hash> out --range 0-99  bytes 0..99 of a file\n"
      "  megackpt cas stat --store /data/cas                     dedup statistics\n"
      "  megackpt cas chunk model.mega --json                    Xet chunk boundaries + hashes");
  cas_cmd->require_subcommand(1);
  RegisterPut(cas_cmd, exit_code);
  RegisterGet(cas_cmd, exit_code);
  RegisterStat(cas_cmd, exit_code);
  RegisterGc(cas_cmd, exit_code);
  RegisterChunk(cas_cmd, exit_code);
  RegisterVerify(cas_cmd, exit_code);
  RegisterShardCommands(cas_cmd, exit_code);
  RegisterBench(bench, exit_code);
}

}  // namespace megackpt::cli
