// The chat page: GET / and the files under the web directory, open without the API key.
#pragma once
#include <string>

#include "server/core.h"

namespace lily::server {

// Serves `dir` (nothing when empty): "/" is index.html; paths with "..", NUL or outside `dir` are 404.
void register_static_files(Core& core, const std::string& dir);

}  // namespace lily::server
