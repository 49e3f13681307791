// safetensors reader: 8-byte little-endian header length, JSON header, raw little-endian data.
// Files are memory-mapped; the header is validated (dtype names, shapes, offsets in bounds, no two
// tensors overlapping, no name twice, sizes matching shape x dtype). A Checkpoint is a directory holding
// model.safetensors or a sharded model.safetensors.index.json (no tensor in two shards).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "core/mapped_file.h"

namespace lily {

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapping
  size_t nbytes = 0;
  std::string file;  // for error messages

  int64_t numel() const;
  std::string shape_str() const;
};

// A validated header; tensors point into the image it was parsed from.
struct SafeTensorsHeader {
  std::map<std::string, TensorInfo> tensors;
  nlohmann::json metadata;
};
// Parses the safetensors image of `size` bytes at `p`; `path` names it in errors (InputError).
SafeTensorsHeader parse_safetensors(const uint8_t* p, size_t size, const std::string& path);

// model.safetensors.index.json: the weight map as (tensor, shard file name) in file order; shard names
// are plain file names. `path` names the file in errors.
std::vector<std::pair<std::string, std::string>> parse_safetensors_index(std::string_view text, const std::string& path);

// One loaded shard: its plain file name (as the index names it), its path and its tensors.
struct ShardView {
  std::string name, path;
  const std::map<std::string, TensorInfo>* tensors;
};
// Resolves each weight-map entry to its shard's tensor. A tensor held by two shards, or named by the
// index in a shard that does not hold it -> InputError naming the tensor and the files.
std::map<std::string, const TensorInfo*> link_shards(const std::string& index_path,
                                                     const std::vector<std::pair<std::string, std::string>>& weight_map,
                                                     const std::vector<ShardView>& shards);

class SafeTensorsFile {
 public:
  explicit SafeTensorsFile(const std::string& path);
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const nlohmann::json& metadata() const { return metadata_; }
  const std::string& path() const { return file_->path(); }

 private:
  std::unique_ptr<MappedFile> file_;
  std::map<std::string, TensorInfo> tensors_;
  nlohmann::json metadata_;
};

class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);

  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws InputError naming the tensor and the directory when absent.
  const TensorInfo& get(const std::string& name) const;
  const TensorInfo* find(const std::string& name) const;
  const std::map<std::string, const TensorInfo*>& tensors() const { return tensors_; }
  const std::vector<std::unique_ptr<SafeTensorsFile>>& files() const { return files_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafeTensorsFile>> files_;
  std::map<std::string, const TensorInfo*> tensors_;
};

// Writes tensors to a safetensors file (header padded to 8 bytes). Used by converters and tests.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;
  size_t nbytes;
};
void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const nlohmann::json& metadata = nlohmann::json::object());

}  // namespace lily
