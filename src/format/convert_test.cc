// Tests of checkpoint opening and MEGA <-> safetensors conversion (convert.h).
#include "megackpt/format/convert.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "format/mega_test_util.h"
#include "megackpt/core/file.h"
#include "megackpt/format/index_file.h"

namespace megackpt::format {
namespace {

using mega_test::MakeTensor;
using mega_test::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace stdfs = std::filesystem;

// Three tensors of 4096, 8192 and 2048 bytes (different dtypes and ranks).
std::vector<std::pair<std::string, Tensor>> SampleTensors() {
  return {{"embed.weight", MakeTensor(DType::kF32, {32, 32}, 1)},
          {"layers.0.w", MakeTensor(DType::kBF16, {64, 64}, 2, /*compressible=*/true)},
          {"layers.0.b", MakeTensor(DType::kI64, {256}, 3)}};
}

std::string TensorBytes(const Tensor& t) {
  auto b = t.Bytes();
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// name -> (dtype, shape, bytes) of every tensor of the checkpoint at `path`.
std::map<std::string, std::string> Contents(const std::string& path) {
  std::map<std::string, std::string> out;
  auto in = ResolveCheckpointPath(path);
  EXPECT_TRUE(in.ok()) << in.status().ToString();
  if (!in.ok()) return out;
  auto model = OpenCheckpoint(*in, {.mmap = false, .verify_checksums = true});
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  if (!model.ok()) return out;
  for (const CheckpointTensor& t : model->tensors) {
    const CheckpointFile& f = model->files[t.file];
    auto dst = Tensor::Empty(t.dtype, t.shape);
    EXPECT_TRUE(dst.ok());
    Status s = f.mega ? f.mega->ReadTensor(t.index, *dst) : f.safetensors->ReadTensor(t.name, *dst);
    EXPECT_TRUE(s.ok()) << s.ToString();
    out[t.name] =
        std::string(DTypeName(t.dtype)) + ShapeToString(t.shape) + ":" + TensorBytes(*dst);
  }
  return out;
}

std::map<std::string, std::string> Expected() {
  std::map<std::string, std::string> out;
  for (const auto& [name, t] : SampleTensors()) {
    out[name] = std::string(DTypeName(t.dtype())) + ShapeToString(t.shape()) + ":" + TensorBytes(t);
  }
  return out;
}

class ConvertTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = dir_.File("model.safetensors");
    auto tensors = SampleTensors();
    ASSERT_TRUE(SaveSafetensorsFile(src_, tensors, {{"format", "pt"}, {"note", "hi"}}).ok());
  }

  TempDir dir_;
  std::string src_;
};

TEST_F(ConvertTest, SafetensorsToShardedMegaAndBack) {
  ConvertOptions o;
  o.max_shard_size = 5000;  // 4096 | 8192 | 2048: a new shard for each
  o.sync = false;
  auto r = ConvertCheckpoint(src_, dir_.File("mega"), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->source_kind, CheckpointKind::kSafetensorsFile);
  EXPECT_EQ(r->num_tensors, 3u);
  EXPECT_EQ(r->total_bytes, 4096u + 8192u + 2048u);
  EXPECT_TRUE(r->destination.folder);
  EXPECT_EQ(r->destination.format, ModelFormat::kMega);  // the other format by default
  EXPECT_EQ(r->destination.output_path(), dir_.File("mega") + "/model.mega.index.json");
  ASSERT_EQ(r->files.size(), 3u);
  EXPECT_EQ(stdfs::path(r->files[0]).filename(), "model-00001-of-00003.mega");

  auto index = ReadShardIndexFile(r->destination.index_path);
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->total_size, 4096u + 8192u + 2048u);
  EXPECT_THAT(index->ShardFiles(),
              ElementsAre("model-00001-of-00003.mega", "model-00002-of-00003.mega",
                          "model-00003-of-00003.mega"));
  EXPECT_EQ(Contents(dir_.File("mega")), Expected());

  // safetensors metadata travels as MEGA strings and comes back.
  auto in = ResolveCheckpointPath(dir_.File("mega"));
  ASSERT_TRUE(in.ok());
  EXPECT_EQ(in->kind, CheckpointKind::kMegaIndex);
  auto model = OpenCheckpoint(*in, {});
  ASSERT_TRUE(model.ok());
  auto note = model->files[0].mega->metadata().Find("safetensors.metadata.note");
  ASSERT_NE(note, nullptr);
  EXPECT_EQ(*note->AsString(), "hi");

