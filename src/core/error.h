// Errors. InputError is for anything a user supplied (files, tensors, config fields, request
// parameters): the CLI maps it to exit code 2 and the server to HTTP 400. Its message names the cause.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace lily {

struct InputError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Internal invariant violated: a bug, not bad input.
struct InternalError : std::logic_error {
  using std::logic_error::logic_error;
};

template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw InputError(fmt::format(f, std::forward<Args>(args)...));
}

#define LILY_CHECK(cond, ...)                 \
  do {                                        \
    if (!(cond)) ::lily::fail(__VA_ARGS__);   \
  } while (0)

#define LILY_ASSERT(cond)                                                                    \
  do {                                                                                       \
    if (!(cond))                                                                             \
      throw ::lily::InternalError(fmt::format("internal: {} ({}:{})", #cond, __FILE__, __LINE__)); \
  } while (0)

}  // namespace lily
