// MEGA storage commands: `megackpt consolidate` and `megackpt bench mega`.
#include <cctype>
#include <cstdio>
#include <memory>
#include <string>

#include "mega_bench.h"
#include "megackpt/commands.h"
#include "megackpt/core/status.h"
#include "megackpt/dcp/consolidate.h"

namespace megackpt::cli {

void RegisterMegaStorageCommands(CLI::App& app, CLI::App& bench, int* exit_code) {
  // consolidate
  {
    auto* cmd = app.add_subcommand(
        "consolidate",
        "Turn a (sharded) checkpoint into whole tensors: one entry per name, in\n"
        "model-NNNNN-of-MMMMM.mega + model.mega.index.json (or .safetensors +\n"
        "model.safetensors.index.json; a single file is model.mega / model.safetensors).\n"
        "SRC is anything the MEGA storage reader opens: a MegaStorageWriter checkpoint folder,\n"
        "a folder or index of .mega or .safetensors shards, or one such file; or an fs-layout\n"
        "DCP checkpoint folder (.metadata + .distcp data files). DST is a folder\n"
        "(may be SRC: consolidates in place). Streaming: memory stays around the largest\n"
        "tensor per thread. Every chunk read is checksum-verified. DST is committed like a\n"
        "save (index, then .metadata, then old files removed), so a crash leaves the old or\n"
        "the new content. Afterwards the index's weight_map maps every name to the one file\n"
        "holding its whole tensor.\n"
        "Examples:\n"
        "  megackpt consolidate /ckpt/step100 /export/step100\n"
        "  megackpt consolidate /ckpt/step100 /hf/model --format safetensors --max-shard-size 5GB\n"
        "Exit: 0 ok; 1 unreadable/corrupt source or write failure (message names file and\n"
        "tensor); 2 usage error.");
    struct Args {
      std::string src, dst, format = "mega", max_shard = "0";
      int threads = 2;
      bool no_sync = false;
      std::string checksum = "crc32";
    };
    auto a = std::make_shared<Args>();
    cmd->add_option("SRC", a->src, "Source checkpoint (folder, index or shard file)")->required();
    cmd->add_option("DST", a->dst, "Destination folder (may equal SRC)")->required();
    cmd->add_option("--format", a->format, "Output format: mega (default) or safetensors")
        ->check(CLI::IsMember({"mega", "safetensors"}));
    cmd->add_option("--max-shard-size", a->max_shard,
                    "Largest output file in tensor bytes, e.g. 5GB, 500MiB (default: no limit)");
    cmd->add_option("--threads", a->threads, "Output files written in parallel (default 2)")
        ->check(CLI::Range(1, 256));
    cmd->add_option("--checksum", a->checksum, "MEGA outputs: crc32 (default), sha256 or none")
        ->check(CLI::IsMember({"crc32", "sha256", "none"}));
    cmd->add_flag("--no-sync", a->no_sync,
                  "Skip fsync (faster; atomic but not durable across power loss)");
    AddJsonFlag(cmd,
                "Print {\"src\", \"dst\", \"format\", \"tensors\", \"bytes\", \"files\", "
                "\"paths\", \"index\"}");
    cmd->callback([a, exit_code] {
      dcp::ConsolidateOptions o;
      if (!ParseSizeFlag("consolidate", "--max-shard-size", a->max_shard, &o.max_shard_size,
                         exit_code))
        return;
      o.format = a->format == "safetensors" ? dcp::ConsolidateFormat::kSafetensors
                                            : dcp::ConsolidateFormat::kMega;
      o.thread_count = a->threads;
      o.sync = !a->no_sync;
      o.checksum = a->checksum == "sha256" ? format::MegaChecksumType::kSha256
                   : a->checksum == "none" ? format::MegaChecksumType::kNone
                                           : format::MegaChecksumType::kCrc32;
      auto r = dcp::Consolidate(a->src, a->dst, o);
      if (!r.ok()) {
        *exit_code = ReportError("consolidate", r.status(), ExitCodeFor(r.status()));
        return;
      }
      *exit_code = kExitOk;
      if (JsonOutput()) {
        PrintJson({{"src", a->src},
                   {"dst", a->dst},
                   {"format", a->format},
                   {"tensors", r->entries},
                   {"bytes", r->total_size},
                   {"files", r->files.size()},
                   {"paths", r->files},
                   {"index", r->index_file}});
        return;
      }
      std::printf("consolidated %zu entries (%llu tensor bytes) into %zu file(s) + %s in %s\n",
                  r->entries, static_cast<unsigned long long>(r->total_size), r->files.size(),
                  r->index_file.c_str(), a->dst.c_str());
      for (const auto& f : r->files) std::printf("  %s\n", f.c_str());
    });
  }
  // bench mega
  {
    auto o = std::make_shared<bench::MegaBenchOptions>();
    auto* cmd = AddStateBench(
        bench, "mega",
        "Save and load a state of --size bytes (--tensors row-sharded F32 tensors, 16) from\n"
        "--world-size ranks (threads, or --backend mpi) through MegaStorageWriter/Reader, next\n"
        "to the machine's limits measured the same way in the same run: durable save vs write\n"
        "+ fsync of the same bytes; --no-sync save vs page-cache write (and, as a reference,\n"
        "vs plain writers computing the same block CRCs before each pwrite); load into\n"
        "caller-allocated, pre-faulted, reused tensors vs a warm page-cache read; the time the\n"
        "caller is blocked in async_save (staging) vs the synchronous save and the memcpy of\n"
        "the state. Each limit is the best of 1, 2 and world-size x threads plain threads.\n"
        "Medians of --reps runs after a dropped warm-up; decimal GB/s. bench/torch_peer.py\n"
        "prints torch.save/torch.load and torch DCP numbers for the same state.\n"
        "JSON keys: save_gbps, save_nosync_gbps, load_gbps, durable_write_gbps,\n"
        "pagecache_write_gbps, pagecache_read_gbps, checksummed_write_gbps,\n"
        "async_blocked_seconds, sync_save_seconds (each + _min/_max) and the ratios.\n"
        "--tensors 1: one large tensor (a load reads it in byte-range parts on every thread).\n"
        "With --backend mpi run it as: mpirun -np N megackpt bench mega --backend mpi ...",
        o, &bench::RunMegaBench, exit_code);
    cmd->add_option("--backend", o->backend, "threads (default) or mpi")
        ->check(CLI::IsMember({"threads", "mpi"}));
    cmd->add_option("--tensors", o->tensors, "F32 tensors in the state (default 16)")
        ->check(CLI::Range(1, 4096));
    cmd->add_flag(
        "--direct-io", o->direct_io,
        "Durable saves write their shards with direct I/O (MegaStorageWriterOptions::direct_io)");
    AddStatePagesFlag(cmd, &o->pages);
    AddOverPreviousFlag(cmd, &o->over_previous);
  }
}

void AddOverPreviousFlag(CLI::App* cmd, bool* on) {
  cmd->add_flag("--over-previous", *on,
                "Every save writes over the previous save, in its folder (a training loop\n"
                "that saves to one path): the superseded files are garbage the save removes\n"
                "(FileSystem::RemoveGarbage). The plain writers of the write limits write next\n"
                "to the previous save too. Default: each save into an emptied folder");
}

void AddStatePagesFlag(CLI::App* cmd, bench::StatePages* pages) {
  cmd->add_option_function<std::string>(
         "--state-pages",
         [pages](const std::string& v) {
           *pages = v == "4k" ? bench::StatePages::kSmall : bench::StatePages::kHuge;
         },
         "Pages of the state's memory and of the limits' buffers: huge (default:\n"
         "transparent huge pages, pre-faulted) or 4k (MADV_NOHUGEPAGE, as torch and numpy\n"
         "tensors get where THP is 'madvise'; docs/benchmarks.md, 'Saves from 4 KiB pages')")
      ->type_name("huge|4k")
      ->check(CLI::IsMember({"huge", "4k"}));
}

}  // namespace megackpt::cli
