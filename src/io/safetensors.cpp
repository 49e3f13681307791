#include "io/safetensors.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"

namespace fs = std::filesystem;

namespace lily {

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

std::string TensorInfo::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

namespace {

// Parses JSON, refusing an object that holds a key twice (nlohmann keeps the last one silently).
// `dup(level, key)` reports it: level 1 for the top-level object, 2 for an object inside it, ...
template <typename Dup>
nlohmann::json parse_unique_keys(const char* b, const char* e, Dup&& dup) {
  std::vector<std::set<std::string, std::less<>>> open;  // keys of each open object
  std::vector<std::string> path;                          // the key each open object sits under
  std::string last_key;
  auto cb = [&](int, nlohmann::json::parse_event_t ev, nlohmann::json& v) {
    using E = nlohmann::json::parse_event_t;
    if (ev == E::object_start) {
      open.emplace_back();
      path.push_back(last_key);
    } else if (ev == E::object_end) {
      open.pop_back();
      path.pop_back();
    } else if (ev == E::key) {
      last_key = v.get<std::string>();
      if (!open.back().insert(last_key).second) dup(open.size(), path.back(), last_key);
    } else if (ev == E::array_start) {
      last_key.clear();
    }
    return true;
  };
  return nlohmann::json::parse(b, e, cb);
}

}  // namespace

SafeTensorsHeader parse_safetensors(const uint8_t* p, size_t size, const std::string& path) {
  if (size < 8) fail("{}: too small to be a safetensors file ({} bytes)", path, size);
  uint64_t hlen = 0;
  for (int i = 0; i < 8; ++i) hlen |= uint64_t(p[i]) << (8 * i);
  if (hlen > size - 8) fail("{}: header length {} runs past the end of the file ({} bytes)", path, hlen, size);
  if (hlen > (uint64_t(100) << 20)) fail("{}: header length {} is implausibly large", path, hlen);
  nlohmann::json header;
  try {
    header = parse_unique_keys(reinterpret_cast<const char*>(p + 8), reinterpret_cast<const char*>(p + 8 + hlen),
                               [&](size_t level, const std::string& parent, const std::string& key) {
                                 if (level == 1) fail("{}: tensor '{}' appears twice in the header", path, key);
                                 fail("{}: '{}': key '{}' appears twice", path, parent, key);
                               });
  } catch (const nlohmann::json::exception& e) {
    fail("{}: header is not valid JSON: {}", path, e.what());
  }
  if (!header.is_object()) fail("{}: header is not a JSON object", path);
  SafeTensorsHeader h;
  const uint8_t* base = p + 8 + hlen;
  size_t data_size = size - 8 - hlen;
  struct Span { size_t b, e; const std::string* name; };
  std::vector<Span> spans;
  for (auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      h.metadata = v;
      continue;
    }
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
      fail("{}: tensor '{}': header entry needs dtype, shape and data_offsets", path, name);
    if (!v["dtype"].is_string()) fail("{}: tensor '{}': dtype is not a string", path, name);
    auto dt = dtype_from_name(v["dtype"].get<std::string>());
    if (!dt) fail("{}: tensor '{}': unsupported dtype '{}'", path, name, v["dtype"].get<std::string>());
    TensorInfo t;
    t.name = name;
    t.dtype = *dt;
    t.file = path;
    if (!v["shape"].is_array()) fail("{}: tensor '{}': shape is not an array", path, name);
    uint64_t numel = 1;
    for (auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) fail("{}: tensor '{}': bad shape entry", path, name);
      uint64_t dim = d.get<uint64_t>();
      if (dim != 0 && numel > (uint64_t(1) << 62) / dim) fail("{}: tensor '{}': shape overflows", path, name);
      numel *= dim;
      t.shape.push_back(int64_t(dim));
    }
    auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
      fail("{}: tensor '{}': data_offsets must be two non-negative integers", path, name);
    uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e) fail("{}: tensor '{}': data_offsets [{}, {}] are reversed", path, name, b, e);
    if (e > data_size)
      fail("{}: tensor '{}': data_offsets [{}, {}] run past the end of the data ({} bytes)", path, name, b, e, data_size);
    if (e - b != numel * dtype_size(t.dtype))
      fail("{}: tensor '{}': {} bytes stored but shape {} of {} needs {}", path, name, e - b, t.shape_str(),
           dtype_name(t.dtype), numel * dtype_size(t.dtype));
    t.data = base + b;
    t.nbytes = size_t(e - b);
    auto it = h.tensors.emplace(name, std::move(t)).first;
    spans.push_back({size_t(b), size_t(e), &it->first});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.b < b.b; });
  const Span* last = nullptr;  // non-empty span reaching furthest so far
  for (auto& s : spans) {
    if (s.e == s.b) continue;
    if (last && s.b < last->e)
      fail("{}: tensors '{}' and '{}' overlap in the data section", path, *last->name, *s.name);
    if (!last || s.e > last->e) last = &s;
  }
  return h;
}

