// Helpers shared by the model tests.
#pragma once
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

inline int64_t argmax(const float* p, int64_t n) {
  int64_t b = 0;
  for (int64_t i = 1; i < n; ++i)
    if (p[i] > p[b]) b = i;
  return b;
}

// A golden model directory: tests/data/golden/NAME, else the shared folder beside the repo; "" if neither.
inline std::string golden_dir(const std::string& name) {
  namespace fs = std::filesystem;
  for (fs::path p : {fs::path(LILY_TEST_DATA) / "golden" / name, fs::path(LILY_SOURCE_DIR) / ".." / "shared" / "golden" / name})
    if (fs::exists(p / "model.safetensors")) return p.string();
  // colon-separated folders of golden models (a copy of the tree away from the build's source path)
  if (const char* e = std::getenv("LILY_GOLDEN_EXTRA")) {
    std::string all = e;
    for (size_t i = 0; i <= all.size();) {
      const size_t j = std::min(all.find(':', i), all.size());
      const fs::path p = fs::path(all.substr(i, j - i)) / name;
      if (j > i && fs::exists(p / "model.safetensors")) return p.string();
      i = j + 1;
    }
  }
  return "";
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
