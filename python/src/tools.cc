// inspect / verify / convert / consolidate: the library functions behind the
// CLI commands of the same names, GIL released while they read and write.
#include <cstdint>
#include <optional>
#include <string>

#include "common.h"
#include "megackpt/dcp/consolidate.h"
#include "megackpt/format/convert.h"
#include "megackpt/format/inspect.h"
#include "megackpt/fs/filesystem.h"  // FinishBackgroundFrees

namespace megackpt::python {
namespace {

nb::list StringList(const std::vector<std::string>& v) {
  nb::list out;
  for (const auto& s : v) out.append(nb::str(s.c_str()));
  return out;
}

std::string Inspect(const std::string& path) {
  return WithoutGil([&] { return format::InspectCheckpoint(path, /*indent=*/-1); });
}

nb::dict Verify(const std::string& path) {
  format::VerifyReport report = WithoutGil([&] { return format::VerifyCheckpoint(path); });
  nb::dict out;
  out["path"] = report.input.path;
  out["format"] = std::string(format::CheckpointKindName(report.input.kind));
  out["ok"] = report.ok();
  out["problems"] = StringList(report.problems);
  out["warnings"] = StringList(report.warnings);
  out["files"] = report.files;
  out["files_ok"] = report.files_ok;
  out["tensors"] = report.tensors;
  out["bytes"] = report.bytes;
  return out;
}

Result<format::ModelFormat> FormatFromName(const std::string& name) {
  if (name == "mega") return format::ModelFormat::kMega;
  if (name == "safetensors") return format::ModelFormat::kSafetensors;
  return InvalidArgumentError("format must be 'mega' or 'safetensors' (got '" + name + "')");
}

nb::dict Convert(const std::string& src, const std::string& dst,
                 std::optional<uint64_t> max_shard_size, uint64_t alignment,
                 const std::string& checksum, const std::string& compression, int zstd_level,
                 std::optional<std::string> format_name, bool sync) {
  format::ConvertOptions o;
  o.max_shard_size = max_shard_size;
  if (alignment == 0) ThrowIfError(InvalidArgumentError("convert: alignment must be > 0"));
  o.alignment = alignment;
  o.checksum = Unwrap(ChecksumFromName(checksum));
  if (compression == "none") {
    o.compression = format::MegaCodec::kNone;
  } else if (compression == "zstd") {
    o.compression = format::MegaCodec::kZstd;
  } else {
    ThrowIfError(InvalidArgumentError("convert: compression must be 'none' or 'zstd'"));
  }
  o.zstd_level = zstd_level;
  if (format_name) o.format = Unwrap(FormatFromName(*format_name));
  o.sync = sync;
  format::ConvertSummary s = WithoutGil([&] { return format::ConvertCheckpoint(src, dst, o); });
  nb::dict out;
  out["source_kind"] = std::string(format::CheckpointKindName(s.source_kind));
  out["tensors"] = s.num_tensors;
  out["total_bytes"] = s.total_bytes;
  out["output"] = s.destination.output_path();
  out["format"] = std::string(format::ModelFormatName(s.destination.format));
  out["files"] = StringList(s.files);
  return out;
}

nb::dict Consolidate(const std::string& src, const std::string& dst, const std::string& format_name,
                     uint64_t max_shard_size, int thread_count, bool sync, nb::handle group) {
  dcp::ConsolidateOptions o;
  format::ModelFormat f = Unwrap(FormatFromName(format_name));
  o.format = f == format::ModelFormat::kMega ? dcp::ConsolidateFormat::kMega
                                             : dcp::ConsolidateFormat::kSafetensors;
  o.max_shard_size = max_shard_size;
  if (thread_count < 1)
    ThrowIfError(InvalidArgumentError("consolidate: thread_count must be >= 1"));
  o.thread_count = thread_count;
  o.sync = sync;
  auto pg = GroupFromPython(group);
  dcp::ConsolidateResult c = WithoutGil([&] { return dcp::Consolidate(src, dst, o, pg.get()); });
  nb::dict out;
  out["files"] = StringList(c.files);
  out["total_size"] = c.total_size;
  out["entries"] = c.entries;
  out["index_file"] = c.index_file;
  return out;
}

}  // namespace

void RegisterTools(nb::module_& m) {
  m.def("_finish_background_frees", [] {
    nb::gil_scoped_release release;
    fs::FinishBackgroundFrees();
  });
  m.def("_inspect", &Inspect, nb::arg("path"));
  m.def("_verify", &Verify, nb::arg("path"));
  m.def("_convert", &Convert, nb::arg("src"), nb::arg("dst"), nb::arg("max_shard_size").none(),
        nb::arg("alignment"), nb::arg("checksum"), nb::arg("compression"), nb::arg("zstd_level"),
        nb::arg("format").none(), nb::arg("sync"));
  m.def("_consolidate", &Consolidate, nb::arg("src"), nb::arg("dst"), nb::arg("format"),
        nb::arg("max_shard_size"), nb::arg("thread_count"), nb::arg("sync"),
        nb::arg("group").none());
}

}  // namespace megackpt::python
