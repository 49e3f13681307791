// JSON request bodies parsed in time linear in their size, with limits on nesting, keys per object,
// array lengths and string lengths. Objects keep their key order (templates render tool schemas as
// sent) without the quadratic insertion of ordered_json's own parser; duplicate keys are refused.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

#include "server/fields.h"

namespace lily::server {

// Parses `text`. Bad input throws FieldError: syntax errors (code invalid_json) and out-of-range
// numbers name the field they occur in as a dotted path (`where` prefixed, e.g. "messages[2].content");
// a value beyond a limit names its field (code limit_exceeded).
json parse_json(std::string_view text, const JsonLimits& limits, const std::string& where = "");

}  // namespace lily::server
