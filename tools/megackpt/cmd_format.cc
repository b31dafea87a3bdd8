// Format commands: `megackpt inspect`, `verify`, `convert` and `bench format`.
//
// All three file commands accept the same kinds of PATH (docs/format/index-json.md,
// "CLI"): a .mega file, a .safetensors file, a `*.mega.index.json` or
// `*.safetensors.index.json` index, or a folder holding exactly one index (or,
// without an index, exactly one .mega / .safetensors file).
//
// The checkpoint opening and the conversion engine live in the library
// (include/megackpt/format/convert.h); this file parses flags and prints.
//
// Exit codes: 0 success; 1 the data is corrupt, malformed, missing or could not
// be written (the message names the file and tensor); 2 usage errors (bad flags
// or option values, an input that is neither of the kinds above, an ambiguous
// folder).
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "megackpt/commands.h"
#include "megackpt/core/file.h"
#include "megackpt/core/path_safety.h"
#include "megackpt/core/tensor.h"
#include "megackpt/core/text.h"
#include "megackpt/core/thread_pool.h"
#include "megackpt/dcp/checkpoint_folder.h"
#include "megackpt/format/convert.h"
#include "megackpt/format/index_file.h"
#include "megackpt/format/inspect.h"
#include "megackpt/format/mega.h"
#include "megackpt/format/safetensors.h"
#include "megackpt/fs/filesystem.h"

namespace megackpt::bench {
// Defined in bench/format_bench.cc. Returns the process exit code.
int RunFormatBench(uint64_t size_bytes, int reps, int num_tensors, bool json,
                   const std::string& dir);
}  // namespace megackpt::bench

