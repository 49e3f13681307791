#include "server/stop_filter.h"

#include <algorithm>

#include "text/utf8.h"

namespace lily::server {

std::string StopFilter::push(std::string_view bytes) {
  if (stopped_) return {};
  pending_.append(bytes);
  // Earliest complete stop string wins.
  size_t best = std::string::npos;
  for (const auto& s : stops_) {
    if (s.empty()) continue;
    size_t p = pending_.find(s);
    if (p != std::string::npos && p < best) {
      best = p;
      matched_ = s;
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    std::string out = text::utf8_sanitize(std::string_view(pending_).substr(0, best));
    emitted_ += best;
    pending_.clear();
    return out;
  }
  // Hold the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    size_t max_k = std::min(s.size() - (s.empty() ? 0 : 1), pending_.size());
    for (size_t k = max_k; k > hold; --k)
      if (pending_.compare(pending_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  }
  size_t cut = text::utf8_complete_prefix(std::string_view(pending_).substr(0, pending_.size() - hold));
  std::string out = text::utf8_sanitize(std::string_view(pending_).substr(0, cut));
  emitted_ += cut;
  pending_.erase(0, cut);
  return out;
}

std::string StopFilter::finish() {
  if (stopped_) return {};
  std::string out = text::utf8_sanitize(pending_);
  emitted_ += pending_.size();
  pending_.clear();
  return out;
}

}  // namespace lily::server
