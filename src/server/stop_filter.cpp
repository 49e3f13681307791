#include "server/stop_filter.h"

#include <algorithm>

#include "text/utf8.h"

namespace lily::server {

namespace {

// Position of the earliest complete stop string in `s` (npos when none), and which one.
size_t earliest_match(const std::vector<std::string>& stops, std::string_view s, std::string* which) {
  size_t best = std::string::npos;
  for (const auto& st : stops) {
    if (st.empty()) continue;
    size_t p = s.find(st);
    if (p != std::string::npos && p < best) {
      best = p;
      *which = st;
    }
  }
  return best;
}

// Length of the longest suffix of `s` that is a proper prefix of some stop string (a match that more
// bytes could still complete).
size_t partial_suffix(const std::vector<std::string>& stops, std::string_view s) {
  size_t hold = 0;
  for (const auto& st : stops) {
    size_t max_k = std::min(st.size() - (st.empty() ? 0 : 1), s.size());
    for (size_t k = max_k; k > hold; --k)
      if (s.compare(s.size() - k, k, st, 0, k) == 0) {
        hold = k;
        break;
      }
  }
  return hold;
}

}  // namespace

std::string StopFilter::push(std::string_view bytes) {
  if (stopped_) return {};
  pending_.append(bytes);
  // The earliest complete stop string wins, unless a longer one that starts before it may still
  // complete: then both wait for more bytes (or finish()), so the stop never depends on how the
  // text was split into pieces.
  std::string which;
  const size_t best = earliest_match(stops_, pending_, &which);
  const size_t hold = partial_suffix(stops_, pending_);
  if (best != std::string::npos && pending_.size() - hold >= best) return stop_at(best, which);
  size_t cut = text::utf8_complete_prefix(std::string_view(pending_).substr(0, pending_.size() - hold));
  if (best != std::string::npos) cut = std::min(cut, best);
  std::string out = text::utf8_sanitize(std::string_view(pending_).substr(0, cut));
  emitted_ += cut;
  pending_.erase(0, cut);
  return out;
}

std::string StopFilter::stop_at(size_t pos, const std::string& which) {
  stopped_ = true;
  matched_ = which;
  std::string out = text::utf8_sanitize(std::string_view(pending_).substr(0, pos));
  emitted_ += pos;
  pending_.clear();
  return out;
}

std::string StopFilter::finish() {
  if (stopped_) return {};
  std::string which;
  const size_t best = earliest_match(stops_, pending_, &which);
  if (best != std::string::npos) return stop_at(best, which);  // a stop that waited on a longer one
  std::string out = text::utf8_sanitize(pending_);
  emitted_ += pending_.size();
  pending_.clear();
  return out;
}

}  // namespace lily::server
