// Opening model checkpoints of any supported kind, and converting between MEGA
// and safetensors (docs/format/convert.md).
//
// A checkpoint PATH is a .mega file, a .safetensors file, a `*.mega.index.json`
// or `*.safetensors.index.json` index (docs/format/index-json.md), or a folder
// holding exactly one index (or, without an index, exactly one model file).
//
// Conversion preserves every tensor's name, dtype, shape and bytes. It runs in
// phases so a caller can tell usage problems (InvalidArgument from the
// resolve and the two plan steps) from data problems:
//
//   MEGA_ASSIGN_OR_RETURN(CheckpointPath in, ResolveCheckpointPath(src));
//   MEGA_ASSIGN_OR_RETURN(OpenedCheckpoint model, OpenCheckpoint(in, {}));
//   MEGA_ASSIGN_OR_RETURN(ConvertDestination d, PlanDestination(dst, model.format(), o));
//   MEGA_ASSIGN_OR_RETURN(ConvertPlan plan, PlanConversion(model, d, o));
//   MEGA_RETURN_IF_ERROR(WriteConversion(model, plan, o, listener));
//
// or in one call with ConvertCheckpoint. Data streams from the source (mmap
// views, bounded buffers); memory stays bounded by the largest tensor.
#ifndef MEGACKPT_FORMAT_CONVERT_H_
#define MEGACKPT_FORMAT_CONVERT_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "megackpt/core/dtype.h"
#include "megackpt/core/status.h"
#include "megackpt/format/index_file.h"
#include "megackpt/format/mega.h"
#include "megackpt/format/safetensors.h"

namespace megackpt::format {

// safetensors `__metadata__` entries travel through MEGA files as STRING
// metadata under this key prefix (docs/format/safetensors.md, "Conversion").
inline constexpr std::string_view kSafetensorsMetadataPrefix = "safetensors.metadata.";
// Default --max-shard-size of folder outputs: 5e9 bytes ("5GB", as transformers).
inline constexpr uint64_t kDefaultMaxShardSize = 5'000'000'000ull;

enum class ModelFormat { kMega, kSafetensors };
std::string_view ModelFormatName(ModelFormat f);       // "mega" | "safetensors"
std::string_view ModelFormatExtension(ModelFormat f);  // ".mega" | ".safetensors"

// The format of one model file: by its extension, else by its first bytes.
// InvalidArgument when it is neither; I/O errors (NotFound, ...) as they come.
Result<ModelFormat> SniffModelFormat(const std::string& path);

enum class CheckpointKind { kMegaFile, kSafetensorsFile, kMegaIndex, kSafetensorsIndex };
// "mega" | "safetensors" | "mega-index" | "safetensors-index"
std::string_view CheckpointKindName(CheckpointKind k);
bool IsIndexKind(CheckpointKind k);

struct CheckpointPath {
  CheckpointKind kind = CheckpointKind::kMegaFile;
  std::string path;  // the model file or the index file
};

// Decides what `path` is. NotFound when it does not exist; InvalidArgument for
// an input that is none of the supported kinds, or an ambiguous folder (several
// indexes, several model files without an index); messages name the path. An
// index named only "*.index.json" is classified by its first shard's extension.
Result<CheckpointPath> ResolveCheckpointPath(const std::string& path);

// One opened model file: exactly one of `mega` / `safetensors` is set.
struct CheckpointFile {
  std::string path;  // full path
  std::string name;  // as the index references it (or the base name)
  ModelFormat format = ModelFormat::kMega;
  std::unique_ptr<MegaReader> mega;
  std::unique_ptr<SafetensorsReader> safetensors;
};

struct CheckpointTensor {
  std::string name;
  DType dtype = DType::kU8;
  Shape shape;
  uint64_t nbytes = 0;  // logical bytes
  size_t file = 0;      // index into OpenedCheckpoint::files
  size_t index = 0;     // position in that file's tensor directory
};

struct OpenCheckpointOptions {
  bool mmap = true;              // map files (false: pread)
  bool verify_checksums = true;  // MEGA: verify tensor checksums on read
};

struct OpenedCheckpoint {
  CheckpointPath input;
  std::optional<ShardIndex> index;        // set for index inputs
  std::vector<CheckpointFile> files;      // index inputs: ShardFiles() order
  std::vector<CheckpointTensor> tensors;  // files in order, each in file order
  uint64_t total_bytes = 0;               // sum of tensors[].nbytes
  // Index inputs: tensors the shards hold that the weight_map does not list
  // (e.g. the chunks of a sharded DCP checkpoint), and whether the index lists
  // chunked DCP entries ("tensorplay.dcp.sharded"). PlanConversion refuses such
  // input, which it would otherwise drop, naming `megackpt consolidate`.
  std::vector<std::string> unlisted_tensors;
  bool has_sharded_entries = false;

