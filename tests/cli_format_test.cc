// Integration tests of `megackpt inspect / verify / convert / bench format`:
// they run the built binary (MEGACKPT_BINARY_DIR/tools/megackpt) the way users
// and the acceptance checks do, and compare results through the library.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "core/test_files.h"
#include "core/test_tensors.h"
#include "megackpt/core/file.h"
#include "megackpt/core/tensor.h"
#include "megackpt/dcp/index_io.h"
#include "megackpt/format/index_file.h"
#include "megackpt/format/mega.h"
#include "megackpt/format/safetensors.h"
#include "megackpt/fs/filesystem.h"
#include "test_util.h"

namespace megackpt {
namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

using RunResult = test_util::CommandResult;

class CliFormatTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = tmp_.path(); }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // `megackpt ARGS` with an empty stdin: stdout in `out`, stderr in `err`.
  static RunResult Run(const std::string& args) {
    return test_util::RunMegackpt(args, {.stderr_to = test_util::StderrTo::kErr, .stdin_data = ""});
  }

  static Tensor Filled(DType dtype, Shape shape, int seed) {
    Tensor t = *Tensor::Empty(dtype, std::move(shape));
    auto bytes = t.Bytes();
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = std::byte((i * 151 + seed * 29 + (i >> 8)) & 0xff);
    }
    return t;
  }

  // A model with every dtype (incl. F4), a 0-d and an empty tensor, and a
  // few bigger tensors so sharding has something to split.
  std::vector<std::pair<std::string, Tensor>> Model() {
    auto ts = test_util::OneOfEveryDType("small.", {2, 6}, Filled);
    ts.emplace_back("scalar", Filled(DType::kF32, {}, 40));
    ts.emplace_back("empty", Filled(DType::kBF16, {0, 16}, 41));
    for (int i = 0; i < 5; ++i) {
      ts.emplace_back("layers." + std::to_string(i) + ".weight",
                      Filled(DType::kF32, {64, 100}, 50 + i));
    }
    return ts;
  }

  std::string WriteSource(const std::string& name) {
    const std::string path = Path(name);
    auto ts = Model();
    EXPECT_TRUE(
        format::SaveSafetensorsFile(path, ts, {{"format", "pt"}, {"origin", "cli test"}}).ok());
    return path;
  }

  static std::string ReadAll(const std::string& path) { return *ReadLocalFile(path); }

  static void FlipByte(const std::string& path, int64_t offset_from_end) {
    std::string bytes = ReadAll(path);
    bytes[bytes.size() - offset_from_end] ^= 0x5a;
    ASSERT_TRUE(WriteLocalFileAtomically(path, bytes, false).ok());
  }

  test_util::TempDir tmp_{"cli_format_test"};
  std::string dir_;
};

// ---- inspect --------------------------------------------------------------------

TEST_F(CliFormatTest, InspectJsonSafetensorsFile) {
  const std::string src = WriteSource("model.safetensors");
  RunResult r = Run("inspect " + src + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  json doc = json::parse(r.out);
  EXPECT_EQ(doc["format"], "safetensors");
  EXPECT_EQ(doc["metadata"]["format"], "pt");
  EXPECT_EQ(doc["metadata"]["origin"], "cli test");
  auto model = Model();
  ASSERT_EQ(doc["tensors"].size(), model.size());
  std::map<std::string, json> by_name;
  for (const auto& t : doc["tensors"]) by_name[t["name"].get<std::string>()] = t;
  for (const auto& [name, t] : model) {
    ASSERT_TRUE(by_name.count(name)) << name;
    const json& e = by_name[name];
    EXPECT_EQ(e["dtype"], DTypeName(t.dtype()));
    EXPECT_EQ(e["shape"].get<Shape>(), t.shape());
    EXPECT_EQ(e["nbytes"].get<uint64_t>(), t.nbytes());
    EXPECT_EQ(e["file"], "model.safetensors");
  }
}

TEST_F(CliFormatTest, InspectTableAndFolderInputs) {
  const std::string src = WriteSource("model.safetensors");
  RunResult r = Run("inspect " + src);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("layers.3.weight"));
  EXPECT_THAT(r.out, HasSubstr("[64, 100]"));
  // A folder with one model file and no index.
  RunResult f = Run("inspect " + dir_ + " --json");
  ASSERT_EQ(f.code, 0) << f.err;
  EXPECT_EQ(json::parse(f.out)["format"], "safetensors");
}

// ---- convert + inspect of every output kind ----------------------------------------

