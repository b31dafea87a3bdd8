// A save to the hub: nothing but dcp::Save / dcp::Load on a mega:// path. The
// program names no hub API: linking megackpt::megackpt registers the mega://
// filesystem (hub/mega_fs.h), and the endpoint comes from the environment.
//   MEGA_ENDPOINT=file:///tmp/hub mega_save mega://org/demo@main/ckpt/step-1
// (file:// = the embedded hub, in this process; http://host:port = a megahub.)
#include <cstdio>

#include "megackpt/dcp/checkpoint.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s mega://NS/REPO[@BRANCH]/FOLDER\n", argv[0]);
    return 2;
  }
  using namespace megackpt;
  auto step = Tensor::Empty(DType::kI64, {1});
  auto weight = Tensor::Empty(DType::kF32, {1024, 64});
  if (!step.ok() || !weight.ok()) return 1;
  static_cast<int64_t*>(step->data())[0] = 100;
  float* w = static_cast<float*>(weight->data());
  for (uint64_t i = 0; i < weight->numel(); ++i) w[i] = static_cast<float>(i % 977);

  dcp::StateDict state;
  state.Set("step", *step);
  state.Set("model.weight", *weight);
  Status s = dcp::Save(state, argv[1]);  // one hub commit
  if (!s.ok()) {
    std::fprintf(stderr, "save: %s\n", s.ToString().c_str());
    return 1;
  }

  auto loaded = Tensor::Empty(DType::kF32, {1024, 64}, /*zero=*/true);
  auto loaded_step = Tensor::Empty(DType::kI64, {1}, /*zero=*/true);
  dcp::StateDict back;
  back.Set("step", *loaded_step);
  back.Set("model.weight", *loaded);
  s = dcp::Load(argv[1], back);
  if (!s.ok()) {
    std::fprintf(stderr, "load: %s\n", s.ToString().c_str());
    return 1;
  }
  const float* l = static_cast<const float*>(loaded->data());
  for (uint64_t i = 0; i < loaded->numel(); ++i) {
    if (l[i] != w[i]) {
      std::fprintf(stderr, "element %lld differs\n", static_cast<long long>(i));
      return 1;
    }
  }
  if (static_cast<const int64_t*>(loaded_step->data())[0] != 100) return 1;
  std::printf("saved and loaded %s: OK\n", argv[1]);
  return 0;
}
