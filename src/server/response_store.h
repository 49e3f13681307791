// The Responses API's stored responses (store: true): what previous_response_id continues from and
// GET /v1/responses/{id} returns. Bounded in memory: beyond `max_entries` the oldest are dropped.
#pragma once
#include <cstddef>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace lily::server {

struct StoredResponse {
  nlohmann::ordered_json response;      // the response object as returned
  nlohmann::ordered_json conversation;  // the template's messages: input (no instructions) + the reply
};

class ResponseStore {
 public:
  explicit ResponseStore(size_t max_entries = 512) : max_(max_entries) {}
  void put(const std::string& id, StoredResponse r);
  std::optional<StoredResponse> get(const std::string& id) const;
  bool erase(const std::string& id);
  size_t size() const;

 private:
  size_t max_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, StoredResponse> items_;
  std::deque<std::string> order_;  // oldest first
};

}  // namespace lily::server