TEST_F(CliFormatTest, ConvertRoundTripSafetensorsToShardedMegaAndBack) {
  const std::string src = WriteSource("model.safetensors");
  RunResult c = Run("convert " + src + " " + Path("mega") + " --max-shard-size 40kB --no-progress");
  ASSERT_EQ(c.code, 0) << c.err;
  // Sharded: model-0000N-of-0000M.mega + model.mega.index.json.
  auto index = format::ReadShardIndexFile(Path("mega/model.mega.index.json"));
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  auto shards = index->ShardFiles();
  ASSERT_GE(shards.size(), 3u);
  EXPECT_EQ(shards[0], "model-00001-of-0000" + std::to_string(shards.size()) + ".mega");
  uint64_t total = 0;
  for (const auto& [name, t] : Model()) total += t.nbytes();
  EXPECT_EQ(index->total_size, total);
  EXPECT_EQ(index->weight_map.size(), Model().size());
  for (const auto& shard : shards) {
    auto reader = format::MegaReader::OpenFile(Path("mega/" + shard));
    ASSERT_TRUE(reader.ok()) << reader.status().ToString();
    EXPECT_TRUE((*reader)->VerifyAll().ok());
  }

  RunResult i = Run("inspect " + Path("mega") + " --json");
  ASSERT_EQ(i.code, 0) << i.err;
  json doc = json::parse(i.out);
  EXPECT_EQ(doc["format"], "mega-index");
  EXPECT_EQ(doc["metadata"]["total_size"].get<uint64_t>(), total);
  EXPECT_EQ(doc["tensors"].size(), Model().size());
  for (const auto& t : doc["tensors"]) {
    EXPECT_EQ(index->weight_map.at(t["name"].get<std::string>()), t["file"].get<std::string>());
  }
  RunResult one = Run("inspect " + Path("mega/" + shards[0]) + " --json");
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_EQ(json::parse(one.out)["format"], "mega");

  // Back to one safetensors file: the same bytes as the source (same reference
  // order, same __metadata__ carried through MEGA).
  RunResult b = Run("convert " + Path("mega") + " " + Path("back.safetensors") + " --no-progress");
  ASSERT_EQ(b.code, 0) << b.err;
  EXPECT_EQ(ReadAll(Path("back.safetensors")), ReadAll(src));
  // And tensor by tensor through the library.
  auto back = *format::SafetensorsReader::Open(Path("back.safetensors"));
  for (const auto& [name, t] : Model()) {
    auto got = back->Load(name);
    ASSERT_TRUE(got.ok()) << name;
    EXPECT_TRUE(TensorBytesEqual(*got, t)) << name;
  }
  // No temp files left behind.
  for (const auto& e : stdfs::directory_iterator(Path("mega"))) {
    EXPECT_THAT(e.path().filename().string(), ::testing::Not(HasSubstr(".tmp")));
  }
}

TEST_F(CliFormatTest, ConvertWithCompressionShuffleSha256AndSafetensorsIndex) {
  const std::string src = WriteSource("model.safetensors");
  RunResult m = Run("convert " + src + " " + Path("z.mega") +
                    " --compression zstd:5 --shuffle --checksum sha256 --alignment 64");
  ASSERT_EQ(m.code, 0) << m.err;
  auto reader = *format::MegaReader::OpenFile(Path("z.mega"));
  EXPECT_EQ(reader->alignment(), 64u);
  int compressed = 0, shuffled = 0;
  for (const auto& t : reader->tensors()) {
    EXPECT_EQ(t.checksum_type, format::MegaChecksumType::kSha256);
    compressed += t.compressed();
    shuffled += t.byte_shuffled();
  }
  EXPECT_GT(compressed, 0);  // the test data is compressible
  EXPECT_GT(shuffled, 0);
  // MEGA file -> safetensors folder (index) -> MEGA file -> safetensors file.
  RunResult s = Run("convert " + Path("z.mega") + " " + Path("st") + " --max-shard-size 30KB");
  ASSERT_EQ(s.code, 0) << s.err;
  EXPECT_TRUE(stdfs::exists(Path("st/model.safetensors.index.json")));
  RunResult v = Run("verify " + Path("st"));
  EXPECT_EQ(v.code, 0) << v.err;
  EXPECT_THAT(v.out, HasSubstr("safetensors has no checksums"));
  RunResult i = Run("inspect " + Path("st/model.safetensors.index.json") + " --json");
  ASSERT_EQ(i.code, 0) << i.err;
  EXPECT_EQ(json::parse(i.out)["format"], "safetensors-index");
  // Compressed MEGA -> MEGA folder (decoded tensors go through the spill arena),
  // with a progress display forced on.
  RunResult mm = Run("convert " + Path("z.mega") + " " + Path("re") +
                     " --format mega --max-shard-size 50kB --progress");
  ASSERT_EQ(mm.code, 0) << mm.err;
  EXPECT_THAT(mm.err, HasSubstr("convert: "));
  EXPECT_THAT(mm.err, HasSubstr("GB/s"));
  ASSERT_EQ(Run("verify " + Path("re")).code, 0);
  ASSERT_EQ(Run("convert " + Path("re") + " " + Path("re.safetensors")).code, 0);
  EXPECT_EQ(ReadAll(Path("re.safetensors")), ReadAll(src));
  for (const auto& e : stdfs::directory_iterator(Path("re"))) {
    EXPECT_THAT(e.path().filename().string(), ::testing::Not(HasSubstr("spill")));
  }
  ASSERT_EQ(Run("convert " + Path("st") + " " + Path("again.mega")).code, 0);
  ASSERT_EQ(Run("convert " + Path("again.mega") + " " + Path("final.safetensors")).code, 0);
  EXPECT_EQ(ReadAll(Path("final.safetensors")), ReadAll(src));
}