namespace megackpt::cli {
namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

// ---- small helpers -------------------------------------------------------------

// ---- inspect ------------------------------------------------------------------------

std::string Truncate(std::string s, size_t n) {
  if (s.size() > n) s = s.substr(0, n - 3) + "...";
  return s;
}

void PrintInspectTable(const format::OpenedCheckpoint& model) {
  std::printf("%s: %s, %zu tensors, %s of tensor data in %zu file%s\n", model.input.path.c_str(),
              std::string(format::CheckpointKindName(model.input.kind)).c_str(),
              model.tensors.size(), HumanBytes(model.total_bytes).c_str(), model.files.size(),
              model.files.size() == 1 ? "" : "s");
  json meta = json::parse(format::CheckpointMetadataJson(model), nullptr, false);
  if (meta.is_object() && !meta.empty()) {
    std::printf("metadata:\n");
    for (auto it = meta.begin(); it != meta.end(); ++it) {
      std::string v = it->is_string() ? it->get<std::string>() : it->dump();
      std::printf("  %-40s %s\n", it.key().c_str(), Truncate(v, 100).c_str());
    }
  }
  size_t wname = 4, wshape = 5, wfile = 4;
  for (const auto& t : model.tensors) {
    wname = std::max(wname, std::min<size_t>(EscapeBytes(t.name).size(), 60));
    wshape = std::max(wshape, ShapeToString(t.shape).size());
    wfile = std::max(wfile, model.files[t.file].name.size());
  }
  std::printf("%-*s  %-8s  %-*s  %14s  %-*s\n", static_cast<int>(wname), "name", "dtype",
              static_cast<int>(wshape), "shape", "nbytes", static_cast<int>(wfile), "file");
  for (const auto& t : model.tensors) {
    std::printf("%-*s  %-8s  %-*s  %14llu  %-*s\n", static_cast<int>(wname),
                Truncate(EscapeBytes(t.name), 60).c_str(), std::string(DTypeName(t.dtype)).c_str(),
                static_cast<int>(wshape), ShapeToString(t.shape).c_str(),
                static_cast<unsigned long long>(t.nbytes), static_cast<int>(wfile),
                model.files[t.file].name.c_str());
  }
}

// The folder of a DCP checkpoint (fs or MEGA storage) when PATH is one (a folder
// holding .metadata, or that .metadata file): inspect, verify and convert then
// describe it from its .metadata (dcp/checkpoint_folder.h), so they agree on
// what it holds.
std::optional<std::string> DcpFolder(const std::string& path) {
  std::error_code ec;
  stdfs::path p(path);
  if (p.filename() == ".metadata") {
    std::string dir = p.parent_path().string();
    return dir.empty() ? std::string(".") : dir;
  }
  if (stdfs::is_directory(p, ec) && stdfs::exists(stdfs::symlink_status(p / ".metadata", ec))) {
    // A pickled .metadata (TensorPlay's / torch's own writers): the folder is
    // read through its index and shards, as the MEGA reader does.
    if (dcp::HasForeignMetadata(*fs::LocalFileSystem(), path)) return std::nullopt;
    return path;
  }
  return std::nullopt;
}

std::string FilesOf(const dcp::EntrySummary& e) {
  if (e.files.size() == 1) return e.files[0];
  return std::to_string(e.files.size()) + " files";
}

std::string DcpCountLine(const dcp::CheckpointSummary& s) {
  std::string line = std::to_string(s.tensors) + " tensors";
  if (s.bytes_values) line += " + " + std::to_string(s.bytes_values) + " bytes values";
  line += ", " + HumanBytes(s.tensor_bytes + s.bytes_value_bytes);
  size_t pieces = s.metadata.storage_data.size();
  line += " (" + std::to_string(s.sharded_tensors) + " sharded, " + std::to_string(pieces) +
          " stored pieces) in " + std::to_string(s.files.size()) + " file" +
          (s.files.size() == 1 ? "" : "s");
  return line;
}

int RunInspectDcp(const std::string& dir, bool as_json) {
  auto s = dcp::DescribeDcpCheckpoint(dir);
  if (!s.ok()) {
    return ReportError("inspect", s.status());
  }
  if (as_json) {
    ordered_json doc = ordered_json::object();
    doc["format"] = std::string(dcp::StorageLayoutName(s->layout));
    doc["path"] = dir;
    ordered_json meta = ordered_json::object();
    meta["producer"] = s->metadata.version;
    if (s->metadata.storage_meta) meta["save_id"] = s->metadata.storage_meta->save_id;
    doc["metadata"] = std::move(meta);
    ordered_json tensors = ordered_json::array(), bytes = ordered_json::array();
    for (const auto& e : s->entries) {
      ordered_json j = ordered_json::object();
      j["name"] = e.fqn;
      if (e.is_bytes) {
        j["nbytes"] = e.nbytes;
        j["file"] = FilesOf(e);
        bytes.push_back(std::move(j));
        continue;
      }
      j["dtype"] = std::string(DTypeName(e.dtype));
      j["shape"] = e.shape;
      j["nbytes"] = e.nbytes;
      j["file"] = FilesOf(e);
      j["chunks"] = e.chunks;
      j["files"] = e.files;
      tensors.push_back(std::move(j));
    }
    doc["tensors"] = std::move(tensors);
    doc["bytes"] = std::move(bytes);
    ordered_json files = ordered_json::array();
    for (const auto& f : s->files) {
      std::error_code ec;
      files.push_back(
          {{"name", f},
           {"size", static_cast<uint64_t>(stdfs::file_size(stdfs::path(dir) / f, ec))}});
    }
    doc["files"] = std::move(files);
    doc["total_nbytes"] = s->tensor_bytes;
    doc["stored_pieces"] = s->metadata.storage_data.size();
    std::printf("%s\n", doc.dump(2, ' ', false, ordered_json::error_handler_t::replace).c_str());
    return kExitOk;
  }
  std::printf("%s: %s checkpoint, %s\n", dir.c_str(), dcp::StorageLayoutName(s->layout),
              DcpCountLine(*s).c_str());
  size_t wname = 4, wshape = 5;
  for (const auto& e : s->entries) {
    wname = std::max(wname, std::min<size_t>(EscapeBytes(e.fqn).size(), 60));
    wshape = std::max(wshape, ShapeToString(e.shape).size());
  }
  std::printf("%-*s  %-8s  %-*s  %14s  %6s  %s\n", static_cast<int>(wname), "name", "dtype",
              static_cast<int>(wshape), "shape", "nbytes", "chunks", "file");
  for (const auto& e : s->entries) {
    std::printf("%-*s  %-8s  %-*s  %14llu  %6zu  %s\n", static_cast<int>(wname),
                Truncate(EscapeBytes(e.fqn), 60).c_str(),
                e.is_bytes ? "bytes" : std::string(DTypeName(e.dtype)).c_str(),
                static_cast<int>(wshape), ShapeToString(e.shape).c_str(),
                static_cast<unsigned long long>(e.nbytes), e.chunks, FilesOf(e).c_str());
  }
  return kExitOk;
}

int RunInspect(const std::string& path, bool as_json) {
  if (auto dir = DcpFolder(path)) return RunInspectDcp(*dir, as_json);
  auto input = format::ResolveCheckpointPath(path);
  if (!input.ok()) {
    return ReportError("inspect", input.status(), ExitCodeFor(input.status()));
  }
  auto model = format::OpenCheckpoint(*input, {.mmap = false, .verify_checksums = false});
  if (!model.ok()) {
    return ReportError("inspect", model.status());
  }
  if (as_json) {
    std::printf("%s\n", format::InspectJson(*model).c_str());
  } else {
    PrintInspectTable(*model);
  }
  return kExitOk;
}

// ---- verify -------------------------------------------------------------------------

// A DCP checkpoint (fs or MEGA storage): every stored piece read whole through
// the storage's reader with verification on (dcp::VerifyDcpCheckpoint: every
// checksum block of every .distcp item); MEGA folders also get the index and
// shard checks of format::VerifyCheckpoint. Counts come from .metadata, as
// inspect shows them.
// The outcome of a verify, shown as text or (--json) as one object:
// {"path", "ok", "kind", "files", "files_ok", "tensors", "bytes", "problems",
// "warnings"} plus, when not ok, "error": {"code": "DataLoss", "message"}.
struct VerifyOutcome {
  std::string path;
  std::string kind;  // CheckpointKindName, or "dcp-mega" / "dcp-fs"
  uint64_t files = 0, files_ok = 0, tensors = 0, bytes = 0;
  std::vector<std::string> problems, warnings;
  std::string ok_line;  // the text line printed on success
};

int ReportVerify(const VerifyOutcome& v, bool quiet) {
  for (const auto& w : v.warnings) ReportWarning("verify", w);
  for (const auto& p : v.problems)
    std::fprintf(stderr, "megackpt: error: verify: FAILED: %s\n", p.c_str());
  const std::string summary =
      v.path + ": " + std::to_string(v.problems.size()) + " problem" +
      (v.problems.size() == 1 ? "" : "s") +
      (v.files ? " (" + std::to_string(v.files_ok) + " of " + std::to_string(v.files) + " files OK)"
               : "");
  if (!v.problems.empty()) std::fprintf(stderr, "megackpt: error: verify: %s\n", summary.c_str());
  if (JsonOutput()) {
    nlohmann::ordered_json j = {
        {"path", v.path},   {"ok", v.problems.empty()}, {"kind", v.kind},
        {"files", v.files}, {"files_ok", v.files_ok},   {"tensors", v.tensors},
        {"bytes", v.bytes}, {"problems", v.problems},   {"warnings", v.warnings}};
    if (!v.problems.empty()) j["error"] = {{"code", "DataLoss"}, {"message", "verify: " + summary}};
    PrintJson(j);
  } else if (!quiet && v.problems.empty()) {
    std::printf("%s\n", v.ok_line.c_str());
  }
  return v.problems.empty() ? kExitOk : kExitFailure;
}

int RunVerifyDcp(const std::string& dir, bool quiet) {
  auto report = dcp::VerifyDcpCheckpoint(dir);
  if (!report.ok()) return ReportError("verify: FAILED", report.status());
  VerifyOutcome v;
  v.path = dir;
  v.kind = dcp::StorageLayoutName(report->summary.layout);
  v.tensors = report->summary.tensors;
  v.bytes = report->bytes_checked;
  for (const Status& p : report->problems) v.problems.push_back(p.ToString());
  if (report->summary.layout == dcp::StorageLayout::kMega) {
    auto shards = format::VerifyCheckpoint(dir);
    if (!shards.ok()) {
      v.problems.push_back(shards.status().ToString());
    } else {
      v.problems.insert(v.problems.end(), shards->problems.begin(), shards->problems.end());
      v.warnings = shards->warnings;
      v.files = shards->files;
      v.files_ok = shards->files_ok;
    }
  }
  v.ok_line = "OK " + dir + ": " + dcp::StorageLayoutName(report->summary.layout) +
              " checkpoint, " + DcpCountLine(report->summary) + "; " +
              std::to_string(report->chunks_checked) + " pieces (" +
              HumanBytes(report->bytes_checked) + ") read and verified";
  return ReportVerify(v, quiet);
}

int RunVerify(const std::string& path, bool quiet) {
  if (auto dir = DcpFolder(path)) return RunVerifyDcp(*dir, quiet);
  auto report = format::VerifyCheckpoint(path);
  if (!report.ok()) {
    return ReportError("verify", report.status(), ExitCodeFor(report.status()));
  }
  const format::CheckpointPath& input = report->input;
  VerifyOutcome v;
  v.path = input.path;
  v.kind = std::string(format::CheckpointKindName(input.kind));
  v.files = report->files;
  v.files_ok = report->files_ok;
  v.tensors = report->tensors;
  v.bytes = report->bytes;
  v.problems = report->problems;
  v.warnings = report->warnings;
  const bool safetensors = input.kind == format::CheckpointKind::kSafetensorsFile ||
                           input.kind == format::CheckpointKind::kSafetensorsIndex;
  v.ok_line = "OK " + input.path + ": " + v.kind + ", " + std::to_string(v.files) + " file" +
              (v.files == 1 ? "" : "s") + ", " + std::to_string(v.tensors) + " tensors, " +
              HumanBytes(v.bytes) + " verified" +
              (safetensors ? " (structure only: safetensors has no checksums)" : "");
  return ReportVerify(v, quiet);
}

// ---- convert ------------------------------------------------------------------------

// ProgressLine on stderr: "convert:  27%  1.23 GB / 4.56 GB  1.80 GB/s".
// Updated by a ticker thread; `Watch` adds the growing size of a file being
// written by code that reports no progress itself (the MEGA writer).
class Progress {
 public:
  Progress(bool enabled, uint64_t total) : enabled_(enabled && !JsonOutput()), total_(total) {
    start_ = NowSeconds();
    if (enabled_) ticker_ = std::thread([this] { Tick(); });
  }
  ~Progress() { Stop(); }

