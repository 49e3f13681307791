// The small routes: GET /v1/models, /v1/models/{id}, /health, /metrics (Prometheus), POST /tokenize
// and /detokenize.
#pragma once
#include "server/core.h"

namespace lily::server {

void register_misc_routes(Core& core);

}  // namespace lily::server