SafeTensorsFile::SafeTensorsFile(const std::string& path) {
  file_ = std::make_unique<MappedFile>(path);
  auto h = parse_safetensors(file_->data(), file_->size(), path);
  tensors_ = std::move(h.tensors);
  metadata_ = std::move(h.metadata);
}

std::vector<std::pair<std::string, std::string>> parse_safetensors_index(std::string_view text, const std::string& path) {
  nlohmann::json j;
  try {
    j = parse_unique_keys(text.data(), text.data() + text.size(),
                          [&](size_t level, const std::string& parent, const std::string& key) {
                            if (level == 2 && parent == "weight_map")
                              fail("{}: tensor '{}' appears twice in weight_map", path, key);
                            fail("{}: key '{}' appears twice{}", path, key, parent.empty() ? "" : " in '" + parent + "'");
                          });
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    fail("{}: missing object field 'weight_map'", path);
  std::vector<std::pair<std::string, std::string>> map;
  for (auto& [name, f] : j["weight_map"].items()) {
    if (!f.is_string()) fail("{}: weight_map['{}'] is not a file name", path, name);
    auto s = f.get<std::string>();
    if (s.empty() || s.find('/') != std::string::npos || s.find("..") != std::string::npos)
      fail("{}: weight_map['{}'] = '{}' is not a plain file name", path, name, s);
    map.emplace_back(name, std::move(s));
  }
  return map;
}

std::map<std::string, const TensorInfo*> link_shards(const std::string& index_path,
                                                     const std::vector<std::pair<std::string, std::string>>& weight_map,
                                                     const std::vector<ShardView>& shards) {
  std::map<std::string, const ShardView*, std::less<>> holder;  // tensor name -> the shard holding it
  for (auto& sh : shards)
    for (auto& [name, t] : *sh.tensors) {
      auto [it, fresh] = holder.emplace(name, &sh);
      if (!fresh) fail("tensor '{}' appears twice: in {} and in {}", name, it->second->path, sh.path);
    }
  std::map<std::string, const TensorInfo*> out;
  for (auto& [name, shard] : weight_map) {
    auto it = holder.find(name);
    if (it == holder.end() || it->second->name != shard) {
      std::string where = shard;
      for (auto& sh : shards)
        if (sh.name == shard) where = sh.path;
      if (it != holder.end())
        fail("{}: index names tensor '{}' in {} but {} holds it", index_path, name, where, it->second->path);
      fail("{}: index names tensor '{}' in {} but that file does not hold it", index_path, name, where);
    }
    out[name] = &it->second->tensors->at(name);
  }
  return out;
}

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  if (!fs::is_directory(dir)) fail("{}: not a directory", dir);
  fs::path single = fs::path(dir) / "model.safetensors";
  fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    auto weight_map = parse_safetensors_index(read_text_file(index.string()), index.string());
    std::vector<ShardView> shards;
    std::set<std::string, std::less<>> seen;
    for (auto& [name, shard] : weight_map) {
      if (!seen.insert(shard).second) continue;
      files_.push_back(std::make_unique<SafeTensorsFile>((fs::path(dir) / shard).string()));
      shards.push_back({shard, files_.back()->path(), &files_.back()->tensors()});
    }
    tensors_ = link_shards(index.string(), weight_map, shards);
  } else if (fs::exists(single)) {
    files_.push_back(std::make_unique<SafeTensorsFile>(single.string()));
    for (auto& [name, t] : files_[0]->tensors()) tensors_[name] = &t;
  } else {
    fail("{}: neither model.safetensors nor model.safetensors.index.json is present", dir);
  }
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second;
}

const TensorInfo& Checkpoint::get(const std::string& name) const {
  auto* t = find(name);
  if (!t) fail("{}: missing tensor '{}'", dir_, name);
  return *t;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                       const nlohmann::json& metadata) {
  nlohmann::json h = nlohmann::json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  size_t off = 0;
  for (auto& t : tensors) {
    h[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {off, off + t.nbytes}}};
    off += t.nbytes;
  }
  std::string hs = h.dump();
  while ((hs.size() + 8) % 8) hs.push_back(' ');
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail("{}: cannot create", path);
  uint64_t n = hs.size();
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
  f.write(reinterpret_cast<const char*>(len), 8);
  f.write(hs.data(), std::streamsize(hs.size()));
  for (auto& t : tensors) f.write(static_cast<const char*>(t.data), std::streamsize(t.nbytes));
  if (!f) fail("{}: write failed", path);
}

}  // namespace lily