TEST_F(CliFormatTest, ConvertToNamedIndexAndExplicitFormat) {
  const std::string src = WriteSource("model.safetensors");
  RunResult r = Run("convert " + src + " " + Path("out/weights.safetensors.index.json") +
                    " --max-shard-size 1GB");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(stdfs::exists(Path("out/weights-00001-of-00001.safetensors")));
  auto index = format::ReadShardIndexFile(Path("out/weights.safetensors.index.json"));
  ASSERT_TRUE(index.ok());
  EXPECT_EQ(index->ShardFiles().size(), 1u);
  RunResult f = Run("convert " + src + " " + Path("st_folder") + " --format safetensors");
  ASSERT_EQ(f.code, 0) << f.err;
  EXPECT_TRUE(stdfs::exists(Path("st_folder/model.safetensors.index.json")));
}

TEST_F(CliFormatTest, ConvertUsageErrorsExitTwo) {
  const std::string src = WriteSource("model.safetensors");
  EXPECT_EQ(Run("convert " + src).code, 2);
  EXPECT_EQ(Run("convert " + src + " " + Path("x.mega") + " --checksum md5").code, 2);
  EXPECT_EQ(Run("convert " + src + " " + Path("x.mega") + " --compression lz4").code, 2);
  EXPECT_EQ(Run("convert " + src + " " + Path("x.mega") + " --alignment 0").code, 2);
  EXPECT_EQ(Run("convert " + src + " " + Path("x.mega") + " --max-shard-size 1GB").code, 2);
  EXPECT_EQ(Run("convert " + src + " " + Path("out") + " --max-shard-size lots").code, 2);
  EXPECT_EQ(Run("convert " + src + " " + Path("x.mega") + " --format safetensors").code, 2);
  EXPECT_EQ(Run("convert " + src + " " + src).code, 2);  // would overwrite its source
  EXPECT_EQ(Run("convert " + Path("missing.safetensors") + " " + Path("x.mega")).code, 1);
  EXPECT_FALSE(stdfs::exists(Path("x.mega")));
}

// ---- verify -------------------------------------------------------------------------

TEST_F(CliFormatTest, VerifyExitCodes) {
  const std::string src = WriteSource("model.safetensors");
  ASSERT_EQ(Run("convert " + src + " " + Path("m.mega")).code, 0);
  ASSERT_EQ(Run("convert " + src + " " + Path("folder") + " --max-shard-size 40kB").code, 0);
  // Good inputs.
  EXPECT_EQ(Run("verify " + src).code, 0);
  EXPECT_EQ(Run("verify " + Path("m.mega")).code, 0);
  RunResult ok = Run("verify " + Path("folder"));
  EXPECT_EQ(ok.code, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("OK"));
  // Usage errors.
  EXPECT_EQ(Run("verify").code, 2);
  EXPECT_EQ(Run("verify --no-such-flag " + src).code, 2);
  EXPECT_EQ(Run("verify " + src + " extra_arg").code, 2);
  // A missing path is a failure (1), with a message.
  RunResult missing = Run("verify " + Path("nope.mega"));
  EXPECT_EQ(missing.code, 1);
  EXPECT_THAT(missing.err, HasSubstr("nope.mega"));

  // A flipped payload byte in a MEGA file: names the file and the tensor.
  const std::string last_tensor =
      (*format::MegaReader::OpenFile(Path("m.mega")))->tensors().back().name;
  FlipByte(Path("m.mega"), 2);
  RunResult bad = Run("verify " + Path("m.mega"));
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.err, HasSubstr("m.mega"));
  EXPECT_THAT(bad.err, HasSubstr("'" + last_tensor + "'"));

  // A flipped byte in one shard of a folder.
  auto shards = format::ReadShardIndexFile(Path("folder/model.mega.index.json"))->ShardFiles();
  FlipByte(Path("folder/" + shards[1]), 1);
  RunResult bad_folder = Run("verify " + Path("folder"));
  EXPECT_EQ(bad_folder.code, 1);
  EXPECT_THAT(bad_folder.err, HasSubstr(shards[1]));

  // A corrupted safetensors header (its JSON no longer parses).
  std::string st = ReadAll(src);
  st[8 + 5] = '\x01';
  ASSERT_TRUE(WriteLocalFileAtomically(Path("broken.safetensors"), st, false).ok());
  RunResult bad_st = Run("verify " + Path("broken.safetensors"));
  EXPECT_EQ(bad_st.code, 1);
  EXPECT_THAT(bad_st.err, HasSubstr("broken.safetensors"));
}

