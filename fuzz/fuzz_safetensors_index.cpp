// A sharded checkpoint: model.safetensors.index.json, then up to three shard images, separated by
// kSeparator lines -> parse_safetensors_index + parse_safetensors + link_shards (duplicate tensors
// across shards, tensors the index puts in the wrong shard, file names that are not plain).
#include <vector>

#include "fuzz_common.h"
#include "io/safetensors.h"

namespace {
constexpr std::string_view kSeparator = "\n==> shard <==\n";
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in = lily::fuzz::as_text(data, size);
  std::vector<std::string_view> parts;
  while (parts.size() < 4) {
    size_t p = in.find(kSeparator);
    parts.push_back(in.substr(0, p));
    if (p == std::string_view::npos) break;
    in.remove_prefix(p + kSeparator.size());
  }
  std::vector<lily::SafeTensorsHeader> headers;
  std::vector<lily::ShardView> shards;
  headers.reserve(parts.size());
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string name = "model-0000" + std::to_string(i) + ".safetensors";
    try {
      headers.push_back(lily::parse_safetensors(reinterpret_cast<const uint8_t*>(parts[i].data()), parts[i].size(), name));
      shards.push_back({name, "/fuzz/" + name, &headers.back().tensors});
    } catch (const lily::InputError&) {
    }
  }
  try {
    auto map = lily::parse_safetensors_index(parts[0], "/fuzz/model.safetensors.index.json");
    auto linked = lily::link_shards("/fuzz/model.safetensors.index.json", map, shards);
    for (auto& [name, shard] : map) {
      auto it = linked.find(name);
      LILY_FUZZ_REQUIRE(it != linked.end() && it->second->name == name);
      bool in_shard = false;
      for (auto& s : shards)
        if (s.name == shard) in_shard = s.tensors->count(name) && &s.tensors->at(name) == it->second;
      LILY_FUZZ_REQUIRE(in_shard);
    }
  } catch (const lily::InputError&) {
  }
  return 0;
}
