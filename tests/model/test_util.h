// Helpers shared by the model tests.
#pragma once
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace lily::test {

inline std::vector<float> read_f32(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  std::vector<float> v(size_t(f.tellg()) / 4);
  f.seekg(0);
  f.read(reinterpret_cast<char*>(v.data()), std::streamsize(v.size() * 4));
  return v;
}

// n normal draws of standard deviation `sd`, from `rng` (advanced).
inline std::vector<float> randn(size_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// n normal draws of standard deviation `scale`, from `seed`.
inline std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  return randn(n, g, scale);
}

// n ids uniform in [0, V), seeded.
inline std::vector<int32_t> random_ids(size_t n, int64_t V, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(V - 1));
  std::vector<int32_t> v(n);
  for (auto& x : v) x = d(g);
  return v;
}

// max |a - b| / RMS(b); infinite when the sizes differ.
inline double rel_maxdiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double ss = 0, m = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    ss += double(b[i]) * b[i];
    m = std::max(m, double(std::fabs(a[i] - b[i])));
  }
  return m / std::sqrt(ss / double(b.size()));
}

inline int64_t argmax(const float* p, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; ++i)
    if (p[i] > p[b]) b = i;
  return b;
}

// A file of the golden data by its path below a golden folder (e.g. "qwen3_next-a/model.safetensors"):
// tests/data/golden, the shared folder beside the repo, then the colon-separated folders of
// $LILY_GOLDEN_EXTRA (a copy of the tree away from the build's source path); "" if none has it.
inline std::string golden_file(const std::string& rel) {
  namespace fs = std::filesystem;
  std::vector<fs::path> roots{fs::path(LILY_TEST_DATA) / "golden", fs::path(LILY_SOURCE_DIR) / ".." / "shared" / "golden"};
  if (const char* e = std::getenv("LILY_GOLDEN_EXTRA")) {
    const std::string all = e;
    for (size_t i = 0; i <= all.size();) {
      const size_t j = std::min(all.find(':', i), all.size());
      if (j > i) roots.emplace_back(all.substr(i, j - i));
      i = j + 1;
    }
  }
  for (const fs::path& r : roots)
    if (fs::exists(r / rel)) return (r / rel).string();
  return "";
}

// A golden model directory (one holding model.safetensors) by name; "" if no golden folder has it.
inline std::string golden_dir(const std::string& name) {
  const std::string f = golden_file(name + "/model.safetensors");
  return f.empty() ? "" : std::filesystem::path(f).parent_path().string();
}

// gtest parameter names from model directory names (characters other than letters and digits become '_').
struct ModelParamName {
  template <class Info>
  std::string operator()(const Info& info) const {
    std::string s = info.param;
    for (auto& c : s)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    return s;
  }
};

}  // namespace lily::test