TEST_F(CliFormatTest, VerifyChecksTheIndexIsTruthful) {
  const std::string src = WriteSource("model.safetensors");
  ASSERT_EQ(Run("convert " + src + " " + Path("f") + " --max-shard-size 40kB").code, 0);
  const std::string index_path = Path("f/model.mega.index.json");
  const format::ShardIndex good = *format::ReadShardIndexFile(index_path);
  auto shards = good.ShardFiles();

  // A tensor that is not where the index says.
  format::ShardIndex wrong = good;
  wrong.weight_map["layers.0.weight"] =
      shards.back() == good.weight_map.at("layers.0.weight") ? shards.front() : shards.back();
  ASSERT_TRUE(format::WriteShardIndexFile(index_path, wrong).ok());
  RunResult r1 = Run("verify " + Path("f"));
  EXPECT_EQ(r1.code, 1);
  EXPECT_THAT(r1.err, HasSubstr("layers.0.weight"));

  // A shard tensor missing from the weight_map.
  format::ShardIndex fewer = good;
  fewer.weight_map.erase("scalar");
  ASSERT_TRUE(format::WriteShardIndexFile(index_path, fewer).ok());
  RunResult r2 = Run("verify " + Path("f"));
  EXPECT_EQ(r2.code, 1);
  EXPECT_THAT(r2.err, HasSubstr("'scalar' is not listed in the index's weight_map"));

  // An index tensor that no shard has.
  format::ShardIndex more = good;
  more.weight_map["ghost"] = shards[0];
  ASSERT_TRUE(format::WriteShardIndexFile(index_path, more).ok());
  RunResult r3 = Run("verify " + Path("f"));
  EXPECT_EQ(r3.code, 1);
  EXPECT_THAT(r3.err, HasSubstr("'ghost'"));

  // A missing shard.
  ASSERT_TRUE(format::WriteShardIndexFile(index_path, good).ok());
  ASSERT_EQ(Run("verify " + Path("f")).code, 0);
  stdfs::remove(Path("f/" + shards[0]));
  RunResult r4 = Run("verify " + Path("f"));
  EXPECT_EQ(r4.code, 1);
  EXPECT_THAT(r4.err, HasSubstr(shards[0]));

  // A malformed index.
  ASSERT_TRUE(
      WriteLocalFileAtomically(index_path, "{\"weight_map\": {\"w\": \"/abs.mega\"}}", false).ok());
  RunResult r5 = Run("verify " + index_path);
  EXPECT_EQ(r5.code, 1);
  EXPECT_THAT(r5.err, HasSubstr("absolute"));
}

// A sharded checkpoint from MegaStorageWriter: chunks of sharded tensors are listed
// under "tensorplay.dcp.sharded" (not in weight_map) and must verify, including
// shards that hold only chunks; a corrupt chunk still fails naming the file.
TEST_F(CliFormatTest, VerifyShardedDcpCheckpoint) {
  const std::string ckpt = Path("dcp");
  RunResult save =
      Run("demo --out " + ckpt + " --storage mega --mode save --world-size 2 --size 4MB --seed 3");
  ASSERT_EQ(save.code, 0) << save.err;
  const std::string index_text = ReadAll(ckpt + "/model.mega.index.json");
  json index = json::parse(index_text);
  ASSERT_TRUE(index.contains("tensorplay.dcp.sharded")) << index_text;
  RunResult ok = Run("verify " + ckpt);
  EXPECT_EQ(ok.code, 0) << ok.err;

  // Corrupt the last payload byte of a file that holds a chunk of a sharded tensor.
  std::string chunk_file;
  for (const auto& [fqn, entry] : index["tensorplay.dcp.sharded"].items()) {
    for (const auto& c : entry["chunks"]) {
      if (c["sizes"].size() > 0) chunk_file = c["file"].get<std::string>();
    }
  }
  ASSERT_FALSE(chunk_file.empty());
  FlipByte(ckpt + "/" + chunk_file, 1);
  RunResult bad = Run("verify " + ckpt);
  EXPECT_EQ(bad.code, 1);
  EXPECT_THAT(bad.err, HasSubstr(chunk_file));
}