  auto back = ConvertCheckpoint(dir_.File("mega"), dir_.File("back.safetensors"), {});
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->source_kind, CheckpointKind::kMegaIndex);
  EXPECT_FALSE(back->destination.folder);
  EXPECT_EQ(Contents(dir_.File("back.safetensors")), Expected());
  auto st = SafetensorsReader::Open(dir_.File("back.safetensors"));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ((*st)->metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"note", "hi"}}));
  // No temp or spill files are left behind.
  for (const auto& e : stdfs::directory_iterator(dir_.path())) {
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
  }
}

TEST_F(ConvertTest, CompressedMegaToSafetensorsIndexAndBack) {
  ConvertOptions o;
  o.compression = MegaCodec::kZstd;
  o.shuffle = true;
  o.checksum = MegaChecksumType::kSha256;
  ASSERT_TRUE(ConvertCheckpoint(src_, dir_.File("z.mega"), o).ok());
  EXPECT_EQ(Contents(dir_.File("z.mega")), Expected());

  ConvertOptions s;
  s.max_shard_size = 10000;  // 4096 + 8192 > 10000: two shards
  auto r = ConvertCheckpoint(dir_.File("z.mega"), dir_.File("st/w.safetensors.index.json"), s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->destination.format, ModelFormat::kSafetensors);
  EXPECT_EQ(r->destination.base, "w");
  EXPECT_EQ(r->files.size(), 2u);
  EXPECT_TRUE(stdfs::exists(dir_.File("st/w-00002-of-00002.safetensors")));
  EXPECT_EQ(Contents(dir_.File("st")), Expected());

  auto again = ConvertCheckpoint(dir_.File("st"), dir_.File("again.mega"), {});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(Contents(dir_.File("again.mega")), Expected());
}

TEST(ConvertPlanTest, ShardsAreGreedyInOrder) {
  std::vector<CheckpointTensor> ts(5);
  const uint64_t sizes[] = {30, 30, 50, 100, 10};
  for (size_t i = 0; i < 5; ++i) ts[i].nbytes = sizes[i];
  // 30+30 fit in 60; 50 starts a new shard; 100 > 60 gets its own; 10 follows.
  EXPECT_THAT(PlanShards(ts, 60),
              ElementsAre(ElementsAre(0u, 1u), ElementsAre(2u), ElementsAre(3u), ElementsAre(4u)));
  EXPECT_THAT(PlanShards(ts, 1000), ElementsAre(ElementsAre(0u, 1u, 2u, 3u, 4u)));
  EXPECT_THAT(PlanShards({}, 10), ElementsAre(ElementsAre()));
  EXPECT_EQ(ConvertShardFileName("model", 1, 12, ModelFormat::kSafetensors),
            "model-00002-of-00012.safetensors");
}