  void Add(uint64_t n) { done_ += n; }
  void Watch(const std::string& path, uint64_t base_offset) {
    std::lock_guard<std::mutex> lock(mu_);
    watch_ = path;
    watch_base_ = base_offset;
  }
  void Unwatch() {
    std::lock_guard<std::mutex> lock(mu_);
    watch_.clear();
  }
  void Stop() {
    if (!enabled_) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    cv_.notify_all();
    ticker_.join();
    Print(true);
  }

 private:
  void Tick() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopped_) {
      cv_.wait_for(lock, std::chrono::milliseconds(250));
      if (stopped_) break;
      lock.unlock();
      Print(false);
      lock.lock();
    }
  }
  void Print(bool final) {
    uint64_t shown = done_.load();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!watch_.empty() && !final) {
        struct stat st;
        if (::stat(watch_.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) > watch_base_) {
          shown += static_cast<uint64_t>(st.st_size) - watch_base_;
        }
      }
    }
    shown = std::min(shown, total_);
    double secs = std::max(1e-9, NowSeconds() - start_);
    std::fprintf(stderr, "\r\033[K%s%s", ProgressLine("convert", shown, total_, secs).c_str(),
                 final ? "\n" : "");
    std::fflush(stderr);
  }

  bool enabled_;
  uint64_t total_;
  double start_ = 0;
  std::atomic<uint64_t> done_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread ticker_;
  std::string watch_;
  uint64_t watch_base_ = 0;
  bool stopped_ = false;
};

