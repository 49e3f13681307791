// What the request-parser targets share: the body parsed as JSON (nullopt when it is not JSON) and the
// checks every accepted request's sampling fields must pass.
#pragma once
#include <optional>

#include "fuzz_common.h"
#include "server/openai_common.h"

namespace lily::fuzz {

inline std::optional<server::json> request_body(const uint8_t* data, size_t size) {
  auto text = as_text(data, size);
  auto body = server::json::parse(text.begin(), text.end(), nullptr, false);
  if (body.is_discarded()) return std::nullopt;
  return body;
}

// Runs check(body, limits) on the input parsed as JSON (inputs that are not JSON are skipped) with the
// server's default limits; InputError is the expected way out of a check.
template <class Check>
int check_request(const uint8_t* data, size_t size, Check&& check) {
  auto body = request_body(data, size);
  if (!body) return 0;
  const server::RequestLimits limits;
  try {
    check(*body, limits);
  } catch (const InputError&) {
  }
  return 0;
}

// Throws InputError when the sampler would refuse the parameters (a finding only if it is not one).
inline void check_sampling(const server::OpenAiSampling& c, const server::RequestLimits& limits) {
  validate(c.sampling);
  LILY_FUZZ_REQUIRE(c.stops.size() <= limits.stop_strings);
  for (auto& s : c.stops) LILY_FUZZ_REQUIRE(!s.empty());
}

}  // namespace lily::fuzz
