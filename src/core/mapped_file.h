// Read-only memory-mapped file.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace lily {

class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  // throws InputError naming the path
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

std::string read_text_file(const std::string& path);  // throws InputError naming the path

}  // namespace lily