// Reports WriteConversion's progress to a Progress line.
class ProgressListener : public format::ConvertListener {
 public:
  explicit ProgressListener(Progress* progress) : progress_(progress) {}
  void OnBytesWritten(uint64_t bytes) override { progress_->Add(bytes); }
  void OnFileWriteBegin(const std::string& path) override { progress_->Watch(path, 0); }
  void OnFileWriteEnd(const std::string&) override { progress_->Unwatch(); }

 private:
  Progress* progress_;
};

// `mega_options_given`: a MEGA-only option was on the command line (a note
// says it is ignored for safetensors output).
int RunConvert(const std::string& src_path, const std::string& dst, const format::ConvertOptions& o,
               bool show_progress, bool mega_options_given) {
  // A DCP checkpoint converts only when every entry is a whole tensor in MEGA /
  // safetensors shards; anything else would lose entries.
  std::optional<dcp::CheckpointSummary> dcp_summary;
  if (auto dir = DcpFolder(src_path)) {
    auto s = dcp::DescribeDcpCheckpoint(*dir);
    if (!s.ok()) {
      return ReportError("convert", s.status());
    }
    if (s->layout == dcp::StorageLayout::kFileSystem || s->sharded_tensors > 0) {
      return ReportError(
          "convert",
          FailedPreconditionError(
              *dir + " is a " + dcp::StorageLayoutName(s->layout) + " checkpoint with " +
              std::to_string(s->sharded_tensors) + " of " + std::to_string(s->tensors) +
              " tensors stored in chunks" +
              (s->layout == dcp::StorageLayout::kFileSystem ? " (fs layout: .distcp data files)"
                                                            : "") +
              "; convert reads whole tensors from MEGA/safetensors files and would drop entries. "
              "Run "
              "`megackpt consolidate " +
              *dir +
              " DST` (whole tensors, MEGA or --format safetensors) "
              "first, then convert DST"));
    }
    dcp_summary = std::move(*s);
  }
  auto input = format::ResolveCheckpointPath(src_path);
  if (!input.ok()) {
    return ReportError("convert", input.status(), ExitCodeFor(input.status()));
  }
  auto model = format::OpenCheckpoint(*input, {.mmap = true, .verify_checksums = true});
  if (!model.ok()) {
    return ReportError("convert", model.status());
  }
  if (dcp_summary && model->tensors.size() != dcp_summary->tensors + dcp_summary->bytes_values) {
    return ReportError(
        "convert", FailedPreconditionError(
                       src_path + ": its .metadata holds " + std::to_string(dcp_summary->tensors) +
                       " tensors + " + std::to_string(dcp_summary->bytes_values) +
                       " bytes values but its index maps " + std::to_string(model->tensors.size()) +
                       "; convert would not carry every entry. Run `megackpt consolidate` first"));
  }
  auto dest = format::PlanDestination(dst, model->format(), o);
  if (!dest.ok()) {
    return ReportError("convert", dest.status(), kExitUsage);
  }
  if (dest->format == format::ModelFormat::kSafetensors && mega_options_given) {
    ReportWarning(
        "convert",
        "--alignment/--checksum/--compression/--shuffle apply to MEGA output only; ignored for "
        "safetensors");
  }
  auto plan = format::PlanConversion(*model, *dest, o);
  if (!plan.ok()) {  // an output would overwrite the source (2), or sharded input (1)
    // an output would overwrite the source (usage), or sharded input (failure)
    return ReportError(
        "convert", plan.status(),
        plan.status().code() == StatusCode::kFailedPrecondition ? kExitFailure : kExitUsage);
  }
  Progress progress(show_progress, model->total_bytes);
  ProgressListener listener(&progress);
  const double t0 = NowSeconds();
  Status status = format::WriteConversion(*model, *plan, o, &listener);
  progress.Stop();
  if (!status.ok()) {
    return ReportError("convert", status);
  }
  const double secs = std::max(1e-9, NowSeconds() - t0);
  const size_t num_files = plan->shards.size();
  if (JsonOutput()) {
    PrintJson({{"src", src_path},
               {"dst", dest->output_path()},
               {"format", std::string(format::ModelFormatName(dest->format))},
               {"tensors", model->tensors.size()},
               {"files", num_files},
               {"index", dest->folder},
               {"bytes", model->total_bytes},
               {"seconds", secs},
               {"gbps", model->total_bytes / secs / 1e9}});
    return kExitOk;
  }
  std::printf("converted %zu tensors (%s) from %s to %s: %zu %s file%s%s in %.2f s (%s)\n",
              model->tensors.size(), HumanBytes(model->total_bytes).c_str(),
              std::string(format::CheckpointKindName(input->kind)).c_str(),
              dest->output_path().c_str(), num_files,
              std::string(format::ModelFormatName(dest->format)).c_str(), num_files == 1 ? "" : "s",
              dest->folder ? " + index" : "", secs, HumanRate(model->total_bytes / secs).c_str());
  return kExitOk;
}

}  // namespace