  // The format of the first file (kSafetensors when there is none).
  ModelFormat format() const;
};

// Opens one model file (format sniffed as SniffModelFormat); `name` is stored
// as CheckpointFile::name. Errors of the readers (NotFound, DataLoss, ...).
Result<CheckpointFile> OpenCheckpointFile(const std::string& path, const std::string& name,
                                          const OpenCheckpointOptions& options);

// Appends the tensors of checkpoint->files[file_id] to checkpoint->tensors (and
// total_bytes), in file order; with `only`, just the tensors named there.
void AppendCheckpointFileTensors(OpenedCheckpoint* checkpoint, size_t file_id,
                                 const std::set<std::string>* only = nullptr);

// Opens every file of the input. For an index, each weight_map entry must be
// in its shard (DataLoss naming index, tensor and shard otherwise; NotFound for
// a missing shard); tensors a shard holds beyond the index are left out of
// `tensors` and named in `unlisted_tensors`. Shard names must stay inside the
// index's folder (symlinks included: DataLoss otherwise).
Result<OpenedCheckpoint> OpenCheckpoint(const CheckpointPath& input,
                                        const OpenCheckpointOptions& options);

// The safetensors-style string metadata of a checkpoint: safetensors
// `__metadata__`, and MEGA STRING entries under kSafetensorsMetadataPrefix
// (prefix removed). Union over files; the first file wins on conflicts.
std::map<std::string, std::string> PortableMetadata(const OpenedCheckpoint& checkpoint);

struct ConvertOptions {
  // Folder outputs: max tensor bytes per shard (nullopt: kDefaultMaxShardSize).
  // Setting it for a single-file destination is an InvalidArgument.
  std::optional<uint64_t> max_shard_size;
  // MEGA output only (ignored for safetensors):
  uint64_t alignment = 4096;  // > 0
  MegaChecksumType checksum = MegaChecksumType::kCrc32;
  MegaCodec compression = MegaCodec::kNone;
  int zstd_level = 3;
  bool shuffle = false;
  // Folder outputs: the output format (nullopt: the other format than the
  // source's). Must agree with a destination's extension when it has one.
  std::optional<ModelFormat> format;
  bool sync = true;  // fsync files and folders
};

// Where the output goes, decided from the DST name alone:
//   NAME.mega / NAME.safetensors    one file;
//   NAME.{mega,safetensors}.index.json   a folder of NAME-0000i-of-0000n shards + that index;
//   any other path                  a folder with model-0000i-of-0000n.<ext> and
//                                   model.<ext>.index.json.
struct ConvertDestination {
  bool folder = false;
  ModelFormat format = ModelFormat::kMega;
  std::string single_path;  // single-file outputs
  std::string dir;          // folder outputs: the folder
  std::string index_path;   // folder outputs
  std::string base = "model";

  // The file a user should open: index_path for folders, else single_path.
  const std::string& output_path() const { return folder ? index_path : single_path; }
};

// InvalidArgument (naming `dst`) when options.format contradicts the name,
// max_shard_size is set for a single file, an index name has no base, or a
// plain path exists and is not a folder.
Result<ConvertDestination> PlanDestination(const std::string& dst, ModelFormat source_format,
                                           const ConvertOptions& options);

// "<base>-0000<i+1>-of-0000<n><ext>".
std::string ConvertShardFileName(const std::string& base, size_t i, size_t n, ModelFormat f);

// Greedy sharding: tensors in order; a new shard starts when the next tensor
// would push the current one past max_bytes (a larger tensor gets a shard of
// its own). Always at least one (possibly empty) shard. Returns tensor ids.
std::vector<std::vector<size_t>> PlanShards(const std::vector<CheckpointTensor>& tensors,
                                            uint64_t max_bytes);

struct ConvertShard {
  std::string name;  // as the index references it
  std::string path;
  std::vector<size_t> tensor_ids;  // into OpenedCheckpoint::tensors
};

struct ConvertPlan {
  ConvertDestination destination;
  std::vector<ConvertShard> shards;
};

// Splits the tensors into output files. InvalidArgument when an output file
// (or the index) would overwrite one of the source's files.
Result<ConvertPlan> PlanConversion(const OpenedCheckpoint& source,
                                   const ConvertDestination& destination,
                                   const ConvertOptions& options);

// Progress reports of WriteConversion, all from the calling thread.
class ConvertListener {
 public:
  virtual ~ConvertListener() = default;
  // `bytes` more tensor bytes were written.
  virtual void OnBytesWritten(uint64_t /*bytes*/) {}
  // A file is written in one go from here to OnFileWriteEnd (a MEGA shard):
  // its growing size on disk is the only progress until then; the bytes are
  // reported by OnBytesWritten after OnFileWriteEnd.
  virtual void OnFileWriteBegin(const std::string& /*path*/) {}
  virtual void OnFileWriteEnd(const std::string& /*path*/) {}
};

// Writes the plan: creates the folder, writes each shard under a temp name
// (".tmp-<pid>") and renames it when complete, then (folders) writes the index
// last, atomically; MEGA indexes get AddMegatensorsFields. Source checksums are
// verified as tensors are read. On error the current temp file is removed and
// the Status names the file (and tensor). `listener` may be null.
Status WriteConversion(const OpenedCheckpoint& source, const ConvertPlan& plan,
                       const ConvertOptions& options, ConvertListener* listener);

struct ConvertSummary {
  CheckpointKind source_kind = CheckpointKind::kMegaFile;
  size_t num_tensors = 0;
  uint64_t total_bytes = 0;
  ConvertDestination destination;
  std::vector<std::string> files;  // written model files, in order
};

// All phases in one call: ResolveCheckpointPath, OpenCheckpoint (mmap,
// checksums verified), PlanDestination, PlanConversion, WriteConversion.
Result<ConvertSummary> ConvertCheckpoint(const std::string& src, const std::string& dst,
                                         const ConvertOptions& options,
                                         ConvertListener* listener = nullptr);

}  // namespace megackpt::format

#endif  // MEGACKPT_FORMAT_CONVERT_H_
