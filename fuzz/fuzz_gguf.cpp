// GGUF image -> gguf::File::parse (the reader of what export-gguf writes): key/value types, string and
// array lengths, tensor shapes, types, offsets, alignment; then every tensor decoded with read_f32.
#include "fuzz_common.h"
#include "tools/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto f = lily::gguf::File::parse(lily::fuzz::as_text(data, size), "fuzz.gguf");
    LILY_FUZZ_REQUIRE(f.data_start <= size || f.tensors.empty());
    for (auto& t : f.tensors) {
      LILY_FUZZ_REQUIRE(f.data_start + t.offset + t.nbytes() <= size);
      auto v = f.read_f32(t);
      (void)v;
    }
    (void)f.find("general.alignment");
  } catch (const lily::InputError&) {
  }
  return 0;
}
