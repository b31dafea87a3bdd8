// The save and load planners of the Python API: the default planners plus the
// Python-side information the C++ planners do not know (which bytes entries are
// pickled objects), carried as a JSON text in Metadata::planner_data.extra: each
// rank's save planner puts its own in the local plan, and the coordinator stores
// the union ({"megackpt.python": 1, "objects": [fqn, ...]}). Used by
// checkpoint.cc (save/load) and manager.cc (CheckpointManager).
#ifndef MEGACKPT_PYTHON_PLANNERS_H_
#define MEGACKPT_PYTHON_PLANNERS_H_

#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "megackpt/dcp/planner.h"

namespace megackpt::python {

inline std::string ProducerVersion() { return dcp::DefaultSavePlannerOptions{}.version; }

// The default save planner, plus the Python extra of every rank.
class PySavePlanner final : public dcp::SavePlanner {
 public:
  explicit PySavePlanner(std::string extra)
      : inner_(dcp::NewDefaultSavePlanner({.version = ProducerVersion()})),
        extra_(std::move(extra)) {}

  Status SetUp(const dcp::StateDict& state_dict, const std::optional<dcp::StorageMeta>& meta,
               bool is_coordinator) override {
    return inner_->SetUp(state_dict, meta, is_coordinator);
  }
  Result<dcp::SavePlan> CreateLocalPlan() override {
    MEGA_ASSIGN_OR_RETURN(dcp::SavePlan plan, inner_->CreateLocalPlan());
    plan.planner_data.extra = extra_;
    return plan;
  }
  Result<dcp::GlobalSavePlan> CreateGlobalPlan(std::vector<dcp::SavePlan> all_plans) override {
    std::set<std::string> objects;
    for (const dcp::SavePlan& p : all_plans) {
      auto j = nlohmann::json::parse(p.planner_data.extra, nullptr, false);
      if (j.is_object() && j.contains("objects") && j["objects"].is_array()) {
        for (const auto& o : j["objects"]) {
          if (o.is_string()) objects.insert(o.get<std::string>());
        }
      }
    }
    MEGA_ASSIGN_OR_RETURN(dcp::GlobalSavePlan global,
                          inner_->CreateGlobalPlan(std::move(all_plans)));
    if (!objects.empty()) {
      global.metadata.planner_data.extra =
          nlohmann::json{{"megackpt.python", 1}, {"objects", objects}}.dump();
    } else {
      global.metadata.planner_data.extra.clear();
    }
    return global;
  }
  Result<dcp::SavePlan> FinishPlan(dcp::SavePlan central_plan) override {
    return inner_->FinishPlan(std::move(central_plan));
  }
  Result<dcp::ResolvedData> ResolveData(const dcp::WriteItem& item) override {
    return inner_->ResolveData(item);
  }

 private:
  std::unique_ptr<dcp::SavePlanner> inner_;
  std::string extra_;
};

// The default load planner; when `build`, it first fills the (empty) state dict
// with the checkpoint's structure and fresh tensors (BuildStateDictFromMetadata),
// so one metadata read serves both.
class PyLoadPlanner final : public dcp::LoadPlanner {
 public:
  PyLoadPlanner(bool build, bool allow_partial)
      : inner_(dcp::NewDefaultLoadPlanner({.allow_partial_load = allow_partial})), build_(build) {}

  const std::string& extra() const { return extra_; }

  Status SetUp(dcp::StateDict* state_dict, const dcp::Metadata& metadata,
               bool is_coordinator) override {
    extra_ = metadata.planner_data.extra;
    if (build_) {
      MEGA_ASSIGN_OR_RETURN(*state_dict, dcp::BuildStateDictFromMetadata(metadata));
    }
    return inner_->SetUp(state_dict, metadata, is_coordinator);
  }
  Result<dcp::LoadPlan> CreateLocalPlan() override { return inner_->CreateLocalPlan(); }
  Result<std::vector<dcp::LoadPlan>> CreateGlobalPlan(std::vector<dcp::LoadPlan> plans) override {
    return inner_->CreateGlobalPlan(std::move(plans));
  }
  Result<dcp::LoadPlan> FinishPlan(dcp::LoadPlan central_plan) override {
    return inner_->FinishPlan(std::move(central_plan));
  }
  Status LoadBytes(const dcp::ReadItem& item, std::string value) override {
    return inner_->LoadBytes(item, std::move(value));
  }
  Result<Tensor> ResolveTensor(const dcp::ReadItem& item) override {
    return inner_->ResolveTensor(item);
  }
  Status CommitTensor(const dcp::ReadItem& item, const Tensor& tensor) override {
    return inner_->CommitTensor(item, tensor);
  }

 private:
  std::unique_ptr<dcp::LoadPlanner> inner_;
  bool build_;
  std::string extra_;
};

}  // namespace megackpt::python

#endif  // MEGACKPT_PYTHON_PLANNERS_H_