TEST_F(CliFormatTest, AmbiguousOrUnknownInputsAreUsageErrors) {
  WriteSource("a.safetensors");
  WriteSource("b.safetensors");
  RunResult r = Run("inspect " + dir_);
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("several model files"));
  ASSERT_TRUE(WriteLocalFileAtomically(Path("notes.txt"), "hello, world", false).ok());
  EXPECT_EQ(Run("inspect " + Path("notes.txt")).code, 2);
  EXPECT_EQ(Run("verify " + Path("notes.txt")).code, 2);
}

TEST_F(CliFormatTest, HelpTeachesTheInterfaces) {
  RunResult r = Run("convert --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_THAT(r.out, HasSubstr("--max-shard-size"));
  EXPECT_THAT(r.out, HasSubstr("--compression"));
  RunResult v = Run("verify --help");
  EXPECT_EQ(v.code, 0);
  EXPECT_THAT(v.out, HasSubstr("Exit 0"));
  RunResult b = Run("bench format --help");
  EXPECT_EQ(b.code, 0);
  EXPECT_THAT(b.out, HasSubstr("pagecache_read_gbps"));
}

// ---- bench --------------------------------------------------------------------------

TEST_F(CliFormatTest, BenchFormatJsonHasEveryKey) {
  RunResult r = Run("bench format --size 4MB --reps 2 --tensors 8 --json --dir " + dir_);
  ASSERT_EQ(r.code, 0) << r.err;
  json doc = json::parse(r.out);
  for (const char* key :
       {"memcpy_gbps", "pagecache_write_gbps", "pagecache_read_gbps", "mega_write_gbps",
        "mega_read_gbps", "safetensors_write_gbps", "safetensors_read_gbps",
        "mega_open_10k_tensors_ms", "mega_write_gbps_min", "mega_write_gbps_max"}) {
    ASSERT_TRUE(doc.contains(key)) << key;
    EXPECT_GT(doc[key].get<double>(), 0) << key;
  }
  EXPECT_EQ(doc["reps"], 2);
}

// ---- index files through the FileSystem seam -------------------------------------------

TEST_F(CliFormatTest, IndexThroughLocalFileSystem) {
  auto local = fs::LocalFileSystem();
  format::ShardIndex index;
  index.total_size = 7;
  index.weight_map = {{"w", "model.mega"}};
  const std::string path = Path("x.mega.index.json");
  ASSERT_TRUE(dcp::WriteShardIndex(*local, path, index).ok());
  auto back = dcp::ReadShardIndex(*local, path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->weight_map, index.weight_map);
  EXPECT_EQ(back->total_size, 7u);
}

// Names are shown escaped: a tensor named "a\0b" is not shown as "a", and no
// raw control byte reaches the terminal (issue 11).
TEST_F(CliFormatTest, InspectEscapesNonPrintableNames) {
  const std::string path = Path("names.safetensors");
  std::vector<std::pair<std::string, Tensor>> ts;
  ts.emplace_back(std::string("a\0b", 3), Filled(DType::kF32, {2}, 1));
  ts.emplace_back("esc\x1b[31mred", Filled(DType::kF32, {2}, 2));
  ASSERT_TRUE(format::SaveSafetensorsFile(path, ts, {}).ok());
  RunResult r = Run("inspect " + path);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("a\\x00b"));
  EXPECT_THAT(r.out, HasSubstr("esc\\x1b[31mred"));
  EXPECT_EQ(r.out.find('\x1b'), std::string::npos) << r.out;
  RunResult j = Run("inspect --json " + path);
  ASSERT_EQ(j.code, 0) << j.err;
  json doc = json::parse(j.out, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << j.out;
  std::set<std::string> names;
  for (const auto& t : doc["tensors"]) names.insert(t["name"].get<std::string>());
  EXPECT_TRUE(names.count(std::string("a\0b", 3)));
}

}  // namespace
}  // namespace megackpt
