// The GGUF reader on malformed headers (what fuzz/fuzz_gguf exercises): each is refused with an
// InputError naming the cause, before allocating what a length claims; zero-size tensors read as empty.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "core/error.h"
#include "tools/gguf.h"

namespace lily {
namespace {

using gguf::File;

// Little-endian GGUF image builder.
struct Image {
  std::string b;
  template <typename T> Image& pod(T v) { b.append(reinterpret_cast<const char*>(&v), sizeof v); return *this; }
  Image& str(const std::string& s) { pod<uint64_t>(s.size()); b += s; return *this; }
  Image& header(uint64_t tensors, uint64_t kvs) { b += "GGUF"; return pod<uint32_t>(3).pod(tensors).pod(kvs); }
  Image& tensor(const std::string& name, std::initializer_list<uint64_t> ne, uint32_t type, uint64_t offset) {
    str(name).pod<uint32_t>(uint32_t(ne.size()));
    for (auto d : ne) pod(d);
    return pod(type).pod(offset);
  }
  Image& pad(size_t a = 32) { b.append((a - b.size() % a) % a, '\0'); return *this; }
};

void expect_refused(const std::string& image, const std::string& needle) {
  try {
    File::parse(image, "t.gguf");
    ADD_FAILURE() << "accepted; expected an error naming '" << needle << "'";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(GgufReader, RefusesMalformedHeaders) {
  expect_refused("GGUF", "truncated");
  expect_refused(Image().header(0, 1).pod<uint64_t>(uint64_t(1) << 40).b, "runs past the end");  // key length
  expect_refused(Image().header(0, 1).str("k").pod<uint32_t>(9).pod<uint32_t>(5).pod<uint64_t>(uint64_t(1) << 60).b,
                 "GGUF array of 1152921504606846976 elements");
  expect_refused(Image().header(0, 1).str("k").pod<uint32_t>(9).pod<uint32_t>(9).pod<uint64_t>(1).b,
                 "unsupported element type 9");
  expect_refused(Image().header(0, 1).str("general.alignment").pod<uint32_t>(4).pod<uint32_t>(0).b, "power of two");
  expect_refused(Image().header(0, 1).str("general.alignment").pod<uint32_t>(4).pod<uint32_t>(48).b, "power of two");
  expect_refused(Image().header(0, 1).str("k").pod<uint32_t>(9).pod<uint32_t>(11).pod<uint64_t>(1).pod<int64_t>(int64_t(1) << 40).b,
                 "does not fit");
  expect_refused(Image().header(0, 1).str("k").pod<uint32_t>(12).pod<double>(1e300).b, "float32 range");
  expect_refused(Image().header(2, 0).tensor("a", {4}, 0, 0).tensor("a", {4}, 0, 32).b, "tensor 'a' appears twice");
  expect_refused(Image().header(1, 0).tensor("a", {uint64_t(1) << 41}, 0, 0).b, "implausible size");
  expect_refused(Image().header(1, 0).tensor("a", {33}, 2, 0).b, "not a multiple of the q4_0 block");
  expect_refused(Image().header(1, 0).tensor("a", {4}, 77, 0).b, "ggml type (77)");
  expect_refused(Image().header(1, 0).tensor("a", {4}, 0, 8).b, "not a multiple of the alignment");
  expect_refused(Image().header(1, 0).tensor("a", {4}, 0, 0).pad().pod<float>(1).b, "runs past the end of the file");
}

TEST(GgufReader, ZeroSizeTensorReadsEmpty) {
  Image im;
  im.header(2, 0).tensor("empty", {0, 3}, 0, 0).tensor("x", {2}, 0, 0).pad();
  im.pod<float>(1.5f).pod<float>(-2.0f);
  const std::string bytes = im.b;
  auto f = File::parse(bytes, "t.gguf");
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_TRUE(f.read_f32(f.tensors[0]).empty());  // was memcpy from/to null (UBSan, found by fuzz_gguf)
  EXPECT_EQ(f.read_f32(f.tensors[1]), (std::vector<float>{1.5f, -2.0f}));
}

}  // namespace
}  // namespace lily
