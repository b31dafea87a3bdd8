#include "megackpt/dcp/planner.h"

#include <gtest/gtest.h>

#include <cstring>

#include "megackpt/dcp/state_dict.h"

namespace megackpt::dcp {
namespace {

Tensor Filled(DType dt, Shape shape, uint8_t base) {
  Tensor t = Tensor::Empty(dt, std::move(shape)).value();
  auto* p = static_cast<uint8_t*>(t.data());
  for (uint64_t i = 0; i < t.nbytes(); ++i) p[i] = static_cast<uint8_t>(base + i);
  return t;
}

WriteItem ShardItem(const std::string& fqn, Shape off, Shape sizes, Shape global,
                    DType dt = DType::kF32) {
  WriteItem w;
  w.index = MetadataIndex(fqn, off);
  w.type = WriteItemType::kShard;
  w.tensor_data = TensorWriteData{ChunkStorageMetadata{off, sizes}, {dt, false}, global};
  return w;
}

WriteItem BytesItem(const std::string& fqn, uint64_t n) {
  WriteItem w;
  w.index = MetadataIndex(fqn);
  w.type = WriteItemType::kByteIO;
  w.bytes_size = n;
  return w;
}

TEST(MetadataIndex, EqualityIgnoresHint) {
  MetadataIndex a("w", Shape{0, 4}, 1), b("w", Shape{0, 4}, 7), c("w", Shape{4, 0});
  EXPECT_EQ(a, b);
  EXPECT_FALSE(a < b || b < a);
  EXPECT_EQ(MetadataIndexHash()(a), MetadataIndexHash()(b));
  EXPECT_NE(a, c);
  EXPECT_FALSE(MetadataIndex("w") == MetadataIndex("w", Shape{}));
}

TEST(StateDict, FlattenRecordsNestingAndRebuilds) {
  StateDict inner;
  inner.Set("w", StateValue(Filled(DType::kF32, {2, 2}, 1)));
  inner.Set("note", StateValue::Bytes("hello"));
  StateDict sd;
  sd.Set("model", StateValue(inner));
  sd.Set("list",
         StateValue::List({StateValue(Filled(DType::kU8, {3}, 9)), StateValue::Bytes("x")}));
  sd.Set("top", StateValue(Filled(DType::kI64, {}, 5)));
  std::map<std::string, ObjectPath> paths;
  auto flat = FlattenStateDict(sd, &paths);
  ASSERT_TRUE(flat.ok()) << flat.status().ToString();
  std::vector<std::string> names;
  for (auto& f : *flat) names.push_back(f.fqn);
  EXPECT_EQ(names, (std::vector<std::string>{"model.w", "model.note", "list.0", "list.1", "top"}));
  EXPECT_EQ(paths.size(), 4u);  // top-level "top" is not recorded
  EXPECT_EQ(paths["list.1"], (ObjectPath{PathKey{std::string("list")}, PathKey{int64_t{1}}}));

  // Build Metadata by planning and rebuild the nesting from it.
  auto planner = NewDefaultSavePlanner();
  ASSERT_TRUE(planner->SetUp(sd, std::nullopt, true).ok());
  auto plan = planner->CreateLocalPlan();
  ASSERT_TRUE(plan.ok());
  auto global = planner->CreateGlobalPlan({*plan});
  ASSERT_TRUE(global.ok()) << global.status().ToString();
  auto rebuilt = BuildStateDictFromMetadata(global->metadata);
  ASSERT_TRUE(rebuilt.ok()) << rebuilt.status().ToString();
  ASSERT_TRUE(rebuilt->Find("model") && rebuilt->Find("model")->is_dict());
  EXPECT_TRUE(rebuilt->Find("model")->dict().Find("w")->is_tensor());
  EXPECT_TRUE(rebuilt->Find("model")->dict().Find("note")->is_bytes());
  ASSERT_TRUE(rebuilt->Find("list")->is_list());
  EXPECT_EQ(rebuilt->Find("list")->list().size(), 2u);
  EXPECT_EQ(rebuilt->Find("top")->tensor().shape(), Shape{});
}

TEST(StateDict, FlattenRejectsCollisionsAndNone) {
  StateDict inner;
  inner.Set("b", StateValue::Bytes("1"));
  StateDict sd;
  sd.Set("a", StateValue(inner));
  sd.Set("a.b", StateValue::Bytes("2"));
  auto r = FlattenStateDict(sd, nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("'a.b'"), std::string::npos);
  StateDict none;
  none.Set("x", StateValue());
  EXPECT_EQ(FlattenStateDict(none, nullptr).status().code(), StatusCode::kInvalidArgument);
}

TEST(Dedup, LowestRankKeepsReplicas) {
  std::vector<SavePlan> plans(3);
  for (auto& p : plans) p.items = {ShardItem("w", {0}, {4}, {8}), BytesItem("b", 10)};
  plans[1].items.push_back(ShardItem("w", {4}, {4}, {8}));
  plans[2].items.push_back(ShardItem("w", {4}, {4}, {8}));
  auto d = DedupSavePlans(plans, DedupMode::kLowestRank);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)[0].items.size(), 2u);
  EXPECT_EQ((*d)[1].items.size(), 1u);
  EXPECT_EQ((*d)[1].items[0].index, MetadataIndex("w", Shape{4}));
  EXPECT_TRUE((*d)[2].items.empty());
}

