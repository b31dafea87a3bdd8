// The minimal save + load: one process, a local folder, MEGA storage.
//   save_load DIR
#include <cstdio>

#include "megackpt/megackpt.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  using namespace megackpt;
  auto weight = Tensor::Empty(DType::kF32, {256, 128});
  if (!weight.ok()) return 1;
  float* w = static_cast<float*>(weight->data());
  for (uint64_t i = 0; i < weight->numel(); ++i) w[i] = static_cast<float>(i) * 0.5f;

  dcp::StateDict state;
  state.Set("model.weight", *weight);
  Status s = dcp::Save(state, argv[1]);  // .mega shards + index + .metadata
  if (!s.ok()) {
    std::fprintf(stderr, "save: %s\n", s.ToString().c_str());
    return 1;
  }

  auto loaded = Tensor::Empty(DType::kF32, {256, 128}, /*zero=*/true);
  dcp::StateDict back;
  back.Set("model.weight", *loaded);
  s = dcp::Load(argv[1], back);  // fills `loaded` in place
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
  std::printf("saved and loaded %lld floats at %s: OK\n", static_cast<long long>(loaded->numel()), argv[1]);
  return 0;
}
