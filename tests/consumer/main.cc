// The installed-package consumer: save + load through the umbrella header, at
// the path given (a local folder, or mega://... with MEGA_ENDPOINT set).
#include <cstdio>

#include "megackpt/megackpt.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s PATH\n", argv[0]);
    return 2;
  }
  using namespace megackpt;
  auto t = Tensor::Empty(DType::kF32, {64, 32});
  if (!t.ok()) return 1;
  float* p = static_cast<float*>(t->data());
  for (uint64_t i = 0; i < t->numel(); ++i) p[i] = static_cast<float>(i) + 0.25f;
  dcp::StateDict sd;
  sd.Set("w", *t);
  if (Status s = dcp::Save(sd, argv[1]); !s.ok()) {
    std::fprintf(stderr, "save %s: %s\n", argv[1], s.ToString().c_str());
    return 1;
  }
  auto back = Tensor::Empty(DType::kF32, {64, 32}, true);
  dcp::StateDict sd2;
  sd2.Set("w", *back);
  if (Status s = dcp::Load(argv[1], sd2); !s.ok()) {
    std::fprintf(stderr, "load %s: %s\n", argv[1], s.ToString().c_str());
    return 1;
  }
  const float* q = static_cast<const float*>(back->data());
  for (uint64_t i = 0; i < back->numel(); ++i) {
    if (q[i] != p[i]) return 1;
  }
  std::printf("consumer (megackpt %s): %s OK\n", MEGACKPT_VERSION, argv[1]);
  return 0;
}