TEST(Dedup, LoadBalancedSpreadsReplicas) {
  std::vector<SavePlan> plans(2);
  for (const char* name : {"t0", "t1", "t2", "t3"}) {
    for (auto& p : plans) p.items.push_back(ShardItem(name, {0}, {100}, {100}));
  }
  auto d = DedupSavePlans(plans, DedupMode::kLoadBalanced);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)[0].items.size(), 2u);
  EXPECT_EQ((*d)[1].items.size(), 2u);
}

TEST(Dedup, DisagreeingReplicasFail) {
  std::vector<SavePlan> plans(2);
  plans[0].items = {ShardItem("w", {0}, {4}, {8})};
  plans[1].items = {ShardItem("w", {0}, {4}, {8}, DType::kF16)};
  auto d = DedupSavePlans(plans, DedupMode::kLowestRank);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("disagree"), std::string::npos);
}

TEST(BuildMetadata, ValidatesChunkLayout) {
  auto build = [](std::vector<WriteItem> items) {
    std::vector<SavePlan> plans(1);
    plans[0].items = std::move(items);
    return BuildMetadataFromPlans(plans);
  };
  // A proper 2x2 tiling.
  auto ok = build({ShardItem("w", {0, 0}, {2, 3}, {4, 6}), ShardItem("w", {0, 3}, {2, 3}, {4, 6}),
                   ShardItem("w", {2, 0}, {2, 6}, {4, 6}), BytesItem("b", 1)});
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(std::get<TensorStorageMetadata>(ok->state_dict_metadata["w"]).chunks.size(), 3u);

  auto overlap =
      build({ShardItem("w", {0, 0}, {3, 6}, {4, 6}), ShardItem("w", {2, 0}, {2, 6}, {4, 6})});
  ASSERT_FALSE(overlap.ok());
  EXPECT_NE(overlap.status().message().find("overlap"), std::string::npos);

  auto gap = build({ShardItem("w", {0, 0}, {2, 6}, {4, 6})});
  ASSERT_FALSE(gap.ok());
  EXPECT_NE(gap.status().message().find("cover 12 of 24"), std::string::npos);

  auto oob = build({ShardItem("w", {3, 0}, {2, 6}, {4, 6})});
  ASSERT_FALSE(oob.ok());
  EXPECT_NE(oob.status().message().find("outside the global shape"), std::string::npos);

  auto shape = build({ShardItem("w", {0}, {2}, {4}), ShardItem("w", {2}, {2}, {5})});
  ASSERT_FALSE(shape.ok());
  EXPECT_NE(shape.status().message().find("global shape"), std::string::npos);

  auto kind = build({ShardItem("w", {0}, {4}, {4}), BytesItem("w", 3)});
  ASSERT_FALSE(kind.ok());
}

TEST(ReadItems, BoxIntersections) {
  // Stored: 2x2 blocks of a [4, 6] tensor; destination: rows [1, 3), all columns.
  TensorStorageMetadata stored{
      {DType::kF32, false},
      {4, 6},
      {{{0, 0}, {2, 3}}, {{0, 3}, {2, 3}}, {{2, 0}, {2, 3}}, {{2, 3}, {2, 3}}}};
  auto items = CreateReadItemsForChunk(MetadataIndex("w", Shape{1, 0}), {1, 0}, {2, 6}, stored);
  ASSERT_EQ(items.size(), 4u);
  EXPECT_EQ(items[0].storage_offsets, (Shape{1, 0}));
  EXPECT_EQ(items[0].dest_offsets, (Shape{0, 0}));
  EXPECT_EQ(items[0].lengths, (Shape{1, 3}));
  EXPECT_EQ(items[3].storage_index, MetadataIndex("w", Shape{2, 3}));
  EXPECT_EQ(items[3].storage_offsets, (Shape{0, 0}));
  EXPECT_EQ(items[3].dest_offsets, (Shape{1, 3}));
  EXPECT_EQ(items[3].lengths, (Shape{1, 3}));
  // No overlap.
  EXPECT_TRUE(
      CreateReadItemsForChunk(MetadataIndex("w", Shape{0, 0}), {0, 0}, {0, 6}, stored).empty());
  // 0-d.
  TensorStorageMetadata scalar{{DType::kF64, false}, {}, {{{}, {}}}};
  EXPECT_EQ(CreateReadItemsForChunk(MetadataIndex("s", Shape{}), {}, {}, scalar).size(), 1u);
}

