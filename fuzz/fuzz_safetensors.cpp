// safetensors image -> parse_safetensors: header length, JSON header, dtypes, shapes, offsets, overlaps,
// duplicate names. Every accepted tensor must lie inside the image with nbytes = numel x dtype size.
#include "fuzz_common.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto h = lily::parse_safetensors(data, size, "fuzz.safetensors");
    for (auto& [name, t] : h.tensors) {
      LILY_FUZZ_REQUIRE(t.name == name);
      LILY_FUZZ_REQUIRE(t.data >= data + 8 && t.nbytes <= size_t(data + size - t.data));
      LILY_FUZZ_REQUIRE(uint64_t(t.numel()) * lily::dtype_size(t.dtype) == t.nbytes);
      if (t.nbytes) {
        volatile uint8_t first = t.data[0], last = t.data[t.nbytes - 1];
        (void)first, (void)last;
      }
    }
  } catch (const lily::InputError&) {
  }
  return 0;
}
