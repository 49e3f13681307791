// Python's numeric semantics on int64 / double for the Jinja interpreter (internal to src/text).
// Python's ints are unbounded; here a result outside int64 is reported (nullopt) for the caller to
// turn into an error naming the operation.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>

namespace lily::text::jinja::detail {

// b ** e for e >= 0, by squaring; nullopt on int64 overflow.
std::optional<int64_t> int_pow(int64_t b, int64_t e);

// Python round(x, ndigits) on a float: half to even on the exact binary value.
double round_half_even(double x, int64_t ndigits);
// Python round(x, ndigits) on an int (ndigits < 0 rounds to a multiple of 10**-ndigits, half to
// even); nullopt on overflow.
std::optional<int64_t> round_int(int64_t x, int64_t ndigits);

// Python int(d) for a finite d in int64 range; nullopt otherwise.
std::optional<int64_t> float_to_int(double d);

// Python float(s): surrounding whitespace, sign, digits with single '_' separators, '.', exponent,
// "inf" / "infinity" / "nan" in any case. No hex. nullopt when Python raises ValueError.
std::optional<double> parse_float(std::string_view s);

// Python int(s, base): base 0 (prefix decides; no leading zeros) or 2..36, optional 0x / 0o / 0b
// prefix matching the base, '_' separators. `overflow` is set when the text is a valid integer
// outside int64 (the result is then nullopt too).
std::optional<int64_t> parse_int(std::string_view s, int base, bool& overflow);

}  // namespace lily::text::jinja::detail