Metadata OneTensorMetadata() {
  Metadata md;
  md.state_dict_metadata["w"] =
      TensorStorageMetadata{{DType::kF32, false}, {4, 6}, {{{0, 0}, {4, 6}}}};
  md.state_dict_metadata["b"] = BytesStorageMetadata{};
  return md;
}

TEST(LoadPlanner, ClearErrors) {
  Metadata md = OneTensorMetadata();
  auto plan_for = [&](StateDict sd, DefaultLoadPlannerOptions opts = {}) {
    auto planner = NewDefaultLoadPlanner(opts);
    EXPECT_TRUE(planner->SetUp(&sd, md, true).ok());
    return planner->CreateLocalPlan();
  };
  {
    StateDict sd;
    sd.Set("w", StateValue(Tensor::Empty(DType::kF32, {4, 6}).value()));
    sd.Set("b", StateValue::Bytes(""));
    auto p = plan_for(sd);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(p->items.size(), 2u);
  }
  {
    StateDict sd;
    sd.Set("missing", StateValue::Bytes(""));
    auto p = plan_for(sd);
    EXPECT_EQ(p.status().code(), StatusCode::kNotFound);
    EXPECT_NE(p.status().message().find("'missing'"), std::string::npos);
    DefaultLoadPlannerOptions partial;
    partial.allow_partial_load = true;
    EXPECT_TRUE(plan_for(sd, partial).ok());
  }
  {
    StateDict sd;
    sd.Set("w", StateValue(Tensor::Empty(DType::kBF16, {4, 6}).value()));
    auto p = plan_for(sd);
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(
                  "dtype mismatch for 'w': checkpoint has F32, state dict has BF16"),
              std::string::npos)
        << p.status().message();
  }
  {
    StateDict sd;
    sd.Set("w", StateValue(Tensor::Empty(DType::kF32, {6, 4}).value()));
    auto p = plan_for(sd);
    EXPECT_NE(p.status().message().find("shape mismatch for 'w'"), std::string::npos);
  }
  {
    StateDict sd;
    sd.Set("b", StateValue(Tensor::Empty(DType::kF32, {1}).value()));
    auto p = plan_for(sd);
    EXPECT_NE(p.status().message().find("bytes in the checkpoint"), std::string::npos);
  }
  {
    // Sharded destination outside the global shape.
    StateDict sd;
    sd.Set("w",
           StateValue(ShardedTensor{
               DType::kF32, {4, 6}, {Shard{{3, 0}, Tensor::Empty(DType::kF32, {2, 6}).value()}}}));
    auto p = plan_for(sd);
    EXPECT_NE(p.status().message().find("outside the global shape"), std::string::npos);
  }
  {
    // Checkpoint whose chunks do not cover the destination (hostile metadata).
    Metadata holes = md;
    std::get<TensorStorageMetadata>(holes.state_dict_metadata["w"]).chunks = {{{0, 0}, {2, 6}}};
    StateDict sd;
    sd.Set("w", StateValue(Tensor::Empty(DType::kF32, {4, 6}).value()));
    auto planner = NewDefaultLoadPlanner();
    ASSERT_TRUE(planner->SetUp(&sd, holes, true).ok());
    auto p = planner->CreateLocalPlan();
    EXPECT_EQ(p.status().code(), StatusCode::kDataLoss);
  }
}

TEST(SavePlanner, ShardValidation) {
  StateDict sd;
  sd.Set("w", StateValue(ShardedTensor{
                  DType::kF32, {4}, {Shard{{2}, Tensor::Empty(DType::kF32, {3}).value()}}}));
  auto planner = NewDefaultSavePlanner();
  Status s = planner->SetUp(sd, std::nullopt, true);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  StateDict sd2;
  sd2.Set("w", StateValue(ShardedTensor{
                   DType::kF16, {4}, {Shard{{0}, Tensor::Empty(DType::kF32, {4}).value()}}}));
  EXPECT_NE(planner->SetUp(sd2, std::nullopt, true).message().find("dtype"), std::string::npos);
}

}  // namespace
}  // namespace megackpt::dcp
