#include "server/http.h"

namespace lily::server {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x = char(x - 'A' + 'a');
    if (y >= 'A' && y <= 'Z') y = char(y - 'A' + 'a');
    if (x != y) return false;
  }
  return true;
}

std::string ascii_lower(std::string_view s) {
  std::string o(s);
  for (char& c : o)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return o;
}

const std::string* HttpHeaders::find(std::string_view name) const {
  for (auto& [k, v] : items_)
    if (iequals(k, name)) return &v;
  return nullptr;
}

std::string HttpHeaders::get(std::string_view name) const {
  auto* v = find(name);
  return v ? *v : std::string();
}

void HttpHeaders::set(const std::string& name, std::string value) {
  std::erase_if(items_, [&](const auto& kv) { return iequals(kv.first, name); });
  items_.emplace_back(name, std::move(value));
}

}  // namespace lily::server