TEST(ConvertPlanTest, DestinationsAndUsageErrors) {
  ConvertOptions o;
  auto one = PlanDestination("out/x.mega", ModelFormat::kMega, o);
  ASSERT_TRUE(one.ok());
  EXPECT_FALSE(one->folder);
  EXPECT_EQ(one->output_path(), "out/x.mega");

  auto folder = PlanDestination("/nonexistent-dir/out", ModelFormat::kMega, o);
  ASSERT_TRUE(folder.ok());
  EXPECT_EQ(folder->format, ModelFormat::kSafetensors);
  EXPECT_EQ(folder->index_path, "/nonexistent-dir/out/model.safetensors.index.json");

  o.format = ModelFormat::kSafetensors;
  auto bad = PlanDestination("x.mega", ModelFormat::kSafetensors, o);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("contradicts the file extension"));

  ConvertOptions m;
  m.max_shard_size = 10;
  auto single = PlanDestination("x.safetensors", ModelFormat::kMega, m);
  EXPECT_EQ(single.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(single.status().message(), HasSubstr("--max-shard-size needs a folder"));

  EXPECT_EQ(PlanDestination(".mega.index.json", ModelFormat::kMega, {}).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(ConvertTest, RefusesToOverwriteItsSource) {
  auto r = ConvertCheckpoint(src_, src_, {});
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("would overwrite its own source"));
  EXPECT_EQ(Contents(src_), Expected());  // untouched
}

TEST_F(ConvertTest, ErrorsNameTheBadFile) {
  // A missing source.
  auto missing = ConvertCheckpoint(dir_.File("nope.safetensors"), dir_.File("x.mega"), {});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("nope.safetensors"));

  // A shard listed by the index is missing.
  ConvertOptions o;
  o.max_shard_size = 5000;
  ASSERT_TRUE(ConvertCheckpoint(src_, dir_.File("m"), o).ok());
  ASSERT_TRUE(stdfs::remove(dir_.File("m/model-00002-of-00003.mega")));
  auto gone = ConvertCheckpoint(dir_.File("m"), dir_.File("y.safetensors"), {});
  EXPECT_EQ(gone.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(gone.status().message(), HasSubstr("model-00002-of-00003.mega"));

  // A corrupt tensor: the checksum failure names the file and the tensor, and
  // no output is left under the final name.
  ASSERT_TRUE(ConvertCheckpoint(src_, dir_.File("c.mega"), {}).ok());
  auto reader = MegaReader::OpenFile(dir_.File("c.mega"));
  ASSERT_TRUE(reader.ok());
  const MegaTensorInfo& info = (*reader)->tensors()[0];
  const std::string victim = info.name;
  const uint64_t at = info.file_offset + 7;
  reader->reset();
  std::string bytes = mega_test::FileBytes(dir_.File("c.mega"));
  bytes[at] = static_cast<char>(bytes[at] ^ 0x5a);
  mega_test::WriteBytes(dir_.File("c.mega"), bytes);
  auto corrupt = ConvertCheckpoint(dir_.File("c.mega"), dir_.File("z.safetensors"), {});
  EXPECT_EQ(corrupt.status().code(), StatusCode::kDataLoss) << corrupt.status().ToString();
  EXPECT_THAT(corrupt.status().message(), HasSubstr("c.mega"));
  EXPECT_THAT(corrupt.status().message(), HasSubstr(victim));
  EXPECT_FALSE(stdfs::exists(dir_.File("z.safetensors")));
}

TEST_F(ConvertTest, ResolvesFoldersAndRejectsAmbiguousOnes) {
  auto one = ResolveCheckpointPath(dir_.path());
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(one->kind, CheckpointKind::kSafetensorsFile);
  EXPECT_EQ(CheckpointKindName(one->kind), "safetensors");

  ASSERT_TRUE(ConvertCheckpoint(src_, dir_.File("second.mega"), {}).ok());
  auto two = ResolveCheckpointPath(dir_.path());
  EXPECT_EQ(two.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(two.status().message(), HasSubstr("several model files"));

  mega_test::WriteBytes(dir_.File("junk.bin"), "not a model file at all");
  auto junk = ResolveCheckpointPath(dir_.File("junk.bin"));
  EXPECT_EQ(junk.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(junk.status().message(), HasSubstr("junk.bin"));
}

// Records the listener calls of WriteConversion.
class RecordingListener : public ConvertListener {
 public:
  void OnBytesWritten(uint64_t bytes) override { bytes_ += bytes; }
  void OnFileWriteBegin(const std::string& path) override { begun_.push_back(path); }
  void OnFileWriteEnd(const std::string& path) override { ended_.push_back(path); }

  uint64_t bytes_ = 0;
  std::vector<std::string> begun_, ended_;
};

TEST_F(ConvertTest, PhasesReportProgress) {
  auto in = ResolveCheckpointPath(src_);
  ASSERT_TRUE(in.ok());
  auto model = OpenCheckpoint(*in, {});
  ASSERT_TRUE(model.ok());
  EXPECT_EQ(model->format(), ModelFormat::kSafetensors);
  EXPECT_EQ(PortableMetadata(*model),
            (std::map<std::string, std::string>{{"format", "pt"}, {"note", "hi"}}));
  ConvertOptions o;
  o.max_shard_size = 10000;
  auto dest = PlanDestination(dir_.File("p"), model->format(), o);
  ASSERT_TRUE(dest.ok());
  auto plan = PlanConversion(*model, *dest, o);
  ASSERT_TRUE(plan.ok());
  // Source (reference) order is I64 2048 B, F32 4096 B, BF16 8192 B: the first
  // two fit in 10000 bytes, the third starts a new shard.
  auto names = [&](const ConvertShard& shard) {
    std::vector<std::string> out;
    for (size_t id : shard.tensor_ids) out.push_back(model->tensors[id].name);
    return out;
  };
  ASSERT_EQ(plan->shards.size(), 2u);
  EXPECT_THAT(names(plan->shards[0]), ElementsAre("layers.0.b", "embed.weight"));
  EXPECT_THAT(names(plan->shards[1]), ElementsAre("layers.0.w"));
  EXPECT_EQ(plan->shards[1].path, dir_.File("p") + "/model-00002-of-00002.mega");
  EXPECT_FALSE(stdfs::exists(dir_.File("p")));  // planning writes nothing

  RecordingListener listener;
  ASSERT_TRUE(WriteConversion(*model, *plan, o, &listener).ok());
  EXPECT_EQ(listener.bytes_, model->total_bytes);
  ASSERT_EQ(listener.begun_.size(), 2u);  // MEGA shards are written in one go
  EXPECT_EQ(listener.begun_, listener.ended_);
  EXPECT_EQ(Contents(dir_.File("p")), Expected());
}

}  // namespace
}  // namespace megackpt::format
