// Replay driver for fuzz targets when libFuzzer is not available (gcc builds):
// runs LLVMFuzzerTestOneInput on every file under the given paths (folders are
// walked recursively), plus a fixed set of pseudo-random and truncated inputs
// derived from them. Exits 0 when no input crashed.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

void RunOne(const std::vector<uint8_t>& bytes) {
  LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
}

void RunWithMutations(const std::vector<uint8_t>& bytes, std::mt19937_64& rng) {
  RunOne(bytes);
  // Every truncation point for small inputs, a sample for big ones.
  size_t step = bytes.size() > 4096 ? bytes.size() / 512 : 1;
  for (size_t n = 0; n < bytes.size(); n += step) {
    RunOne(std::vector<uint8_t>(bytes.begin(), bytes.begin() + n));
  }
  // Random byte flips.
  for (int i = 0; i < 2000 && !bytes.empty(); ++i) {
    std::vector<uint8_t> m = bytes;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) m[rng() % m.size()] = static_cast<uint8_t>(rng());
    RunOne(m);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::mt19937_64 rng(12345);
  size_t files = 0;
  for (int i = 1; i < argc; ++i) {
    std::filesystem::path root(argv[i]);
    if (!std::filesystem::exists(root)) continue;
    std::vector<std::filesystem::path> paths;
    if (std::filesystem::is_directory(root)) {
      for (auto& e : std::filesystem::recursive_directory_iterator(root)) {
        if (e.is_regular_file()) paths.push_back(e.path());
      }
    } else {
      paths.push_back(root);
    }
    for (auto& p : paths) {
      std::ifstream in(p, std::ios::binary);
      std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                 std::istreambuf_iterator<char>());
      RunWithMutations(bytes, rng);
      ++files;
    }
  }
  // Pure noise inputs too.
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> noise(rng() % 512);
    for (auto& b : noise) b = static_cast<uint8_t>(rng());
    RunOne(noise);
  }
  std::printf("replayed %zu corpus files with mutations: no crash\n", files);
  return 0;
}
