// --cuda-opt parsing (backend/cuda/options.cpp): no GPU needed. Values reach the kernel switches; bad values
// are InputErrors naming the option.
#include <gtest/gtest.h>

#ifndef LILY_HAVE_CUDA
TEST(CudaOptions, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend"; }
#else
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"

namespace {

void expect_error(const std::string& opt, const std::string& needle) {
  lily::CudaOptions o;
  try {
    lily::set_cuda_option(o, opt);
    ADD_FAILURE() << opt << " was accepted";
  } catch (const lily::InputError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(CudaOptions, MultiRowSwitches) {
  lily::CudaOptions o;
  lily::set_cuda_option(o, "rows_stage=1");
  lily::set_cuda_option(o, "rows_half=off");
  lily::set_cuda_option(o, "rows_depth", "4");
  lily::set_cuda_option(o, "rows_waves=3");
  EXPECT_EQ(o.kernels.rows_stage, 1);
  EXPECT_FALSE(o.kernels.rows_half);
  EXPECT_EQ(o.kernels.rows_depth, 4);
  EXPECT_EQ(o.kernels.rows_waves, 3);
  // the defaults the H100 measurements chose
  const lily::CudaOptions d;
  EXPECT_EQ(d.kernels.rows_stage, 2);
  EXPECT_TRUE(d.kernels.rows_half);
  EXPECT_EQ(d.kernels.rows_depth, 2);
}

TEST(CudaOptions, BadValuesNameTheOption) {
  expect_error("rows_depth=3", "rows_depth=3: must be a power of two");
  expect_error("rows_depth=8", "rows_depth=8: must be in 2..4");
  expect_error("rows_stage=3", "rows_stage=3: must be in 0..2");
  expect_error("rows_half=maybe", "rows_half=maybe");
  expect_error("rows_waves=x", "rows_waves=x: expected an integer");
  expect_error("rows_pipe=1", "rows_pipe");
}
#endif