void RegisterFormatCommands(CLI::App& app, CLI::App& bench, int* exit_code) {
  // inspect
  {
    auto* cmd = app.add_subcommand(
        "inspect",
        "List the tensors (name, dtype, shape, bytes, file) and metadata of a checkpoint.\n"
        "PATH is a .mega file, a .safetensors file, a *.mega.index.json or\n"
        "*.safetensors.index.json index, or a folder holding one index (or one model file).\n"
        "Only headers are read. Exit 0 ok, 1 unreadable/malformed input, 2 usage error.\n"
        "JSON (--json): {\"format\": "
        "\"mega\"|\"safetensors\"|\"mega-index\"|\"safetensors-index\",\n"
        "  \"metadata\": {...}, \"tensors\": [{\"name\", \"dtype\", \"shape\", \"nbytes\", "
        "\"file\", ...}],\n"
        "  \"files\": [...], \"total_nbytes\": N}");
    auto path = AddRequiredArg(cmd, "PATH", "File, index or folder");
    auto as_json = AddSharedFlag(cmd, "--json", "Print one JSON document instead of a table");
    cmd->callback([=] { *exit_code = RunInspect(*path, *as_json); });
  }
  // verify
  {
    auto* cmd = app.add_subcommand(
        "verify",
        "Check every structure rule and every checksum of a checkpoint.\n"
        "MEGA: header/directory validation and each tensor's CRC32/SHA-256 (every failing\n"
        "tensor is reported). safetensors: full header validation (no checksums exist).\n"
        "Index: every shard exists and verifies, every weight_map entry is in its shard,\n"
        "every shard tensor is in the weight_map (a wrong metadata.total_size is a warning).\n"
        "Exit 0 all good; 1 corrupt, malformed or missing data (messages name file and\n"
        "tensor; a PATH that does not exist is 1 too); 2 usage error (bad flags, an input\n"
        "that is not a checkpoint, a folder with several indexes).");
    auto path = AddRequiredArg(cmd, "PATH", "File, index or folder");
    auto quiet = AddSharedFlag(cmd, "-q,--quiet", "Print nothing on success");
    AddJsonFlag(cmd,
                "Print {\"path\", \"ok\", \"kind\", \"files\", \"files_ok\", \"tensors\", "
                "\"bytes\", \"problems\", \"warnings\"} (+ \"error\" when not ok)");
    cmd->callback([=] { *exit_code = RunVerify(*path, *quiet); });
  }
  // convert
  {
    auto* cmd = app.add_subcommand(
        "convert",
        "Convert between MEGA and safetensors, or re-shard, preserving every tensor's bytes,\n"
        "name, dtype and shape.\n"
        "SRC: a .mega / .safetensors file, an index, or a folder with an index.\n"
        "DST: NAME.mega or NAME.safetensors = one file; NAME.mega.index.json or\n"
        "NAME.safetensors.index.json = a folder of NAME-0000N-of-0000M shards + that index;\n"
        "any other path = a folder with model-0000N-of-0000M.{mega|safetensors} +\n"
        "model.{mega|safetensors}.index.json (format: --format, default the other format\n"
        "than SRC's). Shards are filled greedily in source order up to --max-shard-size.\n"
        "Data streams from the source (mmap views / bounded buffers): memory stays bounded\n"
        "by the largest tensor. Files appear under their final names only when complete;\n"
        "the index is written last, atomically. MEGA output is TensorPlay-compatible;\n"
        "safetensors __metadata__ is carried as MEGA strings 'safetensors.metadata.<key>'.\n"
        "Examples:\n"
        "  megackpt convert model.safetensors out/                  # -> MEGA folder\n"
        "  megackpt convert out/ back.safetensors                   # -> one safetensors file\n"
        "  megackpt convert hf_model/ mega/ --max-shard-size 2GB --compression zstd:3 --shuffle");
    auto max_shard = std::make_shared<std::string>();
    auto alignment = std::make_shared<uint64_t>(4096);
    auto checksum = std::make_shared<std::string>("crc32");
    auto compression = std::make_shared<std::string>("none");
    auto shuffle = std::make_shared<bool>(false);
    auto format = std::make_shared<std::string>();
    auto src = AddRequiredArg(cmd, "SRC", "Source file, index or folder");
    auto dst = AddRequiredArg(cmd, "DST", "Destination file, index name or folder");
    auto* o_max = cmd->add_option("--max-shard-size", *max_shard,
                                  "Folder outputs: max tensor bytes per shard, e.g. 5GB (=5e9, "
                                  "the default), 500MiB, 1000000");
    auto* o_align =
        cmd->add_option("--alignment", *alignment,
                        "MEGA: header alignment (general.alignment), > 0 (default 4096)");
    auto* o_sum =
        cmd->add_option("--checksum", *checksum, "MEGA: none|crc32|sha256 (default crc32)");
    auto* o_comp = cmd->add_option("--compression", *compression,
                                   "MEGA: none|zstd[:level] (default none; tensors that do not "
                                   "shrink stay raw)");
    auto* o_shuf = cmd->add_flag("--shuffle", *shuffle, "MEGA: byte-shuffle before compressing");
    cmd->add_option("--format", *format, "Folder outputs: mega|safetensors");
    auto progress =
        AddSharedFlag(cmd, "--progress", "Show progress on stderr even when it is not a terminal");
    auto no_progress = AddSharedFlag(cmd, "--no-progress", "Never show progress");
    AddJsonFlag(cmd,
                "Print {\"src\", \"dst\", \"format\", \"tensors\", \"files\", \"index\", "
                "\"bytes\", \"seconds\", \"gbps\"} (no progress)");
    auto no_sync =
        AddSharedFlag(cmd, "--no-sync", "Skip fsync of the written files (faster, not crash-safe)");
    cmd->callback([=] {
      format::ConvertOptions o;
      auto usage = [&](const std::string& msg) { *exit_code = ReportUsage("convert", msg); };
      if (o_max->count() > 0) {
        auto v = ParseByteSize(*max_shard);
        if (!v.ok()) return usage("--max-shard-size: " + v.status().message());
        if (*v == 0) return usage("--max-shard-size must be > 0");
        o.max_shard_size = *v;
      }
      if (*alignment == 0) return usage("--alignment must be > 0");
      o.alignment = *alignment;
      std::string sum = ToLower(*checksum);
      if (sum == "none") {
        o.checksum = format::MegaChecksumType::kNone;
      } else if (sum == "crc32") {
        o.checksum = format::MegaChecksumType::kCrc32;
      } else if (sum == "sha256") {
        o.checksum = format::MegaChecksumType::kSha256;
      } else {
        return usage("--checksum must be none, crc32 or sha256 (got '" + *checksum + "')");
      }
      std::string comp = ToLower(*compression);
      if (comp == "none") {
        o.compression = format::MegaCodec::kNone;
      } else if (comp == "zstd" || comp.rfind("zstd:", 0) == 0) {
        o.compression = format::MegaCodec::kZstd;
        if (comp.size() > 5) {
          char* end = nullptr;
          long level = std::strtol(comp.c_str() + 5, &end, 10);
          if (*end != '\0' || level < -7 || level > 22) {
            return usage("--compression zstd:LEVEL needs a level in [-7, 22]");
          }
          o.zstd_level = static_cast<int>(level);
        }
      } else {
        return usage("--compression must be none or zstd[:level] (got '" + *compression + "')");
      }
      o.shuffle = *shuffle;
      if (!format->empty()) {
        std::string f = ToLower(*format);
        if (f == "mega") {
          o.format = format::ModelFormat::kMega;
        } else if (f == "safetensors") {
          o.format = format::ModelFormat::kSafetensors;
        } else {
          return usage("--format must be mega or safetensors");
        }
      }
      const bool mega_options_given =
          o_align->count() + o_sum->count() + o_comp->count() + o_shuf->count() > 0;
      o.sync = !*no_sync;
      const bool show_progress = !*no_progress && (*progress || isatty(STDERR_FILENO));
      *exit_code = RunConvert(*src, *dst, o, show_progress, mega_options_given);
    });
  }
  // bench format
  {
    auto* cmd = bench.add_subcommand(
        "format",
        "Write and read a multi-tensor file in MEGA and safetensors, next to the machine's\n"
        "limits measured the same way in the same process: memcpy, page-cache write of a\n"
        "plain file of the same size, page-cache read into a reused buffer, each the best of 1,\n"
        "2 and N plain threads (N = the default pool's size). Reads go into\n"
        "caller-allocated, pre-faulted, reused tensors. Every configuration runs once per\n"
        "round (limits and ours interleaved, so machine drift hits both); round 0 is a\n"
        "dropped warm-up; min/median/max of --reps rounds, decimal GB/s. Also times the\n"
        "mmap open of a 10,000-tensor MEGA file. Files go to --dir (default $TMPDIR or /tmp).\n"
        "JSON keys: memcpy_gbps, pagecache_write_gbps, pagecache_read_gbps, mega_write_gbps,\n"
        "mega_read_gbps, safetensors_write_gbps, safetensors_read_gbps (+ _min/_max, and\n"
        "*_ratio vs the limit), mega_open_10k_tensors_ms, ...");
    auto size = std::make_shared<std::string>("2GiB");
    auto reps = std::make_shared<int>(5);
    auto tensors = std::make_shared<int>(64);
    auto dir = std::make_shared<std::string>();
    cmd->add_option("--size", *size, "Bytes of tensor data, e.g. 2GiB (default), 512MB, 1000000");
    cmd->add_option("--reps", *reps, "Measured repetitions (>= 5 recommended; default 5)");
    cmd->add_option("--tensors", *tensors, "Number of tensors in the file (default 64)");
    auto as_json = AddSharedFlag(cmd, "--json", "Print one JSON object");
    cmd->add_option("--dir", *dir, "Folder for the temporary files");
    cmd->callback([=] {
      uint64_t bytes = 0;
      if (!ParseSizeFlag("bench format", "--size", *size, &bytes, exit_code)) return;
      if (*reps < 1 || *tensors < 1) {
        *exit_code = ReportUsage("bench format", "--reps and --tensors must be >= 1");
        return;
      }
      *exit_code = bench::RunFormatBench(bytes, *reps, *tensors, *as_json, *dir);
    });
  }
}

}  // namespace megackpt::cli
