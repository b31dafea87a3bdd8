// The minimal save + load: one process, MEGA storage, nothing but dcp::Save /
// dcp::Load on a path. The path may be a local folder or a mega:// folder: the
// program names no hub API (linking megackpt::megackpt registers the mega://
// filesystem, hub/mega_fs.h, and the endpoint comes from the environment).
//   save_load DIR
//   MEGA_ENDPOINT=file:///tmp/hub save_load mega://org/demo@main/ckpt/step-1
// (file:// = the embedded hub, in this process; http://host:port = a megahub.)
#include <cstdio>

#include "megackpt/megackpt.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR | mega://NS/REPO[@BRANCH]/FOLDER\n", argv[0]);
    return 2;
  }
  using namespace megackpt;
  auto step = Tensor::Empty(DType::kI64, {1});
  auto weight = Tensor::Empty(DType::kF32, {256, 128});
  if (!step.ok() || !weight.ok()) return 1;
  static_cast<int64_t*>(step->data())[0] = 100;
  float* w = static_cast<float*>(weight->data());
  for (uint64_t i = 0; i < weight->numel(); ++i) w[i] = static_cast<float>(i) * 0.5f;

  dcp::StateDict state;
  state.Set("step", *step);
  state.Set("model.weight", *weight);
  Status s = dcp::Save(state, argv[1]);  // .mega shards + index + .metadata (on a hub: one commit)
  if (!s.ok()) {
    std::fprintf(stderr, "save: %s\n", s.ToString().c_str());
    return 1;
  }

  auto loaded_step = Tensor::Empty(DType::kI64, {1}, /*zero=*/true);
  auto loaded = Tensor::Empty(DType::kF32, {256, 128}, /*zero=*/true);
  dcp::StateDict back;
  back.Set("step", *loaded_step);
  back.Set("model.weight", *loaded);
  s = dcp::Load(argv[1], back);  // fills `loaded_step` and `loaded` in place
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
  if (static_cast<const int64_t*>(loaded_step->data())[0] != 100) {
    std::fprintf(stderr, "step differs\n");
    return 1;
  }
  std::printf("saved and loaded %lld floats at %s: OK\n", static_cast<long long>(loaded->numel()),
              argv[1]);
  return 0;
}
